//! The `tally` binary against a fake node: its output formats, exit statuses
//! and one-line errors, as documented in `src/cli/mod.rs`.

// The fake node is shared with the library's tests.
#[path = "../../tests/fake/mod.rs"]
mod fake;

use std::process::Output;

use fake::{spawn_fake_server, unused_endpoint};

/// Runs `tally --endpoint ENDPOINT ARGS...` and returns what it did.
async fn tally(endpoint: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg("--endpoint")
        .arg(endpoint)
        .args(args)
        .env_remove("TALLY_ENDPOINT")
        .output()
        .await
        .expect("the tally binary runs")
}

#[track_caller]
fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}, stderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

#[track_caller]
fn single_error_line(output: &Output, exit_code: i32) -> String {
    assert_eq!(output.status.code(), Some(exit_code));
    assert!(output.stdout.is_empty(), "nothing on stdout on failure");
    let stderr = String::from_utf8(output.stderr.clone()).unwrap();
    assert_eq!(stderr.lines().count(), 1, "one line on stderr: {stderr:?}");
    stderr
}

#[tokio::test]
async fn add_get_and_watch_print_bare_values_or_json() {
    let server = spawn_fake_server().await;
    let endpoint = server.addr.to_string(); // no scheme: the CLI adds http://

    assert_eq!(stdout(&tally(&endpoint, &["add", "post:1"]).await), "1\n");
    assert_eq!(
        stdout(&tally(&endpoint, &["add", "post:1", "-3"]).await),
        "-2\n"
    );
    let json = stdout(&tally(&endpoint, &["--json", "add", "post:1", "12"]).await);
    let object: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        object,
        serde_json::json!({"key": "post:1", "value": 10, "duplicate": false})
    );

    let first = tally(
        &endpoint,
        &["add", "post:1", "5", "--idempotency-key", "k-1"],
    )
    .await;
    assert_eq!(stdout(&first), "15\n");
    let repeat = tally(
        &endpoint,
        &["add", "post:1", "5", "--idempotency-key", "k-1"],
    )
    .await;
    assert_eq!(stdout(&repeat), "15 (duplicate: already applied)\n");

    assert_eq!(stdout(&tally(&endpoint, &["get", "post:1"]).await), "15\n");
    let json = stdout(&tally(&endpoint, &["get", "post:1", "--json"]).await);
    assert_eq!(json, "{\"key\":\"post:1\",\"value\":15}\n");
    let breakdown = stdout(&tally(&endpoint, &["get", "post:1", "--breakdown"]).await);
    let mut lines = breakdown.lines();
    assert_eq!(lines.next(), Some("15"));
    assert!(lines.next().unwrap().starts_with("REGION"));

    assert_eq!(
        stdout(&tally(&endpoint, &["watch", "post:1"]).await),
        "15\n16\n17\n"
    );
    let json = stdout(&tally(&endpoint, &["watch", "post:1", "--json"]).await);
    assert_eq!(
        json.lines().next(),
        Some("{\"key\":\"post:1\",\"value\":15}")
    );
    server.shutdown();
}

#[tokio::test]
async fn status_prints_a_table_and_the_convergence_line() {
    let server = spawn_fake_server().await;
    let text = stdout(&tally(&server.endpoint(), &["status"]).await);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "cluster: fake");
    // The cluster version line (commit 7688fad) comes before the table.
    assert!(lines[1].starts_with("cluster version: "), "{text}");
    assert!(lines[2].starts_with("REGION"), "{text}");
    assert_eq!(lines[3].split_whitespace().nth(5), Some("self"));
    assert_eq!(lines[4].split_whitespace().nth(2), Some("ffffffffffffffff"));
    assert_eq!(
        lines[5],
        "converged: yes (all 2 live members hold digest 000000000000feed)"
    );

    let json = stdout(&tally(&server.endpoint(), &["status", "--json"]).await);
    let status: tally_client::ClusterStatus = serde_json::from_str(&json).unwrap();
    assert_eq!(status.members.len(), 1);
    server.shutdown();
}

#[tokio::test]
async fn bench_reports_throughput_and_latency() {
    let server = spawn_fake_server().await;
    let args = [
        "bench",
        "--json",
        "--op",
        "mixed",
        "--concurrency",
        "4",
        "--connections",
        "2",
        "--keys",
        "10",
        "--duration",
        "300ms",
        "--warmup",
        "100ms",
    ];
    let json = stdout(&tally(&server.endpoint(), &args).await);
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(report["ops"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["errors"], 0);
    assert_eq!(report["op"], "mixed");
    assert!(report["ops_per_sec"].as_f64().unwrap() > 0.0);
    assert!(report["p50_ms"].as_f64().unwrap() <= report["p99_ms"].as_f64().unwrap());

    let text = stdout(
        &tally(
            &server.endpoint(),
            &["bench", "--duration", "200ms", "--warmup", "0s"],
        )
        .await,
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("bench: op=add concurrency=64 connections=1 keys=1"));
    assert!(
        lines[0].ends_with("coalesce=on read-cache=off"),
        "{}",
        lines[0]
    );
    assert!(lines[1].contains("  client cpu: "), "{}", lines[1]);
    assert!(lines[1].starts_with("ops: "));
    assert!(lines[2].starts_with("latency ms: p50 "));
    server.shutdown();
}

#[tokio::test]
async fn bench_coalesces_adds_unless_told_not_to() {
    let server = spawn_fake_server().await;
    let run = |extra: &'static [&'static str]| {
        let mut args = vec![
            "bench",
            "--json",
            "--concurrency",
            "8",
            "--duration",
            "200ms",
            "--warmup",
            "0s",
            "--threads",
            "1",
        ];
        args.extend_from_slice(extra);
        args
    };
    let json = stdout(&tally(&server.endpoint(), &run(&["--no-coalesce"])).await);
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["coalesce"], false);
    assert_eq!(report["connections"], 4);
    assert!(server.node.single_adds() > 0);
    assert!(
        server.node.batches().is_empty(),
        "no batch without coalescing"
    );
    if cfg!(target_os = "linux") {
        assert!(
            report["client_cpu_us_per_op"].as_f64().is_some(),
            "{report}"
        );
    }

    let json = stdout(&tally(&server.endpoint(), &run(&[])).await);
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["coalesce"], true);
    assert_eq!(report["connections"], 1);
    assert!(!server.node.batches().is_empty(), "adds went in batches");

    let json = stdout(&tally(&server.endpoint(), &run(&["--op", "get", "--read-cache"])).await);
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["read_cache"], true);
    assert_eq!(report["errors"], 0);
    server.shutdown();
}

#[tokio::test]
async fn failures_print_one_error_line_and_exit_non_zero() {
    let server = spawn_fake_server().await;

    let zero = tally(&server.endpoint(), &["add", "k", "0"]).await;
    let line = single_error_line(&zero, 1);
    assert!(
        line.starts_with("error: the delta is 0; an add must change the counter"),
        "{line}"
    );

    let down = tally(&unused_endpoint().await, &["get", "k"]).await;
    let line = single_error_line(&down, 1);
    assert!(
        line.starts_with("error: could not connect to http://127.0.0.1:"),
        "{line}"
    );

    let bad_endpoint = tally("https://node:7100", &["get", "k"]).await;
    let line = single_error_line(&bad_endpoint, 1);
    assert!(
        line.contains("https needs the cluster's CA certificate"),
        "{line}"
    );

    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("b");
    let cut = tally(
        &server.endpoint(),
        &["admin", "backup", "--to", to.to_str().unwrap()],
    )
    .await;
    let line = single_error_line(&cut, 1);
    assert!(line.contains("ended before its trailer"), "{line}");
    let left: Vec<_> = std::fs::read_dir(&to).unwrap().collect();
    assert!(left.is_empty(), "a failed backup leaves no file: {left:?}");

    let usage = tally(&server.endpoint(), &["add"]).await;
    assert_eq!(usage.status.code(), Some(2), "bad usage exits 2");
    server.shutdown();
}

#[tokio::test]
async fn an_add_whose_outcome_stays_unknown_is_retried_with_one_key_and_prints_it() {
    let server = spawn_fake_server().await;
    // Every attempt is answered "unavailable": the client retries it, each
    // time with the same key, then gives up.
    server
        .node
        .fail_next_adds(1_000, tally_client::Code::Unavailable);
    let output = tally(&server.endpoint(), &["add", "post:1", "-2"]).await;
    let line = single_error_line(&output, 1);
    let keys = server.node.seen_keys();
    assert!(keys.len() > 1, "retried: {keys:?}");
    assert!(
        keys.iter().all(|key| key == &keys[0]) && !keys[0].is_empty(),
        "every attempt carries the one generated key: {keys:?}"
    );
    assert!(
        line.contains("outcome is unknown")
            && line.contains(&format!(
                "tally add post:1 -2 --idempotency-key {}",
                keys[0]
            )),
        "{line}"
    );
    // The user's own key is the one printed, with the durability asked for.
    let output = tally(
        &server.endpoint(),
        &[
            "add",
            "my key",
            "--idempotency-key",
            "order-42",
            "--durability",
            "replicated",
        ],
    )
    .await;
    let line = single_error_line(&output, 1);
    assert!(
        line.contains("tally add 'my key' 1 --idempotency-key order-42 --durability replicated"),
        "{line}"
    );
    // A refusal is no unknown outcome: no key to retry with.
    server
        .node
        .fail_next_adds(1, tally_client::Code::FailedPrecondition);
    let output = tally(&server.endpoint(), &["add", "post:1"]).await;
    let line = single_error_line(&output, 1);
    assert!(!line.contains("idempotency-key"), "{line}");
    server.shutdown();
}

#[tokio::test]
async fn a_refused_finalize_is_one_error_line_naming_the_member_that_lags() {
    let server = spawn_fake_server().await;
    let output = tally(&server.endpoint(), &["admin", "finalize"]).await;
    let line = single_error_line(&output, 1);
    assert!(
        line.contains("fake-2") && line.contains("do not speak it yet"),
        "{line}"
    );
    server.shutdown();
}
