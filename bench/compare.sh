#!/usr/bin/env bash
# Side by side: uascale against peer OPC UA servers on loopback, in one run.
#
# Each server (uascale; open62541 via the `o6` wheel; the crates.io
# async-opcua stack through bench/peers/async-opcua-server; optionally the
# Python asyncua server) is started pinned to core 0 (`taskset -c 0`) with
# SecurityPolicy None and anonymous identity; the load runs pinned to core 1.
# Shapes, each with the server's PID so server CPU comes from /proc:
#
#   sessions  `uascale bench sessions`: N sessions (90: o6 caps at 100),
#             C at a time, held, closed
#   read1     `uascale bench read`: 10 connections x 100 Reads in flight,
#             1 value per Read, node i=2258 (ServerStatus_CurrentTime,
#             a value every server computes per read)
#   read100   the same with 100 values per Read (i=2258 100 times)
#   uabench   optional: the independent load client uabench on the read1
#             shape, as a cross-check of the uascale client's numbers.
#             uabench is not part of this repository; it is built from
#             $UABENCH_SRC (default ../shared/tools/uabench, where the
#             project's development machines keep it). When that directory
#             has no Cargo.toml the shape is skipped with a note.
#   scale     `uascale bench sessions` at scale: --scale-sessions (1000), 50 at
#             a time, held; not against o6 (it caps at 100 sessions)
#   publish   `uascale bench publish`: 50 sessions x 1 subscription x 10 items
#             on i=2258 (CurrentTime, new at every sample), sampled and
#             published every 100 ms: notifications/s and server CPU each
#
# Every server is restarted for each of the R rounds (o6 exits after 10
# minutes without a licence key); within a round the servers take turns, so
# drift of the shared machine hits them alike. Medians over the rounds are
# printed as a Markdown table with ratios to uascale; raw JSON stays in the
# output directory.
#
# usage: bench/compare.sh [options]
#   --smoke                tiny durations, uascale + o6 only, 1 round
#   --repeat R             rounds (3)
#   --warmup-s S           warm-up before each Read window (2)
#   --duration-s S         measured Read window (5)
#   --sessions N           sessions shape size (90)
#   --session-concurrency C   (10)
#   --hold-s S             how long the sessions are held (2)
#   --scale-sessions N     sessions of the scale shape (1000; 0 skips it)
#   --no-publish           skip the publish shape
#   --peers LIST           comma list of uascale,o6,async-opcua,asyncua
#                          (default uascale,o6,async-opcua)
#   --with-asyncua         add asyncua to the peers
#   --no-uabench           skip the uabench cross-check (skipped anyway when
#                          $UABENCH_SRC is absent)
#   --no-build             use the binaries already built
#   --out DIR              output directory (target/compare/<UTC time>)
#   --base-port P          first port (48700); each server and round takes the next
#
# Loopback only; every process it starts is stopped by its PID on exit.
set -euo pipefail

ARGS="$*"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

REPEAT=3
WARMUP=2
DURATION=5
SESSIONS=90
SESSION_CONC=10
HOLD=2
PEERS="uascale,o6,async-opcua"
UABENCH=auto
UABENCH_SRC=${UABENCH_SRC:-../shared/tools/uabench}
BUILD=1
OUT=""
BASE_PORT=48700
SMOKE=0
SCALE_SESSIONS=1000
PUBLISH=1

die() {
    echo "compare.sh: $*" >&2
    exit 1
}

while [ $# -gt 0 ]; do
    case "$1" in
    --smoke)
        SMOKE=1
        REPEAT=1
        WARMUP=0.5
        DURATION=1
        SESSIONS=20
        HOLD=0.5
        SCALE_SESSIONS=50
        PEERS="uascale,o6"
        shift
        ;;
    --repeat) REPEAT=${2:?--repeat needs a value}; shift 2 ;;
    --warmup-s) WARMUP=${2:?--warmup-s needs a value}; shift 2 ;;
    --duration-s) DURATION=${2:?--duration-s needs a value}; shift 2 ;;
    --sessions) SESSIONS=${2:?--sessions needs a value}; shift 2 ;;
    --session-concurrency) SESSION_CONC=${2:?--session-concurrency needs a value}; shift 2 ;;
    --hold-s) HOLD=${2:?--hold-s needs a value}; shift 2 ;;
    --scale-sessions) SCALE_SESSIONS=${2:?--scale-sessions needs a value}; shift 2 ;;
    --no-publish) PUBLISH=0; shift ;;
    --peers) PEERS=${2:?--peers needs a value}; shift 2 ;;
    --with-asyncua) PEERS="$PEERS,asyncua"; shift ;;
    --no-uabench) UABENCH=0; shift ;;
    --no-build) BUILD=0; shift ;;
    --out) OUT=${2:?--out needs a value}; shift 2 ;;
    --base-port) BASE_PORT=${2:?--base-port needs a value}; shift 2 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
done

num_re='^[0-9]+([.][0-9]+)?$'
for v in "$WARMUP" "$DURATION" "$HOLD"; do
    [[ $v =~ $num_re ]] || die "durations must be numbers of seconds, got $v"
done
[[ $SCALE_SESSIONS =~ ^[0-9]+$ ]] || die "--scale-sessions must be a count, got $SCALE_SESSIONS"
for v in "$REPEAT" "$SESSIONS" "$SESSION_CONC" "$BASE_PORT"; do
    [[ $v =~ ^[0-9]+$ && $v -gt 0 ]] || die "counts and ports must be positive integers, got $v"
done
IFS=',' read -r -a SERVERS <<<"$PEERS"
[ "${SERVERS[0]}" = uascale ] || die "--peers must start with uascale (the ratios are to it)"
for s in "${SERVERS[@]}"; do
    case "$s" in uascale | o6 | async-opcua | asyncua) ;; *) die "unknown peer $s" ;; esac
done
[ "$(nproc)" -ge 2 ] || die "needs 2 cores (server on core 0, load on core 1)"

OUT=${OUT:-target/compare/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT/raw" "$OUT/logs"
UASCALE=target/release/uascale
PEER_BIN=target/peers/release/async-opcua-peer
UABENCH_BIN=target/uabench/release/uabench
VENV_PY=target/venv/bin/python

# uabench is optional (see the header): use it when its sources are there,
# or with --no-build when a binary was built before.
if [ "$UABENCH" = auto ]; then
    if [ -f "$UABENCH_SRC/Cargo.toml" ] || { [ "$BUILD" = 0 ] && [ -x "$UABENCH_BIN" ]; }; then
        UABENCH=1
    else
        UABENCH=0
        echo "== uabench: no $UABENCH_SRC/Cargo.toml (optional, not in this repository; set UABENCH_SRC); skipping the cross-check" >&2
    fi
fi

needs_python=0
for s in "${SERVERS[@]}"; do
    case "$s" in o6 | asyncua) needs_python=1 ;; esac
done

if [ "$BUILD" = 1 ]; then
    echo "== building (release): uascale, the async-opcua peer, uabench if used" >&2
    cargo build --release -p uascale >&2
    if [[ ",$PEERS," == *,async-opcua,* ]]; then
        cargo build --release --manifest-path bench/peers/async-opcua-server/Cargo.toml \
            --target-dir target/peers >&2
    fi
    if [ "$UABENCH" = 1 ]; then
        cargo build --release --manifest-path "$UABENCH_SRC/Cargo.toml" \
            --target-dir target/uabench >&2
    fi
    if [ "$needs_python" = 1 ] && [ ! -x "$VENV_PY" ]; then
        python3 -m venv target/venv >&2
        target/venv/bin/pip install -q -r tests/requirements.txt >&2
    fi
fi
[ -x "$UASCALE" ] || die "$UASCALE is missing (run without --no-build)"
if [[ ",$PEERS," == *,async-opcua,* ]]; then
    [ -x "$PEER_BIN" ] || die "$PEER_BIN is missing (run without --no-build)"
fi
if [ "$UABENCH" = 1 ]; then
    [ -x "$UABENCH_BIN" ] || die "$UABENCH_BIN is missing (run without --no-build)"
fi
if [ "$needs_python" = 1 ]; then
    [ -x "$VENV_PY" ] || die "$VENV_PY is missing: python3 -m venv target/venv && target/venv/bin/pip install -r tests/requirements.txt"
fi

# --- server processes, tracked by PID ---------------------------------------
SERVER_PID=""
SERVER_FD=""
cleanup_server() {
    if [ -n "$SERVER_FD" ]; then
        # Closing its stdin asks a peer to stop.
        eval "exec ${SERVER_FD}>&-" || true
        SERVER_FD=""
    fi
    if [ -n "$SERVER_PID" ]; then
        local pid=$SERVER_PID
        SERVER_PID=""
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
}
trap cleanup_server EXIT
trap 'cleanup_server; exit 130' INT TERM

port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# start_server NAME PORT ROUND: starts it on core 0, sets SERVER_PID, waits
# until the port accepts connections; fails the run when it cannot start.
start_server() {
    local name=$1 port=$2 round=$3
    local log="$OUT/logs/$name-$round.log"
    port_open "$port" && die "port $port is already in use (try --base-port)"
    local fifo="$OUT/logs/$name-$round.stdin"
    case "$name" in
    uascale)
        local pki="$OUT/pki-uascale-$round"
        # Every client of these shapes comes from 127.0.0.1: the
        # per-address connection bucket (1/8 of the global one by default)
        # would pace the session shapes, which measure the cost of a
        # session, not admission. The peers have no such stage.
        local conf="$OUT/uascale-$round.toml"
        printf '[admission]\nconnections_per_second = 100000\nconnection_burst = 100000\nconnections_per_second_per_address = 100000\nconnection_burst_per_address = 100000\n' >"$conf"
        RUST_LOG=warn taskset -c 0 "$UASCALE" serve --bind 127.0.0.1 --port "$port" \
            --security none --pki "$pki" --config "$conf" </dev/null >"$log" 2>&1 &
        SERVER_PID=$!
        ;;
    async-opcua | o6 | asyncua)
        # Held stdin: the peers run until it closes.
        rm -f "$fifo"
        mkfifo "$fifo"
        if [ "$name" = async-opcua ]; then
            RUST_LOG=warn taskset -c 0 "$PEER_BIN" "$port" "$OUT/pki-async-opcua-$round" \
                <"$fifo" >"$log" 2>&1 &
        else
            taskset -c 0 "$VENV_PY" tests/interop/peer_server.py "$name" "$port" \
                <"$fifo" >"$log" 2>&1 &
        fi
        SERVER_PID=$!
        exec {SERVER_FD}>"$fifo"
        ;;
    esac
    local deadline=$((SECONDS + 60))
    until port_open "$port"; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "--- $log" >&2
            tail -n 20 "$log" >&2 || true
            SERVER_PID=""
            die "$name did not start (see $log)"
        fi
        [ $SECONDS -lt $deadline ] || die "$name did not accept connections on port $port within 60 s (see $log)"
        sleep 0.2
    done
    sleep 0.5
}

# run_shape NAME PORT ROUND SHAPE: one measurement, JSON into raw/.
run_shape() {
    local name=$1 port=$2 round=$3 shape=$4
    local url="opc.tcp://127.0.0.1:$port/"
    local out="$OUT/raw/$name-$shape-$round.json"
    local err="$OUT/logs/$name-$shape-$round.err"
    local limit
    limit=$(python3 -c "print(int($WARMUP + $DURATION + $HOLD) + 300)")
    local rc=0
    case "$shape" in
    sessions)
        timeout "$limit" taskset -c 1 "$UASCALE" bench sessions "$url" --sessions "$SESSIONS" \
            --concurrency "$SESSION_CONC" --hold-s "$HOLD" --server-pid "$SERVER_PID" \
            --json >"$out" 2>"$err" || rc=$?
        ;;
    scale)
        if [ "$name" = o6 ]; then
            echo "   scale: skipped (o6 caps at 100 sessions)" >&2
            return 0
        fi
        timeout "$limit" taskset -c 1 "$UASCALE" bench sessions "$url" --sessions "$SCALE_SESSIONS" \
            --concurrency 50 --hold-s "$HOLD" --server-pid "$SERVER_PID" \
            --json >"$out" 2>"$err" || rc=$?
        ;;
    publish)
        timeout "$limit" taskset -c 1 "$UASCALE" bench publish "$url" --sessions 50 \
            --subscriptions 1 --items 10 --node i=2258 --sampling-ms 100 --interval-ms 100 \
            --concurrency 10 --max-retries 0 --warmup-s "$WARMUP" --duration-s "$DURATION" \
            --server-pid "$SERVER_PID" --json >"$out" 2>"$err" || rc=$?
        ;;
    read1 | read100)
        local k=1
        [ "$shape" = read100 ] && k=100
        timeout "$limit" taskset -c 1 "$UASCALE" bench read "$url" --connections 10 \
            --inflight 100 --values-per-read "$k" --node i=2258 --warmup-s "$WARMUP" \
            --duration-s "$DURATION" --server-pid "$SERVER_PID" --json >"$out" 2>"$err" || rc=$?
        ;;
    uabench)
        timeout "$limit" taskset -c 1 "$UABENCH_BIN" --url "$url" --connections 10 \
            --inflight 100 --values-per-read 1 --node i=2258 --warmup-s "$WARMUP" \
            --duration-s "$DURATION" --server-pid "$SERVER_PID" --label "$name" \
            2>"$err" | sed -n 's/^RESULT //p' >"$out" || rc=$?
        ;;
    esac
    if [ "$rc" != 0 ] || [ ! -s "$out" ]; then
        echo "   $shape: FAILED (exit $rc; see $err)" >&2
        tail -n 5 "$err" >&2 || true
        rm -f "$out"
        return 0
    fi
    python3 - "$shape" "$out" >&2 <<'EOF'
import json, sys
shape, path = sys.argv[1], sys.argv[2]
d = json.load(open(path))
def fmt(v):
    return f"{v:.3f}" if isinstance(v, (int, float)) else "-"
if shape == "publish":
    s = d.get("server") or {}
    print(f"   publish: {d['established']}/{d['sessions']} sessions, {d['notifications_per_s']:.0f} notifications/s, "
          f"server {fmt(s.get('cpu_us_per_notification'))} us CPU/notification, lost {d['lost_messages']}, "
          f"failures {d['failures']}")
elif shape in ("sessions", "scale"):
    print(f"   sessions: {d['established']}/{d['sessions']} established, "
          f"{d['sessions_per_s']:.0f}/s, server {fmt(d.get('server_cpu_ms_per_session'))} ms CPU/session, "
          f"failures {d['failures']}")
else:
    errs = d.get("errors")
    print(f"   {shape}: {d['reads_per_s']:.0f} reads/s, server {fmt(d.get('server_cpu_us_per_read'))} us CPU/read, "
          f"errors {errs}")
EOF
}

SHAPES=(sessions read1 read100)
[ "$UABENCH" = 1 ] && SHAPES+=(uabench)
[ "$SCALE_SESSIONS" -gt 0 ] && SHAPES+=(scale)
[ "$PUBLISH" = 1 ] && SHAPES+=(publish)

{
    echo "date_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "loadavg_before=$(cut -d' ' -f1-3 /proc/loadavg)"
    echo "command=bench/compare.sh $ARGS"
    echo "repeat=$REPEAT warmup_s=$WARMUP duration_s=$DURATION sessions=$SESSIONS session_concurrency=$SESSION_CONC hold_s=$HOLD scale_sessions=$SCALE_SESSIONS publish=$PUBLISH"
    echo "servers=$PEERS"
    echo "uascale_commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} >"$OUT/meta.txt"
echo "== $(date -u +%H:%M:%S) comparing $PEERS, $REPEAT round(s); load average $(cut -d' ' -f1-3 /proc/loadavg); output $OUT" >&2

for round in $(seq 1 "$REPEAT"); do
    idx=0
    for name in "${SERVERS[@]}"; do
        # A fresh port per server and round: a peer that does not set
        # SO_REUSEADDR cannot bind while the last round's connections are
        # in TIME_WAIT.
        port=$((BASE_PORT + (round - 1) * ${#SERVERS[@]} + idx))
        idx=$((idx + 1))
        echo "== round $round/$REPEAT: $name (port $port)" >&2
        start_server "$name" "$port" "$round"
        for shape in "${SHAPES[@]}"; do
            run_shape "$name" "$port" "$round" "$shape"
        done
        kill -0 "$SERVER_PID" 2>/dev/null || echo "   WARNING: $name exited during the round" >&2
        cleanup_server
    done
done
echo "loadavg_after=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/meta.txt"

python3 "$ROOT/bench/compare_table.py" "$OUT" | tee "$OUT/table.md"
echo "== raw JSON and logs in $OUT" >&2
