//! Retirements and folds (`--retire`), driven as `node/src/fold_keeper.rs`
//! drives them: every fold period each running node hears its peers' fold
//! reports over gossip, runs `handle_fold_round` (which retires an old
//! incarnation once it has been down for `--retire-after` while a newer one
//! of its node is up, and commits or adopts fold records), advances the
//! fold sweep by a bounded step, and wakes its committer. An operator's
//! `retire nN` goes to a running node through `handle_retire`.
//!
//! Invariants: the core does all of it (the simulator only carries reports
//! and calls); every record committed anywhere is shown to the checker,
//! which takes the folded writers' final slots when it sees an epoch first;
//! a writer folded while its node runs with that id is a violation.

use tally_node::crdt::{FoldRecord, ReplicaId, Slot};

use super::SimNode;
use super::{Event, World};
use crate::fold_record::{final_slots, held_states};
use crate::rng::between;

/// How often a node runs a fold round (the node's keeper runs every gossip
/// interval; the simulator's is a little slower).
pub const FOLD_PERIOD_MS: u64 = 200;
/// Stored counters one round's sweep step folds at most.
pub const SWEEP_PER_ROUND: usize = 16;
/// Fold rounds the run waits after the heal on top of `--retire-after`, so
/// that retirements the heal made possible are folded before the end.
pub const FOLD_ROUNDS_AFTER_HEAL: u64 = 15;

/// Counters of retirements and folds in one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FoldStats {
    /// Operator retirements accepted.
    pub operator_retired: u64,
    /// Operator retirements refused (the node still looked up).
    pub operator_refused: u64,
    /// The most retired writers any node knew at the end.
    pub retired: u64,
    /// Fold epochs committed.
    pub epochs: u64,
    /// Writers folded.
    pub writers_folded: u64,
    /// Fold rounds that returned an error (a refused record).
    pub round_errors: u64,
    /// The most slots any final counter state held.
    pub max_slots: u64,
}

impl World<'_> {
    /// How long the run goes on after the heal before it may end.
    pub(super) fn fold_window_ms(&self) -> u64 {
        if self.options.retire {
            self.options.retire_after_ms + FOLD_ROUNDS_AFTER_HEAL * FOLD_PERIOD_MS
        } else {
            0
        }
    }

    pub(super) fn start_fold_rounds(&mut self, node: usize) {
        if !self.options.retire {
            return;
        }
        let epoch = self.nodes[node].epoch;
        let offset = between(&mut self.disk_rng, 0, FOLD_PERIOD_MS - 1);
        self.schedule(offset, Event::FoldRound(node as u16, epoch));
    }

    pub(super) fn fold_round(&mut self, node: usize) {
        let epoch = self.nodes[node].epoch;
        self.schedule(FOLD_PERIOD_MS, Event::FoldRound(node as u16, epoch));
        // Fresh reports from the peers gossip reaches now.
        self.membership.refresh(node, self.now, &mut self.nodes);
        let retire_after = self.options.retire_after_ms;
        let state = &mut self.nodes[node];
        let now = state.local_now(self.now);
        let members = state.replica.fold_members();
        let name = format!("n{node}");
        let result = state
            .replica
            .handle_fold_round(now, &name, &members, Some(retire_after));
        let records = match result {
            Ok(records) => records,
            Err(_) => {
                self.fold_stats.round_errors += 1;
                self.trace.mix(u64::MAX - 2);
                Vec::new()
            }
        };
        for record in records {
            self.fold_recorded(node, &record);
        }
        let state = &mut self.nodes[node];
        let visited = state
            .replica
            .poll_fold_sweep(now, &state.store, SWEEP_PER_ROUND)
            .expect("the memory store always reads");
        let folds = state.replica.folds();
        self.trace.mix_all(&[
            node as u64,
            folds.retired().len() as u64,
            folds.book().epoch(),
            folds.applied(),
            visited as u64,
        ]);
        self.wake_commit(node);
    }

    /// Node `node` committed or adopted `record`: the checker registers it
    /// (taking the writers' final slots the first time) or compares it.
    fn fold_recorded(&mut self, node: usize, record: &FoldRecord) {
        if (self.options.fold_partitions > 0) != record.by_partition.is_some() {
            self.checker.violate(
                self.now,
                "fold record of the wrong kind",
                format!(
                    "n{node} recorded epoch {} {} digests by partition, with --fold-partitions {}",
                    record.epoch,
                    if record.by_partition.is_some() {
                        "with"
                    } else {
                        "without"
                    },
                    self.options.fold_partitions
                ),
            );
        }
        let holder = self.nodes[node].id();
        // A replica whose disk is lost: wiped, or down with a wipe pending.
        let mut lost = self.checker.dead_ids();
        lost.extend(
            self.nodes
                .iter()
                .filter(|node| !node.up && node.wipe_on_restart)
                .map(|node| node.id()),
        );
        let nodes = &self.nodes;
        let up = |writer: ReplicaId| nodes.iter().any(|node| node.up && node.id() == writer);
        let finals = |writer, floors: &[u64]| {
            final_slots_in(nodes, &self.key_names, floors, record.epoch, writer)
        };
        let new = self
            .checker
            .fold_recorded(self.now, (node, holder), record, up, &lost, finals);
        self.fold_stats.epochs += u64::from(new);
    }

    /// `retire nN`: the operator stops and wipes node `node` as the docs
    /// ask, then retires its id through the first running node. The cluster
    /// refuses while failure detection still sees the node up; the wipe
    /// stands either way (the id is then retired by replacement).
    pub(super) fn operator_retire(&mut self, node: usize) {
        if self.nodes[node].up {
            // Not stopped: the operator's runbook stops here.
            self.trace.mix(u64::MAX - 3);
            return;
        }
        if !self.nodes[node].wipe_on_restart {
            self.sets_crashed(node, true);
            self.nodes[node].wipe_on_restart = true;
        }
        let writer = self.nodes[node].id();
        let Some(via) = (0..self.nodes.len())
            .find(|other| *other != node && self.nodes[*other].up && !self.nodes[*other].paused)
        else {
            self.fold_stats.operator_refused += 1;
            return;
        };
        let state = &mut self.nodes[via];
        let members = state.replica.fold_members();
        let accepted = state.replica.handle_retire(writer, &members).is_ok();
        self.trace
            .mix_all(&[node as u64, via as u64, accepted as u64]);
        if accepted {
            self.fold_stats.operator_retired += 1;
        } else {
            self.fold_stats.operator_refused += 1;
        }
        self.wake_commit(via);
    }

    /// Final fold counters, from the nodes' states at the end.
    pub(super) fn finish_fold_stats(&mut self, finals: &[Vec<tally_node::crdt::PnCounter>]) {
        let stats = &mut self.fold_stats;
        stats.writers_folded = self.checker.folds.writers_folded() as u64;
        stats.retired = self
            .nodes
            .iter()
            .map(|node| node.replica.folds().retired().len() as u64)
            .max()
            .unwrap_or(0);
        stats.max_slots = finals
            .iter()
            .flatten()
            .map(|state| state.slots().len() as u64)
            .max()
            .unwrap_or(0);
    }
}

/// The most any replica holds of `writer`'s slot in each counter, on disk
/// or in memory, in states folded below `epoch` and in its current phase
/// (`floors`): what a fold at `epoch` must move into the base. A disk the
/// operator wiped and the writer's own incarnation do not count (what it
/// never shipped is gone).
fn final_slots_in(
    nodes: &[SimNode],
    keys: &[String],
    floors: &[u64],
    epoch: u64,
    writer: ReplicaId,
) -> Vec<Slot> {
    let states = nodes
        .iter()
        .filter(|node| (node.up || !node.wipe_on_restart) && node.id() != writer)
        .flat_map(|node| {
            let core = node.up.then_some(&node.replica);
            held_states(keys, &node.store, core)
        });
    final_slots(floors, epoch, writer, states)
}
