//! Peers: the registry of known nodes and one task per connected peer.
//!
//! Each peer task owns its session's two halves and a bounded command queue,
//! so a slow peer backs up only its own queue and never stalls the others.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use secp256k1::PublicKey;
use session::{Session, SessionError, SessionReader, SessionWriter};

use crate::node::Node;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit};
use wire::Packet;

/// Commands queued per peer; small, since commands wait for their answer anyway.
const QUEUE: usize = 16;

/// What `listpeers` shows of a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// Its node key.
    pub node_id: PublicKey,
    /// Where it was last reached.
    pub address: SocketAddr,
    /// Whether a session is up now.
    pub connected: bool,
}

/// A command for a peer's task.
#[derive(Debug)]
pub(crate) enum PeerCommand {
    /// Send `error{problem}` and hang up.
    Disconnect(String),
}

/// Packets waiting to be written to one peer; bounded, so a slow reader backs up only its own channel.
const OUTBOX: usize = 256;

struct Entry {
    address: SocketAddr,
    /// Set while a session is up; bumped per session so a late exit of an old task changes nothing.
    session: Option<(u64, mpsc::Sender<PeerCommand>, mpsc::Sender<Packet>)>,
    /// The task that reads the session: a crash point aborts it.
    #[cfg(test)]
    reader: Option<tokio::task::AbortHandle>,
}

/// Every peer this node has talked to since start.
#[derive(Default)]
pub(crate) struct Peers {
    entries: Mutex<HashMap<PublicKey, Entry>>,
    next_session: std::sync::atomic::AtomicU64,
    /// The last `error` a peer ended its session with, and who: why we were dropped, for
    /// the log's readers and the tests. One, so that strangers cannot grow it.
    last_peer_error: Mutex<Option<(PublicKey, String)>>,
    /// Set when the node dies at a test crash point: every writer flushes what is queued
    /// and ends without a goodbye.
    vanished: watch::Sender<bool>,
}

impl Peers {
    /// All known peers, sorted by node id.
    pub(crate) fn list(&self) -> Vec<PeerInfo> {
        let entries = self.lock();
        let mut peers: Vec<PeerInfo> = entries
            .iter()
            .map(|(id, e)| PeerInfo {
                node_id: *id,
                address: e.address,
                connected: e.session.is_some(),
            })
            .collect();
        peers.sort_by_key(|p| p.node_id.serialize());
        peers
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PublicKey, Entry>> {
        // A panic elsewhere while holding the lock leaves plain data behind; keep serving.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The problem of the `error` with which `node_id` ended the last session that ended
    /// with a peer's `error`, if that peer was `node_id`.
    #[cfg(test)]
    pub(crate) fn last_peer_error(&self, node_id: &PublicKey) -> Option<String> {
        let last = self
            .last_peer_error
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        last.as_ref()
            .filter(|(peer, _)| peer == node_id)
            .map(|(_, problem)| problem.clone())
    }

    /// Whether a session with the node is up.
    pub(crate) fn is_connected(&self, node_id: &PublicKey) -> bool {
        self.lock()
            .get(node_id)
            .is_some_and(|e| e.session.is_some())
    }

    /// The node whose session is up at `address`, if any.
    pub(crate) fn connected_at(&self, address: SocketAddr) -> Option<PublicKey> {
        self.lock()
            .iter()
            .find(|(_, e)| e.session.is_some() && e.address == address)
            .map(|(id, _)| *id)
    }

    /// The packet queue of the node's session, if one is up.
    pub(crate) fn outbox(&self, node_id: &PublicKey) -> Option<mpsc::Sender<Packet>> {
        self.lock()
            .get(node_id)
            .and_then(|e| e.session.as_ref().map(|(_, _, o)| o.clone()))
    }

    /// Starts the task of a freshly authenticated session. A session already up with the same
    /// node is replaced: the peer proved its key again, so the old one is half-open (its side
    /// vanished without a goodbye) or abandoned; keeping it would lock the peer out.
    pub(crate) async fn attach(
        state: Arc<Node>,
        session: Session,
        address: SocketAddr,
        shutdown: watch::Receiver<bool>,
        slot: (OwnedSemaphorePermit, Option<OwnedSemaphorePermit>),
    ) -> PublicKey {
        let peers = Arc::clone(&state.peers);
        let node_id = session.remote_node_id();
        let (tx, rx) = mpsc::channel(QUEUE);
        let (out_tx, out_rx) = mpsc::channel(OUTBOX);
        let id = peers
            .next_session
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let replaced = {
            let mut entries = peers.lock();
            let entry = entries.entry(node_id).or_insert(Entry {
                address,
                session: None,
                #[cfg(test)]
                reader: None,
            });
            entry.address = address;
            entry.session.replace((id, tx, out_tx.clone()))
        };
        if let Some((_, old, _)) = replaced {
            tracing::info!(peer = %node_id, %address, "new session replaces the old one");
            let _ = old.try_send(PeerCommand::Disconnect("Replaced by a new session".into()));
            // The old session is lost: its channel falls back to what is on disk, as always.
            state.manager.session_down(&node_id).await;
        }
        tracing::info!(peer = %node_id, %address, "peer connected");
        let (reader, writer) = session.into_split();
        let writer_task = tokio::spawn(write_loop(writer, out_rx, peers.vanished.subscribe()));
        state.manager.session_up(&node_id, out_tx.clone()).await;
        #[cfg(test)]
        let reader_peers = Arc::clone(&peers);
        let reader = tokio::spawn(async move {
            // The slot counts against the node's peer cap for the session's whole life.
            let _slot = slot;
            let reason = run_peer(&state, node_id, reader, &out_tx, rx, shutdown).await;
            tracing::info!(peer = %node_id, %reason, "peer disconnected");
            if let Disconnect::PeerError(problem) = &reason {
                *peers
                    .last_peer_error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some((node_id, problem.clone()));
            }
            let current = {
                let mut entries = peers.lock();
                match entries.get_mut(&node_id) {
                    Some(entry) if matches!(&entry.session, Some((current, _, _)) if *current == id) =>
                    {
                        entry.session = None;
                        true
                    }
                    _ => false,
                }
            };
            // A replaced session's channel was settled when the new one came.
            if current {
                state.manager.session_down(&node_id).await;
                // A peer we hold no open channel with is forgotten once it is gone: the list
                // (and the stored addresses) stay bounded however many strangers come by.
                if state.manager.channels.active(&node_id).await.is_none() {
                    let forgotten = {
                        let mut entries = peers.lock();
                        let idle = entries.get(&node_id).is_some_and(|e| e.session.is_none());
                        if idle {
                            entries.remove(&node_id);
                        }
                        idle
                    };
                    if forgotten {
                        if let Err(e) = state.store.forget_peer(&node_id).await {
                            tracing::warn!(peer = %node_id, error = %crate::error_report::Causes(&e), "cannot forget the peer's address");
                        }
                    }
                }
            }
            // Every sender is gone now: the writer flushes what is queued (the goodbye) and ends.
            drop(out_tx);
            let mut writer_task = writer_task;
            if tokio::time::timeout(std::time::Duration::from_secs(5), &mut writer_task)
                .await
                .is_err()
            {
                // The peer does not read: drop the socket rather than wait for it.
                writer_task.abort();
            }
        });
        #[cfg(test)]
        reader_peers.keep_reader(&node_id, id, reader.abort_handle());
        // The task runs on its own; only the crash points of the tests stop it.
        drop(reader);
        node_id
    }

    /// Waits (at most a second) until every session's queue of packets is empty and the
    /// last one had time to reach the socket: the binary's crash points SIGKILL the
    /// process after it, so that the packets queued before the point leave as an
    /// in-process crash lets them ([`Peers::vanish`]); what a kill loses from a queue is
    /// the lost-session rule's to handle, tested with the channel.
    #[cfg(all(feature = "test-hooks", not(test)))]
    pub(crate) async fn queued_sent(&self) {
        for _ in 0..1000 {
            let queued = self.lock().values().any(|e| {
                e.session
                    .as_ref()
                    .is_some_and(|(_, _, out)| out.capacity() < out.max_capacity())
            });
            if !queued {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    /// Keeps the reader task of session `id` with `node_id`, for [`Peers::vanish`].
    #[cfg(test)]
    fn keep_reader(&self, node_id: &PublicKey, id: u64, reader: tokio::task::AbortHandle) {
        if let Some(entry) = self.lock().get_mut(node_id) {
            if matches!(&entry.session, Some((current, _, _)) if *current == id) {
                entry.reader = Some(reader);
            }
        }
    }

    /// A test crash point: every session ends at once, without a goodbye. Their readers
    /// stop (the task that reached the point among them), their writers flush what was
    /// queued before and end, and no session counts as up any more.
    #[cfg(test)]
    pub(crate) fn vanish(&self) {
        self.vanished.send_replace(true);
        for entry in self.lock().values_mut() {
            entry.session = None;
            if let Some(reader) = entry.reader.take() {
                reader.abort();
            }
        }
    }

    /// Like [`Peers::disconnect`] but never waits (for callers holding a channel lock).
    pub(crate) fn kick(&self, node_id: &PublicKey, problem: &str) {
        if let Some((_, tx, _)) = self.lock().get(node_id).and_then(|e| e.session.as_ref()) {
            let _ = tx.try_send(PeerCommand::Disconnect(problem.to_owned()));
        }
    }

    /// Asks a connected peer's task to hang up; false if it is not connected.
    pub(crate) async fn disconnect(&self, node_id: &PublicKey, problem: &str) -> bool {
        let sender = self
            .lock()
            .get(node_id)
            .and_then(|e| e.session.as_ref().map(|(_, tx, _)| tx.clone()));
        // A full queue means the peer's task is busy with a packet: give it a moment, never
        // longer (the control API must not hang on a peer).
        match sender {
            Some(tx) => matches!(
                tokio::time::timeout(
                    std::time::Duration::from_secs(1),
                    tx.send(PeerCommand::Disconnect(problem.to_owned())),
                )
                .await,
                Ok(Ok(()))
            ),
            None => false,
        }
    }
}

/// Writes queued packets in order; an `error` packet is the last one. Once the node
/// `vanished` (a test crash point) it writes what is queued already and ends.
async fn write_loop(
    mut writer: SessionWriter,
    mut out: mpsc::Receiver<Packet>,
    mut vanished: watch::Receiver<bool>,
) {
    loop {
        let pkt = tokio::select! {
            biased;
            pkt = out.recv() => match pkt {
                Some(pkt) => pkt,
                None => break,
            },
            _ = async { vanished.wait_for(|v| *v).await.map(|_| ()) } => {
                while let Ok(pkt) = out.try_recv() {
                    if writer.send(&pkt).await.is_err() {
                        break;
                    }
                }
                break;
            }
        };
        let last = matches!(pkt, Packet::Error(_));
        if writer.send(&pkt).await.is_err() || last {
            break;
        }
    }
    let _ = writer.shutdown().await;
}

/// A `pkt` with no member we know and nothing we must understand (any unknown even field
/// fails earlier, in the schema check): a packet of a newer protocol version.
fn from_a_newer_version(e: &wire::DecodeError) -> bool {
    matches!(
        e.kind(),
        wire::DecodeErrorKind::OneofEmpty {
            message: "pkt",
            oneof: "pkt"
        }
    ) && e.path().is_empty()
}

/// Why a peer's session ended (logged).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Disconnect {
    /// The peer sent `error`.
    #[error("peer sent error: {0}")]
    PeerError(String),
    /// We refused a packet of the peer (the `error` we sent says why).
    #[error("{0}")]
    Refused(crate::manager::Refusal),
    /// A frame's padding was not zero.
    #[error("bad frame: non-zero padding")]
    BadPadding,
    /// A packet did not decode.
    #[error("bad packet: {0}")]
    BadPacket(wire::DecodeError),
    /// The session failed (closed, time-out, a bad MAC).
    #[error("{0}")]
    Session(SessionError),
    /// The operator or the node hung up on it.
    #[error("disconnected: {0}")]
    Kicked(String),
    /// The node dropped the peer's command queue.
    #[error("node dropped the peer")]
    Dropped,
    /// The node is stopping.
    #[error("node shutting down")]
    Shutdown,
}

/// Queues a goodbye without waiting: a peer that does not read gets none.
fn say(out: &mpsc::Sender<Packet>, pkt: Packet) {
    if out.try_send(pkt).is_err() {
        tracing::debug!("goodbye not queued: the peer does not read");
    }
}

/// Drives one session's incoming side until it ends; returns why it ended.
async fn run_peer(
    state: &Arc<Node>,
    node_id: PublicKey,
    mut reader: SessionReader,
    out: &mpsc::Sender<Packet>,
    mut commands: mpsc::Receiver<PeerCommand>,
    mut shutdown: watch::Receiver<bool>,
) -> Disconnect {
    loop {
        tokio::select! {
            received = reader.recv() => match received {
                Ok(pkt) => {
                    let error = match &pkt {
                        Packet::Error(e) => Some(e.problem.clone().unwrap_or_default()),
                        _ => None,
                    };
                    let handled = state.manager.packet(&node_id, out, pkt).await;
                    if let Some(problem) = error {
                        return Disconnect::PeerError(problem);
                    }
                    if let Err(refusal) = handled {
                        // The goodbye never waits on a peer that does not read.
                        say(out, refusal.reply());
                        return Disconnect::Refused(refusal);
                    }
                }
                Err(SessionError::Decode(e)) if from_a_newer_version(&e) => {
                    // The seed's versioning rule: unknown odd fields are optional, so a pkt
                    // whose only member is one carries nothing for us (the frame was consumed).
                    tracing::debug!(peer = %node_id, "ignored a pkt with no member we know");
                }
                Err(SessionError::Frame(session::FrameError::BadPadding)) => {
                    // The MAC was good, so both keystreams are still in step: say why.
                    say(out, Packet::error("Bad frame: non-zero padding"));
                    return Disconnect::BadPadding;
                }
                Err(SessionError::Decode(e)) => {
                    say(out, Packet::error(format!("Bad packet: {e}")));
                    return Disconnect::BadPacket(e);
                }
                Err(e) => return Disconnect::Session(e),
            },
            command = commands.recv() => match command {
                Some(PeerCommand::Disconnect(problem)) => {
                    say(out, Packet::error(problem.clone()));
                    return Disconnect::Kicked(problem);
                }
                None => return Disconnect::Dropped,
            },
            _ = async { shutdown.wait_for(|s| *s).await.map(|_| ()) } => {
                say(out, Packet::error("Shutting down"));
                return Disconnect::Shutdown;
            }
        }
    }
}
