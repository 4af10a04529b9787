//! A harness for tests with real `tally-node` processes on loopback: free
//! ports, start/stop/kill -9/SIGSTOP, clusters of several regions, and
//! bounded waits. Every process is killed when its handle drops.

#![allow(dead_code)]

pub mod certs;
pub mod http;
pub mod kill_load;
pub mod load;
pub mod python;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The node binary under test.
pub fn node_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tally-node"))
}

/// The `tally` CLI binary, built next to the node binary (by `cargo test
/// --workspace`, or on demand here).
pub fn cli_binary() -> PathBuf {
    let path = node_binary().with_file_name("tally");
    if !path.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "tally-cli", "--bin", "tally"])
            .status()
            .expect("running cargo to build the tally CLI");
        assert!(status.success(), "building the tally CLI failed");
    }
    path
}

/// Where [`free_ports`] hands out ports: below the kernel's ephemeral range
/// (32768 and up), so that no outgoing connection of a node already running
/// takes a port between the probe and the node's own bind (the cause of a CI
/// failure: "cannot listen on --grpc-addr 127.0.0.1:45703: Address already in
/// use"), and away from [`free_port_block`]'s range (20000-31999) and the
/// ranges other runs on this machine use (7100-7199, 17100-17199).
const PORTS_FROM: u32 = 10_000;
const PORTS_TO: u32 = 20_000;

/// `count` distinct ports free for both TCP and UDP on 127.0.0.1. Each port
/// is handed out once per test process (a cursor that starts at a place that
/// depends on the process id, so that two test binaries run side by side
/// rarely probe the same ports).
pub fn free_ports(count: usize) -> Vec<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = PORTS_TO - PORTS_FROM;
    let _ = CURSOR.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % span,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    let mut ports = Vec::new();
    let mut probed = 0;
    while ports.len() < count {
        assert!(
            probed < span,
            "no {count} free ports between {PORTS_FROM} and {PORTS_TO}"
        );
        probed += 1;
        let port = (PORTS_FROM + CURSOR.fetch_add(1, Ordering::Relaxed) % span) as u16;
        if (17_100..17_200).contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && UdpSocket::bind(("127.0.0.1", port)).is_ok()
        {
            ports.push(port);
        }
    }
    ports
}

/// How one node is started.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub region: String,
    pub node_name: String,
    pub data_dir: PathBuf,
    pub grpc: SocketAddr,
    pub gossip: SocketAddr,
    pub http: SocketAddr,
    pub seeds: Vec<SocketAddr>,
    pub durability: &'static str,
    pub cluster_id: String,
    pub sync_interval: &'static str,
    pub extra: Vec<String>,
}

impl NodeSpec {
    /// A node on fresh ports with its data under `root`.
    pub fn new(root: &Path, region: &str, node_name: &str) -> NodeSpec {
        let ports = free_ports(3);
        let addr = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        NodeSpec {
            region: region.into(),
            node_name: node_name.into(),
            data_dir: root.join(node_name),
            grpc: addr(ports[0]),
            gossip: addr(ports[1]),
            http: addr(ports[2]),
            seeds: Vec::new(),
            durability: "sync",
            cluster_id: "test-cluster".into(),
            sync_interval: "100ms",
            extra: Vec::new(),
        }
    }

    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--data-dir".into(),
            self.data_dir.display().to_string(),
            "--region".into(),
            self.region.clone(),
            "--node-name".into(),
            self.node_name.clone(),
            "--grpc-addr".into(),
            self.grpc.to_string(),
            "--gossip-addr".into(),
            self.gossip.to_string(),
            "--http-addr".into(),
            self.http.to_string(),
            "--durability".into(),
            self.durability.into(),
            "--cluster-id".into(),
            self.cluster_id.clone(),
            "--sync-interval".into(),
            self.sync_interval.into(),
            "--gossip-interval".into(),
            "100ms".into(),
        ];
        if !self.seeds.is_empty() {
            args.push("--seeds".into());
            args.push(
                self.seeds
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// A running (or stopped) node process.
pub struct NodeProcess {
    pub spec: NodeSpec,
    child: Option<Child>,
    log: PathBuf,
    starts: usize,
    /// Tells whether the node at this HTTP address is ready (default: a
    /// plain-HTTP `/readyz` answers 200).
    ready_probe: Option<ReadyProbe>,
}

/// See [`NodeProcess::start_with_probe`].
pub type ReadyProbe = Box<dyn Fn(SocketAddr) -> bool + Send>;

impl NodeProcess {
    /// [`Self::start`] from async code: on a blocking thread, so the
    /// test's runtime keeps running while the node starts.
    pub async fn start_async(spec: NodeSpec) -> Self {
        tokio::task::spawn_blocking(move || NodeProcess::start(spec))
            .await
            .expect("starting the node")
    }

    /// Starts the node and waits until `/readyz` answers (at most 30 s).
    pub fn start(spec: NodeSpec) -> NodeProcess {
        NodeProcess::launched(spec, None)
    }

    /// [`NodeProcess::start`] with another readiness check (e.g. over HTTPS).
    pub fn start_with_probe(
        spec: NodeSpec,
        probe: impl Fn(SocketAddr) -> bool + Send + 'static,
    ) -> NodeProcess {
        NodeProcess::launched(spec, Some(Box::new(probe)))
    }

    fn launched(spec: NodeSpec, ready_probe: Option<ReadyProbe>) -> NodeProcess {
        let mut node = NodeProcess {
            log: spec.data_dir.with_extension("log"),
            spec,
            child: None,
            starts: 0,
            ready_probe,
        };
        node.launch();
        node
    }

    /// Starts the process and returns without waiting (for tests of start-up errors).
    pub fn spawn_raw(spec: &NodeSpec) -> std::process::Output {
        Self::spawn_raw_via(spec, &[])
    }

    /// [`NodeProcess::spawn_raw`] through a wrapper command (e.g. `setpriv`
    /// to run as another user); the node's path and arguments follow it.
    pub fn spawn_raw_via(spec: &NodeSpec, wrapper: &[&str]) -> std::process::Output {
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(node_binary());
                command
            }
            None => Command::new(node_binary()),
        };
        command
            .args(spec.args())
            .stdin(Stdio::null())
            .output()
            .expect("running tally-node")
    }

    fn launch(&mut self) {
        if let Err(log) = self.start_and_wait() {
            panic!("tally-node exited at start; log:\n{log}");
        }
    }

    /// Starts the process and waits until `/readyz` answers. A process that
    /// exits first gives `Err` with what it logged during this start; one that
    /// neither exits nor becomes ready within 30 s is a panic.
    fn start_and_wait(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(self.spec.data_dir.parent().unwrap()).unwrap();
        let offset = std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0) as usize;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(node_binary())
            .args(self.spec.args())
            .env("RUST_LOG", "info,chitchat=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting tally-node");
        self.child = Some(child);
        self.starts += 1;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.child.as_mut().unwrap().try_wait().unwrap().is_some() {
                self.child = None;
                let text = self.log_text();
                return Err(text.get(offset..).unwrap_or(&text).to_string());
            }
            let ready = match &self.ready_probe {
                Some(probe) => probe(self.spec.http),
                None => http_get(self.spec.http, "/readyz")
                    .map(|(code, _)| code == 200)
                    .unwrap_or(false),
            };
            if ready {
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "tally-node not ready after 30 s; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The node's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The gRPC endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.spec.grpc)
    }

    /// The process id of the running node.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("node is running").id()
    }

    fn signal(&self, signal: &str) {
        send_signal(self.pid(), signal);
    }

    /// `kill -9`: no flush, no goodbye.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait for a clean exit (at most 20 s); returns the exit code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("tally-node did not stop within 20 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGSTOP: the process freezes, its sockets stay open.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Starts the process again with the same settings (and data directory).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop or kill the node first");
        self.launch();
    }

    /// Deletes the node's data directory (the node must be stopped).
    pub fn wipe(&mut self) {
        assert!(self.child.is_none(), "stop or kill the node first");
        std::fs::remove_dir_all(&self.spec.data_dir).unwrap();
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends a signal (`-STOP`, `-CONT`, `-KILL`) to a process, as `kill` does.
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid} failed");
}

/// `node`'s `/status.json`, when it answers 200 with JSON.
pub fn status_of(node: &NodeProcess) -> Option<serde_json::Value> {
    let (code, body) = http_get(node.spec.http, "/status.json").ok()?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

/// `node`'s cluster version, from its status page.
pub fn cluster_version(node: &NodeProcess) -> Option<u64> {
    status_of(node)?["cluster_version"].as_u64()
}

/// A minimal HTTP/1.1 GET on loopback: (status code, body).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http_get_with(addr, path, None)
}

/// [`http_get`] with an `Authorization` header, when given.
pub fn http_get_with(
    addr: SocketAddr,
    path: &str,
    authorization: Option<&str>,
) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let header = authorization
        .map(|value| format!("Authorization: {value}\r\n"))
        .unwrap_or_default();
    // One write, as curl sends a request (`write!` writes piece by piece).
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{header}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// Runs the `tally` CLI; returns (exit code, stdout, stderr).
pub fn cli(endpoint: &str, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(cli_binary())
        .arg("--endpoint")
        .arg(endpoint)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running tally");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Waits (blocking) until every node of `endpoints` reports at least cluster
/// version `version` in `tally --json status` (folds need 4), at most `limit`.
pub fn wait_cluster_version(endpoints: &[String], version: u64, limit: Duration) {
    for endpoint in endpoints {
        wait_until(limit, &format!("cluster version {version}"), || {
            let (code, out, _) = cli(endpoint, &["--json", "status"]);
            let status: serde_json::Value = serde_json::from_str(&out).ok()?;
            (code == 0 && status["cluster_version"].as_u64()? >= version).then_some(())
        });
    }
}

/// Polls `check` every 50 ms until it returns `Some`, or panics after `limit`
/// with `what`. Returns the value and how long it took.
pub fn wait_until<T>(
    limit: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> (T, Duration) {
    let started = Instant::now();
    loop {
        if let Some(value) = check() {
            return (value, started.elapsed());
        }
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts the nodes of `specs` in order, every one after the first seeded
/// from the first's gossip address, each waited on until ready.
pub fn start_seeded(mut specs: Vec<NodeSpec>) -> Vec<NodeProcess> {
    let seed = specs[0].gossip;
    for spec in specs.iter_mut().skip(1) {
        spec.seeds = vec![seed];
    }
    specs.into_iter().map(NodeProcess::start).collect()
}

/// One node in each of eu, us and ap (`eu-1`, `us-1`, `ap-1`), each with the
/// extra flags `extra`, seeded from eu-1 and started in that order.
pub fn start_three_regions(root: &Path, extra: &[&str]) -> Vec<NodeProcess> {
    let specs = ["eu", "us", "ap"]
        .iter()
        .map(|region| {
            let mut spec = NodeSpec::new(root, region, &format!("{region}-1"));
            spec.extra = extra.iter().map(|flag| flag.to_string()).collect();
            spec
        })
        .collect();
    start_seeded(specs)
}

/// A cluster: `layout` lists (region, nodes in it). Every node seeds from the first.
pub struct Cluster {
    pub root: tempfile::TempDir,
    pub nodes: Vec<NodeProcess>,
}

impl Cluster {
    pub fn start(layout: &[(&str, usize)], durability: &'static str) -> Cluster {
        let root = tempfile::tempdir().unwrap();
        let mut specs = Vec::new();
        for (region, count) in layout {
            for index in 0..*count {
                let mut spec =
                    NodeSpec::new(root.path(), region, &format!("{region}-{}", index + 1));
                spec.durability = durability;
                specs.push(spec);
            }
        }
        let nodes = start_seeded(specs);
        Cluster { root, nodes }
    }

    /// [`Cluster::start`] from async code (starting waits for readiness).
    pub async fn spawn(
        layout: &'static [(&'static str, usize)],
        durability: &'static str,
    ) -> Cluster {
        tokio::task::spawn_blocking(move || Cluster::start(layout, durability))
            .await
            .unwrap()
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.endpoint()).collect()
    }
}

// Helpers for single_node.rs and crash_loop.rs.

impl NodeProcess {
    /// Like [`NodeProcess::restart`], but a process that exits before it is
    /// ready is not a panic: the result is `Err` with what the node logged
    /// during this start (its stderr included). Gives up (panics) if the node
    /// neither exits nor becomes ready within 30 s.
    pub fn try_restart(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "stop or kill the node first");
        self.start_and_wait()
    }
}

/// Runs the node once with `spec`'s arguments, the value of each flag in
/// `replace` swapped for the given one (e.g. `("--grpc-addr", "nowhere")`),
/// and returns its output (for tests of start-up errors).
pub fn spawn_raw_replacing(spec: &NodeSpec, replace: &[(&str, &str)]) -> std::process::Output {
    let mut args = spec.args();
    for (flag, value) in replace {
        let at = args
            .iter()
            .position(|arg| arg == flag)
            .unwrap_or_else(|| panic!("no {flag} in the arguments"));
        args[at + 1] = (*value).to_string();
    }
    Command::new(node_binary())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running tally-node")
}

/// A base port `b` such that `b..b+count` are all free for TCP and UDP on
/// 127.0.0.1, below the kernel's ephemeral range (so that no outgoing
/// connection takes one of them meanwhile).
pub fn free_port_block(count: u16) -> u16 {
    for attempt in 0..200u32 {
        let base = 20_000
            + ((std::process::id().wrapping_mul(7919) + attempt * 104_729) % 120) as u16 * 100;
        let all_free = (base..base + count).all(|port| {
            TcpListener::bind(("127.0.0.1", port)).is_ok()
                && UdpSocket::bind(("127.0.0.1", port)).is_ok()
        });
        if all_free {
            return base;
        }
    }
    panic!("no block of {count} free ports found");
}

impl NodeProcess {
    /// Waits (at most `limit`) for the process to exit by itself; its exit
    /// code, or `None` if it is still running at the limit (it keeps running).
    pub fn wait_for_exit(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        loop {
            let child = self.child.as_mut()?;
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return Some(status.code().unwrap_or(-1));
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs the node with `spec`'s arguments until it exits, or kills it after
/// `limit` (a node that starts when it should refuse is a failure, not a
/// hang): (exit code, None if killed; stderr).
pub fn run_bounded(spec: &NodeSpec, limit: Duration) -> (Option<i32>, String) {
    let stderr_path = spec.data_dir.with_extension("stderr");
    std::fs::create_dir_all(spec.data_dir.parent().unwrap()).unwrap();
    run_bounded_logging_to(spec, limit, &stderr_path)
}

/// [`run_bounded`], with the node's standard error kept in `stderr_path`
/// (away from a data directory on a full disk, say).
pub fn run_bounded_logging_to(
    spec: &NodeSpec,
    limit: Duration,
    stderr_path: &Path,
) -> (Option<i32>, String) {
    let mut child = Command::new(node_binary())
        .args(spec.args())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(stderr_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + limit;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        code,
        std::fs::read_to_string(stderr_path).unwrap_or_default(),
    )
}

/// The name of `key`'s first owner in `map` (the node that takes its adds
/// in that region, every node being live).
pub fn first_owner(map: &tally_client::PartitionMap, key: &str) -> String {
    let count = tally_proto::partition::PartitionCount::new(u64::from(map.partitions)).unwrap();
    map.owners_of(count.of_key(key.as_bytes()).0)[0].to_string()
}

/// Waits until the node at `endpoint` knows `nodes` nodes in its own
/// region (owners depend on the names only), and returns its partition map.
pub async fn region_map(endpoint: &str, nodes: usize) -> tally_client::PartitionMap {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(client) = tally_client::Client::connect(endpoint.to_string()).await {
            if let Ok(map) = client.partition_map(None).await {
                if map.nodes.len() == nodes {
                    return map;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "{endpoint}: {nodes} nodes not seen"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A node of a partitioned cluster: `partitions` partitions, replication
/// factor `rf`, and a --dead-after long enough that a kill never moves a
/// partition during a test.
pub fn partitioned_spec(
    root: &Path,
    region: &str,
    name: &str,
    partitions: u32,
    rf: u32,
) -> NodeSpec {
    let mut spec = NodeSpec::new(root, region, name);
    spec.extra = vec![
        "--partitions".into(),
        partitions.to_string(),
        "--replication-factor".into(),
        rf.to_string(),
        "--dead-after".into(),
        "10m".into(),
    ];
    spec
}

/// A raw gRPC add of 1 to `key` with `idempotency_key` ("" for none) and a
/// 10 s deadline.
pub fn add_one(key: &str, idempotency_key: &str) -> tonic::Request<tally_proto::v1::AddRequest> {
    let mut request = tonic::Request::new(tally_proto::v1::AddRequest {
        key: key.as_bytes().to_vec().into(),
        delta: 1,
        idempotency_key: idempotency_key.into(),
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(10));
    request
}

/// Every counter the node at `endpoint` stores, as a raw `Pull` of
/// everything (no scope) from the start returns them.
pub async fn stored_counters(endpoint: &str) -> Vec<tally_proto::v1::CounterState> {
    stored_counters_of(endpoint).await.1
}

/// The node's replica id, and every counter it stores (see [`stored_counters`]).
pub async fn stored_counters_of(endpoint: &str) -> (u64, Vec<tally_proto::v1::CounterState>) {
    let mut replication =
        tally_proto::v1::replication_client::ReplicationClient::connect(endpoint.to_string())
            .await
            .unwrap()
            .max_decoding_message_size(16 << 20);
    let mut stream = replication
        .pull(tally_proto::v1::PullRequest {
            cluster_id: "test-cluster".into(),
            caller_replica: 77,
            max_bytes: 16 << 20,
            // A caller of every version: a new cluster is at the newest.
            protocol_version: tally_node::replica::version::NEWEST,
            protocol_oldest: tally_node::replica::version::OLDEST,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut counters = Vec::new();
    let mut source = 0;
    while let Some(chunk) = stream.message().await.unwrap() {
        source = chunk.source_replica;
        counters.extend(chunk.counters);
    }
    (source, counters)
}

/// The map of its own region as the node at `endpoint` computes it.
async fn region_map_of(endpoint: &str) -> Option<tally_client::PartitionMap> {
    let client = tally_client::Client::connect(endpoint.to_string())
        .await
        .ok()?;
    client.partition_map(None).await.ok()
}

/// Waits until every node (all of one region) answers the same map of
/// its region, with `nodes` nodes all active and each holding exactly the
/// partitions it owns (nothing is received or released any more).
pub async fn settled_region_map(endpoints: &[String], nodes: usize) -> tally_client::PartitionMap {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut maps = Vec::new();
        for endpoint in endpoints {
            if let Some(map) = region_map_of(endpoint).await {
                maps.push(map);
            }
        }
        let settled = maps.len() == endpoints.len()
            && maps.iter().all(|map| {
                map.owners == maps[0].owners
                    && map.nodes.len() == nodes
                    && map.nodes.iter().all(|node| {
                        node.state == "active"
                            && node.alive
                            && node.partitions_held == node.partitions_owned
                            && node.partitions_releasing == 0
                    })
            });
        if settled {
            // Routes follow the map in the same keeper round; one more round.
            tokio::time::sleep(Duration::from_millis(500)).await;
            return maps.swap_remove(0);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no settled map: {maps:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A counter with its slots as the node at `endpoint` holds it itself: the
/// request is marked forwarded, so the node answers from its own state or
/// refuses (it does not forward to an owner).
pub async fn own_counter(
    endpoint: &str,
    key: &str,
) -> Result<tally_proto::v1::GetResponse, tonic::Status> {
    let mut client =
        tally_proto::v1::counters_client::CountersClient::connect(endpoint.to_string())
            .await
            .map_err(|error| tonic::Status::unavailable(error.to_string()))?;
    let mut request = tonic::Request::new(tally_proto::v1::GetRequest {
        key: key.as_bytes().to_vec().into(),
        breakdown: false,
        slots: true,
    });
    request
        .metadata_mut()
        .insert("tally-forwarded", "the-test".parse().unwrap());
    request.set_timeout(Duration::from_secs(5));
    Ok(client.get(request).await?.into_inner())
}

/// The value of the sample `series` (a metric name with its labels, as
/// the text format writes them) in a `/metrics` text; `None` when absent.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// How many messages `node`'s metrics text counts as refused for `reason`.
pub fn refused_count(metrics: &str, reason: &str) -> f64 {
    sample(
        metrics,
        &format!("tally_refused_messages_total{{reason=\"{reason}\"}}"),
    )
    .unwrap_or(0.0)
}
