//! Claims after a commitment reaches the chain: an output too small to claim at
//! the current fee is left out (and reported), never blocks the others; a spend
//! of the anchor that matches nothing still ends the channel's updates.
// Test code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

mod support;

use bitcoin::{Amount, Transaction, TxOut};
use channel::tx::p2wpkh;
use channel::{Action, ChannelConfig, Event, State};
use support::{final_pubkey, Pair, A};
use wire::{Locktime, Preimage};

fn r(i: u32) -> Preimage {
    let mut b = [0u8; 32];
    b[..4].copy_from_slice(&i.to_be_bytes());
    Preimage(b)
}

/// A pays B `pay_msat`, then offers B a 100,000-sat HTLC whose R B reveals in a
/// fulfill that A never answers; A then closes with its commitment.
fn theirs_on_chain_with_our_output(pay_msat: u64) -> (Pair, Transaction) {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.pay(A, pay_msat);
    let expiry = Locktime::Blocks(p.chain.height + 300);
    p.add_htlc(A, 100_000_000, r(1).hash(), expiry);
    p.b.act(|ch| ch.fulfill_htlc(r(1), p.now));
    p.b.outbox.clear();
    p.a.act(|ch| ch.force_close());
    let commitment = p.a.broadcast.pop().expect("A's commitment");
    p.chain.mine(&commitment).unwrap();
    (p, commitment)
}

fn broadcasts(acts: &[Action]) -> Vec<Transaction> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Broadcast(tx) | Action::BroadcastLater { tx, .. } => Some(tx.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn an_output_too_small_to_claim_does_not_block_the_htlc_claim() {
    // B's direct output ends up a few hundred sat above dust: too small to sweep at
    // the claim fee rate.
    let (mut p, commitment) = theirs_on_chain_with_our_output(5_600_000);
    let ours = p2wpkh(&final_pubkey(2));
    let small = commitment
        .output
        .iter()
        .find(|o| o.script_pubkey == ours)
        .map(|o| o.value.to_sat())
        .expect("B has a direct output");
    assert!((546..700).contains(&small), "B's output is {small} sat");
    let acts =
        p.b.ch
            .spend_seen(&commitment, None)
            .expect("B handles A's commitment despite its small output");
    assert_eq!(p.b.ch.state(), State::OnChain);
    let claims = broadcasts(&acts);
    assert_eq!(claims.len(), 1, "the HTLC claim with R: {claims:#?}");
    p.chain
        .mine(&claims[0])
        .unwrap_or_else(|e| panic!("HTLC claim refused: {e}"));
    let got: u64 = claims[0].output.iter().map(|o| o.value.to_sat()).sum();
    assert!(got > 99_000, "B recovers its HTLC: {got}");
    assert!(
        acts.iter().any(|a| matches!(
            a,
            Action::Notify(Event::Unclaimable { value, .. }) if value.to_sat() == small
        )),
        "the small output is reported: {acts:?}"
    );
    assert_eq!(p.b.ch.unclaimable().len(), 1);
}

#[test]
fn an_unrecognised_spend_of_the_anchor_ends_updates() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    let anchor = p.a.ch.anchor_outpoint().unwrap();
    // Not a transaction the channel signed (lost state, or a bug): still, the anchor
    // is gone and no update may be signed on it any more.
    let stranger = Transaction {
        version: bitcoin::transaction::Version::TWO,
        lock_time: bitcoin::absolute::LockTime::from_consensus(1),
        input: vec![bitcoin::TxIn {
            previous_output: anchor,
            ..Default::default()
        }],
        output: vec![TxOut {
            value: Amount::from_sat(1_000),
            script_pubkey: p2wpkh(&final_pubkey(9)),
        }],
    };
    let acts = p.b.ch.spend_seen(&stranger, None).unwrap();
    assert!(acts.contains(&Action::Persist), "{acts:?}");
    assert_eq!(p.b.ch.state(), State::OnChain);
    assert!(
        p.b.ch.pay(1_000_000).is_err(),
        "no update after the anchor is spent"
    );
}

/// The peer's `close_channel` is verified and countersigned: the fully signed close is
/// part of the state saved before it is broadcast, so a node that crashes in between
/// (or whose broadcast was lost) sends it again on `force_close`, instead of holding a
/// channel it can neither close nor update.
#[test]
fn a_signed_close_is_kept_with_the_state_and_sent_again_on_force() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.a.act(|ch| ch.close());
    assert!(p.deliver_one(true), "close_channel reaches B");
    assert_eq!(p.b.ch.state(), State::CloseWaitAck);
    let sent =
        p.b.broadcast
            .last()
            .cloned()
            .expect("B broadcast the close");
    // The state as saved by the Persist that preceded the broadcast.
    let mut restarted = p.b.ch.clone();
    assert_eq!(restarted.signed_close(), Some(&sent));
    let acts = restarted
        .force_close()
        .expect("force after a crash before the close was queued");
    assert_eq!(broadcasts(&acts), vec![sent.clone()]);
    p.chain.mine(&sent).unwrap();
}

/// A claim that stays unconfirmed is re-signed at a higher fee (BIP125): same inputs and
/// destination, more fee, still valid under relay policy; a claim's budget is half what it
/// recovers, a penalty's all of it but dust.
#[test]
fn an_unconfirmed_claim_is_resigned_at_a_higher_fee_within_its_budget() {
    let (mut p, commitment) = theirs_on_chain_with_our_output(50_000_000);
    let acts = p.b.ch.spend_seen(&commitment, None).unwrap();
    let claims = broadcasts(&acts);
    assert_eq!(claims.len(), 2, "our direct output and the HTLC with R");
    for claim in claims {
        let values: Vec<Amount> = claim
            .input
            .iter()
            .map(|i| p.chain.utxos[&i.previous_output].0.value)
            .collect();
        let total: Amount = values.iter().copied().sum();
        let old_fee = total - claim.output[0].value;
        let budget = p.b.ch.sweep_budget(total);
        assert_eq!(budget, total / 2);
        let bumped =
            p.b.ch
                .bump_sweep(&claim, &values, old_fee.to_sat() * 10)
                .unwrap();
        assert_eq!(bumped.input.len(), claim.input.len());
        assert_eq!(
            bumped.output[0].script_pubkey,
            claim.output[0].script_pubkey
        );
        assert_eq!(total - bumped.output[0].value, old_fee * 10);
        assert!(
            bumped.input.iter().all(|i| i.sequence.is_rbf()),
            "signals replaceability"
        );
        p.chain
            .check(&bumped)
            .unwrap_or_else(|e| panic!("bumped claim refused: {e}"));
    }
    // Not ours: refused.
    let mut stranger = commitment.clone();
    stranger.output.truncate(1);
    assert!(p.b.ch.bump_sweep(&stranger, &[], 1_000).is_err());
}
