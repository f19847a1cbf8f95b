#!/usr/bin/env bash
# The items rogue against a victim that is a client of its own: a fresh
# `uascale serve` (default configuration, None security) on core 0; on core
# 1 `uascale bench rogue --variant items --items ITEMS --victim-items 0` at
# nice +10 (the rogue's own client work - building and decoding its
# CreateMonitoredItems calls of 1,000 items - yields to the victim, as it
# would on a machine of its own) and, in another process, the victim:
# `uascale bench publish` with one session subscribing 100 items of
# CurrentTime (i=2258) at 100 ms, whose lateness (arrival minus the
# value's source timestamp), lost messages and on-time count it prints.
# ITEMS 0 runs the victim alone (the rogue's 11 empty subscriptions).
#
# `bench rogue`'s own victim shares the rogue's process and runtime, so its
# lateness also holds the load generator's delay in decoding the rogue's
# answers; this script keeps the two apart.
#
#   bench/rogue_victim.sh [BIN] [DURATION_S] [ITEMS]
#
# BIN defaults to target/release/uascale, DURATION_S to 30, ITEMS to
# 999900. Loopback only; everything it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BIN=${1:-target/release/uascale}
DURATION=${2:-30}
ITEMS=${3:-999900}
PORT=${PORT:-48437}
work=$(mktemp -d)
ROGUE=
trap '[ -n "$ROGUE" ] && kill "$ROGUE" 2>/dev/null; stop; rm -rf "$work"' EXIT
printf '[server]\nport = %s\n' "$PORT" > "$work/server.toml"
echo "# $(date -u +%FT%TZ), $(uptime | sed 's/.*load/load/'), $BIN, rogue items $ITEMS"
start_server "$work/server.toml" "$work/server.log" --security none --bind 127.0.0.1 \
  --pki "$work/pki"
url="opc.tcp://127.0.0.1:$PORT/"
taskset -c 1 nice -n 10 "$BIN" bench rogue "$url" --variant items --items "$ITEMS" \
  --node i=2258 --victim-items 0 --duration-s $((DURATION + 4)) --server-pid "$SERVER" \
  > "$work/rogue.txt" 2>&1 &
ROGUE=$!
sleep 0.5
taskset -c 1 "$BIN" bench publish "$url" --sessions 1 --subscriptions 1 --items 100 \
  --node i=2258 --interval-ms 100 --sampling-ms 100 --duration-s "$DURATION" --json \
  > "$work/victim.json" 2> "$work/victim.err"
wait "$ROGUE" || true
ROGUE=
grep -E "^  (rogue  |rogue refused|server RSS)" "$work/rogue.txt" || cat "$work/rogue.txt"
python3 - "$work/victim.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
l = j["lateness_ms"]
print(f"  victim: {j['notifications']} notifications, {j['lost_messages']} lost messages, "
      f"on time {j['on_time']['count']} of {j['on_time']['judged']}; "
      f"lateness p50 {l['p50']:.2f} / p99 {l['p99']:.2f} / max {l['max']:.2f} ms")
EOF
if grep -q "panicked" "$work/server.log"; then
  echo "server panicked:"; grep -m3 "panicked" "$work/server.log"
fi
