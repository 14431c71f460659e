//! The close fee is not the peer's to choose: a `close_channel` is accepted only
//! if our share of its fee is at most one fair fee (our fee rate × the close's
//! weight), whoever owns what, and it relays (docs/channel.md, "Close fee").
// Test code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

mod support;

use bitcoin::Amount;
use channel::script::anchor_script;
use channel::tx::{close_tx, sign_anchor_spend};
use channel::{Action, ChannelConfig, State};
use secp256k1::{PublicKey, Secp256k1};
use support::{final_pubkey, secrets, Pair, A, ANCHOR_SAT, B};
use wire::{CloseChannel, Packet};

fn commit_pubkey(tag: u8) -> PublicKey {
    PublicKey::from_secret_key(&Secp256k1::new(), &secrets(tag).commit_key)
}

/// The `close_channel` that side `tag` (1 = A, 2 = B) signs for `fee_sat`, built by
/// hand as a peer that ignores our rules would.
fn crafted_close(p: &Pair, from_a: bool, fee_sat: u64) -> Packet {
    let (me, other, node) = if from_a { (1, 2, &p.a) } else { (2, 1, &p.b) };
    let cs = node.ch.balances().unwrap();
    let (mine, theirs) = cs.close_amounts(fee_sat).unwrap();
    let anchor = node.ch.anchor_outpoint().unwrap();
    let tx = close_tx(
        anchor,
        &final_pubkey(me),
        mine,
        &final_pubkey(other),
        theirs,
    );
    let script = anchor_script(&commit_pubkey(1), &commit_pubkey(2));
    let sig = sign_anchor_spend(
        &tx,
        &script,
        Amount::from_sat(ANCHOR_SAT),
        &secrets(me).commit_key,
    );
    Packet::Close(CloseChannel {
        sig,
        close_fee: fee_sat,
    })
}

#[test]
fn a_peer_that_owns_nothing_cannot_burn_our_balance_on_the_close_fee() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    // B owns nothing: any fee it names is paid by A. 50,000 sat is 0.5 % of the
    // channel, within the old 5 % bound, and about 290 sat/vB.
    let close = crafted_close(&p, false, 50_000);
    let before = p.a.ch.clone();
    let got = p.a.ch.handle_packet(&close, p.now);
    let err = got.expect_err("A signed a close that burns 50,000 sat of its money");
    assert!(err.error.to_string().contains("close_fee"), "{}", err.error);
    assert_eq!(p.a.ch, before);
}

#[test]
fn a_close_that_takes_our_whole_balance_is_refused() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.pay(A, 30_000_000);
    // B owns 30,000 sat; half of a 60,000-sat fee takes all of it.
    let close = crafted_close(&p, true, 60_000);
    let got = p.b.ch.handle_packet(&close, p.now);
    let err = got.expect_err("B signed a close that pays it nothing");
    assert!(err.error.to_string().contains("close_fee"), "{}", err.error);
    assert_eq!(p.b.ch.state(), State::Normal);
}

#[test]
fn an_honest_close_pays_a_fair_fee_and_both_sides_accept_it() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.pay(A, 30_000_000);
    let acts = p.close(B);
    let Some(Action::Send(Packet::Close(c))) = acts.iter().find(|a| matches!(a, Action::Send(_)))
    else {
        panic!("close_channel expected: {acts:?}");
    };
    // The default rate (253 sat/kw) × the close's weight, a few hundred sat at most.
    assert!(
        (170..=400).contains(&c.close_fee),
        "close fee {}",
        c.close_fee
    );
    assert_eq!(p.a.ch.state(), State::Closed);
    assert_eq!(p.b.ch.state(), State::Closed);
}

#[test]
fn a_higher_fee_rate_raises_the_fair_close_fee() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.a.ch.set_fee_rate(2_530);
    p.b.ch.set_fee_rate(2_530);
    let acts = p.close(A);
    let Some(Action::Send(Packet::Close(c))) = acts.iter().find(|a| matches!(a, Action::Send(_)))
    else {
        panic!("close_channel expected");
    };
    assert!(
        (1_300..=4_000).contains(&c.close_fee),
        "close fee {}",
        c.close_fee
    );
    assert_eq!(p.b.ch.state(), State::Closed);
}
