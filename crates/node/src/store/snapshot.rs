//! The channel snapshot codec: the JSON a channel is stored as, with its layout version,
//! and the migration of older layouts on read (docs/node.md, "Upgrades").

use channel::Channel;

use super::{ChannelId, StoreError};

/// The version of the channel snapshot layout this release writes. 0: before the
/// channel restructure (flat struct, `state` beside loose options; migrated on load);
/// 1: the restructured layout without a version field; 2: the same with
/// `snapshot_version`; 3: the same with 32-byte arrays (secrets, preimages) as hex strings
/// instead of arrays of numbers. docs/node.md, "Upgrades".
pub(crate) const SNAPSHOT_VERSION: u64 = 3;

/// The snapshot buffer's first size: a busy channel's snapshot (10 KB with a full
/// revocation store) fits without growing it.
const SNAPSHOT_CAPACITY: usize = 16 * 1024;

/// The JSON key holding the snapshot version.
const VERSION_KEY: &str = "snapshot_version";

/// A channel read from its snapshot, with the history an old layout kept inside it.
pub(crate) struct Decoded {
    pub channel: Channel,
    /// The layout version it was read from.
    pub version: u64,
    /// Version 0: every HTLC it ever saw, to archive for penalties.
    pub legacy_history: Option<channel::RevokedCommitment>,
}

/// Encodes `channel` as a snapshot of [`SNAPSHOT_VERSION`].
pub(crate) fn encode_snapshot(id: ChannelId, channel: &Channel) -> Result<String, StoreError> {
    use std::io::Write as _;
    let mut buf = Vec::with_capacity(SNAPSHOT_CAPACITY);
    serde_json::to_writer(&mut buf, channel).map_err(|source| StoreError::Encode { id, source })?;
    // The version goes after the channel's fields, inside its object, written by hand:
    // `#[serde(flatten)]` wrote the same bytes through serde's map of flattened fields, a
    // detour per field on every durable write (1-2 % of a busy hub's CPU).
    if buf.first() != Some(&b'{') || buf.pop() != Some(b'}') {
        return Err(StoreError::NotAnObject(id));
    }
    if buf.len() > 1 {
        buf.push(b',');
    }
    write!(buf, "\"{VERSION_KEY}\":{SNAPSHOT_VERSION}}}").map_err(|e| StoreError::Encode {
        id,
        source: serde_json::Error::io(e),
    })?;
    String::from_utf8(buf).map_err(|_| StoreError::NotUtf8(id))
}

/// Decodes a snapshot of any version this release knows; migrates version 0. Versions 0
/// to 2 hold 32-byte arrays as numbers, 3 as hex strings: the fields read both, and a
/// string that is not 64 lowercase hex digits is an error (`channel::stored_hex`).
///
/// # Errors
/// A newer version ([`StoreError::SnapshotTooNew`]) or a snapshot that does not parse
/// as its version ([`StoreError::UndecodableVersion`], naming the version): the node refuses to start
/// rather than lose the channel.
pub(crate) fn decode_snapshot(id: ChannelId, json: &str) -> Result<Decoded, StoreError> {
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
        1..=SNAPSHOT_VERSION => Ok(Decoded {
            channel: serde_json::from_value(value).map_err(|e| corrupt(version, e.into()))?,
            version,
            legacy_history: None,
        }),
        _ => Err(StoreError::SnapshotTooNew { id, version }),
    }
}

/// The codec as the snapshot benchmark sees it (`examples/snapshot_bench.rs`): what a
/// durable write encodes, and what a start decodes.
#[doc(hidden)]
pub mod bench {
    use channel::Channel;

    use super::super::{ChannelId, StoreError};

    /// `encode_snapshot` of channel 1.
    pub fn encode(channel: &Channel) -> Result<String, StoreError> {
        super::encode_snapshot(ChannelId(1), channel)
    }

    /// `decode_snapshot` of channel 1: the channel and the version it was read from.
    pub fn decode(json: &str) -> Result<(Channel, u64), StoreError> {
        super::decode_snapshot(ChannelId(1), json).map(|d| (d.channel, d.version))
    }
}
