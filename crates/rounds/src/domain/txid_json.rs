//! Txids in JSON as the display hex Bitcoin Core prints (`bitcoin` is built without serde): for the operator's records that hold them typed.

use std::str::FromStr;

use bitcoin::Txid;
use serde::{Deserialize, Deserializer, Serializer};

/// Writes `txid` as its display hex.
///
/// # Errors
/// The serialiser's.
pub fn serialize<S: Serializer>(txid: &Txid, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(txid)
}

/// Reads a txid from its display hex.
///
/// # Errors
/// When the text is not a txid.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Txid, D::Error> {
    let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
    parse(&text)
}

fn parse<E: serde::de::Error>(text: &str) -> Result<Txid, E> {
    Txid::from_str(text).map_err(|e| E::custom(format_args!("txid {text:?}: {e}")))
}

/// [`serialize`] and [`deserialize`] for an optional txid (`null` or absent: `None`).
pub mod option {
    use super::*;

    /// Writes `txid` as its display hex, or `null`.
    ///
    /// # Errors
    /// The serialiser's.
    pub fn serialize<S: Serializer>(txid: &Option<Txid>, s: S) -> Result<S::Ok, S::Error> {
        match txid {
            Some(t) => s.collect_str(t),
            None => s.serialize_none(),
        }
    }

    /// Reads an optional txid from its display hex.
    ///
    /// # Errors
    /// When the text is not a txid.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Txid>, D::Error> {
        Option::<std::borrow::Cow<'de, str>>::deserialize(d)?
            .map(|text| parse(&text))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Held {
        #[serde(with = "super")]
        txid: Txid,
        #[serde(default, with = "super::option")]
        other: Option<Txid>,
    }

    #[test]
    fn a_txid_is_its_display_hex_and_text_that_is_none_is_refused() {
        let hex = "ab".repeat(31) + "01";
        let json = format!(r#"{{"txid":"{hex}","other":null}}"#);
        let held: Held = serde_json::from_str(&json).unwrap();
        assert_eq!(held.txid.to_string(), hex);
        assert_eq!(serde_json::to_string(&held).unwrap(), json);
        let bad = serde_json::from_str::<Held>(r#"{"txid":"ab"}"#).unwrap_err();
        assert!(bad.to_string().contains("txid"), "{bad}");
    }
}
