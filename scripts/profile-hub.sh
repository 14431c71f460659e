#!/usr/bin/env bash
# Where the node under test's CPU goes (docs/benchmarks.md, "Node under test"):
# runs hub_bench with perf recording the hub (the release `potluck node`) from
# its start to its end, then groups the samples (scripts/perf-groups.py).
# Needs perf; perf's own overhead raises the bench's figures while it records,
# so read the shares, not the bench's line.
set -euo pipefail
cd "$(dirname "$0")/.."
CHANNELS=${CHANNELS:-100}
PAIRS=${PAIRS:-300}
OUT=${OUT:-target/hub-profile}
# The hub's binary: this tree's release build unless POTLUCK_BIN names another
# (an older commit's, to compare).
BIN=${POTLUCK_BIN:-target/release/potluck}
mkdir -p "$OUT"
command -v perf >/dev/null 2>&1 || { echo "perf is needed" >&2; exit 1; }
# Two builds: with `--example`, cargo would build the example alone, not the binary.
cargo build --release -q -p potluck
cargo build --release -q -p potluck-node --example hub_bench
POTLUCK_BIN=$BIN target/release/examples/hub_bench "$CHANNELS" "$PAIRS" \
  > "$OUT/bench.txt" 2>&1 &
bench=$!
hub=""
for _ in $(seq 100); do
  hub=$(pgrep -n -f "$BIN node --listen" || true)
  [ -n "$hub" ] && break
  sleep 0.1
done
[ -n "$hub" ] || { echo "the hub did not start" >&2; kill "$bench"; exit 1; }
# perf stops by itself when the hub exits at the bench's end. Its samples carry
# the boot clock, which the bench prints at each phase's ends.
# A perf that refuses the boot clock for this event ("wrong clockid (7)", seen
# on 6.1 for tracepoints) gets the monotonic one, which differs from it only by
# time spent suspended.
clock=boottime
perf record -q -k boottime -o "$OUT/probe.data" -- true 2>/dev/null || clock=monotonic
rm -f "$OUT/probe.data"
perf record -q -k "$clock" -F 1999 --call-graph dwarf,8192 -o "$OUT/perf.data" -p "$hub" 2>/dev/null || true
wait "$bench"
tail -n 1 "$OUT/bench.txt"
# The busy phase alone (PHASE="one channel, sequential" for the other one).
PHASE=${PHASE:-busy phase}
window=$(sed -n "s/^$PHASE: boot clock \([0-9.]*\)\.\.\([0-9.]*\) s$/\1,\2/p" "$OUT/bench.txt")
[ -n "$window" ] || { echo "no '$PHASE' line in $OUT/bench.txt" >&2; exit 1; }
echo "$PHASE: samples between boot-clock seconds $window"
perf script -i "$OUT/perf.data" --time "$window" -F comm,tid,ip,sym 2>/dev/null > "$OUT/perf.txt"
python3 scripts/perf-groups.py "$OUT/perf.txt"
