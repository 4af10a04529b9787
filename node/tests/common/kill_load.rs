//! A load of adds that a `kill -9` ends, and the check that follows it, shared
//! by the crash loop and the power-loss test (DESIGN.md invariants 3 and 4).
//!
//! Each task alternates the hot key and a cold one until its first error (the
//! kill) and counts, per key, the adds acknowledged and the adds whose answer
//! never came. After the restart, each counter must hold at least what it
//! held before plus its acknowledged adds, and at most that plus the
//! unanswered ones (they may or may not have landed).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tally_client::{Client, ClientConfig};
use tokio::task::JoinHandle;

use super::NodeProcess;

/// How long the load's tasks may take to notice the kill.
const GIVE_UP: Duration = Duration::from_secs(20);

/// The hot key `hot`, then `cold` keys `c0`, `c1`, ...
pub fn hot_and_cold_keys(cold: usize) -> Arc<Vec<String>> {
    Arc::new(
        std::iter::once("hot".to_string())
            .chain((0..cold).map(|i| format!("c{i}")))
            .collect(),
    )
}

/// A client that never retries: an add that fails at the kill must not land
/// on the restarted node later.
pub async fn connect_without_retries(node: &NodeProcess) -> Client {
    ClientConfig::new()
        .with_max_retries(0)
        .with_deadline(Duration::from_secs(10))
        .connect(node.endpoint())
        .await
        .expect("connecting to the node")
}

/// The node's replica id.
pub async fn replica_id(client: &Client) -> u64 {
    client.status().await.expect("status").node.replica
}

/// The value of every key, in order.
pub async fn read_all(client: &Client, keys: &[String]) -> Vec<i64> {
    let values = client.get_batch(keys).await.expect("reading the counters");
    values
        .into_iter()
        .map(|value| value.expect("a counter read"))
        .collect()
}

#[derive(Default)]
struct KeyTally {
    acked: AtomicU64,
    failed: AtomicU64,
}

type Tallies = Arc<BTreeMap<String, KeyTally>>;

/// Closed-loop tasks adding to the keys until the node is killed.
pub struct KillLoad {
    keys: Arc<Vec<String>>,
    tallies: Tallies,
    tasks: Vec<JoinHandle<()>>,
}

/// What one load saw, per key in the keys' order.
pub struct Outcome {
    /// Adds acknowledged.
    pub acked: Vec<u64>,
    /// Adds whose answer never came.
    pub failed: Vec<u64>,
}

impl KillLoad {
    /// Starts `tasks` tasks on `client`; task `t` takes cold key
    /// `1 + (t * stride + round) % cold` in its round `round`.
    pub fn start(client: &Client, tasks: usize, stride: usize, keys: &Arc<Vec<String>>) -> Self {
        let tallies: Tallies = Arc::new(
            keys.iter()
                .map(|k| (k.clone(), KeyTally::default()))
                .collect(),
        );
        let tasks = (0..tasks)
            .map(|task| {
                let (client, keys, tallies) = (client.clone(), keys.clone(), tallies.clone());
                tokio::spawn(closed_loop(client, task * stride, keys, tallies))
            })
            .collect();
        KillLoad {
            keys: keys.clone(),
            tallies,
            tasks,
        }
    }

    /// Kills the node with `kill -9`, waits for every task to see it, and
    /// returns what they counted.
    pub async fn kill(self, node: &mut NodeProcess) -> Outcome {
        node.kill9();
        for task in self.tasks {
            tokio::time::timeout(GIVE_UP, task)
                .await
                .expect("a load task did not stop after the kill")
                .unwrap();
        }
        let count = |pick: fn(&KeyTally) -> &AtomicU64| -> Vec<u64> {
            self.keys
                .iter()
                .map(|k| pick(&self.tallies[k.as_str()]).load(Ordering::SeqCst))
                .collect()
        };
        Outcome {
            acked: count(|t| &t.acked),
            failed: count(|t| &t.failed),
        }
    }
}

impl Outcome {
    /// Adds acknowledged, all keys together.
    pub fn acked_total(&self) -> u64 {
        self.acked.iter().sum()
    }

    /// Adds unanswered, all keys together.
    pub fn failed_total(&self) -> u64 {
        self.failed.iter().sum()
    }

    /// One line per key whose value after the restart is outside
    /// `before + acked ..= before + acked + failed`.
    pub fn violations(&self, keys: &[String], before: &[i64], after: &[i64]) -> Vec<String> {
        let mut lost = Vec::new();
        for (index, key) in keys.iter().enumerate() {
            let low = before[index] + self.acked[index] as i64;
            let high = low + self.failed[index] as i64;
            if !(low..=high).contains(&after[index]) {
                lost.push(format!(
                    "{key} = {}, expected {low}..={high} (before {}, acknowledged {}, unacknowledged {})",
                    after[index], before[index], self.acked[index], self.failed[index]
                ));
            }
        }
        lost
    }
}

async fn closed_loop(client: Client, offset: usize, keys: Arc<Vec<String>>, tallies: Tallies) {
    let cold = keys.len() - 1;
    for round in 0usize.. {
        let cold_key = &keys[1 + (offset + round) % cold];
        for key in [&keys[0], cold_key] {
            let tally = &tallies[key.as_str()];
            match client.add(key, 1).await {
                Ok(_) => tally.acked.fetch_add(1, Ordering::SeqCst),
                Err(_) => {
                    tally.failed.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            };
        }
    }
}
