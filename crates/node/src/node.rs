//! The node: what the listener, the peer tasks, the watcher and the control API share,
//! and the loops that accept and dial peers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chain::Chain;
use secp256k1::{PublicKey, SecretKey};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::control_error::{ConnectFailure, ControlError};
use crate::manager::Manager;
use crate::peers::Peers;
use crate::store::Store;
use crate::wallet::NodeWallet;
use crate::{admission, watcher};

/// Who the node is.
pub(crate) struct Identity {
    /// The node key (the session's static key).
    pub(crate) key: SecretKey,
    /// Its public key: the node id.
    pub(crate) id: PublicKey,
    /// The chain the node's channels live on.
    pub(crate) network: bitcoin::Network,
}

/// Who may come in: the bound peer address, the session settings and the bounds on
/// handshakes and peers.
pub(crate) struct Doors {
    /// The bound peer address.
    pub(crate) p2p_addr: SocketAddr,
    /// Session settings of our own dials.
    pub(crate) session: session::Config,
    /// Session settings of peers that connect to us (a shorter handshake time-out).
    pub(crate) inbound_session: session::Config,
    /// Inbound connections that have not authenticated yet: bounded apart from `slots`.
    pub(crate) handshakes: Arc<admission::PendingHandshakes>,
    /// One per authenticated session (and per dial of ours while it handshakes).
    pub(crate) slots: Arc<Semaphore>,
    /// The share of `slots` that peers without a channel with us may hold after their
    /// handshake: the rest stays free for our own dials and for peers with channels.
    pub(crate) stranger_slots: Arc<Semaphore>,
}

/// Shared by the listener, the peer tasks, the watcher and the control API.
pub(crate) struct Node {
    pub(crate) identity: Identity,
    pub(crate) doors: Doors,
    /// The control API's cookie password.
    pub(crate) cookie_password: String,
    pub(crate) chain: Arc<dyn Chain>,
    pub(crate) store: Store,
    pub(crate) wallet: Arc<NodeWallet>,
    pub(crate) peers: Arc<Peers>,
    pub(crate) manager: Manager,
    pub(crate) watcher: watcher::WatchState,
    pub(crate) shutdown: watch::Sender<bool>,
}

impl Node {
    /// Asks every task to stop.
    pub(crate) fn request_shutdown(&self) {
        // `send` fails only without receivers: nothing is running that could stop.
        self.shutdown.send_replace(true);
    }

    /// Dials a peer and attaches the session once it is up (hello included).
    pub(crate) async fn connect(
        self: &Arc<Self>,
        addr: SocketAddr,
    ) -> Result<PublicKey, ControlError> {
        let failed = |reason: ConnectFailure| ControlError::Connect { addr, reason };
        // Dialling again would replace the live session (the peer takes a new authenticated
        // session as the successor of a half-open one): the operator asked for nothing new.
        if let Some(id) = self.peers.connected_at(addr) {
            return Err(failed(ConnectFailure::AlreadyConnected(id)));
        }
        let slot = Arc::clone(&self.doors.slots)
            .try_acquire_owned()
            .map_err(|_| failed(ConnectFailure::TooManyPeers))?;
        let session = session::connect(addr, &self.identity.key, &self.doors.session)
            .await
            .map_err(|e| failed(e.into()))?;
        if session.remote_node_id() == self.identity.id {
            close_refused(session, addr, "Connected to self").await;
            return Err(failed(ConnectFailure::OwnAddress));
        }
        let node_id = Peers::attach(
            Arc::clone(self),
            session,
            addr,
            self.shutdown.subscribe(),
            (slot, None),
        )
        .await;
        if let Err(e) = self.store.save_peer(&node_id, addr).await {
            tracing::warn!(error = %crate::error_report::Causes(&e), "cannot remember the peer's address");
        }
        Ok(node_id)
    }

    /// An inbound session that authenticated gets a peer slot and its peer task, or is
    /// closed: a session with ourselves always; otherwise a peer we have a channel with may
    /// use the share kept for our dials, a stranger only the rest.
    pub(crate) async fn attach_inbound(
        self: &Arc<Self>,
        session: session::Session,
        address: SocketAddr,
    ) {
        let peer = session.remote_node_id();
        if peer == self.identity.id {
            // Our own connection dialled back to us, or our own frames relayed between two
            // connections to us (each then hears the other's session key, and both
            // authenticate with our key). A session with ourselves would be registered as
            // a peer and fed its own packets: refuse it, as `connect` does.
            tracing::warn!(%address, "inbound session refused: the peer authenticated with our own node key");
            close_refused(session, address, "Connected to self").await;
            return;
        }
        let known = self.manager.channels.latest(&peer).is_some();
        let stranger = if known {
            None
        } else {
            match Arc::clone(&self.doors.stranger_slots).try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    tracing::warn!(%address, "peer refused: no slot left for peers without a channel");
                    close_refused(session, address, "Too many peers").await;
                    return;
                }
            }
        };
        let Ok(slot) = Arc::clone(&self.doors.slots).try_acquire_owned() else {
            tracing::warn!(%address, "peer refused: too many peers");
            close_refused(session, address, "Too many peers").await;
            return;
        };
        Peers::attach(
            Arc::clone(self),
            session,
            address,
            self.shutdown.subscribe(),
            (slot, stranger),
        )
        .await;
    }
}

/// Says why to a peer we refuse after its handshake, and hangs up.
async fn close_refused(session: session::Session, address: SocketAddr, problem: &str) {
    if let Err(e) = session.close(problem).await {
        tracing::debug!(%address, error = %crate::error_report::Causes(&e), "the refused peer did not take our goodbye");
    }
}

/// Accepts peers until shutdown; each handshake runs in its own task under the bounds on
/// pending handshakes (`admission`), and takes a peer slot once it authenticated.
pub(crate) async fn accept_loop(node: Arc<Node>, listener: TcpListener) {
    let mut shutdown = node.shutdown.subscribe();
    let mut backoff = Duration::from_millis(10);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let (stream, address) = match accepted {
            Ok(a) => {
                backoff = Duration::from_millis(10);
                a
            }
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!(error = %crate::error_report::Causes(&e), ?backoff, "accept failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        // Until it authenticates, a connection is a pending handshake, bounded per source
        // and in total; it takes a peer slot only once we know who it is.
        let pending = match node.doors.handshakes.admit(address.ip()) {
            Ok(p) => p,
            Err(refused) => {
                // Dropping the stream closes it. Debug only: a flood must not flood the log.
                tracing::debug!(%address, %refused, "connection refused before its handshake");
                continue;
            }
        };
        let node = Arc::clone(&node);
        tokio::spawn(async move {
            let handshake =
                session::accept(stream, &node.identity.key, &node.doors.inbound_session).await;
            // Over, whichever way it went: the source may start another.
            drop(pending);
            match handshake {
                Ok(session) => node.attach_inbound(session, address).await,
                Err(e) => {
                    tracing::info!(%address, error = %crate::error_report::Causes(&e), "handshake failed")
                }
            }
        });
    }
}

/// Dials again the peers we dialed before, while a channel with them is open.
pub(crate) async fn reconnect_loop(node: Arc<Node>) {
    let mut shutdown = node.shutdown.subscribe();
    let mut known: Option<(u64, Vec<(PublicKey, SocketAddr)>)> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        // The stored peers change rarely: read them again only when they did.
        let epoch = node.store.peers_epoch();
        if known.as_ref().is_none_or(|(at, _)| *at != epoch) {
            match node.store.peers().await {
                Ok(stored) => known = Some((epoch, stored)),
                Err(e) => {
                    tracing::debug!(error = %crate::error_report::Causes(&e), "cannot read the stored peers");
                    continue;
                }
            }
        }
        let peers = known.as_ref().map(|(_, p)| p.clone()).unwrap_or_default();
        for (node_id, addr) in peers {
            if node.peers.is_connected(&node_id)
                || node.manager.channels.active(&node_id).await.is_none()
            {
                continue;
            }
            match node.connect(addr).await {
                Ok(_) => tracing::info!(peer = %node_id, %addr, "reconnected"),
                Err(e) => {
                    tracing::debug!(peer = %node_id, %addr, error = %crate::error_report::Causes(&e), "reconnect failed")
                }
            }
        }
    }
}
