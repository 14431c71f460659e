# Sourced by scripts/profile-hub.sh and scripts/trace-hub.sh: the part both share.
# start_hub_bench builds this tree's release `potluck` and hub_bench, starts hub_bench
# (CHANNELS peers paying the hub PAIRS times) with its output in $OUT/bench.txt, and sets
# $bench and $hub to the pids of the bench's process and of the hub, `potluck node`.
# POTLUCK_BIN names another hub binary, HUB_BENCH another hub_bench (an older commit's,
# to compare: the bench links the peers' node).
CHANNELS=${CHANNELS:-100}
PAIRS=${PAIRS:-300}
BIN=${POTLUCK_BIN:-target/release/potluck}
BENCH=${HUB_BENCH:-target/release/examples/hub_bench}

start_hub_bench() {
  mkdir -p "$OUT"
  command -v perf >/dev/null 2>&1 || { echo "perf is needed" >&2; exit 1; }
  # Two builds: with `--example`, cargo would build the example alone, not the binary.
  cargo build --release -q -p potluck
  cargo build --release -q -p potluck-node --example hub_bench
  POTLUCK_BIN=$BIN "$BENCH" "$CHANNELS" "$PAIRS" > "$OUT/bench.txt" 2>&1 &
  bench=$!
  hub=""
  for _ in $(seq 100); do
    hub=$(pgrep -n -f "$BIN node --listen" || true)
    [ -n "$hub" ] && break
    sleep 0.1
  done
  [ -n "$hub" ] || { echo "the hub did not start" >&2; kill "$bench"; exit 1; }
}

# The clock perf records with for the events in "$@": the boot clock, which hub_bench
# prints at each phase's ends, else the monotonic one (6.1 refuses the boot clock for
# tracepoints: "wrong clockid (7)"; the two differ only by time spent suspended).
perf_clock() {
  if perf record -q -k boottime "$@" -o "$OUT/probe.data" -- true 2>/dev/null; then
    echo boottime
  else
    echo monotonic
  fi
  rm -f "$OUT/probe.data"
}

# The boot-clock window "FROM,TO" of hub_bench's phase $1, from its output.
phase_window() {
  local window
  window=$(sed -n "s/^$1: boot clock \([0-9.]*\)\.\.\([0-9.]*\) s$/\1,\2/p" "$OUT/bench.txt")
  [ -n "$window" ] || { echo "no '$1' line in $OUT/bench.txt" >&2; exit 1; }
  echo "$window"
}
