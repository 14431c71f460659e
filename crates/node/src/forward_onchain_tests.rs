//! Issue 30's "On chain" in process: B (node 1) forwards A's (node 0) payment to C, played
//! by hand ([`ScriptedPeer`]) so that it can hold the HTLC, close and claim as each test
//! needs. B reads R from C's claim on chain and settles with A; lets a downstream HTLC time
//! out on chain and fails upstream only once its refund is confirmed; claims upstream on
//! chain before the expiry when A goes silent after C was paid; and does so in time at the
//! smallest expiry delta it accepts. Two of them restart B mid-resolution.

use bitcoin::hashes::Hash as _;
use bitcoin::{Amount, OutPoint, Transaction};
use chain::Chain as _;
use channel::Action;
use secp256k1::{PublicKey, Secp256k1, SecretKey};
use wire::{Locktime, Preimage};

use crate::control_error::ControlError;
use crate::forward_tests::{first_forward_state, regtest, settled, side, FEE};
use crate::harness::{create_network, eventually, Network, ScriptedPeer};
use crate::manager::Command;

/// A (0) – B (1), funded by A; B – C, funded by C (node key `[seed; 32]`), which pays B
/// 10,000 sat so that B owns something to forward.
async fn line_to_scripted(seed: u8, tweak: fn(&mut crate::NodeConfig)) -> (Network, ScriptedPeer) {
    let net = create_network(2, tweak).await;
    net.open_channel(0, 1, 500_000).await;
    let mut c = net.scripted_peer(1, seed).await;
    c.open_live(&net, 1_000_000).await;
    c.pay(10_000_000).await.expect("C pays B");
    (net, c)
}

/// A pays C 2,000,000 msat through B for `r`'s hash, and C takes the HTLC and holds it.
/// Returns the expiries of the downstream HTLC and the upstream one.
async fn c_holds(net: &Network, c: &mut ScriptedPeer, r: Preimage) -> (u32, u32) {
    net.nodes[0]
        .manager
        .pay_route(&[net.id(1), c.node_id], r.hash(), 2_000_000)
        .await
        .expect("accepted by B");
    hold(net, c).await
}

/// C takes B's HTLC and holds it (see [`c_holds`]).
async fn hold(net: &Network, c: &mut ScriptedPeer) -> (u32, u32) {
    let add = c.expect(net, "update_add_htlc").await;
    c.handle(&add).await;
    c.until_normal().await.expect("C holds the HTLC");
    let id = c.node_id;
    eventually!(net, "B's channel with C idle, holding the HTLC", {
        let ch = net.channel_json(1, &id).await;
        ch["state"] == "normal" && ch["htlcs"].as_array().is_some_and(|h| h.len() == 1)
    });
    (
        htlc_expiry(net, &id).await,
        htlc_expiry(net, &net.id(0)).await,
    )
}

/// The expiry of the one HTLC in B's channel with `peer`.
async fn htlc_expiry(net: &Network, peer: &PublicKey) -> u32 {
    let slot = net.nodes[1]
        .manager
        .channels
        .latest(peer)
        .expect("a channel");
    let inner = slot.lock().await;
    let cs = inner.channel.balances().expect("balances");
    let h = cs.ours.htlcs.iter().chain(&cs.theirs.htlcs).next();
    match h.expect("an HTLC").expiry {
        Locktime::Blocks(b) => b,
        Locktime::Seconds(s) => panic!("an expiry in seconds: {s}"),
    }
}

/// B's own balance (fee share included) in its channel with `peer`.
async fn b_owns(net: &Network, peer: &PublicKey) -> u64 {
    let slot = net.nodes[1]
        .manager
        .channels
        .latest(peer)
        .expect("a channel");
    let inner = slot.lock().await;
    let cs = inner.channel.balances().expect("balances");
    cs.ours.pay_msat + cs.ours.fee_msat
}

/// Whether B's channel with `peer` is on chain.
async fn on_chain(net: &Network, peer: &PublicKey) -> bool {
    net.channel_json(1, peer).await["state"] == "on_chain"
}

/// The first transaction in the blocks from `from` to the tip that `hit` picks, with its height.
async fn find_tx(
    net: &Network,
    from: u32,
    hit: impl Fn(&Transaction) -> bool,
) -> Option<(u32, Transaction)> {
    for h in from..=net.chain.height() {
        let block = net
            .chain
            .block_at(h)
            .await
            .expect("chain")
            .expect("a block");
        if let Some(tx) = block.txdata.into_iter().find(|tx| hit(tx)) {
            return Some((h, tx));
        }
    }
    None
}

fn spends(tx: &Transaction, op: OutPoint) -> bool {
    tx.input.iter().any(|i| i.previous_output == op)
}

fn reveals(tx: &Transaction, r: Preimage) -> bool {
    tx.input
        .iter()
        .any(|i| i.witness.iter().any(|e| e == r.0.as_slice()))
}

/// Whether every output of `tx` pays node `i`'s wallet.
fn pays_wallet_of(net: &Network, i: usize, tx: &Transaction) -> bool {
    tx.output
        .iter()
        .all(|o| net.nodes[i].wallet.script_path(&o.script_pubkey).is_some())
}

/// The value of the output `op` spends (on chain).
async fn value_of(net: &Network, op: OutPoint) -> Amount {
    let tx = net
        .chain
        .transaction(op.txid)
        .await
        .expect("chain")
        .expect("a known transaction")
        .tx;
    tx.output[op.vout as usize].value
}

/// The transaction among `actions` (sent now or later) that reveals `r`, and its CSV.
fn claim_with(actions: &[Action], r: Preimage) -> (Transaction, u32) {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Broadcast(tx) if reveals(tx, r) => Some((tx.clone(), 0)),
            Action::BroadcastLater { tx, csv_blocks, .. } if reveals(tx, r) => {
                Some((tx.clone(), *csv_blocks))
            }
            _ => None,
        })
        .expect("a claim with R")
}

/// C has B's HTLC and knows R, but never fulfils it: it closes with its own commitment and
/// claims the HTLC with R on chain once its delay has passed. B reads R from that witness
/// (restarted between the block and its scan) and fulfils A off chain: A pays exactly
/// amount + fee, B earns the fee, and C's claim is what took the HTLC output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_that_reveals_r_only_on_chain_is_fulfilled_upstream() {
    let (mut net, mut c) = line_to_scripted(0x61, regtest).await;
    let r = Preimage([0x61; 32]);
    let (a0, _) = side(&net, 0, 1).await;
    let (ba0, _) = side(&net, 1, 0).await;
    let bc0 = b_owns(&net, &c.node_id).await;
    let start = net.chain.height();
    c_holds(&net, &mut c, r).await;
    assert!(c.channel.remember_preimage(r));
    let actions = c.channel.force_close().expect("C closes");
    let Some(Action::Broadcast(commitment)) = actions.first().cloned() else {
        panic!("the commitment first: {actions:?}")
    };
    let (claim, csv) = claim_with(&actions, r);
    net.chain
        .send_raw(&commitment, None)
        .expect("C's commitment");
    net.mine(1).await;
    let id = c.node_id;
    eventually!(net, "B sees C's commitment", on_chain(&net, &id).await);
    net.mine(csv - 1).await;
    assert_eq!(first_forward_state(&net).await, "offered");
    assert_eq!(side(&net, 1, 0).await.1, 1, "A's HTLC held meanwhile");
    net.chain.send_raw(&claim, None).expect("C's claim with R");
    // Mined while B is down: B reads it when it scans the block after its restart.
    let payout = net.chain.faucet_script().to_owned();
    net.chain.mine(1, &payout).expect("mine");
    net.restart(1).await;
    net.connect(0, 1).await;
    eventually!(
        net,
        "B's forward fulfilled with R read on chain",
        first_forward_state(&net).await == "fulfilled"
    );
    settled(&net, 0, 1).await;
    settled(&net, 1, 0).await;
    assert_eq!(side(&net, 0, 1).await, (a0 - 2_000_000 - FEE, 0));
    assert_eq!(side(&net, 1, 0).await, (ba0 + 2_000_000 + FEE, 0));
    // Downstream, C took the 2,000-sat HTLC output with R: B's refund can never confirm.
    let htlc = claim.input[0].previous_output;
    assert_eq!(htlc.txid, commitment.compute_txid());
    assert_eq!(
        commitment.output[htlc.vout as usize].value,
        Amount::from_sat(2_000)
    );
    let (_, taken) = find_tx(&net, start, |tx| spends(tx, htlc))
        .await
        .expect("spent");
    assert_eq!(taken.compute_txid(), claim.compute_txid());
    assert_eq!(b_owns(&net, &c.node_id).await, bc0 - 2_000_000);
}

/// C holds B's HTLC and disappears. Six blocks after its expiry B closes on chain and
/// refunds it once its delay allows; B is restarted in between. Not one block before that
/// refund is confirmed does B fail A's HTLC (C could still claim with R until then); after
/// it, A has its money back and B its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_htlc_that_times_out_on_chain_is_failed_upstream_once_refunded() {
    let (mut net, mut c) = line_to_scripted(0x64, regtest).await;
    let r = Preimage([0x64; 32]);
    let (a0, _) = side(&net, 0, 1).await;
    let (ba0, _) = side(&net, 1, 0).await;
    let (out_expiry, in_expiry) = c_holds(&net, &mut c, r).await;
    c.hang_up();
    let id = c.node_id;
    let start = net.chain.height();
    net.mine(out_expiry + 6 - start).await;
    eventually!(
        net,
        "B closed its channel with C",
        on_chain(&net, &id).await
    );
    let htlc = {
        let slot = net.nodes[1].manager.channels.latest(&id).expect("channel");
        let outputs = slot.lock().await.channel.offered_htlc_outputs_on_chain();
        outputs.expect("on chain")[0].0
    };
    net.mine(1).await;
    net.restart(1).await;
    net.connect(0, 1).await;
    let mut refunded = None;
    for _ in 0..20 {
        assert_eq!(
            first_forward_state(&net).await,
            "offered",
            "failed upstream before the refund confirmed"
        );
        assert_eq!(side(&net, 1, 0).await.1, 1, "A's HTLC let go too early");
        net.mine(1).await;
        refunded = find_tx(&net, start, |tx| spends(tx, htlc)).await;
        if refunded.is_some() {
            break;
        }
    }
    let (height, refund) = refunded.expect("B's refund confirmed");
    assert!(!reveals(&refund, r));
    assert!(pays_wallet_of(&net, 1, &refund), "the refund is B's");
    assert!(height > out_expiry && height < in_expiry, "{height}");
    eventually!(
        net,
        "B failed its forward",
        first_forward_state(&net).await == "failed"
    );
    settled(&net, 0, 1).await;
    settled(&net, 1, 0).await;
    assert_eq!(side(&net, 0, 1).await, (a0, 0));
    assert_eq!(side(&net, 1, 0).await, (ba0, 0));
    assert_eq!(value_of(&net, htlc).await, Amount::from_sat(2_000));
}

/// Mines a block at a time until a transaction revealing `r` and paying node 1's wallet
/// confirms (at most until `until`); returns it with its height.
async fn b_claims(net: &Network, r: Preimage, from: u32, until: u32) -> Option<(u32, Transaction)> {
    while net.chain.height() < until {
        net.mine(1).await;
        let found = find_tx(net, from, |tx| reveals(tx, r) && pays_wallet_of(net, 1, tx)).await;
        if found.is_some() {
            return found;
        }
    }
    None
}

/// C fulfils B off chain, but A's session is gone and never comes back: B closes the
/// channel with A in time and its claim with R confirms before the upstream expiry. B has
/// paid C 2,000 sat off chain and holds the 2,001-sat HTLC output (amount + fee, the
/// 20 msat below a satoshi aside), less the claim's fee.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_gone_silent_after_the_hop_paid_downstream_is_claimed_on_chain_in_time() {
    let (mut net, mut c) = line_to_scripted(0x67, regtest).await;
    let r = Preimage([0x67; 32]);
    let bc0 = b_owns(&net, &c.node_id).await;
    let (_, in_expiry) = c_holds(&net, &mut c, r).await;
    // A goes away for good: B cannot fulfil it off chain.
    net.restart(0).await;
    let actions = c.channel.fulfill_htlc(r, 0).expect("C fulfils");
    c.run(actions).await;
    c.until_normal().await.expect("B takes R");
    eventually!(
        net,
        "B's forward fulfilled",
        first_forward_state(&net).await == "fulfilled"
    );
    assert_eq!(b_owns(&net, &c.node_id).await, bc0 - 2_000_000);
    let start = net.chain.height();
    let claimed = b_claims(&net, r, start, in_expiry + 3).await;
    let (height, claim) = claimed.expect("B claimed A's HTLC on chain with R");
    assert!(
        height < in_expiry,
        "claimed at {height}, expiry {in_expiry}"
    );
    let htlc = claim.input[0].previous_output;
    assert_eq!(
        value_of(&net, htlc).await,
        Amount::from_sat((2_000_000 + FEE) / 1000)
    );
    let got = claim.output[0].value;
    assert!(got > Amount::ZERO && got < Amount::from_sat(2_001), "{got}");
}

/// A closes its channel with B on chain while C holds the HTLC; C then claims it with R
/// on chain. B, whose incoming channel is already on chain, claims A's HTLC output from
/// A's commitment with that R (the claim waits for nothing) before the upstream expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r_read_on_chain_claims_the_incoming_htlc_when_that_channel_is_on_chain_too() {
    let (net, mut c) = line_to_scripted(0x6d, regtest).await;
    let r = Preimage([0x6d; 32]);
    let (_, in_expiry) = c_holds(&net, &mut c, r).await;
    let start = net.chain.height();
    net.nodes[0]
        .manager
        .command(&net.id(1), Command::ForceClose)
        .await
        .expect("A closes on chain");
    net.mine(1).await;
    let a = net.id(0);
    eventually!(net, "B sees A's commitment", on_chain(&net, &a).await);
    assert!(c.channel.remember_preimage(r));
    let actions = c.channel.force_close().expect("C closes");
    let Some(Action::Broadcast(commitment)) = actions.first().cloned() else {
        panic!("the commitment first: {actions:?}")
    };
    let (claim, csv) = claim_with(&actions, r);
    net.chain
        .send_raw(&commitment, None)
        .expect("C's commitment");
    net.mine(csv).await;
    net.chain.send_raw(&claim, None).expect("C's claim with R");
    net.mine(1).await;
    eventually!(
        net,
        "B's forward fulfilled with R read on chain",
        first_forward_state(&net).await == "fulfilled"
    );
    let claimed = b_claims(&net, r, start, in_expiry + 3).await;
    let (height, claim) = claimed.expect("B claimed A's HTLC on chain with R");
    assert!(
        height < in_expiry,
        "claimed at {height}, expiry {in_expiry}"
    );
    let htlc = claim.input[0].previous_output;
    assert_eq!(
        value_of(&net, htlc).await,
        Amount::from_sat((2_000_000 + FEE) / 1000)
    );
}

/// B (node 1) runs at the smallest `--expiry-delta` the node accepts.
fn b_at_the_least_delta(config: &mut crate::NodeConfig) {
    regtest(config);
    if config.data_dir.ends_with("node1") {
        config.expiry_delta = crate::MIN_EXPIRY_DELTA;
    }
}

/// A offers B 2,000,000 msat + B's fee until `in_expiry`, to forward to `c` until
/// `out_expiry` (the onion built by hand: the gap is the test's to choose).
async fn offer_through_b(
    net: &Network,
    c: PublicKey,
    r: Preimage,
    out_expiry: u32,
    in_expiry: u32,
) -> Result<(), ControlError> {
    let b_layer = onion::HopPayload {
        amount_msat: 2_000_000,
        expiry: Locktime::Blocks(out_expiry),
        next_node: Some(c),
    }
    .encode();
    let c_layer = onion::HopPayload {
        amount_msat: 2_000_000,
        expiry: Locktime::Blocks(out_expiry),
        next_node: None,
    }
    .encode();
    let hops = [
        onion::Hop {
            node_id: net.id(1),
            payload: &b_layer,
        },
        onion::Hop {
            node_id: c,
            payload: &c_layer,
        },
    ];
    let session = SecretKey::from_slice(&[0x35; 32]).expect("key");
    let built =
        onion::build(&Secp256k1::new(), &session, &hops, r.hash().as_byte_array()).expect("onion");
    let command = Command::AddRoutedHtlc {
        amount_msat: 2_000_000 + FEE,
        r_hash: r.hash(),
        expiry: in_expiry,
        onion: built.packet,
    };
    net.nodes[0]
        .manager
        .command(&net.id(1), command)
        .await
        .map(|_| ())
}

/// At the smallest delta B accepts, the gap a forward needs is that delta plus both
/// channels' delays (6 + 6 here): one block less is declined. At exactly that gap, the
/// worst case: C holds the HTLC, B closes six blocks after its expiry, and C claims with R
/// in the very block where B's refund would first be valid. B reads R, finds it too late
/// to fulfil A off chain (failing A would lose the amount), closes and claims with R, and
/// its claim confirms before the upstream expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_smallest_expiry_delta_a_claim_with_r_at_the_last_moment_is_claimed_upstream_in_time(
) {
    let (net, mut c) = line_to_scripted(0x6a, b_at_the_least_delta).await;
    let gap = crate::MIN_EXPIRY_DELTA + 6 + 6;
    let out_expiry = net.chain.height() + 20;
    let (a0, _) = side(&net, 0, 1).await;
    let short = Preimage([0x6b; 32]);
    let declined = offer_through_b(&net, c.node_id, short, out_expiry, out_expiry + gap - 1).await;
    match declined {
        Err(ControlError::Declined(text)) => assert!(text.contains("CannotRoute"), "{text}"),
        other => panic!("one block short of the gap: expected a decline, got {other:?}"),
    }
    settled(&net, 0, 1).await;
    assert_eq!(side(&net, 0, 1).await, (a0, 0));
    let r = Preimage([0x6a; 32]);
    offer_through_b(&net, c.node_id, r, out_expiry, out_expiry + gap)
        .await
        .expect("accepted at exactly the gap");
    let (_, in_expiry) = hold(&net, &mut c).await;
    assert_eq!(in_expiry, out_expiry + gap);
    c.hang_up();
    let id = c.node_id;
    let start = net.chain.height();
    net.mine(out_expiry + 6 - start).await;
    eventually!(
        net,
        "B closed its channel with C",
        on_chain(&net, &id).await
    );
    let anchor = c.channel.anchor_outpoint().expect("anchor");
    net.mine(1).await;
    let (confirmed, commitment) = find_tx(&net, start, |tx| spends(tx, anchor))
        .await
        .expect("B's commitment");
    assert!(c.channel.remember_preimage(r));
    let actions = c.channel.spend_seen(&commitment, None).expect("C sees it");
    let (claim, _) = claim_with(&actions, r);
    // B's refund waits C's delay (6) after its commitment: C claims in the block before
    // which B's watcher would have sent it.
    let payout = net.chain.faucet_script().to_owned();
    net.mine(confirmed + 4 - net.chain.height()).await;
    net.chain.mine(1, &payout).expect("mine");
    net.chain.send_raw(&claim, None).expect("C's claim with R");
    net.mine(1).await;
    let (l, _) = find_tx(&net, start, |tx| reveals(tx, r))
        .await
        .expect("C's claim");
    assert_eq!(l, confirmed + 6, "in the refund's first block");
    assert_eq!(l, in_expiry - 9);
    eventually!(
        net,
        "B's forward fulfilled with R read on chain",
        first_forward_state(&net).await == "fulfilled"
    );
    let claimed = b_claims(&net, r, l + 1, in_expiry + 3).await;
    let (height, claim) = claimed.expect("B claimed A's HTLC on chain with R");
    assert!(
        height < in_expiry,
        "claimed at {height}, expiry {in_expiry}"
    );
    let htlc = claim.input[0].previous_output;
    assert_eq!(
        value_of(&net, htlc).await,
        Amount::from_sat((2_000_000 + FEE) / 1000)
    );
}

/// `start` refuses a delta below the floor its own channel settings give (a later refund
/// deadline needs more), so a configuration built without the flag's parser cannot slip
/// below it either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_to_start_with_a_delta_below_the_on_chain_floor() {
    let dir = tempfile::tempdir().expect("dir");
    let chain = chain::DevChain::open(&dir.path().join("chain")).expect("chain");
    let mut config = crate::NodeConfig::new(dir.path().join("node"));
    config.listen = "127.0.0.1:0".parse().expect("addr");
    config.rpc_bind = "127.0.0.1:0".parse().expect("addr");
    config.expiry_delta = crate::MIN_EXPIRY_DELTA - 1;
    let refused = crate::start(config.clone(), std::sync::Arc::new(chain.clone()))
        .await
        .err();
    assert!(
        matches!(
            refused,
            Some(crate::NodeError::ExpiryDeltaTooSmall {
                delta: 9,
                least: 10
            })
        ),
        "{refused:?}"
    );
    config.channel.force_close_after_expiry_blocks = 12;
    config.expiry_delta = 15;
    let refused = crate::start(config, std::sync::Arc::new(chain)).await.err();
    assert!(
        matches!(
            refused,
            Some(crate::NodeError::ExpiryDeltaTooSmall {
                delta: 15,
                least: 16
            })
        ),
        "{refused:?}"
    );
}
