//! The node's model of a partitioned node, for the simulator to drive
//! (issue 42, item 2): one scoped `Replica` on one `MemoryStore`, the
//! partitions it receives, serves and releases decided by tally-core's
//! [`NodePartitions`] round, its `LIFECYCLE` record kept as the node keeps
//! it, pulls shaped by [`CopySessions`] and reported once what they merged
//! is durable, confirmations asked and answered, and the purge of what is
//! no longer kept, in the order `tally-node`'s shell does each.
//!
//! The partitioned world (`world.rs`) runs one per node slot, with its
//! commits, pulls and confirmations as timed events over the simulated
//! network (`node.rs`, `sync.rs`); the helpers below (`commit_all`, `pull`,
//! `confirm`) drive a few of them over instant messages in the tests.
//!
//! Invariants (the shell's, kept here): a round's record is stored before
//! the round is committed, and a round whose record cannot be stored
//! changes nothing; a pull is reported to the partitions only once every
//! change it merged is durable here; a released partition goes only once
//! every owner confirmed it.

use std::sync::Arc;

use tally_core::runtime::copy_sessions::{CopySessions, PullOutcome};
use tally_core::runtime::{recovered_serving, NodePartitions, RoundOutcome};
use tally_node::crdt::{PnCounter, ReplicaId};
use tally_node::partition::{LifecycleRecord, MemberFacts, ViewSettings};
use tally_node::replica::{
    establish, CommitBatch, Key, PullChunk, PullPlan, PullRequest, PurgeStep, Replica,
    ReplicaConfig,
};
use tally_node::store::{MemoryStore, Store};

use crate::world::CLUSTER;

/// The most bytes one chunk of a pull carries.
const CHUNK_BYTES: usize = 64 << 10;

/// One node as `tally-node` runs it (see the module documentation).
pub struct ScopedNode {
    /// Its node name.
    pub name: String,
    /// Its replica: the one core of the node, scoped by partition.
    pub core: Replica,
    /// Its disk.
    pub store: MemoryStore,
    /// Its lifecycle and holdings.
    pub partitions: NodePartitions,
    /// Its copy sessions, one per peer.
    pub sessions: CopySessions,
    /// Its `LIFECYCLE` file (`None`: a new directory).
    pub record: Option<LifecycleRecord>,
    /// Whether storing the record fails (a full or broken disk).
    pub record_fails: bool,
    settings: ViewSettings,
    config: ReplicaConfig,
}

/// The replica settings a simulated node runs with.
pub fn config() -> ReplicaConfig {
    ReplicaConfig {
        cluster_id: CLUSTER.into(),
        ..Default::default()
    }
}

impl ScopedNode {
    /// A node on a new data directory: it joins.
    pub fn new(name: &str, region: &str, id: u64, settings: ViewSettings, now: u64) -> Self {
        Self::with_config(name, region, id, (settings, config()), now)
    }

    /// [`Self::new`] with its replica's settings.
    pub fn with_config(
        name: &str,
        region: &str,
        id: u64,
        settings: (ViewSettings, ReplicaConfig),
        now: u64,
    ) -> Self {
        let (settings, config) = settings;
        let identity = establish(None, region, id).expect("simulated region names are valid");
        let store = MemoryStore::new(identity.clone());
        let recovered = store.recover(now).expect("a new memory store recovers");
        let core = Replica::open(identity, config.clone(), recovered, now);
        Self::start(name, core, store, None, (settings, config))
    }

    fn start(
        name: &str,
        mut core: Replica,
        store: MemoryStore,
        record: Option<LifecycleRecord>,
        settings: (ViewSettings, ReplicaConfig),
    ) -> Self {
        let (settings, config) = settings;
        core.peers_mut()
            .set_own_partitions(settings.partitions.get());
        // The writers' digests by partition that folds compare, from every
        // stored counter (as a node does after an unclean stop).
        tally_node::store::set_partition_count(&mut core, settings.partitions, &store, None)
            .expect("the memory store reads");
        let identity = core.identity().clone();
        let serving = recovered_serving(record.as_ref(), settings.partitions, false);
        let mut partitions = NodePartitions::new(
            identity.replica,
            name,
            &identity.region,
            record.clone(),
            &serving,
            core.durable_seq(),
            settings,
        );
        partitions.start(&mut core);
        ScopedNode {
            name: name.to_string(),
            core,
            store,
            partitions,
            sessions: CopySessions::default(),
            record,
            record_fails: false,
            settings,
            config,
        }
    }

    /// Kills the node and starts it again on what its disk flushed, with
    /// its stored record.
    pub fn restart(self, now: u64) -> Self {
        self.store.crash();
        let recovered = self.store.recover(now).expect("the memory store recovers");
        let identity = self.store.identity().clone();
        let core = Replica::open(identity, self.config.clone(), recovered, now);
        let settings = (self.settings, self.config);
        Self::start(&self.name, core, self.store, self.record, settings)
    }

    /// Its replica id.
    pub fn id(&self) -> ReplicaId {
        self.core.identity().replica
    }

    /// What gossip says of it, as the others hear it.
    pub fn facts(&self) -> MemberFacts {
        let publication = self.partitions.publication();
        MemberFacts {
            replica: self.id(),
            name: self.name.clone(),
            region: self.core.identity().region.clone(),
            grpc_addr: self.name.clone(),
            alive: true,
            state: publication.state,
            removed: publication.removed,
            drain_requests: publication.drain_requests,
            holding: Some(publication.serving),
            releasing: Some(publication.releasing),
        }
    }

    /// One lifecycle round, as the shell runs it: the record stored if it
    /// changed (`None`, and nothing changed, when that fails), then the
    /// round committed.
    pub fn round(&mut self, now: u64, members: Vec<MemberFacts>) -> Option<RoundOutcome> {
        let durable_seq = self.core.durable_seq();
        let pending = self
            .partitions
            .handle_round(now, members, true, durable_seq, &mut self.core);
        if let Some(record) = pending.record_to_persist() {
            if self.record_fails {
                return None;
            }
            self.record = Some(record);
        }
        Some(pending.commit(&mut self.core))
    }

    /// Hands out the next group commit and writes it, not flushed yet
    /// (a crash before [`Self::finish_commit`] loses it).
    pub fn start_commit(&mut self) -> Option<Arc<CommitBatch>> {
        let batch = self.core.poll_commit()?;
        self.store.write(&batch).expect("the memory store writes");
        Some(batch)
    }

    /// The commit `seq` handed out by [`Self::start_commit`] is flushed.
    pub fn finish_commit(&mut self, seq: u64) {
        self.store.flush().expect("the memory store flushes");
        self.core.handle_commit_done(seq);
    }

    /// Writes and flushes one group commit; returns its sequence.
    pub fn commit(&mut self) -> Option<u64> {
        let seq = self.start_commit()?.seq;
        self.finish_commit(seq);
        Some(seq)
    }

    /// Commits until nothing waits.
    pub fn commit_all(&mut self) {
        while self.commit().is_some() {}
    }

    /// One step of the purge of what is no longer kept, over at most
    /// `limit` stored counters (`None`: no purge runs); its deletions wait
    /// for the next commit.
    pub fn purge_step(&mut self, now: u64, limit: usize) -> Option<PurgeStep> {
        self.partitions
            .purge_step(now, &mut self.core, &self.store, limit)
            .expect("the memory store reads")
    }

    /// Runs the purge of what is no longer kept to its end; returns the
    /// stored counters it looked at (0: no purge ran).
    pub fn purge(&mut self, now: u64) -> usize {
        let mut visited = 0;
        while let Some(step) = self.purge_step(now, 256) {
            visited += step.visited;
            self.commit_all();
            if step.done {
                break;
            }
        }
        visited
    }
}

/// The first request of a pull planned by the peer book (`plan`), as the
/// anti-entropy loop makes it, before the copy sessions fit it.
pub fn pull_request(puller: &ScopedNode, plan: &PullPlan) -> PullRequest {
    PullRequest {
        cluster_id: CLUSTER.into(),
        caller: puller.id(),
        expected: Some(plan.peer),
        after: plan.after.clone(),
        max_bytes: CHUNK_BYTES,
        directory_digest: plan.directory_digest,
        protocol: puller.core.peers().own_protocol(),
        deltas_after: Some(plan.deltas_after.clone()),
        records_from: plan.records_from,
        scope: None,
    }
}

/// `source` answers a pull: every chunk from `request` on, as the server
/// streams them; a refusal ends the stream.
pub fn serve_pull(source: &ScopedNode, mut request: PullRequest) -> Result<Vec<PullChunk>, String> {
    let mut chunks = Vec::new();
    loop {
        let chunk = source
            .core
            .handle_pull(&source.store, &request)
            .map_err(|refused| refused.to_string())?;
        let last = chunk.is_last();
        request.after = chunk.next.clone();
        request.deltas_after = chunk.deltas_next.clone();
        request.records_from = chunk.records_next;
        chunks.push(chunk);
        if last {
            return Ok(chunks);
        }
    }
}

/// `puller` merges the chunks `peer` streamed, in order, until one is
/// refused (what was merged before it stays); returns what they covered
/// and the changed counters.
pub fn merge_pulled(
    now: u64,
    puller: &mut ScopedNode,
    peer: ReplicaId,
    chunks: Vec<PullChunk>,
) -> Result<(PullOutcome, Vec<(Key, PnCounter)>), String> {
    let mut outcome = PullOutcome::default();
    let mut changed = Vec::new();
    for chunk in chunks {
        let (served, through, last) = (chunk.served.clone(), chunk.next.seq, chunk.is_last());
        let report = puller
            .core
            .handle_pull_chunk(now, &puller.store, peer, chunk)
            .map_err(|refused| refused.to_string())?;
        changed.extend(report.changed);
        outcome.add_chunk(served.as_ref(), through, last);
    }
    Ok((outcome, changed))
}

/// One pull of `puller` from `source` over instant messages: the scope
/// the partitions ask for, fitted by the copy sessions, chunk by chunk to
/// the source's durable sequence; reported once what it merged is
/// durable. Returns whether it was reported.
pub fn pull(now: u64, puller: &mut ScopedNode, source: &ScopedNode) -> bool {
    let Some(scope) = puller.partitions.pull_scope(&source.name) else {
        return false;
    };
    let peer = source.id();
    let book = puller.core.peers();
    let plan = PullPlan {
        peer,
        grpc_addr: source.name.clone(),
        after: book.watermark(peer),
        directory_digest: book.directory_digest(peer),
        deltas_after: book.delta_watermark(peer),
        records_from: Some(book.records_watermark(peer)),
    };
    let mut request = pull_request(puller, &plan);
    let scope = puller.sessions.prepare(now, peer, &scope, &mut request);
    let chunks = serve_pull(source, request).expect("a member's pull is served");
    let (outcome, _) = merge_pulled(now, puller, peer, chunks).expect("a member's chunks merge");
    let Some((scope, served, through, read_from_scratch)) =
        puller.sessions.finish(peer, &scope, &outcome)
    else {
        return false;
    };
    // What it merged is durable before the partitions hear of it.
    puller.commit_all();
    puller
        .partitions
        .handle_pulled(&scope, &served, through, &read_from_scratch);
    true
}

/// `asker` asks each owner to confirm what it releases, as `release.rs`
/// does; returns the confirmations it got.
pub fn confirm(asker: &mut ScopedNode, owners: &[&ScopedNode]) -> usize {
    let mut confirmed = 0;
    for (owner, partitions) in asker.partitions.confirm_requests() {
        let Some(node) = owners.iter().find(|node| node.name == owner) else {
            continue;
        };
        let answers = node.partitions.answer_confirms(&asker.name, &partitions);
        confirmed += answers.len();
        asker.partitions.handle_confirms(&owner, &answers);
    }
    confirmed
}

#[cfg(test)]
#[path = "scoped_tests.rs"]
mod tests;
