//! Benchmark baseline: raw Argon2id verifications per second with the service's OWASP parameters on N threads (N = the service's hashing concurrency).
//!
//! `cargo run --release -p potluck-rounds --example argon2_raw -- THREADS SECONDS [fresh|reused]`
//!
//! `fresh` (the default, the figure of earlier sessions) verifies with the
//! crate's `verify_password`, which allocates and zeroes a 19 MiB block array
//! per verification; `reused` keeps one array per thread, as the service's
//! hashing threads do, so it is the honest bound for the service.

use std::time::{Duration, Instant};

use argon2::password_hash::{PasswordHash, PasswordHasher as _, PasswordVerifier as _, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};

fn main() {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let reused = args.next().is_some_and(|a| a == "reused");
    let p = potluck_rounds::security::password::HashParams::OWASP;
    let argon = Argon2::new(
        Algorithm::Argon2id,
        Version::V0x13,
        Params::new(p.memory_kib, p.iterations, p.parallelism, None).expect("params"),
    );
    let salt = SaltString::generate(&mut rand::thread_rng());
    let stored = argon
        .hash_password(b"benchmark-password", &salt)
        .expect("hash")
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let total: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let parsed = PasswordHash::new(&stored).expect("parse");
                    let expected = parsed.hash.expect("hash");
                    let mut salt = [0u8; 64];
                    let salt = parsed
                        .salt
                        .expect("salt")
                        .decode_b64(&mut salt)
                        .expect("salt");
                    let mut blocks = vec![argon2::Block::default(); argon.params().block_count()];
                    let mut out = vec![0u8; expected.len()];
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        if reused {
                            argon
                                .hash_password_into_with_memory(
                                    b"benchmark-password",
                                    salt,
                                    &mut out,
                                    &mut blocks,
                                )
                                .expect("hash");
                            assert_eq!(out.as_slice(), expected.as_bytes());
                        } else {
                            assert!(argon
                                .verify_password(b"benchmark-password", &parsed)
                                .is_ok());
                        }
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread")).sum()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let memory = if reused { "reused" } else { "fresh" };
    println!("argon2id m={} t={} p={} threads={threads} memory={memory}: {total} verifications in {elapsed:.2}s = {:.1}/s", p.memory_kib, p.iterations, p.parallelism, total as f64 / elapsed);
}
