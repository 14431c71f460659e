//! The tip stream: new blocks and reorganisations (with the fork point),
//! found by polling any [`Chain`] and comparing block hashes by height.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::api::{Chain, ChainError, Tip};

/// Consecutive failed polls after which the stream warns.
const WARN_AFTER_FAILURES: u32 = 3;
/// How many recent heights the watcher remembers to find fork points.
const REMEMBERED_BLOCKS: u32 = 288;

/// A change of the active chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TipEvent {
    /// A block was connected on top of the previous tip (one event per block).
    Connected(Tip),
    /// Blocks above `fork_point` were disconnected. Blocks of the new branch
    /// follow as [`TipEvent::Connected`] events.
    Reorg {
        /// The last block both the old and the new chain contain.
        fork_point: Tip,
        /// The tip before the reorganisation.
        old_tip: Tip,
    },
}

/// Receives [`TipEvent`]s; the watcher task stops when this is dropped.
#[derive(Debug)]
pub struct TipStream {
    rx: mpsc::Receiver<TipEvent>,
    start: Option<Tip>,
}

impl TipStream {
    /// Watches `chain` by polling its tip every `interval`.
    ///
    /// Must be called inside a tokio runtime. The first poll happens at once;
    /// [`TipStream::start`] tells the tip the stream started from.
    pub fn poll(chain: Arc<dyn Chain>, interval: Duration) -> Self {
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(async move {
            let mut watcher = Watcher {
                known: BTreeMap::new(),
                tip: None,
            };
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failures = 0u32;
            loop {
                ticker.tick().await;
                if tx.is_closed() {
                    return;
                }
                match watcher.step(chain.as_ref()).await {
                    Ok(events) => {
                        if failures >= WARN_AFTER_FAILURES {
                            tracing::info!(failures, "tip poll works again");
                        }
                        failures = 0;
                        for e in events {
                            if tx.send(e).await.is_err() {
                                return;
                            }
                        }
                    }
                    // The chain may be briefly unreachable; the next poll
                    // retries. A node that stays away is worth a warning
                    // (then one every 60 failures, not one per poll).
                    Err(e) => {
                        failures += 1;
                        if failures >= WARN_AFTER_FAILURES
                            && (failures - WARN_AFTER_FAILURES) % 60 == 0
                        {
                            tracing::warn!(error = %e, failures, "tip poll keeps failing");
                        } else {
                            tracing::debug!(error = %e, failures, "tip poll failed");
                        }
                    }
                }
            }
        });
        Self { rx, start: None }
    }

    /// The next event; `None` once the watcher has stopped.
    pub async fn next(&mut self) -> Option<TipEvent> {
        loop {
            let e = self.rx.recv().await?;
            // The watcher's first observation is reported as a Connected event
            // of the current tip; remember it as the start instead.
            if self.start.is_none() {
                if let TipEvent::Connected(t) = e {
                    self.start = Some(t);
                    continue;
                }
            }
            return Some(e);
        }
    }

    /// Waits for the first observation and returns the tip the stream starts from.
    pub async fn start(&mut self) -> Option<Tip> {
        if self.start.is_none() {
            if let Some(TipEvent::Connected(t)) = self.rx.recv().await {
                self.start = Some(t);
            }
        }
        self.start
    }
}

struct Watcher {
    known: BTreeMap<u32, bitcoin::BlockHash>,
    tip: Option<Tip>,
}

impl Watcher {
    async fn step(&mut self, chain: &dyn Chain) -> Result<Vec<TipEvent>, ChainError> {
        let new = chain.tip().await?;
        let Some(old) = self.tip else {
            self.remember(new);
            self.tip = Some(new);
            return Ok(vec![TipEvent::Connected(new)]);
        };
        if new == old {
            return Ok(Vec::new());
        }
        let mut events = Vec::new();
        // Find the highest height where our memory and the chain agree.
        let mut h = old.height.min(new.height);
        let lowest = self.known.keys().next().copied().unwrap_or(0);
        let fork = loop {
            let ours = self.known.get(&h).copied();
            let theirs = chain.block_hash(h).await?;
            if ours.is_some() && ours == theirs {
                break Tip {
                    height: h,
                    hash: ours.unwrap_or(new.hash),
                };
            }
            if h <= lowest {
                // Deeper than remembered: report the lowest known height.
                let hash = theirs.unwrap_or(new.hash);
                break Tip { height: h, hash };
            }
            h -= 1;
        };
        if fork.height < old.height {
            events.push(TipEvent::Reorg {
                fork_point: fork,
                old_tip: old,
            });
            self.known.retain(|height, _| *height <= fork.height);
        }
        for height in fork.height + 1..=new.height {
            let hash = if height == new.height {
                Some(new.hash)
            } else {
                chain.block_hash(height).await?
            };
            let Some(hash) = hash else { break };
            let t = Tip { height, hash };
            self.remember(t);
            events.push(TipEvent::Connected(t));
        }
        self.tip = Some(new);
        Ok(events)
    }

    fn remember(&mut self, t: Tip) {
        self.known.insert(t.height, t.hash);
        while self.known.len() > REMEMBERED_BLOCKS as usize {
            self.known.pop_first();
        }
    }
}
