//! Rolling upgrades with real processes: a cluster with a node that poses as
//! an older build (`--test-announce-protocol-version 1`) keeps replicating
//! and stays at cluster version 1; once that node runs the current version
//! the cluster version moves to the newest (persisted in each data directory's
//! marker); then the old version is refused, both as a binary opening the
//! upgraded data directory and as a peer. That test runs in
//! `--cluster-version-upgrade auto`; the manual mode (the default) is tested
//! below: a cluster upgraded in place (every node on the current build, its
//! directories created by an older one) stays at version 1 (a rollback still
//! starts) until `tally admin finalize`, which is refused while an old member
//! is present and, once accepted, moves every node. A new cluster, whose
//! every directory this build created, moves to the newest by itself; one
//! older directory among them holds it back.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{cli, cluster_version, status_of as status, wait_until, NodeProcess, NodeSpec};

/// The newest version this build speaks (where an upgrade finalizes).
const NEWEST: u32 = tally_node::replica::version::NEWEST;
const POSE_AS_VERSION_1: [&str; 2] = ["--test-announce-protocol-version", "1"];
const AUTO: [&str; 2] = ["--cluster-version-upgrade", "auto"];

/// The member named `name` in `node`'s status.
fn member(node: &NodeProcess, name: &str) -> Option<serde_json::Value> {
    status(node)?["members"]
        .as_array()?
        .iter()
        .find(|m| m["node_name"] == name)
        .cloned()
}

fn marker(data_dir: &Path) -> String {
    std::fs::read_to_string(data_dir.join("TALLY_DATA_DIR")).unwrap_or_default()
}

fn add(node: &NodeProcess, key: &str, delta: &str) {
    let (code, _, stderr) = cli(&node.endpoint(), &["add", key, delta]);
    assert_eq!(code, 0, "add on {}: {stderr}", node.spec.node_name);
}

fn value(node: &NodeProcess, key: &str) -> Option<i64> {
    let (code, stdout, _) = cli(&node.endpoint(), &["get", key]);
    (code == 0).then(|| stdout.trim().parse().ok())?
}

#[track_caller]
fn wait_for_value(node: &NodeProcess, key: &str, expected: i64) {
    let what = format!("{} to read {key} = {expected}", node.spec.node_name);
    wait_until(Duration::from_secs(30), &what, || {
        (value(node, key) == Some(expected)).then_some(())
    });
}

#[test]
fn a_mixed_version_cluster_works_at_the_old_version_then_finalizes_and_refuses_the_old_one() {
    let root = tempfile::tempdir().unwrap();
    let mut eu_spec = NodeSpec::new(root.path(), "eu", "eu-1");
    eu_spec.extra = AUTO.map(String::from).to_vec();
    let eu = NodeProcess::start(eu_spec);
    let mut old_spec = NodeSpec::new(root.path(), "us", "us-1");
    old_spec.seeds = vec![eu.spec.gossip];
    old_spec.extra = [POSE_AS_VERSION_1, AUTO]
        .concat()
        .into_iter()
        .map(String::from)
        .collect();
    let mut us = NodeProcess::start(old_spec);

    // Half upgraded: both replicate, and the version stays at the old one.
    add(&eu, "likes", "5");
    add(&us, "likes", "7");
    wait_for_value(&eu, "likes", 12);
    wait_for_value(&us, "likes", 12);
    wait_until(Duration::from_secs(10), "eu to see us-1 as 1..1", || {
        let us = member(&eu, "us-1")?;
        (us["protocol_version"] == 1 && us["refused"] == false).then_some(())
    });
    // Well past the settle time (2 s), eu still writes format 1.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(4) {
        assert_eq!(
            cluster_version(&eu),
            Some(1),
            "eu moved with us-1 at version 1"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(marker(&eu.spec.data_dir).ends_with("format 1\n"));
    assert!(marker(&us.spec.data_dir).ends_with("format 1\n"));

    // us-1 is upgraded (runs the current version on the same data): the
    // cluster version moves to the newest on both, persisted in both directories.
    us.stop();
    us.spec.extra = AUTO.map(String::from).to_vec();
    us.restart();
    for node in [&eu, &us] {
        let what = format!("{} at cluster version {NEWEST}", node.spec.node_name);
        wait_until(Duration::from_secs(30), &what, || {
            (cluster_version(node) == Some(u64::from(NEWEST))).then_some(())
        });
        assert!(marker(&node.spec.data_dir).ends_with(&format!("format {NEWEST}\n")));
    }
    add(&us, "likes", "1");
    wait_for_value(&eu, "likes", 13);
    assert!(eu.log_text().contains("cluster version moved"));

    // A rollback now is refused by the binary itself, naming both versions.
    us.stop();
    us.spec.extra = POSE_AS_VERSION_1.map(String::from).to_vec();
    let log = us
        .try_restart()
        .expect_err("a version-1 build opened a directory of the newest format");
    assert!(
        log.contains(&format!("format {NEWEST}")) && log.contains("up to 1"),
        "the refusal names both versions:\n{log}"
    );
    assert!(!log.contains("corrupt"), "an upgrade is not damage:\n{log}");
    assert!(marker(&us.spec.data_dir).ends_with(&format!("format {NEWEST}\n")));

    // A new node of the old version joins: it shares no version with eu, so
    // eu refuses it (and says so in its status and its log), and nothing of
    // it is merged.
    let mut late_spec = NodeSpec::new(root.path(), "ap", "ap-1");
    late_spec.seeds = vec![eu.spec.gossip];
    late_spec.extra = POSE_AS_VERSION_1.map(String::from).to_vec();
    let late = NodeProcess::start(late_spec);
    wait_until(Duration::from_secs(20), "eu to refuse ap-1", || {
        let ap = member(&eu, "ap-1")?;
        (ap["refused"] == true && ap["protocol_version"] == 1).then_some(())
    });
    wait_until(Duration::from_secs(10), "eu to log the refusal", || {
        eu.log_text().contains("refusing a peer").then_some(())
    });
    let (code, stdout, stderr) = cli(&eu.endpoint(), &["status"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(&format!("cluster version: {NEWEST}")),
        "{stdout}"
    );
    assert!(
        stdout.contains("problem: ap-1 (ap")
            && stdout.contains(&format!("versions 1..=1, this node {NEWEST}..={NEWEST}")),
        "tally status names the refused peer:\n{stdout}"
    );
    add(&late, "likes", "100");
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(2) {
        assert_eq!(
            value(&eu, "likes"),
            Some(13),
            "eu merged state from a refused peer"
        );
        assert_eq!(
            value(&late, "likes"),
            Some(100),
            "ap-1 merged from a refused peer"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn in_manual_mode_the_version_waits_for_finalize_which_refuses_while_an_old_member_is_present() {
    let root = tempfile::tempdir().unwrap();
    let eu = NodeProcess::start_on_old_directory(NodeSpec::new(root.path(), "eu", "eu-1"));
    let mut us_spec = NodeSpec::new(root.path(), "us", "us-1");
    us_spec.seeds = vec![eu.spec.gossip];
    let mut us = NodeProcess::start_on_old_directory(us_spec);

    // Every node runs the current build, and still nothing moves.
    add(&eu, "likes", "5");
    add(&us, "likes", "7");
    wait_for_value(&eu, "likes", 12);
    wait_for_value(&us, "likes", 12);
    wait_until(Duration::from_secs(10), "eu to see us-1 as 1..2", || {
        let us = member(&eu, "us-1")?;
        (us["protocol_version"] == NEWEST).then_some(())
    });
    stays_at_version_1(&[&eu, &us], Duration::from_secs(4));
    assert!(marker(&eu.spec.data_dir).ends_with("format 1\n"));
    assert!(marker(&us.spec.data_dir).ends_with("format 1\n"));

    // A rollback is still possible: us-1 restarts as a version-1 build.
    us.stop();
    us.spec.extra = POSE_AS_VERSION_1.map(String::from).to_vec();
    us.restart();
    wait_until(Duration::from_secs(20), "eu to see us-1 as 1..1", || {
        let us = member(&eu, "us-1")?;
        (us["protocol_version"] == 1).then_some(())
    });
    add(&us, "likes", "1");
    wait_for_value(&eu, "likes", 13);

    // Finalize with the old member present is refused, naming it.
    let (code, stdout, stderr) = cli(&eu.endpoint(), &["admin", "finalize"]);
    assert_ne!(code, 0, "finalize passed with us-1 at version 1:\n{stdout}");
    assert!(
        stderr.contains("us-1") && stderr.contains("do not speak it yet"),
        "the refusal names the old member:\n{stderr}"
    );
    assert_eq!(cluster_version(&eu), Some(1));
    assert!(marker(&eu.spec.data_dir).ends_with("format 1\n"));

    // us-1 upgraded again; finalize on eu moves eu, and us-1 follows.
    us.stop();
    us.spec.extra.clear();
    us.restart();
    wait_until(
        Duration::from_secs(20),
        "eu to see us-1 at the newest version again",
        || {
            let us = member(&eu, "us-1")?;
            (us["protocol_version"] == NEWEST).then_some(())
        },
    );
    let (code, stdout, stderr) = cli(&eu.endpoint(), &["admin", "finalize"]);
    assert_eq!(code, 0, "finalize: {stderr}");
    assert!(
        stdout.contains(&format!("cluster version: 1 -> {NEWEST}")),
        "{stdout}"
    );
    for node in [&eu, &us] {
        let what = format!("{} at cluster version {NEWEST}", node.spec.node_name);
        wait_until(Duration::from_secs(30), &what, || {
            (cluster_version(node) == Some(u64::from(NEWEST))).then_some(())
        });
        assert!(marker(&node.spec.data_dir).ends_with(&format!("format {NEWEST}\n")));
    }
    add(&us, "likes", "1");
    wait_for_value(&eu, "likes", 14);
    // Again: nothing to do.
    let (code, stdout, stderr) = cli(&eu.endpoint(), &["admin", "finalize"]);
    assert_eq!(code, 0, "finalize again: {stderr}");
    assert!(stdout.contains("already finalized"), "{stdout}");
}

/// Watches `nodes` for `period` and fails if any leaves cluster version 1.
#[track_caller]
fn stays_at_version_1(nodes: &[&NodeProcess], period: Duration) {
    let watched = Instant::now();
    while watched.elapsed() < period {
        for node in nodes {
            assert_eq!(
                cluster_version(node),
                Some(1),
                "{} moved without finalize",
                node.spec.node_name
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_new_cluster_moves_to_the_newest_version_by_itself_unless_a_directory_is_older() {
    let root = tempfile::tempdir().unwrap();
    // One new directory beside one made by an older build: nothing moves,
    // for a rollback of the older one must still start.
    let old = NodeProcess::start_on_old_directory(NodeSpec::new(root.path(), "eu", "eu-old"));
    let mut new_spec = NodeSpec::new(root.path(), "us", "us-new");
    new_spec.seeds = vec![old.spec.gossip];
    let new = NodeProcess::start(new_spec);
    wait_until(Duration::from_secs(10), "us-new to see eu-old", || {
        let seen = member(&new, "eu-old")?;
        (seen["protocol_version"] == NEWEST).then_some(seen)
    });
    assert_eq!(member(&new, "eu-old").unwrap()["born_at"], 1);
    assert_eq!(member(&old, "us-new").unwrap()["born_at"], NEWEST);
    stays_at_version_1(&[&old, &new], Duration::from_secs(4));
    drop((old, new));

    // Every directory new (manual mode, the default, no finalize): both
    // move to the newest and write it in their markers.
    let eu = NodeProcess::start(NodeSpec::new(root.path(), "eu", "eu-1"));
    let mut us_spec = NodeSpec::new(root.path(), "us", "us-1");
    us_spec.seeds = vec![eu.spec.gossip];
    let us = NodeProcess::start(us_spec);
    for node in [&eu, &us] {
        let what = format!("{} at cluster version {NEWEST}", node.spec.node_name);
        wait_until(Duration::from_secs(30), &what, || {
            (cluster_version(node) == Some(u64::from(NEWEST))).then_some(())
        });
        assert!(
            marker(&node.spec.data_dir).ends_with(&format!("format {NEWEST}\n")),
            "{}",
            marker(&node.spec.data_dir)
        );
    }
    assert_eq!(status(&eu).unwrap()["node"]["born_at"], NEWEST);
    add(&eu, "likes", "2");
    add(&us, "likes", "3");
    wait_for_value(&eu, "likes", 5);
    wait_for_value(&us, "likes", 5);
    let (code, stdout, stderr) = cli(&eu.endpoint(), &["admin", "finalize"]);
    assert_eq!(code, 0, "finalize: {stderr}");
    assert!(stdout.contains("already finalized"), "{stdout}");
}

/// `tally status` and the node's log name the protocol window the same way,
/// and the log's last word on it is what status shows: a fresh node starts
/// at `1..=N` and moves its cluster version to N by itself, and the move is
/// logged with the new window (status used to say `N..N` while the last
/// window in the log was `1..=N`).
#[test]
fn status_and_the_log_agree_on_the_protocol_window() {
    let root = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(NodeSpec::new(root.path(), "eu", "eu-1"));
    let window = format!("{NEWEST}..={NEWEST}");
    wait_until(
        Duration::from_secs(30),
        "the cluster version to move",
        || (cluster_version(&node) == Some(u64::from(NEWEST))).then_some(()),
    );
    let (code, stdout, stderr) = cli(&node.endpoint(), &["status"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(&format!("(this node speaks protocol versions {window})")),
        "{stdout}"
    );
    let ((last, log), _) = wait_until(Duration::from_secs(10), "the move in the log", || {
        let log = node.log_text();
        let last = log
            .lines()
            .rev()
            .find_map(|line| {
                line.split_whitespace()
                    .find_map(|word| word.strip_prefix("protocol="))
            })
            .map(str::to_owned)?;
        (last == window).then_some((last, log))
    });
    assert_eq!(last, window, "{log}");
}
