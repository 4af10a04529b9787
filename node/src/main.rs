//! `tally-node`: runs one Tally region node, or (`tally-node dev`) a whole
//! multi-region cluster on loopback for trying Tally out.

use clap::{Parser, Subcommand};
use tally_node::config::{RunArgs, Settings};
use tally_node::dev::DevArgs;

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
}

fn init_logs(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,chitchat=warn,sled=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Dev(args)) => {
            init_logs(false);
            tally_node::dev::run(args).await
        }
        None => {
            let settings = Settings::resolve(cli.run)?;
            init_logs(settings.json_logs);
            let node = tally_node::server::start(settings).await?;
            tally_node::wait_for_shutdown_signal().await;
            tracing::info!("shutting down: finishing the last commit");
            node.shutdown().await;
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
