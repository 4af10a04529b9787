//! The batching of coalesced adds (and likes: the batcher knows items only
//! as encoded bytes and their answers as [`Answer`]s of the waiter's
//! outcome type) as a state machine without I/O or clocks:
//! time comes in as `now`, randomness as `jitter`, adds as
//! [`Batcher::handle_submit`] and answers as [`Batcher::handle_batch_done`];
//! batches to send come out of [`Batcher::poll_transmit`] and the next moment
//! the batcher needs to be woken at out of [`Batcher::poll_timeout`]. The
//! task in [`super`] drives it; the tests here drive it by hand.
//!
//! Invariants:
//!
//! - Every add submitted is answered exactly once, through its own waiter:
//!   with its own result from the node, its own per-item error, or an error
//!   of the whole call; an add whose caller went away is dropped unsent.
//! - An add is never answered after its deadline: once `now` passes it, the
//!   add gets [`Error::Timeout`] whether it is queued, in flight or waiting
//!   to be retried (a late answer from the node is then ignored).
//! - A batch goes out at once when no batch is in flight (a lone add at low
//!   load waits for nothing). While some are in flight, adds gather until a
//!   slot is free and either `window` has passed since the oldest queued add
//!   arrived or a full batch is ready. At most `max_in_flight` batches are in
//!   flight, each of at most `max_batch` adds.
//! - A retry resends the add's encoded bytes, so it carries the idempotency
//!   key of the first send. Only transient failures are retried (a transient
//!   failure of the whole call, or a per-item error with a transient code),
//!   at most `max_retries` times, after a backoff that ends before the add's
//!   deadline.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tonic::{Code, Status};

use super::wire::{Answer, EncodedItem};
use crate::retry::{is_transient_code, is_transient_status, Backoff};
use crate::Error;

/// Where an add's answer goes.
pub(crate) trait Waiter {
    /// What the caller gets for its item (an add's, a like's outcome).
    type Outcome;
    /// True when nobody waits for the answer any more (the caller's future
    /// was dropped): the add need not be sent.
    fn is_closed(&self) -> bool;
    /// Delivers the answer, and how many times the add was sent (for the
    /// caller's tracing span).
    fn answer(self, result: Result<Self::Outcome, Error>, attempts: u32);
}

/// How adds are gathered and retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BatchSettings {
    /// The most adds in one batch (at least 1).
    pub(crate) max_batch: usize,
    /// The most batches in flight at once (at least 1).
    pub(crate) max_in_flight: usize,
    /// How long adds may gather while a batch is in flight and a slot is free.
    pub(crate) window: Duration,
    /// Sends of an add after its first one, at most.
    pub(crate) max_retries: u32,
    /// The waits before retries.
    pub(crate) backoff: Backoff,
    /// The time an add may take, counted from its submission, retries
    /// included.
    pub(crate) deadline: Duration,
}

/// An add as its caller submits it.
pub(crate) struct PendingAdd<W> {
    /// The add, encoded as an element of `AddBatchRequest.adds`.
    pub(crate) body: EncodedItem,
    /// Where its answer goes.
    pub(crate) waiter: W,
}

/// A batch to send: the encoded `AddBatchRequest` and the gRPC timeout to
/// send it with (the time left to the latest deadline among its adds).
#[derive(Debug)]
pub(crate) struct OutgoingBatch {
    /// Names the batch in [`Batcher::handle_batch_done`].
    pub(crate) id: u64,
    /// The encoded request.
    pub(crate) payload: Vec<u8>,
    /// How many adds it carries.
    pub(crate) adds: usize,
    /// The gRPC timeout.
    pub(crate) timeout: Duration,
}

struct Item<W> {
    body: EncodedItem,
    /// Its submission time plus the configured deadline (so a retried add
    /// knows when it first arrived, and waits for no new gather window).
    deadline: Instant,
    /// Sends so far.
    attempts: u32,
    /// When a retry may go out (meaningful while the item waits in `retrying`).
    retry_at: Instant,
    /// `None` once answered.
    waiter: Option<W>,
}

struct InFlight<W> {
    id: u64,
    items: Vec<Item<W>>,
    /// The earliest deadline among its unanswered items.
    earliest_deadline: Option<Instant>,
}

/// See the module documentation.
pub(crate) struct Batcher<W> {
    settings: BatchSettings,
    /// Adds not yet sent, in deadline order (fresh adds arrive in that order;
    /// retried ones are inserted by deadline).
    queue: VecDeque<Item<W>>,
    /// When the oldest add of the queue arrived (at most: a retried add counts
    /// from its first arrival); `None` when the queue is empty.
    gather_since: Option<Instant>,
    in_flight: Vec<InFlight<W>>,
    /// Adds waiting out a backoff before going back to the queue.
    retrying: Vec<Item<W>>,
    /// The emptied buffer of an answered batch, to be the next queue's.
    spare: Vec<Item<W>>,
    next_batch_id: u64,
}

impl<W: Waiter> Batcher<W> {
    /// An idle batcher.
    pub(crate) fn new(settings: BatchSettings) -> Self {
        Batcher {
            settings: BatchSettings {
                max_batch: settings.max_batch.max(1),
                max_in_flight: settings.max_in_flight.max(1),
                ..settings
            },
            queue: VecDeque::new(),
            gather_since: None,
            in_flight: Vec::new(),
            retrying: Vec::new(),
            spare: Vec::new(),
            next_batch_id: 0,
        }
    }

    /// Queues an add that arrived at `now`; its deadline is `now` plus the
    /// configured one. (Reading the clock here, once for all the adds that
    /// arrived together, rather than in each caller, saves a clock reading
    /// per add; the caller's call began a scheduling round earlier at most.)
    pub(crate) fn handle_submit(&mut self, now: Instant, add: PendingAdd<W>) {
        if self.queue.is_empty() {
            self.gather_since = Some(now);
        }
        self.queue.push_back(Item {
            body: add.body,
            deadline: now + self.settings.deadline,
            attempts: 0,
            retry_at: now,
            waiter: Some(add.waiter),
        });
    }

    /// The next batch to send now, if the policy of the module documentation
    /// allows one. Call until it returns `None`.
    pub(crate) fn poll_transmit(&mut self, now: Instant) -> Option<OutgoingBatch> {
        while !self.queue.is_empty() && self.in_flight.len() < self.settings.max_in_flight {
            if !self.in_flight.is_empty() && self.queue.len() < self.settings.max_batch {
                let window_end = self.gather_since.map(|since| since + self.settings.window);
                if window_end.is_some_and(|end| now < end) {
                    return None;
                }
            }
            let take = self.queue.len().min(self.settings.max_batch);
            // Taking the whole queue moves no item (the common case: every
            // add that gathered fits in one batch), and the buffer of an
            // answered batch becomes the next queue's.
            let mut items: Vec<Item<W>> = if take == self.queue.len() {
                let spare = VecDeque::from(std::mem::take(&mut self.spare));
                std::mem::replace(&mut self.queue, spare).into()
            } else {
                self.queue.drain(..take).collect()
            };
            let deadline = self.settings.deadline;
            items.retain_mut(|item| {
                let Some(waiter) = item.waiter.take() else {
                    return false;
                };
                if waiter.is_closed() {
                    return false;
                }
                if item.deadline <= now {
                    waiter.answer(
                        Err(Error::Timeout {
                            deadline,
                            attempts: item.attempts,
                        }),
                        item.attempts,
                    );
                    return false;
                }
                item.waiter = Some(waiter);
                true
            });
            if self.queue.is_empty() {
                self.gather_since = None;
            }
            if items.is_empty() {
                continue;
            }
            let payload_len = items.iter().map(|item| item.body.as_bytes().len()).sum();
            let mut payload = Vec::with_capacity(payload_len);
            let mut earliest = items[0].deadline;
            let mut latest = items[0].deadline;
            for item in &mut items {
                payload.extend_from_slice(item.body.as_bytes());
                item.attempts += 1;
                earliest = earliest.min(item.deadline);
                latest = latest.max(item.deadline);
            }
            let id = self.next_batch_id;
            self.next_batch_id += 1;
            let adds = items.len();
            self.in_flight.push(InFlight {
                id,
                items,
                earliest_deadline: Some(earliest),
            });
            return Some(OutgoingBatch {
                id,
                payload,
                adds,
                timeout: latest.saturating_duration_since(now),
            });
        }
        None
    }

    /// Takes the answer to batch `id`: per-item results in request order, or
    /// the failure of the whole call. `jitter` (uniform in `[0, 1]`) spreads
    /// the backoff of the adds to retry.
    pub(crate) fn handle_batch_done(
        &mut self,
        now: Instant,
        id: u64,
        outcome: Result<Vec<Answer<W::Outcome>>, Status>,
        jitter: f64,
    ) {
        let Some(position) = self.in_flight.iter().position(|batch| batch.id == id) else {
            return;
        };
        let mut batch = self.in_flight.swap_remove(position);
        match outcome {
            Ok(results) if results.len() == batch.items.len() => {
                for (item, result) in batch.items.drain(..).zip(results) {
                    self.handle_item_result(now, item, result, jitter);
                }
                if batch.items.capacity() > self.spare.capacity() {
                    self.spare = batch.items;
                }
            }
            Ok(results) => {
                let sent = batch.items.len();
                for item in batch.items {
                    if let Some(waiter) = item.waiter {
                        waiter.answer(
                            Err(Error::Protocol(format!(
                                "sent {sent} adds in one batch but got {} results",
                                results.len()
                            ))),
                            item.attempts,
                        );
                    }
                }
            }
            Err(status) if is_transient_status(&status) => {
                for item in batch.items {
                    self.retry_or_fail(now, item, &status, jitter);
                }
            }
            Err(status) => {
                for item in batch.items {
                    if let Some(waiter) = item.waiter {
                        waiter.answer(Err(Error::from_status(&status)), item.attempts);
                    }
                }
            }
        }
    }

    fn handle_item_result(
        &mut self,
        now: Instant,
        item: Item<W>,
        answer: Answer<W::Outcome>,
        jitter: f64,
    ) {
        match answer {
            Answer::Error { code, message } if is_transient_code(Code::from_i32(code)) => {
                let status = Status::new(Code::from_i32(code), message);
                self.retry_or_fail(now, item, &status, jitter);
            }
            answer => {
                let Some(waiter) = item.waiter else {
                    return;
                };
                waiter.answer(
                    match answer {
                        Answer::Ok(outcome) => Ok(outcome),
                        Answer::Error { code, message } => {
                            Err(Error::from_code(Code::from_i32(code), message))
                        }
                        Answer::Empty => Err(Error::Protocol(
                            "a batch result has neither a value nor an error".to_owned(),
                        )),
                    },
                    item.attempts,
                );
            }
        }
    }

    /// Schedules a retry of an add whose send failed transiently with
    /// `status`, or answers it with that failure when its retries are spent or
    /// the backoff would end after its deadline.
    fn retry_or_fail(&mut self, now: Instant, mut item: Item<W>, status: &Status, jitter: f64) {
        let Some(waiter) = item.waiter.take() else {
            return;
        };
        let delay = self.settings.backoff.delay(item.attempts, jitter);
        if item.attempts > self.settings.max_retries || now + delay >= item.deadline {
            waiter.answer(
                Err(Error::after_retries(
                    status,
                    item.attempts,
                    self.settings.deadline,
                )),
                item.attempts,
            );
            return;
        }
        tracing::debug!(
            attempts = item.attempts,
            code = ?status.code(),
            message = status.message(),
            ?delay,
            "retrying a coalesced add after a transient failure"
        );
        item.waiter = Some(waiter);
        item.retry_at = now + delay;
        self.retrying.push(item);
    }

    /// Answers every add whose deadline has passed with [`Error::Timeout`],
    /// and queues the retries that are due.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        while self.queue.front().is_some_and(|item| item.deadline <= now) {
            if let Some(item) = self.queue.pop_front() {
                self.answer_timeout(item);
            }
        }
        if self.queue.is_empty() {
            self.gather_since = None;
        }
        for batch in &mut self.in_flight {
            if batch
                .earliest_deadline
                .is_none_or(|earliest| earliest > now)
            {
                continue;
            }
            let mut earliest = None::<Instant>;
            for item in &mut batch.items {
                if item.waiter.is_none() {
                    continue;
                }
                if item.deadline <= now {
                    if let Some(waiter) = item.waiter.take() {
                        waiter.answer(
                            Err(Error::Timeout {
                                deadline: self.settings.deadline,
                                attempts: item.attempts,
                            }),
                            item.attempts,
                        );
                    }
                } else {
                    earliest = Some(earliest.map_or(item.deadline, |e| e.min(item.deadline)));
                }
            }
            batch.earliest_deadline = earliest;
        }
        if self.retrying.iter().any(|item| item.retry_at <= now) {
            // In order, so that a batch's adds go back in the order they had.
            for item in std::mem::take(&mut self.retrying) {
                if item.retry_at <= now {
                    self.requeue(now, item);
                } else {
                    self.retrying.push(item);
                }
            }
        }
    }

    /// Puts a retried add back in the queue, in deadline order.
    fn requeue(&mut self, now: Instant, item: Item<W>) {
        if item.deadline <= now {
            self.answer_timeout(item);
            return;
        }
        let arrived = item
            .deadline
            .checked_sub(self.settings.deadline)
            .unwrap_or(now);
        self.gather_since = Some(
            self.gather_since
                .map_or(arrived, |since| since.min(arrived)),
        );
        let position = self
            .queue
            .partition_point(|queued| queued.deadline <= item.deadline);
        self.queue.insert(position, item);
    }

    fn answer_timeout(&self, mut item: Item<W>) {
        if let Some(waiter) = item.waiter.take() {
            waiter.answer(Err(self.timeout(&item)), item.attempts);
        }
    }

    fn timeout(&self, item: &Item<W>) -> Error {
        Error::Timeout {
            deadline: self.settings.deadline,
            attempts: item.attempts,
        }
    }

    /// The next moment at which [`Batcher::handle_timeout`] and
    /// [`Batcher::poll_transmit`] have work: a deadline, the end of a gather
    /// window, or a retry falling due. `None` when nothing is pending.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let mut next = self.queue.front().map(|item| item.deadline);
        let mut consider = |at: Instant| next = Some(next.map_or(at, |n: Instant| n.min(at)));
        if !self.queue.is_empty()
            && !self.in_flight.is_empty()
            && self.in_flight.len() < self.settings.max_in_flight
            && self.queue.len() < self.settings.max_batch
        {
            if let Some(since) = self.gather_since {
                consider(since + self.settings.window);
            }
        }
        for batch in &self.in_flight {
            if let Some(earliest) = batch.earliest_deadline {
                consider(earliest);
            }
        }
        for item in &self.retrying {
            consider(item.retry_at);
        }
        next
    }

    /// Batches sent and not yet answered.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Adds queued, not yet sent (retries waiting out a backoff excluded).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;
    use crate::coalesce::wire::{encode_add, AddAnswer};
    use crate::AddOutcome;

    /// An answer, with the number of the add it answers.
    type Numbered = (usize, Result<AddOutcome, Error>);

    /// Collects answers.
    #[derive(Clone, Default)]
    struct Answers(Rc<RefCell<Vec<Numbered>>>);

    struct TestWaiter {
        number: usize,
        answers: Answers,
        closed: bool,
    }

    impl Waiter for TestWaiter {
        type Outcome = AddOutcome;
        fn is_closed(&self) -> bool {
            self.closed
        }
        fn answer(self, result: Result<AddOutcome, Error>, _attempts: u32) {
            self.answers.0.borrow_mut().push((self.number, result));
        }
    }

    const DEADLINE: Duration = Duration::from_secs(5);

    fn settings() -> BatchSettings {
        BatchSettings {
            max_batch: 4,
            max_in_flight: 2,
            window: Duration::from_micros(200),
            max_retries: 3,
            backoff: Backoff {
                base: Duration::from_millis(20),
                max: Duration::from_millis(100),
            },
            deadline: DEADLINE,
        }
    }

    struct Harness {
        batcher: Batcher<TestWaiter>,
        answers: Answers,
        start: Instant,
        submitted: usize,
    }

    impl Harness {
        fn new(settings: BatchSettings) -> Self {
            Harness {
                batcher: Batcher::new(settings),
                answers: Answers::default(),
                start: Instant::now(),
                submitted: 0,
            }
        }

        fn at(&self, micros: u64) -> Instant {
            self.start + Duration::from_micros(micros)
        }

        /// Submits add number `self.submitted` at `micros`; its idempotency
        /// key is `key-N`.
        fn submit(&mut self, micros: u64) -> usize {
            self.submit_with(micros, false)
        }

        fn submit_with(&mut self, micros: u64, closed: bool) -> usize {
            let number = self.submitted;
            self.submitted += 1;
            let now = self.at(micros);
            let body = encode_add(b"k", 1, format!("key-{number}").as_bytes(), 0);
            self.batcher.handle_submit(
                now,
                PendingAdd {
                    body,
                    waiter: TestWaiter {
                        number,
                        answers: self.answers.clone(),
                        closed,
                    },
                },
            );
            number
        }

        fn transmit(&mut self, micros: u64) -> Option<OutgoingBatch> {
            let now = self.at(micros);
            self.batcher.handle_timeout(now);
            self.batcher.poll_transmit(now)
        }

        #[track_caller]
        fn answer_count(&self) -> usize {
            self.answers.0.borrow().len()
        }

        #[track_caller]
        fn take_answers(&self) -> Vec<Numbered> {
            let mut answers = std::mem::take(&mut *self.answers.0.borrow_mut());
            answers.sort_by_key(|(number, _)| *number);
            answers
        }
    }

    /// The idempotency keys a payload carries, in order.
    #[track_caller]
    fn keys_of(batch: &OutgoingBatch) -> Vec<String> {
        use prost::Message;
        let request = tally_proto::v1::AddBatchRequest::decode(batch.payload.as_slice()).unwrap();
        assert_eq!(request.adds.len(), batch.adds);
        request
            .adds
            .into_iter()
            .map(|add| add.idempotency_key)
            .collect()
    }

    fn ok(value: i64) -> AddAnswer {
        AddAnswer::Ok(AddOutcome {
            value,
            duplicate: false,
        })
    }

    fn item_error(code: Code) -> AddAnswer {
        AddAnswer::Error {
            code: code as i32,
            message: format!("{code:?} for this item"),
        }
    }

    #[test]
    fn a_lone_add_goes_out_at_once() {
        let mut harness = Harness::new(settings());
        harness.submit(0);
        let batch = harness.transmit(0).expect("sent without waiting");
        assert_eq!(keys_of(&batch), ["key-0"]);
        assert_eq!(batch.timeout, DEADLINE);
        assert_eq!(
            harness.batcher.poll_timeout(),
            Some(harness.at(0) + DEADLINE)
        );
    }

    #[test]
    fn adds_that_arrive_while_a_batch_is_in_flight_share_the_next_one() {
        let mut harness = Harness::new(settings());
        harness.submit(0);
        let first = harness.transmit(0).unwrap();
        harness.submit(10);
        harness.submit(20);
        harness.submit(30);
        // A slot is free, but the window from the first queued add runs to 210 µs.
        assert!(harness.transmit(100).is_none());
        assert_eq!(harness.batcher.poll_timeout(), Some(harness.at(210)));
        let second = harness.transmit(210).expect("the window has passed");
        assert_eq!(keys_of(&second), ["key-1", "key-2", "key-3"]);

        // Both slots are busy now: adds gather however long it takes.
        for micros in 300..306 {
            harness.submit(micros);
        }
        assert!(harness.transmit(5_000).is_none());
        harness
            .batcher
            .handle_batch_done(harness.at(5_000), first.id, Ok(vec![ok(1)]), 0.5);
        let third = harness.transmit(5_000).expect("a slot is free");
        assert_eq!(third.adds, 4, "a full batch");
        let fourth = harness.transmit(5_000);
        assert!(fourth.is_none(), "both slots are busy again");
        assert_eq!(harness.batcher.queued(), 2);
    }

    #[test]
    fn a_full_batch_does_not_wait_for_the_window() {
        let mut harness = Harness::new(settings());
        harness.submit(0);
        harness.transmit(0).unwrap();
        for micros in 1..=4 {
            harness.submit(micros);
        }
        let batch = harness.transmit(5).expect("four adds fill a batch");
        assert_eq!(batch.adds, 4);
    }

    #[test]
    fn a_zero_window_sends_whenever_a_slot_is_free() {
        let mut harness = Harness::new(BatchSettings {
            window: Duration::ZERO,
            ..settings()
        });
        harness.submit(0);
        harness.transmit(0).unwrap();
        harness.submit(1);
        assert_eq!(harness.transmit(1).unwrap().adds, 1);
    }

    #[test]
    fn each_add_gets_its_own_result_including_a_per_item_error() {
        let mut harness = Harness::new(BatchSettings {
            max_in_flight: 1,
            ..settings()
        });
        harness.submit(0);
        let first = harness.transmit(0).unwrap();
        for micros in 1..=3 {
            harness.submit(micros);
        }
        harness
            .batcher
            .handle_batch_done(harness.at(900), first.id, Ok(vec![ok(1)]), 0.5);
        let second = harness.transmit(900).unwrap();
        assert_eq!(second.adds, 3);
        harness.batcher.handle_batch_done(
            harness.at(1_800),
            second.id,
            Ok(vec![ok(2), item_error(Code::OutOfRange), ok(3)]),
            0.5,
        );
        let answers = harness.take_answers();
        assert_eq!(answers.len(), 4);
        assert_eq!(answers[0].1.as_ref().unwrap().value, 1);
        assert_eq!(answers[1].1.as_ref().unwrap().value, 2);
        assert!(matches!(answers[2].1, Err(Error::OutOfRange(_))));
        assert_eq!(answers[3].1.as_ref().unwrap().value, 3);
        assert_eq!(harness.batcher.poll_timeout(), None, "nothing pending");
    }

    #[test]
    fn a_transient_batch_failure_resends_the_same_keys_after_a_backoff() {
        let mut harness = Harness::new(settings());
        harness.submit(0);
        let first = harness.transmit(0).unwrap();
        harness.submit(1);
        harness.submit(2);
        let second = harness.transmit(300).unwrap();
        let keys = keys_of(&second);
        harness.batcher.handle_batch_done(
            harness.at(1_000),
            second.id,
            Err(Status::unavailable("node restarting")),
            0.0,
        );
        assert_eq!(harness.answer_count(), 0, "retried, not answered");
        // Backoff with jitter 0: half of the 20 ms base.
        let due = harness.at(1_000) + Duration::from_millis(10);
        assert_eq!(harness.batcher.poll_timeout(), Some(due));
        assert!(harness.transmit(5_000).is_none());
        let retry = harness.transmit(11_000).expect("the retry is due");
        assert_eq!(keys_of(&retry), keys, "same idempotency keys");
        harness.batcher.handle_batch_done(
            harness.at(12_000),
            retry.id,
            Ok(vec![ok(7), ok(8)]),
            0.5,
        );
        harness
            .batcher
            .handle_batch_done(harness.at(12_000), first.id, Ok(vec![ok(6)]), 0.5);
        let answers = harness.take_answers();
        let values: Vec<i64> = answers
            .iter()
            .map(|(_, r)| r.as_ref().unwrap().value)
            .collect();
        assert_eq!(values, [6, 7, 8]);
    }

    #[test]
    fn a_transient_per_item_error_is_retried_and_a_permanent_one_is_not() {
        let mut harness = Harness::new(settings());
        harness.submit(0);
        harness.submit(0);
        let batch = harness.transmit(0).unwrap();
        harness.batcher.handle_batch_done(
            harness.at(500),
            batch.id,
            Ok(vec![
                item_error(Code::Unavailable),
                item_error(Code::InvalidArgument),
            ]),
            1.0,
        );
        let answers = harness.take_answers();
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].0, 1);
        assert!(matches!(answers[0].1, Err(Error::InvalidArgument(_))));
        let retry = harness.transmit(20_500).expect("retried after 20 ms");
        assert_eq!(keys_of(&retry), ["key-0"]);
    }

    #[test]
    fn retries_stop_after_max_retries() {
        let mut harness = Harness::new(BatchSettings {
            max_retries: 1,
            ..settings()
        });
        harness.submit(0);
        let mut now = 0;
        for _ in 0..2 {
            let batch = harness.transmit(now).unwrap();
            harness.batcher.handle_batch_done(
                harness.at(now),
                batch.id,
                Err(Status::unavailable("down")),
                1.0,
            );
            now += 100_000;
        }
        let answers = harness.take_answers();
        assert!(
            matches!(answers[0].1, Err(Error::Unavailable { attempts: 2, .. })),
            "{answers:?}",
            answers = answers[0].1
        );
    }

    #[test]
    fn a_permanent_batch_failure_answers_every_add_without_a_retry() {
        let mut harness = Harness::new(settings());
        harness.submit(0);
        harness.submit(0);
        let batch = harness.transmit(0).unwrap();
        harness.batcher.handle_batch_done(
            harness.at(10),
            batch.id,
            Err(Status::permission_denied("no")),
            0.5,
        );
        let answers = harness.take_answers();
        assert_eq!(answers.len(), 2);
        assert!(answers
            .iter()
            .all(|(_, r)| r.as_ref().unwrap_err().code() == Some(Code::PermissionDenied)));
        assert_eq!(harness.batcher.poll_timeout(), None);
    }

    #[test]
    fn a_wrong_number_of_results_is_a_protocol_error_for_each_add() {
        let mut harness = Harness::new(settings());
        harness.submit(0);
        harness.submit(0);
        let batch = harness.transmit(0).unwrap();
        harness
            .batcher
            .handle_batch_done(harness.at(10), batch.id, Ok(vec![ok(1)]), 0.5);
        let answers = harness.take_answers();
        assert!(answers
            .iter()
            .all(|(_, r)| matches!(r, Err(Error::Protocol(_)))));
    }

    #[test]
    fn an_add_past_its_deadline_gets_timeout_wherever_it_is() {
        let mut harness = Harness::new(BatchSettings {
            max_in_flight: 1,
            ..settings()
        });
        let deadline_us = DEADLINE.as_micros() as u64;
        harness.submit(0); // in flight, never answered
        let stuck = harness.transmit(0).unwrap();
        harness.submit(1_000); // queued behind it
        assert_eq!(
            harness.batcher.poll_timeout(),
            Some(harness.at(0) + DEADLINE)
        );
        assert!(harness.transmit(deadline_us - 1).is_none());
        assert_eq!(harness.answer_count(), 0);
        assert!(harness.transmit(deadline_us).is_none());
        let answers = harness.take_answers();
        assert_eq!(answers.len(), 1);
        assert!(matches!(
            answers[0].1,
            Err(Error::Timeout { attempts: 1, .. })
        ));
        assert!(harness.transmit(deadline_us + 1_000).is_none());
        let answers = harness.take_answers();
        assert!(matches!(
            answers[0].1,
            Err(Error::Timeout { attempts: 0, .. })
        ));
        // A late answer is ignored, and the slot is free again.
        harness.batcher.handle_batch_done(
            harness.at(deadline_us + 2_000),
            stuck.id,
            Ok(vec![ok(1)]),
            0.5,
        );
        assert_eq!(harness.answer_count(), 0);
        assert_eq!(harness.batcher.in_flight(), 0);
    }

    #[test]
    fn no_retry_is_scheduled_past_the_deadline() {
        let mut harness = Harness::new(settings());
        harness.submit(0);
        let batch = harness.transmit(0).unwrap();
        let almost = DEADLINE.as_micros() as u64 - 5_000;
        harness.batcher.handle_batch_done(
            harness.at(almost),
            batch.id,
            Err(Status::cancelled("Timeout expired")),
            0.0,
        );
        let answers = harness.take_answers();
        assert!(matches!(
            answers[0].1,
            Err(Error::Timeout { attempts: 1, .. })
        ));
    }

    #[test]
    fn adds_whose_callers_left_are_not_sent() {
        let mut harness = Harness::new(settings());
        harness.submit_with(0, true);
        harness.submit(0);
        let batch = harness.transmit(0).unwrap();
        assert_eq!(keys_of(&batch), ["key-1"]);
        harness.submit_with(1, true);
        harness
            .batcher
            .handle_batch_done(harness.at(1), batch.id, Ok(vec![ok(1)]), 0.5);
        assert!(harness.transmit(1).is_none(), "nothing left to send");
        assert_eq!(harness.batcher.queued(), 0);
    }
}
