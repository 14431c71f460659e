//! `potluck serve`: flags (each also `POTLUCK_<FLAG>`) mapped onto the rounds service's typed config, then run until SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use potluck_rounds::http::client_ip::Cidr;
use potluck_rounds::security::password::HashParams;
use potluck_rounds::server::ServerLimits;
use potluck_rounds::{Application, ChainSource, Config};

/// Flags of `potluck serve`. Secret values are never shown: not by
/// `--help` (environment values hidden), not by `Debug`.
#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the bound address is printed).
    #[arg(long, env = "POTLUCK_BIND", default_value = "127.0.0.1:8080")]
    bind: SocketAddr,
    /// Holds the SQLite database, the token secret and the wallet seed.
    #[arg(long, env = "POTLUCK_DATA_DIR", default_value = "./potluck-data")]
    data_dir: PathBuf,
    /// sqlite://FILE or postgres://…; default: SQLite in the data directory.
    #[arg(long, env = "POTLUCK_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// bitcoin, testnet, testnet4, signet or regtest.
    #[arg(long, env = "POTLUCK_NETWORK", default_value = "regtest")]
    network: bitcoin::Network,
    /// Token for the X-Admin-Token header (at least 16 characters); unset or empty disables admin access.
    #[arg(long, env = "POTLUCK_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Reverse proxies in front of the service that append to X-Forwarded-For (counted from the right).
    #[arg(long, env = "POTLUCK_TRUSTED_PROXY_HOPS", default_value_t = 1)]
    trusted_proxy_hops: usize,
    /// Networks (CIDR, comma-separated) whose connections may set X-Forwarded-For; empty = none.
    #[arg(
        long,
        env = "POTLUCK_TRUSTED_PROXIES",
        default_value = "127.0.0.0/8,::1/128"
    )]
    trusted_proxies: String,
    /// Session-token signing secret; by default generated once into the data directory.
    #[arg(long, env = "POTLUCK_JWT_SECRET", hide_env_values = true)]
    jwt_secret: Option<String>,
    /// Argon2id memory in KiB (OWASP: 19456).
    #[arg(long, env = "POTLUCK_ARGON2_MEMORY_KIB", default_value_t = HashParams::OWASP.memory_kib)]
    argon2_memory_kib: u32,
    /// Argon2id passes (OWASP: 2).
    #[arg(long, env = "POTLUCK_ARGON2_ITERATIONS", default_value_t = HashParams::OWASP.iterations)]
    argon2_iterations: u32,
    /// Argon2id lanes (OWASP: 1).
    #[arg(long, env = "POTLUCK_ARGON2_PARALLELISM", default_value_t = HashParams::OWASP.parallelism)]
    argon2_parallelism: u32,
    /// Password hashes that may run at once (default: one per CPU core).
    #[arg(long, env = "POTLUCK_HASHING_CONCURRENCY", value_parser = at_least_one::<usize>())]
    hashing_concurrency: Option<usize>,
    /// Failed logins per username before lockouts start.
    #[arg(long, env = "POTLUCK_LOGIN_USER_FREE_FAILURES", default_value_t = 5)]
    login_user_free_failures: u32,
    /// Failed logins per client IP before lockouts start.
    #[arg(long, env = "POTLUCK_LOGIN_IP_FREE_FAILURES", default_value_t = 20)]
    login_ip_free_failures: u32,
    /// Longest login lockout, seconds.
    #[arg(long, env = "POTLUCK_LOGIN_MAX_LOCKOUT_SECS", default_value_t = 900)]
    login_max_lockout_secs: u64,
    /// Hard cap of keys tracked by the login throttle.
    #[arg(
        long,
        env = "POTLUCK_LOGIN_THROTTLE_MAX_KEYS",
        default_value_t = 50_000, value_parser = at_least_one::<usize>())]
    login_throttle_max_keys: usize,
    /// Registrations per client IP per window.
    #[arg(long, env = "POTLUCK_REGISTRATION_QUOTA", default_value_t = 5)]
    registration_quota: usize,
    /// The registration quota's rolling window, seconds.
    #[arg(long, env = "POTLUCK_REGISTRATION_WINDOW_SECS", default_value_t = 3600)]
    registration_window_secs: u64,
    /// Hard cap of IPs tracked by the registration quota.
    #[arg(
        long,
        env = "POTLUCK_REGISTRATION_QUOTA_MAX_KEYS",
        default_value_t = 50_000, value_parser = at_least_one::<usize>())]
    registration_quota_max_keys: usize,
    /// Concurrent stream subscribers in total.
    #[arg(long, env = "POTLUCK_MAX_STREAM_SUBSCRIBERS", default_value_t = 500)]
    max_stream_subscribers: usize,
    /// Concurrent streams per client IP.
    #[arg(long, env = "POTLUCK_MAX_STREAMS_PER_IP", default_value_t = 5, value_parser = at_least_one::<usize>())]
    max_streams_per_ip: usize,
    /// Seconds between keep-alive comments on an idle stream.
    #[arg(long, env = "POTLUCK_STREAM_KEEPALIVE_SECS", default_value_t = 15, value_parser = at_least_one::<u64>())]
    stream_keepalive_secs: u64,
    /// Time-out of every request except the stream, seconds.
    #[arg(long, env = "POTLUCK_REQUEST_TIMEOUT_SECS", default_value_t = 30, value_parser = at_least_one::<u64>())]
    request_timeout_secs: u64,
    /// Largest accepted request body, bytes.
    #[arg(long, env = "POTLUCK_BODY_LIMIT_BYTES", default_value_t = 65_536)]
    body_limit_bytes: usize,
    /// Round length of a fresh install (afterwards: PUT /admin/config).
    #[arg(long, env = "POTLUCK_ROUND_DURATION_SECONDS", default_value_t = 120, value_parser = at_least_one_signed::<i64>())]
    round_duration_seconds: i64,
    /// Largest share (percent) of a bet that its own pot input may cost in fees at the current fee rate.
    #[arg(long, env = "POTLUCK_MAX_BET_INPUT_FEE_PERCENT", default_value_t = 50)]
    max_bet_input_fee_percent: u32,
    /// Most bets one user places in one round (its share of the round's 1,400).
    #[arg(long, env = "POTLUCK_MAX_BETS_PER_USER_PER_ROUND", default_value_t = 140, value_parser = clap::value_parser!(i64).range(1..=1400))]
    max_bets_per_user_per_round: i64,
    /// The HTTP server's limits.
    #[command(flatten)]
    server: ServerLimitArgs,
    /// Database connections in the pool.
    #[arg(long, env = "POTLUCK_DB_CONNECTIONS", default_value_t = 16, value_parser = at_least_one_signed::<u32>())]
    db_connections: u32,
    /// Bitcoin Core JSON-RPC URL; without it the development chain runs in process (regtest only).
    #[arg(long, env = "POTLUCK_BITCOIND_URL")]
    bitcoind_url: Option<String>,
    /// Bitcoin Core cookie file (default auth with --bitcoind-url).
    #[arg(
        long,
        env = "POTLUCK_BITCOIND_COOKIE",
        conflicts_with = "bitcoind_user"
    )]
    bitcoind_cookie: Option<PathBuf>,
    /// Bitcoin Core RPC user (with --bitcoind-password).
    #[arg(long, env = "POTLUCK_BITCOIND_USER", requires = "bitcoind_password")]
    bitcoind_user: Option<String>,
    /// Bitcoin Core RPC password.
    #[arg(
        long,
        env = "POTLUCK_BITCOIND_PASSWORD",
        hide_env_values = true,
        requires = "bitcoind_user"
    )]
    bitcoind_password: Option<String>,
    /// Development chain: seconds between blocks (0 = blocks only on demand).
    #[arg(long, env = "POTLUCK_DEV_BLOCK_INTERVAL", default_value_t = 15)]
    dev_block_interval: u64,
    /// Development chain: serve its bitcoind-style JSON-RPC here (cookie in <data-dir>/chain/.cookie).
    #[arg(long, env = "POTLUCK_DEV_CHAIN_RPC_BIND")]
    dev_chain_rpc_bind: Option<SocketAddr>,
    /// The fee floor, ceiling and fallback of every estimate.
    #[command(flatten)]
    fees: crate::fee_flags::FeeFlags,
    /// A withdrawal or payout unconfirmed for this many blocks is replaced at the current estimate (BIP125); 0 = never.
    #[arg(long, env = "POTLUCK_BUMP_AFTER_BLOCKS", default_value_t = 3)]
    bump_after_blocks: u32,
    /// Most fee rate a replacement pays, sat/vB.
    #[arg(long, env = "POTLUCK_BUMP_MAX_FEE_SAT_VB", default_value = "100", value_parser = chain::fees::parse_sat_per_vb)]
    bump_max_fee_sat_vb: bitcoin::FeeRate,
    /// Most share (percent) of a withdrawal's or payout's amount its fee may take after bumps.
    #[arg(long, env = "POTLUCK_BUMP_MAX_FEE_PERCENT", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100))]
    bump_max_fee_percent: u32,
}

impl std::fmt::Debug for ServeArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeArgs")
            .field("bind", &self.bind)
            .field("data_dir", &self.data_dir)
            .field("network", &self.network)
            .finish_non_exhaustive()
    }
}

/// The HTTP server's limits ([`ServerLimits`]); the defaults are its own.
#[derive(Debug, Args)]
pub struct ServerLimitArgs {
    /// A client must send a request's complete headers within this many seconds.
    #[arg(long, env = "POTLUCK_HEADER_READ_TIMEOUT_SECS", default_value_t = ServerLimits::default().header_read_timeout.as_secs(), value_parser = at_least_one::<u64>())]
    header_read_timeout_secs: u64,
    /// A keep-alive connection without a request for this many seconds is closed.
    #[arg(long, env = "POTLUCK_IDLE_TIMEOUT_SECS", default_value_t = ServerLimits::default().idle_timeout.as_secs(), value_parser = at_least_one::<u64>())]
    idle_timeout_secs: u64,
    /// Connections served at once; further ones wait in the listen backlog.
    #[arg(long, env = "POTLUCK_MAX_CONNECTIONS", default_value_t = ServerLimits::default().max_connections, value_parser = at_least_one::<usize>())]
    max_connections: usize,
    /// On SIGINT/SIGTERM, in-flight requests get this many seconds before connections are dropped.
    #[arg(long, env = "POTLUCK_SHUTDOWN_GRACE_SECS", default_value_t = ServerLimits::default().shutdown_grace.as_secs())]
    shutdown_grace_secs: u64,
}

impl ServerLimitArgs {
    /// The limits these flags describe.
    fn limits(&self) -> ServerLimits {
        ServerLimits {
            header_read_timeout: Duration::from_secs(self.header_read_timeout_secs),
            idle_timeout: Duration::from_secs(self.idle_timeout_secs),
            max_connections: self.max_connections,
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
        }
    }
}

/// A count or a time of at least 1: 0 would turn off what it sizes, so
/// the parser refuses it (naming the flag) rather than raising it quietly.
fn at_least_one<T>() -> clap::builder::RangedU64ValueParser<T>
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
    <T as TryFrom<u64>>::Error: std::error::Error + Send + Sync + 'static,
{
    clap::builder::RangedU64ValueParser::new().range(1..)
}

/// [`at_least_one`] for the flags stored in a signed or narrower type.
fn at_least_one_signed<T>() -> clap::builder::RangedI64ValueParser<T>
where
    T: TryFrom<i64> + Clone + Send + Sync + 'static,
    <T as TryFrom<i64>>::Error: std::error::Error + Send + Sync + 'static,
{
    clap::builder::RangedI64ValueParser::new().range(1..)
}

impl ServeArgs {
    /// The service configuration these flags describe.
    pub fn into_config(self) -> anyhow::Result<Config> {
        let mut c = Config::new(self.data_dir);
        c.bind = self.bind;
        c.database_url = self.database_url;
        c.network = self.network;
        c.admin_token = self.admin_token;
        c.trusted_proxy_hops = self.trusted_proxy_hops;
        c.trusted_proxies = self
            .trusted_proxies
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::parse::<Cidr>)
            .collect::<Result<_, _>>()
            .context("--trusted-proxies")?;
        c.jwt_secret = self.jwt_secret;
        c.hash_params = HashParams {
            memory_kib: self.argon2_memory_kib,
            iterations: self.argon2_iterations,
            parallelism: self.argon2_parallelism,
        };
        if let Some(n) = self.hashing_concurrency {
            c.hashing_concurrency = n;
        }
        c.server = self.server.limits();
        c.throttle.user_free_failures = self.login_user_free_failures;
        c.throttle.ip_free_failures = self.login_ip_free_failures;
        c.throttle.max_lockout = Duration::from_secs(self.login_max_lockout_secs);
        c.throttle.max_keys = self.login_throttle_max_keys;
        c.quota.limit = self.registration_quota;
        c.quota.window = Duration::from_secs(self.registration_window_secs);
        c.quota.max_keys = self.registration_quota_max_keys;
        c.stream.max_subscribers = self.max_stream_subscribers;
        c.stream.max_per_ip = self.max_streams_per_ip;
        c.keep_alive = Duration::from_secs(self.stream_keepalive_secs);
        c.request_timeout = Duration::from_secs(self.request_timeout_secs);
        c.body_limit_bytes = self.body_limit_bytes;
        c.default_round_duration_seconds = self.round_duration_seconds;
        c.max_db_connections = self.db_connections;
        c.max_bet_input_fee_percent = self.max_bet_input_fee_percent;
        c.fee_policy = self.fees.policy().context("fee policy flags")?;
        c.max_user_round_bets = self.max_bets_per_user_per_round;
        c.bump = potluck_rounds::domain::bump::BumpPolicy {
            after_blocks: self.bump_after_blocks,
            max_fee_rate: self.bump_max_fee_sat_vb,
            max_fee_percent: self.bump_max_fee_percent,
        };
        c.chain = match self.bitcoind_url {
            Some(url) => {
                let auth = match (self.bitcoind_user, self.bitcoind_password, self.bitcoind_cookie) {
                    (Some(u), Some(p), _) => chain::Auth::UserPass(u, p),
                    (_, _, Some(cookie)) => chain::Auth::Cookie(cookie),
                    _ => anyhow::bail!(
                        "--bitcoind-url needs --bitcoind-cookie FILE or --bitcoind-user and --bitcoind-password"
                    ),
                };
                ChainSource::Bitcoind { url, auth }
            }
            None => ChainSource::Dev {
                block_interval: (self.dev_block_interval > 0)
                    .then(|| Duration::from_secs(self.dev_block_interval)),
                rpc_bind: self.dev_chain_rpc_bind,
            },
        };
        Ok(c)
    }
}

/// Runs the service until SIGINT or SIGTERM.
///
/// # Errors
/// Start-up failures (including a refused schema upgrade) and server errors.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    crate::init_logging();
    let config = args.into_config()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let mut signals = crate::StopSignals::register()?;
        let app = Application::build(config)
            .await
            .context("potluck serve could not start")?;
        // Tests and scripts read the bound address from this line.
        println!("potluck serve listening on http://{}", app.local_addr());
        // The second line, when the development chain serves its RPC.
        if let Some(rpc) = app.dev_chain_rpc_addr() {
            println!("potluck serve dev chain RPC on http://{rpc}");
        }
        tracing::info!(addr = %app.local_addr(), "listening");
        app.run_until_stopped(async move { signals.recv().await })
            .await
            .context("server failed")?;
        tracing::info!("stopped");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        serve: ServeArgs,
    }

    #[test]
    fn production_defaults_are_owasp_and_the_documented_limits() {
        let c = Wrapper::try_parse_from(["serve"])
            .unwrap()
            .serve
            .into_config()
            .unwrap();
        assert_eq!(
            c.hash_params,
            HashParams {
                memory_kib: 19_456,
                iterations: 2,
                parallelism: 1
            }
        );
        assert_eq!(c.bind, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.trusted_proxy_hops, 1);
        assert_eq!(c.trusted_proxies, Cidr::loopback());
        assert_eq!(c.network, bitcoin::Network::Regtest);
        assert_eq!(
            (c.throttle.user_free_failures, c.throttle.ip_free_failures),
            (5, 20)
        );
        assert_eq!(c.throttle.max_lockout, Duration::from_secs(900));
        assert_eq!(c.throttle.max_keys, 50_000);
        assert_eq!(
            (c.quota.limit, c.quota.window),
            (5, Duration::from_secs(3600))
        );
        assert_eq!((c.stream.max_subscribers, c.stream.max_per_ip), (500, 5));
        assert_eq!(c.keep_alive, Duration::from_secs(15));
        assert_eq!(c.server, ServerLimits::default());
        assert!(c.admin_token.is_none());
        assert_eq!(c.fee_policy, chain::FeePolicy::default());
        assert_eq!(c.bump, potluck_rounds::domain::bump::BumpPolicy::default());
        match c.chain {
            ChainSource::Dev {
                block_interval,
                rpc_bind,
            } => {
                assert_eq!(block_interval, Some(Duration::from_secs(15)));
                assert!(rpc_bind.is_none());
            }
            other => panic!("default chain is the dev chain, got {other:?}"),
        }
    }

    #[test]
    fn bitcoind_needs_credentials_and_interval_zero_means_on_demand() {
        let err = Wrapper::try_parse_from(["serve", "--bitcoind-url", "http://127.0.0.1:8332/"])
            .unwrap()
            .serve
            .into_config();
        assert!(err.is_err());
        let c = Wrapper::try_parse_from([
            "serve",
            "--bitcoind-url",
            "http://127.0.0.1:8332/",
            "--bitcoind-user",
            "u",
            "--bitcoind-password",
            "p",
        ])
        .unwrap()
        .serve
        .into_config()
        .unwrap();
        assert!(matches!(c.chain, ChainSource::Bitcoind { .. }));
        let c = Wrapper::try_parse_from(["serve", "--dev-block-interval", "0"])
            .unwrap()
            .serve
            .into_config()
            .unwrap();
        assert!(matches!(
            c.chain,
            ChainSource::Dev {
                block_interval: None,
                ..
            }
        ));
    }

    /// A count or a time that must be at least 1 is refused by the parser,
    /// naming the flag, rather than raised to 1 behind the operator's back.
    #[test]
    fn zero_where_at_least_one_is_needed_is_refused_by_the_parser() {
        for flag in [
            "--hashing-concurrency",
            "--header-read-timeout-secs",
            "--idle-timeout-secs",
            "--max-connections",
            "--login-throttle-max-keys",
            "--registration-quota-max-keys",
            "--max-streams-per-ip",
            "--stream-keepalive-secs",
            "--request-timeout-secs",
            "--round-duration-seconds",
            "--db-connections",
        ] {
            let refused = Wrapper::try_parse_from(["serve", flag, "0"]);
            let err = refused
                .err()
                .unwrap_or_else(|| panic!("{flag} 0 was accepted"));
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{flag}"
            );
            assert!(err.to_string().contains(flag), "{flag}: {err}");
            let one = Wrapper::try_parse_from(["serve", flag, "1"]);
            assert!(one.is_ok_and(|w| w.serve.into_config().is_ok()), "{flag} 1");
        }
    }
}
