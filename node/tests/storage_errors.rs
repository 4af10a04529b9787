//! Start-up failures of the environment, not of the store: a permission the
//! node lacks, a data directory that is a file. Real processes.
//!
//! What they check (issue 10, item 2): such a failure stops the node with a
//! message that names the cause and the path; it never calls the store
//! damaged nor suggests `--on-corrupt move-aside`, and `--on-corrupt
//! move-aside` leaves the store where it is, so the data is still there once
//! the cause is fixed.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use common::{NodeProcess, NodeSpec};
use tally_client::ClientConfig;

/// True when this test runs as root (which no file permission stops).
fn running_as_root(scratch: &Path) -> bool {
    let probe = scratch.join("whoami");
    std::fs::write(&probe, b"").unwrap();
    let root = std::fs::metadata(&probe).unwrap().uid() == 0;
    std::fs::remove_file(probe).unwrap();
    root
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Nothing next to `data_dir` was moved aside.
#[track_caller]
fn assert_nothing_moved_aside(data_dir: &Path) {
    let parent = data_dir.parent().unwrap();
    let moved: Vec<String> = std::fs::read_dir(parent)
        .unwrap()
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".damaged-"))
        .collect();
    assert!(moved.is_empty(), "the store was moved aside: {moved:?}");
    assert!(data_dir.join("db").exists(), "the store is gone");
}

/// The advice a refused start must not give for an environment failure.
#[track_caller]
fn assert_not_called_damage(text: &str) {
    assert!(
        !text.contains("move-aside") && !text.contains("corrupt") && !text.contains("damaged"),
        "an environment failure was reported as damage:\n{text}"
    );
    assert!(!text.contains("panicked"), "the node panicked:\n{text}");
}

/// A store written by one user and opened by another is a permission
/// problem: said so, and `--on-corrupt move-aside` does not touch it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_the_node_may_not_open_is_a_permission_error_never_moved_aside() {
    let root = tempfile::tempdir().unwrap();
    // Let another user walk into the temporary directory (it is 0700).
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut node = NodeProcess::start(NodeSpec::new(root.path(), "eu", "owned"));
    let client = ClientConfig::new()
        .with_deadline(Duration::from_secs(10))
        .connect(node.endpoint())
        .await
        .unwrap();
    assert_eq!(client.add("x", 77).await.unwrap().value, 77);
    drop(client);
    assert_eq!(node.stop(), Some(0));

    // As root, run the node as `nobody`; as anyone else, take away the
    // permissions of the store's directory (which binds its owner too).
    let as_root = running_as_root(root.path());
    let db = node.spec.data_dir.join("db");
    let wrapper: &[&str] = if as_root {
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]
    } else {
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o000)).unwrap();
        &[]
    };

    let output = NodeProcess::spawn_raw_via(&node.spec, wrapper);
    let text = stderr(&output);
    assert!(!output.status.success(), "the node started:\n{text}");
    assert!(
        text.contains("permission denied") && text.contains(&*node.spec.data_dir.to_string_lossy()),
        "the cause and the path are not named:\n{text}"
    );
    assert_not_called_damage(&text);
    assert_nothing_moved_aside(&node.spec.data_dir);

    let mut moving = node.spec.clone();
    moving.extra = vec!["--on-corrupt".into(), "move-aside".into()];
    let output = NodeProcess::spawn_raw_via(&moving, wrapper);
    let text = stderr(&output);
    assert!(
        !output.status.success(),
        "--on-corrupt move-aside started the node on a store it may not open:\n{text}"
    );
    assert!(text.contains("permission denied"), "{text}");
    assert_not_called_damage(&text);
    assert_nothing_moved_aside(&node.spec.data_dir);

    // Cause fixed: the same replica, with its data.
    if !as_root {
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    node.restart();
    let client = ClientConfig::new()
        .with_deadline(Duration::from_secs(10))
        .connect(node.endpoint())
        .await
        .unwrap();
    assert_eq!(
        client.get("x").await.unwrap(),
        77,
        "the store lost its data"
    );
    assert_eq!(node.stop(), Some(0));
}

/// `--data-dir` naming a file says "is a file", once.
#[test]
fn a_data_dir_that_is_a_file_is_named_as_a_file() {
    let root = tempfile::tempdir().unwrap();
    let spec = NodeSpec::new(root.path(), "eu", "plain");
    std::fs::write(&spec.data_dir, b"not a directory\n").unwrap();
    let output = NodeProcess::spawn_raw(&spec);
    let text = stderr(&output);
    assert!(!output.status.success(), "the node started:\n{text}");
    assert!(
        text.contains("is a file") && text.contains(&*spec.data_dir.to_string_lossy()),
        "the cause and the path are not named:\n{text}"
    );
    assert!(!text.contains("os error 17"), "{text}");
    assert_not_called_damage(&text);
}
