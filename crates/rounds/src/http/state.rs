//! The state every handler receives: configuration, the services, and the security parts the extractors need.
//!
//! There is no store here: handlers reach data only through the services.

use std::ops::Deref;
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

/// Shared state of every handler: one pointer to [`Services`].
///
/// axum clones the state for every request (the router into the route, the
/// `State` extractor into the handler). Cloning the services themselves took
/// two dozen reference counts up and down per clone, each a cache line that
/// both cores' workers write (docs/rounds-api.md, "Performance notes", has
/// the profile). Behind one `Arc` a clone is one count.
#[derive(Clone)]
pub struct AppState(Arc<Services>);

impl AppState {
    /// The state holding `services`.
    pub fn new(services: Services) -> Self {
        Self(Arc::new(services))
    }
}

impl Deref for AppState {
    type Target = Services;

    fn deref(&self) -> &Services {
        &self.0
    }
}

/// What [`AppState`] points to.
pub struct Services {
    /// The configuration.
    pub config: Config,
    /// Registration, login, sessions, passwords.
    pub accounts: Accounts,
    /// The operator's requests.
    pub admin: Administration,
    /// Bets, withdrawals and the faucet.
    pub cashier: Cashier,
    /// Rounds and transfers read back, and the cached current round.
    pub history: History,
    /// The current round's anonymous answer, rendered once per snapshot.
    pub anonymous_round: AnonymousRoundCache,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_request_clone_is_one_pointer() {
        // A field added to `AppState` itself, not to `Services`, would bring
        // back a clone that touches every service's counts on each request.
        assert_eq!(size_of::<AppState>(), size_of::<Arc<Services>>());
    }
}
