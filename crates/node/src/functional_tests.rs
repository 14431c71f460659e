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
        Err(crate::NodeError::Store(crate::store::StoreError::BadPeerId { channel, peer_id })) => {
            assert_eq!((channel.0, peer_id.as_str()), (5, "not-a-node-id"));
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
    wait_disconnected(&net).await;
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
    wait_disconnected(&net).await;
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

/// The wallet outputs of node `i` as (txid, amount in sat).
async fn wallet_outputs(net: &crate::harness::Network, i: usize) -> Vec<(bitcoin::Txid, u64)> {
    let funds = net.nodes[i].wallet.funds().await.expect("funds");
    funds
        .outputs
        .iter()
        .map(|o| (o.outpoint.txid, o.amount_sat))
        .collect()
}

/// The process test `a_reorganisation_is_rescanned`, in process: the tip holding a wallet
/// payment is replaced by a block at the same height that also holds a second payment;
/// only a watcher that notices the reorganisation scans that height again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tip_replaced_at_the_same_height_is_scanned_again() {
    let net = create_network(1, regtest).await;
    let script = net.nodes[0]
        .wallet
        .new_address()
        .await
        .expect("address")
        .script_pubkey();
    net.chain
        .faucet(&script, bitcoin::Amount::from_sat(100_000))
        .expect("faucet");
    let payout = net.chain.faucet_script().to_owned();
    let tip = net.chain.mine(1, &payout).expect("mine")[0];
    net.step().await;
    let funds = net.nodes[0].wallet.funds().await.expect("funds");
    let total: u64 = funds.outputs.iter().map(|o| o.amount_sat).sum();
    assert_eq!(total, 100_000, "first payment seen");
    net.chain.invalidate(tip).expect("invalidate the tip");
    let second = net
        .chain
        .faucet(&script, bitcoin::Amount::from_sat(50_000))
        .expect("faucet");
    net.mine(1).await;
    assert!(
        wallet_outputs(&net, 0).await.contains(&(second, 50_000)),
        "second payment not seen after the reorganisation: {:?}",
        wallet_outputs(&net, 0).await
    );
}

/// The process test `a_reorganisation_eight_blocks_deep_is_rescanned_from_the_fork`, in
/// process: 8 blocks deep (deeper than the 6 the watcher used to rescan), the block holding
/// a payment and the ones after it are replaced by a longer branch whose first block also
/// holds a second payment; the wallet, rebuilt from the stored fork point, holds both, the
/// first (mined again on the new branch) counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reorganisation_eight_blocks_deep_is_rescanned_from_the_fork() {
    let net = create_network(1, regtest).await;
    let script = net.nodes[0]
        .wallet
        .new_address()
        .await
        .expect("address")
        .script_pubkey();
    let first = net
        .chain
        .faucet(&script, bitcoin::Amount::from_sat(100_000))
        .expect("faucet");
    let payout = net.chain.faucet_script().to_owned();
    let fork = net.chain.mine(1, &payout).expect("mine")[0];
    // A fresh node's first pass starts at the tip: this one scans the payment's block.
    net.step().await;
    net.mine(7).await;
    let funds = net.nodes[0].wallet.funds().await.expect("funds");
    assert_eq!(funds.outputs.len(), 1);
    assert_eq!(
        funds.outputs[0].confirmations(funds.tip),
        8,
        "first payment seen"
    );
    net.chain.invalidate(fork).expect("invalidate the fork");
    let second = net
        .chain
        .faucet(&script, bitcoin::Amount::from_sat(50_000))
        .expect("faucet");
    net.mine(9).await;
    let mut outputs = wallet_outputs(&net, 0).await;
    outputs.sort_by_key(|&(_, sat)| std::cmp::Reverse(sat));
    assert_eq!(outputs, vec![(first, 100_000), (second, 50_000)]);
}

/// The process test `a_mined_coinbase_funds_a_channel_only_once_mature`, in process: a
/// coinbase paying the wallet is listed at once but cannot fund an anchor (-6, insufficient
/// funds, no channel left behind) until its 100th confirmation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mined_coinbase_funds_a_channel_only_once_mature() {
    let net = create_network(2, regtest).await;
    let script = net.nodes[0]
        .wallet
        .new_address()
        .await
        .expect("address")
        .script_pubkey();
    net.chain.mine(1, &script).expect("mine to the wallet");
    net.step().await;
    let funds = net.nodes[0].wallet.funds().await.expect("funds");
    assert_eq!(funds.outputs.len(), 1, "coinbase output seen");
    let reward = funds.outputs[0].amount_sat;
    assert!(reward > 0);
    assert!(
        !funds.outputs[0].spendable(funds.tip),
        "an immature coinbase is not spendable"
    );
    net.connect(0, 1).await;
    let err = net.nodes[0]
        .manager
        .open(&net.id(1), 100_000)
        .await
        .err()
        .expect("an immature coinbase cannot fund an anchor");
    assert_eq!(err.code(), -6, "{err}");
    assert!(err.to_string().contains("insufficient funds"), "{err}");
    assert!(
        net.nodes[0].manager.channels.all().is_empty(),
        "a refused open leaves no channel"
    );
    // The 100th confirmation makes it spendable in the next block.
    net.mine(99).await;
    let funds = net.nodes[0].wallet.funds().await.expect("funds");
    assert_eq!(funds.outputs[0].confirmations(funds.tip), 100);
    assert!(funds.outputs[0].spendable(funds.tip), "coinbase mature");
    let spendable = net.nodes[0]
        .wallet
        .funds()
        .await
        .expect("funds")
        .outputs
        .iter()
        .filter(|o| o.spendable(funds.tip))
        .map(|o| o.amount_sat)
        .sum::<u64>();
    assert_eq!(spendable, reward);
}

/// The process test `two_opens_at_once_make_one_channel`, in process: the wallet could fund
/// both, but the protocol has one channel per session: of three `open`s at once one opens,
/// the others answer -103, and one channel goes live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_opens_at_once_make_one_channel() {
    let net = create_network(2, regtest).await;
    net.fund(0, 1_000_000).await;
    net.connect(0, 1).await;
    let b = net.id(1);
    let open = || net.nodes[0].manager.open(&b, 250_000);
    let (x, y, z) = tokio::join!(open(), open(), open());
    let answers = [x, y, z];
    let opened: Vec<_> = answers.iter().filter_map(|r| r.as_ref().ok()).collect();
    let refused: Vec<_> = answers.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(
        (opened.len(), refused.len()),
        (1, 2),
        "one open succeeds, the others are refused"
    );
    for err in refused {
        assert_eq!(err.code(), -103, "{err}");
        assert!(err.to_string().contains("exists already"), "{err}");
    }
    let state = opened[0].lock().await.channel.state();
    assert_eq!(state, channel::State::OpenWaitComplete);
    assert_eq!(net.nodes[0].manager.channels.all().len(), 1);
    net.mine(1).await;
    for _ in 0..100 {
        if net.state(0, 1).await == channel::State::Normal
            && net.state(1, 0).await == channel::State::Normal
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        net.step().await;
    }
    panic!("the channel did not go live on both");
}

/// Waits until neither node 0 nor node 1 counts the other as connected.
async fn wait_disconnected(net: &crate::harness::Network) {
    for _ in 0..200 {
        if !net.nodes[0].peers.is_connected(&net.id(1))
            && !net.nodes[1].peers.is_connected(&net.id(0))
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("the session did not end");
}

/// `newhtlc` from node 0 to node 1 of 10,000,000 msat expiring at `expiry`.
async fn add_htlc_expiring(
    net: &crate::harness::Network,
    expiry: u32,
) -> Result<std::sync::Arc<crate::manager::Slot>, ControlError> {
    use bitcoin::hashes::Hash as _;
    let r_hash = wire::Sha256::hash(&[7u8; 32]);
    net.nodes[0]
        .manager
        .command(
            &net.id(1),
            Command::AddHtlc {
                amount_msat: 10_000_000,
                r_hash,
                expiry,
            },
        )
        .await
}

/// The process test `a_lost_session_keeps_the_channels_view_of_the_chain_height`, in
/// process: the last update is persisted at one height, 40 blocks follow; an HTLC that
/// expired 20 blocks ago is refused by A itself (-105, bad HTLC expiry), and still after
/// the session is lost and made again (the channel used to be reloaded at the stored
/// height).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_keeps_the_channels_view_of_the_chain_height() {
    let net = create_network(2, regtest).await;
    net.open_channel(0, 1, 500_000).await;
    net.nodes[0]
        .manager
        .command(&net.id(1), Command::Pay(20_000_000))
        .await
        .expect("pay");
    net.mine(40).await;
    let past = net.chain.height() - 20;
    let err = add_htlc_expiring(&net, past).await.err().expect("refused");
    assert_eq!(err.code(), -105, "{err}");
    assert!(err.to_string().contains("bad HTLC expiry"), "{err}");
    assert!(net.nodes[0].peers.disconnect(&net.id(1), "test").await);
    wait_disconnected(&net).await;
    net.connect(0, 1).await;
    let err = add_htlc_expiring(&net, past)
        .await
        .err()
        .expect("an HTLC that expired 20 blocks ago must be refused after a reconnect too");
    assert_eq!(err.code(), -105, "{err}");
    assert!(err.to_string().contains("bad HTLC expiry"), "{err}");
    let slot = net.nodes[0]
        .manager
        .channels
        .latest(&net.id(1))
        .expect("A's channel");
    let inner = slot.lock().await;
    let state = inner.channel.balances().expect("balances");
    assert!(state.ours.htlcs.is_empty() && state.theirs.htlcs.is_empty());
}

/// The process test
/// `an_open_the_wallet_cannot_pay_the_fee_of_is_refused_before_the_peer_hears_of_it`, in
/// process: `open` for more than the wallet can pay once the anchor's fee is added (not
/// more than it holds) is refused at once (-6, naming what is needed) and nothing reaches
/// the peer: the session stays up and a smaller `open` on it makes the peer's only
/// channel. The check used to count the amount only, and the shortfall surfaced after the
/// peer had answered, with an error packet that dropped the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_the_wallet_cannot_pay_the_fee_of_is_refused_before_the_peer_hears_of_it() {
    let net = create_network(2, regtest).await;
    net.fund(0, 1_000_000).await;
    net.connect(0, 1).await;
    let err = net.nodes[0]
        .manager
        .open(&net.id(1), 999_950)
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), -6, "{err}");
    assert!(err.to_string().contains("needed"), "{err}");
    let funds = net.nodes[0].wallet.funds().await.expect("funds");
    let spendable: u64 = funds
        .outputs
        .iter()
        .filter(|o| o.spendable(funds.tip))
        .map(|o| o.amount_sat)
        .sum();
    assert_eq!(spendable, 1_000_000);
    assert!(net.nodes[0].manager.channels.all().is_empty());
    assert!(net.nodes[0].peers.is_connected(&net.id(1)));
    net.nodes[0]
        .manager
        .open(&net.id(1), 500_000)
        .await
        .expect("the next open goes out on the same session");
    // The pipe keeps order: had the refused open sent anything, B would hold two openings.
    assert_eq!(net.nodes[1].manager.channels.all().len(), 1);
}

/// The process test `fulfilling_an_htlc_too_close_to_its_expiry_is_refused`, in process:
/// with 9 blocks left before an incoming HTLC expires, `fulfillhtlc` is refused (-105)
/// and R is not revealed: the payer could let the HTLC expire on chain and still learn R.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fulfilling_an_htlc_too_close_to_its_expiry_is_refused() {
    use bitcoin::hashes::Hash as _;
    let net = create_network(2, regtest).await;
    net.open_channel(0, 1, 1_000_000).await;
    net.nodes[0]
        .manager
        .command(&net.id(1), Command::Pay(100_000_000))
        .await
        .expect("pay");
    let r = [14u8; 32];
    let expiry = net.chain.height() + 20;
    let add = Command::AddHtlc {
        amount_msat: 50_000_000,
        r_hash: wire::Sha256::hash(&r),
        expiry,
    };
    net.nodes[0]
        .manager
        .command(&net.id(1), add)
        .await
        .expect("newhtlc");
    net.mine(expiry - 9 - net.chain.height()).await;
    let err = net.nodes[1]
        .manager
        .command(&net.id(0), Command::Fulfill(wire::Preimage(r)))
        .await
        .err()
        .expect("refused");
    let text = err.to_string();
    assert_eq!(err.code(), -105, "{err}");
    assert!(
        text.contains(&format!(
            "HTLC expiring at Blocks({expiry}) is too close to its expiry to fulfil"
        )) && text.contains("R is not revealed"),
        "{text}"
    );
    // A round trip on the ordered pipe: anything B had sent reached A before its end.
    net.nodes[0]
        .manager
        .command(&net.id(1), Command::Pay(1_000_000))
        .await
        .expect("pay after the refusal");
    for (i, peer) in [(0, 1), (1, 0)] {
        let slot = net.nodes[i]
            .manager
            .channels
            .latest(&net.id(peer))
            .expect("channel");
        let inner = slot.lock().await;
        let state = inner.channel.balances().expect("balances");
        assert_eq!(
            state.ours.htlcs.len() + state.theirs.htlcs.len(),
            1,
            "node {i}"
        );
        assert_eq!(inner.channel.state(), channel::State::Normal, "node {i}");
    }
    for (i, peer) in [(0, 1), (1, 0)] {
        let slot = net.nodes[i].manager.channels.latest(&net.id(peer));
        let slot = slot.expect("channel");
        assert!(
            slot.lock().await.channel.known_preimages().is_empty(),
            "node {i} holds R: revealed to the payer or kept by the payee"
        );
    }
}

/// Node `from` pays `msat` to `to` over their channel.
async fn pay(net: &crate::harness::Network, from: usize, to: usize, msat: u64) {
    net.nodes[from]
        .manager
        .command(&net.id(to), Command::Pay(msat))
        .await
        .expect("pay");
}

/// The process test `a_small_output_of_ours_does_not_block_the_other_claims`, in process:
/// B's direct output on A's commitment is 600 sat, a few hundred above dust and too small
/// to claim at the claim fee rate. A broadcasts that commitment while B holds R of an HTLC
/// A offered (B learnt R with A gone): B must leave the small output out (and list it as
/// unclaimable), go on chain and still claim the HTLC with R.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_output_of_ours_does_not_block_the_other_claims() {
    use bitcoin::hashes::Hash as _;
    let net = create_network(2, regtest).await;
    net.open_channel(0, 1, 1_000_000).await;
    pay(&net, 0, 1, 100_000_000).await;
    // B pays back all but 600 sat of what it owns.
    let b_slot = net.nodes[1].manager.channels.latest(&net.id(0)).expect("B");
    let ours = b_slot
        .lock()
        .await
        .channel
        .balances()
        .expect("b")
        .ours
        .pay_msat;
    pay(&net, 1, 0, ours - 600_000).await;
    let ours = b_slot
        .lock()
        .await
        .channel
        .balances()
        .expect("b")
        .ours
        .pay_msat;
    assert_eq!(ours, 600_000);
    let r = [12u8; 32];
    let add = Command::AddHtlc {
        amount_msat: 50_000_000,
        r_hash: wire::Sha256::hash(&r),
        expiry: net.chain.height() + 100,
    };
    net.nodes[0]
        .manager
        .command(&net.id(1), add)
        .await
        .expect("newhtlc");
    assert!(net.nodes[0].peers.disconnect(&net.id(1), "test").await);
    wait_disconnected(&net).await;
    let kept = net.nodes[1]
        .manager
        .command(&net.id(0), Command::Fulfill(wire::Preimage(r)))
        .await
        .err();
    assert!(
        matches!(kept, Some(ControlError::NotConnectedKeepingR(_))),
        "{kept:?}"
    );
    net.nodes[0]
        .manager
        .command(&net.id(1), Command::ForceClose)
        .await
        .expect("A broadcasts its commitment");
    net.mine(1).await;
    assert_eq!(net.state(1, 0).await, channel::State::OnChain);
    let unclaimable: Vec<u64> = b_slot
        .lock()
        .await
        .channel
        .unclaimable()
        .iter()
        .map(|u| u.value.to_sat())
        .collect();
    assert_eq!(unclaimable, vec![600]);
    for _ in 0..60 {
        let funds = net.nodes[1].wallet.funds().await.expect("funds");
        if funds.outputs.iter().map(|o| o.amount_sat).sum::<u64>() > 49_000 {
            return;
        }
        net.mine(1).await;
    }
    panic!("B never claimed the HTLC with R");
}

/// Two nodes open channels to node 0 whose anchors are not mined yet; with room for two
/// openings waiting for an anchor, node 3's open is refused. Node 3 keeps the refusal's
/// `error` as why node 0 dropped it (`Peers::last_peer_error`), and holds no channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_open_leaves_the_peers_error_with_the_opener() {
    let net = create_network(4, |c| {
        regtest(c);
        c.max_pending_openings = 2;
    })
    .await;
    for i in 1..4 {
        net.fund(i, 600_000).await;
    }
    for i in 1..3 {
        net.connect(i, 0).await;
        net.nodes[i]
            .manager
            .open(&net.id(0), 500_000)
            .await
            .expect("an opening node 0 has room for");
    }
    assert_eq!(net.nodes[3].peers.last_peer_error(&net.id(0)), None);
    net.connect(3, 0).await;
    let refused = net.nodes[3].manager.open(&net.id(0), 500_000).await;
    assert!(refused.is_err(), "a third opening was taken");
    crate::harness::eventually!(
        net,
        "node 3 hears why",
        net.nodes[3].peers.last_peer_error(&net.id(0)).is_some()
    );
    let why = net.nodes[3].peers.last_peer_error(&net.id(0));
    assert!(
        why.as_deref()
            .is_some_and(|w| w.contains("Too many channels waiting for their anchor")),
        "{why:?}"
    );
}
