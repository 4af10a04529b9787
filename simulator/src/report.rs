//! The report: `report.json` (the summary as data) and `report.html`, one
//! self-contained page with inline SVG charts — the hot counter's value at
//! each node over time with the fault windows shaded, the spread between the
//! replicas over time, and a histogram of convergence times. No scripts, no
//! fonts or styles fetched from anywhere.
//!
//! Invariant: the report shows the run it names; its seed and replay command
//! are printed on the page.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use crate::faults::Op;
use crate::options::SimOptions;
use crate::replay::replay_command;
use crate::sweep::{quantile, SweepSummary};
use crate::world::{RunResult, Series};

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
];

fn fault_color(op: &Op) -> &'static str {
    match op.kind() {
        "partition" => "#f4a582",
        "crash" => "#d6604d",
        "crash-wipe" => "#b2182b",
        "pause" => "#92c5de",
        "flaky-net" => "#e0e0e0",
        _ => "#fddbc7",
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Writes `report.json` and `report.html` into `dir`.
pub fn write(
    dir: &Path,
    options: &SimOptions,
    run: &RunResult,
    sweep: Option<&SweepSummary>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let json = json_summary(options, run, sweep);
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(&json)?,
    )
    .context("cannot write report.json")?;
    std::fs::write(dir.join("report.html"), html(options, run, sweep))
        .context("cannot write report.html")?;
    Ok(())
}

fn json_summary(
    options: &SimOptions,
    run: &RunResult,
    sweep: Option<&SweepSummary>,
) -> serde_json::Value {
    let sweep_json = sweep.map(|summary| {
        let mut convergence: Vec<u64> = summary
            .results
            .iter()
            .filter_map(|r| r.convergence_ms)
            .collect();
        convergence.sort_unstable();
        serde_json::json!({
            "seeds": summary.results.len(),
            "failed": summary.failed,
            "wall_seconds": summary.wall.as_secs_f64(),
            "threads": summary.threads,
            "events": summary.results.iter().map(|r| r.events).sum::<u64>(),
            "convergence_ms": {
                "p50": quantile(&convergence, 0.5),
                "p99": quantile(&convergence, 0.99),
                "max": convergence.last().copied().unwrap_or(0),
            },
            "runs": summary.results.iter().map(|r| serde_json::json!({
                "seed": r.seed,
                "passed": r.passed(),
                "failure": r.failure_kind(),
                "convergence_ms": r.convergence_ms,
                "bound_ms": r.bound_ms,
                "events": r.events,
                "trace_hash": format!("{:016x}", r.trace_hash),
            })).collect::<Vec<_>>(),
        })
    });
    serde_json::json!({
        "options": options.to_string(),
        "args": options.to_args(),
        "replay": replay_command(run.seed, options, None),
        "run": run,
        "sweep": sweep_json,
    })
}

struct Frame {
    width: f64,
    height: f64,
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
    x_max: f64,
    y_min: f64,
    y_max: f64,
}

impl Frame {
    fn x(&self, value: f64) -> f64 {
        self.left + (self.width - self.left - self.right) * value / self.x_max.max(1.0)
    }

    fn y(&self, value: f64) -> f64 {
        let span = (self.y_max - self.y_min).max(1.0);
        self.height
            - self.bottom
            - (self.height - self.top - self.bottom) * (value - self.y_min) / span
    }

    fn axes(&self, svg: &mut String, x_label: &str, y_label: &str) {
        let (x0, x1) = (self.left, self.width - self.right);
        let (y0, y1) = (self.height - self.bottom, self.top);
        let _ = write!(
            svg,
            r##"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="#333"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="#333"/>"##
        );
        for i in 0..=4 {
            let value = self.y_min + (self.y_max - self.y_min) * f64::from(i) / 4.0;
            let y = self.y(value);
            let _ = write!(
                svg,
                r##"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
                x0 - 4.0,
                y + 4.0,
                value.round()
            );
            let xv = self.x_max * f64::from(i) / 4.0;
            let x = self.x(xv);
            let _ = write!(
                svg,
                r##"<text x="{x:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"##,
                y0 + 14.0,
                xv.round()
            );
        }
        let _ = write!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">{}</text><text x="12" y="{:.1}" font-size="12" transform="rotate(-90 12 {:.1})" text-anchor="middle">{}</text>"##,
            (x0 + x1) / 2.0,
            self.height - 4.0,
            escape(x_label),
            (y0 + y1) / 2.0,
            (y0 + y1) / 2.0,
            escape(y_label)
        );
    }
}

fn shade_faults(svg: &mut String, frame: &Frame, run: &RunResult) {
    let mut lane = 0usize;
    for op in &run.plan.0 {
        if matches!(op, Op::Skew { .. } | Op::Retire { .. }) {
            continue;
        }
        let start = op.start_ms().min(run.heal_ms) as f64 / 1000.0;
        let end = op.end_ms().min(run.heal_ms).max(op.start_ms() + 1) as f64 / 1000.0;
        let (x0, x1) = (frame.x(start), frame.x(end));
        let _ = write!(
            svg,
            r##"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}" opacity="0.45"><title>{}</title></rect><text x="{:.1}" y="{:.1}" font-size="9" fill="#555">{}</text>"##,
            frame.top,
            (x1 - x0).max(1.5),
            frame.height - frame.top - frame.bottom,
            fault_color(op),
            escape(&op.to_string()),
            x0 + 1.0,
            frame.top + 10.0 + 10.0 * (lane % 4) as f64,
            op.kind()
        );
        lane += 1;
    }
    let heal = frame.x(run.heal_ms as f64 / 1000.0);
    let _ = write!(
        svg,
        r##"<line x1="{heal:.1}" y1="{}" x2="{heal:.1}" y2="{}" stroke="#000" stroke-dasharray="4 3"/><text x="{:.1}" y="{}" font-size="10">heal</text>"##,
        frame.top,
        frame.height - frame.bottom,
        heal + 3.0,
        frame.top + 50.0
    );
}

fn polyline(svg: &mut String, frame: &Frame, at_ms: &[u64], values: &[Option<i64>], color: &str) {
    let mut points = String::new();
    let flush = |svg: &mut String, points: &mut String| {
        if !points.is_empty() {
            let _ = write!(
                svg,
                r##"<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{points}"/>"##
            );
            points.clear();
        }
    };
    for (at, value) in at_ms.iter().zip(values) {
        match value {
            Some(v) => {
                let _ = write!(
                    points,
                    "{:.1},{:.1} ",
                    frame.x(*at as f64 / 1000.0),
                    frame.y(*v as f64)
                );
            }
            None => flush(svg, &mut points),
        }
    }
    flush(svg, &mut points);
}

fn hot_chart(run: &RunResult, series: &Series) -> String {
    let values: Vec<i64> = series
        .hot_value
        .iter()
        .flatten()
        .flatten()
        .copied()
        .collect();
    let frame = Frame {
        width: 900.0,
        height: 340.0,
        left: 70.0,
        right: 160.0,
        top: 10.0,
        bottom: 36.0,
        x_max: run.sim_ms as f64 / 1000.0,
        y_min: values.iter().copied().min().unwrap_or(0).min(0) as f64,
        y_max: values.iter().copied().max().unwrap_or(1).max(1) as f64,
    };
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif">"##,
        frame.width, frame.height
    );
    shade_faults(&mut svg, &frame, run);
    frame.axes(&mut svg, "simulated seconds", "hot key value");
    for (node, values) in series.hot_value.iter().enumerate() {
        let color = COLORS[node % COLORS.len()];
        polyline(&mut svg, &frame, &series.at_ms, values, color);
        let _ = write!(
            svg,
            r##"<rect x="{:.1}" y="{:.1}" width="12" height="3" fill="{color}"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"##,
            frame.width - frame.right + 12.0,
            frame.top + 14.0 + 16.0 * node as f64,
            frame.width - frame.right + 28.0,
            frame.top + 18.0 + 16.0 * node as f64,
            escape(&series.node_labels[node])
        );
    }
    svg.push_str("</svg>");
    svg
}

fn spread_chart(run: &RunResult, series: &Series) -> String {
    let frame = Frame {
        width: 900.0,
        height: 220.0,
        left: 70.0,
        right: 160.0,
        top: 10.0,
        bottom: 36.0,
        x_max: run.sim_ms as f64 / 1000.0,
        y_min: 0.0,
        y_max: series.spread.iter().copied().max().unwrap_or(1).max(1) as f64,
    };
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif">"##,
        frame.width, frame.height
    );
    shade_faults(&mut svg, &frame, run);
    frame.axes(&mut svg, "simulated seconds", "max - min");
    let values: Vec<Option<i64>> = series.spread.iter().map(|v| Some(*v)).collect();
    polyline(&mut svg, &frame, &series.at_ms, &values, "#444");
    svg.push_str("</svg>");
    svg
}

fn histogram(values: &[u64], bound: u64, title: &str) -> String {
    let max = values.iter().copied().max().unwrap_or(0).max(bound).max(1);
    let buckets = 30usize;
    let width = (max as f64 / buckets as f64).ceil().max(1.0);
    let mut counts = vec![0u64; buckets];
    for value in values {
        counts[((*value as f64 / width) as usize).min(buckets - 1)] += 1;
    }
    let frame = Frame {
        width: 900.0,
        height: 240.0,
        left: 70.0,
        right: 160.0,
        top: 10.0,
        bottom: 36.0,
        x_max: width * buckets as f64,
        y_min: 0.0,
        y_max: counts.iter().copied().max().unwrap_or(1).max(1) as f64,
    };
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif">"##,
        frame.width, frame.height
    );
    frame.axes(&mut svg, title, "count");
    for (i, count) in counts.iter().enumerate() {
        let x0 = frame.x(width * i as f64);
        let x1 = frame.x(width * (i + 1) as f64);
        let y = frame.y(*count as f64);
        let _ = write!(
            svg,
            r##"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="#4c78a8"><title>{}-{} ms: {count}</title></rect>"##,
            (x1 - x0 - 1.0).max(1.0),
            frame.height - frame.bottom - y,
            (width * i as f64) as u64,
            (width * (i + 1) as f64) as u64
        );
    }
    if bound > 0 {
        let x = frame.x(bound as f64);
        let _ = write!(
            svg,
            r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="#b2182b" stroke-dasharray="5 3"/><text x="{:.1}" y="{}" font-size="11" fill="#b2182b">bound {bound} ms</text>"##,
            frame.top,
            frame.height - frame.bottom,
            x - 4.0,
            frame.top + 12.0
        );
    }
    svg.push_str("</svg>");
    svg
}

fn html(options: &SimOptions, run: &RunResult, sweep: Option<&SweepSummary>) -> String {
    let mut page = String::new();
    let verdict = if run.passed() { "PASS" } else { "FAIL" };
    let _ = write!(
        page,
        r##"<!doctype html><html><head><meta charset="utf-8"><title>tally-sim report, seed {seed}</title>
<style>body{{font-family:sans-serif;margin:24px;max-width:960px;color:#222}}pre{{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px}}
h2{{margin-top:28px}}.pass{{color:#1a7f37}}.fail{{color:#b2182b}}table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ddd;padding:3px 8px;text-align:right}}</style></head><body>
<h1>tally-sim report <span class="{class}">{verdict}</span></h1>
<p>Seed <b>{seed}</b>: <code>{replay}</code></p>
<pre>{options}</pre>"##,
        seed = run.seed,
        class = verdict.to_lowercase(),
        replay = escape(&replay_command(run.seed, options, None)),
        options = escape(&options.to_string()),
    );
    if let Some(summary) = sweep {
        let mut convergence: Vec<u64> = summary
            .results
            .iter()
            .filter_map(|r| r.convergence_ms)
            .collect();
        convergence.sort_unstable();
        let _ = write!(
            page,
            r##"<h2>Sweep</h2><table><tr><th>seeds</th><th>passed</th><th>failed</th><th>convergence p50</th><th>p99</th><th>max (ms)</th></tr>
<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr></table>
<h3>Convergence after the heal, per seed</h3>{}"##,
            summary.results.len(),
            summary.results.len() as u64 - summary.failed,
            summary.failed,
            quantile(&convergence, 0.5),
            quantile(&convergence, 0.99),
            convergence.last().copied().unwrap_or(0),
            histogram(
                &convergence,
                run.bound_ms,
                "ms from the heal to every replica equal"
            ),
        );
    }
    let _ = write!(
        page,
        "<h2>Seed {}: the hot key over time</h2><p>Each line is one node's value of the hot counter \
         (<code>post:hot:likes</code>); a gap is a node that is down. Shaded: fault windows (hover for \
         the operation). Dashed: the final heal.</p>",
        run.seed
    );
    if let Some(series) = &run.series {
        page.push_str(&hot_chart(run, series));
        page.push_str(
            "<h2>Spread between replicas</h2><p>Largest minus smallest value of the hot counter \
             over the running nodes.</p>",
        );
        page.push_str(&spread_chart(run, series));
    }
    let _ = write!(
        page,
        "<h2>Per-key convergence (seed {})</h2><p>For each key, the time after the heal at which \
         the last replica's copy changed. Converged {} after the heal; bound {} ms.</p>{}",
        run.seed,
        run.convergence_ms
            .map(|ms| format!("{ms} ms"))
            .unwrap_or_else(|| "never".into()),
        run.bound_ms,
        histogram(&run.key_convergence_ms, run.bound_ms, "ms after the heal")
    );
    let _ = write!(
        page,
        "<h2>Fault plan</h2><pre>{}</pre>",
        escape(&run.plan.to_string())
    );
    if !run.passed() {
        page.push_str("<h2>Violations</h2><pre>");
        for v in &run.violations {
            let _ = writeln!(page, "at {} ms: {}: {}", v.at_ms, v.kind, escape(&v.detail));
        }
        page.push_str("</pre>");
    }
    let w = &run.workload;
    let _ = write!(
        page,
        "<h2>Counts</h2><pre>adds {} (hot key {}), acked {}, async-acked {}, abandoned {}, retries {}\n\
         unacknowledged adds applied {}, lost {}\ncommits {}, pulls {}, events {}, trace {:016x}</pre></body></html>",
        w.adds,
        w.hot_adds,
        w.acked,
        w.async_acked,
        w.abandoned,
        w.retries,
        run.slots.unacked_applied,
        run.slots.unacked_lost,
        run.commits,
        run.pulls,
        run.events,
        run.trace_hash
    );
    page
}
