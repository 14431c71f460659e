//! Forwards whose channels went on chain (issue 30, "On chain"; docs/node.md, "Forwarding
//! on chain"). Downstream, the next hop may claim our offered HTLC with R in a witness, or
//! let it time out: R read from any confirmed witness fulfils the forward; only a
//! confirmed spend of the HTLC's output without R (our refund), or a commitment on chain
//! that holds no output for it, fails it. Upstream, a forward's R is kept in the incoming
//! channel (so its deadline closes and claims on chain if the peer never takes the
//! fulfil) and claimed at once on a channel already on chain.
//!
//! The rules are the pure [`revealed`] and [`end`], tested below; the manager's side
//! applies them to each scanned block ([`Manager::forwards_in_block`]), after a restart
//! ([`Manager::reconcile_onchain_forwards`]) and in the upstream settlement pass
//! ([`Manager::keep_upstream_r`]).

use std::collections::HashSet;

use bitcoin::hashes::Hash as _;
use bitcoin::{Block, OutPoint, Transaction};
use channel::State;
use wire::{Preimage, Sha256};

use super::exec::ExecError;
use super::registry::{Slot, SlotInner};
use super::{unix_now, Manager};
use crate::store::{ForwardRow, ForwardState};

/// Every R that `tx` reveals for one of `wanted`: a witness element of 32 bytes whose
/// SHA-256 is wanted. Where it was found does not matter: R known is R to claim with.
pub(crate) fn revealed(tx: &Transaction, wanted: &HashSet<Sha256>) -> Vec<Preimage> {
    let mut found = Vec::new();
    for input in &tx.input {
        for element in input.witness.iter() {
            let Ok(bytes) = <[u8; 32]>::try_from(element) else {
                continue;
            };
            let r = Preimage(bytes);
            if wanted.contains(&r.hash()) && !found.contains(&r) {
                found.push(r);
            }
        }
    }
    found
}

/// What the chain shows of a forward's downstream HTLC once a commitment of its channel is
/// on chain (confirmed blocks only: what is in the mempool can still be replaced).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnChain {
    /// The commitment holds no output for it: nobody can ever claim it, with R or not.
    NoOutput,
    /// Its output is unspent: the next hop may still claim it with R.
    Unspent,
    /// A transaction spent its output with R in the witness.
    SpentWithR(Preimage),
    /// A transaction spent its output without R: our refund after the expiry.
    SpentWithoutR,
}

/// The forward's end, once it may be decided: failed only when the next hop can no longer
/// take the HTLC with R (failing earlier would let it take the money downstream after we
/// gave it back upstream).
pub(crate) fn end(seen: OnChain) -> Option<ForwardState> {
    match seen {
        OnChain::NoOutput | OnChain::SpentWithoutR => Some(ForwardState::Failed),
        OnChain::SpentWithR(r) => Some(ForwardState::Fulfilled(r)),
        OnChain::Unspent => None,
    }
}

/// What `block` shows of the output `outpoint` of an HTLC with `r_hash`.
pub(crate) fn seen_in(block: &Block, outpoint: OutPoint, r_hash: Sha256) -> OnChain {
    let spend = block
        .txdata
        .iter()
        .flat_map(|tx| &tx.input)
        .find(|i| i.previous_output == outpoint);
    let Some(input) = spend else {
        return OnChain::Unspent;
    };
    let r = input
        .witness
        .iter()
        .filter_map(|e| <[u8; 32]>::try_from(e).ok().map(Preimage))
        .find(|r| r.hash() == r_hash);
    r.map_or(OnChain::SpentWithoutR, OnChain::SpentWithR)
}

/// Whether the channel still holds the HTLC the peer offered us for `r` (a forward settled
/// long ago has nothing left to keep).
fn holds(inner: &SlotInner, r: &Preimage) -> bool {
    let r_hash = r.hash();
    inner
        .channel
        .balances()
        .is_some_and(|cs| cs.theirs.htlcs.iter().any(|h| h.r_hash == r_hash))
}

impl Manager {
    /// A scanned block: Rs revealed in it fulfil the forwards still offered with their
    /// hash; HTLC outputs of downstream commitments on chain spent without R, or missing
    /// from them, fail theirs. Each end is stored before the upstream channel acts on it.
    pub(crate) async fn forwards_in_block(&self, block: &Block) -> Result<(), ExecError> {
        let offered = self.forwards_matching(|f| f.state == ForwardState::Offered);
        if offered.is_empty() {
            return Ok(());
        }
        let wanted: HashSet<Sha256> = offered.iter().map(|f| f.r_hash).collect();
        for tx in &block.txdata {
            for r in revealed(tx, &wanted) {
                for f in offered.iter().filter(|f| f.r_hash == r.hash()) {
                    tracing::info!(channel = %f.out_channel, upstream = %f.in_channel, "R of a forward read on chain");
                    self.forward_ended(f.out_channel, f.r_hash, ForwardState::Fulfilled(r))
                        .await?;
                }
            }
        }
        self.end_onchain_forwards(Some(block)).await
    }

    /// Forwards still offered whose outgoing channel has a commitment on chain: ended as
    /// [`end`] says, from `block` (none: only a commitment without the HTLC decides).
    async fn end_onchain_forwards(&self, block: Option<&Block>) -> Result<(), ExecError> {
        for f in self.forwards_matching(|f| f.state == ForwardState::Offered) {
            let Some(slot) = self.channels.by_id(f.out_channel) else {
                continue;
            };
            let outputs = slot.lock().await.channel.offered_htlc_outputs_on_chain();
            let Some(outputs) = outputs else {
                continue;
            };
            let seen = match outputs.iter().find(|(_, h)| h.r_hash == f.r_hash) {
                None => OnChain::NoOutput,
                Some((op, _)) => block.map_or(OnChain::Unspent, |b| seen_in(b, *op, f.r_hash)),
            };
            if let Some(state) = end(seen) {
                tracing::info!(channel = %f.out_channel, upstream = %f.in_channel, ?seen, "forward's HTLC resolved on chain downstream");
                self.forward_ended(f.out_channel, f.r_hash, state).await?;
            }
        }
        Ok(())
    }

    /// After the channels are loaded: forwards whose downstream commitment on chain holds
    /// no output for them fail, and every incoming channel with a fulfilled forward is
    /// queued to keep (or claim) its R, as before the restart.
    pub(super) async fn reconcile_onchain_forwards(&self) -> Result<(), ExecError> {
        self.end_onchain_forwards(None).await?;
        for f in self.forwards_matching(|f| matches!(f.state, ForwardState::Fulfilled(_))) {
            self.settle_later(f.in_channel);
        }
        Ok(())
    }

    /// Keeps the R of every forward of channel `slot`'s incoming HTLCs that was fulfilled
    /// downstream: remembered (and persisted) so that the channel's deadline closes it and
    /// claims the HTLC on chain before its expiry should the peer never take the fulfil;
    /// claimed at once if the channel is on chain already. False while an update is in
    /// flight (try again later).
    pub(super) async fn keep_upstream_r(
        &self,
        slot: &Slot,
        inner: &mut SlotInner,
    ) -> Result<bool, ExecError> {
        let id = slot.id;
        let rs: Vec<Preimage> = self
            .forwards_matching(|f| f.in_channel == id)
            .into_iter()
            .filter_map(|f: ForwardRow| match f.state {
                ForwardState::Fulfilled(r) => Some(r),
                _ => None,
            })
            .filter(|r| !inner.channel.known_preimages().contains(r) && holds(inner, r))
            .collect();
        for r in rs {
            let state = inner.channel.state();
            if state.is_updating() {
                return Ok(false);
            }
            if state == State::OnChain {
                self.claim_upstream(slot, inner, r).await?;
            } else if inner.channel.remember_preimage(r) {
                tracing::info!(peer = %slot.peer, channel = %id, "R of a forward kept for the incoming HTLC");
                self.persist(slot, inner, &[]).await?;
            }
        }
        Ok(true)
    }

    /// The incoming channel is on chain: its HTLC of a fulfilled forward is claimed with R
    /// (R on disk before the claim leaves).
    async fn claim_upstream(
        &self,
        slot: &Slot,
        inner: &mut SlotInner,
        r: Preimage,
    ) -> Result<(), ExecError> {
        match inner.channel.fulfill_htlc(r, unix_now()) {
            Ok(actions) => {
                tracing::info!(peer = %slot.peer, channel = %slot.id, "claiming a forward's incoming HTLC on chain with R");
                self.persist(slot, inner, &[]).await?;
                self.run_actions(slot, inner, actions).await
            }
            Err(e) => {
                let r_hash = hex::encode(r.hash().as_byte_array());
                tracing::warn!(peer = %slot.peer, channel = %slot.id, %r_hash, error = %e, "no incoming HTLC output to claim with a forward's R");
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bitcoin::hashes::Hash as _;
    use bitcoin::{
        absolute::LockTime, block, transaction::Version, Amount, ScriptBuf, Sequence, TxIn, TxOut,
        Txid, Witness,
    };

    use super::*;

    fn spend(of: OutPoint, witness: &[&[u8]]) -> Transaction {
        Transaction {
            version: Version::TWO,
            lock_time: LockTime::ZERO,
            input: vec![TxIn {
                previous_output: of,
                script_sig: ScriptBuf::new(),
                sequence: Sequence::MAX,
                witness: Witness::from_slice(witness),
            }],
            output: vec![TxOut {
                value: Amount::from_sat(1_000),
                script_pubkey: ScriptBuf::new(),
            }],
        }
    }

    fn block(txdata: Vec<Transaction>) -> Block {
        Block {
            header: block::Header {
                version: block::Version::TWO,
                prev_blockhash: bitcoin::BlockHash::all_zeros(),
                merkle_root: bitcoin::TxMerkleNode::all_zeros(),
                time: 0,
                bits: bitcoin::CompactTarget::from_consensus(0),
                nonce: 0,
            },
            txdata,
        }
    }

    fn op(byte: u8, vout: u32) -> OutPoint {
        OutPoint {
            txid: Txid::from_byte_array([byte; 32]),
            vout,
        }
    }

    const R: Preimage = Preimage([7; 32]);

    /// (case, a claim's witness, the Rs it reveals).
    type Row<'a> = (&'a str, Vec<&'a [u8]>, Vec<Preimage>);

    #[test]
    fn r_is_read_from_any_witness_element_whose_hash_is_wanted() {
        let wanted: HashSet<Sha256> = [R.hash()].into();
        let (sig, script, r, other): (&[u8], &[u8], &[u8], &[u8]) =
            (&[0x30; 71], &[0x51; 80], &R.0, &[8; 32]);
        let table: &[Row] = &[
            ("claim with R", vec![sig, r, script], vec![R]),
            ("R last", vec![sig, script, r], vec![R]),
            ("refund: empty secret", vec![sig, &[], script], vec![]),
            ("another 32 bytes", vec![sig, other, script], vec![]),
            ("R truncated", vec![sig, &r[..31], script], vec![]),
            ("R twice: once", vec![r, r], vec![R]),
        ];
        for (case, witness, want) in table {
            let tx = spend(op(1, 0), witness);
            assert_eq!(&revealed(&tx, &wanted), want, "{case}");
        }
        let tx = spend(op(1, 0), &[&R.0]);
        assert!(revealed(&tx, &HashSet::new()).is_empty(), "nothing wanted");
    }

    #[test]
    fn a_forward_fails_only_once_the_next_hop_can_no_longer_claim_with_r() {
        let table = [
            (OnChain::NoOutput, Some(ForwardState::Failed)),
            (OnChain::Unspent, None),
            (OnChain::SpentWithR(R), Some(ForwardState::Fulfilled(R))),
            (OnChain::SpentWithoutR, Some(ForwardState::Failed)),
        ];
        for (seen, want) in table {
            assert_eq!(end(seen), want, "{seen:?}");
        }
    }

    #[test]
    fn a_block_shows_how_an_htlc_output_was_spent() {
        let out = op(2, 1);
        let h = R.hash();
        let (sig, script, empty): (&[u8], &[u8], &[u8]) = (&[0x30; 71], &[0x51; 80], &[]);
        let other = spend(op(2, 0), &[&R.0]);
        let with_r = spend(out, &[sig, &R.0, script]);
        let without = spend(out, &[sig, empty, script]);
        let wrong_r = spend(out, &[sig, &[9; 32], script]);
        let table = [
            ("no spend", vec![other.clone()], OnChain::Unspent),
            (
                "with R",
                vec![other.clone(), with_r],
                OnChain::SpentWithR(R),
            ),
            ("refund", vec![without], OnChain::SpentWithoutR),
            (
                "32 bytes that are not R",
                vec![wrong_r],
                OnChain::SpentWithoutR,
            ),
        ];
        for (case, txs, want) in table {
            assert_eq!(seen_in(&block(txs), out, h), want, "{case}");
        }
    }
}
