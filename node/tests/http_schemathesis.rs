//! The JSON API fuzzed by a client nobody here wrote: schemathesis reads
//! `/v1/openapi.json` from a real node and runs every check (no 5xx, status
//! codes, content types, headers and bodies that conform to the document,
//! bad data refused, valid data accepted) over generated requests, in all
//! its phases, and must find no failure and no schema warning.
//!
//! This test runs the one documented command, `deploy/schemathesis.sh`
//! (which starts the nodes, names the configuration and hooks in
//! `node/tests/python/`, and says why each is there), with the node binary
//! under test, so CI and a person at the repository root run the same thing.
//!
//! Without schemathesis it prints a loud SKIPPED line and passes, unless
//! `TALLY_REQUIRE_SCHEMATHESIS=1` (set by `.ci/run`, which installs it into
//! a virtualenv named by `TALLY_HTTP_PYTHON`), when it fails instead.

mod common;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::python::{can_run, python, unavailable};

/// The longest a run may take before it is killed and the test fails.
const LIMIT: Duration = Duration::from_secs(900);

#[test]
fn schemathesis_finds_nothing_wrong_with_the_json_api() {
    let python = python("TALLY_HTTP_PYTHON");
    let why_not = unavailable(
        &python,
        "import schemathesis",
        "run deploy/schemathesis.sh, which installs it into a virtualenv (or set \
         TALLY_HTTP_PYTHON to a python that has it)",
    );
    if !can_run(
        "schemathesis_finds_nothing_wrong_with_the_json_api",
        why_not,
        "TALLY_REQUIRE_SCHEMATHESIS",
    ) {
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(root.join("deploy/schemathesis.sh"))
        .env("TALLY_HTTP_PYTHON", &python)
        .env("TALLY_NODE_BIN", common::node_binary())
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(log.reopen().unwrap())
        .stderr(log.reopen().unwrap())
        .spawn()
        .expect("starting deploy/schemathesis.sh");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > LIMIT {
            // The script's own trap stops its nodes.
            let _ = Command::new("kill")
                .args(["-TERM", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            panic!(
                "deploy/schemathesis.sh still running after {LIMIT:?}:\n{}",
                std::fs::read_to_string(log.path()).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = std::fs::read_to_string(log.path()).unwrap_or_default();
    println!("deploy/schemathesis.sh:\n{output}");
    assert!(
        status.success(),
        "schemathesis failed ({status}):\n{output}"
    );
    // It really tested the operations (a run that selected none also exits
    // 0): all but the event stream, which never ends.
    assert!(output.contains("Tested: 15"), "{output}");
    assert!(
        !output.contains("WARNINGS"),
        "schemathesis warned (a schema looser than the server?):\n{output}"
    );
}
