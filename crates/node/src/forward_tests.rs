//! Issue 30 in process (`harness::create_network`): invoices paid by incoming HTLCs, with
//! and without an onion, each paid once; onions that do not open, or that name a next hop
//! this node cannot reach, are declined without moving money; a hop forwards, earns its
//! fee, and routefails upstream what fails downstream.

use bitcoin::hashes::Hash as _;
use secp256k1::{PublicKey, Secp256k1, SecretKey};
use wire::{Locktime, Onion, Sha256};

use crate::control_error::ControlError;
use crate::harness::{create_network, eventually, Network};
use crate::manager::Command;
use crate::store::InvoiceRow;

pub(crate) fn regtest(config: &mut crate::NodeConfig) {
    config.channel.min_depth = 1;
}

/// Node `i`'s own balance (outside HTLCs, fee share included) and its HTLC count, in its
/// channel with `peer`.
pub(crate) async fn side(net: &Network, i: usize, peer: usize) -> (u64, usize) {
    side_with(net, i, &net.id(peer)).await
}

/// [`side`] with a peer known by its id (one played by hand).
async fn side_with(net: &Network, i: usize, peer: &PublicKey) -> (u64, usize) {
    let slot = net.nodes[i]
        .manager
        .channels
        .latest(peer)
        .expect("a channel");
    let inner = slot.lock().await;
    let cs = inner.channel.balances().expect("balances");
    (
        cs.ours.pay_msat + cs.ours.fee_msat,
        cs.ours.htlcs.len() + cs.theirs.htlcs.len(),
    )
}

/// Both ends of A–B and B–C with no HTLC in flight (see [`settled`]).
pub(crate) async fn settled_along(net: &Network) {
    for (i, peer) in [(0, 1), (1, 0), (1, 2), (2, 1)] {
        settled(net, i, peer).await;
    }
}

/// The state of B's first forward, as `listforwards` shows it.
pub(crate) async fn first_forward_state(net: &Network) -> serde_json::Value {
    net.rpc(1, "listforwards", serde_json::json!([]))
        .await
        .expect("listforwards")["forwards"][0]["state"]
        .clone()
}

/// Waits (at most 10 s, woken by every input of the channel) until node `i`'s channel with
/// `peer` holds no HTLC and is idle.
pub(crate) async fn settled(net: &Network, i: usize, peer: usize) {
    let slot = net.nodes[i]
        .manager
        .channels
        .latest(&net.id(peer))
        .expect("a channel");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let changed = slot.changed.notified();
        {
            let inner = slot.lock().await;
            let empty = inner
                .channel
                .balances()
                .is_some_and(|cs| cs.ours.htlcs.is_empty() && cs.theirs.htlcs.is_empty());
            if empty && inner.channel.state() == channel::State::Normal {
                return;
            }
        }
        if tokio::time::timeout_at(deadline, changed).await.is_err() {
            panic!("node {i}'s channel with node {peer} still holds an HTLC");
        }
    }
}

/// Node 0 offers node 1 an HTLC of `msat` for `r_hash`, expiring 100 blocks ahead, with
/// `onion` if any; returns the expiry.
async fn offer(net: &Network, msat: u64, r_hash: Sha256, onion: Option<Onion>) -> u32 {
    let expiry = net.chain.height() + 100;
    let command = match onion {
        None => Command::AddHtlc {
            amount_msat: msat,
            r_hash,
            expiry,
        },
        Some(onion) => Command::AddRoutedHtlc {
            amount_msat: msat,
            r_hash,
            expiry,
            onion,
        },
    };
    net.nodes[0]
        .manager
        .command(&net.id(1), command)
        .await
        .expect("newhtlc");
    expiry
}

/// A one-hop onion to node `to` (the final hop) for `amount_msat` until `expiry`.
fn final_onion(to: PublicKey, amount_msat: u32, expiry: u32, r_hash: &Sha256) -> Onion {
    let payload = onion::HopPayload {
        amount_msat,
        expiry: Locktime::Blocks(expiry),
        next_node: None,
    };
    let payload = payload.encode();
    onion::build(
        &Secp256k1::new(),
        &SecretKey::from_slice(&[0x33; 32]).expect("key"),
        &[onion::Hop {
            node_id: to,
            payload: &payload,
        }],
        r_hash.as_byte_array(),
    )
    .expect("onion")
    .packet
}

pub(crate) async fn invoice(net: &Network, i: usize, msat: u32, label: &str) -> InvoiceRow {
    net.nodes[i]
        .manager
        .create_invoice(msat, Some(label.into()))
        .await
        .expect("invoice")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invoice_is_paid_once_by_an_htlc_without_onion_and_a_second_htlc_is_failed() {
    let net = create_network(2, regtest).await;
    net.open_channel(0, 1, 500_000).await;
    let inv = invoice(&net, 1, 5_000_000, "coffee").await;
    let r_hash = inv.r.hash();
    let (a0, _) = side(&net, 0, 1).await;
    let (b0, _) = side(&net, 1, 0).await;
    offer(&net, 5_000_000, r_hash, None).await;
    let paid = net.nodes[1]
        .manager
        .wait_invoice("coffee")
        .await
        .expect("paid");
    assert_eq!(paid.paid.map(|p| p.amount_msat), Some(5_000_000));
    settled(&net, 0, 1).await;
    settled(&net, 1, 0).await;
    assert_eq!(side(&net, 0, 1).await, (a0 - 5_000_000, 0));
    assert_eq!(side(&net, 1, 0).await, (b0 + 5_000_000, 0));
    let listed = net.nodes[1].manager.list_invoices().await.expect("list");
    let p = listed[0].paid.expect("paid");
    assert!(p.settled, "the fulfil completed");
    // A second HTLC for the same hash is failed back: the payer keeps its money.
    offer(&net, 5_000_000, r_hash, None).await;
    settled(&net, 0, 1).await;
    settled(&net, 1, 0).await;
    assert_eq!(side(&net, 0, 1).await, (a0 - 5_000_000, 0));
    assert_eq!(side(&net, 1, 0).await, (b0 + 5_000_000, 0));
    let again = net.nodes[1].manager.list_invoices().await.expect("list");
    assert_eq!(again[0].paid, Some(p), "paid once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_htlc_below_the_invoice_is_failed_and_an_unknown_hash_without_onion_is_left_to_the_owner(
) {
    let net = create_network(2, regtest).await;
    net.open_channel(0, 1, 500_000).await;
    let inv = invoice(&net, 1, 5_000_000, "tea").await;
    let (a0, _) = side(&net, 0, 1).await;
    offer(&net, 4_999_000, inv.r.hash(), None).await;
    settled(&net, 0, 1).await;
    assert_eq!(side(&net, 0, 1).await, (a0, 0), "failed back");
    let listed = net.nodes[1].manager.list_invoices().await.expect("list");
    assert_eq!(listed[0].paid, None);
    // No invoice, no onion: as before invoices, the HTLC waits for fulfillhtlc/failhtlc.
    let unknown = Sha256::hash(&[4; 32]);
    offer(&net, 5_000_000, unknown, None).await;
    for _ in 0..3 {
        net.step().await;
    }
    assert_eq!(side(&net, 1, 0).await.1, 1, "left pending for the owner");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invoice_is_paid_by_an_htlc_whose_onion_ends_here() {
    let net = create_network(2, regtest).await;
    net.open_channel(0, 1, 500_000).await;
    let inv = invoice(&net, 1, 3_000_000, "book").await;
    let r_hash = inv.r.hash();
    let (a0, _) = side(&net, 0, 1).await;
    let expiry = net.chain.height() + 100;
    let onion = final_onion(net.id(1), 3_000_000, expiry, &r_hash);
    offer(&net, 3_000_000, r_hash, Some(onion)).await;
    net.nodes[1]
        .manager
        .wait_invoice("book")
        .await
        .expect("paid");
    settled(&net, 0, 1).await;
    assert_eq!(side(&net, 0, 1).await, (a0 - 3_000_000, 0));
}

/// The HTLC carries less than its onion says the payer meant: an upstream hop kept more
/// than its fee. Failed back, the invoice unpaid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_htlc_carrying_less_than_its_onion_states_is_failed() {
    let net = create_network(2, regtest).await;
    net.open_channel(0, 1, 500_000).await;
    let inv = invoice(&net, 1, 3_000_000, "lamp").await;
    let r_hash = inv.r.hash();
    let (a0, _) = side(&net, 0, 1).await;
    let expiry = net.chain.height() + 100;
    let onion = final_onion(net.id(1), 3_500_000, expiry, &r_hash);
    offer(&net, 3_000_000, r_hash, Some(onion)).await;
    settled(&net, 0, 1).await;
    assert_eq!(side(&net, 0, 1).await, (a0, 0));
    let listed = net.nodes[1].manager.list_invoices().await.expect("list");
    assert_eq!(listed[0].paid, None);
}

/// An onion with one flipped bit (its HMAC no longer matches), or one built for another
/// node, is failed back: no money moves and the invoice stays unpaid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_onion_that_does_not_open_is_failed_back_without_moving_money() {
    let net = create_network(2, regtest).await;
    net.open_channel(0, 1, 500_000).await;
    let inv = invoice(&net, 1, 3_000_000, "pen").await;
    let r_hash = inv.r.hash();
    let (a0, _) = side(&net, 0, 1).await;
    let (b0, _) = side(&net, 1, 0).await;
    let expiry = net.chain.height() + 100;
    let good = final_onion(net.id(1), 3_000_000, expiry, &r_hash);
    let mut bytes = *good.as_bytes();
    bytes[100] ^= 1;
    let flipped = Onion::new(Box::new(bytes));
    let stranger = PublicKey::from_secret_key(
        &Secp256k1::new(),
        &SecretKey::from_slice(&[0x77; 32]).expect("key"),
    );
    let not_ours = final_onion(stranger, 3_000_000, expiry, &r_hash);
    for onion in [flipped, not_ours] {
        offer(&net, 3_000_000, r_hash, Some(onion)).await;
        settled(&net, 0, 1).await;
        settled(&net, 1, 0).await;
        assert_eq!(side(&net, 0, 1).await, (a0, 0));
        assert_eq!(side(&net, 1, 0).await, (b0, 0));
    }
    let listed = net.nodes[1].manager.list_invoices().await.expect("list");
    assert_eq!(listed[0].paid, None);
}

/// An onion whose HMACs hold but whose payload for us is cut short (its last record 3
/// bytes short): as the payee (B's invoice) and as a hop (B would forward to C), the HTLC
/// is failed back, nothing moves on any channel, no invoice is paid and no forward is
/// stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_onion_with_a_truncated_payload_is_failed_back_without_moving_money() {
    let net = line(regtest, false).await;
    let inv = invoice(&net, 1, 3_000_000, "cup").await;
    let far = invoice(&net, 2, 3_000_000, "saucer").await;
    let ends = [(0, 1), (1, 0), (1, 2), (2, 1)];
    let mut before = Vec::new();
    for (i, peer) in ends {
        before.push(side(&net, i, peer).await);
    }
    let expiry = net.chain.height() + 100;
    let payload = |amount_msat: u32, expiry: u32, next_node: Option<PublicKey>| {
        onion::HopPayload {
            amount_msat,
            expiry: Locktime::Blocks(expiry),
            next_node,
        }
        .encode()
    };
    let cut = |mut p: Vec<u8>| {
        p.truncate(p.len() - 3);
        p
    };
    let session = SecretKey::from_slice(&[0x34; 32]).expect("key");
    // B is the payee.
    let ends_here = cut(payload(3_000_000, expiry, None));
    let to_b = onion::build(
        &Secp256k1::new(),
        &session,
        &[onion::Hop {
            node_id: net.id(1),
            payload: &ends_here,
        }],
        inv.r.hash().as_byte_array(),
    )
    .expect("onion")
    .packet;
    // B is a hop toward C.
    let hop = cut(payload(3_000_000, expiry - 40, Some(net.id(2))));
    let last = payload(3_000_000, expiry - 40, None);
    let through_b = onion::build(
        &Secp256k1::new(),
        &session,
        &[
            onion::Hop {
                node_id: net.id(1),
                payload: &hop,
            },
            onion::Hop {
                node_id: net.id(2),
                payload: &last,
            },
        ],
        far.r.hash().as_byte_array(),
    )
    .expect("onion")
    .packet;
    for (onion, r_hash) in [(to_b, inv.r.hash()), (through_b, far.r.hash())] {
        offer(&net, 3_010_000, r_hash, Some(onion)).await;
        settled_along(&net).await;
        for (k, (i, peer)) in ends.into_iter().enumerate() {
            assert_eq!(side(&net, i, peer).await, before[k], "node {i} with {peer}");
        }
    }
    for i in [1, 2] {
        let listed = net.nodes[i].manager.list_invoices().await.expect("list");
        assert_eq!(listed[0].paid, None, "node {i}");
    }
    let forwards = net.nodes[1]
        .manager
        .list_forwards()
        .await
        .expect("forwards");
    assert!(forwards.is_empty(), "{forwards:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoice_labels_are_unique_and_waitinvoice_knows_only_its_own() {
    let net = create_network(1, regtest).await;
    let a = invoice(&net, 0, 1_000, "x").await;
    assert_eq!(a.amount_msat, 1_000);
    let dup = net.nodes[0]
        .manager
        .create_invoice(2_000, Some("x".into()))
        .await
        .err();
    assert!(
        matches!(dup, Some(ControlError::InvoiceExists(ref l)) if l == "x"),
        "{dup:?}"
    );
    let none = net.nodes[0].manager.wait_invoice("y").await.err();
    assert!(matches!(none, Some(ControlError::NoInvoice(_))), "{none:?}");
    // Without a label the hash names it.
    let b = net.nodes[0]
        .manager
        .create_invoice(2_000, None)
        .await
        .expect("invoice");
    assert_eq!(b.label, hex::encode(b.r.hash().as_byte_array()));
    assert_ne!(a.r, b.r);
    let listed = net.nodes[0].manager.list_invoices().await.expect("list");
    assert_eq!(listed.len(), 2);
}

/// `pay --route B R_HASH AMOUNT`: a route of one node builds an onion that ends at B,
/// and B's invoice takes the HTLC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paying_along_a_route_of_one_node_pays_its_invoice() {
    let net = create_network(2, regtest).await;
    net.open_channel(0, 1, 500_000).await;
    let inv = invoice(&net, 1, 2_000_000, "route").await;
    let (a0, _) = side(&net, 0, 1).await;
    let (b0, _) = side(&net, 1, 0).await;
    net.nodes[0]
        .manager
        .pay_route(&[net.id(1)], inv.r.hash(), 2_000_000)
        .await
        .expect("pay --route");
    let paid = net.nodes[1]
        .manager
        .wait_invoice("route")
        .await
        .expect("paid");
    assert_eq!(paid.paid.map(|p| p.amount_msat), Some(2_000_000));
    settled(&net, 0, 1).await;
    settled(&net, 1, 0).await;
    assert_eq!(side(&net, 0, 1).await, (a0 - 2_000_000, 0));
    assert_eq!(side(&net, 1, 0).await, (b0 + 2_000_000, 0));
}

/// B (node 1) asks 5,000 msat + 10 millionths; A and C the defaults.
fn b_charges_more(config: &mut crate::NodeConfig) {
    regtest(config);
    if config.data_dir.ends_with("node1") {
        config.fee_base_msat = 5_000;
    }
}

/// A (0) - B (1) - C (2); `c_funds`: the B-C channel is C's (B has no room toward C).
async fn line(tweak: fn(&mut crate::NodeConfig), c_funds: bool) -> Network {
    let net = create_network(3, tweak).await;
    net.open_channel(0, 1, 500_000).await;
    if c_funds {
        net.open_channel(2, 1, 500_000).await;
    } else {
        net.open_channel(1, 2, 500_000).await;
    }
    net
}

/// A pays along `route` and must hear a decline of `reason` (its debug text); nothing
/// moved on A's channel.
async fn declined(net: &Network, route: &[PublicKey], reason: &str) {
    let (a0, _) = side(net, 0, 1).await;
    let r_hash = Sha256::hash(&[6; 32]);
    let answer = net.nodes[0]
        .manager
        .pay_route(route, r_hash, 2_000_000)
        .await
        .err();
    match answer {
        Some(ControlError::Declined(text)) => assert!(text.contains(reason), "{text}"),
        other => panic!("expected a decline, got {other:?}"),
    }
    settled(net, 0, 1).await;
    assert_eq!(side(net, 0, 1).await, (a0, 0));
}

/// B asks more than A assumes (5,000 msat + 10 millionths against 1,000 + 10): B declines
/// A's first HTLC before accepting it, with `insufficient_funds` carrying its schedule (5
/// sat; 10 millionths). A learns it and retries once with B's fee for 2,000,000 msat,
/// 5,020: C is paid, B keeps exactly that fee, A pays it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hops_higher_fee_is_learnt_from_its_decline_and_the_one_retry_pays() {
    const B_FEE: u64 = 5_020;
    let net = line(b_charges_more, false).await;
    let inv = invoice(&net, 2, 2_000_000, "dearer").await;
    let ends = [(0, 1), (1, 0), (1, 2), (2, 1)];
    let mut before = Vec::new();
    for (i, peer) in ends {
        before.push(side(&net, i, peer).await.0);
    }
    net.nodes[0]
        .manager
        .pay_route(&[net.id(1), net.id(2)], inv.r.hash(), 2_000_000)
        .await
        .expect("accepted by B at the retry");
    let paid = net.nodes[2]
        .manager
        .wait_invoice("dearer")
        .await
        .expect("paid");
    assert_eq!(paid.paid.map(|p| p.amount_msat), Some(2_000_000));
    settled_along(&net).await;
    let want = [
        before[0] - 2_000_000 - B_FEE,
        before[1] + 2_000_000 + B_FEE,
        before[2] - 2_000_000,
        before[3] + 2_000_000,
    ];
    for (k, (i, peer)) in ends.into_iter().enumerate() {
        assert_eq!(
            side(&net, i, peer).await,
            (want[k], 0),
            "node {i} with {peer}"
        );
    }
    let listed = net
        .rpc(1, "listforwards", serde_json::json!([]))
        .await
        .expect("listforwards");
    let forwards = listed["forwards"].as_array().expect("forwards");
    assert_eq!(
        forwards.len(),
        1,
        "the declined attempt left no forward: {listed}"
    );
    assert_eq!(forwards[0]["fee_msat"], B_FEE, "{listed}");
    assert_eq!(forwards[0]["state"], "fulfilled", "{listed}");
    assert_eq!(listed["fees_earned_msat"], B_FEE, "{listed}");
}

/// A first hop (played by hand) that declines with `insufficient_funds` again after the
/// retry: the second decline is the payment's answer. B saw exactly two offers, the
/// second carrying the fee of the schedule it named (7 sat + 100 millionths of 2,000,000:
/// 7,200 msat); A's channel is as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hop_that_declines_the_retry_too_fails_the_payment_without_moving_money() {
    let net = create_network(1, regtest).await;
    let mut b = net.scripted_peer(0, 0x53).await;
    b.open_live(&net, 1_000_000).await;
    // A owns nothing in the channel B funded: B pays A so that A can pay along it.
    b.pay(10_000_000).await.expect("B pays A");
    let before = side_with(&net, 0, &b.node_id).await;
    assert_eq!(before.1, 0);
    let stranger = PublicKey::from_secret_key(
        &Secp256k1::new(),
        &SecretKey::from_slice(&[0x66; 32]).expect("key"),
    );
    let route = [b.node_id, stranger];
    let node = std::sync::Arc::clone(&net.nodes[0]);
    let paying = tokio::spawn(async move {
        node.manager
            .pay_route(&route, Sha256::hash(&[3; 32]), 2_000_000)
            .await
            .map(|_| ())
    });
    let decline = wire::Packet::UpdateDeclineHtlc(wire::UpdateDeclineHtlc {
        reason: Some(wire::DeclineReason::InsufficientFunds(wire::Funding {
            fixed: Some(7),
            per_micro_unit: Some(100),
        })),
    });
    let mut offered = Vec::new();
    for _ in 0..2 {
        let wire::Packet::UpdateAddHtlc(add) = b.expect(&net, "update_add_htlc").await else {
            unreachable!("expect returns the packet named");
        };
        offered.push(add.amount_msat);
        b.send(&decline).await;
    }
    assert_eq!(offered, vec![2_000_000 + 1_020, 2_000_000 + 7_200]);
    let answer = paying.await.expect("pay task");
    match answer {
        Err(e) => assert!(e.to_string().contains("7000 msat + 100 millionths"), "{e}"),
        Ok(()) => panic!("paid through a hop that declined"),
    }
    assert_eq!(
        side_with(&net, 0, &b.node_id).await,
        before,
        "nothing moved"
    );
    // No third offer.
    let third = b.recv(std::time::Duration::from_millis(200)).await;
    assert!(matches!(third, Ok(None)), "{third:?}");
}

/// A next node the hop has no channel with, and a channel without room toward it:
/// `cannot_route`, before the hop accepts anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_channel_or_no_room_toward_the_next_node_is_declined_as_cannot_route() {
    let net = line(regtest, true).await;
    let stranger = PublicKey::from_secret_key(
        &Secp256k1::new(),
        &SecretKey::from_slice(&[0x66; 32]).expect("key"),
    );
    declined(&net, &[net.id(1), stranger], "CannotRoute(true)").await;
    // C funded the B-C channel: B owns nothing in it to offer C.
    declined(&net, &[net.id(1), net.id(2)], "CannotRoute(true)").await;
}

/// B (node 1) accepts no incoming HTLC to forward that expires more than 40 blocks above
/// the tip: its own expiry delta, so no forward fits.
fn b_bounds_expiry(config: &mut crate::NodeConfig) {
    regtest(config);
    if config.data_dir.ends_with("node1") {
        config.max_expiry_blocks = 40;
    }
}

/// A griefing bound (`--max-expiry-blocks`) refuses the forward before B accepts it:
/// `cannot_route`, nothing moves on either of B's channels and B records no forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiry_beyond_the_hops_bound_is_declined_without_moving_money() {
    let net = line(b_bounds_expiry, false).await;
    let (b_c0, _) = side(&net, 1, 2).await;
    declined(&net, &[net.id(1), net.id(2)], "CannotRoute(true)").await;
    settled(&net, 1, 2).await;
    assert_eq!(side(&net, 1, 2).await, (b_c0, 0));
    let forwards = net.nodes[1]
        .manager
        .list_forwards()
        .await
        .expect("listforwards");
    assert!(forwards.is_empty(), "{forwards:?}");
}

/// B's fee for forwarding 2,000,000 msat by the default schedule (A assumes it):
/// 1,000 + floor(2,000,000 × 10 / 1,000,000).
pub(crate) const FEE: u64 = 1_020;

/// A pays C's invoice `label` of 2,000,000 msat through B; returns once C has it paid and
/// every channel along the way is settled.
async fn pay_c_through_b(net: &Network, inv: &InvoiceRow, label: &str) {
    net.nodes[0]
        .manager
        .pay_route(&[net.id(1), net.id(2)], inv.r.hash(), 2_000_000)
        .await
        .expect("accepted by B");
    let paid = net.nodes[2]
        .manager
        .wait_invoice(label)
        .await
        .expect("paid");
    assert_eq!(paid.paid.map(|p| p.amount_msat), Some(2_000_000));
    settled_along(net).await;
}

/// A pays C's invoice through B: C gets the amount, B keeps its fee, on all four channel
/// ends; B's `listforwards` shows the forward fulfilled with that fee.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_through_one_hop_moves_exact_balances_and_pays_the_hop_its_fee() {
    let net = line(regtest, false).await;
    let inv = invoice(&net, 2, 2_000_000, "far").await;
    let (a0, _) = side(&net, 0, 1).await;
    let (ba0, _) = side(&net, 1, 0).await;
    let (bc0, _) = side(&net, 1, 2).await;
    let (c0, _) = side(&net, 2, 1).await;
    pay_c_through_b(&net, &inv, "far").await;
    assert_eq!(side(&net, 0, 1).await, (a0 - 2_000_000 - FEE, 0));
    assert_eq!(side(&net, 1, 0).await, (ba0 + 2_000_000 + FEE, 0));
    assert_eq!(side(&net, 1, 2).await, (bc0 - 2_000_000, 0));
    assert_eq!(side(&net, 2, 1).await, (c0 + 2_000_000, 0));
    let listed = net
        .rpc(1, "listforwards", serde_json::json!([]))
        .await
        .expect("listforwards");
    let f = &listed["forwards"][0];
    assert_eq!(f["in_peer_id"], net.id(0).to_string().as_str(), "{listed}");
    assert_eq!(f["out_peer_id"], net.id(2).to_string().as_str(), "{listed}");
    assert_eq!(f["in_msat"], 2_000_000 + FEE, "{listed}");
    assert_eq!(f["out_msat"], 2_000_000, "{listed}");
    assert_eq!(f["fee_msat"], FEE, "{listed}");
    assert_eq!(f["state"], "fulfilled", "{listed}");
}

/// With channel delays far above the default expiry delta (production uses 144 blocks),
/// the payer plans each hop's gap as a hop configured like it demands (its on-chain blocks
/// plus both channels' delays), so B forwards instead of declining `cannot_route`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_through_channels_with_long_delays_plans_the_gap_the_hop_needs() {
    let net = line(
        |config| {
            regtest(config);
            config.channel.delay = wire::Locktime::Blocks(30);
        },
        false,
    )
    .await;
    let inv = invoice(&net, 2, 2_000_000, "slow").await;
    let (a0, _) = side(&net, 0, 1).await;
    pay_c_through_b(&net, &inv, "slow").await;
    assert_eq!(side(&net, 0, 1).await, (a0 - 2_000_000 - FEE, 0));
}

/// C has no invoice for the hash: it fails B's HTLC, and B routefails A's. Nothing moves
/// on either channel; B's forward shows failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_failure_is_routefailed_upstream_without_moving_money() {
    let net = line(regtest, false).await;
    let (a0, _) = side(&net, 0, 1).await;
    let (ba0, _) = side(&net, 1, 0).await;
    let (bc0, _) = side(&net, 1, 2).await;
    let (c0, _) = side(&net, 2, 1).await;
    let unknown = Sha256::hash(&[9; 32]);
    net.nodes[0]
        .manager
        .pay_route(&[net.id(1), net.id(2)], unknown, 2_000_000)
        .await
        .expect("accepted by B");
    eventually!(
        net,
        "B's forward failed",
        first_forward_state(&net).await == "failed"
    );
    settled_along(&net).await;
    assert_eq!(side(&net, 0, 1).await, (a0, 0));
    assert_eq!(side(&net, 1, 0).await, (ba0, 0));
    assert_eq!(side(&net, 1, 2).await, (bc0, 0));
    assert_eq!(side(&net, 2, 1).await, (c0, 0));
}

/// B's forwards survive its restart (`listforwards` the same), and B forwards again
/// after it: the second forward is listed beside the first, the fees add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_survive_the_hops_restart_and_it_forwards_again() {
    let mut net = line(regtest, false).await;
    let first = invoice(&net, 2, 2_000_000, "one").await;
    let (a0, _) = side(&net, 0, 1).await;
    net.nodes[0]
        .manager
        .pay_route(&[net.id(1), net.id(2)], first.r.hash(), 2_000_000)
        .await
        .expect("accepted by B");
    net.nodes[2]
        .manager
        .wait_invoice("one")
        .await
        .expect("paid");
    settled_along(&net).await;
    let before = net
        .rpc(1, "listforwards", serde_json::json!([]))
        .await
        .expect("listforwards");
    net.restart(1).await;
    let after = net
        .rpc(1, "listforwards", serde_json::json!([]))
        .await
        .expect("listforwards");
    assert_eq!(after, before);
    net.connect(0, 1).await;
    net.connect(1, 2).await;
    let second = invoice(&net, 2, 2_000_000, "two").await;
    eventually!(net, "channels live again", {
        net.state(0, 1).await == channel::State::Normal
            && net.state(1, 2).await == channel::State::Normal
    });
    net.nodes[0]
        .manager
        .pay_route(&[net.id(1), net.id(2)], second.r.hash(), 2_000_000)
        .await
        .expect("accepted by B");
    net.nodes[2]
        .manager
        .wait_invoice("two")
        .await
        .expect("paid");
    settled_along(&net).await;
    assert_eq!(side(&net, 0, 1).await, (a0 - 2 * (2_000_000 + FEE), 0));
    let listed = net
        .rpc(1, "listforwards", serde_json::json!([]))
        .await
        .expect("listforwards");
    let states: Vec<_> = listed["forwards"]
        .as_array()
        .expect("forwards")
        .iter()
        .map(|f| (f["state"].clone(), f["fee_msat"].clone()))
        .collect();
    assert_eq!(
        states,
        vec![
            (serde_json::json!("fulfilled"), serde_json::json!(FEE)),
            (serde_json::json!("fulfilled"), serde_json::json!(FEE))
        ]
    );
}

/// B is restarted between offering the downstream HTLC and C's fulfil (C is played by
/// hand, so that it holds the HTLC across the restart): R arriving after the restart
/// still fulfils A's HTLC, and B keeps exactly its fee.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fulfil_after_the_hops_restart_still_settles_upstream() {
    let mut net = create_network(2, regtest).await;
    net.open_channel(0, 1, 500_000).await;
    let mut c = net.scripted_peer(1, 0x51).await;
    c.open_live(&net, 1_000_000).await;
    // B owns nothing in the channel C funded: C pays B so that B can forward.
    c.pay(10_000_000).await.expect("C pays B");
    let r = wire::Preimage([8; 32]);
    let (a0, _) = side(&net, 0, 1).await;
    let (ba0, _) = side(&net, 1, 0).await;
    net.nodes[0]
        .manager
        .pay_route(&[net.id(1), c.node_id], r.hash(), 2_000_000)
        .await
        .expect("accepted by B");
    let add = c.expect(&net, "update_add_htlc").await;
    c.handle(&add).await;
    c.until_normal().await.expect("C holds the HTLC");
    // C's last packet of the update reached B: B's channel is idle with the HTLC.
    eventually!(net, "B's channel with C idle, holding the HTLC", {
        let ch = net.channel_json(1, &c.node_id).await;
        ch["state"] == "normal" && ch["htlcs"].as_array().is_some_and(|h| h.len() == 1)
    });
    net.restart(1).await;
    c.reconnect(&net).await;
    net.connect(0, 1).await;
    let actions = c.channel.fulfill_htlc(r, 0).expect("C fulfils");
    c.run(actions).await;
    c.until_normal().await.expect("B takes R");
    for (i, peer) in [(0, 1), (1, 0)] {
        settled(&net, i, peer).await;
    }
    assert_eq!(side(&net, 0, 1).await, (a0 - 2_000_000 - FEE, 0));
    assert_eq!(side(&net, 1, 0).await, (ba0 + 2_000_000 + FEE, 0));
    let listed = net
        .rpc(1, "listforwards", serde_json::json!([]))
        .await
        .expect("listforwards");
    assert_eq!(listed["forwards"][0]["state"], "fulfilled", "{listed}");
}

/// C cannot route what B forwards (its onion names a node C has no channel with): C
/// declines B's offer with `cannot_route`, and B routefails A's HTLC. Nothing moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decline_downstream_is_routefailed_upstream() {
    let net = line(regtest, false).await;
    let stranger = PublicKey::from_secret_key(
        &Secp256k1::new(),
        &SecretKey::from_slice(&[0x66; 32]).expect("key"),
    );
    let (a0, _) = side(&net, 0, 1).await;
    let (bc0, _) = side(&net, 1, 2).await;
    net.nodes[0]
        .manager
        .pay_route(
            &[net.id(1), net.id(2), stranger],
            Sha256::hash(&[5; 32]),
            2_000_000,
        )
        .await
        .expect("accepted by B");
    eventually!(
        net,
        "B's forward failed",
        first_forward_state(&net).await == "failed"
    );
    settled_along(&net).await;
    assert_eq!(side(&net, 0, 1).await, (a0, 0));
    assert_eq!(side(&net, 1, 2).await, (bc0, 0));
}

/// A pays D through B and C: each hop keeps its fee on what it forwards, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_through_two_hops_pays_each_hop_its_fee() {
    let net = create_network(4, regtest).await;
    net.open_channel(0, 1, 500_000).await;
    net.open_channel(1, 2, 500_000).await;
    net.open_channel(2, 3, 500_000).await;
    let inv = invoice(&net, 3, 2_000_000, "far far").await;
    let ends = [(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2)];
    let mut before = Vec::new();
    for (i, peer) in ends {
        before.push(side(&net, i, peer).await.0);
    }
    net.nodes[0]
        .manager
        .pay_route(&[net.id(1), net.id(2), net.id(3)], inv.r.hash(), 2_000_000)
        .await
        .expect("accepted by B");
    net.nodes[3]
        .manager
        .wait_invoice("far far")
        .await
        .expect("paid");
    for (i, peer) in ends {
        settled(&net, i, peer).await;
    }
    // C forwards 2,000,000 for 1,020; B forwards 2,001,020 for 1,000 + floor(20.0102).
    let (to_c, to_b) = (2_000_000 + FEE, 2_000_000 + 2 * FEE);
    let want = [
        before[0] - to_b,
        before[1] + to_b,
        before[2] - to_c,
        before[3] + to_c,
        before[4] - 2_000_000,
        before[5] + 2_000_000,
    ];
    for (k, (i, peer)) in ends.into_iter().enumerate() {
        assert_eq!(
            side(&net, i, peer).await,
            (want[k], 0),
            "node {i} with {peer}"
        );
    }
    for (hop, fee) in [(1, FEE), (2, FEE)] {
        let listed = net
            .rpc(hop, "listforwards", serde_json::json!([]))
            .await
            .expect("listforwards");
        assert_eq!(listed["forwards"][0]["fee_msat"], fee, "{listed}");
        assert_eq!(listed["forwards"][0]["state"], "fulfilled", "{listed}");
    }
}

/// C (played by hand) holds B's HTLC until it expires: B times it out downstream and
/// routefails A's HTLC, whose expiry is B's delta later. Nothing moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_out_downstream_is_routefailed_upstream() {
    let net = create_network(2, regtest).await;
    net.open_channel(0, 1, 500_000).await;
    let mut c = net.scripted_peer(1, 0x52).await;
    c.open_live(&net, 1_000_000).await;
    c.pay(10_000_000).await.expect("C pays B");
    let (a0, _) = side(&net, 0, 1).await;
    let (ba0, _) = side(&net, 1, 0).await;
    let r = wire::Preimage([9; 32]);
    net.nodes[0]
        .manager
        .pay_route(&[net.id(1), c.node_id], r.hash(), 2_000_000)
        .await
        .expect("accepted by B");
    let add = c.expect(&net, "update_add_htlc").await;
    c.handle(&add).await;
    c.until_normal().await.expect("C holds the HTLC");
    let listed = net
        .rpc(1, "listforwards", serde_json::json!([]))
        .await
        .expect("listforwards");
    let out_expiry = listed["forwards"][0]["out_expiry"]
        .as_u64()
        .and_then(|e| u32::try_from(e).ok())
        .expect("out_expiry");
    net.mine(out_expiry - net.chain.height()).await;
    c.channel.block_height(out_expiry);
    let timedout = c.expect(&net, "update_timedout_htlc").await;
    c.handle(&timedout).await;
    c.until_normal().await.expect("C lets it go");
    for (i, peer) in [(0, 1), (1, 0)] {
        settled(&net, i, peer).await;
    }
    assert_eq!(side(&net, 0, 1).await, (a0, 0));
    assert_eq!(side(&net, 1, 0).await, (ba0, 0));
    let listed = net
        .rpc(1, "listforwards", serde_json::json!([]))
        .await
        .expect("listforwards");
    assert_eq!(listed["forwards"][0]["state"], "failed", "{listed}");
}
