//! The group committer: takes every counter changed since the last commit
//! from the core, writes them in one store batch, flushes once, then marks the
//! batch durable, which acknowledges every add waiting on it.
//!
//! One commit is in flight at a time; adds that arrive meanwhile gather for
//! the next one, so the batch grows with the load and a hot key costs one
//! write per flush however many adds it takes. Writes and flushes run on a
//! blocking thread, outside the core's lock.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{now_ms, Engine, HOUSEKEEPING_INTERVAL};

/// How many hot keys per operation the metrics show.
const HOT_KEYS_IN_METRICS: usize = 10;

/// Called after each durable commit with (durable sequence, digest).
pub type OnCommit = Box<dyn Fn(u64, u64) + Send + Sync>;

/// Stops the committer after a last commit.
pub struct CommitterHandle {
    stop_tx: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl CommitterHandle {
    /// Commits whatever is pending, then stops.
    pub async fn shutdown(mut self) {
        if let Some(stop_tx) = self.stop_tx.take() {
            let _ = stop_tx.send(());
        }
        let _ = self.task.await;
    }
}

pub(super) fn spawn(engine: Arc<Engine>, on_commit: OnCommit) -> CommitterHandle {
    let (stop_tx, mut stop_rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        let mut last_housekeeping = Instant::now();
        loop {
            let stopping = tokio::select! {
                _ = engine.commit_wakeup.notified() => false,
                _ = tokio::time::sleep(HOUSEKEEPING_INTERVAL) => false,
                _ = &mut stop_rx => true,
            };
            if last_housekeeping.elapsed() >= HOUSEKEEPING_INTERVAL {
                last_housekeeping = Instant::now();
                housekeeping(&engine);
            }
            commit_all(&engine, &on_commit).await;
            if stopping {
                tracing::info!(
                    durable_seq = *engine.durable_tx.borrow(),
                    "committer stopped after a final commit"
                );
                return;
            }
        }
    });
    CommitterHandle {
        stop_tx: Some(stop_tx),
        task,
    }
}

fn housekeeping(engine: &Engine) {
    let mut core = engine.core();
    core.tick(now_ms());
    engine
        .metrics
        .cached_counters
        .set(core.cached_counters() as i64);
    drop(core);
    engine.watchers.prune();
    engine.metrics.hot_key_rate.clear();
    for hot in engine.hot_keys(HOT_KEYS_IN_METRICS) {
        let labels = crate::metrics::HotKeyLabels {
            op: hot.op.as_str().to_string(),
            key: hot.key.to_string(),
        };
        engine
            .metrics
            .hot_key_rate
            .get_or_create(&labels)
            .set(hot.rate_per_sec);
    }
    if let Some(bytes) = engine.store.size_on_disk() {
        engine.metrics.disk_bytes.set(bytes as i64);
    }
}

/// Commits until the core has nothing more to write.
async fn commit_all(engine: &Arc<Engine>, on_commit: &OnCommit) {
    loop {
        let Some(batch) = engine.core().poll_commit() else {
            return;
        };
        let seq = batch.seq;
        let counters = batch.counters.len();
        let started = Instant::now();
        let store = engine.store.clone();
        let written = tokio::task::spawn_blocking(move || {
            store.write(&batch)?;
            store.flush()
        })
        .await;
        match written {
            Ok(Ok(())) => {
                let digest = {
                    let mut core = engine.core();
                    core.handle_commit_done(seq);
                    core.digest().0
                };
                engine.publish_durable(seq);
                engine.metrics.commits.inc();
                engine
                    .metrics
                    .commit_batch_counters
                    .observe(counters as f64);
                engine
                    .metrics
                    .commit_duration
                    .observe(started.elapsed().as_secs_f64());
                on_commit(seq, digest);
            }
            Ok(Err(error)) => {
                engine.core().handle_commit_failed(seq);
                engine.metrics.commit_errors.inc();
                tracing::error!(seq, %error, "group commit failed; retrying");
                tokio::time::sleep(HOUSEKEEPING_INTERVAL).await;
            }
            Err(join_error) => {
                engine.core().handle_commit_failed(seq);
                engine.metrics.commit_errors.inc();
                tracing::error!(seq, %join_error, "group commit task died; retrying");
                tokio::time::sleep(HOUSEKEEPING_INTERVAL).await;
            }
        }
    }
}
