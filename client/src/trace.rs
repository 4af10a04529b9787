//! One `tracing` span per client call, so a service's tracing pipeline
//! (logs, OpenTelemetry, ...) sees each call to Tally with its cost.
//!
//! The span is `tally.call` at INFO level, target `tally_client::trace`, with
//! the fields:
//!
//! - `operation`: `add`, `add_batch`, `get`, `get_with_breakdown`, `get_with_slots`,
//!   `get_batch`, `watch`, `ping` or `status`;
//! - `key_len`: the key's length in bytes (single-key calls), or `items`:
//!   the number of entries (batches);
//! - `attempts`: how many times the request was sent (retries included; for
//!   a coalesced add, the sends of the batches that carried it);
//! - `outcome`: `ok`, the error's kind (`invalid_argument`, `out_of_range`,
//!   `unavailable`, `timeout`, `connect`, `invalid_endpoint`, `server`,
//!   `protocol`), or `cancelled` when the caller dropped the call's future
//!   before it finished;
//! - `latency_us`: the call's duration in microseconds, retries included.
//!
//! Invariants: every call records exactly one outcome and one latency, also
//! when its future is dropped; the retry events of a call are emitted inside
//! its span. When no subscriber wants the span, nothing is timed or
//! recorded (a disabled span costs a few nanoseconds).

use std::future::Future;

use tokio::time::Instant;
use tracing::field::Empty;
use tracing::{Instrument, Span};

use crate::Error;

/// Notes on the current call's span (if any) that the request was sent for
/// the `attempts`-th time.
pub(crate) fn record_attempts(attempts: u32) {
    Span::current().record("attempts", attempts);
}

/// What a call is about, for its span.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Subject {
    /// A call on one counter, with its key's length in bytes.
    Key(usize),
    /// A batch of this many entries.
    Items(usize),
    /// A call about the node, not a counter.
    Node,
}

/// The span of one call, and what is needed to close it.
pub(crate) struct CallTrace {
    span: Span,
    /// `None` when no subscriber wants the span.
    started: Option<Instant>,
}

impl CallTrace {
    /// Opens the span of a call.
    pub(crate) fn start(operation: &'static str, subject: Subject) -> CallTrace {
        let span = tracing::info_span!(
            "tally.call",
            operation,
            key_len = Empty,
            items = Empty,
            attempts = Empty,
            outcome = Empty,
            latency_us = Empty,
        );
        if span.is_disabled() {
            return CallTrace {
                span,
                started: None,
            };
        }
        match subject {
            Subject::Key(len) => {
                span.record("key_len", len);
            }
            Subject::Items(items) => {
                span.record("items", items);
            }
            Subject::Node => {}
        }
        CallTrace {
            span,
            started: Some(Instant::now()),
        }
    }

    /// Runs `call` inside the span and records its outcome and latency.
    /// If the returned future is dropped first, the outcome is `cancelled`.
    pub(crate) async fn run<T>(
        mut self,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let result = call.instrument(self.span.clone()).await;
        self.finish(match &result {
            Ok(_) => "ok",
            Err(error) => outcome_name(error),
        });
        result
    }

    fn finish(&mut self, outcome: &'static str) {
        if let Some(started) = self.started.take() {
            let latency_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.span.record("outcome", outcome);
            self.span.record("latency_us", latency_us);
        }
    }
}

impl Drop for CallTrace {
    fn drop(&mut self) {
        // Only a call that did not finish still has its start time.
        self.finish("cancelled");
    }
}

/// The `outcome` field of a failed call.
fn outcome_name(error: &Error) -> &'static str {
    match error {
        Error::InvalidArgument(_) => "invalid_argument",
        Error::OutOfRange(_) => "out_of_range",
        Error::Unavailable { .. } => "unavailable",
        Error::Timeout { .. } => "timeout",
        Error::Connect { .. } => "connect",
        Error::InvalidEndpoint { .. } => "invalid_endpoint",
        Error::Server { .. } => "server",
        Error::Protocol(_) => "protocol",
        Error::NotGrpcPort(_) => "not_grpc_port",
    }
}
