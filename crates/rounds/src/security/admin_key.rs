//! Admin access: the configured `X-Admin-Token`, kept as a digest and compared in constant time.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Why admin access was denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminDenied {
    /// No admin token is configured: nothing grants access.
    Disabled,
    /// The request carries no token.
    Missing,
    /// The token does not match.
    Invalid,
}

impl AdminDenied {
    /// The text answered to the client.
    pub fn message(self) -> &'static str {
        match self {
            AdminDenied::Disabled => "admin access is disabled",
            AdminDenied::Missing => "missing X-Admin-Token header",
            AdminDenied::Invalid => "invalid admin token",
        }
    }
}

/// The configured admin token, kept as a digest so the comparison has a
/// fixed length and runs in constant time.
#[derive(Clone)]
pub struct AdminKey(Option<[u8; 32]>);

impl std::fmt::Debug for AdminKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "AdminKey(set)"
        } else {
            "AdminKey(disabled)"
        })
    }
}

impl AdminKey {
    /// From the configured token; unset or empty disables admin access.
    pub fn new(token: Option<&str>) -> Self {
        match token {
            Some(t) if !t.is_empty() => AdminKey(Some(Sha256::digest(t.as_bytes()).into())),
            _ => AdminKey(None),
        }
    }

    /// Whether `presented` grants access.
    ///
    /// # Errors
    /// Why access is denied.
    pub fn check(&self, presented: Option<&[u8]>) -> Result<(), AdminDenied> {
        // Disabled is decided before any comparison: nothing grants then,
        // not even an empty header.
        let Some(expected) = &self.0 else {
            return Err(AdminDenied::Disabled);
        };
        let Some(presented) = presented else {
            return Err(AdminDenied::Missing);
        };
        let digest: [u8; 32] = Sha256::digest(presented).into();
        if bool::from(digest.ct_eq(expected)) {
            Ok(())
        } else {
            Err(AdminDenied::Invalid)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_empty_token_never_grants() {
        for key in [AdminKey::new(None), AdminKey::new(Some(""))] {
            assert!(key.check(None).is_err());
            assert!(key.check(Some(b"")).is_err());
            assert!(key.check(Some(b"anything")).is_err());
        }
        let key = AdminKey::new(Some("s3cret"));
        assert!(key.check(Some(b"s3cret")).is_ok());
        assert!(key.check(Some(b"s3cret ")).is_err());
        assert!(key.check(Some(b"")).is_err());
        assert!(key.check(None).is_err());
    }
}
