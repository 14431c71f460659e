//! The rounds service on its embedded development chain with a JSON-RPC
//! client of that chain: in this process (`Rig::new`), or the started binary
//! for the tests that kill and restart it (`Rig::binary`).

use std::net::SocketAddr;
use std::str::FromStr as _;
use std::time::Duration;

use bitcoin::{Address, Network};
use chain::{Auth, BitcoindRpc, RpcConfig};
use serde_json::Value;

use super::{wait_for, Api, Db, Env, InProcess, Server};

/// Where the tests' mined coins go.
pub const MINER: &str = "bcrt1qs758ursh4q9z627kt3pp5yysm78ddny6txaqgw";

/// A service with its chain's RPC; derefs to the service's [`Api`].
pub struct Rig {
    round_secs: &'static str,
    /// The chain's RPC port (kept across restarts of the binary).
    pub rpc_port: u16,
    /// The started binary, of a rig made by [`Rig::binary`].
    pub server: Option<Server>,
    /// The in-process service, of a rig made by [`Rig::new`].
    app: Option<InProcess>,
    pub rpc: BitcoindRpc,
    /// Dropped last (fields drop in order), after the service on it.
    pub env: Env,
}

impl std::ops::Deref for Rig {
    type Target = Api;
    fn deref(&self) -> &Api {
        self.s()
    }
}

impl Rig {
    /// The service in this process, rounds of `round_secs`.
    pub async fn new(db: Db, round_secs: &'static str) -> Self {
        let env = Env::new(db).await;
        let secs: i64 = round_secs.parse().unwrap();
        let app = super::spawn_app_with(&env, |c| {
            super::with_chain_rpc(c);
            c.default_round_duration_seconds = secs;
        })
        .await;
        let mut rig = Self::unstarted(env, round_secs);
        rig.connect_rpc(app.rpc_addr.expect("the chain RPC is bound"));
        rig.app = Some(app);
        rig
    }

    /// The started binary (for tests that kill and restart it), rounds of `round_secs`.
    pub async fn binary(db: Db, round_secs: &'static str) -> Self {
        let mut rig = Self::unstarted(Env::new(db).await, round_secs);
        rig.start(&[]).await;
        rig
    }

    fn unstarted(env: Env, round_secs: &'static str) -> Self {
        // Replaced by `connect_rpc` once the chain's RPC port is known.
        let rpc = rpc_client("http://127.0.0.1:1/", &env);
        Self {
            round_secs,
            rpc_port: 0,
            server: None,
            app: None,
            rpc,
            env,
        }
    }

    fn connect_rpc(&mut self, rpc_addr: SocketAddr) {
        self.rpc_port = rpc_addr.port();
        self.rpc = rpc_client(&format!("http://{rpc_addr}/"), &self.env);
    }

    /// Starts the binary with `envs`; the first start binds the chain's RPC
    /// on port 0 (no races with other tests) and learns the port it got;
    /// restarts bind that port again, so clients configured with it (a
    /// second service) reach the chain once it is back.
    pub async fn start(&mut self, envs: &[(&str, &str)]) {
        assert!(self.app.is_none(), "restarts are for a rig of the binary");
        let bind = format!("127.0.0.1:{}", self.rpc_port);
        let server = self
            .env
            .start_dev_chain(&bind, &["--round-duration-seconds", self.round_secs], envs)
            .await;
        self.connect_rpc(server.rpc_addr.expect("the chain RPC address is reported"));
        self.server = Some(server);
    }

    /// The running service's API.
    pub fn s(&self) -> &Api {
        match (&self.server, &self.app) {
            (Some(server), _) => server,
            (None, Some(app)) => app,
            (None, None) => panic!("no service running"),
        }
    }

    /// Mines `n` blocks to [`MINER`].
    pub async fn mine(&self, n: u32) {
        self.rpc
            .generate_to_address(n, &regtest_address(MINER))
            .await
            .unwrap();
    }

    /// GET /rounds/{id}, which must answer 200.
    pub async fn round(&self, id: i64) -> Value {
        let r = self.get(&format!("/rounds/{id}"), &[]).await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }

    /// GET /rounds/current.
    pub async fn current(&self) -> Value {
        self.get("/rounds/current", &[]).await.json()
    }

    /// Waits for a round that opened after the current one, so bets fit in it.
    pub async fn fresh_round(&self) -> i64 {
        let start = self.current().await["id"].as_i64().unwrap();
        wait_for("a fresh round", Duration::from_secs(60), || async {
            let c = self.current().await;
            let id = c["id"].as_i64().unwrap();
            (id > start && c["status"] == "open").then_some(id)
        })
        .await
    }

    /// Waits until round `id` has `status`; the round.
    pub async fn wait_status(&self, id: i64, status: &str) -> Value {
        wait_for(status, Duration::from_secs(60), || async {
            let r = self.round(id).await;
            (r["status"] == status).then_some(r)
        })
        .await
    }

    /// Stops the service; its database and data directory go with the rig.
    pub async fn finish(mut self) {
        if let Some(s) = self.server.take() {
            s.stop().await;
        }
        if let Some(app) = self.app.take() {
            app.stop().await;
        }
    }
}

/// A client of the development chain's RPC at `url`, with its cookie in `env`.
pub fn rpc_client(url: &str, env: &Env) -> BitcoindRpc {
    BitcoindRpc::new(RpcConfig::new(
        url.to_string(),
        Auth::Cookie(env.data_dir.join("chain").join(".cookie")),
    ))
    .unwrap()
}

/// `a` as a regtest address.
pub fn regtest_address(a: &str) -> Address {
    Address::from_str(a)
        .unwrap()
        .require_network(Network::Regtest)
        .unwrap()
}
