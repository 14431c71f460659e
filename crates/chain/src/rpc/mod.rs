//! Bitcoin Core JSON-RPC: error codes and the client.

pub mod client;
pub mod codes;
