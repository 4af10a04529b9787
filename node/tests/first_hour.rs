//! The README's first hour, replayed as far as a machine can: the dev
//! cluster started the README's way (`tally-node dev`, on free ports
//! instead of 7100), its banner read for the addresses, an add in the first
//! region and a `get --breakdown` in the last that sees it, then (with
//! headless Chromium, through `node/tests/python/first_hour.py`) a like
//! toggled on the demo page the banner names, confirmed by `tally liked` in
//! another region, and the status page's charts drawn.
//!
//! The screenshots of the demo and status pages are kept as CI artifacts:
//! `ci-artifacts/demo.png` and `ci-artifacts/status.png` in the target
//! directory (`target/ci-artifacts/` by default); `.ci/run` prints where.
//!
//! Without the browser or Selenium the browser half prints a loud SKIPPED
//! line (the command-line half still runs), unless `TALLY_REQUIRE_BROWSER=1`.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::python::{browser_missing, can_run, python, run_script};
use common::{cli, node_binary, wait_cluster_version, wait_until};

const LIMIT: Duration = Duration::from_secs(30);

/// The dev cluster's process, stopped with SIGTERM when dropped.
struct DevCluster(Child);

impl Drop for DevCluster {
    fn drop(&mut self) {
        common::send_signal(self.0.id(), "-TERM");
        let _ = self.0.wait();
    }
}

/// Where the screenshots go: `ci-artifacts/` in the target directory.
fn artifact_dir() -> PathBuf {
    let target = node_binary()
        .parent()
        .and_then(|profile| profile.parent())
        .expect("the node binary is in TARGET/PROFILE/")
        .to_path_buf();
    target.join("ci-artifacts")
}

/// The URL a banner line labelled `label` ends with, for each node in order.
fn urls(banner: &[String], label: &str) -> Vec<String> {
    banner
        .iter()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix(label)?;
            rest.split_whitespace().last().map(str::to_string)
        })
        .collect()
}

#[test]
fn the_readmes_quick_start_works_and_leaves_screenshots() {
    // No screenshot of an earlier run may pass for this one's.
    let artifacts = artifact_dir();
    for old in ["demo.png", "status.png"] {
        let _ = std::fs::remove_file(artifacts.join(old));
    }
    let root = tempfile::tempdir().unwrap();
    let base = common::free_port_block(30);
    // The README: `cargo run --release -p tally-node -- dev`.
    let mut child = Command::new(node_binary())
        .args(["dev", "--base-port", &base.to_string()])
        .arg("--dir")
        .arg(root.path().join("tally-dev"))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(root.path().join("dev.log")).unwrap())
        .spawn()
        .expect("starting tally-node dev");
    let stdout = child.stdout.take().unwrap();
    let _cluster = DevCluster(child);
    let banner: Vec<String> = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .take_while(|line| !line.starts_with("Ctrl-C"))
        .collect();
    let grpc = urls(&banner, "grpc ");
    let demo = urls(&banner, "demo ");
    let status = urls(&banner, "status ");
    assert_eq!(
        (grpc.len(), demo.len(), status.len()),
        (3, 3, 3),
        "{banner:#?}"
    );

    // "add in one region and read in another"
    let (code, out, err) = cli(&grpc[0], &["add", "post:1:views"]);
    assert_eq!((code, out.trim()), (0, "1"), "{err}");
    wait_until(LIMIT, "the add in the last region", || {
        let (code, out, _) = cli(&grpc[2], &["get", "post:1:views", "--breakdown"]);
        (code == 0 && out.lines().next() == Some("1")).then_some(())
    });
    // The README's first like is on the like set the demo page shows.
    let key = demo[0].rsplit("/demo/").next().unwrap().to_string();
    assert_eq!(key, "post:1", "the banner's demo page: {banner:#?}");

    let python = python("TALLY_HTTP_PYTHON");
    if !can_run(
        "the_readmes_quick_start_works_and_leaves_screenshots (its browser half)",
        browser_missing(&python),
        "TALLY_REQUIRE_BROWSER",
    ) {
        return;
    }
    // Likes need the cluster version a dev cluster reaches once its nodes met.
    wait_cluster_version(&grpc, 3, LIMIT);
    // "tally like post:1 sam": sam's heart on the demo page is filled.
    let (code, out, err) = cli(&grpc[0], &["like", &key, "sam"]);
    assert_eq!(code, 0, "{out}{err}");
    std::fs::create_dir_all(&artifacts).unwrap();
    run_script(
        &python,
        "first_hour.py",
        &[
            format!("{}#person=sam", demo[0]),
            status[0].clone(),
            artifacts.display().to_string(),
        ],
    );
    // The like the page left (sam's, made again) is in every region.
    wait_until(LIMIT, "sam's like in the last region", || {
        let (code, out, _) = cli(&grpc[2], &["liked", &key, "sam"]);
        (code == 0 && out.trim() == "liked").then_some(())
    });
    for screenshot in ["demo.png", "status.png"] {
        let png = std::fs::read(artifacts.join(screenshot)).expect("the screenshot");
        assert!(png.starts_with(b"\x89PNG"), "{screenshot} is not a PNG");
    }
    println!("screenshots in {}", artifacts.display());
}
