//! Holding adds after a restart (issue 13), with real processes: a node
//! whose replica id the others retired while it was down is restarted on
//! its old data directory. Until a peer's fold report tells it that it is
//! retired it must not acknowledge an add (a retired writer's slot may
//! already be folded, and an add to it would be lost or counted twice), so
//! it holds adds with UNAVAILABLE; once it hears, it fences itself (adds get
//! FAILED_PRECONDITION, telling the operator to wipe it) and its directory
//! refuses the next start. The restart happens while its peers are down (a
//! partition at restart): with a peer reachable, the start's wait on gossip
//! already lets it hear before it serves. A hold may also end on the report
//! of a peer that has not heard of the retirement yet; the last test checks
//! that the adds taken then are not lost to the fold.

mod common;

use std::time::{Duration, Instant};

use common::load::quick_client;
use common::NodeProcess;
use prost::bytes::Bytes;
use tally_proto::v1::counters_client::CountersClient;
use tally_proto::v1::AddRequest;
use tonic::Code;

const LIMIT: Duration = Duration::from_secs(120);
const KEY: &str = "post:1:likes";

fn start_cluster(root: &std::path::Path, restart_hold: &str) -> Vec<NodeProcess> {
    common::start_three_regions(
        root,
        &[
            "--retire-after",
            "1000h",
            "--cluster-version-upgrade",
            "auto",
            "--restart-hold",
            restart_hold,
        ],
    )
}

/// What the restarted node answered to the adds sent to it from the moment
/// it listened until it fenced itself.
#[derive(Debug, Default)]
struct Answers {
    acknowledged: usize,
    held: usize,
    /// Adds sent whose answer was lost (a dropped connection): they may or
    /// may not have been applied.
    unknown: usize,
    fenced_message: String,
}

/// Sends adds to `endpoint` one after another (connecting again while it is
/// down) until one is refused as fenced.
async fn hammer(endpoint: String) -> Answers {
    let started = Instant::now();
    let mut answers = Answers::default();
    let mut raw = None;
    while started.elapsed() < LIMIT {
        if raw.is_none() {
            raw = CountersClient::connect(endpoint.clone()).await.ok();
            if raw.is_none() {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
        }
        let request = AddRequest {
            key: Bytes::from_static(KEY.as_bytes()),
            delta: 1,
            ..Default::default()
        };
        match raw.as_mut().unwrap().add(request).await {
            Ok(_) => answers.acknowledged += 1,
            Err(status) if status.code() == Code::FailedPrecondition => {
                answers.fenced_message = status.message().to_string();
                return answers;
            }
            Err(status) if status.code() == Code::Unavailable => {
                if status.message().contains("holds adds") {
                    answers.held += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                } else {
                    // Not listening yet, or the connection dropped.
                    answers.unknown += 1;
                    raw = None;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            Err(status) => panic!("unexpected answer to an add: {status:?}"),
        }
    }
    panic!("the restarted node never fenced itself: {answers:?}");
}

/// A three-region cluster in which eu can retire ap: its data, its nodes,
/// their endpoints, a client of eu, ap's replica id and when ap's adds
/// reached eu.
type Started = (
    tempfile::TempDir,
    Vec<NodeProcess>,
    Vec<String>,
    tally_client::Client,
    u64,
    Instant,
);

/// Starts eu, us and ap with `--restart-hold restart_hold`, waits for
/// cluster version 4 (retirements travel in fold reports from it), and has
/// ap write until eu holds its adds (retiring needs a known id).
async fn start_with_ap_known_at_eu(restart_hold: &'static str) -> Started {
    let root = tempfile::tempdir().unwrap();
    let nodes = tokio::task::spawn_blocking({
        let root = root.path().to_path_buf();
        move || start_cluster(&root, restart_hold)
    })
    .await
    .unwrap();
    let endpoints: Vec<String> = nodes.iter().map(NodeProcess::endpoint).collect();
    let waited = endpoints.clone();
    tokio::task::spawn_blocking(move || common::wait_cluster_version(&waited, 4, LIMIT))
        .await
        .unwrap();
    let ap = quick_client(&endpoints[2]).await;
    for _ in 0..5 {
        ap.add(KEY, 1).await.unwrap();
    }
    let ap_id = ap.status().await.unwrap().node.replica;
    let eu = quick_client(&endpoints[0]).await;
    let started = Instant::now();
    while eu.get(KEY).await.ok() != Some(5) {
        assert!(started.elapsed() < LIMIT, "eu never saw ap's adds");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (root, nodes, endpoints, eu, ap_id, started)
}

/// The whole scenario with `--restart-hold restart_hold`; returns what the
/// retired node answered after its restart.
async fn restart_a_retired_node(restart_hold: &'static str) -> Answers {
    let (_root, nodes, endpoints, eu, ap_id, started) =
        start_with_ap_known_at_eu(restart_hold).await;
    // Bad retirements are refused with a status that says why, and change
    // nothing: a live replica, eu's own id, an id nobody knows.
    let eu_id = eu.status().await.unwrap().node.replica;
    for (id, code, words) in [
        (ap_id, tally_client::Code::FailedPrecondition, "is alive"),
        (eu_id, tally_client::Code::InvalidArgument, "own replica id"),
        (0x1234, tally_client::Code::InvalidArgument, "no replica"),
    ] {
        let refused = eu.retire(id).await.expect_err("a bad retirement was taken");
        assert_eq!(refused.code(), Some(code), "{refused}");
        assert!(refused.to_string().contains(words), "{refused}");
    }
    assert!(eu.status().await.unwrap().retired.is_empty());
    // ap goes down; eu retires it once failure detection agrees it is down.
    let mut nodes = tokio::task::spawn_blocking(move || {
        let mut nodes = nodes;
        nodes[2].stop();
        nodes
    })
    .await
    .unwrap();
    loop {
        match eu.retire(ap_id).await {
            Ok(_) => break,
            Err(error) => {
                assert!(
                    started.elapsed() < LIMIT,
                    "ap's id was never retired: {error}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    // us learns the retirement from eu's report.
    let us = quick_client(&endpoints[1]).await;
    loop {
        let status = us.status().await.unwrap();
        if status.retired.iter().any(|writer| writer.replica == ap_id) {
            break;
        }
        assert!(started.elapsed() < LIMIT, "us never learned the retirement");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // eu and us go down too, so that ap restarts with no peer to hear from
    // (a partition at restart): the window in which, without the hold, it
    // takes adds. Adds go to ap from its first moment.
    // While held, ap is not ready (/readyz), so it restarts on a thread of
    // its own while eu comes back.
    let hammering = tokio::spawn(hammer(endpoints[2].clone()));
    let (mut ap, mut eu_node) = tokio::task::spawn_blocking(move || {
        nodes[0].stop();
        nodes[1].stop();
        let ap = nodes.pop().unwrap();
        (ap, nodes.swap_remove(0))
    })
    .await
    .unwrap();
    let ap_restart = tokio::task::spawn_blocking(move || {
        ap.restart();
        ap
    });
    // ap runs a while alone, then eu comes back and gossip reaches ap.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let eu_node = tokio::task::spawn_blocking(move || {
        eu_node.restart();
        eu_node
    });
    let mut ap = ap_restart.await.unwrap();
    let _eu_node = eu_node.await.unwrap();
    let answers = hammering.await.unwrap();
    // The retirement is durable: the directory refuses the next start.
    let refused = tokio::task::spawn_blocking(move || {
        ap.stop();
        ap.try_restart()
    })
    .await
    .unwrap();
    let error = refused.expect_err("a retired directory started again");
    assert!(error.contains("retired"), "{error}");
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_retired_while_down_acknowledges_no_add_before_it_fences_itself() {
    let answers = restart_a_retired_node("60s").await;
    println!("with the hold: {answers:?}");
    assert_eq!(
        answers.acknowledged, 0,
        "a retired node acknowledged adds after its restart: {answers:?}"
    );
    assert!(answers.held > 0, "no add was held: {answers:?}");
    assert!(
        answers.fenced_message.contains("wipe its data directory"),
        "{answers:?}"
    );
}

/// The same with the hold off: shows the window the hold closes (how many
/// adds a retired node acknowledges before it hears). Run by hand:
/// `cargo test -p tally-node --test restart_hold -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn without_the_hold_a_retired_node_acknowledges_adds_before_it_hears() {
    let answers = restart_a_retired_node("0s").await;
    println!("without the hold: {answers:?}");
    assert!(answers.acknowledged > 0, "{answers:?}");
}

/// The scenario of the restart hold's gap (issue 13), end to end. ap is
/// retired by eu while ap and us are down, so only eu knows. ap restarts
/// while eu is down and hears us, which has not heard of the retirement:
/// its hold ends on us's report and it acknowledges adds. eu comes back, ap
/// fences itself, ap is folded, and every acknowledged add is in eu's and
/// us's totals. eu and us pull slowly (`--sync-interval 3s`), which widens
/// the window in which they hold the same state of ap's slots without its
/// last adds; folding ap then would lose them. Real processes seldom hit
/// that window (ap hears of its retirement about when us does; this test
/// passed in two runs without the rule), so the unit tests
/// `a_retired_writer_that_came_back_is_folded_only_at_the_state_it_fenced_itself_at`
/// (replica/retire_tests.rs) and `a_retired_writer_seen_up_is_...`
/// (replica/folds_tests.rs) force it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_taken_after_a_hold_ended_on_a_peer_that_had_not_heard_are_not_lost() {
    let (_root, nodes, endpoints, eu, ap_id, started) = start_with_ap_known_at_eu("60s").await;
    // ap and us go down; eu retires ap, then goes down too.
    let nodes = tokio::task::spawn_blocking(move || {
        let mut nodes = nodes;
        nodes[2].stop();
        nodes[1].stop();
        nodes
    })
    .await
    .unwrap();
    while let Err(error) = eu.retire(ap_id).await {
        assert!(started.elapsed() < LIMIT, "ap was never retired: {error}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut nodes = tokio::task::spawn_blocking(move || {
        let mut nodes = nodes;
        nodes[0].stop();
        // Each node seeds from the other two (eu is down), and eu and us
        // pull every 3 s.
        let gossip: Vec<_> = nodes.iter().map(|node| node.spec.gossip).collect();
        for (index, node) in nodes.iter_mut().enumerate() {
            node.spec.seeds = gossip
                .iter()
                .enumerate()
                .filter(|(other, _)| *other != index)
                .map(|(_, addr)| *addr)
                .collect();
        }
        nodes[0].spec.sync_interval = "3s";
        nodes[1].spec.sync_interval = "3s";
        nodes
    })
    .await
    .unwrap();
    // us and ap come back together; each ends its hold on the other's
    // report, and neither knows of the retirement.
    let hammering = tokio::spawn(hammer(endpoints[2].clone()));
    let mut ap_node = nodes.pop().unwrap();
    let mut us_node = nodes.pop().unwrap();
    let mut eu_node = nodes.pop().unwrap();
    let ap_restart = tokio::task::spawn_blocking(move || {
        ap_node.restart();
        ap_node
    });
    let us_node = tokio::task::spawn_blocking(move || {
        us_node.restart();
        us_node
    });
    let ap_node = ap_restart.await.unwrap();
    let _us_node = us_node.await.unwrap();
    let ap = quick_client(&endpoints[2]).await;
    while ap.get(KEY).await.unwrap_or(0) < 50 {
        assert!(started.elapsed() < LIMIT, "ap acknowledged no add");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // eu comes back: ap hears of its retirement and fences itself.
    let _eu_node = tokio::task::spawn_blocking(move || {
        eu_node.restart();
        eu_node
    })
    .await
    .unwrap();
    let answers = hammering.await.unwrap();
    println!("ap after its restart: {answers:?}");
    assert!(answers.acknowledged > 0, "{answers:?}");
    // ap is folded at eu and us, and each holds every acknowledged add.
    let least = 5 + answers.acknowledged as i64;
    let most = least + answers.unknown as i64;
    for endpoint in &endpoints[..2] {
        let client = quick_client(endpoint).await;
        loop {
            let status = client.status().await.unwrap();
            let writer = status.retired.iter().find(|w| w.replica == ap_id);
            let value = client.get(KEY).await.unwrap();
            if writer.is_some_and(|w| w.folded_epoch > 0) && (least..=most).contains(&value) {
                break;
            }
            assert!(
                started.elapsed() < LIMIT * 2,
                "{endpoint}: ap's fold {writer:?}, value {value}, acknowledged {least}..={most}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    drop(ap_node);
}
