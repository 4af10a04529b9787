//! Durable storage on sled: [`SledStore`], which implements the core's
//! [`Store`] trait, and [`FaultyStore`], a wrapper that injects faults for
//! the chaos tests. The trait, the key layout and encodings ([`encoding`],
//! [`sets`]), [`batch_ops`], recovery and the in-memory [`MemoryStore`] are
//! the pure half in `tally-core` (`tally_core::storage`), re-exported here so
//! `crate::store::...` names them all.
//!
//! A [`CommitBatch`](crate::replica::CommitBatch) is written as one batch of
//! puts and deletes that a crash leaves whole (one atomic sled batch, or,
//! from format 7 on, written key by key after the commit log holds it, the
//! log's replay completing a batch cut short). Writes become durable only at
//! [`Store::flush`] (after an `fdatasync` of sled's files: see `disk_sync`)
//! or [`Store::commit`], which the group committer ([`crate::engine`]) calls
//! once per batch (from format 7 on, one append and one `fdatasync` of the
//! commit log: see `commit_log`).

mod commit_log;
pub(crate) mod disk_sync;
mod fault;
mod sled_apply;
mod sled_store;

pub use tally_core::storage::*;

pub use fault::FaultyStore;
pub use sled_store::{
    save_partition_digests, take_saved_partition_digests, OnCorrupt, OpenError, SledStore,
    DEFAULT_CACHE_BYTES,
};

#[cfg(test)]
mod commit_log_tests;
#[cfg(test)]
mod fold_suite;
#[cfg(test)]
mod format_tests;
#[cfg(test)]
#[path = "sets_tests.rs"]
mod sets_tests;
#[cfg(test)]
mod suite;
#[cfg(test)]
#[path = "uniques_chunks_tests.rs"]
mod uniques_chunks_tests;
