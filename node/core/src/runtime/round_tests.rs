//! Tests of a node's partitions as its runtime drives them: what a data
//! directory serves once recovered.

use super::*;
use crate::partition::{LifecycleRecord, NodeState, Partition, PartitionCount, PartitionSet};

#[test]
fn a_directory_serves_what_its_record_names_or_everything_it_held_before_handoff() {
    let count = PartitionCount::new(8).unwrap();
    let mut named = PartitionSet::empty(count);
    named.insert(Partition(5));
    let record = |serving: Option<PartitionSet>| LifecycleRecord {
        state: NodeState::Active,
        removed: Default::default(),
        serving,
    };
    let with = record(Some(named.clone()));
    assert_eq!(recovered_serving(Some(&with), count, true), named);
    let before_handoff = record(None);
    assert!(recovered_serving(Some(&before_handoff), count, false).is_full());
    assert!(
        recovered_serving(None, count, true).is_full(),
        "data, no record"
    );
    assert!(
        recovered_serving(None, count, false).is_empty(),
        "a new directory"
    );
}
