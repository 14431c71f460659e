//! `potluck chain`: the development chain as a standalone process speaking
//! the bitcoind JSON-RPC subset.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use chain::{DevChain, DevChainConfig};
use secrecy::ExposeSecret as _;

/// Flags of `potluck chain` (each also `POTLUCK_<FLAG>`).
#[derive(Debug, clap::Args)]
pub struct ChainArgs {
    /// Address of the JSON-RPC server.
    #[arg(long, env = "POTLUCK_RPC_BIND", default_value = "127.0.0.1:18443")]
    pub rpc_bind: SocketAddr,
    /// Directory for blocks, mempool, faucet key and the `.cookie` file.
    #[arg(long, env = "POTLUCK_DATA_DIR", default_value = "./potluck-data/chain")]
    pub data_dir: PathBuf,
    /// RPC user (without it, a cookie file is written in the data directory).
    #[arg(long, env = "POTLUCK_RPC_USER", requires = "rpc_password")]
    pub rpc_user: Option<String>,
    /// RPC password.
    #[arg(
        long,
        env = "POTLUCK_RPC_PASSWORD",
        requires = "rpc_user",
        hide_env_values = true,
        value_parser = crate::chain_flags::secret
    )]
    pub rpc_password: Option<secrecy::SecretString>,
    /// Seconds between blocks mined to the faucet; 0 = blocks only on demand.
    #[arg(long, env = "POTLUCK_BLOCK_INTERVAL", default_value_t = 15)]
    pub block_interval: u64,
    /// Fee-market mode: blocks take only transactions whose ancestor package pays at least this
    /// many sat/vB (at most 3 decimals); unset or 0 = every valid transaction. Changed at run
    /// time with the `setminingfeerate` RPC (not Bitcoin Core's).
    #[arg(long, env = "POTLUCK_MINING_MIN_FEE_SAT_VB", value_parser = chain::fees::parse_sat_per_vb)]
    pub mining_min_fee_sat_vb: Option<bitcoin::FeeRate>,
    /// Keep the transaction index (`-txindex`); `--txindex=false` answers
    /// `getrawtransaction` for confirmed transactions only with a block hash,
    /// as Bitcoin Core does by default.
    #[arg(long, env = "POTLUCK_TXINDEX", default_value_t = true, action = clap::ArgAction::Set)]
    pub txindex: bool,
}

/// Runs the chain until Ctrl-C, SIGTERM or the `stop` RPC.
///
/// # Errors
/// The data directory cannot be opened or the address cannot be bound.
pub async fn run(args: ChainArgs, mut signals: crate::StopSignals) -> anyhow::Result<()> {
    let config = DevChainConfig {
        data_dir: args.data_dir.clone(),
        block_interval: (args.block_interval > 0).then(|| Duration::from_secs(args.block_interval)),
        rpc_bind: Some(args.rpc_bind),
        rpc_auth: args
            .rpc_user
            .zip(args.rpc_password.map(|p| p.expose_secret().to_owned())),
    };
    let running = DevChain::start(config).await.with_context(|| {
        format!(
            "starting the development chain in {}",
            args.data_dir.display()
        )
    })?;
    running.chain.set_mining_min_fee(
        args.mining_min_fee_sat_vb
            .filter(|r| *r > bitcoin::FeeRate::ZERO),
    );
    // Before the address is printed: clients that wait for it never see the other mode.
    running.chain.set_txindex(args.txindex);
    let addr = running.rpc_addr.context("rpc server did not start")?;
    println!(
        "potluck chain: regtest at height {}, JSON-RPC on http://{addr}/",
        running.chain.height()
    );
    if let Some(cookie) = &running.cookie {
        println!("cookie: {}", cookie.display());
    }
    // So that `potluck cli --chain --data-dir DIR` finds this chain, as it finds a node.
    let control_url = node::control_url::write(&args.data_dir, addr)
        .with_context(|| format!("writing the control URL into {}", args.data_dir.display()))?;
    tokio::select! {
        _ = running.stopped() => {}
        () = signals.recv() => {}
    }
    running.shutdown().await;
    let _ = std::fs::remove_file(&control_url);
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        chain: ChainArgs,
    }

    #[test]
    fn debug_never_shows_the_rpc_password() {
        let w = Wrapper::try_parse_from([
            "chain",
            "--rpc-user",
            "u",
            "--rpc-password",
            "rpc-pass-secret",
        ])
        .unwrap();
        let text = format!("{:?}", w.chain);
        assert!(!text.contains("rpc-pass-secret"), "{text}");
    }
}
