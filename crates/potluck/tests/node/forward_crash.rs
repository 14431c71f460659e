//! kill -9 of the forwarding node through the CLI (issue 30): three real `potluck node`
//! processes, A pays C through B with `pay --route`, and B kills itself with SIGKILL at a
//! crash point (`POTLUCK_TEST_CRASH_AT`): between receiving R from C and fulfilling A's
//! HTLC, or between storing the forward and offering it to C. Started again from its
//! disk, B completes the payment with its exact fee, or fails it back whole.

// The crash point is compiled in only with `--features potluck/test-hooks`.
#![cfg(feature = "test-hooks")]

use crate::support;

use serde_json::Value;
use std::time::Duration;
use support::channels::{DevChainProc, NodeProc};
use support::wait_for_blocking;

const FUNDING_SAT: u64 = 1_000_000;
const CAPACITY_SAT: u64 = 500_000;
/// What C receives.
const AMOUNT_MSAT: u64 = 2_000_000;
/// B's fee by the default schedule (1,000 msat + 10 millionths of what it forwards).
const FEE_MSAT: u64 = 1_020;

/// `a` opens a channel to `b` and both see it live.
fn open_channel(chain: &DevChainProc, a: &NodeProc, b: &NodeProc) {
    let addr = a.cli(&["newaddr"])["address"].as_str().unwrap().to_owned();
    chain.send(&addr, FUNDING_SAT);
    chain.mine(1);
    wait_for_blocking("the opener's funds", Duration::from_secs(60), || {
        (a.funds() == FUNDING_SAT).then_some(())
    });
    a.cli(&["connect", &b.listen]);
    a.cli(&["open", &b.id, &CAPACITY_SAT.to_string()]);
    chain.mine(1);
    wait_for_blocking("channel live on both", Duration::from_secs(60), || {
        let live = |n: &NodeProc, peer: &str| n.channel_with(peer)["state"] == "normal";
        (live(a, &b.id) && live(b, &a.id)).then_some(())
    });
}

/// `n`'s balance in its channel with `peer` once that channel is idle with no HTLC.
fn settled_balance(n: &NodeProc, peer: &str) -> u64 {
    wait_for_blocking("no HTLC left", Duration::from_secs(90), || {
        let ch: Value = n.channel_with(peer);
        let empty = ch["htlcs"].as_array().is_some_and(|h| h.is_empty());
        (empty && ch["state"] == "normal").then(|| ch["ours"]["balance_msat"].as_u64().unwrap())
    })
}

/// A – B – C with B to die at `step`; A pays C's invoice through B, B dies and is started
/// again. Returns (whether C was paid, A's and C's balance changes, B's listforwards).
fn pay_through_a_dying_hop(step: &str) -> (bool, u64, u64, Value) {
    let chain = DevChainProc::start();
    let a = NodeProc::start(&chain, false);
    let mut b = NodeProc::start(&chain, false);
    let c = NodeProc::start(&chain, false);
    open_channel(&chain, &a, &b);
    open_channel(&chain, &b, &c);
    let inv = c.cli(&["invoice", &AMOUNT_MSAT.to_string(), "far"]);
    let r_hash = inv["r_hash"].as_str().unwrap().to_owned();
    let a0 = settled_balance(&a, &b.id);
    let c0 = settled_balance(&c, &b.id);

    b.kill9();
    b.set_env("POTLUCK_TEST_CRASH_AT", Some(step));
    b.restart();
    wait_for_blocking("B back with A and C", Duration::from_secs(60), || {
        let live = |n: &NodeProc, peer: &str| {
            n.connected_to(peer) && n.channel_with(peer)["state"] == "normal"
        };
        (live(&b, &a.id) && live(&b, &c.id)).then_some(())
    });
    let route = format!("{},{}", b.id, c.id);
    let paying = a.cli_in_background(&["pay", "--route", &route, &r_hash, "2000000"]);
    wait_for_blocking(
        "B killed at its crash point",
        Duration::from_secs(60),
        || b.exited().then_some(()),
    );
    b.set_env("POTLUCK_TEST_CRASH_AT", None);
    b.restart();

    let answer = paying.join().unwrap();
    assert!(
        answer.status.success(),
        "pay --route: {}",
        String::from_utf8_lossy(&answer.stderr)
    );
    let a1 = settled_balance(&a, &b.id);
    let c1 = settled_balance(&c, &b.id);
    let paid = c.cli(&["listinvoices"])["invoices"][0]["status"] == "paid";
    let forwards = wait_for_blocking("B's forward ended", Duration::from_secs(60), || {
        let listed = b.cli(&["listforwards"]);
        (listed["in_flight"] == 0).then_some(listed)
    });
    (paid, a0 - a1, c1 - c0, forwards)
}

#[test]
fn the_hop_killed_between_receiving_r_and_fulfilling_upstream_completes_the_payment() {
    let (paid, a_paid, c_got, forwards) = pay_through_a_dying_hop("outcome_stored");
    assert!(paid, "C's invoice paid");
    assert_eq!(
        a_paid,
        AMOUNT_MSAT + FEE_MSAT,
        "A pays the amount and B's fee, once"
    );
    assert_eq!(c_got, AMOUNT_MSAT);
    assert_eq!(forwards["forwards"][0]["state"], "fulfilled", "{forwards}");
    assert_eq!(forwards["fees_earned_msat"], FEE_MSAT, "{forwards}");
}

#[test]
fn the_hop_killed_between_storing_the_forward_and_offering_it_fails_it_back_whole() {
    let (paid, a_paid, c_got, forwards) = pay_through_a_dying_hop("forward_stored");
    assert!(!paid, "C's invoice unpaid");
    assert_eq!((a_paid, c_got), (0, 0), "nothing moved");
    assert_eq!(forwards["forwards"][0]["state"], "failed", "{forwards}");
    assert_eq!(forwards["failed"], 1, "{forwards}");
}
