//! The transactions of an established channel, ours and theirs: commitments, the
//! cooperative close, and the signatures on them.

use bitcoin::Transaction;
use secp256k1::ecdsa::Signature;
use wire::{Preimage, Sha256};

use crate::funding::{CState, FundingError};
use crate::tx::{
    close_tx, commitment_tx, finalize_anchor_spend, sign_anchor_spend, verify_anchor_spend,
    Commitment, CommitmentKeys, TxError,
};

use super::errors::ChannelError;
use super::{AnchorInfo, Ctx, Established, Terms};

impl Established {
    pub(super) fn our_commitment(
        &self,
        ctx: &Ctx,
        cs: &CState,
        n: u64,
    ) -> Result<Commitment, TxError> {
        commitment_tx(
            self.anchor.outpoint,
            cs,
            &CommitmentKeys {
                owner_final: ctx.our_final,
                other_final: self.terms.their_final,
                delay_csv: self.terms.their_delay_csv,
                revocation_hash: ctx.our_rev_hash(n),
            },
            n,
        )
    }

    pub(super) fn their_commitment(
        &self,
        ctx: &Ctx,
        cs: &CState,
        n: u64,
        rev: &Sha256,
    ) -> Result<Commitment, TxError> {
        their_commitment(ctx, &self.terms, &self.anchor, cs, n, rev)
    }

    pub(super) fn sign(&self, ctx: &Ctx, tx: &Transaction) -> Signature {
        sign_anchor_spend(
            tx,
            &self.anchor.script,
            self.anchor.amount,
            &ctx.secrets.commit_key,
        )
    }

    pub(super) fn check_sig(
        &self,
        tx: &Transaction,
        sig: &Signature,
        what: &'static str,
    ) -> Result<(), ChannelError> {
        check_sig(&self.terms, &self.anchor, tx, sig, what)
    }

    /// Our current commitment with both signatures.
    pub(super) fn signed_commitment(&self, ctx: &Ctx) -> Result<Transaction, TxError> {
        let mut c = self.our_commitment(ctx, &self.cstate, self.num)?;
        let ours = self.sign(ctx, &c.tx);
        finalize_anchor_spend(
            &mut c.tx,
            &ctx.our_commit,
            &ours,
            &self.terms.their_commit,
            &self.their_sig,
        );
        Ok(c.tx)
    }

    pub(super) fn close_transaction(
        &self,
        ctx: &Ctx,
        fee_sat: u64,
    ) -> Result<Transaction, FundingError> {
        let (ours, theirs) = self.cstate.close_amounts(fee_sat)?;
        Ok(close_tx(
            self.anchor.outpoint,
            &ctx.our_final,
            ours,
            &self.terms.their_final,
            theirs,
        ))
    }

    /// Whether `r_hash` equals a revocation hash that a commitment holding it could carry:
    /// our current and next, their current (their next is checked when it arrives).
    pub(super) fn collides_with_revocation(&self, ctx: &Ctx, r_hash: &Sha256) -> bool {
        *r_hash == self.their_rev
            || *r_hash == ctx.our_rev_hash(self.num)
            || *r_hash == ctx.our_rev_hash(self.num + 1)
    }

    pub(super) fn remember_r(&mut self, r: Preimage) {
        if !self.known_r.contains(&r) {
            self.known_r.push(r);
        }
    }

    /// Forgets the Rs of HTLCs no longer in the current commitments (the only ones that
    /// can still reach the chain once the previous ones are revoked).
    pub(super) fn prune_known_r(&mut self) {
        let cs = &self.cstate;
        self.known_r.retain(|r| cs.find_htlc(&r.hash()).is_some());
    }
}

pub(super) fn their_commitment(
    ctx: &Ctx,
    terms: &Terms,
    anchor: &AnchorInfo,
    cs: &CState,
    n: u64,
    rev: &Sha256,
) -> Result<Commitment, TxError> {
    commitment_tx(
        anchor.outpoint,
        &cs.mirror(),
        &CommitmentKeys {
            owner_final: terms.their_final,
            other_final: ctx.our_final,
            delay_csv: terms.our_delay_csv,
            revocation_hash: *rev,
        },
        n,
    )
}

fn check_sig(
    terms: &Terms,
    anchor: &AnchorInfo,
    tx: &Transaction,
    sig: &Signature,
    what: &'static str,
) -> Result<(), ChannelError> {
    if verify_anchor_spend(tx, &anchor.script, anchor.amount, sig, &terms.their_commit) {
        Ok(())
    } else {
        Err(ChannelError::BadSignature(what))
    }
}
