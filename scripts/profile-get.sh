#!/usr/bin/env bash
# Where `potluck serve` spends its CPU under a GET /rounds/current flood (docs/rounds-api.md,
# "Performance notes"): wrk at 64 connections, perf samples of the service for 8 s of it,
# then the hottest functions over all its threads. POTLUCK_BIN names another binary.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk >/dev/null 2>&1 || apt-get install -y wrk >/dev/null
command -v perf >/dev/null 2>&1 || apt-get install -y linux-perf >/dev/null
if [ -z "${POTLUCK_BIN:-}" ]; then cargo build --release -q -p potluck; fi
BIN=${POTLUCK_BIN:-target/release/potluck}
TMP=$(mktemp -d)
cleanup() { for p in ${PIDS:-}; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT
CONC=$(nproc) USERS=1
. scripts/bench/serve.sh
start_serve 18080
# A warm-up, then the flood the samples are taken of.
wrk -t2 -c64 -d4s http://127.0.0.1:18080/rounds/current >/dev/null
wrk -t2 -c64 -d12s http://127.0.0.1:18080/rounds/current > "$TMP/wrk.txt" &
flood=$!
sleep 2
perf record -q -F 999 -p "${PIDS##* }" -o "$TMP/perf.data" -- sleep 8 >/dev/null 2>&1
wait "$flood"
grep Requests/sec "$TMP/wrk.txt"
perf report -i "$TMP/perf.data" --no-children --no-inline --sort dso,symbol --stdio 2>/dev/null |
  grep -E '^ +[0-9]' | cut -c1-160 | head -"${TOP:-25}"
