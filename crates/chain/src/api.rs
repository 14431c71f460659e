//! The `Chain` trait: what the rounds service and the channel node need from
//! a blockchain, implemented by [`crate::BitcoindRpc`] and [`crate::DevChain`].

use std::future::Future;
use std::pin::Pin;

use bitcoin::{Amount, Block, BlockHash, FeeRate, OutPoint, ScriptBuf, Transaction, Txid};

use crate::tips::TipStream;

/// A boxed future returned by [`Chain`] methods (keeps the trait object-safe).
pub type ChainFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ChainError>> + Send + 'a>>;

/// A block on the active chain, identified by height and hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tip {
    /// Height (genesis = 0).
    pub height: u32,
    /// Block hash.
    pub hash: BlockHash,
}

/// A transaction and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxStatus {
    /// The transaction.
    pub tx: Transaction,
    /// 0 while in the mempool, otherwise depth in the active chain (tip = 1).
    pub confirmations: u32,
    /// The block that contains it, if confirmed.
    pub block_hash: Option<BlockHash>,
}

/// An unspent output as `gettxout` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnspentOutput {
    /// Value.
    pub value: Amount,
    /// Locking script.
    pub script_pubkey: ScriptBuf,
    /// 0 if created by a mempool transaction.
    pub confirmations: u32,
    /// Whether it is a coinbase output.
    pub coinbase: bool,
}

/// What went wrong talking to the chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChainError {
    /// The node refused a transaction; `code` and `reason` are Bitcoin Core's
    /// (e.g. -26 `min relay fee not met, 0 < 110`).
    #[error("transaction rejected ({code}): {reason}")]
    Rejected {
        /// Bitcoin Core RPC error code (-25, -26 or -27).
        code: i32,
        /// Core's reject reason.
        reason: String,
    },
    /// The block or height asked for does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// Any other error the node answered with.
    #[error("node error ({code}): {message}")]
    Node {
        /// Bitcoin Core RPC error code.
        code: i32,
        /// Message.
        message: String,
    },
    /// The node could not be reached or answered garbage (worth retrying later).
    #[error("chain unavailable: {0}")]
    Unavailable(String),
}

/// A blockchain as the services see it. Implementations are cheap to clone
/// handles; every method is a single request.
pub trait Chain: Send + Sync {
    /// Height and hash of the active tip.
    fn tip(&self) -> ChainFuture<'_, Tip>;
    /// Hash of the active block at `height`; `None` above the tip.
    fn block_hash(&self, height: u32) -> ChainFuture<'_, Option<BlockHash>>;
    /// The block with `hash` (active or not).
    fn block(&self, hash: BlockHash) -> ChainFuture<'_, Block>;
    /// A transaction in the mempool or the active chain; `None` if unknown.
    fn transaction(&self, txid: Txid) -> ChainFuture<'_, Option<TxStatus>>;
    /// Submits a transaction; [`ChainError::Rejected`] carries Core's code
    /// and reason. Re-sending a transaction already in the mempool succeeds.
    fn broadcast(&self, tx: Transaction) -> ChainFuture<'_, Txid>;
    /// Whether `txid` is in the mempool.
    fn in_mempool(&self, txid: Txid) -> ChainFuture<'_, bool>;
    /// The output if unspent (mempool spends count as spent).
    fn unspent_output(&self, outpoint: OutPoint) -> ChainFuture<'_, Option<UnspentOutput>>;
    /// Fee rate to confirm within `target_blocks`; `None` without an estimate.
    fn estimate_fee(&self, target_blocks: u16) -> ChainFuture<'_, Option<FeeRate>>;
    /// A stream of new tips and reorganisations, starting from the current tip.
    fn tips(&self) -> TipStream;

    /// The active block at `height`, if any.
    fn block_at(&self, height: u32) -> ChainFuture<'_, Option<Block>> {
        Box::pin(async move {
            match self.block_hash(height).await? {
                Some(hash) => Ok(Some(self.block(hash).await?)),
                None => Ok(None),
            }
        })
    }
}
