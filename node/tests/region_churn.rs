//! A partitioned cluster under load through every kind of membership change
//! (issue #11, "Done means"): three regions of three nodes, P = 32, RF = 2,
//! replicated durability. A bounded load of idempotent adds runs through
//! nodes of every region while, one change at a time, eu-4 joins, eu-2 is
//! drained, us-3 is killed and stays down past --dead-after, and us-3 is
//! removed. Each change must complete under the load (the region's map
//! settles: every owner holds what it owns, nothing is received or
//! released). Then, with the load stopped and every add of unknown outcome
//! retried with its idempotency key through a live node of its own region
//! (idempotency keys are remembered per region; with replicated durability
//! the killed owner's copy holds the record of an add it took):
//! - every node of every region reads the exact acknowledged total of every
//!   key (invariants 5 and 7: nothing lost, nothing counted twice);
//! - every partition of every region has RF owners, and every node stores
//!   the counters of exactly the partitions it owns and, of any other,
//!   only its own slot (invariant 8), which is about RF/N of the counters.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{wait_until, NodeProcess, NodeSpec};
use tally_client::{Client, PartitionMap};
use tally_proto::partition::PartitionCount;
use tokio::runtime::Runtime;

const P: u32 = 32;
const RF: u32 = 2;
const KEYS: usize = 64;
const REGIONS: [&str; 3] = ["eu", "us", "ap"];
/// Load goes through these: never the killed node, so that a failed add is
/// a fault of the cluster, not of the endpoint (the drained eu-2 forwards).
const LOAD_THROUGH: [&str; 6] = ["eu-1", "eu-2", "us-1", "us-2", "ap-1", "ap-2"];
const LIMIT: Duration = Duration::from_secs(120);

fn key(i: usize) -> String {
    format!("post:{i}:views")
}

fn partition_of(key: &str) -> u32 {
    PartitionCount::new(u64::from(P))
        .unwrap()
        .of_key(key.as_bytes())
        .0
}

fn spec(root: &std::path::Path, region: &str, name: &str) -> NodeSpec {
    let mut spec = common::partitioned_spec(root, region, name, P, RF);
    // A killed node's partitions move after this (tests use seconds).
    let at = spec
        .extra
        .iter()
        .position(|arg| arg == "--dead-after")
        .unwrap();
    spec.extra[at + 1] = "6s".into();
    // An acknowledged add is on two owners: a node killed for good loses none.
    spec.durability = "replicated";
    spec
}

/// The cluster, what its load acknowledged, and which nodes are gone.
struct Churn {
    runtime: Runtime,
    root: tempfile::TempDir,
    nodes: BTreeMap<String, NodeProcess>,
    /// Killed for good (and then removed): neither read nor checked.
    dead: Vec<String>,
    expected: BTreeMap<String, i64>,
}

impl Churn {
    fn start() -> Churn {
        let mut root = tempfile::tempdir().unwrap();
        // TALLY_TEST_KEEP_DIR=1 keeps the nodes' directories and logs.
        if std::env::var_os("TALLY_TEST_KEEP_DIR").is_some() {
            root.disable_cleanup(true);
            eprintln!(
                "nodes' directories and logs under {}",
                root.path().display()
            );
        }
        let specs = REGIONS
            .iter()
            .flat_map(|region| (1..=3).map(move |i| (*region, format!("{region}-{i}"))))
            .map(|(region, name)| spec(root.path(), region, &name))
            .collect();
        let nodes = common::start_seeded(specs)
            .into_iter()
            .map(|node| (node.spec.node_name.clone(), node))
            .collect();
        Churn {
            runtime: Runtime::new().unwrap(),
            root,
            nodes,
            dead: Vec::new(),
            expected: BTreeMap::new(),
        }
    }

    fn running(&self) -> impl Iterator<Item = &NodeProcess> {
        self.nodes
            .values()
            .filter(|node| !self.dead.contains(&node.spec.node_name))
    }

    fn endpoint(&self, name: &str) -> String {
        self.nodes[name].endpoint()
    }

    /// A client of the node `name` (for admin calls).
    fn client(&self, name: &str) -> Client {
        let endpoint = self.endpoint(name);
        self.runtime.block_on(Client::connect(endpoint)).unwrap()
    }

    fn map_of(&self, endpoint: &str, region: &str) -> Option<PartitionMap> {
        self.runtime.block_on(async {
            let client = Client::connect(endpoint.to_string()).await.ok()?;
            client.partition_map(Some(region)).await.ok()
        })
    }

    /// Waits until every running node computes the same map of `region`
    /// and it is settled: every node that is active and not gone holds
    /// exactly what it owns and releases nothing, every partition has RF
    /// owners, and `accept` holds of it. Returns that map.
    fn settled(
        &self,
        region: &str,
        what: &str,
        accept: impl Fn(&PartitionMap) -> bool,
    ) -> PartitionMap {
        let endpoints: Vec<String> = self.running().map(NodeProcess::endpoint).collect();
        wait_until(LIMIT, &format!("{region}: {what}"), || {
            let maps: Vec<PartitionMap> = endpoints
                .iter()
                .map(|endpoint| self.map_of(endpoint, region))
                .collect::<Option<_>>()?;
            let first = &maps[0];
            let agree = maps.iter().all(|map| map.owners == first.owners);
            let settled = first.nodes.iter().all(|node| match node.state.as_str() {
                "active" if !node.gone => {
                    node.alive
                        && node.partitions_held == node.partitions_owned
                        && node.partitions_releasing == 0
                }
                // A removed node that is down keeps its last gossip.
                "left" => node.partitions_held == 0 || !node.alive,
                _ => node.gone,
            });
            let replicated = (0..P).all(|p| first.owners_of(p).len() == RF as usize);
            (agree && settled && replicated && accept(first)).then(|| first.clone())
        })
        .0
    }

    /// Runs the load through [`LOAD_THROUGH`] while `change` runs (it
    /// returns once the change has settled), then stops it and retries
    /// every add of unknown outcome through the running load nodes.
    fn under_load(&mut self, what: &str, change: impl FnOnce(&mut Churn)) {
        let endpoints: Vec<String> = LOAD_THROUGH
            .iter()
            .map(|name| self.endpoint(name))
            .collect();
        let keys: Vec<String> = (0..KEYS).map(key).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let load = {
            let (endpoints, stop) = (endpoints.clone(), stop.clone());
            self.runtime.spawn(async move {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                common::load::run_until(&endpoints, 1, &keys, stop).await
            })
        };
        std::thread::sleep(Duration::from_secs(1));
        change(self);
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::Relaxed);
        let mut tally = self.runtime.block_on(load).unwrap();
        eprintln!(
            "{what}: {} adds acknowledged under load, {} unknown (retried)",
            tally.acked_adds,
            tally.unknown.len()
        );
        // Retries stay in the add's region, where its idempotency record is.
        let regions: Vec<Vec<String>> = REGIONS
            .iter()
            .map(|region| {
                LOAD_THROUGH
                    .iter()
                    .filter(|name| name.starts_with(&format!("{region}-")))
                    .map(|name| self.endpoint(name))
                    .collect()
            })
            .collect();
        self.runtime
            .block_on(common::load::settle_in_region(&mut tally, &regions, LIMIT));
        assert!(tally.acked_adds > 0, "{what}: the load made no headway");
        for (key, delta) in tally.acked {
            *self.expected.entry(key).or_default() += delta;
        }
    }

    /// One add to every key, through the nodes in turn, so that every key
    /// exists everywhere (the load reaches only some keys in a short phase).
    fn add_to_every_key(&mut self) {
        let endpoints: Vec<String> = self.running().map(NodeProcess::endpoint).collect();
        self.runtime.block_on(async {
            for i in 0..KEYS {
                let client = common::load::quick_client(&endpoints[i % endpoints.len()]).await;
                client.add(&key(i), 1).await.unwrap();
            }
        });
        for i in 0..KEYS {
            *self.expected.entry(key(i)).or_default() += 1;
        }
    }

    /// Every running node reads every key's exact total (waiting for the
    /// regions to converge).
    fn check_values(&self, what: &str) {
        for node in self.running() {
            let endpoint = node.endpoint();
            let deadline = std::time::Instant::now() + LIMIT;
            loop {
                let reads = self.runtime.block_on(read_all(&endpoint, &self.expected));
                if reads.as_ref() == Some(&self.expected) {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    let wrong: Vec<String> = match &reads {
                        Some(reads) => reads
                            .iter()
                            .filter(|(key, got)| self.expected[*key] != **got)
                            .map(|(key, got)| {
                                let want = self.expected[key];
                                let owners = format!("partition {}", partition_of(key));
                                format!("{key} ({owners}): read {got}, acknowledged {want}")
                            })
                            .collect(),
                        None => vec!["no read answered".into()],
                    };
                    panic!(
                        "{what}: no exact totals through {} after {LIMIT:?}:\n{}",
                        node.spec.node_name,
                        wrong.join("\n")
                    );
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }

    /// In `map` of `region`: each active node stores exactly the counters
    /// of the partitions it owns, and of any other only its own slot; a
    /// node that left stores only its own slots. Each node owns about RF/N
    /// of the partitions. Prints the counters each node holds whole.
    fn check_stored(&self, region: &str, map: &PartitionMap) {
        let active: Vec<_> = map
            .nodes
            .iter()
            .filter(|node| node.state == "active" && !node.gone)
            .collect();
        let ideal = f64::from(P * RF) / active.len() as f64;
        let mut held = Vec::new();
        for row in &map.nodes {
            if self.dead.contains(&row.node_name) {
                continue;
            }
            let endpoint = self.endpoint(&row.node_name);
            let (own, counters) = self.runtime.block_on(common::stored_counters_of(&endpoint));
            let mut whole = 0;
            for counter in &counters {
                let key = std::str::from_utf8(&counter.key).unwrap();
                let owned = map
                    .owners_of(partition_of(key))
                    .contains(&row.node_name.as_str());
                if owned {
                    whole += 1;
                } else {
                    let writers: Vec<u64> = counter.slots.iter().map(|slot| slot.replica).collect();
                    assert_eq!(
                        writers,
                        vec![own],
                        "{} does not own {key} and keeps other writers' slots of it",
                        row.node_name
                    );
                }
            }
            if row.state == "active" && !row.gone {
                let owned_keys = (0..KEYS)
                    .filter(|i| {
                        map.owners_of(partition_of(&key(*i)))
                            .contains(&row.node_name.as_str())
                    })
                    .count();
                assert_eq!(
                    whole, owned_keys,
                    "{} stores every key it owns",
                    row.node_name
                );
                let share = f64::from(row.partitions_owned);
                assert!(
                    (ideal * 0.5..=ideal * 1.5).contains(&share),
                    "{} owns {share} partitions of {P} (ideal RF*P/N = {ideal:.1})",
                    row.node_name
                );
            } else {
                assert_eq!(
                    whole, 0,
                    "{} ({}) holds nothing whole",
                    row.node_name, row.state
                );
            }
            held.push((row.node_name.clone(), whole));
        }
        eprintln!(
            "measured {region}: counters held whole per node {held:?} of {KEYS} (RF/N = {:.2})",
            f64::from(RF) / active.len() as f64
        );
    }

    /// The checks after a change: exact totals everywhere, and every
    /// region's map settled with RF holders per partition.
    fn check(&self, what: &str) {
        self.check_values(what);
        for region in REGIONS {
            let map = self.settled(region, what, |_| true);
            self.check_stored(region, &map);
        }
    }
}

/// Whether `map` shows the node `name` in `state` ("gone": down past
/// --dead-after).
fn shows(map: &PartitionMap, name: &str, state: &str) -> bool {
    map.nodes.iter().any(|node| {
        node.node_name == name && (node.state == state || (state == "gone" && node.gone))
    })
}

/// Every key of `expected` as read through `endpoint`; `None` if a read failed.
async fn read_all(
    endpoint: &str,
    expected: &BTreeMap<String, i64>,
) -> Option<BTreeMap<String, i64>> {
    let client = common::load::try_quick_client(endpoint).await.ok()?;
    let mut reads = BTreeMap::new();
    for key in expected.keys() {
        reads.insert(key.clone(), client.get(key).await.ok()?);
    }
    Some(reads)
}

#[test]
fn joins_drains_kills_past_dead_after_and_removals_under_load_keep_every_total_exact() {
    let mut churn = Churn::start();
    for region in REGIONS {
        churn.settled(region, "started", |map| map.nodes.len() == 3);
    }
    churn.add_to_every_key();

    churn.under_load("eu-4 joins", |churn| {
        let mut joiner = spec(churn.root.path(), "eu", "eu-4");
        joiner.seeds = vec![churn.nodes["eu-1"].spec.gossip];
        let node = NodeProcess::start(joiner);
        churn.nodes.insert("eu-4".into(), node);
        churn.settled("eu", "eu-4 active", |map| shows(map, "eu-4", "active"));
    });
    churn.check("eu-4 joined");

    churn.under_load("eu-2 drains", |churn| {
        let client = churn.client("eu-1");
        churn.runtime.block_on(client.drain("eu-2")).unwrap();
        churn.settled("eu", "eu-2 left", |map| shows(map, "eu-2", "left"));
    });
    churn.check("eu-2 drained");

    churn.under_load("us-3 killed", |churn| {
        churn.nodes.get_mut("us-3").unwrap().kill9();
        churn.dead.push("us-3".into());
        churn.settled("us", "us-3 gone past --dead-after", |map| {
            shows(map, "us-3", "gone")
        });
    });
    churn.check("us-3 gone");

    churn.under_load("us-3 removed", |churn| {
        let client = churn.client("ap-1");
        churn.runtime.block_on(client.remove("us-3")).unwrap();
        churn.settled("us", "us-3 left", |map| shows(map, "us-3", "left"));
    });
    churn.check("us-3 removed");
}
