//! Pure builders for the channel's transactions: commitment, cooperative close,
//! and sweeps (unilateral claims, HTLC claims, penalty), with their signatures.
//!
//! All are segwit v0, version 2, outputs in BIP69 order (amount, then
//! scriptPubKey). Outputs under [`DUST_LIMIT_SAT`] are left out (their value
//! goes to the fee) so that every transaction is standard.

use bitcoin::absolute::LockTime;
use bitcoin::hashes::Hash as _;
use bitcoin::sighash::{EcdsaSighashType, SighashCache};
use bitcoin::transaction::Version;
use bitcoin::{
    Amount, CompressedPublicKey, OutPoint, ScriptBuf, Sequence, Transaction, TxIn, TxOut, Witness,
};
use secp256k1::{ecdsa::Signature, All, Message, PublicKey, Secp256k1, SecretKey};
use wire::Sha256;

use crate::funding::{CState, Htlc};
use crate::script::{
    anchor_script, cltv_value, htlc_offered_script, htlc_received_script, revocable_script,
    sorted_keys, LocktimeError,
};

/// Outputs below this many satoshis are not created (Bitcoin Core's P2PKH dust limit,
/// which covers every output type used here).
pub const DUST_LIMIT_SAT: u64 = 546;

/// Why a transaction could not be built or signed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxError {
    /// A time lock cannot be expressed.
    #[error(transparent)]
    Locktime(#[from] LocktimeError),
    /// The inputs do not cover the fee.
    #[error("inputs of {inputs_sat} sat do not cover the fee of {fee_sat} sat")]
    FeeTooHigh {
        /// Sum of the inputs.
        inputs_sat: u64,
        /// The fee asked for.
        fee_sat: u64,
    },
    /// Nothing to spend.
    #[error("no inputs")]
    NoInputs,
    /// Not a sweep of ours (one output, P2WPKH or script-branch witnesses).
    #[error("not a sweep transaction")]
    NotASweep,
}

/// The keys and parameters of one commitment transaction, seen from its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitmentKeys {
    /// The owner's final key (its revocable output and HTLC branches).
    pub owner_final: PublicKey,
    /// The counterparty's final key.
    pub other_final: PublicKey,
    /// The delay the counterparty imposes on the owner (its `open_channel.delay`).
    pub delay_csv: u32,
    /// The owner's revocation hash for this commitment.
    pub revocation_hash: Sha256,
}

/// What one output of a commitment transaction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OutputKind {
    /// The owner's revocable output.
    ToOwner,
    /// The counterparty's P2WPKH output.
    ToOther,
    /// An HTLC offered by the owner.
    HtlcOffered(Htlc),
    /// An HTLC offered to the owner.
    HtlcReceived(Htlc),
}

/// One output of a commitment transaction with what is needed to spend it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CommitmentOutput {
    /// What it is.
    pub kind: OutputKind,
    /// Its value.
    pub value: Amount,
    /// Its witness script (for P2WPKH, the P2WPKH script code).
    pub witness_script: ScriptBuf,
    /// Its scriptPubKey.
    pub script_pubkey: ScriptBuf,
}

/// A commitment transaction and the description of its outputs (same order).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Commitment {
    /// The unsigned transaction.
    pub tx: Transaction,
    /// Its outputs, in transaction order.
    pub outputs: Vec<CommitmentOutput>,
}

/// The crate's one secp256k1 context: creating one per signature allocated and set
/// it up again each time (never randomised: the crate takes no randomness, so a
/// shared context signs and verifies exactly as a fresh one did).
pub(crate) fn secp() -> &'static Secp256k1<All> {
    static SECP: std::sync::LazyLock<Secp256k1<All>> = std::sync::LazyLock::new(Secp256k1::new);
    &SECP
}

/// P2WPKH script of a key.
pub fn p2wpkh(key: &PublicKey) -> ScriptBuf {
    ScriptBuf::new_p2wpkh(&CompressedPublicKey(*key).wpubkey_hash())
}

/// nLockTime and nSequence of commitment `n`: the number is recoverable from a
/// transaction seen on chain (upper bytes 0x20 / 0x80: a locktime long past, and
/// no relative lock), see [`commitment_number`].
pub fn commitment_locks(n: u64) -> (LockTime, Sequence) {
    let lock = 0x2000_0000 | (n & 0x00ff_ffff) as u32;
    let seq = 0x8000_0000 | ((n >> 24) & 0x00ff_ffff) as u32;
    (
        LockTime::from_consensus(lock),
        Sequence::from_consensus(seq),
    )
}

/// The commitment number encoded by [`commitment_locks`], if `tx` carries one.
pub fn commitment_number(tx: &Transaction) -> Option<u64> {
    let lock = tx.lock_time.to_consensus_u32();
    let seq = tx.input.first()?.sequence.to_consensus_u32();
    if lock >> 24 != 0x20 || seq >> 24 != 0x80 {
        return None;
    }
    Some((u64::from(seq & 0x00ff_ffff) << 24) | u64::from(lock & 0x00ff_ffff))
}

fn bip69_sort(outputs: &mut [CommitmentOutput]) {
    outputs.sort_by(|a, b| {
        a.value
            .cmp(&b.value)
            .then_with(|| a.script_pubkey.as_bytes().cmp(b.script_pubkey.as_bytes()))
    });
}

/// Builds the owner's commitment transaction number `n` spending the anchor.
///
/// `state` is seen from the owner (`ours` = owner). Balances are rounded down
/// to satoshis; the fee is what remains of the anchor.
///
/// # Errors
/// An HTLC expiry that cannot be put in a script.
pub fn commitment_tx(
    anchor: OutPoint,
    state: &CState,
    keys: &CommitmentKeys,
    n: u64,
) -> Result<Commitment, TxError> {
    let mut outputs = Vec::new();
    let to_owner = revocable_script(
        &keys.revocation_hash,
        &keys.other_final,
        keys.delay_csv,
        &keys.owner_final,
    );
    outputs.push(CommitmentOutput {
        kind: OutputKind::ToOwner,
        value: Amount::from_sat(state.ours.pay_msat / 1000),
        script_pubkey: to_owner.to_p2wsh(),
        witness_script: to_owner,
    });
    // One HASH160 of the key for both the output and its script code.
    let other_wpkh = CompressedPublicKey(keys.other_final).wpubkey_hash();
    outputs.push(CommitmentOutput {
        kind: OutputKind::ToOther,
        value: Amount::from_sat(state.theirs.pay_msat / 1000),
        witness_script: ScriptBuf::p2wpkh_script_code(other_wpkh),
        script_pubkey: ScriptBuf::new_p2wpkh(&other_wpkh),
    });
    for h in &state.ours.htlcs {
        let s = htlc_offered_script(
            &keys.owner_final,
            &keys.other_final,
            cltv_value(h.expiry)?,
            keys.delay_csv,
            &keys.revocation_hash,
            &h.r_hash,
        );
        outputs.push(CommitmentOutput {
            kind: OutputKind::HtlcOffered(*h),
            value: Amount::from_sat(u64::from(h.amount_msat) / 1000),
            script_pubkey: s.to_p2wsh(),
            witness_script: s,
        });
    }
    for h in &state.theirs.htlcs {
        let s = htlc_received_script(
            &keys.owner_final,
            &keys.other_final,
            cltv_value(h.expiry)?,
            keys.delay_csv,
            &keys.revocation_hash,
            &h.r_hash,
        );
        outputs.push(CommitmentOutput {
            kind: OutputKind::HtlcReceived(*h),
            value: Amount::from_sat(u64::from(h.amount_msat) / 1000),
            script_pubkey: s.to_p2wsh(),
            witness_script: s,
        });
    }
    outputs.retain(|o| o.value.to_sat() >= DUST_LIMIT_SAT);
    bip69_sort(&mut outputs);
    let (lock_time, sequence) = commitment_locks(n);
    let tx = Transaction {
        version: Version::TWO,
        lock_time,
        input: vec![TxIn {
            previous_output: anchor,
            script_sig: ScriptBuf::new(),
            sequence,
            witness: Witness::new(),
        }],
        output: outputs
            .iter()
            .map(|o| TxOut {
                value: o.value,
                script_pubkey: o.script_pubkey.clone(),
            })
            .collect(),
    };
    Ok(Commitment { tx, outputs })
}

/// Whether [`commitment_tx`] can build a commitment of `state`, with the error it would
/// return, without building it: every HTLC expiry must fit a script.
///
/// # Errors
/// As [`commitment_tx`].
pub fn check_commitment(state: &CState) -> Result<(), TxError> {
    for h in state.ours.htlcs.iter().chain(&state.theirs.htlcs) {
        cltv_value(h.expiry)?;
    }
    Ok(())
}

/// The most the signed commitment `c` can weigh after any later payment, for the minimum
/// relay fee (docs/channel.md, "The commitment always relays"): its weight once signed
/// (the 2-of-2 witness, counted as in [`close_weight`]) with the owner's and the other
/// side's outputs counted even where dust left them out, since a payment can bring them
/// back. Only an added HTLC adds an output beyond that.
pub fn commitment_weight_bound(c: &Commitment) -> u64 {
    let mut tx = c.tx.clone();
    let has = |kind: OutputKind| c.outputs.iter().any(|o| o.kind == kind);
    // Stand-ins of the same size: a P2WSH is OP_0 and a 32-byte push, a P2WPKH OP_0 and
    // a 20-byte push.
    for (kind, len) in [(OutputKind::ToOwner, 34), (OutputKind::ToOther, 22)] {
        if !has(kind) {
            tx.output.push(TxOut {
                value: Amount::ZERO,
                script_pubkey: ScriptBuf::from_bytes(vec![0; len]),
            });
        }
    }
    close_weight(&tx)
}

/// The cooperative close: the anchor pays each side's final key (P2WPKH).
pub fn close_tx(
    anchor: OutPoint,
    a_final: &PublicKey,
    a_sat: u64,
    b_final: &PublicKey,
    b_sat: u64,
) -> Transaction {
    let mut outs: Vec<TxOut> = [(a_final, a_sat), (b_final, b_sat)]
        .into_iter()
        .filter(|(_, v)| *v >= DUST_LIMIT_SAT)
        .map(|(k, v)| TxOut {
            value: Amount::from_sat(v),
            script_pubkey: p2wpkh(k),
        })
        .collect();
    outs.sort_by(|x, y| {
        x.value
            .cmp(&y.value)
            .then_with(|| x.script_pubkey.as_bytes().cmp(y.script_pubkey.as_bytes()))
    });
    Transaction {
        version: Version::TWO,
        lock_time: LockTime::ZERO,
        input: vec![TxIn {
            previous_output: anchor,
            script_sig: ScriptBuf::new(),
            sequence: Sequence::MAX,
            witness: Witness::new(),
        }],
        output: outs,
    }
}

/// Weight of a close transaction once signed: `tx` unsigned plus the 2-of-2
/// witness (an empty element, two 73-byte signatures at most, the 71-byte script).
pub fn close_weight(tx: &Transaction) -> u64 {
    // Items count, empty element, two signatures with length bytes, script with length byte;
    // an unsigned transaction serialises without the segwit marker and flag: add them.
    const WITNESS: u64 = 1 + 1 + (1 + 73) * 2 + 1 + 71;
    tx.weight().to_wu() + 2 + WITNESS
}

/// The BIP143 digest for input `index` spending a P2WSH output.
pub fn p2wsh_sighash(
    tx: &Transaction,
    index: usize,
    witness_script: &ScriptBuf,
    value: Amount,
) -> Message {
    let mut cache = SighashCache::new(tx);
    let h = cache
        .p2wsh_signature_hash(index, witness_script, value, EcdsaSighashType::All)
        .map(|h| h.to_byte_array())
        // The index is always one of our own inputs.
        .unwrap_or([0u8; 32]);
    Message::from_digest(h)
}

/// Signs input 0 (the anchor) of a commitment or close transaction.
pub fn sign_anchor_spend(
    tx: &Transaction,
    anchor_script: &ScriptBuf,
    anchor_value: Amount,
    key: &SecretKey,
) -> Signature {
    secp().sign_ecdsa(&p2wsh_sighash(tx, 0, anchor_script, anchor_value), key)
}

/// Checks a counterparty's signature on input 0 (the anchor) of `tx`.
pub fn verify_anchor_spend(
    tx: &Transaction,
    anchor_script: &ScriptBuf,
    anchor_value: Amount,
    sig: &Signature,
    key: &PublicKey,
) -> bool {
    let mut sig = *sig;
    // Accept high-S like the reference does (PROTOCOL-NOTES §3); the witness gets low-S.
    sig.normalize_s();
    secp()
        .verify_ecdsa(
            &p2wsh_sighash(tx, 0, anchor_script, anchor_value),
            &sig,
            key,
        )
        .is_ok()
}

fn der_all(sig: &Signature) -> Vec<u8> {
    let mut v = sig.serialize_der().to_vec();
    v.push(EcdsaSighashType::All as u8);
    v
}

/// Puts both signatures into input 0's witness: `<> <sig1> <sig2> <anchor script>`.
pub fn finalize_anchor_spend(
    tx: &mut Transaction,
    key_a: &PublicKey,
    sig_a: &Signature,
    key_b: &PublicKey,
    sig_b: &Signature,
) {
    let script = anchor_script(key_a, key_b);
    let (first, _) = sorted_keys(key_a, key_b);
    let (mut s1, mut s2) = if first == *key_a {
        (*sig_a, *sig_b)
    } else {
        (*sig_b, *sig_a)
    };
    s1.normalize_s();
    s2.normalize_s();
    let mut w = Witness::new();
    w.push(Vec::<u8>::new());
    w.push(der_all(&s1));
    w.push(der_all(&s2));
    w.push(script.as_bytes());
    if let Some(input) = tx.input.first_mut() {
        input.witness = w;
    }
}

/// How a sweep input is unlocked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SweepWitness {
    /// A P2WPKH output of the sweeper's key: `<sig> <pubkey>`.
    P2wpkh,
    /// A P2WSH script branch chosen by a secret (R, a revocation preimage, or empty):
    /// `<sig> <secret> <script>`.
    Script {
        /// The witness script.
        witness_script: ScriptBuf,
        /// The secret element (empty for the timeout/delay branches).
        secret: Vec<u8>,
    },
}

/// One output to sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepInput {
    /// The output spent.
    pub outpoint: OutPoint,
    /// Its value.
    pub value: Amount,
    /// How to unlock it.
    pub witness: SweepWitness,
    /// nSequence (the CSV delay where one applies, else 0xfffffffe so nLockTime counts).
    pub sequence: Sequence,
    /// The key that signs.
    pub key: SecretKey,
}

/// Estimated weight of a signed sweep (signature 73 bytes, secret 32 bytes).
pub fn sweep_weight(inputs: &[SweepInput]) -> u64 {
    weight_with(inputs.iter().map(|i| &i.witness))
}

/// [`sweep_weight`] of a sweep whose inputs unlock with `witnesses`.
fn weight_with<'a>(witnesses: impl Iterator<Item = &'a SweepWitness>) -> u64 {
    // Version, locktime, counts, one P2WPKH output (31 bytes): 4+4+1+1+31 = 41 bytes ×4, + 2 segwit marker/flag.
    let mut w = 41 * 4 + 2;
    for witness in witnesses {
        w += (32 + 4 + 1 + 4) * 4; // outpoint, empty scriptSig, sequence
        w += match witness {
            SweepWitness::P2wpkh => 1 + 1 + 73 + 1 + 33,
            SweepWitness::Script { witness_script, .. } => {
                1 + 1 + 73 + 1 + 32 + 3 + witness_script.len() as u64
            }
        };
    }
    w
}

/// Builds and signs a transaction sending every input, minus `fee_sat`, to `destination`.
///
/// `lock_time` must be at least every CLTV expiry of the branches used.
///
/// # Errors
/// [`TxError::NoInputs`] or [`TxError::FeeTooHigh`].
pub fn sweep_tx(
    inputs: &[SweepInput],
    destination: ScriptBuf,
    fee_sat: u64,
    lock_time: LockTime,
) -> Result<Transaction, TxError> {
    if inputs.is_empty() {
        return Err(TxError::NoInputs);
    }
    let total: u64 = inputs.iter().map(|i| i.value.to_sat()).sum();
    if total < fee_sat + DUST_LIMIT_SAT {
        return Err(TxError::FeeTooHigh {
            inputs_sat: total,
            fee_sat,
        });
    }
    let mut tx = Transaction {
        version: Version::TWO,
        lock_time,
        input: inputs
            .iter()
            .map(|i| TxIn {
                previous_output: i.outpoint,
                script_sig: ScriptBuf::new(),
                sequence: i.sequence,
                witness: Witness::new(),
            })
            .collect(),
        output: vec![TxOut {
            value: Amount::from_sat(total - fee_sat),
            script_pubkey: destination,
        }],
    };
    let secp = secp();
    let mut witnesses = Vec::with_capacity(inputs.len());
    {
        let mut cache = SighashCache::new(&tx);
        for (idx, i) in inputs.iter().enumerate() {
            let pk = PublicKey::from_secret_key(secp, &i.key);
            let w = match &i.witness {
                SweepWitness::P2wpkh => {
                    let spk = p2wpkh(&pk);
                    let h = cache
                        .p2wpkh_signature_hash(idx, &spk, i.value, EcdsaSighashType::All)
                        .map(|h| h.to_byte_array())
                        .unwrap_or([0; 32]);
                    let sig = secp.sign_ecdsa(&Message::from_digest(h), &i.key);
                    let mut w = Witness::new();
                    w.push(der_all(&sig));
                    w.push(pk.serialize());
                    w
                }
                SweepWitness::Script {
                    witness_script,
                    secret,
                } => {
                    let h = cache
                        .p2wsh_signature_hash(idx, witness_script, i.value, EcdsaSighashType::All)
                        .map(|h| h.to_byte_array())
                        .unwrap_or([0; 32]);
                    let sig = secp.sign_ecdsa(&Message::from_digest(h), &i.key);
                    let mut w = Witness::new();
                    w.push(der_all(&sig));
                    w.push(secret);
                    w.push(witness_script.as_bytes());
                    w
                }
            };
            witnesses.push(w);
        }
    }
    for (input, w) in tx.input.iter_mut().zip(witnesses) {
        input.witness = w;
    }
    Ok(tx)
}

/// The same sweep, re-signed with `key` to pay `fee_sat` (a BIP125 replacement): same
/// inputs, witnesses' secrets and scripts, sequences, lock time and destination.
/// `values` are the values of the outputs it spends, in input order.
///
/// # Errors
/// [`TxError::NotASweep`] for a transaction whose shape is not one [`sweep_tx`] makes;
/// [`TxError::FeeTooHigh`] when the inputs cannot pay `fee_sat` plus dust.
pub fn resign_sweep(
    tx: &Transaction,
    values: &[Amount],
    key: &SecretKey,
    fee_sat: u64,
) -> Result<Transaction, TxError> {
    let witnesses = sweep_witnesses(tx)?;
    if values.len() != tx.input.len() {
        return Err(TxError::NotASweep);
    }
    let inputs: Vec<SweepInput> = tx
        .input
        .iter()
        .zip(values)
        .zip(witnesses)
        .map(|((input, value), witness)| SweepInput {
            outpoint: input.previous_output,
            value: *value,
            witness,
            sequence: input.sequence,
            key: *key,
        })
        .collect();
    let destination = tx.output[0].script_pubkey.clone();
    sweep_tx(&inputs, destination, fee_sat, tx.lock_time)
}

/// How each input of `tx`, a sweep [`sweep_tx`] made, unlocks its output.
///
/// # Errors
/// [`TxError::NotASweep`] for a transaction of another shape.
fn sweep_witnesses(tx: &Transaction) -> Result<Vec<SweepWitness>, TxError> {
    if tx.output.len() != 1 {
        return Err(TxError::NotASweep);
    }
    tx.input
        .iter()
        .map(|input| {
            let items: Vec<&[u8]> = input.witness.iter().collect();
            match items[..] {
                [_sig, _pubkey] => Ok(SweepWitness::P2wpkh),
                [_sig, secret, script] => Ok(SweepWitness::Script {
                    witness_script: ScriptBuf::from_bytes(script.to_vec()),
                    secret: secret.to_vec(),
                }),
                _ => Err(TxError::NotASweep),
            }
        })
        .collect()
}

/// The virtual size to price a re-signed `tx` at: [`sweep_weight`]'s, at its largest
/// signatures, not `tx`'s own, as a new signature may come out longer (ECDSA's are 71 to 73
/// bytes with the sighash byte).
///
/// # Errors
/// [`TxError::NotASweep`] for a transaction whose shape is not one [`sweep_tx`] makes.
pub fn resigned_vsize(tx: &Transaction) -> Result<u64, TxError> {
    Ok(weight_with(sweep_witnesses(tx)?.iter()).div_ceil(4))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::funding::Who;
    use bitcoin::Txid;
    use bitcoin_hashes::Hash;
    use wire::{Locktime, Preimage};

    pub(crate) fn sk(b: u8) -> SecretKey {
        SecretKey::from_slice(&[b; 32]).unwrap()
    }
    pub(crate) fn pk(b: u8) -> PublicKey {
        PublicKey::from_secret_key(&Secp256k1::new(), &sk(b))
    }

    /// Full script verification of `tx` against the outputs it spends.
    pub(crate) fn verify(tx: &Transaction, spent: &[(OutPoint, TxOut)]) {
        tx.verify(|op| spent.iter().find(|(o, _)| o == op).map(|(_, t)| t.clone()))
            .unwrap_or_else(|e| panic!("script verification failed: {e:?}\n{tx:#?}"));
    }

    pub(crate) fn verify_fails(tx: &Transaction, spent: &[(OutPoint, TxOut)]) {
        assert!(
            tx.verify(|op| spent.iter().find(|(o, _)| o == op).map(|(_, t)| t.clone()))
                .is_err(),
            "verification unexpectedly passed"
        );
    }

    fn anchor() -> (OutPoint, TxOut) {
        let op = OutPoint {
            txid: Txid::from_byte_array([0xab; 32]),
            vout: 1,
        };
        let out = TxOut {
            value: Amount::from_sat(1_000_000),
            script_pubkey: anchor_script(&pk(0x21), &pk(0x22)).to_p2wsh(),
        };
        (op, out)
    }

    fn state_with_htlcs() -> (CState, Preimage, Preimage) {
        let r1 = Preimage([1; 32]);
        let r2 = Preimage([2; 32]);
        let c = CState::initial(1_000_000, 10_000, true).unwrap();
        let c = c.pay(Who::Us, 300_000_000).unwrap();
        let c = c
            .add_htlc(
                Who::Us,
                Htlc {
                    amount_msat: 50_000_000,
                    r_hash: r1.hash(),
                    expiry: Locktime::Blocks(500),
                },
            )
            .unwrap();
        let c = c
            .add_htlc(
                Who::Them,
                Htlc {
                    amount_msat: 70_000_000,
                    r_hash: r2.hash(),
                    expiry: Locktime::Blocks(600),
                },
            )
            .unwrap();
        (c, r1, r2)
    }

    #[test]
    fn check_commitment_gives_the_error_of_building_it() {
        let (c, _, _) = state_with_htlcs();
        let (op, _) = anchor();
        let rev = Preimage([9; 32]);
        assert_eq!(check_commitment(&c), Ok(()));
        assert!(commitment_tx(op, &c, &keys(&rev), 1).is_ok());
        // Both sides' HTLCs are checked, ours first as the builder does.
        let mut bad = c.clone();
        bad.theirs.htlcs[0].expiry = Locktime::Seconds(7);
        bad.ours.htlcs[0].expiry = Locktime::Blocks(600_000_000);
        let built = commitment_tx(op, &bad, &keys(&rev), 1).map(|_| ());
        assert!(built.is_err());
        assert_eq!(check_commitment(&bad), built);
        bad.ours.htlcs[0].expiry = Locktime::Blocks(500);
        let built = commitment_tx(op, &bad, &keys(&rev), 1).map(|_| ());
        assert_eq!(
            built,
            Err(TxError::Locktime(LocktimeError::ExpiryOutOfRange(
                Locktime::Seconds(7)
            )))
        );
        assert_eq!(check_commitment(&bad), built);
    }

    fn keys(rev: &Preimage) -> CommitmentKeys {
        CommitmentKeys {
            owner_final: pk(0x31),
            other_final: pk(0x32),
            delay_csv: 10,
            revocation_hash: rev.hash(),
        }
    }

    fn signed_commitment(c: &CState, rev: &Preimage) -> Commitment {
        let (op, out) = anchor();
        let mut cm = commitment_tx(op, c, &keys(rev), 7).unwrap();
        let script = anchor_script(&pk(0x21), &pk(0x22));
        let s1 = sign_anchor_spend(&cm.tx, &script, out.value, &sk(0x21));
        let s2 = sign_anchor_spend(&cm.tx, &script, out.value, &sk(0x22));
        assert!(verify_anchor_spend(
            &cm.tx,
            &script,
            out.value,
            &s2,
            &pk(0x22)
        ));
        assert!(!verify_anchor_spend(
            &cm.tx,
            &script,
            out.value,
            &s2,
            &pk(0x21)
        ));
        finalize_anchor_spend(&mut cm.tx, &pk(0x22), &s2, &pk(0x21), &s1);
        cm
    }

    fn spent_of(cm: &Commitment, i: usize) -> (OutPoint, TxOut) {
        (
            OutPoint {
                txid: cm.tx.compute_txid(),
                vout: i as u32,
            },
            cm.tx.output[i].clone(),
        )
    }

    fn sweep_one(
        cm: &Commitment,
        i: usize,
        secret: Vec<u8>,
        key: u8,
        seq: u32,
        lock: u32,
    ) -> Transaction {
        let (op, out) = spent_of(cm, i);
        sweep_tx(
            &[SweepInput {
                outpoint: op,
                value: out.value,
                witness: SweepWitness::Script {
                    witness_script: cm.outputs[i].witness_script.clone(),
                    secret,
                },
                sequence: Sequence::from_consensus(seq),
                key: sk(key),
            }],
            p2wpkh(&pk(key)),
            1_000,
            LockTime::from_consensus(lock),
        )
        .unwrap()
    }

    fn index_of(cm: &Commitment, f: impl Fn(&OutputKind) -> bool) -> usize {
        cm.outputs.iter().position(|o| f(&o.kind)).unwrap()
    }

    #[test]
    fn commitment_layout_and_anchor_spend_verify() {
        let (c, _, _) = state_with_htlcs();
        let rev = Preimage([9; 32]);
        let cm = signed_commitment(&c, &rev);
        assert_eq!(cm.tx.output.len(), 4);
        let values: Vec<u64> = cm.tx.output.iter().map(|o| o.value.to_sat()).collect();
        let mut sorted = values.clone();
        sorted.sort();
        assert_eq!(values, sorted, "BIP69 order");
        let fee = 1_000_000 - values.iter().sum::<u64>();
        assert_eq!(fee, 10_000);
        assert_eq!(commitment_number(&cm.tx), Some(7));
        verify(&cm.tx, &[anchor()]);
        // A wrong signature fails full verification.
        let mut bad = cm.tx.clone();
        let script = anchor_script(&pk(0x21), &pk(0x22));
        let s1 = sign_anchor_spend(
            &close_tx(anchor().0, &pk(1), 1000, &pk(2), 1000),
            &script,
            Amount::from_sat(1_000_000),
            &sk(0x21),
        );
        let s2 = sign_anchor_spend(&bad, &script, Amount::from_sat(1_000_000), &sk(0x22));
        finalize_anchor_spend(&mut bad, &pk(0x21), &s1, &pk(0x22), &s2);
        verify_fails(&bad, &[anchor()]);
    }

    #[test]
    fn commitment_locks_round_trip() {
        for n in [0u64, 1, 0xff_ffff, 0x100_0000, 0xffff_ffff_ffff] {
            let (l, s) = commitment_locks(n);
            let tx = Transaction {
                version: Version::TWO,
                lock_time: l,
                input: vec![TxIn {
                    sequence: s,
                    ..TxIn::default()
                }],
                output: vec![],
            };
            assert_eq!(commitment_number(&tx), Some(n));
        }
    }

    #[test]
    fn close_tx_verifies() {
        let (op, out) = anchor();
        let mut tx = close_tx(op, &pk(0x31), 600_000, &pk(0x32), 399_000);
        let script = anchor_script(&pk(0x21), &pk(0x22));
        let s1 = sign_anchor_spend(&tx, &script, out.value, &sk(0x21));
        let s2 = sign_anchor_spend(&tx, &script, out.value, &sk(0x22));
        finalize_anchor_spend(&mut tx, &pk(0x21), &s1, &pk(0x22), &s2);
        assert_eq!(tx.output[0].value.to_sat(), 399_000);
        verify(&tx, &[(op, out)]);
    }

    #[test]
    fn owner_claims_after_delay_only() {
        let (c, r1, r2) = state_with_htlcs();
        let rev = Preimage([9; 32]);
        let cm = signed_commitment(&c, &rev);
        // To-owner output after the delay (10 blocks): sequence 10.
        let i = index_of(&cm, |k| matches!(k, OutputKind::ToOwner));
        verify(&sweep_one(&cm, i, vec![], 0x31, 10, 0), &[spent_of(&cm, i)]);
        verify_fails(&sweep_one(&cm, i, vec![], 0x31, 9, 0), &[spent_of(&cm, i)]);
        verify_fails(&sweep_one(&cm, i, vec![], 0x32, 10, 0), &[spent_of(&cm, i)]);
        // The other side takes it with the revocation preimage, at once.
        verify(
            &sweep_one(&cm, i, rev.0.to_vec(), 0x32, 0xffff_fffe, 0),
            &[spent_of(&cm, i)],
        );
        // Offered HTLC: refund to owner after expiry 500 and delay.
        let i = index_of(&cm, |k| matches!(k, OutputKind::HtlcOffered(_)));
        verify(
            &sweep_one(&cm, i, vec![], 0x31, 10, 500),
            &[spent_of(&cm, i)],
        );
        verify_fails(
            &sweep_one(&cm, i, vec![], 0x31, 10, 499),
            &[spent_of(&cm, i)],
        );
        // …or to the other side with R, or with the revocation preimage.
        verify(
            &sweep_one(&cm, i, r1.0.to_vec(), 0x32, 0xffff_fffe, 0),
            &[spent_of(&cm, i)],
        );
        verify(
            &sweep_one(&cm, i, rev.0.to_vec(), 0x32, 0xffff_fffe, 0),
            &[spent_of(&cm, i)],
        );
        verify_fails(
            &sweep_one(&cm, i, r2.0.to_vec(), 0x32, 0xffff_fffe, 0),
            &[spent_of(&cm, i)],
        );
        // Received HTLC: owner with R after delay; other after expiry 600 or with revocation.
        let i = index_of(&cm, |k| matches!(k, OutputKind::HtlcReceived(_)));
        verify(
            &sweep_one(&cm, i, r2.0.to_vec(), 0x31, 10, 0),
            &[spent_of(&cm, i)],
        );
        verify_fails(
            &sweep_one(&cm, i, r2.0.to_vec(), 0x31, 3, 0),
            &[spent_of(&cm, i)],
        );
        verify(
            &sweep_one(&cm, i, vec![], 0x32, 0xffff_fffe, 600),
            &[spent_of(&cm, i)],
        );
        verify_fails(
            &sweep_one(&cm, i, vec![], 0x32, 0xffff_fffe, 599),
            &[spent_of(&cm, i)],
        );
        verify(
            &sweep_one(&cm, i, rev.0.to_vec(), 0x32, 0xffff_fffe, 0),
            &[spent_of(&cm, i)],
        );
        // The other side's P2WPKH output.
        let i = index_of(&cm, |k| matches!(k, OutputKind::ToOther));
        let (op, out) = spent_of(&cm, i);
        let t = sweep_tx(
            &[SweepInput {
                outpoint: op,
                value: out.value,
                witness: SweepWitness::P2wpkh,
                sequence: Sequence::MAX,
                key: sk(0x32),
            }],
            p2wpkh(&pk(0x32)),
            500,
            LockTime::ZERO,
        )
        .unwrap();
        verify(&t, &[(op, out)]);
    }

    /// A signed commitment with HTLCs, the index of its owner's delayed output, and that
    /// output swept by the penalty branch (its revocation preimage).
    fn owner_output_revoked_and_swept() -> (Commitment, usize, Transaction) {
        let (c, _, _) = state_with_htlcs();
        let rev = Preimage([9; 32]);
        let cm = signed_commitment(&c, &rev);
        let i = index_of(&cm, |k| matches!(k, OutputKind::ToOwner));
        let swept = sweep_one(&cm, i, rev.0.to_vec(), 0x32, 0xffff_fffe, 0);
        (cm, i, swept)
    }

    #[test]
    fn sweep_weight_bounds_real_weight() {
        let (cm, i, t) = owner_output_revoked_and_swept();
        let est = sweep_weight(&[SweepInput {
            outpoint: OutPoint::null(),
            value: Amount::ZERO,
            witness: SweepWitness::Script {
                witness_script: cm.outputs[i].witness_script.clone(),
                secret: vec![],
            },
            sequence: Sequence::MAX,
            key: sk(1),
        }]);
        let real = t.weight().to_wu();
        assert!(
            est >= real && est <= real + 16,
            "estimate {est} real {real}"
        );
        assert!(sweep_tx(&[], p2wpkh(&pk(1)), 0, LockTime::ZERO).is_err());
    }

    /// A bumped claim pays its rate on its own signature, not on the last version's: an
    /// old signature shorter by 4 bytes (a whole vB; ECDSA's vary by up to 2) must not
    /// make the replacement cheaper per vB than asked. The watcher priced at the old
    /// version's own vsize until this test: 2,720 sats for 137 vB at 20 sat/vB.
    #[test]
    fn a_resigned_sweep_pays_its_rate_whatever_the_old_signature() {
        let (cm, i, old) = owner_output_revoked_and_swept();
        let mut short = old.clone();
        for input in &mut short.input {
            let mut items: Vec<Vec<u8>> = input.witness.iter().map(<[u8]>::to_vec).collect();
            let shorter = items[0].len() - 4;
            items[0].truncate(shorter);
            input.witness = Witness::from_slice(&items);
        }
        let (_, out) = spent_of(&cm, i);
        for priced in [&old, &short] {
            let vsize = resigned_vsize(priced).unwrap();
            let fee = 20 * vsize;
            let new = resign_sweep(priced, &[out.value], &sk(0x32), fee).unwrap();
            assert!(
                fee >= 20 * new.vsize() as u64,
                "{fee} sats for {} vB at 20 sat/vB",
                new.vsize()
            );
            verify(&new, &[spent_of(&cm, i)]);
        }
        let mut odd = old.clone();
        odd.input[0].witness = Witness::from_slice(&[[1u8; 3]]);
        assert!(resigned_vsize(&odd).is_err());
    }
}

#[cfg(test)]
mod weight_tests {
    use super::tests::{pk, sk};
    use super::*;
    use crate::funding::Who;
    use bitcoin::Txid;
    use wire::{Locktime, Preimage};

    fn signed_weight(c: &CState) -> u64 {
        let op = OutPoint {
            txid: Txid::from_byte_array([1; 32]),
            vout: 0,
        };
        let keys = CommitmentKeys {
            owner_final: pk(0x31),
            other_final: pk(0x32),
            delay_csv: 144,
            revocation_hash: Preimage([3; 32]).hash(),
        };
        let mut cm = commitment_tx(op, c, &keys, 1).unwrap();
        let script = anchor_script(&pk(0x21), &pk(0x22));
        let s1 = sign_anchor_spend(&cm.tx, &script, Amount::from_sat(c.anchor_sat), &sk(0x21));
        let s2 = sign_anchor_spend(&cm.tx, &script, Amount::from_sat(c.anchor_sat), &sk(0x22));
        finalize_anchor_spend(&mut cm.tx, &pk(0x21), &s1, &pk(0x22), &s2);
        cm.tx.weight().to_wu()
    }

    #[test]
    fn documented_commitment_weights() {
        let c = CState::initial(1_000_000, 10_000, true)
            .unwrap()
            .pay(Who::Us, 100_000_000)
            .unwrap();
        let base = signed_weight(&c);
        let h = Htlc {
            amount_msat: 5_000_000,
            r_hash: Preimage([4; 32]).hash(),
            expiry: Locktime::Blocks(900),
        };
        let one = signed_weight(&c.add_htlc(Who::Us, h).unwrap());
        // docs/channel.md: about 720 WU, +172 WU per HTLC output (signature lengths vary by a byte).
        assert!((715..=725).contains(&base), "base {base}");
        assert!(
            (170..=174).contains(&(one - base)),
            "per HTLC {}",
            one - base
        );
    }
}
