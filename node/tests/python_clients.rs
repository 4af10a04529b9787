//! The stock Python gRPC clients against a real node (issue 10, items 13 and
//! 14): `node/tests/python/grpc_clients.py` uses grpcio-reflection (which
//! speaks only `grpc.reflection.v1alpha`), grpcio-health-checking and raw
//! grpcio calls with identity serializers; this test starts a real
//! tally-node on free loopback ports, runs the script, and requires exit 0.
//!
//! Without python3 and those modules it prints a loud SKIPPED line and
//! passes, unless `TALLY_REQUIRE_PYTHON_CLIENTS=1` (set by `.ci/run`, which
//! installs them), when it fails instead.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use common::{NodeProcess, NodeSpec};

const MODULES: &str = "import grpc, grpc_reflection, grpc_health";

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/grpc_clients.py")
}

/// Why the Python clients cannot run here, or `None` when they can.
fn unavailable() -> Option<String> {
    match Command::new("python3").args(["-c", MODULES]).output() {
        Err(error) => Some(format!("python3 cannot be run: {error}")),
        Ok(out) if !out.status.success() => Some(format!(
            "python3 lacks the gRPC modules ({}); install them with \
             `python3 -m pip install grpcio grpcio-reflection grpcio-health-checking`",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("no error text")
        )),
        Ok(_) => None,
    }
}

fn can_run(test: &str) -> bool {
    let Some(why) = unavailable() else {
        return true;
    };
    let message = format!("Python client test {test} cannot run: {why}");
    if std::env::var("TALLY_REQUIRE_PYTHON_CLIENTS").as_deref() == Ok("1") {
        panic!("{message} (and TALLY_REQUIRE_PYTHON_CLIENTS=1 requires it)");
    }
    // Straight to the process's stderr, not through `eprintln!`, which the
    // test harness captures and hides for a test that passes.
    let bar = "!".repeat(72);
    let _ = writeln!(std::io::stderr(), "\n{bar}\nSKIPPED: {message}\n{bar}\n");
    false
}

#[test]
fn python_grpc_clients_see_reflection_health_and_conventional_codes() {
    if !can_run("python_grpc_clients_see_reflection_health_and_conventional_codes") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    // No --auth-tokens: the node needs none by default.
    let node = NodeProcess::start(NodeSpec::new(root.path(), "eu", "py"));
    let out = Command::new("python3")
        .arg(script())
        .arg(node.spec.grpc.to_string())
        .output()
        .expect("running python3 on node/tests/python/grpc_clients.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("grpc_clients.py stdout:\n{stdout}\ngrpc_clients.py stderr:\n{stderr}");
    assert!(
        out.status.success(),
        "node/tests/python/grpc_clients.py exited with {}:\n{stdout}\n{stderr}\nnode log:\n{}",
        out.status,
        node.log_text()
    );
}
