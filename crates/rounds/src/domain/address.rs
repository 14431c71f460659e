//! Deposit-address derivation and address validation behind the `AddressBook` trait, implemented with the shared HD wallet.

use bitcoin::Network;

/// Why an address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddressError {
    /// Not an address at all.
    #[error("malformed address")]
    Malformed,
    /// A valid address of another network.
    #[error("address is for another network (expected {expected})")]
    WrongNetwork {
        /// The service's network.
        expected: Network,
    },
    /// Derivation failed (index out of range).
    #[error("derivation failed: {0}")]
    Derivation(String),
}

/// Where user addresses come from and how addresses are checked. The same
/// validator serves the fee address and withdrawal addresses.
pub trait AddressBook: Send + Sync + 'static {
    /// The deposit address of derivation index `index`.
    ///
    /// # Errors
    /// [`AddressError::Derivation`].
    fn user_address(&self, index: u32) -> Result<String, AddressError>;
    /// The service's own default fee address (a branch separate from users).
    ///
    /// # Errors
    /// [`AddressError::Derivation`].
    fn default_fee_address(&self) -> Result<String, AddressError>;
    /// Checks that `address` is a well-formed address of the service's network.
    ///
    /// # Errors
    /// [`AddressError::Malformed`] or [`AddressError::WrongNetwork`].
    fn validate(&self, address: &str) -> Result<(), AddressError>;
}

/// The derivation branch (below the BIP84 account) of the service's own
/// default fee address, apart from users' receive branch 0 and change branch 1.
pub const FEE_BRANCH: u32 = 2;

/// Addresses from the shared HD wallet (`crates/wallet`): user `i` at
/// `m/84'/coin'/0'/0/i`, the default fee address at `m/84'/coin'/0'/2/0`;
/// validation by the wallet's validator (the same one withdrawals use).
pub struct Bip84AddressBook {
    wallet: std::sync::Arc<wallet::Wallet>,
}

impl std::fmt::Debug for Bip84AddressBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bip84AddressBook")
            .field("network", &self.wallet.network())
            .finish_non_exhaustive()
    }
}

impl Bip84AddressBook {
    /// Builds the book from a wallet seed (16–64 bytes).
    ///
    /// # Errors
    /// [`AddressError::Derivation`] for a seed of bad length.
    pub fn from_seed(seed: &[u8], network: Network) -> Result<Self, AddressError> {
        let wallet = wallet::Wallet::from_seed(seed, network)
            .map_err(|e| AddressError::Derivation(e.to_string()))?;
        Ok(Self {
            wallet: std::sync::Arc::new(wallet),
        })
    }

    /// The book of a loaded wallet (the one that signs).
    pub fn new(wallet: std::sync::Arc<wallet::Wallet>) -> Self {
        Self { wallet }
    }

    fn derive(&self, branch: u32, index: u32) -> Result<String, AddressError> {
        self.wallet
            .derive_address(branch, index)
            .map(|a| a.to_string())
            .map_err(|e| AddressError::Derivation(e.to_string()))
    }
}

impl AddressBook for Bip84AddressBook {
    fn user_address(&self, index: u32) -> Result<String, AddressError> {
        self.derive(wallet::RECEIVE_BRANCH, index)
    }

    fn default_fee_address(&self) -> Result<String, AddressError> {
        self.derive(FEE_BRANCH, 0)
    }

    fn validate(&self, address: &str) -> Result<(), AddressError> {
        match wallet::validate_address(address, self.wallet.network()) {
            Ok(_) => Ok(()),
            Err(wallet::AddressError::WrongNetwork { expected, .. }) => {
                Err(AddressError::WrongNetwork { expected })
            }
            Err(_) => Err(AddressError::Malformed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book(network: Network) -> Bip84AddressBook {
        Bip84AddressBook::from_seed(&[7u8; 32], network).unwrap()
    }

    #[test]
    fn bip84_test_vector_first_receive_address() {
        // BIP84's published vector: mnemonic "abandon … about", m/84'/0'/0'/0/0.
        let seed = hex::decode("5eb00bbddcf069084889a8ab9155568165f5c453ccb85e70811aaed6f6da5fc19a5ac40b389cd370d086206dec8aa6c43daea6690f20ad3d8d48b2d2ce9e38e4").unwrap();
        let b = Bip84AddressBook::from_seed(&seed, Network::Bitcoin).unwrap();
        assert_eq!(
            b.user_address(0).unwrap(),
            "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu"
        );
        assert_eq!(
            b.user_address(1).unwrap(),
            "bc1qnjg0jd8228aq7egyzacy8cys3knf9xvrerkf9g"
        );
    }

    #[test]
    fn addresses_are_distinct_and_valid_for_own_network() {
        let b = book(Network::Regtest);
        let a0 = b.user_address(0).unwrap();
        let a1 = b.user_address(1).unwrap();
        assert_ne!(a0, a1);
        assert!(a0.starts_with("bcrt1q"));
        assert_ne!(b.default_fee_address().unwrap(), a0);
        assert_eq!(b.validate(&a0), Ok(()));
        assert_eq!(b.validate(&b.default_fee_address().unwrap()), Ok(()));
    }

    #[test]
    fn other_network_and_malformed_are_told_apart() {
        let b = book(Network::Regtest);
        let mainnet = book(Network::Bitcoin).user_address(0).unwrap();
        assert_eq!(
            b.validate(&mainnet),
            Err(AddressError::WrongNetwork {
                expected: Network::Regtest
            })
        );
        assert_eq!(
            b.validate("bcrt1qnotanaddress"),
            Err(AddressError::Malformed)
        );
        assert_eq!(b.validate(""), Err(AddressError::Malformed));
    }
}
