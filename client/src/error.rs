//! The client's error type: one variant per thing a caller can act on.
//!
//! A gRPC status becomes an [`Error`] here and nowhere else
//! ([`Error::from_status`], [`Error::after_retries`]), and a batch item's
//! `tally.v1.Error` goes through the same mapping, so a failed add reads the
//! same whether it came alone or inside a batch.

use std::time::Duration;

use tonic::{Code, Status};

use crate::retry::{is_transient_code, is_transient_status};

/// Why a call to Tally failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request was malformed: an empty or too long key, a zero delta, a
    /// bad idempotency key. Checked by the client before sending and by the
    /// server (gRPC `INVALID_ARGUMENT`). Fix the argument; retrying won't help.
    /// Displays as the message alone, worded as the server words it (the code
    /// is [`Error::code`]).
    #[error("{0}")]
    InvalidArgument(String),

    /// The add would take the counter outside the signed 64-bit range, or a
    /// replica's slot past `u64::MAX` (gRPC `OUT_OF_RANGE`). Nothing changed.
    /// Displays as the message alone.
    #[error("{0}")]
    OutOfRange(String),

    /// The node could not be reached, or kept answering `UNAVAILABLE` (or
    /// failing its connection), through every attempt. Check that the node
    /// runs and the endpoint is right, then try again later.
    #[error("server unavailable after {attempts} attempt(s): {message}")]
    Unavailable {
        /// How many times the request was sent.
        attempts: u32,
        /// What the last attempt saw.
        message: String,
    },

    /// No answer came within the call's deadline
    /// ([`ClientConfig::with_deadline`](crate::ClientConfig::with_deadline)).
    /// An add that timed out may or may not have been applied; retrying it
    /// with the same idempotency key
    /// ([`Client::add_with_key`](crate::Client::add_with_key)) is safe.
    #[error("no answer within the {deadline:?} deadline ({attempts} attempt(s))")]
    Timeout {
        /// The deadline that passed.
        deadline: Duration,
        /// How many times the request was sent.
        attempts: u32,
    },

    /// [`Client::connect`](crate::Client::connect) could not open a connection.
    #[error("could not connect to {endpoint}: {message} (is tally-node running there?)")]
    Connect {
        /// The endpoint, as normalised (with its `http://` scheme).
        endpoint: String,
        /// Why the connection failed.
        message: String,
    },

    /// The endpoint string is not a usable `http://host:port` address.
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The server answered with any other gRPC status (for example
    /// `NOT_FOUND`, `FAILED_PRECONDITION`, `INTERNAL`, or a transient code such
    /// as `RESOURCE_EXHAUSTED` that persisted through every retry). Displays
    /// as the server's message, then the code in parentheses.
    #[error("{message} (the server answered {code:?})")]
    Server {
        /// The gRPC status code.
        code: Code,
        /// The server's message.
        message: String,
    },

    /// The endpoint answered as an HTTP server, not as gRPC: most likely it
    /// is a Tally node's HTTP port (the JSON API, 7102 by default) where its
    /// gRPC port (7100 by default) was meant. Nothing was applied; fix the
    /// endpoint. Displays what to do, then what the server said.
    #[error("this looks like Tally's HTTP port, not its gRPC port (7100 by default): give the client the node's gRPC address (its --grpc-addr) ({0})")]
    NotGrpcPort(String),

    /// The server's answer broke the protocol's contract (for example a batch
    /// answer with the wrong number of results). Likely a version mismatch
    /// between client and server.
    #[error("unexpected answer from the server: {0}")]
    Protocol(String),
}

impl Error {
    /// The gRPC status code behind this error, where there is one.
    ///
    /// [`Error::Timeout`] reports `DeadlineExceeded` and [`Error::Unavailable`]
    /// reports `Unavailable`; [`Error::Connect`], [`Error::InvalidEndpoint`] and
    /// [`Error::Protocol`] have none.
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::InvalidArgument(_) => Some(Code::InvalidArgument),
            Error::OutOfRange(_) => Some(Code::OutOfRange),
            Error::Unavailable { .. } => Some(Code::Unavailable),
            Error::Timeout { .. } => Some(Code::DeadlineExceeded),
            Error::Server { code, .. } => Some(*code),
            Error::Connect { .. }
            | Error::InvalidEndpoint { .. }
            | Error::Protocol(_)
            | Error::NotGrpcPort(_) => None,
        }
    }

    /// True when the same request may succeed if sent again later: the node
    /// was unreachable, overloaded or too slow. False when the request itself
    /// is wrong or the server refused it for good.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Unavailable { .. } | Error::Timeout { .. } | Error::Connect { .. } => true,
            Error::Server { code, .. } => is_transient_code(*code),
            Error::InvalidArgument(_)
            | Error::OutOfRange(_)
            | Error::InvalidEndpoint { .. }
            | Error::Protocol(_)
            | Error::NotGrpcPort(_) => false,
        }
    }

    /// True when a failed add may or may not have been applied: it was sent,
    /// and no answer said which (the node was unreachable partway, too slow,
    /// or answered "outcome unknown" through every retry). Sending it again
    /// with the same idempotency key is then safe, and counts it once. A
    /// refusal (bad argument, overflow, a failed precondition) and a
    /// connection that never opened are not unknown: nothing was applied.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Error::Connect { .. } | Error::InvalidEndpoint { .. } | Error::NotGrpcPort(_) => false,
            Error::Protocol(_) => true,
            Error::Server { code, .. } => {
                is_transient_code(*code) || matches!(code, Code::Unknown | Code::Internal)
            }
            error => error.is_transient(),
        }
    }

    /// Maps a status that will not be retried (a permanent code, or the first
    /// attempt's answer) to the variant a caller acts on.
    pub(crate) fn from_status(status: &Status) -> Error {
        let message = status_message(status);
        if answered_as_http(status.code(), &message) {
            return Error::NotGrpcPort(message);
        }
        Error::from_code(status.code(), message)
    }

    /// Maps a code and message (from a status or a batch item's error).
    pub(crate) fn from_code(code: Code, message: String) -> Error {
        match code {
            Code::InvalidArgument => Error::InvalidArgument(message),
            Code::OutOfRange => Error::OutOfRange(message),
            code => Error::Server { code, message },
        }
    }

    /// Maps the last status of a call that was given up on after `attempts`
    /// sends: the retries ran out, or the next wait would pass the deadline.
    pub(crate) fn after_retries(status: &Status, attempts: u32, deadline: Duration) -> Error {
        match status.code() {
            Code::Unavailable | Code::Unknown => Error::Unavailable {
                attempts,
                message: status_message(status),
            },
            Code::DeadlineExceeded | Code::Cancelled => Error::Timeout { deadline, attempts },
            _ => Error::from_status(status),
        }
    }

    /// Maps a status that ended a watch stream. A lost connection or an
    /// `UNAVAILABLE` node reads as [`Error::Unavailable`] (after the one
    /// attempt that opened the stream), so that [`Error::is_transient`] says
    /// that watching again may work.
    pub(crate) fn from_stream_status(status: &Status) -> Error {
        if is_transient_status(status) && matches!(status.code(), Code::Unavailable | Code::Unknown)
        {
            return Error::Unavailable {
                attempts: 1,
                message: status_message(status),
            };
        }
        Error::from_status(status)
    }

    /// Maps a batch item's `tally.v1.Error`.
    pub(crate) fn from_item(error: tally_proto::v1::Error) -> Error {
        Error::from_code(Code::from_i32(error.code), error.message)
    }
}

/// Whether a failed call's status says that the endpoint is no gRPC
/// server but an HTTP one: tonic reading an HTTP answer's body as a gRPC
/// frame (a JSON body's `{` is byte 123, an "invalid compression flag"), or
/// a Tally node's HTTP port answering a gRPC call with `UNIMPLEMENTED` and a
/// message naming its gRPC port. (A proxy's bare 502 is not matched: that
/// is `UNAVAILABLE`, and retried.)
fn answered_as_http(code: Code, message: &str) -> bool {
    // Only tonic's client-side wording: a Tally node answers a request it
    // cannot read with its own "invalid compression flag ... while sending
    // request" (INVALID_ARGUMENT), which is the caller's bad frame instead.
    (message.contains("invalid compression flag") && message.contains("while receiving response"))
        || (code == Code::Unimplemented && message.contains("Tally's HTTP port"))
}

/// A status's message followed by its source chain, on one line: a transport
/// failure's status says only "transport error" or "tcp connect error", and
/// the reason ("Connection refused") is in the sources.
fn status_message(status: &Status) -> String {
    let mut message = status.message().to_owned();
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        append_unique(&mut message, &error.to_string());
        source = error.source();
    }
    if message.is_empty() {
        message = format!("{:?} with no message", status.code());
    }
    message
}

/// Appends `part` after ": " unless `message` already ends with it (error
/// chains often repeat their inner message in the outer one).
pub(crate) fn append_unique(message: &mut String, part: &str) {
    let part = part.trim();
    if part.is_empty() || message.contains(part) {
        return;
    }
    if !message.is_empty() {
        message.push_str(": ");
    }
    message.push_str(part);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permanent_codes_map_to_the_variant_a_caller_acts_on() {
        let error = Error::from_status(&Status::invalid_argument("key is empty"));
        assert!(matches!(&error, Error::InvalidArgument(m) if m == "key is empty"));
        assert_eq!(error.code(), Some(Code::InvalidArgument));
        assert!(!error.is_transient());

        let error = Error::from_status(&Status::out_of_range("would overflow"));
        assert!(matches!(error, Error::OutOfRange(_)));

        let error = Error::from_status(&Status::not_found("no such thing"));
        assert_eq!(error.code(), Some(Code::NotFound));
        assert!(!error.is_transient());
    }

    #[test]
    fn given_up_transient_statuses_become_unavailable_or_timeout() {
        let deadline = Duration::from_secs(5);
        let error = Error::after_retries(&Status::unavailable("down"), 4, deadline);
        assert!(matches!(error, Error::Unavailable { attempts: 4, .. }));
        assert!(error.is_transient());

        let error = Error::after_retries(&Status::cancelled("Timeout expired"), 2, deadline);
        assert!(matches!(error, Error::Timeout { attempts: 2, .. }));
        assert_eq!(error.code(), Some(Code::DeadlineExceeded));

        let error = Error::after_retries(&Status::resource_exhausted("busy"), 4, deadline);
        assert_eq!(error.code(), Some(Code::ResourceExhausted));
        assert!(error.is_transient());
    }

    #[test]
    fn an_outcome_is_unknown_only_when_the_add_may_have_been_applied() {
        let deadline = Duration::from_secs(5);
        let unknown = [
            Error::after_retries(&Status::unavailable("copies"), 4, deadline),
            Error::after_retries(&Status::cancelled("Timeout expired"), 2, deadline),
            Error::from_status(&Status::internal("bug")),
        ];
        for error in unknown {
            assert!(error.outcome_unknown(), "{error:?}");
        }
        let known = [
            Error::from_status(&Status::invalid_argument("key is empty")),
            Error::from_status(&Status::out_of_range("would overflow")),
            Error::from_status(&Status::failed_precondition("region too small")),
            Error::Connect {
                endpoint: "http://127.0.0.1:1".into(),
                message: "refused".into(),
            },
        ];
        for error in known {
            assert!(!error.outcome_unknown(), "{error:?}");
        }
    }

    #[test]
    fn an_http_port_s_answer_says_which_port_to_use() {
        // What tonic says when it reads a JSON 404 (an HTTP port's) as gRPC.
        let garbled = Status::internal(
            "protocol error: received message with invalid compression flag: 123 (valid flags \
             are 0 and 1) while receiving response with status: 404 Not Found",
        );
        // What a Tally node's HTTP port answers a gRPC call.
        let answered = Status::unimplemented(
            "this is Tally's HTTP port (the JSON API, /status, /metrics), not its gRPC port: \
             send gRPC calls to 127.0.0.1:7100 (--grpc-addr, 7100 by default)",
        );
        for status in [garbled, answered] {
            let error = Error::from_status(&status);
            assert!(matches!(error, Error::NotGrpcPort(_)), "{error:?}");
            assert!(!error.is_transient() && !error.outcome_unknown());
            let text = error.to_string();
            assert!(
                text.starts_with(
                    "this looks like Tally's HTTP port, not its gRPC port (7100 by default)"
                ),
                "{text}"
            );
        }
        // A node refusing a garbled request is not an HTTP port.
        let refused = Error::from_status(&Status::invalid_argument(
            "protocol error: received message with invalid compression flag: 9 (valid flags are \
             0 and 1), while sending request",
        ));
        assert_eq!(refused.code(), Some(Code::InvalidArgument));
        // Another server's UNIMPLEMENTED is left as it is.
        let other = Error::from_status(&Status::unimplemented("unknown method Frobnicate"));
        assert_eq!(other.code(), Some(Code::Unimplemented));
    }

    #[test]
    fn batch_item_errors_use_the_same_mapping() {
        let item = tally_proto::v1::Error {
            code: Code::OutOfRange as i32,
            message: "counter would exceed i64::MAX".to_owned(),
        };
        assert!(matches!(Error::from_item(item), Error::OutOfRange(_)));
    }

    #[test]
    fn messages_fit_on_one_line_and_say_what_failed() {
        let error = Error::Unavailable {
            attempts: 4,
            message: "tcp connect error: Connection refused".to_owned(),
        };
        let text = error.to_string();
        assert_eq!(
            text,
            "server unavailable after 4 attempt(s): tcp connect error: Connection refused"
        );
        assert!(!text.contains('\n'));
    }

    #[test]
    fn append_unique_skips_repeated_parts() {
        let mut message = "tcp connect error".to_owned();
        append_unique(&mut message, "tcp connect error");
        append_unique(&mut message, "Connection refused (os error 111)");
        append_unique(&mut message, "Connection refused (os error 111)");
        assert_eq!(
            message,
            "tcp connect error: Connection refused (os error 111)"
        );
    }
}
