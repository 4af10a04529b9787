//! `Watch` fan-out: one `tokio::sync::watch` channel per watched counter.
//!
//! A watch channel keeps only the latest value, so a hot key costs one store
//! of an integer per change whatever the number of subscribers, and each
//! subscriber reads the newest value at its own pace (coalescing). Counters
//! nobody watches cost one atomic load per change.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLock;

use tokio::sync::watch;

use crate::crdt::{PnCounter, ValueOutOfRange};

type Value = Result<i64, ValueOutOfRange>;

/// The watched counters.
#[derive(Default)]
pub struct Watchers {
    channels: RwLock<HashMap<String, watch::Sender<Value>>>,
    watched: AtomicUsize,
}

impl Watchers {
    /// A receiver for `key`, starting at `current`.
    pub fn subscribe(&self, key: &str, current: Value) -> watch::Receiver<Value> {
        let mut channels = self.channels.write().unwrap_or_else(|p| p.into_inner());
        let receiver = {
            let sender = channels
                .entry(key.to_string())
                .or_insert_with(|| watch::channel(current).0);
            let _ = sender.send_replace(current);
            sender.subscribe()
        };
        self.watched.store(channels.len(), Ordering::Relaxed);
        receiver
    }

    /// A counter changed to `value`.
    pub fn notify(&self, key: &str, value: i64) {
        self.publish(key, Ok(value));
    }

    /// A counter changed to `state` (by a merge).
    pub fn notify_state(&self, key: &str, state: &PnCounter) {
        self.publish(key, state.value());
    }

    fn publish(&self, key: &str, value: Value) {
        if self.watched.load(Ordering::Relaxed) == 0 {
            return;
        }
        let channels = self.channels.read().unwrap_or_else(|p| p.into_inner());
        if let Some(sender) = channels.get(key) {
            let _ = sender.send_replace(value);
        }
    }

    /// Drops the channels nobody listens to any more.
    pub fn prune(&self) {
        if self.watched.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut channels = self.channels.write().unwrap_or_else(|p| p.into_inner());
        channels.retain(|_, sender| sender.receiver_count() > 0);
        self.watched.store(channels.len(), Ordering::Relaxed);
    }
}
