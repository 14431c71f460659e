#!/usr/bin/env bash
# The rounds service's chaos test for minutes instead of the CI run's 20 s:
# three clients bet and withdraw while `potluck serve` (and its embedded
# development chain) is SIGKILLed and restarted at random moments; at the
# end no round is left half-way, no round was paid twice, no transaction was
# recorded twice and the conservation check holds to the satoshi.
#   bash scripts/chaos.sh [SECONDS]   (default 180)
set -euo pipefail
cd "$(dirname "$0")/.."
export POTLUCK_CHAOS_SECS="${1:-180}"
exec cargo nextest run -p potluck --test money --features potluck/test-hooks \
  --no-fail-fast chaos_kills_keep_the_money_whole
