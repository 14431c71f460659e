//! The peer's entry point: a packet for its channel, creating one when the peer opens.

use std::sync::Arc;

use channel::{AnchorRole, State};
use secp256k1::PublicKey;
use tokio::sync::mpsc;
use wire::Packet;

use super::registry::{Abandoned, Slot};
use super::{unix_now, Manager};

/// Why a packet was refused; the peer is told with an `error` packet and the session ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum Refusal {
    /// The peer opens while too many peers' channels wait for their anchor.
    #[error("Too many channels waiting for their anchor ({0})")]
    TooManyOpenings(usize),
    /// The packet needs a channel, and the peer has none.
    #[error("Unexpected packet {0}")]
    Unexpected(&'static str),
    /// A proposal on a channel whose anchor a reorganisation took below `min_depth`.
    #[error("Anchor not confirmed ({confirmations} of {min_depth} confirmations): no updates until it is")]
    AnchorUnconfirmed {
        /// Confirmations now.
        confirmations: u32,
        /// Confirmations the channel needs.
        min_depth: u32,
    },
    /// The channel could not be created for the peer's open.
    #[error("Cannot open: {0}")]
    CannotOpen(String),
    /// The machine refused the packet (its `ChannelError`, as the peer is told it).
    #[error("{0}")]
    Rejected(String),
    /// Our side failed to act on it (a write): the problem the peer is told.
    #[error("{0}")]
    Failed(String),
}

impl Refusal {
    /// The `error` packet that tells the peer.
    pub(crate) fn reply(&self) -> Packet {
        Packet::error(self.to_string())
    }
}

impl Manager {
    /// A packet from the peer, for its channel (creating one when the peer opens).
    pub(crate) async fn packet(
        &self,
        peer: &PublicKey,
        outbox: &mpsc::Sender<Packet>,
        pkt: Packet,
    ) -> Result<(), Refusal> {
        let mut active = self.channels.active(peer).await;
        if let (Some(slot), Packet::Open(_)) = (&active, &pkt) {
            if self.forget_if_reopened(slot).await {
                active = None;
            }
        }
        let slot = match active {
            Some(slot) => slot,
            None => match &pkt {
                Packet::Open(o) if o.anch == wire::AnchorOffer::WillCreateAnchor => {
                    self.accept_open(peer, outbox).await?
                }
                Packet::Error(e) => {
                    tracing::info!(%peer, problem = e.problem.as_deref().unwrap_or(""), "peer error without a channel");
                    return Ok(());
                }
                other => return Err(Refusal::Unexpected(other.name())),
            },
        };
        let fed = self.feed(&slot, outbox, pkt).await;
        // What the packet queued for other channels, now that its lock is released.
        self.run_forwards().await;
        fed
    }

    /// The funder opens again: it abandoned our half-open channel before broadcasting its
    /// anchor (we hold no money in it). Forgets it, unless the anchor is out; true if so.
    async fn forget_if_reopened(&self, slot: &Slot) -> bool {
        let mut inner = slot.lock().await;
        let stale = inner.channel.state() == State::OpenWaitComplete
            && inner.channel.balances().is_some_and(|cs| !cs.we_fund)
            && self.anchor_depth(&inner.channel).await == 0
            && !self.anchor_in_mempool(&inner.channel).await;
        if stale {
            tracing::info!(peer = %slot.peer, channel = %slot.id, "peer opens again; forgetting the unfunded opening");
            inner.fall_back();
            self.forget_channel(slot, None, Abandoned::Opening).await;
        }
        stale
    }

    /// The peer's `open_channel` with `WILL_CREATE_ANCHOR`: a new accepting channel.
    async fn accept_open(
        &self,
        peer: &PublicKey,
        outbox: &mpsc::Sender<Packet>,
    ) -> Result<Arc<Slot>, Refusal> {
        let _opening = self.openings.lock().await;
        // Our own `open` may have listed a channel since the caller looked: the packet goes
        // to it (one channel per session).
        if let Some(slot) = self.channels.active(peer).await {
            return Ok(slot);
        }
        // Each costs a key, a row and a watch until it is funded or abandoned: strangers
        // with fresh node ids cannot make us hold unlimited openings.
        let waiting = self.openings_waiting_for_their_anchor().await;
        if waiting >= self.settings.max_pending_openings {
            tracing::warn!(%peer, waiting, "opening refused: too many channels waiting for their anchor");
            return Err(Refusal::TooManyOpenings(waiting));
        }
        let slot = self
            .new_channel(peer, AnchorRole::Accept)
            .await
            .map_err(|e| Refusal::CannotOpen(e.to_string()))?;
        let mut inner = slot.lock().await;
        inner.outbox = Some(outbox.clone());
        let actions = inner
            .channel
            .start()
            .map_err(|e| Refusal::Failed(e.to_string()))?;
        self.run_actions(&slot, &mut inner, actions)
            .await
            .map_err(|e| Refusal::Failed(e.to_string()))?;
        drop(inner);
        Ok(slot)
    }

    /// Feeds a packet to its channel under the channel's lock.
    async fn feed(
        &self,
        slot: &Slot,
        outbox: &mpsc::Sender<Packet>,
        pkt: Packet,
    ) -> Result<(), Refusal> {
        let peer = slot.peer;
        let tip = self.tip_for_expiry_checks(slot, &pkt).await;
        // Before our lock: it reads the downstream channel under its own.
        let veto = self.forward_veto(&peer, &pkt, tip).await;
        // R of an HTLC we forwarded is ours to use upstream as soon as the peer shows it,
        // whatever becomes of its update: stored before the channel takes the fulfil, so
        // no crash leaves the downstream HTLC paid and R forgotten.
        if let Packet::UpdateFulfillHtlc(f) = &pkt {
            let state = crate::store::ForwardState::Fulfilled(f.r);
            if let Err(e) = self.forward_ended(slot.id, f.r.hash(), state).await {
                return Err(Refusal::Failed(e.to_string()));
            }
        }
        let mut inner = slot.lock().await;
        if inner.outbox.is_none() {
            inner.outbox = Some(outbox.clone());
        }
        // Never behind a height the watcher set while we asked.
        if let Some(height) = tip.filter(|h| *h >= inner.channel.height()) {
            super::registry::set_height(&mut inner.channel, height);
        }
        // The peer lost our open_complete in a dropped session: say it again.
        if matches!(pkt, Packet::OpenComplete(_)) && inner.channel.state() == State::Normal {
            let again = Packet::OpenComplete(wire::OpenComplete::default());
            self.deliver(slot, &mut inner, again);
            return Ok(());
        }
        tracing::debug!(%peer, packet = pkt.name(), state = inner.channel.state().as_str(), "received");
        if let Some(confirmations) = inner.anchor.suspended {
            // A proposal on a channel whose anchor a reorganisation took away: the money
            // it would move may not exist. An update already in flight may finish.
            if is_proposal(&pkt) && inner.channel.state() == State::Normal {
                tracing::warn!(%peer, channel = %slot.id, confirmations, "proposal refused: the anchor is not confirmed");
                return Err(Refusal::AnchorUnconfirmed {
                    confirmations,
                    min_depth: inner.channel.min_depth(),
                });
            }
        }
        let handled = match veto {
            Some(veto) => inner
                .channel
                .handle_packet_declining(&pkt, unix_now(), veto),
            None => inner.channel.handle_packet(&pkt, unix_now()),
        };
        match handled {
            Ok(actions) => self
                .run_actions(slot, &mut inner, actions)
                .await
                .map_err(|e| Refusal::Failed(e.to_string())),
            Err(rejected) => {
                tracing::warn!(%peer, error = %rejected, "packet rejected");
                // A close we refuse (a fee that would burn our money) still says the peer
                // wants out: the channel closes with our commitment instead.
                if matches!(rejected.error, channel::ChannelError::BadClose(_)) {
                    tracing::warn!(%peer, channel = %slot.id, "close refused; closing on chain");
                    self.close_on_chain(slot, &mut inner).await;
                }
                Err(Refusal::Rejected(rejected.error.to_string()))
            }
        }
    }

    /// Expiry checks depend on the height: for an HTLC packet, ask the chain (a question
    /// sent after the packet came, shared with the checks that came with it), not our
    /// watcher's last pass. Asked before the channel's lock is taken and bounded: a slow or
    /// hung bitcoind must not hold the channel (the owner's control calls, the watcher) for
    /// its RPC time-out; a chain that does not answer in time leaves the height of the last
    /// pass, as an unreachable one always did.
    ///
    /// One exception saves most adds their round trip: an add that ends here (no onion)
    /// whose expiry passes at every height within [`fresh_tip::SLACK`] of a
    /// [`fresh_tip::RECENT`] answer is judged at that answer. The fresh height would give
    /// the same verdict unless more than `SLACK` blocks came (or left, in a reorganisation)
    /// within a second. Every add near a limit, every forward (its outgoing expiry is judged
    /// against the height too) and every timeout still asks: a timeout taken at an older
    /// height could refund an HTLC before its expiry once a reorganisation lowered the chain.
    ///
    /// [`fresh_tip::SLACK`]: super::fresh_tip::SLACK
    /// [`fresh_tip::RECENT`]: super::fresh_tip::RECENT
    async fn tip_for_expiry_checks(&self, slot: &Slot, pkt: &Packet) -> Option<u32> {
        match pkt {
            Packet::UpdateAddHtlc(add) if add.onion.is_none() => {
                if let Some(recent) = self.fresh_tip.recent() {
                    let (low, high) = (
                        recent.saturating_sub(super::fresh_tip::SLACK),
                        recent.saturating_add(super::fresh_tip::SLACK),
                    );
                    let now = unix_now();
                    let inner = slot.lock().await;
                    let same = inner.channel.add_expiry_passes_at(add.expiry, low, now)
                        && inner.channel.add_expiry_passes_at(add.expiry, high, now);
                    drop(inner);
                    if same {
                        return Some(recent);
                    }
                }
                self.fresh_tip.height(&self.chain).await
            }
            Packet::UpdateAddHtlc(_) | Packet::UpdateTimedoutHtlc(_) => {
                self.fresh_tip.height(&self.chain).await
            }
            _ => None,
        }
    }
}

/// Packets that propose an update.
fn is_proposal(pkt: &Packet) -> bool {
    matches!(
        pkt,
        Packet::Update(_)
            | Packet::UpdateAddHtlc(_)
            | Packet::UpdateFulfillHtlc(_)
            | Packet::UpdateTimedoutHtlc(_)
            | Packet::UpdateRoutefailHtlc(_)
    )
}
