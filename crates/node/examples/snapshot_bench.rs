//! The cost of a channel snapshot (docs/benchmarks.md, "Channel snapshot"): what the node
//! encodes on every durable write of a channel and decodes at start, timed against one
//! secp256k1 ECDSA signature measured in the same run (a channel update signs twice and
//! verifies twice: the crypto a write is compared with).
//!
//! `cargo run --release -p potluck-node --example snapshot_bench [-- ROUNDS]`
//!
//! The channel is the hub's side of a live channel (the side that accepted it, as a hub's
//! peers open theirs): 1,000 updates done, three HTLCs in flight each way, and the
//! worst-case store of the peer's revocation preimages (49 slots, what 2^48 updates
//! leave, built from the peer's real seed). Each of 15 rounds times ROUNDS encodes,
//! ROUNDS/4 decodes and ROUNDS signatures back to back; the fastest round of each is
//! printed, as ns per operation. `-- ROUNDS dump` prints the snapshot too, in hex;
//! `-- ROUNDS encode` only encodes, ROUNDS times (for `perf record`). The last line is for scripts:
//! `snapshot: encode 1625 ns = 0.08 signs; decode 15858 ns = 0.77 signs; 2810 bytes; version 4`.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Instant;

use channel::{Action, AnchorRole, Channel, ChannelConfig, ChannelSecrets, Event};
use secp256k1::{Message, Secp256k1, SecretKey};
use wire::{Locktime, Packet, Preimage};

/// The funder's (the peer's) revocation seed.
const PEER_SEED: [u8; 32] = [0x81; 32];

fn secrets(t: u8, seed: [u8; 32]) -> ChannelSecrets {
    ChannelSecrets {
        commit_key: SecretKey::from_slice(&[t; 32]).unwrap(),
        final_key: SecretKey::from_slice(&[t + 0x40; 32]).unwrap(),
        revocation_seed: seed,
    }
}

/// Two channels back to back in memory.
struct Pair {
    a: Channel,
    b: Channel,
}

impl Pair {
    /// Delivers `first` (from a if `from_a`) and every packet it causes, both ways.
    fn run(
        &mut self,
        first: Vec<Action>,
        from_a: bool,
    ) -> Option<(bitcoin::ScriptBuf, bitcoin::Amount)> {
        self.run_both(vec![(first, from_a)])
    }

    /// [`Pair::run`] of several action lists at once.
    fn run_both(
        &mut self,
        firsts: Vec<(Vec<Action>, bool)>,
    ) -> Option<(bitcoin::ScriptBuf, bitcoin::Amount)> {
        let mut anchor = None;
        let mut queue: Vec<(bool, Packet)> = Vec::new();
        let mut take = |acts: Vec<Action>, from_a: bool, queue: &mut Vec<(bool, Packet)>| {
            for act in acts {
                match act {
                    Action::Send(p) => queue.push((!from_a, p)),
                    Action::Notify(Event::AnchorNeeded {
                        script_pubkey,
                        amount,
                    }) => anchor = Some((script_pubkey, amount)),
                    _ => {}
                }
            }
        };
        for (first, from_a) in firsts {
            take(first, from_a, &mut queue);
        }
        while !queue.is_empty() {
            for (to_a, p) in std::mem::take(&mut queue) {
                let ch = if to_a { &mut self.a } else { &mut self.b };
                let acts = ch.handle_packet(&p, 0).unwrap();
                take(acts, to_a, &mut queue);
            }
        }
        anchor
    }
}

/// The hub's side of a live channel with history, HTLCs in flight and a full shachain.
fn hub_channel() -> Channel {
    let cfg = ChannelConfig::default();
    let a = Channel::new(
        cfg.clone(),
        secrets(1, PEER_SEED),
        AnchorRole::Fund {
            anchor_sat: 10_000_000,
        },
    );
    let b = Channel::new(cfg, secrets(2, [0x82; 32]), AnchorRole::Accept);
    let mut p = Pair { a, b };
    let (start_a, start_b) = (p.a.start().unwrap(), p.b.start().unwrap());
    let (script_pubkey, value) = p.run_both(vec![(start_a, true), (start_b, false)]).unwrap();
    let tx = bitcoin::Transaction {
        version: bitcoin::transaction::Version::TWO,
        lock_time: bitcoin::absolute::LockTime::ZERO,
        input: vec![bitcoin::TxIn::default()],
        output: vec![bitcoin::TxOut {
            value,
            script_pubkey,
        }],
    };
    let created = p.a.anchor_created(tx, 0).unwrap();
    p.run(created, true);
    let (depth_a, depth_b) = (p.a.anchor_depth(1), p.b.anchor_depth(1));
    p.run_both(vec![(depth_a, true), (depth_b, false)]);
    p.a.block_height(100);
    p.b.block_height(100);
    let half = p.a.pay(4_000_000_000).unwrap();
    p.run(half, true);
    for i in 1..1_000u32 {
        let from_a = i % 2 == 0;
        let ch = if from_a { &mut p.a } else { &mut p.b };
        let acts = ch.pay(1_000).unwrap();
        p.run(acts, from_a);
    }
    for i in 0..6u32 {
        let mut r = [0u8; 32];
        r[..4].copy_from_slice(&i.to_le_bytes());
        let from_a = i % 2 == 0;
        let ch = if from_a { &mut p.a } else { &mut p.b };
        let acts = ch
            .add_htlc(600_000, Preimage(r).hash(), Locktime::Blocks(1000), 0)
            .unwrap();
        p.run(acts, from_a);
    }
    assert_eq!(p.b.state(), channel::State::Normal);
    with_full_shachain(&p.b)
}

/// `ch` with the peer's revocation store as 2^48 updates leave it: slot k holds the last
/// preimage whose index has k trailing ones. Only the store's content matters to the
/// codec; the commitment numbers stay as they are.
fn with_full_shachain(ch: &Channel) -> Channel {
    const UPDATES: u64 = 1 << 48;
    let known: Vec<serde_json::Value> = (0..=48u32)
        .map(|k| {
            let n = if k == 48 {
                UPDATES - 1
            } else {
                UPDATES - 1 - (1u64 << k)
            };
            let hash = channel::shachain::preimage_from_seed(&PEER_SEED, n).0;
            serde_json::json!({ "index": !n, "hash": hash_field(&hash) })
        })
        .collect();
    let mut v = serde_json::to_value(ch).unwrap();
    let store = &mut v["stage"]["Established"]["their_secrets"];
    assert!(store.is_object(), "no revocation store in {v}");
    *store = serde_json::json!({ "known": known, "next": UPDATES });
    let full: Channel = serde_json::from_value(v).unwrap();
    assert_eq!(full.revocation_slots(), 49);
    full
}

/// A 32-byte value as the channel's serde layout writes it.
fn hash_field(bytes: &[u8; 32]) -> serde_json::Value {
    serde_json::to_value(bytes).unwrap()
}

/// Nanoseconds per call of `f`, timed over `n` calls.
fn ns_per_call(n: u32, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() * 1e9 / f64::from(n)
}

fn main() {
    let rounds: u32 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000);
    let ch = hub_channel();
    let snapshot = node::snapshot_codec::encode(&ch).unwrap();
    let (back, version) = node::snapshot_codec::decode(&snapshot).unwrap();
    assert_eq!(back, ch, "the snapshot reads back equal");
    let secp = Secp256k1::new();
    let key = SecretKey::from_slice(&[7; 32]).unwrap();
    let msg = Message::from_digest([9; 32]);

    match std::env::args().nth(2).as_deref() {
        Some("dump") => println!("{}", hex::encode(&snapshot)),
        // For `perf record`: encodes alone.
        Some("encode") => {
            for _ in 0..rounds {
                black_box(node::snapshot_codec::encode(black_box(&ch)).unwrap());
            }
            return;
        }
        _ => {}
    }

    // The three side by side in each round, so that a busy spell of the machine slows
    // all of them; the fastest round of each is kept.
    let (mut encode, mut decode, mut sign) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
    for _ in 0..15 {
        encode = encode.min(ns_per_call(rounds, || {
            black_box(node::snapshot_codec::encode(black_box(&ch)).unwrap());
        }));
        decode = decode.min(ns_per_call(rounds / 4, || {
            black_box(node::snapshot_codec::decode(black_box(&snapshot)).unwrap());
        }));
        sign = sign.min(ns_per_call(rounds, || {
            black_box(secp.sign_ecdsa(black_box(&msg), black_box(&key)));
        }));
    }
    println!(
        "channel: {} revocation slots, 3+3 HTLCs in flight, {} updates",
        ch.revocation_slots(),
        ch.commitment_number()
    );
    println!(
        "encode        {encode:>9.0} ns  = {:.2} signs",
        encode / sign
    );
    println!(
        "decode        {decode:>9.0} ns  = {:.2} signs",
        decode / sign
    );
    println!("ecdsa sign    {sign:>9.0} ns  (baseline)");
    println!(
        "snapshot: encode {encode:.0} ns = {:.2} signs; decode {decode:.0} ns = {:.2} signs; {} bytes; version {version}",
        encode / sign,
        decode / sign,
        snapshot.len()
    );
}
