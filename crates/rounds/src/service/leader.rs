//! One engine and chain watcher at a time on PostgreSQL: the process holding a session advisory lock on a dedicated connection runs them, the others stand by and take over when the leader's connection goes (a crashed leader's session ends, PostgreSQL releases the lock).
//!
//! The engine's own guards stay: every step is a guarded, repeatable
//! transition, so a short overlap (a leader that lost its connection but
//! has not noticed yet) moves no money twice.

use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::Connection as _;

use crate::service::engine::Engine;

/// The advisory lock key of the engine ("potluck" and 1).
pub const ENGINE_LOCK_KEY: i64 = 0x706f_746c_7563_6b01;

/// The `application_name` of the lock connection.
pub const LOCK_APPLICATION_NAME: &str = "potluck-engine-lock";

/// How often a standby process tries the lock: the take-over delay after
/// the leader dies.
const STANDBY_POLL: Duration = Duration::from_secs(1);

/// How often the leader checks that its lock connection is alive.
const HEARTBEAT: Duration = Duration::from_secs(2);

/// How long a heartbeat may take before the leader steps down.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);

async fn connect(url: &str) -> Result<PgConnection, sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?.application_name(LOCK_APPLICATION_NAME);
    PgConnection::connect_with(&options).await
}

/// Waits on `conn` until this session holds the engine lock.
async fn acquire(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    loop {
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(ENGINE_LOCK_KEY)
            .fetch_one(&mut *conn)
            .await?;
        if got {
            return Ok(());
        }
        tokio::time::sleep(STANDBY_POLL).await;
    }
}

/// Returns when the lock connection stops answering.
async fn watch(conn: &mut PgConnection) {
    loop {
        tokio::time::sleep(HEARTBEAT).await;
        match tokio::time::timeout(
            HEARTBEAT_TIMEOUT,
            sqlx::query("SELECT 1").execute(&mut *conn),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "engine lock connection failed");
                return;
            }
            Err(_) => {
                tracing::warn!("engine lock connection does not answer");
                return;
            }
        }
    }
}

/// A task that is aborted when its handle is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `engine` whenever this process holds the engine lock on the
/// PostgreSQL database at `url`; never returns (abort it to stop).
pub async fn run_when_leader(url: String, engine: Arc<Engine>, interval: Duration) {
    loop {
        let mut conn = match connect(&url).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "engine lock: cannot connect; retrying");
                tokio::time::sleep(STANDBY_POLL).await;
                continue;
            }
        };
        tracing::info!("engine standby: waiting for the engine lock");
        if let Err(e) = acquire(&mut conn).await {
            tracing::warn!(error = %e, "engine lock: connection lost while standing by");
            tokio::time::sleep(STANDBY_POLL).await;
            continue;
        }
        tracing::info!("engine leader: this process runs the engine and chain watcher");
        // Aborted with this task too (dropping a JoinHandle would detach
        // it): a service stopped in process must not keep an engine running.
        let mut worker = AbortOnDrop(tokio::spawn(engine.clone().run(interval)));
        watch(&mut conn).await;
        // Stopping mid-step is a crash as far as the engine goes: every
        // step is durable and repeatable.
        worker.0.abort();
        let _ = (&mut worker.0).await;
        drop(conn);
        tracing::warn!("engine leader: stepped down (lock connection lost)");
    }
}
