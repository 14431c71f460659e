//! The login throttle: failures counted per lower-cased username and per client IP, with exponential lockouts, decay, sweeping and a hard key cap.
//!
//! Pure logic over `Instant`s passed in by the caller, so tests run on a
//! virtual clock. Rules (documented in docs/rounds-api.md):
//! - a key may fail `free_failures` times without delay (5 per username,
//!   20 per IP); the n-th failure beyond that locks the key for
//!   `base_lockout · 2^(n-1)`, at most `max_lockout` (1 s … 15 min);
//! - an attempt while any of its keys is locked is refused (429) before the
//!   password is checked, so a correct password is refused too, and the
//!   refused attempt is not counted;
//! - once a lockout has ended, failures decay one step per
//!   `max(lockout(n), decay_floor)` without failures (decay_floor 60 s, so
//!   slow guessing below the threshold still accumulates);
//! - a key whose lockout expired and whose count decayed to zero is removed
//!   by a sweep that runs at most once per `sweep_interval` (60 s), from
//!   failure recording and from reads;
//! - at most `max_keys` (50,000) keys are tracked; past that, the keys
//!   closest to full expiry are evicted first, in batches of 1%;
//! - checking and reserving an attempt is one step ([`LoginThrottle::begin`]):
//!   an attempt in flight (its password still being hashed) counts against
//!   the allowance, so a burst of concurrent guesses cannot all pass the
//!   check before the first failure is recorded. Below the free failures a
//!   key may have `free - failures` attempts in flight; at or above, one.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// Kept in the domain so that the store, which shares them between
// processes, does not reach into the policy.
pub use crate::domain::lockout::Failures;
pub use crate::domain::time::UnixMillis;

/// What the throttle counts failures against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ThrottleKey {
    /// A lower-cased username.
    User(String),
    /// A client IP.
    Ip(IpAddr),
    /// A client IP presenting admin tokens (counted apart from its logins).
    AdminIp(IpAddr),
}

impl ThrottleKey {
    /// The key as stored in the database (`u:` name, `i:` address, `a:`
    /// address of admin-token attempts).
    pub fn storage_key(&self) -> String {
        match self {
            ThrottleKey::User(name) => format!("u:{name}"),
            ThrottleKey::Ip(ip) => format!("i:{ip}"),
            ThrottleKey::AdminIp(ip) => format!("a:{ip}"),
        }
    }
}

/// Thresholds and limits of the throttle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottlePolicy {
    /// Failures per username before lockouts start.
    pub user_free_failures: u32,
    /// Failures per IP before lockouts start.
    pub ip_free_failures: u32,
    /// First lockout.
    pub base_lockout: Duration,
    /// Longest lockout.
    pub max_lockout: Duration,
    /// Shortest decay step (applies below the lockout threshold).
    pub decay_floor: Duration,
    /// Hard cap of tracked keys.
    pub max_keys: usize,
    /// Expired keys are swept at most this often.
    pub sweep_interval: Duration,
}

impl Default for ThrottlePolicy {
    fn default() -> Self {
        Self {
            user_free_failures: 5,
            ip_free_failures: 20,
            base_lockout: Duration::from_secs(1),
            max_lockout: Duration::from_secs(15 * 60),
            decay_floor: Duration::from_secs(60),
            max_keys: 50_000,
            sweep_interval: Duration::from_secs(60),
        }
    }
}

/// A point in time the throttle's rules run on: the process's monotonic
/// clock, or unix milliseconds shared by several processes.
pub trait Moment: Copy + Ord {
    /// `self + d`, unless that overflows.
    fn plus(self, d: Duration) -> Option<Self>;
    /// How long from `self` until `later` (zero when `later` is earlier).
    fn until(self, later: Self) -> Duration;
}

impl Moment for Instant {
    fn plus(self, d: Duration) -> Option<Self> {
        self.checked_add(d)
    }
    fn until(self, later: Self) -> Duration {
        later.saturating_duration_since(self)
    }
}

impl Moment for UnixMillis {
    fn plus(self, d: Duration) -> Option<Self> {
        i64::try_from(d.as_millis())
            .ok()
            .and_then(|m| self.0.checked_add(m))
            .map(UnixMillis)
    }
    fn until(self, later: Self) -> Duration {
        Duration::from_millis(u64::try_from(later.0.saturating_sub(self.0)).unwrap_or(0))
    }
}

impl ThrottlePolicy {
    /// Failures `key` may have before lockouts start.
    pub fn free_failures(&self, key: &ThrottleKey) -> u32 {
        match key {
            ThrottleKey::User(_) => self.user_free_failures,
            ThrottleKey::Ip(_) | ThrottleKey::AdminIp(_) => self.ip_free_failures,
        }
    }

    /// Most failures a key is counted up to (the lockout is at its cap by then).
    fn ceiling(&self, free: u32) -> u32 {
        free + 32
    }

    fn lockout(&self, free: u32, n: u32) -> Duration {
        if n <= free {
            return Duration::ZERO;
        }
        let steps = (n - free - 1).min(30);
        self.base_lockout
            .saturating_mul(1u32 << steps)
            .min(self.max_lockout)
    }

    fn period(&self, free: u32, n: u32) -> Duration {
        self.lockout(free, n).max(self.decay_floor)
    }

    /// The failure count of `e` at `now`, after decay.
    fn decayed<T: Moment>(&self, free: u32, e: &Failures<T>, now: T) -> u32 {
        // Decay starts when the lockout ends, so waiting out a lockout and
        // failing again always doubles it.
        let (mut n, mut t) = (e.failures, e.locked_until.max(e.last_failure));
        while n > 0 {
            let p = self.period(free, n);
            match t.plus(p) {
                Some(next) if now >= next => {
                    t = next;
                    n -= 1;
                }
                _ => break,
            }
        }
        n
    }

    /// When `e` has fully decayed and its lockout expired.
    pub fn expiry<T: Moment>(&self, free: u32, e: &Failures<T>) -> T {
        let mut t = e.locked_until.max(e.last_failure);
        for n in (1..=e.failures).rev() {
            t = t.plus(self.period(free, n)).unwrap_or(t);
        }
        t
    }

    /// The record of `key` after one more failure at `now`.
    pub fn after_failure<T: Moment>(
        &self,
        key: &ThrottleKey,
        before: Option<&Failures<T>>,
        now: T,
    ) -> Failures<T> {
        let free = self.free_failures(key);
        let n = before.map_or(0, |e| self.decayed(free, e, now));
        let n = (n + 1).min(self.ceiling(free));
        Failures {
            failures: n,
            last_failure: now,
            locked_until: now.plus(self.lockout(free, n)).unwrap_or(now),
        }
    }

    /// Whether one more attempt against `key` may start at `now`, given its
    /// record and the attempts in flight; else how long to wait.
    pub fn admits<T: Moment>(
        &self,
        key: &ThrottleKey,
        record: Option<&Failures<T>>,
        in_flight: u32,
        now: T,
    ) -> Duration {
        let free = self.free_failures(key);
        let failures = match record {
            Some(e) => {
                let locked = now.until(e.locked_until);
                if !locked.is_zero() {
                    return locked;
                }
                self.decayed(free, e, now)
            }
            None => 0,
        };
        if in_flight > 0 && failures.saturating_add(in_flight) >= free {
            return Duration::from_secs(1);
        }
        Duration::ZERO
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    record: Failures<Instant>,
    /// Attempts reserved by `begin` and not yet settled.
    in_flight: u32,
}

#[derive(Debug)]
struct State {
    entries: HashMap<ThrottleKey, Entry>,
    last_sweep: Instant,
}

/// The throttle; cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct LoginThrottle {
    policy: ThrottlePolicy,
    state: Mutex<State>,
}

impl LoginThrottle {
    /// An empty throttle; `now` starts the sweep clock.
    pub fn new(policy: ThrottlePolicy, now: Instant) -> Self {
        Self {
            policy,
            state: Mutex::new(State {
                entries: HashMap::new(),
                last_sweep: now,
            }),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> ThrottlePolicy {
        self.policy
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain counters behind,
        // which are still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn expiry(&self, key: &ThrottleKey, e: &Entry) -> Instant {
        self.policy
            .expiry(self.policy.free_failures(key), &e.record)
    }

    fn maybe_sweep(&self, st: &mut State, now: Instant) {
        if now.saturating_duration_since(st.last_sweep) < self.policy.sweep_interval {
            return;
        }
        st.last_sweep = now;
        st.entries
            .retain(|k, e| e.in_flight > 0 || now < self.expiry(k, e));
    }

    /// How long the attempt must wait, if any of `keys` is locked at `now`.
    pub fn check(&self, keys: &[ThrottleKey], now: Instant) -> Option<Duration> {
        let mut st = self.lock();
        self.maybe_sweep(&mut st, now);
        keys.iter()
            .filter_map(|k| st.entries.get(k))
            .map(|e| e.record.locked_until.saturating_duration_since(now))
            .filter(|d| !d.is_zero())
            .max()
    }

    /// Counts one failed attempt against each of `keys`.
    pub fn record_failure(&self, keys: &[ThrottleKey], now: Instant) {
        let mut st = self.lock();
        self.maybe_sweep(&mut st, now);
        for key in keys {
            if !st.entries.contains_key(key) && st.entries.len() >= self.policy.max_keys {
                self.evict(&mut st);
            }
            let (before, in_flight) = match st.entries.get(key) {
                Some(e) => (Some(e.record), e.in_flight),
                None => (None, 0),
            };
            let record = self.policy.after_failure(key, before.as_ref(), now);
            st.entries.insert(key.clone(), Entry { record, in_flight });
        }
    }

    /// Forgets the failures of `key` (a successful login of that user).
    pub fn record_success(&self, key: &ThrottleKey) {
        let mut st = self.lock();
        if let Some(e) = st.entries.get_mut(key) {
            if e.in_flight == 0 {
                st.entries.remove(key);
            } else {
                let now = e.record.last_failure;
                e.record = Failures {
                    failures: 0,
                    last_failure: now,
                    locked_until: now,
                };
            }
        }
    }

    /// Checks `keys` and reserves one attempt against each in the same
    /// step; settle it with [`Attempt::failed`] or [`Attempt::succeeded`]
    /// (dropping it unsettled gives the reservation back).
    ///
    /// # Errors
    /// How long to wait when a key is locked, or already has as many
    /// attempts in flight as it may (then one second).
    pub fn begin(
        self: &Arc<Self>,
        keys: &[ThrottleKey],
        now: Instant,
    ) -> Result<Attempt, Duration> {
        let mut st = self.lock();
        self.maybe_sweep(&mut st, now);
        let mut wait = Duration::ZERO;
        for key in keys {
            let Some(e) = st.entries.get(key) else {
                continue;
            };
            wait = wait.max(self.policy.admits(key, Some(&e.record), e.in_flight, now));
        }
        if !wait.is_zero() {
            return Err(wait);
        }
        for key in keys {
            if !st.entries.contains_key(key) && st.entries.len() >= self.policy.max_keys {
                self.evict(&mut st);
            }
            st.entries
                .entry(key.clone())
                .or_insert(Entry {
                    record: Failures {
                        failures: 0,
                        last_failure: now,
                        locked_until: now,
                    },
                    in_flight: 0,
                })
                .in_flight += 1;
        }
        Ok(Attempt {
            throttle: self.clone(),
            keys: keys.to_vec(),
            settled: false,
        })
    }

    fn release(&self, keys: &[ThrottleKey]) {
        let mut st = self.lock();
        for key in keys {
            if let Some(e) = st.entries.get_mut(key) {
                e.in_flight = e.in_flight.saturating_sub(1);
            }
        }
    }

    /// Evicts the keys closest to expiry, 1% of the cap (at least one).
    fn evict(&self, st: &mut State) {
        let batch = (self.policy.max_keys / 100).max(1);
        // Keys with attempts in flight go last: evicting one forgets its
        // reservations (a few more concurrent attempts), which is the price
        // of the hard cap under a flood of fresh keys.
        let mut by_expiry: Vec<((bool, Instant), ThrottleKey)> = st
            .entries
            .iter()
            .map(|(k, e)| ((e.in_flight > 0, self.expiry(k, e)), k.clone()))
            .collect();
        let over = (st.entries.len() + 1).saturating_sub(self.policy.max_keys);
        let n = batch.max(over).min(by_expiry.len());
        if n == 0 {
            return;
        }
        if n < by_expiry.len() {
            by_expiry.select_nth_unstable_by_key(n - 1, |(t, _)| *t);
        }
        for (_, k) in by_expiry.into_iter().take(n) {
            st.entries.remove(&k);
        }
    }

    /// Number of tracked keys.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The failure count of `key` as stored (not decayed), for tests.
    pub fn failures(&self, key: &ThrottleKey) -> u32 {
        self.lock()
            .entries
            .get(key)
            .map_or(0, |e| e.record.failures)
    }
}

/// One login attempt reserved by [`LoginThrottle::begin`].
#[derive(Debug)]
pub struct Attempt {
    throttle: Arc<LoginThrottle>,
    keys: Vec<ThrottleKey>,
    settled: bool,
}

impl Attempt {
    /// The password was wrong: a failure counts against every key.
    pub fn failed(mut self, now: Instant) {
        self.settled = true;
        self.throttle.release(&self.keys);
        self.throttle.record_failure(&self.keys, now);
    }

    /// The password was right: `key`'s failures are forgotten.
    pub fn succeeded(mut self, key: &ThrottleKey) {
        self.settled = true;
        self.throttle.release(&self.keys);
        self.throttle.record_success(key);
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.settled {
            self.throttle.release(&self.keys);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn user(n: &str) -> ThrottleKey {
        ThrottleKey::User(n.into())
    }

    fn ip(n: u32) -> ThrottleKey {
        ThrottleKey::Ip(IpAddr::V4(Ipv4Addr::from(n)))
    }

    #[test]
    fn five_free_failures_then_doubling_lockouts_capped() {
        let t0 = Instant::now();
        let th = LoginThrottle::new(ThrottlePolicy::default(), t0);
        let k = [user("bob")];
        for _ in 0..5 {
            assert_eq!(th.check(&k, t0), None);
            th.record_failure(&k, t0);
        }
        assert_eq!(th.check(&k, t0), None, "five failures are free");
        th.record_failure(&k, t0);
        assert_eq!(th.check(&k, t0), Some(Duration::from_secs(1)));
        let mut now = t0;
        let mut last = Duration::from_secs(1);
        for _ in 0..20 {
            now += last;
            assert_eq!(th.check(&k, now), None);
            th.record_failure(&k, now);
            let wait = th.check(&k, now).unwrap();
            assert!(
                wait == (last * 2).min(Duration::from_secs(900)),
                "{wait:?} after {last:?}"
            );
            last = wait;
        }
        assert_eq!(last, Duration::from_secs(900));
    }

    #[test]
    fn ip_allows_twenty() {
        let t0 = Instant::now();
        let th = LoginThrottle::new(ThrottlePolicy::default(), t0);
        for i in 0..20 {
            // Rotating usernames, one IP.
            th.record_failure(&[user(&format!("u{i}")), ip(1)], t0);
        }
        assert_eq!(th.check(&[ip(1)], t0), None);
        th.record_failure(&[ip(1)], t0);
        assert!(th.check(&[ip(1)], t0).is_some());
        assert_eq!(th.check(&[ip(2)], t0), None);
    }

    #[test]
    fn failures_decay_and_success_resets() {
        let t0 = Instant::now();
        let th = LoginThrottle::new(ThrottlePolicy::default(), t0);
        let k = [user("amy")];
        for _ in 0..5 {
            th.record_failure(&k, t0);
        }
        // Five minutes later five steps of 60 s have decayed away.
        th.record_failure(&k, t0 + Duration::from_secs(300));
        assert_eq!(th.failures(&k[0]), 1);
        th.record_success(&k[0]);
        assert_eq!(th.failures(&k[0]), 0);
    }

    #[test]
    fn sweep_runs_at_most_once_per_interval_and_removes_only_decayed() {
        let t0 = Instant::now();
        let th = LoginThrottle::new(ThrottlePolicy::default(), t0);
        th.record_failure(&[user("a")], t0);
        th.record_failure(&[user("b")], t0 + Duration::from_secs(50));
        // 61 s: a (one failure, 60 s decay) is gone, b is not.
        assert_eq!(th.check(&[], t0 + Duration::from_secs(61)), None);
        assert_eq!(th.len(), 1);
        // 115 s: b has decayed but the last sweep was 54 s ago.
        th.check(&[], t0 + Duration::from_secs(115));
        assert_eq!(th.len(), 1);
        th.check(&[], t0 + Duration::from_secs(121));
        assert_eq!(th.len(), 0);
    }

    #[test]
    fn flood_of_unique_keys_never_exceeds_cap() {
        let t0 = Instant::now();
        let policy = ThrottlePolicy::default();
        let th = LoginThrottle::new(policy, t0);
        // A locked key that must survive the flood: it is far from expiry.
        let victim = user("victim");
        for _ in 0..10 {
            th.record_failure(std::slice::from_ref(&victim), t0);
        }
        for i in 0..120_000u32 {
            th.record_failure(&[ip(i)], t0 + Duration::from_millis(u64::from(i) / 10));
            assert!(th.len() <= policy.max_keys);
        }
        assert!(th.len() <= 50_000);
        assert!(th.len() > 49_000);
        assert!(th.check(&[victim], t0 + Duration::from_secs(12)).is_some());
    }

    #[test]
    fn attempts_in_flight_count_against_the_allowance() {
        let t0 = Instant::now();
        let th = Arc::new(LoginThrottle::new(ThrottlePolicy::default(), t0));
        let k = [user("zed")];
        let held: Vec<Attempt> = (0..5).map(|_| th.begin(&k, t0).unwrap()).collect();
        assert!(
            th.begin(&k, t0).is_err(),
            "five in flight fill the allowance"
        );
        for a in held {
            a.failed(t0);
        }
        // Five failures recorded: one more attempt at a time.
        let one = th.begin(&k, t0).unwrap();
        assert!(th.begin(&k, t0).is_err());
        drop(one);
        let one = th.begin(&k, t0).unwrap();
        one.failed(t0);
        assert_eq!(th.begin(&k, t0).unwrap_err(), Duration::from_secs(1));
        assert_eq!(th.failures(&k[0]), 6);
    }

    proptest::proptest! {
        #[test]
        fn cap_holds_for_any_sequence(ops in proptest::collection::vec((0u32..400, 0u64..5_000), 1..600)) {
            let t0 = Instant::now();
            let policy = ThrottlePolicy { max_keys: 50, ..ThrottlePolicy::default() };
            let th = LoginThrottle::new(policy, t0);
            let mut now = t0;
            for (k, dt) in ops {
                now += Duration::from_millis(dt);
                th.record_failure(&[ip(k)], now);
                proptest::prop_assert!(th.len() <= 50);
            }
        }
    }
}
