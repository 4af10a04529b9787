//! The folded-base search: the submask decoding, and the meet in the
//! middle against the depth-first search on random cases (the same answer,
//! found or not, with the same fewest losses).

use super::*;
use rand::SeedableRng;

use crate::rng::{between, SimRng};

/// A uniform integer in `0..bound`.
fn below(rng: &mut SimRng, bound: u64) -> u64 {
    between(rng, 0, bound.saturating_sub(1))
}

#[test]
fn a_target_is_a_sum_of_submasks_when_the_bits_and_carries_allow() {
    assert!(sum_of_submasks(0, &[]));
    assert!(!sum_of_submasks(1, &[]));
    assert!(sum_of_submasks(3, &[1, 2]));
    assert!(
        sum_of_submasks(2, &[1, 1]),
        "two adds of one magnitude carry"
    );
    assert!(!sum_of_submasks(4, &[1, 1]));
    assert!(sum_of_submasks(4, &[3, 1]));
    assert!(sum_of_submasks(0, &[3, 1]), "nothing applied");
    assert!(!sum_of_submasks(5, &[4]));
    assert!(sum_of_submasks(1 << 64, &[1 << 63, 1 << 63]));
}

#[test]
fn submasks_are_every_subset_of_the_bits_once() {
    let mut all: Vec<u64> = submasks(0b1011).collect();
    all.sort_unstable();
    assert_eq!(all, vec![0, 1, 2, 3, 8, 9, 10, 11]);
    assert_eq!(submasks(0).collect::<Vec<_>>(), vec![0]);
}

/// A writer's instants as a run would make them: acknowledged sums that
/// only grow, a few lanes in flight, losses that only shrink with time
/// (latest first, as `check::slot_instants` lists them).
fn random_writer(rng: &mut SimRng, instants: usize) -> Vec<SlotAt> {
    let (mut p, mut n) = (0u64, 0u64);
    let mut out: Vec<SlotAt> = (0..instants)
        .map(|i| {
            p += below(rng, 3) * (1 << below(rng, 3));
            n += below(rng, 2);
            SlotAt {
                p,
                n,
                unknown_p: below(rng, 8),
                unknown_n: below(rng, 2),
                lost: (instants - i) as u64 - 1,
            }
        })
        .collect();
    out.reverse();
    out
}

#[test]
fn meeting_in_the_middle_finds_what_the_depth_first_search_finds() {
    let mut rng = SimRng::seed_from_u64(15);
    let mut explained = 0;
    for case in 0..400 {
        let count = 1 + (case % 4);
        let writers: Vec<Vec<SlotAt>> = (0..count)
            .map(|_| {
                let instants = 1 + below(&mut rng, 6) as usize;
                random_writer(&mut rng, instants)
            })
            .collect();
        // Bases near the writers' sums, so that some are explained and some not.
        let top_p: u64 = writers.iter().map(|w| w[0].p + w[0].unknown_p).sum();
        let top_n: u64 = writers.iter().map(|w| w[0].n + w[0].unknown_n).sum();
        let base = (
            u128::from(below(&mut rng, top_p + 2)),
            u128::from(below(&mut rng, top_n + 2)),
        );
        let deep = depth_first(&writers, base.0, base.1).expect("small cases are decided");
        let middle = meet_in_the_middle(&writers, base).expect("small cases fit");
        assert_eq!(
            middle, deep,
            "case {case}: base {base:?}, writers {writers:?}"
        );
        explained += usize::from(deep.is_some());
    }
    assert!(
        explained > 50,
        "too few explained cases to compare: {explained}"
    );
}

#[test]
fn four_replicas_with_many_instants_each_are_decided() {
    // The case of chaos seed 503's hot key: four folded replicas with
    // hundreds of instants each, every one cut off some instants before its
    // end. The depth-first search gives up (300^4 choices); meeting in the
    // middle decides it, with at most the losses of the instants used.
    let mut rng = SimRng::seed_from_u64(503);
    let writers: Vec<Vec<SlotAt>> = (0..4).map(|_| random_writer(&mut rng, 300)).collect();
    let chosen: Vec<&SlotAt> = writers.iter().map(|w| &w[100]).collect();
    let base_p: u128 = chosen.iter().map(|at| u128::from(at.p)).sum();
    let base_n: u128 = chosen.iter().map(|at| u128::from(at.n)).sum();
    let lost: u64 = chosen.iter().map(|at| at.lost).sum();
    assert_eq!(depth_first(&writers, base_p, base_n), Err(Undecided));
    let found = explain_base(&writers, base_p, base_n).unwrap();
    assert!(
        found.is_some_and(|found| found <= lost),
        "{found:?} (at most {lost})"
    );
    assert_eq!(
        explain_base(&writers, base_p + (1 << 40), base_n),
        Ok(None),
        "more than every add"
    );
}
