//! The rounds service's black-box tests over HTTP: one test crate with a
//! module per subject (as zero2prod's `tests/api/main.rs`), so one binary to
//! link instead of one per file.
//!
//! A test runs the service in this process (`support::spawn_app`, port 0)
//! unless the `potluck serve` binary itself is what it tests. Those that
//! start the binary, and why:
//! - flags, defaults and exit codes: `accounts::unparseable_stored_hash_is_a_wrong_password`
//!   and `service::logs_to_a_file_are_plain_text_or_json` (the log it writes),
//!   `admin::admin_token_unset_or_empty_never_grants` (`--admin-token ""`),
//!   `service::defaults_hash_with_owasp_parameters` (the flags' defaults),
//!   `service::case_collisions_stop_the_start`,
//!   `service::a_seed_that_did_not_make_the_stored_addresses_stops_the_start`,
//!   `instances::a_second_process_with_other_secrets_refuses_to_start_on_an_empty_database`
//!   (refused start-ups), and in `hostile`: `short_jwt_secret_is_refused_and_files_are_private`
//!   (exit code, file modes, `--help`), `admin_token_guessing_is_throttled_and_short_tokens_refused`
//!   (exit code), `forwarded_for_only_from_trusted_proxies_and_ipv6_by_64` (the
//!   start-up warning), `hung_up_logins_start_no_extra_hashes` (the process's CPU time);
//! - signals: `stream::graceful_shutdown_closes_streams`,
//!   `hostile::slow_and_idle_connections_cannot_hold_the_server`,
//!   `service::sigterm_right_after_the_start_up_line_is_a_graceful_stop` (SIGTERM);
//! - SIGKILL at a crash point and the restart from disk: `money::crash_*`,
//!   `money::chaos_kills_keep_the_money_whole`, `bump_crash`, `rebroadcast`,
//!   `pipeline::chaos_with_the_chain_restarted_keeps_the_money_whole`;
//! - a restart of the embedded chain from its files: `pipeline::evicted_transactions_are_rebroadcast`,
//!   the three `pipeline` tests of the vanished deposit,
//!   `money::a_payment_written_while_the_chain_is_down_is_broadcast_later`;
//! - several processes on one database: `scale` (LISTEN/NOTIFY, the engine's
//!   advisory lock, SIGKILL of the leader, nginx in front),
//!   `money::two_processes_on_postgres_spend_once_and_pay_once`.
//!
//! `potluck chain` runs as a process where the chain must go away or lag
//! behind a proxy (`hostile::livez_and_healthz_name_what_failed`, `slow_chain`),
//! with the service in this process.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod accounts;
mod admin;
mod bump;
mod bump_crash;
mod dashboard;
mod hostile;
mod instances;
mod limits;
mod money;
mod pipeline;
mod rebroadcast;
mod scale;
mod service;
mod slow_chain;
mod stream;
