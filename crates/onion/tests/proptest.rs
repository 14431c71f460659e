//! Random routes: every hop peels exactly its own payload, only the last sees itself as final, and no one else can peel a layer.
// Test code: a failed unwrap is the run failing, with its message.
#![allow(clippy::unwrap_used)]

use onion::{build, peel, Hop, Next, PeelError};
use proptest::prelude::*;
use secp256k1::{PublicKey, Secp256k1, SecretKey};

fn secret() -> impl Strategy<Value = SecretKey> {
    any::<[u8; 32]>().prop_filter_map("not a valid key", |b| SecretKey::from_slice(&b).ok())
}

/// 1 to 20 hops, each with a node key and a payload sized so that the route fits 1300 bytes.
fn route() -> impl Strategy<Value = Vec<(SecretKey, Vec<u8>)>> {
    (1usize..=20).prop_flat_map(|n| {
        // 35 bytes per hop at most go to the length prefix and the HMAC.
        let most = 1300 / n - 35;
        proptest::collection::vec(
            (secret(), proptest::collection::vec(any::<u8>(), 2..=most)),
            n,
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_hop_peels_exactly_its_payload(
        route in route(),
        session in secret(),
        stranger in secret(),
        ad in any::<[u8; 32]>(),
    ) {
        let secp = Secp256k1::new();
        let hops: Vec<Hop<'_>> = route
            .iter()
            .map(|(key, payload)| Hop { node_id: PublicKey::from_secret_key(&secp, key), payload })
            .collect();
        let built = build(&secp, &session, &hops, &ad).unwrap();
        let mut packet = built.packet;
        for (i, (key, payload)) in route.iter().enumerate() {
            if route.iter().all(|(k, _)| *k != stranger) {
                prop_assert_eq!(peel(&secp, &stranger, &packet, &ad).unwrap_err(), PeelError::Hmac);
            }
            let peeled = peel(&secp, key, &packet, &ad).unwrap();
            prop_assert_eq!(&peeled.payload, payload, "hop {}", i);
            prop_assert_eq!(peeled.shared_secret, built.shared_secrets[i]);
            match peeled.next {
                Next::Forward(next) => {
                    prop_assert!(i + 1 < route.len(), "the last hop {} forwards", i);
                    packet = next;
                }
                Next::Final => prop_assert_eq!(i + 1, route.len(), "hop {} is final", i),
            }
        }
    }
}
