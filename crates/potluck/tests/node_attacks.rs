//! Attacks on a real `potluck node` over TCP by a scripted peer that lies, floods or
//! stalls (docs/node.md, "Attacks"): each test is a way a peer could take money or
//! freeze the node, and checks that it does not.

mod support;

use std::time::{Duration, Instant};

use support::channels::{wait_for, DevChainProc, NodeProc, StallingProxy};
use support::peer::{Anchor, ScriptedPeer};
use wire::Packet;

const ANCHOR_SAT: u64 = 1_000_000;

/// The node, as acceptor, is sent an anchor that does not back the channel: it must never
/// say `open_complete` nor list the channel as live, and must tell the peer why and drop it.
fn bad_anchor_is_refused(how: Anchor) {
    let chain = DevChainProc::start();
    let node = NodeProc::start_with(&chain, false, &["--anchor-wait-blocks", "4"]);
    let mut peer = ScriptedPeer::connect(&node, 40);
    peer.open_as_funder(&chain, ANCHOR_SAT, how);
    // Deep enough for any min_depth the node asks for, and past its wait for a missing anchor.
    for _ in 0..8 {
        chain.mine(1);
        std::thread::sleep(Duration::from_millis(300));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut error = None;
    while Instant::now() < deadline && error.is_none() {
        match peer.recv(1) {
            Ok(Some(Packet::OpenComplete(_))) => {
                panic!("{how:?}: the node went live on an anchor that does not back the channel")
            }
            Ok(Some(Packet::Error(e))) => error = Some(e.problem.unwrap_or_default()),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let problem = error.unwrap_or_else(|| {
        panic!(
            "{how:?}: no error packet; got {:?}; node log:\n{}",
            peer.received.iter().map(Packet::name).collect::<Vec<_>>(),
            node.log_tail()
        )
    });
    assert!(problem.to_lowercase().contains("anchor"), "{problem}");
    // Never listed as live, not even for a moment later.
    for _ in 0..5 {
        let channels = node.cli(&["listchannels"]);
        for ch in channels["channels"].as_array().unwrap() {
            let state = ch["state"].as_str().unwrap();
            assert!(
                state != "normal" && state != "open_wait_complete",
                "{how:?}: channel still listed as {state}"
            );
        }
        assert_eq!(node.cli(&["getinfo"])["open_channels"], 0);
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn anchor_paying_elsewhere_is_refused() {
    bad_anchor_is_refused(Anchor::PaysElsewhere);
}

#[test]
fn anchor_paying_too_little_is_refused() {
    bad_anchor_is_refused(Anchor::PaysTooLittle);
}

/// Control: the same scripted peer playing fair gets a live channel (so the refusals above
/// are about the anchor, not about the script).
#[test]
fn honest_scripted_funder_goes_live() {
    let chain = DevChainProc::start();
    let node = NodeProc::start(&chain, false);
    let mut peer = ScriptedPeer::connect(&node, 50);
    peer.open_live(&chain, &node, ANCHOR_SAT);
    let ch = node.channel();
    assert_eq!(ch["capacity_sat"], ANCHOR_SAT);
    wait_for("getinfo counts it", 10, || {
        (node.cli(&["getinfo"])["open_channels"] == 1).then_some(())
    });
}

/// A peer floods packets that each need an answer and never reads: it is disconnected, and
/// meanwhile the node keeps answering its owner and still punishes a cheater on another
/// channel (nothing waits on the flooder's queue while holding what others need).
#[cfg(feature = "test-hooks")]
#[test]
fn a_flooding_peer_is_dropped_and_stalls_nobody() {
    let chain = DevChainProc::start();
    let victim = NodeProc::start(&chain, false);
    let cheater = NodeProc::start(&chain, true);
    // The cheater funds a channel to the victim and pays it twice: it holds revoked states.
    let addr = cheater.cli(&["newaddr"])["address"]
        .as_str()
        .unwrap()
        .to_owned();
    chain.send(&addr, 2_000_000);
    chain.mine(1);
    wait_for("cheater's funds", 60, || {
        (cheater.funds() == 2_000_000).then_some(())
    });
    cheater.cli(&["connect", &victim.listen]);
    cheater.cli(&["open", &victim.id, "1000000"]);
    chain.mine(1);
    wait_for("cheater's channel live", 60, || {
        (victim.channel_with(&cheater.id)["state"] == "normal"
            && cheater.channel_state() == "normal")
            .then_some(())
    });
    cheater.cli(&["pay", &victim.id, "100000000"]);
    cheater.cli(&["pay", &victim.id, "50000000"]);

    let mut flooder = ScriptedPeer::connect(&victim, 60);
    flooder.open_live(&chain, &victim, ANCHOR_SAT);
    let flooder_id = flooder.node_id.to_string();
    // The victim answers every open_complete on a live channel; we never read the answers.
    let sent = flooder.flood(
        &Packet::OpenComplete(wire::OpenComplete::default()),
        Duration::from_secs(60),
    );
    eprintln!("flooded {sent} packets");
    let started = Instant::now();
    let info = victim.cli_within(&["getinfo"], 5);
    let took = started.elapsed();
    assert!(
        matches!(info, Some(Ok(_))),
        "getinfo did not answer while a peer floods ({took:?}): {}",
        victim.log_tail()
    );
    assert!(took < Duration::from_secs(1), "getinfo took {took:?}");
    wait_for("the flooder is disconnected", 30, || {
        (!victim.connected_to(&flooder_id)).then_some(())
    });

    // Meanwhile a cheater on another channel is still punished.
    let cheat = cheater.cli(&["dev-broadcast-revoked", &victim.id]);
    let revoked = cheat["txid"].as_str().unwrap().to_owned();
    chain.mine(1);
    wait_for("penalty in the victim's wallet", 60, || {
        chain.mine(1);
        let funds = victim.cli_within(&["listfunds"], 5)?.ok()?;
        funds["outputs"].as_array()?.iter().find(|o| {
            let tx = chain.tx(o["txid"].as_str().unwrap());
            tx["vin"]
                .as_array()
                .unwrap()
                .iter()
                .any(|i| i["txid"] == revoked.as_str())
        })?;
        Some(())
    });
    let started = Instant::now();
    assert!(matches!(victim.cli_within(&["getinfo"], 5), Some(Ok(_))));
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// A peer takes our `close_channel` signature, hangs up, comes back and pays us: had we taken
/// the payment, it could still broadcast the close that predates it. The close must count
/// as possibly broadcast: no update is accepted on that channel, and the close is watched for.
#[test]
fn a_taken_close_signature_blocks_later_updates() {
    let chain = DevChainProc::start();
    let node = NodeProc::start(&chain, false);
    let mut peer = ScriptedPeer::connect(&node, 70);
    peer.open_live(&chain, &node, ANCHOR_SAT);
    peer.pay(200_000_000).unwrap();
    let before = node.channel();
    let owned = before["our_msat"].as_u64().unwrap() + before["our_fee_msat"].as_u64().unwrap();
    assert_eq!(owned, 200_000_000, "{before}");

    // The owner closes; the peer keeps the signature and never answers.
    let peer_id = peer.node_id.to_string();
    let closer = node.cli_in_background(&["close", &peer_id]);
    let close = peer.expect("close", 30);
    let before_close = peer.channel.clone();
    peer.hang_up();
    let answered = closer.join().unwrap();
    assert!(
        !answered.status.success(),
        "the close cannot have completed"
    );

    peer.reconnect(&node);
    // The node says its close again (the peer keeps ignoring it) and refuses the payment.
    peer.expect("close", 30);
    let paid = peer.pay(100_000_000);
    assert!(
        paid.is_err(),
        "the node accepted an update after giving away its close signature: {}",
        node.channel()
    );
    let after = node.channel();
    assert_eq!(after["our_msat"], before["our_msat"], "{after}");
    assert_ne!(after["state"], "normal", "{after}");

    // The peer broadcasts the close it holds: the node sees it and gets exactly its balance.
    let mut holder = before_close;
    let actions = holder.handle_packet(&close, 0).unwrap();
    let tx = actions
        .into_iter()
        .find_map(|a| match a {
            channel::Action::Broadcast(tx) => Some(tx),
            _ => None,
        })
        .expect("the close transaction");
    chain.call(
        "sendrawtransaction",
        serde_json::json!([bitcoin::consensus::encode::serialize_hex(&tx)]),
    );
    chain.mine(1);
    wait_for("the node sees the close", 60, || {
        (node.channel_state() == "closed").then_some(())
    });
    let ours: u64 = tx
        .output
        .iter()
        .map(|o| o.value.to_sat())
        .find(|v| *v <= 200_000 && *v > 190_000)
        .expect("our output in the close");
    wait_for("the close output in the wallet", 30, || {
        (node.funds() == ours).then_some(())
    });
}

/// Issue 28 finding 10: the session drops right after our `close_channel` reached the peer.
/// When the peer comes back, the node says the same `close_channel` again
/// (`Channel::reconnected`), and the close completes: it used to stay in
/// `close_wait_complete` for good, with only `close PEER force` to get out.
#[test]
fn an_interrupted_close_is_said_again_and_completes_after_a_reconnect() {
    let chain = DevChainProc::start();
    let node = NodeProc::start(&chain, false);
    let mut peer = ScriptedPeer::connect(&node, 74);
    peer.open_live(&chain, &node, ANCHOR_SAT);
    peer.pay(200_000_000).unwrap();
    let peer_id = peer.node_id.to_string();
    let closer = node.cli_in_background(&["close", &peer_id]);
    let first = peer.expect("close", 30);
    peer.hang_up();
    assert!(!closer.join().unwrap().status.success());
    assert_eq!(node.channel_state(), "close_wait_complete");
    wait_for("the node sees the session gone", 30, || {
        (!node.connected_to(&peer_id)).then_some(())
    });

    peer.reconnect(&node);
    let again = peer.expect("close", 30);
    assert_eq!(again, first, "the same close, fee and signature");
    // Our machine verifies it, and answers close_channel_complete; the node acks and
    // broadcasts the close.
    peer.handle(&again);
    peer.expect("close_ack", 30);
    wait_for("the channel closed on chain", 60, || {
        chain.mine(1);
        (node.channel_state() == "closed").then_some(())
    });
    // "closed" once both signed; the close confirms in a later block.
    wait_for("our share of the close in the wallet", 30, || {
        chain.mine(1);
        let funds = node.funds();
        (funds > 190_000 && funds <= 200_000).then_some(())
    });
}

/// A peer proposes, takes our `update_accept` (our signature on its next commitment) and
/// then neither signs nor hangs up: past the update deadline the node drops the session,
/// and since the peer does not resume, closes the channel on chain.
#[test]
fn a_stalled_update_drops_the_session_and_closes() {
    let chain = DevChainProc::start();
    let node = NodeProc::start_with(&chain, false, &["--update-timeout-secs", "2"]);
    let mut peer = ScriptedPeer::connect(&node, 80);
    peer.open_live(&chain, &node, ANCHOR_SAT);
    peer.pay(200_000_000).unwrap();
    let actions = peer.channel.pay(100_000_000).unwrap();
    peer.run(actions);
    peer.expect("update_accept", 30);
    // Stall: no update_signature. The node must hang up on us within the deadline.
    let started = Instant::now();
    let mut dropped = false;
    while started.elapsed() < Duration::from_secs(15) {
        match peer.recv(1) {
            Ok(Some(Packet::Error(_))) | Err(_) => {
                dropped = true;
                break;
            }
            _ => {}
        }
    }
    assert!(
        dropped,
        "the node waited for a stalled update: {}",
        node.log_tail()
    );
    // Nobody resumes the update: the channel closes on chain with our valid commitment.
    wait_for("the channel closes on chain", 30, || {
        chain.mine(1);
        (node.channel_state() == "on_chain").then_some(())
    });
}

/// A peer offers us an HTLC, takes our `update_accept` (our signature on its next
/// commitment, the one with the HTLC) and broadcasts that commitment instead of signing
/// ours. The node must recognise it, sweep its output and, given R, claim the HTLC.
#[test]
fn a_broadcast_of_the_commitment_we_accepted_is_claimed() {
    let chain = DevChainProc::start();
    let node = NodeProc::start(&chain, false);
    let mut peer = ScriptedPeer::connect(&node, 100);
    peer.open_live(&chain, &node, ANCHOR_SAT);
    peer.pay(200_000_000).unwrap();
    let r = wire::Preimage([8u8; 32]);
    let expiry = wire::Locktime::Blocks(u32::try_from(chain.height()).unwrap() + 30);
    let actions = peer
        .channel
        .add_htlc(50_000_000, r.hash(), expiry, 0)
        .unwrap();
    peer.run(actions);
    let accept = peer.expect("update_accept", 30);
    // Take the signature; keep our update_signature (and our revocation) to ourselves.
    let _withheld = peer.channel.handle_packet(&accept, 0).unwrap();
    let theirs = peer.channel.signed_commitment().unwrap();
    assert_eq!(
        theirs.output.len(),
        3,
        "ours, theirs and the HTLC: {theirs:?}"
    );
    chain.call(
        "sendrawtransaction",
        serde_json::json!([bitcoin::consensus::encode::serialize_hex(&theirs)]),
    );
    chain.mine(1);
    wait_for("the node sees the peer's commitment", 30, || {
        (node.channel_state() == "on_chain").then_some(())
    });
    // The owner learns R (the payment it was for): the HTLC is claimed on chain.
    node.cli(&["fulfillhtlc", &peer.node_id.to_string(), &hex::encode(r.0)]);
    wait_for("our output and the HTLC in the wallet", 60, || {
        chain.mine(1);
        std::thread::sleep(Duration::from_millis(100));
        // 195,000 sat outside the HTLC plus 50,000 in it, less the claim's fee.
        (node.funds() > 240_000).then_some(())
    });
}

/// Our peer's connection went half-open (its side vanished without a FIN): its new
/// authenticated session must replace the old one instead of being refused as a duplicate.
#[test]
fn a_new_session_replaces_a_half_open_one() {
    let chain = DevChainProc::start();
    let node = NodeProc::start(&chain, false);
    let mut peer = ScriptedPeer::connect(&node, 110);
    peer.open_live(&chain, &node, ANCHOR_SAT);
    let _half_open = peer.reconnect_keep_old(&node);
    peer.pay(10_000_000)
        .unwrap_or_else(|e| panic!("the new session was refused: {e}"));
    let ch = node.channel();
    assert_eq!(
        ch["our_msat"].as_u64().unwrap() + ch["our_fee_msat"].as_u64().unwrap(),
        10_000_000
    );
}

/// Our payment crosses the peer's HTLC on the wire; the peer has priority, so ours is deferred,
/// and we decline its HTLC (expiry beyond our limit). The owner's `pay` must get a definite
/// answer soon — here: paid, exactly once — never a silent loss or a second payment.
#[test]
fn a_crossed_proposal_ends_in_one_payment() {
    let chain = DevChainProc::start();
    let node = NodeProc::start(&chain, false);
    let mut peer = ScriptedPeer::connect(&node, 120);
    peer.open_live(&chain, &node, ANCHOR_SAT);
    // Two updates: priority toggles twice, back to the funder (the peer).
    peer.pay(100_000_000).unwrap();
    peer.pay(100_000_000).unwrap();
    assert!(peer.channel.has_priority());

    let peer_id = peer.node_id.to_string();
    let started = Instant::now();
    let pay = node.cli_in_background(&["pay", &peer_id, "50000000"]);
    // The node's proposal is on the wire; ours leaves before we read it: they cross.
    let theirs = peer.expect("update", 30);
    let far = wire::Locktime::Blocks(u32::try_from(chain.height()).unwrap() + 5_000);
    let actions = peer
        .channel
        .add_htlc(1_000_000, wire::Preimage([9; 32]).hash(), far, 0)
        .unwrap();
    peer.run(actions);
    peer.handle(&theirs);
    peer.answer_all(3);
    let out = pay.join().unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "pay answered only after {took:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Paid once: 200,000 sat less 50,000, and the peer's machine agrees.
    let ch = node.channel();
    let ours = ch["our_msat"].as_u64().unwrap() + ch["our_fee_msat"].as_u64().unwrap();
    assert_eq!(ours, 150_000_000, "{ch}");
    assert_eq!(
        peer.channel.balances().unwrap().theirs.total_msat(),
        150_000_000
    );
    assert!(ch["htlcs"].as_array().unwrap().is_empty(), "{ch}");
}

/// A live channel in which the peer has paid the node 100,000 sat and offered it an HTLC of
/// 50,000 sat with R = `[r_byte; 32]`, expiring 20 blocks from now.
fn offered_htlc(
    chain: &DevChainProc,
    node: &NodeProc,
    seed: u8,
    r_byte: u8,
) -> (ScriptedPeer, wire::Preimage, u32) {
    let mut peer = ScriptedPeer::connect(node, seed);
    peer.open_live(chain, node, ANCHOR_SAT);
    peer.pay(100_000_000).unwrap();
    let r = wire::Preimage([r_byte; 32]);
    let expiry = u32::try_from(chain.height()).unwrap() + 20;
    let actions = peer
        .channel
        .add_htlc(50_000_000, r.hash(), wire::Locktime::Blocks(expiry), 0)
        .unwrap();
    peer.run(actions);
    peer.answer_all(2);
    assert_eq!(node.channel()["htlcs"].as_array().unwrap().len(), 1);
    (peer, r, expiry)
}

/// Mines to 6 blocks before `expiry` (our claim delay): the node must be on chain by then,
/// and then claim the HTLC of [`offered_htlc`] with R.
fn claimed_with_r_before_expiry(chain: &DevChainProc, node: &NodeProc, expiry: u32) {
    while u32::try_from(chain.height()).unwrap() < expiry - 6 {
        chain.mine(1);
        std::thread::sleep(Duration::from_millis(300));
    }
    wait_for("the node closes on chain before expiry", 10, || {
        (node.channel_state() == "on_chain").then_some(())
    });
    // 95,000 sat outside the HTLC plus the 50,000 in it, less the claims' fees.
    wait_for("the HTLC claimed with R", 90, || {
        chain.mine(1);
        std::thread::sleep(Duration::from_millis(100));
        (node.funds() > 140_000).then_some(())
    });
}

/// Sends `sat` to a fresh address of the node's wallet and waits until it is spendable.
fn fund_wallet(chain: &DevChainProc, node: &NodeProc, sat: u64) {
    let addr = node.cli(&["newaddr"])["address"]
        .as_str()
        .unwrap()
        .to_owned();
    chain.send(&addr, sat);
    chain.mine(1);
    wait_for("the node's funds", 30, || {
        (node.cli(&["listfunds"])["spendable_sat"] == sat).then_some(())
    });
}

/// The peer reads our `update_fulfill_htlc` (it has R now: it can take the payment
/// upstream) and hangs up before accepting it. The HTLC is still in every commitment; the
/// node must still claim it with R before it expires, as when the peer merely stalls.
#[test]
fn an_htlc_whose_r_the_peer_took_and_hung_up_is_claimed_on_chain_before_expiry() {
    let chain = DevChainProc::start();
    let node = NodeProc::start(&chain, false);
    let (mut peer, r, expiry) = offered_htlc(&chain, &node, 131, 12);
    let peer_id = peer.node_id.to_string();
    let r_hex = hex::encode(r.0);
    let fulfill = node.cli_in_background(&["fulfillhtlc", &peer_id, &r_hex]);
    peer.expect("update_fulfill_htlc", 30);
    peer.hang_up();
    let out = fulfill.join().unwrap();
    assert!(!out.status.success());
    wait_for("the node sees the session end", 30, || {
        (!node.connected_to(&peer.node_id.to_string())).then_some(())
    });
    claimed_with_r_before_expiry(&chain, &node, expiry);
}

/// The peer offers an HTLC and goes away before the owner has R. The owner learns R
/// later (its payer upstream may hold it by now) and runs `fulfillhtlc` while the peer is
/// gone: the call is refused (-9), and R must be kept on disk, so that even across a
/// `kill -9` and a restart the node closes on chain before the HTLC expires and claims it
/// with R. The refusal used to drop R, and docs/node.md's remedy for a crash (run
/// `fulfillhtlc` again after the restart) met the same refusal: the peer, back after
/// expiry, would take the HTLC by timeout.
#[test]
fn an_htlc_fulfilled_while_the_peer_is_gone_is_claimed_on_chain_across_a_restart() {
    let chain = DevChainProc::start();
    let mut node = NodeProc::start(&chain, false);
    let (mut peer, r, expiry) = offered_htlc(&chain, &node, 133, 13);
    let peer_id = peer.node_id.to_string();
    peer.hang_up();
    wait_for("the node sees the session end", 30, || {
        (!node.connected_to(&peer_id)).then_some(())
    });
    let err = node
        .try_cli(&["fulfillhtlc", &peer_id, &hex::encode(r.0)])
        .unwrap_err();
    assert!(err.contains("-9") && err.contains("R is kept"), "{err}");
    // Nothing of the channel changed but R: the HTLC is still pending.
    assert_eq!(node.channel()["htlcs"].as_array().unwrap().len(), 1);
    node.kill9();
    node.restart();
    claimed_with_r_before_expiry(&chain, &node, expiry);
}

/// Our `open`: the peer answers `open_channel`, lets the node build and sign its anchor
/// (the wallet outputs it spends are reserved), then never sends `open_commit_sig`. The
/// call times out; the outputs must not stay reserved while the peer keeps the session.
#[test]
fn an_open_the_peer_stalls_frees_the_reserved_funds() {
    let chain = DevChainProc::start();
    let node = NodeProc::start(&chain, false);
    fund_wallet(&chain, &node, 1_000_000);
    let mut peer = ScriptedPeer::connect(&node, 132);
    peer.accept_role();
    let peer_id = peer.node_id.to_string();
    let open = node.cli_in_background(&["open", &peer_id, "500000"]);
    let pkt = peer.expect("open", 30);
    let ours = peer.channel.start().unwrap();
    peer.run(ours);
    peer.handle(&pkt);
    peer.expect("open_anchor", 30);
    wait_for("the anchor's outputs reserved", 30, || {
        (node.cli(&["listfunds"])["spendable_sat"] == 0).then_some(())
    });
    let out = open.join().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains("-108"), "{err}");
    wait_for("the stalled opening abandoned", 30, || {
        (node.cli(&["listfunds"])["spendable_sat"] == 1_000_000).then_some(())
    });
    assert_eq!(
        node.cli(&["listchannels"])["channels"],
        serde_json::json!([])
    );
    assert!(!node.connected_to(&peer_id));
}

/// Reorganises the chain from the block holding `txid`'s payment: that block and the ones
/// after it are replaced by a longer branch whose first block also holds `second`. Returns
/// `second`'s txid.
fn reorganise_from_payment(chain: &DevChainProc, txid: &str, addr: &str) -> String {
    let block = chain.tx(txid)["blockhash"].as_str().unwrap().to_owned();
    let depth = chain.tx(txid)["confirmations"].as_u64().unwrap();
    chain.call("invalidateblock", serde_json::json!([block]));
    let second = chain.send(addr, 50_000);
    chain.mine(u32::try_from(depth).unwrap() + 1);
    second
}

/// Waits until the wallet holds exactly the two payments (the first, mined again on the
/// new branch, counted once).
fn wallet_holds_both(node: &NodeProc, first: &str, second: &str) {
    wait_for(
        "both payments in the wallet after the reorganisation",
        30,
        || {
            let funds = node.cli(&["listfunds"]);
            let outs = funds["outputs"].as_array()?;
            let has = |t: &str, sat: u64| {
                outs.iter()
                    .any(|o| o["txid"] == t && o["amount_sat"] == sat)
            };
            (has(first, 100_000) && has(second, 50_000) && funds["total_sat"] == 150_000)
                .then_some(())
        },
    );
}

/// The same reorganisation while the node is stopped: at start it finds the fork point
/// from the block hashes it stored, not from a last hash kept in memory.
#[test]
fn a_reorganisation_while_stopped_is_found_at_start() {
    let chain = DevChainProc::start();
    let mut node = NodeProc::start(&chain, false);
    let addr = node.cli(&["newaddr"])["address"]
        .as_str()
        .unwrap()
        .to_owned();
    let first = chain.send(&addr, 100_000);
    chain.mine(8);
    wait_for("first payment seen", 30, || {
        (node.cli(&["listfunds"])["outputs"][0]["confirmations"] == 8).then_some(())
    });
    node.kill9();
    let second = reorganise_from_payment(&chain, &first, &addr);
    node.restart();
    wallet_holds_both(&node, &first, &second);
}

/// Strangers open channels they never fund: past the cap on openings waiting for a peer's
/// anchor, the next one is refused (nothing is stored or signed for it).
#[test]
fn openings_waiting_for_an_anchor_are_capped() {
    let chain = DevChainProc::start();
    let node = NodeProc::start_with(&chain, false, &["--max-pending-openings", "2"]);
    let mut waiting = Vec::new();
    for seed in [140, 141] {
        let mut peer = ScriptedPeer::connect(&node, seed);
        peer.open_as_funder(&chain, ANCHOR_SAT, Anchor::DoesNotExist);
        waiting.push(peer);
    }
    let mut third = ScriptedPeer::connect(&node, 142);
    match third.start_open(ANCHOR_SAT) {
        Ok(Some(Packet::Error(e))) => {
            let problem = e.problem.unwrap_or_default();
            assert!(problem.contains("waiting for"), "{problem}");
        }
        other => panic!("a third unfunded opening was taken: {other:?}"),
    }
    assert_eq!(
        node.cli(&["listchannels"])["channels"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

/// Strangers take every connection slot: the node can still dial out (the operator's
/// `connect`), since a share of the slots is kept for our own dials and for peers we have
/// channels with.
#[test]
fn strangers_cannot_take_every_connection_slot() {
    let chain = DevChainProc::start();
    let node = NodeProc::start_with(&chain, false, &["--max-peers", "5"]);
    let other = NodeProc::start(&chain, false);
    let mut strangers = Vec::new();
    for seed in 150..160u8 {
        // Kept only if the node keeps it: a refused one fails the handshake, or hears an
        // error or a hang-up right after it.
        if let Some(mut s) = ScriptedPeer::try_connect(&node, seed) {
            if matches!(s.recv(1), Ok(None)) {
                strangers.push(s);
            }
        }
    }
    assert!(
        strangers.len() < 5,
        "strangers hold all {} slots",
        strangers.len()
    );
    let connected = node.try_cli(&["connect", &other.listen]);
    assert!(
        connected.is_ok(),
        "our own dial found no slot: {connected:?}"
    );
}

/// A TCP connection to the node from `source` that says nothing. Every 127.0.0.0/8 address
/// is loopback on Linux, so tests can come from as many sources as they like.
fn silent_connection(node: &NodeProc, source: [u8; 4]) -> std::net::TcpStream {
    let target: std::net::SocketAddr = node.listen.parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(std::net::SocketAddr::from((source, 0)))
            .unwrap();
        socket.connect(target).await.unwrap().into_std().unwrap()
    });
    stream.set_nonblocking(false).unwrap();
    stream
}

/// Whether the node started a handshake on `conn`: it writes its 33-byte session key at
/// once, while a connection it refuses is closed with nothing written.
fn handshake_started(conn: &mut std::net::TcpStream) -> bool {
    use std::io::Read as _;
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut key = [0u8; 33];
    conn.read_exact(&mut key).is_ok()
}

/// How long the node takes to close `conn` (it reads EOF or a reset), if within `secs`.
fn closed_within(conn: &mut std::net::TcpStream, secs: u64) -> Option<Duration> {
    use std::io::Read as _;
    let started = Instant::now();
    conn.set_read_timeout(Some(Duration::from_secs(secs)))
        .unwrap();
    let mut buf = [0u8; 64];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return Some(started.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None
            }
            Err(_) => return Some(started.elapsed()),
        }
    }
}

/// Issue 28 finding 9: connections that never finish their handshake (here: never say a
/// word) must not take the peer slots. With `--max-peers 10`, ten silent connections made
/// the owner's `connect` fail with -101 "too many peers", although a fifth of the slots is
/// kept for our own dials: the handshake held a slot before the peer was even known.
#[test]
fn half_open_handshakes_take_no_peer_slot() {
    let chain = DevChainProc::start();
    let node = NodeProc::start_with(&chain, false, &["--max-peers", "10"]);
    let other = NodeProc::start(&chain, false);
    // Ten from one source, as seen in the review, and ten from ten sources (each within
    // any per-source bound): none of them is a peer yet.
    let mut silent: Vec<std::net::TcpStream> = (0..10)
        .map(|_| silent_connection(&node, [127, 0, 0, 9]))
        .collect();
    silent.extend((0..10u8).map(|i| silent_connection(&node, [127, 0, 1, 10 + i])));
    std::thread::sleep(Duration::from_millis(500));
    let connected = node.try_cli(&["connect", &other.listen]);
    assert!(
        connected.is_ok(),
        "our own dial found no slot while strangers only held half-open handshakes: {connected:?}"
    );
    // An honest stranger (127.0.0.1, a source that is not flooding) still gets its session.
    let honest = ScriptedPeer::try_connect(&node, 180);
    assert!(
        honest.is_some(),
        "an honest stranger was refused: {}",
        node.log_tail()
    );
    drop(silent);
}

/// Pending handshakes are bounded per source address and in total, and a connection that
/// does not finish its handshake within `--handshake-timeout-secs` is closed.
#[test]
fn pending_handshakes_are_bounded_per_source_and_in_total() {
    let chain = DevChainProc::start();
    let node = NodeProc::start_with(
        &chain,
        false,
        &[
            "--max-pending-handshakes",
            "3",
            "--max-pending-handshakes-per-ip",
            "2",
            "--handshake-timeout-secs",
            "2",
        ],
    );
    let mut a1 = silent_connection(&node, [127, 0, 0, 1]);
    let mut a2 = silent_connection(&node, [127, 0, 0, 1]);
    assert!(handshake_started(&mut a1) && handshake_started(&mut a2));
    let mut a3 = silent_connection(&node, [127, 0, 0, 1]);
    assert!(
        !handshake_started(&mut a3),
        "a third pending handshake from one source was taken"
    );
    let mut b1 = silent_connection(&node, [127, 0, 0, 2]);
    assert!(handshake_started(&mut b1), "another source was refused");
    let mut c1 = silent_connection(&node, [127, 0, 0, 3]);
    assert!(
        !handshake_started(&mut c1),
        "a fourth pending handshake in total was taken"
    );
    // The time-out closes the silent ones; then the sources may come again.
    for conn in [&mut a1, &mut a2, &mut b1] {
        let took = closed_within(conn, 10);
        assert!(
            took.is_some_and(|t| t < Duration::from_secs(4)),
            "a silent connection was kept past the handshake time-out: {took:?}"
        );
    }
    let honest = ScriptedPeer::try_connect(&node, 181);
    assert!(
        honest.is_some(),
        "refused after the pending ones timed out: {}",
        node.log_tail()
    );
}

/// Copies everything `from` sends to `to` until either side closes.
fn pump(mut from: std::net::TcpStream, mut to: std::net::TcpStream) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let copied = std::io::copy(&mut from, &mut to);
        eprintln!("pump ended: {copied:?}");
        let _ = to.shutdown(std::net::Shutdown::Both);
    })
}

/// Whether the node lists itself as a connected peer, or ever logged a session with itself.
fn node_talked_to_itself(node: &NodeProc) -> bool {
    let listed = node.cli(&["listpeers"])["peers"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["node_id"] == node.id.as_str());
    let log = std::fs::read_to_string(node.dir.path().join("log1.txt")).unwrap_or_default();
    let logged = log
        .lines()
        .any(|l| l.contains("peer connected") && l.contains(&node.id));
    listed || logged
}

/// Issue 28 finding 11: a peer that sends the node's own session key back and echoes its
/// frames gets no session of the node with itself (the dial path refused one; the accept
/// path did not).
#[test]
fn an_echoing_peer_gets_no_session_with_the_node_itself() {
    let chain = DevChainProc::start();
    let node = NodeProc::start(&chain, false);
    let conn = silent_connection(&node, [127, 0, 0, 1]);
    let echo = pump(conn.try_clone().unwrap(), conn);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !node_talked_to_itself(&node),
        "the node holds a session with itself: {}",
        node.log_tail()
    );
    echo.join().unwrap();
}

/// The same with two connections wired into each other: each hears the other's session
/// key, so the node authenticates to itself with two different session keys (no echo for
/// the handshake to notice). Only the node id tells: the accept path must refuse it.
#[test]
fn a_session_relayed_back_to_the_node_is_refused() {
    let chain = DevChainProc::start();
    let node = NodeProc::start(&chain, false);
    let a = silent_connection(&node, [127, 0, 0, 1]);
    let b = silent_connection(&node, [127, 0, 0, 2]);
    let ab = pump(a.try_clone().unwrap(), b.try_clone().unwrap());
    let ba = pump(b, a);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !node_talked_to_itself(&node),
        "the node holds a session with itself: {}",
        node.log_tail()
    );
    let log = std::fs::read_to_string(node.dir.path().join("log1.txt")).unwrap_or_default();
    assert!(
        log.lines().any(|l| l.contains("our own node key")),
        "no clear log line: {}",
        node.log_tail()
    );
    // Both connections were closed by the node.
    ab.join().unwrap();
    ba.join().unwrap();
}

/// The seed's versioning rule: an unknown odd field is optional. A `pkt` whose only member is
/// one (a packet of a newer version) is ignored, and the session goes on.
#[test]
fn a_pkt_with_only_an_unknown_odd_field_is_ignored() {
    let chain = DevChainProc::start();
    let node = NodeProc::start(&chain, false);
    let mut peer = ScriptedPeer::connect(&node, 160);
    peer.open_live(&chain, &node, ANCHOR_SAT);
    // Field 1001 (odd), varint 1.
    peer.send_payload(&[0xc8, 0x3e, 0x01]);
    peer.pay(10_000_000)
        .unwrap_or_else(|e| panic!("the session did not survive the unknown odd field: {e}"));
}

/// A frame whose MAC is good but whose padding is not zeros: the keystreams are still in step,
/// so the peer is told why before the node hangs up.
#[test]
fn a_frame_with_non_zero_padding_gets_an_error_farewell() {
    let chain = DevChainProc::start();
    let node = NodeProc::start(&chain, false);
    let mut peer = ScriptedPeer::connect(&node, 170);
    peer.send_badly_padded(&Packet::OpenComplete(wire::OpenComplete::default()).encode());
    match peer.recv(10) {
        Ok(Some(Packet::Error(e))) => {
            let problem = e.problem.unwrap_or_default();
            assert!(problem.contains("padding"), "{problem}");
        }
        other => panic!("no farewell: {other:?}"),
    }
}

/// Invalidates the block holding the channel's anchor: the chain falls back to its parent
/// and the anchor returns to the mempool. Returns the anchor's txid.
fn reorganise_anchor_out(chain: &DevChainProc, node: &NodeProc) -> String {
    let anchor = node.channel()["anchor_txid"].as_str().unwrap().to_owned();
    let block = chain.tx(&anchor)["blockhash"].as_str().unwrap().to_owned();
    chain.call("invalidateblock", serde_json::json!([block]));
    anchor
}

/// The peer funds the anchor from its own coin, pays us over the live channel, then
/// double-spends that coin in a reorganisation: the anchor can never confirm, so the
/// channel (and the payment in it) is over: it is not live, nothing more is accepted or
/// proposed on it, and it does not count as open.
#[test]
fn a_double_spent_anchor_ends_a_live_channel() {
    let chain = DevChainProc::start();
    let node = NodeProc::start(&chain, false);
    let mut peer = ScriptedPeer::connect(&node, 63);
    peer.open_live_with(&chain, &node, ANCHOR_SAT, Anchor::OwnCoin);
    peer.pay(200_000_000).unwrap();

    let anchor = reorganise_anchor_out(&chain, &node);
    let conflict = peer.double_spend_anchor(&chain);
    chain.mine(2);
    assert_eq!(chain.tx(&conflict)["confirmations"], 2);
    assert!(chain
        .call("getrawmempool", serde_json::json!([]))
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t != anchor.as_str()));
    let peer_id = peer.node_id.to_string();
    wait_for("the channel ended", 30, || {
        let ch = node.channel_with(&peer_id);
        let ended = ch.is_null()
            || (ch["live"] == false
                && ch["state"] != "normal"
                && ch["state"] != "open_wait_complete");
        (ended && node.cli(&["getinfo"])["open_channels"] == 0).then_some(())
    });
    let refused = node.try_cli(&["pay", &peer_id, "10000000"]);
    assert!(
        refused.is_err(),
        "the node proposed on a dead channel: {refused:?}"
    );
    wait_for("the peer's session dropped", 30, || {
        (!node.connected_to(&peer_id)).then_some(())
    });
    peer.reconnect(&node);
    assert!(
        peer.pay(50_000_000).is_err(),
        "the node accepted an update on a channel whose anchor was double-spent"
    );
    assert_eq!(node.cli(&["getinfo"])["open_channel_balance_msat"], 0);
}

/// Strangers that come, open a channel they never fund, and go leave nothing behind: the
/// peer list forgets them, the abandoned openings stop being watched (their final keys
/// leave the watched scripts, also after a restart), while a peer with a live channel
/// stays listed after it disconnects.
#[test]
fn strangers_that_leave_are_forgotten_with_their_openings() {
    let chain = DevChainProc::start();
    let mut node = NodeProc::start(&chain, false);
    let mut friend = ScriptedPeer::connect(&node, 170);
    friend.open_live(&chain, &node, ANCHOR_SAT);
    let baseline = node.cli(&["getinfo"])["watched_scripts"].as_u64().unwrap();
    let listed = |node: &NodeProc, id: &str| {
        node.cli(&["listpeers"])["peers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["node_id"] == id)
    };
    let mut gone = Vec::new();
    for seed in 171..175u8 {
        let mut s = ScriptedPeer::connect(&node, seed);
        if seed % 2 == 1 {
            // Opens (the node answers with its own open and a fresh key), then vanishes.
            assert!(matches!(
                s.start_open(ANCHOR_SAT),
                Ok(Some(Packet::Open(_)))
            ));
        }
        gone.push(s.node_id.to_string());
        s.hang_up();
    }
    wait_for("the strangers forgotten", 30, || {
        gone.iter().all(|id| !listed(&node, id)).then_some(())
    });
    wait_for("their openings unwatched", 30, || {
        (node.cli(&["getinfo"])["watched_scripts"].as_u64().unwrap() == baseline).then_some(())
    });
    assert_eq!(
        node.cli(&["listchannels"])["channels"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    let friend_id = friend.node_id.to_string();
    friend.hang_up();
    wait_for("the friend disconnected", 30, || {
        (!node.connected_to(&friend_id)).then_some(())
    });
    assert!(listed(&node, &friend_id), "a peer with a channel is kept");

    node.kill9();
    node.restart();
    assert_eq!(
        node.cli(&["getinfo"])["watched_scripts"].as_u64().unwrap(),
        baseline,
        "abandoned openings are not watched again after a restart"
    );
}

/// The same reorganisation while the node is stopped: at start the channel is found
/// suspended, and goes live again once the anchor reconfirms.
#[test]
fn a_live_channel_whose_anchor_left_while_the_node_was_down_is_suspended_at_start() {
    let chain = DevChainProc::start();
    let mut node = NodeProc::start(&chain, false);
    let mut peer = ScriptedPeer::connect(&node, 64);
    peer.open_live(&chain, &node, ANCHOR_SAT);
    peer.pay(100_000_000).unwrap();
    let anchor = node.channel()["anchor_txid"].as_str().unwrap().to_owned();
    node.kill9();
    let block = chain.tx(&anchor)["blockhash"].as_str().unwrap().to_owned();
    chain.call("invalidateblock", serde_json::json!([block]));
    node.restart();
    wait_for("the channel found suspended at start", 30, || {
        (node.channel()["live"] == false).then_some(())
    });
    let refused = node.try_cli(&["pay", &peer.node_id.to_string(), "10000000"]);
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("anchor")),
        "{refused:?}"
    );
    chain.mine(1);
    wait_for("the channel live again", 30, || {
        (node.channel()["live"] == true).then_some(())
    });
}

/// bitcoind hangs (connections open, nothing answered) while the peer offers an HTLC: the
/// node asks the chain for its height to check the HTLC's expiry. That question must not
/// hold the channel: the owner's control calls on it answer at once, and the HTLC is
/// still accepted (against the height of the last block seen) instead of waiting out the
/// RPC's 30-second time-out.
#[test]
fn a_hung_bitcoind_does_not_hold_the_channel_while_an_htlc_arrives() {
    let chain = DevChainProc::start();
    let proxy = StallingProxy::start(&chain.url);
    let node = NodeProc::start_via(&chain, &proxy.url, false, &[]);
    let mut peer = ScriptedPeer::connect(&node, 120);
    peer.open_live(&chain, &node, ANCHOR_SAT);
    peer.pay(200_000_000).unwrap();
    let expiry = wire::Locktime::Blocks(u32::try_from(chain.height()).unwrap() + 30);
    proxy.stall(true);
    let actions = peer
        .channel
        .add_htlc(10_000_000, wire::Preimage([5u8; 32]).hash(), expiry, 0)
        .unwrap();
    peer.run(actions);
    std::thread::sleep(Duration::from_millis(500));
    let asked = Instant::now();
    let peers = node.cli(&["listpeers"]);
    let waited = asked.elapsed();
    assert!(
        waited < Duration::from_secs(3),
        "listpeers waited {waited:?} for the channel behind a hung chain RPC"
    );
    assert_eq!(peers["peers"].as_array().map(Vec::len), Some(1), "{peers}");
    // The update goes through with the chain still hung.
    let accept = peer.expect("update_accept", 10);
    peer.handle(&accept);
    peer.answer_update();
    proxy.stall(false);
    wait_for("the HTLC on the node's side", 30, || {
        (node.channel()["htlcs"].as_array().map(Vec::len) == Some(1)).then_some(())
    });
}

/// The peer offers an HTLC locked to the revocation hash it sends in the same packet: had
/// the node signed it, the peer's revoked commitment would carry an output our penalty
/// cannot take, and the whole penalty would be refused by relay policy. The node refuses
/// the packet, hangs up, and its channel holds no HTLC; its own `newhtlc` with the peer's
/// revocation hash is refused too.
#[test]
fn an_htlc_locked_to_a_revocation_hash_is_refused_both_ways() {
    let chain = DevChainProc::start();
    let node = NodeProc::start(&chain, false);
    let mut peer = ScriptedPeer::connect(&node, 141);
    peer.open_live(&chain, &node, ANCHOR_SAT);
    peer.pay(300_000_000).unwrap();
    let expiry = u32::try_from(chain.height()).unwrap() + 100;
    let actions = peer
        .channel
        .add_htlc(
            50_000_000,
            wire::Preimage([5; 32]).hash(),
            wire::Locktime::Blocks(expiry),
            0,
        )
        .unwrap();
    let Some(channel::Action::Send(wire::Packet::UpdateAddHtlc(mut add))) =
        actions.into_iter().next()
    else {
        panic!("update_add_htlc expected");
    };
    add.r_hash = add.revocation_hash;
    peer.send(&wire::Packet::UpdateAddHtlc(add));
    let answer = peer.recv(10);
    match answer {
        Ok(Some(wire::Packet::Error(e))) => assert!(
            e.problem
                .as_deref()
                .unwrap_or("")
                .contains("revocation hash"),
            "{e:?}"
        ),
        other => panic!("the node accepted a poisoned HTLC: {other:?}"),
    }
    assert!(node.channel()["htlcs"].as_array().unwrap().is_empty());
    assert_eq!(node.channel_state(), "normal");
    // Our side: the peer's current revocation hash as an HTLC hash is refused.
    peer.reconnect(&node);
    wait_for("the peer is back", 10, || {
        (node.cli(&["listpeers"])["peers"][0]["connected"] == true).then_some(())
    });
    use bitcoin::hashes::Hash as _;
    let n = peer.channel.commitment_number();
    let theirs = channel::shachain::revocation_hash_from_seed(&peer.secrets.revocation_seed, n);
    let err = node
        .try_cli(&[
            "newhtlc",
            &peer.node_id.to_string(),
            "50000000",
            &hex::encode(theirs.to_byte_array()),
            &expiry.to_string(),
        ])
        .expect_err("newhtlc locked to the peer's revocation hash");
    assert!(err.contains("revocation hash"), "{err}");
}
