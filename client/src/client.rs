//! [`Client`]: the calls a service makes to its region's Tally node.
//!
//! Each method validates its arguments, builds its request once, and sends it
//! through the retry policy of [`crate::retry`], so every retry of an add
//! carries the idempotency key its first attempt carried. Batch calls answer
//! per item, in request order; an item that fails validation is not sent and
//! gets its error in its place.
//!
//! With coalescing on (the default), single adds go through the client's
//! coalescing task ([`crate::coalesce`]) instead, which batches concurrent
//! adds and applies the same retry rules per add. With a read cache
//! ([`crate::cache`]), `get` answers from it while fresh and every answered
//! add is reported to it.

use std::collections::HashMap;
use std::sync::Arc;

use crate::transport::Transport;
use futures::{Stream, StreamExt};
use tally_proto::v1::likes_client::LikesClient;
use tally_proto::v1::{
    add_result, admin_client::AdminClient, counters_client::CountersClient, AddBatchRequest,
    AddRequest, GetBatchRequest, GetRequest, StatusRequest, WatchRequest,
};
use tonic::{Response, Status};

use crate::cache::ReadCache;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// The health-check name of the counters service.
const COUNTERS_SERVICE: &str = "tally.v1.Counters";
use crate::coalesce::like_wire::LikeBatch;
use crate::coalesce::member_calls::{spawn_member_coalescer, MemberCall, MemberCoalescerHandle};
use crate::coalesce::reads::{spawn_read_coalescer, ReadCoalescerHandle};
use crate::coalesce::wire::encode_add;
use crate::coalesce::wire::AddBatch;
use crate::coalesce::{spawn_coalescer, CoalescerHandle};
use crate::request::{
    add_result_outcome, get_result_value, key_bytes, merge_batch, new_idempotency_key, with_timeout,
};
use crate::retry::RetryPolicy;
use crate::routing::Router;
use crate::slots::slots_from_proto;
use crate::trace::{CallTrace, Subject};
use crate::types::{counter_from_proto, status_from_proto};
use crate::validate::{validate_delta, validate_idempotency_key, validate_key};
use crate::{AddOutcome, ClientConfig, ClusterStatus, Counter, CounterSlots, Error};

/// The items of a batch for one owner (`None`: the endpoint): the owner,
/// their positions in the batch, and the items.
type OwnerGroup<I> = (Option<Client>, Vec<usize>, Vec<Result<I, Error>>);

/// A connection to one Tally node.
///
/// Cloning is cheap (the clones share one HTTP/2 connection, one coalescing
/// task and one read cache), and a `Client` can be used from many tasks at
/// once. Concurrent adds on one client are coalesced into batches
/// ([`ClientConfig::with_coalescing`]), so a busy service gets the most from
/// one client shared by all its tasks. The client's background task stops
/// when the last clone is dropped.
///
/// # Deadlines and cancellation
///
/// Every call has one deadline ([`ClientConfig::with_deadline`], 5 s by
/// default) that covers all its attempts and the waits between them; each
/// attempt carries the time that remains as its gRPC timeout, so the node
/// gives up on it too. A call that runs out of time fails with
/// [`Error::Timeout`]. To give one call less time, wrap its future in
/// `tokio::time::timeout`: dropping the future is the way to cancel a call.
///
/// What a dropped (or timed-out) call did depends on the call, and each
/// method says it. Reads change nothing. An add whose future is dropped may
/// still be applied, once: its request may already be on its way to the
/// node. The node applies an idempotency key once (for 24 h by default, per
/// node), so the safe way to retry an add whose outcome is unknown is
/// [`Client::add_with_key`] with the same key: it is counted once, however
/// many times it is sent.
///
/// # Tracing
///
/// Each call runs in a `tally.call` span (INFO level) with its `operation`,
/// `key_len` (or `items` for a batch), `attempts`, `outcome` (`ok`, the
/// error's kind, or `cancelled` when its future was dropped) and
/// `latency_us`, so a service's tracing subscriber sees every call to Tally;
/// retries log DEBUG events inside it. Filter them with the target
/// `tally_client`.
///
/// ```no_run
/// use std::time::Duration;
/// use futures::StreamExt;
/// use tally_client::{Client, ClientConfig};
///
/// # async fn demo() -> Result<(), tally_client::Error> {
/// let client = Client::connect("http://127.0.0.1:7100").await?;
///
/// // Like a post. A retried add is applied once: it keeps its idempotency key.
/// let outcome = client.add("post:42:likes", 1).await?;
/// println!("now {}", outcome.value);
///
/// // Read it back, with how fresh each region's part is.
/// let counter = client.get_with_breakdown("post:42:likes").await?;
/// for region in &counter.regions {
///     println!("{}: {} (synced {:?} ago)", region.region, region.value, region.since_last_sync);
/// }
///
/// // Follow it live.
/// let mut values = client.watch("post:42:likes").await?;
/// while let Some(value) = values.next().await {
///     println!("{}", tally_client::format_count(value?));
/// }
///
/// // A more patient client.
/// let _patient = ClientConfig::new()
///     .with_deadline(Duration::from_secs(30))
///     .with_max_retries(10)
///     .connect("127.0.0.1:7100")
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    counters: CountersClient<Transport>,
    likes: LikesClient<Transport>,
    admin: AdminClient<Transport>,
    health: HealthClient<Transport>,
    policy: RetryPolicy,
    /// `None` for a client over the caller's channel.
    endpoint: Option<Arc<str>>,
    /// `None` when adds are not coalesced.
    coalescer: Option<CoalescerHandle<AddBatch>>,
    /// `None` when likes are not coalesced (they are when adds are).
    like_coalescer: Option<CoalescerHandle<LikeBatch>>,
    /// `None` when reads are not coalesced (they are when adds are).
    read_coalescer: Option<ReadCoalescerHandle>,
    /// `None` when `liked` reads are not coalesced (they are when reads are).
    pub(crate) liked_coalescer: Option<MemberCoalescerHandle>,
    /// `None` when observes are not coalesced (they are when reads are).
    pub(crate) observe_coalescer: Option<MemberCoalescerHandle>,
    /// `None` when there is no read cache.
    read_cache: Option<Arc<ReadCache>>,
    /// The `durability` field of every add (0: the node's default).
    durability: i32,
    /// `None` unless the client routes each key to its owner
    /// ([`crate::Routing::Direct`]).
    router: Option<Arc<Router>>,
}

impl Client {
    /// Connects to the node at `endpoint` with the default [`ClientConfig`].
    ///
    /// `endpoint` is `http://host:port` or just `host:port`. Fails with
    /// [`Error::InvalidEndpoint`] if it cannot be parsed and with
    /// [`Error::Connect`] if no connection opens within the connect timeout.
    pub async fn connect(endpoint: impl Into<String>) -> Result<Client, Error> {
        ClientConfig::default().connect(endpoint).await
    }

    /// Connects nothing: builds a client with the default [`ClientConfig`]
    /// over a tonic channel the caller configured (its TLS, load balancing,
    /// timeouts); retries and coalescing apply on top. See
    /// [`ClientConfig::build_with_channel`] (which also takes a token) and
    /// [`ClientConfig::build_with_service`] (any tower service, with the
    /// caller's layers and interceptors).
    ///
    /// Must be called inside a tokio runtime.
    pub fn from_channel(channel: tonic::transport::Channel) -> Client {
        let config = ClientConfig::default();
        Client::from_transport(
            Transport::new(channel, http::HeaderMap::new(), None),
            &config,
            None,
        )
    }

    pub(crate) fn from_transport(
        channel: Transport,
        config: &ClientConfig,
        endpoint: Option<String>,
    ) -> Client {
        let coalescer = config
            .batch_settings()
            .map(|settings| spawn_coalescer(channel.clone(), settings));
        let like_coalescer = config
            .batch_settings()
            .map(|settings| spawn_coalescer(channel.clone(), settings));
        let read_coalescer = config
            .read_settings()
            .map(|settings| spawn_read_coalescer(channel.clone(), settings));
        let liked_coalescer = config
            .read_settings()
            .map(|settings| spawn_member_coalescer(channel.clone(), settings, MemberCall::Liked));
        let observe_coalescer = config
            .read_settings()
            .map(|settings| spawn_member_coalescer(channel.clone(), settings, MemberCall::Observe));
        let read_cache = config
            .read_cache()
            .map(|(capacity, ttl)| Arc::new(ReadCache::new(capacity, ttl)));
        Client {
            counters: CountersClient::new(channel.clone()),
            likes: LikesClient::new(channel.clone()),
            admin: AdminClient::new(channel.clone()),
            health: HealthClient::new(channel),
            policy: config.retry_policy(),
            endpoint: endpoint.map(Into::into),
            coalescer,
            like_coalescer,
            read_coalescer,
            liked_coalescer,
            observe_coalescer,
            read_cache,
            durability: config.durability().wire(),
            router: None,
        }
    }

    /// Routes this client's keys by `router` from now on.
    pub(crate) fn set_router(&mut self, router: Arc<Router>) {
        self.router = Some(router);
    }

    /// The active router, if any key goes elsewhere than the endpoint.
    fn active_router(&self) -> Option<&Router> {
        self.router.as_deref().filter(|router| router.is_active())
    }

    /// The client of `key`'s first owner, when it is not the endpoint's.
    pub(crate) fn routed(&self, key: &str) -> Option<Client> {
        self.router.as_ref()?.client_for(key.as_bytes())
    }

    /// Whether a call to a node failed without an answer worth keeping:
    /// it is sent again through the endpoint (which forwards or fails over).
    pub(crate) fn node_did_not_answer(&self, error: &Error) -> bool {
        let unanswered = matches!(error, Error::Unavailable { .. } | Error::Connect { .. });
        if unanswered {
            if let Some(router) = &self.router {
                router.mark_stale();
            }
        }
        unanswered
    }

    /// The retry policy of every call (`likes.rs` uses it too).
    pub(crate) fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The coalescing task of likes, when likes are coalesced.
    pub(crate) fn like_coalescer(&self) -> Option<&CoalescerHandle<LikeBatch>> {
        self.like_coalescer.as_ref()
    }

    /// A stub of the `Likes` service on this client's transport.
    pub(crate) fn likes_stub(&self) -> LikesClient<Transport> {
        self.likes.clone()
    }

    /// A stub of the `Admin` service on this client's transport.
    pub(crate) fn admin_stub(&self) -> AdminClient<Transport> {
        self.admin.clone()
    }

    /// The endpoint this client talks to, normalised (`http://host:port`),
    /// or `None` for a client built over the caller's channel or service.
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// Adds `delta` (non-zero; negative to subtract) to the counter `key`,
    /// and returns the counter's new value on the node.
    ///
    /// The add gets a fresh idempotency key (a UUID v7) that all its retries
    /// reuse, so it is applied at most once however often it is sent.
    ///
    /// With coalescing on (the default, [`ClientConfig::with_coalescing`]),
    /// the add may travel in one `AddBatch` call with other adds made on this
    /// client at the same time; its answer, its error and its deadline stay
    /// its own.
    ///
    /// **Deadline:** the config's, for all attempts; past it,
    /// [`Error::Timeout`], and the add may or may not have been applied.
    /// **Cancellation:** if the future is dropped before the add was sent
    /// (a coalesced add still waiting for its batch), it is not sent; after,
    /// it may still be applied, once. Its generated key goes with the
    /// future, so an add whose outcome must be known is made with
    /// [`Client::add_with_key`] instead.
    pub async fn add(&self, key: &str, delta: i64) -> Result<AddOutcome, Error> {
        let idempotency_key = new_idempotency_key();
        CallTrace::start("add", Subject::Key(key.len()))
            .run(self.send_add(key, delta, idempotency_key.as_str()))
            .await
    }

    /// Like [`Client::add`], with an idempotency key the caller chose (1 to
    /// 128 bytes). Sending the same key, counter and delta again (after a
    /// timeout, or from another process) is applied once; the repeat comes
    /// back with [`AddOutcome::duplicate`] set.
    ///
    /// **Deadline:** as [`Client::add`]. **Cancellation:** a dropped or
    /// timed-out call may still be applied, once; calling again with the same
    /// `idempotency_key`, counter and delta is then safe: the node counts it
    /// once (while it remembers the key: 24 h by default, on the node that
    /// took the first call) and answers with the first call's value.
    pub async fn add_with_key(
        &self,
        key: &str,
        delta: i64,
        idempotency_key: &str,
    ) -> Result<AddOutcome, Error> {
        CallTrace::start("add", Subject::Key(key.len()))
            .run(async {
                validate_idempotency_key(idempotency_key)?;
                self.send_add(key, delta, idempotency_key).await
            })
            .await
    }

    async fn send_add(
        &self,
        key: &str,
        delta: i64,
        idempotency_key: &str,
    ) -> Result<AddOutcome, Error> {
        validate_key(key)?;
        validate_delta(delta)?;
        if let Some(owner) = self.routed(key) {
            match Box::pin(owner.send_add(key, delta, idempotency_key)).await {
                Err(error) if self.node_did_not_answer(&error) => {}
                answered => return answered,
            }
        }
        // The clock is read only for the cache; the coalescing task times
        // the deadline of a coalesced add.
        let sent_at = self
            .read_cache
            .is_some()
            .then(|| tokio::time::Instant::now().into_std());
        let outcome = match &self.coalescer {
            Some(coalescer) => {
                let body = encode_add(
                    key.as_bytes(),
                    delta,
                    idempotency_key.as_bytes(),
                    self.durability,
                );
                coalescer.submit(body).await?
            }
            None => {
                let request = AddRequest {
                    key: key_bytes(key),
                    delta,
                    idempotency_key: idempotency_key.to_owned(),
                    durability: self.durability,
                };
                self.policy
                    .run("add", |timeout| {
                        let mut counters = self.counters.clone();
                        let request = with_timeout(request.clone(), timeout);
                        async move { counters.add(request).await.map(Response::into_inner) }
                    })
                    .await?
                    .into()
            }
        };
        if let (Some(cache), Some(sent_at)) = (&self.read_cache, sent_at) {
            let answered_at = tokio::time::Instant::now().into_std();
            cache.record_add(key, sent_at, answered_at, outcome);
        }
        Ok(outcome)
    }

    /// Adds to many counters in one request. Each `(key, delta)` gets its own
    /// idempotency key and its own result, in the order given.
    ///
    /// The outer `Err` is a failure of the whole request (after retries); an
    /// inner `Err` is one item's, such as [`Error::OutOfRange`]. Items are not
    /// retried one by one. The batch is sent as it is, never coalesced with
    /// other adds.
    ///
    /// **Deadline:** one for the whole batch, retries included.
    /// **Cancellation:** a dropped or timed-out batch may have been applied,
    /// in whole or in part; each add in it is applied at most once. Its
    /// generated keys go with the future: for adds whose outcome must be
    /// known, use [`Client::add_with_key`].
    pub async fn add_batch<K: AsRef<str>>(
        &self,
        adds: impl IntoIterator<Item = (K, i64)>,
    ) -> Result<Vec<Result<AddOutcome, Error>>, Error> {
        let items: Vec<Result<AddRequest, Error>> = adds
            .into_iter()
            .map(|(key, delta)| {
                let key = key.as_ref();
                validate_key(key)?;
                validate_delta(delta)?;
                Ok(AddRequest {
                    key: key_bytes(key),
                    delta,
                    idempotency_key: new_idempotency_key().as_str().to_owned(),
                    durability: self.durability,
                })
            })
            .collect();
        CallTrace::start("add_batch", Subject::Items(items.len()))
            .run(self.send_add_batch(items))
            .await
    }

    async fn send_add_batch(
        &self,
        items: Vec<Result<AddRequest, Error>>,
    ) -> Result<Vec<Result<AddOutcome, Error>>, Error> {
        if self.active_router().is_some() {
            return self
                .split_by_owner(
                    items,
                    |add| &add.key,
                    |client, items| {
                        Box::pin(async move { client.send_add_batch_here(items).await })
                    },
                )
                .await;
        }
        self.send_add_batch_here(items).await
    }

    /// Sends a batch's items in one call per owner, in parallel (items of
    /// the endpoint, and of an owner that did not answer, to the
    /// endpoint), and puts the answers back in the batch's order.
    async fn split_by_owner<I, T>(
        &self,
        items: Vec<Result<I, Error>>,
        key_of: impl Fn(&I) -> &[u8],
        send: impl Fn(
            Client,
            Vec<Result<I, Error>>,
        )
            -> futures::future::BoxFuture<'static, Result<Vec<Result<T, Error>>, Error>>,
    ) -> Result<Vec<Result<T, Error>>, Error>
    where
        I: Clone + Send + 'static,
        T: Send + 'static,
    {
        let router = self.router.as_ref().expect("an active router");
        let count = items.len();
        // Groups by owner client (None: the endpoint), in first-seen order.
        let mut groups: Vec<OwnerGroup<I>> = Vec::new();
        let mut by_endpoint: HashMap<String, usize> = HashMap::new();
        for (index, item) in items.into_iter().enumerate() {
            let owner = item
                .as_ref()
                .ok()
                .and_then(|item| router.client_for(key_of(item)));
            let name = owner
                .as_ref()
                .and_then(|client| client.endpoint())
                .unwrap_or("")
                .to_string();
            let group = *by_endpoint.entry(name).or_insert_with(|| {
                groups.push((owner, Vec::new(), Vec::new()));
                groups.len() - 1
            });
            groups[group].1.push(index);
            groups[group].2.push(item);
        }
        let calls = groups.into_iter().map(|(owner, indexes, items)| {
            let send = &send;
            async move {
                let answers = match owner {
                    Some(owner) => {
                        // Only items that passed validation have an owner.
                        let again: Vec<Result<I, Error>> = items
                            .iter()
                            .filter_map(|item| item.as_ref().ok().cloned().map(Ok))
                            .collect();
                        match send(owner, items).await {
                            Err(error) if self.node_did_not_answer(&error) => {
                                send(self.without_router(), again).await
                            }
                            answered => answered,
                        }
                    }
                    None => send(self.without_router(), items).await,
                };
                (indexes, answers)
            }
        });
        let mut results: Vec<Option<Result<T, Error>>> = (0..count).map(|_| None).collect();
        for (indexes, answers) in futures::future::join_all(calls).await {
            for (index, answer) in indexes.into_iter().zip(answers?) {
                results[index] = Some(answer);
            }
        }
        Ok(results
            .into_iter()
            .map(|result| result.unwrap_or_else(|| Err(Error::Protocol("no answer".to_owned()))))
            .collect())
    }

    /// This client, sending everything to its endpoint.
    fn without_router(&self) -> Client {
        Client {
            router: None,
            ..self.clone()
        }
    }

    async fn send_add_batch_here(
        &self,
        items: Vec<Result<AddRequest, Error>>,
    ) -> Result<Vec<Result<AddOutcome, Error>>, Error> {
        let request = AddBatchRequest {
            adds: items
                .iter()
                .filter_map(|item| item.as_ref().ok().cloned())
                .collect(),
            durability: self.durability,
        };
        if request.adds.is_empty() {
            return merge_batch(items, Vec::new(), add_result_outcome);
        }
        let sent_at = tokio::time::Instant::now().into_std();
        let response = self
            .policy
            .run("add_batch", |timeout| {
                let mut counters = self.counters.clone();
                let request = with_timeout(request.clone(), timeout);
                async move { counters.add_batch(request).await.map(Response::into_inner) }
            })
            .await?;
        if let Some(cache) = &self.read_cache {
            if response.results.len() == request.adds.len() {
                let answered_at = tokio::time::Instant::now().into_std();
                for (add, result) in request.adds.iter().zip(&response.results) {
                    if let (Some(add_result::Outcome::Ok(answer)), Ok(key)) =
                        (&result.outcome, std::str::from_utf8(&add.key))
                    {
                        cache.record_add(key, sent_at, answered_at, (*answer).into());
                    }
                }
            }
        }
        merge_batch(items, response.results, add_result_outcome)
    }

    /// Reads the counter `key` on the node: its own region's part is exact,
    /// the other regions' parts are as fresh as the last sync. A counter never
    /// written reads 0.
    ///
    /// With a read cache ([`ClientConfig::with_read_cache`]) the value may
    /// come from it, up to its TTL old (but never older than this client's
    /// own answered adds).
    ///
    /// **Deadline:** the config's, retries included. **Cancellation:**
    /// dropping the future changes nothing (a read has no effect).
    pub async fn get(&self, key: &str) -> Result<i64, Error> {
        CallTrace::start("get", Subject::Key(key.len()))
            .run(self.cached_get(key))
            .await
    }

    async fn cached_get(&self, key: &str) -> Result<i64, Error> {
        let Some(cache) = &self.read_cache else {
            return Ok(self.read(key, false).await?.value);
        };
        validate_key(key)?;
        let sent_at = tokio::time::Instant::now().into_std();
        if let Some(value) = cache.fresh(key, sent_at) {
            // An answer that never waits must still let other tasks run.
            tokio::task::consume_budget().await;
            return Ok(value);
        }
        let value = self.read(key, false).await?.value;
        cache.record_read(key, sent_at, value);
        Ok(value)
    }

    /// Reads the counter `key` with its per-region breakdown and how stale
    /// each region's part may be. Never coalesced, never cached.
    ///
    /// **Deadline** and **cancellation:** as [`Client::get`].
    pub async fn get_with_breakdown(&self, key: &str) -> Result<Counter, Error> {
        CallTrace::start("get_with_breakdown", Subject::Key(key.len()))
            .run(self.read(key, true))
            .await
    }

    /// Reads the counter `key` with one slot per live writer and its folded
    /// base (the sums of writers retired and folded), all from one state on
    /// the answering node: the value is the base plus every slot's `p - n`.
    /// Never coalesced, never cached. A node older than this call answers
    /// without slots, which is an [`Error::Protocol`].
    ///
    /// **Deadline** and **cancellation:** as [`Client::get`].
    pub async fn get_with_slots(&self, key: &str) -> Result<CounterSlots, Error> {
        CallTrace::start("get_with_slots", Subject::Key(key.len()))
            .run(async {
                validate_key(key)?;
                let request = GetRequest {
                    key: key_bytes(key),
                    slots: true,
                    ..Default::default()
                };
                slots_from_proto(key, self.send_get(request).await?)
            })
            .await
    }

    async fn read(&self, key: &str, breakdown: bool) -> Result<Counter, Error> {
        validate_key(key)?;
        if let Some(owner) = self.routed(key) {
            match Box::pin(owner.read(key, breakdown)).await {
                Err(error) if self.node_did_not_answer(&error) => {}
                answered => return answered,
            }
        }
        let request = GetRequest {
            key: key_bytes(key),
            breakdown,
            ..Default::default()
        };
        if let (Some(coalescer), false) = (&self.read_coalescer, breakdown) {
            let response = self
                .policy
                .run("get", |timeout| coalescer.get(request.key.clone(), timeout))
                .await?;
            return Ok(counter_from_proto(key, response));
        }
        Ok(counter_from_proto(key, self.send_get(request).await?))
    }

    /// Sends one `Get` through the retry policy (not coalesced).
    async fn send_get(&self, request: GetRequest) -> Result<tally_proto::v1::GetResponse, Error> {
        self.policy
            .run("get", |timeout| {
                let mut counters = self.counters.clone();
                let request = with_timeout(request.clone(), timeout);
                async move { counters.get(request).await.map(Response::into_inner) }
            })
            .await
    }

    /// Reads many counters in one request; each gets its own result, in the
    /// order given. The outer `Err` is a failure of the whole request.
    ///
    /// **Deadline** and **cancellation:** as [`Client::get`], one deadline for
    /// the whole batch.
    pub async fn get_batch<K: AsRef<str>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<Vec<Result<i64, Error>>, Error> {
        let items: Vec<Result<GetRequest, Error>> = keys
            .into_iter()
            .map(|key| {
                let key = key.as_ref();
                validate_key(key)?;
                Ok(GetRequest {
                    key: key_bytes(key),
                    ..Default::default()
                })
            })
            .collect();
        CallTrace::start("get_batch", Subject::Items(items.len()))
            .run(self.send_get_batch(items))
            .await
    }

    async fn send_get_batch(
        &self,
        items: Vec<Result<GetRequest, Error>>,
    ) -> Result<Vec<Result<i64, Error>>, Error> {
        if self.active_router().is_some() {
            return self
                .split_by_owner(
                    items,
                    |get| &get.key,
                    |client, items| {
                        Box::pin(async move { client.send_get_batch_here(items).await })
                    },
                )
                .await;
        }
        self.send_get_batch_here(items).await
    }

    async fn send_get_batch_here(
        &self,
        items: Vec<Result<GetRequest, Error>>,
    ) -> Result<Vec<Result<i64, Error>>, Error> {
        let request = GetBatchRequest {
            gets: items
                .iter()
                .filter_map(|item| item.as_ref().ok().cloned())
                .collect(),
        };
        if request.gets.is_empty() {
            return merge_batch(items, Vec::new(), get_result_value);
        }
        let response = self
            .policy
            .run("get_batch", |timeout| {
                let mut counters = self.counters.clone();
                let request = with_timeout(request.clone(), timeout);
                async move { counters.get_batch(request).await.map(Response::into_inner) }
            })
            .await?;
        merge_batch(items, response.results, get_result_value)
    }

    /// Follows the counter `key`: the stream yields its current value first,
    /// then each new value as it changes (coalesced by the server to a few
    /// updates a second).
    ///
    /// Opening the stream is retried like any call and bounded by the
    /// deadline; the stream itself has no deadline. It ends when the server
    /// ends it, or with one `Err` if the connection fails; watching again is
    /// safe, since a new stream starts with the current value.
    ///
    /// **Deadline:** bounds opening the stream only. **Cancellation:**
    /// dropping the future, or later the stream, closes the stream; the
    /// node stops sending.
    pub async fn watch(
        &self,
        key: &str,
    ) -> Result<impl Stream<Item = Result<i64, Error>> + Send + Unpin + 'static, Error> {
        CallTrace::start("watch", Subject::Key(key.len()))
            .run(self.open_watch(key))
            .await
    }

    async fn open_watch(
        &self,
        key: &str,
    ) -> Result<impl Stream<Item = Result<i64, Error>> + Send + Unpin + 'static, Error> {
        validate_key(key)?;
        let request = WatchRequest {
            key: key_bytes(key),
        };
        let events = self
            .policy
            .run("watch", |timeout| {
                let mut counters = self.counters.clone();
                // No gRPC timeout on the request: it would end the stream.
                let request = tonic::Request::new(request.clone());
                async move {
                    match tokio::time::timeout(timeout, counters.watch(request)).await {
                        Ok(opened) => opened.map(Response::into_inner),
                        Err(_elapsed) => Err(Status::deadline_exceeded(
                            "the watch stream did not open in time",
                        )),
                    }
                }
            })
            .await?;
        Ok(events.map(|event| match event {
            Ok(event) => Ok(event.value),
            Err(status) => Err(Error::from_stream_status(&status)),
        }))
    }

    /// Checks that the node serves counters: one standard gRPC health check
    /// (`grpc.health.v1.Health/Check` of `tally.v1.Counters`), retried on
    /// transient failures like any call. It is the cheapest call a node
    /// answers, so `tally bench --op ping` measures with it what one bare
    /// unary RPC costs on this connection, client and server stack.
    ///
    /// **Deadline** and **cancellation:** as [`Client::get`].
    pub async fn ping(&self) -> Result<(), Error> {
        CallTrace::start("ping", Subject::Node)
            .run(self.health_check())
            .await
    }

    async fn health_check(&self) -> Result<(), Error> {
        let response = self
            .policy
            .run("ping", |timeout| {
                let mut health = self.health.clone();
                let request = with_timeout(
                    HealthCheckRequest {
                        service: COUNTERS_SERVICE.to_owned(),
                    },
                    timeout,
                );
                async move { health.check(request).await.map(Response::into_inner) }
            })
            .await?;
        match response.status() {
            ServingStatus::Serving => Ok(()),
            status => Err(Error::Server {
                code: tonic::Code::Unavailable,
                message: format!("the node's counters service is {status:?}"),
            }),
        }
    }

    /// Asks the node for the cluster's membership, each member's digest and
    /// sync lag, and whether the cluster has converged.
    ///
    /// **Deadline** and **cancellation:** as [`Client::get`].
    pub async fn status(&self) -> Result<ClusterStatus, Error> {
        CallTrace::start("status", Subject::Node)
            .run(self.cluster_status())
            .await
    }

    async fn cluster_status(&self) -> Result<ClusterStatus, Error> {
        let response = self
            .policy
            .run("status", |timeout| {
                let mut admin = self.admin.clone();
                let request = with_timeout(StatusRequest {}, timeout);
                async move { admin.status(request).await.map(Response::into_inner) }
            })
            .await?;
        status_from_proto(response)
    }

    /// Finalizes an upgrade (`Admin.Finalize`): moves the cluster version to
    /// the newest version the node speaks. Returns the cluster version before
    /// and after. Refused (`FailedPrecondition`, naming them) while some
    /// member does not speak it yet. Safe to repeat.
    pub async fn finalize(&self) -> Result<(u32, u32), Error> {
        let response = self
            .policy
            .run("finalize", |timeout| {
                let mut admin = self.admin.clone();
                let request = with_timeout(tally_proto::v1::FinalizeRequest {}, timeout);
                async move { admin.finalize(request).await.map(Response::into_inner) }
            })
            .await?;
        Ok((response.previous_version, response.cluster_version))
    }

    /// Retires a replica (`Admin.Retire`): it never writes again, and its
    /// slots are folded into each counter's base once every member holds
    /// their final state. Returns false when it was already retired.
    /// Refused for the node's own id, an unknown id (`InvalidArgument`) and
    /// a live member (`FailedPrecondition`). Safe to repeat.
    pub async fn retire(&self, replica: u64) -> Result<bool, Error> {
        let response = self
            .policy
            .run("retire", |timeout| {
                let mut admin = self.admin.clone();
                let request = with_timeout(tally_proto::v1::RetireRequest { replica }, timeout);
                async move { admin.retire(request).await.map(Response::into_inner) }
            })
            .await?;
        Ok(response.newly_retired)
    }

    /// Opens the node's backup stream (`Admin.Backup`): a consistent
    /// snapshot of its durable state, taken while it keeps serving. The
    /// messages come as the node reads them: a header, counters, and a
    /// trailer last; a stream that ends without the trailer is incomplete.
    /// `tally admin backup` writes them to a file with
    /// [`tally_proto::backup::BackupWriter`].
    ///
    /// Opening is retried and bounded like any call; the stream has no deadline.
    pub async fn backup(
        &self,
    ) -> Result<
        impl Stream<Item = Result<tally_proto::v1::BackupChunk, Error>> + Send + Unpin + 'static,
        Error,
    > {
        let chunks = self
            .policy
            .run("backup", |timeout| {
                let mut admin = self.admin.clone();
                let request = tonic::Request::new(tally_proto::v1::BackupRequest {});
                async move {
                    match tokio::time::timeout(timeout, admin.backup(request)).await {
                        Ok(opened) => opened.map(Response::into_inner),
                        Err(_elapsed) => Err(Status::deadline_exceeded(
                            "the backup stream did not open in time",
                        )),
                    }
                }
            })
            .await?;
        Ok(chunks.map(|chunk| chunk.map_err(|status| Error::from_stream_status(&status))))
    }
}
