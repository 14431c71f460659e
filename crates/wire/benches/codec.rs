//! Encode/decode throughput of typical packets, next to plain prost on the same bytes.
//!
//! `cargo bench -p potluck-wire --bench codec`
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prost::Message;
use std::hint::black_box;
use wire::{pb, Packet};

/// `update_add_htlc` and `open_channel` from shared/vectors/packets_and_encodings.json.
const UPDATE_ADD_HTLC: &str = "12580a24091c2590a25408734d11f303a18b1e35f0ee194150c574834cc82c214bc21ddcb03998bf10c0843d1a2409ea340cc17e78c1111113390216a4b5843919c93619b1db025e33217ae4124c99f378b722060880dea0cb05";
const OPEN_CHANNEL: &str = "a2017c0a040880a305122409fa9f1f281bc4abb211f76930e1662509a21989f4c17f181ed2f621eb7bb91c1b20ad5c1a230a210362c0a046dacce86ddd0343c6d3c7c79c2208ba0d9c9cf24a6d046d21d21f90f722230a2103f006a18d5653c4edf5391ff23a61f03ff83d237e880ee61187fa9f379a028e0a280138d08603";

fn codec(c: &mut Criterion) {
    let mut group = c.benchmark_group("wire");
    group.throughput(Throughput::Elements(1));
    for (name, hex_bytes) in [
        ("update_add_htlc", UPDATE_ADD_HTLC),
        ("open_channel", OPEN_CHANNEL),
    ] {
        let bytes = hex::decode(hex_bytes).expect("vector hex");
        let packet = Packet::decode(&bytes).expect("vector decodes");
        let pkt = pb::Pkt::decode(&bytes[..]).expect("vector decodes");
        group.bench_with_input(
            BenchmarkId::new("prost_decode", name),
            &bytes,
            |b, bytes| b.iter(|| pb::Pkt::decode(black_box(&bytes[..]))),
        );
        group.bench_with_input(
            BenchmarkId::new("checked_decode", name),
            &bytes,
            |b, bytes| b.iter(|| wire::decode_pkt(black_box(bytes))),
        );
        group.bench_with_input(
            BenchmarkId::new("domain_decode", name),
            &bytes,
            |b, bytes| b.iter(|| Packet::decode(black_box(bytes))),
        );
        group.bench_with_input(BenchmarkId::new("prost_encode", name), &pkt, |b, pkt| {
            b.iter(|| black_box(pkt).encode_to_vec())
        });
        group.bench_with_input(BenchmarkId::new("domain_encode", name), &packet, |b, p| {
            b.iter(|| black_box(p).encode())
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = codec
}
criterion_main!(benches);
