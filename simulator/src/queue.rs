//! The event queue of the simulated worlds: events ordered by simulated
//! time, then by insertion, so that two events at the same millisecond run
//! in the order they were scheduled.
//!
//! Invariant: the order of events depends only on their times and on the
//! order of `schedule` calls, never on the events themselves, which keeps a
//! run a function of its seed.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

struct Scheduled<E> {
    at: u64,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Scheduled<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<E> Eq for Scheduled<E> {}
impl<E> PartialOrd for Scheduled<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Scheduled<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap is a max-heap: the earliest (time, seq) must compare greatest.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// See the module documentation.
pub struct EventQueue<E> {
    heap: BinaryHeap<Scheduled<E>>,
    seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }
}

impl<E> EventQueue<E> {
    /// Schedules `event` at simulated time `at`.
    pub fn schedule(&mut self, at: u64, event: E) {
        self.seq += 1;
        self.heap.push(Scheduled {
            at,
            seq: self.seq,
            event,
        });
    }

    /// The earliest event and its time.
    pub fn pop(&mut self) -> Option<(u64, E)> {
        self.heap
            .pop()
            .map(|scheduled| (scheduled.at, scheduled.event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_out_by_time_then_by_insertion() {
        let mut queue = EventQueue::default();
        queue.schedule(5, "b");
        queue.schedule(3, "a");
        queue.schedule(5, "c");
        let order: Vec<(u64, &str)> = std::iter::from_fn(|| queue.pop()).collect();
        assert_eq!(order, vec![(3, "a"), (5, "b"), (5, "c")]);
    }
}
