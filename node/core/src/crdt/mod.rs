//! Pure conflict-free replicated data types: the `Crdt` trait, the PN-counter
//! and its folded base (retired writers, `fold.rs`), the causal-length set
//! (like sets), HyperLogLog (uniques) and the bounded counter (stock that
//! is never oversold).
//!
//! Nothing here does IO or reads a clock. Every implementation obeys the laws
//! stated on [`Crdt`], and the tests check them with proptest.

pub mod bounded;
pub mod bounded_fold;
pub mod causal_length;
mod digest;
mod fold;
pub mod hll;
#[cfg(test)]
mod laws;
mod pn_counter;

pub use bounded::{BoundedCounter, BoundedRefused, MergeRefused, RightsRow};
pub use bounded_fold::{BoundedFoldRefused, RetiredFold};
pub use causal_length::{check_member, CausalLengthSet, LengthOverflow, MemberError};
pub use digest::{
    counter_digest, member_digest, register_digest, stable_hash, SetsDigest, StateDigest,
};
pub use fold::{
    digest_in, writer_slot_hash, FoldBook, FoldError, FoldRecord, FoldedBase, PartitionDigests,
    WriterDigest,
};
pub use hll::HyperLogLog;
pub use pn_counter::{AddError, PnCounter, ReplicaId, Slot, ValueOutOfRange};

/// A state-based CRDT: replicas merge states, never operations.
///
/// For all states `a`, `b`, `c` of one type, `merge` must be
/// - commutative: `a ⊔ b == b ⊔ a`,
/// - associative: `(a ⊔ b) ⊔ c == a ⊔ (b ⊔ c)`,
/// - idempotent: `a ⊔ a == a`,
/// - inflationary: `a ⊔ b >= a` in the type's partial order (nothing merged is lost),
///
/// so a state may be delivered any number of times, in any order, by any path,
/// and every replica that has seen the same states holds the same value.
pub trait Crdt {
    /// Merges `other` into `self`. Returns true when `self` changed.
    fn merge(&mut self, other: &Self) -> bool;
}
