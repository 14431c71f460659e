//! Two nodes in one process (`harness::create_network`): the node's policies driven end to
//! end without a process, a socket or a sleep on the wall clock.

use crate::control_error::ControlError;
use crate::harness::create_network;
use crate::manager::Command;

/// Regtest settings of the walk-through: the anchor is deep enough after one block.
fn regtest(config: &mut crate::NodeConfig) {
    config.channel.min_depth = 1;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_open_and_pay_over_an_in_memory_pipe() {
    let net = create_network(2, regtest).await;
    net.open_channel(0, 1, 500_000).await;
    let slot = net.nodes[0]
        .manager
        .command(&net.id(1), Command::Pay(1_000_000))
        .await
        .expect("pay");
    let ours = slot
        .lock()
        .await
        .channel
        .balances()
        .expect("balances")
        .ours
        .clone();
    assert_eq!(ours.pay_msat + ours.fee_msat, 499_000_000);
    let theirs = net.nodes[1]
        .manager
        .channels
        .latest(&net.id(0))
        .expect("B's channel");
    let b = theirs
        .lock()
        .await
        .channel
        .balances()
        .expect("balances")
        .ours
        .clone();
    assert_eq!(b.pay_msat + b.fee_msat, 1_000_000);
}

/// The process test `a_reorganisation_below_min_depth_suspends_the_channel`, in process: the
/// anchor's block is invalidated, both nodes suspend the channel and refuse a payment
/// (-112); once the block is back the channel is live and pays again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reorganisation_below_min_depth_suspends_the_channel_until_the_anchor_is_back() {
    let net = create_network(2, regtest).await;
    let anchor_block = net.open_channel(0, 1, 500_000).await;
    assert_eq!(net.suspended(0, 1).await, None);
    net.chain.invalidate(anchor_block).expect("invalidate");
    net.step().await;
    assert_eq!(net.suspended(0, 1).await, Some(0), "A did not suspend");
    assert_eq!(net.suspended(1, 0).await, Some(0), "B did not suspend");
    let refused = net.nodes[0]
        .manager
        .command(&net.id(1), Command::Pay(1_000_000))
        .await
        .err();
    assert!(
        matches!(
            refused,
            Some(ControlError::AnchorUnconfirmed {
                confirmations: 0,
                min_depth: 1
            })
        ),
        "{refused:?}"
    );
    net.chain.reconsider(anchor_block).expect("reconsider");
    net.step().await;
    assert_eq!(net.suspended(0, 1).await, None, "A did not resume");
    assert_eq!(net.suspended(1, 0).await, None, "B did not resume");
    net.nodes[0]
        .manager
        .command(&net.id(1), Command::Pay(1_000_000))
        .await
        .expect("pay once the anchor is back");
}

/// A stored channel whose peer id is not a node id used to be skipped at start (a silent
/// `continue`), hiding the channel and its money; the start now fails naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_channel_whose_peer_id_does_not_parse_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let chain = chain::DevChain::open(&dir.path().join("chain")).unwrap();
    let data_dir = dir.path().join("node");
    std::fs::create_dir_all(&data_dir).unwrap();
    {
        let store = crate::store::Store::open(&data_dir).await.unwrap();
        let secrets = channel::ChannelSecrets {
            commit_key: secp256k1::SecretKey::from_slice(&[1; 32]).unwrap(),
            final_key: secp256k1::SecretKey::from_slice(&[2; 32]).unwrap(),
            revocation_seed: [3; 32],
        };
        let ch = channel::Channel::new(
            channel::ChannelConfig::default(),
            secrets,
            channel::AnchorRole::Accept,
        );
        store
            .insert_channel_as(crate::store::ChannelId(5), "not-a-node-id", &ch)
            .await
            .unwrap();
    }
    let mut config = crate::NodeConfig::new(&data_dir);
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.rpc_bind = "127.0.0.1:0".parse().unwrap();
    let started = crate::start(config, std::sync::Arc::new(chain)).await;
    match started {
        Err(crate::NodeError::BadPeerId { channel, peer_id }) => {
            assert_eq!((channel, peer_id.as_str()), (5, "not-a-node-id"));
        }
        Err(e) => panic!("another error: {e}"),
        Ok(node) => {
            node.shutdown().await;
            panic!("the node started with a channel it cannot attribute to a peer");
        }
    }
}

/// Offers an HTLC of `msat` from node 0 to node 1 expiring `blocks` ahead, hash of `r`.
async fn offer(net: &crate::harness::Network, r: [u8; 32], blocks: u32) -> u32 {
    use bitcoin::hashes::Hash as _;
    let expiry = net.chain.height() + blocks;
    let r_hash = wire::Sha256::hash(&r);
    net.nodes[0]
        .manager
        .command(
            &net.id(1),
            Command::AddHtlc {
                amount_msat: 5_000_000,
                r_hash,
                expiry,
            },
        )
        .await
        .expect("newhtlc");
    expiry
}

/// Mines until node `i`'s wallet holds the HTLC of [`offer`] (5,000 sat less its claim's
/// fee), swept by a claim; fails after 40 blocks.
async fn swept_htlc(net: &crate::harness::Network, i: usize) {
    for _ in 0..40 {
        let funds = net.nodes[i].wallet.funds().await.expect("funds");
        if funds
            .outputs
            .iter()
            .any(|o| (3_000..5_000).contains(&o.amount_sat))
        {
            return;
        }
        net.mine(1).await;
    }
    panic!("node {i} never swept the HTLC into its wallet");
}

/// The process test `an_incoming_htlc_with_known_r_is_claimed_on_chain_before_expiry`, in
/// process: with the payer gone, the payee that knows R goes on chain before the HTLC
/// expires (its claim deadline), and not while the expiry is far.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_peer_gone_an_htlc_whose_r_we_know_is_claimed_on_chain_before_expiry() {
    let net = create_network(2, regtest).await;
    net.open_channel(0, 1, 500_000).await;
    let r = [9u8; 32];
    let expiry = offer(&net, r, 40).await;
    assert!(
        net.nodes[0]
            .peers
            .disconnect(&net.id(1), "Disconnected by operator")
            .await
    );
    for _ in 0..200 {
        if !net.nodes[0].peers.is_connected(&net.id(1))
            && !net.nodes[1].peers.is_connected(&net.id(0))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // B learns R with A away: kept for the claim, nothing sent.
    let kept = net.nodes[1]
        .manager
        .command(&net.id(0), Command::Fulfill(wire::Preimage(r)))
        .await
        .err();
    assert!(
        matches!(kept, Some(ControlError::NotConnectedKeepingR(_))),
        "{kept:?}"
    );
    // Far from the expiry nothing is due on either side.
    net.mine(1).await;
    assert_eq!(net.state(1, 0).await, channel::State::Normal);
    assert_eq!(net.state(0, 1).await, channel::State::Normal);
    // B's claim deadline comes before the expiry: B goes on chain to claim with R.
    while net.state(1, 0).await == channel::State::Normal {
        assert!(
            net.chain.height() < expiry,
            "B did not claim before the expiry"
        );
        net.mine(1).await;
    }
    assert_eq!(net.state(1, 0).await, channel::State::OnChain);
    swept_htlc(&net, 1).await;
}

/// The process test `an_expired_htlc_with_a_stalled_peer_is_refunded_on_chain`, in
/// process: with the peer gone past the expiry, A takes its HTLC back on chain once
/// `force_close_after_expiry_blocks` (the one setting, here 3) blocks have passed, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_peer_gone_our_expired_htlc_is_refunded_on_chain_after_the_setting() {
    let net = create_network(2, |c| {
        regtest(c);
        c.channel.force_close_after_expiry_blocks = 3;
    })
    .await;
    net.open_channel(0, 1, 500_000).await;
    let expiry = offer(&net, [8u8; 32], 20).await;
    assert!(
        net.nodes[1]
            .peers
            .disconnect(&net.id(0), "Disconnected by operator")
            .await
    );
    for _ in 0..200 {
        if !net.nodes[0].peers.is_connected(&net.id(1)) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    while net.chain.height() < expiry + 3 - 1 {
        net.mine(1).await;
        assert_eq!(
            net.state(0, 1).await,
            channel::State::Normal,
            "closed too early at {}",
            net.chain.height()
        );
    }
    net.mine(1).await;
    assert_eq!(
        net.state(0, 1).await,
        channel::State::OnChain,
        "not refunded on chain at expiry + 3"
    );
    swept_htlc(&net, 0).await;
}

/// The process test `anchor_that_does_not_exist_is_refused`, in process: the funder's
/// anchor never reaches the chain (the mempool refuses it), so the acceptor, which holds no
/// money in the opening, forgets the channel after `anchor_wait_blocks` blocks, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anchor_never_seen_is_given_up_by_the_acceptor_after_the_wait() {
    let net = create_network(2, |c| {
        regtest(c);
        c.anchor_wait_blocks = 3;
    })
    .await;
    net.fund(0, 600_000).await;
    net.connect(0, 1).await;
    net.chain
        .with_state_mut(|s| s.set_max_mempool_vbytes(1))
        .expect("mempool cap");
    net.nodes[0]
        .manager
        .open(&net.id(1), 500_000)
        .await
        .expect("open (the anchor is signed and sent)");
    assert_eq!(net.state(1, 0).await, channel::State::OpenWaitComplete);
    // The first pass that misses the anchor starts the wait.
    net.mine(1).await;
    net.mine(2).await;
    assert!(
        net.nodes[1].manager.channels.latest(&net.id(0)).is_some(),
        "given up before the wait ended"
    );
    net.mine(1).await;
    assert!(
        net.nodes[1].manager.channels.latest(&net.id(0)).is_none(),
        "the acceptor still holds an opening whose anchor never appeared"
    );
}
