//! Replica ordinals: counter records name the replica of each slot by a
//! small number that this store gave it, instead of its 8-byte id. Three
//! regions' ids were 24 of a record's 35 bytes.
//!
//! The numbering is the store's own and never changes: ordinal `n` is the
//! `n`-th replica that this store wrote a slot of, kept under
//! `r` + `n` (see [`super::encoding`]). A replica's number is written in the
//! same batch as the first record that uses it, ahead of it (a crash keeps
//! a batch whole, or a prefix of it that the commit log completes), so no
//! durable record names an unknown ordinal; a store takes a batch's new numbers only once
//! the batch is written ([`Ordinals::plan`], then [`Ordinals::extend`]).

use std::collections::HashMap;

use crate::crdt::ReplicaId;
use crate::replica::{CommitBatch, StorageError};

/// See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct Ordinals {
    replicas: Vec<ReplicaId>,
    numbers: HashMap<ReplicaId, u32>,
}

impl Ordinals {
    /// No replica numbered yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The replica numbered `ordinal`.
    pub fn replica(&self, ordinal: u32) -> Option<ReplicaId> {
        self.replicas.get(ordinal as usize).copied()
    }

    /// The number of `replica`, if it has one.
    pub fn ordinal(&self, replica: ReplicaId) -> Option<u32> {
        self.numbers.get(&replica).copied()
    }

    /// Takes a stored entry back at recovery; entries come in ordinal order.
    pub fn recover(&mut self, ordinal: u32, replica: ReplicaId) -> Result<(), StorageError> {
        if ordinal as usize != self.replicas.len() || self.numbers.contains_key(&replica) {
            return Err(StorageError(format!(
                "corrupt replica ordinals: entry {ordinal} for {replica} does not follow the {} before it",
                self.replicas.len()
            )));
        }
        self.push(replica);
        Ok(())
    }

    /// Numbers for the replicas of `batch` that have none, in the order
    /// they first appear: the entries to write with the batch.
    pub fn plan(&self, batch: &CommitBatch) -> Vec<(u32, ReplicaId)> {
        let mut new: Vec<(u32, ReplicaId)> = Vec::new();
        for (_, state) in &batch.counters {
            for (replica, _) in state.slots() {
                if self.ordinal(*replica).is_none() && !new.iter().any(|(_, r)| r == replica) {
                    let ordinal = u32::try_from(self.replicas.len() + new.len())
                        .expect("fewer than 4 billion replicas");
                    new.push((ordinal, *replica));
                }
            }
        }
        new
    }

    /// Takes the numbers of a batch that is now written.
    pub fn extend(&mut self, new: &[(u32, ReplicaId)]) {
        for (ordinal, replica) in new {
            debug_assert_eq!(*ordinal as usize, self.replicas.len());
            self.push(*replica);
        }
    }

    fn push(&mut self, replica: ReplicaId) {
        let ordinal = u32::try_from(self.replicas.len()).expect("fewer than 4 billion replicas");
        self.replicas.push(replica);
        self.numbers.insert(replica, ordinal);
    }
}

/// The number of `replica` in `ordinals`, or in a batch's planned `new` ones.
pub fn ordinal_in(ordinals: &Ordinals, new: &[(u32, ReplicaId)], replica: ReplicaId) -> u32 {
    ordinals
        .ordinal(replica)
        .or_else(|| new.iter().find(|(_, r)| *r == replica).map(|(o, _)| *o))
        .expect("every replica of a batch is numbered by its plan")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crdt::{PnCounter, Slot};

    fn batch(slots: &[&[u64]]) -> CommitBatch {
        CommitBatch {
            counters: slots
                .iter()
                .enumerate()
                .map(|(i, replicas)| {
                    let state = PnCounter::from_slots(
                        replicas
                            .iter()
                            .map(|r| (ReplicaId(*r), Slot { p: 1, n: 0 })),
                    );
                    (format!("k{i}").into(), state)
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_batch_numbers_each_new_replica_once_and_keeps_old_numbers() {
        let mut ordinals = Ordinals::new();
        let first = ordinals.plan(&batch(&[&[30, 10], &[10, 20]]));
        assert_eq!(first.len(), 3);
        let numbers: Vec<u32> = first.iter().map(|(o, _)| *o).collect();
        assert_eq!(numbers, vec![0, 1, 2]);
        assert_eq!(
            ordinals.replica(0),
            None,
            "nothing taken before the batch is written"
        );
        ordinals.extend(&first);
        let second = ordinals.plan(&batch(&[&[20, 40]]));
        assert_eq!(second.len(), 1);
        assert_eq!(second[0], (3, ReplicaId(40)));
        assert_eq!(ordinal_in(&ordinals, &second, ReplicaId(40)), 3);
        ordinals.extend(&second);
        for (ordinal, replica) in first.iter().chain(&second) {
            assert_eq!(ordinals.replica(*ordinal), Some(*replica));
            assert_eq!(ordinals.ordinal(*replica), Some(*ordinal));
        }
    }

    #[test]
    fn recovery_refuses_gaps_and_repeats() {
        let mut ordinals = Ordinals::new();
        ordinals.recover(0, ReplicaId(7)).unwrap();
        assert!(ordinals.recover(2, ReplicaId(8)).is_err());
        assert!(ordinals.recover(1, ReplicaId(7)).is_err());
        ordinals.recover(1, ReplicaId(8)).unwrap();
        assert_eq!(ordinals.replica(1), Some(ReplicaId(8)));
    }
}
