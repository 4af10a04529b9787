//! Which nodes a push of replicated durability goes to (issue 11 with issue
//! 12, and issue 42): each counter's copies are nodes that **hold its
//! key's partition up to date**, so that a replicated add outlives the
//! taking node's disk: the key's other live owners, which serve, sync and
//! hand off its partition, and then the nodes still handing it away, which
//! delete it only once every owner confirmed holding their state of it
//! (invariant 8). A node that does not hold the partition refuses the copy
//! (`replica/copies_taken.rs`): no owner would ever pull it from there, and it
//! would drop it.
//!
//! - A counter needs `needed` copies (`--write-copies` less this node).
//!   They are taken from its other live owners that hold it caught up and
//!   take copies, starting at the `turn`-th (successive pushes spread over
//!   them, and a retry after a failure tries others), then from the nodes
//!   still holding it as releasing.
//! - When a key has fewer such holders than `needed` (RF below
//!   `--write-copies`, an owner down or still copying the partition in),
//!   its group has fewer targets than it needs and the push is not
//!   confirmed: its adds wait, and fail `UNAVAILABLE` once their wait is
//!   over, never acknowledged on fewer disks than asked.
//! - With no routes (one node in the region, no view yet, or every key
//!   served here: every node of the region holds every partition) every
//!   counter takes the region's candidates in turn.
//!
//! Counters with the same copies form a group; each node is sent one call
//! with the counters of every group it is a copy for, and a group is
//! confirmed when `needed` of its copies answered. The plan is pure: the
//! copier (`tally-node`'s `gossip/copier.rs`) feeds it the routes and the
//! live candidates.

use std::collections::BTreeMap;

use crate::partition::RouteTable;

/// A node that takes copies: its name and gRPC address.
pub type CopyTarget = (String, String);

/// Where one push goes (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyPlan {
    /// The nodes sent a call.
    pub targets: Vec<CopyTarget>,
    /// Groups of counters: the targets (indexes into `targets`) that must
    /// confirm them, and the counters (indexes into the push).
    pub groups: Vec<(Vec<usize>, Vec<usize>)>,
}

impl CopyPlan {
    /// The counters (indexes into the push) sent to the `target`-th target.
    pub fn counters_for(&self, target: usize) -> Vec<usize> {
        let mut counters: Vec<usize> = self
            .groups
            .iter()
            .filter(|(targets, _)| targets.contains(&target))
            .flat_map(|(_, counters)| counters.iter().copied())
            .collect();
        counters.sort_unstable();
        counters
    }

    /// Whether every group has `needed` targets among `confirmed` (one flag
    /// per target: it answered `OK`).
    pub fn confirmed(&self, confirmed: &[bool], needed: usize) -> bool {
        self.groups.iter().all(|(targets, _)| {
            targets.iter().filter(|target| confirmed[**target]).count() >= needed
        })
    }

    /// Per counter of the push (`counters` of them), whether its group has
    /// `needed` targets among `confirmed`.
    pub fn confirmed_counters(
        &self,
        confirmed: &[bool],
        needed: usize,
        counters: usize,
    ) -> Vec<bool> {
        let mut done = vec![false; counters];
        for (targets, members) in &self.groups {
            let answered = targets.iter().filter(|target| confirmed[**target]).count();
            if answered >= needed {
                for counter in members {
                    done[*counter] = true;
                }
            }
        }
        done
    }

    /// The fewest targets any group has (what a failure reports).
    pub fn fewest_targets(&self) -> usize {
        self.groups
            .iter()
            .map(|(targets, _)| targets.len())
            .min()
            .unwrap_or(0)
    }
}

/// [`plan_copies`] over a region's routes (`None`: no routes yet, or every
/// key is served here): each key's other holders as
/// [`RouteTable::other_holders`] names them.
pub fn plan_copies_by_routes<'k>(
    keys: impl Iterator<Item = &'k [u8]>,
    routes: Option<&RouteTable>,
    candidates: &[CopyTarget],
    needed: usize,
    turn: u64,
) -> CopyPlan {
    let other_holders = |key: &[u8]| {
        let (owners, releasing) = routes?.other_holders(key);
        let owned = |names: Vec<&str>| names.into_iter().map(String::from).collect();
        Some((owned(owners), owned(releasing)))
    };
    plan_copies(keys, other_holders, candidates, needed, turn)
}

/// Plans a push of the counters `keys`: `other_holders(key)` names a key's
/// other live owners in route order and the other live nodes that still
/// hold it as releasing (`None`: the region has no routes, and every
/// candidate holds every key);
/// `candidates` are the region's live nodes that take copies, in the
/// rotation's order for this `turn`.
pub fn plan_copies<'k>(
    keys: impl Iterator<Item = &'k [u8]>,
    other_holders: impl Fn(&[u8]) -> Option<(Vec<String>, Vec<String>)>,
    candidates: &[CopyTarget],
    needed: usize,
    turn: u64,
) -> CopyPlan {
    let mut groups: BTreeMap<Vec<usize>, Vec<usize>> = BTreeMap::new();
    for (index, key) in keys.enumerate() {
        let mut chosen: Vec<usize> = Vec::with_capacity(needed);
        let holders = other_holders(key);
        let routed = holders.is_some();
        let (owners, releasing) = holders.unwrap_or_default();
        let known = |names: &[String]| -> Vec<usize> {
            names
                .iter()
                .filter_map(|name| candidates.iter().position(|(known, _)| known == name))
                .collect()
        };
        let eligible = known(&owners);
        if !eligible.is_empty() {
            let start = (turn % eligible.len() as u64) as usize;
            chosen.extend(
                (0..eligible.len().min(needed))
                    .map(|offset| eligible[(start + offset) % eligible.len()]),
            );
        }
        // Then the nodes handing the partition away: their new owners copy
        // from them until they confirm, then the copy goes with the rest.
        // With no routes, every node of the region holds every key.
        let others: Vec<usize> = if routed {
            known(&releasing)
        } else {
            (0..candidates.len()).collect()
        };
        for candidate in others {
            if chosen.len() >= needed {
                break;
            }
            if !chosen.contains(&candidate) {
                chosen.push(candidate);
            }
        }
        chosen.sort_unstable();
        groups.entry(chosen).or_default().push(index);
    }
    // Only candidates that some group uses are sent a call.
    let mut used: Vec<usize> = groups.keys().flatten().copied().collect();
    used.sort_unstable();
    used.dedup();
    let renumber = |candidate: &usize| used.binary_search(candidate).unwrap_or_default();
    CopyPlan {
        targets: used
            .iter()
            .map(|index| candidates[*index].clone())
            .collect(),
        groups: groups
            .into_iter()
            .map(|(targets, counters)| (targets.iter().map(renumber).collect(), counters))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidates(names: &[&str]) -> Vec<CopyTarget> {
        names
            .iter()
            .map(|name| (name.to_string(), format!("{name}:7100")))
            .collect()
    }

    fn names(plan: &CopyPlan, targets: &[usize]) -> Vec<String> {
        targets
            .iter()
            .map(|target| plan.targets[*target].0.clone())
            .collect()
    }

    /// Where the copies of the one counter `key` go.
    fn copies_of(key: &[u8], live: &[&str], needed: usize, turn: u64) -> Vec<String> {
        let plan = plan_copies([key].into_iter(), owners, &candidates(live), needed, turn);
        names(&plan, &plan.groups[0].0)
    }

    /// Owners by the key's first byte: a -> b, c; b -> c; r -> none caught
    /// up, d releasing; z -> none alive.
    fn owners(key: &[u8]) -> Option<(Vec<String>, Vec<String>)> {
        Some(match key[0] {
            b'a' => (vec!["b".into(), "c".into()], vec![]),
            b'b' => (vec!["c".into()], vec![]),
            b'r' => (vec![], vec!["d".into()]),
            _ => (vec!["gone".into()], vec![]),
        })
    }

    #[test]
    fn each_counter_goes_to_its_other_owners() {
        let keys: Vec<&[u8]> = vec![b"a1", b"b1", b"a2"];
        let plan = plan_copies(
            keys.into_iter(),
            owners,
            &candidates(&["b", "c", "d"]),
            1,
            0,
        );
        assert_eq!(plan.groups.len(), 2, "{plan:?}");
        for (targets, counters) in &plan.groups {
            let expected = if counters == &vec![0, 2] { "b" } else { "c" };
            assert_eq!(names(&plan, targets), vec![expected], "{plan:?}");
        }
        // d owns nothing here: it is sent nothing.
        assert!(plan.targets.iter().all(|(name, _)| name != "d"));
        // The next turn spreads the a-keys to their other owner.
        assert_eq!(copies_of(b"a1", &["b", "c", "d"], 1, 1), vec!["c"]);
    }

    #[test]
    fn a_key_short_of_holders_gets_only_its_holders() {
        // b-keys have one other owner, two copies are needed: c alone, and
        // the group is short (never d, which does not hold the partition).
        let keys: Vec<&[u8]> = vec![b"b1"];
        let plan = plan_copies(
            keys.into_iter(),
            owners,
            &candidates(&["b", "c", "d"]),
            2,
            0,
        );
        assert_eq!(names(&plan, &plan.groups[0].0), vec!["c"], "{plan:?}");
        assert_eq!(plan.fewest_targets(), 1);
        assert!(
            !plan.confirmed(&[true], 2),
            "one holder cannot confirm two copies"
        );
        // No owner holds it caught up: the node handing it away.
        assert_eq!(copies_of(b"r1", &["b", "c", "d"], 1, 0), vec!["d"]);
        assert_eq!(copies_of(b"r1", &["b", "c", "d"], 2, 0), vec!["d"]);
        // No owner alive: no copy at all, whoever else is live.
        let keys: Vec<&[u8]> = vec![b"z1"];
        let plan = plan_copies(keys.into_iter(), owners, &candidates(&["d", "b"]), 1, 0);
        assert!(plan.targets.is_empty(), "{plan:?}");
        assert_eq!(plan.fewest_targets(), 0);
        // No routes (every node holds every key): the candidates in turn.
        let keys: Vec<&[u8]> = vec![b"a1"];
        let plan = plan_copies(keys.into_iter(), |_| None, &candidates(&["d", "b"]), 1, 0);
        assert_eq!(names(&plan, &plan.groups[0].0), vec!["d"]);
        let keys: Vec<&[u8]> = vec![b"a1"];
        let plan = plan_copies(keys.into_iter(), |_| None, &candidates(&["d", "b"]), 2, 1);
        assert_eq!(names(&plan, &plan.groups[0].0), vec!["d", "b"]);
    }

    #[test]
    fn a_push_is_confirmed_only_when_every_group_is() {
        let keys: Vec<&[u8]> = vec![b"a1", b"b1"];
        let plan = plan_copies(keys.into_iter(), owners, &candidates(&["b", "c"]), 1, 0);
        let b = plan
            .targets
            .iter()
            .position(|(name, _)| name == "b")
            .unwrap();
        let c = plan
            .targets
            .iter()
            .position(|(name, _)| name == "c")
            .unwrap();
        assert_eq!(plan.counters_for(b), vec![0]);
        assert_eq!(plan.counters_for(c), vec![1]);
        let mut answered = vec![false; plan.targets.len()];
        answered[b] = true;
        assert!(
            !plan.confirmed(&answered, 1),
            "c holds b1 and did not answer"
        );
        answered[c] = true;
        assert!(plan.confirmed(&answered, 1));
        assert_eq!(plan.fewest_targets(), 1);
        // No candidate at all: a group with no targets is never confirmed.
        let keys: Vec<&[u8]> = vec![b"a1"];
        let plan = plan_copies(keys.into_iter(), owners, &[], 1, 0);
        assert!(!plan.confirmed(&[], 1));
        assert_eq!(plan.fewest_targets(), 0);
    }
}
