#!/usr/bin/env bash
# The session-scaling table (docs/benchmarks.md, "Sessions at scale"):
# N secured sessions established 50 at a time, bare (--subscribe off) and
# with one subscription (1 s) and one item each, held 5 s and closed; a
# fresh `uascale serve` per row pinned to core 0 (trust_all_client_certificates
# and admission rates raised, so that no busy answer or trust step is
# measured), `uascale bench sessions` on core 1, and `openssl speed -seconds 2
# rsa2048` on core 0 before and after. Prints one line per row.
#
# usage: bench/session_table.sh [--sizes "500 2000 ..."] [--security P[:MODE]]
#                               [--processes P] [--port N] [--out DIR] [--no-build]
# Loopback only; every server it starts is stopped by its PID on exit. The
# open-files limit must hold the largest size (the bench holds one socket
# per session; --processes splits them).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

SIZES="500 2000 5000 10000 19000"
SECURITY=Basic256Sha256:SignAndEncrypt
PROCESSES=1
PORT=4856
OUT=target/session-table/$(date -u +%Y%m%dT%H%M%S)
BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) SIZES=$2; shift 2 ;;
    --security) SECURITY=$2; shift 2 ;;
    --processes) PROCESSES=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
case "$PORT$PROCESSES${SIZES// /}" in *[!0-9]*) echo "--port, --processes and --sizes take numbers" >&2; exit 2 ;; esac

[ "$BUILD" = 1 ] && cargo build --release -p uascale >&2
BIN=$ROOT/target/release/uascale
ulimit -n "$(ulimit -Hn)"
mkdir -p "$OUT"
cd "$OUT"
relaxed_config "$PORT" 20000 > server.toml
trap stop EXIT

echo "load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%H:%M) UTC; $SECURITY; floor before:"
floor rsa2048
for n in $SIZES; do
  for sub in off on; do
    log="server-$n-$sub.log"
    start_server server.toml "$log"
    extra=()
    [ "$SECURITY" != None ] && extra=(--pki "client-pki" --trust-server)
    out=$(taskset -c 1 "$BIN" bench sessions "opc.tcp://localhost:$PORT" --sessions "$n" \
      --concurrency 50 --processes "$PROCESSES" --subscribe "$sub" --hold-s 5 \
      --security "$SECURITY" "${extra[@]}" --server-pid "$SERVER" --json 2>"bench-$n-$sub.err" || true)
    echo "$out" > "bench-$n-$sub.json"
    python3 - "$n" "$sub" "bench-$n-$sub.json" <<'PY'
import json, sys
n, sub, path = sys.argv[1:4]
try:
    r = json.load(open(path))
except Exception as e:
    print(f"{n} subscribe={sub}: no report ({e})")
    sys.exit(0)
f = lambda v, fmt: "-" if v is None else fmt.format(v)
print(f"{n} subscribe={sub}: established {r['established']} in {r['establish_s']:.2f} s "
      f"({r['sessions_per_s']:.0f}/s), failures {sum(r['failures'].values())}, busy {r['busy_answers']}, "
      f"notified {f(r['notified'], '{}')}, server {f(r['server_cpu_ms_per_session'], '{:.3f}')} ms, "
      f"establishment {f(r['establishment_ms_per_session_publish_subtracted'], '{:.3f}')} ms, "
      f"{f(r['server_bytes_per_session'] and r['server_bytes_per_session'] / 1024, '{:.1f}')} KB per session")
PY
    stop
  done
done
echo "floor after:"
floor rsa2048
echo "load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%H:%M) UTC; logs in $OUT"
