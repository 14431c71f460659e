#!/usr/bin/env bash
# Figures of docs/benchmarks.md "Scale-out across processes": SSE fan-out across
# two `serve` processes on one PostgreSQL database (SUBS subscribers on each,
# every change made through B, latency to A's subscribers = cross-process,
# to B's = same process), and GET /rounds/current through nginx (the shipped
# deploy/nginx/potluck.conf) against direct, same run. Loopback only; needs
# PostgreSQL at $PG (default postgres://postgres@127.0.0.1:5432), wrk, nginx.
set -euo pipefail
# 2 x SUBS client sockets, as many server-side, and nginx's.
ulimit -n 65536 2>/dev/null || true
cd "$(dirname "$0")/.."
PG=${PG:-postgres://postgres@127.0.0.1:5432}
SUBS=${SUBS:-500}
PUBLISHES=${PUBLISHES:-20}
DUR=${DUR:-10}
command -v wrk >/dev/null 2>&1 || apt-get install -y wrk >/dev/null
NGINX=$(command -v nginx || ls /usr/sbin/nginx 2>/dev/null || true)
if [ -z "$NGINX" ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx-light >/dev/null
  NGINX=/usr/sbin/nginx
fi
cargo build --release -p potluck -p potluck-rounds --examples --bins >/dev/null
BIN=target/release/potluck
EX=target/release/examples
TMP=$(mktemp -d)
DB=potluck_bench_scale_$$
cleanup() {
  for p in ${PIDS:-}; do kill "$p" 2>/dev/null || true; done
  sleep 1
  psql -q "$PG/postgres" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$TMP"
}
trap cleanup EXIT
psql -q "$PG/postgres" -c "CREATE DATABASE $DB" >/dev/null

# A standalone development chain, so both processes are plain Bitcoin Core clients.
$BIN chain --rpc-bind 127.0.0.1:0 --block-interval 0 --data-dir "$TMP/chain" >"$TMP/chain.out" 2>/dev/null & PIDS="$!"
for _ in $(seq 100); do grep -q "JSON-RPC on" "$TMP/chain.out" && break; sleep 0.1; done
CHAIN_URL=$(sed -n 's/.*JSON-RPC on \(.*\)$/\1/p' "$TMP/chain.out" | head -1 | tr -d ' ')
TOKEN=bench-admin-token-16
serve() { # name port
  mkdir -p "$TMP/$1"
  [ "$1" = a ] || cp "$TMP/a/wallet.mnemonic" "$TMP/a/jwt-secret" "$TMP/$1/"
  POTLUCK_LOG=warn $BIN serve --bind "127.0.0.1:$2" --data-dir "$TMP/$1" --admin-token $TOKEN \
    --database-url "$PG/$DB" --bitcoind-url "$CHAIN_URL" --bitcoind-cookie "$TMP/chain/.cookie" \
    --round-duration-seconds 3600 >/dev/null 2>"$TMP/$1.log" & PIDS="$PIDS $!"
  for _ in $(seq 200); do curl -sf "localhost:$2/livez" >/dev/null && break; sleep 0.1; done
}
serve a 18090
serve b 18091

# nginx with the shipped config, upstreams and listen port pointed here.
mkdir -p "$TMP/nginx"
sed -e '/server 127.0.0.1:808/d' -e '/listen \[::\]:80/d' \
    -e 's/^\( *\)listen 80;/\1listen 127.0.0.1:18092;/' \
    -e 's/^\( *\)least_conn;/&\n\1server 127.0.0.1:18090;\n\1server 127.0.0.1:18091;/' \
    deploy/nginx/potluck.conf >"$TMP/nginx/potluck.conf"
cat >"$TMP/nginx/nginx.conf" <<NGX
daemon off;
master_process off;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $TMP/nginx/body;
  proxy_temp_path $TMP/nginx/proxy;
  include $TMP/nginx/potluck.conf;
}
NGX
"$NGINX" -c "$TMP/nginx/nginx.conf" & PIDS="$PIDS $!"
for _ in $(seq 100); do curl -sf localhost:18092/livez >/dev/null && break; sleep 0.1; done

echo "== 1. SSE fan-out: $SUBS subscribers on each of A and B, $PUBLISHES changes made through B"
$EX/sse_fanout 127.0.0.1:18090,127.0.0.1:18091 $TOKEN "$SUBS" "$PUBLISHES" 127.0.0.1:18091

echo "== 2. GET /rounds/current, 64 connections, ${DUR}s: direct to A, then through nginx (A and B)"
wrk -t2 -c64 -d"${DUR}s" --latency http://127.0.0.1:18090/rounds/current
wrk -t2 -c64 -d"${DUR}s" --latency http://127.0.0.1:18092/rounds/current
