//! The `Chain` trait: what the rounds service and the channel node need from
//! a blockchain, implemented by [`crate::BitcoindRpc`] and [`crate::DevChain`].

use std::future::Future;
use std::pin::Pin;

use bitcoin::{Amount, Block, BlockHash, FeeRate, OutPoint, ScriptBuf, Transaction, Txid};

use crate::fees::FeePolicy;
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

/// How far the node is: its tip, the headers it knows of, and whether it
/// says it is still in initial block download. A node with more headers
/// than blocks knows of blocks it has not processed yet (it is catching up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SyncState {
    /// The active tip.
    pub tip: Tip,
    /// Height of the best header chain the node knows.
    pub headers: u32,
    /// Core's `initialblockdownload`.
    pub initial_block_download: bool,
}

impl SyncState {
    /// Whether the node has processed every block it knows of and is out of
    /// initial block download.
    pub fn is_synced(&self) -> bool {
        !self.initial_block_download && self.headers <= self.tip.height
    }
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

/// What a refusal of a broadcast means for the transaction, read from Core's
/// code and reject reason (Core 28's `BroadcastTransaction` and
/// `MemPoolAccept`). Callers decide on this, never on the bare code: -25 is
/// both "inputs spent" (perhaps by this very transaction, already mined) and
/// "fee above maxfeerate".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectCategory {
    /// -27 `Transaction outputs already in utxo set`, or already in the
    /// mempool: the transaction is (or was) accepted. Treat as broadcast.
    AlreadyKnown,
    /// -25 `bad-txns-inputs-missingorspent` (Core's "missing inputs"): an
    /// input is unknown or spent — by a conflicting transaction, or by this
    /// transaction itself once it was mined and all its outputs were spent
    /// (Core answers -27 only while one of its outputs is unspent). Never
    /// proof that the transaction failed: look it up before undoing anything.
    InputsSpent,
    /// -26 `txn-mempool-conflict` and other conflicts with mempool
    /// transactions: a different transaction spends one of the inputs.
    Conflict,
    /// A refusal that may turn into acceptance later without changing the
    /// transaction: `non-final`, `non-BIP68-final`, `mempool min fee not
    /// met`, `too-long-mempool-chain`, `mempool full`, a premature coinbase
    /// spend. Retry later; never treat as final.
    Transient,
    /// The transaction can never be valid as it is (bad signature,
    /// non-standard, below the minimum relay fee, inputs below outputs, a
    /// fee above the node's `maxfeerate` …).
    Invalid,
}

impl RejectCategory {
    /// Classifies Core's `code` and reject `reason`.
    pub fn classify(code: i32, reason: &str) -> Self {
        use crate::rpc::codes::{RPC_VERIFY_ALREADY_IN_CHAIN, RPC_VERIFY_ERROR};
        let r = reason.trim();
        if code == RPC_VERIFY_ALREADY_IN_CHAIN
            || r.starts_with("txn-already-in-mempool")
            || r.starts_with("txn-already-known")
            || r.starts_with("Transaction already in block chain")
            || r.starts_with("Transaction outputs already in utxo set")
        {
            return Self::AlreadyKnown;
        }
        if r.starts_with("bad-txns-inputs-missingorspent")
            || r.starts_with("missing-inputs")
            || r.starts_with("Missing inputs")
            || r.starts_with("Inputs missing or spent")
        {
            return Self::InputsSpent;
        }
        if r.starts_with("txn-mempool-conflict")
            || r.starts_with("txn-same-nonwitness-data-in-mempool")
            || r.starts_with("insufficient fee, rejecting replacement")
            || r.starts_with("replacement-adds-unconfirmed")
            || r.starts_with("too many potential replacements")
            || r.starts_with("bad-txns-spends-conflicting-tx")
        {
            return Self::Conflict;
        }
        const TRANSIENT: [&str; 6] = [
            "non-final",
            "non-BIP68-final",
            "mempool min fee not met",
            "too-long-mempool-chain",
            "mempool full",
            "bad-txns-premature-spend-of-coinbase",
        ];
        if TRANSIENT.iter().any(|t| r.starts_with(t)) {
            return Self::Transient;
        }
        // The node's `maxfeerate` guard (-25) refuses this transaction for
        // as long as the setting stands: it must be rebuilt, not re-sent.
        if r.starts_with("max-fee-exceeded")
            || r.starts_with("Fee exceeds maximum configured by user")
        {
            return Self::Invalid;
        }
        // Other -25 answers are Core's "general errors" (e.g. a failure to
        // reach the mempool): nothing says the transaction is bad.
        if code == RPC_VERIFY_ERROR {
            return Self::Transient;
        }
        Self::Invalid
    }
}

/// What went wrong talking to the chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChainError {
    /// The node refused a transaction; `code` and `reason` are Bitcoin Core's
    /// (e.g. -26 `min relay fee not met, 0 < 110`), `category` what that means.
    #[error("transaction rejected ({code}): {reason}")]
    Rejected {
        /// Bitcoin Core RPC error code (-25, -26 or -27).
        code: i32,
        /// Core's reject reason.
        reason: String,
        /// What the refusal means for the transaction.
        category: RejectCategory,
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

impl ChainError {
    /// A refusal with Core's `code` and `reason`, classified.
    pub fn rejected(code: i32, reason: impl Into<String>) -> Self {
        let reason = reason.into();
        let category = RejectCategory::classify(code, &reason);
        Self::Rejected {
            code,
            reason,
            category,
        }
    }

    /// The category of a refusal; `None` for other errors.
    pub fn reject_category(&self) -> Option<RejectCategory> {
        match self {
            Self::Rejected { category, .. } => Some(*category),
            _ => None,
        }
    }

    /// The transaction is already in the mempool or a block: treat as broadcast.
    pub fn is_already_known(&self) -> bool {
        self.reject_category() == Some(RejectCategory::AlreadyKnown)
    }

    /// An input is missing or spent (perhaps by this transaction, mined):
    /// look the transaction up before concluding anything.
    pub fn is_inputs_spent(&self) -> bool {
        self.reject_category() == Some(RejectCategory::InputsSpent)
    }

    /// Another transaction spends one of the inputs.
    pub fn is_conflict(&self) -> bool {
        self.reject_category() == Some(RejectCategory::Conflict)
    }

    /// Worth retrying later unchanged: a transient policy refusal, or the
    /// chain was unreachable.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_))
            || self.reject_category() == Some(RejectCategory::Transient)
    }

    /// The transaction can never be accepted as it is. Even then, undo a
    /// transfer only after checking that the transaction is in neither the
    /// mempool nor a block ([`Chain::broadcast_outcome`] does both).
    pub fn is_invalid(&self) -> bool {
        self.reject_category() == Some(RejectCategory::Invalid)
    }
}

/// Where a transaction stands after a broadcast attempt, checked against the
/// chain (see [`Chain::broadcast_outcome`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BroadcastOutcome {
    /// In the mempool or in a block: the transfer stands.
    Accepted,
    /// Refused for now (transient policy, conflict not yet settled, inputs
    /// spent but the transaction not found, chain unreachable): keep the
    /// transfer and try again later. Never undo on this.
    Pending(ChainError),
    /// Refused as invalid, and the transaction is in neither the mempool nor
    /// the block scan window: it is safe to undo the transfer.
    Failed(ChainError),
}

/// A blockchain as the services see it. Implementations are cheap to clone
/// handles; every method is a single request.
pub trait Chain: Send + Sync {
    /// Height and hash of the active tip.
    fn tip(&self) -> ChainFuture<'_, Tip>;
    /// Height of the active tip alone: a lighter question than [`Chain::tip`] where the
    /// hash is not needed (Core's `getblockcount` against `getblockchaininfo`). By
    /// default the tip's height.
    fn height(&self) -> ChainFuture<'_, u32> {
        Box::pin(async move { Ok(self.tip().await?.height) })
    }
    /// The tip with the headers the node knows and its initial block
    /// download flag. By default a node that knows no more than its tip.
    fn sync_state(&self) -> ChainFuture<'_, SyncState> {
        Box::pin(async move {
            let tip = self.tip().await?;
            Ok(SyncState {
                tip,
                headers: tip.height,
                initial_block_download: false,
            })
        })
    }
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
    /// The output if confirmed and unspent by a block, whatever spends it in the mempool
    /// (Core's `gettxout txid n false`): what a replacement of that spend is signed over.
    fn confirmed_output(&self, outpoint: OutPoint) -> ChainFuture<'_, Option<UnspentOutput>>;
    /// Fee rate to build at to confirm within `target_blocks`: the node's
    /// estimate held to the chain's [`FeePolicy`] (never below its floor or
    /// the mempool's minimum, never above its ceiling; its fallback when the
    /// node has no estimate).
    fn estimate_fee(&self, target_blocks: u16) -> ChainFuture<'_, FeeRate>;
    /// The bounds [`Chain::estimate_fee`] applies (e.g. its ceiling caps a
    /// fee bump too).
    fn fee_policy(&self) -> FeePolicy;
    /// A stream of new tips and reorganisations, starting from the current tip.
    fn tips(&self) -> TipStream;

    /// A confirmed transaction looked up in the block `hint` (works on a
    /// Core without `-txindex`, as `getrawtransaction txid true blockhash`).
    fn transaction_in_block(
        &self,
        txid: Txid,
        hint: BlockHash,
    ) -> ChainFuture<'_, Option<TxStatus>>;

    /// Broadcasts `tx` and reads any refusal by what it means: a refusal
    /// becomes [`BroadcastOutcome::Failed`] only when it is
    /// [`RejectCategory::Invalid`] *and* the transaction is in neither the
    /// mempool nor the chain. `InputsSpent` is the answer Core gives to a
    /// re-broadcast of a mined transaction whose outputs are all spent, so it
    /// is never a failure on its own: the caller's block scan decides.
    fn broadcast_outcome(&self, tx: Transaction) -> ChainFuture<'_, BroadcastOutcome> {
        Box::pin(async move {
            let txid = tx.compute_txid();
            let err = match self.broadcast(tx).await {
                Ok(_) => return Ok(BroadcastOutcome::Accepted),
                Err(e) if e.is_already_known() => return Ok(BroadcastOutcome::Accepted),
                Err(e @ ChainError::Rejected { .. }) => e,
                Err(e) => return Err(e),
            };
            // Whatever the refusal says, the transaction may be known.
            if self.in_mempool(txid).await? {
                return Ok(BroadcastOutcome::Accepted);
            }
            if let Some(status) = self.transaction(txid).await? {
                if status.confirmations > 0 || status.block_hash.is_some() {
                    return Ok(BroadcastOutcome::Accepted);
                }
            }
            if err.is_invalid() {
                Ok(BroadcastOutcome::Failed(err))
            } else {
                Ok(BroadcastOutcome::Pending(err))
            }
        })
    }

    /// Median time past of the active tip (BIP113): the median of the last 11 blocks'
    /// header times. A transaction whose nLockTime is a time (≥ 500,000,000) can enter
    /// the next block only if that time is below it. This default reads the blocks;
    /// implementations that know it answer in one request.
    fn median_time_past(&self) -> ChainFuture<'_, u32> {
        Box::pin(async move {
            let tip = self.tip().await?;
            let mut times = Vec::with_capacity(11);
            for height in tip.height.saturating_sub(10)..=tip.height {
                if let Some(block) = self.block_at(height).await? {
                    times.push(block.header.time);
                }
            }
            times.sort_unstable();
            Ok(times.get(times.len() / 2).copied().unwrap_or(0))
        })
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Core 28's answers and what they mean; -25 is both "inputs spent"
    /// (never final) and "fee above maxfeerate" (final until rebuilt).
    #[test]
    fn core_answers_are_classified_by_meaning() {
        use RejectCategory::*;
        for (code, reason, expected) in [
            (-27, "Transaction outputs already in utxo set", AlreadyKnown),
            (-26, "txn-already-in-mempool", AlreadyKnown),
            (-26, "txn-already-known", AlreadyKnown),
            (-25, "bad-txns-inputs-missingorspent", InputsSpent),
            (-25, "Missing inputs", InputsSpent),
            (-26, "txn-mempool-conflict", Conflict),
            (
                -26,
                "insufficient fee, rejecting replacement ab; new feerate",
                Conflict,
            ),
            (-26, "non-final", Transient),
            (-26, "non-BIP68-final", Transient),
            (-26, "mempool min fee not met, 100 < 200", Transient),
            (
                -26,
                "too-long-mempool-chain, too many unconfirmed ancestors [limit: 25]",
                Transient,
            ),
            (-26, "mempool full", Transient),
            (-25, "some general failure", Transient),
            (
                -25,
                "Fee exceeds maximum configured by user (e.g. -maxtxfee, maxfeerate)",
                Invalid,
            ),
            (-26, "min relay fee not met, 0 < 110", Invalid),
            (
                -26,
                "mandatory-script-verify-flag-failed (input 0: x)",
                Invalid,
            ),
            (
                -26,
                "mempool-script-verify-flag-failed (Invalid Schnorr signature), input 0 of x",
                Invalid,
            ),
            (-26, "scriptpubkey", Invalid),
        ] {
            assert_eq!(
                RejectCategory::classify(code, reason),
                expected,
                "{code} {reason}"
            );
        }
        let e = ChainError::rejected(-25, "bad-txns-inputs-missingorspent");
        assert!(e.is_inputs_spent() && !e.is_invalid() && !e.is_transient());
        assert!(ChainError::Unavailable("x".into()).is_transient());
    }
}
