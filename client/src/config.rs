//! How a [`Client`] connects and how patiently it calls: deadlines, retries,
//! backoff, the coalescing of adds, the optional read cache.
//!
//! A [`ClientConfig`] is a plain value built with `with_*` methods; it turns
//! into a client with [`ClientConfig::connect`] or
//! [`ClientConfig::connect_lazy`], or over a transport the caller built with
//! [`ClientConfig::build_with_channel`] / [`ClientConfig::build_with_service`].

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Endpoint;

use crate::coalesce::reads::ReadSettings;
use crate::coalesce::BatchSettings;
use crate::endpoint::{error_chain, normalize_endpoint};
use crate::retry::{Backoff, RetryPolicy};
use crate::transport::{BoxError, Transport};
use crate::types::Durability;
use crate::{Client, Error};

/// The most adds one `AddBatch` call may carry (the node's limit), and so the
/// largest [`ClientConfig::with_max_batch_size`].
pub const MAX_BATCH_SIZE: usize = 10_000;

/// Where a [`Client`] sends each key's requests in a region of several
/// nodes (a partitioned region: each key has a first owner there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Routing {
    /// The default: fetch the region's partition map on connect (and every
    /// 10 s, and at once when a node answers that it forwarded a call), and
    /// send each key's adds and reads (and each like set's or uniques key's
    /// calls; `distinct` of several keys goes to the endpoint, which asks
    /// their owners) straight to its first live owner,
    /// over a connection per node; batches, coalesced ones included, are
    /// split by owner. It takes effect only when the map shows more than
    /// one node in the region: with one node (or a node that serves no map,
    /// or refuses `Admin`), every call goes to the configured endpoint, at
    /// no extra cost. A node the client cannot connect to is left to the
    /// endpoint, which forwards. On by default because forwarding costs a
    /// hop per call and the map costs one small call every 10 s. Clients
    /// built over the caller's channel or service ([`ClientConfig::build_with_channel`],
    /// [`ClientConfig::build_with_service`]) and [`ClientConfig::connect_lazy`]
    /// do not route: they know no way to dial other nodes.
    #[default]
    Direct,
    /// Everything to the configured endpoint; a node that is not a key's
    /// first live owner forwards the request there in one hop, and its
    /// answer carries a `tally-owner` header naming the owner.
    ThroughEndpoint,
    /// Everything to the configured endpoint, served there and never
    /// forwarded (the request carries the forwarded marker): the add lands
    /// in that node's slot, and a node that does not serve the key's
    /// partition refuses it (`UNAVAILABLE`). For tests and checkers that
    /// account each add to the node it was sent to; a service has no reason
    /// to use it.
    Pinned,
}

/// Settings of a [`Client`]: the per-call deadline, the connect timeout, the
/// retry policy, the coalescing of adds and the optional read cache.
///
/// ```
/// use std::time::Duration;
/// let config = tally_client::ClientConfig::new()
///     .with_deadline(Duration::from_secs(1))
///     .with_max_retries(5)
///     .with_read_cache(500, Duration::from_secs(2));
/// assert_eq!(config.max_retries(), 5);
/// assert!(config.coalescing());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    deadline: Duration,
    connect_timeout: Duration,
    max_retries: u32,
    backoff_base: Duration,
    backoff_max: Duration,
    coalescing: bool,
    coalesce_window: Duration,
    max_batches_in_flight: usize,
    max_batch_size: usize,
    read_cache: Option<(usize, Duration)>,
    tls_ca_pem: Option<Vec<u8>>,
    token: Option<String>,
    durability: Durability,
    routing: Routing,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            deadline: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            max_retries: 3,
            backoff_base: Duration::from_millis(20),
            backoff_max: Duration::from_secs(1),
            coalescing: true,
            coalesce_window: Duration::from_micros(200),
            max_batches_in_flight: 8,
            max_batch_size: 128,
            read_cache: None,
            tls_ca_pem: None,
            token: None,
            durability: Durability::NodeDefault,
            routing: Routing::Direct,
        }
    }
}

impl ClientConfig {
    /// The defaults: a 5 s deadline per call, a 3 s connect timeout, 3
    /// retries, and a backoff starting at 20 ms, doubling, capped at 1 s;
    /// adds coalesced, with up to 8 batches of up to 128 adds in flight and
    /// a 200 µs gather window; no read cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the time one call may take, its retries and the waits between
    /// them included. Each attempt is sent with the time that remains as its
    /// gRPC timeout, so the server stops working on it too. A watch's deadline
    /// bounds only the opening of the stream.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Sets how long opening a TCP connection to the node may take.
    pub fn with_connect_timeout(mut self, connect_timeout: Duration) -> Self {
        self.connect_timeout = connect_timeout;
        self
    }

    /// Sets how many times a call that failed transiently is sent again
    /// (0 turns retries off).
    pub fn with_max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = max_retries;
        self
    }

    /// Sets how durable this client's adds must be before the node
    /// acknowledges them: the node's `--durability` by default, or
    /// [`Durability::Replicated`] for adds that must survive the loss of the
    /// taking node's disk (votes, purchases), at the cost of a round trip
    /// and a flush on a copy. The node uses the stronger of this and its own.
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// How durable this client's adds must be.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Sets the backoff's first step; the step doubles with each retry.
    pub fn with_backoff_base(mut self, backoff_base: Duration) -> Self {
        self.backoff_base = backoff_base;
        self
    }

    /// Sets the cap on the backoff's step.
    pub fn with_backoff_max(mut self, backoff_max: Duration) -> Self {
        self.backoff_max = backoff_max;
        self
    }

    /// Turns the coalescing of adds, likes and reads on (the default) or off.
    ///
    /// When on, concurrent [`Client::add`] and [`Client::add_with_key`] calls
    /// on one client (and its clones) are gathered and sent to the node as
    /// one `AddBatch` call, each add with its own idempotency key, its own
    /// answer or error, and its own deadline. An add made while no batch is
    /// in flight goes out at once; adds made while batches are in flight
    /// gather until one of the [`ClientConfig::with_max_batches_in_flight`]
    /// slots is free, for at most [`ClientConfig::with_coalesce_window`]
    /// when one is. A failure of the whole call is retried for the adds it
    /// carried, with their keys, like any call; a per-item error is retried
    /// only if its code is transient. When off, each add is its own call.
    ///
    /// The same switch coalesces [`Client::get`]: concurrent reads go out as
    /// one `GetBatch` call in which each key appears once, sent only after
    /// the reads were made (so a read still sees every add acknowledged
    /// before it). Reads with the breakdown are never coalesced.
    ///
    /// And it coalesces [`Client::like`] and [`Client::unlike`] the same way
    /// as adds, with the same settings, into `LikeBatch` calls (a second
    /// task): each like keeps its own idempotency key, answer and deadline.
    ///
    /// [`Client::get`]: crate::Client::get
    /// [`Client::like`]: crate::Client::like
    /// [`Client::unlike`]: crate::Client::unlike
    pub fn with_coalescing(mut self, coalescing: bool) -> Self {
        self.coalescing = coalescing;
        self
    }

    /// Sets how long adds may gather while a batch is in flight and another
    /// could be sent (default 200 µs; zero sends whenever a slot is free).
    /// An add made while nothing is in flight never waits for it.
    pub fn with_coalesce_window(mut self, window: Duration) -> Self {
        self.coalesce_window = window;
        self
    }

    /// Sets how many coalesced batches may be in flight at once to the node
    /// (default 8; at least 1). Several smaller batches rather than one large
    /// one let the node read one batch's cold counters while it commits
    /// another's: with 256 callers on a million keys, 8 batches of at most
    /// 128 adds took 1.05-1.2 times the adds per second of the former
    /// default (2 batches of at most 1,024) in the same runs, and no fewer on
    /// one hot key (see `docs/src/benchmarks/index.md`).
    pub fn with_max_batches_in_flight(mut self, batches: usize) -> Self {
        self.max_batches_in_flight = batches.max(1);
        self
    }

    /// Sets the most adds one coalesced batch carries (default 128; from 1
    /// to [`MAX_BATCH_SIZE`], and clamped to that range).
    pub fn with_max_batch_size(mut self, adds: usize) -> Self {
        self.max_batch_size = adds.clamp(1, MAX_BATCH_SIZE);
        self
    }

    /// Turns on a read cache of the `capacity` most recently read counters,
    /// each answered locally for `ttl` after it was fetched (off by default;
    /// a zero capacity or TTL turns it off).
    ///
    /// [`Client::get`] answers from the cache while its value is fresh. The
    /// answer to a local add updates the cached value, so a caller reads its
    /// own adds; when adds to one counter race on this client and the cache
    /// cannot tell which answer is the newer, it drops the counter and the
    /// next get asks the node. Other clients' adds show after at most `ttl`.
    /// [`Client::get_with_breakdown`] and [`Client::get_batch`] always ask the
    /// node.
    pub fn with_read_cache(mut self, capacity: usize, ttl: Duration) -> Self {
        self.read_cache = (capacity > 0 && !ttl.is_zero()).then_some((capacity, ttl));
        self
    }

    /// The time one call may take, retries included.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// How long opening a connection may take.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// How many times a transiently failed call is sent again.
    pub fn max_retries(&self) -> u32 {
        self.max_retries
    }

    /// The backoff's first step.
    pub fn backoff_base(&self) -> Duration {
        self.backoff_base
    }

    /// The cap on the backoff's step.
    pub fn backoff_max(&self) -> Duration {
        self.backoff_max
    }

    /// Whether adds are coalesced.
    pub fn coalescing(&self) -> bool {
        self.coalescing
    }

    /// How long adds may gather while a batch is in flight and a slot is free.
    pub fn coalesce_window(&self) -> Duration {
        self.coalesce_window
    }

    /// How many coalesced batches may be in flight at once.
    pub fn max_batches_in_flight(&self) -> usize {
        self.max_batches_in_flight
    }

    /// The most adds in one coalesced batch.
    pub fn max_batch_size(&self) -> usize {
        self.max_batch_size
    }

    /// Verifies `https://` nodes against this PEM CA certificate (the
    /// cluster's CA, which signs every node's certificate).
    pub fn with_tls_ca(mut self, ca_pem: impl Into<Vec<u8>>) -> Self {
        self.tls_ca_pem = Some(ca_pem.into());
        self
    }

    /// Sends `authorization: Bearer TOKEN` with every request (nodes started
    /// with `--auth-tokens` require it).
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Where each key's requests go ([`Routing`]; default
    /// [`Routing::Direct`]).
    pub fn with_routing(mut self, routing: Routing) -> Self {
        self.routing = routing;
        self
    }

    /// The routing of requests.
    pub fn routing(&self) -> Routing {
        self.routing
    }

    /// The read cache's capacity and TTL, if it is on.
    pub fn read_cache(&self) -> Option<(usize, Duration)> {
        self.read_cache
    }

    /// Connects to `endpoint` (`http://host:port`, or `host:port`) and fails
    /// at once with [`Error::Connect`] if no connection can be opened within
    /// the connect timeout. The client reconnects by itself later if the
    /// connection drops.
    pub async fn connect(&self, endpoint: impl Into<String>) -> Result<Client, Error> {
        let uri = normalize_endpoint(&endpoint.into())?;
        if self.routing != Routing::Direct {
            return self.connect_node(uri, None).await;
        }
        let stale = Arc::new(AtomicBool::new(false));
        let mut client = self.connect_node(uri.clone(), Some(stale.clone())).await?;
        let router = Arc::new(crate::routing::Router::new(self, &uri, stale));
        crate::routing::start(&router, client.admin_stub()).await;
        client.set_router(router);
        Ok(client)
    }

    /// Connects to `uri` (normalised) without routing; answers that name
    /// another owner set `hint`.
    pub(crate) async fn connect_node(
        &self,
        uri: String,
        hint: Option<Arc<AtomicBool>>,
    ) -> Result<Client, Error> {
        let channel = self
            .tonic_endpoint(&uri)?
            .connect()
            .await
            .map_err(|error| Error::Connect {
                endpoint: uri.clone(),
                message: error_chain(&error),
            })?;
        Ok(Client::from_transport(
            self.transport(channel, hint)?,
            self,
            Some(uri),
        ))
    }

    /// Makes a client for `endpoint` without connecting: the connection is
    /// opened by the first call (and a node that is down then shows up as
    /// [`Error::Unavailable`] after the retries). Fails only on an invalid
    /// endpoint. Useful when the client starts before the node.
    pub fn connect_lazy(&self, endpoint: impl Into<String>) -> Result<Client, Error> {
        let uri = normalize_endpoint(&endpoint.into())?;
        let channel = self.tonic_endpoint(&uri)?.connect_lazy();
        Ok(Client::from_transport(
            self.transport(channel, None)?,
            self,
            Some(uri),
        ))
    }

    /// Builds a client over a tonic [`Channel`] the caller configured: its
    /// own TLS (client certificates, system roots), load balancing
    /// ([`Channel::balance_list`]), connect timeout, keep-alive and so on.
    /// Nothing is connected here; the channel connects as it was told to.
    ///
    /// Everything else in this config still applies on top of the channel:
    /// the per-call deadline, retries and backoff, the coalescing of adds and
    /// reads, the read cache, and the token (added to every request when
    /// set). Its TLS CA and connect timeout do not: those are the channel's.
    /// Fails only on a token that is not printable ASCII.
    ///
    /// A channel-wide timeout (`Endpoint::timeout`) also cuts
    /// [`Client::watch`] streams; prefer this config's deadline, which each
    /// call carries as its gRPC timeout.
    ///
    /// Must be called inside a tokio runtime: the client starts its
    /// coalescing tasks on it.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tonic::transport::Endpoint;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let channel = Endpoint::from_static("http://10.0.0.1:7100")
    ///     .connect_timeout(Duration::from_secs(1))
    ///     .http2_keep_alive_interval(Duration::from_secs(20))
    ///     .connect()
    ///     .await?;
    /// let client = tally_client::ClientConfig::new()
    ///     .with_token("s3cret")
    ///     .build_with_channel(channel)?;
    /// client.add("post:42:likes", 1).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`Channel`]: tonic::transport::Channel
    /// [`Channel::balance_list`]: tonic::transport::Channel::balance_list
    pub fn build_with_channel(&self, channel: tonic::transport::Channel) -> Result<Client, Error> {
        self.build_with_service(channel)
    }

    /// Builds a client over any tower service that carries gRPC requests: a
    /// tonic [`Channel`](tonic::transport::Channel) wrapped in the caller's
    /// own layers (interceptors, metrics, rate limits, `tower::timeout`, ...),
    /// or another HTTP/2 stack whose response bodies are
    /// [`tonic::body::Body`] (wrap another body with `tonic::body::Body::new`).
    ///
    /// As with [`ClientConfig::build_with_channel`], the client's deadline,
    /// retries, coalescing, read cache and token apply on top: a retried add
    /// goes through the service again with the same idempotency key. An
    /// error of the service (not a gRPC status) reaches the client as a
    /// transport failure and is retried like a broken connection.
    ///
    /// ```no_run
    /// use tonic::transport::Endpoint;
    /// use tonic::service::interceptor::InterceptedService;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let channel = Endpoint::from_static("http://10.0.0.1:7100").connect_lazy();
    /// // The service's own interceptor: tags every call with its caller.
    /// let tagged = InterceptedService::new(channel, |mut request: tonic::Request<()>| {
    ///     request.metadata_mut().insert("x-caller", "likes-service".parse().unwrap());
    ///     Ok(request)
    /// });
    /// // InterceptedService wraps response bodies: give the client tonic's.
    /// let service = tower::ServiceExt::map_response(tagged, |response: http::Response<_>| {
    ///     response.map(tonic::body::Body::new)
    /// });
    /// let client = tally_client::ClientConfig::new().build_with_service(service)?;
    /// client.add("post:42:likes", 1).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn build_with_service<S>(&self, service: S) -> Result<Client, Error>
    where
        S: tower::Service<
                http::Request<tonic::body::Body>,
                Response = http::Response<tonic::body::Body>,
            > + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        Ok(Client::from_transport(
            self.transport(service, None)?,
            self,
            None,
        ))
    }

    /// The retry policy of every call but a watch's stream.
    pub(crate) fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_retries: self.max_retries,
            backoff: Backoff {
                base: self.backoff_base,
                max: self.backoff_max,
            },
            deadline: self.deadline,
        }
    }

    /// The batching of coalesced reads: on with the coalescing of adds, with
    /// the same batch size and number of batches in flight.
    pub(crate) fn read_settings(&self) -> Option<ReadSettings> {
        self.coalescing.then_some(ReadSettings {
            max_batch: self.max_batch_size,
            max_in_flight: self.max_batches_in_flight,
        })
    }

    /// The batching of coalesced adds, if they are coalesced.
    pub(crate) fn batch_settings(&self) -> Option<BatchSettings> {
        self.coalescing.then(|| {
            let retry = self.retry_policy();
            BatchSettings {
                max_batch: self.max_batch_size,
                max_in_flight: self.max_batches_in_flight,
                window: self.coalesce_window,
                max_retries: retry.max_retries,
                backoff: retry.backoff,
                deadline: retry.deadline,
            }
        })
    }

    /// Wraps `service` with the configured token (and the pinning marker);
    /// `hint` is set by answers that name another owner.
    fn transport<S>(&self, service: S, hint: Option<Arc<AtomicBool>>) -> Result<Transport, Error>
    where
        S: tower::Service<
                http::Request<tonic::body::Body>,
                Response = http::Response<tonic::body::Body>,
            > + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        let mut headers = http::HeaderMap::new();
        if let Some(token) = &self.token {
            let token = format!("Bearer {token}").parse().map_err(|_| {
                Error::InvalidArgument("the token must be printable ASCII".to_owned())
            })?;
            headers.insert(http::header::AUTHORIZATION, token);
        }
        if self.routing == Routing::Pinned {
            headers.insert(
                http::HeaderName::from_static("tally-forwarded"),
                http::HeaderValue::from_static("client"),
            );
        }
        Ok(Transport::new(service, headers, hint))
    }

    fn tonic_endpoint(&self, uri: &str) -> Result<Endpoint, Error> {
        let mut endpoint =
            Endpoint::from_shared(uri.to_owned()).map_err(|error| Error::InvalidEndpoint {
                endpoint: uri.to_owned(),
                reason: error_chain(&error),
            })?;
        if uri.starts_with("https://") {
            let Some(ca) = &self.tls_ca_pem else {
                return Err(Error::InvalidEndpoint {
                    endpoint: uri.to_owned(),
                    reason: "https needs the cluster's CA certificate: give --tls-ca (or ClientConfig::with_tls_ca)".to_owned(),
                });
            };
            let tls = tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca));
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|error| Error::InvalidEndpoint {
                    endpoint: uri.to_owned(),
                    reason: error_chain(&error),
                })?;
        }
        // No `Endpoint::timeout`: the deadline travels with each request as
        // its gRPC timeout, which tonic also enforces on this side, and a
        // channel-wide timeout would cut watch streams. The keep-alive pings
        // notice a dead connection under a quiet watch.
        Ok(endpoint
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let config = ClientConfig::default();
        assert_eq!(config.deadline(), Duration::from_secs(5));
        assert_eq!(config.max_retries(), 3);
        assert_eq!(config.backoff_base(), Duration::from_millis(20));
        let policy = config.retry_policy();
        assert_eq!(policy.backoff.max, Duration::from_secs(1));
        assert!(config.coalescing());
        assert_eq!(config.coalesce_window(), Duration::from_micros(200));
        assert_eq!(config.max_batches_in_flight(), 8);
        assert_eq!(config.max_batch_size(), 128);
        assert_eq!(config.read_cache(), None);
    }

    #[test]
    fn batching_knobs_stay_within_what_the_node_accepts() {
        let config = ClientConfig::new()
            .with_max_batch_size(50_000)
            .with_max_batches_in_flight(0);
        assert_eq!(config.max_batch_size(), MAX_BATCH_SIZE);
        assert_eq!(config.max_batches_in_flight(), 1);
        assert_eq!(
            ClientConfig::new().with_max_batch_size(0).max_batch_size(),
            1
        );
        let settings = config.batch_settings().unwrap();
        assert_eq!(settings.max_batch, MAX_BATCH_SIZE);
        assert_eq!(settings.max_retries, 3);
        assert!(ClientConfig::new()
            .with_coalescing(false)
            .batch_settings()
            .is_none());
    }

    #[test]
    fn a_read_cache_of_nothing_is_off() {
        let ttl = Duration::from_secs(2);
        assert_eq!(
            ClientConfig::new().with_read_cache(500, ttl).read_cache(),
            Some((500, ttl))
        );
        assert_eq!(
            ClientConfig::new().with_read_cache(0, ttl).read_cache(),
            None
        );
        assert_eq!(
            ClientConfig::new()
                .with_read_cache(500, Duration::ZERO)
                .read_cache(),
            None
        );
    }
}
