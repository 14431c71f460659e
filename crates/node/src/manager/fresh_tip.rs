//! The chain's height for incoming HTLCs' expiry checks: one question to the chain shared
//! by the checks that arrive together, and never an answer older than the check (docs/node.md,
//! "Defences" and "Performance notes").
//!
//! Each incoming `update_add_htlc` or `update_timedout_htlc` used to ask bitcoind for its
//! tip: one JSON-RPC round trip per HTLC, about a tenth of a busy node's CPU. Checks that
//! arrive while a question is on its way cannot take its answer: it was asked before their
//! packet came, and a block the peer saw first may be missing from it (a peer's
//! `update_timedout_htlc` sent right after a block would be refused, an add due to be refused
//! would pass). They wait for the next question instead, sent as soon as the one on its way
//! is answered, and share it — the rule a group commit follows for its flush.

use std::sync::Arc;
use std::time::Duration;

use chain::Chain;
use tokio::sync::watch;
use tokio::time::Instant;

/// How long an expiry check waits for the chain's height before it takes the last one seen
/// (the watcher's), so that a hung bitcoind does not hold the channel.
pub(crate) const WAIT: Duration = Duration::from_secs(2);

/// How old a question may be for its answer to judge an add within [`SLACK`] (see
/// [`FreshTip::recent`]): on mainnet no [`SLACK`] blocks ever come within it.
pub(crate) const RECENT: Duration = Duration::from_secs(1);

/// Blocks the chain may have moved, either way, since a [`RECENT`] answer: an add is judged
/// at that answer only when every height this close to it gives the same verdict.
pub(crate) const SLACK: u32 = 6;

/// The questions asked so far, numbered from 1: a question is on its way while
/// `answered < sent` (one at a time).
#[derive(Debug, Clone, Copy, Default)]
struct Questions {
    sent: u64,
    answered: u64,
    /// The last answer's height and when its question was sent, `None` when the chain
    /// failed or did not answer within [`WAIT`].
    answer: Option<(u32, Instant)>,
}

/// The questions about the chain's height, shared by the checks that arrive together.
#[derive(Debug)]
pub(crate) struct FreshTip {
    questions: Arc<watch::Sender<Questions>>,
}

impl Default for FreshTip {
    fn default() -> Self {
        Self {
            questions: Arc::new(watch::Sender::new(Questions::default())),
        }
    }
}

impl FreshTip {
    /// The chain's height as answered to a question sent after this call began; `None` when
    /// the chain fails or has not answered within [`WAIT`] of this call.
    pub(crate) async fn height(&self, chain: &Arc<dyn Chain>) -> Option<u32> {
        let mut questions = self.questions.subscribe();
        // Every question sent so far, on its way or answered, was sent before this check.
        let needed = questions.borrow_and_update().sent + 1;
        let wait = async {
            loop {
                let now = *questions.borrow_and_update();
                if now.answered >= needed {
                    return now.answer.map(|(height, _)| height);
                }
                self.send_if_none_on_its_way(needed, chain);
                // The sender lives in `self`: `changed` ends with the next change.
                if questions.changed().await.is_err() {
                    return None;
                }
            }
        };
        tokio::time::timeout(WAIT, wait).await.ok().flatten()
    }

    /// The height answered to a question sent less than [`RECENT`] ago, for a check that
    /// may take an answer older than its packet: one whose verdict is the same at every
    /// height within [`SLACK`] of it. Every other check asks ([`FreshTip::height`]).
    pub(crate) fn recent(&self) -> Option<u32> {
        let q = *self.questions.borrow();
        q.answer
            .filter(|(_, asked_at)| asked_at.elapsed() < RECENT)
            .map(|(height, _)| height)
    }

    /// Sends question `needed` unless one is on its way (its answer wakes the waiting checks,
    /// and one of them sends then); the answer is published by a task of its own, so that a
    /// check that gives up (its wait over, its packet dropped) leaves no question unanswered.
    fn send_if_none_on_its_way(&self, needed: u64, chain: &Arc<dyn Chain>) {
        let mut question = 0;
        self.questions.send_if_modified(|q| {
            if q.answered < q.sent || q.sent >= needed {
                return false;
            }
            q.sent += 1;
            question = q.sent;
            true
        });
        if question == 0 {
            return;
        }
        let (questions, chain) = (Arc::clone(&self.questions), Arc::clone(chain));
        let asked_at = Instant::now();
        tokio::spawn(async move {
            // The height alone: `getblockcount`, lighter for bitcoind than the tip's
            // `getblockchaininfo`.
            let height = tokio::time::timeout(WAIT, chain.height())
                .await
                .ok()
                .and_then(Result::ok);
            questions.send_modify(|q| {
                q.answered = question;
                q.answer = height.map(|h| (h, asked_at));
            });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::hanging::HangingChain;

    /// The development chain behind a switch, counting its `tip` questions, and its height.
    fn counted() -> (tempfile::TempDir, Arc<HangingChain>, Option<u32>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let chain = chain::DevChain::open(&dir.path().join("chain")).expect("dev chain");
        let height = Some(chain.height());
        (dir, Arc::new(HangingChain::new(chain)), height)
    }

    fn check(
        fresh: &Arc<FreshTip>,
        chain: &Arc<HangingChain>,
    ) -> tokio::task::JoinHandle<Option<u32>> {
        let fresh = Arc::clone(fresh);
        let chain: Arc<dyn Chain> = Arc::clone(chain) as Arc<dyn Chain>;
        tokio::spawn(async move { fresh.height(&chain).await })
    }

    #[tokio::test(start_paused = true)]
    async fn checks_arriving_while_a_question_is_out_share_the_next_one() {
        let (_dir, chain, h0) = counted();
        let fresh = Arc::new(FreshTip::default());
        chain.hold_answers(true);
        let first = check(&fresh, &chain);
        chain.asked().await;
        let together: Vec<_> = (0..20).map(|_| check(&fresh, &chain)).collect();
        tokio::task::yield_now().await;
        chain.hold_answers(false);
        assert_eq!(first.await.expect("check"), h0);
        for c in together {
            assert_eq!(c.await.expect("check"), h0);
        }
        assert_eq!(chain.tips_asked(), 2, "twenty-one checks, two questions");
    }

    #[tokio::test(start_paused = true)]
    async fn a_block_found_after_a_question_left_is_seen_by_a_check_that_came_after_it() {
        let (_dir, chain, h0) = counted();
        let fresh = Arc::new(FreshTip::default());
        // The first question reads the height and its answer is held on its way back.
        chain.hold_answers(true);
        let before = check(&fresh, &chain);
        chain.asked().await;
        let payout = chain.inner().faucet_script().to_owned();
        chain.inner().mine(1, &payout).expect("mine");
        // The peer saw the block and sent its packet: this check comes after the block.
        let after = check(&fresh, &chain);
        tokio::task::yield_now().await;
        chain.hold_answers(false);
        assert_eq!(before.await.expect("check"), h0);
        assert_eq!(after.await.expect("check"), h0.map(|h| h + 1));
    }

    #[tokio::test(start_paused = true)]
    async fn checks_one_after_another_each_ask() {
        let (_dir, chain, h0) = counted();
        let fresh = Arc::new(FreshTip::default());
        for asked in 1..=3 {
            assert_eq!(check(&fresh, &chain).await.expect("check"), h0);
            assert_eq!(chain.tips_asked(), asked);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_chain_answers_none_within_the_wait_and_is_asked_again() {
        let (_dir, chain, h0) = counted();
        let fresh = Arc::new(FreshTip::default());
        chain.stall(true);
        let waiting = check(&fresh, &chain);
        chain.asked().await;
        let second = check(&fresh, &chain);
        let started = tokio::time::Instant::now();
        assert_eq!(waiting.await.expect("check"), None);
        assert_eq!(second.await.expect("check"), None);
        // Each gave up at its own deadline, not one after the other.
        assert!(started.elapsed() <= WAIT, "{:?}", started.elapsed());
        // Nothing was kept from the failure: once the chain answers, it is asked.
        chain.stall(false);
        tokio::time::sleep(WAIT).await;
        let before = chain.tips_asked();
        assert_eq!(check(&fresh, &chain).await.expect("check"), h0);
        assert_eq!(chain.tips_asked(), before + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_recent_answer_lasts_a_second_from_when_its_question_left() {
        let (_dir, chain, h0) = counted();
        let fresh = Arc::new(FreshTip::default());
        assert_eq!(fresh.recent(), None, "nothing asked yet");
        // The answer is held on its way back for most of a second.
        chain.hold_answers(true);
        let asked = check(&fresh, &chain);
        chain.asked().await;
        tokio::time::sleep(RECENT - Duration::from_millis(100)).await;
        chain.hold_answers(false);
        assert_eq!(asked.await.expect("check"), h0);
        assert_eq!(fresh.recent(), h0);
        // A second after the question left, not after its answer came, it is too old.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(fresh.recent(), None);
        // The next question makes it recent again.
        assert_eq!(check(&fresh, &chain).await.expect("check"), h0);
        assert_eq!(fresh.recent(), h0);
    }
}
