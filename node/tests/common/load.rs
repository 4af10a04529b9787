//! A closed-loop load of adds against several nodes through the real client,
//! with an idempotency key per add. Adds whose outcome is unknown (the node
//! was killed, paused or partitioned) are retried with the same key once the
//! fault is over, so every add ends up applied exactly once and the expected
//! totals are exact (DESIGN.md, invariants 5 and 7).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tally_client::{Client, ClientConfig};

/// An add that was sent but not acknowledged.
#[derive(Clone, Debug)]
pub struct Unknown {
    pub endpoint: String,
    pub key: String,
    pub delta: i64,
    pub idempotency_key: String,
}

/// What a load acknowledged, per key, plus the adds still unknown.
#[derive(Default, Debug)]
pub struct Tally {
    pub acked: BTreeMap<String, i64>,
    pub acked_adds: u64,
    pub unknown: Vec<Unknown>,
}

impl Tally {
    pub fn total(&self) -> i64 {
        self.acked.values().sum()
    }
}

/// A client that gives up quickly, so a paused or dead node shows as an error.
pub async fn quick_client(endpoint: &str) -> Client {
    try_quick_client(endpoint)
        .await
        .expect("connecting the client")
}

/// Same, or the connection error.
pub async fn try_quick_client(endpoint: &str) -> Result<Client, tally_client::Error> {
    ClientConfig::default()
        .with_deadline(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(1))
        .with_max_retries(0)
        .connect(endpoint)
        .await
}

/// Runs `tasks_per_endpoint` tasks per endpoint until `stop` is set; each adds
/// to one of `keys` (by its own sequence) a delta from `delta(n)`.
pub async fn run_until(
    endpoints: &[String],
    tasks_per_endpoint: usize,
    keys: &[&str],
    stop: Arc<AtomicBool>,
) -> Tally {
    let tally = Arc::new(Mutex::new(Tally::default()));
    // Idempotency keys are unique per run: a later run must not be taken for a retry.
    let run: u64 = rand::random();
    let mut handles = Vec::new();
    for (e, endpoint) in endpoints.iter().enumerate() {
        for t in 0..tasks_per_endpoint {
            let endpoint = endpoint.clone();
            let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
            let stop = stop.clone();
            let tally = tally.clone();
            handles.push(tokio::spawn(async move {
                let client = quick_client(&endpoint).await;
                let mut n: u64 = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let key = &keys[(n as usize + t) % keys.len()];
                    let delta = if n.is_multiple_of(5) { -1 } else { 2 };
                    let idempotency_key = format!("load-{run:016x}-{e}-{t}-{n}");
                    match client.add_with_key(key, delta, &idempotency_key).await {
                        Ok(_) => {
                            let mut tally = tally.lock().unwrap();
                            *tally.acked.entry(key.clone()).or_default() += delta;
                            tally.acked_adds += 1;
                        }
                        Err(_) => {
                            tally.lock().unwrap().unknown.push(Unknown {
                                endpoint: endpoint.clone(),
                                key: key.clone(),
                                delta,
                                idempotency_key,
                            });
                            // Back off so a dead node is not hammered.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            }));
        }
    }
    for handle in handles {
        handle.await.unwrap();
    }
    Arc::try_unwrap(tally).unwrap().into_inner().unwrap()
}

/// Runs the load for `duration`, calling `during` halfway (to inject a fault).
pub async fn run_for(
    endpoints: &[String],
    tasks_per_endpoint: usize,
    keys: &[&str],
    duration: Duration,
    during: impl FnOnce() + Send + 'static,
) -> Tally {
    let stop = Arc::new(AtomicBool::new(false));
    let endpoints = endpoints.to_vec();
    let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    let load_stop = stop.clone();
    let load = tokio::spawn(async move {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        run_until(&endpoints, tasks_per_endpoint, &keys, load_stop).await
    });
    tokio::time::sleep(duration / 2).await;
    tokio::task::spawn_blocking(during).await.unwrap();
    tokio::time::sleep(duration / 2).await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap()
}

/// Retries every unknown add with its own idempotency key until each is
/// acknowledged (at most `limit`), and adds them to the totals.
pub async fn settle(tally: &mut Tally, limit: Duration) {
    settle_with(tally, limit, |unknown, _| unknown.endpoint.clone()).await
}

/// [`settle`] for adds whose first node may be gone for good: each retry
/// goes through a node of the add's own region (`regions` groups the
/// endpoints by region; the first try's endpoint must be in one), the first
/// try's node first, then the others in turn. Each forwards to the key's
/// live owner there, which knows the add's record if the first owner's
/// copy or a pull brought it. Never through another region: idempotency
/// keys are remembered per region (`docs/src/concepts/counters.md`,
/// "Idempotency keys"), so a node of another region would apply the add again.
pub async fn settle_in_region(tally: &mut Tally, regions: &[Vec<String>], limit: Duration) {
    settle_with(tally, limit, |unknown, attempt| {
        let region = regions
            .iter()
            .find(|region| region.contains(&unknown.endpoint))
            .expect("the first try's endpoint is in one of the regions");
        let first = region
            .iter()
            .position(|endpoint| *endpoint == unknown.endpoint)
            .unwrap_or(0);
        region[(first + attempt) % region.len()].clone()
    })
    .await
}

async fn settle_with(
    tally: &mut Tally,
    limit: Duration,
    endpoint: impl Fn(&Unknown, usize) -> String,
) {
    let deadline = tokio::time::Instant::now() + limit;
    for unknown in std::mem::take(&mut tally.unknown) {
        for attempt in 0.. {
            let outcome = match try_quick_client(&endpoint(&unknown, attempt)).await {
                Ok(client) => {
                    client
                        .add_with_key(&unknown.key, unknown.delta, &unknown.idempotency_key)
                        .await
                }
                Err(error) => Err(error),
            };
            match outcome {
                // Applied now, or recognised as already applied: counted once either way.
                Ok(_) => {
                    *tally.acked.entry(unknown.key.clone()).or_default() += unknown.delta;
                    tally.acked_adds += 1;
                    break;
                }
                Err(error) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "could not settle {unknown:?}: {error}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}
