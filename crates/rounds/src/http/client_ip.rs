//! The client IP: the X-Forwarded-For entry added by the outermost trusted proxy when the TCP peer is a trusted proxy, else the socket peer; IPv6 clients keyed by their /64. Shared by the throttle, the quota and the stream cap.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::HeaderMap;

use crate::http::state::AppState;

/// The client key of a request: its IPv4 address, or the /64 network of
/// its IPv6 address (one subscriber's allocation, so rotating addresses
/// inside it buys nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIp(pub IpAddr);

/// A network in CIDR notation (`10.0.0.0/8`, `::1/128`; a bare address is a
/// single host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

/// Why a CIDR did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid network {0:?} (expected ADDRESS/PREFIX, e.g. 10.0.0.0/8)")]
pub struct CidrError(pub String);

impl std::str::FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || CidrError(s.to_string());
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let net: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().map_err(|_| bad())?,
            None => max,
        };
        if prefix > max {
            return Err(bad());
        }
        Ok(Cidr {
            net: mask(net, prefix),
            prefix,
        })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

impl Cidr {
    /// Whether `ip` lies in this network (an IPv4-mapped IPv6 address
    /// counts as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        ip.is_ipv4() == self.net.is_ipv4() && mask(ip, self.prefix) == self.net
    }

    /// Whether every address of the network is a loopback address.
    pub fn is_loopback(&self) -> bool {
        self.net.is_loopback() && self.prefix >= if self.net.is_ipv4() { 8 } else { 128 }
    }

    /// The default trusted proxies: loopback only.
    pub fn loopback() -> Vec<Cidr> {
        vec![
            Cidr {
                net: IpAddr::from([127, 0, 0, 0]),
                prefix: 8,
            },
            Cidr {
                net: IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
                prefix: 128,
            },
        ]
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let m = u32::MAX
                .checked_shl(32 - u32::from(prefix.min(32)))
                .unwrap_or(0);
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let m = u128::MAX
                .checked_shl(128 - u32::from(prefix.min(128)))
                .unwrap_or(0);
            IpAddr::V6((bits & m).into())
        }
    }
}

/// The key the quota, the throttle and the stream caps count against:
/// IPv4 as is, IPv6 by its /64.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match canonical(ip) {
        IpAddr::V6(_) => mask(ip, 64),
        v4 => v4,
    }
}

/// The client address of a request from `peer`: X-Forwarded-For is only
/// believed when `peer` is one of the `trusted` proxies (anyone else could
/// write any address there), then read as [`client_ip`] does.
pub fn client_ip_from(headers: &HeaderMap, peer: IpAddr, hops: usize, trusted: &[Cidr]) -> IpAddr {
    if trusted.iter().any(|c| c.contains(peer)) {
        client_ip(headers, peer, hops)
    } else {
        peer
    }
}

/// Picks the client IP. With `hops` trusted proxies, each appends the
/// address it received from, so the client is the `hops`-th entry from the
/// right (entries further left are client-controlled and ignored). With
/// fewer entries than hops, the leftmost; without a usable header, the peer.
pub fn client_ip(headers: &HeaderMap, peer: IpAddr, hops: usize) -> IpAddr {
    if hops == 0 {
        return peer;
    }
    let entries: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if entries.is_empty() {
        return peer;
    }
    let idx = entries.len().saturating_sub(hops);
    parse_ip(entries[idx]).unwrap_or(peer)
}

fn parse_ip(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    // "1.2.3.4:5678" or "[::1]:5678"
    s.parse::<SocketAddr>().ok().map(|a| a.ip())
}

impl FromRequestParts<AppState> for ClientIp {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or(IpAddr::from([127, 0, 0, 1]), |c| c.0.ip());
        Ok(ClientIp(client_key(client_ip_from(
            &parts.headers,
            peer,
            state.config.trusted_proxy_hops,
            &state.config.trusted_proxies,
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn h(v: &str) -> HeaderMap {
        let mut m = HeaderMap::new();
        m.insert("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        m
    }

    #[test]
    fn only_trusted_peers_may_forward_and_v6_is_keyed_by_64() {
        let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
        let spoof = h("1.2.3.4");
        let outsider: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(client_ip_from(&spoof, outsider, 1, &trusted), outsider);
        let proxy: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(
            client_ip_from(&spoof, proxy, 1, &trusted),
            "1.2.3.4".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            client_key("2001:db8:1:2:aaaa::1".parse().unwrap()),
            "2001:db8:1:2::".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            client_key("::ffff:192.0.2.7".parse().unwrap()),
            "192.0.2.7".parse::<IpAddr>().unwrap()
        );
        assert!(Cidr::loopback()[0].contains("127.5.5.5".parse().unwrap()));
        assert!(Cidr::loopback()[1].contains("::1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nonsense".parse::<Cidr>().is_err());
        assert_eq!("::1".parse::<Cidr>().unwrap().to_string(), "::1/128");
    }

    #[test]
    fn rightmost_trusted_entry() {
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(
            client_ip(&h("6.6.6.6, 1.2.3.4"), peer, 1),
            "1.2.3.4".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            client_ip(&h("6.6.6.6, 1.2.3.4"), peer, 2),
            "6.6.6.6".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            client_ip(&h("1.2.3.4"), peer, 3),
            "1.2.3.4".parse::<IpAddr>().unwrap()
        );
        assert_eq!(client_ip(&HeaderMap::new(), peer, 1), peer);
        assert_eq!(client_ip(&h("1.2.3.4"), peer, 0), peer);
        assert_eq!(client_ip(&h("garbage"), peer, 1), peer);
        assert_eq!(
            client_ip(&h("[::1]:80"), peer, 1),
            "::1".parse::<IpAddr>().unwrap()
        );
    }
}
