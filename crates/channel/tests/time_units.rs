//! One time unit per channel (issue 28, finding 6): both delays and every HTLC expiry
//! count in blocks, or all in seconds. A claim under a delay in seconds racing a refund
//! at an expiry in blocks has no winner we can predict: a peer that opened with a
//! 4,096-second delay had its timeout claim mined at the expiry height while our claim
//! with R still waited for median time.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

mod support;

use bitcoin_hashes::Hash;
use channel::{Action, ChannelConfig, ChannelError, CommandError, State, TimeUnit};
use support::{Pair, A, B};
use wire::{DeclineReason, Locktime, Packet, Preimage, Sha256, UpdateAddHtlc, UpdateDeclineHtlc};

fn seconds_config() -> ChannelConfig {
    ChannelConfig {
        delay: Locktime::Seconds(4_096),
        ..Default::default()
    }
}

/// Both sides started; returns the `open_channel` each sent (A's, B's).
fn opens(p: &mut Pair) -> (Packet, Packet) {
    let mut sent = Vec::new();
    for w in [true, false] {
        let acts = p.node(w).ch.start().unwrap();
        let [Action::Send(open)] = acts.as_slice() else {
            panic!("start sends open_channel: {acts:?}");
        };
        sent.push(open.clone());
    }
    (sent[0].clone(), sent[1].clone())
}

#[test]
fn a_delay_in_seconds_is_refused_by_a_channel_counting_blocks_and_vice_versa() {
    // A counts in blocks (the default); B, the attacker, opens with 4,096 seconds.
    let mut p = Pair::new_with(true, ChannelConfig::default(), seconds_config());
    let (a_open, b_open) = opens(&mut p);
    let before = p.a.ch.clone();
    let err = p.a.ch.handle_packet(&b_open, p.now).unwrap_err();
    assert_eq!(p.a.ch, before, "a refused open leaves no trace");
    assert_eq!(
        err.error,
        ChannelError::MixedTimeUnits {
            what: "open_channel.delay",
            got: Locktime::Seconds(4_096),
            unit: TimeUnit::Blocks,
        }
    );
    let Packet::Error(e) = err.reply() else {
        panic!("an error packet")
    };
    assert_eq!(
        e.problem.as_deref(),
        Some(
            "open_channel.delay Seconds(4096) is not in blocks, the unit of this channel \
             (both delays and every HTLC expiry count in one unit)"
        )
    );
    // A channel counting seconds refuses a delay in blocks the same way.
    let err = p.b.ch.handle_packet(&a_open, p.now).unwrap_err();
    assert!(
        matches!(
            err.error,
            ChannelError::MixedTimeUnits {
                unit: TimeUnit::Seconds,
                ..
            }
        ),
        "{err}"
    );
}

/// A live channel whose both delays are 4,096 seconds (the reference daemon's way: it
/// sends `seconds` for the delay and for every expiry), with money on both sides.
fn live_in_seconds() -> Pair {
    let mut p = Pair::new(true, seconds_config());
    p.open();
    p.pay(A, 4_000_000_000);
    p.advance(1);
    p
}

fn add_packet(expiry: Locktime, tag: &[u8]) -> Packet {
    Packet::UpdateAddHtlc(UpdateAddHtlc {
        revocation_hash: Sha256::hash(b"next"),
        amount_msat: 1_000_000,
        r_hash: Sha256::hash(tag),
        expiry,
        onion: None,
    })
}

#[test]
fn a_channel_in_seconds_refuses_expiries_in_blocks_both_ways() {
    let mut p = live_in_seconds();
    let expiry = Locktime::Blocks(p.chain.height + 100);
    // From the peer: an error, and no trace.
    let before = p.a.ch.clone();
    let err =
        p.a.ch
            .handle_packet(&add_packet(expiry, b"blocks"), p.now)
            .unwrap_err();
    assert_eq!(p.a.ch, before);
    assert_eq!(
        err.error,
        ChannelError::MixedTimeUnits {
            what: "update_add_htlc.expiry",
            got: expiry,
            unit: TimeUnit::Seconds,
        }
    );
    // From us: refused, nothing sent.
    assert_eq!(
        p.a.ch
            .add_htlc(1_000_000, Sha256::hash(b"ours"), expiry, p.now),
        Err(CommandError::MixedTimeUnits {
            what: "expiry",
            got: expiry,
            unit: TimeUnit::Seconds,
        })
    );
    assert_eq!(p.a.ch.state(), State::Normal);
}

#[test]
fn a_channel_in_blocks_refuses_expiries_in_seconds_both_ways() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.pay(A, 4_000_000_000);
    let expiry = Locktime::Seconds(u32::try_from(p.now).unwrap() + 100 * 600);
    let err =
        p.a.ch
            .handle_packet(&add_packet(expiry, b"secs"), p.now)
            .unwrap_err();
    assert!(
        matches!(
            err.error,
            ChannelError::MixedTimeUnits {
                unit: TimeUnit::Blocks,
                ..
            }
        ),
        "{err}"
    );
    assert!(matches!(
        p.a.ch
            .add_htlc(1_000_000, Sha256::hash(b"ours"), expiry, p.now),
        Err(CommandError::MixedTimeUnits { .. })
    ));
}

#[test]
fn in_seconds_the_claim_room_is_counted_in_seconds_and_htlcs_work_end_to_end() {
    let mut p = live_in_seconds();
    let now = u32::try_from(p.now).unwrap();
    // A claims with R under B's delay on A: 4,096 s (8 units of 512 s), plus the margin of
    // 6 blocks counted 600 s each.
    let room = 4_096 + 6 * 600;
    let short = Locktime::Seconds(now + room - 1);
    let before = p.a.ch.clone();
    let acts =
        p.a.ch
            .handle_packet(&add_packet(short, b"s"), p.now)
            .unwrap();
    assert_eq!(p.a.ch, before);
    assert_eq!(
        acts,
        [Action::Send(Packet::UpdateDeclineHtlc(UpdateDeclineHtlc {
            reason: Some(DeclineReason::CannotRoute(true)),
        }))]
    );
    assert_eq!(
        p.b.ch.add_htlc(1_000_000, Sha256::hash(b"s"), short, p.now),
        Err(CommandError::BadExpiry(short))
    );
    // Exactly the room: offered, accepted and fulfilled in seconds, as with the reference.
    let r = Preimage([7; 32]);
    let enough = Locktime::Seconds(now + room);
    p.add_htlc(B, 1_000_000, r.hash(), enough);
    assert_eq!(p.a.ch.balances().unwrap().theirs.htlcs.len(), 1);
    p.fulfill(A, r);
    assert!(p.a.ch.balances().unwrap().theirs.htlcs.is_empty());
}
