//! The pulling side of anti-entropy: who the peers are, how far we have pulled
//! from each (the watermark), and whom to pull from in the next round.
//!
//! Each round pulls from one live peer per region, the node's own region
//! included when it has other nodes, rotating among a region's nodes. A peer
//! already being pulled from is skipped (one slow peer never stalls the rest),
//! and a failing one is retried with a growing back-off. Membership comes in as
//! events ([`PeerBook::handle_membership`]); nothing here reads a clock. A
//! peer that shares no protocol version with this node
//! ([`ProtocolWindow::talks_with`]), or that announces another partition
//! count, is listed but never pulled from.

use std::collections::BTreeMap;

use crate::crdt::ReplicaId;

use super::idempotency_sync::RecordsCursor;
use super::sets_sync::DeltaCursor;
use super::types::Cursor;
use super::version::ProtocolWindow;

/// Another node as membership sees it.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Member {
    /// Its replica id.
    pub replica: ReplicaId,
    /// Its region.
    pub region: String,
    /// Its node name.
    pub node_name: String,
    /// Where its gRPC server listens.
    pub grpc_addr: String,
    /// Where it gossips.
    pub gossip_addr: String,
    /// Whether failure detection thinks it is up.
    pub alive: bool,
    /// Its published durable sequence.
    pub durable_seq: u64,
    /// Its published digest.
    pub digest: u64,
    /// Its published sets digest (like sets and uniques); `None` from a
    /// build that publishes none.
    pub sets_digest: Option<u64>,
    /// The protocol versions it announces (1..=1 when it announces none).
    pub protocol: ProtocolWindow,
    /// Its last fold report (retirements and folds), if it published one.
    pub folds: Option<super::folds::FoldReport>,
    /// The partition count it announces (0: none, a build before partitions).
    pub partitions: u32,
    /// The newest version of the build that created its data directory (0:
    /// none announced, a build before it was recorded); see
    /// [`super::version::new_cluster_version`].
    pub born_at: u32,
    /// How many counters it stores, as it last published (`None`: not
    /// published, a build before partitioned regions' status).
    pub counters_stored: Option<u64>,
}

/// A pull to start now.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PullPlan {
    /// The peer to pull from.
    pub peer: ReplicaId,
    /// Its gRPC address.
    pub grpc_addr: String,
    /// Pull changes after this cursor.
    pub after: Cursor,
    /// The peer's directory digest as last received from it, if ever.
    pub directory_digest: Option<u64>,
    /// Pull the delta log (like sets, uniques) after this cursor too.
    pub deltas_after: DeltaCursor,
    /// Pull the peer's idempotency records from this position too
    /// (`idempotency_sync.rs`); `None` for a peer of another region.
    pub records_from: Option<RecordsCursor>,
}

/// What we know of one peer.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct PeerState {
    /// Membership's view of it.
    pub member: Member,
    /// When a pull from it completed last (ms), if ever.
    pub last_success_ms: Option<u64>,
    /// When the pull in flight started, if one is.
    pub in_flight_since_ms: Option<u64>,
    /// Failed pulls in a row.
    pub failures: u32,
    /// Not before this time after a failure.
    pub retry_at_ms: u64,
}

/// The peers, their watermarks and the rotation.
#[derive(Debug, Default)]
pub struct PeerBook {
    peers: BTreeMap<ReplicaId, PeerState>,
    watermarks: BTreeMap<ReplicaId, Cursor>,
    last_region_sync_ms: BTreeMap<String, u64>,
    rotation: u64,
    watermarks_dirty: bool,
    /// Each peer's directory digest as last received with its whole
    /// directory (in memory only: after a restart the first pull gets the
    /// directory again).
    directories: BTreeMap<ReplicaId, u64>,
    /// The protocol versions this node speaks now.
    own_protocol: Option<ProtocolWindow>,
    /// How far the delta log (like sets, uniques) was pulled from each peer.
    delta_watermarks: BTreeMap<ReplicaId, DeltaCursor>,
    delta_watermarks_dirty: bool,
    /// This node's partition count (0: not set, every count agrees).
    own_partitions: u32,
    /// How far the idempotency records of each peer of the region were
    /// pulled (a commit sequence of the peer's; in memory only: after a
    /// restart the records are pulled again, and those known change nothing).
    records_watermarks: BTreeMap<ReplicaId, RecordsCursor>,
}

/// The longest a failing peer waits before it is tried again.
pub const MAX_BACKOFF_MS: u64 = 5_000;

impl PeerBook {
    /// A book with recovered watermarks.
    pub fn new(watermarks: Vec<(ReplicaId, Cursor)>) -> Self {
        PeerBook {
            watermarks: watermarks.into_iter().collect(),
            ..Default::default()
        }
    }

    /// The book with recovered delta-log watermarks.
    pub fn with_delta_watermarks(mut self, watermarks: Vec<(ReplicaId, DeltaCursor)>) -> Self {
        self.delta_watermarks = watermarks.into_iter().collect();
        self
    }

    /// How far the delta log was pulled from `peer` (from the start if never).
    pub fn delta_watermark(&self, peer: ReplicaId) -> DeltaCursor {
        self.delta_watermarks
            .get(&peer)
            .cloned()
            .unwrap_or_default()
    }

    /// Moves `peer`'s delta watermark (never backwards). As for counters,
    /// only a move past records that carried something asks for a commit of
    /// its own (else two idle nodes would commit forever for each other).
    pub fn advance_delta_watermark(&mut self, peer: ReplicaId, cursor: DeltaCursor, carried: bool) {
        let current = self.delta_watermarks.entry(peer).or_default();
        if cursor > *current {
            *current = cursor;
            self.delta_watermarks_dirty |= carried;
        }
    }

    /// Every delta watermark (each commit writes them), and whether one
    /// moved over records since the last call.
    pub fn take_delta_watermarks(&mut self) -> (Vec<(ReplicaId, DeltaCursor)>, bool) {
        let dirty = std::mem::take(&mut self.delta_watermarks_dirty);
        let all = self
            .delta_watermarks
            .iter()
            .map(|(peer, cursor)| (*peer, cursor.clone()))
            .collect();
        (all, dirty)
    }

    /// How far `peer`'s idempotency records were pulled (from the start
    /// if never).
    pub fn records_watermark(&self, peer: ReplicaId) -> RecordsCursor {
        self.records_watermarks
            .get(&peer)
            .copied()
            .unwrap_or_default()
    }

    /// Moves `peer`'s idempotency-record watermark (never backwards).
    pub fn advance_records_watermark(&mut self, peer: ReplicaId, cursor: RecordsCursor) {
        let current = self.records_watermarks.entry(peer).or_default();
        *current = (*current).max(cursor);
    }

    /// The protocol versions this node speaks now (by default, every
    /// version of this build).
    pub fn own_protocol(&self) -> ProtocolWindow {
        self.own_protocol.unwrap_or_default()
    }

    /// Sets the protocol versions this node speaks (when the cluster version
    /// moves).
    pub fn set_own_protocol(&mut self, window: ProtocolWindow) {
        self.own_protocol = Some(window);
    }

    /// Whether this node and `member` share a protocol version and agree on
    /// the partition count (if not, the member is never pulled from, and its
    /// pulls are refused).
    pub fn talks_with(&self, member: &Member) -> bool {
        self.own_protocol().talks_with(&member.protocol) && self.partitions_agree(member)
    }

    /// This node's partition count (0 when not set).
    pub fn own_partitions(&self) -> u32 {
        self.own_partitions
    }

    /// Sets this node's partition count (the data directory's).
    pub fn set_own_partitions(&mut self, partitions: u32) {
        self.own_partitions = partitions;
    }

    /// Whether `member` has the same partition count as this node, or one
    /// of the two announces none (a build before partitions holds every
    /// partition, which agrees with any count).
    pub fn partitions_agree(&self, member: &Member) -> bool {
        member.partitions == 0
            || self.own_partitions == 0
            || member.partitions == self.own_partitions
    }

    /// The member with replica id `replica`, if known.
    pub fn member(&self, replica: ReplicaId) -> Option<&Member> {
        self.peers.get(&replica).map(|peer| &peer.member)
    }

    /// Replaces the membership view (every other node, alive or not).
    pub fn handle_membership(&mut self, members: Vec<Member>) {
        // The same replicas in the same order (a refresh that changed
        // nothing, as most do): the peers are updated where they are
        // instead of moved to a new map.
        let same = members.len() == self.peers.len()
            && members
                .iter()
                .zip(self.peers.keys())
                .all(|(member, replica)| member.replica == *replica);
        if same {
            for (peer, member) in self.peers.values_mut().zip(members) {
                peer.member = member;
            }
            return;
        }
        let mut next = BTreeMap::new();
        for member in members {
            let mut state = self.peers.remove(&member.replica).unwrap_or_default();
            state.member = member;
            next.insert(state.member.replica, state);
        }
        self.peers = next;
    }

    /// The pulls to start in this round.
    pub fn poll_pulls(&mut self, now_ms: u64, own_region: &str) -> Vec<PullPlan> {
        self.poll_pulls_among(now_ms, own_region, |_| true)
    }

    /// [`Self::poll_pulls`] among the peers `worth` pulling from (with
    /// partitioned regions: those that serve a partition this node keeps).
    pub fn poll_pulls_among(
        &mut self,
        now_ms: u64,
        own_region: &str,
        worth: impl Fn(&Member) -> bool,
    ) -> Vec<PullPlan> {
        self.rotation = self.rotation.wrapping_add(1);
        let mut by_region: BTreeMap<&str, Vec<&PeerState>> = BTreeMap::new();
        for peer in self.peers.values() {
            if !self.talks_with(&peer.member) || !worth(&peer.member) {
                continue;
            }
            by_region
                .entry(peer.member.region.as_str())
                .or_default()
                .push(peer);
        }
        let mut plans = Vec::new();
        // The own region first: it is the nearest.
        let mut regions: Vec<&str> = by_region.keys().copied().collect();
        regions.sort_by_key(|region| *region != own_region);
        for region in regions {
            let candidates: Vec<&PeerState> = by_region[region]
                .iter()
                .copied()
                .filter(|peer| peer.member.alive && peer.retry_at_ms <= now_ms)
                .collect();
            if candidates.is_empty() {
                continue;
            }
            let start = (self.rotation as usize) % candidates.len();
            let chosen = (0..candidates.len())
                .map(|offset| candidates[(start + offset) % candidates.len()])
                .find(|peer| peer.in_flight_since_ms.is_none());
            if let Some(peer) = chosen {
                plans.push(PullPlan {
                    peer: peer.member.replica,
                    grpc_addr: peer.member.grpc_addr.clone(),
                    after: self.watermark(peer.member.replica),
                    directory_digest: self.directories.get(&peer.member.replica).copied(),
                    deltas_after: self.delta_watermark(peer.member.replica),
                    // Retries fail over within a region only.
                    records_from: (region == own_region)
                        .then(|| self.records_watermark(peer.member.replica)),
                });
            }
        }
        for plan in &plans {
            if let Some(peer) = self.peers.get_mut(&plan.peer) {
                peer.in_flight_since_ms = Some(now_ms);
            }
        }
        plans
    }

    /// The copies for the next push to the copies (replicated durability):
    /// up to `count` live members of `own_region` that take copy pushes,
    /// starting at the `turn`-th in replica order, so that successive pushes
    /// spread over the region (and a retry after a failure tries others).
    /// With partitioned regions the copier prefers the key's other owners
    /// among them (`gossip/copy_plan.rs`).
    pub fn choose_copies<'a>(
        &'a self,
        own_region: &'a str,
        count: usize,
        turn: u64,
    ) -> Vec<&'a Member> {
        let candidates: Vec<&Member> = self
            .copy_candidates(own_region)
            .filter(|member| member.alive)
            .collect();
        if candidates.is_empty() {
            return Vec::new();
        }
        let start = (turn % candidates.len() as u64) as usize;
        (0..candidates.len().min(count))
            .map(|offset| candidates[(start + offset) % candidates.len()])
            .collect()
    }

    /// Members of `own_region` that could be copies, alive or not: a node
    /// that shares a protocol version with this one.
    pub fn copy_candidates<'a>(&'a self, own_region: &'a str) -> impl Iterator<Item = &'a Member> {
        let own_protocol = self.own_protocol();
        self.peers
            .values()
            .map(|peer| &peer.member)
            .filter(move |member| {
                member.region == own_region && own_protocol.talks_with(&member.protocol)
            })
    }

    /// How far we have pulled from `peer`.
    pub fn watermark(&self, peer: ReplicaId) -> Cursor {
        self.watermarks.get(&peer).cloned().unwrap_or_default()
    }

    /// Moves `peer`'s watermark (after its changes up to `cursor` were merged).
    ///
    /// Only a move past changes that carried counters asks for a commit of its
    /// own: otherwise two idle nodes would commit forever, each commit of one
    /// giving the other an empty change to pull and a watermark to save. A
    /// move over empty changes is saved with the next commit (and, if lost,
    /// costs one cheap re-scan).
    pub fn advance_watermark(&mut self, peer: ReplicaId, cursor: Cursor, carried_counters: bool) {
        if self.watermarks.get(&peer) != Some(&cursor) {
            self.watermarks.insert(peer, cursor);
            self.watermarks_dirty |= carried_counters;
        }
    }

    /// Forgets everything kept about a folded writer as a peer: its pull
    /// watermarks, its directory digest and its sync state. Returns whether
    /// a persisted watermark was among them (its deletion must be committed).
    pub fn forget(&mut self, peer: ReplicaId) -> bool {
        self.peers.remove(&peer);
        self.directories.remove(&peer);
        self.records_watermarks.remove(&peer);
        let watermark = self.watermarks.remove(&peer).is_some();
        let delta = self.delta_watermarks.remove(&peer).is_some();
        watermark || delta
    }

    /// `peer`'s directory digest as last received from it, if ever.
    pub fn directory_digest(&self, peer: ReplicaId) -> Option<u64> {
        self.directories.get(&peer).copied()
    }

    /// `peer` sent its whole directory, with this digest, and all of it is
    /// in ours now.
    pub fn note_directory(&mut self, peer: ReplicaId, digest: u64) {
        self.directories.insert(peer, digest);
    }

    /// A pull from `peer` ended well.
    pub fn handle_pull_finished(&mut self, now_ms: u64, peer: ReplicaId) {
        if let Some(state) = self.peers.get_mut(&peer) {
            state.in_flight_since_ms = None;
            state.failures = 0;
            state.retry_at_ms = 0;
            state.last_success_ms = Some(now_ms);
            self.last_region_sync_ms
                .insert(state.member.region.clone(), now_ms);
        }
    }

    /// A planned pull from `peer` was not made (it serves nothing this
    /// node keeps): the peer may be planned again next round.
    pub fn handle_pull_skipped(&mut self, peer: ReplicaId) {
        if let Some(state) = self.peers.get_mut(&peer) {
            state.in_flight_since_ms = None;
        }
    }

    /// A pull from `peer` failed; it is retried after a back-off.
    pub fn handle_pull_failed(&mut self, now_ms: u64, peer: ReplicaId, interval_ms: u64) {
        if let Some(state) = self.peers.get_mut(&peer) {
            state.in_flight_since_ms = None;
            state.failures = state.failures.saturating_add(1);
            let backoff = interval_ms
                .saturating_mul(1 << state.failures.min(6))
                .min(MAX_BACKOFF_MS);
            state.retry_at_ms = now_ms.saturating_add(backoff);
        }
    }

    /// Every peer's state.
    pub fn peers(&self) -> impl Iterator<Item = &PeerState> {
        self.peers.values()
    }

    /// One peer's state.
    pub fn peer(&self, replica: ReplicaId) -> Option<&PeerState> {
        self.peers.get(&replica)
    }

    /// When we last completed a pull from a node of `region`.
    pub fn last_region_sync_ms(&self, region: &str) -> Option<u64> {
        self.last_region_sync_ms.get(region).copied()
    }

    /// All watermarks, and whether they changed since the last call.
    pub fn take_watermarks(&mut self) -> (Vec<(ReplicaId, Cursor)>, bool) {
        let dirty = std::mem::take(&mut self.watermarks_dirty);
        (
            self.watermarks
                .iter()
                .map(|(id, cursor)| (*id, cursor.clone()))
                .collect(),
            dirty,
        )
    }

    /// Marks the watermarks as needing a commit again (the last one failed).
    pub fn mark_watermarks_dirty(&mut self) {
        self.watermarks_dirty = true;
        self.delta_watermarks_dirty = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, region: &str) -> Member {
        Member {
            replica: ReplicaId(id),
            region: region.into(),
            grpc_addr: format!("127.0.0.1:{id}"),
            alive: true,
            ..Default::default()
        }
    }

    #[test]
    fn one_peer_per_region_own_region_first() {
        let mut book = PeerBook::default();
        book.handle_membership(vec![
            member(1, "us"),
            member(2, "eu"),
            member(3, "eu"),
            member(4, "ap"),
        ]);
        let plans = book.poll_pulls(0, "eu");
        assert_eq!(plans.len(), 3);
        assert!(plans[0].peer == ReplicaId(2) || plans[0].peer == ReplicaId(3));
        // The next round skips the peers still in flight and takes the other eu node.
        let next = book.poll_pulls(1, "eu");
        assert_eq!(next.len(), 1);
        assert_ne!(next[0].peer, plans[0].peer);
    }

    #[test]
    fn dead_and_failing_peers_are_skipped() {
        let mut book = PeerBook::default();
        let mut dead = member(1, "us");
        dead.alive = false;
        book.handle_membership(vec![dead, member(2, "ap")]);
        let plans = book.poll_pulls(0, "eu");
        assert_eq!(
            plans.iter().map(|p| p.peer).collect::<Vec<_>>(),
            vec![ReplicaId(2)]
        );
        book.handle_pull_failed(0, ReplicaId(2), 200);
        assert!(book.poll_pulls(100, "eu").is_empty());
        assert_eq!(book.poll_pulls(400, "eu").len(), 1);
    }

    #[test]
    fn a_peer_with_another_partition_count_is_never_pulled_from() {
        let mut book = PeerBook::default();
        book.set_own_partitions(64);
        let mut other = member(1, "us");
        other.partitions = 128;
        let mut same = member(2, "ap");
        same.partitions = 64;
        let unannounced = member(3, "sa"); // a build before partitions
        book.handle_membership(vec![other.clone(), same, unannounced]);
        assert!(!book.talks_with(&other));
        let pulled: Vec<ReplicaId> = book.poll_pulls(0, "eu").iter().map(|p| p.peer).collect();
        assert_eq!(pulled, vec![ReplicaId(2), ReplicaId(3)]);
    }

    #[test]
    fn a_peer_outside_the_protocol_window_is_never_pulled_from() {
        let mut book = PeerBook::default();
        book.set_own_protocol(ProtocolWindow::at(2, 2));
        let mut old = member(1, "us");
        old.protocol = ProtocolWindow::announced(0, 0); // version 1 only
        let mut current = member(2, "ap");
        current.protocol = ProtocolWindow::at(1, 2);
        book.handle_membership(vec![old.clone(), current]);
        assert!(!book.talks_with(&old));
        let plans = book.poll_pulls(0, "eu");
        assert_eq!(
            plans.iter().map(|p| p.peer).collect::<Vec<_>>(),
            vec![ReplicaId(2)]
        );
        // Before the cluster version moved, the old node was a peer like any.
        book.set_own_protocol(ProtocolWindow::at(1, 2));
        assert_eq!(
            book.poll_pulls(1, "eu").len(),
            1,
            "the old node, ap in flight"
        );
    }

    #[test]
    fn copies_are_live_nodes_of_the_region_that_take_pushes_in_rotation() {
        let mut book = PeerBook::default();
        let mut dead = member(4, "eu");
        dead.alive = false;
        // 5 is a build behind this one's window: never a copy.
        let mut old = member(5, "eu");
        old.protocol = ProtocolWindow::announced(0, 0);
        book.handle_membership(vec![
            member(1, "eu"),
            member(2, "eu"),
            member(3, "us"),
            dead,
            old,
        ]);
        let chosen = |turn| -> Vec<u64> {
            book.choose_copies("eu", 1, turn)
                .iter()
                .map(|m| m.replica.0)
                .collect()
        };
        assert_eq!(chosen(0), vec![1]);
        assert_eq!(chosen(1), vec![2], "the next push goes to the other one");
        assert_eq!(
            book.choose_copies("eu", 5, 0).len(),
            2,
            "only the live ones"
        );
        assert_eq!(
            book.copy_candidates("eu").count(),
            3,
            "the dead one could come back"
        );
        assert!(book.choose_copies("ap", 1, 0).is_empty());
    }

    #[test]
    fn watermarks_are_kept_per_peer_and_reported_once_changed() {
        let mut book = PeerBook::new(vec![(ReplicaId(1), Cursor::after_seq(4))]);
        book.handle_membership(vec![member(1, "us")]);
        assert_eq!(book.poll_pulls(0, "eu")[0].after, Cursor::after_seq(4));
        assert!(!book.take_watermarks().1);
        book.advance_watermark(ReplicaId(1), Cursor::after_seq(7), false);
        assert!(
            !book.take_watermarks().1,
            "an empty move does not ask for a commit"
        );
        book.advance_watermark(ReplicaId(1), Cursor::after_seq(9), true);
        let (marks, dirty) = book.take_watermarks();
        assert!(dirty);
        assert_eq!(marks, vec![(ReplicaId(1), Cursor::after_seq(9))]);
        book.handle_pull_finished(7, ReplicaId(1));
        assert_eq!(book.last_region_sync_ms("us"), Some(7));
    }
}
