//! A scripted peer for the attack tests: it speaks the real v3 session to a `potluck node`
//! and runs the real channel machine where it plays fair, and sends hand-built packets
//! where it lies (an anchor that pays elsewhere, a flood it never reads the answers to).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use bitcoin::hashes::Hash as _;
use bitcoin::{Amount, OutPoint, Transaction, Txid};
use channel::{Action, AnchorRole, CState, Channel, ChannelConfig, ChannelSecrets, Event};
use secp256k1::{PublicKey, Secp256k1, SecretKey};
use serde_json::json;
use wire::{OpenAnchor, OpenChannel, Packet, Sha256d};

use super::channels::{DevChainProc, NodeProc};

/// How the scripted funder's anchor lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// A real transaction paying the agreed amount to the 2-of-2: fair play.
    Honest,
    /// A real, confirmed transaction whose output pays someone else.
    PaysElsewhere,
    /// A real transaction paying the 2-of-2 less than the amount claimed.
    PaysTooLittle,
    /// A transaction id no chain has ever seen.
    DoesNotExist,
    /// A real anchor, built by the peer from a coin of its own wallet (so that it can
    /// double-spend that coin later: [`ScriptedPeer::double_spend_anchor`]).
    OwnCoin,
}

pub struct ScriptedPeer {
    rt: tokio::runtime::Runtime,
    session: Option<session::Session>,
    pub node_id: PublicKey,
    pub channel: Channel,
    config: ChannelConfig,
    pub secrets: ChannelSecrets,
    /// Every packet the node sent us, in order.
    pub received: Vec<Packet>,
    seed: u8,
    /// The coin an [`Anchor::OwnCoin`] anchor spends.
    own_coin: Option<wallet::SpendableOutput>,
}

/// The scripted peer's on-chain wallet (not the node's).
fn peer_wallet() -> wallet::Wallet {
    wallet::Wallet::from_seed(&[0x3c; 32], bitcoin::Network::Regtest).unwrap()
}

fn key(byte: u8) -> SecretKey {
    SecretKey::from_slice(&[byte; 32]).unwrap()
}

impl ScriptedPeer {
    /// Dials `node` with node key `[seed; 32]` and runs the handshake.
    pub fn connect(node: &NodeProc, seed: u8) -> ScriptedPeer {
        ScriptedPeer::try_connect(node, seed).expect("handshake with the node")
    }

    /// Like [`ScriptedPeer::connect`]; None if the node refused the session.
    pub fn try_connect(node: &NodeProc, seed: u8) -> Option<ScriptedPeer> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let node_key = key(seed);
        let session = rt
            .block_on(session::connect(
                node.listen.as_str(),
                &node_key,
                &session::Config::default(),
            ))
            .ok()?;
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
        Some(ScriptedPeer {
            rt,
            session: Some(session),
            node_id: PublicKey::from_secret_key(&Secp256k1::new(), &node_key),
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
        })
    }

    /// A new session with the same node key (the channel machine is kept).
    pub fn reconnect(&mut self, node: &NodeProc) {
        self.session = None;
        let session = self
            .rt
            .block_on(session::connect(
                node.listen.as_str(),
                &key(self.seed),
                &session::Config::default(),
            ))
            .unwrap();
        self.session = Some(session);
    }

    /// Answers the node's proposal honestly until the update completed on our side.
    pub fn answer_update(&mut self) {
        loop {
            let pkt = match self.recv(30) {
                Ok(Some(p)) => p,
                other => panic!("the node's update stopped: {other:?}"),
            };
            self.handle(&pkt);
            if self.channel.state() == channel::State::Normal {
                return;
            }
        }
    }

    /// A new session with the same node key while the old one stays open on our side (a
    /// half-open connection the node cannot tell from a live one). Returns the old one.
    pub fn reconnect_keep_old(&mut self, node: &NodeProc) -> Option<session::Session> {
        let old = self.session.take();
        self.reconnect(node);
        old
    }

    /// Feeds every packet the node sends to our machine (answering as it says) until the
    /// node has been quiet for `quiet_secs`.
    pub fn answer_all(&mut self, quiet_secs: u64) {
        while let Ok(Some(pkt)) = self.recv(quiet_secs) {
            self.handle(&pkt);
        }
    }

    /// Our machine as the side that does not fund: the node's `open` is answered with it.
    pub fn accept_role(&mut self) {
        self.channel = Channel::new(
            self.config.clone(),
            self.secrets.clone(),
            AnchorRole::Accept,
        );
    }

    /// Sends our `open_channel` as funder and returns the node's first answer.
    pub fn start_open(&mut self, anchor_sat: u64) -> Result<Option<Packet>, String> {
        self.channel = Channel::new(
            self.config.clone(),
            self.secrets.clone(),
            AnchorRole::Fund { anchor_sat },
        );
        let open = self.channel.start().unwrap();
        self.run(open);
        self.recv(10)
    }

    /// Pays the node `msat` with our machine and answers until the update completed.
    /// Err(what the node said) if the node refused.
    pub fn pay(&mut self, msat: u64) -> Result<(), String> {
        let actions = self.channel.pay(msat).map_err(|e| e.to_string())?;
        self.run(actions);
        loop {
            let pkt = match self.recv(30) {
                Ok(Some(p)) => p,
                Ok(None) => return Err("no answer".into()),
                Err(e) => return Err(e),
            };
            if let Packet::Error(e) = &pkt {
                return Err(e.problem.clone().unwrap_or_default());
            }
            self.handle(&pkt);
            if self.channel.state() == channel::State::Normal {
                return Ok(());
            }
        }
    }

    fn session(&mut self) -> &mut session::Session {
        self.session.as_mut().expect("session is up")
    }

    pub fn send(&mut self, pkt: &Packet) {
        let session = self.session.as_mut().expect("session is up");
        self.rt.block_on(session.send(pkt)).unwrap();
    }

    /// Sends without failing when the node already hung up; false then.
    pub fn try_send(&mut self, pkt: &Packet) -> bool {
        let session = self.session.as_mut().expect("session is up");
        self.rt.block_on(session.send(pkt)).is_ok()
    }

    /// The next packet within `secs`; None on time-out; Err when the session ended.
    pub fn recv(&mut self, secs: u64) -> Result<Option<Packet>, String> {
        let session = self.session.as_mut().expect("session is up");
        let got = self.rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(secs), session.recv()).await
        });
        match got {
            Err(_) => Ok(None),
            Ok(Ok(pkt)) => {
                self.received.push(pkt.clone());
                Ok(Some(pkt))
            }
            Ok(Err(e)) => Err(e.to_string()),
        }
    }

    /// Waits up to `secs` for a packet named `name`; the others are kept in `received`.
    pub fn expect(&mut self, name: &str, secs: u64) -> Packet {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(Instant::now()).as_secs() + 1;
            match self.recv(left) {
                Ok(Some(p)) if p.name() == name => return p,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => panic!(
                    "no {name} from the node; got {:?}",
                    self.received.iter().map(Packet::name).collect::<Vec<_>>()
                ),
            }
            assert!(Instant::now() < deadline, "no {name} within {secs}s");
        }
    }

    /// Sends `pkt` again and again without reading anything, until a send stays blocked for
    /// 2 s (the node stopped reading), the session fails, or `max` passed. Returns how many.
    pub fn flood(&mut self, pkt: &Packet, max: Duration) -> usize {
        let session = self.session.as_mut().expect("session is up");
        let deadline = Instant::now() + max;
        let mut sent = 0;
        self.rt.block_on(async {
            while Instant::now() < deadline {
                match tokio::time::timeout(Duration::from_secs(2), session.send(pkt)).await {
                    Ok(Ok(())) => sent += 1,
                    _ => break,
                }
            }
        });
        sent
    }

    /// Sends raw `pkt` bytes as one frame.
    pub fn send_payload(&mut self, payload: &[u8]) {
        let session = self.session.as_mut().expect("session is up");
        self.rt.block_on(session.send_payload(payload)).unwrap();
    }

    /// Sends `payload` in a frame with a valid MAC whose padding is not zeros.
    pub fn send_badly_padded(&mut self, payload: &[u8]) {
        let session = self.session.as_mut().expect("session is up");
        self.rt
            .block_on(session.send_badly_padded(payload, 0x5a))
            .unwrap();
    }

    /// Drops the session without a goodbye.
    pub fn hang_up(&mut self) {
        self.session = None;
    }

    /// Opens a channel of `anchor_sat` that we fund, with an anchor as `how` says, and
    /// answers until the node's `open_commit_sig`. Returns the anchor outpoint we claimed.
    pub fn open_as_funder(
        &mut self,
        chain: &DevChainProc,
        anchor_sat: u64,
        how: Anchor,
    ) -> OutPoint {
        self.channel = Channel::new(
            self.config.clone(),
            self.secrets.clone(),
            AnchorRole::Fund { anchor_sat },
        );
        let open = self.channel.start().unwrap();
        self.run(open);
        let their_open = match self.expect("open", 30) {
            Packet::Open(o) => o,
            _ => unreachable!(),
        };
        let actions = self
            .channel
            .handle_packet(&Packet::Open(their_open.clone()), 0)
            .unwrap();
        let script_pubkey = actions
            .iter()
            .find_map(|a| match a {
                Action::Notify(Event::AnchorNeeded { script_pubkey, .. }) => {
                    Some(script_pubkey.clone())
                }
                _ => None,
            })
            .expect("the machine asks for an anchor");
        let anchor_addr =
            bitcoin::Address::from_script(&script_pubkey, bitcoin::Network::Regtest).unwrap();
        let outpoint = match how {
            Anchor::OwnCoin => self.anchor_from_own_coin(chain, anchor_sat, &script_pubkey),
            Anchor::Honest => {
                let txid = chain.send(&anchor_addr.to_string(), anchor_sat);
                let tx = raw_tx(chain, &txid);
                self.anchor_is(tx, &script_pubkey)
            }
            Anchor::PaysElsewhere | Anchor::PaysTooLittle => {
                let (to, sat) = if how == Anchor::PaysElsewhere {
                    let w =
                        wallet::Wallet::from_seed(&[9u8; 32], bitcoin::Network::Regtest).unwrap();
                    (w.derive_address(0, 0).unwrap().to_string(), anchor_sat)
                } else {
                    (anchor_addr.to_string(), anchor_sat - 10_000)
                };
                let txid = chain.send(&to, sat);
                let tx = raw_tx(chain, &txid);
                let vout = tx
                    .output
                    .iter()
                    .position(|o| o.value == Amount::from_sat(sat))
                    .unwrap() as u32;
                let outpoint = OutPoint {
                    txid: tx.compute_txid(),
                    vout,
                };
                let pkt = self.forged_open_anchor(&their_open, outpoint, anchor_sat);
                self.send(&pkt);
                outpoint
            }
            Anchor::DoesNotExist => {
                let outpoint = OutPoint {
                    txid: Txid::from_byte_array([0x5a; 32]),
                    vout: 0,
                };
                let pkt = self.forged_open_anchor(&their_open, outpoint, anchor_sat);
                self.send(&pkt);
                outpoint
            }
        };
        let sig = self.expect("open_commit_sig", 30);
        if matches!(how, Anchor::Honest | Anchor::OwnCoin) {
            let actions = self.channel.handle_packet(&sig, 0).unwrap();
            // Broadcast: the faucet did already; the rest is ours to do.
            self.run(actions);
        }
        outpoint
    }

    /// Funds the anchor from a coin of our own wallet (mined first), which we
    /// keep to spend again; the anchor's outpoint.
    fn anchor_from_own_coin(
        &mut self,
        chain: &DevChainProc,
        anchor_sat: u64,
        script_pubkey: &bitcoin::ScriptBuf,
    ) -> OutPoint {
        let w = peer_wallet();
        let key = w
            .derive(wallet::KeyPath {
                branch: 0,
                index: 0,
            })
            .unwrap();
        let coin_sat = anchor_sat + 100_000;
        let coin_txid = chain.send(&key.address.to_string(), coin_sat);
        chain.mine(1);
        let coin_tx = raw_tx(chain, &coin_txid);
        let vout = coin_tx
            .output
            .iter()
            .position(|o| o.script_pubkey == key.address.script_pubkey())
            .unwrap() as u32;
        let coin = wallet::SpendableOutput {
            outpoint: OutPoint {
                txid: coin_tx.compute_txid(),
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
                Some(&key.address.script_pubkey()),
                bitcoin::FeeRate::from_sat_per_vb_u32(2),
            )
            .unwrap();
        self.own_coin = Some(coin);
        let tx = built.tx;
        chain.call(
            "sendrawtransaction",
            json!([bitcoin::consensus::encode::serialize_hex(&tx)]),
        );
        self.anchor_is(tx, script_pubkey)
    }

    /// Tells our channel that `tx` is the anchor (its output paying
    /// `script_pubkey`); the anchor's outpoint.
    fn anchor_is(
        &mut self,
        tx: bitcoin::Transaction,
        script_pubkey: &bitcoin::ScriptBuf,
    ) -> OutPoint {
        let vout = tx
            .output
            .iter()
            .position(|o| o.script_pubkey == *script_pubkey)
            .unwrap() as u32;
        let actions = self.channel.anchor_created(tx.clone(), vout).unwrap();
        self.run(actions);
        OutPoint {
            txid: tx.compute_txid(),
            vout,
        }
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
        let cs = CState::initial(anchor_sat, fee, true).unwrap();
        let keys = channel::tx::CommitmentKeys {
            owner_final: their.final_key.public_key(),
            other_final: our_final,
            delay_csv: channel::script::csv_value(self.config.delay).unwrap(),
            revocation_hash: their.revocation_hash,
        };
        let theirs = channel::tx::commitment_tx(outpoint, &cs.mirror(), &keys, 0).unwrap();
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

    /// Sends what the machine wants sent (persisting and watching are not ours to fake).
    pub fn run(&mut self, actions: Vec<Action>) {
        for a in actions {
            if let Action::Send(p) = a {
                self.send(&p);
            }
        }
    }

    /// Feeds a packet from the node to our machine and sends its answers.
    pub fn handle(&mut self, pkt: &Packet) {
        let actions = self.channel.handle_packet(pkt, 0).unwrap();
        self.run(actions);
    }

    /// Spends the coin an [`Anchor::OwnCoin`] anchor spent, back to our wallet at a higher
    /// fee (replacing the anchor if it is in the mempool). Returns the txid.
    pub fn double_spend_anchor(&self, chain: &DevChainProc) -> String {
        let coin = self.own_coin.clone().expect("an OwnCoin anchor");
        let w = peer_wallet();
        let to = w.derive_address(0, 1).unwrap().script_pubkey();
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
            .unwrap();
        chain
            .call(
                "sendrawtransaction",
                json!([bitcoin::consensus::encode::serialize_hex(&built.tx)]),
            )
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Honest funder up to `normal`: anchor confirmed, both `open_complete`s exchanged.
    pub fn open_live(&mut self, chain: &DevChainProc, node: &NodeProc, anchor_sat: u64) {
        self.open_live_with(chain, node, anchor_sat, Anchor::Honest);
    }

    /// [`ScriptedPeer::open_live`] with an anchor made as `how` says (`Honest` or `OwnCoin`).
    pub fn open_live_with(
        &mut self,
        chain: &DevChainProc,
        node: &NodeProc,
        anchor_sat: u64,
        how: Anchor,
    ) {
        self.open_as_funder(chain, anchor_sat, how);
        chain.mine(1);
        let actions = self.channel.anchor_depth(1);
        self.run(actions);
        let complete = self.expect("open_complete", 30);
        self.handle(&complete);
        super::wait_for_blocking(
            "node lists the channel as normal",
            Duration::from_secs(30),
            || (node.channel_state() == "normal").then_some(()),
        );
    }
}

fn raw_tx(chain: &DevChainProc, txid: &str) -> Transaction {
    let hex = chain.call("getrawtransaction", json!([txid]));
    bitcoin::consensus::encode::deserialize_hex(hex.as_str().unwrap()).unwrap()
}
