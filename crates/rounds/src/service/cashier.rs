//! The users' payments as the HTTP layer asks for them: bets, withdrawals and the development faucet, each one call of the payment workflow in [`crate::service::payments`].

use std::sync::Arc;

use crate::domain::address::AddressBook;
use crate::service::accounts::SignedSession;
use crate::service::engine::Engine;
use crate::service::payments::{Paid, PaymentError, Payments};
use crate::store::Store;

/// An owned handle over [`Payments`] with what its calls need besides the user's input.
#[derive(Clone)]
pub struct Cashier {
    store: Store,
    engine: Arc<Engine>,
    addresses: Arc<dyn AddressBook>,
    max_bet_input_fee_percent: u32,
    dev_chain: Option<chain::DevChain>,
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
    ) -> Self {
        Self {
            store,
            engine,
            addresses,
            max_bet_input_fee_percent,
            dev_chain,
        }
    }

    /// Whether the faucet exists (only with the embedded development chain).
    pub fn has_faucet(&self) -> bool {
        self.dev_chain.is_some()
    }

    /// Bets `amount_sats` for the user of `session` in the current round
    /// (the session's token version is checked with the payment's read).
    ///
    /// # Errors
    /// A [`PaymentError`] saying why nothing was paid.
    pub async fn bet(
        &self,
        session: SignedSession,
        amount_sats: i64,
    ) -> Result<Paid, PaymentError> {
        Payments::new(&self.store, &self.engine)
            .bet(session, amount_sats, self.max_bet_input_fee_percent)
            .await
    }

    /// Withdraws `amount_sats` of user `user_id` to `address`.
    ///
    /// # Errors
    /// A [`PaymentError`] saying why nothing was paid.
    pub async fn withdraw(
        &self,
        user_id: i64,
        address: &str,
        amount_sats: i64,
    ) -> Result<Paid, PaymentError> {
        Payments::new(&self.store, &self.engine)
            .withdraw(self.addresses.as_ref(), user_id, address, amount_sats)
            .await
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
