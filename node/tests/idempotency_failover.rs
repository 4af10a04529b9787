//! A retry that fails over to another owner is applied once (issue 11,
//! item 6; invariant 5 across failover), over real node processes: a region
//! of two nodes, P = 16, RF = 2. Keyed adds are taken by their keys' first
//! owner, which is then killed with kill -9, and every add is retried
//! through the second owner. Each retry is answered as a duplicate with the
//! first answer's value, and every node holds each key's exact total:
//! nothing counted twice.
//!
//! - `sync` durability: the kill waits until anti-entropy has brought the
//!   first owner's records to the second (the window before that is
//!   documented); after the first owner comes back, both hold the totals.
//! - `replicated` durability, with anti-entropy all but off (1 h), in a
//!   region of three nodes (RF 2, so one node of three owns none of a
//!   key): the kill follows the last acknowledgement at once, and each add
//!   is retried through its key's second owner. The copy push went to that
//!   owner (a key's copies are its other owners) and carried the records,
//!   so it recognises every retry with no window. eu-3 must sync at the
//!   default pace to copy its partitions in, so it could learn records by
//!   anti-entropy too; the keys whose second owner is eu-2 (some are) show
//!   the copies' choice: only a copy push reaches eu-2.
//! - Records stay with their partitions: in a region of three nodes (RF 2),
//!   each node keeps exactly the records of the keys it owns, not the
//!   region's all.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{start_seeded, NodeProcess};
use tally_proto::v1 as pb;
use tally_proto::v1::counters_client::CountersClient;

const LIMIT: Duration = Duration::from_secs(60);
const KEYS: usize = 40;

fn metric(node: &NodeProcess, name: &str) -> u64 {
    let text = common::http_get(node.spec.http, "/metrics").unwrap().1;
    text.lines()
        .filter(|line| line.starts_with(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The eu partition map once both nodes serve it with both nodes active.
async fn settled_map(endpoints: &[String]) -> tally_client::PartitionMap {
    let deadline = Instant::now() + LIMIT;
    loop {
        let mut maps = Vec::new();
        for endpoint in endpoints {
            if let Ok(client) = tally_client::Client::connect(endpoint.clone()).await {
                if let Ok(map) = client.partition_map(None).await {
                    maps.push(map);
                }
            }
        }
        let settled = maps.len() == endpoints.len()
            && maps.iter().all(|map| {
                map.owners == maps[0].owners
                    && map.nodes.len() == endpoints.len()
                    && map.nodes.iter().all(|n| n.state == "active" && n.alive)
            });
        if settled {
            // The routes follow the map within a keeper round.
            tokio::time::sleep(Duration::from_millis(500)).await;
            return maps.swap_remove(0);
        }
        assert!(
            Instant::now() < deadline,
            "no settled partition map: {:?}",
            maps.iter().map(|map| &map.nodes).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn add(endpoint: &str, key: &str, idempotency_key: &str) -> Result<pb::AddResponse, String> {
    let mut client = CountersClient::connect(endpoint.to_string())
        .await
        .map_err(|e| e.to_string())?;
    client
        .add(common::add_one(key, idempotency_key))
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| status.to_string())
}

async fn value(endpoint: &str, key: &str) -> Option<i64> {
    let mut client = CountersClient::connect(endpoint.to_string()).await.ok()?;
    let request = pb::GetRequest {
        key: key.as_bytes().to_vec().into(),
        ..Default::default()
    };
    Some(client.get(request).await.ok()?.into_inner().value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_through_the_next_owner_after_a_kill_is_applied_once() {
    failover(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_add_s_retry_is_a_duplicate_on_its_copy_at_once() {
    failover(true).await;
}

async fn failover(replicated: bool) {
    let root = tempfile::tempdir().unwrap();
    let names: &[&str] = if replicated {
        &["eu-1", "eu-2", "eu-3"]
    } else {
        &["eu-1", "eu-2"]
    };
    let specs: Vec<common::NodeSpec> = names
        .iter()
        .map(|name| {
            let mut spec = common::partitioned_spec(root.path(), "eu", name, 16, 2);
            if replicated {
                spec.durability = "replicated";
                // eu-3 syncs at the default pace, or it would never copy
                // its partitions in and become active.
                if *name != "eu-3" {
                    spec.sync_interval = "1h";
                }
            }
            spec
        })
        .collect();
    let mut nodes = tokio::task::spawn_blocking(move || start_seeded(specs))
        .await
        .unwrap();
    let endpoints: Vec<String> = nodes.iter().map(NodeProcess::endpoint).collect();
    let map = settled_map(&endpoints).await;
    let keys: Vec<String> = (0..)
        .map(|i| format!("post:{i}"))
        .filter(|key| common::first_owner(&map, key) == "eu-1")
        .take(KEYS)
        .collect();
    // Each key's second owner, where its retry goes.
    let count = tally_proto::partition::PartitionCount::new(u64::from(map.partitions)).unwrap();
    let second: BTreeMap<String, String> = keys
        .iter()
        .map(|key| {
            let owners = map.owners_of(count.of_key(key.as_bytes()).0);
            let index = names.iter().position(|name| *name == owners[1]).unwrap();
            (key.clone(), endpoints[index].clone())
        })
        .collect();
    if replicated {
        assert!(
            second.values().any(|endpoint| *endpoint == endpoints[1]),
            "no key has eu-2 as its second owner"
        );
    }

    // 1. Each key takes one keyed add on its first owner, eu-1, and a
    // second, unkeyed one there, so that the first answers differ by key.
    let mut first: BTreeMap<String, i64> = BTreeMap::new();
    for (i, key) in keys.iter().enumerate() {
        for _ in 0..i % 3 {
            add(&endpoints[0], key, "").await.unwrap();
        }
        let added = add(&endpoints[0], key, &format!("like-{key}"))
            .await
            .unwrap();
        assert!(!added.duplicate);
        first.insert(key.clone(), added.value);
    }
    let expected: BTreeMap<String, i64> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| (key.clone(), (i % 3) as i64 + 1))
        .collect();

    // 2. In sync mode, eu-2 pulls eu-1's state, and with it eu-1's
    // idempotency records; a replicated add's copy holds them already.
    let deadline = Instant::now() + LIMIT;
    while !replicated && metric(&nodes[1], "tally_idempotency_records_learned_total") < KEYS as u64
    {
        assert!(
            Instant::now() < deadline,
            "eu-2 did not learn eu-1's records: {} of {KEYS}",
            metric(&nodes[1], "tally_idempotency_records_learned_total")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 3. eu-1 dies; every add is retried through its key's second owner,
    // which now serves it (it forwards to eu-1 first, fails over and serves
    // it itself).
    nodes[0].kill9();
    for key in &keys {
        let retried = loop {
            match add(&second[key], key, &format!("like-{key}")).await {
                Ok(answer) => break answer,
                Err(status) if Instant::now() < deadline => {
                    eprintln!("retrying {key}: {status}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(status) => panic!("{key}: {status}"),
            }
        };
        assert!(
            retried.duplicate,
            "{key}: the retry through {} was applied again",
            second[key]
        );
        assert_eq!(retried.value, first[key], "{key}: the first answer's value");
    }

    // 4. The survivors read each key's exact total (with replicated durability,
    // eu-1's slot came to the second owner with the pushes); in sync mode eu-1
    // comes back and holds them too, once synced.
    let checked = if replicated {
        &endpoints[1..]
    } else {
        nodes[0].restart();
        &endpoints[..]
    };
    for endpoint in checked {
        let deadline = Instant::now() + LIMIT;
        for key in &keys {
            loop {
                let held = value(endpoint, key).await;
                if held == Some(expected[key]) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{endpoint}: {key} holds {held:?}, expected {}",
                    expected[key]
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_keeps_only_the_records_of_the_partitions_it_owns() {
    let root = tempfile::tempdir().unwrap();
    let names = ["eu-1", "eu-2", "eu-3"];
    let specs: Vec<common::NodeSpec> = names
        .iter()
        .map(|name| common::partitioned_spec(root.path(), "eu", name, 16, 2))
        .collect();
    let nodes = tokio::task::spawn_blocking(move || start_seeded(specs))
        .await
        .unwrap();
    let endpoints: Vec<String> = nodes.iter().map(NodeProcess::endpoint).collect();
    let map = settled_map(&endpoints).await;
    // Records are written with their partitions once the (new) cluster is
    // at the version that has them.
    let newest = u64::from(tally_node::replica::version::NEWEST);
    common::wait_until(LIMIT, "every node at the newest cluster version", || {
        nodes
            .iter()
            .all(|node| common::cluster_version(node) == Some(newest))
            .then_some(())
    });

    let count = tally_proto::partition::PartitionCount::new(u64::from(map.partitions)).unwrap();
    let keys: Vec<String> = (0..60).map(|i| format!("post:{i}")).collect();
    for key in &keys {
        // Through eu-1, which forwards the add to the key's first owner.
        let added = add(&endpoints[0], key, &format!("like-{key}"))
            .await
            .unwrap();
        assert!(!added.duplicate);
    }
    let owned: Vec<u64> = names
        .iter()
        .map(|name| {
            let owns = |key: &&String| {
                map.owners_of(count.of_key(key.as_bytes()).0)
                    .iter()
                    .any(|owner| owner == name)
            };
            keys.iter().filter(owns).count() as u64
        })
        .collect();
    assert!(
        owned.iter().all(|owned| *owned < keys.len() as u64),
        "every node owns fewer than all keys: {owned:?}"
    );
    assert_eq!(owned.iter().sum::<u64>(), 2 * keys.len() as u64, "RF 2");

    // Each key's record reaches its other owner, and only it.
    let held = || -> Vec<u64> {
        nodes
            .iter()
            .map(|node| metric(node, "tally_idempotency_records "))
            .collect()
    };
    let deadline = Instant::now() + LIMIT;
    while held() != owned {
        assert!(
            Instant::now() < deadline,
            "records held per node {:?}, expected those of the keys each owns {owned:?}",
            held()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // And no more arrive later: a few sync rounds on, still the same.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        held(),
        owned,
        "records held per node, some sync rounds later"
    );
}
