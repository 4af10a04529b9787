//! `tally-node dev`: a whole multi-region cluster in one process on loopback,
//! for trying Tally out. Each node is a full node (its own sled store, gRPC and
//! HTTP servers, gossip and anti-entropy), with its data under one folder.

use std::path::PathBuf;

use crate::config::{parse_duration, Settings};
use crate::engine::Durability;
use crate::server::{start, NodeHandle};

/// Flags of `tally-node dev`.
#[derive(clap::Args, Debug, Clone)]
pub struct DevArgs {
    /// How many regions.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=9))]
    pub regions: u16,
    /// How many nodes in each region.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=5))]
    pub nodes_per_region: u16,
    /// The folder that holds every node's data directory.
    #[arg(long, default_value = "tally-dev")]
    pub dir: PathBuf,
    /// The first node's gRPC port; node i uses base+10i (gRPC), +1 (gossip), +2 (HTTP).
    #[arg(long, default_value_t = 7100)]
    pub base_port: u16,
    /// Durability of every node (see `tally-node --help`).
    #[arg(long, value_enum, default_value = "sync")]
    pub durability: Durability,
    /// Anti-entropy interval.
    #[arg(long, default_value = "200ms")]
    pub sync_interval: String,
    /// Copies of each partition per region (see `tally-node --help`); with
    /// fewer nodes per region, one per node.
    #[arg(long, default_value_t = crate::config::DEFAULT_REPLICATION_FACTOR,
          value_parser = clap::value_parser!(u32).range(1..=crate::config::MAX_REPLICATION_FACTOR as i64))]
    pub replication_factor: u32,
}

/// Names of the dev cluster's regions, in order.
pub const REGION_NAMES: [&str; 9] = [
    "eu-west",
    "us-east",
    "ap-south",
    "sa-east",
    "af-south",
    "us-west",
    "eu-north",
    "ap-east",
    "me-central",
];

/// The settings of every node of the dev cluster.
pub fn dev_settings(args: &DevArgs) -> anyhow::Result<Vec<Settings>> {
    let sync_interval = parse_duration("--sync-interval", &args.sync_interval)?;
    let total = usize::from(args.regions) * usize::from(args.nodes_per_region);
    let port = |index: usize, offset: u16| -> anyhow::Result<u16> {
        u16::try_from(usize::from(args.base_port) + index * 10 + usize::from(offset)).map_err(
            |_| {
                anyhow::anyhow!(
                    "--base-port {} leaves no room for {total} nodes",
                    args.base_port
                )
            },
        )
    };
    let first_gossip = format!("127.0.0.1:{}", port(0, 1)?);
    let mut nodes = Vec::with_capacity(total);
    for (region_index, region) in REGION_NAMES
        .iter()
        .enumerate()
        .take(usize::from(args.regions))
    {
        for node_index in 0..usize::from(args.nodes_per_region) {
            let index = region_index * usize::from(args.nodes_per_region) + node_index;
            let node_name = format!("{region}-{}", node_index + 1);
            let mut settings = Settings::defaults(args.dir.join(&node_name));
            settings.region = region.to_string();
            settings.node_name = node_name;
            settings.grpc_addr = format!("127.0.0.1:{}", port(index, 0)?).parse()?;
            settings.advertise_grpc_addr = settings.grpc_addr.to_string();
            settings.gossip_addr = format!("127.0.0.1:{}", port(index, 1)?).parse()?;
            settings.advertise_gossip_addr = settings.gossip_addr;
            settings.http_addr = format!("127.0.0.1:{}", port(index, 2)?).parse()?;
            settings.seeds = if index == 0 {
                Vec::new()
            } else {
                vec![first_gossip.clone()]
            };
            settings.durability = args.durability;
            // One build, all directories new: nothing to roll back to, so
            // the cluster version rises to the newest once all have met.
            settings.cluster_version_upgrade = crate::config::ClusterVersionUpgrade::Auto;
            settings.sync_interval = sync_interval;
            settings.replication_factor = args.replication_factor;
            settings.warn_if_insecure = false;
            nodes.push(settings);
        }
    }
    Ok(nodes)
}

/// Runs the dev cluster until Ctrl-C or SIGTERM.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let mut shutdown = crate::ShutdownSignal::install()?;
    let mut nodes: Vec<NodeHandle> = Vec::new();
    for settings in dev_settings(&args)? {
        match start(settings).await {
            Ok(node) => nodes.push(node),
            Err(error) => {
                for node in nodes {
                    node.shutdown().await;
                }
                return Err(error.into());
            }
        }
    }
    println!(
        "Tally dev cluster: {} region(s), {} node(s), data under {}",
        args.regions,
        nodes.len(),
        args.dir.display()
    );
    for node in &nodes {
        println!(
            "  {:<10} {:<12} grpc http://{}  metrics http://{}/metrics",
            node.settings.region, node.settings.node_name, node.grpc_addr, node.http_addr
        );
    }
    if let Some(first) = nodes.first() {
        println!(
            "Try:  tally --endpoint http://{} add post:1:likes",
            first.grpc_addr
        );
        if let Some(last) = nodes.last() {
            println!(
                "      tally --endpoint http://{} get post:1:likes --breakdown",
                last.grpc_addr
            );
        }
    }
    println!(
        "Security is off (plain text, no client tokens): for this machine only; \
         deploy/README.md shows a secure setup."
    );
    println!("Ctrl-C stops the cluster.");
    shutdown.recv().await;
    for node in nodes {
        node.shutdown().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        dev: DevArgs,
    }

    #[test]
    fn every_node_takes_the_replication_factor_and_a_bad_one_is_refused() {
        let args = Command::parse_from([
            "dev",
            "--nodes-per-region",
            "3",
            "--replication-factor",
            "2",
        ]);
        let nodes = dev_settings(&args.dev).unwrap();
        assert_eq!(nodes.len(), 9);
        assert!(nodes.iter().all(|node| node.replication_factor == 2));
        let default = Command::parse_from(["dev"]);
        assert_eq!(default.dev.replication_factor, 3);
        for bad in ["0", "8"] {
            let error = Command::try_parse_from(["dev", "--replication-factor", bad])
                .err()
                .unwrap()
                .to_string();
            assert!(error.contains("--replication-factor"), "{error}");
        }
    }
}
