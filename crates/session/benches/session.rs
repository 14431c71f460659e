//! Frame throughput next to raw AES-128-CTR + HMAC-SHA256, and handshakes per second over loopback.
//!
//! `cargo bench -p potluck-session --bench session`
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use aes::cipher::{KeyIvInit, StreamCipher};
use bitcoin_hashes::{sha256d, Hash};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hmac::{Hmac, Mac};
use secp256k1::{ecdh::SharedSecret, Message, PublicKey, Secp256k1, SecretKey};
use session::{padded_len, Config, DirectionKeys, Opener, Sealer, HEADER_LEN};
use std::hint::black_box;

type Aes128Ctr = ctr::Ctr128BE<aes::Aes128>;

fn keys() -> DirectionKeys {
    DirectionKeys {
        aes_key: [1; 16],
        hmac_key: [2; 32],
        iv: [3; 16],
    }
}

fn frames(c: &mut Criterion) {
    let mut group = c.benchmark_group("frames");
    for size in [64usize, 1024, 65536] {
        group.throughput(Throughput::Bytes(size as u64));
        let payload = vec![0x5au8; size];
        group.bench_with_input(
            BenchmarkId::new("seal_open", size),
            &payload,
            |b, payload| {
                let k = keys();
                let mut sealer = Sealer::new(&k);
                let mut opener = Opener::new(&k);
                let mut buf = Vec::with_capacity(HEADER_LEN + padded_len(size));
                b.iter(|| {
                    buf.clear();
                    sealer.seal_into(black_box(payload), &mut buf).unwrap();
                    let opened = opener.open_in_place(&mut buf).unwrap().unwrap();
                    black_box(&buf[opened.payload]);
                })
            },
        );
        // The same cryptographic work with nothing around it: copy in, encrypt + MAC, then
        // MAC check + decrypt in place.
        group.bench_with_input(
            BenchmarkId::new("raw_ctr_hmac", size),
            &payload,
            |b, payload| {
                let k = keys();
                let mut enc = Aes128Ctr::new(&k.aes_key.into(), &k.iv.into());
                let mut dec = Aes128Ctr::new(&k.aes_key.into(), &k.iv.into());
                let mac = Hmac::<sha2::Sha256>::new_from_slice(&k.hmac_key).unwrap();
                let mut buf = vec![0u8; padded_len(size)];
                b.iter(|| {
                    buf[..size].copy_from_slice(black_box(payload));
                    enc.apply_keystream(&mut buf);
                    let mut m = mac.clone();
                    m.update(&buf);
                    let tag = m.finalize().into_bytes();
                    let mut m = mac.clone();
                    m.update(&buf);
                    m.verify_slice(&tag).unwrap();
                    let mut plain = buf.clone();
                    dec.apply_keystream(&mut plain);
                    black_box(plain);
                })
            },
        );
    }
    group.finish();
}

fn handshakes(c: &mut Criterion) {
    let mut group = c.benchmark_group("handshake");
    group.throughput(Throughput::Elements(1));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (a, b) = (
        SecretKey::from_slice(&[0x11; 32]).unwrap(),
        SecretKey::from_slice(&[0x22; 32]).unwrap(),
    );
    let config = Config::default();
    group.bench_function("loopback_tcp_both_ends", |bench| {
        bench.iter(|| {
            rt.block_on(async {
                let server = async {
                    let (stream, _) = listener.accept().await.unwrap();
                    session::accept(stream, &b, &config).await.unwrap()
                };
                let (x, y) = tokio::join!(session::connect(addr, &a, &config), server);
                black_box((x.unwrap(), y));
            })
        })
    });
    // Per handshake, each side: one ECDH, one sign, one verify (and deriving its session public key).
    let secp = Secp256k1::new();
    let digest = Message::from_digest(sha256d::Hash::hash(b"session key").to_byte_array());
    let pa = PublicKey::from_secret_key(&secp, &a);
    let sig = secp.sign_ecdsa(&digest, &a);
    group.bench_function("raw_secp_ops_both_sides", |bench| {
        bench.iter(|| {
            for _ in 0..2 {
                black_box(PublicKey::from_secret_key(&secp, black_box(&b)));
                black_box(SharedSecret::new(black_box(&pa), black_box(&b)));
                black_box(secp.sign_ecdsa(black_box(&digest), black_box(&a)));
                secp.verify_ecdsa(black_box(&digest), &sig, &pa).unwrap();
            }
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = frames, handshakes
}
criterion_main!(benches);
