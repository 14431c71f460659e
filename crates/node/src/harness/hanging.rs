//! A chain that hangs on demand: every request waits while it is stalled, as a bitcoind
//! that keeps its connections open and answers nothing.

use std::sync::atomic::{AtomicU32, Ordering};

use bitcoin::{Block, BlockHash, OutPoint, Transaction, Txid};
use chain::{Chain, ChainFuture, DevChain, FeePolicy, Tip, TipStream, TxStatus, UnspentOutput};
use tokio::sync::watch;

/// The development chain behind a switch that holds every request while it is on.
pub(crate) struct HangingChain {
    inner: DevChain,
    stalled: watch::Sender<bool>,
    /// Holds the tip's answers once read, as a reply on its way back.
    answers_held: watch::Sender<bool>,
    /// How many requests wait at a switch now.
    waiting: watch::Sender<usize>,
    /// How many times the tip was asked for.
    tips: AtomicU32,
}

impl HangingChain {
    /// `inner`, answering.
    pub(crate) fn new(inner: DevChain) -> HangingChain {
        HangingChain {
            inner,
            stalled: watch::channel(false).0,
            answers_held: watch::channel(false).0,
            waiting: watch::channel(0).0,
            tips: AtomicU32::new(0),
        }
    }

    /// The chain behind the switch.
    pub(crate) fn inner(&self) -> &DevChain {
        &self.inner
    }

    /// How many times the tip was asked for so far.
    pub(crate) fn tips_asked(&self) -> u32 {
        self.tips.load(Ordering::SeqCst)
    }

    /// Holds (`true`) or releases (`false`) the tip's answers after the chain read them,
    /// so that a block mined meanwhile is missing from them.
    pub(crate) fn hold_answers(&self, on: bool) {
        self.answers_held.send_replace(on);
    }

    /// Holds (`true`) or releases (`false`) every request.
    pub(crate) fn stall(&self, on: bool) {
        self.stalled.send_replace(on);
    }

    /// Resolves once a request waits at the switch.
    pub(crate) async fn asked(&self) {
        let mut waiting = self.waiting.subscribe();
        // The sender lives as long as `self`: the wait ends only when a request comes.
        let _asked = waiting.wait_for(|n| *n > 0).await;
    }

    async fn gate(&self) {
        self.wait_at(&self.stalled).await;
    }

    async fn wait_at(&self, switch: &watch::Sender<bool>) {
        let mut released = switch.subscribe();
        if *released.borrow() {
            self.waiting.send_modify(|n| *n += 1);
            // The sender lives as long as `self`: the wait ends only on a release.
            let _released = released.wait_for(|stalled| !*stalled).await;
            self.waiting.send_modify(|n| *n -= 1);
        }
    }
}

impl Chain for HangingChain {
    fn tip(&self) -> ChainFuture<'_, Tip> {
        Box::pin(async move {
            self.tips.fetch_add(1, Ordering::SeqCst);
            self.gate().await;
            let tip = self.inner.tip().await;
            self.wait_at(&self.answers_held).await;
            tip
        })
    }

    fn block_hash(&self, height: u32) -> ChainFuture<'_, Option<BlockHash>> {
        Box::pin(async move {
            self.gate().await;
            self.inner.block_hash(height).await
        })
    }

    fn block(&self, hash: BlockHash) -> ChainFuture<'_, Block> {
        Box::pin(async move {
            self.gate().await;
            self.inner.block(hash).await
        })
    }

    fn transaction(&self, txid: Txid) -> ChainFuture<'_, Option<TxStatus>> {
        Box::pin(async move {
            self.gate().await;
            self.inner.transaction(txid).await
        })
    }

    fn transaction_in_block(
        &self,
        txid: Txid,
        hint: BlockHash,
    ) -> ChainFuture<'_, Option<TxStatus>> {
        Box::pin(async move {
            self.gate().await;
            self.inner.transaction_in_block(txid, hint).await
        })
    }

    fn broadcast(&self, tx: Transaction) -> ChainFuture<'_, Txid> {
        Box::pin(async move {
            self.gate().await;
            self.inner.broadcast(tx).await
        })
    }

    fn in_mempool(&self, txid: Txid) -> ChainFuture<'_, bool> {
        Box::pin(async move {
            self.gate().await;
            self.inner.in_mempool(txid).await
        })
    }

    fn unspent_output(&self, outpoint: OutPoint) -> ChainFuture<'_, Option<UnspentOutput>> {
        Box::pin(async move {
            self.gate().await;
            self.inner.unspent_output(outpoint).await
        })
    }

    fn confirmed_output(&self, outpoint: OutPoint) -> ChainFuture<'_, Option<UnspentOutput>> {
        Box::pin(async move {
            self.gate().await;
            self.inner.confirmed_output(outpoint).await
        })
    }

    fn estimate_fee(&self, target_blocks: u16) -> ChainFuture<'_, bitcoin::FeeRate> {
        Box::pin(async move {
            self.gate().await;
            self.inner.estimate_fee(target_blocks).await
        })
    }

    fn fee_policy(&self) -> FeePolicy {
        self.inner.fee_policy()
    }

    fn tips(&self) -> TipStream {
        self.inner.tips()
    }
}
