//! One `tally-node` process of a chaos run: its loopback IP, its ports, its
//! command line, and the signals the faults send it.
//!
//! Node `i` lives on 127.A.B.(i+2), where A.B are the two low bytes of this
//! process's id (Linux routes all of 127/8 to `lo`): its gRPC, gossip and
//! HTTP listen there, its outgoing pulls are bound there
//! (`--peer-source-ip`), and its two proxies listen there too, so every proxy
//! can tell from a source IP which node is talking. Runs side by side (the
//! chaos tests) thus never share an address: on one shared 127.0.0.x they
//! did, and a port chosen free by one run (a spare's, kept unbound until it
//! joins) could be taken by another run's node or connection meanwhile.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tally_client::Client;
use tally_node::crdt::ReplicaId;

/// The ports of one node.
#[derive(Clone, Copy, Debug)]
pub struct NodePorts {
    /// Real gRPC.
    pub grpc: u16,
    /// Real gossip (UDP).
    pub gossip: u16,
    /// HTTP.
    pub http: u16,
    /// The TCP proxy in front of gRPC (advertised).
    pub grpc_proxy: u16,
    /// The UDP proxy in front of gossip (advertised).
    pub gossip_proxy: u16,
    /// The TCP proxy in front of gRPC for the node's clients.
    pub client_proxy: u16,
}

/// The loopback IP of node `index` (module documentation).
pub fn node_ip(index: usize) -> IpAddr {
    let [_, _, a, b] = std::process::id().to_be_bytes();
    IpAddr::V4(Ipv4Addr::new(127, a, b, 2 + index as u8))
}

/// True for the ports other runs on this machine use.
pub fn forbidden(port: u16) -> bool {
    [7100..7200, 17100..17200, 27100..27200]
        .iter()
        .any(|range| range.contains(&port))
}

fn free_on(ip: IpAddr, port: u16) -> bool {
    !forbidden(port)
        && std::net::TcpListener::bind((ip, port)).is_ok()
        && std::net::UdpSocket::bind((ip, port)).is_ok()
}

/// Five ports per node, from `base` (node `i` takes `base + 10 i` and the
/// next ones) or chosen by the system; each checked free (TCP and UDP) on the
/// node's own IP.
pub fn assign_ports(nodes: usize, base: Option<u16>) -> anyhow::Result<Vec<NodePorts>> {
    let mut all = Vec::new();
    for i in 0..nodes {
        let ip = node_ip(i);
        let ports: Vec<u16> = match base {
            Some(base) => {
                let first = base as u32 + 10 * i as u32;
                if first + 6 > u16::MAX as u32 {
                    bail!("--base-port {base} leaves no room for {nodes} nodes");
                }
                [0, 1, 2, 5, 6, 3]
                    .map(|offset| (first + offset) as u16)
                    .to_vec()
            }
            None => {
                let mut picked = Vec::new();
                while picked.len() < 6 {
                    let listener = std::net::TcpListener::bind((ip, 0))?;
                    let port = listener.local_addr()?.port();
                    drop(listener);
                    if free_on(ip, port) && !picked.contains(&port) {
                        picked.push(port);
                    }
                }
                picked
            }
        };
        for port in &ports {
            if forbidden(*port) {
                bail!("--base-port overlaps a reserved port range (7100-7199, 17100-17199, 27100-27199)");
            }
            if !free_on(ip, *port) {
                bail!("port {port} is taken on {ip}; pass another --base-port or let the system choose");
            }
        }
        all.push(NodePorts {
            grpc: ports[0],
            gossip: ports[1],
            http: ports[2],
            grpc_proxy: ports[3],
            gossip_proxy: ports[4],
            client_proxy: ports[5],
        });
    }
    Ok(all)
}

/// One node process.
pub struct NodeProc {
    /// `n0`, `n1`, ...
    pub name: String,
    /// Its region's name.
    pub region: String,
    /// Its command line.
    pub args: Vec<String>,
    /// Its data directory (deleted by a wipe).
    pub data_dir: PathBuf,
    /// Its log file (stdout and stderr, appended across restarts).
    pub log: PathBuf,
    /// The running process.
    pub child: Option<Child>,
    /// Its real gRPC endpoint (the checker; no proxy).
    pub endpoint: String,
    /// Where its clients connect: the client proxy in front of `endpoint`.
    pub client_endpoint: String,
    /// Its current replica id.
    pub replica: ReplicaId,
    /// Its HTTP address (`/metrics`).
    pub http_addr: String,
}

impl NodeProc {
    /// The value of one counter of its `/metrics` (summed over label sets
    /// matching `labels`), since the process last started; `None` when the
    /// node does not answer.
    pub async fn metric(&self, name: &str, labels: &str) -> Option<u64> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let fetch = async {
            let mut stream = tokio::net::TcpStream::connect(&self.http_addr).await.ok()?;
            // HTTP/1.0: the answer is not chunked, and ends with the connection.
            let request = format!("GET /metrics HTTP/1.0\r\nHost: {}\r\n\r\n", self.http_addr);
            stream.write_all(request.as_bytes()).await.ok()?;
            let mut body = String::new();
            stream.read_to_string(&mut body).await.ok()?;
            Some(body)
        };
        let body = tokio::time::timeout(std::time::Duration::from_secs(5), fetch)
            .await
            .ok()??;
        let total = body
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| line.split_once(' '))
            .filter(|(series, _)| series.split('{').next() == Some(name) && series.contains(labels))
            .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
            .sum::<f64>();
        Some(total as u64)
    }
    /// Starts the process.
    pub fn spawn(&mut self, bin: &Path) -> anyhow::Result<()> {
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
        Ok(())
    }

    /// Starts the process and waits (30 s at most) until it answers as this
    /// node of `cluster`; returns its replica id.
    pub async fn start(&mut self, bin: &Path, cluster: &str) -> anyhow::Result<ReplicaId> {
        self.spawn(bin)?;
        wait_ready(&self.endpoint, cluster, &self.name, Duration::from_secs(30)).await
    }

    /// `kill -9`, and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends a signal (`-STOP`, `-CONT`) to the process, by its id.
    pub fn signal(&mut self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
        }
    }
}

impl Drop for NodeProc {
    /// No process outlives the run, whatever ends it (an error, a panic).
    fn drop(&mut self) {
        self.signal("-CONT");
        self.kill();
    }
}

/// Waits until the node at `endpoint` answers as node `name` of `cluster`;
/// returns its replica id.
pub async fn wait_ready(
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
