//! The books' totals behind the conservation check (GET /admin/ledger): what the store sums, as the operator reads it.

use bitcoin::Txid;

/// Sums for the conservation check (GET /admin/ledger).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct LedgerTotals {
    /// Every deposit seen and not reversed.
    pub deposits_sats: i64,
    /// Unspent outputs owned by users (confirmed or not).
    pub users_unspent_sats: i64,
    /// Unspent pot outputs (rounds not yet paid).
    pub pots_in_flight_sats: i64,
    /// Commissions of payouts written (signed, broadcast or waiting for a retry).
    pub commission_paid_sats: i64,
    /// Withdrawals written and not failed.
    pub withdrawn_sats: i64,
    /// Miner fees of our transactions written and not failed.
    pub miner_fees_sats: i64,
    /// Money the ledger had recorded but the chain took back (ledger
    /// corrections): deposits = users' unspent + pots + commission +
    /// withdrawals + miner fees + corrections.
    pub corrections_sats: i64,
    /// The ledger corrections, oldest first.
    pub corrections: Vec<CorrectionView>,
    /// What users owe after deposits they spent were reversed by the chain:
    /// deposits = users' unspent + pots + commission + withdrawals + miner
    /// fees + corrections − debts.
    pub debts_sats: i64,
    /// Every unspent output the service holds.
    pub unspent: Vec<UnspentView>,
    /// Height of the last block the watcher processed.
    pub synced_height: i64,
}

/// One ledger correction in [`LedgerTotals`]: an output the ledger held
/// that no longer exists on the chain.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct CorrectionView {
    /// Unix seconds.
    pub at: i64,
    /// The round whose payout was rebuilt without it, if any.
    pub round_id: Option<i64>,
    /// The output's transaction.
    #[serde(with = "crate::domain::txid_json")]
    #[schema(value_type = String)]
    pub txid: Txid,
    /// The output's index.
    pub vout: i64,
    /// Its value, taken out of the books.
    pub amount_sats: i64,
    /// Why.
    pub reason: String,
}

/// One unspent output in [`LedgerTotals`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct UnspentView {
    /// Txid.
    #[serde(with = "crate::domain::txid_json")]
    #[schema(value_type = String)]
    pub txid: Txid,
    /// Index.
    pub vout: i64,
    /// Value.
    pub amount_sats: i64,
}
