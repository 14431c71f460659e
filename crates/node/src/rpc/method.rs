//! The control methods as a typed command, as mini-redis's `cmd/` has them:
//! [`Method::parse`] turns a name and its JSON params into a [`Method`], and
//! [`Method::apply`] runs it on the node and renders the answer.

use std::sync::Arc;

use bitcoin::hashes::Hash as _;
use serde::Serialize;
use serde_json::Value;
use wire::{Preimage, Sha256};

use super::error::{codes, RpcFailure};
use super::views::{
    AddressView, ChannelView, ChannelsView, ConnectedView, DoneView, ForwardView, ForwardsView,
    FundsView, InfoView, InvoiceView, InvoicesView, PeerView, PeersView,
};
use crate::manager::{Command, Slot};
use crate::node::Node;

/// Declares the method names once: the enum, each name as sent, and the list of all.
macro_rules! method_names {
    ($($variant:ident = $name:literal,)*) => {
        /// A control method's name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum MethodName {
            $(
                #[doc = concat!("`", $name, "`")]
                $variant,
            )*
        }

        impl MethodName {
            /// Every method, in the order of the help.
            #[cfg(test)]
            pub(crate) const ALL: &'static [MethodName] = &[$(MethodName::$variant),*];

            /// The name as sent in JSON-RPC `method`.
            #[cfg(test)]
            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $(MethodName::$variant => $name,)*
                }
            }

            /// The method called `name`, if there is one.
            pub(crate) fn from_name(name: &str) -> Option<MethodName> {
                match name {
                    $($name => Some(MethodName::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

method_names! {
    GetInfo = "getinfo",
    Connect = "connect",
    ListPeers = "listpeers",
    Disconnect = "disconnect",
    NewAddr = "newaddr",
    ListFunds = "listfunds",
    Open = "open",
    Pay = "pay",
    NewHtlc = "newhtlc",
    FulfillHtlc = "fulfillhtlc",
    FailHtlc = "failhtlc",
    Close = "close",
    ListChannels = "listchannels",
    Invoice = "invoice",
    ListInvoices = "listinvoices",
    WaitInvoice = "waitinvoice",
    ListForwards = "listforwards",
    Help = "help",
    Stop = "stop",
    DevBroadcastRevoked = "dev-broadcast-revoked",
}

/// A control call with its parameters checked.
#[derive(Debug)]
pub(crate) enum Method {
    GetInfo,
    Connect(String),
    ListPeers,
    Disconnect(secp256k1::PublicKey),
    NewAddr,
    ListFunds,
    Open {
        peer: secp256k1::PublicKey,
        amount_sat: u64,
    },
    /// A command on the peer's channel (`pay`, the HTLC methods, `close`).
    Channel {
        peer: secp256k1::PublicKey,
        command: Command,
    },
    ListChannels,
    /// `pay --route NODE,… R_HASH AMOUNT_MSAT`.
    PayRoute {
        route: Vec<secp256k1::PublicKey>,
        r_hash: Sha256,
        amount_msat: u64,
    },
    /// `invoice AMOUNT_MSAT [LABEL]`.
    Invoice {
        amount_msat: u32,
        label: Option<String>,
    },
    ListInvoices,
    WaitInvoice(String),
    ListForwards,
    Help(Vec<Value>),
    Stop,
    #[cfg(feature = "test-hooks")]
    DevBroadcastRevoked(secp256k1::PublicKey),
}

/// What a call answers: a JSON value, or the JSON text of a view rendered straight from it
/// (its object keys in sorted order, as a value's are).
#[derive(Debug)]
pub(crate) enum Answer {
    Value(Value),
    Rendered(String),
}

/// Positional JSON params, read by index with the name each has in the help, and the peers
/// the node knows (their ids already parsed).
struct Params<'a>(&'a [Value], Known<'a>);

/// Looks up an already parsed peer id by its 33 bytes.
pub(crate) type Known<'a> = &'a dyn Fn(&[u8; 33]) -> Option<secp256k1::PublicKey>;

impl Params<'_> {
    fn str(&self, index: usize, name: &str) -> Result<&str, RpcFailure> {
        self.0
            .get(index)
            .and_then(Value::as_str)
            .ok_or_else(|| RpcFailure::params(format!("missing {name}")))
    }

    fn u64(&self, index: usize, name: &str) -> Result<u64, RpcFailure> {
        let v = self
            .0
            .get(index)
            .ok_or_else(|| RpcFailure::params(format!("missing {name}")))?;
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| {
                RpcFailure::params(format!("{name} must be a non-negative integer, got {v}"))
            })
    }

    /// A positive amount.
    fn amount(&self, index: usize, name: &str) -> Result<u64, RpcFailure> {
        match self.u64(index, name)? {
            0 => Err(RpcFailure::params(format!("{name} must be positive"))),
            amount => Ok(amount),
        }
    }

    /// A known peer's id is looked up rather than parsed: parsing decompresses the point,
    /// 1 % of a busy hub's CPU when each payment's fulfil names its peer (docs/node.md,
    /// "Performance notes"). Its compressed serialisation is canonical, so equal bytes are
    /// the same key; anything else is parsed (and checked) as before.
    fn peer(&self, index: usize) -> Result<secp256k1::PublicKey, RpcFailure> {
        let id = self.str(index, "PEER_ID")?;
        let mut serialized = [0u8; 33];
        if hex::decode_to_slice(id, &mut serialized).is_ok() {
            if let Some(key) = (self.1)(&serialized) {
                return Ok(key);
            }
        }
        id.parse()
            .map_err(|_| RpcFailure::params(format!("not a node id: {id}")))
    }

    fn bytes32(&self, index: usize, name: &str) -> Result<[u8; 32], RpcFailure> {
        let s = self.str(index, name)?;
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(s, &mut bytes).map_err(|_| {
            RpcFailure::params(format!("{name} must be 32 bytes of hex (64 characters)"))
        })?;
        Ok(bytes)
    }

    /// `invoice`'s AMOUNT_MSAT (the wire's uint32) and optional LABEL.
    fn invoice(&self) -> Result<(u32, Option<String>), RpcFailure> {
        let amount = self.amount(0, "AMOUNT_MSAT")?;
        let amount_msat = u32::try_from(amount).map_err(|_| {
            RpcFailure::params(format!(
                "AMOUNT_MSAT must be at most 4294967295 (the wire's uint32), got {amount}"
            ))
        })?;
        let label = match self.0.get(1) {
            None => None,
            Some(_) => Some(self.str(1, "LABEL")?.to_owned()),
        };
        Ok((amount_msat, label))
    }

    /// `pay --route`'s node ids (the second parameter, comma-separated).
    fn route(&self) -> Result<Vec<secp256k1::PublicKey>, RpcFailure> {
        self.str(1, "NODE,…")?
            .split(',')
            .map(|id| {
                id.parse()
                    .map_err(|_| RpcFailure::params(format!("not a node id: {id}")))
            })
            .collect()
    }

    /// `close`'s optional second argument.
    fn force(&self, index: usize) -> Result<bool, RpcFailure> {
        match self.0.get(index) {
            None => Ok(false),
            Some(v) if v.as_str() == Some("force") || v.as_bool() == Some(true) => Ok(true),
            Some(v) => Err(RpcFailure::params(format!(
                "second argument of close must be \"force\", got {v}"
            ))),
        }
    }
}

impl Method {
    /// The call named `method` with `params`; peer ids found by `known` are taken from it.
    ///
    /// # Errors
    /// An unknown method (-32601, with the closest name) or a bad parameter (-32602).
    pub(crate) fn parse(
        method: &str,
        params: &[Value],
        known: Known<'_>,
    ) -> Result<Method, RpcFailure> {
        let not_found = || {
            RpcFailure::new(
                codes::METHOD_NOT_FOUND,
                crate::rpc_help::unknown_method(method),
            )
        };
        let name = MethodName::from_name(method).ok_or_else(not_found)?;
        let p = Params(params, known);
        let channel = |peer, command| Method::Channel { peer, command };
        Ok(match name {
            MethodName::GetInfo => Method::GetInfo,
            MethodName::Connect => Method::Connect(p.str(0, "HOST:PORT")?.to_owned()),
            MethodName::ListPeers => Method::ListPeers,
            MethodName::Disconnect => Method::Disconnect(p.peer(0)?),
            MethodName::NewAddr => Method::NewAddr,
            MethodName::ListFunds => Method::ListFunds,
            MethodName::Open => {
                let peer = p.peer(0)?;
                let amount_sat = p.amount(1, "AMOUNT_SAT")?;
                Method::Open { peer, amount_sat }
            }
            MethodName::Pay if params.first().and_then(Value::as_str) == Some("--route") => {
                let route = p.route()?;
                let r_hash = Sha256::from_byte_array(p.bytes32(2, "R_HASH")?);
                let amount_msat = p.amount(3, "AMOUNT_MSAT")?;
                Method::PayRoute {
                    route,
                    r_hash,
                    amount_msat,
                }
            }
            MethodName::Pay => {
                let peer = p.peer(0)?;
                channel(peer, Command::Pay(p.amount(1, "AMOUNT_MSAT")?))
            }
            MethodName::NewHtlc => {
                let peer = p.peer(0)?;
                let amount_msat = p.amount(1, "AMOUNT_MSAT")?;
                let r_hash = Sha256::from_byte_array(p.bytes32(2, "R_HASH")?);
                let expiry = u32::try_from(p.u64(3, "EXPIRY")?)
                    .ok()
                    .filter(|e| *e < 500_000_000)
                    .ok_or_else(|| {
                        RpcFailure::params("EXPIRY must be a block height below 500000000")
                    })?;
                let command = Command::AddHtlc {
                    amount_msat,
                    r_hash,
                    expiry,
                };
                Method::Channel { peer, command }
            }
            MethodName::FulfillHtlc => {
                let peer = p.peer(0)?;
                channel(peer, Command::Fulfill(Preimage(p.bytes32(1, "R")?)))
            }
            MethodName::FailHtlc => {
                let peer = p.peer(0)?;
                let r_hash = Sha256::from_byte_array(p.bytes32(1, "R_HASH")?);
                channel(peer, Command::Fail(r_hash))
            }
            MethodName::Close => {
                let peer = p.peer(0)?;
                let command = if p.force(1)? {
                    Command::ForceClose
                } else {
                    Command::Close
                };
                Method::Channel { peer, command }
            }
            MethodName::ListChannels => Method::ListChannels,
            MethodName::Invoice => {
                let (amount_msat, label) = p.invoice()?;
                Method::Invoice { amount_msat, label }
            }
            MethodName::ListInvoices => Method::ListInvoices,
            MethodName::WaitInvoice => Method::WaitInvoice(p.str(0, "LABEL")?.to_owned()),
            MethodName::ListForwards => Method::ListForwards,
            MethodName::Help => Method::Help(params.to_vec()),
            MethodName::Stop => Method::Stop,
            #[cfg(feature = "test-hooks")]
            MethodName::DevBroadcastRevoked => Method::DevBroadcastRevoked(p.peer(0)?),
            #[cfg(not(feature = "test-hooks"))]
            MethodName::DevBroadcastRevoked => return Err(not_found()),
        })
    }

    /// Runs the call on the node and renders its answer.
    ///
    /// # Errors
    /// The call failed; the code says how (docs/node.md, "Error codes").
    pub(crate) async fn apply(self, node: &Arc<Node>) -> Result<Answer, RpcFailure> {
        match self {
            Method::GetInfo => render(info(node).await?),
            Method::Connect(target) => {
                let addr = tokio::net::lookup_host(target.as_str())
                    .await
                    .ok()
                    .and_then(|mut a| a.next())
                    .ok_or_else(|| RpcFailure::params(format!("cannot resolve {target}")))?;
                let node_id = node.connect(addr).await?;
                render(ConnectedView {
                    node_id: node_id.to_string(),
                })
            }
            Method::ListPeers => peers(node).await.map(Answer::Value),
            Method::Disconnect(peer) => {
                if node
                    .peers
                    .disconnect(&peer, "Disconnected by operator")
                    .await
                {
                    render(DoneView {})
                } else {
                    Err(RpcFailure::new(
                        codes::NOT_CONNECTED,
                        format!("not connected to {peer}"),
                    ))
                }
            }
            Method::NewAddr => {
                let address = node
                    .wallet
                    .new_address()
                    .await
                    .map_err(crate::control_error::ControlError::from)?;
                render(AddressView {
                    address: address.to_string(),
                })
            }
            Method::ListFunds => render(FundsView::of(&node.wallet.funds().await?)),
            Method::Open { peer, amount_sat } => {
                let slot = node.manager.open(&peer, amount_sat).await?;
                channel_view(&slot).await
            }
            Method::Channel { peer, command } => {
                let slot = node.manager.command(&peer, command).await?;
                channel_view(&slot).await
            }
            Method::ListChannels => {
                let mut channels = Vec::new();
                for slot in node.manager.channels.all() {
                    channels.push(ChannelView::of(&slot.peer, &*slot.lock().await));
                }
                render(ChannelsView { channels })
            }
            Method::PayRoute {
                route,
                r_hash,
                amount_msat,
            } => pay_route(node, &route, r_hash, amount_msat)
                .await
                .map(Answer::Value),
            Method::Invoice { amount_msat, label } => render(InvoiceView::of(
                &node.manager.create_invoice(amount_msat, label).await?,
            )),
            Method::ListInvoices => {
                let invoices: Vec<InvoiceView> = node
                    .manager
                    .list_invoices()
                    .await?
                    .iter()
                    .map(InvoiceView::of)
                    .collect();
                render(InvoicesView { invoices })
            }
            Method::WaitInvoice(label) => {
                render(InvoiceView::of(&node.manager.wait_invoice(&label).await?))
            }
            Method::ListForwards => render(forwards(node).await?),
            Method::Help(params) => crate::rpc_help::answer(&params)
                .map(|help| Answer::Value(Value::from(help)))
                .map_err(|e| RpcFailure::params(e.to_string())),
            Method::Stop => {
                node.request_shutdown();
                Ok(Answer::Value(Value::from("potluck node stopping")))
            }
            #[cfg(feature = "test-hooks")]
            Method::DevBroadcastRevoked(peer) => {
                let txid = node.manager.broadcast_revoked(&peer).await?;
                render(super::views::TxidView {
                    txid: txid.to_string(),
                })
            }
        }
    }
}

/// A view as the answer's JSON (keys sorted, as every answer's are).
fn render(view: impl Serialize) -> Result<Answer, RpcFailure> {
    value_of(view).map(Answer::Value)
}

/// `view` as a JSON value (its object keys sorted, `serde_json`'s map).
fn value_of(view: impl Serialize) -> Result<Value, RpcFailure> {
    serde_json::to_value(view).map_err(unrenderable)
}

/// A view that does not serialize: the node's fault, not the caller's.
fn unrenderable(e: serde_json::Error) -> RpcFailure {
    RpcFailure::new(crate::control_error::codes::MISC_ERROR, e.to_string())
}

/// `pay --route`: the first hop's channel, with how the payment ended: paid, failed
/// back, or still in flight when the command's time runs out (it ends by its expiry).
async fn pay_route(
    node: &Node,
    route: &[secp256k1::PublicKey],
    r_hash: wire::Sha256,
    amount_msat: u64,
) -> Result<Value, RpcFailure> {
    let crate::manager::route::RoutedPayment {
        slot,
        amount_msat,
        fee_msat,
        attempts,
        end,
    } = node.manager.pay_route(route, r_hash, amount_msat).await?;
    let timeout = node.manager.settings.command_timeout;
    let end = tokio::time::timeout(timeout, end)
        .await
        .ok()
        .and_then(Result::ok);
    let mut answer = value_of(ChannelView::of(&slot.peer, &*slot.lock().await))?;
    answer["payment"] = value_of(super::views::PaymentView::of(
        amount_msat,
        fee_msat,
        attempts,
        end,
    ))?;
    Ok(answer)
}

/// `listforwards`.
async fn forwards(node: &Node) -> Result<ForwardsView, RpcFailure> {
    let rows = node.manager.list_forwards().await?;
    let forwards = rows
        .iter()
        .map(|f| ForwardView::of(f, node.manager.peer_of(f.in_channel)))
        .collect();
    Ok(ForwardsView::of(forwards, rows.iter()))
}

/// The channel commands' answer, serialized straight from its view: a busy node answers
/// one per payment, and a `Value` tree of it first was 1-2 % of its CPU (docs/node.md,
/// "Performance notes"). The view's fields are declared in sorted order, so the text is
/// the same as through a `Value`.
async fn channel_view(slot: &Slot) -> Result<Answer, RpcFailure> {
    let view = ChannelView::of(&slot.peer, &*slot.lock().await);
    serde_json::to_string(&view)
        .map(Answer::Rendered)
        .map_err(unrenderable)
}

async fn info(node: &Node) -> Result<InfoView, RpcFailure> {
    let tip = node
        .chain
        .tip()
        .await
        .map_err(|e| RpcFailure::new(codes::CHAIN_ERROR, format!("chain: {e}")))?;
    let mut view = InfoView {
        node_id: node.identity.id.to_string(),
        listen: node.doors.p2p_addr.to_string(),
        network: node.identity.network.to_string(),
        block_height: tip.height,
        watched_scripts: node.wallet.watched_scripts(),
        ..InfoView::default()
    };
    for slot in node.manager.channels.all() {
        view.count(&*slot.lock().await);
    }
    view.wallet_sat = node
        .store
        .outputs(true)
        .await?
        .iter()
        .map(|o| o.amount_sat)
        .sum();
    Ok(view)
}

async fn peers(node: &Node) -> Result<Value, RpcFailure> {
    let mut peers = Vec::new();
    for p in node.peers.list() {
        let channel_state = match node.manager.channels.latest(&p.node_id) {
            Some(slot) => Some(slot.lock().await.channel.state().as_str()),
            None => None,
        };
        peers.push(PeerView {
            node_id: p.node_id.to_string(),
            address: p.address.to_string(),
            connected: p.connected,
            channel_state,
        });
    }
    value_of(PeersView { peers })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> secp256k1::PublicKey {
        let secret = secp256k1::SecretKey::from_slice(&[byte; 32]).expect("secret");
        secp256k1::PublicKey::from_secret_key(&secp256k1::Secp256k1::signing_only(), &secret)
    }

    fn peer_of(id: &str, known: Known<'_>) -> Result<secp256k1::PublicKey, RpcFailure> {
        Params(&[Value::from(id)], known).peer(0)
    }

    #[test]
    fn a_known_peer_is_taken_from_the_node_and_any_other_id_is_parsed_and_checked() {
        let (ours, other) = (key(1), key(2));
        let lookups = std::cell::Cell::new(0);
        let known = |id: &[u8; 33]| {
            lookups.set(lookups.get() + 1);
            (*id == ours.serialize()).then_some(ours)
        };
        let hex_of = |k: secp256k1::PublicKey| hex::encode(k.serialize());
        assert_eq!(peer_of(&hex_of(ours), &known).ok(), Some(ours));
        assert_eq!(
            peer_of(&hex_of(ours).to_uppercase(), &known).ok(),
            Some(ours)
        );
        // Not ours: parsed, so still the right key.
        assert_eq!(peer_of(&hex_of(other), &known).ok(), Some(other));
        assert_eq!(lookups.get(), 3);
        // 33 bytes that are no point on the curve: the lookup misses, the parse refuses.
        let not_a_point = format!("02{}", "ff".repeat(32));
        let refused = peer_of(&not_a_point, &known).map(|_| ()).unwrap_err();
        assert_eq!(refused.message, format!("not a node id: {not_a_point}"));
        // Not hex, or not 33 bytes: no lookup at all, the same refusal as ever.
        for bad in ["xyz", "02ab"] {
            let refused = peer_of(bad, &known).map(|_| ()).unwrap_err();
            assert_eq!(refused.message, format!("not a node id: {bad}"));
        }
        assert_eq!(lookups.get(), 4);
    }

    #[test]
    fn a_32_byte_parameter_is_64_hex_digits_and_nothing_else() {
        let none = |_: &[u8; 33]| None;
        let params = |s: &str| [Value::from(s)];
        let good = "ab".repeat(32);
        assert_eq!(
            Params(&params(&good), &none).bytes32(0, "R").ok(),
            Some([0xab; 32])
        );
        for bad in [
            "ab".repeat(31),
            "ab".repeat(33),
            format!("{}zz", "ab".repeat(31)),
        ] {
            let refused = Params(&params(&bad), &none).bytes32(0, "R").unwrap_err();
            assert_eq!(refused.message, "R must be 32 bytes of hex (64 characters)");
        }
    }
}
