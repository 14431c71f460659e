//! Invoices and `pay --route` through the CLI between two real `potluck node` processes
//! (issue 30): B makes an invoice, A pays it along a one-node route, B's `waitinvoice`
//! sees it paid once, a second payment for it goes back to A, and the invoice survives a
//! `kill -9` of B.

use crate::support;

use serde_json::Value;
use std::time::Duration;
use support::channels::{DevChainProc, NodeProc};
use support::wait_for_blocking;

const FUNDING_SAT: u64 = 1_000_000;
const CAPACITY_SAT: u64 = 500_000;

fn open_channel(chain: &DevChainProc, a: &NodeProc, b: &NodeProc) {
    let addr = a.cli(&["newaddr"])["address"].as_str().unwrap().to_owned();
    chain.send(&addr, FUNDING_SAT);
    chain.mine(1);
    wait_for_blocking("A's funds", Duration::from_secs(60), || {
        (a.funds() == FUNDING_SAT).then_some(())
    });
    a.cli(&["connect", &b.listen]);
    a.cli(&["open", &b.id, &CAPACITY_SAT.to_string()]);
    chain.mine(1);
    wait_for_blocking("channel live on both", Duration::from_secs(60), || {
        (a.channel_state() == "normal" && b.channel_state() == "normal").then_some(())
    });
}

/// A's balance outside HTLCs, once its channel holds no HTLC.
fn settled_balance(a: &NodeProc) -> u64 {
    wait_for_blocking("no HTLC left", Duration::from_secs(60), || {
        let ch: Value = a.channel();
        let empty = ch["htlcs"].as_array().is_some_and(|h| h.is_empty());
        (empty && ch["state"] == "normal").then(|| ch["ours"]["balance_msat"].as_u64().unwrap())
    })
}

#[test]
fn an_invoice_is_paid_once_along_a_route_through_the_cli() {
    let chain = DevChainProc::start();
    let a = NodeProc::start(&chain, false);
    let mut b = NodeProc::start(&chain, false);
    open_channel(&chain, &a, &b);
    let before = settled_balance(&a);

    let inv = b.cli(&["invoice", "2000000", "coffee"]);
    assert_eq!(inv["status"], "unpaid", "{inv}");
    assert_eq!(inv["amount_msat"], 2_000_000);
    let r_hash = inv["r_hash"].as_str().unwrap().to_owned();
    // Kept across a kill -9 of B.
    b.kill9();
    b.restart();
    wait_for_blocking("A back with B", Duration::from_secs(60), || {
        (a.connected_to(&b.id) && a.channel_state() == "normal").then_some(())
    });
    let listed = b.cli(&["listinvoices"]);
    assert_eq!(listed["invoices"][0]["r_hash"], r_hash.as_str(), "{listed}");

    let paid = wait_for_blocking("the payment", Duration::from_secs(60), || {
        a.try_cli(&["pay", "--route", &b.id, &r_hash, "2000000"])
            .ok()
    });
    assert_eq!(paid["peer_id"], b.id.as_str());
    let done = b.cli(&["waitinvoice", "coffee"]);
    assert_eq!(done["status"], "paid", "{done}");
    assert_eq!(done["paid_msat"], 2_000_000);
    assert_eq!(settled_balance(&a), before - 2_000_000);

    // A second HTLC for the paid invoice goes back: A pays once.
    a.cli(&["pay", "--route", &b.id, &r_hash, "2000000"]);
    assert_eq!(settled_balance(&a), before - 2_000_000);
    let listed = b.cli(&["listinvoices"]);
    assert_eq!(listed["invoices"].as_array().unwrap().len(), 1);
    assert_eq!(listed["invoices"][0]["paid_msat"], 2_000_000);

    let err = b.try_cli(&["waitinvoice", "tea"]).unwrap_err();
    assert!(err.contains("-115"), "{err}");
    let err = b.try_cli(&["invoice", "1000", "coffee"]).unwrap_err();
    assert!(err.contains("-114"), "{err}");
}
