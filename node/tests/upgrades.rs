//! Upgrades with real processes, at a version window of one version
//! (`12..=12`: every build older than 12 is behind it).
//!
//! - A data directory at a cluster version older than the window (the
//!   checked-in fixture `fixtures/data-dir-at-cluster-version-11`: the
//!   cluster version lives in the `TALLY_DATA_DIR` marker beside sled, which
//!   a build reads before it opens anything else, so the marker is the
//!   whole fixture) is refused by `tally-node` with a message naming the
//!   setting and the release to upgrade through, and is left unchanged.
//! - A directory that a newer build finalized (its marker names a version
//!   past this build's) is refused without being called corrupt: a rollback
//!   past a finalized upgrade.
//! - A new cluster is at the newest version from its first start, says so
//!   in `tally status` and in its log alike, records the version its
//!   directories were born at, and has nothing to finalize.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cli, cluster_version, status_of as status, wait_until, NodeProcess, NodeSpec};
use tally_node::replica::version::{NEWEST, OLDEST, UPGRADE_THROUGH};

fn marker(data_dir: &Path) -> String {
    std::fs::read_to_string(data_dir.join("TALLY_DATA_DIR")).unwrap_or_default()
}

/// Every file under `dir` with its bytes, by path relative to `dir`.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                files.insert(path.strip_prefix(dir).unwrap().to_path_buf(), bytes);
            }
        }
    }
    files
}

/// A copy of the checked-in fixture `name` under `root` (the fixture
/// itself is never handed to a node).
fn fixture_copy(name: &str, root: &Path) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let copy = root.join(name);
    for (path, bytes) in tree(&fixture) {
        let to = copy.join(path);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, bytes).unwrap();
    }
    copy
}

fn add(node: &NodeProcess, key: &str, delta: &str) {
    let (code, _, stderr) = cli(&node.endpoint(), &["add", key, delta]);
    assert_eq!(code, 0, "add on {}: {stderr}", node.spec.node_name);
}

fn value(node: &NodeProcess, key: &str) -> Option<i64> {
    let (code, stdout, _) = cli(&node.endpoint(), &["get", key]);
    (code == 0).then(|| stdout.trim().parse().ok())?
}

#[test]
fn a_data_directory_older_than_the_window_is_refused_naming_the_release_and_left_unchanged() {
    let root = tempfile::tempdir().unwrap();
    let name = "data-dir-at-cluster-version-11";
    let mut spec = NodeSpec::new(root.path(), "eu", "eu-1");
    spec.data_dir = fixture_copy(name, root.path());
    let before = tree(&spec.data_dir);
    assert!(marker(&spec.data_dir).ends_with(&format!("format {}\n", OLDEST - 1)));

    let output = NodeProcess::spawn_raw(&spec);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "it started:\n{stderr}");
    for words in [
        UPGRADE_THROUGH,
        "--data-dir",
        &spec.data_dir.display().to_string(),
        &format!("cluster version {}", OLDEST - 1),
        "tally admin finalize",
    ] {
        assert!(stderr.contains(words), "{words:?} missing in:\n{stderr}");
    }
    assert!(
        !stderr.contains("corrupt"),
        "an old directory is not damage:\n{stderr}"
    );
    assert_eq!(tree(&spec.data_dir), before, "the directory was changed");
}

#[test]
fn a_directory_finalized_by_a_newer_build_is_refused_without_calling_it_corrupt() {
    let root = tempfile::tempdir().unwrap();
    let mut node = NodeProcess::start(NodeSpec::new(root.path(), "eu", "eu-1"));
    add(&node, "likes", "3");
    node.stop();
    // What a newer build leaves once its upgrade was finalized.
    let newer = NEWEST + 1;
    std::fs::write(
        node.spec.data_dir.join("TALLY_DATA_DIR"),
        format!("tally data directory, format {newer}\n"),
    )
    .unwrap();
    let before = tree(&node.spec.data_dir);
    let log = node
        .try_restart()
        .expect_err("this build opened a directory of a newer format");
    assert!(
        log.contains(&format!("format {newer}")) && log.contains(&format!("up to {NEWEST}")),
        "the refusal names both versions:\n{log}"
    );
    assert!(!log.contains("corrupt"), "an upgrade is not damage:\n{log}");
    assert_eq!(
        tree(&node.spec.data_dir),
        before,
        "the directory was changed"
    );
}

#[test]
fn a_new_cluster_is_at_the_newest_version_from_the_start_with_nothing_to_finalize() {
    let root = tempfile::tempdir().unwrap();
    let eu = NodeProcess::start(NodeSpec::new(root.path(), "eu", "eu-1"));
    let mut us_spec = NodeSpec::new(root.path(), "us", "us-1");
    us_spec.seeds = vec![eu.spec.gossip];
    let us = NodeProcess::start(us_spec);
    for node in [&eu, &us] {
        assert_eq!(cluster_version(node), Some(u64::from(NEWEST)));
        assert!(
            marker(&node.spec.data_dir).ends_with(&format!("format {NEWEST}\n")),
            "{}",
            marker(&node.spec.data_dir)
        );
        assert_eq!(status(node).unwrap()["node"]["born_at"], NEWEST);
    }
    wait_until(Duration::from_secs(20), "eu to see us-1", || {
        let members = status(&eu)?["members"].as_array()?.clone();
        let us = members.iter().find(|m| m["node_name"] == "us-1")?.clone();
        (us["protocol_version"] == NEWEST && us["refused"] == false && us["born_at"] == NEWEST)
            .then_some(())
    });
    add(&eu, "likes", "2");
    add(&us, "likes", "3");
    for node in [&eu, &us] {
        wait_until(Duration::from_secs(30), "both to read 5", || {
            (value(node, "likes") == Some(5)).then_some(())
        });
    }
    let (code, stdout, stderr) = cli(&eu.endpoint(), &["admin", "finalize"]);
    assert_eq!(code, 0, "finalize: {stderr}");
    assert!(stdout.contains("already finalized"), "{stdout}");

    // `tally status` and the log name the window the same way.
    let window = format!("{OLDEST}..={NEWEST}");
    let (code, stdout, stderr) = cli(&eu.endpoint(), &["status"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(&format!(
            "cluster version: {NEWEST} (this node speaks protocol versions {window})"
        )),
        "{stdout}"
    );
    let log = eu.log_text();
    let last = log.lines().rev().find_map(|line| {
        line.split_whitespace()
            .find_map(|word| word.strip_prefix("protocol="))
    });
    assert_eq!(last, Some(window.as_str()), "{log}");
}
