//! In-process nodes for tests — the project's `create_network` (LDK's
//! `functional_test_utils`): two or three [`Node`]s on one in-process development chain,
//! their sessions over `tokio::io::duplex` instead of sockets, the watcher stepped by hand.

use std::net::SocketAddr;
use std::sync::Arc;

use bitcoin::Amount;
use chain::DevChain;
use secp256k1::{PublicKey, Secp256k1, SecretKey};

use crate::node::{Identity, Node};
use crate::peers::Peers;
use crate::{build, load, store, watcher, NodeConfig};

/// Nodes on one chain.
pub(crate) struct Network {
    pub(crate) chain: DevChain,
    pub(crate) nodes: Vec<Arc<Node>>,
    _dir: tempfile::TempDir,
}

/// `n` nodes on a fresh development chain, each with the test settings `tweak` leaves.
pub(crate) async fn create_network(n: usize, tweak: impl Fn(&mut NodeConfig)) -> Network {
    let dir = tempfile::tempdir().expect("temp dir");
    let chain = DevChain::open(&dir.path().join("chain")).expect("dev chain");
    let mut nodes = Vec::new();
    for i in 0..n {
        let mut config = NodeConfig::new(dir.path().join(format!("node{i}")));
        tweak(&mut config);
        std::fs::create_dir_all(&config.data_dir).expect("data dir");
        let key = SecretKey::from_slice(&[i as u8 + 1; 32]).expect("key");
        let identity = Identity {
            key,
            id: PublicKey::from_secret_key(&Secp256k1::signing_only(), &key),
            network: config.network,
        };
        let store = store::Store::open(&config.data_dir).await.expect("store");
        let keys =
            ::wallet::load_or_create_seed(&config.data_dir.join("wallet_seed"), config.network)
                .expect("seed");
        let addr = SocketAddr::from(([127, 0, 0, 1], 10_000 + i as u16));
        let node = build(
            &config,
            identity,
            addr,
            Arc::new(chain.clone()),
            store,
            keys,
            String::new(),
        );
        let node = Arc::new(node);
        load(&node).await.expect("load");
        nodes.push(node);
    }
    Network {
        chain,
        nodes,
        _dir: dir,
    }
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

    /// One watcher pass on every node.
    pub(crate) async fn step(&self) {
        for node in &self.nodes {
            watcher::step(node).await.expect("watcher pass");
        }
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
}
