//! What peers and strangers can do to a node, with real processes: a caller
//! of `Replication` cannot grow the metrics with ids of its choosing, and a
//! second process with an existing node name never cuts the first out of
//! replication.

mod common;

use std::time::Duration;

use common::{http_get, wait_until, Cluster, NodeProcess, NodeSpec};
use tally_proto::v1::replication_client::ReplicationClient;

/// The tests here start up to five nodes each: one at a time, so that their
/// free-port picks (probed, then released until the node binds) cannot
/// collide with each other's.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `sync_sent_*` is labelled with the caller's replica id only when the
/// caller is a member; any other id a caller sends is counted as `unknown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_from_strangers_are_labelled_unknown_in_the_metrics() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::spawn(&[("eu", 1), ("us", 1)], "sync").await;
    let endpoints = cluster.endpoints();
    common::load::quick_client(&endpoints[0])
        .await
        .add("k", 3)
        .await
        .unwrap();
    let (eu_http, us_http) = (cluster.nodes[0].spec.http, cluster.nodes[1].spec.http);
    let us_replica = wait_until(Duration::from_secs(20), "us's replica id", || {
        let (_, json) = http_get(us_http, "/status.json").ok()?;
        let json: serde_json::Value = serde_json::from_str(&json).ok()?;
        json["node"]["replica"].as_str().map(str::to_string)
    })
    .0;
    // The member us pulls from eu and is labelled with its replica id.
    let member_label =
        format!("tally_sync_sent_bytes_total{{peer=\"{us_replica}\",region=\"us\"}}");
    wait_until(Duration::from_secs(20), "eu's metrics name us", || {
        let (_, metrics) = http_get(eu_http, "/metrics").ok()?;
        metrics.contains(&member_label).then_some(())
    });

    let mut replication = ReplicationClient::connect(endpoints[0].clone())
        .await
        .unwrap();
    let strangers: Vec<u64> = (1..=50).map(|i| 0x5eed_0000_0000_0000 + i).collect();
    for caller in &strangers {
        let mut stream = replication
            .pull(tally_proto::v1::PullRequest {
                cluster_id: "test-cluster".into(),
                caller_replica: *caller,
                max_bytes: 1 << 20,
                protocol_version: tally_node::replica::version::NEWEST,
                protocol_oldest: tally_node::replica::version::OLDEST,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        while stream.message().await.unwrap().is_some() {}
    }
    let (_, metrics) = http_get(eu_http, "/metrics").unwrap();
    for caller in &strangers {
        assert!(
            !metrics.contains(&format!("{caller:016x}")),
            "a stranger's id {caller:016x} is a label: {metrics}"
        );
    }
    assert!(
        metrics.contains("tally_sync_sent_bytes_total{peer=\"unknown\",region=\"unknown\"}"),
        "{metrics}"
    );
    assert!(metrics.contains(&member_label), "{metrics}");
}

/// The value of `key` on every node, in order.
async fn values(nodes: &[&NodeProcess], key: &str) -> Vec<Option<i64>> {
    let mut seen = Vec::new();
    for node in nodes {
        let value = match tally_client::Client::connect(&node.endpoint()).await {
            Ok(client) => client.get(key).await.ok(),
            Err(_) => None,
        };
        seen.push(value);
    }
    seen
}

/// Waits (at most 30 s) until every node reads exactly `expected` for `key`.
async fn wait_all_read(nodes: &[&NodeProcess], key: &str, expected: i64, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let seen = values(nodes, key).await;
        if seen.iter().all(|value| *value == Some(expected)) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: expected {expected} on every node, read {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn status_json(node: &NodeProcess) -> serde_json::Value {
    let (code, body) = http_get(node.spec.http, "/status.json").unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Issue #10, item 1, with real processes: a second process started with an
/// existing `--node-name` refuses to start; one that could not see the first
/// at start (it had no seeds) and meets it later never hides it: both are
/// pulled, every node reads the exact total, both log an error, and the
/// status shows the problem; once the newcomer is gone every node still
/// reaches the full total.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_with_an_existing_name_never_cuts_the_first_out() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::spawn(&[("eu-west", 1), ("us-east", 1), ("ap-south", 1)], "sync").await;
    let root = cluster.root.path().to_path_buf();
    let (eu, us, ap) = (&cluster.nodes[0], &cluster.nodes[1], &cluster.nodes[2]);
    let eu_replica = status_json(eu)["node"]["replica"]
        .as_str()
        .unwrap()
        .to_string();

    // The scenario: same --node-name, same --seeds. It refuses to start.
    let mut twin = NodeSpec::new(&root, "eu-west", "eu-west-1");
    twin.data_dir = root.join("eu-west-1-twin");
    twin.seeds = vec![eu.spec.gossip, us.spec.gossip];
    let spec = twin.clone();
    let (code, stderr) =
        tokio::task::spawn_blocking(move || common::run_bounded(&spec, Duration::from_secs(60)))
            .await
            .unwrap();
    assert_eq!(code, Some(1), "the twin must refuse to start: {stderr}");
    assert!(
        stderr.contains("--node-name eu-west-1") && stderr.contains(&eu_replica),
        "the refusal names the setting and the holder: {stderr}"
    );

    // A twin that saw nobody at start (no seeds), then is bridged to the
    // cluster by a node that seeds from both sides.
    twin.seeds = Vec::new();
    let twin = NodeProcess::start_async(twin).await;
    let twin_client = tally_client::Client::connect(&twin.endpoint())
        .await
        .unwrap();
    twin_client.add("dup:name", 100).await.unwrap();
    let eu_client = tally_client::Client::connect(&eu.endpoint()).await.unwrap();
    eu_client.add("dup:name", 1).await.unwrap();
    let mut bridge = NodeSpec::new(&root, "sa-east", "sa-east-1");
    bridge.seeds = vec![twin.spec.gossip, us.spec.gossip];
    let bridge = NodeProcess::start_async(bridge).await;

    let everyone = [eu, us, ap, &twin, &bridge];
    wait_all_read(
        &everyone,
        "dup:name",
        101,
        "both holders of the name are pulled",
    )
    .await;
    let (status, _) = wait_until(Duration::from_secs(20), "us lists both eu-west-1", || {
        let status = status_json(us);
        let live_twins = status["members"]
            .as_array()?
            .iter()
            .filter(|m| m["node_name"] == "eu-west-1" && m["alive"] == true)
            .count();
        (live_twins == 2).then_some(status)
    });
    let problems = status["problems"].as_array().unwrap();
    assert!(
        problems.len() == 1 && problems[0].as_str().unwrap().contains("eu-west-1"),
        "{status}"
    );
    for node in [eu, &twin] {
        let log = node.log_text();
        wait_until(
            Duration::from_secs(20),
            "the name conflict in the log",
            || {
                node.log_text()
                    .contains("another live node uses this node's name")
                    .then_some(())
            },
        );
        assert!(!log.is_empty());
    }
    let endpoint = us.endpoint();
    let (code, stdout, stderr) =
        tokio::task::spawn_blocking(move || common::cli(&endpoint, &["status"]))
            .await
            .unwrap();
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("problem: node name eu-west-1"),
        "tally status shows the conflict: {stdout}"
    );

    // The twin leaves; the first eu-west-1 keeps being pulled.
    let mut twin = twin;
    assert_eq!(twin.stop(), Some(0));
    eu_client.add("dup:name", 1000).await.unwrap();
    wait_all_read(
        &[eu, us, ap, &bridge],
        "dup:name",
        1101,
        "after the twin left",
    )
    .await;
    wait_until(
        Duration::from_secs(20),
        "us converged without problems",
        || {
            let status = status_json(us);
            (status["converged"] == true && status["problems"].as_array()?.is_empty()).then_some(())
        },
    );
}

/// Issue #10, item 16: garbage on the gossip port and gossip from a node of
/// another cluster give one warning each (then one summary a minute), not
/// one per datagram, on both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_from_strangers_is_warned_about_once() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let root = tempfile::tempdir().unwrap();
    let spec = NodeSpec::new(root.path(), "eu", "eu-1");
    let node = NodeProcess::start_async(spec).await;
    let garbage = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..300u32 {
        garbage
            .send_to(format!("garbage {i}").as_bytes(), node.spec.gossip)
            .unwrap();
    }
    let mut foreign = NodeSpec::new(root.path(), "us", "us-1");
    foreign.cluster_id = "another-cluster".into();
    foreign.seeds = vec![node.spec.gossip];
    let foreign = NodeProcess::start_async(foreign).await;
    let count = |log: &str, text: &str| log.lines().filter(|line| line.contains(text)).count();
    // The foreign node gossips ten times a second: wait for plenty of it.
    wait_until(
        Duration::from_secs(30),
        "gossip refused on both sides",
        || {
            let ours = node.log_text();
            let theirs = foreign.log_text();
            (count(&ours, "different cluster") > 0 && count(&theirs, "wrong cluster") > 0)
                .then_some(())
        },
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (ours, theirs) = (node.log_text(), foreign.log_text());
    assert_eq!(count(&ours, "invalid-chitchat-payload"), 1, "{ours}");
    assert_eq!(count(&ours, "different cluster"), 1, "{ours}");
    assert_eq!(count(&theirs, "wrong cluster"), 1, "{theirs}");
    assert!(
        ours.lines().filter(|line| line.contains("WARN")).count() < 10,
        "{ours}"
    );
}

/// A `Pull` with a scope (issue 11: a node that keeps some partitions only)
/// gets only the counters of those partitions and says which it served; a
/// malformed scope is refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_pull_gets_only_its_partitions_and_says_which() {
    use tally_node::partition::{Partition, PartitionCount, PartitionSet};
    let _serial = ONE_AT_A_TIME.lock().await;
    let root = tempfile::tempdir().unwrap();
    let spec = common::partitioned_spec(root.path(), "eu", "eu-1", 16, 1);
    let node = NodeProcess::start_async(spec).await;
    let count = PartitionCount::new(16).unwrap();
    let client = common::load::quick_client(&node.endpoint()).await;
    let keys: Vec<String> = (0..64).map(|i| format!("k-{i}")).collect();
    for key in &keys {
        client.add(key, 1).await.unwrap();
    }
    let mut scope = PartitionSet::empty(count);
    scope.extend([Partition(3), Partition(11)]);
    let pull = |scope: Option<tally_proto::v1::PartitionSet>| tally_proto::v1::PullRequest {
        cluster_id: "test-cluster".into(),
        caller_replica: 77,
        max_bytes: 1 << 20,
        protocol_version: tally_node::replica::version::NEWEST,
        protocol_oldest: tally_node::replica::version::OLDEST,
        scope,
        ..Default::default()
    };
    let mut replication = ReplicationClient::connect(node.endpoint()).await.unwrap();
    let mut stream = replication
        .pull(pull(Some(tally_proto::v1::PartitionSet {
            partitions: 16,
            hex: scope.to_hex(),
        })))
        .await
        .unwrap()
        .into_inner();
    let (mut pulled, mut served) = (Vec::new(), Vec::new());
    while let Some(chunk) = stream.message().await.unwrap() {
        pulled.extend(
            chunk
                .counters
                .iter()
                .map(|c| String::from_utf8(c.key.to_vec()).unwrap()),
        );
        served.push(
            chunk
                .served
                .expect("a scoped pull's chunks say what they served"),
        );
    }
    let mut expected: Vec<String> = keys
        .iter()
        .filter(|key| scope.contains(count.of_key(key.as_bytes())))
        .cloned()
        .collect();
    expected.sort();
    pulled.sort();
    assert!(!expected.is_empty() && expected.len() < keys.len());
    assert_eq!(pulled, expected);
    for set in served {
        assert_eq!(
            (set.partitions, set.hex.as_str()),
            (16, scope.to_hex().as_str())
        );
    }

    let refused = replication
        .pull(pull(Some(tally_proto::v1::PartitionSet {
            partitions: 16,
            hex: "not hex".into(),
        })))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("bad pull scope"), "{refused:?}");
    let other_count = replication
        .pull(pull(Some(tally_proto::v1::PartitionSet {
            partitions: 32,
            hex: "01".into(),
        })))
        .await
        .unwrap_err();
    assert_eq!(other_count.code(), tonic::Code::FailedPrecondition);
    assert!(other_count.message().contains("32"), "{other_count:?}");
}
