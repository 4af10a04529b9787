//! Handoff in a partitioned region over real node processes (issue 11, item
//! 5, first half): a node that joins copies each partition it owns from the
//! nodes that hold it before it serves it, and stores nothing else; while it
//! copies, the keys of those partitions go to the nodes that hold them;
//! every key keeps its exact value through every node; a restart resumes
//! serving what the node held (its `LIFECYCLE` names it) without copying
//! again; and likes, which are not partitioned, reach every node. P = 16, RF = 2, one region: eu-1 alone first, then eu-2
//! and eu-3 join.

mod common;

use std::collections::BTreeSet;
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

/// Waits until every node answers the same map, with `nodes` nodes all
/// active and each holding every partition it owns.
async fn settled_map(endpoints: &[String], nodes: usize) -> PartitionMap {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let mut maps = Vec::new();
        for endpoint in endpoints {
            if let Some(map) = map_of(endpoint).await {
                maps.push(map);
            }
        }
        let settled = maps.len() == endpoints.len()
            && maps.iter().all(|map| {
                map.owners == maps[0].owners
                    && map.nodes.len() == nodes
                    && map.nodes.iter().all(|node| {
                        node.state == "active"
                            && node.alive
                            && node.partitions_held >= node.partitions_owned
                    })
            });
        if settled {
            // Routes follow the map in the same keeper round; one more round.
            tokio::time::sleep(Duration::from_millis(500)).await;
            return maps.swap_remove(0);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no settled map: {maps:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every counter key the node at `endpoint` stores: a pull of everything
/// (no scope) from the start.
async fn stored_keys(endpoint: &str) -> BTreeSet<String> {
    common::stored_counters(endpoint)
        .await
        .into_iter()
        .map(|counter| String::from_utf8(counter.key.to_vec()).unwrap())
        .collect()
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
    let mut nodes = vec![
        tokio::task::spawn_blocking(move || NodeProcess::start(first))
            .await
            .unwrap(),
    ];
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
        let node = tokio::task::spawn_blocking(move || NodeProcess::start(joiner))
            .await
            .unwrap();
        // While it copies, an add through it lands on a node that holds
        // the key's partition; none is lost or counted twice.
        let through_joiner = common::load::quick_client(&node.endpoint()).await;
        for (i, value) in expected.iter_mut().enumerate().step_by(5) {
            through_joiner.add(&key(i), 1).await.unwrap();
            *value += 1;
        }
        nodes.push(node);
    }
    let map = settled_map(&endpoints(&nodes), 3).await;
    for endpoint in endpoints(&nodes) {
        check_values(&endpoint, &expected).await;
    }

    // The last joiner stores exactly the keys of the partitions it owns:
    // it copied those and nothing else. eu-1 held everything, and eu-2,
    // which joined a region of one with RF 2, owned everything until eu-3
    // came: both still serve what they no longer own, as releasing, until
    // deletion hands it off.
    let all: BTreeSet<String> = (0..KEYS).map(key).collect();
    let owned: BTreeSet<String> = all
        .iter()
        .filter(|key| map.owners_of(partition_of(key)).contains(&"eu-3"))
        .cloned()
        .collect();
    assert!(
        !owned.is_empty() && owned.len() < KEYS,
        "eu-3 owns {}",
        owned.len()
    );
    assert_eq!(stored_keys(&nodes[2].endpoint()).await, owned);
    let lifecycle = std::fs::read_to_string(nodes[2].spec.data_dir.join("LIFECYCLE")).unwrap();
    assert!(lifecycle.contains("serving = "), "{lifecycle}");
    for (index, name) in [(0, "eu-1"), (1, "eu-2"), (2, "eu-3")] {
        let row = map
            .nodes
            .iter()
            .find(|node| node.node_name == name)
            .unwrap();
        let releasing = if name == "eu-3" {
            0
        } else {
            assert_eq!(stored_keys(&nodes[index].endpoint()).await, all, "{name}");
            P as u32 - row.partitions_owned
        };
        assert_eq!(
            (row.partitions_held, row.partitions_releasing),
            (row.partitions_owned + releasing, releasing),
            "{name}"
        );
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
    settled_map(&endpoints(&nodes), 3).await;
    let (_, metrics) = common::http_get(nodes[1].spec.http, "/metrics").unwrap();
    assert!(
        metrics.contains("tally_partitions_held{state=\"receiving\"} 0"),
        "a restart copies nothing again:\n{metrics}"
    );
    for endpoint in endpoints(&nodes) {
        check_values(&endpoint, &expected).await;
    }

    // Like sets are not partitioned: a like taken by eu-3, of any key,
    // reaches every node (scoped pulls bring every set delta).
    let eu_3 = common::load::quick_client(&nodes[2].endpoint()).await;
    for i in 0..20 {
        eu_3.like(&key(i), "sam").await.unwrap();
    }
    for endpoint in endpoints(&nodes) {
        let client = common::load::quick_client(&endpoint).await;
        let deadline = tokio::time::Instant::now() + LIMIT;
        for i in 0..20 {
            while client.like_count(&key(i)).await.unwrap() != 1 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{} has no like through {endpoint}",
                    key(i)
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
