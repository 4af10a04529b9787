//! The lifecycle round of one node (DESIGN.md "Partitioned regions"), run
//! once per gossip round by the runtime: the members' gossiped facts in;
//! once the node has heard the cluster, the view to the holdings (released
//! partitions confirmed by every owner are let go, partitions the node may
//! not write yet are held back); then what the caller must do out, in two
//! phases.
//!
//! [`NodePartitions::handle_round`] computes the next lifecycle and
//! holdings on copies and returns them as a [`PendingRound`]; the caller
//! stores [`PendingRound::record_to_persist`] (the node's `LIFECYCLE`
//! record), and only then calls [`PendingRound::commit`], which hands the
//! served partitions to the replica, starts a purge if one is due and
//! returns a [`RoundOutcome`]: what to publish, the partitions let go, the
//! state change to log. The caller publishes after the commit.
//!
//! Invariants: a lifecycle change is on disk before any peer can see it (so
//! a crash never makes a node take back what it announced); a change that
//! cannot be persisted is not made (the caller drops the pending round and
//! the next round retries). Served partitions are persisted, then handed to
//! the replica (which refuses adds of others), then published, in that
//! order, so that no peer routes a key here before this node takes it, and
//! a restart resumes serving every partition that took adds here. A
//! partition let go stops being served at once, under the same borrow of
//! the replica as the check that let it go, so no add slips in; what is
//! stored of it is purged only once the record no longer names it.

use crate::partition::{Holdings, Lifecycle, LifecycleRecord, MemberFacts, NodeState, Partition};
use crate::partition::{PartitionCount, PartitionSet};
use crate::replica::Replica;

use super::partitions::{changed_record, scope_replica, NodePartitions, Publication};

/// What a committed round asks of the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoundOutcome {
    /// What to publish now (the lifecycle and the holdings).
    pub publication: Publication,
    /// The partitions handed off this round: no longer served or kept here.
    pub deleted: Vec<Partition>,
    /// Whether a purge of what is stored of partitions not kept started.
    pub purge_started: bool,
    /// The node's state before and after, when it changed.
    pub state_change: Option<(NodeState, NodeState)>,
}

/// A round computed on copies: nothing of the lifecycle or the holdings
/// changed until [`PendingRound::commit`]; dropping it (its record could
/// not be stored) leaves them as they were.
#[must_use = "persist its record, then commit it (dropping it changes nothing)"]
pub struct PendingRound<'a> {
    partitions: &'a mut NodePartitions,
    lifecycle: Lifecycle,
    holdings: Holdings,
    deleted: Vec<Partition>,
    heard: bool,
    before: NodeState,
}

impl NodePartitions {
    /// One round at `now_ms`: the `members`' facts in; once the node has
    /// `heard` the cluster, its replica's changes durable through
    /// `durable_seq` and the view to the holdings. `core` is the node's
    /// replica, borrowed for the decisions that read or change it.
    pub fn handle_round(
        &mut self,
        now_ms: u64,
        members: Vec<MemberFacts>,
        heard: bool,
        durable_seq: u64,
        core: &mut Replica,
    ) -> PendingRound<'_> {
        let before = self.lifecycle.state();
        let mut lifecycle = self.lifecycle.clone();
        let mut holdings = self.holdings.clone();
        // A joining node is caught up once it receives nothing more.
        let caught_up = self.has_view && holdings.receiving().is_empty();
        lifecycle.handle_members(now_ms, members, caught_up);
        let mut deleted = Vec::new();
        if heard {
            let count = self.settings.partitions;
            holdings.handle_durable(durable_seq);
            // Against the last round's view, which the routes in use
            // were built from: a partition goes only once they send
            // its keys to owners that hold it (see `poll_deletions`).
            deleted = delete_released(count, core, &mut holdings);
            if !deleted.is_empty() {
                // The replica was told at once (see `delete_released`).
                self.replica_scope = Some((holdings.serving(), holdings.kept()));
            }
            hold_back_gated(count, core, &mut holdings, false);
            holdings.handle_view(&lifecycle.view(now_ms, self.settings));
            hold_back_gated(count, core, &mut holdings, true);
            lifecycle.set_own_holding(holdings.serving(), holdings.releasing());
            lifecycle.handle_drained(self.has_view && holdings.kept().is_empty());
        }
        PendingRound {
            partitions: self,
            lifecycle,
            holdings,
            deleted,
            heard,
            before,
        }
    }
}

impl PendingRound<'_> {
    /// The lifecycle record to store before committing, if it changed.
    pub fn record_to_persist(&self) -> Option<LifecycleRecord> {
        changed_record(&self.partitions.lifecycle, &self.lifecycle)
    }

    /// Makes the round's changes (its record is stored): the replica is
    /// told what the holdings serve and keep, and whether its node departs
    /// (drains or has left); a purge starts if one is due.
    pub fn commit(self, core: &mut Replica) -> RoundOutcome {
        let PendingRound {
            partitions,
            lifecycle,
            holdings,
            deleted,
            heard,
            before,
        } = self;
        let scope = (holdings.serving(), holdings.kept());
        if partitions.replica_scope.as_ref() != Some(&scope) {
            partitions.replica_scope = Some(scope_replica(core, &holdings));
        }
        let publication = Publication::of(&lifecycle, &holdings);
        let after = lifecycle.state();
        // What is stored of a partition goes only once the record no
        // longer names it as served: a restart never serves a
        // partition half purged. The first view purges what a crash
        // left of partitions no longer kept.
        let first_view = heard && !partitions.has_view;
        // A node that drains or has left never owns a partition again:
        // its purge drops its own slots too, those kept before included.
        let departing = core.set_departing(!lifecycle.state().takes_ownership());
        let purge_started =
            !deleted.is_empty() || departing || (first_view && !holdings.kept().is_full());
        if purge_started {
            core.start_purge();
        }
        partitions.lifecycle = lifecycle;
        partitions.holdings = holdings;
        partitions.has_view |= heard;
        RoundOutcome {
            publication,
            deleted,
            purge_started,
            state_change: (before != after).then_some((before, after)),
        }
    }
}

/// Decides which released partitions go now (see
/// [`Holdings::poll_deletions`]), and stops serving them, in one borrow of
/// the replica: their latest changes and quietness are read there, and
/// no add can land in a partition between the check and the replica's
/// refusal of it. Tracking each partition's latest change starts with
/// the first release (commits before count as changing every partition).
fn delete_released(
    count: PartitionCount,
    core: &mut Replica,
    holdings: &mut Holdings,
) -> Vec<Partition> {
    let releasing = holdings.releasing();
    let receiving = holdings.receiving();
    if releasing.is_empty() && receiving.is_empty() {
        return Vec::new();
    }
    if !releasing.is_empty() {
        let since = core.changes_durable_at();
        core.track_partition_changes(count, since);
    }
    for partition in releasing.iter() {
        if let Some(seq) = core.latest_change(partition) {
            holdings.handle_change(partition, seq);
        }
    }
    holdings.handle_durable(core.durable_seq());
    let deleted = holdings.poll_deletions(|partition| core.partition_quiet(count, partition));
    if !deleted.is_empty() {
        scope_replica(core, holdings);
    }
    deleted
}

/// Holds back from serving the partitions this node may not write yet
/// (its slots there wait for a fold, `replica/fold_scoped.rs`): caught
/// up, they stay receiving and the other owners serve them. With
/// `raise`, each caught up and held back first raises its applied fold
/// epoch past the records it holds no slot of (it was copied folded),
/// which opens the gate once the fold of its own slots is behind it.
fn hold_back_gated(
    count: PartitionCount,
    core: &mut Replica,
    holdings: &mut Holdings,
    raise: bool,
) {
    let all = PartitionSet::full(count);
    if raise {
        #[cfg(feature = "planted-bugs")]
        let ready = match core.config().planted_bug {
            Some(crate::replica::PlantedBug::RaiseCopiedFromNobody) => {
                holdings.caught_up_held_back_from_anyone()
            }
            _ => holdings.caught_up_held_back(),
        };
        #[cfg(not(feature = "planted-bugs"))]
        let ready = holdings.caught_up_held_back();
        for partition in ready {
            let epoch = core.raise_copied(partition);
            tracing::debug!(
                partition = partition.0,
                epoch,
                "a partition copied in waits for this node's write gate"
            );
        }
    }
    holdings.set_held_back(core.write_gated(&all));
}
