//! Why a packet failed to decode, with the place in the message tree where it failed.

use std::fmt;

/// A packet that must not be accepted. Every variant is fatal for the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(Box<Inner>);

// Boxed so that `Result<_, DecodeError>` stays two words on the decoder's hot path.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Inner {
    kind: DecodeErrorKind,
    /// Field names from `pkt` down to the message that failed, outermost first.
    path: Vec<&'static str>,
}

/// What was wrong with the packet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The bytes are not a well-formed protobuf encoding (truncated, bad varint, bad wire type).
    #[error("malformed {message}: {reason}")]
    Malformed {
        /// The message being decoded.
        message: &'static str,
        /// What was malformed.
        reason: &'static str,
    },
    /// An unknown field with an even number: the sender requires something we do not know.
    #[error("unknown even field {field} in {message}")]
    UnknownEvenField {
        /// The message that carried it.
        message: &'static str,
        /// Its field number.
        field: u64,
    },
    /// A required field is absent.
    #[error("missing required field {field} ({number}) in {message}")]
    MissingRequired {
        /// The message that lacks it.
        message: &'static str,
        /// The field's name.
        field: &'static str,
        /// The field's number.
        number: u32,
    },
    /// A oneof that must hold exactly one member holds none.
    #[error("{message}.{oneof} has no member set; exactly one is required")]
    OneofEmpty {
        /// The message.
        message: &'static str,
        /// The oneof's name.
        oneof: &'static str,
    },
    /// A oneof holds more than one member.
    #[error("{message}.{oneof} has several members set ({first} and {second})")]
    OneofSeveral {
        /// The message.
        message: &'static str,
        /// The oneof's name.
        oneof: &'static str,
        /// The member seen first.
        first: &'static str,
        /// The conflicting member.
        second: &'static str,
    },
    /// A known field arrived with a wire type its declared type cannot have.
    #[error("field {field} of {message} has wire type {wire_type}, expected {expected}")]
    WrongWireType {
        /// The message.
        message: &'static str,
        /// The field's name.
        field: &'static str,
        /// The wire type seen.
        wire_type: u8,
        /// The wire type of the declared type.
        expected: u8,
    },
    /// A value does not fit its declared type (e.g. a uint32 above 2^32-1, a bool other than 0/1).
    #[error("field {field} of {message} is out of range for its type: {value}")]
    OutOfRange {
        /// The message.
        message: &'static str,
        /// The field's name.
        field: &'static str,
        /// The raw varint value.
        value: u64,
    },
    /// An enum value that the enum does not define.
    #[error("field {field} of {message} has value {value}, not in its enum")]
    InvalidEnum {
        /// The message.
        message: &'static str,
        /// The field's name.
        field: &'static str,
        /// The value seen.
        value: i64,
    },
    /// A string field that is not UTF-8.
    #[error("field {field} of {message} is not valid UTF-8")]
    InvalidUtf8 {
        /// The message.
        message: &'static str,
        /// The field's name.
        field: &'static str,
    },
    /// Nesting deeper than any valid packet has (only possible inside unknown groups).
    #[error("nesting too deep")]
    TooDeep,
    /// A `chain_pubkey` whose length is neither 33 nor 65.
    #[error("chain_pubkey is {len} bytes; it must be 33 or 65")]
    PubkeyLength {
        /// The length seen.
        len: usize,
    },
    /// A `chain_pubkey` that is not a point on secp256k1 or has a wrong prefix.
    #[error("chain_pubkey is not a valid secp256k1 point")]
    InvalidPubkey,
    /// An `update_add_htlc.onion` that is not exactly [`crate::Onion::LEN`] bytes.
    #[error("onion is {len} bytes; it must be 1366")]
    OnionLength {
        /// The length seen.
        len: usize,
    },
    /// A `signature` whose r or s is zero or not below the curve order.
    #[error("signature {half} is zero or not below the curve order")]
    InvalidSignature {
        /// `"r"` or `"s"`.
        half: &'static str,
    },
    /// The protobuf runtime refused bytes that passed the structural check.
    #[error("protobuf: {0}")]
    Protobuf(String),
}

impl DecodeError {
    pub(crate) fn new(kind: DecodeErrorKind) -> Self {
        DecodeError(Box::new(Inner {
            kind,
            path: Vec::new(),
        }))
    }

    /// Records that the error happened inside `field` of the enclosing message.
    pub(crate) fn within(mut self, field: &'static str) -> Self {
        self.0.path.insert(0, field);
        self
    }

    /// What was wrong.
    pub fn kind(&self) -> &DecodeErrorKind {
        &self.0.kind
    }

    /// Field names from the top of the packet down to where it failed (e.g. `["auth", "node_id"]`).
    pub fn path(&self) -> &[&'static str] {
        &self.0.path
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.path.is_empty() {
            write!(f, "{}", self.0.kind)
        } else {
            write!(f, "{} (at pkt.{})", self.0.kind, self.0.path.join("."))
        }
    }
}

// The kind is part of the message already, so it is not repeated as a source.
impl std::error::Error for DecodeError {}

impl From<DecodeErrorKind> for DecodeError {
    fn from(kind: DecodeErrorKind) -> Self {
        DecodeError::new(kind)
    }
}
