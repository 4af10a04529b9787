//! `tally-sim chaos`: the simulator's checker against a real cluster of
//! `tally-node` processes on loopback, one node per region, driven through
//! the real client (`tally_client`). Faults: `kill -9` and restart on the
//! same data directory, SIGSTOP/SIGCONT, and cutting the replication path
//! into a node (a fault-injecting TCP proxy sits on every node's advertised
//! gRPC address, see `proxy.rs`). The proxy also adds a WAN delay.
//!
//! Invariants checked after the heal, as in the simulation: every node holds
//! the same state for every key (compared per region slot through
//! `get_with_breakdown`), each replica's slot equals its acknowledged adds
//! plus a subset of its unacknowledged ones (magnitudes from the same lane
//! scheme, see `ledger.rs`), and a restarted node keeps its replica id.

mod proxy;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tally_client::{Client, ClientConfig};
use tally_node::crdt::{PnCounter, ReplicaId, Slot};

use crate::checker::Checker;
use crate::ledger::Ledger;
use crate::rng::{between, chance, stream, Subsystem, Zipf};
use proxy::{spawn_proxy, ProxyHandle};

/// Options of `tally-sim chaos`.
#[derive(clap::Args, Debug)]
pub struct ChaosArgs {
    /// The tally-node binary (default: next to this binary).
    #[arg(long)]
    node_bin: Option<PathBuf>,
    /// Regions (one node each).
    #[arg(long, default_value_t = 3)]
    regions: usize,
    /// Seconds of load and faults before the heal.
    #[arg(long, default_value_t = 30)]
    duration_s: u64,
    /// Seed of the fault schedule and the workload.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// First port; each node takes ten from here (never 7100-7199,
    /// 17100-17199 or 27100-27199). Default: free ports chosen by the system.
    #[arg(long)]
    base_port: Option<u16>,
    /// Where the data directories and logs go (default: a fresh temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Clients per region.
    #[arg(long, default_value_t = 2)]
    clients_per_region: usize,
    /// Keys (key 0 is the hot post).
    #[arg(long, default_value_t = 16)]
    keys: usize,
    /// Faults: a comma list of kill, stop, cut.
    #[arg(long, default_value = "kill,stop,cut")]
    faults: String,
    /// WAN delay the proxies add to replication traffic (ms, one way).
    #[arg(long, default_value_t = 30)]
    wan_ms: u64,
    /// Longest wait for convergence after the heal (s).
    #[arg(long, default_value_t = 60)]
    converge_timeout_s: u64,
}

struct NodeProc {
    name: String,
    region: String,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
    endpoint: String,
    proxy: ProxyHandle,
    replica: ReplicaId,
    stopped: bool,
}

impl NodeProc {
    fn spawn(&mut self, bin: &PathBuf) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(bin)
            .args(&self.args)
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        self.child = Some(child);
        self.stopped = false;
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn signal(&mut self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
            self.stopped = signal == "-STOP";
        }
    }
}

fn forbidden(port: u16) -> bool {
    [7100..7200, 17100..17200, 27100..27200]
        .iter()
        .any(|range| range.contains(&port))
}

/// Free loopback ports chosen by the system (bound, read, released).
fn free_ports(count: usize) -> anyhow::Result<Vec<u16>> {
    let listeners: Vec<std::net::TcpListener> = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    let ports: Vec<u16> = listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()?;
    if ports.iter().any(|p| forbidden(*p)) {
        return free_ports(count);
    }
    Ok(ports)
}

async fn wait_ready(
    endpoint: &str,
    cluster: &str,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<ReplicaId> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(client) = Client::connect(endpoint.to_string()).await {
            if let Ok(status) = client.status().await {
                if status.cluster_id != cluster || status.node.node_name != name {
                    bail!(
                        "{endpoint} is node {:?} of cluster {:?}, not ours: is the port taken?",
                        status.node.node_name,
                        status.cluster_id
                    );
                }
                return Ok(ReplicaId(status.node.replica));
            }
        }
        if Instant::now() > deadline {
            bail!("the node at {endpoint} did not answer within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `tally-sim chaos`.
pub fn main(args: ChaosArgs) -> anyhow::Result<bool> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(chaos(args))
}

async fn chaos(args: ChaosArgs) -> anyhow::Result<bool> {
    let bin = match &args.node_bin {
        Some(bin) => bin.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no directory for this binary")?
            .join("tally-node"),
    };
    if !bin.exists() {
        bail!(
            "no tally-node binary at {}: build it (cargo build --release -p tally-node) or pass --node-bin",
            bin.display()
        );
    }
    // Per node: gRPC, gossip, HTTP, and the proxy in front of gRPC.
    let ports: Vec<u16> = match args.base_port {
        Some(base) => {
            let last = base as u32 + 10 * args.regions as u32;
            if last > u16::MAX as u32 || (base..last as u16).any(forbidden) {
                bail!("--base-port {base} overlaps a reserved port range (7100-7199, 17100-17199, 27100-27199)");
            }
            (0..args.regions)
                .flat_map(|i| [0u16, 1, 2, 5].map(|offset| base + 10 * i as u16 + offset))
                .collect()
        }
        None => free_ports(args.regions * 4)?,
    };
    for port in &ports {
        if std::net::TcpListener::bind(("127.0.0.1", *port)).is_err() {
            bail!("port {port} is taken; pass another --base-port or let the system choose");
        }
    }
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => {
            std::env::temp_dir().join(format!("tally-chaos-{}-{}", std::process::id(), args.seed))
        }
    };
    std::fs::create_dir_all(&dir)?;
    let faults: Vec<&str> = args
        .faults
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .collect();
    println!(
        "tally-sim chaos --seed {} --regions {} --duration-s {} --faults {} --wan-ms {} (node {}, data in {})",
        args.seed, args.regions, args.duration_s, faults.join(","), args.wan_ms, bin.display(), dir.display()
    );
    let options = crate::options::SimOptions {
        regions: args.regions,
        ..Default::default()
    };
    const GRPC: usize = 0;
    const GOSSIP: usize = 1;
    const HTTP: usize = 2;
    const PROXY: usize = 3;
    let port = |node: usize, which: usize| ports[node * 4 + which];
    let gossip: Vec<String> = (0..args.regions)
        .map(|i| format!("127.0.0.1:{}", port(i, GOSSIP)))
        .collect();
    let mut nodes = Vec::new();
    for i in 0..args.regions {
        let region = options.region_name(i);
        let proxy = spawn_proxy(
            &format!("127.0.0.1:{}", port(i, PROXY)),
            format!("127.0.0.1:{}", port(i, GRPC)),
        )
        .await?;
        proxy.set_delay(Duration::from_millis(args.wan_ms));
        let node_args = vec![
            "--data-dir".into(),
            dir.join(format!("n{i}")).display().to_string(),
            "--region".into(),
            region.clone(),
            "--node-name".into(),
            format!("n{i}"),
            "--grpc-addr".into(),
            format!("127.0.0.1:{}", port(i, GRPC)),
            "--advertise-grpc-addr".into(),
            format!("127.0.0.1:{}", port(i, PROXY)),
            "--gossip-addr".into(),
            gossip[i].clone(),
            "--http-addr".into(),
            format!("127.0.0.1:{}", port(i, HTTP)),
            "--seeds".into(),
            gossip.join(","),
            "--cluster-id".into(),
            format!("chaos-{}", args.seed),
            "--sync-interval".into(),
            "200ms".into(),
        ];
        let mut node = NodeProc {
            name: format!("n{i}"),
            region,
            args: node_args,
            log: dir.join(format!("n{i}.log")),
            child: None,
            endpoint: format!("http://127.0.0.1:{}", port(i, GRPC)),
            proxy,
            replica: ReplicaId(0),
            stopped: false,
        };
        node.spawn(&bin)?;
        nodes.push(node);
    }
    let outcome = drive(&args, &bin, &mut nodes, &faults).await;
    for node in &mut nodes {
        node.signal("-CONT");
        node.kill();
    }
    let passed = outcome?;
    if passed && args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("logs and data: {}", dir.display());
    }
    Ok(passed)
}

async fn drive(
    args: &ChaosArgs,
    bin: &PathBuf,
    nodes: &mut [NodeProc],
    faults: &[&str],
) -> anyhow::Result<bool> {
    let n = nodes.len();
    let cluster = format!("chaos-{}", args.seed);
    for node in nodes.iter_mut() {
        node.replica = wait_ready(
            &node.endpoint,
            &cluster,
            &node.name,
            Duration::from_secs(30),
        )
        .await?;
        println!(
            "  {} ({}) is replica {}",
            node.name, node.region, node.replica
        );
    }
    let mut checker = Checker::new(n, args.keys);
    for (i, node) in nodes.iter().enumerate() {
        checker.started_fresh(0, i, node.replica);
    }
    let ledger = Arc::new(Mutex::new(Ledger::new(n, args.keys)));
    let stop = Arc::new(AtomicBool::new(false));
    let key_names: Arc<Vec<String>> = Arc::new(
        (0..args.keys)
            .map(|k| {
                if k == 0 {
                    "post:hot:likes".to_string()
                } else {
                    format!("k{k:03}")
                }
            })
            .collect(),
    );
    let mut tasks = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        for c in 0..args.clients_per_region {
            let client_id = (i * args.clients_per_region + c) as u32;
            let endpoint = node.endpoint.clone();
            let replica = node.replica;
            let (ledger, stop, names) = (ledger.clone(), stop.clone(), key_names.clone());
            let seed = args.seed ^ (u64::from(client_id) << 32);
            tasks.push(tokio::spawn(async move {
                client_loop(client_id, i, replica, endpoint, seed, ledger, stop, names).await
            }));
        }
    }
    let started = Instant::now();
    let mut rng = stream(args.seed, Subsystem::Plan);
    let deadline = started + Duration::from_secs(args.duration_s);
    while Instant::now() < deadline && !faults.is_empty() {
        tokio::time::sleep(Duration::from_millis(between(&mut rng, 500, 2_000))).await;
        let target = between(&mut rng, 0, n as u64 - 1) as usize;
        let fault = faults[between(&mut rng, 0, faults.len() as u64 - 1) as usize];
        let hold = Duration::from_millis(between(&mut rng, 300, 3_000));
        let at = started.elapsed().as_secs_f64();
        println!(
            "  at {at:6.1} s: {fault} {} for {} ms",
            nodes[target].name,
            hold.as_millis()
        );
        match fault {
            "kill" => {
                nodes[target].kill();
                tokio::time::sleep(hold).await;
                nodes[target].spawn(bin)?;
                let id = wait_ready(
                    &nodes[target].endpoint,
                    &cluster,
                    &nodes[target].name,
                    Duration::from_secs(30),
                )
                .await?;
                if id != nodes[target].replica {
                    checker.violate(
                        0,
                        "replica id changed",
                        format!(
                            "{} came back from kill -9 as {id}, not {}",
                            nodes[target].name, nodes[target].replica
                        ),
                    );
                }
            }
            "stop" => {
                nodes[target].signal("-STOP");
                tokio::time::sleep(hold).await;
                nodes[target].signal("-CONT");
            }
            "cut" => {
                nodes[target].proxy.set_cut(true);
                tokio::time::sleep(hold).await;
                nodes[target].proxy.set_cut(false);
            }
            other => bail!("unknown chaos fault {other:?}: use kill, stop, cut"),
        }
    }
    let remaining = deadline.saturating_duration_since(Instant::now());
    tokio::time::sleep(remaining).await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        let _ = task.await;
    }
    // Heal (every fault above is already undone) and wait for convergence.
    let heal = Instant::now();
    let mut converged = None;
    while heal.elapsed() < Duration::from_secs(args.converge_timeout_s) {
        let mut digests = Vec::new();
        for node in nodes.iter() {
            let digest = match Client::connect(node.endpoint.clone()).await {
                Ok(client) => client.status().await.ok().map(|s| s.node.digest),
                Err(_) => None,
            };
            digests.push(digest);
        }
        if digests.iter().all(|d| d.is_some() && *d == digests[0]) {
            converged = Some(heal.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Final states, per region slot, from every node.
    let region_ids: Vec<(String, ReplicaId)> = nodes
        .iter()
        .map(|n| (n.region.clone(), n.replica))
        .collect();
    let mut finals: Vec<Vec<PnCounter>> = Vec::new();
    for node in nodes.iter() {
        let client = Client::connect(node.endpoint.clone()).await?;
        let mut states = Vec::new();
        for key in key_names.iter() {
            let counter = client.get_with_breakdown(key).await?;
            states.push(PnCounter::from_slots(counter.regions.iter().filter_map(
                |part| {
                    region_ids
                        .iter()
                        .find(|(region, _)| *region == part.region)
                        .map(|(_, id)| {
                            (
                                *id,
                                Slot {
                                    p: part.increments,
                                    n: part.decrements,
                                },
                            )
                        })
                },
            )));
        }
        finals.push(states);
    }
    match converged {
        Some(elapsed) => println!("convergence: {} ms after the heal", elapsed.as_millis()),
        None => checker.violate(
            0,
            "no convergence",
            format!(
                "digests still differ {} s after the heal",
                args.converge_timeout_s
            ),
        ),
    }
    for key in 0..args.keys {
        if let Some(node) = (1..n).find(|node| finals[*node][key] != finals[0][key]) {
            checker.violate(
                0,
                "replicas differ",
                format!(
                    "key {}: n0 {:?}, n{node} {:?}",
                    key_names[key], finals[0][key], finals[node][key]
                ),
            );
        }
    }
    let ledger = ledger.lock().expect("ledger lock");
    let slots = checker.check_slots(0, &ledger, &finals[0]);
    let w = &ledger.stats;
    println!(
        "workload: {} adds ({} on the hot key), {} acked, {} abandoned; slots checked {}, unacknowledged applied {}, lost {}",
        w.adds, w.hot_adds, w.acked, w.abandoned, slots.slots, slots.unacked_applied, slots.unacked_lost
    );
    if checker.violation_count == 0 {
        println!("result: PASS");
        Ok(true)
    } else {
        println!(
            "result: FAIL, {} violation(s) (seed {})",
            checker.violation_count, args.seed
        );
        for v in &checker.violations {
            println!("  {}: {}", v.kind, v.detail);
        }
        Ok(false)
    }
}

#[allow(clippy::too_many_arguments)]
async fn client_loop(
    client_id: u32,
    node: usize,
    replica: ReplicaId,
    endpoint: String,
    seed: u64,
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
    names: Arc<Vec<String>>,
) {
    let mut rng = stream(seed, Subsystem::Workload);
    let zipf = Zipf::new(names.len(), 1.1);
    let config = ClientConfig::default();
    let mut client = None;
    while !stop.load(Ordering::SeqCst) {
        if client.is_none() {
            client = config.clone().connect(endpoint.clone()).await.ok();
            if client.is_none() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        }
        let key = if chance(&mut rng, 0.3) {
            0
        } else {
            zipf.sample(&mut rng)
        };
        let negative = chance(&mut rng, 0.25);
        let issued = ledger
            .lock()
            .expect("ledger lock")
            .issue(client_id, node, key, negative, true);
        let Some(add) = issued else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let delta = ledger.lock().expect("ledger lock").adds[add as usize].delta();
        ledger.lock().expect("ledger lock").delivered(add, replica);
        let idempotency_key = format!("chaos-{seed:x}-{add}");
        let result = client
            .as_ref()
            .expect("connected above")
            .add_with_key(&names[key], delta, &idempotency_key)
            .await;
        {
            let mut ledger = ledger.lock().expect("ledger lock");
            match result {
                Ok(_) => {
                    ledger.answered(add, replica, 0, false);
                }
                Err(_) => ledger.abandon(add),
            }
        }
        tokio::time::sleep(Duration::from_millis(between(&mut rng, 0, 20))).await;
    }
}
