//! How the channel's bytes are written in its snapshot (docs/node.md, "Upgrades", snapshot
//! version 3): lowercase hex written from a table, never through `fmt` (the node encodes
//! a snapshot on every durable write), and byte arrays read back strictly from hex.
//!
//! Keys, hashes and signatures keep the text their own serde impls write (so every
//! snapshot version reads them alike); only the 32-byte arrays changed layout, from
//! arrays of numbers (versions 0 to 2, still read) to hex strings. A string is read
//! strictly: 64 lowercase hex digits or an error, never a guess.
//!
//! A binary serializer (snapshot version 4, `is_human_readable` false) gets each type's
//! own serde form instead, bytes rather than text, and the 32-byte arrays as 32 bytes.

use bitcoin::hashes::Hash as _;
use bitcoin::{OutPoint, ScriptBuf, Txid};
use secp256k1::{ecdsa::Signature, PublicKey, SecretKey};
use serde::{Deserializer, Serializer};
use wire::{Preimage, Sha256};

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The longest byte string written here: a DER signature (72 bytes).
const MAX_BYTES: usize = 72;

/// Why a stored hex string does not read as the bytes it stands for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HexError {
    /// An odd number of hex digits.
    #[error("hex string of odd length {0}")]
    OddLength(usize),
    /// Another number of bytes than the field holds.
    #[error("hex string of {found} bytes, expected {expected}")]
    WrongLength {
        /// Bytes the field holds.
        expected: usize,
        /// Bytes the string holds.
        found: usize,
    },
    /// A character that is not a lowercase hex digit.
    #[error("not a lowercase hex digit at {0}")]
    NotHex(usize),
}

fn digit(c: u8, at: usize) -> Result<u8, HexError> {
    match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        _ => Err(HexError::NotHex(at)),
    }
}

/// The 32 bytes that `hex` (64 lowercase hex digits) stands for.
///
/// # Errors
/// Odd length, another length, or a character other than `0-9a-f`.
pub fn decode32(hex: &str) -> Result<[u8; 32], HexError> {
    let hex = hex.as_bytes();
    if hex.len() % 2 != 0 {
        return Err(HexError::OddLength(hex.len()));
    }
    if hex.len() != 64 {
        return Err(HexError::WrongLength {
            expected: 32,
            found: hex.len() / 2,
        });
    }
    let mut out = [0u8; 32];
    for (i, (byte, pair)) in out.iter_mut().zip(hex.chunks_exact(2)).enumerate() {
        *byte = (digit(pair[0], 2 * i)? << 4) | digit(pair[1], 2 * i + 1)?;
    }
    Ok(out)
}

/// Writes `bytes` as one lowercase hex string (`rev`: last byte first, as txids show).
fn write_hex<S: Serializer>(bytes: &[u8], rev: bool, s: S) -> Result<S::Ok, S::Error> {
    let mut buf = [0u8; 2 * MAX_BYTES];
    let Some(out) = buf.get_mut(..2 * bytes.len()) else {
        return Err(serde::ser::Error::custom("byte string too long for hex"));
    };
    let put = |pair: &mut [u8], b: u8| {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0x0f)];
    };
    if rev {
        for (pair, &b) in out.chunks_exact_mut(2).zip(bytes.iter().rev()) {
            put(pair, b);
        }
    } else {
        for (pair, &b) in out.chunks_exact_mut(2).zip(bytes) {
            put(pair, b);
        }
    }
    s.serialize_str(std::str::from_utf8(out).map_err(serde::ser::Error::custom)?)
}

/// The visitor of a 32-byte hex string.
struct Hex32Visitor;

impl<'de> serde::de::Visitor<'de> for Hex32Visitor {
    type Value = [u8; 32];

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("64 lowercase hex digits, or 32 numbers as snapshot versions 0 to 2 wrote")
    }

    /// The layout of snapshot versions 0 to 2: exactly 32 numbers of 0 to 255.
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<[u8; 32], A::Error> {
        use serde::de::Error as _;
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = seq
                .next_element()?
                .ok_or_else(|| A::Error::invalid_length(i, &self))?;
        }
        if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
            return Err(A::Error::invalid_length(33, &self));
        }
        Ok(out)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<[u8; 32], E> {
        decode32(v).map_err(E::custom)
    }
}

/// `[u8; 32]` fields, as hex.
pub(crate) mod bytes32 {
    use super::{write_hex, Deserializer, Hex32Visitor, Serializer};

    pub(crate) fn serialize<S: Serializer>(b: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        if !s.is_human_readable() {
            return serde::Serialize::serialize(b, s);
        }
        write_hex(b, false, s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        if !d.is_human_readable() {
            return serde::Deserialize::deserialize(d);
        }
        d.deserialize_any(Hex32Visitor)
    }
}

/// [`Preimage`] fields, as hex.
pub(crate) mod preimage {
    use super::{Deserializer, Preimage, Serializer};

    pub(crate) fn serialize<S: Serializer>(p: &Preimage, s: S) -> Result<S::Ok, S::Error> {
        super::bytes32::serialize(&p.0, s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Preimage, D::Error> {
        super::bytes32::deserialize(d).map(Preimage)
    }
}

/// One preimage as hex, for sequences of them.
struct HexPreimage(Preimage);

impl serde::Serialize for HexPreimage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        preimage::serialize(&self.0, s)
    }
}

impl<'de> serde::Deserialize<'de> for HexPreimage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        preimage::deserialize(d).map(HexPreimage)
    }
}

/// `Vec<Preimage>` fields, as a sequence of hex strings.
pub(crate) mod preimages {
    use super::{Deserializer, HexPreimage, Preimage, Serializer};

    pub(crate) fn serialize<S: Serializer>(v: &[Preimage], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|p| HexPreimage(*p)))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Preimage>, D::Error> {
        let v: Vec<HexPreimage> = serde::Deserialize::deserialize(d)?;
        Ok(v.into_iter().map(|p| p.0).collect())
    }
}

/// A compressed public key, as secp256k1's serde writes it.
pub(crate) fn public_key<S: Serializer>(k: &PublicKey, s: S) -> Result<S::Ok, S::Error> {
    if !s.is_human_readable() {
        return serde::Serialize::serialize(k, s);
    }
    write_hex(&k.serialize(), false, s)
}

/// A secret key, as secp256k1's serde writes it.
pub(crate) fn secret_key<S: Serializer>(k: &SecretKey, s: S) -> Result<S::Ok, S::Error> {
    if !s.is_human_readable() {
        return serde::Serialize::serialize(k, s);
    }
    write_hex(&k.secret_bytes(), false, s)
}

/// A signature in DER, as secp256k1's serde writes it.
pub(crate) fn signature<S: Serializer>(sig: &Signature, s: S) -> Result<S::Ok, S::Error> {
    if !s.is_human_readable() {
        return serde::Serialize::serialize(sig, s);
    }
    write_hex(&sig.serialize_der(), false, s)
}

/// A SHA-256 hash, as bitcoin_hashes' serde writes it (in byte order).
pub(crate) fn sha256<S: Serializer>(h: &Sha256, s: S) -> Result<S::Ok, S::Error> {
    if !s.is_human_readable() {
        return serde::Serialize::serialize(h, s);
    }
    write_hex(h.as_byte_array(), false, s)
}

/// A txid, as bitcoin's serde writes it (last byte first).
pub(crate) fn txid<S: Serializer>(t: &Txid, s: S) -> Result<S::Ok, S::Error> {
    if !s.is_human_readable() {
        return serde::Serialize::serialize(t, s);
    }
    write_hex(t.as_byte_array(), true, s)
}

/// A script, as bitcoin's serde writes it (its bytes in hex), without going through
/// `fmt`: the anchor's script is in every snapshot of a channel.
pub(crate) fn script<S: Serializer>(sc: &ScriptBuf, s: S) -> Result<S::Ok, S::Error> {
    if !s.is_human_readable() {
        return serde::Serialize::serialize(sc, s);
    }
    let bytes = sc.as_bytes();
    if bytes.len() <= MAX_BYTES {
        write_hex(bytes, false, s)
    } else {
        s.collect_str(&format_args!("{sc:x}"))
    }
}

/// An outpoint as bitcoin's serde writes it: `txid:vout`.
pub(crate) fn outpoint<S: Serializer>(o: &OutPoint, s: S) -> Result<S::Ok, S::Error> {
    if !s.is_human_readable() {
        return serde::Serialize::serialize(o, s);
    }
    let mut buf = [0u8; 64 + 1 + 10];
    for (pair, &b) in buf
        .chunks_exact_mut(2)
        .zip(o.txid.as_byte_array().iter().rev())
    {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0x0f)];
    }
    buf[64] = b':';
    let mut digits = [0u8; 10];
    let mut n = o.vout;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for (out, d) in buf[65..65 + len].iter_mut().zip(digits[..len].iter().rev()) {
        *out = *d;
    }
    s.serialize_str(std::str::from_utf8(&buf[..65 + len]).map_err(serde::ser::Error::custom)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `v` through `f` into JSON.
    fn json_of<T>(
        v: &T,
        f: fn(&T, &mut serde_json::Serializer<&mut Vec<u8>>) -> Result<(), serde_json::Error>,
    ) -> String {
        let mut out = Vec::new();
        f(v, &mut serde_json::Serializer::new(&mut out)).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// The table writer writes exactly the text of each type's own serde impl, so
    /// snapshots of every version read these fields alike.
    #[test]
    fn keys_hashes_and_signatures_keep_their_own_serde_text() {
        let secp = secp256k1::Secp256k1::new();
        let sk = SecretKey::from_slice(&[0xa7; 32]).unwrap();
        let pk = PublicKey::from_secret_key(&secp, &sk);
        let msg = secp256k1::Message::from_digest([0x5c; 32]);
        let sig = secp.sign_ecdsa(&msg, &sk);
        let h = Sha256::hash(b"potluck");
        let txid = Txid::from_byte_array(*Sha256::hash(b"tx").as_byte_array());
        assert_eq!(
            json_of(&pk, |v, s| public_key(v, s)),
            serde_json::to_string(&pk).unwrap()
        );
        assert_eq!(
            json_of(&sk, |v, s| secret_key(v, s)),
            serde_json::to_string(&sk).unwrap()
        );
        assert_eq!(
            json_of(&sig, |v, s| signature(v, s)),
            serde_json::to_string(&sig).unwrap()
        );
        assert_eq!(
            json_of(&h, |v, s| sha256(v, s)),
            serde_json::to_string(&h).unwrap()
        );
        assert_eq!(
            json_of(&txid, |v, s| super::txid(v, s)),
            serde_json::to_string(&txid).unwrap()
        );
        // The anchor's 2-of-2 (71 bytes), an empty script and one past the stack buffer.
        for len in [71, 0, MAX_BYTES + 1] {
            let sc = ScriptBuf::from_bytes((0..len).map(|i| (i * 31) as u8).collect());
            assert_eq!(
                json_of(&sc, |v, s| script(v, s)),
                serde_json::to_string(&sc).unwrap()
            );
        }
        for vout in [0, 7, 10, 4_294_967_295] {
            let o = OutPoint { txid, vout };
            assert_eq!(
                json_of(&o, |v, s| outpoint(v, s)),
                serde_json::to_string(&o).unwrap()
            );
        }
    }

    #[test]
    fn thirty_two_bytes_read_back_from_their_hex_and_nothing_else() {
        let bytes: [u8; 32] = std::array::from_fn(|i| (i * 37) as u8);
        let hex = json_of(&bytes, |v, s| bytes32::serialize(v, s));
        assert_eq!(hex, format!("\"{}\"", hex::encode(bytes)));
        assert_eq!(decode32(hex.trim_matches('"')), Ok(bytes));
        let good = hex.trim_matches('"').to_owned();
        assert_eq!(decode32(&good[1..]), Err(HexError::OddLength(63)));
        assert_eq!(
            decode32(&good[2..]),
            Err(HexError::WrongLength {
                expected: 32,
                found: 31
            })
        );
        assert_eq!(
            decode32(&good.to_uppercase()).map_err(|e| matches!(e, HexError::NotHex(_))),
            Err(true)
        );
        assert_eq!(
            decode32(&format!("x{}", &good[1..])),
            Err(HexError::NotHex(0))
        );
    }
}
