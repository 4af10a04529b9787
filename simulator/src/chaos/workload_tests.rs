//! Tests of how the chaos workload reads a failed add: the classification
//! of client errors, checked against the node's own refusals as they reach
//! a client (alone or in a batch), and what a refusal of an add's only
//! attempt makes the final check expect.

use std::collections::BTreeSet;

use tally_client::Error;
use tally_node::api::convert::status_of;
use tally_node::crdt::{PnCounter, ReplicaId, Slot};
use tally_node::engine::EngineError;
use tally_node::replica::folds::WriteGate;
use tally_node::replica::AddRefused;
use tonic::Code;

use super::{classify, Failure};
use crate::chaos::check::{check_all, AddTimes};
use crate::checker::Checker;
use crate::ledger::Ledger;

/// `refused` as a client sees it: a transient code after the one attempt
/// the workload's client makes, or the code itself; and as a batch item.
fn as_client_errors(refused: AddRefused) -> [Error; 2] {
    let status = status_of(&EngineError::Add(refused));
    let message = status.message().to_string();
    let alone = match status.code() {
        Code::Unavailable => Error::Unavailable {
            attempts: 1,
            message: message.clone(),
        },
        Code::InvalidArgument => Error::InvalidArgument(message.clone()),
        Code::OutOfRange => Error::OutOfRange(message.clone()),
        code => Error::Server {
            code,
            message: message.clone(),
        },
    };
    let in_batch = match status.code() {
        Code::InvalidArgument => Error::InvalidArgument(message),
        Code::OutOfRange => Error::OutOfRange(message),
        code => Error::Server { code, message },
    };
    [alone, in_batch]
}

#[test]
fn the_node_s_refusals_that_mean_not_applied_are_classified_so() {
    let refusals = [
        AddRefused::NotServed {
            key: "post".into(),
            partition: 3,
        },
        AddRefused::WriteGated(WriteGate::Retired {
            partition: 3,
            phase: 0,
        }),
        AddRefused::WriteGated(WriteGate::NotApplied {
            partition: 3,
            epoch: 2,
            applied: 1,
        }),
        AddRefused::Counter(tally_node::crdt::AddError::ZeroDelta),
        AddRefused::Counter(tally_node::crdt::AddError::ValueOutOfRange),
        AddRefused::Fenced(ReplicaId(9)),
    ];
    for refused in refusals {
        let text = refused.to_string();
        for error in as_client_errors(refused) {
            assert_eq!(classify(&error), Failure::NotApplied, "{text}: {error}");
        }
    }
}

#[test]
fn failures_of_unknown_fate_are_never_classified_not_applied() {
    let down = Error::Unavailable {
        attempts: 1,
        message: "tcp connect error: Connection refused".into(),
    };
    assert_eq!(classify(&down), Failure::Transient);
    let slow = Error::Timeout {
        deadline: std::time::Duration::from_secs(5),
        attempts: 1,
    };
    assert_eq!(classify(&slow), Failure::Transient);
    // A node starting up holds adds back (UNAVAILABLE): try again.
    let held = AddRefused::HeldAfterRestart {
        replica: ReplicaId(7),
        remaining_ms: 300,
    };
    for error in as_client_errors(held) {
        assert_eq!(classify(&error), Failure::Transient, "{error}");
    }
    let internal = Error::Server {
        code: Code::Internal,
        message: "panic in a handler".into(),
    };
    assert_eq!(classify(&internal), Failure::Unknown);
}

/// One add of lane 0 (+1) to key 0 at a live replica, refused at its only
/// attempt; the final state holds `slot` of that replica.
fn check_refused(slot: Slot) -> u64 {
    let replica = ReplicaId(7);
    let mut checker = Checker::new(1, 1);
    checker.started_fresh(0, 0, replica);
    let mut ledger = Ledger::new(1, 1);
    let id = ledger.issue(0, 0, 0, false, true).unwrap();
    ledger.delivered(id, replica);
    ledger.not_applied(id, replica);
    let times = AddTimes {
        sent: vec![1],
        answered: vec![2],
    };
    let finals = vec![PnCounter::from_slots([(replica, slot)])];
    check_all(&mut checker, &ledger, &times, &finals, &BTreeSet::new());
    checker.violation_count
}

#[test]
fn an_add_refused_as_not_applied_fails_the_check_if_its_node_applied_it() {
    assert_eq!(check_refused(Slot::default()), 0, "not applied: fine");
    assert_ne!(
        check_refused(Slot { p: 1, n: 0 }),
        0,
        "applied and refused: the check must fail"
    );
    // The same add abandoned (fate unknown) may be in the slot or not.
    let replica = ReplicaId(7);
    let mut checker = Checker::new(1, 1);
    checker.started_fresh(0, 0, replica);
    let mut ledger = Ledger::new(1, 1);
    let id = ledger.issue(0, 0, 0, false, true).unwrap();
    ledger.delivered(id, replica);
    ledger.abandon(id);
    let times = AddTimes {
        sent: vec![1],
        answered: vec![2],
    };
    let finals = vec![PnCounter::from_slots([(replica, Slot { p: 1, n: 0 })])];
    check_all(&mut checker, &ledger, &times, &finals, &BTreeSet::new());
    assert_eq!(checker.violation_count, 0, "an unknown fate may be applied");
}
