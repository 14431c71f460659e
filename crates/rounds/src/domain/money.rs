//! The money records the domain builds and the store keeps: outputs the service controls and the intent of a transaction written before its broadcast.

use bitcoin::Txid;

use crate::domain::round::{OutputOrigin, TransferKind};

/// An output the service's wallet controls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coin {
    /// Row id.
    pub id: i64,
    /// The transaction.
    pub txid: Txid,
    /// Output index.
    pub vout: i64,
    /// Value.
    pub amount_sats: i64,
    /// Owner user, for user outputs.
    pub user_id: Option<i64>,
    /// Owner round, for pot outputs.
    pub round_id: Option<i64>,
    /// `deposit`, `change`, `payout` or `pot`.
    pub origin: OutputOrigin,
    /// Height of the confirming block; `None` while unconfirmed.
    pub block_height: Option<i64>,
}

/// A new transaction of ours, written before it is broadcast.
#[derive(Debug, Clone)]
pub struct Intent {
    /// `bet`, `withdrawal` or `payout`.
    pub kind: TransferKind,
    /// The user paying (bet, withdrawal) or paid (payout).
    pub user_id: Option<i64>,
    /// Round of a bet or payout.
    pub round_id: Option<i64>,
    /// The transaction.
    pub txid: Txid,
    /// Signed transaction hex.
    pub raw_tx: String,
    /// Amount of the transfer.
    pub amount_sats: i64,
    /// Miner fee.
    pub fee_sats: i64,
    /// Payout commission.
    pub commission_sats: i64,
    /// Withdrawal destination.
    pub address: Option<String>,
    /// Outputs spent whole.
    pub inputs: Vec<i64>,
    /// New outputs we control: `(vout, amount, user_id, round_id, origin)`.
    pub outputs: Vec<NewOutput>,
}

/// An output of one of our transactions that the service controls.
#[derive(Debug, Clone)]
pub struct NewOutput {
    /// Index in the transaction.
    pub vout: i64,
    /// Value.
    pub amount_sats: i64,
    /// Owner user.
    pub user_id: Option<i64>,
    /// Owner round (pot).
    pub round_id: Option<i64>,
    /// `change`, `payout` or `pot`.
    pub origin: OutputOrigin,
}
