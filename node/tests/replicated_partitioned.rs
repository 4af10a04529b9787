//! Replicated durability in a partitioned region (issue 42), with real
//! `tally-node` processes: a key's copies go only to nodes that hold its
//! partition, so a copy outlives the taking node's disk.
//!
//! Three nodes in `eu`, RF 2, every add `replicated` with 2 copies. With
//! eu-3 killed (and not gone: `--dead-after` is ten minutes), a key owned
//! by eu-1 and eu-3 has no live holder to copy to: its add fails
//! `UNAVAILABLE` (before, it was copied to eu-2, which deleted the copy once
//! durable), while a key owned by eu-1 and eu-2 goes on being acknowledged
//! (its counter is not held up behind the parked one). A copy sent by hand
//! to a node that does not hold the key's partition is refused. Once eu-3 is
//! back, the failed add's retry with its idempotency key counts it once.

mod common;

use std::time::Duration;

use common::{cli, partitioned_spec, settled_region_map, start_seeded, wait_until};
use tally_client::{ClientConfig, Code, PartitionMap};
use tally_proto::partition::PartitionCount;
use tally_proto::v1 as pb;

const PARTITIONS: u32 = 16;

/// The first key `k0`, `k1`, ... whose owners are `owners`, in order.
fn key_owned_by(map: &PartitionMap, owners: [&str; 2]) -> String {
    let count = PartitionCount::new(u64::from(map.partitions)).unwrap();
    (0..10_000)
        .map(|index| format!("k{index}"))
        .find(|key| map.owners_of(count.of_key(key.as_bytes()).0) == owners)
        .expect("some key has these owners")
}

fn value(endpoint: &str, key: &str) -> Option<i64> {
    let (code, stdout, _) = cli(endpoint, &["--json", "get", key]);
    let json: serde_json::Value = serde_json::from_str(&stdout).ok()?;
    (code == 0).then(|| json["value"].as_i64())?
}

#[test]
fn a_key_without_a_live_holder_to_copy_to_waits_and_the_others_are_answered() {
    let root = tempfile::tempdir().unwrap();
    let specs = (1..=3)
        .map(|index| {
            let name = format!("eu-{index}");
            let mut spec = partitioned_spec(root.path(), "eu", &name, PARTITIONS, 2);
            spec.durability = "replicated";
            spec
        })
        .collect();
    let mut nodes = start_seeded(specs);
    let endpoints: Vec<String> = nodes.iter().map(|node| node.endpoint()).collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let map = runtime.block_on(settled_region_map(&endpoints, 3));
    let lonely = key_owned_by(&map, ["eu-1", "eu-3"]);
    let paired = key_owned_by(&map, ["eu-1", "eu-2"]);
    let taker = endpoints[0].clone();
    let client = runtime.block_on(async {
        ClientConfig::default()
            .with_deadline(Duration::from_secs(2))
            .with_max_retries(0)
            .connect(taker.clone())
            .await
            .unwrap()
    });
    let add = |key: &str, idempotency_key: &str| {
        runtime.block_on(client.add_with_key(key, 1, idempotency_key))
    };
    add(&lonely, "lonely-1").expect("both owners up: copied to eu-3");
    add(&paired, "paired-1").expect("both owners up: copied to eu-2");

    nodes[2].kill9();
    let error = add(&lonely, "lonely-2").expect_err("acknowledged with no holder to copy to");
    assert_eq!(error.code(), Some(Code::Unavailable), "{error}");
    assert!(
        error.to_string().contains("same idempotency key"),
        "{error}"
    );
    // The lonely key's counter is parked: the other key's adds go on.
    add(&paired, "paired-2").expect("a key with a live holder is acknowledged");

    // eu-2 does not hold the lonely key's partition: it refuses a copy of it.
    let refused = runtime.block_on(async {
        let mut replication =
            pb::replication_client::ReplicationClient::connect(endpoints[1].clone())
                .await
                .unwrap();
        let version = tally_node::replica::version::NEWEST;
        replication
            .copy(pb::CopyRequest {
                cluster_id: nodes[1].spec.cluster_id.clone(),
                source_replica: 42,
                source_region: "eu".into(),
                upto_seq: 1,
                counters: vec![pb::CopiedSlot {
                    key: lonely.as_bytes().to_vec().into(),
                    p: 1,
                    n: 0,
                    folded: None,
                }],
                protocol_version: version,
                protocol_oldest: version,
                records: Vec::new(),
                id_keys: Vec::new(),
            })
            .await
            .expect_err("a copy of a partition eu-2 does not hold")
    });
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("does not hold partition"),
        "{}",
        refused.message()
    );
    let stored = runtime.block_on(common::stored_counters(&endpoints[1]));
    assert!(
        stored
            .iter()
            .all(|counter| counter.key != lonely.as_bytes()),
        "eu-2 stored a counter of a partition it does not hold"
    );

    // eu-3 comes back: the retry of the failed add is counted once.
    nodes[2].restart();
    let (_, took) = wait_until(
        Duration::from_secs(60),
        "the retry to be acknowledged",
        || add(&lonely, "lonely-2").ok(),
    );
    println!("the retry was acknowledged {took:?} after eu-3 restarted");
    wait_until(Duration::from_secs(30), "the totals on eu-1", || {
        (value(&taker, &lonely) == Some(2) && value(&taker, &paired) == Some(2)).then_some(())
    });
}
