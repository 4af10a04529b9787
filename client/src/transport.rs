//! The connection a [`crate::Client`] talks over: any gRPC-capable tower
//! service (a tonic [`Channel`](tonic::transport::Channel) the client opened
//! itself, or one the caller built with its own TLS, load balancing, layers
//! and interceptors), behind one boxed, cloneable type, with the client's
//! bearer token added to every request when one is configured.
//!
//! Invariant: everything the client sends goes through [`Transport`], so the
//! retries, coalescing and tracing of [`crate::Client`] apply whatever the
//! service underneath is.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

/// The error type of a transport: whatever the caller's service fails with.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The boxed service every generated stub of the client is built on.
#[derive(Clone)]
pub(crate) struct Transport {
    service: BoxCloneSyncService<http::Request<Body>, http::Response<Body>, BoxError>,
}

impl Transport {
    /// Wraps `service`, adding `headers` to every request (replacing any
    /// header of the same name), and setting `hint` when an answer carries
    /// the `tally-owner` header (the node forwarded the request: a routing
    /// client's map is stale).
    pub(crate) fn new<S>(
        service: S,
        headers: http::HeaderMap,
        hint: Option<Arc<AtomicBool>>,
    ) -> Transport
    where
        S: Service<http::Request<Body>, Response = http::Response<Body>>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        let service = service.map_err(Into::into);
        // One boxed layer whatever is set, as before routing: the headers
        // (none for a plain client) and the hint check (only where a
        // router listens) cost nothing when absent.
        let service = BoxCloneSyncService::new(
            service
                .map_request(move |mut request: http::Request<Body>| {
                    for (name, value) in &headers {
                        request.headers_mut().insert(name, value.clone());
                    }
                    request
                })
                .map_response(move |response: http::Response<Body>| {
                    if let Some(hint) = &hint {
                        if response
                            .headers()
                            .contains_key(crate::routing::OWNER_HEADER)
                        {
                            hint.store(true, Ordering::Release);
                        }
                    }
                    response
                }),
        );
        Transport { service }
    }
}

impl fmt::Debug for Transport {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("Transport")
    }
}

impl Service<http::Request<Body>> for Transport {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future =
        <BoxCloneSyncService<http::Request<Body>, http::Response<Body>, BoxError> as Service<
            http::Request<Body>,
        >>::Future;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.service.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        self.service.call(request)
    }
}
