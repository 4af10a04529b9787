//! The Tally region node.
//!
//! - [`crdt`], [`replica`] and [`partition`] are the pure core: no tokio, sled, tonic or prost.
//!   The node's runtime and the simulator (`tally-sim`) drive the same code.
//! - [`store`] keeps counters on disk behind the narrow [`store::Store`] trait.
//! - the rest is the runtime: group commit, the gRPC services, membership and
//!   the anti-entropy loop, the HTTP endpoints; [`restore`] makes a new
//!   replica from a backup.

pub mod api;
pub mod cluster_file;
pub mod config;
pub mod crdt;
pub mod dev;
pub mod engine;
pub mod fold_keeper;
pub mod gossip;
pub mod http;
pub mod lifecycle_file;
pub mod log_flood;
pub mod metrics;
pub mod partition;
pub mod replica;
pub mod restore;
pub mod server;
pub mod store;
pub mod upgrade;

/// Waits for Ctrl-C or SIGTERM.
pub async fn wait_for_shutdown_signal() {
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
pub mod security;
