//! Argon2id password hashing off the async runtime, with bounded concurrency.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use argon2::password_hash::{PasswordHash, PasswordHasher as _, PasswordVerifier as _, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use tokio::sync::Semaphore;

/// Shortest accepted password, in Unicode code points; shared by
/// registration, change-password and the admin reset.
pub const MIN_PASSWORD_LENGTH: usize = 8;

/// Longest accepted password, so that hashing cost stays bounded.
pub const MAX_PASSWORD_LENGTH: usize = 1024;

/// Argon2id cost parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashParams {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Passes.
    pub iterations: u32,
    /// Lanes.
    pub parallelism: u32,
}

impl HashParams {
    /// OWASP's recommendation for Argon2id: m = 19 MiB, t = 2, p = 1.
    pub const OWASP: HashParams = HashParams {
        memory_kib: 19_456,
        iterations: 2,
        parallelism: 1,
    };
}

impl Default for HashParams {
    fn default() -> Self {
        Self::OWASP
    }
}

/// Why a hash could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HashError {
    /// Parameters out of Argon2's range.
    #[error("invalid argon2 parameters: {0}")]
    Params(String),
    /// Hashing failed.
    #[error("hashing failed: {0}")]
    Hash(String),
    /// The blocking task died.
    #[error("hashing task failed: {0}")]
    Join(String),
}

/// Hashes and verifies passwords on the blocking thread pool; at most
/// `concurrency` run at once so that a login flood queues here instead of
/// starving request handling and background tasks of CPU. The permit moves
/// into the blocking task and is released when the hash ends, not when the
/// request does: a client that hangs up mid-login cannot free a slot while
/// its hash still burns a core.
#[derive(Clone)]
pub struct PasswordHasher {
    argon: Arc<Argon2<'static>>,
    permits: Arc<Semaphore>,
    concurrency: usize,
    /// Hashes running on the blocking pool right now.
    running: Arc<AtomicUsize>,
    /// A valid hash of a random password, verified against when the user is
    /// unknown or the stored hash is unparseable, so every login does the
    /// same Argon2 work.
    dummy_hash: Arc<str>,
}

impl std::fmt::Debug for PasswordHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PasswordHasher")
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

/// The outcome of checking a password against a stored hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The password matches.
    Match,
    /// It does not (or there was nothing to match).
    Mismatch,
    /// The stored hash is unparseable; treated as a mismatch by callers.
    CorruptHash,
}

impl PasswordHasher {
    /// A hasher with `params`, running at most `concurrency` hashes at once.
    ///
    /// # Errors
    /// [`HashError::Params`] for parameters Argon2 refuses.
    pub fn new(params: HashParams, concurrency: usize) -> Result<Self, HashError> {
        let p = Params::new(
            params.memory_kib,
            params.iterations,
            params.parallelism,
            None,
        )
        .map_err(|e| HashError::Params(e.to_string()))?;
        let argon = Argon2::new(Algorithm::Argon2id, Version::V0x13, p);
        let mut random = [0u8; 32];
        rand::Rng::fill(&mut rand::thread_rng(), &mut random);
        let salt = SaltString::generate(&mut rand::thread_rng());
        let dummy = argon
            .hash_password(&random, &salt)
            .map_err(|e| HashError::Hash(e.to_string()))?
            .to_string();
        let concurrency = concurrency.max(1);
        Ok(Self {
            argon: Arc::new(argon),
            permits: Arc::new(Semaphore::new(concurrency)),
            concurrency,
            running: Arc::new(AtomicUsize::new(0)),
            dummy_hash: dummy.into(),
        })
    }

    /// How many hashes may run at once.
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// Hashes running now (never more than [`Self::concurrency`]).
    pub fn in_flight(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// Runs `work` on the blocking pool holding a permit for its whole
    /// run; dropping the returned future before the permit is granted
    /// starts nothing, dropping it afterwards lets the hash finish.
    async fn run<R: Send + 'static>(
        &self,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, HashError> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| HashError::Join(e.to_string()))?;
        let running = self.running.clone();
        tokio::task::spawn_blocking(move || {
            // Decremented by the guard even if the hash panics.
            struct Running(Arc<AtomicUsize>);
            impl Drop for Running {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::Relaxed);
                }
            }
            running.fetch_add(1, Ordering::Relaxed);
            let _running = Running(running);
            let _permit = permit;
            work()
        })
        .await
        .map_err(|e| HashError::Join(e.to_string()))
    }

    /// Hashes `password` into a PHC string.
    ///
    /// # Errors
    /// [`HashError`] if hashing fails.
    pub async fn hash(&self, password: String) -> Result<String, HashError> {
        let argon = self.argon.clone();
        self.run(move || {
            let salt = SaltString::generate(&mut rand::thread_rng());
            argon
                .hash_password(password.as_bytes(), &salt)
                .map(|h| h.to_string())
                .map_err(|e| HashError::Hash(e.to_string()))
        })
        .await?
    }

    /// Verifies `password` against `stored`, or against the dummy hash when
    /// `stored` is `None` (unknown user) so the work is the same.
    ///
    /// # Errors
    /// [`HashError::Join`] if the blocking task died.
    pub async fn verify(
        &self,
        password: String,
        stored: Option<String>,
    ) -> Result<Verdict, HashError> {
        let argon = self.argon.clone();
        let dummy = self.dummy_hash.clone();
        self.run(move || {
            let known = stored.is_some();
            let stored = stored.unwrap_or_else(|| dummy.to_string());
            match PasswordHash::new(&stored) {
                Ok(parsed) => {
                    // The parameters of the stored hash are used, so hashes
                    // made under older parameters keep working.
                    let ok = argon.verify_password(password.as_bytes(), &parsed).is_ok();
                    if ok && known {
                        Verdict::Match
                    } else {
                        Verdict::Mismatch
                    }
                }
                Err(_) => {
                    if let Ok(parsed) = PasswordHash::new(&dummy) {
                        let _ = argon.verify_password(password.as_bytes(), &parsed);
                    }
                    Verdict::CorruptHash
                }
            }
        })
        .await
    }
}

/// Counts Unicode code points, the unit of the password-length rule.
pub fn password_length(password: &str) -> usize {
    password.chars().count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHEAP: HashParams = HashParams {
        memory_kib: 64,
        iterations: 1,
        parallelism: 1,
    };

    #[tokio::test]
    async fn hash_then_verify() {
        let h = PasswordHasher::new(CHEAP, 2).unwrap();
        let stored = h.hash("correct horse".into()).await.unwrap();
        assert!(stored.starts_with("$argon2id$v=19$m=64,t=1,p=1$"));
        assert_eq!(
            h.verify("correct horse".into(), Some(stored.clone()))
                .await
                .unwrap(),
            Verdict::Match
        );
        assert_eq!(
            h.verify("wrong horse".into(), Some(stored)).await.unwrap(),
            Verdict::Mismatch
        );
        assert_eq!(h.verify("x".into(), None).await.unwrap(), Verdict::Mismatch);
        assert_eq!(
            h.verify("x".into(), Some("garbage".into())).await.unwrap(),
            Verdict::CorruptHash
        );
    }

    #[tokio::test]
    async fn owasp_defaults_produce_owasp_hashes() {
        assert_eq!(
            HashParams::default(),
            HashParams {
                memory_kib: 19_456,
                iterations: 2,
                parallelism: 1
            }
        );
        let h = PasswordHasher::new(HashParams::default(), 1).unwrap();
        let stored = h.hash("password1".into()).await.unwrap();
        assert!(
            stored.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "{stored}"
        );
    }

    #[test]
    fn length_counts_code_points() {
        assert_eq!(password_length("ääääääää"), 8);
        assert_eq!(password_length("abc"), 3);
    }
}
