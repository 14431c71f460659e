//! Why an owner's call (control API) on peers, channels or the wallet failed, and the
//! JSON-RPC error code each kind answers with (listed in docs/node.md).

use secp256k1::PublicKey;

use crate::store::StoreError;

/// A failed control call; each kind has its own JSON-RPC error code ([`ControlError::code`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ControlError {
    /// No session with the peer is up.
    #[error("not connected to {0}")]
    NotConnected(PublicKey),
    /// `fulfillhtlc` without a session: nothing was sent, but R is kept (on disk), so the
    /// node still claims the HTLC on chain with it before it expires.
    #[error("not connected to {0}; R is kept: run fulfillhtlc again once the peer is back, or the node claims the HTLC on chain with R before it expires")]
    NotConnectedKeepingR(PublicKey),
    /// Dialling a peer failed.
    #[error("connect to {addr} failed: {reason}")]
    Connect {
        /// Where we dialled.
        addr: std::net::SocketAddr,
        /// What went wrong (session error, refused, ...).
        reason: ConnectFailure,
    },
    /// The peer has no channel with us.
    #[error("no channel with {0}")]
    NoChannel(PublicKey),
    /// A channel with the peer is open already (one per session in this protocol).
    #[error("a channel with {0} exists already")]
    ChannelExists(PublicKey),
    /// The asked capacity does not cover the commitment fee and a usable balance.
    #[error("channel too small: {amount_sat} sat; at least {min_sat} sat (commitment fee {fee_sat} sat + {own_sat} sat)")]
    ChannelTooSmall {
        /// Asked.
        amount_sat: u64,
        /// Smallest accepted.
        min_sat: u64,
        /// The commitment fee in it.
        fee_sat: u64,
        /// The smallest usable own balance in it.
        own_sat: u64,
    },
    /// The wallet cannot pay for it.
    #[error("insufficient funds: {asked_sat} sat asked, {needed_sat} sat needed with the transaction's fee, {spendable_sat} sat spendable in the wallet (confirmed; coinbase outputs after 100 blocks)")]
    InsufficientFunds {
        /// Asked.
        asked_sat: u64,
        /// Asked plus the fee of the transaction that pays it.
        needed_sat: u64,
        /// Confirmed and mature in the wallet.
        spendable_sat: u64,
    },
    /// The channel's state machine refused the command (wrong state, unaffordable, ...).
    #[error(transparent)]
    Refused(#[from] channel::CommandError),
    /// The peer declined our proposal.
    #[error("{0}")]
    Declined(String),
    /// The peer declined our HTLC with `insufficient_funds`: the fee it leaves is below
    /// the peer's schedule (which it named). Nothing moved.
    #[error("not paid, nothing moved: {peer} declined the HTLC for a fee below its schedule of {base_msat} msat + {per_millionth} millionths")]
    FeeTooLow {
        /// The peer.
        peer: PublicKey,
        /// Its fixed fee, in msat (it names satoshi).
        base_msat: u64,
        /// Its proportional fee, in millionths of what it forwards.
        per_millionth: u64,
    },
    /// `pay --route`: the first hop's schedule, learnt from its decline, asks more in fees
    /// than the payer pays. Nothing moved.
    #[error("not paid, nothing moved: the route's fees by {peer}'s schedule would be {fee_msat} msat, above the most a payment pays in fees ({max_fee_msat} msat: 0.5% of the amount, at least 5,000 msat)")]
    FeeAboveMax {
        /// The hop that asked.
        peer: PublicKey,
        /// The route's fees with its schedule.
        fee_msat: u64,
        /// The most the payer pays.
        max_fee_msat: u64,
    },
    /// The session dropped before the exchange completed.
    #[error("{0}")]
    PeerGone(String),
    /// The exchange did not complete in time.
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    /// The channel closed on chain while the call waited.
    #[error("the channel closed on chain")]
    ClosedOnChain,
    /// The channel's anchor is not (or no longer, after a reorganisation) confirmed at
    /// `min_depth` on the best chain: no update until it is.
    #[error("the channel's anchor has {confirmations} of {min_depth} confirmations on the best chain: no updates until it confirms again")]
    AnchorUnconfirmed {
        /// Confirmations now (0: in the mempool or nowhere).
        confirmations: u32,
        /// Confirmations the channel needs.
        min_depth: u32,
    },
    /// The anchor could not be built or signed by the wallet.
    #[error("cannot fund the anchor")]
    Funding(#[from] wallet::SpendError),
    /// The chain backend failed.
    #[error("chain")]
    Chain(#[from] chain::ChainError),
    /// `close PEER force`: the chain did not take our commitment. The channel is on chain
    /// all the same: the commitment stays queued and is re-sent at every block.
    #[error("force close: our commitment {txid} was not accepted by the chain ({reason}); the channel is on chain, and the commitment stays queued and is re-sent at every block")]
    CommitmentRefused {
        /// The commitment.
        txid: bitcoin::Txid,
        /// The chain's answer (shown to the operator in the message, hence not a source).
        reason: chain::ChainError,
    },
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The channel's actions stopped (a write failed, or the machine refused our input).
    #[error(transparent)]
    Exec(#[from] crate::manager::ExecError),
    /// A key could not be derived from the wallet seed.
    #[error("wallet")]
    Wallet(#[from] wallet::WalletError),
    /// The test-only cheat is not enabled on this node.
    #[cfg(feature = "test-hooks")]
    #[error("cheating is disabled (test-only flag --dev-allow-cheat)")]
    CheatDisabled,
    /// `invoice`: an invoice with this label (or, by chance, R) exists already.
    #[error("an invoice labelled {0:?} exists already")]
    InvoiceExists(String),
    /// `waitinvoice`: no invoice has this label.
    #[error("no invoice labelled {0:?}")]
    NoInvoice(String),
    /// `pay --route`: the route cannot be paid along (empty, too long for the onion).
    #[error("bad route: {0}")]
    BadRoute(String),
    /// Something that should not happen (no randomness, an invariant).
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<crate::wallet::NodeWalletError> for ControlError {
    fn from(e: crate::wallet::NodeWalletError) -> Self {
        use crate::wallet::NodeWalletError as W;
        match e {
            W::Store(e) => ControlError::Store(e),
            W::Keys(e) => ControlError::Wallet(e),
            W::InsufficientFunds {
                asked_sat,
                needed_sat,
                spendable_sat,
            } => ControlError::InsufficientFunds {
                asked_sat,
                needed_sat,
                spendable_sat,
            },
            W::Funding(e) => ControlError::Funding(e),
        }
    }
}

/// Why dialling a peer failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ConnectFailure {
    /// Every peer slot is taken.
    #[error("too many peers")]
    TooManyPeers,
    /// The address is this node.
    #[error("that address is this node")]
    OwnAddress,
    /// A session with the node at that address is up already (a dial would replace it).
    #[error("already connected to {0}")]
    AlreadyConnected(PublicKey),
    /// The TCP connection or the handshake failed.
    #[error(transparent)]
    Session(#[from] session::SessionError),
}

/// JSON-RPC error codes of the control API: Bitcoin Core's where it has one for the kind,
/// the rest in a block of their own (-100 and below) so that a client can tell them apart.
pub(crate) mod codes {
    /// Core's `RPC_MISC_ERROR`: an internal failure.
    pub const MISC_ERROR: i64 = -1;
    /// Core's `RPC_WALLET_ERROR`.
    pub const WALLET_ERROR: i64 = -4;
    /// Core's `RPC_WALLET_INSUFFICIENT_FUNDS`.
    pub const INSUFFICIENT_FUNDS: i64 = -6;
    /// Core's `RPC_CLIENT_NOT_CONNECTED`.
    pub const NOT_CONNECTED: i64 = -9;
    /// Core's `RPC_DATABASE_ERROR`.
    pub const DATABASE_ERROR: i64 = -20;
    /// Dialling the peer failed.
    pub const CONNECT_FAILED: i64 = -101;
    /// No channel with the peer.
    pub const NO_CHANNEL: i64 = -102;
    /// A channel with the peer exists already.
    pub const CHANNEL_EXISTS: i64 = -103;
    /// The asked channel is too small.
    pub const CHANNEL_TOO_SMALL: i64 = -104;
    /// The channel state machine refused the command.
    pub const REFUSED: i64 = -105;
    /// The peer declined.
    pub const DECLINED: i64 = -106;
    /// The session dropped mid-exchange.
    pub const PEER_GONE: i64 = -107;
    /// The exchange timed out.
    pub const TIMEOUT: i64 = -108;
    /// The channel closed on chain.
    pub const CLOSED_ON_CHAIN: i64 = -109;
    /// The chain backend failed.
    pub const CHAIN_ERROR: i64 = -110;
    /// The channel's anchor is not confirmed at `min_depth` (a reorganisation took it off).
    pub const ANCHOR_UNCONFIRMED: i64 = -112;
    /// `close PEER force`: the chain did not accept our commitment.
    pub const COMMITMENT_REFUSED: i64 = -113;
    /// The test-only cheat is off.
    #[cfg(feature = "test-hooks")]
    pub const CHEAT_DISABLED: i64 = -111;
    /// `invoice`: the label is taken.
    pub const INVOICE_EXISTS: i64 = -114;
    /// `waitinvoice`: no such invoice.
    pub const NO_INVOICE: i64 = -115;
    /// `pay --route`: the route cannot be paid along.
    pub const BAD_ROUTE: i64 = -116;
}

impl ControlError {
    /// The JSON-RPC error code of this kind.
    pub(crate) fn code(&self) -> i64 {
        match self {
            ControlError::NotConnected(_) | ControlError::NotConnectedKeepingR(_) => {
                codes::NOT_CONNECTED
            }
            ControlError::Connect { .. } => codes::CONNECT_FAILED,
            ControlError::NoChannel(_) => codes::NO_CHANNEL,
            ControlError::ChannelExists(_) => codes::CHANNEL_EXISTS,
            ControlError::ChannelTooSmall { .. } => codes::CHANNEL_TOO_SMALL,
            ControlError::InsufficientFunds { .. } => codes::INSUFFICIENT_FUNDS,
            ControlError::Refused(_) => codes::REFUSED,
            ControlError::Declined(_)
            | ControlError::FeeTooLow { .. }
            | ControlError::FeeAboveMax { .. } => codes::DECLINED,
            ControlError::PeerGone(_) => codes::PEER_GONE,
            ControlError::Timeout(_) => codes::TIMEOUT,
            ControlError::ClosedOnChain => codes::CLOSED_ON_CHAIN,
            ControlError::AnchorUnconfirmed { .. } => codes::ANCHOR_UNCONFIRMED,
            ControlError::Funding(_) | ControlError::Wallet(_) => codes::WALLET_ERROR,
            ControlError::Chain(_) => codes::CHAIN_ERROR,
            ControlError::CommitmentRefused { .. } => codes::COMMITMENT_REFUSED,
            ControlError::Store(_) => codes::DATABASE_ERROR,
            ControlError::Exec(crate::manager::ExecError::Store(_)) => codes::DATABASE_ERROR,
            ControlError::Exec(crate::manager::ExecError::Channel(_)) => codes::REFUSED,
            #[cfg(feature = "test-hooks")]
            ControlError::CheatDisabled => codes::CHEAT_DISABLED,
            ControlError::InvoiceExists(_) => codes::INVOICE_EXISTS,
            ControlError::NoInvoice(_) => codes::NO_INVOICE,
            ControlError::BadRoute(_) => codes::BAD_ROUTE,
            ControlError::Internal(_) => codes::MISC_ERROR,
        }
    }
}
