//! The handoff state machine of one node: which partitions it holds, in
//! which state, and when it may serve, copy or delete each. Pure: the view
//! of the cluster, the pulls that completed, the local changes and the
//! answers of other nodes come in as `handle_*` calls; what to do goes out
//! as `poll_*` results.
//!
//! Per partition, a node is in one of these states:
//!
//! ```text
//!            owned       caught up from every live holder, and one at least
//!  (absent) -------> Receiving ---------------------------------> Ready
//!     ^                 | not owned: delete (it holds nobody's    |  ^
//!     |                 v  unique writes: it never served)        |  | owned again
//!     +-------------- (absent)                       not owned    v  |
//!     +------------------------------------------------------ Releasing
//!       every owner confirmed it holds this node's state of the
//!       partition through its latest durable change
//! ```
//!
//! Invariant 8 (DESIGN.md): a partition is never deleted from its last
//! up-to-date holder in a region. A releasing node deletes a partition only
//! once every owner in its view has *confirmed*, while `Ready`, that it has
//! pulled the partition from this node through the node's latest change to
//! it, and that change is durable. A node answers a confirmation only while
//! `Ready` (never while releasing or receiving), so two nodes that disagree
//! about who owns a partition cannot each delete it relying on the other: the
//! later of the two asks a node that is already releasing and gets no answer.
//! A node that takes an add after a confirmation raises its latest change
//! and must be confirmed again. Receiving partitions are deleted freely: a
//! receiving node never takes adds, so it holds only copies.

use std::collections::BTreeMap;

use super::hash::{Partition, PartitionCount};
use super::set::PartitionSet;
use super::view::{ClusterView, NodeInfo};

/// A held partition's state (see the module documentation).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Holding {
    /// Owned, being copied in; not served.
    Receiving,
    /// Owned and caught up; served.
    Ready,
    /// No longer owned; still served until every owner has confirmed.
    Releasing {
        /// Per owner, the sequence through which it confirmed holding this
        /// node's changes of the partition.
        confirmed: BTreeMap<String, u64>,
    },
}

impl Holding {
    /// Its name in status output.
    pub fn as_str(&self) -> &'static str {
        match self {
            Holding::Receiving => "receiving",
            Holding::Ready => "ready",
            Holding::Releasing { .. } => "releasing",
        }
    }
}

/// What this node has pulled from a peer: every change of `partitions` at
/// the peer through sequence `through_seq`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Coverage {
    /// The partitions pulled continuously (from scratch, then by deltas;
    /// or, for one served here already, by deltas since this node started).
    pub partitions: PartitionSet,
    /// Those of `partitions` read from scratch from the peer and by deltas
    /// ever since: this node holds all the peer holds of them, through
    /// `through_seq`, whatever the peer merged before this node pulled it.
    /// Only these are confirmed to a releasing peer.
    pub copied: PartitionSet,
    /// The peer's sequence through which they are pulled.
    pub through_seq: u64,
}

/// A pull to make from a peer, as far as partitions go.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PullScope {
    /// The peer.
    pub peer: String,
    /// The partitions to pull.
    pub partitions: PartitionSet,
    /// Those of `partitions` not read from scratch from the peer yet.
    pub from_scratch: PartitionSet,
    /// Those of `from_scratch` to read from scratch now: being received
    /// here, or being released by the peer (which deletes them only once
    /// its owners hold its whole state of them).
    pub copy: PartitionSet,
    /// The deletion epoch when the pull was planned (see
    /// [`Holdings::handle_pulled`]).
    pub epoch: u64,
}

/// A question for an owner: does it hold this node's state of `partition`?
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ConfirmRequest {
    /// The partition being released.
    pub partition: Partition,
    /// The owner to ask.
    pub owner: String,
    /// The sequence it must have pulled through for the release to finish.
    pub needed_seq: u64,
}

/// The partition states of one node (see the module documentation).
#[derive(Clone, Debug)]
pub struct Holdings {
    name: String,
    region: String,
    count: PartitionCount,
    states: BTreeMap<Partition, Holding>,
    /// Per partition, this node's sequence of its latest change to it.
    latest_change: Vec<u64>,
    durable_seq: u64,
    coverage: BTreeMap<String, Coverage>,
    /// Bumped on every deletion; `deleted_at[p]` is the epoch of p's last.
    epoch: u64,
    deleted_at: Vec<u64>,
    view: Option<ClusterView>,
    /// Partitions that stay receiving even once caught up: this node may
    /// not write them yet (its slots there wait for a fold,
    /// `replica/fold_scoped.rs`), so the other owners serve them.
    held_back: PartitionSet,
}

impl Holdings {
    /// The holdings of node `name` of `region`, recovered from disk: `ready`
    /// are the partitions it held up to date when it stopped (it resumes
    /// handing off those it no longer owns). Every partition it had not
    /// caught up on is copied again. `recovered_seq` is the node's durable
    /// sequence at start: each recovered partition counts as changed then,
    /// so releasing it waits for owners to pull through it.
    pub fn recover(
        name: &str,
        region: &str,
        count: PartitionCount,
        ready: &PartitionSet,
        recovered_seq: u64,
    ) -> Self {
        let mut latest_change = vec![0; count.get() as usize];
        for partition in ready.iter() {
            latest_change[partition.0 as usize] = recovered_seq;
        }
        Holdings {
            name: name.to_string(),
            region: region.to_string(),
            count,
            states: ready.iter().map(|p| (p, Holding::Ready)).collect(),
            latest_change,
            durable_seq: recovered_seq,
            coverage: BTreeMap::new(),
            epoch: 0,
            deleted_at: vec![0; count.get() as usize],
            view: None,
            held_back: PartitionSet::empty(count),
        }
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The state of `partition` here, `None` when not held.
    pub fn state(&self, partition: Partition) -> Option<&Holding> {
        self.states.get(&partition)
    }

    /// Whether this node takes adds and answers reads for `partition`.
    pub fn serves(&self, partition: Partition) -> bool {
        matches!(
            self.states.get(&partition),
            Some(Holding::Ready | Holding::Releasing { .. })
        )
    }

    /// Whether this node keeps `partition`'s state (copies and merges it).
    pub fn keeps(&self, partition: Partition) -> bool {
        self.states.contains_key(&partition)
    }

    /// The partitions this node serves (ready or releasing): what it
    /// publishes as holding, and what it persists to resume from.
    pub fn serving(&self) -> PartitionSet {
        self.matching(|holding| !matches!(holding, Holding::Receiving))
    }

    /// The partitions being released (published, and shown in status).
    pub fn releasing(&self) -> PartitionSet {
        self.matching(|holding| matches!(holding, Holding::Releasing { .. }))
    }

    /// The partitions being copied in.
    pub fn receiving(&self) -> PartitionSet {
        self.matching(|holding| matches!(holding, Holding::Receiving))
    }

    /// Every partition kept here, in any state.
    pub fn kept(&self) -> PartitionSet {
        self.matching(|_| true)
    }

    fn matching(&self, keep: impl Fn(&Holding) -> bool) -> PartitionSet {
        let mut set = PartitionSet::empty(self.count);
        set.extend(
            self.states
                .iter()
                .filter(|(_, holding)| keep(holding))
                .map(|(p, _)| *p),
        );
        set
    }

    /// A new view of the cluster: take up the partitions this node now
    /// owns, start releasing those it no longer owns, and mark ready those
    /// caught up.
    pub fn handle_view(&mut self, view: &ClusterView) {
        for partition in self.count.iter() {
            let owned = view.owns(&self.name, partition);
            match self.states.get(&partition) {
                None if owned => {
                    self.states.insert(partition, Holding::Receiving);
                }
                Some(Holding::Ready) if !owned => {
                    self.states.insert(
                        partition,
                        Holding::Releasing {
                            confirmed: BTreeMap::new(),
                        },
                    );
                }
                Some(Holding::Releasing { .. }) if owned => {
                    self.states.insert(partition, Holding::Ready);
                }
                _ => {}
            }
        }
        self.view = Some(view.clone());
        self.mark_caught_up();
    }

    /// A local change (an add, or a merge that changed something) to a
    /// counter of `partition`, stamped with sequence `seq`.
    pub fn handle_change(&mut self, partition: Partition, seq: u64) {
        let latest = &mut self.latest_change[partition.0 as usize];
        *latest = (*latest).max(seq);
    }

    /// Every change through `seq` is durable.
    pub fn handle_durable(&mut self, seq: u64) {
        self.durable_seq = self.durable_seq.max(seq);
    }

    /// What to pull from `peer` now: the partitions this node keeps that
    /// the peer serves (per the last view), those not covered yet from
    /// scratch. `None` when there is nothing to pull from it.
    pub fn poll_pull_scope(&self, peer: &str) -> Option<PullScope> {
        let view = self.view.as_ref()?;
        let serving = &view.node(peer)?.holding;
        let partitions = self.kept().intersection(serving);
        if partitions.is_empty() {
            return None;
        }
        let peer_node = view.node(peer)?;
        let copied = self
            .coverage
            .get(peer)
            .map_or_else(|| PartitionSet::empty(self.count), |c| c.copied.clone());
        let from_scratch = partitions.difference(&copied);
        let copy = from_scratch
            .intersection(&self.receiving())
            .union(&from_scratch.intersection(&peer_node.releasing));
        Some(PullScope {
            peer: peer.to_string(),
            from_scratch,
            copy,
            partitions,
            epoch: self.epoch,
        })
    }

    /// A pull planned by [`Holdings::poll_pull_scope`] completed through the
    /// peer's sequence `through_seq`; the peer sent the partitions of
    /// `served` (it may have stopped serving some since the view), and
    /// `read_from_scratch` of them from the start of its history (a copy).
    /// Partitions deleted here while it was in flight are not counted as
    /// covered (their copy started before the deletion and is incomplete).
    pub fn handle_pulled(
        &mut self,
        scope: &PullScope,
        served: &PartitionSet,
        through_seq: u64,
        read_from_scratch: &PartitionSet,
    ) {
        let mut covered = scope
            .partitions
            .intersection(served)
            .intersection(&self.kept());
        for partition in scope.partitions.iter() {
            if self.deleted_at[partition.0 as usize] > scope.epoch {
                covered.remove(partition);
            }
        }
        let copied_before = self
            .coverage
            .get(&scope.peer)
            .map_or_else(|| PartitionSet::empty(self.count), |c| c.copied.clone());
        let copied = copied_before
            .union(read_from_scratch)
            .intersection(&covered);
        self.coverage.insert(
            scope.peer.clone(),
            Coverage {
                partitions: covered,
                copied,
                through_seq,
            },
        );
        self.mark_caught_up();
    }

    /// What this node has pulled from `peer`.
    pub fn coverage(&self, peer: &str) -> Option<&Coverage> {
        self.coverage.get(peer)
    }

    /// Answers another node releasing `partition`: the sequence through
    /// which this node has pulled it from `asker`, if this node is `Ready`
    /// for it and has copied it from the asker (from scratch, then by
    /// deltas without a break: deltas alone miss what the asker merged
    /// before this node's cursor on it, while it did not serve the
    /// partition).
    pub fn answer_confirm(&self, partition: Partition, asker: &str) -> Option<u64> {
        if self.states.get(&partition) != Some(&Holding::Ready) {
            return None;
        }
        let coverage = self.coverage.get(asker)?;
        coverage
            .copied
            .contains(partition)
            .then_some(coverage.through_seq)
    }

    /// The confirmations to ask for now: for each partition being released,
    /// each owner (per the last view) that has not confirmed through this
    /// node's latest change to it.
    pub fn poll_confirm_requests(&self) -> Vec<ConfirmRequest> {
        let Some(view) = &self.view else {
            return Vec::new();
        };
        let mut requests = Vec::new();
        for (partition, holding) in &self.states {
            let Holding::Releasing { confirmed } = holding else {
                continue;
            };
            let needed_seq = self.latest_change[partition.0 as usize];
            for owner in view.owners(&self.region, *partition) {
                if confirmed.get(owner).is_none_or(|seq| *seq < needed_seq) {
                    requests.push(ConfirmRequest {
                        partition: *partition,
                        owner: owner.to_string(),
                        needed_seq,
                    });
                }
            }
        }
        requests
    }

    /// An owner's answer to a [`ConfirmRequest`] (`None`: it is not ready,
    /// or has not pulled the partition from this node).
    pub fn handle_confirm(&mut self, partition: Partition, owner: &str, answer: Option<u64>) {
        if let (Some(Holding::Releasing { confirmed }), Some(seq)) =
            (self.states.get_mut(&partition), answer)
        {
            let entry = confirmed.entry(owner.to_string()).or_insert(seq);
            *entry = (*entry).max(seq);
        }
    }

    /// The partitions to delete now, forgotten here at once: released
    /// partitions that every owner confirmed through this node's latest
    /// durable change, that the view shows every owner holding (so this
    /// node's routes send their keys there, not here), and that are `quiet`
    /// (no change to them waits for a commit, which would raise the latest
    /// change once stamped), and quiet receiving ones this node no longer
    /// owns. The runtime stops serving
    /// them before anything can change them again, then deletes what it
    /// stores of them; this node no longer serves or keeps them.
    pub fn poll_deletions(&mut self, quiet: impl Fn(Partition) -> bool) -> Vec<Partition> {
        let Some(view) = &self.view else {
            return Vec::new();
        };
        let mut deletions = Vec::new();
        for (partition, holding) in &self.states {
            let delete = match holding {
                // Not quiet: a merge into it still waits for its commit,
                // and a purge that starts before that commit misses it.
                Holding::Receiving => !view.owns(&self.name, *partition) && quiet(*partition),
                Holding::Ready => false,
                Holding::Releasing { confirmed } => {
                    let latest = self.latest_change[partition.0 as usize];
                    let owners = view.owners(&self.region, *partition);
                    latest <= self.durable_seq
                        && quiet(*partition)
                        && !owners.is_empty()
                        && owners.iter().all(|owner| {
                            *owner != self.name
                                && confirmed.get(*owner).is_some_and(|seq| *seq >= latest)
                                && view
                                    .node(owner)
                                    .is_some_and(|node| node.holding.contains(*partition))
                        })
                }
            };
            if delete {
                deletions.push(*partition);
            }
        }
        if !deletions.is_empty() {
            self.epoch += 1;
        }
        for partition in &deletions {
            self.states.remove(partition);
            self.deleted_at[partition.0 as usize] = self.epoch;
            for coverage in self.coverage.values_mut() {
                coverage.partitions.remove(*partition);
                coverage.copied.remove(*partition);
            }
        }
        deletions
    }

    /// Receiving partitions become ready once pulled from scratch from every
    /// live node of the region that serves them, and from at least one of
    /// them. A holder this node does not see alive (not yet: failure
    /// detection has not heard it since this node started; or down for less
    /// than `dead_after`) is not waited for when another holder was copied,
    /// but it is when it is the only one: ready with nothing copied, this
    /// node would answer reads with what it does not have. Only when every
    /// holder is gone past `dead_after` (or none exists) is there nothing to
    /// copy.
    /// A partition held back stays receiving until this node may write it.
    fn mark_caught_up(&mut self) {
        let ready: Vec<Partition> = self
            .caught_up()
            .into_iter()
            .filter(|partition| !self.held_back.contains(*partition))
            .collect();
        for partition in ready {
            self.states.insert(partition, Holding::Ready);
        }
    }

    /// The receiving partitions this node owns and has caught up on (see
    /// [`Self::mark_caught_up`]).
    fn caught_up(&self) -> Vec<Partition> {
        let Some(view) = &self.view else {
            return Vec::new();
        };
        let mut caught = Vec::new();
        for (partition, holding) in &self.states {
            if *holding != Holding::Receiving || !view.owns(&self.name, *partition) {
                continue;
            }
            let covered = |name: &str| {
                self.coverage
                    .get(name)
                    .is_some_and(|c| c.partitions.contains(*partition))
            };
            let holders: Vec<&NodeInfo> = view
                .nodes()
                .filter(|node| {
                    node.region == self.region
                        && node.name != self.name
                        && !view.is_gone(node)
                        && node.holding.contains(*partition)
                })
                .collect();
            let caught_up = holders
                .iter()
                .filter(|node| node.alive)
                .all(|node| covered(&node.name))
                && (holders.is_empty() || holders.iter().any(|node| covered(&node.name)));
            if caught_up {
                caught.push(*partition);
            }
        }
        caught
    }

    /// The partitions this node may not write yet: once caught up they
    /// stay receiving (not served, so the routes send their keys to the
    /// other owners) until a later call leaves them out.
    pub fn set_held_back(&mut self, held_back: PartitionSet) {
        self.held_back = held_back;
        self.mark_caught_up();
    }

    /// The partitions caught up on but held back: copied in from every
    /// up-to-date holder, waiting only for this node's write gate. One
    /// that some holder still holds but is out of reach (down past
    /// `dead_after`, not removed; or across a split of the region) was
    /// copied from nobody: it is not listed, since this node may lack
    /// counters of it that fold records counted (the caller raises the
    /// fold epoch of those listed past the records it holds no slot of).
    pub fn caught_up_held_back(&self) -> Vec<Partition> {
        let Some(view) = &self.view else {
            return Vec::new();
        };
        let out_of_reach = |partition: Partition| {
            view.nodes().any(|node| {
                node.region == self.region
                    && node.name != self.name
                    && view.is_gone(node)
                    && node.holding.contains(partition)
            })
        };
        self.caught_up()
            .into_iter()
            .filter(|partition| self.held_back.contains(*partition))
            .filter(|partition| !out_of_reach(*partition))
            .collect()
    }

    /// [`Self::caught_up_held_back`] without its check of holders out of
    /// reach: the planted bug `RaiseCopiedFromNobody`.
    #[cfg(feature = "planted-bugs")]
    pub fn caught_up_held_back_from_anyone(&self) -> Vec<Partition> {
        self.caught_up()
            .into_iter()
            .filter(|partition| self.held_back.contains(*partition))
            .collect()
    }
}
