//! Building and signing the service's transactions: bets, withdrawals and payouts, from outputs the ledger says the service controls.
//!
//! Pure with respect to IO: these functions turn ledger rows and amounts
//! into signed transactions and the [`Intent`] rows that record them.

use std::str::FromStr as _;

use bitcoin::{Address, Amount, FeeRate, Network, OutPoint, ScriptBuf, TxOut};
use wallet::{BuildError, KeyPath, SpendError, SpendableOutput, Wallet};

use crate::domain::money::{Coin, Intent, NewOutput};
use crate::domain::round::{OutputOrigin, TransferKind};
use crate::domain::settings::{MAX_TX_INPUTS, P2WPKH_INPUT_VBYTES};

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
    /// The coins would cover the payment, but only in a transaction of more
    /// than [`MAX_TX_INPUTS`] inputs, which the network would not relay.
    #[error("the payment needs more than {max_inputs} coins; one transaction can pay at most {max_amount_sats}")]
    TooManyInputs {
        /// The most inputs one transaction spends.
        max_inputs: usize,
        /// The most one payment can take (the largest coins, less their fee).
        max_amount_sats: i64,
    },
    /// A payout whose commission and miner fee leave the winner less than
    /// the dust threshold of the winner's script: no transaction pays the
    /// winner, and one without them would give their share to the miner.
    #[error("the pot of {pot_sats} sats pays {commission_sats} sats of commission and {fee_sats} sats of miner fee, leaving the winner less than the dust threshold of {threshold_sats} sats")]
    ShareBelowDust {
        /// The pot outputs spent.
        pot_sats: i64,
        /// The commission to the fee address.
        commission_sats: i64,
        /// The miner fee at the current rate.
        fee_sats: i64,
        /// The dust threshold of the winner's script.
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
    let txid = o.txid;
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
    /// The sum of the payer's spendable coins not in `outputs` (a payment
    /// reads one transaction's worth): refusals name the whole balance.
    pub unread_sats: i64,
}

/// Spends the payer's outputs (in their order, as few as cover the amount
/// and fee, at most [`MAX_TX_INPUTS`]) whole: the amount to `to`, change
/// back to the payer.
///
/// # Errors
/// [`SpendFailure::Insufficient`], [`SpendFailure::Dust`],
/// [`SpendFailure::TooManyInputs`], wallet failures.
pub fn user_payment(wallet: &Wallet, p: UserPayment<'_>) -> Result<Signed, SpendFailure> {
    let amount = Amount::from_sat(u64::try_from(p.amount_sats).unwrap_or(0));
    let payment = TxOut {
        value: amount,
        script_pubkey: p.to.clone(),
    };
    let balance: i64 = p
        .outputs
        .iter()
        .map(|o| o.amount_sats)
        .sum::<i64>()
        .saturating_add(p.unread_sats);
    if p.outputs.is_empty() {
        return Err(SpendFailure::Insufficient {
            balance_sats: balance,
            needed_sats: p.amount_sats,
        });
    }
    // One transaction spends at most MAX_TX_INPUTS coins, the largest first.
    let usable = &p.outputs[..p.outputs.len().min(MAX_TX_INPUTS)];
    let inputs = match pay_from_fewest_coins(wallet, &p, usable, &payment, balance)? {
        Ok(signed) => return Ok(signed),
        Err(inputs) => inputs,
    };
    Err(why_unpayable(&p, &inputs, &payment, balance))
}

/// What a failed build of a user payment tells the user.
fn refusal(e: SpendError, balance_sats: i64, amount_sats: i64) -> SpendFailure {
    match e {
        SpendError::Build(BuildError::InsufficientFunds { needed, .. }) => {
            SpendFailure::Insufficient {
                balance_sats,
                needed_sats: sats(needed).max(amount_sats),
            }
        }
        SpendError::Build(BuildError::DustOutput {
            value, threshold, ..
        }) => SpendFailure::Dust {
            amount_sats: sats(value),
            threshold_sats: sats(threshold),
        },
        e => SpendFailure::Wallet(e.to_string()),
    }
}

/// The payment signed over the fewest of `usable` (largest first) that pay
/// it (`Ok(Ok(signed))`), or every input of `usable` when none does
/// (`Ok(Err(inputs))`).
fn pay_from_fewest_coins(
    wallet: &Wallet,
    p: &UserPayment<'_>,
    usable: &[Coin],
    payment: &TxOut,
    balance: i64,
) -> Result<Result<Signed, Vec<SpendableOutput>>, SpendFailure> {
    let rate = fee_rate(p.fee_rate_sat_vb);
    let input_fee = P2WPKH_INPUT_VBYTES.saturating_mul(p.fee_rate_sat_vb.max(1));
    let mut inputs = Vec::with_capacity(usable.len());
    let mut covered: i64 = 0;
    for o in usable {
        inputs.push(spendable(o, p.path, p.script)?);
        covered = covered.saturating_add(o.amount_sats);
        // Each input adds at least its own 68 vB of fee: coins that do not
        // cover the amount plus that cannot pay, and building (the whole
        // transaction, every time) would only say so. Trying every prefix
        // made a payment from many small coins cost quadratic time.
        let inputs_fee = input_fee.saturating_mul(i64::try_from(inputs.len()).unwrap_or(i64::MAX));
        if covered < p.amount_sats.saturating_add(inputs_fee) {
            continue;
        }
        match build_signed(
            wallet,
            &inputs,
            std::slice::from_ref(payment),
            p.script,
            rate,
            p.tip_height,
        ) {
            Ok(built) => {
                return Ok(Ok(signed_payment(
                    built,
                    PaymentRecord {
                        user_id: p.user_id,
                        amount_sats: p.amount_sats,
                        kind: p.kind,
                        round_id: p.round_id,
                        address: p.address.clone(),
                        inputs: usable[..inputs.len()].iter().map(|o| o.id).collect(),
                    },
                )))
            }
            Err(SpendError::Build(BuildError::InsufficientFunds { .. })) => {}
            Err(e) => return Err(refusal(e, balance, p.amount_sats)),
        }
    }
    Ok(Err(inputs))
}

/// Why a payment that `inputs` (every usable coin) could not pay is refused.
fn why_unpayable(
    p: &UserPayment<'_>,
    inputs: &[SpendableOutput],
    payment: &TxOut,
    balance: i64,
) -> SpendFailure {
    let rate = fee_rate(p.fee_rate_sat_vb);
    // Say what it lacks, as a build of all the coins says it (unsigned;
    // nothing was built when the sum never covered the amount).
    let mut all = inputs.to_vec();
    for o in &p.outputs[inputs.len()..] {
        match spendable(o, p.path, p.script) {
            Ok(s) => all.push(s),
            Err(e) => return e,
        }
    }
    if let Err(e) =
        wallet::build_transaction(&all, std::slice::from_ref(payment), Some(p.script), rate)
    {
        // Coins that were not read may cover what the read ones lack: then
        // it is again a matter of one transaction's size.
        let unread_cover = matches!(&e, BuildError::InsufficientFunds { needed, .. }
            if p.unread_sats > 0 && balance >= sats(*needed));
        if !unread_cover {
            return refusal(SpendError::Build(e), balance, p.amount_sats);
        }
    }
    // The whole balance would pay it, but not in one transaction: the most
    // one payment can take is what the largest coins leave after their fee,
    // paid without change.
    let max = wallet::build_transaction(inputs, &[], Some(p.to), rate)
        .ok()
        .and_then(|b| b.change)
        .map_or(0, |(_, v)| sats(v));
    SpendFailure::TooManyInputs {
        max_inputs: MAX_TX_INPUTS,
        max_amount_sats: max,
    }
}

/// What a user payment records beside its transaction.
struct PaymentRecord {
    user_id: i64,
    amount_sats: i64,
    kind: TransferKind,
    round_id: Option<i64>,
    address: Option<String>,
    inputs: Vec<i64>,
}

/// A built user payment with its ledger record: a bet's pot output is
/// output 0; the change, if any, is the payer's.
fn signed_payment(built: wallet::BuiltTransaction, r: PaymentRecord) -> Signed {
    let txid = built.tx.compute_txid();
    let mut new_outputs = Vec::new();
    if let Some(round) = r.round_id {
        new_outputs.push(NewOutput {
            vout: 0,
            amount_sats: r.amount_sats,
            user_id: None,
            round_id: Some(round),
            origin: OutputOrigin::Pot,
        });
    }
    if let Some((vout, value)) = built.change {
        new_outputs.push(NewOutput {
            vout: i64::from(vout),
            amount_sats: sats(value),
            user_id: Some(r.user_id),
            round_id: None,
            origin: OutputOrigin::Change,
        });
    }
    let intent = Intent {
        kind: r.kind,
        user_id: Some(r.user_id),
        round_id: r.round_id,
        txid,
        raw_tx: bitcoin::consensus::encode::serialize_hex(&built.tx),
        amount_sats: r.amount_sats,
        fee_sats: sats(built.fee),
        commission_sats: 0,
        address: r.address,
        inputs: r.inputs,
        outputs: new_outputs,
    };
    Signed {
        change: built.change.map(|(v, a)| (v, sats(a))),
        tx: built.tx,
        intent,
    }
}

/// A round's payout to build and sign.
#[derive(Debug, Clone, Copy)]
pub struct PayoutRequest<'a> {
    /// The round.
    pub round_id: i64,
    /// Its pot outputs, all spent.
    pub pot: &'a [Coin],
    /// The fee address's script (the commission).
    pub fee_script: &'a ScriptBuf,
    /// The commission.
    pub commission_sats: i64,
    /// The winner's script.
    pub winner_script: &'a ScriptBuf,
    /// The winner.
    pub winner_user_id: i64,
    /// The miner fee rate.
    pub fee_rate_sat_vb: i64,
    /// As in [`UserPayment`].
    pub tip_height: Option<u32>,
}

/// The payout of a round: every pot output in; `commission` to the fee
/// address (folded into the winner's share when it would be dust); the rest
/// minus the miner fee to the winner, whatever that rest is as long as it is
/// not dust. `tip_height` as in [`UserPayment`].
///
/// # Errors
/// Wallet failures, or [`SpendFailure::ShareBelowDust`] when the commission
/// and the miner fee leave the winner less than the dust threshold of their
/// script.
pub fn payout(wallet: &Wallet, req: &PayoutRequest<'_>) -> Result<Signed, SpendFailure> {
    let PayoutRequest {
        round_id,
        pot,
        fee_script,
        commission_sats,
        winner_script,
        fee_rate_sat_vb,
        tip_height,
        ..
    } = *req;
    if pot.len() > MAX_TX_INPUTS {
        // Only a round that took its bets before rounds were capped at
        // MAX_ROUND_BETS: say why rather than sign what no node relays.
        return Err(SpendFailure::Wallet(format!(
            "a payout of {} pot outputs would be heavier than a standard transaction (at most {MAX_TX_INPUTS} inputs)",
            pot.len()
        )));
    }
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
    let rate = fee_rate(fee_rate_sat_vb);
    let share = winner_share(round_id, &inputs, &payments, winner_script, rate)?;
    let winner_vout = payments.len();
    payments.push(TxOut {
        value: share,
        script_pubkey: winner_script.clone(),
    });
    let built = build_signed_exact(wallet, &inputs, &payments, rate, tip_height)
        .map_err(|e| SpendFailure::Wallet(e.to_string()))?;
    signed_payout(req, built, winner_vout, sats(share), commission_paid)
}

/// The winner's share of the pot `inputs` after `payments` (the commission,
/// if paid) and the miner fee.
///
/// The share is a payment, not change: the wallet drops change worth less
/// than it costs to spend later (`min_change`) to the miner, which here
/// handed the winner's money to the miner while the commission was paid in
/// full. It is sized with the winner's output at its dust threshold (an
/// output's size does not depend on its value) and then paid exactly.
fn winner_share(
    round_id: i64,
    inputs: &[SpendableOutput],
    payments: &[TxOut],
    winner_script: &ScriptBuf,
    rate: FeeRate,
) -> Result<Amount, SpendFailure> {
    let commission_out = payments.iter().map(|p| p.value).sum::<Amount>();
    let threshold = wallet::dust_threshold(winner_script);
    let mut sized = payments.to_vec();
    sized.push(TxOut {
        value: threshold,
        script_pubkey: winner_script.clone(),
    });
    let too_small = |pot_sats: Amount, fee: Amount| SpendFailure::ShareBelowDust {
        pot_sats: sats(pot_sats),
        commission_sats: sats(commission_out),
        fee_sats: sats(fee),
        threshold_sats: sats(threshold),
    };
    let available = inputs
        .iter()
        .try_fold(Amount::ZERO, |acc, i| acc.checked_add(i.txout.value))
        .ok_or_else(|| SpendFailure::Corrupt(format!("round {round_id}: the pot overflows")))?;
    let fee = match wallet::build_transaction(inputs, &sized, None, rate) {
        // A fee beyond all money leaves no share: refused below.
        Ok(b) => rate.fee_vb(b.vsize).unwrap_or(Amount::MAX_MONEY),
        Err(BuildError::InsufficientFunds { needed, .. }) => {
            let fee = needed
                .checked_sub(commission_out + threshold)
                .unwrap_or(Amount::ZERO);
            return Err(too_small(available, fee));
        }
        Err(e) => return Err(SpendFailure::Wallet(e.to_string())),
    };
    available
        .checked_sub(commission_out)
        .and_then(|a| a.checked_sub(fee))
        .filter(|share| *share >= threshold)
        .ok_or_else(|| too_small(available, fee))
}

/// The signed payout of `req` with the intent the store writes before it is
/// broadcast: the winner's output at `winner_vout` is the service's own.
fn signed_payout(
    req: &PayoutRequest<'_>,
    built: wallet::BuiltTransaction,
    winner_vout: usize,
    share_sats: i64,
    commission_paid: i64,
) -> Result<Signed, SpendFailure> {
    let txid = built.tx.compute_txid();
    let vout = u32::try_from(winner_vout)
        .map_err(|_| SpendFailure::Corrupt(format!("winner vout {winner_vout}")))?;
    let outputs = vec![NewOutput {
        vout: i64::from(vout),
        amount_sats: share_sats,
        user_id: Some(req.winner_user_id),
        round_id: None,
        origin: OutputOrigin::Payout,
    }];
    let intent = Intent {
        kind: TransferKind::Payout,
        user_id: Some(req.winner_user_id),
        round_id: Some(req.round_id),
        txid,
        raw_tx: bitcoin::consensus::encode::serialize_hex(&built.tx),
        amount_sats: share_sats,
        fee_sats: sats(built.fee),
        commission_sats: commission_paid,
        address: None,
        inputs: req.pot.iter().map(|o| o.id).collect(),
        outputs,
    };
    Ok(Signed {
        tx: built.tx,
        intent,
        change: Some((vout, share_sats)),
    })
}

/// Builds and signs `payments` without change: every satoshi not paid is the fee.
fn build_signed_exact(
    wallet: &Wallet,
    inputs: &[SpendableOutput],
    payments: &[TxOut],
    rate: FeeRate,
    tip_height: Option<u32>,
) -> Result<wallet::BuiltTransaction, SpendError> {
    match tip_height {
        Some(h) => wallet.build_signed_at(inputs, payments, None, rate, h),
        None => wallet.build_signed(inputs, payments, None, rate),
    }
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

#[cfg(test)]
mod tests {
    // Test code: a failed unwrap is the test failing, with its message.
    #![allow(clippy::unwrap_used)]

    use bitcoin::Txid;

    use super::*;
    use crate::domain::settings::MAX_ROUND_BETS;

    fn wallet() -> Wallet {
        Wallet::from_seed(&[7u8; 32], Network::Regtest).unwrap()
    }

    /// `n` coins of `sats` each, of the user at index 0.
    fn coins(n: usize, sats: i64) -> Vec<Coin> {
        (0..n)
            .map(|i| Coin {
                id: i64::try_from(i).unwrap(),
                txid: Txid::from_str(&format!("{:064x}", i + 1)).unwrap(),
                vout: 0,
                amount_sats: sats,
                user_id: Some(1),
                round_id: None,
                origin: OutputOrigin::Deposit,
                block_height: Some(1),
            })
            .collect()
    }

    /// The longest standard output script (P2WSH, P2TR: 34 bytes).
    fn long_script() -> ScriptBuf {
        use bitcoin::hashes::Hash as _;
        ScriptBuf::new_p2wsh(&bitcoin::WScriptHash::from_byte_array([1; 32]))
    }

    #[test]
    fn a_full_round_pays_out_in_one_standard_transaction() {
        assert_eq!(MAX_ROUND_BETS, i64::try_from(MAX_TX_INPUTS).unwrap());
        let w = wallet();
        let pot: Vec<Coin> = coins(MAX_TX_INPUTS, 1_000)
            .into_iter()
            .map(|c| Coin {
                user_id: None,
                round_id: Some(9),
                origin: OutputOrigin::Pot,
                ..c
            })
            .collect();
        let signed = payout(
            &w,
            &PayoutRequest {
                round_id: 9,
                pot: &pot,
                fee_script: &long_script(),
                commission_sats: 420_000,
                winner_script: &long_script(),
                winner_user_id: 1,
                fee_rate_sat_vb: 2,
                tip_height: Some(100),
            },
        )
        .unwrap();
        assert_eq!(signed.tx.input.len(), MAX_TX_INPUTS);
        // Core's MAX_STANDARD_TX_WEIGHT.
        assert!(
            signed.tx.weight().to_wu() <= 400_000,
            "{}",
            signed.tx.weight()
        );
        let too_many = coins(MAX_TX_INPUTS + 1, 1_000);
        assert!(matches!(
            payout(
                &w,
                &PayoutRequest {
                    round_id: 9,
                    pot: &too_many,
                    fee_script: &long_script(),
                    commission_sats: 420_000,
                    winner_script: &long_script(),
                    winner_user_id: 1,
                    fee_rate_sat_vb: 2,
                    tip_height: None
                }
            ),
            Err(SpendFailure::Wallet(_))
        ));
    }

    /// Pot outputs of round 9 with these values.
    fn pot_of(amounts: &[i64]) -> Vec<Coin> {
        amounts
            .iter()
            .enumerate()
            .map(|(i, a)| Coin {
                id: i64::try_from(i).unwrap(),
                txid: Txid::from_str(&format!("{:064x}", i + 1)).unwrap(),
                vout: 0,
                amount_sats: *a,
                user_id: None,
                round_id: Some(9),
                origin: OutputOrigin::Pot,
                block_height: Some(1),
            })
            .collect()
    }

    /// A winning share above dust but below what the wallet keeps as change
    /// is paid to the winner, to the satoshi; less than dust is refused,
    /// never signed away to the miner with the commission paid.
    #[test]
    fn a_payout_pays_any_share_above_dust_and_refuses_less() {
        let w = wallet();
        let (_, winner) = user_key(&w, 1).unwrap();
        let (_, fee_script) = user_key(&w, 2).unwrap();
        let rate = FeeRate::from_sat_per_vb(10).unwrap();
        let signed = payout(
            &w,
            &PayoutRequest {
                round_id: 9,
                pot: &pot_of(&[2_000, 2_000]),
                fee_script: &fee_script,
                commission_sats: 1_200,
                winner_script: &winner,
                winner_user_id: 1,
                fee_rate_sat_vb: 10,
                tip_height: Some(100),
            },
        )
        .unwrap();
        let (vout, share) = signed.change.unwrap();
        assert_eq!(vout, 1);
        assert_eq!(signed.tx.output.len(), 2);
        assert_eq!(signed.tx.output[1].script_pubkey, winner);
        assert_eq!(sats(signed.tx.output[1].value), share);
        assert_eq!(sats(signed.tx.output[0].value), 1_200);
        assert_eq!(share + 1_200 + signed.intent.fee_sats, 4_000);
        assert_eq!(signed.intent.amount_sats, share);
        assert_eq!(signed.intent.outputs[0].amount_sats, share);
        assert!(share < sats(wallet::min_change(&winner, rate)), "{share}");
        assert!(share >= 294, "{share}");
        // The fee is the rate's for the transaction's size, no more.
        assert!(signed.intent.fee_sats <= 10 * i64::try_from(signed.tx.vsize() + 1).unwrap());

        let refused = payout(
            &w,
            &PayoutRequest {
                round_id: 9,
                pot: &pot_of(&[1_400, 1_400]),
                fee_script: &fee_script,
                commission_sats: 840,
                winner_script: &winner,
                winner_user_id: 1,
                fee_rate_sat_vb: 10,
                tip_height: None,
            },
        );
        assert!(
            matches!(
                refused,
                Err(SpendFailure::ShareBelowDust {
                    pot_sats: 2_800,
                    commission_sats: 840,
                    threshold_sats: 294,
                    ..
                })
            ),
            "{refused:?}"
        );

        // A refund (no commission) below the change minimum is paid too.
        let rate = FeeRate::from_sat_per_vb(4).unwrap();
        let refund = payout(
            &w,
            &PayoutRequest {
                round_id: 9,
                pot: &pot_of(&[800]),
                fee_script: &fee_script,
                commission_sats: 0,
                winner_script: &winner,
                winner_user_id: 1,
                fee_rate_sat_vb: 4,
                tip_height: None,
            },
        )
        .unwrap();
        let (vout, share) = refund.change.unwrap();
        assert_eq!((vout, refund.tx.output.len()), (0, 1));
        assert_eq!(share + refund.intent.fee_sats, 800);
        assert!(
            share >= 294 && share < sats(wallet::min_change(&winner, rate)),
            "{share}"
        );
    }

    fn pay(w: &Wallet, outputs: &[Coin], amount_sats: i64) -> Result<Signed, SpendFailure> {
        pay_read(w, outputs, 0, amount_sats)
    }

    /// `pay` when the payer holds `unread_sats` more in coins not read.
    fn pay_read(
        w: &Wallet,
        outputs: &[Coin],
        unread_sats: i64,
        amount_sats: i64,
    ) -> Result<Signed, SpendFailure> {
        let (path, script) = user_key(w, 0).unwrap();
        user_payment(
            w,
            UserPayment {
                user_id: 1,
                path,
                script: &script,
                outputs,
                to: &long_script(),
                amount_sats,
                fee_rate_sat_vb: 2,
                kind: TransferKind::Withdrawal,
                round_id: None,
                address: None,
                tip_height: None,
                unread_sats,
            },
        )
    }

    /// The fewest largest coins that pay; never more than one transaction
    /// holds, and what the refusal names as the most is payable.
    #[test]
    fn a_payment_takes_the_fewest_coins_and_at_most_a_transaction_of_them() {
        let w = wallet();
        let many = coins(MAX_TX_INPUTS + 80, 3_000);
        let paid = pay(&w, &many, 10_000).unwrap();
        assert_eq!(paid.intent.inputs, vec![0, 1, 2, 3]);
        // 1,475 coins would pay it: more than one transaction holds.
        let Err(SpendFailure::TooManyInputs {
            max_inputs,
            max_amount_sats,
        }) = pay(&w, &many, 4_225_000)
        else {
            panic!("not refused for its inputs");
        };
        assert_eq!(max_inputs, MAX_TX_INPUTS);
        let paid = pay(&w, &many, max_amount_sats).unwrap();
        assert_eq!(paid.tx.input.len(), MAX_TX_INPUTS);
        assert!(pay(&w, &many, max_amount_sats + 1).is_err());
        // More than the whole balance pays is short of funds, as before,
        // with what it would need.
        let Err(SpendFailure::Insufficient {
            balance_sats,
            needed_sats,
        }) = pay(&w, &coins(3, 3_000), 9_000)
        else {
            panic!("not refused for its funds");
        };
        assert_eq!(balance_sats, 9_000);
        assert!(needed_sats > 9_000, "{needed_sats}");
        assert!(matches!(
            pay(&w, &[], 1_000),
            Err(SpendFailure::Insufficient {
                balance_sats: 0,
                needed_sats: 1_000
            })
        ));
        assert!(matches!(
            pay(&w, &coins(3, 3_000), 100),
            Err(SpendFailure::Dust { .. })
        ));
    }

    /// A payment reads one transaction's worth of coins and one more; the
    /// coins it did not read still count in its refusal: covering the
    /// amount makes it `too_many_inputs`, not covering it names the whole
    /// balance.
    #[test]
    fn coins_not_read_count_in_the_refusal() {
        let w = wallet();
        let read = coins(MAX_TX_INPUTS + 1, 3_000);
        let all_read = 3_000 * (MAX_TX_INPUTS as i64 + 1);
        assert!(matches!(
            pay_read(&w, &read, 1_000_000, 5_000_000),
            Err(SpendFailure::TooManyInputs { .. })
        ));
        let Err(SpendFailure::Insufficient { balance_sats, .. }) =
            pay_read(&w, &read, 1_000, 5_000_000)
        else {
            panic!("not refused for its funds");
        };
        assert_eq!(balance_sats, all_read + 1_000);
    }
}
