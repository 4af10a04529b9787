//! Power loss: a real `tally-node` in `sync` mode on a disk that forgets
//! everything not synced ([`lazyfs`], a FUSE filesystem in this process).
//!
//! What it checks (DESIGN.md, invariants 3 and 4, across power loss and not
//! only `kill -9`): the node is killed under a load of adds, the power goes
//! out (every write, create or rename not covered by an `fsync`/`fdatasync`
//! is thrown away, and the kernel's caches with it by unmounting), and the
//! restarted node has its replica id and every acknowledged add. A first start
//! and a clean stop are followed by a power loss too.
//!
//! The disk is slow: each sync takes [`SYNC_DELAY`], and the power goes out
//! at the kill, failing the syncs in flight. Most of a commit's time
//! then lies between its bytes being written and their sync returning, so
//! a node that answered adds before that return (say, with the commit log's
//! `on_durable` called before its append) loses some in nearly every cycle.
//!
//! It needs root, `/dev/fuse` and `fusermount3` (`.ci/run` installs `fuse3`).
//! Without them it says so loudly and passes, unless
//! `TALLY_REQUIRE_POWER_LOSS=1` (set by `.ci/run`) turns that into a failure.

mod common;
#[path = "common/lazyfs.rs"]
mod lazyfs;

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use common::kill_load::{
    connect_without_retries as connect, hot_and_cold_keys, read_all, replica_id, KillLoad,
};
use common::{NodeProcess, NodeSpec};
use lazyfs::{LazyFs, Mounted};

const CYCLES: usize = 4;
const TASKS: usize = 8;
const COLD_KEYS: usize = 10;
/// How long the disk takes over each `fsync`/`fdatasync`.
const SYNC_DELAY: Duration = Duration::from_millis(20);

/// True when the test can run here; otherwise says why, loudly, and fails
/// when `TALLY_REQUIRE_POWER_LOSS=1`.
fn can_run(test: &str) -> bool {
    let Some(why) = lazyfs::unavailable() else {
        return true;
    };
    let message = format!("power-loss test {test} cannot run: {why}");
    if std::env::var("TALLY_REQUIRE_POWER_LOSS").as_deref() == Ok("1") {
        panic!("{message} (and TALLY_REQUIRE_POWER_LOSS=1 requires it)");
    }
    // Straight to the process's stderr, not through `eprintln!`, which the
    // test harness captures and hides for a test that passes.
    let bar = "!".repeat(72);
    let _ = writeln!(std::io::stderr(), "\n{bar}\nSKIPPED: {message}\n{bar}\n");
    false
}

/// The power goes out under a stopped (or killed) node: unmount, forget
/// everything unsynced, mount again, start the node on what survived.
fn power_cycle(fs: &LazyFs, mounted: Mounted, node: &mut NodeProcess) -> Mounted {
    assert!(!node.is_running(), "stop or kill the node first");
    fs.cut_power();
    mounted.unmount();
    fs.power_loss();
    let mounted = fs.mount(&node.spec.data_dir);
    if let Err(log) = node.try_restart() {
        panic!("the node did not start after a power loss:\n{log}");
    }
    mounted
}

fn spec(root: &Path) -> NodeSpec {
    // The data directory is the mount point; the node's log goes next to it,
    // on the real disk, so it survives the power loss for whoever debugs.
    let spec = NodeSpec::new(root, "eu", "powered");
    std::fs::create_dir_all(&spec.data_dir).unwrap();
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_loses_no_acknowledged_add() {
    if can_run("power_loss_loses_no_acknowledged_add") {
        power_loss(Vec::new()).await;
    }
}

/// The same at the newest format, where a commit is durable once its record
/// in the store's commit log is synced, and sled's own files only at
/// checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_loses_no_acknowledged_add_with_the_commit_log() {
    if can_run("power_loss_loses_no_acknowledged_add_with_the_commit_log") {
        power_loss(vec!["--cluster-version-upgrade".into(), "auto".into()]).await;
    }
}

/// The power-loss cycles on one node started with `extra` flags (which, if
/// they raise the format, it reaches before the first cycle).
async fn power_loss(extra: Vec<String>) {
    let root = tempfile::tempdir().unwrap();
    let mut spec = spec(root.path());
    spec.extra = extra.clone();
    let fs = LazyFs::with_sync_delay(SYNC_DELAY);
    let mut mounted = fs.mount(&spec.data_dir);
    let mut node = NodeProcess::start(spec);
    if !extra.is_empty() {
        let marker = node.spec.data_dir.join("TALLY_DATA_DIR");
        let newest = format!("format {}\n", tally_node::replica::version::NEWEST);
        common::wait_until(Duration::from_secs(30), "the newest format", || {
            let text = std::fs::read_to_string(&marker).ok()?;
            text.ends_with(&newest).then_some(())
        });
    }
    let replica = replica_id(&connect(&node).await).await;

    // A first start is durable once the node is ready.
    fs.cut_power();
    node.kill9();
    mounted = power_cycle(&fs, mounted, &mut node);
    assert_eq!(
        replica_id(&connect(&node).await).await,
        replica,
        "a power loss right after the first start changed the replica id"
    );

    let keys = hot_and_cold_keys(COLD_KEYS);
    let mut baseline = vec![0i64; keys.len()];
    let mut lost = Vec::new();
    let mut checked = 0u64;
    for cycle in 1..=CYCLES {
        let client = connect(&node).await;
        let load = KillLoad::start(&client, TASKS, 3, &keys);
        tokio::time::sleep(Duration::from_millis(300 + 150 * cycle as u64)).await;
        // The power goes out, then the node dies: a sync in flight fails
        // (the node may see that for a moment and must not answer its adds).
        fs.cut_power();
        let outcome = load.kill(&mut node).await;
        drop(client);
        mounted = power_cycle(&fs, mounted, &mut node);

        let client = connect(&node).await;
        assert_eq!(
            replica_id(&client).await,
            replica,
            "cycle {cycle}: the replica id changed after a power loss"
        );
        let values = read_all(&client, &keys).await;
        for violation in outcome.violations(&keys, &baseline, &values) {
            lost.push(format!("cycle {cycle}: {violation}"));
        }
        let cycle_acked = outcome.acked_total();
        println!(
            "cycle {cycle}: {cycle_acked} acknowledged, hot = {}, {:?}",
            values[0],
            fs.counts()
        );
        checked += cycle_acked;
        baseline = values;
    }
    assert!(checked > 0, "no add was acknowledged in any cycle");
    assert!(
        lost.is_empty(),
        "acknowledged adds were lost to a power loss:\n{}",
        lost.join("\n")
    );

    // A clean stop saves the change log; a power loss after it must leave a
    // store that opens with every add (saved log or rebuilt).
    assert_eq!(node.stop(), Some(0));
    mounted = power_cycle(&fs, mounted, &mut node);
    let client = connect(&node).await;
    assert_eq!(replica_id(&client).await, replica);
    assert_eq!(
        read_all(&client, &keys).await,
        baseline,
        "a power loss after a clean stop changed the counters"
    );
    drop(client);
    assert_eq!(node.stop(), Some(0));
    mounted.unmount();
    let counts = fs.counts();
    println!("power loss: {checked} acknowledged adds checked; {counts:?}");
}
