//! Sphinx onion construction and peeling (BOLT 4 "Packet Construction" and "Onion Decryption").

use chacha20::cipher::{KeyIvInit, StreamCipher};
use chacha20::ChaCha20;
use hmac::{Hmac, Mac};
use secp256k1::ecdh::SharedSecret;
use secp256k1::{All, PublicKey, Scalar, Secp256k1, SecretKey};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use wire::Onion;

/// The only packet version BOLT 4 defines.
pub const VERSION: u8 = 0;
/// Length of the encrypted hop payloads inside every onion.
pub const HOP_PAYLOADS_LEN: usize = 1300;
const KEY_LEN: usize = 33;
const HMAC_LEN: usize = 32;
const KEY_AT: usize = 1;
const PAYLOADS_AT: usize = KEY_AT + KEY_LEN;
const HMAC_AT: usize = PAYLOADS_AT + HOP_PAYLOADS_LEN;

/// One hop of a route: who peels the layer, and what it reads there.
#[derive(Debug, Clone, Copy)]
pub struct Hop<'a> {
    /// The hop's node id; its layer is encrypted to this key.
    pub node_id: PublicKey,
    /// The hop's payload (a TLV stream: [`crate::HopPayload::encode`]).
    pub payload: &'a [u8],
}

/// A built onion with the secret it shares with each hop (to read failures they send back).
#[derive(Debug, Clone)]
pub struct Built {
    /// The packet for the first hop.
    pub packet: Onion,
    /// The shared secret of each hop, in route order.
    pub shared_secrets: Vec<[u8; 32]>,
}

/// What one layer held for us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peeled {
    /// Our payload, still encoded (decode it with [`crate::HopPayload::decode`]).
    pub payload: Vec<u8>,
    /// The secret we share with the sender (to encrypt a failure for it).
    pub shared_secret: [u8; 32],
    /// Whether the onion goes on, and what we pass on.
    pub next: Next,
}

/// After our layer: forward, or the payment ends here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Send this packet to the next hop.
    Forward(Onion),
    /// We are the final hop (the next HMAC is all zero).
    Final,
}

/// Why a route cannot be made into an onion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No hops.
    #[error("a route needs at least one hop")]
    EmptyRoute,
    /// A payload shorter than the 2 bytes a reader accepts.
    #[error("payload of hop {hop} is {len} bytes; BOLT 4 readers refuse fewer than 2")]
    PayloadTooShort {
        /// Index of the hop in the route.
        hop: usize,
        /// Its payload length.
        len: usize,
    },
    /// The payloads with their length prefixes and HMACs exceed the 1300 bytes.
    #[error("the route's payloads need {needed} bytes; an onion holds 1300")]
    RouteTooLong {
        /// Bytes the route would need.
        needed: usize,
    },
    /// A blinding factor made the ephemeral key invalid (probability about 2^-128).
    #[error("the session key blinds to an invalid key at hop {hop}; use another session key")]
    SessionKey {
        /// Index of the hop.
        hop: usize,
    },
}

/// Why a packet cannot be peeled: each is a reason to fail the HTLC back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeelError {
    /// A version other than 0.
    #[error("onion version {0}; only 0 is defined")]
    Version(u8),
    /// The ephemeral key is not a point on secp256k1.
    #[error("onion ephemeral key is not a valid public key")]
    EphemeralKey(#[source] secp256k1::Error),
    /// The HMAC does not match: altered, corrupted, not for us, or other associated data.
    #[error("onion HMAC does not match")]
    Hmac,
    /// Our payload's length prefix is not a canonical BigSize.
    #[error("onion payload length is not a canonical BigSize")]
    PayloadLength,
    /// Our payload is shorter than 2 bytes.
    #[error("onion payload is {0} bytes; at least 2 are required")]
    PayloadTooShort(u64),
    /// Our payload with its length prefix and the next HMAC runs past the 1300 bytes.
    #[error("onion payload of {0} bytes runs past the end of the packet")]
    PayloadTooLong(u64),
    /// Blinding gave an invalid next ephemeral key (probability about 2^-128).
    #[error("the next ephemeral key is invalid")]
    NextKey(#[source] secp256k1::Error),
}

/// HMAC-SHA256 keyed with `key` over the concatenation of `parts`.
fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes keys of any length, so this cannot fail.
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// The key of one type (`rho`, `mu`, `pad`) derived from a shared secret.
fn derive(key_type: &[u8], secret: &[u8; 32]) -> [u8; 32] {
    hmac(key_type, &[secret])
}

/// XORs `buf` with the ChaCha20 stream of `key` (zero nonce) from its start.
fn xor_stream(key: &[u8; 32], buf: &mut [u8]) {
    let mut cipher = ChaCha20::new(key.into(), &[0u8; 12].into());
    cipher.apply_keystream(buf);
}

/// SHA256(ephemeral public key ‖ shared secret): how each hop blinds the ephemeral key.
fn blinding_factor(ephemeral: &PublicKey, secret: &[u8; 32]) -> Scalar {
    let hash: [u8; 32] = Sha256::new()
        .chain_update(ephemeral.serialize())
        .chain_update(secret)
        .finalize()
        .into();
    // A SHA256 output at or above the curve order has probability about 2^-128;
    // reducing it would differ from every other implementation, so it maps to ZERO,
    // which the tweak then refuses as an invalid result.
    Scalar::from_be_bytes(hash).unwrap_or(Scalar::ZERO)
}

/// Bytes a hop's entry takes: BigSize length, payload, HMAC.
fn shift_size(payload_len: usize) -> usize {
    bigsize_len(payload_len as u64) + payload_len + HMAC_LEN
}

pub(crate) fn bigsize_len(v: u64) -> usize {
    match v {
        0..=0xfc => 1,
        0xfd..=0xffff => 3,
        0x1_0000..=0xffff_ffff => 5,
        _ => 9,
    }
}

pub(crate) fn write_bigsize(v: u64, out: &mut Vec<u8>) {
    match bigsize_len(v) {
        1 => out.push(v as u8),
        3 => {
            out.push(0xfd);
            out.extend_from_slice(&(v as u16).to_be_bytes());
        }
        5 => {
            out.push(0xfe);
            out.extend_from_slice(&(v as u32).to_be_bytes());
        }
        _ => {
            out.push(0xff);
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
}

/// Reads a canonical BigSize from the front of `buf`: the value and the bytes it took.
pub(crate) fn read_bigsize(buf: &[u8]) -> Option<(u64, usize)> {
    let (&first, rest) = buf.split_first()?;
    let (value, len) = match first {
        0xfd => (
            u64::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?)),
            3,
        ),
        0xfe => (
            u64::from(u32::from_be_bytes(rest.get(..4)?.try_into().ok()?)),
            5,
        ),
        0xff => (u64::from_be_bytes(rest.get(..8)?.try_into().ok()?), 9),
        small => (u64::from(small), 1),
    };
    // BOLT 1: a value that a shorter form could hold is not canonical.
    (bigsize_len(value) == len).then_some((value, len))
}

/// Shared secrets for each hop, walking the ephemeral key along the route.
fn shared_secrets(
    secp: &Secp256k1<All>,
    session_key: &SecretKey,
    hops: &[Hop<'_>],
) -> Result<Vec<[u8; 32]>, BuildError> {
    let mut ephemeral = *session_key;
    let mut secrets = Vec::with_capacity(hops.len());
    for (i, hop) in hops.iter().enumerate() {
        let secret = SharedSecret::new(&hop.node_id, &ephemeral).secret_bytes();
        let public = PublicKey::from_secret_key(secp, &ephemeral);
        ephemeral = ephemeral
            .mul_tweak(&blinding_factor(&public, &secret))
            .map_err(|_| BuildError::SessionKey { hop: i })?;
        secrets.push(secret);
    }
    Ok(secrets)
}

/// The tail that the hops before the last will have appended and encrypted by
/// the time the last hop reads the packet; the sender puts it there so that the
/// last HMACs cover what those hops will really see.
fn filler(hops: &[Hop<'_>], secrets: &[[u8; 32]]) -> Vec<u8> {
    let mut filler: Vec<u8> = Vec::new();
    for (hop, secret) in hops.iter().zip(secrets).take(hops.len().saturating_sub(1)) {
        let start = HOP_PAYLOADS_LEN - filler.len();
        let shift = shift_size(hop.payload.len());
        filler.resize(filler.len() + shift, 0);
        // The hop XORs 2 × 1300 bytes; the filler sits at [start, 1300 + shift) of that stream.
        let mut stream = vec![0u8; HOP_PAYLOADS_LEN + shift];
        xor_stream(&derive(b"rho", secret), &mut stream);
        for (f, s) in filler.iter_mut().zip(&stream[start..]) {
            *f ^= s;
        }
    }
    filler
}

/// Builds the onion that carries `hops[i].payload` to `hops[i].node_id`, in order.
///
/// `session_key` must be fresh and random for every onion (the caller draws it:
/// this crate has no RNG). `associated_data` is the payment hash: every HMAC
/// commits to it, so the onion is useless with another HTLC.
///
/// # Errors
/// An empty route, a payload under 2 bytes, or payloads that do not fit 1300 bytes.
pub fn build(
    secp: &Secp256k1<All>,
    session_key: &SecretKey,
    hops: &[Hop<'_>],
    associated_data: &[u8],
) -> Result<Built, BuildError> {
    if hops.is_empty() {
        return Err(BuildError::EmptyRoute);
    }
    if let Some((hop, h)) = hops.iter().enumerate().find(|(_, h)| h.payload.len() < 2) {
        return Err(BuildError::PayloadTooShort {
            hop,
            len: h.payload.len(),
        });
    }
    let needed: usize = hops.iter().map(|h| shift_size(h.payload.len())).sum();
    if needed > HOP_PAYLOADS_LEN {
        return Err(BuildError::RouteTooLong { needed });
    }
    let secrets = shared_secrets(secp, session_key, hops)?;
    let filler = filler(hops, &secrets);

    // Random-looking start, so that the unused tail reveals nothing about the route length.
    let mut payloads = vec![0u8; HOP_PAYLOADS_LEN];
    xor_stream(&derive(b"pad", &session_key.secret_bytes()), &mut payloads);
    let mut next_hmac = [0u8; HMAC_LEN];
    for (i, (hop, secret)) in hops.iter().zip(&secrets).enumerate().rev() {
        let shift = shift_size(hop.payload.len());
        payloads.copy_within(..HOP_PAYLOADS_LEN - shift, shift);
        let mut entry = Vec::with_capacity(shift);
        write_bigsize(hop.payload.len() as u64, &mut entry);
        entry.extend_from_slice(hop.payload);
        entry.extend_from_slice(&next_hmac);
        payloads[..shift].copy_from_slice(&entry);
        xor_stream(&derive(b"rho", secret), &mut payloads);
        if i == hops.len() - 1 {
            payloads[HOP_PAYLOADS_LEN - filler.len()..].copy_from_slice(&filler);
        }
        next_hmac = hmac(&derive(b"mu", secret), &[&payloads, associated_data]);
    }

    let mut packet = Box::new([0u8; Onion::LEN]);
    packet[0] = VERSION;
    packet[KEY_AT..PAYLOADS_AT]
        .copy_from_slice(&PublicKey::from_secret_key(secp, session_key).serialize());
    packet[PAYLOADS_AT..HMAC_AT].copy_from_slice(&payloads);
    packet[HMAC_AT..].copy_from_slice(&next_hmac);
    Ok(Built {
        packet: Onion::new(packet),
        shared_secrets: secrets,
    })
}

/// Peels our layer off `packet` with our node key: our payload, and the packet to forward.
///
/// `associated_data` is the HTLC's payment hash. Peeling is a pure function of
/// its inputs: a caller that must refuse a replayed onion keeps the HMACs it saw.
///
/// # Errors
/// [`PeelError`]: version, key, HMAC or payload length; the HTLC should be failed.
pub fn peel(
    secp: &Secp256k1<All>,
    node_key: &SecretKey,
    packet: &Onion,
    associated_data: &[u8],
) -> Result<Peeled, PeelError> {
    let bytes = packet.as_bytes();
    if bytes[0] != VERSION {
        return Err(PeelError::Version(bytes[0]));
    }
    let ephemeral =
        PublicKey::from_slice(&bytes[KEY_AT..PAYLOADS_AT]).map_err(PeelError::EphemeralKey)?;
    let payloads = &bytes[PAYLOADS_AT..HMAC_AT];
    let secret = SharedSecret::new(&ephemeral, node_key).secret_bytes();
    let expected = hmac(&derive(b"mu", &secret), &[payloads, associated_data]);
    if !bool::from(expected.ct_eq(&bytes[HMAC_AT..])) {
        return Err(PeelError::Hmac);
    }

    // Our 1300 bytes and 1300 zeros, decrypted: the zeros become the tail we pass on.
    let mut plain = vec![0u8; 2 * HOP_PAYLOADS_LEN];
    plain[..HOP_PAYLOADS_LEN].copy_from_slice(payloads);
    xor_stream(&derive(b"rho", &secret), &mut plain);
    let (len, prefix) = read_bigsize(&plain).ok_or(PeelError::PayloadLength)?;
    if len < 2 {
        return Err(PeelError::PayloadTooShort(len));
    }
    let shift = usize::try_from(len)
        .ok()
        .and_then(|l| l.checked_add(prefix + HMAC_LEN))
        .filter(|&s| s <= HOP_PAYLOADS_LEN)
        .ok_or(PeelError::PayloadTooLong(len))?;
    let payload = plain[prefix..shift - HMAC_LEN].to_vec();
    let next_hmac = &plain[shift - HMAC_LEN..shift];

    let next = if next_hmac.iter().all(|&b| b == 0) {
        Next::Final
    } else {
        let next_key = ephemeral
            .mul_tweak(secp, &blinding_factor(&ephemeral, &secret))
            .map_err(PeelError::NextKey)?;
        let mut next = Box::new([0u8; Onion::LEN]);
        next[0] = VERSION;
        next[KEY_AT..PAYLOADS_AT].copy_from_slice(&next_key.serialize());
        next[PAYLOADS_AT..HMAC_AT].copy_from_slice(&plain[shift..shift + HOP_PAYLOADS_LEN]);
        next[HMAC_AT..].copy_from_slice(next_hmac);
        Next::Forward(Onion::new(next))
    };
    Ok(Peeled {
        payload,
        shared_secret: secret,
        next,
    })
}
