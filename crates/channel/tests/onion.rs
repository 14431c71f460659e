//! The channel carries an HTLC's onion (`update_add_htlc.onion`, issue 30): sent with
//! our HTLC (also when a crossing proposal defers it), kept with the peer's HTLC while it
//! is in our commitment (persisted with it, in JSON and in the node's binary layout), and
//! gone once the HTLC is; a snapshot written before onions reads as a channel without them.
// Test code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

mod support;

use channel::{Channel, ChannelConfig, Event};
use support::{Pair, A, B};
use wire::{Locktime, Onion, Packet, Preimage};

fn onion(tag: u8) -> Onion {
    let bytes: Vec<u8> = (0..Onion::LEN)
        .map(|i| (i as u8).wrapping_mul(31) ^ tag)
        .collect();
    Onion::try_from(&bytes[..]).unwrap()
}

fn json(ch: &Channel) -> serde_json::Value {
    serde_json::to_value(ch).unwrap()
}

/// Whether the channel keeps any onion (its snapshot's `onions` is not empty).
fn has_onions(v: &serde_json::Value) -> bool {
    v["stage"]["Established"]["onions"]
        .as_array()
        .is_some_and(|a| !a.is_empty())
}

/// The channel read back from its snapshot, JSON and binary (postcard, the node's version
/// 4), which must agree.
fn restored(ch: &Channel) -> Channel {
    let from_json: Channel = serde_json::from_str(&serde_json::to_string(ch).unwrap()).unwrap();
    let from_binary: Channel = postcard::from_bytes(&postcard::to_allocvec(ch).unwrap()).unwrap();
    assert_eq!(from_json, from_binary);
    from_json
}

#[test]
fn an_htlc_carries_its_onion_and_the_receiver_keeps_it_while_the_htlc_lasts() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    let r = Preimage([5; 32]);
    let expiry = Locktime::Blocks(p.chain.height + 300);
    let now = p.now;
    let o = onion(1);
    p.a.act(|ch| ch.add_htlc_with_onion(2_000_000, r.hash(), expiry, Some(o.clone()), now));
    match p.a.outbox.front() {
        Some(Packet::UpdateAddHtlc(add)) => assert_eq!(add.onion.as_ref(), Some(&o)),
        other => panic!("expected update_add_htlc, got {other:?}"),
    }
    p.run();
    p.assert_agree();
    assert_eq!(p.b.ch.htlc_onion(&r.hash()), Some(&o));
    // Persisted with the HTLC: a restart between acceptance and forwarding still has it.
    assert_eq!(restored(&p.b.ch).htlc_onion(&r.hash()), Some(&o));
    // The offerer does not keep it once the peer took the HTLC.
    assert_eq!(p.a.ch.htlc_onion(&r.hash()), None);
    assert!(!has_onions(&json(&p.a.ch)));
    p.fulfill(B, r);
    assert_eq!(p.b.ch.htlc_onion(&r.hash()), None);
    assert!(!has_onions(&json(&p.b.ch)), "gone with its HTLC");
}

#[test]
fn the_onion_is_kept_from_the_accept_on_so_a_restart_before_the_update_completes_has_it() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    let r = Preimage([6; 32]);
    let expiry = Locktime::Blocks(p.chain.height + 300);
    let now = p.now;
    let o = onion(2);
    p.a.act(|ch| ch.add_htlc_with_onion(2_000_000, r.hash(), expiry, Some(o.clone()), now));
    // B accepts: its state is persisted before the accept leaves, with the onion.
    p.deliver_one(true);
    let saved = restored(&p.b.ch);
    assert!(has_onions(&json(&saved)));
    p.b.ch = saved;
    p.run();
    p.assert_agree();
    assert_eq!(p.b.ch.htlc_onion(&r.hash()), Some(&o));
}

#[test]
fn a_routefailed_htlc_drops_its_onion() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    let r = Preimage([7; 32]);
    let expiry = Locktime::Blocks(p.chain.height + 300);
    let now = p.now;
    p.a.act(|ch| ch.add_htlc_with_onion(2_000_000, r.hash(), expiry, Some(onion(3)), now));
    p.run();
    p.fail(B, r.hash());
    assert_eq!(p.b.ch.htlc_onion(&r.hash()), None);
    assert!(!has_onions(&json(&p.b.ch)));
}

#[test]
fn a_deferred_htlc_is_proposed_again_with_its_onion() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    // A (the funder) has priority: B's HTLC loses the race and is deferred.
    assert!(p.a.ch.has_priority());
    let r = Preimage([8; 32]);
    let expiry = Locktime::Blocks(p.chain.height + 300);
    let now = p.now;
    let o = onion(4);
    p.pay(A, 1_000_000_000);
    p.pay(B, 1_000_000);
    assert!(p.a.ch.has_priority());
    p.b.act(|ch| ch.add_htlc_with_onion(2_000_000, r.hash(), expiry, Some(o.clone()), now));
    p.a.act(|ch| ch.pay(3_000_000));
    p.run();
    p.assert_agree();
    assert!(p
        .b
        .events
        .iter()
        .any(|e| matches!(e, Event::ProposalDeferred(_))));
    assert_eq!(p.a.ch.htlc_onion(&r.hash()), Some(&o), "sent again with it");
    assert!(
        !has_onions(&json(&p.b.ch)),
        "the offerer forgot it once taken"
    );
}

#[test]
fn a_declined_htlc_drops_its_onion() {
    let strict = ChannelConfig {
        max_htlc_expiry_blocks: 200,
        ..Default::default()
    };
    let mut p = Pair::new_with(true, ChannelConfig::default(), strict);
    p.open();
    let r = Preimage([9; 32]);
    let expiry = Locktime::Blocks(p.chain.height + 300);
    let now = p.now;
    p.a.act(|ch| ch.add_htlc_with_onion(2_000_000, r.hash(), expiry, Some(onion(5)), now));
    p.run();
    assert!(p
        .a
        .events
        .iter()
        .any(|e| matches!(e, Event::Declined { .. })));
    assert!(!has_onions(&json(&p.a.ch)));
    assert!(!has_onions(&json(&p.b.ch)));
}

/// Without onions nothing changes: the packet has no field 5 and nothing is kept; a
/// snapshot from before onions (here one that had onions, its key removed) reads as no
/// onions.
#[test]
fn without_an_onion_nothing_is_kept_and_an_old_snapshot_reads() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    let r = Preimage([10; 32]);
    let expiry = Locktime::Blocks(p.chain.height + 300);
    let now = p.now;
    p.a.act(|ch| ch.add_htlc(2_000_000, r.hash(), expiry, now));
    match p.a.outbox.front() {
        Some(Packet::UpdateAddHtlc(add)) => assert_eq!(add.onion, None),
        other => panic!("expected update_add_htlc, got {other:?}"),
    }
    p.run();
    assert_eq!(p.b.ch.htlc_onion(&r.hash()), None);
    assert!(!has_onions(&json(&p.b.ch)));
    assert_eq!(restored(&p.b.ch), p.b.ch);

    let r2 = Preimage([11; 32]);
    p.a.act(|ch| ch.add_htlc_with_onion(2_000_000, r2.hash(), expiry, Some(onion(6)), now));
    p.run();
    let mut v = json(&p.b.ch);
    let e = &mut v["stage"]["Established"];
    assert!(e["onions"].is_array());
    e.as_object_mut().unwrap().remove("onions");
    let old: Channel = serde_json::from_value(v).unwrap();
    assert_eq!(old.htlc_onion(&r2.hash()), None);
    assert_eq!(old.balances(), p.b.ch.balances());
}

/// The owner's veto (the node's forwarding policy) declines an HTLC the channel would
/// accept: the offerer hears the given reason and nothing changes on either side.
#[test]
fn an_htlc_declined_by_the_owner_changes_nothing_and_carries_its_reason() {
    use wire::{DeclineReason, Funding};
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    let r = Preimage([12; 32]);
    let expiry = Locktime::Blocks(p.chain.height + 300);
    let now = p.now;
    let before = json(&p.b.ch);
    p.a.act(|ch| ch.add_htlc_with_onion(2_000_000, r.hash(), expiry, Some(onion(7)), now));
    let add = p.a.outbox.pop_front().unwrap();
    let reason = DeclineReason::InsufficientFunds(Funding {
        fixed: Some(2),
        per_micro_unit: Some(100),
    });
    let actions = p.b.ch.handle_packet_declining(&add, now, reason).unwrap();
    p.b.absorb(actions);
    assert_eq!(json(&p.b.ch), before, "no trace on the decliner");
    p.run();
    p.assert_agree();
    assert!(p.a.events.contains(&Event::Declined {
        r_hash: r.hash(),
        reason: Some(reason),
    }));
    assert!(!has_onions(&json(&p.a.ch)));
    // An HTLC the channel itself declines keeps the channel's reason.
    let far = Locktime::Blocks(p.chain.height + 5_000);
    let bad = Packet::UpdateAddHtlc(wire::UpdateAddHtlc {
        revocation_hash: Preimage([13; 32]).hash(),
        amount_msat: 2_000_000,
        r_hash: Preimage([14; 32]).hash(),
        expiry: far,
        onion: None,
    });
    let actions = p.b.ch.handle_packet_declining(&bad, now, reason).unwrap();
    assert!(matches!(
        &actions[..],
        [channel::Action::Send(Packet::UpdateDeclineHtlc(d))]
            if d.reason == Some(DeclineReason::CannotRoute(true))
    ));
}
