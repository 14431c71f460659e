//! Help for the control API: one entry per method, the single source of the
//! node's JSON-RPC `help` answer and of `potluck cli help`.
//!
//! The method names themselves are declared once, in `rpc/method.rs` (`MethodName`);
//! the test at the bottom checks that every one has an entry here and every entry names one.

/// One parameter of a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    /// Its name in the usage line, e.g. `AMOUNT_MSAT`.
    pub name: &'static str,
    /// What it is, with its unit and bounds.
    pub meaning: &'static str,
    /// Whether it may be left out.
    pub optional: bool,
}

/// The help of one control method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodHelp {
    /// The method name, as sent in JSON-RPC `method`.
    pub name: &'static str,
    /// One line: what it does.
    pub summary: &'static str,
    /// Positional parameters, in order.
    pub params: &'static [Param],
    /// What it returns, and when.
    pub result: &'static str,
    /// A `potluck cli` command line that uses it.
    pub example: &'static str,
    /// Left out of the overview (test-only methods); `help NAME` still explains it.
    pub hidden: bool,
}

const fn param(name: &'static str, meaning: &'static str) -> Param {
    Param {
        name,
        meaning,
        optional: false,
    }
}

const PEER_ID: Param = param(
    "PEER_ID",
    "the peer's node id: its 33-byte compressed public key as 66 hex characters (getinfo's node_id on the peer)",
);
const AMOUNT_MSAT: Param = param(
    "AMOUNT_MSAT",
    "amount in millisatoshi (1 sat = 1,000 msat), from 1 to 4,294,967,295 (the wire's uint32)",
);
const R_HASH: Param = param(
    "R_HASH",
    "SHA256 of the HTLC's 32-byte preimage R, as 64 hex characters",
);

/// Every method of the control API, in the order `help` lists them.
pub const METHODS: &[MethodHelp] = &[
    MethodHelp {
        name: "getinfo",
        summary: "this node: id, peer address, network, chain height, channel and wallet totals",
        params: &[],
        result: "{node_id, listen, network, block_height, channels, open_channels, \
                 suspended_channels, open_channel_balance_msat, pending_htlcs, wallet_sat, \
                 watched_scripts}; open_channel_balance_msat is our balance before fee shares \
                 in channels not yet closed; suspended: open channels whose anchor a \
                 reorganisation took below min_depth (no updates until it reconfirms)",
        example: "potluck cli --data-dir ./a getinfo",
        hidden: false,
    },
    MethodHelp {
        name: "connect",
        summary: "opens an encrypted session with a peer",
        params: &[param(
            "HOST:PORT",
            "the peer's listen address (its getinfo `listen`), e.g. 127.0.0.1:9745",
        )],
        result: "{node_id} once the session is up (handshake, authenticate and hello done)",
        example: "potluck cli --data-dir ./a connect 127.0.0.1:9745",
        hidden: false,
    },
    MethodHelp {
        name: "listpeers",
        summary: "the peers this node knows, whether connected, and their channel's state",
        params: &[],
        result: "{peers: [{node_id, address, connected, channel_state}]}",
        example: "potluck cli --data-dir ./a listpeers",
        hidden: false,
    },
    MethodHelp {
        name: "disconnect",
        summary: "closes the session with a peer (its channel stays)",
        params: &[PEER_ID],
        result: "{} once the session is closed",
        example: "potluck cli --data-dir ./a disconnect 02…(66 hex)",
        hidden: false,
    },
    MethodHelp {
        name: "newaddr",
        summary: "a fresh receive address of the node's wallet (BIP84, P2WPKH)",
        params: &[],
        result: "{address}",
        example: "potluck cli --data-dir ./a newaddr",
        hidden: false,
    },
    MethodHelp {
        name: "listfunds",
        summary: "the wallet's confirmed outputs, in satoshi",
        params: &[],
        result: "{outputs: [{txid, vout, amount_sat, confirmations, spendable}], total_sat, \
                 spendable_sat}; an immature coinbase has spendable false",
        example: "potluck cli --data-dir ./a listfunds",
        hidden: false,
    },
    MethodHelp {
        name: "open",
        summary: "opens a channel with a connected peer, funded by this node's wallet",
        params: &[
            PEER_ID,
            param(
                "AMOUNT_SAT",
                "the channel's capacity in satoshi, paid into the anchor by this node; \
                 it must exceed the commitment fee (10,000 sat by default)",
            ),
        ],
        result: "the channel (as listchannels shows it) once the anchor is signed by both and \
                 broadcast; it is live (state normal) after min_depth confirmations",
        example: "potluck cli --data-dir ./a open 02…(66 hex) 500000",
        hidden: false,
    },
    MethodHelp {
        name: "pay",
        summary: "pays the channel's peer directly (an update); see `ours.spendable_msat`",
        params: &[PEER_ID, AMOUNT_MSAT],
        result: "the channel once the four-packet update completed, with each side's \
                 balance_msat, fee_share_msat and spendable_msat; a payment to a peer that \
                 owns less than its half of the commitment fee first goes to that share \
                 (docs/node.md, \"Balances and the commitment fee\"). \
                 Along a route instead: `pay --route NODE,… R_HASH AMOUNT_MSAT` (node ids \
                 comma-separated, first our channel's peer, last the payee; R_HASH an \
                 invoice's; AMOUNT_MSAT what the payee receives, in millisatoshi, each hop \
                 before it offered that plus an assumed fee of 1,000 msat + 10 millionths of \
                 what it forwards and 40 more blocks of expiry; there is no gossip). If the \
                 first hop declines with insufficient_funds it names its fee schedule (fixed \
                 sat + millionths): the payment is made once more with that schedule, if \
                 the fees stay within 0.5% of the amount (at least 5,000 msat); a second \
                 decline is the answer, and nothing moved. The answer is the first hop's \
                 channel with `payment`: status paid (the payee has amount_msat, the hops \
                 fee_msat), failed (the HTLC came back; nothing moved) or in_flight (no end \
                 within the command time-out; it ends by its expiry), and attempts (1 or \
                 2); each hop's `listforwards` shows its fee, e.g. `pay --route \
                 02…(66 hex),03…(66 hex) 9f86…(64 hex) 2000000`",
        example: "potluck cli --data-dir ./a pay 02…(66 hex) 1000000",
        hidden: false,
    },
    MethodHelp {
        name: "newhtlc",
        summary: "offers the peer an HTLC: paid if it shows R before EXPIRY, else returned",
        params: &[
            PEER_ID,
            AMOUNT_MSAT,
            R_HASH,
            param(
                "EXPIRY",
                "absolute block height after which the HTLC can be taken back; \
                 above the current height and at most 2,016 blocks ahead",
            ),
        ],
        result: "the channel once update_add_htlc completed; the HTLC appears in htlcs as `out`",
        example: "potluck cli --data-dir ./a newhtlc 02…(66 hex) 50000000 9d…(64 hex) 300",
        hidden: false,
    },
    MethodHelp {
        name: "fulfillhtlc",
        summary: "claims an HTLC offered to us by showing its preimage R",
        params: &[
            PEER_ID,
            param(
                "R",
                "the 32-byte preimage whose SHA256 is the HTLC's R_HASH, as 64 hex characters",
            ),
        ],
        result: "the channel once update_fulfill_htlc completed; after a unilateral close the \
                 HTLC output is claimed on chain with R instead",
        example: "potluck cli --data-dir ./b fulfillhtlc 03…(66 hex) 0101…(64 hex)",
        hidden: false,
    },
    MethodHelp {
        name: "failhtlc",
        summary: "refuses an HTLC offered to us: its amount goes back to the peer",
        params: &[PEER_ID, R_HASH],
        result: "the channel once update_routefail_htlc completed",
        example: "potluck cli --data-dir ./b failhtlc 03…(66 hex) 9d…(64 hex)",
        hidden: false,
    },
    MethodHelp {
        name: "close",
        summary: "closes the channel with a peer, cooperatively or (force) unilaterally",
        params: &[
            PEER_ID,
            Param {
                name: "force",
                meaning: "the word `force`: broadcast our latest commitment now, without the \
                          peer; our output and HTLCs are claimed as their time locks allow",
                optional: true,
            },
        ],
        result: "the channel once the close transaction is signed by both and broadcast \
                 (cooperative; each side pays half of the 5,000-sat close fee if it can), or \
                 once our commitment is broadcast (force)",
        example: "potluck cli --data-dir ./a close 02…(66 hex)",
        hidden: false,
    },
    MethodHelp {
        name: "listchannels",
        summary: "every channel with its state, balances per side, fee shares and HTLCs",
        params: &[],
        result: "{channels: [{peer_id, state, anchor_txid, capacity_sat, our_msat, their_msat, \
                 our_fee_msat, their_fee_msat, ours, theirs, commitment_number, live, htlcs}]}; \
                 live: false before the anchor is at min_depth or after a reorganisation took \
                 it (then anchor_confirmations says how many it has); \
                 ours/theirs are {balance_msat, fee_share_msat, htlc_msat, spendable_msat} \
                 (balance before the fee share, outside HTLCs; spendable: the most one pay or \
                 newhtlc from that side moves now)",
        example: "potluck cli --data-dir ./a listchannels",
        hidden: false,
    },
    MethodHelp {
        name: "invoice",
        summary: "makes a fresh R for a payment to this node and answers its hash (R_HASH)",
        params: &[
            AMOUNT_MSAT,
            Param {
                name: "LABEL",
                meaning: "a name of your choice for the invoice, unique on this node; \
                          without it, the R_HASH in hex",
                optional: true,
            },
        ],
        result: "{label, r_hash, amount_msat, created_at, status}; an incoming HTLC with \
                 this r_hash of at least amount_msat (and, with an onion, the amount and \
                 expiry it states) is fulfilled automatically and the invoice marked paid \
                 once; any other HTLC for it is failed back",
        example: "potluck cli --data-dir ./b invoice 2000000 coffee",
        hidden: false,
    },
    MethodHelp {
        name: "listinvoices",
        summary: "every invoice of this node, oldest first, paid or not",
        params: &[],
        result: "{invoices: [{label, r_hash, amount_msat, created_at (unix seconds), status \
                 (unpaid or paid), paid_msat and paid_at once paid}]}",
        example: "potluck cli --data-dir ./b listinvoices",
        hidden: false,
    },
    MethodHelp {
        name: "waitinvoice",
        summary: "waits until an invoice is paid (at most 60 s), then answers it",
        params: &[param(
            "LABEL",
            "the invoice's label, as `invoice` answered it",
        )],
        result: "the invoice as listinvoices shows it, once paid; -108 after 60 s unpaid \
                 (call again), -115 for an unknown label",
        example: "potluck cli --data-dir ./b waitinvoice coffee",
        hidden: false,
    },
    MethodHelp {
        name: "listforwards",
        summary: "every HTLC this node forwarded (took from one peer and offered the next), \
                  oldest first",
        params: &[],
        result: "{forwards: [{in_peer_id, in_channel, in_msat, out_peer_id, out_channel, \
                 out_msat, out_expiry (block height), fee_msat (in_msat - out_msat, earned \
                 once fulfilled), r_hash, state (offered: waiting on the next hop; \
                 fulfilled: R came back and was passed upstream; failed: routefailed \
                 upstream), created_at (unix seconds)}]}",
        example: "potluck cli --data-dir ./b listforwards",
        hidden: false,
    },
    MethodHelp {
        name: "dev-broadcast-revoked",
        summary: "TEST ONLY (node started with --dev-allow-cheat): broadcasts a revoked commitment",
        params: &[PEER_ID],
        result: "{txid}; the peer then takes every output of it with the penalty",
        example: "potluck cli --data-dir ./a dev-broadcast-revoked 02…(66 hex)",
        hidden: true,
    },
    MethodHelp {
        name: "help",
        summary: "lists the methods, or explains one: parameters, units, result, an example",
        params: &[Param {
            name: "METHOD",
            meaning: "a method name; without it, the list of methods",
            optional: true,
        }],
        result: "this text",
        example: "potluck cli --data-dir ./a help pay",
        hidden: false,
    },
    MethodHelp {
        name: "stop",
        summary: "stops the node: peers are told, the cookie and control URL files are removed",
        params: &[],
        result: "\"potluck node stopping\"",
        example: "potluck cli --data-dir ./a stop",
        hidden: false,
    },
];

/// Methods of the chain's JSON-RPC that people send to the node by mistake.
const CHAIN_METHODS: &[&str] = &[
    "sendtoaddress",
    "generatetoaddress",
    "getblockcount",
    "getblockchaininfo",
    "getbestblockhash",
    "getblockhash",
    "getblock",
    "getrawtransaction",
    "sendrawtransaction",
    "gettxout",
    "getrawmempool",
    "estimatesmartfee",
];

/// Why `help` could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HelpError {
    /// No method has this name; the message suggests the closest one.
    #[error("{0}")]
    UnknownMethod(String),
    /// The argument is not a method name.
    #[error("help takes at most one argument, a method name")]
    BadArgument,
}

/// The entry of `name`, hidden ones included.
pub fn find(name: &str) -> Option<&'static MethodHelp> {
    METHODS.iter().find(|m| m.name == name)
}

impl MethodHelp {
    /// `pay PEER_ID AMOUNT_MSAT`, optional parameters in brackets.
    pub fn usage(&self) -> String {
        let mut line = self.name.to_owned();
        for p in self.params {
            line.push(' ');
            if p.optional {
                line.push_str(&format!("[{}]", p.name));
            } else {
                line.push_str(p.name);
            }
        }
        line
    }

    /// The full text: usage, summary, parameters, result and example.
    pub fn detail(&self) -> String {
        let mut text = format!("{}\n{}\n\n", self.usage(), capitalised(self.summary));
        if self.params.is_empty() {
            text.push_str("Parameters: none\n");
        } else {
            text.push_str("Parameters:\n");
            let width = self.params.iter().map(|p| p.name.len()).max().unwrap_or(0);
            for p in self.params {
                let optional = if p.optional { " (optional)" } else { "" };
                text.push_str(&format!(
                    "  {:width$}  {}{optional}\n",
                    p.name,
                    p.meaning,
                    width = width
                ));
            }
        }
        text.push_str(&format!(
            "\nResult: {}\n\nExample:\n  {}",
            self.result, self.example
        ));
        text
    }
}

fn capitalised(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The list of methods, one line each; the first word of each line is the method.
pub fn overview() -> String {
    let visible: Vec<&MethodHelp> = METHODS.iter().filter(|m| !m.hidden).collect();
    let width = visible.iter().map(|m| m.usage().len()).max().unwrap_or(0);
    let mut text = String::new();
    for m in visible {
        text.push_str(&format!(
            "{:width$}  {}\n",
            m.usage(),
            m.summary,
            width = width
        ));
    }
    text.push_str(
        "\nAmounts: *_SAT in satoshi, *_MSAT in millisatoshi (1 sat = 1,000 msat).\n\
         `potluck cli help METHOD` (JSON-RPC: method \"help\", params [\"METHOD\"]) shows a \
         method's parameters, units, result and an example.",
    );
    text
}

/// The node's answer to `help` with these JSON-RPC params.
///
/// # Errors
/// An unknown method name (the message suggests the closest), or a parameter that is not one name.
pub fn answer(params: &[serde_json::Value]) -> Result<String, HelpError> {
    match params {
        [] => Ok(overview()),
        [name] => {
            let name = name.as_str().ok_or(HelpError::BadArgument)?;
            find(name)
                .map(MethodHelp::detail)
                .ok_or_else(|| HelpError::UnknownMethod(unknown_method(name)))
        }
        _ => Err(HelpError::BadArgument),
    }
}

/// "Method not found: NAME" and what the caller probably meant.
pub fn unknown_method(name: &str) -> String {
    let mut message = format!("Method not found: {name}");
    if CHAIN_METHODS.contains(&name) {
        message.push_str(&format!(
            "; {name} is a method of the chain, not of the node: potluck cli --chain {name} …"
        ));
    } else if let Some(close) = closest(name) {
        message.push_str(&format!("; did you mean {close}?"));
    }
    message.push_str(" (`potluck cli help` lists every method)");
    message
}

/// The listed method closest to `name` in edit distance, if any is close enough to be a typo.
pub fn closest(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_lowercase();
    let (best, distance) = METHODS
        .iter()
        .filter(|m| !m.hidden)
        .map(|m| (m.name, edit_distance(&name, m.name)))
        .min_by_key(|(_, d)| *d)?;
    // A third of the letters wrong is still a typo; more is another word.
    if distance <= 2.max(name.len() / 3) {
        return Some(best);
    }
    // `newaddress` for `newaddr`, `channels` for `listchannels`.
    METHODS
        .iter()
        .filter(|m| !m.hidden && name.len() >= 4)
        .find(|m| name.starts_with(m.name) || m.name.contains(name.as_str()))
        .map(|m| m.name)
}

/// Optimal string alignment distance: insertions, deletions, substitutions and swaps of neighbours.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // d[i][j]: distance between the first i letters of a and the first j of b.
    let mut d: Vec<Vec<usize>> = (0..=a.len())
        .map(|i| (0..=b.len()).map(|j| if i == 0 { j } else { i }).collect())
        .collect();
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The method names the control API parses (`rpc/method.rs`, the one list of them).
    fn dispatched() -> BTreeSet<String> {
        crate::rpc::MethodName::ALL
            .iter()
            .map(|m| m.as_str().to_owned())
            .collect()
    }

    #[test]
    fn every_dispatched_method_has_help_and_every_help_entry_is_dispatched() {
        let dispatched = dispatched();
        assert!(
            dispatched.len() >= 15,
            "the dispatch table was not read: {dispatched:?}"
        );
        let documented: BTreeSet<String> = METHODS.iter().map(|m| m.name.to_owned()).collect();
        let undocumented: Vec<_> = dispatched.difference(&documented).collect();
        assert!(undocumented.is_empty(), "no help entry: {undocumented:?}");
        let undispatched: Vec<_> = documented.difference(&dispatched).collect();
        assert!(
            undispatched.is_empty(),
            "help for methods not dispatched: {undispatched:?}"
        );
    }

    #[test]
    fn every_entry_is_complete() {
        let mut names = BTreeSet::new();
        for m in METHODS {
            assert!(names.insert(m.name), "{} listed twice", m.name);
            assert!(
                !m.summary.is_empty() && !m.summary.contains('\n'),
                "{}",
                m.name
            );
            assert!(!m.result.is_empty(), "{}", m.name);
            assert!(
                m.example
                    .starts_with(&format!("potluck cli --data-dir ./a {}", m.name))
                    || m.example
                        .starts_with(&format!("potluck cli --data-dir ./b {}", m.name)),
                "{}: {}",
                m.name,
                m.example
            );
            for p in m.params {
                assert!(!p.meaning.is_empty(), "{} {}", m.name, p.name);
            }
            let detail = m.detail();
            assert!(detail.starts_with(&m.usage()), "{detail}");
            assert!(detail.contains("Example:"), "{detail}");
            assert_eq!(answer(&[serde_json::json!(m.name)]), Ok(detail));
        }
        // Amounts say their unit.
        for p in METHODS.iter().flat_map(|m| m.params) {
            if p.name.ends_with("_MSAT") {
                assert!(p.meaning.contains("millisatoshi"), "{}", p.name);
            } else if p.name.ends_with("_SAT") {
                assert!(p.meaning.contains("satoshi"), "{}", p.name);
            }
        }
    }

    #[test]
    fn the_overview_lists_each_visible_method_on_its_own_line() {
        let text = overview();
        let listed: Vec<&str> = text
            .lines()
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let visible: Vec<&str> = METHODS
            .iter()
            .filter(|m| !m.hidden)
            .map(|m| m.name)
            .collect();
        assert_eq!(listed, visible);
        assert!(!listed.contains(&"dev-broadcast-revoked"));
        assert_eq!(answer(&[]), Ok(text));
    }

    #[test]
    fn help_pay_explains_paying_along_a_route_and_the_fee_retry() {
        let Ok(text) = answer(&[serde_json::json!("pay")]) else {
            panic!("help pay");
        };
        for needle in [
            "--route NODE,… R_HASH AMOUNT_MSAT",
            "millisatoshi",
            "insufficient_funds",
            "made once more with that schedule",
            "a second decline is the answer",
            "status paid",
            "attempts (1 or 2)",
            "Example:",
        ] {
            assert!(text.contains(needle), "{needle:?} missing: {text}");
        }
    }

    #[test]
    fn unknown_names_get_the_closest_method() {
        assert_eq!(closest("listchanels"), Some("listchannels"));
        assert_eq!(closest("pya"), Some("pay"));
        assert_eq!(closest("GETINFO"), Some("getinfo"));
        assert_eq!(closest("newaddress"), Some("newaddr"));
        assert_eq!(closest("fulfill"), Some("fulfillhtlc"));
        assert_eq!(closest("zzzzzzzzzzzz"), None);
        assert!(unknown_method("listchanels").contains("did you mean listchannels?"));
        assert!(unknown_method("sendtoaddress").contains("potluck cli --chain sendtoaddress"));
        assert!(matches!(
            answer(&[serde_json::json!("listchanels")]),
            Err(HelpError::UnknownMethod(m)) if m.starts_with("Method not found: listchanels")
        ));
        assert_eq!(answer(&[serde_json::json!(1)]), Err(HelpError::BadArgument));
    }
}
