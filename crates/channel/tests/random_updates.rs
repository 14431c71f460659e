//! proptest: 1,000 random mixed updates between two in-memory channels; after
//! every completed update both sides agree on every balance and HTLC and the
//! total never changes. And for shorter random histories: every revoked
//! commitment of either side has a penalty the chain (with relay policy)
//! accepts, and each side's current commitment has claims it accepts.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;

use bitcoin::{OutPoint, Transaction};
use channel::{Action, ChannelConfig, CommandError, State};
use proptest::prelude::*;
use support::{Pair, ANCHOR_SAT};
use wire::{Locktime, Preimage, Sha256};

#[derive(Debug, Clone)]
enum Op {
    Pay {
        from_a: bool,
        permille: u16,
    },
    Add {
        from_a: bool,
        permille: u16,
        expiry: u8,
    },
    Fulfill {
        pick: u8,
    },
    Routefail {
        pick: u8,
    },
    Timeout {
        pick: u8,
    },
    /// Both sides propose payments at the same moment.
    Both {
        a_permille: u16,
        b_permille: u16,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (any::<bool>(), 1u16..300).prop_map(|(from_a, permille)| Op::Pay { from_a, permille }),
        3 => (any::<bool>(), 1u16..200, 2u8..60).prop_map(|(from_a, permille, expiry)| Op::Add { from_a, permille, expiry }),
        2 => any::<u8>().prop_map(|pick| Op::Fulfill { pick }),
        1 => any::<u8>().prop_map(|pick| Op::Routefail { pick }),
        1 => any::<u8>().prop_map(|pick| Op::Timeout { pick }),
        2 => (1u16..300, 1u16..300).prop_map(|(a_permille, b_permille)| Op::Both { a_permille, b_permille }),
    ]
}

struct World {
    p: Pair,
    preimages: HashMap<Sha256, Preimage>,
    counter: u64,
    completed: usize,
    /// Every commitment each side held (A's side?, number, the signed transaction).
    history: Vec<(bool, u64, Transaction)>,
}

impl World {
    fn new(a_funds: bool, cfg: ChannelConfig) -> World {
        World {
            p: Pair::new(a_funds, cfg),
            preimages: HashMap::new(),
            counter: 0,
            completed: 0,
            history: Vec::new(),
        }
    }

    /// Keeps both sides' current signed commitments (once per commitment number).
    fn record(&mut self) {
        let n = self.p.a.ch.commitment_number();
        if self.history.last().is_some_and(|(_, m, _)| *m == n) {
            return;
        }
        for a in [true, false] {
            let tx = self.p.node(a).ch.signed_commitment().unwrap();
            self.history.push((a, n, tx));
        }
    }

    fn share(&self, from_a: bool, permille: u16) -> u64 {
        let n = if from_a { &self.p.a } else { &self.p.b };
        let total = n.ch.balances().unwrap().ours.total_msat();
        (total / 1000 * u64::from(permille)).min(u64::from(u32::MAX))
    }

    fn done(&mut self) {
        self.p.run();
        assert_eq!(self.p.a.ch.state(), State::Normal);
        assert_eq!(self.p.b.ch.state(), State::Normal);
        self.p.assert_agree();
        let n = self.p.a.ch.commitment_number() as usize;
        assert!(n >= self.completed, "commitment numbers only increase");
        self.completed = n;
    }

    fn htlc(&self, pick: u8) -> Option<(bool, channel::Htlc)> {
        let cs = self.p.a.ch.balances()?;
        let mut all: Vec<(bool, channel::Htlc)> =
            cs.ours.htlcs.iter().map(|h| (true, *h)).collect();
        all.extend(cs.theirs.htlcs.iter().map(|h| (false, *h)));
        if all.is_empty() {
            return None;
        }
        Some(all[pick as usize % all.len()])
    }

    fn apply(&mut self, op: &Op) {
        let now = self.p.now;
        match *op {
            Op::Pay { from_a, permille } => {
                let amt = self.share(from_a, permille);
                // Refused when it does not fit: then nothing changes.
                self.p.node(from_a).try_act(|ch| ch.pay(amt)).ok();
            }
            Op::Add {
                from_a,
                permille,
                expiry,
            } => {
                self.counter += 1;
                let mut r = [0u8; 32];
                r[..8].copy_from_slice(&self.counter.to_le_bytes());
                let r = Preimage(r);
                self.preimages.insert(r.hash(), r);
                let amt = self.share(from_a, permille);
                // Past the receiver's claim delay (144) and margin (6).
                let exp = Locktime::Blocks(self.p.chain.height + 150 + u32::from(expiry));
                self.p
                    .node(from_a)
                    .try_act(|ch| ch.add_htlc(amt, r.hash(), exp, now))
                    .ok();
            }
            Op::Fulfill { pick } | Op::Routefail { pick } => {
                let Some((offered_by_a, h)) = self.htlc(pick) else {
                    return;
                };
                let receiver_a = !offered_by_a;
                let fulfil = matches!(op, Op::Fulfill { .. });
                let r = fulfil.then(|| self.preimages[&h.r_hash]);
                let now = self.p.now;
                // The receiver can always settle an HTLC.
                self.p.node(receiver_a).act(|ch| {
                    let Some(r) = r else {
                        return ch.routefail_htlc(h.r_hash);
                    };
                    match ch.fulfill_htlc(r, now) {
                        // A timeout moved the chain close to this expiry: too late to
                        // reveal R, so the receiver settles by failing it back.
                        Err(
                            CommandError::HtlcExpired(_) | CommandError::TooLateToFulfill { .. },
                        ) => ch.routefail_htlc(h.r_hash),
                        other => other,
                    }
                });
            }
            Op::Timeout { pick } => {
                let Some((offered_by_a, h)) = self.htlc(pick) else {
                    return;
                };
                let Locktime::Blocks(b) = h.expiry else {
                    unreachable!()
                };
                if self.p.chain.height < b {
                    let d = b - self.p.chain.height;
                    self.p.advance(d);
                }
                let now = self.p.now;
                self.p
                    .node(offered_by_a)
                    .act(|ch| ch.timeout_htlc(h.r_hash, now));
            }
            Op::Both {
                a_permille,
                b_permille,
            } => {
                let (x, y) = (self.share(true, a_permille), self.share(false, b_permille));
                // Both propose before either is delivered: they cross.
                self.p.a.try_act(|ch| ch.pay(x)).ok();
                self.p.b.try_act(|ch| ch.pay(y)).ok();
            }
        }
        self.done();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, max_shrink_iters: 50, ..ProptestConfig::default() })]

    #[test]
    fn thousand_random_updates_keep_both_sides_in_agreement(
        a_funds in any::<bool>(),
        ops in proptest::collection::vec(op(), 1000),
    ) {
        let cfg = ChannelConfig { commitment_fee_sat: 20_000, ..Default::default() };
        let mut w = World::new(a_funds, cfg);
        w.p.open();
        for op in &ops {
            w.apply(op);
        }
        let cs = w.p.a.ch.balances().unwrap();
        prop_assert_eq!(cs.sum_msat(), ANCHOR_SAT * 1000);
        prop_assert!(w.completed >= 500, "only {} updates completed", w.completed);
        prop_assert!(w.p.a.ch.revocation_slots() <= 12);
    }
}

fn broadcasts(acts: &[Action]) -> Vec<Transaction> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Broadcast(tx) | Action::BroadcastLater { tx, .. } => Some(tx.clone()),
            _ => None,
        })
        .collect()
}

/// Outputs worth at most this are allowed to be left out of a penalty: no single input
/// of a sweep costs more at the test's fee rate (253 sat/kw).
const NOT_WORTH_A_PENALTY_INPUT_SAT: u64 = 150;

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, max_shrink_iters: 30, ..ProptestConfig::default() })]

    #[test]
    fn every_revoked_commitment_has_a_minable_penalty_and_every_current_one_minable_claims(
        a_funds in any::<bool>(),
        ops in proptest::collection::vec(op(), 30),
    ) {
        let cfg = ChannelConfig { commitment_fee_sat: 20_000, ..Default::default() };
        let mut w = World::new(a_funds, cfg);
        w.p.open();
        w.record();
        for op in &ops {
            w.apply(op);
            w.record();
        }
        let current = w.p.a.ch.commitment_number();
        for (owner_a, n, tx) in &w.history {
            if *n == current {
                continue;
            }
            let mut chain = w.p.chain.clone();
            chain.mine(tx).unwrap();
            let mut punisher = w.p.node(!owner_a).clone();
            let acts = punisher.spend_seen(tx);
            let penalty = broadcasts(&acts);
            prop_assert_eq!(penalty.len(), 1, "one penalty for revoked commitment {}", n);
            chain.check(&penalty[0]).map_err(|e| TestCaseError::fail(format!("penalty of {n}: {e}")))?;
            let txid = tx.compute_txid();
            for (vout, out) in tx.output.iter().enumerate() {
                let op = OutPoint { txid, vout: vout as u32 };
                let taken = penalty[0].input.iter().any(|i| i.previous_output == op);
                prop_assert!(taken || out.value.to_sat() <= NOT_WORTH_A_PENALTY_INPUT_SAT,
                    "output {} of revoked commitment {} ({}) left out", vout, n, out.value);
            }
        }
        for who in [true, false] {
            let mut chain = w.p.chain.clone();
            let mut node = w.p.node(who).clone();
            let acts = node.ch.force_close().unwrap();
            let mut txs = broadcasts(&acts).into_iter();
            let commitment = txs.next().unwrap();
            chain.mine(&commitment).unwrap();
            // Past every relative delay and HTLC expiry.
            chain.height += 500;
            for claim in txs {
                chain.check(&claim).map_err(|e| TestCaseError::fail(format!("claim: {e}")))?;
            }
        }
    }
}
