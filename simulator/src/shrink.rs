//! Shrinking a failing fault plan by delta debugging (Zeller's ddmin) over its
//! operations.
//!
//! Invariant: the shrunk plan is a sub-list of the original (operations are
//! removed, never changed), and it still fails with the same kind of
//! violation when replayed with the same seed and options.

use crate::faults::{FaultPlan, Op};
use crate::options::SimOptions;
use crate::world::run;

/// The result of shrinking.
#[derive(Clone, Debug)]
pub struct Shrunk {
    /// The smallest failing plan found.
    pub plan: FaultPlan,
    /// Runs spent.
    pub runs: u32,
}

/// Shrinks `plan` (which fails for `seed` with a violation of `kind`), spending
/// at most `budget` runs.
pub fn shrink(
    seed: u64,
    options: &SimOptions,
    plan: &FaultPlan,
    kind: &str,
    budget: u32,
) -> Shrunk {
    let mut runs = 0u32;
    let mut fails = |ops: &[Op]| -> bool {
        runs += 1;
        let result = run(seed, options, Some(FaultPlan(ops.to_vec())), false);
        result.violations.iter().any(|v| v.kind == kind)
    };
    let mut current: Vec<Op> = plan.0.clone();
    let mut granularity = 2usize;
    let mut spent = 0u32;
    while current.len() >= 2 && spent < budget {
        let chunk = current.len().div_ceil(granularity);
        let mut reduced = false;
        let mut start = 0;
        while start < current.len() && spent < budget {
            let end = (start + chunk).min(current.len());
            let complement: Vec<Op> = current[..start]
                .iter()
                .chain(&current[end..])
                .cloned()
                .collect();
            spent += 1;
            if fails(&complement) {
                current = complement;
                granularity = (granularity - 1).max(2);
                reduced = true;
                break;
            }
            start = end;
        }
        if !reduced {
            if granularity >= current.len() {
                break;
            }
            granularity = (granularity * 2).min(current.len());
        }
    }
    if current.len() == 1 && spent < budget && fails(&[]) {
        current.clear();
    }
    Shrunk {
        plan: FaultPlan(current),
        runs,
    }
}
