//! Limits a peer cannot push us past (issue 13, must-have 6): HTLCs in flight
//! per direction, dust HTLCs, HTLC expiries that leave no room for our claim,
//! and the close fee.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

mod support;

use bitcoin::Amount;
use bitcoin_hashes::Hash;
use channel::tx::{close_tx, sign_anchor_spend};
use channel::{Action, ChannelConfig, ChannelError, CommandError, Event, State};
use secp256k1::{PublicKey, Secp256k1};
use support::{secrets, Pair, A, ANCHOR_SAT, B};
use wire::{
    CloseChannel, DeclineReason, Locktime, Packet, Sha256, UpdateAddHtlc, UpdateDeclineHtlc,
};

fn live(cfg: ChannelConfig) -> Pair {
    let mut p = Pair::new(true, cfg);
    p.open();
    p.pay(A, 4_000_000_000);
    // Both channels at the harness's height, so that expiries mean the same to all.
    p.advance(1);
    p
}

fn add_packet(amount_msat: u32, n: u32, expiry: u32) -> Packet {
    Packet::UpdateAddHtlc(UpdateAddHtlc {
        revocation_hash: Sha256::hash(b"next"),
        amount_msat,
        r_hash: Sha256::hash(&n.to_le_bytes()),
        expiry: Locktime::Blocks(expiry),
        onion: None,
    })
}

/// `pkt` from B is declined with `cannot_route` and leaves A unchanged.
fn assert_declined_cannot_route(p: &mut Pair, pkt: &Packet) {
    let before = p.a.ch.clone();
    let acts = p.a.ch.handle_packet(pkt, p.now).unwrap();
    assert_eq!(p.a.ch, before, "a declined HTLC leaves no trace");
    assert_eq!(
        acts,
        [Action::Send(Packet::UpdateDeclineHtlc(UpdateDeclineHtlc {
            reason: Some(DeclineReason::CannotRoute(true)),
        }))]
    );
}

#[test]
fn htlc_below_dust_is_declined() {
    let mut p = live(ChannelConfig::default());
    let expiry = p.chain.height + 200;
    assert_declined_cannot_route(&mut p, &add_packet(545_999, 1, expiry));
    assert_eq!(
        p.b.ch
            .add_htlc(545_999, Sha256::hash(b"d"), Locktime::Blocks(expiry), p.now),
        Err(CommandError::BelowDust(545_999))
    );
    // At the dust limit it goes through.
    p.add_htlc(B, 546_000, Sha256::hash(b"d"), Locktime::Blocks(expiry));
    assert_eq!(p.a.ch.balances().unwrap().theirs.htlcs.len(), 1);
}

#[test]
fn htlc_expiry_without_room_for_our_claim_is_declined() {
    let cfg = ChannelConfig {
        delay: Locktime::Blocks(20),
        htlc_claim_margin_blocks: 6,
        ..Default::default()
    };
    let mut p = live(cfg);
    let h = p.chain.height;
    // A claims with R under B's delay on A (20 blocks), plus its margin of 6.
    assert_declined_cannot_route(&mut p, &add_packet(1_000_000, 1, h + 25));
    assert_eq!(
        p.b.ch.add_htlc(
            1_000_000,
            Sha256::hash(b"e"),
            Locktime::Blocks(h + 25),
            p.now
        ),
        Err(CommandError::BadExpiry(Locktime::Blocks(h + 25)))
    );
    p.add_htlc(B, 1_000_000, Sha256::hash(b"e"), Locktime::Blocks(h + 26));
    assert_eq!(p.a.ch.balances().unwrap().theirs.htlcs.len(), 1);
}

#[test]
fn htlcs_in_flight_are_capped_and_every_commitment_and_penalty_stays_far_below_standard() {
    let cfg = ChannelConfig::default();
    let max = usize::from(cfg.max_htlcs_in_flight);
    let mut p = live(cfg);
    let expiry = p.chain.height + 200;
    for i in 0..max as u32 {
        for side in [A, B] {
            let tag = if side == A { i } else { i + 100_000 };
            let hash = Sha256::hash(&tag.to_le_bytes());
            p.add_htlc(side, 1_000_000, hash, Locktime::Blocks(expiry));
        }
    }
    p.assert_agree();
    // One more from the peer: declined; from us: refused.
    assert_declined_cannot_route(&mut p, &add_packet(1_000_000, 999_999, expiry));
    assert_eq!(
        p.a.ch.add_htlc(
            1_000_000,
            Sha256::hash(b"x"),
            Locktime::Blocks(expiry),
            p.now
        ),
        Err(CommandError::TooManyHtlcs(max as u16))
    );
    // The fullest commitment: 2 + 2 × max outputs, far below 400,000 WU (standardness).
    let full = p.a.ch.signed_commitment().unwrap();
    assert_eq!(full.output.len(), 2 + 2 * max);
    let w = full.weight().to_wu();
    assert!(w < 100_000, "commitment weight {w}");
    // Revoke it and cheat with it: the single penalty spending every output stays standard too.
    p.pay(A, 1_000_000);
    p.chain.mine(&full).unwrap();
    p.b.spend_seen(&full);
    let penalty = p.b.broadcast.pop().expect("penalty");
    assert_eq!(penalty.input.len(), full.output.len());
    let w = penalty.weight().to_wu();
    assert!(w < 200_000, "penalty weight {w}");
    p.chain.mine(&penalty).unwrap();
}

#[test]
fn close_fee_below_relay_minimum_or_above_our_share_is_refused() {
    let mut p = live(ChannelConfig::default());
    let secp = Secp256k1::new();
    let a_final = PublicKey::from_secret_key(&secp, &secrets(1).final_key);
    let b_final = PublicKey::from_secret_key(&secp, &secrets(2).final_key);
    let a_commit = PublicKey::from_secret_key(&secp, &secrets(1).commit_key);
    let b_commit = PublicKey::from_secret_key(&secp, &secrets(2).commit_key);
    let script = channel::script::anchor_script(&a_commit, &b_commit);
    let anchor = p.a.ch.anchor_outpoint().unwrap();
    // A (the peer here) signs a close with a fee of its choosing, validly.
    let balances = p.b.ch.balances().unwrap().clone();
    let signed_close = |fee: u64| {
        let (b_sat, a_sat) = balances.close_amounts(fee).unwrap();
        let tx = close_tx(anchor, &a_final, a_sat, &b_final, b_sat);
        let sig = sign_anchor_spend(
            &tx,
            &script,
            Amount::from_sat(ANCHOR_SAT),
            &secrets(1).commit_key,
        );
        Packet::Close(CloseChannel {
            sig,
            close_fee: fee,
        })
    };
    // 100 sat for a ~170 vB close is below the 1 sat/vB relay minimum: it would never confirm.
    // 6% of the channel is above our 5% share: the peer would burn our money.
    for fee in [100, ANCHOR_SAT * 6 / 100] {
        let before = p.b.ch.clone();
        let err = p.b.ch.handle_packet(&signed_close(fee), p.now).unwrap_err();
        assert!(
            matches!(err.error, ChannelError::BadClose(_)),
            "{fee}: {err}"
        );
        assert_eq!(p.b.ch, before);
    }
    // A fair fee closes (B pays half of it, less than the whole fair fee of 172 sat).
    let acts = p.b.ch.handle_packet(&signed_close(300), p.now).unwrap();
    assert!(acts
        .iter()
        .any(|a| matches!(a, Action::Notify(Event::Closed(_)))));
    // Our own close fee is the fair fee at our rate, brought into the same range.
    for (configured, used) in [(100, 172), (10_000_000, ANCHOR_SAT * 5 / 100)] {
        let mut q = live(ChannelConfig {
            sweep_feerate_sat_per_kw: configured,
            ..Default::default()
        });
        let acts = q.close(A);
        assert!(
            acts.iter().any(|a| matches!(
                a,
                Action::Send(Packet::Close(CloseChannel { close_fee, .. })) if *close_fee == used
            )),
            "{configured}: {acts:?}"
        );
        assert_eq!(q.b.ch.state(), State::Closed, "the peer accepts it");
    }
    // A channel so small that 5 % of it is below the relay minimum cannot close cooperatively.
    let mut tiny = Pair::new(
        true,
        ChannelConfig {
            commitment_fee_sat: 1_000,
            ..Default::default()
        },
    );
    tiny.a.ch = channel::Channel::new(
        ChannelConfig {
            commitment_fee_sat: 1_000,
            ..Default::default()
        },
        secrets(1),
        channel::AnchorRole::Fund { anchor_sat: 2_000 },
    );
    tiny.open();
    assert!(matches!(
        tiny.a.ch.close(),
        Err(CommandError::BadCloseFee {
            min_sat: 140,
            max_sat: 100,
            ..
        })
    ));
    assert_eq!(tiny.a.ch.state(), State::Normal);
}

/// What `tx` (a signed commitment) pays as fee, and Bitcoin Core's minimum relay fee for
/// it (1 sat/vB).
fn fee_and_relay_minimum(tx: &bitcoin::Transaction) -> (u64, u64) {
    let out: u64 = tx.output.iter().map(|o| o.value.to_sat()).sum();
    (ANCHOR_SAT - out, tx.weight().to_wu().div_ceil(4))
}

#[test]
fn htlcs_that_would_take_a_commitment_below_the_relay_fee_are_refused_both_ways() {
    // The smallest commitment fee we accept: 1,000 sat whatever the number of HTLCs
    // (the wire's commitment_fee is an absolute amount). Before, 30 HTLCs made the
    // commitment pay 1,000 sat for ~1,430 vB: it could not relay.
    let mut p = live(ChannelConfig {
        commitment_fee_sat: 1_000,
        ..Default::default()
    });
    let expiry = p.chain.height + 200;
    let mut added = 0u32;
    for i in 0..30u32 {
        // Alternate: both directions count (every HTLC is an output of both commitments).
        let side = if i % 2 == 0 { A } else { B };
        let now = p.now;
        let hash = Sha256::hash(&i.to_le_bytes());
        let offered = p
            .side(side)
            .try_act(|ch| ch.add_htlc(1_000_000, hash, Locktime::Blocks(expiry), now));
        if offered.is_err() {
            break;
        }
        p.run();
        added += 1;
        // Every commitment either side can broadcast pays the relay minimum.
        for w in [true, false] {
            let tx = p.node(w).ch.signed_commitment().unwrap();
            let (fee, min) = fee_and_relay_minimum(&tx);
            assert!(
                fee >= min,
                "after {added} HTLCs: min relay fee not met, {fee} < {min}"
            );
        }
    }
    // 1,000 sat at 253 sat/kWU pays for 3,952 WU: 18 HTLC outputs (each ~172 WU) on top
    // of the ~720 WU of the commitment with both balances.
    assert_eq!(added, 18, "the 19th HTLC is refused");
    p.assert_agree();
    // Ours: refused, with what it would need; nothing sent.
    let hash = Sha256::hash(b"19th");
    let err =
        p.a.ch
            .add_htlc(1_000_000, hash, Locktime::Blocks(expiry), p.now)
            .unwrap_err();
    let CommandError::CommitmentFeeTooLow {
        htlcs,
        fee_sat,
        min_sat,
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!((htlcs, fee_sat), (19, 1_000));
    assert!((1_001..=1_010).contains(&min_sat), "{min_sat}");
    assert_eq!(p.a.ch.state(), State::Normal);
    // Theirs: declined with cannot_route, no trace.
    assert_declined_cannot_route(&mut p, &add_packet(1_000_000, 19, expiry));
    // Settling one makes room again.
    p.fail(A, Sha256::hash(&1u32.to_le_bytes()));
    p.add_htlc(A, 1_000_000, hash, Locktime::Blocks(expiry));
}

/// The node judges a peer's add at a recent height when every height within a slack of it
/// gives the same verdict (docs/node.md, "Defences"): that needs the channel's own rule at
/// any height, which must be the add handler's, at both ends of the window it allows.
#[test]
fn add_expiry_passes_at_is_the_add_handler_s_verdict_at_that_height() {
    let cfg = ChannelConfig {
        delay: Locktime::Blocks(20),
        htlc_claim_margin_blocks: 6,
        max_htlc_expiry_blocks: 100,
        ..Default::default()
    };
    let p = live(cfg);
    let h = p.chain.height;
    let declined = [Action::Send(Packet::UpdateDeclineHtlc(UpdateDeclineHtlc {
        reason: Some(DeclineReason::CannotRoute(true)),
    }))];
    let (mut passes, mut fails) = (0, 0);
    for expiry in [h + 20, h + 26, h + 60, h + 100, h + 101, h + 140] {
        for at in h.saturating_sub(50)..h + 60 {
            let mut a = p.a.ch.clone();
            a.block_height(at);
            let acts = a
                .handle_packet(&add_packet(1_000_000, 1, expiry), p.now)
                .unwrap();
            let handler = acts != declined;
            let rule =
                p.a.ch
                    .add_expiry_passes_at(Locktime::Blocks(expiry), at, p.now);
            assert_eq!(rule, handler, "expiry {expiry} at height {at}");
            if rule {
                passes += 1;
            } else {
                fails += 1;
            }
        }
    }
    // Both verdicts occur, at the edges: room for the claim (20 + 6) and the most blocks
    // ahead (100).
    assert!(passes > 0 && fails > 0, "{passes} pass, {fails} fail");
    let rule = |expiry: u32, at: u32| {
        p.a.ch
            .add_expiry_passes_at(Locktime::Blocks(expiry), at, p.now)
    };
    assert!(rule(h + 26, h) && !rule(h + 26, h + 1));
    assert!(rule(h + 100, h) && !rule(h + 101, h) && rule(h + 101, h + 1));
    // Not established: no verdict to take.
    let fresh = Pair::new(true, ChannelConfig::default());
    assert!(!fresh
        .a
        .ch
        .add_expiry_passes_at(Locktime::Blocks(h + 60), h, p.now));
}
