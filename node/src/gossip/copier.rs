//! The pusher of replicated durability: whenever the core has counters whose
//! replicated adds wait for their copies, take one push
//! ([`crate::replica::Replica::poll_push`]), send it with the `Copy` RPC to
//! `--write-copies - 1` live nodes of the region per counter: nodes that
//! hold the key's partition, its other owners first ([`super::copy_plan`]),
//! among the members that take copies
//! ([`crate::replica::PeerBook::choose_copies`]), and report back which
//! counters enough copies confirmed (each answers only once the push is
//! durable there). The others are parked in the core and go into a push
//! again after a short pause that doubles while pushes keep failing; new
//! counters are pushed meanwhile. The loop only moves messages; what to
//! push and what counts as confirmed is the core's decision.
//!
//! Invariant: a counter is confirmed only when `write_copies - 1` distinct
//! copies answered `OK` to a call carrying it; every call is bounded by
//! [`PUSH_TIMEOUT`], so a dead copy costs one timeout, never a stuck
//! pusher.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_proto::v1::replication_client::ReplicationClient;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::copies::copy_request_to;
use crate::engine::{CopyAttempt, Engine};
use crate::replica::CopyPush;

use super::anti_entropy::{channel_for, forget_channel, AntiEntropyConfig, Channels};
use super::copy_plan::{plan_copies_by_routes, CopyPlan};
use super::lifecycle::Partitioning;

/// The longest one push to one copy may take (its commit included).
pub const PUSH_TIMEOUT: Duration = Duration::from_millis(1_500);
/// The pause before a failed push is tried again (on other copies); it
/// doubles with each failure in a row, up to [`MAX_RETRY_PAUSE`].
pub const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between two attempts of a failing push.
pub const MAX_RETRY_PAUSE: Duration = Duration::from_secs(1);

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
        let mut turn: u64 = 0;
        let mut failures: u32 = 0;
        // When the counters of failed pushes (parked in the core) go
        // into a push again.
        let mut retry_at: Option<Instant> = None;
        loop {
            let wait = retry_at.map_or(MAX_RETRY_PAUSE, |at| {
                at.saturating_duration_since(Instant::now())
                    .min(MAX_RETRY_PAUSE)
            });
            tokio::select! {
                _ = engine.copies_wanted() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = &mut stop_rx => break,
            }
            if retry_at.is_some_and(|at| at <= Instant::now()) {
                retry_at = None;
                engine.core().retry_parked();
            }
            // Failed counters wait for their pause out of the pushes, so
            // new adds go on being pushed meanwhile without a busy loop.
            while let Some(confirmed) =
                push_once(&engine, &partitioning, &channels, &config, turn).await
            {
                turn = turn.wrapping_add(1);
                if !confirmed {
                    failures = failures.saturating_add(1);
                    let pause = (RETRY_PAUSE * 2u32.pow(failures.min(5) - 1)).min(MAX_RETRY_PAUSE);
                    retry_at.get_or_insert(Instant::now() + pause);
                } else if retry_at.is_none() && !engine.core().has_parked() {
                    failures = 0;
                }
            }
        }
    });
    CopierHandle {
        stop_tx: Some(stop_tx),
        task,
    }
}

/// Sends the next push, if any; `Some(confirmed)` when there was one.
async fn push_once(
    engine: &Arc<Engine>,
    partitioning: &Partitioning,
    channels: &Channels,
    config: &AntiEntropyConfig,
    turn: u64,
) -> Option<bool> {
    let needed = engine.write_copies().saturating_sub(1);
    let (push, candidates, known) = {
        let mut core = engine.core();
        let push = core.poll_push()?;
        let region = core.identity().region.clone();
        let peers = core.peers();
        let candidates: Vec<(String, String)> = peers
            .choose_copies(&region, usize::MAX, turn)
            .into_iter()
            .map(|member| (member.node_name.clone(), member.grpc_addr.clone()))
            .collect();
        let known = peers.copy_candidates(&region).count();
        (push, candidates, known)
    };
    if needed == 0 {
        engine.note_copy_done(push.upto_seq, &vec![true; push.counters.len()]);
        return Some(true);
    }
    let routes = partitioning.routes();
    let plan = plan_copies_by_routes(
        push.counters.iter().map(|(key, ..)| key.as_bytes()),
        routes.as_deref(),
        &candidates,
        needed,
        turn,
    );
    let (answered, mut problems) = send_plan(&push, &plan, channels, config).await;
    let counters = plan.confirmed_counters(&answered, needed, push.counters.len());
    engine.note_copy_done(push.upto_seq, &counters);
    if counters.iter().all(|ok| *ok) {
        return Some(true);
    }
    if plan.fewest_targets() < needed {
        problems.push(match routes.as_deref() {
            Some(_) => format!(
                "a key's partition has {} other live holder(s) here, {needed} needed",
                plan.fewest_targets()
            ),
            None => format!(
                "the region has {} live node(s) that take copies, {needed} needed ({known} known, alive or not)",
                candidates.len()
            ),
        });
    }
    let problem = problems.join("; ");
    let confirmed = answered.iter().filter(|ok| **ok).count();
    tracing::debug!(upto_seq = push.upto_seq, confirmed, needed, %problem, "a push to the copies failed");
    engine.note_copy_failure(CopyAttempt { confirmed, problem });
    Some(false)
}

/// Sends each target of `plan` its counters of `push` (and all of the
/// push's records), all at once; returns which answered `OK`, and what the
/// others said.
async fn send_plan(
    push: &CopyPush,
    plan: &CopyPlan,
    channels: &Channels,
    config: &AntiEntropyConfig,
) -> (Vec<bool>, Vec<String>) {
    let mut calls = tokio::task::JoinSet::new();
    for (index, (name, addr)) in plan.targets.iter().enumerate() {
        let Some(channel) = channel_for(channels, addr, config) else {
            continue;
        };
        let part = CopyPush {
            counters: plan
                .counters_for(index)
                .into_iter()
                .map(|counter| push.counters[counter].clone())
                .collect(),
            cluster_id: push.cluster_id.clone(),
            source: push.source,
            region: push.region.clone(),
            upto_seq: push.upto_seq,
            protocol: push.protocol,
            records: push.records.clone(),
            id_keys: push.id_keys.clone(),
        };
        let wire = copy_request_to(&part);
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
            (index, addr, result)
        });
    }
    let mut answered = vec![false; plan.targets.len()];
    let mut problems = Vec::new();
    while let Some(joined) = calls.join_next().await {
        match joined {
            Ok((index, _, Ok(()))) => answered[index] = true,
            Ok((_, addr, Err(problem))) => {
                forget_channel(channels, &addr);
                problems.push(problem);
            }
            Err(join_error) => problems.push(format!("a push task died: {join_error}")),
        }
    }
    (answered, problems)
}
