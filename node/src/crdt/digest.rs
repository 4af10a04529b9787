//! Digests of replica state: a 64-bit summary that two replicas compare to see
//! whether they have converged.
//!
//! The digest of a state is the wrapping sum of one hash per (key, slot), so it
//! does not depend on iteration order and can be kept up to date incrementally:
//! subtract a counter's old hash, add its new one. The hash is FNV-1a followed
//! by a 64-bit finaliser, fixed here so that every build and platform agrees.

use super::{FoldedBase, PnCounter};

/// The order-independent digest of a set of counters.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Hash)]
pub struct StateDigest(pub u64);

impl StateDigest {
    /// Replaces `old`'s contribution (if any) for `key` with `new`'s.
    pub fn replace(&mut self, key: &str, old: Option<&PnCounter>, new: &PnCounter) {
        if let Some(old) = old {
            self.0 = self.0.wrapping_sub(counter_digest(key, old));
        }
        self.0 = self.0.wrapping_add(counter_digest(key, new));
    }
}

/// The digest of one counter; the empty counter hashes to 0 so it adds nothing.
pub fn counter_digest(key: &str, counter: &PnCounter) -> u64 {
    if counter.is_empty() {
        return 0;
    }
    let mut hash = Fnv::new();
    hash.write(&(key.len() as u64).to_le_bytes());
    hash.write(key.as_bytes());
    for (replica, slot) in counter.slots() {
        hash.write(&replica.0.to_le_bytes());
        hash.write(&slot.p.to_le_bytes());
        hash.write(&slot.n.to_le_bytes());
    }
    let base = counter.folded();
    if base != FoldedBase::default() {
        // After the slots, so a counter that never saw a fold hashes as before.
        hash.write(b"folded");
        hash.write(&base.epoch.to_le_bytes());
        hash.write(&base.p.to_le_bytes());
        hash.write(&base.n.to_le_bytes());
    }
    finalise(hash.0)
}

/// A stable 64-bit hash of `parts` (each length-prefixed), seeded; the same on
/// every build and platform. Not for adversarial input.
pub fn stable_hash(seed: u64, parts: &[&[u8]]) -> u64 {
    let mut hash = Fnv::new();
    hash.write(&seed.to_le_bytes());
    for part in parts {
        hash.write(&(part.len() as u64).to_le_bytes());
        hash.write(part);
    }
    finalise(hash.0)
}

struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// The splitmix64 finaliser: spreads FNV's weak low bits over the whole word.
fn finalise(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crdt::{ReplicaId, Slot};

    #[test]
    fn digest_is_order_independent_and_incremental() {
        let a = PnCounter::from_slots([(ReplicaId(1), Slot { p: 3, n: 1 })]);
        let b = PnCounter::from_slots([(ReplicaId(2), Slot { p: 5, n: 0 })]);
        let mut one = StateDigest::default();
        one.replace("a", None, &a);
        one.replace("b", None, &b);
        let mut two = StateDigest::default();
        two.replace("b", None, &b);
        two.replace("a", None, &a);
        assert_eq!(one, two);

        let a2 = PnCounter::from_slots([(ReplicaId(1), Slot { p: 4, n: 1 })]);
        one.replace("a", Some(&a), &a2);
        let mut fresh = StateDigest::default();
        fresh.replace("b", None, &b);
        fresh.replace("a", None, &a2);
        assert_eq!(one, fresh);
        assert_ne!(one, two);
    }

    #[test]
    fn key_is_part_of_the_digest() {
        let a = PnCounter::from_slots([(ReplicaId(1), Slot { p: 3, n: 1 })]);
        assert_ne!(counter_digest("a", &a), counter_digest("b", &a));
        assert_eq!(counter_digest("a", &PnCounter::new()), 0);
    }
}
