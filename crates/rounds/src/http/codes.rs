//! Every machine-readable error code the API answers, defined once; clients (the dashboard's `i18n.js`) translate by these names.

macro_rules! error_codes {
    ($($(#[$meta:meta])* $variant:ident = $text:literal),+ $(,)?) => {
        /// A machine-readable error code (`detail.code` of an error body).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ErrorCode {
            $($(#[$meta])* $variant),+
        }

        impl ErrorCode {
            /// Every code, for documentation and the translation check.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),+];

            /// The code as sent.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $text),+
                }
            }
        }
    };
}

error_codes! {
    /// No bearer token was sent.
    NotAuthenticated = "not_authenticated",
    /// The token is malformed, badly signed or uses another algorithm.
    InvalidToken = "invalid_token",
    /// The token expired or was revoked.
    SessionExpired = "session_expired",
    /// Unknown user or wrong password.
    InvalidCredentials = "invalid_credentials",
    /// Change-password with a wrong current password.
    CurrentPasswordIncorrect = "current_password_incorrect",
    /// The name is in use, ignoring case.
    UsernameTaken = "username_taken",
    /// No free wallet derivation index after the retries.
    DerivationIndexConflict = "derivation_index_conflict",
    /// Login throttled.
    TooManyAttempts = "too_many_attempts",
    /// Registration quota of the client IP used up.
    RegistrationQuotaExceeded = "registration_quota_exceeded",
    /// Registration is closed (`--registration-quota 0`).
    RegistrationClosed = "registration_closed",
    /// The stream is at its global subscriber cap.
    StreamCapacity = "stream_capacity",
    /// No such resource or route.
    NotFound = "not_found",
    /// Anything the client cannot act on.
    InternalError = "internal_error",
    /// The body is not the JSON the endpoint expects.
    InvalidBody = "invalid_body",
    /// A query parameter is not of the type the endpoint expects.
    InvalidQuery = "invalid_query",
    /// Password shorter than the minimum.
    PasswordTooShort = "password_too_short",
    /// Password longer than the maximum.
    PasswordTooLong = "password_too_long",
    /// Username shorter than the minimum.
    UsernameTooShort = "username_too_short",
    /// Username longer than the maximum.
    UsernameTooLong = "username_too_long",
    /// Username with characters outside `A-Z a-z 0-9 _ . -`.
    UsernameInvalidCharacters = "username_invalid_characters",
    /// The service is paused for maintenance.
    Paused = "paused",
    /// The caller's confirmed coins do not cover amount and fee.
    InsufficientFunds = "insufficient_funds",
    /// The payment would be dust.
    AmountBelowDust = "amount_below_dust",
    /// A bet below the minimum.
    BetBelowMinimum = "bet_below_minimum",
    /// The bet's own pot input would cost too large a share of it in fees.
    BetUneconomic = "bet_uneconomic",
    /// The round no longer takes bets.
    RoundNotOpen = "round_not_open",
    /// The round holds as many bets as its payout can spend.
    RoundFull = "round_full",
    /// The caller holds its share of the round's bets.
    RoundShareFull = "round_share_full",
    /// The payment would need more coins than one transaction holds.
    TooManyInputs = "too_many_inputs",
    /// Concurrent requests keep taking the caller's coins.
    FundsBusy = "funds_busy",
    /// A deposit the caller spent was reorganised out: the debt must be covered first.
    DebtOutstanding = "debt_outstanding",
    /// The network refused the transaction.
    BroadcastRejected = "broadcast_rejected",
    /// The address does not parse.
    InvalidAddress = "invalid_address",
    /// The address is for another network.
    AddressWrongNetwork = "address_wrong_network",
    /// A withdrawal below the minimum.
    WithdrawalBelowMinimum = "withdrawal_below_minimum",
    /// The caller has not played a round with a result.
    NoRoundPlayed = "no_round_played",
    /// A faucet amount out of range.
    FaucetAmountInvalid = "faucet_amount_invalid",
    /// The request took longer than the request time-out; nothing was saved.
    RequestTimeout = "request_timeout",
    /// The request body is over the size limit.
    BodyTooLarge = "body_too_large",
    /// The method is not served on this path.
    MethodNotAllowed = "method_not_allowed",
    /// An `Idempotency-Key` header that is empty, too long or not visible ASCII.
    InvalidIdempotencyKey = "invalid_idempotency_key",
    /// The `Idempotency-Key` was used with another request body or endpoint.
    IdempotencyKeyReused = "idempotency_key_reused",
    /// A request with this `Idempotency-Key` is still being processed.
    IdempotencyKeyInProgress = "idempotency_key_in_progress",
    /// The payment's write was sent but its outcome could not be read back.
    PaymentOutcomeUnknown = "payment_outcome_unknown",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for c in ErrorCode::ALL {
            assert!(seen.insert(c.as_str()), "{} twice", c.as_str());
            assert!(c
                .as_str()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_'));
        }
    }
}
