//! Setting up a chaos run (`mod.rs` drives it): the checks of its
//! arguments, each refusal naming its flag, and the cluster on loopback: per
//! node its three proxies (`tcp_proxy.rs`, `udp_proxy.rs`) and its
//! `tally-node` command line, started at once when the roster says it runs
//! from the start (a spare waits for its `join`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use tally_node::crdt::ReplicaId;
use tally_proto::partition::PartitionCount;

use super::links::{Links, Topology};
use super::node::{node_ip, NodePorts, NodeProc};
use super::schedule;
use super::tcp_proxy::{spawn_client_proxy, spawn_tcp_proxy, ProxyRules, TcpProxyHandle};
use super::udp_proxy::{spawn_udp_proxy, UdpProxyHandle};
use super::ChaosArgs;
use crate::options::Durability;

/// What the arguments decide, once checked.
pub(super) struct Settings {
    /// The `tally-node` binary the nodes run.
    pub bin: PathBuf,
    /// `--durability replicated`.
    pub replicated: bool,
    /// `--replication-factor` given: the regions are partitioned.
    pub partitioned: bool,
    /// The fault menu.
    pub faults: Vec<String>,
    /// `--partitions`, as the nodes hash keys with it.
    pub key_partitions: PartitionCount,
}

/// Checks the arguments; a refusal names the flag to change.
pub(super) fn check_args(args: &ChaosArgs) -> anyhow::Result<Settings> {
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
    if args.regions == 0 || args.nodes_per_region == 0 || args.keys == 0 {
        bail!("--regions, --nodes-per-region and --keys must be at least 1");
    }
    let replicated = args.durability == Durability::Replicated;
    if replicated && !(2..=7).contains(&args.write_copies) {
        bail!("--write-copies must be 2 to 7 (the taking node included)");
    }
    if replicated && args.write_copies > args.nodes_per_region {
        bail!(
            "--durability replicated --write-copies {} needs at least {} nodes per region (--nodes-per-region is {})",
            args.write_copies,
            args.write_copies,
            args.nodes_per_region
        );
    }
    let partitioned = match args.replication_factor {
        Some(rf) if (1..=args.nodes_per_region.min(7)).contains(&rf) => true,
        Some(rf) => bail!(
            "--replication-factor {rf} must be 1 to 7 and at most --nodes-per-region ({})",
            args.nodes_per_region
        ),
        None => false,
    };
    if let Some(rf) = args
        .replication_factor
        .filter(|rf| replicated && args.write_copies > *rf)
    {
        bail!(
            "--durability replicated --write-copies {} needs --replication-factor at least {} (it is {rf}): a key's copies go only to nodes holding its partition",
            args.write_copies,
            args.write_copies
        );
    }
    let faults = schedule::parse_faults(args.faults.as_deref().unwrap_or(if partitioned {
        "kill,stop,partition,wipe,overlap,client,join,drain,remove"
    } else {
        "kill,stop,partition,wipe,overlap,client"
    }))?;
    if let Some(fault) = faults
        .iter()
        .find(|fault| !partitioned && schedule::MEMBERSHIP_FAULTS.contains(&fault.as_str()))
    {
        bail!("the fault {fault} changes a partitioned region's membership: pass --replication-factor");
    }
    let key_partitions = tally_proto::partition::PartitionCount::new(u64::from(args.partitions))
        .map_err(|_| anyhow::anyhow!("--partitions {} must be 1 to 65536", args.partitions))?;
    Ok(Settings {
        bin,
        replicated,
        partitioned,
        faults,
        key_partitions,
    })
}

/// The proxies' rules: no link fault yet, and the WAN delay between nodes
/// of different regions.
pub(super) fn proxy_rules(topology: &Topology, wan: Duration) -> ProxyRules {
    let n = topology.nodes();
    ProxyRules {
        links: Links::default(),
        node_of_ip: Arc::new((0..n).map(|i| (node_ip(i), i)).collect::<HashMap<_, _>>()),
        delays: Arc::new(
            (0..n)
                .map(|a| {
                    (0..n)
                        .map(|b| {
                            if topology.region_of[a] == topology.region_of[b] {
                                Duration::ZERO
                            } else {
                                wan
                            }
                        })
                        .collect()
                })
                .collect(),
        ),
    }
}

/// The nodes of a run and what runs in front of them.
pub(super) struct Cluster {
    /// Every node, spares included (not started until their join).
    pub nodes: Vec<NodeProc>,
    /// Each node's gRPC, gossip and client proxies; dropping them stops
    /// them.
    pub proxies: Vec<(TcpProxyHandle, UdpProxyHandle, TcpProxyHandle)>,
    /// Per node, the switch of its client proxy (on: answers are dropped).
    pub client_cuts: Vec<tokio::sync::watch::Sender<bool>>,
    /// How many answers the client proxies dropped.
    pub answers_dropped: Arc<AtomicU64>,
}

/// Starts every node's proxies, and the nodes that run from the start
/// (`started`), with data directories under `dir`.
pub(super) async fn start_cluster(
    args: &ChaosArgs,
    settings: &Settings,
    topology: &Topology,
    started: &[bool],
    ports: &[NodePorts],
    dir: &Path,
    rules: &ProxyRules,
) -> anyhow::Result<Cluster> {
    let n = topology.nodes();
    let options = crate::options::SimOptions {
        regions: args.regions,
        ..Default::default()
    };
    let advertised_gossip: Vec<String> = (0..n)
        .map(|i| format!("{}:{}", node_ip(i), ports[i].gossip_proxy))
        .collect();
    let mut proxies: Vec<(TcpProxyHandle, UdpProxyHandle, TcpProxyHandle)> = Vec::new();
    let answers_dropped = Arc::new(AtomicU64::new(0));
    let mut client_cuts = Vec::new();
    let mut nodes = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let ip = node_ip(i);
        let region = options.region_name(topology.region_of[i]);
        let tcp = spawn_tcp_proxy(
            &format!("{ip}:{}", port.grpc_proxy),
            format!("{ip}:{}", port.grpc),
            i,
            rules.clone(),
        )
        .await?;
        let udp = spawn_udp_proxy(
            &advertised_gossip[i],
            format!("{ip}:{}", port.gossip).parse()?,
            i,
            rules.clone(),
        )
        .await?;
        let (cut_tx, cut_rx) = tokio::sync::watch::channel(false);
        client_cuts.push(cut_tx);
        let client_proxy = spawn_client_proxy(
            &format!("{ip}:{}", port.client_proxy),
            format!("{ip}:{}", port.grpc),
            cut_rx,
            answers_dropped.clone(),
        )
        .await?;
        proxies.push((tcp, udp, client_proxy));
        let data_dir = dir.join(format!("n{i}"));
        let mode = [
            ("--durability", args.durability.to_string()),
            ("--write-copies", args.write_copies.to_string()),
        ];
        let partitioning = [
            ("--partitions", args.partitions.to_string()),
            (
                "--replication-factor",
                args.replication_factor.unwrap_or(0).to_string(),
            ),
        ];
        let node_args: Vec<String> = [
            ("--data-dir", data_dir.display().to_string()),
            ("--region", region.clone()),
            ("--node-name", format!("n{i}")),
            ("--grpc-addr", format!("{ip}:{}", port.grpc)),
            ("--advertise-grpc-addr", format!("{ip}:{}", port.grpc_proxy)),
            ("--gossip-addr", format!("{ip}:{}", port.gossip)),
            ("--advertise-gossip-addr", advertised_gossip[i].clone()),
            ("--http-addr", format!("{ip}:{}", port.http)),
            ("--peer-source-ip", ip.to_string()),
            ("--seeds", advertised_gossip.join(",")),
            ("--cluster-id", format!("chaos-{}", args.seed)),
            ("--sync-interval", "200ms".into()),
        ]
        .into_iter()
        .chain(mode.into_iter().filter(|_| settings.replicated))
        .chain(partitioning.into_iter().filter(|_| settings.partitioned))
        .chain(
            [("--retire-after", super::folds::RETIRE_AFTER.to_string())]
                .into_iter()
                .filter(|_| args.retire),
        )
        .flat_map(|(flag, value)| [flag.to_string(), value])
        .collect();
        let mut node = NodeProc {
            name: format!("n{i}"),
            region,
            args: node_args,
            data_dir,
            log: dir.join(format!("n{i}.log")),
            child: None,
            endpoint: format!("http://{ip}:{}", port.grpc),
            client_endpoint: format!("http://{ip}:{}", port.client_proxy),
            replica: ReplicaId(0),
            http_addr: format!("{ip}:{}", port.http),
        };
        if started[i] {
            node.spawn(&settings.bin)?;
        }
        nodes.push(node);
    }
    Ok(Cluster {
        nodes,
        proxies,
        client_cuts,
        answers_dropped,
    })
}
