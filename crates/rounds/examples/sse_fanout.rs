//! Benchmark: opens N subscribers on GET /rounds/stream (5 per client IP via X-Forwarded-For), triggers K publishes through POST /admin/pause and /admin/resume, and reports the delivery latency from sending the admin request to each subscriber reading `data: refetch`.
//!
//! `cargo run --release -p potluck-rounds --example sse_fanout -- ADDR ADMIN_TOKEN SUBSCRIBERS PUBLISHES [PUBLISH_ADDR]`
//!
//! ADDR may list several processes (comma-separated): N subscribers open on
//! each, the publishes go through PUBLISH_ADDR (default: the first), and
//! the latency is reported per process, so a change made in one process is
//! timed to delivery in another (the PostgreSQL fan-out).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let addrs: Vec<SocketAddr> = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:18080".into())
        .split(',')
        .map(|a| a.parse().expect("addr"))
        .collect();
    let token = args.next().unwrap_or_else(|| "bench".into());
    let subscribers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(500);
    let publishes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20);
    let addr: SocketAddr = args
        .next()
        .map(|a| a.parse().expect("publish addr"))
        .unwrap_or(addrs[0]);
    // The time each publish was triggered; subscribers read it on arrival.
    let (tx, rx) = watch::channel(Instant::now());
    let samples: Vec<Arc<Mutex<Vec<Duration>>>> = addrs.iter().map(|_| Arc::default()).collect();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(subscribers * addrs.len());
    for (g, sub_addr) in addrs.iter().copied().enumerate() {
        for i in 0..subscribers {
            tokio::spawn(subscribe(
                sub_addr,
                g,
                i,
                rx.clone(),
                samples[g].clone(),
                ready_tx.clone(),
            ));
        }
    }
    for _ in 0..subscribers * addrs.len() {
        ready_rx.recv().await.expect("subscriber ready");
    }
    for k in 0..publishes {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let path = if k % 2 == 0 {
            "/admin/pause"
        } else {
            "/admin/resume"
        };
        let sent = Instant::now();
        tx.send_replace(sent);
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let req = format!("POST {path} HTTP/1.1\r\nhost: b\r\nx-admin-token: {token}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
        s.write_all(req.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.expect("read");
        assert!(
            out.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    for (g, sub_addr) in addrs.iter().enumerate() {
        let mut v = samples[g].lock().expect("lock").clone();
        v.sort();
        let pct = |p: f64| {
            v[((v.len() as f64 * p).ceil() as usize)
                .saturating_sub(1)
                .min(v.len() - 1)]
        };
        let side = if *sub_addr == addr {
            "same process as the change"
        } else {
            "other process"
        };
        println!(
            "subscribers={subscribers} on {sub_addr} ({side}) publishes={publishes} deliveries={} (expected {}) p50={:.2}ms p99={:.2}ms max={:.2}ms",
            v.len(),
            subscribers * publishes,
            pct(0.50).as_secs_f64() * 1e3,
            pct(0.99).as_secs_f64() * 1e3,
            v.last().copied().unwrap_or_default().as_secs_f64() * 1e3
        );
    }
}

/// Subscriber `i` of process `g`, on `sub_addr`'s stream: each delivery's
/// latency from the publish time in `rx` goes into `samples`; `ready` hears
/// once the stream's head arrived.
async fn subscribe(
    sub_addr: SocketAddr,
    g: usize,
    i: usize,
    rx: watch::Receiver<Instant>,
    samples: Arc<Mutex<Vec<Duration>>>,
    ready: tokio::sync::mpsc::Sender<()>,
) {
    let mut s = TcpStream::connect(sub_addr).await.expect("connect");
    // Each process's subscribers come from their own addresses, so
    // the per-IP cap (shared by the processes) evicts nobody.
    let req = format!(
        "GET /rounds/stream HTTP/1.1\r\nhost: b\r\nx-forwarded-for: 10.{}.{}.{}\r\n\r\n",
        (i / 5) / 256,
        (i / 5) % 256,
        g + 1
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 4096];
    let mut seen_head = false;
    loop {
        let n = match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let arrived = Instant::now();
        let text = String::from_utf8_lossy(&buf[..n]);
        if !seen_head && text.contains("\r\n\r\n") {
            seen_head = true;
            assert!(text.starts_with("HTTP/1.1 200"), "{text}");
            let _ = ready.send(()).await;
        }
        let events = text.matches("data: refetch").count();
        if events > 0 {
            let sent = *rx.borrow();
            samples.lock().expect("lock").push(arrived - sent);
        }
    }
}
