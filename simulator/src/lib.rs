//! `tally-sim`: deterministic simulation of a Tally cluster over the node's
//! own pure replica core, with fault injection, an exact checker, shrinking of
//! failing fault plans, multi-seed sweeps and an HTML report; and a chaos
//! runner that applies the same checker to real `tally-node` processes.
//!
//! Invariant of the crate: the simulator drives `tally_node::replica::Replica`
//! itself (never a re-implementation), and a run is a function of its seed,
//! its options and its fault plan.

pub mod checker;
pub mod faults;
pub mod fold_check;
pub mod fold_record;
pub mod ledger;
pub mod network;
pub mod options;
pub mod partitioned;
pub mod queue;
pub mod rng;
pub mod set_ledger;
pub mod world;

pub use faults::{FaultPlan, Op, Shape};
pub use options::{BugName, Durability, FaultSet, SimOptions};
pub use world::{run, RunResult};
pub mod chaos;
pub mod cli;
pub mod replay;
pub mod report;
pub mod shrink;
pub mod sweep;
