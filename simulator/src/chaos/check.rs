//! The final check of a chaos run: every node's full state read slot by slot
//! (a full `Pull` on its real gRPC port, bypassing the proxies), then the
//! simulator's exact per-slot check, extended for wiped replicas.
//!
//! A wiped replica (DESIGN.md, invariant 3) is gone with its disk; what
//! survives of its slot is what peers pulled from it before the wipe. Peers
//! are only ever served its durable state as of a completed commit, and a slot
//! only grows, so per key the surviving slot is the replica's durable slot at
//! one instant `T` before the wipe. The check asks that some `T` explain the
//! slot exactly: every add acknowledged before `T` is in it, no add sent after
//! `T` is, and the adds in flight at `T` (sent before it, answered after it or
//! never) are in it or not. Those in-flight adds hold distinct lanes (a lane is
//! held from the issue of an add until its answer), so, as for live replicas,
//! the rest decodes bit by bit. Acknowledged adds after the last pull are lost
//! with the disk; that is what a wipe means, and the run reports how many.
//! Times are a logical clock ticked under the ledger's lock at every issue and
//! every answer, so they order the events exactly as the lanes saw them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Context;
use tally_client::Client;
use tally_node::api::convert;
use tally_node::crdt::{Crdt, PnCounter, ReplicaId, Slot};
use tally_proto::v1 as proto;
use tally_proto::v1::replication_client::ReplicationClient;

use super::node::NodeProc;
use crate::checker::Checker;
use crate::ledger::Ledger;

/// A node's full durable state, per key index (keys not in `names` ignored).
pub async fn read_state(
    endpoint: &str,
    cluster: &str,
    names: &[String],
) -> anyhow::Result<Vec<PnCounter>> {
    let mut client = ReplicationClient::connect(endpoint.to_string())
        .await
        .with_context(|| format!("cannot reach {endpoint} to read its state"))?
        .max_decoding_message_size(64 << 20);
    let mut states = vec![PnCounter::new(); names.len()];
    let mut after: Option<proto::Cursor> = None;
    for _ in 0..1_000 {
        let request = proto::PullRequest {
            cluster_id: cluster.to_string(),
            caller_replica: 0,
            expected_replica: 0,
            after: after.clone(),
            max_bytes: 16 << 20,
            // The checker reads like a node of this build.
            protocol_version: tally_node::replica::version::NEWEST,
            protocol_oldest: tally_node::replica::version::OLDEST,
            ..Default::default()
        };
        let mut stream = client.pull(request).await?.into_inner();
        let mut complete = false;
        while let Some(chunk) = stream.message().await? {
            for counter in chunk.counters {
                let Some(key) = names.iter().position(|name| name.as_bytes() == counter.key) else {
                    continue;
                };
                let slots = counter.slots.iter().map(|slot| {
                    (
                        ReplicaId(slot.replica),
                        Slot {
                            p: slot.p,
                            n: slot.n,
                        },
                    )
                });
                let base = counter.folded.map(convert::folded_from).unwrap_or_default();
                merge_states(&mut states[key], &PnCounter::from_parts(slots, base));
            }
            if chunk.next.is_some() {
                after = chunk.next;
                complete = chunk.complete;
            }
        }
        if complete {
            return Ok(states);
        }
    }
    anyhow::bail!("{endpoint} never finished answering a full pull")
}

/// Merges `other` into `state`: slot by slot at one fold epoch; across
/// epochs the state of the higher one is kept as it is (the reader holds no
/// fold records to drop the folded slots of the lower one with, and a
/// settled run never mixes epochs).
pub fn merge_states(state: &mut PnCounter, other: &PnCounter) {
    if state.folded().epoch == other.folded().epoch {
        state.merge(other);
    } else if other.folded().epoch > state.folded().epoch {
        *state = other.clone();
    }
}

/// When each add was issued and answered, on the ledger's logical clock.
#[derive(Debug, Default)]
pub struct AddTimes {
    /// Clock at issue, per add id.
    pub sent: Vec<u64>,
    /// Clock at the answer (`u64::MAX` if none came), per add id.
    pub answered: Vec<u64>,
}

/// Totals of the check of wiped replicas.
#[derive(Clone, Copy, Debug, Default)]
pub struct WipeStats {
    /// (key, wiped replica) slots checked.
    pub slots: u64,
    /// Acknowledged adds of wiped replicas that no peer had pulled.
    pub acked_lost: u64,
    /// Of `slots`, those of folded replicas, checked through the bases.
    pub folded: u64,
    /// Live replicas' slots partly folded (`scoped.rs`), checked through
    /// the bases too (not in `slots`).
    pub split: u64,
}

/// The exact check: live replicas through [`Checker::check_slots`], wiped ones
/// as the module documentation says, and with `--retire` the folded ones
/// through the counters' folded bases (`folds.rs`).
pub fn check_all(
    checker: &mut Checker,
    ledger: &Ledger,
    times: &AddTimes,
    finals: &[PnCounter],
    folded: &BTreeSet<ReplicaId>,
) -> (crate::checker::SlotStats, WipeStats) {
    let dead = checker.dead_ids();
    // Dead replicas are checked below; live slots partly folded with a
    // partition that moved away from their node are checked with the
    // bases (`scoped.rs`); the rest as live slots.
    let splits = super::scoped::live_splits(ledger, times, finals, &dead);
    let (live, live_finals) = super::scoped::without_slots(ledger, finals, |key, replica| {
        dead.contains(&replica) || splits.contains_key(&(key, replica))
    });
    let stats = checker.check_slots(0, &live, &live_finals);
    for replica in folded.iter().filter(|replica| !dead.contains(replica)) {
        checker.violate(
            0,
            "live replica folded",
            format!("replica {replica} was folded but the run never wiped or removed it"),
        );
    }
    let groups = dead_writers_adds(ledger, &dead);
    let (wiped_groups, folded_groups): (Groups, Groups) = groups
        .into_iter()
        .partition(|((_, replica), _)| !folded.contains(replica));
    let unfolded: BTreeSet<ReplicaId> = dead.difference(folded).copied().collect();
    let mut wiped = check_wiped(checker, &wiped_groups, ledger, times, finals, &unfolded);
    let in_bases = super::folds::check_bases(
        checker,
        &folded_groups,
        &splits,
        ledger,
        times,
        finals,
        folded,
    );
    wiped.slots += in_bases.slots;
    wiped.folded += in_bases.slots;
    wiped.split += splits.len() as u64;
    wiped.acked_lost += in_bases.acked_lost;
    (stats, wiped)
}

/// The adds delivered to each (key, dead replica), by add id.
pub(super) type Groups = BTreeMap<(usize, ReplicaId), Vec<u32>>;

fn dead_writers_adds(ledger: &Ledger, dead: &BTreeSet<ReplicaId>) -> Groups {
    let mut groups = Groups::new();
    for (id, add) in ledger.adds.iter().enumerate() {
        for replica in add.delivered.iter().filter(|r| dead.contains(r)) {
            groups
                .entry((add.key as usize, *replica))
                .or_default()
                .push(id as u32);
        }
    }
    groups
}

/// What a dead replica's slot of one key can be if its last state that
/// peers pulled was its durable state at one instant: the acknowledged adds
/// answered before it (`p`, `n`), the adds sent before it whose fate was
/// unknown then (any subset of these magnitudes may be in it), and the
/// acknowledged adds sent after it, lost with the disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct SlotAt {
    pub p: u64,
    pub n: u64,
    pub unknown_p: u64,
    pub unknown_n: u64,
    pub lost: u64,
}

impl SlotAt {
    /// Whether `slot` is this instant's acknowledged adds plus some of the
    /// unknown ones (distinct lanes, so the rest decodes bit by bit).
    pub(super) fn explains(&self, slot: Slot) -> bool {
        let (Some(rest_p), Some(rest_n)) = (slot.p.checked_sub(self.p), slot.n.checked_sub(self.n))
        else {
            return false;
        };
        rest_p & !self.unknown_p == 0 && rest_n & !self.unknown_n == 0
    }
}

/// [`SlotAt`] for every instant that matters to `adds` (those delivered to
/// `replica` for one key): the start, and just after each send and each
/// answer. Latest first, so the first that explains a slot loses fewest.
pub(super) fn slot_instants(
    ledger: &Ledger,
    times: &AddTimes,
    adds: &[u32],
    replica: ReplicaId,
) -> Vec<SlotAt> {
    // Candidate instants: just after each event (doubled clock, odd values).
    let mut instants: Vec<u64> = vec![0];
    for id in adds {
        let (sent, answered) = (times.sent[*id as usize], times.answered[*id as usize]);
        instants.push(sent * 2 + 1);
        if answered != u64::MAX {
            instants.push(answered * 2 + 1);
        }
    }
    instants.sort_unstable();
    instants.dedup();
    instants
        .iter()
        .rev()
        .map(|t| {
            let mut at = SlotAt {
                p: 0,
                n: 0,
                unknown_p: 0,
                unknown_n: 0,
                lost: 0,
            };
            for id in adds {
                let add = &ledger.adds[*id as usize];
                let (sent, answered) = (times.sent[*id as usize] * 2, times.answered[*id as usize]);
                let answered = answered.saturating_mul(2);
                let acked = add.certain_at(replica).is_some();
                if sent > *t {
                    at.lost += u64::from(acked);
                } else if acked && answered < *t {
                    if add.negative {
                        at.n += add.magnitude();
                    } else {
                        at.p += add.magnitude();
                    }
                } else if add.negative {
                    at.unknown_n |= add.magnitude();
                } else {
                    at.unknown_p |= add.magnitude();
                }
            }
            at
        })
        .collect()
}

fn check_wiped(
    checker: &mut Checker,
    groups: &Groups,
    ledger: &Ledger,
    times: &AddTimes,
    finals: &[PnCounter],
    dead: &BTreeSet<ReplicaId>,
) -> WipeStats {
    let mut stats = WipeStats::default();
    for (key, state) in finals.iter().enumerate() {
        for (replica, slot) in state.slots() {
            if dead.contains(replica)
                && !groups.contains_key(&(key, *replica))
                && *slot != Slot::default()
            {
                checker.violate(
                    0,
                    "slot without adds",
                    format!("key {key}: wiped replica {replica} has slot ({}, {}) but no add reached it", slot.p, slot.n),
                );
            }
        }
    }
    for ((key, replica), adds) in groups {
        stats.slots += 1;
        let slot = finals[*key].slot(*replica);
        let instants = slot_instants(ledger, times, adds, *replica);
        // The latest instant that explains the slot (fewest losses).
        match instants.iter().find(|at| at.explains(slot)) {
            Some(at) => stats.acked_lost += at.lost,
            None => checker.violate(
                0,
                "slot does not match the adds",
                format!(
                    "key {key}, wiped replica {replica}: final slot (p {}, n {}) is not its \
                     acknowledged adds up to any one instant plus adds in flight then",
                    slot.p, slot.n
                ),
            ),
        }
    }
    stats
}

/// Every node holds every key: waits until all nodes publish the same
/// digests, then reads every node's state, checks that they agree slot by
/// slot, and returns the first node's.
pub async fn converge_everywhere(
    nodes: &[NodeProc],
    cluster: &str,
    names: &[String],
    timeout: Duration,
    checker: &mut Checker,
) -> anyhow::Result<Vec<PnCounter>> {
    let n = nodes.len();
    let heal = Instant::now();
    let mut converged = None;
    while heal.elapsed() < timeout {
        let mut digests = Vec::new();
        for node in nodes.iter() {
            // Both digests: the counters' and the like sets' and uniques'.
            let digest = match Client::connect(node.endpoint.clone()).await {
                Ok(client) => client
                    .status()
                    .await
                    .ok()
                    .map(|s| (s.node.digest, s.node.sets_digest)),
                Err(_) => None,
            };
            digests.push(digest);
        }
        if digests.iter().all(|d| d.is_some() && *d == digests[0]) {
            converged = Some(heal.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut finals: Vec<Vec<PnCounter>> = Vec::new();
    for node in nodes.iter() {
        finals.push(read_state(&node.endpoint, cluster, names).await?);
    }
    match converged {
        Some(elapsed) => println!("convergence: {} ms after the heal", elapsed.as_millis()),
        None => checker.violate(
            0,
            "no convergence",
            format!(
                "digests still differ {} s after the heal",
                timeout.as_secs()
            ),
        ),
    }
    for (key, first) in finals[0].iter().enumerate() {
        if let Some(node) = (1..n).find(|node| finals[*node][key] != *first) {
            checker.violate(
                0,
                "replicas differ",
                format!(
                    "key {}: n0 {first:?}, n{node} {:?}",
                    names[key], finals[node][key]
                ),
            );
        }
    }
    Ok(finals.swap_remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Ledger;

    /// Three acknowledged adds on one wiped replica, in order, and one in flight.
    #[track_caller]
    fn run(slot_p: u64) -> u64 {
        let old = ReplicaId(7);
        let mut checker = Checker::new(1, 1);
        checker.started_fresh(0, 0, old);
        let mut ledger = Ledger::new(1, 1);
        let mut times = AddTimes::default();
        let mut clock = 0;
        let mut ids = Vec::new();
        for _ in 0..4 {
            let id = ledger.issue(0, 0, 0, false, true).unwrap();
            ledger.delivered(id, old);
            clock += 1;
            times.sent.push(clock);
            times.answered.push(u64::MAX);
            ids.push(id);
        }
        // Answers in order, except the last add, never answered.
        for id in &ids[..3] {
            ledger.answered(*id, old, 0, false);
            clock += 1;
            times.answered[*id as usize] = clock;
        }
        ledger.abandon(ids[3]);
        checker.started_fresh(0, 0, ReplicaId(8));
        let finals = vec![PnCounter::from_slots([(old, Slot { p: slot_p, n: 0 })])];
        let (_, wiped) = check_all(&mut checker, &ledger, &times, &finals, &BTreeSet::new());
        assert_eq!(wiped.slots, 1);
        checker.violation_count
    }

    #[test]
    fn a_wiped_slot_must_be_its_adds_up_to_one_instant() {
        // Lanes 0, 1, 2, 3 (magnitudes 1, 2, 4, 8): all sent before any answer,
        // so any subset of them was in flight at some instant.
        assert_eq!(run(0), 0, "nothing pulled before the wipe");
        assert_eq!(run(1 + 2 + 4 + 8), 0, "everything pulled");
        assert_eq!(run(1 + 4), 0, "in flight together, any subset");
        assert_ne!(run(16), 0, "a magnitude no add had");
        assert_ne!(run(2 * (1 + 2 + 4 + 8)), 0, "adds counted twice");
    }

    #[test]
    fn a_wiped_slot_never_holds_a_later_add_without_an_earlier_acknowledged_one() {
        let check = |slot: Slot| {
            let old = ReplicaId(7);
            let mut checker = Checker::new(1, 1);
            checker.started_fresh(0, 0, old);
            let mut ledger = Ledger::new(1, 1);
            let mut times = AddTimes::default();
            // An increment, acknowledged; then a decrement sent after that
            // answer and never answered.
            let up = ledger.issue(0, 0, 0, false, true).unwrap();
            ledger.delivered(up, old);
            ledger.answered(up, old, 0, false);
            let down = ledger.issue(0, 0, 0, true, true).unwrap();
            ledger.delivered(down, old);
            ledger.abandon(down);
            times.sent = vec![1, 3];
            times.answered = vec![2, 4];
            checker.started_fresh(0, 0, ReplicaId(8));
            let finals = vec![PnCounter::from_slots([(old, slot)])];
            check_all(&mut checker, &ledger, &times, &finals, &BTreeSet::new());
            checker.violation_count
        };
        assert_eq!(check(Slot { p: 0, n: 0 }), 0);
        assert_eq!(check(Slot { p: 1, n: 0 }), 0);
        assert_eq!(check(Slot { p: 1, n: 1 }), 0);
        assert_ne!(
            check(Slot { p: 0, n: 1 }),
            0,
            "the later add without the earlier"
        );
    }
}
