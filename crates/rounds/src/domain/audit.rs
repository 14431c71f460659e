//! The typed details of an audit-log entry (the per-field diff of a settings change is [`crate::domain::settings::ConfigDiff`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::round::{stored_enum, UnknownState};
use crate::domain::settings::ConfigDiff;
use std::fmt;
use std::str::FromStr;

stored_enum! {
    /// What an audit entry records, as stored in its `event` column.
    AuditEvent, "audit event" {
        /// An admin changed the service configuration.
        ConfigUpdated = "config_updated",
        /// An admin paused the service.
        Paused = "paused",
        /// An admin resumed the service.
        Resumed = "resumed",
        /// An admin reset a user's password.
        PasswordReset = "password_reset",
        /// A round's draw block was reorganised away; the draw waits for the new one.
        DrawAnchoredAgain = "draw_anchored_again",
        /// A round's payout could not be built or the network refused it.
        PayoutFailed = "payout_failed",
        /// An admin retried a failed payout.
        PayoutRetried = "payout_retried",
        /// A transfer the network keeps refusing was set aside.
        TransferSetAside = "transfer_set_aside",
        /// An output of the service was spent by a transaction it did not write.
        UnknownSpend = "unknown_spend",
        /// A deposit was reorganised out of the chain for good.
        DepositReversed = "deposit_reversed",
        /// A withdrawal or payout was replaced at a higher fee rate.
        TransferBumped = "transfer_bumped",
        /// A block confirmed a replaced version of a transfer; the ledger follows it.
        TransferVersionConfirmed = "transfer_version_confirmed",
    }
}

stored_enum! {
    /// Who did what an audit entry records, as stored in its `actor` column.
    AuditActor, "audit actor" {
        /// Whoever holds the admin token.
        Admin = "admin",
        /// The service's own background work.
        Engine = "engine",
    }
}

/// What an audit entry records besides its event, actor and diff; only the
/// fields of its event are present (`{}` for config updates, pause and resume).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditDetails {
    /// `password_reset`: the name as stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// `password_reset`: the raised token version (every earlier token is dead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_version: Option<i64>,
    /// `payout_failed`, `payout_retried`: the round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_id: Option<i64>,
    /// `payout_failed`: the payout transfer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer_id: Option<i64>,
    /// `payout_failed`: why the network refused the payout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `payout_retried`: the new payout transaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txid: Option<String>,
    /// `payout_retried`: the payout transaction it replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced_txid: Option<String>,
    /// `transfer_set_aside`: the transfer's kind (`bet`, `withdrawal`, `payout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// `transfer_set_aside`, `deposit_reversed`: the user concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<i64>,
    /// `unknown_spend`, `deposit_reversed`: the output's index in `txid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vout: Option<i64>,
    /// `unknown_spend`, `deposit_reversed`: the output's amount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_sats: Option<i64>,
    /// `deposit_reversed`: the service's transaction that had spent the deposit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent_by: Option<String>,
    /// `deposit_reversed`: what the user owes after the reversal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debt_sats: Option<i64>,
    /// `transfer_bumped`: the replacement's miner fee.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fee_sats: Option<i64>,
    /// `transfer_bumped`: the fee rate asked for (sat/vB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fee_rate_sat_vb: Option<i64>,
    /// `payout_retried`: pot outputs gone from the chain, left out of the new payout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped_inputs: Option<Vec<AuditOutput>>,
    /// Details this build has no field for (an entry written by a newer
    /// version), shown as stored rather than dropped.
    #[serde(flatten)]
    pub other: BTreeMap<String, AuditValue>,
}

/// An output named in an audit entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditOutput {
    /// The transaction holding it.
    pub txid: String,
    /// Its index.
    pub vout: i64,
    /// Its amount.
    pub amount_sats: i64,
}

/// A detail value without a field of its own in [`AuditDetails`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum AuditValue {
    /// A flag.
    Bool(bool),
    /// A number (ids, amounts in sats, heights).
    Int(i64),
    /// Text (names, txids, reasons).
    Text(String),
    /// A list of such values.
    List(Vec<AuditValue>),
    /// A group of named values.
    Map(BTreeMap<String, AuditValue>),
    /// No value.
    Null,
}

impl AuditDetails {
    /// No details: `{}`.
    pub fn none() -> Self {
        Self::default()
    }
}

/// One audit-log entry.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct AuditEntry {
    /// Increasing id; pages go by `before_id`.
    pub id: i64,
    /// RFC 3339 UTC time of the entry.
    pub at: String,
    /// `config_updated`, `paused`, `resumed`, `password_reset`, …
    pub event: String,
    /// Who did it (`admin` for the admin token).
    pub actor: String,
    /// `{field: {before, after}}` for config changes and pause/resume, else empty.
    pub diff: ConfigDiff,
    /// Event-specific details.
    pub details: AuditDetails,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_events_fields_are_written() {
        let d = AuditDetails {
            username: Some("Dora".into()),
            token_version: Some(2),
            ..AuditDetails::none()
        };
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"username":"Dora","token_version":2}"#
        );
        assert_eq!(serde_json::to_string(&AuditDetails::none()).unwrap(), "{}");
    }

    #[test]
    fn unknown_details_survive_a_round_trip() {
        let stored = r#"{"round_id":7,"outpoints":["a:0","b:1"],"penalty_sats":1200,"manual":true,"claimed_by":{"txid":"ab","vout":1},"note":null}"#;
        let d: AuditDetails = serde_json::from_str(stored).unwrap();
        assert_eq!(d.round_id, Some(7));
        assert_eq!(d.other.get("penalty_sats"), Some(&AuditValue::Int(1200)));
        let back: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
        let orig: serde_json::Value = serde_json::from_str(stored).unwrap();
        assert_eq!(back, orig);
    }
}
