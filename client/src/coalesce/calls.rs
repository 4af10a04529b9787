//! What the read and member-call coalescing tasks share (`reads.rs`,
//! `member_calls.rs`): the task's loop (queue what callers submit, send a
//! call whenever fewer than `max_in_flight` are in flight, gather while they
//! all are; the task ends when its channel closes, the last client clone
//! dropped), and a caller's submit-and-wait with its deadline.

use std::future::Future;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

/// What a coalescing task queues and sends.
pub(crate) trait CallQueue {
    /// One caller's submission.
    type Item;
    /// One call ready to send, with its waiters.
    type Call;
    /// Queues a submission.
    fn push(&mut self, item: Self::Item);
    /// The next call to send, if anybody still waits for something.
    fn take_call(&mut self) -> Option<Self::Call>;
}

/// Runs a coalescing task over `queue` until `submit_rx` closes; `send`
/// sends one call and answers its waiters.
pub(crate) async fn drive<Q, F, Fut>(
    mut queue: Q,
    max_in_flight: usize,
    mut submit_rx: mpsc::UnboundedReceiver<Q::Item>,
    send: F,
) where
    Q: CallQueue,
    F: Fn(Q::Call) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut calls = FuturesUnordered::new();
    loop {
        while calls.len() < max_in_flight.max(1) {
            match queue.take_call() {
                Some(call) => calls.push(send(call)),
                None => break,
            }
        }
        tokio::select! {
            biased;
            Some(()) = calls.next(), if !calls.is_empty() => {}
            received = submit_rx.recv() => {
                let Some(item) = received else {
                    return;
                };
                queue.push(item);
                while let Ok(item) = submit_rx.try_recv() {
                    queue.push(item);
                }
            }
        }
    }
}

/// Hands `item` to a coalescing task and waits for its answer on
/// `reply_rx`, up to `timeout` (then `DeadlineExceeded`, saying `what` got
/// no answer); `stopped` is the status when the task is gone.
pub(crate) async fn submit_and_wait<T, A>(
    submit_tx: &mpsc::UnboundedSender<T>,
    item: T,
    reply_rx: oneshot::Receiver<Result<A, Status>>,
    timeout: Duration,
    what: &str,
    stopped: fn() -> Status,
) -> Result<A, Status> {
    if submit_tx.send(item).is_err() {
        return Err(stopped());
    }
    match tokio::time::timeout(timeout, reply_rx).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(stopped()),
        Err(_elapsed) => Err(Status::deadline_exceeded(format!(
            "no answer to the {what} within the deadline"
        ))),
    }
}
