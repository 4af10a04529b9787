//! Replicated durability in the engine: the wait of a replicated add for its
//! copies, the state the pusher (`gossip/copier.rs`) reports into, and the
//! copy's side of a push (merge, group commit, answer once durable).
//!
//! Invariant: a replicated add is answered only once the core's
//! `replicated_seq` reaches its ticket, and that sequence is published here
//! only from the core after a commit or a confirmed push, never guessed. An
//! add whose copies do not confirm within its deadline gets `UNAVAILABLE`
//! saying how many nodes hold it (never a silent downgrade to `sync`); a
//! copy answers a push only once its own commit holding it is durable. A
//! replicated add in a region with fewer nodes than its copies, or in a
//! partitioned region whose partitions are kept on fewer nodes than its
//! copies, is refused with `FAILED_PRECONDITION` before anything is
//! applied. A key whose partition has too few live holders is parked by
//! the core: its adds wait (and fail `UNAVAILABLE` after their wait), the
//! others go on being answered.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::replica::{CopyPush, CopyRefused, Replica, StorageError};

use super::{now_ms, Engine, EngineError};

/// How long a replicated add waits for its copies when the call carries no
/// deadline (a call's gRPC timeout, less a margin, is used when it does).
pub const REPLICATED_WAIT_DEFAULT: Duration = Duration::from_secs(5);

/// The most copies `--write-copies` may ask for (this node included).
pub const MAX_WRITE_COPIES: usize = 7;

/// The outcome of the last push to the copies, for the error of an add that
/// gave up waiting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyAttempt {
    /// Copies that confirmed the last push (this node not included).
    pub confirmed: usize,
    /// What went wrong with it.
    pub problem: String,
}

/// The engine's part of replicated durability.
pub(super) struct Copies {
    /// Copies asked for, this node included (`--write-copies`).
    write_copies: std::sync::atomic::AtomicUsize,
    /// The nodes of a region that keep each partition
    /// (`--replication-factor`; `usize::MAX` until set: every node keeps
    /// every partition).
    replication_factor: std::sync::atomic::AtomicUsize,
    /// The core's `replicated_seq`, as last published.
    replicated_tx: watch::Sender<u64>,
    /// Wakes the pusher: something is pending for the copies.
    pub(super) wakeup: tokio::sync::Notify,
    /// The last push that failed, cleared by one that succeeds.
    last_failure: Mutex<Option<CopyAttempt>>,
}

impl Copies {
    pub(super) fn new(replicated_seq: u64) -> Self {
        Copies {
            write_copies: std::sync::atomic::AtomicUsize::new(2),
            replication_factor: std::sync::atomic::AtomicUsize::new(usize::MAX),
            replicated_tx: watch::channel(replicated_seq).0,
            wakeup: tokio::sync::Notify::new(),
            last_failure: Mutex::new(None),
        }
    }
}

impl EngineError {
    /// The same error again, for each item of a batch that met it (only
    /// the errors a whole batch can meet at once are repeated exactly).
    pub(super) fn same_again(&self) -> EngineError {
        match self {
            EngineError::CopiesUnconfirmed {
                reached,
                wanted,
                waited_ms,
                problem,
            } => EngineError::CopiesUnconfirmed {
                reached: *reached,
                wanted: *wanted,
                waited_ms: *waited_ms,
                problem: problem.clone(),
            },
            EngineError::StoreFailed(cause) => EngineError::StoreFailed(cause.clone()),
            EngineError::StoreFailing(cause) => EngineError::StoreFailing(cause.clone()),
            _ => EngineError::ShuttingDown,
        }
    }
}

impl Engine {
    /// Sets how many nodes must hold a replicated add (this one included).
    pub fn set_write_copies(&self, copies: usize) {
        self.copies.write_copies.store(
            copies.clamp(1, MAX_WRITE_COPIES),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Sets how many nodes of a region keep each partition.
    pub fn set_replication_factor(&self, factor: usize) {
        self.copies
            .replication_factor
            .store(factor.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    /// How many nodes must hold a replicated add (this one included).
    pub fn write_copies(&self) -> usize {
        self.copies
            .write_copies
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Refuses a replicated add, before anything is applied, when the
    /// region cannot hold `--write-copies` copies of it: this node and the
    /// others of its region that take copies, alive or not, are fewer. (A
    /// region whose nodes are known but down keeps the wait and its
    /// `UNAVAILABLE`: they may come back within the add's deadline.) Taking
    /// the add and then answering that its outcome is unknown would make a
    /// natural retry without its idempotency key count twice.
    pub(super) fn check_region_holds_copies(&self, core: &Replica) -> Result<(), EngineError> {
        let wanted = self.write_copies();
        let region = &core.identity().region;
        let nodes = 1 + core.peers().copy_candidates(region).count();
        if nodes < wanted {
            return Err(EngineError::RegionTooSmall {
                region: region.clone(),
                nodes,
                wanted,
            });
        }
        // A region of more nodes than the factor is partitioned: a key's
        // copies are its partition's holders only (`copy_plan.rs`).
        let factor = self
            .copies
            .replication_factor
            .load(std::sync::atomic::Ordering::Relaxed);
        if nodes > factor && factor < wanted {
            return Err(EngineError::TooFewOwners {
                region: region.clone(),
                nodes,
                factor,
                wanted,
            });
        }
        Ok(())
    }

    /// Waits until the pusher has something to push (or is woken to stop).
    pub async fn copies_wanted(&self) {
        self.copies.wakeup.notified().await;
    }

    /// Wakes the pusher.
    pub fn wake_copier(&self) {
        self.copies.wakeup.notify_one();
    }

    /// Publishes the core's `replicated_seq` (after a commit or a push).
    pub(super) fn publish_replicated(&self, replicated_seq: u64) {
        self.copies.replicated_tx.send_if_modified(|current| {
            let moved = replicated_seq > *current;
            *current = (*current).max(replicated_seq);
            moved
        });
    }

    /// Wakes every replicated add that waits, whether `replicated_seq`
    /// moved or not: a push confirmed parked counters.
    fn wake_replicated_waiters(&self, replicated_seq: u64) {
        self.copies.replicated_tx.send_modify(|current| {
            *current = (*current).max(replicated_seq);
        });
    }

    /// A push to the copies ended (the core knows which counters it
    /// confirmed): wakes the replicated adds that wait, counts it, and
    /// keeps what a failed one reached for the error of an add that gives
    /// up (`failure`; `None` when every counter was confirmed).
    pub fn note_push_ended(&self, failure: Option<CopyAttempt>) {
        let replicated = self.core().replicated_seq();
        self.wake_replicated_waiters(replicated);
        let reason = if failure.is_some() {
            "failed"
        } else {
            "confirmed"
        };
        self.metrics
            .copy_pushes
            .get_or_create(&crate::metrics::ReasonLabels {
                reason: reason.into(),
            })
            .inc();
        let confirmed = failure.is_none();
        *self
            .copies
            .last_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = failure;
        if confirmed {
            // More may have gathered meanwhile.
            self.wake_copier();
        }
    }

    /// A push taken from the core by hand (tests) was confirmed.
    #[cfg(test)]
    pub fn note_copy_done(&self, upto_seq: u64) {
        self.core().handle_push_done(upto_seq);
        self.note_push_ended(None);
    }

    /// Waits until the replicated adds to `keys` up to `ticket` are durable
    /// here and on their copies, at most until `deadline` after `started`
    /// (default [`REPLICATED_WAIT_DEFAULT`]).
    pub(super) async fn wait_replicated(
        &self,
        keys: &[&[u8]],
        ticket: u64,
        started: Instant,
        deadline: Option<Duration>,
    ) -> Result<(), EngineError> {
        let deadline = deadline.unwrap_or(REPLICATED_WAIT_DEFAULT);
        // Durable here first: a failing store answers as in `sync`.
        let remaining = deadline.saturating_sub(started.elapsed());
        match tokio::time::timeout(remaining, self.wait_flushed(ticket)).await {
            Ok(result) => result?,
            Err(_) => return Err(self.copies_unconfirmed(0, started)),
        }
        self.wake_copier();
        let mut replicated = self.copies.replicated_tx.subscribe();
        let remaining = deadline.saturating_sub(started.elapsed());
        let mut health = self.health.subscribe();
        tokio::select! {
            biased;
            reached = tokio::time::timeout(remaining, self.replicated_for(&mut replicated, keys, ticket)) => {
                match reached {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(_)) => Err(EngineError::ShuttingDown),
                    Err(_) => Err(self.copies_unconfirmed(1, started)),
                }
            }
            _ = health.wait_for(|h| matches!(h, super::StoreHealth::Failed(_) | super::StoreHealth::Stopped)) => {
                Err(EngineError::ShuttingDown)
            }
        }
    }

    /// Returns once the core says every one of `keys` is replicated through
    /// `ticket` (a parked key waits for a push that confirms it). The core
    /// is asked outside the watch's lock.
    async fn replicated_for(
        &self,
        replicated: &mut watch::Receiver<u64>,
        keys: &[&[u8]],
        ticket: u64,
    ) -> Result<(), watch::error::RecvError> {
        loop {
            replicated.wait_for(|seq| *seq >= ticket).await?;
            replicated.mark_unchanged();
            if self.keys_replicated(keys, ticket) {
                return Ok(());
            }
            replicated.changed().await?;
        }
    }

    /// Whether the core says every one of `keys` is replicated through
    /// `ticket` (keys were checked as text before they were applied).
    fn keys_replicated(&self, keys: &[&[u8]], ticket: u64) -> bool {
        let core = self.core();
        keys.iter()
            .all(|key| std::str::from_utf8(key).is_ok_and(|key| core.replicated_for(key, ticket)))
    }

    fn copies_unconfirmed(&self, here: usize, started: Instant) -> EngineError {
        let last = self
            .copies
            .last_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let (reached, problem) = match (here, last) {
            (0, _) => (
                0,
                "it was not yet durable on this node's own disk".to_string(),
            ),
            (_, Some(attempt)) => (here + attempt.confirmed, attempt.problem),
            (_, None) => (
                here,
                "the push to the copies was still under way".to_string(),
            ),
        };
        EngineError::CopiesUnconfirmed {
            reached,
            wanted: self.write_copies(),
            waited_ms: started.elapsed().as_millis() as u64,
            problem,
        }
    }

    /// Takes a push from another node of the region, as its copy, and
    /// answers once what it brought is durable here.
    pub async fn serve_copy(&self, push: &CopyPush) -> Result<(), CopyRefused> {
        if let Err(error) = self.check_serving() {
            return Err(CopyRefused::Storage(StorageError(error.to_string())));
        }
        let accepted = self.core().handle_copy_push(now_ms(), &*self.store, push)?;
        for (key, state) in &accepted.changed {
            self.watchers.notify_state(key, state);
        }
        self.metrics
            .merge_changes
            .inc_by(accepted.changed.len() as u64);
        if accepted.durable_at_seq > 0 {
            self.commit_wakeup.notify_one();
            self.wait_flushed(accepted.durable_at_seq)
                .await
                .map_err(|error| CopyRefused::Storage(StorageError(error.to_string())))?;
        }
        self.metrics.copies_taken.inc();
        Ok(())
    }
}
