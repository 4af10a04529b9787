//! Dropping what this replica stores of partitions it no longer keeps
//! (issue 11, the end of a handoff; DESIGN.md "Partitioned regions").
//!
//! The handoff state machine (`partition/handoff.rs`) decides when a
//! partition may go: every owner confirmed it holds this node's changes of
//! it, or it was only ever a copy. The runtime then stops serving it and
//! starts a purge pass ([`Replica::start_purge`]); each
//! [`Replica::poll_purge`] step walks a bounded stretch of the change log
//! (every stored counter appears there once, at its latest commit) and
//! drops the counters whose partition the runtime says is not kept. A copy
//! push that merged counters of a partition not kept here (a top-up, or a
//! sender whose routes still showed this node holding it) asks for a pass
//! once its commit is durable, so such copies do not stay forever. Such a
//! pass starts at the earliest commit that lists one of them in the change
//! log, not at the log's start: while top-ups go on (an owner down, or RF
//! below `--write-copies`) passes run back to back, and each used to walk
//! every stored counter.
//!
//! Invariants kept here:
//! - **Its own slot stays.** A counter whose slot of this replica is not
//!   empty is rewritten to that slot alone, with the counter's fold epoch
//!   and base (the epoch names the slot's phase); one whose slot is empty
//!   is deleted. Only this replica raises its slot (invariant 1), and it
//!   continues from what it stores when it takes the partition back: were
//!   the slot deleted, a later add would restart it from zero and the
//!   slot-wise max of the merge would lose the adds of the old value. The
//!   other slots are held by the owners that confirmed them. Once this
//!   replica's slots of the partition are folded (`fold_scoped.rs`: the
//!   partition stayed away for `--retire-after`), the slot is in every
//!   keeper's base and this replica writes the partition again only from a
//!   fresh slot: the counter is deleted, and a pass runs when such a fold
//!   is committed. A departing replica (its node drains or has left:
//!   [`Replica::set_departing`]) never takes a partition again, so its
//!   slot goes too and a drained node holds nothing.
//! - **Only clean counters.** A counter with a change waiting for a commit,
//!   being committed or waiting for a push to the copies is left for the
//!   next pass (a pull planned before the deletion may still merge into
//!   it).
//! - **Deletions go through the group commit**, in one atomic batch with the
//!   digests they change ([`CommitBatch::deleted`](super::CommitBatch)), and
//!   a failed commit puts them back. Rewrites are ordinary changes.

use crate::crdt::{PnCounter, Slot, StateDigest};

use super::retire::changed_slots;
use super::types::{Change, Cursor, DurableState, Key, StorageError, StoredCounter};
use super::Replica;

/// The purge passes of the change log (see the module documentation).
#[derive(Debug, Default)]
pub(super) struct Purge {
    running: Option<Pass>,
    /// A pass was asked for while one ran: run another after it.
    again: bool,
    /// Counters to delete with the next commit, with their stored record.
    pending: Vec<(Key, StoredCounter)>,
    /// Those the commit in flight deletes.
    in_flight: Vec<(Key, StoredCounter)>,
    /// Copies of partitions not kept were merged: (the latest commit that
    /// holds one, the earliest that lists one in the change log). Once the
    /// first is durable, a pass drops them, starting at the second (a
    /// change only moves a counter later in the log).
    strays: Option<(u64, u64)>,
}

#[derive(Debug)]
struct Pass {
    after: Cursor,
    /// Counters written after this were written once the pass began; the
    /// next pass sees them.
    stop_seq: u64,
}

/// What one [`Replica::poll_purge`] step did.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct PurgeStep {
    /// Stored counters looked at.
    pub visited: usize,
    /// Counters to be deleted by the next commit.
    pub deleted: usize,
    /// Counters rewritten to this replica's own slot.
    pub trimmed: usize,
    /// Deletions of like sets and uniques (a part of a large like set
    /// each) queued for the next commit.
    pub sets_deleted: usize,
    /// No pass runs any more.
    pub done: bool,
}

impl Purge {
    /// The commit in flight is durable.
    pub(super) fn commit_done(&mut self) {
        self.in_flight.clear();
    }

    /// The commit in flight failed: its deletions go into the next one
    /// (with the digests recomputed from the last durable ones, as every
    /// change of a failed batch is).
    pub(super) fn commit_failed(&mut self) {
        let failed = std::mem::take(&mut self.in_flight);
        self.pending.extend(failed);
    }

    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}

impl Replica {
    /// Starts a purge pass over every stored counter, like set and uniques
    /// key (or queues one after the pass that runs).
    pub fn start_purge(&mut self) {
        self.start_purge_after(Cursor::default());
        self.set_purge.start();
    }

    /// Starts a pass over the change log after `after` (or queues a pass
    /// over all of it after the pass that runs).
    fn start_purge_after(&mut self, after: Cursor) {
        if self.purge.running.is_some() {
            self.purge.again = true;
        } else {
            self.purge.running = Some(Pass {
                after,
                stop_seq: self.last_seq,
            });
        }
    }

    /// Asks for a pass once the commit `seq` is durable, over the change
    /// log from commit `from` on (see [`Purge::strays`]).
    pub(super) fn purge_strays_at(&mut self, seq: u64, from: u64) {
        self.purge.strays = Some(match self.purge.strays {
            Some((at, earliest)) => (at.max(seq), earliest.min(from)),
            None => (seq, from),
        });
    }

    /// Whether a purge pass runs, one waits for a commit of copies of
    /// partitions not kept, or deletions of sets wait for their commit.
    pub fn purging(&self) -> bool {
        self.purge.running.is_some() || self.purge.strays.is_some() || self.set_purge.busy()
    }

    /// One bounded step of the purge: looks at up to `limit` stored
    /// counters and drops those `keeps` says are not kept (see the module
    /// documentation for what dropping does).
    pub fn poll_purge(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        limit: usize,
        keeps: impl Fn(&str) -> bool,
    ) -> Result<PurgeStep, StorageError> {
        let mut step = PurgeStep::default();
        if self.purge.running.is_none() {
            match self.purge.strays {
                Some((seq, from)) if self.durable_seq() >= seq => {
                    self.purge.strays = None;
                    // Every change listed at `from` or later.
                    self.start_purge_after(Cursor {
                        seq: from.saturating_sub(1),
                        key: String::new(),
                    });
                }
                // Not durable yet: the pass waits for that commit.
                Some(_) => return Ok(step),
                None => {}
            }
        }
        let Some(pass) = &self.purge.running else {
            // The counters first, then the sets (`purge_sets.rs`).
            let (visited, deleted, done) = self.poll_set_purge(store, limit, &keeps)?;
            step.visited += visited;
            step.sets_deleted += deleted;
            step.done = done && !self.set_purge.busy();
            return Ok(step);
        };
        let stop_seq = pass.stop_seq;
        let changes = store.changes_after(&pass.after, limit.max(1))?;
        let mut done = changes.is_empty();
        for change in changes {
            if change.seq > stop_seq {
                done = true;
                break;
            }
            step.visited += 1;
            if let Some(pass) = self.purge.running.as_mut() {
                pass.after = Cursor {
                    seq: change.seq,
                    key: change.key.to_string(),
                };
            }
            if keeps(&change.key) {
                continue;
            }
            match self.purge_counter(now_ms, store, &change)? {
                Dropped::Deleted => step.deleted += 1,
                Dropped::Trimmed => step.trimmed += 1,
                Dropped::Kept => {}
                Dropped::Busy => self.purge.again = true,
            }
        }
        if done {
            self.purge.running = None;
            if std::mem::take(&mut self.purge.again) {
                self.start_purge();
            }
        }
        step.done = self.purge.running.is_none() && !self.set_purge.busy();
        Ok(step)
    }

    /// Drops one stored counter of a partition not kept.
    fn purge_counter(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        change: &Change,
    ) -> Result<Dropped, StorageError> {
        let own = self.identity.replica;
        let stored = match self.counters.get(&*change.key) {
            Some(entry)
                if entry.dirty
                    || entry.committing
                    || entry.copy_pending
                    || entry.copy_in_flight =>
            {
                return Ok(Dropped::Busy);
            }
            Some(entry) => entry.durable.clone().map(|state| StoredCounter {
                seq: entry.durable_seq,
                state,
            }),
            None => store.load_counter(&change.key)?,
        };
        // The change log lists a record until its deletion commits.
        let Some(stored) = stored.filter(|stored| stored.seq == change.seq) else {
            return Ok(Dropped::Kept);
        };
        let partition = self.partition_of(&change.key).map(|p| p.0);
        let book = self.folds.book();
        let folded_since = partition.is_some_and(|p| {
            let epoch = stored.state.folded().epoch;
            (book.phase(own, Some(p), epoch) as usize) < book.scoped_epochs(own, p).len()
        });
        let slot = match folded_since || self.departing() {
            true => Slot::default(),
            false => stored.state.slot(own),
        };
        if slot == Slot::default() {
            self.counters.remove(&*change.key);
            self.purge.pending.push((change.key.clone(), stored));
            return Ok(Dropped::Deleted);
        }
        // The slot keeps its counter's epoch and base: the epoch is what
        // names the slot's phase (cut down to epoch 0, a slot written
        // after a fold of ours here would read as the folded one, and the
        // next pass would delete it; issue 42), and the base is the one
        // every holder at that epoch has.
        #[cfg(feature = "planted-bugs")]
        let trimmed = match self.config.planted_bug == Some(super::PlantedBug::TrimToEpochZero) {
            true => PnCounter::from_slots([(own, slot)]),
            false => PnCounter::from_parts([(own, slot)], stored.state.folded()),
        };
        #[cfg(not(feature = "planted-bugs"))]
        let trimmed = PnCounter::from_parts([(own, slot)], stored.state.folded());
        if trimmed == stored.state {
            return Ok(Dropped::Kept);
        }
        let entry = self.entry(store, &change.key, now_ms)?;
        entry.live = trimmed;
        self.mark_dirty(&change.key);
        Ok(Dropped::Trimmed)
    }

    /// Adds the pending deletions to a commit's digests; returns the keys
    /// to delete and the change-log entries they end. A deletion of a
    /// counter touched again since (cached: merged into by a late pull) is
    /// dropped: the next pass looks at it again.
    pub(super) fn commit_purge(
        &mut self,
        digest: &mut StateDigest,
        writer_digests: &mut super::folds::DigestChanges,
    ) -> (Vec<Key>, Vec<Change>) {
        let mut keys = Vec::new();
        let mut ends = Vec::new();
        let mut deleted = Vec::new();
        for (key, stored) in std::mem::take(&mut self.purge.pending) {
            if self.counters.contains_key(&key) {
                self.purge.again = true;
                continue;
            }
            let empty = PnCounter::new();
            digest.replace(&key, Some(&stored.state), &empty);
            let partition = self.folds.partition_of(&key);
            let book = self.folds.book();
            for change in changed_slots(Some(&stored.state), &empty, book, partition) {
                self.folds
                    .note_change(writer_digests, &key, change.writer, change.old, change.new);
            }
            keys.push(key.clone());
            ends.push(Change {
                seq: stored.seq,
                key: key.clone(),
            });
            deleted.push((key, stored));
        }
        self.purge.in_flight = deleted;
        (keys, ends)
    }
}

/// What happened to one stored counter.
enum Dropped {
    Deleted,
    Trimmed,
    /// Nothing to drop: only its own slot, or its record moved on.
    Kept,
    /// A change waits: the next pass looks again.
    Busy,
}

#[cfg(test)]
#[path = "purge_tests.rs"]
mod tests;
