//! The workflows: accounts, the operator's requests, users' payments (the cashier over the one payment workflow), the engine (chain watcher and round lifecycle), reading rounds back, the current-round cache, the live-update hub and readiness.
//!
//! Services own their store handle; the HTTP layer calls them and never the
//! store. The records a service returns are the domain's (the store decodes
//! its rows into them at its edge, as [`crate::domain::phase::RoundProof`]);
//! only [`StoreError`] is re-exported from the store.

pub mod accounts;
pub mod admin;
pub mod bump;
pub mod cashier;
pub mod current;
pub mod engine;
pub mod fanout;
pub mod health;
pub mod history;
pub mod leader;
pub mod limits;
pub mod payments;
pub mod stream;

pub use crate::store::StoreError;

/// `error: cause: cause …`, for errors that are logged or audited: each
/// layer's text once. Our errors print only their own layer and chain the
/// cause; a cause whose text its wrapper already ends with (a library error
/// that prints and chains the same error, such as sqlx's) is not repeated.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let cause = s.to_string();
        if !text.ends_with(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::error_chain;
    use crate::domain::spend::SpendFailure;
    use crate::security::password::HashError;
    use crate::service::engine::EngineError;
    use crate::StartupError;

    #[test]
    fn a_logged_chain_names_each_cause_once() {
        let e = EngineError::Spend(SpendFailure::Corrupt("row 7 has no txid".into()));
        let text = error_chain(&e);
        assert_eq!(text, "payout: corrupt ledger row: row 7 has no txid");
        assert_eq!(text.matches("row 7 has no txid").count(), 1);

        let e = StartupError::Hashing(HashError::Params("memory too small".into()));
        assert_eq!(
            error_chain(&e),
            "password hashing: invalid argon2 parameters: memory too small"
        );

        let e = StartupError::Bind {
            addr: "127.0.0.1:1".parse().unwrap(),
            source: std::io::Error::new(std::io::ErrorKind::AddrInUse, "address in use"),
        };
        assert_eq!(error_chain(&e), "bind 127.0.0.1:1: address in use");
    }

    #[test]
    fn a_library_error_that_prints_its_cause_is_not_repeated() {
        // sqlx prints and chains the same I/O error.
        let e = sqlx::Error::Io(std::io::Error::other("connection reset"));
        let text = error_chain(&e);
        assert_eq!(text.matches("connection reset").count(), 1, "{text}");
    }
}
