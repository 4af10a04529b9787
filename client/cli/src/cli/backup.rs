//! `tally admin backup --to DIR`: streams a node's backup (`Admin.Backup`)
//! into `DIR/backup.tally`, and writes a readable `DIR/manifest.json`.
//!
//! The file is written as `backup.tally.partial`, synced, and renamed only
//! once the stream's trailer has arrived, so `backup.tally` always names a
//! complete backup; `tally-node restore` checks it again before using it.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use futures::StreamExt;
use serde::Serialize;
use tally_proto::backup::{BackupWriter, DATA_FILE, FORMAT_VERSION};
use tally_proto::v1::backup_chunk::Part;

use super::output::{print_json, print_line};
use super::Target;

/// The readable summary of a backup, `DIR/manifest.json` (the restore reads
/// `backup.tally` only; this file is for people and scripts).
#[derive(Debug, Serialize)]
struct Manifest {
    format_version: u32,
    file: &'static str,
    cluster_id: String,
    /// The backed-up replica, 16 hex digits.
    replica: String,
    region: String,
    node_name: String,
    /// The recovery point: the replica's durable sequence the backup holds exactly.
    seq: u64,
    /// The state digest at `seq`, 16 hex digits.
    digest: String,
    counters: u64,
    /// Like-set and uniques delta-log records.
    set_deltas: u64,
    bytes: u64,
    started_at_unix_ms: u64,
    finished_at_unix_ms: u64,
}

fn prepare_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("--to {}: cannot create the directory", dir.display()))?;
    if dir.join(DATA_FILE).exists() {
        bail!(
            "--to {} already holds a backup ({DATA_FILE}); give a new directory per backup",
            dir.display()
        );
    }
    Ok(())
}

/// `tally admin backup --to DIR`. A failed backup leaves no file behind.
pub async fn backup(target: &Target, dir: &Path, json: bool) -> anyhow::Result<()> {
    prepare_dir(dir)?;
    let partial: PathBuf = dir.join(format!("{DATA_FILE}.partial"));
    let taken = take(target, dir, &partial, json).await;
    if taken.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    taken
}

async fn take(target: &Target, dir: &Path, partial: &Path, json: bool) -> anyhow::Result<()> {
    let client = target.connect().await?;
    let mut chunks = client.backup().await?;
    let file =
        File::create(partial).with_context(|| format!("cannot create {}", partial.display()))?;
    let mut writer = BackupWriter::new(BufWriter::new(file))?;
    let mut header = None;
    let mut trailer = None;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.context("the backup stream failed; nothing was kept, take it again")?;
        writer.write(&chunk)?;
        match chunk.part {
            Some(Part::Header(first)) if header.is_none() => header = Some(first),
            Some(Part::Counters(_) | Part::Sets(_)) if header.is_some() => {}
            Some(Part::Trailer(last)) if header.is_some() => trailer = Some(last),
            _ => bail!("the node sent the backup out of order; nothing was kept"),
        }
    }
    let (Some(header), Some(trailer)) = (header, trailer) else {
        bail!("the backup stream ended before its trailer (the node stopped?); take it again");
    };
    if header.format_version != FORMAT_VERSION {
        bail!(
            "the node sent backup format version {}, this tally writes version {FORMAT_VERSION}: use a tally CLI of the node's release",
            header.format_version
        );
    }
    let file = writer
        .into_inner()
        .into_inner()
        .map_err(|e| e.into_error())?;
    file.sync_all()?;
    let bytes = file.metadata()?.len();
    drop(file);
    let final_path = dir.join(DATA_FILE);
    std::fs::rename(partial, &final_path)?;
    let manifest = Manifest {
        format_version: header.format_version,
        file: DATA_FILE,
        cluster_id: header.cluster_id,
        replica: format!("{:016x}", header.replica),
        region: header.region,
        node_name: header.node_name,
        seq: trailer.seq,
        digest: format!("{:016x}", trailer.digest),
        counters: trailer.counters,
        set_deltas: trailer.set_deltas,
        bytes,
        started_at_unix_ms: header.started_at_unix_ms,
        finished_at_unix_ms: trailer.finished_at_unix_ms,
    };
    let mut out = File::create(dir.join("manifest.json"))?;
    serde_json::to_writer_pretty(&mut out, &manifest)?;
    out.write_all(b"\n")?;
    out.sync_all()?;
    File::open(dir)?.sync_all()?;
    if json {
        return print_json(&manifest);
    }
    print_line(format_args!(
        "backup of replica {} (region {}, node {}) at seq {}: {} counters, {} like-set and uniques records, {} bytes in {}",
        manifest.replica,
        manifest.region,
        manifest.node_name,
        manifest.seq,
        manifest.counters,
        manifest.set_deltas,
        manifest.bytes,
        final_path.display()
    ))?;
    Ok(())
}
