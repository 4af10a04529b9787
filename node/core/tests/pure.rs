//! The core stays pure (DESIGN.md "Layout"): nothing tally-core depends on,
//! directly or not, is an IO or wire crate. Checked from the workspace's
//! Cargo.lock, with no cargo invocation and no network, so `cargo test
//! --workspace` fails the moment one leaks in, through whatever crate.
//!
//! The walk starts from tally-core's own entry in Cargo.lock, which for a
//! workspace member lists its dev- and build-dependencies too; below it,
//! every package's entry lists its normal and build dependencies. So the set
//! walked holds everything the core and its tests compile: stricter than
//! `cargo tree -e normal`, never looser.

use std::collections::{BTreeMap, BTreeSet};

/// Crates the core must never reach, and why. A name also forbids its
/// family (`tokio` forbids `tokio-stream`, `hyper` forbids `hyper-util`).
const FORBIDDEN: &[(&str, &str)] = &[
    ("tokio", "the runtime: the node's shell drives the core"),
    (
        "sled",
        "the store: the core defines what it needs as a trait",
    ),
    ("tonic", "gRPC: conversions live at the node's edge"),
    ("prost", "protobuf: conversions live at the node's edge"),
    ("chitchat", "membership: views come into the core as values"),
    ("axum", "the HTTP API, the node's"),
    ("hyper", "HTTP, the node's"),
    (
        "tally-node",
        "the node depends on the core, not the reverse",
    ),
    (
        "tally-proto",
        "the wire crate depends on the core, not the reverse",
    ),
];

/// One `[[package]]` of Cargo.lock: its dependencies as written there
/// (`name` or `name version` or `name version (source)`).
#[derive(Debug, Default)]
struct LockedPackage {
    name: String,
    version: String,
    dependencies: Vec<String>,
}

/// The packages of a Cargo.lock (format version 3 or 4), by name, each name
/// with every locked version.
fn parse_lock(text: &str) -> BTreeMap<String, Vec<LockedPackage>> {
    let mut packages: Vec<LockedPackage> = Vec::new();
    let mut in_dependencies = false;
    for line in text.lines().map(str::trim) {
        if line == "[[package]]" {
            packages.push(LockedPackage::default());
            in_dependencies = false;
        } else if let Some(package) = packages.last_mut() {
            if in_dependencies {
                if line.starts_with(']') {
                    in_dependencies = false;
                } else {
                    let entry = line.trim_end_matches(',').trim_matches('"');
                    package.dependencies.push(entry.to_string());
                }
            } else if let Some(value) = line.strip_prefix("name = ") {
                package.name = value.trim_matches('"').to_string();
            } else if let Some(value) = line.strip_prefix("version = ") {
                package.version = value.trim_matches('"').to_string();
            } else if line.starts_with("dependencies = [") {
                // Cargo writes one entry per line; an empty list is `[]`.
                in_dependencies = !line.ends_with(']');
            } else if line.starts_with('[') {
                // A table of the lock file that is not a package ([metadata]).
                in_dependencies = false;
            }
        }
    }
    let mut by_name: BTreeMap<String, Vec<LockedPackage>> = BTreeMap::new();
    for package in packages {
        by_name
            .entry(package.name.clone())
            .or_default()
            .push(package);
    }
    by_name
}

/// Every package reachable from `root` in the lock, as `name version`,
/// each with the chain of names that reached it.
fn closure(lock: &BTreeMap<String, Vec<LockedPackage>>, root: &str) -> BTreeMap<String, String> {
    let mut reached: BTreeMap<String, String> = BTreeMap::new();
    let mut to_visit: Vec<(String, Option<String>, String)> =
        vec![(root.to_string(), None, root.to_string())];
    while let Some((name, version, chain)) = to_visit.pop() {
        let candidates = lock
            .get(&name)
            .unwrap_or_else(|| panic!("Cargo.lock names {name} (via {chain}) but has no entry"));
        let package = match &version {
            Some(version) => candidates
                .iter()
                .find(|package| &package.version == version)
                .unwrap_or_else(|| panic!("Cargo.lock has no {name} {version} (via {chain})")),
            None => {
                assert_eq!(candidates.len(), 1, "{name} is locked at several versions");
                &candidates[0]
            }
        };
        let id = format!("{} {}", package.name, package.version);
        if reached.contains_key(&id) {
            continue;
        }
        reached.insert(id, chain.clone());
        for dependency in &package.dependencies {
            let mut words = dependency.split_whitespace();
            let dependency_name = words.next().expect("an empty dependency entry").to_string();
            let dependency_version = words.next().map(str::to_string);
            let dependency_chain = format!("{chain} -> {dependency_name}");
            to_visit.push((dependency_name, dependency_version, dependency_chain));
        }
    }
    reached
}

/// The forbidden crates in `reached`, each with how the core reaches it.
fn forbidden_in(reached: &BTreeMap<String, String>) -> Vec<String> {
    reached
        .iter()
        .filter_map(|(id, chain)| {
            let name = id.split_whitespace().next()?;
            let (forbidden, why) = FORBIDDEN.iter().find(|(forbidden, _)| {
                name == *forbidden || name.starts_with(&format!("{forbidden}-"))
            })?;
            Some(format!("{id} ({forbidden}: {why}), through {chain}"))
        })
        .collect()
}

fn workspace_lock() -> BTreeMap<String, Vec<LockedPackage>> {
    // node/core/ -> the workspace root.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.lock");
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|error| panic!("reading the workspace's Cargo.lock ({path}): {error}"));
    parse_lock(&text)
}

#[test]
fn the_core_depends_on_no_io_or_wire_crate() {
    let reached = closure(&workspace_lock(), "tally-core");
    // The walk understood the lock: the core's own dependencies are there.
    for expected in ["thiserror", "siphasher", "proptest"] {
        assert!(
            reached
                .keys()
                .any(|id| id.split_whitespace().next() == Some(expected)),
            "the walk of Cargo.lock from tally-core missed {expected}: {reached:?}"
        );
    }
    let leaked = forbidden_in(&reached);
    assert!(
        leaked.is_empty(),
        "tally-core must stay pure (DESIGN.md \"Layout\") but depends on:\n  {}\n\
         Keep the code that needs it in tally-node (the runtime, the store, \
         the services), and give the core a trait or a value instead.",
        leaked.join("\n  ")
    );
}

/// The lock names every dependency of node/core/Cargo.toml: a lock older
/// than the manifest would make the walk above pass on stale data.
#[test]
fn the_lock_is_the_manifests() {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .expect("reading node/core/Cargo.toml");
    let lock = workspace_lock();
    let core = &lock["tally-core"][0];
    let locked: BTreeSet<&str> = core
        .dependencies
        .iter()
        .filter_map(|entry| entry.split_whitespace().next())
        .collect();
    let mut section = String::new();
    let mut named = 0;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
        } else if section.ends_with("dependencies]") && !line.is_empty() && !line.starts_with('#') {
            let key = line.split(['=', '.']).next().unwrap_or_default().trim();
            // A renamed dependency (`alias = { package = "name", ... }`).
            let name = line
                .split("package = \"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or(key);
            assert!(
                locked.contains(name),
                "node/core/Cargo.toml names {name} but Cargo.lock's tally-core entry does not \
                 ({locked:?}): run a cargo build to update the lock"
            );
            named += 1;
        }
    }
    assert!(named >= 3, "no dependency read from node/core/Cargo.toml");
}

/// The check can fail: a lock in which the core reaches tokio through
/// another crate is refused, and the message names the path.
#[test]
fn a_forbidden_crate_reached_indirectly_is_caught() {
    let lock = parse_lock(
        r#"
version = 4

[[package]]
name = "tally-core"
version = "0.1.0"
dependencies = [
 "helper 1.0.0",
 "thiserror",
]

[[package]]
name = "helper"
version = "1.0.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
dependencies = [
 "tokio-util",
]

[[package]]
name = "helper"
version = "2.0.0"
source = "registry+https://github.com/rust-lang/crates.io-index"

[[package]]
name = "thiserror"
version = "2.0.0"
source = "registry+https://github.com/rust-lang/crates.io-index"

[[package]]
name = "tokio-util"
version = "0.7.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
dependencies = []
"#,
    );
    let reached = closure(&lock, "tally-core");
    assert!(!reached.contains_key("helper 2.0.0"), "{reached:?}");
    let leaked = forbidden_in(&reached);
    assert_eq!(leaked.len(), 1, "{leaked:?}");
    assert!(
        leaked[0].contains("tally-core -> helper -> tokio-util"),
        "{}",
        leaked[0]
    );
}
