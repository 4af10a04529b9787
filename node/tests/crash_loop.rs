//! The crash loop: one real `tally-node` on one data directory, `kill -9`'d
//! again and again under a closed-loop load of adds, and restarted each time.
//!
//! What it checks (DESIGN.md, invariants 3 and 4, and the sled caveat):
//!
//! - after every restart that opens the store, each counter is at least its
//!   acknowledged total and at most that plus the adds whose answer never
//!   came (they may or may not have landed), and the replica id is unchanged;
//! - a restart that finds the store damaged is a failure of the test: the
//!   acknowledged adds it held are lost. The loop still checks that such a
//!   start exits with one clear `error:` line naming the store (never a
//!   panic), restarts with `--on-corrupt move-aside` (a new replica, empty)
//!   and goes on from zero, so that the run reports how many of its restarts
//!   found the store damaged (the rate of sled's damage under kill -9)
//!   before it fails.
//!
//! The schedule comes from a seeded RNG; the seed is printed, and
//! `TALLY_CRASH_SEED=N` replays it. Durations are never asserted; every wait
//! has a bound that only turns a hang into a failure.

mod common;

use std::time::{Duration, Instant};

use common::kill_load::{
    connect_without_retries as connect, hot_and_cold_keys, read_all, replica_id, KillLoad,
};
use common::{NodeProcess, NodeSpec};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Kill -9 cycles in all, half in each format.
const CYCLES: usize = 50;
const TASKS: usize = 8;
const COLD_KEYS: usize = 20;

/// What a refused start must look like: an `error:` line naming the store,
/// and no panic.
#[track_caller]
fn assert_clear_store_error(log: &str) {
    assert!(
        !log.contains("panicked") && !log.contains("stack backtrace"),
        "a damaged store made the node panic:\n{log}"
    );
    let named = log
        .lines()
        .any(|line| line.starts_with("error: ") && line.contains("store"));
    assert!(
        named,
        "the node exited at start without an error naming the store:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_crash_loop_loses_no_acknowledged_add() {
    crash_loop(Vec::new()).await;
}

/// The same at the newest format, where each commit is made durable by the
/// store's commit log and sled is flushed only at checkpoints: a kill
/// between checkpoints leaves acknowledged commits in the log alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_crash_loop_loses_no_acknowledged_add_with_the_commit_log() {
    crash_loop(vec!["--cluster-version-upgrade".into(), "auto".into()]).await;
}

/// Runs [`CYCLES`] / 2 kill -9 cycles on one node started with `extra`
/// flags (which, if they raise the format, it reaches before the first).
async fn crash_loop(extra: Vec<String>) {
    let started = Instant::now();
    let seed = std::env::var("TALLY_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("crash loop seed {seed} (replay with TALLY_CRASH_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);

    let root = tempfile::tempdir().unwrap();
    let mut spec = NodeSpec::new(root.path(), "eu", "crashy");
    spec.extra = extra.clone();
    let mut node = NodeProcess::start(spec);
    if !extra.is_empty() {
        wait_for_newest_format(&node);
    }
    let keys = hot_and_cold_keys(COLD_KEYS);
    // What each counter was known to hold after the last restart.
    let mut baseline: Vec<i64> = vec![0; keys.len()];
    let mut replica = replica_id(&connect(&node).await).await;
    let (mut damaged, mut checked) = (0usize, 0u64);
    let mut lost = Vec::new();

    for cycle in 1..=CYCLES / 2 {
        let load_ms = rng.random_range(100..=400u64);
        let client = connect(&node).await;
        let load = KillLoad::start(&client, TASKS, 7, &keys);
        tokio::time::sleep(Duration::from_millis(load_ms)).await;
        let outcome = load.kill(&mut node).await;
        drop(client);
        let cycle_acked = outcome.acked_total();

        if let Err(log) = node.try_restart() {
            damaged += 1;
            let held: i64 = baseline.iter().sum::<i64>() + cycle_acked as i64;
            lost.push(format!(
                "cycle {cycle}: the store did not open after kill -9; the {held} acknowledged \
                 adds it held are lost"
            ));
            println!("cycle {cycle}: the store did not open after kill -9:\n{log}");
            assert_clear_store_error(&log);
            node.spec.extra = [
                extra.clone(),
                vec!["--on-corrupt".into(), "move-aside".into()],
            ]
            .concat();
            let moved = node.try_restart();
            node.spec.extra = extra.clone();
            if let Err(log) = moved {
                panic!("cycle {cycle}: --on-corrupt move-aside did not start the node:\n{log}");
            }
            let client = connect(&node).await;
            let new_replica = replica_id(&client).await;
            assert_ne!(
                new_replica, replica,
                "a moved-aside store kept its replica id"
            );
            replica = new_replica;
            baseline = read_all(&client, &keys).await;
            assert!(
                baseline.iter().all(|&v| v == 0),
                "a fresh store holds {baseline:?}"
            );
            continue;
        }

        let client = connect(&node).await;
        assert_eq!(
            replica_id(&client).await,
            replica,
            "cycle {cycle}: the replica id changed"
        );
        let values = read_all(&client, &keys).await;
        for violation in outcome.violations(&keys, &baseline, &values) {
            lost.push(format!("cycle {cycle}: {violation}"));
        }
        checked += cycle_acked;
        println!(
            "cycle {cycle}: load {load_ms} ms, {cycle_acked} acknowledged, {} unacknowledged, hot = {}",
            outcome.failed_total(),
            values[0]
        );
        baseline = values;
    }

    assert_eq!(node.stop(), Some(0));
    let rate = format!(
        "{damaged} of {} restarts found the store damaged ({:.1}%)",
        CYCLES / 2,
        200.0 * damaged as f64 / CYCLES as f64
    );
    println!("crash loop: {rate}, {checked} acknowledged adds checked");
    println!("crash loop took {:.1?}", started.elapsed());
    assert!(checked > 0, "no add was acknowledged in any cycle");
    assert!(
        lost.is_empty(),
        "acknowledged adds were lost (seed {seed}; {rate}):\n{}",
        lost.join("\n")
    );
}

/// Waits until the node's data directory is in this build's newest format.
fn wait_for_newest_format(node: &NodeProcess) {
    let marker = node.spec.data_dir.join("TALLY_DATA_DIR");
    let newest = format!("format {}\n", tally_node::replica::version::NEWEST);
    common::wait_until(Duration::from_secs(30), "the newest format", || {
        let text = std::fs::read_to_string(&marker).ok()?;
        text.ends_with(&newest).then_some(())
    });
}

/// Starts a node, makes one acknowledged add (`x` = 5), stops it gracefully
/// and returns it with its replica id.
async fn node_with_one_add(root: &std::path::Path) -> (NodeProcess, u64) {
    let node = NodeProcess::start(NodeSpec::new(root, "eu", "damaged"));
    let client = connect(&node).await;
    assert_eq!(client.add("x", 5).await.unwrap().value, 5);
    (node, replica_id(&client).await)
}

/// The loop's damaged branch, on purpose: a store sled cannot open stops the
/// node with an error naming the store, and `--on-corrupt move-aside` starts
/// it as a new, empty replica with the old directory kept aside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_store_refuses_to_start_and_move_aside_recovers() {
    let root = tempfile::tempdir().unwrap();
    let (mut node, replica) = node_with_one_add(root.path()).await;
    assert_eq!(node.stop(), Some(0));
    // sled takes a settings file of 8 bytes or less for a missing one; a
    // longer one that does not parse is an error.
    let conf = node.spec.data_dir.join("db").join("conf");
    std::fs::write(conf, "this is not a sled settings file\n").unwrap();

    let log = node
        .try_restart()
        .expect_err("the node started on a damaged store");
    assert_clear_store_error(&log);
    assert!(
        log.contains("--on-corrupt move-aside"),
        "no way out named:\n{log}"
    );

    node.spec.extra = vec!["--on-corrupt".into(), "move-aside".into()];
    node.try_restart()
        .expect("move-aside should start the node");
    let client = connect(&node).await;
    assert_ne!(
        replica_id(&client).await,
        replica,
        "a moved-aside store kept its replica id"
    );
    assert_eq!(client.get("x").await.unwrap(), 0);
    let aside = std::fs::read_dir(root.path())
        .unwrap()
        .filter_map(|entry| entry.ok())
        .any(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with("damaged.damaged-")
        });
    assert!(aside, "the damaged directory was not kept aside");
    assert_eq!(node.stop(), Some(0));
}

/// A store whose log sled cannot read at all (every byte of its main file
/// flipped) must not come back as a silently empty new replica: either the
/// node refuses to start, or it recovers its identity and the acknowledged add.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_lost_its_log_is_not_silently_reset() {
    let root = tempfile::tempdir().unwrap();
    let (mut node, replica) = node_with_one_add(root.path()).await;
    assert_eq!(node.stop(), Some(0));
    let file = node.spec.data_dir.join("db").join("db");
    let garbled: Vec<u8> = std::fs::read(&file)
        .unwrap()
        .iter()
        .map(|b| b ^ 0x5a)
        .collect();
    std::fs::write(&file, garbled).unwrap();

    match node.try_restart() {
        Err(log) => assert_clear_store_error(&log),
        Ok(()) => {
            let client = connect(&node).await;
            let (now, x) = (replica_id(&client).await, client.get("x").await.unwrap());
            assert_eq!(node.stop(), Some(0));
            assert!(
                now == replica && x == 5,
                "the node started on a damaged store as replica {now:016x} (was {replica:016x}) with x = {x} (acknowledged 5), without an error"
            );
        }
    }
}
