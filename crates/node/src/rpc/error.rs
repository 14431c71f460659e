//! The JSON-RPC error codes, defined once: the protocol's own for the request, and one per
//! failure kind of a call ([`crate::control_error::codes`]); all listed in docs/node.md.

use crate::control_error::ControlError;

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

impl From<ControlError> for RpcFailure {
    fn from(e: ControlError) -> Self {
        RpcFailure::new(e.code(), e.to_string())
    }
}

impl From<crate::store::StoreError> for RpcFailure {
    fn from(e: crate::store::StoreError) -> Self {
        RpcFailure::new(codes::DATABASE_ERROR, e.to_string())
    }
}
