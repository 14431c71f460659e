//! `potluck serve`: flags (each also `POTLUCK_<FLAG>`) in groups, each mapped onto its
//! part of the rounds service's typed config, then run until SIGINT/SIGTERM. Every default
//! is the config's own (`Config::new`, the policies' `Default`s), read here, not repeated.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use potluck_rounds::domain::bump::BumpPolicy;
use potluck_rounds::http::client_ip::Cidr;
use potluck_rounds::security::password::HashParams;
use potluck_rounds::security::quota::QuotaPolicy;
use potluck_rounds::security::throttle::ThrottlePolicy;
use potluck_rounds::server::ServerLimits;
use potluck_rounds::service::stream::StreamPolicy;
use potluck_rounds::{Application, ChainSource, Config};
use secrecy::SecretString;

use crate::chain_flags::{secret, ChainChoice, ChainFlags};
use crate::fee_flags::FeeFlags;

/// Where `potluck serve` keeps its files when not told otherwise.
const DEFAULT_DATA_DIR: &str = "./potluck-data";

/// The service's own defaults, which the flags' defaults show and apply.
static DEFAULTS: LazyLock<Config> = LazyLock::new(|| Config::new(PathBuf::from(DEFAULT_DATA_DIR)));

/// [`BumpPolicy::default`]'s fee-rate cap as `--bump-max-fee-sat-vb` reads it.
static BUMP_MAX_FEE_TEXT: LazyLock<String> =
    LazyLock::new(|| sat_per_vb_text(BumpPolicy::default().max_fee_rate));

/// Flags of `potluck serve`, in groups. Secret values are never shown: not by `--help`
/// (environment values hidden), not by `Debug` (they are [`SecretString`]s).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Where the data lives.
    #[command(flatten)]
    store: StoreArgs,
    /// The admin token and the session-token secret.
    #[command(flatten)]
    secrets: SecretArgs,
    /// The HTTP side: address, proxies, time-outs, streams, the server's limits.
    #[command(flatten)]
    http: HttpArgs,
    /// Password hashing, the login throttle and the registration quota.
    #[command(flatten)]
    accounts: AccountArgs,
    /// The game's settings of a fresh install.
    #[command(flatten)]
    game: GameArgs,
    /// The network and the chain (development chain or Bitcoin Core).
    #[command(flatten)]
    chain: ChainFlags,
    /// The fee floor, ceiling and fallback of every estimate.
    #[command(flatten)]
    fees: FeeFlags,
    /// When and how far stuck withdrawals and payouts are bumped.
    #[command(flatten)]
    bump: BumpArgs,
}

/// The data directory and the database.
#[derive(Debug, Args)]
#[command(next_help_heading = "Store")]
struct StoreArgs {
    /// Holds the SQLite database, the token secret and the wallet seed.
    #[arg(long, env = "POTLUCK_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// sqlite://FILE or postgres://…; default: SQLite in the data directory.
    #[arg(long, env = "POTLUCK_DATABASE_URL", hide_env_values = true, value_parser = secret)]
    database_url: Option<SecretString>,
    /// Database connections in the pool.
    #[arg(long, env = "POTLUCK_DB_CONNECTIONS", default_value_t = DEFAULTS.max_db_connections, value_parser = at_least_one_signed::<u32>())]
    db_connections: u32,
}

/// The service's secrets.
#[derive(Debug, Args)]
#[command(next_help_heading = "Secrets")]
struct SecretArgs {
    /// Token for the X-Admin-Token header (at least 16 characters); unset or empty disables admin access.
    #[arg(long, env = "POTLUCK_ADMIN_TOKEN", hide_env_values = true, value_parser = secret)]
    admin_token: Option<SecretString>,
    /// Session-token signing secret; by default generated once into the data directory.
    #[arg(long, env = "POTLUCK_JWT_SECRET", hide_env_values = true, value_parser = secret)]
    jwt_secret: Option<SecretString>,
}

/// The HTTP side of the service.
#[derive(Debug, Args)]
#[command(next_help_heading = "HTTP")]
struct HttpArgs {
    /// Address to listen on (port 0 picks a free port; the bound address is printed).
    #[arg(long, env = "POTLUCK_BIND", default_value_t = DEFAULTS.bind)]
    bind: SocketAddr,
    /// Reverse proxies in front of the service that append to X-Forwarded-For (counted from the right).
    #[arg(long, env = "POTLUCK_TRUSTED_PROXY_HOPS", default_value_t = DEFAULTS.trusted_proxy_hops)]
    trusted_proxy_hops: usize,
    /// Networks (CIDR, comma-separated) whose connections may set X-Forwarded-For; empty = none.
    #[arg(long, env = "POTLUCK_TRUSTED_PROXIES", default_value_t = cidr_list(&DEFAULTS.trusted_proxies))]
    trusted_proxies: String,
    /// Concurrent stream subscribers in total.
    #[arg(long, env = "POTLUCK_MAX_STREAM_SUBSCRIBERS", default_value_t = StreamPolicy::default().max_subscribers)]
    max_stream_subscribers: usize,
    /// Concurrent streams per client IP.
    #[arg(long, env = "POTLUCK_MAX_STREAMS_PER_IP", default_value_t = StreamPolicy::default().max_per_ip, value_parser = at_least_one::<usize>())]
    max_streams_per_ip: usize,
    /// Seconds between keep-alive comments on an idle stream.
    #[arg(long, env = "POTLUCK_STREAM_KEEPALIVE_SECS", default_value_t = DEFAULTS.keep_alive.as_secs(), value_parser = at_least_one::<u64>())]
    stream_keepalive_secs: u64,
    /// Time-out of every request except the stream, seconds.
    #[arg(long, env = "POTLUCK_REQUEST_TIMEOUT_SECS", default_value_t = DEFAULTS.request_timeout.as_secs(), value_parser = at_least_one::<u64>())]
    request_timeout_secs: u64,
    /// Largest accepted request body, bytes.
    #[arg(long, env = "POTLUCK_BODY_LIMIT_BYTES", default_value_t = DEFAULTS.body_limit_bytes)]
    body_limit_bytes: usize,
    /// The HTTP server's limits.
    #[command(flatten)]
    server: ServerLimitArgs,
}

/// Password hashing and the limits on logins and registrations.
#[derive(Debug, Args)]
#[command(next_help_heading = "Accounts")]
struct AccountArgs {
    /// Argon2id memory in KiB (OWASP: 19456).
    #[arg(long, env = "POTLUCK_ARGON2_MEMORY_KIB", default_value_t = DEFAULTS.hash_params.memory_kib)]
    argon2_memory_kib: u32,
    /// Argon2id passes (OWASP: 2).
    #[arg(long, env = "POTLUCK_ARGON2_ITERATIONS", default_value_t = DEFAULTS.hash_params.iterations)]
    argon2_iterations: u32,
    /// Argon2id lanes (OWASP: 1).
    #[arg(long, env = "POTLUCK_ARGON2_PARALLELISM", default_value_t = DEFAULTS.hash_params.parallelism)]
    argon2_parallelism: u32,
    /// Password hashes that may run at once (default: one per CPU core).
    #[arg(long, env = "POTLUCK_HASHING_CONCURRENCY", value_parser = at_least_one::<usize>())]
    hashing_concurrency: Option<usize>,
    /// Failed logins per username before lockouts start.
    #[arg(long, env = "POTLUCK_LOGIN_USER_FREE_FAILURES", default_value_t = ThrottlePolicy::default().user_free_failures)]
    login_user_free_failures: u32,
    /// Failed logins per client IP before lockouts start.
    #[arg(long, env = "POTLUCK_LOGIN_IP_FREE_FAILURES", default_value_t = ThrottlePolicy::default().ip_free_failures)]
    login_ip_free_failures: u32,
    /// Longest login lockout, seconds.
    #[arg(long, env = "POTLUCK_LOGIN_MAX_LOCKOUT_SECS", default_value_t = ThrottlePolicy::default().max_lockout.as_secs())]
    login_max_lockout_secs: u64,
    /// Hard cap of keys tracked by the login throttle.
    #[arg(long, env = "POTLUCK_LOGIN_THROTTLE_MAX_KEYS", default_value_t = ThrottlePolicy::default().max_keys, value_parser = at_least_one::<usize>())]
    login_throttle_max_keys: usize,
    /// Registrations per client IP per window.
    #[arg(long, env = "POTLUCK_REGISTRATION_QUOTA", default_value_t = QuotaPolicy::default().limit)]
    registration_quota: usize,
    /// The registration quota's rolling window, seconds.
    #[arg(long, env = "POTLUCK_REGISTRATION_WINDOW_SECS", default_value_t = QuotaPolicy::default().window.as_secs())]
    registration_window_secs: u64,
    /// Hard cap of IPs tracked by the registration quota.
    #[arg(long, env = "POTLUCK_REGISTRATION_QUOTA_MAX_KEYS", default_value_t = QuotaPolicy::default().max_keys, value_parser = at_least_one::<usize>())]
    registration_quota_max_keys: usize,
}

/// The game's settings of a fresh install (afterwards: PUT /admin/config).
#[derive(Debug, Args)]
#[command(next_help_heading = "Game")]
struct GameArgs {
    /// Round length of a fresh install (afterwards: PUT /admin/config).
    #[arg(long, env = "POTLUCK_ROUND_DURATION_SECONDS", default_value_t = DEFAULTS.default_round_duration_seconds, value_parser = at_least_one_signed::<i64>())]
    round_duration_seconds: i64,
    /// Largest share (percent) of a bet that its own pot input may cost in fees at the current fee rate.
    #[arg(long, env = "POTLUCK_MAX_BET_INPUT_FEE_PERCENT", default_value_t = DEFAULTS.max_bet_input_fee_percent)]
    max_bet_input_fee_percent: u32,
    /// Most bets one user places in one round (its share of the round's 1,400).
    #[arg(long, env = "POTLUCK_MAX_BETS_PER_USER_PER_ROUND", default_value_t = DEFAULTS.max_user_round_bets, value_parser = clap::value_parser!(i64).range(1..=1400))]
    max_bets_per_user_per_round: i64,
}

/// Fee bumping of stuck withdrawals and payouts (BIP125).
#[derive(Debug, Args)]
#[command(next_help_heading = "Fee bumping")]
struct BumpArgs {
    /// A withdrawal or payout unconfirmed for this many blocks is replaced at the current estimate (BIP125); 0 = never.
    #[arg(long, env = "POTLUCK_BUMP_AFTER_BLOCKS", default_value_t = BumpPolicy::default().after_blocks)]
    bump_after_blocks: u32,
    /// Most fee rate a replacement pays, sat/vB.
    #[arg(long, env = "POTLUCK_BUMP_MAX_FEE_SAT_VB", default_value = BUMP_MAX_FEE_TEXT.as_str(), value_parser = chain::fees::parse_sat_per_vb)]
    bump_max_fee_sat_vb: bitcoin::FeeRate,
    /// Most share (percent) of a withdrawal's or payout's amount its fee may take after bumps.
    #[arg(long, env = "POTLUCK_BUMP_MAX_FEE_PERCENT", default_value_t = BumpPolicy::default().max_fee_percent, value_parser = clap::value_parser!(u32).range(1..=100))]
    bump_max_fee_percent: u32,
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
    /// The chain flags (for the test that `node` reads them alike).
    #[cfg(test)]
    pub(crate) fn chain_flags(&self) -> &ChainFlags {
        &self.chain
    }

    /// The service configuration these flags describe.
    pub fn into_config(self) -> anyhow::Result<Config> {
        let mut c = Config::new(self.store.data_dir);
        c.database_url = self.store.database_url;
        c.max_db_connections = self.store.db_connections;
        c.admin_token = self.secrets.admin_token;
        c.jwt_secret = self.secrets.jwt_secret;
        self.http.apply(&mut c)?;
        self.accounts.apply(&mut c);
        c.default_round_duration_seconds = self.game.round_duration_seconds;
        c.max_bet_input_fee_percent = self.game.max_bet_input_fee_percent;
        c.max_user_round_bets = self.game.max_bets_per_user_per_round;
        c.network = self.chain.network;
        c.chain = match self.chain.choice()? {
            ChainChoice::Dev {
                block_interval,
                rpc_bind,
            } => ChainSource::Dev {
                block_interval,
                rpc_bind,
            },
            ChainChoice::Bitcoind { url, auth } => ChainSource::Bitcoind { url, auth },
        };
        c.fee_policy = self.fees.policy().context("fee policy flags")?;
        c.bump = BumpPolicy {
            after_blocks: self.bump.bump_after_blocks,
            max_fee_rate: self.bump.bump_max_fee_sat_vb,
            max_fee_percent: self.bump.bump_max_fee_percent,
        };
        Ok(c)
    }
}

impl HttpArgs {
    /// Sets the HTTP side of `c`.
    fn apply(self, c: &mut Config) -> anyhow::Result<()> {
        c.bind = self.bind;
        c.trusted_proxy_hops = self.trusted_proxy_hops;
        c.trusted_proxies = self
            .trusted_proxies
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::parse::<Cidr>)
            .collect::<Result<_, _>>()
            .context("--trusted-proxies")?;
        c.stream.max_subscribers = self.max_stream_subscribers;
        c.stream.max_per_ip = self.max_streams_per_ip;
        c.keep_alive = Duration::from_secs(self.stream_keepalive_secs);
        c.request_timeout = Duration::from_secs(self.request_timeout_secs);
        c.body_limit_bytes = self.body_limit_bytes;
        c.server = self.server.limits();
        Ok(())
    }
}

impl AccountArgs {
    /// Sets password hashing, the login throttle and the registration quota of `c`.
    fn apply(self, c: &mut Config) {
        c.hash_params = HashParams {
            memory_kib: self.argon2_memory_kib,
            iterations: self.argon2_iterations,
            parallelism: self.argon2_parallelism,
        };
        if let Some(n) = self.hashing_concurrency {
            c.hashing_concurrency = n;
        }
        c.throttle.user_free_failures = self.login_user_free_failures;
        c.throttle.ip_free_failures = self.login_ip_free_failures;
        c.throttle.max_lockout = Duration::from_secs(self.login_max_lockout_secs);
        c.throttle.max_keys = self.login_throttle_max_keys;
        c.quota.limit = self.registration_quota;
        c.quota.window = Duration::from_secs(self.registration_window_secs);
        c.quota.max_keys = self.registration_quota_max_keys;
    }
}

/// The networks as `--trusted-proxies` reads them.
fn cidr_list(cidrs: &[Cidr]) -> String {
    cidrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// A fee rate in sat/vB with at most 3 decimals, as [`chain::fees::parse_sat_per_vb`] reads it.
fn sat_per_vb_text(rate: bitcoin::FeeRate) -> String {
    // 1 sat/vB = 250 sat/kwu: one sat/kwu is 4 thousandths of a sat/vB.
    let milli = rate.to_sat_per_kwu() * 4;
    let (whole, thousandths) = (milli / 1000, milli % 1000);
    if thousandths == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{thousandths:03}")
            .trim_end_matches('0')
            .to_string()
    }
}

/// Runs the service until SIGINT or SIGTERM.
///
/// # Errors
/// Start-up failures (including a refused schema upgrade) and server errors.
pub async fn run(args: ServeArgs, mut signals: crate::StopSignals) -> anyhow::Result<()> {
    let config = args.into_config()?;
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

    /// `serve` without flags runs the service's own defaults, every one of them.
    #[test]
    fn no_flags_give_the_configs_own_defaults() {
        let parsed = Wrapper::try_parse_from(["serve"])
            .unwrap()
            .serve
            .into_config()
            .unwrap();
        let own = Config::new(PathBuf::from("./potluck-data"));
        assert_eq!(format!("{parsed:?}"), format!("{own:?}"));
    }

    /// Each value is refused by the parser, with an error naming its flag, and the
    /// smallest accepted one passes into a config.
    fn refused_naming_the_flag(group: &str, cases: &[(&str, &str, &str)]) {
        for (flag, refused, accepted) in cases {
            // `--flag=value`, so that a negative number is read as the flag's value.
            let err = Wrapper::try_parse_from(["serve", &format!("{flag}={refused}")])
                .err()
                .unwrap_or_else(|| panic!("{group}: {flag} {refused} was accepted"));
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{group}: {flag}"
            );
            assert!(err.to_string().contains(flag), "{group}: {flag}: {err}");
            let ok = Wrapper::try_parse_from(["serve", &format!("{flag}={accepted}")]);
            assert!(
                ok.is_ok_and(|w| w.serve.into_config().is_ok()),
                "{group}: {flag} {accepted}"
            );
        }
    }

    /// A count or a time that must be at least 1 is refused by the parser,
    /// naming the flag, rather than raised to 1 behind the operator's back.
    #[test]
    fn store_flags_out_of_range_are_refused() {
        refused_naming_the_flag(
            "store",
            &[
                ("--db-connections", "0", "1"),
                ("--db-connections", "-1", "16"),
            ],
        );
    }

    #[test]
    fn http_flags_out_of_range_are_refused() {
        refused_naming_the_flag(
            "http",
            &[
                ("--bind", "localhost", "127.0.0.1:0"),
                ("--trusted-proxy-hops", "-1", "0"),
                ("--max-streams-per-ip", "0", "1"),
                ("--stream-keepalive-secs", "0", "1"),
                ("--request-timeout-secs", "0", "1"),
                ("--body-limit-bytes", "-1", "0"),
                ("--header-read-timeout-secs", "0", "1"),
                ("--idle-timeout-secs", "0", "1"),
                ("--max-connections", "0", "1"),
            ],
        );
    }

    #[test]
    fn account_flags_out_of_range_are_refused() {
        refused_naming_the_flag(
            "accounts",
            &[
                ("--hashing-concurrency", "0", "1"),
                ("--login-throttle-max-keys", "0", "1"),
                ("--registration-quota-max-keys", "0", "1"),
                ("--argon2-iterations", "-1", "1"),
                ("--login-max-lockout-secs", "-5", "0"),
            ],
        );
    }

    #[test]
    fn game_flags_out_of_range_are_refused() {
        refused_naming_the_flag(
            "game",
            &[
                ("--round-duration-seconds", "0", "1"),
                ("--max-bets-per-user-per-round", "0", "1"),
                ("--max-bets-per-user-per-round", "1401", "1400"),
                ("--max-bet-input-fee-percent", "-1", "0"),
            ],
        );
    }

    #[test]
    fn chain_fee_and_bump_flags_out_of_range_are_refused() {
        refused_naming_the_flag(
            "chain, fees, bump",
            &[
                ("--network", "mainnet-ish", "signet"),
                ("--dev-block-interval", "-1", "0"),
                ("--dev-chain-rpc-bind", "nowhere", "127.0.0.1:0"),
                ("--fee-floor-sat-vb", "-1", "0.5"),
                ("--bump-max-fee-sat-vb", "1.0001", "12.5"),
                ("--bump-max-fee-percent", "0", "1"),
                ("--bump-max-fee-percent", "101", "100"),
            ],
        );
    }

    /// The flags and their environment variables, as before the flags were grouped
    /// (the black-box tests, the README and docs/deploy.md use them).
    #[test]
    fn every_flag_and_variable_is_still_there() {
        use clap::CommandFactory as _;
        let cmd = Wrapper::command();
        let mut flags: Vec<(String, String)> = cmd
            .get_arguments()
            .filter_map(|a| {
                Some((
                    format!("--{}", a.get_long()?),
                    a.get_env()?.to_string_lossy().into_owned(),
                ))
            })
            .collect();
        flags.sort();
        let before = [
            ("--admin-token", "POTLUCK_ADMIN_TOKEN"),
            ("--argon2-iterations", "POTLUCK_ARGON2_ITERATIONS"),
            ("--argon2-memory-kib", "POTLUCK_ARGON2_MEMORY_KIB"),
            ("--argon2-parallelism", "POTLUCK_ARGON2_PARALLELISM"),
            ("--bind", "POTLUCK_BIND"),
            ("--bitcoind-cookie", "POTLUCK_BITCOIND_COOKIE"),
            ("--bitcoind-password", "POTLUCK_BITCOIND_PASSWORD"),
            ("--bitcoind-url", "POTLUCK_BITCOIND_URL"),
            ("--bitcoind-user", "POTLUCK_BITCOIND_USER"),
            ("--body-limit-bytes", "POTLUCK_BODY_LIMIT_BYTES"),
            ("--bump-after-blocks", "POTLUCK_BUMP_AFTER_BLOCKS"),
            ("--bump-max-fee-percent", "POTLUCK_BUMP_MAX_FEE_PERCENT"),
            ("--bump-max-fee-sat-vb", "POTLUCK_BUMP_MAX_FEE_SAT_VB"),
            ("--data-dir", "POTLUCK_DATA_DIR"),
            ("--database-url", "POTLUCK_DATABASE_URL"),
            ("--db-connections", "POTLUCK_DB_CONNECTIONS"),
            ("--dev-block-interval", "POTLUCK_DEV_BLOCK_INTERVAL"),
            ("--dev-chain-rpc-bind", "POTLUCK_DEV_CHAIN_RPC_BIND"),
            ("--fee-ceiling-sat-vb", "POTLUCK_FEE_CEILING_SAT_VB"),
            ("--fee-fallback-sat-vb", "POTLUCK_FEE_FALLBACK_SAT_VB"),
            ("--fee-floor-sat-vb", "POTLUCK_FEE_FLOOR_SAT_VB"),
            ("--hashing-concurrency", "POTLUCK_HASHING_CONCURRENCY"),
            (
                "--header-read-timeout-secs",
                "POTLUCK_HEADER_READ_TIMEOUT_SECS",
            ),
            ("--idle-timeout-secs", "POTLUCK_IDLE_TIMEOUT_SECS"),
            ("--jwt-secret", "POTLUCK_JWT_SECRET"),
            ("--login-ip-free-failures", "POTLUCK_LOGIN_IP_FREE_FAILURES"),
            ("--login-max-lockout-secs", "POTLUCK_LOGIN_MAX_LOCKOUT_SECS"),
            (
                "--login-throttle-max-keys",
                "POTLUCK_LOGIN_THROTTLE_MAX_KEYS",
            ),
            (
                "--login-user-free-failures",
                "POTLUCK_LOGIN_USER_FREE_FAILURES",
            ),
            (
                "--max-bet-input-fee-percent",
                "POTLUCK_MAX_BET_INPUT_FEE_PERCENT",
            ),
            (
                "--max-bets-per-user-per-round",
                "POTLUCK_MAX_BETS_PER_USER_PER_ROUND",
            ),
            ("--max-connections", "POTLUCK_MAX_CONNECTIONS"),
            ("--max-stream-subscribers", "POTLUCK_MAX_STREAM_SUBSCRIBERS"),
            ("--max-streams-per-ip", "POTLUCK_MAX_STREAMS_PER_IP"),
            ("--network", "POTLUCK_NETWORK"),
            ("--registration-quota", "POTLUCK_REGISTRATION_QUOTA"),
            (
                "--registration-quota-max-keys",
                "POTLUCK_REGISTRATION_QUOTA_MAX_KEYS",
            ),
            (
                "--registration-window-secs",
                "POTLUCK_REGISTRATION_WINDOW_SECS",
            ),
            ("--request-timeout-secs", "POTLUCK_REQUEST_TIMEOUT_SECS"),
            ("--round-duration-seconds", "POTLUCK_ROUND_DURATION_SECONDS"),
            ("--shutdown-grace-secs", "POTLUCK_SHUTDOWN_GRACE_SECS"),
            ("--stream-keepalive-secs", "POTLUCK_STREAM_KEEPALIVE_SECS"),
            ("--trusted-proxies", "POTLUCK_TRUSTED_PROXIES"),
            ("--trusted-proxy-hops", "POTLUCK_TRUSTED_PROXY_HOPS"),
        ]
        .map(|(f, e)| (f.to_string(), e.to_string()));
        assert_eq!(flags, before);
        // Secret values stay out of --help.
        for secret in [
            "admin-token",
            "jwt-secret",
            "database-url",
            "bitcoind-password",
        ] {
            let arg = cmd.get_arguments().find(|a| a.get_long() == Some(secret));
            assert!(arg.is_some_and(|a| a.is_hide_env_values_set()), "{secret}");
        }
    }

    /// No secret given by flag shows in the `Debug` of the flags or of the config.
    #[test]
    fn debug_never_shows_a_secret() {
        let w = Wrapper::try_parse_from([
            "serve",
            "--admin-token",
            "admin-token-secret-1",
            "--jwt-secret",
            "jwt-secret-value-0123456789abcdef",
            "--database-url",
            "postgres://alice:db-pass-secret@db/potluck",
            "--bitcoind-url",
            "http://127.0.0.1:8332/",
            "--bitcoind-user",
            "potluck",
            "--bitcoind-password",
            "rpc-pass-secret",
        ])
        .unwrap();
        let args = format!("{:?}", w.serve);
        let config = format!("{:?}", w.serve.into_config().unwrap());
        for text in [args, config] {
            for secret in [
                "admin-token-secret",
                "jwt-secret-value",
                "db-pass-secret",
                "rpc-pass-secret",
            ] {
                assert!(!text.contains(secret), "{secret} in {text}");
            }
        }
    }

    #[test]
    fn the_bump_cap_default_reads_back_as_the_policys() {
        assert_eq!(BUMP_MAX_FEE_TEXT.as_str(), "100");
        for kwu in [25_000, 125, 813, 3_125] {
            let rate = bitcoin::FeeRate::from_sat_per_kwu(kwu);
            assert_eq!(
                chain::fees::parse_sat_per_vb(&sat_per_vb_text(rate)).unwrap(),
                rate
            );
        }
    }
}
