//! The status page's charts: the last two minutes of this node's adds per
//! second, replication lag per peer and commit latency, sampled once a
//! second from its own numbers (the `tally_adds_total` and
//! `tally_commits_total` counters, the group commits' summed time, and each
//! peer's last sync and sequence lag as `/status.json` shows them), kept in
//! memory, drawn as inline SVG on `/status` and listed under `charts` in
//! `/status.json`.
//!
//! The history holds at most [`SAMPLES`] samples (a few kilobytes); a
//! sample's rates are over the interval since the one before, so the first
//! sample after a start has none.

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::status_page::escape;
use crate::engine::{now_ms, Engine};

/// How many samples the history keeps: two minutes at one a second.
pub const SAMPLES: usize = 120;
/// The gap between two samples.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// One peer's replication lag when a sample was taken.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeerLag {
    /// The peer's node name.
    pub node: String,
    /// Its region.
    pub region: String,
    /// Milliseconds since this node last completed a pull from it (`None`: never).
    pub since_last_sync_ms: Option<u64>,
    /// Sequence numbers this node's watermark trails the peer's durable sequence.
    pub seq_lag: u64,
}

/// What the node's numbers said at one moment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sample {
    /// When (Unix milliseconds).
    pub at_ms: u64,
    /// Adds applied per second since the sample before (`None` for the first).
    pub adds_per_sec: Option<f64>,
    /// The mean group commit's duration since the sample before, in
    /// milliseconds (`None`: no commit in between).
    pub commit_ms: Option<f64>,
    /// Every peer's lag.
    pub lag: Vec<PeerLag>,
}

/// The running totals a sample's rates are taken from.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    at_ms: u64,
    adds: u64,
    commits: u64,
    commit_seconds: f64,
}

/// The samples, oldest first.
#[derive(Debug, Default)]
pub struct ChartHistory {
    inner: Mutex<(VecDeque<Sample>, Option<Totals>)>,
}

impl ChartHistory {
    /// Records the totals read at `now` and the peers' lag.
    fn record(&self, now: Totals, lag: Vec<PeerLag>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (samples, last) = &mut *inner;
        let (adds_per_sec, commit_ms) = match last {
            Some(before) if now.at_ms > before.at_ms => {
                let seconds = (now.at_ms - before.at_ms) as f64 / 1000.0;
                let adds = now.adds.saturating_sub(before.adds) as f64 / seconds;
                let commits = now.commits.saturating_sub(before.commits);
                let commit_ms = (commits > 0).then(|| {
                    (now.commit_seconds - before.commit_seconds).max(0.0) * 1000.0 / commits as f64
                });
                (Some(adds), commit_ms)
            }
            _ => (None, None),
        };
        *last = Some(now);
        if samples.len() == SAMPLES {
            samples.pop_front();
        }
        samples.push_back(Sample {
            at_ms: now.at_ms,
            adds_per_sec,
            commit_ms,
            lag,
        });
    }

    /// The samples, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.0.iter().cloned().collect()
    }

    /// Takes one sample of `engine`'s numbers.
    pub fn sample(&self, engine: &Engine, info: &crate::api::NodeInfo) {
        let metrics = engine.metrics();
        let totals = Totals {
            at_ms: now_ms(),
            adds: metrics.adds.get(),
            commits: metrics.commits.get(),
            commit_seconds: metrics.commit_micros_total.get() as f64 / 1e6,
        };
        let status = crate::api::admin::status(engine, info);
        let lag = status
            .members
            .iter()
            .map(|member| PeerLag {
                node: member.node_name.clone(),
                region: member.region.clone(),
                since_last_sync_ms: member.since_last_sync_ms,
                seq_lag: member.seq_lag,
            })
            .collect();
        self.record(totals, lag);
    }
}

/// Samples `engine` every [`SAMPLE_INTERVAL`] into `history` until aborted
/// (the node aborts it when it shuts down).
pub fn spawn_sampler(
    engine: Arc<Engine>,
    info: crate::api::NodeInfo,
    history: Arc<ChartHistory>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(SAMPLE_INTERVAL);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            history.sample(&engine, &info);
        }
    })
}

/// The history as `/status.json`'s `charts`.
pub fn to_json(samples: &[Sample]) -> serde_json::Value {
    serde_json::json!({
        "interval_ms": SAMPLE_INTERVAL.as_millis() as u64,
        "samples": samples,
    })
}

/// Chart size in SVG units.
const WIDTH: f64 = 300.0;
const HEIGHT: f64 = 80.0;
/// Line colours, one per series (peers beyond these reuse them).
const COLOURS: [&str; 6] = [
    "#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2",
];

/// A named series of (time, value) points; `None` values are gaps.
struct Series {
    name: String,
    points: Vec<(u64, Option<f64>)>,
}

/// One chart: an `<svg id="chart-{id}">` with a polyline per series whose
/// `points` are the drawn values (`data-points` counts them), the largest
/// value as its scale, and a legend with each series' latest value.
fn chart(html: &mut String, id: &str, title: &str, unit: &str, series: &[Series]) {
    let first = series
        .iter()
        .flat_map(|s| s.points.first())
        .map(|p| p.0)
        .min();
    let last = series
        .iter()
        .flat_map(|s| s.points.last())
        .map(|p| p.0)
        .max();
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().filter_map(|p| p.1))
        .fold(0.0_f64, f64::max);
    let scale = if top > 0.0 { top * 1.1 } else { 1.0 };
    let _ = write!(
        html,
        "<figure class=\"chart\"><figcaption>{title} <span class=\"sub\">(max {top:.1} {unit})</span></figcaption>\
         <svg id=\"chart-{id}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" role=\"img\" \
         aria-label=\"{title}\"><rect width=\"{WIDTH}\" height=\"{HEIGHT}\" fill=\"#fff\"/>",
        title = escape(title),
    );
    let span = match (first, last) {
        (Some(first), Some(last)) if last > first => (first, (last - first) as f64),
        (Some(first), _) => (first, 1.0),
        _ => (0, 1.0),
    };
    let mut legend = String::new();
    for (index, one) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        let drawn: Vec<String> = one
            .points
            .iter()
            .filter_map(|(at, value)| {
                let value = (*value)?;
                let x = (at.saturating_sub(span.0)) as f64 / span.1 * WIDTH;
                let y = HEIGHT - value / scale * HEIGHT;
                Some(format!("{x:.1},{y:.1}"))
            })
            .collect();
        let _ = write!(
            html,
            "<polyline class=\"series\" data-series=\"{name}\" data-points=\"{count}\" points=\"{points}\" \
             fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\"/>",
            name = escape(&one.name),
            count = drawn.len(),
            points = drawn.join(" "),
        );
        let latest = one
            .points
            .iter()
            .rev()
            .find_map(|p| p.1)
            .map_or("—".to_string(), |v| format!("{v:.1} {unit}"));
        let _ = write!(
            legend,
            "<span style=\"color:{colour}\">■</span> {} {latest} ",
            escape(&one.name)
        );
    }
    let _ = write!(
        html,
        "</svg><div class=\"legend\">{}</div></figure>",
        if series.is_empty() {
            "no peers yet".to_string()
        } else {
            legend
        }
    );
}

/// The charts section of the status page.
pub fn render(html: &mut String, samples: &[Sample]) {
    html.push_str("<h2>The last two minutes on this node</h2><div class=\"charts\">");
    let adds = Series {
        name: "adds".into(),
        points: samples.iter().map(|s| (s.at_ms, s.adds_per_sec)).collect(),
    };
    chart(html, "adds", "Adds per second", "/s", &[adds]);
    let mut peers: Vec<(String, String)> = samples
        .iter()
        .flat_map(|s| {
            s.lag
                .iter()
                .map(|lag| (lag.node.clone(), lag.region.clone()))
        })
        .collect();
    peers.sort();
    peers.dedup();
    let lag: Vec<Series> = peers
        .iter()
        .map(|(node, region)| Series {
            name: format!("{node} ({region})"),
            points: samples
                .iter()
                .map(|s| {
                    let lag = s.lag.iter().find(|lag| lag.node == *node);
                    (
                        s.at_ms,
                        lag.and_then(|lag| lag.since_last_sync_ms)
                            .map(|ms| ms as f64),
                    )
                })
                .collect(),
        })
        .collect();
    chart(
        html,
        "lag",
        "Replication lag per peer (since its last sync)",
        "ms",
        &lag,
    );
    let commit = Series {
        name: "mean commit".into(),
        points: samples.iter().map(|s| (s.at_ms, s.commit_ms)).collect(),
    };
    chart(html, "commit", "Commit latency", "ms", &[commit]);
    html.push_str("</div>");
}

/// The charts' style, added to the status page's.
pub const STYLE: &str =
    ".charts{display:flex;flex-wrap:wrap;gap:1rem}.chart{margin:0;background:#fff;\
padding:.5rem;box-shadow:0 1px 2px #0002}.chart figcaption{font-size:.85rem;margin-bottom:.3rem}\
.chart svg{display:block}.legend{font-size:.75rem;color:#5b6475;max-width:300px}";

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(at_ms: u64, adds: u64, commits: u64, commit_seconds: f64) -> Totals {
        Totals {
            at_ms,
            adds,
            commits,
            commit_seconds,
        }
    }

    fn lag(node: &str, ms: u64) -> PeerLag {
        PeerLag {
            node: node.into(),
            region: "us".into(),
            since_last_sync_ms: Some(ms),
            seq_lag: 3,
        }
    }

    #[test]
    fn samples_are_rates_over_the_interval_before() {
        let history = ChartHistory::default();
        history.record(totals(1_000, 100, 10, 0.010), vec![]);
        history.record(totals(3_000, 700, 14, 0.018), vec![lag("us-1", 250)]);
        history.record(totals(4_000, 700, 14, 0.018), vec![]);
        let samples = history.samples();
        assert_eq!(
            samples[0].adds_per_sec, None,
            "the first has nothing before it"
        );
        assert_eq!(samples[1].adds_per_sec, Some(300.0));
        let commit = samples[1].commit_ms.unwrap();
        assert!((commit - 2.0).abs() < 1e-9, "{commit}");
        assert_eq!(samples[2].adds_per_sec, Some(0.0));
        assert_eq!(samples[2].commit_ms, None, "no commit in between");
        let json = to_json(&samples);
        assert_eq!(json["samples"][1]["lag"][0]["since_last_sync_ms"], 250);
        assert_eq!(json["samples"][1]["adds_per_sec"], 300.0);
    }

    #[test]
    fn the_history_keeps_the_last_two_minutes() {
        let history = ChartHistory::default();
        for second in 0..(SAMPLES as u64 + 5) {
            history.record(totals(second * 1000, second, 0, 0.0), vec![]);
        }
        let samples = history.samples();
        assert_eq!(samples.len(), SAMPLES);
        assert_eq!(samples[0].at_ms, 5_000);
    }

    #[test]
    fn charts_draw_a_point_per_value_with_names_escaped() {
        let history = ChartHistory::default();
        history.record(totals(1_000, 0, 0, 0.0), vec![lag("us-<1>", 100)]);
        history.record(totals(2_000, 50, 1, 0.002), vec![lag("us-<1>", 900)]);
        history.record(totals(3_000, 80, 2, 0.003), vec![lag("us-<1>", 100)]);
        let mut html = String::new();
        render(&mut html, &history.samples());
        for id in ["chart-adds", "chart-lag", "chart-commit"] {
            assert!(html.contains(&format!("id=\"{id}\"")), "{id} missing");
        }
        assert!(
            html.contains("data-series=\"adds\" data-points=\"2\""),
            "{html}"
        );
        assert!(html.contains("data-series=\"us-&lt;1&gt; (us)\" data-points=\"3\""));
        assert!(!html.contains("us-<1>"));
        assert!(html.contains("max 900.0 ms"), "{html}");
        let mut empty = String::new();
        render(&mut empty, &[]);
        assert!(empty.contains("data-points=\"0\"") && empty.contains("no peers yet"));
    }
}
