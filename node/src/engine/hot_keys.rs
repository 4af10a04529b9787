//! Hot key detection: which keys take the most adds and gets right now.
//!
//! A Space-Saving sketch per operation (Metwally et al., 2005) keeps at most
//! [`SKETCH_SIZE`] keys in bounded memory whatever the key space: a key
//! already tracked is counted; a new one replaces the least-counted key and
//! inherits its count as an error bound. Counts restart every [`WINDOW`], and
//! rates come from the last complete window (or from the current one, before
//! any window completed), so a key that cools down leaves the list.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Keys tracked per operation.
pub const SKETCH_SIZE: usize = 64;
/// How long one counting window lasts.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Which operation a rate is about.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Adds.
    Add,
    /// Reads.
    Get,
}

impl Op {
    /// `"add"` or `"get"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Add => "add",
            Op::Get => "get",
        }
    }
}

/// One hot key.
#[derive(Clone, PartialEq, Debug)]
pub struct HotKey {
    /// The counter.
    pub key: Arc<str>,
    /// The operation.
    pub op: Op,
    /// Operations per second (an upper bound: Space-Saving overestimates by at most `error`).
    pub rate_per_sec: f64,
    /// Operations counted in the window.
    pub count: u64,
}

#[derive(Default)]
struct Sketch {
    /// (key, count, error): count - error <= true count <= count.
    slots: Vec<(Arc<str>, u64, u64)>,
    index: HashMap<Arc<str>, usize>,
}

impl Sketch {
    fn record(&mut self, key: &str) {
        if let Some(&slot) = self.index.get(key) {
            self.slots[slot].1 += 1;
            return;
        }
        let key: Arc<str> = Arc::from(key);
        if self.slots.len() < SKETCH_SIZE {
            self.index.insert(key.clone(), self.slots.len());
            self.slots.push((key, 1, 0));
            return;
        }
        let (slot, _) = self
            .slots
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| s.1)
            .expect("the sketch is full");
        let (old_key, min, _) = &self.slots[slot];
        self.index.remove(old_key);
        let min = *min;
        self.index.insert(key.clone(), slot);
        self.slots[slot] = (key, min + 1, min);
    }

    fn top(&self, op: Op, seconds: f64, limit: usize) -> Vec<HotKey> {
        let mut slots: Vec<&(Arc<str>, u64, u64)> = self.slots.iter().collect();
        slots.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        slots
            .into_iter()
            .take(limit)
            .map(|(key, count, _)| HotKey {
                key: key.clone(),
                op,
                rate_per_sec: *count as f64 / seconds,
                count: *count,
            })
            .collect()
    }
}

/// The sketches of both operations, windowed.
pub struct HotKeys {
    current: [Sketch; 2],
    previous: Option<[Vec<HotKey>; 2]>,
    window_start: Instant,
}

impl Default for HotKeys {
    fn default() -> Self {
        HotKeys {
            current: Default::default(),
            previous: None,
            window_start: Instant::now(),
        }
    }
}

impl HotKeys {
    /// Counts one operation on `key`.
    pub fn record(&mut self, op: Op, key: &str, now: Instant) {
        self.rotate(now);
        self.current[op as usize].record(key);
    }

    fn rotate(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed < WINDOW {
            return;
        }
        let seconds = elapsed.as_secs_f64();
        self.previous = Some([
            self.current[0].top(Op::Add, seconds, SKETCH_SIZE),
            self.current[1].top(Op::Get, seconds, SKETCH_SIZE),
        ]);
        self.current = Default::default();
        self.window_start = now;
    }

    /// The `limit` hottest keys of each operation, hottest first.
    pub fn top(&mut self, limit: usize, now: Instant) -> Vec<HotKey> {
        self.rotate(now);
        match &self.previous {
            Some([adds, gets]) => adds
                .iter()
                .take(limit)
                .chain(gets.iter().take(limit))
                .cloned()
                .collect(),
            None => {
                let seconds = now
                    .saturating_duration_since(self.window_start)
                    .as_secs_f64()
                    .max(1.0);
                let mut top = self.current[0].top(Op::Add, seconds, limit);
                top.extend(self.current[1].top(Op::Get, seconds, limit));
                top
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hottest_keys_surface_in_bounded_memory() {
        let mut hot = HotKeys::default();
        let start = hot.window_start;
        for i in 0..100_000u64 {
            // One hot key among a long tail of cold ones.
            let key = if i % 4 == 0 {
                "post:1".to_string()
            } else {
                format!("post:{}", 1000 + i)
            };
            hot.record(Op::Add, &key, start);
            if i % 10 == 0 {
                hot.record(Op::Get, "post:2", start);
            }
        }
        assert!(hot.current[0].slots.len() <= SKETCH_SIZE);
        let top = hot.top(1, start + Duration::from_secs(1));
        assert_eq!(top[0].key.as_ref(), "post:1");
        assert!(top[0].count >= 25_000, "{top:?}");
        assert_eq!((top[1].key.as_ref(), top[1].op), ("post:2", Op::Get));
    }

    #[test]
    fn rates_come_from_the_last_complete_window_and_cool_down() {
        let mut hot = HotKeys::default();
        let start = hot.window_start;
        for _ in 0..1000 {
            hot.record(Op::Add, "a", start);
        }
        let later = start + WINDOW;
        let top = hot.top(5, later);
        assert_eq!(top.len(), 1);
        assert!((top[0].rate_per_sec - 100.0).abs() < 1.0, "{top:?}");
        // A quiet window later, the key has cooled down.
        assert!(hot.top(5, later + WINDOW).is_empty());
    }
}
