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

    /// Every Rust source under `src`, recursively.
    fn all_sources(dir: &Path, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                all_sources(&path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push((
                    path.display().to_string(),
                    std::fs::read_to_string(&path).unwrap(),
                ));
            }
        }
    }

    /// The error variants (`file:line`) whose message prints a field that
    /// is also their source, so that a logged chain reads `payout: X: X`.
    fn errors_that_print_their_source(file: &str, text: &str) -> Vec<String> {
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let mut found = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            if !line.starts_with("#[error(") || line.contains("transparent") {
                continue;
            }
            let mut j = i + 1;
            while j < lines.len() && (lines[j].starts_with("#[") || lines[j].starts_with("///")) {
                j += 1;
            }
            let Some(variant) = lines.get(j) else {
                continue;
            };
            let mut sources = Vec::new();
            if variant.contains("#[from]") || variant.contains("#[source]") {
                sources.push("0".to_string());
            }
            if variant.ends_with('{') {
                let mut marked = false;
                for field in &lines[j + 1..] {
                    if field.starts_with('}') {
                        break;
                    }
                    if field.starts_with("#[source]") || field.starts_with("#[from]") {
                        marked = true;
                        continue;
                    }
                    if field.starts_with("///") || field.starts_with("#[") {
                        continue;
                    }
                    if let Some((name, _)) = field.split_once(':') {
                        let name = name.trim_start_matches("pub ").trim();
                        if marked || name == "source" {
                            sources.push(name.to_string());
                        }
                        marked = false;
                    }
                }
            }
            if sources.iter().any(|f| line.contains(&format!("{{{f}}}"))) {
                found.push(format!("{file}:{}", i + 1));
            }
        }
        found
    }

    #[test]
    fn no_error_prints_the_cause_it_chains() {
        let mut files = Vec::new();
        all_sources(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        let found: Vec<String> = files
            .iter()
            .flat_map(|(file, text)| errors_that_print_their_source(file, text))
            .collect();
        assert!(
            found.is_empty(),
            "these errors print the cause they also chain (a logged chain says it twice): {found:?}"
        );
    }

    #[test]
    fn the_scan_finds_a_variant_that_prints_its_source() {
        let text = "#[error(\"payout: {0}\")]\n    Spend(#[from] X),\n\
                    #[error(\"bind {addr}: {source}\")]\n    Bind {\n        addr: A,\n        source: E,\n    },\n\
                    #[error(\"payout\")]\n    Ok(#[from] X),";
        assert_eq!(
            errors_that_print_their_source("f", text),
            vec!["f:1".to_string(), "f:3".to_string()]
        );
    }
}
