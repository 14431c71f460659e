//! Group commit of bet intents and broadcast marks: the requests that arrive while a group is being written are written together in the next transaction, each answered only after the commit that holds it.
//!
//! Why: every bet wrote its intent in a transaction of its own that held the
//! round's row (its pot grows) from the first statement to the commit. On
//! PostgreSQL that is seven round trips and a WAL flush per bet during which
//! every other bet of the round waits; on SQLite it is nine statements, each
//! two thread hand-offs to sqlx's worker. A group pays one transaction for
//! all its bets, with one statement per table (SQLite) or one statement
//! after the round's lock (PostgreSQL), and the broadcast marks of bets
//! already written ride along.
//!
//! A group is written with the same guards as a bet alone (the round still
//! open, every input still unspent, checked by the statements' row counts).
//! When any of them fails, or any statement errs, the whole group is rolled
//! back and each of its requests is written alone, as before: a bet that
//! fails never fails the others of its group, and its error is the one it
//! would have had alone.
//!
//! No task runs while nothing is queued: the request that finds the queue
//! idle spawns the task that drains it, so a request cancelled by its
//! client cannot strand the others of its group.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use sqlx::Row;
use tokio::sync::oneshot;

use super::ledger::{
    placeholders, refuse_if_paused, user_share_refusal, LedgerError, Tx, BATCH, GROW_OPEN_ROUND,
};
use super::{Backend, Store, StoreError};
use crate::domain::money::{Intent, NewOutput};
use crate::domain::round::{BetStatus, RoundStatus, TransferStatus};
use crate::domain::time::unix_now;

/// Most bets in one group. Bounds the bound values of the group's
/// statements (ten per bet in the transfer insert) and the number of
/// distinct statement texts each connection caches.
const MAX_GROUP_BETS: usize = 32;

/// `(bet id, transfer id)` of a written bet, or why it was refused.
type BetAnswer = Result<(i64, i64), LedgerError>;

/// The requests waiting for the next group, shared by every clone of a [`Store`].
#[derive(Debug, Default)]
pub(crate) struct GroupCommit {
    pending: Mutex<Pending>,
    /// Groups of two or more bets written whole (the tests check that the
    /// group path, not only the bet-by-bet one, is taken).
    whole_groups: AtomicU64,
    /// Transfers this process broadcast whose mark is queued or being
    /// written: the user's own reads show them `broadcast` meanwhile.
    unmarked: Mutex<HashSet<i64>>,
}

#[derive(Debug, Default)]
struct Pending {
    bets: Vec<BetRequest>,
    marks: Vec<MarkRequest>,
    /// A task is draining the queue; new requests only join it.
    draining: bool,
}

#[derive(Debug)]
struct BetRequest {
    intent: Intent,
    done: oneshot::Sender<BetAnswer>,
}

#[derive(Debug)]
struct MarkRequest {
    transfer_id: i64,
    /// `None` for a mark nobody waits for ([`Store::mark_broadcast_soon`]).
    done: Option<oneshot::Sender<Result<(), StoreError>>>,
}

impl MarkRequest {
    fn answer(self, result: Result<(), StoreError>) {
        if let Some(done) = self.done {
            let _ = done.send(result);
        }
    }
}

impl GroupCommit {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // The lock guards plain pushes and swaps that cannot panic halfway,
        // so a poisoned queue is still consistent.
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn unmarked(&self) -> MutexGuard<'_, HashSet<i64>> {
        // Plain inserts and removals: a poisoned set is still consistent.
        self.unmarked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The marks `ids` are committed or given up: the database says.
    fn settled(&self, ids: &[i64]) {
        if ids.is_empty() {
            return;
        }
        let mut unmarked = self.unmarked();
        for id in ids {
            unmarked.remove(id);
        }
    }
}

/// Clears the draining flag, and fails what is still queued, if the
/// draining task stops early (a panic, or its runtime shutting down), so
/// that later requests start a new task instead of waiting for a dead one.
struct DrainGuard(Arc<GroupCommit>);

impl Drop for DrainGuard {
    fn drop(&mut self) {
        let mut p = self.0.lock();
        p.draining = false;
        // Dropping the senders answers each waiting request with an error.
        p.bets.clear();
        let ids: Vec<i64> = p.marks.drain(..).map(|m| m.transfer_id).collect();
        drop(p);
        self.0.settled(&ids);
    }
}

fn group_lost() -> StoreError {
    StoreError::GroupWriteLost
}

impl Store {
    /// Groups of two or more bets written whole so far.
    #[cfg(test)]
    pub(crate) fn whole_groups(&self) -> u64 {
        self.group.whole_groups.load(Ordering::Relaxed)
    }

    /// Writes a bet: the round must be `open`; takes the inputs, records the
    /// transfer (status `signed`), the bet and the new outputs, in one
    /// transaction, shared with the bets that arrive meanwhile (group
    /// commit); returns once that transaction is committed. Returns `(bet
    /// id, transfer id)`.
    ///
    /// # Errors
    /// [`LedgerError::WrongStatus`], [`LedgerError::OutputTaken`], database
    /// failures.
    pub async fn place_bet(&self, intent: &Intent) -> Result<(i64, i64), LedgerError> {
        let (done, answer) = oneshot::channel();
        self.enqueue(|p| {
            p.bets.push(BetRequest {
                intent: intent.clone(),
                done,
            });
        });
        answer.await.map_err(|_| LedgerError::Store(group_lost()))?
    }

    /// Marks a signed transfer as broadcast; returns once committed (in a
    /// group with other marks and bets, see [`Store::place_bet`]).
    ///
    /// # Errors
    /// Database failures.
    pub async fn mark_broadcast(&self, transfer_id: i64) -> Result<(), StoreError> {
        let (done, answer) = oneshot::channel();
        self.enqueue(|p| {
            p.marks.push(MarkRequest {
                transfer_id,
                done: Some(done),
            });
        });
        answer.await.map_err(|_| group_lost())?
    }

    /// Queues the mark of a transfer just broadcast and returns at once: it
    /// rides with the next group. Until it is committed (or has failed, when
    /// the worker's re-broadcast of `signed` transfers marks it later)
    /// [`Store::user_transfers`] shows the transfer `broadcast`, so the
    /// user who was told "broadcast" reads it so. A crash before the commit
    /// leaves it `signed`, the state of a crash between broadcast and mark.
    pub fn mark_broadcast_soon(&self, transfer_id: i64) {
        self.group.unmarked().insert(transfer_id);
        self.enqueue(|p| {
            p.marks.push(MarkRequest {
                transfer_id,
                done: None,
            });
        });
    }

    /// Whether this process broadcast transfer `id` and its mark is not yet
    /// committed.
    pub(crate) fn broadcast_unmarked(&self, id: i64) -> bool {
        self.group.unmarked().contains(&id)
    }

    /// Queues a request and starts the draining task unless one runs.
    fn enqueue(&self, push: impl FnOnce(&mut Pending)) {
        let start = {
            let mut p = self.group.lock();
            push(&mut p);
            !std::mem::replace(&mut p.draining, true)
        };
        if start {
            let store = self.clone();
            tokio::spawn(async move { store.drain().await });
        }
    }

    /// Writes groups until the queue is empty.
    async fn drain(self) {
        let guard = DrainGuard(self.group.clone());
        loop {
            let (bets, marks) = {
                let mut p = self.group.lock();
                if p.bets.is_empty() && p.marks.is_empty() {
                    p.draining = false;
                    drop(p);
                    std::mem::forget(guard);
                    return;
                }
                let n = p.bets.len().min(MAX_GROUP_BETS);
                (
                    p.bets.drain(..n).collect::<Vec<_>>(),
                    std::mem::take(&mut p.marks),
                )
            };
            self.commit_group(bets, marks).await;
        }
    }

    /// Writes one group and answers each of its requests.
    async fn commit_group(&self, bets: Vec<BetRequest>, marks: Vec<MarkRequest>) {
        let mark_ids: Vec<i64> = marks.iter().map(|m| m.transfer_id).collect();
        self.commit_group_marking(bets, marks, &mark_ids).await;
        self.group.settled(&mark_ids);
    }

    async fn commit_group_marking(
        &self,
        bets: Vec<BetRequest>,
        marks: Vec<MarkRequest>,
        mark_ids: &[i64],
    ) {
        if bets.is_empty() {
            self.mark_together(marks, mark_ids).await;
            return;
        }
        // A lone bet takes the group's path too: its one statement (SQLite)
        // or four round trips (PostgreSQL) cost less than the bet-by-bet
        // transaction, which stays the answer to a refused group.
        let intents: Vec<&Intent> = bets.iter().map(|b| &b.intent).collect();
        match self.write_group(&intents, mark_ids).await {
            Ok(ids) => {
                if intents.len() > 1 {
                    self.group.whole_groups.fetch_add(1, Ordering::Relaxed);
                }
                for (b, ids) in bets.into_iter().zip(ids) {
                    let _ = b.done.send(Ok(ids));
                }
                for m in marks {
                    m.answer(Ok(()));
                }
                return;
            }
            Err(
                e @ (LedgerError::OutputTaken(_)
                | LedgerError::WrongStatus { .. }
                | LedgerError::RoundFull { .. }
                | LedgerError::UserShareFull { .. }
                | LedgerError::Paused),
            ) => {
                tracing::debug!(error = %e, bets = intents.len(), "group refused; writing its bets one by one");
            }
            Err(e) => {
                tracing::warn!(error = %e, bets = intents.len(), "group write failed; writing its bets one by one");
            }
        }
        if !marks.is_empty() {
            self.mark_together(marks, mark_ids).await;
        }
        for b in bets {
            let answer = self.place_bet_alone(&b.intent).await;
            let _ = b.done.send(answer);
        }
    }

    /// Marks in one statement (marks cannot fail one another); one by one,
    /// each with its own answer, if that statement fails.
    async fn mark_together(&self, marks: Vec<MarkRequest>, ids: &[i64]) {
        match self.mark_broadcast_all(ids).await {
            Ok(()) => {
                for m in marks {
                    m.answer(Ok(()));
                }
            }
            Err(_) => self.mark_each(marks).await,
        }
    }

    /// Marks one by one, each with its own answer.
    async fn mark_each(&self, marks: Vec<MarkRequest>) {
        for m in marks {
            let answer = self.mark_broadcast_all(&[m.transfer_id]).await;
            m.answer(answer);
        }
    }

    /// Marks the signed transfers among `ids` as broadcast, in one statement.
    ///
    /// On PostgreSQL this commit does not wait for its WAL flush
    /// (`synchronous_commit` off for this transaction only; the next
    /// synchronous commit, such as the next group of bets, flushes it):
    /// a mark lost in a crash leaves the transfer `signed`, exactly the state
    /// of a crash between broadcast and mark (the `bet_broadcast` crash
    /// point), which the worker finishes by broadcasting it again. Nothing
    /// about money depends on it; a mark that rides with bets is flushed
    /// with them.
    async fn mark_broadcast_all(&self, ids: &[i64]) -> Result<(), StoreError> {
        let _turn = self.write_turn().await;
        for chunk in ids.chunks(BATCH) {
            let mut sql = marks_sql(&mut 2, chunk.len());
            if self.backend() == Backend::Postgres {
                // Evaluated for each row it writes, so a statement that
                // writes nothing leaves the setting alone (and has no WAL).
                sql.push_str(" AND set_config('synchronous_commit', 'off', true) <> ''");
            }
            let q = sqlx::query(&sql)
                .bind(TransferStatus::Broadcast)
                .bind(TransferStatus::Signed);
            bind_all(q, chunk).execute(self.pool()).await?;
        }
        Ok(())
    }

    /// Writes the bets `intents` (two or more) and marks `marks` broadcast in
    /// one transaction. Returns `(bet id, transfer id)` per intent, in
    /// order; any refusal rolls everything back.
    async fn write_group(
        &self,
        intents: &[&Intent],
        marks: &[i64],
    ) -> Result<Vec<(i64, i64)>, LedgerError> {
        let txids: HashSet<bitcoin::Txid> = intents.iter().map(|i| i.txid).collect();
        if txids.len() != intents.len() {
            // Two identical transactions: only one can take the inputs, and
            // the rows below are matched by txid; let each be tried alone.
            return Err(LedgerError::OutputTaken(
                intents
                    .first()
                    .and_then(|i| i.inputs.first())
                    .copied()
                    .unwrap_or(0),
            ));
        }
        let now = unix_now();
        let mut rounds: BTreeMap<i64, RoundGrowth> = BTreeMap::new();
        for i in intents {
            let r = rounds.entry(i.round_id.unwrap_or(0)).or_default();
            r.pot_sats += i.amount_sats;
            r.bets += 1;
            *r.bettors.entry(i.user_id.unwrap_or(0)).or_default() += 1;
        }
        let _turn = self.write_turn().await;
        let (transfer_ids, bet_ids) = if self.backend() == Backend::Sqlite {
            // Under the write turn no other bet of this process is written,
            // and SQLite has one: the counts read here hold for the insert.
            // The pause takes the write turn too, so the flag holds as well.
            let paused: Option<i64> =
                sqlx::query_scalar("SELECT paused FROM service_config WHERE id = 1")
                    .fetch_optional(self.pool())
                    .await?;
            if paused.unwrap_or(0) != 0 {
                return Err(LedgerError::Paused);
            }
            for (&round_id, growth) in &rounds {
                if let Some(refusal) = user_share_refusal(
                    self.pool(),
                    round_id,
                    &growth.bettors,
                    self.max_user_round_bets(),
                )
                .await?
                {
                    return Err(refusal);
                }
            }
            self.write_group_in_one_insert(intents, marks, &rounds, now)
                .await?
        } else {
            self.write_group_postgres(intents, marks, &rounds, now)
                .await?
        };
        intents
            .iter()
            .map(|i| {
                match (
                    bet_ids.get(&i.txid.to_string()),
                    transfer_ids.get(&i.txid.to_string()),
                ) {
                    (Some(&bet), Some(&transfer)) => Ok((bet, transfer)),
                    // Committed, so the rows exist; the answer lists them all.
                    _ => Err(LedgerError::Store(StoreError::Corrupt(format!(
                        "group insert returned no row for {}",
                        i.txid
                    )))),
                }
            })
            .collect()
    }

    /// The group on PostgreSQL: its rounds locked first, then everything
    /// else in one statement, in one transaction.
    async fn write_group_postgres(
        &self,
        intents: &[&Intent],
        marks: &[i64],
        rounds: &BTreeMap<i64, RoundGrowth>,
        now: i64,
    ) -> Result<(IdsByTxid, IdsByTxid), LedgerError> {
        let mut tx = self.pool().begin().await?;
        // The rounds first, as a bet alone does: the same lock order, and a
        // round closed meanwhile refuses the whole group. Everything after
        // this reads with the round held (PostgreSQL takes each statement's
        // snapshot at its start, so the bets committed before the lock was
        // granted are seen by the bettor count). A round the group would
        // fill past its cap refuses the group too: its bets are then tried
        // one by one, and those that still fit are placed.
        for (&round_id, growth) in rounds {
            let open = sqlx::query(GROW_OPEN_ROUND)
                .bind(round_id)
                .bind(now)
                .bind(growth.pot_sats)
                .bind(growth.bets)
                .bind(self.max_round_bets())
                .bind(RoundStatus::Open)
                .execute(&mut *tx)
                .await?;
            if open.rows_affected() != 1 {
                return Err(LedgerError::WrongStatus {
                    round_id,
                    expected: crate::domain::round::RoundStatus::Open,
                });
            }
            refuse_if_paused(&mut tx, Backend::Postgres).await?;
            // With the round held, every earlier bet of it is visible.
            if let Some(refusal) = user_share_refusal(
                &mut *tx,
                round_id,
                &growth.bettors,
                self.max_user_round_bets(),
            )
            .await?
            {
                return Err(refusal);
            }
        }
        let ids = self
            .write_group_in_one_statement(&mut tx, intents, marks, now)
            .await?;
        tx.commit().await?;
        Ok(ids)
    }

    /// The whole group on SQLite as one `INSERT` into [`SQLITE_GROUP_SETUP`]'s
    /// view: one statement in autocommit is one transaction (on disk when
    /// it returns, or nothing of it) and one command to sqlx's worker
    /// thread, where the same group as a transaction of one statement per
    /// table was nine, each a wake-up of that thread and one of ours. The
    /// ids the trigger left in the connection's TEMP table are read back
    /// on the same connection.
    async fn write_group_in_one_insert(
        &self,
        intents: &[&Intent],
        marks: &[i64],
        rounds: &BTreeMap<i64, RoundGrowth>,
        now: i64,
    ) -> Result<(IdsByTxid, IdsByTxid), LedgerError> {
        let doc = serde_json::json!({
            "rounds": rounds
                .iter()
                .map(|(&id, g)| serde_json::json!({ "id": id, "pot": g.pot_sats, "bets": g.bets }))
                .collect::<Vec<_>>(),
            "max_bets": self.max_round_bets(),
            "marks": marks,
            "inputs": group_inputs(intents)
                .iter()
                .map(|(id, txid)| serde_json::json!({ "id": id, "txid": txid }))
                .collect::<Vec<_>>(),
            "transfers": group_transfers(intents),
            "outputs": group_outputs_json(intents),
            "states": {
                "open": RoundStatus::Open.as_str(),
                "signed": TransferStatus::Signed.as_str(),
                "broadcast": TransferStatus::Broadcast.as_str(),
                "placed": BetStatus::Placed.as_str(),
            },
        });
        let mut conn = self.pool().acquire().await?;
        let written = sqlx::query("INSERT INTO bet_groups (doc, now) VALUES ($1, $2)")
            .bind(doc.to_string())
            .bind(now)
            .execute(&mut *conn)
            .await;
        if let Err(sqlx::Error::Database(e)) = &written {
            // The trigger's guards, worded as in SQLITE_GROUP_SETUP.
            if e.message().contains(ROUND_NOT_OPEN) {
                let round_id = rounds.keys().next().copied().unwrap_or(0);
                return Err(LedgerError::WrongStatus {
                    round_id,
                    expected: crate::domain::round::RoundStatus::Open,
                });
            }
            if e.message().contains(ROUND_FULL) {
                let round_id = rounds.keys().next().copied().unwrap_or(0);
                return Err(LedgerError::RoundFull {
                    round_id,
                    max_bets: self.max_round_bets(),
                });
            }
            if e.message().contains(OUTPUT_TAKEN) {
                let first = intents.first().and_then(|i| i.inputs.first());
                return Err(LedgerError::OutputTaken(first.copied().unwrap_or(0)));
            }
        }
        written?;
        let rows = sqlx::query("SELECT what, id, txid FROM bet_group_ids")
            .fetch_all(&mut *conn)
            .await?;
        Ok((ids_by_txid(&rows, "t")?, ids_by_txid(&rows, "b")?))
    }

    /// The group after its rounds as one PostgreSQL statement (data-modifying
    /// `WITH` parts, which SQLite lacks): one round trip instead of six. The
    /// group's rows travel as three JSON arrays, so the statement's text is
    /// the same for every group and each connection prepares and plans it
    /// once (a text per group size would be prepared again and again). The
    /// parts share the statement's snapshot, so the bettor count's scan of
    /// `bets` does not see the group's own bets, which is what it asks.
    async fn write_group_in_one_statement(
        &self,
        tx: &mut Tx<'_>,
        intents: &[&Intent],
        marks: &[i64],
        now: i64,
    ) -> Result<(IdsByTxid, IdsByTxid), LedgerError> {
        let inputs = group_inputs(intents);
        let transfers = group_transfers(intents);
        let taken: Vec<serde_json::Value> = inputs
            .iter()
            .map(|(id, txid)| serde_json::json!({ "id": id, "txid": txid }))
            .collect();
        let outputs = group_outputs_json(intents);
        let rows = sqlx::query(GROUP_STATEMENT_PG)
            .bind(serde_json::Value::from(transfers).to_string())
            .bind(serde_json::Value::from(taken).to_string())
            .bind(serde_json::Value::from(outputs).to_string())
            .bind(serde_json::Value::from(marks).to_string())
            .bind(now)
            .bind(TransferStatus::Broadcast)
            .bind(TransferStatus::Signed)
            .bind(BetStatus::Placed)
            .fetch_all(&mut **tx)
            .await?;
        let taken = rows
            .iter()
            .find(|r| r.try_get::<String, _>("what").is_ok_and(|w| w == "n"))
            .map(|r| r.try_get::<i64, _>("id"))
            .transpose()?
            .unwrap_or(0);
        if taken != inputs.len() as i64 {
            return Err(LedgerError::OutputTaken(inputs.first().map_or(0, |i| i.0)));
        }
        Ok((ids_by_txid(&rows, "t")?, ids_by_txid(&rows, "b")?))
    }
}

/// A group's writes after its rounds, on PostgreSQL: `$1` the transfers
/// (one per bet), `$2` the inputs `{id, txid}`, `$3` the new outputs, `$4`
/// the transfer ids to mark broadcast (JSON arrays), `$5` the time. Returns
/// `(what, id, txid)` rows (`$6`, `$7`, `$8`: the states broadcast,
/// signed and placed): `t` per transfer, `b` per bet, and one `n` whose
/// id is the number of inputs taken. The row sets are unknown to the planner
/// (it guesses 100 rows for a JSON array), so the updates find their rows
/// through `= ANY (ARRAY(…))`, an index lookup, instead of hash-joining a scan
/// of every transfer or output. The inputs' "still unspent" test is written
/// so that no index can serve it: as `spent_txid IS NULL` a plan made while
/// `outputs` was nearly empty (each connection plans once, and keeps that
/// generic plan) scanned every unspent output through `outputs_user` and
/// filtered the group's few out of them, a cost that grew with the ledger.
const GROUP_STATEMENT_PG: &str = "WITH \
     g AS (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x(kind TEXT, user_id BIGINT, round_id BIGINT, \
         txid TEXT, raw_tx TEXT, amount_sats BIGINT, fee_sats BIGINT, commission_sats BIGINT, address TEXT)), \
     gi AS (SELECT * FROM jsonb_to_recordset($2::jsonb) AS x(id BIGINT, txid TEXT)), \
     go AS (SELECT * FROM jsonb_to_recordset($3::jsonb) AS x(txid TEXT, vout BIGINT, amount_sats BIGINT, \
         user_id BIGINT, round_id BIGINT, origin TEXT)), \
     marked AS (UPDATE transfers SET status = $6 WHERE status = $7 \
         AND id = ANY (ARRAY(SELECT CAST(m AS BIGINT) FROM jsonb_array_elements_text($4::jsonb) AS m))), \
     taken AS (UPDATE outputs o SET spent_txid = gi.txid FROM gi \
         WHERE o.id = gi.id AND o.id = ANY (ARRAY(SELECT id FROM gi)) AND COALESCE(o.spent_txid, '') = '' \
         RETURNING o.id), \
     t AS (INSERT INTO transfers (kind, user_id, round_id, txid, vout, raw_tx, amount_sats, fee_sats, \
         commission_sats, address, status, created_at) \
         SELECT kind, user_id, round_id, txid, -1, raw_tx, amount_sats, fee_sats, commission_sats, address, \
         $7, $5 FROM g RETURNING id, txid), \
     o AS (INSERT INTO outputs (txid, vout, amount_sats, user_id, round_id, origin) \
         SELECT txid, vout, amount_sats, user_id, round_id, origin FROM go), \
     b AS (INSERT INTO bets (round_id, user_id, amount_sats, txid, created_at, status, fee_sats) \
         SELECT round_id, user_id, amount_sats, txid, $5, $8, fee_sats FROM g \
         RETURNING id, txid, user_id, round_id), \
     n AS (UPDATE rounds r SET bettors = r.bettors + (SELECT COUNT(DISTINCT b.user_id) FROM b \
         WHERE b.round_id = r.id AND NOT EXISTS (SELECT 1 FROM bets p WHERE p.round_id = r.id \
         AND p.user_id = b.user_id AND p.status = $8)) \
         WHERE r.id IN (SELECT round_id FROM g)) \
     SELECT 't' AS what, id, txid FROM t UNION ALL SELECT 'b', id, txid FROM b \
     UNION ALL SELECT 'n', COUNT(*), '' FROM taken";

/// What a group adds to one round.
#[derive(Debug, Default)]
struct RoundGrowth {
    /// The group's bets in the round, summed.
    pot_sats: i64,
    /// How many.
    bets: i64,
    /// How many per user (the per-user share of the round).
    bettors: BTreeMap<i64, i64>,
}

/// `txid → id` of the rows a group inserted.
type IdsByTxid = HashMap<String, i64>;

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// `$n+1, …, $n+count`, advancing `n`.
fn next_placeholders(n: &mut usize, count: usize) -> String {
    let text = placeholders(*n + 1, count);
    *n += count;
    text
}

/// Every input of the group with the txid that spends it.
fn group_inputs(intents: &[&Intent]) -> Vec<(i64, String)> {
    intents
        .iter()
        .flat_map(|i| i.inputs.iter().map(move |&id| (id, i.txid.to_string())))
        .collect()
}

/// Every new output of the group with its txid.
fn group_outputs<'a>(intents: &[&'a Intent]) -> Vec<(String, &'a NewOutput)> {
    intents
        .iter()
        .flat_map(|i| i.outputs.iter().map(move |o| (i.txid.to_string(), o)))
        .collect()
}

/// The group's transfers (one per bet) as JSON rows.
fn group_transfers(intents: &[&Intent]) -> Vec<serde_json::Value> {
    intents
        .iter()
        .map(|i| {
            serde_json::json!({
                "kind": i.kind.as_str(),
                "user_id": i.user_id,
                "round_id": i.round_id,
                "txid": i.txid.to_string(),
                "raw_tx": i.raw_tx,
                "amount_sats": i.amount_sats,
                "fee_sats": i.fee_sats,
                "commission_sats": i.commission_sats,
                "address": i.address,
            })
        })
        .collect()
}

/// The group's new outputs as JSON rows.
fn group_outputs_json(intents: &[&Intent]) -> Vec<serde_json::Value> {
    group_outputs(intents)
        .into_iter()
        .map(|(txid, o)| {
            serde_json::json!({
                "txid": txid,
                "vout": o.vout,
                "amount_sats": o.amount_sats,
                "user_id": o.user_id,
                "round_id": o.round_id,
                "origin": o.origin.as_str(),
            })
        })
        .collect()
}

/// The abort message of a group whose round is no longer open (a macro, so
/// that [`SQLITE_GROUP_SETUP`] and the code reading the error share it).
macro_rules! round_not_open {
    () => {
        "potluck: round not open"
    };
}
/// The abort message of a group that would fill a round past its cap.
macro_rules! round_full {
    () => {
        "potluck: round full"
    };
}
/// The abort message of a group with an input already spent (or named twice).
macro_rules! output_taken {
    () => {
        "potluck: output taken"
    };
}
const ROUND_NOT_OPEN: &str = round_not_open!();
const ROUND_FULL: &str = round_full!();
const OUTPUT_TAKEN: &str = output_taken!();

/// Run on every SQLite connection: the TEMP (per connection, never on disk)
/// view whose `INSTEAD OF` trigger writes a whole group of bets, given as
/// one JSON document `{rounds, max_bets, marks, inputs, transfers, outputs,
/// states}` (`states`: the stored names it compares and writes, from their
/// enums, since a trigger's text takes no bound values),
/// with the guards of a bet alone, in the order a bet alone takes them: every
/// round still open and not filled past `max_bets` (its pot and bet count grow
/// by the group's bets), every input still
/// unspent and named once, the bettor count raised by the group's users
/// with no placed bet in the round yet. A guard that fails aborts the
/// statement, which undoes all of it. The ids of the rows inserted (those
/// above each table's largest id before the insert: AUTOINCREMENT ids only
/// grow, and the statement holds the write lock) are left in
/// `bet_group_ids` for the same connection to read.
pub(super) const SQLITE_GROUP_SETUP: &str = concat!(
    "
CREATE TEMP TABLE IF NOT EXISTS bet_group_ids (what TEXT NOT NULL, id INTEGER NOT NULL, txid TEXT NOT NULL);
CREATE TEMP TABLE IF NOT EXISTS bet_group_from (transfers INTEGER NOT NULL, bets INTEGER NOT NULL);
CREATE TEMP VIEW IF NOT EXISTS bet_groups AS SELECT NULL AS doc, NULL AS now WHERE 0;
CREATE TEMP TRIGGER IF NOT EXISTS bet_groups_insert INSTEAD OF INSERT ON bet_groups BEGIN
    DELETE FROM bet_group_ids;
    DELETE FROM bet_group_from;
    SELECT RAISE(ABORT, '",
    round_not_open!(),
    "') WHERE EXISTS (
        SELECT 1 FROM json_each(NEW.doc, '$.rounds') r WHERE NOT EXISTS (
            SELECT 1 FROM rounds WHERE id = r.value ->> 'id' AND status = NEW.doc ->> '$.states.open' AND closes_at > NEW.now));
    SELECT RAISE(ABORT, '",
    round_full!(),
    "') WHERE EXISTS (
        SELECT 1 FROM json_each(NEW.doc, '$.rounds') r JOIN rounds ON rounds.id = r.value ->> 'id'
        WHERE rounds.bet_count + (r.value ->> 'bets') > NEW.doc ->> '$.max_bets');
    UPDATE rounds SET
        pot_sats = pot_sats + (
            SELECT r.value ->> 'pot' FROM json_each(NEW.doc, '$.rounds') r WHERE r.value ->> 'id' = rounds.id),
        bet_count = bet_count + (
            SELECT r.value ->> 'bets' FROM json_each(NEW.doc, '$.rounds') r WHERE r.value ->> 'id' = rounds.id)
        WHERE id IN (SELECT value ->> 'id' FROM json_each(NEW.doc, '$.rounds'));
    UPDATE transfers SET status = NEW.doc ->> '$.states.broadcast'
        WHERE status = NEW.doc ->> '$.states.signed' AND id IN (SELECT value FROM json_each(NEW.doc, '$.marks'));
    SELECT RAISE(ABORT, '",
    output_taken!(),
    "')
        WHERE (SELECT COUNT(*) FROM json_each(NEW.doc, '$.inputs')) <> (SELECT COUNT(*) FROM outputs
            WHERE spent_txid IS NULL AND id IN (SELECT value ->> 'id' FROM json_each(NEW.doc, '$.inputs')));
    UPDATE outputs SET spent_txid = (
            SELECT i.value ->> 'txid' FROM json_each(NEW.doc, '$.inputs') i WHERE i.value ->> 'id' = outputs.id)
        WHERE id IN (SELECT value ->> 'id' FROM json_each(NEW.doc, '$.inputs'));
    UPDATE rounds SET bettors = bettors + (
            SELECT COUNT(DISTINCT t.value ->> 'user_id') FROM json_each(NEW.doc, '$.transfers') t
            WHERE t.value ->> 'round_id' = rounds.id AND NOT EXISTS (
                SELECT 1 FROM bets p WHERE p.round_id = rounds.id
                AND p.user_id = t.value ->> 'user_id' AND p.status = NEW.doc ->> '$.states.placed'))
        WHERE id IN (SELECT value ->> 'id' FROM json_each(NEW.doc, '$.rounds'));
    INSERT INTO bet_group_from (transfers, bets)
        VALUES (COALESCE((SELECT MAX(id) FROM transfers), 0), COALESCE((SELECT MAX(id) FROM bets), 0));
    INSERT INTO transfers (kind, user_id, round_id, txid, vout, raw_tx, amount_sats, fee_sats,
            commission_sats, address, status, created_at)
        SELECT value ->> 'kind', value ->> 'user_id', value ->> 'round_id', value ->> 'txid', -1,
            value ->> 'raw_tx', value ->> 'amount_sats', value ->> 'fee_sats',
            value ->> 'commission_sats', value ->> 'address', NEW.doc ->> '$.states.signed', NEW.now
        FROM json_each(NEW.doc, '$.transfers');
    INSERT INTO outputs (txid, vout, amount_sats, user_id, round_id, origin)
        SELECT value ->> 'txid', value ->> 'vout', value ->> 'amount_sats', value ->> 'user_id',
            value ->> 'round_id', value ->> 'origin'
        FROM json_each(NEW.doc, '$.outputs');
    INSERT INTO bets (round_id, user_id, amount_sats, txid, created_at, status, fee_sats)
        SELECT value ->> 'round_id', value ->> 'user_id', value ->> 'amount_sats', value ->> 'txid',
            NEW.now, NEW.doc ->> '$.states.placed', value ->> 'fee_sats'
        FROM json_each(NEW.doc, '$.transfers');
    INSERT INTO bet_group_ids (what, id, txid)
        SELECT 't', id, txid FROM transfers WHERE id > (SELECT transfers FROM bet_group_from);
    INSERT INTO bet_group_ids (what, id, txid)
        SELECT 'b', id, txid FROM bets WHERE id > (SELECT bets FROM bet_group_from);
END;
"
);

/// Marks `count` transfers broadcast (`$1`), those still signed (`$2`; a
/// transfer undone or confirmed meanwhile keeps its status); the ids
/// follow `$n`.
fn marks_sql(n: &mut usize, count: usize) -> String {
    format!(
        "UPDATE transfers SET status = $1 WHERE status = $2 AND id IN ({})",
        next_placeholders(n, count)
    )
}

fn bind_all<'q>(mut q: AnyQuery<'q>, ids: &[i64]) -> AnyQuery<'q> {
    for &id in ids {
        q = q.bind(id);
    }
    q
}

/// `txid → id` of rows returned by an insert (RETURNING's row order is not
/// promised by either backend); with `what` non-empty, only the rows whose
/// `what` column says so.
fn ids_by_txid(rows: &[sqlx::any::AnyRow], what: &str) -> Result<IdsByTxid, sqlx::Error> {
    let mut ids = HashMap::new();
    for r in rows {
        if !what.is_empty() && r.try_get::<String, _>("what")? != what {
            continue;
        }
        ids.insert(r.try_get::<String, _>("txid")?, r.try_get::<i64, _>("id")?);
    }
    Ok(ids)
}
