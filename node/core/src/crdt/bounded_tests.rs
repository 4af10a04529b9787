//! The bounded counter: the merge laws, invariant 10 under random takes,
//! puts, transfers and merges of stale, repeated and reordered states, and
//! refusals that change nothing.

use proptest::prelude::*;

use super::*;

const WRITERS: u64 = 4;
const BOUND: i64 = -3;

fn w(id: u64) -> ReplicaId {
    ReplicaId(id)
}

fn row_strategy() -> impl Strategy<Value = RightsRow> {
    let sent = prop::collection::btree_map((0..WRITERS).prop_map(w), 1u64..1000, 0..3);
    (0u64..1000, 0u64..1000, sent).prop_map(|(put, took, sent)| RightsRow { put, took, sent })
}

fn state_strategy() -> impl Strategy<Value = BoundedCounter> {
    let rows = prop::collection::btree_map((0..WRITERS).prop_map(w), row_strategy(), 0..4);
    // Heirs of retired writers, conflicting and circular ones included:
    // merge must stay a lattice even on what `check_merge` refuses.
    let heirs =
        prop::collection::btree_map((0..WRITERS).prop_map(w), (0..WRITERS).prop_map(w), 0..3);
    (rows, heirs).prop_map(|(rows, heirs)| {
        let mut counter = BoundedCounter::new(BOUND);
        // Rows as merges bring them (a zero row is never stored).
        counter.rows = rows
            .into_iter()
            .filter(|(_, row)| *row != RightsRow::default())
            .collect();
        counter.heirs = heirs
            .into_iter()
            .filter(|(retired, heir)| retired != heir)
            .collect();
        counter
    })
}

/// One step of a run: (writer, kind, amount, peer, how far back).
type Step = (u64, u8, u64, u64, usize);

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec((0..WRITERS, 0u8..5, 1u64..8, 0..WRITERS, 0usize..6), 1..120)
}

proptest! {
    #[test]
    fn merge_obeys_the_crdt_laws(a in state_strategy(), b in state_strategy(), c in state_strategy()) {
        crate::crdt::laws::check_laws(&a, &b, &c)?;
        let mut merged = a.clone();
        merged.merge(&b);
        for (writer, row) in a.rows() {
            let after = &merged.rows()[writer];
            prop_assert!(after.put >= row.put && after.took >= row.took, "inflationary");
        }
    }

    /// Each writer acts on its own replica; merges deliver states that may
    /// be stale (any earlier state of the peer), repeated or out of order.
    /// At every step, no writer's true rights are below zero (so the
    /// acknowledged takes never exceed the stock plus the puts), and no
    /// writer sees more rights of its own than it holds; once every state
    /// is merged everywhere, every replica reads the exact value.
    #[test]
    fn takes_never_exceed_the_stock_whatever_the_delivery(stock in 0u64..30, steps in steps()) {
        let mut replicas: Vec<BoundedCounter> = (0..WRITERS).map(|_| BoundedCounter::new(BOUND)).collect();
        replicas[0].put(w(0), stock.max(1)).unwrap();
        let mut history: Vec<Vec<BoundedCounter>> = replicas.iter().map(|r| vec![r.clone()]).collect();
        let (mut taken, mut put) = (0u128, u128::from(stock.max(1)));
        for (writer, kind, amount, peer, back) in steps {
            let at = writer as usize;
            match kind {
                0 | 1 => {
                    if replicas[at].take(w(writer), amount).is_ok() {
                        taken += u128::from(amount);
                    }
                }
                2 => {
                    replicas[at].put(w(writer), amount).unwrap();
                    put += u128::from(amount);
                }
                3 => {
                    let _ = replicas[at].transfer(w(writer), w(peer), amount);
                }
                _ => {
                    let past = &history[peer as usize];
                    let state = past[past.len().saturating_sub(back + 1)].clone();
                    replicas[at].merge(&state);
                }
            }
            history[at].push(replicas[at].clone());
            // The truth: every writer's own row, as its own replica holds it.
            let mut truth = BoundedCounter::new(BOUND);
            for replica in &replicas {
                truth.merge(replica);
            }
            prop_assert_eq!(truth.value(), i128::from(BOUND) + put as i128 - taken as i128);
            for writer in 0..WRITERS {
                let rights = truth.rights(w(writer));
                prop_assert!(rights >= 0, "writer {} holds {} rights", writer, rights);
                let own = replicas[writer as usize].rights(w(writer));
                prop_assert!(own <= rights, "writer {} sees {} rights of its own, holds {}", writer, own, rights);
            }
            prop_assert!(truth.value() >= i128::from(BOUND));
        }
        // The heal: every replica merges every other's latest state.
        let latest = replicas.clone();
        for replica in &mut replicas {
            for state in &latest {
                replica.merge(state);
            }
        }
        for replica in &replicas {
            prop_assert_eq!(replica, &replicas[0]);
            prop_assert_eq!(replica.value(), i128::from(BOUND) + put as i128 - taken as i128);
        }
    }
}

#[test]
fn a_take_beyond_local_rights_is_refused_and_changes_nothing() {
    let mut seller = BoundedCounter::new(0);
    seller.put(w(1), 2).unwrap();
    seller.take(w(1), 2).unwrap();
    let before = seller.clone();
    let refused = seller.take(w(1), 1).unwrap_err();
    assert_eq!(
        refused,
        BoundedRefused::NoRights {
            asked: 1,
            rights: 0,
            value: 0,
            bound: 0
        }
    );
    assert!(
        refused.to_string().contains("rights are elsewhere"),
        "{refused}"
    );
    assert_eq!(seller, before);
    for refused in [
        seller.take(w(1), 0),
        seller.put(w(1), 0),
        seller.transfer(w(1), w(1), 1),
    ] {
        assert!(refused.is_err());
    }
    assert_eq!(seller, before);
}

#[test]
fn rights_move_by_transfer_once_the_receiver_has_the_sender_s_row() {
    let mut a = BoundedCounter::new(0);
    let mut b = BoundedCounter::new(0);
    a.put(w(1), 500).unwrap();
    a.transfer(w(1), w(2), 200).unwrap();
    assert_eq!((a.rights(w(1)), a.rights(w(2))), (300, 200));
    // Not yet received: b cannot sell.
    assert!(b.take(w(2), 1).is_err());
    b.merge(&a);
    b.merge(&a);
    b.take(w(2), 200).unwrap();
    assert!(
        b.take(w(2), 1).is_err(),
        "a repeated delivery gave nothing twice"
    );
    a.merge(&b);
    assert_eq!((a.value(), a.rights(w(1)), a.rights(w(2))), (300, 300, 0));
}

#[test]
fn states_of_another_bound_are_refused() {
    let a = BoundedCounter::new(0);
    let b = BoundedCounter::new(5);
    assert_eq!(
        a.check_merge(&b),
        Err(MergeRefused::Bound { ours: 0, theirs: 5 })
    );
    assert_eq!(a.check_merge(&a.clone()), Ok(()));
}

#[test]
fn totals_at_the_top_of_u64_are_refused() {
    let mut a = BoundedCounter::new(0);
    a.put(w(1), u64::MAX).unwrap();
    assert_eq!(a.put(w(1), 1), Err(BoundedRefused::Overflow));
    assert_eq!(a.rights(w(1)), i128::from(u64::MAX));
}
