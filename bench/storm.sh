#!/usr/bin/env bash
# One connect storm against one server, as measured in docs/notebook/benchmarks.md
# ("Connect storms"):
#   bench/storm.sh uascale|uascale-secured|async-opcua|asyncua PORT [uascale bench storm flags...]
# Needs `cargo build --release -p uascale` and, for async-opcua, the peer of
# bench/compare.sh (target/peers/release/async-opcua-peer). The server runs
# on core 0, the storm on core 1; every client connects to 127.0.0.1 from
# 127.0.0.2-7; the run is bounded by --duration-s and stops the server.
# Output in target/storm/: NAME.json, NAME.html, the server's log and, for
# uascale, /metrics scraped 25 s in and after. For uascale-secured,
# STORM_CONFIG (TOML lines) is added to the server's configuration, e.g.
# STORM_CONFIG=$'[admission]\nrefuse_at_hello = false'. With RENICE_STORM=1
# the storm's worker processes (not the bench's own, which holds the
# steady sessions) run at nice +10, so that the steady sessions' lateness
# shows the server's delay rather than the load generator's CPU on core 1.
set -u
name=$1; port=$2; shift 2
cd "$(dirname "$0")/.."
OUT=target/storm; mkdir -p $OUT
UA=target/release/uascale
case $name in
uascale)
  RUST_LOG=warn taskset -c 0 $UA serve --security none --bind 127.0.0.1 --port $port --pki $OUT/pki-uascale --metrics 127.0.0.1:9464 > $OUT/$name-server.log 2>&1 &
  ;;
uascale-secured)
  # Every RSA policy published; the storm's client certificate trusted.
  printf '[security]\ntrust_all_client_certificates = true\n%s\n' "${STORM_CONFIG:-}" > $OUT/secured.toml
  RUST_LOG=warn taskset -c 0 $UA serve --bind 127.0.0.1 --port $port --pki $OUT/pki-uascale-secured --config $OUT/secured.toml --metrics 127.0.0.1:9464 > $OUT/$name-server.log 2>&1 &
  ;;
async-opcua)
  mkfifo $OUT/peer.stdin 2>/dev/null
  RUST_LOG=warn taskset -c 0 target/peers/release/async-opcua-peer $port $OUT/pki-async-opcua < $OUT/peer.stdin > $OUT/$name-server.log 2>&1 &
  exec 7>$OUT/peer.stdin
  ;;
asyncua)
  # The Python peer of the interop tests (target/venv from cargo xtask ci).
  mkfifo $OUT/peer.stdin 2>/dev/null
  taskset -c 0 target/venv/bin/python tests/interop/peer_server.py asyncua $port < $OUT/peer.stdin > $OUT/$name-server.log 2>&1 &
  exec 7>$OUT/peer.stdin
  ;;
esac
pid=$!
sleep 2
echo "server $name pid $pid; load $(cat /proc/loadavg)"
(
  sleep 25
  case $name in uascale*) curl -s 127.0.0.1:9464/metrics > $OUT/$name-metrics-during.txt;; esac
  grep -E 'VmRSS|Threads' /proc/$pid/status > $OUT/$name-status-during.txt
) &
taskset -c 1 $UA bench storm opc.tcp://127.0.0.1:$port --processes 2 \
  --source-ips 127.0.0.2,127.0.0.3,127.0.0.4,127.0.0.5,127.0.0.6,127.0.0.7 \
  --server-pid $pid --json --report $OUT/$name.html "$@" > $OUT/$name.json 2> $OUT/$name-bench.err &
bench=$!
if [ -n "${RENICE_STORM:-}" ]; then
  for _ in $(seq 40); do sleep 0.25; for c in $(pgrep -P $bench); do renice -n 10 -p $c >/dev/null; done; done &
fi
wait $bench
echo "bench exit $?"
sleep 5
# CPU after: idle?
t1=$(awk '{print $14+$15}' /proc/$pid/stat); sleep 5; t2=$(awk '{print $14+$15}' /proc/$pid/stat)
echo "server CPU in the 5 s after: $(( (t2 - t1) )) ticks (100 per core-second)"
case $name in uascale*) curl -s 127.0.0.1:9464/metrics > $OUT/$name-metrics-after.txt;; esac
kill -INT $pid 2>/dev/null; sleep 2; kill -9 $pid 2>/dev/null
case $name in async-opcua|asyncua) exec 7>&-;; esac
echo "load $(cat /proc/loadavg)"
