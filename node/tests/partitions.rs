//! Partitioned regions (issue 11), layer 2, with real processes: a data
//! directory keeps the partition count `P` and the cluster id it was created
//! with (another `--partitions` or `--cluster-id` is refused at start, naming
//! both values, and changes nothing), and a peer that announces another `P`
//! is refused like a foreign cluster: no state flows from it, and `tally
//! status` names it as a problem.

mod common;

use std::time::Duration;

use common::{cli, run_bounded, wait_until, NodeProcess, NodeSpec};

fn value(endpoint: &str, key: &str) -> Option<i64> {
    let (code, stdout, _) = cli(endpoint, &["get", key]);
    (code == 0).then(|| stdout.trim().parse().ok()).flatten()
}

fn status_json(endpoint: &str) -> serde_json::Value {
    let (code, stdout, stderr) = cli(endpoint, &["--json", "status"]);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

#[test]
fn a_data_directory_keeps_its_partition_count_and_cluster() {
    let root = tempfile::tempdir().unwrap();
    let mut spec = NodeSpec::new(root.path(), "eu", "eu-1");
    spec.extra = vec!["--partitions".into(), "64".into()];
    let mut node = NodeProcess::start(spec.clone());
    assert_eq!(status_json(&node.endpoint())["partitions"], 64);
    let (_, text, _) = cli(&node.endpoint(), &["status"]);
    assert!(
        text.starts_with("cluster: test-cluster, 64 partitions"),
        "{text}"
    );
    // A single node owns every partition: the default RF 3 is 1 in effect.
    let map = &status_json(&node.endpoint())["partition_map"];
    assert_eq!(
        (
            &map["replication_factor"],
            &map["effective_replication"],
            &map["nodes"][0]["partitions_owned"],
            &map["nodes"][0]["state"],
        ),
        (&3.into(), &1.into(), &64.into(), &"active".into()),
        "{map}"
    );
    node.stop();
    let cluster_file = std::fs::read_to_string(spec.data_dir.join("CLUSTER")).unwrap();

    let mut other_count = spec.clone();
    other_count.extra = vec!["--partitions".into(), "128".into()];
    let (code, stderr) = run_bounded(&other_count, Duration::from_secs(30));
    assert_ne!(code, Some(0), "{stderr}");
    assert!(
        code.is_some(),
        "a node with another --partitions started: {stderr}"
    );
    assert!(
        stderr.contains("was created with --partitions 64")
            && stderr.contains("started with --partitions 128")
            && stderr.contains("start it with --partitions 64"),
        "{stderr}"
    );

    let mut other_cluster = spec.clone();
    other_cluster.cluster_id = "someone-else".into();
    let (code, stderr) = run_bounded(&other_cluster, Duration::from_secs(30));
    assert!(code.is_some_and(|code| code != 0), "{stderr}");
    assert!(
        stderr.contains("belongs to cluster \"test-cluster\"")
            && stderr.contains("--cluster-id \"someone-else\""),
        "{stderr}"
    );

    let mut zero = spec.clone();
    zero.extra = vec!["--partitions".into(), "0".into()];
    let (code, stderr) = run_bounded(&zero, Duration::from_secs(30));
    assert!(code.is_some_and(|code| code != 0), "{stderr}");
    assert!(
        stderr.contains("--partitions") && stderr.contains("between 1 and 65536"),
        "{stderr}"
    );

    // Refusals changed nothing; without --partitions the stored count is used.
    assert_eq!(
        std::fs::read_to_string(spec.data_dir.join("CLUSTER")).unwrap(),
        cluster_file
    );
    node.spec.extra.clear();
    node.restart();
    assert_eq!(status_json(&node.endpoint())["partitions"], 64);
}

#[test]
fn a_peer_with_another_partition_count_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let mut eu = NodeSpec::new(root.path(), "eu", "eu-1");
    eu.extra = vec!["--partitions".into(), "64".into()];
    let eu = NodeProcess::start(eu);
    let mut same = NodeSpec::new(root.path(), "us", "us-1");
    same.extra = vec!["--partitions".into(), "64".into()];
    same.seeds = vec![eu.spec.gossip];
    let same = NodeProcess::start(same);
    let mut other = NodeSpec::new(root.path(), "ap", "ap-1");
    other.extra = vec!["--partitions".into(), "128".into()];
    other.seeds = vec![eu.spec.gossip];
    let other = NodeProcess::start(other);

    let (eu_endpoint, same_endpoint, other_endpoint) =
        (eu.endpoint(), same.endpoint(), other.endpoint());
    assert_eq!(cli(&other_endpoint, &["add", "k", "10"]).0, 0);
    assert_eq!(cli(&same_endpoint, &["add", "k", "1"]).0, 0);
    // eu sees ap-1 as a refused member announcing 128 partitions.
    wait_until(Duration::from_secs(30), "eu refusing ap-1", || {
        let status = status_json(&eu_endpoint);
        status["members"]
            .as_array()?
            .iter()
            .any(|m| m["node_name"] == "ap-1" && m["refused"] == true && m["partitions"] == 128)
            .then_some(())
    });
    // The agreeing peer's add arrives; then a second one, so that several
    // sync rounds have passed since ap-1 was listed.
    wait_until(Duration::from_secs(30), "us-1's add on eu", || {
        (value(&eu_endpoint, "k") == Some(1)).then_some(())
    });
    assert_eq!(cli(&same_endpoint, &["add", "k", "1"]).0, 0);
    wait_until(Duration::from_secs(30), "us-1's second add on eu", || {
        (value(&eu_endpoint, "k")? >= 2).then_some(())
    });
    assert_eq!(
        value(&eu_endpoint, "k"),
        Some(2),
        "ap-1's adds must not flow to eu"
    );
    assert_eq!(
        value(&other_endpoint, "k"),
        Some(10),
        "nothing flows to ap-1"
    );
    let (_, text, _) = cli(&eu_endpoint, &["status"]);
    assert!(
        text.contains("problem: ap-1 (ap")
            && text.contains("announces 128 partitions, this node 64"),
        "{text}"
    );
    wait_until(
        Duration::from_secs(30),
        "eu's log naming the refusal",
        || {
            eu.log_text()
                .contains("refusing a peer that announces another partition count")
                .then_some(())
        },
    );
}
