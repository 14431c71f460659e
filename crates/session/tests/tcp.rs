//! Sessions over real loopback TCP: bulk traffic both ways, and every failure provoked by a scripted peer.
// Test and benchmark code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bitcoin_hashes::{sha256d, Hash};
use secp256k1::{Message, PublicKey, Secp256k1, SecretKey};
use session::{
    Config, FrameError, HandshakeError, Opener, Sealer, SessionError, SessionKeys, HEADER_LEN,
    MAX_PAYLOAD,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use wire::{Authenticate, ChainPubkey, DecodeErrorKind, Packet};

fn key(b: u8) -> SecretKey {
    SecretKey::from_slice(&[b; 32]).unwrap()
}

fn public(sk: &SecretKey) -> PublicKey {
    PublicKey::from_secret_key(&Secp256k1::new(), sk)
}

/// Deterministic xorshift so that failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A packet of pseudo-random kind and size (up to ~64 KiB of text).
fn random_packet(rng: &mut Rng) -> Packet {
    let n = rng.next();
    match n % 4 {
        0 => Packet::CloseAck,
        1 => Packet::Update(wire::Update {
            revocation_hash: wire::Sha256::hash(&n.to_le_bytes()),
            delta_msat: n as i64,
        }),
        _ => {
            let len = if n % 50 == 0 {
                (n >> 8) % 65536
            } else {
                (n >> 8) % 300
            } as usize;
            Packet::error("x".repeat(len))
        }
    }
}

async fn listener() -> (TcpListener, std::net::SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    (l, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_packets_each_way_concurrently() {
    const N: usize = 10_000;
    let (l, addr) = listener().await;
    let server = tokio::spawn(async move {
        let (stream, _) = l.accept().await.unwrap();
        session::accept(stream, &key(0x22), &Config::default())
            .await
            .unwrap()
    });
    let a = session::connect(addr, &key(0x11), &Config::default())
        .await
        .unwrap();
    let b = server.await.unwrap();
    assert_eq!(a.remote_node_id(), public(&key(0x22)));
    assert_eq!(b.remote_node_id(), public(&key(0x11)));

    let (a_rx, a_tx) = a.into_split();
    let (b_rx, b_tx) = b.into_split();
    let send = |seed: u64, mut tx: session::SessionWriter| {
        tokio::spawn(async move {
            let mut rng = Rng(seed);
            for _ in 0..N {
                tx.send(&random_packet(&mut rng)).await.unwrap();
            }
        })
    };
    let recv = |seed: u64, mut rx: session::SessionReader| {
        tokio::spawn(async move {
            let mut rng = Rng(seed);
            let mut bytes = 0usize;
            for i in 0..N {
                let expected = random_packet(&mut rng);
                let got = rx.recv().await.unwrap();
                assert_eq!(got, expected, "packet {i}");
                bytes += got.encode().len();
            }
            bytes
        })
    };
    let tasks = [send(1, a_tx), send(2, b_tx)];
    let (to_b, to_a) = (recv(1, b_rx), recv(2, a_rx));
    for t in tasks {
        t.await.unwrap();
    }
    let (to_b, to_a) = (to_b.await.unwrap(), to_a.await.unwrap());
    assert!(to_b > 1_000_000 && to_a > 1_000_000, "{to_b} {to_a} bytes");
}

/// A peer scripted by hand with the sans-IO pieces, able to misbehave at any step.
struct RawPeer {
    stream: TcpStream,
    session_key: SecretKey,
    sealer: Option<Sealer>,
    opener: Option<Opener>,
    victim_session: Option<PublicKey>,
}

impl RawPeer {
    async fn connect(addr: std::net::SocketAddr) -> Self {
        RawPeer {
            stream: TcpStream::connect(addr).await.unwrap(),
            session_key: key(0x44),
            sealer: None,
            opener: None,
            victim_session: None,
        }
    }

    /// Exchanges session keys honestly and derives both directions' keys.
    async fn exchange_keys(&mut self) {
        let ours = public(&self.session_key);
        self.stream.write_all(&ours.serialize()).await.unwrap();
        let mut theirs = [0u8; 33];
        self.stream.read_exact(&mut theirs).await.unwrap();
        let theirs = PublicKey::from_slice(&theirs).unwrap();
        let keys = SessionKeys::derive(&self.session_key, &ours, &theirs);
        self.sealer = Some(Sealer::new(&keys.send));
        self.opener = Some(Opener::new(&keys.receive));
        self.victim_session = Some(theirs);
    }

    fn auth_packet(&self, signed: &[u8]) -> Packet {
        let node = key(0x55);
        let digest = sha256d::Hash::hash(signed);
        let sig = Secp256k1::new().sign_ecdsa(&Message::from_digest(digest.to_byte_array()), &node);
        Packet::Auth(Authenticate {
            node_id: ChainPubkey::new(public(&node)),
            session_sig: sig,
        })
    }

    fn good_auth(&self) -> Packet {
        self.auth_packet(&self.victim_session.unwrap().serialize())
    }

    fn seal(&mut self, payload: &[u8]) -> Vec<u8> {
        self.sealer.as_mut().unwrap().seal(payload).unwrap()
    }

    async fn send_payload(&mut self, payload: &[u8]) {
        let frame = self.seal(payload);
        self.stream.write_all(&frame).await.unwrap();
    }

    /// Reads packets until the victim closes; returns them.
    async fn read_until_closed(&mut self) -> Vec<Packet> {
        let mut buf = Vec::new();
        self.stream.read_to_end(&mut buf).await.ok();
        let opener = self.opener.as_mut().unwrap();
        let mut at = 0;
        let mut packets = Vec::new();
        while let Ok(Some((plain, used))) = opener.open_from(&buf[at..]) {
            at += used;
            packets.push(Packet::decode(&plain).unwrap());
        }
        packets
    }

    /// Completes the handshake honestly, as far as the victim's hello.
    async fn handshake(&mut self) {
        self.exchange_keys().await;
        let auth = self.good_auth().encode();
        self.send_payload(&auth).await;
        self.send_payload(&Packet::error("hello").encode()).await;
    }
}

fn problem(p: &Packet) -> Option<&str> {
    match p {
        Packet::Error(e) => e.problem.as_deref(),
        _ => None,
    }
}

/// Starts a victim that accepts one connection with a short handshake time-out.
async fn victim() -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<Result<session::Session, SessionError>>,
) {
    let (l, addr) = listener().await;
    let task = tokio::spawn(async move {
        let (stream, _) = l.accept().await.unwrap();
        let config = Config {
            handshake_timeout: Duration::from_millis(500),
        };
        session::accept(stream, &key(0x22), &config).await
    });
    (addr, task)
}

#[tokio::test]
async fn short_session_key_is_refused() {
    let (addr, task) = victim().await;
    let mut peer = RawPeer::connect(addr).await;
    peer.stream.write_all(&[2; 20]).await.unwrap();
    peer.stream.shutdown().await.unwrap();
    let err = task.await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::Handshake(HandshakeError::SessionKeyLength { len: 20 })
        ),
        "{err}"
    );
}

#[tokio::test]
async fn invalid_curve_points_are_refused() {
    // x = 5 is not on the curve; 0x04 is not a compressed prefix.
    let mut off_curve = [0u8; 33];
    off_curve[0] = 2;
    off_curve[32] = 5;
    let mut wrong_prefix = public(&key(9)).serialize();
    wrong_prefix[0] = 4;
    for bad in [off_curve, wrong_prefix] {
        let (addr, task) = victim().await;
        let mut peer = RawPeer::connect(addr).await;
        peer.stream.write_all(&bad).await.unwrap();
        let err = task.await.unwrap().unwrap_err();
        assert!(
            matches!(
                err,
                SessionError::Handshake(HandshakeError::InvalidSessionKey)
            ),
            "{err}"
        );
        // The victim hung up after its own key: nothing else arrives.
        let mut rest = Vec::new();
        peer.stream.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest.len(), 33);
    }
}

#[tokio::test]
async fn bad_authenticate_signature_is_refused_with_an_error_packet() {
    let (addr, task) = victim().await;
    let mut peer = RawPeer::connect(addr).await;
    peer.exchange_keys().await;
    // Signed over our own session key instead of the victim's.
    let bad = peer
        .auth_packet(&public(&peer.session_key).serialize())
        .encode();
    peer.send_payload(&bad).await;
    let err = task.await.unwrap().unwrap_err();
    assert!(
        matches!(err, SessionError::Handshake(HandshakeError::BadSignature)),
        "{err}"
    );
    let got = peer.read_until_closed().await;
    assert!(matches!(got[0], Packet::Auth(_)));
    assert_eq!(problem(&got[1]), Some("Bad authenticate signature"));
    assert_eq!(got.len(), 2, "no hello for an unauthenticated peer");
}

#[tokio::test]
async fn unknown_even_field_in_authenticate_is_refused() {
    let (addr, task) = victim().await;
    let mut peer = RawPeer::connect(addr).await;
    peer.exchange_keys().await;
    // auth is field 50 with a two-byte length; append field 6 (even, unknown) inside it.
    let mut bytes = peer.good_auth().encode();
    assert_eq!(&bytes[..2], &[0x92, 0x03]);
    bytes[2] += 2;
    bytes.extend_from_slice(&[0x30, 0x01]);
    peer.send_payload(&bytes).await;
    let err = task.await.unwrap().unwrap_err();
    let SessionError::Handshake(HandshakeError::Decode(e)) = &err else {
        panic!("{err}");
    };
    assert_eq!(
        *e.kind(),
        DecodeErrorKind::UnknownEvenField {
            message: "authenticate",
            field: 6
        }
    );
    let got = peer.read_until_closed().await;
    assert!(problem(&got[1])
        .unwrap()
        .contains("unknown even field 6 in authenticate"));
}

#[tokio::test]
async fn first_packet_not_authenticate_is_refused() {
    let (addr, task) = victim().await;
    let mut peer = RawPeer::connect(addr).await;
    peer.exchange_keys().await;
    peer.send_payload(&Packet::error("hello").encode()).await;
    let err = task.await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::Handshake(HandshakeError::NotAuthenticate { got: "error" })
        ),
        "{err}"
    );
    let got = peer.read_until_closed().await;
    assert_eq!(problem(&got[1]), Some("Unexpected packet error"));
}

#[tokio::test]
async fn bad_hmac_closes_without_a_farewell() {
    let (addr, task) = victim().await;
    let mut peer = RawPeer::connect(addr).await;
    peer.exchange_keys().await;
    let auth = peer.good_auth().encode();
    let mut frame = peer.seal(&auth);
    frame[HEADER_LEN + 3] ^= 0x40;
    peer.stream.write_all(&frame).await.unwrap();
    let err = task.await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::Handshake(HandshakeError::Frame(FrameError::BadHmac))
        ),
        "{err}"
    );
    let got = peer.read_until_closed().await;
    assert_eq!(got.len(), 1, "only the victim's authenticate: {got:?}");
}

#[tokio::test]
async fn not_hello_after_authenticate_is_refused() {
    let (addr, task) = victim().await;
    let mut peer = RawPeer::connect(addr).await;
    peer.exchange_keys().await;
    let auth = peer.good_auth().encode();
    peer.send_payload(&auth).await;
    peer.send_payload(&Packet::error("goodbye").encode()).await;
    let err = task.await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::Handshake(HandshakeError::NotHello { .. })
        ),
        "{err}"
    );
    let got = peer.read_until_closed().await;
    assert_eq!(problem(&got[1]), Some("hello"));
    assert_eq!(problem(&got[2]), Some("Expected hello"));
}

#[tokio::test]
async fn silent_peer_times_out() {
    let (addr, task) = victim().await;
    let _peer = RawPeer::connect(addr).await;
    let err = task.await.unwrap().unwrap_err();
    assert!(
        matches!(err, SessionError::HandshakeTimeout(d) if d == Duration::from_millis(500)),
        "{err}"
    );
}

/// Completes the handshake with the victim, then returns both ends.
async fn established() -> (session::Session, RawPeer) {
    let (addr, task) = victim().await;
    let mut peer = RawPeer::connect(addr).await;
    peer.handshake().await;
    let session = task.await.unwrap().unwrap();
    assert_eq!(session.remote_node_id(), public(&key(0x55)));
    // Drain the victim's authenticate and hello.
    let mut buf = vec![0u8; 2 * HEADER_LEN + 128 + 16];
    peer.stream.read_exact(&mut buf).await.unwrap();
    let opener = peer.opener.as_mut().unwrap();
    let (auth, used) = opener.open_from(&buf).unwrap().unwrap();
    assert!(matches!(Packet::decode(&auth).unwrap(), Packet::Auth(_)));
    let (hello, _) = opener.open_from(&buf[used..]).unwrap().unwrap();
    assert_eq!(problem(&Packet::decode(&hello).unwrap()), Some("hello"));
    (session, peer)
}

fn header_with_totlen(totlen: u64) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_LEN];
    h[32..].copy_from_slice(&totlen.to_le_bytes());
    h
}

#[tokio::test]
async fn established_session_carries_packets_then_refuses_bad_totlen() {
    let (mut session, mut peer) = established().await;
    peer.send_payload(&Packet::CloseAck.encode()).await;
    assert_eq!(session.recv().await.unwrap(), Packet::CloseAck);
    let sent = peer.sealer.as_ref().unwrap().total_sent();
    peer.stream
        .write_all(&header_with_totlen(sent - 1))
        .await
        .unwrap();
    let err = session.recv().await.unwrap_err();
    assert!(
        matches!(err, SessionError::Frame(FrameError::TotlenBackwards { .. })),
        "{err}"
    );
}

#[tokio::test]
async fn totlen_past_the_bound_is_refused_before_reading_the_body() {
    let (mut session, mut peer) = established().await;
    let sent = peer.sealer.as_ref().unwrap().total_sent();
    let over = sent + MAX_PAYLOAD as u64 + 1;
    peer.stream
        .write_all(&header_with_totlen(over))
        .await
        .unwrap();
    let err = session.recv().await.unwrap_err();
    assert!(
        matches!(err, SessionError::Frame(FrameError::TooLarge { len }) if len == MAX_PAYLOAD as u64 + 1),
        "{err}"
    );
}

#[tokio::test]
async fn truncated_frames_and_hang_ups() {
    // Hang-up mid-body.
    let (mut session, mut peer) = established().await;
    let frame = peer.seal(&Packet::error("x".repeat(100)).encode());
    peer.stream
        .write_all(&frame[..frame.len() - 7])
        .await
        .unwrap();
    peer.stream.shutdown().await.unwrap();
    let err = session.recv().await.unwrap_err();
    assert!(
        matches!(err, SessionError::Truncated { buffered } if buffered == frame.len() - 7),
        "{err}"
    );

    // Hang-up mid-header.
    let (mut session, mut peer) = established().await;
    let frame = peer.seal(&Packet::CloseAck.encode());
    peer.stream.write_all(&frame[..10]).await.unwrap();
    peer.stream.shutdown().await.unwrap();
    let err = session.recv().await.unwrap_err();
    assert!(
        matches!(err, SessionError::Truncated { buffered: 10 }),
        "{err}"
    );

    // Hang-up between frames.
    let (mut session, mut peer) = established().await;
    peer.stream.shutdown().await.unwrap();
    assert!(matches!(
        session.recv().await.unwrap_err(),
        SessionError::HungUp
    ));
}

#[tokio::test]
async fn undecodable_packet_gets_an_error_packet_then_close() {
    let (mut session, mut peer) = established().await;
    // update_complete (5) carrying field 8, even and unknown.
    peer.send_payload(&[0x2a, 0x02, 0x40, 0x01]).await;
    let err = session.recv().await.unwrap_err();
    assert!(matches!(err, SessionError::Decode(_)), "{err}");
    drop(session);
    let got = peer.read_until_closed().await;
    let text = problem(&got[0]).unwrap();
    assert!(
        text.contains("unknown even field 8 in update_complete"),
        "{text}"
    );
}

/// A peer that sends our own session key back and echoes every byte (issue 28 finding
/// 11): both directions would share one key stream and our own `authenticate` would verify,
/// giving a session with ourselves. The echoed key is refused before anything is signed.
#[tokio::test]
async fn an_echoed_session_key_is_refused() {
    let (addr, task) = victim().await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let echo = tokio::spawn(async move { tokio::io::copy(&mut read, &mut write).await });
    let got = task.await.unwrap();
    let err = got.expect_err("a session with ourselves");
    assert!(
        matches!(
            err,
            SessionError::Handshake(HandshakeError::ReflectedSessionKey)
        ),
        "{err}"
    );
    echo.abort();
}
