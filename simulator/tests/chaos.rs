//! `tally-sim chaos` end to end: real `tally-node` processes on loopback,
//! each on its own IP behind its TCP and UDP proxies, under a short fault
//! schedule, then the exact check. Bounded in time and load (a few seconds of
//! faults, a few clients); no test asserts a duration.

use std::path::PathBuf;
use std::process::Command;

/// The node binary next to `tally-sim` (built by `cargo test --workspace`, or
/// on demand here).
fn node_binary() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_tally-sim")).with_file_name("tally-node");
    if !path.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "tally-node", "--bin", "tally-node"])
            .status()
            .expect("running cargo to build tally-node");
        assert!(status.success(), "building tally-node failed");
    }
    path
}

#[track_caller]
fn chaos(extra: &[&str]) -> String {
    let node = node_binary();
    let output = Command::new(env!("CARGO_BIN_EXE_tally-sim"))
        .arg("chaos")
        .arg("--node-bin")
        .arg(&node)
        .args(["--keys", "8", "--converge-timeout-s", "90"])
        .args(
            ["--duration-s", "10"]
                .iter()
                .filter(|_| !extra.contains(&"--duration-s")),
        )
        .args(extra)
        .output()
        .expect("running tally-sim chaos");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("result: PASS"),
        "tally-sim chaos {extra:?} failed:\n{stdout}\n{stderr}"
    );
    stdout
}

#[test]
fn partitions_between_chosen_nodes_of_two_regions_of_two_nodes_pass() {
    let stdout = chaos(&[
        "--seed",
        "4",
        "--regions",
        "2",
        "--nodes-per-region",
        "2",
        "--faults",
        "partition",
    ]);
    let schedule: Vec<&str> = stdout
        .lines()
        .skip_while(|line| !line.starts_with("schedule"))
        .skip(1)
        .take_while(|line| line.starts_with("  at"))
        .collect();
    assert!(!schedule.is_empty(), "no fault scheduled:\n{stdout}");
    assert!(
        schedule.iter().all(|line| line.contains("partition")),
        "{stdout}"
    );
    assert!(stdout.contains("n3 (us-east) is replica"), "{stdout}");
}

#[test]
fn kills_stops_cuts_and_wipes_pass() {
    let stdout = chaos(&["--seed", "2", "--faults", "kill,stop,cut,wipe"]);
    assert!(stdout.contains("schedule ("), "{stdout}");
}

/// The same run with retirements: every wiped incarnation (n1 at 3.5 s,
/// and n2 at 9.1 s unless a slow restart pushed that wipe past the end) is
/// retired and folded at every node, and its adds are checked through the
/// counters' folded bases.
#[test]
fn wiped_replicas_are_retired_and_folded_exactly_under_faults() {
    let stdout = chaos(&["--seed", "2", "--faults", "kill,stop,cut,wipe", "--retire"]);
    let wipes = stdout.matches(" is now replica ").count();
    assert!(wipes >= 1, "{stdout}");
    assert!(
        stdout.contains(&format!("folds: {wipes} replicas folded")),
        "{stdout}"
    );
    assert!(
        stdout.contains(" of folded ones") && !stdout.contains("(0 of folded ones"),
        "{stdout}"
    );
}

/// Likes, unlikes and observes under kills, stops, partitions and clients
/// cut off mid-operation (`--likes`): every region holds the same members
/// and registers, the count is the members liked, and each member that got
/// only likes or only unlikes is in the state they decide.
#[test]
fn likes_unlikes_and_observes_under_faults_pass() {
    let stdout = chaos(&[
        "--seed",
        "1",
        "--faults",
        "kill,stop,partition,client",
        "--likes",
    ]);
    assert!(
        count_before(&stdout, "likes: ", "likes and unlikes") > 0,
        "{stdout}"
    );
    assert!(
        count_before(&stdout, "likes: ", "with an exact expectation") > 0,
        "{stdout}"
    );
    assert!(
        count_before(&stdout, "likes: ", "with an exact length") > 0,
        "{stdout}"
    );
}

/// The number printed before `label` on the line that starts with `prefix`.
fn count_before(stdout: &str, prefix: &str, label: &str) -> u64 {
    let line = stdout
        .lines()
        .find(|line| line.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line:\n{stdout}"));
    let before = line
        .split(label)
        .next()
        .unwrap_or_else(|| panic!("no {label:?} in {line:?}"));
    before
        .split_whitespace()
        .last()
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("no count before {label:?} in {line:?}"))
}

/// Overlapping faults (a partition while a node is down, the node restarted
/// inside it) and clients cut off mid-add, whose retries with the same
/// idempotency key must be counted once: the exact check passes, and the
/// run really dropped answers and really retried.
#[test]
fn a_partition_while_a_node_is_down_and_clients_cut_off_mid_add_pass() {
    let stdout = chaos(&["--seed", "1", "--faults", "overlap,client"]);
    assert!(stdout.contains("while it is down"), "{stdout}");
    assert!(stdout.contains("is back inside the partition"), "{stdout}");
    assert!(stdout.contains("clients off mid-add"), "{stdout}");
    let dropped = count_before(&stdout, "client cuts:", "answers dropped");
    let retried = count_before(&stdout, "client cuts:", "adds answered only after a retry");
    assert!(
        dropped > 0 && retried > 0,
        "no add was cut off and retried:\n{stdout}"
    );
}

/// `--durability replicated`: the nodes run in that mode (their copies take
/// pushes) and wipes lose no acknowledged add (the check fails the run
/// otherwise).
#[test]
fn replicated_durability_with_wipes_loses_no_acknowledged_add() {
    let stdout = chaos(&[
        "--seed",
        "3",
        "--regions",
        "2",
        "--nodes-per-region",
        "2",
        "--faults",
        "wipe,kill",
        "--durability",
        "replicated",
    ]);
    assert!(
        stdout.contains("--durability replicated --write-copies 2"),
        "{stdout}"
    );
    assert!(stdout.contains("is now replica"), "no wipe ran:\n{stdout}");
    let taken = count_before(&stdout, "copies (since", "taken by copies");
    assert!(taken > 0, "no copy took a push:\n{stdout}");
    assert_eq!(
        count_before(&stdout, "wipes:", "acknowledged adds lost"),
        0,
        "{stdout}"
    );
}

/// Everything that touches an acknowledged add's durability at once:
/// `--durability replicated` in partitioned regions (RF 2) whose nodes are
/// wiped, drained, joined and removed, with `--retire` so that wiped and
/// removed replicas are folded and partitions that moved away have their
/// slots folded partition by partition. The exact check holds through the
/// folded bases, no acknowledged add is lost with a wiped disk (the run
/// fails otherwise), and the copies really took pushes.
#[test]
fn replicated_durability_folds_by_partition_and_wipes_together_lose_nothing() {
    // Seed 5's schedule: n0 wiped at 0.8 s, n1 drained at 3.4 s, spare n3
    // joins at 5.9 s, n5 removed at 9.3 s, then more wipes and joins.
    let stdout = chaos(&[
        "--seed",
        "5",
        "--regions",
        "2",
        "--nodes-per-region",
        "3",
        "--replication-factor",
        "2",
        "--durability",
        "replicated",
        "--faults",
        "join,drain,remove,kill,wipe,client",
        "--retire",
        "--duration-s",
        "20",
    ]);
    assert!(stdout.contains("is now replica"), "no wipe ran:\n{stdout}");
    assert!(
        count_before(&stdout, "folds: ", "replicas folded") > 0,
        "{stdout}"
    );
    // An acknowledged add lost with a wiped disk fails the run itself in
    // replicated mode (the "wipes:" line is printed only when a wiped
    // replica had taken adds, which a loaded machine may not reach).
    let taken = count_before(&stdout, "copies (since", "taken by copies");
    assert!(taken > 0, "no copy took a push:\n{stdout}");
}

#[test]
fn replicated_durability_needs_enough_nodes_per_region() {
    let output = Command::new(env!("CARGO_BIN_EXE_tally-sim"))
        .args([
            "chaos",
            "--durability",
            "replicated",
            "--nodes-per-region",
            "1",
        ])
        .arg("--node-bin")
        .arg(node_binary())
        .output()
        .expect("running tally-sim chaos");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("--nodes-per-region"), "{stderr}");
}

/// Partitioned regions (issue 11): two regions of three nodes and a spare
/// each, RF 2; spares join, nodes are drained, removed, killed and cut off
/// from their clients under load. The run passes only when the placement settles (every
/// key held whole by exactly its owners in every region, nothing stray), the
/// like set's owners in both regions hold the same, and the exact per-slot
/// and like checks hold; with `--retire` the removed node is retired and
/// folded, and its adds checked through the folded bases.
#[test]
fn joins_drains_and_removals_of_a_partitioned_region_under_faults_pass() {
    // Seed 37's schedule: n7 joins us-east at 1.7 s, n5 is removed at
    // 4.0 s, n6 killed at 6.9 s, n4 drained at 10.6 s, n3 joins eu-west at
    // 14.7 s; 20 s of load.
    let stdout = chaos(&[
        "--seed",
        "37",
        "--regions",
        "2",
        "--nodes-per-region",
        "3",
        "--replication-factor",
        "2",
        "--faults",
        "join,drain,remove,kill,client",
        "--likes",
        "--retire",
        "--duration-s",
        "20",
    ]);
    assert!(stdout.contains("n7 joins us-east"), "{stdout}");
    assert!(stdout.contains(" removes n5"), "{stdout}");
    // The removal retires the removed node (no `tally admin retire`), and
    // it is folded partition by partition at every node, the drained and
    // the joined ones too.
    assert!(stdout.contains("folds: 1 replicas folded"), "{stdout}");
    assert!(stdout.contains(" drains n4"), "{stdout}");
    assert!(stdout.contains("placement settled"), "{stdout}");
}

#[test]
fn membership_faults_need_partitioned_regions() {
    let output = Command::new(env!("CARGO_BIN_EXE_tally-sim"))
        .arg("chaos")
        .arg("--node-bin")
        .arg(node_binary())
        .args(["--faults", "join"])
        .output()
        .expect("running tally-sim chaos");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("--replication-factor"), "{stderr}");
}
