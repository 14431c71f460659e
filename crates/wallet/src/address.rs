//! Address validation for one configured network, with distinct errors for a
//! malformed string and an address of another network.

use bitcoin::address::NetworkUnchecked;
use bitcoin::{Address, Network};

/// Why a string is not a usable address on the configured network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddressError {
    /// The string is empty (after trimming surrounding white space).
    #[error("address is empty")]
    Empty,
    /// The string is not a Bitcoin address at all (bad encoding, checksum, length, …).
    #[error("malformed address {address:?}: {reason}")]
    Malformed {
        /// The offending input.
        address: String,
        /// What the parser said.
        reason: String,
    },
    /// A well-formed address that belongs to another network.
    #[error("address {address:?} is not valid on {expected}")]
    WrongNetwork {
        /// The offending input.
        address: String,
        /// The network the service runs on.
        expected: Network,
    },
}

/// Parses `address` and checks that it belongs to `network`.
///
/// Every standard address type is accepted (P2PKH, P2SH, P2WPKH, P2WSH, P2TR).
/// Regtest shares base58 prefixes with testnet and signet, so a base58 testnet
/// address is valid on regtest too, exactly as Bitcoin Core decides; bech32
/// addresses carry their own prefix (`bcrt1` on regtest).
///
/// # Errors
/// [`AddressError::Empty`], [`AddressError::Malformed`] for strings that do
/// not parse, [`AddressError::WrongNetwork`] for addresses of another network.
pub fn validate_address(address: &str, network: Network) -> Result<Address, AddressError> {
    let trimmed = address.trim();
    if trimmed.is_empty() {
        return Err(AddressError::Empty);
    }
    let unchecked: Address<NetworkUnchecked> =
        trimmed
            .parse()
            .map_err(|e: bitcoin::address::ParseError| AddressError::Malformed {
                address: trimmed.to_owned(),
                reason: e.to_string(),
            })?;
    if !unchecked.is_valid_for_network(network) {
        return Err(AddressError::WrongNetwork {
            address: trimmed.to_owned(),
            expected: network,
        });
    }
    Ok(unchecked.assume_checked())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_addresses_of_the_configured_network() {
        let a = validate_address(
            "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080",
            Network::Regtest,
        )
        .unwrap();
        assert_eq!(
            a.to_string(),
            "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"
        );
        validate_address(
            "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4",
            Network::Bitcoin,
        )
        .unwrap();
        validate_address("1BvBMSEYstWetqTFn5Au4m4GFg7xJaNVN2", Network::Bitcoin).unwrap();
        validate_address(
            " tb1qw508d6qejxtdg4y5r3zarvary0c5xw7kxpjzsx ",
            Network::Testnet,
        )
        .unwrap();
    }

    #[test]
    fn other_network_is_wrong_network() {
        let err = validate_address(
            "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4",
            Network::Regtest,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            AddressError::WrongNetwork {
                expected: Network::Regtest,
                ..
            }
        ));
        let err = validate_address(
            "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080",
            Network::Bitcoin,
        )
        .unwrap_err();
        assert!(matches!(err, AddressError::WrongNetwork { .. }));
        let err =
            validate_address("1BvBMSEYstWetqTFn5Au4m4GFg7xJaNVN2", Network::Regtest).unwrap_err();
        assert!(matches!(err, AddressError::WrongNetwork { .. }));
    }

    #[test]
    fn malformed_strings_are_malformed() {
        for s in [
            "hello",
            "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt081", // bad checksum
            "1BvBMSEYstWetqTFn5Au4m4GFg7xJaNVN3",           // bad base58 checksum
            "bcrt1q",
        ] {
            let err = validate_address(s, Network::Regtest).unwrap_err();
            assert!(
                matches!(err, AddressError::Malformed { .. }),
                "{s}: {err:?}"
            );
        }
        assert_eq!(
            validate_address("  ", Network::Regtest).unwrap_err(),
            AddressError::Empty
        );
    }
}
