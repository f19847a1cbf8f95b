#!/usr/bin/env bash
# The failover measurement (docs/cluster.md, "Measuring failover"): a cluster
# on this machine's loopback - three nats-servers in one JetStream cluster
# (buckets replicated 3 times), three `uascale serve --cluster` nodes sharing
# one application instance certificate, HAProxy in front (mode tcp,
# leastconn, send-proxy-v2; the nodes read the PROXY header) - and
# `uascale bench failover` through HAProxy: SESSIONS sessions with a
# subscription each; after KILL_AFTER_S the first node (n1) is killed with
# SIGKILL; the bench watches DURATION_S and reports the sessions moved, the
# time to resume (p50/p99/max, and the share within 5 s), notifications lost
# and duplicated, and the steady publish delay (arrival minus a message's
# publish time) and value lateness before the kill.
#
# --drain sends SIGTERM instead: n1 drains (its /readyz turns 503, which
# HAProxy checks on the metrics port; after the nodes' shutdown_delay_s it
# writes its sessions' final records and closes their channels in paced
# batches) and the bench reports the same figures, with each moved
# session's notification gap and the sessions recreated.
#
# --latency then compares the steady publish delay with mirroring on and
# off: the same bench without a kill (for KILL_AFTER_S + DURATION_S), once
# through the cluster (n1 started again) and once through the same HAProxy
# in front of OFF_NODES nodes (3) started without --cluster (1: a single
# node). --latency-only skips the failover run.
#
# usage: bench/failover.sh [--sessions N] [--security POLICY[:MODE]]
#            [--interval-ms MS] [--kill-after-s S] [--duration-s S]
#            [--concurrency C] [--source-ips K] [--drain] [--latency | --latency-only]
#            [--off-nodes N] [--handshakes H] [--json] [--report FILE.html]
#            [--out DIR] [--no-build]
# --handshakes sets the nodes' [admission] max_concurrent_handshakes (by
# default derived: 2 x CPUs); after the kill the survivors' /metrics are
# saved as nodeN-metrics.txt.
# Defaults: 3000 sessions, Basic256Sha256:SignAndEncrypt, 1000 ms, kill
# after 10 s, watch 20 s, 20 at a time, the clients spread over K (50)
# loopback addresses 127.0.0.1.. (admission's per-address limits judge the
# address in the PROXY header). Everything runs in OUT (target/failover/
# TIME): the PKI, the stores, the configurations, every process's log, the
# bench's output (failover.txt or .json, latency-on/off.*). Loopback only;
# every process it starts is stopped by its PID on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

SESSIONS=3000
SECURITY=Basic256Sha256:SignAndEncrypt
INTERVAL_MS=1000
KILL_AFTER=10
DURATION=20
CONCURRENCY=20
SOURCES=50
LATENCY=0
FAILOVER=1
OFF_NODES=3
HANDSHAKES=
JSON=
REPORT=
OUT=target/failover/$(date -u +%Y%m%dT%H%M%S)
BUILD=1
DRAIN=
while [ $# -gt 0 ]; do
  case "$1" in
    --sessions) SESSIONS=$2; shift 2 ;;
    --security) SECURITY=$2; shift 2 ;;
    --interval-ms) INTERVAL_MS=$2; shift 2 ;;
    --kill-after-s) KILL_AFTER=$2; shift 2 ;;
    --duration-s) DURATION=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    --source-ips) SOURCES=$2; shift 2 ;;
    --drain) DRAIN=--drain; shift ;;
    --latency) LATENCY=1; shift ;;
    --latency-only) LATENCY=1; FAILOVER=0; shift ;;
    --off-nodes) OFF_NODES=$2; shift 2 ;;
    --handshakes) HANDSHAKES=$2; shift 2 ;;
    --json) JSON=--json; shift ;;
    --report) REPORT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    -h|--help) sed -n '2,41p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
case "$HANDSHAKES" in
  *[!0-9]*) echo "--handshakes takes a number of handshakes, not $HANDSHAKES" >&2; exit 2 ;;
esac
[ "$BUILD" = 1 ] && cargo build --release -p uascale >&2
BIN=$ROOT/target/release/uascale
NATS=$(command -v nats-server || true)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
[ -n "$NATS" ] || { echo "nats-server is not installed (apt-get install nats-server)" >&2; exit 1; }
[ -x "$HAPROXY" ] || { echo "haproxy is not installed (apt-get install haproxy)" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# One socket per session in the bench, two per session in HAProxy.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# Every process started here, stopped by its PID on exit.
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  sleep 1
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_for() { # what, seconds, command...
  local what=$1 limit=$2 i
  shift 2
  for ((i = 0; i < limit * 5; i++)); do
    if "$@"; then return 0; fi
    sleep 0.2
  done
  echo "$what did not come up within $limit s (logs in $OUT)" >&2
  exit 1
}
ready() { curl -sf "http://127.0.0.1:$1/readyz" >/dev/null; }

FRONT=$(free_port)
FRONT_URL=opc.tcp://127.0.0.1:$FRONT

# The stores: three nats-servers, one JetStream cluster.
NATS_PORTS=() ROUTES=()
for i in 1 2 3; do NATS_PORTS+=("$(free_port)"); ROUTES+=("$(free_port)"); done
for i in 0 1 2; do
  others=()
  for j in 0 1 2; do [ "$j" != "$i" ] && others+=("nats://127.0.0.1:${ROUTES[$j]}"); done
  mkdir -p "$OUT/nats$((i + 1))"
  "$NATS" -a 127.0.0.1 -p "${NATS_PORTS[$i]}" -js -sd "$OUT/nats$((i + 1))" \
    --server_name "s$((i + 1))" --cluster_name uascale \
    --cluster "nats://127.0.0.1:${ROUTES[$i]}" --routes "$(IFS=,; echo "${others[*]}")" \
    >"$OUT/nats$((i + 1)).log" 2>&1 &
  PIDS+=($!)
done
for p in "${NATS_PORTS[@]}"; do wait_for "nats-server on $p" 20 listening "$p"; done

# One application instance certificate for all nodes, for the front end's
# host; the client trusts it.
cat >"$OUT/node.toml" <<EOF
[cluster]
heartbeat_ms = 300
lease_ms = 3000
replicas = 3
[security]
allow_security_none = true
trust_all_client_certificates = true
EOF
if [ -n "$HANDSHAKES" ]; then
  printf '[admission]\nmax_concurrent_handshakes = %s\n' "$HANDSHAKES" >>"$OUT/node.toml"
fi
"$BIN" cert create --pki "$OUT/pki" --config "$OUT/node.toml" --host 127.0.0.1 --host localhost >&2
mkdir -p "$OUT/pki-client/trusted/certs"
cp "$OUT/pki/own/certs/cert.der" "$OUT/pki-client/trusted/certs/server.der"

# Node i (1..3): its OPC UA and metrics ports, its PID once started.
NODE_PORTS=() METRICS_PORTS=() NODE_PIDS=()
for i in 1 2 3; do NODE_PORTS+=("$(free_port)"); METRICS_PORTS+=("$(free_port)"); NODE_PIDS+=(""); done
start_node() { # index (1..3), cluster|standalone
  local i=$1 k=$(($1 - 1)) cluster=()
  if [ "$2" = cluster ]; then
    cluster=(--cluster "nats://127.0.0.1:${NATS_PORTS[$k]}" --node-id "n$i" --node-index "$i")
  fi
  RUST_LOG=warn "$BIN" serve --config "$OUT/node.toml" --bind 127.0.0.1 --host 127.0.0.1 \
    --port "${NODE_PORTS[$k]}" --pki "$OUT/pki" "${cluster[@]}" --advertise "$FRONT_URL" \
    --proxy-protocol --metrics "127.0.0.1:${METRICS_PORTS[$k]}" >>"$OUT/node$i-$2.log" 2>&1 &
  NODE_PIDS[$k]=$!
  PIDS+=($!)
  wait_for "node $i" 60 ready "${METRICS_PORTS[$k]}"
}
stop_nodes() {
  local k
  for k in 0 1 2; do
    [ -n "${NODE_PIDS[$k]}" ] || continue
    kill -INT "${NODE_PIDS[$k]}" 2>/dev/null || true
    wait "${NODE_PIDS[$k]}" 2>/dev/null || true
    NODE_PIDS[$k]=""
  done
}

# HAProxy in front of nodes 1..n.
HAPROXY_PID=
start_haproxy() { # node count
  local i cfg=$OUT/haproxy-$1.cfg
  {
    printf 'global\n  maxconn %s\n' $((SESSIONS * 2 + 1000))
    printf 'defaults\n  mode tcp\n  timeout connect 1s\n  timeout client 1h\n  timeout server 1h\n'
    printf '  retries 3\n  option redispatch\n'
    printf 'frontend opcua\n  bind 127.0.0.1:%s\n  default_backend nodes\n' "$FRONT"
    printf 'backend nodes\n  balance leastconn\n  option httpchk GET /readyz\n'
    for ((i = 1; i <= $1; i++)); do
      printf '  server n%s 127.0.0.1:%s send-proxy-v2 check port %s inter 300ms fall 1 rise 2\n' \
        "$i" "${NODE_PORTS[$((i - 1))]}" "${METRICS_PORTS[$((i - 1))]}"
    done
  } >"$cfg"
  if [ -n "$HAPROXY_PID" ]; then kill "$HAPROXY_PID" 2>/dev/null || true; wait "$HAPROXY_PID" 2>/dev/null || true; fi
  "$HAPROXY" -f "$cfg" -db >>"$OUT/haproxy.log" 2>&1 &
  HAPROXY_PID=$!
  PIDS+=($!)
  wait_for haproxy 10 listening "$FRONT"
  # Its health checks mark the nodes up (rise 2).
  sleep 1
}

SOURCE_LIST=$(seq -s, -f '127.0.0.%g' 1 "$SOURCES")
bench() { # output name, extra flags...
  local name=$1 ext=txt
  shift
  [ -n "$JSON" ] && ext=json
  local report=()
  [ -n "$REPORT" ] && report=(--report "${REPORT%.html}-$name.html")
  echo "== $name: load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  "$BIN" bench failover "$FRONT_URL" --sessions "$SESSIONS" --security "$SECURITY" \
    --pki "$OUT/pki-client" --interval-ms "$INTERVAL_MS" --concurrency "$CONCURRENCY" \
    --source-ips "$SOURCE_LIST" "$@" $JSON "${report[@]}" | tee "$OUT/$name.$ext"
}

for i in 1 2 3; do start_node "$i" cluster; done
start_haproxy 3
echo "cluster up: front $FRONT_URL, nodes ${NODE_PORTS[*]} (PIDs ${NODE_PIDS[*]}), nats ${NATS_PORTS[*]}; output in $OUT" >&2

if [ "$FAILOVER" = 1 ]; then
  # The victim is n1, the first node: leastconn spreads the sessions evenly,
  # and the bench reports how many it had (sessions moved).
  verb=killing
  [ -n "$DRAIN" ] && verb=draining
  echo "$verb n1 (PID ${NODE_PIDS[0]}) after $KILL_AFTER s" >&2
  bench failover --kill-pid "${NODE_PIDS[0]}" $DRAIN --kill-after-s "$KILL_AFTER" --duration-s "$DURATION"
  wait "${NODE_PIDS[0]}" 2>/dev/null || true
  NODE_PIDS[0]=""
  # The survivors' view: takeovers, admission's busy answers by stage.
  for k in 1 2; do
    curl -s "http://127.0.0.1:${METRICS_PORTS[$k]}/metrics" >"$OUT/node$((k + 1))-metrics.txt" || true
  done
fi

if [ "$LATENCY" = 1 ]; then
  WATCH=$(python3 -c "print($KILL_AFTER + $DURATION)")
  # Mirroring on: the full cluster again.
  [ -z "${NODE_PIDS[0]}" ] && start_node 1 cluster
  sleep 2
  bench latency-on --kill-after-s 0 --duration-s "$WATCH"
  # Mirroring off: the same front end, nodes without --cluster.
  stop_nodes
  for ((i = 1; i <= OFF_NODES; i++)); do start_node "$i" standalone; done
  start_haproxy "$OFF_NODES"
  bench latency-off --kill-after-s 0 --duration-s "$WATCH"
  if [ -n "$JSON" ]; then
    python3 - "$OUT/latency-on.json" "$OUT/latency-off.json" <<'EOF' >&2
import json, sys
on, off = (json.load(open(p)) for p in sys.argv[1:3])
ms = lambda x: "-" if x is None else f"{x:.1f} ms"
for name, r in (("mirroring on", on), ("mirroring off", off)):
    l, d = r["steady_lateness_ms"], r["steady_publish_delay_ms"]
    print(f"{name:14} publish delay p50 {ms(d['p50'])}, p99 {ms(d['p99'])}, max {ms(d['max'])}; "
          f"value lateness p50 {ms(l['p50'])}, p99 {ms(l['p99'])} ({r['established']} sessions)")
EOF
  fi
fi
echo "done; output in $OUT" >&2
