//! The users' payments as the HTTP layer asks for them: bets, withdrawals and the development faucet, each one call of the payment workflow in [`crate::service::payments`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::domain::address::AddressBook;
use crate::service::accounts::SignedSession;
use crate::service::engine::Engine;
use crate::service::payments::{Paid, PayOptions, PaymentError, Payments, Stage, WriteGate};
use crate::store::Store;

/// An owned handle over [`Payments`] with what its calls need besides the user's input.
#[derive(Clone)]
pub struct Cashier {
    store: Store,
    engine: Arc<Engine>,
    addresses: Arc<dyn AddressBook>,
    max_bet_input_fee_percent: u32,
    dev_chain: Option<chain::DevChain>,
    request_timeout: Duration,
}

impl std::fmt::Debug for Cashier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cashier")
            .field("max_bet_input_fee_percent", &self.max_bet_input_fee_percent)
            .field("faucet", &self.dev_chain.is_some())
            .finish_non_exhaustive()
    }
}

impl Cashier {
    /// The service; `dev_chain` enables the faucet.
    pub fn new(
        store: Store,
        engine: Arc<Engine>,
        addresses: Arc<dyn AddressBook>,
        max_bet_input_fee_percent: u32,
        dev_chain: Option<chain::DevChain>,
        request_timeout: Duration,
    ) -> Self {
        Self {
            store,
            engine,
            addresses,
            max_bet_input_fee_percent,
            dev_chain,
            request_timeout,
        }
    }

    /// Whether the faucet exists (only with the embedded development chain).
    pub fn has_faucet(&self) -> bool {
        self.dev_chain.is_some()
    }

    /// Bets `amount_sats` for the user of `session` in the current round
    /// (the session's token version is checked with the payment's read),
    /// answering within the request time-out (see `Cashier::answer`);
    /// `key` is the client's `Idempotency-Key`.
    ///
    /// # Errors
    /// A [`PaymentError`] saying why nothing was paid.
    pub async fn bet(
        &self,
        session: SignedSession,
        amount_sats: i64,
        key: Option<String>,
    ) -> Result<Paid, PaymentError> {
        let opts = self.options(key);
        let me = self.clone();
        let task_opts = opts.clone();
        self.answer(&opts, async move {
            Payments::new(&me.store, &me.engine)
                .bet(
                    session,
                    amount_sats,
                    me.max_bet_input_fee_percent,
                    &task_opts,
                )
                .await
        })
        .await
    }

    /// Withdraws `amount_sats` of the user of `session` to `address`, as
    /// [`Cashier::bet`] answers.
    ///
    /// # Errors
    /// A [`PaymentError`] saying why nothing was paid.
    pub async fn withdraw(
        &self,
        session: SignedSession,
        address: String,
        amount_sats: i64,
        key: Option<String>,
    ) -> Result<Paid, PaymentError> {
        let opts = self.options(key);
        let me = self.clone();
        let task_opts = opts.clone();
        self.answer(&opts, async move {
            Payments::new(&me.store, &me.engine)
                .withdraw(
                    me.addresses.as_ref(),
                    session,
                    &address,
                    amount_sats,
                    &task_opts,
                )
                .await
        })
        .await
    }

    fn options(&self, key: Option<String>) -> PayOptions {
        PayOptions {
            key,
            gate: WriteGate::new(self.request_timeout.as_secs()),
        }
    }

    /// Runs `payment` as a task of its own, so that neither the request's
    /// deadline nor a client hanging up can cut it between its write and
    /// its broadcast, and answers by the request time-out: the payment's
    /// outcome if it came, else — if its intent is saved — the payment as
    /// pending (its broadcast goes on, and the worker finishes it), else —
    /// if its write has started — the outcome of that write, else
    /// [`PaymentError::TimedOut`] (the gate then keeps it from ever writing).
    async fn answer(
        &self,
        opts: &PayOptions,
        payment: impl Future<Output = Result<Paid, PaymentError>> + Send + 'static,
    ) -> Result<Paid, PaymentError> {
        let gate = &opts.gate;
        let mut stages = gate.watch();
        let mut task = tokio::spawn(payment);
        let deadline = tokio::time::sleep(self.request_timeout);
        tokio::select! {
            done = &mut task => return joined(gate, done),
            () = deadline => {}
        }
        match gate.expire() {
            Stage::Saved(paid) => return Ok(paid),
            Stage::Expired | Stage::Preparing => return Err(gate.timed_out()),
            Stage::Writing => {}
        }
        // The write has started: its outcome decides, however long it takes.
        loop {
            tokio::select! {
                done = &mut task => return joined(gate, done),
                changed = stages.changed() => {
                    if let Stage::Saved(paid) = &*stages.borrow_and_update() {
                        return Ok(paid.clone());
                    }
                    if changed.is_err() {
                        // The gate lives as long as `opts`: unreachable,
                        // but the task still answers.
                        return joined(gate, (&mut task).await);
                    }
                }
            }
        }
    }
    /// Pays user `user_id` `amount_sats` test coins and mines until they are
    /// credited; `None` without the development chain.
    ///
    /// # Errors
    /// A [`PaymentError`].
    pub async fn faucet(
        &self,
        user_id: i64,
        amount_sats: i64,
    ) -> Option<Result<bitcoin::Txid, PaymentError>> {
        let dev = self.dev_chain.clone()?;
        Some(
            Payments::new(&self.store, &self.engine)
                .faucet(dev, user_id, amount_sats)
                .await,
        )
    }
}

/// The payment task's answer; a task that panicked after its intent was
/// saved still answers with the saved payment.
fn joined(
    gate: &WriteGate,
    done: Result<Result<Paid, PaymentError>, tokio::task::JoinError>,
) -> Result<Paid, PaymentError> {
    match done {
        Ok(answer) => answer,
        Err(e) => match gate.expire() {
            Stage::Saved(paid) => Ok(paid),
            _ => Err(PaymentError::Aborted(e)),
        },
    }
}
