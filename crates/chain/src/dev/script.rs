//! A small script interpreter for what libbitcoinconsensus 25.1 cannot do:
//! Bitcoin Core 28's policy flags NULLFAIL, MINIMALIF and CLEANSTACK (the
//! library takes consensus flags only), and taproot (BIP341/342) spends,
//! which that version cannot verify at all.
//!
//! For legacy and segwit v0 scripts it runs after libbitcoinconsensus has
//! accepted the input, so it only has to find the policy violations. That
//! lets it skip most signature checks: a `CHECK(MULTI)SIGVERIFY` reached on
//! a script consensus accepted succeeded, and so did a `CHECK(MULTI)SIG`
//! whose result is the script's final stack top. Only a non-final,
//! non-`VERIFY` check with a non-empty signature is verified, because only
//! its failure is a NULLFAIL violation that consensus allows.
//!
//! For taproot it is the consensus check itself: key-path Schnorr
//! signatures, the control block's commitment, and tapscripts (every
//! tapscript opcode is modelled). A legacy or v0 script using an opcode
//! outside the modelled set is not judged ([`Checked::Unmodelled`]; a row in
//! `docs/chain.md`).

use std::sync::OnceLock;

use bitcoin::hashes::{hash160, ripemd160, sha1, sha256, sha256d, Hash as _};
use bitcoin::opcodes::all::*;
use bitcoin::opcodes::{Class, ClassifyContext, Opcode};
use bitcoin::script::Instruction;
use bitcoin::secp256k1::{self, Message, Secp256k1, VerifyOnly};
use bitcoin::sighash::{Annex, EcdsaSighashType, Prevouts, SighashCache, TapSighashType};
use bitcoin::taproot::{ControlBlock, LeafVersion, TapLeafHash};
use bitcoin::{Script, Transaction, TxOut};

/// Core's `MAX_SCRIPT_ELEMENT_SIZE`.
const MAX_ELEMENT_SIZE: usize = 520;
/// Core's `MAX_STACK_SIZE` (stack and altstack together).
const MAX_STACK_SIZE: usize = 1000;
/// Core's `MAX_PUBKEYS_PER_MULTISIG`.
const MAX_PUBKEYS_PER_MULTISIG: i64 = 20;
/// BIP342 `VALIDATION_WEIGHT_PER_SIGOP_PASSED`.
const WEIGHT_PER_SIGOP: i64 = 50;
/// BIP342 `VALIDATION_WEIGHT_OFFSET`.
const WEIGHT_OFFSET: i64 = 50;
/// BIP341 annex tag.
const ANNEX_TAG: u8 = 0x50;
/// Locktime values below this are block heights.
const LOCKTIME_THRESHOLD: i64 = 500_000_000;
/// BIP68 flags.
const SEQUENCE_DISABLE: i64 = 1 << 31;
const SEQUENCE_TYPE: i64 = 1 << 22;
const SEQUENCE_MASK: i64 = 0xffff;

/// Core's script errors this interpreter can raise, with Core's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptError {
    /// `SCRIPT_ERR_EVAL_FALSE`.
    EvalFalse,
    /// `SCRIPT_ERR_VERIFY`.
    Verify,
    /// `SCRIPT_ERR_EQUALVERIFY`.
    EqualVerify,
    /// `SCRIPT_ERR_CHECKSIGVERIFY`.
    CheckSigVerify,
    /// `SCRIPT_ERR_CHECKMULTISIGVERIFY`.
    CheckMultisigVerify,
    /// `SCRIPT_ERR_NUMEQUALVERIFY`.
    NumEqualVerify,
    /// `SCRIPT_ERR_PUSH_SIZE`.
    PushSize,
    /// `SCRIPT_ERR_STACK_SIZE`.
    StackSize,
    /// `SCRIPT_ERR_SIG_COUNT`.
    SigCount,
    /// `SCRIPT_ERR_PUBKEY_COUNT`.
    PubkeyCount,
    /// `SCRIPT_ERR_INVALID_STACK_OPERATION`.
    InvalidStackOperation,
    /// `SCRIPT_ERR_INVALID_ALTSTACK_OPERATION`.
    InvalidAltstackOperation,
    /// `SCRIPT_ERR_OP_RETURN`.
    OpReturn,
    /// `SCRIPT_ERR_UNBALANCED_CONDITIONAL`.
    UnbalancedConditional,
    /// `SCRIPT_ERR_NEGATIVE_LOCKTIME`.
    NegativeLocktime,
    /// `SCRIPT_ERR_UNSATISFIED_LOCKTIME`.
    UnsatisfiedLocktime,
    /// `SCRIPT_ERR_BAD_OPCODE`.
    BadOpcode,
    /// `SCRIPT_ERR_UNKNOWN_ERROR` (Core's answer to an oversized number).
    Unknown,
    /// `SCRIPT_ERR_SIG_NULLDUMMY`.
    NullDummy,
    /// `SCRIPT_ERR_PUBKEYTYPE`.
    PubkeyType,
    /// `SCRIPT_ERR_MINIMALIF` (policy, segwit v0).
    MinimalIf,
    /// `SCRIPT_ERR_TAPSCRIPT_MINIMALIF` (consensus in tapscript).
    TapscriptMinimalIf,
    /// `SCRIPT_ERR_SIG_NULLFAIL` (policy).
    NullFail,
    /// `SCRIPT_ERR_CLEANSTACK` (policy for legacy scripts, consensus in segwit).
    CleanStack,
    /// `SCRIPT_ERR_SCHNORR_SIG_SIZE`.
    SchnorrSigSize,
    /// `SCRIPT_ERR_SCHNORR_SIG_HASHTYPE`.
    SchnorrSigHashtype,
    /// `SCRIPT_ERR_SCHNORR_SIG`.
    SchnorrSig,
    /// `SCRIPT_ERR_TAPROOT_WRONG_CONTROL_SIZE`.
    TaprootWrongControlSize,
    /// `SCRIPT_ERR_WITNESS_PROGRAM_MISMATCH` (also a wrong taproot commitment).
    WitnessProgramMismatch,
    /// `SCRIPT_ERR_WITNESS_PROGRAM_WITNESS_EMPTY`.
    WitnessProgramWitnessEmpty,
    /// `SCRIPT_ERR_TAPSCRIPT_VALIDATION_WEIGHT`.
    TapscriptValidationWeight,
    /// `SCRIPT_ERR_TAPSCRIPT_CHECKMULTISIG`.
    TapscriptCheckMultisig,
    /// `SCRIPT_ERR_DISCOURAGE_OP_SUCCESS` (policy).
    DiscourageOpSuccess,
    /// `SCRIPT_ERR_DISCOURAGE_UPGRADABLE_TAPROOT_VERSION` (policy).
    DiscourageTaprootVersion,
    /// `SCRIPT_ERR_DISCOURAGE_UPGRADABLE_PUBKEYTYPE` (policy).
    DiscouragePubkeyType,
}

impl ScriptError {
    /// Core's `ScriptErrorString`.
    pub fn text(self) -> &'static str {
        use ScriptError::*;
        match self {
            EvalFalse => {
                "Script evaluated without error but finished with a false/empty top stack element"
            }
            Verify => "Script failed an OP_VERIFY operation",
            EqualVerify => "Script failed an OP_EQUALVERIFY operation",
            CheckSigVerify => "Script failed an OP_CHECKSIGVERIFY operation",
            CheckMultisigVerify => "Script failed an OP_CHECKMULTISIGVERIFY operation",
            NumEqualVerify => "Script failed an OP_NUMEQUALVERIFY operation",
            PushSize => "Push value size limit exceeded",
            StackSize => "Stack size limit exceeded",
            SigCount => "Signature count negative or greater than pubkey count",
            PubkeyCount => "Pubkey count negative or limit exceeded",
            InvalidStackOperation => "Operation not valid with the current stack size",
            InvalidAltstackOperation => "Operation not valid with the current altstack size",
            OpReturn => "OP_RETURN was encountered",
            UnbalancedConditional => "Invalid OP_IF construction",
            NegativeLocktime => "Negative locktime",
            UnsatisfiedLocktime => "Locktime requirement not satisfied",
            BadOpcode => "Opcode missing or not understood",
            Unknown => "unknown error",
            NullDummy => "Dummy CHECKMULTISIG argument must be zero",
            PubkeyType => "Public key is neither compressed or uncompressed",
            MinimalIf => "OP_IF/NOTIF argument must be minimal",
            TapscriptMinimalIf => "OP_IF/NOTIF argument must be minimal in tapscript",
            NullFail => "Signature must be zero for failed CHECK(MULTI)SIG operation",
            CleanStack => "Stack size must be exactly one after execution",
            SchnorrSigSize => "Invalid Schnorr signature size",
            SchnorrSigHashtype => "Invalid Schnorr signature hash type",
            SchnorrSig => "Invalid Schnorr signature",
            TaprootWrongControlSize => "Invalid Taproot control block size",
            WitnessProgramMismatch => "Witness program hash mismatch",
            WitnessProgramWitnessEmpty => "Witness program was passed an empty witness",
            TapscriptValidationWeight => "Too much signature validation relative to witness weight",
            TapscriptCheckMultisig => "OP_CHECKMULTISIG(VERIFY) is not available in tapscript",
            DiscourageOpSuccess => "OP_SUCCESSx reserved for soft-fork upgrades",
            DiscourageTaprootVersion => "Taproot version reserved for soft-fork upgrades",
            DiscouragePubkeyType => "Public key version reserved for soft-fork upgrades",
        }
    }

    /// Whether only policy (not consensus) forbids it, given where it was raised.
    pub fn policy_only(self) -> bool {
        use ScriptError::*;
        matches!(
            self,
            MinimalIf
                | NullFail
                | DiscourageOpSuccess
                | DiscourageTaprootVersion
                | DiscouragePubkeyType
        )
    }
}

/// How an input came through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// Every modelled rule holds.
    Passed,
    /// The script uses something this interpreter does not model (named);
    /// it is neither accepted nor refused by this check.
    Unmodelled(&'static str),
}

/// Why evaluation stopped early.
enum Halt {
    Error(ScriptError),
    Unmodelled(&'static str),
}

impl From<ScriptError> for Halt {
    fn from(e: ScriptError) -> Self {
        Halt::Error(e)
    }
}

type Eval<T> = Result<T, Halt>;

/// Which rules a script runs under (Core's `SigVersion`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SigVersion {
    Base,
    WitnessV0,
    Tapscript,
}

fn secp() -> &'static Secp256k1<VerifyOnly> {
    static SECP: OnceLock<Secp256k1<VerifyOnly>> = OnceLock::new();
    SECP.get_or_init(Secp256k1::verification_only)
}

/// One transaction being checked, with its spent outputs and a sighash cache
/// shared by its inputs.
pub struct TxChecker<'a> {
    tx: &'a Transaction,
    prevouts: Vec<TxOut>,
    cache: SighashCache<&'a Transaction>,
    /// Whether policy-only rules apply (mempool) or consensus only (blocks).
    policy: bool,
}

impl<'a> TxChecker<'a> {
    /// `prevouts[i]` is the output input `i` spends.
    pub fn new(tx: &'a Transaction, prevouts: Vec<TxOut>, policy: bool) -> Self {
        Self {
            tx,
            prevouts,
            cache: SighashCache::new(tx),
            policy,
        }
    }

    /// Taproot (witness v1, 32-byte program, not P2SH-wrapped) spend of
    /// input `index`: the consensus check libbitcoinconsensus 25.1 lacks,
    /// plus Core's taproot policy flags when `policy` is set.
    ///
    /// # Errors
    /// Core's script error.
    pub fn check_taproot(&mut self, index: usize) -> Result<Checked, ScriptError> {
        let Some(input) = self.tx.input.get(index) else {
            return Ok(Checked::Unmodelled("input index"));
        };
        let Some(spk) = self.prevouts.get(index).map(|o| o.script_pubkey.clone()) else {
            return Ok(Checked::Unmodelled("input index"));
        };
        let program = &spk.as_bytes()[2..];
        let mut stack: Vec<&[u8]> = input.witness.iter().collect();
        if stack.is_empty() {
            return Err(ScriptError::WitnessProgramWitnessEmpty);
        }
        let annex = match stack.last() {
            Some(last) if stack.len() >= 2 && last.first() == Some(&ANNEX_TAG) => {
                let a = *last;
                stack.pop();
                Annex::new(a).ok()
            }
            _ => None,
        };
        if stack.len() == 1 {
            // Key path: one Schnorr signature by the output key.
            return self
                .check_schnorr(index, stack[0], program, annex, None)
                .map(|()| Checked::Passed);
        }
        // Script path.
        let control = stack.pop().unwrap_or_default();
        let script = Script::from_bytes(stack.pop().unwrap_or_default());
        if control.len() < 33 || (control.len() - 33) % 32 != 0 || control.len() > 33 + 32 * 128 {
            return Err(ScriptError::TaprootWrongControlSize);
        }
        let committed = match (
            ControlBlock::decode(control),
            secp256k1::XOnlyPublicKey::from_slice(program),
        ) {
            (Ok(cb), Ok(output_key)) => cb.verify_taproot_commitment(secp(), output_key, script),
            _ => false,
        };
        if !committed {
            return Err(ScriptError::WitnessProgramMismatch);
        }
        if control[0] & 0xfe != 0xc0 {
            // An unknown leaf version is anyone-can-spend by consensus.
            return if self.policy {
                Err(ScriptError::DiscourageTaprootVersion)
            } else {
                Ok(Checked::Passed)
            };
        }
        // OP_SUCCESSx makes the script succeed before it runs, even when
        // what follows it does not decode (Core scans op by op).
        for ins in script.instructions() {
            match ins {
                Ok(Instruction::Op(c))
                    if c.classify(ClassifyContext::TapScript) == Class::SuccessOp =>
                {
                    return if self.policy {
                        Err(ScriptError::DiscourageOpSuccess)
                    } else {
                        Ok(Checked::Passed)
                    };
                }
                Ok(_) => {}
                Err(_) => return Err(ScriptError::BadOpcode),
            }
        }
        let ops = match decode(script, SigVersion::Tapscript) {
            Ok(ops) => ops,
            Err(Halt::Error(e)) => return Err(e),
            Err(Halt::Unmodelled(what)) => return Ok(Checked::Unmodelled(what)),
        };
        if stack.len() > MAX_STACK_SIZE {
            return Err(ScriptError::StackSize);
        }
        if stack.iter().any(|e| e.len() > MAX_ELEMENT_SIZE) {
            return Err(ScriptError::PushSize);
        }
        let leaf = TapLeafHash::from_script(script, LeafVersion::TapScript);
        let budget = input.witness.size() as i64 + WEIGHT_OFFSET;
        let mut machine = Machine {
            checker: self,
            index,
            version: SigVersion::Tapscript,
            script_code: script,
            leaf: Some(leaf),
            annex: annex.map(|a| a.as_bytes().to_vec()),
            budget,
            codesep_pos: u32::MAX,
            seen_codesep: false,
            stack: stack.iter().map(|e| e.to_vec()).collect(),
            assume_final: false,
        };
        match machine.run(&ops) {
            Ok(()) => {}
            Err(Halt::Error(e)) => return Err(e),
            Err(Halt::Unmodelled(what)) => return Ok(Checked::Unmodelled(what)),
        }
        finish_witness(&machine.stack).map(|()| Checked::Passed)
    }

    /// Core's policy flags NULLFAIL, MINIMALIF and CLEANSTACK on a legacy or
    /// segwit v0 input that libbitcoinconsensus has already accepted.
    ///
    /// # Errors
    /// Core's script error (policy only, since consensus passed).
    pub fn check_policy(&mut self, index: usize) -> Result<Checked, ScriptError> {
        match self.policy_inner(index) {
            Ok(()) => Ok(Checked::Passed),
            Err(Halt::Error(e)) => Err(e),
            Err(Halt::Unmodelled(what)) => Ok(Checked::Unmodelled(what)),
        }
    }

    fn policy_inner(&mut self, index: usize) -> Eval<()> {
        let tx = self.tx;
        let input = tx.input.get(index).ok_or(Halt::Unmodelled("input index"))?;
        let spk = self
            .prevouts
            .get(index)
            .ok_or(Halt::Unmodelled("input index"))?
            .script_pubkey
            .clone();
        if spk.is_p2wpkh() || spk.is_p2tr() {
            // P2WPKH ends in its only CHECKSIG and has no IF: consensus
            // already implies all three flags. Taproot is checked apart.
            return Ok(());
        }
        if spk.is_witness_program() {
            if spk.is_p2wsh() {
                return self.run_witness_v0(index);
            }
            return Ok(()); // unknown witness versions: not modelled here
        }
        // Legacy: scriptSig (push-only, checked by standardness) builds the stack.
        let mut stack: Vec<Vec<u8>> = Vec::new();
        for ins in input.script_sig.instructions() {
            match ins {
                Ok(Instruction::PushBytes(p)) => stack.push(p.as_bytes().to_vec()),
                Ok(Instruction::Op(op)) => match small_int(op) {
                    Some(n) => stack.push(encode_num(n)),
                    None => return Err(Halt::Unmodelled("non-push scriptSig")),
                },
                Err(_) => return Err(Halt::Unmodelled("undecodable scriptSig")),
            }
        }
        let p2sh_stack = spk.is_p2sh().then(|| stack.clone());
        let mut stack = self.run_legacy(index, &spk, stack)?;
        if let Some(mut redeem_stack) = p2sh_stack {
            let Some(redeem) = redeem_stack.pop() else {
                return Ok(());
            };
            let redeem = Script::from_bytes(&redeem);
            if redeem.is_witness_program() {
                if redeem.is_p2wsh() {
                    return self.run_witness_v0(index);
                }
                return Ok(()); // P2SH-P2WPKH as P2WPKH; others not modelled
            }
            stack = self.run_legacy(index, redeem, redeem_stack)?;
        }
        if stack.len() != 1 {
            return Err(ScriptError::CleanStack.into());
        }
        Ok(())
    }

    fn run_legacy(
        &mut self,
        index: usize,
        script: &Script,
        stack: Vec<Vec<u8>>,
    ) -> Eval<Vec<Vec<u8>>> {
        let ops = decode(script, SigVersion::Base)?;
        let mut machine = Machine {
            checker: self,
            index,
            version: SigVersion::Base,
            script_code: script,
            leaf: None,
            annex: None,
            budget: 0,
            codesep_pos: u32::MAX,
            seen_codesep: false,
            stack,
            assume_final: true,
        };
        machine.run(&ops)?;
        Ok(machine.stack)
    }

    fn run_witness_v0(&mut self, index: usize) -> Eval<()> {
        let tx = self.tx;
        let witness = &tx.input[index].witness;
        let items: Vec<&[u8]> = witness.iter().collect();
        let Some((script, rest)) = items.split_last() else {
            return Ok(());
        };
        let script = Script::from_bytes(script);
        let ops = decode(script, SigVersion::WitnessV0)?;
        let mut machine = Machine {
            checker: self,
            index,
            version: SigVersion::WitnessV0,
            script_code: script,
            leaf: None,
            annex: None,
            budget: 0,
            codesep_pos: u32::MAX,
            seen_codesep: false,
            stack: rest.iter().map(|e| e.to_vec()).collect(),
            assume_final: true,
        };
        machine.run(&ops)
    }

    /// BIP340/341 signature check of `sig` by `key` (key path when `leaf` is None).
    fn check_schnorr(
        &mut self,
        index: usize,
        sig: &[u8],
        key: &[u8],
        annex: Option<Annex>,
        leaf: Option<(TapLeafHash, u32)>,
    ) -> Result<(), ScriptError> {
        let (sig64, hash_type) = match sig.len() {
            64 => (sig, TapSighashType::Default),
            65 => {
                if sig[64] == 0 {
                    return Err(ScriptError::SchnorrSigHashtype);
                }
                let t = TapSighashType::from_consensus_u8(sig[64])
                    .map_err(|_| ScriptError::SchnorrSigHashtype)?;
                (&sig[..64], t)
            }
            _ => return Err(ScriptError::SchnorrSigSize),
        };
        let sighash = self
            .cache
            .taproot_signature_hash(
                index,
                &Prevouts::All(&self.prevouts),
                annex,
                leaf,
                hash_type,
            )
            .map_err(|_| ScriptError::SchnorrSigHashtype)?;
        // As Core: a key that is not on the curve fails like a bad signature,
        // after the size and hash type checks.
        let key =
            secp256k1::XOnlyPublicKey::from_slice(key).map_err(|_| ScriptError::SchnorrSig)?;
        let signature = secp256k1::schnorr::Signature::from_slice(sig64)
            .map_err(|_| ScriptError::SchnorrSig)?;
        let msg = Message::from_digest(sighash.to_byte_array());
        secp()
            .verify_schnorr(&signature, &msg, &key)
            .map_err(|_| ScriptError::SchnorrSig)
    }

    /// ECDSA check for legacy and segwit v0 (Core's `CheckECDSASignature`).
    fn check_ecdsa(
        &mut self,
        index: usize,
        version: SigVersion,
        script_code: &Script,
        sig: &[u8],
        key: &[u8],
    ) -> Eval<bool> {
        let Some((&hash_type, der)) = sig.split_last() else {
            return Ok(false);
        };
        let Ok(key) = secp256k1::PublicKey::from_slice(key) else {
            return Ok(false);
        };
        let Ok(mut signature) = secp256k1::ecdsa::Signature::from_der_lax(der) else {
            return Ok(false);
        };
        signature.normalize_s();
        let digest = match version {
            SigVersion::WitnessV0 => {
                let t = EcdsaSighashType::from_standard(u32::from(hash_type))
                    .map_err(|_| Halt::Unmodelled("non-standard sighash type"))?;
                let value = self.prevouts[index].value;
                self.cache
                    .p2wsh_signature_hash(index, script_code, value, t)
                    .map_err(|_| Halt::Unmodelled("sighash"))?
                    .to_byte_array()
            }
            _ => {
                // Core's FindAndDelete of the signature from the script code.
                if contains_push(script_code, sig) {
                    return Err(Halt::Unmodelled("signature inside its script code"));
                }
                self.cache
                    .legacy_signature_hash(index, script_code, u32::from(hash_type))
                    .map_err(|_| Halt::Unmodelled("sighash"))?
                    .to_byte_array()
            }
        };
        let msg = Message::from_digest(digest);
        Ok(secp().verify_ecdsa(&msg, &signature, &key).is_ok())
    }
}

/// Segwit's implicit clean stack and true result (consensus).
fn finish_witness(stack: &[Vec<u8>]) -> Result<(), ScriptError> {
    if stack.len() != 1 {
        return Err(ScriptError::CleanStack);
    }
    if !cast_to_bool(&stack[0]) {
        return Err(ScriptError::EvalFalse);
    }
    Ok(())
}

fn contains_push(script: &Script, data: &[u8]) -> bool {
    script
        .instructions()
        .flatten()
        .any(|i| matches!(i, Instruction::PushBytes(p) if p.as_bytes() == data))
}

/// A decoded instruction.
#[derive(Debug, Clone)]
enum Op {
    Push(Vec<u8>),
    Code(Opcode),
}

fn decode(script: &Script, version: SigVersion) -> Eval<Vec<Op>> {
    let mut ops = Vec::new();
    for ins in script.instructions() {
        match ins {
            Ok(Instruction::PushBytes(p)) => ops.push(Op::Push(p.as_bytes().to_vec())),
            Ok(Instruction::Op(op)) => ops.push(Op::Code(op)),
            Err(_) if version == SigVersion::Tapscript => {
                return Err(ScriptError::BadOpcode.into());
            }
            Err(_) => return Err(Halt::Unmodelled("undecodable script")),
        }
    }
    Ok(ops)
}

fn small_int(op: Opcode) -> Option<i64> {
    let b = op.to_u8();
    if b == OP_PUSHNUM_NEG1.to_u8() {
        Some(-1)
    } else if (OP_PUSHNUM_1.to_u8()..=OP_PUSHNUM_16.to_u8()).contains(&b) {
        Some(i64::from(b - OP_PUSHNUM_1.to_u8()) + 1)
    } else {
        None
    }
}

/// Core's `CastToBool`: any non-zero byte, except a lone sign bit at the end.
fn cast_to_bool(v: &[u8]) -> bool {
    for (i, b) in v.iter().enumerate() {
        if *b != 0 {
            return !(i == v.len() - 1 && *b == 0x80);
        }
    }
    false
}

/// `CScriptNum` decoding (not requiring minimal encoding: MINIMALDATA is not modelled).
fn decode_num(v: &[u8], max_len: usize) -> Result<i64, ScriptError> {
    if v.len() > max_len {
        return Err(ScriptError::Unknown);
    }
    let Some(&last) = v.last() else {
        return Ok(0);
    };
    let mut n: i64 = 0;
    for (i, b) in v.iter().enumerate() {
        n |= i64::from(*b) << (8 * i);
    }
    if last & 0x80 != 0 {
        let mask = !(0x80_i64 << (8 * (v.len() - 1)));
        Ok(-(n & mask))
    } else {
        Ok(n)
    }
}

/// `CScriptNum::serialize`.
fn encode_num(n: i64) -> Vec<u8> {
    if n == 0 {
        return Vec::new();
    }
    let neg = n < 0;
    let mut abs = n.unsigned_abs();
    let mut out = Vec::with_capacity(9);
    while abs > 0 {
        out.push((abs & 0xff) as u8);
        abs >>= 8;
    }
    if out.last().is_some_and(|b| b & 0x80 != 0) {
        out.push(if neg { 0x80 } else { 0 });
    } else if neg {
        if let Some(b) = out.last_mut() {
            *b |= 0x80;
        }
    }
    out
}

fn encode_bool(b: bool) -> Vec<u8> {
    if b {
        vec![1]
    } else {
        Vec::new()
    }
}

/// Whether the instruction after `pos` leaves the stack as it is until the
/// end of the script (only `ENDIF`s, and `ELSE` branches that are skipped),
/// so the value `pos` pushes is the script's final top.
fn is_tail(ops: &[Op], pos: usize) -> bool {
    let is = |k: usize, c: Opcode| matches!(&ops[k], Op::Code(o) if *o == c);
    let mut k = pos + 1;
    while k < ops.len() {
        if is(k, OP_ENDIF) {
            k += 1;
        } else if is(k, OP_ELSE) {
            // Skip to the matching ENDIF; a second ELSE would execute again.
            let mut depth = 0usize;
            k += 1;
            loop {
                if k >= ops.len() {
                    return false;
                }
                if is(k, OP_IF) || is(k, OP_NOTIF) {
                    depth += 1;
                } else if is(k, OP_ELSE) && depth == 0 {
                    return false;
                } else if is(k, OP_ENDIF) {
                    if depth == 0 {
                        break;
                    }
                    depth -= 1;
                }
                k += 1;
            }
            k += 1;
        } else {
            return false;
        }
    }
    true
}

struct Machine<'c, 'a, 's> {
    checker: &'c mut TxChecker<'a>,
    index: usize,
    version: SigVersion,
    script_code: &'s Script,
    leaf: Option<TapLeafHash>,
    annex: Option<Vec<u8>>,
    budget: i64,
    codesep_pos: u32,
    seen_codesep: bool,
    stack: Vec<Vec<u8>>,
    /// Consensus accepted this script: a signature check whose failure
    /// would fail the script is known to have succeeded.
    assume_final: bool,
}

impl Machine<'_, '_, '_> {
    fn pop(&mut self) -> Result<Vec<u8>, ScriptError> {
        self.stack.pop().ok_or(ScriptError::InvalidStackOperation)
    }

    fn top(&self, depth: usize) -> Result<&Vec<u8>, ScriptError> {
        let n = self.stack.len();
        if depth == 0 || depth > n {
            return Err(ScriptError::InvalidStackOperation);
        }
        Ok(&self.stack[n - depth])
    }

    fn need(&self, n: usize) -> Result<(), ScriptError> {
        if self.stack.len() < n {
            Err(ScriptError::InvalidStackOperation)
        } else {
            Ok(())
        }
    }

    fn pop_num(&mut self) -> Result<i64, ScriptError> {
        let v = self.pop()?;
        decode_num(&v, 4)
    }

    fn run(&mut self, ops: &[Op]) -> Eval<()> {
        let mut exec: Vec<bool> = Vec::new();
        let mut alt: Vec<Vec<u8>> = Vec::new();
        for (pos, op) in ops.iter().enumerate() {
            let executing = exec.iter().all(|b| *b);
            let code = match op {
                Op::Push(data) => {
                    if data.len() > MAX_ELEMENT_SIZE {
                        return Err(ScriptError::PushSize.into());
                    }
                    if executing {
                        self.stack.push(data.clone());
                    }
                    self.check_size(&alt)?;
                    continue;
                }
                Op::Code(c) => *c,
            };
            if code == OP_VERIF || code == OP_VERNOTIF {
                // Between OP_IF and OP_ENDIF in value, so Core's interpreter
                // looks at them even in an unexecuted branch: always bad.
                return Err(ScriptError::BadOpcode.into());
            }
            if code == OP_IF || code == OP_NOTIF {
                let mut value = false;
                if executing {
                    let v = self.pop()?;
                    if self.version != SigVersion::Base
                        && (v.len() > 1 || (v.len() == 1 && v[0] != 1))
                    {
                        return Err(if self.version == SigVersion::Tapscript {
                            ScriptError::TapscriptMinimalIf
                        } else {
                            ScriptError::MinimalIf
                        }
                        .into());
                    }
                    value = cast_to_bool(&v) == (code == OP_IF);
                }
                exec.push(value);
                continue;
            }
            if code == OP_ELSE {
                let last = exec.last_mut().ok_or(ScriptError::UnbalancedConditional)?;
                *last = !*last;
                continue;
            }
            if code == OP_ENDIF {
                exec.pop().ok_or(ScriptError::UnbalancedConditional)?;
                continue;
            }
            if code == OP_CODESEPARATOR {
                // Positions count every opcode; only an executed separator moves it.
                if executing {
                    self.codesep_pos = pos as u32;
                    self.seen_codesep = true;
                }
                continue;
            }
            if !executing {
                continue;
            }
            self.step(code, pos, ops, &mut alt)?;
            self.check_size(&alt)?;
        }
        if !exec.is_empty() {
            return Err(ScriptError::UnbalancedConditional.into());
        }
        Ok(())
    }

    fn check_size(&self, alt: &[Vec<u8>]) -> Result<(), ScriptError> {
        if self.stack.len() + alt.len() > MAX_STACK_SIZE {
            Err(ScriptError::StackSize)
        } else {
            Ok(())
        }
    }

    fn step(&mut self, code: Opcode, pos: usize, ops: &[Op], alt: &mut Vec<Vec<u8>>) -> Eval<()> {
        use ScriptError as E;
        if let Some(n) = small_int(code) {
            self.stack.push(encode_num(n));
            return Ok(());
        }
        match code {
            OP_NOP | OP_NOP1 | OP_NOP4 | OP_NOP5 | OP_NOP6 | OP_NOP7 | OP_NOP8 | OP_NOP9
            | OP_NOP10 => {}
            OP_VERIFY => {
                if !cast_to_bool(&self.pop()?) {
                    return Err(E::Verify.into());
                }
            }
            OP_RETURN => return Err(E::OpReturn.into()),
            OP_CLTV => self.check_locktime()?,
            OP_CSV => self.check_sequence()?,
            OP_TOALTSTACK => alt.push(self.pop()?),
            OP_FROMALTSTACK => {
                let v = alt.pop().ok_or(E::InvalidAltstackOperation)?;
                self.stack.push(v);
            }
            OP_2DROP => {
                self.need(2)?;
                self.stack.truncate(self.stack.len() - 2);
            }
            OP_2DUP => {
                let (a, b) = (self.top(2)?.clone(), self.top(1)?.clone());
                self.stack.push(a);
                self.stack.push(b);
            }
            OP_3DUP => {
                let (a, b, c) = (
                    self.top(3)?.clone(),
                    self.top(2)?.clone(),
                    self.top(1)?.clone(),
                );
                self.stack.extend([a, b, c]);
            }
            OP_2OVER => {
                let (a, b) = (self.top(4)?.clone(), self.top(3)?.clone());
                self.stack.extend([a, b]);
            }
            OP_2ROT => {
                self.need(6)?;
                let n = self.stack.len();
                let moved: Vec<Vec<u8>> = self.stack.drain(n - 6..n - 4).collect();
                self.stack.extend(moved);
            }
            OP_2SWAP => {
                self.need(4)?;
                let n = self.stack.len();
                self.stack.swap(n - 4, n - 2);
                self.stack.swap(n - 3, n - 1);
            }
            OP_IFDUP => {
                let v = self.top(1)?.clone();
                if cast_to_bool(&v) {
                    self.stack.push(v);
                }
            }
            OP_DEPTH => self.stack.push(encode_num(self.stack.len() as i64)),
            OP_DROP => {
                self.pop()?;
            }
            OP_DUP => {
                let v = self.top(1)?.clone();
                self.stack.push(v);
            }
            OP_NIP => {
                self.need(2)?;
                let n = self.stack.len();
                self.stack.remove(n - 2);
            }
            OP_OVER => {
                let v = self.top(2)?.clone();
                self.stack.push(v);
            }
            OP_PICK | OP_ROLL => {
                self.need(2)?;
                let k = self.pop_num()?;
                if k < 0 || k as usize >= self.stack.len() {
                    return Err(E::InvalidStackOperation.into());
                }
                let at = self.stack.len() - 1 - k as usize;
                let v = if code == OP_ROLL {
                    self.stack.remove(at)
                } else {
                    self.stack[at].clone()
                };
                self.stack.push(v);
            }
            OP_ROT => {
                self.need(3)?;
                let n = self.stack.len();
                let v = self.stack.remove(n - 3);
                self.stack.push(v);
            }
            OP_SWAP => {
                self.need(2)?;
                let n = self.stack.len();
                self.stack.swap(n - 2, n - 1);
            }
            OP_TUCK => {
                self.need(2)?;
                let v = self.top(1)?.clone();
                let n = self.stack.len();
                self.stack.insert(n - 2, v);
            }
            OP_SIZE => {
                let n = self.top(1)?.len() as i64;
                self.stack.push(encode_num(n));
            }
            OP_EQUAL | OP_EQUALVERIFY => {
                let (b, a) = (self.pop()?, self.pop()?);
                let equal = a == b;
                if code == OP_EQUALVERIFY {
                    if !equal {
                        return Err(E::EqualVerify.into());
                    }
                } else {
                    self.stack.push(encode_bool(equal));
                }
            }
            OP_1ADD | OP_1SUB | OP_NEGATE | OP_ABS | OP_NOT | OP_0NOTEQUAL => {
                let a = self.pop_num()?;
                let r = match code {
                    OP_1ADD => a + 1,
                    OP_1SUB => a - 1,
                    OP_NEGATE => -a,
                    OP_ABS => a.abs(),
                    OP_NOT => i64::from(a == 0),
                    _ => i64::from(a != 0),
                };
                self.stack.push(encode_num(r));
            }
            OP_ADD
            | OP_SUB
            | OP_BOOLAND
            | OP_BOOLOR
            | OP_NUMEQUAL
            | OP_NUMEQUALVERIFY
            | OP_NUMNOTEQUAL
            | OP_LESSTHAN
            | OP_GREATERTHAN
            | OP_LESSTHANOREQUAL
            | OP_GREATERTHANOREQUAL
            | OP_MIN
            | OP_MAX => {
                self.need(2)?;
                let b = self.pop_num()?;
                let a = self.pop_num()?;
                let r = match code {
                    OP_ADD => a + b,
                    OP_SUB => a - b,
                    OP_BOOLAND => i64::from(a != 0 && b != 0),
                    OP_BOOLOR => i64::from(a != 0 || b != 0),
                    OP_NUMEQUAL | OP_NUMEQUALVERIFY => i64::from(a == b),
                    OP_NUMNOTEQUAL => i64::from(a != b),
                    OP_LESSTHAN => i64::from(a < b),
                    OP_GREATERTHAN => i64::from(a > b),
                    OP_LESSTHANOREQUAL => i64::from(a <= b),
                    OP_GREATERTHANOREQUAL => i64::from(a >= b),
                    OP_MIN => a.min(b),
                    _ => a.max(b),
                };
                if code == OP_NUMEQUALVERIFY {
                    if r == 0 {
                        return Err(E::NumEqualVerify.into());
                    }
                } else {
                    self.stack.push(encode_num(r));
                }
            }
            OP_WITHIN => {
                self.need(3)?;
                let max = self.pop_num()?;
                let min = self.pop_num()?;
                let x = self.pop_num()?;
                self.stack.push(encode_bool(min <= x && x < max));
            }
            OP_RIPEMD160 | OP_SHA1 | OP_SHA256 | OP_HASH160 | OP_HASH256 => {
                let v = self.pop()?;
                let h = match code {
                    OP_RIPEMD160 => ripemd160::Hash::hash(&v).to_byte_array().to_vec(),
                    OP_SHA1 => sha1::Hash::hash(&v).to_byte_array().to_vec(),
                    OP_SHA256 => sha256::Hash::hash(&v).to_byte_array().to_vec(),
                    OP_HASH160 => hash160::Hash::hash(&v).to_byte_array().to_vec(),
                    _ => sha256d::Hash::hash(&v).to_byte_array().to_vec(),
                };
                self.stack.push(h);
            }
            OP_CHECKSIG | OP_CHECKSIGVERIFY => {
                self.need(2)?;
                let key = self.pop()?;
                let sig = self.pop()?;
                let verify = code == OP_CHECKSIGVERIFY;
                let ok = self.checksig(&sig, &key, verify || is_tail(ops, pos))?;
                if verify {
                    if !ok {
                        return Err(E::CheckSigVerify.into());
                    }
                } else {
                    self.stack.push(encode_bool(ok));
                }
            }
            OP_CHECKSIGADD => {
                if self.version != SigVersion::Tapscript {
                    return Err(E::BadOpcode.into());
                }
                self.need(3)?;
                let key = self.pop()?;
                let n = self.pop_num()?;
                let sig = self.pop()?;
                let ok = self.checksig(&sig, &key, false)?;
                self.stack.push(encode_num(n + i64::from(ok)));
            }
            OP_CHECKMULTISIG | OP_CHECKMULTISIGVERIFY => {
                if self.version == SigVersion::Tapscript {
                    return Err(E::TapscriptCheckMultisig.into());
                }
                let verify = code == OP_CHECKMULTISIGVERIFY;
                let ok = self.checkmultisig(verify || is_tail(ops, pos))?;
                if verify {
                    if !ok {
                        return Err(E::CheckMultisigVerify.into());
                    }
                } else {
                    self.stack.push(encode_bool(ok));
                }
            }
            // Every tapscript opcode that is not OP_SUCCESSx is modelled but
            // OP_INVALIDOPCODE, which Core refuses when executed.
            _ if self.version == SigVersion::Tapscript => {
                return Err(E::BadOpcode.into());
            }
            _ => return Err(Halt::Unmodelled("opcode outside the modelled set")),
        }
        Ok(())
    }

    /// Core's CHECKSIG for the current rules; `known_ok`: consensus passed
    /// and a false result would have failed the script.
    fn checksig(&mut self, sig: &[u8], key: &[u8], known_ok: bool) -> Eval<bool> {
        if self.version == SigVersion::Tapscript {
            if !sig.is_empty() {
                self.budget -= WEIGHT_PER_SIGOP;
                if self.budget < 0 {
                    return Err(ScriptError::TapscriptValidationWeight.into());
                }
            }
            if key.is_empty() {
                return Err(ScriptError::PubkeyType.into());
            }
            if key.len() == 32 {
                if !sig.is_empty() {
                    let annex = self.annex.clone();
                    let annex = annex.as_deref().and_then(|a| Annex::new(a).ok());
                    let leaf = self.leaf.map(|l| (l, self.codesep_pos));
                    self.checker
                        .check_schnorr(self.index, sig, key, annex, leaf)?;
                }
            } else if self.checker.policy {
                return Err(ScriptError::DiscouragePubkeyType.into());
            }
            return Ok(!sig.is_empty());
        }
        if sig.is_empty() {
            return Ok(false);
        }
        if known_ok && self.assume_final {
            return Ok(true);
        }
        if self.seen_codesep {
            return Err(Halt::Unmodelled(
                "OP_CODESEPARATOR before a signature check",
            ));
        }
        let ok = self
            .checker
            .check_ecdsa(self.index, self.version, self.script_code, sig, key)?;
        if !ok {
            return Err(ScriptError::NullFail.into());
        }
        Ok(true)
    }

    /// Core's CHECKMULTISIG: pops its arguments, answers the result.
    fn checkmultisig(&mut self, known_ok: bool) -> Eval<bool> {
        use ScriptError as E;
        let n = self.stack.len();
        let mut i = 1usize;
        let keys = decode_num(self.top(i)?, 4)?;
        if !(0..=MAX_PUBKEYS_PER_MULTISIG).contains(&keys) {
            return Err(E::PubkeyCount.into());
        }
        let mut keys = keys as usize;
        i += 1;
        let mut ikey = i;
        i += keys;
        if n < i {
            return Err(E::InvalidStackOperation.into());
        }
        let sigs = decode_num(self.top(i)?, 4)?;
        if sigs < 0 || sigs as usize > keys {
            return Err(E::SigCount.into());
        }
        let mut sigs = sigs as usize;
        i += 1;
        let mut isig = i;
        i += sigs;
        if n < i {
            // No room for the dummy element.
            return Err(E::InvalidStackOperation.into());
        }
        let sig_items: Vec<Vec<u8>> = (isig..isig + sigs)
            .map(|d| self.stack[n - d].clone())
            .collect();
        let mut success = true;
        if known_ok && self.assume_final {
            // Consensus passed and a false result would have failed it.
        } else if self.seen_codesep && sig_items.iter().any(|s| !s.is_empty()) {
            return Err(Halt::Unmodelled(
                "OP_CODESEPARATOR before a signature check",
            ));
        } else {
            while success && sigs > 0 {
                let sig = self.stack[n - isig].clone();
                let key = self.stack[n - ikey].clone();
                let ok = !sig.is_empty()
                    && self.checker.check_ecdsa(
                        self.index,
                        self.version,
                        self.script_code,
                        &sig,
                        &key,
                    )?;
                if ok {
                    isig += 1;
                    sigs -= 1;
                }
                ikey += 1;
                keys -= 1;
                if sigs > keys {
                    success = false;
                }
            }
        }
        if !success && sig_items.iter().any(|s| !s.is_empty()) {
            return Err(E::NullFail.into());
        }
        // Pop counts, keys and signatures, then the dummy (NULLDUMMY is consensus).
        self.stack.truncate(n - (i - 1));
        let dummy = self.pop()?;
        if !dummy.is_empty() {
            return Err(E::NullDummy.into());
        }
        Ok(success)
    }

    fn check_locktime(&mut self) -> Result<(), ScriptError> {
        let lock = decode_num(self.top(1)?, 5)?;
        if lock < 0 {
            return Err(ScriptError::NegativeLocktime);
        }
        let tx = self.checker.tx;
        let tx_lock = i64::from(tx.lock_time.to_consensus_u32());
        let same_kind = (tx_lock < LOCKTIME_THRESHOLD) == (lock < LOCKTIME_THRESHOLD);
        let final_input = tx.input[self.index].sequence.0 == u32::MAX;
        if !same_kind || lock > tx_lock || final_input {
            return Err(ScriptError::UnsatisfiedLocktime);
        }
        Ok(())
    }

    fn check_sequence(&mut self) -> Result<(), ScriptError> {
        let seq = decode_num(self.top(1)?, 5)?;
        if seq < 0 {
            return Err(ScriptError::NegativeLocktime);
        }
        if seq & SEQUENCE_DISABLE != 0 {
            return Ok(());
        }
        let tx = self.checker.tx;
        let tx_seq = i64::from(tx.input[self.index].sequence.0);
        let mask = SEQUENCE_TYPE | SEQUENCE_MASK;
        let ok = tx.version.0 >= 2
            && tx_seq & SEQUENCE_DISABLE == 0
            && (tx_seq & SEQUENCE_TYPE) == (seq & SEQUENCE_TYPE)
            && (seq & mask) <= (tx_seq & mask);
        if ok {
            Ok(())
        } else {
            Err(ScriptError::UnsatisfiedLocktime)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_trip_as_core_encodes_them() {
        for (n, bytes) in [
            (0i64, vec![]),
            (1, vec![1]),
            (-1, vec![0x81]),
            (127, vec![0x7f]),
            (128, vec![0x80, 0]),
            (-128, vec![0x80, 0x80]),
            (255, vec![0xff, 0]),
            (256, vec![0, 1]),
            (-255, vec![0xff, 0x80]),
        ] {
            assert_eq!(encode_num(n), bytes, "{n}");
            assert_eq!(decode_num(&bytes, 4), Ok(n), "{n}");
        }
        assert_eq!(decode_num(&[1, 2, 3, 4, 5], 4), Err(ScriptError::Unknown));
        assert_eq!(decode_num(&[1, 2, 3, 4, 5], 5), Ok(0x05_0403_0201));
    }

    #[test]
    fn truth_is_any_non_zero_byte_but_negative_zero() {
        assert!(!cast_to_bool(&[]));
        assert!(!cast_to_bool(&[0, 0]));
        assert!(!cast_to_bool(&[0, 0x80]));
        assert!(cast_to_bool(&[0x80, 0]));
        assert!(cast_to_bool(&[2]));
    }

    #[test]
    fn tail_positions_follow_skipped_else_branches() {
        let s = |c| Op::Code(c);
        // IF <k> CHECKSIG ELSE <k> CHECKSIG ENDIF
        let ops = vec![
            s(OP_IF),
            Op::Push(vec![2; 33]),
            s(OP_CHECKSIG),
            s(OP_ELSE),
            Op::Push(vec![3; 33]),
            s(OP_CHECKSIG),
            s(OP_ENDIF),
        ];
        assert!(is_tail(&ops, 2));
        assert!(is_tail(&ops, 5));
        // CHECKSIG followed by more work is not a tail.
        let ops = vec![s(OP_CHECKSIG), s(OP_NOT)];
        assert!(!is_tail(&ops, 0));
        // A second ELSE executes again.
        let ops = vec![
            s(OP_CHECKSIG),
            s(OP_ELSE),
            s(OP_NOP),
            s(OP_ELSE),
            s(OP_NOT),
            s(OP_ENDIF),
        ];
        assert!(!is_tail(&ops, 0));
    }

    use bitcoin::script::Builder;
    use bitcoin::secp256k1::{Keypair, SecretKey};
    use bitcoin::taproot::TaprootBuilder;
    use bitcoin::{Amount, OutPoint, ScriptBuf, Sequence, TxIn, Witness};

    fn spend_of(prevout: &TxOut, sequence: u32) -> Transaction {
        Transaction {
            version: bitcoin::transaction::Version::TWO,
            lock_time: bitcoin::absolute::LockTime::ZERO,
            input: vec![TxIn {
                previous_output: OutPoint::new(bitcoin::Txid::from_byte_array([4; 32]), 1),
                sequence: Sequence(sequence),
                ..TxIn::default()
            }],
            output: vec![TxOut {
                value: prevout.value - Amount::from_sat(500),
                script_pubkey: ScriptBuf::new_op_return([]),
            }],
        }
    }

    fn sk(n: u8) -> SecretKey {
        SecretKey::from_slice(&[n; 32]).unwrap()
    }

    /// A 2-of-2 CHECKMULTISIG that is not the script's last operation is
    /// verified for real: correct signatures must pass (right sighash and
    /// key order), a wrong one is a NULLFAIL.
    #[test]
    fn non_final_multisig_is_verified() {
        let s = Secp256k1::new();
        let (a, b) = (sk(1).public_key(&s), sk(2).public_key(&s));
        let ws = Builder::new()
            .push_int(2)
            .push_slice(a.serialize())
            .push_slice(b.serialize())
            .push_int(2)
            .push_opcode(OP_CHECKMULTISIG)
            .push_opcode(OP_VERIFY)
            .push_int(1)
            .into_script();
        let prevout = TxOut {
            value: Amount::from_sat(50_000),
            script_pubkey: ScriptBuf::new_p2wsh(&ws.wscript_hash()),
        };
        let mut tx = spend_of(&prevout, u32::MAX);
        let h = SighashCache::new(&tx)
            .p2wsh_signature_hash(0, &ws, prevout.value, EcdsaSighashType::All)
            .unwrap();
        let msg = Message::from_digest(h.to_byte_array());
        let sig = |k: u8| {
            let mut v = s.sign_ecdsa(&msg, &sk(k)).serialize_der().to_vec();
            v.push(1);
            v
        };
        let witness = |sigs: [Vec<u8>; 2]| {
            let mut w = Witness::new();
            w.push([]);
            for x in sigs {
                w.push(x);
            }
            w.push(ws.as_bytes());
            w
        };
        tx.input[0].witness = witness([sig(1), sig(2)]);
        let mut c = TxChecker::new(&tx, vec![prevout.clone()], true);
        assert_eq!(c.check_policy(0), Ok(Checked::Passed));
        // Wrong order: consensus fails too, but the interpreter sees a failed
        // check with signatures (what it reports when run on its own).
        tx.input[0].witness = witness([sig(2), sig(1)]);
        let mut c = TxChecker::new(&tx, vec![prevout], true);
        assert_eq!(c.check_policy(0), Err(ScriptError::NullFail));
    }

    /// Tapscript 2-of-2 with CHECKSIGADD: both signatures pass, a missing
    /// one leaves a false result, a forged one is a consensus failure.
    #[test]
    fn tapscript_checksigadd_multisig() {
        let s = Secp256k1::new();
        let (ka, kb) = (
            Keypair::from_secret_key(&s, &sk(3)),
            Keypair::from_secret_key(&s, &sk(4)),
        );
        let script = Builder::new()
            .push_slice(ka.x_only_public_key().0.serialize())
            .push_opcode(OP_CHECKSIG)
            .push_slice(kb.x_only_public_key().0.serialize())
            .push_opcode(OP_CHECKSIGADD)
            .push_int(2)
            .push_opcode(OP_NUMEQUAL)
            .into_script();
        let internal = Keypair::from_secret_key(&s, &sk(5)).x_only_public_key().0;
        let info = TaprootBuilder::new()
            .add_leaf(0, script.clone())
            .unwrap()
            .finalize(&s, internal)
            .unwrap();
        let prevout = TxOut {
            value: Amount::from_sat(50_000),
            script_pubkey: ScriptBuf::new_p2tr_tweaked(info.output_key()),
        };
        let control = info
            .control_block(&(script.clone(), LeafVersion::TapScript))
            .unwrap()
            .serialize();
        let mut tx = spend_of(&prevout, u32::MAX);
        let leaf = TapLeafHash::from_script(&script, LeafVersion::TapScript);
        let h = SighashCache::new(&tx)
            .taproot_script_spend_signature_hash(
                0,
                &Prevouts::All(std::slice::from_ref(&prevout)),
                leaf,
                TapSighashType::Default,
            )
            .unwrap();
        let msg = Message::from_digest(h.to_byte_array());
        let sig = |k: &Keypair| s.sign_schnorr_no_aux_rand(&msg, k).as_ref().to_vec();
        let run = |tx: &mut Transaction, sa: Vec<u8>, sb: Vec<u8>| {
            let mut w = Witness::new();
            // Stack order: the first key's signature is on top.
            w.push(sb);
            w.push(sa);
            w.push(script.as_bytes());
            w.push(&control);
            tx.input[0].witness = w;
            TxChecker::new(tx, vec![prevout.clone()], false).check_taproot(0)
        };
        assert_eq!(run(&mut tx, sig(&ka), sig(&kb)), Ok(Checked::Passed));
        assert_eq!(run(&mut tx, sig(&ka), vec![]), Err(ScriptError::EvalFalse));
        let mut forged = sig(&kb);
        forged[5] ^= 1;
        assert_eq!(run(&mut tx, sig(&ka), forged), Err(ScriptError::SchnorrSig));
    }

    /// Tapscript consensus rules the interpreter enforces itself: MINIMALIF,
    /// CHECKSEQUENCEVERIFY and CHECKMULTISIG's absence.
    #[test]
    fn tapscript_minimalif_csv_and_no_multisig() {
        let s = Secp256k1::new();
        let internal = Keypair::from_secret_key(&s, &sk(6)).x_only_public_key().0;
        let check = |script: ScriptBuf, items: Vec<Vec<u8>>, sequence: u32| {
            let info = TaprootBuilder::new()
                .add_leaf(0, script.clone())
                .unwrap()
                .finalize(&s, internal)
                .unwrap();
            let prevout = TxOut {
                value: Amount::from_sat(50_000),
                script_pubkey: ScriptBuf::new_p2tr_tweaked(info.output_key()),
            };
            let mut tx = spend_of(&prevout, sequence);
            let mut w = Witness::new();
            for i in items {
                w.push(i);
            }
            w.push(script.as_bytes());
            w.push(
                info.control_block(&(script.clone(), LeafVersion::TapScript))
                    .unwrap()
                    .serialize(),
            );
            tx.input[0].witness = w;
            TxChecker::new(&tx, vec![prevout], true).check_taproot(0)
        };
        let if_script = Builder::new()
            .push_opcode(OP_IF)
            .push_int(1)
            .push_opcode(OP_ELSE)
            .push_int(0)
            .push_opcode(OP_ENDIF)
            .into_script();
        assert_eq!(
            check(if_script.clone(), vec![vec![1]], 0),
            Ok(Checked::Passed)
        );
        assert_eq!(
            check(if_script, vec![vec![2]], 0),
            Err(ScriptError::TapscriptMinimalIf)
        );
        let csv = Builder::new()
            .push_int(10)
            .push_opcode(OP_CSV)
            .into_script();
        assert_eq!(check(csv.clone(), vec![], 10), Ok(Checked::Passed));
        assert_eq!(check(csv, vec![], 9), Err(ScriptError::UnsatisfiedLocktime));
        let multi = Builder::new()
            .push_int(0)
            .push_int(0)
            .push_opcode(OP_CHECKMULTISIG)
            .into_script();
        assert_eq!(
            check(multi, vec![vec![]], 0),
            Err(ScriptError::TapscriptCheckMultisig)
        );
        // OP_SUCCESS: valid by consensus, refused by policy.
        let success = ScriptBuf::from_bytes(vec![0x50]);
        assert_eq!(
            check(success, vec![], 0),
            Err(ScriptError::DiscourageOpSuccess)
        );
        // OP_VERIF is bad even where it is not executed; OP_INVALIDOPCODE
        // where it is.
        let verif = ScriptBuf::from_bytes(vec![0x51, 0x64, 0x65, 0x68]);
        assert_eq!(check(verif, vec![], 0), Err(ScriptError::BadOpcode));
        let invalid = ScriptBuf::from_bytes(vec![0x51, 0x00, 0x63, 0xff, 0x68]);
        assert_eq!(check(invalid, vec![], 0), Ok(Checked::Passed));
        let invalid = ScriptBuf::from_bytes(vec![0x51, 0xff]);
        assert_eq!(check(invalid, vec![], 0), Err(ScriptError::BadOpcode));
    }
}
