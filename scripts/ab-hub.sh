#!/usr/bin/env bash
# Two builds of the node alternated on hub_bench (docs/benchmarks.md, "Node under test"):
# A_BIN/A_BENCH and B_BIN/B_BENCH name each side's `potluck` and hub_bench (the bench links
# the peers' node, so a change to the node wants both); RUNS pairs of runs, A first. Prints
# each run's last line, then per side the median over all its runs' rounds of one channel
# against each bound (the per-run medians hide how far a run's rounds spread): the built
# bound (where the bench prints it), the summed one and the summed one with in-place writes.
set -euo pipefail
cd "$(dirname "$0")/.."
ulimit -n 65536 2>/dev/null || true
RUNS=${RUNS:-3}
CHANNELS=${CHANNELS:-100}
PAIRS=${PAIRS:-300}
OUT=${OUT:-target/hub-ab}
mkdir -p "$OUT"
for i in $(seq "$RUNS"); do
  for side in A B; do
    bin=${side}_BIN bench=${side}_BENCH
    POTLUCK_BIN=${!bin} "${!bench}" "$CHANNELS" "$PAIRS" > "$OUT/$side-$i.txt" 2>&1
    echo "$side $i: $(tail -n 1 "$OUT/$side-$i.txt")"
  done
done
python3 - "$OUT" <<'PY'
import glob, re, statistics, sys
for side in "AB":
    grown, in_place, built = [], [], []
    for path in glob.glob(f"{sys.argv[1]}/{side}-*.txt"):
        text = open(path).read()
        rounds = re.search(r"alternated with its bound: (.*) = median", text).group(1)
        grown += [int(a) / int(b) for a, b in re.findall(r"(\d+)/(\d+) pairs/s", rounds)]
        wrapped = re.search(r"in-place write instead: (.*) = median", text).group(1)
        in_place += [int(r) / 100 for r in re.findall(r"(\d+)%", wrapped)]
        # Older builds of the bench printed no built bound.
        skeleton = re.search(r"against the built bound \(.*?\): (.*) = median", text)
        if skeleton:
            built += [int(r) / 100 for r in re.findall(r"(\d+)%", skeleton.group(1))]
    against_built = f"{100 * statistics.median(built):.1f}% of the built bound, " if built else ""
    print(f"{side}: one channel, median of {len(grown)} rounds: {against_built}"
          f"{100 * statistics.median(grown):.1f}% of the summed bound, "
          f"{100 * statistics.median(in_place):.1f}% with in-place writes")
PY
