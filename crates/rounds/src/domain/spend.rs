//! Building and signing the service's transactions: bets, withdrawals and payouts, from outputs the ledger says the service controls.
//!
//! Pure with respect to IO: these functions turn ledger rows and amounts
//! into signed transactions and the [`Intent`] rows that record them.

use std::str::FromStr as _;

use bitcoin::{Address, Amount, FeeRate, Network, OutPoint, ScriptBuf, TxOut, Txid};
use wallet::{BuildError, KeyPath, SpendError, SpendableOutput, Wallet};

use crate::domain::money::{Coin, Intent, NewOutput};
use crate::domain::round::{OutputOrigin, TransferKind};

/// Derivation branch of round pot addresses (index = round id); users are
/// on branch 0, the default fee address on branch 2.
pub const POT_BRANCH: u32 = 3;

/// Why a transaction could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpendFailure {
    /// The outputs do not cover amount plus fee.
    #[error("insufficient funds: balance {balance_sats}, need {needed_sats}")]
    Insufficient {
        /// Sum of spendable outputs.
        balance_sats: i64,
        /// Amount plus the miner fee of spending every output.
        needed_sats: i64,
    },
    /// A payment below the dust threshold.
    #[error("amount {amount_sats} is dust (threshold {threshold_sats})")]
    Dust {
        /// The payment.
        amount_sats: i64,
        /// The threshold of its script.
        threshold_sats: i64,
    },
    /// A stored row is unusable (bad txid, negative amount, …).
    #[error("corrupt ledger row: {0}")]
    Corrupt(String),
    /// Signing or derivation failed.
    #[error("wallet: {0}")]
    Wallet(String),
}

/// A signed transaction with its ledger record.
#[derive(Debug, Clone)]
pub struct Signed {
    /// The transaction.
    pub tx: bitcoin::Transaction,
    /// The row to write before broadcasting.
    pub intent: Intent,
    /// Change (bets, withdrawals) or the winner's output (payouts): vout and value.
    pub change: Option<(u32, i64)>,
}

fn spendable(o: &Coin, path: KeyPath, script: &ScriptBuf) -> Result<SpendableOutput, SpendFailure> {
    let txid = Txid::from_str(&o.txid)
        .map_err(|e| SpendFailure::Corrupt(format!("txid {}: {e}", o.txid)))?;
    let vout =
        u32::try_from(o.vout).map_err(|_| SpendFailure::Corrupt(format!("vout {}", o.vout)))?;
    let value = u64::try_from(o.amount_sats)
        .map_err(|_| SpendFailure::Corrupt(format!("amount {}", o.amount_sats)))?;
    Ok(SpendableOutput {
        outpoint: OutPoint { txid, vout },
        txout: TxOut {
            value: Amount::from_sat(value),
            script_pubkey: script.clone(),
        },
        path,
    })
}

fn sats(a: Amount) -> i64 {
    i64::try_from(a.to_sat()).unwrap_or(i64::MAX)
}

fn fee_rate(sat_vb: i64) -> FeeRate {
    FeeRate::from_sat_per_vb(u64::try_from(sat_vb).unwrap_or(1).max(1))
        .unwrap_or(FeeRate::BROADCAST_MIN)
}

/// The address of a user's derivation index.
///
/// # Errors
/// [`SpendFailure::Wallet`] for an index out of range.
pub fn user_key(
    wallet: &Wallet,
    derivation_index: i64,
) -> Result<(KeyPath, ScriptBuf), SpendFailure> {
    let path = user_key_path(derivation_index)?;
    let key = wallet
        .derive(path)
        .map_err(|e| SpendFailure::Wallet(e.to_string()))?;
    Ok((path, key.address.script_pubkey()))
}

/// The key path of the user with `derivation_index`.
///
/// # Errors
/// [`SpendFailure::Corrupt`] for an index out of range.
pub fn user_key_path(derivation_index: i64) -> Result<KeyPath, SpendFailure> {
    let index = u32::try_from(derivation_index)
        .map_err(|_| SpendFailure::Corrupt(format!("index {derivation_index}")))?;
    Ok(KeyPath::receive(index))
}

/// The key path of round `round_id`'s pot.
///
/// # Errors
/// [`SpendFailure::Corrupt`] for a round id out of range.
pub fn pot_key_path(round_id: i64) -> Result<KeyPath, SpendFailure> {
    let index =
        u32::try_from(round_id).map_err(|_| SpendFailure::Corrupt(format!("round {round_id}")))?;
    Ok(KeyPath {
        branch: POT_BRANCH,
        index,
    })
}

/// The pot key of a round.
///
/// # Errors
/// [`SpendFailure::Wallet`] for a round id out of range.
pub fn pot_key(wallet: &Wallet, round_id: i64) -> Result<(KeyPath, ScriptBuf), SpendFailure> {
    let path = pot_key_path(round_id)?;
    let key = wallet
        .derive(path)
        .map_err(|e| SpendFailure::Wallet(e.to_string()))?;
    Ok((path, key.address.script_pubkey()))
}

/// Parses an address already validated for `network`.
///
/// # Errors
/// [`SpendFailure::Corrupt`] when it does not parse for `network`.
pub fn script_of(address: &str, network: Network) -> Result<ScriptBuf, SpendFailure> {
    Address::from_str(address)
        .ok()
        .and_then(|a| a.require_network(network).ok())
        .map(|a| a.script_pubkey())
        .ok_or_else(|| SpendFailure::Corrupt(format!("address {address}")))
}

/// What a payment from a user's outputs spends and where it goes (see [`user_payment`]).
#[derive(Debug, Clone)]
pub struct UserPayment<'a> {
    /// The payer.
    pub user_id: i64,
    /// The payer's key path, derived once (see [`user_key`]).
    pub path: KeyPath,
    /// The payer's script: the inputs' and the change's.
    pub script: &'a ScriptBuf,
    /// The payer's spendable outputs, in the order they are tried (the store
    /// reads them largest first).
    pub outputs: &'a [Coin],
    /// Where `amount_sats` goes.
    pub to: &'a ScriptBuf,
    /// The amount paid to `to`.
    pub amount_sats: i64,
    /// The miner fee rate.
    pub fee_rate_sat_vb: i64,
    /// Bet or withdrawal, as recorded.
    pub kind: TransferKind,
    /// A bet's round: its payment becomes the round's pot output.
    pub round_id: Option<i64>,
    /// A withdrawal's address, as recorded.
    pub address: Option<String>,
    /// The last block processed: `nLockTime` is set to it, as Core's wallet
    /// does against fee sniping.
    pub tip_height: Option<u32>,
}

/// Spends the payer's outputs (in their order, as few as cover the amount
/// and fee) whole: the amount to `to`, change back to the payer.
///
/// # Errors
/// [`SpendFailure::Insufficient`], [`SpendFailure::Dust`], wallet failures.
pub fn user_payment(wallet: &Wallet, p: UserPayment<'_>) -> Result<Signed, SpendFailure> {
    let UserPayment {
        user_id,
        path,
        script,
        outputs,
        to,
        amount_sats,
        fee_rate_sat_vb,
        kind,
        round_id,
        address,
        tip_height,
    } = p;
    let amount = Amount::from_sat(u64::try_from(amount_sats).unwrap_or(0));
    let payment = TxOut {
        value: amount,
        script_pubkey: to.clone(),
    };
    let balance: i64 = outputs.iter().map(|o| o.amount_sats).sum();
    let rate = fee_rate(fee_rate_sat_vb);
    let mut inputs = Vec::new();
    let mut used = Vec::new();
    let mut last_needed = amount_sats;
    for o in outputs {
        inputs.push(spendable(o, path, script)?);
        used.push(o.id);
        match build_signed(
            wallet,
            &inputs,
            std::slice::from_ref(&payment),
            script,
            rate,
            tip_height,
        ) {
            Ok(built) => {
                let txid = built.tx.compute_txid().to_string();
                let mut new_outputs = Vec::new();
                if let Some(r) = round_id {
                    new_outputs.push(NewOutput {
                        vout: 0,
                        amount_sats,
                        user_id: None,
                        round_id: Some(r),
                        origin: OutputOrigin::Pot,
                    });
                }
                if let Some((vout, value)) = built.change {
                    new_outputs.push(NewOutput {
                        vout: i64::from(vout),
                        amount_sats: sats(value),
                        user_id: Some(user_id),
                        round_id: None,
                        origin: OutputOrigin::Change,
                    });
                }
                let intent = Intent {
                    kind,
                    user_id: Some(user_id),
                    round_id,
                    txid,
                    raw_tx: bitcoin::consensus::encode::serialize_hex(&built.tx),
                    amount_sats,
                    fee_sats: sats(built.fee),
                    commission_sats: 0,
                    address,
                    inputs: used,
                    outputs: new_outputs,
                };
                return Ok(Signed {
                    change: built.change.map(|(v, a)| (v, sats(a))),
                    tx: built.tx,
                    intent,
                });
            }
            Err(SpendError::Build(BuildError::InsufficientFunds { needed, .. })) => {
                last_needed = sats(needed);
            }
            Err(SpendError::Build(BuildError::DustOutput {
                value, threshold, ..
            })) => {
                return Err(SpendFailure::Dust {
                    amount_sats: sats(value),
                    threshold_sats: sats(threshold),
                })
            }
            Err(e) => return Err(SpendFailure::Wallet(e.to_string())),
        }
    }
    Err(SpendFailure::Insufficient {
        balance_sats: balance,
        needed_sats: last_needed.max(amount_sats),
    })
}

/// The payout of a round: every pot output in; `commission` to the fee
/// address (folded into the winner's share when it would be dust); the rest
/// minus the miner fee to the winner. `tip_height` as in [`UserPayment`].
///
/// # Errors
/// Wallet failures, or [`SpendFailure::Insufficient`] when the fee eats the pot.
#[allow(clippy::too_many_arguments)]
pub fn payout(
    wallet: &Wallet,
    round_id: i64,
    pot: &[Coin],
    fee_script: &ScriptBuf,
    commission_sats: i64,
    winner_script: &ScriptBuf,
    winner_user_id: i64,
    fee_rate_sat_vb: i64,
    tip_height: Option<u32>,
) -> Result<Signed, SpendFailure> {
    let (path, script) = pot_key(wallet, round_id)?;
    let inputs = pot
        .iter()
        .map(|o| spendable(o, path, &script))
        .collect::<Result<Vec<_>, _>>()?;
    let commission = Amount::from_sat(u64::try_from(commission_sats).unwrap_or(0));
    let mut payments = Vec::new();
    let mut commission_paid = 0;
    if commission > Amount::ZERO && commission >= wallet::dust_threshold(fee_script) {
        payments.push(TxOut {
            value: commission,
            script_pubkey: fee_script.clone(),
        });
        commission_paid = commission_sats;
    }
    let built = build_signed(
        wallet,
        &inputs,
        &payments,
        winner_script,
        fee_rate(fee_rate_sat_vb),
        tip_height,
    )
    .map_err(|e| match e {
        SpendError::Build(BuildError::InsufficientFunds { available, needed }) => {
            SpendFailure::Insufficient {
                balance_sats: sats(available),
                needed_sats: sats(needed),
            }
        }
        other => SpendFailure::Wallet(other.to_string()),
    })?;
    let txid = built.tx.compute_txid().to_string();
    let winner = built.change.map(|(v, a)| (v, sats(a)));
    let outputs = winner
        .map(|(vout, value)| NewOutput {
            vout: i64::from(vout),
            amount_sats: value,
            user_id: Some(winner_user_id),
            round_id: None,
            origin: OutputOrigin::Payout,
        })
        .into_iter()
        .collect();
    let intent = Intent {
        kind: TransferKind::Payout,
        user_id: Some(winner_user_id),
        round_id: Some(round_id),
        txid,
        raw_tx: bitcoin::consensus::encode::serialize_hex(&built.tx),
        amount_sats: winner.map_or(0, |w| w.1),
        fee_sats: sats(built.fee),
        commission_sats: commission_paid,
        address: None,
        inputs: pot.iter().map(|o| o.id).collect(),
        outputs,
    };
    Ok(Signed {
        tx: built.tx,
        intent,
        change: winner,
    })
}

/// Builds and signs, with anti-fee-sniping `nLockTime` when the tip is known.
fn build_signed(
    wallet: &Wallet,
    inputs: &[SpendableOutput],
    payments: &[TxOut],
    change: &ScriptBuf,
    rate: FeeRate,
    tip_height: Option<u32>,
) -> Result<wallet::BuiltTransaction, SpendError> {
    match tip_height {
        Some(h) => wallet.build_signed_at(inputs, payments, Some(change), rate, h),
        None => wallet.build_signed(inputs, payments, Some(change), rate),
    }
}
