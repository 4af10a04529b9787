//! Backup and restore with real processes (issue #17 item 4): `tally admin
//! backup` streams a node's durable state while the node keeps taking adds;
//! every region's data is destroyed; `tally-node restore` makes new replicas
//! of a fresh cluster from the backup, and every value is the backup's,
//! exactly: nothing added after the backup, nothing counted twice (the
//! backup is restored into both regions' new nodes, and they merge by max).
//! Like sets and uniques too: every member's state, the derived count (and a
//! recount), and the uniques registers (their digest) are the backup's.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::load::quick_client;
use common::{cli, node_binary, wait_until, Cluster, NodeProcess, NodeSpec};
use tally_client::Client;

const LIMIT: Duration = Duration::from_secs(30);
/// Enough counters for several chunks of the backup stream (about 450 a chunk).
const KEYS: usize = 2000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Waits until every node reads `expected` for every key.
async fn wait_values(endpoints: &[String], expected: &BTreeMap<String, i64>) {
    let started = std::time::Instant::now();
    loop {
        let mut wrong = Vec::new();
        for endpoint in endpoints {
            let client = quick_client(endpoint).await;
            let keys: Vec<&String> = expected.keys().collect();
            for part in keys.chunks(500) {
                let got = client.get_batch(part.iter().map(|k| k.as_str())).await;
                let got = got.unwrap_or_default();
                for (index, key) in part.iter().enumerate() {
                    let value = got.get(index).and_then(|v| v.as_ref().ok()).copied();
                    if value != Some(expected[*key]) {
                        wrong.push(format!(
                            "{endpoint} {key}: {value:?} (want {})",
                            expected[*key]
                        ));
                    }
                }
            }
        }
        if wrong.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < LIMIT,
            "values not reached after {LIMIT:?}: {} wrong, first {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(5)]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the sets hold when the backup is taken.
#[derive(Clone, Debug, PartialEq)]
struct Sets {
    /// Every member ever liked or unliked, and whether it is liked.
    members: BTreeMap<String, bool>,
    /// The uniques key's estimate and registers digest.
    uniques: (u64, u64),
}

const LIKERS: &str = "post:7:likers";
const VIEWERS: &str = "post:7:viewers";

/// Waits until `client` holds `sets` exactly: each member, the count, a
/// recount, the uniques registers.
async fn wait_sets(client: &Client, sets: &Sets) {
    let started = std::time::Instant::now();
    let count = sets.members.values().filter(|liked| **liked).count() as u64;
    let members: Vec<&String> = sets.members.keys().collect();
    loop {
        let liked = client.liked(LIKERS, &members).await.unwrap_or_default();
        let held: BTreeMap<String, bool> =
            members.iter().map(|m| m.to_string()).zip(liked).collect();
        let uniques = client.distinct_with_digest(&[VIEWERS]).await.ok();
        let stored = client.like_count(LIKERS).await.ok();
        if held == sets.members && uniques == Some(sets.uniques) && stored == Some(count) {
            // The recount reads what is durable, which follows the members
            // merged from the other region by up to a commit: wait for it
            // (asserting on the first try failed the CI rehearsal of
            // 2026-12-02 with a durable 203 against a live 200).
            let recount = client.verify_likes(LIKERS).await.unwrap();
            assert!(recount.consistent, "{recount:?}");
            if recount.recounted == count {
                return;
            }
        }
        assert!(
            started.elapsed() < LIMIT,
            "sets not reached after {LIMIT:?}: count {stored:?} (want {count}), uniques {uniques:?} (want {:?}), {} members differ",
            sets.uniques,
            held.iter().filter(|(m, l)| sets.members.get(*m) != Some(l)).count()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The number in `post:N:likes`.
fn key_number(key: &str) -> i64 {
    key.split(':').nth(1).unwrap().parse().unwrap()
}

fn restore(from: &Path, data_dir: &Path) -> std::process::Output {
    Command::new(node_binary())
        .arg("restore")
        .arg("--from")
        .arg(from)
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .expect("running tally-node restore")
}

#[test]
fn a_cluster_restored_from_a_backup_holds_exactly_the_backup() {
    let rt = runtime();
    let cluster = Cluster::start(&[("eu", 1), ("us", 1)], "sync");
    let endpoints = cluster.endpoints();
    let (eu, us) = (endpoints[0].clone(), endpoints[1].clone());

    // Adds in both regions, some negative, then both nodes agree.
    let mut backed_up = BTreeMap::new();
    rt.block_on(async {
        let (eu_client, us_client) = (quick_client(&eu).await, quick_client(&us).await);
        let keys: Vec<String> = (0..KEYS).map(|i| format!("post:{i}:likes")).collect();
        for part in keys.chunks(500) {
            let eu_adds = part.iter().map(|key| (key.as_str(), key_number(key) + 1));
            let us_adds = part.iter().map(|key| (key.as_str(), 1000));
            let minus = part.iter().filter(|key| key_number(key) % 7 == 0);
            for added in [
                eu_client.add_batch(eu_adds).await.unwrap(),
                us_client.add_batch(us_adds).await.unwrap(),
                us_client
                    .add_batch(minus.map(|key| (key.as_str(), -3)))
                    .await
                    .unwrap(),
            ] {
                assert!(added.iter().all(|a| a.is_ok()), "an add failed");
            }
        }
        for key in keys {
            let i = key_number(&key);
            let want = i + 1 + 1000 - if i % 7 == 0 { 3 } else { 0 };
            backed_up.insert(key, want);
        }
        wait_values(&endpoints, &backed_up).await;
    });

    // Like sets and uniques, written in both regions (they need cluster
    // version 3): 300 members like, every third unlikes on the other
    // region, 8,000 viewers are observed.
    wait_until(LIMIT, "finalize", || {
        (cli(&eu, &["admin", "finalize"]).0 == 0).then_some(())
    });
    for endpoint in &endpoints {
        wait_until(LIMIT, "likes accepted", || {
            (cli(endpoint, &["like", "warm-up", "x"]).0 == 0).then_some(())
        });
    }
    let backed_up_sets = rt.block_on(async {
        let regions = [quick_client(&eu).await, quick_client(&us).await];
        let mut members = BTreeMap::new();
        for i in 0..300usize {
            let member = format!("user-{i:03}");
            regions[i % 2].like(LIKERS, &member).await.unwrap();
            members.insert(member, true);
        }
        // Every like must have reached the other region before its unlike
        // there: an unlike of a member not liked *there* changes nothing,
        // and the like arriving after it would win.
        let started = std::time::Instant::now();
        for region in &regions {
            while region.like_count(LIKERS).await.ok() != Some(300) {
                assert!(started.elapsed() < LIMIT, "the likes did not converge");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        for i in (0..300usize).step_by(3) {
            let member = format!("user-{i:03}");
            regions[(i + 1) % 2].unlike(LIKERS, &member).await.unwrap();
            members.insert(member, false);
        }
        for (region, range) in [(0, 0..5000), (1, 5000..8000)] {
            let viewers: Vec<String> = range.map(|i| format!("viewer-{i}")).collect();
            for part in viewers.chunks(1000) {
                regions[region].observe(VIEWERS, part).await.unwrap();
            }
        }
        // Both regions agree on the registers; that is what the backup holds.
        let started = std::time::Instant::now();
        let uniques = loop {
            let a = regions[0].distinct_with_digest(&[VIEWERS]).await.unwrap();
            let b = regions[1].distinct_with_digest(&[VIEWERS]).await.unwrap();
            if a == b {
                break a;
            }
            assert!(started.elapsed() < LIMIT, "uniques did not converge");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let sets = Sets { members, uniques };
        for client in &regions {
            wait_sets(client, &sets).await;
        }
        sets
    });

    // The backup runs while a writer keeps adding 1 to a key of its own.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicI64::new(0));
    let writer = {
        let (stop, acked, eu) = (stop.clone(), acked.clone(), eu.clone());
        std::thread::spawn(move || {
            runtime().block_on(async {
                let client = quick_client(&eu).await;
                while !stop.load(Ordering::SeqCst) {
                    if client.add("during:backup", 1).await.is_ok() {
                        acked.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let before_backup = acked.load(Ordering::SeqCst);
    let backup_dir = cluster.root.path().join("backup-1");
    let (code, stdout, stderr) = cli(
        &eu,
        &["admin", "backup", "--to", backup_dir.to_str().unwrap()],
    );
    assert_eq!(code, 0, "tally admin backup failed: {stderr}");
    let after_backup = acked.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    println!("{stdout}");
    assert!(stdout.contains("backup of replica"), "{stdout}");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(backup_dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["format_version"], 2);
    assert!(manifest["set_deltas"].as_u64().unwrap() > 0, "{manifest}");
    assert_eq!(manifest["region"], "eu");
    let old_eu_replica = manifest["replica"].as_str().unwrap().to_string();

    // More adds after the backup: the restore must not hold them.
    rt.block_on(async {
        let client = quick_client(&us).await;
        let keys: Vec<String> = (0..KEYS / 3).map(|i| format!("post:{i}:likes")).collect();
        let added = client
            .add_batch(keys.iter().map(|key| (key.as_str(), 5)))
            .await
            .unwrap();
        assert!(added.iter().all(|a| a.is_ok()), "an add failed");
        client.add("after:backup", 9).await.unwrap();
        // Likes, unlikes and views after the backup: not restored either.
        for i in 0..20usize {
            client.like(LIKERS, &format!("late-{i}")).await.unwrap();
            client
                .unlike(LIKERS, &format!("user-{:03}", i * 3 + 1))
                .await
                .unwrap();
        }
        let late: Vec<String> = (0..3000).map(|i| format!("late-viewer-{i}")).collect();
        client.observe(VIEWERS, &late).await.unwrap();
    });

    // A second backup is refused into the same directory, with a reason.
    let (code, _, stderr) = cli(
        &eu,
        &["admin", "backup", "--to", backup_dir.to_str().unwrap()],
    );
    assert_ne!(code, 0);
    assert!(stderr.contains("already holds a backup"), "{stderr}");

    // Every region's data is destroyed.
    let root = cluster.root.path().to_path_buf();
    let mut cluster = cluster;
    for node in &mut cluster.nodes {
        node.kill9();
    }
    let keep = tempfile::tempdir().unwrap();
    let backup = keep.path().join("backup");
    std::fs::rename(&backup_dir, &backup).unwrap();
    drop(cluster);
    assert!(!root.exists(), "the old cluster's data is gone");

    // A damaged backup is refused before anything is written.
    let damaged = keep.path().join("damaged");
    std::fs::create_dir(&damaged).unwrap();
    let bytes = std::fs::read(backup.join("backup.tally")).unwrap();
    std::fs::write(damaged.join("backup.tally"), &bytes[..bytes.len() - 10]).unwrap();
    let refused = restore(&damaged, &keep.path().join("never"));
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("truncated") || why.contains("no trailer"),
        "{why}"
    );
    assert!(!keep.path().join("never").exists(), "nothing was written");

    // A backup whose like sets or uniques do not give the trailer's sets
    // digest is refused as damaged (here: the digest itself altered).
    let altered = keep.path().join("altered");
    std::fs::create_dir(&altered).unwrap();
    let mut reader =
        tally_proto::backup::BackupReader::new(std::io::BufReader::new(bytes.as_slice())).unwrap();
    let mut writer = tally_proto::backup::BackupWriter::new(Vec::new()).unwrap();
    while let Some(mut chunk) = reader.next_chunk().unwrap() {
        if let Some(tally_proto::v1::backup_chunk::Part::Trailer(trailer)) = &mut chunk.part {
            let digest = trailer
                .sets_digest
                .expect("the trailer carries the sets digest");
            trailer.sets_digest = Some(digest ^ 1);
        }
        writer.write(&chunk).unwrap();
    }
    std::fs::write(altered.join("backup.tally"), writer.into_inner()).unwrap();
    let refused = restore(&altered, &keep.path().join("never-altered"));
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("like sets' and uniques' digest") && why.contains("damaged"),
        "{why}"
    );

    // A fresh cluster: both regions' new nodes restored from the one backup
    // (the us node with --region us; the eu node keeps the backup's region).
    let fresh = tempfile::tempdir().unwrap();
    let mut eu_spec = NodeSpec::new(fresh.path(), "eu", "eu-new");
    let mut us_spec = NodeSpec::new(fresh.path(), "us", "us-new");
    for (spec, region) in [(&eu_spec, None), (&us_spec, Some("us"))] {
        let mut command = Command::new(node_binary());
        command.arg("restore").arg("--from").arg(&backup);
        command.arg("--data-dir").arg(&spec.data_dir);
        if let Some(region) = region {
            command.args(["--region", region]);
        }
        let out = command.output().expect("running tally-node restore");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "restore failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains("into a new replica"), "{said}");
    }
    // A restore never overwrites a data directory.
    let again = restore(&backup, &eu_spec.data_dir);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("not empty"));
    eu_spec.cluster_id = manifest["cluster_id"].as_str().unwrap().into();
    us_spec.cluster_id = eu_spec.cluster_id.clone();
    us_spec.seeds = vec![eu_spec.gossip];
    let new_eu = NodeProcess::start(eu_spec);
    let new_us = NodeProcess::start(us_spec);
    let endpoints = vec![new_eu.endpoint(), new_us.endpoint()];

    rt.block_on(async {
        // Fresh replica ids, never the backed-up one (invariant 3).
        let status = quick_client(&endpoints[0]).await.status().await.unwrap();
        assert_ne!(format!("{:016x}", status.node.replica), old_eu_replica);
        let us_status = quick_client(&endpoints[1]).await.status().await.unwrap();
        assert_ne!(us_status.node.replica, status.node.replica);

        // The backup's values exactly, on both nodes, once they have synced.
        let mut expected = backed_up.clone();
        expected.insert("after:backup".into(), 0);
        wait_values(&endpoints, &expected).await;
        let during = quick_client(&endpoints[0])
            .await
            .get("during:backup")
            .await
            .unwrap();
        println!("during:backup: acked {before_backup} before the backup, {after_backup} by its end; restored {during}");
        assert!(
            (before_backup..=after_backup).contains(&during),
            "the concurrent key restored {during}, outside [{before_backup}, {after_backup}]"
        );
        let mut with_during = expected.clone();
        with_during.insert("during:backup".into(), during);
        wait_values(&endpoints, &with_during).await;

        // The restored cluster takes adds and replicates them.
        quick_client(&endpoints[1])
            .await
            .add("post:1:likes", 4)
            .await
            .unwrap();
        with_during.insert("post:1:likes".into(), backed_up["post:1:likes"] + 4);
        wait_values(&endpoints, &with_during).await;

        // The sets are the backup's, exactly, on both new nodes: no late
        // member, no late unlike, no late viewer.
        let mut expected_sets = backed_up_sets.clone();
        for i in 0..20usize {
            expected_sets.members.insert(format!("late-{i}"), false);
        }
        for endpoint in &endpoints {
            wait_sets(&quick_client(endpoint).await, &expected_sets).await;
        }
    });
    drop((new_eu, new_us));
}
