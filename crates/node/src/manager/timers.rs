//! The channel deadlines the node enforces on every watcher pass: an update that stalls,
//! and HTLCs that must be claimed or refunded on chain before the peer can take them.
//!
//! [`due`] is the policy: it reads what is tracked of a channel, the height and the time
//! (both passed in; no clock is read here) and names the one thing due, if any.
//! [`Manager::tick`] gathers [`Tracked`] under the channel's lock and carries [`Due`] out.

use std::time::{Duration, Instant};

use channel::{Deadlines, Htlc, State};
use wire::{Locktime, Sha256};

use bitcoin::hashes::Hash as _;

use super::registry::{Slot, SlotInner};
use super::{states, Manager};

/// What the deadlines look at of one channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tracked {
    /// The channel's state.
    pub(crate) state: State,
    /// Whether a session with the peer is up (its outbox is attached).
    pub(crate) connected: bool,
    /// Whether its anchor is below `min_depth` (no update is proposed then).
    pub(crate) suspended: bool,
    /// When the update in flight was first seen in flight (`None`: no update in flight).
    pub(crate) update_since: Option<Instant>,
    /// HTLCs whose on-chain deadline has come, as the channel judges them.
    pub(crate) deadlines: Deadlines,
    /// The HTLCs we offered, in the current commitment.
    pub(crate) offered: Vec<Htlc>,
}

/// Something a deadline asks of the node now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Due {
    /// An HTLC offered to us whose R we know nears its expiry: close on chain and claim it.
    Claim {
        /// How many.
        htlcs: usize,
    },
    /// An expired HTLC of ours was not removed by agreement in time: close on chain and
    /// refund it.
    Refund,
    /// The update in flight outlived `update_timeout`: the peer stalls; drop the session.
    DropSession {
        /// How long it has been in flight.
        elapsed: Duration,
    },
    /// The update is still in flight, without a session, twice `update_timeout` after it
    /// began: the protocol cannot resume it; close on chain with our valid commitment.
    UpdateNeverResumed,
    /// Ask the peer to remove an expired HTLC of ours (`update_timedout_htlc`).
    TimeOut(Sha256),
}

/// The deadline due for a channel at `height` and `now`, if any, in the order they are
/// enforced (a stalled session is dropped first, which may make a close due). `update_timeout` is how long an update may stay in
/// flight before the session is dropped.
pub(crate) fn due(
    tracked: &Tracked,
    height: u32,
    now: Instant,
    update_timeout: Duration,
) -> Option<Due> {
    let state = tracked.state;
    if let Some(since) = tracked.update_since.filter(|_| state.is_updating()) {
        let elapsed = now.saturating_duration_since(since);
        if elapsed >= update_timeout && tracked.connected {
            return Some(Due::DropSession { elapsed });
        }
        if elapsed >= update_timeout * 2 && !tracked.connected {
            return Some(Due::UpdateNeverResumed);
        }
    }
    // Whatever the state: a peer that stalls mid-update must not keep our HTLC past expiry.
    let running = states::is_running(state);
    if running && !tracked.deadlines.claim.is_empty() {
        return Some(Due::Claim {
            htlcs: tracked.deadlines.claim.len(),
        });
    }
    if running && !tracked.deadlines.refund.is_empty() {
        return Some(Due::Refund);
    }
    if !tracked.connected || state != State::Normal || tracked.suspended {
        return None;
    }
    tracked
        .offered
        .iter()
        .find(|h| matches!(h.expiry, Locktime::Blocks(b) if b <= height))
        .map(|h| Due::TimeOut(h.r_hash))
}

impl Manager {
    /// A watcher pass's timers for one channel at `height` and `now`: carries out what
    /// [`due`] says, again after a dropped session (which may make a close due).
    pub(crate) async fn tick(&self, slot: &Slot, height: u32, now: Instant) {
        let mut inner = slot.lock().await;
        // The update clock starts when an update is first seen in flight.
        if inner.channel.state().is_updating() {
            inner.update_since.get_or_insert(now);
        } else {
            inner.update_since = None;
        }
        let unix_now = super::unix_now();
        loop {
            let tracked = Tracked {
                state: inner.channel.state(),
                connected: inner.outbox.is_some(),
                suspended: inner.anchor.suspended.is_some(),
                update_since: inner.update_since,
                deadlines: inner.channel.deadlines(unix_now),
                offered: inner
                    .channel
                    .balances()
                    .map(|cs| cs.ours.htlcs.clone())
                    .unwrap_or_default(),
            };
            let Some(due) = due(&tracked, height, now, self.settings.update_timeout) else {
                return;
            };
            if !self.carry_out(slot, &mut inner, due, unix_now).await {
                return;
            }
        }
    }

    /// Performs what is due; true when the deadlines should be asked again.
    async fn carry_out(&self, slot: &Slot, inner: &mut SlotInner, due: Due, now: u64) -> bool {
        let (peer, id) = (slot.peer, slot.id);
        match due {
            Due::Claim { htlcs } => {
                tracing::warn!(%peer, channel = %id, htlcs, "an HTLC we can claim with R nears its expiry; closing on chain");
                self.close_on_chain(slot, inner).await;
            }
            Due::Refund => {
                tracing::warn!(%peer, channel = %id, "an expired HTLC of ours was not removed by agreement; closing on chain");
                self.close_on_chain(slot, inner).await;
            }
            Due::DropSession { elapsed } => {
                tracing::warn!(%peer, channel = %id, ?elapsed, "update not completed in time; dropping the session");
                inner.outbox = None;
                self.peers.kick(&peer, "Update timed out");
                return true;
            }
            Due::UpdateNeverResumed => {
                tracing::warn!(%peer, channel = %id, state = inner.channel.state().as_str(), "update never resumed; closing unilaterally");
                self.close_on_chain(slot, inner).await;
            }
            Due::TimeOut(r_hash) => match inner.channel.timeout_htlc(r_hash, now) {
                Ok(actions) => {
                    tracing::info!(%peer, r_hash = %hex::encode(r_hash.as_byte_array()), "timing out expired HTLC");
                    if let Err(e) = self.run_actions(slot, inner, actions).await {
                        tracing::error!(%peer, channel = %id, error = %crate::error_report::Causes(&e), "timing out an HTLC failed");
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %crate::error_report::Causes(&e), "cannot time out yet")
                }
            },
        }
        false
    }

    /// A deadline closes the channel with our commitment. A failure here leaves money at
    /// risk, so it is logged as an error every pass until it works; it is never dropped.
    pub(crate) async fn close_on_chain(&self, slot: &Slot, inner: &mut SlotInner) {
        match inner.channel.force_close() {
            Ok(actions) => {
                if let Err(e) = self.run_actions(slot, inner, actions).await {
                    tracing::error!(peer = %slot.peer, channel = %slot.id, error = %crate::error_report::Causes(&e), "closing on chain failed");
                }
            }
            Err(e) => {
                tracing::error!(peer = %slot.peer, channel = %slot.id, error = %crate::error_report::Causes(&e), state = inner.channel.state().as_str(), "cannot close on chain")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(60);

    fn htlc(byte: u8, expiry: Locktime) -> Htlc {
        Htlc {
            amount_msat: 1_000_000,
            r_hash: Sha256::from_byte_array([byte; 32]),
            expiry,
        }
    }

    /// A live, connected channel with nothing due.
    fn idle() -> Tracked {
        Tracked {
            state: State::Normal,
            connected: true,
            suspended: false,
            update_since: None,
            deadlines: Deadlines::default(),
            offered: Vec::new(),
        }
    }

    fn updating(since: Instant, connected: bool) -> Tracked {
        Tracked {
            state: State::WaitSignature,
            connected,
            update_since: Some(since),
            ..idle()
        }
    }

    fn with_deadlines(state: State, claim: Vec<Htlc>, refund: Vec<Htlc>) -> Tracked {
        Tracked {
            state,
            deadlines: Deadlines { refund, claim },
            ..idle()
        }
    }

    #[test]
    fn a_stalled_update_drops_the_session_then_closes_on_chain_if_never_resumed() {
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        let table: &[(Tracked, Instant, Option<Due>)] = &[
            (updating(t0, true), at(59), None),
            (
                updating(t0, true),
                at(60),
                Some(Due::DropSession {
                    elapsed: Duration::from_secs(60),
                }),
            ),
            (updating(t0, false), at(60), None),
            (updating(t0, false), at(119), None),
            (updating(t0, false), at(120), Some(Due::UpdateNeverResumed)),
            // Not in flight any more: a stale start is no deadline.
            (
                Tracked {
                    update_since: Some(t0),
                    ..idle()
                },
                at(1_000),
                None,
            ),
            // In flight, but the clock has not started (the next tick starts it).
            (
                Tracked {
                    state: State::WaitAccept,
                    ..idle()
                },
                at(1_000),
                None,
            ),
        ];
        for (tracked, now, expected) in table {
            assert_eq!(&due(tracked, 100, *now, TIMEOUT), expected, "{tracked:?}");
        }
    }

    #[test]
    fn an_htlc_deadline_closes_a_running_channel_whatever_its_session() {
        let h = htlc(1, Locktime::Blocks(100));
        let now = Instant::now();
        let table: &[(Tracked, Option<Due>)] = &[
            (
                with_deadlines(State::Normal, vec![h], vec![]),
                Some(Due::Claim { htlcs: 1 }),
            ),
            (
                Tracked {
                    connected: false,
                    ..with_deadlines(State::WaitComplete, vec![h, h], vec![])
                },
                Some(Due::Claim { htlcs: 2 }),
            ),
            (
                with_deadlines(State::Normal, vec![], vec![h]),
                Some(Due::Refund),
            ),
            (
                Tracked {
                    suspended: true,
                    ..with_deadlines(State::CloseWaitComplete, vec![], vec![h])
                },
                Some(Due::Refund),
            ),
            // The claim comes before the refund: both close, the claim says more.
            (
                with_deadlines(State::Normal, vec![h], vec![h]),
                Some(Due::Claim { htlcs: 1 }),
            ),
            // Not running: nothing to close.
            (
                with_deadlines(State::OpenWaitComplete, vec![h], vec![h]),
                None,
            ),
            (with_deadlines(State::OnChain, vec![h], vec![h]), None),
            (with_deadlines(State::Closed, vec![], vec![h]), None),
        ];
        for (tracked, expected) in table {
            assert_eq!(&due(tracked, 100, now, TIMEOUT), expected, "{tracked:?}");
        }
    }

    #[test]
    fn an_expired_htlc_of_ours_is_timed_out_by_agreement_only_on_a_live_connected_channel() {
        let expiring = htlc(7, Locktime::Blocks(100));
        let offered = Tracked {
            offered: vec![htlc(6, Locktime::Blocks(200)), expiring],
            ..idle()
        };
        let now = Instant::now();
        let table: &[(Tracked, u32, Option<Due>)] = &[
            (offered.clone(), 99, None),
            (offered.clone(), 100, Some(Due::TimeOut(expiring.r_hash))),
            (offered.clone(), 150, Some(Due::TimeOut(expiring.r_hash))),
            (
                Tracked {
                    connected: false,
                    ..offered.clone()
                },
                150,
                None,
            ),
            (
                Tracked {
                    suspended: true,
                    ..offered.clone()
                },
                150,
                None,
            ),
            (
                Tracked {
                    state: State::CloseWaitAck,
                    ..offered.clone()
                },
                150,
                None,
            ),
            // An expiry in seconds is never timed out by height.
            (
                Tracked {
                    offered: vec![htlc(8, Locktime::Seconds(1))],
                    ..idle()
                },
                u32::MAX,
                None,
            ),
        ];
        for (tracked, height, expected) in table {
            assert_eq!(
                &due(tracked, *height, now, TIMEOUT),
                expected,
                "{height} {tracked:?}"
            );
        }
    }

    /// A stalled update with an HTLC deadline: the session goes first (the shell asks
    /// again, now disconnected, and the close follows in the same tick).
    #[test]
    fn a_dropped_session_comes_before_the_close_it_makes_due() {
        let t0 = Instant::now();
        let h = htlc(1, Locktime::Blocks(100));
        let mut tracked = Tracked {
            deadlines: Deadlines {
                refund: vec![h],
                claim: vec![],
            },
            ..updating(t0, true)
        };
        let now = t0 + TIMEOUT;
        assert!(matches!(
            due(&tracked, 100, now, TIMEOUT),
            Some(Due::DropSession { .. })
        ));
        tracked.connected = false;
        assert_eq!(due(&tracked, 100, now, TIMEOUT), Some(Due::Refund));
    }
}
