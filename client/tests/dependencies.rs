//! The library stays lean: `cargo tree -p tally-client -e normal` (what a
//! service that adds `tally-client` to its Cargo.toml compiles) holds none of
//! the crates that only the `tally` command line, its benchmark or the node
//! need. The CLI lives in `client/cli` (crate `tally-cli`) with its own
//! dependencies; this test fails as soon as one of them leaks back.

use std::collections::BTreeSet;
use std::process::Command;

/// Crates the library must never pull in, directly or not, and who needs
/// them instead. (`anyhow` is not here: prost's derive macro uses it at
/// compile time. The library itself may not: see `DIRECT`.)
const FORBIDDEN: &[(&str, &str)] = &[
    ("clap", "the CLI's argument parser"),
    ("clap_builder", "the CLI's argument parser"),
    ("clap_derive", "the CLI's argument parser"),
    ("hdrhistogram", "the CLI's benchmark"),
    ("serde_json", "the CLI's JSON output"),
    (
        "rand",
        "the CLI's benchmark (the library's jitter needs no crate)",
    ),
    ("tracing-subscriber", "binaries: a library only emits spans"),
    ("axum", "tonic's server router: the node's"),
    ("sled", "the node's store"),
    ("chitchat", "the node's membership"),
    ("tally-node", "the node"),
];

/// The library's own dependencies, each with the reason it is there. A new
/// one must be added here, on purpose.
const DIRECT: &[(&str, &str)] = &[
    ("tally-proto", "the generated messages and client stubs"),
    ("tonic", "gRPC: the channel, TLS, status codes"),
    ("tonic-health", "Client::ping"),
    ("prost", "the coalescer's hand-encoded AddBatch bodies"),
    ("tokio", "the coalescing tasks, timers and deadlines"),
    ("futures", "the watch stream and joins"),
    ("thiserror", "the Error enum"),
    ("uuid", "idempotency keys (UUID v7)"),
    ("tracing", "a span per call"),
    (
        "tower",
        "the caller's own transport (ClientConfig::build_with_service)",
    ),
    ("http", "the request and response types of that transport"),
];

/// The names of the crates in the library's normal (non-dev, non-build)
/// dependency tree, with its default features, down to `depth` (0: itself).
fn normal_dependencies(depth: Option<u32>) -> BTreeSet<String> {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let mut command = Command::new(env!("CARGO"));
    command
        .args(["tree", "--manifest-path", manifest, "-p", "tally-client"])
        .args(["-e", "normal", "--prefix", "none", "--format", "{p}"]);
    if let Some(depth) = depth {
        command.args(["--depth", &depth.to_string()]);
    }
    let output = command.output().expect("running `cargo tree`");
    assert!(
        output.status.success(),
        "`cargo tree` failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_library_depends_on_no_cli_or_node_crate() {
    let dependencies = normal_dependencies(None);
    assert!(
        dependencies.contains("tally-proto") && dependencies.contains("tonic"),
        "cargo tree's output was not understood: {dependencies:?}"
    );
    let leaked: Vec<String> = FORBIDDEN
        .iter()
        .filter(|(name, _)| dependencies.contains(*name))
        .map(|(name, needed_by)| format!("{name} ({needed_by})"))
        .collect();
    assert!(
        leaked.is_empty(),
        "tally-client depends on {}: move the code that needs it to client/cli, \
         or make it an optional feature",
        leaked.join(", ")
    );
}

#[test]
fn every_direct_dependency_is_one_the_library_needs() {
    let mut direct = normal_dependencies(Some(1));
    assert!(
        direct.remove("tally-client"),
        "cargo tree's output was not understood: {direct:?}"
    );
    let unexpected: Vec<&String> = direct
        .iter()
        .filter(|name| !DIRECT.iter().any(|(allowed, _)| allowed == name))
        .collect();
    assert!(
        unexpected.is_empty(),
        "tally-client has new dependencies {unexpected:?}: if a service that only \
         talks to Tally needs them, list them in DIRECT (tests/dependencies.rs) \
         with the reason; if only the CLI does, put them in client/cli/Cargo.toml"
    );
}
