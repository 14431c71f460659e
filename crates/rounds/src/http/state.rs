//! The state every handler receives: configuration, the services, and the security parts the extractors need.
//!
//! There is no store here: handlers reach data only through the services.

use std::sync::Arc;

use crate::config::Config;
use crate::domain::address::AddressBook;
use crate::http::metrics::Metrics;
use crate::http::views::AnonymousRoundCache;
use crate::security::admin_key::AdminKey;
use crate::service::accounts::Accounts;
use crate::service::admin::Administration;
use crate::service::cashier::Cashier;
use crate::service::engine::Engine;
use crate::service::health::Health;
use crate::service::history::History;
use crate::service::limits::{AdminThrottle, SharedStreams};
use crate::service::stream::StreamHub;

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    /// The configuration.
    pub config: Arc<Config>,
    /// Registration, login, sessions, passwords.
    pub accounts: Accounts,
    /// The operator's requests.
    pub admin: Administration,
    /// Bets, withdrawals and the faucet.
    pub cashier: Cashier,
    /// Rounds and transfers read back, and the cached current round.
    pub history: History,
    /// The current round's anonymous answer, rendered once per snapshot.
    pub anonymous_round: Arc<AnonymousRoundCache>,
    /// Readiness of the database and the chain.
    pub health: Health,
    /// Stream notifier.
    pub hub: StreamHub,
    /// The per-IP stream cap shared with other processes (PostgreSQL).
    pub streams: Option<SharedStreams>,
    /// Address validation (the admin's fee address).
    pub addresses: Arc<dyn AddressBook>,
    /// The admin token digest.
    pub admin_key: AdminKey,
    /// Wrong admin tokens per client IP (shared by the processes on PostgreSQL).
    pub admin_throttle: AdminThrottle,
    /// HTTP metrics.
    pub metrics: Arc<Metrics>,
    /// The chain watcher and rounds engine (run by the application; benches drive it).
    pub engine: Arc<Engine>,
    /// The embedded development chain, when the service runs one (faucet, benches).
    pub dev_chain: Option<chain::DevChain>,
}
