#!/usr/bin/env bash
# The rounds service's chaos tests for minutes instead of the CI run's 20 s:
# three clients bet and withdraw while `potluck serve` is SIGKILLed and
# restarted at random moments — once with the embedded development chain
# (killed with it every time), once with `potluck chain` as a separate
# process that is also SIGKILLed and restarted once. At the end no round is
# left half-way (closed or payout_failed), no round was paid twice, no
# transaction was recorded twice and the conservation check holds to the
# satoshi.
#   bash scripts/chaos.sh [SECONDS]   (default 180, per test)
set -euo pipefail
cd "$(dirname "$0")/.."
export POTLUCK_CHAOS_SECS="${1:-180}"
exec cargo nextest run -p potluck --features potluck/test-hooks --no-fail-fast \
  -E 'test(chaos_kills_keep_the_money_whole) | test(chaos_with_the_chain_restarted_keeps_the_money_whole)'
