//! The Tally region node.
//!
//! - [`crdt`], [`replica`] and [`partition`] are the pure core: no tokio, sled, tonic or prost.
//!   The node's runtime and the simulator (`tally-sim`) drive the same code.
//!   They live in the crate `tally-core` (node/core), re-exported here.
//! - [`store`] keeps counters on disk behind the narrow [`store::Store`] trait:
//!   the trait, the key layout and the in-memory store are `tally-core`'s
//!   `storage` (re-exported by [`store`]); the sled store is this crate's.
//! - the rest is the runtime: group commit, the gRPC services, membership and
//!   the anti-entropy loop, the HTTP endpoints; [`restore`] makes a new
//!   replica from a backup.

pub mod api;
pub mod cluster_file;
pub mod config;
pub mod config_reference;
pub mod dev;
pub mod engine;
pub mod fold_keeper;
pub mod gossip;
pub mod grpc_reference;
pub mod hex;
pub mod http;
pub mod lifecycle_file;
pub mod log_flood;
pub mod metrics;
pub mod restore;
pub mod server;
pub mod store;
pub mod upgrade;

// The pure core lives in its own crate (node/core, `tally-core`); these
// re-exports keep every `crate::crdt::...`, `crate::replica::...` and
// `tally_node::partition::...` path working.
pub use tally_core::{crdt, partition, replica};

/// Ctrl-C and SIGTERM, caught from the moment [`ShutdownSignal::install`]
/// returns. Install it before the node starts: a SIGTERM that arrives while
/// the node starts (an orchestrator stopping a pod that just became ready)
/// then ends it cleanly, instead of the signal's default action killing the
/// process in the middle of a commit.
pub struct ShutdownSignal {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl ShutdownSignal {
    /// Catches both signals from now on. Needs a Tokio runtime.
    pub fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(ShutdownSignal {
                terminate: signal(SignalKind::terminate())?,
                interrupt: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(ShutdownSignal {})
        }
    }

    /// Waits for the first of them (one caught before this call counts).
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.terminate.recv() => {}
                _ = self.interrupt.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

pub mod security;
