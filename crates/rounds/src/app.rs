//! Wiring: `Application` builds every layer (store, services, security, HTTP state), binds, serves and shuts down gracefully.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use secrecy::ExposeSecret as _;

use crate::config::{redact_url, ChainSource, Config};
use crate::domain::address::{AddressBook, AddressError, Bip84AddressBook};
use crate::domain::settings::ServiceConfig;
use crate::domain::time::unix_now;
use crate::http::metrics::Metrics;
use crate::http::views::AnonymousRoundCache;
use crate::http::{router, AppState, Services};
use crate::security::admin_key::AdminKey;
use crate::security::password::{HashError, PasswordHasher};
use crate::security::quota::RegistrationQuota;
use crate::security::throttle::{LoginThrottle, ThrottlePolicy};
use crate::security::token::TokenKeys;
use crate::service::accounts::Accounts;
use crate::service::admin::Administration;
use crate::service::cashier::Cashier;
use crate::service::current::CurrentRound;
use crate::service::engine::Engine;
use crate::service::health::Health;
use crate::service::history::History;
use crate::service::limits::{AdminThrottle, Quota, SharedStreams, Throttle};
use crate::service::stream::StreamHub;
use crate::service::stream::StreamPolicy;
use crate::store::{Store, StoreError};

/// How long GET /rounds/current may serve a cached round (see `current`).
const CURRENT_ROUND_TTL: Duration = Duration::from_millis(500);

/// Wrong admin tokens: ten free per client IP, then doubling lockouts from
/// one second up to fifteen minutes (the login throttle's rules).
const ADMIN_THROTTLE: ThrottlePolicy = ThrottlePolicy {
    user_free_failures: 10,
    ip_free_failures: 10,
    base_lockout: Duration::from_secs(1),
    max_lockout: Duration::from_secs(15 * 60),
    decay_floor: Duration::from_secs(60),
    max_keys: 50_000,
    sweep_interval: Duration::from_secs(60),
};

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartupError {
    /// The data directory or a secret file could not be used.
    #[error("data directory {path}")]
    DataDir {
        /// The path involved.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A secret file holds something else than hex.
    #[error("secret file {0} is corrupt (expected hex)")]
    CorruptSecret(String),
    /// A secret is too short to be safe; names which one (never its value).
    #[error("{0}")]
    WeakSecret(String),
    /// The database could not be opened or migrated.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The wallet seed file could not be read or created.
    #[error("wallet seed")]
    WalletSeed(#[source] wallet::SeedFileError),
    /// The wallet could not derive an address.
    #[error("wallet address derivation")]
    WalletAddress(#[source] AddressError),
    /// The wallet seed does not derive the addresses the database holds.
    #[error("wallet: {0}")]
    WalletMismatch(String),
    /// The session-token secret is not a usable HMAC key.
    #[error("the session-token secret is not a usable key")]
    TokenKey(#[source] hmac::digest::InvalidLength),
    /// This process's wallet seed or session-token secret is not the one
    /// the database was first used with; names which (never its value).
    #[error("{0}")]
    SecretMismatch(String),
    /// Password hashing parameters were refused.
    #[error("password hashing")]
    Hashing(#[source] HashError),
    /// The development chain could not be started.
    #[error("development chain")]
    DevChain(#[source] chain::DevChainError),
    /// Bitcoin Core could not be reached, or is not a node the service can use.
    #[error("Bitcoin Core")]
    Bitcoind(#[source] chain::RpcError),
    /// The chain is not one the service can run on (a refusal of ours).
    #[error("chain: {0}")]
    Chain(String),
    /// The listener could not be bound.
    #[error("bind {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Shortest accepted session-token secret, in bytes (HS256 wants at least
/// the hash's output size).
pub const MIN_JWT_SECRET_BYTES: usize = 32;

/// Shortest accepted admin token, in characters.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 16;

/// Reads a hex secret from `path`, or writes `len` fresh random bytes there
/// atomically and exclusively (temporary file, fsync, hard link to the
/// final name, fsync of the directory), so a crash never leaves a truncated
/// secret behind and two processes starting together end with one secret.
fn load_or_create_secret(path: &Path, len: usize) -> Result<Vec<u8>, StartupError> {
    let io = |source| StartupError::DataDir {
        path: path.display().to_string(),
        source,
    };
    match std::fs::read_to_string(path) {
        Ok(text) => hex::decode(text.trim())
            .map_err(|_| StartupError::CorruptSecret(path.display().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = vec![0u8; len];
            rand::Rng::fill(&mut rand::thread_rng(), bytes.as_mut_slice());
            let tmp = path.with_extension(format!("tmp-{:08x}", rand::random::<u32>()));
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let written: std::io::Result<()> = (|| {
                let mut f = options.open(&tmp)?;
                std::io::Write::write_all(&mut f, hex::encode(&bytes).as_bytes())?;
                f.sync_all()?;
                // A link is an exclusive create: of two processes starting
                // together, one makes the name and the other reads it. (A
                // rename replaced the first one's secret after it had read
                // it: two processes, two secrets.)
                std::fs::hard_link(&tmp, path)?;
                if let Some(dir) = path.parent() {
                    std::fs::File::open(dir)?.sync_all()?;
                }
                Ok(())
            })();
            if let Err(e) = std::fs::remove_file(&tmp).or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            }) {
                tracing::warn!(path = %tmp.display(), error = %e, "could not remove a temporary secret file");
            }
            match written {
                Ok(()) => Ok(bytes),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    load_or_create_secret(path, len)
                }
                Err(e) => Err(io(e)),
            }
        }
        Err(e) => Err(io(e)),
    }
}

/// Creates the data directory private to the service's user (0700).
fn create_data_dir(dir: &Path) -> Result<(), StartupError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|source| StartupError::DataDir {
        path: dir.display().to_string(),
        source,
    })
}

/// Reports (without changing) files and directories that group or others
/// may read: secrets there are as good as published on a shared host.
fn report_loose_permissions(paths: &[std::path::PathBuf]) {
    #[cfg(unix)]
    for path in paths {
        use std::os::unix::fs::PermissionsExt as _;
        if let Ok(meta) = std::fs::metadata(path) {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(
                    path = %path.display(),
                    mode = format!("{mode:o}"),
                    "loose permissions: group or others can access this; chmod go-rwx it"
                );
            }
        }
    }
    #[cfg(not(unix))]
    let _ = paths;
}

/// Takes group and other bits off `path` and its SQLite companions.
fn make_private(path: &Path) {
    #[cfg(unix)]
    for suffix in ["", "-wal", "-shm"] {
        use std::os::unix::fs::PermissionsExt as _;
        let p = std::path::PathBuf::from(format!("{}{suffix}", path.display()));
        if p.exists() {
            if let Err(e) = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)) {
                tracing::warn!(path = %p.display(), error = %e, "could not make the file private");
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// The SQLite file behind `url`, if it is one.
fn sqlite_file(url: &str) -> Option<std::path::PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && path != ":memory:").then(|| std::path::PathBuf::from(path))
}

/// Binds the listener.
async fn bind(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), StartupError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| StartupError::Bind { addr, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| StartupError::Bind { addr, source })?;
    Ok((listener, local_addr))
}

/// The service, bound and ready to run.
pub struct Application {
    listener: tokio::net::TcpListener,
    local_addr: SocketAddr,
    state: AppState,
    /// Closed after the server stopped (no handler holds it).
    store: Store,
    running_chain: Option<chain::RunningDevChain>,
    /// The PostgreSQL URL: the stream fan-out and the engine lock run on it.
    pg_url: Option<String>,
    /// The cached current round, dropped when another process reports a change.
    rounds: Arc<CurrentRound>,
}

/// Refuses to start when the wallet seed does not derive the addresses the
/// database gave its users: a lost or swapped `wallet.mnemonic` next to a
/// surviving database (say, PostgreSQL kept while the data directory was
/// recreated) would otherwise create a new seed silently, and deposits to
/// the users' addresses could no longer be spent.
async fn check_wallet_matches(
    store: &Store,
    addresses: &dyn AddressBook,
    data_dir: &std::path::Path,
) -> Result<(), StartupError> {
    for user in store.first_and_last_users().await? {
        let index = u32::try_from(user.derivation_index).map_err(|_| {
            StartupError::WalletMismatch(format!(
                "user {} has a bad derivation index",
                user.username
            ))
        })?;
        let derived = addresses
            .user_address(index)
            .map_err(StartupError::WalletAddress)?;
        if derived != user.address {
            return Err(StartupError::WalletMismatch(format!(
                "the seed in {} does not derive the stored address of user {} (index {index}): \
                 restore the wallet.mnemonic that created this database",
                data_dir.join("wallet.mnemonic").display(),
                user.username
            )));
        }
    }
    Ok(())
}

/// Refuses to start when the database was first used with another wallet
/// seed or session-token secret: the first process records one-way
/// fingerprints of both, every later one compares (also on an empty
/// database, where [`check_wallet_matches`] has no user to compare with).
/// Two processes with different seeds on one database pay from keys the
/// other cannot sign with; with different token secrets, one's sessions
/// are refused by the other.
async fn check_secret_fingerprints(
    store: &Store,
    addresses: &dyn AddressBook,
    jwt_secret: &[u8],
    data_dir: &Path,
) -> Result<(), StartupError> {
    use hmac::Mac as _;
    use sha2::Digest as _;
    // The seed's: a hash of a public address it derives (the fee address of
    // a fresh install), so nothing of the seed is stored.
    let fee_address = addresses
        .default_fee_address()
        .map_err(StartupError::WalletAddress)?;
    let seed = hex::encode(sha2::Sha256::digest(
        format!("potluck wallet seed fingerprint v1:{fee_address}").as_bytes(),
    ));
    // The token secret's: an HMAC under the secret, which does not reveal it.
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(jwt_secret).map_err(StartupError::TokenKey)?;
    mac.update(b"potluck session-token secret fingerprint v1");
    let token = hex::encode(mac.finalize().into_bytes());
    let now = crate::domain::time::unix_now();
    if store
        .check_secret_fingerprint("wallet_seed", &seed, now)
        .await?
        .is_some()
    {
        return Err(StartupError::SecretMismatch(format!(
            "the wallet seed in {} is not the one this database was first used with: another \
             process (or an earlier data directory) uses another seed; copy its wallet.mnemonic here",
            data_dir.join("wallet.mnemonic").display()
        )));
    }
    if store
        .check_secret_fingerprint("token_secret", &token, now)
        .await?
        .is_some()
    {
        return Err(StartupError::SecretMismatch(format!(
            "the session-token secret (--jwt-secret, or {}) is not the one this database was \
             first used with: every process on one database needs the same; copy its jwt-secret here",
            data_dir.join("jwt-secret").display()
        )));
    }
    Ok(())
}

/// What the data directory and the secrets give the start.
struct Secrets {
    /// The session-token secret.
    jwt_secret: secrecy::SecretSlice<u8>,
    /// The database URL in effect.
    db_url: String,
    /// The SQLite file behind it, if any.
    db_file: Option<std::path::PathBuf>,
    /// Whether that file is created by this start.
    db_is_new: bool,
}

/// The chain the service follows.
struct ChainParts {
    /// The chain behind the trait.
    chain: Arc<dyn chain::Chain>,
    /// The embedded development chain (faucet, mining), if it is the one.
    dev_chain: Option<chain::DevChain>,
    /// Its running server, stopped on shutdown.
    running_chain: Option<chain::RunningDevChain>,
    /// Bitcoin Core's lowest stored block, when it is the chain and pruned.
    pruned_below: Option<u32>,
}

/// The abuse limits, local to the process or shared through PostgreSQL.
struct Limits {
    throttle: Throttle,
    quota: Quota,
    admin_throttle: AdminThrottle,
    streams: Option<SharedStreams>,
    hub: StreamHub,
}

/// Checks the admin token, opens the data directory and reads (or creates)
/// the session-token secret.
fn secrets(config: &Config) -> Result<Secrets, StartupError> {
    let data_dir = &config.data_dir;
    if let Some(token) = config.admin_token.as_ref().map(|t| t.expose_secret()) {
        if !token.is_empty() && token.chars().count() < MIN_ADMIN_TOKEN_CHARS {
            return Err(StartupError::WeakSecret(format!(
                "the admin token (--admin-token / POTLUCK_ADMIN_TOKEN) must have at least \
                 {MIN_ADMIN_TOKEN_CHARS} characters"
            )));
        }
    }
    create_data_dir(data_dir)?;
    let db_url = config.effective_database_url();
    let db_file = sqlite_file(&db_url);
    let db_is_new = db_file.as_ref().is_some_and(|f| !f.exists());
    report_loose_permissions(
        &[
            data_dir.clone(),
            data_dir.join("jwt-secret"),
            data_dir.join("wallet.mnemonic"),
        ]
        .into_iter()
        .chain(db_file.iter().filter(|_| !db_is_new).cloned())
        .collect::<Vec<_>>(),
    );
    let jwt_secret = match config.jwt_secret.as_ref().map(|s| s.expose_secret()) {
        Some(s) if !s.is_empty() => {
            if s.len() < MIN_JWT_SECRET_BYTES {
                return Err(StartupError::WeakSecret(format!(
                    "the session-token secret (--jwt-secret / POTLUCK_JWT_SECRET) has {} bytes; \
                     at least {MIN_JWT_SECRET_BYTES} are required",
                    s.len()
                )));
            }
            s.as_bytes().to_vec()
        }
        _ => {
            let path = data_dir.join("jwt-secret");
            let secret = load_or_create_secret(&path, MIN_JWT_SECRET_BYTES)?;
            if secret.len() < MIN_JWT_SECRET_BYTES {
                return Err(StartupError::WeakSecret(format!(
                    "the session-token secret in {} (jwt-secret) decodes to {} bytes; at least \
                     {MIN_JWT_SECRET_BYTES} are required (delete the file to generate one)",
                    path.display(),
                    secret.len()
                )));
            }
            secret
        }
    };
    if !config.bind.ip().is_loopback() && config.trusted_proxies.iter().all(|c| c.is_loopback()) {
        tracing::warn!(
            bind = %config.bind,
            "listening beyond loopback with no trusted proxy configured: X-Forwarded-For is \
             ignored and every client is keyed by its TCP peer; behind a reverse proxy on \
             another host, give --trusted-proxies with its network"
        );
    }
    Ok(Secrets {
        jwt_secret: jwt_secret.into(),
        db_url,
        db_file,
        db_is_new,
    })
}

/// Starts the development chain or connects to Bitcoin Core (refusing a
/// node of another network than the service's).
async fn start_chain(config: &Config) -> Result<ChainParts, StartupError> {
    Ok(match &config.chain {
        ChainSource::Dev {
            block_interval,
            rpc_bind,
        } => {
            if config.network != bitcoin::Network::Regtest {
                return Err(StartupError::Chain(format!(
                    "the development chain is regtest only (network {}); give --bitcoind-url",
                    config.network
                )));
            }
            let running = chain::DevChain::start(chain::DevChainConfig {
                data_dir: config.data_dir.join("chain"),
                block_interval: *block_interval,
                rpc_bind: *rpc_bind,
                rpc_auth: None,
            })
            .await
            .map_err(StartupError::DevChain)?;
            running.chain.set_fee_policy(config.fee_policy);
            if let Some(url) = running.rpc_url() {
                tracing::info!(%url, "development chain RPC");
            }
            let dev = running.chain.clone();
            ChainParts {
                chain: Arc::new(dev.clone()),
                dev_chain: Some(dev),
                running_chain: Some(running),
                pruned_below: None,
            }
        }
        ChainSource::Bitcoind { url, auth } => {
            let mut rpc_config = chain::RpcConfig::new(url.clone(), auth.clone());
            rpc_config.fee_policy = config.fee_policy;
            let rpc = chain::BitcoindRpc::new(rpc_config).map_err(StartupError::Bitcoind)?;
            // A node of another chain than --network is refused at once
            // (the service needs no -txindex: it follows blocks).
            let check = rpc
                .check_node(config.network, None)
                .await
                .map_err(StartupError::Bitcoind)?;
            ChainParts {
                chain: Arc::new(rpc),
                dev_chain: None,
                running_chain: None,
                pruned_below: check.prune_height,
            }
        }
    })
}

/// Opens and migrates the database, checks it against this process's
/// wallet seed, secret and chain, and writes the config row and the first
/// round when they are missing.
async fn open_store(
    config: &Config,
    secrets: &Secrets,
    addresses: &dyn AddressBook,
    pruned_below: Option<u32>,
) -> Result<Store, StartupError> {
    let store = Store::connect(&secrets.db_url, config.max_db_connections)
        .await
        .map_err(|e| match e {
            StoreError::UnsupportedUrl(u) => {
                StartupError::Store(StoreError::UnsupportedUrl(redact_url(&u)))
            }
            other => StartupError::Store(other),
        })?
        .with_max_user_round_bets(config.max_user_round_bets);
    store.migrate().await?;
    if let (Some(file), true) = (&secrets.db_file, secrets.db_is_new) {
        make_private(file);
    }
    if let Some(pruned_below) = pruned_below {
        // The block scan goes on from the last processed height: a pruned
        // node must still have the blocks above it.
        if let Some((synced, _)) = store.synced_tip().await? {
            if synced + 1 < i64::from(pruned_below) {
                return Err(StartupError::Chain(format!(
                    "the Bitcoin Core node is pruned below height {pruned_below}, but the service has processed blocks only up to {synced}; restart the node without -prune (or with a larger one) and let it re-download"
                )));
            }
        }
    }
    // The users' addresses first: that refusal names the user.
    check_wallet_matches(&store, addresses, &config.data_dir).await?;
    check_secret_fingerprints(
        &store,
        addresses,
        secrets.jwt_secret.expose_secret(),
        &config.data_dir,
    )
    .await?;
    store
        .init_config(&ServiceConfig {
            fee_address: addresses
                .default_fee_address()
                .map_err(StartupError::WalletAddress)?,
            fee_rate_sat_vb: 2,
            round_duration_seconds: config.default_round_duration_seconds,
            min_bet_sats: 1_000,
            min_withdrawal_sats: 1_000,
            deposit_confirmations: 1,
            paused: false,
        })
        .await?;
    let round = store.ensure_round(unix_now()).await?;
    tracing::info!(round = round.id, status = %round.status, "current round");
    Ok(store)
}

/// The login throttle, the registration quota, the admin-token throttle
/// and the stream caps.
async fn limits(store: &Store, config: &Config) -> Result<Limits, StartupError> {
    let now = Instant::now();
    // Several processes may share PostgreSQL: the limits count in the
    // database there, so that N processes give nobody N times the quota.
    let shared = store.backend() == crate::store::Backend::Postgres;
    let (throttle, quota, admin_throttle) = if shared {
        (
            Throttle::shared(store.clone(), config.throttle),
            Quota::Shared {
                store: store.clone(),
                policy: config.quota,
            },
            // Wrong admin tokens count across processes too (issue 32).
            AdminThrottle::shared(store.clone(), ADMIN_THROTTLE, now),
        )
    } else {
        (
            Throttle::Local(Arc::new(LoginThrottle::new(config.throttle, now))),
            Quota::Local(RegistrationQuota::new(config.quota, now)),
            AdminThrottle::local(ADMIN_THROTTLE, now),
        )
    };
    let streams = shared.then(|| SharedStreams::new(store.clone(), config.stream));
    if let Some(s) = &streams {
        s.announce().await?;
    }
    // With the shared cap the database evicts an IP's oldest stream;
    // the hub keeps only the per-process global cap.
    let hub = StreamHub::new(if shared {
        StreamPolicy {
            max_per_ip: usize::MAX,
            ..config.stream
        }
    } else {
        config.stream
    });
    Ok(Limits {
        throttle,
        quota,
        admin_throttle,
        streams,
        hub,
    })
}

impl Application {
    /// Opens the data directory, the database (migrating it), creates the
    /// first round if there is none, and binds the listener.
    ///
    /// # Errors
    /// [`StartupError`] saying what stopped the start.
    pub async fn build(config: Config) -> Result<Self, StartupError> {
        let secrets = secrets(&config)?;
        // The BIP39 mnemonic of the service's HD wallet (mode 0600).
        let wallet = Arc::new(
            wallet::load_or_create_seed(&config.data_dir.join("wallet.mnemonic"), config.network)
                .map_err(StartupError::WalletSeed)?,
        );
        let addresses: Arc<dyn AddressBook> = Arc::new(Bip84AddressBook::new(wallet.clone()));
        let ChainParts {
            chain,
            dev_chain,
            running_chain,
            pruned_below,
        } = start_chain(&config).await?;
        let store = open_store(&config, &secrets, addresses.as_ref(), pruned_below).await?;
        let pg_url =
            (store.backend() == crate::store::Backend::Postgres).then(|| secrets.db_url.clone());
        let hasher = PasswordHasher::new(config.hash_params, config.hashing_concurrency)
            .map_err(StartupError::Hashing)?;
        let Limits {
            throttle,
            quota,
            admin_throttle,
            streams,
            hub,
        } = limits(&store, &config).await?;
        let rounds = Arc::new(CurrentRound::new(CURRENT_ROUND_TTL));
        let engine = Arc::new(
            Engine::new(store.clone(), chain, wallet, hub.clone(), rounds.clone())
                .with_bump_policy(config.bump),
        );
        // The first sync (which records the starting block on a fresh
        // database) runs before anyone can subscribe to the stream.
        if let Err(e) = engine.run_once().await {
            tracing::warn!(error = %e, "first engine step failed; the worker retries");
        }
        let jwt_secret = secrets.jwt_secret;
        let state = AppState::new(Services {
            accounts: Accounts::new(
                store.clone(),
                hasher,
                TokenKeys::new(jwt_secret.expose_secret()),
                throttle,
                quota,
                addresses.clone(),
            ),
            admin: Administration::new(store.clone(), engine.clone(), rounds.clone(), hub.clone()),
            cashier: Cashier::new(
                store.clone(),
                engine.clone(),
                addresses.clone(),
                config.max_bet_input_fee_percent,
                dev_chain.clone(),
                config.request_timeout,
            ),
            history: History::new(store.clone(), rounds.clone()),
            anonymous_round: AnonymousRoundCache::default(),
            health: Health::new(store.clone(), engine.chain().clone()),
            hub,
            streams,
            addresses,
            admin_key: AdminKey::new(config.admin_token.as_ref().map(|t| t.expose_secret())),
            admin_throttle,
            metrics: Arc::new(Metrics::default()),
            engine,
            dev_chain,
            config,
        });
        let (listener, local_addr) = bind(state.config.bind).await?;
        Ok(Self {
            listener,
            local_addr,
            state,
            store,
            running_chain,
            pg_url,
            rounds,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.local_addr.port()
    }

    /// Where the embedded development chain serves its JSON-RPC, when it does
    /// (with `--dev-chain-rpc-bind 127.0.0.1:0` the port is the OS's choice).
    pub fn dev_chain_rpc_addr(&self) -> Option<SocketAddr> {
        self.running_chain.as_ref().and_then(|c| c.rpc_addr)
    }

    /// The shared state (for in-process tests).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The database (for benches and tests that reach around the HTTP API).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Serves until `shutdown` resolves, then closes every stream and lets
    /// in-flight requests finish.
    ///
    /// # Errors
    /// I/O errors of the server.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let hub = self.state.hub.clone();
        let store = self.store.clone();
        let engine = self.state.engine.clone();
        let interval = self.state.config.engine_interval;
        // On PostgreSQL several processes may share the database: one runs
        // the engine (advisory lock), all fan the stream out (LISTEN/NOTIFY).
        let streams = self.state.streams.clone();
        let maintenance = streams.clone().map(|s| {
            tokio::spawn(s.maintain(
                self.state.accounts.throttle().clone(),
                self.state.accounts.quota().clone(),
            ))
        });
        let (worker, fanout) = match self.pg_url.clone() {
            Some(url) => (
                tokio::spawn(crate::service::leader::run_when_leader(
                    url.clone(),
                    engine,
                    interval,
                )),
                Some(crate::service::fanout::Fanout::spawn(
                    url,
                    store.clone(),
                    hub.clone(),
                    self.rounds.clone(),
                    streams
                        .as_ref()
                        .map_or_else(String::new, |s| s.process_id().to_string()),
                )),
            ),
            None => (tokio::spawn(engine.run(interval)), None),
        };
        let limits = self.state.config.server;
        let app = router(self.state);
        crate::server::serve(self.listener, app, limits, async move {
            shutdown.await;
            tracing::info!("shutting down: closing streams, finishing requests");
            hub.shutdown();
        })
        .await?;
        worker.abort();
        let _ = worker.await;
        if let Some(fanout) = fanout {
            fanout.stop().await;
        }
        if let Some(m) = maintenance {
            m.abort();
            let _ = m.await;
        }
        if let Some(s) = streams {
            s.leave().await;
        }
        if let Some(chain) = self.running_chain {
            chain.shutdown().await;
        }
        self.store.close().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 32, finding 5: processes starting together on an empty data
    /// directory end with one session-token secret. With rename-over, each
    /// could keep the secret it wrote while another replaced the file.
    #[test]
    fn processes_creating_the_secret_together_end_with_one() {
        let dir =
            std::env::temp_dir().join(format!("potluck_secret_{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        for round in 0..20 {
            let path = dir.join(format!("jwt-secret-{round}"));
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
            let secrets: Vec<Vec<u8>> = (0..8)
                .map(|_| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        load_or_create_secret(&path, MIN_JWT_SECRET_BYTES).unwrap()
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().unwrap())
                .collect();
            let on_disk = load_or_create_secret(&path, MIN_JWT_SECRET_BYTES).unwrap();
            for s in &secrets {
                assert_eq!(
                    s, &on_disk,
                    "round {round}: a process kept a secret that is not the file's"
                );
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
