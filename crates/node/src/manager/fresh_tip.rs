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

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chain::Chain;
use tokio::sync::watch;

/// How long an expiry check waits for the chain's height before it takes the last one seen
/// (the watcher's), so that a hung bitcoind does not hold the channel.
pub(crate) const WAIT: Duration = Duration::from_secs(2);

/// An answer from the chain: the question's number and the height, `None` when the chain
/// failed or did not answer within [`WAIT`].
#[derive(Debug, Clone, Copy, Default)]
struct Answer {
    question: u64,
    height: Option<u32>,
}

/// Which question is on its way.
#[derive(Debug, Default)]
struct Asking {
    /// The number of the last question sent (0: none yet).
    sent: u64,
    /// Whether that question is still on its way.
    on_its_way: bool,
}

/// The questions about the chain's height, shared by the checks that arrive together.
#[derive(Debug)]
pub(crate) struct FreshTip {
    asking: Arc<Mutex<Asking>>,
    answers: Arc<watch::Sender<Answer>>,
}

impl Default for FreshTip {
    fn default() -> Self {
        Self {
            asking: Arc::default(),
            answers: Arc::new(watch::Sender::new(Answer::default())),
        }
    }
}

impl FreshTip {
    /// The chain's height as answered to a question sent after this call began; `None` when
    /// the chain fails or has not answered within [`WAIT`] of this call.
    pub(crate) async fn height(&self, chain: &Arc<dyn Chain>) -> Option<u32> {
        let mut answers = self.answers.subscribe();
        // A question on its way now was sent before this check: wait for the next one.
        let needed = {
            let mut asking = self.lock();
            if asking.on_its_way {
                asking.sent + 1
            } else {
                self.send(&mut asking, chain)
            }
        };
        let wait = async {
            loop {
                let answer = *answers.borrow_and_update();
                if answer.question >= needed {
                    return answer.height;
                }
                {
                    let mut asking = self.lock();
                    if !asking.on_its_way && asking.sent < needed {
                        self.send(&mut asking, chain);
                    }
                }
                // The sender lives in `self`: `changed` ends with the next answer.
                if answers.changed().await.is_err() {
                    return None;
                }
            }
        };
        tokio::time::timeout(WAIT, wait).await.ok().flatten()
    }

    /// Sends the next question; its answer is published by a task of its own, so that a
    /// check that gives up (its wait over, its packet dropped) leaves no question unanswered.
    fn send(&self, asking: &mut Asking, chain: &Arc<dyn Chain>) -> u64 {
        asking.sent += 1;
        asking.on_its_way = true;
        let question = asking.sent;
        let (state, answers, chain) = (
            Arc::clone(&self.asking),
            Arc::clone(&self.answers),
            Arc::clone(chain),
        );
        tokio::spawn(async move {
            let height = tokio::time::timeout(WAIT, chain.tip())
                .await
                .ok()
                .and_then(Result::ok)
                .map(|tip| tip.height);
            let mut asking = state.lock().unwrap_or_else(PoisonError::into_inner);
            asking.on_its_way = false;
            answers.send_replace(Answer { question, height });
        });
        question
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Asking> {
        // Nothing in the lock can panic part-way through a change.
        self.asking.lock().unwrap_or_else(PoisonError::into_inner)
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
}
