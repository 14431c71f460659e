//! Black-box money tests of the service on its embedded development chain (in this process; the `potluck serve` binary for the SIGKILL and restart tests): deposits by faucet, bets, the round engine with the draw recomputed from the published proof, payouts to the satoshi, withdrawals, reorgs, crashes by SIGKILL at every money-moving step, and the conservation check after each test.

use crate::support;

use support::wait_for;

use std::str::FromStr as _;
use std::time::{Duration, Instant};

use bitcoin::{Address, Network, Txid};
use chain::Chain as _;
use serde_json::{json, Value};
use support::rig::{regtest_address, Rig};
use support::{bearer as auth, chaos, Db};

const ROUND_SECS: &str = "6";

impl Rig {
    /// The conservation check: deposits = users' outputs + pots in flight +
    /// commission + withdrawals + miner fees, every output the ledger holds
    /// is unspent on the chain with the same value, and the users' balances
    /// add up to the users' outputs once everything is confirmed.
    async fn conservation(&self, tokens: &[&str]) {
        // Let every transaction confirm so balances and chain settle.
        self.mine(1).await;
        wait_for("condition", Duration::from_secs(30), || async {
            let height = self.rpc.get_block_count().await.unwrap();
            let mempool = self.rpc.get_raw_mempool().await.unwrap();
            let l = self.s().admin_get("/admin/ledger").await.json();
            if !mempool.is_empty() {
                self.mine(1).await;
                return None;
            }
            (l["synced_height"].as_u64() == Some(u64::from(height))).then_some(())
        })
        .await;
        wait_for("condition", Duration::from_secs(30), || async {
            let mut all = true;
            for t in tokens {
                let me = self.me(t).await;
                all &=
                    me["has_pending"] == false && me["balance_sats"] == me["pending_balance_sats"];
            }
            all.then_some(())
        })
        .await;
        let l = self.s().admin_get("/admin/ledger").await;
        assert_eq!(l.status, 200, "{}", l.text());
        let l = l.json();
        let n = |k: &str| l[k].as_i64().unwrap();
        assert_eq!(
            n("deposits_sats"),
            n("users_unspent_sats")
                + n("pots_in_flight_sats")
                + n("commission_paid_sats")
                + n("withdrawn_sats")
                + n("miner_fees_sats"),
            "ledger does not balance: {l}"
        );
        let mut listed = 0;
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
            listed += sats;
        }
        assert_eq!(listed, n("users_unspent_sats") + n("pots_in_flight_sats"));
        let mut balances = 0;
        for t in tokens {
            balances += self.me(t).await["balance_sats"].as_i64().unwrap();
        }
        assert_eq!(
            balances,
            n("users_unspent_sats"),
            "users' balances vs their outputs"
        );
    }
}

/// Anti-fee-sniping, as Core's wallet: the service's own transactions carry
/// the height of the last block it processed as nLockTime (at most the tip,
/// a block or two behind at worst).
async fn assert_locked_near_tip(rig: &Rig, tx: &bitcoin::Transaction) {
    let tip = u64::from(rig.rpc.get_block_count().await.unwrap());
    let lock = u64::from(tx.lock_time.to_consensus_u32());
    assert!(
        lock > 100 && lock <= tip && lock + 2 >= tip,
        "nLockTime {lock} at tip {tip}"
    );
}

/// Recomputes the draw of `round` from its published proof and the chain's
/// block at the draw height (see [`support::draw_winner`]); the winning username.
async fn verify_draw(rig: &Rig, round: &Value) -> String {
    let h = round["draw"]["block_height"].as_u64().unwrap();
    let block_hash = rig.rpc.get_block_hash(h as u32).await.unwrap().to_string();
    support::draw_winner(round, &block_hash)
}

async fn three_users_round(db: Db) {
    let rig = Rig::new(db, ROUND_SECS).await;
    let names = ["alice", "Bob", "carol"];
    let deposit = 500_000;
    let tokens = funded_users(&rig, &names, deposit).await;

    let id = rig.fresh_round().await;
    let amounts = [10_000i64, 20_000, 30_000];
    let fees = bets_spend_whole_outputs(&rig, &tokens, &amounts, id, deposit).await;
    let c = rig
        .s()
        .get("/rounds/current", &[("authorization", &auth(&tokens[0]))])
        .await
        .json();
    assert_eq!(c["user_played"], true);
    assert_eq!(c["pot_sats"], 60_000);
    assert_eq!(c["bettors"], 3);

    let r = rig.wait_status(id, "drawing").await;
    assert!(r["draw"]["bets_commitment"].is_string());
    assert!(r["draw"]["block_hash"].is_null());
    rig.mine(1).await;
    let r = rig.wait_status(id, "closed").await;
    let winner = verify_draw(&rig, &r).await;

    let payout = &r["payout"];
    let (wi, won) =
        payout_pays_the_winner_and_the_commission(&rig, &r, &names, &tokens, &winner).await;

    let stakes = Stakes {
        deposit,
        amounts,
        fees,
    };
    each_user_settles(&rig, &names, &tokens, id, &stakes, wi, won).await;
    rounds_list_pages_to(&rig, id, &payout["txid"]).await;
    rig.conservation(&tokens.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    rig.finish().await;
}

/// Users `names` registered, each with `deposit` credited (checked in the API and the history).
async fn funded_users(rig: &Rig, names: &[&str], deposit: i64) -> Vec<String> {
    let mut tokens = Vec::new();
    for (i, n) in names.iter().enumerate() {
        tokens.push(rig.s().user(n, &format!("10.0.0.{}", i + 1)).await);
    }
    for t in &tokens {
        rig.deposit(t, deposit).await;
        let me = rig.me(t).await;
        assert_eq!(me["balance_sats"], deposit, "{me}");
        assert_eq!(me["pending_balance_sats"], deposit);
    }
    let txs = rig.transactions(&tokens[0]).await;
    assert_eq!(txs["transactions"][0]["kind"], "deposit");
    assert_eq!(txs["transactions"][0]["status"], "credited");
    tokens
}

/// Each of `tokens` bets its amount in round `id`: the bet spends whole outputs (the
/// change pending) in a transaction locked near the tip; the fees paid.
async fn bets_spend_whole_outputs(
    rig: &Rig,
    tokens: &[String],
    amounts: &[i64],
    id: i64,
    deposit: i64,
) -> Vec<i64> {
    let mut fees = Vec::new();
    for (t, a) in tokens.iter().zip(amounts.iter().copied()) {
        let r = rig.bet(t, a).await;
        assert_eq!(r.status, 201, "{}", r.text());
        let b = r.json();
        assert_eq!(b["round_id"], id);
        fees.push(b["fee_sats"].as_i64().unwrap());
        let bet_tx = rig
            .rpc
            .get_raw_transaction(&Txid::from_str(b["txid"].as_str().unwrap()).unwrap())
            .await
            .unwrap()
            .expect("bet in the mempool");
        assert_locked_near_tip(rig, &bet_tx).await;
        let me = rig.me(t).await;
        // Whole outputs are spent at broadcast: the change is pending.
        assert_eq!(me["balance_sats"], 0);
        assert_eq!(
            me["pending_balance_sats"].as_i64().unwrap(),
            deposit - a - fees.last().unwrap()
        );
        assert_eq!(me["has_pending"], true);
    }
    fees
}

/// What `three_users_round`'s users put in.
struct Stakes {
    deposit: i64,
    amounts: [i64; 3],
    fees: Vec<i64>,
}

/// The payout transaction on the chain pays the commission to the fee address and
/// the rest less the miner fee to `winner`; the winner's index and what it won.
async fn payout_pays_the_winner_and_the_commission(
    rig: &Rig,
    r: &Value,
    names: &[&str],
    tokens: &[String],
    winner: &str,
) -> (usize, i64) {
    let payout = &r["payout"];
    let txid = Txid::from_str(payout["txid"].as_str().unwrap()).unwrap();
    let tx = rig
        .rpc
        .get_raw_transaction(&txid)
        .await
        .unwrap()
        .expect("payout on chain");
    assert_locked_near_tip(rig, &tx).await;
    let draw_height = r["draw"]["block_height"].as_u64().unwrap();
    assert!(u64::from(tx.lock_time.to_consensus_u32()) >= draw_height);
    let fee_address = rig.s().admin_get("/admin/config").await.json()["fee_address"]
        .as_str()
        .unwrap()
        .to_string();
    let fee_script = Address::from_str(&fee_address)
        .unwrap()
        .assume_checked()
        .script_pubkey();
    let commission = 60_000 * 30 / 100;
    let out_sum: u64 = tx.output.iter().map(|o| o.value.to_sat()).sum();
    let miner_fee = 60_000 - out_sum as i64;
    assert!(miner_fee > 0);
    assert_eq!(payout["fee_sats"], miner_fee);
    assert_eq!(payout["commission_sats"], commission);
    let to_fee: Vec<_> = tx
        .output
        .iter()
        .filter(|o| o.script_pubkey == fee_script)
        .collect();
    assert_eq!(to_fee.len(), 1);
    assert_eq!(to_fee[0].value.to_sat() as i64, commission);
    let wi = names.iter().position(|n| *n == winner).unwrap();
    let winner_addr = rig.me(&tokens[wi]).await["address"]
        .as_str()
        .unwrap()
        .to_string();
    let winner_script = Address::from_str(&winner_addr)
        .unwrap()
        .assume_checked()
        .script_pubkey();
    let to_winner: Vec<_> = tx
        .output
        .iter()
        .filter(|o| o.script_pubkey == winner_script)
        .collect();
    assert_eq!(to_winner.len(), 1);
    let won = 60_000 - commission - miner_fee;
    assert_eq!(to_winner[0].value.to_sat() as i64, won);
    assert_eq!(payout["winner_sats"], won);
    (wi, won)
}

/// The payout confirms and every user's balance and last-round result say what they bet and won.
async fn each_user_settles(
    rig: &Rig,
    names: &[&str],
    tokens: &[String],
    id: i64,
    stakes: &Stakes,
    wi: usize,
    won: i64,
) {
    let Stakes {
        deposit,
        amounts,
        fees,
    } = stakes;
    rig.mine(1).await;
    wait_for("condition", Duration::from_secs(30), || async {
        (rig.round(id).await["payout"]["status"] == "confirmed").then_some(())
    })
    .await;
    for (i, t) in tokens.iter().enumerate() {
        let expected = deposit - amounts[i] - fees[i] + if i == wi { won } else { 0 };
        let me = wait_for("condition", Duration::from_secs(30), || async {
            let me = rig.me(t).await;
            (me["has_pending"] == false).then_some(me)
        })
        .await;
        assert_eq!(
            me["balance_sats"].as_i64().unwrap(),
            expected,
            "{}",
            names[i]
        );
        let last = rig
            .s()
            .get(
                "/users/me/last-round-result",
                &[("authorization", &auth(t))],
            )
            .await;
        assert_eq!(last.status, 200, "{}", last.text());
        let last = last.json();
        assert_eq!(last["round_id"], id);
        assert_eq!(last["outcome"], if i == wi { "won" } else { "lost" });
        assert_eq!(last["bet_sats"], amounts[i]);
        assert_eq!(last["won_sats"], if i == wi { won } else { 0 });
    }
}

/// The rounds list pages backwards from the newest and lists round `id` with its payout `txid`.
async fn rounds_list_pages_to(rig: &Rig, id: i64, txid: &Value) {
    let page = rig.s().get("/rounds?limit=1", &[]).await.json();
    assert_eq!(page["rounds"].as_array().unwrap().len(), 1);
    let first = page["rounds"][0]["id"].as_i64().unwrap();
    assert_eq!(page["next_before_id"], first);
    let older = rig
        .s()
        .get(&format!("/rounds?limit=100&before_id={first}"), &[])
        .await
        .json();
    assert!(older["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["id"].as_i64().unwrap() < first));
    assert!(older["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["id"] == id));
    assert!(older["next_before_id"].is_null());
    let list = rig.s().get("/rounds?limit=5", &[]).await.json();
    assert!(list["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x["id"] == id && x["payout"]["txid"] == *txid));
}

async fn refusals_and_withdrawals(db: Db) {
    let rig = Rig::new(db, ROUND_SECS).await;
    let t = bets_and_faucet_refused_then_a_deposit(&rig).await;

    let dest = withdrawals_refused_then_one_sent(&rig, &t).await;

    // A withdrawal to another user's deposit address is that user's deposit.
    let other = rig.s().user("dora", "10.0.1.2").await;
    let other_addr = rig.me(&other).await["address"]
        .as_str()
        .unwrap()
        .to_string();
    rig.mine(1).await;
    wait_for("condition", Duration::from_secs(30), || async {
        (rig.me(&t).await["has_pending"] == false).then_some(())
    })
    .await;
    let r = rig.withdraw(&t, &other_addr, 20_000).await;
    assert_eq!(r.status, 201, "{}", r.text());
    rig.mine(1).await;
    wait_for("condition", Duration::from_secs(30), || async {
        (rig.me(&other).await["balance_sats"] == 20_000).then_some(())
    })
    .await;

    // Pause refuses bets and withdrawals with 503 paused; resume restores them.
    set_paused(&rig, true).await;
    let r = rig.bet(&t, 5_000).await;
    assert_eq!((r.status, r.code()), (503, "paused".to_string()));
    let r = rig.withdraw(&t, dest, 5_000).await;
    assert_eq!((r.status, r.code()), (503, "paused".to_string()));
    set_paused(&rig, false).await;

    // Retry-payout of a round without a failed payout is refused.
    let r = rig
        .s()
        .admin_post("/admin/rounds/1/retry-payout", json!({}))
        .await;
    assert_eq!(r.status, 409, "{}", r.text());
    let r = rig
        .s()
        .admin_post("/admin/rounds/999999/retry-payout", json!({}))
        .await;
    assert_eq!(r.status, 404);
    rig.conservation(&[&t, &other]).await;
    let txs = rig.transactions(&t).await;
    let kinds: Vec<_> = txs["transactions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, ["withdrawal", "withdrawal", "deposit"]);
    assert_eq!(txs["transactions"][0]["status"], "confirmed");
    rig.finish().await;
}

/// A new user's bets and an oversized faucet request are refused with their codes; then 200,000 sat are credited. The user's token.
async fn bets_and_faucet_refused_then_a_deposit(rig: &Rig) -> String {
    let t = rig.s().user("dave", "10.0.1.1").await;
    let h = [("authorization", auth(&t))];
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let none = rig.s().get("/users/me/last-round-result", &h).await;
    assert_eq!(
        (none.status, none.code()),
        (404, "no_round_played".to_string())
    );
    let r = rig.bet(&t, 5_000).await;
    assert_eq!(
        (r.status, r.code()),
        (422, "insufficient_funds".to_string())
    );
    assert!(r.json()["detail"]["params"]["amount_sats"].is_i64());
    let r = rig.bet(&t, 10).await;
    assert_eq!((r.status, r.code()), (422, "bet_below_minimum".to_string()));
    assert_eq!(r.json()["detail"]["params"]["min_bet_sats"], 1000);
    let r = rig
        .s()
        .faucet(&t, json!({"amount_sats": 10_000_000_000i64}))
        .await;
    assert_eq!(
        (r.status, r.code()),
        (422, "faucet_amount_invalid".to_string())
    );
    rig.deposit(&t, 200_000).await;
    assert_eq!(rig.me(&t).await["balance_sats"], 200_000);
    t
}

/// Withdrawals to the wrong network, to nonsense, below the minimum or beyond the balance are refused and change nothing; a real one is broadcast. Its destination.
async fn withdrawals_refused_then_one_sent(rig: &Rig, t: &str) -> &'static str {
    // Withdrawals: wrong network, malformed, below minimum, then a real one.
    let mainnet = "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu";
    let r = rig.withdraw(t, mainnet, 10_000).await;
    assert_eq!(
        (r.status, r.code()),
        (422, "address_wrong_network".to_string())
    );
    let r = rig.withdraw(t, "nonsense", 10_000).await;
    assert_eq!((r.status, r.code()), (422, "invalid_address".to_string()));
    let dest = "bcrt1qs758ursh4q9z627kt3pp5yysm78ddny6txaqgw";
    let r = rig.withdraw(t, dest, 100).await;
    assert_eq!(
        (r.status, r.code()),
        (422, "withdrawal_below_minimum".to_string())
    );
    let r = rig.withdraw(t, dest, 1_000_000).await;
    assert_eq!(
        (r.status, r.code()),
        (422, "insufficient_funds".to_string())
    );
    assert_eq!(
        rig.me(t).await["balance_sats"],
        200_000,
        "refusals change nothing"
    );
    let r = rig.withdraw(t, dest, 50_000).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let wd = r.json();
    let fee = wd["fee_sats"].as_i64().unwrap();
    let me = rig.me(t).await;
    assert_eq!(me["balance_sats"], 0);
    assert_eq!(
        me["pending_balance_sats"].as_i64().unwrap(),
        200_000 - 50_000 - fee
    );
    let tx = rig
        .rpc
        .get_raw_transaction(&Txid::from_str(wd["txid"].as_str().unwrap()).unwrap())
        .await
        .unwrap()
        .unwrap();
    let dest_script = Address::from_str(dest)
        .unwrap()
        .assume_checked()
        .script_pubkey();
    assert!(tx
        .output
        .iter()
        .any(|o| o.script_pubkey == dest_script && o.value.to_sat() == 50_000));
    assert_locked_near_tip(rig, &tx).await;
    dest
}

/// Two users bet at once, each twice concurrently: every bet either lands or
/// is refused cleanly, and no output is spent twice.
async fn concurrent_bets_never_share_an_output(db: Db) {
    let rig = Rig::new(db, ROUND_SECS).await;
    let a = rig.s().user("erin", "10.0.2.1").await;
    rig.deposit(&a, 100_000).await;
    rig.deposit(&a, 100_000).await;
    rig.fresh_round().await;
    let (r1, r2, r3) = tokio::join!(
        rig.bet(&a, 30_000),
        rig.bet(&a, 30_000),
        rig.bet(&a, 30_000)
    );
    let ok: Vec<_> = [&r1, &r2, &r3]
        .iter()
        .filter(|r| r.status == 201)
        .map(|r| r.json())
        .collect();
    for r in [&r1, &r2, &r3] {
        assert!(
            r.status == 201 || r.code() == "insufficient_funds" || r.code() == "funds_busy",
            "{}",
            r.text()
        );
    }
    // Two outputs: at most two bets can be funded before change confirms.
    assert!(!ok.is_empty() && ok.len() <= 2, "{ok:?}");
    let mut inputs = std::collections::HashSet::new();
    for b in &ok {
        let tx = rig
            .rpc
            .get_raw_transaction(&Txid::from_str(b["txid"].as_str().unwrap()).unwrap())
            .await
            .unwrap()
            .unwrap();
        for i in &tx.input {
            assert!(inputs.insert(i.previous_output), "output spent twice");
        }
    }
    let id = ok[0]["round_id"].as_i64().unwrap();
    rig.wait_status(id, "drawing").await;
    rig.mine(1).await;
    let r = rig.wait_status(id, "closed").await;
    // A single player is refunded: no commission.
    assert_eq!(r["payout"]["commission_sats"], 0);
    let last = rig
        .s()
        .get(
            "/users/me/last-round-result",
            &[("authorization", &auth(&a))],
        )
        .await
        .json();
    assert_eq!(last["outcome"], "refunded");
    rig.conservation(&[&a]).await;
    rig.finish().await;
}

both_databases!(
    three_users_round,
    refusals_and_withdrawals,
    concurrent_bets_never_share_an_output,
    late_and_uneconomic_bets_are_refused
);

/// Issue 16 point 8: a bet after `closes_at` (server time) is refused even
/// before the engine has closed the round, and a bet whose own pot input
/// would cost more than the allowed share of it in fees is refused with
/// `bet_uneconomic`.
async fn late_and_uneconomic_bets_are_refused(db: Db) {
    let rig = Rig::new(db, "3600").await;
    let t = rig.s().user("latecomer", "10.0.9.1").await;
    rig.deposit(&t, 500_000).await;
    let r = rig
        .s()
        .admin_put("/admin/config", json!({"fee_rate_sat_vb": 100}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // 68 vB × 100 sat/vB = 6,800 sats to spend this bet's pot output.
    let r = rig.bet(&t, 5_000).await;
    assert_eq!(
        (r.status, r.code()),
        (422, "bet_uneconomic".to_string()),
        "{}",
        r.text()
    );
    assert_eq!(r.json()["detail"]["params"]["input_fee_sats"], 6_800);
    let r = rig.bet(&t, 20_000).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = rig
        .s()
        .admin_put("/admin/config", json!({"fee_rate_sat_vb": 2}))
        .await;
    assert_eq!(r.status, 200);
    // The close time passes; the engine may not have closed the round yet.
    let pool = rig.env.pool().await;
    sqlx::query("UPDATE rounds SET closes_at = closes_at - 100000 WHERE status = 'open'")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let r = rig.bet(&t, 5_000).await;
    assert_eq!(
        (r.status, r.code()),
        (409, "round_not_open".to_string()),
        "{}",
        r.text()
    );
    rig.finish().await;
}

/// A credited deposit whose block is reorged out is un-credited, and
/// credited again when it confirms on the new branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reorged_deposit_is_uncredited_then_recredited() {
    let rig = Rig::new(Db::Sqlite, ROUND_SECS).await;
    let t = rig.s().user("frank", "10.0.3.1").await;
    let f = rig.deposit(&t, 300_000).await;
    assert_eq!(rig.me(&t).await["balance_sats"], 300_000);
    let tip = rig.rpc.get_best_block_hash().await.unwrap();
    rig.rpc.invalidate_block(&tip).await.unwrap();
    wait_for("condition", Duration::from_secs(30), || async {
        (rig.me(&t).await["balance_sats"] == 0).then_some(())
    })
    .await;
    let txs = rig.transactions(&t).await;
    assert_eq!(txs["transactions"][0]["txid"], f["txid"]);
    assert_eq!(txs["transactions"][0]["status"], "unconfirmed");
    let r = rig.bet(&t, 5_000).await;
    assert_eq!(
        r.code(),
        "insufficient_funds",
        "an uncredited deposit cannot be spent"
    );
    // The faucet transaction went back to the mempool; a new block confirms it.
    rig.mine(2).await;
    wait_for("condition", Duration::from_secs(30), || async {
        (rig.me(&t).await["balance_sats"] == 300_000).then_some(())
    })
    .await;
    rig.conservation(&[&t]).await;
    rig.finish().await;
}

/// Two users with 100,000 sats each bet 20,000 and 40,000 in a fresh round:
/// their tokens and the round's id.
async fn two_bets_round(rig: &Rig, names: [&str; 2], ips: [&str; 2]) -> (String, String, i64) {
    let a = rig.s().user(names[0], ips[0]).await;
    let b = rig.s().user(names[1], ips[1]).await;
    rig.deposit(&a, 100_000).await;
    rig.deposit(&b, 100_000).await;
    let id = rig.fresh_round().await;
    assert_eq!(rig.bet(&a, 20_000).await.status, 201);
    assert_eq!(rig.bet(&b, 40_000).await.status, 201);
    (a, b, id)
}

/// The draw block reorged out after the payout: the draw stays as first
/// seen (a miner gets no second roll), the round is paid once, the payout
/// goes back to pending and confirms again on the new branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reorged_draw_block_keeps_the_draw_and_one_payout() {
    let rig = Rig::new(Db::Sqlite, ROUND_SECS).await;
    let (a, b, id) = two_bets_round(&rig, ["gina", "hank"], ["10.0.4.1", "10.0.4.2"]).await;
    rig.wait_status(id, "drawing").await;
    rig.mine(1).await;
    let before = rig.wait_status(id, "closed").await;
    rig.mine(1).await;
    let confirmed = wait_for("condition", Duration::from_secs(30), || async {
        let r = rig.round(id).await;
        (r["payout"]["status"] == "confirmed").then_some(r)
    })
    .await;
    let draw_hash =
        bitcoin::BlockHash::from_str(before["draw"]["block_hash"].as_str().unwrap()).unwrap();
    rig.rpc.invalidate_block(&draw_hash).await.unwrap();
    wait_for("condition", Duration::from_secs(30), || async {
        let r = rig.round(id).await;
        (r["payout"]["status"] == "broadcast").then_some(())
    })
    .await;
    // The payout's anti-fee-sniping nLockTime is the draw block's height: it
    // is final again once a block is back at that height (as with Core's
    // wallet), and the worker re-sends it then.
    rig.mine(1).await;
    let payout_txid = Txid::from_str(confirmed["payout"]["txid"].as_str().unwrap()).unwrap();
    wait_for("condition", Duration::from_secs(60), || async {
        rig.rpc.in_mempool(payout_txid).await.unwrap().then_some(())
    })
    .await;
    rig.mine(3).await;
    let after = wait_for("condition", Duration::from_secs(30), || async {
        let r = rig.round(id).await;
        (r["payout"]["status"] == "confirmed").then_some(r)
    })
    .await;
    assert_eq!(after["draw"], confirmed["draw"], "the draw never changes");
    assert_eq!(
        after["payout"]["txid"], confirmed["payout"]["txid"],
        "one payout"
    );
    rig.conservation(&[&a, &b]).await;
    rig.finish().await;
}

/// Attack on the draw: the first block the service processes at the draw
/// height fixes the draw (docs/rounds-engine.md), so a reorganisation cannot
/// give anyone a second roll. While the engine is paused (or down) the
/// watcher goes on processing blocks; the draw block A arrives, the outcome
/// is public (commitment + block hash), and a reorganisation replaces A by B
/// before the resume. Before, the draw read whatever block stood at the
/// height when the engine got to it: B, a second roll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draw_block_replaced_while_paused_keeps_the_first_draw() {
    let rig = Rig::new(Db::Sqlite, ROUND_SECS).await;
    let (a, b, id) = two_bets_round(&rig, ["paula", "quinn"], ["10.0.4.11", "10.0.4.12"]).await;
    let drawing = rig.wait_status(id, "drawing").await;
    let close_tip = drawing["draw"]["tip_height_at_close"].as_u64().unwrap();
    set_paused(&rig, true).await;
    rig.mine(1).await;
    let first = rig.rpc.get_block_hash(close_tip as u32 + 1).await.unwrap();
    synced_to(&rig, close_tip + 1).await;
    // Another miner's block at the draw height, then one on top of it.
    another_miners_branch(&rig, &first).await;
    let second = rig.rpc.get_block_hash(close_tip as u32 + 1).await.unwrap();
    assert_ne!(first, second);
    synced_to(&rig, close_tip + 2).await;
    set_paused(&rig, false).await;
    let closed = rig.wait_status(id, "closed").await;
    assert_eq!(
        closed["draw"]["block_hash"],
        first.to_string(),
        "the draw uses the first block processed at its height, not {second}: {closed}"
    );
    assert_eq!(closed["draw"]["block_height"], close_tip + 1);
    rig.conservation(&[&a, &b]).await;
    rig.finish().await;
}

/// Attack on the draw (issue 32, finding 2): the draw block must be
/// provably mined after the close, so its parent must be the tip the
/// engine read at the close. A miner holding a branch back (blocks found
/// before the close, their hashes known to it) releases it after the
/// close: the branch replaces the close-time tip and puts its own block at
/// the draw height. Before, the round was drawn from that block, whose
/// hash the miner knew while bets were still open. Now the round is not
/// drawn from a block that does not descend from the close-time tip: the
/// close is anchored again at the node's tip, and the draw block is the
/// next one mined on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draw_block_that_does_not_descend_from_the_close_tip_is_not_drawn_from() {
    let rig = Rig::new(Db::Sqlite, ROUND_SECS).await;
    let (a, b, id) = two_bets_round(&rig, ["rita", "saul"], ["10.0.4.21", "10.0.4.22"]).await;
    // The bets' block is the tip the close reads.
    rig.mine(1).await;
    let drawing = rig.wait_status(id, "drawing").await;
    let close_tip = drawing["draw"]["tip_height_at_close"].as_u64().unwrap();
    let close_hash = rig.rpc.get_block_hash(close_tip as u32).await.unwrap();
    set_paused(&rig, true).await;
    // The withheld branch: a block at the close height and one above it.
    another_miners_branch(&rig, &close_hash).await;
    let withheld = rig.rpc.get_block_hash(close_tip as u32 + 1).await.unwrap();
    synced_to(&rig, close_tip + 1).await;
    set_paused(&rig, false).await;
    // Time for the engine to look at the round, then a block mined now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    rig.mine(1).await;
    let closed = rig.wait_status(id, "closed").await;
    let draw = &closed["draw"];
    assert_ne!(
        draw["block_hash"],
        withheld.to_string(),
        "round {id} was drawn from block {withheld} at {}, whose parent is not the close-time tip {close_hash}: {closed}",
        close_tip + 1
    );
    let anchor = draw["tip_height_at_close"].as_u64().unwrap();
    assert!(
        anchor > close_tip,
        "anchored again above {close_tip}: {closed}"
    );
    let anchor_hash = rig.rpc.get_block_hash(anchor as u32).await.unwrap();
    assert_eq!(
        draw["tip_hash_at_close"],
        anchor_hash.to_string(),
        "{closed}"
    );
    let block = bitcoin::BlockHash::from_str(draw["block_hash"].as_str().unwrap()).unwrap();
    let header = rig.rpc.get_block(&block).await.unwrap().header;
    assert_eq!(
        header.prev_blockhash, anchor_hash,
        "the draw block descends from the tip at close"
    );
    assert_eq!(draw["block_height"], anchor + 1);
    rig.conservation(&[&a, &b]).await;
    rig.finish().await;
}

/// Pauses (`true`) or resumes the service as the admin.
async fn set_paused(rig: &Rig, paused: bool) {
    let path = if paused {
        "/admin/pause"
    } else {
        "/admin/resume"
    };
    let r = rig.s().admin_post(path, json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Another miner's branch: `replaced` is invalidated and two blocks are
/// mined on its parent, to an address nobody of the service holds.
async fn another_miners_branch(rig: &Rig, replaced: &bitcoin::BlockHash) {
    rig.rpc.invalidate_block(replaced).await.unwrap();
    rig.rpc
        .generate_to_address(
            2,
            &regtest_address("bcrt1qqypqxpq9qcrsszg2pvxq6rs0zqg3yyc5phstwt"),
        )
        .await
        .unwrap();
}

/// Waits until the service has processed the chain up to `height`.
async fn synced_to(rig: &Rig, height: u64) {
    wait_for("condition", Duration::from_secs(30), || async {
        let l = rig.s().admin_get("/admin/ledger").await.json();
        (l["synced_height"].as_u64() == Some(height)).then_some(())
    })
    .await
}

/// Counts chain transactions that spend any of `outpoints`, in blocks from
/// `from` to the tip and in the mempool.
async fn spenders(
    rig: &Rig,
    from: u32,
    outpoints: &[bitcoin::OutPoint],
) -> std::collections::HashSet<Txid> {
    let mut found = std::collections::HashSet::new();
    let tip = rig.rpc.get_block_count().await.unwrap();
    let mut txs = Vec::new();
    for h in from..=tip {
        let hash = rig.rpc.get_block_hash(h).await.unwrap();
        txs.extend(rig.rpc.get_block(&hash).await.unwrap().txdata);
    }
    for txid in rig.rpc.get_raw_mempool().await.unwrap() {
        if let Some(tx) = rig.rpc.get_raw_transaction(&txid).await.unwrap() {
            txs.push(tx);
        }
    }
    for tx in txs {
        if tx
            .input
            .iter()
            .any(|i| outpoints.contains(&i.previous_output))
        {
            found.insert(tx.compute_txid());
        }
    }
    found
}

#[cfg(feature = "test-hooks")]
/// Kills the service with SIGKILL at `step` of a round and restarts it;
/// the round ends with exactly one payout on the chain and the books balance.
async fn crash_at(step: &str) {
    let mut rig = Rig::binary(Db::Sqlite, ROUND_SECS).await;
    let a = rig.s().user("ivan", "10.0.5.1").await;
    let b = rig.s().user("judy", "10.0.5.2").await;
    rig.deposit(&a, 100_000).await;
    rig.deposit(&b, 100_000).await;
    let start_height = rig.rpc.get_block_count().await.unwrap();
    // Restart with the crash hook armed.
    rig.server.take().unwrap().stop().await;
    rig.start(&[("POTLUCK_TEST_CRASH_AT", step)]).await;
    let id = rig.fresh_round().await;
    if step.starts_with("bet_") {
        // The process dies inside this request, so the answer never comes.
        let addr = rig.s().addr;
        let header = auth(&a);
        let _ = tokio::spawn(async move {
            support::request(
                addr,
                "POST",
                "/rounds/current/bets",
                &[("authorization", header.as_str())],
                Some(json!({"amount_sats": 20_000}).to_string().into_bytes()),
            )
            .await
        })
        .await;
    } else {
        assert_eq!(rig.bet(&a, 20_000).await.status, 201);
        assert_eq!(rig.bet(&b, 30_000).await.status, 201);
    }
    if step.starts_with("payout_") {
        rig.wait_status(id, "drawing").await;
        rig.mine(1).await;
    }
    // The hook kills the process at the step.
    let mut server = rig.server.take().unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), server.child.wait())
        .await
        .expect("the crash hook fired")
        .unwrap();
    assert!(!status.success());
    rig.start(&[]).await;
    if step.starts_with("bet_") {
        // The crashed bet is finished on restart; a second player joins if the round is still open.
        let r = rig.bet(&b, 30_000).await;
        assert!(
            r.status == 201 || r.code() == "round_not_open",
            "{}",
            r.text()
        );
    }
    let r = wait_for("condition", Duration::from_secs(60), || async {
        let r = rig.round(id).await;
        (r["status"] != "open" && r["status"] != "closing").then_some(r)
    })
    .await;
    if r["status"] == "drawing" {
        rig.mine(1).await;
    }
    let r = rig.wait_status(id, "closed").await;
    assert_eq!(
        r["draw"]["bets"].as_array().unwrap().len(),
        r["bettors"].as_u64().unwrap() as usize
    );
    let pots: Vec<bitcoin::OutPoint> = r["draw"]["bets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| bitcoin::OutPoint {
            txid: Txid::from_str(b["txid"].as_str().unwrap()).unwrap(),
            vout: 0,
        })
        .collect();
    assert!(!pots.is_empty());
    let paid = spenders(&rig, start_height, &pots).await;
    assert_eq!(paid.len(), 1, "exactly one payout spends the pot: {paid:?}");
    assert_eq!(
        paid.into_iter().next().unwrap().to_string(),
        r["payout"]["txid"].as_str().unwrap()
    );
    rig.conservation(&[&a, &b]).await;
    rig.finish().await;
}

#[cfg(feature = "test-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_bet_signed() {
    crash_at("bet_signed").await;
}

#[cfg(feature = "test-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_bet_broadcast() {
    crash_at("bet_broadcast").await;
}

#[cfg(feature = "test-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_round_closing() {
    crash_at("round_closing").await;
}

#[cfg(feature = "test-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_payout_signed() {
    crash_at("payout_signed").await;
}

#[cfg(feature = "test-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_payout_broadcast() {
    crash_at("payout_broadcast").await;
}

/// A payout the network refuses (here: above Core's default maxfeerate)
/// makes the round payout_failed, written to the audit log, while the next
/// round opens; the admin retry at a sane fee rate pays it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_payout_waits_for_the_admin_retry() {
    let rig = Rig::new(Db::Sqlite, ROUND_SECS).await;
    let a = rig.s().user("kate", "10.0.6.1").await;
    let b = rig.s().user("liam", "10.0.6.2").await;
    for t in [&a, &b] {
        rig.deposit(t, 50_000_000).await;
        rig.deposit(t, 50_000_000).await;
    }
    let start_height = rig.rpc.get_block_count().await.unwrap();
    let id = rig.fresh_round().await;
    // Four bets, each spending one deposit: the payout has four inputs, so
    // its real vsize is below the estimate and 10,000 sat/vB overshoots
    // Core's 0.10 BTC/kvB maxfeerate.
    for t in [&a, &b, &a, &b] {
        let r = rig.bet(t, 30_000_000).await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let r = rig
        .s()
        .admin_put("/admin/config", json!({"fee_rate_sat_vb": 10_000}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    rig.wait_status(id, "drawing").await;
    rig.mine(1).await;
    let failed = wait_for("condition", Duration::from_secs(60), || async {
        let r = rig.round(id).await;
        (r["payout"]["status"] == "broadcast_failed").then_some(r)
    })
    .await;
    assert_eq!(failed["status"], "payout_failed");
    let next = rig.current().await;
    assert!(
        next["id"].as_i64().unwrap() > id,
        "the next round opened: {next}"
    );
    let audit = rig.s().admin_get("/admin/audit").await.json();
    let entry = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"] == "payout_failed")
        .cloned();
    assert_eq!(
        entry.expect("payout_failed audited")["details"]["round_id"],
        id
    );
    // It stays failed: nothing retries on its own.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(rig.round(id).await["payout"]["status"], "broadcast_failed");
    assert_eq!(
        rig.s()
            .admin_put("/admin/config", json!({"fee_rate_sat_vb": 2}))
            .await
            .status,
        200
    );
    let r = rig
        .s()
        .admin_post(&format!("/admin/rounds/{id}/retry-payout"), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], "broadcast");
    let closed = rig.wait_status(id, "closed").await;
    assert_ne!(closed["payout"]["txid"], failed["payout"]["txid"]);
    let r = rig
        .s()
        .admin_post(&format!("/admin/rounds/{id}/retry-payout"), json!({}))
        .await;
    assert_eq!(r.status, 409, "a second retry is refused");
    let pots: Vec<bitcoin::OutPoint> = closed["draw"]["bets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| bitcoin::OutPoint {
            txid: Txid::from_str(b["txid"].as_str().unwrap()).unwrap(),
            vout: 0,
        })
        .collect();
    let paid = spenders(&rig, start_height, &pots).await;
    assert_eq!(paid.len(), 1, "{paid:?}");
    let audit = rig.s().admin_get("/admin/audit").await.json();
    assert!(audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["event"] == "payout_retried"));
    rig.conservation(&[&a, &b]).await;
    rig.finish().await;
}

/// The stream notifies on a credited deposit, a new tip, a bet broadcast and
/// its confirmation, and stays quiet otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_notifies_money_events() {
    let rig = Rig::new(Db::Sqlite, "600").await;
    let t = rig.s().user("mona", "10.0.7.1").await;
    let mut st = support::EventStream::open(rig.s().addr, "10.0.7.9").await;
    assert_eq!(st.status, 200);
    let quiet = Duration::from_millis(700);
    let wait = Duration::from_secs(10);
    st.count_refetches(quiet).await;
    assert_eq!(
        st.count_refetches(Duration::from_secs(1)).await,
        0,
        "idle: no notifications"
    );
    rig.deposit(&t, 100_000).await;
    assert!(st.next_refetch(wait).await, "deposit credited");
    st.count_refetches(quiet).await;
    rig.mine(1).await;
    assert!(st.next_refetch(wait).await, "new tip");
    st.count_refetches(quiet).await;
    assert_eq!(rig.bet(&t, 10_000).await.status, 201);
    assert!(st.next_refetch(wait).await, "bet broadcast");
    st.count_refetches(quiet).await;
    assert_eq!(st.count_refetches(Duration::from_secs(1)).await, 0);
    rig.mine(1).await;
    assert!(st.next_refetch(wait).await, "bet confirmed");
    rig.finish().await;
}

/// Two `serve` processes share one PostgreSQL database and one chain (the
/// second reaches the first's development chain over its Bitcoin Core RPC):
/// concurrent bets of one user through both never spend an output twice, and
/// the round is paid once (one engine runs it, chosen by the engine lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_postgres_spend_once_and_pay_once() {
    let rig = Rig::binary(Db::Postgres, ROUND_SECS).await;
    let b_env = rig.env.beside(rig.env.data_dir.join("second"));
    for f in ["wallet.mnemonic", "jwt-secret"] {
        std::fs::copy(rig.env.data_dir.join(f), b_env.data_dir.join(f)).unwrap();
    }
    let url = format!("http://127.0.0.1:{}/", rig.rpc_port);
    let cookie = rig
        .env
        .data_dir
        .join("chain")
        .join(".cookie")
        .display()
        .to_string();
    let second = b_env
        .start_env(
            &[
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
                ROUND_SECS,
            ],
            &[],
        )
        .await;
    let a = rig.s().user("nina", "10.0.8.1").await;
    let c = rig.s().user("otto", "10.0.8.2").await;
    rig.deposit(&a, 100_000).await;
    rig.deposit(&a, 100_000).await;
    rig.deposit(&c, 100_000).await;
    // The second process has no faucet: it is not running the dev chain.
    let r = second.faucet(&a, json!({})).await;
    assert_eq!(r.status, 404);
    let id = rig.fresh_round().await;
    let (r1, r2, r3) = tokio::join!(
        rig.bet(&a, 30_000),
        second.bet(&a, 30_000),
        second.bet(&a, 30_000),
    );
    let ok: Vec<Value> = [&r1, &r2, &r3]
        .iter()
        .filter(|r| r.status == 201)
        .map(|r| r.json())
        .collect();
    for r in [&r1, &r2, &r3] {
        assert!(
            r.status == 201 || r.code() == "insufficient_funds" || r.code() == "funds_busy",
            "{}",
            r.text()
        );
    }
    assert!(
        !ok.is_empty() && ok.len() <= 2,
        "two outputs fund at most two bets: {ok:?}"
    );
    let mut inputs = std::collections::HashSet::new();
    for b in &ok {
        let tx = rig
            .rpc
            .get_raw_transaction(&Txid::from_str(b["txid"].as_str().unwrap()).unwrap())
            .await
            .unwrap()
            .unwrap();
        for i in &tx.input {
            assert!(inputs.insert(i.previous_output), "output spent twice");
        }
    }
    let r = second.bet(&c, 30_000).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let start_height = rig.rpc.get_block_count().await.unwrap();
    rig.wait_status(id, "drawing").await;
    rig.mine(1).await;
    let closed = rig.wait_status(id, "closed").await;
    let seen_by_second = second.get(&format!("/rounds/{id}"), &[]).await.json();
    assert_eq!(seen_by_second["payout"]["txid"], closed["payout"]["txid"]);
    let pots: Vec<bitcoin::OutPoint> = closed["draw"]["bets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| bitcoin::OutPoint {
            txid: Txid::from_str(b["txid"].as_str().unwrap()).unwrap(),
            vout: 0,
        })
        .collect();
    assert_eq!(pots.len(), ok.len() + 1);
    let paid = spenders(&rig, start_height, &pots).await;
    assert_eq!(paid.len(), 1, "one payout: {paid:?}");
    rig.conservation(&[&a, &c]).await;
    second.stop().await;
    rig.finish().await;
}

/// Pause holds an overdue round where it stands; resume moves it on at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_the_round_and_resume_moves_it_on() {
    let rig = Rig::new(Db::Sqlite, ROUND_SECS).await;
    let t = rig.s().user("pia", "10.0.9.1").await;
    rig.deposit(&t, 100_000).await;
    let id = rig.fresh_round().await;
    assert_eq!(rig.bet(&t, 10_000).await.status, 201);
    set_paused(&rig, true).await;
    let closes_at = rig.round(id).await["closes_at"]
        .as_str()
        .unwrap()
        .to_string();
    // Wait well past closes_at: the round must still be open.
    tokio::time::sleep(Duration::from_secs(ROUND_SECS.parse::<u64>().unwrap() + 2)).await;
    let r = rig.round(id).await;
    assert_eq!(r["status"], "open", "paused rounds do not move");
    assert_eq!(r["closes_at"], closes_at.as_str(), "closes_at never moves");
    assert_eq!(rig.current().await["paused"], true);
    let resumed = Instant::now();
    set_paused(&rig, false).await;
    rig.wait_status(id, "drawing").await;
    assert!(resumed.elapsed() < Duration::from_secs(10));
    rig.mine(1).await;
    let r = rig.wait_status(id, "closed").await;
    assert_eq!(r["payout"]["commission_sats"], 0, "single player refund");
    rig.conservation(&[&t]).await;
    rig.finish().await;
}

#[cfg(feature = "test-hooks")]
/// SIGKILL between writing a withdrawal and broadcasting it (and between
/// broadcasting and marking it): after the restart it is broadcast exactly
/// once and the books balance.
async fn crash_in_withdrawal(step: &str) {
    let mut rig = Rig::binary(Db::Sqlite, ROUND_SECS).await;
    let t = rig.s().user("quinn", "10.0.10.1").await;
    rig.deposit(&t, 100_000).await;
    let start_height = rig.rpc.get_block_count().await.unwrap();
    let spent = {
        let txs = rig.transactions(&t).await;
        let d = &txs["transactions"][0];
        let tx = rig
            .rpc
            .get_raw_transaction(&Txid::from_str(d["txid"].as_str().unwrap()).unwrap())
            .await
            .unwrap()
            .unwrap();
        let me = rig.me(&t).await["address"].as_str().unwrap().to_string();
        let script = Address::from_str(&me)
            .unwrap()
            .assume_checked()
            .script_pubkey();
        let vout = tx
            .output
            .iter()
            .position(|o| o.script_pubkey == script)
            .unwrap();
        bitcoin::OutPoint {
            txid: tx.compute_txid(),
            vout: vout as u32,
        }
    };
    rig.server.take().unwrap().stop().await;
    rig.start(&[("POTLUCK_TEST_CRASH_AT", step)]).await;
    let addr = rig.s().addr;
    let header = auth(&t);
    let _ = tokio::spawn(async move {
        support::request(
            addr,
            "POST",
            "/users/me/withdrawals",
            &[("authorization", header.as_str())],
            Some(json!({"address": "bcrt1qs758ursh4q9z627kt3pp5yysm78ddny6txaqgw", "amount_sats": 40_000}).to_string().into_bytes()),
        )
        .await
    })
    .await;
    let mut server = rig.server.take().unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), server.child.wait())
        .await
        .expect("the crash hook fired")
        .unwrap();
    assert!(!status.success());
    rig.start(&[]).await;
    let w = wait_for("condition", Duration::from_secs(60), || async {
        let txs = rig.transactions(&t).await;
        let w = txs["transactions"][0].clone();
        (w["kind"] == "withdrawal" && w["status"] == "broadcast").then_some(w)
    })
    .await;
    let spenders = spenders(&rig, start_height, &[spent]).await;
    assert_eq!(spenders.len(), 1, "{spenders:?}");
    assert_eq!(
        spenders.into_iter().next().unwrap().to_string(),
        w["txid"].as_str().unwrap()
    );
    rig.conservation(&[&t]).await;
    rig.finish().await;
}

#[cfg(feature = "test-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_withdrawal_signed() {
    crash_in_withdrawal("withdrawal_signed").await;
}

#[cfg(feature = "test-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_withdrawal_broadcast() {
    crash_in_withdrawal("withdrawal_broadcast").await;
}

/// A deposit sent from outside is credited once it has the configured
/// number of confirmations, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deposits_count_at_the_configured_confirmations() {
    let rig = Rig::new(Db::Sqlite, ROUND_SECS).await;
    let r = rig
        .s()
        .admin_put("/admin/config", json!({"deposit_confirmations": 3}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let t = rig.s().user("rosa", "10.0.11.1").await;
    let address = rig.me(&t).await["address"].as_str().unwrap().to_string();
    let txid: String = rig
        .rpc
        .call("sendtoaddress", json!([address, 0.0025]))
        .await
        .unwrap();
    rig.mine(1).await;
    let d = deposit_status(&rig, &t, &txid, "confirming", 1).await;
    assert_eq!(d["confirmations"], 1);
    assert_eq!(d["amount_sats"], 250_000);
    assert_eq!(rig.me(&t).await["balance_sats"], 0);
    rig.mine(1).await;
    deposit_status(&rig, &t, &txid, "confirming", 2).await;
    assert_eq!(rig.me(&t).await["balance_sats"], 0);
    rig.mine(1).await;
    deposit_status(&rig, &t, &txid, "credited", 3).await;
    assert_eq!(rig.me(&t).await["balance_sats"], 250_000);
    rig.conservation(&[&t]).await;
    rig.finish().await;
}

async fn deposit_status(
    rig: &Rig,
    token: &str,
    txid: &str,
    want: &str,
    confirmations: i64,
) -> Value {
    wait_for("condition", Duration::from_secs(30), || async {
        let txs = rig.transactions(token).await;
        let d = txs["transactions"][0].clone();
        (d["txid"] == txid && d["status"] == want && d["confirmations"] == confirmations)
            .then_some(d)
    })
    .await
}

/// A block mined to a user's address pays a coinbase, which consensus lets
/// nobody spend before its 100th confirmation: it is credited then, not at
/// the configured deposit confirmations, and a bet from it is accepted by
/// the chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coinbase_deposit_is_credited_once_mature() {
    let rig = Rig::new(Db::Sqlite, ROUND_SECS).await;
    let t = rig.s().user("miner", "10.0.12.1").await;
    let address = rig.me(&t).await["address"].as_str().unwrap().to_string();
    let a = Address::from_str(&address)
        .unwrap()
        .require_network(Network::Regtest)
        .unwrap();
    let hashes = rig.rpc.generate_to_address(1, &a).await.unwrap();
    let block: Value = rig
        .rpc
        .call("getblock", json!([hashes[0].to_string(), 1]))
        .await
        .unwrap();
    let coinbase = block["tx"][0].as_str().unwrap().to_string();
    let d = deposit_status(&rig, &t, &coinbase, "confirming", 1).await;
    let reward = d["amount_sats"].as_i64().unwrap();
    assert!(reward > 0, "{d}");
    assert_eq!(rig.me(&t).await["balance_sats"], 0);
    let r = rig.bet(&t, 10_000).await;
    assert_eq!(r.code(), "insufficient_funds", "{}", r.text());

    rig.mine(98).await;
    deposit_status(&rig, &t, &coinbase, "confirming", 99).await;
    assert_eq!(rig.me(&t).await["balance_sats"], 0);
    rig.mine(1).await;
    deposit_status(&rig, &t, &coinbase, "credited", 100).await;
    assert_eq!(rig.me(&t).await["balance_sats"], reward);

    rig.fresh_round().await;
    let r = rig.bet(&t, 10_000).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let txid = Txid::from_str(r.json()["txid"].as_str().unwrap()).unwrap();
    let entry: Result<Value, _> = rig.rpc.call("getmempoolentry", json!([txid])).await;
    assert!(
        entry.is_ok(),
        "the chain accepted the bet spending the mature coinbase: {entry:?}"
    );
    rig.conservation(&[&t]).await;
    rig.finish().await;
}

/// A bet or withdrawal written while the chain cannot be reached answers
/// 202 (pending, not an error a client would retry and pay twice); the
/// worker broadcasts it once the chain is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_written_while_the_chain_is_down_is_broadcast_later() {
    let mut rig = Rig::binary(Db::Sqlite, ROUND_SECS).await;
    let b_env = rig.env.beside(rig.env.data_dir.join("second"));
    let url = format!("http://127.0.0.1:{}/", rig.rpc_port);
    let cookie = rig.env.data_dir.join("chain").join(".cookie");
    let second = b_env
        .start_env(
            &[
                "--argon2-memory-kib",
                "64",
                "--argon2-iterations",
                "1",
                "--bitcoind-url",
                &url,
                "--bitcoind-cookie",
                &cookie.display().to_string(),
                "--round-duration-seconds",
                "600",
            ],
            &[],
        )
        .await;
    let t = second.user("pia", "10.0.13.1").await;
    let me = second.me(&t).await;
    let address = me["address"].as_str().unwrap().to_string();
    for _ in 0..2 {
        let _: Value = rig
            .rpc
            .call("sendtoaddress", json!([address, 0.001]))
            .await
            .unwrap();
    }
    rig.mine(1).await;
    wait_for("condition", Duration::from_secs(30), || async {
        let me = second.me(&t).await;
        (me["balance_sats"] == 200_000).then_some(())
    })
    .await;

    // The chain (inside the first process) goes away.
    rig.server.take().unwrap().stop().await;
    let bet = second.bet(&t, 20_000).await;
    assert_eq!(bet.status, 202, "{}", bet.text());
    let bet_txid = bet.json()["txid"].as_str().unwrap().to_string();
    let miner = "bcrt1qs758ursh4q9z627kt3pp5yysm78ddny6txaqgw";
    let wd = second.withdraw(&t, miner, 30_000).await;
    assert_eq!(wd.status, 202, "{}", wd.text());
    assert_eq!(wd.json()["status"], "pending");
    let wd_txid = wd.json()["txid"].as_str().unwrap().to_string();
    let me = second.me(&t).await;
    assert_eq!(
        me["balance_sats"], 0,
        "both outputs are spent by the written intents"
    );
    assert_eq!(me["has_pending"], true);

    // The chain is back: the worker broadcasts both.
    rig.start(&[]).await;
    for txid in [&bet_txid, &wd_txid] {
        wait_for("condition", Duration::from_secs(60), || async {
            let entry: Result<Value, _> = rig.rpc.call("getmempoolentry", json!([txid])).await;
            entry.is_ok().then_some(())
        })
        .await;
    }
    // Marked broadcast right after the chain took it.
    for txid in [&bet_txid, &wd_txid] {
        wait_for("condition", Duration::from_secs(30), || async {
            let txs = second.transactions(&t).await;
            let row = txs["transactions"]
                .as_array()?
                .iter()
                .find(|x| x["txid"] == txid.as_str())
                .cloned()?;
            (row["status"] == "broadcast").then_some(())
        })
        .await;
    }
    second.stop().await;
    rig.finish().await;
}

/// Issue 16's chaos test: clients bet and withdraw while `serve` (and with
/// it the embedded development chain, which runs in the same process) is
/// SIGKILLed and restarted at random moments. At the end every round but
/// the open one is closed, no round was paid twice, no transaction was
/// recorded twice, and the conservation check holds to the satoshi.
/// `POTLUCK_CHAOS_SECS` sets the duration (default 20 s; scripts/chaos.sh
/// runs it for minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_kills_keep_the_money_whole() {
    let run_time = chaos::run_time();
    let mut rig = Rig::binary(Db::Sqlite, "2").await;
    let mut tokens = Vec::new();
    for i in 0..3 {
        let t = rig
            .s()
            .user(&format!("chaos{i}"), &format!("10.0.77.{i}"))
            .await;
        rig.deposit(&t, 400_000).await;
        tokens.push(t);
    }
    let deadline = Instant::now() + run_time;
    let mut kills = 0;
    while Instant::now() < deadline {
        let mut clients = chaos::spawn_clients(rig.s().addr, &tokens);
        chaos::mine_for_a_while(&rig.rpc).await;
        // SIGKILL mid-traffic, then a restart on the same data.
        if let Some(s) = rig.server.take() {
            s.stop().await;
        }
        kills += 1;
        while clients.join_next().await.is_some() {}
        rig.start(&[]).await;
    }
    assert!(kills >= 2, "the server was killed {kills} times");
    chaos::wait_until_quiet(&rig.env, &rig.rpc).await;
    let pool = rig.env.pool().await;
    chaos::assert_no_round_paid_twice(&pool).await;
    let dup: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (SELECT txid FROM transfers WHERE txid IS NOT NULL \
         GROUP BY txid HAVING COUNT(*) > 1) t",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(dup, 0, "a transaction was recorded twice");
    pool.close().await;
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    rig.conservation(&refs).await;
    rig.finish().await;
}

/// Attack: more bets in one round than one transaction can spend. The
/// payout spends every pot output in one transaction, and Bitcoin Core
/// relays none heavier than 400,000 weight units (`tx-size`): 1,469 P2WPKH
/// inputs at most. A round with more bets (a popular one, or one an
/// attacker fills with minimum bets) could never be paid: the payout is
/// refused, the retry rebuilds the same transaction, and the winner's and
/// every bettor's money stays in the pot. So a round takes at most
/// `MAX_ROUND_BETS` (1,400) bets: the rest are refused with `round_full`
/// before anything is signed or taken, and the round pays out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_takes_no_more_bets_than_its_payout_can_spend() {
    // Each user within its share of a round (140, issue 32), 1,485 in all:
    // 16 more than a payout can spend.
    const USERS: usize = 11;
    const BETS_PER_USER: usize = 135;
    const OUTPUT_SATS: u64 = 3_000;
    let rig = Rig::new(Db::Sqlite, "3600").await;
    let mut tokens = Vec::new();
    for u in 0..USERS {
        tokens.push(
            rig.s()
                .user(&format!("filler{u}"), &format!("10.0.12.{}", u + 1))
                .await,
        );
    }
    // Every bet its own confirmed output (a bet's change is pending until it
    // confirms).
    fund_outputs(&rig, &tokens, BETS_PER_USER, OUTPUT_SATS).await;
    let id = rig.current().await["id"].as_i64().unwrap();
    let bets = futures_util::future::join_all(tokens.iter().map(|t| {
        let rig = &rig;
        async move {
            let mut answers = Vec::new();
            for _ in 0..BETS_PER_USER {
                answers.push(rig.bet(t, 1_000).await);
            }
            answers
        }
    }))
    .await;
    let mut placed = 0;
    let mut full = 0;
    for r in bets.iter().flatten() {
        match r.status {
            201 => {
                assert_eq!(r.json()["round_id"], id, "{}", r.text());
                placed += 1;
            }
            _ => {
                assert_eq!(
                    (r.status, r.code()),
                    (409, "round_full".to_string()),
                    "{}",
                    r.text()
                );
                full += 1;
            }
        }
    }
    assert_eq!((placed, full), (1_400, 85));
    let c = rig.current().await;
    assert_eq!(c["bets"], 1_400, "{c}");
    assert_eq!(c["max_bets"], 1_400, "{c}");

    // The round ends; its payout spends all 1,400 pot outputs and confirms.
    let pool = rig.env.pool().await;
    sqlx::query("UPDATE rounds SET closes_at = closes_at - 100000 WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    rig.wait_status(id, "drawing").await;
    rig.mine(1).await;
    let r = wait_for("condition", Duration::from_secs(300), || async {
        let r = rig.round(id).await;
        assert_ne!(r["status"], "payout_failed", "payout {}", r["payout"]);
        (r["status"] == "closed").then_some(r)
    })
    .await;
    assert_spends_1400_within_the_standard_weight(&rig, &r["payout"]["txid"]).await;
    rig.mine(1).await;
    wait_for("condition", Duration::from_secs(60), || async {
        (rig.round(id).await["payout"]["status"] == "confirmed").then_some(())
    })
    .await;
    rig.conservation(&tokens.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    rig.finish().await;
}

/// The transaction `txid` (in the mempool) spends 1,400 inputs and weighs
/// no more than Bitcoin Core relays (400,000 weight units).
async fn assert_spends_1400_within_the_standard_weight(rig: &Rig, txid: &Value) {
    let txid = Txid::from_str(txid.as_str().unwrap()).unwrap();
    let tx = rig
        .rpc
        .get_raw_transaction(&txid)
        .await
        .unwrap()
        .expect("in the mempool");
    assert_eq!(tx.input.len(), 1_400);
    assert!(tx.weight().to_wu() <= 400_000, "{}", tx.weight());
}

/// Pays `per_user` outputs of `sats` from the chain's faucet to each user's
/// deposit address and waits until all are credited.
async fn fund_outputs(rig: &Rig, tokens: &[String], per_user: usize, sats: u64) {
    let mut sent = 0;
    for t in tokens {
        let address = Address::from_str(rig.me(t).await["address"].as_str().unwrap())
            .unwrap()
            .assume_checked();
        for _ in 0..per_user {
            rig.rpc
                .send_to_address(&address, bitcoin::Amount::from_sat(sats))
                .await
                .unwrap();
            sent += 1;
            // The faucet's payments chain on its change: a block before the
            // mempool's limit of 25 unconfirmed ancestors.
            if sent % 20 == 0 {
                rig.mine(1).await;
            }
        }
    }
    rig.mine(1).await;
    let expected = (per_user as u64 * sats) as i64;
    for t in tokens {
        wait_for("condition", Duration::from_secs(120), || async {
            (rig.me(t).await["balance_sats"].as_i64() == Some(expected)).then_some(())
        })
        .await;
    }
}

/// Attack (issue 32, finding 4): one account with many small coins filled a
/// round's 1,400 bets alone and locked every other user out with
/// `round_full`, at the cost of miner fees only (a user alone in a round is
/// refunded without commission). A user now takes at most its share of a
/// round (`--max-bets-per-user-per-round`, default 140, a tenth), and the
/// others can still bet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_cannot_fill_a_round_alone() {
    const SHARE: usize = 140;
    let rig = Rig::new(Db::Sqlite, "3600").await;
    let greedy = rig.s().user("greedy", "10.0.14.1").await;
    let other = rig.s().user("other", "10.0.14.2").await;
    fund_outputs(&rig, std::slice::from_ref(&greedy), SHARE + 1, 3_000).await;
    rig.deposit(&other, 100_000).await;
    for i in 0..SHARE {
        let r = rig.bet(&greedy, 1_000).await;
        assert_eq!(r.status, 201, "bet {i}: {}", r.text());
    }
    let r = rig.bet(&greedy, 1_000).await;
    assert_eq!(
        (r.status, r.code()),
        (409, "round_share_full".to_string()),
        "a bet past the user's share: {}",
        r.text()
    );
    assert_eq!(
        r.json()["detail"]["params"]["max_bets"],
        SHARE,
        "{}",
        r.text()
    );
    let r = rig.bet(&other, 10_000).await;
    assert_eq!(r.status, 201, "another user still bets: {}", r.text());
    rig.finish().await;
}

/// Attack: a balance spread over more outputs than one transaction can
/// spend. A withdrawal of all of it would need a transaction over Bitcoin
/// Core's 400,000 weight units; the node refuses it (`tx-size`), which a
/// user would read as the service failing. It is refused with
/// `too_many_inputs`, naming the most that one withdrawal can take, and that
/// amount goes out in one standard transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawal_needing_more_inputs_than_one_transaction_holds_is_refused_clearly() {
    const OUTPUTS: usize = 1_480;
    const OUTPUT_SATS: u64 = 3_000;
    let rig = Rig::new(Db::Sqlite, "3600").await;
    let t = rig.s().user("hoarder", "10.0.13.1").await;
    fund_outputs(&rig, std::slice::from_ref(&t), OUTPUTS, OUTPUT_SATS).await;
    let to = "bcrt1qs758ursh4q9z627kt3pp5yysm78ddny6txaqgw";
    // Nearly all: each coin nets 2,864 sats after its fee (2 sat/vB × 68 vB),
    // so this needs about 1,475 of them.
    let all = (OUTPUTS as u64 * OUTPUT_SATS) as i64 - 215_000;
    let r = rig.withdraw(&t, to, all).await;
    assert_eq!(
        (r.status, r.code()),
        (422, "too_many_inputs".to_string()),
        "{}",
        r.text()
    );
    let detail = &r.json()["detail"]["params"];
    assert_eq!(detail["max_inputs"], 1_400, "{detail}");
    let max = detail["max_amount_sats"].as_i64().unwrap();
    assert!(max > 1_400 * 2_800 && max < 1_400 * 3_000, "{max}");
    // Nothing was taken: the balance is whole, and the most it names goes out.
    assert_eq!(
        rig.me(&t).await["balance_sats"],
        (OUTPUTS as u64 * OUTPUT_SATS) as i64
    );
    let r = rig.withdraw(&t, to, max).await;
    // Signing and broadcasting 1,400 inputs in a debug build on a loaded
    // machine can outlast the request time-out: the saved withdrawal is then
    // answered 202 pending (issue 32) and its broadcast finishes behind it.
    assert!(r.status == 201 || r.status == 202, "{}", r.text());
    wait_for("condition", Duration::from_secs(120), || async {
        let tx = rig.s().transactions(&t).await;
        (tx["transactions"][0]["status"] == "broadcast").then_some(())
    })
    .await;
    assert_spends_1400_within_the_standard_weight(&rig, &r.json()["txid"]).await;
    rig.conservation(&[&t]).await;
    rig.finish().await;
}

/// Two players bet `amount_sats` each in a fresh round at 10 sat/vB; returns
/// the round id, the players' tokens and addresses by name.
async fn small_pot_round(
    rig: &Rig,
    names: [&str; 2],
    amount_sats: i64,
) -> (i64, Vec<(String, String, String)>) {
    let mut players = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let t = rig.s().user(n, &format!("10.0.12.{}", i + 1)).await;
        rig.deposit(&t, 100_000).await;
        let address = rig.me(&t).await["address"].as_str().unwrap().to_string();
        players.push((n.to_string(), t, address));
    }
    let r = rig
        .s()
        .admin_put("/admin/config", json!({"fee_rate_sat_vb": 10}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = rig.fresh_round().await;
    for (_, t, _) in &players {
        let r = rig.bet(t, amount_sats).await;
        assert_eq!(r.status, 201, "{}", r.text());
        assert_eq!(r.json()["round_id"], id);
    }
    (id, players)
}

/// Checks the closed round's payout on the chain: the winner's output holds
/// exactly pot − commission − miner fee, and the miner gets no more than
/// `rate` (sat/vB) asks for the transaction's size; returns the winner's share.
async fn assert_winner_paid(
    rig: &Rig,
    round: &Value,
    pot: i64,
    rate: i64,
    players: &[(String, String, String)],
) -> i64 {
    let winner = verify_draw(rig, round).await;
    let payout = &round["payout"];
    let tx = rig
        .rpc
        .get_raw_transaction(&Txid::from_str(payout["txid"].as_str().unwrap()).unwrap())
        .await
        .unwrap()
        .expect("payout on chain");
    let address = &players.iter().find(|p| p.0 == winner).unwrap().2;
    let winner_script = Address::from_str(address)
        .unwrap()
        .assume_checked()
        .script_pubkey();
    let to_winner: Vec<i64> = tx
        .output
        .iter()
        .filter(|o| o.script_pubkey == winner_script)
        .map(|o| o.value.to_sat() as i64)
        .collect();
    let out_sum: i64 = tx.output.iter().map(|o| o.value.to_sat() as i64).sum();
    let commission = pot * 30 / 100;
    assert_eq!(
        to_winner.len(),
        1,
        "the winner {winner} has no output in the payout {tx:?}; round {round}"
    );
    assert_eq!(payout["commission_sats"], commission);
    assert_eq!(payout["fee_sats"], pot - out_sum);
    assert_eq!(payout["winner_sats"], to_winner[0]);
    assert_eq!(to_winner[0], pot - commission - (pot - out_sum));
    let vsize = i64::try_from(tx.vsize()).unwrap();
    assert!(
        pot - out_sum <= rate * (vsize + 1),
        "miner fee {} for {vsize} vB at {rate} sat/vB",
        pot - out_sum
    );
    to_winner[0]
}

/// Attack: a winning share above dust but below what the wallet keeps as
/// change (at 10 sat/vB, 990 sats for P2WPKH). Two bets of 2,000 sats (both
/// accepted: above `min_bet_sats` and not uneconomic) leave the winner
/// 4,000 − 1,200 − 2,090 = 710 sats: that is the winner's money and must be
/// paid to them, not left to the miner while the commission is paid in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_winning_share_goes_to_the_winner_not_the_miner() {
    let rig = Rig::new(Db::Sqlite, ROUND_SECS).await;
    let (id, players) = small_pot_round(&rig, ["nina", "omar"], 2_000).await;
    rig.wait_status(id, "drawing").await;
    rig.mine(1).await;
    let closed = rig.wait_status(id, "closed").await;
    let won = assert_winner_paid(&rig, &closed, 4_000, 10, &players).await;
    assert_eq!(won, 710);
    let tokens: Vec<&str> = players.iter().map(|p| p.1.as_str()).collect();
    rig.conservation(&tokens).await;
    rig.finish().await;
}

/// Attack: a pot whose commission and miner fee leave the winner less than
/// dust (two bets of 1,400 sats at 10 sat/vB: 2,800 − 840 − 2,090 < 0). The
/// payout must not be signed without the winner (the commission paid, the
/// winner's share to the miner): the round waits as `payout_failed`, and
/// the admin retry at a lower fee rate pays the winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payout_that_would_leave_the_winner_nothing_waits_for_the_admin_retry() {
    let rig = Rig::new(Db::Sqlite, ROUND_SECS).await;
    let (id, players) = small_pot_round(&rig, ["pia", "quinn"], 1_400).await;
    rig.wait_status(id, "drawing").await;
    rig.mine(1).await;
    let failed = wait_for("condition", Duration::from_secs(60), || async {
        let r = rig.round(id).await;
        (r["status"] == "payout_failed" || r["status"] == "closed").then_some(r)
    })
    .await;
    assert_eq!(failed["status"], "payout_failed", "{failed}");
    assert!(failed["payout"].is_null(), "{failed}");
    let audit = rig.s().admin_get("/admin/audit").await.json();
    let entry = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"] == "payout_failed")
        .cloned()
        .expect("payout_failed audited");
    assert_eq!(entry["details"]["round_id"], id);
    let r = rig
        .s()
        .admin_put("/admin/config", json!({"fee_rate_sat_vb": 2}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = rig
        .s()
        .admin_post(&format!("/admin/rounds/{id}/retry-payout"), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let closed = rig.wait_status(id, "closed").await;
    let won = assert_winner_paid(&rig, &closed, 2_800, 2, &players).await;
    assert!(won > 1_500, "{won}");
    let tokens: Vec<&str> = players.iter().map(|p| p.1.as_str()).collect();
    rig.conservation(&tokens).await;
    rig.finish().await;
}

/// Attack: malformed amounts in the bodies of the three endpoints that move
/// money (a bet, a withdrawal, the development faucet): floats, exponents,
/// strings, integers beyond i64, null, a missing field, and a JSON array
/// (which serde would read as the struct's fields by position). Each is
/// refused with the structured 422 `invalid_body`, and no coins move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_amounts_are_refused_in_the_error_format_and_move_nothing() {
    let rig = Rig::new(Db::Sqlite, "3600").await;
    let t = rig.s().user("rhea", "10.0.13.1").await;
    rig.deposit(&t, 200_000).await;
    let dest = "bcrt1qs758ursh4q9z627kt3pp5yysm78ddny6txaqgw";
    let amounts = [
        "1.5",
        "5000.0",
        "5e3",
        "\"5000\"",
        "18446744073709551616",
        "-99999999999999999999",
        "null",
    ];
    let mut bodies: Vec<(&str, String)> = Vec::new();
    for a in amounts {
        bodies.push(("/rounds/current/bets", format!(r#"{{"amount_sats": {a}}}"#)));
        bodies.push((
            "/users/me/withdrawals",
            format!(r#"{{"address": "{dest}", "amount_sats": {a}}}"#),
        ));
        // The faucet's amount is optional: null asks for the default.
        if a != "null" {
            bodies.push(("/dev/faucet", format!(r#"{{"amount_sats": {a}}}"#)));
        }
    }
    bodies.push(("/rounds/current/bets", "{}".to_string()));
    bodies.push((
        "/users/me/withdrawals",
        format!(r#"{{"address": "{dest}"}}"#),
    ));
    bodies.push(("/rounds/current/bets", "[5000]".to_string()));
    bodies.push(("/users/me/withdrawals", format!(r#"["{dest}", 5000]"#)));
    bodies.push(("/dev/faucet", "[5000]".to_string()));
    bodies.push(("/dev/faucet", "not json".to_string()));
    let bearer = auth(&t);
    for (path, body) in &bodies {
        let r = support::request(
            rig.s().addr,
            "POST",
            path,
            &[("authorization", &bearer)],
            Some(body.as_bytes().to_vec()),
        )
        .await;
        assert_refused(&r, "invalid_body", &format!("POST {path} {body}"));
    }
    let me = rig.me(&t).await;
    assert_eq!(me["balance_sats"], 200_000, "{me}");
    assert_eq!(me["has_pending"], false, "{me}");
    let txs = rig.transactions(&t).await;
    assert_eq!(txs["transactions"].as_array().unwrap().len(), 1, "{txs}");
    rig.finish().await;
}

/// A 422 in the structured error format with `code`: the answer the
/// dashboard can read, not a plain-text rejection.
fn assert_refused(r: &support::Resp, code: &str, what: &str) {
    let structured: Option<Value> = serde_json::from_slice(&r.body).ok();
    assert_eq!(
        (
            r.status,
            structured.as_ref().map(|v| v["detail"]["code"].clone())
        ),
        (422, Some(json!(code))),
        "{what}: {} {}",
        r.status,
        r.text()
    );
}

/// Attack: malformed page parameters of the round history and of the
/// caller's transaction history (not numbers, fractions, beyond i64) get the
/// structured 422 `invalid_query` naming the problem, like every other
/// refusal, rather than a plain-text answer the dashboard cannot read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_page_queries_are_refused_in_the_error_format() {
    let rig = Rig::new(Db::Sqlite, "3600").await;
    let t = rig.s().user("sven", "10.0.14.1").await;
    let bearer = auth(&t);
    for path in ["/rounds", "/users/me/transactions"] {
        for query in [
            "limit=abc",
            "limit=1.5",
            "before_id=x",
            "before_id=99999999999999999999",
        ] {
            let r = rig
                .s()
                .get(&format!("{path}?{query}"), &[("authorization", &bearer)])
                .await;
            assert_refused(&r, "invalid_query", &format!("GET {path}?{query}"));
        }
        // Well-formed pages still answer, out-of-range limits clamped.
        let r = rig
            .s()
            .get(
                &format!("{path}?limit=0&before_id=5"),
                &[("authorization", &bearer)],
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    rig.finish().await;
}
