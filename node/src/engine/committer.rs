//! The group committer: takes every counter changed since the last commit
//! from the core, writes them in one store batch and flushes once. The adds
//! waiting on the batch are answered as soon as the store says it is durable
//! ([`Store::commit_then`](crate::store::Store::commit_then): with the commit
//! log, once the log is synced and before sled's tree takes the batch, which
//! the store's own thread then writes while the next batch is gathered,
//! `store/sled_apply.rs`); the core then marks the batch durable, which
//! gossip and pulls read.
//!
//! One commit is in flight at a time; adds that arrive meanwhile gather for
//! the next one, so the batch grows with the load and a hot key costs one
//! write per flush however many adds it takes. Writes and flushes run on a
//! blocking thread, outside the core's lock.
//!
//! A failed commit is retried a bounded number of times ([`COMMIT_ATTEMPTS`],
//! with a doubling pause); the store is `Failing` meanwhile. When the retries
//! do not help, or one commit does not finish within [`COMMIT_STALL_LIMIT`],
//! or the committer itself dies, the engine fails stop: no commit after that,
//! and every waiter is answered. (sled 0.34 keeps the first IO error it meets,
//! so a retry in the same process rarely helps it: a restart does.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{now_ms, Engine, StoreHealth, HOUSEKEEPING_INTERVAL};

/// Attempts at one commit (the first and the retries) before failing stop.
pub const COMMIT_ATTEMPTS: u32 = 4;
/// The longest one commit's write and flush may take before failing stop.
pub const COMMIT_STALL_LIMIT: Duration = Duration::from_secs(60);

/// Fails the engine stop if the committer ends without saying it stopped
/// cleanly (a panic in the task), so that no waiter hangs forever.
struct DiesLoudly {
    engine: Arc<Engine>,
    clean: bool,
}

impl Drop for DiesLoudly {
    fn drop(&mut self) {
        if self.clean {
            self.engine.set_health(StoreHealth::Stopped);
        } else {
            self.engine
                .fail_stop("the group committer stopped unexpectedly".into());
        }
    }
}

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

pub(super) fn spawn(
    engine: Arc<Engine>,
    on_commit: OnCommit,
    stall_limit: Duration,
) -> CommitterHandle {
    let (stop_tx, mut stop_rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        let mut guard = DiesLoudly {
            engine: engine.clone(),
            clean: false,
        };
        let mut last_housekeeping = Instant::now();
        let mut failures = 0;
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
            if let Err(cause) = commit_all(&engine, &on_commit, &mut failures, stall_limit).await {
                engine.fail_stop(cause);
                guard.clean = true;
                return;
            }
            if stopping {
                tracing::info!(
                    durable_seq = *engine.durable_tx.borrow(),
                    "committer stopped after a final commit"
                );
                guard.clean = true;
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
    engine
        .metrics
        .idempotency_records
        .set(core.idempotency_records() as i64);
    engine
        .metrics
        .idempotency_capacity
        .set(core.config().idempotency_capacity as i64);
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
    if let Some(counters) = engine.store.counters_stored() {
        engine.metrics.counters_stored.set(counters as i64);
    }
    engine.sample_disk();
}

/// Commits until the core has nothing more to write. Err with the cause
/// when the store failed for good.
/// `failures` counts the failed attempts since the last commit that
/// succeeded (kept across calls: a retried batch may wait for a tick).
/// A commit that takes longer than `stall_limit` ([`COMMIT_STALL_LIMIT`])
/// fails stop.
async fn commit_all(
    engine: &Arc<Engine>,
    on_commit: &OnCommit,
    failures: &mut u32,
    stall_limit: Duration,
) -> Result<(), Arc<str>> {
    loop {
        let Some(batch) = engine.core().poll_commit() else {
            return Ok(());
        };
        let seq = batch.seq;
        let counters = batch.counters.len();
        for (_, state) in &batch.counters {
            engine
                .metrics
                .slots_per_key
                .observe(state.slots().len() as f64);
        }
        let started = Instant::now();
        let store = engine.store.clone();
        let synced = engine.clone();
        let recovering = *failures > 0;
        let task = tokio::task::spawn_blocking(move || {
            // Adds are answered from the moment the batch is durable; a
            // commit that succeeds after failures makes the node healthy
            // again first, so that an answered caller finds it serving.
            store.commit_then(&batch, &|| {
                if recovering {
                    synced.set_health(StoreHealth::Healthy);
                }
                synced.publish_synced(seq);
            })
        });
        let cause: Arc<str> = match tokio::time::timeout(stall_limit, task).await {
            Ok(Ok(Ok(()))) => {
                let (digest, replicated, copies_pending) = {
                    let mut core = engine.core();
                    core.handle_commit_done(seq);
                    let pending = core.copies_pending().0 > 0;
                    (core.digest().0, core.replicated_seq(), pending)
                };
                engine.publish_durable(seq);
                engine.publish_replicated(replicated);
                if copies_pending {
                    engine.wake_copier();
                }
                engine.metrics.commits.inc();
                engine
                    .metrics
                    .commit_batch_counters
                    .observe(counters as f64);
                let took = started.elapsed();
                engine.metrics.commit_duration.observe(took.as_secs_f64());
                engine
                    .metrics
                    .commit_micros_total
                    .inc_by(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
                on_commit(seq, digest);
                if *failures > 0 {
                    tracing::info!(seq, failures = *failures, "a group commit succeeded again");
                    *failures = 0;
                    engine.set_health(StoreHealth::Healthy);
                }
                continue;
            }
            Ok(Ok(Err(error))) => error.to_string().into(),
            Ok(Err(join_error)) => format!("the commit task died: {join_error}").into(),
            Err(_) => {
                // The write may still land: no retry beside it, fail stop now.
                engine.core().handle_commit_failed(seq);
                engine.metrics.commit_errors.inc();
                return Err(format!(
                    "a group commit did not finish writing and flushing within {} s (is the disk hung?)",
                    stall_limit.as_secs()
                )
                .into());
            }
        };
        engine.core().handle_commit_failed(seq);
        engine.metrics.commit_errors.inc();
        *failures += 1;
        if *failures >= COMMIT_ATTEMPTS {
            tracing::error!(seq, attempts = *failures, %cause, "group commit failed; giving up");
            return Err(cause);
        }
        let pause = HOUSEKEEPING_INTERVAL * 2u32.pow(*failures - 1);
        tracing::error!(seq, attempt = *failures, %cause, retry_in_ms = pause.as_millis() as u64, "group commit failed; refusing adds and reads while retrying");
        engine.set_health(StoreHealth::Failing(cause));
        tokio::time::sleep(pause).await;
    }
}
