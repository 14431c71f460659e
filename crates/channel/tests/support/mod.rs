//! Two channels back to back in memory, a virtual clock and a fake chain that
//! checks every transaction by full script verification (when built with the
//! `bitcoinconsensus` feature, as the dev-dependency is) plus nLockTime and
//! BIP68 relative locks against its own heights.
#![allow(dead_code)]
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, VecDeque};

use bitcoin::absolute::LockTime;
use bitcoin::{Amount, OutPoint, Sequence, Transaction, TxOut, Txid};
use chain::dev::validation::{check_policy_scripts, check_standard, verify_scripts_policy, Coin};
use channel::tx::{p2wpkh, sweep_tx, SweepInput, SweepWitness};
use channel::{
    Action, AnchorRole, Channel, ChannelConfig, ChannelSecrets, Event, Rejected, RevokedCommitment,
    State,
};
use secp256k1::{PublicKey, Secp256k1, SecretKey};
use wire::{Locktime, Packet, Preimage, Sha256};

/// A tiny chain: a UTXO set with confirmation heights.
#[derive(Debug, Clone, Default)]
pub struct FakeChain {
    pub height: u32,
    pub utxos: HashMap<OutPoint, (TxOut, u32)>,
    pub mined: Vec<Transaction>,
    pub verify_scripts: bool,
}

impl FakeChain {
    pub fn new() -> Self {
        FakeChain {
            height: 100,
            verify_scripts: true,
            ..Default::default()
        }
    }

    /// Adds a coin out of thin air (the wallet's funding coin).
    pub fn grant(&mut self, out: TxOut) -> OutPoint {
        let op = OutPoint {
            txid: Txid::from_raw_hash(bitcoin::hashes::Hash::hash(&self.utxos.len().to_le_bytes())),
            vout: 0,
        };
        self.utxos.insert(op, (out, self.height));
        op
    }

    /// Checks `tx` like a node would at the next block; Err(reason) if not minable.
    pub fn check(&self, tx: &Transaction) -> Result<(), String> {
        let next = self.height + 1;
        let mut any_nonfinal = false;
        for i in &tx.input {
            let (_, conf) = self
                .utxos
                .get(&i.previous_output)
                .ok_or("missing or spent input")?;
            if i.sequence != Sequence::MAX {
                any_nonfinal = true;
            }
            let s = i.sequence.to_consensus_u32();
            if tx.version.0 >= 2 && s & (1 << 31) == 0 && s & (1 << 22) == 0 {
                let need = s & 0xffff;
                if next < conf + need {
                    return Err(format!(
                        "BIP68: {need} confirmations needed, has {}",
                        next - conf
                    ));
                }
            }
        }
        let lt = tx.lock_time.to_consensus_u32();
        if any_nonfinal && lt != 0 && lt < 500_000_000 && lt >= next {
            return Err(format!("nLockTime {lt} not reached at {next}"));
        }
        if self.verify_scripts {
            tx.verify(|op| self.utxos.get(op).map(|(o, _)| o.clone()))
                .map_err(|e| format!("script verification: {e:?}"))?;
            // Relay policy too (MINIMALIF, NULLFAIL, CLEANSTACK, LOW_S…): a transaction
            // that only consensus accepts never reaches a miner through the mempool.
            let coins: Vec<Coin> = tx
                .input
                .iter()
                .map(|i| {
                    let (txout, height) = self.utxos[&i.previous_output].clone();
                    Coin {
                        txout,
                        height,
                        coinbase: false,
                    }
                })
                .collect();
            let refs: Vec<&Coin> = coins.iter().collect();
            verify_scripts_policy(tx, &refs).map_err(|e| format!("policy: {}", e.reason))?;
            check_policy_scripts(tx, &refs).map_err(|e| format!("policy: {}", e.reason))?;
            check_standard(tx).map_err(|e| format!("policy: {}", e.reason))?;
        }
        let ins: u64 = tx
            .input
            .iter()
            .map(|i| self.utxos[&i.previous_output].0.value.to_sat())
            .sum();
        let outs: u64 = tx.output.iter().map(|o| o.value.to_sat()).sum();
        if outs > ins {
            return Err("outputs exceed inputs".into());
        }
        Ok(())
    }

    /// Mines `tx` in a new block.
    pub fn mine(&mut self, tx: &Transaction) -> Result<(), String> {
        self.check(tx)?;
        self.height += 1;
        for i in &tx.input {
            self.utxos.remove(&i.previous_output);
        }
        let txid = tx.compute_txid();
        for (vout, o) in tx.output.iter().enumerate() {
            self.utxos.insert(
                OutPoint {
                    txid,
                    vout: vout as u32,
                },
                (o.clone(), self.height),
            );
        }
        self.mined.push(tx.clone());
        Ok(())
    }

    pub fn confirmations(&self, op: &OutPoint) -> u32 {
        self.utxos
            .get(op)
            .map(|(_, h)| self.height + 1 - h)
            .unwrap_or(0)
    }
}

/// One side: its channel and what it asked the caller to do.
#[derive(Debug, Clone)]
pub struct Node {
    pub ch: Channel,
    pub outbox: VecDeque<Packet>,
    pub broadcast: Vec<Transaction>,
    pub later: Vec<(Transaction, u32, u32)>,
    pub events: Vec<Event>,
    pub persists: usize,
    pub watched: Vec<OutPoint>,
    /// What the node would store from `Action::Archive`, by commitment number.
    pub archive: HashMap<u64, RevokedCommitment>,
}

impl Node {
    pub fn new(ch: Channel) -> Self {
        Node {
            ch,
            outbox: VecDeque::new(),
            broadcast: vec![],
            later: vec![],
            events: vec![],
            persists: 0,
            watched: vec![],
            archive: HashMap::new(),
        }
    }

    /// Tells the channel about an anchor spend, with the archived record the node would
    /// look up by the commitment number the transaction encodes, and performs what it
    /// answers; returns those actions.
    pub fn spend_seen(&mut self, tx: &Transaction) -> Vec<Action> {
        let revoked =
            channel::tx::commitment_number(tx).and_then(|n| self.archive.get(&n).cloned());
        let actions = self.ch.spend_seen(tx, revoked.as_ref()).unwrap();
        self.absorb(actions.clone());
        actions
    }

    /// Runs an owner command on the channel and performs the actions it returns, as the
    /// node would (packets wait in the outbox until the pair delivers them); returns
    /// those actions. A refused command fails the test.
    #[track_caller]
    pub fn act<E: std::fmt::Debug>(
        &mut self,
        command: impl FnOnce(&mut Channel) -> Result<Vec<Action>, E>,
    ) -> Vec<Action> {
        match self.try_act(command) {
            Ok(actions) => actions,
            Err(e) => panic!("command refused: {e:?} (state {:?})", self.ch.state()),
        }
    }

    /// As [`Node::act`], answering a refused command (which changes nothing) instead.
    pub fn try_act<E>(
        &mut self,
        command: impl FnOnce(&mut Channel) -> Result<Vec<Action>, E>,
    ) -> Result<Vec<Action>, E> {
        let actions = command(&mut self.ch)?;
        self.absorb(actions.clone());
        Ok(actions)
    }

    /// Hands the channel a packet from the peer and performs what it answers; a rejected
    /// packet is returned as the channel rejected it.
    pub fn receive(&mut self, pkt: &Packet, now: u64) -> Result<Vec<Action>, Rejected> {
        let actions = self.ch.handle_packet(pkt, now)?;
        self.absorb(actions.clone());
        Ok(actions)
    }

    pub fn absorb(&mut self, actions: Vec<Action>) {
        assert_persist_before_secrets(&actions);
        for a in actions {
            match a {
                Action::Send(p) => self.outbox.push_back(p),
                Action::Broadcast(tx) => self.broadcast.push(tx),
                Action::BroadcastLater {
                    tx,
                    csv_blocks,
                    lock_time,
                } => self.later.push((tx, csv_blocks, lock_time)),
                Action::WatchOutput(op) => self.watched.push(op),
                Action::Persist => self.persists += 1,
                Action::Archive(r) => {
                    self.archive.insert(r.commitment_number, r);
                }
                Action::Notify(e) => self.events.push(e),
            }
        }
    }
}

/// Whether `p` gives away a signature or a revocation preimage.
pub fn gives_away_secret(p: &Packet) -> bool {
    matches!(
        p,
        Packet::OpenAnchor(_)
            | Packet::OpenCommitSig(_)
            | Packet::UpdateAccept(_)
            | Packet::UpdateSignature(_)
            | Packet::UpdateComplete(_)
            | Packet::Close(_)
            | Packet::CloseComplete(_)
    )
}

/// The `Action::Persist` guarantee: no signature or preimage leaves before a persist,
/// and every archived record is handed over before the persist that drops it.
pub fn assert_persist_before_secrets(actions: &[Action]) {
    let mut persisted = false;
    for (i, a) in actions.iter().enumerate() {
        match a {
            Action::Persist => persisted = true,
            Action::Archive(_) => assert!(
                actions[i..].contains(&Action::Persist),
                "Archive after the last Persist: {actions:?}"
            ),
            Action::Send(p) if gives_away_secret(p) => assert!(
                persisted,
                "{} sent before the channel was persisted: {actions:?}",
                p.name()
            ),
            _ => {}
        }
    }
}

pub fn secrets(tag: u8) -> ChannelSecrets {
    ChannelSecrets {
        commit_key: SecretKey::from_slice(&[tag; 32]).unwrap(),
        final_key: SecretKey::from_slice(&[tag.wrapping_add(0x40); 32]).unwrap(),
        revocation_seed: [tag.wrapping_add(0x80); 32],
    }
}

pub fn wallet_key() -> SecretKey {
    SecretKey::from_slice(&[0x99; 32]).unwrap()
}

pub fn final_pubkey(tag: u8) -> PublicKey {
    PublicKey::from_secret_key(&Secp256k1::new(), &secrets(tag).final_key)
}

/// One side of a [`Pair`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// `Pair::a`, built from `secrets(1)`.
    A,
    /// `Pair::b`, built from `secrets(2)`.
    B,
}

pub use Side::{A, B};

impl Side {
    /// The other side.
    pub fn other(self) -> Side {
        match self {
            A => B,
            B => A,
        }
    }
}

/// Two channels wired back to back.
#[derive(Debug, Clone)]
pub struct Pair {
    pub a: Node,
    pub b: Node,
    pub now: u64,
    pub chain: FakeChain,
}

pub const ANCHOR_SAT: u64 = 10_000_000;

impl Pair {
    /// A and B; `a_funds` picks who creates the anchor.
    pub fn new(a_funds: bool, config: ChannelConfig) -> Pair {
        Self::new_with(a_funds, config.clone(), config)
    }

    /// As [`Pair::new`] with a configuration per side.
    pub fn new_with(a_funds: bool, config: ChannelConfig, config_b: ChannelConfig) -> Pair {
        let (ra, rb) = if a_funds {
            (
                AnchorRole::Fund {
                    anchor_sat: ANCHOR_SAT,
                },
                AnchorRole::Accept,
            )
        } else {
            (
                AnchorRole::Accept,
                AnchorRole::Fund {
                    anchor_sat: ANCHOR_SAT,
                },
            )
        };
        Pair {
            a: Node::new(Channel::new(config.clone(), secrets(1), ra)),
            b: Node::new(Channel::new(config_b, secrets(2), rb)),
            now: 1_700_000_000,
            chain: FakeChain::new(),
        }
    }

    pub fn node(&mut self, a: bool) -> &mut Node {
        if a {
            &mut self.a
        } else {
            &mut self.b
        }
    }

    /// Delivers one packet from `from_a`'s outbox; returns false if none.
    pub fn deliver_one(&mut self, from_a: bool) -> bool {
        let now = self.now;
        let (src, dst) = if from_a {
            (&mut self.a, &mut self.b)
        } else {
            (&mut self.b, &mut self.a)
        };
        let Some(p) = src.outbox.pop_front() else {
            return false;
        };
        let before = dst.ch.state();
        match dst.receive(&p, now) {
            Ok(_) => {}
            Err(r) => panic!(
                "{} rejected {}: {} (state {:?})",
                if from_a { "B" } else { "A" },
                p.name(),
                r.error,
                before
            ),
        }
        true
    }

    /// Delivers packets, alternating sides, until both outboxes are empty.
    pub fn run(&mut self) {
        let mut steps = 0;
        while self.deliver_one(true) | self.deliver_one(false) {
            steps += 1;
            assert!(steps < 10_000, "no quiescence");
        }
        self.mine_broadcasts();
    }

    /// Mines every pending broadcast of both nodes and tells both channels.
    pub fn mine_broadcasts(&mut self) {
        // Seeing one transaction may make a node broadcast another: repeat until quiet.
        while !self.a.broadcast.is_empty() || !self.b.broadcast.is_empty() {
            self.mine_round();
        }
    }

    fn mine_round(&mut self) {
        for who in [true, false] {
            let txs: Vec<Transaction> = std::mem::take(&mut self.node(who).broadcast);
            for tx in txs {
                let txid = tx.compute_txid();
                if self.chain.mined.iter().any(|t| t.compute_txid() == txid) {
                    continue;
                }
                self.chain
                    .mine(&tx)
                    .unwrap_or_else(|e| panic!("broadcast tx not minable: {e}\n{tx:#?}"));
                for w in [true, false] {
                    self.node(w).spend_seen(&tx);
                }
            }
        }
    }

    /// Mines empty blocks.
    pub fn advance(&mut self, blocks: u32) {
        for _ in 0..blocks {
            self.chain.height += 1;
            let h = self.chain.height;
            for w in [true, false] {
                let acts = self.node(w).ch.block_height(h);
                self.node(w).absorb(acts);
            }
        }
        self.now += 600 * u64::from(blocks);
    }

    /// Runs the whole opening: open, anchor, signatures, depth, open_complete.
    pub fn open(&mut self) {
        self.open_with(None);
    }

    /// As [`Pair::open`]; the anchor spends `coin` (a P2WPKH of [`wallet_key`] worth
    /// the anchor + 1,000 sat that exists on a real chain) instead of a made-up coin.
    pub fn open_with(&mut self, coin: Option<OutPoint>) {
        let h = self.chain.height;
        for w in [true, false] {
            self.node(w).ch.block_height(h);
        }
        self.start();
        self.run();
        let funder_a = self
            .a
            .events
            .iter()
            .any(|e| matches!(e, Event::AnchorNeeded { .. }));
        let funder = self.node(funder_a);
        let Some(Event::AnchorNeeded {
            script_pubkey,
            amount,
        }) = funder
            .events
            .iter()
            .find(|e| matches!(e, Event::AnchorNeeded { .. }))
            .cloned()
        else {
            panic!("no AnchorNeeded");
        };
        let coin_value = amount.to_sat() + 1_000;
        let out = TxOut {
            value: Amount::from_sat(coin_value),
            script_pubkey: p2wpkh(&PublicKey::from_secret_key(
                &Secp256k1::new(),
                &wallet_key(),
            )),
        };
        let coin = match coin {
            Some(op) => {
                self.chain.utxos.insert(op, (out, self.chain.height));
                op
            }
            None => self.chain.grant(out),
        };
        let anchor = sweep_tx(
            &[SweepInput {
                outpoint: coin,
                value: Amount::from_sat(coin_value),
                witness: SweepWitness::P2wpkh,
                sequence: Sequence::MAX,
                key: wallet_key(),
            }],
            script_pubkey,
            1_000,
            LockTime::ZERO,
        )
        .unwrap();
        self.node(funder_a).act(|ch| ch.anchor_created(anchor, 0));
        self.run();
        let op = self.a.ch.anchor_outpoint().unwrap();
        assert_eq!(Some(op), self.b.ch.anchor_outpoint());
        let depth = self.chain.confirmations(&op);
        assert!(depth >= 1, "anchor mined");
        for w in [true, false] {
            let acts = self.node(w).ch.anchor_depth(depth);
            self.node(w).absorb(acts);
        }
        self.run();
        assert_eq!(self.a.ch.state(), State::Normal);
        assert_eq!(self.b.ch.state(), State::Normal);
    }

    /// Both channels send their `open_channel` (not delivered yet).
    pub fn start(&mut self) {
        for w in [true, false] {
            self.node(w).act(|ch| ch.start());
        }
    }

    /// Side `s`.
    pub fn side(&mut self, s: Side) -> &mut Node {
        self.node(s == A)
    }

    /// `by` runs an update command; the packets are exchanged to the end and both sides
    /// agree afterwards (an update declined by the peer included). Returns the command's
    /// actions.
    #[track_caller]
    fn update<E: std::fmt::Debug>(
        &mut self,
        by: Side,
        command: impl FnOnce(&mut Channel) -> Result<Vec<Action>, E>,
    ) -> Vec<Action> {
        let actions = self.side(by).act(command);
        self.run();
        self.assert_agree();
        actions
    }

    /// `from` pays the other side `amount_msat` (`update`).
    #[track_caller]
    pub fn pay(&mut self, from: Side, amount_msat: u64) -> Vec<Action> {
        self.update(from, |ch| ch.pay(amount_msat))
    }

    /// `from` offers the other side an HTLC (`update_add_htlc`) at the pair's clock.
    #[track_caller]
    pub fn add_htlc(
        &mut self,
        from: Side,
        amount_msat: u64,
        r_hash: Sha256,
        expiry: Locktime,
    ) -> Vec<Action> {
        let now = self.now;
        self.update(from, |ch| ch.add_htlc(amount_msat, r_hash, expiry, now))
    }

    /// `by` fulfils an HTLC offered to it with `r` (`update_fulfill_htlc`).
    #[track_caller]
    pub fn fulfill(&mut self, by: Side, r: Preimage) -> Vec<Action> {
        let now = self.now;
        self.update(by, |ch| ch.fulfill_htlc(r, now))
    }

    /// `by` fails an HTLC offered to it back (`update_routefail_htlc`).
    #[track_caller]
    pub fn fail(&mut self, by: Side, r_hash: Sha256) -> Vec<Action> {
        self.update(by, |ch| ch.routefail_htlc(r_hash))
    }

    /// `by` removes its own expired HTLC (`update_timedout_htlc`).
    #[track_caller]
    pub fn timeout(&mut self, by: Side, r_hash: Sha256) -> Vec<Action> {
        let now = self.now;
        self.update(by, |ch| ch.timeout_htlc(r_hash, now))
    }

    /// `by` closes cooperatively: the close runs to the end, both sides are `Closed` and
    /// hold the same close, which the chain mined. Returns the command's actions.
    #[track_caller]
    pub fn close(&mut self, by: Side) -> Vec<Action> {
        let actions = self.side(by).act(|ch| ch.close());
        self.run();
        assert_eq!(self.a.ch.state(), State::Closed, "A after the close");
        assert_eq!(self.b.ch.state(), State::Closed, "B after the close");
        let close = self.a.ch.signed_close().cloned();
        assert_eq!(close.as_ref(), self.b.ch.signed_close(), "the same close");
        let txid = close.map(|tx| tx.compute_txid());
        assert!(
            self.chain
                .mined
                .iter()
                .any(|t| Some(t.compute_txid()) == txid),
            "the close is mined"
        );
        actions
    }

    /// Both sides agree on every balance and HTLC, and nothing was created or lost.
    pub fn assert_agree(&self) {
        let a = self.a.ch.balances().unwrap();
        let b = self.b.ch.balances().unwrap();
        assert_eq!(a, &b.mirror(), "A and B disagree");
        assert_eq!(a.sum_msat(), ANCHOR_SAT * 1000, "funds not conserved");
        assert_eq!(self.a.ch.commitment_number(), self.b.ch.commitment_number());
        assert_ne!(self.a.ch.has_priority(), self.b.ch.has_priority());
    }
}
