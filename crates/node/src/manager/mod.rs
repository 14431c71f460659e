//! The channel manager: the registry of channels and the entry points the shell calls —
//! [`Manager::open`] and [`Manager::command`] from the control API, [`Manager::packet`],
//! [`Manager::session_up`] and [`Manager::session_down`] from the peer tasks,
//! [`Manager::block`] and [`Manager::tick`] from the chain watcher.
//!
//! Each entry point locks the channel's [`Slot`], feeds its sans-IO [`channel::Channel`]
//! and hands the resulting actions to `exec` (the manager's only IO). The policies it
//! applies are pure: [`anchor::AnchorWatch::observe`] and [`timers::due`].

mod anchor;
mod command;
mod crash;
mod exec;
pub(crate) mod forward;
pub(crate) mod fresh_tip;
mod invoice;
mod onchain_forward;
mod packet;
mod registry;
mod relay;
pub(crate) mod route;
pub(crate) mod states;
mod timers;

use std::sync::Arc;
use std::time::Duration;

use chain::Chain;
use channel::{AnchorRole, Channel, ChannelConfig, ChannelSecrets, State};
use secp256k1::PublicKey;
use tokio::sync::mpsc;
use wire::Packet;

pub(crate) use command::Command;
pub(crate) use crash::CrashStep;
pub(crate) use exec::ExecError;
pub(crate) use packet::Refusal;
pub(crate) use registry::{lock, Abandoned, Slot, SlotInner};
pub(crate) use relay::ForwardCounts;

use crate::control_error::ControlError;
use crate::peers::Peers;
use crate::store::{ChannelId, ChannelRow, MetaKey, Store};
use crate::wallet::NodeWallet;
use crate::NodeError;

/// The node's policies for its channels (from [`crate::NodeConfig`]).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Limits and offers of new channels.
    pub(crate) channel: ChannelConfig,
    /// Blocks an anchor may stay unseen before its channel is given up.
    pub(crate) anchor_wait_blocks: u32,
    /// How long an update may stay in flight before the session is dropped.
    pub(crate) update_timeout: Duration,
    /// How long a control call waits for its exchange to complete.
    pub(crate) command_timeout: Duration,
    /// At most this many channels opened by peers may wait for their anchor at once.
    pub(crate) max_pending_openings: usize,
    /// Our forwarding fee and expiry delta.
    pub(crate) forward: route::Schedule,
    /// Our bounds on forwards in flight.
    pub(crate) forward_limits: forward::Limits,
    /// TEST ONLY: keep every commitment signed, for `dev-broadcast-revoked`.
    #[cfg(feature = "test-hooks")]
    pub(crate) cheat_enabled: bool,
    /// TEST ONLY: the forward step at which the node dies ([`CrashStep`]).
    #[cfg(any(test, feature = "test-hooks"))]
    pub(crate) crash_at: Option<String>,
}

/// The registry of channels and what feeding them needs.
pub(crate) struct Manager {
    pub(crate) channels: registry::Channels,
    pub(crate) settings: Settings,
    store: Store,
    chain: Arc<dyn Chain>,
    wallet: Arc<NodeWallet>,
    peers: Arc<Peers>,
    /// Our node key: it peels the onions of incoming HTLCs.
    node_key: secp256k1::SecretKey,
    /// The invoices, in memory beside the store.
    pub(crate) invoices: invoice::Invoices,
    /// The forwards, in memory beside the store, and the work they queue.
    forwards: relay::Forwards,
    /// Our payments along a route, until their first HTLC ends.
    payment_ends: route::PaymentEnds,
    /// Held from the check that a peer has no channel until its new channel is listed, so
    /// that two openings with one peer (two `open` calls, or ours and the peer's) cannot
    /// both pass the check.
    openings: tokio::sync::Mutex<()>,
    /// The chain's height for incoming HTLCs' expiry checks.
    fresh_tip: fresh_tip::FreshTip,
    /// Set when the node died at a crash point (in-process tests).
    #[cfg(test)]
    crashed: tokio::sync::watch::Sender<bool>,
}

/// Seconds since the Unix epoch (0 if the clock is before it), for the machine's expiries.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Manager {
    pub(crate) fn new(
        settings: Settings,
        store: Store,
        chain: Arc<dyn Chain>,
        wallet: Arc<NodeWallet>,
        peers: Arc<Peers>,
        node_key: secp256k1::SecretKey,
    ) -> Manager {
        Manager {
            channels: registry::Channels::default(),
            settings,
            store,
            chain,
            wallet,
            peers,
            node_key,
            invoices: invoice::Invoices::default(),
            forwards: relay::Forwards::default(),
            payment_ends: route::PaymentEnds::default(),
            openings: tokio::sync::Mutex::new(()),
            fresh_tip: fresh_tip::FreshTip::default(),
            #[cfg(test)]
            crashed: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Loads the stored channels at start, applying the restart rules (a restart is a lost
    /// session: an unfunded opening is abandoned, an interrupted update closes on chain).
    ///
    /// # Errors
    /// A stored channel names a peer that is not a node id (its money would be hidden), or
    /// the database failed.
    pub(crate) async fn load(&self, rows: Vec<ChannelRow>) -> Result<(), NodeError> {
        // Before the channels: a restart between an invoice's payment and its fulfil
        // settles the HTLC again when its peer is back.
        self.load_invoices().await?;
        self.load_forwards().await?;
        for row in rows {
            let slot = Slot::new(row.id, row.peer, row.channel);
            self.channels.add(Arc::clone(&slot));
            let mut inner = slot.lock().await;
            self.settle_after_session(&slot, &mut inner).await;
            // A close signed by both is saved before it is queued: a crash in between left it
            // only in the channel's state. Queued again (a no-op once it is in the queue).
            if let Some(close) = inner.channel.signed_close() {
                self.store.queue_broadcast(row.id, close, 0, 0).await?;
            }
        }
        self.reconcile_forwards().await?;
        self.reconcile_onchain_forwards()
            .await
            .map_err(|e| NodeError::Load(Box::new(e)))?;
        Ok(())
    }

    /// Creates the keys of a new channel from the wallet (so that its payouts are wallet
    /// funds), stores it and lists it.
    async fn new_channel(
        &self,
        peer: &PublicKey,
        role: AnchorRole,
    ) -> Result<Arc<Slot>, ControlError> {
        let index = self.store.next_index(MetaKey::NextChannel).await?;
        let keys = self.wallet.channel_keys(index)?;
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed)
            .map_err(|e| ControlError::Internal(format!("no randomness: {e}")))?;
        let channel = Channel::new(
            self.settings.channel.clone(),
            ChannelSecrets {
                commit_key: keys.commit,
                final_key: keys.final_key,
                revocation_seed: seed,
            },
            role,
        );
        let id = ChannelId::of_index(index);
        self.store.insert_channel(id, peer, &channel).await?;
        let slot = Slot::new(id, *peer, channel);
        self.channels.add(Arc::clone(&slot));
        Ok(slot)
    }

    /// A chain pass found new blocks (or a reorganisation, or it is the first after a
    /// start): every channel learns the height and the fee rate, and its anchor is looked at.
    pub(crate) async fn block(&self, height: u32, fee_rate_sat_per_kwu: u64) {
        for slot in self.channels.all() {
            let mut inner = slot.lock().await;
            inner.channel.set_fee_rate(fee_rate_sat_per_kwu);
            registry::set_height(&mut inner.channel, height);
            self.watch_anchor(&slot, &mut inner, height).await;
        }
    }

    /// A reorganisation went back to `fork`: what the channels learnt above it is undone.
    pub(crate) async fn rewound(&self, fork: u32) {
        for slot in self.channels.all() {
            slot.lock().await.anchor.rewound(fork);
        }
    }

    /// A session with `peer` came up: attach its outbox and resume the channel.
    pub(crate) async fn session_up(&self, peer: &PublicKey, outbox: mpsc::Sender<Packet>) {
        let Some(slot) = self.channels.active(peer).await else {
            return;
        };
        let mut inner = slot.lock().await;
        inner.outbox = Some(outbox);
        // A forward that ended while the peer was away (or before a restart) settles
        // its HTLC with the peer once this call releases the lock; so does any HTLC the
        // peer offered us whose settlement (an invoice's fulfil, a failure) the lost
        // session undid: no other input may come to run the settlement pass.
        let settle = self.has_ended_forwards(slot.id)
            || inner
                .channel
                .balances()
                .is_some_and(|cs| !cs.theirs.htlcs.is_empty());
        tracing::info!(%peer, channel = %slot.id, state = inner.channel.state().as_str(), "channel resumes");
        if inner.channel.state() == State::OpenWaitComplete {
            let height = self.store.meta(MetaKey::ScannedHeight).await.unwrap_or(0);
            let height = u32::try_from(height).unwrap_or(0);
            self.watch_anchor(&slot, &mut inner, height).await;
        }
        // What survives a lost session is said again: after our `close_channel` (the peer
        // may never have read it) the same close, so that it completes.
        match inner.channel.reconnected() {
            Ok(actions) if actions.is_empty() => {}
            Ok(actions) => {
                tracing::info!(%peer, channel = %slot.id, "saying the interrupted close again");
                if let Err(e) = self.run_actions(&slot, &mut inner, actions).await {
                    tracing::error!(%peer, channel = %slot.id, error = %crate::error_report::Causes(&e), "cannot resume the close");
                }
            }
            Err(e) => {
                tracing::error!(%peer, channel = %slot.id, error = %crate::error_report::Causes(&e), "cannot resume the channel")
            }
        }
        drop(inner);
        if settle {
            self.settle_later(slot.id);
            self.run_forwards().await;
        }
    }

    /// The session with `peer` ended: fall back to what is on disk, and close where the protocol cannot resume.
    pub(crate) async fn session_down(&self, peer: &PublicKey) {
        let Some(slot) = self.channels.active(peer).await else {
            return;
        };
        let mut inner = slot.lock().await;
        inner.outbox = None;
        if inner.fall_back_keeping_preimages() {
            // The fallback state plus R: also after a restart the node claims in time.
            if let Err(e) = self.persist(&slot, &mut inner, &[]).await {
                tracing::error!(%peer, channel = %slot.id, error = %crate::error_report::Causes(&e), "cannot persist a revealed R");
            }
        }
        let why = if matches!(
            inner.channel.state(),
            State::WaitComplete | State::WaitSignature
        ) {
            format!("peer {peer} disconnected before revoking its old state; the channel closes on chain with this update included")
        } else {
            format!("peer {peer} disconnected; the update did not happen")
        };
        inner.complete_waiter(Err(ControlError::PeerGone(why)));
        self.settle_after_session(&slot, &mut inner).await;
        slot.changed.notify_waiters();
    }

    /// After a lost session or a restart: abandon an unfunded opening; close an interrupted update on chain.
    async fn settle_after_session(&self, slot: &Slot, inner: &mut SlotInner) {
        let state = inner.channel.state();
        if state.is_opening() {
            tracing::info!(peer = %slot.peer, channel = %slot.id, state = state.as_str(), "opening abandoned (anchor never broadcast)");
            let anchor = inner.channel.anchor_outpoint().map(|o| o.txid);
            self.forget_channel(slot, anchor, Abandoned::Opening).await;
        } else if state == State::OpenWaitComplete {
            // A crash between persisting and broadcasting must not leave the anchor unsent.
            if let Some(tx) = inner.channel.anchor_tx().cloned() {
                if self.anchor_depth(&inner.channel).await == 0 {
                    self.broadcast(slot.id, &tx).await;
                }
            }
        } else if matches!(state, State::WaitComplete | State::WaitSignature) {
            // We revoked our old commitment but do not hold the peer's revocation, or we
            // signed the peer's next commitment (persisted since the channel crate's
            // update_accept persists): the protocol has no way to finish this update, so
            // close with our latest (valid) state.
            tracing::warn!(peer = %slot.peer, channel = %slot.id, "update interrupted; closing unilaterally");
            self.close_on_chain(slot, inner).await;
        }
    }

    /// Channels opened by peers that are not live yet (their anchor not confirmed).
    async fn openings_waiting_for_their_anchor(&self) -> usize {
        let mut n = 0;
        for slot in self.channels.all() {
            let inner = slot.lock().await;
            let state = inner.channel.state();
            let theirs = inner.channel.balances().is_none_or(|cs| !cs.we_fund);
            if theirs && (state.is_opening() || state == State::OpenWaitComplete) {
                n += 1;
            }
        }
        n
    }

    /// Test-only: broadcasts an old, revoked commitment of ours (enabled by `--dev-allow-cheat`).
    #[cfg(feature = "test-hooks")]
    pub(crate) async fn broadcast_revoked(
        &self,
        peer: &PublicKey,
    ) -> Result<bitcoin::Txid, ControlError> {
        if !self.settings.cheat_enabled {
            return Err(ControlError::CheatDisabled);
        }
        let slot = self
            .channels
            .latest(peer)
            .ok_or(ControlError::NoChannel(*peer))?;
        let num = slot.lock().await.channel.commitment_number();
        let tx = self
            .store
            .revoked_for_tests(slot.id, num)
            .await?
            .ok_or_else(|| ControlError::Internal("no revoked commitment saved".into()))?;
        Ok(self.chain.broadcast(tx).await?)
    }
}
