//! Folds in a partitioned region, over real node processes (issue 13,
//! cluster version 10): P = 16, RF = 2, three nodes of one region (and, run
//! by hand, three in each of two regions), so each node keeps about two
//! thirds of the partitions and no two nodes' whole digests of a writer
//! agree. Counters are written through every node; the last node is
//! stopped, wiped and started again (a new incarnation under its name); its
//! old replica id is retired after `--retire-after` and must be folded at
//! every node, partition by partition. Then every node that keeps a
//! counter's partition holds it, from its own state, with no slot of the
//! folded writer, a folded base, and the exact total; the total is exact
//! through every node; a node that joins after the fold holds the counters
//! it owns folded and exact; and `tally status` says converged, every two
//! members compared on the partitions both keep. A node removed for good
//! (`tally admin remove`) is retired without `tally admin retire` and folded
//! the same way.

mod common;

use std::time::Duration;

use common::{NodeProcess, NodeSpec};
use tally_proto::partition::PartitionCount;

const P: u64 = 16;
const RF: u32 = 2;
const KEYS: usize = 40;
const LIMIT: Duration = Duration::from_secs(90);

fn spec(root: &std::path::Path, region: &str, name: &str) -> NodeSpec {
    let mut spec = common::partitioned_spec(root, region, name, P as u32, RF);
    spec.extra
        .extend(["--retire-after".to_string(), "2s".to_string()]);
    spec
}

fn key(i: usize) -> String {
    format!("post:{i}:views")
}

fn partition_of(key: &str) -> u32 {
    PartitionCount::new(P).unwrap().of_key(key.as_bytes()).0
}

fn endpoints(nodes: &[NodeProcess]) -> Vec<String> {
    nodes.iter().map(NodeProcess::endpoint).collect()
}

/// A counter as the node at `endpoint` holds it itself
/// ([`common::own_counter`]): its value, its writers' ids, and its folded
/// base's epoch.
async fn own_slots(endpoint: &str, key: &str) -> Result<(i64, Vec<u64>, u64), tonic::Status> {
    let answer = common::own_counter(endpoint, key).await?;
    Ok((
        answer.value,
        answer.slots.iter().map(|slot| slot.replica).collect(),
        answer.folded.map_or(0, |folded| folded.epoch),
    ))
}

/// Waits until every node lists `writer` retired and folded.
async fn wait_folded(endpoints: &[String], writer: u64) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let mut waiting = Vec::new();
        for endpoint in endpoints {
            let status = common::load::quick_client(endpoint).await.status().await;
            let state = status.ok().and_then(|status| {
                status
                    .retired
                    .into_iter()
                    .find(|retired| retired.replica == writer)
            });
            match state {
                Some(retired) if retired.folded_epoch > 0 => {}
                other => waiting.push(format!("{endpoint}: {other:?}")),
            }
        }
        if waiting.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "writer {writer:016x} never folded everywhere: {waiting:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_of_a_partitioned_region_is_folded_partition_by_partition() {
    wipe_and_fold(&["eu"]).await;
}

/// The same over two regions of three nodes (keepers of a partition in both
/// agree on it). Run by hand (about 15 s):
/// `cargo test -p tally-node --test partitioned_folds -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn a_wiped_node_of_one_of_two_partitioned_regions_is_folded_everywhere() {
    wipe_and_fold(&["eu", "us"]).await;
}

/// A node removed for good (`tally admin remove`) had every partition it
/// wrote move away for good: its replica is retired without an operator's
/// `tally admin retire` and folded at the nodes left, which then hold
/// every counter exact with no slot of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_node_of_a_partitioned_region_is_retired_and_folded() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    let mut seed = None;
    for i in 1..=3 {
        let mut spec = spec(root.path(), "eu", &format!("eu-{i}"));
        spec.seeds = seed.into_iter().collect();
        seed.get_or_insert(spec.gossip);
        nodes.push(NodeProcess::start_async(spec).await);
    }
    let map = common::settled_region_map(&endpoints(&nodes), 3).await;
    let total = at_version_10_add_through_each(&nodes).await;
    let client = common::load::quick_client(&nodes[2].endpoint()).await;
    let gone = client.status().await.unwrap().node.replica;
    let owns = |node: &NodeProcess, key: &str| {
        map.owners_of(partition_of(key))
            .contains(&node.spec.node_name.as_str())
    };
    wait_for_owners(&nodes, &owns, total, |_, _| true).await;

    // The last node is lost for good; the first is asked to remove it
    // (refused while it still looks alive there).
    let mut lost = nodes.pop().unwrap();
    tokio::task::spawn_blocking(move || lost.stop())
        .await
        .unwrap();
    let first = common::load::quick_client(&nodes[0].endpoint()).await;
    let deadline = tokio::time::Instant::now() + LIMIT;
    while let Err(error) = first.remove("eu-3").await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "eu-3 never removed: {error}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    wait_folded(&endpoints(&nodes), gone).await;
    // Two nodes and RF 2: each keeps every partition now.
    wait_for_owners(&nodes, &|_, _| true, total, |slots, epoch| {
        !slots.contains(&gone) && epoch >= 1
    })
    .await;
}

/// Three nodes in each of `regions`, one add of every counter through each
/// node, then the last node wiped: its old incarnation is folded everywhere.
async fn wipe_and_fold(regions: &[&str]) {
    let root = tempfile::tempdir().unwrap();
    let names: Vec<String> = regions
        .iter()
        .flat_map(|region| (1..=3).map(move |i| format!("{region}-{i}")))
        .collect();
    let mut nodes = Vec::new();
    let mut seed = None;
    for name in &names {
        let region = name.split('-').next().unwrap();
        let mut spec = spec(root.path(), region, name);
        spec.seeds = seed.into_iter().collect();
        seed.get_or_insert(spec.gossip);
        nodes.push(NodeProcess::start_async(spec).await);
    }
    let mut maps = Vec::new();
    for region in nodes.chunks(3) {
        maps.push(common::settled_region_map(&endpoints(region), 3).await);
    }
    let region_of = |node: &NodeProcess| {
        regions
            .iter()
            .position(|region| *region == node.spec.region)
            .unwrap()
    };
    let total = at_version_10_add_through_each(&nodes).await;
    let last = nodes.len() - 1;
    let old = common::load::quick_client(&nodes[last].endpoint())
        .await
        .status()
        .await
        .unwrap()
        .node
        .replica;
    // Every owner holds every add before the last node's disk goes.
    let owns_in = |maps: &[tally_client::PartitionMap], node: &NodeProcess, key: &str| {
        maps[region_of(node)]
            .owners_of(partition_of(key))
            .contains(&node.spec.node_name.as_str())
    };
    let owns = |node: &NodeProcess, key: &str| owns_in(&maps, node, key);
    for node in &nodes {
        let owned = (0..KEYS).filter(|i| owns(node, &key(*i))).count();
        assert!(
            owned > 0 && owned < KEYS,
            "{} owns {owned} counters",
            node.spec.node_name
        );
    }
    wait_for_owners(&nodes, &owns, total, |_, _| true).await;
    let mut wrote = 0;
    for i in 0..KEYS {
        let (_, slots, _) = own_slots(&nodes[last].endpoint(), &key(i))
            .await
            .unwrap_or_default();
        wrote += usize::from(slots.contains(&old));
    }
    assert!(wrote > 0, "{} wrote no counter", names[last]);

    tokio::task::spawn_blocking({
        let mut wiped = nodes.pop().unwrap();
        move || {
            wiped.stop();
            wiped.wipe();
            wiped.restart();
            wiped
        }
    })
    .await
    .map(|wiped| nodes.push(wiped))
    .unwrap();
    let restarted = std::time::Instant::now();
    wait_folded(&endpoints(&nodes), old).await;
    // A measurement for the notes (`--nocapture`), not a check of speed.
    println!(
        "{regions:?}: the old incarnation folded at every node {:?} after the wiped node restarted",
        restarted.elapsed()
    );

    // Every keeper of a counter's partition holds it exact, with the old
    // incarnation's slot folded into the base.
    wait_for_owners(&nodes, &owns, total, |slots, epoch| {
        !slots.contains(&old) && epoch >= 1
    })
    .await;
    for endpoint in endpoints(&nodes) {
        let client = common::load::quick_client(&endpoint).await;
        for i in 0..KEYS {
            assert_eq!(
                client.get(&key(i)).await.unwrap(),
                total,
                "{endpoint} {}",
                key(i)
            );
        }
    }
    // A node joining the last region after the fold copies its partitions
    // already folded: it holds every counter it owns exact, with the base.
    let region = regions[regions.len() - 1];
    let mut joiner = spec(root.path(), region, &format!("{region}-4"));
    joiner.seeds = vec![nodes[0].spec.gossip];
    nodes.push(NodeProcess::start_async(joiner).await);
    let in_region: Vec<String> = nodes
        .iter()
        .filter(|node| node.spec.region == region)
        .map(NodeProcess::endpoint)
        .collect();
    maps[regions.len() - 1] = common::settled_region_map(&in_region, 4).await;
    let owns = |node: &NodeProcess, key: &str| owns_in(&maps, node, key);
    wait_for_owners(&nodes, &owns, total, |slots, epoch| {
        !slots.contains(&old) && epoch >= 1
    })
    .await;

    // Every node says it is done with the fold, the joiner too (it applied
    // nothing itself: it holds no slot of the old incarnation to fold).
    for endpoint in endpoints(&nodes) {
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            let status = common::load::quick_client(&endpoint).await.status().await;
            let status = status.unwrap();
            let epoch = status.retired.iter().map(|r| r.folded_epoch).max();
            if epoch.is_some_and(|epoch| epoch >= 1 && status.folds_applied == epoch) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{endpoint} never done with the fold: folds_applied {} of {epoch:?}",
                status.folds_applied
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // Whole-node digests differ by design here; `tally status` compares
    // every two members on the partitions both keep, and says converged.
    let pairs = nodes.len() * (nodes.len() - 1) / 2;
    for endpoint in endpoints(&nodes) {
        tokio::task::spawn_blocking(move || {
            common::wait_until(LIMIT, "tally status says converged", || {
                let (_, out, _) = common::cli(&endpoint, &["status"]);
                out.lines()
                    .any(|line| {
                        line.starts_with("converged: yes (every two of the")
                            && line.contains(&format!("({pairs} pairs)"))
                    })
                    .then_some(())
            })
        })
        .await
        .unwrap();
    }
}

/// Waits until the cluster is at version 10 (folds by partition; a new
/// cluster gets there by itself), then adds 1 to each counter through each
/// node: each add lands on its first live owner in the node's region, so
/// every node writes the counters of the partitions it leads. Returns each
/// counter's total.
async fn at_version_10_add_through_each(nodes: &[NodeProcess]) -> i64 {
    let waited = endpoints(nodes);
    tokio::task::spawn_blocking(move || common::wait_cluster_version(&waited, 10, LIMIT))
        .await
        .unwrap();
    for endpoint in endpoints(nodes) {
        let client = common::load::quick_client(&endpoint).await;
        for i in 0..KEYS {
            client.add(&key(i), 1).await.unwrap();
        }
    }
    nodes.len() as i64
}

/// Waits until, for every counter, every node that owns it (`owns(node,
/// key)`) holds it itself with the exact `total` and `also(writers, epoch)`
/// holds.
async fn wait_for_owners(
    nodes: &[NodeProcess],
    owns: &impl Fn(&NodeProcess, &str) -> bool,
    total: i64,
    also: impl Fn(&[u64], u64) -> bool,
) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let mut wrong = Vec::new();
        for i in 0..KEYS {
            let key = key(i);
            for node in nodes {
                if !owns(node, &key) {
                    continue;
                }
                match own_slots(&node.endpoint(), &key).await {
                    Ok((value, slots, epoch)) if value == total && also(&slots, epoch) => {}
                    other => wrong.push(format!("{} {key}: {other:?}", node.spec.node_name)),
                }
            }
        }
        if wrong.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "owners never held their counters: {wrong:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
