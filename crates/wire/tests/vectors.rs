//! Every message vector of `shared/vectors/` decodes to the stated values and re-encodes to the same bytes.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use bitcoin_hashes::{sha256, sha256d, Hash};
use secp256k1::{ecdsa::Signature, Message, PublicKey, Secp256k1, SecretKey};
use serde_json::Value;
use wire::{
    AnchorOffer, Authenticate, ChainPubkey, CloseChannel, CloseChannelComplete, DeclineReason,
    ErrorPacket, Funding, Locktime, OpenAnchor, OpenChannel, OpenCommitSig, OpenComplete, Packet,
    Preimage, Update, UpdateAccept, UpdateAddHtlc, UpdateComplete, UpdateDeclineHtlc,
    UpdateFulfillHtlc, UpdateRoutefailHtlc, UpdateSignature, UpdateTimedoutHtlc,
};

fn vectors_dir() -> PathBuf {
    std::env::var_os("POTLUCK_VECTORS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors")
        })
}

fn load(name: &str) -> Value {
    let path = vectors_dir().join(name);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("vector file is JSON")
}

/// The files write some numbers as JSON strings.
fn number(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .expect("a number")
}

fn unhex(v: &Value) -> Vec<u8> {
    hex::decode(v.as_str().expect("hex string")).expect("valid hex")
}

/// `PUB(b)`: the compressed public key of the private key made of 32 bytes of value b.
fn pubkey(b: u8) -> ChainPubkey {
    let sk = SecretKey::from_slice(&[b; 32]).unwrap();
    ChainPubkey::new(PublicKey::from_secret_key(&Secp256k1::new(), &sk))
}

/// `H(s)`: SHA256 of the ASCII string.
fn h(s: &str) -> sha256::Hash {
    sha256::Hash::hash(s.as_bytes())
}

/// `SIG(s)`: RFC6979 low-S ECDSA by 0x0a×32 over SHA256d(s).
fn sig(s: &str) -> Signature {
    let sk = SecretKey::from_slice(&[0x0a; 32]).unwrap();
    let digest = sha256d::Hash::hash(s.as_bytes());
    Secp256k1::new().sign_ecdsa(&Message::from_digest(digest.to_byte_array()), &sk)
}

fn preimage_of(hash: sha256::Hash) -> Preimage {
    Preimage(hash.to_byte_array())
}

/// The packets of `packets_and_encodings.json`, in file order, built from their descriptions.
fn expected_packets() -> Vec<(u32, Packet)> {
    let open = |anch, min_depth| OpenChannel {
        delay: Locktime::Seconds(86400),
        revocation_hash: h("revocation-0"),
        commit_key: pubkey(0x05),
        final_key: pubkey(0x06),
        anch,
        min_depth,
        commitment_fee: 50000,
    };
    vec![
        (
            50,
            Packet::Auth(Authenticate {
                node_id: pubkey(0x11),
                session_sig: sig("auth"),
            }),
        ),
        (20, Packet::Open(open(AnchorOffer::WillCreateAnchor, None))),
        (
            20,
            Packet::Open(open(AnchorOffer::WontCreateAnchor, Some(3))),
        ),
        (
            21,
            Packet::OpenAnchor(OpenAnchor {
                txid: sha256d::Hash::from_byte_array(h("anchor-txid").to_byte_array()),
                output_index: 1,
                amount: 999_999,
                commit_sig: sig("commit"),
            }),
        ),
        (
            22,
            Packet::OpenCommitSig(OpenCommitSig {
                sig: sig("commit2"),
            }),
        ),
        (23, Packet::OpenComplete(OpenComplete { blockid: None })),
        (
            23,
            Packet::OpenComplete(OpenComplete {
                blockid: Some(sha256d::Hash::from_byte_array(h("block").to_byte_array())),
            }),
        ),
        (
            1,
            Packet::Update(Update {
                revocation_hash: h("revocation-1"),
                delta_msat: -123_456,
            }),
        ),
        (
            2,
            Packet::UpdateAddHtlc(UpdateAddHtlc {
                revocation_hash: h("revocation-2"),
                amount_msat: 1_000_000,
                r_hash: sha256::Hash::hash(h("r-preimage").as_byte_array()),
                expiry: Locktime::Seconds(1_500_000_000),
                onion: None,
            }),
        ),
        (
            3,
            Packet::UpdateAccept(UpdateAccept {
                sig: sig("accept"),
                revocation_hash: h("revocation-3"),
            }),
        ),
        (
            4,
            Packet::UpdateSignature(UpdateSignature {
                sig: sig("signature"),
                revocation_preimage: preimage_of(h("preimage-0")),
            }),
        ),
        (
            5,
            Packet::UpdateComplete(UpdateComplete {
                revocation_preimage: preimage_of(h("preimage-1")),
            }),
        ),
        (
            6,
            Packet::UpdateDeclineHtlc(UpdateDeclineHtlc {
                reason: Some(DeclineReason::CannotRoute(true)),
            }),
        ),
        (
            6,
            Packet::UpdateDeclineHtlc(UpdateDeclineHtlc {
                reason: Some(DeclineReason::InsufficientFunds(Funding {
                    fixed: Some(1000),
                    per_micro_unit: Some(5),
                })),
            }),
        ),
        (
            7,
            Packet::UpdateFulfillHtlc(UpdateFulfillHtlc {
                revocation_hash: h("revocation-4"),
                r: preimage_of(h("r-preimage")),
            }),
        ),
        (
            8,
            Packet::UpdateTimedoutHtlc(UpdateTimedoutHtlc {
                revocation_hash: h("revocation-5"),
                r_hash: h("rhash"),
            }),
        ),
        (
            9,
            Packet::UpdateRoutefailHtlc(UpdateRoutefailHtlc {
                revocation_hash: h("revocation-6"),
                r_hash: h("rhash"),
            }),
        ),
        (
            30,
            Packet::Close(CloseChannel {
                sig: sig("close"),
                close_fee: 10_000,
            }),
        ),
        (
            31,
            Packet::CloseComplete(CloseChannelComplete {
                sig: sig("close-complete"),
            }),
        ),
        (32, Packet::CloseAck),
        (40, Packet::error("hello")),
        (40, Packet::Error(ErrorPacket { problem: None })),
    ]
}

#[test]
fn every_packet_vector_decodes_to_its_values_and_reencodes_identically() {
    let file = load("packets_and_encodings.json");
    let vectors = file["packets"].as_array().expect("packets array");
    let expected = expected_packets();
    assert_eq!(vectors.len(), expected.len(), "one expectation per vector");
    for (v, (case, packet)) in vectors.iter().zip(expected) {
        let what = v["description"].as_str().unwrap_or_default();
        let bytes = unhex(&v["protobuf_hex"]);
        assert_eq!(v["pkt_case"].as_u64(), Some(u64::from(case)), "{what}");
        assert_eq!(v["len"].as_u64(), Some(bytes.len() as u64), "{what}");
        let decoded = Packet::decode(&bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(decoded, packet, "{what}");
        assert_eq!(decoded.case(), case, "{what}");
        assert_eq!(packet.encode(), bytes, "{what}: re-encoding differs");
    }
}

#[test]
fn the_stated_public_keys_match() {
    let file = load("packets_and_encodings.json");
    for b in [0x05u8, 0x06, 0x11, 0x0a] {
        let stated = unhex(&file[format!("PUB(0x{b:02x})")]);
        assert_eq!(pubkey(b).to_vec(), stated, "PUB(0x{b:02x})");
    }
}

#[test]
fn signature_word_layout_vector() {
    let v = &load("packets_and_encodings.json")["signature_encoding"];
    let r = unhex(&v["r_be32"]);
    let s = unhex(&v["s_be32"]);
    let signature_msg = unhex(&v["signature_message_protobuf"]);
    let sk = SecretKey::from_slice(&unhex(&v["signer_privkey"])).unwrap();
    let digest = unhex(&v["message_hash_sha256d_of_ascii_encoding-test"]);
    assert_eq!(
        digest,
        sha256d::Hash::hash(b"encoding-test").to_byte_array()
    );
    let ours = Secp256k1::new().sign_ecdsa(&Message::from_digest_slice(&digest).unwrap(), &sk);
    assert_eq!(ours.serialize_compact()[..32], r[..]);
    assert_eq!(ours.serialize_compact()[32..], s[..]);
    assert_eq!(ours.serialize_der().to_vec(), unhex(&v["der"]));

    // The words, as the message carries them.
    let words = wire::pb::Signature::from(&ours);
    let word = |name: &str| {
        u64::from_str_radix(
            v["words_u64"][name]
                .as_str()
                .unwrap()
                .trim_start_matches("0x"),
            16,
        )
        .unwrap()
    };
    let got = [
        words.r1, words.r2, words.r3, words.r4, words.s1, words.s2, words.s3, words.s4,
    ];
    let want = ["r1", "r2", "r3", "r4", "s1", "s2", "s3", "s4"].map(word);
    assert_eq!(got, want);
    assert_eq!(prost::Message::encode_to_vec(&words), signature_msg);
    let back: wire::pb::Signature = prost::Message::decode(&signature_msg[..]).unwrap();
    assert_eq!(Signature::try_from(&back).unwrap(), ours);
    // On the wire r is little-endian: the reverse of r_be32.
    let mut r_le = r.clone();
    r_le.reverse();
    assert_eq!(
        unhex(&v["libsecp_internal_64_bytes(sig.data)"])[..32],
        r_le[..]
    );
}

#[test]
fn sha256_hash_word_layout_vector() {
    let v = &load("packets_and_encodings.json")["sha256_hash_encoding"];
    let hash = sha256::Hash::hash(b"abc");
    assert_eq!(hash.to_byte_array().to_vec(), unhex(&v["hash_bytes"]));
    let words = wire::pb::Sha256Hash::from(hash);
    let word = |name: &str| {
        u64::from_str_radix(
            v["words_u64"][name]
                .as_str()
                .unwrap()
                .trim_start_matches("0x"),
            16,
        )
        .unwrap()
    };
    assert_eq!(
        [words.a, words.b, words.c, words.d],
        ["a", "b", "c", "d"].map(word)
    );
    let bytes = unhex(&v["sha256_hash_message_protobuf"]);
    assert_eq!(prost::Message::encode_to_vec(&words), bytes);
    let back: wire::pb::Sha256Hash = prost::Message::decode(&bytes[..]).unwrap();
    assert_eq!(sha256::Hash::from(&back), hash);
}

/// The plaintexts of both recorded sessions decode, name their `pkt` case, and re-encode identically.
#[test]
fn session_plaintexts_decode_and_reencode() {
    let transcript = load("session_transcript.json");
    let mut plaintexts: Vec<(u64, Vec<u8>)> = transcript["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (number(&f["pkt_case"]), unhex(&f["plaintext_protobuf"])))
        .collect();
    let full = load("full_session_40361e3dd.json");
    for dir in ["A_to_B", "B_to_A"] {
        for f in full[dir].as_array().unwrap() {
            plaintexts.push((number(&f["pkt_case"]), unhex(&f["plaintext_protobuf"])));
        }
    }
    assert!(plaintexts.len() >= 35, "all recorded frames are covered");
    for (case, bytes) in plaintexts {
        let packet = Packet::decode(&bytes).unwrap_or_else(|e| panic!("case {case}: {e}"));
        assert_eq!(u64::from(packet.case()), case);
        assert_eq!(packet.encode(), bytes, "case {case} re-encodes identically");
    }
}
