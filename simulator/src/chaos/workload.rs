//! The chaos workload: client tasks that add to counters through
//! `tally_client`, each against one node, and record every add in the shared
//! ledger with the logical clock the wipe check needs (`check.rs`).
//!
//! Invariants: every add is issued, stamped and marked delivered under one
//! lock, and answered under it again, so the clock orders issues and answers
//! exactly as the lanes were held; an answer that comes back across a wipe of
//! its node (the epoch changed) is recorded as unknown at every incarnation
//! from the one it was sent to. An add that fails (a transient error: its
//! node is down, stopped, or its answers are cut off) is retried with the
//! same idempotency key until it is answered, so an add applied while its
//! answer was lost must be counted once; only the end of the load or a wipe
//! of its node makes the client give up on it (its fate is then unknown).
//!
//! With partitioned regions a client adds only to keys its node owns, as
//! the node's partition map says (refreshed every half second). An add its
//! node refuses as not served (ownership moved, or the node is still copying
//! the partition in) is given up at once: its retries could never succeed
//! there.
//!
//! A refusal whose meaning is "not applied" ([`classify`]: a malformed or
//! out-of-range add, a failed precondition, a partition not served or
//! write-gated) of an add's only attempt is recorded as such
//! ([`Ledger::not_applied`](crate::ledger::Ledger::not_applied)): a node
//! that applied an add and refused it fails the check (invariant 7). After
//! an attempt whose fate is unknown, a refusal says nothing of that earlier
//! attempt, and the add's fate stays unknown. So that the loop sees every
//! attempt's answer, the client library does not retry by itself: this
//! loop retries transient failures with the same idempotency key.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tally_client::ClientConfig;
use tally_node::crdt::ReplicaId;

use super::check::AddTimes;
use super::placement::KeyPlacement;
use crate::ledger::Ledger;
use crate::rng::{between, chance, stream, Subsystem, Zipf};

/// What the clients and the checker share: the ledger, the logical clock of
/// its events, and each node's current replica id and wipe epoch (odd while
/// a wipe is under way).
pub struct Book {
    /// Every add and what its caller knows.
    pub ledger: Ledger,
    /// When each add was issued and answered.
    pub times: AddTimes,
    /// The logical clock: ticks at every issue and every answer.
    pub clock: u64,
    /// Adds whose answer came across a wipe: (add, node, epoch at issue).
    pub across_wipe: Vec<(u32, usize, u64)>,
}

/// The state every client task and the fault loop share.
pub struct Shared {
    /// The ledger and its clock.
    pub book: Mutex<Book>,
    /// Each node's current replica id.
    pub replicas: Vec<AtomicU64>,
    /// Each node's wipe epoch: odd while a wipe is under way.
    pub epochs: Vec<AtomicU64>,
    /// Set when the load must stop.
    pub stop: AtomicBool,
    /// The keys' names (key 0 is the hot post).
    pub names: Vec<String>,
    /// Adds answered only after a retry with their idempotency key.
    pub retried: AtomicU64,
    /// Partitioned regions: where keys live (`None`: every node holds all).
    pub placement: Option<KeyPlacement>,
    /// Adds given up because their node no longer served the key.
    pub not_served: AtomicU64,
    /// Adds whose only attempt was refused as not applied.
    pub refused: AtomicU64,
}

/// How often a client of a partitioned region rereads its node's map.
const MAP_EVERY: Duration = Duration::from_millis(500);

/// What a failed attempt of an add says about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// A refusal whose meaning is "not applied": nothing of this attempt
    /// changed the node's state.
    NotApplied,
    /// The node was down, slow or cut off: the attempt may or may not have
    /// landed, and another one with the same idempotency key may succeed.
    Transient,
    /// Anything else: the attempt's fate is unknown.
    Unknown,
}

/// The messages of the refusals that come as `UNAVAILABLE` (another node
/// may take the add, so a caller may try elsewhere) but mean "not applied":
/// `AddRefused::NotServed`, `WriteGate::Retired`, `WriteGate::NotApplied`
/// (node/core/src/replica/mod.rs and fold_scoped.rs; `workload_tests.rs` checks
/// them against the node's own errors).
const NOT_APPLIED_UNAVAILABLE: [&str; 3] = [
    "does not serve partition",
    "wait for their fold; another owner takes the adds",
    "it writes there again once its counters reach the fold",
];

/// Classifies a failed add by its gRPC code and, for `UNAVAILABLE`, its
/// message: `INVALID_ARGUMENT`, `OUT_OF_RANGE` (invariant 6: nothing
/// changes) and `FAILED_PRECONDITION` are refusals made before anything is
/// applied, as are a partition not served and a write gate.
pub fn classify(error: &tally_client::Error) -> Failure {
    use tonic::Code;
    match error.code() {
        Some(Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition) => {
            return Failure::NotApplied;
        }
        Some(Code::Unavailable) => {
            let message = error.to_string();
            if NOT_APPLIED_UNAVAILABLE
                .iter()
                .any(|refusal| message.contains(refusal))
            {
                return Failure::NotApplied;
            }
        }
        _ => {}
    }
    if error.is_transient() {
        Failure::Transient
    } else {
        Failure::Unknown
    }
}

/// Draws a key: the hot one 30% of the time, else by a Zipf law; with
/// `owned`, only among the keys the node owns (`None` when it owns none of
/// a few draws).
fn draw_key(rng: &mut crate::rng::SimRng, zipf: &Zipf, owned: Option<&[bool]>) -> Option<usize> {
    for _ in 0..16 {
        let key = if chance(rng, 0.3) {
            0
        } else {
            zipf.sample(rng)
        };
        if owned.is_none_or(|owned| owned[key]) {
            return Some(key);
        }
    }
    None
}

/// One client: adds until `shared.stop`, against node `node` at `endpoint`.
pub async fn client_loop(
    client_id: u32,
    node: usize,
    endpoint: String,
    seed: u64,
    shared: Arc<Shared>,
) {
    let mut rng = stream(seed, Subsystem::Workload);
    let zipf = Zipf::new(shared.names.len(), 1.1);
    // Pinned: each add lands in the slot of the node it was sent to, which
    // is what the checker accounts it to (a forwarded add would land in
    // its key's first owner's slot instead).
    // No retries inside the library: this loop retries, and sees every
    // attempt's answer (see the module documentation).
    let config = ClientConfig::default()
        .with_routing(tally_client::Routing::Pinned)
        .with_max_retries(0);
    let mut client: Option<tally_client::Client> = None;
    // Partitioned: the keys the node owns, and when its map was last read.
    let mut owned: Option<Vec<bool>> = shared.placement.as_ref().map(|_| Vec::new());
    let mut map_read = Instant::now() - MAP_EVERY;
    while !shared.stop.load(Ordering::SeqCst) {
        if client.is_none() {
            client = config.clone().connect(endpoint.clone()).await.ok();
            if client.is_none() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        }
        let epoch = shared.epochs[node].load(Ordering::SeqCst);
        // A wipe is under way, or a spare has not joined yet (its replica
        // id is known only once the fault loop saw it answer).
        if epoch % 2 == 1 || shared.replicas[node].load(Ordering::SeqCst) == 0 {
            // Wait for the new replica's id.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        if let (Some(placement), Some(connected)) = (&shared.placement, &client) {
            if map_read.elapsed() >= MAP_EVERY {
                map_read = Instant::now();
                if let Ok(map) = connected.partition_map(None).await {
                    owned = Some(placement.owned_by(&map, node));
                }
            }
        }
        let key = match &owned {
            Some(owned) if owned.is_empty() => None,
            owned => draw_key(&mut rng, &zipf, owned.as_deref()),
        };
        let Some(key) = key else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let negative = chance(&mut rng, 0.25);
        let replica = ReplicaId(shared.replicas[node].load(Ordering::SeqCst));
        let issued = {
            let mut book = shared.book.lock().expect("book lock");
            let issued = book.ledger.issue(client_id, node, key, negative, true);
            if let Some(add) = issued {
                book.clock += 1;
                let clock = book.clock;
                book.times.sent.push(clock);
                book.times.answered.push(u64::MAX);
                book.ledger.delivered(add, replica);
            }
            issued.map(|add| (add, book.ledger.adds[add as usize].delta()))
        };
        let Some((add, delta)) = issued else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let idempotency_key = format!("chaos-{seed:x}-{add}");
        let connected = client.as_ref().expect("connected above");
        let mut failures = 0u32;
        let result = loop {
            let result = connected
                .add_with_key(&shared.names[key], delta, &idempotency_key)
                .await;
            let retry = match &result {
                Ok(_) => false,
                Err(error) => {
                    if error.to_string().contains("does not serve partition") {
                        shared.not_served.fetch_add(1, Ordering::SeqCst);
                        map_read = Instant::now() - MAP_EVERY;
                    }
                    classify(error) == Failure::Transient
                        && !shared.stop.load(Ordering::SeqCst)
                        && shared.epochs[node].load(Ordering::SeqCst) == epoch
                }
            };
            if !retry {
                break result;
            }
            failures += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if result.is_ok() && failures > 0 {
            shared.retried.fetch_add(1, Ordering::SeqCst);
        }
        {
            let mut book = shared.book.lock().expect("book lock");
            book.clock += 1;
            let clock = book.clock;
            book.times.answered[add as usize] = clock;
            if shared.epochs[node].load(Ordering::SeqCst) != epoch {
                // The answer may come from either incarnation: unknown at both.
                book.across_wipe.push((add, node, epoch));
                book.ledger.abandon(add);
            } else if result.is_ok() {
                book.ledger.answered(add, replica, 0, false);
            } else if failures == 0
                && result
                    .as_ref()
                    .is_err_and(|e| classify(e) == Failure::NotApplied)
            {
                // Its only attempt was refused: not applied anywhere.
                book.ledger.not_applied(add, replica);
                shared.refused.fetch_add(1, Ordering::SeqCst);
            } else {
                book.ledger.abandon(add);
            }
        }
        tokio::time::sleep(Duration::from_millis(between(&mut rng, 0, 20))).await;
    }
}

#[cfg(test)]
#[path = "workload_tests.rs"]
mod tests;
