//! Session tokens: HS256 JWTs with a 24 h lifetime and the `tv` claim.
//!
//! Written on `hmac`/`sha2` (already in the tree) rather than a JWT crate:
//! we issue and accept exactly one algorithm, so the whole format is a
//! fixed header, two base64url segments and one HMAC, and the strictness
//! (only `HS256`, `exp` required, no leeway) is plain to see here.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret as _, SecretSlice};
use sha2::Sha256;

/// Lifetime of a session token.
pub const TOKEN_LIFETIME_SECS: i64 = 24 * 3600;

/// The claims we issue.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Claims {
    /// The user's id, as a string (JWT convention).
    pub sub: String,
    /// The user's token_version at issue time.
    pub tv: i64,
    /// Issued at, unix seconds.
    pub iat: i64,
    /// Expiry, unix seconds.
    pub exp: i64,
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// Not three base64url segments of JSON with the claims we issue.
    #[error("malformed token")]
    Malformed,
    /// The header names an algorithm other than HS256 (including `none`).
    #[error("unsupported algorithm")]
    WrongAlgorithm,
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// Past `exp`.
    #[error("token expired")]
    Expired,
}

#[derive(serde::Deserialize)]
struct Header {
    alg: String,
}

/// Issues and verifies tokens with one HMAC secret (no `Debug` shows it).
#[derive(Clone, Debug)]
pub struct TokenKeys {
    secret: std::sync::Arc<SecretSlice<u8>>,
}

const HEADER_B64: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"; // {"alg":"HS256","typ":"JWT"}

impl TokenKeys {
    /// Keys from a secret (at least 32 bytes recommended).
    pub fn new(secret: &[u8]) -> Self {
        Self {
            secret: std::sync::Arc::new(secret.to_vec().into()),
        }
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC accepts keys of every length; this cannot fail.
        <Hmac<Sha256> as Mac>::new_from_slice(self.secret.expose_secret())
            .expect("HMAC takes any key length")
    }

    /// A token for user `user_id` at token version `tv`, valid 24 h from `now`.
    pub fn issue(&self, user_id: i64, tv: i64, now: i64) -> String {
        let claims = Claims {
            sub: user_id.to_string(),
            tv,
            iat: now,
            exp: now + TOKEN_LIFETIME_SECS,
        };
        // Serialising a struct of strings and integers cannot fail.
        let payload = serde_json::to_vec(&claims).expect("claims serialise");
        let signing_input = format!("{HEADER_B64}.{}", URL_SAFE_NO_PAD.encode(payload));
        let mut mac = self.mac();
        mac.update(signing_input.as_bytes());
        let sig = mac.finalize().into_bytes();
        format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig))
    }

    /// Checks a token at time `now` and returns its claims.
    ///
    /// # Errors
    /// [`TokenError`] saying why it was refused.
    pub fn verify(&self, token: &str, now: i64) -> Result<Claims, TokenError> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let header_json = URL_SAFE_NO_PAD
            .decode(h)
            .map_err(|_| TokenError::Malformed)?;
        let header: Header =
            serde_json::from_slice(&header_json).map_err(|_| TokenError::Malformed)?;
        if header.alg != "HS256" {
            return Err(TokenError::WrongAlgorithm);
        }
        let sig = URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| TokenError::Malformed)?;
        let mut mac = self.mac();
        mac.update(h.as_bytes());
        mac.update(b".");
        mac.update(p.as_bytes());
        // verify_slice compares in constant time.
        mac.verify_slice(&sig)
            .map_err(|_| TokenError::BadSignature)?;
        let payload = URL_SAFE_NO_PAD
            .decode(p)
            .map_err(|_| TokenError::Malformed)?;
        let claims: Claims = serde_json::from_slice(&payload).map_err(|_| TokenError::Malformed)?;
        if now >= claims.exp {
            return Err(TokenError::Expired);
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmac::Mac;

    #[test]
    fn debug_never_shows_the_secret() {
        let keys = TokenKeys::new(b"session-secret-bytes-0123456789ab");
        let text = format!("{keys:?}");
        assert!(!text.contains("session-secret"), "{text}");
        assert!(!text.contains("115, 101, 115"), "{text}");
    }

    fn forge(header: &str, claims: &Claims, key: &[u8], algo512: bool) -> String {
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).unwrap())
        );
        let sig = if algo512 {
            let mut m = <Hmac<sha2::Sha512> as Mac>::new_from_slice(key).unwrap();
            m.update(input.as_bytes());
            m.finalize().into_bytes().to_vec()
        } else {
            let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap();
            m.update(input.as_bytes());
            m.finalize().into_bytes().to_vec()
        };
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig))
    }

    #[test]
    fn round_trip() {
        let k = TokenKeys::new(b"0123456789abcdef0123456789abcdef");
        let t = k.issue(7, 3, 1000);
        let c = k.verify(&t, 1001).unwrap();
        assert_eq!(
            c,
            Claims {
                sub: "7".into(),
                tv: 3,
                iat: 1000,
                exp: 1000 + 86_400
            }
        );
    }

    #[test]
    fn header_is_hs256_jwt() {
        let json = URL_SAFE_NO_PAD.decode(HEADER_B64).unwrap();
        assert_eq!(json, br#"{"alg":"HS256","typ":"JWT"}"#);
    }

    #[test]
    fn refuses_expired_other_algorithms_none_and_bad_signatures() {
        let key = b"0123456789abcdef0123456789abcdef";
        let k = TokenKeys::new(key);
        let t = k.issue(7, 0, 1000);
        assert_eq!(k.verify(&t, 1000 + 86_400), Err(TokenError::Expired));
        let claims = Claims {
            sub: "7".into(),
            tv: 0,
            iat: 1000,
            exp: 999_999,
        };
        let hs512 = forge(r#"{"alg":"HS512","typ":"JWT"}"#, &claims, key, true);
        assert_eq!(k.verify(&hs512, 1001), Err(TokenError::WrongAlgorithm));
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap())
        );
        assert_eq!(k.verify(&none, 1001), Err(TokenError::WrongAlgorithm));
        let other_key = forge(
            r#"{"alg":"HS256","typ":"JWT"}"#,
            &claims,
            b"another secret",
            false,
        );
        assert_eq!(k.verify(&other_key, 1001), Err(TokenError::BadSignature));
        let good = forge(r#"{"alg":"HS256","typ":"JWT"}"#, &claims, key, false);
        assert!(k.verify(&good, 1001).is_ok());
        // Tampered payload under the original signature.
        let mut parts: Vec<&str> = t.split('.').collect();
        let evil = URL_SAFE_NO_PAD.encode(br#"{"sub":"1","tv":0,"iat":1000,"exp":99999999}"#);
        parts[1] = &evil;
        assert_eq!(
            k.verify(&parts.join("."), 1001),
            Err(TokenError::BadSignature)
        );
        assert_eq!(k.verify("a.b", 1001), Err(TokenError::Malformed));
        assert_eq!(k.verify("", 1001), Err(TokenError::Malformed));
    }
}
