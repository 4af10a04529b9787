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
//! not explain is decoded as a sum of one submask per replica, bit by bit
//! with a carry ([`sum_of_submasks`]).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tally_client::Client;
use tally_node::crdt::{PnCounter, ReplicaId};

use super::check::{slot_instants, AddTimes, Groups, SlotAt, WipeStats};
use super::node::NodeProc;
use crate::checker::Checker;
use crate::ledger::Ledger;

/// The `--retire-after` the nodes of a `--retire` run get.
pub const RETIRE_AFTER: &str = "2s";

/// Choices of instants one base's check visits at most before it gives up.
const SEARCH_LIMIT: u64 = 20_000_000;

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
/// replica explains. Returns the (key, replica) pairs checked and the
/// fewest acknowledged adds lost with the disks that explain them.
pub fn check_bases(
    checker: &mut Checker,
    groups: &Groups,
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
        let writers: Vec<(ReplicaId, Vec<SlotAt>)> = groups
            .range((key, ReplicaId(0))..=(key, ReplicaId(u64::MAX)))
            .map(|((_, replica), adds)| (*replica, slot_instants(ledger, times, adds, *replica)))
            .collect();
        stats.slots += writers.len() as u64;
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

/// The search of [`explain_base`] gave up.
#[derive(Debug, PartialEq, Eq)]
struct Undecided;

/// The fewest acknowledged adds lost over the choices of one instant per
/// writer (`writers[i]`: writer i's instants) whose sums, plus a submask of
/// each chosen instant's unknown adds, make `(base_p, base_n)`; `None` when
/// no choice does.
fn explain_base(
    writers: &[Vec<SlotAt>],
    base_p: u128,
    base_n: u128,
) -> Result<Option<u64>, Undecided> {
    // The most that writers i.. can still add, to cut hopeless branches.
    let mut reach = vec![(0u128, 0u128); writers.len() + 1];
    for (i, instants) in writers.iter().enumerate().rev() {
        let most = |f: fn(&SlotAt) -> u128| instants.iter().map(f).max().unwrap_or(0);
        reach[i] = (
            reach[i + 1].0 + most(|at| u128::from(at.p) + u128::from(at.unknown_p)),
            reach[i + 1].1 + most(|at| u128::from(at.n) + u128::from(at.unknown_n)),
        );
    }
    let mut search = Search {
        writers,
        base: (base_p, base_n),
        reach,
        chosen: Vec::with_capacity(writers.len()),
        visited: 0,
        best: None,
    };
    search.visit(0, 0, 0, 0)?;
    Ok(search.best)
}

struct Search<'a> {
    writers: &'a [Vec<SlotAt>],
    base: (u128, u128),
    reach: Vec<(u128, u128)>,
    chosen: Vec<SlotAt>,
    visited: u64,
    best: Option<u64>,
}

impl Search<'_> {
    fn visit(&mut self, i: usize, p: u128, n: u128, lost: u64) -> Result<(), Undecided> {
        self.visited += 1;
        if self.visited > SEARCH_LIMIT {
            return Err(Undecided);
        }
        let (base_p, base_n) = self.base;
        if p > base_p || n > base_n || p + self.reach[i].0 < base_p || n + self.reach[i].1 < base_n
        {
            return Ok(());
        }
        if self.best.is_some_and(|best| lost >= best) {
            return Ok(());
        }
        if i == self.writers.len() {
            let masks_p: Vec<u64> = self.chosen.iter().map(|at| at.unknown_p).collect();
            let masks_n: Vec<u64> = self.chosen.iter().map(|at| at.unknown_n).collect();
            if sum_of_submasks(base_p - p, &masks_p) && sum_of_submasks(base_n - n, &masks_n) {
                self.best = Some(lost);
            }
            return Ok(());
        }
        for at in &self.writers[i] {
            self.chosen.push(*at);
            let visited = self.visit(
                i + 1,
                p + u128::from(at.p),
                n + u128::from(at.n),
                lost + at.lost,
            );
            self.chosen.pop();
            visited?;
        }
        Ok(())
    }
}

/// Whether `target` is a sum of one submask of each of `masks`: bit by bit
/// from the lowest, tracking which carries are possible (at most one per
/// mask), so the cost is linear in the bits, not exponential in the masks.
fn sum_of_submasks(target: u128, masks: &[u64]) -> bool {
    let k = masks.len();
    let mut carries = vec![false; k + 1];
    carries[0] = true;
    for bit in 0..128 {
        let available = if bit < 64 {
            masks.iter().filter(|mask| (*mask >> bit) & 1 == 1).count()
        } else {
            0
        };
        let want = ((target >> bit) & 1) as usize;
        let mut next = vec![false; k + 1];
        for carry in (0..=k).filter(|carry| carries[*carry]) {
            for taken in 0..=available {
                let total = carry + taken;
                if total % 2 == want {
                    next[total / 2] = true;
                }
            }
        }
        carries = next;
        if !carries.contains(&true) {
            return false;
        }
    }
    carries[0]
}

#[cfg(test)]
#[path = "folds_tests.rs"]
mod tests;
