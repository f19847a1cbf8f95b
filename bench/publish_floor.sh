#!/usr/bin/env bash
# The publish round trip against its floor (docs/notebook/benchmarks.md, "The
# publish round trip and its floor"), in rounds:
#   bench/publish_floor.sh [ROUNDS [SESSIONS [BINARY ...]]]
# Per round, for each BINARY (default target/release/uascale) a fresh
# server on core 0 (the configuration of bench/lib.sh) and `uascale bench
# sessions --sessions SESSIONS --publishing-ms 1000 --hold-s 10` on core 1:
# every session subscribed to i=2258, one Publish in and one
# NotificationMessage out a second; then `uascale bench floor` (one read
# and one write per message) with as many sockets. Prints the server's CPU
# per session-second held, per socket-second for the floor, and the
# ratios. Several binaries compare builds side by side. Needs `cargo build
# --release -p uascale`. Files in target/publish-floor/.
set -u
rounds=${1:-3}; n=${2:-2000}
shift $(( $# < 2 ? $# : 2 ))
cd "$(dirname "$0")/.."
UA=target/release/uascale
bins=("$@"); [ ${#bins[@]} -gt 0 ] || bins=("$UA")
OUT=target/publish-floor; mkdir -p $OUT
port=4858; floor_port=4859
. bench/lib.sh
trap stop EXIT
relaxed_config "$port" > $OUT/server.toml
echo "load $(cut -d' ' -f1-3 /proc/loadavg) $(date -u +%H:%M:%S); $(grep -m1 'model name' /proc/cpuinfo)"
for r in $(seq "$rounds"); do
  line="round $r:"; values=()
  for BIN in "${bins[@]}"; do
    start_server $OUT/server.toml $OUT/server.log --pki $OUT/pki
    taskset -c 1 $UA bench sessions opc.tcp://localhost:$port --sessions "$n" --concurrency 20 \
      --publishing-ms 1000 --hold-s 10 --server-pid "$SERVER" --json > $OUT/sessions.json 2> $OUT/sessions.err
    stop
    v=$(python3 -c "import json; d = json.load(open('$OUT/sessions.json')); print('%.1f' % d['server_us_per_session_second_held'])")
    values+=("$v"); line="$line $BIN $v us;"
  done
  taskset -c 0 $UA bench floor serve --port $floor_port > $OUT/floor-server.log 2>&1 &
  SERVER=$!
  sleep 0.5
  f=$(taskset -c 1 $UA bench floor 127.0.0.1:$floor_port --sockets "$n" --interval-ms 1000 \
        --duration-s 10 --server-pid "$SERVER" 2>&1 | awk '/server CPU/ {print $3}')
  stop
  ratios=$(for v in "${values[@]}"; do python3 -c "print('%.2fx' % ($v / $f))"; done | tr '\n' ' ')
  echo "$line floor $f us; ratios $ratios"
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg) $(date -u +%H:%M:%S)"
