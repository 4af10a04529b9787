//! The sled [`Store`]: one sled tree in `<data-dir>/db`, a marker file that
//! says the directory is Tally's, and the replica identity stored inside.
//!
//! Invariant 3 of DESIGN.md: a fresh (or wiped) directory gets a new replica
//! id, written and flushed before anything else; an existing one keeps its id.
//! sled flushes only when asked (`flush_every_ms(None)`), so a batch is durable
//! exactly when [`Store::flush`] returns: sled's own flush, then
//! [`DiskSync::after_flush`] (`fdatasync` of its log, `fsync` of new blobs and
//! changed directories), which survives power loss and not just `kill -9`.
//! Tally's own files (the marker, `changes.snapshot`) are synced, and so is
//! their directory after each create, rename or removal. A store that cannot be opened never
//! panics the node: it is refused with a message that says what to do, or, with
//! [`OnCorrupt::MoveAside`], moved aside so that the node starts as a new
//! replica and rebuilds from its peers.
//!
//! The change log lives in memory ([`ChangeIndex`]). [`Store::close`] saves
//! it to `changes.snapshot` with the durable sequence it matches; opening
//! reads it back when that sequence is still the store's (a clean stop), and
//! otherwise rebuilds it by reading every counter record once (after a crash,
//! and the first time). The log entries that older builds kept in sled are
//! removed at open.
//!
//! The marker file also records the directory's format: the cluster version
//! ([`crate::replica::version`]) as last persisted. A build that cannot write
//! that format refuses to open the directory ([`OpenError::NewerFormat`]),
//! so does a build whose window starts after it ([`OpenError::OlderFormat`]:
//! the directory must go through [`UPGRADE_THROUGH`] first), both before
//! anything in the directory is touched; and [`Store::raise_format`]
//! rewrites the marker durably before the first record of a newer format is
//! written. Every directory this build opens is at cluster version 7 or
//! later, so it always has a commit log.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use crate::replica::version::{NEWEST, OLDEST, UPGRADE_THROUGH};
use crate::replica::{
    establish, Change, CommitBatch, Cursor, DurableState, Identity, IdentityError, Recovered,
    StorageError, StoredCounter,
};

use super::commit_log::{self, CommitLog};
use super::disk_sync::{sync_dir, DiskSync};
use super::encoding::{self, COUNTER, META_DURABLE_SEQ, META_IDENTITY, ORDINAL, RETIRED_CHANGE};
use super::sled_apply::Applier;
use super::{
    batch_ops, rebuild_changes, recover_from, recover_ordinals, stored_identity, ChangeIndex, Op,
    Ordinals, Store,
};

/// The marker file that makes a directory a Tally data directory.
pub const MARKER_FILE: &str = "TALLY_DATA_DIR";
const MARKER_TEXT: &str = "tally data directory, format ";
/// The change log saved by a clean stop.
const CHANGE_SNAPSHOT: &str = "changes.snapshot";

/// What to do with a store that cannot be opened.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum OnCorrupt {
    /// Refuse to start, with a message (the default).
    #[default]
    Refuse,
    /// Move the damaged directory aside and start as a new replica.
    MoveAside,
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The directory holds files but is not a Tally data directory.
    #[error("{0} is not empty and is not a Tally data directory (no {MARKER_FILE} file); give --data-dir an empty or new directory")]
    NotTally(PathBuf),
    /// The directory is in a newer format than this build writes: a newer
    /// build wrote it after its upgrade was finalized.
    #[error("the data directory {path} is in format {found}, written by a newer Tally build after the cluster's upgrade was finalized; this build writes formats up to {newest}. Run a build that speaks protocol version {found} or later (see \"Upgrading\" in the operations guide); rolling back past a finalized upgrade needs a backup taken before it")]
    NewerFormat {
        /// The data directory.
        path: PathBuf,
        /// The format its marker records.
        found: u32,
        /// The newest this build writes.
        newest: u32,
    },
    /// The directory is in a format older than this build's window: its
    /// cluster was never finalized at [`OLDEST`].
    #[error("the data directory {path} (the --data-dir setting) is at cluster version {found}, older than this release can open (it opens {OLDEST} to {NEWEST}); nothing in it was changed. Upgrade its node through {UPGRADE_THROUGH} first: run that release on this data directory, finalize the cluster there (`tally admin finalize`) until `tally status` says cluster version {OLDEST}, then start this release (see \"Upgrading\" in the operations guide)")]
    OlderFormat {
        /// The data directory.
        path: PathBuf,
        /// The format its marker records.
        found: u32,
    },
    /// Another process has the store open.
    #[error("the data directory {0} is in use by another process (is another tally-node running on it?)")]
    Locked(PathBuf),
    /// The store is damaged.
    #[error("the store in {path} cannot be opened: {reason}. Restart with --on-corrupt move-aside to move it aside and rebuild this node from its peers as a new replica")]
    Corrupt {
        /// The data directory.
        path: PathBuf,
        /// What sled or the decoder said.
        reason: String,
    },
    /// The identity does not fit the configuration.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// `--data-dir` names a file.
    #[error("the data directory {0} is a file, not a directory; give --data-dir a directory (new, empty, or a Tally data directory)")]
    IsAFile(PathBuf),
    /// An IO failure that says nothing about the store's contents (a
    /// permission, a full or read-only disk, a limit): the store is left as
    /// it is, whatever `--on-corrupt` says, and the message says what to fix.
    #[error("cannot use the data directory {path}: {cause}; {advice}. The store was left untouched, as this says nothing about its contents ({error})")]
    Io {
        /// The data directory.
        path: PathBuf,
        /// What went wrong, in words.
        cause: &'static str,
        /// What to do about it.
        advice: &'static str,
        /// The failure (not a `source`: its text is already in the message).
        error: std::io::Error,
    },
}

/// The IO failures that are not damage, each with its cause and what to do
/// (`None`: any other failure, which is left to the caller to judge).
fn environment_cause(error: &std::io::Error) -> Option<(&'static str, &'static str)> {
    use std::io::ErrorKind;
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    const EDQUOT: i32 = 122;
    let found = match (error.kind(), error.raw_os_error()) {
        (ErrorKind::PermissionDenied, _) => (
            "permission denied",
            "run tally-node as the user that owns the directory, or give that user read and write access to it and everything in it (chown -R / chmod)",
        ),
        (ErrorKind::ReadOnlyFilesystem, _) => (
            "the file system is read-only",
            "remount it read-write, or give --data-dir a writable place",
        ),
        (ErrorKind::StorageFull, _) | (_, Some(EDQUOT)) => (
            "no space left on the device (or the disk quota is used up)",
            "free some space on that file system, then start the node again",
        ),
        (_, Some(EMFILE | ENFILE)) => (
            "too many open files",
            "raise the open-files limit of the node's process (ulimit -n, or LimitNOFILE= in its systemd unit)",
        ),
        (ErrorKind::NotADirectory, _) => (
            "a part of the path is a file, not a directory",
            "give --data-dir a path made of directories",
        ),
        (ErrorKind::IsADirectory, _) => (
            "a file of the store is a directory",
            "remove what was put in the store's place",
        ),
        _ => return None,
    };
    Some(found)
}

/// An IO failure met while opening `path`: one of [`environment_cause`]'s,
/// or `otherwise` (which decides whether the rest is damage).
fn io_open_error(
    path: &Path,
    error: std::io::Error,
    otherwise: impl FnOnce(std::io::Error) -> OpenError,
) -> OpenError {
    match environment_cause(&error) {
        Some((cause, advice)) => OpenError::Io {
            path: path.to_path_buf(),
            cause,
            advice,
            error,
        },
        None => otherwise(error),
    }
}

/// See the module documentation.
pub struct SledStore {
    db: sled::Db,
    disk: DiskSync,
    changes: Mutex<ChangeIndex>,
    /// Held for writing from before a batch is applied until its new
    /// numbers are taken, so a reader never meets a record it cannot name.
    ordinals: RwLock<Ordinals>,
    identity: Identity,
    path: PathBuf,
    /// The record format written now (the persisted cluster version).
    format: AtomicU32,
    /// The newest version of the build that created the directory (0: a
    /// build that did not record it).
    born_at: u32,
    /// The commit log (see `commit_log`).
    log: Mutex<CommitLog>,
    /// Writes logged batches into sled's tree behind the committer, and
    /// answers reads of what it has not written yet (`sled_apply.rs`).
    applier: Applier,
    /// Where a damaged store was moved, when it was.
    pub moved_aside: Option<PathBuf>,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.path)
            .field("identity", &self.identity)
            .finish()
    }
}

/// An IO failure on the data directory itself (not inside the store).
fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> OpenError + '_ {
    move |error| {
        io_open_error(path, error, |error| OpenError::Io {
            path: path.to_path_buf(),
            cause: "an IO error",
            advice: "check the disk and the path, then start the node again",
            error,
        })
    }
}

fn storage(error: sled::Error) -> StorageError {
    StorageError(error.to_string())
}

/// sled's page cache unless `--store-cache-bytes` says otherwise: 128 MiB
/// (sled's own default, 1 GiB, made most of a node's resident memory once
/// it held a million counters).
pub const DEFAULT_CACHE_BYTES: u64 = 128 << 20;

impl SledStore {
    /// Opens (or creates) the data directory for `region`. `fresh_id` is the
    /// replica id to use if the directory has none yet (random, from the caller).
    pub fn open(
        dir: &Path,
        region: &str,
        fresh_id: u64,
        on_corrupt: OnCorrupt,
    ) -> Result<SledStore, OpenError> {
        Self::open_with_cache(dir, region, fresh_id, on_corrupt, DEFAULT_CACHE_BYTES)
    }

    /// [`SledStore::open`] with a page cache of `cache_bytes`.
    pub fn open_with_cache(
        dir: &Path,
        region: &str,
        fresh_id: u64,
        on_corrupt: OnCorrupt,
        cache_bytes: u64,
    ) -> Result<SledStore, OpenError> {
        let open_once = |dir| Self::open_once(dir, region, fresh_id, cache_bytes);
        match open_once(dir) {
            Err(OpenError::Corrupt { path, reason }) if on_corrupt == OnCorrupt::MoveAside => {
                let aside = aside_path(dir);
                std::fs::rename(dir, &aside).map_err(io_error(dir))?;
                if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                    sync_dir(parent).map_err(io_error(dir))?;
                }
                tracing::warn!(from = %path.display(), to = %aside.display(), %reason, "moved a damaged store aside; starting as a new replica");
                let mut store = open_once(dir)?;
                store.moved_aside = Some(aside);
                Ok(store)
            }
            other => other,
        }
    }

    fn open_once(
        dir: &Path,
        region: &str,
        fresh_id: u64,
        cache_bytes: u64,
    ) -> Result<SledStore, OpenError> {
        let initialised = prepare_dir(dir)?;
        let format = if initialised {
            read_format(dir)?
        } else {
            OLDEST
        };
        if format > NEWEST {
            return Err(OpenError::NewerFormat {
                path: dir.to_path_buf(),
                found: format,
                newest: NEWEST,
            });
        }
        if format < OLDEST {
            return Err(OpenError::OlderFormat {
                path: dir.to_path_buf(),
                found: format,
            });
        }
        let db_path = dir.join("db");
        remove_unfinished_snapshots(&db_path).map_err(io_error(dir))?;
        let config = sled::Config::new()
            .path(&db_path)
            .cache_capacity(cache_bytes)
            .flush_every_ms(None)
            .mode(sled::Mode::LowSpace);
        // sled 0.34 may panic on some damaged files; a damaged store must stop
        // the node with a message, never a panic.
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| config.open()));
        let db = match opened {
            Ok(Ok(db)) => db,
            Ok(Err(error)) => return Err(classify(dir, error)),
            Err(panic) => {
                let reason = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "sled panicked while opening".into());
                return Err(OpenError::Corrupt {
                    path: dir.to_path_buf(),
                    reason,
                });
            }
        };
        let corrupt = |reason: String| OpenError::Corrupt {
            path: dir.to_path_buf(),
            reason,
        };
        // sled never syncs `db/conf`, nor the directories it creates.
        let disk = DiskSync::open(dir).map_err(io_error(dir))?;
        let flush = |db: &sled::Db| -> Result<(), OpenError> {
            db.flush().map_err(|e| classify(dir, e))?;
            disk.after_flush().map_err(io_error(dir))
        };
        // Commits acknowledged through the commit log and not yet in sled's
        // durable state go back in before anything reads the store.
        let (mut log, logged) = match commit_log::open_existing(dir).map_err(io_error(dir))? {
            Some(existing) => existing,
            None => commit_log::create(dir).map_err(io_error(dir))?,
        };
        if commit_log::replay(&db, &logged).map_err(|e| corrupt(e.0))? {
            flush(&db)?;
        }
        log.start_over();
        let stored = db.get(META_IDENTITY).map_err(|e| classify(dir, e))?;
        let stored = stored_identity(stored.as_deref()).map_err(|e| corrupt(e.0))?;
        if stored.is_none() && initialised {
            // The marker is written only after the identity is durable, so a
            // marked directory without one has lost data: never start it as a
            // new, empty replica behind the operator's back.
            return Err(corrupt(
                "the store has lost its replica identity (its data is damaged or was removed)"
                    .into(),
            ));
        }
        let is_new = stored.is_none();
        let identity = establish(stored, region, fresh_id)?;
        if is_new {
            db.insert(META_IDENTITY, encoding::encode_identity(&identity))
                .map_err(|e| classify(dir, e))?;
            db.insert(
                encoding::META_BORN_AT,
                encoding::encode_u64(u64::from(NEWEST)),
            )
            .map_err(|e| classify(dir, e))?;
            flush(&db)?;
            write_marker(dir, format)?;
        }
        let born_at = match db
            .get(encoding::META_BORN_AT)
            .map_err(|e| classify(dir, e))?
        {
            Some(bytes) => encoding::decode_u64(&bytes, "creating build's version")
                .map_err(|e| corrupt(e.0))?
                .try_into()
                .unwrap_or(u32::MAX),
            None => 0,
        };
        if ensure_hash_key(&db).map_err(|e| corrupt(e.0))? {
            flush(&db)?;
        }
        if remove_retired_change_log(&db).map_err(|e| classify(dir, e))? {
            flush(&db)?;
        }
        let changes = open_changes(dir, &db).map_err(|e| corrupt(e.0))?;
        let ordinals = recover_ordinals(db.scan_prefix([ORDINAL])).map_err(|e| corrupt(e.0))?;
        let applier = Applier::start(db.clone()).map_err(io_error(dir))?;
        Ok(SledStore {
            db,
            disk,
            changes: Mutex::new(changes),
            ordinals: RwLock::new(ordinals),
            identity,
            path: dir.to_path_buf(),
            format: AtomicU32::new(format),
            born_at,
            log: Mutex::new(log),
            applier,
            moved_aside: None,
        })
    }
}

impl SledStore {
    /// The change log, locked. A thread that panicked while holding the lock
    /// (poisoning it) left the log as it was between two whole operations
    /// (each is a few in-memory inserts and removals), so later readers go on
    /// with it, as the engine does with the core's lock, rather than panic
    /// on every read for the rest of the process.
    fn changes(&self) -> MutexGuard<'_, ChangeIndex> {
        self.changes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The commit log, locked (held through a whole commit or flush, so the
    /// two never interleave). A poisoned lock is taken as is: the log's own
    /// state records a failed sync.
    fn log(&self) -> MutexGuard<'_, CommitLog> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `batch` to sled as one sled batch, which sled recovers whole
    /// or not at all (visible to reads, durable at the next flush): what
    /// [`DurableState::write`] does. Commits go to sled through the commit
    /// log and the applier instead (`sled_apply.rs`).
    fn write_atomic(&self, batch: &CommitBatch) -> Result<(), StorageError> {
        // The write lock is held until the new numbers are taken, so a
        // reader never meets a record it cannot name.
        let mut ordinals = self
            .ordinals
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let new = ordinals.plan(batch);
        let mut sled_batch = sled::Batch::default();
        for op in batch_ops(batch, &ordinals, &new) {
            match op {
                Op::Put(key, value) => sled_batch.insert(key, value),
                Op::Delete(key) => sled_batch.remove(key),
            }
        }
        self.db.apply_batch(sled_batch).map_err(storage)?;
        ordinals.extend(&new);
        drop(ordinals);
        self.changes().apply(batch);
        Ok(())
    }

    /// Makes every batch handed to sled durable: waits for the applier to
    /// write them into the tree, then sled's flush, then
    /// [`DiskSync::after_flush`].
    fn flush_sled(&self) -> Result<(), StorageError> {
        self.applier.drain()?;
        self.db.flush().map_err(storage)?;
        self.disk.after_flush().map_err(|error| {
            StorageError(format!(
                "cannot sync the store's files to disk in {}: {error}",
                self.path.display()
            ))
        })
    }
}

/// Gives the store its secret key of idempotency ids, once: at its creation,
/// or at the first open by a build that keys them. Flushed by the caller
/// before any record is written with it.
/// Returns true when it wrote the key (the caller flushes it).
fn ensure_hash_key(db: &sled::Db) -> Result<bool, StorageError> {
    if db
        .get(encoding::META_IDEMPOTENCY_HASH_KEY)
        .map_err(storage)?
        .is_some()
    {
        return Ok(false);
    }
    // Segments are keyed by their commit's sequence, and every later commit
    // has a higher one than the durable sequence now.
    let hash_key = encoding::HashKey {
        key: rand::random(),
        keyed_from: durable_seq(db)? + 1,
    };
    db.insert(
        encoding::META_IDEMPOTENCY_HASH_KEY,
        encoding::encode_hash_key(&hash_key),
    )
    .map_err(storage)?;
    Ok(true)
}

/// The store's durable sequence (0 before the first commit).
fn durable_seq(db: &sled::Db) -> Result<u64, StorageError> {
    db.get(META_DURABLE_SEQ)
        .map_err(storage)?
        .map_or(Ok(0), |bytes| {
            encoding::decode_u64(&bytes, "durable sequence")
        })
}

/// The change log: as the last clean stop saved it if it still matches the
/// store, else rebuilt from every counter record. The saved copy is used once.
/// Deletes what sled left of a snapshot it was still writing when it
/// stopped (`db/snap.<lsn>.generating`: sled writes a snapshot under that
/// name and renames it once it is complete and synced). sled 0.34 counts such
/// a file among its snapshots and, when it sorts last, reads it and calls the
/// store corrupt, so a start that ran out of disk space while writing one
/// made every later start fail on an intact store. The snapshot is only an
/// index of sled's log: the previous complete one (or none) and the log
/// rebuild the same state.
fn remove_unfinished_snapshots(db_path: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(db_path) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            tracing::warn!(file = %entry.path().display(), "removing an unfinished sled snapshot (left by a stop while it was written; the log rebuilds it)");
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

fn open_changes(dir: &Path, db: &sled::Db) -> Result<ChangeIndex, StorageError> {
    let path = dir.join(CHANGE_SNAPSHOT);
    match std::fs::read(&path) {
        Ok(bytes) => {
            // Used once: its removal is made durable, so that a power loss
            // cannot bring it back (its sequence check would refuse it anyway).
            if std::fs::remove_file(&path).is_ok() {
                if let Err(error) = sync_dir(dir) {
                    tracing::warn!(%error, "cannot sync the data directory after removing the saved change log");
                }
            }
            let durable_seq = durable_seq(db)?;
            match encoding::decode_change_snapshot(&bytes) {
                Ok((seq, changes)) if seq == durable_seq => {
                    tracing::info!(
                        counters = changes.len(),
                        "read the change log saved at the last stop"
                    );
                    return Ok(changes);
                }
                Ok((seq, _)) => tracing::warn!(
                    saved_at = seq,
                    durable_seq,
                    "the saved change log is older than the store; rebuilding it from the counters"
                ),
                Err(error) => {
                    tracing::warn!(%error, "the saved change log is damaged; rebuilding it from the counters")
                }
            }
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(%error, "cannot read the saved change log; rebuilding it from the counters")
        }
    }
    let started = std::time::Instant::now();
    let changes = rebuild_changes(db.scan_prefix([COUNTER]))?;
    tracing::info!(
        counters = changes.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "rebuilt the change log from the counter records"
    );
    Ok(changes)
}

/// Saves the writers' digests by partition (`bytes`, from
/// [`encoding::encode_partition_digests`]) in the data directory `dir` at a
/// clean stop.
pub fn save_partition_digests(dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_durably(&dir.join(encoding::SAVED_PARTITION_DIGESTS), bytes)
}

/// The writers' digests by partition saved at the last clean stop, if any;
/// used once (the file is removed durably, so a power loss cannot bring a
/// stale copy back; its sequence check would refuse it anyway).
pub fn take_saved_partition_digests(dir: &Path) -> Option<Vec<u8>> {
    let path = dir.join(encoding::SAVED_PARTITION_DIGESTS);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => {
            tracing::warn!(%error, "cannot read the saved digests by partition; computing them from the counters");
            return None;
        }
    };
    if std::fs::remove_file(&path).is_ok() {
        if let Err(error) = sync_dir(dir) {
            tracing::warn!(%error, "cannot sync the data directory after removing the saved digests by partition");
        }
    }
    Some(bytes)
}

/// Writes `bytes` to `path` durably: a temporary file, synced, renamed over.
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    let file = std::fs::File::create(&temporary)?;
    std::io::Write::write_all(&mut &file, bytes)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)?;
    match path.parent() {
        Some(parent) => sync_dir(parent),
        None => Ok(()),
    }
}

/// Deletes the change-log entries that builds before the in-memory change log
/// wrote, a thousand per batch. True when it removed any (then the caller
/// makes that durable).
fn remove_retired_change_log(db: &sled::Db) -> sled::Result<bool> {
    let mut removed = 0usize;
    loop {
        let mut batch = sled::Batch::default();
        let mut taken = 0;
        for item in db.scan_prefix([RETIRED_CHANGE]).keys().take(1000) {
            batch.remove(item?);
            taken += 1;
        }
        if taken == 0 {
            break;
        }
        db.apply_batch(batch)?;
        removed += taken;
    }
    if removed > 0 {
        tracing::info!(
            removed,
            "removed the change log that an older build kept on disk"
        );
    }
    Ok(removed > 0)
}

fn aside_path(dir: &Path) -> PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "data".into());
    dir.with_file_name(format!("{name}.damaged-{stamp}"))
}

/// Checks that `dir` is a Tally data directory or may become one. Returns
/// true when it already is one (its marker is present).
fn prepare_dir(dir: &Path) -> Result<bool, OpenError> {
    if dir.metadata().is_ok_and(|meta| !meta.is_dir()) {
        return Err(OpenError::IsAFile(dir.to_path_buf()));
    }
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    if dir.join(MARKER_FILE).exists() {
        return Ok(true);
    }
    // Empty, or holding only the `db` of a first start that stopped before its
    // identity was durable: a fresh directory.
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        if entry.file_name() != "db" {
            return Err(OpenError::NotTally(dir.to_path_buf()));
        }
    }
    Ok(false)
}

/// The format that the marker of `dir` records.
fn read_format(dir: &Path) -> Result<u32, OpenError> {
    let marker = dir.join(MARKER_FILE);
    let text = std::fs::read_to_string(&marker).map_err(io_error(dir))?;
    text.trim_end()
        .strip_prefix(MARKER_TEXT)
        .and_then(|number| number.parse().ok())
        .ok_or_else(|| OpenError::Corrupt {
            path: dir.to_path_buf(),
            reason: format!(
                "its marker {} does not say which format the directory is in: {text:?}",
                marker.display()
            ),
        })
}

/// The marker's text for format `format`.
fn marker_text(format: u32) -> String {
    format!("{MARKER_TEXT}{format}\n")
}

/// Marks `dir` as a Tally data directory in format `format`, durably.
fn write_marker(dir: &Path, format: u32) -> Result<(), OpenError> {
    let marker = dir.join(MARKER_FILE);
    let file = std::fs::File::create(&marker).map_err(io_error(dir))?;
    std::io::Write::write_all(&mut &file, marker_text(format).as_bytes()).map_err(io_error(dir))?;
    file.sync_all().map_err(io_error(dir))?;
    sync_dir(dir).map_err(io_error(dir))
}

/// What a sled error met while opening means: the directory in use, a
/// failure of the environment ([`environment_cause`]), or damage. Only the
/// last may be moved aside.
fn classify(dir: &Path, error: sled::Error) -> OpenError {
    let text = error.to_string();
    let corrupt = |reason: String| OpenError::Corrupt {
        path: dir.to_path_buf(),
        reason,
    };
    match error {
        sled::Error::Io(io)
            if io.kind() == std::io::ErrorKind::WouldBlock || text.contains("lock") =>
        {
            OpenError::Locked(dir.to_path_buf())
        }
        sled::Error::Io(io) => io_open_error(dir, io, |_| corrupt(text)),
        _ if text.contains("lock") => OpenError::Locked(dir.to_path_buf()),
        _ => corrupt(text),
    }
}

impl DurableState for SledStore {
    fn load_counter(&self, key: &str) -> Result<Option<StoredCounter>, StorageError> {
        self.get_record(&encoding::counter_key(key))?
            .map(|bytes| {
                let ordinals = self.ordinals.read().unwrap_or_else(PoisonError::into_inner);
                encoding::decode_counter(&bytes, |o| ordinals.replica(o))
            })
            .transpose()
    }

    fn changes_after(&self, after: &Cursor, limit: usize) -> Result<Vec<Change>, StorageError> {
        Ok(self.changes().after(after, limit))
    }

    fn get_record(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        if let Some(pending) = self.applier.read(key) {
            return Ok(pending);
        }
        Ok(self
            .db
            .get(key)
            .map_err(storage)?
            .map(|value| value.to_vec()))
    }

    fn scan_records(
        &self,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, StorageError> {
        if from >= to {
            return Ok(Vec::new());
        }
        self.applier.merge_scan(from, to, limit, |limit| {
            self.db
                .range(from..to)
                .take(limit)
                .map(|item| item.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(storage))
                .collect()
        })
    }

    tally_core::durable_layout_reads!();
}

impl Store for SledStore {
    fn identity(&self) -> &Identity {
        &self.identity
    }

    fn recover(&self, now_ms: u64) -> Result<Recovered, StorageError> {
        let mut recovered = recover_from(
            |key| self.db.get(key).map(|value| value.map(|v| v.to_vec())),
            |prefix| {
                Box::new(
                    self.db
                        .range(vec![prefix]..vec![prefix + 1])
                        .map(|item| item.map(|(k, v)| (k.to_vec(), v.to_vec()))),
                )
            },
            now_ms,
        )?;
        if !recovered.writer_digests_current {
            recovered.writer_digests = super::compute_writer_digests(self)?;
            recovered.writer_digests_current = true;
        }
        recovered.sets_digest = super::sets::recover_digest(self, recovered.durable_seq)?;
        Ok(recovered)
    }

    fn write(&self, batch: &CommitBatch) -> Result<(), StorageError> {
        // Under the log's lock, like a commit: one writer plans ordinals at a
        // time, and after every batch handed to the applier.
        let _log = self.log();
        self.applier.drain()?;
        self.write_atomic(batch)
    }

    fn flush(&self) -> Result<(), StorageError> {
        let mut log = self.log();
        self.flush_sled()?;
        log.start_over();
        Ok(())
    }

    fn commit(&self, batch: &CommitBatch) -> Result<(), StorageError> {
        self.commit_then(batch, &|| {})
    }

    fn commit_then(&self, batch: &CommitBatch, on_durable: &dyn Fn()) -> Result<(), StorageError> {
        let mut log = self.log();
        // Planned under the ordinals' lock, which is not held through the
        // log's sync: new numbers are taken only once the log holds the
        // batch that writes them, and before any read can meet them.
        let (ops, new) = {
            let ordinals = self.ordinals.read().unwrap_or_else(PoisonError::into_inner);
            let new = ordinals.plan(batch);
            (batch_ops(batch, &ordinals, &new), new)
        };
        log.append(batch.seq, &ops)
            .map_err(|error| StorageError(error.to_string()))?;
        self.ordinals
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(&new);
        on_durable();
        self.applier.hand_over(ops)?;
        self.changes().apply(batch);
        if log.wants_checkpoint() {
            self.flush_sled()?;
            log.start_over();
        }
        Ok(())
    }

    fn close(&self) -> Result<(), StorageError> {
        self.flush()?;
        let durable_seq = durable_seq(&self.db)?;
        let bytes = {
            let changes = self.changes();
            encoding::encode_change_snapshot(durable_seq, &changes)
        };
        write_durably(&self.path.join(CHANGE_SNAPSHOT), &bytes)
            .map_err(|error| StorageError(format!("cannot save the change log: {error}")))
    }

    fn size_on_disk(&self) -> Option<u64> {
        self.db.size_on_disk().ok()
    }

    fn counters_stored(&self) -> Option<u64> {
        Some(self.changes().len() as u64)
    }

    fn born_at(&self) -> u32 {
        self.born_at
    }

    fn format(&self) -> u32 {
        self.format.load(Ordering::Acquire)
    }

    fn raise_format(&self, format: u32) -> Result<(), StorageError> {
        if format <= self.format() {
            return Ok(());
        }
        if format > NEWEST {
            return Err(StorageError(format!(
                "cannot move the data directory to format {format}: this build writes formats up to {NEWEST}"
            )));
        }
        // Persisted before acted on: once the marker says `format`, an
        // older build refuses the directory instead of misreading it.
        write_durably(&self.path.join(MARKER_FILE), marker_text(format).as_bytes()).map_err(
            |error| {
                StorageError(format!(
                    "cannot record format {format} in {MARKER_FILE}: {error}"
                ))
            },
        )?;
        self.format.store(format, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
#[path = "sled_store_tests.rs"]
mod tests;
