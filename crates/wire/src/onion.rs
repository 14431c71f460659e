//! The onion that an `update_add_htlc` may carry: a fixed-size byte container, opened by `potluck-onion`.
//!
//! The wire layer checks only the size, so that a packet of the wrong length
//! is refused at decode like any other malformed field; what the bytes mean
//! (version, ephemeral key, HMAC) is the onion crate's business, checked when
//! a hop peels it.

use std::fmt;

use crate::error::DecodeErrorKind;

/// A BOLT 4 onion packet: exactly [`Onion::LEN`] bytes.
// Boxed: 1366 bytes inline would make every `Packet` that large.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Onion(Box<[u8; Onion::LEN]>);

impl Onion {
    /// Size of every onion: version (1), ephemeral key (33), hop payloads (1300), HMAC (32).
    pub const LEN: usize = 1 + 33 + 1300 + 32;

    /// Wraps an array of the right size.
    pub fn new(bytes: Box<[u8; Onion::LEN]>) -> Onion {
        Onion(bytes)
    }

    /// The packet's bytes.
    pub fn as_bytes(&self) -> &[u8; Onion::LEN] {
        &self.0
    }
}

impl TryFrom<&[u8]> for Onion {
    type Error = DecodeErrorKind;

    /// # Errors
    /// [`DecodeErrorKind::OnionLength`] unless `bytes` is exactly [`Onion::LEN`] long.
    fn try_from(bytes: &[u8]) -> Result<Self, DecodeErrorKind> {
        let array: Box<[u8; Onion::LEN]> = bytes
            .to_vec()
            .into_boxed_slice()
            .try_into()
            .map_err(|_| DecodeErrorKind::OnionLength { len: bytes.len() })?;
        Ok(Onion(array))
    }
}

// 1366 bytes of hex drown a packet's debug output; the head identifies it.
impl fmt::Debug for Onion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Onion(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

// Stored in channel snapshots: in JSON (versions up to 3) as lowercase hex, where a byte
// array would be written as 1366 numbers; in a binary format (version 4) as its bytes.
impl serde::Serialize for Onion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if !s.is_human_readable() {
            return s.serialize_bytes(&self.0[..]);
        }
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut hex = String::with_capacity(2 * Onion::LEN);
        for b in self.0.iter() {
            hex.push(char::from(DIGITS[usize::from(b >> 4)]));
            hex.push(char::from(DIGITS[usize::from(b & 0x0f)]));
        }
        s.serialize_str(&hex)
    }
}

impl<'de> serde::Deserialize<'de> for Onion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        if !d.is_human_readable() {
            return d.deserialize_bytes(BytesVisitor);
        }
        let hex = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let hex = hex.as_bytes();
        if hex.len() != 2 * Onion::LEN {
            return Err(D::Error::custom(format!(
                "onion of {} hex digits, expected {}",
                hex.len(),
                2 * Onion::LEN
            )));
        }
        let digit = |c: u8| -> Result<u8, D::Error> {
            match c {
                b'0'..=b'9' => Ok(c - b'0'),
                b'a'..=b'f' => Ok(c - b'a' + 10),
                _ => Err(D::Error::custom("onion: not lowercase hex")),
            }
        };
        let mut bytes = Box::new([0u8; Onion::LEN]);
        for (out, pair) in bytes.iter_mut().zip(hex.chunks_exact(2)) {
            *out = (digit(pair[0])? << 4) | digit(pair[1])?;
        }
        Ok(Onion(bytes))
    }
}

/// An onion's bytes from a binary format: exactly [`Onion::LEN`] of them.
struct BytesVisitor;

impl serde::de::Visitor<'_> for BytesVisitor {
    type Value = Onion;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "an onion of {} bytes", Onion::LEN)
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Onion, E> {
        Onion::try_from(v).map_err(|_| E::invalid_length(v.len(), &self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn onion() -> Onion {
        let bytes: Vec<u8> = (0..Onion::LEN).map(|i| (i % 251) as u8).collect();
        Onion::try_from(&bytes[..]).expect("the right length")
    }

    /// In a binary format an onion is its 1,366 bytes after their length, and reads back
    /// only at that length; in JSON it stays hex.
    #[test]
    fn an_onion_is_its_bytes_in_binary_and_hex_in_json() {
        let o = onion();
        let binary = postcard::to_allocvec(&o).expect("encodes");
        // The length as a varint (1366 = 0xd6 0x0a), then the bytes.
        assert_eq!(binary[..2], [0xd6, 0x0a]);
        assert_eq!(binary[2..], o.as_bytes()[..]);
        assert_eq!(postcard::from_bytes::<Onion>(&binary).ok(), Some(o.clone()));
        let short = postcard::to_allocvec(&o.as_bytes()[1..]).expect("encodes");
        let err = postcard::from_bytes::<Onion>(&short)
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some(), "an onion of 1365 bytes was read");
        let json = serde_json::to_string(&o).expect("encodes");
        assert_eq!(json, format!("\"{}\"", hex::encode(o.as_bytes())));
        assert_eq!(serde_json::from_str::<Onion>(&json).ok(), Some(o));
    }
}
