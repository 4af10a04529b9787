//! The JSON API fuzzed by a client nobody here wrote (issue 16):
//! schemathesis reads `/v1/openapi.json` from a real node and runs every
//! default check (no 5xx, status codes, content types, headers and bodies
//! that conform to the document, bad data refused, valid data accepted)
//! over generated requests, in all its phases. Its configuration,
//! `node/tests/python/schemathesis.toml`, states two facts about the API and
//! says why, and `schemathesis_hooks.py` gives each drawn `Idempotency-Key`
//! a unique suffix, as a real client uses a fresh key per request. Two operations are left out, with the reason: the event stream
//! never ends, and a page of like-set members takes an opaque page token only
//! a node can make (every token a fuzzer makes is rightly refused); the
//! tests of `http_api.rs` cover both. The node upgrades its cluster version
//! by itself, so that like sets and uniques take writes, and has a second
//! node in its region, the copy that a `replicated` add needs.
//!
//! Without schemathesis it prints a loud SKIPPED line and passes, unless
//! `TALLY_REQUIRE_SCHEMATHESIS=1` (set by `.ci/run`, which installs it into
//! a virtualenv named by `TALLY_HTTP_PYTHON`), when it fails instead.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::python::{can_run, python, unavailable};
use common::{NodeProcess, NodeSpec};

/// The longest a run may take before it is killed and the test fails.
const LIMIT: Duration = Duration::from_secs(600);

#[test]
fn schemathesis_finds_nothing_wrong_with_the_json_api() {
    let python = python("TALLY_HTTP_PYTHON");
    let why_not = unavailable(
        &python,
        "import schemathesis",
        "install it with `python3 -m pip install schemathesis` (or set TALLY_HTTP_PYTHON to a \
         virtualenv's python that has it)",
    );
    if !can_run(
        "schemathesis_finds_nothing_wrong_with_the_json_api",
        why_not,
        "TALLY_REQUIRE_SCHEMATHESIS",
    ) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let mut spec = NodeSpec::new(root.path(), "eu", "fuzzed");
    spec.extra = vec!["--cluster-version-upgrade".into(), "auto".into()];
    // A second node of the region, so that an add that asks for
    // `"durability": "replicated"` has its copy (alone, the node rightly
    // answers 503 after 5 s, which the no-5xx check would count).
    let mut copy_spec = NodeSpec::new(root.path(), "eu", "fuzzed-copy");
    copy_spec.extra = spec.extra.clone();
    copy_spec.seeds = vec![spec.gossip];
    let node = NodeProcess::start(spec);
    let copy = NodeProcess::start(copy_spec);
    let base = format!("http://{}", node.spec.http);
    let api = common::http::Api::new(node.spec.http);
    common::wait_until(Duration::from_secs(60), "a replicated add", || {
        let reply = api.call(
            "POST",
            "/v1/counters/ready",
            &[],
            Some("{\"delta\": 1, \"durability\": \"replicated\"}"),
        );
        (reply.status == 200).then_some(())
    });
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/schemathesis.toml");
    let hooks =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/schemathesis_hooks.py");
    let mut child = Command::new(&python)
        .env("SCHEMATHESIS_HOOKS", &hooks)
        .args([
            "-c",
            "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())",
            "--no-color",
            "--config-file",
        ])
        .arg(&config)
        .args([
            "run",
            &format!("{base}/v1/openapi.json"),
            "--url",
            &base,
            "--exclude-path-regex",
            "/events$|^/v1/likes/[^/]+/members$",
            "--request-timeout",
            "20",
            "--max-examples",
            "100",
        ])
        .current_dir(root.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting schemathesis");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "schemathesis still running after {LIMIT:?}:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("schemathesis stdout:\n{stdout}\nschemathesis stderr:\n{stderr}");
    assert!(
        status.success(),
        "schemathesis failed ({status}):\n{stdout}\n{stderr}\nnode log:\n{}",
        node.log_text()
    );
    // It really tested the operations (a run that selected none also exits 0).
    assert!(stdout.contains("Tested: 14"), "{stdout}");
    assert!(node.is_running(), "the node died under the fuzzer");
    assert!(copy.is_running(), "the copy died under the fuzzer");
}
