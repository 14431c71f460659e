//! Two channels back to back in memory on a virtual clock and a fake chain
//! that script-verifies every transaction it mines.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

mod support;

use bitcoin_hashes::Hash;
use channel::{Change, ChannelConfig, CommandError, Event, State, Who};
use support::{Pair, A, ANCHOR_SAT, B};
use wire::{DeclineReason, Locktime, Packet, Preimage};

fn r(n: u8) -> Preimage {
    Preimage([n; 32])
}

#[test]
fn open_with_a_funding_pay_htlc_and_close() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    assert!(p.a.events.contains(&Event::Live) && p.b.events.contains(&Event::Live));
    assert!(p.a.ch.has_priority(), "the funder starts with priority");
    p.assert_agree();
    let fee = ChannelConfig::default().commitment_fee_sat;
    assert_eq!(
        p.a.ch.balances().unwrap().ours.pay_msat,
        (ANCHOR_SAT - fee) * 1000
    );

    p.pay(A, 1_000_000_000);
    let b = p.b.ch.balances().unwrap();
    assert_eq!(b.ours.total_msat(), 1_000_000_000);
    assert_eq!(
        b.ours.fee_msat,
        fee * 1000 / 2,
        "non-funder pays half the fee once it can"
    );

    // HTLC from B to A, fulfilled by A.
    let h = p.chain.height;
    p.add_htlc(B, 200_000_000, r(7).hash(), Locktime::Blocks(h + 160));
    assert_eq!(p.a.ch.balances().unwrap().theirs.htlcs.len(), 1);
    p.fulfill(A, r(7));
    assert_eq!(p.b.ch.balances().unwrap().ours.total_msat(), 800_000_000);
    assert!(p.b.events.iter().any(|e| matches!(
        e,
        Event::UpdateCompleted {
            by: Who::Them,
            change: Change::Fulfill(_)
        }
    )));

    // Cooperative close: both broadcast the same transaction, which verifies.
    p.close(B);
    assert_eq!(p.a.ch.state(), State::Closed);
    assert_eq!(p.b.ch.state(), State::Closed);
    let close = p.chain.mined.last().unwrap().clone();
    assert_eq!(close.output.len(), 2);
    let total: u64 = close.output.iter().map(|o| o.value.to_sat()).sum();
    // The fair fee: 253 sat/kw × the signed close's 676 weight units, split in halves.
    let fee = ANCHOR_SAT - total;
    assert_eq!(fee, 172);
    assert!(close
        .output
        .iter()
        .any(|o| o.value.to_sat() == 800_000 - (fee - fee / 2)));
}

#[test]
fn open_with_b_funding_and_htlc_routefail_timeout_decline() {
    let mut p = Pair::new(false, ChannelConfig::default());
    p.open();
    assert!(p.b.ch.has_priority());
    p.assert_agree();
    let h = p.chain.height;
    // A owns nothing: its HTLC command is refused locally.
    assert!(matches!(
        p.a.ch
            .add_htlc(1_000_000, r(1).hash(), Locktime::Blocks(h + 200), p.now),
        Err(CommandError::Funding(_))
    ));
    // B offers two HTLCs; A route-fails one; the other times out.
    for (n, amt) in [(2u8, 300_000_000u64), (3, 100_000_000)] {
        p.add_htlc(B, amt, r(n).hash(), Locktime::Blocks(h + 200));
    }
    p.fail(A, r(2).hash());
    assert!(matches!(
        p.b.ch.timeout_htlc(r(3).hash(), p.now),
        Err(CommandError::NotExpired)
    ));
    p.advance(200);
    p.timeout(B, r(3).hash());
    let fee = ChannelConfig::default().commitment_fee_sat;
    assert_eq!(
        p.b.ch.balances().unwrap().ours.pay_msat,
        (ANCHOR_SAT - fee) * 1000
    );
    // Pay A something, then A offers more than it has: the command is refused...
    p.pay(B, 50_000_000);
    assert!(p
        .a
        .ch
        .add_htlc(
            90_000_000,
            r(4).hash(),
            Locktime::Blocks(p.chain.height + 200),
            p.now
        )
        .is_err());
    // ...and an expiry beyond B's range is declined with cannot_route.
    let far = Locktime::Blocks(p.chain.height + 5_000);
    assert!(matches!(
        p.a.ch.add_htlc(1_000_000, r(5).hash(), far, p.now),
        Err(CommandError::BadExpiry(_))
    ));
}

#[test]
fn decline_insufficient_funds_carries_funding() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.pay(A, 20_000_000);
    // B owns 20_000_000 msat, its half fee share is 5_000_000 msat. Forge a proposal B could not afford
    // (the command would refuse it), as a peer might send.
    let pkt = Packet::UpdateAddHtlc(wire::UpdateAddHtlc {
        revocation_hash: Hash::hash(b"x"),
        amount_msat: 30_000_000,
        r_hash: r(9).hash(),
        expiry: Locktime::Blocks(p.chain.height + 200),
        onion: None,
    });
    let before = p.a.ch.clone();
    let acts = p.a.ch.handle_packet(&pkt, p.now).unwrap();
    assert_eq!(p.a.ch, before, "a decline changes nothing");
    match &acts[..] {
        [channel::Action::Send(Packet::UpdateDeclineHtlc(d))] => match d.reason {
            Some(DeclineReason::InsufficientFunds(f)) => assert_eq!(f.fixed(), 30_000),
            ref other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    // Through the real path: A accepts expiries up to 10 blocks ahead only; B's HTLC
    // expiring in 160 is declined with cannot_route and B is told.
    let short = ChannelConfig {
        max_htlc_expiry_blocks: 10,
        ..Default::default()
    };
    let mut p2 = Pair::new_with(true, short, ChannelConfig::default());
    p2.open();
    p2.pay(A, 100_000_000);
    let before = p2.b.ch.balances().unwrap().clone();
    let expiry = Locktime::Blocks(p2.chain.height + 160);
    p2.add_htlc(B, 1_000_000, r(1).hash(), expiry);
    assert_eq!(p2.b.ch.state(), State::Normal);
    assert_eq!(p2.b.ch.balances().unwrap(), &before);
    assert!(p2.b.events.iter().any(|e| matches!(
        e,
        Event::Declined {
            reason: Some(DeclineReason::CannotRoute(true)),
            ..
        }
    )));
    p2.assert_agree();
}

#[test]
fn simultaneous_proposals_resolve_by_priority() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.pay(A, 3_000_000_000);
    for round in 0..6 {
        let high_is_a = p.a.ch.has_priority();
        p.a.events.clear();
        p.b.events.clear();
        p.a.act(|ch| ch.pay(1_000_000));
        p.b.act(|ch| ch.pay(2_000_000));
        // Both proposals cross on the wire.
        p.run();
        p.assert_agree();
        assert_eq!(p.a.ch.state(), State::Normal, "round {round}");
        assert_eq!(p.b.ch.state(), State::Normal);
        let (winner, loser, loser_amount) = if high_is_a {
            (&p.a, &p.b, 2_000_000)
        } else {
            (&p.b, &p.a, 1_000_000)
        };
        // This round's loser, and only it, deferred its own payment...
        let deferred: Vec<&Event> = loser
            .events
            .iter()
            .filter(|e| matches!(e, Event::ProposalDeferred(_)))
            .collect();
        assert_eq!(
            deferred,
            [&Event::ProposalDeferred(Change::Pay {
                amount_msat: loser_amount
            })],
            "round {round}"
        );
        assert!(!winner
            .events
            .iter()
            .any(|e| matches!(e, Event::ProposalDeferred(_))));
        // ...and both payments completed this round, each exactly once.
        for n in [&p.a, &p.b] {
            let done = n
                .events
                .iter()
                .filter(|e| matches!(e, Event::UpdateCompleted { .. }))
                .count();
            assert_eq!(done, 2, "round {round}");
        }
    }
    // Six rounds of two updates each: both payments went through every time.
    let b = p.b.ch.balances().unwrap();
    assert_eq!(
        b.ours.total_msat(),
        3_000_000_000 + 6 * 1_000_000 - 6 * 2_000_000
    );
}

#[test]
fn unilateral_close_claims_after_delay_and_htlc_fulfilled_on_chain() {
    let cfg = ChannelConfig {
        delay: Locktime::Blocks(20),
        ..Default::default()
    };
    let mut p = Pair::new(true, cfg);
    p.open();
    p.pay(A, 2_000_000_000);
    let expiry = p.chain.height + 40;
    p.add_htlc(A, 500_000_000, r(5).hash(), Locktime::Blocks(expiry));
    p.add_htlc(B, 300_000_000, r(6).hash(), Locktime::Blocks(expiry));

    // A goes on chain with its latest commitment.
    p.a.act(|ch| ch.force_close());
    p.mine_broadcasts();
    assert_eq!(p.a.ch.state(), State::OnChain);
    assert_eq!(p.b.ch.state(), State::OnChain);
    // B got its direct output at once.
    let b_final = channel::tx::p2wpkh(&support::final_pubkey(2));
    assert!(
        p.chain.mined.iter().any(|t| t.output[0].script_pubkey == b_final && t.output[0].value.to_sat() > 1_690_000),
        "B's direct output swept to its final key"
    );
    p.mine_broadcasts();
    // B learns R for A's HTLC and claims it on chain with R, before expiry.
    let acts = p.b.act(|ch| ch.fulfill_htlc(r(5), p.now));
    assert_eq!(acts.len(), 1);
    let before = p.chain.mined.len();
    p.mine_broadcasts();
    assert_eq!(p.chain.mined.len(), before + 1, "HTLC claim with R mined");
    let claim = p.chain.mined.last().unwrap();
    assert!(claim.output[0].value.to_sat() > 499_000);
    // A's delayed claims: not before the delay, then yes.
    let later = std::mem::take(&mut p.a.later);
    assert_eq!(later.len(), 2, "to-self and the offered HTLC refund");
    let (to_self, csv, _) = later.iter().find(|(_, _, lt)| *lt == 0).unwrap().clone();
    assert_eq!(csv, 20);
    assert!(p.chain.check(&to_self).unwrap_err().contains("BIP68"));
    p.advance(20);
    p.chain.mine(&to_self).unwrap();
    // The refund of A's HTLC was spent by B with R: A's refund now fails.
    let (refund, _, lt) = later.iter().find(|(_, _, lt)| *lt != 0).unwrap().clone();
    assert_eq!(lt, expiry);
    p.advance(40);
    assert!(p.chain.check(&refund).is_err());
    // A claims B's HTLC (offered to A) with R after the delay.
    let acts = p.a.ch.fulfill_htlc(r(6), p.now).unwrap();
    let [channel::Action::BroadcastLater { tx, .. }] = &acts[..] else {
        panic!("{acts:?}")
    };
    p.chain.mine(tx).unwrap();
}

#[test]
fn revoked_commitment_is_punished_with_everything() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.pay(A, 4_000_000_000);
    let h = p.chain.height;
    for (side, n) in [(A, 1u8), (B, 2)] {
        p.add_htlc(side, 100_000_000, r(n).hash(), Locktime::Blocks(h + 200));
    }
    // A keeps this commitment (with both HTLCs), then pays B and so revokes it.
    let old = p.a.ch.signed_commitment().unwrap();
    let old_n = p.a.ch.commitment_number();
    p.pay(A, 1_000_000_000);
    // A cheats.
    p.chain.mine(&old).unwrap();
    p.b.spend_seen(&old);
    assert!(p.b.events.contains(&Event::CheatDetected {
        commitment_number: old_n
    }));
    assert_eq!(p.b.broadcast.len(), 1);
    let penalty = p.b.broadcast.pop().unwrap();
    assert_eq!(
        penalty.input.len(),
        old.output.len(),
        "the penalty spends every output"
    );
    assert_eq!(penalty.output.len(), 1);
    let old_total: u64 = old.output.iter().map(|o| o.value.to_sat()).sum();
    assert!(penalty.output[0].value.to_sat() > old_total - 2_000);
    p.chain.mine(&penalty).unwrap();
    // The cheater's own delayed claim is now impossible.
    assert!(p.chain.utxos.keys().all(|op| op.txid != old.compute_txid()));
}

#[test]
fn their_unilateral_close_we_sweep_ours_and_refund_our_htlc_after_expiry() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.pay(A, 2_000_000_000);
    let expiry = p.chain.height + 160;
    p.add_htlc(A, 700_000_000, r(8).hash(), Locktime::Blocks(expiry));
    // B goes on chain; A sweeps its direct output at once.
    p.b.act(|ch| ch.force_close());
    let mined_before = p.chain.mined.len();
    p.mine_broadcasts();
    let commitment = p.chain.mined[mined_before].clone();
    assert!(p.a.events.contains(&Event::OnChain {
        txid: commitment.compute_txid(),
        owner: Who::Them
    }));
    let a_sweep = p
        .chain
        .mined
        .iter()
        .skip(mined_before + 1)
        .find(|t| t.input[0].previous_output.txid == commitment.compute_txid())
        .expect("A's direct output swept");
    assert!(a_sweep.output[0].value.to_sat() > 7_000_000);
    // A's HTLC refund waits for the expiry, then is minable.
    let (refund, csv, lt) = p.a.later.pop().expect("refund scheduled");
    assert_eq!((csv, lt), (0, expiry));
    assert!(p.chain.check(&refund).unwrap_err().contains("nLockTime"));
    p.advance(160);
    p.chain.mine(&refund).unwrap();
    assert!(refund.output[0].value.to_sat() > 699_000);
}

/// Our revocation preimages are remembered between packets but are not part of the
/// snapshot: a channel restored from its snapshot before any packet or command (nothing
/// remembered) answers exactly as the running one does, over enough updates to cross
/// the shachain's 8-bit levels, with HTLCs offered and fulfilled both ways.
#[test]
fn restored_channel_answers_exactly_like_the_running_one() {
    /// Read back from the node's snapshot layout (version 4, postcard).
    fn restored(ch: &channel::Channel) -> channel::Channel {
        postcard::from_bytes(&postcard::to_allocvec(ch).unwrap()).unwrap()
    }
    /// Delivers every packet, each to the running receiver and to a restored copy.
    fn run_compared(p: &mut Pair) {
        loop {
            let mut moved = false;
            for from_a in [true, false] {
                let now = p.now;
                let Some(pkt) = p.node(from_a).outbox.pop_front() else {
                    continue;
                };
                moved = true;
                let dst = p.node(!from_a);
                let mut copy = restored(&dst.ch);
                let want = dst.receive(&pkt, now).unwrap();
                assert_eq!(
                    copy.handle_packet(&pkt, now).unwrap(),
                    want,
                    "{}",
                    pkt.name()
                );
                assert_eq!(copy, dst.ch);
                assert_eq!(
                    serde_json::to_string(&copy).unwrap(),
                    serde_json::to_string(&dst.ch).unwrap()
                );
            }
            if !moved {
                return;
            }
        }
    }
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.pay(A, 4_000_000_000);
    for i in 0..262u32 {
        let from_a = i % 2 == 0;
        let now = p.now;
        let n = p.node(from_a);
        let mut copy = restored(&n.ch);
        let acts = if i % 50 == 7 {
            let expiry = Locktime::Blocks(p.chain.height + 200);
            let now = p.now;
            let r = r(i as u8);
            let n = p.node(from_a);
            let acts = n.act(|ch| ch.add_htlc(1_000_000, r.hash(), expiry, now));
            assert_eq!(
                copy.add_htlc(1_000_000, r.hash(), expiry, now).unwrap(),
                acts
            );
            acts
        } else if i % 50 == 8 {
            let r = r((i - 1) as u8);
            let acts = n.act(|ch| ch.fulfill_htlc(r, now));
            assert_eq!(copy.fulfill_htlc(r, now).unwrap(), acts);
            acts
        } else {
            let acts = n.act(|ch| ch.pay(1_000));
            assert_eq!(copy.pay(1_000).unwrap(), acts);
            acts
        };
        assert!(!acts.is_empty());
        assert_eq!(&copy, &p.node(from_a).ch);
        run_compared(&mut p);
    }
    p.assert_agree();
    assert!(p.a.ch.commitment_number() > 256);
    assert!(p.a.events.len() > 262);
}

/// The claim transaction among `actions` (sent at once or later).
fn claim_tx(actions: &[channel::Action]) -> bitcoin::Transaction {
    match actions {
        [channel::Action::Broadcast(tx)] | [channel::Action::BroadcastLater { tx, .. }] => {
            tx.clone()
        }
        other => panic!("expected one claim, got {other:?}"),
    }
}

/// An open pair in which A has offered B an HTLC of 500,000 sat with R = `r(5)`,
/// expiring 200 blocks on.
fn pair_with_htlc_from_a() -> Pair {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    let expiry = p.chain.height + 200;
    p.add_htlc(A, 500_000_000, r(5).hash(), Locktime::Blocks(expiry));
    p
}

#[test]
fn a_force_close_after_their_commitment_is_on_chain_is_refused_and_r_still_claims() {
    let mut p = pair_with_htlc_from_a();
    p.a.act(|ch| ch.force_close());
    p.mine_broadcasts();
    assert_eq!(p.b.ch.state(), State::OnChain);
    let before = p.b.ch.clone();

    // B's owner runs `close force` too: A's commitment already spent the anchor, so B's
    // can never confirm.
    // What the node does with the command: perform it if accepted.
    let forced = p.b.try_act(|ch| ch.force_close());
    let unchanged = p.b.ch == before;
    // B learns R: the claim must spend the HTLC output of the commitment that is on chain.
    let acts = p.b.ch.fulfill_htlc(r(5), p.now).unwrap();
    let claim = claim_tx(&acts);
    assert_eq!(
        p.chain.mine(&claim),
        Ok(()),
        "B's claim of A's HTLC with R must be minable"
    );
    assert!(
        matches!(forced, Err(CommandError::WrongState(State::OnChain))),
        "{forced:?}"
    );
    assert!(unchanged, "a refused force close changes nothing");
}

#[test]
fn a_force_close_of_a_channel_closed_by_both_resends_the_close_and_of_a_punished_one_is_refused() {
    // Closed by both: "force" sends the signed close again, never our commitment (which
    // could only compete with it), and changes nothing.
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.a.act(|ch| ch.close());
    p.deliver_one(true);
    assert_eq!(p.b.ch.state(), State::CloseWaitAck);
    let close = p.b.ch.signed_close().cloned().unwrap();
    let before = p.b.ch.clone();
    let forced = p.b.ch.force_close();
    assert_eq!(forced, Ok(vec![channel::Action::Broadcast(close.clone())]));
    assert_eq!(p.b.ch, before);
    p.run();
    assert_eq!(p.a.ch.state(), State::Closed);
    let before = p.a.ch.clone();
    let forced = p.a.ch.force_close();
    assert_eq!(forced, Ok(vec![channel::Action::Broadcast(close)]));
    assert_eq!(p.a.ch, before);

    // Their revoked commitment answered with the penalty.
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    let old = p.a.ch.signed_commitment().unwrap();
    p.pay(A, 1_000_000_000);
    p.chain.mine(&old).unwrap();
    p.b.spend_seen(&old);
    assert_eq!(p.b.ch.state(), State::OnChain);
    let before = p.b.ch.clone();
    let forced = p.b.ch.force_close();
    assert!(
        matches!(forced, Err(CommandError::WrongState(State::OnChain))),
        "{forced:?}"
    );
    assert_eq!(p.b.ch, before);

    // Our own commitment on chain: forcing again only re-sends it.
    p.a.act(|ch| ch.force_close());
    let again = p.a.ch.force_close().unwrap();
    assert!(
        matches!(&again[..], [channel::Action::Broadcast(_)]),
        "{again:?}"
    );
}

#[test]
fn only_the_r_of_an_htlc_offered_to_us_is_remembered() {
    let mut p = pair_with_htlc_from_a();
    // A offered it: its R is not A's to claim with; an unknown R neither.
    let before = p.a.ch.clone();
    assert!(!p.a.ch.remember_preimage(r(5)));
    assert!(!p.b.ch.remember_preimage(r(6)));
    assert_eq!(p.a.ch, before);
    assert!(p.b.ch.remember_preimage(r(5)));
    assert!(!p.b.ch.remember_preimage(r(5)), "already known");
    assert_eq!(p.b.ch.known_preimages(), &[r(5)]);
}
