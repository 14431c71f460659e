//! Group commit of channel writes: one task owns the writer connection and commits every
//! write waiting at once in one transaction (one fsync), answering each caller only after
//! the commit that holds its write.

use super::ChannelId;

/// The store's one SQLite connection, taken in turn (FIFO) by the group writer and the
/// readers. Not an sqlx pool: a pool pings its connection on every return (one more
/// round trip to SQLite's worker thread per read and per commit, which the next
/// checkout waited for); a local file cannot drop a connection. `None` once closed.
#[derive(Clone)]
pub(super) struct Db(std::sync::Arc<tokio::sync::Mutex<Option<sqlx::SqliteConnection>>>);

impl Db {
    pub(super) fn new(conn: sqlx::SqliteConnection) -> Db {
        Db(std::sync::Arc::new(tokio::sync::Mutex::new(Some(conn))))
    }

    /// Waits for the connection; after [`Db::close`], [`sqlx::Error::PoolClosed`].
    pub(super) async fn lock(
        &self,
    ) -> Result<tokio::sync::MappedMutexGuard<'_, sqlx::SqliteConnection>, sqlx::Error> {
        tokio::sync::MutexGuard::try_map(self.0.lock().await, Option::as_mut)
            .map_err(|_| sqlx::Error::PoolClosed)
    }

    /// Closes the connection (after the statement that holds it), releasing the
    /// database's lock; every later [`Db::lock`] fails.
    #[cfg(test)]
    pub(super) async fn close(&self) {
        if let Some(conn) = self.0.lock().await.take() {
            if let Err(e) = sqlx::Connection::close(conn).await {
                tracing::warn!(error = %e, "closing the node's database");
            }
        }
    }
}

/// One channel's durable write: its snapshot and the revoked-commitment records that must
/// be on disk no later than it (they leave the snapshot with it).
pub(super) struct WriteRequest {
    pub(super) id: ChannelId,
    pub(super) snapshot: Vec<u8>,
    pub(super) revoked: Vec<(i64, String)>,
    pub(super) done: tokio::sync::oneshot::Sender<Result<(), std::sync::Arc<sqlx::Error>>>,
}

/// The most channel writes one commit (one fsync) covers.
pub(super) const GROUP_MAX: usize = 256;

/// Group commit: every channel write waiting when the previous commit ended goes into the
/// next transaction, so N channels ready at the same moment cost one fsync, not N; no
/// channel waits on another's lock, only on the shared commit. Each caller is answered
/// only after the commit that holds its write, so nothing it sends next can overtake it.
/// A task of its own rather than the callers taking turns: a caller dropped mid-write (a
/// control call whose client hung up) cannot abandon the writes of others, and the writes
/// of one channel commit in the order they were made even then (one queue, in order).
///
/// The writer shares the store's one connection with the readers: it takes it per group
/// (a fair lock), so a commit waits at most for one read.
pub(super) async fn group_writer(
    db: Db,
    mut rx: tokio::sync::mpsc::Receiver<WriteRequest>,
    mut wal: WalAhead,
) {
    let mut batch: Vec<WriteRequest> = Vec::with_capacity(GROUP_MAX);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        // The first write woke us into tokio's LIFO slot: we would run right after its
        // sender, before the other tasks that are ready now and about to write. Yielding
        // once lets them queue their writes into this group (one flush for all of them);
        // when nothing else is ready it costs one poll. Measured on hub_bench at 100 busy
        // channels (docs/node.md, "Performance notes").
        tokio::task::yield_now().await;
        while batch.len() < GROUP_MAX {
            match rx.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        let mut conn = match db.lock().await {
            Ok(conn) => conn,
            Err(e) => {
                answer(&mut batch, &Err(std::sync::Arc::new(e)));
                continue;
            }
        };
        let result = write_group(&mut conn, &batch)
            .await
            .map_err(std::sync::Arc::new);
        answer(&mut batch, &result);
        // Still holding the connection, so that SQLite writes nothing meanwhile; the
        // callers already have their answers.
        if result.is_ok() {
            wal.after_commit().await;
        }
        drop(conn);
    }
}

/// Answers every write of `batch` with `result`, emptying it.
fn answer(batch: &mut Vec<WriteRequest>, result: &Result<(), std::sync::Arc<sqlx::Error>>) {
    for w in batch.drain(..) {
        // A caller gone (a control call whose client hung up) loses only the answer: its
        // write is in this commit, or the commit failed for every write in it.
        if w.done.send(result.clone()).is_err() {
            tracing::debug!(channel = ?w.id, "a channel write's caller left before its commit ended");
        }
    }
}

/// How far ahead of SQLite's last write [`WalAhead`] writes the WAL's file.
pub(super) const WAL_AHEAD: u64 = 1 << 20;

/// Keeps the WAL's file written ahead of SQLite's writes. SQLite appends frames to the WAL
/// until its checkpoint sends it back to the start (10,000 frames, ~40 MiB: see
/// [`super::Store::open`]); while it appends, each commit's flush also writes the file's
/// new size and its new blocks' allocation, which doubled a commit on machine M (205 µs
/// against 110 µs overwriting the WAL in place, hub_bench). A node pays that on its first
/// ~10,000 frames after every start. Once a commit has grown the file, the writer adds
/// [`WAL_AHEAD`] bytes of zeros past SQLite's end and flushes them, so that the next ~250
/// frames land in written blocks inside the file's size: one flush of a megabyte instead of
/// 250 commits' metadata writes. Zeros are never a valid frame (each frame carries the
/// WAL header's salts and a checksum), so recovery after a crash stops where SQLite's last
/// commit ended, as it does at the end of the file; SQLite never truncates the WAL
/// (`journal_size_limit` is unset) and deletes it on a clean close. Once SQLite wraps, the
/// file stops growing and nothing more is written ahead.
pub(super) struct WalAhead {
    path: std::path::PathBuf,
    /// The file's size after our last write ahead; a larger one means SQLite grew it.
    ahead_to: u64,
}

impl WalAhead {
    /// The WAL of the database at `db_path` (SQLite names it `<db_path>-wal`).
    pub(super) fn of(db_path: &std::path::Path) -> WalAhead {
        let mut path = db_path.as_os_str().to_owned();
        path.push("-wal");
        WalAhead {
            path: path.into(),
            ahead_to: 0,
        }
    }

    /// After a commit, with the connection held: if SQLite grew the file, zeros past its
    /// end. A failure (a full disk) is logged; SQLite grows the file itself as before.
    pub(super) async fn after_commit(&mut self) {
        let len = match std::fs::metadata(&self.path) {
            Ok(m) => m.len(),
            Err(e) => {
                tracing::debug!(error = %e, "the WAL's size");
                return;
            }
        };
        if len <= self.ahead_to {
            return;
        }
        let (path, to) = (self.path.clone(), len + WAL_AHEAD);
        match tokio::task::spawn_blocking(move || zeros_past(&path, len, to)).await {
            Ok(Ok(())) => self.ahead_to = to,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "writing the WAL's file ahead of SQLite");
                self.ahead_to = len;
            }
            Err(e) => tracing::warn!(error = %e, "writing the WAL's file ahead of SQLite"),
        }
    }
}

/// Writes zeros to `path` from `from` (its end) to `to` and flushes them.
fn zeros_past(path: &std::path::Path, from: u64, to: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt as _;
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    let zeros = vec![0u8; 64 << 10];
    let mut at = from;
    while at < to {
        let n = usize::try_from(to - at).map_or(zeros.len(), |n| n.min(zeros.len()));
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    file.sync_data()
}

/// The store connection's own (TEMP, never on disk) way to put snapshots and their revoked
/// records in one statement: a row with a snapshot updates the channel, a row with a record
/// archives it. One INSERT into this view is one statement, so SQLite runs it as one
/// transaction (atomic, one fsync) and sqlx answers it with one message.
pub(super) const WRITER_SETUP: &str = "
CREATE TEMP VIEW channel_writes AS
    SELECT 0 AS id, NULL AS snapshot, NULL AS num, NULL AS record WHERE 0;
CREATE TEMP TRIGGER channel_writes_insert INSTEAD OF INSERT ON channel_writes BEGIN
    INSERT INTO revoked_commitments (channel_id, num, record)
        SELECT NEW.id, NEW.num, NEW.record WHERE NEW.record IS NOT NULL
        ON CONFLICT DO NOTHING;
    UPDATE channels SET snapshot = NEW.snapshot WHERE id = NEW.id AND NEW.snapshot IS NOT NULL;
END;
";

/// Bound values one statement may carry (SQLite's default limit is 32,766).
const MAX_BOUND: usize = 30_000;

/// One commit holding every write of `batch`, sent to SQLite's worker thread as a single
/// command of a single statement. Each command is a round trip to that thread (a wake-up of
/// it and one of ours), sqlx's `begin()`/`commit()` are two more commands that each block
/// the worker until we take the answer, and each statement of a multi-statement command
/// sends its own answer (a wake-up of ours that preempts the worker before it syncs). So:
/// a lone snapshot is one `UPDATE` in autocommit; anything else is one `INSERT` into
/// [`WRITER_SETUP`]'s view, its records' rows before their snapshot's; a group too large
/// for one statement is one multi-statement transaction. Snapshots are bound as `&[u8]`
/// and texts as `&str`, which sqlx borrows; a `&String` bound through `String`'s
/// by-reference encoding, a copy of each snapshot.
pub(super) async fn write_group(
    conn: &mut sqlx::SqliteConnection,
    batch: &[WriteRequest],
) -> Result<(), sqlx::Error> {
    const UPDATE: &str = "UPDATE channels SET snapshot = ? WHERE id = ?;";
    if let [w] = batch {
        if w.revoked.is_empty() {
            sqlx::query(UPDATE)
                .bind(w.snapshot.as_slice())
                .bind(w.id.0)
                .execute(&mut *conn)
                .await?;
            return Ok(());
        }
    }
    let rows: usize = batch.iter().map(|w| 1 + w.revoked.len()).sum();
    let shape = statement_rows(rows);
    if shape * 4 > MAX_BOUND {
        return write_group_statements(conn, batch).await;
    }
    let mut sql = String::from("INSERT INTO channel_writes (id, snapshot, num, record) VALUES ");
    for i in 0..shape {
        sql.push_str(if i == 0 {
            "(?, ?, ?, ?)"
        } else {
            ", (?, ?, ?, ?)"
        });
    }
    let mut query = sqlx::query(&sql);
    for w in batch {
        for (num, record) in &w.revoked {
            query = query
                .bind(w.id.0)
                .bind(None::<&str>)
                .bind(num)
                .bind(record.as_str());
        }
        query = query
            .bind(w.id.0)
            .bind(w.snapshot.as_slice())
            .bind(None::<i64>)
            .bind(None::<&str>);
    }
    // The rows past the group's own write nothing (no snapshot, no record): see
    // [`statement_rows`].
    for _ in rows..shape {
        query = query
            .bind(0_i64)
            .bind(None::<&str>)
            .bind(None::<i64>)
            .bind(None::<&str>);
    }
    query.persistent(true).execute(&mut *conn).await?;
    Ok(())
}

/// The rows of the statement that carries `rows` rows: the next power of two. Preparing a
/// statement of a new shape for every group (its members change from one commit to the
/// next) was a tenth of a busy node's SQLite time, 5 % of its CPU; with shapes rounded up
/// there are nine of them at most (1 to 256 rows and a few records), each prepared once and
/// kept in sqlx's statement cache, and the padding rows cost SQLite a no-op each (a row
/// with neither snapshot nor record changes nothing in [`WRITER_SETUP`]'s trigger).
pub(super) fn statement_rows(rows: usize) -> usize {
    rows.next_power_of_two()
}

/// [`write_group`] for a group too large for one statement: one multi-statement command,
/// `BEGIN; INSERT …; UPDATE …; COMMIT`, its arguments bound in order across the statements.
pub(super) async fn write_group_statements(
    conn: &mut sqlx::SqliteConnection,
    batch: &[WriteRequest],
) -> Result<(), sqlx::Error> {
    const UPDATE: &str = "UPDATE channels SET snapshot = ? WHERE id = ?;";
    const INSERT: &str = "INSERT INTO revoked_commitments (channel_id, num, record) VALUES (?, ?, ?) ON CONFLICT DO NOTHING;";
    let mut sql = String::from("BEGIN;");
    for w in batch {
        for _ in &w.revoked {
            sql.push_str(INSERT);
        }
        sql.push_str(UPDATE);
    }
    sql.push_str("COMMIT;");
    let mut query = sqlx::query(&sql);
    for w in batch {
        for (num, record) in &w.revoked {
            query = query.bind(w.id.0).bind(num).bind(record.as_str());
        }
        query = query.bind(w.snapshot.as_slice()).bind(w.id.0);
    }
    let result = query.persistent(false).execute(&mut *conn).await;
    if result.is_err() {
        // A statement failed after BEGIN: nothing of the group is committed; end the
        // transaction so that the next group starts clean (an error here means none is open).
        if let Err(e) = sqlx::query("ROLLBACK").execute(&mut *conn).await {
            tracing::debug!(error = %e, "no transaction left to roll back");
        }
    }
    result.map(|_| ())
}
