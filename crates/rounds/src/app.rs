//! Wiring: `AppState`, the router with its layers, the OpenAPI document, and `Application` (build, bind, serve, graceful shutdown).

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use tracing::Instrument as _;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::address::{AddressBook, Bip84AddressBook};
use crate::auth::AdminKey;
use crate::config::ChainSource;
use crate::config::Config;
use crate::current::CurrentRound;
use crate::engine::Engine;
use crate::error::ApiError;
use crate::metrics::{Gauges, Metrics};
use crate::password::PasswordHasher;
use crate::quota::RegistrationQuota;
use crate::store::{unix_now, ServiceConfig, Store, StoreError};
use crate::stream::StreamHub;
use crate::throttle::LoginThrottle;
use crate::token::TokenKeys;

/// How long GET /rounds/current may serve a cached round (see `current`).
const CURRENT_ROUND_TTL: Duration = Duration::from_millis(500);

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    /// The configuration.
    pub config: Arc<Config>,
    /// The database.
    pub store: Store,
    /// Argon2 on the blocking pool.
    pub hasher: PasswordHasher,
    /// Session token keys.
    pub tokens: TokenKeys,
    /// Login throttle.
    pub throttle: Arc<LoginThrottle>,
    /// Registration quota.
    pub quota: RegistrationQuota,
    /// Stream notifier.
    pub hub: StreamHub,
    /// Address derivation and validation.
    pub addresses: Arc<dyn AddressBook>,
    /// The admin token digest.
    pub admin_key: AdminKey,
    /// HTTP metrics.
    pub metrics: Arc<Metrics>,
    /// Cached current round.
    pub rounds: Arc<CurrentRound>,
    /// The chain watcher and rounds engine (also signs bets and withdrawals).
    pub engine: Arc<Engine>,
    /// The embedded development chain, when the service runs one (faucet).
    pub dev_chain: Option<chain::DevChain>,
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartupError {
    /// The data directory or a secret file could not be used.
    #[error("data directory {path}: {source}")]
    DataDir {
        /// The path involved.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A secret file holds something else than hex.
    #[error("secret file {0} is corrupt (expected hex)")]
    CorruptSecret(String),
    /// The database could not be opened or migrated.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The wallet could not derive addresses.
    #[error("wallet: {0}")]
    Wallet(String),
    /// Password hashing parameters were refused.
    #[error("password hashing: {0}")]
    Hashing(String),
    /// The chain could not be started or reached.
    #[error("chain: {0}")]
    Chain(String),
    /// The listener could not be bound.
    #[error("bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Reads a hex secret from `path`, or writes `len` fresh random bytes there.
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
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut f = options.open(path).map_err(io)?;
            std::io::Write::write_all(&mut f, hex::encode(&bytes).as_bytes()).map_err(io)?;
            Ok(bytes)
        }
        Err(e) => Err(io(e)),
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "potluck rounds service", description = "Custodial round-based wallet: accounts, sessions, admin, rounds, live stream."),
    modifiers(&SecuritySchemes),
    components(schemas(crate::error::ErrorBody, crate::error::ErrorDetail, crate::error::AdminErrorBody))
)]
struct ApiDoc;

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .build(),
            ),
        );
        components.add_security_scheme(
            "admin_token",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-Admin-Token"))),
        );
    }
}

/// Liveness.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, description = "the process is up", body = Object)))]
async fn healthz() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({"status": "ok"}))
}

/// Prometheus metrics in the text exposition format.
#[utoipa::path(get, path = "/metrics", tag = "ops", responses((status = 200, content_type = "text/plain", body = String)))]
async fn metrics(State(state): State<AppState>) -> Response {
    let text = state.metrics.render(Gauges {
        stream_subscribers: state.hub.len(),
        login_throttle_keys: state.throttle.len(),
        registration_quota_keys: state.quota.len(),
        password_hashes_in_flight: state.hasher.in_flight(),
        password_hash_concurrency: state.hasher.concurrency(),
    });
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "ops", responses((status = 200, body = Object)))]
async fn openapi_json() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        openapi_document().to_string(),
    )
        .into_response()
}

async fn not_found() -> ApiError {
    ApiError::NotFound
}

/// All documented routes, before layers and state.
fn api_routes(config: &Config, dev_chain: bool) -> OpenApiRouter<AppState> {
    let timed = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(crate::accounts::router())
        .merge(crate::rounds_api::router())
        .merge(crate::money_api::router(dev_chain))
        .merge(crate::admin::router())
        .routes(routes!(healthz))
        .routes(routes!(metrics))
        .routes(routes!(openapi_json))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            config.request_timeout,
        ));
    timed.merge(crate::rounds_api::stream_router())
}

/// The OpenAPI document generated from the routes, as JSON.
pub fn openapi_document() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        let (_, api) = api_routes(&Config::new(".".into()), true).split_for_parts();
        api.to_json()
            .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    })
}

/// Request ids, a tracing span per request and metrics per matched route.
async fn observe(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map_or_else(|| format!("{:016x}", rand::random::<u64>()), str::to_string);
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let span = tracing::info_span!("request", request_id = %id, %method, route = %route);
    let mut response = next.run(request).instrument(span.clone()).await;
    let status = response.status();
    metrics.record(method.as_str(), &route, status.as_u16(), started.elapsed());
    span.in_scope(|| {
        tracing::debug!(
            status = status.as_u16(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "request done"
        )
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

/// Builds the full router for `state`.
pub fn router(state: AppState) -> Router {
    let (routes, _) = api_routes(&state.config, state.dev_chain.is_some()).split_for_parts();
    let metrics = state.metrics.clone();
    routes
        .merge(crate::dashboard::router())
        .fallback(not_found)
        .layer(RequestBodyLimitLayer::new(state.config.body_limit_bytes))
        .layer(axum::middleware::from_fn_with_state(metrics, observe))
        .with_state(state)
}

/// The service, bound and ready to run.
pub struct Application {
    listener: tokio::net::TcpListener,
    local_addr: SocketAddr,
    state: AppState,
    running_chain: Option<chain::RunningDevChain>,
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
            StartupError::Wallet(format!("user {} has a bad derivation index", user.username))
        })?;
        let derived = addresses
            .user_address(index)
            .map_err(|e| StartupError::Wallet(e.to_string()))?;
        if derived != user.address {
            return Err(StartupError::Wallet(format!(
                "the seed in {} does not derive the stored address of user {} (index {index}): \
                 restore the wallet.mnemonic that created this database",
                data_dir.join("wallet.mnemonic").display(),
                user.username
            )));
        }
    }
    Ok(())
}

impl Application {
    /// Opens the data directory, the database (migrating it), creates the
    /// first round if there is none, and binds the listener.
    ///
    /// # Errors
    /// [`StartupError`] saying what stopped the start.
    pub async fn build(config: Config) -> Result<Self, StartupError> {
        let data_dir = config.data_dir.clone();
        std::fs::create_dir_all(&data_dir).map_err(|source| StartupError::DataDir {
            path: data_dir.display().to_string(),
            source,
        })?;
        let jwt_secret = match &config.jwt_secret {
            Some(s) if !s.is_empty() => s.as_bytes().to_vec(),
            _ => load_or_create_secret(&data_dir.join("jwt-secret"), 32)?,
        };
        // The BIP39 mnemonic of the service's HD wallet (mode 0600).
        let wallet = Arc::new(
            wallet::load_or_create_seed(&data_dir.join("wallet.mnemonic"), config.network)
                .map_err(|e| StartupError::Wallet(e.to_string()))?,
        );
        let addresses: Arc<dyn AddressBook> = Arc::new(Bip84AddressBook::new(wallet.clone()));
        let (chain, dev_chain, running_chain): (Arc<dyn chain::Chain>, _, _) = match &config.chain {
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
                    data_dir: data_dir.join("chain"),
                    block_interval: *block_interval,
                    rpc_bind: *rpc_bind,
                    rpc_auth: None,
                })
                .await
                .map_err(|e| StartupError::Chain(e.to_string()))?;
                if let Some(url) = running.rpc_url() {
                    tracing::info!(%url, "development chain RPC");
                }
                let dev = running.chain.clone();
                (Arc::new(dev.clone()), Some(dev), Some(running))
            }
            ChainSource::Bitcoind { url, auth } => {
                let rpc = chain::BitcoindRpc::new(chain::RpcConfig::new(url.clone(), auth.clone()))
                    .map_err(|e| StartupError::Chain(e.to_string()))?;
                (Arc::new(rpc), None, None)
            }
        };
        let store =
            Store::connect(&config.effective_database_url(), config.max_db_connections).await?;
        store.migrate().await?;
        check_wallet_matches(&store, addresses.as_ref(), &data_dir).await?;
        store
            .init_config(&ServiceConfig {
                fee_address: addresses
                    .default_fee_address()
                    .map_err(|e| StartupError::Wallet(e.to_string()))?,
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
        let hasher = PasswordHasher::new(config.hash_params, config.hashing_concurrency)
            .map_err(|e| StartupError::Hashing(e.to_string()))?;
        let now = Instant::now();
        let hub = StreamHub::new(config.stream);
        let rounds = Arc::new(CurrentRound::new(CURRENT_ROUND_TTL));
        let engine = Arc::new(Engine::new(
            store.clone(),
            chain,
            wallet,
            hub.clone(),
            rounds.clone(),
        ));
        // The first sync (which records the starting block on a fresh
        // database) runs before anyone can subscribe to the stream.
        if let Err(e) = engine.run_once().await {
            tracing::warn!(error = %e, "first engine step failed; the worker retries");
        }
        let state = AppState {
            store,
            hasher,
            tokens: TokenKeys::new(&jwt_secret),
            throttle: Arc::new(LoginThrottle::new(config.throttle, now)),
            quota: RegistrationQuota::new(config.quota, now),
            hub,
            addresses,
            admin_key: AdminKey::new(config.admin_token.as_deref()),
            metrics: Arc::new(Metrics::default()),
            rounds,
            engine,
            dev_chain,
            config: Arc::new(config),
        };
        let listener = tokio::net::TcpListener::bind(state.config.bind)
            .await
            .map_err(|source| StartupError::Bind {
                addr: state.config.bind,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| StartupError::Bind {
            addr: state.config.bind,
            source,
        })?;
        Ok(Self {
            listener,
            local_addr,
            state,
            running_chain,
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

    /// The shared state (for in-process tests).
    pub fn state(&self) -> &AppState {
        &self.state
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
        let store = self.state.store.clone();
        let worker = tokio::spawn(
            self.state
                .engine
                .clone()
                .run(self.state.config.engine_interval),
        );
        let app = router(self.state);
        axum::serve(
            self.listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down: closing streams, finishing requests");
            hub.shutdown();
        })
        .await?;
        worker.abort();
        let _ = worker.await;
        if let Some(chain) = self.running_chain {
            chain.shutdown().await;
        }
        store.close().await;
        Ok(())
    }
}
