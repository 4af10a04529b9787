//! Tests of placement: rendezvous ownership moves about `RF/N` of the
//! partitions on a join and nothing that the join does not explain, spreads
//! evenly, ignores a node down for less than `dead_after`, and the operator
//! checks refuse a drain of a region's last node and a removal of a live one.
use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

pub(super) const REGION: &str = "r";
pub(super) const DEAD_AFTER_MS: u64 = 1_000;

pub(super) fn count(n: u64) -> PartitionCount {
    PartitionCount::new(n).unwrap()
}

pub(super) fn node(name: &str, state: NodeState) -> NodeInfo {
    NodeInfo {
        name: name.to_string(),
        region: REGION.to_string(),
        state,
        alive: true,
        down_since_ms: None,
        holding: PartitionSet::empty(count(256)),
        releasing: PartitionSet::empty(count(256)),
    }
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("node-{i}")).collect()
}

fn view_of(names: &[String], replication: u32) -> ClusterView {
    let nodes = names.iter().map(|name| node(name, NodeState::Active));
    ClusterView::new(count(256), replication, DEAD_AFTER_MS, 0, nodes)
}

proptest! {
    /// A join changes a partition's owners only by putting the new node in
    /// place of one old owner, and does so for about RF/(N+1) of them.
    #[test]
    fn a_join_moves_about_one_nth_and_nothing_else(n in 1usize..12, replication in 1u32..4) {
        let before = view_of(&names(n), replication);
        let after = view_of(&names(n + 1), replication);
        let newcomer = format!("node-{n}");
        let mut moved = 0usize;
        for partition in count(256).iter() {
            let old: BTreeSet<&str> = before.owners(REGION, partition).into_iter().collect();
            let new: BTreeSet<&str> = after.owners(REGION, partition).into_iter().collect();
            if old != new {
                moved += 1;
                prop_assert!(new.contains(newcomer.as_str()));
                prop_assert_eq!(old.difference(&new).count(), usize::from(old.len() == replication as usize));
                prop_assert_eq!(new.difference(&old).count(), 1);
            }
        }
        let ideal = 256.0 * f64::from(replication.min(n as u32 + 1)) / (n as f64 + 1.0);
        let ideal = if (n as u32) < replication { 256.0 } else { ideal };
        // Binomial spread: within 5 standard deviations of the ideal.
        let slack = 5.0 * ideal.sqrt() + 1.0;
        prop_assert!((moved as f64 - ideal).abs() <= slack, "moved {} of 256, ideal {:.1}", moved, ideal);
    }

    /// Each node owns about RF/N of the partitions.
    #[test]
    fn ownership_is_spread_evenly(n in 2usize..16, replication in 1u32..4) {
        let view = view_of(&names(n), replication);
        let ideal = 256.0 * f64::from(replication.min(n as u32)) / n as f64;
        for name in names(n) {
            let owned = view.owned_by(&name).len() as f64;
            prop_assert!((owned - ideal).abs() <= 5.0 * ideal.sqrt() + 1.0, "{} owns {}, ideal {:.1}", name, owned, ideal);
        }
    }
}

#[test]
fn a_node_down_shorter_than_dead_after_keeps_its_partitions() {
    let mut nodes: Vec<NodeInfo> = names(3)
        .iter()
        .map(|name| node(name, NodeState::Active))
        .collect();
    nodes[0].alive = false;
    nodes[0].down_since_ms = Some(10_000);
    let early = ClusterView::new(count(256), 2, DEAD_AFTER_MS, 10_999, nodes.clone());
    let late = ClusterView::new(count(256), 2, DEAD_AFTER_MS, 11_000, nodes);
    assert_eq!(
        early.owned_by("node-0").len(),
        view_of(&names(3), 2).owned_by("node-0").len()
    );
    assert!(late.owned_by("node-0").is_empty());
    assert_eq!(late.owned_by("node-1").len(), 256);
    let mut clock = DownClock::default();
    assert_eq!(clock.observe("a", false, 5), Some(5));
    assert_eq!(clock.observe("a", false, 9), Some(5));
    assert_eq!(clock.observe("a", true, 10), None);
    assert_eq!(clock.observe("a", false, 11), Some(11));
}

#[test]
fn operators_are_refused_a_drain_of_the_last_node_and_a_removal_of_a_live_one() {
    let view = view_of(&names(1), 2);
    let refusal = view.check_drain("node-0").unwrap_err();
    assert!(matches!(refusal, AdminRefusal::LastNodeOfRegion { .. }));
    assert!(
        refusal.to_string().contains("add a node to \"r\" first"),
        "{refusal}"
    );
    assert!(matches!(
        view.check_remove("node-0"),
        Err(AdminRefusal::RemoveLiveNode { .. })
    ));
    assert!(matches!(
        view.check_drain("nobody"),
        Err(AdminRefusal::UnknownNode { .. })
    ));
    assert!(view_of(&names(2), 2).check_drain("node-0").is_ok());
}

#[test]
fn a_single_node_owns_and_serves_every_partition_at_once() {
    let view = view_of(&names(1), 3);
    assert_eq!(view.effective_replication(REGION), 1);
    let mut holdings = Holdings::recover(
        "node-0",
        REGION,
        count(256),
        &PartitionSet::empty(count(256)),
        0,
    );
    holdings.handle_view(&view);
    assert!(holdings.serving().is_full());
    assert!(holdings.poll_deletions(|_| true).is_empty());
}

#[test]
fn a_partition_is_under_replicated_while_one_of_its_owners_is_down_or_not_holding_it() {
    let all = PartitionSet::full(count(256));
    let holding = |name: &str| NodeInfo {
        holding: all.clone(),
        ..node(name, NodeState::Active)
    };
    let healthy = ClusterView::new(
        count(256),
        2,
        DEAD_AFTER_MS,
        0,
        ["a", "b", "c"].map(holding),
    );
    assert_eq!(healthy.under_replicated(REGION).len(), 0);
    // c down, for less than dead_after: it still owns, but does not serve.
    let down = NodeInfo {
        alive: false,
        down_since_ms: Some(0),
        ..holding("c")
    };
    let view = ClusterView::new(
        count(256),
        2,
        DEAD_AFTER_MS,
        10,
        [holding("a"), holding("b"), down],
    );
    assert_eq!(
        view.under_replicated(REGION).len(),
        view.owned_by("c").len(),
        "exactly c's partitions"
    );
    // c up but holding nothing yet (catching up): the same partitions.
    let empty = node("c", NodeState::Active);
    let view = ClusterView::new(
        count(256),
        2,
        DEAD_AFTER_MS,
        10,
        [holding("a"), holding("b"), empty],
    );
    assert_eq!(
        view.under_replicated(REGION).len(),
        view.owned_by("c").len()
    );
}
