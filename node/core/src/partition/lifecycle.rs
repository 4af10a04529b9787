//! One node's lifecycle (joining, active, draining, left) and the cluster's
//! removals, decided from what gossip says: pure, with the time, the members'
//! published facts and "caught up" as inputs. The runtime
//! (`gossip/lifecycle.rs`) persists what [`Lifecycle::record`] returns when
//! it changes, publishes [`Lifecycle::state`], [`Lifecycle::removed`] and
//! [`Lifecycle::drain_requests`], and builds its [`ClusterView`] with
//! [`Lifecycle::view`].
//!
//! Invariants kept here:
//! - a node's own state only moves forward: joining -> active -> draining,
//!   and to left once it is removed; never back;
//! - the removed set only grows: it is the union of every member's, and a
//!   removed replica is `left` in every view that knows of it (so it owns
//!   nothing), even if it comes back;
//! - a drain of another node is a request that node adopts from gossip (the
//!   node's own state is what counts, and it persists it), so a drain
//!   interrupted by a crash of either side resumes;
//! - ownership is a function of membership facts only (names, regions,
//!   states, removals, and "down for `dead_after` or longer"), never of a
//!   single missed heartbeat: two nodes with the same facts compute the same
//!   owners.
//!
//! What each node holds (`NodeInfo::holding`, `NodeInfo::releasing`) comes
//! from the handoff state machine (`handoff.rs`): this node's from
//! [`Lifecycle::set_own_holding`], the others' from what they publish. A
//! member that publishes none (a build before handoff) holds every
//! partition, as such a build stores every counter; so does this node until
//! the runtime first sets its own.

use std::collections::{BTreeMap, BTreeSet};

use crate::crdt::ReplicaId;

use super::hash::PartitionCount;
use super::set::PartitionSet;
use super::view::{AdminRefusal, ClusterView, DownClock, NodeInfo, NodeState};

/// What gossip says of one other member (one replica).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct MemberFacts {
    /// Its replica id.
    pub replica: ReplicaId,
    /// Its node name.
    pub name: String,
    /// Its region.
    pub region: String,
    /// Where it serves gRPC (host:port).
    pub grpc_addr: String,
    /// Whether failure detection thinks it is up.
    pub alive: bool,
    /// The state it publishes (`active` for a build that publishes none).
    pub state: NodeState,
    /// The replicas it knows to be removed.
    pub removed: BTreeSet<ReplicaId>,
    /// The replicas it asks to drain.
    pub drain_requests: BTreeSet<ReplicaId>,
    /// The partitions it serves (ready or releasing), as it publishes them;
    /// `None` from a build that publishes none (it holds every partition).
    pub holding: Option<PartitionSet>,
    /// Those of `holding` it is handing away.
    pub releasing: Option<PartitionSet>,
}

/// The settings every view is built with.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ViewSettings {
    /// The cluster's partition count.
    pub partitions: PartitionCount,
    /// `--replication-factor`.
    pub replication_factor: u32,
    /// `--dead-after`, in milliseconds.
    pub dead_after_ms: u64,
}

/// What a node keeps on disk of its lifecycle.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LifecycleRecord {
    /// Its own state.
    pub state: NodeState,
    /// The replicas it knows to be removed.
    pub removed: BTreeSet<ReplicaId>,
    /// The partitions it served when the record was written, which it
    /// resumes serving (and handing off) after a restart; `None` in a record
    /// of a build before handoff, whose node held every partition.
    pub serving: Option<PartitionSet>,
}

/// The outcome of an operator's drain.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum DrainStep {
    /// This node was the one to drain: it is draining now (persist it).
    DrainingNow,
    /// The node was draining already.
    AlreadyDraining,
    /// Another node: a request is published; it drains once it sees it.
    Requested(ReplicaId),
}

/// A node's lifecycle; see the module documentation.
#[derive(Clone, Debug)]
pub struct Lifecycle {
    replica: ReplicaId,
    name: String,
    region: String,
    state: NodeState,
    removed: BTreeSet<ReplicaId>,
    drain_requests: BTreeSet<ReplicaId>,
    members: Vec<MemberFacts>,
    down: DownClock,
    down_since: BTreeMap<ReplicaId, u64>,
    /// What this node serves and, of that, releases (`None`: not set yet,
    /// every partition).
    own_holding: Option<(PartitionSet, PartitionSet)>,
    /// What this node persists as served (see [`LifecycleRecord::serving`]).
    serving_record: Option<PartitionSet>,
}

impl Lifecycle {
    /// A node's lifecycle as its data directory recorded it (`None` for a
    /// new directory: the node joins).
    pub fn new(
        replica: ReplicaId,
        name: &str,
        region: &str,
        record: Option<LifecycleRecord>,
    ) -> Self {
        let record = record.unwrap_or(LifecycleRecord {
            state: NodeState::Joining,
            removed: BTreeSet::new(),
            serving: None,
        });
        let mut lifecycle = Lifecycle {
            replica,
            name: name.to_string(),
            region: region.to_string(),
            state: record.state,
            removed: record.removed,
            drain_requests: BTreeSet::new(),
            members: Vec::new(),
            down: DownClock::default(),
            down_since: BTreeMap::new(),
            own_holding: None,
            serving_record: record.serving,
        };
        if lifecycle.removed.contains(&replica) {
            lifecycle.state = NodeState::Left;
        }
        lifecycle
    }

    /// This node's state.
    pub fn state(&self) -> NodeState {
        self.state
    }

    /// The replicas known to be removed.
    pub fn removed(&self) -> &BTreeSet<ReplicaId> {
        &self.removed
    }

    /// The drains this node asks of others (published until they comply).
    pub fn drain_requests(&self) -> &BTreeSet<ReplicaId> {
        &self.drain_requests
    }

    /// What to keep on disk.
    pub fn record(&self) -> LifecycleRecord {
        LifecycleRecord {
            state: self.state,
            removed: self.removed.clone(),
            serving: self.serving_record.clone(),
        }
    }

    /// A draining node that holds nothing any more (every partition it held
    /// was confirmed by its new owners and deleted) has left: it may be
    /// stopped for good. Returns true when the state changed (persist the
    /// record before publishing it).
    pub fn handle_drained(&mut self, holds_nothing: bool) -> bool {
        if self.state == NodeState::Draining && holds_nothing {
            self.state = NodeState::Left;
            return true;
        }
        false
    }

    /// What this node serves now and, of that, releases (from its
    /// [`Holdings`](super::Holdings)): its views and its record say so from
    /// now on.
    pub fn set_own_holding(&mut self, serving: PartitionSet, releasing: PartitionSet) {
        self.serving_record = Some(serving.clone());
        self.own_holding = Some((serving, releasing));
    }

    /// The members as last handled.
    pub fn members(&self) -> &[MemberFacts] {
        &self.members
    }

    /// Takes the members' latest facts at `now_ms`; `caught_up` says whether
    /// a joining node has caught up with its region. Returns true when
    /// [`Lifecycle::record`] changed (persist it before publishing).
    pub fn handle_members(
        &mut self,
        now_ms: u64,
        members: Vec<MemberFacts>,
        caught_up: bool,
    ) -> bool {
        let before = self.record();
        self.down_since.clear();
        for member in &members {
            let key = member.replica.to_string();
            if let Some(since) = self.down.observe(&key, member.alive, now_ms) {
                self.down_since.insert(member.replica, since);
            }
            self.removed.extend(member.removed.iter().copied());
        }
        if self.removed.contains(&self.replica) {
            self.state = NodeState::Left;
        }
        let asked_to_drain = members
            .iter()
            .any(|member| member.drain_requests.contains(&self.replica));
        if asked_to_drain && self.state.takes_ownership() {
            self.state = NodeState::Draining;
        }
        if self.state == NodeState::Joining && caught_up {
            self.state = NodeState::Active;
        }
        // A request is dropped once its target complies (or is gone).
        let removed = &self.removed;
        self.drain_requests.retain(|target| {
            !removed.contains(target)
                && members
                    .iter()
                    .find(|member| member.replica == *target)
                    .is_some_and(|member| member.state.takes_ownership())
        });
        self.members = members;
        self.record() != before
    }

    /// Per node name other than this node's, the member that stands for it
    /// in views: one not removed before a removed one, then a live
    /// incarnation before a down one.
    pub fn representatives(&self) -> BTreeMap<&str, &MemberFacts> {
        let mut by_name: BTreeMap<&str, &MemberFacts> = BTreeMap::new();
        for member in &self.members {
            if member.name == self.name {
                continue;
            }
            let rank = |m: &MemberFacts| (!self.removed.contains(&m.replica), m.alive);
            match by_name.get(member.name.as_str()) {
                Some(kept) if rank(kept) >= rank(member) => {}
                _ => {
                    by_name.insert(&member.name, member);
                }
            }
        }
        by_name
    }

    /// The cluster as this node sees it at `now_ms`: itself and the
    /// [`Lifecycle::representatives`] of the other names.
    pub fn view(&self, now_ms: u64, settings: ViewSettings) -> ClusterView {
        let all = PartitionSet::full(settings.partitions);
        let none = PartitionSet::empty(settings.partitions);
        // A set drawn from another partition count means nothing here (such
        // a member is refused as a peer anyway): it holds none of ours.
        let ours = |set: &PartitionSet| {
            if set.count() == settings.partitions {
                set.clone()
            } else {
                none.clone()
            }
        };
        let (own_holding, own_releasing) = match &self.own_holding {
            _ if self.state == NodeState::Left => (none.clone(), none.clone()),
            Some((serving, releasing)) => (ours(serving), ours(releasing)),
            None => (all.clone(), none.clone()),
        };
        let own = NodeInfo {
            name: self.name.clone(),
            region: self.region.clone(),
            state: self.state,
            alive: true,
            down_since_ms: None,
            holding: own_holding,
            releasing: own_releasing,
        };
        let others = self.representatives().into_values().map(|member| {
            let left = self.removed.contains(&member.replica);
            let (holding, releasing) = if left {
                (none.clone(), none.clone())
            } else {
                (
                    member.holding.as_ref().map_or_else(|| all.clone(), ours),
                    member.releasing.as_ref().map_or_else(|| none.clone(), ours),
                )
            };
            NodeInfo {
                name: member.name.clone(),
                region: member.region.clone(),
                state: if left { NodeState::Left } else { member.state },
                alive: member.alive,
                down_since_ms: self.down_since.get(&member.replica).copied(),
                holding,
                releasing,
            }
        });
        ClusterView::new(
            settings.partitions,
            settings.replication_factor,
            settings.dead_after_ms,
            now_ms,
            std::iter::once(own).chain(others),
        )
    }

    /// `tally admin drain NODE`, checked against `view` (built by
    /// [`Lifecycle::view`]).
    pub fn handle_drain(
        &mut self,
        node: &str,
        view: &ClusterView,
    ) -> Result<DrainStep, AdminRefusal> {
        view.check_drain(node)?;
        if node == self.name {
            if self.state == NodeState::Draining {
                return Ok(DrainStep::AlreadyDraining);
            }
            self.state = NodeState::Draining;
            return Ok(DrainStep::DrainingNow);
        }
        let info = view.node(node).expect("check_drain found it");
        if info.state == NodeState::Draining {
            return Ok(DrainStep::AlreadyDraining);
        }
        if !info.alive {
            return Err(AdminRefusal::DrainDownNode {
                node: node.to_string(),
            });
        }
        let member = self
            .members
            .iter()
            .find(|member| member.name == node && member.alive)
            .expect("a live node of the view is a live member");
        self.drain_requests.insert(member.replica);
        Ok(DrainStep::Requested(member.replica))
    }

    /// `tally admin remove NODE`, checked against `view`: every incarnation
    /// of `node` that is down joins the removed set. Returns those that were
    /// not removed before (persist when not empty).
    pub fn handle_remove(
        &mut self,
        node: &str,
        view: &ClusterView,
    ) -> Result<Vec<ReplicaId>, AdminRefusal> {
        view.check_remove(node)?;
        let fresh: Vec<ReplicaId> = self
            .members
            .iter()
            .filter(|member| member.name == node && !member.alive)
            .map(|member| member.replica)
            .filter(|replica| !self.removed.contains(replica))
            .collect();
        self.removed.extend(fresh.iter().copied());
        Ok(fresh)
    }
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
