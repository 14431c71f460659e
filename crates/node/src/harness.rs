//! In-process nodes for tests — the project's `create_network` (LDK's
//! `functional_test_utils`): two or three [`Node`]s on one in-process development chain,
//! their sessions over `tokio::io::duplex` instead of sockets, the watcher stepped by hand.
//! A [`ScriptedPeer`] plays a peer by hand over the same pipes (the attack tests), a
//! [`HangingChain`] a bitcoind that stops answering; [`Network::rpc`] makes a control call
//! by name, [`Network::tick_after`] moves the channel deadlines' clock.

use std::net::SocketAddr;
use std::sync::Arc;

use bitcoin::Amount;
use chain::DevChain;
use secp256k1::{PublicKey, Secp256k1, SecretKey};

use crate::node::{Identity, Node};
pub(crate) use hanging::HangingChain;
pub(crate) use scripted::{Anchor, ScriptedPeer};

pub(crate) mod hanging;
mod scripted;

/// Waits until `$cond` (an expression that may `.await`) holds, stepping every node's
/// watcher between looks; fails naming `$what` after about two seconds of looking.
macro_rules! eventually {
    ($net:expr, $what:expr, $cond:expr) => {{
        let mut held = false;
        for _ in 0..400 {
            if $cond {
                held = true;
                break;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            $net.step().await;
        }
        assert!(held, "never: {}", $what);
    }};
}
pub(crate) use eventually;

use crate::peers::Peers;
use crate::{build, load, store, watcher, NodeConfig};

/// Nodes on one chain.
pub(crate) struct Network {
    pub(crate) chain: DevChain,
    pub(crate) nodes: Vec<Arc<Node>>,
    configs: Vec<NodeConfig>,
    /// The chain as each node sees it (the development chain, or a wrapper of it).
    backends: Vec<Arc<dyn chain::Chain>>,
    _dir: tempfile::TempDir,
}

/// `n` nodes on a fresh development chain, each with the test settings `tweak` leaves.
pub(crate) async fn create_network(n: usize, tweak: impl Fn(&mut NodeConfig)) -> Network {
    create_network_on(n, tweak, |chain| Arc::new(chain.clone())).await
}

/// [`create_network`] with each node reaching the chain through what `backend` makes of
/// it (a chain that hangs, say).
pub(crate) async fn create_network_on(
    n: usize,
    tweak: impl Fn(&mut NodeConfig),
    backend: impl Fn(&DevChain) -> Arc<dyn chain::Chain>,
) -> Network {
    let dir = tempfile::tempdir().expect("temp dir");
    let chain = DevChain::open(&dir.path().join("chain")).expect("dev chain");
    let mut nodes = Vec::new();
    let mut configs = Vec::new();
    let mut backends = Vec::new();
    for i in 0..n {
        let mut config = NodeConfig::new(dir.path().join(format!("node{i}")));
        tweak(&mut config);
        std::fs::create_dir_all(&config.data_dir).expect("data dir");
        let seen = backend(&chain);
        nodes.push(start_node(Arc::clone(&seen), &config, i).await);
        configs.push(config);
        backends.push(seen);
    }
    Network {
        chain,
        nodes,
        configs,
        backends,
        _dir: dir,
    }
}

/// Node `i` on `chain` from what its data directory holds (new or not).
async fn start_node(chain: Arc<dyn chain::Chain>, config: &NodeConfig, i: usize) -> Arc<Node> {
    let key = SecretKey::from_slice(&[i as u8 + 1; 32]).expect("key");
    let identity = Identity {
        key,
        id: PublicKey::from_secret_key(&Secp256k1::signing_only(), &key),
        network: config.network,
    };
    // After a restart the old store's last close checkpoints its WAL and syncs; on a disk
    // busy with other writes that can outlast one busy time-out (10 s) of the new open.
    let mut store = store::Store::open(&config.data_dir).await;
    for _ in 0..5 {
        if store.is_ok() {
            break;
        }
        store = store::Store::open(&config.data_dir).await;
    }
    let store = store.expect("store");
    let keys = ::wallet::load_or_create_seed(&config.data_dir.join("wallet_seed"), config.network)
        .expect("seed");
    let addr = SocketAddr::from(([127, 0, 0, 1], 10_000 + i as u16));
    let node = build(config, identity, addr, chain, store, keys, String::new());
    let node = Arc::new(node);
    load(&node).await.expect("load");
    node
}

impl Network {
    /// Node `i`'s id.
    pub(crate) fn id(&self, i: usize) -> PublicKey {
        self.nodes[i].identity.id
    }

    /// A session between nodes `a` and `b` over an in-memory pipe, attached on both sides.
    pub(crate) async fn connect(&self, a: usize, b: usize) {
        let (left, right) = tokio::io::duplex(1 << 16);
        let config = session::Config::default();
        let key = |i: usize| SecretKey::from_slice(&[0x40 + i as u8; 32]).expect("key");
        let (sa, sb) = tokio::join!(
            session::handshake_over(left, self.nodes[a].identity.key, key(a), &config),
            session::handshake_over(right, self.nodes[b].identity.key, key(b), &config),
        );
        for (i, session, from) in [(a, sa, b), (b, sb, a)] {
            let node = &self.nodes[i];
            let slot = Arc::clone(&node.doors.slots)
                .try_acquire_owned()
                .expect("a peer slot");
            let address = self.nodes[from].doors.p2p_addr;
            let session = session.expect("handshake");
            Peers::attach(
                Arc::clone(node),
                session,
                address,
                node.shutdown.subscribe(),
                (slot, None),
            )
            .await;
        }
    }

    /// Stops node `i` as `stop` does (its peers hear "Shutting down", their sessions end by
    /// the lost-session rules) and starts it again on its data directory: only what it
    /// wrote is left. The binary's `kill -9` stays the process tests' to prove.
    pub(crate) async fn restart(&mut self, i: usize) {
        let old = Arc::clone(&self.nodes[i]);
        old.request_shutdown();
        // Its peer tasks end on the shutdown signal; wait until none counts as connected.
        for _ in 0..400 {
            if old.peers.list().iter().all(|p| !p.connected) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        // The store holds its database's lock while open (one process, one connection,
        // exclusive): the process ending releases it in the binary, closing it here.
        old.store.close().await;
        self.nodes[i] = start_node(Arc::clone(&self.backends[i]), &self.configs[i], i).await;
    }

    /// One watcher pass on every node. A node that dies at a crash point (during the pass
    /// or before it) is left alone: its pass never ends.
    pub(crate) async fn step(&self) {
        for node in &self.nodes {
            let mut crashed = node.manager.crashed();
            if *crashed.borrow() {
                continue;
            }
            let pass = tokio::spawn({
                let node = Arc::clone(node);
                async move { watcher::step(&node).await.map_err(|e| e.to_string()) }
            });
            tokio::select! {
                done = pass => done.expect("watcher task").expect("watcher pass"),
                _ = crashed.wait_for(|c| *c) => {}
            }
        }
    }

    /// Node `i` died at its crash point ([`crate::manager::CrashStep`]): it starts again
    /// from what it wrote, without the crash point. Its sessions ended without a goodbye
    /// when it died; the test connects its peers again.
    pub(crate) async fn restart_after_crash(&mut self, i: usize) {
        assert!(
            *self.nodes[i].manager.crashed().borrow(),
            "node {i} did not crash"
        );
        self.configs[i].crash_at = None;
        self.restart(i).await;
    }

    /// Mines `n` blocks, then a watcher pass on every node.
    pub(crate) async fn mine(&self, n: u32) {
        let payout = self.chain.faucet_script().to_owned();
        self.chain.mine(n, &payout).expect("mine");
        self.step().await;
    }

    /// Pays `sat` to a fresh address of node `i` and confirms it.
    pub(crate) async fn fund(&self, i: usize, sat: u64) {
        let address = self.nodes[i].wallet.new_address().await.expect("address");
        self.chain
            .faucet(&address.script_pubkey(), Amount::from_sat(sat))
            .expect("faucet");
        self.mine(1).await;
    }

    /// Node `a` opens a channel of `sat` to `b` (funded and connected first) and mines it
    /// to `min_depth`; returns the anchor's block hash.
    pub(crate) async fn open_channel(&self, a: usize, b: usize, sat: u64) -> bitcoin::BlockHash {
        self.fund(a, sat + 100_000).await;
        self.connect(a, b).await;
        self.nodes[a]
            .manager
            .open(&self.id(b), sat)
            .await
            .expect("open");
        let payout = self.chain.faucet_script().to_owned();
        let anchor_block = self.chain.mine(1, &payout).expect("mine")[0];
        self.step().await;
        for _ in 0..100 {
            if self.state(a, b).await == channel::State::Normal
                && self.state(b, a).await == channel::State::Normal
            {
                return anchor_block;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            self.step().await;
        }
        panic!("the channel did not go live");
    }

    /// The state of node `i`'s newest channel with `peer`.
    pub(crate) async fn state(&self, i: usize, peer: usize) -> channel::State {
        let slot = self.nodes[i]
            .manager
            .channels
            .latest(&self.id(peer))
            .expect("a channel");
        let state = slot.lock().await.channel.state();
        state
    }

    /// Whether node `i`'s channel with `peer` is suspended (its anchor below `min_depth`).
    pub(crate) async fn suspended(&self, i: usize, peer: usize) -> Option<u32> {
        let slot = self.nodes[i].manager.channels.latest(&self.id(peer))?;
        let suspended = slot.lock().await.anchor.suspended;
        suspended
    }

    /// A control call on node `i`, as `potluck cli` makes it: its JSON answer, or its error
    /// code and message.
    pub(crate) async fn rpc(
        &self,
        i: usize,
        method: &str,
        params: serde_json::Value,
    ) -> Result<serde_json::Value, (i64, String)> {
        crate::rpc::call(&self.nodes[i], method, &params).await
    }

    /// [`Network::rpc`] in a task of its own (a call that waits on the peer the test plays).
    pub(crate) fn rpc_in_background(
        &self,
        i: usize,
        method: &'static str,
        params: serde_json::Value,
    ) -> tokio::task::JoinHandle<Result<serde_json::Value, (i64, String)>> {
        let node = Arc::clone(&self.nodes[i]);
        tokio::spawn(async move { crate::rpc::call(&node, method, &params).await })
    }

    /// Node `i`'s channel with `peer` as `listchannels` shows it (`null` if none).
    pub(crate) async fn channel_json(&self, i: usize, peer: &PublicKey) -> serde_json::Value {
        let all = self
            .rpc(i, "listchannels", serde_json::json!([]))
            .await
            .expect("listchannels");
        all["channels"]
            .as_array()
            .and_then(|c| {
                c.iter()
                    .rev()
                    .find(|c| c["peer_id"] == peer.to_string().as_str())
            })
            .cloned()
            .unwrap_or_default()
    }

    /// Node `i`'s `getinfo`.
    pub(crate) async fn info(&self, i: usize) -> serde_json::Value {
        self.rpc(i, "getinfo", serde_json::json!([]))
            .await
            .expect("getinfo")
    }

    /// Node `i`'s wallet total in sat (`listfunds`' `total_sat`).
    pub(crate) async fn funds_sat(&self, i: usize) -> u64 {
        let funds = self
            .rpc(i, "listfunds", serde_json::json!([]))
            .await
            .expect("listfunds");
        funds["total_sat"].as_u64().expect("total_sat")
    }

    /// Runs node `i`'s channel timers as a watcher pass would `after` from now: time moves
    /// on for the deadlines without a test waiting for it.
    pub(crate) async fn tick_after(&self, i: usize, after: std::time::Duration) {
        let node = &self.nodes[i];
        let height = self.chain.height();
        let now = std::time::Instant::now() + after;
        for slot in node.manager.channels.all() {
            node.manager.tick(&slot, height, now).await;
        }
    }
}
