#!/usr/bin/env bash
# Rounds of Python asyncua secured sessions against uascale, each beside its
# floors, as in docs/notebook/benchmarks.md ("Item 1 with asyncua: the floor at the
# client's pace"):
#   bench/asyncua_rounds.sh [ROUNDS [SESSIONS [PORT]]]
# Per round: `openssl speed rsa2048`, the paced floor (bench/rsa_paced_floor.py:
# 200 OpenSSL signatures, the core idle 20 ms before each), a fresh server
# (default configuration, every client certificate trusted, admission
# loosened) and
# bench/asyncua_sessions.py (8 at a time, held 3 s), `openssl speed` again.
# The server, the floors on core 0, asyncua on core 1. Needs `cargo build
# --release -p uascale` and target/venv (cargo xtask ci). Files in
# target/asyncua-rounds/.
set -u
rounds=${1:-3}; n=${2:-300}; port=${3:-4856}
cd "$(dirname "$0")/.."
OUT=target/asyncua-rounds; mkdir -p $OUT
UA=target/release/uascale; PY=target/venv/bin/python
. bench/lib.sh
BIN=$UA
trap stop EXIT
# Trust and admission out of the way: every client comes from 127.0.0.1,
# and asyncua does not retry a busy answer.
relaxed_config "$port" > $OUT/server.toml
# The client's certificate: asyncua presents urn:uascale:client, the URI of
# uascale's own client certificates.
[ -f $OUT/client-pki/own/certs/cert.der ] || $UA cert create --pki $OUT/client-pki --uri urn:uascale:client --name asyncua-bench > /dev/null
rsa_floor() { floor rsa2048 | awk '{print $4 * 1000}'; }
echo "load $(cut -d' ' -f1-3 /proc/loadavg) $(date -u +%H:%M:%S); $(grep -m1 'model name' /proc/cpuinfo)"
for i in $(seq "$rounds"); do
  f0=$(rsa_floor)
  paced=$(taskset -c 0 $PY bench/rsa_paced_floor.py 200 20 | sed -n 2p | sed -E 's/.*: ([0-9.]+) ms mean.*/\1/')
  start_server $OUT/server.toml $OUT/server.log --pki $OUT/pki
  ua=$(taskset -c 1 $PY bench/asyncua_sessions.py opc.tcp://127.0.0.1:$port "$n" 8 $SERVER secure 3 \
       $OUT/client-pki $OUT/pki 2>&1 | grep -v Warn)
  stop
  f1=$(rsa_floor)
  echo "$ua" > $OUT/round-$i.txt
  all=$(echo "$ua" | sed -nE 's/.*server CPU ([0-9.]+) ms per session$/\1/p' | head -1)
  est=$(echo "$ua" | sed -nE 's/.*establishment alone ([0-9.]+) ms.*/\1/p')
  python3 -c "
f = ($f0 + $f1) / 2
print('round $i: openssl speed $f0 / $f1 ms, paced floor $paced ms | asyncua all $all ms = %.3fx |'
      ' establishment alone $est ms = %.3fx openssl speed, %.3fx paced' % ($all / (4 * f), $est / (4 * f), $est / (4 * $paced)))"
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg) $(date -u +%H:%M:%S)"
