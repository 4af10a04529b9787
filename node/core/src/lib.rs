//! Tally's pure core: the state-based CRDTs of a counter ([`crdt`]: the
//! PN-counter and its folded base, the causal-length set of likes,
//! HyperLogLog of uniques) and the state machines of partitioned regions
//! ([`partition`]: the key hash, cluster views, node lifecycle, routing and
//! partition handoff).
//!
//! Nothing here does IO: no sockets, disks, clocks, threads or randomness.
//! Time and membership come in as arguments, decisions go out as values; the
//! node's runtime (`tally-node`) and the simulator (`tally-sim`) drive the
//! same code, and `tally-proto` re-exports the key hash for the client.
//!
//! The compiler keeps it pure: this crate's dependencies, direct or not, hold
//! no tokio, sled, tonic, prost, chitchat, axum or hyper, and
//! `tests/pure.rs` walks Cargo.lock to fail `cargo test` if one appears.

#![deny(missing_docs)]

pub mod crdt;
pub mod partition;
