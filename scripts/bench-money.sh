#!/usr/bin/env bash
# Figures of docs/benchmarks.md "Money over HTTP: bets": bets per
# second accepted end to end over HTTP (each builds, signs, records and
# broadcasts a transaction) on SQLite and PostgreSQL, against the same
# build+sign+broadcast without HTTP and database measured in the same run,
# and the time from a mined draw block to a broadcast payout of a round with
# REPS x BETS bets. The bare baseline and the HTTP bets alternate REPS times
# in one process; the summary lines are medians (per-repetition lines above
# them). Needs PostgreSQL at $PG (a fresh database is created and dropped).
set -euo pipefail
cd "$(dirname "$0")/.."
BETS=${BETS:-1000}
CLIENTS=${CLIENTS:-8}
REPS=${REPS:-5}
PG=${PG:-postgres://postgres@127.0.0.1:5432}
cargo build --release -p potluck-rounds --example money_bench >/dev/null
EX=target/release/examples/money_bench
echo "== SQLite"
POTLUCK_LOG=warn $EX sqlite "$BETS" "$CLIENTS" "$REPS"
DB=potluck_money_bench_$$
psql "$PG/postgres" -qc "CREATE DATABASE $DB" >/dev/null
trap 'psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null' EXIT
echo "== PostgreSQL"
POTLUCK_LOG=warn $EX "$PG/$DB" "$BETS" "$CLIENTS" "$REPS"
