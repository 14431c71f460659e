#!/usr/bin/env bash
# Two builds of the service alternated on GET /rounds/current (docs/benchmarks.md,
# "Rounds service"): A_BIN and B_BIN name each side's `potluck`; RUNS rounds, A first.
# Each round and side starts a fresh `potluck serve`, runs wrk (64 connections, DUR
# seconds) on the bare axum baseline (`bare_round`) and right after on the service, and
# prints both rates, both p99s and their ratio; then each side's median ratio. The
# baseline is measured beside each service run because the host's speed drifts more
# between runs than the two builds differ.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
DUR=${DUR:-8}
command -v wrk >/dev/null 2>&1 || apt-get install -y wrk >/dev/null
cargo build --release -q -p potluck-rounds --example bare_round
TMP=$(mktemp -d)
cleanup() { for p in ${PIDS:-}; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT
CONC=$(nproc) USERS=1
target/release/examples/bare_round 127.0.0.1:18081 >/dev/null & PIDS="$!"
. scripts/bench/serve.sh
# "<req/s> <p99>" of one wrk run against port $1.
get() {
  wrk -t2 -c64 -d"${DUR}s" --latency "http://127.0.0.1:$1/rounds/current" |
    awk '/Requests\/sec/ {r = $2} / 99%/ {p = $2} END {print r, p}'
}
for run in $(seq "$RUNS"); do
  for side in A B; do
    bin=${side}_BIN
    BIN=${!bin}
    start_serve 18080
    read -r bare bare_p99 < <(get 18081)
    read -r served served_p99 < <(get 18080)
    kill "${PIDS##* }" && wait "${PIDS##* }" 2>/dev/null || true
    PIDS=${PIDS% *}
    rm -rf "$TMP/data-18080"
    ratio=$(python3 -c "print(f'{$served / $bare:.2f}')")
    echo "$side $run: bare $bare req/s p99 $bare_p99; service $served req/s p99 $served_p99; ratio $ratio"
    echo "$ratio" >> "$TMP/$side"
  done
done
for side in A B; do
  python3 -c "import statistics,sys; r=[float(l) for l in open(sys.argv[1])]; print(f'$side: median ratio {statistics.median(r):.2f} over {len(r)} runs')" "$TMP/$side"
done
