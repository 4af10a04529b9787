//! Deleting what this replica stores of like sets and uniques of partitions
//! it no longer keeps (issue 14 item 5, the end of a handoff; DESIGN.md
//! "Partitioned regions"): the counterpart of `purge.rs` for sets.
//!
//! A purge pass (started with the counters' pass, [`Replica::start_purge`])
//! walks the stored like sets, then the stored uniques keys, in key order,
//! a bounded stretch per [`Replica::poll_purge`] step. A set whose key the
//! runtime says is not kept, and that has no change waiting for a commit or
//! being committed, leaves the core's cache and gets a [`SetDeletion`]: a
//! uniques key's record goes whole; a like set's members go at most
//! [`MEMBERS_PER_DELETION`] at a time, each time with its count record
//! rewritten to the members left (the last time deleted), so that every
//! commit leaves the set consistent: its count is the liked members it still
//! stores. A larger set takes one deletion per pass, and passes repeat
//! until nothing is left. Deletions go through the group commit, with the
//! sets digest moved by what they remove, and write no delta-log record
//! (peers keep what they hold; the owners hold it all).
//!
//! Invariants kept here:
//! - **Only sets not kept, never a kept one.** A deletion still waiting for
//!   a commit is dropped when its key is kept again or was loaded into the
//!   cache since (a pull merged into it); the next pass looks again.
//! - **No merge into a set being deleted.** While a deletion of a set waits
//!   or is in flight, a pulled chunk with a delta of that set, when it is
//!   kept again, is refused whole ([`ChunkRefused::SetBeingDeleted`]): its
//!   load would read the count from before the deletion and write it back
//!   after. The puller's cursors do not move, so it pulls the chunk again
//!   once the deletion is durable.

use crate::crdt::{member_digest, register_digest};

use super::protocol::ChunkRefused;
use super::sets::SetKind;
use super::types::{DurableState, Key, StorageError};
use super::Replica;

/// The most members of a like set one deletion removes.
pub const MEMBERS_PER_DELETION: usize = 4_096;
/// A step stops adding deletions once they hold this many members.
const MEMBERS_PER_STEP: usize = 4 * MEMBERS_PER_DELETION;

/// What one commit deletes of one set of a partition not kept.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SetDeletion {
    /// A like set or a uniques key.
    pub kind: SetKind,
    /// Its name.
    pub key: Key,
    /// A like set's members whose records go.
    pub members: Vec<Box<str>>,
    /// A like set's count after them, its record rewritten; `None`: the
    /// last members, the count record goes too (a uniques key's record
    /// always goes whole).
    pub count_after: Option<u64>,
}

/// The set purge's state (see the module documentation).
#[derive(Debug, Default)]
pub(super) struct SetPurge {
    /// The pass that runs: the kind walked and the last key looked at.
    pass: Option<(SetKind, Option<String>)>,
    /// Run another pass after this one (a set was busy, or has more).
    again: bool,
    /// Deletions for the next commit, each with the sets-digest change it
    /// makes (applied once, when a commit first takes it).
    pending: Vec<(SetDeletion, u64)>,
    /// Those the commit in flight makes.
    in_flight: Vec<SetDeletion>,
}

impl SetPurge {
    /// Starts a pass, or queues one after the pass that runs.
    pub(super) fn start(&mut self) {
        if self.pass.is_some() {
            self.again = true;
        } else {
            self.pass = Some((SetKind::Likes, None));
        }
    }

    /// Whether a pass runs or deletions wait for their commit.
    pub(super) fn busy(&self) -> bool {
        self.pass.is_some() || !self.pending.is_empty() || !self.in_flight.is_empty()
    }

    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Whether a deletion of the set waits or is in flight.
    fn deleting(&self, kind: SetKind, key: &str) -> bool {
        let of = |deletion: &SetDeletion| deletion.kind == kind && &*deletion.key == key;
        self.pending.iter().any(|(deletion, _)| of(deletion)) || self.in_flight.iter().any(of)
    }

    /// The commit in flight is durable.
    pub(super) fn commit_done(&mut self) {
        self.in_flight.clear();
    }

    /// The commit in flight failed: its deletions go into the next one
    /// (their digest changes were applied already).
    pub(super) fn commit_failed(&mut self) {
        let failed = std::mem::take(&mut self.in_flight);
        self.pending
            .extend(failed.into_iter().map(|deletion| (deletion, 0)));
    }
}

impl Replica {
    /// Refuses a pulled chunk with a delta of a set that is kept here again
    /// while a deletion of it waits or is in flight (see the module
    /// documentation).
    pub(super) fn check_sets_not_deleted(
        &self,
        deltas: &[super::SetDelta],
    ) -> Result<(), ChunkRefused> {
        for delta in deltas {
            let kind = delta.kind();
            if self.set_purge.deleting(kind, delta.key()) && self.keeps(delta.key()) {
                return Err(ChunkRefused::SetBeingDeleted(delta.key().to_string()));
            }
        }
        Ok(())
    }

    /// One bounded step of the set purge: looks at up to `limit` stored
    /// sets and queues deletions of those `keeps` says are not kept.
    /// Returns the sets looked at, the deletions queued, and whether the
    /// pass is over.
    pub(super) fn poll_set_purge(
        &mut self,
        store: &(impl DurableState + ?Sized),
        limit: usize,
        keeps: &impl Fn(&str) -> bool,
    ) -> Result<(usize, usize, bool), StorageError> {
        let Some((kind, after)) = self.set_purge.pass.clone() else {
            return Ok((0, 0, true));
        };
        let keys = store.set_keys_after(kind, after.as_deref(), limit.max(1))?;
        let (mut visited, mut queued, mut members) = (0, 0, 0);
        let mut finished = keys.len() < limit.max(1);
        for key in keys {
            if members >= MEMBERS_PER_STEP {
                finished = false;
                break;
            }
            visited += 1;
            self.set_purge.pass = Some((kind, Some(key.clone())));
            if keeps(&key) {
                continue;
            }
            if self.set_purge.deleting(kind, &key) || !self.sets.forget_clean(kind, &key) {
                self.set_purge.again = true;
                continue;
            }
            let Some((deletion, digest_change)) = set_deletion(store, kind, &key)? else {
                continue;
            };
            if deletion.count_after.is_some() {
                // More members than one deletion takes: the next pass.
                self.set_purge.again = true;
            }
            members += deletion.members.len().max(1);
            queued += 1;
            self.set_purge.pending.push((deletion, digest_change));
        }
        if finished {
            self.set_purge.pass = match kind {
                SetKind::Likes => Some((SetKind::Uniques, None)),
                SetKind::Uniques => None,
            };
            if self.set_purge.pass.is_none() && std::mem::take(&mut self.set_purge.again) {
                self.set_purge.start();
            }
        }
        Ok((visited, queued, self.set_purge.pass.is_none()))
    }

    /// Hands the pending deletions to a commit, applying their digest
    /// changes; drops those of sets kept again or loaded since.
    pub(super) fn commit_set_purge(&mut self) -> Vec<super::purge_sets::SetDeletion> {
        let mut taken = Vec::new();
        for (deletion, digest_change) in std::mem::take(&mut self.set_purge.pending) {
            if self.keeps(&deletion.key) || self.sets.cached(deletion.kind, &deletion.key) {
                self.set_purge.again = true;
                continue;
            }
            self.sets.apply_digest(&deletion.key, digest_change);
            taken.push(deletion);
        }
        self.set_purge.in_flight = taken.clone();
        taken
    }
}

/// The next deletion of a stored set and the sets-digest change it makes;
/// `None` when nothing of it is stored.
fn set_deletion(
    store: &(impl DurableState + ?Sized),
    kind: SetKind,
    key: &str,
) -> Result<Option<(SetDeletion, u64)>, StorageError> {
    let mut digest_change = 0u64;
    let deletion = match kind {
        SetKind::Uniques => {
            let Some(registers) = store.load_uniques(key)? else {
                return Ok(None);
            };
            for (index, rank) in registers.set_registers() {
                digest_change = digest_change.wrapping_sub(register_digest(key, index, rank));
            }
            SetDeletion {
                kind,
                key: key.into(),
                members: Vec::new(),
                count_after: None,
            }
        }
        SetKind::Likes => {
            let count = store.load_like_count(key)?;
            let members = store.like_members_after(key, None, MEMBERS_PER_DELETION)?;
            let mut liked = 0u64;
            for (member, length) in &members {
                liked += length % 2;
                digest_change = digest_change.wrapping_sub(member_digest(key, member, *length));
            }
            let last = members.len() < MEMBERS_PER_DELETION;
            if last && liked != count {
                tracing::error!(
                    key,
                    count,
                    liked,
                    "BUG: a like set's kept count differs from its members while deleting it"
                );
            }
            SetDeletion {
                kind,
                key: key.into(),
                members: members.into_iter().map(|(m, _)| m.into()).collect(),
                count_after: (!last).then(|| count.saturating_sub(liked)),
            }
        }
    };
    Ok(Some((deletion, digest_change)))
}

#[cfg(test)]
#[path = "purge_sets_tests.rs"]
mod tests;
