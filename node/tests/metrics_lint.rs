//! `/metrics` of real nodes passes `promtool check metrics` (issue #10 item
//! 15): help text on every family, counters named `_total` where their help
//! and type are, base units (`tally_sync_age_seconds`, not milliseconds).
//!
//! promtool comes from Debian's `prometheus` package; `.ci/run` installs it
//! and sets `TALLY_REQUIRE_PROMTOOL=1`, so in CI its absence is a failure.
//! Elsewhere, without promtool, the test still checks in Rust that every
//! sample belongs to a family with `# HELP` and `# TYPE`, and says it skipped
//! promtool.

mod common;

use std::collections::HashSet;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{cli, http_get, wait_until, Cluster};

/// Every sample's family has a `# HELP` and a `# TYPE` line before it.
fn families_without_help(text: &str) -> Vec<String> {
    let mut helped = HashSet::new();
    let mut typed = HashSet::new();
    let mut missing = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            helped.insert(rest.split(' ').next().unwrap_or_default().to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            typed.insert(rest.split(' ').next().unwrap_or_default().to_string());
        } else if !line.starts_with('#') && !line.is_empty() {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    name.strip_suffix(suffix)
                        .filter(|base| helped.contains(*base))
                })
                .unwrap_or(name);
            if !(helped.contains(family) && typed.contains(family)) {
                missing.push(name.to_string());
            }
        }
    }
    missing
}

fn promtool_check(text: &str) -> Option<(bool, String)> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Some((output.status.success(), said))
}

#[test]
fn promtool_accepts_the_metrics_of_a_replicating_node() {
    let cluster = Cluster::start(&[("eu", 1), ("us", 1)], "sync");
    let endpoints = cluster.endpoints();
    for endpoint in &endpoints {
        let (code, _, stderr) = cli(endpoint, &["add", "lint:key", "2"]);
        assert_eq!(code, 0, "{stderr}");
    }
    let http = cluster.nodes[0].spec.http;
    // Every family that replication fills in, so none is linted empty.
    let wanted = [
        "tally_adds_total",
        "tally_sync_rounds_total",
        "tally_sync_received_counters_total",
        "tally_sync_sent_counters_total",
        "tally_sync_age_seconds{",
        "tally_sync_lag_seq{",
        "tally_commits_total",
        "tally_merge_changes_total",
        "tally_idempotency_records 1",
        "tally_idempotency_capacity ",
    ];
    let (text, _) = wait_until(Duration::from_secs(20), "replication metrics", || {
        let (_, text) = http_get(http, "/metrics").ok()?;
        wanted
            .iter()
            .all(|name| text.contains(name))
            .then_some(text)
    });
    assert!(
        !text.contains("milliseconds"),
        "a metric in milliseconds: {text}"
    );
    let missing = families_without_help(&text);
    assert!(
        missing.is_empty(),
        "samples without help or type: {missing:?}"
    );

    match promtool_check(&text) {
        Some((ok, said)) => assert!(ok, "promtool check metrics failed:\n{said}\n{text}"),
        None => {
            assert!(
                std::env::var_os("TALLY_REQUIRE_PROMTOOL").is_none(),
                "promtool is required here (TALLY_REQUIRE_PROMTOOL) but not on PATH: apt-get install prometheus"
            );
            eprintln!("promtool not on PATH: checked help and type only (apt-get install prometheus for the full lint)");
        }
    }
}
