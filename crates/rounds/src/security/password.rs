//! Argon2id password hashing off the async runtime, on a fixed pool of hashing threads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use argon2::password_hash::{
    self, Output, ParamsString, PasswordHash, PasswordHasher as _, Salt, SaltString,
};
use argon2::{Algorithm, Argon2, Block, Params, Version};
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

/// Hashes and verifies passwords on a pool of exactly `concurrency`
/// threads of its own, so that a login flood queues here instead of
/// starving request handling and background tasks of CPU. A hash starts
/// only with one of `concurrency` permits; the permit moves into the
/// hashing thread and is released when the hash ends, not when the request
/// does: a client that hangs up mid-login cannot free a slot while its hash
/// still burns a core, and one that hangs up while waiting for a permit
/// starts nothing.
#[derive(Clone)]
pub struct PasswordHasher {
    argon: Arc<Argon2<'static>>,
    permits: Arc<Semaphore>,
    concurrency: usize,
    /// Hashes running on the pool right now.
    running: Arc<AtomicUsize>,
    /// A valid hash of a random password, verified against when the user is
    /// unknown or the stored hash is unparseable, so every login does the
    /// same Argon2 work.
    dummy_hash: Arc<str>,
    /// The hashing threads' queue; they end when the last clone is dropped.
    pool: Arc<Mutex<mpsc::Sender<Job>>>,
}

/// Work for a hashing thread, given the thread's own block array.
type Job = Box<dyn FnOnce(&mut Vec<Block>) + Send>;

/// Starts `threads` hashing threads over one queue. Each keeps Argon2's
/// working memory between hashes: a fresh array per hash (what `argon2`'s
/// own `hash_password` does) costs a 19 MiB allocation whose pages must be
/// zeroed on every login, about a tenth of its CPU; a reused one is simply
/// overwritten (Argon2 writes every block before it reads it), and staying
/// on one thread it stays in that core's caches. Dedicated threads rather
/// than tokio's blocking pool: exactly `threads` of them, woken directly,
/// never more arrays than threads.
fn start_pool(threads: usize) -> Result<mpsc::Sender<Job>, HashError> {
    let (tx, rx) = mpsc::channel::<Job>();
    let rx = Arc::new(Mutex::new(rx));
    for i in 0..threads {
        let rx = rx.clone();
        std::thread::Builder::new()
            .name(format!("potluck-hash-{i}"))
            .spawn(move || {
                let mut blocks = Vec::new();
                loop {
                    // The lock is held only while waiting for a job; with
                    // at most `threads` jobs queued one is always free.
                    let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok(job) = job else { break };
                    // A panicking hash loses its answer (the caller sees
                    // `Join`), not the thread.
                    let _ =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut blocks)));
                }
            })
            .map_err(|e| HashError::Join(format!("starting a hashing thread: {e}")))?;
    }
    Ok(tx)
}

/// At least `count` blocks of `blocks`, grown when too short.
fn blocks_for(blocks: &mut Vec<Block>, count: usize) -> &mut [Block] {
    if blocks.len() < count {
        blocks.resize(count, Block::default());
    }
    &mut blocks[..count]
}

/// `argon.hash_password(password, salt)` as a PHC string, byte for byte,
/// computed in pooled memory.
fn hash_phc(
    argon: &Argon2<'_>,
    blocks: &mut Vec<Block>,
    password: &[u8],
    salt: Salt<'_>,
) -> password_hash::Result<String> {
    let params = argon.params();
    let mut salt_buf = [0u8; 64];
    let salt_bytes = salt.decode_b64(&mut salt_buf)?;
    let output_len = params.output_len().unwrap_or(Params::DEFAULT_OUTPUT_LEN);
    let output = Output::init_with(output_len, |out| {
        argon
            .hash_password_into_with_memory(
                password,
                salt_bytes,
                out,
                blocks_for(blocks, params.block_count()),
            )
            .map_err(Into::into)
    })?;
    Ok(PasswordHash {
        algorithm: Algorithm::Argon2id.ident(),
        version: Some(Version::V0x13.into()),
        params: ParamsString::try_from(params)?,
        salt: Some(salt),
        hash: Some(output),
    }
    .to_string())
}

/// What `verify_password` of `argon2` decides for `hash`, with the algorithm,
/// version and parameters the hash names (so hashes made under older
/// parameters keep working), computed in pooled memory; the outputs are
/// compared in constant time.
fn verify_phc(blocks: &mut Vec<Block>, password: &[u8], hash: &PasswordHash<'_>) -> bool {
    let mut check = || -> password_hash::Result<bool> {
        let (Some(salt), Some(expected)) = (&hash.salt, &hash.hash) else {
            return Ok(false);
        };
        let algorithm = Algorithm::try_from(hash.algorithm)?;
        let version = hash
            .version
            .map(Version::try_from)
            .transpose()?
            .unwrap_or_default();
        let params = Params::try_from(hash)?;
        let count = params.block_count();
        let argon = Argon2::new(algorithm, version, params);
        let mut salt_buf = [0u8; 64];
        let salt_bytes = salt.decode_b64(&mut salt_buf)?;
        let computed = Output::init_with(expected.len(), |out| {
            argon
                .hash_password_into_with_memory(
                    password,
                    salt_bytes,
                    out,
                    blocks_for(blocks, count),
                )
                .map_err(Into::into)
        })?;
        // `Output`'s equality is constant-time.
        Ok(computed == *expected)
    };
    check().unwrap_or(false)
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
            pool: Arc::new(Mutex::new(start_pool(concurrency)?)),
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

    /// Runs `work` on a hashing thread holding a permit for its whole
    /// run; dropping the returned future before the permit is granted
    /// starts nothing, dropping it afterwards lets the hash finish.
    async fn run<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Vec<Block>) -> R + Send + 'static,
    ) -> Result<R, HashError> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| HashError::Join(e.to_string()))?;
        let running = self.running.clone();
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |blocks| {
            // Decremented by the guard even if the hash panics.
            struct Running(Arc<AtomicUsize>);
            impl Drop for Running {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::Relaxed);
                }
            }
            running.fetch_add(1, Ordering::Relaxed);
            let _running = Running(running);
            let result = work(blocks);
            // The next hash may start while this answer travels.
            drop(permit);
            let _ = answer.send(result);
        });
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(job)
            .map_err(|_| HashError::Join("the hashing threads are gone".into()))?;
        answered
            .await
            .map_err(|_| HashError::Join("the hash panicked".into()))
    }

    /// Hashes `password` into a PHC string.
    ///
    /// # Errors
    /// [`HashError`] if hashing fails.
    pub async fn hash(&self, password: String) -> Result<String, HashError> {
        let argon = self.argon.clone();
        self.run(move |blocks| {
            let salt = SaltString::generate(&mut rand::thread_rng());
            hash_phc(&argon, blocks, password.as_bytes(), salt.as_salt())
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
        let dummy = self.dummy_hash.clone();
        self.run(move |blocks| {
            let known = stored.is_some();
            let stored = stored.unwrap_or_else(|| dummy.to_string());
            match PasswordHash::new(&stored) {
                Ok(parsed) => {
                    // The parameters of the stored hash are used, so hashes
                    // made under older parameters keep working.
                    let ok = verify_phc(blocks, password.as_bytes(), &parsed);
                    if ok && known {
                        Verdict::Match
                    } else {
                        Verdict::Mismatch
                    }
                }
                Err(_) => {
                    if let Ok(parsed) = PasswordHash::new(&dummy) {
                        let _ = verify_phc(blocks, password.as_bytes(), &parsed);
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

    /// The pooled hashing must be the `argon2` crate's, bit for bit: hashes
    /// stored before the change verify after it, and hashes made after it
    /// verify with the crate's own verifier (a rollback keeps every login).
    #[tokio::test]
    async fn pooled_hashes_are_the_crates_hashes_both_ways() {
        use argon2::password_hash::PasswordVerifier as _;
        for params in [CHEAP, HashParams::default()] {
            let h = PasswordHasher::new(params, 2).unwrap();
            let stock = Argon2::new(
                Algorithm::Argon2id,
                Version::V0x13,
                Params::new(
                    params.memory_kib,
                    params.iterations,
                    params.parallelism,
                    None,
                )
                .unwrap(),
            );
            // Made the old way, checked the new way.
            let salt = SaltString::generate(&mut rand::thread_rng());
            let before = stock
                .hash_password(b"pass-before", &salt)
                .unwrap()
                .to_string();
            assert_eq!(
                h.verify("pass-before".into(), Some(before.clone()))
                    .await
                    .unwrap(),
                Verdict::Match
            );
            assert_eq!(
                h.verify("pass-befor".into(), Some(before.clone()))
                    .await
                    .unwrap(),
                Verdict::Mismatch
            );
            // The same salt gives the same string as the crate's hasher.
            let same = hash_phc(&h.argon, &mut Vec::new(), b"pass-before", salt.as_salt()).unwrap();
            assert_eq!(same, before);
            // Made the new way, checked the old way.
            let after = h.hash("pass-after".into()).await.unwrap();
            let parsed = PasswordHash::new(&after).unwrap();
            assert!(stock.verify_password(b"pass-after", &parsed).is_ok());
            assert!(stock.verify_password(b"pass-afte", &parsed).is_err());
        }
    }

    #[tokio::test]
    async fn hashes_of_other_parameters_still_verify_with_pooled_memory() {
        // A big pool array first, then a smaller and a larger stored hash.
        let h = PasswordHasher::new(CHEAP, 1).unwrap();
        for m in [256, 32, 1024] {
            let other = Argon2::new(
                Algorithm::Argon2id,
                Version::V0x13,
                Params::new(m, 1, 1, None).unwrap(),
            );
            let salt = SaltString::generate(&mut rand::thread_rng());
            let stored = other
                .hash_password(b"pw-123456", &salt)
                .unwrap()
                .to_string();
            assert_eq!(
                h.verify("pw-123456".into(), Some(stored.clone()))
                    .await
                    .unwrap(),
                Verdict::Match,
                "m={m}"
            );
            assert_eq!(
                h.verify("pw-1234567".into(), Some(stored)).await.unwrap(),
                Verdict::Mismatch,
                "m={m}"
            );
        }
    }

    #[test]
    fn length_counts_code_points() {
        assert_eq!(password_length("ääääääää"), 8);
        assert_eq!(password_length("abc"), 3);
    }
}
