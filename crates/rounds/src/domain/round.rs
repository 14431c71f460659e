//! The states of rounds and transfers as types: the only place where their stored names are spelled.
//!
//! The store binds the enums themselves as query values (written as
//! [`RoundStatus::as_str`]; no query spells a state) and parses with
//! `FromStr` when reading, so the engine and the views match on variants
//! and the compiler points at every place a new state must be handled.

use std::fmt;
use std::str::FromStr;

/// A stored name that is not a known state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}")]
pub struct UnknownState {
    /// Which kind of state.
    pub what: &'static str,
    /// The stored text.
    pub value: String,
}

macro_rules! stored_enum {
    ($(#[$meta:meta])* $name:ident, $what:literal { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every variant, in lifecycle order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The name stored in the database and shown in JSON.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl FromStr for $name {
            type Err = UnknownState;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownState { what: $what, value: s.to_string() }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use stored_enum;

stored_enum! {
    /// Where a round is in its lifecycle: open → closing → drawing → paying_out → closed
    /// (an empty round goes from closing straight to closed; a payout that
    /// cannot be built or is refused ends in payout_failed until an admin retry).
    RoundStatus, "round status" {
        /// Taking bets until `closes_at`.
        Open = "open",
        /// Bets fixed and committed; waiting for the draw block.
        Closing = "closing",
        /// The draw block is awaited or known; the payout is being built.
        Drawing = "drawing",
        /// The payout is written; broadcast (or waiting for an admin retry).
        PayingOut = "paying_out",
        /// Done.
        Closed = "closed",
        /// The payout could not be built or the network refused it: waits for
        /// `POST /admin/rounds/{id}/retry-payout`; the next round is open meanwhile.
        PayoutFailed = "payout_failed",
    }
}

stored_enum! {
    /// What a transfer is.
    TransferKind, "transfer kind" {
        /// An output paying a user's address, found in a block.
        Deposit = "deposit",
        /// A user's payment into a round's pot.
        Bet = "bet",
        /// A user's payment to an outside address.
        Withdrawal = "withdrawal",
        /// A round's pot paid to its winner (and the commission).
        Payout = "payout",
    }
}

stored_enum! {
    /// Where a transfer stands, as stored.
    TransferStatus, "transfer status" {
        /// Deposits: seen in a block.
        Seen = "seen",
        /// Our transaction, written before its broadcast.
        Signed = "signed",
        /// Our transaction, accepted by the node.
        Broadcast = "broadcast",
        /// A bet or withdrawal the node refused: undone.
        Failed = "failed",
        /// A payout the node refused: waits for an admin retry.
        BroadcastFailed = "broadcast_failed",
        /// Deposits: reorganised out and gone from the chain for good.
        Reversed = "reversed",
        /// Our withdrawal or payout replaced by a later version (a fee
        /// bump), or a version the chain did not take: it moves no money.
        Superseded = "superseded",
    }
}

stored_enum! {
    /// Where a bet stands, as stored.
    BetStatus, "bet status" {
        /// In its round's pot.
        Placed = "placed",
        /// Its payment was refused by the node: undone, not in the pot.
        Failed = "failed",
    }
}

stored_enum! {
    /// Why the service controls an output.
    OutputOrigin, "output origin" {
        /// Paid to a user's deposit address.
        Deposit = "deposit",
        /// Change of a user's own payment.
        Change = "change",
        /// A winner's payout.
        Payout = "payout",
        /// A bet in a round's pot.
        Pot = "pot",
    }
}

/// A transfer's status as its owner sees it (GET /users/me/transactions, payouts):
/// what the stored status and the confirming block mean together.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum TransferProgress {
    /// Written, not yet accepted by the node (the worker broadcasts it).
    Pending,
    /// Accepted by the node, not yet in a block.
    Broadcast,
    /// In a block.
    Confirmed,
    /// Refused and undone.
    Failed,
    /// A payout the node refused: waits for an admin retry.
    BroadcastFailed,
    /// Deposits: not yet in a block.
    Unconfirmed,
    /// Deposits: in a block, fewer confirmations than required.
    Confirming,
    /// Deposits: spendable.
    Credited,
    /// Deposits: reorganised out for good; never credited again.
    Reversed,
}

impl TransferProgress {
    /// Our own transactions (bets, withdrawals, payouts): the stored status and
    /// whether a block confirmed it.
    pub fn of_own(status: TransferStatus, confirmed: bool) -> Self {
        match (status, confirmed) {
            (TransferStatus::Failed, _) => Self::Failed,
            (TransferStatus::BroadcastFailed, _) => Self::BroadcastFailed,
            (TransferStatus::Reversed, _) => Self::Reversed,
            // Never listed (the live version is); a stray one reads as undone.
            (TransferStatus::Superseded, _) => Self::Failed,
            (_, true) => Self::Confirmed,
            (TransferStatus::Signed, false) => Self::Pending,
            (TransferStatus::Broadcast | TransferStatus::Seen, false) => Self::Broadcast,
        }
    }

    /// Deposits: the confirming block's depth against the confirmations required.
    pub fn of_deposit(confirmed: bool, confirmations: i64, required: i64) -> Self {
        match confirmed {
            false => Self::Unconfirmed,
            true if confirmations < required => Self::Confirming,
            true => Self::Credited,
        }
    }

    /// The JSON name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Broadcast => "broadcast",
            Self::Confirmed => "confirmed",
            Self::Failed => "failed",
            Self::BroadcastFailed => "broadcast_failed",
            Self::Unconfirmed => "unconfirmed",
            Self::Confirming => "confirming",
            Self::Credited => "credited",
            Self::Reversed => "reversed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_round_trip() {
        for s in RoundStatus::ALL {
            assert_eq!(s.as_str().parse::<RoundStatus>(), Ok(*s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        for k in TransferKind::ALL {
            assert_eq!(k.as_str().parse::<TransferKind>(), Ok(*k));
        }
        for s in TransferStatus::ALL {
            assert_eq!(s.as_str().parse::<TransferStatus>(), Ok(*s));
        }
        for o in OutputOrigin::ALL {
            assert_eq!(o.as_str().parse::<OutputOrigin>(), Ok(*o));
        }
        assert!("Open".parse::<RoundStatus>().is_err());
    }

    #[test]
    fn own_progress_follows_the_old_string_rules() {
        use TransferProgress as P;
        use TransferStatus as S;
        assert_eq!(P::of_own(S::Failed, true), P::Failed);
        assert_eq!(P::of_own(S::BroadcastFailed, false), P::BroadcastFailed);
        assert_eq!(P::of_own(S::Signed, true), P::Confirmed);
        assert_eq!(P::of_own(S::Signed, false), P::Pending);
        assert_eq!(P::of_own(S::Broadcast, false), P::Broadcast);
        assert_eq!(
            serde_json::to_value(P::BroadcastFailed).unwrap(),
            "broadcast_failed"
        );
        assert_eq!(P::of_deposit(true, 1, 2), P::Confirming);
        assert_eq!(P::of_deposit(true, 2, 2), P::Credited);
        assert_eq!(P::of_deposit(false, 0, 1), P::Unconfirmed);
    }
}
