//! The JSON-RPC error codes, defined once: the protocol's own for the request, and one per
//! failure kind of a call ([`crate::control_error::codes`]); all listed in docs/node.md.

use crate::control_error::ControlError;
use crate::error_report::Causes;

/// The request itself was wrong (JSON-RPC 2.0's reserved codes).
pub(crate) mod codes {
    /// The body is not JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// The body is not a request (no method).
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// A parameter is missing or wrong.
    pub const INVALID_PARAMS: i64 = -32602;
    pub use crate::control_error::codes::{CHAIN_ERROR, DATABASE_ERROR, NOT_CONNECTED};
}

/// A method's failure: a code and a message for the caller.
#[derive(Debug)]
pub(crate) struct RpcFailure {
    pub(crate) code: i64,
    pub(crate) message: String,
}

impl RpcFailure {
    pub(crate) fn new(code: i64, message: impl Into<String>) -> Self {
        RpcFailure {
            code,
            message: message.into(),
        }
    }

    /// A parameter is missing or wrong.
    pub(crate) fn params(message: impl Into<String>) -> Self {
        RpcFailure::new(codes::INVALID_PARAMS, message)
    }
}

/// The message tells the caller the whole story: the error and its causes.
impl From<ControlError> for RpcFailure {
    fn from(e: ControlError) -> Self {
        RpcFailure::new(e.code(), Causes(&e).to_string())
    }
}

impl From<crate::store::StoreError> for RpcFailure {
    fn from(e: crate::store::StoreError) -> Self {
        RpcFailure::new(codes::DATABASE_ERROR, Causes(&e).to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::manager::ExecError;
    use crate::store::{ChannelId, StoreError};

    fn bad_json() -> serde_json::Error {
        serde_json::from_str::<serde_json::Value>("{x").unwrap_err()
    }

    /// What a control client reads did not change when the errors stopped printing the
    /// cause they chain: each message is the one the API sent before.
    #[test]
    fn client_messages_keep_their_text() {
        let row = "no rows returned by a query that expected to return at least one row";
        let cases: Vec<(ControlError, String)> = vec![
            (
                ControlError::Chain(chain::ChainError::Unavailable("refused".into())),
                "chain: chain unavailable: refused".into(),
            ),
            (
                ControlError::Wallet(wallet::WalletError::SeedLength(3)),
                "wallet: invalid seed length 3 bytes (BIP32 wants 16 to 64)".into(),
            ),
            (
                ControlError::Funding(wallet::SpendError::Build(wallet::BuildError::NoInputs)),
                "cannot fund the anchor: no inputs to spend".into(),
            ),
            (
                ControlError::Store(StoreError::Sql(sqlx::Error::RowNotFound)),
                format!("database: {row}"),
            ),
            (
                ControlError::Exec(ExecError::Store(StoreError::Sql(sqlx::Error::RowNotFound))),
                format!("database: {row}"),
            ),
            (
                ControlError::Store(StoreError::Write(Arc::new(sqlx::Error::PoolClosed))),
                "database write: attempted to acquire a connection on a closed pool".into(),
            ),
            (
                ControlError::Store(StoreError::Migrate(
                    sqlx::migrate::MigrateError::VersionMissing(3),
                )),
                "database schema: migration 3 was previously applied but is missing in the resolved migrations".into(),
            ),
            (
                ControlError::Store(crate::store::decode_snapshot(ChannelId(4), b"{x").err().unwrap()),
                format!("stored channel 4 is corrupt: {}", bad_json()),
            ),
            (
                ControlError::Store(
                    crate::store::decode_snapshot(ChannelId(4), br#"{"state":"Normal","config":{}}"#)
                        .err()
                        .unwrap(),
                ),
                "stored channel 4 is corrupt: snapshot version 0: missing field `delay`".into(),
            ),
            (
                ControlError::Timeout("the peer's answer"),
                "timed out waiting for the peer's answer".into(),
            ),
        ];
        for (error, expected) in cases {
            let failure = RpcFailure::from(error);
            assert_eq!(failure.message, expected);
        }
        let failure = RpcFailure::from(StoreError::Sql(sqlx::Error::RowNotFound));
        assert_eq!(
            (failure.code, failure.message),
            (codes::DATABASE_ERROR, format!("database: {row}"))
        );
    }
}
