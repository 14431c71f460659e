//! The attacks of `crates/potluck/tests/node/attacks.rs` that are about the node's
//! policies, in process: a scripted peer (`harness::ScriptedPeer`) lies, stalls or hangs
//! up over an in-memory pipe, the chain is the in-process development chain and the watcher
//! is stepped by hand. Each test names the process test it replaces.

use std::time::Duration;

use bitcoin::hashes::Hash as _;
use chain::Chain as _;
use serde_json::json;
use wire::Packet;

use crate::harness::{create_network, eventually, Anchor, Network, ScriptedPeer};

const ANCHOR_SAT: u64 = 1_000_000;

/// The settings the process tests ran the binary with on regtest.
fn regtest(config: &mut crate::NodeConfig) {
    config.channel.min_depth = 1;
}

/// A node and a scripted peer with node key `[seed; 32]` that funded a live channel to it.
async fn live(seed: u8) -> (Network, ScriptedPeer) {
    let net = create_network(1, regtest).await;
    let mut peer = net.scripted_peer(0, seed).await;
    peer.open_live(&net, ANCHOR_SAT).await;
    (net, peer)
}

/// Our balance (pay and fee) in node 0's channel with `peer`, in msat.
async fn ours_msat(net: &Network, peer: &ScriptedPeer) -> u64 {
    let ch = net.channel_json(0, &peer.node_id).await;
    ch["our_msat"].as_u64().expect("our_msat") + ch["our_fee_msat"].as_u64().expect("fee")
}

/// The channel's state on node 0.
async fn state(net: &Network, peer: &ScriptedPeer) -> String {
    let ch = net.channel_json(0, &peer.node_id).await;
    ch["state"].as_str().unwrap_or("none").to_owned()
}

/// Node 0 is sent an anchor that does not back the channel: it never says `open_complete`
/// nor lists the channel as live, and tells the peer why.
async fn bad_anchor_is_refused(how: Anchor) {
    let net = create_network(1, |c| {
        regtest(c);
        c.anchor_wait_blocks = 4;
    })
    .await;
    let mut peer = net.scripted_peer(0, 40).await;
    peer.open_as_funder(&net, ANCHOR_SAT, how).await;
    // Deep enough for any min_depth, and past the node's wait for a missing anchor.
    for _ in 0..8 {
        net.mine(1).await;
    }
    let problem = peer
        .error(&net)
        .await
        .unwrap_or_else(|e| panic!("{how:?}: {e}"));
    assert!(
        !peer
            .received
            .iter()
            .any(|p| matches!(p, Packet::OpenComplete(_))),
        "{how:?}: the node went live on an anchor that does not back the channel"
    );
    assert!(problem.to_lowercase().contains("anchor"), "{problem}");
    net.step().await;
    let channels = net.rpc(0, "listchannels", json!([])).await.expect("list");
    for ch in channels["channels"].as_array().expect("channels") {
        let state = ch["state"].as_str().expect("state");
        assert!(
            state != "normal" && state != "open_wait_complete",
            "{how:?}: channel still listed as {state}"
        );
    }
    assert_eq!(net.info(0).await["open_channels"], 0);
}

/// Replaces the process test `anchor_paying_elsewhere_is_refused`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anchor_paying_elsewhere_is_refused() {
    bad_anchor_is_refused(Anchor::PaysElsewhere).await;
}

/// Replaces the process test `anchor_paying_too_little_is_refused`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anchor_paying_too_little_is_refused() {
    bad_anchor_is_refused(Anchor::PaysTooLittle).await;
}

/// Replaces the process test `honest_scripted_funder_goes_live`: the same scripted peer
/// playing fair gets a live channel (the refusals above are about the anchor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_honest_scripted_funder_goes_live() {
    let (net, peer) = live(50).await;
    let ch = net.channel_json(0, &peer.node_id).await;
    assert_eq!(ch["capacity_sat"], ANCHOR_SAT);
    assert_eq!(net.info(0).await["open_channels"], 1);
}

/// Replaces the process test `a_taken_close_signature_blocks_later_updates`: a peer takes
/// our `close_channel` signature, hangs up, comes back and pays us. The close counts as
/// possibly broadcast: no update is accepted, and the close is watched for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_close_signature_blocks_later_updates() {
    let (net, mut peer) = live(70).await;
    peer.pay(200_000_000).await.expect("pay");
    let before = net.channel_json(0, &peer.node_id).await;
    assert_eq!(ours_msat(&net, &peer).await, 200_000_000, "{before}");

    // The owner closes; the peer keeps the signature and never answers.
    let id = peer.node_id.to_string();
    let closer = net.rpc_in_background(0, "close", json!([id]));
    let close = peer.expect(&net, "close").await;
    let before_close = peer.channel.clone();
    peer.hang_up();
    let answered = closer.await.expect("join");
    assert!(answered.is_err(), "the close cannot have completed");

    peer.reconnect(&net).await;
    // The node says its close again (the peer keeps ignoring it) and refuses the payment.
    peer.expect(&net, "close").await;
    let paid = peer.pay(100_000_000).await;
    let after = net.channel_json(0, &peer.node_id).await;
    assert!(
        paid.is_err(),
        "an update after the close signature: {after}"
    );
    assert_eq!(after["our_msat"], before["our_msat"], "{after}");
    assert_ne!(after["state"], "normal", "{after}");

    // The peer broadcasts the close it holds: the node sees it and gets exactly its balance.
    let mut holder = before_close;
    let tx = holder
        .handle_packet(&close, 0)
        .expect("close")
        .into_iter()
        .find_map(|a| match a {
            channel::Action::Broadcast(tx) => Some(tx),
            _ => None,
        })
        .expect("the close transaction");
    net.chain.send_raw(&tx, None).expect("close accepted");
    net.mine(1).await;
    eventually!(
        net,
        "the node sees the close",
        state(&net, &peer).await == "closed"
    );
    let ours: u64 = tx
        .output
        .iter()
        .map(|o| o.value.to_sat())
        .find(|v| *v <= 200_000 && *v > 190_000)
        .expect("our output in the close");
    eventually!(
        net,
        "the close output in the wallet",
        net.funds_sat(0).await == ours
    );
}

/// Replaces the process test
/// `an_interrupted_close_is_said_again_and_completes_after_a_reconnect`: the session drops
/// right after our `close_channel` reached the peer; when it comes back the node says the
/// same `close_channel` again and the close completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_close_is_said_again_and_completes_after_a_reconnect() {
    let (net, mut peer) = live(74).await;
    peer.pay(200_000_000).await.expect("pay");
    let closer = net.rpc_in_background(0, "close", json!([peer.node_id.to_string()]));
    let first = peer.expect(&net, "close").await;
    peer.hang_up();
    assert!(closer.await.expect("join").is_err());
    assert_eq!(state(&net, &peer).await, "close_wait_complete");
    eventually!(
        net,
        "the node sees the session gone",
        !net.nodes[0].peers.is_connected(&peer.node_id)
    );

    peer.reconnect(&net).await;
    let again = peer.expect(&net, "close").await;
    assert_eq!(again, first, "the same close, fee and signature");
    peer.handle(&again).await;
    peer.expect(&net, "close_ack").await;
    eventually!(net, "the channel closed on chain", {
        net.mine(1).await;
        state(&net, &peer).await == "closed"
    });
    eventually!(net, "our share of the close in the wallet", {
        net.mine(1).await;
        let funds = net.funds_sat(0).await;
        funds > 190_000 && funds <= 200_000
    });
}

/// Replaces the process test `a_stalled_update_drops_the_session_and_closes`: the peer
/// takes our `update_accept` and neither signs nor hangs up. Not before the update deadline,
/// but past it, the node drops the session, and closes on chain. The deadline runs on a
/// clock the test moves, not on the wall clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_update_drops_the_session_and_closes() {
    let net = create_network(1, |c| {
        regtest(c);
        c.update_timeout = Duration::from_secs(2);
    })
    .await;
    let mut peer = net.scripted_peer(0, 80).await;
    peer.open_live(&net, ANCHOR_SAT).await;
    peer.pay(200_000_000).await.expect("pay");
    let actions = peer.channel.pay(100_000_000).expect("pay");
    peer.run(actions).await;
    peer.expect(&net, "update_accept").await;
    // The update clock starts at the pass that first sees the update in flight.
    net.step().await;
    net.tick_after(0, Duration::from_secs(1)).await;
    assert!(
        net.nodes[0].peers.is_connected(&peer.node_id),
        "dropped early"
    );
    net.tick_after(0, Duration::from_secs(3)).await;
    let farewell = peer.recv(Duration::from_secs(10)).await;
    assert!(
        matches!(farewell, Ok(Some(Packet::Error(_))) | Err(_)),
        "the node waited for a stalled update: {farewell:?}"
    );
    // The update cannot be resumed (we signed the peer's next commitment): the lost session
    // closes the channel on chain with our valid commitment.
    eventually!(net, "the channel closes on chain", {
        net.mine(1).await;
        state(&net, &peer).await == "on_chain"
    });
}

/// Replaces the process test `a_broadcast_of_the_commitment_we_accepted_is_claimed`: the
/// peer offers an HTLC, takes our `update_accept` and broadcasts that commitment instead of
/// signing ours; the node sweeps its output and, given R, claims the HTLC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_of_the_commitment_we_accepted_is_claimed() {
    let (net, mut peer) = live(100).await;
    peer.pay(200_000_000).await.expect("pay");
    let r = wire::Preimage([8u8; 32]);
    let expiry = wire::Locktime::Blocks(net.chain.height() + 30);
    let actions = peer
        .channel
        .add_htlc(50_000_000, r.hash(), expiry, 0)
        .expect("htlc");
    peer.run(actions).await;
    let accept = peer.expect(&net, "update_accept").await;
    // Take the signature; keep our update_signature (and our revocation) to ourselves.
    let _withheld = peer.channel.handle_packet(&accept, 0).expect("accept");
    let theirs = peer.channel.signed_commitment().expect("signed");
    assert_eq!(
        theirs.output.len(),
        3,
        "ours, theirs and the HTLC: {theirs:?}"
    );
    net.chain
        .send_raw(&theirs, None)
        .expect("commitment accepted");
    net.mine(1).await;
    eventually!(
        net,
        "the node sees the peer's commitment",
        state(&net, &peer).await == "on_chain"
    );
    net.rpc(
        0,
        "fulfillhtlc",
        json!([peer.node_id.to_string(), hex::encode(r.0)]),
    )
    .await
    .expect("fulfillhtlc");
    // 195,000 sat outside the HTLC plus 50,000 in it, less the claim's fee.
    eventually!(net, "our output and the HTLC in the wallet", {
        net.mine(1).await;
        net.funds_sat(0).await > 240_000
    });
}

/// Replaces the process test `a_new_session_replaces_a_half_open_one`: the peer's old
/// session went half-open; its new authenticated session replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_replaces_a_half_open_one() {
    let (net, mut peer) = live(110).await;
    let _half_open = peer.reconnect_keep_old(&net).await;
    peer.pay(10_000_000)
        .await
        .unwrap_or_else(|e| panic!("the new session was refused: {e}"));
    assert_eq!(ours_msat(&net, &peer).await, 10_000_000);
}

/// Replaces the process test `a_crossed_proposal_ends_in_one_payment`: the owner's payment
/// crosses the peer's HTLC on the wire; the peer has priority, ours is deferred, the node
/// declines the HTLC (expiry beyond its limit), and `pay` ends paid exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crossed_proposal_ends_in_one_payment() {
    let (net, mut peer) = live(120).await;
    // Two updates: priority toggles twice, back to the funder (the peer).
    peer.pay(100_000_000).await.expect("pay");
    peer.pay(100_000_000).await.expect("pay");
    assert!(peer.channel.has_priority());

    let pay = net.rpc_in_background(0, "pay", json!([peer.node_id.to_string(), 50_000_000]));
    // The node's proposal is on the wire; ours leaves before we read it: they cross.
    let theirs = peer.expect(&net, "update").await;
    let far = wire::Locktime::Blocks(net.chain.height() + 5_000);
    let actions = peer
        .channel
        .add_htlc(1_000_000, wire::Preimage([9; 32]).hash(), far, 0)
        .expect("htlc");
    peer.run(actions).await;
    peer.handle(&theirs).await;
    // Answer whatever the node says until its `pay` returned and both sides are at rest.
    for _ in 0..500 {
        match peer.recv(Duration::from_millis(20)).await {
            Ok(Some(pkt)) => peer.handle(&pkt).await,
            Ok(None) if pay.is_finished() => break,
            Ok(None) => {}
            Err(e) => panic!("the session ended: {e}"),
        }
    }
    let paid = pay.await.expect("join");
    assert!(paid.is_ok(), "{paid:?}");
    // Paid once: 200,000 sat less 50,000, and the peer's machine agrees.
    let ch = net.channel_json(0, &peer.node_id).await;
    assert_eq!(ours_msat(&net, &peer).await, 150_000_000, "{ch}");
    assert_eq!(
        peer.channel
            .balances()
            .expect("balances")
            .theirs
            .total_msat(),
        150_000_000
    );
    assert!(ch["htlcs"].as_array().expect("htlcs").is_empty(), "{ch}");
}

/// Replaces the process test
/// `an_htlc_whose_r_the_peer_took_and_hung_up_is_claimed_on_chain_before_expiry`: the peer
/// reads our `update_fulfill_htlc` (it has R) and hangs up before accepting it; the node
/// still claims the HTLC with R on chain before it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_htlc_whose_r_the_peer_took_and_hung_up_is_claimed_on_chain_before_expiry() {
    let (net, mut peer) = live(131).await;
    peer.pay(100_000_000).await.expect("pay");
    let r = wire::Preimage([12; 32]);
    let expiry = net.chain.height() + 20;
    let actions = peer
        .channel
        .add_htlc(50_000_000, r.hash(), wire::Locktime::Blocks(expiry), 0)
        .expect("htlc");
    peer.run(actions).await;
    peer.until_normal().await.expect("the HTLC added");
    eventually!(
        net,
        "the HTLC on the node's side",
        htlcs_on_the_node(&net, &peer).await == Some(1)
    );
    let fulfill = net.rpc_in_background(
        0,
        "fulfillhtlc",
        json!([peer.node_id.to_string(), hex::encode(r.0)]),
    );
    peer.expect(&net, "update_fulfill_htlc").await;
    peer.hang_up();
    assert!(fulfill.await.expect("join").is_err());
    eventually!(
        net,
        "the node sees the session end",
        !net.nodes[0].peers.is_connected(&peer.node_id)
    );
    // Our claim delay is 6 blocks: by then the node is on chain, and claims with R.
    while net.chain.height() < expiry - 6 {
        net.mine(1).await;
    }
    eventually!(
        net,
        "the node closes on chain before expiry",
        state(&net, &peer).await == "on_chain"
    );
    // 95,000 sat outside the HTLC plus the 50,000 in it, less the claims' fees.
    eventually!(net, "the HTLC claimed with R", {
        net.mine(1).await;
        net.funds_sat(0).await > 140_000
    });
}

/// Replaces the process test `openings_waiting_for_an_anchor_are_capped`: strangers open
/// channels they never fund; past the cap the next opening is refused, nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openings_waiting_for_an_anchor_are_capped() {
    let net = create_network(1, |c| {
        regtest(c);
        c.max_pending_openings = 2;
    })
    .await;
    let mut waiting = Vec::new();
    for seed in [140, 141] {
        let mut peer = net.scripted_peer(0, seed).await;
        peer.open_as_funder(&net, ANCHOR_SAT, Anchor::DoesNotExist)
            .await;
        waiting.push(peer);
    }
    let mut third = net.scripted_peer(0, 142).await;
    match third.start_open(ANCHOR_SAT).await {
        Ok(Some(Packet::Error(e))) => {
            let problem = e.problem.unwrap_or_default();
            assert!(problem.contains("waiting for"), "{problem}");
        }
        other => panic!("a third unfunded opening was taken: {other:?}"),
    }
    let channels = net.rpc(0, "listchannels", json!([])).await.expect("list");
    assert_eq!(channels["channels"].as_array().map(Vec::len), Some(2));
}

/// Replaces the process test `a_pkt_with_only_an_unknown_odd_field_is_ignored`: a `pkt`
/// whose only member is an unknown odd field (a newer version's packet) is ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pkt_with_only_an_unknown_odd_field_is_ignored() {
    let (_net, mut peer) = live(160).await;
    // Field 1001 (odd), varint 1.
    peer.send_payload(&[0xc8, 0x3e, 0x01]).await;
    peer.pay(10_000_000)
        .await
        .unwrap_or_else(|e| panic!("the session did not survive the unknown odd field: {e}"));
}

/// Replaces the process test `a_frame_with_non_zero_padding_gets_an_error_farewell`: the
/// MAC is good, so the keystreams are in step and the peer is told why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_with_non_zero_padding_gets_an_error_farewell() {
    let net = create_network(1, regtest).await;
    let mut peer = net.scripted_peer(0, 170).await;
    peer.send_badly_padded(&Packet::OpenComplete(wire::OpenComplete::default()).encode())
        .await;
    match peer.recv(Duration::from_secs(10)).await {
        Ok(Some(Packet::Error(e))) => {
            let problem = e.problem.unwrap_or_default();
            assert!(problem.contains("padding"), "{problem}");
        }
        other => panic!("no farewell: {other:?}"),
    }
}

/// Replaces the process test `a_double_spent_anchor_ends_a_live_channel`: the peer funds
/// the anchor from its own coin, pays us, then double-spends that coin in a
/// reorganisation: the channel is over, nothing more is accepted or proposed on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_double_spent_anchor_ends_a_live_channel() {
    let net = create_network(1, regtest).await;
    let mut peer = net.scripted_peer(0, 63).await;
    peer.open_live_with(&net, ANCHOR_SAT, Anchor::OwnCoin).await;
    peer.pay(200_000_000).await.expect("pay");

    let anchor: bitcoin::Txid = net.channel_json(0, &peer.node_id).await["anchor_txid"]
        .as_str()
        .expect("anchor")
        .parse()
        .expect("txid");
    let block = net
        .chain
        .transaction(anchor)
        .await
        .expect("chain")
        .and_then(|s| s.block_hash)
        .expect("the anchor's block");
    net.chain.invalidate(block).expect("invalidate");
    let conflict = peer.double_spend_anchor(&net);
    net.mine(2).await;
    let status = net.chain.transaction(conflict).await.expect("chain");
    assert_eq!(status.map(|s| s.confirmations), Some(2));
    assert!(!net.chain.in_mempool(anchor).await.expect("chain"));
    eventually!(net, "the channel ended", {
        let ch = net.channel_json(0, &peer.node_id).await;
        let ended = ch.is_null()
            || (ch["live"] == false
                && ch["state"] != "normal"
                && ch["state"] != "open_wait_complete");
        ended && net.info(0).await["open_channels"] == 0
    });
    let refused = net
        .rpc(0, "pay", json!([peer.node_id.to_string(), 10_000_000]))
        .await;
    assert!(
        refused.is_err(),
        "the node proposed on a dead channel: {refused:?}"
    );
    eventually!(
        net,
        "the peer's session dropped",
        !net.nodes[0].peers.is_connected(&peer.node_id)
    );
    peer.reconnect(&net).await;
    assert!(
        peer.pay(50_000_000).await.is_err(),
        "the node accepted an update on a channel whose anchor was double-spent"
    );
    assert_eq!(net.info(0).await["open_channel_balance_msat"], 0);
}

/// Replaces the process test `an_htlc_locked_to_a_revocation_hash_is_refused_both_ways`:
/// an HTLC locked to the revocation hash sent in the same packet is refused (the penalty
/// could not take its output), and so is our own `newhtlc` with the peer's revocation hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_htlc_locked_to_a_revocation_hash_is_refused_both_ways() {
    let (net, mut peer) = live(141).await;
    peer.pay(300_000_000).await.expect("pay");
    let expiry = net.chain.height() + 100;
    let actions = peer
        .channel
        .add_htlc(
            50_000_000,
            wire::Preimage([5; 32]).hash(),
            wire::Locktime::Blocks(expiry),
            0,
        )
        .expect("htlc");
    let Some(channel::Action::Send(Packet::UpdateAddHtlc(mut add))) = actions.into_iter().next()
    else {
        panic!("update_add_htlc expected");
    };
    add.r_hash = add.revocation_hash;
    peer.send(&Packet::UpdateAddHtlc(add)).await;
    match peer.recv(Duration::from_secs(10)).await {
        Ok(Some(Packet::Error(e))) => assert!(
            e.problem
                .as_deref()
                .unwrap_or("")
                .contains("revocation hash"),
            "{e:?}"
        ),
        other => panic!("the node accepted a poisoned HTLC: {other:?}"),
    }
    let ch = net.channel_json(0, &peer.node_id).await;
    assert!(ch["htlcs"].as_array().expect("htlcs").is_empty(), "{ch}");
    assert_eq!(ch["state"], "normal");
    // Our side: the peer's current revocation hash as an HTLC hash is refused.
    peer.reconnect(&net).await;
    eventually!(
        net,
        "the peer is back",
        net.nodes[0].peers.is_connected(&peer.node_id)
    );
    let n = peer.channel.commitment_number();
    let theirs = channel::shachain::revocation_hash_from_seed(&peer.secrets.revocation_seed, n);
    let err = net
        .rpc(
            0,
            "newhtlc",
            json!([
                peer.node_id.to_string(),
                "50000000",
                hex::encode(theirs.to_byte_array()),
                expiry.to_string()
            ]),
        )
        .await
        .expect_err("newhtlc locked to the peer's revocation hash");
    assert!(err.1.contains("revocation hash"), "{err:?}");
}

/// Whether node 0 lists itself among its peers.
fn talks_to_itself(net: &Network) -> bool {
    net.nodes[0]
        .peers
        .list()
        .iter()
        .any(|p| p.node_id == net.id(0))
}

/// Replaces the process test `an_echoing_peer_gets_no_session_with_the_node_itself`: a
/// connection that echoes the node's own bytes back gets no session of the node with
/// itself, and is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echoing_peer_gets_no_session_with_the_node_itself() {
    let net = create_network(1, regtest).await;
    let (node_side, far) = tokio::io::duplex(1 << 16);
    let echo = tokio::spawn(async move {
        let (mut read, mut write) = tokio::io::split(far);
        tokio::io::copy(&mut read, &mut write).await
    });
    let from = std::net::SocketAddr::from(([127, 0, 0, 1], 30_001));
    // The handshake fails or authenticates the node to itself; either way no session.
    let _authenticated = net.accept(0, node_side, from).await;
    assert!(
        !talks_to_itself(&net),
        "the node holds a session with itself"
    );
    let ended = tokio::time::timeout(Duration::from_secs(10), echo).await;
    assert!(ended.is_ok(), "the echoing connection was kept open");
    assert!(
        !talks_to_itself(&net),
        "the node holds a session with itself"
    );
}

/// Replaces the process test `a_session_relayed_back_to_the_node_is_refused`: two inbound
/// connections wired into each other authenticate the node to itself with two session
/// keys; only the node id tells, and the accept path refuses both and closes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_relayed_back_to_the_node_is_refused() {
    let net = create_network(1, regtest).await;
    let (a, mut a_far) = tokio::io::duplex(1 << 16);
    let (b, mut b_far) = tokio::io::duplex(1 << 16);
    let relay =
        tokio::spawn(async move { tokio::io::copy_bidirectional(&mut a_far, &mut b_far).await });
    let from = |port| std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let (first, second) = tokio::join!(
        net.accept(0, a, from(30_002)),
        net.accept(0, b, from(30_003))
    );
    // Both handshakes authenticated with our own key: the refusal is the node id check's.
    assert_eq!((first, second), (Some(net.id(0)), Some(net.id(0))));
    assert!(
        !talks_to_itself(&net),
        "the node holds a session with itself"
    );
    let ended = tokio::time::timeout(Duration::from_secs(10), relay).await;
    assert!(ended.is_ok(), "the relayed connections were kept open");
    assert!(!talks_to_itself(&net));
}

/// The HTLCs node 0's channel with `peer` holds.
async fn htlcs_on_the_node(net: &Network, peer: &ScriptedPeer) -> Option<usize> {
    net.channel_json(0, &peer.node_id).await["htlcs"]
        .as_array()
        .map(Vec::len)
}

/// A node whose chain is behind a switch that counts its height questions, and a peer
/// with a live channel that has paid it 200,000 sat.
async fn live_on_a_switched_chain(
    seed: u8,
) -> (
    Network,
    ScriptedPeer,
    std::sync::Arc<crate::harness::HangingChain>,
) {
    let hanging = std::sync::Mutex::new(None);
    let net = crate::harness::create_network_on(1, regtest, |chain| {
        let wrapped = std::sync::Arc::new(crate::harness::HangingChain::new(chain.clone()));
        *hanging.lock().expect("lock") = Some(std::sync::Arc::clone(&wrapped));
        wrapped
    })
    .await;
    let hanging = hanging
        .into_inner()
        .expect("lock")
        .expect("the node's chain");
    let mut peer = net.scripted_peer(0, seed).await;
    peer.open_live(&net, ANCHOR_SAT).await;
    peer.pay(200_000_000).await.expect("pay");
    (net, peer, hanging)
}

/// The peer offers an HTLC expiring at `expiry` (judged by its own machine at `height`)
/// and answers the node until both are at rest: the node's first answer, `update_accept`
/// or `update_decline_htlc`, is returned.
async fn offer_htlc(peer: &mut ScriptedPeer, n: u8, expiry: u32, height: u32) -> String {
    peer.channel.block_height(height);
    let actions = peer
        .channel
        .add_htlc(
            1_000_000,
            wire::Preimage([n; 32]).hash(),
            wire::Locktime::Blocks(expiry),
            0,
        )
        .expect("htlc");
    peer.run(actions).await;
    let first = peer.recv(Duration::from_secs(10)).await;
    let Ok(Some(first)) = first else {
        panic!("no answer to the HTLC: {first:?}");
    };
    peer.handle(&first).await;
    if peer.channel.state() != channel::State::Normal {
        peer.until_normal().await.expect("the update completes");
    }
    first.name().to_owned()
}

/// Most adds are judged at a recent answer to the chain (docs/node.md, "Defences"): the
/// attack is to slip in an HTLC that expires too soon at the chain's height behind it. Six
/// blocks (`SLACK`) come right after the node's last question, unseen by its watcher; the
/// peer's next HTLC leaves room for the node's claim at the height the node last heard
/// (13 blocks: the peer's delay of 6 and the margin of 6, plus one) but not at the chain's
/// (7 blocks). The node asks and declines it; an HTLC with room is accepted after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_htlc_too_soon_for_the_chain_is_declined_right_after_a_recent_answer() {
    let (net, mut peer, hanging) = live_on_a_switched_chain(126).await;
    let h0 = net.chain.height();
    assert_eq!(
        offer_htlc(&mut peer, 1, h0 + 100, h0).await,
        "update_accept"
    );
    let asked = hanging.tips_asked();
    // The blocks reach the chain only: the node's watcher is not stepped.
    let payout = net.chain.faucet_script().to_owned();
    net.chain
        .mine(crate::manager::fresh_tip::SLACK, &payout)
        .expect("mine");
    let h1 = net.chain.height();
    assert_eq!(
        offer_htlc(&mut peer, 2, h0 + 13, h0).await,
        "update_decline_htlc",
        "an HTLC 7 blocks from expiry at height {h1} was taken at height {h0}"
    );
    assert!(
        hanging.tips_asked() > asked,
        "the node judged it without asking"
    );
    assert_eq!(offer_htlc(&mut peer, 3, h1 + 12, h1).await, "update_accept");
}

/// The other side of the same rule: HTLCs far from every limit, one after another, share
/// the chain's answer instead of a round trip to bitcoind each (five adds asked five
/// questions before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn htlcs_far_from_their_limits_share_a_recent_answer() {
    let (net, mut peer, hanging) = live_on_a_switched_chain(127).await;
    let h0 = net.chain.height();
    let asked = hanging.tips_asked();
    for n in 1..=5 {
        assert_eq!(
            offer_htlc(&mut peer, n, h0 + 100, h0).await,
            "update_accept"
        );
    }
    let questions = hanging.tips_asked() - asked;
    // One for the first; another only where an update took longer than a second.
    assert!(questions < 5, "{questions} questions for five HTLCs");
    eventually!(
        net,
        "five HTLCs on the node's side",
        htlcs_on_the_node(&net, &peer).await == Some(5)
    );
}

/// Replaces the process test
/// `a_hung_bitcoind_does_not_hold_the_channel_while_an_htlc_arrives`: the chain hangs
/// while the peer offers an HTLC, and the node asks it for the height to check the expiry.
/// That question must not hold the channel: the owner's `listpeers` answers within a
/// second (the node waits 2 s for the height), and the HTLC is accepted against the last
/// height seen once the node stops waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_chain_does_not_hold_the_channel_while_an_htlc_arrives() {
    let (net, mut peer, hanging) = live_on_a_switched_chain(120).await;
    let expiry = wire::Locktime::Blocks(net.chain.height() + 30);
    hanging.stall(true);
    let actions = peer
        .channel
        .add_htlc(10_000_000, wire::Preimage([5u8; 32]).hash(), expiry, 0)
        .expect("htlc");
    peer.run(actions).await;
    // Until the node asks the hung chain, under the HTLC's packet.
    let asked = tokio::time::timeout(Duration::from_secs(10), hanging.asked()).await;
    assert!(asked.is_ok(), "the node never asked the chain");
    let asked = std::time::Instant::now();
    let peers = net.rpc(0, "listpeers", json!([])).await.expect("listpeers");
    let waited = asked.elapsed();
    assert!(
        waited < Duration::from_secs(1),
        "listpeers waited {waited:?} for the channel behind a hung chain"
    );
    assert_eq!(peers["peers"].as_array().map(Vec::len), Some(1), "{peers}");
    // The update goes through with the chain still hung.
    let accept = loop {
        match peer.recv(Duration::from_secs(10)).await {
            Ok(Some(p)) if p.name() == "update_accept" => break p,
            Ok(Some(_)) => {}
            other => panic!("no update_accept with the chain hung: {other:?}"),
        }
    };
    peer.handle(&accept).await;
    peer.until_normal().await.expect("the HTLC added");
    hanging.stall(false);
    eventually!(
        net,
        "the HTLC on the node's side",
        htlcs_on_the_node(&net, &peer).await == Some(1)
    );
}

/// Replaces the process test `strangers_that_leave_are_forgotten_with_their_openings`:
/// strangers that come, open a channel they never fund, and go leave nothing behind (the
/// peer list forgets them, their openings' final keys leave the watched scripts, also
/// after a restart), while a peer with a live channel stays listed once it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_that_leave_are_forgotten_with_their_openings() {
    let (mut net, mut friend) = live(170).await;
    let watched = |info: serde_json::Value| info["watched_scripts"].as_u64();
    let baseline = watched(net.info(0).await);
    let listed = |net: &Network, id| net.nodes[0].peers.list().iter().any(|p| p.node_id == id);
    let mut gone = Vec::new();
    for seed in 171..175u8 {
        let mut s = net.scripted_peer(0, seed).await;
        if seed % 2 == 1 {
            // Opens (the node answers with its own open and a fresh key), then vanishes.
            let answer = s.start_open(ANCHOR_SAT).await;
            assert!(matches!(answer, Ok(Some(Packet::Open(_)))), "{answer:?}");
        }
        gone.push(s.node_id);
        s.hang_up();
    }
    eventually!(
        net,
        "the strangers forgotten",
        gone.iter().all(|id| !listed(&net, *id))
    );
    eventually!(
        net,
        "their openings unwatched",
        watched(net.info(0).await) == baseline
    );
    let channels = net.rpc(0, "listchannels", json!([])).await.expect("list");
    assert_eq!(channels["channels"].as_array().map(Vec::len), Some(1));

    friend.hang_up();
    eventually!(
        net,
        "the friend disconnected",
        !net.nodes[0].peers.is_connected(&friend.node_id)
    );
    assert!(
        listed(&net, friend.node_id),
        "a peer with a channel is kept"
    );

    net.restart(0).await;
    assert_eq!(
        watched(net.info(0).await),
        baseline,
        "abandoned openings are not watched again after a restart"
    );
}

/// Replaces the process test `an_open_the_peer_stalls_frees_the_reserved_funds`: the peer
/// answers our `open`, lets the node build and sign its anchor (reserving the wallet
/// outputs it spends), then never sends `open_commit_sig`. The call times out (-108) and
/// the outputs are free again although the peer kept its session: the node dropped it.
/// The call's time-out is a setting (60 s by default), one second here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_the_peer_stalls_frees_the_reserved_funds() {
    let net = create_network(1, |c| {
        regtest(c);
        c.command_timeout = Duration::from_secs(1);
    })
    .await;
    net.fund(0, 1_000_000).await;
    let spendable = |funds: serde_json::Value| funds["spendable_sat"].as_u64();
    let mut peer = net.scripted_peer(0, 132).await;
    peer.accept_role();
    let open = net.rpc_in_background(0, "open", json!([peer.node_id.to_string(), 500_000]));
    let pkt = peer.expect(&net, "open").await;
    let ours = peer.channel.start().expect("our open");
    peer.run(ours).await;
    peer.handle(&pkt).await;
    peer.expect(&net, "open_anchor").await;
    let listfunds = || net.rpc(0, "listfunds", json!([]));
    assert_eq!(
        spendable(listfunds().await.expect("listfunds")),
        Some(0),
        "the anchor's outputs reserved"
    );
    let answered = open.await.expect("join");
    assert_eq!(
        answered.as_ref().err().map(|e| e.0),
        Some(-108),
        "{answered:?}"
    );
    eventually!(
        net,
        "the stalled opening abandoned",
        spendable(listfunds().await.expect("listfunds")) == Some(1_000_000)
    );
    let channels = net.rpc(0, "listchannels", json!([])).await.expect("list");
    assert_eq!(channels["channels"], json!([]));
    assert!(!net.nodes[0].peers.is_connected(&peer.node_id));
}

/// A live channel in which the scripted peer paid the node twice, and the commitment the
/// second payment revoked (the peer's, signed: a cheat it can broadcast).
async fn paid_twice_with_a_revoked_commitment(
    seed: u8,
) -> (Network, ScriptedPeer, bitcoin::Transaction) {
    let (net, mut peer) = live(seed).await;
    peer.pay(100_000_000).await.expect("pay");
    let revoked = peer.channel.signed_commitment().expect("signed");
    peer.pay(50_000_000).await.expect("pay");
    (net, peer, revoked)
}

/// Replaces the process test `force_close_whose_commitment_the_chain_refuses_is_an_error`
/// (issue 28, finding 8: it used to answer success):
/// the peer's revoked commitment is in the mempool, so the chain refuses ours; `close
/// force` answers -113 saying so, and the channel is on chain all the same (ours stays
/// queued, the penalty follows once the revoked one is mined).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_close_whose_commitment_the_chain_refuses_is_an_error() {
    let (net, peer, revoked) = paid_twice_with_a_revoked_commitment(91).await;
    net.chain
        .send_raw(&revoked, None)
        .expect("the revoked commitment");
    let err = net
        .rpc(0, "close", json!([peer.node_id.to_string(), "force"]))
        .await
        .expect_err("the chain refuses our commitment");
    assert!(
        err.0 == -113 && err.1.contains("was not accepted by the chain"),
        "{err:?}"
    );
    assert_eq!(state(&net, &peer).await, "on_chain");
}

/// Replaces the process test `a_penalty_that_miners_pass_over_is_bumped_until_it_confirms`:
/// the peer's revoked commitment is mined and the node's penalty is in the mempool, then
/// miners want 30 sat/vB; the node bumps the penalty until it confirms, within the
/// cheater's delay (6 blocks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_penalty_that_miners_pass_over_is_bumped_until_it_confirms() {
    let (net, peer, revoked) = paid_twice_with_a_revoked_commitment(92).await;
    let revoked_txid = revoked.compute_txid();
    net.chain
        .send_raw(&revoked, None)
        .expect("the revoked commitment");
    net.mine(1).await;
    let spends_revoked = |tx: &bitcoin::Transaction| {
        tx.input
            .iter()
            .any(|i| i.previous_output.txid == revoked_txid)
    };
    eventually!(
        net,
        "the penalty in the mempool",
        net.chain
            .with_state(|s| s.mempool_entries().iter().any(|e| spends_revoked(&e.tx)))
    );
    net.chain
        .set_mining_min_fee(Some(bitcoin::FeeRate::from_sat_per_vb_u32(30)));
    let mut penalty = None;
    for _ in 0..60 {
        net.mine(1).await;
        let tip = net.chain.height();
        let block = net
            .chain
            .block_at(tip)
            .await
            .expect("chain")
            .expect("block");
        penalty = block.txdata.into_iter().find(|tx| spends_revoked(tx));
        if penalty.is_some() {
            break;
        }
    }
    let penalty = penalty.expect("the penalty never confirmed");
    let depth = net
        .chain
        .transaction(revoked_txid)
        .await
        .expect("chain")
        .map(|s| s.confirmations);
    assert!(
        depth.is_some_and(|d| d <= 6 + 1),
        "the penalty confirmed {depth:?} blocks after the revoked commitment"
    );
    let input: u64 = penalty
        .input
        .iter()
        .map(|i| {
            revoked.output[i.previous_output.vout as usize]
                .value
                .to_sat()
        })
        .sum();
    let output: u64 = penalty.output.iter().map(|o| o.value.to_sat()).sum();
    let vsize = penalty.vsize() as u64;
    assert!(
        input - output >= 30 * vsize,
        "penalty fee {} for {vsize} vB",
        input - output
    );
    assert_eq!(state(&net, &peer).await, "on_chain");
}
