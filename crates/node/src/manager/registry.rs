//! The registry of channels: each [`Slot`] holds one channel behind its lock, with what the
//! node keeps around it (the peer's outbox, the control call waiting on it, the anchor
//! watch, the update clock).
//!
//! Locking: every input (a packet, a command, a chain event) locks the slot, feeds the
//! machine and performs the resulting actions in order before unlocking, so a `Persist`
//! has committed before a later `Send` leaves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use channel::Channel;
use secp256k1::PublicKey;
use tokio::sync::{mpsc, oneshot, Notify};
use wire::Packet;

use super::anchor::AnchorWatch;
use crate::control_error::ControlError;
use crate::store::ChannelId;

/// What a control call waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitKind {
    /// The anchor is broadcast.
    Open,
    /// Our proposal completed.
    Update,
    /// The close transaction is signed by both.
    Close,
}

/// A control call waiting for its exchange, and what it waits for.
pub(crate) type Waiter = (WaitKind, oneshot::Sender<Result<(), ControlError>>);

/// A channel and what the node keeps around it.
pub(crate) struct Slot {
    pub(crate) id: ChannelId,
    pub(crate) peer: PublicKey,
    inner: tokio::sync::Mutex<SlotInner>,
    /// Woken after every input: a command waiting for an update in flight tries again.
    pub(crate) changed: Notify,
}

/// The locked part of a [`Slot`].
pub(crate) struct SlotInner {
    pub(crate) channel: Channel,
    /// The last state written to disk; a dropped session falls back to it.
    pub(crate) persisted: Channel,
    pub(crate) outbox: Option<mpsc::Sender<Packet>>,
    pub(crate) waiter: Option<Waiter>,
    /// What the chain said of the anchor so far (missing since, suspended, double-spent).
    pub(crate) anchor: AnchorWatch,
    /// When the update in flight started (or the node found it in flight at start).
    pub(crate) update_since: Option<std::time::Instant>,
}

/// Why a channel was abandoned (the `abandoned` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Abandoned {
    /// Before it went live: nothing was ever at stake.
    Opening = 1,
    /// After it went live, its anchor could never confirm.
    Unbacked = 2,
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

/// A std mutex whose holder panicked leaves plain data behind: keep serving it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
    pub(crate) fn by_id(&self, id: ChannelId) -> Option<Arc<Slot>> {
        lock(&self.list).all.iter().find(|s| s.id == id).cloned()
    }

    pub(crate) fn remove(&self, slot: &Slot) {
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
            if !slot.inner.lock().await.channel.state().is_finished() {
                return Some(slot);
            }
        }
        None
    }

    /// The id of a peer we have a channel with, by its 33 bytes: the key already parsed (a
    /// control call names its peer in hex, and parsing decompresses the point, 4-5 us).
    pub(crate) fn known_peer(&self, serialized: &[u8; 33]) -> Option<PublicKey> {
        lock(&self.list)
            .by_peer
            .get(serialized)
            .and_then(|slots| slots.first())
            .map(|slot| slot.peer)
    }

    /// The newest channel with the peer, over or not.
    pub(crate) fn latest(&self, peer: &PublicKey) -> Option<Arc<Slot>> {
        lock(&self.list)
            .by_peer
            .get(&peer.serialize())
            .and_then(|slots| slots.last().cloned())
    }
}

/// Tells the machine the chain's height. It only keeps it (expiries are checked against it
/// when HTLCs come and go) and answers with no action.
pub(crate) fn set_height(channel: &mut Channel, height: u32) {
    let actions = channel.block_height(height);
    debug_assert!(actions.is_empty(), "block_height acts: {actions:?}");
}

impl SlotInner {
    /// Drops what is not on disk (an update in flight, a refused command), keeping the
    /// chain height the watcher gave: the height is not persisted with each block, and a
    /// stale one would misjudge expiries (an HTLC deadline, a new HTLC's expiry) until
    /// the next block.
    pub(crate) fn fall_back(&mut self) {
        let height = self.channel.height();
        self.channel = self.persisted.clone();
        set_height(&mut self.channel, height);
    }

    /// Like [`Self::fall_back`] after a lost session, also keeping the Rs we revealed in
    /// the undone update (`update_fulfill_htlc` reached the peer, which can use R now, but
    /// the HTLC is still in every commitment): the deadline that claims it on chain with R
    /// needs them. Returns whether any R was not on disk.
    pub(crate) fn fall_back_keeping_preimages(&mut self) -> bool {
        let revealed = self.channel.known_preimages().to_vec();
        self.fall_back();
        let mut kept = false;
        for r in revealed {
            kept |= self.channel.remember_preimage(r);
        }
        kept
    }

    /// Hands the waiting control call its answer, if one waits.
    pub(crate) fn complete_waiter(&mut self, result: Result<(), ControlError>) {
        if let Some((_, tx)) = self.waiter.take() {
            // The caller may have given up (its time-out): nobody to tell then.
            if tx.send(result).is_err() {
                tracing::debug!("the control call stopped waiting");
            }
        }
    }
}

impl Slot {
    pub(crate) fn new(id: ChannelId, peer: PublicKey, channel: Channel) -> Arc<Slot> {
        Arc::new(Slot {
            id,
            peer,
            inner: tokio::sync::Mutex::new(SlotInner {
                persisted: channel.clone(),
                channel,
                outbox: None,
                waiter: None,
                anchor: AnchorWatch::default(),
                update_since: None,
            }),
            changed: Notify::new(),
        })
    }

    pub(crate) async fn lock(&self) -> tokio::sync::MutexGuard<'_, SlotInner> {
        self.inner.lock().await
    }
}
