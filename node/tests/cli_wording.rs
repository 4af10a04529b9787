//! The `tally` CLI's errors, against a real node: every failure is one line
//! `error: <message>`, with no gRPC-code prefix, and what the CLI refuses
//! before sending (a bad key, a zero delta, a long idempotency key) reads
//! exactly as the node's own refusal of the same request.
//!
//! Issue 10, item 17 (the CLI half).

mod common;

use std::process::Command;
use std::time::Duration;

use common::{cli_binary, NodeProcess, NodeSpec};
use tally_proto::v1::counters_client::CountersClient;
use tally_proto::v1::AddRequest;

/// Runs `tally --endpoint ENDPOINT ARGS...`; returns its one stderr line.
fn cli_error(endpoint: &str, args: &[&str]) -> String {
    let output = Command::new(cli_binary())
        .arg("--endpoint")
        .arg(endpoint)
        .args(args)
        .output()
        .expect("running tally");
    assert_eq!(output.status.code(), Some(1), "tally {args:?}: {output:?}");
    assert!(output.stdout.is_empty(), "tally {args:?}: {output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "tally {args:?}: one line: {stderr:?}");
    lines[0].to_owned()
}

#[tokio::test]
async fn cli_refusals_read_as_the_nodes_and_share_one_style() {
    let root = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(NodeSpec::new(root.path(), "eu", "solo"));
    let endpoint = node.endpoint();
    let mut raw = tokio::time::timeout(
        Duration::from_secs(20),
        CountersClient::connect(endpoint.clone()),
    )
    .await
    .expect("connecting in time")
    .expect("connecting to the node");

    let long_key = "k".repeat(257);
    let long_idempotency_key = "i".repeat(129);
    // (CLI arguments, the same request sent raw to the node).
    let cases: Vec<(Vec<&str>, AddRequest)> = vec![
        (
            vec!["add", "", "1"],
            AddRequest {
                key: Default::default(),
                delta: 1,
                idempotency_key: String::new(),
                ..Default::default()
            },
        ),
        (
            vec!["add", &long_key, "1"],
            AddRequest {
                key: long_key.clone().into_bytes().into(),
                delta: 1,
                idempotency_key: String::new(),
                ..Default::default()
            },
        ),
        (
            vec!["add", "k", "0"],
            AddRequest {
                key: b"k".to_vec().into(),
                delta: 0,
                idempotency_key: String::new(),
                ..Default::default()
            },
        ),
        (
            vec!["add", "k", "1", "--idempotency-key", &long_idempotency_key],
            AddRequest {
                key: b"k".to_vec().into(),
                delta: 1,
                idempotency_key: long_idempotency_key.clone(),
                ..Default::default()
            },
        ),
    ];
    for (args, request) in cases {
        let status = raw.add(request).await.expect_err("the node refuses it");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{args:?}");
        let line = cli_error(&endpoint, &args);
        assert_eq!(line, format!("error: {}", status.message()), "{args:?}");
    }

    // A refusal only the node makes (the same idempotency key for another
    // add) is worded the node's way too, with no code in front.
    let mut first = vec!["add", "k", "2", "--idempotency-key", "once"];
    let output = Command::new(cli_binary())
        .arg("--endpoint")
        .arg(&endpoint)
        .args(&first)
        .output()
        .expect("running tally");
    assert!(output.status.success(), "{output:?}");
    first[2] = "3";
    let line = cli_error(&endpoint, &first);
    assert!(
        line.starts_with("error: idempotency key \"once\" was already used"),
        "{line}"
    );

    // Every line is `error: ` then a lower-case sentence: no gRPC code names.
    for line in [cli_error(&endpoint, &["add", "k", "0"]), line] {
        for prefix in ["invalid argument:", "out of range:", "server error"] {
            assert!(!line.contains(prefix), "{line}");
        }
    }
}
