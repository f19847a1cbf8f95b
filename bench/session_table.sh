#!/usr/bin/env bash
# The session-scaling table (docs/notebook/benchmarks.md, "Sessions at scale"):
# N secured sessions established 50 at a time, bare (--subscribe off) and
# with one subscription (1 s) and one item each, held 5 s and closed; a
# fresh `uascale serve` per row pinned to core 0 (trust_all_client_certificates
# and admission rates raised, so that no busy answer or trust step is
# measured), `uascale bench sessions` on core 1, and `openssl speed -seconds 2
# rsa2048` on core 0 before and after. Prints one line per row.
#
# --server async-opcua or asyncua measures that peer instead, the same way:
# the async-opcua stack through bench/peers/async-opcua-server (`--secure`:
# its own key pair, every client certificate trusted) or the Python asyncua
# server of tests/interop/peer_server.py (`asyncua-secure`, a certificate
# made with `uascale cert create`), each pinned to core 0 and fed a held
# stdin, stopped by PID. Both serve Basic256Sha256 SignAndEncrypt and None
# only.
#
# usage: bench/session_table.sh [--sizes "500 2000 ..."] [--security P[:MODE]]
#                               [--server uascale|async-opcua|asyncua]
#                               [--processes P] [--port N] [--out DIR] [--no-build]
#                               [--modes "off on"]
# --modes lists the `bench sessions --subscribe` values to run per size
# (off, on, after: subscribed once every session is up).
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
MODES="off on"
PROCESSES=1
PORT=4856
SERVER_KIND=uascale
OUT=target/session-table/$(date -u +%Y%m%dT%H%M%S)
BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) SIZES=$2; shift 2 ;;
    --security) SECURITY=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --processes) PROCESSES=$2; shift 2 ;;
    --server) SERVER_KIND=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
case "$PORT$PROCESSES${SIZES// /}" in *[!0-9]*) echo "--port, --processes and --sizes take numbers" >&2; exit 2 ;; esac
case "$SERVER_KIND" in uascale | async-opcua | asyncua) ;; *) echo "--server: uascale, async-opcua or asyncua" >&2; exit 2 ;; esac

[ "$BUILD" = 1 ] && cargo build --release -p uascale >&2
PEER_BIN=$ROOT/target/peers/release/async-opcua-peer
if [ "$SERVER_KIND" = async-opcua ] && [ "$BUILD" = 1 ]; then
  cargo build --release --manifest-path bench/peers/async-opcua-server/Cargo.toml \
    --target-dir target/peers >&2
fi
VENV_PY=$ROOT/target/venv/bin/python
if [ "$SERVER_KIND" = asyncua ] && [ ! -x "$VENV_PY" ]; then
  python3 -m venv target/venv >&2
  target/venv/bin/pip install -q -r tests/requirements.txt >&2
fi
BIN=$ROOT/target/release/uascale
PEER_SERVER=$ROOT/tests/interop/peer_server.py
ulimit -n "$(ulimit -Hn)"
mkdir -p "$OUT"
cd "$OUT"
relaxed_config "$PORT" 20000 > server.toml
trap 'stop; stop_peer' EXIT

PEER_FD=
# Starts the peer server SERVER_KIND on core 0 with a held stdin (it runs
# until that closes), its log in LOG; returns once its port accepts (60 s at
# most). Its PID is in SERVER.
start_peer() {
  local log=$1
  rm -f peer.fifo
  mkfifo peer.fifo
  if [ "$SERVER_KIND" = async-opcua ]; then
    RUST_LOG=warn taskset -c 0 "$PEER_BIN" "$PORT" "pki-async-opcua" --secure <peer.fifo >"$log" 2>&1 &
  else
    [ -f asyncua-pki/own/certs/cert.der ] || "$BIN" cert create --pki asyncua-pki \
      --uri urn:freeopcua:python:server --name "asyncua peer" >/dev/null
    taskset -c 0 "$VENV_PY" "$PEER_SERVER" asyncua-secure "$PORT" \
      asyncua-pki/own/certs/cert.der asyncua-pki/own/private/key.pem <peer.fifo >"$log" 2>&1 &
  fi
  SERVER=$!
  exec {PEER_FD}>peer.fifo
  for _ in $(seq 600); do
    grep -q "READY" "$log" 2>/dev/null && break
    kill -0 "$SERVER" 2>/dev/null || { echo "$SERVER_KIND did not start (see $log)" >&2; return 1; }
    sleep 0.1
  done
}

# Closes the peer's stdin (the server then stops; `stop` kills it too).
stop_peer() {
  if [ -n "$PEER_FD" ]; then
    exec {PEER_FD}>&-
  fi
  PEER_FD=
}

echo "load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%H:%M) UTC; $SERVER_KIND, $SECURITY; floor before:"
floor rsa2048
for n in $SIZES; do
  for sub in $MODES; do
    log="server-$n-$sub.log"
    url="opc.tcp://localhost:$PORT"
    if [ "$SERVER_KIND" = uascale ]; then
      # The ECC endpoints are offered with `--security ecc` only.
      case "$SECURITY" in ECC_*) start_server server.toml "$log" --security ecc ;; *) start_server server.toml "$log" ;; esac
    else
      start_peer "$log"
      url="opc.tcp://127.0.0.1:$PORT/"
    fi
    extra=()
    [ "$SECURITY" != None ] && extra=(--pki "client-pki" --trust-server)
    out=$(taskset -c 1 "$BIN" bench sessions "$url" --sessions "$n" \
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
      f"{f(r['server_bytes_per_session'] and r['server_bytes_per_session'] / 1024, '{:.1f}')} KB per session"
      f" ({f(r.get('server_bytes_per_session_held'), '{:.0f}')} B when the hold ended)"
      + (f", before subscribing {f(r.get('establishment_ms_per_session_before_subscribing'), '{:.3f}')} ms"
         f" then subscribing {f(r.get('subscription_ms_per_session'), '{:.3f}')} ms"
         if r.get('subscribe_after') else ""))
PY
    stop_peer
    stop
  done
done
echo "floor after:"
floor rsa2048
echo "load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%H:%M) UTC; logs in $OUT"
