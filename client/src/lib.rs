//! The Rust client library for Tally, the geo-replicated counter service.
//!
//! A [`Client`] talks gRPC to one Tally region node (normally the one in the
//! caller's own region). It adds to counters, reads them (optionally with their
//! per-region breakdown), watches them change, and asks a node for the
//! cluster's membership.
//!
//! What the client guarantees:
//!
//! - Every add carries an idempotency key (a UUID v7, or one the caller gives)
//!   that is generated once per logical add and reused by all of its retries,
//!   so a retried add is applied at most once (DESIGN.md, invariant 5).
//! - Only transient failures are retried (see [`Error::is_transient`]), with
//!   exponential backoff and jitter, and never past the call's deadline
//!   ([`ClientConfig`]).
//! - Keys and deltas are checked before anything is sent; a bad one fails with
//!   [`Error::InvalidArgument`] and a message that says what to fix.
//! - Concurrent adds on one client are coalesced into `AddBatch` calls (on by
//!   default, [`ClientConfig::with_coalescing`]); each keeps its idempotency
//!   key, its deadline and its own answer, and an add made while the client
//!   is idle goes out at once.
//! - An optional read cache ([`ClientConfig::with_read_cache`]) answers gets
//!   of hot counters locally for a short TTL, and shows a client its own
//!   answered adds.
//!
//! - A client can run over the caller's own transport: a tonic channel with
//!   its TLS, load balancing and timeouts
//!   ([`ClientConfig::build_with_channel`]), or any tower service with the
//!   caller's layers and interceptors ([`ClientConfig::build_with_service`]);
//!   the guarantees above hold on top of it.
//! - Every call runs in a `tally.call` tracing span (operation, key length,
//!   attempts, outcome, latency). Each method of [`Client`] says what its
//!   deadline covers and what dropping its future does.
//!
//! Like sets and uniques: [`Client::like`], [`Client::unlike`],
//! [`Client::liked`], [`Client::like_count`], [`Client::list_likes`],
//! [`Client::observe`] and [`Client::distinct`] (see `likes.rs`).
//!
//! [`format_count`] renders a count the way a page shows it ("40.2K").
//!
//! Features: `serde` (off by default) derives `Serialize`/`Deserialize` for
//! the values the client returns. The crate depends on no command-line,
//! benchmark or server crate; the `tally` command line is the `tally-cli`
//! crate. Runnable examples are in `examples/` (an idempotent add with
//! retries, a watch rendering "40.2K", a batch, TLS with a token).
//!
//! ```no_run
//! # async fn demo() -> Result<(), tally_client::Error> {
//! let client = tally_client::Client::connect("127.0.0.1:7100").await?;
//! let outcome = client.add("post:42:likes", 1).await?;
//! println!("{} likes", tally_client::format_count(outcome.value));
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

mod cache;
mod client;
mod coalesce;
mod config;
mod endpoint;
mod error;
mod format;
mod likes;
mod partitions;
mod random;
mod request;
mod retry;
mod routing;
mod slots;
mod trace;
mod transport;
mod types;
mod validate;

pub use client::Client;
pub use config::{ClientConfig, Routing, MAX_BATCH_SIZE};
pub use error::Error;
pub use format::format_count;
pub use likes::{
    validate_member, LikeOutcome, LikesPage, LikesRecount, MAX_MEMBERS_PER_CALL, MAX_MEMBER_BYTES,
};
pub use partitions::{PartitionMap, PartitionNode};
pub use slots::{CounterSlots, FoldedSums, WriterSlot};
pub use types::{
    AddOutcome, ClusterStatus, Counter, Durability, HotKey, Member, RegionValue, RetiredWriter,
};
pub use validate::{validate_key, MAX_IDEMPOTENCY_KEY_BYTES, MAX_KEY_BYTES};

/// A fresh idempotency key, as [`Client::add`] makes for each add: a UUID
/// v7 (36 characters), unique for all practical purposes. A caller that must
/// be able to retry an add whose outcome it did not learn makes one, keeps
/// it, and sends it with [`Client::add_with_key`] (the `tally` CLI does so
/// for every add, and prints it when it gives up).
pub fn new_idempotency_key() -> String {
    request::new_idempotency_key().as_str().to_owned()
}

/// The gRPC status code carried by [`Error::code`], re-exported from tonic so
/// that callers need not depend on tonic themselves.
pub use tonic::Code;
