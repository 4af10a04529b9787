//! Tally's pure core: the state-based CRDTs of a counter ([`crdt`]: the
//! PN-counter and its folded base, the causal-length set of likes,
//! HyperLogLog of uniques) and the state machines of partitioned regions
//! ([`partition`]: the key hash, cluster views, node lifecycle, routing and
//! partition handoff).
//!
//! Nothing here does IO: no sockets, disks, clocks, threads or randomness.
//! Time and membership come in as arguments, decisions go out as values; the
//! node's runtime (`tally-node`) and the simulator (`tally-sim`) drive the
//! same code.

#![deny(missing_docs)]

pub mod crdt;
pub mod partition;
