//! Issue 16, points 9 and 10, against the service and its development chain over JSON-RPC (in this process; the binary where the chain restarts from disk): a pipeline that never halts (a payout that cannot be built or is refused becomes `payout_failed` and the next round opens, a transfer that keeps failing is set aside, evicted transactions are re-broadcast, the payout retry drops pot inputs that no longer exist as a ledger correction) and a chaos run with the chain as a separate process restarted once.

use crate::support;

use support::wait_for;

use std::str::FromStr as _;
use std::time::{Duration, Instant};

use bitcoin::{Network, Txid};
use chain::BitcoindRpc;
use serde_json::{json, Value};
use support::rig::{regtest_address, Rig, MINER};
use support::rpc_proxy::ChainProcess;
use support::{bearer as auth, chaos, Db, Env, Server};

both_databases!(
    unbuildable_payout_fails_the_round_and_the_next_opens,
    a_tampered_commitment_pays_nothing_and_the_next_round_opens,
    a_transfer_that_keeps_failing_is_set_aside,
);

impl Rig {
    /// SIGKILLs the service (and its embedded chain), deletes the chain's
    /// saved mempool, and starts again: every unconfirmed transaction is
    /// gone from the node, as after an eviction or a node restarted with
    /// `-persistmempool=0`.
    async fn restart_with_empty_mempool(&mut self) {
        self.server.take().unwrap().stop().await;
        let _ = std::fs::remove_file(self.env.data_dir.join("chain").join("mempool.dat"));
        self.start(&[]).await;
        let mempool = self.rpc.get_raw_mempool().await.unwrap();
        assert!(
            mempool.is_empty() || mempool.len() < 100,
            "the node restarted: {mempool:?}"
        );
    }

    /// A bet, asked again while the answer is only that the round is
    /// between two rounds (short rounds close every few seconds).
    async fn bet_in_an_open_round(&self, token: &str, amount: i64) -> support::Resp {
        wait_for("condition", Duration::from_secs(60), || async {
            let r = self.bet(token, amount).await;
            (r.status < 400 || r.code() != "round_not_open").then_some(r)
        })
        .await
    }

    async fn set_fee_rate(&self, rate: i64) {
        let r = self
            .s()
            .admin_put("/admin/config", json!({"fee_rate_sat_vb": rate}))
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }

    async fn audit(&self, event: &str) -> Vec<Value> {
        let audit = self.s().admin_get("/admin/audit?limit=200").await.json();
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["event"] == event)
            .cloned()
            .collect()
    }

    /// Mines until nothing of ours is unconfirmed and the service has
    /// processed the tip.
    async fn settle(&self) {
        self.mine(1).await;
        wait_for("condition", Duration::from_secs(60), || async {
            let height = self.rpc.get_block_count().await.unwrap();
            if !self.rpc.get_raw_mempool().await.unwrap().is_empty() {
                self.mine(1).await;
                return None;
            }
            let l = self.s().admin_get("/admin/ledger").await.json();
            (l["synced_height"].as_u64() == Some(u64::from(height))).then_some(())
        })
        .await;
    }

    /// The conservation check with ledger corrections and debts: deposits =
    /// users' outputs + pots + commission + withdrawals + miner fees +
    /// corrections − debts,
    /// and (when `outputs_exist`) every output the ledger holds is unspent on
    /// the chain with its value.
    async fn conservation_with_debts(&self, outputs_exist: bool) -> Value {
        self.settle().await;
        let l = self.balanced_ledger().await;
        if outputs_exist {
            for o in l["unspent"].as_array().unwrap() {
                let v: Value = self
                    .rpc
                    .call("gettxout", json!([o["txid"], o["vout"], true]))
                    .await
                    .unwrap();
                assert!(
                    !v.is_null(),
                    "ledger output {o} is not unspent on the chain"
                );
                let sats = (v["value"].as_f64().unwrap() * 1e8).round() as i64;
                assert_eq!(sats, o["amount_sats"].as_i64().unwrap(), "{o}");
            }
        }
        l
    }
}

/// Confirmations of `txid` on the chain (`None`: unknown to the node).
async fn confirmations(rpc: &BitcoindRpc, txid: &str) -> Option<u64> {
    let v: Result<Value, _> = rpc.call("getrawtransaction", json!([txid, true])).await;
    v.ok().map(|v| v["confirmations"].as_u64().unwrap_or(0))
}

/// Point 9: a payout that cannot be built (here: the fee rate raised after
/// the bets above what the pot can pay) makes the round `payout_failed`
/// with an audit entry, and the next round opens anyway; the admin retry at
/// a sane fee rate draws from the same block and pays once.
async fn unbuildable_payout_fails_the_round_and_the_next_opens(db: Db) {
    let rig = Rig::new(db, "4").await;
    let a = rig.s().user("adam", "10.0.90.1").await;
    let b = rig.s().user("boris", "10.0.90.2").await;
    rig.deposit(&a, 100_000).await;
    rig.deposit(&b, 100_000).await;
    let id = rig.fresh_round().await;
    assert_eq!(rig.bet(&a, 5_000).await.status, 201);
    assert_eq!(rig.bet(&b, 7_000).await.status, 201);
    // 10,000 sat/vB: a two-input payout costs far more than the 12,000 sat pot.
    rig.set_fee_rate(10_000).await;
    rig.wait_status(id, "drawing").await;
    rig.mine(1).await;
    let failed = rig.wait_status(id, "payout_failed").await;
    assert!(failed["payout"].is_null(), "nothing was written: {failed}");
    assert!(
        failed["draw"]["block_hash"].is_string(),
        "the draw block is fixed: {failed}"
    );
    let entry = wait_for("condition", Duration::from_secs(30), || async {
        rig.audit("payout_failed")
            .await
            .into_iter()
            .find(|e| e["details"]["round_id"] == id)
    })
    .await;
    assert!(
        entry["details"]["reason"]
            .as_str()
            .unwrap()
            .contains("cannot be built"),
        "{entry}"
    );
    // The pipeline goes on: the next round is open and takes bets.
    let next = wait_for("condition", Duration::from_secs(30), || async {
        let c = rig.current().await;
        (c["id"].as_i64().unwrap() > id && c["status"] == "open").then_some(c)
    })
    .await;
    rig.set_fee_rate(2).await;
    let r = rig.bet(&a, 3_000).await;
    assert!(
        r.status == 201 || r.code() == "round_not_open",
        "{}",
        r.text()
    );
    assert!(next["id"].as_i64().unwrap() > id);
    // Still failed: nothing retries on its own.
    assert_eq!(rig.round(id).await["status"], "payout_failed");
    let r = rig
        .s()
        .admin_post(&format!("/admin/rounds/{id}/retry-payout"), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let closed = rig.wait_status(id, "closed").await;
    assert_eq!(
        closed["draw"]["block_hash"], failed["draw"]["block_hash"],
        "the retry draws from the block first seen"
    );
    let r = rig
        .s()
        .admin_post(&format!("/admin/rounds/{id}/retry-payout"), json!({}))
        .await;
    assert_eq!(r.status, 409, "a second retry is refused: {}", r.text());
    assert!(!rig.audit("payout_retried").await.is_empty());
    let l = rig.conservation_with_debts(true).await;
    assert_eq!(l["corrections_sats"], 0);
    rig.finish().await;
}

/// Point 8 and 9: a bets commitment changed after the close (here written
/// around the API) is caught by the draw: nothing is paid, the round is
/// `payout_failed` with the mismatch in the audit log, and the next round opens.
async fn a_tampered_commitment_pays_nothing_and_the_next_round_opens(db: Db) {
    let rig = Rig::new(db, "3").await;
    let a = rig.s().user("cyril", "10.0.91.1").await;
    rig.deposit(&a, 100_000).await;
    let id = rig.fresh_round().await;
    assert_eq!(rig.bet(&a, 5_000).await.status, 201);
    let closing = rig.wait_status(id, "drawing").await;
    let stored = closing["draw"]["bets_commitment"]
        .as_str()
        .unwrap()
        .to_string();
    let pool = rig.env.pool().await;
    sqlx::query("UPDATE rounds SET bets_commitment = $1 WHERE id = $2")
        .bind("00".repeat(32))
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    rig.mine(1).await;
    let failed = rig.wait_status(id, "payout_failed").await;
    assert!(failed["payout"].is_null(), "nothing paid: {failed}");
    let entry = wait_for("condition", Duration::from_secs(30), || async {
        rig.audit("payout_failed")
            .await
            .into_iter()
            .find(|e| e["details"]["round_id"] == id)
    })
    .await;
    assert!(
        entry["details"]["reason"]
            .as_str()
            .unwrap()
            .contains("commitment"),
        "{entry}"
    );
    assert_ne!(stored, "00".repeat(32));
    wait_for("condition", Duration::from_secs(30), || async {
        let c = rig.current().await;
        (c["id"].as_i64().unwrap() > id && c["status"] == "open").then_some(())
    })
    .await;
    rig.finish().await;
}

/// Point 9: a transfer whose stored transaction cannot be used (here a
/// signed row whose bytes do not decode, written around the API) is set
/// aside with an audit entry; the worker goes on and rounds keep paying.
async fn a_transfer_that_keeps_failing_is_set_aside(db: Db) {
    let rig = Rig::new(db, "3").await;
    let a = rig.s().user("deena", "10.0.92.1").await;
    let b = rig.s().user("elias", "10.0.92.2").await;
    rig.deposit(&a, 100_000).await;
    rig.deposit(&b, 100_000).await;
    let pool = rig.env.pool().await;
    let bad: i64 = sqlx::query_scalar(
        "INSERT INTO transfers (kind, user_id, round_id, txid, vout, raw_tx, amount_sats, fee_sats, \
         commission_sats, address, status, created_at) \
         VALUES ('withdrawal', NULL, NULL, 'not-a-transaction', -1, 'zz', 0, 0, 0, NULL, 'signed', 0) \
         RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    let entry = wait_for("condition", Duration::from_secs(60), || async {
        rig.audit("transfer_set_aside")
            .await
            .into_iter()
            .find(|e| e["details"]["transfer_id"] == bad)
    })
    .await;
    assert_eq!(entry["details"]["txid"], "not-a-transaction");
    // The worker did not stop: a round with bets is drawn and paid.
    let id = rig.fresh_round().await;
    assert_eq!(rig.bet(&a, 5_000).await.status, 201);
    assert_eq!(rig.bet(&b, 6_000).await.status, 201);
    rig.wait_status(id, "drawing").await;
    rig.mine(1).await;
    rig.wait_status(id, "closed").await;
    // Once: the entry is not repeated on every pass.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        rig.audit("transfer_set_aside")
            .await
            .iter()
            .filter(|e| e["details"]["transfer_id"] == bad)
            .count(),
        1
    );
    rig.conservation_with_debts(true).await;
    rig.finish().await;
}

/// Point 9: a withdrawal and a bet the node lost from its mempool (the
/// chain restarted without its saved mempool) are re-broadcast within a
/// few blocks and confirm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_transactions_are_rebroadcast() {
    let mut rig = Rig::binary(Db::Sqlite, "600").await;
    let a = rig.s().user("faye", "10.0.93.1").await;
    rig.deposit(&a, 100_000).await;
    rig.deposit(&a, 100_000).await;
    let wd = rig
        .s()
        .post(
            "/users/me/withdrawals",
            &[("authorization", &auth(&a))],
            json!({"address": MINER, "amount_sats": 30_000}),
        )
        .await;
    assert_eq!(wd.status, 201, "{}", wd.text());
    let wd_txid = wd.json()["txid"].as_str().unwrap().to_string();
    let bet = rig.bet(&a, 20_000).await;
    assert_eq!(bet.status, 201, "{}", bet.text());
    let bet_txid = bet.json()["txid"].as_str().unwrap().to_string();
    rig.restart_with_empty_mempool().await;
    // The node no longer knows them (unless the service already re-sent them).
    for txid in [&wd_txid, &bet_txid] {
        wait_for("condition", Duration::from_secs(60), || async {
            if confirmations(&rig.rpc, txid).await.unwrap_or(0) > 0 {
                return Some(());
            }
            rig.mine(1).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            None
        })
        .await;
    }
    let txs = rig
        .s()
        .get("/users/me/transactions", &[("authorization", &auth(&a))])
        .await
        .json();
    for txid in [&wd_txid, &bet_txid] {
        let row = txs["transactions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["txid"] == txid.as_str())
            .cloned()
            .unwrap();
        assert_ne!(row["status"], "failed", "{row}");
    }
    rig.conservation_with_debts(true).await;
    rig.finish().await;
}

/// A round of four bets (A, B, A, B; 30M sat each) whose payout the node
/// refused (fee rate above Core's maxfeerate), after which A's deposits are
/// reorganised out and the node forgets them and A's bets (the chain
/// restarts without its saved mempool): A's bets cannot confirm while A's
/// deposits are gone, B's are re-broadcast and confirm. Returns the rig, A,
/// B, the round, the bets and A's deposit transactions (raw hex, in order),
/// which A's sender could broadcast again.
async fn vanished_deposit_scenario() -> (Rig, String, String, i64, Vec<Value>, Vec<String>) {
    let mut rig = Rig::binary(Db::Sqlite, "5").await;
    let a = rig.s().user("gustav", "10.0.94.1").await;
    let b = rig.s().user("halvar", "10.0.94.2").await;
    // B's deposits first, then A's: invalidating A's deposit block keeps B's.
    rig.deposit(&b, 50_000_000).await;
    rig.deposit(&b, 50_000_000).await;
    let a_dep = rig.deposit(&a, 50_000_000).await;
    let a_dep2 = rig.deposit(&a, 50_000_000).await;
    let mut a_raw = Vec::new();
    for d in [&a_dep, &a_dep2] {
        let raw: String = rig
            .rpc
            .call("getrawtransaction", json!([d["txid"], false]))
            .await
            .unwrap();
        a_raw.push(raw);
    }
    let a_dep_block: Value = rig
        .rpc
        .call("getrawtransaction", json!([a_dep["txid"], true]))
        .await
        .unwrap();
    let a_dep_block =
        bitcoin::BlockHash::from_str(a_dep_block["blockhash"].as_str().unwrap()).unwrap();
    let id = rig.fresh_round().await;
    let mut bets = Vec::new();
    for t in [&a, &b, &a, &b] {
        let r = rig.bet(t, 30_000_000).await;
        assert_eq!(r.status, 201, "{}", r.text());
        bets.push(r.json());
    }
    // Above Core's default maxfeerate: the node refuses the payout.
    rig.set_fee_rate(10_000).await;
    rig.wait_status(id, "drawing").await;
    rig.mine(1).await;
    let failed = rig.wait_status(id, "payout_failed").await;
    assert_eq!(failed["payout"]["status"], "broadcast_failed", "{failed}");
    wait_for("condition", Duration::from_secs(30), || async {
        let c = rig.current().await;
        (c["id"].as_i64().unwrap() > id && c["status"] == "open").then_some(())
    })
    .await;
    rig.set_fee_rate(2).await;
    // A's deposits leave the chain, and the node forgets them and A's bets.
    rig.rpc.invalidate_block(&a_dep_block).await.unwrap();
    rig.restart_with_empty_mempool().await;
    rig.mine(2).await;
    // B's bets are re-broadcast and confirm; A's cannot be.
    for bet in [&bets[1], &bets[3]] {
        let txid = bet["txid"].as_str().unwrap();
        wait_for("condition", Duration::from_secs(60), || async {
            if confirmations(&rig.rpc, txid).await.unwrap_or(0) > 0 {
                return Some(());
            }
            rig.mine(1).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            None
        })
        .await;
    }
    for bet in [&bets[0], &bets[2]] {
        let txid = bet["txid"].as_str().unwrap();
        assert_eq!(confirmations(&rig.rpc, txid).await, None, "{txid}");
    }
    (rig, a, b, id, bets, a_raw)
}

/// Mines until the closed round's payout confirms; the txids of the outputs it spent.
async fn confirmed_payout_inputs(rig: &Rig, closed: &Value) -> Vec<String> {
    let payout_txid = Txid::from_str(closed["payout"]["txid"].as_str().unwrap()).unwrap();
    wait_for("condition", Duration::from_secs(60), || async {
        if confirmations(&rig.rpc, &payout_txid.to_string())
            .await
            .unwrap_or(0)
            > 0
        {
            return Some(());
        }
        rig.mine(1).await;
        None
    })
    .await;
    let payout = rig
        .rpc
        .get_raw_transaction(&payout_txid)
        .await
        .unwrap()
        .unwrap();
    payout
        .input
        .iter()
        .map(|i| i.previous_output.txid.to_string())
        .collect()
}

/// Point 9: a refused payout makes the round `payout_failed` and the next
/// round opens; when pot outputs no longer exist (their bets' deposit was
/// reorganised out and the node forgot both), the admin retry pays from the
/// pot outputs that are left and records the missing ones as ledger
/// corrections visible in `/admin/ledger`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_pays_from_the_pot_outputs_that_still_exist() {
    let (rig, _a, _b, id, bets, _) = vanished_deposit_scenario().await;
    let txid = |i: usize| bets[i]["txid"].as_str().unwrap().to_string();
    // Until the service knows A's bets can never confirm (their deposits
    // reversed after 6 blocks), the retry waits for the chain (409).
    let refused = std::sync::atomic::AtomicU32::new(0);
    let r = wait_for("condition", Duration::from_secs(120), || async {
        let r = rig
            .s()
            .admin_post(&format!("/admin/rounds/{id}/retry-payout"), json!({}))
            .await;
        if r.status == 409 {
            refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            rig.mine(1).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            return None;
        }
        Some(r)
    })
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        refused.into_inner() > 0,
        "the first retry came before A's deposits were reversed"
    );
    let closed = rig.wait_status(id, "closed").await;
    let spent = confirmed_payout_inputs(&rig, &closed).await;
    assert_eq!(spent.len(), 2, "{spent:?}");
    assert!(
        spent.contains(&txid(1)) && spent.contains(&txid(3)),
        "{spent:?}"
    );
    let l = rig.s().admin_get("/admin/ledger").await.json();
    assert_eq!(l["corrections_sats"], 60_000_000, "{l}");
    let corrected: Vec<String> = l["corrections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["txid"].as_str().unwrap().to_string())
        .collect();
    assert!(
        corrected.contains(&txid(0)) && corrected.contains(&txid(2)),
        "{l}"
    );
    assert!(l["corrections"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["round_id"] == id));
    let retried = rig.audit("payout_retried").await;
    assert!(
        retried
            .iter()
            .any(|e| e["details"]["dropped_inputs"].as_array().map(Vec::len) == Some(2)),
        "{retried:?}"
    );
    rig.finish().await;
}

/// Attack: the admin retries a failed payout while some bets' deposits are
/// reorganised out and forgotten by the node, before anyone could know they
/// are gone for good; then A's sender broadcasts them again, as wallets do.
/// A's bets (still ours, still re-sent by the worker) confirm, so their pot
/// outputs exist: the payout must spend them. Before, the retry dropped them
/// at once as "no longer existing" (a ledger correction): the winner was paid
/// from B's half of the pot and A's 60M sat sat on the pot's address,
/// confirmed and untracked, while the books claimed the chain took them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waits_for_pot_outputs_whose_bets_can_still_confirm() {
    let (rig, _a, _b, id, bets, a_raw) = vanished_deposit_scenario().await;
    let txid = |i: usize| bets[i]["txid"].as_str().unwrap().to_string();
    let early = rig
        .s()
        .admin_post(&format!("/admin/rounds/{id}/retry-payout"), json!({}))
        .await;
    for raw in &a_raw {
        let _: Value = rig
            .rpc
            .call("sendrawtransaction", json!([raw]))
            .await
            .unwrap();
    }
    for i in [0, 2] {
        let t = txid(i);
        wait_for("condition", Duration::from_secs(60), || async {
            if confirmations(&rig.rpc, &t).await.unwrap_or(0) > 0 {
                return Some(());
            }
            rig.mine(1).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            None
        })
        .await;
    }
    let late = rig
        .s()
        .admin_post(&format!("/admin/rounds/{id}/retry-payout"), json!({}))
        .await;
    let closed = rig.wait_status(id, "closed").await;
    let mut spent = confirmed_payout_inputs(&rig, &closed).await;
    spent.sort();
    let mut all: Vec<String> = (0..4).map(txid).collect();
    all.sort();
    assert_eq!(
        spent, all,
        "the payout must spend every bet's pot output, all four confirmed (retries answered {} then {})",
        early.status, late.status
    );
    assert_eq!(
        (early.status, late.status),
        (409, 200),
        "{} / {}",
        early.text(),
        late.text()
    );
    let l = rig.conservation_with_debts(true).await;
    assert_eq!(l["corrections_sats"], 0, "{l}");
    rig.finish().await;
}

/// Point 10: deposits reorganised out for good after A spent them leave A
/// with a negative balance (the debt) in `/users/me`, `reversed` deposits in
/// the history and `deposit_reversed` audit entries; bets and withdrawals
/// are refused with `debt_outstanding` until A's coins cover the debt; the
/// books balance with the debt and every output they hold exists on chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reversed_deposit_leaves_a_debt_that_blocks_spending() {
    let (rig, a, _b, id, bets, _) = vanished_deposit_scenario().await;
    let reversed = wait_for("condition", Duration::from_secs(90), || async {
        let entries = rig.audit("deposit_reversed").await;
        if entries.len() >= 2 {
            return Some(entries);
        }
        rig.mine(1).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        None
    })
    .await;
    assert_eq!(reversed.len(), 2, "{reversed:?}");
    // What A spent out of the vanished deposits: both bets and their fees.
    let spent: i64 = [&bets[0], &bets[2]]
        .iter()
        .map(|b| b["amount_sats"].as_i64().unwrap() + b["fee_sats"].as_i64().unwrap())
        .sum();
    let debt: i64 = reversed
        .iter()
        .map(|e| e["details"]["debt_sats"].as_i64().unwrap())
        .sum();
    assert_eq!(debt, spent, "{reversed:?}");
    let me = rig.me(&a).await;
    assert_eq!(me["balance_sats"], -spent, "{me}");
    let r = rig.bet_in_an_open_round(&a, 5_000).await;
    assert_eq!(
        (r.status, r.code()),
        (409, "debt_outstanding".into()),
        "{}",
        r.text()
    );
    let r = rig
        .s()
        .post(
            "/users/me/withdrawals",
            &[("authorization", &auth(&a))],
            json!({"address": MINER, "amount_sats": 10_000}),
        )
        .await;
    assert_eq!(
        (r.status, r.code()),
        (409, "debt_outstanding".into()),
        "{}",
        r.text()
    );
    let txs = rig
        .s()
        .get(
            "/users/me/transactions?limit=50",
            &[("authorization", &auth(&a))],
        )
        .await
        .json();
    let reversed_rows = txs["transactions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["kind"] == "deposit" && t["status"] == "reversed")
        .count();
    assert_eq!(reversed_rows, 2, "{txs}");
    // A new deposit covers the debt: spending beyond it is refused, within it allowed.
    rig.deposit(&a, 70_000_000).await;
    let me = rig.me(&a).await;
    assert_eq!(me["balance_sats"], 70_000_000 - spent, "{me}");
    let r = rig.bet_in_an_open_round(&a, 20_000_000).await;
    assert_eq!(r.code(), "debt_outstanding", "{}", r.text());
    let r = rig.bet_in_an_open_round(&a, 1_000_000).await;
    assert_eq!(r.status, 201, "{}", r.text());
    // The failed round is paid from what is left; then every output the
    // books hold exists on the chain.
    let r = rig
        .s()
        .admin_post(&format!("/admin/rounds/{id}/retry-payout"), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    rig.wait_status(id, "closed").await;
    let l = rig.conservation_with_debts(true).await;
    assert_eq!(l["debts_sats"], spent, "{l}");
    rig.finish().await;
}

/// The chaos test with the chain as a separate process (issue 16): clients
/// register, deposit, bet and withdraw while `serve` is SIGKILLed and
/// restarted at random moments and the `potluck chain` process is SIGKILLed
/// and restarted once. At the end every round is closed or `payout_failed`
/// (one open), nothing was paid twice, no transaction was recorded twice,
/// and the conservation check holds to the satoshi.
/// `POTLUCK_CHAOS_SECS` sets the duration (default 20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_with_the_chain_restarted_keeps_the_money_whole() {
    let run_time = chaos::run_time();
    let env = Env::new(Db::Sqlite).await;
    let mut chain = ChainProcess::start(env.data_dir.join("chain-process")).await;
    let url = format!("http://{}/", chain.addr);
    let cookie = chain.cookie();
    let args = [
        "--argon2-memory-kib",
        "64",
        "--argon2-iterations",
        "1",
        "--admin-token",
        support::ADMIN,
        "--bitcoind-url",
        &url,
        "--bitcoind-cookie",
        &cookie,
        "--round-duration-seconds",
        "2",
    ];
    let mut server = Some(env.start_env(&args, &[]).await);
    let tokens = fund_chaos_users(server.as_ref().unwrap(), &chain.rpc()).await;
    let start = Instant::now();
    let deadline = start + run_time;
    let mut kills = 0;
    let mut chain_restarted = false;
    while Instant::now() < deadline {
        let mut clients = chaos::spawn_clients(server.as_ref().unwrap().addr, &tokens);
        chaos::mine_for_a_while(&chain.rpc()).await;
        // Half-way, once: the chain process dies mid-traffic and comes back.
        if !chain_restarted && start.elapsed() > run_time / 2 {
            chain.restart().await;
            chain_restarted = true;
        }
        // SIGKILL the service mid-traffic, then a restart on the same data.
        if let Some(s) = server.take() {
            s.stop().await;
        }
        kills += 1;
        clients.abort_all();
        while clients.join_next().await.is_some() {}
        server = Some(env.start_env(&args, &[]).await);
    }
    assert!(chain_restarted, "the chain process was restarted");
    assert!(kills >= 2, "the server was killed {kills} times");
    let s = server.take().unwrap();
    let rpc = chain.rpc();
    chaos::wait_until_quiet(&env, &rpc).await;
    let pool = env.pool().await;
    chaos::assert_no_round_paid_twice(&pool).await;
    let dup: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (SELECT txid FROM transfers GROUP BY txid HAVING COUNT(*) > 1) t",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(dup, 0, "a transaction was recorded twice");
    let paid: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM transfers WHERE kind = 'payout'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(paid > 0, "rounds were played and paid during the run");
    pool.close().await;
    books_balance_and_are_on_the_chain(&env, &s, &rpc).await;
    s.stop().await;
    drop(chain);
}

/// Three users of `s` with 400,000 sat each, sent through `rpc` and credited.
async fn fund_chaos_users(s: &Server, rpc: &BitcoindRpc) -> Vec<String> {
    let mut tokens = Vec::new();
    for i in 0..3 {
        let t = s
            .user(&format!("chaoschain{i}"), &format!("10.0.78.{i}"))
            .await;
        let me = s
            .get("/users/me", &[("authorization", &auth(&t))])
            .await
            .json();
        let _: Value = rpc
            .call("sendtoaddress", json!([me["address"], 0.004]))
            .await
            .unwrap();
        tokens.push(t);
    }
    rpc.generate_to_address(1, &regtest_address(MINER))
        .await
        .unwrap();
    wait_for("condition", Duration::from_secs(60), || async {
        let mut all = true;
        for t in &tokens {
            let me = s
                .get("/users/me", &[("authorization", &auth(t))])
                .await
                .json();
            all &= me["balance_sats"] == 400_000;
        }
        all.then_some(())
    })
    .await;
    tokens
}

/// Everything confirms; then the books balance to the satoshi and every
/// output they hold is unspent on the chain with its value.
async fn books_balance_and_are_on_the_chain(env: &Env, s: &Server, rpc: &BitcoindRpc) {
    // A payment signed just before the last kill is broadcast by the restarted
    // service only after RECOVER_AFTER_SECS (3 s): until then its outputs
    // are in the books and nowhere on the chain, so wait for it too.
    wait_for("condition", Duration::from_secs(60), || async {
        let pool = env.pool().await;
        let signed: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM transfers WHERE status = 'signed' AND set_aside_at IS NULL",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        pool.close().await;
        if signed > 0 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            return None;
        }
        let height = rpc.get_block_count().await.unwrap();
        if !rpc.get_raw_mempool().await.unwrap().is_empty() {
            rpc.generate_to_address(1, &regtest_address(MINER))
                .await
                .unwrap();
            return None;
        }
        let l = s.admin_get("/admin/ledger").await.json();
        (l["synced_height"].as_u64() == Some(u64::from(height))).then_some(())
    })
    .await;
    let l = s.balanced_ledger().await;
    assert_eq!(l["deposits_sats"], 1_200_000, "{l}");
    for o in l["unspent"].as_array().unwrap() {
        let v: Value = rpc
            .call("gettxout", json!([o["txid"], o["vout"], true]))
            .await
            .unwrap();
        assert!(
            !v.is_null(),
            "ledger output {o} is not unspent on the chain"
        );
        let sats = (v["value"].as_f64().unwrap() * 1e8).round() as i64;
        assert_eq!(sats, o["amount_sats"].as_i64().unwrap(), "{o}");
    }
}

/// Point 10: a deposit output the service holds is spent behind its back
/// (here with the user's key derived from the service's own seed file, as a
/// thief with the seed would): the user's next withdrawal is refused by the
/// node as spending a missing input; the service logs and audits the
/// unknown spend (once), answers pending, never pays it twice, and sets the
/// withdrawal aside once it keeps failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spend_by_an_unknown_transaction_is_audited() {
    let rig = Rig::new(Db::Sqlite, "600").await;
    let a = rig.s().user("ingrid", "10.0.95.1").await;
    let dep = rig.deposit(&a, 200_000).await;
    let dep_txid = Txid::from_str(dep["txid"].as_str().unwrap()).unwrap();
    let dep_tx = rig
        .rpc
        .get_raw_transaction(&dep_txid)
        .await
        .unwrap()
        .unwrap();
    let vout = spend_it_with_the_users_key(&rig, dep_txid, &dep_tx).await;
    let wd = rig
        .s()
        .post(
            "/users/me/withdrawals",
            &[("authorization", &auth(&a))],
            json!({"address": MINER, "amount_sats": 50_000}),
        )
        .await;
    assert_eq!(
        wd.status,
        202,
        "refused for now, never an error to retry: {}",
        wd.text()
    );
    let wd_txid = wd.json()["txid"].as_str().unwrap().to_string();
    let entry = wait_for("condition", Duration::from_secs(60), || async {
        rig.audit("unknown_spend")
            .await
            .into_iter()
            .find(|e| e["details"]["txid"] == dep_txid.to_string())
    })
    .await;
    assert_eq!(entry["details"]["vout"], vout as i64);
    // Kept failing in 6 blocks: set aside, audited once each.
    wait_for("condition", Duration::from_secs(90), || async {
        let aside = rig.audit("transfer_set_aside").await;
        if aside
            .iter()
            .any(|e| e["details"]["txid"] == wd_txid.as_str())
        {
            return Some(());
        }
        rig.mine(1).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        None
    })
    .await;
    let spends = rig
        .audit("unknown_spend")
        .await
        .into_iter()
        .filter(|e| e["details"]["txid"] == dep_txid.to_string())
        .count();
    assert_eq!(spends, 1, "one audit entry per unknown spend");
    assert_eq!(confirmations(&rig.rpc, &wd_txid).await, None, "never paid");
    rig.finish().await;
}

/// Spends the user's deposit output of `dep_tx` behind the service's back, with the user's key derived from the service's own seed file, and mines it; the output's index.
async fn spend_it_with_the_users_key(
    rig: &Rig,
    dep_txid: Txid,
    dep_tx: &bitcoin::Transaction,
) -> usize {
    let pool = rig.env.pool().await;
    let index: i64 =
        sqlx::query_scalar("SELECT derivation_index FROM users WHERE username = 'ingrid'")
            .fetch_one(&pool)
            .await
            .unwrap();
    pool.close().await;
    let w =
        wallet::load_or_create_seed(&rig.env.data_dir.join("wallet.mnemonic"), Network::Regtest)
            .unwrap();
    let path = wallet::KeyPath::receive(u32::try_from(index).unwrap());
    let script = w.derive(path).unwrap().address.script_pubkey();
    let vout = dep_tx
        .output
        .iter()
        .position(|o| o.script_pubkey == script)
        .unwrap();
    let value = dep_tx.output[vout].value;
    let input = wallet::SpendableOutput {
        outpoint: bitcoin::OutPoint {
            txid: dep_txid,
            vout: vout as u32,
        },
        txout: dep_tx.output[vout].clone(),
        path,
    };
    let theft = w
        .build_signed(
            &[input],
            &[bitcoin::TxOut {
                value: value - bitcoin::Amount::from_sat(5_000),
                script_pubkey: regtest_address(MINER).script_pubkey(),
            }],
            None,
            bitcoin::FeeRate::from_sat_per_vb(10).unwrap(),
        )
        .unwrap();
    let _: Value = rig
        .rpc
        .call(
            "sendrawtransaction",
            json!([bitcoin::consensus::encode::serialize_hex(&theft.tx)]),
        )
        .await
        .unwrap();
    rig.mine(1).await;
    vout
}
