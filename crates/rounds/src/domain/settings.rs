//! The service settings an admin can change, and the per-field diff the audit log records.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Virtual size of one P2WPKH input: what each bet's output adds to the
/// payout transaction that spends the pot.
pub const P2WPKH_INPUT_VBYTES: i64 = 68;

/// Most P2WPKH inputs one of the service's transactions spends (a payout's
/// pot outputs, a user's coins). Such a transaction weighs at most
/// 394 + 272 × N weight units (N inputs with the largest signatures, two
/// outputs of the longest standard scripts), and Bitcoin Core relays none
/// over 400,000 (`tx-size`): N ≤ 1,469; 1,400 leaves room.
pub const MAX_TX_INPUTS: usize = 1_400;

/// Most bets one round takes: its payout spends every pot output in one
/// transaction ([`MAX_TX_INPUTS`]). A round with more bets could never be
/// paid, its retry rebuilding the same transaction.
pub const MAX_ROUND_BETS: i64 = 1_400;

/// Default most bets one user places in one round: a tenth of
/// [`MAX_ROUND_BETS`], so that one account with many small coins cannot
/// fill a round and lock the others out (issue 32, finding 4).
pub const DEFAULT_MAX_USER_ROUND_BETS: i64 = MAX_ROUND_BETS / 10;

/// Default largest share (percent) of a bet that its own pot input may cost
/// in fees at the current fee rate.
pub const DEFAULT_MAX_BET_INPUT_FEE_PERCENT: u32 = 50;

/// Dust limit of a P2WPKH output at the default dust relay fee; smaller
/// bets or withdrawals would create unrelayable outputs.
pub const DUST_LIMIT_SATS: i64 = 294;

/// A coin worth at most this much is dust to the service: its own input
/// (68 vB) costs at least its value at 1 sat/vB, the lowest fee rate the
/// service pays, so spending it never adds to a payment. It is not
/// spendable, not in `balance_sats`, and shown as `dust_sats`; the books
/// keep it (docs/rounds-engine.md, "Dust").
pub const DUST_COIN_MAX_SATS: i64 = P2WPKH_INPUT_VBYTES;

/// The most coins a payment reads: one transaction's inputs
/// ([`MAX_TX_INPUTS`]) and one more, which tells that the payer holds more.
pub const PAYMENT_COINS_READ: i64 = MAX_TX_INPUTS as i64 + 1;

/// The service configuration row.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct ServiceConfig {
    /// Where the 30% commission goes.
    pub fee_address: String,
    /// Miner fee rate of the service's transactions.
    pub fee_rate_sat_vb: i64,
    /// Length of a round; applies from the next round.
    pub round_duration_seconds: i64,
    /// Smallest accepted bet.
    pub min_bet_sats: i64,
    /// Smallest accepted withdrawal.
    pub min_withdrawal_sats: i64,
    /// Confirmations before a deposit is credited.
    pub deposit_confirmations: i64,
    /// Maintenance switch; changed only by pause and resume.
    pub paused: bool,
}

impl ServiceConfig {
    /// The settable fields, keyed by name, for diffs.
    pub fn settable_fields(&self) -> BTreeMap<&'static str, SettingValue> {
        BTreeMap::from([
            ("fee_address", SettingValue::Text(self.fee_address.clone())),
            ("fee_rate_sat_vb", SettingValue::Int(self.fee_rate_sat_vb)),
            (
                "round_duration_seconds",
                SettingValue::Int(self.round_duration_seconds),
            ),
            ("min_bet_sats", SettingValue::Int(self.min_bet_sats)),
            (
                "min_withdrawal_sats",
                SettingValue::Int(self.min_withdrawal_sats),
            ),
            (
                "deposit_confirmations",
                SettingValue::Int(self.deposit_confirmations),
            ),
        ])
    }
}

/// 21 million bitcoin: the largest minimum an admin may set.
pub const MAX_MONEY_SATS: i64 = 21_000_000 * 100_000_000;

/// A change to the settable config fields; `None` leaves a field as it is.
/// It is also the schema of the `PUT /admin/config` body, so the bounds its
/// schema shows are those [`ConfigPatch::set_integer`] applies (a test ties
/// the two).
#[derive(Debug, Clone, Default, PartialEq, Eq, ToSchema)]
#[schema(as = ConfigUpdate)]
pub struct ConfigPatch {
    /// An address of the service's own network.
    pub fee_address: Option<String>,
    /// 1–10,000.
    #[schema(minimum = 1, maximum = 10000)]
    pub fee_rate_sat_vb: Option<i64>,
    /// 1–604,800; applies from the next round.
    #[schema(minimum = 1, maximum = 604800)]
    pub round_duration_seconds: Option<i64>,
    /// At least the dust limit (294).
    #[schema(minimum = 294, maximum = 2100000000000000_i64)]
    pub min_bet_sats: Option<i64>,
    /// At least the dust limit (294).
    #[schema(minimum = 294, maximum = 2100000000000000_i64)]
    pub min_withdrawal_sats: Option<i64>,
    /// 1–100.
    #[schema(minimum = 1, maximum = 100)]
    pub deposit_confirmations: Option<i64>,
}

/// Why an admin's value for a setting is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SettingError {
    /// Below the setting's range.
    #[error("{field} must be at least {min}")]
    TooSmall {
        /// The setting.
        field: String,
        /// Its smallest value.
        min: i64,
    },
    /// Above the setting's range.
    #[error("{field} must be at most {max}")]
    TooLarge {
        /// The setting.
        field: String,
        /// Its largest value.
        max: i64,
    },
    /// No integer setting has this name.
    #[error("{field} is not a config field")]
    Unknown {
        /// The name given.
        field: String,
    },
}

impl ConfigPatch {
    /// The fee rate's range, in sat/vB.
    pub const FEE_RATE_SAT_VB: RangeInclusive<i64> = 1..=10_000;
    /// The round duration's range, in seconds (up to a week).
    pub const ROUND_DURATION_SECONDS: RangeInclusive<i64> = 1..=604_800;
    /// The minimum bet's range: never below dust.
    pub const MIN_BET_SATS: RangeInclusive<i64> = DUST_LIMIT_SATS..=MAX_MONEY_SATS;
    /// The minimum withdrawal's range: never below dust.
    pub const MIN_WITHDRAWAL_SATS: RangeInclusive<i64> = DUST_LIMIT_SATS..=MAX_MONEY_SATS;
    /// The deposit confirmations' range.
    pub const DEPOSIT_CONFIRMATIONS: RangeInclusive<i64> = 1..=100;

    /// The range of the integer setting `field`; `None` when no integer setting has that name.
    pub fn range_of(field: &str) -> Option<RangeInclusive<i64>> {
        match field {
            "fee_rate_sat_vb" => Some(Self::FEE_RATE_SAT_VB),
            "round_duration_seconds" => Some(Self::ROUND_DURATION_SECONDS),
            "min_bet_sats" => Some(Self::MIN_BET_SATS),
            "min_withdrawal_sats" => Some(Self::MIN_WITHDRAWAL_SATS),
            "deposit_confirmations" => Some(Self::DEPOSIT_CONFIRMATIONS),
            _ => None,
        }
    }

    /// Sets the integer setting `field` to `value`, within its range.
    ///
    /// # Errors
    /// [`SettingError`] naming the field and the rule.
    pub fn set_integer(&mut self, field: &str, value: i64) -> Result<(), SettingError> {
        let range = Self::range_of(field).ok_or_else(|| SettingError::Unknown {
            field: field.to_string(),
        })?;
        if value < *range.start() {
            return Err(SettingError::TooSmall {
                field: field.to_string(),
                min: *range.start(),
            });
        }
        if value > *range.end() {
            return Err(SettingError::TooLarge {
                field: field.to_string(),
                max: *range.end(),
            });
        }
        let slot = match field {
            "fee_rate_sat_vb" => &mut self.fee_rate_sat_vb,
            "round_duration_seconds" => &mut self.round_duration_seconds,
            "min_bet_sats" => &mut self.min_bet_sats,
            "min_withdrawal_sats" => &mut self.min_withdrawal_sats,
            _ => &mut self.deposit_confirmations,
        };
        *slot = Some(value);
        Ok(())
    }

    /// `base` with this patch applied.
    pub fn apply(&self, base: &ServiceConfig) -> ServiceConfig {
        let mut next = base.clone();
        if let Some(v) = &self.fee_address {
            next.fee_address = v.clone();
        }
        if let Some(v) = self.fee_rate_sat_vb {
            next.fee_rate_sat_vb = v;
        }
        if let Some(v) = self.round_duration_seconds {
            next.round_duration_seconds = v;
        }
        if let Some(v) = self.min_bet_sats {
            next.min_bet_sats = v;
        }
        if let Some(v) = self.min_withdrawal_sats {
            next.min_withdrawal_sats = v;
        }
        if let Some(v) = self.deposit_confirmations {
            next.deposit_confirmations = v;
        }
        next
    }
}

/// The value of a setting as a diff shows it: a JSON boolean, number or string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum SettingValue {
    /// `paused`.
    Bool(bool),
    /// Rates, durations, amounts, counts.
    Int(i64),
    /// The fee address.
    Text(String),
}

/// One changed setting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FieldChange {
    /// The value before the change.
    pub before: SettingValue,
    /// The value after it.
    pub after: SettingValue,
}

/// One `{before, after}` pair per changed field, keyed by the field's name.
pub type ConfigDiff = BTreeMap<String, FieldChange>;

/// The per-field difference between two configs, only for changed fields.
pub fn config_diff(before: &ServiceConfig, after: &ServiceConfig) -> ConfigDiff {
    let mut b = after.settable_fields();
    before
        .settable_fields()
        .into_iter()
        .filter_map(|(field, old)| {
            let new = b.remove(field)?;
            (old != new).then(|| {
                (
                    field.to_string(),
                    FieldChange {
                        before: old,
                        after: new,
                    },
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `PUT /admin/config` schema shows the bounds the rule applies.
    #[test]
    fn the_schema_shows_the_bounds_the_rule_applies() {
        let schema = serde_json::to_value(<ConfigPatch as utoipa::PartialSchema>::schema())
            .expect("a schema serialises");
        let fields = [
            "fee_rate_sat_vb",
            "round_duration_seconds",
            "min_bet_sats",
            "min_withdrawal_sats",
            "deposit_confirmations",
        ];
        for field in fields {
            let range = ConfigPatch::range_of(field).expect("an integer setting");
            let property = &schema["properties"][field];
            assert_eq!(
                property["minimum"].as_f64(),
                Some(*range.start() as f64),
                "{field}: {property}"
            );
            assert_eq!(
                property["maximum"].as_f64(),
                Some(*range.end() as f64),
                "{field}: {property}"
            );
        }
    }

    #[test]
    fn an_integer_setting_is_set_only_within_its_range() {
        let mut patch = ConfigPatch::default();
        assert_eq!(
            patch.set_integer("deposit_confirmations", 101),
            Err(SettingError::TooLarge {
                field: "deposit_confirmations".into(),
                max: 100
            })
        );
        assert_eq!(
            patch
                .set_integer("min_withdrawal_sats", DUST_LIMIT_SATS - 1)
                .map_err(|e| e.to_string()),
            Err("min_withdrawal_sats must be at least 294".to_string())
        );
        assert_eq!(patch, ConfigPatch::default());
        patch.set_integer("deposit_confirmations", 100).unwrap();
        assert_eq!(patch.deposit_confirmations, Some(100));
        assert!(matches!(
            patch.set_integer("fee_address", 1),
            Err(SettingError::Unknown { .. })
        ));
    }
}
