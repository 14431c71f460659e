# Sourced by the bench scripts (needs BIN, TMP, CONC, USERS and PIDS set):
# `start_serve PORT` starts `potluck serve` on 127.0.0.1:PORT with a fresh
# data directory, waits until it answers, and registers USERS accounts
# benchuser0.. (password benchmark-password) for scripts/bench/login.lua.
#
# The login throttle lets one username have at most 5 attempts in flight and
# one IP 20, answering the rest at once with 429: with a single user most
# concurrent logins would be refusals, not Argon2. So the logins go
# round-robin over USERS distinct accounts, and since every client is
# 127.0.0.1 the per-IP allowance (and the registration quota, to create the
# accounts) is raised above the benches' 32 connections.
start_serve() {
  local port=$1
  POTLUCK_LOG=warn $BIN serve --bind "127.0.0.1:$port" --data-dir "$TMP/data-$port" \
    --admin-token bench-admin-token-16 --hashing-concurrency "$CONC" \
    --login-ip-free-failures 64 --registration-quota "$USERS" \
    >/dev/null 2>"$TMP/serve-$port.log" &
  PIDS="${PIDS:-} $!"
  for _ in $(seq 100); do curl -sf "localhost:$port/livez" >/dev/null && break; sleep 0.1; done
  for i in $(seq 0 $((USERS - 1))); do
    curl -sf -XPOST "localhost:$port/auth/register" -H 'content-type: application/json' \
      -d "{\"username\":\"benchuser$i\",\"password\":\"benchmark-password\"}" >/dev/null
  done
  export BENCH_USERS=$USERS
}
