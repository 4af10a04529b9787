//! `tally bench`: a closed-loop load generator that measures what a service
//! using the client library gets.
//!
//! `--concurrency` workers each loop: pick a key among `--keys` (uniformly,
//! or by `--distribution zipf:S`; see [`keys`]) (`bench:key:0` ...), send one
//! request through the public [`Client`] API
//! (`add(key, 1)`, `get(key)`, or 90% gets and 10% adds for `mixed`), wait
//! for the answer, and record its latency. The workers are spread over
//! `--connections` clients, each with its own HTTP/2 connection and its own
//! coalescing of adds: one by default, as a service shares one client among
//! its tasks (so its adds share batches), and four with `--no-coalesce`,
//! where one connection would cap the rate of calls. Requests that start
//! during `--warmup` are not counted. Latencies (microseconds) go to one histogram per runtime thread,
//! merged at the end: a record touches memory its thread just used, and
//! workers on different threads never contend.
//!
//! The client runs as a service would run it: adds, likes and gets coalesced unless
//! `--no-coalesce`, a read cache of the 500 most recently read counters for
//! 2 s with `--read-cache`. The bench also reports its own CPU time per
//! operation (Linux only), since on a small machine the load generator's CPU
//! is taken from the node's. A worker does nothing per operation but the call,
//! one clock reading and one histogram record.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
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
use super::Target;
use keys::KeyChooser;
use keys::{KeyDistribution, KeyFormat};

mod keys;

/// Share of reads in `--op mixed`.
const MIXED_GET_SHARE: f64 = 0.9;

/// The largest latency a histogram holds (larger ones are recorded as this).
const MAX_LATENCY_MICROS: u64 = 3_600_000_000;

/// `--read-cache`: how many counters the cache holds, and for how long.
const READ_CACHE_CAPACITY: usize = 500;
const READ_CACHE_TTL: Duration = Duration::from_secs(2);

/// `tally bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Which requests to send: add (+1), get, or mixed (90% gets).
    #[arg(long, value_enum, default_value_t = BenchOp::Add)]
    pub op: BenchOp,

    /// Requests in flight: each worker waits for its answer before the next.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: u32,

    /// HTTP/2 connections (clients) to spread the workers over [default: 1,
    /// or 4 with --no-coalesce].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub connections: Option<u32>,

    /// Distinct counters; 1 is a single hot key.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub keys: u32,

    /// How requests pick among --keys: `uniform`, or `zipf:S` (key of
    /// popularity rank r drawn in proportion to 1/r^S; `zipf:0.99` is the
    /// usual model of web traffic).
    #[arg(long, default_value = "uniform", value_parser = KeyDistribution::parse)]
    pub distribution: KeyDistribution,

    /// How counters are named: `{}` stands for a key's number (0 to --keys
    /// minus 1), `{:0N}` for it zero-padded to N digits; e.g.
    /// `post:1{:08}:likes` names 20-byte keys like the seeds' posts.
    #[arg(long, default_value = "bench:key:{}", value_parser = KeyFormat::parse)]
    pub key_format: KeyFormat,

    /// How long to measure: 500ms, 10s, 2m.
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    pub duration: Duration,

    /// How long to run before measuring.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,

    /// Send each add, like and get as its own call instead of coalescing
    /// concurrent ones into batches (AddBatch, LikeBatch, GetBatch).
    #[arg(long)]
    pub no_coalesce: bool,

    /// The durability the adds ask for: `sync` or `replicated` (on the copies
    /// of the node's region too; see `tally add --durability`). [default: the
    /// node's own]
    #[arg(long, value_enum)]
    pub durability: Option<super::DurabilityArg>,

    /// Coalesced batches in flight per connection (the client's default
    /// unless given).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub batches_in_flight: Option<u32>,

    /// Most adds per coalesced batch, up to 10000 (the client's default
    /// unless given).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_size: Option<u32>,

    /// How long adds may gather while a batch is in flight, e.g. 200us (the
    /// client's default unless given).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub coalesce_window: Option<Duration>,

    /// Answer gets from a client-side cache of the 500 most recently read
    /// counters, each fresh for 2 s.
    #[arg(long)]
    pub read_cache: bool,

    /// Take the keys in order (the n-th request goes to key n modulo
    /// --keys) instead of at random: with --ops equal to --keys, every
    /// counter is written exactly once (to fill a node for a footprint
    /// measurement).
    #[arg(long)]
    pub sequential: bool,

    /// Stop after this many requests in all (or at the end of --duration,
    /// whichever comes first).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub ops: Option<u64>,

    /// Runtime threads of the bench [default: half the cores, at least 1,
    /// leaving the rest to a node on the same machine]. With 1 the runtime is
    /// single-threaded, which costs the least CPU per operation while one
    /// core keeps up.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: Option<u32>,
}

impl BenchArgs {
    /// The connections to open: as given, or the default for the mode.
    pub fn connections(&self) -> u32 {
        self.connections
            .unwrap_or(if self.no_coalesce { 4 } else { 1 })
    }

    /// The runtime threads to run on: as given, or half the cores.
    pub fn threads(&self) -> usize {
        match self.threads {
            Some(threads) => threads as usize,
            None => {
                std::thread::available_parallelism().map_or(1, |cores| (cores.get() / 2).max(1))
            }
        }
    }
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
    /// A gRPC health check: one bare unary RPC through the same client,
    /// connection and server, the floor that `--no-coalesce` adds are
    /// compared with.
    Ping,
    /// Like a random 8-byte member (hex) in one of the `--keys` like sets:
    /// distinct likers of hot posts.
    Like,
    /// Ask whether a random 8-byte member likes one of the `--keys` like sets.
    Liked,
    /// Observe a random 8-byte member in one of the `--keys` uniques keys.
    Observe,
}

/// The client settings the bench runs with: the one place where bench flags
/// become library settings.
fn client_config(base: ClientConfig, args: &BenchArgs) -> ClientConfig {
    let mut config = base.with_coalescing(!args.no_coalesce);
    if let Some(batches) = args.batches_in_flight {
        config = config.with_max_batches_in_flight(batches as usize);
    }
    if let Some(adds) = args.batch_size {
        config = config.with_max_batch_size(adds as usize);
    }
    if let Some(window) = args.coalesce_window {
        config = config.with_coalesce_window(window);
    }
    if args.read_cache {
        config = config.with_read_cache(READ_CACHE_CAPACITY, READ_CACHE_TTL);
    }
    if let Some(durability) = args.durability {
        config = config.with_durability(durability.into());
    }
    config
}

/// What one worker measured.
struct WorkerStats {
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
    /// `uniform` or `zipf:S`.
    distribution: String,
    coalesce: bool,
    read_cache: bool,
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
    /// The bench's own CPU time (all threads, user and system) in the
    /// measured window per operation counted; `None` where unknown.
    client_cpu_us_per_op: Option<f64>,
    first_error: Option<String>,
}

/// Runs the bench against `endpoint` and prints its report.
pub async fn run(target: &Target, args: &BenchArgs, json: bool) -> anyhow::Result<()> {
    let config = client_config(target.base.clone(), args);
    let connections = args.connections().min(args.concurrency);
    let mut clients = Vec::with_capacity(connections as usize);
    for _ in 0..connections {
        clients.push(config.connect(target.endpoint.as_str()).await?);
    }

    let measure_from = Instant::now() + args.warmup;
    let stop_at = measure_from + args.duration;
    let cpu_at_start = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from).await;
        process_cpu_time()
    });
    let latencies = Arc::new(Latencies::new());
    let keys = Arc::new(KeyChooser::new(
        args.key_format.clone(),
        args.keys,
        args.distribution,
        args.sequential,
        args.ops,
    )?);
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
            Arc::clone(&latencies),
            measure_from,
            stop_at,
        ));
    }

    let (mut ops, mut errors, mut first_error, mut last_finish) = (0, 0, None, stop_at);
    while let Some(joined) = workers.join_next().await {
        let stats = joined.context("a bench worker failed")?;
        ops += stats.ops;
        errors += stats.errors;
        first_error = first_error.or(stats.first_error);
        last_finish = last_finish.max(stats.finished);
    }

    let cpu_at_end = process_cpu_time();
    let latencies = latencies.merged()?;
    let cpu_at_start = cpu_at_start.await.ok().flatten();
    let client_cpu_us_per_op = match (cpu_at_start, cpu_at_end) {
        (Some(start), Some(end)) if ops > 0 => {
            Some(end.saturating_sub(start).as_secs_f64() * 1e6 / ops as f64)
        }
        _ => None,
    };
    let window = last_finish.duration_since(measure_from).as_secs_f64();
    let millis = |micros: u64| micros as f64 / 1_000.0;
    let report = BenchReport {
        op: args.op,
        concurrency: args.concurrency,
        connections,
        keys: args.keys,
        distribution: args.distribution.to_string(),
        coalesce: !args.no_coalesce,
        read_cache: args.read_cache,
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
        client_cpu_us_per_op,
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
    keys: Arc<KeyChooser>,
    op: BenchOp,
    mut rng: SmallRng,
    latencies: Arc<Latencies>,
    measure_from: Instant,
    stop_at: Instant,
) -> WorkerStats {
    let mut stats = WorkerStats {
        ops: 0,
        errors: 0,
        first_error: None,
        finished: stop_at,
    };
    // One clock reading per operation: the end of one is the start of the next.
    let mut started = Instant::now();
    while started < stop_at {
        let Some(key) = keys.pick(&mut rng) else {
            break;
        };
        let result = match op {
            BenchOp::Add => client.add(&key, 1).await.map(|_| ()),
            BenchOp::Get => client.get(&key).await.map(|_| ()),
            BenchOp::Mixed if rng.random_bool(MIXED_GET_SHARE) => {
                client.get(&key).await.map(|_| ())
            }
            BenchOp::Mixed => client.add(&key, 1).await.map(|_| ()),
            BenchOp::Ping => client.ping().await,
            BenchOp::Like => {
                let member = format!("{:08x}", rng.random::<u32>());
                client.like(&key, &member).await.map(|_| ())
            }
            BenchOp::Liked => {
                let member = format!("{:08x}", rng.random::<u32>());
                client.liked(&key, &[member]).await.map(|_| ())
            }
            BenchOp::Observe => {
                let member = format!("{:08x}", rng.random::<u32>());
                client.observe(&key, &[member]).await.map(|_| ())
            }
        };
        let finished = Instant::now();
        if started >= measure_from {
            match result {
                Ok(()) => {
                    let micros = finished.duration_since(started).as_micros() as u64;
                    latencies.record(micros.max(1));
                    stats.ops += 1;
                }
                Err(error) => {
                    stats.errors += 1;
                    stats.first_error.get_or_insert_with(|| error.to_string());
                }
            }
        }
        started = finished;
    }
    stats.finished = Instant::now();
    stats
}

/// The CPU time this process has used (all threads, user and system), from
/// `/proc/self/stat`; `None` where that file does not exist. The kernel
/// reports it in ticks of 1/100 s (`USER_HZ`), which is precise enough over a
/// run of seconds.
fn process_cpu_time() -> Option<Duration> {
    const TICKS_PER_SECOND: u64 = 100;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name, in parentheses, may contain spaces: skip past it.
    let (_, after_name) = stat.rsplit_once(')')?;
    let mut fields = after_name.split_whitespace();
    // After the name come the state (field 3) ... utime (14) and stime (15).
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis(
        (utime + stime) * 1_000 / TICKS_PER_SECOND,
    ))
}

fn new_histogram() -> Histogram<u64> {
    // Bounds and precision are constants that hdrhistogram accepts.
    Histogram::new_with_bounds(1, MAX_LATENCY_MICROS, 3).expect("valid histogram bounds")
}

/// The latency histograms of one bench run: one per runtime thread that
/// recorded into it. (With one histogram per worker, 256 workers' histograms
/// took 48 MB and a record was a cache miss: 5% of the bench's CPU.)
struct Latencies {
    /// Tells this run's histograms from an earlier run's in a thread's slot.
    run: u64,
    shards: Mutex<Vec<Shard>>,
}

/// One thread's histogram.
type Shard = Arc<Mutex<Histogram<u64>>>;

static NEXT_RUN: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's histogram, and the run it belongs to.
    static SHARD: RefCell<Option<(u64, Shard)>> =
        const { RefCell::new(None) };
}

impl Latencies {
    fn new() -> Self {
        Latencies {
            run: NEXT_RUN.fetch_add(1, Ordering::Relaxed),
            shards: Mutex::new(Vec::new()),
        }
    }

    /// Records one latency in the calling thread's histogram. Its lock is
    /// only ever contended by [`Latencies::merged`].
    fn record(&self, micros: u64) {
        SHARD.with(|shard| {
            let mut shard = shard.borrow_mut();
            if !matches!(&*shard, Some((run, _)) if *run == self.run) {
                let histogram = Arc::new(Mutex::new(new_histogram()));
                self.shards
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Arc::clone(&histogram));
                *shard = Some((self.run, histogram));
            }
            if let Some((_, histogram)) = &*shard {
                histogram
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .saturating_record(micros);
            }
        });
    }

    /// All the threads' records in one histogram (call once the workers are
    /// done).
    fn merged(&self) -> anyhow::Result<Histogram<u64>> {
        let mut merged = new_histogram();
        for shard in self
            .shards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            merged
                .add(&*shard.lock().unwrap_or_else(PoisonError::into_inner))
                .context("cannot merge latency histograms")?;
        }
        Ok(merged)
    }
}

fn print_report(report: &BenchReport) -> anyhow::Result<()> {
    let op = match report.op {
        BenchOp::Add => "add",
        BenchOp::Get => "get",
        BenchOp::Mixed => "mixed",
        BenchOp::Ping => "ping",
        BenchOp::Like => "like",
        BenchOp::Liked => "liked",
        BenchOp::Observe => "observe",
    };
    let on_off = |on: bool| if on { "on" } else { "off" };
    print_line(format_args!(
        "bench: op={op} concurrency={} connections={} keys={} distribution={} duration={:.2}s coalesce={} read-cache={}",
        report.concurrency,
        report.connections,
        report.keys,
        report.distribution,
        report.duration_s,
        on_off(report.coalesce),
        on_off(report.read_cache),
    ))?;
    let cpu = match report.client_cpu_us_per_op {
        Some(micros) => format!("{micros:.2}us/op"),
        None => "unknown".to_owned(),
    };
    print_line(format_args!(
        "ops: {}  errors: {}  ops/s: {:.1}  client cpu: {cpu}",
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
        assert_eq!(
            (args.concurrency, args.connections(), args.keys),
            (64, 1, 1)
        );
        assert!(args.threads() >= 1);
        assert_eq!(bench_args(&["--no-coalesce"]).connections(), 4);
        assert_eq!(args.duration, Duration::from_secs(10));
        assert_eq!(args.warmup, Duration::from_secs(1));
        assert!(!args.no_coalesce && !args.read_cache);
        assert_eq!(args.distribution, KeyDistribution::Uniform);
        let config = client_config(ClientConfig::default(), &args);
        assert_eq!(config, ClientConfig::default());
        assert!(config.coalescing());
    }

    #[test]
    fn client_flags_become_client_settings() {
        let args = bench_args(&[
            "--no-coalesce",
            "--read-cache",
            "--batches-in-flight",
            "3",
            "--batch-size",
            "4096",
            "--coalesce-window",
            "50us",
        ]);
        let config = client_config(ClientConfig::default(), &args);
        assert!(!config.coalescing());
        assert_eq!(config.read_cache(), Some((500, Duration::from_secs(2))));
        assert_eq!(config.max_batches_in_flight(), 3);
        assert_eq!(config.max_batch_size(), 4096);
        assert_eq!(config.coalesce_window(), Duration::from_micros(50));
    }

    #[test]
    fn latencies_from_many_threads_merge_and_runs_stay_apart() {
        let first = Arc::new(Latencies::new());
        let threads: Vec<_> = (0..4)
            .map(|thread| {
                let latencies = Arc::clone(&first);
                std::thread::spawn(move || {
                    for micros in 1..=100 {
                        latencies.record(micros * (thread + 1));
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        first.record(5);
        let merged = first.merged().unwrap();
        assert_eq!(merged.len(), 401);
        assert_eq!(merged.max(), 400);
        let second = Latencies::new();
        second.record(7);
        assert_eq!(second.merged().unwrap().len(), 1, "a new run starts empty");
        assert_eq!(first.merged().unwrap().len(), 401);
    }

    #[test]
    fn the_process_cpu_time_is_readable_and_grows() {
        let before = process_cpu_time();
        if cfg!(not(target_os = "linux")) {
            return;
        }
        let before = before.expect("/proc/self/stat is readable on Linux");
        let mut spin = 0u64;
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(50) {
            spin = spin.wrapping_add(std::hint::black_box(1));
        }
        assert!(spin > 0);
        assert!(process_cpu_time().unwrap() >= before);
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
            (args.concurrency, args.connections(), args.keys),
            (8, 2, 1000)
        );
        assert_eq!(args.duration, Duration::from_millis(500));
        assert_eq!(args.warmup, Duration::ZERO);
    }

    #[test]
    fn key_formats_name_keys_and_bad_ones_are_refused() {
        assert_eq!(bench_args(&[]).key_format.name(7), "bench:key:7");
        let posts = bench_args(&["--key-format", "post:1{:08}:likes"]).key_format;
        assert_eq!(posts.name(23_456_789), "post:123456789:likes");
        assert_eq!(posts.name(5), "post:100000005:likes");
        for bad in ["post", "post:{", "{:8}", "{:00}", "{:021}", "{}{}", "{x}"] {
            let argv = ["tally", "bench", "--key-format", bad];
            assert!(
                Cli::try_parse_from(argv).is_err(),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn zero_counts_and_durations_are_refused() {
        for flags in [
            &["--concurrency", "0"][..],
            &["--connections", "0"],
            &["--keys", "0"],
            &["--duration", "0s"],
            &["--op", "delete"],
            &["--batch-size", "10001"],
            &["--batches-in-flight", "0"],
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
            distribution: "zipf:0.99".into(),
            coalesce: true,
            read_cache: false,
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
            client_cpu_us_per_op: Some(2.5),
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
            "distribution",
            "duration_s",
            "coalesce",
            "read_cache",
            "client_cpu_us_per_op",
        ] {
            assert!(json.get(field).is_some(), "missing {field}");
        }
    }
}
