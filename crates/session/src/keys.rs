//! Key derivation of the v3 session: ECDH, then SHA-256 of secret ‖ sender's session key ‖ 0/1/2.

use secp256k1::{ecdh::SharedSecret, PublicKey, SecretKey};
use sha2::{Digest, Sha256};

/// Length of a session public key on the wire (compressed SEC).
pub const SESSION_KEY_LEN: usize = 33;

/// The keys of one direction; `pub` in the derivation is the session key of the side that sends.
#[derive(Clone, PartialEq, Eq)]
pub struct DirectionKeys {
    /// First 16 bytes of SHA256(secret ‖ pub ‖ 0x00).
    pub aes_key: [u8; 16],
    /// SHA256(secret ‖ pub ‖ 0x01).
    pub hmac_key: [u8; 32],
    /// First 16 bytes of SHA256(secret ‖ pub ‖ 0x02): the first counter block.
    pub iv: [u8; 16],
}

impl std::fmt::Debug for DirectionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DirectionKeys(..)")
    }
}

impl DirectionKeys {
    /// Derives the keys for frames sent by the owner of `sender_session_key`.
    pub fn derive(secret: &[u8; 32], sender_session_key: &[u8; SESSION_KEY_LEN]) -> Self {
        let h = |tag: u8| -> [u8; 32] {
            let mut hasher = Sha256::new();
            hasher.update(secret);
            hasher.update(sender_session_key);
            hasher.update([tag]);
            hasher.finalize().into()
        };
        let (k0, k1, k2) = (h(0), h(1), h(2));
        let mut aes_key = [0u8; 16];
        aes_key.copy_from_slice(&k0[..16]);
        let mut iv = [0u8; 16];
        iv.copy_from_slice(&k2[..16]);
        DirectionKeys {
            aes_key,
            hmac_key: k1,
            iv,
        }
    }
}

/// Both directions' keys of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionKeys {
    /// SHA256 of the compressed ECDH point.
    pub shared_secret: [u8; 32],
    /// For frames we send.
    pub send: DirectionKeys,
    /// For frames we receive.
    pub receive: DirectionKeys,
}

impl SessionKeys {
    /// Derives the keys from our session secret and the peer's session public key.
    pub fn derive(
        our_secret: &SecretKey,
        our_public: &PublicKey,
        their_public: &PublicKey,
    ) -> Self {
        // libsecp256k1's default ECDH hash: SHA256(02/03 ‖ x), as the reference uses.
        let shared_secret = SharedSecret::new(their_public, our_secret).secret_bytes();
        SessionKeys {
            shared_secret,
            send: DirectionKeys::derive(&shared_secret, &our_public.serialize()),
            receive: DirectionKeys::derive(&shared_secret, &their_public.serialize()),
        }
    }
}

/// Parses a peer's 33-byte session key: prefix 02 or 03 and a point on the curve.
///
/// # Errors
/// [`crate::HandshakeError::SessionKeyLength`] or [`crate::HandshakeError::InvalidSessionKey`].
pub fn parse_session_key(bytes: &[u8]) -> Result<PublicKey, crate::HandshakeError> {
    if bytes.len() != SESSION_KEY_LEN {
        return Err(crate::HandshakeError::SessionKeyLength { len: bytes.len() });
    }
    if !matches!(bytes[0], 0x02 | 0x03) {
        return Err(crate::HandshakeError::InvalidSessionKey);
    }
    PublicKey::from_slice(bytes).map_err(|_| crate::HandshakeError::InvalidSessionKey)
}
