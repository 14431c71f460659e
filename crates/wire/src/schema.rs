//! The proto2 rules that prost does not enforce, checked in one pass over the raw bytes.
//!
//! prost skips unknown fields whatever their number, fills absent required
//! fields with zero, keeps the last member of a oneof and accepts any enum
//! value. The seed requires the opposite on each point, so every packet is
//! walked against the schema below before prost sees it. The walk allocates
//! nothing and reads each byte once; lengths are checked against the buffer
//! before they are used.
//!
//! The tables mirror `proto/peer.proto`; `tests/schema.rs` compares them with
//! the compiled descriptor so they cannot drift.

use crate::error::{DecodeError, DecodeErrorKind};

/// The declared type of a field, as far as the walk needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Fixed64,
    Uint32,
    Uint64,
    Int32,
    Int64,
    Sint64,
    Bool,
    Bytes,
    String,
    Enum(&'static [i32]),
    Message(&'static MessageSchema),
}

impl Kind {
    fn wire_type(self) -> u8 {
        match self {
            Kind::Fixed64 => WIRE_FIXED64,
            Kind::Uint32
            | Kind::Uint64
            | Kind::Int32
            | Kind::Int64
            | Kind::Sint64
            | Kind::Bool
            | Kind::Enum(_) => WIRE_VARINT,
            Kind::Bytes | Kind::String | Kind::Message(_) => WIRE_LEN,
        }
    }
}

/// Whether a field must be present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Presence {
    Required,
    Optional,
    /// Member of the oneof at this index of [`MessageSchema::oneofs`].
    Oneof(usize),
}

/// One field of a message.
#[derive(Debug)]
pub(crate) struct FieldSchema {
    pub(crate) number: u32,
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) presence: Presence,
}

/// One oneof of a message.
#[derive(Debug)]
pub(crate) struct OneofSchema {
    pub(crate) name: &'static str,
    /// The seed says "exactly one" (pkt, locktime); otherwise none is allowed too.
    pub(crate) exactly_one: bool,
}

/// One message type.
#[derive(Debug)]
pub(crate) struct MessageSchema {
    pub(crate) name: &'static str,
    pub(crate) fields: &'static [FieldSchema],
    pub(crate) oneofs: &'static [OneofSchema],
    /// Field number → index in `fields` (or [`NO_FIELD`]); every known number is below 64.
    lookup: [u8; 64],
    /// Every field is a required fixed64 numbered 1..=n (`sha256_hash`, `signature`).
    all_fixed64: bool,
}

const NO_FIELD: u8 = u8::MAX;

impl MessageSchema {
    /// The index in `fields` of the field with this number, if known.
    #[inline]
    fn index_of(&self, number: u64) -> Option<usize> {
        let slot = *self.lookup.get(usize::try_from(number).ok()?)?;
        (slot != NO_FIELD).then_some(usize::from(slot))
    }
}

const WIRE_VARINT: u8 = 0;
const WIRE_FIXED64: u8 = 1;
const WIRE_LEN: u8 = 2;
const WIRE_START_GROUP: u8 = 3;
const WIRE_END_GROUP: u8 = 4;
const WIRE_FIXED32: u8 = 5;

/// Deeper than any valid packet (pkt → decline → funding is 3); bounds recursion in unknown groups.
const MAX_DEPTH: u32 = 16;

const fn req(number: u32, name: &'static str, kind: Kind) -> FieldSchema {
    FieldSchema {
        number,
        name,
        kind,
        presence: Presence::Required,
    }
}

const fn opt(number: u32, name: &'static str, kind: Kind) -> FieldSchema {
    FieldSchema {
        number,
        name,
        kind,
        presence: Presence::Optional,
    }
}

const fn one(number: u32, name: &'static str, kind: Kind, oneof: usize) -> FieldSchema {
    FieldSchema {
        number,
        name,
        kind,
        presence: Presence::Oneof(oneof),
    }
}

const fn msg(
    name: &'static str,
    fields: &'static [FieldSchema],
    oneofs: &'static [OneofSchema],
) -> MessageSchema {
    let mut lookup = [NO_FIELD; 64];
    let mut all_fixed64 = !fields.is_empty();
    let mut i = 0;
    while i < fields.len() {
        let f = &fields[i];
        all_fixed64 &= matches!(f.kind, Kind::Fixed64)
            && matches!(f.presence, Presence::Required)
            && f.number as usize == i + 1;
        // A number of 64 or more fails to compile here: widen `lookup` then.
        lookup[fields[i].number as usize] = i as u8;
        i += 1;
    }
    MessageSchema {
        name,
        fields,
        oneofs,
        lookup,
        all_fixed64,
    }
}

use Kind::{Bool, Bytes, Fixed64, Int32, Int64, Message as M, Sint64, Uint32, Uint64};

pub(crate) static SHA256_HASH: MessageSchema = msg(
    "sha256_hash",
    &[
        req(1, "a", Fixed64),
        req(2, "b", Fixed64),
        req(3, "c", Fixed64),
        req(4, "d", Fixed64),
    ],
    &[],
);

pub(crate) static SIGNATURE: MessageSchema = msg(
    "signature",
    &[
        req(1, "r1", Fixed64),
        req(2, "r2", Fixed64),
        req(3, "r3", Fixed64),
        req(4, "r4", Fixed64),
        req(5, "s1", Fixed64),
        req(6, "s2", Fixed64),
        req(7, "s3", Fixed64),
        req(8, "s4", Fixed64),
    ],
    &[],
);

pub(crate) static LOCKTIME: MessageSchema = msg(
    "locktime",
    &[one(1, "seconds", Uint32, 0), one(2, "blocks", Uint32, 0)],
    &[OneofSchema {
        name: "locktime",
        exactly_one: true,
    }],
);

pub(crate) static CHAIN_PUBKEY: MessageSchema = msg("chain_pubkey", &[req(1, "key", Bytes)], &[]);

pub(crate) static FUNDING: MessageSchema = msg(
    "funding",
    &[opt(1, "fixed", Int64), opt(2, "per_micro_unit", Int32)],
    &[],
);

pub(crate) static AUTHENTICATE: MessageSchema = msg(
    "authenticate",
    &[
        req(1, "node_id", M(&CHAIN_PUBKEY)),
        req(2, "session_sig", M(&SIGNATURE)),
    ],
    &[],
);

/// Values of `anchor_offer`.
pub(crate) const ANCHOR_OFFER: &[i32] = &[1, 2];

pub(crate) static OPEN_CHANNEL: MessageSchema = msg(
    "open_channel",
    &[
        req(1, "delay", M(&LOCKTIME)),
        req(2, "revocation_hash", M(&SHA256_HASH)),
        req(3, "commit_key", M(&CHAIN_PUBKEY)),
        req(4, "final_key", M(&CHAIN_PUBKEY)),
        req(5, "anch", Kind::Enum(ANCHOR_OFFER)),
        opt(6, "min_depth", Uint32),
        req(7, "commitment_fee", Uint64),
    ],
    &[],
);

pub(crate) static OPEN_ANCHOR: MessageSchema = msg(
    "open_anchor",
    &[
        req(1, "txid", M(&SHA256_HASH)),
        req(2, "output_index", Uint32),
        req(3, "amount", Uint64),
        req(4, "commit_sig", M(&SIGNATURE)),
    ],
    &[],
);

pub(crate) static OPEN_COMMIT_SIG: MessageSchema =
    msg("open_commit_sig", &[req(1, "sig", M(&SIGNATURE))], &[]);

pub(crate) static OPEN_COMPLETE: MessageSchema =
    msg("open_complete", &[opt(1, "blockid", M(&SHA256_HASH))], &[]);

pub(crate) static UPDATE: MessageSchema = msg(
    "update",
    &[
        req(1, "revocation_hash", M(&SHA256_HASH)),
        req(2, "delta_msat", Sint64),
    ],
    &[],
);

pub(crate) static UPDATE_ADD_HTLC: MessageSchema = msg(
    "update_add_htlc",
    &[
        req(1, "revocation_hash", M(&SHA256_HASH)),
        req(2, "amount_msat", Uint32),
        req(3, "r_hash", M(&SHA256_HASH)),
        req(4, "expiry", M(&LOCKTIME)),
        opt(5, "onion", Bytes),
    ],
    &[],
);

pub(crate) static UPDATE_DECLINE_HTLC: MessageSchema = msg(
    "update_decline_htlc",
    &[
        one(1, "insufficient_funds", M(&FUNDING), 0),
        one(2, "cannot_route", Bool, 0),
    ],
    &[OneofSchema {
        name: "reason",
        exactly_one: false,
    }],
);

pub(crate) static UPDATE_FULFILL_HTLC: MessageSchema = msg(
    "update_fulfill_htlc",
    &[
        req(1, "revocation_hash", M(&SHA256_HASH)),
        req(2, "r", M(&SHA256_HASH)),
    ],
    &[],
);

pub(crate) static UPDATE_TIMEDOUT_HTLC: MessageSchema = msg(
    "update_timedout_htlc",
    &[
        req(1, "revocation_hash", M(&SHA256_HASH)),
        req(2, "r_hash", M(&SHA256_HASH)),
    ],
    &[],
);

pub(crate) static UPDATE_ROUTEFAIL_HTLC: MessageSchema = msg(
    "update_routefail_htlc",
    &[
        req(1, "revocation_hash", M(&SHA256_HASH)),
        req(2, "r_hash", M(&SHA256_HASH)),
    ],
    &[],
);

pub(crate) static UPDATE_ACCEPT: MessageSchema = msg(
    "update_accept",
    &[
        req(1, "sig", M(&SIGNATURE)),
        req(2, "revocation_hash", M(&SHA256_HASH)),
    ],
    &[],
);

pub(crate) static UPDATE_SIGNATURE: MessageSchema = msg(
    "update_signature",
    &[
        req(1, "sig", M(&SIGNATURE)),
        req(2, "revocation_preimage", M(&SHA256_HASH)),
    ],
    &[],
);

pub(crate) static UPDATE_COMPLETE: MessageSchema = msg(
    "update_complete",
    &[req(1, "revocation_preimage", M(&SHA256_HASH))],
    &[],
);

pub(crate) static CLOSE_CHANNEL: MessageSchema = msg(
    "close_channel",
    &[req(1, "sig", M(&SIGNATURE)), req(2, "close_fee", Uint64)],
    &[],
);

pub(crate) static CLOSE_CHANNEL_COMPLETE: MessageSchema = msg(
    "close_channel_complete",
    &[req(1, "sig", M(&SIGNATURE))],
    &[],
);

pub(crate) static CLOSE_CHANNEL_ACK: MessageSchema = msg("close_channel_ack", &[], &[]);

pub(crate) static ERROR: MessageSchema = msg("error", &[opt(1, "problem", Kind::String)], &[]);

pub(crate) static PKT: MessageSchema = msg(
    "pkt",
    &[
        one(50, "auth", M(&AUTHENTICATE), 0),
        one(20, "open", M(&OPEN_CHANNEL), 0),
        one(21, "open_anchor", M(&OPEN_ANCHOR), 0),
        one(22, "open_commit_sig", M(&OPEN_COMMIT_SIG), 0),
        one(23, "open_complete", M(&OPEN_COMPLETE), 0),
        one(1, "update", M(&UPDATE), 0),
        one(2, "update_add_htlc", M(&UPDATE_ADD_HTLC), 0),
        one(3, "update_accept", M(&UPDATE_ACCEPT), 0),
        one(4, "update_signature", M(&UPDATE_SIGNATURE), 0),
        one(5, "update_complete", M(&UPDATE_COMPLETE), 0),
        one(6, "update_decline_htlc", M(&UPDATE_DECLINE_HTLC), 0),
        one(7, "update_fulfill_htlc", M(&UPDATE_FULFILL_HTLC), 0),
        one(8, "update_timedout_htlc", M(&UPDATE_TIMEDOUT_HTLC), 0),
        one(9, "update_routefail_htlc", M(&UPDATE_ROUTEFAIL_HTLC), 0),
        one(30, "close", M(&CLOSE_CHANNEL), 0),
        one(31, "close_complete", M(&CLOSE_CHANNEL_COMPLETE), 0),
        one(32, "close_ack", M(&CLOSE_CHANNEL_ACK), 0),
        one(40, "error", M(&ERROR), 0),
    ],
    &[OneofSchema {
        name: "pkt",
        exactly_one: true,
    }],
);

/// Every message type, for the test that compares the tables with `peer.proto`.
#[cfg(test)]
pub(crate) static ALL: &[&MessageSchema] = &[
    &SHA256_HASH,
    &SIGNATURE,
    &LOCKTIME,
    &CHAIN_PUBKEY,
    &FUNDING,
    &AUTHENTICATE,
    &OPEN_CHANNEL,
    &OPEN_ANCHOR,
    &OPEN_COMMIT_SIG,
    &OPEN_COMPLETE,
    &UPDATE,
    &UPDATE_ADD_HTLC,
    &UPDATE_DECLINE_HTLC,
    &UPDATE_FULFILL_HTLC,
    &UPDATE_TIMEDOUT_HTLC,
    &UPDATE_ROUTEFAIL_HTLC,
    &UPDATE_ACCEPT,
    &UPDATE_SIGNATURE,
    &UPDATE_COMPLETE,
    &CLOSE_CHANNEL,
    &CLOSE_CHANNEL_COMPLETE,
    &CLOSE_CHANNEL_ACK,
    &ERROR,
    &PKT,
];

/// A cursor over the bytes of one message.
struct Reader<'a> {
    buf: &'a [u8],
    message: &'static str,
}

impl<'a> Reader<'a> {
    fn malformed(&self, reason: &'static str) -> DecodeError {
        DecodeError::new(DecodeErrorKind::Malformed {
            message: self.message,
            reason,
        })
    }

    #[inline]
    fn varint(&mut self) -> Result<u64, DecodeError> {
        // Most keys and small values are one byte.
        if let Some(&byte) = self.buf.first() {
            if byte < 0x80 {
                self.buf = &self.buf[1..];
                return Ok(u64::from(byte));
            }
        }
        let mut value: u64 = 0;
        for (i, &byte) in self.buf.iter().enumerate().take(10) {
            // The tenth byte may only carry the top bit of a u64.
            if i == 9 && byte > 1 {
                return Err(self.malformed("varint overflows 64 bits"));
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.buf = &self.buf[i + 1..];
                return Ok(value);
            }
        }
        Err(self.malformed(if self.buf.len() < 10 {
            "truncated varint"
        } else {
            "varint longer than 10 bytes"
        }))
    }

    #[inline]
    fn take(&mut self, len: u64, what: &'static str) -> Result<&'a [u8], DecodeError> {
        match usize::try_from(len) {
            Ok(len) if len <= self.buf.len() => {
                let (head, tail) = self.buf.split_at(len);
                self.buf = tail;
                Ok(head)
            }
            _ => Err(self.malformed(what)),
        }
    }

    fn len_delimited(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.varint()?;
        self.take(len, "length-delimited field runs past the end")
    }

    /// Reads a field key; returns (number, wire type).
    fn key(&mut self) -> Result<(u64, u8), DecodeError> {
        let key = self.varint()?;
        let number = key >> 3;
        // Field numbers are 1 ..= 2^29 - 1.
        if number == 0 || number > (1 << 29) - 1 {
            return Err(self.malformed("invalid field number"));
        }
        Ok((number, (key & 7) as u8))
    }

    /// Skips the value of an unknown field of the given wire type.
    fn skip(&mut self, number: u64, wire_type: u8, depth: u32) -> Result<(), DecodeError> {
        match wire_type {
            WIRE_VARINT => self.varint().map(drop),
            WIRE_FIXED64 => self.take(8, "truncated fixed64").map(drop),
            WIRE_LEN => self.len_delimited().map(drop),
            WIRE_FIXED32 => self.take(4, "truncated fixed32").map(drop),
            WIRE_START_GROUP => {
                if depth >= MAX_DEPTH {
                    return Err(DecodeErrorKind::TooDeep.into());
                }
                loop {
                    if self.buf.is_empty() {
                        return Err(self.malformed("unterminated group"));
                    }
                    let (inner, inner_type) = self.key()?;
                    if inner_type == WIRE_END_GROUP {
                        return if inner == number {
                            Ok(())
                        } else {
                            Err(self.malformed("mismatched end group"))
                        };
                    }
                    self.skip(inner, inner_type, depth + 1)?;
                }
            }
            WIRE_END_GROUP => Err(self.malformed("unexpected end group")),
            _ => Err(self.malformed("invalid wire type")),
        }
    }
}

/// Checks `buf` as an encoding of `schema`: well-formed, every unknown field
/// odd, every required field present, oneofs as the seed demands, enum values
/// defined, scalars within their type, strings UTF-8.
///
/// Each occurrence of an embedded message must be complete by itself (proto2
/// would merge repeated occurrences; no honest peer splits a message).
pub(crate) fn check(buf: &[u8], schema: &'static MessageSchema) -> Result<(), DecodeError> {
    check_at(buf, schema, 0)
}

fn check_at(buf: &[u8], schema: &'static MessageSchema, depth: u32) -> Result<(), DecodeError> {
    if depth >= MAX_DEPTH {
        return Err(DecodeErrorKind::TooDeep.into());
    }
    // Hashes and signatures are most of every packet's bytes; their canonical
    // encoding (each word once, in order) is recognised without the general walk.
    if schema.all_fixed64 && is_canonical_fixed64(buf, schema.fields.len()) {
        return Ok(());
    }
    let mut r = Reader {
        buf,
        message: schema.name,
    };
    // Bit i = fields[i] seen. No message has more than 32 fields.
    let mut seen: u32 = 0;
    // Per oneof, the index in `fields` of the member seen (at most 2 oneofs: none has more than 1).
    let mut oneof_member: [Option<usize>; 2] = [None; 2];

    while !r.buf.is_empty() {
        let (number, wire_type) = r.key()?;
        let Some(index) = schema.index_of(number) else {
            if number % 2 == 0 {
                return Err(DecodeErrorKind::UnknownEvenField {
                    message: schema.name,
                    field: number,
                }
                .into());
            }
            r.skip(number, wire_type, depth)?;
            continue;
        };
        let field = &schema.fields[index];
        let expected = field.kind.wire_type();
        if wire_type != expected {
            return Err(DecodeErrorKind::WrongWireType {
                message: schema.name,
                field: field.name,
                wire_type,
                expected,
            }
            .into());
        }
        check_value(&mut r, schema, field, depth)?;
        seen |= 1 << index;
        if let Presence::Oneof(o) = field.presence {
            match oneof_member[o] {
                Some(other) if other != index => {
                    return Err(DecodeErrorKind::OneofSeveral {
                        message: schema.name,
                        oneof: schema.oneofs[o].name,
                        first: schema.fields[other].name,
                        second: field.name,
                    }
                    .into())
                }
                _ => oneof_member[o] = Some(index),
            }
        }
    }

    for (index, field) in schema.fields.iter().enumerate() {
        if field.presence == Presence::Required && seen & (1 << index) == 0 {
            return Err(DecodeErrorKind::MissingRequired {
                message: schema.name,
                field: field.name,
                number: field.number,
            }
            .into());
        }
    }
    for (o, oneof) in schema.oneofs.iter().enumerate() {
        if oneof.exactly_one && oneof_member[o].is_none() {
            return Err(DecodeErrorKind::OneofEmpty {
                message: schema.name,
                oneof: oneof.name,
            }
            .into());
        }
    }
    Ok(())
}

/// `buf` is exactly fields 1..=n, each a fixed64 once, in order.
#[inline]
fn is_canonical_fixed64(buf: &[u8], n: usize) -> bool {
    buf.len() == 9 * n
        && buf
            .chunks_exact(9)
            .zip(1u8..)
            .all(|(chunk, number)| chunk[0] == (number << 3) | WIRE_FIXED64)
}

#[inline]
fn check_value(
    r: &mut Reader<'_>,
    schema: &'static MessageSchema,
    field: &'static FieldSchema,
    depth: u32,
) -> Result<(), DecodeError> {
    let out_of_range = |value: u64| -> DecodeError {
        DecodeErrorKind::OutOfRange {
            message: schema.name,
            field: field.name,
            value,
        }
        .into()
    };
    match field.kind {
        Kind::Fixed64 => {
            r.take(8, "truncated fixed64")?;
        }
        Kind::Uint64 | Kind::Int64 | Kind::Sint64 => {
            r.varint()?;
        }
        Kind::Uint32 => {
            let v = r.varint()?;
            if v > u64::from(u32::MAX) {
                return Err(out_of_range(v));
            }
        }
        Kind::Int32 => {
            // Negative int32 values travel sign-extended to 64 bits.
            let v = r.varint()?;
            if i32::try_from(v as i64).is_err() {
                return Err(out_of_range(v));
            }
        }
        Kind::Bool => {
            let v = r.varint()?;
            if v > 1 {
                return Err(out_of_range(v));
            }
        }
        Kind::Enum(values) => {
            let v = r.varint()? as i64;
            if !i32::try_from(v).is_ok_and(|v| values.contains(&v)) {
                return Err(DecodeErrorKind::InvalidEnum {
                    message: schema.name,
                    field: field.name,
                    value: v,
                }
                .into());
            }
        }
        Kind::Bytes => {
            r.len_delimited()?;
        }
        Kind::String => {
            let bytes = r.len_delimited()?;
            if std::str::from_utf8(bytes).is_err() {
                return Err(DecodeErrorKind::InvalidUtf8 {
                    message: schema.name,
                    field: field.name,
                }
                .into());
            }
        }
        Kind::Message(inner) => {
            let bytes = r.len_delimited()?;
            check_at(bytes, inner, depth + 1).map_err(|e| e.within(field.name))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::field_descriptor_proto::{Label, Type};

    /// The hand-written tables must say exactly what `proto/peer.proto` says.
    #[test]
    fn tables_match_peer_proto() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto");
        let fds = protox::compile(["peer.proto"], [root]).expect("peer.proto compiles");
        let file = &fds.file[0];
        assert_eq!(file.message_type.len(), ALL.len(), "one table per message");
        let anchor_offer: Vec<i32> = file.enum_type[0].value.iter().map(|v| v.number()).collect();
        assert_eq!(anchor_offer, ANCHOR_OFFER);

        for desc in &file.message_type {
            let schema = ALL
                .iter()
                .find(|s| s.name == desc.name())
                .unwrap_or_else(|| panic!("no table for {}", desc.name()));
            assert_eq!(schema.fields.len(), desc.field.len(), "{}", schema.name);
            assert!(
                schema.oneofs.len() <= 2,
                "the walk tracks at most two oneofs"
            );
            let oneof_names: Vec<&str> = desc.oneof_decl.iter().map(|o| o.name()).collect();
            let ours: Vec<&str> = schema.oneofs.iter().map(|o| o.name).collect();
            assert_eq!(ours, oneof_names, "{}", schema.name);
            for f in &desc.field {
                let at = format!("{}.{}", schema.name, f.name());
                let ours = schema
                    .fields
                    .iter()
                    .find(|s| s.name == f.name())
                    .unwrap_or_else(|| panic!("{at} missing from table"));
                assert_eq!(i64::from(ours.number), i64::from(f.number()), "{at}");
                let presence = match (f.label(), f.oneof_index) {
                    (Label::Required, None) => Presence::Required,
                    (Label::Optional, None) => Presence::Optional,
                    (Label::Optional, Some(o)) => Presence::Oneof(o as usize),
                    other => panic!("{at}: unexpected label {other:?}"),
                };
                assert_eq!(ours.presence, presence, "{at}");
                let kind_ok = match (f.r#type(), ours.kind) {
                    (Type::Fixed64, Kind::Fixed64)
                    | (Type::Uint32, Kind::Uint32)
                    | (Type::Uint64, Kind::Uint64)
                    | (Type::Int32, Kind::Int32)
                    | (Type::Int64, Kind::Int64)
                    | (Type::Sint64, Kind::Sint64)
                    | (Type::Bool, Kind::Bool)
                    | (Type::Bytes, Kind::Bytes)
                    | (Type::String, Kind::String) => true,
                    (Type::Enum, Kind::Enum(values)) => values == ANCHOR_OFFER,
                    (Type::Message, Kind::Message(inner)) => {
                        f.type_name() == format!(".potluck.peer.{}", inner.name)
                    }
                    _ => false,
                };
                assert!(kind_ok, "{at}: type {:?} vs {:?}", f.r#type(), ours.kind);
            }
        }
        // The two oneofs the seed calls "exactly one", and only those.
        let exact: Vec<&str> = ALL
            .iter()
            .flat_map(|s| s.oneofs.iter().filter(|o| o.exactly_one).map(|o| o.name))
            .collect();
        assert_eq!(exact, ["locktime", "pkt"]);
    }
}
