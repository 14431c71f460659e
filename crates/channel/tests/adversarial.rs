//! proptest: adversarial packet sequences against the state machine. Honest
//! traffic, replays of earlier packets and forged packets of every type are
//! interleaved at random; whatever arrives in whatever state, the machine
//! never panics (debug assertions included), and a rejected packet leaves the
//! serialised snapshot exactly as it was.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

mod support;

use bitcoin_hashes::Hash;
use channel::{Channel, ChannelConfig};
use proptest::prelude::*;
use secp256k1::{Message, Secp256k1, SecretKey};
use support::{Node, Pair, A, B};
use wire::*;

fn r(n: u8) -> Preimage {
    Preimage([n; 32])
}

fn junk_sig(n: u8) -> secp256k1::ecdsa::Signature {
    Secp256k1::new().sign_ecdsa(
        &Message::from_digest([n; 32]),
        &SecretKey::from_slice(&[3; 32]).unwrap(),
    )
}

#[derive(Debug, Clone)]
enum Op {
    /// An owner command on A or B (its packets go to the honest outbox).
    Command { a: bool, kind: u8, pick: u8 },
    /// Deliver the next honest packet from A's or B's outbox.
    Deliver { from_a: bool },
    /// Replay an earlier packet (valid signatures in the wrong context) to A or B.
    Replay { to_a: bool, pick: u16 },
    /// A forged packet of any type to A or B.
    Forge { to_a: bool, kind: u8, x: u8, y: u8 },
    /// Blocks pass.
    Blocks(u8),
    /// A or B goes on chain; both see its commitment (and claims) mined.
    ForceClose { a: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (any::<bool>(), 0u8..6, any::<u8>()).prop_map(|(a, kind, pick)| Op::Command { a, kind, pick }),
        5 => any::<bool>().prop_map(|from_a| Op::Deliver { from_a }),
        2 => (any::<bool>(), any::<u16>()).prop_map(|(to_a, pick)| Op::Replay { to_a, pick }),
        4 => (any::<bool>(), 0u8..18, any::<u8>(), any::<u8>()).prop_map(|(to_a, kind, x, y)| Op::Forge { to_a, kind, x, y }),
        1 => (1u8..200).prop_map(Op::Blocks),
        1 => any::<bool>().prop_map(|a| Op::ForceClose { a }),
    ]
}

/// An amount at an edge: zero, one, around dust, large, `u32::MAX`.
fn edge_amount(x: u8) -> u32 {
    let amounts = [
        0u32,
        1,
        545_999,
        546_000,
        1_000_000,
        2_000_000_000,
        u32::MAX,
    ];
    amounts[x as usize % amounts.len()]
}

/// An `update.delta_msat` at an edge: positive, zero, beyond uint32, `i64::MIN`.
fn edge_delta(x: u8) -> i64 {
    let deltas = [
        -1_000i64,
        0,
        1,
        i64::MIN,
        -(i64::from(u32::MAX)) - 1,
        -2_000_000_000,
    ];
    deltas[x as usize % deltas.len()]
}

/// A time lock at an edge: now, just after, in range, too far, in seconds, the maximum.
fn edge_expiry(x: u8, y: u8, height: u32) -> Locktime {
    match y % 6 {
        0 => Locktime::Blocks(height),
        1 => Locktime::Blocks(height + 1),
        2 => Locktime::Blocks(height + 200),
        3 => Locktime::Blocks(height + 5_000),
        4 => Locktime::Seconds(1_700_000_000 + u32::from(x) * 600),
        _ => Locktime::Blocks(u32::MAX),
    }
}

/// A packet of type `kind` (0..18) with edge-case fields picked by `x` and `y`.
fn forge(kind: u8, x: u8, y: u8, height: u32) -> Packet {
    let amount = edge_amount(x);
    let h = r(y % 5).hash();
    let expiry = edge_expiry(x, y, height);
    let key = ChainPubkey::new(secp256k1::PublicKey::from_secret_key(
        &Secp256k1::new(),
        &SecretKey::from_slice(&[5; 32]).unwrap(),
    ));
    match kind {
        0 => Packet::Open(OpenChannel {
            delay: expiry,
            revocation_hash: h,
            commit_key: key,
            final_key: key,
            anch: if x % 2 == 0 {
                AnchorOffer::WillCreateAnchor
            } else {
                AnchorOffer::WontCreateAnchor
            },
            min_depth: Some(u32::from(y % 12)),
            commitment_fee: u64::from(amount),
        }),
        1 => Packet::OpenAnchor(OpenAnchor {
            txid: Sha256d::hash(&[x]),
            output_index: u32::from(y),
            amount: u64::from(amount),
            commit_sig: junk_sig(x),
        }),
        2 => Packet::OpenCommitSig(OpenCommitSig { sig: junk_sig(x) }),
        3 => Packet::OpenComplete(OpenComplete::default()),
        4 => Packet::Update(Update {
            revocation_hash: h,
            delta_msat: edge_delta(x),
        }),
        5 => Packet::UpdateAddHtlc(UpdateAddHtlc {
            revocation_hash: h,
            amount_msat: amount,
            r_hash: r(x % 5).hash(),
            expiry,
            onion: None,
        }),
        6 => Packet::UpdateAccept(UpdateAccept {
            sig: junk_sig(x),
            revocation_hash: h,
        }),
        7 => Packet::UpdateSignature(UpdateSignature {
            sig: junk_sig(x),
            revocation_preimage: r(y % 5),
        }),
        8 => Packet::UpdateComplete(UpdateComplete {
            revocation_preimage: r(y % 5),
        }),
        9 => Packet::UpdateDeclineHtlc(UpdateDeclineHtlc {
            reason: Some(if x % 2 == 0 {
                DeclineReason::CannotRoute(true)
            } else {
                DeclineReason::InsufficientFunds(Funding {
                    fixed: Some(i64::from(y)),
                    per_micro_unit: None,
                })
            }),
        }),
        10 => Packet::UpdateFulfillHtlc(UpdateFulfillHtlc {
            revocation_hash: h,
            r: r(x % 5),
        }),
        11 => Packet::UpdateTimedoutHtlc(UpdateTimedoutHtlc {
            revocation_hash: h,
            r_hash: r(x % 5).hash(),
        }),
        12 => Packet::UpdateRoutefailHtlc(UpdateRoutefailHtlc {
            revocation_hash: h,
            r_hash: r(x % 5).hash(),
        }),
        13 => Packet::Close(CloseChannel {
            sig: junk_sig(x),
            close_fee: u64::from(amount),
        }),
        14 => Packet::CloseComplete(CloseChannelComplete { sig: junk_sig(x) }),
        15 => Packet::CloseAck,
        16 => Packet::Error(ErrorPacket {
            problem: Some("x".into()),
        }),
        _ => Packet::Auth(Authenticate {
            node_id: key,
            session_sig: junk_sig(x),
        }),
    }
}

/// Delivers `pkt` to `dst`, which performs what its channel answers (the `Persist`
/// guarantee checked); a rejection must leave the serialised channel unchanged.
fn deliver(dst: &mut Node, pkt: &Packet, now: u64) {
    let before = serde_json::to_string(&dst.ch).unwrap();
    if let Err(rejected) = dst.receive(pkt, now) {
        assert_eq!(
            serde_json::to_string(&dst.ch).unwrap(),
            before,
            "rejected {} ({}) changed the channel",
            pkt.name(),
            rejected.error
        );
        assert!(matches!(rejected.reply(), Packet::Error(_)));
    }
}

struct World {
    p: Pair,
    log: Vec<Packet>,
}

impl World {
    fn apply(&mut self, op: &Op) {
        let now = self.p.now;
        match *op {
            Op::Command { a, kind, pick } => {
                let h = self.p.chain.height;
                // A refused command changes nothing; an accepted one is performed.
                let n = self.p.node(a);
                n.try_act(|ch| match kind {
                    0 => ch.pay(u64::from(pick) * 1_000_000),
                    1 => ch.add_htlc(
                        1_000_000 + u64::from(pick),
                        r(pick % 5).hash(),
                        Locktime::Blocks(h + 200),
                        now,
                    ),
                    2 => ch.fulfill_htlc(r(pick % 5), now),
                    3 => ch.routefail_htlc(r(pick % 5).hash()),
                    4 => ch.timeout_htlc(r(pick % 5).hash(), now),
                    _ => ch.close(),
                })
                .ok();
            }
            Op::Deliver { from_a } => {
                let Some(pkt) = self.p.node(from_a).outbox.pop_front() else {
                    return;
                };
                self.log.push(pkt.clone());
                deliver(self.p.node(!from_a), &pkt, now);
            }
            Op::Replay { to_a, pick } => {
                if self.log.is_empty() {
                    return;
                }
                let pkt = self.log[pick as usize % self.log.len()].clone();
                deliver(self.p.node(to_a), &pkt, now);
            }
            Op::Forge { to_a, kind, x, y } => {
                let pkt = forge(kind, x, y, self.p.chain.height);
                deliver(self.p.node(to_a), &pkt, now);
            }
            Op::Blocks(n) => self.p.advance(u32::from(n)),
            Op::ForceClose { a } => {
                if self.p.node(a).try_act(|ch| ch.force_close()).is_ok() {
                    let txs = std::mem::take(&mut self.p.node(a).broadcast);
                    for tx in txs {
                        if self.p.chain.mine(&tx).is_ok() {
                            for side in [true, false] {
                                self.p.node(side).spend_seen(&tx);
                            }
                        }
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn any_packet_in_any_state_never_panics_and_a_rejection_changes_nothing(
        open_first in any::<bool>(),
        a_funds in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let mut w = World { p: Pair::new(a_funds, ChannelConfig::default()), log: Vec::new() };
        if open_first {
            w.p.open();
            w.p.pay(if a_funds { A } else { B }, 3_000_000_000);
        } else {
            // Opening packets are in flight too: states before Normal get their share.
            w.p.start();
        }
        for op in &ops {
            w.apply(op);
        }
        // Whatever happened, both channels still serialise and deserialise, as JSON (the
        // node's snapshots up to version 3) and in the node's binary layout (version 4).
        for ch in [&w.p.a.ch, &w.p.b.ch] {
            let back: Channel = serde_json::from_str(&serde_json::to_string(ch).unwrap()).unwrap();
            prop_assert_eq!(&back, ch);
            let back: Channel = postcard::from_bytes(&postcard::to_allocvec(ch).unwrap()).unwrap();
            prop_assert_eq!(&back, ch);
        }
    }
}
