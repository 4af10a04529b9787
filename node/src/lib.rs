//! The Tally region node.
//!
//! - [`crdt`] and [`replica`] are the pure core: no tokio, sled, tonic or prost.
//!   The node's runtime and the simulator (`tally-sim`) drive the same code.
//! - [`store`] keeps counters on disk behind the narrow [`store::Store`] trait.
//! - the rest is the runtime: group commit, the gRPC services, membership and
//!   the anti-entropy loop, the HTTP endpoints.

pub mod crdt;
pub mod replica;
pub mod store;
