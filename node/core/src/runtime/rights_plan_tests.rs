//! The rights planner: clear cases of giving to faster sellers and asking
//! the largest holders, and proptests that a plan never sends more than
//! the local rights less the reserve, nor asks more than is missing, and
//! does not depend on the order of its inputs.

use proptest::prelude::*;

use super::*;

fn w(id: u64) -> ReplicaId {
    ReplicaId(id)
}

fn load(writer: u64, rights: u64, takes_per_second: u64) -> WriterLoad {
    WriterLoad {
        writer: w(writer),
        rights,
        milli_rate: takes_per_second * 1000,
    }
}

fn moves(pairs: &[(u64, u64)]) -> Vec<RightsMove> {
    pairs
        .iter()
        .map(|(writer, amount)| RightsMove {
            writer: w(*writer),
            amount: *amount,
        })
        .collect()
}

const HORIZON: PlanHorizon = PlanHorizon {
    reserve_seconds: 10,
    horizon_seconds: 20,
};

#[test]
fn a_slow_writer_gives_its_spare_to_faster_ones_fastest_first() {
    // Writer 1 sells 1 a second: it keeps 10, offers 190. Writer 3 sells 5
    // a second and needs 100 - 10; writer 2 sells 3 and needs 60; writer 4
    // is slower than writer 1 and gets nothing.
    let loads = [
        load(1, 200, 1),
        load(2, 0, 3),
        load(3, 10, 5),
        load(4, 0, 0),
    ];
    assert_eq!(
        plan_transfers(w(1), &loads, HORIZON),
        moves(&[(3, 90), (2, 60)])
    );
    // With less to spare, the fastest is served first.
    let loads = [load(1, 110, 1), load(2, 0, 3), load(3, 10, 5)];
    assert_eq!(
        plan_transfers(w(1), &loads, HORIZON),
        moves(&[(3, 90), (2, 10)])
    );
    // Nothing beyond the reserve, or nobody faster: no transfer.
    let loads = [load(1, 10, 1), load(3, 0, 5)];
    assert_eq!(plan_transfers(w(1), &loads, HORIZON), vec![]);
    let loads = [load(1, 500, 9), load(3, 0, 5)];
    assert_eq!(plan_transfers(w(1), &loads, HORIZON), vec![]);
}

#[test]
fn equal_rates_go_to_the_lower_id_first() {
    let loads = [load(9, 0, 4), load(1, 25, 0), load(5, 0, 4)];
    assert_eq!(plan_transfers(w(1), &loads, HORIZON), moves(&[(5, 25)]));
}

#[test]
fn a_short_take_asks_the_largest_holders_first() {
    let loads = [
        load(1, 2, 5),
        load(2, 5, 0),
        load(3, 5, 0),
        load(4, 1, 0),
        load(5, 9, 0),
    ];
    let requests = plan_requests(w(1), &loads, 20);
    assert_eq!(requests.asks, moves(&[(5, 9), (2, 5), (3, 4)]));
    assert_eq!(requests.uncovered, 0);
    // More than everybody holds: ask all, and say what stays uncovered.
    let requests = plan_requests(w(1), &loads, 30);
    assert_eq!(requests.asks, moves(&[(5, 9), (2, 5), (3, 5), (4, 1)]));
    assert_eq!(requests.uncovered, 8);
    // Covered locally: ask nobody.
    assert_eq!(plan_requests(w(1), &loads, 2), RightsRequests::default());
}

fn loads_strategy() -> impl Strategy<Value = (Vec<WriterLoad>, usize)> {
    // Rights up to a billion; rates up to 10,000 takes a second.
    let writer = (0u64..1_000_000_000, 0u64..10_000_000);
    prop::collection::btree_map(0u64..20, writer, 1..8).prop_flat_map(|writers| {
        let loads: Vec<WriterLoad> = writers
            .into_iter()
            .map(|(writer, (rights, milli_rate))| WriterLoad {
                writer: w(writer),
                rights,
                milli_rate,
            })
            .collect();
        let len = loads.len();
        (Just(loads), 0..len)
    })
}

proptest! {
    #[test]
    fn a_plan_never_sends_more_than_the_local_rights(
        (loads, local) in loads_strategy(),
        reserve_seconds in 0u64..100,
        horizon_seconds in 0u64..10_000,
        asked in any::<u64>(),
        rotate in 0usize..8,
    ) {
        let horizon = PlanHorizon { reserve_seconds, horizon_seconds };
        let own = loads[local];
        let plan = plan_transfers(own.writer, &loads, horizon);
        let sent: u128 = plan.iter().map(|m| u128::from(m.amount)).sum();
        let reserve = takes_in(own.milli_rate, reserve_seconds);
        prop_assert!(sent <= u128::from(own.rights.saturating_sub(reserve)), "sent {} of {}", sent, own.rights);
        for (at, planned) in plan.iter().enumerate() {
            prop_assert!(planned.amount > 0 && planned.writer != own.writer);
            prop_assert!(plan[..at].iter().all(|earlier| earlier.writer != planned.writer));
        }
        let requests = plan_requests(own.writer, &loads, asked);
        let asks: u128 = requests.asks.iter().map(|m| u128::from(m.amount)).sum();
        prop_assert_eq!(
            asks + u128::from(requests.uncovered) + u128::from(own.rights.min(asked)),
            u128::from(asked)
        );
        for ask in &requests.asks {
            let holder = loads.iter().find(|l| l.writer == ask.writer).map_or(0, |l| l.rights);
            prop_assert!(ask.amount > 0 && ask.amount <= holder && ask.writer != own.writer);
        }
        // The order of the inputs changes nothing.
        let mut rotated = loads.clone();
        rotated.rotate_left(rotate % loads.len());
        prop_assert_eq!(plan_transfers(own.writer, &rotated, horizon), plan);
        prop_assert_eq!(plan_requests(own.writer, &rotated, asked), requests);
    }
}
