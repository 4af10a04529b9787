//! When a failed request is sent again, and how long the client waits first.
//!
//! Invariants:
//!
//! - Only transient failures are retried: `UNAVAILABLE`, `DEADLINE_EXCEEDED`,
//!   `CANCELLED` (a client-side timeout surfaces as this), `RESOURCE_EXHAUSTED`,
//!   `ABORTED`, and a connection that broke under the request. Everything else
//!   (`INVALID_ARGUMENT`, `OUT_OF_RANGE`, `FAILED_PRECONDITION`, `NOT_FOUND`,
//!   `UNAUTHENTICATED`, `PERMISSION_DENIED`, `INTERNAL`, ...) is final.
//! - A call never runs past its deadline: each attempt is sent with the time
//!   that remains as its gRPC timeout, and a wait that would end after the
//!   deadline is not started.
//! - The caller builds the request once, outside the loop, so every attempt of
//!   an add sends the same idempotency key.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tonic::{Code, Status};

use crate::Error;

/// True for the gRPC codes that say "this may work if sent again later".
pub(crate) fn is_transient_code(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::ResourceExhausted
            | Code::Aborted
    )
}

/// True when a failed attempt may be retried: a transient code, or a
/// connection failure that tonic reports as `UNKNOWN`.
pub(crate) fn is_transient_status(status: &Status) -> bool {
    is_transient_code(status.code()) || is_connection_failure(status)
}

/// A status that tonic made on this side from a transport failure (the
/// connection broke under the request) carries that failure as its source; a
/// status decoded from the server's answer has none. Only `UNKNOWN` is looked
/// at: the other codes are classified by code alone, so `INTERNAL` is never
/// retried whatever its cause.
fn is_connection_failure(status: &Status) -> bool {
    status.code() == Code::Unknown && std::error::Error::source(status).is_some()
}

/// Exponential backoff with "equal jitter": the wait before retry `n` is half
/// of `min(max, base * 2^(n-1))` plus a random part of up to the other half,
/// so retries from many clients spread out but never come back at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// The step before the first retry.
    pub(crate) base: Duration,
    /// The cap on the step.
    pub(crate) max: Duration,
}

impl Backoff {
    /// The wait before retry number `retry` (1 for the first retry), with
    /// `jitter` drawn uniformly from `[0, 1]` by the caller.
    pub(crate) fn delay(&self, retry: u32, jitter: f64) -> Duration {
        let exponent = retry.saturating_sub(1).min(30);
        let step = self.base.saturating_mul(1 << exponent).min(self.max);
        let half = step / 2;
        half + half.mul_f64(jitter.clamp(0.0, 1.0))
    }
}

/// How one logical call is attempted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RetryPolicy {
    /// Sends after the first one, at most.
    pub(crate) max_retries: u32,
    /// The waits between sends.
    pub(crate) backoff: Backoff,
    /// The time the whole call, retries and waits included, may take.
    pub(crate) deadline: Duration,
}

impl RetryPolicy {
    /// Runs `send` until it succeeds, fails for good, runs out of retries or
    /// would pass the deadline. `send` gets the time left before the deadline,
    /// to use as the attempt's gRPC timeout; it must send the same request
    /// each time.
    pub(crate) async fn run<T, F, Fut>(
        &self,
        operation: &'static str,
        mut send: F,
    ) -> Result<T, Error>
    where
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let deadline_at = Instant::now() + self.deadline;
        let mut attempts = 0;
        loop {
            let remaining = deadline_at.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(Error::Timeout {
                    deadline: self.deadline,
                    attempts,
                });
            }
            attempts += 1;
            crate::trace::record_attempts(attempts);
            let status = match send(remaining).await {
                Ok(answer) => return Ok(answer),
                Err(status) => status,
            };
            if !is_transient_status(&status) {
                return Err(Error::from_status(&status));
            }
            if attempts > self.max_retries {
                return Err(Error::after_retries(&status, attempts, self.deadline));
            }
            let delay = self.backoff.delay(attempts, crate::random::jitter());
            if Instant::now() + delay >= deadline_at {
                return Err(Error::after_retries(&status, attempts, self.deadline));
            }
            tracing::debug!(
                operation,
                attempts,
                code = ?status.code(),
                message = status.message(),
                ?delay,
                "retrying after a transient failure"
            );
            tokio::time::sleep(delay).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    const BACKOFF: Backoff = Backoff {
        base: Duration::from_millis(20),
        max: Duration::from_millis(500),
    };

    #[test]
    fn transient_codes_are_exactly_the_retryable_ones() {
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::ResourceExhausted,
            Code::Aborted,
        ] {
            assert!(is_transient_code(code), "{code:?} should be retried");
        }
        for code in [
            Code::Ok,
            Code::InvalidArgument,
            Code::OutOfRange,
            Code::FailedPrecondition,
            Code::NotFound,
            Code::AlreadyExists,
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::Internal,
            Code::Unimplemented,
            Code::DataLoss,
            Code::Unknown,
        ] {
            assert!(!is_transient_code(code), "{code:?} must not be retried");
        }
    }

    #[test]
    fn unknown_is_retried_only_when_the_connection_failed() {
        assert!(!is_transient_status(&Status::unknown("from the server")));
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let broken = Status::from_error(Box::new(io));
        assert_eq!(broken.code(), Code::Unknown);
        assert!(is_transient_status(&broken));
        // INTERNAL stays final even with a transport cause.
        let mut internal = Status::internal("h2 protocol error");
        internal.set_source(std::sync::Arc::new(std::io::Error::other("x")));
        assert!(!is_transient_status(&internal));
    }

    #[test]
    fn backoff_doubles_from_the_base_and_stops_at_the_cap() {
        assert_eq!(BACKOFF.delay(1, 0.0), Duration::from_millis(10));
        assert_eq!(BACKOFF.delay(1, 1.0), Duration::from_millis(20));
        assert_eq!(BACKOFF.delay(2, 1.0), Duration::from_millis(40));
        assert_eq!(BACKOFF.delay(3, 1.0), Duration::from_millis(80));
        assert_eq!(BACKOFF.delay(10, 1.0), Duration::from_millis(500));
        assert_eq!(BACKOFF.delay(u32::MAX, 0.5), Duration::from_millis(375));
    }

    #[test]
    fn backoff_jitter_stays_within_half_a_step() {
        for jitter in [0.0, 0.25, 0.5, 0.99, 1.0, -3.0, 7.0] {
            let delay = BACKOFF.delay(3, jitter);
            assert!(delay >= Duration::from_millis(40) && delay <= Duration::from_millis(80));
        }
    }

    fn policy(max_retries: u32, deadline: Duration) -> RetryPolicy {
        RetryPolicy {
            max_retries,
            backoff: Backoff {
                base: Duration::from_millis(1),
                max: Duration::from_millis(2),
            },
            deadline,
        }
    }

    #[tokio::test]
    async fn transient_failures_are_retried_until_success() {
        let sends = AtomicU32::new(0);
        let answer = policy(3, Duration::from_secs(5))
            .run("test", |_| async {
                match sends.fetch_add(1, Ordering::SeqCst) {
                    0 | 1 => Err(Status::unavailable("starting")),
                    _ => Ok(7),
                }
            })
            .await;
        assert_eq!(answer.unwrap(), 7);
        assert_eq!(sends.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn retries_stop_after_max_retries() {
        let sends = AtomicU32::new(0);
        let answer: Result<(), _> = policy(2, Duration::from_secs(5))
            .run("test", |_| async {
                sends.fetch_add(1, Ordering::SeqCst);
                Err(Status::unavailable("down"))
            })
            .await;
        assert!(matches!(
            answer,
            Err(Error::Unavailable { attempts: 3, .. })
        ));
        assert_eq!(sends.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn permanent_failures_are_not_retried() {
        let sends = AtomicU32::new(0);
        let answer: Result<(), _> = policy(3, Duration::from_secs(5))
            .run("test", |_| async {
                sends.fetch_add(1, Ordering::SeqCst);
                Err(Status::failed_precondition("no"))
            })
            .await;
        assert_eq!(answer.unwrap_err().code(), Some(Code::FailedPrecondition));
        assert_eq!(sends.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn no_attempt_starts_after_the_deadline() {
        let sends = AtomicU32::new(0);
        let answer: Result<(), _> = policy(1000, Duration::from_millis(50))
            .run("test", |timeout| {
                sends.fetch_add(1, Ordering::SeqCst);
                async move {
                    tokio::time::sleep(timeout).await;
                    Err(Status::cancelled("Timeout expired"))
                }
            })
            .await;
        assert!(matches!(answer, Err(Error::Timeout { attempts: 1, .. })));
        assert_eq!(sends.load(Ordering::SeqCst), 1);
    }
}
