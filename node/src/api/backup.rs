//! The `Admin.Backup` stream: a consistent snapshot of this node's durable
//! state, read while the node keeps serving.
//!
//! The snapshot is a full pull from the replica's own change log, served
//! chunk by chunk like a peer's (the core's lock is held per chunk only).
//! Each chunk holds counters in their durable state; a counter changed by a
//! commit while the backup runs comes again, later in the log, with its newer
//! state. The scan ends at the durable sequence `S` it reads, under the same
//! lock, with the digest: merged by max, the counters are exactly the durable
//! state at `S`, whose digest the trailer carries so a restore can check it.
//! Only durable state is ever read (invariant 2), whatever the durability mode.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tally_proto::v1 as pb;
use tally_proto::v1::backup_chunk::Part;
use tonic::Status;

use crate::engine::{now_ms, Engine};
use crate::replica::{Cursor, PullRequest};

use super::convert::{chunk_to, pull_status};
use super::replication::CHUNK_BYTES;
use super::NodeInfo;

/// The stream of one backup.
pub type BackupStream = Pin<Box<dyn Stream<Item = Result<pb::BackupChunk, Status>> + Send>>;

enum Stage {
    Header(pb::BackupHeader, PullRequest),
    Counters(PullRequest),
    Trailer(pb::BackupTrailer),
    Done,
}

/// The backup of `engine`'s durable state, as a stream that reads a chunk
/// each time the caller asks for the next message.
pub fn backup_stream(engine: Arc<Engine>, info: &NodeInfo) -> BackupStream {
    let (identity, start_seq, protocol) = {
        let core = engine.core();
        let protocol = core.peers().own_protocol();
        (core.identity().clone(), core.durable_seq(), protocol)
    };
    tracing::info!(start_seq, "backup started");
    let header = pb::BackupHeader {
        format_version: tally_proto::backup::FORMAT_VERSION,
        cluster_id: info.cluster_id.clone(),
        replica: identity.replica.0,
        region: identity.region,
        node_name: info.node_name.clone(),
        start_seq,
        started_at_unix_ms: now_ms(),
    };
    let request = PullRequest {
        cluster_id: info.cluster_id.clone(),
        caller: identity.replica,
        expected: Some(identity.replica),
        after: Cursor::default(),
        max_bytes: CHUNK_BYTES,
        directory_digest: None,
        // The node reads itself: always in its own window.
        protocol,
        // Backups hold counters only (like sets and uniques: not yet).
        deltas_after: None,
    };
    let sent = 0u64;
    let stream = futures::stream::unfold(
        (Stage::Header(header, request), sent),
        move |(stage, sent)| {
            let engine = engine.clone();
            async move { next_message(&engine, stage, sent) }
        },
    );
    Box::pin(stream)
}

type Step = Option<(Result<pb::BackupChunk, Status>, (Stage, u64))>;

fn message(part: Part) -> pb::BackupChunk {
    pb::BackupChunk { part: Some(part) }
}

fn next_message(engine: &Engine, stage: Stage, mut sent: u64) -> Step {
    match stage {
        Stage::Header(header, request) => Some((
            Ok(message(Part::Header(header))),
            (Stage::Counters(request), sent),
        )),
        Stage::Counters(mut request) => loop {
            let (chunk, seq, digest) = match engine.serve_backup_chunk(&request) {
                Ok(served) => served,
                Err(refused) => {
                    tracing::warn!(%refused, "backup stopped");
                    return Some((Err(pull_status(&refused)), (Stage::Done, sent)));
                }
            };
            let wire = chunk_to(&chunk);
            sent += wire.counters.len() as u64;
            let next = if chunk.complete {
                tracing::info!(seq, counters = sent, "backup finished");
                Stage::Trailer(pb::BackupTrailer {
                    seq,
                    digest: digest.0,
                    counters: sent,
                    replicas: wire.replicas,
                    finished_at_unix_ms: now_ms(),
                })
            } else {
                request.after = chunk.next;
                Stage::Counters(request)
            };
            if !wire.counters.is_empty() {
                let counters = pb::BackupCounters {
                    counters: wire.counters,
                };
                return Some((Ok(message(Part::Counters(counters))), (next, sent)));
            }
            match next {
                Stage::Counters(again) => request = again,
                trailer => return next_message(engine, trailer, sent),
            }
        },
        Stage::Trailer(trailer) => Some((Ok(message(Part::Trailer(trailer))), (Stage::Done, sent))),
        Stage::Done => None,
    }
}
