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

use std::path::PathBuf;
use std::process::Command;

use common::python::{can_run, unavailable};
use common::{NodeProcess, NodeSpec};

const MODULES: &str = "import grpc, grpc_reflection, grpc_health";

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/grpc_clients.py")
}

#[test]
fn python_grpc_clients_see_reflection_health_and_conventional_codes() {
    let why_not = unavailable(
        "python3",
        MODULES,
        "install them with `python3 -m pip install grpcio grpcio-reflection grpcio-health-checking`",
    );
    if !can_run(
        "Python client test python_grpc_clients_see_reflection_health_and_conventional_codes",
        why_not,
        "TALLY_REQUIRE_PYTHON_CLIENTS",
    ) {
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
