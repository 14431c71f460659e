//! A transfer as its owner reads it back: the transaction typed, its progress derived from its stored status.

use bitcoin::Txid;

use crate::domain::round::{TransferKind, TransferProgress, TransferStatus};

/// One deposit, bet, withdrawal or payout as the views read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// Id (pages go by it).
    pub id: i64,
    /// What the transfer is.
    pub kind: TransferKind,
    /// The round (bets, payouts).
    pub round_id: Option<i64>,
    /// The transaction.
    pub txid: Txid,
    /// Deposit value, bet or withdrawal amount, payout to the winner.
    pub amount_sats: i64,
    /// Miner fee of our own transactions.
    pub fee_sats: i64,
    /// Withdrawals: the destination.
    pub address: Option<String>,
    /// Stored status.
    pub status: TransferStatus,
    /// Height of the confirming block.
    pub block_height: Option<i64>,
    /// Unix seconds.
    pub created_at: i64,
    /// Deposits: confirmations consensus requires before it can be spent (coinbase: 100).
    pub min_confirmations: i64,
}

/// A withdrawal or payout waiting for its first confirmation, as the stuck list shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingForConfirmation {
    /// Its live version.
    pub transfer: Transfer,
    /// The synced tip when that version was first seen waiting.
    pub sent_height: Option<i64>,
    /// Versions written so far (1: never bumped).
    pub versions: i64,
}

impl Transfer {
    /// The progress of one of our own transactions as its owner sees it.
    pub fn own_progress(&self) -> TransferProgress {
        TransferProgress::of_own(self.status, self.block_height.is_some())
    }
}
