//! The embedded development chain: regtest rules on real consensus objects,
//! persisted in a data directory, usable in-process ([`DevChain`] implements
//! [`crate::Chain`]) or over Bitcoin Core's JSON-RPC ([`DevChain::start`]).

pub mod json;
pub mod script;
pub mod server;
pub mod state;
pub mod store;
pub mod validation;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bitcoin::secp256k1::{Secp256k1, SecretKey};
use bitcoin::{
    Address, Amount, Block, BlockHash, CompressedPublicKey, FeeRate, Network, OutPoint, Script,
    ScriptBuf, Transaction, TxOut, Txid,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{Chain, ChainError, ChainFuture, Tip, TxStatus, UnspentOutput};
use crate::fees::FeePolicy;
use crate::tips::TipStream;
use state::{Accepted, ChainState};
use store::{Store, StoreError};
use validation::{Coin, TxReject, COINBASE_MATURITY};

/// Blocks mined to the faucet when a data directory is created, so that one
/// coinbase is mature and the faucet can pay at once.
pub const INITIAL_BLOCKS: u32 = COINBASE_MATURITY + 1;
/// `sendrawtransaction`'s default `maxfeerate`: 0.10 BTC/kvB (Core's
/// `DEFAULT_MAX_RAW_TX_FEE_RATE`), 2,500,000 sat per 1,000 weight units.
pub const DEFAULT_MAX_FEE_RATE: FeeRate = FeeRate::from_sat_per_kwu(2_500_000);
/// Most blocks one `generatetoaddress` call mines (the lock is released
/// between blocks, but the call itself holds a worker thread).
pub const MAX_GENERATE: u32 = 1_000;
/// Fee rate of faucet payments.
const FAUCET_FEE_SAT_VB: u32 = 2;

/// Why a development-chain operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DevChainError {
    /// Reading or writing the data directory failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored or submitted block does not validate.
    #[error("block rejected: {0}")]
    Block(String),
    /// A transaction was refused.
    #[error(transparent)]
    Tx(#[from] TxReject),
    /// The faucet has no mature coin large enough.
    #[error("faucet has insufficient funds for {0}")]
    InsufficientFunds(Amount),
    /// Block or transaction unknown.
    #[error("not found: {0}")]
    NotFound(String),
    /// The faucet key file is unreadable.
    #[error("faucet key: {0}")]
    Key(String),
    /// Binding or serving the RPC port failed.
    #[error("rpc server: {0}")]
    Server(String),
}

/// How to run a development chain.
#[derive(Debug, Clone)]
pub struct DevChainConfig {
    /// Where blocks, the mempool, the faucet key and the RPC cookie live.
    pub data_dir: PathBuf,
    /// Mine a block (to the faucet) this often; `None` = only on demand.
    pub block_interval: Option<Duration>,
    /// Serve JSON-RPC here (port 0 picks a free port); `None` = in-process only.
    pub rpc_bind: Option<SocketAddr>,
    /// RPC user and password; `None` writes a cookie file `<data_dir>/.cookie`.
    pub rpc_auth: Option<(String, String)>,
}

impl DevChainConfig {
    /// In-process chain in `data_dir`, no interval mining, no RPC.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            block_interval: None,
            rpc_bind: None,
            rpc_auth: None,
        }
    }
}

struct Core {
    state: ChainState,
    store: Store,
}

/// Behaviours of a real node that tests switch on (see [`DevChain::set_warmup`] …).
#[derive(Debug)]
struct Knobs {
    warmup_until: Option<std::time::Instant>,
    fee_estimates: bool,
    txindex: bool,
    fee_policy: FeePolicy,
}

struct Inner {
    core: Mutex<Core>,
    knobs: Mutex<Knobs>,
    faucet_key: SecretKey,
    faucet_script: ScriptBuf,
    secp: Secp256k1<bitcoin::secp256k1::All>,
    tip_poll: Duration,
    /// When this handle's chain was opened, for `uptime`.
    started: std::time::Instant,
}

/// A handle on the development chain; clones share the same chain.
#[derive(Clone)]
pub struct DevChain {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DevChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevChain").finish_non_exhaustive()
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl DevChain {
    /// Opens the chain in `dir` (created if missing), replaying stored blocks.
    /// A new directory starts with [`INITIAL_BLOCKS`] blocks paying the faucet.
    ///
    /// # Errors
    /// IO errors, or stored data that does not validate.
    pub fn open(dir: &Path) -> Result<Self, DevChainError> {
        let (store, loaded) = Store::open(dir)?;
        let faucet_key = load_or_create_key(&dir.join("faucet.key"))?;
        let secp = Secp256k1::new();
        let faucet_script = ScriptBuf::new_p2wpkh(
            &CompressedPublicKey(faucet_key.public_key(&secp)).wpubkey_hash(),
        );
        let mut state = ChainState::new();
        let fresh = loaded.blocks.is_empty();
        for block in loaded.blocks {
            state
                .insert_known(block)
                .map_err(|e| DevChainError::Block(e.0))?;
        }
        state.mark_invalid(loaded.invalid);
        state.activate_preferring(loaded.tip, now());
        for tx in &loaded.mempool {
            // Stored transactions that are no longer valid are dropped, as Core does.
            let _ = state.accept_to_mempool(tx, now(), None, false);
        }
        if state.mempool_len() != loaded.mempool.len() {
            // Broadcasts append to the file: it must hold exactly the
            // mempool, or a dropped transaction would be replayed before
            // later ones on the next start.
            let txs: Vec<&Transaction> =
                state.mempool_entries().into_iter().map(|e| &e.tx).collect();
            store.write_mempool(&txs)?;
        }
        let chain = Self {
            inner: Arc::new(Inner {
                core: Mutex::new(Core { state, store }),
                knobs: Mutex::new(Knobs {
                    warmup_until: None,
                    fee_estimates: true,
                    txindex: true,
                    fee_policy: FeePolicy::default(),
                }),
                faucet_key,
                faucet_script,
                secp,
                tip_poll: Duration::from_millis(100),
                started: std::time::Instant::now(),
            }),
        };
        if fresh {
            let script = chain.inner.faucet_script.clone();
            chain.mine(INITIAL_BLOCKS, &script)?;
        }
        tracing::info!(dir = %dir.display(), height = chain.height(), "development chain open");
        Ok(chain)
    }

    fn core(&self) -> MutexGuard<'_, Core> {
        // A panic while holding the lock leaves a consistent state (every
        // mutation completes or rolls back before it can panic), so recover.
        self.inner.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the chain state under the lock.
    pub fn with_state<R>(&self, f: impl FnOnce(&ChainState) -> R) -> R {
        f(&self.core().state)
    }

    /// Runs `f` on the mutable chain state under the lock, then persists the
    /// mempool (tests set policy knobs such as the mempool's minimum fee).
    ///
    /// # Errors
    /// Store errors.
    pub fn with_state_mut<R>(
        &self,
        f: impl FnOnce(&mut ChainState) -> R,
    ) -> Result<R, DevChainError> {
        let mut core = self.core();
        let r = f(&mut core.state);
        save_mempool(&core)?;
        Ok(r)
    }

    fn knobs(&self) -> MutexGuard<'_, Knobs> {
        self.inner.knobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Answers every RPC call with Core's -28 (`Loading block index…`) for
    /// `d`, as a node that is starting up does.
    pub fn set_warmup(&self, d: Duration) {
        self.knobs().warmup_until = Some(std::time::Instant::now() + d);
    }

    /// Whether the RPC server should answer -28 now.
    pub fn warming_up(&self) -> bool {
        let mut k = self.knobs();
        match k.warmup_until {
            Some(t) if std::time::Instant::now() < t => true,
            Some(_) => {
                k.warmup_until = None;
                false
            }
            None => false,
        }
    }

    /// With `false`, `estimatesmartfee` answers "Insufficient data or no
    /// feerate found", as a fresh Core does.
    pub fn set_fee_estimates(&self, on: bool) {
        self.knobs().fee_estimates = on;
    }

    /// Whether `estimatesmartfee` gives an estimate.
    pub fn fee_estimates(&self) -> bool {
        self.knobs().fee_estimates
    }

    /// Sets the bounds the in-process [`Chain::estimate_fee`] applies (the
    /// RPC server's `estimatesmartfee` answers raw, as Core does).
    pub fn set_fee_policy(&self, policy: FeePolicy) {
        self.knobs().fee_policy = policy;
    }

    /// The node's own estimate for `estimatesmartfee`: `None` while
    /// estimates are off (a fresh Core), otherwise the mempool's floor —
    /// there is no fee market, so that rate confirms in the next block.
    pub fn raw_fee_estimate(&self) -> Option<FeeRate> {
        if !self.fee_estimates() {
            return None;
        }
        Some(self.with_state(|s| {
            s.mempool_min_fee()
                .max(s.block_min_fee().unwrap_or(FeeRate::ZERO))
        }))
    }

    /// Switches the fee-market mode on or off: with `Some(threshold)`,
    /// blocks mined here (`generatetoaddress`, interval blocks) take only
    /// mempool transactions whose ancestor package pays at least
    /// `threshold` at modified fees (see [`ChainState::set_block_min_fee`]),
    /// and `estimatesmartfee` answers that threshold. Not persisted.
    pub fn set_mining_min_fee(&self, threshold: Option<FeeRate>) {
        self.core().state.set_block_min_fee(threshold);
    }

    /// The fee-market threshold, if on.
    pub fn mining_min_fee(&self) -> Option<FeeRate> {
        self.with_state(|s| s.block_min_fee())
    }

    /// `prioritisetransaction`: mining and the fee-market threshold count
    /// `delta_sat` more (or less) fee for `txid` until it is mined. Relay
    /// checks still use the real fee. Not persisted.
    pub fn prioritise_transaction(&self, txid: Txid, delta_sat: i64) {
        self.core().state.prioritise(txid, delta_sat);
    }

    /// `generateblock`: a block paying `script` holding exactly `txs` in
    /// that order, checked by consensus (scripts included) but not by relay
    /// policy; connected and stored when `submit`, otherwise only checked
    /// (Core's `TestBlockValidity`) and returned.
    ///
    /// # Errors
    /// [`DevChainError::Block`] with Core's reason; store errors.
    pub fn generate_block(
        &self,
        script: &Script,
        txs: Vec<Transaction>,
        submit: bool,
    ) -> Result<Block, DevChainError> {
        let mut core = self.core();
        let block = core
            .state
            .block_of(script, now() as u32, txs)
            .map_err(|e| DevChainError::Block(e.0))?;
        if !submit {
            // The check runs on a copy, so nothing of it stays.
            let mut trial = core.state.clone();
            trial
                .connect_block(block.clone(), true)
                .map_err(|e| DevChainError::Block(e.0))?;
            return Ok(block);
        }
        core.state
            .connect_block(block.clone(), true)
            .map_err(|e| DevChainError::Block(e.0))?;
        core.store.append_block(&block)?;
        core.store.write_tip(&block.block_hash())?;
        save_mempool(&core)?;
        Ok(block)
    }

    /// With `false`, `getrawtransaction` finds confirmed transactions only
    /// with a block hash, and `getindexinfo` lists no index: Core without
    /// `-txindex` (its default).
    pub fn set_txindex(&self, on: bool) {
        self.knobs().txindex = on;
    }

    /// Whether the transaction index is on.
    pub fn txindex(&self) -> bool {
        self.knobs().txindex
    }

    /// Time since the chain was opened (`uptime`, whole seconds there).
    pub fn uptime(&self) -> Duration {
        self.inner.started.elapsed()
    }

    /// Bytes of block data in the data directory.
    pub fn size_on_disk(&self) -> u64 {
        self.core().store.size_on_disk()
    }

    /// Height of the active tip.
    pub fn height(&self) -> u32 {
        self.core().state.height()
    }

    /// The script the faucet's coins pay to.
    pub fn faucet_script(&self) -> &Script {
        &self.inner.faucet_script
    }

    /// Mines `n` blocks paying `script`, including valid mempool transactions.
    ///
    /// # Errors
    /// Store errors (the blocks stay connected in memory).
    pub fn mine(&self, n: u32, script: &Script) -> Result<Vec<BlockHash>, DevChainError> {
        let mut hashes = Vec::with_capacity(n.min(MAX_GENERATE) as usize);
        for _ in 0..n {
            // The lock is taken per block, so readers (the RPC server, the
            // services' tip polls) are not stalled behind a long generate.
            let mut core = self.core();
            let block = core
                .state
                .mine_block(script, now() as u32)
                .map_err(|e| DevChainError::Block(e.0))?;
            core.store.append_block(&block)?;
            core.store.write_tip(&block.block_hash())?;
            save_mempool(&core)?;
            hashes.push(block.block_hash());
        }
        Ok(hashes)
    }

    /// Validates a block (scripts included) and connects it on the tip.
    ///
    /// # Errors
    /// [`DevChainError::Block`] with Core's reason.
    pub fn submit_block(&self, block: Block) -> Result<(), DevChainError> {
        let mut core = self.core();
        core.state
            .connect_block(block.clone(), true)
            .map_err(|e| DevChainError::Block(e.0))?;
        core.store.append_block(&block)?;
        let tip = core.state.tip_hash();
        core.store.write_tip(&tip)?;
        save_mempool(&core)?;
        Ok(())
    }

    /// Accepts a transaction to the mempool (`sendrawtransaction`); a
    /// transaction already there is accepted again without change.
    ///
    /// # Errors
    /// [`TxReject`] with Core's reason.
    pub fn send_raw(
        &self,
        tx: &Transaction,
        max_fee_rate: Option<FeeRate>,
    ) -> Result<Txid, DevChainError> {
        let mut core = self.core();
        let txid = tx.compute_txid();
        if core.state.mempool_entry(&txid).is_some() {
            return Ok(txid);
        }
        // Core's `BroadcastTransaction` answers -27 before trying the
        // mempool, and only while an output is unspent: a mined transaction
        // whose outputs are all spent gets -25 `bad-txns-inputs-missingorspent`.
        if core.state.has_unspent_output(tx) {
            return Err(DevChainError::Tx(TxReject {
                kind: validation::RejectKind::AlreadyInChain,
                reason: "Transaction outputs already in utxo set".into(),
            }));
        }
        let before = core.state.mempool_len();
        core.state
            .accept_to_mempool(tx, now(), max_fee_rate, false)?;
        save_accepted(&core, before, tx)?;
        Ok(txid)
    }

    /// Checks a transaction without adding it (`testmempoolaccept`).
    ///
    /// # Errors
    /// [`TxReject`] with Core's reason.
    pub fn test_accept(
        &self,
        tx: &Transaction,
        max_fee_rate: Option<FeeRate>,
    ) -> Result<Accepted, TxReject> {
        self.core()
            .state
            .accept_to_mempool(tx, now(), max_fee_rate, true)
    }

    /// `invalidateblock`.
    ///
    /// # Errors
    /// Unknown block or store error.
    pub fn invalidate(&self, hash: BlockHash) -> Result<(), DevChainError> {
        let mut core = self.core();
        core.state
            .invalidate(hash, now())
            .map_err(|e| DevChainError::NotFound(e.0))?;
        persist_marks(&core)
    }

    /// `reconsiderblock`.
    ///
    /// # Errors
    /// Unknown block or store error.
    pub fn reconsider(&self, hash: BlockHash) -> Result<(), DevChainError> {
        let mut core = self.core();
        core.state
            .reconsider(hash, now())
            .map_err(|e| DevChainError::NotFound(e.0))?;
        persist_marks(&core)
    }

    /// Pays `amount` to `script` from the faucet (the dev chain's own key,
    /// which every interval block pays), spending one coin, change back to
    /// the faucet, at 2 sat/vB. Unconfirmed faucet change may be spent.
    ///
    /// # Errors
    /// [`DevChainError::InsufficientFunds`] when no single mature coin suffices.
    pub fn faucet(&self, script: &Script, amount: Amount) -> Result<Txid, DevChainError> {
        let mut core = self.core();
        let state = &core.state;
        let spend_height = state.height() + 1;
        let mut candidates: Vec<(OutPoint, Coin)> = state
            .utxos_for(&self.inner.faucet_script)
            .into_iter()
            .filter(|(op, c)| {
                state.mempool_spender(op).is_none()
                    && (!c.coinbase || spend_height - c.height >= COINBASE_MATURITY)
            })
            .collect();
        for e in state.mempool_entries() {
            let txid = e.tx.compute_txid();
            for (vout, o) in e.tx.output.iter().enumerate() {
                let op = OutPoint {
                    txid,
                    vout: vout as u32,
                };
                if o.script_pubkey == self.inner.faucet_script
                    && state.mempool_spender(&op).is_none()
                {
                    candidates.push((
                        op,
                        Coin {
                            txout: o.clone(),
                            height: spend_height,
                            coinbase: false,
                        },
                    ));
                }
            }
        }
        let rate = FeeRate::from_sat_per_vb_u32(FAUCET_FEE_SAT_VB);
        let needed = amount + rate.fee_vb(200).unwrap_or(Amount::ZERO);
        // The smallest coin that covers the payment keeps big coins for
        // later; among equals the oldest, which a reorg is least likely to
        // make immature again (and the choice is deterministic).
        let Some((outpoint, coin)) = candidates
            .into_iter()
            .filter(|(_, c)| c.txout.value >= needed)
            .min_by_key(|(op, c)| (c.txout.value, c.height, *op))
        else {
            return Err(DevChainError::InsufficientFunds(amount));
        };
        let input = wallet::SpendableOutput {
            outpoint,
            txout: coin.txout.clone(),
            path: wallet::KeyPath::receive(0), // not used: signed with the faucet key below
        };
        let payment = TxOut {
            value: amount,
            script_pubkey: script.to_owned(),
        };
        let mut built =
            wallet::build_transaction(&[input], &[payment], Some(&self.inner.faucet_script), rate)
                .map_err(|e| DevChainError::Tx(TxReject::rejected(e.to_string())))?;
        wallet::sign_p2wpkh_input(
            &self.inner.secp,
            &mut built.tx,
            0,
            coin.txout.value,
            &self.inner.faucet_key,
        )
        .map_err(|e| DevChainError::Key(e.to_string()))?;
        let before = core.state.mempool_len();
        let accepted = core
            .state
            .accept_to_mempool(&built.tx, now(), None, false)?;
        save_accepted(&core, before, &built.tx)?;
        Ok(accepted.txid)
    }

    /// Starts the chain: opens `config.data_dir`, and spawns interval mining
    /// and the JSON-RPC server as configured. Must run inside a tokio runtime.
    ///
    /// # Errors
    /// Open errors, or the RPC address cannot be bound.
    pub async fn start(config: DevChainConfig) -> Result<RunningDevChain, DevChainError> {
        let dir = config.data_dir.clone();
        let chain = tokio::task::spawn_blocking(move || DevChain::open(&dir))
            .await
            .map_err(|e| DevChainError::Server(e.to_string()))??;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        if let Some(interval) = config.block_interval.filter(|d| !d.is_zero()) {
            let miner = chain.clone();
            let mut stop = shutdown_rx.clone();
            tasks.push(tokio::spawn(async move {
                let mut ticker = tokio::time::interval(interval);
                ticker.tick().await; // the first tick is immediate
                loop {
                    tokio::select! {
                        _ = ticker.tick() => {}
                        _ = stop.changed() => return,
                    }
                    let m = miner.clone();
                    let res = tokio::task::spawn_blocking(move || {
                        let script = m.faucet_script().to_owned();
                        m.mine(1, &script)
                    })
                    .await;
                    if let Ok(Err(e)) = res {
                        tracing::warn!(error = %e, "interval block failed");
                    }
                }
            }));
        }
        let mut rpc_addr = None;
        let mut cookie = None;
        if let Some(bind) = config.rpc_bind {
            let (user, password) = match &config.rpc_auth {
                Some(up) => up.clone(),
                None => {
                    let path = config.data_dir.join(".cookie");
                    let secret = random_hex(32)?;
                    store::write_secret(&path, format!("__cookie__:{secret}").as_bytes())?;
                    cookie = Some(path);
                    ("__cookie__".to_owned(), secret)
                }
            };
            let listener = tokio::net::TcpListener::bind(bind)
                .await
                .map_err(|e| DevChainError::Server(format!("bind {bind}: {e}")))?;
            let addr = listener
                .local_addr()
                .map_err(|e| DevChainError::Server(e.to_string()))?;
            rpc_addr = Some(addr);
            let app = server::router(chain.clone(), &user, &password, shutdown_tx.clone());
            let mut stop = shutdown_rx.clone();
            tasks.push(tokio::spawn(async move {
                let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                });
                if let Err(e) = serve.await {
                    tracing::error!(error = %e, "rpc server failed");
                }
            }));
            tracing::info!(%addr, "development chain RPC listening");
        }
        Ok(RunningDevChain {
            chain,
            rpc_addr,
            cookie,
            shutdown: shutdown_tx,
            tasks,
        })
    }
}

fn save_mempool(core: &Core) -> Result<(), DevChainError> {
    let txs: Vec<&Transaction> = core
        .state
        .mempool_entries()
        .into_iter()
        .map(|e| &e.tx)
        .collect();
    core.store.write_mempool(&txs)?;
    Ok(())
}

/// Persists the mempool after `tx` was accepted into a mempool of `before`
/// transactions: one record appended when it only grew by `tx` (nothing
/// replaced), otherwise the whole file rewritten.
fn save_accepted(core: &Core, before: usize, tx: &Transaction) -> Result<(), DevChainError> {
    if core.state.mempool_len() == before + 1 {
        core.store.append_mempool(tx)?;
        Ok(())
    } else {
        save_mempool(core)
    }
}

fn persist_marks(core: &Core) -> Result<(), DevChainError> {
    let invalid: Vec<BlockHash> = core.state.invalid().iter().copied().collect();
    core.store.write_invalid(&invalid)?;
    core.store.write_tip(&core.state.tip_hash())?;
    save_mempool(core)
}

fn random_hex(len: usize) -> Result<String, DevChainError> {
    let mut bytes = vec![0u8; len];
    getrandom::fill(&mut bytes).map_err(|e| DevChainError::Key(e.to_string()))?;
    Ok(hex::encode(bytes))
}

fn load_or_create_key(path: &Path) -> Result<SecretKey, DevChainError> {
    match std::fs::read_to_string(path) {
        Ok(s) => {
            let bytes = hex::decode(s.trim()).map_err(|e| DevChainError::Key(e.to_string()))?;
            SecretKey::from_slice(&bytes).map_err(|e| DevChainError::Key(e.to_string()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let hex_key = random_hex(32)?;
            let bytes = hex::decode(&hex_key).map_err(|e| DevChainError::Key(e.to_string()))?;
            let key =
                SecretKey::from_slice(&bytes).map_err(|e| DevChainError::Key(e.to_string()))?;
            store::write_secret(path, hex_key.as_bytes())?;
            Ok(key)
        }
        Err(e) => Err(DevChainError::Key(format!("{}: {e}", path.display()))),
    }
}

/// A started development chain: the handle, its RPC address and cookie.
#[derive(Debug)]
pub struct RunningDevChain {
    /// In-process handle (implements [`Chain`]).
    pub chain: DevChain,
    /// Where JSON-RPC listens, if enabled.
    pub rpc_addr: Option<SocketAddr>,
    /// The cookie file, when no user/password was configured.
    pub cookie: Option<PathBuf>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningDevChain {
    /// `http://ADDR/` of the RPC server, if enabled.
    pub fn rpc_url(&self) -> Option<String> {
        self.rpc_addr.map(|a| format!("http://{a}/"))
    }

    /// Resolves when the `stop` RPC was called or [`RunningDevChain::shutdown`] ran.
    pub async fn stopped(&self) {
        let mut rx = self.shutdown.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Stops mining and the RPC server, and waits for them.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        if let Some(c) = &self.cookie {
            // Core deletes its cookie on shutdown; so do we.
            let _ = std::fs::remove_file(c);
        }
    }
}

fn reject_to_chain(e: DevChainError) -> ChainError {
    match e {
        DevChainError::Tx(r) => ChainError::rejected(r.kind.code(), r.reason),
        DevChainError::NotFound(m) => ChainError::NotFound(m),
        other => ChainError::Unavailable(other.to_string()),
    }
}

impl DevChain {
    /// Runs `f` off the async workers: it takes the chain lock, which a
    /// block being mined or a large mempool walk may hold for a while.
    fn off_runtime<T: Send + 'static>(
        &self,
        f: impl FnOnce(&DevChain) -> Result<T, ChainError> + Send + 'static,
    ) -> ChainFuture<'_, T> {
        let chain = self.clone();
        Box::pin(async move {
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => handle
                    .spawn_blocking(move || f(&chain))
                    .await
                    .map_err(|e| ChainError::Unavailable(format!("chain task: {e}")))?,
                Err(_) => f(&chain),
            }
        })
    }

    fn status_in_block(s: &ChainState, txid: &Txid, hash: BlockHash) -> Option<TxStatus> {
        if !s.is_active(&hash) {
            return None;
        }
        let entry = s.entry(&hash)?;
        let tx = entry
            .block
            .txdata
            .iter()
            .find(|t| t.compute_txid() == *txid)?
            .clone();
        Some(TxStatus {
            tx,
            confirmations: s.height() - entry.height + 1,
            block_hash: Some(hash),
        })
    }
}

impl Chain for DevChain {
    fn tip(&self) -> ChainFuture<'_, Tip> {
        self.off_runtime(|c| {
            Ok(c.with_state(|s| Tip {
                height: s.height(),
                hash: s.tip_hash(),
            }))
        })
    }

    fn height(&self) -> ChainFuture<'_, u32> {
        self.off_runtime(|c| Ok(c.with_state(|s| s.height())))
    }

    fn block_hash(&self, height: u32) -> ChainFuture<'_, Option<BlockHash>> {
        self.off_runtime(move |c| Ok(c.with_state(|s| s.hash_at(height))))
    }

    fn block(&self, hash: BlockHash) -> ChainFuture<'_, Block> {
        self.off_runtime(move |c| {
            c.with_state(|s| s.entry(&hash).map(|e| (*e.block).clone()))
                .ok_or_else(|| ChainError::NotFound(format!("block {hash}")))
        })
    }

    fn transaction(&self, txid: Txid) -> ChainFuture<'_, Option<TxStatus>> {
        self.off_runtime(move |c| {
            let txindex = c.txindex();
            Ok(c.with_state(|s| {
                if let Some(e) = s.mempool_entry(&txid) {
                    return Some(TxStatus {
                        tx: e.tx.clone(),
                        confirmations: 0,
                        block_hash: None,
                    });
                }
                if !txindex {
                    return None;
                }
                let (hash, _) = s.tx_location(&txid)?;
                Self::status_in_block(s, &txid, hash)
            }))
        })
    }

    fn transaction_in_block(
        &self,
        txid: Txid,
        hint: BlockHash,
    ) -> ChainFuture<'_, Option<TxStatus>> {
        self.off_runtime(move |c| Ok(c.with_state(|s| Self::status_in_block(s, &txid, hint))))
    }

    fn broadcast(&self, tx: Transaction) -> ChainFuture<'_, Txid> {
        // The same guard as `sendrawtransaction` on a real node.
        self.off_runtime(move |c| {
            c.send_raw(&tx, Some(DEFAULT_MAX_FEE_RATE))
                .map_err(reject_to_chain)
        })
    }

    fn in_mempool(&self, txid: Txid) -> ChainFuture<'_, bool> {
        self.off_runtime(move |c| Ok(c.with_state(|s| s.mempool_entry(&txid).is_some())))
    }

    fn unspent_output(&self, outpoint: OutPoint) -> ChainFuture<'_, Option<UnspentOutput>> {
        self.off_runtime(move |c| {
            Ok(c.with_state(|s| {
                let coin = s.mempool_coin(&outpoint)?;
                let confirmed = s.utxo(&outpoint).is_some();
                Some(UnspentOutput {
                    value: coin.txout.value,
                    script_pubkey: coin.txout.script_pubkey,
                    confirmations: if confirmed {
                        s.height() - coin.height + 1
                    } else {
                        0
                    },
                    coinbase: coin.coinbase,
                })
            }))
        })
    }

    fn confirmed_output(&self, outpoint: OutPoint) -> ChainFuture<'_, Option<UnspentOutput>> {
        self.off_runtime(move |c| {
            Ok(c.with_state(|s| {
                let coin = s.utxo(&outpoint)?;
                Some(UnspentOutput {
                    value: coin.txout.value,
                    script_pubkey: coin.txout.script_pubkey.clone(),
                    confirmations: s.height() - coin.height + 1,
                    coinbase: coin.coinbase,
                })
            }))
        })
    }

    fn estimate_fee(&self, _target_blocks: u16) -> ChainFuture<'_, FeeRate> {
        // The same reading as `BitcoindRpc`: the node's estimate and its
        // mempool minimum, held to the policy.
        self.off_runtime(|c| {
            let estimate = c.raw_fee_estimate();
            let mempool_min = c.with_state(|s| s.mempool_min_fee());
            Ok(c.fee_policy().apply(estimate, Some(mempool_min)))
        })
    }

    fn fee_policy(&self) -> FeePolicy {
        self.knobs().fee_policy
    }

    fn tips(&self) -> TipStream {
        TipStream::poll(Arc::new(self.clone()), self.inner.tip_poll)
    }

    fn median_time_past(&self) -> ChainFuture<'_, u32> {
        self.off_runtime(|c| Ok(c.with_state(|s| s.median_time_past(s.height()))))
    }
}

/// The regtest address of a script, for display.
pub fn regtest_address(script: &Script) -> Option<Address> {
    Address::from_script(script, Network::Regtest).ok()
}
