#!/usr/bin/env bash
# The chaos soak (docs/testing.md, "The soak"): SESSIONS secured sessions
# (Basic256Sha256 SignAndEncrypt), each with a subscription, held for
# SECONDS through the chaos relay of the client tests (resets mid-chunk
# every SOAK_CHAOS_S, a cut of every connection every SOAK_CUT_EVERY-th
# time), against `uascale serve` in its own process; the server's RSS and
# its session, channel and subscription counts are printed every
# SOAK_SAMPLE_S seconds.
#   bench/soak.sh [SECONDS [SESSIONS]]        defaults: 1800 1000
# Other settings are the SOAK_* variables of crates/client/tests/soak.rs.
# Output: the table on stdout and in target/soak/soak-<time>.txt, the
# server's log in target/soak/server.log.
set -eu
seconds=${1:-1800}
sessions=${2:-1000}
cd "$(dirname "$0")/.."
OUT=target/soak
mkdir -p $OUT
port=${SOAK_PORT:-4855}
metrics=127.0.0.1:${SOAK_METRICS_PORT:-9465}
cargo build --release -p uascale
cargo test --release -p uascale-client --test soak --no-run
# Every RSA policy published; the soak's self-signed client certificate
# trusted.
printf '[security]\ntrust_all_client_certificates = true\n' > $OUT/server.toml
RUST_LOG=warn target/release/uascale serve --bind 127.0.0.1 --host 127.0.0.1 --port "$port" \
  --pki $OUT/pki --config $OUT/server.toml --metrics "$metrics" > $OUT/server.log 2>&1 &
pid=$!
trap 'kill -INT $pid 2>/dev/null; sleep 2; kill -9 $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  if (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null; then break; fi
  sleep 0.2
done
echo "server pid $pid on port $port; load $(cat /proc/loadavg)"
SOAK_URL=opc.tcp://127.0.0.1:$port SOAK_METRICS=$metrics SOAK_SERVER_PID=$pid \
SOAK_SECONDS=$seconds SOAK_SESSIONS=$sessions \
  cargo test --release -p uascale-client --test soak -- --ignored --nocapture \
  2>&1 | tee "$OUT/soak-$(date +%Y%m%dT%H%M%S).txt"
status=${PIPESTATUS[0]}
echo "load $(cat /proc/loadavg)"
exit "$status"
