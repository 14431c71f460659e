//! A hop's payload: the BOLT 4 TLV stream telling it how much to forward, until when, and to whom.
//!
//! Records follow BOLT 1's TLV rules: BigSize type and length, types strictly
//! increasing, integers in minimal ("truncated") big-endian form, an unknown
//! even type refused and an unknown odd type skipped.

use secp256k1::PublicKey;
use wire::Locktime;

use crate::sphinx::{read_bigsize, write_bigsize};

/// `amt_to_forward` (BOLT 4): msat the next HTLC carries, or the final hop receives (tu64).
pub const TLV_AMOUNT: u64 = 2;
/// `outgoing_cltv_value` (BOLT 4): the next HTLC's absolute expiry as a block height (tu32).
pub const TLV_EXPIRY_BLOCKS: u64 = 4;
/// potluck: the next HTLC's absolute expiry in unix seconds (tu32), for peers
/// whose `update_add_htlc.expiry` is in `seconds`. Even: a hop that cannot read
/// it cannot honour it.
pub const TLV_EXPIRY_SECONDS: u64 = 65_536;
/// potluck: the next node's 33-byte id (this protocol has no short channel ids).
/// Odd, as a hop that ignores it treats itself as the final one and fails the
/// HTLC for its unknown hash: safe.
pub const TLV_NEXT_NODE: u64 = 65_537;

/// A hop's instructions, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HopPayload {
    /// Amount of the HTLC to offer the next node, or to receive as final hop.
    pub amount_msat: u32,
    /// Expiry of the HTLC to offer (or the least the final hop accepts), in the
    /// unit of `update_add_htlc.expiry`.
    pub expiry: Locktime,
    /// The node to forward to; `None` at the final hop.
    pub next_node: Option<PublicKey>,
}

/// Why a payload is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PayloadError {
    /// A type or length is not a canonical BigSize, or a value runs past the end.
    #[error("payload TLV record is truncated or not canonical")]
    Malformed,
    /// Types not strictly increasing (BOLT 1).
    #[error("payload TLV type {0} does not increase")]
    Order(u64),
    /// An even type we do not know: the sender requires something we cannot do.
    #[error("payload has unknown even TLV type {0}")]
    UnknownEven(u64),
    /// A known record whose value has the wrong size or is not minimal.
    #[error("payload TLV type {0} has an invalid value")]
    Value(u64),
    /// A required record is absent.
    #[error("payload lacks TLV type {0}")]
    Missing(u64),
    /// Both expiry records are present.
    #[error("payload has an expiry in blocks and in seconds")]
    TwoExpiries,
    /// The amount does not fit `update_add_htlc.amount_msat` (uint32).
    #[error("payload amount {0} msat does not fit update_add_htlc")]
    AmountTooLarge(u64),
}

/// A truncated unsigned integer: big-endian with no leading zero byte, at most `max` bytes.
fn truncated(t: u64, value: &[u8], max: usize) -> Result<u64, PayloadError> {
    if value.len() > max || value.first() == Some(&0) {
        return Err(PayloadError::Value(t));
    }
    Ok(value.iter().fold(0, |acc, &b| acc << 8 | u64::from(b)))
}

fn write_record(t: u64, value: &[u8], out: &mut Vec<u8>) {
    write_bigsize(t, out);
    write_bigsize(value.len() as u64, out);
    out.extend_from_slice(value);
}

fn write_truncated(t: u64, v: u64, out: &mut Vec<u8>) {
    let bytes = v.to_be_bytes();
    let skip = bytes.iter().take_while(|&&b| b == 0).count();
    write_record(t, &bytes[skip..], out);
}

/// Splits the next record off `buf`: type, value, rest.
fn record(buf: &[u8]) -> Result<(u64, &[u8], &[u8]), PayloadError> {
    let (t, n) = read_bigsize(buf).ok_or(PayloadError::Malformed)?;
    let rest = &buf[n..];
    let (len, n) = read_bigsize(rest).ok_or(PayloadError::Malformed)?;
    let rest = &rest[n..];
    let len = usize::try_from(len)
        .ok()
        .filter(|&l| l <= rest.len())
        .ok_or(PayloadError::Malformed)?;
    Ok((t, &rest[..len], &rest[len..]))
}

impl HopPayload {
    /// The TLV stream, as [`crate::Hop::payload`] takes it.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(50);
        write_truncated(TLV_AMOUNT, u64::from(self.amount_msat), &mut out);
        match self.expiry {
            Locktime::Blocks(b) => write_truncated(TLV_EXPIRY_BLOCKS, u64::from(b), &mut out),
            Locktime::Seconds(s) => write_truncated(TLV_EXPIRY_SECONDS, u64::from(s), &mut out),
        }
        if let Some(node) = &self.next_node {
            write_record(TLV_NEXT_NODE, &node.serialize(), &mut out);
        }
        out
    }

    /// Reads and checks a payload that [`crate::peel`] returned.
    ///
    /// # Errors
    /// [`PayloadError`]: a malformed stream, an unknown even type, a bad or missing value.
    pub fn decode(mut buf: &[u8]) -> Result<HopPayload, PayloadError> {
        let (mut amount, mut blocks, mut seconds, mut next_node) = (None, None, None, None);
        let mut last: Option<u64> = None;
        while !buf.is_empty() {
            let (t, value, rest) = record(buf)?;
            if last.is_some_and(|l| t <= l) {
                return Err(PayloadError::Order(t));
            }
            last = Some(t);
            buf = rest;
            match t {
                TLV_AMOUNT => amount = Some(truncated(t, value, 8)?),
                TLV_EXPIRY_BLOCKS => blocks = Some(truncated(t, value, 4)? as u32),
                TLV_EXPIRY_SECONDS => seconds = Some(truncated(t, value, 4)? as u32),
                TLV_NEXT_NODE => {
                    let key = PublicKey::from_slice(value).map_err(|_| PayloadError::Value(t))?;
                    if value.len() != 33 {
                        return Err(PayloadError::Value(t));
                    }
                    next_node = Some(key);
                }
                t if t % 2 == 0 => return Err(PayloadError::UnknownEven(t)),
                _ => {}
            }
        }
        let amount = amount.ok_or(PayloadError::Missing(TLV_AMOUNT))?;
        let expiry = match (blocks, seconds) {
            (Some(b), None) => Locktime::Blocks(b),
            (None, Some(s)) => Locktime::Seconds(s),
            (None, None) => return Err(PayloadError::Missing(TLV_EXPIRY_BLOCKS)),
            (Some(_), Some(_)) => return Err(PayloadError::TwoExpiries),
        };
        Ok(HopPayload {
            amount_msat: u32::try_from(amount).map_err(|_| PayloadError::AmountTooLarge(amount))?,
            expiry,
            next_node,
        })
    }
}
