//! BIP39 seeds and BIP32/BIP84 key derivation: `m/84'/coin'/account'/branch/index`.

use bitcoin::bip32::{ChildNumber, DerivationPath, Xpriv, Xpub};
use bitcoin::secp256k1::{All, Secp256k1, SecretKey};
use bitcoin::{Address, CompressedPublicKey, Network, NetworkKind, PrivateKey};

/// Branch of external (receive) addresses, as in BIP44/BIP84.
pub const RECEIVE_BRANCH: u32 = 0;
/// Branch of internal (change) addresses, as in BIP44/BIP84.
pub const CHANGE_BRANCH: u32 = 1;

/// Why a wallet could not be made or a key not derived.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WalletError {
    /// The phrase is not a valid BIP39 English mnemonic.
    #[error("invalid mnemonic: {0}")]
    Mnemonic(String),
    /// Entropy for a new mnemonic must be 16, 20, 24, 28 or 32 bytes.
    #[error("invalid mnemonic entropy length {0} bytes")]
    EntropyLength(usize),
    /// The seed must be 16 to 64 bytes (BIP32).
    #[error("invalid seed length {0} bytes (BIP32 wants 16 to 64)")]
    SeedLength(usize),
    /// A branch or index at or above 2^31 (those are hardened numbers).
    #[error("derivation number {0} out of range (must be below 2^31)")]
    IndexOutOfRange(u32),
    /// BIP32 derivation failed (probability ~2^-127 per step).
    #[error("key derivation failed: {0}")]
    Derivation(String),
}

/// Where a key sits below the account: `branch/index` (both unhardened).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyPath {
    /// 0 = receive, 1 = change, other values for service-specific branches.
    pub branch: u32,
    /// Address index within the branch.
    pub index: u32,
}

impl KeyPath {
    /// A path on the receive branch.
    pub fn receive(index: u32) -> Self {
        Self {
            branch: RECEIVE_BRANCH,
            index,
        }
    }
}

/// A derived key with its BIP84 address.
#[derive(Debug, Clone)]
pub struct DerivedKey {
    /// Position below the account.
    pub path: KeyPath,
    /// Full derivation path from the master key.
    pub full_path: DerivationPath,
    /// The private key.
    pub secret_key: SecretKey,
    /// The compressed public key.
    pub public_key: CompressedPublicKey,
    /// The P2WPKH address on the wallet's network.
    pub address: Address,
}

/// An HD wallet for one network: BIP84 account 0 of a BIP32 master key.
///
/// The wallet holds keys only; which outputs it owns is the caller's
/// bookkeeping (the services keep that in their stores).
#[derive(Clone)]
pub struct Wallet {
    network: Network,
    account: Xpriv,
    account_path: DerivationPath,
    secp: Secp256k1<All>,
}

impl std::fmt::Debug for Wallet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("Wallet")
            .field("network", &self.network)
            .field("account_path", &self.account_path)
            .finish_non_exhaustive()
    }
}

/// Makes a new English BIP39 mnemonic from caller-supplied entropy
/// (16 bytes → 12 words, 32 bytes → 24 words).
///
/// # Errors
/// [`WalletError::EntropyLength`] for lengths BIP39 does not allow.
pub fn mnemonic_from_entropy(entropy: &[u8]) -> Result<String, WalletError> {
    bip39::Mnemonic::from_entropy(entropy)
        .map(|m| m.to_string())
        .map_err(|_| WalletError::EntropyLength(entropy.len()))
}

impl Wallet {
    /// A wallet from a BIP39 English mnemonic and optional passphrase.
    ///
    /// # Errors
    /// [`WalletError::Mnemonic`] for a bad word, word count or checksum.
    pub fn from_mnemonic(
        phrase: &str,
        passphrase: &str,
        network: Network,
    ) -> Result<Self, WalletError> {
        let mnemonic = bip39::Mnemonic::parse_in(bip39::Language::English, phrase)
            .map_err(|e| WalletError::Mnemonic(e.to_string()))?;
        // The 64-byte seed is key material: wiped when dropped.
        let seed = zeroize::Zeroizing::new(mnemonic.to_seed(passphrase));
        Self::from_seed(seed.as_ref(), network)
    }

    /// A wallet from a raw BIP32 seed (16 to 64 bytes).
    ///
    /// # Errors
    /// [`WalletError::SeedLength`] for a seed of the wrong size.
    pub fn from_seed(seed: &[u8], network: Network) -> Result<Self, WalletError> {
        if !(16..=64).contains(&seed.len()) {
            return Err(WalletError::SeedLength(seed.len()));
        }
        let secp = Secp256k1::new();
        let kind = NetworkKind::from(network);
        let master =
            Xpriv::new_master(kind, seed).map_err(|e| WalletError::Derivation(e.to_string()))?;
        // BIP44 coin type: 0 on mainnet, 1 on every test network.
        let coin = if network == Network::Bitcoin { 0 } else { 1 };
        let account_path: DerivationPath = vec![
            ChildNumber::Hardened { index: 84 },
            ChildNumber::Hardened { index: coin },
            ChildNumber::Hardened { index: 0 },
        ]
        .into();
        let account = master
            .derive_priv(&secp, &account_path)
            .map_err(|e| WalletError::Derivation(e.to_string()))?;
        Ok(Self {
            network,
            account,
            account_path,
            secp,
        })
    }

    /// The network the wallet's addresses belong to.
    pub fn network(&self) -> Network {
        self.network
    }

    /// The account-level extended public key (`m/84'/coin'/0'`), for watch-only use.
    pub fn account_xpub(&self) -> Xpub {
        Xpub::from_priv(&self.secp, &self.account)
    }

    /// Derives the key at `branch/index` below the account.
    ///
    /// # Errors
    /// [`WalletError::IndexOutOfRange`] for numbers ≥ 2^31.
    pub fn derive(&self, path: KeyPath) -> Result<DerivedKey, WalletError> {
        let branch = ChildNumber::from_normal_idx(path.branch)
            .map_err(|_| WalletError::IndexOutOfRange(path.branch))?;
        let index = ChildNumber::from_normal_idx(path.index)
            .map_err(|_| WalletError::IndexOutOfRange(path.index))?;
        let rel: DerivationPath = vec![branch, index].into();
        let child = self
            .account
            .derive_priv(&self.secp, &rel)
            .map_err(|e| WalletError::Derivation(e.to_string()))?;
        let private = PrivateKey::new(child.private_key, self.network);
        let public_key = CompressedPublicKey::from_private_key(&self.secp, &private)
            .map_err(|e| WalletError::Derivation(e.to_string()))?;
        let address = Address::p2wpkh(&public_key, self.network);
        Ok(DerivedKey {
            path,
            full_path: self.account_path.extend(rel),
            secret_key: child.private_key,
            public_key,
            address,
        })
    }

    /// The P2WPKH address at `branch/index`.
    ///
    /// # Errors
    /// As [`Wallet::derive`].
    pub fn derive_address(&self, branch: u32, index: u32) -> Result<Address, WalletError> {
        Ok(self.derive(KeyPath { branch, index })?.address)
    }

    /// The secp256k1 context the wallet signs with.
    pub fn secp(&self) -> &Secp256k1<All> {
        &self.secp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // BIP84 test vector: "abandon … about", no passphrase, mainnet.
    const ABANDON: &str = "abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon about";

    #[test]
    fn bip84_vectors() {
        let w = Wallet::from_mnemonic(ABANDON, "", Network::Bitcoin).unwrap();
        assert_eq!(
            w.account_xpub().to_string(),
            "xpub6CatWdiZiodmUeTDp8LT5or8nmbKNcuyvz7WyksVFkKB4RHwCD3XyuvPEbvqAQY3rAPshWcMLoP2fMFMKHPJ4ZeZXYVUhLv1VMrjPC7PW6V"
        );
        assert_eq!(
            w.derive_address(0, 0).unwrap().to_string(),
            "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu"
        );
        assert_eq!(
            w.derive_address(0, 1).unwrap().to_string(),
            "bc1qnjg0jd8228aq7egyzacy8cys3knf9xvrerkf9g"
        );
        assert_eq!(
            w.derive_address(1, 0).unwrap().to_string(),
            "bc1q8c6fshw2dlwun7ekn9qwf37cu2rn755upcp6el"
        );
        let k = w.derive(KeyPath::receive(0)).unwrap();
        assert_eq!(k.full_path.to_string(), "84'/0'/0'/0/0");
    }

    #[test]
    fn regtest_addresses_use_bcrt_and_coin_type_one() {
        let w = Wallet::from_mnemonic(ABANDON, "", Network::Regtest).unwrap();
        let k = w.derive(KeyPath::receive(0)).unwrap();
        assert_eq!(k.full_path.to_string(), "84'/1'/0'/0/0");
        assert!(k.address.to_string().starts_with("bcrt1q"));
        // Same key as testnet's BIP84 vector path m/84'/1'/0'/0/0.
        let t = Wallet::from_mnemonic(ABANDON, "", Network::Testnet).unwrap();
        assert_eq!(
            t.derive_address(0, 0).unwrap().to_string(),
            "tb1q6rz28mcfaxtmd6v789l9rrlrusdprr9pqcpvkl"
        );
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let bad = ABANDON.replace("about", "abandon");
        assert!(matches!(
            Wallet::from_mnemonic(&bad, "", Network::Regtest),
            Err(WalletError::Mnemonic(_))
        ));
        assert_eq!(
            Wallet::from_seed(&[0u8; 8], Network::Regtest).unwrap_err(),
            WalletError::SeedLength(8)
        );
        let w = Wallet::from_seed(&[7u8; 32], Network::Regtest).unwrap();
        assert_eq!(
            w.derive_address(0, 1 << 31).unwrap_err(),
            WalletError::IndexOutOfRange(1 << 31)
        );
        assert_eq!(
            mnemonic_from_entropy(&[0u8; 15]).unwrap_err(),
            WalletError::EntropyLength(15)
        );
    }

    #[test]
    fn mnemonic_round_trip() {
        let phrase = mnemonic_from_entropy(&[0u8; 16]).unwrap();
        assert_eq!(phrase, ABANDON);
        let phrase = mnemonic_from_entropy(&[0xffu8; 32]).unwrap();
        assert_eq!(phrase.split(' ').count(), 24);
        Wallet::from_mnemonic(&phrase, "pass", Network::Regtest).unwrap();
    }
}
