#!/usr/bin/env bash
# The rogue client against a fresh `uascale serve` with the default
# configuration (demo values changing every 100 ms on 100 load nodes):
# every variant of `uascale bench rogue` in turn, each against its own
# server, printing the server's RSS (baseline / peak / end), what the rogue
# was refused and what the victim subscription (100 items at 100 ms) saw.
#
#   bench/rogue.sh [BIN] [DURATION_S] [VARIANT...]
#
# BIN defaults to target/release/uascale; DURATION_S to 30; the variants
# to items subscriptions continuation events. Memory figures only: they do
# not depend on the machine's load, the victim's lateness does.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BIN=${1:-target/release/uascale}
DURATION=${2:-30}
shift 2 2>/dev/null || shift $#
VARIANTS=${*:-items subscriptions continuation events}
PORT=${PORT:-48436}
work=$(mktemp -d)
trap 'stop; rm -rf "$work"' EXIT
printf '[server]\nport = %s\n' "$PORT" > "$work/server.toml"
echo "# $(date -u +%FT%TZ), $(uptime | sed 's/.*load/load/'), $BIN"
for v in $VARIANTS; do
  start_server "$work/server.toml" "$work/server.log" \
    --security none --bind 127.0.0.1 --nodes 100 --rate-ms 100
  echo "## variant $v"
  "$BIN" bench rogue "opc.tcp://127.0.0.1:$PORT" --variant "$v" \
    --load-nodes 100 --duration-s "$DURATION" --server-pid "$SERVER" || true
  if grep -q "panicked" "$work/server.log"; then
    echo "server panicked:"; grep -m3 "panicked" "$work/server.log"
  fi
  stop
done
