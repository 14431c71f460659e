//! Deadlines in any state (issue 13, must-have 3, channel part): the machine says
//! when an HTLC forces the channel on chain, whether an update is in flight or not.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

mod support;

use channel::{ChannelConfig, CommandError, State, TimeUnit};
use support::{Pair, A, B};
use wire::{Locktime, Preimage};

fn r(n: u8) -> Preimage {
    Preimage([n; 32])
}

fn live() -> Pair {
    let cfg = ChannelConfig {
        delay: Locktime::Blocks(20),
        ..Default::default()
    };
    let mut p = Pair::new(true, cfg);
    p.open();
    p.pay(A, 2_000_000_000);
    p.advance(1);
    p
}

#[test]
fn expired_offered_htlc_is_due_in_any_state_after_the_grace_blocks() {
    let mut p = live();
    let expiry = p.chain.height + 30;
    p.add_htlc(A, 100_000_000, r(1).hash(), Locktime::Blocks(expiry));
    // A starts another update that the peer never answers: A is stuck in WaitAccept.
    p.a.act(|ch| ch.pay(1_000));
    p.a.outbox.clear();
    assert_eq!(p.a.ch.state(), State::WaitAccept);
    // Not due before expiry + 6.
    p.advance(expiry + 5 - p.chain.height);
    assert!(p.a.ch.deadlines(p.now).is_empty());
    p.advance(1);
    let d = p.a.ch.deadlines(p.now);
    assert_eq!(d.refund.len(), 1);
    assert_eq!(d.refund[0].r_hash, r(1).hash());
    assert!(d.claim.is_empty());
    // The node closes on chain: the refund is scheduled for after the expiry.
    p.a.act(|ch| ch.force_close());
    assert_eq!(p.a.ch.state(), State::OnChain);
    assert!(p.a.later.iter().any(|(_, _, lock)| *lock == expiry));
    assert!(p.a.ch.deadlines(p.now).is_empty());
}

#[test]
fn incoming_htlc_with_known_r_is_due_before_expiry_when_the_peer_stalls() {
    let mut p = live();
    // B offers A an HTLC; A claims with R under B's delay (20) + margin: expiry h + 40.
    let expiry = p.chain.height + 40;
    p.add_htlc(B, 100_000_000, r(2).hash(), Locktime::Blocks(expiry));
    assert!(
        p.a.ch.deadlines(p.now).is_empty(),
        "R unknown: nothing to claim"
    );
    // A fulfils; B takes the proposal and stalls (never accepts).
    p.a.act(|ch| ch.fulfill_htlc(r(2), p.now));
    p.a.outbox.clear();
    assert_eq!(p.a.ch.state(), State::WaitAccept);
    // Due when the expiry is within the claim delay (20) plus half the margin (3).
    p.advance(expiry - 24 - p.chain.height);
    assert!(p.a.ch.deadlines(p.now).is_empty());
    p.advance(1);
    let d = p.a.ch.deadlines(p.now);
    assert_eq!(d.claim.len(), 1);
    assert!(d.refund.is_empty());
    // Closing on chain now claims it with R after the delay, before the expiry.
    p.a.act(|ch| ch.force_close());
    let commitment = p.chain.mined.len();
    let tx = p.a.ch.signed_commitment().unwrap();
    p.chain.mine(&tx).unwrap();
    assert_eq!(p.chain.mined.len(), commitment + 1);
    let (claim, csv, lock) =
        p.a.later
            .iter()
            .find(|(t, _, _)| (99_000..100_000).contains(&t.output[0].value.to_sat()))
            .cloned()
            .expect("claim with R scheduled");
    assert_eq!((csv, lock), (20, 0));
    p.advance(20);
    assert!(p.chain.height < expiry);
    p.chain.mine(&claim).unwrap();
}

/// B offers A an HTLC expiring at `expiry` (A claims with R under B's delay of 20 blocks).
fn offered_to_a(p: &mut Pair, tag: u8, expiry: u32) {
    p.add_htlc(B, 100_000_000, r(tag).hash(), Locktime::Blocks(expiry));
}

#[test]
fn fulfil_is_refused_once_too_late_to_claim_on_chain_and_after_expiry() {
    let mut p = live();
    let expiry = p.chain.height + 40;
    offered_to_a(&mut p, 3, expiry);
    // At the claim deadline (the delay of 20 plus half the margin, 3): R is not revealed,
    // since a peer that took it and stalled could refund the HTLC before our claim.
    p.advance(expiry - 23 - p.chain.height);
    let before = p.a.ch.clone();
    let err = p.a.ch.fulfill_htlc(r(3), p.now).unwrap_err();
    assert_eq!(
        err,
        CommandError::TooLateToFulfill {
            expiry: Locktime::Blocks(expiry),
            lead: 23,
            unit: TimeUnit::Blocks,
        }
    );
    assert_eq!(
        err.to_string(),
        format!(
            "HTLC expiring at Blocks({expiry}) is too close to its expiry to fulfil: claiming it \
             on chain with R needs 23 blocks before the expiry; R is not revealed"
        )
    );
    assert_eq!(p.a.ch, before, "nothing changes, nothing is sent");
    assert!(p.a.ch.known_preimages().is_empty(), "R is not kept either");
    // At and after the expiry: expired.
    p.advance(23);
    assert_eq!(
        p.a.ch.fulfill_htlc(r(3), p.now),
        Err(CommandError::HtlcExpired(Locktime::Blocks(expiry)))
    );
    assert_eq!(p.a.ch, {
        let mut b = before.clone();
        b.block_height(p.chain.height);
        b
    });
}

#[test]
fn fulfil_one_block_before_the_claim_deadline_goes_through_and_is_not_yet_due() {
    let mut p = live();
    let expiry = p.chain.height + 40;
    offered_to_a(&mut p, 4, expiry);
    p.advance(expiry - 24 - p.chain.height);
    p.a.act(|ch| ch.fulfill_htlc(r(4), p.now));
    // Revealed now, the HTLC is not due yet: the peer has a block to take the fulfil.
    assert!(p.a.ch.deadlines(p.now).is_empty());
    p.run();
    assert!(p.a.ch.balances().unwrap().theirs.htlcs.is_empty());
    p.assert_agree();
}
