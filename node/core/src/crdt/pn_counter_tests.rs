//! Unit tests of the PN-counter: the merge laws by proptest, the split
//! property, and the 64-bit boundaries of slots and values.

use proptest::prelude::*;

use super::*;

fn slot_strategy() -> impl Strategy<Value = (ReplicaId, Slot)> {
    (0u64..6, any::<u64>(), any::<u64>()).prop_map(|(id, p, n)| {
        (
            ReplicaId(id),
            Slot {
                p: p >> 2,
                n: n >> 2,
            },
        )
    })
}

fn counter_strategy() -> impl Strategy<Value = PnCounter> {
    prop::collection::vec(slot_strategy(), 0..6).prop_map(PnCounter::from_slots)
}

fn merged(a: &PnCounter, b: &PnCounter) -> PnCounter {
    let mut out = a.clone();
    out.merge(b);
    out
}

/// What merge and from_slots must equal: one slot at a time.
fn slot_by_slot(base: &PnCounter, slots: &[(ReplicaId, Slot)]) -> (PnCounter, bool) {
    let mut out = base.clone();
    let mut changed = false;
    for (replica, slot) in slots {
        changed |= out.merge_slot(*replica, *slot);
    }
    (out, changed)
}

proptest! {
    #[test]
    fn merge_and_from_slots_equal_one_slot_at_a_time(
        a in counter_strategy(),
        slots in prop::collection::vec(slot_strategy(), 0..12),
    ) {
        let b = PnCounter::from_slots(slots.clone());
        prop_assert_eq!(&b, &slot_by_slot(&PnCounter::new(), &slots).0);
        let mut fast = a.clone();
        let changed = fast.merge(&b);
        prop_assert_eq!((fast, changed), slot_by_slot(&a, b.slots()));
    }

    #[test]
    fn merge_obeys_the_crdt_laws(a in counter_strategy(), b in counter_strategy(), c in counter_strategy()) {
        crate::crdt::laws::check_laws(&a, &b, &c)?;
    }

    #[test]
    fn merge_is_inflationary(a in counter_strategy(), b in counter_strategy()) {
        let m = merged(&a, &b);
        prop_assert!(a.is_covered_by(&m));
        prop_assert!(b.is_covered_by(&m));
    }

    /// Any split of the same adds across replicas, merged in any order and any
    /// number of times, gives the sum of the adds.
    #[test]
    fn any_split_of_adds_merges_to_their_sum(
        adds in prop::collection::vec((0u64..4, -1000i64..1000), 1..60),
        order in prop::collection::vec(0usize..4, 0..12),
    ) {
        let mut replicas: Vec<PnCounter> = vec![PnCounter::new(); 4];
        let mut expected: i64 = 0;
        for (replica, delta) in adds {
            if delta == 0 { continue; }
            replicas[replica as usize].checked_add(ReplicaId(replica), delta).unwrap();
            expected += delta;
        }
        let mut total = PnCounter::new();
        for index in order.iter().chain([0, 1, 2, 3].iter()) {
            total.merge(&replicas[*index]);
        }
        prop_assert_eq!(total.value().unwrap(), expected);
        let mut reverse = PnCounter::new();
        for replica in replicas.iter().rev() {
            reverse.merge(replica);
        }
        prop_assert_eq!(reverse, total);
    }
}

#[test]
fn add_raises_only_the_writers_slot() {
    let mut counter = PnCounter::from_slots([(ReplicaId(9), Slot { p: 5, n: 2 })]);
    assert_eq!(counter.checked_add(ReplicaId(1), 4), Ok(7));
    assert_eq!(counter.checked_add(ReplicaId(1), -10), Ok(-3));
    assert_eq!(counter.slot(ReplicaId(1)), Slot { p: 4, n: 10 });
    assert_eq!(counter.slot(ReplicaId(9)), Slot { p: 5, n: 2 });
}

#[test]
fn zero_delta_is_refused() {
    let mut counter = PnCounter::new();
    assert_eq!(
        counter.checked_add(ReplicaId(1), 0),
        Err(AddError::ZeroDelta)
    );
    assert!(counter.is_empty());
}

#[test]
fn slot_at_u64_max_refuses_the_add_and_changes_nothing() {
    let mut counter = PnCounter::from_slots([(
        ReplicaId(1),
        Slot {
            p: u64::MAX - 1,
            n: u64::MAX - 10,
        },
    )]);
    let before = counter.clone();
    assert_eq!(counter.checked_add(ReplicaId(1), 1), Ok(10));
    assert_eq!(
        counter.checked_add(ReplicaId(1), 1),
        Err(AddError::SlotOverflow { which: "increment" })
    );
    assert_eq!(counter.slot(ReplicaId(1)).p, u64::MAX);
    let mut down = before.clone();
    assert_eq!(
        down.checked_add(ReplicaId(1), -11),
        Err(AddError::SlotOverflow { which: "decrement" })
    );
    assert_eq!(down, before);
}

#[test]
fn value_at_the_i64_boundary() {
    let mut counter = PnCounter::new();
    assert_eq!(counter.checked_add(ReplicaId(1), i64::MAX), Ok(i64::MAX));
    assert_eq!(
        counter.checked_add(ReplicaId(1), 1),
        Err(AddError::ValueOutOfRange)
    );
    assert_eq!(counter.value(), Ok(i64::MAX));
    assert_eq!(counter.checked_add(ReplicaId(1), i64::MIN), Ok(-1));
    assert_eq!(
        counter.checked_add(ReplicaId(1), i64::MIN + 1),
        Ok(i64::MIN)
    );
    assert_eq!(
        counter.checked_add(ReplicaId(2), -1),
        Err(AddError::ValueOutOfRange)
    );
    assert_eq!(counter.value(), Ok(i64::MIN));
}

#[test]
fn merged_total_outside_i64_is_an_error_on_read_never_wrapped() {
    let mut a = PnCounter::new();
    a.checked_add(ReplicaId(1), i64::MAX).unwrap();
    let mut b = PnCounter::new();
    b.checked_add(ReplicaId(2), i64::MAX).unwrap();
    a.merge(&b);
    let exact = 2 * i128::from(i64::MAX);
    assert_eq!(a.value(), Err(ValueOutOfRange(exact)));
    assert_eq!(a.exact_value(), exact);
    // And an add that would bring it further out is refused too.
    assert_eq!(
        a.checked_add(ReplicaId(1), -1),
        Err(AddError::ValueOutOfRange)
    );
}
