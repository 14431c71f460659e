//! The registration quota: at most 5 accounts per client IP per rolling hour, counted only once an account exists.
//!
//! `reserve` is called before the password is hashed and holds a slot while
//! the registration runs, so concurrent registrations from one IP cannot
//! overshoot; the slot becomes a counted registration on `commit` (account
//! created) and is given back when the reservation is dropped uncommitted
//! (taken name, validation or database error). A refused caller waits until
//! the oldest of its counted registrations leaves the window; refusals are
//! not recorded, so waiting never lengthens the next wait.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Limits of the quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaPolicy {
    /// Registrations per IP per window.
    pub limit: usize,
    /// The rolling window.
    pub window: Duration,
    /// Hard cap of tracked IPs.
    pub max_keys: usize,
    /// Empty keys are swept at most this often.
    pub sweep_interval: Duration,
}

impl Default for QuotaPolicy {
    fn default() -> Self {
        Self {
            limit: 5,
            window: Duration::from_secs(3600),
            max_keys: 50_000,
            sweep_interval: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Default)]
struct Entry {
    /// Times of counted registrations inside the window, oldest first.
    times: VecDeque<Instant>,
    /// Registrations in progress.
    pending: usize,
}

#[derive(Debug)]
struct State {
    entries: HashMap<IpAddr, Entry>,
    last_sweep: Instant,
}

/// The quota; clone to share.
#[derive(Debug, Clone)]
pub struct RegistrationQuota {
    policy: QuotaPolicy,
    state: Arc<Mutex<State>>,
}

/// A held slot; give it back by dropping, count it with [`Reservation::commit`].
#[derive(Debug)]
pub struct Reservation {
    quota: RegistrationQuota,
    ip: IpAddr,
    done: bool,
}

impl Reservation {
    /// The account was created: the slot counts from `now` on.
    pub fn commit(mut self, now: Instant) {
        self.done = true;
        let mut st = self.quota.lock();
        let e = st.entries.entry(self.ip).or_default();
        e.pending = e.pending.saturating_sub(1);
        e.times.push_back(now);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = self.quota.lock();
        if let Some(e) = st.entries.get_mut(&self.ip) {
            e.pending = e.pending.saturating_sub(1);
        }
    }
}

impl RegistrationQuota {
    /// An empty quota; `now` starts the sweep clock.
    pub fn new(policy: QuotaPolicy, now: Instant) -> Self {
        Self {
            policy,
            state: Arc::new(Mutex::new(State {
                entries: HashMap::new(),
                last_sweep: now,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn prune(window: Duration, e: &mut Entry, now: Instant) {
        while e
            .times
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= window)
        {
            e.times.pop_front();
        }
    }

    /// Whether the quota is zero: registration is closed to everyone.
    pub fn closed(&self) -> bool {
        self.policy.limit == 0
    }

    /// Holds a slot for `ip`, or says how long to wait.
    ///
    /// # Errors
    /// The wait (whole seconds are the caller's rounding) when the IP is at
    /// its quota. When only in-progress registrations fill it, the wait is 1 s.
    pub fn reserve(&self, ip: IpAddr, now: Instant) -> Result<Reservation, Duration> {
        if self.closed() {
            return Err(self.policy.window);
        }
        let mut st = self.lock();
        self.maybe_sweep(&mut st, now);
        if !st.entries.contains_key(&ip) && st.entries.len() >= self.policy.max_keys {
            self.evict(&mut st, now);
        }
        let window = self.policy.window;
        let e = st.entries.entry(ip).or_default();
        Self::prune(window, e, now);
        if e.times.len() >= self.policy.limit {
            // The oldest of the counted registrations that fill the quota.
            let oldest = e.times[e.times.len() - self.policy.limit];
            return Err((oldest + window).saturating_duration_since(now));
        }
        if e.times.len() + e.pending >= self.policy.limit {
            return Err(Duration::from_secs(1));
        }
        e.pending += 1;
        drop(st);
        Ok(Reservation {
            quota: self.clone(),
            ip,
            done: false,
        })
    }

    fn maybe_sweep(&self, st: &mut State, now: Instant) {
        if now.saturating_duration_since(st.last_sweep) < self.policy.sweep_interval {
            return;
        }
        st.last_sweep = now;
        let window = self.policy.window;
        st.entries.retain(|_, e| {
            Self::prune(window, e, now);
            !e.times.is_empty() || e.pending > 0
        });
    }

    /// Evicts 1% of the cap: keys with room left before full ones; among
    /// equals, the one whose newest registration is oldest. Keys with
    /// registrations in progress are kept.
    fn evict(&self, st: &mut State, now: Instant) {
        let window = self.policy.window;
        let limit = self.policy.limit;
        let mut ranked: Vec<((bool, Instant), IpAddr)> = st
            .entries
            .iter_mut()
            .filter(|(_, e)| e.pending == 0)
            .map(|(ip, e)| {
                Self::prune(window, e, now);
                let full = e.times.len() >= limit;
                let newest = e.times.back().copied().unwrap_or(now - Duration::ZERO);
                ((full, newest), *ip)
            })
            .collect();
        let n = (self.policy.max_keys / 100).max(1).min(ranked.len());
        if n == 0 {
            return;
        }
        if n < ranked.len() {
            ranked.select_nth_unstable_by_key(n - 1, |(rank, _)| *rank);
        }
        for (_, ip) in ranked.into_iter().take(n) {
            st.entries.remove(&ip);
        }
    }

    /// Number of tracked IPs.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether no IP is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counted registrations of `ip` inside the window at `now`.
    pub fn used(&self, ip: IpAddr, now: Instant) -> usize {
        let mut st = self.lock();
        let window = self.policy.window;
        st.entries.get_mut(&ip).map_or(0, |e| {
            Self::prune(window, e, now);
            e.times.len()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(n))
    }

    #[test]
    fn five_per_hour_and_retry_after_is_oldest_leaving() {
        let t0 = Instant::now();
        let q = RegistrationQuota::new(QuotaPolicy::default(), t0);
        for i in 0..5u64 {
            q.reserve(ip(1), t0 + Duration::from_secs(i * 10))
                .unwrap()
                .commit(t0 + Duration::from_secs(i * 10));
        }
        let at = t0 + Duration::from_secs(100);
        assert_eq!(q.reserve(ip(1), at).unwrap_err(), Duration::from_secs(3500));
        // Waiting never lengthens the next wait.
        let later = at + Duration::from_secs(1000);
        assert_eq!(
            q.reserve(ip(1), later).unwrap_err(),
            Duration::from_secs(2500)
        );
        // Other IPs are unaffected.
        assert!(q.reserve(ip(2), at).is_ok());
        // When the oldest leaves, one more fits; then the next oldest rules.
        let t_free = t0 + Duration::from_secs(3600);
        q.reserve(ip(1), t_free).unwrap().commit(t_free);
        assert_eq!(
            q.reserve(ip(1), t_free).unwrap_err(),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn uncommitted_reservations_do_not_count() {
        let t0 = Instant::now();
        let q = RegistrationQuota::new(QuotaPolicy::default(), t0);
        for _ in 0..20 {
            let r = q.reserve(ip(1), t0).unwrap();
            drop(r); // taken name: nothing counted
        }
        assert_eq!(q.used(ip(1), t0), 0);
        let held: Vec<_> = (0..5).map(|_| q.reserve(ip(1), t0).unwrap()).collect();
        assert_eq!(
            q.reserve(ip(1), t0).unwrap_err(),
            Duration::from_secs(1),
            "in-flight slots fill the quota"
        );
        drop(held);
        assert!(q.reserve(ip(1), t0).is_ok());
    }

    #[test]
    fn cap_evicts_keys_with_room_before_full_ones() {
        let t0 = Instant::now();
        let policy = QuotaPolicy {
            max_keys: 100,
            ..QuotaPolicy::default()
        };
        let q = RegistrationQuota::new(policy, t0);
        for _ in 0..5 {
            q.reserve(ip(999_999), t0).unwrap().commit(t0);
        }
        for i in 0..10_000u32 {
            let now = t0 + Duration::from_millis(u64::from(i));
            q.reserve(ip(i), now).unwrap().commit(now);
            assert!(q.len() <= 100);
        }
        // The full key survived the flood of keys with room left.
        assert!(q
            .reserve(ip(999_999), t0 + Duration::from_secs(20))
            .is_err());
    }

    #[test]
    fn sweep_drops_keys_whose_window_passed() {
        let t0 = Instant::now();
        let q = RegistrationQuota::new(QuotaPolicy::default(), t0);
        q.reserve(ip(1), t0).unwrap().commit(t0);
        let later = t0 + Duration::from_secs(3601);
        drop(q.reserve(ip(2), later));
        assert_eq!(q.len(), 1, "ip 1 swept, ip 2 tracked");
    }
}
