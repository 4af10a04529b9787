//! Membership as each node's failure detector sees it, fed to the core's
//! `PeerBook::handle_membership` as events.
//!
//! Invariant: node O sees node X alive once X has been running and reachable
//! by gossip for O's up-delay (100 to 400 ms), and dead once X has been down,
//! paused or unreachable for O's detection delay (0.8 to 1.5 s); shorter blips
//! go unnoticed, as with a phi-accrual detector. Gossip is transitive: X is
//! reachable when a path of two-way links joins them, so a bridge or a one-way
//! partition leaves peers "alive" that a pull cannot reach (pulls then time
//! out and back off, as in the real node).
//!
//! Fold reports (`--retire`) travel with membership, as they do in
//! chitchat: an observer's view of a node's report is refreshed whenever
//! gossip reaches that node now, and otherwise stays the last one heard
//! (stale, never invented).

use tally_node::crdt::ReplicaId;
use tally_node::replica::folds::FoldReport;
use tally_node::replica::Member;

use super::node::SimNode;
use super::UP_DELAY_MAX_MS;
use crate::network::Network;
use crate::rng::{between, stream, Subsystem};

/// See the module documentation.
pub struct Membership {
    n: usize,
    truth: Vec<bool>,
    since: Vec<u64>,
    reported: Vec<bool>,
    up_delay: Vec<u64>,
    down_delay: Vec<u64>,
    /// Per (observer, target): the target's last fold report heard, with
    /// the incarnation that published it.
    reports: Vec<Option<(ReplicaId, FoldReport)>>,
    /// Whether fold reports are gossiped (`--retire`).
    folds: bool,
}

impl Membership {
    /// Everyone up and known to everyone.
    pub fn new(seed: u64, n: usize, folds: bool) -> Self {
        let mut rng = stream(seed, Subsystem::Membership);
        let up_delay = (0..n)
            .map(|_| between(&mut rng, 100, UP_DELAY_MAX_MS))
            .collect();
        let down_delay = (0..n).map(|_| between(&mut rng, 800, 1_500)).collect();
        Membership {
            n,
            truth: vec![true; n * n],
            since: vec![0; n * n],
            reported: vec![true; n * n],
            up_delay,
            down_delay,
            reports: vec![None; n * n],
            folds,
        }
    }

    /// How long `node` takes to see another node up.
    pub fn up_delay(&self, node: usize) -> u64 {
        self.up_delay[node]
    }

    /// Recomputes who can see whom; returns the refreshes to schedule
    /// (observer, delay).
    pub fn changed(&mut self, now: u64, nodes: &[SimNode], net: &Network) -> Vec<(usize, u64)> {
        let n = self.n;
        let running: Vec<bool> = nodes.iter().map(|node| node.up && !node.paused).collect();
        // Components of running nodes joined by two-way links.
        let mut component: Vec<usize> = (0..n).collect();
        fn root(component: &mut [usize], mut x: usize) -> usize {
            while component[x] != x {
                component[x] = component[component[x]];
                x = component[x];
            }
            x
        }
        for a in 0..n {
            for b in (a + 1)..n {
                if running[a] && running[b] && !net.is_blocked(a, b) && !net.is_blocked(b, a) {
                    let (ra, rb) = (root(&mut component, a), root(&mut component, b));
                    component[ra.max(rb)] = ra.min(rb);
                }
            }
        }
        let mut refreshes = Vec::new();
        for observer in 0..n {
            for target in (0..n).filter(|t| *t != observer) {
                let truth = running[target]
                    && root(&mut component, observer) == root(&mut component, target);
                let index = observer * n + target;
                if truth != self.truth[index] {
                    self.truth[index] = truth;
                    self.since[index] = now;
                    let delay = if truth {
                        self.up_delay[observer]
                    } else {
                        self.down_delay[observer]
                    };
                    if truth != self.reported[index] {
                        refreshes.push((observer, delay));
                    }
                }
            }
        }
        refreshes.sort_unstable();
        refreshes.dedup();
        refreshes
    }

    /// Updates `observer`'s view and hands it to its core. Returns the alive
    /// bit set (for the trace) and, when a change is still to be noticed,
    /// the delay of the next refresh.
    pub fn refresh(
        &mut self,
        observer: usize,
        now: u64,
        nodes: &mut [SimNode],
    ) -> (u64, Option<u64>) {
        let mut next: Option<u64> = None;
        let n = self.n;
        let mut members = Vec::with_capacity(n - 1);
        let mut bits = 0u64;
        for target in (0..n).filter(|t| *t != observer) {
            let index = observer * n + target;
            let delay = if self.truth[index] {
                self.up_delay[observer]
            } else {
                self.down_delay[observer]
            };
            if self.reported[index] != self.truth[index] && now >= self.since[index] + delay {
                self.reported[index] = self.truth[index];
            }
            if self.reported[index] != self.truth[index] {
                let wait = self.since[index] + delay - now;
                next = Some(next.map_or(wait, |next| next.min(wait)));
            }
            let alive = self.reported[index];
            if alive {
                bits |= 1 << target;
            }
            let node = &nodes[target];
            if self.folds && self.truth[index] {
                self.reports[index] = Some((node.id(), node.replica.folds().report()));
            }
            // A new incarnation has published nothing the observer heard yet.
            let report = self.reports[index]
                .as_ref()
                .filter(|(id, _)| *id == node.id())
                .map(|(_, report)| report.clone());
            members.push(Member {
                replica: node.id(),
                region: node.region_name.clone(),
                node_name: format!("n{target}"),
                grpc_addr: target.to_string(),
                gossip_addr: String::new(),
                alive,
                durable_seq: node.replica.durable_seq(),
                digest: node.replica.digest().0,
                sets_digest: Some(node.replica.sets_digest().0),
                protocol: node.replica.peers().own_protocol(),
                folds: report,
                partitions: node.replica.peers().own_partitions(),
                born_at: tally_node::replica::version::NEWEST,
                counters_stored: None,
            });
        }
        nodes[observer]
            .replica
            .peers_mut()
            .handle_membership(members);
        (bits, next)
    }
}
