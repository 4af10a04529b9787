//! Client-side coalescing of calls that ask about members of one key:
//! concurrent [`Client::liked`] calls on one client that ask about the same
//! like set are sent to its node together, as one `Liked` call holding every
//! caller's members (up to the node's 10,000 a call), and each caller gets
//! the answers for its own members; concurrent [`Client::observe`] calls on
//! one uniques key likewise travel as one `Observe` call, each caller getting
//! the key's estimate after it (durable when answered, as a lone observe).
//! Under a hot post, 256 page views asking "did I like this?" cost the node
//! one lock and one call, not 256.
//!
//! [`spawn_member_coalescer`] starts one background task per client and
//! kind of call (shared by its clones), with the read coalescer's settings:
//! a call goes out at once while fewer than `max_in_flight` are in flight,
//! otherwise calls gather until one returns. Retries stay with the caller's
//! retry policy (a retried observe counts nothing twice: members are a set).
//!
//! Invariants, as for reads (`reads.rs`):
//!
//! - **Reads see what came before them.** A caller joins only a call not
//!   sent yet, so a like acknowledged before `liked` is in its answer.
//! - Every waiter is answered once: with its own answer, or the error of
//!   the whole call. A waiter that went away is dropped before sending, and
//!   its members are not sent.
//! - The task holds no sender of its own channel: it ends when the last
//!   clone of the client is dropped.
//!
//! [`Client::liked`]: crate::Client::liked
//! [`Client::observe`]: crate::Client::observe

use std::collections::HashMap;
use std::time::Duration;

use prost::bytes::Bytes;
use tally_proto::v1::likes_client::LikesClient;
use tally_proto::v1::{LikedRequest, ObserveRequest};
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::calls::{drive, submit_and_wait, CallQueue};
use super::reads::ReadSettings;
use crate::transport::Transport;

/// The most members a node takes in one `Liked` or `Observe` call.
pub(crate) const MAX_MEMBERS: usize = 10_000;

/// The kind of call a coalescer sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemberCall {
    /// `Liked`: each caller gets one flag per member it asked about.
    Liked,
    /// `Observe`: each caller gets the key's estimate after the call.
    Observe,
}

/// The answer to one caller.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum MemberAnswer {
    /// Whether each of its members likes the set, in its order.
    Liked(Vec<bool>),
    /// The uniques key's estimate after its members were observed.
    Estimate(u64),
}

type CallAnswer = Result<MemberAnswer, Status>;

/// One caller's call, as the task receives it.
struct PendingCall {
    key: Bytes,
    members: Vec<Bytes>,
    /// The caller's time left; a call's gRPC timeout is its longest.
    timeout: Duration,
    reply: oneshot::Sender<CallAnswer>,
}

/// A client's way to one of its member-call coalescing tasks; clones share
/// the task.
#[derive(Clone, Debug)]
pub(crate) struct MemberCoalescerHandle {
    submit_tx: mpsc::UnboundedSender<PendingCall>,
}

/// Starts a coalescing task for `kind` calls of a client on the current
/// runtime.
pub(crate) fn spawn_member_coalescer(
    channel: Transport,
    settings: ReadSettings,
    kind: MemberCall,
) -> MemberCoalescerHandle {
    let (submit_tx, submit_rx) = mpsc::unbounded_channel();
    let client = LikesClient::new(channel);
    tokio::spawn(drive(
        MemberQueue::default(),
        settings.max_in_flight,
        submit_rx,
        move |call| send_call(client.clone(), kind, call),
    ));
    MemberCoalescerHandle { submit_tx }
}

impl MemberCoalescerHandle {
    /// Sends `members` (at most [`MAX_MEMBERS`]) of `key` in the next call
    /// for `key`, giving up after `timeout`.
    pub(crate) async fn call(
        &self,
        key: Bytes,
        members: Vec<Bytes>,
        timeout: Duration,
    ) -> CallAnswer {
        let (reply, reply_rx) = oneshot::channel();
        let pending = PendingCall {
            key,
            members,
            timeout,
            reply,
        };
        let what = "coalesced call";
        submit_and_wait(
            &self.submit_tx,
            pending,
            reply_rx,
            timeout,
            what,
            task_stopped,
        )
        .await
    }

    /// [`Self::call`] for a `liked` coalescer.
    pub(crate) async fn liked(
        &self,
        key: Bytes,
        members: Vec<Bytes>,
        timeout: Duration,
    ) -> Result<Vec<bool>, Status> {
        match self.call(key, members, timeout).await? {
            MemberAnswer::Liked(liked) => Ok(liked),
            MemberAnswer::Estimate(_) => Err(wrong_kind()),
        }
    }

    /// [`Self::call`] for an `observe` coalescer.
    pub(crate) async fn observe(
        &self,
        key: Bytes,
        members: Vec<Bytes>,
        timeout: Duration,
    ) -> Result<u64, Status> {
        match self.call(key, members, timeout).await? {
            MemberAnswer::Estimate(estimate) => Ok(estimate),
            MemberAnswer::Liked(_) => Err(wrong_kind()),
        }
    }
}

fn wrong_kind() -> Status {
    Status::internal("a member-call coalescer answered another kind of call")
}

fn task_stopped() -> Status {
    Status::unavailable(
        "the client's member-call coalescing task has stopped (was the tokio runtime it \
         started on shut down?); make a new client",
    )
}

/// Questions waiting to be sent, grouped by like set in the order sets
/// first came.
#[derive(Default)]
struct MemberQueue {
    keys: Vec<Bytes>,
    waiting: HashMap<Bytes, Vec<PendingCall>>,
}

impl MemberQueue {
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// One call ready to send: its request and, per waiter, how many of its
/// members it holds.
struct MemberBatch {
    request: LikedRequest,
    timeout: Duration,
    waiters: Vec<(usize, oneshot::Sender<CallAnswer>)>,
}

impl CallQueue for MemberQueue {
    type Item = PendingCall;
    type Call = MemberBatch;

    fn push(&mut self, question: PendingCall) {
        let waiting = self.waiting.entry(question.key.clone()).or_insert_with(|| {
            self.keys.push(question.key.clone());
            Vec::new()
        });
        waiting.push(question);
    }

    /// The oldest set's questions that somebody still waits for, as many as
    /// fit in one call (the rest stay first in line); `None` when nobody
    /// waits for anything.
    fn take_call(&mut self) -> Option<MemberBatch> {
        while let Some(key) = self.keys.first().cloned() {
            let mut waiting = self.waiting.remove(&key).unwrap_or_default();
            waiting.retain(|question| !question.reply.is_closed());
            let mut call = MemberBatch {
                request: LikedRequest {
                    key: key.clone(),
                    members: Vec::new(),
                },
                timeout: Duration::ZERO,
                waiters: Vec::new(),
            };
            let mut rest = Vec::new();
            for question in waiting {
                let fits = call.request.members.len() + question.members.len() <= MAX_MEMBERS;
                if !fits && !call.waiters.is_empty() {
                    rest.push(question);
                    continue;
                }
                call.timeout = call.timeout.max(question.timeout);
                call.waiters.push((question.members.len(), question.reply));
                call.request.members.extend(question.members);
            }
            if rest.is_empty() {
                self.keys.remove(0);
            } else {
                self.waiting.insert(key, rest);
            }
            if !call.waiters.is_empty() {
                return Some(call);
            }
        }
        None
    }
}

/// Sends one call and answers its waiters.
async fn send_call(mut client: LikesClient<Transport>, kind: MemberCall, call: MemberBatch) {
    let MemberBatch {
        request,
        timeout,
        waiters,
    } = call;
    let asked = request.members.len();
    let sent = async {
        match kind {
            MemberCall::Liked => {
                let mut grpc = tonic::Request::new(request);
                grpc.set_timeout(timeout);
                let response = client.liked(grpc).await?.into_inner();
                Ok(MemberAnswer::Liked(response.liked))
            }
            MemberCall::Observe => {
                let mut grpc = tonic::Request::new(ObserveRequest {
                    key: request.key,
                    members: request.members,
                });
                grpc.set_timeout(timeout);
                let response = client.observe(grpc).await?.into_inner();
                Ok(MemberAnswer::Estimate(response.estimate))
            }
        }
    };
    let outcome = match tokio::time::timeout(timeout, sent).await {
        Ok(outcome) => outcome,
        Err(_elapsed) => Err(Status::deadline_exceeded(
            "no answer to the coalesced call within the deadline",
        )),
    };
    answer(waiters, asked, outcome);
}

/// Hands each waiter its answer (its slice of a `liked` call's flags, or
/// the estimate), or everyone the error.
fn answer(
    waiters: Vec<(usize, oneshot::Sender<CallAnswer>)>,
    asked: usize,
    outcome: Result<MemberAnswer, Status>,
) {
    let outcome = outcome.and_then(|answer| match answer {
        MemberAnswer::Liked(liked) if liked.len() != asked => Err(Status::internal(format!(
            "the node answered {} flags to a `liked` call of {asked} members",
            liked.len()
        ))),
        answer => Ok(answer),
    });
    let mut at = 0;
    for (count, reply) in waiters {
        // The caller may have timed out meanwhile; then nobody wants it.
        let _ = reply.send(match &outcome {
            Ok(MemberAnswer::Liked(liked)) => {
                Ok(MemberAnswer::Liked(liked[at..at + count].to_vec()))
            }
            Ok(estimate) => Ok(estimate.clone()),
            Err(status) => Err(status.clone()),
        });
        at += count;
    }
}

#[cfg(test)]
#[path = "member_calls_tests.rs"]
mod tests;
