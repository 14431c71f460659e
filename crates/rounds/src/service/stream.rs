//! The live-update hub behind GET /rounds/stream: content-free notifications, a one-slot pending flag per subscriber, a global cap and a per-IP cap that evicts the IP's oldest stream.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Caps of the hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamPolicy {
    /// Concurrent subscribers in total.
    pub max_subscribers: usize,
    /// Concurrent subscribers per client IP.
    pub max_per_ip: usize,
}

impl Default for StreamPolicy {
    fn default() -> Self {
        Self {
            max_subscribers: 500,
            max_per_ip: 5,
        }
    }
}

/// The per-subscriber slot: at most one pending notification, plus a
/// "closed" flag for eviction and shutdown. `Notify` keeps at most one
/// permit, so a burst of publishes wakes the subscriber once.
#[derive(Debug, Default)]
struct Slot {
    pending: AtomicBool,
    closed: AtomicBool,
    wake: Notify,
}

#[derive(Debug, Default)]
struct HubState {
    /// Subscribers by id; ids increase, so per-IP queues are oldest first.
    subscribers: BTreeMap<u64, (IpAddr, Arc<Slot>)>,
    per_ip: HashMap<IpAddr, VecDeque<u64>>,
    next_id: u64,
    shut_down: bool,
}

/// Fans notifications out to every subscriber in this process.
#[derive(Debug, Clone)]
pub struct StreamHub {
    policy: StreamPolicy,
    state: Arc<Mutex<HubState>>,
    /// Raised by every local publish for the cross-process fan-out
    /// (`service::fanout`); one permit, so a burst is sent on once.
    outbox: Arc<Notify>,
}

/// The hub is full; the caller answers 503.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stream subscriber cap reached")]
pub struct AtCapacity;

/// What a subscriber receives next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Something changed; refetch.
    Changed,
    /// The stream was evicted or the service is shutting down.
    Closed,
}

/// One open stream; unregisters itself when dropped.
#[derive(Debug)]
pub struct Subscription {
    hub: StreamHub,
    id: u64,
    slot: Arc<Slot>,
}

impl Subscription {
    /// Waits for the next notification (or the close).
    pub async fn next(&self) -> Delivery {
        loop {
            if self.slot.closed.load(Ordering::Acquire) {
                return Delivery::Closed;
            }
            if self.slot.pending.swap(false, Ordering::AcqRel) {
                return Delivery::Changed;
            }
            self.slot.wake.notified().await;
        }
    }

    /// The stream's id in this process.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether a notification is waiting, without consuming it.
    pub fn has_pending(&self) -> bool {
        self.slot.pending.load(Ordering::Acquire)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.remove(self.id);
    }
}

impl StreamHub {
    /// An empty hub.
    pub fn new(policy: StreamPolicy) -> Self {
        Self {
            policy,
            state: Arc::new(Mutex::new(HubState::default())),
            outbox: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a stream for `ip`. When the IP is at its cap, its oldest stream
    /// is closed and this one accepted; otherwise past the global cap the
    /// call fails.
    ///
    /// # Errors
    /// [`AtCapacity`] at the global cap (or after shutdown).
    pub fn subscribe(&self, ip: IpAddr) -> Result<Subscription, AtCapacity> {
        let mut st = self.lock();
        if st.shut_down {
            return Err(AtCapacity);
        }
        let at_ip_cap = st.per_ip.get(&ip).map_or(0, VecDeque::len) >= self.policy.max_per_ip;
        if at_ip_cap {
            let oldest = st.per_ip.get_mut(&ip).and_then(VecDeque::pop_front);
            if let Some((_, slot)) = oldest.and_then(|id| st.subscribers.remove(&id)) {
                slot.closed.store(true, Ordering::Release);
                slot.wake.notify_one();
            }
        } else if st.subscribers.len() >= self.policy.max_subscribers {
            return Err(AtCapacity);
        }
        let id = st.next_id;
        st.next_id += 1;
        let slot = Arc::new(Slot::default());
        st.subscribers.insert(id, (ip, slot.clone()));
        st.per_ip.entry(ip).or_default().push_back(id);
        drop(st);
        Ok(Subscription {
            hub: self.clone(),
            id,
            slot,
        })
    }

    /// Closes stream `id` (evicted by the cap shared with other processes).
    pub fn evict(&self, id: u64) {
        let slot = self.lock().subscribers.get(&id).map(|(_, s)| s.clone());
        if let Some(slot) = slot {
            slot.closed.store(true, Ordering::Release);
            slot.wake.notify_one();
        }
        self.remove(id);
    }

    fn remove(&self, id: u64) {
        let mut st = self.lock();
        if let Some((ip, _)) = st.subscribers.remove(&id) {
            if let Some(q) = st.per_ip.get_mut(&ip) {
                q.retain(|x| *x != id);
                if q.is_empty() {
                    st.per_ip.remove(&ip);
                }
            }
        }
    }

    /// Tells every subscriber that something changed. A subscriber that
    /// already has a notification pending gets nothing more. With the
    /// PostgreSQL fan-out running, the other processes hear of it too.
    pub fn publish(&self) {
        // The other processes first: their subscribers wait on a database
        // round trip, this process's only on the wakes below.
        self.outbox.notify_one();
        self.publish_local();
    }

    /// Waits until [`StreamHub::publish`] was called since the last wait
    /// (the fan-out's sender).
    pub async fn published(&self) {
        self.outbox.notified().await;
    }

    /// [`StreamHub::publish`] to this process's subscribers only: for
    /// notifications that came from another process.
    pub fn publish_local(&self) {
        let st = self.lock();
        for (_, slot) in st.subscribers.values() {
            if !slot.pending.swap(true, Ordering::AcqRel) {
                slot.wake.notify_one();
            }
        }
    }

    /// Closes every stream and refuses new ones (graceful shutdown).
    pub fn shutdown(&self) {
        let mut st = self.lock();
        st.shut_down = true;
        for (_, slot) in st.subscribers.values() {
            slot.closed.store(true, Ordering::Release);
            slot.wake.notify_one();
        }
    }

    /// Open streams.
    pub fn len(&self) -> usize {
        self.lock().subscribers.len()
    }

    /// Whether no stream is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::time::Duration;

    fn ip(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(n))
    }

    async fn quiet(sub: &Subscription) -> bool {
        tokio::time::timeout(Duration::from_millis(50), sub.next())
            .await
            .is_err()
    }

    #[tokio::test]
    async fn burst_leaves_exactly_one_pending() {
        let hub = StreamHub::new(StreamPolicy::default());
        let slow = hub.subscribe(ip(1)).unwrap();
        for _ in 0..1000 {
            hub.publish();
        }
        assert_eq!(slow.next().await, Delivery::Changed);
        assert!(quiet(&slow).await, "only one notification was pending");
        hub.publish();
        assert_eq!(slow.next().await, Delivery::Changed);
    }

    #[tokio::test]
    async fn global_cap_and_per_ip_eviction() {
        let hub = StreamHub::new(StreamPolicy {
            max_subscribers: 10,
            max_per_ip: 5,
        });
        let a: Vec<_> = (0..5).map(|_| hub.subscribe(ip(1)).unwrap()).collect();
        let b: Vec<_> = (0..5).map(|i| hub.subscribe(ip(10 + i)).unwrap()).collect();
        assert_eq!(hub.len(), 10);
        assert_eq!(hub.subscribe(ip(99)).unwrap_err(), AtCapacity);
        // A sixth from ip 1 evicts ip 1's oldest even at the global cap.
        let sixth = hub.subscribe(ip(1)).unwrap();
        assert_eq!(a[0].next().await, Delivery::Closed);
        assert!(quiet(&a[1]).await);
        assert_eq!(hub.len(), 10);
        drop(b);
        assert_eq!(hub.len(), 5);
        hub.publish();
        assert_eq!(sixth.next().await, Delivery::Changed);
    }

    #[tokio::test]
    async fn only_local_publishes_reach_the_fanout_outbox() {
        let hub = StreamHub::new(StreamPolicy::default());
        let sub = hub.subscribe(ip(1)).unwrap();
        hub.publish_local();
        assert_eq!(sub.next().await, Delivery::Changed);
        let outbox_quiet = tokio::time::timeout(Duration::from_millis(50), hub.published())
            .await
            .is_err();
        assert!(outbox_quiet, "a remote notification is not sent back out");
        for _ in 0..100 {
            hub.publish();
        }
        hub.published().await;
        let outbox_quiet = tokio::time::timeout(Duration::from_millis(50), hub.published())
            .await
            .is_err();
        assert!(outbox_quiet, "a burst is sent on once");
        assert_eq!(sub.next().await, Delivery::Changed);
    }

    #[tokio::test]
    async fn shutdown_closes_everything() {
        let hub = StreamHub::new(StreamPolicy::default());
        let s = hub.subscribe(ip(1)).unwrap();
        hub.shutdown();
        assert_eq!(s.next().await, Delivery::Closed);
        assert!(hub.subscribe(ip(2)).is_err());
    }
}
