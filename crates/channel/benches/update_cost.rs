//! CPU cost of one completed update, less sensitive to a loaded machine than
//! wall time: run under `perf stat -e task-clock` twice, with 0 and with N updates, and divide
//! the difference by N (docs/benchmarks.md). Arguments: `fresh|history|raw N [H]`;
//! `history` first offers and fulfils H HTLCs (default 2,000); `raw` runs N times
//! the secp256k1 bound of one update (two signatures, two verifications) instead;
//! `paired N` times N rounds of 25 updates and 25 raw bounds back to back (wall
//! time, so both see the same load) and prints the fastest and the median round.
//! Deterministic, so `valgrind --tool=callgrind` instruction counts work as well.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

#[path = "../tests/support/mod.rs"]
mod support;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes `--bench`: run a short smoke pass then.
    let (mode, n) = match (args.get(1).map(String::as_str), args.get(2)) {
        (Some(m @ ("fresh" | "history" | "raw" | "paired")), Some(n)) => {
            (m.to_owned(), n.parse().unwrap_or(0))
        }
        _ => ("fresh".to_owned(), 10),
    };
    let history: u32 = args.get(3).and_then(|h| h.parse().ok()).unwrap_or(2_000);
    if mode == "raw" {
        raw(n);
        return;
    }
    let mut p = support::Pair::new(true, channel::ChannelConfig::default());
    p.open();
    let acts = p.a.ch.pay(4_000_000_000).unwrap();
    p.a.absorb(acts);
    p.run();
    if mode == "history" {
        for i in 0..history {
            let mut r = [0u8; 32];
            r[..4].copy_from_slice(&i.to_le_bytes());
            let r = wire::Preimage(r);
            let expiry = wire::Locktime::Blocks(p.chain.height + 200);
            let now = p.now;
            // Alternate the direction so that neither side runs dry.
            let a_offers = i % 2 == 0;
            let acts = p
                .node(a_offers)
                .ch
                .add_htlc(1_000_000, r.hash(), expiry, now)
                .unwrap();
            p.node(a_offers).absorb(acts);
            p.run();
            let acts = p.node(!a_offers).ch.fulfill_htlc(r, now).unwrap();
            p.node(!a_offers).absorb(acts);
            p.run();
        }
    }
    if mode == "paired" {
        paired(&mut p, n);
        return;
    }
    let mut from_a = true;
    for _ in 0..n {
        let acts = p.node(from_a).ch.pay(1_000).unwrap();
        p.node(from_a).absorb(acts);
        p.run();
        from_a = !from_a;
    }
    p.assert_agree();
    println!("{mode} {n} updates");
}

/// The secp256k1 bound of `n` updates, as `benches/updates.rs` measures it: one
/// context, two signatures and two verifications per update.
fn raw(n: u32) {
    raw_rounds(&secp256k1::Secp256k1::new(), n);
    println!("raw {n} two-sign-two-verify");
}

fn raw_rounds(secp: &secp256k1::Secp256k1<secp256k1::All>, n: u32) {
    use secp256k1::{Message, PublicKey, SecretKey};
    use std::hint::black_box;
    let ka = SecretKey::from_slice(&[1; 32]).unwrap();
    let kb = SecretKey::from_slice(&[2; 32]).unwrap();
    let (pa, pb) = (
        PublicKey::from_secret_key(secp, &ka),
        PublicKey::from_secret_key(secp, &kb),
    );
    let m1 = Message::from_digest([7; 32]);
    let m2 = Message::from_digest([8; 32]);
    for _ in 0..n {
        let s1 = secp.sign_ecdsa(black_box(&m1), &kb);
        secp.verify_ecdsa(&m1, &s1, &pb).unwrap();
        let s2 = secp.sign_ecdsa(black_box(&m2), &ka);
        secp.verify_ecdsa(&m2, &s2, &pa).unwrap();
    }
}

/// `rounds` rounds of 25 completed updates then 25 raw bounds, timed per round.
fn paired(p: &mut support::Pair, rounds: u32) {
    use std::time::Instant;
    const PER_ROUND: u32 = 25;
    let secp = secp256k1::Secp256k1::new();
    let (mut upd, mut raw, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    let mut from_a = true;
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..PER_ROUND {
            let acts = p.node(from_a).ch.pay(1_000).unwrap();
            p.node(from_a).absorb(acts);
            p.run();
            from_a = !from_a;
        }
        let u = t.elapsed().as_secs_f64() * 1e6 / f64::from(PER_ROUND);
        let t = Instant::now();
        raw_rounds(&secp, PER_ROUND);
        let r = t.elapsed().as_secs_f64() * 1e6 / f64::from(PER_ROUND);
        upd.push(u);
        raw.push(r);
        ratio.push(r / u);
    }
    p.assert_agree();
    for v in [&mut upd, &mut raw, &mut ratio] {
        v.sort_by(f64::total_cmp);
    }
    let mid = |v: &[f64]| v[v.len() / 2];
    println!(
        "update µs: fastest {:.1} median {:.1}; raw µs: fastest {:.1} median {:.1}; \
         raw/update: of the fastest {:.1} %, median of rounds {:.1} %",
        upd[0],
        mid(&upd),
        raw[0],
        mid(&raw),
        100.0 * raw[0] / upd[0],
        100.0 * mid(&ratio)
    );
}
