//! How a world shows the checker a fold record that a node committed or
//! adopted (shared by the whole-cluster world and the partitioned one): a
//! writer folded whole while its node runs with that id is a violation; the
//! first time an epoch is seen, each folded writer's final slot is taken as
//! the most any replica then holds of it in its current phase, below that
//! epoch (`final_slots`); the record is then registered with, or compared
//! against, the fold accounting (`fold_check.rs`).

use std::collections::BTreeSet;

use tally_node::crdt::{FoldRecord, PnCounter, ReplicaId, Slot};
use tally_node::replica::{DurableState, Replica};

use crate::checker::Checker;
use crate::fold_check::FoldShape;

/// What one replica holds of each of `keys` (by index): its stored state,
/// and its cached one when it runs (`core`).
pub fn held_states<'a>(
    keys: &'a [String],
    store: &'a impl DurableState,
    core: Option<&'a Replica>,
) -> impl Iterator<Item = (usize, PnCounter)> + 'a {
    keys.iter().enumerate().flat_map(move |(key, name)| {
        let stored = store.load_counter(name).ok().flatten();
        let cached = core.and_then(|core| core.cached_state(name)).cloned();
        let stored = stored.map(|stored| (key, stored.state));
        stored.into_iter().chain(cached.map(|state| (key, state)))
    })
}

/// The most that `states` (pairs of a key and a state some replica holds
/// of it, on disk or in memory: [`held_states`]) hold of `writer`'s slot in
/// each counter, in states folded below `epoch` and at or above the
/// counter's `floors` (where the writer's current phase began:
/// `FoldAccounting::phase_floors`): what a fold at `epoch` must move into
/// the base.
pub fn final_slots(
    floors: &[u64],
    epoch: u64,
    writer: ReplicaId,
    states: impl IntoIterator<Item = (usize, PnCounter)>,
) -> Vec<Slot> {
    let mut finals = vec![Slot::default(); floors.len()];
    for (key, state) in states {
        let at = state.folded().epoch;
        if floors[key] <= at && at < epoch {
            let slot = state.slot(writer);
            let last = &mut finals[key];
            last.p = last.p.max(slot.p);
            last.n = last.n.max(slot.n);
        }
    }
    finals
}

impl Checker {
    /// Node `by.0` (replica `by.1`) committed or adopted `record`. `up`
    /// says whether a replica id is the running incarnation of a node;
    /// `lost` are the replicas whose disks are gone; `finals(writer)` gives
    /// a folded writer's final slots from its phase floors (see
    /// [`final_slots`]), asked only the first time the epoch is seen.
    /// Returns whether the epoch is new.
    pub fn fold_recorded(
        &mut self,
        now: u64,
        by: (usize, ReplicaId),
        record: &FoldRecord,
        up: impl Fn(ReplicaId) -> bool,
        lost: &BTreeSet<ReplicaId>,
        finals: impl Fn(ReplicaId, &[u64]) -> Vec<Slot>,
    ) -> bool {
        let (node, holder) = by;
        let shape = FoldShape::of(record);
        let writers: Vec<ReplicaId> = shape.writers().collect();
        let finals: Vec<Vec<Slot>> = match self.folds.holds(record.epoch, &shape) {
            true => Vec::new(),
            false => writers
                .iter()
                .map(|writer| finals(*writer, &self.folds.phase_floors(*writer)))
                .collect(),
        };
        for writer in &shape.whole {
            if let Some(owner) = self.live_node_of(*writer).filter(|_| up(*writer)) {
                self.violate(
                    now,
                    "live writer folded",
                    format!(
                        "n{node} folded {writer} at epoch {}, but n{owner} runs with that id",
                        record.epoch
                    ),
                );
            }
        }
        let gone = |replica: ReplicaId| lost.contains(&replica);
        let outcome = self
            .folds
            .record(record.epoch, &shape, holder, &gone, |writer| {
                let index = writers.iter().position(|w| *w == writer);
                index
                    .and_then(|index| finals.get(index).cloned())
                    .unwrap_or_default()
            });
        match outcome {
            Ok(new) => new,
            Err((kind, detail)) => {
                self.violate(now, kind, format!("n{node}: {detail}"));
                false
            }
        }
    }
}
