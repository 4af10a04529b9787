//! Partitioned regions in a chaos run (`--replication-factor`): which keys a
//! node owns as its partition map says (its clients add only to those), and
//! the final settle, which replaces the digest comparison of a run where
//! every node holds everything.
//!
//! Settled means, read from every running node over its real gRPC port
//! (`Admin.PartitionMap`, and a full unscoped `Pull`):
//! - every node of a region computes the same map;
//! - no node is joining or draining any more, every owner holds exactly the
//!   partitions it owns, caught up, and releases nothing, a node that left
//!   holds nothing, and every node is alive but those the run removed
//!   (`left` and down for good);
//! - for every key, its owners in every region hold the same state (that
//!   state is the run's final state, checked slot by slot by `check.rs`);
//! - a node that does not own a key stores at most its own slot of it, and
//!   that slot equals the owners' (DESIGN.md invariant 8: what a node handed
//!   away is held by the owners; and no stray copy is kept);
//! - like sets and uniques belong to their key's partition too: `--likes`
//!   waits for and checks their owners (`likes.rs`, [`set_owners`]).
//!
//! A run that does not settle within the timeout fails with what was still
//! unsettled at the last look.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tally_client::{Client, PartitionMap};
use tally_node::crdt::PnCounter;
use tally_proto::partition::PartitionCount;

use super::check::read_state;
use super::node::NodeProc;
use crate::checker::Checker;

/// Each key's partition, and the nodes' names (what partition maps list).
pub struct KeyPlacement {
    /// Per key index, its partition.
    pub partition_of_key: Vec<u32>,
    /// Per node index, its name.
    pub node_names: Vec<String>,
}

impl KeyPlacement {
    /// The placement of `names` among `partitions` partitions.
    pub fn new(partitions: PartitionCount, names: &[String], node_names: Vec<String>) -> Self {
        KeyPlacement {
            partition_of_key: names
                .iter()
                .map(|name| partitions.of_key(name.as_bytes()).0)
                .collect(),
            node_names,
        }
    }

    /// Per key, whether `map` lists node `node` among its owners (a node
    /// absent from the map owns nothing).
    pub fn owned_by(&self, map: &PartitionMap, node: usize) -> Vec<bool> {
        let index = map
            .nodes
            .iter()
            .position(|entry| entry.node_name == self.node_names[node]);
        self.partition_of_key
            .iter()
            .map(|partition| {
                index.is_some_and(|index| {
                    map.owners
                        .get(*partition as usize)
                        .is_some_and(|owners| owners.contains(&(index as u32)))
                })
            })
            .collect()
    }

    fn node_index(&self, name: &str) -> Option<usize> {
        self.node_names.iter().position(|n| n == name)
    }
}

/// The running nodes (by index) that own `key`'s partition in their
/// region, as each node's own map says (a node that does not answer owns
/// nothing here).
pub async fn set_owners(
    nodes: &[NodeProc],
    running: &[bool],
    partitions: tally_proto::partition::PartitionCount,
    key: &str,
) -> Vec<usize> {
    let names: Vec<String> = nodes.iter().map(|node| node.name.clone()).collect();
    let placement = KeyPlacement::new(partitions, &[key.to_string()], names);
    let mut owners = Vec::new();
    for (i, node) in nodes.iter().enumerate().filter(|(i, _)| running[*i]) {
        let Ok(client) = Client::connect(node.endpoint.clone()).await else {
            continue;
        };
        if let Ok(map) = client.partition_map(None).await {
            if placement.owned_by(&map, i)[0] {
                owners.push(i);
            }
        }
    }
    owners
}

/// What one look at the running nodes found.
struct Look {
    /// The final state per key (from the key's first holder), if settled.
    finals: Vec<PnCounter>,
    /// What is not settled yet, one line each (empty: settled).
    unsettled: Vec<String>,
    /// Keys held whole per node index (printed once settled).
    held: BTreeMap<usize, usize>,
}

/// Waits until the running nodes settle (module documentation); returns the
/// final state per key, or what was still unsettled at the timeout.
pub async fn settle(
    nodes: &[NodeProc],
    running: &[bool],
    cluster: &str,
    names: &[String],
    placement: &KeyPlacement,
    timeout: Duration,
) -> Result<Vec<PnCounter>, Vec<String>> {
    let started = Instant::now();
    loop {
        let look = look(nodes, running, cluster, names, placement).await;
        if look.unsettled.is_empty() {
            let held: Vec<String> = look
                .held
                .iter()
                .map(|(node, keys)| format!("n{node} {keys}"))
                .collect();
            println!(
                "placement settled {} ms after the heal; keys held whole of {}: {}",
                started.elapsed().as_millis(),
                names.len(),
                held.join(", ")
            );
            return Ok(look.finals);
        }
        if started.elapsed() >= timeout {
            return Err(look.unsettled);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn look(
    nodes: &[NodeProc],
    running: &[bool],
    cluster: &str,
    names: &[String],
    placement: &KeyPlacement,
) -> Look {
    let mut unsettled = Vec::new();
    let mut maps: BTreeMap<String, Vec<(usize, PartitionMap)>> = BTreeMap::new();
    let mut states: BTreeMap<usize, Vec<PnCounter>> = BTreeMap::new();
    for (i, node) in nodes.iter().enumerate().filter(|(i, _)| running[*i]) {
        let (map, status) = match Client::connect(node.endpoint.clone()).await {
            Ok(client) => (
                client.partition_map(None).await.ok(),
                client.status().await.ok(),
            ),
            Err(_) => (None, None),
        };
        match (
            map,
            status,
            read_state(&node.endpoint, cluster, names).await,
        ) {
            (Some(map), Some(_status), Ok(state)) => {
                maps.entry(node.region.clone()).or_default().push((i, map));
                states.insert(i, state);
            }
            _ => unsettled.push(format!("n{i} does not answer")),
        }
    }
    // Per key, its owners in every region (node indexes), by each region's
    // first map once every node of the region agrees on it.
    let mut owners_of_key: Vec<Vec<usize>> = vec![Vec::new(); names.len()];
    for (region, maps) in &maps {
        let (first, map) = &maps[0];
        for (other, other_map) in &maps[1..] {
            if other_map.owners != map.owners || entries(other_map) != entries(map) {
                unsettled.push(format!(
                    "{region}: n{first} and n{other} compute different maps"
                ));
            }
        }
        for entry in &map.nodes {
            let settled = match entry.state.as_str() {
                "left" => entry.partitions_held == 0,
                "active" => {
                    entry.partitions_held == entry.partitions_owned
                        && entry.partitions_releasing == 0
                }
                _ => false,
            };
            // A node the run removed is down for good, and left.
            let removed = placement
                .node_index(&entry.node_name)
                .is_some_and(|i| !running[i]);
            let down_as_expected = removed && entry.state == "left";
            if !settled || !(entry.alive || down_as_expected) {
                unsettled.push(format!(
                    "{region}: {} is {}{}, owns {}, holds {}, releases {}",
                    entry.node_name,
                    entry.state,
                    if entry.alive { "" } else { " (down)" },
                    entry.partitions_owned,
                    entry.partitions_held,
                    entry.partitions_releasing
                ));
            }
        }
        for (key, partition) in placement.partition_of_key.iter().enumerate() {
            let owners = map.owners_of(*partition);
            if owners.is_empty() {
                unsettled.push(format!("{region}: key {key} has no owner"));
            }
            owners_of_key[key].extend(owners.iter().filter_map(|n| placement.node_index(n)));
        }
    }
    let mut finals = Vec::with_capacity(names.len());
    let mut held: BTreeMap<usize, usize> = BTreeMap::new();
    for (key, owners) in owners_of_key.iter().enumerate() {
        let Some(first) = owners.iter().find_map(|owner| states.get(owner)) else {
            finals.push(PnCounter::new());
            continue;
        };
        let state = first[key].clone();
        for owner in owners {
            match states.get(owner) {
                Some(held_there) if held_there[key] == state => {
                    *held.entry(*owner).or_default() += 1;
                }
                Some(held_there) => unsettled.push(format!(
                    "key {key}: owners n{} and n{owner} hold different states ({:?} and {:?})",
                    owners[0],
                    state.slots(),
                    held_there[key].slots()
                )),
                None => unsettled.push(format!("key {key}: its owner n{owner} is not running")),
            }
        }
        for (node, stored) in &states {
            if owners.contains(node) {
                continue;
            }
            let own = nodes[*node].replica;
            for (replica, slot) in stored[key].slots() {
                if *replica != own {
                    unsettled.push(format!(
                        "key {key}: n{node} does not own it but stores replica {replica}'s slot"
                    ));
                } else if state.slot(own) != *slot {
                    unsettled.push(format!(
                        "key {key}: n{node}'s own slot {slot:?} is not the owners' {:?}",
                        state.slot(own)
                    ));
                }
            }
        }
        finals.push(state);
    }
    Look {
        finals,
        unsettled,
        held,
    }
}

/// A map's nodes as (name, state, alive): what every node of a region must
/// agree on.
fn entries(map: &PartitionMap) -> Vec<(&str, &str, bool)> {
    map.nodes
        .iter()
        .map(|node| (node.node_name.as_str(), node.state.as_str(), node.alive))
        .collect()
}

/// Every running node's state merged, per key: the final state when the
/// placement did not settle (the exact check then still runs on it).
pub async fn merged(
    nodes: &[NodeProc],
    running: &[bool],
    cluster: &str,
    names: &[String],
) -> anyhow::Result<Vec<PnCounter>> {
    let mut merged = vec![PnCounter::new(); names.len()];
    for (_, node) in nodes.iter().enumerate().filter(|(i, _)| running[*i]) {
        for (key, state) in read_state(&node.endpoint, cluster, names)
            .await?
            .iter()
            .enumerate()
        {
            super::check::merge_states(&mut merged[key], state);
        }
    }
    Ok(merged)
}

/// The fault `drain`: asks another running node of the target's region to
/// drain it, retrying for up to 15 s (a node restarted just before may not
/// be seen alive yet, and a down node is not drained); a drain still
/// refused then is a violation.
pub async fn drain(nodes: &[NodeProc], running: &[bool], target: usize, checker: &mut Checker) {
    ask_of_region(nodes, running, target, Ask::Drain, checker).await;
}

/// Has `target` (killed for good) removed by another running node of its
/// region. A node still seen alive is refused, so the ask is retried until
/// failure detection marks it down (30 s at most).
pub async fn remove(nodes: &[NodeProc], running: &[bool], target: usize, checker: &mut Checker) {
    ask_of_region(nodes, running, target, Ask::Remove, checker).await;
}

/// What is asked of a region about one of its nodes.
#[derive(Clone, Copy)]
enum Ask {
    Drain,
    Remove,
}

/// Asks `ask` about `target` of another running node of its region,
/// retrying a refusal (the node asked may not see the target as the ask
/// needs yet) until a deadline; a refusal at the deadline is a violation.
async fn ask_of_region(
    nodes: &[NodeProc],
    running: &[bool],
    target: usize,
    ask: Ask,
    checker: &mut Checker,
) {
    let name = &nodes[target].name;
    let asked = (0..nodes.len())
        .find(|i| *i != target && running[*i] && nodes[*i].region == nodes[target].region)
        .unwrap_or(target);
    let (verb, patience) = match ask {
        Ask::Drain => ("drains", 15),
        Ask::Remove => ("removes", 30),
    };
    let deadline = Instant::now() + Duration::from_secs(patience);
    loop {
        let answer = match Client::connect(nodes[asked].endpoint.clone()).await {
            Ok(client) => match ask {
                Ask::Drain => client.drain(name).await.map(|_| ()),
                Ask::Remove => client.remove(name).await.map(|_| ()),
            }
            .map_err(|e| e.to_string()),
            Err(error) => Err(error.to_string()),
        };
        match answer {
            Ok(()) => {
                println!("           n{asked} {verb} {name}");
                return;
            }
            Err(error) if Instant::now() >= deadline => {
                checker.violate(
                    0,
                    "membership change refused",
                    format!("n{asked} refused: {verb} {name}: {error}"),
                );
                return;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}
