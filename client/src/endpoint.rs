//! Endpoint strings as a person types them, turned into the URI tonic
//! wants, with a reason a person can act on when one is unusable; and
//! transport errors flattened to one line.
//!
//! Invariant: an endpoint that gRPC would silently misuse (a path, a query,
//! a port that is not a number) is refused here, before anything connects.

use tonic::transport::Uri;

use crate::Error;

/// Turns what a person types into the URI tonic wants: `host:port` gets an
/// `http://` scheme; `http://host:port` (trailing `/` allowed) is kept.
/// `https://host:port` is kept too (TLS, verified against the configured CA).
/// A path is refused, because gRPC would ignore it.
pub(crate) fn normalize_endpoint(endpoint: &str) -> Result<String, Error> {
    let invalid = |reason: String| Error::InvalidEndpoint {
        endpoint: endpoint.to_owned(),
        reason,
    };
    let trimmed = endpoint.trim();
    if trimmed.is_empty() {
        return Err(invalid(
            "it is empty; give host:port, e.g. http://127.0.0.1:7100".to_owned(),
        ));
    }
    let authority = match trimmed.split_once("://") {
        None => trimmed,
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => {
            return normalize_authority(endpoint, rest, "https");
        }
        Some((scheme, _)) => {
            return Err(invalid(format!(
                "unsupported scheme {scheme:?}; use http://host:port"
            )))
        }
    };
    normalize_authority(endpoint, authority, "http")
}

/// Checks `authority` (host:port) and makes `SCHEME://authority` of it.
fn normalize_authority(endpoint: &str, authority: &str, scheme: &str) -> Result<String, Error> {
    let invalid = |reason: String| Error::InvalidEndpoint {
        endpoint: endpoint.to_owned(),
        reason,
    };
    let authority = authority.trim_end_matches('/');
    if authority.is_empty() {
        return Err(invalid("it names no host; use host:port".to_owned()));
    }
    let uri = format!("{scheme}://{authority}");
    let parsed: Uri = uri
        .parse()
        .map_err(|error| invalid(format!("not a valid address ({error}); use host:port")))?;
    match parsed.host() {
        Some(host) if !host.is_empty() => {}
        _ => return Err(invalid("it names no host; use host:port".to_owned())),
    }
    // http::Uri accepts any text after the host's colon; a port must be a number.
    let after_host = authority
        .rsplit_once(']')
        .map_or(authority, |(_, tail)| tail);
    if after_host.contains(':') && parsed.port_u16().is_none() {
        return Err(invalid(
            "the port is not a number from 0 to 65535; use host:port".to_owned(),
        ));
    }
    if !matches!(parsed.path(), "" | "/") || parsed.query().is_some() {
        return Err(invalid(
            "a path or query is not allowed; use http://host:port".to_owned(),
        ));
    }
    Ok(uri)
}

/// An error and its sources on one line ("transport error: tcp connect
/// error: Connection refused (os error 111)").
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        crate::error::append_unique(&mut message, &inner.to_string());
        source = inner.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn assert_normalized(input: &str, expected: &str) {
        assert_eq!(
            normalize_endpoint(input).unwrap(),
            expected,
            "input {input:?}"
        );
    }

    #[track_caller]
    fn assert_rejected(input: &str, needle: &str) {
        match normalize_endpoint(input) {
            Err(Error::InvalidEndpoint { endpoint, reason }) => {
                assert_eq!(endpoint, input);
                assert!(
                    reason.contains(needle),
                    "reason {reason:?} lacks {needle:?}"
                );
            }
            other => panic!("expected InvalidEndpoint for {input:?}, got {other:?}"),
        }
    }

    #[test]
    fn host_and_port_without_scheme_get_http() {
        assert_normalized("127.0.0.1:7100", "http://127.0.0.1:7100");
        assert_normalized("localhost:7100", "http://localhost:7100");
        assert_normalized("[::1]:7100", "http://[::1]:7100");
        assert_normalized(
            "  tally.eu-west.internal:7100 ",
            "http://tally.eu-west.internal:7100",
        );
    }

    #[test]
    fn http_endpoints_are_kept() {
        assert_normalized("http://127.0.0.1:7100", "http://127.0.0.1:7100");
        assert_normalized("http://127.0.0.1:7100/", "http://127.0.0.1:7100");
        assert_normalized("HTTP://node-1:7100", "http://node-1:7100");
    }

    #[test]
    fn unusable_endpoints_are_rejected_with_a_reason() {
        assert_rejected("", "empty");
        assert_rejected("   ", "empty");
        assert_eq!(
            normalize_endpoint("https://node:7100").unwrap(),
            "https://node:7100"
        );
        assert_rejected("ftp://node:7100", "unsupported scheme");
        assert_rejected("http://", "host");
        assert_rejected("http://node:7100/tally", "path");
        assert_rejected("node:notaport", "port is not a number");
        assert_rejected("node:70000", "port is not a number");
        assert_rejected("no de:7100", "not a valid address");
    }
}
