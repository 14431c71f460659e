//! The one payment workflow of users: a bet or a withdrawal selects the user's coins, signs, writes the intent, broadcasts and notifies; plus the development faucet.
//!
//! The order is the crash-safety rule of docs/rounds-engine.md: the signed
//! transaction is written (status `signed`) before it is broadcast, so a
//! restart finishes what a crash interrupted and nothing is paid twice.

use std::sync::Arc;

use bitcoin::{Network, ScriptBuf, Txid};
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;

use crate::domain::address::{AddressBook, AddressError};
use crate::domain::money::Coin;
use crate::domain::round::{RoundStatus, TransferKind, TransferStatus};
use crate::domain::settings::{ServiceConfig, DUST_LIMIT_SATS, MAX_TX_INPUTS, P2WPKH_INPUT_VBYTES};
use crate::domain::spend::{self, SpendFailure};
use crate::domain::time::unix_now;
use crate::service::accounts::{AccountError, SignedSession};
use crate::service::engine::{crash_point, Engine, EngineError, Mark};
use crate::store::idempotency::{Claimed, KeyClaim};
use crate::store::ledger::PaymentContext;
use crate::store::users::UserRow;
use crate::store::{LedgerError, Store, StoreError};

/// Attempts of a bet or withdrawal when a concurrent spend took an output.
const SPEND_ATTEMPTS: usize = 3;
/// Largest faucet payment (1 BTC).
pub const FAUCET_MAX_SATS: i64 = 100_000_000;
/// Faucet payment when the body names no amount.
pub const FAUCET_DEFAULT_SATS: i64 = 1_000_000;

/// Why a payment was not made. Every variant but the internal ones is an
/// answer for the user; the HTTP layer maps each to its error code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PaymentError {
    /// The service is paused for maintenance.
    #[error("the service is paused for maintenance")]
    Paused,
    /// The session's user no longer exists.
    #[error("unknown user")]
    UnknownUser,
    /// The session token's version is not the stored one (or names no
    /// user): checked with the payment's own read, see [`SignedSession`].
    #[error("session refused")]
    Session(#[source] AccountError),
    /// A bet below the configured minimum.
    #[error("a bet must be at least {min_bet_sats} sats")]
    BetBelowMinimum {
        /// What was asked.
        amount_sats: i64,
        /// The minimum.
        min_bet_sats: i64,
    },
    /// The bet's own input would cost the pot more than the allowed share
    /// of the bet in fees at the current fee rate.
    #[error("a bet of {amount_sats} sats would cost the pot {input_fee_sats} sats in fees to spend (more than {max_percent}% of it)")]
    BetUneconomic {
        /// What was asked.
        amount_sats: i64,
        /// The fee of the bet's pot input at the current fee rate.
        input_fee_sats: i64,
        /// The current fee rate.
        fee_rate_sat_vb: i64,
        /// The configured share.
        max_percent: u32,
    },
    /// The round no longer takes bets.
    #[error("round {round_id} is {status}, not open")]
    RoundNotOpen {
        /// The round.
        round_id: i64,
        /// Its status.
        status: RoundStatus,
    },
    /// The payer's coins cover the amount only in a transaction of more
    /// inputs than the network relays.
    #[error("a payment of {amount_sats} sats would spend more than {max_inputs} of your coins, more than one transaction can hold; one payment can take at most {max_amount_sats} sats")]
    TooManyInputs {
        /// What was asked.
        amount_sats: i64,
        /// The most coins one transaction spends.
        max_inputs: usize,
        /// The most one payment can take.
        max_amount_sats: i64,
    },
    /// The round holds as many bets as its payout can spend.
    #[error("round {round_id} is full: a round takes at most {max_bets} bets, so that its payout fits in one standard transaction; bet in the next round")]
    RoundFull {
        /// The round.
        round_id: i64,
        /// The most bets a round takes.
        max_bets: i64,
    },
    /// The user holds its share of the round's bets.
    #[error("you hold {max_bets} bets of round {round_id}, the most one player places in a round; bet in the next round")]
    RoundShareFull {
        /// The round.
        round_id: i64,
        /// The most bets one user places in a round.
        max_bets: i64,
    },
    /// The withdrawal address does not parse.
    #[error("address is not a valid address")]
    InvalidAddress {
        /// The address as given (trimmed).
        address: String,
    },
    /// The withdrawal address is for another network.
    #[error("address is for another network (expected {expected})")]
    WrongNetwork {
        /// The address as given (trimmed).
        address: String,
        /// The service's network.
        expected: Network,
    },
    /// A withdrawal below the configured minimum or the dust limit.
    #[error("a withdrawal must be at least {min_withdrawal_sats} sats")]
    WithdrawalBelowMinimum {
        /// What was asked.
        amount_sats: i64,
        /// The effective minimum.
        min_withdrawal_sats: i64,
    },
    /// The user's confirmed coins do not cover amount and fee.
    #[error("insufficient funds: {needed_sats} sats needed including the miner fee, {balance_sats} sats available")]
    InsufficientFunds {
        /// What was asked.
        amount_sats: i64,
        /// Amount plus fee.
        needed_sats: i64,
        /// Confirmed spendable balance.
        balance_sats: i64,
    },
    /// The payment would be dust.
    #[error("amount must be at least {threshold_sats} sats")]
    Dust {
        /// What was asked.
        amount_sats: i64,
        /// The dust threshold of the destination script.
        threshold_sats: i64,
    },
    /// The network refused the transaction; it was undone.
    #[error("the network refused the transaction; nothing was spent")]
    BroadcastRejected,
    /// A deposit the user spent was reorganised out for good: the debt it
    /// left is not covered by the user's coins beyond this payment.
    #[error("a deposit you spent was reversed by the chain: {debt_sats} sats are owed and your coins ({balance_sats} sats) must cover it before you bet or withdraw")]
    DebtOutstanding {
        /// What the user owes.
        debt_sats: i64,
        /// The user's balance after the debt (may be negative).
        balance_sats: i64,
    },
    /// Concurrent requests kept taking the user's coins.
    #[error("your funds are being spent by another request, try again")]
    FundsBusy,
    /// No round exists (the service creates one at start).
    #[error("no round exists")]
    NoRound,
    /// Building or signing failed for another reason than the user's.
    #[error("building the transaction failed")]
    Spend(#[source] SpendFailure),
    /// The ledger refused the write for another reason than a taken coin.
    #[error("ledger write failed")]
    Ledger(#[source] LedgerError),
    /// The engine failed (faucet).
    #[error("engine step failed")]
    Engine(#[source] EngineError),
    /// The development chain failed (faucet).
    #[error("development chain")]
    DevChain(#[source] chain::DevChainError),
    /// The faucet's blocking task died (faucet).
    #[error("faucet task")]
    FaucetTask(#[source] tokio::task::JoinError),
    /// The request's deadline passed before the payment was written:
    /// nothing was saved, nothing will be paid.
    #[error("the request took longer than {timeout_secs} s; nothing was paid")]
    TimedOut {
        /// The request time-out.
        timeout_secs: u64,
    },
    /// The idempotency key was used with another request.
    #[error("this Idempotency-Key was used with a different request")]
    IdempotencyKeyReused,
    /// Another request with this idempotency key is still running.
    #[error("a request with this Idempotency-Key is still being processed")]
    IdempotencyKeyInProgress,
    /// The write of the payment was sent, and neither its commit nor its
    /// absence could be read back: the payment may exist.
    #[error(
        "the payment {txid} may or may not have been saved; check the transactions before retrying"
    )]
    OutcomeUnknown {
        /// The transaction that may have been saved.
        txid: Txid,
        /// Why the write failed.
        #[source]
        source: LedgerError,
    },
    /// The payment task stopped before it answered.
    #[error("the payment task stopped")]
    Aborted(#[source] tokio::task::JoinError),
    /// The database.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Where a payment request stands, as its [`WriteGate`] sees it.
#[derive(Debug, Clone)]
pub enum Stage {
    /// Reading, checking and signing: nothing is written yet.
    Preparing,
    /// The intent's write has started: its outcome must be awaited.
    Writing,
    /// The intent is saved (durable); the broadcast may still run.
    Saved(Paid),
    /// The deadline passed before the write: the payment never writes.
    Expired,
}

/// Decides, once, between a request's deadline and its payment's write:
/// either the write starts before the deadline (and the request answers
/// with the payment, however slow the broadcast), or the deadline wins and
/// nothing is ever written (the request answers `request_timeout`). So the
/// answer always matches what happens to the money.
#[derive(Debug)]
pub struct WriteGate {
    stage: watch::Sender<Stage>,
    timeout_secs: u64,
}

impl WriteGate {
    /// A gate for a request with a time-out of `timeout_secs`.
    pub fn new(timeout_secs: u64) -> Arc<Self> {
        Arc::new(Self {
            stage: watch::Sender::new(Stage::Preparing),
            timeout_secs,
        })
    }

    /// Whether the payment may write now (the deadline has not won).
    fn begin_write(&self) -> bool {
        let mut allowed = false;
        self.stage.send_if_modified(|s| match s {
            Stage::Preparing => {
                *s = Stage::Writing;
                allowed = true;
                true
            }
            // A retry after a lost race for a coin: still the same write.
            Stage::Writing => {
                allowed = true;
                false
            }
            Stage::Saved(_) | Stage::Expired => false,
        });
        allowed
    }

    /// The intent is durable.
    fn saved(&self, paid: &Paid) {
        self.stage.send_replace(Stage::Saved(Paid {
            broadcast: false,
            ..paid.clone()
        }));
    }

    /// The deadline passed: a payment that has not started its write never
    /// will. Returns the stage the deadline found.
    pub fn expire(&self) -> Stage {
        self.stage.send_if_modified(|s| {
            if matches!(s, Stage::Preparing) {
                *s = Stage::Expired;
                true
            } else {
                false
            }
        });
        self.stage.borrow().clone()
    }

    /// Changes of the stage.
    pub fn watch(&self) -> watch::Receiver<Stage> {
        self.stage.subscribe()
    }

    /// The error of a payment the deadline stopped.
    pub fn timed_out(&self) -> PaymentError {
        PaymentError::TimedOut {
            timeout_secs: self.timeout_secs,
        }
    }
}

/// What a payment request brings besides its amount: its deadline's gate
/// and the client's idempotency key.
#[derive(Debug, Clone)]
pub struct PayOptions {
    /// The client's `Idempotency-Key`, already checked for shape.
    pub key: Option<String>,
    /// The request's deadline against the write.
    pub gate: Arc<WriteGate>,
}

impl Default for PayOptions {
    fn default() -> Self {
        Self {
            key: None,
            // A gate nobody expires: no deadline.
            gate: WriteGate::new(0),
        }
    }
}

/// Whether a payment proceeds with a (possibly claimed) key or repeats the
/// answer the key is bound to.
enum KeyStep {
    Go(Option<KeyClaim>),
    Replay(Result<Paid, PaymentError>),
}

/// The fingerprint of a request: its kind and fields, hashed.
fn fingerprint(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// A payment written (and broadcast unless the chain was unreachable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paid {
    /// The transfer row.
    pub transfer_id: i64,
    /// The bet row, for bets.
    pub bet_id: Option<i64>,
    /// Round of a bet.
    pub round_id: Option<i64>,
    /// Miner fee paid by the user.
    pub fee_sats: i64,
    /// The transaction.
    pub txid: Txid,
    /// False when the chain could not be reached: written, broadcast later by the worker.
    pub broadcast: bool,
}

/// A payment to sign and write: who pays, to what, under which options.
#[derive(Debug)]
struct PaymentRequest<'a> {
    /// The payer.
    me: &'a Payer,
    /// The service configuration read with the payer.
    config: &'a ServiceConfig,
    /// The script paid.
    to: &'a ScriptBuf,
    /// The amount paid to it.
    amount_sats: i64,
    /// A round's pot or an outside address.
    dest: Destination<'a>,
    /// The request's key and deadline.
    opts: &'a PayOptions,
    /// The idempotency key's claim, when it has one.
    claim: Option<&'a KeyClaim>,
}

/// Refuses a payment that would spend coins covering the user's debt:
/// `coins_sats` less the amount and the fee (`0` before the fee is known)
/// must still cover `debt_sats`.
fn refuse_debt(
    debt_sats: i64,
    coins_sats: i64,
    amount_sats: i64,
    fee_sats: i64,
) -> Result<(), PaymentError> {
    if debt_sats > 0 && coins_sats - amount_sats - fee_sats < debt_sats {
        return Err(PaymentError::DebtOutstanding {
            debt_sats,
            balance_sats: coins_sats - debt_sats,
        });
    }
    Ok(())
}

/// A spend that could not be built, as the payer's refusal.
fn spend_refusal(e: SpendFailure, amount_sats: i64) -> PaymentError {
    match e {
        SpendFailure::Insufficient {
            balance_sats,
            needed_sats,
        } => PaymentError::InsufficientFunds {
            amount_sats,
            needed_sats,
            balance_sats,
        },
        SpendFailure::Dust {
            amount_sats,
            threshold_sats,
        } => PaymentError::Dust {
            amount_sats,
            threshold_sats,
        },
        SpendFailure::TooManyInputs {
            max_inputs,
            max_amount_sats,
        } => PaymentError::TooManyInputs {
            amount_sats,
            max_inputs,
            max_amount_sats,
        },
        other => PaymentError::Spend(other),
    }
}

/// The paying user as a payment needs it.
#[derive(Debug, Clone)]
struct Payer {
    id: i64,
    /// The user's key and its P2WPKH script (inputs and change).
    key_path: wallet::KeyPath,
    script: ScriptBuf,
    debt_sats: i64,
    /// The synced tip the context was read at.
    tip_height: Option<i64>,
}

impl Payer {
    /// The payer of `ctx`, or [`PaymentError::UnknownUser`].
    fn of(engine: &Engine, user_id: i64, ctx: &PaymentContext) -> Result<Self, PaymentError> {
        let user = ctx.user.ok_or(PaymentError::UnknownUser)?;
        let debt_sats = user.debt_sats;
        let (key_path, script) = engine
            .user_script(user.derivation_index)
            .map_err(PaymentError::Spend)?;
        Ok(Self {
            id: user_id,
            key_path,
            script,
            debt_sats,
            tip_height: ctx.tip_height,
        })
    }
}

/// Where a user's payment goes.
#[derive(Debug, Clone, Copy)]
enum Destination<'a> {
    /// A bet: the round's pot address.
    Pot {
        /// The round, which must still be open when the intent is written.
        round_id: i64,
    },
    /// A withdrawal to this address.
    Address(&'a str),
}

/// The users' payments over the store and the engine (which signs and broadcasts).
#[derive(Clone, Copy)]
pub struct Payments<'a> {
    store: &'a Store,
    engine: &'a Engine,
}

impl<'a> Payments<'a> {
    /// The service over these parts.
    pub fn new(store: &'a Store, engine: &'a Engine) -> Self {
        Self { store, engine }
    }

    /// Bets `amount_sats` for the user of `session` in the current round
    /// (the session's token version is checked against the one read with
    /// the payment's context); a bet whose own pot input would cost more
    /// than `max_input_fee_percent` of it in fees is refused, so that a pot
    /// can always pay its winner.
    ///
    /// # Errors
    /// A [`PaymentError`] saying why nothing was paid.
    pub async fn bet(
        &self,
        session: SignedSession,
        amount_sats: i64,
        max_input_fee_percent: u32,
        opts: &PayOptions,
    ) -> Result<Paid, PaymentError> {
        let user_id = session.user_id;
        let ctx = self.open_context(user_id, Some(session)).await?;
        let claim = match self
            .claim_key(user_id, opts, &format!("bet:{amount_sats}"))
            .await?
        {
            KeyStep::Go(claim) => claim,
            KeyStep::Replay(answer) => return answer,
        };
        let result = self
            .bet_in(
                ctx,
                user_id,
                amount_sats,
                max_input_fee_percent,
                opts,
                claim.as_ref(),
            )
            .await;
        self.release_unpaid(claim.as_ref(), &result).await;
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn bet_in(
        &self,
        mut ctx: PaymentContext,
        user_id: i64,
        amount_sats: i64,
        max_input_fee_percent: u32,
        opts: &PayOptions,
        claim: Option<&KeyClaim>,
    ) -> Result<Paid, PaymentError> {
        let config = &ctx.config;
        if amount_sats < config.min_bet_sats {
            return Err(PaymentError::BetBelowMinimum {
                amount_sats,
                min_bet_sats: config.min_bet_sats,
            });
        }
        let input_fee_sats = P2WPKH_INPUT_VBYTES.saturating_mul(config.fee_rate_sat_vb);
        if input_fee_sats.saturating_mul(100)
            > amount_sats.saturating_mul(i64::from(max_input_fee_percent))
        {
            return Err(PaymentError::BetUneconomic {
                amount_sats,
                input_fee_sats,
                fee_rate_sat_vb: config.fee_rate_sat_vb,
                max_percent: max_input_fee_percent,
            });
        }
        let round = ctx.round.ok_or(PaymentError::NoRound)?;
        let (round_id, status) = (round.id, round.status);
        // Server time decides: once closes_at has passed the round takes no
        // bet, even before the engine has moved it (checked again in the
        // transaction that writes the bet).
        if status != RoundStatus::Open || unix_now() >= round.closes_at {
            return Err(PaymentError::RoundNotOpen { round_id, status });
        }
        // Refused before anything is signed or taken; the count is checked
        // again where the bet is written.
        let max_bets = self.store.max_round_bets();
        if round.bets >= max_bets {
            return Err(PaymentError::RoundFull { round_id, max_bets });
        }
        let payer = Payer::of(self.engine, user_id, &ctx)?;
        let pot_script = self
            .engine
            .pot_script(round_id)
            .map_err(PaymentError::Spend)?;
        let coins = std::mem::take(&mut ctx.coins);
        let request = PaymentRequest {
            me: &payer,
            config: &ctx.config,
            to: &pot_script,
            amount_sats,
            dest: Destination::Pot { round_id },
            opts,
            claim,
        };
        self.pay_from_user(&request, coins).await
    }

    /// Withdraws `amount_sats` of user `user_id` to `address` (trimmed first).
    ///
    /// # Errors
    /// A [`PaymentError`] saying why nothing was paid.
    pub async fn withdraw(
        &self,
        addresses: &dyn AddressBook,
        session: SignedSession,
        address: &str,
        amount_sats: i64,
        opts: &PayOptions,
    ) -> Result<Paid, PaymentError> {
        let user_id = session.user_id;
        let ctx = self.open_context(user_id, Some(session)).await?;
        let address = address.trim();
        let claim = match self
            .claim_key(
                user_id,
                opts,
                &format!("withdrawal:{address}:{amount_sats}"),
            )
            .await?
        {
            KeyStep::Go(claim) => claim,
            KeyStep::Replay(answer) => return answer,
        };
        let result = self
            .withdraw_in(
                addresses,
                ctx,
                user_id,
                address,
                amount_sats,
                opts,
                claim.as_ref(),
            )
            .await;
        self.release_unpaid(claim.as_ref(), &result).await;
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn withdraw_in(
        &self,
        addresses: &dyn AddressBook,
        mut ctx: PaymentContext,
        user_id: i64,
        address: &str,
        amount_sats: i64,
        opts: &PayOptions,
        claim: Option<&KeyClaim>,
    ) -> Result<Paid, PaymentError> {
        let config = &ctx.config;
        match addresses.validate(address) {
            Ok(()) => {}
            Err(AddressError::WrongNetwork { expected }) => {
                return Err(PaymentError::WrongNetwork {
                    address: address.to_string(),
                    expected,
                })
            }
            Err(_) => {
                return Err(PaymentError::InvalidAddress {
                    address: address.to_string(),
                })
            }
        }
        let min = config.min_withdrawal_sats.max(DUST_LIMIT_SATS);
        if amount_sats < min {
            return Err(PaymentError::WithdrawalBelowMinimum {
                amount_sats,
                min_withdrawal_sats: min,
            });
        }
        let payer = Payer::of(self.engine, user_id, &ctx)?;
        let to = spend::script_of(address, self.engine.wallet().network())
            .map_err(PaymentError::Spend)?;
        let coins = std::mem::take(&mut ctx.coins);
        let request = PaymentRequest {
            me: &payer,
            config: &ctx.config,
            to: &to,
            amount_sats,
            dest: Destination::Address(address),
            opts,
            claim,
        };
        self.pay_from_user(&request, coins).await
    }

    /// Claims the request's idempotency key (when it has one) for the
    /// request described by `request`, or finds the answer the key already
    /// stands for.
    async fn claim_key(
        &self,
        user_id: i64,
        opts: &PayOptions,
        request: &str,
    ) -> Result<KeyStep, PaymentError> {
        let Some(key) = opts.key.as_deref() else {
            return Ok(KeyStep::Go(None));
        };
        match self
            .store
            .claim_idempotency_key(user_id, key, &fingerprint(request), unix_now())
            .await?
        {
            Claimed::New(claim) => Ok(KeyStep::Go(Some(claim))),
            Claimed::Bound(transfer_id) => Ok(KeyStep::Replay(self.paid_by(transfer_id).await)),
            Claimed::Reused => Err(PaymentError::IdempotencyKeyReused),
            // `Claimed` may grow; anything else is a key still being worked on.
            _ => Err(PaymentError::IdempotencyKeyInProgress),
        }
    }

    /// The answer of the payment `transfer_id` as it stands now: pending
    /// while it waits for its broadcast, broadcast (or confirmed) after,
    /// refused if the node refused it.
    async fn paid_by(&self, transfer_id: i64) -> Result<Paid, PaymentError> {
        let t = self.store.transfer(transfer_id).await?.ok_or_else(|| {
            StoreError::Corrupt(format!(
                "idempotency key bound to missing transfer {transfer_id}"
            ))
        })?;
        let broadcast = match t.status {
            TransferStatus::Failed => return Err(PaymentError::BroadcastRejected),
            TransferStatus::Signed => self.store.broadcast_unmarked(t.id),
            _ => true,
        };
        let bet_id = match t.kind {
            TransferKind::Bet => self.store.bet_of_transfer(t.id).await?,
            _ => None,
        };
        Ok(Paid {
            transfer_id: t.id,
            bet_id,
            round_id: t.round_id,
            fee_sats: t.fee_sats,
            txid: t.txid()?,
            broadcast,
        })
    }

    /// Gives the key back when the request paid nothing, so that the
    /// client's retry is evaluated afresh (a key bound to a payment stays).
    async fn release_unpaid(&self, claim: Option<&KeyClaim>, result: &Result<Paid, PaymentError>) {
        let (Some(claim), Err(_)) = (claim, result) else {
            return;
        };
        if let Err(e) = self.store.release_idempotency_key(claim).await {
            // The claim then runs out with its lease.
            tracing::warn!(error = %e, "releasing an idempotency key failed");
        }
    }

    /// What the payment reads before it signs; refused for a `session`
    /// whose token version is not the stored one read with it, then when
    /// paused (the order of the answers of an authenticated request).
    async fn open_context(
        &self,
        user_id: i64,
        session: Option<SignedSession>,
    ) -> Result<PaymentContext, PaymentError> {
        let ctx = self.store.payment_context(user_id).await?;
        if let Some(session) = session {
            session
                .check(ctx.user.map(|u| u.token_version))
                .map_err(PaymentError::Session)?;
        }
        if ctx.config.paused {
            return Err(PaymentError::Paused);
        }
        Ok(ctx)
    }

    async fn user(&self, user_id: i64) -> Result<UserRow, PaymentError> {
        self.store
            .user_by_id(user_id)
            .await?
            .ok_or(PaymentError::UnknownUser)
    }

    /// The sum of `me`'s spendable coins beyond `outputs`, the coins a
    /// payment read: zero unless the read was cut at its limit
    /// ([`crate::domain::settings::PAYMENT_COINS_READ`]).
    async fn unread_sats(
        &self,
        me: &Payer,
        config: &ServiceConfig,
        outputs: &[Coin],
    ) -> Result<i64, PaymentError> {
        if outputs.len() <= MAX_TX_INPUTS {
            return Ok(0);
        }
        let read: i64 = outputs.iter().map(|o| o.amount_sats).sum();
        let all = self
            .store
            .spendable_sum_at(
                me.id,
                config.deposit_confirmations,
                me.tip_height.unwrap_or(0),
            )
            .await?;
        Ok((all - read).max(0))
    }

    /// Spends the user's confirmed outputs whole to `to`, change back, writes the
    /// intent before the broadcast (the crash-safety rule), then broadcasts it.
    /// `coins` are the user's spendable outputs read with the context (the
    /// first attempt's selection).
    /// An output taken by a concurrent request between selection and write makes
    /// it select again, a few times, then answer `funds_busy`.
    async fn pay_from_user(
        &self,
        req: &PaymentRequest<'_>,
        coins: Vec<Coin>,
    ) -> Result<Paid, PaymentError> {
        let (me, config, amount_sats) = (req.me, req.config, req.amount_sats);
        let (kind, round_id, address) = match req.dest {
            Destination::Pot { round_id } => (TransferKind::Bet, Some(round_id), None),
            Destination::Address(a) => (TransferKind::Withdrawal, None, Some(a.to_string())),
        };
        let wallet = self.engine.wallet().clone();
        let tip_height = me.tip_height.and_then(|h| u32::try_from(h).ok());
        let mut first = Some(coins);
        for attempt in 0..SPEND_ATTEMPTS {
            let outputs = match first.take() {
                Some(coins) => coins,
                None => {
                    self.store
                        .spendable_outputs_at(
                            me.id,
                            config.deposit_confirmations,
                            me.tip_height.unwrap_or(0),
                        )
                        .await?
                }
            };
            // At most one transaction's worth of coins and one more is read:
            // with more, the payer holds coins beyond them, summed (once per
            // attempt, only then) so that a refusal names the whole balance.
            let unread_sats = self.unread_sats(me, config, &outputs).await?;
            // Coins that cover a debt are not the user's to spend. The first
            // attempt uses the debt read with the context; a retry reads it
            // again.
            let debt_sats = if attempt == 0 {
                me.debt_sats
            } else {
                self.store.user_debt(me.id).await?
            };
            let coins_sats = outputs.iter().map(|o| o.amount_sats).sum::<i64>() + unread_sats;
            refuse_debt(debt_sats, coins_sats, amount_sats, 0)?;
            let signed = spend::user_payment(
                &wallet,
                spend::UserPayment {
                    user_id: me.id,
                    path: me.key_path,
                    script: &me.script,
                    outputs: &outputs,
                    to: req.to,
                    amount_sats,
                    fee_rate_sat_vb: config.fee_rate_sat_vb,
                    kind,
                    round_id,
                    address: address.clone(),
                    tip_height,
                    unread_sats,
                },
            )
            .map_err(|e| spend_refusal(e, amount_sats))?;
            refuse_debt(debt_sats, coins_sats, amount_sats, signed.intent.fee_sats)?;
            // The deadline and the write race here, once: a request whose
            // deadline passed first writes nothing.
            if !req.opts.gate.begin_write() {
                return Err(req.opts.gate.timed_out());
            }
            let Some((bet_id, transfer_id)) =
                self.write_payment(req, &signed.intent, round_id).await?
            else {
                continue;
            };
            let paid = Paid {
                transfer_id,
                bet_id,
                round_id,
                fee_sats: signed.intent.fee_sats,
                txid: signed.intent.txid,
                broadcast: false,
            };
            return self.send_written(req.opts, kind, paid, signed.tx).await;
        }
        Err(PaymentError::FundsBusy)
    }

    /// Writes a signed payment: its `(bet id, transfer id)`, or `None` when
    /// a coin it spends was taken meanwhile (select again). A write whose
    /// acknowledgement was lost is read back before it is answered.
    async fn write_payment(
        &self,
        req: &PaymentRequest<'_>,
        intent: &crate::domain::money::Intent,
        round_id: Option<i64>,
    ) -> Result<Option<(Option<i64>, i64)>, PaymentError> {
        let written = match (req.dest, req.claim) {
            // A keyed bet is written alone, binding its key in the same
            // transaction; the group's statement knows no keys.
            (Destination::Pot { .. }, Some(claim)) => self
                .store
                .place_bet_keyed(intent, Some(claim))
                .await
                .map(|(bet, transfer)| (Some(bet), transfer)),
            (Destination::Pot { .. }, None) => self
                .store
                .place_bet(intent)
                .await
                .map(|(bet, transfer)| (Some(bet), transfer)),
            (Destination::Address(_), claim) => self
                .store
                .record_withdrawal_keyed(intent, claim)
                .await
                .map(|transfer| (None, transfer)),
        };
        let written = match written {
            // A failure that is no refusal may be a commit whose
            // acknowledgement was lost: the payment may be saved, and
            // the worker would broadcast it. Read it back before
            // answering.
            Err(e @ LedgerError::Store(_)) => match self.written_anyway(&intent.txid).await {
                Ok(Some(ids)) => {
                    tracing::warn!(transfer = ids.1, txid = %intent.txid, error = %e,
                        "the payment's write failed but it was saved");
                    Ok(ids)
                }
                Ok(None) => Err(e),
                Err(read) => {
                    tracing::error!(txid = %intent.txid, error = %read,
                        "the payment's write failed and cannot be read back");
                    return Err(PaymentError::OutcomeUnknown {
                        txid: intent.txid,
                        source: e,
                    });
                }
            },
            other => other,
        };
        match written {
            Ok(ids) => Ok(Some(ids)),
            Err(LedgerError::IdempotencyClaimLost) => Err(PaymentError::IdempotencyKeyInProgress),
            Err(LedgerError::Paused) => Err(PaymentError::Paused),
            Err(LedgerError::OutputTaken(_)) => Ok(None),
            Err(LedgerError::RoundFull { round_id, max_bets }) => {
                Err(PaymentError::RoundFull { round_id, max_bets })
            }
            Err(LedgerError::UserShareFull {
                round_id, max_bets, ..
            }) => Err(PaymentError::RoundShareFull { round_id, max_bets }),
            Err(LedgerError::WrongStatus { .. }) => Err(PaymentError::RoundNotOpen {
                round_id: round_id.unwrap_or_default(),
                status: RoundStatus::Closing,
            }),
            Err(e) => Err(PaymentError::Ledger(e)),
        }
    }

    /// Broadcasts a payment that is written (durable): a chain that cannot
    /// be reached leaves it signed and the worker broadcasts it later, so
    /// the answer is "accepted, pending" rather than an error the client
    /// would retry (and pay twice). The transaction just signed is sent as
    /// it is, not read back from the row just written.
    async fn send_written(
        &self,
        opts: &PayOptions,
        kind: TransferKind,
        mut paid: Paid,
        tx: bitcoin::Transaction,
    ) -> Result<Paid, PaymentError> {
        opts.gate.saved(&paid);
        crash_point(match kind {
            TransferKind::Bet => "bet_signed",
            _ => "withdrawal_signed",
        });
        paid.broadcast = match self
            .engine
            .broadcast_signed(paid.transfer_id, kind, &paid.txid, tx, Mark::Soon)
            .await
        {
            Ok(true) => true,
            Ok(false) => {
                self.engine.notify().await;
                return Err(PaymentError::BroadcastRejected);
            }
            Err(e) => {
                tracing::warn!(transfer = paid.transfer_id, error = %e, "broadcast deferred; the worker retries");
                false
            }
        };
        self.engine.notify().await;
        Ok(paid)
    }

    /// After a write that failed without a refusal: the payment's `(bet
    /// id, transfer id)` if its transaction `txid` was saved all the same
    /// (a lost commit acknowledgement), `None` if it was not.
    async fn written_anyway(&self, txid: &Txid) -> Result<Option<(Option<i64>, i64)>, StoreError> {
        let Some(t) = self.store.transfer_by_txid(txid).await? else {
            return Ok(None);
        };
        if t.status == TransferStatus::Failed {
            return Ok(None);
        }
        let bet_id = match t.kind {
            TransferKind::Bet => self.store.bet_of_transfer(t.id).await?,
            _ => None,
        };
        Ok(Some((bet_id, t.id)))
    }

    /// Development chain only: sends user `user_id` `amount_sats` test coins and
    /// mines until they are credited. Returns the deposit txid.
    ///
    /// # Errors
    /// [`PaymentError::UnknownUser`], chain or engine failures.
    pub async fn faucet(
        &self,
        dev: chain::DevChain,
        user_id: i64,
        amount_sats: i64,
    ) -> Result<bitcoin::Txid, PaymentError> {
        let me = self.user(user_id).await?;
        let (_, script) = spend::user_key(self.engine.wallet(), me.derivation_index)
            .map_err(PaymentError::Spend)?;
        let confirmations = self
            .store
            .config()
            .await?
            .deposit_confirmations
            .clamp(1, 100) as u32;
        let amount = bitcoin::Amount::from_sat(u64::try_from(amount_sats).unwrap_or(0));
        let txid = tokio::task::spawn_blocking(move || {
            let txid = dev.faucet(&script, amount)?;
            let miner = dev.faucet_script().to_owned();
            dev.mine(confirmations, &miner)?;
            Ok::<_, chain::DevChainError>(txid)
        })
        .await
        .map_err(PaymentError::FaucetTask)?
        .map_err(PaymentError::DevChain)?;
        self.engine.run_once().await.map_err(PaymentError::Engine)?;
        Ok(txid)
    }
}
