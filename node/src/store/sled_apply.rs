//! The sled applier: writes batches that are already in the commit log to
//! sled's tree on a thread of its own, so that the next batch is gathered,
//! logged and answered while the last one is still going into the tree.
//!
//! With the commit log, a batch is durable once its log record is synced
//! (`commit_log.rs`); writing it into sled's tree only makes it readable
//! there, and at a million distinct keys that is most of a commit's time
//! (about 17 µs a key, a commit of 250 keys 3-4 ms). Before this, the
//! committer did both in turn, so a commit's sled writes held up the next
//! commit's log write; now they overlap.
//!
//! Invariants:
//! - **Reads see every handed-over batch.** Until a batch is in the tree its
//!   writes wait in the *overlay* (sled key to value, or to a deletion), and
//!   [`Applier::read`] and [`Applier::merge_scan`] answer from it first. The
//!   overlay holds only the one batch not yet in the tree, and is emptied
//!   once the tree holds all of it.
//! - **Order.** Batches go into the tree one at a time, in the order handed
//!   over, each key by key with its durable sequence last (as `batch_ops`
//!   lays it out), so sled recovers a prefix that the log's replay completes.
//!   At most one batch waits: [`Applier::hand_over`] first waits for the one
//!   before to be in the tree.
//! - **Drained before sled is flushed.** [`Applier::drain`] returns once
//!   every batch handed over is in the tree; the store calls it before it
//!   flushes sled (a checkpoint then starts the log over), closes, or writes
//!   outside the log.
//! - **A failed sled write is kept.** The batch was answered from the log,
//!   so it is not lost (the log's replay writes it at the next start), but
//!   the tree is behind: the error is returned by every later hand-over and
//!   drain (the committer then fails stop, as on any store error), and the
//!   overlay keeps what the tree lacks, so reads stay right until then.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use crate::replica::StorageError;

use super::Op;

/// Records read from the tree or merged: (sled key, value), in key order.
type Records = Vec<(Vec<u8>, Vec<u8>)>;

#[derive(Default)]
struct State {
    /// The writes of the batch handed over and not yet in the tree (a value,
    /// or `None` for a deletion); empty when the tree holds every batch.
    overlay: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// A batch is handed over and not yet in the tree.
    writing: bool,
    /// The first sled error met; nothing is written after it.
    failed: Option<String>,
}

struct Shared {
    state: Mutex<State>,
    applied: Condvar,
    /// Taken by the thread around each batch it writes; a test holds it to
    /// keep a batch out of the tree.
    writing: Mutex<()>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The applier thread and the overlay it drains. Dropping it lets the thread
/// finish the batch it holds and joins it (so the tree is released).
pub(super) struct Applier {
    shared: Arc<Shared>,
    jobs: Option<mpsc::Sender<Vec<Op>>>,
    thread: Option<JoinHandle<()>>,
}

impl Applier {
    /// Starts the thread that writes into `db`.
    pub(super) fn start(db: sled::Db) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            applied: Condvar::new(),
            writing: Mutex::new(()),
        });
        let (jobs, received) = mpsc::channel::<Vec<Op>>();
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("tally-sled-apply".into())
                .spawn(move || {
                    for ops in received {
                        write_into(&db, &shared, ops);
                    }
                })?
        };
        Ok(Applier {
            shared,
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// The value `key` will have once the tree holds every batch handed
    /// over, when a batch not in the tree yet writes it: `Some(None)` for a
    /// deletion; `None` when the tree's own value is the one to read.
    pub(super) fn read(&self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let state = self.shared.state();
        state.overlay.get(key).cloned()
    }

    /// Merges the overlay into a range read of the tree: `scan(n)` reads at
    /// most `n` records of `[from, to)` from the tree, in key order; the
    /// result is the first `limit` records of the range as they will be once
    /// every batch handed over is in the tree.
    pub(super) fn merge_scan(
        &self,
        from: &[u8],
        to: &[u8],
        limit: usize,
        scan: impl FnOnce(usize) -> Result<Records, StorageError>,
    ) -> Result<Records, StorageError> {
        // The overlay first: a batch the tree takes meanwhile is then in
        // both, which merges to the same records; one handed over after
        // this may show in part, as beside any key-by-key write.
        let pending: Vec<(Vec<u8>, Option<Vec<u8>>)> = {
            let state = self.shared.state();
            state
                .overlay
                .range(from.to_vec()..to.to_vec())
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect()
        };
        if pending.is_empty() {
            return scan(limit);
        }
        // Each pending deletion may hide one record of the tree's: read that
        // many more, so that `limit` records are left whenever the range
        // holds them. The first `limit` of the merge are then all at or
        // before the last record read, so no record past it is missed.
        let deletions = pending.iter().filter(|(_, value)| value.is_none()).count();
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> =
            scan(limit.saturating_add(deletions))?.into_iter().collect();
        for (key, value) in pending {
            match value {
                Some(value) => merged.insert(key, value),
                None => merged.remove(&key),
            };
        }
        Ok(merged.into_iter().take(limit).collect())
    }

    /// Hands a batch (its operations as `batch_ops` laid them out) to the
    /// thread, once the batch before is in the tree. Reads see it at once.
    /// Refused, handing over nothing, after a sled write failed.
    pub(super) fn hand_over(&self, ops: Vec<Op>) -> Result<(), StorageError> {
        let mut state = self.wait_applied()?;
        for op in &ops {
            let (key, value) = match op {
                Op::Put(key, value) => (key, Some(value.clone())),
                Op::Delete(key) => (key, None),
            };
            state.overlay.insert(key.clone(), value);
        }
        state.writing = true;
        drop(state);
        let sent = self
            .jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(ops).is_ok());
        if !sent {
            let mut state = self.shared.state();
            state.failed = Some("the sled writer thread is gone".into());
            return Err(StorageError(
                "the sled writer thread is gone; the batch is in the commit log and is written at the next start".into(),
            ));
        }
        Ok(())
    }

    /// Waits until every batch handed over is in the tree. Err when a sled
    /// write failed (the tree is behind the log).
    pub(super) fn drain(&self) -> Result<(), StorageError> {
        self.wait_applied().map(drop)
    }

    fn wait_applied(&self) -> Result<MutexGuard<'_, State>, StorageError> {
        let mut state = self.shared.state();
        loop {
            if let Some(error) = &state.failed {
                return Err(StorageError(format!(
                    "writing a logged batch into sled failed ({error}); it is in the commit log and is written at the next start"
                )));
            }
            if !state.writing {
                return Ok(state);
            }
            state = self
                .shared
                .applied
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Keeps the thread from writing the next batch into the tree while the
    /// guard lives.
    #[cfg(test)]
    pub(super) fn hold(&self) -> MutexGuard<'_, ()> {
        self.shared
            .writing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Fails the applier as a sled write error would.
    #[cfg(test)]
    pub(super) fn fail(&self, error: &str) {
        self.shared.state().failed = Some(error.into());
    }
}

impl Drop for Applier {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Writes one batch into the tree, key by key (its durable sequence last),
/// then empties the overlay. Not as one sled batch: sled rolls its IO buffer
/// before and after each (two writes and two `sync_file_range` per commit
/// on its IO threads), and the log's replay completes a prefix anyway.
fn write_into(db: &sled::Db, shared: &Shared, ops: Vec<Op>) {
    let _writing = shared
        .writing
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if shared.state().failed.is_some() {
        return;
    }
    let mut failure = None;
    for op in ops {
        let result = match op {
            Op::Put(key, value) => db.insert(key, value).map(drop),
            Op::Delete(key) => db.remove(key).map(drop),
        };
        if let Err(error) = result {
            failure = Some(error.to_string());
            break;
        }
    }
    let mut state = shared.state();
    match failure {
        // The overlay keeps what the tree lacks.
        Some(error) => state.failed = Some(error),
        None => {
            state.overlay.clear();
            state.writing = false;
        }
    }
    drop(state);
    shared.applied.notify_all();
}

#[cfg(test)]
#[path = "sled_apply_tests.rs"]
mod tests;
