//! Frames of the v3 session: AES-128-CTR, encrypt-then-MAC with HMAC-SHA256, a running `totlen`.
//!
//! ```text
//! frame = hmac[32] ‖ totlen[8, LE u64] ‖ ciphertext[roundup16(len)]
//! hmac  = HMAC-SHA256(hmac_key, totlen ‖ ciphertext)
//! ```
//! `totlen` counts unpadded payload bytes sent in this direction so far,
//! including this frame (PROTOCOL-NOTES §2: what the reference's code and
//! every reference peer do, not what its comment says). One CTR keystream
//! runs through the whole connection; padding is encrypted too, so every
//! frame starts on a fresh counter block.

use aes::cipher::{KeyIvInit, StreamCipher};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::keys::DirectionKeys;

type Aes128Ctr = ctr::Ctr128BE<aes::Aes128>;
type HmacSha256 = Hmac<Sha256>;

/// Bytes before the ciphertext: the HMAC and `totlen`.
pub const HEADER_LEN: usize = 32 + 8;

/// The largest payload one frame may carry (exactly 1 MiB is allowed).
pub const MAX_PAYLOAD: usize = 1 << 20;

/// Payload length rounded up to the 16-byte AES block.
pub fn padded_len(len: usize) -> usize {
    len.div_ceil(16) * 16
}

/// Why a frame was refused. After any of these the key streams are out of step or the peer is hostile: close.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// `totlen` is below what was already received.
    #[error("totlen went backwards: {totlen} after {received} bytes")]
    TotlenBackwards {
        /// The header's value.
        totlen: u64,
        /// Payload bytes received before this frame.
        received: u64,
    },
    /// `totlen` announces a frame with no payload.
    #[error("frame with an empty payload")]
    EmptyFrame,
    /// `totlen` announces a payload above [`MAX_PAYLOAD`].
    #[error("frame of {len} bytes is over the {MAX_PAYLOAD}-byte bound")]
    TooLarge {
        /// The announced payload length.
        len: u64,
    },
    /// The HMAC does not match.
    #[error("bad HMAC")]
    BadHmac,
    /// The padding decrypted to something other than zeros.
    #[error("non-zero padding")]
    BadPadding,
}

/// Why a payload could not be sealed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// Empty payloads cannot be sent: the receiver would see a zero-length frame.
    #[error("empty payload")]
    Empty,
    /// The payload is above [`MAX_PAYLOAD`].
    #[error("payload of {len} bytes is over the {MAX_PAYLOAD}-byte bound")]
    TooLarge {
        /// Its length.
        len: usize,
    },
}

/// HMAC-SHA256 keyed with a 32-byte key.
fn hmac_with(key: &[u8; 32]) -> HmacSha256 {
    // HMAC zero-pads a short key to the 64-byte block, so padding it here is the
    // same key, and takes the infallible constructor.
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(key);
    <HmacSha256 as hmac::digest::KeyInit>::new(&block.into())
}

/// Where [`Opener::open_in_place`] left the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedFrame {
    /// The payload's bytes within the buffer.
    pub payload: std::ops::Range<usize>,
    /// Bytes of the buffer the frame took.
    pub frame_len: usize,
}

/// Seals payloads into frames for one direction.
pub struct Sealer {
    cipher: Aes128Ctr,
    mac: HmacSha256,
    sent: u64,
}

impl Sealer {
    /// A sealer at the start of the connection.
    pub fn new(keys: &DirectionKeys) -> Self {
        Sealer {
            cipher: Aes128Ctr::new(&keys.aes_key.into(), &keys.iv.into()),
            mac: hmac_with(&keys.hmac_key),
            sent: 0,
        }
    }

    /// Payload bytes sealed so far (the last frame's `totlen`).
    pub fn total_sent(&self) -> u64 {
        self.sent
    }

    /// Appends the frame carrying `payload` to `out`.
    ///
    /// # Errors
    /// An empty payload or one above [`MAX_PAYLOAD`]; nothing is written then.
    pub fn seal_into(&mut self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), SealError> {
        if payload.is_empty() {
            return Err(SealError::Empty);
        }
        if payload.len() > MAX_PAYLOAD {
            return Err(SealError::TooLarge { len: payload.len() });
        }
        let totlen = self.sent + payload.len() as u64;
        let start = out.len();
        out.resize(start + HEADER_LEN, 0);
        out[start + 32..start + HEADER_LEN].copy_from_slice(&totlen.to_le_bytes());
        out.extend_from_slice(payload);
        out.resize(start + HEADER_LEN + padded_len(payload.len()), 0);
        self.cipher.apply_keystream(&mut out[start + HEADER_LEN..]);
        let mut mac = self.mac.clone();
        mac.update(&out[start + 32..]);
        out[start..start + 32].copy_from_slice(&mac.finalize().into_bytes());
        self.sent = totlen;
        Ok(())
    }

    /// TEST ONLY: like [`Sealer::seal`] with the padding filled with `pad` instead of zeros
    /// (a frame with a valid MAC that receivers must refuse).
    ///
    /// # Errors
    /// As [`Sealer::seal_into`].
    #[cfg(feature = "test-hooks")]
    pub fn seal_with_padding(&mut self, payload: &[u8], pad: u8) -> Result<Vec<u8>, SealError> {
        let mut out = self.seal(payload)?;
        // Re-seal by hand: undo nothing, just rebuild the body with the chosen padding.
        let body_len = out.len() - HEADER_LEN;
        let mut body = payload.to_vec();
        body.resize(body_len, pad);
        // The keystream already moved past this frame: encrypt with a fresh one at the same
        // position by xoring the difference (zeros → pad) into the ciphertext.
        for (i, b) in out[HEADER_LEN + payload.len()..].iter_mut().enumerate() {
            *b ^= body[payload.len() + i];
        }
        let mut mac = self.mac.clone();
        mac.update(&out[32..]);
        out[..32].copy_from_slice(&mac.finalize().into_bytes());
        Ok(out)
    }

    /// The frame carrying `payload`.
    ///
    /// # Errors
    /// As [`Sealer::seal_into`].
    pub fn seal(&mut self, payload: &[u8]) -> Result<Vec<u8>, SealError> {
        let mut out = Vec::with_capacity(HEADER_LEN + padded_len(payload.len()));
        self.seal_into(payload, &mut out)?;
        Ok(out)
    }
}

/// Opens frames of one direction.
pub struct Opener {
    cipher: Aes128Ctr,
    mac: HmacSha256,
    received: u64,
}

impl Opener {
    /// An opener at the start of the connection.
    pub fn new(keys: &DirectionKeys) -> Self {
        Opener {
            cipher: Aes128Ctr::new(&keys.aes_key.into(), &keys.iv.into()),
            mac: hmac_with(&keys.hmac_key),
            received: 0,
        }
    }

    /// Payload bytes opened so far.
    pub fn total_received(&self) -> u64 {
        self.received
    }

    /// From a frame header, the payload length it announces; checked before anything is read or reserved.
    ///
    /// # Errors
    /// `totlen` going backwards, an empty frame, or one over the bound.
    pub fn payload_len(&self, header: &[u8; HEADER_LEN]) -> Result<usize, FrameError> {
        let mut totlen = [0u8; 8];
        totlen.copy_from_slice(&header[32..]);
        let totlen = u64::from_le_bytes(totlen);
        let Some(len) = totlen.checked_sub(self.received) else {
            return Err(FrameError::TotlenBackwards {
                totlen,
                received: self.received,
            });
        };
        if len == 0 {
            return Err(FrameError::EmptyFrame);
        }
        if len > MAX_PAYLOAD as u64 {
            return Err(FrameError::TooLarge { len });
        }
        Ok(len as usize)
    }

    /// Checks and decrypts one frame; `body` holds exactly the padded ciphertext.
    ///
    /// Returns the payload. The opener advances only on success.
    ///
    /// # Errors
    /// A bad header (see [`Opener::payload_len`]), a bad HMAC, or non-zero padding.
    pub fn open(&mut self, header: &[u8; HEADER_LEN], body: &[u8]) -> Result<Vec<u8>, FrameError> {
        let len = self.payload_len(header)?;
        if body.len() != padded_len(len) {
            // The caller read the wrong amount; to the peer this is the same as a bad MAC.
            return Err(FrameError::BadHmac);
        }
        let mut frame = Vec::with_capacity(HEADER_LEN + body.len());
        frame.extend_from_slice(header);
        frame.extend_from_slice(body);
        let opened = self.open_in_place(&mut frame)?.ok_or(FrameError::BadHmac)?;
        frame.truncate(opened.payload.end);
        frame.drain(..opened.payload.start);
        Ok(frame)
    }

    /// Opens the first complete frame in `buf` in place, without copying or allocating.
    ///
    /// Returns `Ok(None)` while the frame is incomplete; once it is whole the
    /// ciphertext in `buf` is replaced by the plaintext, and the payload is
    /// `buf[opened.payload]`; the caller drops `opened.frame_len` bytes.
    /// After an error the opener must not be used again: the session is over.
    ///
    /// # Errors
    /// As [`Opener::open`].
    pub fn open_in_place(&mut self, buf: &mut [u8]) -> Result<Option<OpenedFrame>, FrameError> {
        let Some(header) = buf.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let len = self.payload_len(header)?;
        let frame_len = HEADER_LEN + padded_len(len);
        let Some(frame) = buf.get_mut(..frame_len) else {
            return Ok(None);
        };
        let (header, body) = frame.split_at_mut(HEADER_LEN);
        let mut mac = self.mac.clone();
        mac.update(&header[32..]);
        mac.update(body);
        mac.verify_slice(&header[..32])
            .map_err(|_| FrameError::BadHmac)?;
        self.cipher.apply_keystream(body);
        if body[len..].iter().any(|&b| b != 0) {
            return Err(FrameError::BadPadding);
        }
        self.received += len as u64;
        Ok(Some(OpenedFrame {
            payload: HEADER_LEN..HEADER_LEN + len,
            frame_len,
        }))
    }

    /// Opens the first complete frame in `buf`, if there is one.
    ///
    /// Returns `Ok(None)` while the frame is incomplete and `Ok(Some((payload,
    /// consumed)))` once it is whole; the caller drops `consumed` bytes.
    ///
    /// # Errors
    /// As [`Opener::open`]; a bad header is reported as soon as the header is in.
    pub fn open_from(&mut self, buf: &[u8]) -> Result<Option<(Vec<u8>, usize)>, FrameError> {
        let Some(header) = buf.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let total = HEADER_LEN + padded_len(self.payload_len(header)?);
        if buf.len() < total {
            return Ok(None);
        }
        let payload = self.open(header, &buf[HEADER_LEN..total])?;
        Ok(Some((payload, total)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(b: u8) -> DirectionKeys {
        DirectionKeys {
            aes_key: [b; 16],
            hmac_key: [b.wrapping_add(1); 32],
            iv: [b.wrapping_add(2); 16],
        }
    }

    #[test]
    fn sealed_frames_open_in_order_and_totlen_counts_payload() {
        let mut sealer = Sealer::new(&keys(1));
        let mut opener = Opener::new(&keys(1));
        for len in [1, 15, 16, 17, 1000, MAX_PAYLOAD] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let frame = sealer.seal(&payload).unwrap();
            assert_eq!(frame.len(), HEADER_LEN + padded_len(len));
            assert_eq!(
                u64::from_le_bytes(frame[32..40].try_into().unwrap()),
                sealer.total_sent()
            );
            assert_eq!(
                opener.open_from(&frame).unwrap(),
                Some((payload, frame.len()))
            );
        }
        assert_eq!(opener.total_received(), sealer.total_sent());
    }

    #[test]
    fn in_place_matches_copying_open() {
        let mut sealer = Sealer::new(&keys(2));
        let mut copying = Opener::new(&keys(2));
        let mut in_place = Opener::new(&keys(2));
        let mut stream = Vec::new();
        for len in [3usize, 16, 100] {
            sealer
                .seal_into(&vec![len as u8; len], &mut stream)
                .unwrap();
        }
        let mut at = 0;
        while at < stream.len() {
            let (expected, used) = copying.open_from(&stream[at..]).unwrap().unwrap();
            let mut rest = stream[at..].to_vec();
            assert_eq!(in_place.open_in_place(&mut rest[..used - 1]), Ok(None));
            let opened = in_place.open_in_place(&mut rest).unwrap().unwrap();
            assert_eq!(rest[opened.payload.clone()], expected[..]);
            assert_eq!(opened.frame_len, used);
            at += used;
        }
        let mut bad = sealer.seal(b"x").unwrap();
        bad[0] ^= 1;
        assert_eq!(in_place.open_in_place(&mut bad), Err(FrameError::BadHmac));
    }

    #[test]
    fn incomplete_is_not_invalid() {
        let mut sealer = Sealer::new(&keys(1));
        let mut opener = Opener::new(&keys(1));
        let frame = sealer.seal(b"hello").unwrap();
        for cut in 0..frame.len() {
            assert_eq!(opener.open_from(&frame[..cut]), Ok(None));
        }
        assert!(opener.open_from(&frame).unwrap().is_some());
    }

    #[test]
    fn seal_bounds() {
        let mut sealer = Sealer::new(&keys(1));
        assert_eq!(sealer.seal(&[]), Err(SealError::Empty));
        assert_eq!(
            sealer.seal(&vec![0; MAX_PAYLOAD + 1]),
            Err(SealError::TooLarge {
                len: MAX_PAYLOAD + 1
            })
        );
        assert_eq!(sealer.total_sent(), 0);
    }

    #[test]
    fn every_flipped_bit_is_refused_and_the_opener_stays_put() {
        let mut sealer = Sealer::new(&keys(3));
        let frame = sealer.seal(b"some payload").unwrap();
        let next = sealer.seal(b"next").unwrap();
        let mut opener = Opener::new(&keys(3));
        for bit in 0..frame.len() * 8 {
            let mut bad = frame.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            // A flipped totlen bit may announce a longer frame (still incomplete); nothing opens.
            assert!(!matches!(opener.open_from(&bad), Ok(Some(_))), "bit {bit}");
            assert_eq!(opener.total_received(), 0);
        }
        assert!(opener.open_from(&frame).unwrap().is_some());
        assert!(opener.open_from(&next).unwrap().is_some());
    }

    #[test]
    fn header_checks() {
        let mut sealer = Sealer::new(&keys(4));
        let mut opener = Opener::new(&keys(4));
        let first = sealer.seal(b"0123456789").unwrap();
        opener.open_from(&first).unwrap().unwrap();
        let mut header = [0u8; HEADER_LEN];
        header[32..].copy_from_slice(&5u64.to_le_bytes());
        assert_eq!(
            opener.payload_len(&header),
            Err(FrameError::TotlenBackwards {
                totlen: 5,
                received: 10
            })
        );
        header[32..].copy_from_slice(&10u64.to_le_bytes());
        assert_eq!(opener.payload_len(&header), Err(FrameError::EmptyFrame));
        header[32..].copy_from_slice(&(10 + MAX_PAYLOAD as u64).to_le_bytes());
        assert_eq!(opener.payload_len(&header), Ok(MAX_PAYLOAD));
        header[32..].copy_from_slice(&(11 + MAX_PAYLOAD as u64).to_le_bytes());
        assert_eq!(
            opener.payload_len(&header),
            Err(FrameError::TooLarge {
                len: MAX_PAYLOAD as u64 + 1
            })
        );
    }

    #[test]
    fn nonzero_padding_is_refused() {
        // A frame whose padding encrypts non-zero bytes, built with the real keystream and a valid MAC.
        let k = keys(5);
        let mut cipher = Aes128Ctr::new(&k.aes_key.into(), &k.iv.into());
        let mut body = *b"abc\x01\0\0\0\0\0\0\0\0\0\0\0\0";
        cipher.apply_keystream(&mut body);
        let mut frame = vec![0u8; 32];
        frame.extend_from_slice(&3u64.to_le_bytes());
        frame.extend_from_slice(&body);
        let mut mac = HmacSha256::new_from_slice(&k.hmac_key).unwrap();
        mac.update(&frame[32..]);
        frame[..32].copy_from_slice(&mac.finalize().into_bytes());
        assert_eq!(
            Opener::new(&k).open_from(&frame),
            Err(FrameError::BadPadding)
        );
    }
}
