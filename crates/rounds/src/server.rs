//! The HTTP server: hyper over a TCP listener with a header-read time-out, an idle keep-alive time-out, a connection cap (accepting pauses at the cap) and a graceful shutdown with a deadline.
//!
//! `axum::serve` has none of these limits: a client that never finishes its
//! headers, or keeps a connection open without sending anything, holds a
//! task and a file descriptor for ever. Here each connection runs in its own
//! task under a semaphore permit; the idle watchdog and the shutdown signal
//! ask hyper for a graceful close (finish the response in progress, then
//! close), and past the shutdown deadline the remaining connections are dropped.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt as _;

/// Limits of the server's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// A client must send a request's complete headers within this time.
    pub header_read_timeout: Duration,
    /// A keep-alive connection without a request for this long is closed.
    pub idle_timeout: Duration,
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// After shutdown, in-flight requests get this long before connections are dropped.
    pub shutdown_grace: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 2048,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Pause after a failed `accept` (descriptors exhausted and the like).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Requests in progress on one connection and when the last one ended.
struct Activity {
    in_flight: AtomicUsize,
    last_done: Mutex<Instant>,
}

impl Activity {
    fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
    }

    fn end(&self) {
        *self.last_done.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// When the connection counts as idle for good, if no request starts before.
    fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(*self.last_done.lock().unwrap_or_else(|p| p.into_inner()) + idle)
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets in-flight
/// requests finish for at most `limits.shutdown_grace`.
///
/// # Errors
/// None today: a failed `accept` is logged and retried after a pause.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (closing_tx, closing_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        while connections.try_join_next().is_some() {}
        if permits.available_permits() == 0 {
            tracing::debug!(
                cap = limits.max_connections,
                "connection cap reached; accepting pauses"
            );
        }
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed; backing off");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let app = app.clone();
        let closing = closing_rx.clone();
        connections.spawn(async move {
            serve_connection(stream, peer, app, limits, closing).await;
            drop(permit);
        });
    }
    drop(listener);
    let _ = closing_tx.send(true);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            remaining = connections.len(),
            "shutdown deadline passed; dropping the remaining connections"
        );
        connections.shutdown().await;
    }
    Ok(())
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    app: Router,
    limits: ServerLimits,
    mut closing: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity {
        in_flight: AtomicUsize::new(0),
        last_done: Mutex::new(Instant::now()),
    });
    let seen = activity.clone();
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        // Handlers read the peer address as axum's `ConnectInfo`.
        request.extensions_mut().insert(ConnectInfo(peer));
        seen.begin();
        let app = app.clone();
        let seen = seen.clone();
        async move {
            let response = app.oneshot(request).await;
            seen.end();
            response
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    let mut closed_gracefully = false;
    loop {
        let idle_at = activity.idle_deadline(limits.idle_timeout);
        tokio::select! {
            done = connection.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            changed = closing.changed(), if !closed_gracefully => {
                if changed.is_err() || *closing.borrow() {
                    connection.as_mut().graceful_shutdown();
                    closed_gracefully = true;
                }
            }
            () = sleep_until(idle_at), if !closed_gracefully => {
                // Re-checked: a request may have started meanwhile.
                if activity
                    .idle_deadline(limits.idle_timeout)
                    .is_some_and(|at| at <= Instant::now())
                {
                    tracing::debug!(%peer, "idle keep-alive connection closed");
                    connection.as_mut().graceful_shutdown();
                    closed_gracefully = true;
                }
            }
        }
    }
}

/// Sleeps until `at`, or for a short while when a request is in progress
/// (then the idle deadline is looked at again).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => tokio::time::sleep(Duration::from_millis(250)).await,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;

    use super::*;

    fn limits() -> ServerLimits {
        ServerLimits {
            header_read_timeout: Duration::from_millis(500),
            idle_timeout: Duration::from_millis(700),
            max_connections: 2,
            shutdown_grace: Duration::from_millis(500),
        }
    }

    async fn start(
        limits: ServerLimits,
    ) -> (
        SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<std::io::Result<()>>,
    ) {
        let app = Router::new().route("/", get(|| async { "hi" })).route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, app, limits, async move {
            let _ = rx.await;
        }));
        (addr, tx, server)
    }

    /// Reads until the peer closes; returns what it sent and when it closed.
    async fn read_to_close(s: &mut TcpStream, within: Duration) -> Option<(String, Duration)> {
        let started = Instant::now();
        let mut all = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match tokio::time::timeout(within.saturating_sub(started.elapsed()), s.read(&mut buf))
                .await
            {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    return Some((
                        String::from_utf8_lossy(&all).into_owned(),
                        started.elapsed(),
                    ))
                }
                Ok(Ok(n)) => all.extend_from_slice(&buf[..n]),
                Err(_) => return None,
            }
        }
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_headers_is_cut_off() {
        let (addr, _stop, _server) = start(limits()).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        let closed = read_to_close(&mut s, Duration::from_secs(5)).await;
        assert!(
            closed.is_some(),
            "the half-sent request still holds the connection after 5 s"
        );
    }

    #[tokio::test]
    async fn an_idle_keep_alive_connection_is_closed() {
        // The header time-out is long, so only the idle time-out can close it.
        let (addr, _stop, _server) = start(ServerLimits {
            header_read_timeout: Duration::from_secs(60),
            ..limits()
        })
        .await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let (text, _) = read_to_close(&mut s, Duration::from_secs(5))
            .await
            .expect("the idle connection is closed within 5 s");
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.ends_with("hi"), "{text}");
    }

    #[tokio::test]
    async fn connections_past_the_cap_wait_for_a_free_slot() {
        let (addr, _stop, _server) = start(ServerLimits {
            idle_timeout: Duration::from_secs(60),
            header_read_timeout: Duration::from_secs(60),
            ..limits()
        })
        .await;
        // Two slow requests hold both slots.
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            held.push(s);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut third = TcpStream::connect(addr).await.unwrap();
        third
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        assert!(
            read_to_close(&mut third, Duration::from_millis(800))
                .await
                .is_none(),
            "a third connection was served past the cap of two"
        );
        drop(held);
        let (text, _) = read_to_close(&mut third, Duration::from_secs(5))
            .await
            .expect("served once a slot frees");
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    }

    #[tokio::test]
    async fn shutdown_waits_no_longer_than_its_deadline() {
        let (addr, stop, server) = start(limits()).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let asked = Instant::now();
        stop.send(()).unwrap();
        let done = tokio::time::timeout(Duration::from_secs(5), server).await;
        assert!(
            done.is_ok(),
            "the server still runs 5 s after shutdown with a 0.5 s deadline"
        );
        assert!(asked.elapsed() < Duration::from_secs(3));
    }
}
