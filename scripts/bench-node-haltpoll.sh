#!/usr/bin/env bash
# The node's figures with the guest's halt-polling off (as shipped) and on,
# alternated in one session (docs/benchmarks.md, "Node"). It writes
# /sys/module/haltpoll/parameters/guest_halt_poll_ns (root, a KVM/Firecracker
# guest with the haltpoll cpuidle driver) and puts the old value back on exit.
# Usage: RUNS=2 POLL_NS=200000 bash scripts/bench-node-haltpoll.sh [CHANNELS PAIRS]
set -euo pipefail
cd "$(dirname "$0")/.."
knob=/sys/module/haltpoll/parameters/guest_halt_poll_ns
if [ ! -w "$knob" ]; then
  echo "needs write access to $knob (root, haltpoll cpuidle driver)" >&2
  exit 1
fi
runs=${RUNS:-2}
poll=${POLL_NS:-200000}
old=$(cat "$knob")
trap 'echo "$old" > "$knob"' EXIT
cargo build --release -q -p potluck-node --example node_bench
for i in $(seq 1 "$runs"); do
  for v in 0 "$poll"; do
    echo "$v" > "$knob"
    echo "== run $i, guest_halt_poll_ns $v, $(date -u +%T)"
    target/release/examples/node_bench "${1:-100}" "${2:-300}" 2>&1 |
      grep -E 'idle vCPUs|in-memory time|fsync latency|control call|packet \(v3|achieved:|^HTLC|^steady|CPU time per pair'
  done
done
