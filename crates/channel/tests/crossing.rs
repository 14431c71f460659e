//! Crossing proposals (issue 13, must-have 5): when the winning proposal is
//! declined, the loser's deferred proposal is proposed again deliberately and
//! ends with a definite answer; no payment happens twice.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

mod support;

use channel::{Change, ChannelConfig, Event, State, Who};
use support::{Pair, A};
use wire::{DeclineReason, Locktime, Packet, Preimage, UpdateAddHtlc};

#[test]
fn deferred_proposal_is_reproposed_once_when_the_winning_htlc_is_declined() {
    // B accepts HTLC expiries up to 200 blocks ahead only; A (the funder, high priority)
    // offers one expiring in 300: B declines it.
    let strict = ChannelConfig {
        max_htlc_expiry_blocks: 200,
        ..Default::default()
    };
    let mut p = Pair::new_with(true, ChannelConfig::default(), strict);
    p.open();
    // Two updates: priority toggles twice, back to A.
    for _ in 0..2 {
        p.pay(A, 1_500_000_000);
    }
    assert!(p.a.ch.has_priority());
    let b_before = p.b.ch.balances().unwrap().ours.total_msat();
    p.a.events.clear();
    p.b.events.clear();
    let r = Preimage([7; 32]);
    let h = p.chain.height;
    p.a.act(|ch| ch.add_htlc(1_000_000, r.hash(), Locktime::Blocks(h + 300), p.now));
    p.b.act(|ch| ch.pay(2_000_000));
    // The proposals cross on the wire.
    p.run();
    p.assert_agree();
    assert_eq!(p.a.ch.state(), State::Normal);
    assert_eq!(p.b.ch.state(), State::Normal);
    // A was told its HTLC was declined.
    assert!(p.a.events.iter().any(|e| matches!(
        e,
        Event::Declined {
            reason: Some(DeclineReason::CannotRoute(true)),
            ..
        }
    )));
    // B's payment was deferred, proposed again, and completed exactly once.
    let pay = Change::Pay {
        amount_msat: 2_000_000,
    };
    assert!(p.b.events.contains(&Event::ProposalDeferred(pay)));
    let done: Vec<_> =
        p.b.events
            .iter()
            .filter(|e| matches!(e, Event::UpdateCompleted { by: Who::Us, .. }))
            .collect();
    assert_eq!(
        done,
        [&Event::UpdateCompleted {
            by: Who::Us,
            change: pay
        }],
        "B's command gets exactly one definite answer: {:?}",
        p.b.events
    );
    assert_eq!(
        p.b.ch.balances().unwrap().ours.total_msat(),
        b_before - 2_000_000,
        "one payment, not zero and not two"
    );
}

#[test]
fn insufficient_funds_decline_carries_the_whole_funding_required() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.pay(A, 20_000_000);
    // B owns 20,000 sat; its half of the 10,000 sat fee is 5,000 sat. An HTLC of 16,000 sat
    // fits B's balance but not with its fee share: 21,000 sat would be required.
    let pkt = Packet::UpdateAddHtlc(UpdateAddHtlc {
        revocation_hash: Preimage([1; 32]).hash(),
        amount_msat: 16_000_000,
        r_hash: Preimage([2; 32]).hash(),
        expiry: Locktime::Blocks(p.chain.height + 200),
        onion: None,
    });
    let acts = p.a.ch.handle_packet(&pkt, p.now).unwrap();
    match &acts[..] {
        [channel::Action::Send(Packet::UpdateDeclineHtlc(d))] => match d.reason {
            Some(DeclineReason::InsufficientFunds(f)) => assert_eq!(f.fixed(), 21_000),
            ref other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}
