#!/usr/bin/env bash
# Where one sequential channel's time goes on the node under test (docs/benchmarks.md,
# "Node under test"): runs hub_bench with perf tracing the hub's system calls through its
# one-channel phase, then prints the flushes, the chain question's round trip and the time
# from each packet received to the hub's next hand-off (scripts/trace-pairs.py). The tracer
# slows every system call: read the durations, not the bench's line.
# TRACE=peers traces the bench's process instead (the peers' nodes) and prints its flushes
# by file: the one-channel peer's database is the file with most of them.
# POTLUCK_BIN and HUB_BENCH name other builds; see scripts/hub-common.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/hub-trace}
. scripts/hub-common.sh
start_hub_bench
target=$hub
[ "${TRACE:-hub}" = peers ] && target=$bench
clock=$(perf_clock -e raw_syscalls:sys_enter)
perf record -q -k "$clock" -e 'raw_syscalls:sys_enter,raw_syscalls:sys_exit' \
  -o "$OUT/perf.data" -p "$target" 2>/dev/null &
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
window=$(phase_window "$PHASE")
echo "$PHASE: system calls between boot-clock seconds $window (${TRACE:-hub})"
perf script -i "$OUT/perf.data" --time "$window" -F tid,time,event,trace 2>/dev/null > "$OUT/trace.txt"
if [ "${TRACE:-hub}" = peers ]; then
  python3 scripts/trace-pairs.py --flushes "$OUT/trace.txt"
else
  python3 scripts/trace-pairs.py "$OUT/trace.txt"
fi
