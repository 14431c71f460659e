//! Domain types for the helper messages, and their conversions to and from the generated ones.
//!
//! Word layouts follow the 2016 reference implementation (PROTOCOL-NOTES §5):
//! a hash's words are little-endian slices of its bytes in order; a
//! signature's words run from the least significant 64 bits of r (r1) to the
//! most significant (r4), then the same for s.

use bitcoin_hashes::{sha256, sha256d, Hash};
use secp256k1::{ecdsa, PublicKey};

use crate::error::DecodeErrorKind;
use crate::pb;

/// A SHA-256 hash (revocation hashes, R hashes).
pub type Sha256 = sha256::Hash;

/// A double-SHA-256 hash in internal byte order (txids, block ids).
pub type Sha256d = sha256d::Hash;

fn words_to_bytes(h: &pb::Sha256Hash) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (chunk, word) in out.chunks_exact_mut(8).zip([h.a, h.b, h.c, h.d]) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    out
}

fn bytes_to_words(bytes: &[u8; 32]) -> pb::Sha256Hash {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
        u64::from_le_bytes(w)
    };
    pb::Sha256Hash {
        a: word(0),
        b: word(1),
        c: word(2),
        d: word(3),
    }
}

impl From<&pb::Sha256Hash> for Sha256 {
    fn from(h: &pb::Sha256Hash) -> Self {
        Sha256::from_byte_array(words_to_bytes(h))
    }
}

impl From<Sha256> for pb::Sha256Hash {
    fn from(h: Sha256) -> Self {
        bytes_to_words(h.as_byte_array())
    }
}

impl From<&pb::Sha256Hash> for Sha256d {
    fn from(h: &pb::Sha256Hash) -> Self {
        Sha256d::from_byte_array(words_to_bytes(h))
    }
}

impl From<Sha256d> for pb::Sha256Hash {
    fn from(h: Sha256d) -> Self {
        bytes_to_words(h.as_byte_array())
    }
}

/// A 32-byte secret whose SHA-256 is published first: an HTLC's R value or a revocation preimage.
///
/// It travels in a `sha256_hash` message but is not itself a hash.
#[derive(Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Preimage(pub [u8; 32]);

impl Preimage {
    /// The hash that this preimage opens.
    pub fn hash(&self) -> Sha256 {
        Sha256::hash(&self.0)
    }
}

impl std::fmt::Debug for Preimage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Preimages are secrets until revealed; keep them out of logs.
        f.write_str("Preimage(..)")
    }
}

impl From<&pb::Sha256Hash> for Preimage {
    fn from(h: &pb::Sha256Hash) -> Self {
        Preimage(words_to_bytes(h))
    }
}

impl From<Preimage> for pb::Sha256Hash {
    fn from(p: Preimage) -> Self {
        bytes_to_words(&p.0)
    }
}

/// r1 = BE64(R[24..32]) … r4 = BE64(R[0..8]), R being the 32 big-endian bytes.
fn half_to_words(be: &[u8]) -> [u64; 4] {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&be[i * 8..i * 8 + 8]);
        u64::from_be_bytes(w)
    };
    [word(3), word(2), word(1), word(0)]
}

fn words_to_half(words: [u64; 4], out: &mut [u8]) {
    for (i, word) in words.iter().enumerate() {
        let at = (3 - i) * 8;
        out[at..at + 8].copy_from_slice(&word.to_be_bytes());
    }
}

impl TryFrom<&pb::Signature> for ecdsa::Signature {
    type Error = DecodeErrorKind;

    /// Rejects r or s equal to zero or not below the curve order.
    fn try_from(s: &pb::Signature) -> Result<Self, Self::Error> {
        let mut compact = [0u8; 64];
        words_to_half([s.r1, s.r2, s.r3, s.r4], &mut compact[..32]);
        words_to_half([s.s1, s.s2, s.s3, s.s4], &mut compact[32..]);
        if compact[..32].iter().all(|&b| b == 0) {
            return Err(DecodeErrorKind::InvalidSignature { half: "r" });
        }
        if compact[32..].iter().all(|&b| b == 0) {
            return Err(DecodeErrorKind::InvalidSignature { half: "s" });
        }
        ecdsa::Signature::from_compact(&compact).map_err(|_| {
            // from_compact fails only on an overflowing half; say which.
            let half = if compact[..32] >= secp256k1::constants::CURVE_ORDER[..] {
                "r"
            } else {
                "s"
            };
            DecodeErrorKind::InvalidSignature { half }
        })
    }
}

impl From<&ecdsa::Signature> for pb::Signature {
    fn from(sig: &ecdsa::Signature) -> Self {
        let compact = sig.serialize_compact();
        let [r1, r2, r3, r4] = half_to_words(&compact[..32]);
        let [s1, s2, s3, s4] = half_to_words(&compact[32..]);
        pb::Signature {
            r1,
            r2,
            r3,
            r4,
            s1,
            s2,
            s3,
            s4,
        }
    }
}

/// A public key as carried in `chain_pubkey`, remembering whether it came compressed.
///
/// potluck always sends compressed (33-byte) keys; a peer may send 65-byte
/// ones, and re-encoding keeps the form so that signatures over packets stay valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChainPubkey {
    key: PublicKey,
    compressed: bool,
}

impl ChainPubkey {
    /// The key, to be sent compressed.
    pub fn new(key: PublicKey) -> Self {
        ChainPubkey {
            key,
            compressed: true,
        }
    }

    /// The key, to be sent in the 65-byte uncompressed form (only peers other than potluck do).
    pub fn uncompressed(key: PublicKey) -> Self {
        ChainPubkey {
            key,
            compressed: false,
        }
    }

    /// The secp256k1 point.
    pub fn public_key(&self) -> PublicKey {
        self.key
    }

    /// Whether the key travels in the 33-byte form.
    pub fn is_compressed(&self) -> bool {
        self.compressed
    }

    /// The SEC encoding as it travels (33 or 65 bytes).
    pub fn to_vec(&self) -> Vec<u8> {
        if self.compressed {
            self.key.serialize().to_vec()
        } else {
            self.key.serialize_uncompressed().to_vec()
        }
    }
}

impl From<PublicKey> for ChainPubkey {
    fn from(key: PublicKey) -> Self {
        ChainPubkey::new(key)
    }
}

impl TryFrom<&pb::ChainPubkey> for ChainPubkey {
    type Error = DecodeErrorKind;

    /// Accepts exactly the SEC forms: 33 bytes with prefix 02/03, 65 bytes with prefix 04.
    fn try_from(pk: &pb::ChainPubkey) -> Result<Self, Self::Error> {
        let compressed = match (pk.key.len(), pk.key.first()) {
            (33, Some(0x02 | 0x03)) => true,
            (65, Some(0x04)) => false,
            (33 | 65, _) => return Err(DecodeErrorKind::InvalidPubkey),
            (len, _) => return Err(DecodeErrorKind::PubkeyLength { len }),
        };
        let key = PublicKey::from_slice(&pk.key).map_err(|_| DecodeErrorKind::InvalidPubkey)?;
        Ok(ChainPubkey { key, compressed })
    }
}

impl From<&ChainPubkey> for pb::ChainPubkey {
    fn from(pk: &ChainPubkey) -> Self {
        pb::ChainPubkey { key: pk.to_vec() }
    }
}

/// A time lock: `seconds` or `blocks` (relative for `open_channel.delay`, absolute for HTLC expiry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Locktime {
    /// A time in seconds.
    Seconds(u32),
    /// A number or height of blocks.
    Blocks(u32),
}

impl TryFrom<&pb::Locktime> for Locktime {
    type Error = DecodeErrorKind;

    fn try_from(l: &pb::Locktime) -> Result<Self, Self::Error> {
        match l.locktime {
            Some(pb::locktime::Locktime::Seconds(s)) => Ok(Locktime::Seconds(s)),
            Some(pb::locktime::Locktime::Blocks(b)) => Ok(Locktime::Blocks(b)),
            None => Err(DecodeErrorKind::OneofEmpty {
                message: "locktime",
                oneof: "locktime",
            }),
        }
    }
}

impl From<Locktime> for pb::Locktime {
    fn from(l: Locktime) -> Self {
        pb::Locktime {
            locktime: Some(match l {
                Locktime::Seconds(s) => pb::locktime::Locktime::Seconds(s),
                Locktime::Blocks(b) => pb::locktime::Locktime::Blocks(b),
            }),
        }
    }
}

/// A funding requirement: `fixed` base units plus `per_micro_unit` per millionth.
///
/// Both fields are optional on the wire with default 0; `None` means "absent"
/// so that re-encoding reproduces the bytes received.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Funding {
    /// Base amount, if sent.
    pub fixed: Option<i64>,
    /// Charge per millionth, if sent.
    pub per_micro_unit: Option<i32>,
}

impl Funding {
    /// The base amount (0 when absent).
    pub fn fixed(&self) -> i64 {
        self.fixed.unwrap_or(0)
    }

    /// The charge per millionth (0 when absent).
    pub fn per_micro_unit(&self) -> i32 {
        self.per_micro_unit.unwrap_or(0)
    }
}

impl From<&pb::Funding> for Funding {
    fn from(f: &pb::Funding) -> Self {
        Funding {
            fixed: f.fixed,
            per_micro_unit: f.per_micro_unit,
        }
    }
}

impl From<Funding> for pb::Funding {
    fn from(f: Funding) -> Self {
        pb::Funding {
            fixed: f.fixed,
            per_micro_unit: f.per_micro_unit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_words_round_trip_keeps_high_s() {
        // A high-S signature (s = n - 1) must survive decoding untouched: the reference accepts them.
        let mut compact = [0u8; 64];
        compact[31] = 1;
        compact[32..].copy_from_slice(&secp256k1::constants::CURVE_ORDER);
        compact[63] -= 1;
        let sig = ecdsa::Signature::from_compact(&compact).unwrap();
        let words = pb::Signature::from(&sig);
        assert_eq!(words.r1, 1);
        assert_eq!(words.r4, 0);
        let back = ecdsa::Signature::try_from(&words).unwrap();
        assert_eq!(back.serialize_compact(), compact);
    }

    #[test]
    fn signature_halves_out_of_range_are_rejected() {
        let mut words = pb::Signature {
            r1: 1,
            s1: 1,
            ..Default::default()
        };
        assert!(ecdsa::Signature::try_from(&words).is_ok());
        words.r1 = 0;
        assert_eq!(
            ecdsa::Signature::try_from(&words),
            Err(DecodeErrorKind::InvalidSignature { half: "r" })
        );
        words.r1 = 1;
        words.s1 = 0;
        assert_eq!(
            ecdsa::Signature::try_from(&words),
            Err(DecodeErrorKind::InvalidSignature { half: "s" })
        );
        // s = n (the order itself) overflows.
        let n = half_to_words(&secp256k1::constants::CURVE_ORDER);
        [words.s1, words.s2, words.s3, words.s4] = n;
        assert_eq!(
            ecdsa::Signature::try_from(&words),
            Err(DecodeErrorKind::InvalidSignature { half: "s" })
        );
        [words.r1, words.r2, words.r3, words.r4] = n;
        assert_eq!(
            ecdsa::Signature::try_from(&words),
            Err(DecodeErrorKind::InvalidSignature { half: "r" })
        );
    }

    #[test]
    fn chain_pubkey_lengths_and_prefixes() {
        let secp = secp256k1::Secp256k1::signing_only();
        let sk = secp256k1::SecretKey::from_slice(&[7u8; 32]).unwrap();
        let key = PublicKey::from_secret_key(&secp, &sk);
        let compressed = pb::ChainPubkey {
            key: key.serialize().to_vec(),
        };
        let uncompressed = pb::ChainPubkey {
            key: key.serialize_uncompressed().to_vec(),
        };
        let a = ChainPubkey::try_from(&compressed).unwrap();
        let b = ChainPubkey::try_from(&uncompressed).unwrap();
        assert!(a.is_compressed() && !b.is_compressed());
        assert_eq!(a.public_key(), b.public_key());
        assert_eq!(pb::ChainPubkey::from(&b), uncompressed);
        for len in [0, 1, 32, 34, 64, 66] {
            let pk = pb::ChainPubkey { key: vec![2; len] };
            assert_eq!(
                ChainPubkey::try_from(&pk),
                Err(DecodeErrorKind::PubkeyLength { len })
            );
        }
        // Hybrid form (06/07) and an uncompressed prefix on 33 bytes are not SEC keys we accept.
        let mut hybrid = uncompressed.key.clone();
        hybrid[0] = 0x06 | (hybrid[64] & 1);
        assert_eq!(
            ChainPubkey::try_from(&pb::ChainPubkey { key: hybrid }),
            Err(DecodeErrorKind::InvalidPubkey)
        );
        let mut wrong = compressed.key.clone();
        wrong[0] = 0x04;
        assert_eq!(
            ChainPubkey::try_from(&pb::ChainPubkey { key: wrong }),
            Err(DecodeErrorKind::InvalidPubkey)
        );
        // x = 5 is not on secp256k1 (5^3 + 7 = 132 is not a square mod p).
        let mut off_curve = vec![0u8; 33];
        off_curve[0] = 2;
        off_curve[32] = 5;
        assert_eq!(
            ChainPubkey::try_from(&pb::ChainPubkey { key: off_curve }),
            Err(DecodeErrorKind::InvalidPubkey)
        );
    }
}
