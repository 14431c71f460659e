//! Cross-process stream fan-out on PostgreSQL: every local publish becomes a `NOTIFY`, every `NOTIFY` of another process a local publish; a lost listener connection is re-established and followed by a refetch notification.
//!
//! The payload is the sending process's random id, so a process skips its
//! own notifications (PostgreSQL delivers them to the sender's session too).
//! The same listener hears evictions of this process's streams by the
//! per-IP cap of another process (`store::limits::EVICT_CHANNEL`).
//! Notifications stay content-free: the subscriber refetches, and the hub's
//! one-pending-notification rule applies to remote changes as to local ones.

use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};

use crate::service::current::CurrentRound;
use crate::service::stream::StreamHub;
use crate::store::limits::EVICT_CHANNEL;
use crate::store::Store;

/// The `LISTEN`/`NOTIFY` channel of stream notifications.
pub const CHANNEL: &str = "potluck_rounds_stream";

/// The `application_name` of the listener connection (operators and tests
/// find it in `pg_stat_activity`).
pub const LISTENER_APPLICATION_NAME: &str = "potluck-stream-listener";

/// Least time between two `NOTIFY`s of this process: the publishes that
/// arrive meanwhile are sent as one when it has passed. Each `NOTIFY` is a
/// transaction on the database and a wake-up of every listener; under a
/// stream of bets (a publish each) coalescing only while one was in flight
/// sent about one per bet. Other processes' subscribers hear of a change at
/// most this much later; the change itself is never lost (the last publish
/// of a burst is always followed by a `NOTIFY`).
const NOTIFY_INTERVAL: Duration = Duration::from_millis(10);

/// Wait between attempts to re-establish a lost listener connection.
const RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// The two tasks of the fan-out; aborted on shutdown.
#[derive(Debug)]
pub struct Fanout {
    sender: tokio::task::JoinHandle<()>,
    listener: tokio::task::JoinHandle<()>,
}

impl Fanout {
    /// Starts the sender (local publishes to `NOTIFY`) and the listener
    /// (`NOTIFY`s of other processes to local publishes) on the PostgreSQL
    /// database at `url`.
    /// `me` is this process's id (the stream cap's, see `service::limits`).
    pub fn spawn(
        url: String,
        store: Store,
        hub: StreamHub,
        rounds: Arc<CurrentRound>,
        me: String,
    ) -> Self {
        let me = if me.is_empty() {
            format!("{:016x}", rand::random::<u64>())
        } else {
            me
        };
        let sender = tokio::spawn(send_loop(store, hub.clone(), me.clone()));
        let listener = tokio::spawn(listen_loop(url, hub, rounds, me));
        Self { sender, listener }
    }

    /// Stops both tasks.
    pub async fn stop(self) {
        self.sender.abort();
        self.listener.abort();
        let _ = self.sender.await;
        let _ = self.listener.await;
    }
}

async fn send_loop(store: Store, hub: StreamHub, me: String) {
    loop {
        hub.published().await;
        // A failed NOTIFY loses nothing durable: the other processes'
        // listeners see the same outage, reconnect and tell their
        // subscribers to refetch.
        if let Err(e) = sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(me.as_str())
            .execute(store.pool())
            .await
        {
            tracing::warn!(error = %e, "stream fan-out: NOTIFY failed");
        }
        // Publishes during the pause leave one stored wake-up, answered by
        // one NOTIFY right after it.
        tokio::time::sleep(NOTIFY_INTERVAL).await;
    }
}

async fn connect_listener(url: &str) -> Result<PgListener, sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?.application_name(LISTENER_APPLICATION_NAME);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(options);
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.listen_all([CHANNEL, EVICT_CHANNEL]).await?;
    Ok(listener)
}

/// Tells this process's subscribers to refetch after a change elsewhere.
fn deliver(hub: &StreamHub, rounds: &CurrentRound) {
    rounds.invalidate();
    hub.publish_local();
}

async fn listen_loop(url: String, hub: StreamHub, rounds: Arc<CurrentRound>, me: String) {
    let mut first = true;
    loop {
        let mut listener = match connect_listener(&url).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "stream fan-out: cannot listen; retrying");
                tokio::time::sleep(RECONNECT_DELAY).await;
                continue;
            }
        };
        if !first {
            // Whatever other processes published while the connection was
            // down is lost: subscribers refetch once.
            tracing::info!("stream fan-out: listener reconnected");
            deliver(&hub, &rounds);
        }
        first = false;
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) if n.channel() == EVICT_CHANNEL => {
                    // Another process evicted one of this process's streams
                    // (the per-IP cap counts across processes).
                    if let Some(id) = n
                        .payload()
                        .strip_prefix(me.as_str())
                        .and_then(|rest| rest.strip_prefix(':'))
                        .and_then(|id| id.parse::<u64>().ok())
                    {
                        hub.evict(id);
                    }
                }
                Ok(Some(n)) => {
                    if n.payload() != me {
                        deliver(&hub, &rounds);
                    }
                }
                // The connection dropped and sqlx re-established it (and
                // LISTENs again) before returning.
                Ok(None) => {
                    tracing::info!("stream fan-out: listener reconnected");
                    deliver(&hub, &rounds);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "stream fan-out: listener lost; reconnecting");
                    tokio::time::sleep(RECONNECT_DELAY).await;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::stream::StreamPolicy;
    use std::time::Instant;

    fn pg_url() -> String {
        std::env::var("POTLUCK_TEST_PG")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
    }

    /// A burst of publishes (one per bet under load) is sent on as a few
    /// NOTIFYs, at most one per `NOTIFY_INTERVAL`, and the last publish is
    /// always followed by one (no change goes unheard).
    #[tokio::test]
    async fn a_burst_of_publishes_is_sent_as_few_notifies_and_the_last_is_heard() {
        let url = pg_url();
        let store = Store::connect(&url, 2).await.unwrap();
        let hub = StreamHub::new(StreamPolicy::default());
        let me = format!("burst-{:016x}", rand::random::<u64>());
        let mut listener = PgListener::connect(&url).await.unwrap();
        listener.listen(CHANNEL).await.unwrap();
        let sender = tokio::spawn(send_loop(store.clone(), hub.clone(), me.clone()));
        let start = Instant::now();
        for _ in 0..200 {
            hub.publish();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let last_publish = Instant::now();
        let burst = last_publish - start;
        let (mut heard, mut last_heard) = (0u128, None);
        while let Ok(Ok(Some(n))) =
            tokio::time::timeout(Duration::from_millis(500), listener.try_recv()).await
        {
            if n.payload() == me {
                heard += 1;
                last_heard = Some(Instant::now());
            }
        }
        sender.abort();
        store.close().await;
        let bound = burst.as_millis() / NOTIFY_INTERVAL.as_millis() + 2;
        assert!(
            (1..=bound).contains(&heard),
            "{heard} NOTIFYs for 200 publishes in {burst:?} (at most {bound})"
        );
        assert!(
            last_heard.is_some_and(|t| t > last_publish),
            "the last publish was followed by a NOTIFY"
        );
    }
}
