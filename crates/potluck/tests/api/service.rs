//! Black-box: start-up rules (schema upgrade refusal, OWASP defaults), the OpenAPI document, and operational endpoints.

use crate::support;

use serde_json::json;
use support::{Db, Env};

both_databases!(
    case_collisions_stop_the_start,
    openapi_documents_every_route,
    operational_endpoints,
    hashing_does_not_stall_other_requests,
);

async fn case_collisions_stop_the_start(db: Db) {
    let env = Env::new(db).await;
    let store = potluck_rounds::store::Store::connect(&env.database_url(), 1)
        .await
        .unwrap();
    store.migrate_to(1).await.unwrap();
    for (i, name) in ["Bob", "bob", "alice"].iter().enumerate() {
        sqlx::query("INSERT INTO users (username, password_hash, derivation_index, address, created_at) VALUES ($1, 'x', $2, 'a', 0)")
            .bind(*name)
            .bind(i as i64)
            .execute(store.pool())
            .await
            .unwrap();
    }
    store.close().await;
    let (status, stderr) = env.run_to_exit(&[]).await;
    assert!(!status.success(), "the service must not start");
    assert!(
        stderr.contains("Bob") && stderr.contains("bob"),
        "names the collisions: {stderr}"
    );
    let pool = env.pool().await;
    let names: Vec<String> = sqlx::query_scalar("SELECT username FROM users ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(names, ["Bob", "bob", "alice"], "nothing merged or renamed");
    pool.close().await;
}

/// Every part-1 route of DESIGN.md §4.
const ROUTES: &[(&str, &str)] = &[
    ("post", "/auth/register"),
    ("post", "/auth/login"),
    ("get", "/users/me"),
    ("post", "/users/me/change-password"),
    ("get", "/rounds/current"),
    ("get", "/rounds/stream"),
    ("get", "/admin/config"),
    ("put", "/admin/config"),
    ("post", "/admin/pause"),
    ("post", "/admin/resume"),
    ("post", "/admin/users/{username}/reset-password"),
    ("get", "/admin/audit"),
    ("get", "/livez"),
    ("get", "/healthz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
    ("post", "/rounds/current/bets"),
    ("get", "/rounds"),
    ("get", "/rounds/{id}"),
    ("get", "/users/me/transactions"),
    ("post", "/users/me/withdrawals"),
    ("get", "/users/me/deposit-qr.svg"),
    ("get", "/users/me/last-round-result"),
    ("post", "/dev/faucet"),
    ("post", "/admin/rounds/{id}/retry-payout"),
    ("get", "/admin/ledger"),
    ("get", "/admin/transfers/waiting"),
    ("post", "/admin/transfers/{id}/bump"),
];

async fn openapi_documents_every_route(db: Db) {
    let env = Env::new(db).await;
    let s = support::spawn_app(&env).await;
    let doc = s.get("/openapi.json", &[]).await.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for (method, path) in ROUTES {
        assert!(
            paths.get(*path).and_then(|p| p.get(*method)).is_some(),
            "{method} {path} missing from /openapi.json"
        );
    }
    // And every documented operation is really served (not the 404 fallback, not 405).
    let mut count = 0;
    for (path, ops) in paths {
        for method in ops.as_object().unwrap().keys() {
            if path == "/rounds/stream" {
                continue; // long-lived; covered by the stream tests
            }
            let concrete = path.replace("{username}", "someone").replace("{id}", "1");
            let body = if method == "get" {
                None
            } else {
                Some(b"{}".to_vec())
            };
            let r = support::request(s.addr, &method.to_uppercase(), &concrete, &[], body).await;
            assert_ne!(r.status, 405, "{method} {path}");
            if r.status == 404 {
                assert_ne!(
                    r.text(),
                    json!({"detail": {"code": "not_found", "message": "not found", "params": {}}})
                        .to_string(),
                    "{method} {path} is not routed"
                );
            }
            count += 1;
        }
    }
    assert_eq!(
        count + 1,
        ROUTES.len(),
        "no undocumented extras and none missing"
    );
    s.stop().await;
}

async fn operational_endpoints(db: Db) {
    let env = Env::new(db).await;
    let s = support::spawn_app_with(&env, |c| c.body_limit_bytes = 1024).await;
    let r = s.get("/healthz", &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (
            200,
            json!({"status": "ok", "database": "ok", "chain": "ok"})
        )
    );
    assert!(
        r.header("x-request-id").is_some_and(|v| !v.is_empty()),
        "request ids are assigned"
    );
    let r = s.get("/healthz", &[("x-request-id", "abc-123")]).await;
    assert_eq!(r.header("x-request-id"), Some("abc-123"), "and propagated");
    // Ids that would flood or forge log lines are replaced by a fresh one.
    let long = "a".repeat(65);
    for bad in [long.as_str(), "two words"] {
        let r = s.get("/healthz", &[("x-request-id", bad)]).await;
        let id = r.header("x-request-id").unwrap_or_default();
        assert!(
            id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{bad:?} was replaced by a fresh id, got {id:?}"
        );
    }
    let r = s.get("/no/such/path", &[]).await;
    assert!(
        r.header("x-request-id").is_some(),
        "unmatched routes get an id too"
    );
    let r = s.get("/no/such/path", &[]).await;
    assert_eq!((r.status, r.code()), (404, "not_found".into()));
    let big = json!({"username": "x".repeat(4000), "password": "password123"})
        .to_string()
        .into_bytes();
    let r = support::request(s.addr, "POST", "/auth/register", &[], Some(big)).await;
    assert_eq!(r.status, 413, "body size limit");
    let metrics = s.get("/metrics", &[]).await;
    assert!(metrics
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));
    assert!(
        metrics.text().contains(
            "potluck_http_requests_total{method=\"GET\",route=\"/healthz\",status=\"200\"} 4"
        ),
        "{}",
        metrics.text()
    );
    assert!(metrics
        .text()
        .contains("potluck_http_request_duration_seconds_bucket"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defaults_hash_with_owasp_parameters() {
    // No Argon2 flags: the production defaults are in force.
    let env = Env::new(Db::Sqlite).await;
    let s = env.start_raw(&[]).await;
    assert_eq!(
        s.register("owasp", "password123", "10.0.0.1").await.status,
        201
    );
    let pool = env.pool().await;
    let hash: String =
        sqlx::query_scalar("SELECT password_hash FROM users WHERE username = 'owasp'")
            .fetch_one(&pool)
            .await
            .unwrap();
    pool.close().await;
    assert!(
        hash.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
        "{hash}"
    );
    assert_eq!(
        s.login("owasp", "password123", "10.0.0.1").await.status,
        200
    );
    s.stop().await;
}

async fn hashing_does_not_stall_other_requests(db: Db) {
    const USERS: u32 = 5;
    let env = Env::new(db).await;
    let s = support::spawn_app_with(&env, |c| {
        c.hash_params = support::argon2(8192, 2);
        c.hashing_concurrency = 1;
    })
    .await;
    // Five users: at most five logins of one user are in flight at once (the throttle
    // counts attempts in flight, issue 16), so with one user only five of the flood hashed,
    // and on a loaded CI machine they were done before the reads below were (the check
    // that the flood was still hashing failed once).
    for u in 0..USERS {
        assert_eq!(
            s.register(&format!("hasher{u}"), "password123", &format!("10.0.0.{u}"))
                .await
                .status,
            201
        );
    }
    // A queue of logins, each a full Argon2 verification behind one permit.
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..24 {
        let addr = s.addr;
        flood.spawn(async move {
            let username = format!("hasher{}", i % USERS);
            let body = json!({"username": username, "password": "password123"})
                .to_string()
                .into_bytes();
            support::request(
                addr,
                "POST",
                "/auth/login",
                &[("x-forwarded-for", &format!("10.1.0.{i}"))],
                Some(body),
            )
            .await
            .status
        });
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let mut slowest = std::time::Duration::ZERO;
    for _ in 0..20 {
        let t = std::time::Instant::now();
        assert_eq!(s.get("/rounds/current", &[]).await.status, 200);
        assert_eq!(s.admin_get("/admin/config").await.status, 200);
        slowest = slowest.max(t.elapsed());
    }
    assert!(
        s.metric("potluck_password_hashes_in_flight").await >= 1.0,
        "the flood was still hashing"
    );
    assert!(
        slowest < std::time::Duration::from_millis(500),
        "reads waited on hashing: {slowest:?}"
    );
    // Every login hashed (at most five per user, the throttle's limit); any told to retry
    // would be a 429.
    let mut ok = 0;
    while let Some(st) = flood.join_next().await {
        let st = st.unwrap();
        assert!(st == 200 || st == 429, "{st}");
        ok += usize::from(st == 200);
    }
    assert_eq!(ok, 24, "{ok} logins succeeded");
    s.stop().await;
}

/// A database whose users' addresses the wallet seed does not derive (the
/// data directory was recreated while PostgreSQL kept the accounts) stops
/// the start instead of silently creating a new seed; the right seed starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_that_did_not_make_the_stored_addresses_stops_the_start() {
    let env = Env::new(Db::Postgres).await;
    let server = env.start(&[]).await;
    server.user("ursula", "10.0.40.1").await;
    server.stop().await;
    let seed_file = env.data_dir.join("wallet.mnemonic");
    let seed = std::fs::read(&seed_file).unwrap();
    std::fs::remove_file(&seed_file).unwrap();

    let (status, stderr) = env.run_to_exit(&[]).await;
    assert!(!status.success(), "the service must not start: {stderr}");
    assert!(
        stderr.contains("does not derive the stored address of user ursula"),
        "says why: {stderr}"
    );

    std::fs::write(&seed_file, &seed).unwrap();
    let server = env.start(&[]).await;
    let r = server.login("ursula", "password123", "10.0.40.1").await;
    assert_eq!(r.status, 200, "the restored seed starts: {}", r.text());
    server.stop().await;
}

/// Logs written to a file (not a terminal) carry no ANSI colour escapes,
/// and `--log-format json` writes one JSON object per line for shippers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_to_a_file_are_plain_text_or_json() {
    let env = Env::new(Db::Sqlite).await;
    let s = env.start(&[]).await;
    assert_eq!(s.get("/healthz", &[]).await.status, 200);
    let log = s.log.clone();
    s.stop().await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("listening") || text.contains("INFO"),
        "{text}"
    );
    assert!(
        !text.contains('\u{1b}'),
        "ANSI escapes in a log file: {text:?}"
    );

    let s = env.start(&["--log-format", "json"]).await;
    assert_eq!(s.get("/healthz", &[]).await.status, 200);
    let log = s.log.clone();
    s.stop().await;
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    for line in lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: not JSON: {line}"));
        assert!(
            v.get("level").is_some() && v.get("fields").is_some(),
            "{line}"
        );
    }
}

/// The service built in the test process answers on the port it bound (0):
/// the fast path for HTTP tests that need no binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_runs_in_process_on_port_zero() {
    let env = Env::new(Db::Sqlite).await;
    let app = support::spawn_app(&env).await;
    assert_ne!(app.addr.port(), 0);
    let r = app.get("/healthz", &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (
            200,
            json!({"status": "ok", "database": "ok", "chain": "ok"})
        )
    );
    let r = app.get("/rounds/current", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "open");
    app.stop().await;
}

/// A supervisor may send SIGTERM the moment the start-up line appears. The
/// handler must already be installed then, or the signal's default action
/// kills the process without its graceful shutdown (CI once saw
/// `graceful_shutdown_closes_streams` fail this way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_right_after_the_start_up_line_is_a_graceful_stop() {
    let env = Env::new(Db::Sqlite).await;
    for attempt in 0..10 {
        let mut s = env.start(&[]).await;
        let pid = s.child.id().unwrap();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let status = tokio::time::timeout(std::time::Duration::from_secs(30), s.child.wait())
            .await
            .expect("the server exits after SIGTERM")
            .unwrap();
        assert!(
            status.success(),
            "attempt {attempt}: {status:?}\n{}",
            s.log()
        );
    }
}

/// The same for `potluck chain` and `potluck node` (a node left without its
/// shutdown keeps no promise about its last packet's durability).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chain_and_node_stop_gracefully_on_an_immediate_sigterm() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let chain_dir = dir.path().join("chain");
    let node_dir = dir.path().join("node");
    let (chain_dir, node_dir) = (chain_dir.to_str().unwrap(), node_dir.to_str().unwrap());
    let commands: [&[&str]; 2] = [
        &[
            "chain",
            "--rpc-bind",
            "127.0.0.1:0",
            "--data-dir",
            chain_dir,
        ],
        &[
            "node",
            "--listen",
            "127.0.0.1:0",
            "--rpc-bind",
            "127.0.0.1:0",
            "--data-dir",
            node_dir,
        ],
    ];
    for args in commands {
        for attempt in 0..5 {
            let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_potluck"))
                .args(args)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            // Kept open: a closed pipe would fail the process's next print.
            let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            assert!(line.starts_with("potluck "), "{args:?}: {line}");
            let sent = std::process::Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()
                .unwrap();
            assert!(sent.success());
            let status = child.wait().unwrap();
            assert!(status.success(), "{args:?} attempt {attempt}: {status:?}");
        }
    }
}
