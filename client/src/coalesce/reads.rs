//! Client-side coalescing of reads: concurrent [`Client::get`] calls on one
//! client are sent to its node together, as one `GetBatch` call in which a
//! key appears once however many callers asked for it. Under a hot key, 256
//! callers reading one counter cost the node one read per batch, not 256.
//!
//! [`spawn_read_coalescer`] starts one background task per client (shared by
//! its clones). A caller sends its key with a oneshot reply channel and waits
//! with its own timeout; retries stay with the caller's [`RetryPolicy`], so a
//! coalesced read fails and retries exactly like a direct one.
//!
//! Invariants:
//!
//! - **Reads see what came before them.** A read only joins a batch that has
//!   not been sent yet, so the node answers it after the read was called:
//!   an add acknowledged before a `get` is in the value that `get` returns
//!   (on the same node). Joining a read already in flight would break that.
//! - A batch goes out at once when fewer than `max_in_flight` are in flight
//!   (a lone read at low load waits for nothing); otherwise reads gather
//!   until one returns. A batch holds at most `max_batch` distinct keys.
//! - Every waiter is answered once: with its key's result, its key's error,
//!   or the error of the whole call. A waiter that went away (its caller
//!   timed out) is dropped, and a key nobody waits for any more is not sent.
//! - The task holds no sender of its own channel: it ends when the last
//!   clone of the client is dropped.
//!
//! [`Client::get`]: crate::Client::get
//! [`RetryPolicy`]: crate::retry::RetryPolicy

use std::collections::HashMap;
use std::time::Duration;

use prost::bytes::Bytes;
use tally_proto::v1::counters_client::CountersClient;
use tally_proto::v1::{get_result, GetBatchRequest, GetRequest, GetResponse, GetResult};
use tokio::sync::{mpsc, oneshot};
use tonic::{Code, Status};

use super::calls::{drive, submit_and_wait, CallQueue};
use crate::transport::Transport;

/// The answer to one read: the node's response for its key, or a status
/// (of the key, or of the whole call) for the caller's retry policy.
type ReadAnswer = Result<GetResponse, Status>;

/// One caller's read, as the task receives it.
struct PendingRead {
    key: Bytes,
    /// The caller's time left; the batch's gRPC timeout is its longest.
    timeout: Duration,
    reply: oneshot::Sender<ReadAnswer>,
}

/// A client's way to its read-coalescing task; clones share the task.
#[derive(Clone, Debug)]
pub(crate) struct ReadCoalescerHandle {
    submit_tx: mpsc::UnboundedSender<PendingRead>,
}

/// How reads are batched.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadSettings {
    /// The most distinct keys in one `GetBatch`.
    pub(crate) max_batch: usize,
    /// The most `GetBatch` calls in flight at once.
    pub(crate) max_in_flight: usize,
}

/// Starts the read-coalescing task of a client on the current tokio runtime.
pub(crate) fn spawn_read_coalescer(
    channel: Transport,
    settings: ReadSettings,
) -> ReadCoalescerHandle {
    let (submit_tx, submit_rx) = mpsc::unbounded_channel();
    let client = CountersClient::new(channel);
    let queue = ReadQueue {
        max_keys: settings.max_batch.max(1),
        ..ReadQueue::default()
    };
    tokio::spawn(drive(
        queue,
        settings.max_in_flight,
        submit_rx,
        move |batch| send_batch(client.clone(), batch),
    ));
    ReadCoalescerHandle { submit_tx }
}

impl ReadCoalescerHandle {
    /// Reads `key` (without breakdown) in the next batch, giving up after
    /// `timeout` with `DeadlineExceeded`.
    pub(crate) async fn get(&self, key: Bytes, timeout: Duration) -> ReadAnswer {
        let (reply, reply_rx) = oneshot::channel();
        let pending = PendingRead {
            key,
            timeout,
            reply,
        };
        submit_and_wait(
            &self.submit_tx,
            pending,
            reply_rx,
            timeout,
            "read",
            task_stopped,
        )
        .await
    }
}

fn task_stopped() -> Status {
    Status::unavailable(
        "the client's read-coalescing task has stopped (was the tokio runtime it \
         started on shut down?); make a new client",
    )
}

/// Reads waiting to be sent, grouped by key in the order keys first came.
#[derive(Default)]
struct ReadQueue {
    /// The most distinct keys in one batch the task sends.
    max_keys: usize,
    keys: Vec<Bytes>,
    waiters: HashMap<Bytes, Vec<oneshot::Sender<ReadAnswer>>>,
    timeouts: HashMap<Bytes, Duration>,
}

/// A batch ready to send: its request and who waits for each of its keys.
struct ReadBatch {
    request: GetBatchRequest,
    timeout: Duration,
    waiters: Vec<Vec<oneshot::Sender<ReadAnswer>>>,
}

impl ReadQueue {
    fn push(&mut self, read: PendingRead) {
        let waiters = self.waiters.entry(read.key.clone()).or_insert_with(|| {
            self.keys.push(read.key.clone());
            Vec::new()
        });
        waiters.push(read.reply);
        let timeout = self.timeouts.entry(read.key).or_default();
        *timeout = (*timeout).max(read.timeout);
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Takes up to `max_keys` keys that somebody still waits for, oldest
    /// first; `None` when nobody waits for anything.
    fn take_batch(&mut self, max_keys: usize) -> Option<ReadBatch> {
        let mut batch = ReadBatch {
            request: GetBatchRequest { gets: Vec::new() },
            timeout: Duration::ZERO,
            waiters: Vec::new(),
        };
        let mut taken = 0;
        while taken < self.keys.len() && batch.waiters.len() < max_keys {
            let key = &self.keys[taken];
            taken += 1;
            let mut waiters = self.waiters.remove(key).unwrap_or_default();
            let timeout = self.timeouts.remove(key).unwrap_or_default();
            waiters.retain(|reply| !reply.is_closed());
            if waiters.is_empty() {
                continue;
            }
            batch.request.gets.push(GetRequest {
                key: key.clone(),
                ..Default::default()
            });
            batch.timeout = batch.timeout.max(timeout);
            batch.waiters.push(waiters);
        }
        self.keys.drain(..taken);
        (!batch.waiters.is_empty()).then_some(batch)
    }
}

impl CallQueue for ReadQueue {
    type Item = PendingRead;
    type Call = ReadBatch;

    fn push(&mut self, read: PendingRead) {
        ReadQueue::push(self, read);
    }

    fn take_call(&mut self) -> Option<ReadBatch> {
        self.take_batch(self.max_keys)
    }
}

/// Sends one batch and answers its waiters.
async fn send_batch(mut client: CountersClient<Transport>, batch: ReadBatch) {
    let ReadBatch {
        request,
        timeout,
        waiters,
    } = batch;
    let mut call = tonic::Request::new(request);
    call.set_timeout(timeout);
    let outcome = match tokio::time::timeout(timeout, client.get_batch(call)).await {
        Ok(outcome) => outcome.map(tonic::Response::into_inner),
        Err(_elapsed) => Err(Status::deadline_exceeded(
            "no answer to the read batch within the deadline",
        )),
    };
    match outcome {
        Ok(response) if response.results.len() == waiters.len() => {
            for (result, waiters) in response.results.into_iter().zip(waiters) {
                answer_all(waiters, &result_answer(result));
            }
        }
        Ok(response) => {
            let status = Status::internal(format!(
                "the node answered {} results to a batch of {} reads",
                response.results.len(),
                waiters.len()
            ));
            for waiters in waiters {
                answer_all(waiters, &Err(status.clone()));
            }
        }
        Err(status) => {
            for waiters in waiters {
                answer_all(waiters, &Err(status.clone()));
            }
        }
    }
}

fn result_answer(result: GetResult) -> ReadAnswer {
    match result.outcome {
        Some(get_result::Outcome::Ok(response)) => Ok(response),
        Some(get_result::Outcome::Error(error)) => {
            Err(Status::new(Code::from_i32(error.code), error.message))
        }
        None => Err(Status::internal(
            "a batch result has neither a value nor an error",
        )),
    }
}

fn answer_all(waiters: Vec<oneshot::Sender<ReadAnswer>>, answer: &ReadAnswer) {
    for reply in waiters {
        // The caller may have timed out meanwhile; then nobody wants it.
        let _ = reply.send(answer.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(queue: &mut ReadQueue, key: &str, timeout_ms: u64) -> oneshot::Receiver<ReadAnswer> {
        let (reply, reply_rx) = oneshot::channel();
        queue.push(PendingRead {
            key: Bytes::copy_from_slice(key.as_bytes()),
            timeout: Duration::from_millis(timeout_ms),
            reply,
        });
        reply_rx
    }

    fn keys(batch: &ReadBatch) -> Vec<&[u8]> {
        batch.request.gets.iter().map(|get| &get.key[..]).collect()
    }

    #[test]
    fn a_key_is_sent_once_however_many_callers_wait_for_it() {
        let mut queue = ReadQueue::default();
        let _receivers: Vec<_> = (0..100).map(|_| read(&mut queue, "hot", 50)).collect();
        let _cold = read(&mut queue, "cold", 80);
        let batch = queue.take_batch(16).expect("a batch");
        assert_eq!(keys(&batch), vec![&b"hot"[..], &b"cold"[..]]);
        assert_eq!(batch.waiters[0].len(), 100);
        assert_eq!(batch.waiters[1].len(), 1);
        assert_eq!(batch.timeout, Duration::from_millis(80), "the longest wait");
        assert!(queue.is_empty());
        assert!(queue.take_batch(16).is_none());
    }

    #[test]
    fn batches_hold_at_most_max_keys_oldest_first() {
        let mut queue = ReadQueue::default();
        let _receivers: Vec<_> = (0..5)
            .map(|i| read(&mut queue, &format!("k{i}"), 10))
            .collect();
        let first = queue.take_batch(2).expect("a batch");
        assert_eq!(keys(&first), vec![&b"k0"[..], &b"k1"[..]]);
        let second = queue.take_batch(2).expect("a batch");
        assert_eq!(keys(&second), vec![&b"k2"[..], &b"k3"[..]]);
        let third = queue.take_batch(2).expect("a batch");
        assert_eq!(keys(&third), vec![&b"k4"[..]]);
    }

    #[test]
    fn a_key_nobody_waits_for_any_more_is_not_sent() {
        let mut queue = ReadQueue::default();
        drop(read(&mut queue, "gone", 10));
        let _kept = read(&mut queue, "kept", 10);
        let batch = queue.take_batch(16).expect("a batch");
        assert_eq!(keys(&batch), vec![&b"kept"[..]]);
        let mut queue = ReadQueue::default();
        drop(read(&mut queue, "gone", 10));
        assert!(queue.take_batch(16).is_none());
        assert!(queue.is_empty());
    }

    #[test]
    fn every_waiter_of_a_key_gets_its_answer() {
        let mut queue = ReadQueue::default();
        let mut first = read(&mut queue, "k", 10);
        let mut second = read(&mut queue, "k", 10);
        let batch = queue.take_batch(16).expect("a batch");
        let result = GetResult {
            outcome: Some(get_result::Outcome::Ok(GetResponse {
                key: Bytes::from_static(b"k"),
                value: 7,
                ..Default::default()
            })),
        };
        for waiters in batch.waiters {
            answer_all(waiters, &result_answer(result.clone()));
        }
        assert_eq!(first.try_recv().unwrap().unwrap().value, 7);
        assert_eq!(second.try_recv().unwrap().unwrap().value, 7);
    }

    #[test]
    fn a_per_key_error_keeps_its_code() {
        let result = GetResult {
            outcome: Some(get_result::Outcome::Error(tally_proto::v1::Error {
                code: Code::OutOfRange as i32,
                message: "outside i64".to_owned(),
            })),
        };
        let status = result_answer(result).unwrap_err();
        assert_eq!(status.code(), Code::OutOfRange);
        assert_eq!(status.message(), "outside i64");
    }
}
