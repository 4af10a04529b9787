//! The fold keeper: the runtime shell around the core's retire/fold protocol
//! (`replica/folds.rs`, `replica/retire.rs`). Once per period it feeds the
//! members' fold reports (from gossip) to the core, lets it retire replaced
//! incarnations after `--retire-after` and commit or adopt fold records,
//! advances the fold sweep by a bounded step, prunes folded writers' peer
//! state and metric series, publishes this node's report, and keeps the
//! fold metrics.
//!
//! Every cluster this build opens folds, by partition, with scoped folds
//! (cluster version 12; the gates of versions 4, 10 and 12 went with the
//! version window). A node whose own id is retired is fenced: the core
//! refuses its adds, and this keeper says so.
//!
//! A node restarted on its old directory holds adds (the core refuses them
//! with UNAVAILABLE) until a round ran on a live peer's report, so that it
//! learns a retirement decided while it was down before it takes an add;
//! this keeper ends the hold. See `--restart-hold` for when a hold is set.
//! A peer that has not heard of the retirement yet ends the hold too: the
//! adds taken then are not lost, because no member folds a retired writer
//! that gossip shows up before its own report shows it fenced, at the state
//! it reports (`replica/folds.rs`, "A retired writer that is up").

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::crdt::ReplicaId;
use crate::engine::{now_ms, Engine};
use crate::gossip::lifecycle::Partitioning;
use crate::gossip::membership::MembershipHandle;
use crate::replica::folds::FoldMember;
use crate::replica::Replica;

/// Stored counters the sweep folds per period (bounded work under the core lock).
const SWEEP_PER_TICK: usize = 2_000;

/// Settings of the keeper.
#[derive(Clone, Debug)]
pub struct FoldKeeperConfig {
    /// This node's name (an old incarnation of it is replaced by this one).
    pub node_name: String,
    /// `--retire-after`.
    pub retire_after: Duration,
    /// How often a round runs.
    pub period: Duration,
}

/// Starts the keeper. Abort the task to stop it.
pub fn spawn_fold_keeper(
    engine: Arc<Engine>,
    membership: Arc<MembershipHandle>,
    partitioning: Arc<Partitioning>,
    config: FoldKeeperConfig,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(config.period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut fenced_logged = false;
        loop {
            ticker.tick().await;
            let store = Arc::clone(engine.store());
            // Read before the core lock: the partitioning takes its own lock
            // and then the core's (the other order deadlocks).
            let removed = partitioning.removed();
            let (report, fenced) = {
                let mut core = engine.core();
                let members = core.fold_members();
                let own = core.identity().replica;
                // A live peer's report carries the cluster's retirements.
                let heard_peer = members
                    .iter()
                    .any(|m| m.alive && m.replica != own && m.report.is_some());
                let mut round_ran = false;
                // Before the round: an incarnation wiped in a new
                // cluster's first seconds is dropped from the member list
                // once its successor appears, and would never be retired.
                core.note_node_names(&members);
                retire_removed(&mut core, &removed, &members);
                let retire_after = config.retire_after.as_millis() as u64;
                let now = now_ms();
                match core.handle_fold_round(now, &config.node_name, &members, Some(retire_after)) {
                    Ok(committed) => {
                        round_ran = true;
                        for record in committed {
                            let writers: Vec<String> =
                                record.writers.iter().map(|(w, _)| w.to_string()).collect();
                            let scoped: Vec<String> = record
                                .scoped
                                .iter()
                                .map(|(w, parts)| {
                                    let parts: Vec<String> =
                                        parts.iter().map(|(p, _)| p.to_string()).collect();
                                    format!("{w} in {}", parts.join("+"))
                                })
                                .collect();
                            tracing::info!(epoch = record.epoch, writers = %writers.join(","), scoped = %scoped.join(","), "fold record committed: these retired writers' slots (and live writers' slots in the partitions named) move into each counter's folded base");
                        }
                    }
                    Err(error) => tracing::warn!(%error, "a member's fold record was refused"),
                }
                if let Err(error) = core.poll_fold_sweep(now, &*store, SWEEP_PER_TICK) {
                    tracing::warn!(%error, "the fold sweep could not read a counter; it tries again");
                }
                for (writer, region) in core.prune_folded() {
                    engine
                        .metrics()
                        .forget_peer(&writer.to_string(), region.as_deref());
                    tracing::info!(%writer, "folded writer pruned: its directory entry, pull watermarks and metric series are gone");
                }
                if heard_peer && round_ran && core.release_restart_hold() {
                    tracing::info!("a peer's fold report arrived: the restart hold ends and adds are taken (unless this replica turned out to be retired)");
                }
                let folds = core.folds();
                let metrics = engine.metrics();
                metrics.folds_done.set(core.folds_done() as i64);
                let waiting = folds.waits().len() + folds.scoped_waits().len();
                metrics.folds_waiting.set(waiting as i64);
                metrics.retired_writers.set(folds.retired().len() as i64);
                (core.fold_report(), core.is_fenced())
            };
            engine.wake_committer();
            membership.publish_folds(&report);
            if fenced && !fenced_logged {
                fenced_logged = true;
                tracing::error!("this node's replica id was retired by the cluster: it is fenced and refuses every add; stop it, wipe its data directory and start it again to join with a new id");
            }
        }
    })
}

/// Retires every removed replica not retired yet (issue 13's "a partition
/// it wrote moved away from it for good": an operator's `tally admin
/// remove` says the node is down for good, and its partitions went to the
/// others), as an operator's retirement would. A removed node seen alive
/// (it came back) is refused until it is down again, and one nobody ever
/// heard of has nothing to fold.
fn retire_removed(core: &mut Replica, removed: &[ReplicaId], members: &[FoldMember]) {
    for &replica in removed {
        if core.folds().is_retired(replica) {
            continue;
        }
        if let Ok(true) = core.handle_retire(replica, members) {
            tracing::info!(%replica, "a removed replica is retired: every partition it wrote moved away for good, and its slots will be folded");
        }
    }
}
