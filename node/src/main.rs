//! `tally-node`: runs one Tally region node, or (`tally-node dev`) a whole
//! multi-region cluster on loopback for trying Tally out.

use clap::{Parser, Subcommand};
use tally_node::config::{RunArgs, Settings};
use tally_node::dev::DevArgs;

/// mimalloc instead of glibc's malloc (issue 15; measured in
/// `docs/src/benchmarks/profiles.md`, "The allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A Tally region node: geo-replicated counters (likes, views, votes) that take
/// any number of adds on one key, durably, and converge across regions.
#[derive(Parser, Debug)]
#[command(name = "tally-node", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs a whole multi-region cluster on loopback (one process), and prints each region's endpoint.
    Dev(DevArgs),
    /// Creates a NEW replica's data directory from a backup (`tally admin backup`), then exits; start the node on it.
    Restore(tally_node::restore::RestoreArgs),
    /// Exits 0 when the node's HTTP endpoint answers 200 (for container healthchecks, where no curl exists).
    Healthcheck(HealthcheckArgs),
    /// Prints the configuration reference (every setting of the node, as Markdown) that
    /// docs/src/reference/configuration.md holds.
    #[command(hide = true)]
    ConfigReference,
    /// Prints the gRPC API reference (every service, RPC, message and enum of
    /// proto/tally/v1, with its comments, as Markdown) that docs/src/reference/grpc.md holds.
    #[command(hide = true)]
    GrpcReference,
}

#[derive(clap::Args, Debug)]
struct HealthcheckArgs {
    /// The node's --http-addr.
    #[arg(long, env = "TALLY_HTTP_ADDR", default_value = "127.0.0.1:7102")]
    http_addr: String,
    /// The path to ask: /readyz (serving) or /healthz (running).
    #[arg(long, default_value = "/readyz")]
    path: String,
}

/// One HTTP/1.1 GET with a short timeout; Ok when the answer is 200.
fn healthcheck(args: &HealthcheckArgs) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    let timeout = std::time::Duration::from_secs(2);
    let addr = args
        .http_addr
        .replace("0.0.0.0", "127.0.0.1")
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| anyhow::anyhow!("--http-addr {} does not resolve", args.http_addr))?;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n",
        args.path
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let status = answer.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) == Some("200") {
        Ok(())
    } else {
        anyhow::bail!("{} answered {status:?}", args.path)
    }
}

fn init_logs(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,chitchat=warn,sled=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    // Chitchat warns once per garbage datagram or foreign message: the
    // guard keeps the first of each kind and a summary a minute.
    let flood_guard = tally_node::log_flood::FloodGuard::spawn();
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    if json {
        builder.json().finish().with(flood_guard).init();
    } else {
        builder.finish().with(flood_guard).init();
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Healthcheck(args)) => healthcheck(&args),
        Some(Command::ConfigReference) => {
            print!("{}", tally_node::config_reference::render()?);
            Ok(())
        }
        Some(Command::GrpcReference) => {
            print!("{}", tally_node::grpc_reference::render()?);
            Ok(())
        }
        Some(Command::Restore(args)) => {
            init_logs(false);
            let restored = tally_node::restore::run(args).await?;
            println!(
                "restored {} counters and {} like-set and uniques records of replica {} (region {}) at its sequence {} into a new replica {} (region {}); start tally-node on that --data-dir with --cluster-id {}",
                restored.counters,
                restored.set_deltas,
                restored.from_replica,
                restored.from_region,
                restored.from_seq,
                restored.replica,
                restored.region,
                restored.cluster_id
            );
            Ok(())
        }
        Some(Command::Dev(args)) => {
            init_logs(false);
            tally_node::dev::run(args).await
        }
        None => {
            let settings = Settings::resolve(cli.run)?;
            init_logs(settings.json_logs);
            let grace = settings.shutdown_grace;
            let mut shutdown = tally_node::ShutdownSignal::install()?;
            let node = tally_node::server::start(settings).await?;
            let engine = node.engine.clone();
            let failed = tokio::select! {
                _ = shutdown.recv() => None,
                cause = engine.store_failed() => Some(cause),
            };
            if failed.is_none() {
                tracing::info!("shutting down: finishing the last commit");
            }
            // Whatever the store is doing (a hung flush), the process exits
            // within the grace: what was not committed was never acknowledged.
            let stopped = tokio::time::timeout(grace, node.shutdown()).await.is_ok();
            if !stopped {
                let durable = *engine.durable_seq().borrow();
                let pending = match engine.try_uncommitted() {
                    Some((counters, last_seq)) if last_seq > durable => format!(
                        "{counters} counters changed in memory were not made durable (commits {}..={last_seq}); adds waiting on them were never acknowledged",
                        durable + 1
                    ),
                    Some(_) => "nothing acknowledged is missing".to_string(),
                    None => "the core was busy, so what was pending is unknown; no add waiting on it was acknowledged".to_string(),
                };
                anyhow::bail!(
                    "the node did not stop within --shutdown-grace {} ms (the store did not finish its last commit; durable up to commit {durable}): exiting anyway; {pending}",
                    grace.as_millis()
                );
            }
            if let Some(cause) = failed {
                anyhow::bail!(
                    "the store failed and the node stopped: {cause}. Every acknowledged add is on disk; check the disk (free space, IO errors in dmesg) and restart the node"
                );
            }
            Ok(())
        }
    }
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(error) = run(cli).await {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}
