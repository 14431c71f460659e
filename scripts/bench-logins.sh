#!/usr/bin/env bash
# Logins over HTTP against raw Argon2id at the same hashing concurrency (issue
# 17), alternated ROUNDS times in short runs, with the median of each and of
# the per-round ratios. One pair of 10-second runs swung by 1.5x on a shared
# 2-core machine; several short alternations, each ratio taken from runs a few
# seconds apart, tell a trend from noise. Loopback only; needs `wrk`.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-5}
ROUNDS=${ROUNDS:-5}
USERS=${USERS:-32}
command -v wrk >/dev/null 2>&1 || apt-get install -y wrk >/dev/null
cargo build --release -p potluck -p potluck-rounds --example argon2_raw --bins >/dev/null
BIN=target/release/potluck
EX=target/release/examples
TMP=$(mktemp -d)
cleanup() { for p in ${PIDS:-}; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT
CONC=$(nproc)

# Logins round-robin over USERS accounts (scripts/bench/serve.sh).
. scripts/bench/serve.sh
start_serve 18090

echo "== raw Argon2id (reused memory, $CONC threads) vs POST /auth/login (hashing concurrency $CONC), ${ROUNDS} x ${DUR}s each"
: >"$TMP/rows"
for r in $(seq "$ROUNDS"); do
  raw=$($EX/argon2_raw "$CONC" "$DUR" reused | sed -E 's/.*= ([0-9.]+)\/s.*/\1/')
  wrk -t1 -c8 -d"${DUR}s" -s scripts/bench/login.lua http://127.0.0.1:18090/auth/login >"$TMP/wrk.txt"
  http=$(awk '/Requests\/sec/ {print $2}' "$TMP/wrk.txt")
  if grep -q "Non-2xx" "$TMP/wrk.txt"; then
    echo "round $r: some logins were refused:"; cat "$TMP/wrk.txt"; exit 1
  fi
  echo "$raw $http" >>"$TMP/rows"
  echo "round $r: raw $raw/s, logins $http/s, ratio $(awk -v a="$http" -v b="$raw" 'BEGIN {printf "%.2f", a / b}')"
done
python3 - "$TMP/rows" <<'EOF'
import statistics, sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
raw = [r for r, _ in rows]
http = [h for _, h in rows]
ratios = [h / r for r, h in rows]
print(f"median raw {statistics.median(raw):.1f}/s, median logins {statistics.median(http):.1f}/s, "
      f"ratio of medians {statistics.median(http) / statistics.median(raw):.2f}, "
      f"median of per-round ratios {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})")
EOF
