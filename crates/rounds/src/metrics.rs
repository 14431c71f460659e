//! Prometheus text-format metrics: request counts and latency per route, plus gauges read from the service's state at scrape time.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds (seconds) of the latency histogram buckets.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Debug, Default, Clone)]
struct RouteStats {
    /// (status, count); few distinct statuses per route, so a vector.
    statuses: Vec<(u16, u64)>,
    latency: Histogram,
}

/// Counters and histograms of HTTP traffic. Keyed by route, then method, so
/// the steady state records a request without allocating.
#[derive(Debug, Default)]
pub struct Metrics {
    routes: Mutex<HashMap<String, Vec<(String, RouteStats)>>>,
}

/// Values sampled from the service when metrics are scraped.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gauges {
    /// Open SSE streams.
    pub stream_subscribers: usize,
    /// Keys tracked by the login throttle.
    pub login_throttle_keys: usize,
    /// IPs tracked by the registration quota.
    pub registration_quota_keys: usize,
    /// Password hashes running now.
    pub password_hashes_in_flight: usize,
    /// Permitted concurrent password hashes.
    pub password_hash_concurrency: usize,
}

impl Metrics {
    /// Records one finished request; `route` is the matched route template.
    pub fn record(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        let methods = match routes.get_mut(route) {
            Some(m) => m,
            None => routes.entry(route.to_string()).or_default(),
        };
        let idx = match methods.iter().position(|(m, _)| m == method) {
            Some(i) => i,
            None => {
                methods.push((method.to_string(), RouteStats::default()));
                methods.len() - 1
            }
        };
        let stats = &mut methods[idx].1;
        match stats.statuses.iter_mut().find(|(s, _)| *s == status) {
            Some((_, n)) => *n += 1,
            None => stats.statuses.push((status, 1)),
        }
        let secs = elapsed.as_secs_f64();
        let h = &mut stats.latency;
        h.count += 1;
        h.sum += secs;
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                h.counts[i] += 1;
            }
        }
    }

    /// A sorted copy for rendering.
    fn snapshot(&self) -> Vec<(String, String, RouteStats)> {
        let routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<_> = routes
            .iter()
            .flat_map(|(r, ms)| {
                ms.iter()
                    .map(move |(m, st)| (m.clone(), r.clone(), st.clone()))
            })
            .collect();
        out.sort_by(|a, b| (&a.1, &a.0).cmp(&(&b.1, &b.0)));
        out
    }

    /// The Prometheus exposition text.
    pub fn render(&self, g: Gauges) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP potluck_http_requests_total HTTP requests by route and status."
        );
        let _ = writeln!(out, "# TYPE potluck_http_requests_total counter");
        let snapshot = self.snapshot();
        for (m, r, st) in &snapshot {
            let mut statuses = st.statuses.clone();
            statuses.sort_unstable();
            for (s, n) in statuses {
                let _ = writeln!(
                    out,
                    "potluck_http_requests_total{{method=\"{m}\",route=\"{r}\",status=\"{s}\"}} {n}"
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP potluck_http_request_duration_seconds Request latency by route."
        );
        let _ = writeln!(
            out,
            "# TYPE potluck_http_request_duration_seconds histogram"
        );
        for (m, r, st) in &snapshot {
            let h = &st.latency;
            for (i, b) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "potluck_http_request_duration_seconds_bucket{{method=\"{m}\",route=\"{r}\",le=\"{b}\"}} {}",
                    h.counts[i]
                );
            }
            let _ = writeln!(
                out,
                "potluck_http_request_duration_seconds_bucket{{method=\"{m}\",route=\"{r}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "potluck_http_request_duration_seconds_sum{{method=\"{m}\",route=\"{r}\"}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "potluck_http_request_duration_seconds_count{{method=\"{m}\",route=\"{r}\"}} {}",
                h.count
            );
        }
        for (name, help, v) in [
            (
                "potluck_stream_subscribers",
                "Open SSE streams.",
                g.stream_subscribers,
            ),
            (
                "potluck_login_throttle_keys",
                "Keys tracked by the login throttle.",
                g.login_throttle_keys,
            ),
            (
                "potluck_registration_quota_keys",
                "IPs tracked by the registration quota.",
                g.registration_quota_keys,
            ),
            (
                "potluck_password_hashes_in_flight",
                "Password hashes running now.",
                g.password_hashes_in_flight,
            ),
            (
                "potluck_password_hash_concurrency",
                "Permitted concurrent password hashes.",
                g.password_hash_concurrency,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histograms_and_gauges() {
        let m = Metrics::default();
        m.record("GET", "/rounds/current", 200, Duration::from_millis(3));
        m.record("GET", "/rounds/current", 200, Duration::from_millis(30));
        let text = m.render(Gauges {
            stream_subscribers: 4,
            ..Gauges::default()
        });
        assert!(text.contains("potluck_http_requests_total{method=\"GET\",route=\"/rounds/current\",status=\"200\"} 2"));
        assert!(text.contains("le=\"0.005\"} 1"));
        assert!(text.contains("le=\"+Inf\"} 2"));
        assert!(text.contains("potluck_stream_subscribers 4"));
    }
}
