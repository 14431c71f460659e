//! Forwarding (issue 30): an incoming HTLC whose onion names a next hop, accepted after
//! [`super::forward`]'s check, is offered on to that hop; how the downstream HTLC ends
//! settles the upstream one (fulfilled with R, or routefailed).
//!
//! Every step is durable before the packet that depends on it leaves: the forward is
//! stored before the downstream offer, its outcome before the upstream fulfil or
//! routefail. No channel lock is taken while another is held: the channel that learns
//! something queues the work for the other, done once its own lock is released
//! ([`Manager::run_forwards`], after every packet, control call and watcher pass).

use std::collections::HashMap;

#[cfg(any(test, feature = "test-hooks"))]
use channel::{Change, Who};
use channel::{Htlc, State};
use wire::{Locktime, Sha256};

use super::exec::ExecError;
use super::invoice::{FailReason, Verdict};
use super::registry::{lock, Slot};
use super::CrashStep;
use super::{unix_now, Manager};
use crate::store::{ChannelId, ForwardRow, ForwardState};

/// How many forwards ended each way, and what the fulfilled ones earned (the node's log
/// and `listforwards`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ForwardCounts {
    /// Fulfilled: R came back and went upstream.
    pub(crate) fulfilled: usize,
    /// Failed: routefailed upstream.
    pub(crate) failed: usize,
    /// Still offered downstream.
    pub(crate) in_flight: usize,
    /// The fees of the fulfilled ones, in msat.
    pub(crate) fees_earned_msat: u64,
}

impl ForwardCounts {
    /// The counts of `forwards`.
    pub(crate) fn of<'a>(forwards: impl Iterator<Item = &'a ForwardRow>) -> ForwardCounts {
        let mut c = ForwardCounts::default();
        for f in forwards {
            match f.state {
                ForwardState::Fulfilled(_) => {
                    c.fulfilled += 1;
                    c.fees_earned_msat += u64::from(f.in_msat.saturating_sub(f.out_msat));
                }
                ForwardState::Failed => c.failed += 1,
                ForwardState::Offered => c.in_flight += 1,
            }
        }
        c
    }
}

/// A forward's key: the incoming channel and the HTLC's hash.
type Key = (ChannelId, Sha256);

/// Work for a channel other than the one whose lock is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    /// Offer the forward's downstream HTLC.
    Offer(Key),
    /// Let the channel settle its incoming HTLCs (a forward of it ended downstream).
    Settle(ChannelId),
}

/// The forwards, in memory beside the store, and the queued work.
#[derive(Default)]
pub(crate) struct Forwards {
    by_key: std::sync::Mutex<HashMap<Key, ForwardRow>>,
    work: std::sync::Mutex<Vec<Work>>,
}

impl Forwards {
    fn get(&self, key: &Key) -> Option<ForwardRow> {
        lock(&self.by_key).get(key).cloned()
    }

    fn insert(&self, f: ForwardRow) {
        lock(&self.by_key).insert((f.in_channel, f.r_hash), f);
    }

    fn push(&self, work: Work) {
        let mut queue = lock(&self.work);
        if !queue.contains(&work) {
            queue.push(work);
        }
    }
}

impl Manager {
    /// Reads the stored forwards (at start): a downstream fulfil arriving after a restart
    /// still settles the upstream HTLC.
    pub(crate) async fn load_forwards(&self) -> Result<(), crate::store::StoreError> {
        for f in self.store.forwards().await? {
            self.forwards.insert(f);
        }
        Ok(())
    }

    /// After the channels are loaded: a forward still `offered` whose outgoing channel
    /// holds no HTLC of ours for it failed downstream, or its offer never left, before a
    /// restart (R, had it come, would be stored: it is written before the channel takes
    /// the fulfil). It fails, and its incoming HTLC is failed back when its peer is back.
    pub(super) async fn reconcile_forwards(&self) -> Result<(), crate::store::StoreError> {
        let offered: Vec<ForwardRow> = lock(&self.forwards.by_key)
            .values()
            .filter(|f| f.state == ForwardState::Offered)
            .cloned()
            .collect();
        for f in offered {
            let out = match self.channels.by_id(f.out_channel) {
                Some(slot) => {
                    let inner = slot.lock().await;
                    inner
                        .channel
                        .balances()
                        .is_some_and(|cs| cs.ours.htlcs.iter().any(|h| h.r_hash == f.r_hash))
                }
                None => false,
            };
            if !out {
                tracing::info!(channel = %f.out_channel, upstream = %f.in_channel, "forward never completed downstream before the restart; failing it upstream");
                self.store
                    .set_forward_state(f.in_channel, &f.r_hash, ForwardState::Failed)
                    .await?;
                self.forwards.insert(ForwardRow {
                    state: ForwardState::Failed,
                    ..f
                });
            }
        }
        Ok(())
    }

    /// Copies of the forwards `keep` selects.
    pub(super) fn forwards_matching(&self, keep: impl Fn(&ForwardRow) -> bool) -> Vec<ForwardRow> {
        lock(&self.forwards.by_key)
            .values()
            .filter(|f| keep(f))
            .cloned()
            .collect()
    }

    /// Whether an HTLC that came in on channel `id` was forwarded and ended downstream.
    pub(super) fn has_ended_forwards(&self, id: ChannelId) -> bool {
        lock(&self.forwards.by_key)
            .values()
            .any(|f| f.in_channel == id && f.state != ForwardState::Offered)
    }

    /// Forwards still `offered` (on channel `out`, or on every channel) and the sum of
    /// their outgoing amounts.
    pub(super) fn forwards_in_flight(&self, out: Option<ChannelId>) -> (usize, u64) {
        lock(&self.forwards.by_key)
            .values()
            .filter(|f| f.state == ForwardState::Offered && out.is_none_or(|c| f.out_channel == c))
            .fold((0, 0), |(n, msat), f| (n + 1, msat + u64::from(f.out_msat)))
    }

    /// The node's forward counts (for the log).
    fn forward_counts(&self) -> ForwardCounts {
        ForwardCounts::of(lock(&self.forwards.by_key).values())
    }

    /// Queues channel `id` to settle its incoming HTLCs at the next [`Self::run_forwards`].
    pub(super) fn settle_later(&self, id: ChannelId) {
        self.forwards.push(Work::Settle(id));
    }

    /// `listforwards`: every forward, oldest first.
    pub(crate) async fn list_forwards(
        &self,
    ) -> Result<Vec<ForwardRow>, crate::control_error::ControlError> {
        Ok(self.store.forwards().await?)
    }

    /// The peer of channel `id`, if it is known.
    pub(crate) fn peer_of(&self, id: ChannelId) -> Option<secp256k1::PublicKey> {
        self.channels.by_id(id).map(|s| s.peer)
    }

    /// The verdict for an incoming HTLC on `slot` whose onion names a next hop: `None`
    /// while its forward is under way (the first time: the forward is stored and its
    /// downstream offer queued); fulfil or fail once the downstream HTLC ended.
    pub(super) async fn forward_verdict(
        &self,
        slot: &Slot,
        htlc: &Htlc,
        onion: &wire::Onion,
    ) -> Result<Option<Verdict>, ExecError> {
        let key = (slot.id, htlc.r_hash);
        if let Some(f) = self.forwards.get(&key) {
            return Ok(match f.state {
                ForwardState::Offered => None,
                ForwardState::Fulfilled(r) => Some(Verdict::Fulfill(r)),
                ForwardState::Failed => Some(Verdict::Fail(FailReason::CannotRoute)),
            });
        }
        let Some((payload, next, next_onion)) = self.forward_plan(onion, &htlc.r_hash) else {
            return Ok(Some(Verdict::Fail(FailReason::BadOnion)));
        };
        // Read without its lock (ours is held); the offer checks it under its own.
        let out = self.channels.latest(&next).filter(|_| next != slot.peer);
        let (Some(out), Locktime::Blocks(out_expiry)) = (out, payload.expiry) else {
            return Ok(Some(Verdict::Fail(FailReason::CannotRoute)));
        };
        let f = ForwardRow {
            in_channel: slot.id,
            r_hash: htlc.r_hash,
            in_msat: htlc.amount_msat,
            out_channel: out.id,
            out_peer: next,
            out_msat: payload.amount_msat,
            out_expiry,
            onion: next_onion,
            state: ForwardState::Offered,
            created_at: unix_now(),
        };
        // Durable before the downstream offer leaves: after a restart the downstream
        // HTLC's end still finds the upstream one.
        self.store.add_forward(&f).await?;
        self.crash_point(CrashStep::ForwardStored).await;
        tracing::info!(peer = %slot.peer, next = %next, in_msat = f.in_msat, out_msat = f.out_msat, "forwarding an HTLC");
        self.forwards.insert(f);
        self.forwards.push(Work::Offer(key));
        Ok(None)
    }

    /// The HTLC with `r_hash` that we offered on channel `out` ended as `state`: the
    /// forward it belongs to, if any, records it (durably) and its upstream channel is
    /// queued to settle.
    pub(super) async fn forward_ended(
        &self,
        out: ChannelId,
        r_hash: Sha256,
        state: ForwardState,
    ) -> Result<(), ExecError> {
        let found = lock(&self.forwards.by_key)
            .values()
            .find(|f| {
                f.out_channel == out && f.r_hash == r_hash && f.state == ForwardState::Offered
            })
            .cloned();
        let Some(mut f) = found else {
            return Ok(());
        };
        self.store
            .set_forward_state(f.in_channel, &r_hash, state)
            .await?;
        self.crash_point(CrashStep::OutcomeStored).await;
        f.state = state;
        let upstream = f.in_channel;
        self.forwards.insert(f);
        // The node's forward counts, in its log.
        let counts = self.forward_counts();
        tracing::info!(
            channel = %out,
            %upstream,
            state = state.as_str(),
            fulfilled = counts.fulfilled,
            failed = counts.failed,
            in_flight = counts.in_flight,
            fees_earned_msat = counts.fees_earned_msat,
            "forwarded HTLC ended downstream"
        );
        self.forwards.push(Work::Settle(upstream));
        Ok(())
    }

    /// The crash points at the end of a forward's updates: our offer downstream, and our
    /// fulfil or routefail upstream, committed.
    #[cfg(any(test, feature = "test-hooks"))]
    pub(super) async fn crash_after_update(&self, id: ChannelId, by: Who, change: &Change) {
        let step = {
            let forwards = lock(&self.forwards.by_key);
            // Whether a forward of `r_hash` goes out (or comes in) on this channel.
            let has = |out: bool, r_hash: Sha256| {
                forwards.values().any(|f| {
                    let channel = if out { f.out_channel } else { f.in_channel };
                    f.r_hash == r_hash && channel == id
                })
            };
            match (by, change) {
                (Who::Us, Change::AddHtlc(h)) if has(true, h.r_hash) => {
                    CrashStep::DownstreamCommitted
                }
                (Who::Us, Change::Fulfill(r)) if has(false, r.hash()) => {
                    CrashStep::UpstreamCommitted
                }
                (Who::Us, Change::Routefail(h)) if has(false, *h) => CrashStep::UpstreamCommitted,
                _ => return,
            }
        };
        self.crash_point(step).await;
    }

    /// Does the queued forwarding work, each channel under its own lock (none held by the
    /// caller). An offer whose channel is busy waits for the next call.
    pub(crate) async fn run_forwards(&self) {
        let mut later = Vec::new();
        loop {
            let batch = std::mem::take(&mut *lock(&self.forwards.work));
            if batch.is_empty() {
                break;
            }
            for work in batch {
                let done = match work {
                    Work::Offer(key) => self.offer_downstream(key).await,
                    Work::Settle(id) => self.settle_upstream(id).await,
                };
                if !done {
                    later.push(work);
                }
            }
        }
        for work in later {
            self.forwards.push(work);
        }
    }

    /// Lets channel `id` settle its incoming HTLCs; false to try again later.
    async fn settle_upstream(&self, id: ChannelId) -> bool {
        let Some(slot) = self.channels.by_id(id) else {
            return true;
        };
        let mut inner = slot.lock().await;
        // R first: kept in the channel, its deadline claims on chain if the peer never
        // takes the fulfil (and a channel on chain claims at once).
        match self.keep_upstream_r(&slot, &mut inner).await {
            Ok(true) => {}
            Ok(false) => return false,
            Err(e) => {
                tracing::error!(peer = %slot.peer, channel = %id, error = %e, "cannot keep a forward's R upstream");
                return false;
            }
        }
        if inner.channel.state().is_updating() {
            // The settlement pass runs when the update in flight completes.
            return true;
        }
        if let Err(e) = self.run_actions(&slot, &mut inner, Vec::new()).await {
            tracing::error!(peer = %slot.peer, channel = %id, error = %crate::error_report::Causes(&e), "cannot settle a forwarded HTLC upstream");
            inner.fall_back();
        }
        true
    }

    /// Offers a forward's downstream HTLC; false when the channel is busy (try later).
    async fn offer_downstream(&self, key: Key) -> bool {
        let Some(f) = self.forwards.get(&key) else {
            return true;
        };
        if f.state != ForwardState::Offered {
            return true;
        }
        let offered = match self.channels.by_id(f.out_channel) {
            None => Err("the channel is gone".to_owned()),
            Some(slot) => {
                let mut inner = slot.lock().await;
                let state = inner.channel.state();
                if state.is_updating() {
                    return false;
                }
                if state != State::Normal || inner.outbox.is_none() {
                    Err(format!("the channel is {}", state.as_str()))
                } else {
                    match inner.channel.add_htlc_with_onion(
                        u64::from(f.out_msat),
                        f.r_hash,
                        Locktime::Blocks(f.out_expiry),
                        Some(f.onion.clone()),
                        unix_now(),
                    ) {
                        Ok(actions) => match self.run_actions(&slot, &mut inner, actions).await {
                            Ok(()) => Ok(()),
                            Err(e) => {
                                inner.fall_back();
                                self.peers.kick(&slot.peer, "Internal error");
                                Err(e.to_string())
                            }
                        },
                        Err(e) => Err(e.to_string()),
                    }
                }
            }
        };
        if let Err(why) = offered {
            tracing::info!(channel = %f.out_channel, %why, "cannot offer a forwarded HTLC; failing it upstream");
            if let Err(e) = self
                .forward_ended(f.out_channel, f.r_hash, ForwardState::Failed)
                .await
            {
                tracing::error!(error = %crate::error_report::Causes(&e), "cannot record a failed forward");
            }
        }
        true
    }

    /// Our payload, the next node and the onion for it, of an onion that names one (the
    /// policy check before acceptance and the offer after it peel the same way).
    pub(super) fn forward_plan(
        &self,
        onion: &wire::Onion,
        r_hash: &Sha256,
    ) -> Option<(onion::HopPayload, secp256k1::PublicKey, wire::Onion)> {
        use bitcoin::hashes::Hash as _;
        let peeled = onion::peel(
            &super::invoice::SECP,
            &self.node_key,
            onion,
            r_hash.as_byte_array(),
        )
        .ok()?;
        let onion::Next::Forward(next_onion) = peeled.next else {
            return None;
        };
        let payload = onion::HopPayload::decode(&peeled.payload).ok()?;
        let next = payload.next_node?;
        Some((payload, next, next_onion))
    }
}
