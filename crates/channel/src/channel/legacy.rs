//! Snapshots written before the channel restructure (snapshot version 0: one flat
//! struct with a data-less `state` beside loose `Option`s, and every HTLC ever seen
//! kept in `every_htlc` for penalties), read and migrated to the current layout.
//!
//! The layout below is the serde layout of `Channel` at commit a16e22a, field for field;
//! it is only ever read, never written.

use bitcoin::{Amount, OutPoint, ScriptBuf, Transaction};
use secp256k1::{ecdsa::Signature, PublicKey};
use wire::{Locktime, Preimage, Sha256};

use super::{
    Accepted, AnchorInfo, AnchorRole, Change, Channel, ChannelConfig, ChannelSecrets, Established,
    Proposal, Resolution, RevokedCommitment, Signed, Stage, State, Step, Terms, Unsigned,
};
use crate::funding::{CState, Htlc, Who};
use crate::script::csv_value;
use crate::shachain::RevocationSecrets;
use crate::tx::Commitment;

/// Why an old snapshot cannot be migrated (it names what is missing: the snapshot is
/// kept as it is, never dropped).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("snapshot version 0 in state {state:?} lacks {missing}")]
pub struct MigrationError {
    /// The old state.
    pub state: State,
    /// The field the state needs and the snapshot does not hold.
    pub missing: &'static str,
}

/// `ChannelConfig` as it was: the limits added since take their defaults.
#[derive(serde::Deserialize)]
struct ConfigV0 {
    delay: Locktime,
    max_delay_blocks: u32,
    min_depth: u32,
    max_their_min_depth: u32,
    commitment_fee_sat: u64,
    min_commitment_fee_sat: u64,
    // Read and dropped: the close fee is now the fair fee at the current rate.
    #[serde(rename = "close_fee_sat")]
    _close_fee_sat: u64,
    max_htlc_expiry_blocks: u32,
    sweep_feerate_sat_per_kw: u64,
}

#[derive(serde::Deserialize)]
struct TheirParamsV0 {
    commit_key: PublicKey,
    final_key: PublicKey,
    delay_csv: u32,
    fee_sat: u64,
}

#[derive(serde::Deserialize)]
struct AnchorInfoV0 {
    outpoint: OutPoint,
    amount: Amount,
    script: ScriptBuf,
}

#[derive(serde::Deserialize)]
struct PendingV0 {
    change: Change,
    #[allow(dead_code)]
    by: Who,
    next: CState,
    their_next_rev: Option<Sha256>,
}

#[derive(serde::Deserialize)]
struct OnChainV0 {
    owner: Who,
    commitment: Commitment,
}

/// The whole channel as snapshot version 0 wrote it (deserialize it, then
/// [`ChannelV0::migrate`]).
#[derive(serde::Deserialize)]
pub struct ChannelV0 {
    config: ConfigV0,
    secrets: ChannelSecrets,
    our_commit: PublicKey,
    our_final: PublicKey,
    role: AnchorRole,
    state: State,
    their: Option<TheirParamsV0>,
    anchor: Option<AnchorInfoV0>,
    anchor_tx: Option<Transaction>,
    fee_sat: u64,
    num: u64,
    cstate: Option<CState>,
    their_rev: Sha256,
    their_sig: Option<Signature>,
    their_secrets: RevocationSecrets,
    their_prev: Option<(CState, Sha256)>,
    pending: Option<PendingV0>,
    deferred: Option<Change>,
    high_priority: bool,
    sent_complete: bool,
    got_complete: bool,
    every_htlc: Vec<Htlc>,
    #[serde(with = "crate::stored_hex::preimages")]
    known_r: Vec<Preimage>,
    onchain: Option<OnChainV0>,
    closing_fee_sat: u64,
    height: u32,
}

/// A migrated channel and the history the old snapshot kept inside it.
#[derive(Debug)]
pub struct Migrated {
    /// The channel in the current layout.
    pub channel: Channel,
    /// Every HTLC the old channel ever saw, for penalties on any of the peer's revoked
    /// commitments (the old layout did not say which commitment held which HTLC; a
    /// penalty tries them all, as the old code did). The owner archives it under
    /// [`Migrated::LEGACY_HISTORY`].
    pub history: RevokedCommitment,
}

impl Migrated {
    /// The commitment number under which the owner archives `history`: a penalty on a
    /// revoked commitment without a record of its own uses it.
    pub const LEGACY_HISTORY: u64 = u64::MAX;
}

impl ConfigV0 {
    /// The current configuration: the limits added since take their defaults.
    fn current(&self) -> ChannelConfig {
        ChannelConfig {
            delay: self.delay,
            max_delay_blocks: self.max_delay_blocks,
            min_depth: self.min_depth,
            max_their_min_depth: self.max_their_min_depth,
            commitment_fee_sat: self.commitment_fee_sat,
            min_commitment_fee_sat: self.min_commitment_fee_sat,
            max_htlc_expiry_blocks: self.max_htlc_expiry_blocks,
            sweep_feerate_sat_per_kw: self.sweep_feerate_sat_per_kw,
            ..ChannelConfig::default()
        }
    }
}

impl ChannelV0 {
    /// The same channel in the current layout.
    ///
    /// # Errors
    /// A state whose data the snapshot does not hold (a snapshot the old code could not
    /// have written).
    pub fn migrate(mut self) -> Result<Migrated, MigrationError> {
        let state = self.state;
        let missing = |missing| MigrationError { state, missing };
        let config = self.config.current();
        let terms = self.terms(&config)?;
        let anchor = self.anchor.take().map(|a| AnchorInfo {
            outpoint: a.outpoint,
            amount: a.amount,
            script: a.script,
        });
        let stage = match state {
            State::Init => Stage::Init,
            State::OpenWaitOpen => Stage::OpenWaitOpen,
            State::OpenWaitAnchorTx => Stage::OpenWaitAnchorTx {
                terms: terms.ok_or_else(|| missing("their"))?,
                their_rev: self.their_rev,
            },
            State::OpenWaitAnchor => Stage::OpenWaitAnchor {
                terms: terms.ok_or_else(|| missing("their"))?,
                their_rev: self.their_rev,
            },
            State::OpenWaitCommitSig => Stage::OpenWaitCommitSig(Box::new(Unsigned {
                terms: terms.ok_or_else(|| missing("their"))?,
                anchor: anchor.ok_or_else(|| missing("anchor"))?,
                anchor_tx: self.anchor_tx.take().ok_or_else(|| missing("anchor_tx"))?,
                cstate: self.cstate.take().ok_or_else(|| missing("cstate"))?,
                their_rev: self.their_rev,
            })),
            _ => {
                let step = self.take_step()?;
                Stage::Established(Box::new(Established {
                    terms: terms.ok_or_else(|| missing("their"))?,
                    anchor: anchor.ok_or_else(|| missing("anchor"))?,
                    anchor_tx: self.anchor_tx.take(),
                    num: self.num,
                    cstate: self.cstate.take().ok_or_else(|| missing("cstate"))?,
                    their_rev: self.their_rev,
                    their_sig: self.their_sig.ok_or_else(|| missing("their_sig"))?,
                    their_secrets: std::mem::take(&mut self.their_secrets),
                    high_priority: self.high_priority,
                    known_r: std::mem::take(&mut self.known_r),
                    unclaimable: Vec::new(),
                    signed_close: None,
                    onions: Vec::new(),
                    step,
                }))
            }
        };
        Ok(Migrated {
            channel: Channel {
                config,
                secrets: self.secrets,
                our_commit: self.our_commit,
                our_final: self.our_final,
                role: self.role,
                height: self.height,
                stage,
                preimages: Default::default(),
            },
            history: RevokedCommitment {
                commitment_number: Migrated::LEGACY_HISTORY,
                htlcs: self.every_htlc,
            },
        })
    }

    /// The agreed terms, once their `open_channel` was seen.
    fn terms(&self, config: &ChannelConfig) -> Result<Option<Terms>, MigrationError> {
        let Some(t) = &self.their else {
            return Ok(None);
        };
        let our_delay_csv = csv_value(config.delay).map_err(|_| MigrationError {
            state: self.state,
            missing: "a valid delay",
        })?;
        Ok(Some(Terms {
            their_commit: t.commit_key,
            their_final: t.final_key,
            their_delay_csv: t.delay_csv,
            our_delay_csv,
            // The old code kept the agreed fee apart once the anchor was known.
            fee_sat: if self.fee_sat > 0 {
                self.fee_sat
            } else {
                t.fee_sat.min(config.commitment_fee_sat)
            },
        }))
    }

    /// The step of an established channel, its data taken out of the flat snapshot.
    fn take_step(&mut self) -> Result<Step, MigrationError> {
        let state = self.state;
        let missing = |missing| MigrationError { state, missing };
        Ok(match state {
            State::OpenWaitComplete => Step::OpenWaitComplete {
                sent: self.sent_complete,
                got: self.got_complete,
            },
            State::Normal => Step::Normal,
            State::WaitAccept => {
                let p = self.pending.take().ok_or_else(|| missing("pending"))?;
                Step::WaitAccept(Proposal {
                    change: p.change,
                    next: p.next,
                })
            }
            State::WaitSignature => {
                let p = self.pending.take().ok_or_else(|| missing("pending"))?;
                Step::WaitSignature(Accepted {
                    change: p.change,
                    next: p.next,
                    their_next_rev: p
                        .their_next_rev
                        .ok_or_else(|| missing("pending.their_next_rev"))?,
                    deferred: self.deferred,
                })
            }
            State::WaitComplete => {
                let p = self.pending.take().ok_or_else(|| missing("pending"))?;
                let (their_prev, their_prev_rev) = self
                    .their_prev
                    .take()
                    .ok_or_else(|| missing("their_prev"))?;
                Step::WaitComplete(Signed {
                    change: p.change,
                    their_prev,
                    their_prev_rev,
                })
            }
            State::CloseWaitComplete => Step::CloseWaitComplete {
                fee_sat: self.closing_fee_sat,
            },
            State::CloseWaitAck => Step::CloseWaitAck,
            State::Closed => Step::Closed,
            State::OnChain => Step::OnChain(match self.onchain.take() {
                Some(o) => Resolution::Commitment {
                    owner: o.owner,
                    commitment: o.commitment,
                },
                // The old code kept nothing after a penalty: which revoked
                // commitment it punished is not known (0 stands for unknown).
                None => Resolution::Penalty {
                    commitment_number: 0,
                },
            }),
            _ => return Err(missing("a known state")),
        })
    }
}
