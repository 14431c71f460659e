//! `potluck cli`: the node's control API from the command line, like `lightning-cli`.

use std::path::PathBuf;

use anyhow::Context as _;
use chain::{Auth, BitcoindRpc, RpcConfig, RpcError};
use serde_json::Value;

/// Flags of `potluck cli`.
#[derive(Debug, clap::Args)]
pub struct CliArgs {
    /// The node's control API.
    #[arg(long, env = "POTLUCK_RPC", default_value = "http://127.0.0.1:9736/")]
    pub rpc: String,
    /// The node's data directory, where its `.cookie` is.
    #[arg(long, env = "POTLUCK_DATA_DIR", default_value = "./potluck-data/node")]
    pub data_dir: PathBuf,
    /// The method, e.g. getinfo, connect, listpeers, stop.
    pub method: String,
    /// Its arguments; numbers are sent as numbers, everything else as strings.
    pub args: Vec<String>,
}

/// Calls the method and prints its JSON result.
///
/// # Errors
/// The node cannot be reached, refuses the cookie, or answers with an error.
pub fn run(args: CliArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let cookie = args.data_dir.join(".cookie");
    let mut config = RpcConfig::new(args.rpc.clone(), Auth::Cookie(cookie.clone()));
    // Control calls move money: never send one twice.
    config.retries = 0;
    let params: Vec<Value> = args
        .args
        .iter()
        .map(|a| match a.parse::<i64>() {
            Ok(n) => Value::from(n),
            Err(_) => Value::from(a.as_str()),
        })
        .collect();
    let result: Result<Value, RpcError> = runtime.block_on(async {
        let client = BitcoindRpc::new(config)?;
        client.call(&args.method, Value::from(params)).await
    });
    match result {
        Ok(value) => {
            println!("{}", serde_json::to_string_pretty(&value)?);
            Ok(())
        }
        Err(RpcError::Rpc { code, message }) => anyhow::bail!("{message} (code {code})"),
        Err(RpcError::Auth(status)) => anyhow::bail!(
            "the node refused the cookie in {} (HTTP {status}); is --data-dir the node's?",
            cookie.display()
        ),
        Err(e) => {
            Err(anyhow::Error::new(e).context(format!("calling {} on {}", args.method, args.rpc)))
        }
    }
}
