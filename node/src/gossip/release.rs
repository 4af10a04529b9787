//! The end of a handoff in the runtime (DESIGN.md "Partitioned regions",
//! invariant 8): asking the new owners of the partitions this node releases
//! whether they hold its changes of them, and purging what it stores of the
//! partitions it no longer keeps.
//!
//! - [`spawn_confirmer`]: every sync interval, for each owner that has not
//!   confirmed a released partition through this node's latest change to it
//!   ([`Partitioning::confirm_requests`]), one `Replication.ConfirmHolding`
//!   call (at most one in flight per owner), whose answers go to
//!   [`Partitioning::handle_confirms`]. The lifecycle keeper's next round
//!   deletes what every owner confirmed. An owner that cannot answer (down,
//!   a build without the call) confirms nothing: the partition stays, served.
//! - [`spawn_purger`]: while a purge pass runs, a bounded step every tick
//!   ([`Partitioning::purge_step`]: counters, then like sets and uniques),
//!   then a commit.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tally_proto::v1 as pb;
use tally_proto::v1::replication_client::ReplicationClient;
use tokio::task::JoinHandle;

use super::anti_entropy::{channel_for, forget_channel, AntiEntropyConfig, Channels};
use super::lifecycle::Partitioning;
use crate::api::convert::partition_set_to;
use crate::engine::Engine;
use crate::partition::{Partition, PartitionSet};

/// Stored counters one purge step looks at (bounded work under the core lock).
const PURGE_PER_STEP: usize = 2_000;
/// Time between purge steps while a pass runs.
const PURGE_TICK: Duration = Duration::from_millis(50);

/// Starts asking owners for confirmations, every `config.interval`. Abort
/// the task to stop it.
pub fn spawn_confirmer(
    partitioning: Arc<Partitioning>,
    config: AntiEntropyConfig,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let channels: Channels = Arc::default();
        let asking: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let mut ticker = tokio::time::interval(config.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let requests = partitioning.confirm_requests();
            if requests.is_empty() {
                continue;
            }
            let (_, endpoints) = partitioning.view();
            for (owner, partitions) in requests {
                let Some((_, addr)) = endpoints.get(&owner) else {
                    continue;
                };
                if !lock(&asking).insert(owner.clone()) {
                    continue; // a call to it is in flight
                }
                let Some(channel) = channel_for(&channels, addr, &config) else {
                    lock(&asking).remove(&owner);
                    continue;
                };
                let call = Confirm {
                    partitioning: partitioning.clone(),
                    owner,
                    addr: addr.clone(),
                    partitions,
                };
                let (channels, asking, config) = (channels.clone(), asking.clone(), config.clone());
                tokio::spawn(async move {
                    call.run(channel, &channels, &config).await;
                    lock(&asking).remove(&call.owner);
                });
            }
        }
    })
}

/// One confirmation call to an owner.
struct Confirm {
    partitioning: Arc<Partitioning>,
    owner: String,
    addr: String,
    partitions: PartitionSet,
}

impl Confirm {
    async fn run(
        &self,
        channel: tonic::transport::Channel,
        channels: &Channels,
        config: &AntiEntropyConfig,
    ) {
        let request = pb::ConfirmHoldingRequest {
            cluster_id: config.cluster_id.clone(),
            asker: self.partitioning.node_name().to_string(),
            partitions: Some(partition_set_to(&self.partitions)),
        };
        let mut client = ReplicationClient::new(channel);
        let answer =
            tokio::time::timeout(config.pull_timeout, client.confirm_holding(request)).await;
        let response = match answer {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) => {
                tracing::debug!(owner = %self.owner, %status, "an owner did not confirm released partitions");
                if status.code() == tonic::Code::Unavailable {
                    forget_channel(channels, &self.addr);
                }
                return;
            }
            Err(_) => {
                tracing::debug!(owner = %self.owner, "an owner's confirmation timed out");
                forget_channel(channels, &self.addr);
                return;
            }
        };
        // Only answers about what was asked count.
        let answers: Vec<(Partition, u64)> = response
            .confirmations
            .iter()
            .map(|c| (Partition(c.partition), c.through_seq))
            .filter(|(partition, _)| {
                partition.0 < self.partitions.count().get() && self.partitions.contains(*partition)
            })
            .collect();
        tracing::debug!(owner = %self.owner, asked = %self.partitions.to_hex(), confirmed = answers.len(), "an owner answered about released partitions");
        self.partitioning.handle_confirms(&self.owner, &answers);
    }
}

/// Runs purge steps while a pass runs. Abort the task to stop it.
pub fn spawn_purger(engine: Arc<Engine>, partitioning: Arc<Partitioning>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(PURGE_TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut deleted, mut trimmed, mut sets) = (0usize, 0usize, 0usize);
        loop {
            ticker.tick().await;
            let step = match partitioning.purge_step(&engine, PURGE_PER_STEP) {
                Ok(Some(step)) => step,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(%error, "the purge of released partitions could not read a counter; it tries again");
                    continue;
                }
            };
            deleted += step.deleted;
            trimmed += step.trimmed;
            sets += step.sets_deleted;
            engine
                .metrics()
                .purged_counters
                .inc_by((step.deleted + step.trimmed) as u64);
            engine
                .metrics()
                .purged_sets
                .inc_by(step.sets_deleted as u64);
            engine.wake_committer();
            if step.done {
                tracing::info!(deleted, trimmed, set_deletions = sets, "purge of partitions no longer kept done: counters deleted, counters cut down to this node's own slot, and like sets and uniques deleted");
                (deleted, trimmed, sets) = (0, 0, 0);
            }
        }
    })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
