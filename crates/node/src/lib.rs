//! The payment-channel peer daemon: accepts and dials peers over the v3 session, runs a
//! channel over each, and serves the control API.
//!
//! [`start`] opens the database, loads the channels (applying the restart rules of
//! docs/node.md), binds the peer listener and the control API, writes the cookie and
//! returns a [`RunningNode`]. The rooms (docs/node.md, "Layout"): `node.rs` holds what
//! every task shares and the accept and reconnect loops; `peers.rs` one task per peer;
//! `manager/` the channels and their entry points, `manager/exec.rs` their actions;
//! `wallet.rs` keys, watched scripts and anchors; `watcher.rs` the chain; `store/`
//! SQLite; `rpc/` the control API (JSON-RPC over HTTP with the cookie as Basic auth, the
//! same scheme as Bitcoin Core).
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod admission;
#[cfg(test)]
mod attack_tests;
mod control_error;
pub mod control_url;
mod error_report;
#[cfg(test)]
mod error_scan_tests;
#[cfg(test)]
mod forward_crash_tests;
#[cfg(test)]
mod forward_onchain_tests;
#[cfg(test)]
mod forward_tests;
#[cfg(test)]
mod functional_tests;
#[cfg(test)]
mod harness;
pub mod identity;
mod manager;
mod node;
mod peers;
mod rpc;
pub mod rpc_help;
mod sides;
mod store;
#[cfg(test)]
mod txindex_tests;
mod wallet;
mod watcher;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chain::Chain;
use channel::ChannelConfig;
use secp256k1::{PublicKey, Secp256k1};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::node::Node;
use tokio::task::JoinHandle;

pub use peers::PeerInfo;

/// The channel snapshot codec, for `examples/snapshot_bench.rs` only.
#[doc(hidden)]
pub use store::snapshot::bench as snapshot_codec;

/// The least `--expiry-delta`, in blocks, with the default channel settings: a forward
/// whose downstream channel goes on chain needs our refund deadline after the outgoing
/// expiry (6), a block for our commitment, and our claim deadline's lead before the
/// incoming expiry (3), beside both channels' delays, which each forward's check adds
/// (docs/node.md, "Forwarding on chain").
pub const MIN_EXPIRY_DELTA: u32 = 10;

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
    /// How long an update may stay in flight before the session is dropped; an update that is
    /// not resumed within as long again (a new session) closes the channel on chain.
    pub update_timeout: Duration,
    /// How long a control call (`open`, `pay`, the HTLC methods, `close`) waits for its
    /// exchange with the peer to complete.
    pub command_timeout: Duration,
    /// The fixed part of our forwarding fee, in millisatoshi (`--fee-base-msat`).
    pub fee_base_msat: u64,
    /// The proportional part of our forwarding fee, in millionths of the amount forwarded
    /// (`--fee-per-millionth`).
    pub fee_per_millionth: u64,
    /// Blocks we keep between the expiry of an HTLC we forward and the one we offer
    /// (`--expiry-delta`).
    pub expiry_delta: u32,
    /// The furthest above the tip, in blocks, an incoming HTLC to forward may expire
    /// (`--max-expiry-blocks`).
    pub max_expiry_blocks: u32,
    /// At most this many forwards in flight on one outgoing channel
    /// (`--max-forwarded-htlcs-per-channel`).
    pub max_forwarded_htlcs_per_channel: usize,
    /// At most this many forwards in flight in all (`--max-forwarded-htlcs`).
    pub max_forwarded_htlcs: usize,
    /// The percentage of an outgoing channel's capacity forwards in flight on it may lock
    /// (`--max-forward-share-percent`).
    pub max_forward_share_percent: u8,
    /// TEST ONLY: enables the `dev-broadcast-revoked` control method (a node that cheats).
    #[cfg(feature = "test-hooks")]
    pub dev_allow_cheat: bool,
    /// TEST ONLY: the step of a forward at which the node dies (`forward_stored`,
    /// `downstream_committed`, `outcome_stored`, `upstream_committed`; docs/node.md).
    #[cfg(any(test, feature = "test-hooks"))]
    pub crash_at: Option<String>,
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
            command_timeout: Duration::from_secs(60),
            fee_base_msat: manager::route::Schedule::ASSUMED.base_msat,
            fee_per_millionth: manager::route::Schedule::ASSUMED.per_millionth,
            expiry_delta: manager::route::Schedule::ASSUMED.expiry_delta,
            max_expiry_blocks: manager::forward::Limits::DEFAULT.max_expiry_blocks,
            max_forwarded_htlcs_per_channel: manager::forward::Limits::DEFAULT.max_per_channel,
            max_forwarded_htlcs: manager::forward::Limits::DEFAULT.max_total,
            max_forward_share_percent: manager::forward::Limits::DEFAULT.max_share_percent,
            #[cfg(feature = "test-hooks")]
            dev_allow_cheat: false,
            #[cfg(any(test, feature = "test-hooks"))]
            crash_at: None,
        }
    }
}

/// Why the node could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// `--expiry-delta` is below what a forward needs to resolve on chain in time with the
    /// channel settings (their refund deadline and claim margin).
    #[error("--expiry-delta {delta} is below {least} blocks, the least a forward needs to resolve on chain in time")]
    ExpiryDeltaTooSmall {
        /// The delta configured.
        delta: u32,
        /// The least it may be.
        least: u32,
    },
    /// A file in the data directory could not be used.
    #[error("{0}")]
    Io(PathBuf, #[source] std::io::Error),
    /// The node key file is not a valid key.
    #[error("{0} does not hold a valid node key")]
    BadNodeKey(PathBuf),
    /// The operating system gave no randomness.
    #[error("no randomness")]
    Random(#[source] getrandom::Error),
    /// An address could not be bound.
    #[error("cannot bind {0}")]
    Bind(SocketAddr, #[source] std::io::Error),
    /// The database could not be opened or read.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The wallet seed file could not be used.
    #[error(transparent)]
    Seed(#[from] ::wallet::SeedFileError),
    /// The stored state could not be loaded.
    #[error("loading state")]
    Load(#[source] Box<dyn std::error::Error + Send + Sync>),
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
    node: Arc<Node>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningNode {
    /// Known peers.
    pub fn peers(&self) -> Vec<PeerInfo> {
        self.node.peers.list()
    }

    /// Resolves once shutdown was requested (by `stop` or [`RunningNode::shutdown`]).
    pub async fn stopped(&self) {
        let mut rx = self.node.shutdown.subscribe();
        // An error means the node is gone: stopped all the same.
        let _stopped = rx.wait_for(|stop| *stop).await;
    }

    /// Stops the node: peers get `error{"Shutting down"}`, the cookie and control URL files are removed.
    pub async fn shutdown(self) {
        self.node.request_shutdown();
        for task in self.tasks {
            if let Err(e) = task.await {
                tracing::warn!(error = %crate::error_report::Causes(&e), "a node task ended abnormally");
            }
        }
        // Give peer tasks a moment to say goodbye.
        tokio::time::sleep(Duration::from_millis(50)).await;
        for file in [&self.cookie_path, &self.control_url_path] {
            if let Err(e) = std::fs::remove_file(file) {
                tracing::warn!(file = %file.display(), error = %crate::error_report::Causes(&e), "cannot remove");
            }
        }
    }
}

/// Starts a node on `chain`.
///
/// # Errors
/// The data directory cannot be used, an address cannot be bound, or `--expiry-delta` is
/// too small for the channel settings.
pub async fn start(config: NodeConfig, chain: Arc<dyn Chain>) -> Result<RunningNode, NodeError> {
    let least = manager::forward::onchain_blocks(&config.channel);
    if config.expiry_delta < least {
        return Err(NodeError::ExpiryDeltaTooSmall {
            delta: config.expiry_delta,
            least,
        });
    }
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
    let keys = ::wallet::load_or_create_seed(&config.data_dir.join("wallet_seed"), config.network)?;
    let (cookie_path, cookie_password) = identity::write_cookie(&config.data_dir)?;
    // After the cookie: a client that finds the URL also finds the cookie it needs.
    let control_url_path = control_url::write(&config.data_dir, rpc_addr)
        .map_err(|e| NodeError::Io(config.data_dir.join(control_url::FILE_NAME), e))?;
    let identity = node::Identity {
        key: node_key,
        id: node_id,
        network: config.network,
    };
    let node = Arc::new(build(
        &config,
        identity,
        p2p_addr,
        chain,
        store,
        keys,
        cookie_password,
    ));
    #[cfg(feature = "test-hooks")]
    if config.dev_allow_cheat {
        tracing::warn!(
            "TEST ONLY: --dev-allow-cheat is on; this node can broadcast revoked states"
        );
    }
    load(&node).await?;
    let watch_task = tokio::spawn(watcher::run(Arc::clone(&node)));
    let reconnect_task = tokio::spawn(node::reconnect_loop(Arc::clone(&node)));
    let accept_task = tokio::spawn(node::accept_loop(Arc::clone(&node), listener));
    let rpc_task = tokio::spawn(rpc::serve(Arc::clone(&node), rpc_listener));
    tracing::info!(%node_id, peers = %p2p_addr, control = %rpc::describe(rpc_addr), "node started");
    Ok(RunningNode {
        node_id,
        p2p_addr,
        rpc_addr,
        cookie_path,
        control_url_path,
        node,
        tasks: vec![accept_task, rpc_task, watch_task, reconnect_task],
    })
}

/// The shared state of a node from its settings and what `start` opened.
fn build(
    config: &NodeConfig,
    identity: node::Identity,
    p2p_addr: SocketAddr,
    chain: Arc<dyn Chain>,
    store: store::Store,
    keys: ::wallet::Wallet,
    cookie_password: String,
) -> Node {
    let wallet = Arc::new(wallet::NodeWallet::new(
        keys,
        store.clone(),
        Arc::clone(&chain),
    ));
    let peers = Arc::new(peers::Peers::default());
    let settings = manager::Settings {
        channel: config.channel.clone(),
        anchor_wait_blocks: config.anchor_wait_blocks,
        update_timeout: config.update_timeout,
        command_timeout: config.command_timeout,
        max_pending_openings: config.max_pending_openings,
        forward: manager::route::Schedule {
            base_msat: config.fee_base_msat,
            per_millionth: config.fee_per_millionth,
            expiry_delta: config.expiry_delta,
        },
        forward_limits: manager::forward::Limits {
            max_expiry_blocks: config.max_expiry_blocks,
            max_per_channel: config.max_forwarded_htlcs_per_channel,
            max_total: config.max_forwarded_htlcs,
            max_share_percent: config.max_forward_share_percent,
            onchain_blocks: manager::forward::onchain_blocks(&config.channel),
        },
        #[cfg(feature = "test-hooks")]
        cheat_enabled: config.dev_allow_cheat,
        #[cfg(any(test, feature = "test-hooks"))]
        crash_at: config.crash_at.clone(),
    };
    let manager = manager::Manager::new(
        settings,
        store.clone(),
        Arc::clone(&chain),
        Arc::clone(&wallet),
        Arc::clone(&peers),
        identity.key,
    );
    // A fifth of the peer slots (at least one) is kept for our dials and for channel peers.
    let kept = (config.max_peers / 5).max(1).min(config.max_peers);
    let doors = node::Doors {
        p2p_addr,
        session: config.session.clone(),
        inbound_session: session::Config {
            handshake_timeout: config.inbound_handshake_timeout,
        },
        handshakes: admission::PendingHandshakes::new(
            config.max_pending_handshakes,
            config.max_pending_handshakes_per_ip,
        ),
        slots: Arc::new(Semaphore::new(config.max_peers)),
        stranger_slots: Arc::new(Semaphore::new(config.max_peers - kept)),
    };
    Node {
        identity,
        doors,
        cookie_password,
        chain,
        store,
        wallet,
        peers,
        manager,
        watcher: watcher::WatchState::default(),
        shutdown: watch::channel(false).0,
    }
}

/// Loads what the node keeps on disk: the wallet's watched scripts, then the channels
/// (with the restart rules of docs/node.md).
async fn load(node: &Node) -> Result<(), NodeError> {
    node.wallet
        .load_scripts()
        .await
        .map_err(|e| NodeError::Load(Box::new(e)))?;
    node.manager.load(node.store.channels().await?).await
}
