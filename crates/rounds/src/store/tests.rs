//! Store tests, each run on SQLite and on PostgreSQL (a fresh database per test).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use bitcoin::Txid;
use sqlx::Row as _;

use super::migrations::CASE_INSENSITIVE_USERNAMES;
use super::*;
use crate::domain::audit::AuditActor;
use crate::domain::round::{OutputOrigin, RoundStatus, TransferKind, TransferStatus};
use crate::domain::settings::{ConfigPatch, ServiceConfig};

/// The PostgreSQL server used by tests (override with POTLUCK_TEST_PG).
fn pg_admin_url() -> String {
    std::env::var("POTLUCK_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A fresh, empty database; dropped by `cleanup`.
struct TestDb {
    store: Store,
    pg_name: Option<String>,
    sqlite_path: Option<std::path::PathBuf>,
}

impl TestDb {
    async fn new(backend: Backend) -> Self {
        let unique = format!("potluck_t_{:016x}", rand::random::<u64>());
        match backend {
            Backend::Sqlite => {
                let path = std::env::temp_dir().join(format!("{unique}.db"));
                let store = Store::connect(&format!("sqlite://{}", path.display()), 4)
                    .await
                    .unwrap();
                Self {
                    store,
                    pg_name: None,
                    sqlite_path: Some(path),
                }
            }
            Backend::Postgres => {
                let admin = Store::connect(&pg_admin_url(), 1).await.unwrap();
                sqlx::raw_sql(&format!("CREATE DATABASE {unique}"))
                    .execute(admin.pool())
                    .await
                    .unwrap();
                admin.close().await;
                let base = pg_admin_url();
                let url = format!("{}/{unique}", &base[..base.rfind('/').unwrap()]);
                let store = Store::connect(&url, 4).await.unwrap();
                Self {
                    store,
                    pg_name: Some(unique),
                    sqlite_path: None,
                }
            }
        }
    }

    /// Closes the pool first (the database itself goes on drop).
    async fn cleanup(self) {
        self.store.close().await;
    }
}

impl Drop for TestDb {
    /// Removes the test's database (PostgreSQL) or files (SQLite) however
    /// the test ended, a failed assertion included.
    fn drop(&mut self) {
        if let Some(name) = self.pg_name.take() {
            // Drop cannot await: a thread with a runtime of its own does.
            let dropped = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(async {
                    let admin = Store::connect(&pg_admin_url(), 1)
                        .await
                        .map_err(|e| e.to_string())?;
                    sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(admin.pool())
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
        if let Some(path) = self.sqlite_path.take() {
            for suffix in ["", "-wal", "-shm"] {
                // Absent companions are expected.
                std::fs::remove_file(format!("{}{suffix}", path.display())).ok();
            }
        }
    }
}

/// A block hash on branch `branch` (a letter) at `height`: the letter's
/// byte repeated, the last byte the height, so that two branches differ.
fn block(branch: u8, height: i64) -> bitcoin::BlockHash {
    use bitcoin::hashes::Hash as _;
    let mut bytes = [branch; 32];
    bytes[31] = u8::try_from(height).expect("test heights fit a byte");
    bitcoin::BlockHash::from_byte_array(bytes)
}

fn addr(i: u32) -> Result<String, String> {
    Ok(format!("addr-{i}"))
}

fn config() -> ServiceConfig {
    ServiceConfig {
        fee_address: "fee".into(),
        fee_rate_sat_vb: 2,
        round_duration_seconds: 120,
        min_bet_sats: 1000,
        min_withdrawal_sats: 1000,
        deposit_confirmations: 1,
        paused: false,
    }
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test] async fn $name() { super::$name(super::Backend::Sqlite).await })*
        }
        mod postgres {
            $(#[tokio::test] async fn $name() { super::$name(super::Backend::Postgres).await })*
        }
    };
}

both_backends!(
    every_state_binds_as_its_stored_name,
    users_are_unique_ignoring_case_and_get_distinct_indexes,
    concurrent_case_variants_give_one_account,
    derivation_index_collision_retries_then_conflicts,
    case_collision_blocks_the_upgrade,
    a_database_of_the_previous_migrator_is_adopted,
    password_changes_bump_token_version,
    config_updates_are_audited_with_diffs,
    first_round_is_created_once,
    an_output_is_spent_once_even_concurrently,
    one_payout_per_round,
    reorg_unwinds_deposits_and_confirmations,
    refused_broadcast_releases_the_inputs,
    the_close_fixes_the_bets_written_before_it_and_refuses_later_ones,
    an_unknown_spend_is_audited_once_per_output_across_an_upgrade,
    bets_keep_pot_and_bettors_equal_to_a_recount,
    bets_written_together_each_get_their_own_outcome,
    every_connection_commits_to_the_disk_before_it_answers,
    the_payment_context_reads_the_coins_spendable_at_its_tip,
    a_queued_mark_reads_broadcast_to_its_user_until_it_is_committed,
    a_round_refuses_bets_past_its_cap_alone_or_grouped,
    a_retried_payout_records_the_winner_output_the_failed_one_lacked,
    the_first_block_at_the_draw_height_stays_the_draw_block,
    an_idempotency_key_binds_one_payment_and_a_claim_taken_over_binds_none,
    a_user_takes_no_more_than_its_share_of_a_round_alone_or_grouped,
    no_payment_is_saved_once_the_pause_has_answered,
    a_page_of_rounds_costs_the_same_however_many_rounds_and_bets,
    a_bumped_payout_shows_its_round_once_with_the_live_version,
    a_payment_reads_a_bounded_number_of_coins_and_no_dust,
    only_a_child_of_the_close_tip_becomes_the_draw_block,
    a_stored_block_hash_that_is_not_one_is_a_typed_error,
    a_transfer_whose_txid_is_not_one_is_not_watched_and_the_others_are,
);

/// A bet is answered once its broadcast is accepted, before its mark
/// (`signed` → `broadcast`) is committed: meanwhile its user's list shows
/// it `broadcast`, as the answer said, the database still `signed` (a
/// crash now is a crash between broadcast and mark); then the mark is
/// committed with no one waiting for it and the overlay is gone.
/// Every state a query is given reaches the database as the name the store
/// reads back: the enums are the one place the names are spelled.
async fn every_state_binds_as_its_stored_name(b: Backend) {
    use crate::domain::audit::AuditEvent;
    use crate::domain::round::BetStatus;
    let db = TestDb::new(b).await;
    macro_rules! round_trip {
        ($($t:ty),+) => {$(
            for &v in <$t>::ALL {
                let back: String = sqlx::query_scalar("SELECT CAST($1 AS TEXT)")
                    .bind(v)
                    .fetch_one(db.store.pool())
                    .await
                    .unwrap();
                assert_eq!(back, v.as_str());
                assert_eq!(back.parse::<$t>(), Ok(v));
            }
        )+};
    }
    round_trip!(
        RoundStatus,
        TransferKind,
        TransferStatus,
        OutputOrigin,
        BetStatus,
        AuditEvent,
        AuditActor
    );
}

async fn a_queued_mark_reads_broadcast_to_its_user_until_it_is_committed(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    let (user, out) = funded(s).await;
    let round = s
        .ensure_round(crate::domain::time::unix_now())
        .await
        .unwrap();
    let bet = bet_spending(user, round.id, 4, vec![out]);
    let (_, transfer) = s.place_bet(&bet).await.unwrap();
    let listed = |s: &Store| {
        let s = s.clone();
        async move {
            s.user_transfers(user, 10, None)
                .await
                .unwrap()
                .into_iter()
                .find(|t| t.id == transfer)
                .unwrap()
                .status
        }
    };
    assert_eq!(listed(s).await, TransferStatus::Signed);
    // Another writer holds the transfer (SQLite: the write lock; PostgreSQL:
    // its row), so the mark cannot commit yet.
    let mut blocker = s.pool().begin().await.unwrap();
    sqlx::query("UPDATE transfers SET status = status WHERE id = $1")
        .bind(transfer)
        .execute(&mut *blocker)
        .await
        .unwrap();
    s.mark_broadcast_soon(transfer);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(s.broadcast_unmarked(transfer));
    assert_eq!(listed(s).await, TransferStatus::Broadcast);
    assert_eq!(
        s.transfer(transfer).await.unwrap().unwrap().status,
        TransferStatus::Signed,
        "not committed yet"
    );
    blocker.rollback().await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.broadcast_unmarked(transfer) {
        assert!(
            std::time::Instant::now() < deadline,
            "the mark never settled"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(
        s.transfer(transfer).await.unwrap().unwrap().status,
        TransferStatus::Broadcast
    );
    assert_eq!(listed(s).await, TransferStatus::Broadcast);
}

/// A committed write (a bet's intent before its broadcast, a withdrawal before its
/// answer) must survive a power cut, not only a killed process: on SQLite
/// `synchronous = FULL` on every pooled connection (WAL with NORMAL may lose the last
/// commits when the machine stops), on PostgreSQL `synchronous_commit = on` on every
/// connection (group commits relax it for a transaction of broadcast marks alone, with
/// `set_config(…, true)`, which ends with that transaction).
async fn every_connection_commits_to_the_disk_before_it_answers(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    s.migrate().await.unwrap();
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(s.pool().acquire().await.unwrap());
    }
    for conn in &mut conns {
        match b {
            Backend::Sqlite => {
                let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
                    .fetch_one(&mut **conn)
                    .await
                    .unwrap();
                assert_eq!(level, 2, "PRAGMA synchronous (2 = FULL)");
            }
            Backend::Postgres => {
                let level: String = sqlx::query_scalar("SHOW synchronous_commit")
                    .fetch_one(&mut **conn)
                    .await
                    .unwrap();
                assert_eq!(level, "on");
            }
        }
    }
    drop(conns);
}

async fn users_are_unique_ignoring_case_and_get_distinct_indexes(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    s.migrate().await.unwrap();
    let bob = s.create_user("Bob", "h1", addr).await.unwrap();
    assert_eq!(
        (
            bob.username.as_str(),
            bob.derivation_index,
            bob.address.as_str()
        ),
        ("Bob", 0, "addr-0")
    );
    let amy = s.create_user("amy", "h2", addr).await.unwrap();
    assert_eq!(amy.derivation_index, 1);
    assert!(
        matches!(s.create_user("bOB", "h3", addr).await, Err(StoreError::UsernameTaken(n)) if n == "bOB")
    );
    let found = s.user_by_name("BOB").await.unwrap().unwrap();
    assert_eq!(found.username, "Bob", "stored as typed");
    assert_eq!(s.user_by_id(amy.id).await.unwrap().unwrap().username, "amy");
    assert!(s.user_by_name("carol").await.unwrap().is_none());
    // Migrating again is a no-op.
    s.migrate().await.unwrap();
}

async fn concurrent_case_variants_give_one_account(b: Backend) {
    let db = TestDb::new(b).await;
    db.store.migrate().await.unwrap();
    for round in 0..5 {
        let (upper, lower) = (format!("Racer{round}"), format!("racer{round}"));
        let (a, c) = tokio::join!(
            db.store.create_user(&upper, "h", addr),
            db.store.create_user(&lower, "h", addr)
        );
        let oks = [a.is_ok(), c.is_ok()].iter().filter(|x| **x).count();
        assert_eq!(
            oks, 1,
            "exactly one of two concurrent case variants is created"
        );
        let err = match (a, c) {
            (Err(e), _) | (_, Err(e)) => e,
            _ => unreachable!("one of them failed"),
        };
        assert!(matches!(err, StoreError::UsernameTaken(_)), "{err:?}");
    }
}

async fn derivation_index_collision_retries_then_conflicts(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    s.migrate().await.unwrap();
    s.create_user("first", "h", addr).await.unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let err = s
        .create_user_with("second", "h", addr, move || {
            c.fetch_add(1, Ordering::SeqCst);
            async { Ok(0) }
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::DerivationIndexConflict),
        "{err:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), DERIVATION_INDEX_ATTEMPTS);
    // A collision followed by a free index succeeds on the retry.
    let c = Arc::new(AtomicU32::new(0));
    let c2 = c.clone();
    let user = s
        .create_user_with("third", "h", addr, move || {
            let n = c2.fetch_add(1, Ordering::SeqCst);
            async move { Ok(if n == 0 { 0 } else { 7 }) }
        })
        .await
        .unwrap();
    assert_eq!(user.derivation_index, 7);
    assert!(s.user_by_name("second").await.unwrap().is_none());
}

/// A database created by the hand-written migrator (versions recorded in
/// `potluck_schema_migrations`) starts under `sqlx::migrate!` without being
/// migrated again, keeps its data, and later migrations still apply.
async fn a_database_of_the_previous_migrator_is_adopted(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    let dir = match b {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    };
    let files = [
        "0001_initial.sql",
        "0002_username_case_insensitive.sql",
        "0003_money.sql",
    ];
    // What the previous migrator did: each file, then a row in its table.
    sqlx::raw_sql(
        "CREATE TABLE potluck_schema_migrations (\
           version BIGINT PRIMARY KEY, description TEXT NOT NULL, applied_at BIGINT NOT NULL)",
    )
    .execute(s.pool())
    .await
    .unwrap();
    for (i, file) in files.iter().enumerate() {
        let path = format!("{}/migrations/{dir}/{file}", env!("CARGO_MANIFEST_DIR"));
        let sql = std::fs::read_to_string(path).unwrap();
        sqlx::raw_sql(&sql).execute(s.pool()).await.unwrap();
        sqlx::query("INSERT INTO potluck_schema_migrations VALUES ($1, 'x', 0)")
            .bind(i as i64 + 1)
            .execute(s.pool())
            .await
            .unwrap();
    }
    let bob = s.create_user("Bob", "h1", addr).await.unwrap();
    s.migrate()
        .await
        .expect("the old install is adopted, not re-migrated");
    s.migrate().await.expect("and a second start is a no-op");
    assert_eq!(s.user_by_name("bob").await.unwrap().unwrap().id, bob.id);
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(s.pool())
            .await
            .unwrap();
    // Every version shipped: 1-3 adopted, the later ones applied now. The
    // versions are read from the file names: branches reserve numbers, so
    // the shipped ones need not be contiguous.
    let mut shipped: Vec<i64> =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite"))
            .unwrap()
            .map(|e| {
                let name = e.unwrap().file_name().to_string_lossy().into_owned();
                name.split('_').next().unwrap().parse().unwrap()
            })
            .collect();
    shipped.sort_unstable();
    assert!(shipped.len() >= 5, "{shipped:?} migrations");
    assert_eq!(versions, shipped, "1-3 adopted, the later ones applied now");
    // Version 4 (coinbase maturity) really ran.
    sqlx::query("SELECT min_confirmations FROM outputs LIMIT 1")
        .fetch_optional(s.pool())
        .await
        .expect("the column added by version 4 exists");
}

async fn case_collision_blocks_the_upgrade(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    s.migrate_to(1).await.unwrap();
    for (i, name) in ["Bob", "bob", "BOB", "amy", "Carl", "carl"]
        .iter()
        .enumerate()
    {
        sqlx::query("INSERT INTO users (username, password_hash, derivation_index, address, created_at) VALUES ($1, 'h', $2, 'a', 0)")
            .bind(*name)
            .bind(100 + i as i64)
            .execute(s.pool())
            .await
            .unwrap();
    }
    let err = s.migrate().await.unwrap_err();
    match &err {
        StoreError::CaseCollisions {
            version,
            collisions,
        } => {
            assert_eq!(*version, CASE_INSENSITIVE_USERNAMES);
            assert_eq!(
                collisions,
                &vec![
                    vec!["BOB".to_string(), "Bob".into(), "bob".into()],
                    vec!["Carl".into(), "carl".into()]
                ]
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("Bob"));
    // Nothing merged or renamed, and the upgrade is still pending.
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM users")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(n, 6);
    let v: i64 = sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(v, 1);
    // After the operator resolves the collisions, the upgrade runs.
    sqlx::query("UPDATE users SET username = username || '_' || id WHERE username IN ('bob', 'BOB', 'carl')").execute(s.pool()).await.unwrap();
    s.migrate().await.unwrap();
    assert!(matches!(
        s.create_user("AMY", "h", addr).await,
        Err(StoreError::UsernameTaken(_))
    ));
}

async fn password_changes_bump_token_version(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    s.migrate().await.unwrap();
    s.init_config(&config()).await.unwrap();
    let u = s.create_user("Dora", "old", addr).await.unwrap();
    assert_eq!(s.change_password(u.id, 0, "new").await.unwrap(), Some(1));
    assert_eq!(
        s.change_password(u.id, 0, "newer").await.unwrap(),
        None,
        "stale session cannot change it"
    );
    assert_eq!(
        s.token_version(u.id).await.unwrap(),
        Some(("Dora".into(), 1))
    );
    assert_eq!(
        s.reset_password("dORA", "reset", AuditActor::Admin)
            .await
            .unwrap(),
        Some(("Dora".into(), 2))
    );
    assert_eq!(
        s.reset_password("nobody", "reset", AuditActor::Admin)
            .await
            .unwrap(),
        None
    );
    let row = s.user_by_id(u.id).await.unwrap().unwrap();
    assert_eq!(
        (row.password_hash.as_str(), row.token_version),
        ("reset", 2)
    );
    let audit = s.audit_page(10, None).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].event, "password_reset");
    assert_eq!(
        serde_json::to_value(&audit[0].details).unwrap(),
        serde_json::json!({"username": "Dora", "token_version": 2})
    );
}

async fn config_updates_are_audited_with_diffs(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    s.migrate().await.unwrap();
    s.init_config(&config()).await.unwrap();
    s.init_config(&ServiceConfig {
        fee_rate_sat_vb: 99,
        ..config()
    })
    .await
    .unwrap();
    assert_eq!(s.config().await.unwrap(), config(), "init never overwrites");
    let patch = ConfigPatch {
        fee_rate_sat_vb: Some(5),
        round_duration_seconds: Some(120),
        ..Default::default()
    };
    let (after, diff) = s.update_config(&patch, AuditActor::Admin).await.unwrap();
    assert_eq!(after.fee_rate_sat_vb, 5);
    assert_eq!(
        serde_json::to_value(&diff).unwrap(),
        serde_json::json!({"fee_rate_sat_vb": {"before": 2, "after": 5}})
    );
    // A no-op writes nothing.
    let (_, diff) = s.update_config(&patch, AuditActor::Admin).await.unwrap();
    assert!(diff.is_empty());
    assert!(s.set_paused(true, AuditActor::Admin).await.unwrap().1);
    assert!(!s.set_paused(true, AuditActor::Admin).await.unwrap().1);
    assert!(s.config().await.unwrap().paused);
    assert!(s.set_paused(false, AuditActor::Admin).await.unwrap().1);
    let all = s.audit_page(10, None).await.unwrap();
    let events: Vec<&str> = all.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(events, ["resumed", "paused", "config_updated"]);
    assert_eq!(
        serde_json::to_value(&all[2].diff).unwrap(),
        serde_json::json!({"fee_rate_sat_vb": {"before": 2, "after": 5}})
    );
    assert_eq!(
        serde_json::to_value(&all[0].diff).unwrap(),
        serde_json::json!({"paused": {"before": true, "after": false}})
    );
    assert_eq!(
        serde_json::to_value(&all[0].details).unwrap(),
        serde_json::json!({})
    );
    assert!(all[2].at.ends_with('Z'));
    let page = s.audit_page(2, None).await.unwrap();
    assert_eq!(page.len(), 2);
    let rest = s.audit_page(2, Some(page[1].id)).await.unwrap();
    assert_eq!(
        rest.iter().map(|e| e.event.as_str()).collect::<Vec<_>>(),
        ["config_updated"]
    );
    // Concurrent updates serialise: every change is audited exactly once.
    let mut tasks = Vec::new();
    for rate in 10..20 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.update_config(
                &ConfigPatch {
                    fee_rate_sat_vb: Some(rate),
                    ..Default::default()
                },
                AuditActor::Admin,
            )
            .await
            .unwrap()
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM audit_log WHERE event = 'config_updated'")
            .fetch_one(s.pool())
            .await
            .unwrap();
    assert_eq!(n, 11);
}

async fn first_round_is_created_once(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    s.migrate().await.unwrap();
    s.init_config(&config()).await.unwrap();
    assert!(s.current_round().await.unwrap().is_none());
    let (r1, r2) = tokio::join!(s.ensure_round(1000), s.ensure_round(1000));
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    assert_eq!(r1, r2);
    assert_eq!(
        (r1.status.as_str(), r1.opened_at, r1.closes_at),
        ("open", 1000, 1120)
    );
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM rounds")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);
    let u = s.create_user("eve", "h", addr).await.unwrap();
    assert!(!s.user_played(r1.id, u.id).await.unwrap());
    sqlx::query(
        "INSERT INTO bets (round_id, user_id, amount_sats, created_at) VALUES ($1, $2, 5000, 0)",
    )
    .bind(r1.id)
    .bind(u.id)
    .execute(s.pool())
    .await
    .unwrap();
    assert!(s.user_played(r1.id, u.id).await.unwrap());
}

mod money {
    use crate::domain::money::{Intent, NewOutput};
    use crate::domain::phase::{DrawBlock, DrawResult};
    use crate::domain::round::{OutputOrigin, TransferKind};
    use crate::store::LedgerError;

    pub(super) fn intent(
        kind: TransferKind,
        user: i64,
        round: Option<i64>,
        txid: &str,
        inputs: Vec<i64>,
    ) -> Intent {
        Intent {
            kind,
            user_id: Some(user),
            round_id: round,
            txid: txid.parse().unwrap(),
            raw_tx: "00".into(),
            amount_sats: 10_000,
            fee_sats: 200,
            commission_sats: 0,
            address: None,
            inputs,
            outputs: vec![NewOutput {
                vout: 1,
                amount_sats: 89_800,
                user_id: Some(user),
                round_id: None,
                origin: OutputOrigin::Change,
            }],
        }
    }

    pub(super) fn is_taken(r: &Result<i64, LedgerError>) -> bool {
        matches!(r, Err(LedgerError::OutputTaken(_)))
    }

    pub(super) fn draw() -> DrawResult {
        DrawResult {
            block: DrawBlock {
                height: 11,
                hash: "ab".repeat(32).parse().unwrap(),
            },
            seed: "cd".repeat(32).parse().unwrap(),
            ticket: 0,
            winner_bet_id: 1,
        }
    }
}

/// The 100,000-sat deposit output `d…d:0` to `user_id`.
fn deposit(user_id: i64) -> crate::store::chain::Deposit {
    crate::store::chain::Deposit {
        txid: "d".repeat(64).parse().unwrap(),
        vout: 0,
        amount_sats: 100_000,
        user_id,
        coinbase: false,
    }
}

/// A user with one credited 100,000-sat deposit at height 10.
async fn funded(store: &Store) -> (i64, i64) {
    store.migrate().await.unwrap();
    store.init_config(&config()).await.unwrap();
    let u = store.create_user("payer", "h", addr).await.unwrap();
    store.record_start_block(9, block(b'h', 9)).await.unwrap();
    store
        .connect_block(10, block(b'h', 10), &[], &[deposit(u.id)])
        .await
        .unwrap();
    let outs = store.spendable_outputs(u.id, 1).await.unwrap();
    assert_eq!(outs.len(), 1);
    (u.id, outs[0].id)
}

async fn an_output_is_spent_once_even_concurrently(b: Backend) {
    let db = TestDb::new(b).await;
    let (user, out) = funded(&db.store).await;
    assert_eq!(
        db.store.balances(user, 1).await.unwrap(),
        (100_000, 100_000, false)
    );
    let (s1, s2) = (db.store.clone(), db.store.clone());
    let i1 = money::intent(
        TransferKind::Withdrawal,
        user,
        None,
        &"1".repeat(64),
        vec![out],
    );
    let i2 = money::intent(
        TransferKind::Withdrawal,
        user,
        None,
        &"2".repeat(64),
        vec![out],
    );
    let (r1, r2) = tokio::join!(
        tokio::spawn(async move { s1.record_withdrawal(&i1).await }),
        tokio::spawn(async move { s2.record_withdrawal(&i2).await })
    );
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    assert!(r1.is_ok() != r2.is_ok(), "exactly one spend: {r1:?} {r2:?}");
    assert!(money::is_taken(&r1) || money::is_taken(&r2));
    // Confirmed balance drops by the whole output; pending shows the change.
    assert_eq!(db.store.balances(user, 1).await.unwrap(), (0, 89_800, true));
    let again = money::intent(
        TransferKind::Withdrawal,
        user,
        None,
        &"3".repeat(64),
        vec![out],
    );
    assert!(money::is_taken(&db.store.record_withdrawal(&again).await));
}

/// The first block processed at a round's draw height is stored on the
/// round with the block, and a reorganisation that replaces it leaves it
/// there: the engine draws from it however late it gets to the round.
/// Empty rounds and rounds closed at another height are left alone.
async fn the_first_block_at_the_draw_height_stays_the_draw_block(b: Backend) {
    let db = TestDb::new(b).await;
    let (user, out) = funded(&db.store).await;
    let round = db
        .store
        .ensure_round(crate::domain::time::unix_now())
        .await
        .unwrap();
    let bet = bet_spending(user, round.id, 4, vec![out]);
    let (_, transfer) = db.store.place_bet(&bet).await.unwrap();
    db.store.mark_broadcast(transfer).await.unwrap();
    assert!(db
        .store
        .close_round(round.id, 10, None, |b| b.len().to_string())
        .await
        .unwrap());
    let draw_block = |s: Store, id: i64| async move {
        let d = s.round_detail(id).await.unwrap().unwrap().draw;
        (d.block_height, d.block_hash)
    };
    assert_eq!(draw_block(db.store.clone(), round.id).await, (None, None));
    db.store
        .connect_block(11, block(b'a', 11), &[], &[])
        .await
        .unwrap();
    let first = (Some(11), Some(block(b'a', 11).to_string()));
    assert_eq!(draw_block(db.store.clone(), round.id).await, first);
    db.store.unwind_above(10).await.unwrap();
    db.store
        .connect_block(11, block(b'b', 11), &[], &[])
        .await
        .unwrap();
    db.store
        .connect_block(12, block(b'b', 12), &[], &[])
        .await
        .unwrap();
    assert!(db
        .store
        .move_round(round.id, RoundStatus::Closing, RoundStatus::Drawing)
        .await
        .unwrap());
    assert_eq!(draw_block(db.store.clone(), round.id).await, first);
}

async fn one_payout_per_round(b: Backend) {
    let db = TestDb::new(b).await;
    let (user, out) = funded(&db.store).await;
    let round = db
        .store
        .ensure_round(crate::domain::time::unix_now())
        .await
        .unwrap();
    let bet = bet_spending(user, round.id, 4, vec![out]);
    let (_, transfer) = db.store.place_bet(&bet).await.unwrap();
    // A bet still being broadcast holds the round open.
    assert!(!db
        .store
        .close_round(round.id, 10, None, |b| b.len().to_string())
        .await
        .unwrap());
    assert_eq!(
        db.store.current_round().await.unwrap().unwrap().status,
        RoundStatus::Open
    );
    db.store.mark_broadcast(transfer).await.unwrap();
    assert!(db
        .store
        .close_round(round.id, 10, None, |b| b.len().to_string())
        .await
        .unwrap());
    // A bet after closing is refused by the round's status.
    let late = money::intent(
        TransferKind::Bet,
        user,
        Some(round.id),
        &"5".repeat(64),
        vec![],
    );
    assert!(matches!(
        db.store.place_bet(&late).await,
        Err(crate::store::LedgerError::WrongStatus { .. })
    ));
    assert!(db
        .store
        .move_round(round.id, RoundStatus::Closing, RoundStatus::Drawing)
        .await
        .unwrap());
    let pot = db.store.pot_outputs(round.id).await.unwrap();
    assert_eq!(pot.len(), 1);
    let mut p1 = money::intent(
        TransferKind::Payout,
        user,
        Some(round.id),
        &"6".repeat(64),
        vec![pot[0].id],
    );
    p1.outputs.clear();
    let mut p2 = p1.clone();
    p2.txid = "7".repeat(64).parse().unwrap();
    let (s1, s2) = (db.store.clone(), db.store.clone());
    let (a, c) = (round.id, round.id);
    let (r1, r2) = tokio::join!(
        tokio::spawn(async move { s1.begin_payout(a, &money::draw(), &p1).await }),
        tokio::spawn(async move { s2.begin_payout(c, &money::draw(), &p2).await })
    );
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    assert!(r1.is_ok() != r2.is_ok(), "one payout: {r1:?} {r2:?}");
    // Even around the status guard, the schema refuses a second payout row.
    let dup = sqlx::query(
        "INSERT INTO transfers (kind, round_id, txid, amount_sats, status, created_at) \
         VALUES ('payout', $1, 'x', 1, 'signed', 0)",
    )
    .bind(round.id)
    .execute(db.store.pool())
    .await;
    assert!(dup.is_err());
    assert!(db
        .store
        .finish_round(round.id, RoundStatus::PayingOut, 5)
        .await
        .unwrap());
    assert!(
        !db.store
            .finish_round(round.id, RoundStatus::PayingOut, 5)
            .await
            .unwrap(),
        "closes once"
    );
    assert_eq!(
        db.store.current_round().await.unwrap().unwrap().status,
        RoundStatus::Open
    );
}

async fn reorg_unwinds_deposits_and_confirmations(b: Backend) {
    let db = TestDb::new(b).await;
    let (user, out) = funded(&db.store).await;
    let w = money::intent(
        TransferKind::Withdrawal,
        user,
        None,
        &"8".repeat(64),
        vec![out],
    );
    let id = db.store.record_withdrawal(&w).await.unwrap();
    db.store.mark_broadcast(id).await.unwrap();
    db.store
        .connect_block(11, block(b'h', 11), &["8".repeat(64).parse().unwrap()], &[])
        .await
        .unwrap();
    assert_eq!(
        db.store.balances(user, 1).await.unwrap(),
        (89_800, 89_800, false)
    );
    assert_eq!(
        db.store.transfer(id).await.unwrap().unwrap().block_height,
        Some(11)
    );
    // Both blocks leave the chain: the deposit stops counting, the
    // withdrawal is pending again (its change is unconfirmed).
    db.store.unwind_above(9).await.unwrap();
    assert_eq!(db.store.synced_tip().await.unwrap().unwrap().0, 9);
    assert_eq!(db.store.balances(user, 1).await.unwrap(), (0, 89_800, true));
    assert_eq!(
        db.store.transfer(id).await.unwrap().unwrap().block_height,
        None
    );
    assert_eq!(db.store.unconfirmed_broadcasts().await.unwrap().len(), 1);
    // Re-mined on the new branch: credited once, not twice.
    db.store
        .connect_block(
            10,
            block(b'n', 10),
            &["8".repeat(64).parse().unwrap()],
            &[deposit(user)],
        )
        .await
        .unwrap();
    let totals = db.store.ledger_totals().await.unwrap();
    assert_eq!(totals.deposits_sats, 100_000);
    assert_eq!(
        db.store.balances(user, 1).await.unwrap(),
        (89_800, 89_800, false)
    );
}

async fn refused_broadcast_releases_the_inputs(b: Backend) {
    let db = TestDb::new(b).await;
    let (user, out) = funded(&db.store).await;
    let w = money::intent(
        TransferKind::Withdrawal,
        user,
        None,
        &"9".repeat(64),
        vec![out],
    );
    let id = db.store.record_withdrawal(&w).await.unwrap();
    assert_eq!(db.store.signed_transfers().await.unwrap().len(), 1);
    db.store.fail_transfer(id).await.unwrap();
    assert_eq!(
        db.store.transfer(id).await.unwrap().unwrap().status,
        TransferStatus::Failed
    );
    assert_eq!(
        db.store.balances(user, 1).await.unwrap(),
        (100_000, 100_000, false)
    );
    let t = db.store.ledger_totals().await.unwrap();
    assert_eq!(t.users_unspent_sats, 100_000);
    assert_eq!(t.miner_fees_sats, 0);
}

/// Issue 16, point 8 as issue 32 (finding 3) left it: the close fixes the
/// tip it is given with the bets written before it, and a bet after it is
/// refused by the round's status. (The tip was read inside the close's
/// transaction before; a slow node then held SQLite's write lock.)
async fn the_close_fixes_the_bets_written_before_it_and_refuses_later_ones(b: Backend) {
    let db = TestDb::new(b).await;
    let (user, out) = funded(&db.store).await;
    let round = db
        .store
        .ensure_round(crate::domain::time::unix_now())
        .await
        .unwrap();
    let mut bet = money::intent(
        TransferKind::Bet,
        user,
        Some(round.id),
        &"6".repeat(64),
        vec![out],
    );
    bet.outputs.push(crate::domain::money::NewOutput {
        vout: 0,
        amount_sats: 10_000,
        user_id: None,
        round_id: Some(round.id),
        origin: OutputOrigin::Pot,
    });
    // The tip is a plain value read before the close's transaction: the
    // store holds no transaction across a chain call.
    assert!(db
        .store
        .close_round(round.id, 10, None, |b| b.len().to_string())
        .await
        .unwrap());
    let late = db.store.place_bet(&bet).await;
    assert!(late.is_err(), "a bet after the close: {late:?}");
    assert!(db.store.round_bets(round.id).await.unwrap().is_empty());
    assert_eq!(
        db.store
            .round_detail(round.id)
            .await
            .unwrap()
            .unwrap()
            .draw
            .tip_height_at_close,
        Some(10)
    );
}

/// An output spent by a stranger is audited once, however often the worker
/// finds it, also when the first entry was written by an older release whose
/// details serialise differently (other field order, other spacing): the
/// output's key decides, not the stored text.
async fn an_unknown_spend_is_audited_once_per_output_across_an_upgrade(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    s.migrate_to(5).await.unwrap();
    let old = "a".repeat(64);
    sqlx::query(
        "INSERT INTO audit_log (at, event, actor, diff, details) \
         VALUES (1, 'unknown_spend', 'engine', '{}', $1)",
    )
    .bind(format!(
        r#"{{ "amount_sats": 700, "vout": 1, "txid": "{old}" }}"#
    ))
    .execute(s.pool())
    .await
    .unwrap();
    s.migrate().await.unwrap();
    let new: Txid = "b".repeat(64).parse().unwrap();
    for _ in 0..3 {
        s.audit_unknown_spend(&old.parse().unwrap(), 1, 700)
            .await
            .unwrap();
        s.audit_unknown_spend(&new, 0, 900).await.unwrap();
    }
    // Two processes finding the same output at the same moment.
    let (x, y) = tokio::join!(
        s.audit_unknown_spend(&new, 2, 50),
        s.audit_unknown_spend(&new, 2, 50)
    );
    x.unwrap();
    y.unwrap();
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT details FROM audit_log WHERE event = 'unknown_spend' ORDER BY id",
    )
    .fetch_all(s.pool())
    .await
    .unwrap();
    let keys: Vec<(String, i64)> = rows
        .iter()
        .map(|d| {
            let v: serde_json::Value = serde_json::from_str(d).unwrap();
            (
                v["txid"].as_str().unwrap().to_owned(),
                v["vout"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        keys,
        vec![(old, 1), (new.to_string(), 0), (new.to_string(), 2)]
    );
}

/// The limits' shared state (issue 18): two handles on one database stand
/// for two processes.
mod limits {
    use super::*;
    use crate::security::quota::QuotaPolicy;
    use crate::security::throttle::{ThrottleKey, ThrottlePolicy, UnixMillis};
    use crate::service::limits::{Quota, Throttle};
    use std::time::Duration;

    both_backends!(
        failures_through_either_handle_count_once,
        concurrent_attempts_cannot_overshoot_the_allowance,
        concurrent_registrations_cannot_overshoot_the_quota,
        leases_of_a_dead_process_run_out,
        the_oldest_stream_of_an_ip_is_evicted_in_any_process,
        admin_token_failures_over_two_processes_lock_like_on_one,
    );

    fn throttle(store: &Store) -> Throttle {
        Throttle::shared(store.clone(), ThrottlePolicy::default())
    }

    async fn second_handle(db: &TestDb) -> Store {
        // A second pool on the same database: another process.
        match (&db.pg_name, &db.sqlite_path) {
            (Some(name), _) => {
                let base = pg_admin_url();
                let url = format!("{}/{name}", &base[..base.rfind('/').unwrap()]);
                Store::connect(&url, 4).await.unwrap()
            }
            (_, Some(path)) => Store::connect(&format!("sqlite://{}", path.display()), 4)
                .await
                .unwrap(),
            _ => unreachable!(),
        }
    }

    pub(super) async fn failures_through_either_handle_count_once(b: Backend) {
        let db = TestDb::new(b).await;
        db.store.migrate().await.unwrap();
        let other = second_handle(&db).await;
        let (a, b2) = (throttle(&db.store), throttle(&other));
        let k = [ThrottleKey::User("victim".into())];
        for i in 0..5 {
            let t = if i % 2 == 0 { &a } else { &b2 };
            t.begin(&k).await.unwrap().unwrap().failed().await;
        }
        // Five failures are free, wherever they were made.
        let sixth = b2.begin(&k).await.unwrap().unwrap();
        sixth.failed().await;
        let wait = a.begin(&k).await.unwrap().unwrap_err();
        assert!(
            wait > Duration::from_millis(500) && wait <= Duration::from_secs(1),
            "{wait:?}"
        );
        assert_eq!(
            db.store
                .throttle_record("u:victim")
                .await
                .unwrap()
                .unwrap()
                .failures,
            6
        );
        // A success forgets the user's failures for both.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let ok = a.begin(&k).await.unwrap().unwrap();
        ok.succeeded(&k[0]).await;
        assert!(db
            .store
            .throttle_record("u:victim")
            .await
            .unwrap()
            .is_none());
        assert!(b2.begin(&k).await.unwrap().is_ok());
        other.close().await;
    }

    /// Issue 32: wrong admin tokens alternated over two processes on one
    /// database lock the client out at the count one process would, only
    /// failures count, a correct token clears the count for both, and
    /// another client is not touched.
    pub(super) async fn admin_token_failures_over_two_processes_lock_like_on_one(b: Backend) {
        use crate::service::limits::AdminThrottle;
        let db = TestDb::new(b).await;
        db.store.migrate().await.unwrap();
        let other = second_handle(&db).await;
        let policy = ThrottlePolicy {
            ip_free_failures: 10,
            ..ThrottlePolicy::default()
        };
        let now = std::time::Instant::now();
        let a = AdminThrottle::shared(db.store.clone(), policy, now);
        let b2 = AdminThrottle::shared(other.clone(), policy, now);
        let ip = |n: u8| ThrottleKey::AdminIp(std::net::IpAddr::from([10, 0, 0, n]));
        let k = ip(1);
        for i in 0..10 {
            let t = if i % 2 == 0 { &a } else { &b2 };
            assert!(t.shared_admission(&k).await.unwrap().wait.is_zero(), "{i}");
            t.shared_failure(&k).await;
        }
        let open = b2.shared_admission(&k).await.unwrap();
        assert!(
            open.wait.is_zero() && open.recorded,
            "ten are free: {open:?}"
        );
        a.shared_failure(&k).await;
        for t in [&a, &b2] {
            let locked = t.shared_admission(&k).await.unwrap();
            assert!(
                locked.wait > Duration::from_millis(500),
                "eleven failures over two processes lock: {locked:?}"
            );
        }
        assert!(a.shared_admission(&ip(2)).await.unwrap().wait.is_zero());
        let record = db.store.throttle_record(&k.storage_key()).await.unwrap();
        assert_eq!(record.map(|r| r.failures), Some(11));
        // A correct token clears the count for every process.
        b2.shared_success(&k).await;
        let cleared = a.shared_admission(&k).await.unwrap();
        assert!(cleared.wait.is_zero() && !cleared.recorded, "{cleared:?}");
        other.close().await;
    }

    pub(super) async fn concurrent_attempts_cannot_overshoot_the_allowance(b: Backend) {
        let db = TestDb::new(b).await;
        db.store.migrate().await.unwrap();
        let other = second_handle(&db).await;
        let handles = [throttle(&db.store), throttle(&other)];
        let k = vec![ThrottleKey::User("racer".into())];
        // Twenty attempts at once over both handles: five may be in flight
        // (the free failures), the rest must wait.
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let t = handles[i % 2].clone();
                let k = k.clone();
                tokio::spawn(async move { t.begin(&k).await.unwrap() })
            })
            .collect();
        let mut admitted = Vec::new();
        for t in tasks {
            if let Ok(a) = t.await.unwrap() {
                admitted.push(a);
            }
        }
        assert_eq!(admitted.len(), 5, "in-flight allowance across processes");
        for a in admitted {
            a.failed().await;
        }
        // Five failures: one attempt at a time now.
        let one = handles[0].begin(&k).await.unwrap().unwrap();
        assert_eq!(
            handles[1].begin(&k).await.unwrap().unwrap_err(),
            Duration::from_secs(1)
        );
        one.failed().await;
        other.close().await;
    }

    pub(super) async fn concurrent_registrations_cannot_overshoot_the_quota(b: Backend) {
        let db = TestDb::new(b).await;
        db.store.migrate().await.unwrap();
        let other = second_handle(&db).await;
        let quota = |s: &Store| Quota::Shared {
            store: s.clone(),
            policy: QuotaPolicy::default(),
        };
        let handles = [quota(&db.store), quota(&other)];
        let ip: std::net::IpAddr = "10.1.2.3".parse().unwrap();
        let tasks: Vec<_> = (0..12)
            .map(|i| {
                let q = handles[i % 2].clone();
                tokio::spawn(async move { q.reserve(ip).await.unwrap() })
            })
            .collect();
        let mut held = Vec::new();
        for t in tasks {
            if let Ok(s) = t.await.unwrap() {
                held.push(s);
            }
        }
        assert_eq!(held.len(), 5, "five slots over both processes");
        // A slot given back (a taken name) is free again.
        drop(held.pop());
        tokio::time::sleep(Duration::from_millis(200)).await;
        held.push(handles[1].reserve(ip).await.unwrap().unwrap());
        for s in held {
            s.commit().await;
        }
        let wait = handles[0].reserve(ip).await.unwrap().unwrap_err();
        assert!(
            wait > Duration::from_secs(3590) && wait <= Duration::from_secs(3600),
            "{wait:?}"
        );
        let now = UnixMillis::now();
        assert_eq!(
            db.store
                .quota_used("10.1.2.3", now, Duration::from_secs(3600))
                .await
                .unwrap(),
            5
        );
        // Waiting never lengthens the wait; the window frees the oldest.
        let later = UnixMillis(now.0 + 3_600_001);
        assert!(db
            .store
            .quota_reserve("10.1.2.3", later, Duration::from_secs(3600), 5, later)
            .await
            .unwrap()
            .is_ok());
        other.close().await;
    }

    pub(super) async fn leases_of_a_dead_process_run_out(b: Backend) {
        let db = TestDb::new(b).await;
        db.store.migrate().await.unwrap();
        let s = &db.store;
        let t0 = UnixMillis(1_000_000);
        let lease = UnixMillis(t0.0 + 60_000);
        // A process reserved five registrations and died.
        for _ in 0..5 {
            s.quota_reserve("10.0.0.1", t0, Duration::from_secs(3600), 5, lease)
                .await
                .unwrap()
                .unwrap();
        }
        assert_eq!(
            s.quota_reserve("10.0.0.1", t0, Duration::from_secs(3600), 5, lease)
                .await
                .unwrap()
                .unwrap_err(),
            Duration::from_secs(1)
        );
        let after = UnixMillis(lease.0 + 1);
        assert!(s
            .quota_reserve("10.0.0.1", after, Duration::from_secs(3600), 5, after)
            .await
            .unwrap()
            .is_ok());
        // ... and five login attempts in flight.
        let keys = vec!["u:ghost".to_string()];
        for id in 0..5 {
            let wait = s
                .throttle_begin(&keys, id, t0, lease, |_| Duration::ZERO)
                .await
                .unwrap();
            assert!(wait.is_zero());
        }
        let seen = std::sync::Mutex::new(Vec::new());
        s.throttle_begin(&keys, 99, t0, lease, |st| {
            seen.lock().unwrap().push(st[0].1);
            Duration::from_secs(1)
        })
        .await
        .unwrap();
        s.throttle_begin(&keys, 99, after, after, |st| {
            seen.lock().unwrap().push(st[0].1);
            Duration::from_secs(1)
        })
        .await
        .unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![5, 0], "leases ran out");
    }

    pub(super) async fn the_oldest_stream_of_an_ip_is_evicted_in_any_process(b: Backend) {
        let db = TestDb::new(b).await;
        db.store.migrate().await.unwrap();
        let s = &db.store;
        let now = UnixMillis::now();
        let stale = UnixMillis(now.0 - 30_000);
        s.process_heartbeat("pa", now, stale).await.unwrap();
        s.process_heartbeat("pb", now, stale).await.unwrap();
        for i in 0..5 {
            let p = if i % 2 == 0 { "pa" } else { "pb" };
            assert!(s.stream_open(p, i, "10.0.0.9", 5).await.unwrap().is_empty());
        }
        // The sixth, opened on B, evicts A's stream 0 (the oldest).
        assert_eq!(
            s.stream_open("pb", 5, "10.0.0.9", 5).await.unwrap(),
            vec![("pa".to_string(), 0)]
        );
        s.stream_close("pb", 1).await.unwrap();
        assert!(s
            .stream_open("pa", 6, "10.0.0.9", 5)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(s.streams_of("10.0.0.9").await.unwrap().len(), 5);
        // Other IPs are unaffected.
        assert!(s
            .stream_open("pa", 7, "10.0.0.10", 5)
            .await
            .unwrap()
            .is_empty());
        // B stops beating (killed): after the time-out its streams are gone.
        let later = UnixMillis(now.0 + 31_000);
        s.process_heartbeat("pa", later, UnixMillis(later.0 - 30_000))
            .await
            .unwrap();
        let left = s.streams_of("10.0.0.9").await.unwrap();
        assert!(left.iter().all(|(p, _)| p == "pa"), "{left:?}");
        assert_eq!(left.len(), 3);
        s.process_gone("pa").await.unwrap();
        assert!(s.streams_of("10.0.0.9").await.unwrap().is_empty());
    }
}

/// `(pot_sats, bettors)` of the round as stored, and as recounted from its placed bets.
async fn pot_and_bettors(store: &Store, round_id: i64) -> ((i64, i64), (i64, i64)) {
    let stored = sqlx::query("SELECT pot_sats, bettors FROM rounds WHERE id = $1")
        .bind(round_id)
        .fetch_one(store.pool())
        .await
        .unwrap();
    let counted = sqlx::query(
        "SELECT CAST(COALESCE(SUM(amount_sats), 0) AS BIGINT) AS pot, COUNT(DISTINCT user_id) AS bettors \
         FROM bets WHERE round_id = $1 AND status = 'placed'",
    )
    .bind(round_id)
    .fetch_one(store.pool())
    .await
    .unwrap();
    (
        (stored.get("pot_sats"), stored.get("bettors")),
        (counted.get("pot"), counted.get("bettors")),
    )
}

/// A bet grows the pot and counts a new bettor by itself, without a
/// recount: concurrent bets of one user count one bettor, a failed bet
/// (recounted) and a later bet keep both figures equal to a recount.
async fn bets_keep_pot_and_bettors_equal_to_a_recount(b: Backend) {
    let db = TestDb::new(b).await;
    let (alice, _) = funded(&db.store).await;
    let bob = db.store.create_user("bob", "h", addr).await.unwrap().id;
    let round = db
        .store
        .ensure_round(crate::domain::time::unix_now())
        .await
        .unwrap();
    let bet = |user: i64, n: usize| {
        let mut bet = money::intent(
            TransferKind::Bet,
            user,
            Some(round.id),
            &format!("{n:064x}"),
            vec![],
        );
        bet.outputs.clear();
        bet
    };
    let tasks: Vec<_> = [alice, alice, alice, alice, bob]
        .into_iter()
        .enumerate()
        .map(|(n, user)| {
            let store = db.store.clone();
            let bet = bet(user, n + 1);
            tokio::spawn(async move { store.place_bet(&bet).await })
        })
        .collect();
    let mut transfers = Vec::new();
    for t in tasks {
        transfers.push(t.await.unwrap().unwrap().1);
    }
    let (stored, counted) = pot_and_bettors(&db.store, round.id).await;
    assert_eq!(stored, (50_000, 2));
    assert_eq!(stored, counted);
    // One of Alice's bets fails: she is still a bettor.
    db.store.fail_transfer(transfers[0]).await.unwrap();
    let (stored, counted) = pot_and_bettors(&db.store, round.id).await;
    assert_eq!(stored, (40_000, 2));
    assert_eq!(stored, counted);
    // Bob's only bet fails: one bettor left.
    db.store.fail_transfer(transfers[4]).await.unwrap();
    let (stored, counted) = pot_and_bettors(&db.store, round.id).await;
    assert_eq!(stored, (30_000, 1));
    assert_eq!(stored, counted);
    // Bob bets again and counts again; another bet of Alice does not.
    db.store.place_bet(&bet(bob, 6)).await.unwrap();
    db.store.place_bet(&bet(alice, 7)).await.unwrap();
    let (stored, counted) = pot_and_bettors(&db.store, round.id).await;
    assert_eq!(stored, (50_000, 2));
    assert_eq!(stored, counted);
}

/// The round's stored bet count, and a recount of its placed bets.
async fn bet_counts(store: &Store, round_id: i64) -> (i64, i64) {
    let stored: i64 = sqlx::query_scalar("SELECT bet_count FROM rounds WHERE id = $1")
        .bind(round_id)
        .fetch_one(store.pool())
        .await
        .unwrap();
    let counted: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM bets WHERE round_id = $1 AND status = 'placed'")
            .bind(round_id)
            .fetch_one(store.pool())
            .await
            .unwrap();
    (stored, counted)
}

/// A round takes at most its cap of bets (so that one payout can spend
/// them all), whether they come in a group or alone; a failed bet frees its
/// place, and a closed round still says so rather than "full".
async fn a_round_refuses_bets_past_its_cap_alone_or_grouped(b: Backend) {
    let db = TestDb::new(b).await;
    let store = db.store.clone().with_max_round_bets(3);
    let (alice, _) = funded(&store).await;
    let round = store
        .ensure_round(crate::domain::time::unix_now())
        .await
        .unwrap();
    let bet = |n: usize| {
        let mut bet = money::intent(
            TransferKind::Bet,
            alice,
            Some(round.id),
            &format!("{n:064x}"),
            vec![],
        );
        bet.outputs.clear();
        bet
    };
    let full = |answer: &Result<(i64, i64), LedgerError>| matches!(answer, Err(LedgerError::RoundFull { round_id, max_bets: 3 }) if *round_id == round.id);
    // Five at once: the group would fill the round past its cap, so its
    // bets are written one by one, and the first three fit.
    let bets: Vec<_> = (1..=5).map(bet).collect();
    let answers = place_together(&store, &bets).await;
    let placed: Vec<(i64, i64)> = answers
        .iter()
        .filter_map(|a| a.as_ref().ok().copied())
        .collect();
    assert_eq!(placed.len(), 3, "{answers:?}");
    assert!(answers[..3].iter().all(Result::is_ok), "{answers:?}");
    assert!(answers[3..].iter().all(full), "{answers:?}");
    assert!(full(&store.place_bet(&bet(6)).await));
    assert_eq!(bet_counts(&store, round.id).await, (3, 3));
    // A failed bet leaves the round: one more fits, then none.
    store.fail_transfer(placed[0].1).await.unwrap();
    assert_eq!(bet_counts(&store, round.id).await, (2, 2));
    let answers = place_together(&store, &[bet(7), bet(8)]).await;
    assert!(answers[0].is_ok() && full(&answers[1]), "{answers:?}");
    assert_eq!(bet_counts(&store, round.id).await, (3, 3));
    // Past its close time the round is not open, full or not.
    sqlx::query("UPDATE rounds SET closes_at = 0 WHERE id = $1")
        .bind(round.id)
        .execute(store.pool())
        .await
        .unwrap();
    assert!(
        matches!(
            store.place_bet(&bet(9)).await,
            Err(LedgerError::WrongStatus { .. })
        ),
        "a closed round"
    );
}

/// Places `bets` at once: on the tests' single-threaded runtime every one is
/// queued before the group writer first runs, so they form one group.
async fn place_together(
    store: &Store,
    bets: &[crate::domain::money::Intent],
) -> Vec<Result<(i64, i64), LedgerError>> {
    futures_util::future::join_all(bets.iter().map(|b| store.place_bet(b))).await
}

/// A bet of 10,000 sats of `user` in `round` spending `inputs`, its pot
/// output and its change (89,800) as new outputs.
fn bet_spending(user: i64, round: i64, n: u32, inputs: Vec<i64>) -> crate::domain::money::Intent {
    let mut bet = money::intent(
        TransferKind::Bet,
        user,
        Some(round),
        &format!("{n:064x}"),
        inputs,
    );
    bet.outputs.push(crate::domain::money::NewOutput {
        vout: 0,
        amount_sats: 10_000,
        user_id: None,
        round_id: Some(round),
        origin: OutputOrigin::Pot,
    });
    bet
}

/// Bets written in one group: an all-good group is written whole; in a
/// group with bets that must fail (an input another bet of the group takes,
/// an input spent before, a bet of a closed round) each bet gets the outcome
/// it would have had alone and the others are written; broadcast marks
/// riding with bets are written. Balances, pot, bettors and outputs agree.
async fn bets_written_together_each_get_their_own_outcome(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    s.migrate().await.unwrap();
    s.init_config(&config()).await.unwrap();
    let mut users = Vec::new();
    let mut deposits = Vec::new();
    for k in 0..5u32 {
        let u = s.create_user(&format!("u{k}"), "h", addr).await.unwrap().id;
        users.push(u);
        for vout in 0..2 {
            deposits.push(crate::store::chain::Deposit {
                txid: format!("{k:064x}").replace('0', "d").parse().unwrap(),
                vout,
                amount_sats: 100_000,
                user_id: u,
                coinbase: false,
            });
        }
    }
    s.record_start_block(9, block(b'h', 9)).await.unwrap();
    s.connect_block(10, block(b'h', 10), &[], &deposits)
        .await
        .unwrap();
    let round = s
        .ensure_round(crate::domain::time::unix_now())
        .await
        .unwrap()
        .id;

    let written = a_group_of_good_bets_is_written_whole(s, &users, round).await;
    a_group_failing_in_part_writes_the_others(s, &users, round, &written).await;
    a_closed_round_refuses_a_whole_group(s, &users, round).await;
}

/// The coins `u` can spend, by id.
async fn coins(s: &Store, u: i64) -> Vec<i64> {
    let mut ids: Vec<i64> = s
        .spendable_outputs(u, 1)
        .await
        .unwrap()
        .iter()
        .map(|c| c.id)
        .collect();
    ids.sort_unstable();
    ids
}

/// One bet per user in one group: every bet written; returns (bet id, transfer id) each.
async fn a_group_of_good_bets_is_written_whole(
    s: &Store,
    users: &[i64],
    round: i64,
) -> Vec<(i64, i64)> {
    // All good: one group, every bet written.
    let mut first = Vec::new();
    for (k, &u) in users.iter().enumerate() {
        first.push(bet_spending(
            u,
            round,
            k as u32 + 1,
            vec![coins(s, u).await[0]],
        ));
    }
    let answers = place_together(s, &first).await;
    let written: Vec<(i64, i64)> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(s.whole_groups(), 1, "written as one group");
    let bet_ids: std::collections::HashSet<i64> = written.iter().map(|w| w.0).collect();
    assert_eq!(bet_ids.len(), users.len(), "distinct bet ids");
    for (w, bet) in written.iter().zip(&first) {
        let t = s.transfer(w.1).await.unwrap().unwrap();
        assert_eq!(
            (t.txid.as_str(), t.status),
            (bet.txid.to_string().as_str(), TransferStatus::Signed)
        );
    }
    assert_eq!(pot_and_bettors(s, round).await, ((50_000, 5), (50_000, 5)));
    for &u in users {
        assert_eq!(s.balances(u, 1).await.unwrap(), (100_000, 189_800, true));
    }

    written
}

/// Broadcast marks of the first bets ride with a group in which some bets must fail.
async fn a_group_failing_in_part_writes_the_others(
    s: &Store,
    users: &[i64],
    round: i64,
    written: &[(i64, i64)],
) {
    // Marks of the first bets ride with a group that fails in part.
    let spent_before = coins(s, users[0]).await[0];
    s.place_bet(&bet_spending(users[0], round, 10, vec![spent_before]))
        .await
        .unwrap();
    let shared = coins(s, users[1]).await[0];
    let second = vec![
        bet_spending(users[1], round, 11, vec![shared]),
        bet_spending(users[1], round, 12, vec![shared]),
        bet_spending(users[0], round, 13, vec![spent_before]),
        bet_spending(users[2], round, 14, vec![coins(s, users[2]).await[0]]),
        bet_spending(users[3], round, 15, vec![coins(s, users[3]).await[0]]),
    ];
    let marks = written.iter().map(|w| s.mark_broadcast(w.1));
    let (answers, marked) = tokio::join!(
        place_together(s, &second),
        futures_util::future::join_all(marks)
    );
    assert!(marked.iter().all(Result::is_ok), "{marked:?}");
    assert!(
        answers[0].is_ok() != answers[1].is_ok(),
        "one of two bets on one coin: {answers:?}"
    );
    assert!(
        matches!(answers[0], Err(LedgerError::OutputTaken(_)))
            || matches!(answers[1], Err(LedgerError::OutputTaken(_)))
    );
    assert!(
        matches!(answers[2], Err(LedgerError::OutputTaken(_))),
        "{:?}",
        answers[2]
    );
    assert!(answers[3].is_ok() && answers[4].is_ok(), "{answers:?}");
    for w in written {
        assert_eq!(
            s.transfer(w.1).await.unwrap().unwrap().status,
            TransferStatus::Broadcast
        );
    }
    for (bet, answer) in second.iter().zip(&answers) {
        let row = s.transfer_by_txid(&bet.txid).await.unwrap();
        assert_eq!(row.is_some(), answer.is_ok(), "{}: {answer:?}", bet.txid);
        let outs = s.outputs_spent_by(&bet.txid).await.unwrap();
        assert_eq!(outs.len(), usize::from(answer.is_ok()), "{}", bet.txid);
    }
    // Users 0–3 have spent both coins, user 4 one of two.
    assert_eq!(
        s.whole_groups(),
        1,
        "the second group was written bet by bet"
    );
    assert_eq!(pot_and_bettors(s, round).await, ((90_000, 5), (90_000, 5)));
    for (k, &u) in users.iter().enumerate() {
        let left = if k == 4 { 100_000 } else { 0 };
        let bets = if k == 4 { 1 } else { 2 };
        let (balance, pending, _) = s.balances(u, 1).await.unwrap();
        assert_eq!((balance, pending), (left, left + bets * 89_800), "user {k}");
    }
}

/// Once the round is closed a whole group is refused and nothing changes.
async fn a_closed_round_refuses_a_whole_group(s: &Store, users: &[i64], round: i64) {
    // The round closes: a whole group is refused and nothing changes.
    sqlx::query("UPDATE rounds SET closes_at = 0 WHERE id = $1")
        .bind(round)
        .execute(s.pool())
        .await
        .unwrap();
    let last = coins(s, users[4]).await[0];
    let third = vec![
        bet_spending(users[4], round, 20, vec![last]),
        bet_spending(users[4], round, 21, vec![last]),
    ];
    for answer in place_together(s, &third).await {
        assert!(
            matches!(answer, Err(LedgerError::WrongStatus { .. })),
            "{answer:?}"
        );
    }
    assert_eq!(coins(s, users[4]).await, vec![last]);
    assert_eq!(pot_and_bettors(s, round).await, ((90_000, 5), (90_000, 5)));
}

/// The payment context reads the payer's coins in its own statement (one
/// round trip for session check, context and coins): they must be exactly
/// what `spendable_outputs_at` returns at the tip read with them — deposits
/// only with enough confirmations, a coinbase only when mature, spent and
/// unconfirmed outputs never, another user's never — and the user's stored
/// token version must come with them.
async fn the_payment_context_reads_the_coins_spendable_at_its_tip(b: Backend) {
    use crate::store::chain::Deposit;
    let db = TestDb::new(b).await;
    let s = &db.store;
    s.migrate().await.unwrap();
    s.init_config(&ServiceConfig {
        deposit_confirmations: 3,
        ..config()
    })
    .await
    .unwrap();
    let a = s.create_user("payer", "h", addr).await.unwrap();
    let other = s.create_user("other", "h", addr).await.unwrap();
    let dep = |user_id: i64, txid: char, vout: i64, amount_sats: i64, coinbase: bool| Deposit {
        txid: txid.to_string().repeat(64).parse().unwrap(),
        vout,
        amount_sats,
        user_id,
        coinbase,
    };
    // Before any block: no tip, no coins.
    let ctx = s.payment_context(a.id).await.unwrap();
    assert_eq!((ctx.tip_height, ctx.coins.len()), (None, 0));
    assert_eq!(ctx.user.map(|u| u.token_version), Some(0));
    s.record_start_block(9, block(b'h', 9)).await.unwrap();
    s.connect_block(
        10,
        block(b'h', 10),
        &[],
        &[
            dep(a.id, 'd', 0, 100_000, false),
            dep(a.id, 'c', 0, 300_000, true),
            dep(other.id, 'd', 1, 500_000, false),
        ],
    )
    .await
    .unwrap();
    s.connect_block(
        11,
        block(b'h', 11),
        &[],
        &[dep(a.id, 'e', 0, 50_000, false)],
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    for height in 12..=112 {
        s.connect_block(height, block(b'h', height), &[], &[])
            .await
            .unwrap();
        let ctx = s.payment_context(a.id).await.unwrap();
        assert_eq!(ctx.tip_height, Some(height));
        let alone = s.spendable_outputs_at(a.id, 3, height).await.unwrap();
        assert_eq!(ctx.coins, alone, "at height {height}");
        assert!(ctx.coins.iter().all(|c| c.user_id == Some(a.id)));
        seen.push(ctx.coins.len());
    }
    // 12: the first deposit (3 confirmations); 13: the second; 109: the coinbase.
    assert_eq!((seen[0], seen[1], seen[96], seen[97]), (1, 2, 2, 3));
    // Spent coins leave, their unconfirmed change does not come.
    let ctx = s.payment_context(a.id).await.unwrap();
    let largest = ctx.coins[0].id;
    let w = money::intent(
        TransferKind::Withdrawal,
        a.id,
        None,
        &"5".repeat(64),
        vec![largest],
    );
    s.record_withdrawal(&w).await.unwrap();
    let ctx = s.payment_context(a.id).await.unwrap();
    assert_eq!(ctx.coins.len(), 2);
    assert!(ctx.coins.iter().all(|c| c.id != largest));
    assert_eq!(
        ctx.coins,
        s.spendable_outputs_at(a.id, 3, 112).await.unwrap()
    );
    // The token version read with them is the stored one.
    s.change_password(a.id, 0, "h2").await.unwrap();
    let ctx = s.payment_context(a.id).await.unwrap();
    assert_eq!(ctx.user.map(|u| u.token_version), Some(1));
    // No such user: no payer, no coins (not another user's).
    let ctx = s.payment_context(other.id + 100).await.unwrap();
    assert_eq!((ctx.user, ctx.coins.len()), (None, 0));
}

/// A payout signed before the winner's share became a payment could leave
/// the winner without an output (the share dropped to the miner); when such
/// a payout failed, the admin retry updated the winner output's row, found
/// none, and recorded nothing: the new payout's winner output was later
/// credited as a deposit, counting the pot's money twice in the books. The
/// retry now records the winner's output whether the failed payout had one.
async fn a_retried_payout_records_the_winner_output_the_failed_one_lacked(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    let (user, out) = funded(s).await;
    let round = s
        .ensure_round(crate::domain::time::unix_now())
        .await
        .unwrap();
    let (_, bet) = s
        .place_bet(&bet_spending(user, round.id, 4, vec![out]))
        .await
        .unwrap();
    s.mark_broadcast(bet).await.unwrap();
    assert!(s
        .close_round(round.id, 10, None, |b| b.len().to_string())
        .await
        .unwrap());
    assert!(s
        .move_round(round.id, RoundStatus::Closing, RoundStatus::Drawing)
        .await
        .unwrap());
    let pot = s.pot_outputs(round.id).await.unwrap();
    let mut failed = money::intent(
        TransferKind::Payout,
        user,
        Some(round.id),
        &"6".repeat(64),
        vec![pot[0].id],
    );
    // The old payout: the commission only, no output of the winner's.
    failed.outputs.clear();
    failed.amount_sats = 0;
    let payout = s
        .begin_payout(round.id, &money::draw(), &failed)
        .await
        .unwrap();
    assert!(s.payout_failed(payout, round.id, "refused").await.unwrap());
    let new_txid: Txid = "7".repeat(64).parse().unwrap();
    assert!(s
        .replace_failed_payout(&super::rounds::PayoutReplacement {
            transfer_id: payout,
            round_id: round.id,
            old_txid: failed.txid,
            txid: new_txid,
            raw_tx: "00",
            fee_sats: 2_000,
            winner_sats: 5_000,
            winner_vout: Some(1),
            commission_sats: 3_000,
            dropped: &[],
        })
        .await
        .unwrap());
    let rows = sqlx::query(
        "SELECT vout, amount_sats, user_id, origin FROM outputs WHERE txid = $1 AND spent_txid IS NULL",
    )
    .bind(new_txid.to_string())
    .fetch_all(s.pool())
    .await
    .unwrap();
    assert_eq!(rows.len(), 1, "the winner's output is recorded");
    let r = &rows[0];
    assert_eq!(r.try_get::<i64, _>("vout").unwrap(), 1);
    assert_eq!(r.try_get::<i64, _>("amount_sats").unwrap(), 5_000);
    assert_eq!(r.try_get::<Option<i64>, _>("user_id").unwrap(), Some(user));
    assert_eq!(r.try_get::<String, _>("origin").unwrap(), "payout");
    // Once the payout confirms, its winner output is not also a deposit.
    s.connect_block(
        11,
        block(b'h', 11),
        &[new_txid],
        &[crate::store::chain::Deposit {
            txid: new_txid,
            vout: 1,
            amount_sats: 5_000,
            user_id: user,
            coinbase: false,
        }],
    )
    .await
    .unwrap();
    let deposits: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM transfers WHERE kind = 'deposit'")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(deposits, 1, "only the funding deposit");
}

/// Issue 32, finding 1: a key binds the payment written with it, in the
/// payment's own transaction; the same key then answers with that payment,
/// another body is refused, and a request whose claim was taken over (its
/// lease ran out) cannot write at all, so one key never pays twice.
async fn an_idempotency_key_binds_one_payment_and_a_claim_taken_over_binds_none(b: Backend) {
    use super::idempotency::{
        Claimed, IDEMPOTENCY_CLAIM_LEASE_SECS, IDEMPOTENCY_KEY_RETENTION_SECS,
    };
    let db = TestDb::new(b).await;
    let (user, out) = funded(&db.store).await;
    let s = &db.store;
    let now = 1_000_000;
    let Claimed::New(first) = s.claim_idempotency_key(user, "k", "f1", now).await.unwrap() else {
        panic!("a fresh key is claimed");
    };
    assert_eq!(
        s.claim_idempotency_key(user, "k", "f1", now + 1)
            .await
            .unwrap(),
        Claimed::InProgress
    );
    assert_eq!(
        s.claim_idempotency_key(user, "k", "f2", now + 1)
            .await
            .unwrap(),
        Claimed::Reused
    );
    // The lease runs out: a retry takes the key over; the first request's
    // write is then rolled back whole (its input stays unspent).
    let later = now + IDEMPOTENCY_CLAIM_LEASE_SECS + 1;
    let Claimed::New(second) = s
        .claim_idempotency_key(user, "k", "f1", later)
        .await
        .unwrap()
    else {
        panic!("a claim past its lease is taken over");
    };
    let w1 = money::intent(
        TransferKind::Withdrawal,
        user,
        None,
        &"1".repeat(64),
        vec![out],
    );
    assert!(matches!(
        s.record_withdrawal_keyed(&w1, Some(&first)).await,
        Err(LedgerError::IdempotencyClaimLost)
    ));
    assert!(s
        .transfer_by_txid(&"1".repeat(64).parse().unwrap())
        .await
        .unwrap()
        .is_none());
    let w2 = money::intent(
        TransferKind::Withdrawal,
        user,
        None,
        &"2".repeat(64),
        vec![out],
    );
    let id = s.record_withdrawal_keyed(&w2, Some(&second)).await.unwrap();
    assert_eq!(
        s.claim_idempotency_key(user, "k", "f1", later + 1)
            .await
            .unwrap(),
        Claimed::Bound(id)
    );
    // A bound key is not released by a later failure of its request.
    s.release_idempotency_key(&second).await.unwrap();
    assert_eq!(
        s.claim_idempotency_key(user, "k", "f1", later + 2)
            .await
            .unwrap(),
        Claimed::Bound(id)
    );
    // An unbound claim given back is claimed afresh at once.
    let Claimed::New(other) = s
        .claim_idempotency_key(user, "k2", "f1", later)
        .await
        .unwrap()
    else {
        panic!("fresh");
    };
    s.release_idempotency_key(&other).await.unwrap();
    assert!(matches!(
        s.claim_idempotency_key(user, "k2", "f1", later)
            .await
            .unwrap(),
        Claimed::New(_)
    ));
    // Keys are kept 24 h per user, then forgotten.
    let next_day = later + IDEMPOTENCY_KEY_RETENTION_SECS + 10;
    assert!(matches!(
        s.claim_idempotency_key(user, "k", "f2", next_day)
            .await
            .unwrap(),
        Claimed::New(_)
    ));
}

/// Issue 32, finding 4: one user places at most its share of a round's
/// bets, on the group's path (the whole group refused, its bets then
/// written alone) as alone; another user still bets.
async fn a_user_takes_no_more_than_its_share_of_a_round_alone_or_grouped(b: Backend) {
    let db = TestDb::new(b).await;
    let store = db.store.clone().with_max_user_round_bets(3);
    let (alice, _) = funded(&store).await;
    let bob = store.create_user("bob", "h", addr).await.unwrap().id;
    let round = store
        .ensure_round(crate::domain::time::unix_now())
        .await
        .unwrap();
    let bet = |user: i64, n: usize| {
        let mut bet = money::intent(
            TransferKind::Bet,
            user,
            Some(round.id),
            &format!("{n:064x}"),
            vec![],
        );
        bet.outputs.clear();
        bet
    };
    let share_full = |answer: &Result<(i64, i64), LedgerError>| matches!(answer, Err(LedgerError::UserShareFull { round_id, max_bets: 3, .. }) if *round_id == round.id);
    let answers = place_together(
        &store,
        &[
            bet(alice, 1),
            bet(alice, 2),
            bet(bob, 3),
            bet(alice, 4),
            bet(alice, 5),
        ],
    )
    .await;
    assert!(answers[..4].iter().all(Result::is_ok), "{answers:?}");
    assert!(share_full(&answers[4]), "{answers:?}");
    assert!(share_full(&store.place_bet(&bet(alice, 6)).await));
    assert!(store.place_bet(&bet(bob, 7)).await.is_ok());
    assert_eq!(bet_counts(&store, round.id).await, (5, 5));
}

/// Issue 32 ("Also"): pause was no barrier, only the payment's read checked
/// the flag, so a payment that read "not paused" just before the pause was
/// saved after it had answered. The write itself now refuses while paused,
/// on every path (a bet in a group, a keyed bet alone, a withdrawal).
async fn no_payment_is_saved_once_the_pause_has_answered(b: Backend) {
    let db = TestDb::new(b).await;
    let store = db.store.clone();
    let (alice, out) = funded(&store).await;
    let round = store
        .ensure_round(crate::domain::time::unix_now())
        .await
        .unwrap();
    store.set_paused(true, AuditActor::Admin).await.unwrap();
    let mut bet = money::intent(
        TransferKind::Bet,
        alice,
        Some(round.id),
        &"a".repeat(64),
        vec![out],
    );
    bet.outputs.clear();
    let grouped = store.place_bet(&bet).await;
    assert!(grouped.is_err(), "a bet saved while paused: {grouped:?}");
    let alone = store.place_bet_keyed(&bet, None).await;
    assert!(alone.is_err(), "a bet saved while paused: {alone:?}");
    let w = money::intent(
        TransferKind::Withdrawal,
        alice,
        None,
        &"b".repeat(64),
        vec![out],
    );
    let withdrawal = store.record_withdrawal(&w).await;
    assert!(
        withdrawal.is_err(),
        "a withdrawal saved while paused: {withdrawal:?}"
    );
    assert_eq!(bet_counts(&store, round.id).await, (0, 0));
    store.set_paused(false, AuditActor::Admin).await.unwrap();
    assert!(store.place_bet(&bet).await.is_ok(), "resumed");
}

/// Counts the statements sqlx runs (its `sqlx::query` events), in every
/// thread: SQLite's statements run on its worker thread. nextest runs each
/// test in a process of its own, so the count is this test's. A new pooled
/// connection's set-up (`after_connect`: `SET`, `PRAGMA`, SQLite's TEMP
/// group objects) is not counted: the pool opens one whenever none is idle,
/// which depends on what else held a connection a moment before, not on the
/// page read (on PostgreSQL a page of 20 once counted 3 where 3 counted 2).
mod statements {
    use std::fmt;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Once;
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata};

    static COUNT: AtomicU64 = AtomicU64::new(0);
    const TARGET: &str = "sqlx::query";

    struct Counter;

    impl tracing::Subscriber for Counter {
        fn enabled(&self, m: &Metadata<'_>) -> bool {
            m.target() == TARGET
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, e: &Event<'_>) {
            if e.metadata().target() != TARGET {
                return;
            }
            let mut setup = ConnectionSetup(false);
            e.record(&mut setup);
            if !setup.0 {
                COUNT.fetch_add(1, Ordering::SeqCst);
            }
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    /// Whether an event's statement is one of a new connection's set-up.
    struct ConnectionSetup(bool);

    impl ConnectionSetup {
        fn look_at(&mut self, statement: &str) {
            // A `Debug` value arrives quoted, its line breaks escaped.
            let statement = statement.replace("\\n", " ").to_ascii_uppercase();
            let statement = statement.trim_matches(|c: char| c == '"' || c.is_whitespace());
            self.0 |= ["SET ", "PRAGMA ", "CREATE TEMP "]
                .iter()
                .any(|setup| statement.starts_with(setup));
        }
    }

    impl Visit for ConnectionSetup {
        fn record_str(&mut self, f: &Field, value: &str) {
            if matches!(f.name(), "summary" | "db.statement") {
                self.look_at(value);
            }
        }
        fn record_debug(&mut self, f: &Field, value: &dyn fmt::Debug) {
            if matches!(f.name(), "summary" | "db.statement") {
                self.look_at(&format!("{value:?}"));
            }
        }
    }

    /// Statements run so far in this process.
    pub fn run_so_far() -> u64 {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| {
            tracing::subscriber::set_global_default(Counter)
                .expect("no other subscriber in a store test's process");
        });
        COUNT.load(Ordering::SeqCst)
    }
}

/// Adds a closed round holding `bets` bets of `user` (10,000 sats each).
async fn closed_round_with_bets(s: &Store, user: i64, bets: usize) -> i64 {
    let now = crate::domain::time::unix_now();
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO rounds (status, opened_at, closes_at, pot_sats, bettors) \
         VALUES ('open', $1, $2, 0, 0) RETURNING id",
    )
    .bind(now)
    .bind(now + 600)
    .fetch_one(s.pool())
    .await
    .unwrap();
    for n in 0..bets {
        let mut bet = money::intent(
            TransferKind::Bet,
            user,
            Some(id),
            &format!("{id:032x}{n:032x}"),
            vec![],
        );
        bet.outputs.clear();
        s.place_bet(&bet).await.unwrap();
    }
    // A closed round is anchored with its commitment too: a tip height
    // alone is a row no lifecycle writes, which the views' phase refuses.
    sqlx::query(
        "UPDATE rounds SET status = 'closed', tip_height_at_close = 10, bets_commitment = $2 \
         WHERE id = $1",
    )
    .bind(id)
    .bind("c".repeat(64))
    .execute(s.pool())
    .await
    .unwrap();
    id
}

/// A payout replaced by a fee bump (issue 31) leaves its superseded version
/// beside the live one: the page of rounds joined every payout row of a
/// round, so that round was listed twice (and took two places of the
/// page's limit). It is listed once, with the live version's transaction.
async fn a_bumped_payout_shows_its_round_once_with_the_live_version(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    let (alice, _) = funded(s).await;
    let round = closed_round_with_bets(s, alice, 2).await;
    let now = crate::domain::time::unix_now();
    for (txid, status) in [("aa", "superseded"), ("bb", "broadcast")] {
        sqlx::query(
            "INSERT INTO transfers (kind, round_id, txid, amount_sats, status, created_at) \
             VALUES ('payout', $1, $2, 19000, $3, $4)",
        )
        .bind(round)
        .bind(txid.repeat(32))
        .bind(status)
        .bind(now)
        .execute(s.pool())
        .await
        .unwrap();
    }
    let page = crate::service::history::rounds_page(s, 100, None, Some(alice))
        .await
        .unwrap();
    let listed: Vec<_> = page.rounds.iter().filter(|r| r.round.id == round).collect();
    assert_eq!(
        listed.len(),
        1,
        "round {round} listed {} times",
        listed.len()
    );
    let view = serde_json::to_value(crate::http::rounds::page_view(&page)).unwrap();
    let payout = view["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == round)
        .unwrap()["payout"]
        .clone();
    assert_eq!(payout["txid"], "bb".repeat(32), "{payout}");
}

/// `GET /rounds?limit=100` (issue 32): a page read a round's row, its bets
/// and its payout one round at a time, three statements per round, and
/// carried every round's whole bet list (up to 1,400 bets each). A page
/// now costs the same number of statements however many rounds it holds,
/// and its JSON stays within a fixed size per round however many bets the
/// rounds hold; who played is still told right.
async fn a_page_of_rounds_costs_the_same_however_many_rounds_and_bets(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    let (alice, _) = funded(s).await;
    let bob = s.create_user("bob", "h", addr).await.unwrap().id;
    for _ in 0..3 {
        closed_round_with_bets(s, alice, 12).await;
    }
    let page = |user: i64| async move {
        let before = statements::run_so_far();
        let p = crate::service::history::rounds_page(s, 100, None, Some(user))
            .await
            .unwrap();
        let statements = statements::run_so_far() - before;
        (crate::http::rounds::page_view(&p), statements)
    };
    let (three, three_cost) = page(alice).await;
    assert_eq!(three.rounds.len(), 3);
    assert!(three_cost > 0, "the counter sees the statements");
    for _ in 0..17 {
        closed_round_with_bets(s, alice, 12).await;
    }
    // Every idle connection is taken, so the page opens a new one: its
    // set-up is the pool's cost, not the page's, and must not be counted.
    let mut held = Vec::new();
    for _ in 0..s.pool().num_idle() {
        held.push(s.pool().acquire().await.unwrap());
    }
    let (twenty, twenty_cost) = page(alice).await;
    drop(held);
    assert_eq!(twenty.rounds.len(), 20);
    assert_eq!(
        twenty_cost, three_cost,
        "a page of 20 rounds ran {twenty_cost} statements, a page of 3 ran {three_cost}"
    );
    let body = serde_json::to_vec(&twenty).unwrap();
    assert!(
        body.len() <= 20 * 1_200,
        "a page of 20 rounds of 12 bets is {} bytes, over 1,200 a round",
        body.len()
    );
    assert!(twenty.rounds.iter().all(|r| r.user_played && r.bets == 12));
    let (for_bob, _) = page(bob).await;
    assert!(for_bob.rounds.iter().all(|r| !r.user_played));
    db.cleanup().await;
}

/// Dust sent to a user's address (issue 32): every payment read all of the
/// payer's coins, so thousands of tiny deposits slowed each of the user's
/// payments. A payment now reads at most one transaction's worth of coins,
/// largest first, and never a coin worth no more than its own input's fee
/// at 1 sat/vB; such dust is not in the balance, it is shown apart, and
/// the books still hold it.
async fn a_payment_reads_a_bounded_number_of_coins_and_no_dust(b: Backend) {
    use crate::domain::settings::MAX_TX_INPUTS;
    let db = TestDb::new(b).await;
    let s = &db.store;
    let (alice, _) = funded(s).await;
    let (dust, small) = (1_500_i64, 1_500_i64);
    let deposits: Vec<_> = (0..dust + small)
        .map(|i| crate::store::chain::Deposit {
            txid: format!("{i:064x}").parse().unwrap(),
            vout: 0,
            amount_sats: if i < dust { 50 } else { 1_000 },
            user_id: alice,
            coinbase: false,
        })
        .collect();
    s.connect_block(11, block(b'h', 11), &[], &deposits)
        .await
        .unwrap();
    let ctx = s.payment_context(alice).await.unwrap();
    assert!(
        ctx.coins.len() <= MAX_TX_INPUTS + 1,
        "a payment read {} coins",
        ctx.coins.len()
    );
    assert!(ctx.coins.iter().all(|c| c.amount_sats > 68), "dust read");
    assert_eq!(ctx.coins[0].amount_sats, 100_000, "largest first");
    let again = s.spendable_outputs_at(alice, 1, 11).await.unwrap();
    assert_eq!(again, ctx.coins, "a retry reads what the context read");
    let (balance, pending, _) = s.balances(alice, 1).await.unwrap();
    assert_eq!(
        (balance, pending),
        (100_000 + small * 1_000, 100_000 + small * 1_000),
        "dust is not in the balance"
    );
    assert_eq!(s.dust_sats(alice).await.unwrap(), dust * 50, "shown apart");
    let books = s.ledger_totals().await.unwrap();
    assert_eq!(
        books.users_unspent_sats,
        100_000 + small * 1_000 + dust * 50,
        "the books keep the dust"
    );
    let all = s.spendable_sum_at(alice, 1, 11).await.unwrap();
    assert_eq!(all, 100_000 + small * 1_000, "the whole balance, summed");
}

/// Issue 32: the watcher stores as a round's draw block only a child of
/// the tip read at the close; after a reorganisation replaced that tip,
/// the engine anchors the draw again (once) and the next block above the
/// new anchor becomes the draw block.
async fn only_a_child_of_the_close_tip_becomes_the_draw_block(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    let (user, out) = funded(s).await;
    let round = s
        .ensure_round(crate::domain::time::unix_now())
        .await
        .unwrap();
    let (_, transfer) = s
        .place_bet(&bet_spending(user, round.id, 4, vec![out]))
        .await
        .unwrap();
    s.mark_broadcast(transfer).await.unwrap();
    assert!(s
        .close_round(round.id, 10, Some(block(b'h', 10)), |b| b.len().to_string())
        .await
        .unwrap());
    let draw = |id: i64| async move {
        let d = s.round_detail(id).await.unwrap().unwrap().draw;
        (d.tip_height_at_close, d.tip_hash_at_close, d.block_hash)
    };
    // A branch replaces the close-time tip h10 and builds on it.
    s.unwind_above(9).await.unwrap();
    s.connect_block(10, block(b'x', 10), &[], &[])
        .await
        .unwrap();
    s.connect_block(11, block(b'x', 11), &[], &[])
        .await
        .unwrap();
    assert_eq!(
        draw(round.id).await,
        (Some(10), Some(block(b'h', 10).to_string()), None)
    );
    assert!(s
        .move_round(round.id, RoundStatus::Closing, RoundStatus::Drawing)
        .await
        .unwrap());
    assert!(s
        .anchor_draw_again(round.id, block(b'h', 10), (11, block(b'x', 11)), "replaced")
        .await
        .unwrap());
    assert!(
        !s.anchor_draw_again(round.id, block(b'h', 10), (11, block(b'x', 11)), "replaced")
            .await
            .unwrap(),
        "once"
    );
    s.connect_block(12, block(b'x', 12), &[], &[])
        .await
        .unwrap();
    assert_eq!(
        draw(round.id).await,
        (
            Some(11),
            Some(block(b'x', 11).to_string()),
            Some(block(b'x', 12).to_string())
        )
    );
}

mod bumps;

/// The chain bookkeeping's hashes are decoded where they are read: a
/// stored hash that is not one is reported with its height and text, not
/// handed up as text.
async fn a_stored_block_hash_that_is_not_one_is_a_typed_error(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    s.migrate().await.unwrap();
    s.record_start_block(9, block(b'h', 9)).await.unwrap();
    assert_eq!(s.synced_tip().await.unwrap(), Some((9, block(b'h', 9))));
    sqlx::query("INSERT INTO blocks (height, hash) VALUES (10, 'h10')")
        .execute(s.pool())
        .await
        .unwrap();
    for read in [
        s.synced_tip().await.map(|_| ()),
        s.synced_hash(10).await.map(|_| ()),
    ] {
        assert!(
            matches!(&read, Err(StoreError::StoredBlockHash { height: 10, text, .. }) if text == "h10"),
            "{read:?}"
        );
    }
    assert_eq!(s.synced_hash(9).await.unwrap(), Some(block(b'h', 9)));
}

/// A signed transfer whose stored txid does not decode (a row written
/// around the API; the engine sets it aside) cannot be in any block: the
/// watched txids leave it out instead of failing, so the chain watcher,
/// and every round behind it, goes on.
async fn a_transfer_whose_txid_is_not_one_is_not_watched_and_the_others_are(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    s.migrate().await.unwrap();
    let good = "11".repeat(32);
    for (txid, status) in [
        ("not-a-transaction", "signed"),
        (good.as_str(), "broadcast"),
    ] {
        sqlx::query(
            "INSERT INTO transfers (kind, user_id, round_id, txid, vout, raw_tx, amount_sats, \
             fee_sats, commission_sats, address, status, created_at) \
             VALUES ('withdrawal', NULL, NULL, $1, -1, 'zz', 0, 0, 0, NULL, $2, 0)",
        )
        .bind(txid)
        .bind(status)
        .execute(s.pool())
        .await
        .unwrap();
    }
    let watched = s.unconfirmed_txids().await;
    assert!(
        matches!(&watched, Ok(w) if *w == vec![good.parse::<bitcoin::Txid>().unwrap()]),
        "{watched:?}"
    );
}
