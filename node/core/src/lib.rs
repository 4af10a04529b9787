//! Tally's pure core: the state-based CRDTs of a counter ([`crdt`]: the
//! PN-counter and its folded base, the causal-length set of likes,
//! HyperLogLog of uniques), the state machines of partitioned regions
//! ([`partition`]: the key hash, cluster views, node lifecycle, routing and
//! partition handoff), the replica state machine ([`replica`]: adds, sync,
//! folds, copies, purges, idempotency, version rules) and the pure half of
//! storage ([`storage`]: the store trait, the key layout and encodings, and
//! the in-memory store), and the pure half of the node's runtime
//! ([`runtime`]: a node's lifecycle round and partition holdings, copy
//! sessions, copy plans, the fold report's gossip text).
//!
//! Nothing here does IO: no sockets, disks, clocks, threads or randomness.
//! Time and membership come in as arguments, decisions go out as values; the
//! node's runtime (`tally-node`) and the simulator (`tally-sim`) drive the
//! same code, and `tally-proto` re-exports the key hash for the client.
//!
//! The compiler keeps it pure: this crate's dependencies, direct or not, hold
//! no tokio, sled, tonic, prost, chitchat, axum or hyper, and
//! `tests/pure.rs` walks Cargo.lock to fail `cargo test` if one appears.
//! The modules form no circle: `crdt` and `partition` at the bottom,
//! `replica` on them (it defines the storage trait, [`replica::DurableState`],
//! and never calls into `storage`), `storage` and `runtime` on top;
//! `tests/module_graph.rs` fails if a `use` closes a circle.

#![deny(missing_docs)]

pub mod crdt;
pub mod partition;
pub mod replica;
pub mod runtime;
pub mod storage;
