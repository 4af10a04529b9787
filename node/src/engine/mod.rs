//! The engine: the replica core behind a mutex, its store, the group
//! committer, durability waits and `Watch` fan-out. The gRPC services and the
//! anti-entropy loop call the engine; the engine calls the core.
//!
//! Invariant 4 of DESIGN.md is kept here: in `sync` durability an add is
//! answered only once the durable sequence reaches the add's ticket. The lock
//! around the core is held for in-memory work only (plus a store read for a
//! counter that is not cached); writes and flushes run outside it, in the
//! committer, so a hot key costs one short critical section per add.
//!
//! Fail-stop (issue 17): while a commit is failing the node refuses adds and
//! reads (a read could show adds that never become durable); once bounded
//! retries have not helped, the store's health is [`StoreHealth::Failed`]:
//! every waiting add is answered `UNAVAILABLE`, nothing more is served, and
//! the binary exits so that a restart recovers from the durable state. Below
//! the free-space floor ([`disk`]) adds are refused, reads are not.

mod committer;
pub mod disk;
pub mod hot_keys;
pub mod sets;
mod watchers;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use crate::crdt::ValueOutOfRange;
use crate::metrics::Metrics;
use crate::replica::{
    check_key, AddAccepted, AddRefused, AddRequest, ChunkRefused, KeyError, MergeReport, PullChunk,
    PullRefused, PullRequest, RegionPart, Replica, ReplicaConfig, StorageError,
};
use crate::store::Store;

pub use committer::CommitterHandle;
pub use disk::FreeSpaceFloor;
use hot_keys::{HotKey, HotKeys, Op};
use watchers::Watchers;

/// When an add is acknowledged.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// After the group commit holding it is flushed to disk (the default).
    #[default]
    Sync,
    /// As soon as it is applied in memory; a crash may lose the adds of the
    /// last commit interval (about a millisecond under load).
    Async,
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A bad key.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A refused add.
    #[error(transparent)]
    Add(#[from] AddRefused),
    /// A refused like-set or uniques request.
    #[error(transparent)]
    Set(#[from] sets::SetError),
    /// A merged value outside `i64`.
    #[error(transparent)]
    OutOfRange(#[from] ValueOutOfRange),
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The node is stopping.
    #[error("the node is shutting down; retry on another node or after it restarts")]
    ShuttingDown,
    /// A commit failed and is being retried.
    #[error("commits to this node's store are failing ({0}); retry on another node of the region")]
    StoreFailing(Arc<str>),
    /// The store failed for good and the node is stopping (fail-stop).
    #[error("this node's store failed ({0}) and the node is stopping: the outcome of adds that were waiting is unknown; retry them with their idempotency key on another node of the region")]
    StoreFailed(Arc<str>),
    /// The data directory's filesystem is below the free-space floor.
    #[error("disk nearly full on {node}: {free} bytes free, floor {floor} (--min-free-disk); adds resume by themselves once space is freed, reads go on")]
    DiskFull {
        /// The node's name.
        node: String,
        /// Bytes free at the last sample.
        free: u64,
        /// The floor in bytes.
        floor: u64,
    },
}

/// The store's health, as the committer found it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum StoreHealth {
    /// Commits succeed.
    Healthy,
    /// The last commit failed (the cause) and is being retried.
    Failing(Arc<str>),
    /// Retries did not help: the node gave up on its store and stops.
    Failed(Arc<str>),
    /// The committer stopped after its last commit (the node is stopping).
    Stopped,
}

/// A counter read.
#[derive(Clone, Debug)]
pub struct CounterRead {
    /// The value.
    pub value: i64,
    /// The per-region breakdown, when asked for.
    pub regions: Vec<RegionPart>,
}

/// Milliseconds since the Unix epoch: the only clock the engine hands the core.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// See the module documentation.
pub struct Engine {
    core: Mutex<Replica>,
    store: Arc<dyn Store>,
    durability: Durability,
    durable_tx: watch::Sender<u64>,
    commit_wakeup: tokio::sync::Notify,
    watchers: Watchers,
    hot_keys: Mutex<HotKeys>,
    metrics: Arc<Metrics>,
    health: watch::Sender<StoreHealth>,
    disk: std::sync::OnceLock<disk::DiskGuard>,
}

impl Engine {
    /// Recovers the core from `store` and returns the engine (start its
    /// committer with [`Engine::spawn_committer`]).
    pub fn open(
        store: Arc<dyn Store>,
        config: ReplicaConfig,
        durability: Durability,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Engine>, StorageError> {
        let recovered = store.recover(now_ms())?;
        let core = Replica::open(store.identity().clone(), config, recovered, now_ms());
        let (durable_tx, _) = watch::channel(core.durable_seq());
        metrics.durable_seq.set(core.durable_seq() as i64);
        Ok(Arc::new(Engine {
            core: Mutex::new(core),
            store,
            durability,
            durable_tx,
            commit_wakeup: tokio::sync::Notify::new(),
            watchers: Watchers::default(),
            hot_keys: Mutex::new(HotKeys::default()),
            metrics,
            health: watch::channel(StoreHealth::Healthy).0,
            disk: std::sync::OnceLock::new(),
        }))
    }

    /// The core, locked. Keep the guard for in-memory work only.
    pub fn core(&self) -> MutexGuard<'_, Replica> {
        self.core
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wakes the committer: the core has changes to commit (a fold, a retirement).
    pub fn wake_committer(&self) {
        self.commit_wakeup.notify_one();
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The durability mode.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Refuses adds while the filesystem of `dir` has less free space than
    /// `floor` (sampled now and at every housekeeping tick). Set once.
    pub fn watch_disk(&self, dir: std::path::PathBuf, floor: FreeSpaceFloor, node: String) {
        let guard = self
            .disk
            .get_or_init(|| disk::DiskGuard::new(dir, floor, node));
        guard.sample(&self.metrics);
    }

    fn sample_disk(&self) {
        if let Some(guard) = self.disk.get() {
            guard.sample(&self.metrics);
        }
    }

    /// The store's health now.
    pub fn store_health(&self) -> StoreHealth {
        self.health.borrow().clone()
    }

    /// True while commits succeed: what `/readyz` reports.
    pub fn is_ready(&self) -> bool {
        *self.health.borrow() == StoreHealth::Healthy
    }

    /// Waits until the node has given up on its store; returns the cause.
    pub async fn store_failed(&self) -> Arc<str> {
        let mut health = self.health.subscribe();
        loop {
            if let StoreHealth::Failed(cause) = &*health.borrow_and_update() {
                return cause.clone();
            }
            if health.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    fn set_health(&self, health: StoreHealth) {
        self.health.send_if_modified(|current| {
            // A failed store stays failed.
            if matches!(current, StoreHealth::Failed(_)) || *current == health {
                return false;
            }
            *current = health;
            true
        });
    }

    /// Gives up on the store: refuses everything from now on and answers
    /// every waiting add; the binary exits on it.
    fn fail_stop(&self, cause: Arc<str>) {
        self.metrics.storage_failed.set(1);
        let (uncommitted, last_seq) = self.core().uncommitted();
        tracing::error!(
            %cause,
            durable_seq = *self.durable_tx.borrow(),
            last_seq,
            uncommitted_counters = uncommitted,
            "the store failed and retries did not help: this node stops taking adds and serving reads, answers waiting adds UNAVAILABLE, and exits so that a restart recovers from its durable state"
        );
        self.set_health(StoreHealth::Failed(cause));
    }

    /// What was changed in memory but is not durable, when the core's lock is
    /// free: (counters, last sequence handed out).
    pub fn try_uncommitted(&self) -> Option<(usize, u64)> {
        let core = match self.core.try_lock() {
            Ok(core) => core,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(core.uncommitted())
    }

    /// Err unless the store is healthy: reads and adds are served only then.
    fn check_serving(&self) -> Result<(), EngineError> {
        match &*self.health.borrow() {
            StoreHealth::Healthy => Ok(()),
            StoreHealth::Failing(cause) => Err(EngineError::StoreFailing(cause.clone())),
            StoreHealth::Failed(cause) => Err(EngineError::StoreFailed(cause.clone())),
            StoreHealth::Stopped => Err(EngineError::ShuttingDown),
        }
    }

    /// Err when adds must be refused: the store is not healthy, or the disk
    /// is below the floor.
    fn check_adds(&self) -> Result<(), EngineError> {
        self.check_serving()?;
        if let Some(guard) = self.disk.get() {
            guard.check().map_err(|below| EngineError::DiskFull {
                node: below.node,
                free: below.free,
                floor: below.floor,
            })?;
        }
        Ok(())
    }

    /// A receiver of the durable sequence.
    pub fn durable_seq(&self) -> watch::Receiver<u64> {
        self.durable_tx.subscribe()
    }

    /// Adds to one counter and answers once the add is as durable as the mode asks.
    pub async fn add(
        &self,
        key: &[u8],
        delta: i64,
        idempotency_key: Option<&str>,
    ) -> Result<AddAccepted, EngineError> {
        let started = std::time::Instant::now();
        let result = self
            .check_adds()
            .and_then(|()| self.apply_add(key, delta, idempotency_key));
        let accepted = match result {
            Ok(accepted) => accepted,
            Err(error) => {
                self.count_add_error(&error);
                return Err(error);
            }
        };
        self.commit_wakeup.notify_one();
        self.wait_durable(accepted.durable_at_seq).await?;
        self.metrics
            .add_duration
            .observe(started.elapsed().as_secs_f64());
        Ok(accepted)
    }

    /// Adds to many counters under one lock; each add gets its own result.
    pub async fn add_batch<'a>(
        &self,
        adds: impl IntoIterator<Item = (&'a [u8], i64, Option<&'a str>)>,
    ) -> Vec<Result<AddAccepted, EngineError>> {
        let started = std::time::Instant::now();
        let adds: Vec<_> = adds.into_iter().collect();
        let results: Vec<Result<AddAccepted, EngineError>> = if self.check_adds().is_err() {
            // Every item gets the refusal (read again: an error is not Clone).
            adds.iter()
                .map(|_| Err(self.check_adds().err().unwrap_or(EngineError::ShuttingDown)))
                .collect()
        } else {
            // In slices, each with its cold counters read from the store
            // before the lock is taken: a batch of thousands of cold keys
            // held the core lock through every disk read, and every other
            // request waited behind it.
            let mut results = Vec::with_capacity(adds.len());
            for slice in adds.chunks(BATCH_SLICE) {
                self.warm_cold_counters(slice.iter().map(|(key, _, _)| *key));
                let now = now_ms();
                let mut core = self.core();
                results.extend(slice.iter().map(|&(key, delta, idempotency_key)| {
                    self.apply_add_locked(&mut core, now, key, delta, idempotency_key)
                }));
            }
            results
        };
        let ticket = results
            .iter()
            .flatten()
            .map(|accepted| accepted.durable_at_seq)
            .max();
        for result in &results {
            if let Err(error) = result {
                self.count_add_error(error);
            }
        }
        if let Some(ticket) = ticket {
            self.commit_wakeup.notify_one();
            if let Err(error) = self.wait_durable(ticket).await {
                let cause = match error {
                    EngineError::StoreFailed(cause) => Some(cause),
                    _ => None,
                };
                return results
                    .into_iter()
                    .map(|r| {
                        r.and(Err(match &cause {
                            Some(cause) => EngineError::StoreFailed(cause.clone()),
                            None => EngineError::ShuttingDown,
                        }))
                    })
                    .collect();
            }
            self.metrics
                .add_duration
                .observe(started.elapsed().as_secs_f64());
        }
        results
    }

    fn apply_add(
        &self,
        key: &[u8],
        delta: i64,
        idempotency_key: Option<&str>,
    ) -> Result<AddAccepted, EngineError> {
        let now = now_ms();
        let mut core = self.core();
        self.apply_add_locked(&mut core, now, key, delta, idempotency_key)
    }

    /// Reads the counters of `keys` that the core does not hold in memory,
    /// without the core lock, so that the store's cache has them when the
    /// core asks under the lock. Only a warm-up: what the core reads under
    /// the lock is what counts (a record read here could be stale by then).
    fn warm_cold_counters<'a>(&self, keys: impl Iterator<Item = &'a [u8]>) {
        let keys: Vec<&str> = keys.filter_map(|key| check_key(key).ok()).collect();
        let cold: Vec<&str> = {
            let core = self.core();
            keys.into_iter()
                .filter(|key| !core.is_cached(key))
                .collect()
        };
        for key in cold {
            let _ = self.store.load_counter(key);
        }
    }

    fn apply_add_locked(
        &self,
        core: &mut Replica,
        now: u64,
        key: &[u8],
        delta: i64,
        idempotency_key: Option<&str>,
    ) -> Result<AddAccepted, EngineError> {
        let key = check_key(key)?;
        let accepted = core.handle_add(
            now,
            &*self.store,
            AddRequest {
                key,
                delta,
                idempotency_key,
            },
        )?;
        if accepted.duplicate {
            self.metrics.duplicate_adds.inc();
        } else {
            self.metrics.adds.inc();
            self.watchers.notify(key, accepted.value);
            self.record_hot(Op::Add, key);
        }
        Ok(accepted)
    }

    fn record_hot(&self, op: Op, key: &str) {
        let mut hot_keys = self.hot_keys.lock().unwrap_or_else(|p| p.into_inner());
        hot_keys.record(op, key, std::time::Instant::now());
    }

    /// The `limit` hottest keys for adds and for gets right now.
    pub fn hot_keys(&self, limit: usize) -> Vec<HotKey> {
        let mut hot_keys = self.hot_keys.lock().unwrap_or_else(|p| p.into_inner());
        hot_keys.top(limit, std::time::Instant::now())
    }

    fn count_add_error(&self, error: &EngineError) {
        let reason = match error {
            EngineError::Key(_) => "bad_key",
            EngineError::Add(AddRefused::Counter(_)) => "counter",
            EngineError::Add(
                AddRefused::IdempotencyKeyReused(_) | AddRefused::IdempotencyKeyTooLong(_),
            ) => "idempotency_key",
            EngineError::Add(AddRefused::Storage(_)) | EngineError::Storage(_) => "storage",
            EngineError::Add(AddRefused::Fenced(_)) => "fenced",
            EngineError::OutOfRange(_) => "out_of_range",
            EngineError::ShuttingDown => "shutting_down",
            EngineError::StoreFailing(_) | EngineError::StoreFailed(_) => "storage_failed",
            EngineError::DiskFull { .. } => "disk_full",
            EngineError::Set(_) => "set",
        };
        self.metrics
            .add_errors
            .get_or_create(&crate::metrics::ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }

    async fn wait_durable(&self, ticket: u64) -> Result<(), EngineError> {
        if self.durability == Durability::Async {
            return Ok(());
        }
        let mut durable = self.durable_tx.subscribe();
        let mut health = self.health.subscribe();
        tokio::select! {
            biased;
            reached = durable.wait_for(|seq| *seq >= ticket) => {
                reached.map(|_| ()).map_err(|_| EngineError::ShuttingDown)
            }
            ended = health.wait_for(|h| matches!(h, StoreHealth::Failed(_) | StoreHealth::Stopped)) => {
                match ended.as_deref() {
                    Ok(StoreHealth::Failed(cause)) => Err(EngineError::StoreFailed(cause.clone())),
                    _ => Err(EngineError::ShuttingDown),
                }
            }
        }
    }

    /// Waits, while more than `limit` changed counters wait for a commit,
    /// until the next commit is durable. A puller calls it between chunks so
    /// that merges come in commits of about a chunk: sled writes a batch of
    /// a few hundred keys for a third of the cost and half the disk per key
    /// of a batch of thousands.
    pub async fn wait_for_commit_backlog(&self, limit: usize) {
        // Subscribed before looking, so a commit that ends after the look is
        // seen; the counters over the limit guarantee that one comes.
        let mut durable = self.durable_tx.subscribe();
        if self.core().dirty_counters() <= limit {
            return;
        }
        let _ = durable.changed().await;
    }

    /// Reads one counter.
    pub fn get(&self, key: &[u8], breakdown: bool) -> Result<CounterRead, EngineError> {
        let key = check_key(key)?;
        self.check_serving()?;
        self.metrics.gets.inc();
        let mut core = self.core();
        let state = core.handle_get(now_ms(), &*self.store, key)?;
        let regions = if breakdown {
            core.breakdown(&state)
        } else {
            Vec::new()
        };
        drop(core);
        self.record_hot(Op::Get, key);
        Ok(CounterRead {
            value: state.value()?,
            regions,
        })
    }

    /// Subscribes to a counter's value; the receiver holds the current value.
    pub fn watch(
        &self,
        key: &[u8],
    ) -> Result<watch::Receiver<Result<i64, ValueOutOfRange>>, EngineError> {
        let key = check_key(key)?;
        self.check_serving()?;
        let mut core = self.core();
        let state = core.handle_get(now_ms(), &*self.store, key)?;
        Ok(self.watchers.subscribe(key, state.value()))
    }

    /// Serves one chunk of a peer's pull.
    pub fn serve_pull(&self, request: &PullRequest) -> Result<PullChunk, PullRefused> {
        // What the store returns after a failed flush may not be durable.
        if let Err(error) = self.check_serving() {
            return Err(PullRefused::Storage(StorageError(error.to_string())));
        }
        self.core().handle_pull(&*self.store, request)
    }

    /// Serves one chunk of a backup: a pull's chunk, with the durable
    /// sequence and digest read under the same lock, so that the last chunk
    /// of a full scan says exactly which state the backup holds.
    pub fn serve_backup_chunk(
        &self,
        request: &PullRequest,
    ) -> Result<(PullChunk, u64, crate::crdt::StateDigest), PullRefused> {
        let core = self.core();
        let chunk = core.handle_pull(&*self.store, request)?;
        Ok((chunk, core.durable_seq(), core.digest()))
    }

    /// Merges one chunk pulled from `peer` and wakes watchers of what changed.
    pub fn merge_chunk(
        &self,
        peer: crate::crdt::ReplicaId,
        chunk: PullChunk,
    ) -> Result<MergeReport, ChunkRefused> {
        let report = self
            .core()
            .handle_pull_chunk(now_ms(), &*self.store, peer, chunk)?;
        self.metrics
            .merge_changes
            .inc_by(report.changed.len() as u64);
        for (key, state) in &report.changed {
            self.watchers.notify_state(key, state);
        }
        if !report.changed.is_empty() {
            self.commit_wakeup.notify_one();
        }
        for (key, error) in &report.fold_conflicts {
            tracing::error!(peer = %peer, key = %key, %error, "a peer's folded base disagrees with this node's; the counter was left as it is");
        }
        if report.own_slot_raised > 0 {
            tracing::warn!(peer = %peer, counters = report.own_slot_raised, "a peer held more for this replica's own slot than it did: was the data directory restored from an old copy?");
        }
        Ok(report)
    }

    /// Starts the group committer.
    pub fn spawn_committer(
        self: &Arc<Self>,
        on_commit: impl Fn(u64, u64) + Send + Sync + 'static,
    ) -> CommitterHandle {
        committer::spawn(self.clone(), Box::new(on_commit))
    }

    fn publish_durable(&self, seq: u64) {
        self.durable_tx.send_replace(seq);
        self.metrics.durable_seq.set(seq as i64);
    }
}

/// How long the committer sleeps when nothing wakes it (housekeeping interval).
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_millis(100);

/// How many adds of a batch are applied under one hold of the core lock;
/// other requests get the lock between slices.
pub const BATCH_SLICE: usize = 256;

#[cfg(test)]
mod tests;
