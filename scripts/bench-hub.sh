#!/usr/bin/env bash
# Figures of docs/benchmarks.md "Node under test": the release `potluck node`
# as its own process (the hub), CHANNELS peers in the bench's process, each
# paying the hub PAIRS times; prints the hub's CPU, context switches and
# system calls per completed pair beside its side of the state machines in
# memory, and ends with one line a script can read ("node under test: ...").
# perf's syscall tracepoints count the calls (strace -c where perf has none).
set -euo pipefail
ulimit -n 65536 2>/dev/null || true
cd "$(dirname "$0")/.."
CHANNELS=${CHANNELS:-100}
PAIRS=${PAIRS:-300}
command -v perf >/dev/null 2>&1 || command -v strace >/dev/null 2>&1 ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends strace >/dev/null
cargo build --release -q -p potluck
POTLUCK_BIN=target/release/potluck cargo run --release -q -p potluck-node --example hub_bench -- "$CHANNELS" "$PAIRS"
