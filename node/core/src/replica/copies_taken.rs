//! The copying side of replicated durability (issue 12; see `copies.rs`
//! for the taking side): [`Replica::handle_copy_push`] checks a push from
//! another node of the region whole, refuses it when a counter's partition
//! is not served here (this node would not keep it until the partition's
//! owners hold it: `runtime/copy_plan.rs`), merges the slots like a pulled
//! chunk and says which of its own commits makes them durable; its runtime
//! answers only then.
//!
//! Invariants kept here: a refused push merges nothing; a copy answers only
//! for partitions it serves, and only through a commit that holds what it
//! merged (or holds already); a copy merges (max), so a push received
//! twice, late or out of order changes nothing more.

use crate::crdt::{FoldError, FoldedBase, PnCounter, ReplicaId, Slot};

use super::copies::{CopyPush, MAX_PUSH_COUNTERS};
use super::idempotency_sync::MAX_CHUNK_RECORDS;
use super::types::{DurableState, Key, StorageError};
use super::version::ProtocolWindow;
use super::{AddRefused, Replica};

/// A push that a copy took: it is durable there once the copy's durable
/// sequence reaches `durable_at_seq` (0: already durable).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CopyAccepted {
    /// The copy's commit that makes the push durable.
    pub durable_at_seq: u64,
    /// Counters whose state the push changed, with their new state.
    pub changed: Vec<(Key, PnCounter)>,
}

/// Why a copy refused a push; nothing of it was merged.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum CopyRefused {
    /// The sender belongs to another cluster.
    #[error("copy push from cluster {theirs:?} refused: this node belongs to cluster {ours:?}")]
    WrongCluster {
        /// Ours.
        ours: String,
        /// The sender's.
        theirs: String,
    },
    /// The sender and this node share no protocol version.
    #[error("copy push refused: the sender speaks protocol versions {theirs}, this node speaks {ours}; {advice}")]
    IncompatibleProtocol {
        /// Ours.
        ours: ProtocolWindow,
        /// The sender's.
        theirs: ProtocolWindow,
        /// What to do ([`ProtocolWindow::refusal_advice`]).
        advice: String,
    },
    /// A node is never its own copy.
    #[error("copy push from this very replica ({0}) refused")]
    FromItself(ReplicaId),
    /// Copies are nodes of the sender's region.
    #[error("copy push from region {theirs:?} refused: this node is in region {ours:?}, and copies are taken in the writer's own region")]
    OtherRegion {
        /// Ours.
        ours: String,
        /// The sender's.
        theirs: String,
    },
    /// The sender claims another region than the one this node knows for it.
    #[error("replica {replica} is in region {known:?}, the copy push says {claimed:?}")]
    RegionConflict {
        /// The sender.
        replica: ReplicaId,
        /// What we know.
        known: String,
        /// What the push says.
        claimed: String,
    },
    /// Too many counters in one push.
    #[error("copy push of {0} counters refused: the limit is {MAX_PUSH_COUNTERS}")]
    Oversized(usize),
    /// Too many idempotency records in one push.
    #[error("copy push of {0} idempotency records refused: the limit is {MAX_CHUNK_RECORDS}")]
    OversizedRecords(usize),
    /// The push names the same counter twice.
    #[error("counter {0:?} appears twice in one copy push")]
    DuplicateKey(String),
    /// A counter's pushed state cannot be merged here yet (its fold epoch
    /// is one this node holds no record of, or its base conflicts with
    /// ours): taking it would drop the slot, so the push is not confirmed.
    #[error("copy push refused: the state of counter {key:?} cannot be merged here: {error}")]
    Unmergeable {
        /// The counter.
        key: String,
        /// Why.
        error: FoldError,
    },
    /// A counter of a partition this node does not hold up to date: no
    /// owner would pull it from here, and this node would drop it, so the
    /// copy would not outlive the writer's disk.
    #[error("copy push refused: this node does not hold partition {partition} of counter {key:?} up to date (it does not own it, or is still copying it in); the writer copies to the key's other owners, and to nodes handing the partition away")]
    NotHeld {
        /// The counter.
        key: String,
        /// Its partition.
        partition: u32,
    },
    /// A counter could not be loaded to merge into.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl Replica {
    /// Merges a push from another node of the region, as a copy. Checks the
    /// whole push first: a refused push merges nothing.
    pub fn handle_copy_push(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        push: &CopyPush,
    ) -> Result<CopyAccepted, CopyRefused> {
        if push.cluster_id != self.config.cluster_id {
            return Err(CopyRefused::WrongCluster {
                ours: self.config.cluster_id.clone(),
                theirs: push.cluster_id.clone(),
            });
        }
        let ours = self.peers.own_protocol();
        if !ours.talks_with(&push.protocol) {
            return Err(CopyRefused::IncompatibleProtocol {
                ours,
                theirs: push.protocol,
                advice: ours.refusal_advice(&push.protocol),
            });
        }
        if push.source == self.identity.replica {
            return Err(CopyRefused::FromItself(push.source));
        }
        if push.region != self.identity.region {
            return Err(CopyRefused::OtherRegion {
                ours: self.identity.region.clone(),
                theirs: push.region.clone(),
            });
        }
        if let Some(known) = self.directory.get(&push.source) {
            if *known != push.region {
                return Err(CopyRefused::RegionConflict {
                    replica: push.source,
                    known: known.clone(),
                    claimed: push.region.clone(),
                });
            }
        }
        if push.counters.len() > MAX_PUSH_COUNTERS {
            return Err(CopyRefused::Oversized(push.counters.len()));
        }
        if push.records.len() > MAX_CHUNK_RECORDS {
            return Err(CopyRefused::OversizedRecords(push.records.len()));
        }
        let mut seen = std::collections::HashSet::with_capacity(push.counters.len());
        for (key, ..) in &push.counters {
            if !seen.insert(key.as_ref()) {
                return Err(CopyRefused::DuplicateKey(key.to_string()));
            }
        }
        // Only a node that serves the key's partition keeps it until its
        // owners hold it (invariant 8); see `runtime/copy_plan.rs`.
        #[cfg(feature = "planted-bugs")]
        let takes_any = self.config.planted_bug == Some(super::PlantedBug::CopyToAnyNode);
        #[cfg(not(feature = "planted-bugs"))]
        let takes_any = false;
        for (key, ..) in &push.counters {
            if let Err(AddRefused::NotServed { key, partition }) = self.check_served(key) {
                if !takes_any {
                    return Err(CopyRefused::NotHeld { key, partition });
                }
            }
        }
        // Merged as a pulled chunk is: a folded writer's slot is dropped.
        let book = self.folds.shared_book();
        let incoming =
            |slot: Slot, base: FoldedBase| PnCounter::from_parts([(push.source, slot)], base);
        // Every counter must merge, or none is taken: a slot the merge
        // could not place is not on this node, and the answer would say it
        // is.
        for (key, slot, base) in &push.counters {
            let entry = self.entry(store, key, now_ms)?;
            if let Err(error) = entry
                .live
                .check_merge_folded(&incoming(*slot, *base), &book)
            {
                return Err(CopyRefused::Unmergeable {
                    key: key.to_string(),
                    error,
                });
            }
        }
        if !self.directory.contains(&push.source) {
            self.directory.learn(push.source, push.region.clone());
        }
        let mut changed = Vec::new();
        let mut ticket = 0;
        // The latest commit holding a copy of a partition not kept here,
        // and the earliest at which such a copy is listed in the change log.
        let mut strays_at = None;
        let mut strays_from = u64::MAX;
        for (key, slot, base) in &push.counters {
            let partition = self.folds.partition_of(key);
            let entry = self.entry(store, key, now_ms)?;
            // Checked above, and neither the book nor the counter changed
            // since (a refusal here would leave the push half merged).
            let merged = entry
                .live
                .merge_folded(&incoming(*slot, *base), &book, partition)
                .map_err(|error| CopyRefused::Unmergeable {
                    key: key.to_string(),
                    error,
                })?;
            if merged {
                changed.push((key.clone(), entry.live.clone()));
                self.mark_dirty(key);
            }
            let entry = &self.counters[key];
            // The commit that holds this counter's state: the next one if
            // it waits, the one in flight if it is being written.
            let holds = if entry.dirty {
                self.last_seq + 1
            } else if entry.committing {
                self.last_seq
            } else {
                0
            };
            if !self.keeps(key) {
                strays_at = strays_at.max(Some(holds));
                let listed_at = if holds == 0 { entry.durable_seq } else { holds };
                strays_from = strays_from.min(listed_at);
            }
            #[cfg(feature = "planted-bugs")]
            if self.config.planted_bug == Some(super::PlantedBug::AckBeforeCopyDurable) {
                continue;
            }
            ticket = ticket.max(holds);
        }
        // A copy of a partition this node does not keep (only with the
        // planted bug `CopyToAnyNode`: the check above refuses it) is
        // durable like any other, but no owner pulls it from here: a purge
        // pass drops it once it is committed, keeping this node's own slot.
        if let Some(seq) = strays_at {
            self.purge_strays_at(seq, strays_from);
        }
        // The records go into the next commit, which the answer waits for.
        let seq = self.last_seq + 1;
        if self.learn_records(now_ms, push.source, &push.records, &push.id_keys, seq) > 0 {
            ticket = ticket.max(seq);
        }
        Ok(CopyAccepted {
            durable_at_seq: ticket,
            changed,
        })
    }
}
