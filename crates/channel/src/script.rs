//! Witness scripts of a channel (DESIGN.md §3; documented in docs/channel.md).
//!
//! Every secret is checked with OP_SHA256 against a 32-byte hash, as on the wire.
//! A path that needs no secret gets an empty witness element, whose SHA256 matches
//! no hash.

use bitcoin::opcodes::all::{
    OP_2DROP, OP_ADD, OP_CHECKMULTISIG, OP_CHECKSIG, OP_CLTV, OP_CSV, OP_DROP, OP_DUP, OP_ELSE,
    OP_ENDIF, OP_EQUAL, OP_IF, OP_NOTIF, OP_PUSHNUM_2, OP_SHA256, OP_SWAP,
};
use bitcoin::script::Builder;
use bitcoin::ScriptBuf;
use bitcoin_hashes::Hash;
use secp256k1::PublicKey;
use wire::{Locktime, Sha256};

/// Why a time lock cannot be used in a script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LocktimeError {
    /// A relative delay that BIP68 cannot express (over 65535 blocks or 512-second units).
    #[error("relative delay {0:?} is out of range")]
    DelayOutOfRange(Locktime),
    /// An absolute expiry on the wrong side of 500,000,000 for its kind.
    #[error("absolute expiry {0:?} is out of range")]
    ExpiryOutOfRange(Locktime),
}

/// BIP68/BIP112 encoding of a relative delay: the script number and the input's nSequence.
///
/// # Errors
/// [`LocktimeError::DelayOutOfRange`].
pub fn csv_value(delay: Locktime) -> Result<u32, LocktimeError> {
    match delay {
        Locktime::Blocks(n) if n <= 0xffff => Ok(n),
        Locktime::Seconds(s) => {
            let units = s.div_ceil(512);
            if units <= 0xffff {
                Ok((1 << 22) | units)
            } else {
                Err(LocktimeError::DelayOutOfRange(delay))
            }
        }
        Locktime::Blocks(_) => Err(LocktimeError::DelayOutOfRange(delay)),
    }
}

/// BIP65 encoding of an absolute expiry: the script number and the claim's nLockTime.
///
/// # Errors
/// [`LocktimeError::ExpiryOutOfRange`].
pub fn cltv_value(expiry: Locktime) -> Result<u32, LocktimeError> {
    match expiry {
        Locktime::Blocks(h) if h < 500_000_000 => Ok(h),
        Locktime::Seconds(t) if t >= 500_000_000 => Ok(t),
        _ => Err(LocktimeError::ExpiryOutOfRange(expiry)),
    }
}

/// The anchor's witness script: `2 <k1> <k2> 2 OP_CHECKMULTISIG`, keys in lexicographic order.
pub fn anchor_script(a: &PublicKey, b: &PublicKey) -> ScriptBuf {
    let (k1, k2) = sorted_keys(a, b);
    Builder::new()
        .push_opcode(OP_PUSHNUM_2)
        .push_slice(k1.serialize())
        .push_slice(k2.serialize())
        .push_opcode(OP_PUSHNUM_2)
        .push_opcode(OP_CHECKMULTISIG)
        .into_script()
}

/// The two keys in the order the anchor script lists them.
pub fn sorted_keys(a: &PublicKey, b: &PublicKey) -> (PublicKey, PublicKey) {
    if a.serialize() <= b.serialize() {
        (*a, *b)
    } else {
        (*b, *a)
    }
}

/// The owner's revocable output:
/// `SHA256 <rev> EQUAL IF <revoker> ELSE <delay> CSV DROP <owner> ENDIF CHECKSIG`.
pub fn revocable_script(
    revocation_hash: &Sha256,
    revoker: &PublicKey,
    delay_csv: u32,
    owner: &PublicKey,
) -> ScriptBuf {
    Builder::new()
        .push_opcode(OP_SHA256)
        .push_slice(revocation_hash.to_byte_array())
        .push_opcode(OP_EQUAL)
        .push_opcode(OP_IF)
        .push_slice(revoker.serialize())
        .push_opcode(OP_ELSE)
        .push_int(i64::from(delay_csv))
        .push_opcode(OP_CSV)
        .push_opcode(OP_DROP)
        .push_slice(owner.serialize())
        .push_opcode(OP_ENDIF)
        .push_opcode(OP_CHECKSIG)
        .into_script()
}

/// An HTLC offered by the commitment's owner (reference `htlc_send`): the
/// counterparty takes it with R or the revocation preimage; the owner gets the
/// refund after `expiry` and `delay`.
///
/// `SHA256 DUP <r_hash> EQUAL SWAP <rev> EQUAL ADD IF <other> ELSE <expiry> CLTV <delay> CSV 2DROP <owner> ENDIF CHECKSIG`
pub fn htlc_offered_script(
    owner: &PublicKey,
    other: &PublicKey,
    expiry_cltv: u32,
    delay_csv: u32,
    revocation_hash: &Sha256,
    r_hash: &Sha256,
) -> ScriptBuf {
    Builder::new()
        .push_opcode(OP_SHA256)
        .push_opcode(OP_DUP)
        .push_slice(r_hash.to_byte_array())
        .push_opcode(OP_EQUAL)
        .push_opcode(OP_SWAP)
        .push_slice(revocation_hash.to_byte_array())
        .push_opcode(OP_EQUAL)
        .push_opcode(OP_ADD)
        .push_opcode(OP_IF)
        .push_slice(other.serialize())
        .push_opcode(OP_ELSE)
        .push_int(i64::from(expiry_cltv))
        .push_opcode(OP_CLTV)
        .push_int(i64::from(delay_csv))
        .push_opcode(OP_CSV)
        .push_opcode(OP_2DROP)
        .push_slice(owner.serialize())
        .push_opcode(OP_ENDIF)
        .push_opcode(OP_CHECKSIG)
        .into_script()
}

/// An HTLC offered to the commitment's owner (reference `htlc_recv`): the owner
/// takes it with R after `delay`; the counterparty gets the refund after
/// `expiry`, or everything at once with the revocation preimage.
///
/// `SHA256 DUP <r_hash> EQUAL IF <delay> CSV 2DROP <owner> ELSE <rev> EQUAL NOTIF <expiry> CLTV DROP ENDIF <other> ENDIF CHECKSIG`
pub fn htlc_received_script(
    owner: &PublicKey,
    other: &PublicKey,
    expiry_cltv: u32,
    delay_csv: u32,
    revocation_hash: &Sha256,
    r_hash: &Sha256,
) -> ScriptBuf {
    Builder::new()
        .push_opcode(OP_SHA256)
        .push_opcode(OP_DUP)
        .push_slice(r_hash.to_byte_array())
        .push_opcode(OP_EQUAL)
        .push_opcode(OP_IF)
        .push_int(i64::from(delay_csv))
        .push_opcode(OP_CSV)
        .push_opcode(OP_2DROP)
        .push_slice(owner.serialize())
        .push_opcode(OP_ELSE)
        .push_slice(revocation_hash.to_byte_array())
        .push_opcode(OP_EQUAL)
        .push_opcode(OP_NOTIF)
        .push_int(i64::from(expiry_cltv))
        .push_opcode(OP_CLTV)
        .push_opcode(OP_DROP)
        .push_opcode(OP_ENDIF)
        .push_slice(other.serialize())
        .push_opcode(OP_ENDIF)
        .push_opcode(OP_CHECKSIG)
        .into_script()
}

#[cfg(test)]
mod tests {
    use super::*;
    use secp256k1::{Secp256k1, SecretKey};

    fn key(b: u8) -> PublicKey {
        PublicKey::from_secret_key(&Secp256k1::new(), &SecretKey::from_slice(&[b; 32]).unwrap())
    }

    #[test]
    fn anchor_script_known_answer() {
        // Same keys and order as the reference's 2-of-2 (vectors → scripts → anchor_redeem_2of2).
        let s = anchor_script(&key(0x21), &key(0x22));
        assert_eq!(
            hex::encode(s.as_bytes()),
            "522102466d7fcae563e5cb09a0d1870bb580344804617879a14949cf22285f1bae3f2721028d7500dd4c12685d1f568b4c2b5048e8534b873319f3a8daa612b469132ec7f752ae"
        );
        assert_eq!(anchor_script(&key(0x22), &key(0x21)), s);
    }

    #[test]
    fn revocable_script_known_answer() {
        let s = revocable_script(&Sha256::hash(b"revocation-0"), &key(0x32), 144, &key(0x31));
        let h = hex::encode(Sha256::hash(b"revocation-0").to_byte_array());
        assert_eq!(
            hex::encode(s.as_bytes()),
            format!(
                "a820{h}8763210290999dbbf43034bffb1dd53eac1eb4c33a4ea1c4f48ba585cfde3830840f0555670290\
                 00b27521036930f46dd0b16d866d59d1054aa63298b357499cd1862ef16f3f55f1cafceb8268ac"
            )
        );
    }

    #[test]
    fn locktime_encodings() {
        assert_eq!(csv_value(Locktime::Blocks(144)), Ok(144));
        assert_eq!(csv_value(Locktime::Seconds(86_400)), Ok((1 << 22) | 169));
        assert!(csv_value(Locktime::Blocks(70_000)).is_err());
        assert_eq!(cltv_value(Locktime::Blocks(800)), Ok(800));
        assert!(cltv_value(Locktime::Seconds(800)).is_err());
        assert!(cltv_value(Locktime::Blocks(600_000_000)).is_err());
    }
}
