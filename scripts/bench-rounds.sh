#!/usr/bin/env bash
# Figures of docs/benchmarks.md "Rounds service: GET, logins, SSE": GET
# /rounds/current against a bare axum baseline, login throughput against raw
# Argon2 at the same hashing concurrency, GET p99 during a login flood, and
# SSE fan-out latency to 500 subscribers. Loopback only; needs `wrk`.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-10}
command -v wrk >/dev/null 2>&1 || apt-get install -y wrk >/dev/null
cargo build --release -p potluck -p potluck-rounds --examples --bins >/dev/null
BIN=target/release/potluck
EX=target/release/examples
TMP=$(mktemp -d)
cleanup() { for p in ${PIDS:-}; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT
CONC=$(nproc)

$EX/bare_round 127.0.0.1:18081 >/dev/null & PIDS="$!"
# Logins go round-robin over USERS accounts (scripts/bench/serve.sh says why).
USERS=${USERS:-32}
. scripts/bench/serve.sh
start_serve 18080

echo "== 1. GET /rounds/current, 64 connections, ${DUR}s (bare axum baseline, then the service)"
wrk -t2 -c64 -d"${DUR}s" --latency http://127.0.0.1:18081/rounds/current
wrk -t2 -c64 -d"${DUR}s" --latency http://127.0.0.1:18080/rounds/current

echo "== 2. raw Argon2id (OWASP) on $CONC threads vs POST /auth/login (hashing concurrency $CONC), alternated ${LOGIN_ROUNDS:-2} times"
# Two raw baselines: `fresh` (the crate's verify_password, a new 19 MiB
# array per verification; the figure of earlier sessions) and `reused` (one
# array per thread, as the service's hashing threads keep): the honest bound.
for _ in $(seq "${LOGIN_ROUNDS:-2}"); do
  $EX/argon2_raw "$CONC" "$DUR" fresh
  $EX/argon2_raw "$CONC" "$DUR" reused
  # 8 clients over $USERS users: every login is a correct-password Argon2 verification, none a 429.
  wrk -t1 -c8 -d"${DUR}s" --latency -s scripts/bench/login.lua http://127.0.0.1:18080/auth/login
done

echo "== 3. GET /rounds/current p99 (4 connections) while a login flood (32 connections) saturates hashing"
wrk -t1 -c32 -d"$((DUR + 4))s" -s scripts/bench/login.lua http://127.0.0.1:18080/auth/login >"$TMP/flood.txt" &
FLOOD=$!
sleep 2
wrk -t1 -c4 -d"${DUR}s" --latency http://127.0.0.1:18080/rounds/current
wait "$FLOOD"
grep -E "Requests/sec|Non-2xx" "$TMP/flood.txt" | sed 's/^/login flood: /'

echo "== 4. SSE fan-out: 500 subscribers, 20 publishes"
$EX/sse_fanout 127.0.0.1:18080 bench-admin-token-16 500 20
