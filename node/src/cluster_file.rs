//! The data directory's cluster file, `CLUSTER`: the cluster id and the
//! partition count `P` the directory was created with.
//!
//! Invariant: a data directory serves one cluster, with one `P`, for its
//! whole life. A node started on it with another `--cluster-id` (a
//! directory of another cluster) or another `--partitions` is refused with a
//! message naming both values; without `--partitions` it takes the stored
//! one. A directory made by a build before this file (or by a restore)
//! records the settings it is first started with. The file is written once,
//! durably (temporary file, fsync, rename, fsync of the directory), after
//! the store has made the directory a Tally data directory. Older builds
//! ignore it, so it needs no cluster version.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::partition::PartitionCount;
use crate::store::disk_sync::sync_dir;

/// The file's name in the data directory.
pub const CLUSTER_FILE: &str = "CLUSTER";

/// What a data directory records about its cluster.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ClusterFacts {
    /// The cluster id.
    pub cluster_id: String,
    /// The partition count.
    pub partitions: PartitionCount,
}

/// Why the cluster file refuses the node's settings, or cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ClusterFileError {
    /// The directory belongs to another cluster.
    #[error(
        "the data directory {} belongs to cluster {stored:?}, but the node was started with \
         --cluster-id {configured:?}: start it with --cluster-id {stored}, or give it a new \
         --data-dir to join cluster {configured:?} as a new node",
        dir.display()
    )]
    ForeignCluster {
        /// The data directory.
        dir: PathBuf,
        /// The cluster id it records.
        stored: String,
        /// The one given.
        configured: String,
    },
    /// `--partitions` differs from the directory's.
    #[error(
        "the data directory {} was created with --partitions {stored}, but the node was \
         started with --partitions {configured}; a cluster's partition count is fixed when \
         it is created: start it with --partitions {stored} (or without --partitions)",
        dir.display()
    )]
    PartitionsChanged {
        /// The data directory.
        dir: PathBuf,
        /// The count it records.
        stored: u32,
        /// The count given.
        configured: u32,
    },
    /// The file does not say what it should.
    #[error("{} is damaged ({problem}); it must hold cluster_id and partitions as written at creation", path.display())]
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
#[derive(serde::Deserialize)]
struct FileText {
    cluster_id: String,
    partitions: u64,
}

/// Checks the node's settings against the directory's cluster file, or
/// writes it when there is none; returns the facts in force.
pub fn settle(
    dir: &Path,
    cluster_id: &str,
    partitions: Option<PartitionCount>,
) -> Result<ClusterFacts, ClusterFileError> {
    let path = dir.join(CLUSTER_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => {
            return Err(ClusterFileError::Io {
                action: "read",
                path,
                error,
            })
        }
    };
    let Some(text) = text else {
        let facts = ClusterFacts {
            cluster_id: cluster_id.to_string(),
            partitions: partitions.unwrap_or_default(),
        };
        write(dir, &facts)?;
        return Ok(facts);
    };
    let damaged = |problem: String| ClusterFileError::Damaged {
        path: path.clone(),
        problem,
    };
    let stored: FileText = toml::from_str(&text).map_err(|e| damaged(e.to_string()))?;
    let stored_partitions =
        PartitionCount::new(stored.partitions).map_err(|e| damaged(e.to_string()))?;
    if stored.cluster_id != cluster_id {
        return Err(ClusterFileError::ForeignCluster {
            dir: dir.to_path_buf(),
            stored: stored.cluster_id,
            configured: cluster_id.to_string(),
        });
    }
    if let Some(configured) = partitions.filter(|p| *p != stored_partitions) {
        return Err(ClusterFileError::PartitionsChanged {
            dir: dir.to_path_buf(),
            stored: stored_partitions.get(),
            configured: configured.get(),
        });
    }
    Ok(ClusterFacts {
        cluster_id: stored.cluster_id,
        partitions: stored_partitions,
    })
}

fn write(dir: &Path, facts: &ClusterFacts) -> Result<(), ClusterFileError> {
    let path = dir.join(CLUSTER_FILE);
    let temporary = dir.join(format!("{CLUSTER_FILE}.tmp"));
    let io = |error| ClusterFileError::Io {
        action: "write",
        path: path.clone(),
        error,
    };
    let text = format!(
        "# Written by tally-node when this data directory first started. Never edit:\n\
         # a node refuses to start with another --cluster-id or --partitions.\n\
         cluster_id = {:?}\npartitions = {}\n",
        facts.cluster_id, facts.partitions
    );
    let mut file = std::fs::File::create(&temporary).map_err(io)?;
    file.write_all(text.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&temporary, &path).map_err(io)?;
    sync_dir(dir).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(n: u64) -> PartitionCount {
        PartitionCount::new(n).unwrap()
    }

    #[test]
    fn a_new_directory_records_its_settings_and_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let facts = settle(dir.path(), "prod", None).unwrap();
        assert_eq!(facts.partitions, PartitionCount::default());
        // Without --partitions the stored count is taken; the same count is fine.
        assert_eq!(settle(dir.path(), "prod", None).unwrap(), facts);
        assert_eq!(
            settle(dir.path(), "prod", Some(count(1024))).unwrap(),
            facts
        );
        let other = tempfile::tempdir().unwrap();
        let facts = settle(other.path(), "prod", Some(count(64))).unwrap();
        assert_eq!(facts.partitions, count(64));
        assert_eq!(
            settle(other.path(), "prod", None).unwrap().partitions,
            count(64)
        );
    }

    #[test]
    fn another_partition_count_or_cluster_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        settle(dir.path(), "prod", Some(count(64))).unwrap();
        let before = std::fs::read_to_string(dir.path().join(CLUSTER_FILE)).unwrap();
        let error = settle(dir.path(), "prod", Some(count(128))).unwrap_err();
        let message = error.to_string();
        assert!(matches!(
            error,
            ClusterFileError::PartitionsChanged {
                stored: 64,
                configured: 128,
                ..
            }
        ));
        assert!(
            message.contains("start it with --partitions 64"),
            "{message}"
        );
        let error = settle(dir.path(), "staging", None).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("belongs to cluster \"prod\""), "{message}");
        assert!(message.contains("--cluster-id prod"), "{message}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(CLUSTER_FILE)).unwrap(),
            before
        );
    }

    #[test]
    fn a_damaged_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(CLUSTER_FILE),
            "partitions = 0\ncluster_id = \"x\"\n",
        )
        .unwrap();
        let message = settle(dir.path(), "x", None).unwrap_err().to_string();
        assert!(message.contains("CLUSTER is damaged"), "{message}");
        std::fs::write(dir.path().join(CLUSTER_FILE), "garbage").unwrap();
        assert!(matches!(
            settle(dir.path(), "x", None),
            Err(ClusterFileError::Damaged { .. })
        ));
    }
}
