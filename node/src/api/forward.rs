//! Forwarding of `Counters` and `Likes` requests to a key's first live
//! owner (issue 11, items 3 and 7; like sets and uniques since protocol
//! version 9): the runtime side of [`RouteTable`].
//!
//! A node that is not a key's first live owner in its region sends the
//! request on, in one hop, to that owner, and answers with the owner's
//! answer. What keeps it safe and bounded:
//! - **One hop.** A forwarded request carries [`FORWARDED_HEADER`] (the
//!   sender's name); its receiver serves it locally whatever its own map
//!   says. Two nodes that briefly disagree on the map cost one extra slot
//!   for the key (slots merge), never a loop.
//! - **Failover.** When the owner does not answer (no connection, or
//!   `UNAVAILABLE` that the owner's handler did not send: it marks its own
//!   answers with [`SERVED_BY_HEADER`]), the next live owner is tried, and
//!   when none answers the request is **served here** if this node serves
//!   the key's partition (the add lands in this node's slot and merges), and
//!   is refused as not served otherwise (this node holds none of it, or a
//!   copy still coming in). An answer of the owner (an error included) is
//!   passed back as it is: an owner that answered `UNAVAILABLE` ("copies
//!   missing, outcome unknown") must not be applied a second time here.
//! - **Idempotency window** (issue 11 item 6): a retry that fails over to
//!   another node is recognised as a duplicate once the first owner's
//!   idempotency record reached it (records travel with region pulls, and
//!   with replicated durability's copy pushes). An add the owner committed
//!   less than about a sync interval before it died, retried elsewhere, is
//!   applied again: the book's "Partitioned regions" concept page
//!   (`docs/src/concepts/partitioned-regions.md`) and `node/ALGORITHM.md`,
//!   "Idempotency", say more.
//! - **Streams.** `Watch` is relayed ([`super::watch_relay`]): only its
//!   opening is bounded by a deadline, and the relay follows the key to a
//!   new owner when the first one changes or its stream breaks.
//! - **Deadline and credentials.** The forwarded call carries what remains
//!   of the caller's deadline (`grpc-timeout`) and this node's peer
//!   identity: over TLS, the node's certificate (the cluster CA signs it,
//!   as for `Replication`), not the caller's token. The caller was
//!   authenticated, and its rate limit charged, here; the owner lets a
//!   forwarded request in on a cluster certificate alone
//!   ([`crate::security::AuthInterceptor`]), so a token file that differs
//!   between nodes, or a token bucket, is never consulted twice.
//! - **Channels** to peers are pooled per address, with the same dialling
//!   as anti-entropy and the copier (`channel_for`), in a pool of their
//!   own: a pull streams chunks of up to 16 MB, and a forwarded add must
//!   not queue behind one on a shared HTTP/2 connection.
//! - **The hint.** A forwarded answer carries [`OWNER_HEADER`] (the owners
//!   that served it), so a routing client knows its map is stale.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tally_proto::v1::counters_client::CountersClient;
use tally_proto::v1::likes_client::LikesClient;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

use crate::gossip::anti_entropy::{channel_for, forget_channel, AntiEntropyConfig, Channels};
use crate::gossip::lifecycle::Partitioning;
use crate::metrics::{ForwardLabels, Metrics};
use crate::partition::{Hop, Route, RouteTable};

/// Request metadata of a forwarded request: the sender's node name. Its
/// receiver serves the request here and never forwards it again.
pub const FORWARDED_HEADER: &str = "tally-forwarded";
/// Response metadata of a request this node forwarded: the names of the
/// owners that served it, comma-separated. A client that sees it sent the
/// request to a node that does not own the key (a stale map).
pub const OWNER_HEADER: &str = "tally-owner";
/// Response metadata (answers and errors) of a forwarded request: the name
/// of the node that served it, so that the forwarder tells the owner's own
/// `UNAVAILABLE` from a connection that failed.
pub const SERVED_BY_HEADER: &str = "tally-served-by";
/// The longest a forwarded call may take when the caller set no deadline.
pub const DEFAULT_FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// A client of a peer's public service, that requests are forwarded with.
pub trait PeerClient {
    /// The client over `channel`, with the node's message size limits.
    fn over(channel: Channel) -> Self;
}

impl PeerClient for CountersClient<Channel> {
    fn over(channel: Channel) -> Self {
        CountersClient::new(channel)
            .max_decoding_message_size(super::serve::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(super::serve::MAX_MESSAGE_BYTES)
    }
}

impl PeerClient for LikesClient<Channel> {
    fn over(channel: Channel) -> Self {
        LikesClient::new(channel)
            .max_decoding_message_size(super::serve::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(super::serve::MAX_MESSAGE_BYTES)
    }
}

/// What forwarding one request came to.
pub enum Forwarded<T> {
    /// An owner answered (its answer or its error), with its name.
    Answered(Result<Response<T>, Status>, String),
    /// No owner answered, or this node is the next owner: serve it here.
    ServeHere,
}

/// See the module documentation.
pub struct Forwarder {
    partitioning: Arc<Partitioning>,
    channels: Channels,
    config: AntiEntropyConfig,
    node_name: MetadataValue<tonic::metadata::Ascii>,
    metrics: Arc<Metrics>,
}

/// Whether `metadata` marks a request forwarded by another node.
pub fn is_forwarded(metadata: &MetadataMap) -> bool {
    metadata.contains_key(FORWARDED_HEADER)
}

impl Forwarder {
    /// Forwards by `partitioning`'s routes, dialling peers as `config` says
    /// (TLS with this node's certificate, source address, connect timeout).
    pub fn new(
        partitioning: Arc<Partitioning>,
        config: AntiEntropyConfig,
        metrics: Arc<Metrics>,
    ) -> Forwarder {
        let node_name = MetadataValue::try_from(partitioning.node_name())
            .unwrap_or_else(|_| MetadataValue::from_static("node"));
        Forwarder {
            partitioning,
            channels: Channels::default(),
            config,
            node_name,
            metrics,
        }
    }

    /// The routes a request with `metadata` is forwarded by: `None` when it
    /// is served here (a forwarded request, or every key is local).
    pub fn routes_for(&self, metadata: &MetadataMap) -> Option<Arc<RouteTable>> {
        // The atomic load first: one node in the region stops here.
        let routes = self.partitioning.routes()?;
        (!is_forwarded(metadata)).then_some(routes)
    }

    /// Marks the answer (or error) of a request served here for a
    /// forwarder, when `forwarded`.
    pub fn mark_served<T>(
        &self,
        forwarded: bool,
        mut result: Result<Response<T>, Status>,
    ) -> Result<Response<T>, Status> {
        if forwarded {
            let metadata = match &mut result {
                Ok(response) => response.metadata_mut(),
                Err(status) => status.metadata_mut(),
            };
            metadata.insert(SERVED_BY_HEADER, self.node_name.clone());
        }
        result
    }

    /// Sends `message` along `hops` (see the module documentation) with
    /// `call`, within `deadline`.
    pub async fn forward<C, M, T, F, Fut>(
        &self,
        method: &'static str,
        hops: &[Hop<'_>],
        message: M,
        deadline: Option<Duration>,
        call: F,
    ) -> Forwarded<T>
    where
        C: PeerClient,
        M: Clone,
        F: Fn(C, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.send(method, hops, message, deadline, true, call).await
    }

    /// Opens a server stream (`Watch`) along `hops` as [`Forwarder::forward`]
    /// sends a call, except that only its opening is bounded (by
    /// [`DEFAULT_FORWARD_TIMEOUT`]): the stream itself lasts as long as
    /// its reader wants it.
    pub async fn open_stream<C, M, T, F, Fut>(
        &self,
        method: &'static str,
        hops: &[Hop<'_>],
        message: M,
        call: F,
    ) -> Forwarded<T>
    where
        C: PeerClient,
        M: Clone,
        F: Fn(C, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.send(method, hops, message, None, false, call).await
    }

    /// [`Forwarder::forward`], with the deadline sent to the owner (as
    /// `grpc-timeout`) only when `whole_call`.
    async fn send<C, M, T, F, Fut>(
        &self,
        method: &'static str,
        hops: &[Hop<'_>],
        message: M,
        deadline: Option<Duration>,
        whole_call: bool,
        call: F,
    ) -> Forwarded<T>
    where
        C: PeerClient,
        M: Clone,
        F: Fn(C, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let deadline = tokio::time::Instant::now() + deadline.unwrap_or(DEFAULT_FORWARD_TIMEOUT);
        for (attempt, hop) in hops.iter().enumerate() {
            let node = match hop {
                Hop::Here => break,
                Hop::Node(node) => node,
            };
            let Some(channel) = channel_for(&self.channels, &node.grpc_addr, &self.config) else {
                continue;
            };
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let mut request = Request::new(message.clone());
            request
                .metadata_mut()
                .insert(FORWARDED_HEADER, self.node_name.clone());
            if whole_call {
                request.set_timeout(remaining);
            }
            let client = C::over(channel);
            let outcome = match tokio::time::timeout(remaining, call(client, request)).await {
                Err(_) => Err(Status::deadline_exceeded(format!(
                    "forwarded to {} (the key's owner), which did not answer in time; the \
                     outcome is unknown: retry with the same idempotency key",
                    node.name
                ))),
                Ok(Err(status)) if did_not_answer(&status) => {
                    tracing::debug!(owner = %node.name, %status, "owner did not answer a forwarded request; trying the next");
                    forget_channel(&self.channels, &node.grpc_addr);
                    continue;
                }
                Ok(Err(status)) if answer_lost(&status) => {
                    forget_channel(&self.channels, &node.grpc_addr);
                    Err(Status::unavailable(format!(
                        "forwarded to {} (the key's owner), whose answer was lost ({}: {}); \
                         the outcome is unknown: retry with the same idempotency key",
                        node.name,
                        status.code(),
                        status.message()
                    )))
                }
                Ok(outcome) => outcome,
            };
            self.count(
                method,
                if attempt == 0 {
                    "answered"
                } else {
                    "failed_over"
                },
            );
            return Forwarded::Answered(outcome, node.name.clone());
        }
        self.count(method, "served_here");
        Forwarded::ServeHere
    }

    fn count(&self, method: &'static str, outcome: &'static str) {
        self.metrics
            .forwarded_requests
            .get_or_create(&ForwardLabels {
                method: method.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// Serves a batch whose items may belong to different owners: each
    /// owner's items go to it in one call, all owners in parallel, the
    /// rest (and those whose owners did not answer) are served here with
    /// `here`; the answers come back in the batch's order, each item's
    /// error its own. Returns the answers and the owners that served some.
    #[allow(clippy::too_many_arguments)]
    pub async fn split_batch<C, I, R, F, Fut, H, HFut>(
        &self,
        method: &'static str,
        routes: &RouteTable,
        items: Vec<I>,
        key_of: impl Fn(&I) -> &[u8],
        deadline: Option<Duration>,
        send: F,
        here: H,
        error_item: impl Fn(Status) -> R,
    ) -> (Vec<R>, Vec<String>)
    where
        C: PeerClient,
        I: Clone,
        F: Fn(C, Request<Vec<I>>) -> Fut,
        Fut: Future<Output = Result<Response<Vec<R>>, Status>>,
        H: FnOnce(Vec<I>) -> HFut,
        HFut: Future<Output = Vec<R>>,
    {
        let count = items.len();
        let mut results: Vec<Option<R>> = (0..count).map(|_| None).collect();
        // Each item's hops; local items are served here, the rest go to
        // their first live owner.
        let (local, by_owner) =
            group_by_first_owner(routes, items.iter().enumerate(), |(_, item)| key_of(item));
        let index_of = |group: Vec<(usize, &I)>| -> Vec<usize> {
            group.into_iter().map(|(index, _)| index).collect()
        };
        let mut local = index_of(local);
        let by_owner: Vec<(Vec<Hop<'_>>, Vec<usize>)> = by_owner
            .into_iter()
            .map(|(hops, group)| (hops, index_of(group)))
            .collect();
        let send = &send;
        let items_ref = &items;
        // Items of one first owner share its whole route only when their
        // partitions do; grouping by first owner keeps one call per owner,
        // and the failover follows the first item's route (any owner of
        // the key serves it correctly: slots merge).
        let calls = by_owner.into_iter().map(|(hops, indexes)| async move {
            let batch: Vec<I> = indexes.iter().map(|i| items_ref[*i].clone()).collect();
            let forwarded = self.forward(method, &hops, batch, deadline, send).await;
            (indexes, forwarded)
        });
        let mut owners: Vec<String> = Vec::new();
        for (indexes, forwarded) in futures::future::join_all(calls).await {
            match forwarded {
                Forwarded::ServeHere => local.extend(indexes),
                Forwarded::Answered(Ok(response), owner) => {
                    let answers = response.into_inner();
                    let sent = indexes.len();
                    if answers.len() == sent {
                        for (index, answer) in indexes.into_iter().zip(answers) {
                            results[index] = Some(answer);
                        }
                    } else {
                        for index in indexes {
                            results[index] = Some(error_item(Status::internal(format!(
                                "the owner {owner} answered {} items for {sent} sent",
                                answers.len(),
                            ))));
                        }
                    }
                    owners.push(owner);
                }
                Forwarded::Answered(Err(status), owner) => {
                    for index in indexes {
                        results[index] = Some(error_item(Status::new(
                            status.code(),
                            format!("{} (forwarded to {owner})", status.message()),
                        )));
                    }
                    owners.push(owner);
                }
            }
        }
        if !local.is_empty() {
            local.sort_unstable();
            let batch: Vec<I> = local.iter().map(|i| items[*i].clone()).collect();
            for (index, answer) in local.into_iter().zip(here(batch).await) {
                results[index] = Some(answer);
            }
        }
        let results = results
            .into_iter()
            .map(|result| result.unwrap_or_else(|| error_item(Status::internal("no answer"))))
            .collect();
        (results, owners)
    }
}

/// One first owner's items, with the hops to send them along.
pub type OwnerGroup<'r, T> = (Vec<Hop<'r>>, Vec<T>);

/// Splits `items` by their key's route: those served here (this node is
/// the first live owner, or no owner is known), and per first live owner
/// its items with the first one's hops (any owner of a key serves it
/// correctly, so one call per owner follows one route).
pub fn group_by_first_owner<'r, T>(
    routes: &'r RouteTable,
    items: impl IntoIterator<Item = T>,
    key_of: impl Fn(&T) -> &[u8],
) -> (Vec<T>, Vec<OwnerGroup<'r, T>>) {
    let mut local = Vec::new();
    let mut by_owner: BTreeMap<&'r str, (Vec<Hop<'r>>, Vec<T>)> = BTreeMap::new();
    for item in items {
        match routes.route(key_of(&item)) {
            Route::Forward(hops) => match hops.first().copied() {
                Some(Hop::Node(owner)) => by_owner
                    .entry(owner.name.as_str())
                    .or_insert_with(|| (hops, Vec::new()))
                    .1
                    .push(item),
                _ => local.push(item),
            },
            Route::Local => local.push(item),
        }
    }
    (local, by_owner.into_values().collect())
}

/// Whether a forwarded call failed without the owner answering: no
/// connection, or a transport failure (tonic reports both as
/// `UNAVAILABLE`; the owner's own answers carry [`SERVED_BY_HEADER`]).
fn did_not_answer(status: &Status) -> bool {
    status.code() == Code::Unavailable && !status.metadata().contains_key(SERVED_BY_HEADER)
}

/// Whether a forwarded call failed after it was sent, without an answer of
/// the owner: the connection broke under it (tonic reports that as
/// `UNKNOWN` "transport error", or `INTERNAL` / `CANCELLED` for a reset
/// stream). The owner may have applied it, so it is neither failed over
/// nor passed back as a final error: the caller is told the outcome is
/// unknown, as `UNAVAILABLE`, which clients retry with the same key.
fn answer_lost(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unknown | Code::Internal | Code::Cancelled
    ) && !status.metadata().contains_key(SERVED_BY_HEADER)
}

/// Adds [`OWNER_HEADER`] naming `owners` to an answer this node forwarded.
pub fn hint_owners<T>(
    mut result: Result<Response<T>, Status>,
    owners: &[String],
) -> Result<Response<T>, Status> {
    if owners.is_empty() {
        return result;
    }
    let Ok(value) = MetadataValue::try_from(owners.join(",")) else {
        return result;
    };
    match &mut result {
        Ok(response) => response.metadata_mut().insert(OWNER_HEADER, value),
        Err(status) => status.metadata_mut().insert(OWNER_HEADER, value),
    };
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unavailable_the_owner_did_not_send_fails_over() {
        // A connection that failed: tonic's own UNAVAILABLE, no marker.
        assert!(did_not_answer(&Status::unavailable("tcp connect error")));
        // The owner's own UNAVAILABLE (copies missing, outcome unknown)
        // is its answer: never applied a second time elsewhere.
        let mut owners = Status::unavailable("only 1 of the 2 copies confirmed");
        owners
            .metadata_mut()
            .insert(SERVED_BY_HEADER, MetadataValue::from_static("eu-2"));
        assert!(!did_not_answer(&owners));
        assert!(!did_not_answer(&Status::invalid_argument("bad key")));
        assert!(answer_lost(&Status::unknown("transport error")));
        assert!(answer_lost(&Status::internal(
            "h2 protocol error: stream reset"
        )));
        let mut owners_own = Status::internal("storage error");
        owners_own
            .metadata_mut()
            .insert(SERVED_BY_HEADER, "eu-2".parse().unwrap());
        assert!(!answer_lost(&owners_own));
        assert!(!answer_lost(&Status::invalid_argument("bad key")));
        assert!(!answer_lost(&Status::unauthenticated("no token")));
        assert!(!did_not_answer(&Status::deadline_exceeded("late")));
    }

    #[test]
    fn a_forwarded_answer_names_its_owners() {
        let answer = hint_owners(Ok(Response::new(())), &["eu-2".into(), "eu-3".into()]).unwrap();
        assert_eq!(answer.metadata().get(OWNER_HEADER).unwrap(), "eu-2,eu-3");
        let error = hint_owners::<()>(Err(Status::internal("x")), &["eu-2".into()]).unwrap_err();
        assert_eq!(error.metadata().get(OWNER_HEADER).unwrap(), "eu-2");
        let local = hint_owners(Ok(Response::new(())), &[]).unwrap();
        assert!(local.metadata().get(OWNER_HEADER).is_none());
    }
}
