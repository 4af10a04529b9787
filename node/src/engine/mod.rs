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

mod adds;
mod committer;
pub mod disk;
pub mod hot_keys;
mod likes;
mod replicated;
pub mod sets;
mod watchers;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use crate::crdt::{FoldedBase, ValueOutOfRange};
use crate::metrics::Metrics;
use crate::replica::{
    check_key, AddRefused, ChunkRefused, KeyError, MergeReport, PullChunk, PullRefused,
    PullRequest, RegionPart, Replica, ReplicaConfig, StorageError, WriterSlot,
};
use crate::store::Store;

pub use committer::CommitterHandle;
pub use disk::FreeSpaceFloor;
use hot_keys::{HotKey, HotKeys, Op};
pub use likes::LikeItem;
pub use replicated::{CopyAttempt, MAX_WRITE_COPIES, REPLICATED_WAIT_DEFAULT};
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
    /// After it is flushed to disk here and on the copies of the region
    /// (`--write-copies`, this node included): a lost disk loses nothing
    /// that was acknowledged.
    Replicated,
}

impl Durability {
    /// The stronger of two modes (async < sync < replicated): what an add
    /// gets when the request asks for one and the node's default is another.
    pub fn stronger(self, other: Durability) -> Durability {
        let rank = |mode| match mode {
            Durability::Async => 0,
            Durability::Sync => 1,
            Durability::Replicated => 2,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
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
    /// The add is durable here, but too few copies confirmed it in time.
    #[error("the add is on this node's disk, but only {reached} of the {wanted} copies that replicated durability asks for (--write-copies, this node included) confirmed it within {waited_ms} ms ({problem}); its outcome is unknown: retry it with the same idempotency key, here or on another node of the region")]
    CopiesUnconfirmed {
        /// Nodes that hold it durably: this one and the copies that confirmed.
        reached: usize,
        /// Nodes asked for (`--write-copies`).
        wanted: usize,
        /// How long the add waited for its copies.
        waited_ms: u64,
        /// What the last push to the copies met.
        problem: String,
    },
    /// A replicated add in a region with fewer nodes that take copies
    /// than `--write-copies` asks for: refused before anything is applied.
    #[error("replicated durability needs {wanted} nodes in region {region} (--write-copies {wanted}, this node included), but this node knows {nodes} there that take copies (itself included); nothing was applied: add nodes to the region, start this node with a lower --write-copies, or add with sync durability")]
    RegionTooSmall {
        /// The node's region.
        region: String,
        /// The region's nodes that take copies, this one included (alive or not).
        nodes: usize,
        /// Nodes asked for (`--write-copies`).
        wanted: usize,
    },
    /// A replicated add in a partitioned region (more nodes than the
    /// replication factor) whose partitions are each kept on fewer nodes
    /// than `--write-copies` asks for: refused before anything is applied
    /// (a copy goes only to a node holding the key's partition).
    #[error("replicated durability needs {wanted} nodes holding each key (--write-copies {wanted}, this node included), but region {region} has {nodes} nodes and keeps each partition on {factor} of them (--replication-factor {factor}); a copy on a node that does not hold the key's partition would not be kept; nothing was applied: raise --replication-factor to at least {wanted}, start this node with a lower --write-copies, or add with sync durability")]
    TooFewOwners {
        /// The node's region.
        region: String,
        /// The region's nodes that take copies, this one included (alive or not).
        nodes: usize,
        /// The cluster's replication factor.
        factor: usize,
        /// Nodes asked for (`--write-copies`).
        wanted: usize,
    },
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
    /// The live writers' slots and the folded base, when asked for.
    pub slots: Option<(Vec<WriterSlot>, FoldedBase)>,
}

/// Which parts of a counter a read returns besides its value.
#[derive(Clone, Copy, Default, Debug)]
pub struct ReadParts {
    /// The per-region breakdown.
    pub breakdown: bool,
    /// The live writers' slots and the folded base (`tally get --slots`).
    pub slots: bool,
}

/// Milliseconds since the Unix epoch: the only clock the engine hands the core.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// One chunk of a backup with the state it is part of, read under one lock.
pub struct BackupChunk {
    /// The pulled chunk.
    pub chunk: PullChunk,
    /// The durable sequence the chunk was read at.
    pub seq: u64,
    /// The counters' digest at `seq`.
    pub digest: crate::crdt::StateDigest,
    /// The like sets' and uniques' digest at `seq`.
    pub sets_digest: crate::crdt::SetsDigest,
}

/// See the module documentation.
pub struct Engine {
    core: Mutex<Replica>,
    store: Arc<dyn Store>,
    durability: Durability,
    durable_tx: watch::Sender<u64>,
    /// The newest sequence known to survive a crash, published as soon as
    /// the store says so ([`Store::commit_then`]), before the core hears of
    /// it: adds wait on this one. `durable_tx` follows once the core has
    /// taken the commit in (what gossip and pulls read).
    synced_tx: watch::Sender<u64>,
    commit_wakeup: tokio::sync::Notify,
    copies: replicated::Copies,
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
        let (synced_tx, _) = watch::channel(core.durable_seq());
        metrics.durable_seq.set(core.durable_seq() as i64);
        let copies = replicated::Copies::new(core.replicated_seq());
        Ok(Arc::new(Engine {
            core: Mutex::new(core),
            store,
            durability,
            durable_tx,
            synced_tx,
            commit_wakeup: tokio::sync::Notify::new(),
            copies,
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

    fn record_hot(&self, op: Op, key: &str) {
        let mut hot_keys = self.hot_keys.lock().unwrap_or_else(|p| p.into_inner());
        hot_keys.record(op, key, std::time::Instant::now());
    }

    /// The `limit` hottest keys for adds and for gets right now.
    pub fn hot_keys(&self, limit: usize) -> Vec<HotKey> {
        let mut hot_keys = self.hot_keys.lock().unwrap_or_else(|p| p.into_inner());
        hot_keys.top(limit, std::time::Instant::now())
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
        self.read(
            key,
            ReadParts {
                breakdown,
                slots: false,
            },
        )
    }

    /// Reads one counter with the parts asked for, all from one state.
    pub fn read(&self, key: &[u8], parts: ReadParts) -> Result<CounterRead, EngineError> {
        let key = check_key(key)?;
        self.check_serving()?;
        self.metrics.gets.inc();
        let mut core = self.core();
        core.check_served(key).map_err(EngineError::Add)?;
        let state = core.handle_get(now_ms(), &*self.store, key)?;
        let regions = if parts.breakdown {
            core.breakdown(&state)
        } else {
            Vec::new()
        };
        let slots = parts
            .slots
            .then(|| (core.writer_slots(&state), state.folded()));
        drop(core);
        self.record_hot(Op::Get, key);
        Ok(CounterRead {
            value: state.value()?,
            regions,
            slots,
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
        core.check_served(key).map_err(EngineError::Add)?;
        let state = core.handle_get(now_ms(), &*self.store, key)?;
        Ok(self.watchers.subscribe(key, state.value()))
    }

    /// Serves one chunk of a peer's pull.
    pub fn serve_pull(&self, request: &PullRequest) -> Result<PullChunk, PullRefused> {
        // What the store returns after a failed flush may not be durable.
        if let Err(error) = self.check_serving() {
            return Err(PullRefused::Storage(StorageError(error.to_string())));
        }
        let (mut chunk, records) = self.core().handle_pull_parts(&*self.store, request)?;
        // Durable idempotency segments never change: read without the core,
        // so that adds do not wait behind a peer's records.
        if let Some(records) = records {
            records.serve(&*self.store, &mut chunk)?;
        }
        Ok(chunk)
    }

    /// Serves one chunk of a backup: a pull's chunk, with the durable
    /// sequence and digest read under the same lock, so that the last chunk
    /// of a full scan says exactly which state the backup holds.
    pub fn serve_backup_chunk(&self, request: &PullRequest) -> Result<BackupChunk, PullRefused> {
        let core = self.core();
        let chunk = core.handle_pull(&*self.store, request)?;
        Ok(BackupChunk {
            chunk,
            seq: core.durable_seq(),
            digest: core.digest(),
            sets_digest: core.sets_digest(),
        })
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
        self.metrics
            .idempotency_records_learned
            .inc_by(report.records_learned as u64);
        for (key, state) in &report.changed {
            self.watchers.notify_state(key, state);
        }
        // Whatever the merge changed waits for a commit: counters, like-set
        // members and uniques registers, records.
        if !report.changed.is_empty()
            || report.set_elements_changed > 0
            || report.records_learned > 0
        {
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
        committer::spawn(
            self.clone(),
            Box::new(on_commit),
            committer::COMMIT_STALL_LIMIT,
        )
    }

    /// Starts the group committer with a shorter stall limit (tests).
    #[cfg(test)]
    fn spawn_committer_stalling_after(self: &Arc<Self>, stall_limit: Duration) -> CommitterHandle {
        committer::spawn(self.clone(), Box::new(|_, _| {}), stall_limit)
    }

    fn publish_durable(&self, seq: u64) {
        self.publish_synced(seq);
        self.durable_tx.send_replace(seq);
        self.metrics.durable_seq.set(seq as i64);
    }

    /// Answers the adds waiting on sequences up to `seq`: the store says
    /// they survive a crash (invariant 4).
    fn publish_synced(&self, seq: u64) {
        self.synced_tx.send_if_modified(|synced| {
            let raised = seq > *synced;
            *synced = (*synced).max(seq);
            raised
        });
    }
}

/// How long the committer sleeps when nothing wakes it (housekeeping interval).
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_millis(100);

/// How many adds of a batch are applied under one hold of the core lock;
/// other requests get the lock between slices.
pub const BATCH_SLICE: usize = 256;

#[cfg(test)]
mod tests;
