//! Black-box test support for the serve tests: starts the real `potluck serve` binary on port 0 (it reports the ports it got) against a fresh SQLite or PostgreSQL database, or the service in this process (`spawn_app`) for fast HTTP tests, and a minimal HTTP/1.1 client.

#![allow(dead_code)]

pub mod channels;
pub mod chaos;
pub mod peer;
pub mod rig;
pub mod rpc_proxy;
pub mod wait;

// Each test crate uses a part of these.
#[allow(unused_imports)]
pub use wait::{wait_for, wait_for_blocking, wait_for_every};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// Which database a server runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
}

pub const ADMIN: &str = "test-admin-token";

fn pg_base() -> String {
    std::env::var("POTLUCK_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn pg_url(name: &str) -> String {
    let base = pg_base();
    format!("{}/{name}", &base[..base.rfind('/').unwrap()])
}

async fn pg_exec(sql: &str) {
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(&pg_base())
        .await
        .unwrap();
    sqlx::raw_sql(sql).execute(&pool).await.unwrap();
    pool.close().await;
}

/// A fresh database and data directory, not yet used by a server; both are
/// removed when it is dropped, however the test ended.
pub struct Env {
    pub db: Db,
    pub data_dir: PathBuf,
    pub pg_name: Option<String>,
    /// Whether dropping it drops the PostgreSQL database (not for a second
    /// process's directory on another environment's database, [`Env::beside`]).
    owns_database: bool,
}

impl Env {
    pub async fn new(db: Db) -> Self {
        let unique = format!("potluck_bb_{:016x}", rand::random::<u64>());
        let data_dir = std::env::temp_dir().join(&unique);
        std::fs::create_dir_all(&data_dir).unwrap();
        let pg_name = if db == Db::Postgres {
            pg_exec(&format!("CREATE DATABASE {unique}")).await;
            Some(unique)
        } else {
            None
        };
        Self {
            db,
            data_dir,
            pg_name,
            owns_database: true,
        }
    }

    /// A second process's data directory, `data_dir` (created), on this
    /// environment's database; dropping it removes only that directory.
    pub fn beside(&self, data_dir: PathBuf) -> Env {
        std::fs::create_dir_all(&data_dir).unwrap();
        Env {
            db: self.db,
            data_dir,
            pg_name: self.pg_name.clone(),
            owns_database: false,
        }
    }

    pub fn database_url(&self) -> String {
        match &self.pg_name {
            Some(n) => pg_url(n),
            None => format!("sqlite://{}", self.data_dir.join("potluck.db").display()),
        }
    }

    /// A pool on the service's database, for reaching around the API.
    pub async fn pool(&self) -> sqlx::AnyPool {
        sqlx::any::install_default_drivers();
        let url = match self.db {
            Db::Sqlite => format!("{}?mode=rwc", self.database_url()),
            Db::Postgres => self.database_url(),
        };
        sqlx::any::AnyPoolOptions::new()
            .max_connections(2)
            .connect(&url)
            .await
            .unwrap()
    }

    fn base_args(&self) -> Vec<String> {
        vec![
            "--bind".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            self.data_dir.display().to_string(),
            "--database-url".into(),
            self.database_url(),
        ]
    }

    /// Runs the binary to completion (for start-up failures).
    pub async fn run_to_exit(&self, extra: &[&str]) -> (std::process::ExitStatus, String) {
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            Command::new(env!("CARGO_BIN_EXE_potluck"))
                .arg("serve")
                .args(self.base_args())
                .args(extra)
                .env_remove("RUST_LOG")
                .stdin(Stdio::null())
                .output(),
        )
        .await
        .expect("binary exits")
        .unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Starts the server with cheap Argon2 parameters (tests only; production
    /// defaults are OWASP, proven by `defaults_hash_with_owasp_parameters`).
    pub async fn start(&self, extra: &[&str]) -> Server {
        self.start_with(extra, &[]).await
    }

    /// [`Env::start`] with extra environment variables.
    pub async fn start_with(&self, extra: &[&str], envs: &[(&str, &str)]) -> Server {
        let mut args = vec![
            "--argon2-memory-kib",
            "64",
            "--argon2-iterations",
            "1",
            "--admin-token",
            ADMIN,
        ];
        args.extend_from_slice(extra);
        self.start_env(&args, envs).await
    }

    /// [`Env::start_with`] on the embedded development chain without timed
    /// blocks, its RPC bound to `rpc_bind` (port 0: the OS's choice, in
    /// [`Server::rpc_addr`]).
    pub async fn start_dev_chain(
        &self,
        rpc_bind: &str,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Server {
        let mut args = vec![
            "--dev-block-interval",
            "0",
            "--dev-chain-rpc-bind",
            rpc_bind,
        ];
        args.extend_from_slice(extra);
        self.start_with(&args, envs).await
    }

    /// Starts the server with exactly `extra` beyond bind/data-dir/database.
    pub async fn start_raw(&self, extra: &[&str]) -> Server {
        self.start_env(extra, &[]).await
    }

    /// [`Env::start_raw`] with extra environment variables.
    pub async fn start_env(&self, extra: &[&str], envs: &[(&str, &str)]) -> Server {
        let log = self
            .data_dir
            .join(format!("server-{:08x}.log", rand::random::<u32>()));
        let base = self.base_args();
        let mut args: Vec<&str> = base.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        serve(&args, envs, &log).await
    }
}

impl Drop for Env {
    /// Removes the test's database (PostgreSQL) and data directory however
    /// the test ended, a failed assertion included, as `TestDb` does for the
    /// store tests in crates/rounds.
    fn drop(&mut self) {
        if let Some(name) = self.pg_name.take().filter(|_| self.owns_database) {
            // Drop cannot await: a thread with a runtime of its own does,
            // joined, so the database is gone when the test ends.
            let dropped = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(async {
                    sqlx::any::install_default_drivers();
                    let admin = sqlx::any::AnyPoolOptions::new()
                        .max_connections(1)
                        .connect(&pg_base())
                        .await
                        .map_err(|e| e.to_string())?;
                    sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&admin)
                        .await
                        .map_err(|e| e.to_string())?;
                    admin.close().await;
                    Ok::<_, String>(())
                })
            })
            .join();
            if !matches!(dropped, Ok(Ok(()))) {
                eprintln!("the test database was not dropped: {dropped:?}");
            }
        }
        match std::fs::remove_dir_all(&self.data_dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                eprintln!("{} was not removed: {e}", self.data_dir.display());
            }
            _ => {}
        }
    }
}

/// Starts `potluck serve` with exactly `args` and `envs`, its log (stderr)
/// in `log`; returns once it printed its address (and, with
/// `--dev-chain-rpc-bind`, its chain's RPC address).
pub async fn serve(args: &[&str], envs: &[(&str, &str)], log: &std::path::Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_potluck"))
        .arg("serve")
        .args(args)
        .env("POTLUCK_LOG", "info")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("server printed its address")
        .unwrap()
        .unwrap_or_else(|| {
            panic!(
                "server exited: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        });
    let addr: SocketAddr = line
        .rsplit("http://")
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // With the development chain's RPC enabled, its bound address (port 0
    // is the OS's choice) is the second line.
    let rpc_addr = if args.contains(&"--dev-chain-rpc-bind") {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("server printed its chain RPC address")
            .unwrap()
            .unwrap_or_default();
        line.rsplit("http://")
            .next()
            .and_then(|a| a.trim().parse().ok())
    } else {
        None
    };
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Server {
        child,
        api: Api { addr },
        rpc_addr,
        log: log.to_path_buf(),
    }
}

/// The service running inside the test process (no binary), on port 0; its
/// HTTP helpers are those of [`Api`].
pub struct InProcess {
    api: Api,
    /// Its development chain.
    pub dev_chain: Option<chain::DevChain>,
    /// The development chain's RPC address, when configured with `rpc_bind`.
    pub rpc_addr: Option<SocketAddr>,
    /// Its store, for reaching around the API.
    pub store: potluck_rounds::store::Store,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl std::ops::Deref for InProcess {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl InProcess {
    /// Shuts the service down gracefully and waits for it.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

/// Argon2id parameters with `memory_kib` and `iterations` on one lane (the
/// flags' default parallelism).
pub fn argon2(memory_kib: u32, iterations: u32) -> potluck_rounds::security::password::HashParams {
    potluck_rounds::security::password::HashParams {
        memory_kib,
        iterations,
        parallelism: 1,
    }
}

/// Sets `config`'s chain to the development chain without timed blocks, its
/// RPC on port 0 (the address it got is [`InProcess::rpc_addr`]).
pub fn with_chain_rpc(config: &mut potluck_rounds::Config) {
    config.chain = potluck_rounds::ChainSource::Dev {
        block_interval: None,
        rpc_bind: Some("127.0.0.1:0".parse().unwrap()),
    };
}

/// Builds the service in this process with `env`'s data directory and
/// database, cheap Argon2 and the development chain without timed blocks,
/// bound to port 0: for HTTP tests that need no separate process.
pub async fn spawn_app(env: &Env) -> InProcess {
    spawn_app_with(env, |_| {}).await
}

/// [`spawn_app`] with `configure` applied to the config first.
pub async fn spawn_app_with(
    env: &Env,
    configure: impl FnOnce(&mut potluck_rounds::Config),
) -> InProcess {
    let mut config = potluck_rounds::Config::new(env.data_dir.clone());
    config.bind = "127.0.0.1:0".parse().unwrap();
    config.database_url = Some(env.database_url().into());
    config.admin_token = Some(ADMIN.into());
    config.hash_params = argon2(64, 1);
    config.chain = potluck_rounds::ChainSource::Dev {
        block_interval: None,
        rpc_bind: None,
    };
    configure(&mut config);
    // A service stopped in this process just before (a restart on the same
    // data directory) lets go of its chain's lock only when its last aborted
    // task is dropped, which the runtime does a moment later.
    let app = wait_for("the chain's lock", Duration::from_secs(10), || {
        let config = config.clone();
        async move {
            match potluck_rounds::Application::build(config).await {
                Ok(app) => Some(app),
                Err(e) if format!("{e:?}").contains("Locked") => None,
                Err(e) => panic!("the service does not start: {e:?}"),
            }
        }
    })
    .await;
    let addr = app.local_addr();
    let dev_chain = app.state().dev_chain.clone();
    let rpc_addr = app.dev_chain_rpc_addr();
    let store = app.store().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(app.run_until_stopped(async move {
        let _ = stopped.await;
    }));
    InProcess {
        api: Api { addr },
        dev_chain,
        rpc_addr,
        store,
        stop: Some(stop),
        task,
    }
}

/// A running server process; its HTTP helpers are those of [`Api`].
pub struct Server {
    pub child: Child,
    api: Api,
    pub log: PathBuf,
    /// The development chain's RPC address, when started with `--dev-chain-rpc-bind`.
    pub rpc_addr: Option<SocketAddr>,
}

impl std::ops::Deref for Server {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Server {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// The service's HTTP API at an address: the one set of request helpers of
/// both the started binary ([`Server`]) and the in-process service
/// ([`InProcess`]), which deref to it, so a test helper taking `&Api` serves
/// either.
#[derive(Debug, Clone, Copy)]
pub struct Api {
    /// The bound address.
    pub addr: SocketAddr,
}

impl Api {
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Resp {
        request(self.addr, "GET", path, headers, None).await
    }

    pub async fn post(&self, path: &str, headers: &[(&str, &str)], body: Value) -> Resp {
        request(
            self.addr,
            "POST",
            path,
            headers,
            Some(body.to_string().into_bytes()),
        )
        .await
    }

    pub async fn put(&self, path: &str, headers: &[(&str, &str)], body: Value) -> Resp {
        request(
            self.addr,
            "PUT",
            path,
            headers,
            Some(body.to_string().into_bytes()),
        )
        .await
    }

    /// Registers from `ip`; returns the response.
    pub async fn register(&self, name: &str, password: &str, ip: &str) -> Resp {
        self.post(
            "/auth/register",
            &[("x-forwarded-for", ip)],
            serde_json::json!({"username": name, "password": password}),
        )
        .await
    }

    pub async fn login(&self, name: &str, password: &str, ip: &str) -> Resp {
        self.post(
            "/auth/login",
            &[("x-forwarded-for", ip)],
            serde_json::json!({"username": name, "password": password}),
        )
        .await
    }

    /// Registers and logs in; returns the token.
    pub async fn user(&self, name: &str, ip: &str) -> String {
        let r = self.register(name, "password123", ip).await;
        assert_eq!(r.status, 201, "{}", r.text());
        let r = self.login(name, "password123", ip).await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["access_token"].as_str().unwrap().to_string()
    }

    /// `user`'s account with its balances (GET /users/me, which must answer 200).
    pub async fn me(&self, user: &str) -> Value {
        let r = self
            .get("/users/me", &[("authorization", &bearer(user))])
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }

    /// `user` bets `sats` in the current round; the answer, accepted or refused.
    pub async fn bet(&self, user: &str, sats: i64) -> Resp {
        self.post(
            "/rounds/current/bets",
            &[("authorization", &bearer(user))],
            serde_json::json!({"amount_sats": sats}),
        )
        .await
    }

    /// `user` withdraws `sats` to `address`; the answer, accepted or refused.
    pub async fn withdraw(&self, user: &str, address: &str, sats: i64) -> Resp {
        self.post(
            "/users/me/withdrawals",
            &[("authorization", &bearer(user))],
            serde_json::json!({"address": address, "amount_sats": sats}),
        )
        .await
    }

    /// POST /dev/faucet with `body` as `user`, whatever it answers.
    pub async fn faucet(&self, user: &str, body: Value) -> Resp {
        self.post("/dev/faucet", &[("authorization", &bearer(user))], body)
            .await
    }

    /// Deposits `sats` to `user` through the development faucet (which mines
    /// until the deposit is credited); the faucet's answer.
    pub async fn deposit(&self, user: &str, sats: i64) -> Value {
        let r = self
            .faucet(user, serde_json::json!({"amount_sats": sats}))
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }

    /// `user`'s transaction history, newest first (must answer 200).
    pub async fn transactions(&self, user: &str) -> Value {
        let r = self
            .get(
                "/users/me/transactions",
                &[("authorization", &bearer(user))],
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }

    pub async fn admin_get(&self, path: &str) -> Resp {
        self.get(path, &[("x-admin-token", ADMIN)]).await
    }

    pub async fn admin_post(&self, path: &str, body: Value) -> Resp {
        self.post(path, &[("x-admin-token", ADMIN)], body).await
    }

    pub async fn admin_put(&self, path: &str, body: Value) -> Resp {
        self.put(path, &[("x-admin-token", ADMIN)], body).await
    }

    /// GET /admin/ledger (must answer 200), checked against the books'
    /// identity: deposits = users' unspent + pots in flight + commission +
    /// withdrawals + miner fees + corrections − debts. The ledger.
    pub async fn balanced_ledger(&self) -> Value {
        let r = self.admin_get("/admin/ledger").await;
        assert_eq!(r.status, 200, "{}", r.text());
        let l = r.json();
        let n = |k: &str| l[k].as_i64().unwrap_or_else(|| panic!("{k} in {l}"));
        assert_eq!(
            n("deposits_sats"),
            n("users_unspent_sats")
                + n("pots_in_flight_sats")
                + n("commission_paid_sats")
                + n("withdrawn_sats")
                + n("miner_fees_sats")
                + n("corrections_sats")
                - n("debts_sats"),
            "the ledger does not balance: {l}"
        );
        l
    }

    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics", &[]).await.text();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("metric {name} missing"))
            .trim()
            .parse()
            .unwrap()
    }
}

/// The `Authorization` value of a session token.
pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// A response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// `detail.code` of a structured error.
    pub fn code(&self) -> String {
        self.json()["detail"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("no code: {}", self.text()))
            .to_string()
    }
}

fn request_bytes(
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    close: bool,
) -> Vec<u8> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: test\r\n");
    if close {
        req.push_str("connection: close\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!(
            "content-type: application/json\r\ncontent-length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    if let Some(b) = body {
        bytes.extend_from_slice(b);
    }
    bytes
}

fn parse_head(head: &str) -> (u16, Vec<(String, String)>) {
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers)
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(pos) = data.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&data[..pos]).unwrap().trim(), 16)
            .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = pos + 2;
        out.extend_from_slice(&data[start..(start + size).min(data.len())]);
        data = &data[(start + size + 2).min(data.len())..];
    }
    out
}

/// One request on a fresh connection (`connection: close`).
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
) -> Resp {
    let fut = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&request_bytes(method, path, headers, body.as_deref(), true))
            .await
            .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("response head");
        let (status, headers) = parse_head(std::str::from_utf8(&raw[..split]).unwrap());
        let mut body = raw[split + 4..].to_vec();
        if headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
        {
            body = dechunk(&body);
        }
        Resp {
            status,
            headers,
            body,
        }
    };
    // Longer than the service's own request time-out (30 s by default), so that a test
    // reads the service's answer to a slow request (202 pending) rather than its own.
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .expect("request timed out")
}

/// An open event stream.
pub struct EventStream {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    stream: TcpStream,
    /// Bytes received after the head, unparsed.
    pub buf: Vec<u8>,
    consumed: usize,
}

impl EventStream {
    pub async fn open(addr: SocketAddr, ip: &str) -> EventStream {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(&request_bytes(
                "GET",
                "/rounds/stream",
                &[("x-forwarded-for", ip), ("accept", "text/event-stream")],
                None,
                true,
            ))
            .await
            .unwrap();
        let mut raw = Vec::new();
        let mut chunk = [0u8; 4096];
        let split = loop {
            if let Some(p) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break p;
            }
            let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
                .await
                .expect("stream head")
                .unwrap();
            assert!(n > 0, "connection closed before the head");
            raw.extend_from_slice(&chunk[..n]);
        };
        let (status, headers) = parse_head(std::str::from_utf8(&raw[..split]).unwrap());
        EventStream {
            status,
            headers,
            stream,
            buf: raw[split + 4..].to_vec(),
            consumed: 0,
        }
    }

    /// Reads for at most `wait`; returns false on EOF.
    async fn fill(&mut self, wait: Duration) -> bool {
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(wait, self.stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            Err(_) => true,
        }
    }

    fn count_unconsumed(&self, needle: &[u8]) -> usize {
        self.buf[self.consumed..]
            .windows(needle.len())
            .filter(|w| *w == needle)
            .count()
    }

    /// Waits until a `data: refetch` message arrives (true) or `wait` passes.
    pub async fn next_refetch(&mut self, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let rest = &self.buf[self.consumed..];
            if let Some(p) = rest.windows(13).position(|w| w == b"data: refetch") {
                self.consumed += p + 13;
                return true;
            }
            let now = tokio::time::Instant::now();
            if now >= deadline || !self.fill(deadline - now).await {
                return false;
            }
        }
    }

    /// Collects everything for `wait` and counts `data: refetch` messages.
    pub async fn count_refetches(&mut self, wait: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + wait;
        while tokio::time::Instant::now() < deadline {
            if !self.fill(deadline - tokio::time::Instant::now()).await {
                break;
            }
        }
        let n = self.count_unconsumed(b"data: refetch");
        self.consumed = self.buf.len();
        n
    }

    /// Whether the server ends the stream (EOF or final chunk) within `wait`.
    pub async fn closed_within(&mut self, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if self.buf.windows(5).any(|w| w == b"0\r\n\r\n") {
                return true;
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return false;
            }
            if !self.fill(deadline - now).await {
                return true;
            }
        }
    }

    /// The body after the head, for 503 answers.
    pub async fn rest(mut self) -> String {
        while self.fill(Duration::from_secs(2)).await {
            if self.buf.ends_with(b"}") {
                break;
            }
        }
        String::from_utf8_lossy(&self.buf).into_owned()
    }
}

/// Generates a SQLite and a PostgreSQL variant of each test.
#[macro_export]
macro_rules! both_databases {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name($crate::support::Db::Sqlite).await })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name($crate::support::Db::Postgres).await })*
        }
    };
}

/// Recomputes the draw of `round` (GET /rounds/{id} of a closed round) from its
/// published proof, independently of the service's code: the bets' commitment,
/// the draw block at the height after the close (`block_hash`, as the chain
/// reports it), the seed, the ticket and the winner. Returns the winning username.
pub fn draw_winner(round: &Value, block_hash: &str) -> String {
    use sha2::{Digest, Sha256};
    let id = round["id"].as_i64().unwrap();
    let d = &round["draw"];
    let bets = d["bets"].as_array().unwrap();
    let mut text = String::new();
    let mut pot: u64 = 0;
    for b in bets {
        text.push_str(&format!(
            "{}:{}:{}:{}\n",
            b["bet_id"],
            b["username"].as_str().unwrap(),
            b["amount_sats"],
            b["txid"].as_str().unwrap()
        ));
        assert_eq!(b["range_start"].as_u64().unwrap(), pot);
        pot += b["amount_sats"].as_u64().unwrap();
        assert_eq!(b["range_end"].as_u64().unwrap(), pot);
    }
    assert_eq!(round["pot_sats"].as_u64().unwrap(), pot);
    let commitment: [u8; 32] = Sha256::digest(text.as_bytes()).into();
    assert_eq!(
        d["bets_commitment"].as_str().unwrap(),
        hex::encode(commitment)
    );
    let h = d["tip_height_at_close"].as_u64().unwrap() + 1;
    assert_eq!(d["block_height"].as_u64().unwrap(), h);
    assert_eq!(d["block_hash"].as_str().unwrap(), block_hash);
    let mut pre = hex::decode(block_hash).unwrap();
    pre.extend_from_slice(&id.to_be_bytes());
    pre.extend_from_slice(&commitment);
    let seed: [u8; 32] = Sha256::digest(&pre).into();
    assert_eq!(d["seed"].as_str().unwrap(), hex::encode(seed));
    let mut ticket: u128 = 0;
    for byte in seed {
        ticket = (ticket * 256 + u128::from(byte)) % u128::from(pot);
    }
    assert_eq!(d["ticket"].as_u64().unwrap() as u128, ticket);
    let winner = bets
        .iter()
        .find(|b| {
            (b["range_start"].as_u64().unwrap() as u128) <= ticket
                && ticket < b["range_end"].as_u64().unwrap() as u128
        })
        .unwrap();
    assert_eq!(d["winner"]["bet_id"], winner["bet_id"]);
    assert_eq!(d["winner"]["username"], winner["username"]);
    winner["username"].as_str().unwrap().to_string()
}
