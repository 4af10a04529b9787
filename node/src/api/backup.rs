//! The `Admin.Backup` stream: a consistent snapshot of this node's durable
//! state, read while the node keeps serving.
//!
//! The snapshot is a full pull from the replica's own change log and its
//! whole delta log (like sets and uniques), served chunk by chunk like a
//! peer's (the core's lock is held per chunk only). Each chunk holds
//! counters in their durable state and delta-log records of durable
//! commits; a counter or member changed by a commit while the backup runs
//! comes again, later in the log, with its newer state. The scan ends when
//! both logs reach the durable sequence `S` read, under the same lock, with
//! the digest: merged by max, counters and sets are exactly the durable
//! state at `S`, whose (counters') digest the trailer carries so a restore
//! can check it. Only durable state is ever read (invariant 2), whatever the
//! durability mode. The delta log is never compacted, so read from its start
//! it holds every member and register the node has.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tally_proto::v1 as pb;
use tally_proto::v1::backup_chunk::Part;
use tonic::Status;

use crate::engine::{now_ms, Engine};
use crate::replica::{Cursor, DeltaCursor, PullRequest};

use super::convert::{chunk_to, pull_status};
use super::replication::CHUNK_BYTES;
use super::NodeInfo;

/// The stream of one backup.
pub type BackupStream = Pin<Box<dyn Stream<Item = Result<pb::BackupChunk, Status>> + Send>>;

enum Stage {
    Header(pb::BackupHeader, PullRequest),
    Pulling(PullRequest),
    Done,
}

/// Counter states and delta-log records sent so far.
#[derive(Clone, Copy, Default)]
struct Sent {
    counters: u64,
    set_deltas: u64,
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
        // The whole delta log: every like-set member and uniques register.
        deltas_after: Some(DeltaCursor::default()),
        // Idempotency records expire within a day: a backup leaves them out.
        records_from: None,
        scope: None,
    };
    let stream = futures::stream::unfold(
        (Stage::Header(header, request), Sent::default()),
        move |(stage, sent)| {
            let engine = engine.clone();
            async move { next_messages(&engine, stage, sent) }
        },
    )
    .flat_map(futures::stream::iter);
    Box::pin(stream)
}

type Step = Option<(Vec<Result<pb::BackupChunk, Status>>, (Stage, Sent))>;

fn message(part: Part) -> pb::BackupChunk {
    pb::BackupChunk { part: Some(part) }
}

/// The messages of the next step: the header, or the counters and sets of
/// one pulled chunk (none when it held nothing), and the trailer after the
/// chunk that ends both scans.
fn next_messages(engine: &Engine, stage: Stage, mut sent: Sent) -> Step {
    match stage {
        Stage::Header(header, request) => Some((
            vec![Ok(message(Part::Header(header)))],
            (Stage::Pulling(request), sent),
        )),
        Stage::Pulling(mut request) => {
            let crate::engine::BackupChunk {
                chunk,
                seq,
                digest,
                sets_digest,
            } = match engine.serve_backup_chunk(&request) {
                Ok(served) => served,
                Err(refused) => {
                    tracing::warn!(%refused, "backup stopped");
                    return Some((vec![Err(pull_status(&refused))], (Stage::Done, sent)));
                }
            };
            let last = chunk.is_last();
            request.after = chunk.next.clone();
            if chunk.deltas_next.is_some() {
                request.deltas_after = chunk.deltas_next.clone();
            }
            let wire = chunk_to(&chunk);
            sent.counters += wire.counters.len() as u64;
            sent.set_deltas += wire.set_deltas.len() as u64;
            let mut messages = Vec::new();
            if !wire.counters.is_empty() {
                messages.push(Ok(message(Part::Counters(pb::BackupCounters {
                    counters: wire.counters,
                }))));
            }
            if !wire.set_deltas.is_empty() {
                messages.push(Ok(message(Part::Sets(pb::BackupSets {
                    set_deltas: wire.set_deltas,
                }))));
            }
            if !last {
                return Some((messages, (Stage::Pulling(request), sent)));
            }
            tracing::info!(
                seq,
                counters = sent.counters,
                set_deltas = sent.set_deltas,
                "backup finished"
            );
            messages.push(Ok(message(Part::Trailer(pb::BackupTrailer {
                seq,
                digest: digest.0,
                counters: sent.counters,
                replicas: wire.replicas,
                finished_at_unix_ms: now_ms(),
                set_deltas: sent.set_deltas,
                sets_digest: Some(sets_digest.0),
            }))));
            Some((messages, (Stage::Done, sent)))
        }
        Stage::Done => None,
    }
}
