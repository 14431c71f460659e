//! The chain's height for incoming HTLCs' expiry checks, asked of the chain at most once
//! per [`FRESH_FOR`] however many HTLCs arrive (docs/node.md, "Defences" and "Performance
//! notes").
//!
//! Each incoming `update_add_htlc` or `update_timedout_htlc` used to ask bitcoind for its
//! tip: one JSON-RPC round trip per HTLC, about a tenth of a busy node's CPU. A height
//! asked within the last [`FRESH_FOR`] is as good an answer: the watcher's own pass runs
//! every 250 ms, and a block found since is missed for at most that long, as it would be
//! by a question already on its way to bitcoind.

use std::time::Duration;

use chain::Chain;
use tokio::time::Instant;

/// How long a height from the chain answers every expiry check without asking again.
pub(crate) const FRESH_FOR: Duration = Duration::from_millis(50);

/// How long an expiry check waits for the chain's height before it takes the last one seen
/// (the watcher's), so that a hung bitcoind does not hold the channel.
pub(crate) const WAIT: Duration = Duration::from_secs(2);

/// The last height the chain gave, and when it was asked.
#[derive(Debug, Default)]
pub(crate) struct FreshTip {
    /// Held while the chain is asked, so that checks arriving meanwhile wait for that
    /// one answer instead of each asking.
    last: tokio::sync::Mutex<Option<(Instant, u32)>>,
}

impl FreshTip {
    /// The chain's height, asked at most once per [`FRESH_FOR`]; `None` when the chain
    /// fails or has not answered within [`WAIT`] of this call.
    pub(crate) async fn height(&self, chain: &dyn Chain) -> Option<u32> {
        tokio::time::timeout(WAIT, async {
            let mut last = self.last.lock().await;
            if let Some((asked, height)) = *last {
                if asked.elapsed() < FRESH_FOR {
                    return Some(height);
                }
            }
            // The answer is as old as the question: a block found while it was on its
            // way may be missing from it, so its age counts from here.
            let asked = Instant::now();
            let tip = chain.tip().await.ok()?;
            *last = Some((asked, tip.height));
            Some(tip.height)
        })
        .await
        .ok()
        .flatten()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::harness::hanging::HangingChain;

    /// The development chain, counting its `tip` questions, and its height now.
    fn counted() -> (tempfile::TempDir, Arc<HangingChain>, Option<u32>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let chain = chain::DevChain::open(&dir.path().join("chain")).expect("dev chain");
        let height = Some(chain.height());
        (dir, Arc::new(HangingChain::new(chain)), height)
    }

    #[tokio::test(start_paused = true)]
    async fn checks_arriving_together_ask_the_chain_once() {
        let (_dir, chain, h0) = counted();
        let fresh = Arc::new(FreshTip::default());
        let mut checks = Vec::new();
        for _ in 0..20 {
            let (fresh, chain) = (Arc::clone(&fresh), Arc::clone(&chain));
            checks.push(tokio::spawn(
                async move { fresh.height(chain.as_ref()).await },
            ));
        }
        for c in checks {
            assert_eq!(c.await.expect("check"), h0);
        }
        assert_eq!(chain.tips_asked(), 1, "twenty checks, one question");
    }

    #[tokio::test(start_paused = true)]
    async fn a_height_older_than_its_freshness_is_asked_again_and_a_new_block_is_seen() {
        let (_dir, chain, h0) = counted();
        let fresh = FreshTip::default();
        assert_eq!(fresh.height(chain.as_ref()).await, h0);
        let payout = chain.inner().faucet_script().to_owned();
        chain.inner().mine(1, &payout).expect("mine");
        // Within the window the last answer stands; past it the new block shows.
        tokio::time::advance(FRESH_FOR - Duration::from_millis(1)).await;
        assert_eq!(fresh.height(chain.as_ref()).await, h0);
        assert_eq!(chain.tips_asked(), 1);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(fresh.height(chain.as_ref()).await, h0.map(|h| h + 1));
        assert_eq!(chain.tips_asked(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_chain_answers_none_within_the_wait_and_is_asked_again() {
        let (_dir, chain, h0) = counted();
        let fresh = Arc::new(FreshTip::default());
        chain.stall(true);
        let waiting = {
            let (fresh, chain) = (Arc::clone(&fresh), Arc::clone(&chain));
            tokio::spawn(async move { fresh.height(chain.as_ref()).await })
        };
        let second = {
            let (fresh, chain) = (Arc::clone(&fresh), Arc::clone(&chain));
            tokio::spawn(async move { fresh.height(chain.as_ref()).await })
        };
        chain.asked().await;
        let started = Instant::now();
        assert_eq!(waiting.await.expect("check"), None);
        assert_eq!(second.await.expect("check"), None);
        // Both gave up at their own deadline, not one after the other.
        assert!(started.elapsed() <= WAIT, "{:?}", started.elapsed());
        // Nothing was kept from the failure: once the chain answers, it is asked.
        chain.stall(false);
        let before = chain.tips_asked();
        assert_eq!(fresh.height(chain.as_ref()).await, h0);
        assert_eq!(chain.tips_asked(), before + 1);
    }

    #[test]
    fn the_window_is_well_inside_one_watcher_pass() {
        assert!(FRESH_FOR * 5 <= crate::watcher::POLL, "{FRESH_FOR:?}");
    }
}
