//! The status codes gRPC's conventions give to a request the server could
//! not read, where tonic picks others: a malformed message (bytes that are
//! not the protobuf they claim to be, invalid UTF-8 in a string, a frame cut
//! short, no message at all) is `INVALID_ARGUMENT`, not `INTERNAL`; a
//! message over the size limit is `RESOURCE_EXHAUSTED`, not `OUT_OF_RANGE`
//! (which Tally answers for a counter that would overflow).
//!
//! tonic reads a unary or server-streaming request before the handler runs,
//! and a failure there becomes a trailers-only answer: its status is in the
//! response headers. [`ClientFaultCodes`] wraps a service and corrects those
//! headers; it recognises tonic's failures by their messages (tonic is
//! pinned, and `node/tests/status_codes.rs` fails if they change). Statuses
//! that handlers return are left alone.

use std::task::{Context, Poll};

use futures::future::{MapOk, TryFutureExt};
use tonic::codegen::{http, Service};
use tonic::server::NamedService;
use tonic::Code;

/// tonic's messages for a request it could not read, and the code each gets.
const CORRECTIONS: [(Code, &str, Code); 5] = [
    (
        Code::Internal,
        "failed to decode Protobuf message",
        Code::InvalidArgument,
    ),
    (
        Code::Internal,
        "Unexpected EOF decoding stream",
        Code::InvalidArgument,
    ),
    (
        Code::Internal,
        "Missing request message",
        Code::InvalidArgument,
    ),
    (
        Code::Internal,
        "protocol error: received message with invalid compression flag",
        Code::InvalidArgument,
    ),
    (
        Code::OutOfRange,
        "Error, decoded message length too large",
        Code::ResourceExhausted,
    ),
];

/// The code a status read from an answer's headers should have had, if it
/// is one of tonic's for a request it could not read.
pub fn corrected(code: Code, message: &str) -> Option<Code> {
    CORRECTIONS
        .iter()
        .find(|(from, prefix, _)| *from == code && message.starts_with(prefix))
        .map(|(_, _, to)| *to)
}

/// Rewrites the status of a trailers-only answer when [`corrected`] says so.
fn correct<B>(mut response: http::Response<B>) -> http::Response<B> {
    let Some(status) = tonic::Status::from_header_map(response.headers()) else {
        return response;
    };
    if let Some(code) = corrected(status.code(), status.message()) {
        let fixed = tonic::Status::new(code, status.message().to_string());
        // Only fails for a message that cannot be a header, and this one
        // was read from a header.
        let _ = fixed.add_header(response.headers_mut());
    }
    response
}

/// A service whose answers to unreadable requests carry the conventional
/// codes (see the module documentation).
#[derive(Clone, Debug)]
pub struct ClientFaultCodes<S>(pub S);

impl<S: NamedService> NamedService for ClientFaultCodes<S> {
    const NAME: &'static str = S::NAME;
}

type Correct<B> = fn(http::Response<B>) -> http::Response<B>;

impl<S, Request, B> Service<Request> for ClientFaultCodes<S>
where
    S: Service<Request, Response = http::Response<B>>,
{
    type Response = http::Response<B>;
    type Error = S::Error;
    type Future = MapOk<S::Future, Correct<B>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        self.0.call(request).map_ok(correct as Correct<B>)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tonics_read_failures_are_corrected() {
        assert_eq!(
            corrected(
                Code::Internal,
                "failed to decode Protobuf message: invalid string"
            ),
            Some(Code::InvalidArgument)
        );
        assert_eq!(
            corrected(
                Code::OutOfRange,
                "Error, decoded message length too large: found 17 bytes"
            ),
            Some(Code::ResourceExhausted)
        );
        assert_eq!(
            corrected(Code::OutOfRange, "the counter would overflow"),
            None
        );
        assert_eq!(corrected(Code::Internal, "storage error: disk"), None);
    }
}
