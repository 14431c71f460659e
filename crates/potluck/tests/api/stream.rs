//! Black-box: GET /rounds/stream caps, eviction, notifications, keep-alive and shutdown (SQLite and PostgreSQL).

use crate::support;

use std::time::Duration;

use serde_json::json;
use support::{Db, Env, EventStream};

both_databases!(
    global_cap_and_per_ip_eviction,
    notifications_keepalive_and_coalescing,
    graceful_shutdown_closes_streams,
);

async fn global_cap_and_per_ip_eviction(db: Db) {
    let env = Env::new(db).await;
    let s = support::spawn_app(&env).await;
    let mut streams = Vec::new();
    for i in 0..500u32 {
        let ip = format!("100.64.{}.{}", (i / 5) / 256, (i / 5) % 256);
        let st = EventStream::open(s.addr, &ip).await;
        assert_eq!(st.status, 200, "stream {i}");
        streams.push(st);
    }
    assert_eq!(s.metric("potluck_stream_subscribers").await, 500.0);
    // The 501st subscriber from a new IP gets 503 and may poll instead.
    let refused = EventStream::open(s.addr, "100.65.0.1").await;
    assert_eq!(refused.status, 503);
    let body = refused.rest().await;
    assert!(body.contains("\"stream_capacity\""), "{body}");
    // A 6th stream from an IP that has 5 evicts that IP's oldest, even at the cap.
    let sixth = EventStream::open(s.addr, "100.64.0.0").await;
    assert_eq!(sixth.status, 200);
    let started = std::time::Instant::now();
    assert!(
        streams[0].closed_within(Duration::from_secs(1)).await,
        "oldest closed within 1 s"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        !streams[1].closed_within(Duration::from_millis(300)).await,
        "the others stay open"
    );
    assert!(
        !streams[5].closed_within(Duration::from_millis(100)).await,
        "other IPs untouched"
    );
    assert_eq!(s.metric("potluck_stream_subscribers").await, 500.0);
    // Everyone, including the newcomer, gets notifications.
    assert_eq!(s.admin_post("/admin/pause", json!({})).await.status, 200);
    let mut newcomer = sixth;
    assert!(newcomer.next_refetch(Duration::from_secs(5)).await);
    assert!(streams[499].next_refetch(Duration::from_secs(5)).await);
    s.stop().await;
}

async fn notifications_keepalive_and_coalescing(db: Db) {
    let env = Env::new(db).await;
    // A 1 s request time-out that the stream must be exempt from, and an
    // Argon2 cost that makes registration exceed it.
    let s = support::spawn_app_with(&env, |c| {
        c.keep_alive = Duration::from_secs(1);
        c.request_timeout = Duration::from_secs(1);
        c.hash_params = support::argon2(32768, 2);
        c.hashing_concurrency = 1;
    })
    .await;
    let mut st = EventStream::open(s.addr, "100.70.0.1").await;
    assert_eq!(st.status, 200);
    let h = |k: &str| {
        st.headers
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(h("content-type").as_deref(), Some("text/event-stream"));
    assert!(h("cache-control").unwrap().contains("no-cache"));
    assert_eq!(h("x-accel-buffering").as_deref(), Some("no"));
    assert_eq!(h("content-encoding"), None, "never compressed");
    // Idle: keep-alive comments, no messages.
    assert_eq!(st.count_refetches(Duration::from_millis(2500)).await, 0);
    let text = String::from_utf8_lossy(&st.buf).into_owned();
    assert!(
        text.contains(": keep-alive") || text.contains(":keep-alive"),
        "{text:?}"
    );
    assert!(!text.contains("data: refetch"));
    // A change: one content-free message, delivered at once (not buffered).
    let t0 = std::time::Instant::now();
    s.admin_post("/admin/pause", json!({})).await;
    assert!(st.next_refetch(Duration::from_secs(2)).await);
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    // A burst of changes: never more messages than publishes, at least one,
    // and nothing left over afterwards.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let addr = s.addr;
        tasks.spawn(async move {
            let path = if i % 2 == 0 {
                "/admin/resume"
            } else {
                "/admin/pause"
            };
            support::request(
                addr,
                "POST",
                path,
                &[("x-admin-token", support::ADMIN)],
                None,
            )
            .await
            .status
        });
    }
    while let Some(r) = tasks.join_next().await {
        assert_eq!(r.unwrap(), 200);
    }
    let n = st.count_refetches(Duration::from_millis(700)).await;
    assert!((1..=20).contains(&n), "{n}");
    assert_eq!(
        st.count_refetches(Duration::from_millis(500)).await,
        0,
        "no backlog is replayed"
    );
    // The stream outlived the 1 s time-out; ordinary requests do not.
    assert!(!st.closed_within(Duration::from_millis(200)).await);
    slow_registrations_time_out(s.addr).await;
    s.stop().await;
}

/// Ten registrations queue behind one hashing permit: the later ones exceed the 1 s time-out (408), the rest are created.
async fn slow_registrations_time_out(addr: std::net::SocketAddr) {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..10 {
        tasks.spawn(async move {
            let body = json!({"username": format!("slowpoke{i}"), "password": "password123"});
            support::request(
                addr,
                "POST",
                "/auth/register",
                &[("x-forwarded-for", &format!("100.72.0.{i}"))],
                Some(body.to_string().into_bytes()),
            )
            .await
            .status
        });
    }
    let mut statuses = Vec::new();
    while let Some(st) = tasks.join_next().await {
        statuses.push(st.unwrap());
    }
    assert!(statuses.contains(&408), "request time-out: {statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 408),
        "{statuses:?}"
    );
}

async fn graceful_shutdown_closes_streams(db: Db) {
    let env = Env::new(db).await;
    let mut s = env.start(&[]).await;
    let mut st = EventStream::open(s.addr, "100.71.0.1").await;
    assert_eq!(st.status, 200);
    let pid = s.child.id().unwrap();
    let killed = tokio::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    assert!(
        st.closed_within(Duration::from_secs(5)).await,
        "shutdown ends open streams"
    );
    let status = tokio::time::timeout(Duration::from_secs(10), s.child.wait())
        .await
        .expect("exits")
        .unwrap();
    assert!(status.success(), "{status:?}");
}
