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
    let store = MemoryStore::new(Identity {
        replica: ReplicaId(1),
        region: "eu".into(),
    });
    Engine::open(
        Arc::new(store),
        ReplicaConfig::default(),
        Durability::Async,
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
