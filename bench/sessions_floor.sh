#!/usr/bin/env bash
# Server CPU and memory per session establishment for each security policy,
# read against the machine's OpenSSL floors measured in the same run
# (docs/notebook/benchmarks.md, "Session establishment against its floor").
#
# For each policy and round a fresh `uascale serve --security ecc` is
# started pinned to core 0 (trust_all_client_certificates = true and
# admission rates raised, so that no busy answer or certificate trust step
# is measured); `uascale bench sessions --subscribe off` runs pinned to
# core 1 and establishes N sessions 8 at a time (1,500; 1,000 for the RSA
# policies), holds them 1 s, and reports the server's CPU and RSS growth
# per session. `openssl speed -seconds 2 rsa2048 ecdsap256 ecdhp256` runs on
# core 0 before and after.
#
# usage: bench/sessions_floor.sh [--rounds R] [--policies "P[:MODE] ..."]
#                                [--port N] [--out DIR] [--no-build]
# Loopback only; every server it starts is stopped by its PID on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

ROUNDS=3
POLICIES="None Basic256Sha256:SignAndEncrypt ECC_nistP256_AesGcm:SignAndEncrypt ECC_nistP256:SignAndEncrypt ECC_curve25519:SignAndEncrypt"
PORT=4855
OUT=target/sessions-floor/$(date -u +%Y%m%dT%H%M%S)
BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --policies) POLICIES=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
case "$ROUNDS$PORT" in *[!0-9]*) echo "--rounds and --port take numbers" >&2; exit 2 ;; esac

[ "$BUILD" = 1 ] && cargo build --release -p uascale >&2
BIN=$ROOT/target/release/uascale
mkdir -p "$OUT"
cd "$OUT"
relaxed_config "$PORT" > server.toml
trap stop EXIT

echo "load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%H:%M) UTC; floors before:"
floor rsa2048 ecdsap256 ecdhp256
for sec in $POLICIES; do
  n=1500
  case $sec in Basic*|Aes*) n=1000 ;; esac
  for r in $(seq "$ROUNDS"); do
    start_server server.toml "server-$r.log" --security ecc
    extra=()
    [ "$sec" != None ] && extra=(--pki "client-pki" --trust-server)
    out=$(taskset -c 1 "$BIN" bench sessions "opc.tcp://localhost:$PORT" --sessions "$n" \
      --concurrency 8 --subscribe off --hold-s 1 --security "$sec" "${extra[@]}" \
      --server-pid "$SERVER" 2>&1)
    echo "$sec round $r:$(echo "$out" | grep -E '^  (established|server|busy answers)' \
      | sed 's/ \+/ /g' | tr '\n' '|')"
    stop
  done
done
echo "floors after:"
floor rsa2048 ecdsap256 ecdhp256
echo "load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%H:%M) UTC; logs in $OUT"
