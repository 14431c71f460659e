//! A scripted peer in process: the test side of a session over `tokio::io::duplex` with a
//! [`Node`](crate::node::Node). It runs the real channel machine where it plays fair and
//! sends hand-built packets where it lies (an anchor that pays elsewhere, a poisoned HTLC),
//! as `crates/potluck/tests/support/peer.rs` does over TCP against a process.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use bitcoin::hashes::Hash as _;
use bitcoin::{Amount, OutPoint, Transaction, Txid};
use chain::Chain as _;
use channel::{Action, AnchorRole, CState, Channel, ChannelConfig, ChannelSecrets, Event};
use secp256k1::{PublicKey, Secp256k1, SecretKey};
use session::Session;
use wire::{OpenAnchor, OpenChannel, Packet, Sha256d};

use super::Network;

/// How long a packet the node owes us may take; only a failing test waits it out.
const PATIENCE: Duration = Duration::from_secs(10);

/// How the scripted funder's anchor lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Anchor {
    /// A real transaction paying the agreed amount to the 2-of-2: fair play.
    Honest,
    /// A real transaction whose output pays someone else.
    PaysElsewhere,
    /// A real transaction paying the 2-of-2 less than the amount claimed.
    PaysTooLittle,
    /// A transaction id no chain has ever seen.
    DoesNotExist,
    /// A real anchor built from a coin of the peer's own wallet, so that it can
    /// double-spend that coin later ([`ScriptedPeer::double_spend_anchor`]).
    OwnCoin,
}

/// The test side of a session with node `node` of a [`Network`].
pub(crate) struct ScriptedPeer {
    session: Option<Session>,
    /// The node it talks to (an index into the network).
    node: usize,
    /// Its node id.
    pub(crate) node_id: PublicKey,
    /// Its channel machine.
    pub(crate) channel: Channel,
    config: ChannelConfig,
    /// Its channel secrets.
    pub(crate) secrets: ChannelSecrets,
    /// Every packet the node sent it, in order.
    pub(crate) received: Vec<Packet>,
    seed: u8,
    own_coin: Option<::wallet::SpendableOutput>,
}

fn key(byte: u8) -> SecretKey {
    SecretKey::from_slice(&[byte; 32]).expect("a valid key")
}

/// A session key not used before in this process (keys of `[n; 32]`, n in 0x10..0xf0).
fn session_key() -> SecretKey {
    static NEXT: AtomicU8 = AtomicU8::new(0);
    key(0x10 + NEXT.fetch_add(1, Ordering::Relaxed) % 0xe0)
}

/// The scripted peer's on-chain wallet (not the node's).
fn peer_wallet() -> ::wallet::Wallet {
    ::wallet::Wallet::from_seed(&[0x3c; 32], bitcoin::Network::Regtest).expect("wallet")
}

impl Network {
    /// A session of the stranger with node key `[seed; 32]` with node `i`, accepted as the
    /// node accepts an inbound connection (its own-key check and its peer slots included);
    /// `None` if either side gave up on the handshake.
    pub(crate) async fn dial(&self, i: usize, seed: u8) -> Option<Session> {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let accepted = self.accept(
            i,
            theirs,
            SocketAddr::from(([127, 0, 0, 1], 20_000 + u16::from(seed))),
        );
        let config = session::Config::default();
        let ours = session::handshake_over(ours, key(seed), session_key(), &config);
        let (mine, _) = tokio::join!(ours, accepted);
        mine.ok()
    }

    /// Runs node `i`'s side of an inbound connection on `stream` from `address`: its
    /// handshake, then the checks of an authenticated session. Returns the node id the
    /// peer authenticated with, if it did.
    pub(crate) async fn accept<S>(
        &self,
        i: usize,
        stream: S,
        address: SocketAddr,
    ) -> Option<PublicKey>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let node = &self.nodes[i];
        let session = session::handshake_over(
            stream,
            node.identity.key,
            session_key(),
            &node.doors.inbound_session,
        )
        .await
        .ok()?;
        let remote = session.remote_node_id();
        node.attach_inbound(session, address).await;
        Some(remote)
    }

    /// A scripted peer with node key `[seed; 32]`, connected to node `i`.
    pub(crate) async fn scripted_peer(&self, i: usize, seed: u8) -> ScriptedPeer {
        let session = self.dial(i, seed).await.expect("a session with the node");
        let config = ChannelConfig {
            delay: wire::Locktime::Blocks(6),
            // We may offer HTLCs the node will not take (it declines them itself).
            max_htlc_expiry_blocks: 100_000,
            ..ChannelConfig::default()
        };
        let secrets = ChannelSecrets {
            commit_key: key(seed.wrapping_add(1)),
            final_key: key(seed.wrapping_add(2)),
            revocation_seed: [seed.wrapping_add(3); 32],
        };
        ScriptedPeer {
            session: Some(session),
            node: i,
            node_id: PublicKey::from_secret_key(&Secp256k1::new(), &key(seed)),
            channel: Channel::new(
                config.clone(),
                secrets.clone(),
                AnchorRole::Fund { anchor_sat: 0 },
            ),
            config,
            secrets,
            received: Vec::new(),
            seed,
            own_coin: None,
        }
    }
}

impl ScriptedPeer {
    fn session(&mut self) -> &mut Session {
        self.session.as_mut().expect("session is up")
    }

    /// A new session with the same node key (the channel machine is kept).
    pub(crate) async fn reconnect(&mut self, net: &Network) {
        self.session = None;
        self.session = Some(net.dial(self.node, self.seed).await.expect("a new session"));
    }

    /// A new session while the old one stays open on our side (a half-open connection
    /// the node cannot tell from a live one). Returns the old one.
    pub(crate) async fn reconnect_keep_old(&mut self, net: &Network) -> Option<Session> {
        let old = self.session.take();
        self.session = Some(net.dial(self.node, self.seed).await.expect("a new session"));
        old
    }

    /// Drops the session without a goodbye.
    pub(crate) fn hang_up(&mut self) {
        self.session = None;
    }

    /// Sends one packet.
    pub(crate) async fn send(&mut self, pkt: &Packet) {
        self.session().send(pkt).await.expect("send");
    }

    /// Sends raw bytes as one frame.
    pub(crate) async fn send_payload(&mut self, payload: &[u8]) {
        self.session().send_payload(payload).await.expect("send");
    }

    /// Sends `payload` in a frame with a valid MAC whose padding is not zeros.
    pub(crate) async fn send_badly_padded(&mut self, payload: &[u8]) {
        self.session()
            .send_badly_padded(payload, 0x5a)
            .await
            .expect("send");
    }

    /// The next packet within `wait`; `Ok(None)` on time-out, `Err` once the session ended.
    pub(crate) async fn recv(&mut self, wait: Duration) -> Result<Option<Packet>, String> {
        let session = self.session.as_mut().expect("session is up");
        match tokio::time::timeout(wait, session.recv()).await {
            Err(_) => Ok(None),
            Ok(Ok(pkt)) => {
                self.received.push(pkt.clone());
                Ok(Some(pkt))
            }
            Ok(Err(e)) => Err(e.to_string()),
        }
    }

    /// The next packet named `name` (the others are kept in `received`), stepping the
    /// node's watcher while it is quiet.
    pub(crate) async fn expect(&mut self, net: &Network, name: &str) -> Packet {
        for _ in 0..(PATIENCE.as_millis() / 20) {
            match self.recv(Duration::from_millis(20)).await {
                Ok(Some(p)) if p.name() == name => return p,
                Ok(Some(_)) => {}
                Ok(None) => net.step().await,
                Err(e) => panic!(
                    "no {name}: the session ended ({e}); got {:?}",
                    self.received.iter().map(Packet::name).collect::<Vec<_>>()
                ),
            }
        }
        panic!(
            "no {name} from the node; got {:?}",
            self.received.iter().map(Packet::name).collect::<Vec<_>>()
        );
    }

    /// The first `error` the node sends within [`PATIENCE`] (stepping its watcher), or why
    /// none came.
    pub(crate) async fn error(&mut self, net: &Network) -> Result<String, String> {
        for _ in 0..(PATIENCE.as_millis() / 20) {
            match self.recv(Duration::from_millis(20)).await {
                Ok(Some(Packet::Error(e))) => return Ok(e.problem.unwrap_or_default()),
                Ok(Some(_)) => {}
                Ok(None) => net.step().await,
                Err(e) => return Err(format!("the session ended without an error: {e}")),
            }
        }
        Err(format!(
            "no error; got {:?}",
            self.received.iter().map(Packet::name).collect::<Vec<_>>()
        ))
    }

    /// Sends what the machine wants sent (persisting and watching are not ours to fake).
    pub(crate) async fn run(&mut self, actions: Vec<Action>) {
        for a in actions {
            if let Action::Send(p) = a {
                self.send(&p).await;
            }
        }
    }

    /// Feeds a packet from the node to our machine and sends its answers.
    pub(crate) async fn handle(&mut self, pkt: &Packet) {
        let actions = self
            .channel
            .handle_packet(pkt, 0)
            .expect("our machine takes it");
        self.run(actions).await;
    }

    /// Pays the node `msat` with our machine and answers until the update completed;
    /// `Err`(what the node said) if it refused.
    pub(crate) async fn pay(&mut self, msat: u64) -> Result<(), String> {
        let actions = self.channel.pay(msat).map_err(|e| e.to_string())?;
        self.run(actions).await;
        self.until_normal().await
    }

    /// Answers until our machine is back in `normal`; `Err` on the node's `error`.
    pub(crate) async fn until_normal(&mut self) -> Result<(), String> {
        loop {
            let pkt = match self.recv(PATIENCE).await {
                Ok(Some(p)) => p,
                Ok(None) => return Err("no answer".into()),
                Err(e) => return Err(e),
            };
            if let Packet::Error(e) = &pkt {
                return Err(e.problem.clone().unwrap_or_default());
            }
            self.handle(&pkt).await;
            if self.channel.state() == channel::State::Normal {
                return Ok(());
            }
        }
    }

    /// Our machine as the side that does not fund: the node's `open` is answered with it.
    pub(crate) fn accept_role(&mut self) {
        self.channel = Channel::new(
            self.config.clone(),
            self.secrets.clone(),
            AnchorRole::Accept,
        );
    }

    /// Sends our `open_channel` as funder and returns the node's first answer.
    pub(crate) async fn start_open(&mut self, anchor_sat: u64) -> Result<Option<Packet>, String> {
        self.channel = Channel::new(
            self.config.clone(),
            self.secrets.clone(),
            AnchorRole::Fund { anchor_sat },
        );
        let open = self.channel.start().expect("open");
        self.run(open).await;
        self.recv(PATIENCE).await
    }

    /// Opens a channel of `anchor_sat` that we fund, with an anchor as `how` says, and
    /// answers until the node's `open_commit_sig`. Returns the anchor outpoint we claimed.
    pub(crate) async fn open_as_funder(
        &mut self,
        net: &Network,
        anchor_sat: u64,
        how: Anchor,
    ) -> OutPoint {
        self.channel = Channel::new(
            self.config.clone(),
            self.secrets.clone(),
            AnchorRole::Fund { anchor_sat },
        );
        let open = self.channel.start().expect("open");
        self.run(open).await;
        let Packet::Open(their_open) = self.expect(net, "open").await else {
            unreachable!("expect returns the packet named open")
        };
        let actions = self
            .channel
            .handle_packet(&Packet::Open(their_open.clone()), 0)
            .expect("the node's open");
        let script_pubkey = actions
            .iter()
            .find_map(|a| match a {
                Action::Notify(Event::AnchorNeeded { script_pubkey, .. }) => {
                    Some(script_pubkey.clone())
                }
                _ => None,
            })
            .expect("the machine asks for an anchor");
        let outpoint = match how {
            Anchor::Honest | Anchor::OwnCoin => {
                let tx = if how == Anchor::OwnCoin {
                    self.own_coin_anchor(net, &script_pubkey, anchor_sat).await
                } else {
                    let txid = net
                        .chain
                        .faucet(&script_pubkey, Amount::from_sat(anchor_sat))
                        .expect("faucet");
                    raw_tx(net, txid).await
                };
                let vout = vout_paying(&tx, |o| o.script_pubkey == script_pubkey);
                let actions = self
                    .channel
                    .anchor_created(tx.clone(), vout)
                    .expect("anchor");
                self.run(actions).await;
                OutPoint {
                    txid: tx.compute_txid(),
                    vout,
                }
            }
            Anchor::PaysElsewhere | Anchor::PaysTooLittle => {
                let (to, sat) = if how == Anchor::PaysElsewhere {
                    let w = ::wallet::Wallet::from_seed(&[9u8; 32], bitcoin::Network::Regtest)
                        .expect("wallet");
                    let address = w.derive_address(0, 0).expect("address");
                    (address.script_pubkey(), anchor_sat)
                } else {
                    (script_pubkey.clone(), anchor_sat - 10_000)
                };
                let txid = net
                    .chain
                    .faucet(&to, Amount::from_sat(sat))
                    .expect("faucet");
                let tx = raw_tx(net, txid).await;
                let vout = vout_paying(&tx, |o| o.value == Amount::from_sat(sat));
                let outpoint = OutPoint {
                    txid: tx.compute_txid(),
                    vout,
                };
                let pkt = self.forged_open_anchor(&their_open, outpoint, anchor_sat);
                self.send(&pkt).await;
                outpoint
            }
            Anchor::DoesNotExist => {
                let outpoint = OutPoint {
                    txid: Txid::from_byte_array([0x5a; 32]),
                    vout: 0,
                };
                let pkt = self.forged_open_anchor(&their_open, outpoint, anchor_sat);
                self.send(&pkt).await;
                outpoint
            }
        };
        let sig = self.expect(net, "open_commit_sig").await;
        if matches!(how, Anchor::Honest | Anchor::OwnCoin) {
            let actions = self
                .channel
                .handle_packet(&sig, 0)
                .expect("open_commit_sig");
            self.run(actions).await;
        }
        outpoint
    }

    /// An anchor of `anchor_sat` to `script_pubkey` spending a confirmed coin of our own
    /// wallet (kept for [`ScriptedPeer::double_spend_anchor`]); in the mempool.
    async fn own_coin_anchor(
        &mut self,
        net: &Network,
        script_pubkey: &bitcoin::ScriptBuf,
        anchor_sat: u64,
    ) -> Transaction {
        let w = peer_wallet();
        let key = w
            .derive(::wallet::KeyPath {
                branch: 0,
                index: 0,
            })
            .expect("key");
        let ours = key.address.script_pubkey();
        let coin_txid = net
            .chain
            .faucet(&ours, Amount::from_sat(anchor_sat + 100_000))
            .expect("faucet");
        net.mine(1).await;
        let coin_tx = raw_tx(net, coin_txid).await;
        let vout = vout_paying(&coin_tx, |o| o.script_pubkey == ours);
        let coin = ::wallet::SpendableOutput {
            outpoint: OutPoint {
                txid: coin_txid,
                vout,
            },
            txout: coin_tx.output[vout as usize].clone(),
            path: key.path,
        };
        let built = w
            .build_signed(
                std::slice::from_ref(&coin),
                &[bitcoin::TxOut {
                    value: Amount::from_sat(anchor_sat),
                    script_pubkey: script_pubkey.clone(),
                }],
                Some(&ours),
                bitcoin::FeeRate::from_sat_per_vb_u32(2),
            )
            .expect("anchor");
        self.own_coin = Some(coin);
        net.chain
            .send_raw(&built.tx, None)
            .expect("anchor accepted");
        built.tx
    }

    /// `open_anchor` for `outpoint`, with a valid signature of the node's first commitment
    /// spending it (whatever that outpoint really pays).
    fn forged_open_anchor(
        &self,
        their: &OpenChannel,
        outpoint: OutPoint,
        anchor_sat: u64,
    ) -> Packet {
        let secp = Secp256k1::new();
        let our_commit = PublicKey::from_secret_key(&secp, &self.secrets.commit_key);
        let our_final = PublicKey::from_secret_key(&secp, &self.secrets.final_key);
        let fee = self.config.commitment_fee_sat.min(their.commitment_fee);
        let cs = CState::initial(anchor_sat, fee, true).expect("state");
        let keys = channel::tx::CommitmentKeys {
            owner_final: their.final_key.public_key(),
            other_final: our_final,
            delay_csv: channel::script::csv_value(self.config.delay).expect("delay"),
            revocation_hash: their.revocation_hash,
        };
        let theirs = channel::tx::commitment_tx(outpoint, &cs.mirror(), &keys, 0).expect("tx");
        let script = channel::script::anchor_script(&our_commit, &their.commit_key.public_key());
        let sig = channel::tx::sign_anchor_spend(
            &theirs.tx,
            &script,
            Amount::from_sat(anchor_sat),
            &self.secrets.commit_key,
        );
        Packet::OpenAnchor(OpenAnchor {
            txid: Sha256d::from_byte_array(outpoint.txid.to_byte_array()),
            output_index: outpoint.vout,
            amount: anchor_sat,
            commit_sig: sig,
        })
    }

    /// Honest funder up to `normal`: anchor confirmed, both `open_complete`s exchanged.
    pub(crate) async fn open_live(&mut self, net: &Network, anchor_sat: u64) {
        self.open_live_with(net, anchor_sat, Anchor::Honest).await;
    }

    /// [`ScriptedPeer::open_live`] with an anchor made as `how` says (`Honest` or `OwnCoin`).
    pub(crate) async fn open_live_with(&mut self, net: &Network, anchor_sat: u64, how: Anchor) {
        self.open_as_funder(net, anchor_sat, how).await;
        net.mine(1).await;
        let actions = self.channel.anchor_depth(1);
        self.run(actions).await;
        let complete = self.expect(net, "open_complete").await;
        self.handle(&complete).await;
        let node = self.node;
        let id = self.node_id;
        super::eventually!(net, "the node lists the channel as normal", {
            net.channel_json(node, &id).await["state"] == "normal"
        });
    }

    /// Spends the coin an [`Anchor::OwnCoin`] anchor spent, back to our wallet at a higher
    /// fee (replacing the anchor if it is in the mempool). Returns the txid.
    pub(crate) fn double_spend_anchor(&self, net: &Network) -> Txid {
        let coin = self.own_coin.clone().expect("an OwnCoin anchor");
        let w = peer_wallet();
        let to = w.derive_address(0, 1).expect("address").script_pubkey();
        let built = w
            .build_signed(
                std::slice::from_ref(&coin),
                &[bitcoin::TxOut {
                    value: coin.txout.value - Amount::from_sat(10_000),
                    script_pubkey: to.clone(),
                }],
                Some(&to),
                bitcoin::FeeRate::from_sat_per_vb_u32(50),
            )
            .expect("double spend");
        net.chain
            .send_raw(&built.tx, None)
            .expect("double spend accepted")
    }
}

/// The transaction `txid`, in the mempool or mined.
async fn raw_tx(net: &Network, txid: Txid) -> Transaction {
    net.chain
        .transaction(txid)
        .await
        .expect("chain")
        .expect("a known transaction")
        .tx
}

fn vout_paying(tx: &Transaction, pays: impl Fn(&bitcoin::TxOut) -> bool) -> u32 {
    let at = tx.output.iter().position(pays).expect("the output");
    u32::try_from(at).expect("few outputs")
}
