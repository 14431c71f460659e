//! The state every handler receives: configuration, the store, the security parts and the services.

use std::sync::Arc;

use crate::config::Config;
use crate::domain::address::AddressBook;
use crate::http::metrics::Metrics;
use crate::security::admin_key::AdminKey;
use crate::security::password::PasswordHasher;
use crate::security::quota::RegistrationQuota;
use crate::security::throttle::LoginThrottle;
use crate::security::token::TokenKeys;
use crate::service::current::CurrentRound;
use crate::service::engine::Engine;
use crate::service::stream::StreamHub;
use crate::store::Store;

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
    /// Wrong admin tokens per client IP.
    pub admin_throttle: Arc<LoginThrottle>,
    /// HTTP metrics.
    pub metrics: Arc<Metrics>,
    /// Cached current round.
    pub rounds: Arc<CurrentRound>,
    /// The chain watcher and rounds engine (also signs bets and withdrawals).
    pub engine: Arc<Engine>,
    /// The embedded development chain, when the service runs one (faucet).
    pub dev_chain: Option<chain::DevChain>,
}
