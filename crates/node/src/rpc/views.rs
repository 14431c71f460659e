//! What the control API answers, as `Serialize` views of the node's state. The answer's
//! JSON object keys come out sorted (`serde_json`'s map), as they always did.

use channel::{Channel, Who};
use secp256k1::PublicKey;
use serde::Serialize;
use wire::Locktime;

use bitcoin::hashes::Hash as _;

use crate::manager::{states, SlotInner};
use crate::sides::SideView;
use crate::store::{ForwardRow, InvoiceRow, OutputRow};
use crate::wallet::Funds;

/// A channel as `listchannels` and the channel commands show it. Its fields, and those of
/// the views inside it, are declared in the order of their names: the channel commands
/// serialize it straight into their answer (`rendered`), whose keys must come out sorted as
/// every other answer's do through `serde_json`'s map.
#[derive(Debug, Serialize)]
pub(crate) struct ChannelView {
    /// Only while suspended (a reorganisation took the anchor below `min_depth`).
    #[serde(skip_serializing_if = "Option::is_none")]
    anchor_confirmations: Option<u32>,
    anchor_txid: Option<String>,
    capacity_sat: Option<u64>,
    commitment_number: u64,
    htlcs: Vec<HtlcView>,
    live: bool,
    our_fee_msat: Option<u64>,
    our_msat: Option<u64>,
    ours: Option<SideView>,
    peer_id: String,
    state: &'static str,
    their_fee_msat: Option<u64>,
    their_msat: Option<u64>,
    theirs: Option<SideView>,
    /// Only when there is something to say: every other listing keeps its shape.
    #[serde(skip_serializing_if = "Option::is_none")]
    unclaimable: Option<Vec<UnclaimableView>>,
}

/// A pending HTLC of a channel (fields in the order of their names, as [`ChannelView`]'s).
#[derive(Debug, Serialize)]
struct HtlcView {
    amount_msat: u32,
    direction: &'static str,
    expiry: u32,
    id: usize,
    r_hash: String,
    state: &'static str,
}

/// An output of ours worth less than its claim (fields in the order of their names).
#[derive(Debug, Serialize)]
struct UnclaimableView {
    amount_sat: u64,
    claim_fee_sat: u64,
    outpoint: String,
}

impl ChannelView {
    /// The channel with `peer` as it is now.
    pub(crate) fn of(peer: &PublicKey, inner: &SlotInner) -> ChannelView {
        let ch = &inner.channel;
        let state = ch.state();
        let cs = ch.balances();
        ChannelView {
            // The same hex as `Display`, without its formatter per byte.
            peer_id: hex::encode(peer.serialize()),
            state: state.as_str(),
            anchor_txid: ch.anchor_outpoint().map(|o| o.txid.to_string()),
            capacity_sat: cs.map(|c| c.anchor_sat),
            our_msat: cs.map(|c| c.ours.pay_msat),
            their_msat: cs.map(|c| c.theirs.pay_msat),
            our_fee_msat: cs.map(|c| c.ours.fee_msat),
            their_fee_msat: cs.map(|c| c.theirs.fee_msat),
            ours: cs.map(|c| SideView::of(c, Who::Us, state)),
            theirs: cs.map(|c| SideView::of(c, Who::Them, state)),
            commitment_number: ch.commitment_number(),
            htlcs: htlcs(ch),
            unclaimable: (!ch.unclaimable().is_empty()).then(|| {
                ch.unclaimable()
                    .iter()
                    .map(|u| UnclaimableView {
                        outpoint: u.outpoint.to_string(),
                        amount_sat: u.value.to_sat(),
                        claim_fee_sat: u.fee_sat,
                    })
                    .collect()
            }),
            live: states::is_running(state) && inner.anchor.suspended.is_none(),
            anchor_confirmations: inner.anchor.suspended,
        }
    }
}

fn htlcs(ch: &Channel) -> Vec<HtlcView> {
    let Some(cs) = ch.balances() else {
        return Vec::new();
    };
    let out = cs.ours.htlcs.iter().map(|h| ("out", h));
    let inc = cs.theirs.htlcs.iter().map(|h| ("in", h));
    out.chain(inc)
        .enumerate()
        .map(|(id, (direction, h))| HtlcView {
            id,
            direction,
            amount_msat: h.amount_msat,
            r_hash: hex::encode(h.r_hash.as_byte_array()),
            expiry: match h.expiry {
                Locktime::Blocks(b) | Locktime::Seconds(b) => b,
            },
            state: "committed",
        })
        .collect()
}

/// `getinfo`.
#[derive(Debug, Default, Serialize)]
pub(crate) struct InfoView {
    pub(crate) node_id: String,
    pub(crate) listen: String,
    pub(crate) network: String,
    pub(crate) block_height: u32,
    pub(crate) channels: usize,
    pub(crate) open_channels: u64,
    pub(crate) suspended_channels: u64,
    pub(crate) watched_scripts: usize,
    pub(crate) open_channel_balance_msat: u64,
    pub(crate) pending_htlcs: usize,
    pub(crate) wallet_sat: u64,
}

impl InfoView {
    /// Counts a channel into the totals (closed ones only into `channels`).
    pub(crate) fn count(&mut self, inner: &SlotInner) {
        self.channels += 1;
        if inner.channel.state().is_finished() {
            return;
        }
        self.open_channels += 1;
        self.suspended_channels += u64::from(inner.anchor.suspended.is_some());
        if let Some(cs) = inner.channel.balances() {
            self.open_channel_balance_msat += cs.ours.pay_msat + cs.ours.fee_msat;
            self.pending_htlcs += cs.ours.htlcs.len() + cs.theirs.htlcs.len();
        }
    }
}

/// One entry of `listpeers`.
#[derive(Debug, Serialize)]
pub(crate) struct PeerView {
    pub(crate) node_id: String,
    pub(crate) address: String,
    pub(crate) connected: bool,
    pub(crate) channel_state: Option<&'static str>,
}

/// `listfunds`.
#[derive(Debug, Serialize)]
pub(crate) struct FundsView {
    outputs: Vec<OutputView>,
    total_sat: u64,
    spendable_sat: u64,
}

/// One wallet output in `listfunds`.
#[derive(Debug, Serialize)]
struct OutputView {
    txid: String,
    vout: u32,
    amount_sat: u64,
    confirmations: i64,
    spendable: bool,
}

impl FundsView {
    pub(crate) fn of(funds: &Funds) -> FundsView {
        let tip = funds.tip;
        let total_sat = funds.outputs.iter().map(|o| o.amount_sat).sum();
        let spendable_sat = funds
            .outputs
            .iter()
            .filter(|o| o.spendable(tip))
            .map(|o| o.amount_sat)
            .sum();
        let outputs = funds
            .outputs
            .iter()
            .map(|o: &OutputRow| OutputView {
                txid: o.outpoint.txid.to_string(),
                vout: o.outpoint.vout,
                amount_sat: o.amount_sat,
                confirmations: o.confirmations(tip),
                spendable: o.spendable(tip),
            })
            .collect();
        FundsView {
            outputs,
            total_sat,
            spendable_sat,
        }
    }
}

/// `connect`: who answered at the address.
#[derive(Debug, Serialize)]
pub(crate) struct ConnectedView {
    pub(crate) node_id: String,
}

/// `newaddr`.
#[derive(Debug, Serialize)]
pub(crate) struct AddressView {
    pub(crate) address: String,
}

/// `disconnect`: an empty object (nothing more to say).
#[derive(Debug, Serialize)]
pub(crate) struct DoneView {}

/// `dev-broadcast-revoked`: the revoked commitment broadcast.
#[cfg(feature = "test-hooks")]
#[derive(Debug, Serialize)]
pub(crate) struct TxidView {
    pub(crate) txid: String,
}

/// `listchannels`.
#[derive(Debug, Serialize)]
pub(crate) struct ChannelsView {
    pub(crate) channels: Vec<ChannelView>,
}

/// `listpeers`.
#[derive(Debug, Serialize)]
pub(crate) struct PeersView {
    pub(crate) peers: Vec<PeerView>,
}

/// An invoice as `invoice`, `listinvoices` and `waitinvoice` show it.
#[derive(Debug, Serialize)]
pub(crate) struct InvoiceView {
    label: String,
    r_hash: String,
    amount_msat: u32,
    /// Unix seconds.
    created_at: u64,
    /// `unpaid` or `paid`.
    status: &'static str,
    /// The paying HTLC's amount, once paid.
    #[serde(skip_serializing_if = "Option::is_none")]
    paid_msat: Option<u32>,
    /// Unix seconds, once paid.
    #[serde(skip_serializing_if = "Option::is_none")]
    paid_at: Option<u64>,
}

impl InvoiceView {
    pub(crate) fn of(inv: &InvoiceRow) -> InvoiceView {
        InvoiceView {
            label: inv.label.clone(),
            r_hash: hex::encode(inv.r.hash().as_byte_array()),
            amount_msat: inv.amount_msat,
            created_at: inv.created_at,
            status: if inv.paid.is_some() { "paid" } else { "unpaid" },
            paid_msat: inv.paid.map(|p| p.amount_msat),
            paid_at: inv.paid.map(|p| p.at),
        }
    }
}

/// `listinvoices`.
#[derive(Debug, Serialize)]
pub(crate) struct InvoicesView {
    pub(crate) invoices: Vec<InvoiceView>,
}

/// How `pay --route` ended, beside the first hop's channel in its answer.
#[derive(Debug, Serialize)]
pub(crate) struct PaymentView {
    /// `paid` (the route fulfilled our HTLC: the payee has `amount_msat`, the hops
    /// `fee_msat`), `failed` (our HTLC came back: nothing moved) or `in_flight` (no end
    /// within the command's time-out; it ends, fulfilled or failed back, by its expiry).
    status: &'static str,
    /// What the payee receives.
    amount_msat: u64,
    /// The hops' fees our HTLC carries: paid only when `status` is `paid`.
    fee_msat: u64,
    /// 1, or 2 when the first hop declined the first with its fee schedule and the
    /// payment was made again with it.
    attempts: u32,
}

impl PaymentView {
    pub(crate) fn of(
        amount_msat: u64,
        fee_msat: u64,
        attempts: u32,
        end: Option<crate::manager::route::PaymentEnd>,
    ) -> PaymentView {
        use crate::manager::route::PaymentEnd;
        PaymentView {
            status: match end {
                Some(PaymentEnd::Paid) => "paid",
                Some(PaymentEnd::Failed) => "failed",
                None => "in_flight",
            },
            amount_msat,
            fee_msat,
            attempts,
        }
    }
}

/// A forward as `listforwards` shows it.
#[derive(Debug, Serialize)]
pub(crate) struct ForwardView {
    /// The upstream peer (absent once its channel is forgotten).
    #[serde(skip_serializing_if = "Option::is_none")]
    in_peer_id: Option<String>,
    in_channel: i64,
    in_msat: u32,
    out_peer_id: String,
    out_channel: i64,
    out_msat: u32,
    /// Blocks.
    out_expiry: u32,
    /// `in_msat − out_msat`: what this node keeps once the forward is fulfilled.
    fee_msat: u32,
    r_hash: String,
    /// `offered`, `fulfilled` or `failed`.
    state: &'static str,
    /// Unix seconds.
    created_at: u64,
}

impl ForwardView {
    pub(crate) fn of(f: &ForwardRow, in_peer: Option<PublicKey>) -> ForwardView {
        ForwardView {
            in_peer_id: in_peer.map(|p| p.to_string()),
            in_channel: f.in_channel.0,
            in_msat: f.in_msat,
            out_peer_id: f.out_peer.to_string(),
            out_channel: f.out_channel.0,
            out_msat: f.out_msat,
            out_expiry: f.out_expiry,
            fee_msat: f.in_msat.saturating_sub(f.out_msat),
            r_hash: hex::encode(f.r_hash.as_byte_array()),
            state: f.state.as_str(),
            created_at: f.created_at,
        }
    }
}

/// `listforwards`: every forward, and the counts the node's log gives.
#[derive(Debug, Serialize)]
pub(crate) struct ForwardsView {
    pub(crate) forwards: Vec<ForwardView>,
    /// Forwards fulfilled.
    fulfilled: usize,
    /// Forwards failed (routefailed upstream).
    failed: usize,
    /// Forwards still offered downstream.
    in_flight: usize,
    /// The fees of the fulfilled forwards.
    fees_earned_msat: u64,
}

impl ForwardsView {
    pub(crate) fn of<'a>(
        forwards: Vec<ForwardView>,
        rows: impl Iterator<Item = &'a ForwardRow>,
    ) -> ForwardsView {
        let c = crate::manager::ForwardCounts::of(rows);
        ForwardsView {
            forwards,
            fulfilled: c.fulfilled,
            failed: c.failed,
            in_flight: c.in_flight,
            fees_earned_msat: c.fees_earned_msat,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The views render exactly what the inline `json!` of each method used to.
    #[test]
    fn the_small_views_render_as_the_inline_json_did() {
        let id = "02".to_owned() + &"ab".repeat(32);
        let cases = [
            (
                serde_json::to_value(ConnectedView {
                    node_id: id.clone(),
                }),
                json!({ "node_id": id }),
            ),
            (
                serde_json::to_value(AddressView {
                    address: "bcrt1qxyz".into(),
                }),
                json!({ "address": "bcrt1qxyz" }),
            ),
            (serde_json::to_value(DoneView {}), json!({})),
            (
                serde_json::to_value(ChannelsView { channels: vec![] }),
                json!({ "channels": [] }),
            ),
            (
                serde_json::to_value(PeersView {
                    peers: vec![PeerView {
                        node_id: id.clone(),
                        address: "127.0.0.1:9735".into(),
                        connected: true,
                        channel_state: None,
                    }],
                }),
                json!({ "peers": [{
                    "node_id": id, "address": "127.0.0.1:9735", "connected": true,
                    "channel_state": null,
                }] }),
            ),
        ];
        for (view, inline) in cases {
            let view = view.expect("renders");
            assert_eq!(view, inline);
            assert_eq!(view.to_string(), inline.to_string(), "byte for byte");
        }
    }

    /// The channel commands write their view straight to text: with every field present
    /// (and with the optional ones absent), the text is the one a `Value` of it gives, keys
    /// sorted at every level.
    #[test]
    fn a_channel_view_renders_straight_as_its_sorted_value() {
        let side = |base: u64| SideView {
            balance_msat: base,
            fee_share_msat: base + 1,
            htlc_msat: base + 2,
            spendable_msat: base + 3,
        };
        let htlc = |id: usize, direction: &'static str| HtlcView {
            amount_msat: 600_000,
            direction,
            expiry: 1_000,
            id,
            r_hash: "ab".repeat(32),
            state: "committed",
        };
        let full = ChannelView {
            anchor_confirmations: Some(1),
            anchor_txid: Some("cd".repeat(32)),
            capacity_sat: Some(900_000),
            commitment_number: 1_006,
            htlcs: vec![htlc(0, "out"), htlc(1, "in")],
            live: false,
            our_fee_msat: Some(5_000_000),
            our_msat: Some(4_000_000),
            ours: Some(side(10)),
            peer_id: "02".to_owned() + &"ef".repeat(32),
            state: "NORMAL",
            their_fee_msat: Some(5_000_000),
            their_msat: Some(6_000_000),
            theirs: Some(side(20)),
            unclaimable: Some(vec![UnclaimableView {
                amount_sat: 300,
                claim_fee_sat: 450,
                outpoint: format!("{}:1", "12".repeat(32)),
            }]),
        };
        let bare = ChannelView {
            anchor_confirmations: None,
            anchor_txid: None,
            capacity_sat: None,
            commitment_number: 0,
            htlcs: Vec::new(),
            live: true,
            our_fee_msat: None,
            our_msat: None,
            ours: None,
            peer_id: full.peer_id.clone(),
            state: "OPEN_WAIT_FOR_OPEN",
            their_fee_msat: None,
            their_msat: None,
            theirs: None,
            unclaimable: None,
        };
        for view in [&full, &bare] {
            let straight = serde_json::to_string(view).expect("renders");
            let through_value = serde_json::to_value(view).expect("renders").to_string();
            assert_eq!(straight, through_value);
        }
        let keys = |v: &ChannelView| match serde_json::to_value(v).expect("renders") {
            serde_json::Value::Object(map) => map.len(),
            _ => 0,
        };
        assert_eq!((keys(&full), keys(&bare)), (15, 13));
    }
}
