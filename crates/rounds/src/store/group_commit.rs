//! Group commit of bet intents and broadcast marks: the requests that arrive while a group is being written are written together in the next transaction, each answered only after the commit that holds it.
//!
//! Why: every bet wrote its intent in a transaction of its own that held the
//! round's row (its pot grows) from the first statement to the commit. On
//! PostgreSQL that is seven round trips and a WAL flush per bet during which
//! every other bet of the round waits; on SQLite it is nine statements, each
//! two thread hand-offs to sqlx's worker. A group pays one transaction and
//! one statement per table for all its bets, and the broadcast marks of
//! bets already written ride along.
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
use std::sync::{Arc, Mutex, MutexGuard};

use sqlx::Row;
use tokio::sync::oneshot;

use super::ledger::{placeholders, LedgerError, BATCH};
use super::{Store, StoreError};
use crate::domain::money::Intent;
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
    done: oneshot::Sender<Result<(), StoreError>>,
}

impl GroupCommit {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // The lock guards plain pushes and swaps that cannot panic halfway,
        // so a poisoned queue is still consistent.
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
        p.marks.clear();
    }
}

fn group_lost() -> StoreError {
    StoreError::GroupWriteLost
}

impl Store {
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
        self.enqueue(|p| p.marks.push(MarkRequest { transfer_id, done }));
        answer.await.map_err(|_| group_lost())?
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
        if bets.is_empty() {
            // Marks cannot fail one another: one statement, one answer.
            match self.mark_broadcast_all(&mark_ids).await {
                Ok(()) => marks.into_iter().for_each(|m| {
                    let _ = m.done.send(Ok(()));
                }),
                Err(_) => self.mark_each(marks).await,
            }
            return;
        }
        if bets.len() > 1 {
            let intents: Vec<&Intent> = bets.iter().map(|b| &b.intent).collect();
            match self.write_group(&intents, &mark_ids).await {
                Ok(ids) => {
                    for (b, ids) in bets.into_iter().zip(ids) {
                        let _ = b.done.send(Ok(ids));
                    }
                    for m in marks {
                        let _ = m.done.send(Ok(()));
                    }
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, bets = intents.len(), "group write refused; writing its bets one by one");
                }
            }
        }
        if !marks.is_empty() {
            self.mark_each(marks).await;
        }
        for b in bets {
            let answer = self.place_bet_alone(&b.intent).await;
            let _ = b.done.send(answer);
        }
    }

    /// Marks one by one, each with its own answer.
    async fn mark_each(&self, marks: Vec<MarkRequest>) {
        for m in marks {
            let answer = self.mark_broadcast_all(&[m.transfer_id]).await;
            let _ = m.done.send(answer);
        }
    }

    /// Marks the signed transfers among `ids` as broadcast, in one statement.
    async fn mark_broadcast_all(&self, ids: &[i64]) -> Result<(), StoreError> {
        let _turn = self.write_turn().await;
        for chunk in ids.chunks(BATCH) {
            let sql = marks_sql(chunk.len());
            bind_all(sqlx::query(&sql), chunk)
                .execute(self.pool())
                .await?;
        }
        Ok(())
    }

    /// Writes the bets `intents` (two or more) and marks `marks` broadcast in
    /// one transaction, with one statement per table. Returns `(bet id,
    /// transfer id)` per intent, in order; any refusal rolls everything back.
    async fn write_group(
        &self,
        intents: &[&Intent],
        marks: &[i64],
    ) -> Result<Vec<(i64, i64)>, LedgerError> {
        let txids: HashSet<&str> = intents.iter().map(|i| i.txid.as_str()).collect();
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
        let mut rounds: BTreeMap<i64, i64> = BTreeMap::new();
        for i in intents {
            *rounds.entry(i.round_id.unwrap_or(0)).or_default() += i.amount_sats;
        }
        let _turn = self.write_turn().await;
        let mut tx = self.pool().begin().await?;
        for chunk in marks.chunks(BATCH) {
            let sql = marks_sql(chunk.len());
            bind_all(sqlx::query(&sql), chunk).execute(&mut *tx).await?;
        }
        // The rounds first, as a bet alone does: the same lock order, and
        // a round closed meanwhile refuses the whole group.
        for (&round_id, &pot_sats) in &rounds {
            let open = sqlx::query(
                "UPDATE rounds SET pot_sats = pot_sats + $3 WHERE id = $1 AND status = 'open' AND closes_at > $2",
            )
            .bind(round_id)
            .bind(now)
            .bind(pot_sats)
            .execute(&mut *tx)
            .await?;
            if open.rows_affected() != 1 {
                return Err(LedgerError::WrongStatus {
                    round_id,
                    expected: crate::domain::round::RoundStatus::Open,
                });
            }
        }
        // Every input of every bet, each still unspent (an input named twice
        // in the group counts once and fails the count).
        let inputs: Vec<(i64, &str)> = intents
            .iter()
            .flat_map(|i| i.inputs.iter().map(move |&id| (id, i.txid.as_str())))
            .collect();
        for chunk in inputs.chunks(BATCH / 2) {
            let cases = (0..chunk.len())
                .map(|k| format!("WHEN ${} THEN ${}", 1 + 2 * k, 2 + 2 * k))
                .collect::<Vec<_>>()
                .join(" ");
            let ids = (0..chunk.len())
                .map(|k| format!("${}", 1 + 2 * k))
                .collect::<Vec<_>>()
                .join(", ");
            let sql = format!(
                "UPDATE outputs SET spent_txid = CASE id {cases} END WHERE spent_txid IS NULL AND id IN ({ids})"
            );
            let mut q = sqlx::query(&sql);
            for (id, txid) in chunk {
                q = q.bind(*id).bind(*txid);
            }
            if q.execute(&mut *tx).await?.rows_affected() != chunk.len() as u64 {
                return Err(LedgerError::OutputTaken(chunk[0].0));
            }
        }
        let rows = (0..intents.len())
            .map(|k| {
                let p = 10 * k;
                format!(
                    "(${}, ${}, ${}, ${}, -1, ${}, ${}, ${}, ${}, ${}, 'signed', ${})",
                    p + 1,
                    p + 2,
                    p + 3,
                    p + 4,
                    p + 5,
                    p + 6,
                    p + 7,
                    p + 8,
                    p + 9,
                    p + 10
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "INSERT INTO transfers (kind, user_id, round_id, txid, vout, raw_tx, amount_sats, fee_sats, \
             commission_sats, address, status, created_at) VALUES {rows} RETURNING id, txid"
        );
        let mut q = sqlx::query(&sql);
        for i in intents {
            q = q
                .bind(i.kind.as_str())
                .bind(i.user_id)
                .bind(i.round_id)
                .bind(&i.txid)
                .bind(&i.raw_tx)
                .bind(i.amount_sats)
                .bind(i.fee_sats)
                .bind(i.commission_sats)
                .bind(i.address.as_deref())
                .bind(now);
        }
        let transfer_ids = ids_by_txid(q.fetch_all(&mut *tx).await?)?;
        let outputs: Vec<_> = intents
            .iter()
            .flat_map(|i| i.outputs.iter().map(move |o| (i.txid.as_str(), o)))
            .collect();
        for chunk in outputs.chunks(BATCH / 6) {
            let rows = (0..chunk.len())
                .map(|k| format!("({})", placeholders(1 + 6 * k, 6)))
                .collect::<Vec<_>>()
                .join(", ");
            let sql = format!(
                "INSERT INTO outputs (txid, vout, amount_sats, user_id, round_id, origin) VALUES {rows}"
            );
            let mut q = sqlx::query(&sql);
            for (txid, o) in chunk {
                q = q
                    .bind(*txid)
                    .bind(o.vout)
                    .bind(o.amount_sats)
                    .bind(o.user_id)
                    .bind(o.round_id)
                    .bind(o.origin.as_str());
            }
            q.execute(&mut *tx).await?;
        }
        let rows = (0..intents.len())
            .map(|k| {
                let p = 6 * k;
                format!(
                    "(${}, ${}, ${}, ${}, ${}, 'placed', ${})",
                    p + 1,
                    p + 2,
                    p + 3,
                    p + 4,
                    p + 5,
                    p + 6
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "INSERT INTO bets (round_id, user_id, amount_sats, txid, created_at, status, fee_sats) \
             VALUES {rows} RETURNING id, txid"
        );
        let mut q = sqlx::query(&sql);
        for i in intents {
            q = q
                .bind(i.round_id.unwrap_or(0))
                .bind(i.user_id)
                .bind(i.amount_sats)
                .bind(&i.txid)
                .bind(now)
                .bind(i.fee_sats);
        }
        let bet_ids = ids_by_txid(q.fetch_all(&mut *tx).await?)?;
        // New bettors: the group's users with no placed bet in the round
        // outside the group. Read under the round's lock, in a statement of
        // its own (PostgreSQL's snapshot then sees every bet committed
        // before the lock was granted).
        for &round_id in rounds.keys() {
            let ids: Vec<i64> = intents
                .iter()
                .filter(|i| i.round_id.unwrap_or(0) == round_id)
                .filter_map(|i| bet_ids.get(i.txid.as_str()).copied())
                .collect();
            let list = placeholders(2, ids.len());
            let sql = format!(
                "UPDATE rounds SET bettors = bettors + (SELECT COUNT(DISTINCT b.user_id) FROM bets b \
                 WHERE b.id IN ({list}) AND NOT EXISTS (SELECT 1 FROM bets p WHERE p.round_id = $1 \
                 AND p.user_id = b.user_id AND p.status = 'placed' AND p.id NOT IN ({list}))) WHERE id = $1"
            );
            let q = bind_all(sqlx::query(&sql).bind(round_id), &ids);
            q.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        intents
            .iter()
            .map(|i| {
                match (
                    bet_ids.get(i.txid.as_str()),
                    transfer_ids.get(i.txid.as_str()),
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
}

/// Marks `n` transfers broadcast, those still `signed` (a transfer undone or
/// confirmed meanwhile keeps its status).
fn marks_sql(n: usize) -> String {
    format!(
        "UPDATE transfers SET status = 'broadcast' WHERE status = 'signed' AND id IN ({})",
        placeholders(1, n)
    )
}

fn bind_all<'q>(
    mut q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    ids: &[i64],
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    for &id in ids {
        q = q.bind(id);
    }
    q
}

/// `txid → id` of rows returned by an insert (RETURNING's row order is not
/// promised by either backend).
fn ids_by_txid(rows: Vec<sqlx::any::AnyRow>) -> Result<HashMap<String, i64>, sqlx::Error> {
    rows.iter()
        .map(|r| Ok((r.try_get::<String, _>("txid")?, r.try_get::<i64, _>("id")?)))
        .collect()
}
