//! Replicated durability (issue 12) with real `tally-node` processes: a
//! `replicated` add is acknowledged only once a copy in its region has it on
//! disk, so losing the taking node's disk loses none of them.
//!
//! The main test runs three nodes in `eu` and one in `us`, every one with a
//! one-hour sync interval (a node pulls once, at start, before anything is
//! written), so no add can leave its node by anti-entropy. Adds go to eu-1,
//! the first owner of every key used, so it takes them (its default is `sync`; the client asks for `replicated`, and one add
//! comes from `tally add --durability replicated`). Then eu-1 is killed with
//! `kill -9` and its data directory deleted, the copies are killed with
//! `kill -9` too (what they acknowledged must be on their disks), and every
//! node comes back with a short sync interval: every acknowledged add must
//! be present on every node of both regions.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{cli, wait_until, Cluster, NodeProcess, NodeSpec};
use tally_client::{ClientConfig, Durability};

/// Keys whose first owner in eu is eu-1 (checked below), so that eu-1 is
/// the node that takes their adds, forwarded or not.
const KEYS: [&str; 3] = ["poll:1:votes", "poll:2:votes", "shop:1:sold"];
const TASKS: usize = 6;
const ADDS_PER_TASK: usize = 40;

fn value(endpoint: &str, key: &str) -> Option<i64> {
    let (code, stdout, _) = cli(endpoint, &["--json", "get", key]);
    if code != 0 {
        return None;
    }
    let json: serde_json::Value = serde_json::from_str(&stdout).ok()?;
    json["value"].as_i64()
}

/// Adds with replicated durability through the real client; every add is
/// retried with its idempotency key until it is acknowledged, so the totals
/// are exact.
async fn replicated_load(endpoint: String) -> BTreeMap<String, i64> {
    let client = ClientConfig::default()
        .with_durability(Durability::Replicated)
        .connect(endpoint)
        .await
        .expect("connecting");
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked: BTreeMap<String, i64> = BTreeMap::new();
            for n in 0..ADDS_PER_TASK {
                let key = KEYS[(task + n) % KEYS.len()];
                let delta = if n % 5 == 4 { -1 } else { 2 };
                let idempotency_key = format!("t{task}-n{n}");
                let mut tries = 0;
                loop {
                    tries += 1;
                    match client.add_with_key(key, delta, &idempotency_key).await {
                        Ok(_) => break,
                        Err(error) if tries < 10 && error.is_transient() => {
                            tokio::time::sleep(Duration::from_millis(100)).await
                        }
                        Err(error) => panic!("add {idempotency_key} failed: {error}"),
                    }
                }
                *acked.entry(key.to_string()).or_default() += delta;
            }
            acked
        }));
    }
    let mut totals = BTreeMap::new();
    for task in tasks {
        for (key, sum) in task.await.unwrap() {
            *totals.entry(key).or_default() += sum;
        }
    }
    totals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_taking_node_loses_no_replicated_add() {
    let mut cluster = tokio::task::spawn_blocking(|| {
        let root = tempfile::tempdir().unwrap();
        let mut specs = Vec::new();
        for (region, count) in [("eu", 3), ("us", 1)] {
            for index in 1..=count {
                let mut spec = NodeSpec::new(root.path(), region, &format!("{region}-{index}"));
                spec.sync_interval = "1h";
                specs.push(spec);
            }
        }
        let seed = specs[0].gossip;
        for spec in specs.iter_mut().skip(1) {
            spec.seeds = vec![seed];
        }
        let nodes: Vec<NodeProcess> = specs.into_iter().map(NodeProcess::start).collect();
        Cluster { root, nodes }
    })
    .await
    .unwrap();
    let taker = cluster.nodes[0].endpoint();
    let us = cluster.nodes[3].endpoint();
    // A key's first owner serves it wherever its adds are sent (a node
    // always serves the keys it owns first, whatever its state).
    let map = common::region_map(&taker, 3).await;
    for key in KEYS {
        assert_eq!(common::first_owner(&map, key), "eu-1", "{key}");
    }

    let mut expected = replicated_load(taker.clone()).await;
    let (code, stdout, stderr) = cli(
        &taker,
        &[
            "add",
            "shop:1:sold",
            "5",
            "--durability",
            "replicated",
            "--idempotency-key",
            "cli-1",
        ],
    );
    assert_eq!(
        code, 0,
        "tally add --durability replicated: {stdout}{stderr}"
    );
    *expected.entry("shop:1:sold".into()).or_default() += 5;

    // Nothing left eu-1 by anti-entropy: us has pulled nothing yet.
    for key in KEYS {
        assert_eq!(value(&us, key), Some(0), "{key} reached us by a pull");
    }

    // eu-1 loses its disk; the copies are killed too (what they confirmed
    // must be on their disks); everyone comes back syncing every 100 ms.
    let old_id = status_replica(&taker);
    for node in cluster.nodes.iter_mut() {
        node.kill9();
    }
    cluster.nodes[0].wipe();
    tokio::task::spawn_blocking(move || {
        for node in cluster.nodes.iter_mut() {
            node.spec.sync_interval = "100ms";
            node.restart();
        }
        assert_ne!(
            status_replica(&cluster.nodes[0].endpoint()),
            old_id,
            "a wiped node is a new replica"
        );
        let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.endpoint()).collect();
        let (_, took) = wait_until(
            Duration::from_secs(60),
            "every acknowledged add on every node",
            || {
                endpoints
                    .iter()
                    .all(|endpoint| {
                        expected
                            .iter()
                            .all(|(key, want)| value(endpoint, key) == Some(*want))
                    })
                    .then_some(())
            },
        );
        println!(
            "every node holds every acknowledged add {took:?} after the restarts: {expected:?}"
        );
        drop(cluster);
    })
    .await
    .unwrap();
}

/// The node's replica id, as `tally status` shows it.
fn status_replica(endpoint: &str) -> String {
    let (code, stdout, stderr) = cli(endpoint, &["--json", "status"]);
    assert_eq!(code, 0, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    json["node"]["replica"].as_str().unwrap().to_string()
}

#[test]
fn a_replicated_add_without_enough_copies_fails_unavailable_naming_how_many() {
    let mut cluster = Cluster::start(&[("eu", 2)], "replicated");
    let endpoint = cluster.nodes[0].endpoint();
    // With its copy up, the node's default mode works.
    let (code, _, stderr) = cli(&endpoint, &["add", "votes", "1"]);
    assert_eq!(code, 0, "{stderr}");
    cluster.nodes[1].kill9();
    // One attempt (the CLI's client would retry within its deadline), so
    // that the node's own answer is what the caller sees.
    let error = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = ClientConfig::default()
            .with_deadline(Duration::from_secs(2))
            .with_max_retries(0)
            .connect(endpoint.clone())
            .await
            .unwrap();
        client
            .add_with_key("votes", 1, "late-vote")
            .await
            .expect_err("acknowledged without a copy")
    });
    assert_eq!(
        error.code(),
        Some(tally_client::Code::Unavailable),
        "{error}"
    );
    let text = error.to_string();
    assert!(
        text.contains("only 1 of the 2 copies") && text.contains("same idempotency key"),
        "{text}"
    );
    // The copy comes back: the retry with the same key is counted once.
    cluster.nodes[1].restart();
    let (_, took) = wait_until(Duration::from_secs(30), "the retry to succeed", || {
        let (code, stdout, _) = cli(
            &endpoint,
            &["add", "votes", "1", "--idempotency-key", "late-vote"],
        );
        (code == 0).then_some(stdout)
    });
    println!("the retry succeeded {took:?} after the copy restarted");
    assert_eq!(value(&endpoint, "votes"), Some(2));
}

#[test]
fn write_copies_out_of_range_is_a_startup_error_naming_the_setting() {
    let root = tempfile::tempdir().unwrap();
    let spec = NodeSpec::new(root.path(), "eu", "eu-1");
    for bad in ["0", "1", "99"] {
        let mut spec = spec.clone();
        spec.extra = vec!["--write-copies".into(), bad.into()];
        let output = NodeProcess::spawn_raw(&spec);
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("--write-copies {bad} is not valid")),
            "{stderr}"
        );
    }
}

/// The quick start's cluster has one node per region: a replicated add
/// there can never get its copy. It is refused at once, before anything is
/// applied, naming what it needs and what the region has (it used to be
/// applied, then answered "outcome unknown" after 5 s, so that a retry
/// without the key counted twice).
#[test]
fn a_replicated_add_in_a_one_node_region_is_refused_before_it_is_applied() {
    let root = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(NodeSpec::new(root.path(), "eu", "eu-1"));
    let endpoint = node.endpoint();
    let started = std::time::Instant::now();
    let (code, stdout, stderr) = cli(
        &endpoint,
        &["add", "votes", "1", "--durability", "replicated"],
    );
    assert_ne!(code, 0, "{stdout}");
    assert!(
        stderr.contains("needs 2 nodes in region eu") && stderr.contains("knows 1 there"),
        "{stderr}"
    );
    assert!(stderr.contains("nothing was applied"), "{stderr}");
    let api = common::http::Api::new(node.spec.http);
    let refused = api
        .call(
            "POST",
            "/v1/counters/votes",
            &[("idempotency-key", "v-1")],
            Some("{\"delta\": 1, \"durability\": \"replicated\"}"),
        )
        .problem(422, "FAILED_PRECONDITION");
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .contains("--write-copies"),
        "{refused}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "refused at once, not after waiting for copies: {:?}",
        started.elapsed()
    );
    assert_eq!(value(&endpoint, "votes"), Some(0), "nothing was applied");
    // The key left no record: a sync add with it is a first add.
    let added = api
        .call(
            "POST",
            "/v1/counters/votes",
            &[("idempotency-key", "v-1")],
            Some("{\"delta\": 1}"),
        )
        .json();
    assert_eq!(added["duplicate"], false, "{added}");
    assert_eq!(added["value"], 1, "{added}");
}
