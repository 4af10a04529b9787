//! The commit log: what makes a group commit durable with one `fdatasync`.
//!
//! sled 0.34's `Db::flush` writes its log with `pwrite` and waits on a
//! `sync_file_range` for each buffer it writes (one or two per commit, about
//! 100 µs each here), and power-loss safety then needs an `fdatasync` of the
//! same file on top (see `disk_sync`): three waits on the disk per commit.
//! With the commit log, a commit applies its batch to sled in memory, appends
//! the batch's puts and deletes to `<data-dir>/commit.log` and calls
//! `fdatasync` on that file once: one wait. sled is flushed (and synced)
//! every [`CHECKPOINT_EVERY`] or [`CHECKPOINT_BYTES`] of log, after which the
//! log starts over at offset 0.
//!
//! Invariant 4 of DESIGN.md (an acknowledged add survives `kill -9` and power
//! loss) holds because a batch is acknowledged only after its record is
//! synced, and opening the store replays every intact record newer than
//! sled's durable sequence before anything reads it. The file is written in
//! place over space that was written and synced when the file was created
//! ([`PREALLOCATED_BYTES`]), so `fdatasync` has no file size to journal.
//!
//! A record: magic, payload length, CRC-32 of the payload, then the payload
//! (the batch's sequence and its operations). Reading stops at the first
//! record that is torn, damaged, or older than the one before it (records
//! left from before the last checkpoint): those are all in sled already.
//! A failed sync fails every later one ("fsyncgate": see `disk_sync`).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::disk_sync::sync_dir;
use super::encoding::{decode_u64, META_DURABLE_SEQ};
use super::Op;
use crate::replica::StorageError;

/// The log's file name in the data directory.
pub const COMMIT_LOG_FILE: &str = "commit.log";
/// Space written (zeros) and synced when the log is created.
pub const PREALLOCATED_BYTES: u64 = 8 << 20;
/// Checkpoint (flush sled, start the log over) once the log holds this much.
pub const CHECKPOINT_BYTES: u64 = 6 << 20;
/// ... or once the last checkpoint is this old.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

const MAGIC: u32 = 0x7A11_C0DE;
const HEADER_BYTES: usize = 12;
const PUT: u8 = 1;
const DELETE: u8 = 2;
/// A bound on one record, so a damaged length cannot ask for gigabytes.
const MAX_RECORD_BYTES: u64 = 1 << 30;

/// One batch read back from the log.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LoggedBatch {
    /// The commit's sequence.
    pub seq: u64,
    /// Its puts and deletes, in order.
    pub ops: Vec<Op>,
    /// Its record's size in the log.
    encoded_len: u64,
}

impl LoggedBatch {
    /// A batch as if read back from the log (for tests of replay).
    #[cfg(test)]
    pub fn new(seq: u64, ops: Vec<Op>) -> Self {
        let encoded_len = encode_record(seq, &ops).len() as u64;
        LoggedBatch {
            seq,
            ops,
            encoded_len,
        }
    }
}

/// The open log. See the module documentation.
#[derive(Debug)]
pub struct CommitLog {
    file: File,
    path: PathBuf,
    /// Where the next record goes.
    end: u64,
    last_checkpoint: Instant,
    failed: Option<(io::ErrorKind, String)>,
}

impl CommitLog {
    fn at(path: PathBuf) -> io::Result<CommitLog> {
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        Ok(CommitLog {
            file,
            path,
            end: 0,
            last_checkpoint: Instant::now(),
            failed: None,
        })
    }

    /// Appends one batch and syncs it: once this returns, the batch
    /// survives a crash or a power loss.
    pub fn append(&mut self, seq: u64, ops: &[Op]) -> io::Result<()> {
        self.check_failed()?;
        let record = encode_record(seq, ops);
        let result = self
            .file
            .write_all_at(&record, self.end)
            .and_then(|()| self.file.sync_data());
        match result {
            Ok(()) => {
                self.end += record.len() as u64;
                Ok(())
            }
            Err(error) => Err(self.fail(error)),
        }
    }

    /// True when the log should be checkpointed (sled flushed, then
    /// [`CommitLog::start_over`]).
    pub fn wants_checkpoint(&self) -> bool {
        self.end >= CHECKPOINT_BYTES || self.last_checkpoint.elapsed() >= CHECKPOINT_EVERY
    }

    /// Starts the log over at offset 0. Call only once every record in it is
    /// durable elsewhere (sled flushed and synced).
    pub fn start_over(&mut self) {
        self.end = 0;
        self.last_checkpoint = Instant::now();
    }

    /// The log's bytes in use.
    #[cfg(test)]
    pub fn len(&self) -> u64 {
        self.end
    }

    /// True when nothing was appended since the log started over.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.end == 0
    }

    fn check_failed(&self) -> io::Result<()> {
        match &self.failed {
            Some((kind, text)) => Err(io::Error::new(
                *kind,
                format!("{text} (an earlier sync of the commit log failed; restart the node)"),
            )),
            None => Ok(()),
        }
    }

    fn fail(&mut self, error: io::Error) -> io::Error {
        let text = format!(
            "cannot write the commit log {}: {error}",
            self.path.display()
        );
        self.failed = Some((error.kind(), text.clone()));
        io::Error::new(error.kind(), text)
    }
}

/// Opens the log of `data_dir` if it has one, with its intact records,
/// oldest first. The log's end is where the last of them ends: call
/// [`CommitLog::start_over`] once they are durable in sled.
pub fn open_existing(data_dir: &Path) -> io::Result<Option<(CommitLog, Vec<LoggedBatch>)>> {
    let path = data_dir.join(COMMIT_LOG_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let batches = read_records(&bytes);
    let mut log = CommitLog::at(path)?;
    log.end = batches.iter().map(|batch| batch.encoded_len).sum();
    Ok(Some((log, batches)))
}

/// Creates the log of `data_dir`: preallocated, synced, its directory entry
/// synced.
pub fn create(data_dir: &Path) -> io::Result<(CommitLog, Vec<LoggedBatch>)> {
    let path = data_dir.join(COMMIT_LOG_FILE);
    create_preallocated(&path)?;
    sync_dir(data_dir)?;
    Ok((CommitLog::at(path)?, Vec::new()))
}

/// Applies to `db` every logged batch newer than its durable sequence, in
/// order, each as one atomic sled batch. True when it applied any (the
/// caller flushes sled before the log is reused).
pub fn replay(db: &sled::Db, logged: &[LoggedBatch]) -> Result<bool, StorageError> {
    let durable = db
        .get(META_DURABLE_SEQ)
        .map_err(|error| StorageError(error.to_string()))?
        .map_or(Ok(0), |bytes| decode_u64(&bytes, "durable sequence"))?;
    let mut applied = 0usize;
    for batch in logged.iter().filter(|batch| batch.seq > durable) {
        let mut sled_batch = sled::Batch::default();
        for op in &batch.ops {
            match op {
                Op::Put(key, value) => sled_batch.insert(key.as_slice(), value.as_slice()),
                Op::Delete(key) => sled_batch.remove(key.as_slice()),
            }
        }
        db.apply_batch(sled_batch)
            .map_err(|error| StorageError(error.to_string()))?;
        applied += 1;
    }
    if applied > 0 {
        tracing::info!(
            commits = applied,
            after_seq = durable,
            "replayed acknowledged commits from the commit log"
        );
    }
    Ok(applied > 0)
}

fn create_preallocated(path: &Path) -> io::Result<()> {
    let temporary = path.with_extension("new");
    let file = File::create(&temporary)?;
    let zeros = vec![0u8; 1 << 20];
    let mut written = 0;
    while written < PREALLOCATED_BYTES {
        file.write_all_at(&zeros, written)?;
        written += zeros.len() as u64;
    }
    file.sync_all()?;
    std::fs::rename(&temporary, path)
}

fn encode_record(seq: u64, ops: &[Op]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(16 + ops.len() * 48);
    payload.extend_from_slice(&seq.to_le_bytes());
    payload.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for op in ops {
        let (tag, key, value) = match op {
            Op::Put(key, value) => (PUT, key, Some(value)),
            Op::Delete(key) => (DELETE, key, None),
        };
        payload.push(tag);
        payload.extend_from_slice(&(key.len() as u32).to_le_bytes());
        payload.extend_from_slice(key);
        if let Some(value) = value {
            payload.extend_from_slice(&(value.len() as u32).to_le_bytes());
            payload.extend_from_slice(value);
        }
    }
    let mut record = Vec::with_capacity(HEADER_BYTES + payload.len());
    record.extend_from_slice(&MAGIC.to_le_bytes());
    record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    record.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    record.extend_from_slice(&payload);
    record
}

/// The intact records at the start of `bytes`, up to the first torn,
/// damaged or out-of-order one.
fn read_records(bytes: &[u8]) -> Vec<LoggedBatch> {
    let mut batches: Vec<LoggedBatch> = Vec::new();
    let mut at = 0usize;
    while let Some(header) = bytes.get(at..at + HEADER_BYTES) {
        let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().unwrap());
        let (magic, length, crc) = (word(0), word(4) as usize, word(8));
        if magic != MAGIC || length as u64 > MAX_RECORD_BYTES {
            break;
        }
        let Some(payload) = bytes.get(at + HEADER_BYTES..at + HEADER_BYTES + length) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        let Some(batch) = decode_payload(payload) else {
            break;
        };
        if batches.last().is_some_and(|last| batch.seq < last.seq) {
            break;
        }
        batches.push(batch);
        at += HEADER_BYTES + length;
    }
    batches
}

fn decode_payload(payload: &[u8]) -> Option<LoggedBatch> {
    let mut rest = payload;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = rest.split_at_checked(n)?;
        rest = tail;
        Some(head)
    };
    let seq = u64::from_le_bytes(take(8)?.try_into().ok()?);
    let count = u32::from_le_bytes(take(4)?.try_into().ok()?);
    let mut ops = Vec::new();
    for _ in 0..count {
        let tag = take(1)?[0];
        let key_len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let key = take(key_len)?.to_vec();
        ops.push(match tag {
            PUT => {
                let value_len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
                Op::Put(key, take(value_len)?.to_vec())
            }
            DELETE => Op::Delete(key),
            _ => return None,
        });
    }
    rest.is_empty().then_some(LoggedBatch {
        seq,
        ops,
        encoded_len: (HEADER_BYTES + payload.len()) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(n: u8) -> Vec<Op> {
        vec![
            Op::Put(vec![b'k', n], vec![n; 5]),
            Op::Delete(vec![b'd', n]),
            Op::Put(b"meta".to_vec(), Vec::new()),
        ]
    }

    #[test]
    fn appended_batches_read_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        assert!(open_existing(dir.path()).unwrap().is_none());
        let (mut log, read) = create(dir.path()).unwrap();
        assert!(read.is_empty());
        let size = std::fs::metadata(dir.path().join(COMMIT_LOG_FILE))
            .unwrap()
            .len();
        assert_eq!(size, PREALLOCATED_BYTES, "created preallocated");
        for seq in 1..=3 {
            log.append(seq, &ops(seq as u8)).unwrap();
        }
        let end = log.len();
        drop(log);
        let (reopened, read) = open_existing(dir.path()).unwrap().unwrap();
        let seqs: Vec<u64> = read.iter().map(|batch| batch.seq).collect();
        assert_eq!(seqs, [1, 2, 3]);
        for batch in &read {
            assert_eq!(batch.ops, ops(batch.seq as u8));
        }
        assert_eq!(reopened.len(), end, "appends go after the last record");
    }

    #[test]
    fn a_torn_or_damaged_record_ends_the_log() {
        let first = encode_record(1, &ops(1));
        let second = encode_record(2, &ops(2));
        let mut bytes = [first.clone(), second.clone()].concat();
        assert_eq!(read_records(&bytes).len(), 2);
        // Torn: the second record cut short.
        assert_eq!(read_records(&bytes[..bytes.len() - 1]).len(), 1);
        // Damaged: one flipped bit in the second payload.
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert_eq!(read_records(&bytes).len(), 1);
        // A zeroed tail (the preallocated space) ends it too.
        let zeros = [first, vec![0; 64]].concat();
        assert_eq!(read_records(&zeros).len(), 1);
    }

    #[test]
    fn records_from_before_the_last_checkpoint_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = create(dir.path()).unwrap();
        for seq in 1..=5 {
            log.append(seq, &ops(seq as u8)).unwrap();
        }
        log.start_over();
        assert!(log.is_empty());
        // A shorter record at offset 0 leaves old intact ones after it:
        // they are older, so reading stops there.
        log.append(6, &[]).unwrap();
        drop(log);
        let (_, read) = open_existing(dir.path()).unwrap().unwrap();
        assert_eq!(read.iter().map(|batch| batch.seq).collect::<Vec<_>>(), [6]);
    }

    #[test]
    fn checkpoints_are_wanted_by_size() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = create(dir.path()).unwrap();
        log.start_over();
        assert!(!log.wants_checkpoint());
        let big = vec![Op::Put(b"k".to_vec(), vec![7; CHECKPOINT_BYTES as usize])];
        log.append(1, &big).unwrap();
        assert!(log.wants_checkpoint());
        assert!(log.len() > CHECKPOINT_BYTES);
    }
}
