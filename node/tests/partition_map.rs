//! The partition map over real node processes (issue #11, first node
//! slice): a region of three nodes and a second region of one, P = 256,
//! RF = 2. Every node serves the same owners; a node that goes down keeps
//! its partitions (shorter than --dead-after); `tally admin remove` of the
//! killed node moves its partitions to the others, a new node joins and
//! takes about 1/N, `tally admin drain` (asked of another node) moves the
//! drained node's partitions away, after which it has left (and stays so
//! through a restart), and in each change only the partitions
//! the change explains move (about 1/N of the owner slots). Bad requests
//! are refused with a clear error and change nothing.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{cli, start_seeded, wait_until, NodeProcess, NodeSpec};
use tally_client::{Client, PartitionMap};

const P: usize = 256;
const RF: usize = 2;
const LIMIT: Duration = Duration::from_secs(60);

fn spec(root: &std::path::Path, region: &str, name: &str) -> NodeSpec {
    common::partitioned_spec(root, region, name, P as u32, RF as u32)
}

/// The partition map of region `eu` as the node at `endpoint` computes it.
fn map_of(runtime: &tokio::runtime::Runtime, endpoint: &str) -> Option<PartitionMap> {
    runtime.block_on(async {
        let client = Client::connect(endpoint).await.ok()?;
        client.partition_map(Some("eu")).await.ok()
    })
}

/// Per partition, the names of its owners in `eu`.
fn owners(map: &PartitionMap) -> Vec<Vec<String>> {
    (0..map.partitions)
        .map(|p| map.owners_of(p).into_iter().map(String::from).collect())
        .collect()
}

fn owned(map: &PartitionMap, name: &str) -> u32 {
    map.nodes
        .iter()
        .find(|node| node.node_name == name)
        .map_or(0, |node| node.partitions_owned)
}

fn state(map: &PartitionMap, name: &str) -> Option<String> {
    map.nodes
        .iter()
        .find(|node| node.node_name == name)
        .map(|node| node.state.clone())
}

/// Waits until every node in `nodes` (live ones) serves the same owners
/// for `eu` and `accept` holds of that map; returns it.
fn settled_map(
    runtime: &tokio::runtime::Runtime,
    nodes: &[&NodeProcess],
    what: &str,
    accept: impl Fn(&PartitionMap) -> bool,
) -> PartitionMap {
    wait_until(LIMIT, what, || {
        let maps: Vec<PartitionMap> = nodes
            .iter()
            .map(|node| map_of(runtime, &node.endpoint()))
            .collect::<Option<_>>()?;
        let first = owners(&maps[0]);
        let agree = maps.iter().all(|map| owners(map) == first);
        (agree && maps.iter().all(&accept)).then(|| maps[0].clone())
    })
    .0
}

/// The owner slots (partition, owner) added from `before` to `after`, and
/// whether every partition's change is explained: only partitions for which
/// `explains` holds changed.
fn moved_slots(
    before: &PartitionMap,
    after: &PartitionMap,
    explains: impl Fn(&[String], &[String]) -> bool,
) -> usize {
    let (before, after) = (owners(before), owners(after));
    let mut moved = 0;
    for (partition, (old, new)) in before.iter().zip(&after).enumerate() {
        let old_set: BTreeSet<&String> = old.iter().collect();
        let new_set: BTreeSet<&String> = new.iter().collect();
        if old_set != new_set {
            assert!(
                explains(old, new),
                "partition {partition} moved from {old:?} to {new:?}, which the change does not explain"
            );
            moved += new_set.difference(&old_set).count();
        }
    }
    moved
}

/// About 1/N of the P * RF owner slots (binomial spread, generous bounds).
#[track_caller]
fn about_one_nth(moved: usize, n: usize) {
    let share = moved as f64 / (P * RF) as f64;
    let ideal = 1.0 / n as f64;
    eprintln!(
        "measured: {moved} of {} owner slots moved ({share:.3}; ideal {ideal:.3})",
        P * RF
    );
    assert!(
        (ideal * 0.6..=ideal * 1.4).contains(&share),
        "{moved} owner slots moved: {share:.3} of {}, ideal {ideal:.3}",
        P * RF
    );
}

#[test]
fn every_node_serves_the_same_map_and_remove_join_and_drain_move_about_one_nth() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let root = tempfile::tempdir().unwrap();
    let specs = vec![
        spec(root.path(), "eu", "eu-1"),
        spec(root.path(), "eu", "eu-2"),
        spec(root.path(), "eu", "eu-3"),
        spec(root.path(), "us", "us-1"),
    ];
    let mut nodes = start_seeded(specs);

    // 1. Every node, the one of the other region included, serves the same
    // owners; each eu node owns about P * RF / 3 and all are active.
    let all: Vec<&NodeProcess> = nodes.iter().collect();
    let initial = settled_map(&runtime, &all, "the same map on every node", |map| {
        map.nodes.len() == 3 && map.nodes.iter().all(|node| node.state == "active")
    });
    assert_eq!(
        (
            initial.partitions,
            initial.replication_factor,
            initial.effective_replication
        ),
        (256, 2, 2)
    );
    for name in ["eu-1", "eu-2", "eu-3"] {
        let owned = owned(&initial, name);
        eprintln!("measured: {name} owns {owned} of 256 partitions (P * RF / N = 170.7)");
        assert!(
            (110..=230).contains(&owned),
            "{name} owns {owned} of 256 (ideal 171)"
        );
    }
    assert!(owners(&initial).iter().all(|owners| owners.len() == RF));
    assert_eq!(initial.under_replicated, 0, "every owner is up");
    // The metric follows the map (eu-1 owned all 256 while it was alone).
    let owned_metric = format!("tally_partitions_owned {}\n", owned(&initial, "eu-1"));
    wait_until(LIMIT, "eu-1's tally_partitions_owned", || {
        let metrics = common::http_get(nodes[0].spec.http, "/metrics").ok()?.1;
        metrics.contains(&owned_metric).then_some(())
    });
    let (code, out, err) = cli(&nodes[0].endpoint(), &["status"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("partitions in region eu (as eu-1 computes them): 256 partitions, replication factor 2 (2 in effect)")
            && out.contains("nodes by state: 3 active"),
        "{out}"
    );

    // 2. Refusals change nothing: removing a live node, draining the last
    // node of a region, an unknown node.
    let (code, _, err) = cli(&nodes[0].endpoint(), &["admin", "remove", "eu-3"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("node \"eu-3\" is alive") && err.contains("drain it"),
        "{err}"
    );
    let (code, _, err) = cli(&nodes[0].endpoint(), &["admin", "drain", "us-1"]);
    assert_ne!(code, 0);
    assert!(err.contains("last node of region \"us\""), "{err}");
    let (code, _, err) = cli(&nodes[0].endpoint(), &["admin", "drain", "eu-9"]);
    assert_ne!(code, 0);
    assert!(err.contains("no node named \"eu-9\""), "{err}");
    assert_eq!(
        owners(&map_of(&runtime, &nodes[1].endpoint()).unwrap()),
        owners(&initial)
    );

    // 3. eu-3 is killed: down, but for less than --dead-after, so it keeps
    // its partitions (a missed heartbeat moves nothing).
    nodes[2].kill9();
    let live: Vec<&NodeProcess> = vec![&nodes[0], &nodes[1], &nodes[3]];
    let down = settled_map(&runtime, &live, "eu-3 seen down", |map| {
        map.nodes
            .iter()
            .any(|node| node.node_name == "eu-3" && !node.alive)
    });
    assert_eq!(
        owners(&down),
        owners(&initial),
        "a node down briefly keeps its partitions"
    );
    // ... and each of them has one live owner of RF 2 meanwhile.
    let owned_by_down = owned(&initial, "eu-3");
    assert_eq!(down.under_replicated, owned_by_down);
    let gauge = format!("tally_partitions_under_replicated{{region=\"eu\"}} {owned_by_down}");
    wait_until(LIMIT, "the under-replicated gauge on eu-1", || {
        let metrics = common::http_get(nodes[0].spec.http, "/metrics").ok()?.1;
        metrics.lines().any(|line| line == gauge).then_some(())
    });
    // The status page and /status.json show the same map.
    let page = common::http_get(nodes[0].spec.http, "/status").unwrap().1;
    assert!(
        page.contains("Partitions of region eu")
            && page.contains(&format!("{owned_by_down} under-replicated")),
        "{page}"
    );
    let json: serde_json::Value = serde_json::from_str(
        &common::http_get(nodes[0].spec.http, "/status.json")
            .unwrap()
            .1,
    )
    .unwrap();
    let summary = &json["partition_map"];
    assert_eq!(summary["under_replicated"], owned_by_down);
    let eu3 = summary["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|node| node["node_name"] == "eu-3")
        .expect("eu-3 on the status page");
    assert_eq!(eu3["alive"], false);
    assert_eq!(eu3["partitions_owned"], owned_by_down);

    // 4. Removed (asked of the other region's node): its partitions go to
    // eu-1 and eu-2, and nothing else moves.
    let (code, out, err) = cli(&nodes[3].endpoint(), &["admin", "remove", "eu-3"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("node eu-3 removed (replica "), "{out}");
    // The two left copy what eu-3 and the other held between them (each
    // released what it did not own once eu-3 had it).
    let removed = settled_map(
        &runtime,
        &live,
        "eu-3 left on every node, and its partitions copied",
        |map| state(map, "eu-3").as_deref() == Some("left") && map.under_replicated == 0,
    );
    assert_eq!(
        (owned(&removed, "eu-1"), owned(&removed, "eu-2")),
        (256, 256)
    );
    assert_eq!(owned(&removed, "eu-3"), 0);
    assert_eq!(removed.under_replicated, 0, "RF 2 on the two left");
    let moved = moved_slots(&initial, &removed, |old, _| {
        old.contains(&"eu-3".to_string())
    });
    about_one_nth(moved, 3);
    let (code, _, err) = cli(&nodes[0].endpoint(), &["admin", "remove", "eu-3"]);
    assert_ne!(code, 0);
    assert!(err.contains("already left"), "{err}");

    // 5. A new node joins (fresh directory): joining, then active once
    // caught up; it takes about 1/3 of the owner slots, only from others.
    let mut joiner = spec(root.path(), "eu", "eu-4");
    joiner.seeds = vec![nodes[0].spec.gossip];
    nodes.push(NodeProcess::start(joiner));
    let live: Vec<&NodeProcess> = vec![&nodes[0], &nodes[1], &nodes[3], &nodes[4]];
    let joined = settled_map(&runtime, &live, "eu-4 active on every node", |map| {
        state(map, "eu-4").as_deref() == Some("active")
    });
    let moved = moved_slots(&removed, &joined, |_, new| {
        new.contains(&"eu-4".to_string())
    });
    about_one_nth(moved, 3);

    // 6. eu-2 is drained, asked of eu-1: it confirms through gossip, owns
    // nothing, and only its partitions move. Once the others confirmed
    // holding what it held, it holds nothing and has left.
    let (code, out, err) = cli(&nodes[0].endpoint(), &["admin", "drain", "eu-2"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("node eu-2 is draining"), "{out}");
    let drained = settled_map(&runtime, &live, "eu-2 draining on every node", |map| {
        matches!(state(map, "eu-2").as_deref(), Some("draining" | "left"))
    });
    assert_eq!(owned(&drained, "eu-2"), 0);
    assert_eq!(
        (owned(&drained, "eu-1"), owned(&drained, "eu-4")),
        (256, 256)
    );
    let moved = moved_slots(&joined, &drained, |old, _| {
        old.contains(&"eu-2".to_string())
    });
    about_one_nth(moved, 3);
    settled_map(&runtime, &live, "eu-2 left on every node", |map| {
        state(map, "eu-2").as_deref() == Some("left")
            && map
                .nodes
                .iter()
                .any(|node| node.node_name == "eu-2" && node.partitions_held == 0)
    });
    let (code, _, err) = cli(&nodes[3].endpoint(), &["admin", "drain", "eu-2"]);
    assert_ne!(code, 0);
    assert!(err.contains("has already left"), "{err}");

    // 7. Leaving survives a restart of the drained node (it is on disk).
    nodes[1].stop();
    nodes[1].restart();
    let live: Vec<&NodeProcess> = vec![&nodes[0], &nodes[1], &nodes[3], &nodes[4]];
    let restarted = settled_map(&runtime, &live, "eu-2 back, still left", |map| {
        map.nodes
            .iter()
            .any(|node| node.node_name == "eu-2" && node.alive && node.state == "left")
    });
    assert_eq!(owners(&restarted), owners(&drained));
    let metrics = common::http_get(nodes[1].spec.http, "/metrics").unwrap().1;
    assert!(metrics.contains("tally_partitions_owned 0"), "{metrics}");
    // eu-1's count followed each change (171-ish, 256 after the removal, ...).
    let eu1 = common::http_get(nodes[0].spec.http, "/metrics").unwrap().1;
    assert!(eu1.contains("tally_partitions_owned 256"), "{eu1}");
    assert!(
        metrics.contains("tally_nodes{region=\"eu\",state=\"left\"} 2"),
        "{metrics}"
    );
}

/// A node down for --dead-after loses its partitions to the rest of its
/// region without any operator; while it is down for less, nothing moves;
/// back up, it owns them again (it never left).
#[test]
fn a_node_down_longer_than_dead_after_loses_its_partitions_and_gets_them_back() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let root = tempfile::tempdir().unwrap();
    let specs: Vec<NodeSpec> = ["eu-1", "eu-2", "eu-3"]
        .into_iter()
        .map(|name| {
            let mut spec = spec(root.path(), "eu", name);
            // Long enough that the first look at the down node comes before it.
            spec.extra[5] = "8s".into();
            spec
        })
        .collect();
    let mut nodes = start_seeded(specs);
    let all: Vec<&NodeProcess> = nodes.iter().collect();
    let initial = settled_map(&runtime, &all, "the same map on every node", |map| {
        map.nodes.len() == 3 && map.nodes.iter().all(|node| node.state == "active")
    });
    drop(all);

    nodes[2].kill9();
    let live: Vec<&NodeProcess> = vec![&nodes[0], &nodes[1]];
    let down = settled_map(&runtime, &live, "eu-3 seen down", |map| {
        map.nodes
            .iter()
            .any(|node| node.node_name == "eu-3" && !node.alive && !node.gone)
    });
    assert_eq!(
        owners(&down),
        owners(&initial),
        "down briefly: nothing moves"
    );
    let gone = settled_map(&runtime, &live, "eu-3 gone after --dead-after", |map| {
        map.nodes
            .iter()
            .any(|node| node.node_name == "eu-3" && node.gone)
    });
    assert_eq!(
        state(&gone, "eu-3").as_deref(),
        Some("active"),
        "gone is not left"
    );
    assert_eq!(
        (
            owned(&gone, "eu-1"),
            owned(&gone, "eu-2"),
            owned(&gone, "eu-3")
        ),
        (256, 256, 0)
    );
    let moved = moved_slots(&initial, &gone, |old, _| old.contains(&"eu-3".to_string()));
    about_one_nth(moved, 3);

    drop(live);
    nodes[2].restart();
    let all: Vec<&NodeProcess> = nodes.iter().collect();
    let back = settled_map(&runtime, &all, "eu-3 back", |map| {
        map.nodes
            .iter()
            .any(|node| node.node_name == "eu-3" && node.alive)
    });
    assert_eq!(
        owners(&back),
        owners(&initial),
        "back up: the same owners as before"
    );
}
