#!/usr/bin/env bash
# Runs the README's node walk-through and every test of the workspace. Works
# on a fresh machine: installs the test runner if it is missing and makes sure
# PostgreSQL (for the store's tests) is up.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo-nextest >/dev/null 2>&1; then
  cargo install cargo-nextest --locked
fi

# The store's tests run against PostgreSQL on 127.0.0.1:5432 (trust auth,
# database `test`) as well as SQLite.
if command -v pg_isready >/dev/null 2>&1 && ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  if command -v pg_ctlcluster >/dev/null 2>&1; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  fi
fi

# The dashboard's browser tests need chromium, chromedriver and zbarimg.
bash scripts/install-browser.sh

# The black-box tests drive test-only seams (crash points for the SIGKILL
# tests, a cheating node): they are compiled in only with the `test-hooks`
# feature, never into the release binary (`cargo run --release -- serve`).
cargo nextest run --workspace --features potluck/test-hooks --no-run

# The README's node walk-through, run and checked on the debug binary that the
# tests use (built just above; the README itself says `cargo run --release`).
POTLUCK=target/debug/potluck bash scripts/demo-channel.sh

# Doc tests first so that the run ends on nextest's summary line.
cargo test --workspace --doc --quiet
cargo nextest run --workspace --no-fail-fast --features potluck/test-hooks "$@"
