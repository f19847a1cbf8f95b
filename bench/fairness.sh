#!/usr/bin/env bash
# Who waits behind whom: `uascale bench fairness` against `uascale serve`
# under each isolation profile, in one run, as a Markdown table.
#
# For each profile the server is started pinned to core 0 with W workers
# (min = max, default 4) and the demo's slow folder at SLOW_MS (2) per Read;
# the bench runs pinned to core 1: one flooder with FLOOD Reads in flight
# (500) and one victim reading one at a time, both on ns=2;s=Demo.Slow.0,
# WARMUP_S (2) then DURATION_S (10) measured. Medians over ROUNDS (1).
#
# usage: bench/fairness.sh [--workers W] [--flood N] [--duration-s S]
#                          [--profiles a,b,c] [--out DIR] [--no-build]
# Loopback only; every server it starts is stopped by its PID on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

WORKERS=4
FLOOD=500
DURATION=10
WARMUP=2
SLOW_MS=2
PROFILES=shared_only,fair_share,balanced,trusted_reservations
OUT=target/fairness/$(date -u +%Y%m%dT%H%M%S)
BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) WORKERS=$2; shift 2 ;;
    --flood) FLOOD=$2; shift 2 ;;
    --duration-s) DURATION=$2; shift 2 ;;
    --profiles) PROFILES=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$BUILD" = 1 ] && cargo build --release -p uascale >&2
BIN=$ROOT/target/release/uascale
mkdir -p "$OUT"
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null || true; }
trap cleanup EXIT

port=48900
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
printf '| profile | flood Reads/s | flood busy/s | flood p99 | victim Reads/s | victim busy/s | victim p50 | victim p99 | server cores | RSS |\n'
printf '|---|---|---|---|---|---|---|---|---|---|\n'
for profile in ${PROFILES//,/ }; do
  port=$((port + 1))
  cat > "$OUT/$profile.toml" <<EOF
[requests]
min_request_thread_count = $WORKERS
max_request_thread_count = $WORKERS
isolation_profile = "$profile"
EOF
  RUST_LOG=warn taskset -c 0 "$BIN" serve --security none --bind 127.0.0.1 --host 127.0.0.1 \
    --port $port --slow-ms $SLOW_MS --config "$OUT/$profile.toml" >"$OUT/$profile.log" 2>&1 &
  PID=$!
  sleep 1.5
  taskset -c 1 "$BIN" bench fairness opc.tcp://127.0.0.1:$port --flood-inflight "$FLOOD" \
    --warmup-s $WARMUP --duration-s "$DURATION" --server-pid $PID --json >"$OUT/$profile.json" 2>/dev/null
  kill -INT $PID; wait $PID 2>/dev/null || true
  PID=
  python3 - "$OUT/$profile.json" "$profile" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
s = r["seconds"]
f, v, srv = r["flood"], r["victim"], r.get("server") or {}
ms = lambda x: "-" if x is None else f"{x:.1f} ms"
print(f"| {sys.argv[2]} | {f['reads']/s:,.0f} | {f['busy_answers']/s:,.0f} | {ms(f['latency_p99_ms'])} "
      f"| {v['reads']/s:,.0f} | {v['busy_answers']/s:,.0f} | {ms(v['latency_p50_ms'])} | {ms(v['latency_p99_ms'])} "
      f"| {srv.get('cores_busy', 0):.2f} | {srv.get('rss_bytes', 0)/1e6:.1f} MB |")
EOF
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
