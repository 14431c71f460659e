//! Black-box attack tests of issue 16 (hostile clients, network and configuration) on SQLite and PostgreSQL: the service in this process where only its HTTP behaviour is tested, the `potluck serve` binary where its flags, exit codes, files, log, CPU or SIGTERM are.

use crate::support;

use std::time::Duration;

use serde_json::json;
use support::rpc_proxy::ChainProcess;
use support::{Db, Env};
use tokio::io::AsyncWriteExt;

both_databases!(
    short_jwt_secret_is_refused_and_files_are_private,
    concurrent_wrong_passwords_cannot_outrun_the_throttle,
    hung_up_logins_start_no_extra_hashes,
    forwarded_for_only_from_trusted_proxies_and_ipv6_by_64,
    non_object_bodies_and_registration_quota_order,
    admin_token_guessing_is_throttled_and_short_tokens_refused,
    livez_and_healthz_name_what_failed,
);

/// Seconds of CPU (user + system) the process has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name; utime and stime are
    // fields 14 and 15 of the whole line.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

async fn short_jwt_secret_is_refused_and_files_are_private(db: Db) {
    let env = Env::new(db).await;
    let (status, stderr) = env.run_to_exit(&["--jwt-secret", "too-short-secret"]).await;
    assert!(!status.success(), "a 16-byte secret must be refused");
    assert!(stderr.contains("jwt-secret"), "names the secret: {stderr}");
    assert!(
        !stderr.contains("too-short-secret"),
        "never prints it: {stderr}"
    );
    // A short generated-file secret is refused too.
    std::fs::write(env.data_dir.join("jwt-secret"), "00112233").unwrap();
    let (status, stderr) = env.run_to_exit(&[]).await;
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("jwt-secret"), "{stderr}");
    std::fs::remove_file(env.data_dir.join("jwt-secret")).unwrap();
    // A fresh data directory is created private, and so are its secrets.
    let fresh = env.data_dir.join("fresh");
    let fresh_arg = fresh.display().to_string();
    let db_url = match db {
        Db::Sqlite => format!("sqlite://{}", fresh.join("potluck.db").display()),
        Db::Postgres => env.database_url(),
    };
    let log = env.data_dir.join("fresh.log");
    let args = [
        "--bind",
        "127.0.0.1:0",
        "--data-dir",
        &fresh_arg,
        "--database-url",
        &db_url,
        "--argon2-memory-kib",
        "64",
        "--argon2-iterations",
        "1",
    ];
    let mut child = support::serve(&args, &[], &log).await.child;
    assert_eq!(mode(&fresh), 0o700, "data directory");
    assert_eq!(mode(&fresh.join("jwt-secret")) & 0o077, 0, "jwt-secret");
    assert_eq!(mode(&fresh.join("wallet.mnemonic")) & 0o077, 0, "seed");
    if db == Db::Sqlite {
        assert_eq!(mode(&fresh.join("potluck.db")) & 0o077, 0, "db");
    }
    let secret = std::fs::read_to_string(fresh.join("jwt-secret")).unwrap();
    child.kill().await.unwrap();
    // Loosened permissions are reported at the next start.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        fresh.join("jwt-secret"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let mut child = support::serve(&args, &[], &log).await.child;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("permission") && text.contains("jwt-secret"),
        "reported: {text}"
    );
    assert!(!text.contains(secret.trim()), "the secret is never logged");
    child.kill().await.unwrap();
    // The admin token given in the environment is not shown by --help.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_potluck"))
        .args(["serve", "--help"])
        .env("POTLUCK_ADMIN_TOKEN", "sekrit-admin-token-value")
        .env(
            "POTLUCK_DATABASE_URL",
            "postgres://u:sekrit-db-password@h/db",
        )
        .output()
        .await
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(!help.contains("sekrit"), "{help}");
    // A database URL in an error hides its password.
    let (status, stderr) = env
        .run_to_exit(&[
            "--database-url",
            "postgres://alice:hunter2-db-pass@127.0.0.1:1/nope",
        ])
        .await;
    assert!(!status.success());
    assert!(!stderr.contains("hunter2-db-pass"), "{stderr}");
}

/// Fires `n` logins at once, each from `ip(i)` for `name(i)`; returns the count per status.
async fn login_storm(
    addr: std::net::SocketAddr,
    n: u32,
    name: impl Fn(u32) -> String,
    ip: impl Fn(u32) -> String,
) -> std::collections::BTreeMap<u16, u32> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let (name, ip) = (name(i), ip(i));
        tasks.spawn(async move {
            support::request(
                addr,
                "POST",
                "/auth/login",
                &[("x-forwarded-for", &ip)],
                Some(
                    json!({"username": name, "password": "wrong-password"})
                        .to_string()
                        .into_bytes(),
                ),
            )
            .await
            .status
        });
    }
    let mut statuses = std::collections::BTreeMap::new();
    while let Some(st) = tasks.join_next().await {
        *statuses.entry(st.unwrap()).or_default() += 1;
    }
    statuses
}

async fn concurrent_wrong_passwords_cannot_outrun_the_throttle(db: Db) {
    let env = Env::new(db).await;
    // Hashes slow enough that all 60 requests arrive before the first fails.
    let s = support::spawn_app_with(&env, |c| {
        c.hash_params = support::argon2(8192, 2);
        c.hashing_concurrency = 2;
    })
    .await;
    s.register("target", "correct-password", "192.0.2.1").await;
    let per_user = login_storm(
        s.addr,
        60,
        |_| "target".into(),
        |i| format!("10.9.{}.{}", i / 200, i % 200 + 1),
    )
    .await;
    let rejected = per_user.get(&401).copied().unwrap_or(0);
    assert_eq!(rejected + per_user.get(&429).copied().unwrap_or(0), 60);
    assert!(
        rejected <= 5 + 2,
        "free failures plus hashing concurrency: {per_user:?}"
    );
    let per_ip = login_storm(
        s.addr,
        60,
        |i| format!("nobody{i}"),
        |_| "198.51.100.77".into(),
    )
    .await;
    let rejected = per_ip.get(&401).copied().unwrap_or(0);
    assert_eq!(rejected + per_ip.get(&429).copied().unwrap_or(0), 60);
    assert!(
        rejected <= 20 + 2,
        "free failures plus hashing concurrency: {per_ip:?}"
    );
    s.stop().await;
}

async fn hung_up_logins_start_no_extra_hashes(db: Db) {
    let env = Env::new(db).await;
    let s = env
        .start_raw(&[
            "--admin-token",
            support::ADMIN,
            "--argon2-memory-kib",
            "8192",
            "--argon2-iterations",
            "4",
            "--hashing-concurrency",
            "1",
        ])
        .await;
    let pid = s.child.id().unwrap();
    s.register("hasher", "correct-password", "192.0.2.1").await;
    // The CPU one hash costs, measured on a login that completes.
    let before = cpu_seconds(pid);
    assert_eq!(
        s.login("hasher", "correct-password", "192.0.2.2")
            .await
            .status,
        200
    );
    let one = (cpu_seconds(pid) - before).max(0.01);
    // Twelve logins from different users and IPs, each abandoned at once.
    let before = cpu_seconds(pid);
    for i in 0..12 {
        let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        let body = json!({"username": format!("ghost{i}"), "password": "whatever1"}).to_string();
        let req = format!(
            "POST /auth/login HTTP/1.1\r\nhost: t\r\nx-forwarded-for: 10.1.1.{i}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        c.write_all(req.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(c);
    }
    let mut max_running = 0.0f64;
    for _ in 0..20 {
        max_running = max_running.max(s.metric("potluck_password_hashes_in_flight").await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let whatever was started finish.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let spent = cpu_seconds(pid) - before;
    assert!(max_running <= 1.0, "gauge {max_running}");
    assert!(
        spent < one * 5.0,
        "abandoned logins cost {spent:.2}s of CPU, one hash {one:.2}s: more hashes ran than the limit allows"
    );
    s.stop().await;
}

async fn forwarded_for_only_from_trusted_proxies_and_ipv6_by_64(db: Db) {
    let env = Env::new(db).await;
    // The test connects from 127.0.0.1, which is not in 10.0.0.0/8: the
    // header is the client's own claim and must be ignored.
    let s = env.start(&["--trusted-proxies", "10.0.0.0/8"]).await;
    for i in 0..5 {
        let r = s
            .register(
                &format!("spoof{i}"),
                "password123",
                &format!("203.0.113.{i}"),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let r = s.register("spoof5", "password123", "203.0.113.99").await;
    assert_eq!(r.status, 429, "rotating X-Forwarded-For is ignored");
    s.stop().await;
    // Loopback is trusted by default; IPv6 clients share a quota per /64.
    let s = env.start(&[]).await;
    for i in 0..5 {
        let r = s
            .register(
                &format!("six{i}"),
                "password123",
                &format!("2001:db8:1:2::{:x}", i + 1),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let r = s
        .register("six5", "password123", "2001:db8:1:2:ffff::1")
        .await;
    assert_eq!(r.status, 429, "same /64");
    let r = s.register("six6", "password123", "2001:db8:1:3::1").await;
    assert_eq!(r.status, 201, "another /64");
    s.stop().await;
    // Bound beyond loopback with no proxy configured: a warning.
    let dir = env.data_dir.display().to_string();
    let url = env.database_url();
    let log = env.data_dir.join("public.log");
    let mut child = support::serve(
        &[
            "--bind",
            "0.0.0.0:0",
            "--data-dir",
            &dir,
            "--database-url",
            &url,
            "--trusted-proxies",
            "",
        ],
        &[],
        &log,
    )
    .await
    .child;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("no trusted proxy"), "{text}");
    child.kill().await.unwrap();
}

async fn non_object_bodies_and_registration_quota_order(db: Db) {
    let env = Env::new(db).await;
    let s = support::spawn_app(&env).await;
    for body in [
        r#"["arrayname","password123"]"#,
        r#""string""#,
        "42",
        "null",
    ] {
        let r = support::request(
            s.addr,
            "POST",
            "/auth/register",
            &[("x-forwarded-for", "192.0.2.9")],
            Some(body.as_bytes().to_vec()),
        )
        .await;
        assert!(
            (400..500).contains(&r.status),
            "{body}: {} {}",
            r.status,
            r.text()
        );
        assert_eq!(r.code(), "invalid_body", "{body}");
    }
    // Over the quota, a taken name and a free name answer the same.
    let ip = "198.51.100.30";
    assert_eq!(
        s.register("existing", "password123", "192.0.2.10")
            .await
            .status,
        201
    );
    for i in 0..5 {
        assert_eq!(
            s.register(&format!("quota{i}"), "password123", ip)
                .await
                .status,
            201
        );
    }
    let taken = s.register("existing", "password123", ip).await;
    let free = s.register("neverseen", "password123", ip).await;
    assert_eq!(
        (taken.status, taken.code()),
        (429, "registration_quota_exceeded".into())
    );
    assert_eq!(
        (free.status, free.code()),
        (429, "registration_quota_exceeded".into())
    );
    s.stop().await;
    // Quota 0 closes registration cleanly.
    let s = support::spawn_app_with(&env, |c| c.quota.limit = 0).await;
    let r = s.register("closed", "password123", "192.0.2.11").await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.code(), "registration_closed");
    assert_eq!(s.get("/livez", &[]).await.status, 200, "still alive");
    s.stop().await;
}

async fn admin_token_guessing_is_throttled_and_short_tokens_refused(db: Db) {
    let env = Env::new(db).await;
    let (status, stderr) = env.run_to_exit(&["--admin-token", "short-token"]).await;
    assert!(!status.success(), "an 11-character admin token is refused");
    assert!(stderr.contains("admin-token"), "{stderr}");
    assert!(!stderr.contains("short-token"), "{stderr}");
    let s = support::spawn_app(&env).await;
    let mut statuses = Vec::new();
    for i in 0..30 {
        let r = s
            .get(
                "/admin/config",
                &[
                    ("x-admin-token", &format!("guess-{i}-xxxxxxxx")),
                    ("x-forwarded-for", "203.0.113.66"),
                ],
            )
            .await;
        statuses.push(r.status);
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    assert!(
        statuses.iter().filter(|s| **s == 401 || **s == 403).count() <= 21,
        "{statuses:?}"
    );
    // The right token from that IP waits too; another IP is served.
    let r = s
        .get(
            "/admin/config",
            &[
                ("x-admin-token", support::ADMIN),
                ("x-forwarded-for", "203.0.113.66"),
            ],
        )
        .await;
    assert_eq!(r.status, 429);
    let r = s
        .get(
            "/admin/config",
            &[
                ("x-admin-token", support::ADMIN),
                ("x-forwarded-for", "203.0.113.67"),
            ],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    s.stop().await;
}

async fn livez_and_healthz_name_what_failed(db: Db) {
    let env = Env::new(db).await;
    let s = support::spawn_app(&env).await;
    assert_eq!(s.get("/livez", &[]).await.status, 200);
    let r = s.get("/healthz", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["database"], "ok");
    assert_eq!(r.json()["chain"], "ok");
    s.stop().await;
    // A separate chain process that goes away: the chain check fails,
    // liveness holds.
    let mut node = ChainProcess::start(env.data_dir.join("node")).await;
    let (url, cookie) = (format!("http://{}/", node.addr), node.cookie());
    let s = support::spawn_app_with(&env, |c| {
        c.chain = potluck_rounds::ChainSource::Bitcoind {
            url,
            auth: chain::Auth::Cookie(cookie.into()),
        };
    })
    .await;
    let r = s.get("/healthz", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    node.kill().await;
    assert_eq!(s.get("/livez", &[]).await.status, 200);
    let r = s.get("/healthz", &[]).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["database"], "ok", "{}", r.text());
    assert_ne!(r.json()["chain"], "ok", "{}", r.text());
    s.stop().await;
}

/// Point 5 (no storage involved, so SQLite only): half-sent headers are
/// dropped after the header time-out, a crowd of idle connections beyond
/// the connection cap does not keep a new request out for long, and a
/// graceful shutdown ends within its deadline even with a stream open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_connections_cannot_hold_the_server() {
    use tokio::io::AsyncReadExt;
    let env = Env::new(Db::Sqlite).await;
    let s = env
        .start(&[
            "--header-read-timeout-secs",
            "1",
            "--idle-timeout-secs",
            "2",
            "--max-connections",
            "64",
            "--shutdown-grace-secs",
            "2",
        ])
        .await;
    // Half a request header, then silence: closed after about a second.
    let mut half = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    half.write_all(b"GET /livez HTTP/1.1\r\nhost: t\r\nx-slow: ")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), half.read_to_end(&mut buf)).await;
    assert!(closed.is_ok(), "a half header holds the connection open");
    // A thousand idle connections, far beyond the cap of 64.
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(tokio::net::TcpStream::connect(s.addr).await.unwrap());
    }
    let started = std::time::Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(15),
        support::request(s.addr, "GET", "/livez", &[], None),
    )
    .await
    .expect("a new request is served despite the idle crowd");
    assert_eq!(r.status, 200);
    assert!(started.elapsed() < Duration::from_secs(15));
    drop(idle);
    // Graceful shutdown with a stream that never ends by itself.
    let stream = support::EventStream::open(s.addr, "192.0.2.200").await;
    let pid = s.child.id().unwrap();
    let t0 = std::time::Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut s = s;
    let exited = tokio::time::timeout(Duration::from_secs(10), s.child.wait()).await;
    assert!(exited.is_ok(), "shutdown exceeded its deadline");
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    drop(stream);
}
