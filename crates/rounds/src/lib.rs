//! The round-based custodial wallet HTTP service (seed 001): accounts, sessions, login throttle, registration quota, admin, audit, rounds and the live stream.
//!
//! Entry point: [`Application::build`] with a [`Config`], then
//! [`Application::run_until_stopped`].
//!
//! # The rule
//! Dependencies point one way: [`http`] → [`service`] → {[`store`],
//! [`domain`]}, with [`security`] beside the services (used by them and by
//! the HTTP extractors, never using either). A module never imports from a
//! layer above it, and `http` never reaches past the services: no handler or
//! extractor touches the store (its state holds services, not a database);
//! the plain records a service returns (store rows such as
//! [`service::history::RoundDetail`]) and [`service::StoreError`] are
//! re-exported by the service. The domain knows nothing of axum, sqlx or
//! tokio; the store knows nothing of HTTP; the services return their own
//! typed errors ([`service::accounts::AccountError`],
//! [`service::payments::PaymentError`], …) that `http/error.rs` maps to
//! status codes and error codes. [`app`] wires the layers together and is
//! the only module that sees them all. A test at the bottom of this file
//! checks the rule on the sources.
//!
//! # A short tour
//! - [`domain`]: `round` (the [`domain::round::RoundStatus`],
//!   [`domain::round::TransferKind`] and [`domain::round::TransferStatus`]
//!   states), `draw` (the provably fair draw as pure functions), `spend`
//!   (building and signing bets, withdrawals and payouts), `money` (the
//!   records they produce), `settings` (what an admin can change, and the
//!   typed diff the audit log keeps), `audit` (the typed details of audit
//!   entries), `address`, `time`.
//! - [`store`]: all SQL, one file per aggregate — `users`, `rounds`,
//!   `ledger` (outputs and transfers), `chain` (processed blocks, deposits,
//!   reorganisations), `settings` (config row and audit log), `idempotency` (the
//!   `Idempotency-Key`s of money requests), `migrations`.
//!   States are bound as their enums and parsed back at this edge.
//! - [`service`]: `accounts` (register, login, sessions, password changes
//!   and the admin reset, applying the throttle and the quota), `admin` (the
//!   config and its audited changes, pause, the audit log, the payout retry,
//!   the ledger totals), `cashier` (bets, withdrawals and the faucet as the
//!   HTTP layer calls them), `payments` (the one bet/withdraw workflow:
//!   select coins, sign, write the intent, broadcast, notify), `engine` (the
//!   chain watcher and the round lifecycle, one durable step at a time),
//!   `history` (rounds and transfers read back), `current` (the cached
//!   current round), `stream` (the live-update hub), `health` (readiness).
//! - [`security`]: `password` (Argon2 on the blocking pool), `token`
//!   (session tokens), `admin_key`, `throttle` (login), `quota` (registration).
//! - [`http`]: one file per resource — `accounts`, `rounds`, `wallet`,
//!   `admin`, `ops`, `dashboard` — plus `extract` (authentication
//!   extractors), `client_ip`, `error` (the error bodies, their typed
//!   `params`, and the mapping of service errors), `codes` (every error
//!   code), `views` (the typed JSON of rounds, draws, payouts and
//!   transfers), `state`, `metrics`, `qr`, and the router in `http/mod.rs`.
//! - [`app`]: [`Application`] (build, bind, serve, graceful shutdown);
//!   [`config`]: [`Config`]; [`server`]: the hyper-util server and its limits.

pub mod app;
pub mod config;
pub mod domain;
pub mod http;
pub mod security;
pub mod server;
pub mod service;
pub mod store;

pub use app::{Application, StartupError};
pub use config::{ChainSource, Config};

#[cfg(test)]
mod layering {
    //! The rule above, checked on the source: a module that breaks it fails here.

    use std::path::Path;

    fn sources(dir: &str) -> Vec<(String, String)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
        let mut files: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no sources under {}", root.display());
        files
            .into_iter()
            .map(|p| {
                (
                    p.display().to_string(),
                    std::fs::read_to_string(&p).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn http_never_reaches_the_store() {
        for (file, text) in sources("http") {
            for needle in [
                "crate::store",
                "super::store",
                ".store.",
                ".store)",
                "&state.store",
            ] {
                assert!(
                    !text.contains(needle),
                    "{file} uses the store (`{needle}`): go through a service"
                );
            }
        }
    }

    #[test]
    fn the_domain_knows_no_io() {
        for (file, text) in sources("domain") {
            for needle in [
                "axum::",
                "sqlx::",
                "tokio::",
                "crate::store",
                "crate::service",
                "crate::http",
            ] {
                assert!(
                    !text.contains(needle),
                    "{file} imports `{needle}`: the domain is pure"
                );
            }
        }
    }

    // That no error prints the cause it chains is checked for this crate and the node's
    // together: `crates/node/src/error_scan_tests.rs`.
}
