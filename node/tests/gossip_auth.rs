//! Sealed gossip with real processes (`--gossip-key-file`): nodes with a key
//! of the cluster see each other, also while two keys roll; a process with
//! the right cluster id and no key (or another key) is never a member, and
//! what it publishes (a drain) reaches nobody; refusals are counted; a bad
//! key file stops the start naming the setting. Prints how long two nodes
//! take to see each other with sealed and with plain gossip.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{status_of, wait_until, NodeProcess, NodeSpec};

fn key_file(root: &Path, name: &str, keys: &[&str]) -> PathBuf {
    let path = root.join(format!("{name}.gossip-key"));
    std::fs::write(&path, format!("# gossip keys\n{}\n", keys.join("\n"))).unwrap();
    path
}

fn spec(
    root: &Path,
    region: &str,
    name: &str,
    keys: Option<&Path>,
    seeds: &[&NodeSpec],
) -> NodeSpec {
    let mut spec = NodeSpec::new(root, region, name);
    spec.seeds = seeds.iter().map(|seed| seed.gossip).collect();
    if let Some(keys) = keys {
        spec.extra = vec!["--gossip-key-file".into(), keys.display().to_string()];
    }
    spec
}

/// The names of the live members `node` lists.
fn live_members(node: &NodeProcess) -> Vec<String> {
    let Some(status) = status_of(node) else {
        return Vec::new();
    };
    status["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|member| member["alive"] == true)
        .filter_map(|member| member["node_name"].as_str().map(str::to_string))
        .collect()
}

/// Waits until `a` and `b` list each other as live members.
fn see_each_other(a: &NodeProcess, b: &NodeProcess) {
    wait_until(
        Duration::from_secs(30),
        "the two nodes see each other",
        || {
            (live_members(a).contains(&b.spec.node_name)
                && live_members(b).contains(&a.spec.node_name))
            .then_some(())
        },
    );
}

/// Starts `second` (seeded with `first`) and says how long, from its
/// start, until the two see each other.
fn start_and_time(first: &NodeProcess, second: NodeSpec) -> (NodeProcess, Duration) {
    let started = Instant::now();
    let second = NodeProcess::start(second);
    see_each_other(first, &second);
    (second, started.elapsed())
}

#[test]
fn only_nodes_with_a_cluster_key_gossip_together() {
    let root = tempfile::tempdir().unwrap();
    let (k1, k2, k3) = ("11".repeat(32), "22".repeat(32), "33".repeat(32));
    // eu-1 seals with k1 and opens k2; eu-2 seals with k2 and opens k1 (a
    // rotation half done); rogue has no key; stranger has another key.
    let eu1 = spec(
        root.path(),
        "eu",
        "eu-1",
        Some(&key_file(root.path(), "eu-1", &[&k1, &k2])),
        &[],
    );
    let eu2_keys = key_file(root.path(), "eu-2", &[&k2, &k1]);
    let eu2 = spec(root.path(), "eu", "eu-2", Some(&eu2_keys), &[&eu1]);
    let rogue = spec(root.path(), "eu", "rogue", None, &[&eu1, &eu2]);
    let stranger_keys = key_file(root.path(), "stranger", &[&k3]);
    let stranger = spec(
        root.path(),
        "us",
        "stranger",
        Some(&stranger_keys),
        &[&eu1, &eu2],
    );
    let eu1 = NodeProcess::start(eu1);
    let (eu2, sealed) = start_and_time(&eu1, eu2);
    let rogue = NodeProcess::start(rogue);
    let stranger = NodeProcess::start(stranger);

    // The rogue asks to drain eu-2 through its own node: its gossip reaches
    // nobody, so eu-2 stays active (the drain is refused by the rogue, which
    // knows no eu-2, or published where no member reads it).
    let _ = common::cli(
        &format!("http://{}", rogue.spec.grpc),
        &["admin", "drain", "eu-2"],
    );
    std::thread::sleep(Duration::from_secs(3));
    for node in [&eu1, &eu2] {
        let members = live_members(node);
        assert!(
            !members.iter().any(|m| m == "rogue" || m == "stranger"),
            "{} lists {members:?}",
            node.spec.node_name
        );
        let map = &status_of(node).unwrap()["partition_map"]["nodes"];
        for listed in map.as_array().into_iter().flatten() {
            assert_ne!(listed["node_name"], "rogue", "{map}");
            if listed["node_name"] == "eu-2" {
                assert_eq!(listed["state"], "active", "{map}");
            }
        }
    }
    assert!(
        live_members(&rogue).is_empty(),
        "{:?}",
        live_members(&rogue)
    );
    assert!(
        live_members(&stranger).is_empty(),
        "{:?}",
        live_members(&stranger)
    );
    let (_, metrics) = common::http_get(eu1.spec.http, "/metrics").unwrap();
    for reason in ["gossip_not_sealed", "gossip_unknown_key"] {
        assert!(
            common::refused_count(&metrics, reason) > 0.0,
            "no refusal counted as {reason}"
        );
    }
    assert!(eu1.log_text().contains("gossip datagram refused"));

    // The same pair with plain gossip, for the comparison.
    let plain1 = NodeProcess::start(spec(root.path(), "ap", "ap-1", None, &[]));
    let plain2 = spec(root.path(), "ap", "ap-2", None, &[&plain1.spec]);
    let (plain2, plain) = start_and_time(&plain1, plain2);
    println!(
        "two nodes saw each other {:.2} s after the second was started with sealed gossip, {:.2} s with plain gossip",
        sealed.as_secs_f64(),
        plain.as_secs_f64()
    );
    drop((eu1, eu2, rogue, stranger, plain1, plain2));
}

#[test]
fn a_bad_gossip_key_file_stops_the_start_naming_the_setting() {
    let root = tempfile::tempdir().unwrap();
    for (label, text) in [
        ("not hex", "this is not a key\n"),
        ("too short", "abcd\n"),
        ("empty", "# no key\n"),
    ] {
        let path = root.path().join(format!("{label}.key"));
        std::fs::write(&path, text).unwrap();
        let spec = spec(root.path(), "eu", "eu-1", Some(&path), &[]);
        let (code, stderr) = common::run_bounded(&spec, Duration::from_secs(30));
        assert_eq!(code, Some(1), "{label}: {stderr}");
        assert!(stderr.contains("--gossip-key-file"), "{label}: {stderr}");
    }
    let spec = spec(
        root.path(),
        "eu",
        "eu-1",
        Some(&root.path().join("missing")),
        &[],
    );
    let (code, stderr) = common::run_bounded(&spec, Duration::from_secs(30));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("--gossip-key-file") && stderr.contains("cannot read"),
        "{stderr}"
    );
}

/// Turning sealing on in a running cluster: a node restarted with the key
/// and `--gossip-accept-plain` keeps gossiping with a node not restarted
/// yet, and seals with nodes that have the key.
#[test]
fn sealing_is_turned_on_one_node_at_a_time() {
    let root = tempfile::tempdir().unwrap();
    let key = key_file(root.path(), "cluster", &[&"44".repeat(32)]);
    // As in a cluster whose nodes seed each other: the node not restarted
    // yet keeps gossiping to the restarted one's address.
    let mut rolling = spec(root.path(), "eu", "eu-2", Some(&key), &[]);
    let plain = NodeProcess::start(spec(root.path(), "eu", "eu-1", None, &[&rolling]));
    rolling.seeds = vec![plain.spec.gossip];
    rolling.extra.push("--gossip-accept-plain".into());
    let rolling = NodeProcess::start(rolling);
    see_each_other(&plain, &rolling);
    let sealed = NodeProcess::start(spec(
        root.path(),
        "eu",
        "eu-3",
        Some(&key),
        &[&rolling.spec],
    ));
    see_each_other(&rolling, &sealed);
    assert!(rolling.log_text().contains("--gossip-accept-plain"));
    drop((plain, rolling, sealed));
}
