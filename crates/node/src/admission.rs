//! Admission of inbound connections before they authenticate.
//!
//! A connection takes a peer slot only once its handshake has proven a node key; until
//! then it is a *pending handshake*, bounded per source and in total. So strangers that
//! open connections and say nothing (half-open handshakes) cannot take the slots kept for
//! our own dials and for peers we have a channel with; they can at most fill the pending
//! bounds, each entry of which the handshake time-out frees.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

/// Where a connection comes from, for the per-source bound: an IPv4 address, or the /64
/// prefix of an IPv6 one (a single subscriber is routinely given a whole /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    /// An IPv4 address (also when it arrives IPv4-mapped on an IPv6 socket).
    V4(Ipv4Addr),
    /// The upper 64 bits of an IPv6 address.
    V6Prefix(u64),
}

impl Source {
    /// The source of a connection from `ip`.
    pub(crate) fn of(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(v4) => Source::V4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source::V4(v4),
                None => Source::V6Prefix((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::V4(v4) => write!(f, "{v4}"),
            Source::V6Prefix(p) => {
                let prefix = std::net::Ipv6Addr::from(u128::from(*p) << 64);
                write!(f, "{prefix}/64")
            }
        }
    }
}

/// Why a connection was closed before its handshake started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// As many handshakes as the node allows are pending.
    #[error("{limit} handshakes pending in total")]
    Total {
        /// `--max-pending-handshakes`.
        limit: usize,
    },
    /// As many handshakes as one source may have are pending from this one.
    #[error("{limit} handshakes pending from {from}")]
    PerSource {
        /// Where the connection came from.
        from: Source,
        /// `--max-pending-handshakes-per-ip`.
        limit: usize,
    },
}

/// The pending handshakes, counted per source and in total.
pub(crate) struct PendingHandshakes {
    max_total: usize,
    max_per_source: usize,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    total: usize,
    /// Only sources with a pending handshake: at most `max_total` entries.
    per_source: HashMap<Source, usize>,
}

/// One pending handshake; dropping it (the handshake ended, whichever way) frees its place.
pub(crate) struct Pending {
    owner: Arc<PendingHandshakes>,
    from: Source,
}

impl PendingHandshakes {
    /// Bounds of at most `max_total` pending handshakes, `max_per_source` of them from one source.
    pub(crate) fn new(max_total: usize, max_per_source: usize) -> Arc<Self> {
        Arc::new(PendingHandshakes {
            max_total,
            max_per_source,
            counts: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        // Plain counters: a panic elsewhere leaves them usable.
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a place for a handshake from `ip`.
    ///
    /// # Errors
    /// [`Refused`] when the source or the node has as many pending as allowed.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Pending, Refused> {
        let from = Source::of(ip);
        let mut counts = self.lock();
        if counts.total >= self.max_total {
            return Err(Refused::Total {
                limit: self.max_total,
            });
        }
        let of_source = counts.per_source.get(&from).copied().unwrap_or(0);
        if of_source >= self.max_per_source {
            return Err(Refused::PerSource {
                from,
                limit: self.max_per_source,
            });
        }
        counts.total += 1;
        counts.per_source.insert(from, of_source + 1);
        Ok(Pending {
            owner: Arc::clone(self),
            from,
        })
    }

    /// How many handshakes are pending now.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.lock().total
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut counts = self.owner.lock();
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.per_source.get_mut(&self.from) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.per_source.remove(&self.from);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn pending_handshakes_are_bounded_per_source_and_in_total() {
        let bounds = PendingHandshakes::new(3, 2);
        let a1 = bounds.admit(ip("10.0.0.1")).unwrap();
        let _a2 = bounds.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(
            bounds.admit(ip("10.0.0.1")).err(),
            Some(Refused::PerSource {
                from: Source::V4("10.0.0.1".parse().unwrap()),
                limit: 2
            })
        );
        let _b = bounds.admit(ip("10.0.0.2")).unwrap();
        assert_eq!(
            bounds.admit(ip("10.0.0.3")).err(),
            Some(Refused::Total { limit: 3 })
        );
        assert_eq!(bounds.pending(), 3);
        // A handshake that ends frees its place, for its source and in total.
        drop(a1);
        assert_eq!(bounds.pending(), 2);
        let _a3 = bounds.admit(ip("10.0.0.1")).unwrap();
    }

    #[test]
    fn sources_with_nothing_pending_are_forgotten() {
        let bounds = PendingHandshakes::new(10, 2);
        for i in 0..100u8 {
            let p = bounds.admit(IpAddr::from([10, 0, 1, i])).unwrap();
            drop(p);
        }
        assert_eq!(bounds.pending(), 0);
        assert!(bounds.lock().per_source.is_empty());
    }

    #[test]
    fn an_ipv6_source_is_its_64_prefix_and_a_mapped_ipv4_is_the_ipv4() {
        let bounds = PendingHandshakes::new(10, 1);
        let _a = bounds.admit(ip("2001:db8:1:2::1")).unwrap();
        let refused = bounds.admit(ip("2001:db8:1:2:ffff::9")).err();
        assert_eq!(
            refused.map(|r| r.to_string()),
            Some("1 handshakes pending from 2001:db8:1:2::/64".to_owned())
        );
        let _other = bounds.admit(ip("2001:db8:1:3::1")).unwrap();
        let _v4 = bounds.admit(ip("192.0.2.7")).unwrap();
        assert!(bounds.admit(ip("::ffff:192.0.2.7")).is_err());
    }
}
