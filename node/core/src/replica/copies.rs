//! Replicated durability (issue 12) inside the core: an add in `replicated`
//! mode is acknowledged only once it is durable on this replica *and* on the
//! copies, other nodes of the region that merged this replica's own slot
//! and committed it.
//!
//! The taking side works like the group commit, one level up: every commit
//! that holds a replicated add leaves its counters *pending*; one push at a
//! time ([`Replica::poll_push`]) carries the durable own slot of every
//! pending counter, however many adds each took, and its runtime reports
//! back with [`Replica::handle_push_done`] or [`Replica::handle_push_failed`]
//! (then the counters go into the next push), or with
//! [`Replica::handle_push_partly_done`]: the counters it names as not
//! confirmed (their key's partition had too few live holders to copy to)
//! are *parked* until [`Replica::retry_parked`], and hold back only their
//! own adds. [`Replica::replicated_seq`] says up to which commit every
//! replicated add of an unparked counter is on its copies;
//! [`Replica::replicated_for`] answers for one add.
//!
//! The copying side ([`Replica::handle_copy_push`]) is `copies_taken.rs`.
//!
//! A slot written after a fold of the writer's slots in the counter's
//! partition (`fold_scoped.rs`: the partition moved away from it, was
//! folded and came back) is of a later phase than one with no fold: alone,
//! a copy would take it for the folded one and drop it. Such a slot is
//! pushed with its counter's folded base (issue 42), which names its
//! phase; a copy that cannot merge the two (it does not hold the fold
//! record yet) refuses the whole push, and the writer does not count it as
//! copied. Only cluster version 12 folds slots of a live writer, and a node
//! at that version talks only to nodes that speak it, so every copy that
//! can be sent a base reads it; a slot of phase 0 goes without one, as
//! before, to copies of any version.
//!
//! A push also carries the idempotency records of the commits it covers, and
//! the copy keeps them in the commit that answers the push: when a
//! replicated add is acknowledged, its copies recognise a retry of it (one
//! that fails over to a copy is a duplicate there at once, without waiting
//! for anti-entropy to bring the record; see `idempotency_sync.rs`).
//!
//! Invariants kept here: a push carries only durable state of this replica's
//! own slot (2: it is built from `durable`, after the commit), so a copy never
//! holds more of a slot than its writer could recover; `replicated_seq`
//! never passes a commit whose replicated adds of unparked counters are
//! not confirmed by the copies (a failed commit's tickets included), and
//! never passes `durable_seq`; a parked counter's adds are answered only
//! once a push of it is confirmed.

use crate::crdt::{FoldedBase, ReplicaId, Slot};

use super::idempotency_sync::MAX_CHUNK_RECORDS;
use super::types::{DurableState, IdempotencyRecord, Key};
use super::version::ProtocolWindow;
use super::{AddAccepted, AddRefused, AddRequest, Replica};

/// The most counters one push may carry (a copy refuses more).
pub const MAX_PUSH_COUNTERS: usize = 16_384;

/// The new durable state of a replica's own slot for some counters, sent to
/// the copies of its region.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CopyPush {
    /// The sender's cluster.
    pub cluster_id: String,
    /// The sending replica: every slot below is its own.
    pub source: ReplicaId,
    /// The sender's region (the copy learns it with the slots).
    pub region: String,
    /// The sender's durable sequence that the push brings its copies up to.
    pub upto_seq: u64,
    /// Counters, the sender's slot in each, and the counter's folded base
    /// when the slot was written after a fold of the sender's slots in its
    /// partition (the base names the slot's phase); the default base for a
    /// slot of phase 0.
    pub counters: Vec<(Key, Slot, FoldedBase)>,
    /// The protocol versions the sender speaks.
    pub protocol: ProtocolWindow,
    /// The idempotency records of the commits the push covers.
    pub records: Vec<IdempotencyRecord>,
    /// The id keys the records were made under (the sender's own and those
    /// it learned); empty with no records.
    pub id_keys: Vec<u128>,
}

/// A counter waiting for a push, with the oldest ticket of an add of it
/// that waits (the commit that made it wait, or the failed one before).
type PendingCounter = (Key, u64);

/// The taking side's book of what is still to be pushed.
#[derive(Debug, Default)]
pub(super) struct CopyBook {
    /// The highest commit sequence holding an add that waits for copies.
    wanted_seq: u64,
    /// Counters of replicated commits not pushed yet (their entries say
    /// so), each with the commit that made it pending.
    pending: Vec<PendingCounter>,
    /// Idempotency records of replicated commits not pushed yet.
    records: Vec<IdempotencyRecord>,
    /// The push in flight: the durable sequence it covers, its counters and
    /// its records.
    in_flight: Option<(u64, Vec<PendingCounter>, Vec<IdempotencyRecord>)>,
    /// Every replicated add with a ticket up to this is on its copies,
    /// except those of `parked` counters.
    replicated_seq: u64,
    /// Counters whose last push was not confirmed while others of it
    /// were (their key's partition had too few holders to copy to), with
    /// the oldest commit of theirs no copy confirmed: they no longer hold
    /// back `replicated_seq`, and their adds are answered only once a push
    /// of them is confirmed ([`Replica::replicated_for`]).
    parked: std::collections::HashMap<Key, u64>,
    /// Parked counters waiting for [`Replica::retry_parked`].
    retry: Vec<PendingCounter>,
    /// The ticket of the oldest replicated add whose commit failed, until
    /// the commit that holds it instead is noted.
    failed_floor: Option<u64>,
}

impl CopyBook {
    /// A book with nothing waiting, after a start at `durable_seq`: no add of
    /// an earlier run waits for an answer.
    pub(super) fn starting_at(durable_seq: u64) -> Self {
        CopyBook {
            replicated_seq: durable_seq,
            ..Default::default()
        }
    }
}

impl Replica {
    /// Applies a local add that is to be acknowledged only once its copies
    /// hold it: as [`Replica::handle_add`], and the commit that makes it
    /// durable will be pushed. A retry of an add already applied rewrites its
    /// counter in the next commit, so that the push carries it even when the
    /// first try was not replicated or its push failed.
    pub fn handle_add_replicated(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        request: AddRequest<'_>,
    ) -> Result<AddAccepted, AddRefused> {
        let mut accepted = self.handle_add(now_ms, store, request)?;
        if accepted.duplicate {
            self.entry(store, request.key, now_ms)?;
            self.mark_dirty(request.key);
            accepted.durable_at_seq = self.last_seq + 1;
        }
        let copies = &mut self.copies;
        copies.wanted_seq = copies.wanted_seq.max(accepted.durable_at_seq);
        Ok(accepted)
    }

    /// Every add acknowledged in `replicated` mode with a ticket up to this
    /// is durable on its copies (never above [`Replica::durable_seq`]),
    /// unless its counter is parked: a runtime that reports pushes with
    /// [`Replica::handle_push_partly_done`] answers each add with
    /// [`Replica::replicated_for`].
    pub fn replicated_seq(&self) -> u64 {
        self.copies.replicated_seq
    }

    /// Whether a replicated add to `key` with ticket `ticket` is durable on
    /// its copies.
    pub fn replicated_for(&self, key: &str, ticket: u64) -> bool {
        self.copies.replicated_seq >= ticket
            && self
                .copies
                .parked
                .get(key)
                .is_none_or(|oldest| *oldest > ticket)
    }

    /// Whether parked counters wait for [`Replica::retry_parked`].
    pub fn has_parked(&self) -> bool {
        !self.copies.retry.is_empty()
    }

    /// The parked counters go into the next push (the runtime calls this
    /// once its pause after a failed push is over).
    pub fn retry_parked(&mut self) {
        let retry = std::mem::take(&mut self.copies.retry);
        self.copies.pending.extend(retry);
    }

    /// Counters waiting for a push (parked ones included), and whether a
    /// push is in flight.
    pub fn copies_pending(&self) -> (usize, bool) {
        let waiting = self.copies.pending.len() + self.copies.retry.len();
        (waiting, self.copies.in_flight.is_some())
    }

    /// Called by `handle_commit_done` for the committed counters and
    /// idempotency records: a commit that holds a replicated add leaves its
    /// own-slot counters and its records pending.
    pub(super) fn note_committed_for_copies(
        &mut self,
        seq: u64,
        keys: &[Key],
        records: Vec<IdempotencyRecord>,
    ) {
        if self.copies.wanted_seq >= seq {
            self.copies.records.extend(records);
            // A failed commit's adds are in this one, with their tickets.
            let seq = self
                .copies
                .failed_floor
                .take()
                .map_or(seq, |floor| floor.min(seq));
            let own = self.identity.replica;
            for key in keys {
                let Some(entry) = self.counters.get_mut(key) else {
                    continue;
                };
                if entry.copy_pending || entry.live.slot(own) == Slot::default() {
                    continue;
                }
                entry.copy_pending = true;
                self.copies.pending.push((key.clone(), seq));
            }
        }
        self.advance_replicated();
    }

    /// A failed commit's adds go into the next one: so does the want, and
    /// their tickets (this `seq`) hold `replicated_seq` back until the
    /// commit that holds them is noted.
    pub(super) fn note_commit_failed_for_copies(&mut self, seq: u64) {
        if self.copies.wanted_seq >= seq {
            self.copies.wanted_seq = self.copies.wanted_seq.max(self.last_seq + 1);
            let floor = self.copies.failed_floor.get_or_insert(seq);
            *floor = (*floor).min(seq);
        }
    }

    /// Raises `replicated_seq` to the commit before the oldest one whose
    /// counters (parked ones aside) no copy confirmed yet; with none, to
    /// the durable sequence (commits without replicated adds need no copy).
    fn advance_replicated(&mut self) {
        let copies = &self.copies;
        let in_flight = copies.in_flight.iter().flat_map(|(_, keys, _)| keys);
        let oldest = copies
            .pending
            .iter()
            .chain(in_flight)
            .filter(|(key, _)| !copies.parked.contains_key(key))
            .map(|(_, seq)| *seq)
            .min();
        let oldest = oldest.into_iter().chain(copies.failed_floor).min();
        let covered = oldest.map_or(self.durable_seq, |seq| seq.saturating_sub(1));
        self.copies.replicated_seq = self
            .copies
            .replicated_seq
            .max(covered.min(self.durable_seq));
    }

    /// Hands out the next push: the durable own slot of the pending
    /// counters, oldest first, at most [`MAX_PUSH_COUNTERS`] (a copy refuses
    /// more; the rest go in the next push). `None` while one is in flight or
    /// when nothing is pending.
    pub fn poll_push(&mut self) -> Option<CopyPush> {
        if self.copies.in_flight.is_some() || self.copies.pending.is_empty() {
            return None;
        }
        let own = self.identity.replica;
        let taken = self.copies.pending.len().min(MAX_PUSH_COUNTERS);
        let keys: Vec<PendingCounter> = self.copies.pending.drain(..taken).collect();
        let mut counters = Vec::with_capacity(keys.len());
        let book = self.folds.book();
        #[cfg(feature = "planted-bugs")]
        let book_names_phases =
            self.config.planted_bug != Some(super::PlantedBug::PushWithoutPhase);
        #[cfg(not(feature = "planted-bugs"))]
        let book_names_phases = true;
        for (key, _) in &keys {
            let partition = self.folds.partition_of(key);
            let entry = self
                .counters
                .get_mut(key)
                .expect("a counter waiting for its copies stays cached");
            entry.copy_pending = false;
            entry.copy_in_flight = true;
            let (slot, base) = match &entry.durable {
                // Only a slot written after a fold of ours here needs its
                // phase named (see the module documentation).
                Some(durable)
                    if book_names_phases
                        && book.phase(own, partition, durable.folded().epoch) > 0 =>
                {
                    (durable.slot(own), durable.folded())
                }
                Some(durable) => (durable.slot(own), FoldedBase::default()),
                None => (Slot::default(), FoldedBase::default()),
            };
            counters.push((key.clone(), slot, base));
        }
        let upto_seq = self.durable_seq;
        // At most a chunk's worth of records per push (a copy refuses more);
        // the rest ride with the next push, and anti-entropy brings them
        // meanwhile.
        let sent = self.copies.records.len().min(MAX_CHUNK_RECORDS);
        let records: Vec<IdempotencyRecord> = self.copies.records.drain(..sent).collect();
        let id_keys = match records.is_empty() {
            true => Vec::new(),
            false => self.id_keys(),
        };
        self.copies.in_flight = Some((upto_seq, keys, records.clone()));
        Some(CopyPush {
            cluster_id: self.config.cluster_id.clone(),
            source: own,
            region: self.identity.region.clone(),
            upto_seq,
            counters,
            protocol: self.peers.own_protocol(),
            records,
            id_keys,
        })
    }

    /// The push in flight is durable on enough copies.
    pub fn handle_push_done(&mut self, upto_seq: u64) {
        let counters = self
            .copies
            .in_flight
            .as_ref()
            .map_or(0, |(_, keys, _)| keys.len());
        self.handle_push_partly_done(upto_seq, &vec![true; counters]);
    }

    /// The push in flight is durable on enough copies for the counters
    /// `confirmed` says (one flag per counter of the push, in its order),
    /// not for the others: those are *parked*, set aside until
    /// [`Replica::retry_parked`], and hold back only their own adds (a key
    /// whose partition has too few live holders to copy to does not stall
    /// every replicated add of this node).
    pub fn handle_push_partly_done(&mut self, upto_seq: u64, confirmed: &[bool]) {
        let Some((_, keys, records)) = self
            .copies
            .in_flight
            .take_if(|(upto, ..)| *upto == upto_seq)
        else {
            return;
        };
        if confirmed.iter().any(|ok| !ok) {
            // Records ride again (a copy keeps a record once).
            self.copies.records.extend(records);
        }
        for (index, (key, seq)) in keys.into_iter().enumerate() {
            let Some(entry) = self.counters.get_mut(&key) else {
                continue;
            };
            entry.copy_in_flight = false;
            if confirmed.get(index).copied().unwrap_or(false) {
                self.copies.parked.remove(&key);
                continue;
            }
            let oldest = self.copies.parked.entry(key.clone()).or_insert(seq);
            *oldest = (*oldest).min(seq);
            if !entry.copy_pending {
                entry.copy_pending = true;
                self.copies.retry.push((key, seq));
            }
        }
        // Counters left for a later push (the push was split) hold back
        // every commit from the oldest of them on.
        self.advance_replicated();
    }

    /// The push in flight did not reach enough copies: its counters go into
    /// the next one.
    pub fn handle_push_failed(&mut self, upto_seq: u64) {
        let Some((_, keys, records)) = self
            .copies
            .in_flight
            .take_if(|(upto, ..)| *upto == upto_seq)
        else {
            return;
        };
        self.copies.records.extend(records);
        for (key, seq) in keys {
            if let Some(entry) = self.counters.get_mut(&key) {
                entry.copy_in_flight = false;
                if !entry.copy_pending {
                    entry.copy_pending = true;
                    self.copies.pending.push((key, seq));
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "copies_tests.rs"]
mod tests;
