//! The thin tokio shell over the sans-IO core: TCP (or any byte stream) in, checked packets out.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use secp256k1::{PublicKey, SecretKey};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, ToSocketAddrs};
use wire::{DecodeError, Packet};

use crate::frame::{padded_len, FrameError, Opener, SealError, Sealer, HEADER_LEN};
use crate::handshake::{Handshake, HandshakeError, Progress};
use crate::keys::SESSION_KEY_LEN;

/// Settings of the transport.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long the whole handshake (keys, authenticate, hello) may take.
    pub handshake_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            handshake_timeout: Duration::from_secs(30),
        }
    }
}

/// Why a session could not be set up or went down. The connection is closed after each.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The socket failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The handshake did not finish within [`Config::handshake_timeout`].
    #[error("handshake timed out after {0:?}")]
    HandshakeTimeout(Duration),
    /// The handshake failed.
    #[error("handshake: {0}")]
    Handshake(#[from] HandshakeError),
    /// A frame failed its checks; we closed without a farewell (the stream is out of step),
    /// except for non-zero padding under a good MAC, which gets `error{"Bad frame: ..."}`.
    #[error("frame: {0}")]
    Frame(#[from] FrameError),
    /// A packet did not decode; we sent an `error` packet and closed.
    #[error("packet: {0}")]
    Decode(#[from] DecodeError),
    /// A packet of ours could not be sealed (empty or over 1 MiB).
    #[error("seal: {0}")]
    Seal(#[from] SealError),
    /// The peer closed the connection between frames.
    #[error("peer hung up")]
    HungUp,
    /// The peer closed the connection in the middle of a frame.
    #[error("peer hung up mid-frame ({buffered} bytes of an incomplete frame)")]
    Truncated {
        /// Bytes of the incomplete frame that had arrived.
        buffered: usize,
    },
}

/// Dials `addr` and runs the handshake with a fresh session key.
///
/// # Errors
/// Connection failures, a handshake failure, or the handshake time-out.
pub async fn connect(
    addr: impl ToSocketAddrs,
    node_key: &SecretKey,
    config: &Config,
) -> Result<Session, SessionError> {
    let stream = TcpStream::connect(addr).await?;
    accept(stream, node_key, config).await
}

/// Runs the handshake on an accepted (or dialled) stream with a fresh session key.
///
/// # Errors
/// As [`connect`].
pub async fn accept(
    stream: TcpStream,
    node_key: &SecretKey,
    config: &Config,
) -> Result<Session, SessionError> {
    let session_key = fresh_secret_key()?;
    handshake_with(stream, *node_key, session_key, config).await
}

/// Runs the handshake with a given session key (deterministic tests; production uses [`accept`]).
///
/// # Errors
/// As [`connect`].
pub async fn handshake_with(
    stream: TcpStream,
    node_key: SecretKey,
    session_key: SecretKey,
    config: &Config,
) -> Result<Session, SessionError> {
    // The reference stalled ~40 ms per packet on Nagle meeting delayed ACKs.
    stream.set_nodelay(true)?;
    let split = |s: TcpStream| {
        let (read, write) = s.into_split();
        (Box::new(read) as Reader, Box::new(write) as Writer)
    };
    let timeout = config.handshake_timeout;
    tokio::time::timeout(timeout, run_handshake(stream, node_key, session_key, split))
        .await
        .map_err(|_| SessionError::HandshakeTimeout(timeout))?
}

/// Runs the handshake over any byte stream (an in-memory `tokio::io::duplex` in tests,
/// where two nodes talk without sockets), with a given session key.
///
/// # Errors
/// As [`connect`], without the connection failures.
pub async fn handshake_over<S>(
    stream: S,
    node_key: SecretKey,
    session_key: SecretKey,
    config: &Config,
) -> Result<Session, SessionError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let split = |s: S| {
        let (read, write) = tokio::io::split(s);
        (Box::new(read) as Reader, Box::new(write) as Writer)
    };
    let timeout = config.handshake_timeout;
    tokio::time::timeout(timeout, run_handshake(stream, node_key, session_key, split))
        .await
        .map_err(|_| SessionError::HandshakeTimeout(timeout))?
}

/// The receiving half of the byte stream under a session.
type Reader = Box<dyn AsyncRead + Send + Unpin>;
/// The sending half of the byte stream under a session.
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

fn fresh_secret_key() -> Result<SecretKey, SessionError> {
    loop {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
        // Fails only for zero or values ≥ the curve order (probability ~2^-128).
        if let Ok(key) = SecretKey::from_slice(&bytes) {
            return Ok(key);
        }
    }
}

async fn run_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    node_key: SecretKey,
    session_key: SecretKey,
    split: impl FnOnce(S) -> (Reader, Writer),
) -> Result<Session, SessionError> {
    let mut hs = Handshake::new(node_key, session_key);
    stream.write_all(&hs.session_public_key()).await?;
    let mut buf = BytesMut::with_capacity(4096);
    let mut out = Vec::new();
    let mut key_received = false;
    loop {
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(if !key_received {
                HandshakeError::SessionKeyLength { len: buf.len() }.into()
            } else if buf.is_empty() {
                SessionError::HungUp
            } else {
                SessionError::Truncated {
                    buffered: buf.len(),
                }
            });
        }
        match hs.read(&buf, &mut out) {
            Ok(Progress::Consumed(used)) => {
                key_received |= used > 0;
                buf.advance(used);
                if !out.is_empty() {
                    stream.write_all(&out).await?;
                    out.clear();
                }
                reserve_for_frame(&mut buf);
            }
            Ok(Progress::Established { consumed, session }) => {
                buf.advance(consumed);
                if !out.is_empty() {
                    stream.write_all(&out).await?;
                }
                let (read, write) = split(stream);
                return Ok(Session {
                    reader: SessionReader {
                        read,
                        opener: session.opener,
                        buf,
                    },
                    writer: SessionWriter {
                        write,
                        sealer: session.sealer,
                        out: Vec::new(),
                    },
                    remote_node_id: session.remote_node_id,
                });
            }
            Err(e) => {
                // Frames emitted before the failure (our authenticate) go out first, then the farewell.
                if let Some(farewell) = hs.farewell(&e) {
                    out.extend_from_slice(&farewell);
                }
                if !out.is_empty() {
                    // Best effort: the peer may already be gone.
                    let _ = stream.write_all(&out).await;
                }
                return Err(e.into());
            }
        }
    }
}

/// Reserves room for the frame whose header is buffered, so that one read can take it whole.
fn reserve_for_frame(buf: &mut BytesMut) {
    let want = match buf.first_chunk::<HEADER_LEN>() {
        // The length is checked by the opener before use; this is only a capacity hint.
        Some(header) => {
            let mut totlen = [0u8; 8];
            totlen.copy_from_slice(&header[32..]);
            HEADER_LEN + padded_len((u64::from_le_bytes(totlen) as usize).min(8192))
        }
        None => SESSION_KEY_LEN.max(4096),
    };
    if buf.capacity() - buf.len() < want {
        buf.reserve(want);
    }
}

/// An authenticated session: send and receive checked packets.
pub struct Session {
    reader: SessionReader,
    writer: SessionWriter,
    remote_node_id: PublicKey,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("remote_node_id", &self.remote_node_id)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// The peer's node key, proven by its `authenticate`.
    pub fn remote_node_id(&self) -> PublicKey {
        self.remote_node_id
    }

    /// Sends one packet as one frame in one write. Not cancel-safe.
    ///
    /// # Errors
    /// Socket errors, or a packet over 1 MiB.
    pub async fn send(&mut self, packet: &Packet) -> Result<(), SessionError> {
        self.writer.send(packet).await
    }

    /// Sends already encoded packet bytes as one frame ([`SessionWriter::send_payload`]).
    ///
    /// # Errors
    /// As [`SessionWriter::send_payload`].
    pub async fn send_payload(&mut self, payload: &[u8]) -> Result<(), SessionError> {
        self.writer.send_payload(payload).await
    }

    /// TEST ONLY: [`SessionWriter::send_badly_padded`].
    ///
    /// # Errors
    /// As [`SessionWriter::send_payload`].
    #[cfg(feature = "test-hooks")]
    pub async fn send_badly_padded(&mut self, payload: &[u8], pad: u8) -> Result<(), SessionError> {
        self.writer.send_badly_padded(payload, pad).await
    }

    /// Receives the next packet. Cancel-safe: partial frames stay buffered.
    ///
    /// A packet that does not decode gets an `error` packet naming the reason
    /// before the error is returned; a bad frame is returned without one.
    ///
    /// # Errors
    /// Frame and decode failures, socket errors, the peer hanging up.
    pub async fn recv(&mut self) -> Result<Packet, SessionError> {
        let result = self.reader.recv().await;
        match &result {
            Err(SessionError::Decode(e)) => {
                let _ = self
                    .writer
                    .send(&Packet::error(format!("Bad packet: {e}")))
                    .await;
            }
            // The MAC was good: the keystreams are in step, so the farewell can be read.
            Err(SessionError::Frame(FrameError::BadPadding)) => {
                let _ = self
                    .writer
                    .send(&Packet::error("Bad frame: non-zero padding"))
                    .await;
            }
            _ => {}
        }
        result
    }

    /// Sends `error{problem}` and closes the connection.
    ///
    /// # Errors
    /// Socket errors while sending.
    pub async fn close(mut self, problem: &str) -> Result<(), SessionError> {
        self.writer.send(&Packet::error(problem)).await?;
        self.writer.write.shutdown().await?;
        Ok(())
    }

    /// Splits into halves that can be driven by different tasks.
    ///
    /// The reader then reports decode errors without answering them: send the
    /// `error` packet through the writer.
    pub fn into_split(self) -> (SessionReader, SessionWriter) {
        (self.reader, self.writer)
    }
}

/// The receiving half of a session.
pub struct SessionReader {
    read: Reader,
    opener: Opener,
    buf: BytesMut,
}

impl SessionReader {
    /// Receives the next packet. Cancel-safe.
    ///
    /// # Errors
    /// As [`Session::recv`], without the farewell.
    pub async fn recv(&mut self) -> Result<Packet, SessionError> {
        loop {
            if let Some(opened) = self.opener.open_in_place(&mut self.buf)? {
                let packet = Packet::decode(&self.buf[opened.payload]);
                self.buf.advance(opened.frame_len);
                return Ok(packet?);
            }
            reserve_for_frame(&mut self.buf);
            if self.read.read_buf(&mut self.buf).await? == 0 {
                return Err(if self.buf.is_empty() {
                    SessionError::HungUp
                } else {
                    SessionError::Truncated {
                        buffered: self.buf.len(),
                    }
                });
            }
        }
    }
}

/// The sending half of a session.
pub struct SessionWriter {
    write: Writer,
    sealer: Sealer,
    out: Vec<u8>,
}

impl SessionWriter {
    /// Sends one packet as one frame in one write. Not cancel-safe.
    ///
    /// # Errors
    /// Socket errors, or a packet over 1 MiB.
    pub async fn send(&mut self, packet: &Packet) -> Result<(), SessionError> {
        self.out.clear();
        self.sealer.seal_into(&packet.encode(), &mut self.out)?;
        self.write.write_all(&self.out).await?;
        Ok(())
    }

    /// Sends already encoded packet bytes as one frame (e.g. a `pkt` of a newer protocol
    /// version that [`Packet`] cannot express).
    ///
    /// # Errors
    /// Socket errors, or a payload empty or over 1 MiB.
    pub async fn send_payload(&mut self, payload: &[u8]) -> Result<(), SessionError> {
        self.out.clear();
        self.sealer.seal_into(payload, &mut self.out)?;
        self.write.write_all(&self.out).await?;
        Ok(())
    }

    /// TEST ONLY: sends `payload` in a frame whose padding is `pad` bytes (see
    /// [`Sealer::seal_with_padding`]).
    ///
    /// # Errors
    /// As [`SessionWriter::send_payload`].
    #[cfg(feature = "test-hooks")]
    pub async fn send_badly_padded(&mut self, payload: &[u8], pad: u8) -> Result<(), SessionError> {
        let frame = self.sealer.seal_with_padding(payload, pad)?;
        self.write.write_all(&frame).await?;
        Ok(())
    }

    /// Closes our side of the connection.
    ///
    /// # Errors
    /// Socket errors.
    pub async fn shutdown(&mut self) -> Result<(), SessionError> {
        self.write.shutdown().await?;
        Ok(())
    }
}
