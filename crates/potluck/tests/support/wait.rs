//! The one way a test waits for something: it looks again every 100 ms and
//! fails, naming what it waited for (and what it last saw), once its limit
//! has passed. Async for the service's tests; a blocking form for the node's
//! process tests, which run on plain threads.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// How often a waiting test looks again, unless it says otherwise.
pub const EVERY: Duration = Duration::from_millis(100);

/// What one look gives: the value waited for, or not yet (with what was
/// seen instead, for the failure message).
pub trait Look {
    /// The value waited for.
    type Value;
    /// The value, or what was seen instead (if worth telling).
    fn reached(self) -> Result<Self::Value, Option<String>>;
}

impl<T> Look for Option<T> {
    type Value = T;
    fn reached(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl Look for bool {
    type Value = ();
    fn reached(self) -> Result<(), Option<String>> {
        self.then_some(()).ok_or(None)
    }
}

impl<T, E: Display> Look for Result<T, E> {
    type Value = T;
    fn reached(self) -> Result<T, Option<String>> {
        self.map_err(|seen| Some(seen.to_string()))
    }
}

/// The time-out rule shared by both forms.
struct Waiting<'a> {
    what: &'a str,
    limit: Duration,
    start: Instant,
}

impl<'a> Waiting<'a> {
    fn new(what: &'a str, limit: Duration) -> Self {
        Self {
            what,
            limit,
            start: Instant::now(),
        }
    }

    /// The value of `look`, or None to look again; fails the test once the
    /// limit has passed.
    fn judge<L: Look>(&self, look: L) -> Option<L::Value> {
        match look.reached() {
            Ok(v) => Some(v),
            Err(seen) => {
                let (what, limit) = (self.what, self.limit);
                let seen = seen
                    .map(|s| format!("; last seen: {s}"))
                    .unwrap_or_default();
                assert!(
                    self.start.elapsed() < limit,
                    "{what}: not reached within {limit:?}{seen}"
                );
                None
            }
        }
    }
}

/// Polls `f` every [`EVERY`] until it gives a value (`Some`, `Ok` or `true`); fails
/// the test, naming `what` (and the last `Err`), once `limit` has passed.
pub async fn wait_for<L, F, Fut>(what: &str, limit: Duration, f: F) -> L::Value
where
    L: Look,
    F: FnMut() -> Fut,
    Fut: Future<Output = L>,
{
    wait_for_every(what, limit, EVERY, f).await
}

/// [`wait_for`], looking every `every` (for a moment that passes quickly).
pub async fn wait_for_every<L, F, Fut>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut f: F,
) -> L::Value
where
    L: Look,
    F: FnMut() -> Fut,
    Fut: Future<Output = L>,
{
    let waiting = Waiting::new(what, limit);
    loop {
        if let Some(v) = waiting.judge(f().await) {
            return v;
        }
        tokio::time::sleep(every).await;
    }
}

/// [`wait_for`] on a blocking thread (the node's process tests), which
/// sleeps between looks.
pub fn wait_for_blocking<L: Look>(
    what: &str,
    limit: Duration,
    mut f: impl FnMut() -> L,
) -> L::Value {
    let waiting = Waiting::new(what, limit);
    loop {
        if let Some(v) = waiting.judge(f()) {
            return v;
        }
        std::thread::sleep(EVERY);
    }
}
