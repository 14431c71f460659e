//! The payment-channel peer daemon: accepts and dials peers over the v3 session, runs a
//! channel over each, and serves the control API.
//!
//! [`start`] opens the database, loads the channels (applying the restart rules of
//! docs/node.md), binds the peer listener and the control API, writes the cookie and
//! returns a [`RunningNode`]. Each peer runs in its own tasks (`peers.rs`); channels and
//! their actions are in `channels.rs`, the chain watcher in `watcher.rs`, SQLite in
//! `store.rs`; the control API (`rpc.rs`) is JSON-RPC over HTTP with the cookie as Basic
//! auth, the same scheme as Bitcoin Core.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod admission;
mod channels;
mod control_error;
pub mod control_url;
pub mod identity;
mod peers;
mod rpc;
pub mod rpc_help;
mod sides;
mod store;
mod watcher;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chain::Chain;
use channel::ChannelConfig;
use secp256k1::{PublicKey, Secp256k1, SecretKey};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

pub use peers::PeerInfo;

/// Settings of a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Where peers connect.
    pub listen: SocketAddr,
    /// Where the control API listens (keep it on loopback).
    pub rpc_bind: SocketAddr,
    /// Node key, cookie, wallet seed and the channel database.
    pub data_dir: PathBuf,
    /// The chain the node's channels live on.
    pub network: bitcoin::Network,
    /// Session settings of our own dials (handshake time-out).
    pub session: session::Config,
    /// How long a peer that connects to us may take to finish its handshake.
    pub inbound_handshake_timeout: Duration,
    /// At most this many inbound handshakes pending at once (they take no peer slot).
    pub max_pending_handshakes: usize,
    /// At most this many of them from one IPv4 address or IPv6 /64.
    pub max_pending_handshakes_per_ip: usize,
    /// At most this many authenticated sessions at once, our own dials' handshakes
    /// included; a fifth (at least one) is kept for our own dials and for peers we have a
    /// channel with.
    pub max_peers: usize,
    /// At most this many channels opened by peers may wait for the peer's anchor at once.
    pub max_pending_openings: usize,
    /// Limits and offers for new channels.
    pub channel: ChannelConfig,
    /// Blocks an acceptor waits for the peer's anchor to appear before it forgets the channel.
    pub anchor_wait_blocks: u32,
    /// Blocks after its expiry that an HTLC we offered may stay unresolved before we close on chain.
    pub htlc_close_after_blocks: u32,
    /// How long an update may stay in flight before the session is dropped; an update that is
    /// not resumed within as long again (a new session) closes the channel on chain.
    pub update_timeout: Duration,
    /// TEST ONLY: enables the `dev-broadcast-revoked` control method (a node that cheats).
    #[cfg(feature = "test-hooks")]
    pub dev_allow_cheat: bool,
}

impl NodeConfig {
    /// Defaults of DESIGN §6: peers on 127.0.0.1:9735, control API on 127.0.0.1:9736, regtest.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        NodeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9735)),
            rpc_bind: SocketAddr::from(([127, 0, 0, 1], 9736)),
            data_dir: data_dir.into(),
            network: bitcoin::Network::Regtest,
            session: session::Config::default(),
            // An honest handshake is two round trips; a silent connection frees its place soon.
            inbound_handshake_timeout: Duration::from_secs(10),
            max_pending_handshakes: 128,
            max_pending_handshakes_per_ip: 8,
            max_peers: 1000,
            max_pending_openings: 50,
            channel: ChannelConfig {
                // Small enough for a development chain, large enough to react to a cheat.
                delay: wire::Locktime::Blocks(6),
                ..ChannelConfig::default()
            },
            // A day: the funder has all the time it needs to broadcast; we hold nothing meanwhile.
            anchor_wait_blocks: 144,
            update_timeout: Duration::from_secs(60),
            htlc_close_after_blocks: 6,
            #[cfg(feature = "test-hooks")]
            dev_allow_cheat: false,
        }
    }
}

/// Why the node could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// A file in the data directory could not be used.
    #[error("{0}: {1}")]
    Io(PathBuf, #[source] std::io::Error),
    /// The node key file is not a valid key.
    #[error("{0} does not hold a valid node key")]
    BadNodeKey(PathBuf),
    /// The operating system gave no randomness.
    #[error("no randomness: {0}")]
    Random(String),
    /// An address could not be bound.
    #[error("cannot bind {0}: {1}")]
    Bind(SocketAddr, #[source] std::io::Error),
    /// The database could not be opened or read.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The wallet seed file could not be used.
    #[error(transparent)]
    Seed(#[from] wallet::SeedFileError),
    /// The stored state could not be loaded.
    #[error("loading state: {0}")]
    Load(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Shared by the listener, the peer tasks and the control API.
pub(crate) struct NodeState {
    node_key: SecretKey,
    node_id: PublicKey,
    p2p_addr: SocketAddr,
    network: bitcoin::Network,
    session: session::Config,
    /// Session settings of peers that connect to us (a shorter handshake time-out).
    inbound_session: session::Config,
    /// Inbound connections that have not authenticated yet: bounded apart from `slots`.
    handshakes: Arc<admission::PendingHandshakes>,
    chain: Arc<dyn Chain>,
    cookie_password: String,
    peers: Arc<peers::Peers>,
    slots: Arc<Semaphore>,
    /// The share of `slots` that peers without a channel with us may hold after their
    /// handshake: the rest stays free for our own dials and for peers with channels.
    stranger_slots: Arc<Semaphore>,
    max_pending_openings: usize,
    shutdown: watch::Sender<bool>,
    store: store::Store,
    wallet: wallet::Wallet,
    /// Scripts of every key the wallet handed out → their derivation path.
    scripts: std::sync::Mutex<std::collections::HashMap<bitcoin::ScriptBuf, wallet::KeyPath>>,
    channels: channels::Channels,
    channel_config: ChannelConfig,
    anchor_wait_blocks: u32,
    update_timeout: Duration,
    htlc_close_after_blocks: u32,
    #[cfg(feature = "test-hooks")]
    cheat_enabled: bool,
    /// One anchor is funded at a time, so two opens never pick the same outputs.
    funding: tokio::sync::Mutex<()>,
    /// Held from the check that a peer has no channel until its new channel is listed, so
    /// that two openings with one peer (two `open` calls, or ours and the peer's) cannot
    /// both pass the check.
    openings: tokio::sync::Mutex<()>,
    /// One watcher pass at a time (the loop and tests that step it).
    watch_pass: tokio::sync::Mutex<()>,
    /// Set by the watcher's first pass after a start.
    watched_once: std::sync::atomic::AtomicBool,
    /// The stored hash of the last block the watcher's last complete pass had scanned.
    scanned_tip: std::sync::Mutex<Option<bitcoin::BlockHash>>,
    /// The height at which each queued claim or penalty was first sent (a version still
    /// unconfirmed a block later is replaced at a higher fee). Not persisted: after a
    /// restart the count starts again, which only delays the next bump by a block.
    sent_at: std::sync::Mutex<std::collections::HashMap<bitcoin::Txid, u32>>,
}

impl NodeState {
    fn request_shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Dials a peer and attaches the session once it is up (hello included).
    async fn connect(
        self: &Arc<Self>,
        addr: SocketAddr,
    ) -> Result<PublicKey, control_error::ControlError> {
        use control_error::{ConnectFailure, ControlError};
        let failed = |reason: ConnectFailure| ControlError::Connect { addr, reason };
        // Dialling again would replace the live session (the peer takes a new authenticated
        // session as the successor of a half-open one): the operator asked for nothing new.
        if let Some(id) = self.peers.connected_at(addr) {
            return Err(failed(ConnectFailure::AlreadyConnected(id)));
        }
        let slot = Arc::clone(&self.slots)
            .try_acquire_owned()
            .map_err(|_| failed(ConnectFailure::TooManyPeers))?;
        let session = session::connect(addr, &self.node_key, &self.session)
            .await
            .map_err(|e| failed(e.into()))?;
        if session.remote_node_id() == self.node_id {
            let _ = session.close("Connected to self").await;
            return Err(failed(ConnectFailure::OwnAddress));
        }
        let node_id = peers::Peers::attach(
            Arc::clone(self),
            session,
            addr,
            self.shutdown.subscribe(),
            (slot, None),
        )
        .await;
        if let Err(e) = self
            .store
            .save_peer(&node_id.to_string(), &addr.to_string())
            .await
        {
            tracing::warn!(error = %e, "cannot remember the peer's address");
        }
        Ok(node_id)
    }
}

/// A started node.
pub struct RunningNode {
    /// This node's id (public node key).
    pub node_id: PublicKey,
    /// The bound peer address.
    pub p2p_addr: SocketAddr,
    /// The bound control API address.
    pub rpc_addr: SocketAddr,
    /// The cookie file for the control API.
    pub cookie_path: PathBuf,
    /// The file naming the control API's URL, for `potluck cli --data-dir`.
    pub control_url_path: PathBuf,
    state: Arc<NodeState>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningNode {
    /// Known peers.
    pub fn peers(&self) -> Vec<PeerInfo> {
        self.state.peers.list()
    }

    /// Resolves once shutdown was requested (by `stop` or [`RunningNode::shutdown`]).
    pub async fn stopped(&self) {
        let mut rx = self.state.shutdown.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
    }

    /// Stops the node: peers get `error{"Shutting down"}`, the cookie and control URL files are removed.
    pub async fn shutdown(self) {
        self.state.request_shutdown();
        for task in self.tasks {
            let _ = task.await;
        }
        // Give peer tasks a moment to say goodbye.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = std::fs::remove_file(&self.cookie_path);
        let _ = std::fs::remove_file(&self.control_url_path);
    }
}

/// Starts a node on `chain`.
///
/// # Errors
/// The data directory cannot be used or an address cannot be bound.
pub async fn start(config: NodeConfig, chain: Arc<dyn Chain>) -> Result<RunningNode, NodeError> {
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|e| NodeError::Io(config.data_dir.clone(), e))?;
    let node_key = identity::load_or_create_node_key(&config.data_dir)?;
    let node_id = PublicKey::from_secret_key(&Secp256k1::signing_only(), &node_key);
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| NodeError::Bind(config.listen, e))?;
    let p2p_addr = listener
        .local_addr()
        .map_err(|e| NodeError::Bind(config.listen, e))?;
    let rpc_listener = TcpListener::bind(config.rpc_bind)
        .await
        .map_err(|e| NodeError::Bind(config.rpc_bind, e))?;
    let rpc_addr = rpc_listener
        .local_addr()
        .map_err(|e| NodeError::Bind(config.rpc_bind, e))?;
    let store = store::Store::open(&config.data_dir).await?;
    let wallet = wallet::load_or_create_seed(&config.data_dir.join("wallet_seed"), config.network)?;
    let (cookie_path, cookie_password) = identity::write_cookie(&config.data_dir)?;
    // After the cookie: a client that finds the URL also finds the cookie it needs.
    let control_url_path = control_url::write(&config.data_dir, rpc_addr)
        .map_err(|e| NodeError::Io(config.data_dir.join(control_url::FILE_NAME), e))?;
    let (shutdown, _) = watch::channel(false);
    let state = Arc::new(NodeState {
        node_key,
        node_id,
        p2p_addr,
        network: config.network,
        session: config.session.clone(),
        inbound_session: session::Config {
            handshake_timeout: config.inbound_handshake_timeout,
        },
        handshakes: admission::PendingHandshakes::new(
            config.max_pending_handshakes,
            config.max_pending_handshakes_per_ip,
        ),
        chain,
        cookie_password,
        peers: Arc::new(peers::Peers::default()),
        slots: Arc::new(Semaphore::new(config.max_peers)),
        stranger_slots: Arc::new(Semaphore::new(
            config.max_peers - (config.max_peers / 5).max(1).min(config.max_peers),
        )),
        max_pending_openings: config.max_pending_openings,
        shutdown,
        store,
        wallet,
        scripts: std::sync::Mutex::default(),
        channels: channels::Channels::default(),
        channel_config: config.channel.clone(),
        anchor_wait_blocks: config.anchor_wait_blocks,
        update_timeout: config.update_timeout,
        htlc_close_after_blocks: config.htlc_close_after_blocks,
        #[cfg(feature = "test-hooks")]
        cheat_enabled: config.dev_allow_cheat,
        funding: tokio::sync::Mutex::new(()),
        openings: tokio::sync::Mutex::new(()),
        watch_pass: tokio::sync::Mutex::new(()),
        watched_once: std::sync::atomic::AtomicBool::new(false),
        scanned_tip: std::sync::Mutex::new(None),
        sent_at: std::sync::Mutex::default(),
    });
    #[cfg(feature = "test-hooks")]
    if config.dev_allow_cheat {
        tracing::warn!(
            "TEST ONLY: --dev-allow-cheat is on; this node can broadcast revoked states"
        );
    }
    state
        .load_scripts()
        .await
        .map_err(|e| NodeError::Load(Box::new(e)))?;
    for row in state.store.channels().await? {
        let Ok(peer) = row.peer_id.parse::<PublicKey>() else {
            continue;
        };
        let slot = channels::Slot::new(row.id, peer, row.channel);
        state.channels.add(Arc::clone(&slot));
        // A restart is a lost session: same rules (abandon an unfunded open, close an interrupted update).
        let mut inner = slot.lock().await;
        state.settle_after_session(&slot, &mut inner).await;
        // A close signed by both is saved before it is queued: a crash in between left it
        // only in the channel's state. Queued again (a no-op once it is in the queue).
        if let Some(close) = inner.channel.signed_close() {
            state.store.queue_broadcast(row.id, close, 0, 0).await?;
        }
    }
    let watch_task = tokio::spawn(watcher::run(Arc::clone(&state)));
    let reconnect_task = tokio::spawn(reconnect_loop(Arc::clone(&state)));

    let accept_task = tokio::spawn(accept_loop(Arc::clone(&state), listener));
    let rpc_state = Arc::clone(&state);
    let mut rpc_shutdown = state.shutdown.subscribe();
    let rpc_task = tokio::spawn(async move {
        let app = rpc::router(rpc_state);
        // Answers are small and each call waits for its answer: no Nagle delay on them.
        let rpc_listener = axum::serve::ListenerExt::tap_io(rpc_listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let served = axum::serve(rpc_listener, app)
            .with_graceful_shutdown(async move {
                let _ = rpc_shutdown.wait_for(|stop| *stop).await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "control API stopped");
        }
    });
    tracing::info!(%node_id, peers = %p2p_addr, control = %rpc::describe(rpc_addr), "node started");
    Ok(RunningNode {
        node_id,
        p2p_addr,
        rpc_addr,
        cookie_path,
        control_url_path,
        state,
        tasks: vec![accept_task, rpc_task, watch_task, reconnect_task],
    })
}

/// Accepts peers until shutdown; each handshake runs in its own task under the bounds on
/// pending handshakes (`admission`), and takes a peer slot once it authenticated.
async fn accept_loop(state: Arc<NodeState>, listener: TcpListener) {
    let mut shutdown = state.shutdown.subscribe();
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
                tracing::warn!(error = %e, ?backoff, "accept failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        // Until it authenticates, a connection is a pending handshake, bounded per source
        // and in total; it takes a peer slot only once we know who it is.
        let pending = match state.handshakes.admit(address.ip()) {
            Ok(p) => p,
            Err(refused) => {
                // Dropping the stream closes it. Debug only: a flood must not flood the log.
                tracing::debug!(%address, %refused, "connection refused before its handshake");
                continue;
            }
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let handshake = session::accept(stream, &state.node_key, &state.inbound_session).await;
            // Over, whichever way it went: the source may start another.
            drop(pending);
            match handshake {
                Ok(session) => state.attach_inbound(session, address).await,
                Err(e) => tracing::info!(%address, error = %e, "handshake failed"),
            }
        });
    }
}

impl NodeState {
    /// An inbound session that authenticated gets a peer slot and its peer task, or is
    /// closed: a session with ourselves always; otherwise a peer we have a channel with may
    /// use the share kept for our dials, a stranger only the rest.
    async fn attach_inbound(self: &Arc<Self>, session: session::Session, address: SocketAddr) {
        let peer = session.remote_node_id();
        if peer == self.node_id {
            // Our own connection dialled back to us, or our own frames relayed between two
            // connections to us (each then hears the other's session key, and both
            // authenticate with our key). A session with ourselves would be registered as
            // a peer and fed its own packets: refuse it, as `connect` does.
            tracing::warn!(%address, "inbound session refused: the peer authenticated with our own node key");
            close_refused(session, address, "Connected to self").await;
            return;
        }
        let known = self.channels.latest(&peer).is_some();
        let stranger = if known {
            None
        } else {
            match Arc::clone(&self.stranger_slots).try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    tracing::warn!(%address, "peer refused: no slot left for peers without a channel");
                    close_refused(session, address, "Too many peers").await;
                    return;
                }
            }
        };
        let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
            tracing::warn!(%address, "peer refused: too many peers");
            close_refused(session, address, "Too many peers").await;
            return;
        };
        peers::Peers::attach(
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
        tracing::debug!(%address, error = %e, "the refused peer did not take our goodbye");
    }
}

/// Dials again the peers we dialed before, while a channel with them is open.
async fn reconnect_loop(state: Arc<NodeState>) {
    let mut shutdown = state.shutdown.subscribe();
    let mut known: Option<(u64, Vec<(PublicKey, SocketAddr)>)> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        // The stored peers change rarely: read and parse them again only when they did.
        let epoch = state.store.peers_epoch();
        if known.as_ref().is_none_or(|(at, _)| *at != epoch) {
            let Ok(stored) = state.store.peers().await else {
                continue;
            };
            let parsed = stored
                .iter()
                .filter_map(|(id, address)| {
                    Some((
                        id.parse::<PublicKey>().ok()?,
                        address.parse::<SocketAddr>().ok()?,
                    ))
                })
                .collect();
            known = Some((epoch, parsed));
        }
        let peers = known.as_ref().map(|(_, p)| p.clone()).unwrap_or_default();
        for (node_id, addr) in peers {
            if state.peers.is_connected(&node_id) || state.channels.active(&node_id).await.is_none()
            {
                continue;
            }
            match state.connect(addr).await {
                Ok(_) => tracing::info!(peer = %node_id, %addr, "reconnected"),
                Err(e) => tracing::debug!(peer = %node_id, %addr, error = %e, "reconnect failed"),
            }
        }
    }
}
