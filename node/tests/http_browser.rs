//! The like button in a real browser (issue 16): headless Chromium (Debian's
//! `chromium` and `chromium-driver`, driven by Selenium from PyPI) opens the
//! node's `/demo/{key}` page on a two-region cluster and, through
//! `node/tests/python/like_button.py`, sees the compact count (`40.2K`),
//! taps the heart and sees it count, taps three times and sees three, and
//! sees an add made through the other region's node arrive without a
//! reload. The test then checks the totals over the API on both regions.
//!
//! The screenshot is kept when `TALLY_SCREENSHOT_OUT` names a file (that is
//! how `docs/like-button.png` in the README was made).
//!
//! Without the browser or Selenium it prints a loud SKIPPED line and passes,
//! unless `TALLY_REQUIRE_BROWSER=1` (set by `.ci/run`, which installs them),
//! when it fails instead.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::http::Api;
use common::python::{can_run, python, unavailable};
use common::{wait_until, Cluster};

/// Why the browser cannot run here, or `None`.
fn browser_missing(python: &str) -> Option<String> {
    for tool in ["chromium", "chromedriver"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|out| out.status.success());
        if !found {
            return Some(format!(
                "{tool} is not installed (Debian: apt-get install chromium chromium-driver)"
            ));
        }
    }
    unavailable(
        python,
        "import selenium",
        "install it with `python3 -m pip install selenium` (or set TALLY_HTTP_PYTHON)",
    )
}

#[test]
fn the_like_button_counts_taps_and_shows_other_regions_live() {
    let python = python("TALLY_HTTP_PYTHON");
    if !can_run(
        "the_like_button_counts_taps_and_shows_other_regions_live",
        browser_missing(&python),
        "TALLY_REQUIRE_BROWSER",
    ) {
        return;
    }
    let cluster = Cluster::start(&[("eu", 1), ("us", 1)], "sync");
    let eu = Api::new(cluster.nodes[0].spec.http);
    let us = Api::new(cluster.nodes[1].spec.http);
    let key = "post/42";
    let path_key = "post%2F42";
    // 40,199 likes so far: the page shows "40.2K".
    assert_eq!(eu.add(path_key, 40_199, Some("seed")).status, 200);
    let screenshot = cluster.root.path().join("like-button.png");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/like_button.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(format!(
            "http://{}/demo/{path_key}",
            cluster.nodes[0].spec.http
        ))
        .arg(format!("http://{}", cluster.nodes[1].spec.http))
        .arg(key)
        .arg("40199")
        .arg(&screenshot)
        .stdin(Stdio::null())
        .output()
        .expect("running node/tests/python/like_button.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("like_button.py stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        out.status.success(),
        "like_button.py exited with {}:\n{stdout}\n{stderr}",
        out.status
    );
    // Four taps on eu and 1,000 added on us: both regions converge on it.
    let total = 40_199 + 4 + 1_000;
    assert_eq!(eu.value(path_key), total);
    wait_until(Duration::from_secs(20), "us to converge", || {
        (us.value(path_key) == total).then_some(())
    });
    let png = std::fs::read(&screenshot).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    if let Ok(keep) = std::env::var("TALLY_SCREENSHOT_OUT") {
        std::fs::copy(&screenshot, &keep).expect("copying the screenshot");
    }
}
