//! A [`Store`] wrapper that fails or hangs on demand, for tests of what the
//! node does when its disk fails (issue 17). Only the hidden test flag
//! `--test-store-fault-file FILE` turns it on; a node without it never wraps
//! its store.
//!
//! Before each flush the wrapper reads FILE: `fail` makes the flush fail (after
//! the batch's write landed, as `ENOSPC` or `EIO` at sync does), `hang` blocks
//! it for as long as the file says so (a hung disk); anything else, or no
//! file, passes through.

use std::path::PathBuf;

use crate::replica::{Change, CommitBatch, Cursor, DurableState, Identity, Recovered};
use crate::replica::{StorageError, StoredCounter};

use super::Store;

/// See the module documentation.
#[derive(Debug)]
pub struct FaultyStore<S> {
    inner: S,
    fault_file: PathBuf,
}

impl<S: Store> FaultyStore<S> {
    /// Wraps `inner`; faults are read from `fault_file`.
    pub fn new(inner: S, fault_file: PathBuf) -> Self {
        FaultyStore { inner, fault_file }
    }

    fn planned(&self) -> String {
        std::fs::read_to_string(&self.fault_file)
            .map(|text| text.trim().to_string())
            .unwrap_or_default()
    }
}

impl<S: Store> DurableState for FaultyStore<S> {
    fn load_counter(&self, key: &str) -> Result<Option<StoredCounter>, StorageError> {
        self.inner.load_counter(key)
    }

    fn changes_after(&self, after: &Cursor, limit: usize) -> Result<Vec<Change>, StorageError> {
        self.inner.changes_after(after, limit)
    }

    fn get_record(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.inner.get_record(key)
    }

    fn scan_records(
        &self,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, StorageError> {
        self.inner.scan_records(from, to, limit)
    }

    tally_core::durable_layout_reads!();
}

impl<S: Store> Store for FaultyStore<S> {
    fn identity(&self) -> &Identity {
        self.inner.identity()
    }

    fn recover(&self, now_ms: u64) -> Result<Recovered, StorageError> {
        self.inner.recover(now_ms)
    }

    fn write(&self, batch: &CommitBatch) -> Result<(), StorageError> {
        self.inner.write(batch)
    }

    fn flush(&self) -> Result<(), StorageError> {
        loop {
            match self.planned().as_str() {
                "fail" => {
                    return Err(StorageError(format!(
                        "injected fault from {}: flush failed",
                        self.fault_file.display()
                    )))
                }
                "hang" => std::thread::sleep(std::time::Duration::from_millis(50)),
                _ => return self.inner.flush(),
            }
        }
    }

    fn close(&self) -> Result<(), StorageError> {
        self.inner.close()
    }

    fn size_on_disk(&self) -> Option<u64> {
        self.inner.size_on_disk()
    }

    fn format(&self) -> u32 {
        self.inner.format()
    }

    fn born_at(&self) -> u32 {
        self.inner.born_at()
    }

    fn raise_format(&self, format: u32) -> Result<(), StorageError> {
        self.inner.raise_format(format)
    }
}
