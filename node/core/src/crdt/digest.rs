//! Digests of replica state: a 64-bit summary that two replicas compare to see
//! whether they have converged.
//!
//! The digest of a state is the wrapping sum of one hash per (key, slot), so it
//! does not depend on iteration order and can be kept up to date incrementally:
//! subtract a counter's old hash, add its new one. The hash is FNV-1a followed
//! by a 64-bit finaliser, fixed here so that every build and platform agrees.
//!
//! Like sets and uniques have a digest of their own ([`SetsDigest`]), the
//! wrapping sum of one hash per (like set, member, causal length) and per
//! (uniques key, register, rank): a member of length 0 and a register of
//! rank 0 add nothing, so the digest depends only on the merged state, not
//! on the order of operations, nor on a sparse or dense register form. It is
//! kept apart from the counters' so that a node of a build without it still
//! publishes the same counter digest as before (see `gossip/membership.rs`).

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

/// The order-independent digest of the like sets and uniques (see the module
/// documentation), kept up to date one member or register at a time.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Hash)]
pub struct SetsDigest(pub u64);

/// Seeds of the two hashes, distinct from each other and from every other
/// stable hash's, so a member can never cancel a register.
const MEMBER_SEED: u64 = 0x6c69_6b65; // "like"
const REGISTER_SEED: u64 = 0x756e_6971; // "uniq"

impl SetsDigest {
    /// The digest change of a like-set member whose length went from `old`
    /// to `new`: add it to a digest (wrapping) to move that digest along.
    pub fn member_change(key: &str, member: &str, old: u64, new: u64) -> u64 {
        member_digest(key, member, new).wrapping_sub(member_digest(key, member, old))
    }

    /// The digest change of a uniques register raised from `old` to `new`.
    pub fn register_change(key: &str, index: u16, old: u8, new: u8) -> u64 {
        register_digest(key, index, new).wrapping_sub(register_digest(key, index, old))
    }

    /// Applies a change from [`Self::member_change`] or [`Self::register_change`]
    /// (or a sum of them).
    pub fn apply(&mut self, change: u64) {
        self.0 = self.0.wrapping_add(change);
    }
}

/// The hash of one member at one length; length 0 (never seen) hashes to 0.
pub fn member_digest(key: &str, member: &str, length: u64) -> u64 {
    if length == 0 {
        return 0;
    }
    stable_hash(
        MEMBER_SEED,
        &[key.as_bytes(), member.as_bytes(), &length.to_le_bytes()],
    )
}

/// The hash of one register at one rank; rank 0 (unset) hashes to 0.
pub fn register_digest(key: &str, index: u16, rank: u8) -> u64 {
    if rank == 0 {
        return 0;
    }
    stable_hash(
        REGISTER_SEED,
        &[key.as_bytes(), &index.to_le_bytes(), &[rank]],
    )
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

    /// The digest of a whole state, computed from scratch.
    fn sets_digest_of(members: &[(&str, &str, u64)], registers: &[(&str, u16, u8)]) -> SetsDigest {
        let mut digest = SetsDigest::default();
        for (key, member, length) in members {
            digest.apply(member_digest(key, member, *length));
        }
        for (key, index, rank) in registers {
            digest.apply(register_digest(key, *index, *rank));
        }
        digest
    }

    #[test]
    fn sets_digest_is_equal_iff_the_states_are() {
        let state = [("post", "sam", 1), ("post", "kim", 2), ("other", "sam", 3)];
        let registers = [("seen", 7, 3), ("seen", 9000, 1)];
        let base = sets_digest_of(&state, &registers);
        // Order does not matter.
        let mut reversed = state;
        reversed.reverse();
        assert_eq!(sets_digest_of(&reversed, &registers), base);
        // Never-seen members and unset registers add nothing.
        let mut padded = state.to_vec();
        padded.push(("post", "nobody", 0));
        assert_eq!(
            sets_digest_of(
                &padded,
                &[("seen", 7, 3), ("seen", 9000, 1), ("seen", 5, 0)]
            ),
            base
        );
        // Every kind of difference shows.
        let differ = [
            sets_digest_of(&[("post", "sam", 3), state[1], state[2]], &registers),
            sets_digest_of(&[("post", "sam", 1), ("post", "kim", 2)], &registers),
            sets_digest_of(
                &[("post", "sam", 1), ("post", "kim", 2), ("other", "sim", 3)],
                &registers,
            ),
            sets_digest_of(
                &[("post", "sam", 1), ("post", "kim", 2), ("othe", "sam", 3)],
                &registers,
            ),
            sets_digest_of(&state, &[("seen", 7, 4), ("seen", 9000, 1)]),
            sets_digest_of(&state, &[("seen", 8, 3), ("seen", 9000, 1)]),
            sets_digest_of(&state, &[("seen", 9000, 1)]),
            sets_digest_of(&state, &[("seen", 7, 3), ("seem", 9000, 1)]),
        ];
        for (at, digest) in differ.iter().enumerate() {
            assert_ne!(*digest, base, "difference {at} did not show");
        }
        // A key/member split is not ambiguous.
        assert_ne!(member_digest("ab", "c", 1), member_digest("a", "bc", 1));
    }

    #[test]
    fn sets_digest_moves_incrementally() {
        let mut digest = sets_digest_of(&[("post", "sam", 1)], &[("seen", 7, 2)]);
        digest.apply(SetsDigest::member_change("post", "sam", 1, 2));
        digest.apply(SetsDigest::member_change("post", "kim", 0, 1));
        digest.apply(SetsDigest::register_change("seen", 7, 2, 5));
        digest.apply(SetsDigest::register_change("seen", 8, 0, 1));
        assert_eq!(
            digest,
            sets_digest_of(
                &[("post", "sam", 2), ("post", "kim", 1)],
                &[("seen", 7, 5), ("seen", 8, 1)]
            )
        );
        // Changes sum: like then unlike within one commit is one change.
        let both = SetsDigest::member_change("post", "x", 0, 1)
            .wrapping_add(SetsDigest::member_change("post", "x", 1, 2));
        assert_eq!(both, SetsDigest::member_change("post", "x", 0, 2));
    }

    #[test]
    fn key_is_part_of_the_digest() {
        let a = PnCounter::from_slots([(ReplicaId(1), Slot { p: 3, n: 1 })]);
        assert_ne!(counter_digest("a", &a), counter_digest("b", &a));
        assert_eq!(counter_digest("a", &PnCounter::new()), 0);
    }
}
