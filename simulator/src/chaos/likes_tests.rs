//! Tests of the chaos like-set check and of how answers are booked.

use super::*;

/// A node's state with the lengths the book below explains exactly.
fn held(liked: Vec<bool>) -> HeldLikes {
    let count = liked.iter().filter(|l| **l).count() as u64;
    let lengths = [1, 0, if liked[2] { 1 } else { 2 }];
    HeldLikes {
        lengths: lengths[..liked.len()].to_vec(),
        liked,
        count,
        recount_consistent: true,
        distinct: (10, 7),
    }
}

fn book() -> LikeBook {
    let mut members = vec![MemberOps::default(); 3];
    // Two likes, the second changed nothing; three unlikes, none changed.
    members[0] = MemberOps {
        likes_acked: 2,
        longest_answer: 1,
        may_raise: 1,
        ..Default::default()
    };
    members[1] = MemberOps {
        unlikes: 3,
        ..Default::default()
    };
    // A like answered with length 1, then an unlike never answered:
    // length 1 or 2, liked or not.
    members[2] = MemberOps {
        likes_acked: 1,
        unlikes: 1,
        longest_answer: 1,
        may_raise: 2,
        length_unknown: 1,
        ..Default::default()
    };
    LikeBook {
        members,
        observed_acked: 10,
        observed_issued: 11,
    }
}

#[test]
fn the_check_passes_an_exact_state_and_catches_each_wrong_one() {
    let right = held(vec![true, false, false]);
    assert!(check(&book(), &[right.clone(), right.clone()], true).is_empty());
    // A mixed member may come out either way, but everywhere the same.
    let other = held(vec![true, false, true]);
    assert!(check(&book(), &[other.clone(), other.clone()], true).is_empty());
    let kinds = |held: &[HeldLikes]| -> Vec<&'static str> {
        check(&book(), held, true)
            .into_iter()
            .map(|(kind, _)| kind)
            .collect()
    };
    assert_eq!(
        kinds(&[right.clone(), other]),
        ["like sets differ", "like lengths differ"]
    );
    // A liked-only member lost, an unliked-only member liked.
    assert!(kinds(&[held(vec![false, false, false])]).contains(&"like state not exact"));
    assert!(kinds(&[held(vec![true, true, false])]).contains(&"like state not exact"));
    let mut drifted = right.clone();
    drifted.count = 2;
    assert_eq!(kinds(&[drifted]), ["derived count wrong"]);
    let mut registers = right.clone();
    registers.distinct.1 = 8;
    assert_eq!(kinds(&[right.clone(), registers]), ["like sets differ"]);
    let mut estimate = right.clone();
    estimate.distinct.0 = 30;
    assert_eq!(kinds(&[estimate]), ["uniques estimate out of range"]);
}

#[test]
fn lengths_must_agree_match_liked_and_be_explained_by_the_answers() {
    let right = held(vec![true, false, false]);
    let kinds = |held: &[HeldLikes]| -> Vec<&'static str> {
        check(&book(), held, true)
            .into_iter()
            .map(|(kind, _)| kind)
            .collect()
    };
    let mut other = right.clone();
    other.lengths[2] = 4;
    other.liked[2] = false;
    assert!(kinds(&[right.clone(), other]).contains(&"like lengths differ"));
    let mut even = right.clone();
    even.lengths[0] = 2;
    assert!(kinds(&[even]).contains(&"liked but length even"));
    // Member 0: every operation was answered, the longest with 1; a
    // length of 3 (liked, but a like counted twice) is caught.
    let mut doubled = right.clone();
    doubled.lengths[0] = 3;
    assert_eq!(kinds(&[doubled]), ["like length not exact"]);
    // Member 2: answered 1, so 0 lost the acknowledged like; 4 is more
    // than its two operations could raise it to.
    let mut lost = right.clone();
    lost.lengths[2] = 0;
    assert_eq!(kinds(&[lost]), ["like length not exact"]);
    let mut long = right.clone();
    long.lengths[2] = 4;
    assert_eq!(kinds(&[long]), ["like length not exact"]);
    // After a wipe only agreement is required.
    let mut lost = right;
    lost.lengths[2] = 0;
    assert!(check(&book(), &[lost], false).is_empty());
}

#[test]
fn answers_are_booked_with_their_lengths() {
    let answer = |changed, duplicate, length| LikeResponse {
        changed,
        liked: length % 2 == 1,
        count: 1,
        duplicate,
        length,
    };
    let mut ops = MemberOps::default();
    ops.record(true, Some(&answer(true, false, 1)));
    ops.record(true, Some(&answer(false, false, 1)));
    assert_eq!(
        (ops.longest_answer, ops.may_raise, ops.length_unknown),
        (1, 1, 0)
    );
    ops.record(false, Some(&answer(false, true, 0)));
    ops.record(true, None);
    assert_eq!(
        (ops.longest_answer, ops.may_raise, ops.length_unknown),
        (1, 3, 2)
    );
    assert_eq!((ops.likes_acked, ops.likes_unknown, ops.unlikes), (2, 1, 1));
}
