//! The causal-length set behind like sets: per member a small natural number,
//! its *causal length*. Odd means liked, even (and 0, never seen) means not.
//!
//! Invariants kept here: a like raises an even length by one and an unlike
//! raises an odd one by one, so a double tap, a retry, or an unlike of a
//! member that never liked changes nothing; merge takes the max length per
//! member, so concurrent likes of one member in several regions count once;
//! the count of liked members is maintained incrementally with every change
//! and always equals [`CausalLengthSet::recount`]; no length wraps (a length
//! at `u64::MAX` refuses the next toggle, changing nothing).

use std::collections::BTreeMap;

use super::Crdt;

/// The longest member, in bytes.
pub const MAX_MEMBER_BYTES: usize = 128;

/// True when a member with causal length `length` is in the set.
pub fn is_liked(length: u64) -> bool {
    length % 2 == 1
}

/// The length after a like: one more when the member is not liked, the same
/// when it already is. Fails only at `u64::MAX`.
pub fn length_after_like(length: u64) -> Result<u64, LengthOverflow> {
    if is_liked(length) {
        return Ok(length);
    }
    length.checked_add(1).ok_or(LengthOverflow)
}

/// The length after an unlike: one more when the member is liked, the same
/// when it is not (an unlike of a member that never liked changes nothing).
pub fn length_after_unlike(length: u64) -> Result<u64, LengthOverflow> {
    if !is_liked(length) {
        return Ok(length);
    }
    length.checked_add(1).ok_or(LengthOverflow)
}

/// How the count of liked members moves when one member's length goes from
/// `old` to `new`: -1, 0 or +1.
pub fn count_change(old: u64, new: u64) -> i64 {
    i64::from(is_liked(new)) - i64::from(is_liked(old))
}

/// A member's length would pass `u64::MAX`; nothing changed.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[error(
    "this member has been liked and unliked 2^64 times; its length cannot grow, nothing changed"
)]
pub struct LengthOverflow;

/// Why a member name was refused.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum MemberError {
    /// No bytes.
    #[error("the member is empty; give a member of 1 to {MAX_MEMBER_BYTES} bytes")]
    Empty,
    /// More than [`MAX_MEMBER_BYTES`].
    #[error("the member is {0} bytes long; the limit is {MAX_MEMBER_BYTES} bytes")]
    TooLong(usize),
    /// Not UTF-8.
    #[error("the member is not valid UTF-8")]
    NotUtf8,
}

/// Checks a member's bytes without allocating: UTF-8, 1 to 128 bytes.
pub fn check_member(bytes: &[u8]) -> Result<&str, MemberError> {
    if bytes.is_empty() {
        return Err(MemberError::Empty);
    }
    if bytes.len() > MAX_MEMBER_BYTES {
        return Err(MemberError::TooLong(bytes.len()));
    }
    std::str::from_utf8(bytes).map_err(|_| MemberError::NotUtf8)
}

/// A whole causal-length set in memory: the simulator's and the tests'
/// reference, and the shape of a delta (a set of just the changed members).
/// The node keeps members one record each and uses the functions above.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct CausalLengthSet {
    lengths: BTreeMap<Box<str>, u64>,
    count: u64,
}

impl CausalLengthSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// The causal length of `member` (0 when never seen).
    pub fn length(&self, member: &str) -> u64 {
        self.lengths.get(member).copied().unwrap_or(0)
    }

    /// True when `member` is liked.
    pub fn contains(&self, member: &str) -> bool {
        is_liked(self.length(member))
    }

    /// The number of liked members, kept incrementally (O(1)).
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The number of liked members, counted from the lengths (O(n)): what
    /// [`Self::count`] must always equal.
    pub fn recount(&self) -> u64 {
        self.lengths.values().filter(|len| is_liked(**len)).count() as u64
    }

    /// Every member ever seen with its length, in member order.
    pub fn lengths(&self) -> impl Iterator<Item = (&str, u64)> {
        self.lengths.iter().map(|(member, len)| (&**member, *len))
    }

    /// The liked members, in member order.
    pub fn liked(&self) -> impl Iterator<Item = &str> {
        self.lengths()
            .filter(|(_, len)| is_liked(*len))
            .map(|(member, _)| member)
    }

    /// Likes `member`. Ok(true) when it changed (it was not liked).
    pub fn like(&mut self, member: &str) -> Result<bool, LengthOverflow> {
        let new = length_after_like(self.length(member))?;
        Ok(self.merge_length(member, new))
    }

    /// Unlikes `member`. Ok(true) when it changed (it was liked).
    pub fn unlike(&mut self, member: &str) -> Result<bool, LengthOverflow> {
        let new = length_after_unlike(self.length(member))?;
        Ok(self.merge_length(member, new))
    }

    /// Raises `member`'s length to at least `length` (the merge of one
    /// member) and keeps the count. Returns true when it changed.
    pub fn merge_length(&mut self, member: &str, length: u64) -> bool {
        let old = self.length(member);
        if length <= old {
            return false;
        }
        self.lengths.insert(member.into(), length);
        // |count_change| <= 1 and the count never passes the member count.
        self.count = self.count.saturating_add_signed(count_change(old, length));
        true
    }

    /// True when every member's length here is at or below its length in
    /// `other` (the CRDT's partial order).
    pub fn is_covered_by(&self, other: &CausalLengthSet) -> bool {
        self.lengths()
            .all(|(member, len)| len <= other.length(member))
    }
}

impl Crdt for CausalLengthSet {
    fn merge(&mut self, other: &Self) -> bool {
        let mut changed = false;
        for (member, length) in other.lengths() {
            changed |= self.merge_length(member, length);
        }
        changed
    }
}

#[cfg(test)]
#[path = "causal_length_tests.rs"]
mod tests;
