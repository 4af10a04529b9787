//! Which directed links between chaos nodes are cut, and the partition
//! shapes that cut them.
//!
//! A directed link `a -> b` is node `a` talking to node `b`: for replication,
//! `a` pulling from `b` (the TCP connection `a` opens to `b`'s proxy); for
//! gossip, a datagram from `a` to `b`. The proxies in front of every node
//! (`tcp_proxy.rs`, `udp_proxy.rs`) consult [`Links`] for each connection and
//! each datagram, and drop established connections when a rule changes.
//!
//! Invariant: the table is a pure value ([`Partition::cut_pairs`] is a
//! function of the shape and the topology), so a shape can be tested without
//! sockets, and a healed table (`heal`) cuts nothing.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::faults::nodes;
use crate::rng::{between, SimRng};

/// Where the nodes are: `region_of[node]` is the region index of each node.
#[derive(Clone, Debug)]
pub struct Topology {
    /// Region index of each node.
    pub region_of: Vec<usize>,
    /// Regions.
    pub regions: usize,
}

impl Topology {
    /// `regions` regions of `per_region` nodes each; node `i` is in region
    /// `i / per_region`.
    pub fn new(regions: usize, per_region: usize) -> Self {
        Topology {
            region_of: (0..regions * per_region).map(|i| i / per_region).collect(),
            regions,
        }
    }

    /// Nodes.
    pub fn nodes(&self) -> usize {
        self.region_of.len()
    }
}

/// A partition shape, drawn from the seed and printed in the schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Partition {
    /// One node cannot reach anyone and nobody can reach it.
    IsolateNode(usize),
    /// One region's nodes talk among themselves only.
    IsolateRegion(usize),
    /// Two groups of regions that cannot reach each other.
    Halves {
        /// Regions of one side (region 0 is always on this side).
        left: Vec<usize>,
        /// Regions of the other side.
        right: Vec<usize>,
    },
    /// Two groups of nodes that cannot reach each other, and one node that
    /// reaches both.
    Bridge {
        /// One side.
        left: Vec<usize>,
        /// The node that reaches both sides.
        bridge: usize,
        /// The other side.
        right: Vec<usize>,
    },
    /// `puller` cannot pull from (nor gossip to) `source`; `source` still
    /// reaches `puller`.
    OneWay {
        /// The node whose link is cut.
        puller: usize,
        /// The node it cannot reach.
        source: usize,
    },
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Partition::IsolateNode(node) => write!(f, "isolate-node n{node}"),
            Partition::IsolateRegion(region) => write!(f, "isolate-region r{}", region + 1),
            Partition::Halves { left, right } => {
                let side = |group: &[usize]| {
                    group
                        .iter()
                        .map(|r| format!("r{}", r + 1))
                        .collect::<Vec<_>>()
                        .join(",")
                };
                write!(f, "halves {} | {}", side(left), side(right))
            }
            Partition::Bridge {
                left,
                bridge,
                right,
            } => write!(f, "bridge {} | n{bridge} | {}", nodes(left), nodes(right)),
            Partition::OneWay { puller, source } => {
                write!(
                    f,
                    "one-way n{puller} -/-> n{source} (n{source} still reaches n{puller})"
                )
            }
        }
    }
}

impl Partition {
    /// The directed links this shape cuts, as `(from, to)` pairs.
    pub fn cut_pairs(&self, topology: &Topology) -> BTreeSet<(usize, usize)> {
        let n = topology.nodes();
        let both_ways = |inside: &dyn Fn(usize) -> bool| {
            let mut pairs = BTreeSet::new();
            for a in (0..n).filter(|a| inside(*a)) {
                for b in (0..n).filter(|b| !inside(*b)) {
                    pairs.insert((a, b));
                    pairs.insert((b, a));
                }
            }
            pairs
        };
        match self {
            Partition::IsolateNode(node) => both_ways(&|a| a == *node),
            Partition::IsolateRegion(region) => both_ways(&|a| topology.region_of[a] == *region),
            Partition::Halves { left, .. } => both_ways(&|a| left.contains(&topology.region_of[a])),
            Partition::Bridge { left, right, .. } => {
                let mut pairs = BTreeSet::new();
                for a in left {
                    for b in right {
                        pairs.insert((*a, *b));
                        pairs.insert((*b, *a));
                    }
                }
                pairs
            }
            Partition::OneWay { puller, source } => BTreeSet::from([(*puller, *source)]),
        }
    }

    /// Draws a shape that cuts at least one link (`None` for a single node).
    pub fn draw(rng: &mut SimRng, topology: &Topology) -> Option<Partition> {
        let n = topology.nodes();
        if n < 2 {
            return None;
        }
        let pick = |rng: &mut SimRng, count: usize| between(rng, 0, count as u64 - 1) as usize;
        loop {
            let shape = match between(rng, 0, 4) {
                0 => Partition::IsolateNode(pick(rng, n)),
                1 if topology.regions >= 2 => Partition::IsolateRegion(pick(rng, topology.regions)),
                2 if topology.regions >= 2 => {
                    // A proper subset of the regions, holding region 0 so that
                    // a split and its mirror image print the same way.
                    let size = between(rng, 1, (topology.regions as u64 - 1) / 2 + 1) as usize;
                    let mut others: Vec<usize> = (1..topology.regions).collect();
                    let mut group = vec![0];
                    while group.len() < size.min(topology.regions - 1) {
                        group.push(others.remove(pick(rng, others.len())));
                    }
                    group.sort_unstable();
                    Partition::Halves {
                        left: group,
                        right: others,
                    }
                }
                3 if n >= 3 => {
                    let bridge = pick(rng, n);
                    let rest: Vec<usize> = (0..n).filter(|a| *a != bridge).collect();
                    let regions: BTreeSet<usize> =
                        rest.iter().map(|a| topology.region_of[*a]).collect();
                    let (left, right): (Vec<usize>, Vec<usize>) = if regions.len() >= 2 {
                        // Split by region: the first region drawn against the rest.
                        let regions: Vec<usize> = regions.into_iter().collect();
                        let left_region = regions[pick(rng, regions.len())];
                        rest.iter()
                            .partition(|a| topology.region_of[**a] == left_region)
                    } else {
                        let half = rest.len() / 2;
                        (rest[..half].to_vec(), rest[half..].to_vec())
                    };
                    Partition::Bridge {
                        left,
                        bridge,
                        right,
                    }
                }
                4 => {
                    let puller = pick(rng, n);
                    let mut source = pick(rng, n - 1);
                    if source >= puller {
                        source += 1;
                    }
                    Partition::OneWay { puller, source }
                }
                _ => continue,
            };
            return Some(shape);
        }
    }
}

/// The shared table of cut links, read by every proxy.
#[derive(Clone)]
pub struct Links {
    cut: Arc<Mutex<BTreeSet<(usize, usize)>>>,
    generation_tx: Arc<watch::Sender<u64>>,
}

impl Default for Links {
    fn default() -> Self {
        Links {
            cut: Arc::default(),
            generation_tx: Arc::new(watch::channel(0).0),
        }
    }
}

impl Links {
    /// True when `from` must not reach `to`.
    pub fn is_cut(&self, from: usize, to: usize) -> bool {
        self.cut
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(from, to))
    }

    /// Replaces the table; proxies re-check their open connections.
    pub fn set(&self, pairs: BTreeSet<(usize, usize)>) {
        *self.cut.lock().unwrap_or_else(|p| p.into_inner()) = pairs;
        self.generation_tx
            .send_modify(|generation| *generation += 1);
    }

    /// Cuts nothing.
    pub fn heal(&self) {
        self.set(BTreeSet::new());
    }

    /// Wakes whenever the table changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation_tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{stream, Subsystem};

    #[test]
    fn halves_cut_exactly_the_cross_links() {
        let topology = Topology::new(3, 2);
        let halves = Partition::Halves {
            left: vec![0],
            right: vec![1, 2],
        };
        assert_eq!(halves.to_string(), "halves r1 | r2,r3");
        let cut = halves.cut_pairs(&topology);
        let mut expected = BTreeSet::new();
        for a in 0..6 {
            for b in 0..6 {
                if (topology.region_of[a] == 0) != (topology.region_of[b] == 0) {
                    expected.insert((a, b));
                }
            }
        }
        assert_eq!(cut, expected);
        assert!(!cut.contains(&(0, 1)), "nodes of one region still talk");
        assert!(!cut.contains(&(2, 5)), "regions on one side still talk");
        assert_eq!(cut.len(), 2 * 2 * 4);
    }

    #[test]
    fn one_way_and_bridge_cut_what_they_say() {
        let topology = Topology::new(3, 1);
        let one_way = Partition::OneWay {
            puller: 2,
            source: 0,
        };
        assert_eq!(one_way.cut_pairs(&topology), BTreeSet::from([(2, 0)]));
        let bridge = Partition::Bridge {
            left: vec![0],
            bridge: 1,
            right: vec![2],
        };
        assert_eq!(
            bridge.cut_pairs(&topology),
            BTreeSet::from([(0, 2), (2, 0)])
        );
        let isolate = Partition::IsolateNode(1).cut_pairs(&topology);
        assert_eq!(isolate, BTreeSet::from([(0, 1), (1, 0), (1, 2), (2, 1)]));
    }

    #[test]
    fn drawn_shapes_cut_something_and_never_a_self_link() {
        for (regions, per_region) in [(2, 1), (3, 1), (2, 2), (3, 2)] {
            let topology = Topology::new(regions, per_region);
            let mut rng = stream(7, Subsystem::Plan);
            for _ in 0..200 {
                let shape = Partition::draw(&mut rng, &topology).unwrap();
                let cut = shape.cut_pairs(&topology);
                assert!(!cut.is_empty(), "{shape} cuts nothing");
                assert!(cut.iter().all(|(a, b)| a != b), "{shape}");
            }
        }
    }

    #[test]
    fn the_table_answers_per_direction_and_heals() {
        let links = Links::default();
        let mut changes = links.subscribe();
        links.set(BTreeSet::from([(1, 0)]));
        assert!(links.is_cut(1, 0));
        assert!(!links.is_cut(0, 1));
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        links.heal();
        assert!(!links.is_cut(1, 0));
        assert!(changes.has_changed().unwrap());
    }
}
