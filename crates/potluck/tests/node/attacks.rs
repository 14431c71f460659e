//! Attacks on a real `potluck node` over TCP by a scripted peer that lies, floods or
//! stalls (docs/node.md, "Attacks"): each test is a way a peer could take money or
//! freeze the node, and checks that it does not.
//!
//! Only the attacks that need the binary stay here: a restart after `kill -9`, the TCP
//! accept path (slots, pending handshakes), a flood over a real socket. The attacks on
//! the node's policies run in process, in `crates/node/src/attack_tests.rs`.

use crate::support;

use std::time::{Duration, Instant};

use support::channels::{DevChainProc, NodeProc};
use support::peer::ScriptedPeer;
use support::wait_for_blocking;
#[cfg(feature = "test-hooks")]
use wire::Packet;

const ANCHOR_SAT: u64 = 1_000_000;

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
    wait_for_blocking("cheater's funds", Duration::from_secs(60), || {
        (cheater.funds() == 2_000_000).then_some(())
    });
    cheater.cli(&["connect", &victim.listen]);
    cheater.cli(&["open", &victim.id, "1000000"]);
    chain.mine(1);
    wait_for_blocking("cheater's channel live", Duration::from_secs(60), || {
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
    wait_for_blocking(
        "the flooder is disconnected",
        Duration::from_secs(30),
        || (!victim.connected_to(&flooder_id)).then_some(()),
    );

    // Meanwhile a cheater on another channel is still punished.
    let cheat = cheater.cli(&["dev-broadcast-revoked", &victim.id]);
    let revoked = cheat["txid"].as_str().unwrap().to_owned();
    chain.mine(1);
    wait_for_blocking(
        "penalty in the victim's wallet",
        Duration::from_secs(60),
        || {
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
        },
    );
    let started = Instant::now();
    assert!(matches!(victim.cli_within(&["getinfo"], 5), Some(Ok(_))));
    assert!(started.elapsed() < Duration::from_secs(1));
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
    wait_for_blocking(
        "the node closes on chain before expiry",
        Duration::from_secs(10),
        || (node.channel_state() == "on_chain").then_some(()),
    );
    // 95,000 sat outside the HTLC plus the 50,000 in it, less the claims' fees.
    wait_for_blocking("the HTLC claimed with R", Duration::from_secs(90), || {
        chain.mine(1);
        std::thread::sleep(Duration::from_millis(100));
        (node.funds() > 140_000).then_some(())
    });
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
    wait_for_blocking(
        "the node sees the session end",
        Duration::from_secs(30),
        || (!node.connected_to(&peer_id)).then_some(()),
    );
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
    wait_for_blocking(
        "both payments in the wallet after the reorganisation",
        Duration::from_secs(30),
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
    wait_for_blocking("first payment seen", Duration::from_secs(30), || {
        (node.cli(&["listfunds"])["outputs"][0]["confirmations"] == 8).then_some(())
    });
    node.kill9();
    let second = reorganise_from_payment(&chain, &first, &addr);
    node.restart();
    wallet_holds_both(&node, &first, &second);
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
    wait_for_blocking(
        "the channel found suspended at start",
        Duration::from_secs(30),
        || (node.channel()["live"] == false).then_some(()),
    );
    let refused = node.try_cli(&["pay", &peer.node_id.to_string(), "10000000"]);
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("anchor")),
        "{refused:?}"
    );
    chain.mine(1);
    wait_for_blocking("the channel live again", Duration::from_secs(30), || {
        (node.channel()["live"] == true).then_some(())
    });
}
