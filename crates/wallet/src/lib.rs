//! The HD wallet shared by the node and the rounds service: BIP39 seeds, BIP84
//! P2WPKH keys and addresses, address validation, transaction building with a
//! fee rate and a dust rule, and segwit v0 signing.
//!
//! Money is always [`bitcoin::Amount`] and fee rates [`bitcoin::FeeRate`].

pub mod address;
pub mod hd;
pub mod seed;
pub mod tx;

pub use address::{validate_address, AddressError};
pub use hd::{
    mnemonic_from_entropy, DerivedKey, KeyPath, Wallet, WalletError, CHANGE_BRANCH, RECEIVE_BRANCH,
};
pub use seed::{load_or_create as load_or_create_seed, SeedFileError};
pub use tx::{
    build_transaction, build_transaction_at, dust_threshold, min_change, p2wpkh_input_vsize,
    sign_p2wpkh_input, signed_vsize, BuildError, BuiltTransaction, SignError, SpendError,
    SpendableOutput,
};

pub use bitcoin;
