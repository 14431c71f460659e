//! Invoices (issue 30): R made by this node, and the HTLCs that end here settled
//! automatically. The policy is the pure [`settle`], tested by the table below it; the
//! manager's side keeps the invoices in memory beside the store and, whenever a channel
//! is idle, carries out the verdict for its incoming HTLCs.

use std::collections::HashMap;
use std::time::Duration;

use bitcoin::hashes::Hash as _;
use channel::{Action, CommandError, Htlc, State};
use wire::{Locktime, Preimage, Sha256};

use super::exec::ExecError;
use super::registry::{lock, Slot, SlotInner};
use super::{unix_now, Manager};
use crate::control_error::ControlError;
use crate::store::{ChannelId, InvoicePaid, InvoiceRow};

/// One context for peeling (building one costs more than a peel).
pub(super) static SECP: std::sync::LazyLock<secp256k1::Secp256k1<secp256k1::All>> =
    std::sync::LazyLock::new(secp256k1::Secp256k1::new);

/// How long `waitinvoice` waits before answering that the invoice is not paid yet.
const WAIT_INVOICE_TIMEOUT: Duration = Duration::from_secs(60);

/// Where an incoming HTLC's route goes, as its onion (if any) tells us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// No onion: a payment to us as before onions (the owner may settle it by hand).
    Direct,
    /// The onion says the payment ends here, for this amount and expiry.
    Final {
        /// What the payer meant us to receive.
        amount_msat: u32,
        /// The least expiry the payer meant us to receive.
        expiry: Locktime,
    },
    /// The onion names a next hop.
    Forward,
    /// The onion does not peel with our key (altered, not for us, bad payload).
    Unreadable,
}

/// Why an incoming HTLC is failed back (`update_routefail_htlc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailReason {
    /// Its onion does not open.
    BadOnion,
    /// Its onion names a next hop this node cannot reach, or the forward failed downstream.
    CannotRoute,
    /// Its onion says it ends here, and no invoice has its hash.
    UnknownHash,
    /// Less than the invoice asks, or less than (or not what) the onion says.
    WrongAmount,
    /// An expiry other than the onion's.
    WrongExpiry,
    /// The invoice was paid by another HTLC.
    AlreadyPaid,
}

/// What to do with an incoming HTLC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing: an HTLC without onion and invoice is the owner's (`fulfillhtlc`, `failhtlc`).
    Leave,
    /// Fulfil it with this R (the invoice is marked paid first).
    Fulfill(Preimage),
    /// Fail it back.
    Fail(FailReason),
}

/// The verdict for `htlc`, offered to us on channel `channel`, whose route is `route`;
/// `invoice` is the one with its hash, if any.
pub(crate) fn settle(
    htlc: &Htlc,
    route: &Route,
    invoice: Option<&InvoiceRow>,
    channel: ChannelId,
) -> Verdict {
    let (amount, expiry) = match route {
        Route::Unreadable => return Verdict::Fail(FailReason::BadOnion),
        Route::Forward => return Verdict::Fail(FailReason::CannotRoute),
        Route::Direct => (None, None),
        Route::Final {
            amount_msat,
            expiry,
        } => (Some(*amount_msat), Some(*expiry)),
    };
    let Some(invoice) = invoice else {
        return match route {
            Route::Direct => Verdict::Leave,
            _ => Verdict::Fail(FailReason::UnknownHash),
        };
    };
    if let Some(paid) = invoice.paid {
        // The HTLC that paid it, not yet fulfilled (a restart or a lost session undid the
        // fulfil), is fulfilled again; any other HTLC for it is failed: it is paid once.
        return if paid.channel == channel && !paid.settled {
            Verdict::Fulfill(invoice.r)
        } else {
            Verdict::Fail(FailReason::AlreadyPaid)
        };
    }
    // BOLT 4's final-hop checks: the HTLC carries what the onion says, not less (an
    // upstream hop that kept more than its fee), and the expiry the payer set.
    if htlc.amount_msat < invoice.amount_msat || amount.is_some_and(|a| htlc.amount_msat < a) {
        return Verdict::Fail(FailReason::WrongAmount);
    }
    if expiry.is_some_and(|e| e != htlc.expiry) {
        return Verdict::Fail(FailReason::WrongExpiry);
    }
    Verdict::Fulfill(invoice.r)
}

/// The invoices, in memory beside the store: every idle channel asks them of its incoming
/// HTLCs, which must not cost a query.
#[derive(Default)]
pub(crate) struct Invoices {
    by_hash: std::sync::Mutex<HashMap<Sha256, InvoiceRow>>,
    /// Woken when an invoice is paid (`waitinvoice`).
    paid: tokio::sync::Notify,
}

impl Invoices {
    fn get(&self, r_hash: &Sha256) -> Option<InvoiceRow> {
        lock(&self.by_hash).get(r_hash).cloned()
    }

    fn is_empty(&self) -> bool {
        lock(&self.by_hash).is_empty()
    }

    fn insert(&self, inv: InvoiceRow) {
        lock(&self.by_hash).insert(inv.r.hash(), inv);
    }

    fn by_label(&self, label: &str) -> Option<InvoiceRow> {
        lock(&self.by_hash)
            .values()
            .find(|i| i.label == label)
            .cloned()
    }
}

impl Manager {
    /// Reads the stored invoices (at start).
    pub(crate) async fn load_invoices(&self) -> Result<(), crate::store::StoreError> {
        for inv in self.store.invoices().await? {
            self.invoices.insert(inv);
        }
        Ok(())
    }

    /// `invoice AMOUNT_MSAT [LABEL]`: a fresh R, stored before its hash is answered.
    pub(crate) async fn create_invoice(
        &self,
        amount_msat: u32,
        label: Option<String>,
    ) -> Result<InvoiceRow, ControlError> {
        let mut r = [0u8; 32];
        getrandom::fill(&mut r)
            .map_err(|e| ControlError::Internal(format!("no randomness: {e}")))?;
        let r = Preimage(r);
        let label = label.unwrap_or_else(|| hex::encode(r.hash().as_byte_array()));
        let inv = InvoiceRow {
            label,
            r,
            amount_msat,
            created_at: unix_now(),
            paid: None,
        };
        if !self.store.add_invoice(&inv).await? {
            return Err(ControlError::InvoiceExists(inv.label));
        }
        self.invoices.insert(inv.clone());
        tracing::info!(label = %inv.label, amount_msat, "invoice created");
        Ok(inv)
    }

    /// `listinvoices`: every invoice, oldest first.
    pub(crate) async fn list_invoices(&self) -> Result<Vec<InvoiceRow>, ControlError> {
        Ok(self.store.invoices().await?)
    }

    /// `waitinvoice LABEL`: the invoice once it is paid, at most [`WAIT_INVOICE_TIMEOUT`].
    pub(crate) async fn wait_invoice(&self, label: &str) -> Result<InvoiceRow, ControlError> {
        let deadline = tokio::time::Instant::now() + WAIT_INVOICE_TIMEOUT;
        loop {
            let paid = self.invoices.paid.notified();
            let inv = self
                .invoices
                .by_label(label)
                .ok_or_else(|| ControlError::NoInvoice(label.to_owned()))?;
            if inv.paid.is_some() {
                return Ok(inv);
            }
            if tokio::time::timeout_at(deadline, paid).await.is_err() {
                return Err(ControlError::Timeout("the invoice to be paid"));
            }
        }
    }

    /// For an idle channel with a session: settles the first incoming HTLC that has a
    /// verdict (an invoice's, or its onion's), returning the actions of the proposal.
    /// An invoice is marked paid on disk before the fulfil that reveals its R leaves.
    pub(crate) async fn next_settlement(
        &self,
        slot: &Slot,
        inner: &mut SlotInner,
    ) -> Result<Option<Vec<Action>>, ExecError> {
        if inner.channel.state() != State::Normal
            || inner.outbox.is_none()
            || inner.anchor.suspended.is_some()
        {
            return Ok(None);
        }
        let Some(cs) = inner.channel.balances() else {
            return Ok(None);
        };
        let no_invoices = self.invoices.is_empty();
        // Only HTLCs with an onion, or any while there are invoices: usually none, and
        // then nothing is copied (this runs after every input of every channel).
        let candidates: Vec<Htlc> = cs
            .theirs
            .htlcs
            .iter()
            .filter(|h| !no_invoices || inner.channel.htlc_onion(&h.r_hash).is_some())
            .copied()
            .collect();
        for htlc in candidates {
            let onion = inner.channel.htlc_onion(&htlc.r_hash);
            let route = match onion {
                None => Route::Direct,
                Some(onion) => self.route_of(onion, &htlc.r_hash),
            };
            let invoice = self.invoices.get(&htlc.r_hash);
            let verdict = match (&route, onion) {
                (Route::Forward, Some(onion)) => {
                    let onion = onion.clone();
                    match self.forward_verdict(slot, &htlc, &onion).await? {
                        Some(verdict) => verdict,
                        None => continue,
                    }
                }
                _ => settle(&htlc, &route, invoice.as_ref(), slot.id),
            };
            if let Some(actions) = self
                .settle_htlc(slot, inner, &htlc, invoice, verdict)
                .await?
            {
                return Ok(Some(actions));
            }
        }
        Ok(None)
    }

    /// Our fulfil of an HTLC completed: if it paid an invoice, that invoice is settled.
    pub(crate) async fn fulfilled(&self, r: &Preimage) -> Result<(), ExecError> {
        let r_hash = r.hash();
        let Some(mut inv) = self.invoices.get(&r_hash) else {
            return Ok(());
        };
        let Some(paid) = inv.paid.as_mut().filter(|p| !p.settled) else {
            return Ok(());
        };
        self.store.mark_invoice_settled(&r_hash).await?;
        paid.settled = true;
        self.invoices.insert(inv);
        Ok(())
    }

    /// Peels our layer of an incoming HTLC's onion.
    fn route_of(&self, onion: &wire::Onion, r_hash: &Sha256) -> Route {
        let peeled = match onion::peel(&SECP, &self.node_key, onion, r_hash.as_byte_array()) {
            Ok(p) => p,
            Err(e) => {
                tracing::info!(error = %crate::error_report::Causes(&e), "incoming onion does not open");
                return Route::Unreadable;
            }
        };
        match (onion::HopPayload::decode(&peeled.payload), peeled.next) {
            (Ok(p), onion::Next::Final) if p.next_node.is_none() => Route::Final {
                amount_msat: p.amount_msat,
                expiry: p.expiry,
            },
            (Ok(p), onion::Next::Forward(_)) if p.next_node.is_some() => Route::Forward,
            // A payload naming a next node in a final layer, or none in a forwarding one.
            _ => Route::Unreadable,
        }
    }

    /// Proposes what `verdict` says for `htlc`; `None` when nothing is to be (or can be)
    /// done now.
    async fn settle_htlc(
        &self,
        slot: &Slot,
        inner: &mut SlotInner,
        htlc: &Htlc,
        invoice: Option<InvoiceRow>,
        verdict: Verdict,
    ) -> Result<Option<Vec<Action>>, ExecError> {
        let r_hash = htlc.r_hash;
        let hash_hex = hex::encode(r_hash.as_byte_array());
        let result = match verdict {
            Verdict::Leave => return Ok(None),
            Verdict::Fail(reason) => {
                tracing::info!(peer = %slot.peer, channel = %slot.id, r_hash = %hash_hex, ?reason, "failing incoming HTLC");
                inner.channel.routefail_htlc(r_hash)
            }
            Verdict::Fulfill(r) => match inner.channel.fulfill_htlc(r, unix_now()) {
                Ok(actions) => {
                    // Durable before R leaves: a restart fulfils the same HTLC again and
                    // fails any other one for this invoice.
                    let fresh = invoice.is_some_and(|i| i.paid.is_none());
                    if fresh {
                        self.mark_paid(slot, inner, htlc).await?;
                    }
                    Ok(actions)
                }
                Err(CommandError::TooLateToFulfill { .. } | CommandError::HtlcExpired(_))
                    if invoice.is_none() =>
                {
                    // A forward's R: the next hop was paid with it, so failing back would
                    // lose the amount. Kept, the channel's deadline claims it on chain.
                    if inner.channel.remember_preimage(r) {
                        self.persist(slot, inner, &[]).await?;
                    }
                    tracing::warn!(peer = %slot.peer, r_hash = %hash_hex, "a forward's R came too close to the incoming HTLC's expiry to fulfil; claiming it on chain");
                    return Ok(None);
                }
                Err(CommandError::TooLateToFulfill { .. } | CommandError::HtlcExpired(_)) => {
                    tracing::warn!(peer = %slot.peer, r_hash = %hash_hex, "invoice HTLC too close to its expiry to fulfil; failing it");
                    inner.channel.routefail_htlc(r_hash)
                }
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(actions) => Ok(Some(actions)),
            Err(e) => {
                tracing::warn!(peer = %slot.peer, r_hash = %hash_hex, error = %crate::error_report::Causes(&e), "cannot settle incoming HTLC now");
                Ok(None)
            }
        }
    }

    /// Marks the invoice of `htlc` paid by it, on disk then in memory; on a failed write
    /// the channel falls back to its stored state (the fulfil is not sent).
    async fn mark_paid(
        &self,
        slot: &Slot,
        inner: &mut SlotInner,
        htlc: &Htlc,
    ) -> Result<(), ExecError> {
        let paid = InvoicePaid {
            channel: slot.id,
            amount_msat: htlc.amount_msat,
            at: unix_now(),
            settled: false,
        };
        if let Err(e) = self.store.mark_invoice_paid(&htlc.r_hash, &paid).await {
            inner.fall_back();
            return Err(e.into());
        }
        if let Some(mut inv) = self.invoices.get(&htlc.r_hash) {
            inv.paid = Some(paid);
            tracing::info!(peer = %slot.peer, channel = %slot.id, label = %inv.label, amount_msat = htlc.amount_msat, "invoice paid");
            self.invoices.insert(inv);
        }
        self.invoices.paid.notify_waiters();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn htlc(amount_msat: u32, expiry: u32) -> Htlc {
        Htlc {
            amount_msat,
            r_hash: Preimage([1; 32]).hash(),
            expiry: Locktime::Blocks(expiry),
        }
    }

    /// An invoice of 5,000,000 msat; paid on channel `c` if any (negative: its fulfil
    /// completed, on channel `-c`).
    fn invoice(paid_on: Option<i64>) -> Option<InvoiceRow> {
        Some(InvoiceRow {
            label: "coffee".into(),
            r: Preimage([1; 32]),
            amount_msat: 5_000_000,
            created_at: 0,
            paid: paid_on.map(|c| InvoicePaid {
                channel: ChannelId(c.abs()),
                amount_msat: 5_000_000,
                at: 0,
                settled: c < 0,
            }),
        })
    }

    fn fin(amount_msat: u32, expiry: u32) -> Route {
        Route::Final {
            amount_msat,
            expiry: Locktime::Blocks(expiry),
        }
    }

    /// (case, HTLC amount, HTLC expiry, route, invoice, verdict); the HTLC is on channel 7.
    type Row = (&'static str, u32, u32, Route, Option<InvoiceRow>, Verdict);

    fn check(table: &[Row]) {
        for (case, amount, expiry, route, inv, want) in table {
            let got = settle(&htlc(*amount, *expiry), route, inv.as_ref(), ChannelId(7));
            assert_eq!(&got, want, "{case}");
        }
    }

    #[test]
    fn the_verdict_for_each_incoming_htlc_without_onion() {
        use FailReason::*;
        use Route::Direct;
        let ok = Verdict::Fulfill(Preimage([1; 32]));
        #[rustfmt::skip]
        check(&[
            ("no invoice: the owner's", 5_000_000, 500, Direct, None, Verdict::Leave),
            ("invoice met", 5_000_000, 500, Direct, invoice(None), ok.clone()),
            ("more than asked", 6_000_000, 500, Direct, invoice(None), ok.clone()),
            ("less than asked", 4_999_999, 500, Direct, invoice(None), Verdict::Fail(WrongAmount)),
            ("paid on another channel", 5_000_000, 500, Direct, invoice(Some(8)), Verdict::Fail(AlreadyPaid)),
            ("paid here, fulfil undone: again", 5_000_000, 500, Direct, invoice(Some(7)), ok.clone()),
            ("paid and settled here: a second HTLC", 5_000_000, 500, Direct, invoice(Some(-7)), Verdict::Fail(AlreadyPaid)),
        ]);
    }

    #[test]
    fn the_verdict_for_each_incoming_htlc_with_an_onion() {
        use FailReason::*;
        use Route::{Forward, Unreadable};
        let ok = Verdict::Fulfill(Preimage([1; 32]));
        #[rustfmt::skip]
        check(&[
            ("ends here, invoice met", 5_000_000, 500, fin(5_000_000, 500), invoice(None), ok),
            ("below the onion's amount", 5_000_000, 500, fin(5_000_001, 500), invoice(None), Verdict::Fail(WrongAmount)),
            ("another expiry", 5_000_000, 499, fin(5_000_000, 500), invoice(None), Verdict::Fail(WrongExpiry)),
            ("ends here, unknown hash", 5_000_000, 500, fin(5_000_000, 500), None, Verdict::Fail(UnknownHash)),
            ("names a next hop", 5_000_000, 500, Forward, invoice(None), Verdict::Fail(CannotRoute)),
            ("does not open", 5_000_000, 500, Unreadable, invoice(None), Verdict::Fail(BadOnion)),
            ("does not open, no invoice", 5_000_000, 500, Unreadable, None, Verdict::Fail(BadOnion)),
        ]);
    }
}
