//! Engine behaviour that the core's tests cannot see: waits on the
//! committer, run against the in-memory store.

use std::sync::Arc;
use std::time::Duration;

use crate::crdt::ReplicaId;
use crate::metrics::Metrics;
use crate::replica::{Identity, ReplicaConfig};
use crate::store::MemoryStore;

use super::{Durability, Engine};

fn engine() -> Arc<Engine> {
    memory_engine(Durability::Async)
}

/// An engine over a fresh in-memory store, with no committer running.
pub(super) fn memory_engine(durability: Durability) -> Arc<Engine> {
    let store = MemoryStore::new(Identity {
        replica: ReplicaId(1),
        region: "eu".into(),
    });
    Engine::open(
        Arc::new(store),
        ReplicaConfig::default(),
        durability,
        Arc::new(Metrics::new()),
    )
    .unwrap()
}

#[tokio::test]
async fn a_puller_waits_for_a_commit_only_while_the_backlog_is_over_the_limit() {
    let engine = engine();
    for i in 0..300 {
        let key = format!("post:{i}:likes");
        engine.add(key.as_bytes(), 1, None).await.unwrap();
    }
    assert_eq!(engine.core().dirty_counters(), 300);
    // At or under the limit there is nothing to wait for.
    tokio::time::timeout(Duration::from_secs(10), engine.wait_for_commit_backlog(300))
        .await
        .expect("no wait at the limit");
    // Over it, only a commit ends the wait: with no committer running, none comes.
    let waiting = tokio::time::timeout(
        Duration::from_millis(200),
        engine.wait_for_commit_backlog(256),
    )
    .await;
    assert!(waiting.is_err(), "returned without a commit");
    let committer = engine.spawn_committer(|_, _| {});
    tokio::time::timeout(Duration::from_secs(10), engine.wait_for_commit_backlog(256))
        .await
        .expect("the commit ends the wait");
    committer.shutdown().await;
    assert_eq!(engine.core().dirty_counters(), 0);
}

/// An engine in `sync` durability over a memory store whose flushes fail or
/// hang when `fault_file` says so.
fn faulty_engine(fault_file: &std::path::Path) -> Arc<Engine> {
    let store = MemoryStore::new(Identity {
        replica: ReplicaId(1),
        region: "eu".into(),
    });
    let store = crate::store::FaultyStore::new(store, fault_file.to_path_buf());
    Engine::open(
        Arc::new(store),
        ReplicaConfig::default(),
        Durability::Sync,
        Arc::new(Metrics::new()),
    )
    .unwrap()
}

/// The bound on a wait that must end (never an expectation of speed).
const GIVE_UP: Duration = Duration::from_secs(30);

#[tokio::test]
async fn waiting_adds_are_answered_unavailable_when_commits_keep_failing() {
    waiting_adds_are_answered_unavailable_when_commits_keep_failing_body().await;
}

/// The same on the multi-thread runtime, where the node runs: the committer
/// task, its blocking write and the add's task run on different threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_adds_are_answered_unavailable_when_commits_keep_failing_multi_thread() {
    waiting_adds_are_answered_unavailable_when_commits_keep_failing_body().await;
}

async fn waiting_adds_are_answered_unavailable_when_commits_keep_failing_body() {
    let dir = tempfile::tempdir().unwrap();
    let fault = dir.path().join("fault");
    let engine = faulty_engine(&fault);
    let committer = engine.spawn_committer(|_, _| {});
    engine.add(b"a", 5, None).await.unwrap();
    std::fs::write(&fault, "fail").unwrap();
    let waiting = tokio::time::timeout(GIVE_UP, engine.add(b"a", 1, None))
        .await
        .expect("a waiting add is answered, not left hanging");
    let error = waiting.unwrap_err();
    assert!(
        matches!(error, super::EngineError::StoreFailed(_)),
        "{error}"
    );
    assert_eq!(
        crate::api::convert::code_of(&error),
        tonic::Code::Unavailable
    );
    assert!(error.to_string().contains("injected fault"), "{error}");
    let cause = tokio::time::timeout(GIVE_UP, engine.store_failed())
        .await
        .unwrap();
    assert!(cause.contains("injected fault"));
    assert!(!engine.is_ready());
    // Nothing is served that could include the add whose commit failed.
    let read = engine.get(b"a", false).unwrap_err();
    assert!(matches!(read, super::EngineError::StoreFailed(_)), "{read}");
    assert!(matches!(
        engine.add(b"b", 1, None).await,
        Err(super::EngineError::StoreFailed(_))
    ));
    assert!(engine.metrics().encode().contains("tally_storage_failed 1"));
    committer.shutdown().await;
}

#[tokio::test]
async fn a_commit_that_hangs_past_the_stall_limit_fails_stop_and_answers_its_waiters() {
    a_commit_that_hangs_past_the_stall_limit_fails_stop_and_answers_its_waiters_body().await;
}

/// The same on the multi-thread runtime, where the node runs: the committer
/// task, its blocking write and the add's task run on different threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_hangs_past_the_stall_limit_fails_stop_and_answers_its_waiters_multi_thread()
{
    a_commit_that_hangs_past_the_stall_limit_fails_stop_and_answers_its_waiters_body().await;
}

async fn a_commit_that_hangs_past_the_stall_limit_fails_stop_and_answers_its_waiters_body() {
    let dir = tempfile::tempdir().unwrap();
    let fault = dir.path().join("fault");
    let engine = faulty_engine(&fault);
    let committer = engine.spawn_committer_stalling_after(Duration::from_secs(1));
    engine.add(b"a", 5, None).await.unwrap();
    std::fs::write(&fault, "hang").unwrap();
    let waiting = tokio::time::timeout(GIVE_UP, engine.add(b"a", 1, None))
        .await
        .expect("the watchdog answers an add whose commit hangs");
    let error = waiting.unwrap_err();
    assert!(
        matches!(error, super::EngineError::StoreFailed(_)),
        "{error}"
    );
    assert!(error.to_string().contains("within 1 s"), "{error}");
    assert!(!engine.is_ready());
    // The disk comes back: the late commit is not taken as a success.
    std::fs::remove_file(&fault).unwrap();
    tokio::time::timeout(GIVE_UP, committer.shutdown())
        .await
        .expect("the committer ends");
    assert!(matches!(
        engine.add(b"b", 1, None).await,
        Err(super::EngineError::StoreFailed(_))
    ));
    assert!(engine.metrics().encode().contains("tally_storage_failed 1"));
}

#[tokio::test]
async fn a_commit_that_fails_for_a_while_is_retried_and_the_node_serves_again() {
    a_commit_that_fails_for_a_while_is_retried_and_the_node_serves_again_body().await;
}

/// The same on the multi-thread runtime, where the node runs: the committer
/// task, its blocking write and the add's task run on different threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_fails_for_a_while_is_retried_and_the_node_serves_again_multi_thread() {
    a_commit_that_fails_for_a_while_is_retried_and_the_node_serves_again_body().await;
}

async fn a_commit_that_fails_for_a_while_is_retried_and_the_node_serves_again_body() {
    let dir = tempfile::tempdir().unwrap();
    let fault = dir.path().join("fault");
    let engine = faulty_engine(&fault);
    let committer = engine.spawn_committer(|_, _| {});
    // Whatever the first commit writes goes in before the disk fails.
    engine.add(b"before", 1, None).await.unwrap();
    std::fs::write(&fault, "fail").unwrap();
    let add = tokio::spawn({
        let engine = engine.clone();
        async move { engine.add(b"a", 1, None).await.map(|a| a.value) }
    });
    let deadline = std::time::Instant::now() + GIVE_UP;
    while !matches!(engine.store_health(), super::StoreHealth::Failing(_)) {
        assert!(std::time::Instant::now() < deadline, "never failing");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!engine.is_ready());
    let read = engine.get(b"a", false).unwrap_err();
    assert!(
        matches!(read, super::EngineError::StoreFailing(_)),
        "{read}"
    );
    std::fs::remove_file(&fault).unwrap();
    let value = tokio::time::timeout(GIVE_UP, add).await.unwrap().unwrap();
    assert_eq!(value.unwrap(), 1, "the retried commit acknowledges the add");
    assert!(engine.is_ready());
    assert_eq!(engine.get(b"a", false).unwrap().value, 1);
    committer.shutdown().await;
}

#[tokio::test]
async fn below_the_disk_floor_adds_are_refused_and_reads_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let engine = faulty_engine(&dir.path().join("no-fault"));
    let committer = engine.spawn_committer(|_, _| {});
    engine.add(b"a", 3, None).await.unwrap();
    let (free, _) = super::disk::disk_space(dir.path()).unwrap();
    let floor = super::FreeSpaceFloor::Bytes(free.saturating_mul(2));
    engine.watch_disk(dir.path().into(), floor, "n1".into());
    let error = engine.add(b"a", 1, None).await.unwrap_err();
    assert_eq!(
        crate::api::convert::code_of(&error),
        tonic::Code::ResourceExhausted
    );
    assert!(
        error.to_string().starts_with("disk nearly full on n1: "),
        "{error}"
    );
    assert_eq!(engine.get(b"a", false).unwrap().value, 3);
    assert!(engine.is_ready(), "reads are served: the node stays ready");
    committer.shutdown().await;
}

/// An engine in `sync` durability with a committer, over a memory store.
fn committed_engine() -> (Arc<Engine>, super::CommitterHandle) {
    let store = MemoryStore::new(Identity {
        replica: ReplicaId(1),
        region: "eu".into(),
    });
    let engine = Engine::open(
        Arc::new(store),
        ReplicaConfig::default(),
        Durability::Sync,
        Arc::new(Metrics::new()),
    )
    .unwrap();
    let committer = engine.spawn_committer(|_, _| {});
    (engine, committer)
}

/// Makes the engine's region ("eu") hold `others` more nodes that take
/// copies, all down: known, so replicated adds are taken and wait for them.
fn region_has_down_nodes(engine: &Engine, others: u64) {
    let mut core = engine.core();
    let protocol = core.peers().own_protocol();
    let members = (0..others)
        .map(|i| crate::replica::Member {
            replica: ReplicaId(100 + i),
            region: "eu".into(),
            node_name: format!("eu-{}", 2 + i),
            grpc_addr: format!("127.0.0.1:{}", 1 + i),
            alive: false,
            protocol,
            ..Default::default()
        })
        .collect();
    core.peers_mut().handle_membership(members);
}

#[tokio::test]
async fn a_replicated_add_in_a_region_too_small_for_its_copies_is_refused_before_it_is_applied() {
    let (engine, committer) = committed_engine();
    engine.set_write_copies(3);
    region_has_down_nodes(&engine, 1);
    let started = std::time::Instant::now();
    let error = engine
        .add_as(b"votes", 1, Some("vote-1"), Durability::Replicated, None)
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused at once, not after the wait for copies"
    );
    assert!(
        matches!(
            error,
            super::EngineError::RegionTooSmall {
                nodes: 2,
                wanted: 3,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        crate::api::convert::code_of(&error),
        tonic::Code::FailedPrecondition
    );
    let text = error.to_string();
    assert!(
        text.contains("needs 3 nodes in region eu") && text.contains("knows 2 there"),
        "{text}"
    );
    // Nothing was applied, not even the idempotency key's record.
    assert_eq!(engine.get(b"votes", false).unwrap().value, 0);
    let batch = engine
        .add_batch(
            [
                (&b"likes"[..], 1, None, None),
                (&b"votes"[..], 1, None, Some(Durability::Replicated)),
            ],
            None,
        )
        .await;
    assert!(batch[0].is_ok(), "{:?}", batch[0]);
    assert!(
        matches!(batch[1], Err(super::EngineError::RegionTooSmall { .. })),
        "{:?}",
        batch[1]
    );
    let sync = engine.add(b"votes", 1, Some("vote-1")).await.unwrap();
    assert!(!sync.duplicate, "the refused add left no record");
    assert_eq!(sync.value, 1);
    committer.shutdown().await;
}

#[tokio::test]
async fn a_replicated_add_in_a_region_keeping_partitions_on_too_few_nodes_is_refused() {
    let (engine, committer) = committed_engine();
    engine.set_write_copies(3);
    engine.set_replication_factor(2);
    // Four nodes, each partition on two: a third copy would sit on a node
    // that does not hold the key's partition.
    region_has_down_nodes(&engine, 3);
    let error = engine
        .add_as(b"votes", 1, Some("vote-1"), Durability::Replicated, None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            super::EngineError::TooFewOwners {
                nodes: 4,
                factor: 2,
                wanted: 3,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        crate::api::convert::code_of(&error),
        tonic::Code::FailedPrecondition
    );
    let text = error.to_string();
    assert!(
        text.contains("--replication-factor 2") && text.contains("nothing was applied"),
        "{text}"
    );
    assert_eq!(engine.get(b"votes", false).unwrap().value, 0);
    // A factor that covers the copies, or a region no larger than it, takes
    // the add (it then waits for its copies).
    engine.set_replication_factor(4);
    assert!(engine.check_region_holds_copies(&engine.core()).is_ok());
    engine.set_replication_factor(3);
    assert!(engine.check_region_holds_copies(&engine.core()).is_ok());
    committer.shutdown().await;
}

#[tokio::test]
async fn a_replicated_add_without_copies_fails_unavailable_naming_what_it_reached() {
    let (engine, committer) = committed_engine();
    engine.set_write_copies(3);
    region_has_down_nodes(&engine, 2);
    let error = engine
        .add_as(
            b"votes",
            1,
            Some("vote-1"),
            Durability::Replicated,
            Some(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    match &error {
        super::EngineError::CopiesUnconfirmed {
            reached, wanted, ..
        } => assert_eq!((*reached, *wanted), (1, 3)),
        other => panic!("not a copies error: {other:?}"),
    }
    assert_eq!(
        crate::api::convert::code_of(&error),
        tonic::Code::Unavailable
    );
    let text = error.to_string();
    assert!(
        text.contains("only 1 of the 3 copies") && text.contains("same idempotency key"),
        "{text}"
    );
    // A sync add is not held up by the copies.
    engine.add(b"likes", 1, None).await.unwrap();
    // The outcome was unknown: the copy confirms later, and the retry with
    // the same key is answered as a duplicate, counted once.
    let retry = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .add_as(b"votes", 1, Some("vote-1"), Durability::Replicated, None)
                .await
        })
    };
    let push = loop {
        if let Some(push) = engine.core().poll_push() {
            break push;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    engine.note_copy_done(push.upto_seq);
    // The first push may predate the retry's commit: confirm until it is answered.
    let accepted = loop {
        if retry.is_finished() {
            break retry.await.unwrap().unwrap();
        }
        // (The core's guard must be gone before the push is confirmed.)
        let push = engine.core().poll_push();
        if let Some(push) = push {
            engine.note_copy_done(push.upto_seq);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(accepted.duplicate);
    assert_eq!(engine.get(b"votes", false).unwrap().value, 1);
    committer.shutdown().await;
}

#[tokio::test]
async fn a_batch_waits_for_copies_only_for_its_replicated_items() {
    let (engine, committer) = committed_engine();
    region_has_down_nodes(&engine, 1);
    let results = engine
        .add_batch(
            [
                (&b"likes"[..], 1, None, None),
                (&b"votes"[..], 1, None, Some(Durability::Replicated)),
            ],
            Some(Duration::from_millis(200)),
        )
        .await;
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert!(
        matches!(
            results[1],
            Err(super::EngineError::CopiesUnconfirmed { reached: 1, .. })
        ),
        "{:?}",
        results[1]
    );
    committer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_are_durable_when_answered_on_the_multi_thread_runtime() {
    let (engine, committer) = committed_engine();
    for i in 1..=200 {
        let accepted = tokio::time::timeout(GIVE_UP, engine.add(b"hot", 1, None))
            .await
            .expect("an add is answered")
            .unwrap();
        assert_eq!(accepted.value, i);
        assert!(*engine.synced_tx.borrow() >= accepted.durable_at_seq);
    }
    committer.shutdown().await;
    assert_eq!(engine.core().dirty_counters(), 0);
}

/// Whether the committer has a wake-up waiting (it would commit at once).
async fn committer_woken(engine: &Engine) -> bool {
    tokio::select! {
        biased;
        _ = engine.commit_wakeup.notified() => true,
        _ = std::future::ready(()) => false,
    }
}

#[tokio::test]
async fn a_merge_that_changes_only_like_sets_wakes_the_committer() {
    // Before, only merged counters and records woke it: members merged from
    // another region waited for the housekeeping tick to become durable.
    let engine = engine();
    assert!(!committer_woken(&engine).await);
    let chunk = crate::replica::PullChunk {
        source: ReplicaId(2),
        deltas: vec![crate::replica::SetDelta::Likes {
            key: "post".into(),
            members: vec![("sam".into(), 1)],
        }],
        deltas_next: Some(crate::replica::DeltaCursor::default()),
        complete: true,
        deltas_complete: true,
        records_complete: true,
        ..Default::default()
    };
    let report = engine.merge_chunk(ReplicaId(2), chunk.clone()).unwrap();
    assert_eq!(report.set_elements_changed, 1);
    assert!(committer_woken(&engine).await);
    // The same again changes nothing and wakes nothing.
    let report = engine.merge_chunk(ReplicaId(2), chunk).unwrap();
    assert_eq!(report.set_elements_changed, 0);
    assert!(!committer_woken(&engine).await);
}
