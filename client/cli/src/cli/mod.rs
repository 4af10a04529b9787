//! The `tally` command line: its arguments, and the commands that run them.
//!
//! Global options: `--endpoint URL` (env `TALLY_ENDPOINT`, default
//! `http://127.0.0.1:7100`; `host:port` works too; `https://host:port` with
//! `--tls-ca PEM` / `TALLY_TLS_CA`), `--token TOKEN` (env `TALLY_TOKEN`) or
//! `--token-file FILE` (env `TALLY_TOKEN_FILE`: a token alone, or the node's
//! `--auth-tokens` file, whose first token with the role the command needs
//! is used) for nodes that require one, and `--json`.
//!
//! # Output formats (stable: scripts and tests parse them)
//!
//! Text tables separate columns with two or more spaces, and no cell holds a
//! space. Durations in cells are `850ms`, `1.2s`, `3m05s`, `2h07m`.
//! JSON output is one object per line, and only that goes to stdout.
//!
//! - `tally add KEY [DELTA] [--idempotency-key K] [--durability sync|replicated]`
//!   (DELTA defaults to 1 and may be negative: `tally add KEY -1`):
//!   - text: the new value, alone on one line (`41`), or followed by
//!     ` (duplicate: already applied)` when the idempotency key had been seen;
//!   - JSON: `{"key":"KEY","value":41,"duplicate":false}`;
//!   - the add carries `--idempotency-key` or a fresh key, reused by every
//!     retry; when its outcome stays unknown, the error line ends with
//!     `retry it with the same idempotency key, which counts it once: tally
//!     add KEY DELTA --idempotency-key K` (and `--durability` if given).
//! - `tally get KEY [--breakdown]`:
//!   - text: the value alone on one line. With `--breakdown`, then a table
//!     with the header `REGION  VALUE  +  -  LAST SYNC` and one row per region;
//!     LAST SYNC is `local`, `never` or a duration;
//!   - JSON: `{"key":"KEY","value":41}`; with `--breakdown` also
//!     `"regions":[{"region":..,"value":..,"increments":..,"decrements":..,
//!     "local":..,"since_last_sync_ms":..|null}]`.
//! - `tally get KEY --slots`:
//!   - text: the value, then a table `REPLICA  REGION  +  -` with one row
//!     per live writer and a last `(folded, epoch E)` row when writers were
//!     folded;
//!   - JSON: `{"key":..,"value":..,"slots":[{"replica":"16 hex digits",
//!     "region":..,"p":..,"n":..}],"folded":{"epoch":..,"p":..,"n":..}}`.
//! - `tally watch KEY`: one line per value, the current one first, until the
//!   stream ends or Ctrl-C (both exit 0):
//!   - text: the value alone (`41`);
//!   - JSON: `{"key":"KEY","value":41}`.
//! - `tally status`:
//!   - text: `cluster: ID`, then a table with the header
//!     `REGION  NODE  REPLICA  GRPC ADDRESS  ALIVE  LAST SYNC  SEQ LAG  DIGEST`
//!     and one row per member, the answering node first (its LAST SYNC is
//!     `self`; ALIVE is `yes`/`no`; REPLICA and DIGEST are 16 hex digits),
//!     then `converged: yes (all N live members hold digest HEX)` (with
//!     `, sets digest HEX` when the members publish one: like sets and
//!     uniques) or `converged: no (live members hold N different digests)`
//!     (or `N different sets digests`);
//!     then, when the node has seen traffic, `hot keys on this node:` and a
//!     table with the header `OP  KEY  PER SECOND` (a key with spaces breaks
//!     the no-space rule of cells; use `--json` for those);
//!     then the partition summary of the node's region: `partitions in
//!     region R (as NODE computes them): P partitions, replication factor
//!     RF (E in effect)`, a table with the header `NODE  STATE  ALIVE  OWNS
//!     HOLDS  RELEASING` (ALIVE is `yes`, `no`, or `gone` when down for
//!     `--dead-after`; HOLDS counts the partitions the node serves, caught
//!     up, RELEASING those of them it hands away; an owned partition not
//!     held is being copied in), and
//!     `nodes by state: N active, ...`;
//!   - JSON: `{"cluster_id":..,"node":MEMBER,"members":[MEMBER..],
//!     "converged":..,"partition_map":MAP}`, MEMBER being `{"region","node_name","replica"(hex),
//!     "grpc_addr","gossip_addr","alive","digest"(hex),"durable_seq",
//!     "since_last_sync_ms"(or null),"seq_lag"}`, MAP `{"partitions",
//!     "replication_factor","effective_replication","region","nodes":[{"node_name",
//!     "region","replica","grpc_addr","state","alive","gone","partitions_owned",
//!     "partitions_held","partitions_releasing","counters_stored"(or null)}..],
//!     "owners":[[NODE INDEX..] per partition],"answered_by"}` (null from a
//!     node without partition maps).
//! - `tally admin drain NODE`: `node NODE is draining: ...` or `node NODE
//!   was draining already`; JSON `{"node","newly_draining"}`.
//! - `tally admin remove NODE`: `node NODE removed (replica HEX): ...`;
//!   JSON `{"node","removed":[HEX..]}`.
//! - `tally admin k8s-pre-stop [--pod POD] [--node NODE] [--timeout 58m]
//!   [--poll-interval 2s] [--log-to FILE] [--statefulset S] [--namespace NS]
//!   [--first-ordinal N] [--kube-api URL] [--kube-credentials DIR]`, the
//!   preStop hook of a StatefulSet's pod (see `pre_stop.rs`): reads the
//!   StatefulSet's desired replicas from the Kubernetes API with the pod's
//!   service account and, only if the pod's ordinal is scaled away, drains
//!   NODE (`TALLY_NODE_NAME`) on `--endpoint` and waits until it has left.
//!   One line per step, progress printed before a failure may come:
//!   - text: `pod tally-1 is restarting, not leaving: StatefulSet tally keeps
//!     ordinals 0 to 2 (3 replicas); node N is not drained`, or `pod tally-3
//!     is leaving: ...; draining node N`, then `node N is draining: ...;
//!     waiting until it has left (at most 58m)`, `node N: draining, holds H
//!     partitions, R being handed away (1.2s)` when that changes (or each
//!     minute), and `node N has left: ...; the pod may stop`; or
//!     `StatefulSet tally is scaled to 0: ...` (no drain);
//!   - JSON, one object per line, each with `"event"`: `decision` (`"pod",
//!     "statefulset","ordinal","replicas","node","decision":"restarting"|
//!     "leaving"|"region_stops"`), `draining` (`"node","newly_draining"`),
//!     `progress` (`"node","state","held","releasing","elapsed_ms"`),
//!     `map_error` (`"node","error","elapsed_ms"`), `left` (`"node","region",
//!     "elapsed_ms"`);
//!   - `--log-to FILE` gets the same lines (text ones prefixed with `tally
//!     admin k8s-pre-stop: `) and, on failure, the error line (`error: ...`,
//!     or `{"event":"error","error"}`).
//! - `tally bench [--op add|get|mixed] [--concurrency 64] [--connections N]
//!   [--keys 1] [--duration 10s] [--warmup 1s] [--no-coalesce]
//!   [--batches-in-flight N] [--batch-size N] [--coalesce-window 200us]
//!   [--read-cache] [--threads N] [--durability sync|replicated]` (connections: 1, or 4 with
//!   `--no-coalesce`; threads: half the cores, at least 1):
//!   - text, three lines:
//!     `bench: op=add concurrency=64 connections=1 keys=1 duration=10.00s
//!     coalesce=on read-cache=off`,
//!     `ops: 123456  errors: 0  ops/s: 12345.6  client cpu: 2.31us/op`
//!     (`unknown` where the bench cannot read its CPU time),
//!     `latency ms: p50 1.234  p99 5.678  p999 9.876  max 12.345`,
//!     and a fourth, `first error: ...`, when there were errors;
//!   - JSON: `{"op","concurrency","connections","keys","coalesce",
//!     "read_cache","duration_s","warmup_s","ops","errors","ops_per_sec",
//!     "p50_ms","p99_ms","p999_ms","max_ms","mean_ms",
//!     "client_cpu_us_per_op"(or null),"first_error"(or null)}`.
//! - `tally admin backup --to DIR`: streams a consistent snapshot of the
//!   node's durable state into `DIR/backup.tally` (restore it with
//!   `tally-node restore --from DIR --data-dir NEW`) and writes
//!   `DIR/manifest.json`:
//!   - text: `backup of replica HEX (region R, node N) at seq S: C counters,
//!     B bytes in DIR/backup.tally`;
//!   - JSON: the manifest: `{"format_version","file","cluster_id","replica",
//!     "region","node_name","seq","digest","counters","bytes",
//!     "started_at_unix_ms","finished_at_unix_ms"}`.
//! - `tally admin finalize`: finalizes a rolling upgrade (moves the cluster
//!   version to the newest version the node speaks; refused, naming them,
//!   while a member does not speak it):
//!   - text: `cluster version: A -> B; ...` or `cluster version: B (already finalized)`;
//!   - JSON: `{"previous_version","cluster_version"}`.
//! - Like sets and uniques (see `likes.rs`): `tally like KEY MEMBER` and
//!   `tally unlike KEY MEMBER` (text: `liked; N likes`, `already liked
//!   (nothing changed); N likes`...; JSON `{"key","member","liked","changed","count"}`),
//!   `tally liked KEY MEMBER` (`liked` / `not liked`; JSON
//!   `{"key","member","liked"}`), `tally likes KEY` (the count; JSON
//!   `{"key","count"}`; `--list`: one member per line, JSON
//!   `{"key","member"}` per line), `tally observe KEY MEMBER...` and
//!   `tally distinct KEY...` (the estimate; JSON `{"keys","estimate"}`),
//!   `tally admin verify KEY` (recount; exit status 1 on a difference).
//!
//! On failure nothing is printed to stdout, one line `error: MESSAGE` goes to
//! stderr and the exit status is 1 (2 for bad usage, with clap's message).
//! The exceptions are `bench`, which prints its report first and then fails
//! only if every request failed, and `admin k8s-pre-stop`, whose lines before
//! the failure stay printed.

mod backup;
mod bench;
mod commands;
mod duration;
mod kube;
mod likes;
pub mod output;
mod partitions;
mod pre_stop;

use clap::{Args, Parser, Subcommand};

pub use bench::BenchArgs;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "tally",
    version,
    about = "Add to Tally counters, read and watch them, check the cluster, load-test a node"
)]
pub struct Cli {
    /// The node to talk to: http://host:port, or host:port.
    #[arg(
        long,
        global = true,
        env = "TALLY_ENDPOINT",
        default_value = "http://127.0.0.1:7100"
    )]
    pub endpoint: String,

    /// Print JSON: one object (one per line for `watch`).
    #[arg(long, global = true)]
    pub json: bool,

    /// PEM CA certificate of the cluster, to verify an https:// endpoint.
    #[arg(long, global = true, env = "TALLY_TLS_CA")]
    pub tls_ca: Option<std::path::PathBuf>,

    /// Bearer token for nodes started with --auth-tokens.
    #[arg(long, global = true, env = "TALLY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// Read the bearer token from FILE: a token alone, or a node's
    /// --auth-tokens file (`NAME TOKEN ROLES` lines), whose first token with
    /// the role the command needs (admin, or write) is used.
    #[arg(
        long,
        global = true,
        env = "TALLY_TOKEN_FILE",
        value_name = "FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<std::path::PathBuf>,

    /// Where each key's calls go in a region of several nodes: `direct` (to
    /// the key's first owner, by the region's partition map), `endpoint`
    /// (to --endpoint, which forwards) or `pinned` (served by --endpoint
    /// itself, never forwarded).
    #[arg(long, global = true, env = "TALLY_ROUTING", value_enum, default_value_t = RoutingArg::Direct)]
    pub routing: RoutingArg,

    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Add to a counter (1 unless told) and print its new value.
    Add(AddArgs),
    /// Print a counter's value, optionally with its per-region breakdown.
    Get(GetArgs),
    /// Print a counter's value each time it changes, until Ctrl-C.
    Watch(WatchArgs),
    /// Print the cluster's members and whether they have converged.
    Status(StatusArgs),
    /// Load-test a node with a closed loop of adds and/or gets.
    Bench(BenchArgs),
    /// Like MEMBER in the like set KEY (a double like changes nothing).
    Like {
        /// The like set (1 to 256 bytes).
        key: String,
        /// Who likes (1 to 128 bytes).
        member: String,
    },
    /// Unlike MEMBER in the like set KEY.
    Unlike {
        /// The like set.
        key: String,
        /// Who unlikes.
        member: String,
    },
    /// Print whether MEMBER likes KEY.
    Liked {
        /// The like set.
        key: String,
        /// The member.
        member: String,
    },
    /// Print a like set's count, or with --list its liked members.
    Likes {
        /// The like set.
        key: String,
        /// List the liked members (all pages, in member order).
        #[arg(long)]
        list: bool,
    },
    /// Observe members in a uniques key and print its estimate.
    Observe {
        /// The uniques key.
        key: String,
        /// The members seen (1 to 10,000).
        #[arg(required = true)]
        members: Vec<String>,
    },
    /// Print the estimated distinct members of one or more uniques keys (their union).
    Distinct {
        /// The uniques keys.
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Operator commands: `tally admin backup --to DIR`, `tally admin finalize`,
    /// `tally admin retire REPLICA`, `tally admin drain NODE`, `tally admin remove NODE`,
    /// `tally admin k8s-pre-stop`.
    #[command(subcommand)]
    Admin(AdminCommand),
}

/// `tally admin ...`.
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Stream a consistent snapshot of the node's durable state into DIR
    /// (the node keeps serving); restore with `tally-node restore --from DIR`.
    Backup {
        /// A new (or empty) directory for the backup.
        #[arg(long, value_name = "DIR")]
        to: std::path::PathBuf,
    },
    /// Finalize a rolling upgrade: move the cluster version to the newest
    /// version this node speaks, once every member speaks it. Rollback to an
    /// older build is no longer possible afterwards.
    Finalize,
    /// Recount a like set from its members and compare with its kept count;
    /// a difference is a bug (exit status 1).
    Verify {
        /// The like set.
        key: String,
    },
    /// Retire a stopped replica for good (16 hex digits, as `tally status`
    /// prints them): it never writes again, and its slots are folded into
    /// each counter's base once every member holds their final state.
    Retire {
        /// The replica id to retire.
        replica: String,
    },
    /// Drain a node: it owns no partition from now on, and the other nodes of
    /// its region take its partitions over. Refused for the last node of a
    /// region and for a node that is down (remove it instead).
    Drain {
        /// The node's name, as `tally status` prints it.
        node: String,
    },
    /// Remove a node that is down for good: it has left the cluster (on every
    /// node, for good), and the others take its partitions over at once.
    /// Refused for a live node (drain it instead).
    Remove {
        /// The node's name, as `tally status` prints it.
        node: String,
    },
    /// The preStop hook of a Tally pod in a Kubernetes StatefulSet: when a
    /// scale-down removes the pod (its ordinal is no longer kept, as the
    /// Kubernetes API tells), drain its node and wait until it has left;
    /// when the pod is only restarting, do nothing. Uses the pod's service
    /// account; talks to the node at --endpoint.
    K8sPreStop(pre_stop::PreStopArgs),
}

/// `tally add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    /// The counter's key (1 to 256 bytes of UTF-8).
    pub key: String,

    /// The amount to add, non-zero; negative to subtract (`tally add KEY -1`).
    #[arg(default_value_t = 1, allow_negative_numbers = true)]
    pub delta: i64,

    /// Send this idempotency key instead of a fresh one: repeating the command
    /// with the same key, counter and delta is applied once.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,

    /// How durable the add must be before the node answers: `sync` (on its
    /// disk) or `replicated` (on its disk and on the copies of its region,
    /// --write-copies of the node). The node applies the stronger of this
    /// and its own --durability. [default: the node's]
    #[arg(long, value_enum)]
    pub durability: Option<DurabilityArg>,
}

/// `tally --routing`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RoutingArg {
    /// To each key's first owner.
    Direct,
    /// To --endpoint, which forwards.
    Endpoint,
    /// To --endpoint, served there.
    Pinned,
}

impl From<RoutingArg> for tally_client::Routing {
    fn from(arg: RoutingArg) -> Self {
        match arg {
            RoutingArg::Direct => tally_client::Routing::Direct,
            RoutingArg::Endpoint => tally_client::Routing::ThroughEndpoint,
            RoutingArg::Pinned => tally_client::Routing::Pinned,
        }
    }
}

/// `tally add --durability`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DurabilityArg {
    /// On the disk of the node that took it.
    Sync,
    /// On the disk of the node that took it and of its copies in the region.
    Replicated,
}

impl From<DurabilityArg> for tally_client::Durability {
    fn from(arg: DurabilityArg) -> Self {
        match arg {
            DurabilityArg::Sync => tally_client::Durability::Sync,
            DurabilityArg::Replicated => tally_client::Durability::Replicated,
        }
    }
}

/// `tally get`.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// The counter's key.
    pub key: String,

    /// Also print each region's part and how fresh it is.
    #[arg(long, conflicts_with = "slots")]
    pub breakdown: bool,

    /// Also print one slot per live writer (replica, region, + and -) and
    /// the folded base of writers retired and folded.
    #[arg(long)]
    pub slots: bool,
}

/// `tally watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The counter's key.
    pub key: String,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Wait until the members have converged (at most DURATION; 30s when
    /// --wait has no value), then print; fail if they have not by then.
    #[arg(
        long,
        value_name = "DURATION",
        num_args = 0..=1,
        default_missing_value = "30s",
        value_parser = duration::parse_positive_duration
    )]
    pub wait: Option<std::time::Duration>,
}

/// Runs the command the command line names.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let Cli {
        endpoint,
        json,
        tls_ca,
        token,
        token_file,
        routing,
        command,
    } = cli;
    let mut base = tally_client::ClientConfig::default().with_routing(routing.into());
    if let Some(path) = tls_ca {
        let pem = std::fs::read(&path).map_err(|e| {
            anyhow::anyhow!("--tls-ca {}: cannot read the file: {e}", path.display())
        })?;
        base = base.with_tls_ca(pem);
    }
    if let Some(path) = token_file {
        let text = std::fs::read_to_string(&path).map_err(|e| {
            anyhow::anyhow!("--token-file {}: cannot read the file: {e}", path.display())
        })?;
        let admin = matches!(command, Command::Admin(_));
        let token = token_from_file(&text, admin)
            .map_err(|problem| anyhow::anyhow!("--token-file {}: {problem}", path.display()))?;
        base = base.with_token(token);
    }
    if let Some(token) = token {
        base = base.with_token(token);
    }
    let target = Target { endpoint, base };
    match command {
        Command::Add(args) => commands::add(&target, &args, json).await,
        Command::Get(args) => commands::get(&target, &args, json).await,
        Command::Watch(args) => commands::watch(&target, &args, json).await,
        Command::Status(args) => commands::status(&target, &args, json).await,
        Command::Bench(args) => bench::run(&target, &args, json).await,
        Command::Admin(AdminCommand::Backup { to }) => backup::backup(&target, &to, json).await,
        Command::Admin(AdminCommand::Finalize) => commands::finalize(&target, json).await,
        Command::Admin(AdminCommand::Verify { key }) => likes::verify(&target, &key, json).await,
        Command::Like { key, member } => likes::like(&target, &key, &member, true, json).await,
        Command::Unlike { key, member } => likes::like(&target, &key, &member, false, json).await,
        Command::Liked { key, member } => likes::liked(&target, &key, &member, json).await,
        Command::Likes { key, list } => likes::likes(&target, &key, list, json).await,
        Command::Observe { key, members } => likes::observe(&target, &key, &members, json).await,
        Command::Distinct { keys } => likes::distinct(&target, &keys, json).await,
        Command::Admin(AdminCommand::Retire { replica }) => {
            commands::retire(&target, &replica, json).await
        }
        Command::Admin(AdminCommand::Drain { node }) => {
            partitions::drain(&target, &node, json).await
        }
        Command::Admin(AdminCommand::Remove { node }) => {
            partitions::remove(&target, &node, json).await
        }
        Command::Admin(AdminCommand::K8sPreStop(args)) => pre_stop::run(&target, &args, json).await,
    }
}

/// The token of a `--token-file`: a file holding a token alone, or a node's
/// `--auth-tokens` lines (`NAME TOKEN [ROLES]`; blank lines and `#` comments
/// skipped): for an admin command the first token with the `admin` role,
/// for any other the first with `write` (a line without roles has every
/// role); the first token when none has it.
fn token_from_file(text: &str, admin: bool) -> Result<String, String> {
    let wanted = if admin { "admin" } else { "write" };
    let mut first = None;
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (token, roles) = match line.split_whitespace().collect::<Vec<_>>()[..] {
            [token] | [_, token] => (token, None),
            [_, token, roles] => (token, Some(roles)),
            _ => {
                return Err(format!(
                    "line {}: expected `TOKEN` or `NAME TOKEN [ROLES]`",
                    number + 1
                ))
            }
        };
        if roles.is_none_or(|roles| roles.split(',').any(|role| role == wanted)) {
            return Ok(token.to_owned());
        }
        first.get_or_insert(token);
    }
    first
        .map(str::to_owned)
        .ok_or_else(|| "the file holds no token".to_owned())
}

/// The node to talk to and how: the endpoint and the connection settings
/// (TLS, token) every command starts from.
pub struct Target {
    /// The endpoint as given.
    pub endpoint: String,
    /// Settings from the global flags.
    pub base: tally_client::ClientConfig,
}

impl Target {
    /// Connects with the global settings.
    pub async fn connect(&self) -> Result<tally_client::Client, tally_client::Error> {
        self.base.connect(self.endpoint.as_str()).await
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[track_caller]
    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("tally").chain(args.iter().copied()))
            .unwrap_or_else(|error| panic!("{args:?} did not parse: {error}"))
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn add_takes_a_negative_delta_and_defaults_to_one() {
        let Command::Add(args) = parse(&["add", "post:1", "-1"]).command else {
            panic!("not add");
        };
        assert_eq!((args.key.as_str(), args.delta), ("post:1", -1));
        let Command::Add(args) = parse(&["add", "post:1"]).command else {
            panic!("not add");
        };
        assert_eq!(args.delta, 1);
        let Command::Add(args) = parse(&["add", "post:1", "-5", "--idempotency-key", "k1"]).command
        else {
            panic!("not add");
        };
        assert_eq!(
            (args.delta, args.idempotency_key.as_deref()),
            (-5, Some("k1"))
        );
        assert_eq!(args.durability, None);
        let Command::Add(args) = parse(&["add", "votes", "--durability", "replicated"]).command
        else {
            panic!("not add");
        };
        assert_eq!(args.durability, Some(DurabilityArg::Replicated));
    }

    #[test]
    fn global_options_go_before_or_after_the_command() {
        let cli = parse(&["get", "k", "--json", "--endpoint", "10.0.0.1:7100"]);
        assert!(cli.json);
        assert_eq!(cli.endpoint, "10.0.0.1:7100");
        let cli = parse(&["--json", "status"]);
        assert!(cli.json && matches!(cli.command, Command::Status(StatusArgs { wait: None })));
        let Command::Status(args) = parse(&["status", "--wait"]).command else {
            panic!("not status")
        };
        assert_eq!(args.wait, Some(std::time::Duration::from_secs(30)));
        let Command::Status(args) = parse(&["status", "--wait", "2m"]).command else {
            panic!("not status")
        };
        assert_eq!(args.wait, Some(std::time::Duration::from_secs(120)));
    }

    #[test]
    fn a_token_file_gives_its_first_token_with_the_role_the_command_needs() {
        assert_eq!(token_from_file("s3cret\n", false).as_deref(), Ok("s3cret"));
        assert_eq!(
            token_from_file("# NAME TOKEN\n\n  web  tok-1 \nops tok-2\n", true).as_deref(),
            Ok("tok-1")
        );
        let roles = "web tok-1 read,write\nreader tok-2 read\nops tok-3 admin\n";
        assert_eq!(token_from_file(roles, false).as_deref(), Ok("tok-1"));
        assert_eq!(token_from_file(roles, true).as_deref(), Ok("tok-3"));
        assert_eq!(
            token_from_file("reader tok-2 read\n", true).as_deref(),
            Ok("tok-2")
        );
        assert!(token_from_file("# none\n", false)
            .unwrap_err()
            .contains("no token"));
        assert!(token_from_file("a b c d\n", false)
            .unwrap_err()
            .contains("line 1"));
    }

    #[test]
    fn k8s_pre_stop_takes_the_pod_and_node_from_flags() {
        let Command::Admin(AdminCommand::K8sPreStop(args)) = parse(&[
            "admin",
            "k8s-pre-stop",
            "--pod",
            "tally-3",
            "--node",
            "eu-west-tally-3",
            "--timeout",
            "10m",
        ])
        .command
        else {
            panic!("not k8s-pre-stop");
        };
        assert_eq!(
            (args.pod.as_str(), args.node.as_str()),
            ("tally-3", "eu-west-tally-3")
        );
        assert_eq!(args.timeout, std::time::Duration::from_secs(600));
        assert_eq!(args.poll_interval, std::time::Duration::from_secs(2));
        assert_eq!(
            args.kube_credentials,
            std::path::Path::new("/var/run/secrets/kubernetes.io/serviceaccount")
        );
    }

    #[test]
    fn bad_usage_is_refused() {
        for args in [
            &["add"][..],
            &["add", "k", "one"],
            &["bench", "--duration", "10"],
        ] {
            let argv = std::iter::once("tally").chain(args.iter().copied());
            assert!(
                Cli::try_parse_from(argv).is_err(),
                "{args:?} should be refused"
            );
        }
    }
}
