//! Every signature we give away is durable and watched (issue 13, must-have 2):
//! the channel is persisted before a signature or preimage leaves, and every
//! transaction the peer can complete with our signature is recognised on chain.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

mod support;

use channel::{Action, ChannelConfig, CommandError, Event, State, Who};
use support::{assert_persist_before_secrets, gives_away_secret, Pair, A};
use wire::{Locktime, Packet, Preimage};

fn r(n: u8) -> Preimage {
    Preimage([n; 32])
}

/// A pair with money on both sides, in Normal.
fn live() -> Pair {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.pay(A, 2_000_000_000);
    p
}

#[test]
fn update_accept_and_close_channel_leave_only_after_a_persist() {
    let mut p = live();
    // B accepts A's payment: its update_accept carries B's signature on A's next commitment.
    p.a.act(|ch| ch.pay(1_000));
    let pkt = p.a.outbox.pop_front().unwrap();
    let acts = p.b.receive(&pkt, p.now).unwrap();
    assert!(acts
        .iter()
        .any(|a| matches!(a, Action::Send(Packet::UpdateAccept(_)))));
    assert_persist_before_secrets(&acts);
    p.run();
    // A's close_channel carries A's signature on the close transaction.
    let acts = p.a.ch.close().unwrap();
    assert!(acts
        .iter()
        .any(|a| matches!(a, Action::Send(p) if gives_away_secret(p))));
    assert_persist_before_secrets(&acts);
    assert_eq!(acts.first(), Some(&Action::Persist));
}

#[test]
fn after_our_close_signature_no_update_is_accepted_and_the_close_is_recognised() {
    let mut p = live();
    p.a.act(|ch| ch.close());
    assert_eq!(p.a.ch.state(), State::CloseWaitComplete);
    // The peer, holding our close signature, proposes a payment instead: refused, unchanged.
    let before = p.a.ch.clone();
    let pay = Packet::Update(wire::Update {
        revocation_hash: r(1).hash(),
        delta_msat: -1_000,
    });
    let err = p.a.ch.handle_packet(&pay, p.now).unwrap_err();
    assert_eq!(err.reply(), Packet::error("Unexpected packet update"));
    assert_eq!(p.a.ch, before);
    // Our own commands are refused too.
    assert_eq!(
        p.a.ch.pay(1_000),
        Err(CommandError::WrongState(State::CloseWaitComplete))
    );
    // The peer completes the close and broadcasts it: we recognise it.
    p.deliver_one(true);
    let close =
        p.b.broadcast
            .first()
            .cloned()
            .expect("B broadcasts the close");
    p.b.broadcast.clear();
    p.b.outbox.clear();
    p.chain.mine(&close).unwrap();
    p.a.spend_seen(&close);
    assert_eq!(p.a.ch.state(), State::Closed);
    assert!(p.a.events.contains(&Event::Closed(close.compute_txid())));
}

#[test]
fn their_next_commitment_signed_in_update_accept_is_recognised_and_claimed() {
    let cfg = ChannelConfig {
        delay: Locktime::Blocks(20),
        ..Default::default()
    };
    let mut p = Pair::new(true, cfg);
    p.open();
    p.pay(A, 2_000_000_000);
    // A offers B an HTLC (B is the payee and knows R).
    let expiry = p.chain.height + 40;
    p.add_htlc(A, 300_000_000, r(4).hash(), Locktime::Blocks(expiry));
    // A proposes a payment; B signs A's next commitment in update_accept.
    p.a.act(|ch| ch.pay(100_000_000));
    p.deliver_one(true);
    assert_eq!(p.b.ch.state(), State::WaitSignature);
    // A takes the accept, never answers, and broadcasts its next commitment.
    p.deliver_one(false);
    p.a.outbox.clear();
    let next = p.a.ch.signed_commitment().unwrap();
    assert_eq!(p.a.ch.commitment_number(), p.b.ch.commitment_number() + 1);
    p.chain.mine(&next).unwrap();
    p.b.spend_seen(&next);
    assert_eq!(
        p.b.ch.state(),
        State::OnChain,
        "B is blind to A's next commitment"
    );
    assert!(p.b.events.contains(&Event::OnChain {
        txid: next.compute_txid(),
        owner: Who::Them
    }));
    // B's direct output (with A's payment included) is swept at once.
    let sweep = p.b.broadcast.pop().expect("B sweeps its output");
    p.chain.mine(&sweep).unwrap();
    assert!(sweep.output[0].value.to_sat() > 2_090_000);
    // B claims A's HTLC with R, before expiry.
    let acts = p.b.ch.fulfill_htlc(r(4), p.now).unwrap();
    let [Action::Broadcast(claim)] = &acts[..] else {
        panic!("{acts:?}")
    };
    p.chain.mine(claim).unwrap();
    assert!(claim.output[0].value.to_sat() > 299_000);
}

#[test]
fn after_a_lost_session_our_close_is_said_again_and_completes() {
    let mut p = live();
    p.a.act(|ch| ch.close());
    // The session drops with close_channel lost on the wire; A restarts from disk.
    let sent = p.a.outbox.pop_front().unwrap();
    let restarted = p.a.ch.clone();
    assert_eq!(restarted.state(), State::CloseWaitComplete);
    p.a.ch = restarted;
    let acts = p.a.act(|ch| ch.reconnected());
    assert_eq!(
        acts,
        [Action::Persist, Action::Send(sent)],
        "the same close_channel, same signature"
    );
    p.run();
    assert_eq!(p.a.ch.state(), State::Closed);
    assert_eq!(p.b.ch.state(), State::Closed);
    // Nothing to say again in other states.
    assert_eq!(p.a.ch.reconnected().unwrap(), []);
}

#[test]
fn an_anchor_spend_we_do_not_recognise_raises_an_alarm_and_ends_updates() {
    let mut p = live();
    // A commitment-shaped spend of the anchor with a number from the future.
    let mut tx = p.a.ch.signed_commitment().unwrap();
    let (lock, seq) = channel::tx::commitment_locks(p.a.ch.commitment_number() + 7);
    tx.lock_time = lock;
    tx.input[0].sequence = seq;
    let balances = p.b.ch.balances().cloned();
    let acts = p.b.ch.spend_seen(&tx, None).unwrap();
    assert_eq!(
        acts,
        [
            Action::Persist,
            Action::Notify(Event::AnchorSpentUnrecognised {
                txid: tx.compute_txid()
            })
        ]
    );
    // The anchor is gone: no more updates, and nothing is claimed from a transaction we
    // cannot read; the balances stay as they were for the operator to see.
    assert_eq!(p.b.ch.state(), State::OnChain);
    assert_eq!(p.b.ch.balances().cloned(), balances);
    assert!(p.b.ch.pay(1_000).is_err());
}
