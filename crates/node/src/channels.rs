//! Channels of the node: one [`Channel`] state machine per peer session,
//! the execution of its actions (persist, send, broadcast), the owner's
//! commands from the control API, and the wallet that funds anchors.
//!
//! Locking: each channel sits in a [`Slot`] behind a tokio mutex; every
//! input (a packet, a command, a chain event) locks the slot, feeds the
//! machine and performs the resulting actions in order before unlocking, so
//! a `Persist` has committed before a later `Send` leaves.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bitcoin::{Amount, FeeRate, OutPoint, ScriptBuf, Transaction, TxOut};
use channel::{Action, AnchorRole, Channel, ChannelSecrets, CommandError, Event, State, Who};
use secp256k1::PublicKey;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, Notify};
use wallet::{KeyPath, SpendableOutput};
use wire::{Locktime, Packet, Preimage, Sha256};

use crate::control_error::ControlError;
use crate::store::{OutputRow, StoreError};
use crate::NodeState;

/// Wallet branch of channel final keys (sweeps and closes pay there, so the wallet sees them).
pub(crate) const FINAL_BRANCH: u32 = 2;
/// Wallet branch of channel commit keys (the anchor 2-of-2).
pub(crate) const COMMIT_BRANCH: u32 = 3;

/// What a new channel must hold beyond the commitment fee (a usable, non-dust balance).
const MIN_OWN_SAT: u64 = 1_000;

/// How long a control call waits for its exchange to complete.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// How long an incoming HTLC's expiry check waits for the chain's height before it takes
/// the last one seen (docs/node.md, "Defences").
const EXPIRY_TIP_WAIT: Duration = Duration::from_secs(2);

/// What a control call waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WaitKind {
    /// The anchor is broadcast.
    Open,
    /// Our proposal completed.
    Update,
    /// The close transaction is signed by both.
    Close,
}

/// A channel and what the node keeps around it.
pub(crate) struct Slot {
    pub id: i64,
    pub peer: PublicKey,
    inner: tokio::sync::Mutex<SlotInner>,
    changed: Notify,
}

pub(crate) struct SlotInner {
    pub channel: Channel,
    /// The last state written to disk; a dropped session falls back to it.
    persisted: Channel,
    outbox: Option<mpsc::Sender<Packet>>,
    waiter: Option<(WaitKind, oneshot::Sender<Result<(), ControlError>>)>,
    /// Acceptor: the height at which the peer's claimed anchor was first not found.
    anchor_missing_since: Option<u32>,
    /// When the update in flight started (or the node found it in flight at start).
    update_since: Option<std::time::Instant>,
    /// A live channel whose anchor a reorganisation took below `min_depth`: its
    /// confirmations now. No update is proposed or accepted until it is back at depth.
    pub(crate) suspended: Option<u32>,
    /// The outputs the anchor spends (from the chain when it was seen), to recognise a
    /// transaction that double-spends it.
    pub(crate) anchor_inputs: Vec<OutPoint>,
    /// Height of the block holding a transaction that spends one of `anchor_inputs` and is
    /// not the anchor: the anchor can never confirm while that block stands.
    pub(crate) anchor_conflict: Option<u32>,
}

/// Why a channel was abandoned (the `abandoned` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Abandoned {
    /// Before it went live: nothing was ever at stake.
    Opening = 1,
    /// After it went live, its anchor could never confirm.
    Unbacked = 2,
}

/// The wallet index of a channel's keys (channel ids are the index plus one).
pub(crate) fn channel_index(id: i64) -> Option<u32> {
    u32::try_from(id.checked_sub(1)?).ok()
}

/// What the chain says about the anchor a channel stands on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AnchorCheck {
    /// Neither in the mempool nor on the best chain (not yet broadcast, never, or reorganised away).
    Missing,
    /// Pays exactly the agreed amount to the 2-of-2; confirmations on the best chain (0 = mempool).
    Good(u32),
    /// The transaction exists but that output does not back the channel.
    Bad(String),
}

/// All channels this node has (closed ones included).
#[derive(Default)]
pub(crate) struct Channels {
    list: Mutex<ChannelList>,
}

/// The channels in creation order, and the same per peer.
///
/// Every packet and every owner command looks its channel up by peer. A scan of all
/// channels compared node keys one by one, and secp256k1 compares two keys by serialising
/// both, so each packet cost time in proportion to the node's channel count: a hub with
/// 100 channels spent more CPU finding channels than signing. The map is keyed by the
/// serialised key, so a lookup hashes 33 bytes once.
#[derive(Default)]
struct ChannelList {
    all: Vec<Arc<Slot>>,
    by_peer: HashMap<[u8; 33], Vec<Arc<Slot>>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn finished(state: State) -> bool {
    matches!(state, State::Closed | State::OnChain)
}

/// States from before the anchor can be on chain: a lost session abandons the channel.
fn opening(state: State) -> bool {
    matches!(
        state,
        State::Init
            | State::OpenWaitOpen
            | State::OpenWaitAnchorTx
            | State::OpenWaitAnchor
            | State::OpenWaitCommitSig
    )
}

/// States of an update in flight (between a proposal and the last revocation).
fn updating(state: State) -> bool {
    matches!(
        state,
        State::WaitAccept | State::WaitSignature | State::WaitComplete
    )
}

/// The name of a state in JSON.
pub(crate) fn state_name(state: State) -> &'static str {
    match state {
        State::Init => "init",
        State::OpenWaitOpen => "open_wait_open",
        State::OpenWaitAnchorTx => "open_wait_anchor_tx",
        State::OpenWaitAnchor => "open_wait_anchor",
        State::OpenWaitCommitSig => "open_wait_commit_sig",
        State::OpenWaitComplete => "open_wait_complete",
        State::Normal => "normal",
        State::WaitAccept => "wait_accept",
        State::WaitSignature => "wait_signature",
        State::WaitComplete => "wait_complete",
        State::CloseWaitComplete => "close_wait_complete",
        State::CloseWaitAck => "close_wait_ack",
        State::Closed => "closed",
        State::OnChain => "on_chain",
    }
}

impl Channels {
    pub(crate) fn add(&self, slot: Arc<Slot>) {
        let mut list = lock(&self.list);
        list.by_peer
            .entry(slot.peer.serialize())
            .or_default()
            .push(Arc::clone(&slot));
        list.all.push(slot);
    }

    pub(crate) fn all(&self) -> Vec<Arc<Slot>> {
        lock(&self.list).all.clone()
    }

    /// The channel stored under `id`, if loaded.
    pub(crate) fn by_id(&self, id: i64) -> Option<Arc<Slot>> {
        lock(&self.list).all.iter().find(|s| s.id == id).cloned()
    }

    fn remove(&self, slot: &Slot) {
        let mut list = lock(&self.list);
        list.all.retain(|s| s.id != slot.id);
        let key = slot.peer.serialize();
        if let Some(slots) = list.by_peer.get_mut(&key) {
            slots.retain(|s| s.id != slot.id);
            if slots.is_empty() {
                list.by_peer.remove(&key);
            }
        }
    }

    /// The peer's channels, oldest first.
    fn of_peer(&self, peer: &PublicKey) -> Vec<Arc<Slot>> {
        lock(&self.list)
            .by_peer
            .get(&peer.serialize())
            .cloned()
            .unwrap_or_default()
    }

    /// The peer's channel that is not over yet (the protocol has one per session).
    pub(crate) async fn active(&self, peer: &PublicKey) -> Option<Arc<Slot>> {
        for slot in self.of_peer(peer).into_iter().rev() {
            if !finished(slot.inner.lock().await.channel.state()) {
                return Some(slot);
            }
        }
        None
    }

    /// The newest channel with the peer, over or not.
    pub(crate) fn latest(&self, peer: &PublicKey) -> Option<Arc<Slot>> {
        lock(&self.list)
            .by_peer
            .get(&peer.serialize())
            .and_then(|slots| slots.last().cloned())
    }
}

impl SlotInner {
    /// Drops what is not on disk (an update in flight, a refused command), keeping the
    /// chain height the watcher gave: the height is not persisted with each block, and a
    /// stale one would misjudge expiries (an HTLC deadline, a new HTLC's expiry) until
    /// the next block.
    fn fall_back(&mut self) {
        let height = self.channel.height();
        self.channel = self.persisted.clone();
        let _ = self.channel.block_height(height);
    }

    /// Like [`Self::fall_back`] after a lost session, also keeping the Rs we revealed in
    /// the undone update (`update_fulfill_htlc` reached the peer, which can use R now, but
    /// the HTLC is still in every commitment): the deadline that claims it on chain with R
    /// needs them. Returns whether any R was not on disk.
    fn fall_back_keeping_preimages(&mut self) -> bool {
        let revealed = self.channel.known_preimages().to_vec();
        self.fall_back();
        let mut kept = false;
        for r in revealed {
            kept |= self.channel.remember_preimage(r);
        }
        kept
    }
}

impl Slot {
    pub(crate) fn new(id: i64, peer: PublicKey, channel: Channel) -> Arc<Slot> {
        Arc::new(Slot {
            id,
            peer,
            inner: tokio::sync::Mutex::new(SlotInner {
                persisted: channel.clone(),
                channel,
                outbox: None,
                waiter: None,
                anchor_missing_since: None,
                update_since: None,
                suspended: None,
                anchor_inputs: Vec::new(),
                anchor_conflict: None,
            }),
            changed: Notify::new(),
        })
    }

    pub(crate) async fn lock(&self) -> tokio::sync::MutexGuard<'_, SlotInner> {
        self.inner.lock().await
    }

    /// The channel as `listchannels` shows it.
    pub(crate) async fn to_json(&self) -> Value {
        let inner = self.inner.lock().await;
        let mut v = channel_json(&self.peer, &inner.channel);
        let state = inner.channel.state();
        let live = !opening(state)
            && !finished(state)
            && state != State::OpenWaitComplete
            && inner.suspended.is_none();
        v["live"] = json!(live);
        if let Some(confirmations) = inner.suspended {
            v["anchor_confirmations"] = json!(confirmations);
        }
        v
    }
}

pub(crate) fn channel_json(peer: &PublicKey, ch: &Channel) -> Value {
    let cs = ch.balances();
    let htlcs: Vec<Value> = cs
        .map(|cs| {
            let out = cs.ours.htlcs.iter().map(|h| ("out", h));
            let inc = cs.theirs.htlcs.iter().map(|h| ("in", h));
            out.chain(inc)
                .enumerate()
                .map(|(i, (dir, h))| {
                    let expiry = match h.expiry {
                        Locktime::Blocks(b) | Locktime::Seconds(b) => b,
                    };
                    json!({
                        "id": i,
                        "direction": dir,
                        "amount_msat": h.amount_msat,
                        "r_hash": hex::encode(h.r_hash.as_byte_array()),
                        "expiry": expiry,
                        "state": "committed",
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let mut v = json!({
        "peer_id": peer.to_string(),
        "state": state_name(ch.state()),
        "anchor_txid": ch.anchor_outpoint().map(|o| o.txid.to_string()),
        "capacity_sat": cs.map(|c| c.anchor_sat),
        "our_msat": cs.map(|c| c.ours.pay_msat),
        "their_msat": cs.map(|c| c.theirs.pay_msat),
        "our_fee_msat": cs.map(|c| c.ours.fee_msat),
        "their_fee_msat": cs.map(|c| c.theirs.fee_msat),
        "ours": cs.map(|c| crate::sides::side_json(c, Who::Us, ch.state())),
        "theirs": cs.map(|c| crate::sides::side_json(c, Who::Them, ch.state())),
        "commitment_number": ch.commitment_number(),
        "htlcs": htlcs,
    });
    if !ch.unclaimable().is_empty() {
        // Only when there is something to say: every other listing keeps its shape.
        v["unclaimable"] = ch
            .unclaimable()
            .iter()
            .map(|u| {
                json!({
                    "outpoint": u.outpoint.to_string(),
                    "amount_sat": u.value.to_sat(),
                    "claim_fee_sat": u.fee_sat,
                })
            })
            .collect();
    }
    v
}

use bitcoin::hashes::Hash as _;

/// A channel command from the control API.
#[derive(Debug, Clone)]
pub(crate) enum Command {
    Pay(u64),
    AddHtlc {
        amount_msat: u64,
        r_hash: Sha256,
        expiry: u32,
    },
    Fulfill(Preimage),
    Fail(Sha256),
    Close,
    /// Broadcast our latest commitment (no peer needed).
    ForceClose,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl NodeState {
    /// Creates the keys of a new channel from the wallet (so that its payouts are wallet funds).
    async fn new_channel(
        &self,
        peer: &PublicKey,
        role: AnchorRole,
    ) -> Result<Arc<Slot>, ControlError> {
        let index = self.store.next_index("next_channel").await?;
        let final_key = self.wallet.derive(KeyPath {
            branch: FINAL_BRANCH,
            index,
        })?;
        let commit_key = self.wallet.derive(KeyPath {
            branch: COMMIT_BRANCH,
            index,
        })?;
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed)
            .map_err(|e| ControlError::Internal(format!("no randomness: {e}")))?;
        self.watch_script(
            final_key.address.script_pubkey(),
            KeyPath {
                branch: FINAL_BRANCH,
                index,
            },
        );
        let channel = Channel::new(
            self.channel_config.clone(),
            ChannelSecrets {
                commit_key: commit_key.secret_key,
                final_key: final_key.secret_key,
                revocation_seed: seed,
            },
            role,
        );
        let id = i64::from(index) + 1;
        self.store
            .insert_channel(id, &peer.to_string(), &channel)
            .await?;
        let slot = Slot::new(id, *peer, channel);
        self.channels.add(Arc::clone(&slot));
        Ok(slot)
    }

    pub(crate) fn watch_script(&self, script: ScriptBuf, path: KeyPath) {
        lock(&self.scripts).insert(script, path);
    }

    pub(crate) fn script_path(&self, script: &ScriptBuf) -> Option<KeyPath> {
        lock(&self.scripts).get(script).copied()
    }

    /// How many scripts the watcher looks for.
    pub(crate) fn watched_scripts(&self) -> usize {
        lock(&self.scripts).len()
    }

    /// Performs `actions` in order; stops at the first failed persist (nothing after it may leave).
    pub(crate) async fn run_actions(
        &self,
        slot: &Slot,
        inner: &mut SlotInner,
        actions: Vec<Action>,
    ) -> Result<(), ControlError> {
        let mut queue: VecDeque<Action> = actions.into();
        let mut persisted = false;
        // Records of the peer's revoked commitments, written in the same commit as the
        // Persist that drops them from the channel (one fsync, not two).
        let mut archive: Vec<channel::RevokedCommitment> = Vec::new();
        while let Some(action) = queue.pop_front() {
            // A signature we give away lets the peer broadcast (or complete) a transaction:
            // the state that knows about it is on disk before it leaves, whatever the machine
            // asked (a `close_channel` carries no Persist of its own). After a restart or a
            // lost session the channel then resumes from a state that refuses updates and
            // watches for that transaction.
            let action = match action {
                Action::Send(pkt) if carries_signature(&pkt) && !persisted => {
                    queue.push_front(Action::Send(pkt));
                    Action::Persist
                }
                other => other,
            };
            match action {
                Action::Persist => {
                    persisted = true;
                    self.store
                        .save_channel(slot.id, &inner.channel, &archive)
                        .await
                        .map_err(|e| {
                            tracing::error!(peer = %slot.peer, channel = slot.id, error = %e, "persist failed");
                            ControlError::Store(e)
                        })?;
                    archive.clear();
                    inner.persisted = inner.channel.clone();
                    #[cfg(feature = "test-hooks")]
                    if self.cheat_enabled {
                        if let Some(tx) = inner.channel.signed_commitment() {
                            let _ = self
                                .store
                                .save_revoked_for_tests(
                                    slot.id,
                                    inner.channel.commitment_number(),
                                    &tx,
                                )
                                .await;
                        }
                    }
                }
                Action::Send(pkt) => {
                    tracing::debug!(peer = %slot.peer, packet = pkt.name(), "send");
                    self.deliver(slot, inner, pkt);
                }
                Action::Broadcast(tx) => {
                    self.broadcast(slot.id, &tx, 0, 0).await;
                }
                Action::BroadcastLater {
                    tx,
                    csv_blocks,
                    lock_time,
                } => {
                    // A claim that is not on disk is lost at the next restart: the
                    // caller must see this fail (the watcher retries the block).
                    self.store
                        .queue_broadcast(slot.id, &tx, csv_blocks, lock_time)
                        .await
                        .map_err(|e| {
                            tracing::error!(peer = %slot.peer, channel = slot.id, error = %e, "cannot queue a claim");
                            ControlError::Store(e)
                        })?;
                    tracing::info!(peer = %slot.peer, txid = %tx.compute_txid(), csv_blocks, lock_time, "claim queued");
                }
                Action::Archive(record) => {
                    // Durable no later than the Persist that follows and drops it from the
                    // channel: both go in one commit.
                    archive.push(record);
                }
                Action::WatchOutput(op) => {
                    tracing::debug!(peer = %slot.peer, anchor = %op, "watching anchor");
                }
                Action::Notify(event) => {
                    let more = self.on_event(slot, inner, event).await?;
                    for a in more.into_iter().rev() {
                        queue.push_front(a);
                    }
                }
            }
        }
        if !archive.is_empty() {
            // No Persist followed (the machine always sends one; keep the records anyway).
            for record in &archive {
                self.store.save_revoked(slot.id, record).await?;
            }
        }
        // An open completes once the anchor is out.
        if matches!(inner.waiter, Some((WaitKind::Open, _))) && !opening(inner.channel.state()) {
            complete_waiter(inner, Ok(()));
        }
        slot.changed.notify_waiters();
        Ok(())
    }

    /// Queues a packet for the peer without ever waiting: a peer that does not read its
    /// packets is dropped instead (a lost packet cannot be re-sent in this protocol), so the
    /// channel lock, the watcher, the control API and other peers never stall behind it.
    fn deliver(&self, slot: &Slot, inner: &mut SlotInner, pkt: Packet) {
        let Some(out) = &inner.outbox else {
            return;
        };
        match out.try_send(pkt) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(peer = %slot.peer, "peer does not read its packets; disconnecting");
                inner.outbox = None;
                self.peers.kick(&slot.peer, "Too slow");
            }
            Err(mpsc::error::TrySendError::Closed(_)) => inner.outbox = None,
        }
    }

    /// Queues `tx` (so it is retried until it confirms, also after a restart) and sends it now.
    pub(crate) async fn broadcast(&self, channel_id: i64, tx: &Transaction, csv: u32, lock: u32) {
        // Logged there; the queue re-sends it whatever the answer.
        let _ = self.broadcast_checked(channel_id, tx, csv, lock).await;
    }

    /// As `broadcast`, with the chain's refusal, if any (`Ok` when the
    /// transaction is in the mempool or a block, new or already known).
    async fn broadcast_checked(
        &self,
        channel_id: i64,
        tx: &Transaction,
        csv: u32,
        lock: u32,
    ) -> Result<(), chain::ChainError> {
        let txid = tx.compute_txid();
        if let Err(e) = self.store.queue_broadcast(channel_id, tx, csv, lock).await {
            tracing::error!(%txid, error = %e, "cannot queue a broadcast");
        }
        // Whatever the refusal, the queue keeps the transaction and re-sends
        // it at every block until it confirms or a conflict confirms
        // (`watcher`): a refusal is never read as "the money is back".
        match self.chain.broadcast(tx.clone()).await {
            Ok(_) => tracing::info!(channel = channel_id, %txid, "broadcast"),
            Err(e) if e.is_already_known() => {
                tracing::info!(channel = channel_id, %txid, "broadcast: already in the mempool or a block")
            }
            Err(e) if e.is_transient() || e.is_inputs_spent() || e.is_conflict() => {
                tracing::info!(channel = channel_id, %txid, error = %e, "broadcast refused for now; retried at every block");
                return Err(e);
            }
            Err(e) => {
                tracing::warn!(channel = channel_id, %txid, error = %e, "broadcast refused");
                return Err(e);
            }
        }
        Ok(())
    }

    /// For `close PEER force`: broadcasts the first transaction of `actions` (the
    /// commitment, which [`Channel::force_close`] lists first) and returns the other
    /// actions, with the chain's refusal as the error for the caller.
    async fn broadcast_commitment_first(
        &self,
        channel_id: i64,
        actions: Vec<Action>,
    ) -> (Vec<Action>, Option<ControlError>) {
        let mut rest = VecDeque::from(actions);
        let Some(Action::Broadcast(tx)) = rest.front().cloned() else {
            return (rest.into(), None);
        };
        rest.pop_front();
        let refused = self
            .broadcast_checked(channel_id, &tx, 0, 0)
            .await
            .err()
            .map(|reason| ControlError::CommitmentRefused {
                txid: tx.compute_txid(),
                reason,
            });
        (rest.into(), refused)
    }

    async fn on_event(
        &self,
        slot: &Slot,
        inner: &mut SlotInner,
        event: Event,
    ) -> Result<Vec<Action>, ControlError> {
        let peer = slot.peer;
        match event {
            Event::AnchorNeeded {
                script_pubkey,
                amount,
            } => {
                let result = self.fund_anchor(slot.id, script_pubkey, amount).await;
                match result {
                    Ok((tx, vout)) => Ok(inner.channel.anchor_created(tx, vout)?),
                    Err(e) => {
                        tracing::warn!(%peer, error = %e, "cannot fund the anchor");
                        complete_waiter(inner, Err(e));
                        self.deliver(slot, inner, Packet::error("Cannot fund the anchor"));
                        Ok(Vec::new())
                    }
                }
            }
            Event::Live => {
                tracing::info!(%peer, channel = slot.id, "channel live");
                Ok(Vec::new())
            }
            Event::UpdateCompleted { by, change } => {
                tracing::info!(%peer, channel = slot.id, ?by, ?change, num = inner.channel.commitment_number(), "update completed");
                if by == Who::Us && matches!(inner.waiter, Some((WaitKind::Update, _))) {
                    complete_waiter(inner, Ok(()));
                }
                Ok(Vec::new())
            }
            Event::Declined { r_hash, reason } => {
                tracing::info!(%peer, ?reason, "HTLC declined");
                complete_waiter(
                    inner,
                    Err(ControlError::Declined(format!(
                        "peer declined HTLC {}: {reason:?}",
                        hex::encode(r_hash.as_byte_array())
                    ))),
                );
                Ok(Vec::new())
            }
            Event::ProposalDeferred(change) => {
                tracing::info!(%peer, ?change, "our proposal deferred to the peer's");
                Ok(Vec::new())
            }
            Event::ProposalDropped { change, error } => {
                tracing::info!(%peer, ?change, %error, "deferred proposal dropped");
                complete_waiter(
                    inner,
                    Err(ControlError::Declined(format!("proposal dropped: {error}"))),
                );
                Ok(Vec::new())
            }
            Event::PeerError(problem) => {
                tracing::info!(%peer, %problem, "peer sent error");
                Ok(Vec::new())
            }
            Event::Closed(txid) => {
                tracing::info!(%peer, channel = slot.id, %txid, "channel closed");
                if matches!(inner.waiter, Some((WaitKind::Close, _))) {
                    complete_waiter(inner, Ok(()));
                }
                Ok(Vec::new())
            }
            Event::CheatDetected { commitment_number } => {
                tracing::warn!(%peer, channel = slot.id, commitment_number, "peer broadcast a revoked commitment; penalty broadcast");
                Ok(Vec::new())
            }
            Event::Unclaimable {
                outpoint,
                value,
                fee_sat,
            } => {
                tracing::warn!(%peer, channel = slot.id, %outpoint, value_sat = value.to_sat(), claim_fee_sat = fee_sat, "an output of ours is worth less than its claim; left unclaimed");
                Ok(Vec::new())
            }
            Event::AnchorSpentUnrecognised { txid } => {
                tracing::error!(%peer, channel = slot.id, %txid, "the anchor was spent by a transaction this channel does not recognise");
                Ok(Vec::new())
            }
            Event::OnChain { txid, owner } => {
                tracing::info!(%peer, channel = slot.id, %txid, ?owner, "commitment on chain");
                complete_waiter(inner, Err(ControlError::ClosedOnChain));
                Ok(Vec::new())
            }
        }
    }

    /// The fee rate of what the node builds (anchors, claims, penalties, the fair close fee):
    /// the chain's estimate for 6 blocks held to its fee policy (whose fallback also stands
    /// in when the chain cannot be asked).
    pub(crate) async fn fee_rate(&self) -> FeeRate {
        match self.chain.estimate_fee(6).await {
            Ok(rate) => rate,
            Err(e) => {
                let fallback = self.chain.fee_policy().fallback();
                tracing::warn!(error = %e, ?fallback, "no fee estimate from the chain; using the fallback");
                fallback
            }
        }
    }

    /// Wallet outputs as inputs, largest first, until they sum to `enough` (all of them
    /// without it).
    fn wallet_inputs(
        &self,
        mut outputs: Vec<OutputRow>,
        enough: Option<Amount>,
    ) -> Result<Vec<SpendableOutput>, ControlError> {
        outputs.sort_by_key(|o| std::cmp::Reverse(o.amount_sat));
        let mut inputs = Vec::new();
        let mut total = Amount::ZERO;
        for o in outputs {
            if enough.is_some_and(|e| total >= e) {
                break;
            }
            let path = KeyPath {
                branch: o.branch,
                index: o.index,
            };
            let key = self.wallet.derive(path)?;
            total += Amount::from_sat(o.amount_sat);
            inputs.push(SpendableOutput {
                outpoint: o.outpoint,
                txout: TxOut {
                    value: Amount::from_sat(o.amount_sat),
                    script_pubkey: key.address.script_pubkey(),
                },
                path,
            });
        }
        Ok(inputs)
    }

    /// Refuses an anchor of `amount_sat` that the wallet's spendable outputs cannot pay
    /// together with its fee. Checked before anything is sent: found only once the peer
    /// had answered, the shortfall ended the opening with an error packet, which also
    /// dropped the peer's session.
    async fn check_anchor_affordable(&self, amount_sat: u64) -> Result<(), ControlError> {
        let outputs = self.store.spendable_outputs().await?;
        let spendable_sat = outputs.iter().map(|o| o.amount_sat).sum();
        let refused = |needed_sat| ControlError::InsufficientFunds {
            asked_sat: amount_sat,
            needed_sat,
            spendable_sat,
        };
        if outputs.is_empty() {
            return Err(refused(amount_sat));
        }
        let inputs = self.wallet_inputs(outputs, None)?;
        // Placeholders of the real scripts' sizes: the anchor is a P2WSH 2-of-2, the
        // change a P2WPKH; only their sizes enter the fee.
        let anchor = TxOut {
            value: Amount::from_sat(amount_sat),
            script_pubkey: ScriptBuf::new_p2wsh(&bitcoin::WScriptHash::all_zeros()),
        };
        let change = ScriptBuf::new_p2wpkh(&bitcoin::WPubkeyHash::all_zeros());
        let rate = self.fee_rate().await;
        match wallet::build_transaction(&inputs, &[anchor], Some(&change), rate) {
            Ok(_) => Ok(()),
            Err(wallet::BuildError::InsufficientFunds { needed, .. }) => {
                Err(refused(needed.to_sat()))
            }
            Err(e) => Err(ControlError::Funding(e.into())),
        }
    }

    /// Builds and signs the anchor from confirmed wallet outputs, reserving them.
    async fn fund_anchor(
        &self,
        channel_id: i64,
        script_pubkey: ScriptBuf,
        amount: Amount,
    ) -> Result<(Transaction, u32), ControlError> {
        let _guard = self.funding.lock().await;
        let outputs = self.store.spendable_outputs().await?;
        let fee_rate = self.fee_rate().await;
        // Enough for the anchor and a generous fee: stop adding inputs.
        let inputs = self.wallet_inputs(outputs, Some(amount + Amount::from_sat(50_000)))?;
        let change_index = self.store.next_index("next_change").await?;
        let change_path = KeyPath {
            branch: wallet::CHANGE_BRANCH,
            index: change_index,
        };
        let change = self.wallet.derive(change_path)?.address.script_pubkey();
        self.watch_script(change.clone(), change_path);
        let payment = [TxOut {
            value: amount,
            script_pubkey,
        }];
        // Anti-fee-sniping nLockTime at the tip, as Core's wallet does.
        let built = match self.chain.tip().await {
            Ok(tip) => self.wallet.build_signed_at(
                &inputs,
                &payment,
                Some(&change),
                fee_rate,
                tip.height,
            )?,
            Err(_) => self
                .wallet
                .build_signed(&inputs, &payment, Some(&change), fee_rate)?,
        };
        let txid = built.tx.compute_txid();
        let spent: Vec<OutPoint> = inputs.iter().map(|i| i.outpoint).collect();
        self.store.spend_outputs(&spent, &txid).await?;
        tracing::info!(channel = channel_id, anchor = %txid, fee = %built.fee, "anchor built");
        Ok((built.tx, 0))
    }

    /// `open PEER AMOUNT_SAT`: we fund the anchor; returns once it is broadcast.
    pub(crate) async fn open_channel(
        &self,
        peer: &PublicKey,
        amount_sat: u64,
    ) -> Result<Value, ControlError> {
        if !self.peers.is_connected(peer) {
            return Err(ControlError::NotConnected(*peer));
        }
        let min = self.channel_config.commitment_fee_sat + MIN_OWN_SAT;
        if amount_sat < min {
            return Err(ControlError::ChannelTooSmall {
                amount_sat,
                min_sat: min,
                fee_sat: self.channel_config.commitment_fee_sat,
                own_sat: MIN_OWN_SAT,
            });
        }
        // Before the openings lock: it asks the chain for a fee estimate, and a slow
        // chain must not hold the peers' own openings.
        self.check_anchor_affordable(amount_sat).await?;
        let listing = self.openings.lock().await;
        if self.channels.active(peer).await.is_some() {
            return Err(ControlError::ChannelExists(*peer));
        }
        let slot = self
            .new_channel(
                peer,
                AnchorRole::Fund {
                    anchor_sat: amount_sat,
                },
            )
            .await?;
        // Listed now: a later opening with this peer finds it.
        drop(listing);
        let rx = {
            let mut inner = slot.lock().await;
            inner.outbox = self.peers.outbox(peer);
            let actions = inner.channel.start()?;
            let (tx, rx) = oneshot::channel();
            inner.waiter = Some((WaitKind::Open, tx));
            self.run_actions(&slot, &mut inner, actions).await?;
            rx
        };
        let waited = wait_for(rx).await;
        if matches!(waited, Err(ControlError::Timeout(_)))
            && opening(slot.lock().await.channel.state())
        {
            // A peer that stalls the opening would keep it (and the wallet outputs a built
            // anchor reserved) as long as it keeps the session: drop the session, and the
            // lost-session rules abandon the opening and free the outputs.
            tracing::warn!(%peer, channel = slot.id, "opening not completed in time; dropping the session");
            self.peers.kick(peer, "Open timed out");
        }
        waited?;
        Ok(slot.to_json().await)
    }

    /// An owner command on the peer's channel; returns once the exchange completed.
    pub(crate) async fn channel_command(
        &self,
        peer: &PublicKey,
        command: Command,
    ) -> Result<Value, ControlError> {
        let slot = self
            .channels
            .active(peer)
            .await
            .or_else(|| self.channels.latest(peer))
            .ok_or(ControlError::NoChannel(*peer))?;
        let deadline = tokio::time::Instant::now() + COMMAND_TIMEOUT;
        let rx = loop {
            let changed = slot.changed.notified();
            {
                let mut inner = slot.lock().await;
                if let Some(confirmations) = inner.suspended {
                    if !matches!(command, Command::Close | Command::ForceClose) {
                        return Err(ControlError::AnchorUnconfirmed {
                            confirmations,
                            min_depth: inner.channel.min_depth(),
                        });
                    }
                }
                let ch = &mut inner.channel;
                let kind = if matches!(command, Command::Close) {
                    WaitKind::Close
                } else {
                    WaitKind::Update
                };
                let result = match &command {
                    Command::Pay(msat) => ch.pay(*msat),
                    Command::AddHtlc {
                        amount_msat,
                        r_hash,
                        expiry,
                    } => ch.add_htlc(*amount_msat, *r_hash, Locktime::Blocks(*expiry), unix_now()),
                    Command::Fulfill(r) => ch.fulfill_htlc(*r, unix_now()),
                    Command::Fail(h) => ch.routefail_htlc(*h),
                    Command::Close => ch.close(),
                    Command::ForceClose => ch.force_close(),
                };
                match result {
                    Ok(actions) => {
                        let on_chain = ch.state() == State::OnChain;
                        if inner.outbox.is_none() && !on_chain {
                            // Undo: nothing was sent and nothing may be half-done.
                            inner.fall_back();
                            if let Command::Fulfill(r) = &command {
                                // The owner has released R (its payer upstream may
                                // already hold it, and the peer may have read it in an
                                // update a crash undid): forgetting it here would let
                                // the peer time the HTLC out on chain. Kept, the
                                // deadline claims it with R.
                                if inner.channel.remember_preimage(*r) {
                                    self.store
                                        .save_channel(slot.id, &inner.channel, &[])
                                        .await?;
                                    inner.persisted = inner.channel.clone();
                                }
                                return Err(ControlError::NotConnectedKeepingR(*peer));
                            }
                            return Err(ControlError::NotConnected(*peer));
                        }
                        let (tx, rx) = oneshot::channel();
                        if !on_chain {
                            inner.waiter = Some((kind, tx));
                        } else {
                            let _ = tx.send(Ok(()));
                        }
                        // A force close broadcasts our commitment here, first as among the
                        // actions, so that the caller hears a refusal (issue 28: a
                        // commitment below the relay fee was answered with success).
                        let (actions, refused) = match command {
                            Command::ForceClose => {
                                self.broadcast_commitment_first(slot.id, actions).await
                            }
                            _ => (actions, None),
                        };
                        if let Err(e) = self.run_actions(&slot, &mut inner, actions).await {
                            // Nothing after the failed write left; start over from the disk.
                            inner.fall_back();
                            inner.waiter = None;
                            self.peers.kick(peer, "Internal error");
                            return Err(e);
                        }
                        if let Some(e) = refused {
                            return Err(e);
                        }
                        break rx;
                    }
                    Err(CommandError::WrongState(
                        State::WaitAccept | State::WaitSignature | State::WaitComplete,
                    )) => {
                        // An update is in flight: wait for it to finish, then try again.
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(ControlError::Timeout("the update in flight"));
            }
        };
        wait_for(rx).await?;
        Ok(slot.to_json().await)
    }

    /// A packet from the peer, for its channel (creating one when the peer opens).
    pub(crate) async fn channel_packet(
        &self,
        peer: &PublicKey,
        outbox: &mpsc::Sender<Packet>,
        pkt: Packet,
    ) -> Result<(), Packet> {
        let mut active = self.channels.active(peer).await;
        if let (Some(slot), Packet::Open(_)) = (&active, &pkt) {
            // The funder opens again: it abandoned our half-open channel before broadcasting
            // its anchor (we hold no money in it). Forget it, unless the anchor is out.
            let mut inner = slot.lock().await;
            let stale = inner.channel.state() == State::OpenWaitComplete
                && inner.channel.balances().is_some_and(|cs| !cs.we_fund)
                && self.anchor_depth(&inner.channel).await == 0
                && !self.anchor_in_mempool(&inner.channel).await;
            if stale {
                tracing::info!(%peer, channel = slot.id, "peer opens again; forgetting the unfunded opening");
                inner.fall_back();
                self.forget_channel(slot, None, Abandoned::Opening).await;
                drop(inner);
                active = None;
            }
        }
        let slot = match active {
            Some(slot) => slot,
            None => match &pkt {
                Packet::Open(o) if o.anch == wire::AnchorOffer::WillCreateAnchor => 'open: {
                    let _opening = self.openings.lock().await;
                    // Our own `open` may have listed a channel since the lookup above: the
                    // packet goes to it (one channel per session).
                    if let Some(slot) = self.channels.active(peer).await {
                        break 'open slot;
                    }
                    // Each costs a key, a row and a watch until it is funded or abandoned:
                    // strangers with fresh node ids cannot make us hold unlimited openings.
                    let waiting = self.openings_waiting_for_their_anchor().await;
                    if waiting >= self.max_pending_openings {
                        tracing::warn!(%peer, waiting, "opening refused: too many channels waiting for their anchor");
                        return Err(Packet::error(format!(
                            "Too many channels waiting for their anchor ({waiting})"
                        )));
                    }
                    let slot = self
                        .new_channel(peer, AnchorRole::Accept)
                        .await
                        .map_err(|e| Packet::error(format!("Cannot open: {e}")))?;
                    let mut inner = slot.lock().await;
                    inner.outbox = Some(outbox.clone());
                    let actions = inner
                        .channel
                        .start()
                        .map_err(|e| Packet::error(e.to_string()))?;
                    self.run_actions(&slot, &mut inner, actions)
                        .await
                        .map_err(|e| Packet::error(e.to_string()))?;
                    drop(inner);
                    slot
                }
                Packet::Error(e) => {
                    tracing::info!(%peer, problem = e.problem.as_deref().unwrap_or(""), "peer error without a channel");
                    return Ok(());
                }
                other => return Err(Packet::error(format!("Unexpected packet {}", other.name()))),
            },
        };
        // Expiry checks depend on the height: ask the chain, not our watcher's last pass.
        // Asked before the channel's lock is taken and bounded: a slow or hung bitcoind
        // must not hold the channel (the owner's control calls, the watcher) for its RPC
        // time-out; a chain that does not answer in time leaves the height of the last
        // pass, as an unreachable one always did.
        let tip = if matches!(
            pkt,
            Packet::UpdateAddHtlc(_) | Packet::UpdateTimedoutHtlc(_)
        ) {
            tokio::time::timeout(EXPIRY_TIP_WAIT, self.chain.tip())
                .await
                .ok()
                .and_then(Result::ok)
        } else {
            None
        };
        let mut inner = slot.lock().await;
        if inner.outbox.is_none() {
            inner.outbox = Some(outbox.clone());
        }
        if let Some(tip) = tip {
            // Never behind a height the watcher set while we asked.
            if tip.height >= inner.channel.height() {
                let _ = inner.channel.block_height(tip.height);
            }
        }
        // The peer lost our open_complete in a dropped session: say it again.
        if matches!(pkt, Packet::OpenComplete(_)) && inner.channel.state() == State::Normal {
            self.deliver(
                &slot,
                &mut inner,
                Packet::OpenComplete(wire::OpenComplete::default()),
            );
            return Ok(());
        }
        tracing::debug!(%peer, packet = pkt.name(), state = state_name(inner.channel.state()), "received");
        if let Some(confirmations) = inner.suspended {
            // A proposal on a channel whose anchor a reorganisation took away: the money
            // it would move may not exist. An update already in flight may finish.
            let proposal = matches!(
                pkt,
                Packet::Update(_)
                    | Packet::UpdateAddHtlc(_)
                    | Packet::UpdateFulfillHtlc(_)
                    | Packet::UpdateTimedoutHtlc(_)
                    | Packet::UpdateRoutefailHtlc(_)
            );
            if proposal && inner.channel.state() == State::Normal {
                tracing::warn!(%peer, channel = slot.id, confirmations, "proposal refused: the anchor is not confirmed");
                return Err(Packet::error(format!(
                    "Anchor not confirmed ({confirmations} of {} confirmations): no updates until it is",
                    inner.channel.min_depth()
                )));
            }
        }
        match inner.channel.handle_packet(&pkt, unix_now()) {
            Ok(actions) => self
                .run_actions(&slot, &mut inner, actions)
                .await
                .map_err(|e| Packet::error(e.to_string())),
            Err(rejected) => {
                tracing::warn!(%peer, error = %rejected, "packet rejected");
                // A close we refuse (a fee that would burn our money) still says the peer
                // wants out: the channel closes with our commitment instead.
                if matches!(rejected.error, channel::ChannelError::BadClose(_)) {
                    tracing::warn!(%peer, channel = slot.id, "close refused; closing on chain");
                    self.close_on_chain(&slot, &mut inner).await;
                }
                Err(rejected.reply())
            }
        }
    }

    /// Channels opened by peers that are not live yet (their anchor not confirmed).
    async fn openings_waiting_for_their_anchor(&self) -> usize {
        let mut n = 0;
        for slot in self.channels.all() {
            let inner = slot.lock().await;
            let state = inner.channel.state();
            let theirs = inner.channel.balances().is_none_or(|cs| !cs.we_fund);
            if theirs && (opening(state) || state == State::OpenWaitComplete) {
                n += 1;
            }
        }
        n
    }

    /// A session with `peer` came up: attach its outbox and resume the channel.
    pub(crate) async fn session_up(&self, peer: &PublicKey, outbox: mpsc::Sender<Packet>) {
        let Some(slot) = self.channels.active(peer).await else {
            return;
        };
        let mut inner = slot.lock().await;
        inner.outbox = Some(outbox);
        tracing::info!(%peer, channel = slot.id, state = state_name(inner.channel.state()), "channel resumes");
        if inner.channel.state() == State::OpenWaitComplete {
            let height = self.store.meta("scanned_height").await.unwrap_or(0);
            let height = u32::try_from(height).unwrap_or(0);
            self.advance_opening(&slot, &mut inner, height).await;
        }
        // What survives a lost session is said again: after our `close_channel` (the peer
        // may never have read it) the same close, so that it completes.
        match inner.channel.reconnected() {
            Ok(actions) if actions.is_empty() => {}
            Ok(actions) => {
                tracing::info!(%peer, channel = slot.id, "saying the interrupted close again");
                if let Err(e) = self.run_actions(&slot, &mut inner, actions).await {
                    tracing::error!(%peer, channel = slot.id, error = %e, "cannot resume the close");
                }
            }
            Err(e) => {
                tracing::error!(%peer, channel = slot.id, error = %e, "cannot resume the channel")
            }
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
            match self.store.save_channel(slot.id, &inner.channel, &[]).await {
                Ok(()) => inner.persisted = inner.channel.clone(),
                Err(e) => {
                    tracing::error!(%peer, channel = slot.id, error = %e, "cannot persist a revealed R")
                }
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
        complete_waiter(&mut inner, Err(ControlError::PeerGone(why)));
        self.settle_after_session(&slot, &mut inner).await;
        slot.changed.notify_waiters();
    }

    /// After a lost session or a restart: abandon an unfunded opening; close an interrupted update on chain.
    pub(crate) async fn settle_after_session(&self, slot: &Slot, inner: &mut SlotInner) {
        let state = inner.channel.state();
        if opening(state) {
            tracing::info!(peer = %slot.peer, channel = slot.id, state = state_name(state), "opening abandoned (anchor never broadcast)");
            let anchor = inner.channel.anchor_outpoint().map(|o| o.txid);
            self.forget_channel(slot, anchor, Abandoned::Opening).await;
        } else if state == State::OpenWaitComplete {
            // A crash between persisting and broadcasting must not leave the anchor unsent.
            if let Some(tx) = inner.channel.anchor_tx().cloned() {
                if self.anchor_depth(&inner.channel).await == 0 {
                    self.broadcast(slot.id, &tx, 0, 0).await;
                }
            }
        } else if matches!(state, State::WaitComplete | State::WaitSignature) {
            // We revoked our old commitment but do not hold the peer's revocation, or we
            // signed the peer's next commitment (persisted since the channel crate's
            // update_accept persists): the protocol has no way to finish this update, so
            // close with our latest (valid) state.
            tracing::warn!(peer = %slot.peer, channel = slot.id, "update interrupted; closing unilaterally");
            match inner.channel.force_close() {
                Ok(actions) => {
                    if let Err(e) = self.run_actions(slot, inner, actions).await {
                        tracing::error!(error = %e, "force close failed");
                    }
                }
                Err(e) => tracing::error!(error = %e, "cannot force close"),
            }
        }
    }

    async fn anchor_in_mempool(&self, ch: &Channel) -> bool {
        match ch.anchor_outpoint() {
            Some(op) => self.chain.in_mempool(op.txid).await.unwrap_or(true),
            None => false,
        }
    }

    /// Checks the anchor against the chain: the claimed output must exist and pay exactly
    /// the agreed amount to the P2WSH 2-of-2 of both commit keys.
    ///
    /// # Errors
    /// The chain or the store could not be asked (try again later; nothing is decided).
    pub(crate) async fn check_anchor(
        &self,
        ch: &Channel,
    ) -> Result<AnchorCheck, crate::watcher::LookupError> {
        let Some((op, expected)) = ch.anchor_output() else {
            return Ok(AnchorCheck::Missing);
        };
        let Some(status) = self.followed_transaction(op.txid).await? else {
            // An anchor confirmed before its block was recorded (a channel from a release
            // that needed -txindex): while unspent, `gettxout` shows it without the index.
            return Ok(match self.chain.unspent_output(op).await? {
                Some(out)
                    if out.value == expected.value
                        && out.script_pubkey == expected.script_pubkey =>
                {
                    AnchorCheck::Good(out.confirmations)
                }
                Some(out) => AnchorCheck::Bad(format!(
                    "output {op} pays {} to {}, not {} to the channel's 2-of-2",
                    out.value, out.script_pubkey, expected.value
                )),
                None => AnchorCheck::Missing,
            });
        };
        Ok(match status.tx.output.get(op.vout as usize) {
            Some(out) if *out == expected => AnchorCheck::Good(status.confirmations),
            Some(out) => AnchorCheck::Bad(format!(
                "output {op} pays {} to {}, not {} to the channel's 2-of-2",
                out.value, out.script_pubkey, expected.value
            )),
            None => AnchorCheck::Bad(format!("transaction {} has no output {}", op.txid, op.vout)),
        })
    }

    /// A channel waiting for its anchor: verify the anchor, then feed its depth to the machine
    /// (which says `open_complete` at `min_depth`). As acceptor, an anchor that does not back
    /// the channel, or that stays unseen for `anchor_wait_blocks`, abandons the channel: the
    /// peer gets an `error` and nothing more is signed for it.
    pub(crate) async fn advance_opening(&self, slot: &Slot, inner: &mut SlotInner, height: u32) {
        if inner.channel.state() != State::OpenWaitComplete {
            return;
        }
        let we_fund = inner.channel.balances().is_some_and(|cs| cs.we_fund);
        let check = match self.check_anchor(&inner.channel).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(peer = %slot.peer, channel = slot.id, error = %e, "cannot check the anchor yet");
                return;
            }
        };
        match check {
            AnchorCheck::Good(depth) => {
                inner.anchor_missing_since = None;
                self.remember_anchor_inputs(inner).await;
                let actions = inner.channel.anchor_depth(depth);
                if !actions.is_empty() {
                    if let Err(e) = self.run_actions(slot, inner, actions).await {
                        tracing::error!(channel = slot.id, error = %e, "cannot go live");
                    }
                }
            }
            AnchorCheck::Bad(why) if !we_fund => {
                self.abandon_opening(slot, inner, &format!("Bad anchor: {why}"))
                    .await;
            }
            AnchorCheck::Bad(why) => {
                tracing::error!(channel = slot.id, %why, "our own anchor does not match the channel");
            }
            AnchorCheck::Missing if !we_fund => {
                let since = *inner.anchor_missing_since.get_or_insert(height);
                if height >= since.saturating_add(self.anchor_wait_blocks) {
                    let txid = inner.channel.anchor_outpoint().map(|o| o.txid);
                    let why = format!(
                        "Anchor {} not seen on chain for {} blocks",
                        txid.map(|t| t.to_string()).unwrap_or_default(),
                        self.anchor_wait_blocks
                    );
                    self.abandon_opening(slot, inner, &why).await;
                }
            }
            AnchorCheck::Missing => {}
        }
    }

    /// Marks a channel abandoned on disk and drops it from the registry (the watcher stops
    /// looking at its anchor). An opening that never went live also stops watching its final
    /// key: no transaction can pay it (the acceptor has no output in the funder's first
    /// commitment; a funder's unbroadcast anchor backs nothing), so strangers cannot make us
    /// watch keys without end. A live channel ended for an unbacked anchor keeps the watch:
    /// should that anchor ever confirm after all, the peer's commitment pays us there.
    async fn forget_channel(&self, slot: &Slot, anchor: Option<bitcoin::Txid>, kind: Abandoned) {
        if let Err(e) = self.store.abandon_channel(slot.id, anchor, kind).await {
            tracing::error!(channel = slot.id, error = %e, "cannot abandon channel");
        }
        self.channels.remove(slot);
        if kind == Abandoned::Opening {
            if let Some(index) = channel_index(slot.id) {
                if let Ok(key) = self.wallet.derive(KeyPath {
                    branch: FINAL_BRANCH,
                    index,
                }) {
                    lock(&self.scripts).remove(&key.address.script_pubkey());
                }
            }
        }
    }

    /// Keeps the outputs the anchor spends, once, so that a double-spend of them is recognised
    /// in a block even after the anchor itself left the chain.
    async fn remember_anchor_inputs(&self, inner: &mut SlotInner) {
        if !inner.anchor_inputs.is_empty() {
            return;
        }
        if let Some(tx) = inner.channel.anchor_tx() {
            inner.anchor_inputs = tx.input.iter().map(|i| i.previous_output).collect();
            return;
        }
        let Some(op) = inner.channel.anchor_outpoint() else {
            return;
        };
        if let Ok(Some(status)) = self.followed_transaction(op.txid).await {
            inner.anchor_inputs = status.tx.input.iter().map(|i| i.previous_output).collect();
        }
    }

    /// A live channel after a new block or a reorganisation: its anchor must still be on the
    /// best chain at `min_depth`. Below that the channel is suspended (listed as not live, no
    /// update proposed or accepted) until it is back at depth; an anchor that can never
    /// confirm (a block holds a double-spend of its inputs, or it stays unseen for
    /// `anchor_wait_blocks`) ends the channel: it backs no money, so there is nothing to
    /// close on chain and it is abandoned like an opening that was never funded.
    pub(crate) async fn check_live_anchor(&self, slot: &Slot, inner: &mut SlotInner, height: u32) {
        let state = inner.channel.state();
        if opening(state) || finished(state) || state == State::OpenWaitComplete {
            return;
        }
        let check = match self.check_anchor(&inner.channel).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(peer = %slot.peer, channel = slot.id, error = %e, "cannot check the anchor yet");
                return;
            }
        };
        let min_depth = inner.channel.min_depth();
        let confirmations = match check {
            AnchorCheck::Good(depth) => {
                inner.anchor_missing_since = None;
                self.remember_anchor_inputs(inner).await;
                depth
            }
            AnchorCheck::Bad(why) => {
                tracing::error!(peer = %slot.peer, channel = slot.id, %why, "the anchor of a live channel no longer matches");
                0
            }
            AnchorCheck::Missing => {
                let since = *inner.anchor_missing_since.get_or_insert(height);
                let why = if inner.anchor_conflict.is_some() {
                    Some(
                        "Anchor double-spent: a block holds a transaction spending its inputs"
                            .to_owned(),
                    )
                } else if height >= since.saturating_add(self.anchor_wait_blocks) {
                    Some(format!(
                        "Anchor off the best chain for {} blocks",
                        self.anchor_wait_blocks
                    ))
                } else {
                    None
                };
                if let Some(why) = why {
                    self.end_unbacked(slot, inner, &why).await;
                    return;
                }
                0
            }
        };
        if confirmations >= min_depth {
            if inner.suspended.take().is_some() {
                tracing::info!(peer = %slot.peer, channel = slot.id, confirmations, "anchor confirmed again; channel live");
                slot.changed.notify_waiters();
            }
        } else if inner.suspended.replace(confirmations).is_none() {
            tracing::warn!(peer = %slot.peer, channel = slot.id, confirmations, min_depth, "anchor reorganised below min_depth; channel suspended");
        }
    }

    /// Ends a channel whose anchor will never be on chain (see [`Self::check_live_anchor`]).
    async fn end_unbacked(&self, slot: &Slot, inner: &mut SlotInner, why: &str) {
        tracing::warn!(peer = %slot.peer, channel = slot.id, %why, "channel abandoned: its anchor can never confirm");
        // What was in flight falls back to the disk; nothing more is signed for it.
        inner.fall_back();
        self.abandon_opening(slot, inner, why).await;
        self.peers.kick(&slot.peer, why);
    }

    /// Forgets an opening whose anchor the peer funds and that will never back it: the peer
    /// is told why, the channel is marked abandoned on disk and leaves the registry.
    async fn abandon_opening(&self, slot: &Slot, inner: &mut SlotInner, why: &str) {
        tracing::warn!(peer = %slot.peer, channel = slot.id, %why, "opening abandoned");
        let kind =
            if opening(inner.channel.state()) || inner.channel.state() == State::OpenWaitComplete {
                Abandoned::Opening
            } else {
                Abandoned::Unbacked
            };
        self.forget_channel(slot, None, kind).await;
        if let Some(out) = inner.outbox.take() {
            // The error ends the session (it is the last packet written).
            let _ = out.try_send(Packet::error(why));
        }
        complete_waiter(inner, Err(ControlError::PeerGone(why.to_owned())));
        slot.changed.notify_waiters();
    }

    /// Confirmations of the channel's anchor (0 if unknown or unconfirmed).
    pub(crate) async fn anchor_depth(&self, ch: &Channel) -> u32 {
        let Some(op) = ch.anchor_outpoint() else {
            return 0;
        };
        match self.followed_transaction(op.txid).await {
            Ok(Some(status)) => status.confirmations,
            _ => 0,
        }
    }

    /// Test-only: broadcasts an old, revoked commitment of ours (enabled by `--dev-allow-cheat`).
    #[cfg(feature = "test-hooks")]
    pub(crate) async fn broadcast_revoked(&self, peer: &PublicKey) -> Result<Value, ControlError> {
        if !self.cheat_enabled {
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
        let txid = self.chain.broadcast(tx).await?;
        Ok(json!({ "txid": txid.to_string() }))
    }

    /// The wallet's receive address (a fresh one per call).
    pub(crate) async fn new_address(&self) -> Result<String, ControlError> {
        let index = self.store.next_index("next_receive").await?;
        let key = self.wallet.derive(KeyPath::receive(index))?;
        self.watch_script(key.address.script_pubkey(), KeyPath::receive(index));
        Ok(key.address.to_string())
    }

    pub(crate) async fn list_funds(&self) -> Result<Value, StoreError> {
        let outputs: Vec<OutputRow> = self.store.outputs(true).await?;
        // The watcher records a block's outputs before it moves the scanned height past
        // that block: an output is never younger than its own block.
        let tip = self.store.meta("scanned_height").await?.max(
            outputs
                .iter()
                .map(|o| i64::from(o.height))
                .max()
                .unwrap_or(0),
        );
        let total: u64 = outputs.iter().map(|o| o.amount_sat).sum();
        let spendable: u64 = outputs
            .iter()
            .filter(|o| o.spendable(tip))
            .map(|o| o.amount_sat)
            .sum();
        let list: Vec<Value> = outputs
            .iter()
            .map(|o| {
                json!({
                    "txid": o.outpoint.txid.to_string(),
                    "vout": o.outpoint.vout,
                    "amount_sat": o.amount_sat,
                    "confirmations": o.confirmations(tip),
                    "spendable": o.spendable(tip),
                })
            })
            .collect();
        Ok(json!({ "outputs": list, "total_sat": total, "spendable_sat": spendable }))
    }

    /// Rebuilds the script map from the counters, so every key the node handed out is watched.
    pub(crate) async fn load_scripts(&self) -> Result<(), ControlError> {
        let mut map = HashMap::new();
        let forgotten: std::collections::HashSet<u32> = self
            .store
            .abandoned_openings()
            .await?
            .into_iter()
            .filter_map(channel_index)
            .collect();
        for (key, branch) in [
            ("next_receive", wallet::RECEIVE_BRANCH),
            ("next_change", wallet::CHANGE_BRANCH),
            ("next_channel", FINAL_BRANCH),
        ] {
            let n = self.store.meta(key).await?;
            for index in 0..u32::try_from(n).unwrap_or(0) {
                if branch == FINAL_BRANCH && forgotten.contains(&index) {
                    continue;
                }
                let path = KeyPath { branch, index };
                let key = self.wallet.derive(path)?;
                map.insert(key.address.script_pubkey(), path);
            }
        }
        lock(&self.scripts).extend(map);
        Ok(())
    }

    /// An update that outlives the deadline: the session is dropped (the peer stalls), and an
    /// update still in flight without a session after the deadline again closes the channel on
    /// chain with our valid commitment (the protocol cannot resume it otherwise).
    pub(crate) async fn enforce_update_deadline(&self, slot: &Slot) {
        let mut inner = slot.lock().await;
        if !updating(inner.channel.state()) {
            inner.update_since = None;
            return;
        }
        let since = *inner
            .update_since
            .get_or_insert_with(std::time::Instant::now);
        let elapsed = since.elapsed();
        if elapsed < self.update_timeout {
            return;
        }
        if inner.outbox.is_some() {
            tracing::warn!(peer = %slot.peer, channel = slot.id, ?elapsed, "update not completed in time; dropping the session");
            inner.outbox = None;
            self.peers.kick(&slot.peer, "Update timed out");
            return;
        }
        if elapsed < self.update_timeout * 2 {
            return;
        }
        tracing::warn!(peer = %slot.peer, channel = slot.id, state = state_name(inner.channel.state()), "update never resumed; closing unilaterally");
        match inner.channel.force_close() {
            Ok(actions) => {
                if let Err(e) = self.run_actions(slot, &mut inner, actions).await {
                    tracing::error!(error = %e, "force close failed");
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot force close"),
        }
    }

    /// A deadline closes the channel with our commitment. A failure here leaves money at
    /// risk, so it is logged as an error every pass until it works; it is never dropped.
    async fn close_on_chain(&self, slot: &Slot, inner: &mut SlotInner) {
        match inner.channel.force_close() {
            Ok(actions) => {
                if let Err(e) = self.run_actions(slot, inner, actions).await {
                    tracing::error!(peer = %slot.peer, channel = slot.id, error = %e, "closing on chain failed");
                }
            }
            Err(e) => {
                tracing::error!(peer = %slot.peer, channel = slot.id, error = %e, state = state_name(inner.channel.state()), "cannot close on chain")
            }
        }
    }

    /// Expired HTLCs we offered are removed by agreement (`update_timedout_htlc`); one
    /// that cannot be (peer away or refusing) for `htlc_close_after_blocks` blocks is
    /// taken back on chain: the channel closes unilaterally.
    pub(crate) async fn time_out_htlcs(&self, slot: &Slot, height: u32) {
        let mut inner = slot.lock().await;
        let state = inner.channel.state();
        // Whatever the state: a peer that stalls mid-update must not keep our HTLC past expiry.
        if finished(state) || opening(state) || state == State::OpenWaitComplete {
            return;
        }
        let long_expired = inner.channel.balances().is_some_and(|cs| {
            cs.ours.htlcs.iter().any(|h| {
                matches!(h.expiry, Locktime::Blocks(b) if height >= b.saturating_add(self.htlc_close_after_blocks))
            })
        });
        // The machine's view too: HTLCs in a commitment still in flight, and HTLCs to us
        // whose R we know and that the peer did not take off in time (claimed with R on
        // chain before it could refund them to itself).
        let due = inner.channel.deadlines(unix_now());
        if !due.claim.is_empty() {
            tracing::warn!(peer = %slot.peer, channel = slot.id, htlcs = due.claim.len(), "an HTLC we can claim with R nears its expiry; closing on chain");
            self.close_on_chain(slot, &mut inner).await;
            return;
        }
        if long_expired || !due.refund.is_empty() {
            tracing::warn!(peer = %slot.peer, channel = slot.id, "an expired HTLC of ours was not removed by agreement; closing on chain");
            self.close_on_chain(slot, &mut inner).await;
            return;
        }
        if inner.outbox.is_none() || state != State::Normal || inner.suspended.is_some() {
            return;
        }
        let expired: Option<Sha256> = inner.channel.balances().and_then(|cs| {
            cs.ours
                .htlcs
                .iter()
                .find(|h| matches!(h.expiry, Locktime::Blocks(b) if b <= height))
                .map(|h| h.r_hash)
        });
        if let Some(r_hash) = expired {
            match inner.channel.timeout_htlc(r_hash, unix_now()) {
                Ok(actions) => {
                    tracing::info!(peer = %slot.peer, r_hash = %hex::encode(r_hash.as_byte_array()), "timing out expired HTLC");
                    if let Err(e) = self.run_actions(slot, &mut inner, actions).await {
                        tracing::error!(peer = %slot.peer, channel = slot.id, error = %e, "timing out an HTLC failed");
                    }
                }
                Err(e) => tracing::debug!(error = %e, "cannot time out yet"),
            }
        }
    }
}

/// Packets that hand the peer a signature of ours on a transaction spending the anchor.
fn carries_signature(pkt: &Packet) -> bool {
    matches!(
        pkt,
        Packet::OpenAnchor(_)
            | Packet::OpenCommitSig(_)
            | Packet::UpdateAccept(_)
            | Packet::UpdateSignature(_)
            | Packet::Close(_)
            | Packet::CloseComplete(_)
    )
}

fn complete_waiter(inner: &mut SlotInner, result: Result<(), ControlError>) {
    if let Some((_, tx)) = inner.waiter.take() {
        let _ = tx.send(result);
    }
}

async fn wait_for(rx: oneshot::Receiver<Result<(), ControlError>>) -> Result<(), ControlError> {
    match tokio::time::timeout(COMMAND_TIMEOUT, rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(ControlError::PeerGone("the channel went away".into())),
        Err(_) => Err(ControlError::Timeout("the peer")),
    }
}
