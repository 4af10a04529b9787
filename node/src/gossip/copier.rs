//! The pusher of replicated durability over gRPC: the core's sans-IO
//! [`Pusher`] (`tally-core`'s `runtime/pusher.rs`, which the partitioned
//! simulator drives too) takes the core's next push and plans it: each
//! counter to `--write-copies - 1` live nodes holding its key's partition
//! ([`super::copy_plan`]). This loop sends every part with the `Copy` RPC
//! at once, reports each answer (a copy answers only once the push is
//! durable there), and ends the push: the counters enough copies confirmed
//! are done, the others parked in the core until a pause that doubles while
//! pushes keep failing; new counters are pushed meanwhile. The loop only
//! moves messages and keeps time.
//!
//! Invariant: a counter is confirmed only when `write_copies - 1` distinct
//! copies answered `OK` to a call carrying it; every call is bounded by
//! [`PUSH_TIMEOUT`], so a dead copy costs one timeout, never a stuck
//! pusher.

use std::sync::Arc;
use std::time::Duration;

use tally_proto::v1::replication_client::ReplicationClient;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::copies::copy_request_to;
use crate::engine::{now_ms, CopyAttempt, Engine};

use super::anti_entropy::{channel_for, forget_channel, AntiEntropyConfig, Channels};
use super::lifecycle::Partitioning;
use super::pusher::{PushOut, Pusher, MAX_RETRY_PAUSE_MS, PUSH_TIMEOUT_MS};

/// The longest one push to one copy may take (its commit included).
pub const PUSH_TIMEOUT: Duration = Duration::from_millis(PUSH_TIMEOUT_MS);
/// The longest the loop sleeps without a reason to wake.
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(MAX_RETRY_PAUSE_MS);

/// Stops the pusher.
pub struct CopierHandle {
    stop_tx: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl CopierHandle {
    /// Stops pushing; a push in flight is dropped (its adds are answered by
    /// their own deadlines, and a merge on a copy is idempotent).
    pub async fn shutdown(mut self) {
        if let Some(stop_tx) = self.stop_tx.take() {
            let _ = stop_tx.send(());
        }
        let _ = self.task.await;
    }
}

/// Starts the pusher; it dials copies as the anti-entropy loop dials peers
/// (same TLS and source address).
pub fn spawn_copier(
    engine: Arc<Engine>,
    partitioning: Arc<Partitioning>,
    config: AntiEntropyConfig,
) -> CopierHandle {
    let (stop_tx, mut stop_rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        let channels: Channels = Arc::default();
        let mut pusher = Pusher::default();
        loop {
            // Parked counters wait for their pause; new ones are pushed
            // when they come (no busy loop: a failed push's counters are
            // out of the pushes until the pause is over).
            let wait = pusher.retry_at_ms().map_or(MAX_RETRY_PAUSE, |at| {
                Duration::from_millis(at.saturating_sub(now_ms())).min(MAX_RETRY_PAUSE)
            });
            tokio::select! {
                _ = engine.copies_wanted() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = &mut stop_rx => break,
            }
            while push_once(&engine, &partitioning, &channels, &config, &mut pusher).await {}
        }
    });
    CopierHandle {
        stop_tx: Some(stop_tx),
        task,
    }
}

/// Sends the next push, if any (parked counters first, once their pause
/// is over); true when there was one.
async fn push_once(
    engine: &Arc<Engine>,
    partitioning: &Partitioning,
    channels: &Channels,
    config: &AntiEntropyConfig,
    pusher: &mut Pusher,
) -> bool {
    let needed = engine.write_copies().saturating_sub(1);
    let routes = partitioning.routes();
    let (out, live, known) = {
        let mut core = engine.core();
        pusher.retry_due(now_ms(), &mut core);
        let Some(out) = pusher.poll(&mut core, routes.as_deref(), needed) else {
            return false;
        };
        let region = core.identity().region.clone();
        let peers = core.peers();
        let live = peers.choose_copies(&region, usize::MAX, 0).len();
        (out, live, peers.copy_candidates(&region).count())
    };
    let mut problems = send_parts(&out, pusher, channels, config).await;
    let end = {
        let mut core = engine.core();
        pusher.end(now_ms(), &mut core, out.id)
    };
    let Some(end) = end else {
        return true;
    };
    if end.confirmed {
        engine.note_push_ended(None);
        return true;
    }
    if end.fewest_targets < needed {
        problems.push(match routes.as_deref() {
            Some(_) => format!(
                "a key's partition has {} other live holder(s) here, {needed} needed",
                end.fewest_targets
            ),
            None => format!(
                "the region has {live} live node(s) that take copies, {needed} needed ({known} known, alive or not)"
            ),
        });
    }
    let problem = problems.join("; ");
    let confirmed = end.targets_confirmed;
    tracing::debug!(upto_seq = out.upto_seq, confirmed, needed, %problem, "a push to the copies failed");
    engine.note_push_ended(Some(CopyAttempt { confirmed, problem }));
    true
}

/// Sends every part of push `out` at once, each call bounded by
/// [`PUSH_TIMEOUT`], and reports each answer to the pusher; returns what
/// the targets that did not answer `OK` said.
async fn send_parts(
    out: &PushOut,
    pusher: &mut Pusher,
    channels: &Channels,
    config: &AntiEntropyConfig,
) -> Vec<String> {
    let mut calls = tokio::task::JoinSet::new();
    let mut problems = Vec::new();
    for ((name, addr), part) in &out.parts {
        let Some(channel) = channel_for(channels, addr, config) else {
            problems.push(format!("{name}: no channel to {addr}"));
            continue;
        };
        let wire = copy_request_to(part);
        let name = name.clone();
        let addr = addr.clone();
        calls.spawn(async move {
            let mut client = ReplicationClient::new(channel);
            let outcome = tokio::time::timeout(PUSH_TIMEOUT, client.copy(wire)).await;
            let result = match outcome {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(status)) => Err(format!("{name}: {}", status.message())),
                Err(_) => Err(format!(
                    "{name}: no answer within {} ms",
                    PUSH_TIMEOUT.as_millis()
                )),
            };
            (name, addr, result)
        });
    }
    while let Some(joined) = calls.join_next().await {
        match joined {
            Ok((name, _, Ok(()))) => {
                pusher.handle_answer(out.id, &name, true);
            }
            Ok((name, addr, Err(problem))) => {
                pusher.handle_answer(out.id, &name, false);
                forget_channel(channels, &addr);
                problems.push(problem);
            }
            Err(join_error) => problems.push(format!("a push task died: {join_error}")),
        }
    }
    problems
}
