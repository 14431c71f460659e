//! Prometheus metrics with `prometheus-client`: requests and latency per matched route, plus gauges sampled from the service's state at scrape time.
//!
//! Label values are bounded so that clients cannot grow the series: routes
//! are matched route templates (`unmatched` otherwise), methods outside the
//! standard ones are `OTHER`, and statuses are the ones the service answers.

use std::sync::Mutex;
use std::time::Duration;

use axum::http::Method;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds (seconds) of the latency histogram buckets.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// An HTTP method as a label: the standard ones, everything else `OTHER`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(clippy::upper_case_acronyms)]
pub enum MethodLabel {
    /// GET.
    GET,
    /// HEAD.
    HEAD,
    /// POST.
    POST,
    /// PUT.
    PUT,
    /// DELETE.
    DELETE,
    /// PATCH.
    PATCH,
    /// OPTIONS.
    OPTIONS,
    /// Any other method a client made up.
    OTHER,
}

impl From<&Method> for MethodLabel {
    fn from(m: &Method) -> Self {
        match *m {
            Method::GET => Self::GET,
            Method::HEAD => Self::HEAD,
            Method::POST => Self::POST,
            Method::PUT => Self::PUT,
            Method::DELETE => Self::DELETE,
            Method::PATCH => Self::PATCH,
            Method::OPTIONS => Self::OPTIONS,
            _ => Self::OTHER,
        }
    }
}

/// Labels of a request series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    method: MethodLabel,
    route: String,
    status: u16,
}

/// Labels of a latency series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LatencyLabels {
    method: MethodLabel,
    route: String,
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

/// The registry and the service's metrics.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<LatencyLabels, Histogram>,
    stream_subscribers: Gauge,
    login_throttle_keys: Gauge,
    registration_quota_keys: Gauge,
    password_hashes_in_flight: Gauge,
    password_hash_concurrency: Gauge,
    /// Gauges are set and encoded as one step, so two scrapes do not interleave.
    scrape: Mutex<()>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("potluck");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by route and status",
            requests.clone(),
        );
        let latency = Family::<LatencyLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "http_request_duration_seconds",
            "Request latency by route",
            latency.clone(),
        );
        let mut gauge = |name: &str, help: &str| {
            let g = Gauge::default();
            registry.register(name, help, g.clone());
            g
        };
        let stream_subscribers = gauge("stream_subscribers", "Open SSE streams");
        let login_throttle_keys =
            gauge("login_throttle_keys", "Keys tracked by the login throttle");
        let registration_quota_keys = gauge(
            "registration_quota_keys",
            "IPs tracked by the registration quota",
        );
        let password_hashes_in_flight =
            gauge("password_hashes_in_flight", "Password hashes running now");
        let password_hash_concurrency = gauge(
            "password_hash_concurrency",
            "Permitted concurrent password hashes",
        );
        Self {
            registry,
            requests,
            latency,
            stream_subscribers,
            login_throttle_keys,
            registration_quota_keys,
            password_hashes_in_flight,
            password_hash_concurrency,
            scrape: Mutex::new(()),
        }
    }
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Metrics {
    /// Records one finished request; `route` is the matched route template
    /// (or `unmatched`), never a raw path.
    pub fn record(&self, method: &Method, route: &str, status: u16, elapsed: Duration) {
        let method = MethodLabel::from(method);
        self.requests
            .get_or_create(&RequestLabels {
                method,
                route: route.to_string(),
                status,
            })
            .inc();
        self.latency
            .get_or_create(&LatencyLabels {
                method,
                route: route.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// The exposition text (OpenMetrics, which Prometheus also reads as its text format).
    pub fn render(&self, g: Gauges) -> String {
        let _scrape = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        self.stream_subscribers
            .set(gauge_value(g.stream_subscribers));
        self.login_throttle_keys
            .set(gauge_value(g.login_throttle_keys));
        self.registration_quota_keys
            .set(gauge_value(g.registration_quota_keys));
        self.password_hashes_in_flight
            .set(gauge_value(g.password_hashes_in_flight));
        self.password_hash_concurrency
            .set(gauge_value(g.password_hash_concurrency));
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics failed");
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
        m.record(
            &Method::GET,
            "/rounds/current",
            200,
            Duration::from_millis(3),
        );
        m.record(
            &Method::GET,
            "/rounds/current",
            200,
            Duration::from_millis(30),
        );
        let text = m.render(Gauges {
            stream_subscribers: 4,
            ..Gauges::default()
        });
        assert!(
            text.contains("potluck_http_requests_total{method=\"GET\",route=\"/rounds/current\",status=\"200\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("_bucket{le=\"0.005\",method=\"GET\",route=\"/rounds/current\"} 1"),
            "{text}"
        );
        assert!(text.contains("le=\"+Inf\",method=\"GET\""), "{text}");
        assert!(text.contains("potluck_stream_subscribers 4"), "{text}");
    }

    #[test]
    fn made_up_methods_do_not_grow_the_series() {
        let m = Metrics::default();
        for i in 0..500 {
            let method = Method::from_bytes(format!("M{i}").as_bytes()).expect("a token");
            m.record(&method, "unmatched", 404, Duration::from_millis(1));
        }
        let text = m.render(Gauges::default());
        let series = text
            .lines()
            .filter(|l| l.starts_with("potluck_http_requests_total{"))
            .count();
        assert!(
            series <= 10,
            "{series} request series after 500 made-up methods"
        );
        assert!(text.contains("method=\"OTHER\""), "{text}");
    }
}
