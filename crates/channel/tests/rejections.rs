//! Every packet in a state that does not allow it, and every malformed update,
//! is rejected with an `error` packet and leaves the channel unchanged.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

mod support;

use bitcoin_hashes::Hash;
use channel::{Action, Channel, ChannelConfig, ChannelError, CommandError, State};
use secp256k1::{Message, Secp256k1, SecretKey};
use support::{Pair, A};
use wire::*;

fn junk_sig() -> secp256k1::ecdsa::Signature {
    Secp256k1::new().sign_ecdsa(
        &Message::from_digest([1; 32]),
        &SecretKey::from_slice(&[3; 32]).unwrap(),
    )
}

fn key() -> ChainPubkey {
    ChainPubkey::new(secp256k1::PublicKey::from_secret_key(
        &Secp256k1::new(),
        &SecretKey::from_slice(&[5; 32]).unwrap(),
    ))
}

/// One packet of every type.
fn samples() -> Vec<Packet> {
    let h = Sha256::hash(b"h");
    vec![
        Packet::Auth(Authenticate {
            node_id: key(),
            session_sig: junk_sig(),
        }),
        Packet::Open(OpenChannel {
            delay: Locktime::Blocks(10),
            revocation_hash: h,
            commit_key: key(),
            final_key: key(),
            anch: AnchorOffer::WillCreateAnchor,
            min_depth: None,
            commitment_fee: 10_000,
        }),
        Packet::OpenAnchor(OpenAnchor {
            txid: Sha256d::hash(b"t"),
            output_index: 0,
            amount: 1_000_000,
            commit_sig: junk_sig(),
        }),
        Packet::OpenCommitSig(OpenCommitSig { sig: junk_sig() }),
        Packet::OpenComplete(OpenComplete::default()),
        Packet::Update(Update {
            revocation_hash: h,
            delta_msat: -1000,
        }),
        Packet::UpdateAddHtlc(UpdateAddHtlc {
            revocation_hash: h,
            amount_msat: 1000,
            r_hash: h,
            expiry: Locktime::Blocks(150),
            onion: None,
        }),
        Packet::UpdateAccept(UpdateAccept {
            sig: junk_sig(),
            revocation_hash: h,
        }),
        Packet::UpdateSignature(UpdateSignature {
            sig: junk_sig(),
            revocation_preimage: Preimage([0; 32]),
        }),
        Packet::UpdateComplete(UpdateComplete {
            revocation_preimage: Preimage([0; 32]),
        }),
        Packet::UpdateDeclineHtlc(UpdateDeclineHtlc {
            reason: Some(DeclineReason::CannotRoute(true)),
        }),
        Packet::UpdateFulfillHtlc(UpdateFulfillHtlc {
            revocation_hash: h,
            r: Preimage([0; 32]),
        }),
        Packet::UpdateTimedoutHtlc(UpdateTimedoutHtlc {
            revocation_hash: h,
            r_hash: h,
        }),
        Packet::UpdateRoutefailHtlc(UpdateRoutefailHtlc {
            revocation_hash: h,
            r_hash: h,
        }),
        Packet::Close(CloseChannel {
            sig: junk_sig(),
            close_fee: 5000,
        }),
        Packet::CloseComplete(CloseChannelComplete { sig: junk_sig() }),
        Packet::CloseAck,
        Packet::Error(ErrorPacket {
            problem: Some("bye".into()),
        }),
    ]
}

const PROPOSALS: &[&str] = &[
    "update",
    "update_add_htlc",
    "update_fulfill_htlc",
    "update_timedout_htlc",
    "update_routefail_htlc",
];

fn allowed(state: State, name: &str) -> bool {
    if name == "error" {
        return true;
    }
    match state {
        State::OpenWaitOpen => name == "open",
        State::OpenWaitAnchor => name == "open_anchor",
        State::OpenWaitCommitSig => name == "open_commit_sig",
        State::OpenWaitComplete => name == "open_complete",
        State::Normal => PROPOSALS.contains(&name) || name == "close",
        State::WaitAccept => {
            PROPOSALS.contains(&name) || name == "update_accept" || name == "update_decline_htlc"
        }
        State::WaitSignature => name == "update_signature",
        State::WaitComplete => name == "update_complete",
        State::CloseWaitComplete => name == "close" || name == "close_complete",
        State::CloseWaitAck => name == "close_ack",
        _ => false,
    }
}

/// Channels in every state the protocol has.
fn snapshots() -> Vec<Channel> {
    let mut out = Vec::new();
    let mut p = Pair::new(true, ChannelConfig::default());
    out.push(p.a.ch.clone()); // Init
    p.start();
    out.push(p.a.ch.clone()); // OpenWaitOpen
    let mut q = p.clone();
    q.deliver_one(true);
    q.deliver_one(false);
    out.push(q.a.ch.clone()); // OpenWaitAnchorTx
    out.push(q.b.ch.clone()); // OpenWaitAnchor
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.a.act(|ch| ch.pay(100_000_000));
    out.push(p.a.ch.clone()); // WaitAccept
    p.deliver_one(true);
    out.push(p.b.ch.clone()); // WaitSignature
    p.deliver_one(false);
    out.push(p.a.ch.clone()); // WaitComplete
    p.run();
    out.push(p.a.ch.clone()); // Normal
    let mut c = p.clone();
    c.a.act(|ch| ch.close());
    out.push(c.a.ch.clone()); // CloseWaitComplete
    c.deliver_one(true);
    out.push(c.b.ch.clone()); // CloseWaitAck
    c.run();
    out.push(c.a.ch.clone()); // Closed
    let mut u = p.clone();
    u.a.act(|ch| ch.force_close());
    out.push(u.a.ch.clone()); // OnChain
                              // OpenWaitCommitSig and OpenWaitComplete, from a fresh opening stopped half way.
    let mut o = Pair::new(true, ChannelConfig::default());
    let mut full = o.clone();
    full.open();
    o.start();
    o.run();
    let anchor = full
        .chain
        .mined
        .iter()
        .find(|t| t.output.len() == 1)
        .unwrap()
        .clone();
    o.a.act(|ch| ch.anchor_created(anchor, 0));
    out.push(o.a.ch.clone()); // OpenWaitCommitSig
    o.deliver_one(true);
    out.push(o.b.ch.clone()); // OpenWaitComplete
    out
}

#[test]
fn every_packet_in_every_state_is_rejected_unless_allowed_and_nothing_changes() {
    let snaps = snapshots();
    let states: Vec<State> = snaps.iter().map(|c| c.state()).collect();
    for s in [
        State::Init,
        State::OpenWaitOpen,
        State::OpenWaitAnchorTx,
        State::OpenWaitAnchor,
        State::OpenWaitCommitSig,
        State::OpenWaitComplete,
        State::Normal,
        State::WaitAccept,
        State::WaitSignature,
        State::WaitComplete,
        State::CloseWaitComplete,
        State::CloseWaitAck,
        State::Closed,
        State::OnChain,
    ] {
        assert!(states.contains(&s), "no snapshot in {s:?}: {states:?}");
    }
    let mut rejected = 0;
    for ch in &snaps {
        for pkt in samples() {
            let mut c = ch.clone();
            let res = c.handle_packet(&pkt, 1_700_000_000);
            if allowed(ch.state(), pkt.name()) {
                if res.is_err() {
                    assert_eq!(
                        &c,
                        ch,
                        "failed {} changed state {:?}",
                        pkt.name(),
                        ch.state()
                    );
                }
                continue;
            }
            let err = res.expect_err(&format!("{} accepted in {:?}", pkt.name(), ch.state()));
            assert_eq!(err.error, ChannelError::UnexpectedPacket(pkt.name()));
            assert_eq!(
                err.reply(),
                Packet::error(format!("Unexpected packet {}", pkt.name()))
            );
            assert_eq!(
                &c,
                ch,
                "rejected {} changed state {:?}",
                pkt.name(),
                ch.state()
            );
            rejected += 1;
        }
    }
    assert!(rejected > 150, "{rejected}");
}

/// A pair with money on both sides, in Normal.
fn live() -> Pair {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.pay(A, 1_000_000_000);
    p
}

fn rejected_unchanged(ch: &mut Channel, pkt: &Packet) -> ChannelError {
    let before = ch.clone();
    let err = ch
        .handle_packet(pkt, 1_700_000_000)
        .expect_err("must be rejected");
    assert_eq!(ch, &before, "state changed");
    assert!(
        matches!(&err.reply(), Packet::Error(e) if e.problem.as_deref() == Some(err.error.to_string().as_str()))
    );
    err.error
}

#[test]
fn bad_signature_is_rejected() {
    let mut p = live();
    p.a.act(|ch| ch.pay(1_000));
    p.deliver_one(true);
    let Some(Packet::UpdateAccept(mut acc)) = p.b.outbox.pop_front() else {
        panic!()
    };
    acc.sig = junk_sig();
    let e = rejected_unchanged(&mut p.a.ch, &Packet::UpdateAccept(acc));
    assert_eq!(e, ChannelError::BadSignature("update_accept.sig"));
    // Also on the first commitment.
    let snaps = snapshots();
    let mut b = snaps
        .iter()
        .find(|c| c.state() == State::OpenWaitAnchor)
        .unwrap()
        .clone();
    let e = rejected_unchanged(&mut b, &samples()[2]);
    assert_eq!(e, ChannelError::BadSignature("open_anchor.commit_sig"));
}

#[test]
fn wrong_revocation_preimage_is_rejected() {
    let mut p = live();
    p.a.act(|ch| ch.pay(1_000));
    p.deliver_one(true);
    p.deliver_one(false);
    let Some(Packet::UpdateSignature(sig)) = p.a.outbox.front().cloned() else {
        panic!()
    };
    let mut bad = sig;
    bad.revocation_preimage = Preimage([0xee; 32]);
    let e = rejected_unchanged(&mut p.b.ch, &Packet::UpdateSignature(bad));
    assert_eq!(e, ChannelError::BadRevocationPreimage);
    p.deliver_one(true);
    let Some(Packet::UpdateComplete(mut done)) = p.b.outbox.pop_front() else {
        panic!()
    };
    done.revocation_preimage.0[0] ^= 1;
    let e = rejected_unchanged(&mut p.a.ch, &Packet::UpdateComplete(done));
    assert_eq!(e, ChannelError::BadRevocationPreimage);
}

#[test]
fn overdrawn_update_is_rejected() {
    let mut p = live();
    let a_total = p.a.ch.balances().unwrap().ours.total_msat();
    let b_total = p.b.ch.balances().unwrap().ours.total_msat();
    let pkt = Packet::Update(Update {
        revocation_hash: Sha256::hash(b"n"),
        delta_msat: -(b_total as i64) - 1,
    });
    let e = rejected_unchanged(&mut p.a.ch, &pkt);
    assert!(matches!(e, ChannelError::Funding(_)), "{e:?}");
    assert!(a_total > u64::from(u32::MAX));
    // B paying all it owns leaves nothing for its half of the fee: also refused.
    let pkt = Packet::Update(Update {
        revocation_hash: Sha256::hash(b"n"),
        delta_msat: -(b_total as i64),
    });
    assert!(matches!(
        rejected_unchanged(&mut p.a.ch, &pkt),
        ChannelError::Funding(_)
    ));
    // The same payment as an owner command is refused locally and changes nothing.
    let before = p.b.ch.clone();
    assert!(matches!(p.b.ch.pay(b_total), Err(CommandError::Funding(_))));
    assert_eq!(p.b.ch, before);
    // An HTLC worth more than the offerer owns, from the peer: declined, never applied.
    let pkt = Packet::UpdateAddHtlc(UpdateAddHtlc {
        revocation_hash: Sha256::hash(b"n"),
        amount_msat: u32::try_from(b_total + 1).unwrap(),
        r_hash: Sha256::hash(b"r"),
        expiry: Locktime::Blocks(p.chain.height + 200),
        onion: None,
    });
    let before = p.a.ch.clone();
    let acts = p.a.ch.handle_packet(&pkt, p.now).unwrap();
    assert_eq!(p.a.ch, before, "a declined HTLC leaves no trace");
    assert!(
        matches!(
            &acts[..],
            [Action::Send(Packet::UpdateDeclineHtlc(UpdateDeclineHtlc {
                reason: Some(DeclineReason::InsufficientFunds(_))
            }))]
        ),
        "{acts:?}"
    );
}

#[test]
fn amount_above_uint32_msat_is_rejected() {
    let mut p = live();
    let too_big = u64::from(u32::MAX) + 1;
    let before = p.a.ch.clone();
    assert_eq!(
        p.a.ch.add_htlc(
            too_big,
            Sha256::hash(b"r"),
            Locktime::Blocks(p.chain.height + 5),
            p.now
        ),
        Err(CommandError::AmountTooLarge(too_big))
    );
    assert_eq!(
        p.a.ch.pay(too_big),
        Err(CommandError::AmountTooLarge(too_big))
    );
    assert_eq!(p.a.ch, before);
    // From the peer: an `update` moving more than uint32 msat (A owns enough, so only the limit bites).
    let pkt = Packet::Update(Update {
        revocation_hash: Sha256::hash(b"n"),
        delta_msat: -(too_big as i64),
    });
    let e = rejected_unchanged(&mut p.b.ch, &pkt);
    assert_eq!(e, ChannelError::AmountTooLarge(i128::from(too_big)));
    let pkt = Packet::Update(Update {
        revocation_hash: Sha256::hash(b"n"),
        delta_msat: i64::MIN,
    });
    assert!(matches!(
        rejected_unchanged(&mut p.b.ch, &pkt),
        ChannelError::AmountTooLarge(_)
    ));
}

#[test]
fn delta_making_a_balance_negative_is_rejected() {
    let mut p = live();
    let b_total = p.b.ch.balances().unwrap().ours.total_msat() as i64;
    // A positive delta asks the receiver to pay: more than B has would drive B negative.
    let pkt = Packet::Update(Update {
        revocation_hash: Sha256::hash(b"n"),
        delta_msat: b_total + 1,
    });
    assert_eq!(
        rejected_unchanged(&mut p.b.ch, &pkt),
        ChannelError::TakesFromReceiver(b_total + 1)
    );
    // Any positive delta is refused: nobody takes the receiver's money.
    let pkt = Packet::Update(Update {
        revocation_hash: Sha256::hash(b"n"),
        delta_msat: 1,
    });
    assert_eq!(
        rejected_unchanged(&mut p.b.ch, &pkt),
        ChannelError::TakesFromReceiver(1)
    );
    // The channel still works afterwards.
    p.pay(A, 5);
    assert!(p.a.events.iter().any(|e| matches!(
        e,
        channel::Event::UpdateCompleted {
            change: channel::Change::Pay { amount_msat: 5 },
            ..
        }
    )));
}

#[test]
fn bad_open_parameters_are_rejected() {
    let snaps = snapshots();
    let b = snaps
        .iter()
        .find(|c| c.state() == State::OpenWaitOpen)
        .unwrap()
        .clone();
    let Packet::Open(good) = samples()[1].clone() else {
        panic!()
    };
    // A sends WILL; the snapshot (A) also offers: both offering is an error.
    let mut c = b.clone();
    assert!(matches!(
        rejected_unchanged(&mut c, &Packet::Open(good.clone())),
        ChannelError::BadOpen(_)
    ));
    let mut wont = good.clone();
    wont.anch = AnchorOffer::WontCreateAnchor;
    for bad in [
        OpenChannel {
            delay: Locktime::Blocks(5_000),
            ..wont.clone()
        },
        OpenChannel {
            min_depth: Some(11),
            ..wont.clone()
        },
        OpenChannel {
            commitment_fee: 10,
            ..wont.clone()
        },
    ] {
        assert!(matches!(
            rejected_unchanged(&mut c, &Packet::Open(bad)),
            ChannelError::BadOpen(_)
        ));
    }
    assert!(c.handle_packet(&Packet::Open(wont), 0).is_ok());
}

#[test]
fn close_with_unpayable_fee_or_bad_signature_is_rejected() {
    let mut p = live();
    let sig = junk_sig();
    for fee in [u64::MAX, 20_000_000] {
        let pkt = Packet::Close(CloseChannel {
            sig,
            close_fee: fee,
        });
        assert!(matches!(
            rejected_unchanged(&mut p.b.ch, &pkt),
            ChannelError::BadClose(_)
        ));
    }
    // A fair fee (the relay minimum of a ~170 vB close): only the signature is wrong.
    let pkt = Packet::Close(CloseChannel {
        sig,
        close_fee: 200,
    });
    assert_eq!(
        rejected_unchanged(&mut p.b.ch, &pkt),
        ChannelError::BadSignature("close_channel.sig")
    );
}
