//! A gRPC call that reaches the HTTP port (a client given the HTTP port's
//! address instead of the gRPC port's) is answered as gRPC answers an
//! unknown method: a trailers-only response, `grpc-status: 12`
//! (`UNIMPLEMENTED`), whose `grpc-message` names the node's gRPC address.
//! Without it, the client read the JSON 404 as a gRPC frame and said
//! `protocol error: received message with invalid compression flag: 123`.
//!
//! It runs before the token gate and before any body is read: the answer
//! is the same for everyone, costs nothing and holds nothing of the caller.

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::HttpState;

/// The gRPC code the answer carries: the method is not served here.
pub const GRPC_UNIMPLEMENTED: &str = "12";

/// Whether a request is a gRPC call (`application/grpc`, `+proto`, `-web`, ...).
pub fn is_grpc(request: &Request) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/grpc"))
}

/// The message of the answer: which port this is, and where gRPC is.
pub fn message(grpc_addr: &str) -> String {
    format!(
        "this is Tally's HTTP port (the JSON API, /status, /metrics), not its gRPC port: \
         send gRPC calls to {grpc_addr} (--grpc-addr, 7100 by default)"
    )
}

/// `grpc-message` is percent-encoded: every byte outside printable ASCII,
/// and `%` itself (the gRPC over HTTP/2 specification).
pub fn percent_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// The layer: a gRPC call gets the gRPC answer, anything else goes on.
pub async fn answer_grpc(State(state): State<HttpState>, request: Request, next: Next) -> Response {
    if !is_grpc(&request) {
        return next.run(request).await;
    }
    // Not counted in tally_refused_messages_total: that one is about
    // replication, and its alert would page for a client's typo.
    tracing::debug!(path = %request.uri().path(), "a gRPC call on the HTTP port");
    let mut response = StatusCode::OK.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from_static(GRPC_UNIMPLEMENTED));
    if let Ok(value) = HeaderValue::from_str(&percent_encode(&message(&state.info.grpc_addr))) {
        headers.insert("grpc-message", value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_grpc_port_and_is_a_valid_header() {
        let text = message("10.0.0.5:7100");
        assert!(text.contains("10.0.0.5:7100") && text.contains("HTTP port"));
        assert_eq!(percent_encode("a%b é"), "a%25b %C3%A9");
        assert!(HeaderValue::from_str(&percent_encode(&text)).is_ok());
    }
}
