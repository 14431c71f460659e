//! Completed updates per second for two in-memory channels, next to the raw
//! secp256k1 cost of one update (two signatures and two verifications).
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use secp256k1::{Message, PublicKey, Secp256k1, SecretKey};

fn updates(c: &mut Criterion) {
    let mut g = c.benchmark_group("channel");
    g.throughput(Throughput::Elements(1));

    let mut p = support::Pair::new(true, channel::ChannelConfig::default());
    p.open();
    let acts = p.a.ch.pay(4_000_000_000).unwrap();
    p.a.absorb(acts);
    p.run();
    let mut from_a = true;
    g.bench_function("completed_update_two_channels", |b| {
        b.iter(|| {
            // One four-leg update (update, accept, signature, complete), alternating direction.
            let acts = p.node(from_a).ch.pay(1_000).unwrap();
            p.node(from_a).absorb(acts);
            p.run();
            from_a = !from_a;
        })
    });
    p.assert_agree();

    // The same after 2,000 HTLCs were offered and fulfilled: the per-packet cost must
    // not grow with the channel's history (issue 13).
    let mut p = support::Pair::new(true, channel::ChannelConfig::default());
    p.open();
    let acts = p.a.ch.pay(4_000_000_000).unwrap();
    p.a.absorb(acts);
    p.run();
    for i in 0..2_000u32 {
        let mut r = [0u8; 32];
        r[..4].copy_from_slice(&i.to_le_bytes());
        let r = wire::Preimage(r);
        let expiry = wire::Locktime::Blocks(p.chain.height + 200);
        let now = p.now;
        let acts = p.a.ch.add_htlc(1_000_000, r.hash(), expiry, now).unwrap();
        p.a.absorb(acts);
        p.run();
        let acts = p.b.ch.fulfill_htlc(r, now).unwrap();
        p.b.absorb(acts);
        p.run();
    }
    for n in [&mut p.a, &mut p.b] {
        n.events.clear();
    }
    let mut from_a = true;
    g.bench_function("completed_update_after_2000_htlcs", |b| {
        b.iter(|| {
            let acts = p.node(from_a).ch.pay(1_000).unwrap();
            p.node(from_a).absorb(acts);
            p.run();
            from_a = !from_a;
        })
    });
    p.assert_agree();

    let secp = Secp256k1::new();
    let ka = SecretKey::from_slice(&[1; 32]).unwrap();
    let kb = SecretKey::from_slice(&[2; 32]).unwrap();
    let (pa, pb) = (
        PublicKey::from_secret_key(&secp, &ka),
        PublicKey::from_secret_key(&secp, &kb),
    );
    let m1 = Message::from_digest([7; 32]);
    let m2 = Message::from_digest([8; 32]);
    g.bench_function("raw_secp256k1_two_sign_two_verify", |b| {
        b.iter(|| {
            // Each update: the receiver signs the proposer's commitment and the proposer
            // verifies it; the proposer signs the receiver's and the receiver verifies it.
            let s1 = secp.sign_ecdsa(black_box(&m1), &kb);
            secp.verify_ecdsa(&m1, &s1, &pb).unwrap();
            let s2 = secp.sign_ecdsa(black_box(&m2), &ka);
            secp.verify_ecdsa(&m2, &s2, &pa).unwrap();
        })
    });
    g.finish();
}

criterion_group!(benches, updates);
criterion_main!(benches);
