#!/usr/bin/env bash
# Per-client rate limiting over opc.https: SESSIONS sessions with one
# subscription each (1 s publishing) over HTTPS while one client floods
# Reads over HTTPS, then the server's shed counters of the https stage;
# then, unless --read-rounds 0, the server CPU per 1-value Read over
# opc.tcp and over opc.https side by side.
#
# The server (relaxed admission, [https] on PORT+1, metrics on PORT+2) runs
# pinned to core 0; `uascale bench publish` (the subscribed sessions) and
# `uascale bench read --client library` (the flooder, FLOOD Reads in
# flight) run on core 1 at the same time for DURATION_S seconds. The
# flooder ignores the hints (`bench read --ignore-hints`: its next Read
# goes at once after a 429), so it offers what it can; with
# --honour-hints it waits out each Retry-After instead. The subscribed
# sessions' Publishes are not charged to any bucket. The client offers
# HTTP/2 and the server takes it (every session's requests on one
# connection); --http1 turns the server's HTTP/2 off. Results (the two
# JSON reports, the shed counters, the server log) go to OUT.
#
# The Read comparison restarts the server with the [https] buckets raised
# out of the way (a bucket would measure its refusals, not the Reads) and
# runs `uascale bench read --client library` (4 connections x 16 Reads in
# flight, 1 value of i=2258) against opc.tcp and opc.https in turns, R
# rounds, printing each round's server CPU per Read.
#
# usage: bench/https_flood.sh [--sessions N] [--flood W] [--duration-s S]
#                             [--read-rounds R] [--port P] [--out DIR]
#                             [--honour-hints] [--http1] [--no-build]
# UASCALE_BIN overrides the binary (with --no-build). Loopback only; the
# server it starts is stopped by its PID on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

SESSIONS=2000
FLOOD=100
DURATION=60
READ_ROUNDS=3
PORT=48950
OUT=target/https-flood/$(date -u +%Y%m%dT%H%M%S)
BUILD=1
IGNORE=--ignore-hints
HTTP2=true
while [ $# -gt 0 ]; do
  case "$1" in
    --sessions) SESSIONS=$2; shift 2 ;;
    --flood) FLOOD=$2; shift 2 ;;
    --duration-s) DURATION=$2; shift 2 ;;
    --read-rounds) READ_ROUNDS=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --honour-hints) IGNORE=; shift ;;
    --http1) HTTP2=false; shift ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$BUILD" = 1 ] && cargo build --release -p uascale >&2
BIN=${UASCALE_BIN:-$ROOT/target/release/uascale}
. bench/lib.sh
mkdir -p "$OUT"
trap stop EXIT

HTTPS=$((PORT + 1)); METRICS=$((PORT + 2))
{
  relaxed_config "$PORT" "$((SESSIONS + 100))"
  printf '[metrics]\nlisten = "127.0.0.1:%s"\n' "$METRICS"
  printf '[https]\nlisten = "127.0.0.1:%s"\nhttp2 = %s\n' "$HTTPS" "$HTTP2"
} > "$OUT/server.toml"
start_server "$OUT/server.toml" "$OUT/server.log" --pki "$OUT/pki"
URL=opc.https://127.0.0.1:$HTTPS/
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

taskset -c 1 "$BIN" bench publish "$URL" --trust-server --sessions "$SESSIONS" \
  --interval-ms 1000 --warmup-s 2 --duration-s "$DURATION" --json > "$OUT/publish.json" &
SUBSCRIBED=$!
# The flood starts once the subscribed sessions are (mostly) in.
sleep 2
taskset -c 1 "$BIN" bench read "$URL" --client library --trust-server --connections 1 $IGNORE \
  --inflight "$FLOOD" --warmup-s 0 --duration-s "$DURATION" --json > "$OUT/flood.json" || true
wait "$SUBSCRIBED" || true
curl -s "http://127.0.0.1:$METRICS/metrics" | grep 'opcua_server_shed_total{stage="https"' \
  > "$OUT/shed.txt" || true
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "results in $OUT:"
echo "  shed at the https stage (reason: count):"
sed -E 's/.*reason="([a-z_]+)"\} ([0-9]+).*/    \1: \2/' "$OUT/shed.txt"
echo "  subscribed sessions: $OUT/publish.json; flooder: $OUT/flood.json"

[ "$READ_ROUNDS" -gt 0 ] || exit 0
stop
{
  relaxed_config "$PORT"
  printf '[https]\nlisten = "127.0.0.1:%s"\nhttp2 = %s\n' "$HTTPS" "$HTTP2"
  printf 'session_rate = 1000000\nsession_burst = 1000000\n'
  printf 'address_rate = 1000000\naddress_burst = 1000000\n'
} > "$OUT/read.toml"
start_server "$OUT/read.toml" "$OUT/read-server.log" --pki "$OUT/pki"
echo "  server CPU per 1-value Read (us), bench read --client library, 4 x 16 in flight:"
cpu_per_read() {
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("server_cpu_us_per_read") or "not measured")' "$1"
}
for round in $(seq "$READ_ROUNDS"); do
  for transport in tcp https; do
    if [ "$transport" = tcp ]; then url=opc.tcp://127.0.0.1:$PORT/; else url=$URL; fi
    taskset -c 1 "$BIN" bench read "$url" --client library --trust-server --connections 4 \
      --inflight 16 --warmup-s 2 --duration-s 5 --server-pid "$SERVER" --json \
      > "$OUT/read-$transport-$round.json"
    echo "    round $round opc.$transport: $(cpu_per_read "$OUT/read-$transport-$round.json")"
  done
done
