//! The login throttle, the registration quota and the per-IP stream cap for the whole service: in memory with one process (SQLite), in the database when several processes share PostgreSQL.
//!
//! The rules are the same either way (`security::throttle`,
//! `security::quota`, `service::stream`); only where the state lives
//! differs. Shared state is crash-safe: attempts in flight and
//! registrations in progress are leases that run out, and the streams of a
//! process that stops sending heartbeats are removed, so a killed process
//! never blocks an IP or a user for longer than a lease.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::security::quota::{QuotaPolicy, RegistrationQuota, Reservation};
use crate::security::throttle::{self, LoginThrottle, ThrottleKey, ThrottlePolicy, UnixMillis};
use crate::service::stream::{AtCapacity, StreamHub, StreamPolicy, Subscription};
use crate::store::{Store, StoreError};

/// How long an attempt in flight or a registration in progress holds its
/// reservation when its process dies before settling it.
const LEASE: Duration = Duration::from_secs(60);

/// How often a process records that it is alive.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// A process not seen for this long is gone: its streams are removed.
const PROCESS_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the shared throttle and quota are swept (the seed's "at most
/// once every 60 seconds").
const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

fn spawn_detached(f: impl std::future::Future<Output = ()> + Send + 'static) {
    // Outside a runtime (a test dropping late) the lease runs out instead.
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(f);
    }
}

fn after(now: UnixMillis, d: Duration) -> UnixMillis {
    throttle::Moment::plus(now, d).unwrap_or(now)
}

/// The login throttle of the service.
#[derive(Debug, Clone)]
pub enum Throttle {
    /// One process: in memory.
    Local(Arc<LoginThrottle>),
    /// Several processes: in the database.
    Shared {
        /// The database.
        store: Store,
        /// The rules.
        policy: ThrottlePolicy,
        /// Records in the table after this process's last failure (gauge).
        keys: Arc<AtomicUsize>,
    },
}

/// One login attempt reserved by [`Throttle::begin`].
#[derive(Debug)]
pub enum Attempt {
    /// In memory.
    Local(throttle::Attempt),
    /// In the database.
    Shared(SharedAttempt),
}

/// An attempt recorded in the database; given back when dropped unsettled.
#[derive(Debug)]
pub struct SharedAttempt {
    store: Store,
    policy: ThrottlePolicy,
    tracked: Arc<AtomicUsize>,
    id: i64,
    keys: Vec<ThrottleKey>,
    settled: bool,
}

impl Drop for SharedAttempt {
    fn drop(&mut self) {
        if !self.settled {
            let (store, id) = (self.store.clone(), self.id);
            spawn_detached(async move {
                if let Err(e) = store.throttle_release(id).await {
                    tracing::warn!(error = %e, "throttle: could not release an attempt (its lease runs out)");
                }
            });
        }
    }
}

impl Throttle {
    /// The throttle over the database of `store`.
    pub fn shared(store: Store, policy: ThrottlePolicy) -> Self {
        Throttle::Shared {
            store,
            policy,
            keys: Arc::default(),
        }
    }

    /// Checks `keys` and reserves one attempt against each in one step.
    ///
    /// # Errors
    /// The database (shared throttle only). The inner error is the wait
    /// when a key is locked or has as many attempts in flight as it may.
    pub async fn begin(
        &self,
        keys: &[ThrottleKey],
    ) -> Result<Result<Attempt, Duration>, StoreError> {
        match self {
            Throttle::Local(t) => Ok(t.begin(keys, Instant::now()).map(Attempt::Local)),
            Throttle::Shared {
                store,
                policy,
                keys: tracked,
            } => {
                let now = UnixMillis::now();
                let id = rand::random::<i64>();
                let stored: Vec<String> = keys.iter().map(ThrottleKey::storage_key).collect();
                let wait = store
                    .throttle_begin(&stored, id, now, after(now, LEASE), |states| {
                        keys.iter()
                            .zip(states)
                            .map(|(k, (rec, in_flight))| {
                                policy.admits(k, rec.as_ref(), *in_flight, now)
                            })
                            .max()
                            .unwrap_or(Duration::ZERO)
                    })
                    .await?;
                if !wait.is_zero() {
                    return Ok(Err(wait));
                }
                Ok(Ok(Attempt::Shared(SharedAttempt {
                    store: store.clone(),
                    policy: *policy,
                    tracked: tracked.clone(),
                    id,
                    keys: keys.to_vec(),
                    settled: false,
                })))
            }
        }
    }

    /// Tracked keys held in this process's memory (0 when shared).
    pub fn len(&self) -> usize {
        match self {
            Throttle::Local(t) => t.len(),
            Throttle::Shared { keys, .. } => keys.load(Ordering::Relaxed),
        }
    }

    /// Whether [`Throttle::len`] is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sweeps the shared records (at most once per interval, from the
    /// maintenance task).
    async fn sweep(&self) -> Result<(), StoreError> {
        match self {
            Throttle::Local(_) => Ok(()),
            Throttle::Shared { store, policy, .. } => {
                store
                    .throttle_sweep(UnixMillis::now(), policy.max_keys)
                    .await
            }
        }
    }
}

impl Attempt {
    /// The password was wrong: a failure counts against every key.
    pub async fn failed(self) {
        match self {
            Attempt::Local(a) => a.failed(Instant::now()),
            Attempt::Shared(mut a) => {
                a.settled = true;
                let now = UnixMillis::now();
                let stored: Vec<String> = a.keys.iter().map(ThrottleKey::storage_key).collect();
                let policy = a.policy;
                let keys = a.keys.clone();
                let update = move |i: usize, before: Option<&throttle::Failures<UnixMillis>>| {
                    let key = &keys[i];
                    let after = policy.after_failure(key, before, now);
                    (after, policy.expiry(policy.free_failures(key), &after))
                };
                if let Err(e) = a
                    .store
                    .throttle_settle(a.id, &stored, Some(&update), None, now)
                    .await
                {
                    tracing::error!(error = %e, "throttle: a failed login could not be recorded");
                }
                // The hard cap holds after every failure, not only at the
                // sweep: a flood of fresh keys cannot grow the table past it.
                match a.store.throttle_cap(a.policy.max_keys).await {
                    Ok(n) => a.tracked.store(n, Ordering::Relaxed),
                    Err(e) => tracing::warn!(error = %e, "throttle: cap check failed"),
                }
            }
        }
    }

    /// The password was right: `key`'s failures are forgotten.
    pub async fn succeeded(self, key: &ThrottleKey) {
        match self {
            Attempt::Local(a) => a.succeeded(key),
            Attempt::Shared(mut a) => {
                a.settled = true;
                let stored: Vec<String> = a.keys.iter().map(ThrottleKey::storage_key).collect();
                let forget = key.storage_key();
                if let Err(e) = a
                    .store
                    .throttle_settle(a.id, &stored, None, Some(&forget), UnixMillis::now())
                    .await
                {
                    tracing::warn!(error = %e, "throttle: a successful login could not be recorded");
                }
            }
        }
    }
}

/// The admin-token throttle: wrong tokens counted per client IP in memory
/// and, when several processes share PostgreSQL, in the database as well.
///
/// The in-memory throttle does the reservation (checked, tried and settled
/// with no await in between, so a burst inside one process is counted as it
/// arrives); the database holds only the failure count, read before the
/// check and written after a failure. No attempt is reserved in the
/// database: a reservation there lasts a round trip, and 20 concurrent
/// correct admin requests on PostgreSQL got 429 that way (the first
/// attempt at this, reverted).
#[derive(Debug, Clone)]
pub struct AdminThrottle {
    local: Arc<LoginThrottle>,
    shared: Option<(Store, ThrottlePolicy)>,
}

/// What the shared count says before an admin attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedAdmission {
    /// How long the key is locked for (zero: not locked).
    pub wait: Duration,
    /// Whether a failure record exists (a success then forgets it).
    pub recorded: bool,
}

impl AdminThrottle {
    /// A throttle in this process's memory only (one process: SQLite).
    pub fn local(policy: ThrottlePolicy, now: Instant) -> Self {
        Self {
            local: Arc::new(LoginThrottle::new(policy, now)),
            shared: None,
        }
    }

    /// A throttle whose failure count is also kept in `store`'s database,
    /// shared with every process on it.
    pub fn shared(store: Store, policy: ThrottlePolicy, now: Instant) -> Self {
        Self {
            local: Arc::new(LoginThrottle::new(policy, now)),
            shared: Some((store, policy)),
        }
    }

    /// The in-memory part, which reserves each attempt.
    pub fn local_throttle(&self) -> &Arc<LoginThrottle> {
        &self.local
    }

    /// Whether the failures counted by every process lock `key` now (a
    /// read, no reservation). Always open without a shared count.
    ///
    /// # Errors
    /// The database.
    pub async fn shared_admission(&self, key: &ThrottleKey) -> Result<SharedAdmission, StoreError> {
        let Some((store, policy)) = &self.shared else {
            return Ok(SharedAdmission {
                wait: Duration::ZERO,
                recorded: false,
            });
        };
        let record = store.throttle_record(&key.storage_key()).await?;
        let wait = policy.admits(key, record.as_ref(), 0, UnixMillis::now());
        Ok(SharedAdmission {
            wait,
            recorded: record.is_some(),
        })
    }

    /// Counts one wrong token against `key` in the database (nothing
    /// without a shared count: the in-memory attempt counted it already).
    pub async fn shared_failure(&self, key: &ThrottleKey) {
        let Some((store, policy)) = &self.shared else {
            return;
        };
        let now = UnixMillis::now();
        let policy = *policy;
        let update = |before: Option<&throttle::Failures<UnixMillis>>| {
            let after = policy.after_failure(key, before, now);
            (after, policy.expiry(policy.free_failures(key), &after))
        };
        if let Err(e) = store
            .throttle_count_failure(&key.storage_key(), now, &update)
            .await
        {
            tracing::error!(error = %e, "admin throttle: a wrong token could not be counted");
        }
    }

    /// A correct token: forgets `key`'s shared failures.
    pub async fn shared_success(&self, key: &ThrottleKey) {
        let Some((store, _)) = &self.shared else {
            return;
        };
        if let Err(e) = store.throttle_forget(&key.storage_key()).await {
            tracing::warn!(error = %e, "admin throttle: a correct token could not clear the count");
        }
    }
}

/// The registration quota of the service.
#[derive(Debug, Clone)]
pub enum Quota {
    /// One process: in memory.
    Local(RegistrationQuota),
    /// Several processes: in the database.
    Shared {
        /// The database.
        store: Store,
        /// The rules.
        policy: QuotaPolicy,
    },
}

/// A held registration slot; count it with [`Slot::commit`], give it back by dropping.
#[derive(Debug)]
pub enum Slot {
    /// In memory.
    Local(Reservation),
    /// In the database.
    Shared(SharedSlot),
}

/// A slot held in the database; given back when dropped uncommitted.
#[derive(Debug)]
pub struct SharedSlot {
    store: Store,
    id: i64,
    ip: String,
    done: bool,
}

impl Drop for SharedSlot {
    fn drop(&mut self) {
        if !self.done {
            let (store, id) = (self.store.clone(), self.id);
            spawn_detached(async move {
                if let Err(e) = store.quota_release(id).await {
                    tracing::warn!(error = %e, "quota: could not release a slot (its lease runs out)");
                }
            });
        }
    }
}

impl Slot {
    /// The account was created: the slot counts from now on.
    pub async fn commit(self) {
        match self {
            Slot::Local(r) => r.commit(Instant::now()),
            Slot::Shared(mut s) => {
                s.done = true;
                if let Err(e) = s.store.quota_commit(s.id, &s.ip, UnixMillis::now()).await {
                    tracing::error!(error = %e, "quota: a registration could not be counted");
                }
            }
        }
    }
}

impl Quota {
    /// Whether the quota is zero: registration is closed to everyone.
    pub fn closed(&self) -> bool {
        match self {
            Quota::Local(q) => q.closed(),
            Quota::Shared { policy, .. } => policy.limit == 0,
        }
    }

    /// Holds a slot for `ip`.
    ///
    /// # Errors
    /// The database (shared quota only). The inner error is the wait when
    /// the IP is at its quota.
    pub async fn reserve(&self, ip: IpAddr) -> Result<Result<Slot, Duration>, StoreError> {
        match self {
            Quota::Local(q) => Ok(q.reserve(ip, Instant::now()).map(Slot::Local)),
            Quota::Shared { store, policy } => {
                if policy.limit == 0 {
                    return Ok(Err(policy.window));
                }
                let now = UnixMillis::now();
                let ip = ip.to_string();
                let got = store
                    .quota_reserve(&ip, now, policy.window, policy.limit, after(now, LEASE))
                    .await?;
                Ok(got.map(|id| {
                    Slot::Shared(SharedSlot {
                        store: store.clone(),
                        id,
                        ip,
                        done: false,
                    })
                }))
            }
        }
    }

    /// Tracked IPs held in this process's memory (0 when shared).
    pub fn len(&self) -> usize {
        match self {
            Quota::Local(q) => q.len(),
            Quota::Shared { .. } => 0,
        }
    }

    /// Whether [`Quota::len`] is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    async fn sweep(&self) -> Result<(), StoreError> {
        match self {
            Quota::Local(_) => Ok(()),
            Quota::Shared { store, policy } => {
                store.quota_sweep(UnixMillis::now(), policy.window).await
            }
        }
    }
}

/// The per-IP stream cap over every process on the database: each open
/// stream has a row; opening one past the cap evicts the IP's oldest,
/// wherever it lives (another process is told with a `NOTIFY`, see
/// `service::fanout`).
#[derive(Debug, Clone)]
pub struct SharedStreams {
    store: Store,
    /// This process's id in the database (random per start).
    me: Arc<str>,
    max_per_ip: usize,
    closed: mpsc::UnboundedSender<u64>,
    closed_rx: Arc<Mutex<Option<mpsc::UnboundedReceiver<u64>>>>,
}

/// Removes its stream's row when the stream ends.
#[derive(Debug)]
pub struct StreamSlot {
    id: u64,
    closed: mpsc::UnboundedSender<u64>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let _ = self.closed.send(self.id);
    }
}

impl SharedStreams {
    /// The cap for this process (a fresh id) on `store`.
    pub fn new(store: Store, policy: StreamPolicy) -> Self {
        let (closed, rx) = mpsc::unbounded_channel();
        Self {
            store,
            me: format!("{:016x}", rand::random::<u64>()).into(),
            max_per_ip: policy.max_per_ip,
            closed,
            closed_rx: Arc::new(Mutex::new(Some(rx))),
        }
    }

    /// This process's id (the `NOTIFY` payloads name it).
    pub fn process_id(&self) -> &str {
        &self.me
    }

    /// Registers this process (before any stream opens: other processes
    /// remove the streams of processes they do not know).
    ///
    /// # Errors
    /// The database.
    pub async fn announce(&self) -> Result<(), StoreError> {
        let now = UnixMillis::now();
        self.store
            .process_heartbeat(&self.me, now, UnixMillis(now.0 - ms(PROCESS_TIMEOUT)))
            .await
    }

    /// Opens a stream for `ip` on `hub` and records it; evicts the IP's
    /// oldest stream beyond the cap, here or in another process.
    ///
    /// # Errors
    /// [`AtCapacity`] at the hub's global cap.
    pub async fn subscribe(
        &self,
        hub: &StreamHub,
        ip: IpAddr,
    ) -> Result<(Subscription, StreamSlot), AtCapacity> {
        let sub = match hub.subscribe(ip) {
            Ok(sub) => sub,
            Err(AtCapacity) => {
                // At this process's global cap a stream from an IP at its
                // per-IP cap still gets in: that IP's oldest stream in this
                // process makes room (its row goes first, so the insert
                // below evicts nothing more).
                let open = self
                    .store
                    .streams_of(&ip.to_string())
                    .await
                    .map_err(|_| AtCapacity)?;
                if open.len() < self.max_per_ip {
                    return Err(AtCapacity);
                }
                let Some((_, oldest)) = open.iter().find(|(p, _)| **p == *self.me) else {
                    return Err(AtCapacity);
                };
                self.store
                    .stream_close(&self.me, *oldest)
                    .await
                    .map_err(|_| AtCapacity)?;
                hub.evict(u64::try_from(*oldest).unwrap_or(u64::MAX));
                hub.subscribe(ip)?
            }
        };
        let slot = StreamSlot {
            id: sub.id(),
            closed: self.closed.clone(),
        };
        let stream = i64::try_from(sub.id()).unwrap_or(i64::MAX);
        match self
            .store
            .stream_open(&self.me, stream, &ip.to_string(), self.max_per_ip)
            .await
        {
            Ok(evicted) => {
                for (owner, id) in evicted {
                    if *owner == *self.me {
                        hub.evict(u64::try_from(id).unwrap_or(u64::MAX));
                    }
                }
            }
            // The stream is served anyway: a database outage must not take
            // live updates down; the cap is back with the database.
            Err(e) => tracing::warn!(error = %e, "stream cap: could not record a stream"),
        }
        Ok((sub, slot))
    }

    /// Runs the heartbeat, the removal of ended streams' rows and the
    /// sweeps of `throttle` and `quota`; abort to stop, then call
    /// [`SharedStreams::leave`].
    pub async fn maintain(self, throttle: Throttle, quota: Quota) {
        let rx = self
            .closed_rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(mut rx) = rx else {
            return;
        };
        let mut beat = tokio::time::interval(HEARTBEAT);
        let mut sweep = tokio::time::interval(SWEEP_INTERVAL);
        loop {
            tokio::select! {
                Some(id) = rx.recv() => {
                    let stream = i64::try_from(id).unwrap_or(i64::MAX);
                    if let Err(e) = self.store.stream_close(&self.me, stream).await {
                        tracing::warn!(error = %e, "stream cap: could not forget a stream");
                    }
                }
                _ = beat.tick() => {
                    if let Err(e) = self.announce().await {
                        tracing::warn!(error = %e, "process heartbeat failed");
                    }
                }
                _ = sweep.tick() => {
                    if let Err(e) = throttle.sweep().await {
                        tracing::warn!(error = %e, "throttle sweep failed");
                    }
                    if let Err(e) = quota.sweep().await {
                        tracing::warn!(error = %e, "quota sweep failed");
                    }
                }
            }
        }
    }

    /// Removes this process and its streams (clean shutdown).
    pub async fn leave(&self) {
        if let Err(e) = self.store.process_gone(&self.me).await {
            tracing::warn!(error = %e, "could not remove this process's streams");
        }
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
