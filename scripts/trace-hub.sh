#!/usr/bin/env bash
# Where one sequential channel's time goes on the node under test (docs/benchmarks.md,
# "Node under test"): runs hub_bench with perf tracing the hub's system calls through its
# one-channel phase, then prints the flushes, the chain question's round trip and the time
# from each packet received to the hub's next hand-off (scripts/trace-pairs.py). The tracer
# slows every system call: read the durations, not the bench's line.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/hub-trace}
BIN=${POTLUCK_BIN:-target/release/potluck}
mkdir -p "$OUT"
command -v perf >/dev/null 2>&1 || { echo "perf is needed" >&2; exit 1; }
cargo build --release -q -p potluck
cargo build --release -q -p potluck-node --example hub_bench
POTLUCK_BIN=$BIN target/release/examples/hub_bench 100 300 > "$OUT/bench.txt" 2>&1 &
bench=$!
hub=""
for _ in $(seq 100); do
  hub=$(pgrep -n -f "$BIN node --listen" || true)
  [ -n "$hub" ] && break
  sleep 0.1
done
[ -n "$hub" ] || { echo "the hub did not start" >&2; kill "$bench"; exit 1; }
# The boot clock where perf takes it for these events, else the monotonic one (6.1 refuses
# the boot clock for tracepoints: "wrong clockid (7)"; it differs only by time suspended).
clock=boottime
perf record -q -k boottime -e raw_syscalls:sys_enter -o "$OUT/probe.data" -- true 2>/dev/null ||
  clock=monotonic
rm -f "$OUT/probe.data"
perf record -q -k "$clock" -e 'raw_syscalls:sys_enter,raw_syscalls:sys_exit' \
  -o "$OUT/perf.data" -p "$hub" 2>/dev/null &
perf_pid=$!
# The sequential phase comes first; the trace stops once the bench has printed its end.
PHASE="one channel, sequential"
for _ in $(seq 600); do
  grep -q "^$PHASE: boot clock" "$OUT/bench.txt" && break
  sleep 0.5
done
kill -INT "$perf_pid" 2>/dev/null || true
wait "$perf_pid" || true
wait "$bench"
tail -n 1 "$OUT/bench.txt"
window=$(sed -n "s/^$PHASE: boot clock \([0-9.]*\)\.\.\([0-9.]*\) s$/\1,\2/p" "$OUT/bench.txt")
[ -n "$window" ] || { echo "no '$PHASE' line in $OUT/bench.txt" >&2; exit 1; }
echo "$PHASE: system calls between boot-clock seconds $window"
perf script -i "$OUT/perf.data" --time "$window" -F tid,time,event,trace 2>/dev/null > "$OUT/trace.txt"
python3 scripts/trace-pairs.py "$OUT/trace.txt"
