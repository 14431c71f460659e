//! Issue 30 in process: the forwarding node dies (kill -9 as a test crash point makes it:
//! no further write or packet, its sessions dropped without a goodbye) right after each
//! durable write of a forward, and starts again from its disk. Every HTLC ends as it
//! must: the payment completes with the hop's exact fee, or goes back whole; never half,
//! never twice.

use bitcoin::hashes::Hash as _;
use secp256k1::{PublicKey, Secp256k1, SecretKey};
use wire::Sha256;

use crate::forward_tests::{invoice, regtest, settled_along, side, FEE};
use crate::harness::{create_network, eventually, Network};
use crate::manager::CrashStep;

/// What C does with the HTLC B forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Payee {
    /// Its invoice takes it: C fulfils.
    Pays,
    /// It has no invoice for the hash: C fails it (routefail).
    Fails,
    /// The onion names a next node C has no channel with: C declines it (`cannot_route`).
    Declines,
}

/// Whether both ends of A–B and B–C are idle with no HTLC.
async fn idle_along(net: &Network) -> bool {
    for (i, peer) in [(0, 1), (1, 0), (1, 2), (2, 1)] {
        let Some(slot) = net.nodes[i].manager.channels.latest(&net.id(peer)) else {
            return false;
        };
        let inner = slot.lock().await;
        let empty = inner
            .channel
            .balances()
            .is_some_and(|cs| cs.ours.htlcs.is_empty() && cs.theirs.htlcs.is_empty());
        if !empty || inner.channel.state() != channel::State::Normal {
            return false;
        }
    }
    true
}

/// A (0) – B (1) – C (2), B dying at `step`; A pays 2,000,000 msat toward C, B dies, starts
/// again and its peers reconnect. Returns whether C was paid, after checking that the
/// money moved exactly (C's amount, B's fee) or not at all, and that B's one forward
/// says which.
async fn crash_and_recover(step: CrashStep, payee: Payee) -> bool {
    let mut net = create_network(3, |c| {
        regtest(c);
        if c.data_dir.ends_with("node1") {
            c.crash_at = Some(step.as_str().to_owned());
        }
    })
    .await;
    net.open_channel(0, 1, 500_000).await;
    net.open_channel(1, 2, 500_000).await;
    let inv = invoice(&net, 2, 2_000_000, "crash").await;
    let stranger = PublicKey::from_secret_key(
        &Secp256k1::new(),
        &SecretKey::from_slice(&[0x66; 32]).expect("key"),
    );
    let (r_hash, route) = match payee {
        Payee::Pays => (inv.r.hash(), vec![net.id(1), net.id(2)]),
        Payee::Fails => (Sha256::hash(&[7; 32]), vec![net.id(1), net.id(2)]),
        Payee::Declines => (Sha256::hash(&[7; 32]), vec![net.id(1), net.id(2), stranger]),
    };
    let ends = [(0, 1), (1, 0), (1, 2), (2, 1)];
    let mut before = Vec::new();
    for (i, peer) in ends {
        before.push(side(&net, i, peer).await.0);
    }
    net.nodes[0]
        .manager
        .pay_route(&route, r_hash, 2_000_000)
        .await
        .expect("accepted by B");
    let crashed = net.nodes[1].manager.crashed();
    eventually!(net, format!("B dies at {step:?}"), *crashed.borrow());
    net.restart_after_crash(1).await;
    net.connect(0, 1).await;
    net.connect(1, 2).await;
    eventually!(
        net,
        format!("every HTLC resolved after B died at {step:?} ({payee:?})"),
        idle_along(&net).await
    );
    settled_along(&net).await;
    let paid = net.nodes[2]
        .manager
        .list_invoices()
        .await
        .expect("invoices")[0]
        .paid
        .map(|p| p.amount_msat);
    let moved = if paid.is_some() {
        assert_eq!(paid, Some(2_000_000), "{step:?}");
        let to_b = 2_000_000 + FEE;
        [
            to_b.wrapping_neg(),
            to_b,
            2_000_000u64.wrapping_neg(),
            2_000_000,
        ]
    } else {
        [0; 4]
    };
    for (k, (i, peer)) in ends.into_iter().enumerate() {
        assert_eq!(
            side(&net, i, peer).await,
            (before[k].wrapping_add(moved[k]), 0),
            "node {i} with {peer}, B died at {step:?} ({payee:?})"
        );
    }
    let listed = net
        .rpc(1, "listforwards", serde_json::json!([]))
        .await
        .expect("listforwards");
    let forwards = listed["forwards"].as_array().expect("forwards");
    assert_eq!(forwards.len(), 1, "{listed}");
    let want = if paid.is_some() {
        "fulfilled"
    } else {
        "failed"
    };
    assert_eq!(forwards[0]["state"], want, "{step:?} ({payee:?}): {listed}");
    assert_eq!(forwards[0]["fee_msat"], FEE, "{listed}");
    // The counts the node's log gives.
    let counts = (
        listed["fulfilled"].as_u64(),
        listed["failed"].as_u64(),
        listed["in_flight"].as_u64(),
        listed["fees_earned_msat"].as_u64(),
    );
    let want = match paid {
        Some(_) => (Some(1), Some(0), Some(0), Some(FEE)),
        None => (Some(0), Some(1), Some(0), Some(0)),
    };
    assert_eq!(counts, want, "{listed}");
    paid.is_some()
}

/// C pays: once B stored the link, the forward completes after B's restart unless B died
/// before its downstream offer left (then it goes back to A whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hop_dies_at_each_step_of_a_payment_and_it_completes_or_goes_back_whole() {
    let table = [
        (CrashStep::ForwardStored, false),
        (CrashStep::DownstreamCommitted, true),
        (CrashStep::OutcomeStored, true),
        (CrashStep::UpstreamCommitted, true),
    ];
    assert_eq!(table.map(|(s, _)| s), CrashStep::ALL, "every step");
    for (step, paid) in table {
        assert_eq!(crash_and_recover(step, Payee::Pays).await, paid, "{step:?}");
    }
}

/// C fails the HTLC: wherever B dies, A gets its HTLC back and nothing moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hop_dies_at_each_step_of_a_failing_forward_and_nothing_moves() {
    for step in CrashStep::ALL {
        assert!(!crash_and_recover(step, Payee::Fails).await, "{step:?}");
    }
}

/// C declines B's offer: the downstream HTLC never commits, so every other step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hop_dies_at_each_step_of_a_declined_forward_and_nothing_moves() {
    for step in [
        CrashStep::ForwardStored,
        CrashStep::OutcomeStored,
        CrashStep::UpstreamCommitted,
    ] {
        assert!(!crash_and_recover(step, Payee::Declines).await, "{step:?}");
    }
}
