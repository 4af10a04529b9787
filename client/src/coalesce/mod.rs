//! Client-side coalescing of adds: concurrent [`Client::add`] calls on one
//! client are sent to its node together, as one `AddBatch` call, each add
//! keeping its own idempotency key and getting its own answer. Likes and
//! unlikes are coalesced the same way into `LikeBatch` calls (a second task
//! of the same code, over [`like_wire::LikeBatch`]); reads into `GetBatch`
//! calls, in [`reads`]; `liked` reads of one like set into one `Liked`
//! call and observes of one uniques key into one `Observe` call, in
//! [`member_calls`].
//!
//! [`spawn_coalescer`] starts one background task per client and batch
//! method (shared by its clones). A caller encodes its add, sends it with a oneshot reply channel
//! over an unbounded mpsc channel, and waits for the reply; the task drives a
//! [`Batcher`] (the policy, without I/O) and runs its batches as gRPC calls.
//!
//! Invariants (see [`batcher`] for the batching policy):
//!
//! - The task answers every add by its deadline (counted from when the task
//!   takes the add, a scheduling round after the call), so callers need no
//!   timer or clock reading of their own; the task keeps one timer for the
//!   batcher's next deadline and one per call in flight.
//! - The task holds no sender of its own channel: when the last clone of the
//!   client is dropped the channel closes and the task ends, dropping what it
//!   still had in flight (nobody is left to read those answers).
//!
//! [`Client::add`]: crate::Client::add

mod batcher;
mod calls;
pub(crate) mod like_wire;
pub(crate) mod member_calls;
pub(crate) mod reads;
pub(crate) mod wire;

use std::time::Duration;

use crate::transport::Transport;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tonic::client::Grpc;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{GrpcMethod, Status};

pub(crate) use batcher::BatchSettings;
use batcher::{Batcher, OutgoingBatch, PendingAdd, Waiter};
use wire::{Answer, BatchCodec, BatchRpc, EncodedItem};

use crate::Error;

/// Where the task sends an item's answer, with the number of times it sent
/// the item.
type ReplyTx<O> = oneshot::Sender<(Result<O, Error>, u32)>;

impl<O> Waiter for ReplyTx<O> {
    type Outcome = O;

    fn is_closed(&self) -> bool {
        oneshot::Sender::is_closed(self)
    }

    fn answer(self, result: Result<O, Error>, attempts: u32) {
        // The caller may have gone away meanwhile; then nobody wants it.
        let _ = self.send((result, attempts));
    }
}

/// A client's way to its coalescing task for the batch method `R`. Cloning
/// it shares the task; the task stops when the last clone is dropped.
#[derive(Debug)]
pub(crate) struct CoalescerHandle<R: BatchRpc> {
    submit_tx: mpsc::UnboundedSender<PendingAdd<ReplyTx<R::Outcome>>>,
}

impl<R: BatchRpc> Clone for CoalescerHandle<R> {
    fn clone(&self) -> Self {
        CoalescerHandle {
            submit_tx: self.submit_tx.clone(),
        }
    }
}

/// Starts a coalescing task of a client, for the batch method `R`, on the
/// current tokio runtime.
pub(crate) fn spawn_coalescer<R: BatchRpc>(
    channel: Transport,
    settings: BatchSettings,
) -> CoalescerHandle<R> {
    let (submit_tx, submit_rx) = mpsc::unbounded_channel();
    tokio::spawn(run::<R>(
        Grpc::new(channel),
        Batcher::new(settings),
        submit_rx,
    ));
    CoalescerHandle { submit_tx }
}

impl<R: BatchRpc> CoalescerHandle<R> {
    /// Sends one encoded item with the rest of its batch, and waits for its
    /// answer, which comes within the configured deadline. The number of
    /// times the item was sent goes to the caller's tracing span.
    pub(crate) async fn submit(&self, body: EncodedItem) -> Result<R::Outcome, Error> {
        let (reply_tx, reply_rx) = oneshot::channel();
        let pending = PendingAdd {
            body,
            waiter: reply_tx,
        };
        if self.submit_tx.send(pending).is_err() {
            return Err(task_stopped());
        }
        match reply_rx.await {
            Ok((result, attempts)) => {
                crate::trace::record_attempts(attempts);
                result
            }
            Err(_) => Err(task_stopped()),
        }
    }
}

/// The task is gone: its runtime was shut down (the task never ends while a
/// client can still submit), or it panicked.
fn task_stopped() -> Error {
    Error::Unavailable {
        attempts: 0,
        message: "the client's coalescing task has stopped (was the tokio runtime it \
                  started on shut down?); make a new client"
            .to_owned(),
    }
}

/// The task: feeds the batcher with items, answers and timeouts, and sends
/// the batches it emits.
async fn run<R: BatchRpc>(
    grpc: Grpc<Transport>,
    mut batcher: Batcher<ReplyTx<R::Outcome>>,
    mut submit_rx: mpsc::UnboundedReceiver<PendingAdd<ReplyTx<R::Outcome>>>,
) {
    let mut calls = FuturesUnordered::new();
    let timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(timer);
    let mut timer_at: Option<std::time::Instant> = None;
    loop {
        let now = Instant::now().into_std();
        batcher.handle_timeout(now);
        while let Some(batch) = batcher.poll_transmit(now) {
            calls.push(send_batch::<R>(grpc.clone(), batch));
        }
        let wake_at = batcher.poll_timeout();
        if wake_at != timer_at {
            if let Some(at) = wake_at {
                timer.as_mut().reset(Instant::from_std(at));
            }
            timer_at = wake_at;
        }
        tokio::select! {
            biased;
            Some((id, outcome)) = calls.next(), if !calls.is_empty() => {
                batcher.handle_batch_done(Instant::now().into_std(), id, outcome, crate::random::jitter());
            }
            received = submit_rx.recv() => {
                let Some(pending) = received else {
                    return;
                };
                let now = Instant::now().into_std();
                batcher.handle_submit(now, pending);
                while let Ok(pending) = submit_rx.try_recv() {
                    batcher.handle_submit(now, pending);
                }
            }
            () = &mut timer, if timer_at.is_some() => {
                // `handle_timeout` at the top of the loop does the work; the
                // timer is re-armed from `poll_timeout`, which after that
                // only names moments still to come.
                timer_at = None;
            }
        }
    }
}

/// Sends one batch; answers with its id and the per-item results or the
/// failure of the whole call. The call is abandoned at its timeout even if
/// the node never answers.
async fn send_batch<R: BatchRpc>(
    mut grpc: Grpc<Transport>,
    batch: OutgoingBatch,
) -> (u64, Result<Vec<Answer<R::Outcome>>, Status>) {
    let OutgoingBatch {
        id,
        payload,
        adds,
        timeout,
    } = batch;
    tracing::trace!(id, adds, bytes = payload.len(), "sending a coalesced batch");
    let call = async move {
        grpc.ready()
            .await
            .map_err(|error| Status::unknown(format!("the connection is not ready: {error}")))?;
        let mut request = tonic::Request::new(payload);
        request.set_timeout(timeout);
        request
            .extensions_mut()
            .insert(GrpcMethod::new(R::SERVICE, R::METHOD));
        grpc.unary(
            request,
            PathAndQuery::from_static(R::PATH),
            BatchCodec::<R>::default(),
        )
        .await
        .map(tonic::Response::into_inner)
    };
    let outcome = match tokio::time::timeout(timeout, call).await {
        Ok(outcome) => outcome,
        Err(_elapsed) => Err(Status::deadline_exceeded(
            "no answer to the batch within the deadline",
        )),
    };
    (id, outcome)
}

#[cfg(test)]
mod tests {
    use tonic::transport::Endpoint;

    use super::*;
    use crate::retry::Backoff;

    fn settings() -> BatchSettings {
        BatchSettings {
            max_batch: 16,
            max_in_flight: 2,
            window: Duration::from_micros(200),
            max_retries: 0,
            backoff: Backoff {
                base: Duration::from_millis(1),
                max: Duration::from_millis(1),
            },
            deadline: Duration::from_millis(200),
        }
    }

    #[tokio::test]
    async fn the_task_stops_when_the_last_handle_is_dropped() {
        let metrics = tokio::runtime::Handle::current().metrics();
        // Nothing listens on port 1: the lazy channel never connects.
        let channel = Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        let before = metrics.num_alive_tasks();
        let handle: CoalescerHandle<wire::AddBatch> = spawn_coalescer(
            Transport::new(channel, http::HeaderMap::new(), None),
            settings(),
        );
        let clone = handle.clone();
        assert_eq!(metrics.num_alive_tasks(), before + 1);
        drop(handle);
        tokio::task::yield_now().await;
        assert_eq!(metrics.num_alive_tasks(), before + 1, "a clone is left");
        drop(clone);
        let started = std::time::Instant::now();
        while metrics.num_alive_tasks() > before {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the task did not stop"
            );
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn an_unreachable_node_fails_the_add_within_its_deadline() {
        let channel = Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        let handle: CoalescerHandle<wire::AddBatch> = spawn_coalescer(
            Transport::new(channel, http::HeaderMap::new(), None),
            settings(),
        );
        let body = wire::encode_add(b"k", 1, b"key", 0);
        let deadline = Instant::now() + Duration::from_millis(200);
        let error = handle.submit(body).await.unwrap_err();
        assert!(error.is_transient(), "{error:?}");
        assert!(Instant::now() <= deadline + Duration::from_millis(100));
    }
}
