//! `tally-node restore --from DIR --data-dir NEW`: turns a backup taken by
//! `tally admin backup` into the data directory of a **new** replica.
//!
//! The new replica never takes the backed-up replica's id (DESIGN.md
//! invariant 3): it gets a fresh id, and the backup's counters enter its
//! store as a merge from the old replica, exactly as a pull from it would.
//! Its own slot starts empty; the old replica's slots (and every other
//! replica's) are held at the backup's values. So a restore only ever adds
//! knowledge that max-merge absorbs: joining a live cluster that already
//! holds more of those slots changes nothing there, and counts nothing twice.
//!
//! The backup is read twice: once to check it whole (header first, trailer
//! last, every message decodes) before anything is written, then to merge.
//! The restored state's digests (of the counters, and of the like sets and
//! uniques) must equal the trailer's, or the restore fails and says the
//! backup is damaged. Like sets and uniques (backup format 2)
//! enter the same way, as the old replica's delta-log records merged by max;
//! their count is checked against the trailer's (every directory this build
//! creates holds them). Idempotency records are not in a backup:
//! a client's retry of an add made before the backup is applied again on the
//! new replica (document the recovery point to clients as "the backup's
//! sequence").

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use tally_proto::backup::{BackupReader, DATA_FILE};
use tally_proto::v1 as pb;
use tally_proto::v1::backup_chunk::Part;

use crate::api::convert::chunk_from;
use crate::config::Settings;
use crate::crdt::ReplicaId;
use crate::engine::{Durability, Engine};
use crate::metrics::Metrics;
use crate::replica::{ReplicaConfig, MAX_CHUNK_COUNTERS};
use crate::store::{OnCorrupt, SledStore, Store};

/// Flags of `tally-node restore`.
#[derive(clap::Args, Debug, Clone)]
pub struct RestoreArgs {
    /// The backup directory that `tally admin backup --to DIR` wrote.
    #[arg(long, value_name = "DIR")]
    pub from: PathBuf,
    /// The data directory to create for the new replica (must not exist, or be empty).
    #[arg(long, value_name = "NEW")]
    pub data_dir: PathBuf,
    /// The new replica's region (default: the backed-up replica's region).
    #[arg(long)]
    pub region: Option<String>,
}

/// What a restore did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Restored {
    /// The new replica's id (hex).
    pub replica: String,
    /// Its region.
    pub region: String,
    /// The backed-up replica (hex).
    pub from_replica: String,
    /// Its region.
    pub from_region: String,
    /// The backup's recovery point: the old replica's durable sequence.
    pub from_seq: u64,
    /// The cluster the backup came from.
    pub cluster_id: String,
    /// Counters restored.
    pub counters: u64,
    /// Like-set and uniques delta-log records restored.
    pub set_deltas: u64,
    /// The restored state's digest (hex), equal to the backup's.
    pub digest: String,
}

/// The header and trailer of a backup file, checked whole.
struct Checked {
    header: pb::BackupHeader,
    trailer: pb::BackupTrailer,
}

fn open_backup(path: &Path) -> anyhow::Result<BackupReader<BufReader<File>>> {
    let file = File::open(path)
        .with_context(|| format!("cannot open the backup file {}", path.display()))?;
    BackupReader::new(BufReader::new(file)).with_context(|| path.display().to_string())
}

/// Reads the whole backup once: a header first, a trailer last, nothing
/// after it, and every message in between decodes.
fn check_backup(path: &Path) -> anyhow::Result<Checked> {
    let mut reader = open_backup(path)?;
    let header = match reader.next_chunk()?.and_then(|c| c.part) {
        Some(Part::Header(header)) => header,
        _ => bail!(
            "{} does not start with a backup header: it is damaged",
            path.display()
        ),
    };
    if header.format_version != reader.version() {
        bail!(
            "{}: the header says format version {}, the file says {}: it is damaged",
            path.display(),
            header.format_version,
            reader.version()
        );
    }
    let mut trailer = None;
    let (mut counters, mut set_deltas) = (0u64, 0u64);
    while let Some(chunk) = reader.next_chunk()? {
        match (chunk.part, &trailer) {
            (Some(Part::Counters(part)), None) => counters += part.counters.len() as u64,
            (Some(Part::Sets(part)), None) => set_deltas += part.set_deltas.len() as u64,
            (Some(Part::Trailer(last)), None) => trailer = Some(last),
            _ => bail!("{}: messages out of order: it is damaged", path.display()),
        }
    }
    let Some(trailer) = trailer else {
        bail!(
            "{} has no trailer: the backup did not finish (it was interrupted or is still being copied); take it again",
            path.display()
        );
    };
    if trailer.counters != counters || trailer.set_deltas != set_deltas {
        bail!(
            "{} holds {counters} counters and {set_deltas} like-set and uniques records but its trailer says {} and {}: it is damaged",
            path.display(),
            trailer.counters,
            trailer.set_deltas
        );
    }
    Ok(Checked { header, trailer })
}

fn check_target(dir: &Path) -> anyhow::Result<()> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                bail!(
                    "--data-dir {} is not empty: a restore creates a new replica in a new directory; give a path that does not exist",
                    dir.display()
                );
            }
            Ok(())
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error).with_context(|| format!("--data-dir {}", dir.display())),
    }
}

/// A random replica id that is none of `taken`.
fn fresh_id(taken: &[u64]) -> u64 {
    loop {
        let id: u64 = rand::random();
        if id != 0 && !taken.contains(&id) {
            return id;
        }
    }
}

/// Restores the backup in `args.from` into a new replica in `args.data_dir`.
/// On failure, a data directory that the restore created is removed again.
pub async fn run(args: RestoreArgs) -> anyhow::Result<Restored> {
    let path = args.from.join(DATA_FILE);
    let checked = check_backup(&path)?;
    check_target(&args.data_dir)?;
    let existed = args.data_dir.exists();
    let data_dir = args.data_dir.clone();
    let restored = restore_into(args, &path, checked).await;
    if restored.is_err() && !existed {
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    restored
}

async fn restore_into(
    args: RestoreArgs,
    path: &Path,
    checked: Checked,
) -> anyhow::Result<Restored> {
    let source = ReplicaId(checked.header.replica);
    let region = args.region.unwrap_or(checked.header.region.clone());
    let mut taken: Vec<u64> = checked.trailer.replicas.iter().map(|r| r.replica).collect();
    taken.push(source.0);
    let data_dir = args.data_dir.clone();
    let store_region = region.clone();
    let id = fresh_id(&taken);
    let store = tokio::task::spawn_blocking(move || {
        SledStore::open(&data_dir, &store_region, id, OnCorrupt::Refuse)
    })
    .await
    .context("the store opener died")??;
    let identity = store.identity().clone();
    if identity.replica.0 != id {
        bail!(
            "--data-dir {} already held a replica; a restore needs a new directory",
            args.data_dir.display()
        );
    }
    let store: Arc<dyn Store> = Arc::new(store);
    let defaults = Settings::defaults(args.data_dir.clone());
    let config = ReplicaConfig {
        cluster_id: checked.header.cluster_id.clone(),
        cache_capacity: defaults.cache_capacity,
        idempotency_ttl_ms: defaults.idempotency_ttl.as_millis() as u64,
        idempotency_capacity: defaults.idempotency_capacity,
        sync_interval_ms: defaults.sync_interval.as_millis() as u64,
        #[cfg(feature = "planted-bugs")]
        planted_bug: None,
    };
    let engine = Engine::open(store, config, Durability::Sync, Arc::new(Metrics::new()))?;
    let committer = engine.spawn_committer(|_, _| {});
    let merged = merge_backup(&engine, path, source, &checked).await;
    committer.shutdown().await;
    merged?;
    let (digest, sets_digest, dirty) = {
        let core = engine.core();
        (
            core.digest(),
            core.sets_digest(),
            core.dirty_counters() + core.dirty_sets(),
        )
    };
    if dirty > 0 {
        bail!("{dirty} restored counters were not written: the restore failed; try again");
    }
    if digest.0 != checked.trailer.digest {
        bail!(
            "the restored state's digest {:016x} is not the backup's {:016x}: the backup is damaged; restore another backup",
            digest.0,
            checked.trailer.digest,
        );
    }
    // A backup by a build before the sets digest carries none.
    if let Some(expected) = checked.trailer.sets_digest {
        if sets_digest.0 != expected {
            bail!(
                "the restored like sets' and uniques' digest {:016x} is not the backup's {expected:016x}: the backup is damaged; restore another backup",
                sets_digest.0,
            );
        }
    }
    engine.store().close()?;
    Ok(Restored {
        replica: format!("{:016x}", identity.replica.0),
        region: identity.region,
        from_replica: format!("{:016x}", source.0),
        from_region: checked.header.region.clone(),
        from_seq: checked.trailer.seq,
        cluster_id: checked.header.cluster_id,
        counters: checked.trailer.counters,
        set_deltas: checked.trailer.set_deltas,
        digest: format!("{:016x}", digest.0),
    })
}

/// Merges every counters and sets message of the backup, as chunks pulled
/// from `source`, in commits of about a chunk.
async fn merge_backup(
    engine: &Arc<Engine>,
    path: &Path,
    source: ReplicaId,
    checked: &Checked,
) -> anyhow::Result<()> {
    let mut reader = open_backup(path)?;
    let mut replicas = Some(checked.trailer.replicas.clone());
    while let Some(chunk) = reader.next_chunk()? {
        match chunk.part {
            Some(Part::Counters(part)) => {
                for counters in part.counters.chunks(MAX_CHUNK_COUNTERS) {
                    let wire = pb::PullChunk {
                        source_replica: source.0,
                        counters: counters.to_vec(),
                        replicas: replicas.take().unwrap_or_default(),
                        ..Default::default()
                    };
                    merge_wire(engine, path, source, wire).await?;
                }
            }
            Some(Part::Sets(part)) => {
                let wire = pb::PullChunk {
                    source_replica: source.0,
                    set_deltas: part.set_deltas,
                    deltas_next: Some(Default::default()),
                    ..Default::default()
                };
                merge_wire(engine, path, source, wire).await?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Merges one chunk as if pulled from `source`, then lets the committer
/// catch up (a restore holds about a chunk in memory at a time).
async fn merge_wire(
    engine: &Arc<Engine>,
    path: &Path,
    source: ReplicaId,
    wire: pb::PullChunk,
) -> anyhow::Result<()> {
    let chunk = chunk_from(wire).map_err(|(_, reason)| {
        anyhow::anyhow!("{}: {reason}: the backup is damaged", path.display())
    })?;
    engine
        .merge_chunk(source, chunk)
        .with_context(|| format!("{}: the backup is damaged", path.display()))?;
    engine
        .wait_for_commit_backlog(MAX_CHUNK_COUNTERS / 32)
        .await;
    Ok(())
}
