//! Folds of retired writers of a bounded counter: the heir inherits the
//! rights exactly, once, whatever the order of folds and merges; stale,
//! conflicting and circular folds are refused; chains of folds lead to a
//! live writer; and invariant 10 holds under random runs that retire a
//! writer and fold it at two replicas.

use proptest::prelude::*;

use super::*;
use crate::crdt::{BoundedRefused, Crdt, MergeRefused};

const WRITERS: u64 = 4;
const BOUND: i64 = -3;

fn w(id: u64) -> ReplicaId {
    ReplicaId(id)
}

fn row_of(state: &BoundedCounter, writer: u64) -> RightsRow {
    state.rows().get(&w(writer)).cloned().unwrap_or_default()
}

#[track_caller]
fn fold_of(state: &BoundedCounter, retired: u64, live: &[u64]) -> RetiredFold {
    RetiredFold::new(
        w(retired),
        row_of(state, retired),
        live.iter().map(|id| w(*id)),
    )
    .unwrap()
}

/// The sum of the live writers' rights, which must be `value - bound`.
fn live_rights(state: &BoundedCounter) -> i128 {
    (0..WRITERS)
        .filter(|id| !state.heirs().contains_key(&w(*id)))
        .map(|id| state.rights(w(id)))
        .sum()
}

#[track_caller]
fn assert_rights_add_up(state: &BoundedCounter) {
    assert_eq!(
        live_rights(state),
        state.value() - i128::from(state.bound())
    );
}

/// Writer 1 holds 10 and sent 4 to writer 2, took 3; writer 2 holds 4.
fn two_writers() -> BoundedCounter {
    let mut state = BoundedCounter::new(BOUND);
    state.put(w(1), 10).unwrap();
    state.transfer(w(1), w(2), 4).unwrap();
    state.take(w(1), 3).unwrap();
    state
}

#[test]
fn the_heir_inherits_the_retired_writer_s_rights_once() {
    let mut state = two_writers();
    let fold = fold_of(&state, 1, &[3, 2]);
    assert_eq!(fold.heir(), w(2), "the lowest live writer");
    assert!(state.fold_retired(&fold).unwrap());
    assert_eq!((state.rights(w(1)), state.rights(w(2))), (0, 7));
    let once = state.clone();
    assert!(
        !state.fold_retired(&fold).unwrap(),
        "a second fold is a no-op"
    );
    assert!(!state.merge(&once));
    assert_eq!(state, once);
    assert_rights_add_up(&state);
    state.take(w(2), 7).unwrap();
    assert!(state.take(w(2), 1).is_err());
    assert_eq!(
        state.take(w(1), 1),
        Err(BoundedRefused::Retired { writer: w(1) })
    );
    assert_eq!(
        state.transfer(w(2), w(1), 1),
        Err(BoundedRefused::Retired { writer: w(1) })
    );
}

#[test]
fn a_fold_from_an_older_row_creates_no_rights() {
    let mut early = two_writers();
    let older = row_of(&early, 1);
    let mut late = early.clone();
    late.take(w(1), 2).unwrap();
    let final_row = row_of(&late, 1);
    // Replica `early` folds from the older row; `late` from the final one.
    let stale = RetiredFold::new(w(1), older, [w(2)]).unwrap();
    let fresh = RetiredFold::new(w(1), final_row, [w(2)]).unwrap();
    early.fold_retired(&stale).unwrap();
    late.fold_retired(&fresh).unwrap();
    for (mut a, b) in [(early.clone(), &late), (late.clone(), &early)] {
        a.check_merge(b).unwrap();
        a.merge(b);
        assert_eq!(a.rights(w(2)), 4 + 1, "the final row leaves 1 right");
        assert_rights_add_up(&a);
    }
    // A replica that knows the later row refuses the stale fold.
    let mut knows = two_writers();
    knows.take(w(1), 2).unwrap();
    let before = knows.clone();
    assert_eq!(
        knows.fold_retired(&stale),
        Err(BoundedFoldRefused::StaleFrozenRow { retired: w(1) })
    );
    assert_eq!(knows, before);
}

#[test]
fn a_chain_of_folds_leads_to_a_live_writer() {
    let mut state = two_writers();
    state.put(w(3), 5).unwrap();
    state.fold_retired(&fold_of(&state, 1, &[2, 3])).unwrap();
    state.fold_retired(&fold_of(&state, 2, &[3])).unwrap();
    assert_eq!(state.holder_of(w(1)), Some(w(3)));
    assert_eq!(state.rights(w(3)), 5 + 3 + 4);
    assert_rights_add_up(&state);
    // A transfer to writer 1 by a writer that had not seen its fold reaches
    // the end of the chain.
    let mut unaware = BoundedCounter::new(BOUND);
    unaware.put(w(0), 2).unwrap();
    unaware.transfer(w(0), w(1), 2).unwrap();
    state.merge(&unaware);
    assert_eq!(state.rights(w(3)), 5 + 3 + 4 + 2);
    assert_rights_add_up(&state);
}

#[test]
fn conflicting_and_circular_folds_are_refused() {
    let base = two_writers();
    let (mut a, mut b) = (base.clone(), base.clone());
    a.fold_retired(&fold_of(&base, 1, &[2])).unwrap();
    b.fold_retired(&fold_of(&base, 1, &[3])).unwrap();
    let conflict = BoundedFoldRefused::HeirConflict {
        retired: w(1),
        ours: w(2),
        theirs: w(3),
    };
    assert_eq!(a.check_merge(&b), Err(MergeRefused::Fold(conflict.clone())));
    let before = a.clone();
    assert_eq!(a.fold_retired(&fold_of(&base, 1, &[3])), Err(conflict));
    assert_eq!(a, before);
    // Writer 2 folded into 1 elsewhere, while 1 was folded into 2 here.
    let mut c = base.clone();
    c.fold_retired(&fold_of(&base, 2, &[1])).unwrap();
    assert_eq!(
        a.check_merge(&c),
        Err(MergeRefused::Fold(BoundedFoldRefused::HeirCycle {
            retired: w(1)
        }))
    );
    assert_eq!(
        a.fold_retired(&fold_of(&base, 2, &[1])),
        Err(BoundedFoldRefused::HeirCycle { retired: w(2) })
    );
    // Merged regardless: the circle's rights are held by no one.
    c.merge(&a);
    assert_eq!(
        (c.holder_of(w(1)), c.rights(w(1)) + c.rights(w(2))),
        (None, 0)
    );
    assert_eq!(
        RetiredFold::new(w(1), RightsRow::default(), [w(1)]),
        Err(BoundedFoldRefused::NoHeir { retired: w(1) })
    );
}

/// One step of a run: (writer, kind, amount, peer, how far back).
type Step = (u64, u8, u64, u64, usize);

fn steps(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec((0..WRITERS, 0u8..5, 1u64..8, 0..WRITERS, 0usize..6), len)
}

/// Replicas, one a writer, with every state each has been in.
struct Run {
    replicas: Vec<BoundedCounter>,
    history: Vec<Vec<BoundedCounter>>,
    put: i128,
    taken: i128,
    /// The writers retired so far.
    retired: Vec<u64>,
}

impl Run {
    /// Applies one step; a retired writer writes nothing (its replica still
    /// merges).
    fn step(&mut self, (writer, kind, amount, peer, back): Step) {
        let at = writer as usize;
        let replica = &mut self.replicas[at];
        match kind {
            _ if self.retired.contains(&writer) && kind < 4 => {}
            0 | 1 => {
                if replica.take(w(writer), amount).is_ok() {
                    self.taken += i128::from(amount);
                }
            }
            2 => {
                if replica.put(w(writer), amount).is_ok() {
                    self.put += i128::from(amount);
                }
            }
            3 => {
                let _ = replica.transfer(w(writer), w(peer), amount);
            }
            _ => {
                let past = &self.history[peer as usize];
                let state = &past[past.len().saturating_sub(back + 1)];
                if replica.check_merge(state).is_ok() {
                    replica.merge(state);
                }
            }
        }
        self.history[at].push(self.replicas[at].clone());
    }

    /// Invariant 10 now: the truth (every replica's state merged) reads
    /// the exact value, its live rights add up to it, none is negative,
    /// and no writer sees more rights of its own than it holds.
    fn check(&self) -> Result<(), TestCaseError> {
        let mut truth = BoundedCounter::new(BOUND);
        for replica in &self.replicas {
            prop_assert!(truth.check_merge(replica).is_ok());
            truth.merge(replica);
        }
        prop_assert_eq!(truth.value(), i128::from(BOUND) + self.put - self.taken);
        prop_assert_eq!(live_rights(&truth), self.put - self.taken);
        for writer in 0..WRITERS {
            let rights = truth.rights(w(writer));
            prop_assert!(rights >= 0, "writer {} holds {}", writer, rights);
            if self.retired.contains(&writer) {
                continue;
            }
            let own = self.replicas[writer as usize].rights(w(writer));
            prop_assert!(
                own <= rights,
                "writer {} sees {}, holds {}",
                writer,
                own,
                rights
            );
        }
        Ok(())
    }
}

proptest! {
    /// Random takes, puts, transfers and stale merges among four writers;
    /// then one retires and is folded at two replicas (in either order, a
    /// replica perhaps twice), with more steps and stale merges in between;
    /// then perhaps its heir retires too, folded at one more replica.
    /// Invariant 10 holds at every step, and after the heal every replica
    /// holds the same state, whose live writers' rights add up to its
    /// value less the bound.
    #[test]
    fn a_fold_keeps_every_right_exactly_whatever_the_order(
        stock in 1u64..30,
        before in steps(1..60),
        retired in 0..WRITERS,
        folders in (0..WRITERS, 0..WRITERS),
        after in steps(0..60),
        at in (any::<prop::sample::Index>(), any::<prop::sample::Index>()),
        chain in prop::option::of((0..WRITERS, steps(0..30))),
    ) {
        let mut replicas = vec![BoundedCounter::new(BOUND); WRITERS as usize];
        replicas[0].put(w(0), stock).unwrap();
        let history = replicas.iter().map(|r| vec![r.clone()]).collect();
        let mut run = Run { replicas, history, put: i128::from(stock), taken: 0, retired: vec![] };
        for step in before {
            run.step(step);
            run.check()?;
        }
        // Its own replica holds its final row exactly.
        let live: Vec<u64> = (0..WRITERS).filter(|id| *id != retired).collect();
        let fold = fold_of(&run.replicas[retired as usize], retired, &live);
        run.retired.push(retired);
        let fold_at = [
            (at.0.index(after.len() + 1), folders.0),
            (at.1.index(after.len() + 1), folders.1),
        ];
        for (index, step) in after.iter().map(Some).chain([None]).enumerate() {
            for (when, folder) in fold_at {
                if when == index {
                    let replica = &mut run.replicas[folder as usize];
                    prop_assert!(replica.fold_retired(&fold).is_ok());
                    run.history[folder as usize].push(replica.clone());
                    run.check()?;
                }
            }
            if let Some(step) = step {
                run.step(*step);
                run.check()?;
            }
        }
        let mut holder = fold.heir();
        if let Some((folder, tail)) = chain {
            let live: Vec<u64> = live.into_iter().filter(|id| w(*id) != holder).collect();
            let fold = fold_of(&run.replicas[holder.0 as usize], holder.0, &live);
            run.retired.push(holder.0);
            let replica = &mut run.replicas[folder as usize];
            prop_assert!(replica.fold_retired(&fold).is_ok());
            run.history[folder as usize].push(replica.clone());
            for step in tail {
                run.step(step);
                run.check()?;
            }
            holder = fold.heir();
        }
        // The heal: every replica merges every other's latest state.
        let latest = run.replicas.clone();
        for replica in &mut run.replicas {
            for state in &latest {
                replica.merge(state);
            }
        }
        let healed = &run.replicas[0];
        for replica in &run.replicas {
            prop_assert_eq!(replica, healed);
        }
        prop_assert_eq!(healed.rights(w(retired)), 0);
        prop_assert_eq!(healed.holder_of(w(retired)), Some(holder));
        prop_assert_eq!(live_rights(healed), healed.value() - i128::from(BOUND));
        run.check()?;
    }
}
