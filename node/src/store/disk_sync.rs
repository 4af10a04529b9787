//! Makes what sled wrote reach the disk, and Tally's own files with it.
//!
//! sled 0.34's `Db::flush` writes its log with `pwrite` and makes it "stable"
//! with `sync_file_range` only: that survives a `kill -9` but not a power
//! loss or a kernel crash (the file's size and the drive's write cache are not
//! flushed). Its `fsync` lives in the periodic flusher, which Tally turns off.
//! Its other files are not synced at all: `db/conf` is written once and never
//! synced, blobs (`db/blobs/<lsn>`, values too large for a log segment) are
//! written and closed, and a snapshot `db/snap.<lsn>` is synced but renamed
//! into place without a directory sync.
//!
//! [`DiskSync::after_flush`] keeps invariant 4 of DESIGN.md across power loss:
//! after each `Db::flush`, and before any add of that commit is acknowledged,
//! it calls `fdatasync` on `db/db` (one per group commit, whatever the batch
//! holds), `fsync` on every blob created since the last commit and on the
//! directories whose entries changed. [`DiskSync::open`] syncs every file and
//! directory of a freshly opened store once, so that a first start is durable
//! too.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// See the module documentation.
#[derive(Debug)]
pub struct DiskSync {
    /// `db/db`, sled's log; `fsync` works per inode, so this handle covers
    /// sled's own writes.
    log: File,
    db_dir: PathBuf,
    blobs_dir: PathBuf,
    /// The entries of `db/` and `db/blobs/` as of the last sync.
    synced: Mutex<Synced>,
}

#[derive(Debug, Default)]
struct Synced {
    db_entries: BTreeSet<OsString>,
    blobs: BTreeSet<OsString>,
    /// The first failure, repeated by every later call: after a failed
    /// `fsync` Linux may mark the unwritten pages clean, so a retry can
    /// succeed without the data ever reaching the disk ("fsyncgate"). Only
    /// reopening the store (a restart) makes a sync trustworthy again.
    failed: Option<(io::ErrorKind, String)>,
}

/// `fsync` of a directory, which makes its entries (created, renamed or
/// removed files) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn entries(dir: &Path) -> io::Result<BTreeSet<OsString>> {
    match std::fs::read_dir(dir) {
        Ok(listing) => listing
            .map(|entry| entry.map(|entry| entry.file_name()))
            .collect(),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(BTreeSet::new()),
        Err(error) => Err(error),
    }
}

/// `fsync` of a file that may have been removed meanwhile (sled deletes
/// blobs and old snapshots on its own threads).
fn sync_file(path: &Path) -> io::Result<()> {
    match File::open(path) {
        Ok(file) => file.sync_all(),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

impl DiskSync {
    /// Syncs every file sled holds in `data_dir/db`, its directories, and
    /// `data_dir` and its parent (a first start creates them), then keeps a
    /// handle on sled's log for [`DiskSync::after_flush`].
    pub fn open(data_dir: &Path) -> io::Result<DiskSync> {
        let db_dir = data_dir.join("db");
        let blobs_dir = db_dir.join("blobs");
        let log = File::open(db_dir.join("db"))?;
        let db_entries = entries(&db_dir)?;
        for name in &db_entries {
            let path = db_dir.join(name);
            if path.is_file() {
                sync_file(&path)?;
            }
        }
        let blobs = entries(&blobs_dir)?;
        for name in &blobs {
            sync_file(&blobs_dir.join(name))?;
        }
        if blobs_dir.is_dir() {
            sync_dir(&blobs_dir)?;
        }
        sync_dir(&db_dir)?;
        sync_dir(data_dir)?;
        if let Some(parent) = data_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
        Ok(DiskSync {
            log,
            db_dir,
            blobs_dir,
            synced: Mutex::new(Synced {
                db_entries,
                blobs,
                failed: None,
            }),
        })
    }

    /// Makes everything that `Db::flush` just made stable reach the disk:
    /// new blobs and their directory, sled's log, and `db/` when its entries
    /// changed (a snapshot renamed into place). Call it after every flush
    /// whose writes may be acknowledged.
    /// After a failure every later call fails the same way.
    pub fn after_flush(&self) -> io::Result<()> {
        let mut synced = self.synced.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((kind, text)) = &synced.failed {
            return Err(io::Error::new(
                *kind,
                format!("{text} (an earlier sync failed; restart the node to reopen its store)"),
            ));
        }
        let result = self.sync_changes(&mut synced);
        if let Err(error) = &result {
            synced.failed = Some((error.kind(), error.to_string()));
        }
        result
    }

    fn sync_changes(&self, synced: &mut Synced) -> io::Result<()> {
        let blobs = entries(&self.blobs_dir)?;
        let mut new_blob = false;
        for name in blobs.difference(&synced.blobs) {
            sync_file(&self.blobs_dir.join(name))?;
            new_blob = true;
        }
        if new_blob || blobs.len() != synced.blobs.len() {
            sync_dir(&self.blobs_dir)?;
        }
        synced.blobs = blobs;
        self.log.sync_data()?;
        let db_entries = entries(&self.db_dir)?;
        if db_entries != synced.db_entries {
            for name in db_entries.difference(&synced.db_entries) {
                let path = self.db_dir.join(name);
                if path.is_file() {
                    sync_file(&path)?;
                }
            }
            sync_dir(&self.db_dir)?;
            synced.db_entries = db_entries;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_needs_a_sled_log() {
        let dir = tempfile::tempdir().unwrap();
        let error = DiskSync::open(dir.path()).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn after_flush_notes_new_and_removed_blobs() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        std::fs::create_dir_all(db.join("blobs")).unwrap();
        std::fs::write(db.join("db"), b"log").unwrap();
        let sync = DiskSync::open(dir.path()).unwrap();
        std::fs::write(db.join("blobs").join("42"), b"blob").unwrap();
        sync.after_flush().unwrap();
        assert!(sync
            .synced
            .lock()
            .unwrap()
            .blobs
            .contains(&OsString::from("42")));
        std::fs::remove_file(db.join("blobs").join("42")).unwrap();
        std::fs::write(db.join("snap.0000000000000001"), b"snap").unwrap();
        sync.after_flush().unwrap();
        let synced = sync.synced.lock().unwrap();
        assert!(synced.blobs.is_empty());
        assert!(synced
            .db_entries
            .contains(&OsString::from("snap.0000000000000001")));
    }

    #[test]
    fn a_failed_sync_fails_every_later_one() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        std::fs::create_dir_all(db.join("blobs")).unwrap();
        std::fs::write(db.join("db"), b"log").unwrap();
        let sync = DiskSync::open(dir.path()).unwrap();
        // The blobs directory turned into a file: listing it fails.
        std::fs::remove_dir(db.join("blobs")).unwrap();
        std::fs::write(db.join("blobs"), b"not a directory").unwrap();
        assert!(sync.after_flush().is_err());
        std::fs::remove_file(db.join("blobs")).unwrap();
        std::fs::create_dir(db.join("blobs")).unwrap();
        let again = sync.after_flush().unwrap_err();
        assert!(again.to_string().contains("restart"), "{again}");
    }
}
