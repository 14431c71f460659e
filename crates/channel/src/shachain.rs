//! Revocation preimages: the seed-derived shachain (PROTOCOL-NOTES §7) and the
//! compact O(log n) store of the counterparty's revealed preimages.
//!
//! Protocol index `n` (0 for the first commitment, +1 per update) maps to the
//! ccan/crypto/shachain index `!n`, so that successive preimages are revealed in
//! the order in which the compact store can absorb them (ccan `shachain_add_hash`).

use bitcoin_hashes::{sha256, Hash};
use wire::{Preimage, Sha256};

/// Derives from `from_hash` (the value at ccan index `from`) the value at ccan index `to`.
///
/// Only valid when [`can_derive`] holds.
fn derive(from: u64, to: u64, from_hash: [u8; 32]) -> [u8; 32] {
    let mut h = from_hash;
    let branches = from ^ to;
    let start = trailing_zeros(from);
    for i in (0..start).rev() {
        if (branches >> i) & 1 == 1 {
            h[(i / 8) as usize] ^= 1 << (i % 8);
            h = sha256::Hash::hash(&h).to_byte_array();
        }
    }
    h
}

/// Number of trailing zero bits, with 64 for zero (ccan convention: the seed derives everything).
fn trailing_zeros(x: u64) -> u32 {
    x.trailing_zeros()
}

/// Whether the value at ccan index `from` determines the value at ccan index `to`.
fn can_derive(from: u64, to: u64) -> bool {
    let tz = trailing_zeros(from);
    if tz >= 64 {
        return true;
    }
    let mask = !((1u64 << tz) - 1);
    (from ^ to) & mask == 0
}

/// `preimage(n)` of PROTOCOL-NOTES §7: `shachain_from_seed(seed, !n)`.
pub fn preimage_from_seed(seed: &[u8; 32], n: u64) -> Preimage {
    Preimage(derive(0, !n, *seed))
}

/// `revocation_hash(n)` = SHA256(preimage(n)).
pub fn revocation_hash_from_seed(seed: &[u8; 32], n: u64) -> Sha256 {
    preimage_from_seed(seed, n).hash()
}

/// Shachain levels between remembered nodes of [`SeedPreimages`]' walk.
const LEVEL_BITS: u32 = 8;
/// Remembered nodes: the levels 8, 16, …, 56 (level 64 is the seed itself).
const NODES: usize = (64 / LEVEL_BITS - 1) as usize;

/// Our own preimages, derived from the seed by walking the shachain from the top:
/// remembers the nodes on the way to the last index, every [`LEVEL_BITS`] levels, and
/// the preimages of the current and next commitments.
///
/// From the seed each preimage costs up to 64 hashes, and an update uses preimages
/// of two consecutive commitments several times; consecutive indices share all but
/// their lowest bits, so the walk from the remembered node costs at most 8 hashes,
/// and a remembered preimage none. Derived data: not serialised, equal to any other
/// (two channels with the same state are equal whatever they have derived), and its
/// `Debug` shows no secret. Valid for one seed only: the channel's, which never changes
/// (a restored channel starts with an empty one).
#[derive(Clone, Default)]
pub(crate) struct SeedPreimages {
    /// ccan index of the last walk, with the nodes on its path (`nodes[j]` is the value
    /// of that index with its lowest `LEVEL_BITS × (j + 1)` bits cleared); `None` before
    /// the first walk.
    path: Option<(u64, [[u8; 32]; NODES])>,
    /// Protocol index, preimage and revocation hash of up to two commitments.
    known: [Option<(u64, Preimage, Sha256)>; 2],
}

impl SeedPreimages {
    /// Remembers preimages `n` and `n + 1` (our current and next commitments).
    pub(crate) fn prepare(&mut self, seed: &[u8; 32], n: u64) {
        let want = [n, n.wrapping_add(1)];
        let mut next: [Option<(u64, Preimage, Sha256)>; 2] = [None, None];
        for (slot, m) in next.iter_mut().zip(want) {
            *slot = match self.find(m) {
                Some(k) => Some(k),
                None => {
                    let p = Preimage(self.walk(seed, !m));
                    Some((m, p, p.hash()))
                }
            };
        }
        self.known = next;
    }

    fn find(&self, n: u64) -> Option<(u64, Preimage, Sha256)> {
        self.known.iter().flatten().find(|k| k.0 == n).copied()
    }

    /// `preimage(n)`, remembered or derived from the seed.
    pub(crate) fn preimage(&self, seed: &[u8; 32], n: u64) -> Preimage {
        self.find(n)
            .map_or_else(|| preimage_from_seed(seed, n), |k| k.1)
    }

    /// `revocation_hash(n)`, remembered or derived from the seed.
    pub(crate) fn revocation_hash(&self, seed: &[u8; 32], n: u64) -> Sha256 {
        self.find(n)
            .map_or_else(|| revocation_hash_from_seed(seed, n), |k| k.2)
    }

    /// The value at ccan index `to`: the same hashes as `derive(0, to, seed)`, started
    /// from the lowest remembered node whose index shares `to`'s upper bits.
    fn walk(&mut self, seed: &[u8; 32], to: u64) -> [u8; 32] {
        let mut level = 64;
        let mut h = *seed;
        if let Some((last, nodes)) = &self.path {
            for (j, node) in nodes.iter().enumerate() {
                let l = LEVEL_BITS * (j as u32 + 1);
                if to >> l == last >> l {
                    level = l;
                    h = *node;
                    break;
                }
            }
        }
        let mut nodes = self.path.map_or([[0; 32]; NODES], |(_, n)| n);
        for i in (0..level).rev() {
            if (to >> i) & 1 == 1 {
                h[(i / 8) as usize] ^= 1 << (i % 8);
                h = sha256::Hash::hash(&h).to_byte_array();
            }
            if i % LEVEL_BITS == 0 && i > 0 {
                nodes[(i / LEVEL_BITS - 1) as usize] = h;
            }
        }
        self.path = Some((to, nodes));
        h
    }
}

impl PartialEq for SeedPreimages {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for SeedPreimages {}

impl std::fmt::Debug for SeedPreimages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SeedPreimages(..)")
    }
}

/// Why a revealed preimage was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShachainError {
    /// Preimages must arrive in order 0, 1, 2, …; this one came out of turn.
    #[error("revocation preimage {got} out of order (expected {expected}); close the channel")]
    OutOfOrder {
        /// The index that was offered.
        got: u64,
        /// The index that was expected.
        expected: u64,
    },
    /// The preimage does not derive the ones stored before: the peer is not using a shachain.
    #[error("revocation preimage {0} is inconsistent with earlier preimages; close the channel")]
    Inconsistent(u64),
}

/// One stored value: ccan index and its hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Known {
    index: u64,
    #[serde(with = "crate::stored_hex::bytes32")]
    hash: [u8; 32],
}

/// The counterparty's revealed revocation preimages in at most 65 slots.
///
/// Holds preimage(0..next) and answers any of them; see ccan/crypto/shachain.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct RevocationSecrets {
    known: Vec<Known>,
    next: u64,
}

impl RevocationSecrets {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The protocol index the next preimage must have.
    pub fn next_index(&self) -> u64 {
        self.next
    }

    /// Number of slots in use (at most 65: O(log n)).
    pub fn slots(&self) -> usize {
        self.known.len()
    }

    /// Checks preimage `n` without storing it.
    ///
    /// # Errors
    /// Out of order, or inconsistent with the stored preimages.
    pub fn check(&self, n: u64, preimage: &Preimage) -> Result<(), ShachainError> {
        if n != self.next {
            return Err(ShachainError::OutOfOrder {
                got: n,
                expected: self.next,
            });
        }
        let index = !n;
        let pos = trailing_zeros(index) as usize;
        for k in self.known.iter().take(pos) {
            if derive(index, k.index, preimage.0) != k.hash {
                return Err(ShachainError::Inconsistent(n));
            }
        }
        Ok(())
    }

    /// Stores preimage `n` (which must be the next one).
    ///
    /// # Errors
    /// As [`RevocationSecrets::check`]; nothing is stored then.
    pub fn insert(&mut self, n: u64, preimage: &Preimage) -> Result<(), ShachainError> {
        self.check(n, preimage)?;
        let index = !n;
        let pos = (trailing_zeros(index) as usize).min(64);
        let entry = Known {
            index,
            hash: preimage.0,
        };
        if pos < self.known.len() {
            self.known[pos] = entry;
        } else {
            // pos == len: the slots fill from the bottom in order.
            while self.known.len() < pos {
                self.known.push(entry);
            }
            self.known.push(entry);
        }
        self.next = n.wrapping_add(1);
        Ok(())
    }

    /// Preimage `n`, if it has been revealed.
    pub fn get(&self, n: u64) -> Option<Preimage> {
        if n >= self.next {
            return None;
        }
        let index = !n;
        self.known
            .iter()
            .find(|k| can_derive(k.index, index))
            .map(|k| Preimage(derive(k.index, index, k.hash)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vectors() -> serde_json::Value {
        let text = include_str!("../../../../shared/vectors/packets_and_encodings.json");
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn shachain_vectors() {
        let v = vectors();
        let sc = &v["shachain"];
        let seed: [u8; 32] = hex::decode(sc["seed"].as_str().unwrap())
            .unwrap()
            .try_into()
            .unwrap();
        let entries = sc["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 6);
        for e in entries {
            let n: u64 = e["index"].as_str().unwrap().parse().unwrap();
            let p = preimage_from_seed(&seed, n);
            assert_eq!(
                hex::encode(p.0),
                e["preimage"].as_str().unwrap(),
                "preimage {n}"
            );
            let h = revocation_hash_from_seed(&seed, n);
            assert_eq!(
                hex::encode(h.to_byte_array()),
                e["revocation_hash_sha256_of_preimage"].as_str().unwrap(),
                "hash {n}"
            );
        }
    }

    #[test]
    fn seed_preimages_match_the_derivation_from_the_seed() {
        let seed = [0x31u8; 32];
        let mut cache = SeedPreimages::default();
        // Consecutive commitments (crossing the 8- and 16-bit boundaries), jumps back and
        // forth, and the far end of the index space.
        let mut ns: Vec<u64> = (0..700).collect();
        ns.extend([
            65_534,
            65_535,
            65_536,
            3,
            1 << 40,
            (1 << 40) + 1,
            u64::MAX - 1,
            0,
            255,
        ]);
        for n in ns {
            cache.prepare(&seed, n);
            for m in [n, n.wrapping_add(1), n.wrapping_add(2)] {
                assert_eq!(
                    cache.preimage(&seed, m),
                    preimage_from_seed(&seed, m),
                    "n={m}"
                );
                assert_eq!(
                    cache.revocation_hash(&seed, m),
                    revocation_hash_from_seed(&seed, m),
                    "n={m}"
                );
            }
        }
        assert_eq!(format!("{cache:?}"), "SeedPreimages(..)");
    }

    #[test]
    fn store_answers_every_revealed_preimage_in_log_space() {
        let seed = [0x55u8; 32];
        let mut store = RevocationSecrets::new();
        for n in 0..2000u64 {
            store.insert(n, &preimage_from_seed(&seed, n)).unwrap();
            assert!(store.slots() <= 65);
            assert!(
                store.slots() <= 12,
                "2000 entries need at most 12 slots, got {}",
                store.slots()
            );
        }
        for n in 0..2000u64 {
            assert_eq!(store.get(n), Some(preimage_from_seed(&seed, n)), "n={n}");
        }
        assert_eq!(store.get(2000), None);
    }

    #[test]
    fn store_rejects_inconsistent_and_out_of_order() {
        let seed = [7u8; 32];
        let mut store = RevocationSecrets::new();
        store.insert(0, &preimage_from_seed(&seed, 0)).unwrap();
        // n = 1 has ccan index !1 = ...1110, which derives index !0: a wrong value is caught.
        let before = store.clone();
        assert_eq!(
            store.insert(1, &Preimage([9; 32])),
            Err(ShachainError::Inconsistent(1))
        );
        assert_eq!(store, before);
        assert_eq!(
            store.insert(5, &preimage_from_seed(&seed, 5)),
            Err(ShachainError::OutOfOrder {
                got: 5,
                expected: 1
            })
        );
        store.insert(1, &preimage_from_seed(&seed, 1)).unwrap();
        // A preimage from another seed is inconsistent once it has to derive older ones.
        // Index 2 derives nothing earlier (ccan index !2 ends in a 1 bit), so it cannot be
        // caught yet; index 3 must derive it and is refused.
        let mut other = store.clone();
        assert_eq!(other.insert(2, &preimage_from_seed(&[8; 32], 2)), Ok(()));
        assert_eq!(
            other.insert(3, &preimage_from_seed(&[8; 32], 3)),
            Err(ShachainError::Inconsistent(3))
        );
        // The right preimage 3 is refused too once the wrong 2 is stored: it cannot derive it.
        assert_eq!(
            other.insert(3, &preimage_from_seed(&seed, 3)),
            Err(ShachainError::Inconsistent(3))
        );
    }
}
