#!/usr/bin/env bash
# Where the node under test's CPU goes (docs/benchmarks.md, "Node under test"):
# runs hub_bench with perf recording the hub (the release `potluck node`) from
# its start to its end, then groups the samples (scripts/perf-groups.py).
# Needs perf; perf's own overhead raises the bench's figures while it records,
# so read the shares, not the bench's line. POTLUCK_BIN names another hub binary
# (an older commit's, to compare); see scripts/hub-common.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/hub-profile}
. scripts/hub-common.sh
start_hub_bench
# perf stops by itself when the hub exits at the bench's end.
clock=$(perf_clock)
perf record -q -k "$clock" -F 1999 --call-graph dwarf,8192 -o "$OUT/perf.data" -p "$hub" 2>/dev/null || true
wait "$bench"
tail -n 1 "$OUT/bench.txt"
# The busy phase alone (PHASE="one channel, sequential" for the other one).
PHASE=${PHASE:-busy phase}
window=$(phase_window "$PHASE")
echo "$PHASE: samples between boot-clock seconds $window"
perf script -i "$OUT/perf.data" --time "$window" -F comm,tid,ip,sym 2>/dev/null > "$OUT/perf.txt"
python3 scripts/perf-groups.py "$OUT/perf.txt"
