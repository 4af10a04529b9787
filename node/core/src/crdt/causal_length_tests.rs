//! Unit tests of the causal-length set: the merge laws by proptest, the
//! derived count against a recount, and the like/unlike rules.

use proptest::prelude::*;

use super::*;

const MEMBERS: [&str; 5] = ["ann", "bob", "cy", "dee", "eve"];

/// A set reached by likes and unlikes (so every state is one a replica can hold).
fn set_strategy() -> impl Strategy<Value = CausalLengthSet> {
    prop::collection::vec((0usize..MEMBERS.len(), any::<bool>(), 0u64..3), 0..24).prop_map(|ops| {
        let mut set = CausalLengthSet::new();
        for (member, like, jump) in ops {
            // A jump merges a longer length, as a peer's state would.
            let member = MEMBERS[member];
            if jump > 0 {
                set.merge_length(member, set.length(member) + jump);
            } else if like {
                set.like(member).unwrap();
            } else {
                set.unlike(member).unwrap();
            }
        }
        set
    })
}

fn merged(a: &CausalLengthSet, b: &CausalLengthSet) -> CausalLengthSet {
    let mut out = a.clone();
    out.merge(b);
    out
}

proptest! {
    #[test]
    fn merge_obeys_the_crdt_laws(a in set_strategy(), b in set_strategy(), c in set_strategy()) {
        crate::crdt::laws::check_laws(&a, &b, &c)?;
    }

    #[test]
    fn merge_is_inflationary(a in set_strategy(), b in set_strategy()) {
        let m = merged(&a, &b);
        prop_assert!(a.is_covered_by(&m));
        prop_assert!(b.is_covered_by(&m));
    }

    /// The derived count equals a recount after any likes, unlikes and merges.
    #[test]
    fn count_always_equals_a_recount(a in set_strategy(), b in set_strategy(), c in set_strategy()) {
        prop_assert_eq!(a.count(), a.recount());
        let m = merged(&merged(&a, &b), &c);
        prop_assert_eq!(m.count(), m.recount());
    }

    /// Replicas that each take likes and unlikes of the same members and
    /// exchange states in any order agree, on every member and on the count.
    #[test]
    fn replicas_converge_in_any_merge_order(
        ops in prop::collection::vec((0usize..3, 0usize..MEMBERS.len(), any::<bool>()), 1..40),
        order in prop::collection::vec(0usize..3, 0..8),
    ) {
        let mut replicas = vec![CausalLengthSet::new(); 3];
        for (replica, member, like) in ops {
            let set = &mut replicas[replica];
            if like { set.like(MEMBERS[member]).unwrap(); } else { set.unlike(MEMBERS[member]).unwrap(); }
        }
        let mut forward = CausalLengthSet::new();
        for index in order.iter().chain([0, 1, 2].iter()) {
            forward.merge(&replicas[*index]);
        }
        let mut backward = CausalLengthSet::new();
        for replica in replicas.iter().rev() {
            backward.merge(replica);
        }
        prop_assert_eq!(&forward, &backward);
        prop_assert_eq!(forward.count(), forward.recount());
    }
}

#[test]
fn double_like_and_unlike_of_a_stranger_change_nothing() {
    let mut set = CausalLengthSet::new();
    assert_eq!(set.unlike("sam"), Ok(false));
    assert_eq!(set.length("sam"), 0);
    assert_eq!(set.like("sam"), Ok(true));
    assert_eq!(set.like("sam"), Ok(false));
    assert_eq!((set.length("sam"), set.count()), (1, 1));
}

#[test]
fn like_unlike_like_works_any_number_of_times() {
    let mut set = CausalLengthSet::new();
    for round in 1..=50u64 {
        assert_eq!(set.like("sam"), Ok(true));
        assert!(set.contains("sam"));
        assert_eq!(set.count(), 1);
        assert_eq!(set.unlike("sam"), Ok(true));
        assert!(!set.contains("sam"));
        assert_eq!((set.length("sam"), set.count()), (2 * round, 0));
    }
}

#[test]
fn concurrent_likes_in_three_regions_count_once() {
    let mut regions = vec![CausalLengthSet::new(); 3];
    for region in &mut regions {
        region.like("sam").unwrap();
    }
    let mut all = CausalLengthSet::new();
    for region in &regions {
        all.merge(region);
    }
    assert_eq!((all.count(), all.length("sam")), (1, 1));
}

#[test]
fn an_unlike_beats_a_concurrent_like_of_the_same_like_but_not_a_later_like() {
    // Region a liked (1) then unliked (2); region b saw only the like (1).
    let mut a = CausalLengthSet::new();
    a.like("sam").unwrap();
    let mut b = a.clone();
    a.unlike("sam").unwrap();
    b.merge(&a);
    assert!(!b.contains("sam"));
    // A like after seeing the unlike wins over it (length 3).
    b.like("sam").unwrap();
    a.merge(&b);
    assert_eq!((a.length("sam"), a.count()), (3, 1));
}

#[test]
fn length_at_u64_max_refuses_and_changes_nothing() {
    let mut set = CausalLengthSet::new();
    set.merge_length("sam", u64::MAX);
    let before = set.clone();
    assert_eq!(set.unlike("sam"), Err(LengthOverflow));
    assert_eq!(set.like("sam"), Ok(false));
    assert_eq!(set, before);
    assert_eq!(length_after_like(u64::MAX - 1), Ok(u64::MAX));
}

#[test]
fn members_are_checked_like_keys() {
    assert_eq!(check_member(b""), Err(MemberError::Empty));
    assert_eq!(check_member(&[b'x'; 129]), Err(MemberError::TooLong(129)));
    assert_eq!(check_member(&[0xff]), Err(MemberError::NotUtf8));
    assert_eq!(check_member(&[b'x'; 128]).map(str::len), Ok(128));
    assert!(MemberError::TooLong(129).to_string().contains("128"));
}
