//! Fee bumping of the service's stuck withdrawals and payouts: each block, a version unconfirmed for the policy's blocks is replaced (BIP125) at the chain's estimate through `chain::bump::replacement_fee`, the one rule the node's claims use too; the admin can bump one by hand.
//!
//! Every replacement is a new transfer written before its broadcast
//! ([`crate::store::Store::write_bump`]); the block scan makes whichever version a block
//! holds the live one, so the ledger follows the chain once.

use bitcoin::{Amount, FeeRate, ScriptBuf, Transaction, Txid};
use chain::bump::{replacement_fee, Replacement};
use chain::ChainError;
use wallet::SpendableOutput;

use crate::domain::audit::AuditActor;
use crate::domain::bump::{replacement, BumpBuildError};
use crate::domain::money::{Coin, NewOutput};
use crate::domain::round::{OutputOrigin, TransferKind, TransferStatus};
use crate::domain::spend::{self, SpendFailure};
use crate::domain::transfer::Transfer;
use crate::service::engine::{crash_point, txid_of, Broadcast, Engine, EngineError};
use crate::store::bumps::BumpIntent;
use crate::store::ledger::TransferRow;

/// The confirmation target of a bump's estimate (blocks).
const BUMP_TARGET_BLOCKS: u16 = 2;

/// Why a transfer was not bumped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BumpError {
    /// No transfer has this id.
    #[error("transfer {0} does not exist")]
    NotFound(i64),
    /// The transfer is not a withdrawal or payout waiting, broadcast, for
    /// its first confirmation (confirmed, replaced, or not ours to bump).
    #[error("transfer {0} is not a broadcast withdrawal or payout waiting for a confirmation")]
    NotWaiting(i64),
    /// The cap, the share of the amount and the output paying the fee leave
    /// no replacement that relays at the asked rate.
    #[error("transfer {id}: the cap allows at most {budget_sats} sats of fee, no replacement above {old_fee_sats} sats")]
    OverCap {
        /// The transfer.
        id: i64,
        /// Its current fee.
        old_fee_sats: i64,
        /// The most its fee may be.
        budget_sats: i64,
    },
    /// The replacement could not be built.
    #[error("transfer {id}: the replacement cannot be built")]
    Build {
        /// The transfer.
        id: i64,
        /// Why.
        #[source]
        source: BumpBuildError,
    },
    /// A key could not be derived.
    #[error("transfer {id}: no key for its inputs")]
    Key {
        /// The transfer.
        id: i64,
        /// Why.
        #[source]
        source: SpendFailure,
    },
    /// Signing failed.
    #[error("transfer {id}: signing the replacement failed")]
    Sign {
        /// The transfer.
        id: i64,
        /// Why.
        #[source]
        source: wallet::SignError,
    },
    /// The store or the chain.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<crate::store::StoreError> for BumpError {
    fn from(e: crate::store::StoreError) -> Self {
        BumpError::Engine(e.into())
    }
}

impl From<crate::store::ledger::LedgerError> for BumpError {
    fn from(e: crate::store::ledger::LedgerError) -> Self {
        BumpError::Engine(e.into())
    }
}

/// A bump that was written.
#[derive(Debug, Clone)]
pub struct Bumped {
    /// The new version as stored after its broadcast attempt.
    pub transfer: Transfer,
    /// The version it replaced.
    pub replaced_txid: Txid,
    /// Whether the node took it (otherwise it stays written and is sent
    /// again each block, or was refused and the old version is live again).
    pub broadcast: bool,
}

impl Engine {
    /// One pass of the bumper: sends replacements written but not yet sent
    /// (a crash between the write and the broadcast), then replaces every
    /// version unconfirmed for the policy's blocks. Returns whether
    /// anything changed.
    ///
    /// # Errors
    /// Database failures; one transfer's failure is logged and the others go on.
    pub(crate) async fn bump_stuck(&self) -> Result<bool, EngineError> {
        let mut changed = false;
        for t in self.store().signed_bumps().await? {
            changed |= self.send_bump(&t).await?;
        }
        let policy = self.bump_policy();
        let Some((height, _)) = self.store().synced_tip().await? else {
            return Ok(changed);
        };
        self.store().stamp_waiting(height).await?;
        if policy.after_blocks == 0 {
            return Ok(changed);
        }
        let stuck: Vec<_> = self
            .store()
            .waiting_transfers()
            .await?
            .into_iter()
            .filter(|w| {
                w.sent_height
                    .is_some_and(|h| height - h >= i64::from(policy.after_blocks))
            })
            .collect();
        if stuck.is_empty() {
            return Ok(changed);
        }
        let target = match self.chain().estimate_fee(BUMP_TARGET_BLOCKS).await {
            Ok(rate) => rate,
            Err(e) => {
                tracing::warn!(error = %e, "no fee estimate; stuck transfers wait");
                return Ok(changed);
            }
        };
        for w in stuck {
            match self.bump(&w.transfer, target, AuditActor::Engine).await {
                Ok(b) => {
                    tracing::info!(transfer = w.transfer.id, new = b.transfer.id, txid = %b.transfer.txid,
                        fee_sats = b.transfer.fee_sats, broadcast = b.broadcast, "stuck transfer bumped");
                    changed = true;
                }
                Err(BumpError::OverCap { .. }) => {
                    tracing::debug!(transfer = w.transfer.id, "at its fee cap; not bumped again");
                }
                Err(e) => {
                    tracing::warn!(transfer = w.transfer.id, error = %crate::service::error_chain(&e), "bump failed")
                }
            }
        }
        Ok(changed)
    }

    /// The admin's bump of transfer `id` to `rate` (at least; BIP125 may
    /// ask more), held to the same cap as the automatic bumps.
    ///
    /// # Errors
    /// [`BumpError`].
    pub async fn bump_by_hand(&self, id: i64, rate: FeeRate) -> Result<Bumped, BumpError> {
        let _turn = self.turn().await;
        let t = self
            .store()
            .transfer(id)
            .await?
            .ok_or(BumpError::NotFound(id))?;
        self.bump(&t, rate, AuditActor::Admin).await
    }

    /// Writes and sends the replacement of `t` at `target`.
    async fn bump(
        &self,
        t: &TransferRow,
        target: FeeRate,
        actor: AuditActor,
    ) -> Result<Bumped, BumpError> {
        let waiting = matches!(t.kind, TransferKind::Withdrawal | TransferKind::Payout)
            && t.status == TransferStatus::Broadcast
            && t.block_height.is_none();
        let raw = t.raw_tx.as_deref().filter(|_| waiting);
        let old = txid_of(raw.ok_or(BumpError::NotWaiting(t.id))?)?;
        let (tx, outputs, fee, amount) = self.replacement_of(t, &old, target).await?;
        let height = self.store().synced_tip().await?.map_or(0, |h| h.0);
        let intent = BumpIntent {
            replaces: t.id,
            txid: tx.compute_txid(),
            raw_tx: bitcoin::consensus::encode::serialize_hex(&tx),
            fee_sats: sats(fee),
            amount_sats: amount,
            outputs,
            sent_height: height,
            actor,
            fee_rate_sat_vb: i64::try_from(target.to_sat_per_vb_ceil()).unwrap_or(i64::MAX),
        };
        let new_id = self
            .store()
            .write_bump(&intent)
            .await?
            .ok_or(BumpError::NotWaiting(t.id))?;
        crash_point("bump_signed");
        let written = self
            .store()
            .transfer(new_id)
            .await?
            .ok_or(BumpError::NotFound(new_id))?;
        let broadcast = self.send_bump(&written).await?;
        let transfer = self
            .store()
            .transfer(new_id)
            .await?
            .ok_or(BumpError::NotFound(new_id))?;
        Ok(Bumped {
            broadcast: broadcast && transfer.status == TransferStatus::Broadcast,
            transfer: transfer.decode()?,
            replaced_txid: t.txid()?,
        })
    }

    /// The signed replacement of `t` (transaction `old`) at `target`, its
    /// outputs as the ledger records them, its fee and the transfer's amount.
    async fn replacement_of(
        &self,
        t: &TransferRow,
        old: &Transaction,
        target: FeeRate,
    ) -> Result<(Transaction, Vec<NewOutput>, Amount, i64), BumpError> {
        let ours = self.store().outputs_created_by(&t.txid()?).await?;
        let origin = match t.kind {
            TransferKind::Payout => OutputOrigin::Payout,
            _ => OutputOrigin::Change,
        };
        // A withdrawal without change has nothing to pay more with.
        let absorbing = ours
            .iter()
            .find(|o| o.origin == origin)
            .ok_or(BumpError::OverCap {
                id: t.id,
                old_fee_sats: t.fee_sats,
                budget_sats: t.fee_sats,
            })?;
        let vout = u32::try_from(absorbing.vout).map_err(|_| BumpError::NotWaiting(t.id))?;
        let script = old
            .output
            .get(vout as usize)
            .map(|o| o.script_pubkey.clone())
            .ok_or(BumpError::NotWaiting(t.id))?;
        let old_fee = Amount::from_sat(u64::try_from(t.fee_sats).unwrap_or(0));
        let absorbing_value = Amount::from_sat(u64::try_from(absorbing.amount_sats).unwrap_or(0));
        let moved = u64::try_from(t.amount_sats + t.commission_sats).unwrap_or(0);
        let dust = wallet::dust_threshold(&script);
        // Priced for the signatures the replacement will carry: the old
        // version's may be a byte shorter.
        let vsize = wallet::signed_vsize(old);
        let budget = self.bump_policy().budget(
            vsize,
            Amount::from_sat(moved),
            old_fee,
            absorbing_value,
            dust,
        );
        let target = self.package_target(t, vsize, target).await?;
        let fee = replacement_fee(&Replacement {
            old_fee,
            vsize,
            target,
            incremental: FeeRate::from_sat_per_vb_u32(1),
            budget,
        })
        .ok_or(BumpError::OverCap {
            id: t.id,
            old_fee_sats: t.fee_sats,
            budget_sats: sats(budget),
        })?;
        let mut tx = replacement(old, vout, old_fee, fee, dust)
            .map_err(|source| BumpError::Build { id: t.id, source })?;
        let spent = self.spent_by(t, &tx).await?;
        self.wallet()
            .sign(&mut tx, &spent)
            .map_err(|source| BumpError::Sign { id: t.id, source })?;
        let extra = sats(fee) - t.fee_sats;
        let outputs = ours
            .iter()
            .map(|o| NewOutput {
                vout: o.vout,
                amount_sats: if o.vout == absorbing.vout {
                    o.amount_sats - extra
                } else {
                    o.amount_sats
                },
                user_id: o.user_id,
                round_id: o.round_id,
                origin: o.origin,
            })
            .collect();
        // A payout's winner gets less by the extra fee; a withdrawal pays
        // its amount whatever the fee (the change gives it).
        let amount = match t.kind {
            TransferKind::Payout => t.amount_sats - extra,
            _ => t.amount_sats,
        };
        Ok((tx, outputs, fee, amount))
    }

    /// The rate `t` (of `vsize`) must pay for itself and its unconfirmed
    /// parents of ours to reach `target` as a package: a payout spending pot
    /// outputs of bets still waiting is their child, and a miner takes the
    /// parents with it only at the package's rate (CPFP). `target` when no
    /// parent waits.
    async fn package_target(
        &self,
        t: &TransferRow,
        vsize: u64,
        target: FeeRate,
    ) -> Result<FeeRate, BumpError> {
        let mut parents = std::collections::BTreeSet::new();
        for c in self.store().outputs_spent_by(&t.txid()?).await? {
            if c.block_height.is_none() {
                parents.insert(c.txid);
            }
        }
        let (mut parent_vsize, mut parent_fee) = (0u64, 0u64);
        for txid in &parents {
            let Some(p) = self.store().transfer_by_txid(txid).await? else {
                continue;
            };
            let Some(raw) = p.raw_tx.as_deref() else {
                continue;
            };
            parent_vsize += txid_of(raw)?.vsize() as u64;
            parent_fee += u64::try_from(p.fee_sats).unwrap_or(0);
        }
        if parent_vsize == 0 {
            return Ok(target);
        }
        let package = target
            .fee_vb(vsize + parent_vsize)
            .unwrap_or(Amount::MAX_MONEY)
            .to_sat()
            .saturating_sub(parent_fee);
        // Rounded up per kWU, so the child's fee at this rate covers the package.
        let per_kwu = package.saturating_mul(250).div_ceil(vsize.max(1));
        Ok(FeeRate::from_sat_per_kwu(per_kwu).max(target))
    }

    /// What each input of `tx` (a replacement of `t`) spends, in input order.
    async fn spent_by(
        &self,
        t: &TransferRow,
        tx: &Transaction,
    ) -> Result<Vec<SpendableOutput>, BumpError> {
        let key = |e| BumpError::Key {
            id: t.id,
            source: e,
        };
        let (path, script): (wallet::KeyPath, ScriptBuf) = match (t.kind, t.round_id, t.user_id) {
            (TransferKind::Payout, Some(round), _) => {
                spend::pot_key(self.wallet(), round).map_err(key)?
            }
            (TransferKind::Withdrawal, _, Some(user)) => {
                let u = self
                    .store()
                    .user_by_id(user)
                    .await?
                    .ok_or(BumpError::NotWaiting(t.id))?;
                spend::user_key(self.wallet(), u.derivation_index).map_err(key)?
            }
            _ => return Err(BumpError::NotWaiting(t.id)),
        };
        let coins: Vec<Coin> = self.store().outputs_spent_by(&t.txid()?).await?;
        tx.input
            .iter()
            .map(|i| {
                let c = coins
                    .iter()
                    .find(|c| {
                        c.txid == i.previous_output.txid
                            && c.vout == i64::from(i.previous_output.vout)
                    })
                    .ok_or(BumpError::NotWaiting(t.id))?;
                Ok(SpendableOutput {
                    outpoint: i.previous_output,
                    txout: bitcoin::TxOut {
                        value: Amount::from_sat(u64::try_from(c.amount_sats).unwrap_or(0)),
                        script_pubkey: script.clone(),
                    },
                    path,
                })
            })
            .collect()
    }

    /// Sends written replacement `t`. Accepted: marked broadcast. Refused,
    /// or not enough to replace its older version under BIP125: the older
    /// version is live again. Otherwise it stays written and is sent again
    /// on the next pass. Returns whether anything changed.
    async fn send_bump(&self, t: &TransferRow) -> Result<bool, EngineError> {
        let raw = t
            .raw_tx
            .as_deref()
            .ok_or_else(|| EngineError::Corrupt(format!("transfer {} has no tx", t.id)))?;
        match Broadcast::send(self.chain().as_ref(), txid_of(raw)?).await {
            Broadcast::Accepted => {
                crash_point("bump_broadcast");
                self.store().mark_broadcast(t.id).await?;
                Ok(true)
            }
            Broadcast::Refused { code, reason } => {
                tracing::warn!(transfer = t.id, code, %reason, "bump refused; the older version stays");
                Ok(self.store().refuse_bump(t.id).await?)
            }
            Broadcast::Pending(e) if e.is_conflict() => {
                tracing::warn!(transfer = t.id, error = %e, "bump not taken as a replacement; the older version stays");
                Ok(self.store().refuse_bump(t.id).await?)
            }
            Broadcast::Pending(ChainError::Unavailable(e)) => {
                tracing::info!(transfer = t.id, error = %e, "chain unavailable; the bump is sent again later");
                Ok(false)
            }
            Broadcast::Pending(e) => {
                tracing::info!(transfer = t.id, error = %e, "bump not settled; sent again later");
                Ok(false)
            }
        }
    }
}

fn sats(a: Amount) -> i64 {
    i64::try_from(a.to_sat()).unwrap_or(i64::MAX)
}
