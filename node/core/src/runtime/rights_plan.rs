//! Where a bounded counter's rights should move (issue 44; DESIGN.md
//! "Bounded counters": rights move between nodes "by demand and on
//! request"). A pure planner: the caller gives, as one replica sees them,
//! each live writer's rights and recent take rate (measured over a window
//! of its choosing), and performs the plan with
//! [`crate::crdt::BoundedCounter::transfer`] or by sending requests.
//!
//! - **By demand** ([`plan_transfers`]): the local writer keeps a reserve
//!   of `reserve_seconds` of its own takes and offers the rest to the
//!   writers that sell faster than it, fastest first (ties by the lower
//!   id), each up to what it would sell in `horizon_seconds` less what it
//!   already holds.
//! - **On request** ([`plan_requests`]): a take that finds too few local
//!   rights asks the other writers for the shortfall, those holding the
//!   most first (ties by the lower id), each for at most what it holds.
//!
//! Invariants: the plan is a function of its inputs (same inputs, same
//! plan, at any node); it never plans sending more than the local rights
//! (less the reserve), never to the local writer itself, and never an
//! amount of zero. Views of others' rights may be stale; a request is only
//! a request, and the holder's own check ([`crate::crdt::BoundedCounter::transfer`])
//! decides.

use crate::crdt::ReplicaId;

/// One writer as the planning replica sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriterLoad {
    /// The writer.
    pub writer: ReplicaId,
    /// Its rights as this replica sees them (a negative view counts as 0).
    pub rights: u64,
    /// Its takes per second over the caller's window, in thousandths
    /// (1500 is one and a half takes a second).
    pub milli_rate: u64,
}

/// How far ahead the planner looks, in seconds of takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanHorizon {
    /// The local writer keeps this many seconds of its own takes.
    pub reserve_seconds: u64,
    /// A faster writer is offered up to this many seconds of its takes.
    pub horizon_seconds: u64,
}

/// A planned movement of rights: send (or ask for) `amount` to (or from)
/// `writer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RightsMove {
    /// The other writer.
    pub writer: ReplicaId,
    /// How many rights, at least 1.
    pub amount: u64,
}

/// The requests for a take that local rights do not cover.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RightsRequests {
    /// Whom to ask, and for how much, in order.
    pub asks: Vec<RightsMove>,
    /// What even every holder together does not hold, as seen here (the
    /// take should be refused now rather than wait for it).
    pub uncovered: u64,
}

/// The takes of `milli_rate` over `seconds`, rounded up.
fn takes_in(milli_rate: u64, seconds: u64) -> u64 {
    let takes = (u128::from(milli_rate) * u128::from(seconds)).div_ceil(1000);
    u64::try_from(takes).unwrap_or(u64::MAX)
}

/// The transfers `local` should make now to writers that sell faster (see
/// the module documentation). `loads` lists every live writer once, the
/// local one included; a missing local writer plans nothing.
pub fn plan_transfers(
    local: ReplicaId,
    loads: &[WriterLoad],
    horizon: PlanHorizon,
) -> Vec<RightsMove> {
    let Some(own) = loads.iter().find(|load| load.writer == local) else {
        return Vec::new();
    };
    let reserve = takes_in(own.milli_rate, horizon.reserve_seconds);
    let mut spare = own.rights.saturating_sub(reserve);
    let mut faster: Vec<&WriterLoad> = loads
        .iter()
        .filter(|load| load.writer != local && load.milli_rate > own.milli_rate)
        .collect();
    faster.sort_by_key(|load| (std::cmp::Reverse(load.milli_rate), load.writer));
    let mut moves = Vec::new();
    for load in faster {
        let need = takes_in(load.milli_rate, horizon.horizon_seconds).saturating_sub(load.rights);
        let amount = need.min(spare);
        if amount > 0 {
            moves.push(RightsMove {
                writer: load.writer,
                amount,
            });
            spare -= amount;
        }
    }
    moves
}

/// Whom `local` should ask for rights when a take of `asked` finds only
/// `loads`' local rights (see the module documentation).
pub fn plan_requests(local: ReplicaId, loads: &[WriterLoad], asked: u64) -> RightsRequests {
    let own = loads
        .iter()
        .find(|load| load.writer == local)
        .map_or(0, |load| load.rights);
    let mut missing = asked.saturating_sub(own);
    let mut holders: Vec<&WriterLoad> = loads
        .iter()
        .filter(|load| load.writer != local && load.rights > 0)
        .collect();
    holders.sort_by_key(|load| (std::cmp::Reverse(load.rights), load.writer));
    let mut asks = Vec::new();
    for holder in holders {
        if missing == 0 {
            break;
        }
        let amount = holder.rights.min(missing);
        asks.push(RightsMove {
            writer: holder.writer,
            amount,
        });
        missing -= amount;
    }
    RightsRequests {
        asks,
        uncovered: missing,
    }
}

#[cfg(test)]
#[path = "rights_plan_tests.rs"]
mod tests;
