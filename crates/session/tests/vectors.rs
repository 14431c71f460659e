//! The session vectors of `shared/vectors/` reproduce byte for byte: keys, IVs, signatures, every frame.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use bitcoin_hashes::{sha256d, Hash};
use secp256k1::{Message, PublicKey, Secp256k1, SecretKey};
use serde_json::Value;
use session::{Handshake, Opener, Progress, Sealer, SessionKeys, HEADER_LEN};
use wire::Packet;

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
    serde_json::from_str(&text).expect("JSON")
}

fn unhex(v: &Value) -> Vec<u8> {
    hex::decode(v.as_str().expect("hex string")).expect("valid hex")
}

fn number(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .expect("a number")
}

fn secret(v: &Value) -> SecretKey {
    SecretKey::from_slice(&unhex(v)).expect("valid key")
}

fn public(sk: &SecretKey) -> PublicKey {
    PublicKey::from_secret_key(&Secp256k1::new(), sk)
}

fn frames_from<'a>(t: &'a Value, who: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    t["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter(move |f| f["from"] == who)
}

#[test]
fn keys_ivs_and_shared_secret() {
    let t = load("session_transcript.json");
    for (me, them) in [("A", "B"), ("B", "A")] {
        let v = &t[me];
        let sk = secret(&v["session_privkey"]);
        let theirs = public(&secret(&t[them]["session_privkey"]));
        assert_eq!(
            public(&sk).serialize().to_vec(),
            unhex(&v["session_pubkey_sent_first_33_bytes"])
        );
        assert_eq!(
            public(&secret(&v["node_privkey"])).serialize().to_vec(),
            unhex(&v["node_id_pubkey"])
        );
        let keys = SessionKeys::derive(&sk, &public(&sk), &theirs);
        assert_eq!(
            keys.shared_secret.to_vec(),
            unhex(&v["ecdh_shared_secret"]),
            "{me}"
        );
        let d = &v["send_direction_keys"];
        assert_eq!(
            keys.send.aes_key.to_vec(),
            unhex(&d["aes128_ctr_key"]),
            "{me}"
        );
        assert_eq!(unhex(&d["sha256_secret_pub_00"])[..16], keys.send.aes_key);
        assert_eq!(
            keys.send.hmac_key.to_vec(),
            unhex(&d["sha256_secret_pub_01_hmac_key"])
        );
        assert_eq!(keys.send.iv.to_vec(), unhex(&d["aes_ctr_iv"]), "{me}");
        assert_eq!(unhex(&d["sha256_secret_pub_02"])[..16], keys.send.iv);
        // What one side receives with is what the other sends with.
        let other =
            SessionKeys::derive(&secret(&t[them]["session_privkey"]), &theirs, &public(&sk));
        assert_eq!(keys.receive, other.send);
    }
}

#[test]
fn authenticate_signatures() {
    let t = load("session_transcript.json");
    let secp = Secp256k1::new();
    for (me, them, auth) in [("A", "B", "auth_A"), ("B", "A", "auth_B")] {
        let node = secret(&t[me]["node_privkey"]);
        let their_session = public(&secret(&t[them]["session_privkey"]));
        let digest = sha256d::Hash::hash(&their_session.serialize());
        let field = format!("signed_hash_sha256d_of_{them}_session_pubkey");
        assert_eq!(
            digest.to_byte_array().to_vec(),
            unhex(&t[auth][field.as_str()])
        );
        let sig = secp.sign_ecdsa(&Message::from_digest(digest.to_byte_array()), &node);
        assert_eq!(
            sig.serialize_der().to_vec(),
            unhex(&t[auth]["sig_der"]),
            "{me}"
        );
        // libsecp256k1's internal layout is r and s, each little-endian.
        let mut internal = sig.serialize_compact();
        internal[..32].reverse();
        internal[32..].reverse();
        assert_eq!(internal.to_vec(), unhex(&t[auth]["sig_internal_64"]));
    }
}

/// Seals each side's plaintexts in order and compares every part of every frame; the peer opens them.
#[test]
fn every_transcript_frame_seals_and_opens_byte_for_byte() {
    let t = load("session_transcript.json");
    for (me, them) in [("A", "B"), ("B", "A")] {
        let sk = secret(&t[me]["session_privkey"]);
        let their_sk = secret(&t[them]["session_privkey"]);
        let keys = SessionKeys::derive(&sk, &public(&sk), &public(&their_sk));
        let their_keys = SessionKeys::derive(&their_sk, &public(&their_sk), &public(&sk));
        let mut sealer = Sealer::new(&keys.send);
        let mut opener = Opener::new(&their_keys.receive);
        let mut count = 0;
        for f in frames_from(&t, me) {
            let what = f["description"].as_str().unwrap();
            let plain = unhex(&f["plaintext_protobuf"]);
            assert_eq!(plain.len() as u64, number(&f["payload_len"]), "{what}");
            let frame = sealer.seal(&plain).unwrap();
            assert_eq!(frame, unhex(&f["frame"]), "{what}");
            assert_eq!(frame[..32], unhex(&f["header_hmac"])[..], "{what}");
            assert_eq!(
                frame[32..HEADER_LEN],
                unhex(&f["header_totlen_le64"])[..],
                "{what}"
            );
            assert_eq!(frame[HEADER_LEN..], unhex(&f["ciphertext"])[..], "{what}");
            assert_eq!(
                frame.len() - HEADER_LEN,
                number(&f["padded_len"]) as usize,
                "{what}"
            );
            assert_eq!(sealer.total_sent(), number(&f["totlen_after"]), "{what}");
            let (opened, used) = opener.open_from(&frame).unwrap().unwrap();
            assert_eq!(
                (opened.as_slice(), used),
                (plain.as_slice(), frame.len()),
                "{what}"
            );
            assert_eq!(
                u64::from(Packet::decode(&plain).unwrap().case()),
                number(&f["pkt_case"])
            );
            count += 1;
        }
        assert_eq!(count, 4, "four frames from {me}");
    }
}

/// The handshake state machine, fed B's byte stream, emits exactly A's bytes, and vice versa.
#[test]
fn handshake_machine_reproduces_the_transcript() {
    let t = load("session_transcript.json");
    for (me, them) in [("A", "B"), ("B", "A")] {
        let mut hs = Handshake::new(
            secret(&t[me]["node_privkey"]),
            secret(&t[me]["session_privkey"]),
        );
        assert_eq!(
            hs.session_public_key().to_vec(),
            unhex(&t[me]["session_pubkey_sent_first_33_bytes"])
        );
        let mine: Vec<Vec<u8>> = frames_from(&t, me).map(|f| unhex(&f["frame"])).collect();
        let theirs: Vec<Vec<u8>> = frames_from(&t, them).map(|f| unhex(&f["frame"])).collect();

        // Their session key, byte by byte: nothing until the 33rd, then our authenticate.
        let their_key = unhex(&t[them]["session_pubkey_sent_first_33_bytes"]);
        let mut out = Vec::new();
        assert!(matches!(
            hs.read(&their_key[..32], &mut out),
            Ok(Progress::Consumed(0))
        ));
        assert!(out.is_empty());
        assert!(matches!(
            hs.read(&their_key, &mut out),
            Ok(Progress::Consumed(33))
        ));
        assert_eq!(out, mine[0], "{me}: authenticate frame");

        // Their authenticate: our hello.
        out.clear();
        assert!(
            matches!(hs.read(&theirs[0], &mut out), Ok(Progress::Consumed(n)) if n == theirs[0].len())
        );
        assert_eq!(out, mine[1], "{me}: hello frame");

        // Their hello, followed by their next frame in the same read: established, the rest left over.
        out.clear();
        let input = [theirs[1].clone(), theirs[2].clone()].concat();
        let Ok(Progress::Established { consumed, session }) = hs.read(&input, &mut out) else {
            panic!("{me}: not established");
        };
        assert!(out.is_empty());
        assert_eq!(consumed, theirs[1].len());
        assert_eq!(
            session.remote_node_id.serialize().to_vec(),
            unhex(&t[them]["node_id_pubkey"])
        );

        // The keyed state carries on: our next frames and theirs match the transcript.
        let mut session = *session;
        for (f, expected) in frames_from(&t, me).skip(2).zip(&mine[2..]) {
            assert_eq!(
                session
                    .sealer
                    .seal(&unhex(&f["plaintext_protobuf"]))
                    .unwrap(),
                *expected
            );
        }
        for (f, frame) in frames_from(&t, them).skip(2).zip(&theirs[2..]) {
            let (plain, _) = session.opener.open_from(frame).unwrap().unwrap();
            assert_eq!(plain, unhex(&f["plaintext_protobuf"]));
        }
    }
}

/// The recorded 40361e3dd session: every frame of both directions opens to its plaintext and reseals identically.
#[test]
fn recorded_reference_session_opens_and_reseals() {
    let s = load("full_session_40361e3dd.json");
    let a = secret(&s["A_session_privkey"]);
    let b = secret(&s["B_session_privkey"]);
    assert_eq!(
        public(&a).serialize().to_vec(),
        unhex(&s["A_session_pubkey"])
    );
    assert_eq!(
        public(&b).serialize().to_vec(),
        unhex(&s["B_session_pubkey"])
    );
    for (dir, from, to) in [("A_to_B", &a, &b), ("B_to_A", &b, &a)] {
        let sender = SessionKeys::derive(from, &public(from), &public(to));
        let receiver = SessionKeys::derive(to, &public(to), &public(from));
        assert_eq!(
            sender.shared_secret.to_vec(),
            unhex(&s["ecdh_shared_secret"])
        );
        let mut sealer = Sealer::new(&sender.send);
        let mut opener = Opener::new(&receiver.receive);
        let frames = s[dir].as_array().unwrap();
        let stream: Vec<u8> = frames.iter().flat_map(|f| unhex(&f["frame"])).collect();
        let mut at = 0;
        for f in frames {
            let (plain, used) = opener.open_from(&stream[at..]).unwrap().unwrap();
            at += used;
            assert_eq!(plain, unhex(&f["plaintext_protobuf"]), "{dir}");
            assert_eq!(opener.total_received(), number(&f["totlen"]), "{dir}");
            assert_eq!(
                Packet::decode(&plain).unwrap().name(),
                f["pkt"].as_str().unwrap()
            );
            assert_eq!(sealer.seal(&plain).unwrap(), unhex(&f["frame"]), "{dir}");
        }
        assert_eq!(at, stream.len());
    }
}
