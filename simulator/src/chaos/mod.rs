//! `tally-sim chaos`: the simulator's checker against a real cluster of
//! `tally-node` processes on loopback (R regions × K nodes), driven through
//! the real client (`tally_client`, `workload.rs`).
//!
//! Every node has its own loopback IP (`node.rs`) and two fault-injecting
//! proxies on the addresses it advertises: TCP in front of gRPC
//! (`tcp_proxy.rs`) and UDP in front of gossip (`udp_proxy.rs`). Both tell the
//! talking node by its source IP and apply the rule of that directed link
//! (`links.rs`), with a WAN delay between regions. Faults, drawn from the seed
//! as a schedule (`schedule.rs`) and printed before the run: `kill -9` and
//! restart on the same disk, SIGSTOP/SIGCONT, partitions of several shapes,
//! wipes (kill -9, delete the data directory, restart as a new replica), a
//! partition while a node is down (the node restarts inside it), and clients
//! cut off from their node mid-add (a third proxy, in front of the node for
//! its clients, drops answers; `tcp_proxy.rs`), whose retries with the same
//! idempotency key must count once.
//!
//! Invariants checked after the heal, as in the simulation (`check.rs`): every
//! node holds the same state slot by slot for every key; each live replica's
//! slot equals its acknowledged adds plus a subset of its unacknowledged ones
//! (the lane scheme of `ledger.rs`); a wiped replica's surviving slot is its
//! acknowledged adds up to one instant plus some adds in flight then; a
//! restarted node keeps its replica id and a wiped one never reuses an id.
//! With `--durability replicated` the nodes run in that mode and a wiped
//! replica may lose no acknowledged add (in `sync` mode the ones no peer had
//! pulled are counted and allowed).
//!
//! With `--replication-factor RF` the regions are partitioned (`--partitions`
//! P, RF owners per partition and region): clients add only to keys their
//! node owns, the menu gains `join` (a spare node per region starts),
//! `drain` and `remove` (a node killed for good, then removed; its replica
//! is checked as a wiped one), and the end waits until the placement settles
//! (`placement.rs`) instead of for equal digests: then every key's owners
//! hold the same state, which the exact per-slot check takes as final.

mod base_search;
mod check;
mod folds;
mod likes;
mod links;
mod node;
mod placement;
mod schedule;
mod scoped;
mod setup;
mod tcp_proxy;
mod udp_proxy;
mod workload;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tally_node::crdt::ReplicaId;

use crate::checker::Checker;
use crate::ledger::Ledger;
use crate::options::Durability;
use check::AddTimes;
use links::{Links, Topology};
use node::{assign_ports, wait_ready, NodeProc};
use placement::KeyPlacement;
use schedule::{Fault, Roster, ScheduledFault};
use workload::{client_loop, Book, Shared};

/// Options of `tally-sim chaos`.
#[derive(clap::Args, Debug)]
pub struct ChaosArgs {
    /// The tally-node binary (default: next to this binary).
    #[arg(long)]
    node_bin: Option<PathBuf>,
    /// Regions.
    #[arg(long, default_value_t = 3)]
    regions: usize,
    /// Nodes per region, each a replica with its own slot.
    #[arg(long, default_value_t = 1)]
    nodes_per_region: usize,
    /// Seconds of load and faults before the heal.
    #[arg(long, default_value_t = 30)]
    duration_s: u64,
    /// Seed of the fault schedule and the workload.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// First port; node i takes base+10i to base+10i+6 on its own IP
    /// 127.A.B.(i+2), A.B from the process id
    /// (never 7100-7199, 17100-17199 or 27100-27199). Default: free ports.
    #[arg(long)]
    base_port: Option<u16>,
    /// Where the data directories and logs go (default: a fresh temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Clients per region, spread over its nodes (at least one per node).
    #[arg(long, default_value_t = 2)]
    clients_per_region: usize,
    /// Keys (key 0 is the hot post).
    #[arg(long, default_value_t = 16)]
    keys: usize,
    /// Faults: a comma list of kill, stop, cut (isolate one node), partition
    /// (a shape drawn from the seed), wipe, overlap (a partition while a node
    /// is down), client (a node's clients cut off mid-add), and with
    /// --replication-factor join (a spare node of a region starts) and drain;
    /// or none. [default: kill,stop,partition,wipe,overlap,client, and with
    /// --replication-factor also join,drain]
    #[arg(long)]
    faults: Option<String>,
    /// WAN delay the proxies add between regions (ms, one way).
    #[arg(long, default_value_t = 30)]
    wan_ms: u64,
    /// Longest wait for convergence after the heal (s).
    #[arg(long, default_value_t = 60)]
    converge_timeout_s: u64,
    /// The nodes' durability mode: sync, or replicated (an add is
    /// acknowledged once --write-copies nodes of its region hold it durably;
    /// then the check allows no acknowledged add lost to a wipe).
    #[arg(long, value_enum, default_value_t = Durability::Sync)]
    durability: Durability,
    /// With --durability replicated: nodes of the region that hold an add
    /// before it is acknowledged, the taking node included (2 to 7, at most
    /// --nodes-per-region).
    #[arg(long, default_value_t = 2)]
    write_copies: usize,
    /// Also drive like sets and uniques (one task per node: likes, unlikes
    /// with idempotent retries, observes) and check them after the heal.
    #[arg(long)]
    likes: bool,
    /// Partitioned regions: each key is held by this many nodes of its
    /// region (1 to --nodes-per-region); the faults join and drain become
    /// available. Default: not partitioned (every node holds every key).
    #[arg(long)]
    replication_factor: Option<usize>,
    /// With --replication-factor: the cluster's partition count P.
    #[arg(long, default_value_t = 16)]
    partitions: u32,
    /// Retire and fold dead replicas during the run: the nodes run with
    /// `--retire-after 2s` (a wiped node's old incarnation is retired once
    /// its new one is up), a removed node is retired by the nodes (a
    /// removal retires, with no `tally admin retire`), and
    /// after the heal every node must have folded them all; the check then
    /// counts their adds through the counters' folded bases.
    #[arg(long)]
    retire: bool,
}

/// Runs `tally-sim chaos`.
pub fn main(args: ChaosArgs) -> anyhow::Result<bool> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(chaos(args))
}

async fn chaos(args: ChaosArgs) -> anyhow::Result<bool> {
    let settings = setup::check_args(&args)?;
    let (bin, replicated, partitioned) = (&settings.bin, settings.replicated, settings.partitioned);
    let (faults, key_partitions) = (&settings.faults, settings.key_partitions);
    // One spare node per region, started by a `join`.
    let spares = usize::from(faults.iter().any(|fault| fault == "join"));
    let per_region = args.nodes_per_region + spares;
    let topology = Topology::new(args.regions, per_region);
    let n = topology.nodes();
    if n > 250 {
        bail!("at most 250 nodes (one loopback IP each)");
    }
    let keep_active = args
        .replication_factor
        .unwrap_or(0)
        .max(if replicated { args.write_copies } else { 0 })
        .max(2);
    let roster = Roster {
        started: (0..n)
            .map(|i| i % per_region < args.nodes_per_region)
            .collect(),
        ..Roster::all(n, keep_active)
    };
    let ports = assign_ports(n, args.base_port)?;
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => {
            std::env::temp_dir().join(format!("tally-chaos-{}-{}", std::process::id(), args.seed))
        }
    };
    std::fs::create_dir_all(&dir)?;
    println!(
        "tally-sim chaos --seed {} --regions {} --nodes-per-region {} --duration-s {} --faults {} --wan-ms {}{} (node {}, data in {})",
        args.seed, args.regions, args.nodes_per_region, args.duration_s,
        if faults.is_empty() { "none".to_string() } else { faults.join(",") },
        args.wan_ms,
        if replicated { format!(" --durability replicated --write-copies {}", args.write_copies) } else { String::new() },
        bin.display(), dir.display()
    );
    if let Some(rf) = args.replication_factor {
        println!(
            "partitioned regions: --partitions {} --replication-factor {rf}, {spares} spare node(s) per region",
            args.partitions
        );
    }
    let plan = schedule::draw(
        args.seed,
        faults,
        &topology,
        roster.clone(),
        args.duration_s * 1000,
    );
    println!("schedule ({} faults):", plan.len());
    for fault in &plan {
        println!("  {fault}");
    }
    let rules = setup::proxy_rules(&topology, Duration::from_millis(args.wan_ms));
    let setup::Cluster {
        mut nodes,
        proxies,
        client_cuts,
        answers_dropped,
    } = setup::start_cluster(
        &args,
        &settings,
        &topology,
        &roster.started,
        &ports,
        &dir,
        &rules,
    )
    .await?;
    let clients = ClientCuts {
        cuts: &client_cuts,
        dropped: &answers_dropped,
    };
    let membership = Membership {
        topology: topology.clone(),
        running: roster.started,
        key_partitions: partitioned.then_some(key_partitions),
    };
    let outcome = tokio::select! {
        outcome = drive(
            &args,
            bin,
            &mut nodes,
            &plan,
            &rules.links,
            &clients,
            membership,
        ) => outcome,
        signal = interrupted() => Err(anyhow::anyhow!("interrupted by {signal}")),
    };
    for node in &mut nodes {
        node.signal("-CONT");
        node.kill();
    }
    drop(proxies);
    let passed = outcome?;
    if passed && args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("logs and data: {}", dir.display());
    }
    Ok(passed)
}

/// Resolves on SIGINT or SIGTERM, so that the nodes are stopped on the way out.
async fn interrupted() -> &'static str {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

/// The nodes' regions, which of them run, and with partitioned regions the
/// partition count.
struct Membership {
    topology: Topology,
    running: Vec<bool>,
    key_partitions: Option<tally_proto::partition::PartitionCount>,
}

/// The switches of the client proxies, and how many answers they dropped.
struct ClientCuts<'a> {
    cuts: &'a [tokio::sync::watch::Sender<bool>],
    dropped: &'a AtomicU64,
}

async fn drive(
    args: &ChaosArgs,
    bin: &Path,
    nodes: &mut [NodeProc],
    plan: &[ScheduledFault],
    links: &Links,
    clients: &ClientCuts<'_>,
    mut membership: Membership,
) -> anyhow::Result<bool> {
    let n = nodes.len();
    let cluster = format!("chaos-{}", args.seed);
    let mut checker = Checker::new(n, args.keys);
    for (i, node) in nodes.iter_mut().enumerate() {
        if !membership.running[i] {
            continue;
        }
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
        checker.started_fresh(0, i, node.replica);
    }
    let names: Vec<String> = (0..args.keys)
        .map(|k| {
            if k == 0 {
                "post:hot:likes".to_string()
            } else {
                format!("k{k:03}")
            }
        })
        .collect();
    let placement = membership.key_partitions.map(|partitions| {
        KeyPlacement::new(
            partitions,
            &names,
            nodes.iter().map(|node| node.name.clone()).collect(),
        )
    });
    let shared = Arc::new(Shared {
        book: Mutex::new(Book {
            ledger: Ledger::new(n, args.keys),
            times: AddTimes::default(),
            clock: 0,
            across_wipe: Vec::new(),
        }),
        replicas: nodes.iter().map(|n| AtomicU64::new(n.replica.0)).collect(),
        epochs: (0..n).map(|_| AtomicU64::new(0)).collect(),
        stop: AtomicBool::new(false),
        names,
        retried: AtomicU64::new(0),
        placement,
        not_served: AtomicU64::new(0),
        refused: AtomicU64::new(0),
    });
    // History of each node's replica ids, in order (for adds across a wipe).
    let mut incarnations: Vec<Vec<ReplicaId>> = nodes.iter().map(|n| vec![n.replica]).collect();
    let per_node = (args.clients_per_region / args.nodes_per_region).max(1);
    let mut tasks = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        for c in 0..per_node {
            let client_id = (i * per_node + c) as u32;
            let endpoint = node.client_endpoint.clone();
            let shared = shared.clone();
            let seed = args.seed ^ (u64::from(client_id) << 32);
            tasks.push(tokio::spawn(async move {
                client_loop(client_id, i, endpoint, seed, shared).await
            }));
        }
    }
    let like_shared = Arc::new(likes::LikeShared::new());
    if args.likes {
        for (i, node) in nodes.iter().enumerate() {
            let endpoint = node.client_endpoint.clone();
            let shared = like_shared.clone();
            let seed = args.seed ^ ((i as u64) << 40);
            tasks.push(tokio::spawn(async move {
                likes::like_loop(i, endpoint, seed, shared).await
            }));
        }
    }
    let mut wiped_any = false;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.duration_s);
    for step in plan {
        let start = started + Duration::from_millis(step.at_ms);
        // Behind schedule (a restart took long): still leave a quiet moment.
        let quiet = Instant::now() + Duration::from_millis(step.gap_ms / 4);
        tokio::time::sleep_until(tokio::time::Instant::from_std(start.max(quiet))).await;
        if Instant::now() >= deadline {
            break;
        }
        let hold = Duration::from_millis(step.hold_ms);
        println!(
            "  at {:6.1} s: {} for {} ms",
            started.elapsed().as_secs_f64(),
            step.fault,
            step.hold_ms
        );
        match &step.fault {
            Fault::Kill(target) | Fault::Wipe(target) => {
                let target = *target;
                let wipe = matches!(step.fault, Fault::Wipe(_));
                wiped_any |= wipe;
                if wipe {
                    shared.epochs[target].fetch_add(1, Ordering::SeqCst);
                }
                nodes[target].kill();
                if wipe {
                    std::fs::remove_dir_all(&nodes[target].data_dir).with_context(|| {
                        format!("cannot delete {}", nodes[target].data_dir.display())
                    })?;
                }
                tokio::time::sleep(hold).await;
                let id = nodes[target].start(bin, &cluster).await?;
                let node = &nodes[target];
                if wipe {
                    println!("           {} is now replica {id}", node.name);
                    checker.started_fresh(0, target, id);
                    nodes[target].replica = id;
                    incarnations[target].push(id);
                    shared.replicas[target].store(id.0, Ordering::SeqCst);
                    shared.epochs[target].fetch_add(1, Ordering::SeqCst);
                } else if id != node.replica {
                    checker.violate(
                        0,
                        "replica id changed",
                        format!(
                            "{} came back from kill -9 as {id}, not {}",
                            node.name, node.replica
                        ),
                    );
                }
            }
            Fault::Stop(target) => {
                nodes[*target].signal("-STOP");
                tokio::time::sleep(hold).await;
                nodes[*target].signal("-CONT");
            }
            Fault::Partition(shape) => {
                links.set(shape.cut_pairs(&membership.topology));
                tokio::time::sleep(hold).await;
                links.heal();
            }
            Fault::PartitionWhileDown { down, shape } => {
                let down = *down;
                nodes[down].kill();
                tokio::time::sleep(hold / 3).await;
                links.set(shape.cut_pairs(&membership.topology));
                tokio::time::sleep(hold / 3).await;
                let id = nodes[down].start(bin, &cluster).await?;
                let node = &nodes[down];
                println!(
                    "           {} is back inside the partition at {:.1} s",
                    node.name,
                    started.elapsed().as_secs_f64()
                );
                if id != node.replica {
                    checker.violate(
                        0,
                        "replica id changed",
                        format!(
                            "{} came back from kill -9 as {id}, not {}",
                            node.name, node.replica
                        ),
                    );
                }
                tokio::time::sleep(hold / 3).await;
                links.heal();
            }
            Fault::CutClients(target) => {
                clients.cuts[*target].send_replace(true);
                tokio::time::sleep(hold).await;
                clients.cuts[*target].send_replace(false);
            }
            Fault::Join(target) => {
                let target = *target;
                let id = nodes[target].start(bin, &cluster).await?;
                let node = &nodes[target];
                println!(
                    "           {} joins {} as replica {id}",
                    node.name, node.region
                );
                checker.started_fresh(0, target, id);
                nodes[target].replica = id;
                incarnations[target] = vec![id];
                shared.replicas[target].store(id.0, Ordering::SeqCst);
                membership.running[target] = true;
                tokio::time::sleep(hold).await;
            }
            Fault::Drain(target) => {
                placement::drain(nodes, &membership.running, *target, &mut checker).await;
                tokio::time::sleep(hold).await;
            }
            Fault::Remove(target) => {
                let target = *target;
                // Its disk is gone with it: in sync mode the adds no peer
                // pulled yet are lost, as with a wipe.
                wiped_any = true;
                // An odd epoch for good: its clients stop retrying (an add
                // in flight is of unknown fate) and wait until the end.
                shared.epochs[target].fetch_add(1, Ordering::SeqCst);
                nodes[target].kill();
                membership.running[target] = false;
                checker.removed(target);
                placement::remove(nodes, &membership.running, target, &mut checker).await;
                tokio::time::sleep(hold).await;
            }
        }
    }
    let remaining = deadline.saturating_duration_since(Instant::now());
    tokio::time::sleep(remaining).await;
    shared.stop.store(true, Ordering::SeqCst);
    like_shared.stop.store(true, Ordering::SeqCst);
    for task in tasks {
        let _ = task.await;
    }
    // Heal (every fault above is already undone) and wait for convergence.
    links.heal();
    let converge_timeout = Duration::from_secs(args.converge_timeout_s);
    let folded = if args.retire {
        let dead = checker.dead_ids();
        folds::wait_folded(
            nodes,
            &membership.running,
            &dead,
            converge_timeout,
            &mut checker,
        )
        .await
    } else {
        Default::default()
    };
    let finals = match &shared.placement {
        Some(placement) => {
            let running = &membership.running;
            match placement::settle(
                nodes,
                running,
                &cluster,
                &shared.names,
                placement,
                converge_timeout,
            )
            .await
            {
                Ok(finals) => finals,
                Err(unsettled) => {
                    for line in unsettled.iter().take(20) {
                        checker.violate(0, "placement not settled", line.clone());
                    }
                    if unsettled.len() > 20 {
                        let more = format!("and {} more such lines", unsettled.len() - 20);
                        checker.violate(0, "placement not settled", more);
                    }
                    placement::merged(nodes, running, &cluster, &shared.names).await?
                }
            }
        }
        None => {
            check::converge_everywhere(
                nodes,
                &cluster,
                &shared.names,
                converge_timeout,
                &mut checker,
            )
            .await?
        }
    };
    if args.likes {
        let running = &membership.running;
        // Every node that runs (a spare that never joined holds nothing);
        // in partitioned regions, the like set's owners, once they agree
        // (its reads are forwarded to an owner, but each node's delta log
        // is its own).
        let readers: Vec<usize> = match membership.key_partitions {
            Some(partitions) => {
                placement::set_owners(nodes, running, partitions, likes::LIKE_KEY).await
            }
            None => (0..nodes.len()).filter(|i| running[*i]).collect(),
        };
        let held = likes::read_settled(
            nodes,
            &readers,
            &cluster,
            membership.key_partitions.map(|_| converge_timeout),
        )
        .await?;
        if let Some(partitions) = membership.key_partitions {
            // A node that owns neither set stores none of them once its
            // purge is done (it may have held them before a move).
            let seen_owners =
                placement::set_owners(nodes, running, partitions, likes::UNIQUES_KEY).await;
            let strays: Vec<usize> = (0..nodes.len())
                .filter(|i| running[*i] && !readers.contains(i) && !seen_owners.contains(i))
                .collect();
            let names: Vec<String> = strays.iter().map(|i| format!("n{i}")).collect();
            if !names.is_empty() {
                println!(
                    "nodes that own neither set store none: {}",
                    names.join(", ")
                );
            }
            for (node, digest) in likes::wait_for_no_sets(nodes, &strays, converge_timeout).await {
                checker.violate(
                    0,
                    "sets not purged",
                    format!("n{node} owns neither set but its sets digest is {digest:?}"),
                );
            }
        }
        println!(
            "likes read from {}",
            readers
                .iter()
                .map(|i| format!("n{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let book = like_shared.book.lock().expect("like book");
        // A wipe may lose an acknowledged like with its disk (sync mode):
        // then only agreement, counts and registers are exact.
        for (kind, detail) in likes::check(&book, &held, !wiped_any) {
            checker.violate(0, kind, detail);
        }
        let (liked, exact, exact_lengths) = likes::summary(&book, &held);
        let ops: u32 = book
            .members
            .iter()
            .map(|ops| ops.likes_acked + ops.likes_unknown + ops.unlikes)
            .sum();
        println!(
            "likes: {ops} likes and unlikes ({} answered only after a retry), {liked} of {} members liked, {exact} with an exact expectation, {exact_lengths} with an exact length (every operation answered){}; {} distinct members observed (acked), estimate {}",
            like_shared.retried.load(Ordering::SeqCst),
            likes::MEMBERS,
            if wiped_any { " (not checked: a wipe)" } else { "" },
            book.observed_acked,
            held.first().map_or(0, |h| h.distinct.0),
        );
    }
    let mut copies = None;
    if args.durability == Durability::Replicated {
        let (mut confirmed, mut failed, mut taken) = (0, 0, 0);
        for node in nodes.iter() {
            confirmed += node
                .metric("tally_copy_pushes_total", "reason=\"confirmed\"")
                .await
                .unwrap_or(0);
            failed += node
                .metric("tally_copy_pushes_total", "reason=\"failed\"")
                .await
                .unwrap_or(0);
            taken += node
                .metric("tally_copies_taken_total", "")
                .await
                .unwrap_or(0);
        }
        copies = Some((confirmed, failed, taken));
    }
    let mut book = shared.book.lock().expect("book lock");
    let book = &mut *book;
    for (add, node, epoch) in book.across_wipe.clone() {
        for replica in incarnations[node].iter().skip((epoch / 2) as usize) {
            book.ledger.delivered(add, *replica);
        }
    }
    let (slots, wiped) =
        check::check_all(&mut checker, &book.ledger, &book.times, &finals, &folded);
    let w = &book.ledger.stats;
    println!(
        "workload: {} adds ({} on the hot key), {} acked, {} abandoned; slots checked {}, unacknowledged applied {}, lost {}",
        w.adds, w.hot_adds, w.acked, w.abandoned, slots.slots, slots.unacked_applied, slots.unacked_lost
    );
    println!(
        "client cuts: {} answers dropped mid-add, {} adds answered only after a retry with their idempotency key, \
         {} refused at their only attempt as not applied (checked absent)",
        clients.dropped.load(Ordering::SeqCst),
        shared.retried.load(Ordering::SeqCst),
        shared.refused.load(Ordering::SeqCst)
    );
    if shared.placement.is_some() {
        println!(
            "partitioned: {} adds refused because their node no longer served the key (not applied, or fate unknown after a failed attempt)",
            shared.not_served.load(Ordering::SeqCst)
        );
    }
    if wiped.slots > 0 {
        println!(
            "wipes: {} slots of wiped replicas checked ({} of folded ones, through the folded bases), {} acknowledged adds lost with their disk (never pulled), {} answered across a wipe",
            wiped.slots, wiped.folded, wiped.acked_lost, book.across_wipe.len()
        );
    }
    if wiped.split > 0 {
        println!(
            "partition moves: {} live slots partly folded (their node's partition moved away and its slots there were folded), checked through the folded bases",
            wiped.split
        );
    }
    if let Some((confirmed, failed, taken)) = copies {
        println!(
            "copies (since each node's last start): {confirmed} pushes confirmed, {failed} failed, {taken} taken by copies"
        );
    }
    if args.durability == Durability::Replicated && wiped.acked_lost > 0 {
        checker.violate(
            0,
            "acknowledged add lost to a wipe",
            format!(
                "{} acknowledged adds were lost with their disk, but --durability replicated \
                 acknowledges an add only once {} nodes of its region hold it durably",
                wiped.acked_lost, args.write_copies
            ),
        );
    }
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
