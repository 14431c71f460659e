//! Benchmark baseline: raw Argon2id verifications per second with the service's OWASP parameters on N threads (N = the service's hashing concurrency).
//!
//! `cargo run --release -p potluck-rounds --example argon2_raw -- THREADS SECONDS`

use std::time::{Duration, Instant};

use argon2::password_hash::{PasswordHash, PasswordHasher as _, PasswordVerifier as _, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};

fn main() {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
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
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        assert!(argon
                            .verify_password(b"benchmark-password", &parsed)
                            .is_ok());
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread")).sum()
    });
    let elapsed = started.elapsed().as_secs_f64();
    println!("argon2id m={} t={} p={} threads={threads}: {total} verifications in {elapsed:.2}s = {:.1}/s", p.memory_kib, p.iterations, p.parallelism, total as f64 / elapsed);
}
