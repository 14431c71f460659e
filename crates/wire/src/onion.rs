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

// Stored in channel snapshots (JSON) as lowercase hex: a byte array would be written as
// 1366 numbers.
impl serde::Serialize for Onion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
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
