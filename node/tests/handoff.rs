//! Handoff in a partitioned region over real node processes (issue 11, item
//! 5): a node that joins copies each partition it owns from the nodes that
//! hold it before it serves it, and stores nothing else; while it copies,
//! the keys of those partitions go to the nodes that hold them; the nodes
//! that no longer own a partition delete it once its owners confirmed they
//! hold it, keeping only their own slot of what they wrote; every key keeps
//! its exact value through every node; a restart resumes serving what the
//! node held (its `LIFECYCLE` names it) without copying again; and a
//! drained node hands everything off, leaves and stores no counter, its own
//! slots included (like sets and uniques move with their partitions too:
//! `partitioned_likes.rs`). P = 16, RF = 2, one region: eu-1 alone first,
//! then eu-2 and eu-3 join.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{NodeProcess, NodeSpec};
use tally_client::{Client, PartitionMap};
use tally_proto::partition::PartitionCount;

const P: u64 = 16;
const RF: u32 = 2;
const KEYS: usize = 240;
const LIMIT: Duration = Duration::from_secs(60);

fn spec(root: &std::path::Path, name: &str) -> NodeSpec {
    common::partitioned_spec(root, "eu", name, P as u32, RF)
}

fn key(i: usize) -> String {
    format!("post:{i}:likes")
}

fn partition_of(key: &str) -> u32 {
    PartitionCount::new(P).unwrap().of_key(key.as_bytes()).0
}

async fn map_of(endpoint: &str) -> Option<PartitionMap> {
    let client = Client::connect(endpoint.to_string()).await.ok()?;
    client.partition_map(Some("eu")).await.ok()
}

/// The node's replica id, and each counter it stores (a pull of everything,
/// no scope, from the start) as its slots: writer to (p, n).
async fn stored_slots(endpoint: &str) -> (u64, BTreeMap<String, BTreeMap<u64, (u64, u64)>>) {
    let (own, counters) = common::stored_counters_of(endpoint).await;
    let counters = counters
        .into_iter()
        .map(|counter| {
            let slots = counter
                .slots
                .iter()
                .map(|slot| (slot.replica, (slot.p, slot.n)))
                .collect();
            (String::from_utf8(counter.key.to_vec()).unwrap(), slots)
        })
        .collect();
    (own, counters)
}

/// The node's count of counters purged (deleted or cut to its own slot).
fn purged(node: &NodeProcess) -> u64 {
    let (_, metrics) = common::http_get(node.spec.http, "/metrics").unwrap();
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("tally_purged_counters_total "))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no purge metric:\n{metrics}"))
}

/// Reads every key through `endpoint` and checks it against `expected`.
async fn check_values(endpoint: &str, expected: &[i64]) {
    let client = common::load::quick_client(endpoint).await;
    for (i, want) in expected.iter().enumerate() {
        let got = client.get(&key(i)).await.unwrap();
        assert_eq!(got, *want, "{} through {endpoint}", key(i));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_node_copies_its_partitions_before_serving_them_and_stores_nothing_else() {
    let root = tempfile::tempdir().unwrap();
    let first = spec(root.path(), "eu-1");
    let seed = first.gossip;
    let mut nodes = vec![NodeProcess::start_async(first).await];
    let endpoints = |nodes: &[NodeProcess]| -> Vec<String> {
        nodes.iter().map(NodeProcess::endpoint).collect()
    };
    let eu_1 = common::load::quick_client(&nodes[0].endpoint()).await;
    let mut expected = vec![0i64; KEYS];
    for (i, value) in expected.iter_mut().enumerate() {
        *value = (i % 7 + 1) as i64;
        eu_1.add(&key(i), *value).await.unwrap();
    }

    for name in ["eu-2", "eu-3"] {
        let mut joiner = spec(root.path(), name);
        joiner.seeds = vec![seed];
        let node = NodeProcess::start_async(joiner).await;
        // While it copies, an add through it lands on a node that holds
        // the key's partition; none is lost or counted twice.
        let through_joiner = common::load::quick_client(&node.endpoint()).await;
        for (i, value) in expected.iter_mut().enumerate().step_by(5) {
            through_joiner.add(&key(i), 1).await.unwrap();
            *value += 1;
        }
        nodes.push(node);
    }
    let map = common::settled_region_map(&endpoints(&nodes), 3).await;
    for endpoint in endpoints(&nodes) {
        check_values(&endpoint, &expected).await;
    }

    // Handoff ends with deletion (the map settles only once nothing is
    // releasing): eu-1 held everything, and eu-2 owned everything until
    // eu-3 came; each released the rest once its new owners confirmed they
    // hold it. Of a partition it released, a node stores only the counters
    // it wrote, cut down to its own slot (a later add there continues it).
    // eu-3, a joiner, copied the partitions it owns and nothing else.
    let all: Vec<String> = (0..KEYS).map(key).collect();
    let mut stored = Vec::new();
    for endpoint in endpoints(&nodes) {
        stored.push(stored_slots(&endpoint).await);
    }
    // Each key's slots as the nodes hold them between them (slot-wise max).
    let mut whole: BTreeMap<&str, BTreeMap<u64, (u64, u64)>> = BTreeMap::new();
    for (_, counters) in &stored {
        for (key, slots) in counters {
            let entry = whole.entry(key.as_str()).or_default();
            for (writer, (p, n)) in slots {
                let slot = entry.entry(*writer).or_default();
                *slot = (slot.0.max(*p), slot.1.max(*n));
            }
        }
    }
    for (index, name) in ["eu-1", "eu-2", "eu-3"].into_iter().enumerate() {
        let (own, counters) = &stored[index];
        let row = map
            .nodes
            .iter()
            .find(|node| node.node_name == name)
            .unwrap();
        assert_eq!(
            (row.partitions_held, row.partitions_releasing),
            (row.partitions_owned, 0),
            "{name}"
        );
        for key in &all {
            let owned = map.owners_of(partition_of(key)).contains(&name);
            let mine = whole[key.as_str()].get(own).copied().unwrap_or_default();
            match counters.get(key) {
                Some(_) if owned => {}
                None if owned => panic!("{name} owns {key} and does not store it"),
                Some(slots) => assert_eq!(
                    slots,
                    &BTreeMap::from([(*own, mine)]),
                    "{name} keeps of {key} only its own slot"
                ),
                None => assert_eq!(mine, (0, 0), "{name} deleted its own slot of {key}"),
            }
        }
    }
    let owned_by = |name: &str| {
        all.iter()
            .filter(|key| map.owners_of(partition_of(key)).contains(&name))
            .count()
    };
    assert!(
        owned_by("eu-3") > 0 && owned_by("eu-3") < KEYS,
        "eu-3 owns {}",
        owned_by("eu-3")
    );
    assert_eq!(stored[2].1.len(), owned_by("eu-3"), "eu-3 copied its own");
    assert!(
        stored[1].1.len() < KEYS,
        "eu-2 deleted what it released and never wrote"
    );
    for node in &nodes[..2] {
        assert!(purged(node) > 0, "{}: nothing purged", node.spec.node_name);
    }
    let lifecycle = std::fs::read_to_string(nodes[2].spec.data_dir.join("LIFECYCLE")).unwrap();
    assert!(lifecycle.contains("serving = "), "{lifecycle}");
    // The partition map (as eu-1 computes it, from gossip for the others)
    // shows how many counters each node stores.
    let stored_counts: Vec<Option<u64>> = stored
        .iter()
        .map(|(_, counters)| Some(counters.len() as u64))
        .collect();
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let map = map_of(&nodes[0].endpoint()).await.unwrap();
        let shown: Vec<Option<u64>> = ["eu-1", "eu-2", "eu-3"]
            .iter()
            .map(|name| {
                let row = map.nodes.iter().find(|node| node.node_name == *name);
                row.and_then(|row| row.counters_stored)
            })
            .collect();
        if shown == stored_counts {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the map shows {shown:?} counters stored, the nodes store {stored_counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Adds after the joins, through each node in turn, go to the keys'
    // holders; a restarted joiner serves again what it held, at once.
    for (i, value) in expected.iter_mut().enumerate() {
        let client = common::load::quick_client(&nodes[i % 3].endpoint()).await;
        client.add(&key(i), 2).await.unwrap();
        *value += 2;
    }
    let mut restarted = nodes.remove(1);
    tokio::task::spawn_blocking(move || {
        restarted.stop();
        restarted.restart();
        restarted
    })
    .await
    .map(|node| nodes.insert(1, node))
    .unwrap();
    common::settled_region_map(&endpoints(&nodes), 3).await;
    let (_, metrics) = common::http_get(nodes[1].spec.http, "/metrics").unwrap();
    assert!(
        metrics.contains("tally_partitions_held{state=\"receiving\"} 0"),
        "a restart copies nothing again:\n{metrics}"
    );
    for endpoint in endpoints(&nodes) {
        check_values(&endpoint, &expected).await;
    }

    // A drain of eu-1: it hands every partition to eu-2 and eu-3, deletes
    // them once both confirmed, and has left; every key stays exact through
    // every node, eu-1 included (it forwards).
    let eu_2 = Client::connect(nodes[1].endpoint()).await.unwrap();
    eu_2.drain("eu-1").await.unwrap();
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let drained = map_of(&nodes[1].endpoint()).await.is_some_and(|map| {
            map.nodes.iter().all(|node| match node.node_name.as_str() {
                "eu-1" => node.state == "left" && node.partitions_held == 0,
                _ => node.partitions_held == P as u32 && node.partitions_releasing == 0,
            })
        });
        if drained {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "eu-1 never left");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lifecycle = std::fs::read_to_string(nodes[0].spec.data_dir.join("LIFECYCLE")).unwrap();
    assert!(lifecycle.contains("left"), "{lifecycle}");
    // A drained node holds nothing, its own slots included: it never owns
    // a partition again, and its slots live on with the new owners.
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let (_, counters) = stored_slots(&nodes[0].endpoint()).await;
        if counters.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the drained eu-1 still stores {} counters, e.g. {:?}",
            counters.len(),
            counters.iter().next()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for endpoint in endpoints(&nodes) {
        check_values(&endpoint, &expected).await;
    }
}

/// A region of four nodes with RF 2 over 64 partitions: each node stores
/// about half of the counters (exactly those of the partitions it owns),
/// and once one of them is drained it stores none while the three others
/// hold every key, exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_nodes_of_rf_2_store_about_half_each_and_a_drained_one_stores_nothing() {
    const WIDE: u32 = 64;
    const COUNTERS: usize = 400;
    let partition = |key: &str| {
        PartitionCount::new(u64::from(WIDE))
            .unwrap()
            .of_key(key.as_bytes())
            .0
    };
    let root = tempfile::tempdir().unwrap();
    let first = common::partitioned_spec(root.path(), "eu", "eu-1", WIDE, RF);
    let seed = first.gossip;
    let mut nodes = vec![NodeProcess::start_async(first).await];
    for name in ["eu-2", "eu-3", "eu-4"] {
        let mut joiner = common::partitioned_spec(root.path(), "eu", name, WIDE, RF);
        joiner.seeds = vec![seed];
        nodes.push(NodeProcess::start_async(joiner).await);
    }
    let endpoints: Vec<String> = nodes.iter().map(NodeProcess::endpoint).collect();
    common::settled_region_map(&endpoints, 4).await;
    let client = common::load::quick_client(&endpoints[0]).await;
    for i in 0..COUNTERS {
        client.add(&key(i), 1).await.unwrap();
    }
    let map = common::settled_region_map(&endpoints, 4).await;

    // Each node stores exactly the counters of the partitions it owns
    // (once its co-owners' adds reached it), about half of them.
    for (index, endpoint) in endpoints.iter().enumerate() {
        let name = format!("eu-{}", index + 1);
        let owned = (0..COUNTERS)
            .filter(|i| map.owners_of(partition(&key(*i))).contains(&name.as_str()))
            .count();
        let deadline = tokio::time::Instant::now() + LIMIT;
        let stored = loop {
            let stored = common::stored_counters_of(endpoint).await.1.len();
            if stored == owned || tokio::time::Instant::now() > deadline {
                break stored;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(stored, owned, "{name} stores what it owns");
        let share = stored as f64 / COUNTERS as f64;
        assert!(
            (0.3..=0.7).contains(&share),
            "{name} stores {stored} of {COUNTERS} counters"
        );
    }

    // Drained, eu-4 hands its partitions to the others and stores nothing.
    client.drain("eu-4").await.unwrap();
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let left = map_of(&endpoints[0]).await.is_some_and(|map| {
            map.nodes.iter().any(|node| {
                node.node_name == "eu-4" && node.state == "left" && node.partitions_held == 0
            })
        });
        if left && common::stored_counters_of(&endpoints[3]).await.1.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "eu-4 never left with nothing stored"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for endpoint in &endpoints[..3] {
        check_values(endpoint, &[1; COUNTERS]).await;
    }
}
