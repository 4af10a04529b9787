//! Folds in a partitioned region, over real node processes (issue 13,
//! cluster version 10): P = 16, RF = 2, three nodes of one region, so each
//! node keeps about two thirds of the partitions and no two nodes' whole
//! digests of a writer agree. Counters are written through every node; eu-3
//! is stopped, wiped and started again (a new incarnation under its name);
//! its old replica id is retired after `--retire-after` and must be folded
//! at every node, partition by partition. Then every node that keeps a
//! counter's partition holds it, from its own state, with no slot of the
//! folded writer, a folded base, and the exact total; and the total is
//! exact through every node.

mod common;

use std::time::Duration;

use common::{NodeProcess, NodeSpec};
use tally_proto::partition::PartitionCount;
use tally_proto::v1::counters_client::CountersClient;
use tally_proto::v1::GetRequest;
use tonic::Request;

const P: u64 = 16;
const RF: u32 = 2;
const KEYS: usize = 40;
const LIMIT: Duration = Duration::from_secs(90);

fn spec(root: &std::path::Path, name: &str) -> NodeSpec {
    let mut spec = common::partitioned_spec(root, "eu", name, P as u32, RF);
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

/// A counter as the node at `endpoint` holds it itself (the request is
/// marked forwarded, so the node answers from its own state or refuses):
/// its value, its writers' ids, and its folded base's epoch.
async fn own_slots(endpoint: &str, key: &str) -> Result<(i64, Vec<u64>, u64), tonic::Status> {
    let mut client = CountersClient::connect(endpoint.to_string()).await.unwrap();
    let mut request = Request::new(GetRequest {
        key: key.as_bytes().to_vec().into(),
        breakdown: false,
        slots: true,
    });
    request
        .metadata_mut()
        .insert("tally-forwarded", "the-test".parse().unwrap());
    request.set_timeout(Duration::from_secs(5));
    let answer = client.get(request).await?.into_inner();
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
    let root = tempfile::tempdir().unwrap();
    let first = spec(root.path(), "eu-1");
    let seed = first.gossip;
    let mut nodes = vec![NodeProcess::start_async(first).await];
    for name in ["eu-2", "eu-3"] {
        let mut joiner = spec(root.path(), name);
        joiner.seeds = vec![seed];
        nodes.push(NodeProcess::start_async(joiner).await);
    }
    let map = common::settled_region_map(&endpoints(&nodes), 3).await;
    // Folds by partition need cluster version 10; a new cluster is there.
    let waited = endpoints(&nodes);
    tokio::task::spawn_blocking(move || common::wait_cluster_version(&waited, 10, LIMIT))
        .await
        .unwrap();

    // One add of each counter through each node: each lands on its first
    // live owner, so eu-3 writes the counters of the partitions it leads.
    for endpoint in endpoints(&nodes) {
        let client = common::load::quick_client(&endpoint).await;
        for i in 0..KEYS {
            client.add(&key(i), 1).await.unwrap();
        }
    }
    let old = common::load::quick_client(&nodes[2].endpoint())
        .await
        .status()
        .await
        .unwrap()
        .node
        .replica;
    // Every owner holds every add before eu-3's disk goes.
    let owners = |key: &str| map.owners_of(partition_of(key));
    let names = ["eu-1", "eu-2", "eu-3"];
    wait_for_owners(&nodes, &names, &owners, |_, _| true).await;
    let mut wrote = 0;
    for i in 0..KEYS {
        let (_, slots, _) = own_slots(&nodes[2].endpoint(), &key(i))
            .await
            .unwrap_or_default();
        wrote += usize::from(slots.contains(&old));
    }
    assert!(wrote > 0, "eu-3 wrote no counter");

    tokio::task::spawn_blocking({
        let mut eu_3 = nodes.pop().unwrap();
        move || {
            eu_3.stop();
            eu_3.wipe();
            eu_3.restart();
            eu_3
        }
    })
    .await
    .map(|eu_3| nodes.push(eu_3))
    .unwrap();
    wait_folded(&endpoints(&nodes), old).await;

    // Every keeper of a counter's partition holds it exact, with the old
    // incarnation's slot folded into the base.
    wait_for_owners(&nodes, &names, &owners, |slots, epoch| {
        !slots.contains(&old) && epoch >= 1
    })
    .await;
    for endpoint in endpoints(&nodes) {
        let client = common::load::quick_client(&endpoint).await;
        for i in 0..KEYS {
            assert_eq!(
                client.get(&key(i)).await.unwrap(),
                3,
                "{endpoint} {}",
                key(i)
            );
        }
    }
}

/// Waits until, for every counter, every node among its owners holds it
/// itself with the exact total (3) and `also(writers, epoch)` holds.
async fn wait_for_owners<'m>(
    nodes: &[NodeProcess],
    names: &[&str],
    owners: &impl Fn(&str) -> Vec<&'m str>,
    also: impl Fn(&[u64], u64) -> bool,
) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let mut wrong = Vec::new();
        for i in 0..KEYS {
            let key = key(i);
            for (node, name) in nodes.iter().zip(names) {
                if !owners(&key).contains(name) {
                    continue;
                }
                match own_slots(&node.endpoint(), &key).await {
                    Ok((3, slots, epoch)) if also(&slots, epoch) => {}
                    other => wrong.push(format!("{name} {key}: {other:?}")),
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
