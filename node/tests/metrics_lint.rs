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

/// The metric names that the Grafana dashboard and the alert rules read.
fn names_the_deploy_files_read() -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut names = std::collections::BTreeSet::new();
    for file in [
        "deploy/grafana/tally-dashboard.json",
        "deploy/prometheus/alerts.yml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        for (start, _) in text.match_indices("tally_") {
            let name: String = text[start..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    names.into_iter().collect()
}

/// Every metric the dashboard and the alerts read has a series on a node
/// that just started (with one peer, so that per-peer series can exist),
/// before any error, refusal or failed sync: a family that appears only at
/// its first event is "no data" on the dashboard until then. Only the hot
/// keys' rates wait for traffic (their label is a key).
#[test]
fn every_metric_the_dashboard_and_alerts_read_exists_from_the_start() {
    let cluster = Cluster::start(&[("eu", 1), ("us", 1)], "sync");
    let http = cluster.nodes[0].spec.http;
    let wanted: Vec<String> = names_the_deploy_files_read()
        .into_iter()
        .filter(|name| name != "tally_hot_key_rate")
        .collect();
    assert!(
        wanted.iter().any(|name| name == "tally_sync_errors_total")
            && wanted
                .iter()
                .any(|name| name == "tally_auth_refusals_total"),
        "{wanted:?}"
    );
    let missing = |text: &str| -> Vec<String> {
        wanted
            .iter()
            .filter(|name| {
                !text.lines().any(|line| {
                    line.strip_prefix(name.as_str())
                        .is_some_and(|rest| rest.starts_with(['{', ' ']))
                })
            })
            .cloned()
            .collect()
    };
    let limit = Duration::from_secs(20);
    let started = std::time::Instant::now();
    let (missing_at_end, text) = loop {
        let (_, text) = http_get(http, "/metrics").unwrap();
        let now_missing = missing(&text);
        if now_missing.is_empty() || started.elapsed() > limit {
            break (now_missing, text);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        missing_at_end.is_empty(),
        "no series after {limit:?} for {missing_at_end:?}:\n{text}"
    );
    for zero in [
        "tally_sync_errors_total{",
        "tally_refused_messages_total{reason=\"wrong_cluster\"} 0",
        "tally_auth_refusals_total{reason=\"unauthenticated\"} 0",
    ] {
        assert!(text.contains(zero), "{zero} missing:\n{text}");
    }
}

/// The docs page every alert's `runbook_url` links to (it includes
/// `deploy/RUNBOOK.md`), as a path from the repository root.
const RUNBOOK_PAGE: &str = "docs/src/operations/runbook.md";

/// Every alert of `deploy/prometheus/alerts.yml` carries a `runbook_url`
/// annotation (the name Alertmanager, Grafana and paging tools render as a
/// link) to its section of the book's runbook page, and that section exists.
#[test]
fn every_alert_links_its_runbook_section() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let rules = std::fs::read_to_string(root.join("deploy/prometheus/alerts.yml")).unwrap();
    let page = std::fs::read_to_string(root.join(RUNBOOK_PAGE)).unwrap();
    assert!(
        page.contains("{{#include ../../../deploy/RUNBOOK.md}}"),
        "{RUNBOOK_PAGE} shows deploy/RUNBOOK.md: {page}"
    );
    let runbook = std::fs::read_to_string(root.join("deploy/RUNBOOK.md")).unwrap();
    let mut alerts = 0;
    for block in rules.split("- alert: ").skip(1) {
        alerts += 1;
        let name = block.split_whitespace().next().unwrap();
        // The block ends where the next rule or group starts.
        let block = block.split("\n      - ").next().unwrap();
        let url = block
            .lines()
            .find_map(|line| line.trim().strip_prefix("runbook_url: "))
            .unwrap_or_else(|| panic!("{name} has no runbook_url:\n{block}"))
            .trim_matches('"');
        assert_eq!(
            url,
            format!("{RUNBOOK_PAGE}#{}", name.to_lowercase()),
            "{name}"
        );
        assert!(
            runbook.lines().any(|line| line == format!("## {name}")),
            "deploy/RUNBOOK.md has no section `## {name}`"
        );
        assert!(
            !block.contains("runbook: "),
            "{name} keeps the old path annotation"
        );
    }
    assert!(alerts >= 10, "{alerts} alerts read from alerts.yml");
}
