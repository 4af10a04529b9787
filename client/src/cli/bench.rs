//! `tally bench`: a closed-loop load generator that measures what a service
//! using the client library gets.
//!
//! `--concurrency` workers each loop: pick a key uniformly among `--keys`
//! (`bench:key:0` ...), send one request through the public [`Client`] API
//! (`add(key, 1)`, `get(key)`, or 90% gets and 10% adds for `mixed`), wait
//! for the answer, and record its latency. The workers are spread over
//! `--connections` clients, each with its own HTTP/2 connection, because one
//! connection caps throughput. Requests that start during `--warmup` are not
//! counted. Each worker keeps its own histogram (microseconds); they are
//! merged at the end, so workers never contend on shared state.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tally_client::{Client, ClientConfig};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::duration::{parse_duration, parse_positive_duration};
use super::output::{print_json, print_line};

/// Share of reads in `--op mixed`.
const MIXED_GET_SHARE: f64 = 0.9;

/// The largest latency a histogram holds (larger ones are recorded as this).
const MAX_LATENCY_MICROS: u64 = 3_600_000_000;

/// `tally bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Which requests to send: add (+1), get, or mixed (90% gets).
    #[arg(long, value_enum, default_value_t = BenchOp::Add)]
    pub op: BenchOp,

    /// Requests in flight: each worker waits for its answer before the next.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: u32,

    /// HTTP/2 connections to spread the workers over.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub connections: u32,

    /// Distinct counters, chosen uniformly; 1 is a single hot key.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub keys: u32,

    /// How long to measure: 500ms, 10s, 2m.
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    pub duration: Duration,

    /// How long to run before measuring.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
}

/// The request a bench worker sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchOp {
    /// Add 1 to a counter.
    Add,
    /// Read a counter.
    Get,
    /// 90% reads, 10% adds.
    Mixed,
}

/// The client settings the bench runs with. This is the one place where
/// bench flags become library settings: a future `--no-coalesce` flag turns
/// off the client's add coalescing here, and the workers need not change.
fn client_config(_args: &BenchArgs) -> ClientConfig {
    ClientConfig::default()
}

/// What one worker measured.
struct WorkerStats {
    latencies: Histogram<u64>,
    ops: u64,
    errors: u64,
    first_error: Option<String>,
    finished: Instant,
}

/// The printed result (`--json` prints it as is).
#[derive(Debug, Serialize)]
struct BenchReport {
    op: BenchOp,
    concurrency: u32,
    connections: u32,
    keys: u32,
    /// The measured window: from the end of the warmup to the last answer.
    duration_s: f64,
    warmup_s: f64,
    ops: u64,
    errors: u64,
    ops_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    mean_ms: f64,
    first_error: Option<String>,
}

/// Runs the bench against `endpoint` and prints its report.
pub async fn run(endpoint: &str, args: &BenchArgs, json: bool) -> anyhow::Result<()> {
    let config = client_config(args);
    let connections = args.connections.min(args.concurrency);
    let mut clients = Vec::with_capacity(connections as usize);
    for _ in 0..connections {
        clients.push(config.connect(endpoint).await?);
    }
    let keys: Arc<[String]> = (0..args.keys).map(|i| format!("bench:key:{i}")).collect();

    let measure_from = Instant::now() + args.warmup;
    let stop_at = measure_from + args.duration;
    let mut workers = JoinSet::new();
    for worker in 0..args.concurrency as usize {
        let client = clients[worker % clients.len()].clone();
        let keys = Arc::clone(&keys);
        let rng = SmallRng::from_rng(&mut rand::rng());
        workers.spawn(run_worker(
            client,
            keys,
            args.op,
            rng,
            measure_from,
            stop_at,
        ));
    }

    let mut latencies = new_histogram();
    let (mut ops, mut errors, mut first_error, mut last_finish) = (0, 0, None, stop_at);
    while let Some(joined) = workers.join_next().await {
        let stats = joined.context("a bench worker failed")?;
        latencies
            .add(&stats.latencies)
            .context("cannot merge latency histograms")?;
        ops += stats.ops;
        errors += stats.errors;
        first_error = first_error.or(stats.first_error);
        last_finish = last_finish.max(stats.finished);
    }

    let window = last_finish.duration_since(measure_from).as_secs_f64();
    let millis = |micros: u64| micros as f64 / 1_000.0;
    let report = BenchReport {
        op: args.op,
        concurrency: args.concurrency,
        connections,
        keys: args.keys,
        duration_s: window,
        warmup_s: args.warmup.as_secs_f64(),
        ops,
        errors,
        ops_per_sec: if window > 0.0 {
            ops as f64 / window
        } else {
            0.0
        },
        p50_ms: millis(latencies.value_at_quantile(0.50)),
        p99_ms: millis(latencies.value_at_quantile(0.99)),
        p999_ms: millis(latencies.value_at_quantile(0.999)),
        max_ms: millis(latencies.max()),
        mean_ms: latencies.mean() / 1_000.0,
        first_error,
    };
    if json {
        print_json(&report)?;
    } else {
        print_report(&report)?;
    }
    if report.ops == 0 && report.errors > 0 {
        anyhow::bail!(
            "every request failed; the first: {}",
            report.first_error.as_deref().unwrap_or("unknown")
        );
    }
    Ok(())
}

/// One closed-loop worker: one request in flight at a time until `stop_at`.
async fn run_worker(
    client: Client,
    keys: Arc<[String]>,
    op: BenchOp,
    mut rng: SmallRng,
    measure_from: Instant,
    stop_at: Instant,
) -> WorkerStats {
    let mut stats = WorkerStats {
        latencies: new_histogram(),
        ops: 0,
        errors: 0,
        first_error: None,
        finished: stop_at,
    };
    loop {
        let started = Instant::now();
        if started >= stop_at {
            break;
        }
        let key = &keys[rng.random_range(0..keys.len())];
        let add = match op {
            BenchOp::Add => true,
            BenchOp::Get => false,
            BenchOp::Mixed => !rng.random_bool(MIXED_GET_SHARE),
        };
        let result = if add {
            client.add(key, 1).await.map(|_| ())
        } else {
            client.get(key).await.map(|_| ())
        };
        let latency = started.elapsed();
        if started < measure_from {
            continue;
        }
        match result {
            Ok(()) => {
                let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
                stats.latencies.saturating_record(micros.max(1));
                stats.ops += 1;
            }
            Err(error) => {
                stats.errors += 1;
                stats.first_error.get_or_insert_with(|| error.to_string());
            }
        }
    }
    stats.finished = Instant::now();
    stats
}

fn new_histogram() -> Histogram<u64> {
    // Bounds and precision are constants that hdrhistogram accepts.
    Histogram::new_with_bounds(1, MAX_LATENCY_MICROS, 3).expect("valid histogram bounds")
}

fn print_report(report: &BenchReport) -> anyhow::Result<()> {
    let op = match report.op {
        BenchOp::Add => "add",
        BenchOp::Get => "get",
        BenchOp::Mixed => "mixed",
    };
    print_line(format_args!(
        "bench: op={op} concurrency={} connections={} keys={} duration={:.2}s",
        report.concurrency, report.connections, report.keys, report.duration_s
    ))?;
    print_line(format_args!(
        "ops: {}  errors: {}  ops/s: {:.1}",
        report.ops, report.errors, report.ops_per_sec
    ))?;
    print_line(format_args!(
        "latency ms: p50 {:.3}  p99 {:.3}  p999 {:.3}  max {:.3}",
        report.p50_ms, report.p99_ms, report.p999_ms, report.max_ms
    ))?;
    if let Some(error) = &report.first_error {
        print_line(format_args!("first error: {error}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::{Cli, Command};
    use super::*;

    #[track_caller]
    fn bench_args(args: &[&str]) -> BenchArgs {
        let argv = ["tally", "bench"].into_iter().chain(args.iter().copied());
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Bench(args) => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let args = bench_args(&[]);
        assert_eq!(args.op, BenchOp::Add);
        assert_eq!((args.concurrency, args.connections, args.keys), (64, 4, 1));
        assert_eq!(args.duration, Duration::from_secs(10));
        assert_eq!(args.warmup, Duration::from_secs(1));
    }

    #[test]
    fn flags_parse_with_their_units() {
        let args = bench_args(&[
            "--op",
            "mixed",
            "--concurrency",
            "8",
            "--connections",
            "2",
            "--keys",
            "1000",
            "--duration",
            "500ms",
            "--warmup",
            "0s",
        ]);
        assert_eq!(args.op, BenchOp::Mixed);
        assert_eq!(
            (args.concurrency, args.connections, args.keys),
            (8, 2, 1000)
        );
        assert_eq!(args.duration, Duration::from_millis(500));
        assert_eq!(args.warmup, Duration::ZERO);
    }

    #[test]
    fn zero_counts_and_durations_are_refused() {
        for flags in [
            &["--concurrency", "0"][..],
            &["--connections", "0"],
            &["--keys", "0"],
            &["--duration", "0s"],
            &["--op", "delete"],
        ] {
            let argv = ["tally", "bench"].into_iter().chain(flags.iter().copied());
            assert!(
                Cli::try_parse_from(argv).is_err(),
                "{flags:?} should be refused"
            );
        }
    }

    #[test]
    fn the_report_has_the_documented_json_fields() {
        let report = BenchReport {
            op: BenchOp::Mixed,
            concurrency: 64,
            connections: 4,
            keys: 1,
            duration_s: 10.0,
            warmup_s: 1.0,
            ops: 100,
            errors: 0,
            ops_per_sec: 10.0,
            p50_ms: 1.0,
            p99_ms: 2.0,
            p999_ms: 3.0,
            max_ms: 4.0,
            mean_ms: 1.1,
            first_error: None,
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["op"], "mixed");
        for field in [
            "ops_per_sec",
            "p50_ms",
            "p99_ms",
            "p999_ms",
            "errors",
            "ops",
            "concurrency",
            "keys",
            "duration_s",
        ] {
            assert!(json.get(field).is_some(), "missing {field}");
        }
    }
}
