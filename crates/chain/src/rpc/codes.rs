//! Bitcoin Core's JSON-RPC error codes (`src/rpc/protocol.h`), used by the
//! development chain's server and understood by the client.

/// Standard JSON-RPC 2.0: invalid request object.
pub const RPC_INVALID_REQUEST: i32 = -32600;
/// Standard JSON-RPC 2.0: method not found.
pub const RPC_METHOD_NOT_FOUND: i32 = -32601;
/// Standard JSON-RPC 2.0: invalid parameters.
pub const RPC_INVALID_PARAMS: i32 = -32602;
/// Standard JSON-RPC 2.0: parse error.
pub const RPC_PARSE_ERROR: i32 = -32700;
/// Exception thrown in command handling.
pub const RPC_MISC_ERROR: i32 = -1;
/// Unexpected type was passed as parameter.
pub const RPC_TYPE_ERROR: i32 = -3;
/// Invalid address or key (also: block or transaction not found).
pub const RPC_INVALID_ADDRESS_OR_KEY: i32 = -5;
/// Not enough funds in wallet or account.
pub const RPC_WALLET_INSUFFICIENT_FUNDS: i32 = -6;
/// Invalid, missing or duplicate parameter.
pub const RPC_INVALID_PARAMETER: i32 = -8;
/// Database error.
pub const RPC_DATABASE_ERROR: i32 = -20;
/// Error parsing or validating structure in raw format.
pub const RPC_DESERIALIZATION_ERROR: i32 = -22;
/// General error during transaction or block submission.
pub const RPC_VERIFY_ERROR: i32 = -25;
/// Transaction or block was rejected by network rules.
pub const RPC_VERIFY_REJECTED: i32 = -26;
/// Transaction already in chain.
pub const RPC_VERIFY_ALREADY_IN_CHAIN: i32 = -27;
/// Client still warming up.
pub const RPC_IN_WARMUP: i32 = -28;
