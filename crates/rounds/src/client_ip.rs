//! The client IP: the X-Forwarded-For entry added by the outermost trusted proxy, else the socket peer. Shared by the throttle, the quota and the stream cap.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::HeaderMap;

use crate::app::AppState;

/// The client IP of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIp(pub IpAddr);

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
        Ok(ClientIp(client_ip(
            &parts.headers,
            peer,
            state.config.trusted_proxy_hops,
        )))
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
