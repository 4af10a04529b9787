//! The chaos like-set workload (`tally-sim chaos --likes`): one client task
//! per node likes, unlikes and observes through gRPC, with retries that
//! reuse the operation's idempotency key, and the check after the heal.
//!
//! Each like and unlike is answered with the member's causal length right
//! after it (`LikeResponse.length`), and the check reads every node's final
//! lengths from its delta log (a raw `Pull` from the start, as a peer would).
//! It requires:
//! - every region answers the same "liked" for every member, the same
//!   derived count, equal to the members it says are liked, and a recount
//!   (`verify`) that agrees with the count;
//! - a member is liked if every operation that may have reached it was a
//!   like and at least one was acknowledged, and not liked if none of them
//!   was a like (an operation whose outcome is unknown may or may not
//!   count, as the counters' checker allows);
//! - every node holds the same length for every member, liked exactly when
//!   it is odd, and (unless a wipe may have lost an acknowledged operation
//!   with its disk) that length is at least the longest acknowledged answer,
//!   exactly it when every operation on the member was answered with its
//!   length, and never more than the operations that could have raised it
//!   (a length grows by one per operation that changes it, and regions
//!   merge by max): so a like or unlike lost, or counted twice, is caught
//!   for members that got both too;
//! - every region holds identical registers (the digest of `Distinct`), and
//!   the estimate lies between the acknowledged and the issued distinct
//!   observes, within the sketch's error.
//!
//! Members are partitioned over the nodes' tasks in two ways: a member of
//! the "likes only" or "unlikes only" group gets only that operation, from
//! any node, so the exact rule above applies to it; the others get both.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tally_proto::v1::likes_client::LikesClient;
use tally_proto::v1::replication_client::ReplicationClient;
use tally_proto::v1::{
    DistinctRequest, LikeCountRequest, LikeRequest, LikeResponse, LikedRequest, ObserveRequest,
    PullRequest,
};

use crate::rng::{between, chance, stream, Subsystem};

/// The like set every task writes.
pub const LIKE_KEY: &str = "chaos:post:likes";
/// Distinct members each observe call carries.
const OBSERVE_MEMBERS: u64 = 8;
/// The uniques key every task observes.
pub const UNIQUES_KEY: &str = "chaos:post:seen";
/// Members of the like set.
pub const MEMBERS: usize = 48;

/// Which operations a member gets (by its index).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Group {
    /// Only likes, from any node.
    LikesOnly,
    /// Only unlikes.
    UnlikesOnly,
    /// Both.
    Mixed,
}

/// The group of member `index`.
pub fn group(index: usize) -> Group {
    match index % 4 {
        0 => Group::LikesOnly,
        1 => Group::UnlikesOnly,
        _ => Group::Mixed,
    }
}

/// The name of member `index`.
pub fn member_name(index: usize) -> String {
    format!("m{index:02}")
}

/// What the tasks did to one member.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct MemberOps {
    /// Likes acknowledged.
    pub likes_acked: u32,
    /// Likes whose outcome is unknown (given up on).
    pub likes_unknown: u32,
    /// Unlikes acknowledged or unknown.
    pub unlikes: u32,
    /// The longest length an acknowledged operation was answered with.
    pub longest_answer: u64,
    /// Operations that may have raised the length: answered as changed,
    /// unknown, or answered as duplicates (whose first answer is unknown).
    pub may_raise: u32,
    /// Operations whose resulting length is unknown (unknown outcome, or a
    /// duplicate answer).
    pub length_unknown: u32,
}

/// What the tasks share with the checker.
#[derive(Default)]
pub struct LikeBook {
    /// Per member.
    pub members: Vec<MemberOps>,
    /// Distinct members observed in acknowledged calls.
    pub observed_acked: u64,
    /// Distinct members observed in calls issued (acknowledged or not).
    pub observed_issued: u64,
}

/// The state the like tasks share.
pub struct LikeShared {
    /// The book.
    pub book: Mutex<LikeBook>,
    /// Set when the load must stop.
    pub stop: AtomicBool,
    /// Operations answered only after a retry with their idempotency key.
    pub retried: AtomicU64,
}

impl LikeShared {
    /// A fresh book.
    pub fn new() -> Self {
        LikeShared {
            book: Mutex::new(LikeBook {
                members: vec![MemberOps::default(); MEMBERS],
                ..Default::default()
            }),
            stop: AtomicBool::new(false),
            retried: AtomicU64::new(0),
        }
    }
}

impl Default for LikeShared {
    fn default() -> Self {
        Self::new()
    }
}

/// True for an error after which the same request may be sent again: the
/// node is down, cut off, or not ready for it yet.
fn transient(status: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Unknown
            | Code::Cancelled
            | Code::FailedPrecondition
            | Code::ResourceExhausted
            | Code::Aborted
    )
}

/// One task: likes, unlikes and observes against node `node` until `stop`.
pub async fn like_loop(node: usize, endpoint: String, seed: u64, shared: Arc<LikeShared>) {
    let mut rng = stream(seed ^ 0x6c69_6b65, Subsystem::Workload);
    let url = endpoint;
    let mut client = None;
    let mut sequence = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        if client.is_none() {
            client = LikesClient::connect(url.clone()).await.ok();
            if client.is_none() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        }
        let likes = client.as_mut().expect("connected above");
        sequence += 1;
        let idempotency_key = format!("chaos-like-{seed:x}-{node}-{sequence}");
        if chance(&mut rng, 0.2) {
            // Distinct members per observe, enough of them over a run for
            // the sketch to turn dense (past 2,048 registers set), so the
            // dense registers' chunk records go through the faults too.
            let members = (0..OBSERVE_MEMBERS)
                .map(|i| format!("viewer-{node}-{sequence}-{i}").into_bytes().into())
                .collect();
            shared.book.lock().expect("like book").observed_issued += OBSERVE_MEMBERS;
            let request = ObserveRequest {
                key: UNIQUES_KEY.as_bytes().to_vec().into(),
                members,
            };
            let acked = retry(&shared, || {
                let mut likes = likes.clone();
                let request = request.clone();
                async move { likes.observe(request).await.map(|_| ()) }
            })
            .await;
            if acked.is_some() {
                shared.book.lock().expect("like book").observed_acked += OBSERVE_MEMBERS;
            }
        } else {
            let index = between(&mut rng, 0, MEMBERS as u64 - 1) as usize;
            let like = match group(index) {
                Group::LikesOnly => true,
                Group::UnlikesOnly => false,
                Group::Mixed => chance(&mut rng, 0.6),
            };
            let request = LikeRequest {
                key: LIKE_KEY.as_bytes().to_vec().into(),
                member: member_name(index).into_bytes().into(),
                idempotency_key,
            };
            let answer = retry(&shared, || {
                let mut likes = likes.clone();
                let request = request.clone();
                async move {
                    match like {
                        true => likes.like(request).await,
                        false => likes.unlike(request).await,
                    }
                    .map(tonic::Response::into_inner)
                }
            })
            .await;
            let mut book = shared.book.lock().expect("like book");
            book.members[index].record(like, answer.as_ref());
        }
        tokio::time::sleep(Duration::from_millis(between(&mut rng, 5, 40))).await;
    }
}

impl MemberOps {
    /// Books one like (`like`) or unlike and its answer (`None`: unknown).
    fn record(&mut self, like: bool, answer: Option<&LikeResponse>) {
        match (like, answer) {
            (true, Some(_)) => self.likes_acked += 1,
            (true, None) => self.likes_unknown += 1,
            (false, _) => self.unlikes += 1,
        }
        match answer {
            Some(answer) if !answer.duplicate => {
                self.longest_answer = self.longest_answer.max(answer.length);
                self.may_raise += u32::from(answer.changed);
            }
            _ => {
                self.may_raise += 1;
                self.length_unknown += 1;
            }
        }
    }
}

/// Sends one request until it is answered (the same request, so the same
/// idempotency key), an error is not transient, or the load stops: the
/// answer, or `None` when it was given up.
async fn retry<T, F, Fut>(shared: &LikeShared, mut send: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut failures = 0;
    loop {
        let attempt = tokio::time::timeout(Duration::from_secs(3), send()).await;
        match attempt {
            Ok(Ok(answer)) => {
                if failures > 0 {
                    shared.retried.fetch_add(1, Ordering::SeqCst);
                }
                return Some(answer);
            }
            Ok(Err(status)) if !transient(&status) => return None,
            _ => {}
        }
        if shared.stop.load(Ordering::SeqCst) {
            return None;
        }
        failures += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What one region holds, as its API answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLikes {
    /// Whether each member is liked.
    pub liked: Vec<bool>,
    /// The derived count.
    pub count: u64,
    /// The recount agreed with the count.
    pub recount_consistent: bool,
    /// The uniques estimate and the digest of its registers.
    pub distinct: (u64, u64),
    /// Each member's causal length, from the node's delta log.
    pub lengths: Vec<u64>,
}

/// Reads what the nodes `readers` hold, in that order. With `settle`, reads
/// them again until they all hold the same (or that long passed): in
/// partitioned regions the like set's owners are read after the counters
/// settled, and its last deltas may still be on their way.
pub async fn read_settled(
    nodes: &[super::node::NodeProc],
    readers: &[usize],
    cluster: &str,
    settle: Option<Duration>,
) -> anyhow::Result<Vec<HeldLikes>> {
    let started = std::time::Instant::now();
    loop {
        let mut held = Vec::new();
        for i in readers {
            held.push(read_likes(&nodes[*i].endpoint, cluster).await?);
        }
        let agree = held.windows(2).all(|pair| pair[0] == pair[1]);
        match settle {
            Some(timeout) if !agree && started.elapsed() < timeout => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            _ => return Ok(held),
        }
    }
}

/// Waits until each of the nodes `strays` stores no like set and no uniques
/// key (its sets digest, of what it stores, is 0), at most `timeout`;
/// returns those that still store some, with their digests.
pub async fn wait_for_no_sets(
    nodes: &[super::node::NodeProc],
    strays: &[usize],
    timeout: Duration,
) -> Vec<(usize, Option<u64>)> {
    let started = std::time::Instant::now();
    loop {
        let mut left = Vec::new();
        for i in strays {
            let digest = match tally_client::Client::connect(nodes[*i].endpoint.clone()).await {
                Ok(client) => client.status().await.ok().and_then(|s| s.node.sets_digest),
                Err(_) => None,
            };
            if digest != Some(0) {
                left.push((*i, digest));
            }
        }
        if left.is_empty() || started.elapsed() >= timeout {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Reads what the node at `endpoint` (of `cluster`) holds.
pub async fn read_likes(endpoint: &str, cluster: &str) -> anyhow::Result<HeldLikes> {
    let mut likes = LikesClient::connect(endpoint.to_string()).await?;
    let key: tonic::codegen::Bytes = LIKE_KEY.as_bytes().to_vec().into();
    let liked = likes
        .liked(LikedRequest {
            key: key.clone(),
            members: (0..MEMBERS)
                .map(|i| member_name(i).into_bytes().into())
                .collect(),
        })
        .await?
        .into_inner()
        .liked;
    let count = likes
        .like_count(LikeCountRequest { key: key.clone() })
        .await?
        .into_inner()
        .count;
    let recount = tally_client::Client::connect(endpoint.to_string())
        .await?
        .verify_likes(LIKE_KEY)
        .await?;
    let distinct = likes
        .distinct(DistinctRequest {
            keys: vec![UNIQUES_KEY.as_bytes().to_vec().into()],
            with_registers: false,
        })
        .await?
        .into_inner();
    Ok(HeldLikes {
        liked,
        count,
        recount_consistent: recount.consistent,
        distinct: (distinct.estimate, distinct.registers_digest),
        lengths: read_lengths(endpoint, cluster).await?,
    })
}

/// Each member's causal length at the node at `endpoint`: the max over its
/// whole delta log, read by a raw pull from the start (the log is never
/// compacted, and every committed change of a member, taken or merged, is
/// in it).
async fn read_lengths(endpoint: &str, cluster: &str) -> anyhow::Result<Vec<u64>> {
    let mut client = ReplicationClient::connect(endpoint.to_string())
        .await
        .with_context(|| format!("cannot reach {endpoint} to read its like lengths"))?
        .max_decoding_message_size(64 << 20);
    let mut lengths = vec![0; MEMBERS];
    let mut request = PullRequest {
        cluster_id: cluster.to_string(),
        max_bytes: 16 << 20,
        protocol_version: tally_node::replica::version::NEWEST,
        protocol_oldest: tally_node::replica::version::OLDEST,
        deltas_after: Some(Default::default()),
        ..Default::default()
    };
    for _ in 0..1_000 {
        let mut stream = client.pull(request.clone()).await?.into_inner();
        let mut complete = false;
        while let Some(chunk) = stream.message().await? {
            for delta in chunk.set_deltas.iter().filter(|delta| delta.kind == 1) {
                if delta.key != LIKE_KEY.as_bytes() {
                    continue;
                }
                for member in &delta.members {
                    let index = (0..MEMBERS).find(|i| member_name(*i).as_bytes() == member.member);
                    if let Some(index) = index {
                        lengths[index] = lengths[index].max(member.length);
                    }
                }
            }
            if chunk.next.is_some() {
                request.after = chunk.next;
            }
            if chunk.deltas_next.is_some() {
                request.deltas_after = chunk.deltas_next;
            }
            complete = chunk.deltas_complete;
        }
        if complete {
            return Ok(lengths);
        }
    }
    anyhow::bail!("{endpoint} never finished answering its delta log")
}

/// The check of the module documentation: each violation as (kind, detail).
/// `held`: the running nodes' states in node order (a spare that never
/// joined is left out, so `n{i}` in a detail is the i-th running node).
/// `exact_members`: check each member's state against its operations (not
/// after a wipe, which may lose an acknowledged like with its disk).
pub fn check(
    book: &LikeBook,
    held: &[HeldLikes],
    exact_members: bool,
) -> Vec<(&'static str, String)> {
    let mut violations = Vec::new();
    let Some(first) = held.first() else {
        return violations;
    };
    for (node, region) in held.iter().enumerate() {
        if region.liked != first.liked || region.distinct.1 != first.distinct.1 {
            violations.push((
                "like sets differ",
                format!("n{node} and n0 hold different members or registers"),
            ));
        }
        if region.lengths != first.lengths {
            violations.push((
                "like lengths differ",
                format!("n{node}: {:?}, n0: {:?}", region.lengths, first.lengths),
            ));
        }
        for (index, length) in region.lengths.iter().enumerate() {
            if region.liked.get(index) != Some(&(length % 2 == 1)) {
                violations.push((
                    "liked but length even",
                    format!(
                        "n{node}: {} answers liked {:?} with length {length}",
                        member_name(index),
                        region.liked.get(index)
                    ),
                ));
            }
        }
        let liked = region.liked.iter().filter(|liked| **liked).count() as u64;
        if region.count != liked || !region.recount_consistent {
            violations.push((
                "derived count wrong",
                format!(
                    "n{node}: count {}, members liked {liked}, recount consistent {}",
                    region.count, region.recount_consistent
                ),
            ));
        }
    }
    for (index, ops) in book.members.iter().enumerate().filter(|_| exact_members) {
        let expected = match (ops.likes_acked + ops.likes_unknown, ops.unlikes) {
            (0, _) => Some(false),
            (_, 0) if ops.likes_acked > 0 => Some(true),
            _ => None,
        };
        let length = first.lengths.get(index).copied().unwrap_or_default();
        let wrong = if length < ops.longest_answer {
            Some("an acknowledged operation's length lost")
        } else if ops.length_unknown == 0 && length != ops.longest_answer {
            Some("not the longest answer, though every operation was answered")
        } else if length > u64::from(ops.may_raise) {
            Some("longer than the operations that could raise it")
        } else {
            None
        };
        if let Some(wrong) = wrong {
            violations.push((
                "like length not exact",
                format!("{}: length {length}: {wrong} ({ops:?})", member_name(index)),
            ));
        }
        if let Some(expected) = expected {
            if first.liked.get(index) != Some(&expected) {
                violations.push((
                    "like state not exact",
                    format!(
                        "{}: liked {:?}, but its operations ({ops:?}) say {expected}",
                        member_name(index),
                        first.liked.get(index)
                    ),
                ));
            }
        }
    }
    // The sketch is within a few percent at these sizes (0.81% standard
    // error once dense).
    let estimate = first.distinct.0 as f64;
    let (low, high) = (book.observed_acked as f64, book.observed_issued as f64);
    if estimate < low * 0.95 - 2.0 || estimate > high * 1.05 + 2.0 {
        violations.push((
            "uniques estimate out of range",
            format!("estimate {estimate}, {low} distinct members observed in acknowledged calls, {high} issued"),
        ));
    }
    violations
}

/// Counts for the summary line: (members liked, members with an exact
/// expectation, members whose length must equal the longest answer).
pub fn summary(book: &LikeBook, held: &[HeldLikes]) -> (usize, usize, usize) {
    let liked = held
        .first()
        .map_or(0, |h| h.liked.iter().filter(|l| **l).count());
    let exact = book
        .members
        .iter()
        .filter(|ops| {
            ops.likes_acked + ops.likes_unknown == 0 || (ops.unlikes == 0 && ops.likes_acked > 0)
        })
        .count();
    let exact_lengths = book
        .members
        .iter()
        .filter(|ops| ops.length_unknown == 0)
        .count();
    (liked, exact, exact_lengths)
}

#[cfg(test)]
#[path = "likes_tests.rs"]
mod tests;
