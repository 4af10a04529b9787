//! Folds of a live node's slots in partitions that moved away from it
//! (issue 13's "a partition it wrote moved away from it for good", cluster
//! version 12), over real node processes: one region, P = 16, RF = 1, so
//! each partition has one owner and every counter one writer. Two nodes
//! write every counter; a third joins and takes about a third of the
//! partitions; the nodes that handed them away retire their slots there
//! after `--retire-after` and the slots are folded, so the new owner holds
//! each moved counter with its own slot and a folded base only. Then the
//! joiner drains: the partitions come back to their first owners, which
//! copy them in folded, pass their write gate, and write them again from a
//! fresh slot; every counter stays exact through every node.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::NodeProcess;

const P: u32 = 16;
const KEYS: usize = 48;
const LIMIT: Duration = Duration::from_secs(120);

fn spec(
    root: &std::path::Path,
    name: &str,
    seed: Option<std::net::SocketAddr>,
) -> common::NodeSpec {
    let mut spec = common::partitioned_spec(root, "eu", name, P, 1);
    spec.extra
        .extend(["--retire-after".to_string(), "2s".to_string()]);
    spec.seeds = seed.into_iter().collect();
    spec
}

fn key(i: usize) -> String {
    format!("post:{i}:likes")
}

fn endpoints(nodes: &[NodeProcess]) -> Vec<String> {
    nodes.iter().map(NodeProcess::endpoint).collect()
}

/// Adds 1 to every counter through each node of `nodes` (each add lands
/// on the counter's owner).
async fn add_through(nodes: &[&NodeProcess]) {
    for node in nodes {
        let client = common::load::quick_client(&node.endpoint()).await;
        for i in 0..KEYS {
            client.add(&key(i), 1).await.unwrap();
        }
    }
}

/// One counter as its owner holds it: value, slots (replica to p), and
/// the folded base's epoch and p.
#[derive(Debug, PartialEq)]
struct Held {
    value: i64,
    slots: BTreeMap<u64, u64>,
    folded: (u64, u64),
}

async fn held(endpoint: &str, key: &str) -> Result<Held, tonic::Status> {
    let answer = common::own_counter(endpoint, key).await?;
    Ok(Held {
        value: answer.value,
        slots: answer.slots.iter().map(|s| (s.replica, s.p)).collect(),
        folded: answer
            .folded
            .map_or((0, 0), |folded| (folded.epoch, folded.p_low)),
    })
}

/// Waits until every counter, at its owner in `map`, satisfies `check`.
async fn wait_for_owners(
    nodes: &[NodeProcess],
    map: &tally_client::PartitionMap,
    what: &str,
    check: impl Fn(usize, &str, &Held) -> bool,
) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let mut wrong = Vec::new();
        for i in 0..KEYS {
            let owner = common::first_owner(map, &key(i));
            let node = nodes.iter().find(|n| n.spec.node_name == owner).unwrap();
            match held(&node.endpoint(), &key(i)).await {
                Ok(held) if check(i, &owner, &held) => {}
                other => wrong.push(format!("{owner} {}: {other:?}", key(i))),
            }
        }
        if wrong.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: never held: {wrong:#?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn replica_of(node: &NodeProcess) -> u64 {
    let client = common::load::quick_client(&node.endpoint()).await;
    client.status().await.unwrap().node.replica
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_that_moved_away_are_folded_and_written_again_when_they_come_back() {
    let root = tempfile::tempdir().unwrap();
    let first = NodeProcess::start_async(spec(root.path(), "eu-1", None)).await;
    let seed = Some(first.spec.gossip);
    let mut nodes = vec![
        first,
        NodeProcess::start_async(spec(root.path(), "eu-2", seed)).await,
    ];
    let before = common::settled_region_map(&endpoints(&nodes), 2).await;
    let waited = endpoints(&nodes);
    tokio::task::spawn_blocking(move || common::wait_cluster_version(&waited, 12, LIMIT))
        .await
        .unwrap();
    add_through(&[&nodes[0], &nodes[1]]).await;
    let mut ids = BTreeMap::new();
    for node in &nodes {
        ids.insert(node.spec.node_name.clone(), replica_of(node).await);
    }
    wait_for_owners(&nodes, &before, "first writes", |_, owner, held| {
        held.value == 2 && held.slots == BTreeMap::from([(ids[owner], 2)])
    })
    .await;

    // A third node joins and takes some partitions from each.
    nodes.push(NodeProcess::start_async(spec(root.path(), "eu-3", seed)).await);
    let after = common::settled_region_map(&endpoints(&nodes), 3).await;
    let joined = std::time::Instant::now();
    ids.insert("eu-3".to_string(), replica_of(&nodes[2]).await);
    let moved: Vec<usize> = (0..KEYS)
        .filter(|i| common::first_owner(&after, &key(*i)) == "eu-3")
        .collect();
    for name in ["eu-1", "eu-2"] {
        let gave = moved
            .iter()
            .filter(|i| common::first_owner(&before, &key(**i)) == name)
            .count();
        assert!(gave > 0, "{name} handed no counter to eu-3: {moved:?}");
    }
    // Each moved counter, at eu-3, loses its first owner's slot into the
    // folded base: no writer is left (eu-3 wrote none yet), the value stays.
    wait_for_owners(&nodes, &after, "moved and folded", |i, owner, held| {
        let first = ids[&common::first_owner(&before, &key(i))];
        match owner == "eu-3" {
            true => held.value == 2 && held.slots.is_empty() && held.folded.1 == 2,
            false => held.value == 2 && held.slots == BTreeMap::from([(first, 2)]),
        }
    })
    .await;
    // A measurement for the notes (`--nocapture`), not a check of speed.
    println!(
        "moved partitions folded {:?} after the join settled ({} of {KEYS} counters moved)",
        joined.elapsed(),
        moved.len()
    );
    // No node lists a retirement of partition slots pending any more.
    for endpoint in endpoints(&nodes) {
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            let status = common::load::quick_client(&endpoint).await.status().await;
            let pending = status.unwrap().retired_partitions;
            if pending.is_empty() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{endpoint}: {pending:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    add_through(&[&nodes[0], &nodes[1], &nodes[2]]).await;
    // The first owners purged the moved counters, their own slots too
    // (folded, `replica/purge.rs`): when the partitions come back, they
    // hold no state of them.
    let moved_keys: Vec<String> = moved.iter().map(|i| key(*i)).collect();
    let deadline = tokio::time::Instant::now() + LIMIT;
    for node in &nodes[..2] {
        loop {
            let stored = common::stored_counters(&node.endpoint()).await;
            let left = stored
                .iter()
                .filter(|c| moved_keys.iter().any(|k| k.as_bytes() == &c.key[..]))
                .count();
            if left == 0 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} still stores {left} moved counters",
                node.spec.node_name
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // eu-3 drains: its partitions go back to their first owners, which copy
    // them folded (their own digests there are empty, not the fold's: the
    // copy, caught up, raises them past it), pass their write gate, and
    // write them again.
    let client = common::load::quick_client(&nodes[0].endpoint()).await;
    client.drain("eu-3").await.unwrap();
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let map = client.partition_map(None).await.unwrap();
        let drained = map.nodes.iter().all(|node| match node.node_name.as_str() {
            "eu-3" => node.state == "left" && node.partitions_held == 0,
            _ => node.partitions_held == node.partitions_owned && node.partitions_releasing == 0,
        });
        if drained {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "eu-3 never left: {map:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    add_through(&[&nodes[0], &nodes[1]]).await;
    // The moved counters: the first owner's old phase (2) and, once eu-3
    // (left, still up) retired and folded its slots of the partitions it
    // handed back, its three adds, in the base; the two new adds in the
    // first owner's fresh slot. One writer per counter, and a base.
    wait_for_owners(
        &nodes,
        &before,
        "back at the first owners",
        |i, owner, held| {
            let own = ids[owner];
            match moved.contains(&i) {
                true => {
                    held.value == 7
                        && held.slots == BTreeMap::from([(own, 2)])
                        && held.folded.1 == 5
                }
                false => held.value == 7 && held.slots == BTreeMap::from([(own, 7)]),
            }
        },
    )
    .await;
    println!(
        "eu-3's slots of the partitions it handed back folded {:?} after the join",
        joined.elapsed()
    );
    for endpoint in endpoints(&nodes) {
        let client = common::load::quick_client(&endpoint).await;
        for i in 0..KEYS {
            assert_eq!(
                client.get(&key(i)).await.unwrap(),
                7,
                "{endpoint} {}",
                key(i)
            );
        }
    }
}
