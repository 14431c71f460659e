//! The node's SQLite database in the data directory: channels (full
//! state-machine snapshots), the wallet's outputs, pending broadcasts, peers.
//!
//! Every write is its own transaction and `synchronous = FULL` in WAL mode,
//! so a write that returned is on disk: the node persists a channel before it
//! sends the packet that acknowledges the change.

use std::path::Path;
use std::str::FromStr as _;

use bitcoin::consensus::encode;
use bitcoin::hashes::Hash as _;
use bitcoin::{OutPoint, Transaction, Txid};
use channel::Channel;
use secp256k1::PublicKey;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteLockingMode, SqliteSynchronous};
use sqlx::Row;

mod group_commit;
pub(crate) mod snapshot;

use group_commit::{group_writer, Db, WalAhead, WriteRequest, GROUP_MAX, WRITER_SETUP};
#[cfg(test)]
use group_commit::{write_group, write_group_statements};
pub(crate) use snapshot::{decode_snapshot, encode_snapshot, SNAPSHOT_VERSION};

/// A channel's row id in the store, also its number in logs (`channel=`) and the wallet
/// index of its keys plus one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelId(pub(crate) i64);

impl ChannelId {
    /// The channel whose keys have wallet index `index`.
    pub(crate) fn of_index(index: u32) -> ChannelId {
        ChannelId(i64::from(index) + 1)
    }

    /// The wallet index of the channel's keys.
    pub(crate) fn index(self) -> Option<u32> {
        u32::try_from(self.0.checked_sub(1)?).ok()
    }
}

impl std::fmt::Display for ChannelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The counters and marks of the `meta` table; the stored key is [`MetaKey::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetaKey {
    /// Receive addresses handed out (`newaddr`).
    NextReceive,
    /// Change addresses handed out (anchors).
    NextChange,
    /// Channels created (their keys' wallet index).
    NextChannel,
    /// The last block the watcher scanned.
    ScannedHeight,
}

impl MetaKey {
    /// The key as stored.
    pub(crate) fn name(self) -> &'static str {
        match self {
            MetaKey::NextReceive => "next_receive",
            MetaKey::NextChange => "next_change",
            MetaKey::NextChannel => "next_channel",
            MetaKey::ScannedHeight => "scanned_height",
        }
    }
}

/// Why the database failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// SQLite failed.
    #[error("database")]
    Sql(#[from] sqlx::Error),
    /// The schema could not be brought up to date.
    #[error("database schema")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored channel snapshot is not what its layout needs (not an object, a bad version).
    #[error("stored channel {0} is corrupt: {1}")]
    Corrupt(ChannelId, String),
    /// A stored channel snapshot, or a stored record of it, does not parse.
    #[error("stored channel {id} is corrupt")]
    Undecodable {
        /// The channel.
        id: ChannelId,
        /// Why it does not parse.
        source: serde_json::Error,
    },
    /// A stored channel snapshot does not parse as the version it names, or does not migrate.
    #[error("stored channel {id} is corrupt: snapshot version {version}")]
    UndecodableVersion {
        /// The channel.
        id: ChannelId,
        /// The snapshot's version.
        version: u64,
        /// Why it does not parse or migrate.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A channel snapshot written by a newer release: refused, never dropped.
    #[error("stored channel {id} has snapshot version {version}; this release reads versions 0 to {SNAPSHOT_VERSION}: run the release that wrote it")]
    SnapshotTooNew {
        /// The channel.
        id: ChannelId,
        /// Its snapshot's version.
        version: u64,
    },
    /// A group commit failed (nothing of it was written).
    #[error("database write")]
    Write(#[source] std::sync::Arc<sqlx::Error>),
    /// The group-commit writer task is gone (the node is stopping).
    #[error("database write: the database writer stopped")]
    WriterStopped,
    /// A stored invoice does not read (its label, and the column).
    #[error("stored invoice {0:?} is corrupt: bad {1}")]
    CorruptInvoice(String, String),
    /// A stored forward does not read (its hash, and the column).
    #[error("stored forward {0} is corrupt: bad {1}")]
    CorruptForward(String, String),
    /// A channel's record could not be encoded (nothing was written).
    #[error("channel {id} cannot be encoded")]
    Encode {
        /// The channel.
        id: ChannelId,
        /// Why.
        source: serde_json::Error,
    },
    /// A channel snapshot could not be encoded (nothing was written).
    #[error("channel {id} cannot be encoded")]
    EncodeSnapshot {
        /// The channel.
        id: ChannelId,
        /// Why.
        source: postcard::Error,
    },
    /// A stored channel names a peer that is not a node id: refused rather than hiding the
    /// channel's money by skipping it.
    #[error("stored channel {channel} has peer id {peer_id:?}, which is not a node id")]
    BadPeerId {
        /// The channel.
        channel: ChannelId,
        /// What is stored as its peer.
        peer_id: String,
    },
}

/// One row of `channels`.
pub(crate) struct ChannelRow {
    pub id: ChannelId,
    pub peer: PublicKey,
    pub channel: Channel,
}

/// One invoice: an R this node made for a payment to it (issue 30).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvoiceRow {
    pub label: String,
    pub r: wire::Preimage,
    pub amount_msat: u32,
    /// Unix seconds.
    pub created_at: u64,
    pub paid: Option<InvoicePaid>,
}

/// How an invoice was paid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InvoicePaid {
    /// The channel whose incoming HTLC paid it.
    pub channel: ChannelId,
    /// That HTLC's amount.
    pub amount_msat: u32,
    /// Unix seconds.
    pub at: u64,
    /// The fulfil of that HTLC completed (R is the peer's).
    pub settled: bool,
}

/// One forward: an incoming HTLC this node offered on to the next hop (issue 30).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ForwardRow {
    /// The channel the HTLC came in on.
    pub in_channel: ChannelId,
    pub r_hash: wire::Sha256,
    /// The incoming HTLC's amount.
    pub in_msat: u32,
    /// The channel it goes out on, and that channel's peer.
    pub out_channel: ChannelId,
    pub out_peer: secp256k1::PublicKey,
    /// The downstream HTLC's amount and expiry (blocks).
    pub out_msat: u32,
    pub out_expiry: u32,
    /// The onion for the next hop.
    pub onion: wire::Onion,
    pub state: ForwardState,
    /// Unix seconds.
    pub created_at: u64,
}

/// Where a forward stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ForwardState {
    /// The downstream HTLC is offered (or about to be): the upstream one waits.
    Offered,
    /// The downstream HTLC was fulfilled with this R: the upstream one is fulfilled with it.
    Fulfilled(wire::Preimage),
    /// The downstream HTLC failed: the upstream one is routefailed.
    Failed,
}

impl ForwardState {
    /// Its name in the store and in `listforwards`.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            ForwardState::Offered => "offered",
            ForwardState::Fulfilled(_) => "fulfilled",
            ForwardState::Failed => "failed",
        }
    }
}

/// One wallet output.
#[derive(Debug, Clone)]
pub(crate) struct OutputRow {
    pub outpoint: OutPoint,
    pub amount_sat: u64,
    pub branch: u32,
    pub index: u32,
    pub height: u32,
    /// Paid by a coinbase: spendable only at [`COINBASE_MATURITY`] confirmations.
    pub coinbase: bool,
}

/// Confirmations a coinbase output needs before consensus lets it be spent.
pub(crate) const COINBASE_MATURITY: i64 = 100;

impl OutputRow {
    /// Confirmations at scanned height `tip`.
    pub(crate) fn confirmations(&self, tip: i64) -> i64 {
        (tip - i64::from(self.height) + 1).max(0)
    }

    /// Whether a transaction spending it can enter the block after `tip`.
    pub(crate) fn spendable(&self, tip: i64) -> bool {
        !self.coinbase || self.confirmations(tip) >= COINBASE_MATURITY
    }
}

/// A transaction waiting to be broadcast (or to confirm).
#[derive(Debug, Clone)]
pub(crate) struct BroadcastRow {
    pub txid: Txid,
    pub channel_id: ChannelId,
    pub tx: Transaction,
    pub csv_blocks: u32,
    pub lock_time: u32,
}

/// The schema, one migration per change (`crates/node/migrations/sqlite`). The first is
/// the schema string the node ran before it had migrations, every statement `IF NOT
/// EXISTS`: a database made by that string records it without a change.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// The `num` under which a migrated channel's old history is archived (an SQLite
/// integer cannot hold [`channel::Migrated::LEGACY_HISTORY`]; no commitment reaches it).
const LEGACY_HISTORY_NUM: i64 = -1;

/// The node's database.
#[derive(Clone)]
pub(crate) struct Store {
    /// The one connection, taken in turn by the writer and the readers.
    db: Db,
    /// The group-commit writer of channel states (see [`Store::save_channel`]).
    writes: tokio::sync::mpsc::Sender<WriteRequest>,
    /// Whether the broadcast queue is known to be empty (the watcher asks every pass).
    broadcasts: std::sync::Arc<Emptiness>,
    /// Bumped after every change of the stored peers (the reconnect loop re-reads them then).
    peers_epoch: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// Tells a reader of a table polled every pass (the broadcast queue) that it is still
/// empty, so that an idle node does not query it four times a second.
///
/// Every write that may add a row bumps `epoch` after it committed; a reader that found no
/// row records the epoch it read before its query. A write that committed after that read
/// has bumped the epoch since, so the reader queries again: a row is never missed, at
/// worst a query is not saved.
#[derive(Default)]
struct Emptiness {
    epoch: std::sync::atomic::AtomicU64,
    /// `epoch + 1` when a query at `epoch` found nothing; 0 when unknown.
    empty_at: std::sync::atomic::AtomicU64,
}

impl Emptiness {
    /// The epoch to read at, and whether the table is known to be empty at it.
    fn read(&self) -> (u64, bool) {
        use std::sync::atomic::Ordering::SeqCst;
        let epoch = self.epoch.load(SeqCst);
        (epoch, self.empty_at.load(SeqCst) == epoch + 1)
    }

    /// A query begun at `epoch` found nothing.
    fn found_empty(&self, epoch: u64) {
        self.empty_at
            .store(epoch + 1, std::sync::atomic::Ordering::SeqCst);
    }

    /// A write that may have added rows committed.
    fn added(&self) {
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The node id a channel row names.
fn peer_of(channel: ChannelId, peer_id: String) -> Result<PublicKey, StoreError> {
    peer_id
        .parse()
        .map_err(|_| StoreError::BadPeerId { channel, peer_id })
}

/// WAL frames after which SQLite checkpoints (its default is 1,000); see [`Store::open`].
const WAL_AUTOCHECKPOINT: &str = "10000";

impl Store {
    /// Opens (creating) `<data_dir>/node.sqlite`.
    ///
    /// # Errors
    /// [`StoreError::Sql`] also when another process has the database open: the node owns
    /// its data directory (below).
    pub(crate) async fn open(data_dir: &Path) -> Result<Store, StoreError> {
        let path = data_dir.join("node.sqlite");
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            // One process owns its database, through one connection that keeps SQLite's
            // lock from its first statement to its close: a transaction then takes no lock
            // (no `fcntl` per commit or read, where two or more connections took a few
            // each), and WAL keeps its index in the connection's memory instead of a
            // shared-memory file. A second process opening the data directory waits
            // `busy_timeout` and fails instead of writing beside the node.
            .locking_mode(SqliteLockingMode::Exclusive)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a committed write survives a power cut, not only kill -9.
            .synchronous(SqliteSynchronous::Full)
            // A checkpoint copies each page the WAL holds once, to scattered places of the
            // database file (one block request each) and flushes it. The pages a busy node
            // rewrites are few (one per channel, a few of records), so a checkpoint every
            // 10,000 frames (a WAL of ~40 MiB) instead of 1,000 copies them a tenth as
            // often: on hub_bench, 100 busy channels, `pwrite`+`pread` per pair 11.1 → 10.2
            // and CPU per pair about 2.5 % less. Recovery after a crash reads the WAL.
            .pragma("wal_autocheckpoint", WAL_AUTOCHECKPOINT)
            .busy_timeout(std::time::Duration::from_secs(10));
        // The one connection serves the group-commit writer, the watcher's pass, the
        // reconnect loop and the control API in turn (a fair lock, not a pool); it is never
        // closed while the store lives (a new one would have to wait for the old one's lock
        // and lose the writer's TEMP view).
        let mut conn = sqlx::ConnectOptions::connect(&options).await?;
        sqlx::Executor::execute(&mut conn, WRITER_SETUP).await?;
        MIGRATOR.run(&mut conn).await?;
        let db = Db::new(conn);
        let (writes, rx) = tokio::sync::mpsc::channel(4 * GROUP_MAX);
        tokio::spawn(group_writer(db.clone(), rx, WalAhead::of(&path)));
        Ok(Store {
            db,
            writes,
            broadcasts: std::sync::Arc::default(),
            peers_epoch: std::sync::Arc::default(),
        })
    }

    /// Closes the database (waiting for a statement that runs), releasing its lock; every
    /// later call fails. A process ending does the same (the harness's restart calls it).
    #[cfg(test)]
    pub(crate) async fn close(&self) {
        self.db.close().await;
    }

    pub(crate) async fn meta(&self, key: MetaKey) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT value FROM meta WHERE key = ?")
            .bind(key.name())
            .fetch_optional(&mut *self.db.lock().await?)
            .await?;
        Ok(row.map(|r| r.get::<i64, _>(0)).unwrap_or(0))
    }

    pub(crate) async fn set_meta(&self, key: MetaKey, value: i64) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value")
            .bind(key.name())
            .bind(value)
            .execute(&mut *self.db.lock().await?)
            .await?;
        Ok(())
    }

    /// Takes the next value of a counter (atomically).
    pub(crate) async fn next_index(&self, key: MetaKey) -> Result<u32, StoreError> {
        let row = sqlx::query(
            "INSERT INTO meta (key, value) VALUES (?, 1) ON CONFLICT(key) DO UPDATE SET value = value + 1 RETURNING value",
        )
        .bind(key.name())
        .fetch_one(&mut *self.db.lock().await?)
        .await?;
        let v: i64 = row.get(0);
        Ok(u32::try_from(v - 1).unwrap_or(u32::MAX))
    }

    /// Remembers where we dialled a peer (the reconnect loop dials it again).
    pub(crate) async fn save_peer(
        &self,
        node_id: &PublicKey,
        address: std::net::SocketAddr,
    ) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO peers (node_id, address) VALUES (?, ?) ON CONFLICT(node_id) DO UPDATE SET address = excluded.address")
            .bind(node_id.to_string())
            .bind(address.to_string())
            .execute(&mut *self.db.lock().await?)
            .await?;
        self.peers_changed();
        Ok(())
    }

    fn peers_changed(&self) {
        self.peers_epoch
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Changes with every write to the stored peers: read it before [`Store::peers`].
    pub(crate) fn peers_epoch(&self) -> u64 {
        self.peers_epoch.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The peers we dialled and where (a row that does not parse is skipped: it only
    /// costs a reconnect).
    pub(crate) async fn peers(&self) -> Result<Vec<(PublicKey, std::net::SocketAddr)>, StoreError> {
        let rows = sqlx::query("SELECT node_id, address FROM peers")
            .fetch_all(&mut *self.db.lock().await?)
            .await?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let id = r.get::<String, _>(0).parse().ok()?;
                let address = r.get::<String, _>(1).parse().ok()?;
                Some((id, address))
            })
            .collect())
    }

    pub(crate) async fn insert_channel(
        &self,
        id: ChannelId,
        peer: &PublicKey,
        channel: &Channel,
    ) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO channels (id, peer_id, snapshot) VALUES (?, ?, ?)")
            .bind(id.0)
            .bind(peer.to_string())
            .bind(encode_snapshot(id, channel)?)
            .execute(&mut *self.db.lock().await?)
            .await?;
        Ok(())
    }

    /// TEST ONLY: a channel row whose peer id is whatever `peer_id` says.
    #[cfg(test)]
    pub(crate) async fn insert_channel_as(
        &self,
        id: ChannelId,
        peer_id: &str,
        channel: &Channel,
    ) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO channels (id, peer_id, snapshot) VALUES (?, ?, ?)")
            .bind(id.0)
            .bind(peer_id)
            .bind(encode_snapshot(id, channel)?)
            .execute(&mut *self.db.lock().await?)
            .await?;
        Ok(())
    }

    /// Writes the channel's state durably, with the revoked-commitment records that leave
    /// it (`channel` crate's `Action::Archive`) in the same commit; returns once committed.
    /// Concurrent callers share commits (group commit, [`group_writer`]).
    pub(crate) async fn save_channel(
        &self,
        id: ChannelId,
        channel: &Channel,
        revoked: &[channel::RevokedCommitment],
    ) -> Result<(), StoreError> {
        let snapshot = encode_snapshot(id, channel)?;
        let revoked = revoked
            .iter()
            .map(|r| {
                serde_json::to_string(r)
                    .map(|json| (i64::try_from(r.commitment_number).unwrap_or(i64::MAX), json))
                    .map_err(|source| StoreError::Encode { id, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (done, answer) = tokio::sync::oneshot::channel();
        let request = WriteRequest {
            id,
            snapshot,
            revoked,
            done,
        };
        self.writes
            .send(request)
            .await
            .map_err(|_| StoreError::WriterStopped)?;
        answer
            .await
            .map_err(|_| StoreError::WriterStopped)?
            .map_err(StoreError::Write)
    }

    /// Forgets a channel that never got an anchor on chain, and frees the outputs it had reserved.
    pub(crate) async fn abandon_channel(
        &self,
        id: ChannelId,
        anchor: Option<Txid>,
        kind: crate::manager::Abandoned,
    ) -> Result<(), StoreError> {
        let mut conn = self.db.lock().await?;
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        sqlx::query("UPDATE channels SET abandoned = ? WHERE id = ?")
            .bind(kind as i64)
            .bind(id.0)
            .execute(&mut *tx)
            .await?;
        if let Some(anchor) = anchor {
            sqlx::query("UPDATE outputs SET spent_by = NULL WHERE spent_by = ?")
                .bind(anchor.to_string())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Ids of the channels abandoned before they went live.
    pub(crate) async fn abandoned_openings(&self) -> Result<Vec<ChannelId>, StoreError> {
        let rows = sqlx::query("SELECT id FROM channels WHERE abandoned = 1")
            .fetch_all(&mut *self.db.lock().await?)
            .await?;
        Ok(rows.iter().map(|r| ChannelId(r.get(0))).collect())
    }

    /// Forgets the stored address of a peer (no channel needs reconnecting to it).
    pub(crate) async fn forget_peer(&self, node_id: &PublicKey) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM peers WHERE node_id = ?")
            .bind(node_id.to_string())
            .execute(&mut *self.db.lock().await?)
            .await?;
        self.peers_changed();
        Ok(())
    }

    pub(crate) async fn channels(&self) -> Result<Vec<ChannelRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, peer_id, snapshot FROM channels WHERE abandoned = 0 ORDER BY id",
        )
        .fetch_all(&mut *self.db.lock().await?)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let id = ChannelId(r.get(0));
            let snapshot: Vec<u8> = r.get(2);
            let decoded = decode_snapshot(id, &snapshot)?;
            if decoded.version < SNAPSHOT_VERSION {
                // Upgrade in place, the old history archived first: one transaction, so
                // a crash leaves either the old snapshot or the new one with its history.
                let mut conn = self.db.lock().await?;
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                if let Some(history) = &decoded.legacy_history {
                    sqlx::query("INSERT INTO revoked_commitments (channel_id, num, record) VALUES (?, ?, ?) ON CONFLICT(channel_id, num) DO UPDATE SET record = excluded.record")
                        .bind(id.0)
                        .bind(LEGACY_HISTORY_NUM)
                        .bind(serde_json::to_string(history).map_err(|source| StoreError::Encode { id, source })?)
                        .execute(&mut *tx)
                        .await?;
                }
                sqlx::query("UPDATE channels SET snapshot = ? WHERE id = ?")
                    .bind(encode_snapshot(id, &decoded.channel)?)
                    .bind(id.0)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                tracing::info!(
                    channel = %id,
                    from = decoded.version,
                    to = SNAPSHOT_VERSION,
                    "channel snapshot upgraded"
                );
            }
            out.push(ChannelRow {
                id,
                peer: peer_of(id, r.get(1))?,
                channel: decoded.channel,
            });
        }
        Ok(out)
    }

    pub(crate) async fn add_output(&self, o: &OutputRow) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO outputs (txid, vout, amount_sat, branch, idx, height, coinbase) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(txid, vout) DO UPDATE SET height = excluded.height")
            .bind(o.outpoint.txid.to_string())
            .bind(o.outpoint.vout)
            .bind(i64::try_from(o.amount_sat).unwrap_or(i64::MAX))
            .bind(o.branch)
            .bind(o.index)
            .bind(o.height)
            .bind(o.coinbase)
            .execute(&mut *self.db.lock().await?)
            .await?;
        Ok(())
    }

    /// Marks outputs as spent by `txid` (a broadcast of ours or a spend seen on chain).
    pub(crate) async fn spend_outputs(
        &self,
        outpoints: &[OutPoint],
        txid: &Txid,
    ) -> Result<(), StoreError> {
        let mut conn = self.db.lock().await?;
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        for op in outpoints {
            sqlx::query("UPDATE outputs SET spent_by = ? WHERE txid = ? AND vout = ?")
                .bind(txid.to_string())
                .bind(op.txid.to_string())
                .bind(op.vout)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Unspent outputs a transaction may spend now (immature coinbases left out).
    pub(crate) async fn spendable_outputs(&self) -> Result<Vec<OutputRow>, StoreError> {
        let tip = self.meta(MetaKey::ScannedHeight).await?;
        let mut outputs = self.outputs(true).await?;
        outputs.retain(|o| o.spendable(tip));
        Ok(outputs)
    }

    pub(crate) async fn outputs(&self, unspent_only: bool) -> Result<Vec<OutputRow>, StoreError> {
        let sql = if unspent_only {
            "SELECT txid, vout, amount_sat, branch, idx, height, coinbase FROM outputs WHERE spent_by IS NULL ORDER BY height, txid, vout"
        } else {
            "SELECT txid, vout, amount_sat, branch, idx, height, coinbase FROM outputs ORDER BY height, txid, vout"
        };
        let rows = sqlx::query(sql)
            .fetch_all(&mut *self.db.lock().await?)
            .await?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let txid = Txid::from_str(&r.get::<String, _>(0)).ok()?;
                Some(OutputRow {
                    outpoint: OutPoint {
                        txid,
                        vout: r.get(1),
                    },
                    amount_sat: u64::try_from(r.get::<i64, _>(2)).ok()?,
                    branch: r.get(3),
                    index: r.get(4),
                    height: r.get(5),
                    coinbase: r.get(6),
                })
            })
            .collect())
    }

    pub(crate) async fn queue_broadcast(
        &self,
        channel_id: ChannelId,
        tx: &Transaction,
        csv_blocks: u32,
        lock_time: u32,
    ) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO broadcasts (txid, channel_id, tx, csv_blocks, lock_time) VALUES (?, ?, ?, ?, ?) ON CONFLICT(txid) DO NOTHING")
            .bind(tx.compute_txid().to_string())
            .bind(channel_id.0)
            .bind(encode::serialize_hex(tx))
            .bind(csv_blocks)
            .bind(lock_time)
            .execute(&mut *self.db.lock().await?)
            .await?;
        self.broadcasts.added();
        Ok(())
    }

    pub(crate) async fn pending_broadcasts(&self) -> Result<Vec<BroadcastRow>, StoreError> {
        let (epoch, empty) = self.broadcasts.read();
        if empty {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(
            "SELECT tx, csv_blocks, lock_time, channel_id FROM broadcasts WHERE done = 0 ORDER BY rowid",
        )
        .fetch_all(&mut *self.db.lock().await?)
        .await?;
        if rows.is_empty() {
            self.broadcasts.found_empty(epoch);
        }
        Ok(rows
            .iter()
            .filter_map(|r| {
                let tx: Transaction = encode::deserialize_hex(&r.get::<String, _>(0)).ok()?;
                Some(BroadcastRow {
                    txid: tx.compute_txid(),
                    tx,
                    csv_blocks: r.get(1),
                    lock_time: r.get(2),
                    channel_id: ChannelId(r.get(3)),
                })
            })
            .collect())
    }

    /// The broadcast is confirmed, or can never be (its inputs went elsewhere), as of the
    /// block at `height` (`done` keeps that height, so a reorganisation below it reopens it).
    pub(crate) async fn broadcast_done(&self, txid: &Txid, height: u32) -> Result<(), StoreError> {
        sqlx::query("UPDATE broadcasts SET done = ? WHERE txid = ?")
            .bind(height.max(1))
            .bind(txid.to_string())
            .execute(&mut *self.db.lock().await?)
            .await?;
        Ok(())
    }

    /// A queued claim replaced by a re-signed version at a higher fee: never sent again
    /// (`done` −1, which no reorganisation reopens; the replacement carries the claim on).
    pub(crate) async fn broadcast_superseded(&self, txid: &Txid) -> Result<(), StoreError> {
        sqlx::query("UPDATE broadcasts SET done = -1 WHERE txid = ? AND done = 0")
            .bind(txid.to_string())
            .execute(&mut *self.db.lock().await?)
            .await?;
        Ok(())
    }

    /// Remembers the hash of the block scanned at `height` (the fork point after a
    /// reorganisation, also one that happened while the node was down).
    pub(crate) async fn set_block_hash(
        &self,
        height: u32,
        hash: &bitcoin::BlockHash,
    ) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO block_hashes (height, hash) VALUES (?, ?) ON CONFLICT(height) DO UPDATE SET hash = excluded.hash")
            .bind(height)
            .bind(hash.to_string())
            .execute(&mut *self.db.lock().await?)
            .await?;
        Ok(())
    }

    /// The hash of the block scanned at `height`, if recorded.
    pub(crate) async fn block_hash(
        &self,
        height: u32,
    ) -> Result<Option<bitcoin::BlockHash>, StoreError> {
        let row = sqlx::query("SELECT hash FROM block_hashes WHERE height = ?")
            .bind(height)
            .fetch_optional(&mut *self.db.lock().await?)
            .await?;
        Ok(row.and_then(|r| r.get::<String, _>(0).parse().ok()))
    }

    /// Remembers that the block `hash` at `height` holds `txid`, a transaction the node
    /// follows: Core finds a confirmed transaction without `-txindex` only by its block.
    pub(crate) async fn record_tx_block(
        &self,
        txid: &Txid,
        height: u32,
        hash: &bitcoin::BlockHash,
    ) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO tx_blocks (txid, height, hash) VALUES (?, ?, ?) ON CONFLICT(txid) DO UPDATE SET height = excluded.height, hash = excluded.hash")
            .bind(txid.to_string())
            .bind(height)
            .bind(hash.to_string())
            .execute(&mut *self.db.lock().await?)
            .await?;
        Ok(())
    }

    /// The block the scan last found `txid` in, if it recorded one.
    pub(crate) async fn tx_block(
        &self,
        txid: &Txid,
    ) -> Result<Option<bitcoin::BlockHash>, StoreError> {
        let row = sqlx::query("SELECT hash FROM tx_blocks WHERE txid = ?")
            .bind(txid.to_string())
            .fetch_optional(&mut *self.db.lock().await?)
            .await?;
        Ok(row.and_then(|r| r.get::<String, _>(0).parse().ok()))
    }

    /// Forgets the block recorded for `txid`, as a database written by a release that
    /// did not record blocks holds none (the tests of a chain without the index).
    #[cfg(test)]
    pub(crate) async fn forget_tx_block(&self, txid: &Txid) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM tx_blocks WHERE txid = ?")
            .bind(txid.to_string())
            .execute(&mut *self.db.lock().await?)
            .await?;
        Ok(())
    }

    /// Undoes what the blocks above `fork` did, in one transaction: their outputs go (a
    /// rescan adds back those the new branch holds), outputs they spent (`spent_by` one of
    /// `gone`) are unspent, broadcasts they confirmed are pending again (claims and
    /// penalties are re-sent), the transactions recorded in them lose their block (a
    /// rescan records the new branch's), and their hashes are forgotten.
    pub(crate) async fn rewind(&self, fork: u32, gone: &[Txid]) -> Result<(), StoreError> {
        let mut conn = self.db.lock().await?;
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        sqlx::query("DELETE FROM outputs WHERE height > ?")
            .bind(fork)
            .execute(&mut *tx)
            .await?;
        for txid in gone {
            sqlx::query("UPDATE outputs SET spent_by = NULL WHERE spent_by = ?")
                .bind(txid.to_string())
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("UPDATE broadcasts SET done = 0 WHERE done > ?")
            .bind(fork)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM tx_blocks WHERE height > ?")
            .bind(fork)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM block_hashes WHERE height > ?")
            .bind(fork)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        // Broadcasts the replaced blocks confirmed are pending again.
        self.broadcasts.added();
        Ok(())
    }

    /// Stores a new invoice; false (nothing written) when its label or hash exists already.
    pub(crate) async fn add_invoice(&self, inv: &InvoiceRow) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO invoices (label, r_hash, r, amount_msat, created_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        )
        .bind(&inv.label)
        .bind(hex::encode(inv.r.hash().as_byte_array()))
        .bind(hex::encode(inv.r.0))
        .bind(i64::from(inv.amount_msat))
        .bind(i64::try_from(inv.created_at).unwrap_or(i64::MAX))
        .execute(&mut *self.db.lock().await?)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The fulfil of the HTLC that paid the invoice of `r_hash` completed.
    pub(crate) async fn mark_invoice_settled(
        &self,
        r_hash: &wire::Sha256,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE invoices SET settled = 1 WHERE r_hash = ? AND paid_channel IS NOT NULL",
        )
        .bind(hex::encode(r_hash.as_byte_array()))
        .execute(&mut *self.db.lock().await?)
        .await?;
        Ok(())
    }

    /// Every invoice, oldest first.
    pub(crate) async fn invoices(&self) -> Result<Vec<InvoiceRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT label, r, amount_msat, created_at, paid_channel, paid_msat, paid_at, settled FROM invoices ORDER BY created_at, label",
        )
        .fetch_all(&mut *self.db.lock().await?)
        .await?;
        rows.iter()
            .map(|row| {
                let label: String = row.get(0);
                let corrupt =
                    |what: &str| StoreError::CorruptInvoice(label.clone(), what.to_owned());
                let r = hex::decode(row.get::<String, _>(1))
                    .ok()
                    .and_then(|b| <[u8; 32]>::try_from(b).ok())
                    .ok_or_else(|| corrupt("r"))?;
                let amount_msat =
                    u32::try_from(row.get::<i64, _>(2)).map_err(|_| corrupt("amount_msat"))?;
                let paid = match (
                    row.get::<Option<i64>, _>(4),
                    row.get::<Option<i64>, _>(5),
                    row.get::<Option<i64>, _>(6),
                ) {
                    (Some(channel), Some(msat), Some(at)) => Some(InvoicePaid {
                        channel: ChannelId(channel),
                        amount_msat: u32::try_from(msat).map_err(|_| corrupt("paid_msat"))?,
                        at: u64::try_from(at).unwrap_or(0),
                        settled: row.get::<i64, _>(7) != 0,
                    }),
                    _ => None,
                };
                Ok(InvoiceRow {
                    label: label.clone(),
                    r: wire::Preimage(r),
                    amount_msat,
                    created_at: u64::try_from(row.get::<i64, _>(3)).unwrap_or(0),
                    paid,
                })
            })
            .collect()
    }

    /// Marks the invoice of `r_hash` paid by an HTLC on `paid.channel`; false (nothing
    /// written) when it is unknown or paid already.
    pub(crate) async fn mark_invoice_paid(
        &self,
        r_hash: &wire::Sha256,
        paid: &InvoicePaid,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE invoices SET paid_channel = ?, paid_msat = ?, paid_at = ? WHERE r_hash = ? AND paid_channel IS NULL",
        )
        .bind(paid.channel.0)
        .bind(i64::from(paid.amount_msat))
        .bind(i64::try_from(paid.at).unwrap_or(i64::MAX))
        .bind(hex::encode(r_hash.as_byte_array()))
        .execute(&mut *self.db.lock().await?)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Stores a new forward; false (nothing written) when the incoming HTLC has one.
    pub(crate) async fn add_forward(&self, f: &ForwardRow) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO forwards (in_channel, r_hash, in_msat, out_channel, out_peer, out_msat, out_expiry, onion, state, r, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?) ON CONFLICT DO NOTHING",
        )
        .bind(f.in_channel.0)
        .bind(hex::encode(f.r_hash.as_byte_array()))
        .bind(i64::from(f.in_msat))
        .bind(f.out_channel.0)
        .bind(f.out_peer.to_string())
        .bind(i64::from(f.out_msat))
        .bind(i64::from(f.out_expiry))
        .bind(&f.onion.as_bytes()[..])
        .bind(f.state.as_str())
        .bind(i64::try_from(f.created_at).unwrap_or(i64::MAX))
        .execute(&mut *self.db.lock().await?)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records how the forward of `r_hash` from `in_channel` ended downstream.
    pub(crate) async fn set_forward_state(
        &self,
        in_channel: ChannelId,
        r_hash: &wire::Sha256,
        state: ForwardState,
    ) -> Result<(), StoreError> {
        let r = match state {
            ForwardState::Fulfilled(r) => Some(hex::encode(r.0)),
            _ => None,
        };
        sqlx::query("UPDATE forwards SET state = ?, r = ? WHERE in_channel = ? AND r_hash = ?")
            .bind(state.as_str())
            .bind(r)
            .bind(in_channel.0)
            .bind(hex::encode(r_hash.as_byte_array()))
            .execute(&mut *self.db.lock().await?)
            .await?;
        Ok(())
    }

    /// Every forward, oldest first.
    pub(crate) async fn forwards(&self) -> Result<Vec<ForwardRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT in_channel, r_hash, in_msat, out_channel, out_peer, out_msat, out_expiry, onion, state, r, created_at FROM forwards ORDER BY created_at, in_channel, r_hash",
        )
        .fetch_all(&mut *self.db.lock().await?)
        .await?;
        rows.iter().map(forward_row).collect()
    }

    /// Keeps what the penalty needs for the peer's revoked commitment (channel crate's
    /// `Action::Archive`), out of the channel snapshot.
    pub(crate) async fn save_revoked(
        &self,
        channel_id: ChannelId,
        record: &channel::RevokedCommitment,
    ) -> Result<(), StoreError> {
        // A record that cannot be written is an error, never an empty one: the penalty
        // for that revoked commitment would miss its HTLCs.
        let json = serde_json::to_string(record).map_err(|source| StoreError::Encode {
            id: channel_id,
            source,
        })?;
        sqlx::query("INSERT INTO revoked_commitments (channel_id, num, record) VALUES (?, ?, ?) ON CONFLICT DO NOTHING")
            .bind(channel_id.0)
            .bind(i64::try_from(record.commitment_number).unwrap_or(i64::MAX))
            .bind(json)
            .execute(&mut *self.db.lock().await?)
            .await?;
        Ok(())
    }

    /// The archived record of the peer's revoked commitment `num`, if any; for a channel
    /// migrated from snapshot version 0 without a record of its own, every HTLC the old
    /// snapshot had seen (a superset: the penalty matches outputs by script).
    pub(crate) async fn revoked(
        &self,
        channel_id: ChannelId,
        num: u64,
    ) -> Result<Option<channel::RevokedCommitment>, StoreError> {
        let row = sqlx::query(
            "SELECT record FROM revoked_commitments WHERE channel_id = ? AND num IN (?, ?) ORDER BY num = ? LIMIT 1",
        )
        .bind(channel_id.0)
        .bind(i64::try_from(num).unwrap_or(i64::MAX))
        .bind(LEGACY_HISTORY_NUM)
        .bind(LEGACY_HISTORY_NUM)
        .fetch_optional(&mut *self.db.lock().await?)
        .await?;
        row.map(|r| {
            serde_json::from_str::<channel::RevokedCommitment>(&r.get::<String, _>(0))
                .map(|mut record| {
                    record.commitment_number = num;
                    record
                })
                .map_err(|source| StoreError::Undecodable {
                    id: channel_id,
                    source,
                })
        })
        .transpose()
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) async fn save_revoked_for_tests(
        &self,
        channel_id: ChannelId,
        num: u64,
        tx: &Transaction,
    ) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO revoked_for_tests (channel_id, num, tx) VALUES (?, ?, ?) ON CONFLICT DO NOTHING")
            .bind(channel_id.0)
            .bind(i64::try_from(num).unwrap_or(i64::MAX))
            .bind(encode::serialize_hex(tx))
            .execute(&mut *self.db.lock().await?)
            .await?;
        Ok(())
    }

    /// The oldest commitment of ours saved for the test-only cheat, below `below`.
    #[cfg(feature = "test-hooks")]
    pub(crate) async fn revoked_for_tests(
        &self,
        channel_id: ChannelId,
        below: u64,
    ) -> Result<Option<Transaction>, StoreError> {
        let row = sqlx::query("SELECT tx FROM revoked_for_tests WHERE channel_id = ? AND num < ? ORDER BY num LIMIT 1")
            .bind(channel_id.0)
            .bind(i64::try_from(below).unwrap_or(i64::MAX))
            .fetch_optional(&mut *self.db.lock().await?)
            .await?;
        Ok(row.and_then(|r| encode::deserialize_hex(&r.get::<String, _>(0)).ok()))
    }
}

/// A `forwards` row read back.
fn forward_row(row: &sqlx::sqlite::SqliteRow) -> Result<ForwardRow, StoreError> {
    let r_hash_hex: String = row.get(1);
    let corrupt = |what: &str| StoreError::CorruptForward(r_hash_hex.clone(), what.to_owned());
    let bytes32 = |hex_text: &str| {
        hex::decode(hex_text)
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
    };
    let r_hash = bytes32(&r_hash_hex)
        .map(wire::Sha256::from_byte_array)
        .ok_or_else(|| corrupt("r_hash"))?;
    let msat =
        |i: usize, what: &str| u32::try_from(row.get::<i64, _>(i)).map_err(|_| corrupt(what));
    let onion: Vec<u8> = row.get(7);
    let onion = <Box<[u8; wire::Onion::LEN]>>::try_from(onion.into_boxed_slice())
        .map(wire::Onion::new)
        .map_err(|_| corrupt("onion"))?;
    let state = match (
        row.get::<String, _>(8).as_str(),
        row.get::<Option<String>, _>(9),
    ) {
        ("offered", _) => ForwardState::Offered,
        ("failed", _) => ForwardState::Failed,
        ("fulfilled", Some(r)) => {
            ForwardState::Fulfilled(wire::Preimage(bytes32(&r).ok_or_else(|| corrupt("r"))?))
        }
        _ => return Err(corrupt("state")),
    };
    Ok(ForwardRow {
        in_channel: ChannelId(row.get(0)),
        r_hash,
        in_msat: msat(2, "in_msat")?,
        out_channel: ChannelId(row.get(3)),
        out_peer: row
            .get::<String, _>(4)
            .parse()
            .map_err(|_| corrupt("out_peer"))?,
        out_msat: msat(5, "out_msat")?,
        out_expiry: u32::try_from(row.get::<i64, _>(6)).map_err(|_| corrupt("out_expiry"))?,
        onion,
        state,
        created_at: u64::try_from(row.get::<i64, _>(10)).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Channel {
        let secrets = channel::ChannelSecrets {
            commit_key: secp256k1::SecretKey::from_slice(&[1; 32]).unwrap(),
            final_key: secp256k1::SecretKey::from_slice(&[2; 32]).unwrap(),
            revocation_seed: [3; 32],
        };
        Channel::new(
            channel::ChannelConfig::default(),
            secrets,
            channel::AnchorRole::Accept,
        )
    }

    fn test_peer() -> PublicKey {
        let key = secp256k1::SecretKey::from_slice(&[4; 32]).unwrap();
        PublicKey::from_secret_key(&secp256k1::Secp256k1::signing_only(), &key)
    }

    fn request(id: i64, snapshot: &str, revoked: &[i64]) -> WriteRequest {
        WriteRequest {
            id: ChannelId(id),
            snapshot: snapshot.as_bytes().to_vec(),
            revoked: revoked
                .iter()
                .map(|n| (*n, format!("record {n}")))
                .collect(),
            done: tokio::sync::oneshot::channel().0,
        }
    }

    async fn snapshot_of(store: &Store, id: i64) -> String {
        let bytes: Vec<u8> = sqlx::query("SELECT snapshot FROM channels WHERE id = ?")
            .bind(id)
            .fetch_one(&mut *store.db.lock().await.unwrap())
            .await
            .unwrap()
            .get(0);
        String::from_utf8(bytes).unwrap()
    }

    async fn write(
        conn: &mut sqlx::SqliteConnection,
        batch: &[WriteRequest],
        statements: bool,
    ) -> Result<(), sqlx::Error> {
        if statements {
            write_group_statements(conn, batch).await
        } else {
            write_group(conn, batch).await
        }
    }

    /// A group is one command: every write and record in it commits, and a failure in the
    /// middle leaves nothing of the group and no open transaction. Both forms: the single
    /// statement into the writer's view, and the multi-statement transaction of large groups.
    #[tokio::test]
    async fn a_group_commits_whole_or_not_at_all_and_the_next_one_starts_clean() {
        for statements in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(dir.path()).await.unwrap();
            for id in [1, 2] {
                store
                    .insert_channel(ChannelId(id), &test_peer(), &sample())
                    .await
                    .unwrap();
            }
            // The store's one connection, taken per write (it serves the reads too).
            let conn = || async { store.db.lock().await.unwrap() };
            let group = [request(1, "one-a", &[5, 6]), request(2, "two-a", &[5])];
            write(&mut *conn().await, &group, statements).await.unwrap();
            assert_eq!(snapshot_of(&store, 1).await, "one-a");
            assert_eq!(snapshot_of(&store, 2).await, "two-a");
            let records = || async {
                sqlx::query_as::<_, (i64, i64, String)>(
                    "SELECT channel_id, num, record FROM revoked_commitments ORDER BY channel_id, num",
                )
                .fetch_all(&mut *store.db.lock().await.unwrap())
                .await
                .unwrap()
            };
            let first = vec![
                (1, 5, "record 5".to_owned()),
                (1, 6, "record 6".to_owned()),
                (2, 5, "record 5".to_owned()),
            ];
            assert_eq!(records().await, first);

            // Channel 2's write is refused after channel 1's ran inside the same commit.
            sqlx::raw_sql("CREATE TRIGGER refuse BEFORE UPDATE ON channels WHEN NEW.snapshot = CAST('two-b' AS BLOB) BEGIN SELECT RAISE(ABORT, 'refused'); END;")
                .execute(&mut *store.db.lock().await.unwrap())
                .await
                .unwrap();
            let group = [request(1, "one-b", &[]), request(2, "two-b", &[7])];
            assert!(write(&mut *conn().await, &group, statements).await.is_err());
            assert_eq!(snapshot_of(&store, 1).await, "one-a");
            assert_eq!(snapshot_of(&store, 2).await, "two-a");
            assert_eq!(records().await, first);
            sqlx::raw_sql("DROP TRIGGER refuse")
                .execute(&mut *store.db.lock().await.unwrap())
                .await
                .unwrap();
            // Not left inside the failed transaction: the next writes commit (and other
            // connections see them).
            write(&mut *conn().await, &[request(2, "two-c", &[7])], statements)
                .await
                .unwrap();
            assert_eq!(snapshot_of(&store, 2).await, "two-c");
            assert_eq!(records().await.len(), 4);
            write(&mut *conn().await, &[request(1, "one-c", &[])], statements)
                .await
                .unwrap();
            assert_eq!(snapshot_of(&store, 1).await, "one-c");
        }
    }

    /// Groups of 2 to 40 channel writes commit through one prepared statement per power of
    /// two, kept by sqlx (a new shape per group was prepared every commit), and the rows
    /// that pad a group to its shape write nothing: no snapshot, no record.
    #[tokio::test]
    async fn groups_share_a_prepared_statement_per_shape_and_padding_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        for id in 1..=40 {
            store
                .insert_channel(ChannelId(id), &test_peer(), &sample())
                .await
                .unwrap();
        }
        let mut conn = store.db.lock().await.unwrap();
        let before = sqlx::Connection::cached_statements_size(&*conn);
        for n in 2..=40 {
            let group: Vec<_> = (1..=n)
                .map(|id| request(id, &format!("s{n}-{id}"), &[]))
                .collect();
            write_group(&mut conn, &group).await.unwrap();
        }
        let shapes = sqlx::Connection::cached_statements_size(&*conn) - before;
        assert_eq!(shapes, 6, "2, 4, 8, 16, 32 and 64 rows");
        // Channel 3 with two records: 3 rows in a statement of 4.
        write_group(&mut conn, &[request(3, "three", &[5, 6])])
            .await
            .unwrap();
        drop(conn);
        assert_eq!(snapshot_of(&store, 3).await, "three");
        for id in (1..=40).filter(|id| *id != 3) {
            assert_eq!(snapshot_of(&store, id).await, format!("s40-{id}"));
        }
        let records = sqlx::query_as::<_, (i64, i64)>(
            "SELECT channel_id, num FROM revoked_commitments ORDER BY channel_id, num",
        )
        .fetch_all(&mut *store.db.lock().await.unwrap())
        .await
        .unwrap();
        assert_eq!(records, vec![(3, 5), (3, 6)]);
    }

    fn claim(n: u8) -> Transaction {
        use bitcoin::hashes::Hash as _;
        Transaction {
            version: bitcoin::transaction::Version::TWO,
            lock_time: bitcoin::absolute::LockTime::ZERO,
            input: vec![bitcoin::TxIn {
                previous_output: bitcoin::OutPoint::new(bitcoin::Txid::from_byte_array([n; 32]), 0),
                ..Default::default()
            }],
            output: Vec::new(),
        }
    }

    /// A database made by the schema string the node ran before it had migrations (copied
    /// here as it was) opens under the migrator and keeps its channels and counters.
    #[tokio::test]
    async fn a_database_made_by_the_old_schema_string_opens_and_keeps_its_channels() {
        const OLD_SCHEMA: &str = include_str!("../../migrations/sqlite/0001_initial.sql");
        let dir = tempfile::tempdir().unwrap();
        {
            let options = SqliteConnectOptions::new()
                .filename(dir.path().join("node.sqlite"))
                .create_if_missing(true);
            let mut conn: sqlx::SqliteConnection =
                sqlx::ConnectOptions::connect(&options).await.unwrap();
            sqlx::raw_sql(OLD_SCHEMA).execute(&mut conn).await.unwrap();
            let snapshot = encode_snapshot(ChannelId(3), &sample()).unwrap();
            sqlx::query("INSERT INTO channels (id, peer_id, snapshot) VALUES (3, ?, ?)")
                .bind(test_peer().to_string())
                .bind(snapshot)
                .execute(&mut conn)
                .await
                .unwrap();
            sqlx::query("INSERT INTO meta (key, value) VALUES ('next_channel', 3)")
                .execute(&mut conn)
                .await
                .unwrap();
            sqlx::Connection::close(conn).await.unwrap();
        }
        let store = Store::open(dir.path()).await.unwrap();
        let rows = store.channels().await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].id, ChannelId(3));
        assert_eq!(rows[0].peer, test_peer());
        assert_eq!(store.meta(MetaKey::NextChannel).await.unwrap(), 3);
        // Recorded as applied: opening again runs nothing and keeps it all.
        drop(store);
        let store = Store::open(dir.path()).await.unwrap();
        assert_eq!(store.channels().await.unwrap().len(), 1);
        let applied: i64 = sqlx::query("SELECT COUNT(*) FROM _sqlx_migrations")
            .fetch_one(&mut *store.db.lock().await.unwrap())
            .await
            .unwrap()
            .get(0);
        assert_eq!(applied, MIGRATOR.migrations.len() as i64);
        assert!(
            store.invoices().await.unwrap().is_empty(),
            "later migrations ran"
        );
    }

    /// An invoice is kept across a restart, and marked paid once (issue 30).
    #[tokio::test]
    async fn an_invoice_is_kept_and_paid_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        let inv = InvoiceRow {
            label: "l".into(),
            r: wire::Preimage([3; 32]),
            amount_msat: 7,
            created_at: 1,
            paid: None,
        };
        assert!(store.add_invoice(&inv).await.unwrap());
        assert!(!store.add_invoice(&inv).await.unwrap(), "label taken");
        let paid = InvoicePaid {
            channel: ChannelId(2),
            amount_msat: 9,
            at: 5,
            settled: false,
        };
        let h = inv.r.hash();
        assert!(store.mark_invoice_paid(&h, &paid).await.unwrap());
        let again = InvoicePaid {
            channel: ChannelId(3),
            ..paid
        };
        assert!(
            !store.mark_invoice_paid(&h, &again).await.unwrap(),
            "paid once"
        );
        drop(store);
        let store = Store::open(dir.path()).await.unwrap();
        store.mark_invoice_settled(&h).await.unwrap();
        let read = store.invoices().await.unwrap();
        let settled = InvoicePaid {
            settled: true,
            ..paid
        };
        assert_eq!(
            read,
            vec![InvoiceRow {
                paid: Some(settled),
                ..inv
            }]
        );
    }

    /// A forward is kept across a restart, once per incoming HTLC, and its end with it
    /// (issue 30).
    #[tokio::test]
    async fn a_forward_is_kept_with_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        let key = secp256k1::SecretKey::from_slice(&[5; 32]).unwrap();
        let f = ForwardRow {
            in_channel: ChannelId(2),
            r_hash: wire::Preimage([4; 32]).hash(),
            in_msat: 2_001_020,
            out_channel: ChannelId(3),
            out_peer: PublicKey::from_secret_key(&secp256k1::Secp256k1::new(), &key),
            out_msat: 2_000_000,
            out_expiry: 640,
            onion: wire::Onion::new(Box::new([7; wire::Onion::LEN])),
            state: ForwardState::Offered,
            created_at: 9,
        };
        assert!(store.add_forward(&f).await.unwrap());
        let again = ForwardRow {
            out_msat: 1,
            ..f.clone()
        };
        assert!(!store.add_forward(&again).await.unwrap(), "one per HTLC");
        assert_eq!(store.forwards().await.unwrap(), vec![f.clone()]);
        let done = ForwardState::Fulfilled(wire::Preimage([4; 32]));
        store
            .set_forward_state(f.in_channel, &f.r_hash, done)
            .await
            .unwrap();
        drop(store);
        let store = Store::open(dir.path()).await.unwrap();
        assert_eq!(
            store.forwards().await.unwrap(),
            vec![ForwardRow { state: done, ..f }]
        );
    }

    /// A snapshot is its version's byte, then the channel in postcard's layout and
    /// nothing after it; it reads back as the channel and writes the same bytes again.
    #[test]
    fn a_snapshot_is_its_version_byte_then_the_channel() {
        let channel = sample();
        let bytes = encode_snapshot(ChannelId(1), &channel).unwrap();
        assert_eq!(bytes[0], 4);
        assert_eq!(bytes[1..], postcard::to_allocvec(&channel).unwrap()[..]);
        let decoded = decode_snapshot(ChannelId(1), &bytes).unwrap();
        assert_eq!((&decoded.channel, decoded.version), (&channel, 4));
        assert_eq!(
            encode_snapshot(ChannelId(1), &decoded.channel).unwrap(),
            bytes
        );
    }

    /// A channel the release before wrote (a version 3 JSON text) opens as it was and is
    /// rewritten at start as version 4 (a blob starting with its version's byte), which a
    /// second start reads as the same channel.
    #[tokio::test]
    async fn a_version_3_channel_is_rewritten_as_version_4_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let channel = sample();
        let stored = |store: &Store| {
            let db = store.db.clone();
            async move {
                let row =
                    sqlx::query("SELECT typeof(snapshot), snapshot FROM channels WHERE id = 2")
                        .fetch_one(&mut *db.lock().await.unwrap())
                        .await
                        .unwrap();
                (row.get::<String, _>(0), row.get::<Vec<u8>, _>(1))
            }
        };
        {
            let store = Store::open(dir.path()).await.unwrap();
            store
                .insert_channel(ChannelId(2), &test_peer(), &channel)
                .await
                .unwrap();
            sqlx::query("UPDATE channels SET snapshot = ? WHERE id = 2")
                .bind(snapshot::encode_json_v3(&channel))
                .execute(&mut *store.db.lock().await.unwrap())
                .await
                .unwrap();
            let (kind, bytes) = stored(&store).await;
            assert_eq!((kind.as_str(), bytes[0]), ("text", b'{'));
        }
        for _ in 0..2 {
            let store = Store::open(dir.path()).await.unwrap();
            let rows = store.channels().await.unwrap();
            assert_eq!(rows.len(), 1);
            assert_eq!((rows[0].id, &rows[0].channel), (ChannelId(2), &channel));
            let (kind, bytes) = stored(&store).await;
            assert_eq!(kind, "blob");
            assert_eq!(bytes, encode_snapshot(ChannelId(2), &channel).unwrap());
        }
    }

    /// A binary snapshot that does not read whole is refused, naming version 4: cut
    /// short, with a byte after the channel, or with a bad tag inside. A first byte that is
    /// neither `{` nor a binary version is corrupt; one of a later binary version is too new.
    #[test]
    fn a_binary_snapshot_that_does_not_read_whole_is_refused() {
        let bytes = encode_snapshot(ChannelId(6), &sample()).unwrap();
        let mut longer = bytes.clone();
        longer.push(0);
        // A new channel's last field is its stage, `Init`: variant 0, one byte. Variant
        // 127 is none of the stage's.
        let mut bad_tag = bytes.clone();
        assert_eq!(bad_tag.pop(), Some(0));
        bad_tag.push(0x7f);
        for (snapshot, why) in [
            (&bytes[..bytes.len() / 2], "end of buffer"),
            (&longer[..], "1 bytes after the channel"),
            (&bad_tag[..], "Deserialization"),
        ] {
            let err = decode_snapshot(ChannelId(6), snapshot).err().unwrap();
            assert!(
                matches!(
                    err,
                    StoreError::UndecodableVersion {
                        id: ChannelId(6),
                        version: 4,
                        ..
                    }
                ),
                "{err:?}"
            );
            let cause = std::error::Error::source(&err).unwrap().to_string();
            assert!(cause.contains(why), "{cause}");
        }
        for (snapshot, why) in [
            (&b""[..], "an empty snapshot"),
            (&b"\0"[..], "starting with byte 0"),
            (&b"x"[..], "starting with byte 120"),
        ] {
            let err = decode_snapshot(ChannelId(6), snapshot).err().unwrap();
            assert!(
                matches!(err, StoreError::Corrupt(ChannelId(6), _)),
                "{err:?}"
            );
            assert!(err.to_string().contains(why), "{err}");
        }
    }

    /// The WAL's file is written ahead of SQLite's appends (`WalAhead`): 400 channel
    /// writes grow it a few times, not once each (each growth's flush writes the file's
    /// size and new blocks), and a copy of the files taken after the last write, zeros past
    /// SQLite's end included, opens as a node does after kill -9 with every write in it.
    #[tokio::test]
    async fn the_wal_is_written_ahead_and_a_crash_copy_keeps_every_write() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        store
            .insert_channel(ChannelId(1), &test_peer(), &sample())
            .await
            .unwrap();
        let wal = dir.path().join("node.sqlite-wal");
        let size = || std::fs::metadata(&wal).map_or(0, |m| m.len());
        let mut sizes = std::collections::BTreeSet::new();
        let mut channel = sample();
        for height in 1..=400 {
            channel.block_height(height);
            store
                .save_channel(ChannelId(1), &channel, &[])
                .await
                .unwrap();
            sizes.insert(size());
        }
        // 400 frames of 4 KiB are 1.6 MiB: each growth by SQLite is followed by a MiB of
        // zeros, so the file took a few sizes (one per write before).
        assert!(
            sizes.len() <= 6,
            "the WAL took {} sizes in 400 writes",
            sizes.len()
        );
        let copy = tempfile::tempdir().unwrap();
        for name in ["node.sqlite", "node.sqlite-wal"] {
            std::fs::copy(dir.path().join(name), copy.path().join(name)).unwrap();
        }
        assert!(
            std::fs::metadata(copy.path().join("node.sqlite-wal"))
                .unwrap()
                .len()
                > 400 * 4096,
            "the copy holds the WAL"
        );
        drop(store);
        let reopened = Store::open(copy.path()).await.unwrap();
        let rows = reopened.channels().await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].channel.height(), 400, "the last write survived");
    }

    /// The store is one connection holding SQLite's lock for its life (issue 33: a
    /// transaction then takes no lock, no `fcntl`): another opener of the database, such
    /// as a second node started on the same data directory, is refused while it runs, and
    /// the database opens again once the store is gone. Interleaved reads and group
    /// commits share the one connection without waiting on each other's locks.
    #[tokio::test]
    async fn the_store_owns_its_database_through_one_connection() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        let mode: String = sqlx::query_scalar("PRAGMA locking_mode")
            .fetch_one(&mut *store.db.lock().await.unwrap())
            .await
            .unwrap();
        assert_eq!(mode, "exclusive");
        let every: String = sqlx::query_scalar("PRAGMA wal_autocheckpoint")
            .fetch_one(&mut *store.db.lock().await.unwrap())
            .await
            .map(|n: i64| n.to_string())
            .unwrap();
        assert_eq!(every, WAL_AUTOCHECKPOINT);

        let other = SqliteConnectOptions::new()
            .filename(dir.path().join("node.sqlite"))
            .busy_timeout(std::time::Duration::ZERO);
        let outsider = async {
            let mut conn = sqlx::ConnectOptions::connect(&other).await?;
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM channels")
                .fetch_one(&mut conn)
                .await
        };
        let refused = outsider
            .await
            .expect_err("a second opener read the node's database");
        assert!(refused.to_string().contains("locked"), "{refused}");

        let mut writes = tokio::task::JoinSet::new();
        for id in 1..=20 {
            let store = store.clone();
            writes.spawn(async move {
                store
                    .insert_channel(ChannelId(id), &test_peer(), &sample())
                    .await?;
                store.save_channel(ChannelId(id), &sample(), &[]).await?;
                store.channels().await.map(|rows| rows.len())
            });
        }
        while let Some(seen) = writes.join_next().await {
            assert!(seen.unwrap().unwrap() >= 1);
        }
        assert_eq!(store.channels().await.unwrap().len(), 20);

        drop(store);
        let mut reopened = None;
        for _ in 0..100 {
            match Store::open(dir.path()).await {
                Ok(s) => {
                    reopened = Some(s);
                    break;
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        }
        let reopened = reopened.expect("the database opens again once its store is gone");
        assert_eq!(reopened.channels().await.unwrap().len(), 20);
    }

    /// The block of a followed transaction is kept, moved when a rescan finds it in
    /// another block, and forgotten when a reorganisation takes its block.
    #[tokio::test]
    async fn a_recorded_block_follows_the_best_chain() {
        use bitcoin::hashes::Hash as _;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        let (low, high) = (claim(1).compute_txid(), claim(2).compute_txid());
        let block = |n: u8| bitcoin::BlockHash::from_byte_array([n; 32]);
        assert_eq!(store.tx_block(&low).await.unwrap(), None);
        store.record_tx_block(&low, 10, &block(10)).await.unwrap();
        store.record_tx_block(&high, 12, &block(12)).await.unwrap();
        assert_eq!(store.tx_block(&low).await.unwrap(), Some(block(10)));

        store.rewind(11, &[]).await.unwrap();
        assert_eq!(store.tx_block(&low).await.unwrap(), Some(block(10)));
        assert_eq!(store.tx_block(&high).await.unwrap(), None);
        // The rescan of the new branch finds it again, in another block.
        store.record_tx_block(&high, 13, &block(13)).await.unwrap();
        assert_eq!(store.tx_block(&high).await.unwrap(), Some(block(13)));
    }

    /// The watcher skips the query of an empty broadcast queue; a claim queued after that
    /// query (also one queued while it runs) and one a reorganisation reopens are found by
    /// the very next pass, from every handle of the store.
    #[tokio::test]
    async fn a_known_empty_broadcast_queue_still_sees_every_new_claim() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        let other = store.clone();
        let txids = |rows: Vec<BroadcastRow>| rows.into_iter().map(|b| b.txid).collect::<Vec<_>>();
        assert!(store.pending_broadcasts().await.unwrap().is_empty());
        assert!(store.pending_broadcasts().await.unwrap().is_empty());

        other
            .queue_broadcast(ChannelId(1), &claim(1), 0, 0)
            .await
            .unwrap();
        let one = claim(1).compute_txid();
        assert_eq!(txids(store.pending_broadcasts().await.unwrap()), vec![one]);
        store.broadcast_done(&one, 10).await.unwrap();
        assert!(store.pending_broadcasts().await.unwrap().is_empty());
        assert!(other.pending_broadcasts().await.unwrap().is_empty());

        // A reorganisation below the confirming block reopens it.
        store.rewind(9, &[]).await.unwrap();
        assert_eq!(txids(other.pending_broadcasts().await.unwrap()), vec![one]);
        store.broadcast_done(&one, 10).await.unwrap();

        // Claims queued while empty-queue reads run: none may be lost by a read that
        // started before the claim committed and found nothing.
        for n in 2..40u8 {
            let tx = claim(n);
            let (read, queued) = tokio::join!(
                store.pending_broadcasts(),
                other.queue_broadcast(ChannelId(1), &tx, 0, 0)
            );
            read.unwrap();
            queued.unwrap();
            let txid = claim(n).compute_txid();
            assert_eq!(
                txids(store.pending_broadcasts().await.unwrap()),
                vec![txid],
                "claim {n}"
            );
            store.broadcast_done(&txid, 10).await.unwrap();
            assert!(store.pending_broadcasts().await.unwrap().is_empty());
        }
    }

    #[test]
    fn snapshots_carry_their_version_and_read_back() {
        let ch = sample();
        let v3 = snapshot::encode_json_v3(&ch);
        let back = decode_snapshot(ChannelId(1), v3.as_bytes()).unwrap();
        assert_eq!((&back.channel, back.version), (&ch, 3));
        let v4 = encode_snapshot(ChannelId(1), &ch).unwrap();
        let back = decode_snapshot(ChannelId(1), &v4).unwrap();
        assert_eq!((back.channel, back.version), (ch, 4));
    }

    /// A version 2 snapshot written by the release before hex (a busy hub channel from
    /// `examples/snapshot_bench.rs`: 49 revocation slots, 3+3 HTLCs in flight), and the
    /// same without its version field (version 1), read as they are; written as version 3
    /// by the release before this one (`encode_json_v3`), the same bytes in hex, and as
    /// version 4, 2,810 bytes against version 3's 7,854; both read back equal.
    #[test]
    fn snapshots_of_versions_1_and_2_read_and_write_as_versions_3_and_4() {
        let v2 = include_str!("fixtures/snapshot_v2.json").trim();
        let mut v1: serde_json::Value = serde_json::from_str(v2).unwrap();
        v1.as_object_mut().unwrap().remove("snapshot_version");
        for (json, version) in [(v2.to_owned(), 2), (v1.to_string(), 1)] {
            let old = decode_snapshot(ChannelId(1), json.as_bytes()).unwrap();
            assert_eq!(old.version, version);
            assert_eq!(old.channel.revocation_slots(), 49);
            assert_eq!(old.channel.commitment_number(), 1006);
            let v3 = snapshot::encode_json_v3(&old.channel);
            assert!(v3.contains("\"snapshot_version\":3"));
            let back = decode_snapshot(ChannelId(1), v3.as_bytes()).unwrap();
            assert_eq!((&back.channel, back.version), (&old.channel, 3));
            let v4 = encode_snapshot(ChannelId(1), &old.channel).unwrap();
            let back = decode_snapshot(ChannelId(1), &v4).unwrap();
            assert_eq!((&back.channel, back.version), (&old.channel, 4));
            assert_eq!((v4.len(), v3.len()), (2_810, 7_854));

            // The arrays of numbers became hex strings of the same bytes.
            let (old, new): (serde_json::Value, serde_json::Value) = (
                serde_json::from_str(&json).unwrap(),
                serde_json::from_str(&v3).unwrap(),
            );
            let as_hex = |v: &serde_json::Value| {
                let bytes: Vec<u8> = serde_json::from_value(v.clone()).unwrap();
                serde_json::Value::String(hex::encode(bytes))
            };
            let seed = &old["secrets"]["revocation_seed"];
            assert!(seed.is_array(), "{seed}");
            assert_eq!(new["secrets"]["revocation_seed"], as_hex(seed));
            let store =
                |v: &serde_json::Value| v["stage"]["Established"]["their_secrets"]["known"].clone();
            let (old_known, new_known) = (store(&old), store(&new));
            assert_eq!(new_known.as_array().unwrap().len(), 49);
            for (o, n) in old_known
                .as_array()
                .unwrap()
                .iter()
                .zip(new_known.as_array().unwrap())
            {
                assert_eq!(n["hash"], as_hex(&o["hash"]));
                assert_eq!(n["index"], o["index"]);
            }
            // Everything else is written as before: only the arrays shrank (and the
            // onions, empty, are written since version 4 needs every field).
            assert_eq!(
                v3.len(),
                json.len() - old_text_saved(&old)
                    + if version == 1 { 21 } else { 0 }
                    + r#","onions":[]"#.len()
            );
        }
    }

    /// The bytes the hex layout saves over the numbers: each 32-byte array's text
    /// against its 66-character hex string.
    fn old_text_saved(old: &serde_json::Value) -> usize {
        let arrays = |v: &serde_json::Value| -> Vec<serde_json::Value> {
            let mut out = vec![v["secrets"]["revocation_seed"].clone()];
            for k in v["stage"]["Established"]["their_secrets"]["known"]
                .as_array()
                .unwrap()
            {
                out.push(k["hash"].clone());
            }
            out.extend(
                v["stage"]["Established"]["known_r"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .cloned(),
            );
            out
        };
        arrays(old).iter().map(|a| a.to_string().len() - 66).sum()
    }

    /// Version 3 reads a byte string only from 64 lowercase hex digits: an odd-length or
    /// non-hex string refuses the channel, naming the version, rather than read it wrong.
    /// (Before version 3, this release refused the snapshot as too new:
    /// `a_snapshot_from_a_newer_release_is_refused_by_version` on the code before.)
    #[test]
    fn a_version_3_snapshot_with_a_bad_hex_string_is_refused() {
        let json = snapshot::encode_json_v3(&sample());
        let seed = hex::encode([3u8; 32]);
        assert!(json.contains(&seed), "{json}");
        for (bad, why) in [
            (seed[1..].to_owned(), "odd length 63"),
            (
                format!("{}zz", &seed[2..]),
                "not a lowercase hex digit at 62",
            ),
            (seed.replace('3', "C"), "not a lowercase hex digit at 1"),
            (seed[2..].to_owned(), "of 31 bytes, expected 32"),
        ] {
            let err = decode_snapshot(ChannelId(5), json.replace(&seed, &bad).as_bytes())
                .err()
                .unwrap();
            assert!(
                matches!(
                    err,
                    StoreError::UndecodableVersion {
                        id: ChannelId(5),
                        version: 3,
                        ..
                    }
                ),
                "{err:?}"
            );
            let cause = std::error::Error::source(&err).unwrap().to_string();
            assert!(cause.contains(why), "{cause}");
        }
    }

    /// A binary snapshot of a later version, or a JSON one naming a later version, is
    /// refused as too new; a JSON one naming version 4 (which is binary) as corrupt.
    #[test]
    fn a_snapshot_from_a_newer_release_is_refused_by_version() {
        let mut binary = encode_snapshot(ChannelId(7), &sample()).unwrap();
        binary[0] = 5;
        let json = |v: u64| {
            snapshot::encode_json_v3(&sample()).replace(
                "\"snapshot_version\":3",
                &format!("\"snapshot_version\":{v}"),
            )
        };
        for (snapshot, version) in [(binary, 5), (json(5).into_bytes(), 5)] {
            let err = decode_snapshot(ChannelId(7), &snapshot).err().unwrap();
            assert!(
                matches!(err, StoreError::SnapshotTooNew { id: ChannelId(7), version: v } if v == version),
                "{err:?}"
            );
            assert!(err.to_string().contains("version 5"), "{err}");
        }
        let err = decode_snapshot(ChannelId(7), json(4).as_bytes())
            .err()
            .unwrap();
        assert!(
            matches!(err, StoreError::Corrupt(ChannelId(7), _)),
            "{err:?}"
        );
    }

    #[test]
    fn a_broken_old_snapshot_is_refused_naming_its_version() {
        let err = decode_snapshot(ChannelId(4), br#"{"state":"Normal","config":{}}"#)
            .err()
            .unwrap();
        assert!(err.to_string().contains("snapshot version 0"), "{err}");
    }
}
