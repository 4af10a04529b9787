//! Rate-limited warnings from the gossip library (issue #10, item 16).
//!
//! Chitchat logs one WARN per UDP datagram it cannot decode and per message
//! of another cluster (about ten a second from one misconfigured node, on
//! both sides), so anyone who can reach the gossip port can flood the log.
//! [`FloodGuard`] is a `tracing` layer that lets the first WARN of each of
//! chitchat's call sites through, counts the repeats, and logs one summary
//! per [`SUMMARY_PERIOD`] with the count (and the first message) while they
//! go on. Other events pass untouched.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// How often repeated warnings are summarised.
pub const SUMMARY_PERIOD: Duration = Duration::from_secs(60);

/// One kind of warning, rate-limited: the first occurrence is logged in full
/// and opens a window; the ones within the window are counted and
/// summarised when it ends (a new window then opens). A window without
/// repeats closes quietly, and the next occurrence is logged in full again.
/// Time is an input, so this is plain logic.
#[derive(Debug)]
pub struct RepeatedWarning {
    period: Duration,
    /// When the current window opened, and how many repeats it counted.
    window: Option<(Instant, u64)>,
}

impl RepeatedWarning {
    /// A warning summarised every `period`.
    pub fn new(period: Duration) -> Self {
        RepeatedWarning {
            period,
            window: None,
        }
    }

    /// Notes an occurrence; true when it is to be logged in full.
    pub fn handle_occurrence(&mut self, now: Instant) -> bool {
        match &mut self.window {
            Some((opened, 0)) if now.saturating_duration_since(*opened) >= self.period => {
                *opened = now;
                true
            }
            Some((_, repeats)) => {
                *repeats += 1;
                false
            }
            None => {
                self.window = Some((now, 0));
                true
            }
        }
    }

    /// The count of repeats to summarise, once the window has run its period
    /// with repeats in it.
    pub fn poll_summary(&mut self, now: Instant) -> Option<u64> {
        let (opened, repeats) = self.window?;
        if now.saturating_duration_since(opened) < self.period {
            return None;
        }
        if repeats == 0 {
            self.window = None;
            return None;
        }
        self.window = Some((now, 0));
        Some(repeats)
    }
}

/// The layer (see the module docs). Cloning shares the counts.
#[derive(Clone, Default)]
pub struct FloodGuard {
    warnings: Arc<Mutex<HashMap<Identifier, (RepeatedWarning, String)>>>,
}

impl FloodGuard {
    /// A guard whose summaries a background thread logs, checking every second.
    pub fn spawn() -> FloodGuard {
        let guard = FloodGuard::default();
        let summaries = guard.clone();
        std::thread::Builder::new()
            .name("log-summaries".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_secs(1));
                summaries.log_summaries(Instant::now());
            })
            .expect("spawning the log summary thread");
        guard
    }

    /// Logs the summaries that are due.
    pub fn log_summaries(&self, now: Instant) {
        let due: Vec<(u64, String)> = {
            let mut warnings = self.warnings.lock().unwrap_or_else(|p| p.into_inner());
            warnings
                .values_mut()
                .filter_map(|(warning, first)| {
                    warning
                        .poll_summary(now)
                        .map(|count| (count, first.clone()))
                })
                .collect()
        };
        for (count, first) in due {
            tracing::warn!(
                count,
                "{count} more gossip warnings like this one in the last minute, not logged one by one: {first}"
            );
        }
    }
}

impl<S: Subscriber> Layer<S> for FloodGuard {
    fn event_enabled(&self, event: &Event<'_>, _context: Context<'_, S>) -> bool {
        let metadata = event.metadata();
        if *metadata.level() != Level::WARN || !metadata.target().starts_with("chitchat") {
            return true;
        }
        let mut warnings = self.warnings.lock().unwrap_or_else(|p| p.into_inner());
        let (warning, _) = warnings
            .entry(metadata.callsite())
            .or_insert_with(|| (RepeatedWarning::new(SUMMARY_PERIOD), describe(event)));
        warning.handle_occurrence(Instant::now())
    }
}

/// The event's message and fields, as one line.
fn describe(event: &Event<'_>) -> String {
    struct Fields(String);
    impl tracing::field::Visit for Fields {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            use std::fmt::Write;
            if !self.0.is_empty() {
                self.0.push(' ');
            }
            if field.name() == "message" {
                let _ = write!(self.0, "{value:?}");
            } else {
                let _ = write!(self.0, "{}={value:?}", field.name());
            }
        }
    }
    let mut fields = Fields(String::new());
    event.record(&mut fields);
    format!("{} ({})", fields.0, event.metadata().target())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_is_logged_then_one_summary_per_period() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut warning = RepeatedWarning::new(Duration::from_secs(60));
        assert!(warning.handle_occurrence(at(0)), "the first is logged");
        for ms in 1..=599 {
            assert!(!warning.handle_occurrence(at(ms * 100)), "then counted");
        }
        assert_eq!(
            warning.poll_summary(at(59_999)),
            None,
            "not before the period"
        );
        assert_eq!(warning.poll_summary(at(60_000)), Some(599));
        assert_eq!(
            warning.poll_summary(at(60_001)),
            None,
            "one summary per period"
        );
        assert!(
            !warning.handle_occurrence(at(70_000)),
            "the flood goes on: counted"
        );
        assert_eq!(warning.poll_summary(at(120_000)), Some(1));
        assert_eq!(
            warning.poll_summary(at(180_000)),
            None,
            "a quiet period closes the window"
        );
        assert!(
            warning.handle_occurrence(at(190_000)),
            "a new flood is logged again"
        );
    }
}
