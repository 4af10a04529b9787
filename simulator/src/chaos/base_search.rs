//! The search behind the folded-base check (`folds.rs::check_bases`): is a
//! counter's folded base, for one instant per folded replica, the sum of
//! their adds acknowledged before it plus a submask of each one's adds in
//! flight then, and what is the fewest acknowledged adds lost that way?
//!
//! Two ways, the same answer (`base_search_tests.rs` checks them against
//! each other on random cases):
//! - **Meet in the middle** (tried first). Each instant of a replica becomes
//!   its exact contributions (its acknowledged sums plus every submask of
//!   what was in flight then, as long as those are few); the replicas are
//!   split in two halves, each half's reachable sums are kept in a map with
//!   the fewest losses, and the base is explained where a sum of one half
//!   meets the base minus a sum of the other. The cost grows with the
//!   number of distinct sums, not with the product of the instants, which
//!   is what let a hot key with four folded replicas go past the
//!   depth-first search's limit (chaos seed 503, partitioned, three wipes
//!   and two removals).
//! - **Depth first** over the product of the instants, pruned by bounds,
//!   with the in-flight part decoded at the leaves ([`sum_of_submasks`]):
//!   for cases whose in-flight masks are too wide to expand, or whose
//!   halves have too many sums. It gives up ([`Undecided`]) past
//!   [`SEARCH_LIMIT`] choices, and the caller names that as a violation.

use std::collections::HashMap;

use super::check::SlotAt;

/// Choices of instants the depth-first search visits at most.
pub(super) const SEARCH_LIMIT: u64 = 20_000_000;
/// In-flight bits of one instant (increments and decrements together) up
/// to which the meet in the middle expands every submask.
const EXPANDED_BITS: u32 = 10;
/// Sums one half of the meet in the middle keeps, and combinations it
/// tries, at most; past either it leaves the case to the depth-first search.
const HALF_SUMS: usize = 4_000_000;
const HALF_WORK: u64 = 200_000_000;

/// The search gave up.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Undecided;

/// The fewest acknowledged adds lost over the choices of one instant per
/// writer (`writers[i]`: writer i's instants) whose sums, plus a submask of
/// each chosen instant's unknown adds, make `(base_p, base_n)`; `None` when
/// no choice does.
pub(super) fn explain_base(
    writers: &[Vec<SlotAt>],
    base_p: u128,
    base_n: u128,
) -> Result<Option<u64>, Undecided> {
    match meet_in_the_middle(writers, (base_p, base_n)) {
        Some(answer) => Ok(answer),
        None => depth_first(writers, base_p, base_n),
    }
}

/// Sums (p, n) with the fewest losses that reach them.
type Sums = HashMap<(u128, u128), u64>;

/// [`explain_base`] by meeting in the middle; `None` when the case is too
/// wide for it.
fn meet_in_the_middle(writers: &[Vec<SlotAt>], base: (u128, u128)) -> Option<Option<u64>> {
    let half = writers.len() / 2;
    let left = half_sums(&writers[..half], base)?;
    let right = half_sums(&writers[half..], base)?;
    let mut best: Option<u64> = None;
    for (&(p, n), &lost) in &left {
        if let Some(&other) = right.get(&(base.0 - p, base.1 - n)) {
            best = Some(best.map_or(lost + other, |best| best.min(lost + other)));
        }
    }
    Some(best)
}

/// Every sum, at most `base`, of one contribution per writer, with the
/// fewest losses; `None` past the limits.
fn half_sums(writers: &[Vec<SlotAt>], base: (u128, u128)) -> Option<Sums> {
    let mut sums = Sums::from([((0, 0), 0)]);
    let mut work = 0u64;
    for instants in writers {
        let contributions = contributions(instants, base)?;
        let mut next = Sums::with_capacity(sums.len());
        for (&(p, n), &lost) in &sums {
            for (&(dp, dn), &more) in &contributions {
                work += 1;
                let (p, n) = (p + dp, n + dn);
                if p > base.0 || n > base.1 {
                    continue;
                }
                let entry = next.entry((p, n)).or_insert(u64::MAX);
                *entry = (*entry).min(lost + more);
            }
            if work > HALF_WORK || next.len() > HALF_SUMS {
                return None;
            }
        }
        sums = next;
    }
    Some(sums)
}

/// One writer's exact contributions: each instant's acknowledged sums plus
/// each submask of its adds in flight, with the fewest losses; `None` when
/// an instant has too many adds in flight to expand.
fn contributions(instants: &[SlotAt], base: (u128, u128)) -> Option<Sums> {
    let mut out = Sums::new();
    for at in instants {
        if at.unknown_p.count_ones() + at.unknown_n.count_ones() > EXPANDED_BITS {
            return None;
        }
        for extra_p in submasks(at.unknown_p) {
            let p = u128::from(at.p) + u128::from(extra_p);
            if p > base.0 {
                continue;
            }
            for extra_n in submasks(at.unknown_n) {
                let n = u128::from(at.n) + u128::from(extra_n);
                if n > base.1 {
                    continue;
                }
                let entry = out.entry((p, n)).or_insert(u64::MAX);
                *entry = (*entry).min(at.lost);
            }
        }
    }
    Some(out)
}

/// Every submask of `mask`, `mask` and 0 included.
fn submasks(mask: u64) -> impl Iterator<Item = u64> {
    let mut next = Some(mask);
    std::iter::from_fn(move || {
        let current = next?;
        next = (current != 0).then(|| (current - 1) & mask);
        Some(current)
    })
}

/// [`explain_base`] depth first over the product of the instants.
fn depth_first(
    writers: &[Vec<SlotAt>],
    base_p: u128,
    base_n: u128,
) -> Result<Option<u64>, Undecided> {
    // The most that writers i.. can still add, to cut hopeless branches.
    let mut reach = vec![(0u128, 0u128); writers.len() + 1];
    for (i, instants) in writers.iter().enumerate().rev() {
        let most = |f: fn(&SlotAt) -> u128| instants.iter().map(f).max().unwrap_or(0);
        reach[i] = (
            reach[i + 1].0 + most(|at| u128::from(at.p) + u128::from(at.unknown_p)),
            reach[i + 1].1 + most(|at| u128::from(at.n) + u128::from(at.unknown_n)),
        );
    }
    let mut search = Search {
        writers,
        base: (base_p, base_n),
        reach,
        chosen: Vec::with_capacity(writers.len()),
        visited: 0,
        best: None,
    };
    search.visit(0, Sum::default())?;
    Ok(search.best)
}

/// What the instants chosen so far add up to: their acknowledged sums, the
/// most their adds in flight could add, and their losses.
#[derive(Clone, Copy, Default)]
struct Sum {
    p: u128,
    n: u128,
    in_flight_p: u128,
    in_flight_n: u128,
    lost: u64,
}

struct Search<'a> {
    writers: &'a [Vec<SlotAt>],
    base: (u128, u128),
    reach: Vec<(u128, u128)>,
    chosen: Vec<SlotAt>,
    visited: u64,
    best: Option<u64>,
}

impl Search<'_> {
    fn visit(&mut self, i: usize, sum: Sum) -> Result<(), Undecided> {
        self.visited += 1;
        if self.visited > SEARCH_LIMIT {
            return Err(Undecided);
        }
        let (base_p, base_n) = self.base;
        // Hopeless: past the base already, or short of it even if every add
        // in flight at the chosen instants and all the rest were applied.
        if sum.p > base_p
            || sum.n > base_n
            || sum.p + sum.in_flight_p + self.reach[i].0 < base_p
            || sum.n + sum.in_flight_n + self.reach[i].1 < base_n
        {
            return Ok(());
        }
        if self.best.is_some_and(|best| sum.lost >= best) {
            return Ok(());
        }
        if i == self.writers.len() {
            let masks_p: Vec<u64> = self.chosen.iter().map(|at| at.unknown_p).collect();
            let masks_n: Vec<u64> = self.chosen.iter().map(|at| at.unknown_n).collect();
            if sum_of_submasks(base_p - sum.p, &masks_p)
                && sum_of_submasks(base_n - sum.n, &masks_n)
            {
                self.best = Some(sum.lost);
            }
            return Ok(());
        }
        for at in &self.writers[i] {
            self.chosen.push(*at);
            let visited = self.visit(
                i + 1,
                Sum {
                    p: sum.p + u128::from(at.p),
                    n: sum.n + u128::from(at.n),
                    in_flight_p: sum.in_flight_p + u128::from(at.unknown_p),
                    in_flight_n: sum.in_flight_n + u128::from(at.unknown_n),
                    lost: sum.lost + at.lost,
                },
            );
            self.chosen.pop();
            visited?;
        }
        Ok(())
    }
}

/// Whether `target` is a sum of one submask of each of `masks`: bit by bit
/// from the lowest, tracking which carries are possible (at most one per
/// mask), so the cost is linear in the bits, not exponential in the masks.
pub(super) fn sum_of_submasks(target: u128, masks: &[u64]) -> bool {
    let k = masks.len();
    let mut carries = vec![false; k + 1];
    carries[0] = true;
    for bit in 0..128 {
        let available = if bit < 64 {
            masks.iter().filter(|mask| (*mask >> bit) & 1 == 1).count()
        } else {
            0
        };
        let want = ((target >> bit) & 1) as usize;
        let mut next = vec![false; k + 1];
        for carry in (0..=k).filter(|carry| carries[*carry]) {
            for taken in 0..=available {
                let total = carry + taken;
                if total % 2 == want {
                    next[total / 2] = true;
                }
            }
        }
        carries = next;
        if !carries.contains(&true) {
            return false;
        }
    }
    carries[0]
}

#[cfg(test)]
#[path = "base_search_tests.rs"]
mod tests;
