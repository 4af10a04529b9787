//! One real `tally-node` process on loopback, driven through the `tally` CLI,
//! the Rust client and raw gRPC: round trips, refused input with its exact
//! status code, the 64-bit boundaries, `kill -9` under load (invariant 4), a
//! wiped directory as a new replica (invariant 3), graceful shutdown in
//! `async` mode, start-up errors, and the HTTP endpoints.
//!
//! No test asserts a duration: every wait has a generous bound that only turns
//! a hang into a failure. Each test has its own temporary directory and stops
//! the node it started (a dropped `NodeProcess` is killed).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{cli, free_ports, http_get, spawn_raw_replacing, NodeProcess, NodeSpec};
use futures::StreamExt;
use prost::bytes::Bytes;
use tally_client::{Client, ClientConfig, Code};
use tally_proto::v1::counters_client::CountersClient;
use tally_proto::v1::{AddRequest, GetRequest};
use tonic::transport::Channel;

/// The bound on any single wait in these tests (never an expectation).
const GIVE_UP: Duration = Duration::from_secs(20);

fn start_node(root: &std::path::Path, durability: &'static str) -> NodeProcess {
    let mut spec = NodeSpec::new(root, "eu", "solo");
    spec.durability = durability;
    NodeProcess::start(spec)
}

async fn connect(node: &NodeProcess) -> Client {
    ClientConfig::new()
        .with_deadline(Duration::from_secs(10))
        .connect(node.endpoint())
        .await
        .expect("connecting to the node")
}

async fn replica_id(client: &Client) -> u64 {
    client.status().await.expect("status").node.replica
}

#[track_caller]
fn assert_one_error_line(what: &str, (code, stdout, stderr): &(i32, String, String)) {
    assert_ne!(*code, 0, "{what}: exit code 0; stdout {stdout:?}");
    assert!(
        stdout.is_empty(),
        "{what}: stdout should be empty: {stdout:?}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{what}: stderr should be one line: {stderr:?}"
    );
    assert!(lines[0].starts_with("error: "), "{what}: {stderr:?}");
}

#[track_caller]
fn assert_prints(what: &str, result: &(i32, String, String), expected: &str) {
    let (code, stdout, stderr) = result;
    assert_eq!(*code, 0, "{what}: stderr {stderr:?}");
    assert_eq!(stdout.trim_end(), expected, "{what}");
}

#[test]
fn cli_round_trip() {
    let root = tempfile::tempdir().unwrap();
    let mut node = start_node(root.path(), "sync");
    let endpoint = node.endpoint();
    let key = "post:1:likes";

    assert_prints("add", &cli(&endpoint, &["add", key]), "1");
    assert_prints("add -1", &cli(&endpoint, &["add", key, "-1"]), "0");
    let first = cli(&endpoint, &["add", key, "5", "--idempotency-key", "K"]);
    assert_prints("add with a key", &first, "5");
    let again = cli(&endpoint, &["add", key, "5", "--idempotency-key", "K"]);
    assert_prints(
        "the same add again",
        &again,
        "5 (duplicate: already applied)",
    );
    assert_prints("get", &cli(&endpoint, &["get", key]), "5");

    let (code, stdout, stderr) = cli(&endpoint, &["get", key, "--json"]);
    assert_eq!(code, 0, "get --json: {stderr}");
    assert_eq!(stdout.lines().count(), 1, "one JSON object: {stdout:?}");
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("get --json is JSON");
    assert_eq!(json["key"], key, "{json}");
    assert_eq!(json["value"], 5, "{json}");

    let long_key = "x".repeat(300);
    assert_one_error_line("a 300-byte key", &cli(&endpoint, &["add", &long_key]));
    assert_one_error_line("a zero delta", &cli(&endpoint, &["add", key, "0"]));
    assert_prints("get after refusals", &cli(&endpoint, &["get", key]), "5");

    let nobody = format!("http://127.0.0.1:{}", free_ports(1)[0]);
    assert_one_error_line("an unreachable node", &cli(&nobody, &["add", key]));

    assert_eq!(node.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_round_trip() {
    let root = tempfile::tempdir().unwrap();
    let mut node = start_node(root.path(), "sync");
    let client = connect(&node).await;

    client
        .ping()
        .await
        .expect("a serving node answers its health check");
    assert_eq!(client.add("a", 3).await.unwrap().value, 3);
    assert_eq!(client.add("a", -1).await.unwrap().value, 2);
    assert_eq!(client.get("a").await.unwrap(), 2);
    assert_eq!(client.get("never-written").await.unwrap(), 0);

    // One item refused by the client (empty key), one by the server (the
    // second i64::MAX overflows "big"); the others are applied.
    let items = [
        ("a", 10),
        ("", 1),
        ("big", i64::MAX),
        ("big", i64::MAX),
        ("b", 7),
    ];
    let results = client.add_batch(items).await.expect("the batch call");
    assert_eq!(results.len(), 5);
    assert_eq!(results[0].as_ref().unwrap().value, 12);
    let empty = results[1].as_ref().unwrap_err();
    assert_eq!(empty.code(), Some(Code::InvalidArgument), "{empty}");
    assert_eq!(results[2].as_ref().unwrap().value, i64::MAX);
    let overflow = results[3].as_ref().unwrap_err();
    assert_eq!(overflow.code(), Some(Code::OutOfRange), "{overflow}");
    assert_eq!(results[4].as_ref().unwrap().value, 7);

    let values = client
        .get_batch(["a", "", "big", "b", "c"])
        .await
        .expect("the batch read");
    assert_eq!(*values[0].as_ref().unwrap(), 12);
    assert_eq!(
        values[1].as_ref().unwrap_err().code(),
        Some(Code::InvalidArgument)
    );
    assert_eq!(*values[2].as_ref().unwrap(), i64::MAX);
    assert_eq!(*values[3].as_ref().unwrap(), 7);
    assert_eq!(*values[4].as_ref().unwrap(), 0);

    let mut watch = client.watch("a").await.expect("opening a watch");
    let first = tokio::time::timeout(GIVE_UP, watch.next())
        .await
        .expect("first watch event");
    assert_eq!(first.expect("stream open").expect("a value"), 12);
    for _ in 0..3 {
        client.add("a", 1).await.unwrap();
    }
    // Updates are coalesced: wait for the newest value, whatever came between.
    tokio::time::timeout(GIVE_UP, async {
        loop {
            let value = watch.next().await.expect("stream open").expect("a value");
            assert!((12..=15).contains(&value), "watch saw {value}");
            if value == 15 {
                break;
            }
        }
    })
    .await
    .expect("the watch reached 15");
    drop(watch);

    assert_eq!(node.stop(), Some(0));
}

async fn raw_add(
    raw: &mut CountersClient<Channel>,
    key: &[u8],
    delta: i64,
    idempotency_key: &str,
) -> Result<i64, tonic::Status> {
    let request = AddRequest {
        key: Bytes::copy_from_slice(key),
        delta,
        idempotency_key: idempotency_key.to_owned(),
        ..Default::default()
    };
    raw.add(request).await.map(|r| r.into_inner().value)
}

async fn raw_get(raw: &mut CountersClient<Channel>, key: &[u8]) -> Result<i64, tonic::Status> {
    let request = GetRequest {
        key: Bytes::copy_from_slice(key),
        ..Default::default()
    };
    raw.get(request).await.map(|r| r.into_inner().value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_over_raw_grpc_gets_its_status_and_changes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let mut node = start_node(root.path(), "sync");
    let mut raw = CountersClient::connect(node.endpoint()).await.unwrap();
    let victim = b"victim";
    assert_eq!(raw_add(&mut raw, victim, 7, "first").await.unwrap(), 7);

    let long_key = vec![b'k'; 257];
    let long_idempotency_key = "i".repeat(129);
    let cases: [(&str, &[u8], i64, &str, Code); 5] = [
        ("empty key", b"", 1, "", Code::InvalidArgument),
        ("257-byte key", &long_key, 1, "", Code::InvalidArgument),
        (
            "non-UTF-8 key",
            b"bad\xff\xfekey",
            1,
            "",
            Code::InvalidArgument,
        ),
        ("zero delta", victim, 0, "", Code::InvalidArgument),
        (
            "129-byte idempotency key",
            victim,
            1,
            &long_idempotency_key,
            Code::InvalidArgument,
        ),
    ];
    for (what, key, delta, idempotency_key, expected) in cases {
        let status = raw_add(&mut raw, key, delta, idempotency_key)
            .await
            .expect_err(what);
        assert_eq!(status.code(), expected, "{what}: {status:?}");
        assert!(!status.message().is_empty(), "{what}: no message");
        assert_eq!(raw_get(&mut raw, victim).await.unwrap(), 7, "after {what}");
        if key != victim {
            // A key the node refuses to add to, it refuses to read as well.
            let status = raw_get(&mut raw, key).await.expect_err(what);
            assert_eq!(status.code(), Code::InvalidArgument, "read of {what}");
        }
    }
    // The same 256 bytes are a valid key, never written.
    assert_eq!(raw_get(&mut raw, &long_key[..256]).await.unwrap(), 0);

    assert_eq!(raw_add(&mut raw, victim, 5, "reused").await.unwrap(), 12);
    let status = raw_add(&mut raw, victim, 6, "reused")
        .await
        .expect_err("reused key");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(!status.message().is_empty());
    assert_eq!(raw_get(&mut raw, victim).await.unwrap(), 12);
    // The same add again is a duplicate, not an error.
    assert_eq!(raw_add(&mut raw, victim, 5, "reused").await.unwrap(), 12);
    assert_eq!(raw_get(&mut raw, victim).await.unwrap(), 12);

    assert_eq!(node.stop(), Some(0));
}

#[track_caller]
fn assert_out_of_range(what: &str, result: Result<tally_client::AddOutcome, tally_client::Error>) {
    match result {
        Err(error) => {
            assert_eq!(error.code(), Some(Code::OutOfRange), "{what}: {error}");
            assert!(!error.to_string().is_empty());
        }
        Ok(outcome) => panic!("{what}: accepted, value {}", outcome.value),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_64_bit_boundaries_hold_through_a_real_node_and_a_restart() {
    let root = tempfile::tempdir().unwrap();
    let mut node = start_node(root.path(), "sync");
    let client = connect(&node).await;

    assert_eq!(client.add("max", i64::MAX).await.unwrap().value, i64::MAX);
    assert_out_of_range("max + 1", client.add("max", 1).await);
    assert_eq!(client.get("max").await.unwrap(), i64::MAX);

    assert_eq!(client.add("min", i64::MIN).await.unwrap().value, i64::MIN);
    assert_out_of_range("min - 1", client.add("min", -1).await);
    assert_eq!(client.get("min").await.unwrap(), i64::MIN);

    // The slot: p and n both grow while the value stays inside i64.
    // u64::MAX == 2 * i64::MAX + 1.
    let steps = [i64::MAX, i64::MIN + 1, i64::MAX, i64::MIN + 1, 1];
    let mut expected = 0i64;
    for delta in steps {
        expected += delta;
        assert_eq!(client.add("slot", delta).await.unwrap().value, expected);
    }
    assert_eq!(expected, 1);
    assert_out_of_range("p past u64::MAX", client.add("slot", 1).await);
    assert_out_of_range("p past u64::MAX", client.add("slot", i64::MAX).await);
    assert_eq!(client.get("slot").await.unwrap(), 1);
    let slot_parts = |counter: tally_client::Counter| {
        assert_eq!(counter.regions.len(), 1, "{counter:?}");
        (counter.regions[0].increments, counter.regions[0].decrements)
    };
    let parts = slot_parts(client.get_with_breakdown("slot").await.unwrap());
    assert_eq!(parts, (u64::MAX, 2 * i64::MAX as u64));

    drop(client);
    assert_eq!(node.stop(), Some(0));
    node.restart();
    let client = connect(&node).await;
    assert_eq!(client.get("max").await.unwrap(), i64::MAX);
    assert_eq!(client.get("min").await.unwrap(), i64::MIN);
    assert_eq!(client.get("slot").await.unwrap(), 1);
    let parts_after = slot_parts(client.get_with_breakdown("slot").await.unwrap());
    assert_eq!(parts_after, parts);
    assert_out_of_range(
        "p past u64::MAX after the restart",
        client.add("slot", 1).await,
    );
    assert_eq!(node.stop(), Some(0));
}

/// Adds started, acknowledged and failed for one key.
#[derive(Default)]
struct KeyTally {
    acked: AtomicU64,
    failed: AtomicU64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_loses_no_acknowledged_add() {
    const TASKS: usize = 32;
    let root = tempfile::tempdir().unwrap();
    let mut node = start_node(root.path(), "sync");
    let client = ClientConfig::new()
        .with_max_retries(0)
        .with_deadline(Duration::from_secs(10))
        .connect(node.endpoint())
        .await
        .unwrap();
    let replica_before = replica_id(&client).await;

    let keys: Vec<String> = std::iter::once("hot".to_string())
        .chain((0..50).map(|i| format!("k{i}")))
        .collect();
    let tallies: Arc<BTreeMap<String, KeyTally>> = Arc::new(
        keys.iter()
            .map(|k| (k.clone(), KeyTally::default()))
            .collect(),
    );
    let in_flight = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (client, tallies, in_flight) = (client.clone(), tallies.clone(), in_flight.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0usize.. {
                let cold = format!("k{}", (task + round) % 50);
                for key in ["hot", cold.as_str()] {
                    in_flight.fetch_add(1, Ordering::SeqCst);
                    let result = client.add(key, 1).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    match result {
                        Ok(_) => tallies[key].acked.fetch_add(1, Ordering::SeqCst),
                        Err(error) => {
                            tallies[key].failed.fetch_add(1, Ordering::SeqCst);
                            return error;
                        }
                    };
                }
            }
            unreachable!()
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let acked_before_kill: u64 = tallies
        .values()
        .map(|t| t.acked.load(Ordering::SeqCst))
        .sum();
    assert!(
        acked_before_kill > 0,
        "no add was acknowledged in 1 s of load"
    );
    let in_flight_at_kill = in_flight.load(Ordering::SeqCst);
    node.kill9();
    for task in tasks {
        let error = tokio::time::timeout(GIVE_UP, task)
            .await
            .expect("a load task did not stop after the kill")
            .unwrap();
        assert!(error.is_transient(), "unexpected error: {error}");
    }
    let failed: u64 = tallies
        .values()
        .map(|t| t.failed.load(Ordering::SeqCst))
        .sum();
    assert_eq!(failed, TASKS as u64, "each task stops at its first error");
    println!("kill -9 after {acked_before_kill} acknowledged adds, {in_flight_at_kill} in flight");

    node.restart();
    let client = connect(&node).await;
    assert_eq!(
        replica_id(&client).await,
        replica_before,
        "the replica id changed"
    );
    let values = client.get_batch(&keys).await.unwrap();
    let mut acked_total = 0;
    for (key, value) in keys.iter().zip(values) {
        let value = value.unwrap();
        let acked = tallies[key].acked.load(Ordering::SeqCst);
        let failed = tallies[key].failed.load(Ordering::SeqCst);
        acked_total += acked;
        assert!(
            acked as i64 <= value && value <= (acked + failed) as i64,
            "{key}: value {value}, acknowledged {acked}, unacknowledged {failed}"
        );
    }
    println!("{acked_total} acknowledged adds survived kill -9");

    drop(client);
    assert_eq!(node.stop(), Some(0));
    node.wipe();
    node.restart();
    let client = connect(&node).await;
    assert_ne!(
        replica_id(&client).await,
        replica_before,
        "a wiped node kept its replica id"
    );
    for (key, value) in keys.iter().zip(client.get_batch(&keys).await.unwrap()) {
        assert_eq!(value.unwrap(), 0, "{key} after the wipe");
    }
    assert_eq!(node.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_mode_flushes_on_graceful_shutdown() {
    const TASKS: i64 = 8;
    const ADDS_PER_TASK: i64 = 250;
    let root = tempfile::tempdir().unwrap();
    let mut node = start_node(root.path(), "async");
    let client = connect(&node).await;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..ADDS_PER_TASK {
                client
                    .add("async:views", 1)
                    .await
                    .expect("an add in async mode");
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("the adds did not finish")
            .unwrap();
    }
    assert_eq!(
        client.get("async:views").await.unwrap(),
        TASKS * ADDS_PER_TASK
    );
    drop(client);
    assert_eq!(node.stop(), Some(0), "SIGTERM should exit 0");
    node.restart();
    let client = connect(&node).await;
    assert_eq!(
        client.get("async:views").await.unwrap(),
        TASKS * ADDS_PER_TASK
    );
    assert_eq!(node.stop(), Some(0));
}

#[track_caller]
fn assert_startup_error(what: &str, output: &std::process::Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "{what}: the node started; stderr:\n{stderr}"
    );
    assert_eq!(output.status.code(), Some(1), "{what}: stderr:\n{stderr}");
    assert!(
        stderr.contains("error: ") && stderr.contains(needle),
        "{what}: stderr should name {needle:?}:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{what}: a panic:\n{stderr}");
}

#[test]
fn start_up_errors_name_the_problem() {
    let root = tempfile::tempdir().unwrap();

    let foreign = NodeSpec::new(root.path(), "eu", "foreign");
    std::fs::create_dir_all(&foreign.data_dir).unwrap();
    std::fs::write(foreign.data_dir.join("notes.txt"), "not a tally file\n").unwrap();
    let output = NodeProcess::spawn_raw(&foreign);
    assert_startup_error("a foreign directory", &output, "not a Tally data directory");
    assert!(
        foreign.data_dir.join("notes.txt").exists(),
        "the foreign file was touched"
    );

    let spec = NodeSpec::new(root.path(), "eu", "owner");
    let mut first = NodeProcess::start(spec.clone());
    let mut second = NodeSpec::new(root.path(), "eu", "intruder");
    second.data_dir = spec.data_dir.clone();
    let output = NodeProcess::spawn_raw(&second);
    assert_startup_error("a directory in use", &output, "in use by another process");
    assert_eq!(first.stop(), Some(0));

    let output = spawn_raw_replacing(&spec, &[("--region", "us")]);
    assert_startup_error("another region", &output, "--region");

    let output = spawn_raw_replacing(&spec, &[("--grpc-addr", "nowhere")]);
    assert_startup_error("a bad address", &output, "--grpc-addr");

    let config = root.path().join("tally.toml");
    std::fs::write(&config, "regoin = \"eu\"\n").unwrap();
    let mut with_config = spec.clone();
    with_config.extra = vec!["--config".into(), config.display().to_string()];
    let output = NodeProcess::spawn_raw(&with_config);
    assert_startup_error("an unknown config key", &output, "regoin");

    // None of the refused starts harmed the directory.
    first.restart();
    assert_eq!(first.stop(), Some(0));
}

fn adds_total(node: &NodeProcess) -> u64 {
    let (code, body) = http_get(node.spec.http, "/metrics").expect("GET /metrics");
    assert_eq!(code, 200);
    body.lines()
        .find_map(|line| line.strip_prefix("tally_adds_total "))
        .unwrap_or_else(|| panic!("no tally_adds_total in /metrics:\n{body}"))
        .trim()
        .parse::<f64>()
        .expect("a number") as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics() {
    let root = tempfile::tempdir().unwrap();
    let mut node = start_node(root.path(), "sync");
    for path in ["/healthz", "/readyz"] {
        let (code, _) = http_get(node.spec.http, path).unwrap();
        assert_eq!(code, 200, "{path}");
    }
    let before = adds_total(&node);
    let client = connect(&node).await;
    for index in 0..25 {
        client.add(&format!("m{}", index % 3), 1).await.unwrap();
    }
    // A duplicate is not an applied add.
    client.add_with_key("m0", 1, "once").await.unwrap();
    let duplicate = client.add_with_key("m0", 1, "once").await.unwrap();
    assert!(duplicate.duplicate);
    assert_eq!(adds_total(&node), before + 26);
    drop(client);
    assert_eq!(node.stop(), Some(0));
}

/// A SIGTERM that arrives while the node is still starting (its store is
/// open, it is listening to gossip for another holder of its name) ends it
/// cleanly once the start is done: exit code 0, not death by the signal's
/// default action, which is what an orchestrator stopping a just-started
/// pod would otherwise cause.
#[test]
fn a_sigterm_during_start_up_stops_the_node_cleanly() {
    let root = tempfile::tempdir().unwrap();
    let mut spec = NodeSpec::new(root.path(), "eu", "starting");
    // A seed nobody answers on: the start waits seconds for name holders.
    let silent = free_ports(1)[0];
    spec.seeds = vec![std::net::SocketAddr::from(([127, 0, 0, 1], silent))];
    let log = std::fs::File::create(root.path().join("starting.log")).unwrap();
    let mut child = std::process::Command::new(common::node_binary())
        .args(spec.args())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let marker = spec.data_dir.join("TALLY_DATA_DIR");
    let deadline = std::time::Instant::now() + GIVE_UP;
    while !marker.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the store was never opened"
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the node exited during its start: {status:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the node did not stop after a SIGTERM during its start");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = std::fs::read_to_string(root.path().join("starting.log")).unwrap_or_default();
    assert_eq!(
        status.code(),
        Some(0),
        "a SIGTERM during start-up killed the node instead of stopping it: {status:?}\n{log}"
    );
}
