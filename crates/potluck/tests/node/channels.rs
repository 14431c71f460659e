//! Channels between two real `potluck node` processes on one `potluck chain`:
//! fund, connect, open, pay, HTLCs (fulfilled, failed, timed out), close, with
//! every balance checked on both nodes and on the chain to the satoshi; the
//! same across `kill -9`; and a cheating peer's revoked commitment swept. The
//! lifecycle, the unilateral close and the penalty on a chain without the
//! transaction index (Bitcoin Core's default), which the node must not need, run in
//! process (`crates/node/src/txindex_tests.rs`).

use crate::support;

use serde_json::Value;
use std::time::Duration;
use support::channels::{btc_to_sat, r_hash, DevChainProc, NodeProc, TxIndex};
use support::wait_for_blocking;

const FUNDING_SAT: u64 = 1_000_000;
const CAPACITY_SAT: u64 = 500_000;
/// `ChannelConfig::default().commitment_fee_sat` (both nodes offer it; the smaller is used).
const COMMIT_FEE_SAT: u64 = 10_000;
/// The fair close fee on the development chain: 253 sat/kw (Bitcoin Core's relay minimum,
/// the floor of the node's fee rate) × the signed two-output close's 676 weight units.
const CLOSE_FEE_SAT: u64 = 172;

/// Funds A, connects A to B, opens a channel and waits until it is live on both.
/// Returns A's wallet total after the anchor confirmed (its change).
fn open_channel(chain: &DevChainProc, a: &NodeProc, b: &NodeProc) -> u64 {
    let addr = a.cli(&["newaddr"])["address"].as_str().unwrap().to_owned();
    chain.send(&addr, FUNDING_SAT);
    chain.mine(1);
    wait_for_blocking("A's funds", Duration::from_secs(60), || {
        (a.funds() == FUNDING_SAT).then_some(())
    });
    let listfunds = a.cli(&["listfunds"]);
    assert_eq!(listfunds["outputs"][0]["amount_sat"], FUNDING_SAT);
    assert_eq!(listfunds["outputs"][0]["confirmations"], 1);

    let connected = a.cli(&["connect", &b.listen]);
    assert_eq!(connected["node_id"], b.id.as_str());
    // Refused opens change nothing.
    let err = a.try_cli(&["open", &b.id, "5000"]).unwrap_err();
    assert!(err.contains("channel too small"), "{err}");
    let err = a.try_cli(&["open", &b.id, "5000000"]).unwrap_err();
    assert!(err.contains("insufficient funds"), "{err}");
    let err = a.try_cli(&["open", "02abc", "100000"]).unwrap_err();
    assert!(err.contains("not a node id"), "{err}");
    assert_eq!(a.funds(), FUNDING_SAT);
    let opened = a.cli(&["open", &b.id, &CAPACITY_SAT.to_string()]);
    assert_eq!(opened["state"], "open_wait_complete", "{opened}");
    let anchor = opened["anchor_txid"].as_str().unwrap().to_owned();
    // Anti-fee-sniping, as Core's wallet: nLockTime is the tip it was built at.
    assert_eq!(
        chain.tx(&anchor)["locktime"],
        chain.height(),
        "anchor nLockTime"
    );
    chain.mine(1);
    wait_for_blocking("channel live on both", Duration::from_secs(60), || {
        (a.channel_state() == "normal" && b.channel_state() == "normal").then_some(())
    });
    // The anchor pays exactly the capacity; A's change is the rest minus the anchor's fee.
    let anchor_tx = chain.tx(&anchor);
    let fee = chain.fee(&anchor);
    let outs: Vec<u64> = anchor_tx["vout"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| btc_to_sat(&o["value"]))
        .collect();
    assert!(outs.contains(&CAPACITY_SAT), "{outs:?}");
    let change = FUNDING_SAT - CAPACITY_SAT - fee;
    wait_for_blocking("A's change", Duration::from_secs(60), || {
        (a.funds() == change).then_some(())
    });
    change
}

fn msat(ch: &Value, field: &str) -> u64 {
    ch[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {ch}"))
}

/// Both nodes agree: A owns `a_total_sat` and B the rest, the commitment fee split per the rules.
fn assert_split(a: &NodeProc, b: &NodeProc, a_total_sat: u64) {
    let b_total_sat = CAPACITY_SAT - a_total_sat;
    // The non-funder (B) pays half the fee (rounded up) if it can; A pays the rest.
    let b_fee = (COMMIT_FEE_SAT - COMMIT_FEE_SAT / 2).min(b_total_sat);
    let a_fee = COMMIT_FEE_SAT - b_fee;
    let ca = a.channel();
    let cb = b.channel();
    assert_eq!(msat(&ca, "our_msat"), (a_total_sat - a_fee) * 1000, "{ca}");
    assert_eq!(msat(&ca, "our_fee_msat"), a_fee * 1000, "{ca}");
    assert_eq!(
        msat(&ca, "their_msat"),
        (b_total_sat - b_fee) * 1000,
        "{ca}"
    );
    assert_eq!(msat(&ca, "their_fee_msat"), b_fee * 1000, "{ca}");
    assert_eq!(msat(&cb, "our_msat"), msat(&ca, "their_msat"), "{cb}");
    assert_eq!(msat(&cb, "their_msat"), msat(&ca, "our_msat"), "{cb}");
    assert_eq!(msat(&cb, "our_fee_msat"), msat(&ca, "their_fee_msat"));
    assert_eq!(ca["capacity_sat"], CAPACITY_SAT);
    assert_eq!(ca["htlcs"].as_array().unwrap().len(), 0, "{ca}");
    assert_eq!(cb["htlcs"].as_array().unwrap().len(), 0, "{cb}");
}

/// Cooperative close; both wallets get their share minus their part of the close fee.
fn close_and_check(
    chain: &DevChainProc,
    a: &NodeProc,
    b: &NodeProc,
    a_change: u64,
    a_total_sat: u64,
) {
    let b_total_sat = CAPACITY_SAT - a_total_sat;
    let closed = a.cli(&["close", &b.id]);
    assert_eq!(closed["state"], "closed", "{closed}");
    chain.mine(1);
    let b_fee = (CLOSE_FEE_SAT - CLOSE_FEE_SAT / 2).min(b_total_sat);
    let a_fee = CLOSE_FEE_SAT - b_fee;
    let b_expect = b_total_sat - b_fee;
    let a_expect = a_change + a_total_sat - a_fee;
    wait_for_blocking(
        "close outputs in both wallets",
        Duration::from_secs(60),
        || (a.funds() == a_expect && b.funds() == b_expect).then_some(()),
    );
    assert_eq!(b.channel_state(), "closed");
    // On the chain: B's output exists, unspent, with exactly that value.
    let out = &b.cli(&["listfunds"])["outputs"][0];
    let utxo = chain.call("gettxout", serde_json::json!([out["txid"], out["vout"]]));
    assert_eq!(btc_to_sat(&utxo["value"]), b_expect);
}

/// A chain with or without the transaction index; checks that it is what it says.
fn start_chain(index: TxIndex) -> DevChainProc {
    let chain = DevChainProc::start_indexed(index);
    let indexes = chain.call("getindexinfo", serde_json::json!([]));
    assert_eq!(
        indexes.get("txindex").is_some(),
        index == TxIndex::On,
        "{indexes}"
    );
    chain
}

#[test]
fn open_pay_htlcs_close_to_the_satoshi() {
    open_pay_htlcs_close(TxIndex::On);
}

fn open_pay_htlcs_close(index: TxIndex) {
    let chain = start_chain(index);
    let a = NodeProc::start(&chain, false);
    let mut b = NodeProc::start(&chain, false);
    let a_change = open_channel(&chain, &a, &b);
    let mut a_total = CAPACITY_SAT - COMMIT_FEE_SAT + COMMIT_FEE_SAT; // A owns all before fees.
    assert_split(&a, &b, a_total);
    let info = a.cli(&["getinfo"]);
    assert_eq!(info["open_channels"], 1);
    assert_eq!(info["open_channel_balance_msat"], a_total * 1000);
    assert_eq!(info["wallet_sat"], a_change);

    // After a restart B finds the anchor's depth again (a reorganisation while it was
    // down could have taken it) and the channel goes on.
    b.kill9();
    let anchor = a.channel()["anchor_txid"].as_str().unwrap().to_owned();
    let recorded = node_sql(&b, "SELECT hash FROM tx_blocks WHERE txid = ?", &anchor);
    assert_eq!(recorded.len(), 1, "B recorded the anchor's block");
    if index == TxIndex::Off {
        // A channel opened by a release that needed the index has no such record: its
        // unspent anchor is still found (gettxout).
        node_sql(&b, "DELETE FROM tx_blocks WHERE txid = ?", &anchor);
    }
    b.restart();
    // A direct payment, once A has reconnected and B counts the anchor as confirmed.
    let paid = wait_for_blocking(
        "a payment after B's restart",
        Duration::from_secs(60),
        || a.try_cli(&["pay", &b.id, "100000000"]).ok(),
    );
    assert_eq!(paid["state"], "normal");
    a_total -= 100_000;
    assert_split(&a, &b, a_total);

    // An HTLC whose R B knows: B fulfills it.
    let height = chain.height();
    offer_an_htlc_b_fulfils(&a, &b, height);
    a_total -= 50_000;
    wait_for_blocking("fulfil seen by A", Duration::from_secs(30), || {
        (a.channel()["htlcs"].as_array()?.is_empty()).then_some(())
    });
    assert_split(&a, &b, a_total);

    a_wrong_r_is_refused_and_the_htlc_fails_back(&a, &b, height);
    assert_split(&a, &b, a_total);

    an_htlc_times_out(&chain, &a, &b);
    assert_split(&a, &b, a_total);

    // B pays back: the acceptor proposes too.
    b.cli(&["pay", &a.id, "7000000"]);
    a_total += 7_000;
    assert_split(&a, &b, a_total);

    bad_input_is_refused(&a, &b);
    assert_split(&a, &b, a_total);

    close_and_check(&chain, &a, &b, a_change, a_total);
}

/// A offers an HTLC whose R B knows, both list it, and B fulfils it.
fn offer_an_htlc_b_fulfils(a: &NodeProc, b: &NodeProc, height: u64) {
    let r1 = [1u8; 32];
    let added = a.cli(&[
        "newhtlc",
        &b.id,
        "50000000",
        &r_hash(&r1),
        &(height + 20).to_string(),
    ]);
    let htlcs = added["htlcs"].as_array().unwrap();
    assert_eq!(htlcs.len(), 1);
    assert_eq!(htlcs[0]["direction"], "out");
    assert_eq!(htlcs[0]["amount_msat"], 50_000_000);
    assert_eq!(htlcs[0]["r_hash"], r_hash(&r1).as_str());
    let seen = b.channel();
    assert_eq!(seen["htlcs"][0]["direction"], "in");
    assert_eq!(b.cli(&["getinfo"])["pending_htlcs"], 1);
    b.cli(&["fulfillhtlc", &a.id, &hex::encode(r1)]);
}

/// A wrong R is refused and changes nothing, no cooperative close while the HTLC is pending, and B fails it back to A.
fn a_wrong_r_is_refused_and_the_htlc_fails_back(a: &NodeProc, b: &NodeProc, height: u64) {
    let r2 = [2u8; 32];
    a.cli(&[
        "newhtlc",
        &b.id,
        "20000000",
        &r_hash(&r2),
        &(height + 20).to_string(),
    ]);
    let err = b
        .try_cli(&["fulfillhtlc", &a.id, &hex::encode([9u8; 32])])
        .unwrap_err();
    assert!(err.contains("no HTLC"), "{err}");
    // No cooperative close while an HTLC is pending.
    let err = a.try_cli(&["close", &b.id]).unwrap_err();
    assert!(err.contains("HTLCs pending"), "{err}");
    // B cannot route it: the HTLC goes back to A.
    b.cli(&["failhtlc", &a.id, &r_hash(&r2)]);
    wait_for_blocking("routefail seen by A", Duration::from_secs(30), || {
        (a.channel()["htlcs"].as_array()?.is_empty()).then_some(())
    });
}

/// An HTLC that times out: A removes it once the chain passes its expiry.
fn an_htlc_times_out(chain: &DevChainProc, a: &NodeProc, b: &NodeProc) {
    let r3 = [3u8; 32];
    // B needs its claim delay (6 blocks) plus its margin (6) before the expiry.
    let expiry = chain.height() + 13;
    a.cli(&[
        "newhtlc",
        &b.id,
        "30000000",
        &r_hash(&r3),
        &expiry.to_string(),
    ]);
    assert_eq!(b.channel()["htlcs"].as_array().unwrap().len(), 1);
    chain.mine(13);
    wait_for_blocking("timed-out HTLC removed", Duration::from_secs(60), || {
        (a.channel()["htlcs"].as_array()?.is_empty() && b.channel()["htlcs"].as_array()?.is_empty())
            .then_some(())
    });
}

/// Bad input: clear errors, nothing changes.
fn bad_input_is_refused(a: &NodeProc, b: &NodeProc) {
    let err = a.try_cli(&["pay", &b.id, "99999999999"]).unwrap_err();
    assert!(
        err.contains("uint32") || err.contains("insufficient"),
        "{err}"
    );
    let err = a
        .try_cli(&["newhtlc", &b.id, "1000", "zz", "5"])
        .unwrap_err();
    assert!(err.contains("R_HASH"), "{err}");
}

/// Pays `to` 1,000 sat through `from`'s CLI, up to 200 times, on a thread of
/// its own until a payment is refused (the node killed under it).
fn pay_until_refused(from: &NodeProc, to: &str) -> std::thread::JoinHandle<()> {
    let rpc = from.rpc.clone();
    let dir = from.dir.path().to_owned();
    let to = to.to_owned();
    std::thread::spawn(move || {
        for _ in 0..200 {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_potluck"))
                .args(["cli", "--rpc", &format!("http://{rpc}/"), "--data-dir"])
                .arg(&dir)
                .args(["pay", &to, "1000000"])
                .output()
                .unwrap();
            if !out.status.success() {
                break;
            }
        }
    })
}

/// Kills one node with SIGKILL while payments are in flight, restarts it, and checks that no
/// money was lost or created: the channel goes on (and closes cooperatively) or it was closed
/// on chain with each side's latest state.
fn kill_during_updates(kill_a: bool) {
    let chain = DevChainProc::start();
    let mut a = NodeProc::start(&chain, false);
    let mut b = NodeProc::start(&chain, false);
    let a_change = open_channel(&chain, &a, &b);
    a.cli(&["pay", &b.id, "1000000"]);

    // Payments from A in a background process; kill mid-stream.
    let payer = pay_until_refused(&a, &b.id);
    std::thread::sleep(std::time::Duration::from_millis(700));
    let victim = if kill_a { &mut a } else { &mut b };
    victim.kill9();
    payer.join().unwrap();
    victim.restart();

    // Either the channel resumes (normal on both) or one side closed it on chain.
    let outcome = wait_for_blocking(
        "channel settles after restart",
        Duration::from_secs(90),
        || {
            let sa = a.channel_state();
            let sb = b.channel_state();
            if sa == "normal" && sb == "normal" && a.try_cli(&["pay", &b.id, "1000000"]).is_ok() {
                return Some("resumed");
            }
            if sa == "on_chain" || sb == "on_chain" {
                return Some("on_chain");
            }
            None
        },
    );
    eprintln!(
        "after kill -9 the channel {outcome}; A: {}, B: {}",
        a.channel(),
        b.channel()
    );
    if outcome == "resumed" {
        let ca = a.channel();
        let a_total = (msat(&ca, "our_msat") + msat(&ca, "our_fee_msat")) / 1000;
        assert_split(&a, &b, a_total);
        close_and_check(&chain, &a, &b, a_change, a_total);
        return;
    }
    // Closed on chain: both sides must see it (a side that missed the commitment would not
    // claim its HTLCs or watch for a revoked state), whichever of them broadcast it.
    wait_for_blocking(
        "both sides see the channel on chain",
        Duration::from_secs(60),
        || {
            chain.mine(1);
            (a.channel_state() == "on_chain" && b.channel_state() == "on_chain").then_some(())
        },
    );
    // Mine until every claim confirmed and the money adds up to the satoshi:
    // both wallets plus the fees of the commitment and the sweeps = what A had before opening.
    let ca = a.channel();
    let cb = b.channel();
    let anchor = ca["anchor_txid"].as_str().unwrap().to_owned();
    let a_owned = msat(&ca, "our_msat") / 1000;
    let b_owned = msat(&cb, "our_msat") / 1000;
    let fees = wait_for_blocking("all claims confirmed", Duration::from_secs(120), || {
        chain.mine(1);
        let fees = channel_fees(&chain, &[&a, &b], &anchor);
        (a.funds() + b.funds() + fees == a_change + CAPACITY_SAT).then_some(fees)
    });
    let a_got = a.funds() - a_change;
    let b_got = b.funds();
    eprintln!("A got {a_got} (owned {a_owned}), B got {b_got} (owned {b_owned}), fees {fees}");
    // Each side got its latest balance: at most one in-flight 1,000-sat payment and its own
    // sweep fee (< 1,000 sat) apart. A revoked state broadcast would have cost its owner everything.
    assert!(a_got + 2_000 >= a_owned, "A got {a_got}, owned {a_owned}");
    assert!(b_got + 2_000 >= b_owned, "B got {b_got}, owned {b_owned}");
}

/// Fees of the transactions after the anchor that paid the nodes' wallets (commitment, sweeps).
fn channel_fees(chain: &DevChainProc, nodes: &[&NodeProc], anchor: &str) -> u64 {
    let mut txids = std::collections::BTreeSet::new();
    for n in nodes {
        for o in n.cli(&["listfunds"])["outputs"].as_array().unwrap() {
            let txid = o["txid"].as_str().unwrap().to_owned();
            if txid == anchor {
                continue;
            }
            // A sweep's parent is the commitment; the commitment's parent is the anchor.
            for i in chain.tx(&txid)["vin"].as_array().unwrap() {
                let parent = i["txid"].as_str().unwrap();
                if parent != anchor {
                    txids.insert(parent.to_owned());
                }
            }
            txids.insert(txid);
        }
    }
    txids.iter().map(|t| chain.fee(t)).sum()
}

#[test]
fn kill9_of_the_payer_mid_update_loses_nothing() {
    kill_during_updates(true);
}

#[test]
fn kill9_of_the_payee_mid_update_loses_nothing() {
    kill_during_updates(false);
}

/// Needs the test-only cheat (`--features potluck/test-hooks`, as scripts/test.sh runs).
#[cfg(feature = "test-hooks")]
#[test]
fn revoked_commitment_is_swept_by_the_penalty_also_after_restart() {
    penalty_after_restart(TxIndex::On);
}

#[cfg(feature = "test-hooks")]
fn penalty_after_restart(index: TxIndex) {
    let chain = start_chain(index);
    let a = NodeProc::start(&chain, true);
    let mut b = NodeProc::start(&chain, false);
    let a_change = open_channel(&chain, &a, &b);
    a.cli(&["pay", &b.id, "100000000"]);
    a.cli(&["pay", &b.id, "50000000"]);
    // Without the test-only flag the control method does not cheat.
    let err = b.try_cli(&["dev-broadcast-revoked", &a.id]).unwrap_err();
    assert!(err.contains("cheating is disabled"), "{err}");
    // B is down when A cheats; it must still catch it when it comes back.
    b.kill9();
    let cheat = a.cli(&["dev-broadcast-revoked", &b.id]);
    let revoked = cheat["txid"].as_str().unwrap().to_owned();
    chain.mine(1);
    b.restart();
    chain.mine(1);
    let revoked_tx = chain.tx(&revoked);
    let revoked_total: u64 = revoked_tx["vout"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| btc_to_sat(&o["value"]))
        .sum();
    let penalty = wait_for_blocking("penalty in B's wallet", Duration::from_secs(90), || {
        chain.mine(1);
        let funds = b.cli(&["listfunds"]);
        let outs = funds["outputs"].as_array()?.clone();
        outs.into_iter()
            .find(|o| {
                let tx = chain.tx(o["txid"].as_str().unwrap());
                tx["vin"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|i| i["txid"] == revoked.as_str())
            })
            .map(|o| o["txid"].as_str().unwrap().to_owned())
    });
    let penalty_tx = chain.tx(&penalty);
    // The penalty spends every output of the revoked commitment.
    let spent: Vec<u64> = penalty_tx["vin"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["txid"] == revoked.as_str())
        .map(|i| i["vout"].as_u64().unwrap())
        .collect();
    assert_eq!(spent.len(), revoked_tx["vout"].as_array().unwrap().len());
    let fee = chain.fee(&penalty);
    assert!(fee < 2_000, "penalty fee {fee}");
    assert_eq!(b.funds(), revoked_total - fee);
    assert_eq!(b.channel_state(), "on_chain");
    // The cheater keeps only its change.
    chain.mine(10);
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert_eq!(a.funds(), a_change);
}

#[test]
fn unilateral_close_claims_the_delayed_output_and_an_htlc_with_r_on_chain() {
    unilateral_close_with_claims(TxIndex::On);
}

fn unilateral_close_with_claims(index: TxIndex) {
    let chain = start_chain(index);
    let a = NodeProc::start(&chain, false);
    let mut b = NodeProc::start(&chain, false);
    let a_change = open_channel(&chain, &a, &b);
    a.cli(&["pay", &b.id, "100000000"]);
    let r = [4u8; 32];
    let expiry = chain.height() + 50;
    a.cli(&[
        "newhtlc",
        &b.id,
        "60000000",
        &r_hash(&r),
        &expiry.to_string(),
    ]);
    let cb = b.channel();
    let b_msat = msat(&cb, "our_msat");
    let a_msat = msat(&cb, "their_msat");
    let anchor = cb["anchor_txid"].as_str().unwrap().to_owned();

    let err = b.try_cli(&["close", &a.id, "now"]).unwrap_err();
    assert!(err.contains("force"), "{err}");
    // B closes alone, then learns... it knew R all along: it claims the HTLC on chain with R.
    let closed = b.cli(&["close", &a.id, "force"]);
    assert_eq!(closed["state"], "on_chain", "{closed}");
    chain.mine(1);
    b.cli(&["fulfillhtlc", &a.id, &hex::encode(r)]);
    wait_for_blocking("A sees the commitment", Duration::from_secs(60), || {
        (a.channel_state() == "on_chain").then_some(())
    });
    // B's commitment spent the anchor: A's own can never confirm, and forcing it must not
    // replace the commitment A claims from.
    let err = a.try_cli(&["close", &b.id, "force"]).unwrap_err();
    assert!(err.contains("-105") && err.contains("OnChain"), "{err}");
    assert_eq!(a.channel_state(), "on_chain");
    // The queued claims survive a kill -9 while they wait for their delay.
    b.kill9();
    b.restart();

    // B's own output and the HTLC wait for the delay (6 blocks); A's output is paid at once.
    let fees = wait_for_blocking("every claim confirmed", Duration::from_secs(120), || {
        chain.mine(1);
        let fees = channel_fees(&chain, &[&a, &b], &anchor);
        (a.funds() + b.funds() + fees == a_change + CAPACITY_SAT).then_some(fees)
    });
    let commitment_fee = COMMIT_FEE_SAT;
    let sweep_fees = fees - commitment_fee;
    assert!(sweep_fees < 3_000, "sweep fees {sweep_fees}");
    // Each side got its balance to the satoshi, less only its own sweep fees; B got the HTLC.
    let b_got = b.funds();
    let a_got = a.funds() - a_change;
    assert_eq!(
        a_got + b_got + sweep_fees,
        a_msat / 1000 + b_msat / 1000 + 60_000
    );
    assert!(b_got > b_msat / 1000 + 60_000 - 2_000, "B got {b_got}");
    assert!(b_got < b_msat / 1000 + 60_000, "B got {b_got}");
    assert!(
        a_got > a_msat / 1000 - 1_000 && a_got <= a_msat / 1000,
        "A got {a_got}"
    );
}

/// Runs `sql` on a stopped node's database.
fn node_sql(node: &NodeProc, sql: &str, bind: &str) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use sqlx::Row as _;
        let url = format!("sqlite://{}", node.dir.path().join("node.sqlite").display());
        let pool = sqlx::sqlite::SqlitePool::connect(&url).await.unwrap();
        let rows = sqlx::query(sql).bind(bind).fetch_all(&pool).await.unwrap();
        let out = rows
            .iter()
            .map(|r| r.try_get::<String, _>(0).unwrap_or_default())
            .collect();
        pool.close().await;
        out
    })
}

/// A data directory holding a channel snapshot written by the previous release (layout
/// before the channel restructure, `crates/channel/tests/fixtures/snapshot_v0.json`,
/// written by that release's channel crate): the node loads it with its balances and
/// HTLC, upgrades it on disk to the current version and archives its HTLC history for
/// penalties; nothing is lost.
#[test]
fn a_snapshot_from_the_previous_release_is_migrated_at_start() {
    let chain = DevChainProc::start();
    let mut node = NodeProc::start(&chain, false);
    node.kill9();
    let fixture: Value = serde_json::from_str(include_str!(
        "../../../channel/tests/fixtures/snapshot_v0.json"
    ))
    .unwrap();
    let peer = {
        use secp256k1::{PublicKey, Secp256k1, SecretKey};
        PublicKey::from_secret_key(&Secp256k1::new(), &SecretKey::from_slice(&[2; 32]).unwrap())
            .to_string()
    };
    node_sql(
        &node,
        &format!("INSERT INTO channels (id, peer_id, snapshot) VALUES (1, '{peer}', ?) RETURNING peer_id"),
        &fixture["a"].to_string(),
    );
    node.restart();
    let ch = node.channel_with(&peer);
    assert_eq!(ch["state"], "normal", "{ch}");
    assert_eq!(ch["capacity_sat"], 10_000_000);
    assert_eq!(ch["our_msat"], 8_895_000_000u64);
    assert_eq!(ch["their_msat"], 795_000_000);
    assert_eq!(ch["commitment_number"], 4);
    assert_eq!(ch["htlcs"].as_array().unwrap().len(), 1);
    assert_eq!(ch["htlcs"][0]["amount_msat"], 300_000_000);
    node.kill9();
    // Version 4: a blob whose first byte is its version.
    let snapshot = node_sql(
        &node,
        "SELECT typeof(snapshot) || ' ' || hex(substr(snapshot, 1, 1)) FROM channels WHERE id = 1 AND ? = ''",
        "",
    );
    assert_eq!(snapshot, ["blob 04"]);
    let history = node_sql(
        &node,
        "SELECT record FROM revoked_commitments WHERE channel_id = 1 AND num = -1 AND ? = ''",
        "",
    );
    assert_eq!(history.len(), 1, "the old HTLC history is archived");
    assert!(history[0].contains("htlcs"), "{}", history[0]);
    // And it loads again, now as the current version.
    node.restart();
    assert_eq!(node.channel_with(&peer)["our_msat"], 8_895_000_000u64);
}

/// Group commit under kill -9: a hub is killed while payments run on several channels at
/// once (their writes share commits). After the restart no channel is missing and every one
/// either resumes, both sides agreeing on each balance to the millisatoshi and paying again,
/// or is on chain on both sides.
#[test]
fn kill9_of_a_hub_mid_update_on_many_channels_loses_no_channel() {
    const PEERS: usize = 4;
    let chain = DevChainProc::start();
    let mut hub = NodeProc::start(&chain, false);
    let peers: Vec<NodeProc> = (0..PEERS).map(|_| NodeProc::start(&chain, false)).collect();
    open_a_channel_to_each(&chain, &hub, &peers);

    let payers: Vec<_> = peers
        .iter()
        .map(|p| pay_until_refused(&hub, &p.id))
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    hub.kill9();
    for t in payers {
        t.join().unwrap();
    }
    hub.restart();
    assert_eq!(
        hub.cli(&["listchannels"])["channels"]
            .as_array()
            .unwrap()
            .len(),
        PEERS,
        "a channel went missing"
    );
    let mut outcomes = Vec::new();
    for p in &peers {
        let outcome = wait_for_blocking(
            "the channel settles after restart",
            Duration::from_secs(90),
            || {
                let sh = hub.channel_with(&p.id)["state"].as_str()?.to_owned();
                let sp = p.channel_state();
                if sh == "normal"
                    && sp == "normal"
                    && hub.try_cli(&["pay", &p.id, "1000000"]).is_ok()
                {
                    return Some("resumed");
                }
                if sh == "on_chain" || sp == "on_chain" {
                    return Some("on_chain");
                }
                None
            },
        );
        both_sides_agree(&chain, &hub, p, outcome);
        outcomes.push(outcome);
    }
    eprintln!("after kill -9 of the hub: {outcomes:?}");
}

/// The hub, funded once per peer, opens a channel to each; all live on both sides.
fn open_a_channel_to_each(chain: &DevChainProc, hub: &NodeProc, peers: &[NodeProc]) {
    for _ in peers {
        let addr = hub.cli(&["newaddr"])["address"]
            .as_str()
            .unwrap()
            .to_owned();
        chain.send(&addr, FUNDING_SAT);
    }
    chain.mine(1);
    wait_for_blocking("hub funded", Duration::from_secs(60), || {
        (hub.funds() == FUNDING_SAT * peers.len() as u64).then_some(())
    });
    for p in peers {
        hub.cli(&["connect", &p.listen]);
        hub.cli(&["open", &p.id, &CAPACITY_SAT.to_string()]);
    }
    chain.mine(1);
    wait_for_blocking(
        "every channel live on both sides",
        Duration::from_secs(60),
        || {
            peers
                .iter()
                .all(|p| {
                    hub.channel_with(&p.id)["state"] == "normal" && p.channel_state() == "normal"
                })
                .then_some(())
        },
    );
}

/// A resumed channel has the same balances and commitment number on both sides; one closed on chain is seen so by both.
fn both_sides_agree(chain: &DevChainProc, hub: &NodeProc, p: &NodeProc, outcome: &str) {
    if outcome == "resumed" {
        let ch = hub.channel_with(&p.id);
        let cp = p.channel();
        assert_eq!(msat(&ch, "our_msat"), msat(&cp, "their_msat"), "{ch} {cp}");
        assert_eq!(msat(&ch, "their_msat"), msat(&cp, "our_msat"), "{ch} {cp}");
        assert_eq!(msat(&ch, "our_fee_msat"), msat(&cp, "their_fee_msat"));
        assert_eq!(ch["commitment_number"], cp["commitment_number"]);
    } else {
        wait_for_blocking(
            "both sides see the channel on chain",
            Duration::from_secs(60),
            || {
                chain.mine(1);
                (hub.channel_with(&p.id)["state"] == "on_chain" && p.channel_state() == "on_chain")
                    .then_some(())
            },
        );
    }
}
