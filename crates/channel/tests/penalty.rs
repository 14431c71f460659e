//! A penalty that a peer cannot poison: an HTLC locked to a revocation hash is
//! refused in both directions, and a revoked commitment that holds one anyway
//! (or an output worth less than its share of the fee) still has a penalty
//! that relay policy accepts, taking every other output.
// Test code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

mod support;

use bitcoin::{Amount, OutPoint, Transaction, TxOut};
use channel::script::{csv_value, htlc_offered_script, htlc_received_script};
use channel::shachain::revocation_hash_from_seed;
use channel::{Action, ChannelConfig, CommandError, Event, Htlc};
use support::{final_pubkey, secrets, Pair, A};
use wire::{Locktime, Packet, Preimage, Sha256, UpdateAddHtlc};

fn r(i: u32) -> Preimage {
    let mut b = [0u8; 32];
    b[..4].copy_from_slice(&i.to_be_bytes());
    Preimage(b)
}

/// A's revocation hash for its commitment `n` (A is built from `secrets(1)`).
fn a_rev(n: u64) -> Sha256 {
    revocation_hash_from_seed(&secrets(1).revocation_seed, n)
}

fn b_rev(n: u64) -> Sha256 {
    revocation_hash_from_seed(&secrets(2).revocation_seed, n)
}

/// An open channel where A (the funder) paid B 4,000,000 sat.
fn paid_pair() -> Pair {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.pay(A, 4_000_000_000);
    p
}

fn assert_collision(text: &str) {
    assert!(
        text.contains("revocation hash"),
        "refused for another reason: {text}"
    );
}

fn penalty_of(acts: &[Action]) -> Transaction {
    acts.iter()
        .find_map(|a| match a {
            Action::Broadcast(tx) => Some(tx.clone()),
            _ => None,
        })
        .expect("a penalty is broadcast")
}

/// A offers B an honest HTLC, then a cheating A rewrites its packet's `r_hash` with
/// `lock(&packet)` before B sees it: B must refuse it and stay as it was.
fn b_refuses_a_rewritten_add(p: &Pair, lock: impl Fn(&UpdateAddHtlc) -> Sha256) {
    let mut p = p.clone();
    let expiry = Locktime::Blocks(p.chain.height + 300);
    p.a.act(|ch| ch.add_htlc(100_000_000, r(7).hash(), expiry, p.now));
    let Some(Packet::UpdateAddHtlc(mut add)) = p.a.outbox.pop_front() else {
        panic!("update_add_htlc expected");
    };
    add.r_hash = lock(&add);
    let before = p.b.ch.clone();
    let got = p.b.ch.handle_packet(&Packet::UpdateAddHtlc(add), p.now);
    let err = got.expect_err("B accepted an HTLC locked to a revocation hash");
    assert_collision(&err.error.to_string());
    assert_eq!(p.b.ch, before, "a refused packet changes nothing");
}

#[test]
fn an_htlc_locked_to_the_offerers_next_revocation_hash_is_refused() {
    // The cheat: the HTLC's hash is the revocation hash of the very commitment that
    // will hold it, sent in the same packet.
    b_refuses_a_rewritten_add(&paid_pair(), |add| add.revocation_hash);
}

#[test]
fn an_htlc_locked_to_the_receivers_or_our_own_revocation_hash_is_refused() {
    let mut p = paid_pair();
    let n = p.a.ch.commitment_number();
    let expiry = Locktime::Blocks(p.chain.height + 300);
    // Our command: B's current hash, our current and our next one.
    for hash in [b_rev(n), a_rev(n), a_rev(n + 1)] {
        let got = p.a.ch.add_htlc(100_000_000, hash, expiry, p.now);
        let err: CommandError = got.expect_err("our own HTLC locked to a revocation hash");
        assert_collision(&err.to_string());
    }
    // Their packet: an HTLC locked to our (B's) current or next revocation hash.
    for hash in [b_rev(n), b_rev(n + 1), a_rev(n)] {
        b_refuses_a_rewritten_add(&p, |_| hash);
    }
}

#[test]
fn a_revocation_hash_equal_to_a_pending_htlc_hash_is_refused_when_it_arrives() {
    let mut p = paid_pair();
    let expiry = Locktime::Blocks(p.chain.height + 300);
    p.add_htlc(A, 100_000_000, r(1).hash(), expiry);
    // A proposes a payment whose new revocation hash is the pending HTLC's hash.
    p.a.act(|ch| ch.pay(1_000_000));
    let Some(Packet::Update(mut u)) = p.a.outbox.pop_front() else {
        panic!("update expected");
    };
    u.revocation_hash = r(1).hash();
    let got = p.b.ch.handle_packet(&Packet::Update(u), p.now);
    let err = got.expect_err("B accepted a revocation hash equal to a pending HTLC's hash");
    assert_collision(&err.error.to_string());
}

/// A's revoked commitment with two extra HTLC outputs locked to its own revocation
/// hash (one of each script), as a peer that got them signed would broadcast it; the
/// poisoned outputs are created on the fake chain as if the commitment were mined.
fn poisoned_revoked_commitment(p: &mut Pair) -> (Transaction, u64, [OutPoint; 2]) {
    let expiry = Locktime::Blocks(p.chain.height + 300);
    p.add_htlc(A, 100_000_000, r(1).hash(), expiry);
    let n = p.a.ch.commitment_number();
    let mut old = p.a.ch.signed_commitment().unwrap();
    p.pay(A, 1_000_000_000);
    let rev = a_rev(n);
    let delay = csv_value(ChannelConfig::default().delay).unwrap();
    let cltv = match expiry {
        Locktime::Blocks(b) => b,
        Locktime::Seconds(_) => unreachable!(),
    };
    let (a_final, b_final) = (final_pubkey(1), final_pubkey(2));
    for script in [
        htlc_offered_script(&a_final, &b_final, cltv, delay, &rev, &rev),
        htlc_received_script(&a_final, &b_final, cltv, delay, &rev, &rev),
    ] {
        old.output.push(TxOut {
            value: Amount::from_sat(50_000),
            script_pubkey: script.to_p2wsh(),
        });
    }
    let txid = old.compute_txid();
    let poisoned = [
        OutPoint {
            txid,
            vout: old.output.len() as u32 - 2,
        },
        OutPoint {
            txid,
            vout: old.output.len() as u32 - 1,
        },
    ];
    // The archive record B keeps for it lists the poisoned HTLC too.
    let record =
        p.b.archive
            .get_mut(&n)
            .expect("B archived A's revoked commitment");
    record.htlcs.push(Htlc {
        amount_msat: 50_000_000,
        r_hash: rev,
        expiry,
    });
    p.chain.height += 1;
    for (vout, o) in old.output.iter().enumerate() {
        p.chain.utxos.insert(
            OutPoint {
                txid,
                vout: vout as u32,
            },
            (o.clone(), p.chain.height),
        );
    }
    (old, n, poisoned)
}

#[test]
fn a_poisoned_htlc_output_does_not_make_the_penalty_unminable() {
    let mut p = paid_pair();
    let (old, n, poisoned) = poisoned_revoked_commitment(&mut p);
    let acts = p.b.spend_seen(&old);
    assert!(acts.contains(&Action::Notify(Event::CheatDetected {
        commitment_number: n
    })));
    let penalty = penalty_of(&acts);
    p.chain
        .check(&penalty)
        .unwrap_or_else(|e| panic!("penalty refused by the chain: {e}"));
    // Every other output is taken: A's delayed one, B's own, the honest HTLC.
    let spent: Vec<OutPoint> = penalty.input.iter().map(|i| i.previous_output).collect();
    assert_eq!(spent.len(), old.output.len() - 2);
    for op in poisoned {
        assert!(!spent.contains(&op), "the poisoned output {op} is left out");
    }
    let taken: u64 = spent
        .iter()
        .map(|op| p.chain.utxos[op].0.value.to_sat())
        .sum();
    assert!(
        taken >= 9_000_000,
        "the penalty recovers the channel: {taken}"
    );
}
