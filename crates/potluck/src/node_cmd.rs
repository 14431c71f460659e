//! `potluck node`: the payment-channel peer daemon, on the embedded development chain or Bitcoin Core.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use chain::{BitcoindRpc, Chain, DevChain, DevChainConfig, RpcConfig};

use crate::chain_flags::{ChainChoice, ChainFlags};

/// Flags of `potluck node` (each also `POTLUCK_<FLAG>`).
#[derive(Debug, clap::Args)]
pub struct NodeArgs {
    /// Address for peer connections.
    #[arg(long, env = "POTLUCK_LISTEN", default_value = "127.0.0.1:9735")]
    pub listen: SocketAddr,
    /// Address of the control API (JSON-RPC; keep it on loopback).
    #[arg(long, env = "POTLUCK_RPC_BIND", default_value = "127.0.0.1:9736")]
    pub rpc_bind: SocketAddr,
    /// Node key, cookie, and the embedded chain (under `chain/`).
    #[arg(long, env = "POTLUCK_DATA_DIR", default_value = "./potluck-data/node")]
    pub data_dir: PathBuf,
    /// Seconds an update may take before the peer's session is dropped (and, unless the peer
    /// resumes it, the channel closes on chain).
    #[arg(long, env = "POTLUCK_UPDATE_TIMEOUT_SECS", default_value_t = 60)]
    pub update_timeout_secs: u64,
    /// Confirmations the anchor needs before a channel is live. Default: 3 (Core Lightning's
    /// and LND's default), 1 on regtest, where the development chain mines on demand.
    #[arg(long, env = "POTLUCK_MIN_DEPTH", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub min_depth: Option<u32>,
    /// Blocks the peer waits before it can sweep its own output of a commitment it
    /// broadcasts: our time to answer a revoked one with the penalty. Default: 144 (a
    /// day, Core Lightning's `watchtime-blocks`), 6 on regtest.
    #[arg(long, env = "POTLUCK_DELAY", value_parser = clap::value_parser!(u32).range(1..=65_535))]
    pub delay: Option<u32>,
    /// The largest delay, in blocks, we accept on our own outputs from a peer (two weeks,
    /// as Core Lightning's `max-locktime-blocks`; LND allows up to 2016 too).
    #[arg(long, env = "POTLUCK_MAX_THEIR_DELAY", default_value_t = 2016, value_parser = clap::value_parser!(u32).range(1..=65_535))]
    pub max_their_delay: u32,
    /// Blocks after its expiry that an HTLC we offered may stay unresolved (the peer away,
    /// refusing or stalling mid-update) before we close on chain to take it back. Stored
    /// with each channel when it is opened (`ChannelConfig::force_close_after_expiry_blocks`).
    #[arg(long, env = "POTLUCK_HTLC_CLOSE_AFTER_BLOCKS", default_value_t = 6)]
    pub htlc_close_after_blocks: u32,
    /// At most this many authenticated peer sessions at once (our own dials count from the
    /// moment we dial); a fifth of them is kept for our own dials and for peers we have a
    /// channel with. A peer that connects to us takes one only once it has authenticated.
    #[arg(long, env = "POTLUCK_MAX_PEERS", default_value_t = 1000)]
    pub max_peers: usize,
    /// At most this many connections to us may be in their handshake at once (they hold
    /// no peer slot); more are closed at once.
    #[arg(long, env = "POTLUCK_MAX_PENDING_HANDSHAKES", default_value_t = 128)]
    pub max_pending_handshakes: usize,
    /// At most this many of those from one IPv4 address or one IPv6 /64.
    #[arg(
        long,
        env = "POTLUCK_MAX_PENDING_HANDSHAKES_PER_IP",
        default_value_t = 8
    )]
    pub max_pending_handshakes_per_ip: usize,
    /// Seconds a peer that connects to us has to finish its handshake (keys,
    /// authenticate, hello) before it is closed. Our own dials wait 30 s.
    #[arg(long, env = "POTLUCK_HANDSHAKE_TIMEOUT_SECS", default_value_t = 10)]
    pub handshake_timeout_secs: u64,
    /// At most this many channels opened by peers may wait for the peer's anchor at once.
    #[arg(long, env = "POTLUCK_MAX_PENDING_OPENINGS", default_value_t = 50)]
    pub max_pending_openings: usize,
    /// Blocks to wait for a peer's anchor to appear on chain before forgetting the opening.
    #[arg(long, env = "POTLUCK_ANCHOR_WAIT_BLOCKS", default_value_t = 144)]
    pub anchor_wait_blocks: u32,
    /// Forwarding fee, fixed part, in millisatoshi: a hop earns
    /// fee-base-msat + floor(amount forwarded × fee-per-millionth / 1,000,000) msat.
    #[arg(long, env = "POTLUCK_FEE_BASE_MSAT", default_value_t = 1_000)]
    pub fee_base_msat: u64,
    /// Forwarding fee, proportional part, in millionths of the amount forwarded.
    #[arg(long, env = "POTLUCK_FEE_PER_MILLIONTH", default_value_t = 10)]
    pub fee_per_millionth: u64,
    /// Blocks kept between the expiry of an HTLC we forward and the one we offer for it; at
    /// least 10 (the refund deadline, a block and the claim lead; each forward also needs
    /// both channels' delays on top).
    #[arg(long, env = "POTLUCK_EXPIRY_DELTA", default_value_t = 40,
          value_parser = clap::value_parser!(u32).range(i64::from(node::MIN_EXPIRY_DELTA)..))]
    pub expiry_delta: u32,
    /// The furthest above the chain's tip, in blocks, an incoming HTLC we are to forward
    /// may expire; a later one is declined (cannot_route): a peer could lock our money that long.
    #[arg(long, env = "POTLUCK_MAX_EXPIRY_BLOCKS", default_value_t = 2016)]
    pub max_expiry_blocks: u32,
    /// At most this many forwarded HTLCs in flight on one outgoing channel.
    #[arg(
        long,
        env = "POTLUCK_MAX_FORWARDED_HTLCS_PER_CHANNEL",
        default_value_t = 30
    )]
    pub max_forwarded_htlcs_per_channel: usize,
    /// At most this many forwarded HTLCs in flight in all.
    #[arg(long, env = "POTLUCK_MAX_FORWARDED_HTLCS", default_value_t = 483)]
    pub max_forwarded_htlcs: usize,
    /// The percentage (0-100) of an outgoing channel's capacity that forwarded HTLCs in
    /// flight on it may lock.
    #[arg(long, env = "POTLUCK_MAX_FORWARD_SHARE_PERCENT", default_value_t = 50,
          value_parser = clap::value_parser!(u8).range(0..=100))]
    pub max_forward_share_percent: u8,
    /// Threads that run the node's tasks (peers, channels, the control API). One is the
    /// default: on the measured hub it did the same work for less CPU and fewer flushes
    /// than one thread per core (docs/node.md, "Threads"), and one is tokio's
    /// current-thread runtime; SQLite writes on a thread of its own either way.
    #[arg(long, env = "POTLUCK_RUNTIME_THREADS", default_value_t = std::num::NonZeroUsize::MIN,
          value_parser = runtime_threads)]
    pub runtime_threads: std::num::NonZeroUsize,
    // The groups last: each flattened group titles the flags that follow it in --help.
    /// The network and the chain (development chain or Bitcoin Core), as `serve` reads them.
    #[command(flatten)]
    pub chain: ChainFlags,
    /// The fee floor, ceiling and fallback of every estimate (the anchors we fund …).
    #[command(flatten)]
    pub fees: crate::fee_flags::FeeFlags,
    /// TEST ONLY: enable the `dev-broadcast-revoked` control method, which broadcasts a
    /// revoked commitment (the peer then takes every output with the penalty). Never in production.
    #[cfg(feature = "test-hooks")]
    #[arg(long, env = "POTLUCK_DEV_ALLOW_CHEAT", hide = true)]
    pub dev_allow_cheat: bool,
}

/// `--runtime-threads`: 1 to 256.
fn runtime_threads(s: &str) -> Result<std::num::NonZeroUsize, String> {
    s.parse::<std::num::NonZeroUsize>()
        .ok()
        .filter(|n| n.get() <= 256)
        .ok_or_else(|| format!("`{s}` is not a thread count from 1 to 256"))
}

/// The forwarding flags: our fee schedule and the bounds against griefing.
fn set_forwarding(config: &mut node::NodeConfig, args: &NodeArgs) {
    config.fee_base_msat = args.fee_base_msat;
    config.fee_per_millionth = args.fee_per_millionth;
    config.expiry_delta = args.expiry_delta;
    config.max_expiry_blocks = args.max_expiry_blocks;
    config.max_forwarded_htlcs_per_channel = args.max_forwarded_htlcs_per_channel;
    config.max_forwarded_htlcs = args.max_forwarded_htlcs;
    config.max_forward_share_percent = args.max_forward_share_percent;
}

/// Runs the node until Ctrl-C, SIGTERM or the `stop` method.
///
/// # Errors
/// Bad flags, an unusable data directory, or an address that cannot be bound.
pub async fn run(args: NodeArgs, mut signals: crate::StopSignals) -> anyhow::Result<()> {
    let fee_policy = args.fees.policy().context("fee policy flags")?;
    let network = args.chain.network;
    let (chain, dev): (Arc<dyn Chain>, _) = match args.chain.choice()? {
        ChainChoice::Bitcoind { url, auth } => {
            let mut rpc_config = RpcConfig::new(url, auth);
            rpc_config.fee_policy = fee_policy;
            let rpc =
                BitcoindRpc::new(rpc_config).context("configuring the Bitcoin Core client")?;
            // Refuse a node on another chain. No -txindex needed: the watcher keeps the
            // block of every channel transaction it scans (docs/node.md, "The chain").
            rpc.check_node(network, None)
                .await
                .context("checking the Bitcoin Core node")?;
            (Arc::new(rpc), None)
        }
        ChainChoice::Dev {
            block_interval,
            rpc_bind,
        } => {
            if network != bitcoin::Network::Regtest {
                bail!("the development chain runs regtest only; give --bitcoind-url for {network}");
            }
            let running = DevChain::start(DevChainConfig {
                data_dir: args.data_dir.join("chain"),
                block_interval,
                rpc_bind,
                rpc_auth: None,
            })
            .await
            .context("starting the development chain")?;
            running.chain.set_fee_policy(fee_policy);
            (Arc::new(running.chain.clone()), Some(running))
        }
    };
    let mut config = node::NodeConfig::new(&args.data_dir);
    config.listen = args.listen;
    config.rpc_bind = args.rpc_bind;
    config.network = network;
    config.anchor_wait_blocks = args.anchor_wait_blocks;
    config.max_peers = args.max_peers;
    config.max_pending_handshakes = args.max_pending_handshakes;
    config.max_pending_handshakes_per_ip = args.max_pending_handshakes_per_ip;
    config.inbound_handshake_timeout = Duration::from_secs(args.handshake_timeout_secs);
    config.max_pending_openings = args.max_pending_openings;
    set_forwarding(&mut config, &args);
    // The one setting of the HTLC-expiry close: each new channel keeps it (it is part
    // of the channel's stored config), and the channel judges its refund deadline by it.
    config.channel.force_close_after_expiry_blocks = args.htlc_close_after_blocks;
    let regtest = network == bitcoin::Network::Regtest;
    config.channel.min_depth = args.min_depth.unwrap_or(if regtest { 1 } else { 3 });
    config.channel.delay =
        wire::Locktime::Blocks(args.delay.unwrap_or(if regtest { 6 } else { 144 }));
    config.channel.max_delay_blocks = args.max_their_delay;
    config.update_timeout = Duration::from_secs(args.update_timeout_secs);
    #[cfg(feature = "test-hooks")]
    {
        config.dev_allow_cheat = args.dev_allow_cheat;
        // The SIGKILL tests' crash point (docs/node.md, "Crash safety of a forward").
        config.crash_at = std::env::var("POTLUCK_TEST_CRASH_AT")
            .ok()
            .filter(|s| !s.is_empty());
    }
    let running = node::start(config, chain)
        .await
        .context("starting the node")?;
    println!(
        "potluck node {} peers on {} control on http://{}/",
        running.node_id, running.p2p_addr, running.rpc_addr
    );
    if let Some(url) = dev.as_ref().and_then(|d| d.rpc_url()) {
        println!("development chain JSON-RPC on {url}");
    }
    // `potluck cli --chain --data-dir <data-dir>/chain` finds the embedded chain too.
    let chain_dir = args.data_dir.join("chain");
    let chain_url_file = match dev.as_ref().and_then(|d| d.rpc_addr) {
        Some(addr) => Some(
            node::control_url::write(&chain_dir, addr)
                .with_context(|| format!("writing the control URL into {}", chain_dir.display()))?,
        ),
        None => None,
    };
    tokio::select! {
        _ = running.stopped() => {}
        () = signals.recv() => {}
    }
    running.shutdown().await;
    if let Some(dev) = dev {
        dev.shutdown().await;
    }
    if let Some(file) = chain_url_file {
        let _ = std::fs::remove_file(file);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser};

    use super::*;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        node: NodeArgs,
    }

    /// The flags and their environment variables, as before the chain flags were shared
    /// with `serve` (docs/node.md and the black-box tests use them).
    #[test]
    fn every_flag_and_variable_is_still_there() {
        let mut flags: Vec<String> = Wrapper::command()
            .get_arguments()
            .filter(|a| a.get_long() != Some("dev-allow-cheat"))
            .filter_map(|a| {
                Some(format!(
                    "--{} {}",
                    a.get_long()?,
                    a.get_env()?.to_string_lossy()
                ))
            })
            .collect();
        flags.sort();
        let before = [
            "--anchor-wait-blocks POTLUCK_ANCHOR_WAIT_BLOCKS",
            "--bitcoind-cookie POTLUCK_BITCOIND_COOKIE",
            "--bitcoind-password POTLUCK_BITCOIND_PASSWORD",
            "--bitcoind-url POTLUCK_BITCOIND_URL",
            "--bitcoind-user POTLUCK_BITCOIND_USER",
            "--data-dir POTLUCK_DATA_DIR",
            "--delay POTLUCK_DELAY",
            "--dev-block-interval POTLUCK_DEV_BLOCK_INTERVAL",
            "--dev-chain-rpc-bind POTLUCK_DEV_CHAIN_RPC_BIND",
            "--expiry-delta POTLUCK_EXPIRY_DELTA",
            "--fee-base-msat POTLUCK_FEE_BASE_MSAT",
            "--fee-ceiling-sat-vb POTLUCK_FEE_CEILING_SAT_VB",
            "--fee-fallback-sat-vb POTLUCK_FEE_FALLBACK_SAT_VB",
            "--fee-floor-sat-vb POTLUCK_FEE_FLOOR_SAT_VB",
            "--fee-per-millionth POTLUCK_FEE_PER_MILLIONTH",
            "--handshake-timeout-secs POTLUCK_HANDSHAKE_TIMEOUT_SECS",
            "--htlc-close-after-blocks POTLUCK_HTLC_CLOSE_AFTER_BLOCKS",
            "--listen POTLUCK_LISTEN",
            "--max-expiry-blocks POTLUCK_MAX_EXPIRY_BLOCKS",
            "--max-forward-share-percent POTLUCK_MAX_FORWARD_SHARE_PERCENT",
            "--max-forwarded-htlcs POTLUCK_MAX_FORWARDED_HTLCS",
            "--max-forwarded-htlcs-per-channel POTLUCK_MAX_FORWARDED_HTLCS_PER_CHANNEL",
            "--max-peers POTLUCK_MAX_PEERS",
            "--max-pending-handshakes POTLUCK_MAX_PENDING_HANDSHAKES",
            "--max-pending-handshakes-per-ip POTLUCK_MAX_PENDING_HANDSHAKES_PER_IP",
            "--max-pending-openings POTLUCK_MAX_PENDING_OPENINGS",
            "--max-their-delay POTLUCK_MAX_THEIR_DELAY",
            "--min-depth POTLUCK_MIN_DEPTH",
            "--network POTLUCK_NETWORK",
            "--rpc-bind POTLUCK_RPC_BIND",
            "--runtime-threads POTLUCK_RUNTIME_THREADS",
            "--update-timeout-secs POTLUCK_UPDATE_TIMEOUT_SECS",
        ];
        assert_eq!(flags, before);
    }

    #[test]
    fn debug_never_shows_the_rpc_password() {
        let w = Wrapper::try_parse_from([
            "node",
            "--bitcoind-url",
            "http://127.0.0.1:8332/",
            "--bitcoind-user",
            "potluck",
            "--bitcoind-password",
            "rpc-pass-secret",
        ])
        .unwrap();
        let text = format!("{:?} {:?}", w.node, w.node.chain.choice().unwrap());
        assert!(!text.contains("rpc-pass-secret"), "{text}");
        assert!(text.contains("potluck"), "{text}");
    }

    /// A delta below what a forward needs to resolve on chain in time is refused by the
    /// parser (docs/node.md, "Forwarding on chain").
    #[test]
    fn the_expiry_delta_is_at_least_the_on_chain_floor() {
        let parse = |delta: &str| Wrapper::try_parse_from(["x", "--expiry-delta", delta]);
        let least = node::MIN_EXPIRY_DELTA;
        assert_eq!(parse(&least.to_string()).unwrap().node.expiry_delta, least);
        let below = parse(&(least - 1).to_string()).err().expect("refused");
        assert!(below.to_string().contains("--expiry-delta"), "{below}");
        assert_eq!(
            Wrapper::try_parse_from(["x"]).unwrap().node.expiry_delta,
            40
        );
    }

    /// One runtime thread unless asked; zero or more than 256 are refused by the parser.
    #[test]
    fn runtime_threads_default_to_one_and_are_bounded() {
        let parse = |n: &str| Wrapper::try_parse_from(["x", "--runtime-threads", n]);
        assert_eq!(
            Wrapper::try_parse_from(["x"])
                .unwrap()
                .node
                .runtime_threads
                .get(),
            1
        );
        assert_eq!(parse("4").unwrap().node.runtime_threads.get(), 4);
        for bad in ["0", "257", "two"] {
            let e = parse(bad).err().expect("refused");
            assert!(e.to_string().contains("--runtime-threads"), "{e}");
        }
    }
}
