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
    /// A well-formed address whose output nobody could spend today: a witness
    /// version 2–16 (no soft fork defines them; Core relays them, but coins
    /// sent there are at the mercy of a future fork) or a version-1 program
    /// that is not a 32-byte taproot key.
    #[error("address {address:?} pays witness version {version} with a {program_len}-byte program, which is not spendable")]
    Unspendable {
        /// The offending input.
        address: String,
        /// Its witness version.
        version: u8,
        /// Length of its witness program.
        program_len: usize,
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
    let checked = unchecked.assume_checked();
    let script = checked.script_pubkey();
    if let Some(version) = script.witness_version() {
        let v = version.to_num();
        let program_len = script.len().saturating_sub(2);
        let spendable = match v {
            0 => program_len == 20 || program_len == 32,
            1 => program_len == 32,
            _ => false,
        };
        if !spendable {
            return Err(AddressError::Unspendable {
                address: trimmed.to_owned(),
                version: v,
                program_len,
            });
        }
    }
    Ok(checked)
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

    /// Valid addresses (BIP350) that no one can spend today.
    #[test]
    fn future_witness_versions_and_odd_v1_programs_are_refused() {
        use bitcoin::{WitnessProgram, WitnessVersion};
        for (version, len) in [
            (WitnessVersion::V1, 40usize),
            (WitnessVersion::V1, 20),
            (WitnessVersion::V2, 16),
            (WitnessVersion::V16, 2),
            (WitnessVersion::V3, 32),
        ] {
            let program = WitnessProgram::new(version, &vec![7u8; len]).unwrap();
            let s = Address::from_witness_program(program, bitcoin::KnownHrp::Regtest).to_string();
            let err = validate_address(&s, Network::Regtest).unwrap_err();
            assert!(
                matches!(err, AddressError::Unspendable { version: v, program_len, .. }
                    if v == version.to_num() && program_len == len),
                "{s}: {err:?}"
            );
        }
        // Taproot itself is fine (BIP350 vector).
        validate_address(
            "bc1p0xlxvlhemja6c4dqv22uapctqupfhlxm9h8z3k2e72q4k9hcz7vqzk5jj0",
            Network::Bitcoin,
        )
        .unwrap();
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
