//! The typed configuration of the service, filled by the binary from flags and environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bitcoin::Network;
use secrecy::{ExposeSecret as _, SecretString};

use crate::http::client_ip::Cidr;
use crate::security::password::HashParams;
use crate::security::quota::QuotaPolicy;
use crate::security::throttle::ThrottlePolicy;
use crate::server::ServerLimits;
use crate::service::stream::StreamPolicy;

/// Where the service's chain comes from (`Debug` hides the RPC password, also one in the URL).
#[derive(Clone)]
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

/// Everything `Application::build` needs. The secrets, and the database URL
/// (which may hold a password), are [`SecretString`]s: no `Debug` shows them.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on (port 0 picks a free one).
    pub bind: SocketAddr,
    /// Holds the SQLite file, the token secret and the wallet seed.
    pub data_dir: PathBuf,
    /// `sqlite://…` or `postgres://…`; default: a SQLite file in `data_dir`.
    pub database_url: Option<SecretString>,
    /// The chain the service's addresses belong to.
    pub network: Network,
    /// The admin token; `None` or empty disables admin access.
    pub admin_token: Option<SecretString>,
    /// Proxies in front of the service that append to X-Forwarded-For.
    pub trusted_proxy_hops: usize,
    /// Networks whose connections may set X-Forwarded-For (default loopback).
    pub trusted_proxies: Vec<Cidr>,
    /// Token signing secret; generated once into the data directory if unset.
    pub jwt_secret: Option<SecretString>,
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
    /// Largest share (percent) of a bet its own pot input may cost in fees.
    pub max_bet_input_fee_percent: u32,
    /// Most bets one user places in one round.
    pub max_user_round_bets: i64,
    /// Database connections.
    pub max_db_connections: u32,
    /// The chain.
    pub chain: ChainSource,
    /// The floor, ceiling and fallback every fee estimate of the chain is held to.
    pub fee_policy: chain::FeePolicy,
    /// How often the engine runs when no new tip arrives.
    pub engine_interval: Duration,
    /// When and how far stuck withdrawals and payouts are bumped.
    pub bump: crate::domain::bump::BumpPolicy,
    /// Header-read and idle time-outs, connection cap, shutdown deadline.
    pub server: ServerLimits,
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
            trusted_proxies: Cidr::loopback(),
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
            max_bet_input_fee_percent: crate::domain::settings::DEFAULT_MAX_BET_INPUT_FEE_PERCENT,
            max_user_round_bets: crate::domain::settings::DEFAULT_MAX_USER_ROUND_BETS,
            max_db_connections: 16,
            chain: ChainSource::Dev {
                block_interval: Some(Duration::from_secs(15)),
                rpc_bind: None,
            },
            fee_policy: chain::FeePolicy::default(),
            engine_interval: Duration::from_millis(250),
            bump: crate::domain::bump::BumpPolicy::default(),
            server: ServerLimits::default(),
        }
    }

    /// The database URL in force.
    pub fn effective_database_url(&self) -> String {
        match self.database_url.as_ref().map(|u| u.expose_secret()) {
            Some(url) if !url.is_empty() => url.to_owned(),
            _ => format!("sqlite://{}", self.data_dir.join("potluck.db").display()),
        }
    }
}

impl std::fmt::Debug for ChainSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChainSource::Dev {
                block_interval,
                rpc_bind,
            } => f
                .debug_struct("Dev")
                .field("block_interval", block_interval)
                .field("rpc_bind", rpc_bind)
                .finish(),
            ChainSource::Bitcoind { url, auth } => f
                .debug_struct("Bitcoind")
                .field("url", &redact_url(url))
                .field("auth", auth)
                .finish(),
        }
    }
}

/// `url` with the password of its user-info replaced by `***`, for logs
/// and error messages.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let hidden = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}{tail}")
        }
        None => url.to_string(),
    }
}

/// One hash per core: Argon2 with p = 1 is single-threaded, so more would
/// only queue on the CPU and slow everything else.
pub fn default_hashing_concurrency() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_secrets_and_the_database_password() {
        let mut c = Config::new(PathBuf::from("/tmp/x"));
        c.jwt_secret = Some("jwt-secret-value-0123456789abcdef".into());
        c.admin_token = Some("admin-token-value".into());
        c.database_url = Some("postgres://alice:pa55word@db:5432/potluck".into());
        c.chain = ChainSource::Bitcoind {
            url: "http://core:rpc-url-pass@core:8332/".into(),
            auth: chain::Auth::UserPass("potluck".into(), "rpc-pass-value".into()),
        };
        let text = format!("{c:?}");
        for secret in [
            "jwt-secret-value",
            "admin-token-value",
            "pa55word",
            "rpc-url-pass",
            "rpc-pass-value",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(text.contains("http://core:***@core:8332/"), "{text}");
        assert_eq!(
            c.effective_database_url(),
            "postgres://alice:pa55word@db:5432/potluck"
        );
        assert_eq!(redact_url("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
        assert_eq!(redact_url("postgres://bob@h/d"), "postgres://bob@h/d");
    }
}
