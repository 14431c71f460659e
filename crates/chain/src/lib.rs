//! The chain layer: the [`Chain`] trait the services program against, a
//! Bitcoin Core JSON-RPC client ([`BitcoindRpc`]), and the embedded
//! development chain ([`DevChain`]) that serves the same RPC subset.

pub mod api;
pub mod bump;
pub mod dev;
pub mod fees;
pub mod rpc;
pub mod tips;

pub use api::{
    BroadcastOutcome, Chain, ChainError, ChainFuture, RejectCategory, SyncState, Tip, TxStatus,
    UnspentOutput,
};
pub use dev::{DevChain, DevChainConfig, DevChainError, RunningDevChain};
pub use fees::{FeePolicy, FeePolicyError};
pub use rpc::client::{Auth, BitcoindRpc, RpcConfig, RpcError};
pub use tips::{TipEvent, TipStream};

pub use bitcoin;
