//! History out of the hot path (issue 13, must-have 7): the channel's snapshot does
//! not grow with the number of HTLCs it has seen; the HTLCs of revoked commitments
//! leave as `Action::Archive` records and come back only for a penalty.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

mod support;

use channel::{Action, ChannelConfig, Event};
use support::{Pair, A, B};
use wire::{Locktime, Preimage};

fn r(i: u32) -> Preimage {
    let mut b = [0u8; 32];
    b[..4].copy_from_slice(&i.to_le_bytes());
    Preimage(b)
}

/// `n` HTLCs offered by A, each fulfilled by B.
fn cycles(p: &mut Pair, from: u32, n: u32) {
    for i in from..from + n {
        let expiry = Locktime::Blocks(p.chain.height + 200);
        p.add_htlc(A, 1_000_000, r(i).hash(), expiry);
        p.fulfill(B, r(i));
    }
}

fn snapshot_len(p: &Pair) -> (usize, usize) {
    (
        serde_json::to_string(&p.a.ch).unwrap().len(),
        serde_json::to_string(&p.b.ch).unwrap().len(),
    )
}

#[test]
fn snapshot_does_not_grow_with_the_htlcs_ever_seen() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.pay(A, 4_000_000_000);
    cycles(&mut p, 0, 100);
    let (a100, b100) = snapshot_len(&p);
    cycles(&mut p, 100, 900);
    let (a1000, b1000) = snapshot_len(&p);
    // Only the shachain store may grow (O(log n) slots of ~100 bytes of JSON).
    assert!(
        a1000 <= a100 + 1_000 && b1000 <= b100 + 1_000,
        "snapshot grew from {a100}/{b100} to {a1000}/{b1000} bytes over 900 HTLCs"
    );
    // The history went to the archive instead: one record per revoked commitment with HTLCs.
    assert!(p.a.archive.len() >= 1_000 && p.b.archive.len() >= 1_000);
}

#[test]
fn penalty_takes_the_htlcs_from_the_archive_and_the_rest_without_it() {
    let mut p = Pair::new(true, ChannelConfig::default());
    p.open();
    p.pay(A, 4_000_000_000);
    let expiry = Locktime::Blocks(p.chain.height + 200);
    for (side, i) in [(A, 1u32), (B, 2)] {
        p.add_htlc(side, 100_000_000, r(i).hash(), expiry);
    }
    let old = p.a.ch.signed_commitment().unwrap();
    let n = p.a.ch.commitment_number();
    p.pay(A, 1_000_000);
    let record =
        p.b.archive
            .get(&n)
            .cloned()
            .expect("B archived A's revoked commitment");
    assert_eq!(record.htlcs.len(), 2);
    // Without the record: the penalty still takes A's delayed output and B's own output.
    let mut blind = p.b.ch.clone();
    let acts = blind.spend_seen(&old, None).unwrap();
    let partial = acts
        .iter()
        .find_map(|a| match a {
            Action::Broadcast(tx) => Some(tx.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(partial.input.len(), old.output.len() - 2);
    // With it: every output.
    let acts = p.b.ch.spend_seen(&old, Some(&record)).unwrap();
    assert!(acts.contains(&Action::Notify(Event::CheatDetected {
        commitment_number: n
    })));
    let full = acts
        .iter()
        .find_map(|a| match a {
            Action::Broadcast(tx) => Some(tx.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(full.input.len(), old.output.len());
    p.chain.mine(&old).unwrap();
    p.chain.mine(&full).unwrap();
}
