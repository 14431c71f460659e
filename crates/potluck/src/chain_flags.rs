//! The chain flags of `potluck serve` and `potluck node`, declared once: the network,
//! and the choice between the embedded development chain and Bitcoin Core.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use secrecy::SecretString;

/// Which chain a service runs on (each flag also `POTLUCK_<FLAG>`).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Chain")]
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

#[cfg(test)]
mod tests {
    use clap::Parser;
    use secrecy::ExposeSecret as _;

    use super::*;

    /// `serve` and `node` as the user types them, each parsed by its own command.
    #[derive(Parser)]
    struct Potluck {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand)]
    enum Command {
        Serve(Box<crate::serve_cmd::ServeArgs>),
        Node(Box<crate::node_cmd::NodeArgs>),
    }

    /// The chain `potluck <command> <flags>` chooses, as text (`Auth` has no `PartialEq`:
    /// its password is a secret), exposing the password to compare it.
    fn chosen(command: &str, flags: &[&str]) -> anyhow::Result<String> {
        let parsed = Potluck::try_parse_from(["potluck", command].iter().chain(flags))?;
        let chain = match &parsed.command {
            Command::Serve(args) => args.chain_flags(),
            Command::Node(args) => &args.chain,
        };
        Ok(match chain.choice()? {
            ChainChoice::Dev {
                block_interval,
                rpc_bind,
            } => format!("dev {block_interval:?} {rpc_bind:?} {}", chain.network),
            ChainChoice::Bitcoind { url, auth } => {
                let auth = match auth {
                    chain::Auth::Cookie(path) => format!("cookie {}", path.display()),
                    chain::Auth::UserPass(user, password) => {
                        format!("user {user} password {}", password.expose_secret())
                    }
                };
                format!("core {url} {auth} {}", chain.network)
            }
        })
    }

    const CORE: [&str; 2] = ["--bitcoind-url", "http://127.0.0.1:8332/"];

    /// One rule for both commands, Bitcoin Core's: an explicit user and password win over
    /// the cookie file, which is used otherwise.
    #[test]
    fn serve_and_node_choose_the_same_chain_from_the_same_flags() {
        let both = [
            "--bitcoind-cookie",
            "/var/lib/bitcoind/.cookie",
            "--bitcoind-user",
            "potluck",
            "--bitcoind-password",
            "pw",
        ];
        let cases: Vec<(Vec<&str>, &str)> = vec![
            (vec![], "dev Some(15s) None regtest"),
            (
                vec![
                    "--dev-block-interval",
                    "0",
                    "--dev-chain-rpc-bind",
                    "127.0.0.1:18443",
                ],
                "dev None Some(127.0.0.1:18443) regtest",
            ),
            (
                [
                    &CORE[..],
                    &["--bitcoind-cookie", "/c", "--network", "signet"],
                ]
                .concat(),
                "core http://127.0.0.1:8332/ cookie /c signet",
            ),
            (
                [
                    &CORE[..],
                    &["--bitcoind-user", "potluck", "--bitcoind-password", "pw"],
                ]
                .concat(),
                "core http://127.0.0.1:8332/ user potluck password pw regtest",
            ),
            (
                [&CORE[..], &both[..]].concat(),
                "core http://127.0.0.1:8332/ user potluck password pw regtest",
            ),
        ];
        for (flags, expected) in cases {
            for command in ["serve", "node"] {
                let got =
                    chosen(command, &flags).unwrap_or_else(|e| panic!("{command} {flags:?}: {e}"));
                assert_eq!(got, expected, "{command} {flags:?}");
            }
        }
        for command in ["serve", "node"] {
            let none = chosen(command, &CORE).unwrap_err().to_string();
            assert!(none.contains("--bitcoind-cookie"), "{command}: {none}");
            // A password without its user (or the other way round) is refused by the parser.
            for half in [["--bitcoind-user", "u"], ["--bitcoind-password", "p"]] {
                let err = chosen(command, &[&CORE[..], &half[..]].concat()).unwrap_err();
                assert!(
                    err.to_string().contains("--bitcoind-"),
                    "{command} {half:?}: {err}"
                );
            }
        }
    }
}
