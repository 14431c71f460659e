//! Transaction building (whole outputs in, payments and change out, fee from a
//! sat/vB rate on the exact vsize) and segwit v0 P2WPKH signing.

use bitcoin::absolute::LockTime;
use bitcoin::ecdsa::Signature as EcdsaSignature;
use bitcoin::hashes::Hash as _;
use bitcoin::secp256k1::{All, Message, Secp256k1, SecretKey};
use bitcoin::sighash::{EcdsaSighashType, SighashCache};
use bitcoin::transaction::Version;
use bitcoin::{
    Amount, CompressedPublicKey, FeeRate, OutPoint, Script, ScriptBuf, Sequence, Transaction, TxIn,
    TxOut, Witness,
};

use crate::hd::{KeyPath, Wallet, WalletError};

/// An output the wallet owns and may spend whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendableOutput {
    /// Where the output is.
    pub outpoint: OutPoint,
    /// Its value and script (a P2WPKH of the key at `path`).
    pub txout: TxOut,
    /// The wallet key that controls it.
    pub path: KeyPath,
}

/// An unsigned transaction with the numbers the caller needs to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltTransaction {
    /// The transaction; inputs in the order given, payments then change.
    pub tx: Transaction,
    /// Miner fee: inputs − outputs.
    pub fee: Amount,
    /// Virtual size the fee was computed for (signatures at their maximum size).
    pub vsize: u64,
    /// Output index and value of the change output, if there is one.
    pub change: Option<(u32, Amount)>,
}

/// Why a transaction could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No inputs were given.
    #[error("no inputs to spend")]
    NoInputs,
    /// Neither a payment nor a change script: the money would all go to fees.
    #[error("no outputs: give at least one payment or a change script")]
    NoOutputs,
    /// A payment below the dust threshold of its script.
    #[error("output {index} of {value} is dust (threshold {threshold})")]
    DustOutput {
        /// Index among the payments.
        index: usize,
        /// The payment's value.
        value: Amount,
        /// The smallest value that script may carry.
        threshold: Amount,
    },
    /// Inputs do not cover payments plus fee.
    #[error("insufficient funds: have {available}, need {needed}")]
    InsufficientFunds {
        /// Sum of the inputs.
        available: Amount,
        /// Payments plus the fee without change.
        needed: Amount,
    },
    /// Amounts overflowed the 21M BTC range.
    #[error("amount overflow")]
    Overflow,
    /// Only change was asked for, and it is worth less than it would cost
    /// to create and spend: the transaction would have no outputs.
    #[error("nothing left to pay: change of at most {change} is below what it costs to spend")]
    NothingLeft {
        /// What would have been left for the change output.
        change: Amount,
    },
}

/// Why a transaction could not be signed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignError {
    /// The number of spendable outputs does not match the inputs.
    #[error("{outputs} spendable outputs for {inputs} inputs")]
    InputCount {
        /// Inputs of the transaction.
        inputs: usize,
        /// Spendable outputs given.
        outputs: usize,
    },
    /// Input `index` spends another outpoint than the one described.
    #[error("input {index} spends {found}, expected {expected}")]
    OutpointMismatch {
        /// Input index.
        index: usize,
        /// The outpoint described.
        expected: OutPoint,
        /// The outpoint in the transaction.
        found: OutPoint,
    },
    /// The key at the given path does not control the output's script.
    #[error("input {index}: key {path:?} does not control script {script}")]
    KeyMismatch {
        /// Input index.
        index: usize,
        /// Path that was derived.
        path: KeyPath,
        /// Script of the spent output.
        script: ScriptBuf,
    },
    /// Key derivation failed.
    #[error(transparent)]
    Wallet(#[from] WalletError),
    /// Sighash computation failed (index out of range, …).
    #[error("sighash: {0}")]
    Sighash(String),
}

/// The smallest value an output with `script` may carry under Bitcoin Core's
/// default dust relay fee (3 sat/vB): 294 sat for P2WPKH, 330 for P2WSH/P2TR,
/// 546 for P2PKH.
pub fn dust_threshold(script: &Script) -> Amount {
    script.minimal_non_dust()
}

/// Virtual size one P2WPKH input adds to a segwit transaction, rounded up:
/// 41 bytes of base data plus a 108-unit witness at its maximum (72-byte
/// signature, 33-byte key) = 272 weight units = 68 vB.
pub fn p2wpkh_input_vsize() -> u64 {
    68
}

/// The virtual size of `tx` once [`Wallet::sign`] has signed every input, at
/// the largest witness it writes: the price of a re-signed transaction, whose
/// signatures may come out a byte longer than its last version's.
pub fn signed_vsize(tx: &Transaction) -> u64 {
    let mut sized = tx.clone();
    for input in &mut sized.input {
        input.witness = max_p2wpkh_witness();
    }
    sized.vsize() as u64
}

/// Placeholder witness of the largest P2WPKH witness, for sizing.
fn max_p2wpkh_witness() -> Witness {
    let mut w = Witness::new();
    w.push([0u8; 72]);
    w.push([0u8; 33]);
    w
}

/// Builds an unsigned transaction spending every given output whole, with
/// `nLockTime` 0; see [`build_transaction_at`], which services use.
///
/// # Errors
/// See [`BuildError`].
pub fn build_transaction(
    inputs: &[SpendableOutput],
    payments: &[TxOut],
    change: Option<&Script>,
    fee_rate: FeeRate,
) -> Result<BuiltTransaction, BuildError> {
    build_transaction_at(inputs, payments, change, fee_rate, None)
}

/// What a change output must be worth to be kept at `fee_rate`: at least
/// dust, and more than it costs to create (its own bytes) and later spend
/// (a P2WPKH input). Less than that is worth more to the miner than to us,
/// so it goes to the fee, as Bitcoin Core's wallet does (`cost_of_change`).
pub fn min_change(script: &Script, fee_rate: FeeRate) -> Amount {
    let output_vsize = (8 + 1 + script.len()) as u64;
    let cost = fee_rate
        .fee_vb(output_vsize + p2wpkh_input_vsize())
        .unwrap_or(Amount::MAX_MONEY);
    cost.max(dust_threshold(script))
}

/// Builds an unsigned transaction spending every given output whole.
///
/// Payments come first in the given order; `change`, if any, receives
/// inputs − payments − fee as the last output, and is left out (its value
/// going to the fee) when it would be worth less than [`min_change`]. The
/// fee is `fee_rate` times the vsize of the transaction with maximal
/// signatures, so the signed transaction pays at least `fee_rate`.
///
/// With `tip_height`, `nLockTime` is set to it (anti-fee-sniping, as Core's
/// wallet does): the transaction is valid in the next block but not in a
/// re-mined current one, so a miner gains nothing by reorganising the tip
/// to take its fee. The inputs' sequence (`0xfffffffd`) enables the lock.
///
/// # Errors
/// See [`BuildError`]; a transaction is never built without outputs.
pub fn build_transaction_at(
    inputs: &[SpendableOutput],
    payments: &[TxOut],
    change: Option<&Script>,
    fee_rate: FeeRate,
    tip_height: Option<u32>,
) -> Result<BuiltTransaction, BuildError> {
    if inputs.is_empty() {
        return Err(BuildError::NoInputs);
    }
    if payments.is_empty() && change.is_none() {
        return Err(BuildError::NoOutputs);
    }
    for (index, p) in payments.iter().enumerate() {
        let threshold = dust_threshold(&p.script_pubkey);
        if p.value < threshold {
            return Err(BuildError::DustOutput {
                index,
                value: p.value,
                threshold,
            });
        }
    }
    let available = inputs
        .iter()
        .try_fold(Amount::ZERO, |acc, i| acc.checked_add(i.txout.value))
        .ok_or(BuildError::Overflow)?;
    let paid = payments
        .iter()
        .try_fold(Amount::ZERO, |acc, p| acc.checked_add(p.value))
        .ok_or(BuildError::Overflow)?;

    let lock_time = tip_height
        .and_then(|h| LockTime::from_height(h).ok())
        .unwrap_or(LockTime::ZERO);
    let mut tx = Transaction {
        version: Version::TWO,
        lock_time,
        input: inputs
            .iter()
            .map(|i| TxIn {
                previous_output: i.outpoint,
                script_sig: ScriptBuf::new(),
                // Signals replaceability (BIP125) without enabling nLockTime.
                sequence: Sequence::ENABLE_RBF_NO_LOCKTIME,
                witness: max_p2wpkh_witness(),
            })
            .collect(),
        output: payments.to_vec(),
    };
    let fee_for = |tx: &Transaction| -> (u64, Amount) {
        let vsize = tx.vsize() as u64;
        (vsize, fee_rate.fee_vb(vsize).unwrap_or(Amount::MAX_MONEY))
    };

    if let Some(script) = change {
        tx.output.push(TxOut {
            value: Amount::ZERO,
            script_pubkey: script.to_owned(),
        });
        let (vsize, fee) = fee_for(&tx);
        let needed = paid.checked_add(fee).ok_or(BuildError::Overflow)?;
        if let Some(change_value) = available.checked_sub(needed) {
            if change_value >= min_change(script, fee_rate) {
                let vout = (tx.output.len() - 1) as u32;
                if let Some(last) = tx.output.last_mut() {
                    last.value = change_value;
                }
                return Ok(finish(tx, fee, vsize, Some((vout, change_value))));
            }
        }
        tx.output.pop();
    }
    if tx.output.is_empty() {
        // Only change was asked for and it is not worth keeping: a
        // transaction without outputs is invalid (`bad-txns-vout-empty`).
        return Err(BuildError::NothingLeft {
            change: available.checked_sub(paid).unwrap_or(Amount::ZERO),
        });
    }
    let (vsize, fee) = fee_for(&tx);
    let needed = paid.checked_add(fee).ok_or(BuildError::Overflow)?;
    if available < needed {
        return Err(BuildError::InsufficientFunds { available, needed });
    }
    // Without change, whatever is left over (at most dust) goes to the miner.
    let actual_fee = available - paid;
    Ok(finish(tx, actual_fee, vsize, None))
}

fn finish(
    mut tx: Transaction,
    fee: Amount,
    vsize: u64,
    change: Option<(u32, Amount)>,
) -> BuiltTransaction {
    for input in &mut tx.input {
        input.witness = Witness::new();
    }
    BuiltTransaction {
        tx,
        fee,
        vsize,
        change,
    }
}

/// Signs input `index` of `tx`, which spends a P2WPKH output of `value`
/// controlled by `secret_key`, with SIGHASH_ALL (BIP143), and sets its witness.
///
/// Signatures use low R (as Bitcoin Core does), so they are at most 71 bytes.
///
/// # Errors
/// [`SignError::Sighash`] if `index` is out of range.
pub fn sign_p2wpkh_input(
    secp: &Secp256k1<All>,
    tx: &mut Transaction,
    index: usize,
    value: Amount,
    secret_key: &SecretKey,
) -> Result<(), SignError> {
    let public_key = CompressedPublicKey(secret_key.public_key(secp));
    let script = ScriptBuf::new_p2wpkh(&public_key.wpubkey_hash());
    let sighash = SighashCache::new(&*tx)
        .p2wpkh_signature_hash(index, &script, value, EcdsaSighashType::All)
        .map_err(|e| SignError::Sighash(e.to_string()))?;
    let msg = Message::from_digest(sighash.to_byte_array());
    let signature = EcdsaSignature {
        signature: secp.sign_ecdsa_low_r(&msg, secret_key),
        sighash_type: EcdsaSighashType::All,
    };
    let input = tx
        .input
        .get_mut(index)
        .ok_or_else(|| SignError::Sighash("index".into()))?;
    input.witness = Witness::p2wpkh(&signature, &public_key.0);
    Ok(())
}

impl Wallet {
    /// Signs every input of `tx`; `spent[i]` describes what input `i` spends.
    ///
    /// # Errors
    /// See [`SignError`]: a count or outpoint mismatch, or a key that does not
    /// control the script of the output it should spend.
    pub fn sign(&self, tx: &mut Transaction, spent: &[SpendableOutput]) -> Result<(), SignError> {
        if tx.input.len() != spent.len() {
            return Err(SignError::InputCount {
                inputs: tx.input.len(),
                outputs: spent.len(),
            });
        }
        for (index, s) in spent.iter().enumerate() {
            let found = tx.input[index].previous_output;
            if found != s.outpoint {
                return Err(SignError::OutpointMismatch {
                    index,
                    expected: s.outpoint,
                    found,
                });
            }
            let key = self.derive(s.path)?;
            if key.address.script_pubkey() != s.txout.script_pubkey {
                return Err(SignError::KeyMismatch {
                    index,
                    path: s.path,
                    script: s.txout.script_pubkey.clone(),
                });
            }
            sign_p2wpkh_input(self.secp(), tx, index, s.txout.value, &key.secret_key)?;
        }
        Ok(())
    }

    /// Builds and signs in one step; see [`build_transaction`] and [`Wallet::sign`].
    ///
    /// # Errors
    /// [`BuildError`] or [`SignError`], wrapped in [`SpendError`].
    pub fn build_signed(
        &self,
        inputs: &[SpendableOutput],
        payments: &[TxOut],
        change: Option<&Script>,
        fee_rate: FeeRate,
    ) -> Result<BuiltTransaction, SpendError> {
        let mut built = build_transaction(inputs, payments, change, fee_rate)?;
        self.sign(&mut built.tx, inputs)?;
        Ok(built)
    }

    /// As [`Wallet::build_signed`], with anti-fee-sniping `nLockTime` at
    /// `tip_height`; see [`build_transaction_at`].
    ///
    /// # Errors
    /// [`BuildError`] or [`SignError`], wrapped in [`SpendError`].
    pub fn build_signed_at(
        &self,
        inputs: &[SpendableOutput],
        payments: &[TxOut],
        change: Option<&Script>,
        fee_rate: FeeRate,
        tip_height: u32,
    ) -> Result<BuiltTransaction, SpendError> {
        let mut built = build_transaction_at(inputs, payments, change, fee_rate, Some(tip_height))?;
        self.sign(&mut built.tx, inputs)?;
        Ok(built)
    }
}

/// Building or signing failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpendError {
    /// Building failed.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// Signing failed.
    #[error(transparent)]
    Sign(#[from] SignError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::{Network, Txid};

    fn wallet() -> Wallet {
        Wallet::from_seed(&[42u8; 32], Network::Regtest).unwrap()
    }

    fn output(w: &Wallet, n: u8, sats: u64) -> SpendableOutput {
        let path = KeyPath::receive(u32::from(n));
        SpendableOutput {
            outpoint: OutPoint {
                txid: Txid::from_byte_array([n; 32]),
                vout: u32::from(n),
            },
            txout: TxOut {
                value: Amount::from_sat(sats),
                script_pubkey: w.derive(path).unwrap().address.script_pubkey(),
            },
            path,
        }
    }

    #[test]
    fn dust_thresholds_match_core() {
        let w = wallet();
        let p2wpkh = w.derive_address(0, 0).unwrap().script_pubkey();
        assert_eq!(dust_threshold(&p2wpkh), Amount::from_sat(294));
        let p2wsh = ScriptBuf::new_p2wsh(&bitcoin::WScriptHash::all_zeros());
        assert_eq!(dust_threshold(&p2wsh), Amount::from_sat(330));
        let p2pkh = ScriptBuf::new_p2pkh(&bitcoin::PubkeyHash::all_zeros());
        assert_eq!(dust_threshold(&p2pkh), Amount::from_sat(546));
    }

    /// A wallet, two of its coins (100,000 and 50,000 sat) and a payment of 60,000 sat.
    fn two_coins_paying_60_000() -> (Wallet, [SpendableOutput; 2], TxOut) {
        let w = wallet();
        let inputs = [output(&w, 1, 100_000), output(&w, 2, 50_000)];
        let pay = TxOut {
            value: Amount::from_sat(60_000),
            script_pubkey: w.derive_address(0, 9).unwrap().script_pubkey(),
        };
        (w, inputs, pay)
    }

    #[test]
    fn fee_matches_rate_and_signed_vsize() {
        let (w, inputs, pay) = two_coins_paying_60_000();
        let change = w.derive_address(1, 0).unwrap().script_pubkey();
        let rate = FeeRate::from_sat_per_vb(5).unwrap();
        let built = w
            .build_signed(&inputs, &[pay], Some(&change), rate)
            .unwrap();
        // 2 P2WPKH in, 2 P2WPKH out: 10.5 + 2*68 + 2*31 = 208.5 -> 209 vB.
        assert_eq!(built.vsize, 209);
        assert_eq!(built.fee, Amount::from_sat(5 * 209));
        let (vout, change_value) = built.change.unwrap();
        assert_eq!(vout, 1);
        assert_eq!(change_value, Amount::from_sat(150_000 - 60_000 - 5 * 209));
        let out_sum: Amount = built.tx.output.iter().map(|o| o.value).sum();
        assert_eq!(out_sum + built.fee, Amount::from_sat(150_000));
        // The signed transaction is never larger than what the fee paid for,
        // and at most one vbyte per input smaller (shorter signatures).
        let real = built.tx.vsize() as u64;
        assert!(
            real <= built.vsize && real + 2 >= built.vsize,
            "{real} vs {}",
            built.vsize
        );
    }

    #[test]
    fn signed_vsize_does_not_depend_on_the_signatures_it_replaces() {
        let (w, inputs, pay) = two_coins_paying_60_000();
        let rate = FeeRate::from_sat_per_vb(5).unwrap();
        let built = w.build_signed(&inputs, &[pay], None, rate).unwrap();
        // What the builder paid for, whatever the signatures came out as.
        assert_eq!(signed_vsize(&built.tx), built.vsize);
        assert!(built.tx.vsize() as u64 <= signed_vsize(&built.tx));
        let mut short = built.tx.clone();
        for input in &mut short.input {
            let items: Vec<Vec<u8>> = input.witness.iter().map(<[u8]>::to_vec).collect();
            input.witness = Witness::from_slice(&[&items[0][..60], &items[1][..]]);
        }
        assert!(short.vsize() < built.tx.vsize());
        assert_eq!(signed_vsize(&short), built.vsize);
    }

    #[test]
    fn dust_change_goes_to_fee() {
        let w = wallet();
        let inputs = [output(&w, 1, 10_000)];
        let pay = TxOut {
            value: Amount::from_sat(10_000 - 110 - 200),
            script_pubkey: w.derive_address(0, 9).unwrap().script_pubkey(),
        };
        let change = w.derive_address(1, 0).unwrap().script_pubkey();
        let rate = FeeRate::from_sat_per_vb(1).unwrap();
        let built = build_transaction(&inputs, &[pay], Some(&change), rate).unwrap();
        assert_eq!(built.change, None);
        assert_eq!(built.tx.output.len(), 1);
        assert_eq!(built.fee, Amount::from_sat(310));
        assert_eq!(built.vsize, 110);
    }

    /// Found in review: a sweep whose change is dust was built with no
    /// outputs at all (`bad-txns-vout-empty` on broadcast).
    #[test]
    fn change_only_that_is_not_worth_keeping_is_an_error_not_an_empty_tx() {
        let w = wallet();
        let inputs = [output(&w, 1, 400)];
        let to = w.derive_address(0, 3).unwrap().script_pubkey();
        let rate = FeeRate::from_sat_per_vb(1).unwrap();
        assert!(matches!(
            build_transaction(&inputs, &[], Some(&to), rate),
            Err(BuildError::NothingLeft { .. })
        ));
    }

    /// At 50 sat/vB a 3,000-sat change output costs more to create and
    /// spend (99 vB × 50 = 4,950 sat) than it is worth: it goes to the fee.
    #[test]
    fn uneconomic_change_goes_to_the_fee() {
        let w = wallet();
        let inputs = [output(&w, 1, 100_000)];
        let rate = FeeRate::from_sat_per_vb(50).unwrap();
        let pay = TxOut {
            value: Amount::from_sat(100_000 - 141 * 50 - 3_000),
            script_pubkey: w.derive_address(0, 9).unwrap().script_pubkey(),
        };
        let change = w.derive_address(1, 0).unwrap().script_pubkey();
        assert_eq!(min_change(&change, rate), Amount::from_sat(99 * 50));
        let built = build_transaction(&inputs, &[pay], Some(&change), rate).unwrap();
        assert_eq!(built.change, None);
        assert_eq!(built.tx.output.len(), 1);
    }

    #[test]
    fn lock_time_is_the_tip_height_against_fee_sniping() {
        let w = wallet();
        let inputs = [output(&w, 1, 100_000)];
        let to = w.derive_address(0, 3).unwrap().script_pubkey();
        let rate = FeeRate::from_sat_per_vb(2).unwrap();
        let built = w
            .build_signed_at(&inputs, &[], Some(&to), rate, 840_000)
            .unwrap();
        assert_eq!(built.tx.lock_time, LockTime::from_height(840_000).unwrap());
        // The lock is enforced: no input is final by sequence.
        assert!(built
            .tx
            .input
            .iter()
            .all(|i| i.sequence.enables_absolute_lock_time()));
    }

    #[test]
    fn sweep_to_change_only() {
        let w = wallet();
        let inputs = [output(&w, 1, 10_000)];
        let to = w.derive_address(0, 3).unwrap().script_pubkey();
        let rate = FeeRate::from_sat_per_vb(2).unwrap();
        let built = build_transaction(&inputs, &[], Some(&to), rate).unwrap();
        assert_eq!(built.vsize, 110);
        assert_eq!(built.change, Some((0, Amount::from_sat(10_000 - 220))));
    }

    #[test]
    fn rejects_dust_payments_and_insufficient_funds() {
        let w = wallet();
        let script = w.derive_address(0, 9).unwrap().script_pubkey();
        let inputs = [output(&w, 1, 1_000)];
        let rate = FeeRate::from_sat_per_vb(1).unwrap();
        let dust = TxOut {
            value: Amount::from_sat(293),
            script_pubkey: script.clone(),
        };
        assert!(matches!(
            build_transaction(&inputs, &[dust], None, rate),
            Err(BuildError::DustOutput { index: 0, .. })
        ));
        let big = TxOut {
            value: Amount::from_sat(950),
            script_pubkey: script,
        };
        assert_eq!(
            build_transaction(&inputs, &[big], None, rate).unwrap_err(),
            BuildError::InsufficientFunds {
                available: Amount::from_sat(1_000),
                needed: Amount::from_sat(950 + 110)
            }
        );
        assert_eq!(
            build_transaction(&[], &[], None, rate).unwrap_err(),
            BuildError::NoInputs
        );
        assert_eq!(
            build_transaction(&inputs, &[], None, rate).unwrap_err(),
            BuildError::NoOutputs
        );
    }

    #[test]
    fn signing_checks_keys_and_verifies() {
        let w = wallet();
        let mut wrong = output(&w, 1, 10_000);
        wrong.path = KeyPath::receive(7);
        let to = w.derive_address(0, 3).unwrap().script_pubkey();
        let rate = FeeRate::from_sat_per_vb(1).unwrap();
        let mut built = build_transaction(&[wrong.clone()], &[], Some(&to), rate).unwrap();
        assert!(matches!(
            w.sign(&mut built.tx, &[wrong]),
            Err(SignError::KeyMismatch { .. })
        ));

        // The signature verifies against the sighash with the output's key.
        let good = output(&w, 1, 10_000);
        let mut built =
            build_transaction(std::slice::from_ref(&good), &[], Some(&to), rate).unwrap();
        w.sign(&mut built.tx, std::slice::from_ref(&good)).unwrap();
        let wit = &built.tx.input[0].witness;
        assert_eq!(wit.len(), 2);
        let sig = EcdsaSignature::from_slice(&wit.to_vec()[0]).unwrap();
        let key = w.derive(good.path).unwrap();
        let sighash = SighashCache::new(&built.tx)
            .p2wpkh_signature_hash(
                0,
                &good.txout.script_pubkey,
                good.txout.value,
                EcdsaSighashType::All,
            )
            .unwrap();
        w.secp()
            .verify_ecdsa(
                &Message::from_digest(sighash.to_byte_array()),
                &sig.signature,
                &key.public_key.0,
            )
            .unwrap();
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use bitcoin::{Network, Txid};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Funds are conserved, the fee pays the rate on the signed size, and
        /// no output is dust, whatever the inputs, payments and rate.
        #[test]
        fn build_conserves_funds_and_pays_the_rate(
            input_sats in prop::collection::vec(1_000u64..5_000_000, 1..6),
            pay_sats in prop::collection::vec(294u64..2_000_000, 0..4),
            rate in 1u64..60,
            with_change in any::<bool>(),
        ) {
            let w = Wallet::from_seed(&[42u8; 32], Network::Regtest).unwrap();
            let inputs: Vec<SpendableOutput> = input_sats.iter().enumerate().map(|(i, s)| {
                let path = KeyPath::receive(i as u32);
                SpendableOutput {
                    outpoint: OutPoint { txid: Txid::from_byte_array([i as u8; 32]), vout: 0 },
                    txout: TxOut { value: Amount::from_sat(*s), script_pubkey: w.derive(path).unwrap().address.script_pubkey() },
                    path,
                }
            }).collect();
            let payments: Vec<TxOut> = pay_sats.iter().map(|s| TxOut {
                value: Amount::from_sat(*s),
                script_pubkey: w.derive_address(0, 100).unwrap().script_pubkey(),
            }).collect();
            let change = w.derive_address(1, 0).unwrap().script_pubkey();
            let rate = FeeRate::from_sat_per_vb(rate).unwrap();
            match w.build_signed(&inputs, &payments, with_change.then_some(change.as_script()), rate) {
                Ok(built) => {
                    let ins: Amount = input_sats.iter().map(|s| Amount::from_sat(*s)).sum();
                    let outs: Amount = built.tx.output.iter().map(|o| o.value).sum();
                    prop_assert_eq!(outs + built.fee, ins);
                    prop_assert!(built.fee >= rate.fee_vb(built.tx.vsize() as u64).unwrap());
                    prop_assert!(!built.tx.output.is_empty());
                    for o in &built.tx.output {
                        prop_assert!(o.value >= dust_threshold(&o.script_pubkey));
                    }
                }
                Err(SpendError::Build(BuildError::NothingLeft { change })) => {
                    prop_assert!(payments.is_empty() && with_change);
                    prop_assert!(change < min_change(&w.derive_address(1, 0).unwrap().script_pubkey(), rate) + rate.fee_vb(200).unwrap());
                }
                Err(SpendError::Build(BuildError::InsufficientFunds { available, needed })) => {
                    prop_assert!(available < needed);
                }
                Err(SpendError::Build(BuildError::NoOutputs)) => {
                    prop_assert!(payments.is_empty() && !with_change);
                }
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }
    }
}
