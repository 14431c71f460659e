//! The chain layer: the `Chain` trait, a Bitcoin Core JSON-RPC client and the embedded development chain.
