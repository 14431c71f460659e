//! The channel snapshot codec: the bytes a channel is stored as, with their layout version,
//! and the migration of older layouts on read (docs/node.md, "Upgrades").
//!
//! Versions 0 to 3 are JSON objects (the first byte `{`); version 4 is one byte holding
//! the version, then the channel in postcard's binary layout of the same serde derives.

use channel::Channel;

use super::{ChannelId, StoreError};

/// The version of the channel snapshot layout this release writes. 0: before the
/// channel restructure (flat struct, `state` beside loose options; migrated on load);
/// 1: the restructured layout without a version field; 2: the same with
/// `snapshot_version`; 3: the same with 32-byte arrays (secrets, preimages) as hex strings
/// instead of arrays of numbers; 4: binary (postcard), the version in its first byte.
/// docs/node.md, "Upgrades".
pub(crate) const SNAPSHOT_VERSION: u64 = 4;

/// The first byte of a version 4 snapshot. A JSON snapshot (versions 0 to 3) starts with
/// `{` (123), which no binary version reaches.
const BINARY_VERSION: u8 = 4;

/// The snapshot buffer's first size: a busy channel's snapshot (2.8 KB with a full
/// revocation store and 3+3 HTLCs in flight) fits without growing it.
const SNAPSHOT_CAPACITY: usize = 4 * 1024;

/// The JSON key holding the snapshot version (versions 2 and 3).
const VERSION_KEY: &str = "snapshot_version";

/// A channel read from its snapshot, with the history an old layout kept inside it.
pub(crate) struct Decoded {
    pub channel: Channel,
    /// The layout version it was read from.
    pub version: u64,
    /// Version 0: every HTLC it ever saw, to archive for penalties.
    pub legacy_history: Option<channel::RevokedCommitment>,
}

/// Encodes `channel` as a snapshot of [`SNAPSHOT_VERSION`]: its version byte, then the
/// channel. Binary because a node encodes its channel on every durable write: as JSON that
/// was 6 % of a busy hub's CPU, and its text twice the bytes SQLite then copies, pages and
/// checksums (docs/node.md, "Upgrades").
pub(crate) fn encode_snapshot(id: ChannelId, channel: &Channel) -> Result<Vec<u8>, StoreError> {
    let mut buf = Vec::with_capacity(SNAPSHOT_CAPACITY);
    buf.push(BINARY_VERSION);
    postcard::to_extend(channel, buf).map_err(|source| StoreError::EncodeSnapshot { id, source })
}

/// Decodes a snapshot of any version this release knows; migrates version 0. Versions 0
/// to 2 hold 32-byte arrays as numbers, 3 as hex strings: the fields read both, and a
/// string that is not 64 lowercase hex digits is an error (`channel::stored_hex`).
/// Version 4 must be read whole: bytes left after the channel are an error too.
///
/// # Errors
/// A newer version ([`StoreError::SnapshotTooNew`]) or a snapshot that does not parse
/// as its version ([`StoreError::UndecodableVersion`], naming the version): the node refuses to start
/// rather than lose the channel.
pub(crate) fn decode_snapshot(id: ChannelId, bytes: &[u8]) -> Result<Decoded, StoreError> {
    match bytes.split_first() {
        Some((b'{', _)) => {
            let json = std::str::from_utf8(bytes)
                .map_err(|e| StoreError::Corrupt(id, format!("JSON snapshot not UTF-8: {e}")))?;
            decode_json(id, json)
        }
        Some((&BINARY_VERSION, body)) => {
            let corrupt =
                |source: Box<dyn std::error::Error + Send + Sync>| StoreError::UndecodableVersion {
                    id,
                    version: SNAPSHOT_VERSION,
                    source,
                };
            let (channel, rest) = postcard::take_from_bytes(body).map_err(|e| corrupt(e.into()))?;
            if !rest.is_empty() {
                return Err(corrupt(
                    format!("{} bytes after the channel", rest.len()).into(),
                ));
            }
            Ok(Decoded {
                channel,
                version: SNAPSHOT_VERSION,
                legacy_history: None,
            })
        }
        // Binary versions after this one; a text never starts below a space.
        Some((&version, _)) if (BINARY_VERSION + 1..b' ').contains(&version) => {
            Err(StoreError::SnapshotTooNew {
                id,
                version: version.into(),
            })
        }
        Some((first, _)) => Err(StoreError::Corrupt(
            id,
            format!("a snapshot starting with byte {first}, neither JSON nor a binary version"),
        )),
        None => Err(StoreError::Corrupt(id, "an empty snapshot".into())),
    }
}

/// Decodes a JSON snapshot, versions 0 to 3.
fn decode_json(id: ChannelId, json: &str) -> Result<Decoded, StoreError> {
    let corrupt = |version: u64, e: Box<dyn std::error::Error + Send + Sync>| {
        StoreError::UndecodableVersion {
            id,
            version,
            source: e,
        }
    };
    let mut value: serde_json::Value =
        serde_json::from_str(json).map_err(|source| StoreError::Undecodable { id, source })?;
    let serde_json::Value::Object(map) = &mut value else {
        return Err(StoreError::Corrupt(id, "not a JSON object".into()));
    };
    let version = match map.remove(VERSION_KEY) {
        Some(v) => v
            .as_u64()
            .ok_or_else(|| StoreError::Corrupt(id, format!("bad {VERSION_KEY} {v}")))?,
        // Unversioned: the old flat layout has `state`, the restructured one `stage`.
        None if map.contains_key("state") => 0,
        None => 1,
    };
    match version {
        0 => {
            let old: channel::ChannelV0 =
                serde_json::from_value(value).map_err(|e| corrupt(0, e.into()))?;
            let migrated = old.migrate().map_err(|e| corrupt(0, e.into()))?;
            Ok(Decoded {
                channel: migrated.channel,
                version,
                legacy_history: Some(migrated.history),
            })
        }
        1..=3 => Ok(Decoded {
            channel: serde_json::from_value(value).map_err(|e| corrupt(version, e.into()))?,
            version,
            legacy_history: None,
        }),
        v if v > SNAPSHOT_VERSION => Err(StoreError::SnapshotTooNew { id, version }),
        v => Err(StoreError::Corrupt(
            id,
            format!("a JSON snapshot naming version {v}, which is binary"),
        )),
    }
}

/// A channel as the release before wrote it: its JSON object with `"snapshot_version":3`
/// after its fields (the tests' version 3 snapshots).
#[cfg(test)]
pub(crate) fn encode_json_v3(channel: &Channel) -> String {
    let json = serde_json::to_string(channel).expect("a channel encodes as JSON");
    let fields = json.strip_suffix('}').expect("a channel is a JSON object");
    format!("{fields},\"{VERSION_KEY}\":3}}")
}

/// The codec as the snapshot benchmark sees it (`examples/snapshot_bench.rs`): what a
/// durable write encodes, and what a start decodes.
#[doc(hidden)]
pub mod bench {
    use channel::Channel;

    use super::super::{ChannelId, StoreError};

    /// `encode_snapshot` of channel 1.
    pub fn encode(channel: &Channel) -> Result<Vec<u8>, StoreError> {
        super::encode_snapshot(ChannelId(1), channel)
    }

    /// `decode_snapshot` of channel 1: the channel and the version it was read from.
    pub fn decode(bytes: &[u8]) -> Result<(Channel, u64), StoreError> {
        super::decode_snapshot(ChannelId(1), bytes).map(|d| (d.channel, d.version))
    }
}
