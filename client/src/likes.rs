//! Like sets and uniques on [`Client`]: like, unlike, "is liked", the
//! derived count, paged listing, recount; observe and distinct estimates.
//!
//! Every like and unlike carries an idempotency key generated once per call
//! and reused by its retries, so a retried like is applied once even if an
//! unlike came in between. With coalescing on (the default), concurrent
//! likes and unlikes on one client go out together as one `LikeBatch` call
//! (one group commit on the node), each with its own key and answer. Keys and members are checked before anything is
//! sent (members: 1 to 128 bytes, at most 10,000 per call).

use std::future::Future;
use tally_proto::v1::{
    DistinctRequest, LikeCountRequest, LikeRequest, LikedRequest, ListLikesRequest, ObserveRequest,
};

use tally_proto::v1::likes_client::LikesClient;
use tonic::Response;

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

use crate::client::Client;
use crate::coalesce::like_wire::encode_like;
use crate::request::{key_bytes, new_idempotency_key, with_timeout};
use crate::trace::{CallTrace, Subject};
use crate::transport::Transport;
use crate::validate::validate_key;
use crate::Error;

/// The longest like-set or uniques member, in bytes of UTF-8.
pub const MAX_MEMBER_BYTES: usize = 128;
/// The most members one call may name.
pub const MAX_MEMBERS_PER_CALL: usize = 10_000;

/// The answer to a like or an unlike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct LikeOutcome {
    /// False when nothing changed: already liked (like), not liked (unlike).
    pub changed: bool,
    /// Whether the member is liked now.
    pub liked: bool,
    /// The like set's count on the answering node now.
    pub count: u64,
    /// True when this was a retry the node had already applied.
    pub duplicate: bool,
    /// The member's causal length on the answering node right after the
    /// operation (odd: liked; regions merge it by max); 0 for a duplicate
    /// and from a node of a build before lengths were answered.
    #[cfg_attr(feature = "serde", serde(default))]
    pub length: u64,
}

/// A page of liked members.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct LikesPage {
    /// Liked members, in member (byte) order.
    pub members: Vec<String>,
    /// Pass it to [`Client::list_likes`] for the next page; `None` after the last.
    pub next_token: Option<Vec<u8>>,
}

/// The outcome of a recount ([`Client::verify_likes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct LikesRecount {
    /// The count the node keeps.
    pub stored: u64,
    /// The count recomputed from the members.
    pub recounted: u64,
    /// Members scanned, liked or not.
    pub scanned: u64,
    /// True when both agree (false is a bug in the node).
    pub consistent: bool,
}

/// Checks a member: 1 to [`MAX_MEMBER_BYTES`] bytes (the node's words).
pub fn validate_member(member: &str) -> Result<(), Error> {
    if member.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "the member is empty; give a member of 1 to {MAX_MEMBER_BYTES} bytes"
        )));
    }
    if member.len() > MAX_MEMBER_BYTES {
        return Err(Error::InvalidArgument(format!(
            "the member is {} bytes long; the limit is {MAX_MEMBER_BYTES} bytes",
            member.len()
        )));
    }
    Ok(())
}

fn members_bytes<M: AsRef<str>>(members: &[M]) -> Result<Vec<prost::bytes::Bytes>, Error> {
    if members.len() > MAX_MEMBERS_PER_CALL {
        return Err(Error::InvalidArgument(format!(
            "{} members in one call; the limit is {MAX_MEMBERS_PER_CALL}: split the call",
            members.len()
        )));
    }
    members
        .iter()
        .map(|member| {
            validate_member(member.as_ref())?;
            Ok(key_bytes(member.as_ref()))
        })
        .collect()
}

impl Client {
    /// One call of the `Likes` service about the like set or uniques key
    /// `key` (`None`: of several keys), retried as every call is. With
    /// routing ([`crate::Routing::Direct`]) it goes to the key's owner, as
    /// an add does, and through the endpoint when the owner does not answer.
    async fn likes_call<Req, Resp, F, Fut>(
        &self,
        operation: &'static str,
        key: Option<&str>,
        request: Req,
        call: F,
    ) -> Result<Resp, Error>
    where
        Req: Clone,
        F: Fn(LikesClient<Transport>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, tonic::Status>>,
    {
        if let Some(owner) = key.and_then(|key| self.routed(key)) {
            match owner
                .likes_call_here(operation, request.clone(), &call)
                .await
            {
                Err(error) if self.node_did_not_answer(&error) => {}
                answered => return answered,
            }
        }
        self.likes_call_here(operation, request, call).await
    }

    /// [`Self::likes_call`] to this client's endpoint.
    async fn likes_call_here<Req, Resp, F, Fut>(
        &self,
        operation: &'static str,
        request: Req,
        call: F,
    ) -> Result<Resp, Error>
    where
        Req: Clone,
        F: Fn(LikesClient<Transport>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, tonic::Status>>,
    {
        self.policy()
            .run(operation, |timeout| {
                call(self.likes_stub(), with_timeout(request.clone(), timeout))
            })
            .await
            .map(Response::into_inner)
    }

    /// Likes `member` in the like set `key`. Liking an already liked member
    /// changes nothing and says so ([`LikeOutcome::changed`] false). With
    /// the node's default durability the answer comes once it is on disk.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tally_client::Error> {
    /// let client = tally_client::Client::connect("127.0.0.1:7100").await?;
    /// let outcome = client.like("post:42", "user:sam").await?;
    /// println!("liked: {}, {} likes", outcome.liked, outcome.count);
    /// assert!(client.liked("post:42", &["user:sam"]).await?[0]);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// With coalescing on (the default, [`crate::ClientConfig::with_coalescing`]),
    /// the like may travel in one `LikeBatch` call with other likes and
    /// unlikes made on this client at the same time; its answer, its error
    /// and its deadline stay its own.
    ///
    /// **Deadline:** the config's, retries included. **Cancellation:** a
    /// dropped call may still be applied, once (if it was not yet sent, it
    /// is not).
    pub async fn like(&self, key: &str, member: &str) -> Result<LikeOutcome, Error> {
        self.like_or_unlike(key, member, true).await
    }

    /// Unlikes `member`; unliking a member that is not liked changes nothing.
    ///
    /// ```no_run
    /// # async fn demo(client: tally_client::Client) -> Result<(), tally_client::Error> {
    /// let outcome = client.unlike("post:42", "user:sam").await?;
    /// assert!(!outcome.liked);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// **Deadline** and **cancellation:** as [`Client::like`].
    pub async fn unlike(&self, key: &str, member: &str) -> Result<LikeOutcome, Error> {
        self.like_or_unlike(key, member, false).await
    }

    async fn like_or_unlike(
        &self,
        key: &str,
        member: &str,
        like: bool,
    ) -> Result<LikeOutcome, Error> {
        let operation = if like { "like" } else { "unlike" };
        let idempotency_key = new_idempotency_key();
        CallTrace::start(operation, Subject::Key(key.len()))
            .run(async {
                validate_key(key)?;
                validate_member(member)?;
                self.send_like(key, member, like, idempotency_key.as_str())
                    .await
            })
            .await
    }

    /// Sends a validated like or unlike: to the set's owner with routing
    /// (through the endpoint, with the same idempotency key, when the owner
    /// does not answer), coalesced when coalescing is on.
    async fn send_like(
        &self,
        key: &str,
        member: &str,
        like: bool,
        idempotency_key: &str,
    ) -> Result<LikeOutcome, Error> {
        if let Some(owner) = self.routed(key) {
            match Box::pin(owner.send_like(key, member, like, idempotency_key)).await {
                Err(error) if self.node_did_not_answer(&error) => {}
                answered => return answered,
            }
        }
        let operation = if like { "like" } else { "unlike" };
        if let Some(coalescer) = self.like_coalescer() {
            let body = encode_like(
                key.as_bytes(),
                member.as_bytes(),
                idempotency_key.as_bytes(),
                !like,
            );
            return coalescer.submit(body).await;
        }
        let request = LikeRequest {
            key: key_bytes(key),
            member: key_bytes(member),
            idempotency_key: idempotency_key.to_owned(),
        };
        // Routed above: sent to this client's endpoint.
        let response = self
            .likes_call_here(operation, request, |mut likes, request| async move {
                match like {
                    true => likes.like(request).await,
                    false => likes.unlike(request).await,
                }
            })
            .await?;
        Ok(LikeOutcome {
            changed: response.changed,
            liked: response.liked,
            count: response.count,
            duplicate: response.duplicate,
            length: response.length,
        })
    }

    /// Whether each of `members` (up to 10,000) is liked, in order.
    ///
    /// With coalescing on (the default, [`crate::ClientConfig::with_coalescing`]),
    /// the question may travel in one `Liked` call with other callers'
    /// questions about the same like set made on this client at the same
    /// time (up to 10,000 members a call); its answers, its error and its
    /// deadline stay its own, and it sees every like answered before it.
    ///
    /// **Deadline:** as [`Client::like`]. **Cancellation:** a read; dropping changes nothing.
    pub async fn liked<M: AsRef<str>>(&self, key: &str, members: &[M]) -> Result<Vec<bool>, Error> {
        CallTrace::start("liked", Subject::Items(members.len()))
            .run(async {
                validate_key(key)?;
                let request = LikedRequest {
                    key: key_bytes(key),
                    members: members_bytes(members)?,
                };
                if let Some(owner) = self.routed(key) {
                    match Box::pin(owner.liked_here(request.clone())).await {
                        Err(error) if self.node_did_not_answer(&error) => {}
                        answered => return answered,
                    }
                }
                self.liked_here(request).await
            })
            .await
    }

    /// [`Self::liked`] to this client's endpoint, coalesced when it can be.
    async fn liked_here(&self, request: LikedRequest) -> Result<Vec<bool>, Error> {
        if let Some(coalescer) = &self.liked_coalescer {
            return self
                .policy()
                .run("liked", |timeout| {
                    coalescer.liked(request.key.clone(), request.members.clone(), timeout)
                })
                .await;
        }
        let response = self
            .likes_call_here("liked", request, |mut likes, request| async move {
                likes.liked(request).await
            })
            .await?;
        Ok(response.liked)
    }

    /// The number of liked members of `key` (derived from the members).
    ///
    /// ```no_run
    /// # async fn demo(client: tally_client::Client) -> Result<(), tally_client::Error> {
    /// println!("{} likes", client.like_count("post:42").await?);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// **Deadline** and **cancellation:** as [`Client::liked`].
    pub async fn like_count(&self, key: &str) -> Result<u64, Error> {
        CallTrace::start("like_count", Subject::Key(key.len()))
            .run(async {
                validate_key(key)?;
                let request = LikeCountRequest {
                    key: key_bytes(key),
                };
                let response = self
                    .likes_call(
                        "like_count",
                        Some(key),
                        request,
                        |mut likes, request| async move { likes.like_count(request).await },
                    )
                    .await?;
                Ok(response.count)
            })
            .await
    }

    /// One page of liked members of `key` (at most `limit`, 0 for the
    /// node's default of 1,000), after `token` (`None` for the first page).
    ///
    /// ```no_run
    /// # async fn demo(client: tally_client::Client) -> Result<(), tally_client::Error> {
    /// let mut token = None;
    /// loop {
    ///     let page = client.list_likes("post:42", token.as_deref(), 100).await?;
    ///     for member in &page.members {
    ///         println!("{member}");
    ///     }
    ///     match page.next_token {
    ///         Some(next) => token = Some(next),
    ///         None => break,
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// **Deadline** and **cancellation:** as [`Client::liked`].
    pub async fn list_likes(
        &self,
        key: &str,
        token: Option<&[u8]>,
        limit: u32,
    ) -> Result<LikesPage, Error> {
        CallTrace::start("list_likes", Subject::Key(key.len()))
            .run(async {
                validate_key(key)?;
                let request = ListLikesRequest {
                    key: key_bytes(key),
                    limit,
                    page_token: token.unwrap_or_default().to_vec().into(),
                };
                let response = self
                    .likes_call(
                        "list_likes",
                        Some(key),
                        request,
                        |mut likes, request| async move { likes.list_likes(request).await },
                    )
                    .await?;
                Ok(LikesPage {
                    members: response.members,
                    next_token: (!response.next_token.is_empty())
                        .then(|| response.next_token.to_vec()),
                })
            })
            .await
    }

    /// Recounts the like set `key` on the node from its members and
    /// compares with the count it keeps (`tally admin verify`).
    ///
    /// **Deadline** and **cancellation:** as [`Client::liked`].
    pub async fn verify_likes(&self, key: &str) -> Result<LikesRecount, Error> {
        CallTrace::start("verify_likes", Subject::Key(key.len()))
            .run(async {
                validate_key(key)?;
                let request = LikeCountRequest {
                    key: key_bytes(key),
                };
                let response = self
                    .likes_call(
                        "verify_likes",
                        Some(key),
                        request,
                        |mut likes, request| async move { likes.verify_likes(request).await },
                    )
                    .await?;
                Ok(LikesRecount {
                    stored: response.stored_count,
                    recounted: response.recounted,
                    scanned: response.members_scanned,
                    consistent: response.consistent,
                })
            })
            .await
    }

    /// Observes `members` (up to 10,000) in the uniques key `key`; returns
    /// the key's estimated distinct members after. Observing a member twice
    /// changes nothing, so a retry is harmless.
    ///
    /// ```no_run
    /// # async fn demo(client: tally_client::Client) -> Result<(), tally_client::Error> {
    /// let estimate = client.observe("video:7:viewers", &["user:sam", "user:ann"]).await?;
    /// let both = client.distinct(&["video:7:viewers", "video:8:viewers"]).await?;
    /// println!("seen by {estimate}; {both} across both videos");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// With coalescing on (the default), the members may travel in one
    /// `Observe` call with other callers' members of the same key made on
    /// this client at the same time (up to 10,000 a call); each caller gets
    /// the estimate after that call, durable as a lone observe's.
    ///
    /// **Deadline:** as [`Client::like`]. **Cancellation:** a dropped call may still be applied.
    pub async fn observe<M: AsRef<str>>(&self, key: &str, members: &[M]) -> Result<u64, Error> {
        CallTrace::start("observe", Subject::Items(members.len()))
            .run(async {
                validate_key(key)?;
                let request = ObserveRequest {
                    key: key_bytes(key),
                    members: members_bytes(members)?,
                };
                if let Some(owner) = self.routed(key) {
                    match Box::pin(owner.observe_here(request.clone())).await {
                        Err(error) if self.node_did_not_answer(&error) => {}
                        answered => return answered,
                    }
                }
                self.observe_here(request).await
            })
            .await
    }

    /// [`Self::observe`] to this client's endpoint, coalesced when it can be.
    async fn observe_here(&self, request: ObserveRequest) -> Result<u64, Error> {
        if let Some(coalescer) = &self.observe_coalescer {
            return self
                .policy()
                .run("observe", |timeout| {
                    coalescer.observe(request.key.clone(), request.members.clone(), timeout)
                })
                .await;
        }
        let response = self
            .likes_call_here("observe", request, |mut likes, request| async move {
                likes.observe(request).await
            })
            .await?;
        Ok(response.estimate)
    }

    /// The estimated number of distinct members of the union of `keys`
    /// (one key: its own estimate), as Redis `PFCOUNT k1 k2`.
    ///
    /// **Deadline** and **cancellation:** as [`Client::liked`].
    pub async fn distinct<K: AsRef<str>>(&self, keys: &[K]) -> Result<u64, Error> {
        Ok(self.distinct_with_digest(keys).await?.0)
    }

    /// [`Client::distinct`], with a stable digest of the union's registers:
    /// two nodes holding the same registers answer the same digest.
    ///
    /// **Deadline** and **cancellation:** as [`Client::liked`].
    pub async fn distinct_with_digest<K: AsRef<str>>(
        &self,
        keys: &[K],
    ) -> Result<(u64, u64), Error> {
        CallTrace::start("distinct", Subject::Items(keys.len()))
            .run(async {
                if keys.is_empty() {
                    return Err(Error::InvalidArgument("name at least one key".to_owned()));
                }
                let mut wire = Vec::with_capacity(keys.len());
                for key in keys {
                    validate_key(key.as_ref())?;
                    wire.push(key_bytes(key.as_ref()));
                }
                // One key goes to its owner; the union of several to the
                // endpoint, which asks each key's owner for its registers.
                let single = match keys {
                    [key] => Some(key.as_ref()),
                    _ => None,
                };
                let request = DistinctRequest {
                    keys: wire,
                    with_registers: false,
                };
                let response = self
                    .likes_call(
                        "distinct",
                        single,
                        request,
                        |mut likes, request| async move { likes.distinct(request).await },
                    )
                    .await?;
                Ok((response.estimate, response.registers_digest))
            })
            .await
    }
}
