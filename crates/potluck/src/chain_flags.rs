//! The chain flags of `potluck serve` and `potluck node`, declared once: the network,
//! and the choice between the embedded development chain and Bitcoin Core.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use secrecy::SecretString;

/// Which chain a service runs on (each flag also `POTLUCK_<FLAG>`).
#[derive(Debug, Clone, clap::Args)]
pub struct ChainFlags {
    /// bitcoin, testnet, testnet4, signet or regtest.
    #[arg(long, env = "POTLUCK_NETWORK", default_value = "regtest")]
    pub network: bitcoin::Network,
    /// Bitcoin Core's JSON-RPC URL; without it the development chain runs in process (regtest only).
    #[arg(long, env = "POTLUCK_BITCOIND_URL")]
    pub bitcoind_url: Option<String>,
    /// Bitcoin Core's cookie file (`<datadir>/.cookie`); used unless --bitcoind-user and
    /// --bitcoind-password are given.
    #[arg(long, env = "POTLUCK_BITCOIND_COOKIE")]
    pub bitcoind_cookie: Option<PathBuf>,
    /// Bitcoin Core RPC user (`rpcauth`; with --bitcoind-password, preferred over the cookie).
    #[arg(long, env = "POTLUCK_BITCOIND_USER", requires = "bitcoind_password")]
    pub bitcoind_user: Option<String>,
    /// Bitcoin Core RPC password.
    #[arg(
        long,
        env = "POTLUCK_BITCOIND_PASSWORD",
        hide_env_values = true,
        requires = "bitcoind_user",
        value_parser = secret
    )]
    pub bitcoind_password: Option<SecretString>,
    /// Development chain: seconds between blocks (0 = blocks only on demand).
    #[arg(long, env = "POTLUCK_DEV_BLOCK_INTERVAL", default_value_t = 15)]
    pub dev_block_interval: u64,
    /// Development chain: also serve its bitcoind-style JSON-RPC here (cookie in
    /// `<data-dir>/chain/.cookie`).
    #[arg(long, env = "POTLUCK_DEV_CHAIN_RPC_BIND")]
    pub dev_chain_rpc_bind: Option<SocketAddr>,
}

/// The chain the flags choose.
#[derive(Debug, Clone)]
pub enum ChainChoice {
    /// The development chain, in process.
    Dev {
        /// A block this often; `None` = only on demand.
        block_interval: Option<Duration>,
        /// Where its JSON-RPC is served, if anywhere.
        rpc_bind: Option<SocketAddr>,
    },
    /// Bitcoin Core.
    Bitcoind {
        /// Its JSON-RPC URL.
        url: String,
        /// How to authenticate.
        auth: chain::Auth,
    },
}

impl ChainFlags {
    /// The chain these flags choose. Bitcoin Core's rule, as `bitcoin-cli` applies it:
    /// an explicit user and password win, else the cookie file.
    ///
    /// # Errors
    /// `--bitcoind-url` with neither a cookie file nor a user and password.
    pub fn choice(&self) -> anyhow::Result<ChainChoice> {
        let Some(url) = &self.bitcoind_url else {
            return Ok(ChainChoice::Dev {
                block_interval: (self.dev_block_interval > 0)
                    .then(|| Duration::from_secs(self.dev_block_interval)),
                rpc_bind: self.dev_chain_rpc_bind,
            });
        };
        let auth = match (&self.bitcoind_user, &self.bitcoind_password, &self.bitcoind_cookie) {
            (Some(user), Some(password), _) => chain::Auth::UserPass(user.clone(), password.clone()),
            (_, _, Some(cookie)) => chain::Auth::Cookie(cookie.clone()),
            _ => anyhow::bail!(
                "--bitcoind-url needs --bitcoind-cookie FILE or --bitcoind-user and --bitcoind-password"
            ),
        };
        Ok(ChainChoice::Bitcoind {
            url: url.clone(),
            auth,
        })
    }
}

/// A secret flag value: kept in a [`SecretString`], so that no `Debug` shows it.
pub fn secret(value: &str) -> Result<SecretString, std::convert::Infallible> {
    Ok(SecretString::from(value))
}
