# Shared by bench/sessions_floor.sh and bench/session_table.sh (sourced):
# a server configuration with trust and admission out of the way, starting
# and stopping one `uascale serve` pinned to core 0, and the OpenSSL floor.

# Prints a server configuration on PORT (and max_session_count MAX, default
# the server's) that trusts every client certificate and raises the
# admission rates, so that no busy answer or trust step is measured.
relaxed_config() {
  local port=$1 max=${2:-}
  echo "[server]"
  echo "port = $port"
  [ -n "$max" ] && echo "max_session_count = $max"
  cat <<EOT
[security]
pki_dir = "pki"
trust_all_client_certificates = true
[admission]
connections_per_second = 100000
connection_burst = 100000
connections_per_second_per_address = 100000
connection_burst_per_address = 100000
max_concurrent_handshakes = 64
max_unfinished_handshakes_per_address = 20000
EOT
  [ -n "$max" ] && echo "max_channel_count = $max"
  return 0
}

SERVER=
# Starts `BIN serve --config CONFIG ARGS...` on core 0, its log in LOG;
# returns once it listens (at most 5 s). Its PID is in SERVER.
start_server() {
  local config=$1 log=$2
  shift 2
  taskset -c 0 "$BIN" serve --config "$config" "$@" > "$log" 2>&1 &
  SERVER=$!
  for _ in $(seq 50); do
    grep -q "listening" "$log" 2>/dev/null && break
    sleep 0.1
  done
}

# Stops the server start_server started (also on exit: trap stop EXIT).
stop() {
  if [ -n "$SERVER" ]; then
    kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
  fi
  SERVER=
}

# `openssl speed -seconds 2 ALGORITHMS...` on core 0, the result lines only.
floor() {
  taskset -c 0 openssl speed -seconds 2 "$@" 2>/dev/null \
    | grep -E "^rsa 2048|256 bits ecdsa|256 bits ecdh"
}
