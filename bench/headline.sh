#!/usr/bin/env bash
# The headline numbers, regenerated in one run on this machine, for uascale
# and every peer server that can run here:
#
#   reads      server CPU per 1-value Read and per value at 100 values per
#              Read, and per None session (bench/compare.sh)
#   publish    server CPU per notification, 50 sessions x 10 items at
#              100 ms (bench/compare.sh)
#   sessions   server CPU and memory per session established with None,
#              Basic256Sha256 SignAndEncrypt and ECC_nistP256 SignAndEncrypt
#              (bench/session_table.sh, --subscribe off), with the OpenSSL
#              floor (`openssl speed rsa2048 ecdsap256 ecdhp256` on the
#              server's core) measured before and after in the same run
#   storm      a secured connect storm, half naive and half cooperative
#              clients, with steady sessions publishing throughout
#              (bench/storm.sh uascale-secured)
#   fairness   a victim's Reads under a flood, per isolation profile
#              (bench/fairness.sh)
#   failover   kill -9 of a cluster node, then a drain (SIGTERM) of one:
#              sessions resumed and recreated, lost and duplicated
#              notifications, the largest gap (bench/failover.sh [--drain];
#              needs nats-server and haproxy)
#
# Peers: async-opcua 0.19 (bench/peers/async-opcua-server, built into
# target/peers), open62541 through the o6 wheel and Python asyncua (both
# from tests/requirements.txt in target/venv). A peer that cannot be built
# or imported here is skipped with the reason printed and written into the
# report; a row a peer cannot do (no admission control, no request queue,
# no cluster) says so in its cell. Each server runs pinned to core 0
# (taskset -c 0), the load on core 1; figures are medians over the rounds.
# The CPU model, load averages, date and commit go into the report.
#
# Output in OUT (target/headline/<UTC time>): headline.md (the table the
# README's is pasted from), headline.html (the same with plots, inline
# SVG, nothing loaded from elsewhere), and every script's raw output.
#
# usage: bench/headline.sh [--quick] [--rounds R] [--peers LIST] [--out DIR]
#                          [--no-build]
#   --quick      tiny counts and windows, one round: proves that every part
#                runs (a few minutes); its numbers mean nothing
#   --rounds R   rounds of each measurement (3)
#   --peers L    comma list of async-opcua,o6,asyncua (all three)
#   --no-build   use the binaries already built
# Loopback only; every script it runs stops what it started by PID.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

QUICK=0
ROUNDS=3
PEERS=async-opcua,o6,asyncua
OUT=target/headline/$(date -u +%Y%m%dT%H%M%SZ)
BUILD=1
ARGS="$*"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; shift ;;
    --rounds) ROUNDS=${2:?--rounds needs a value}; shift 2 ;;
    --peers) PEERS=${2:?--peers needs a value}; shift 2 ;;
    --out) OUT=${2:?--out needs a value}; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "headline.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "--rounds takes a positive count" >&2; exit 2; }
[ "$(nproc)" -ge 2 ] || { echo "headline.sh needs 2 cores (server on core 0, load on core 1)" >&2; exit 1; }
command -v taskset >/dev/null || { echo "headline.sh needs taskset (util-linux)" >&2; exit 1; }

if [ "$QUICK" = 1 ]; then
  ROUNDS=1
  COMPARE_ARGS=(--warmup-s 0.5 --duration-s 1 --sessions 20 --hold-s 0.5)
  SESSIONS=40          # per secured-session row
  STORM=(--clients 200 --steady 3 --duration-s 20 --before-s 1 --after-s 1)
  FAIR_S=2
  FAILOVER=(--sessions 30 --kill-after-s 2 --duration-s 6 --source-ips 3)
  DRAIN=(--sessions 30 --kill-after-s 2 --duration-s 12 --source-ips 3)
else
  COMPARE_ARGS=()
  SESSIONS=1000
  STORM=(--clients 3000 --steady 10 --duration-s 60 --before-s 5 --after-s 10)
  FAIR_S=10
  FAILOVER=(--sessions 3000 --interval-ms 1000 --kill-after-s 10 --duration-s 20)
  # The drain waits shutdown_delay_s (5 s) before its paced closes.
  DRAIN=(--sessions 3000 --interval-ms 1000 --kill-after-s 10 --duration-s 30)
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
: >"$OUT/skipped.tsv"
# skip WHAT WHY: a part that does not run here, with the reason (printed
# now and written into the report).
skip() {
  printf '%s\t%s\n' "$1" "$2" >>"$OUT/skipped.tsv"
  echo "== skipped: $1: $2" >&2
}
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }
# A loopback port free now (others on the machine may hold fixed ones).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

cpu_field() { grep -m1 "^$1" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'; }
{
  echo "command=bench/headline.sh $ARGS"
  echo "quick=$QUICK"
  echo "rounds=$ROUNDS"
  echo "date_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpu=$(cpu_field 'model name') (family $(cpu_field 'cpu family'), model $(cpu_field 'model'))"
  echo "cpus=$(nproc)"
  echo "loadavg_start=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} >"$OUT/meta.txt"

# --- binaries and peers ------------------------------------------------------
BIN=$ROOT/target/release/uascale
PEER_BIN=$ROOT/target/peers/release/async-opcua-peer
VENV_PY=$ROOT/target/venv/bin/python
if [ "$BUILD" = 1 ]; then
  step "building uascale (release)"
  cargo build --release -p uascale >&2
fi
[ -x "$BIN" ] || { echo "headline.sh: $BIN is missing (run without --no-build)" >&2; exit 1; }

AVAILABLE=uascale
for peer in ${PEERS//,/ }; do
  case "$peer" in
    async-opcua)
      if [ "$BUILD" = 1 ]; then
        step "building the async-opcua peer (release, target/peers)"
        cargo build --release --manifest-path bench/peers/async-opcua-server/Cargo.toml \
          --target-dir target/peers >&2 || true
      fi
      if [ -x "$PEER_BIN" ]; then AVAILABLE+=,async-opcua; else
        if [ "$BUILD" = 1 ]; then why="bench/peers/async-opcua-server did not build (it needs crates.io)"
        else why="$PEER_BIN is not built (run without --no-build)"; fi
        skip async-opcua "$why"
      fi
      ;;
    o6 | asyncua)
      if [ ! -x "$VENV_PY" ] && [ "$BUILD" = 1 ]; then
        step "creating target/venv with tests/requirements.txt"
        { python3 -m venv target/venv && "$VENV_PY" -m pip install -q -r tests/requirements.txt; } >&2 || true
      fi
      module=$peer
      if [ -x "$VENV_PY" ] && "$VENV_PY" -c "import $module" >/dev/null 2>&1; then
        AVAILABLE+=,$peer
      else
        skip "$peer" "Python module $module not importable from target/venv (python3-venv and PyPI needed; cargo xtask ci creates it)"
      fi
      ;;
    *) echo "headline.sh: unknown peer $peer (async-opcua, o6, asyncua)" >&2; exit 2 ;;
  esac
done
echo "servers=$AVAILABLE" >>"$OUT/meta.txt"
step "servers: $AVAILABLE; $ROUNDS round(s); CPU $(cpu_field 'model name'); load $(cut -d' ' -f1-3 /proc/loadavg); output $OUT"

# --- reads, None sessions, publish: bench/compare.sh --------------------------
step "reads, None sessions and publish (bench/compare.sh)"
bench/compare.sh --no-build --no-uabench --scale-sessions 0 --repeat "$ROUNDS" \
  --peers "$AVAILABLE" --out "$OUT/compare" "${COMPARE_ARGS[@]}" >"$OUT/compare.log" 2>&1 \
  || skip compare "bench/compare.sh failed (see compare.log)"

# --- secured sessions against the OpenSSL floor: bench/session_table.sh -------
step "sessions per security policy, with the OpenSSL floor (bench/session_table.sh)"
floor rsa2048 ecdsap256 ecdhp256 >"$OUT/floor-before.txt" || skip floor "openssl speed did not run"
mkdir -p "$OUT/sessions"
for server in uascale async-opcua asyncua; do
  [[ ",$AVAILABLE," == *,$server,* ]] || continue
  for policy in None Basic256Sha256:SignAndEncrypt ECC_nistP256:SignAndEncrypt; do
    if [ "$server" != uascale ] && [[ $policy == ECC_* ]]; then
      skip "$server $policy" "its peer server (bench/session_table.sh) serves None and Basic256Sha256 only"
      continue
    fi
    for round in $(seq 1 "$ROUNDS"); do
      port=$(free_port)
      dir="$OUT/sessions/$server-${policy%%:*}-$round"
      bench/session_table.sh --no-build --server "$server" --security "$policy" \
        --sizes "$SESSIONS" --modes off --port "$port" --out "$dir" >"$dir.log" 2>&1 \
        || skip "$server $policy round $round" "bench/session_table.sh failed (see $dir.log)"
    done
  done
done
if [[ ",$AVAILABLE," == *,o6,* ]]; then
  skip "o6 secured sessions" "o6 caps at 100 sessions and its peer script serves None only"
fi
floor rsa2048 ecdsap256 ecdhp256 >"$OUT/floor-after.txt" || true

# --- a secured storm: bench/storm.sh ------------------------------------------
step "a secured connect storm (bench/storm.sh uascale-secured)"
mkdir -p "$OUT/storm"
for round in $(seq 1 "$ROUNDS"); do
  port=$(free_port)
  if bench/storm.sh uascale-secured "$port" --behaviour mixed --max-retries 30 --timeout-s 3 \
    --security Basic256Sha256:SignAndEncrypt --trust-server --pki "$OUT/storm/client-pki" \
    "${STORM[@]}" >"$OUT/storm/run-$round.log" 2>&1 && [ -s target/storm/uascale-secured.json ]; then
    cp target/storm/uascale-secured.json "$OUT/storm/uascale-$round.json"
    cp target/storm/uascale-secured.html "$OUT/storm/uascale-$round.html" 2>/dev/null || true
  else
    skip "storm round $round" "bench/storm.sh failed (see storm/run-$round.log)"
  fi
done

# --- fairness: bench/fairness.sh ----------------------------------------------
step "fairness: a victim under a flood (bench/fairness.sh)"
for round in $(seq 1 "$ROUNDS"); do
  bench/fairness.sh --no-build --profiles shared_only,balanced --duration-s "$FAIR_S" \
    --out "$OUT/fairness/$round" >"$OUT/fairness-$round.md" 2>"$OUT/fairness-$round.log" \
    || skip "fairness round $round" "bench/fairness.sh failed (see fairness-$round.log)"
done

# --- failover: bench/failover.sh ----------------------------------------------
step "failover: kill -9 of a cluster node (bench/failover.sh)"
if ! command -v nats-server >/dev/null && [ ! -x /usr/sbin/nats-server ]; then
  skip failover "nats-server is not installed (apt-get install nats-server)"
elif ! command -v haproxy >/dev/null && [ ! -x /usr/sbin/haproxy ]; then
  skip failover "haproxy is not installed (apt-get install haproxy)"
else
  for round in $(seq 1 "$ROUNDS"); do
    bench/failover.sh --no-build --json --out "$OUT/failover/$round" "${FAILOVER[@]}" \
      >"$OUT/failover-$round.log" 2>&1 \
      || skip "failover round $round" "bench/failover.sh failed (see failover-$round.log)"
  done
  step "failover: a drain (SIGTERM) of a cluster node (bench/failover.sh --drain)"
  for round in $(seq 1 "$ROUNDS"); do
    bench/failover.sh --no-build --json --drain --out "$OUT/drain/$round" "${DRAIN[@]}" \
      >"$OUT/drain-$round.log" 2>&1 \
      || skip "drain round $round" "bench/failover.sh --drain failed (see drain-$round.log)"
  done
fi

echo "loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/meta.txt"
python3 bench/headline_report.py "$OUT"
step "done: $OUT/headline.md and $OUT/headline.html"
