//! Retirements and folds in partitioned regions, driven as
//! `node/src/fold_keeper.rs` drives them: every fold period each running
//! node hears its peers' fold reports (in its peer book), retires the
//! replicas its lifecycle knows to be removed, runs `handle_fold_round`,
//! advances the fold sweep by a bounded step, prunes folded writers, and
//! publishes its report.
//!
//! Two kinds of fold happen: removed nodes' writers are folded whole (by
//! partition, as every cluster this build opens does), and a live writer's
//! slots in a partition that moved away from it for `--retire-after-ms`
//! are folded there (a scoped fold), after which the writer writes the
//! partition again in a new phase if it comes back.
//!
//! Invariants: the core does all of it (the simulator only carries reports
//! and calls); every record committed anywhere is shown to the checker
//! (`fold_record.rs`), which takes the folded writers' final slots when it
//! sees an epoch first; a writer folded while its node runs with that id
//! is a violation.

use std::collections::BTreeSet;

use tally_node::crdt::{FoldError, FoldRecord, ReplicaId, Slot};

use super::node::PartNode;
use super::world::{Ev, PWorld};
use crate::fold_record::{final_slots, held_states};
use crate::rng::between;

/// How often a node runs a fold round.
pub const FOLD_PERIOD_MS: u64 = 200;
/// Stored counters one round's sweep step folds at most.
const SWEEP_PER_ROUND: usize = 16;

impl PWorld<'_> {
    pub(super) fn start_fold_rounds(&mut self, node: usize) {
        let epoch = self.nodes[node].epoch;
        let offset = between(&mut self.disk_rng, 0, FOLD_PERIOD_MS - 1);
        self.schedule(offset, Ev::FoldRound(node as u16, epoch));
    }

    pub(super) fn fold_round(&mut self, node: usize) {
        let epoch = self.nodes[node].epoch;
        self.schedule(FOLD_PERIOD_MS, Ev::FoldRound(node as u16, epoch));
        self.refresh_peer_book(node);
        let now = self.clock(node);
        let retire_after = Some(self.options.retire_after_ms);
        let state = &mut self.nodes[node];
        let name = state.name.clone();
        let scoped = state.scoped_mut();
        let removed = scoped.partitions.removed().clone();
        let core = &mut scoped.core;
        let members = core.fold_members();
        core.note_node_names(&members);
        for replica in removed {
            if !core.folds().is_retired(replica) {
                // Refused while the removed node is seen alive.
                let _ = core.handle_retire(replica, &members);
            }
        }
        let records = match core.handle_fold_round(now, &name, &members, retire_after) {
            Ok(records) => records,
            Err(FoldError::Gap { .. }) => {
                // A record ahead of one not learned yet waits for it.
                self.stats.fold_errors += 1;
                Vec::new()
            }
            Err(refused) => {
                self.checker.violate(
                    self.now,
                    "fold round refused a record",
                    format!("n{node}: {refused}"),
                );
                self.stats.fold_errors += 1;
                Vec::new()
            }
        };
        let visited = core
            .poll_fold_sweep(now, &scoped.store, SWEEP_PER_ROUND)
            .expect("the memory store reads");
        core.prune_folded();
        let heard_peer = members
            .iter()
            .any(|member| member.alive && member.replica != core.identity().replica);
        if heard_peer {
            core.release_restart_hold();
        }
        let folds = core.folds();
        let mix = [
            node as u64,
            folds.retired().len() as u64,
            folds.book().epoch(),
            visited as u64,
        ];
        state.report = Some(state.scoped().core.fold_report());
        self.trace.mix_all(&mix);
        for record in records {
            self.fold_recorded(node, &record);
        }
        self.wake_commit(node);
    }

    /// Node `node` committed or adopted `record`: the checker registers it
    /// (taking the writers' final slots the first time) or compares it.
    fn fold_recorded(&mut self, node: usize, record: &FoldRecord) {
        let holder = self.nodes[node].id();
        let lost: BTreeSet<ReplicaId> = self.checker.dead_ids();
        let nodes = &self.nodes;
        let finals = |writer, floors: &[u64]| {
            let scoped = record.scoped.iter().any(|(scoped, _)| *scoped == writer);
            let held = (floors, record.epoch);
            final_slots_in(nodes, &self.key_names, held, writer, scoped)
        };
        let up = |writer: ReplicaId| {
            nodes
                .iter()
                .any(|node| node.up && node.node.as_ref().is_some_and(|n| n.id() == writer))
        };
        let new = self
            .checker
            .fold_recorded(self.now, (node, holder), record, up, &lost, finals);
        self.stats.fold_epochs += u64::from(new);
    }
}

/// The most any node that kept its disk holds of `writer`'s slot in each
/// counter, stored or cached, in states below `held.1` and at or above
/// each counter's phase floor `held.0` (see `final_slots`). The writer's
/// own states count when it is folded in some partitions only (`scoped`:
/// it runs, and what it holds of itself must have reached the keepers).
fn final_slots_in(
    nodes: &[PartNode],
    keys: &[String],
    held: (&[u64], u64),
    writer: ReplicaId,
    scoped: bool,
) -> Vec<Slot> {
    let (floors, epoch) = held;
    let states = nodes
        .iter()
        .filter(|node| !node.removed)
        .filter_map(|node| node.node.as_ref().map(|scoped| (node.up, scoped)))
        .filter(|(_, node)| scoped || node.id() != writer)
        .flat_map(|(up, scoped)| {
            let core = up.then_some(&scoped.core);
            held_states(keys, &scoped.store, core)
        });
    final_slots(floors, epoch, writer, states)
}
