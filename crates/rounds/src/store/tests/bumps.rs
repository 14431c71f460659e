//! Fee bumps in the store: whichever version of a bumped withdrawal or payout a block holds, the ledger debits and credits it once (each on SQLite and PostgreSQL).

use super::*;
use crate::store::bumps::BumpIntent;

both_backends!(
    bump_a_confirmed_replacement_debits_the_user_once,
    bump_the_old_version_confirming_after_the_bump_wins_once,
    bump_a_refused_replacement_gives_the_inputs_back_to_the_old_version,
    bump_a_payout_replacement_keeps_one_live_payout_per_round,
);

const OLD: &str = "8888888888888888888888888888888888888888888888888888888888888888";
const NEW: &str = "9999999999999999999999999999999999999999999999999999999999999999";

/// deposits = users' unspent + pots + commission + withdrawals + fees + corrections − debts.
async fn assert_balanced(s: &Store) -> crate::domain::ledger::LedgerTotals {
    let t = s.ledger_totals().await.unwrap();
    assert_eq!(
        t.deposits_sats,
        t.users_unspent_sats
            + t.pots_in_flight_sats
            + t.commission_paid_sats
            + t.withdrawn_sats
            + t.miner_fees_sats
            + t.corrections_sats
            - t.debts_sats,
        "{t:?}"
    );
    t
}

/// A broadcast 10,000-sat withdrawal `OLD` (fee 200, change 89,800) and its
/// replacement `NEW` at a fee of 1,000 (change 89,000), written.
async fn bumped_withdrawal(s: &Store) -> (i64, i64, i64) {
    let (user, out) = funded(s).await;
    let w = money::intent(TransferKind::Withdrawal, user, None, OLD, vec![out]);
    let old = s.record_withdrawal(&w).await.unwrap();
    s.mark_broadcast(old).await.unwrap();
    s.stamp_waiting(10).await.unwrap();
    let new = s
        .write_bump(&replacement_of(old, user, None, OriginOf::Change))
        .await
        .unwrap()
        .expect("the old version is live and waiting");
    (user, old, new)
}

enum OriginOf {
    Change,
    Payout,
}

fn replacement_of(old: i64, user: i64, round: Option<i64>, origin: OriginOf) -> BumpIntent {
    let (origin, amount_sats) = match origin {
        OriginOf::Change => (OutputOrigin::Change, 10_000),
        OriginOf::Payout => (OutputOrigin::Payout, 89_000),
    };
    BumpIntent {
        replaces: old,
        txid: NEW.parse().unwrap(),
        raw_tx: "00".into(),
        fee_sats: 1_000,
        amount_sats,
        outputs: vec![crate::domain::money::NewOutput {
            vout: 1,
            amount_sats: 89_000,
            user_id: Some(user),
            round_id: round,
            origin,
        }],
        sent_height: 10,
        actor: crate::domain::audit::AuditActor::Engine,
        fee_rate_sat_vb: 7,
    }
}

async fn status(s: &Store, id: i64) -> TransferStatus {
    s.transfer(id).await.unwrap().unwrap().status
}

async fn bump_a_confirmed_replacement_debits_the_user_once(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    let (user, old, new) = bumped_withdrawal(s).await;
    assert_eq!(status(s, old).await, TransferStatus::Superseded);
    assert_eq!(status(s, new).await, TransferStatus::Signed);
    // Pending: the replacement's change alone, not both versions'.
    assert_eq!(s.balances(user, 1).await.unwrap(), (0, 89_000, true));
    let t = assert_balanced(s).await;
    assert_eq!((t.withdrawn_sats, t.miner_fees_sats), (10_000, 1_000));
    // A second bump of the superseded version is refused.
    assert!(s
        .write_bump(&replacement_of(old, user, None, OriginOf::Change))
        .await
        .unwrap()
        .is_none());
    s.mark_broadcast(new).await.unwrap();
    let watched = s.unconfirmed_txids().await.unwrap();
    assert!(watched.contains(&OLD.parse().unwrap()) && watched.contains(&NEW.parse().unwrap()));
    s.connect_block(11, block(b'h', 11), &[NEW.parse().unwrap()], &[])
        .await
        .unwrap();
    assert_eq!(s.balances(user, 1).await.unwrap(), (89_000, 89_000, false));
    let t = assert_balanced(s).await;
    assert_eq!((t.withdrawn_sats, t.miner_fees_sats), (10_000, 1_000));
    let listed = s.user_transfers(user, 10, None).await.unwrap();
    let withdrawals: Vec<_> = listed
        .iter()
        .filter(|t| t.kind == TransferKind::Withdrawal)
        .collect();
    assert_eq!(withdrawals.len(), 1, "one withdrawal listed: {listed:?}");
    assert_eq!(withdrawals[0].txid, NEW);
    let audit = s.audit_page(10, None).await.unwrap();
    assert!(
        audit.iter().any(|e| e.event == "transfer_bumped"
            && e.details.replaced_txid.as_deref() == Some(OLD)
            && e.details.fee_sats == Some(1_000)),
        "{audit:?}"
    );
}

async fn bump_the_old_version_confirming_after_the_bump_wins_once(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    let (user, old, new) = bumped_withdrawal(s).await;
    s.mark_broadcast(new).await.unwrap();
    // The chain takes the old version after the bump went out.
    s.connect_block(11, block(b'h', 11), &[OLD.parse().unwrap()], &[])
        .await
        .unwrap();
    assert_eq!(status(s, old).await, TransferStatus::Broadcast);
    assert_eq!(status(s, new).await, TransferStatus::Superseded);
    assert_eq!(s.balances(user, 1).await.unwrap(), (89_800, 89_800, false));
    let t = assert_balanced(s).await;
    assert_eq!((t.withdrawn_sats, t.miner_fees_sats), (10_000, 200));
    assert_eq!(
        s.outputs_spent_by(&OLD.parse().unwrap())
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(s
        .outputs_spent_by(&NEW.parse().unwrap())
        .await
        .unwrap()
        .is_empty());
    // The same block again (another process) changes nothing.
    s.connect_block(11, block(b'h', 11), &[OLD.parse().unwrap()], &[])
        .await
        .unwrap();
    assert_eq!(s.balances(user, 1).await.unwrap(), (89_800, 89_800, false));
    // A reorganisation that mines the replacement instead moves the ledger once more.
    s.unwind_above(10).await.unwrap();
    s.connect_block(11, block(b'n', 11), &[NEW.parse().unwrap()], &[])
        .await
        .unwrap();
    assert_eq!(status(s, old).await, TransferStatus::Superseded);
    assert_eq!(status(s, new).await, TransferStatus::Broadcast);
    assert_eq!(s.balances(user, 1).await.unwrap(), (89_000, 89_000, false));
    let t = assert_balanced(s).await;
    assert_eq!((t.withdrawn_sats, t.miner_fees_sats), (10_000, 1_000));
}

async fn bump_a_refused_replacement_gives_the_inputs_back_to_the_old_version(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    let (user, old, new) = bumped_withdrawal(s).await;
    assert!(s.refuse_bump(new).await.unwrap());
    assert!(!s.refuse_bump(new).await.unwrap(), "once");
    assert_eq!(status(s, old).await, TransferStatus::Broadcast);
    assert_eq!(status(s, new).await, TransferStatus::Superseded);
    assert_eq!(
        s.outputs_spent_by(&OLD.parse().unwrap())
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(s.balances(user, 1).await.unwrap(), (0, 89_800, true));
    let t = assert_balanced(s).await;
    assert_eq!(t.miner_fees_sats, 200);
    // Not released to the user: the old version still spends the deposit.
    assert!(s.spendable_outputs(user, 1).await.unwrap().is_empty());
}

async fn bump_a_payout_replacement_keeps_one_live_payout_per_round(b: Backend) {
    let db = TestDb::new(b).await;
    let s = &db.store;
    let (user, out) = funded(s).await;
    // A payout spending the user's output stands in for one spending the pot.
    let round = s
        .ensure_round(crate::domain::time::unix_now())
        .await
        .unwrap();
    let mut p = money::intent(TransferKind::Payout, user, Some(round.id), OLD, vec![out]);
    // 100,000 in: 89,800 to the winner, 10,000 commission, 200 fee.
    p.amount_sats = 89_800;
    p.commission_sats = 10_000;
    p.outputs[0].origin = OutputOrigin::Payout;
    let mut tx = s.pool().begin().await.unwrap();
    let old = crate::store::ledger::insert_intent(&mut tx, &p)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    s.mark_broadcast(old).await.unwrap();
    let new = s
        .write_bump(&replacement_of(old, user, None, OriginOf::Payout))
        .await
        .unwrap()
        .expect("live");
    let detail = s.round_detail(round.id).await.unwrap().unwrap();
    assert_eq!(
        detail.payout.map(|t| t.id),
        Some(new),
        "the live version is the round's payout"
    );
    let t = assert_balanced(s).await;
    assert_eq!((t.commission_paid_sats, t.miner_fees_sats), (10_000, 1_000));
    s.mark_broadcast(new).await.unwrap();
    s.connect_block(11, block(b'h', 11), &[OLD.parse().unwrap()], &[])
        .await
        .unwrap();
    let detail = s.round_detail(round.id).await.unwrap().unwrap();
    assert_eq!(
        detail.payout.map(|t| (t.id, t.amount_sats)),
        Some((old, 89_800))
    );
    let t = assert_balanced(s).await;
    assert_eq!(t.miner_fees_sats, 200);
    assert_eq!(s.balances(user, 1).await.unwrap().0, 89_800);
}
