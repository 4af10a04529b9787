//! `tally-node dev`: a whole multi-region cluster in one process on loopback,
//! for trying Tally out. Each node is a full node (its own sled store, gRPC and
//! HTTP servers, gossip and anti-entropy), with its data under one folder.

use crate::http::index::DEMO_KEY;
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
    let endpoints: Vec<BannerNode> = nodes
        .iter()
        .map(|node| BannerNode {
            region: node.settings.region.clone(),
            node_name: node.settings.node_name.clone(),
            grpc_addr: node.grpc_addr,
            http_addr: node.http_addr,
        })
        .collect();
    print!("{}", banner(args.regions, &args.dir, &endpoints));
    shutdown.recv().await;
    for node in nodes {
        node.shutdown().await;
    }
    Ok(())
}

/// What the banner shows of one node.
pub struct BannerNode {
    /// Its region.
    pub region: String,
    /// Its name.
    pub node_name: String,
    /// Where its gRPC server listens.
    pub grpc_addr: std::net::SocketAddr,
    /// Where its HTTP server listens.
    pub http_addr: std::net::SocketAddr,
}

/// The counter the banner's examples add to (a post's views). The demo
/// page shows the post's like set, [`DEMO_KEY`], which the README's first
/// like (`tally like post:1 sam`) fills.
const EXAMPLE_KEY: &str = "post:1:views";

/// What `tally-node dev` prints once every node serves: per node, its gRPC
/// endpoint (the CLI's and the client library's) and what its HTTP port
/// serves (the JSON API, its OpenAPI document, the status page, the demo
/// page, the metrics), then commands to try. Every line ends with a full URL
/// or is plain text, so a terminal makes each one a link.
pub fn banner(regions: u16, dir: &std::path::Path, nodes: &[BannerNode]) -> String {
    use std::fmt::Write;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "Tally dev cluster: {regions} region(s), {} node(s), data under {}",
        nodes.len(),
        dir.display()
    );
    for node in nodes {
        let http = format!("http://{}", node.http_addr);
        let _ = writeln!(text, "  {} ({})", node.node_name, node.region);
        let _ = writeln!(text, "    grpc      http://{}", node.grpc_addr);
        let _ = writeln!(text, "    http api  {http}/v1/");
        let _ = writeln!(text, "    openapi   {http}/v1/openapi.json");
        let _ = writeln!(text, "    status    {http}/status");
        let _ = writeln!(text, "    demo      {http}/demo/{DEMO_KEY}");
        let _ = writeln!(text, "    metrics   {http}/metrics");
    }
    if let (Some(first), Some(last)) = (nodes.first(), nodes.last()) {
        let _ = writeln!(
            text,
            "Try:  tally --endpoint http://{} add {EXAMPLE_KEY}",
            first.grpc_addr
        );
        let _ = writeln!(
            text,
            "      tally --endpoint http://{} get {EXAMPLE_KEY} --breakdown",
            last.grpc_addr
        );
        let _ = writeln!(
            text,
            "      tally --endpoint http://{} like {DEMO_KEY} sam   # the heart on the demo page fills",
            first.grpc_addr
        );
        let _ = writeln!(
            text,
            "      curl -X POST http://{}/v1/counters/{} -H 'content-type: application/json' -d '{{\"delta\": 1}}'",
            first.http_addr,
            EXAMPLE_KEY.replace(':', "%3A")
        );
    }
    let _ = writeln!(
        text,
        "gRPC (tally, the client library) and HTTP (curl, browsers) are different ports: \
         gRPC on the first, HTTP two above."
    );
    let _ = writeln!(
        text,
        "Security is off (plain text, no client tokens): for this machine only; \
         deploy/README.md shows a secure setup."
    );
    let _ = writeln!(text, "Ctrl-C stops the cluster.");
    text
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
