//! The data directory's lifecycle file, `LIFECYCLE`: the node's own
//! lifecycle state (joining, active, draining, left), the replicas it
//! knows to be removed from the cluster, and the partitions it serves
//! (DESIGN.md "Partitioned regions").
//!
//! Invariant: what the node decided stays decided across restarts. A drain
//! interrupted by a crash resumes (the node comes back draining), a node
//! that became active does not join again, a removal is never forgotten
//! by a node that learned it, and a partition the node served (whose adds
//! only it may hold) is served and handed off again after a restart, never
//! dropped as if it were a copy being received. The file is replaced atomically and durably
//! (temporary file, fsync, rename, fsync of the directory) each time the
//! record changes, which is rare (a state change, a removal, a partition
//! caught up or handed off). A missing
//! file is a new data directory (the node joins). Older builds ignore the
//! file, so it needs no cluster version: a rollback only forgets the state,
//! and the node then publishes none, which peers read as `active`.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::crdt::ReplicaId;
use crate::partition::{LifecycleRecord, NodeState, PartitionCount, PartitionSet};
use crate::store::disk_sync::sync_dir;

/// The file's name in the data directory.
pub const LIFECYCLE_FILE: &str = "LIFECYCLE";

/// Why the lifecycle file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleFileError {
    /// The file does not say what it should.
    #[error("{} is damaged ({problem}); it holds the node's state and the removed replicas: restore it from a backup of the directory, or delete it to have the node join again", path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Reading or writing failed.
    #[error("cannot {action} {}: {error}", path.display())]
    Io {
        /// "read" or "write".
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
}

/// The file's contents.
#[derive(serde::Deserialize, serde::Serialize)]
struct FileText {
    state: String,
    #[serde(default)]
    removed: Vec<String>,
    /// Absent in a file of a build before handoff (it served every partition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    serving: Option<String>,
}

/// The record in `dir`, or `None` when there is none (a new directory);
/// `partitions` is the cluster's partition count (the data directory's).
pub fn load(
    dir: &Path,
    partitions: PartitionCount,
) -> Result<Option<LifecycleRecord>, LifecycleFileError> {
    let path = dir.join(LIFECYCLE_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(LifecycleFileError::Io {
                action: "read",
                path,
                error,
            })
        }
    };
    let damaged = |problem: String| LifecycleFileError::Damaged {
        path: path.clone(),
        problem,
    };
    let stored: FileText = toml::from_str(&text).map_err(|e| damaged(e.to_string()))?;
    let state = NodeState::parse(&stored.state)
        .ok_or_else(|| damaged(format!("unknown state {:?}", stored.state)))?;
    let removed = stored
        .removed
        .iter()
        .map(|text| parse_replica(text).ok_or_else(|| damaged(format!("bad replica id {text:?}"))))
        .collect::<Result<BTreeSet<ReplicaId>, _>>()?;
    let serving = stored
        .serving
        .map(|text| PartitionSet::from_hex(partitions, &text))
        .transpose()
        .map_err(|e| damaged(format!("bad serving partitions: {e}")))?;
    Ok(Some(LifecycleRecord {
        state,
        removed,
        serving,
    }))
}

/// Replaces the record in `dir`, durably.
pub fn store(dir: &Path, record: &LifecycleRecord) -> Result<(), LifecycleFileError> {
    let path = dir.join(LIFECYCLE_FILE);
    let temporary = dir.join(format!("{LIFECYCLE_FILE}.tmp"));
    let io = |error| LifecycleFileError::Io {
        action: "write",
        path: path.clone(),
        error,
    };
    let body = toml::to_string(&FileText {
        state: record.state.as_str().to_string(),
        removed: record
            .removed
            .iter()
            .map(|r| format!("{:016x}", r.0))
            .collect(),
        serving: record.serving.as_ref().map(PartitionSet::to_hex),
    })
    .expect("a string and a list of strings serialize");
    let text = format!(
        "# Written by tally-node: its lifecycle state, the replicas removed from the \
         cluster and the partitions it serves.\n{body}"
    );
    let mut file = std::fs::File::create(&temporary).map_err(io)?;
    file.write_all(text.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&temporary, &path).map_err(io)?;
    sync_dir(dir).map_err(io)
}

/// A replica id as gossip and this file write it: 16 hex digits.
pub fn parse_replica(text: &str) -> Option<ReplicaId> {
    (text.len() == 16)
        .then(|| u64::from_str_radix(text, 16).ok())
        .flatten()
        .map(ReplicaId)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_survives_a_round_trip_and_a_missing_file_is_a_new_directory() {
        let dir = tempfile::tempdir().unwrap();
        let count = PartitionCount::new(64).unwrap();
        assert_eq!(load(dir.path(), count).unwrap(), None);
        let record = LifecycleRecord {
            state: NodeState::Draining,
            removed: BTreeSet::from([ReplicaId(7), ReplicaId(u64::MAX)]),
            serving: None,
        };
        store(dir.path(), &record).unwrap();
        assert_eq!(load(dir.path(), count).unwrap(), Some(record.clone()));
        let mut serving = PartitionSet::empty(count);
        serving.insert(crate::partition::Partition(3));
        serving.insert(crate::partition::Partition(63));
        let replaced = LifecycleRecord {
            state: NodeState::Left,
            serving: Some(serving),
            ..record
        };
        store(dir.path(), &replaced).unwrap();
        assert_eq!(load(dir.path(), count).unwrap(), Some(replaced));
        assert!(!dir.path().join("LIFECYCLE.tmp").exists());
    }

    #[test]
    fn a_damaged_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        for text in [
            "state = \"asleep\"\n",
            "garbage",
            "state = \"active\"\nremoved = [\"xyz\"]\n",
            "state = \"active\"\nserving = \"zz\"\n",
        ] {
            std::fs::write(dir.path().join(LIFECYCLE_FILE), text).unwrap();
            let message = load(dir.path(), PartitionCount::new(64).unwrap())
                .unwrap_err()
                .to_string();
            assert!(message.contains("LIFECYCLE is damaged"), "{message}");
        }
    }
}
