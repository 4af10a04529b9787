//! `tally-sim chaos --retire`: retired replicas folded in a real cluster,
//! and the exact check of the folded bases.
//!
//! The nodes run with a short `--retire-after`, so a wiped node's old
//! incarnation is retired and folded while the run goes on; a node the run
//! removes (`tally admin remove`) is retired by the nodes themselves, with
//! no `tally admin retire`. After the heal the run waits until every running node has
//! folded every dead replica and applied every fold ([`wait_folded`]); then
//! no final state may hold a slot of a folded replica, and its adds are in
//! the counters' folded bases.
//!
//! The check of a base (invariant 9, DESIGN.md: a fold never changes a
//! value). A replica is folded at its final state, which (as for a wiped
//! one, `check.rs`) is its durable slot at one instant before its disk was
//! lost: peers only ever pull a completed commit's state, and a slot only
//! grows. So a counter's base must be, for some instant per folded replica,
//! the sum of their adds acknowledged before it plus some of their adds in
//! flight then. An add counted twice, or a later add without an earlier
//! acknowledged one, fits no choice of instants. The adds in flight of
//! several replicas may share a magnitude (lanes are per node, and the
//! incarnations of one node reuse them), so what the acknowledged adds do
//! not explain is a sum of one submask per replica (the search is in
//! `base_search.rs`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tally_client::Client;
use tally_node::crdt::{PnCounter, ReplicaId};

use super::base_search::{explain_base, Undecided, SEARCH_LIMIT};
use super::check::{slot_instants, AddTimes, Groups, SlotAt, WipeStats};
use super::node::NodeProc;
use super::scoped::Splits;
use crate::checker::Checker;
use crate::ledger::Ledger;

/// The `--retire-after` the nodes of a `--retire` run get.
pub const RETIRE_AFTER: &str = "2s";

/// Waits until every running node has retired and folded every replica of
/// `expected` (the run's dead incarnations) and applied every fold it
/// holds; a timeout records what still waited as violations. A retired
/// replica the run did not kill for good is a violation at once. Returns
/// the replicas folded at some node.
pub async fn wait_folded(
    nodes: &[NodeProc],
    running: &[bool],
    expected: &BTreeSet<ReplicaId>,
    timeout: Duration,
    checker: &mut Checker,
) -> BTreeSet<ReplicaId> {
    let started = Instant::now();
    let mut unexpected = BTreeSet::new();
    loop {
        let mut pending: Vec<String> = Vec::new();
        let mut folded = BTreeSet::new();
        let mut highest = 0;
        for (i, node) in nodes.iter().enumerate().filter(|(i, _)| running[*i]) {
            let status = match Client::connect(node.endpoint.clone()).await {
                Ok(client) => client.status().await.map_err(|e| e.to_string()),
                Err(error) => Err(error.to_string()),
            };
            let status = match status {
                Ok(status) => status,
                Err(error) => {
                    pending.push(format!("n{i} does not answer: {error}"));
                    continue;
                }
            };
            let epoch = status.retired.iter().map(|r| r.folded_epoch).max();
            highest = highest.max(epoch.unwrap_or(0));
            for writer in &status.retired {
                let replica = ReplicaId(writer.replica);
                if !expected.contains(&replica) && unexpected.insert(replica) {
                    checker.violate(
                        0,
                        "live replica retired",
                        format!("n{i} lists replica {replica} as retired ({}), but the run never wiped or removed it", writer.reason),
                    );
                }
                if writer.folded_epoch > 0 {
                    folded.insert(replica);
                }
            }
            for replica in expected {
                match status.retired.iter().find(|r| r.replica == replica.0) {
                    None => pending.push(format!("n{i} has not retired replica {replica}")),
                    Some(writer) if writer.folded_epoch == 0 => pending.push(format!(
                        "n{i}: the fold of replica {replica} waits: {}",
                        writer.waiting
                    )),
                    Some(_) => {}
                }
            }
            if status.folds_applied < epoch.unwrap_or(0) {
                pending.push(format!(
                    "n{i} applied folds up to epoch {} of {}",
                    status.folds_applied,
                    epoch.unwrap_or(0)
                ));
            }
        }
        if pending.is_empty() {
            println!(
                "folds: {} replicas folded in {highest} epochs, applied at every node {} ms after the heal",
                folded.len(),
                started.elapsed().as_millis()
            );
            return folded;
        }
        if started.elapsed() >= timeout {
            for line in pending.iter().take(10) {
                checker.violate(0, "fold not done", line.clone());
            }
            return folded;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The exact check of the folded bases (module documentation): per key,
/// no slot of a folded replica, and a base that one instant per folded
/// replica explains, together with the folded part of each live replica's
/// slot that `splits` lists (`scoped.rs`). Returns the (key, replica) pairs
/// checked and the fewest acknowledged adds lost with the disks that
/// explain them.
pub fn check_bases(
    checker: &mut Checker,
    groups: &Groups,
    splits: &Splits,
    ledger: &Ledger,
    times: &AddTimes,
    finals: &[PnCounter],
    folded: &BTreeSet<ReplicaId>,
) -> WipeStats {
    let mut stats = WipeStats::default();
    for (key, state) in finals.iter().enumerate() {
        for (replica, slot) in state.slots() {
            if folded.contains(replica) {
                checker.violate(
                    0,
                    "slot of a folded replica",
                    format!(
                        "key {key}: replica {replica} was folded but its slot (p {}, n {}) is still there",
                        slot.p, slot.n
                    ),
                );
            }
        }
        let live = splits
            .range((key, ReplicaId(0))..=(key, ReplicaId(u64::MAX)))
            .map(|((_, replica), parts)| (*replica, parts.clone()));
        let dead: Vec<(ReplicaId, Vec<SlotAt>)> = groups
            .range((key, ReplicaId(0))..=(key, ReplicaId(u64::MAX)))
            .map(|((_, replica), adds)| (*replica, slot_instants(ledger, times, adds, *replica)))
            .collect();
        stats.slots += dead.len() as u64;
        let writers: Vec<(ReplicaId, Vec<SlotAt>)> = dead.into_iter().chain(live).collect();
        let base = state.folded();
        let candidates: Vec<Vec<SlotAt>> = writers.iter().map(|(_, at)| at.clone()).collect();
        let names: Vec<String> = writers.iter().map(|(r, _)| r.to_string()).collect();
        match explain_base(&candidates, base.p, base.n) {
            Ok(Some(lost)) => stats.acked_lost += lost,
            Ok(None) => checker.violate(
                0,
                "folded base does not match the adds",
                format!(
                    "key {key}: folded base (p {}, n {}) at epoch {} is not the sum of the folded \
                     replicas' [{}] acknowledged adds up to one instant each plus adds in flight then",
                    base.p,
                    base.n,
                    base.epoch,
                    names.join(", ")
                ),
            ),
            Err(Undecided) => checker.violate(
                0,
                "folded base not checked",
                format!(
                    "key {key}: more than {SEARCH_LIMIT} choices of instants of replicas [{}]; \
                     run with fewer wipes",
                    names.join(", ")
                ),
            ),
        }
    }
    stats
}

#[cfg(test)]
#[path = "folds_tests.rs"]
mod tests;
