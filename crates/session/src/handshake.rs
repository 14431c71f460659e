//! The v3 handshake as a state machine: bytes in, bytes out, no IO.
//!
//! ```text
//! AwaitSessionKey --33 bytes--> AwaitAuth --authenticate ok--> AwaitHello --error{"hello"}--> Established
//! ```
//! On creation the caller writes [`Handshake::session_public_key`]. When the
//! peer's key arrives the machine derives both directions' keys and emits our
//! sealed `authenticate`; when the peer's `authenticate` verifies it emits
//! `error{problem:"hello"}` (DESIGN §6: hello only after the peer is
//! authenticated); when the peer's hello arrives the session is established.
//! Both sides run the same machine: there are no initiator and responder roles.

use bitcoin_hashes::{sha256d, Hash};
use secp256k1::{ecdsa::Signature, Message, PublicKey, Secp256k1, SecretKey};
use wire::{Authenticate, ChainPubkey, DecodeError, Packet};

use crate::frame::{FrameError, Opener, SealError, Sealer};
use crate::keys::{parse_session_key, SessionKeys, SESSION_KEY_LEN};

/// The text both sides send once authenticated (seed, Authentication step 5).
pub const HELLO: &str = "hello";

/// Why a handshake failed. Each one ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The peer's session key is not 33 bytes (it hung up early).
    #[error("peer session key is {len} bytes, expected 33")]
    SessionKeyLength {
        /// Bytes received.
        len: usize,
    },
    /// The peer's session key is not a compressed point on secp256k1.
    #[error("peer session key is not a valid compressed secp256k1 point")]
    InvalidSessionKey,
    /// The peer sent our own session key back: both directions would share one key stream,
    /// and echoing our frames would authenticate us to ourselves.
    #[error("peer session key is our own (reflected)")]
    ReflectedSessionKey,
    /// A frame failed its checks.
    #[error("frame: {0}")]
    Frame(#[from] FrameError),
    /// A packet did not decode (e.g. an unknown even field in `authenticate`).
    #[error("packet: {0}")]
    Decode(#[from] DecodeError),
    /// The first packet was not `authenticate`.
    #[error("first packet is {got}, not auth")]
    NotAuthenticate {
        /// The packet's name.
        got: &'static str,
    },
    /// `session_sig` does not verify with `node_id` over our session key.
    #[error("authenticate signature does not verify")]
    BadSignature,
    /// The packet after `authenticate` was not `error{problem:"hello"}`.
    #[error("expected error{{problem:\"hello\"}}, got {got}")]
    NotHello {
        /// What arrived instead (packet name and, for `error`, its text).
        got: String,
    },
    /// One of our own packets could not be sealed (never happens with packets this small).
    #[error("seal: {0}")]
    Seal(#[from] SealError),
    /// Called after the handshake finished or failed.
    #[error("handshake already finished")]
    Finished,
}

impl HandshakeError {
    /// The `problem` text to send before hanging up, where the key stream is still in step.
    ///
    /// None after a bad HMAC or `totlen`: the peer's stream cannot be trusted, so we simply close.
    pub fn farewell_problem(&self) -> Option<String> {
        match self {
            HandshakeError::Decode(e) => Some(format!("Bad packet: {e}")),
            HandshakeError::NotAuthenticate { got } => Some(format!("Unexpected packet {got}")),
            HandshakeError::BadSignature => Some("Bad authenticate signature".into()),
            HandshakeError::NotHello { .. } => Some("Expected hello".into()),
            HandshakeError::SessionKeyLength { .. }
            | HandshakeError::InvalidSessionKey
            | HandshakeError::ReflectedSessionKey
            | HandshakeError::Frame(_)
            | HandshakeError::Seal(_)
            | HandshakeError::Finished => None,
        }
    }
}

/// The keyed state of an authenticated session: the sealer, the opener and who the peer is.
pub struct Established {
    /// Seals what we send.
    pub sealer: Sealer,
    /// Opens what we receive.
    pub opener: Opener,
    /// The peer's node public key, proven by its `authenticate`.
    pub remote_node_id: PublicKey,
}

impl std::fmt::Debug for Established {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Established")
            .field("remote_node_id", &self.remote_node_id)
            .finish_non_exhaustive()
    }
}

/// What [`Handshake::read`] did with the input.
#[derive(Debug)]
pub enum Progress {
    /// More input is needed; this many bytes were consumed.
    Consumed(usize),
    /// The handshake is complete; bytes after `consumed` belong to the session.
    Established {
        /// Bytes of the input that the handshake used.
        consumed: usize,
        /// The session's keyed state.
        session: Box<Established>,
    },
}

enum State {
    AwaitSessionKey,
    AwaitAuth {
        sealer: Sealer,
        opener: Opener,
    },
    AwaitHello {
        sealer: Sealer,
        opener: Opener,
        remote: PublicKey,
    },
    Finished,
}

/// One side of the handshake.
pub struct Handshake {
    secp: Secp256k1<secp256k1::All>,
    node_key: SecretKey,
    session_secret: SecretKey,
    session_public: PublicKey,
    state: State,
}

impl Handshake {
    /// Starts a handshake with our node key and this connection's fresh session key.
    pub fn new(node_key: SecretKey, session_secret: SecretKey) -> Self {
        let secp = Secp256k1::new();
        let session_public = PublicKey::from_secret_key(&secp, &session_secret);
        Handshake {
            secp,
            node_key,
            session_secret,
            session_public,
            state: State::AwaitSessionKey,
        }
    }

    /// The 33 bytes to write first.
    pub fn session_public_key(&self) -> [u8; SESSION_KEY_LEN] {
        self.session_public.serialize()
    }

    /// Feeds bytes received from the peer; appends what must be sent to `out`.
    ///
    /// # Errors
    /// Any [`HandshakeError`]; the connection must then close, after sending
    /// [`Handshake::farewell`] if there is one.
    pub fn read(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<Progress, HandshakeError> {
        let mut consumed = 0;
        loop {
            let rest = &input[consumed..];
            match std::mem::replace(&mut self.state, State::Finished) {
                State::AwaitSessionKey => {
                    if rest.len() < SESSION_KEY_LEN {
                        self.state = State::AwaitSessionKey;
                        return Ok(Progress::Consumed(consumed));
                    }
                    let theirs = parse_session_key(&rest[..SESSION_KEY_LEN])?;
                    if theirs == self.session_public {
                        // Fresh random keys never collide between two honest sides.
                        return Err(HandshakeError::ReflectedSessionKey);
                    }
                    consumed += SESSION_KEY_LEN;
                    let keys =
                        SessionKeys::derive(&self.session_secret, &self.session_public, &theirs);
                    let mut sealer = Sealer::new(&keys.send);
                    let auth = self.authenticate(&theirs);
                    seal_packet(&mut sealer, &auth, out)?;
                    self.state = State::AwaitAuth {
                        sealer,
                        opener: Opener::new(&keys.receive),
                    };
                }
                State::AwaitAuth {
                    mut sealer,
                    mut opener,
                } => {
                    let opened = opener.open_from(rest);
                    let Some((payload, used)) = opened? else {
                        self.state = State::AwaitAuth { sealer, opener };
                        return Ok(Progress::Consumed(consumed));
                    };
                    consumed += used;
                    let verified = match Packet::decode(&payload) {
                        Ok(Packet::Auth(auth)) => self.verify(&auth),
                        Ok(other) => Err(HandshakeError::NotAuthenticate { got: other.name() }),
                        Err(e) => Err(e.into()),
                    };
                    let remote = match verified {
                        Ok(remote) => remote,
                        Err(e) => {
                            // Keep the keyed state so that a farewell can still be sealed.
                            self.state = State::AwaitAuth { sealer, opener };
                            return Err(e);
                        }
                    };
                    seal_packet(&mut sealer, &Packet::error(HELLO), out)?;
                    self.state = State::AwaitHello {
                        sealer,
                        opener,
                        remote,
                    };
                }
                State::AwaitHello {
                    sealer,
                    mut opener,
                    remote,
                } => {
                    let Some((payload, used)) = opener.open_from(rest)? else {
                        self.state = State::AwaitHello {
                            sealer,
                            opener,
                            remote,
                        };
                        return Ok(Progress::Consumed(consumed));
                    };
                    consumed += used;
                    let packet = Packet::decode(&payload);
                    let is_hello = matches!(&packet, Ok(Packet::Error(e)) if e.problem.as_deref() == Some(HELLO));
                    if !is_hello {
                        self.state = State::AwaitHello {
                            sealer,
                            opener,
                            remote,
                        };
                        return Err(match packet {
                            Err(e) => e.into(),
                            Ok(Packet::Error(e)) => HandshakeError::NotHello {
                                got: format!("error{{problem:{:?}}}", e.problem),
                            },
                            Ok(other) => HandshakeError::NotHello {
                                got: other.name().into(),
                            },
                        });
                    }
                    return Ok(Progress::Established {
                        consumed,
                        session: Box::new(Established {
                            sealer,
                            opener,
                            remote_node_id: remote,
                        }),
                    });
                }
                State::Finished => return Err(HandshakeError::Finished),
            }
        }
    }

    /// The sealed `error` packet to send before closing after `err`, if the key stream allows one.
    pub fn farewell(&mut self, err: &HandshakeError) -> Option<Vec<u8>> {
        let problem = err.farewell_problem()?;
        let sealer = match &mut self.state {
            State::AwaitAuth { sealer, .. } | State::AwaitHello { sealer, .. } => sealer,
            State::AwaitSessionKey | State::Finished => return None,
        };
        let mut out = Vec::new();
        let sealed = seal_packet(sealer, &Packet::error(problem), &mut out);
        self.state = State::Finished;
        sealed.ok().map(|()| out)
    }

    /// Our `authenticate`: the node key signs SHA256d of the peer's session key (low-S, RFC6979).
    fn authenticate(&self, their_session: &PublicKey) -> Packet {
        let digest = sha256d::Hash::hash(&their_session.serialize());
        let sig = self.secp.sign_ecdsa(
            &Message::from_digest(digest.to_byte_array()),
            &self.node_key,
        );
        Packet::Auth(Authenticate {
            node_id: ChainPubkey::new(PublicKey::from_secret_key(&self.secp, &self.node_key)),
            session_sig: sig,
        })
    }

    /// Checks the peer's `authenticate` over our session key; returns its node id.
    fn verify(&self, auth: &Authenticate) -> Result<PublicKey, HandshakeError> {
        let digest = sha256d::Hash::hash(&self.session_public.serialize());
        // The reference accepts high-S signatures; libsecp256k1 verifies only low-S ones.
        let mut sig: Signature = auth.session_sig;
        sig.normalize_s();
        let node_id = auth.node_id.public_key();
        self.secp
            .verify_ecdsa(
                &Message::from_digest(digest.to_byte_array()),
                &sig,
                &node_id,
            )
            .map_err(|_| HandshakeError::BadSignature)?;
        Ok(node_id)
    }
}

/// Seals a packet we built ourselves.
fn seal_packet(sealer: &mut Sealer, packet: &Packet, out: &mut Vec<u8>) -> Result<(), SealError> {
    sealer.seal_into(&packet.encode(), out)
}
