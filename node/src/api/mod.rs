//! The tonic services: `Counters` and `Likes` (public), `Replication` (between nodes) and
//! `Admin` (operators). The prost <-> core conversions live in [`convert`]
//! (and, for replicated durability's `Copy` RPC, in [`copies`]) only.

pub mod admin;
pub mod backup;
pub mod convert;
pub mod copies;
pub mod counters;
pub mod forward;
pub mod likes;
pub mod partitions;
pub mod replication;
pub mod serve;
pub mod status_codes;
pub mod watch_relay;
pub mod wrong_port;

pub use admin::{AdminService, NodeInfo};
pub use counters::CountersService;
pub use likes::LikesService;
pub use replication::ReplicationService;
