//! The typed configuration of the service, filled by the binary from flags and environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bitcoin::Network;

use crate::password::HashParams;
use crate::quota::QuotaPolicy;
use crate::stream::StreamPolicy;
use crate::throttle::ThrottlePolicy;

/// Where the service's chain comes from.
#[derive(Debug, Clone)]
pub enum ChainSource {
    /// The embedded development chain in `<data_dir>/chain` (regtest only).
    Dev {
        /// Mine a block this often; `None` = only on demand (faucet, RPC).
        block_interval: Option<Duration>,
        /// Serve its JSON-RPC here (cookie in `<data_dir>/chain/.cookie`).
        rpc_bind: Option<SocketAddr>,
    },
    /// A Bitcoin Core node.
    Bitcoind {
        /// `http://host:port/`.
        url: String,
        /// Cookie file or user/password.
        auth: chain::Auth,
    },
}

/// Everything `Application::build` needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on (port 0 picks a free one).
    pub bind: SocketAddr,
    /// Holds the SQLite file, the token secret and the wallet seed.
    pub data_dir: PathBuf,
    /// `sqlite://…` or `postgres://…`; default: a SQLite file in `data_dir`.
    pub database_url: Option<String>,
    /// The chain the service's addresses belong to.
    pub network: Network,
    /// The admin token; `None` or empty disables admin access.
    pub admin_token: Option<String>,
    /// Proxies in front of the service that append to X-Forwarded-For.
    pub trusted_proxy_hops: usize,
    /// Token signing secret; generated once into the data directory if unset.
    pub jwt_secret: Option<String>,
    /// Argon2id parameters (OWASP by default).
    pub hash_params: HashParams,
    /// Password hashes that may run at once.
    pub hashing_concurrency: usize,
    /// Login throttle.
    pub throttle: ThrottlePolicy,
    /// Registration quota.
    pub quota: QuotaPolicy,
    /// Stream caps.
    pub stream: StreamPolicy,
    /// Interval of `: keep-alive` comments on idle streams.
    pub keep_alive: Duration,
    /// Time-out of every request except the stream.
    pub request_timeout: Duration,
    /// Largest accepted request body.
    pub body_limit_bytes: usize,
    /// Round length of a fresh install.
    pub default_round_duration_seconds: i64,
    /// Database connections.
    pub max_db_connections: u32,
    /// The chain.
    pub chain: ChainSource,
    /// How often the engine runs when no new tip arrives.
    pub engine_interval: Duration,
}

impl Config {
    /// Production defaults with the given data directory.
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir,
            database_url: None,
            network: Network::Regtest,
            admin_token: None,
            trusted_proxy_hops: 1,
            jwt_secret: None,
            hash_params: HashParams::OWASP,
            hashing_concurrency: default_hashing_concurrency(),
            throttle: ThrottlePolicy::default(),
            quota: QuotaPolicy::default(),
            stream: StreamPolicy::default(),
            keep_alive: Duration::from_secs(15),
            request_timeout: Duration::from_secs(30),
            body_limit_bytes: 64 * 1024,
            default_round_duration_seconds: 120,
            max_db_connections: 16,
            chain: ChainSource::Dev {
                block_interval: Some(Duration::from_secs(15)),
                rpc_bind: None,
            },
            engine_interval: Duration::from_millis(250),
        }
    }

    /// The database URL in force.
    pub fn effective_database_url(&self) -> String {
        match &self.database_url {
            Some(url) if !url.is_empty() => url.clone(),
            _ => format!("sqlite://{}", self.data_dir.join("potluck.db").display()),
        }
    }
}

/// One hash per core: Argon2 with p = 1 is single-threaded, so more would
/// only queue on the CPU and slow everything else.
pub fn default_hashing_concurrency() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
