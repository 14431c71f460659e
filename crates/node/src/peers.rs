//! Peers: the registry of known nodes and one task per connected peer.
//!
//! Each peer task owns its session's two halves and a bounded command queue,
//! so a slow peer backs up only its own queue and never stalls the others.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use secp256k1::PublicKey;
use session::{Session, SessionError};
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

struct Entry {
    address: SocketAddr,
    /// Set while a session is up; bumped per session so a late exit of an old task changes nothing.
    session: Option<(u64, mpsc::Sender<PeerCommand>)>,
}

/// Every peer this node has talked to since start.
#[derive(Default)]
pub(crate) struct Peers {
    entries: Mutex<HashMap<PublicKey, Entry>>,
    next_session: std::sync::atomic::AtomicU64,
}

/// Why a session could not be attached to the registry.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AttachError {
    #[error("already connected to {0}")]
    AlreadyConnected(PublicKey),
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

    /// Starts the task of a freshly authenticated session.
    ///
    /// # Errors
    /// A session with the same node is already up; the new one is closed with an `error` packet.
    pub(crate) async fn attach(
        self: &Arc<Self>,
        session: Session,
        address: SocketAddr,
        shutdown: watch::Receiver<bool>,
        slot: OwnedSemaphorePermit,
    ) -> Result<PublicKey, AttachError> {
        let node_id = session.remote_node_id();
        let (tx, rx) = mpsc::channel(QUEUE);
        let id = self
            .next_session
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let duplicate = {
            let mut entries = self.lock();
            let entry = entries.entry(node_id).or_insert(Entry {
                address,
                session: None,
            });
            if entry.session.is_some() {
                true
            } else {
                entry.address = address;
                entry.session = Some((id, tx));
                false
            }
        };
        if duplicate {
            let _ = session.close("Already connected").await;
            return Err(AttachError::AlreadyConnected(node_id));
        }
        tracing::info!(peer = %node_id, %address, "peer connected");
        let peers = Arc::clone(self);
        tokio::spawn(async move {
            // The slot counts against the node's peer cap for the session's whole life.
            let _slot = slot;
            let reason = run_peer(session, rx, shutdown).await;
            tracing::info!(peer = %node_id, %reason, "peer disconnected");
            let mut entries = peers.lock();
            if let Some(entry) = entries.get_mut(&node_id) {
                if matches!(&entry.session, Some((current, _)) if *current == id) {
                    entry.session = None;
                }
            }
        });
        Ok(node_id)
    }

    /// Asks a connected peer's task to hang up; false if it is not connected.
    pub(crate) async fn disconnect(&self, node_id: &PublicKey, problem: &str) -> bool {
        let sender = self
            .lock()
            .get(node_id)
            .and_then(|e| e.session.as_ref().map(|(_, tx)| tx.clone()));
        match sender {
            Some(tx) => tx
                .send(PeerCommand::Disconnect(problem.to_owned()))
                .await
                .is_ok(),
            None => false,
        }
    }
}

/// Drives one session until it ends; returns why it ended.
async fn run_peer(
    session: Session,
    mut commands: mpsc::Receiver<PeerCommand>,
    mut shutdown: watch::Receiver<bool>,
) -> String {
    let (mut reader, mut writer) = session.into_split();
    // Every event ends the session until channels are handled here (crates/channel).
    tokio::select! {
        received = reader.recv() => match received {
            Ok(Packet::Error(e)) => {
                format!("peer sent error: {}", e.problem.as_deref().unwrap_or(""))
            }
            Ok(other) => {
                // No channel is open on this session, so no packet can be expected here.
                let problem = format!("Unexpected packet {}", other.name());
                let _ = writer.send(&Packet::error(problem.clone())).await;
                problem
            }
            Err(SessionError::Decode(e)) => {
                let _ = writer.send(&Packet::error(format!("Bad packet: {e}"))).await;
                format!("bad packet: {e}")
            }
            Err(e) => e.to_string(),
        },
        command = commands.recv() => match command {
            Some(PeerCommand::Disconnect(problem)) => {
                let _ = writer.send(&Packet::error(problem.clone())).await;
                let _ = writer.shutdown().await;
                format!("disconnected: {problem}")
            }
            None => "node dropped the peer".into(),
        },
        _ = shutdown.changed() => {
            let _ = writer.send(&Packet::error("Shutting down")).await;
            let _ = writer.shutdown().await;
            "node shutting down".into()
        }
    }
}
