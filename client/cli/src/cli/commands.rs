//! The commands that make one call: `add`, `get`, `watch` and `status`. Each
//! connects, calls the library, and prints in the formats documented in the
//! parent module.

use std::collections::BTreeSet;

use anyhow::Context;
use futures::StreamExt;
use serde::Serialize;
use tally_client::{ClusterStatus, Counter, CounterSlots, FoldedSums};

use super::duration::format_age;
use super::output::{print_json, print_line, render_table, Align};
use super::{AddArgs, GetArgs, Target, WatchArgs};

/// A counter's key and value, the JSON line of `get` and `watch`.
#[derive(Debug, Serialize)]
struct KeyValue<'a> {
    key: &'a str,
    value: i64,
}

/// `tally add KEY [DELTA]`.
pub async fn add(target: &Target, args: &AddArgs, json: bool) -> anyhow::Result<()> {
    let client = match args.durability {
        Some(durability) => {
            let config = target.base.clone().with_durability(durability.into());
            config.connect(target.endpoint.as_str()).await?
        }
        None => target.connect().await?,
    };
    // Every add carries a key, the user's or a fresh one, that the client's
    // retries reuse; when the outcome stays unknown, the key is printed so
    // that the user can send the same add again and have it counted once
    // (a plain re-run would send a new key and could count twice).
    let idempotency_key = match &args.idempotency_key {
        Some(idempotency_key) => idempotency_key.clone(),
        None => tally_client::new_idempotency_key(),
    };
    let outcome = client
        .add_with_key(&args.key, args.delta, &idempotency_key)
        .await
        .map_err(|error| {
            if error.outcome_unknown() {
                anyhow::anyhow!(
                    "{error}; the add's outcome is unknown (it may have been applied): \
                     retry it with the same idempotency key, which counts it once: {}",
                    retry_command(args, &idempotency_key)
                )
            } else {
                error.into()
            }
        })?;
    if json {
        #[derive(Serialize)]
        struct Added<'a> {
            key: &'a str,
            value: i64,
            duplicate: bool,
        }
        return print_json(&Added {
            key: &args.key,
            value: outcome.value,
            duplicate: outcome.duplicate,
        });
    }
    if outcome.duplicate {
        print_line(format_args!(
            "{} (duplicate: already applied)",
            outcome.value
        ))?;
    } else {
        print_line(outcome.value)?;
    }
    Ok(())
}

/// The command that sends the same add again with its idempotency key.
fn retry_command(args: &AddArgs, idempotency_key: &str) -> String {
    let mut command = format!(
        "tally add {} {} --idempotency-key {}",
        shell_word(&args.key),
        args.delta,
        shell_word(idempotency_key)
    );
    if let Some(durability) = args.durability {
        command.push_str(match durability {
            super::DurabilityArg::Sync => " --durability sync",
            super::DurabilityArg::Replicated => " --durability replicated",
        });
    }
    command
}

/// `word` as one shell word: as is when it holds only characters no shell
/// treats specially, else single-quoted.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/@%+=,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// `tally get KEY [--breakdown | --slots]`.
pub async fn get(target: &Target, args: &GetArgs, json: bool) -> anyhow::Result<()> {
    let client = target.connect().await?;
    if args.slots {
        let counter = client.get_with_slots(&args.key).await?;
        if json {
            return print_json(&counter);
        }
        print_line(counter.value)?;
        print_line(slots_table(&counter).trim_end())?;
        return Ok(());
    }
    if !args.breakdown {
        let value = client.get(&args.key).await?;
        if json {
            return print_json(&KeyValue {
                key: &args.key,
                value,
            });
        }
        print_line(value)?;
        return Ok(());
    }
    let counter = client.get_with_breakdown(&args.key).await?;
    if json {
        return print_json(&counter);
    }
    print_line(counter.value)?;
    print_line(breakdown_table(&counter).trim_end())?;
    Ok(())
}

fn breakdown_table(counter: &Counter) -> String {
    let rows: Vec<Vec<String>> = counter
        .regions
        .iter()
        .map(|region| {
            let last_sync = match (region.local, region.since_last_sync) {
                (true, _) => "local".to_owned(),
                (false, Some(age)) => format_age(age),
                (false, None) => "never".to_owned(),
            };
            vec![
                region.region.clone(),
                region.value.to_string(),
                region.increments.to_string(),
                region.decrements.to_string(),
                last_sync,
            ]
        })
        .collect();
    render_table(
        &[
            ("REGION", Align::Left),
            ("VALUE", Align::Right),
            ("+", Align::Right),
            ("-", Align::Right),
            ("LAST SYNC", Align::Left),
        ],
        &rows,
    )
}

/// One row per live writer, then the folded base when there is one.
fn slots_table(counter: &CounterSlots) -> String {
    let mut rows: Vec<Vec<String>> = counter
        .slots
        .iter()
        .map(|slot| {
            vec![
                format!("{:016x}", slot.replica),
                slot.region.clone(),
                slot.p.to_string(),
                slot.n.to_string(),
            ]
        })
        .collect();
    if counter.folded != FoldedSums::default() {
        rows.push(vec![
            format!("(folded, epoch {})", counter.folded.epoch),
            String::new(),
            counter.folded.p.to_string(),
            counter.folded.n.to_string(),
        ]);
    }
    render_table(
        &[
            ("REPLICA", Align::Left),
            ("REGION", Align::Left),
            ("+", Align::Right),
            ("-", Align::Right),
        ],
        &rows,
    )
}

/// `tally watch KEY`: prints until the stream ends or Ctrl-C.
pub async fn watch(target: &Target, args: &WatchArgs, json: bool) -> anyhow::Result<()> {
    let client = target.connect().await?;
    let mut values = client.watch(&args.key).await?;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            interrupted = &mut ctrl_c => {
                interrupted.context("cannot listen for Ctrl-C")?;
                return Ok(());
            }
            next = values.next() => match next {
                None => return Ok(()),
                Some(Err(error)) => return Err(error).context("the watch stream failed"),
                Some(Ok(value)) if json => print_json(&KeyValue { key: &args.key, value })?,
                Some(Ok(value)) => print_line(value)?,
            },
        }
    }
}

/// `tally status`.
/// `tally admin finalize`: moves the cluster version to the newest version
/// the node speaks (refused, naming them, while some member does not).
pub async fn finalize(target: &Target, json: bool) -> anyhow::Result<()> {
    let client = target.connect().await?;
    let (previous, now) = client.finalize().await?;
    if json {
        return print_json(&serde_json::json!({
            "previous_version": previous,
            "cluster_version": now,
        }));
    }
    if previous == now {
        print_line(format_args!("cluster version: {now} (already finalized)"))?;
    } else {
        print_line(format_args!(
            "cluster version: {previous} -> {now}; the other members follow through gossip, \
             and nodes that speak only older versions are refused from now on"
        ))?;
    }
    Ok(())
}

/// `tally admin retire REPLICA`: retires a stopped replica.
pub async fn retire(target: &Target, replica: &str, json: bool) -> anyhow::Result<()> {
    let id = u64::from_str_radix(replica.trim(), 16)
        .ok()
        .filter(|_| replica.trim().len() <= 16)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{replica:?} is not a replica id: give the 16 hex digits tally status prints"
            )
        })?;
    let client = target.connect().await?;
    let newly = client.retire(id).await?;
    if json {
        return print_json(&serde_json::json!({
            "replica": format!("{id:016x}"),
            "newly_retired": newly,
        }));
    }
    if newly {
        print_line(format_args!(
            "replica {id:016x} retired; its slots are folded once every member holds their \
             final state (see tally status)"
        ))?;
    } else {
        print_line(format_args!("replica {id:016x} was already retired"))?;
    }
    Ok(())
}

pub async fn status(target: &Target, args: &super::StatusArgs, json: bool) -> anyhow::Result<()> {
    let client = target.connect().await?;
    let mut status = client.status().await?;
    // --wait: ask again until the members agree, or the time is up (then
    // the status is printed all the same, and the command fails after it).
    if let Some(limit) = args.wait {
        let deadline = std::time::Instant::now() + limit;
        while !status.converged && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            status = client.status().await?;
        }
    }
    // A node from before partition maps answers UNIMPLEMENTED: no summary.
    let map = match client.partition_map(None).await {
        Ok(map) => Some(map),
        Err(error) if error.code() == Some(tally_client::Code::Unimplemented) => None,
        Err(error) => return Err(error.into()),
    };
    if json {
        let mut value = serde_json::to_value(&status)?;
        value["partition_map"] = serde_json::to_value(&map)?;
        print_json(&value)?;
        return waited_in_vain(args, &status);
    }
    print_line(cluster_line(&status))?;
    print_line(format_args!(
        "cluster version: {} (this node speaks protocol versions {}..={})",
        status.cluster_version, status.node.protocol_oldest, status.node.protocol_version
    ))?;
    print_line(members_table(&status).trim_end())?;
    print_line(convergence_line(&status))?;
    for problem in name_problems(&status)
        .into_iter()
        .chain(version_problems(&status))
    {
        print_line(problem)?;
    }
    for writer in &status.retired {
        let state = if writer.folded_epoch > 0 {
            format!("folded at epoch {}", writer.folded_epoch)
        } else if writer.waiting.is_empty() {
            "fold pending".to_owned()
        } else {
            format!("fold waits: {}", writer.waiting)
        };
        print_line(format_args!(
            "retired writer {:016x} ({}): {state}",
            writer.replica, writer.reason
        ))?;
    }
    for retired in &status.retired_partitions {
        let state = match retired.waiting.as_str() {
            "" => "fold pending".to_owned(),
            waiting => format!("fold waits: {waiting}"),
        };
        print_line(format_args!(
            "retired slots of {:016x} in partition {} (phase {}; the partition moved away from it): {state}",
            retired.replica, retired.partition, retired.phase
        ))?;
    }
    if !status.hot_keys.is_empty() {
        let rows: Vec<Vec<String>> = status
            .hot_keys
            .iter()
            .map(|hot| {
                vec![
                    hot.op.clone(),
                    hot.key.clone(),
                    format!("{:.1}", hot.rate_per_sec),
                ]
            })
            .collect();
        print_line("hot keys on this node:")?;
        print_line(
            render_table(
                &[
                    ("OP", Align::Left),
                    ("KEY", Align::Left),
                    ("PER SECOND", Align::Right),
                ],
                &rows,
            )
            .trim_end(),
        )?;
    }
    if let Some(map) = &map {
        print_line(super::partitions::summary(map))?;
    }
    waited_in_vain(args, &status)
}

/// The error of a `status --wait` whose members did not converge in time.
fn waited_in_vain(args: &super::StatusArgs, status: &ClusterStatus) -> anyhow::Result<()> {
    match args.wait {
        Some(limit) if !status.converged => anyhow::bail!(
            "the members have not converged within {limit:?} (see the convergence line above); \
             wait longer with --wait DURATION, or look at the members that lag"
        ),
        _ => Ok(()),
    }
}

fn members_table(status: &ClusterStatus) -> String {
    let rows: Vec<Vec<String>> = status
        .all_members()
        .enumerate()
        .map(|(index, member)| {
            let last_sync = match (index, member.since_last_sync) {
                (0, _) => "self".to_owned(),
                (_, Some(age)) => format_age(age),
                (_, None) => "never".to_owned(),
            };
            vec![
                member.region.clone(),
                member.node_name.clone(),
                member.replica_hex(),
                member.grpc_addr.clone(),
                if member.alive { "yes" } else { "no" }.to_owned(),
                last_sync,
                member.seq_lag.to_string(),
                member.digest_hex(),
            ]
        })
        .collect();
    render_table(
        &[
            ("REGION", Align::Left),
            ("NODE", Align::Left),
            ("REPLICA", Align::Left),
            ("GRPC ADDRESS", Align::Left),
            ("ALIVE", Align::Left),
            ("LAST SYNC", Align::Left),
            ("SEQ LAG", Align::Right),
            ("DIGEST", Align::Left),
        ],
        &rows,
    )
}

/// `problem: ...` for every node name that more than one live replica uses
/// (both are replicated, but names must be unique for people to tell them apart).
fn name_problems(status: &ClusterStatus) -> Vec<String> {
    let mut by_name: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for member in status.all_members().filter(|member| member.alive) {
        by_name
            .entry(&member.node_name)
            .or_default()
            .push(member.replica_hex());
    }
    by_name
        .into_iter()
        .filter(|(_, replicas)| replicas.len() > 1)
        .map(|(name, replicas)| {
            format!(
                "problem: node name {name} is used by {} live replicas ({}); stop one of them \
                 or restart it with another --node-name",
                replicas.len(),
                replicas.join(", ")
            )
        })
        .collect()
}

/// `cluster: ID`, with the partition count when the node has one.
fn cluster_line(status: &ClusterStatus) -> String {
    match status.partitions {
        0 => format!("cluster: {}", status.cluster_id),
        partitions => format!("cluster: {}, {partitions} partitions", status.cluster_id),
    }
}

/// One line per member that the answering node refuses: it shares no
/// protocol version with it (see `docs/src/operations/upgrades.md`), or announces
/// another partition count.
fn version_problems(status: &ClusterStatus) -> Vec<String> {
    let own = &status.node;
    status
        .members
        .iter()
        .filter(|member| member.refused)
        .map(|member| {
            if member.partitions != 0 && own.partitions != 0 && member.partitions != own.partitions
            {
                return format!(
                    "problem: {} ({}, replica {}) is refused: it announces {} partitions, this \
                     node {}; a cluster's partition count is fixed: restart it with \
                     --partitions {} and a new --data-dir",
                    member.node_name,
                    member.region,
                    member.replica_hex(),
                    member.partitions,
                    own.partitions,
                    own.partitions
                );
            }
            let advice = if member.protocol_version < own.protocol_oldest {
                format!(
                    "it runs a release older than this node can talk to: upgrade it first to \
                     the release that speaks protocol version {} and finalize there, then to \
                     this node's release",
                    own.protocol_oldest
                )
            } else if member.protocol_oldest > own.protocol_version {
                "it runs a newer release whose upgrade was finalized: upgrade this node".into()
            } else {
                "upgrade the older of the two".into()
            };
            format!(
                "problem: {} ({}, replica {}) is refused: it speaks protocol versions {}..={}, \
                 this node {}..={}; no state is exchanged with it: {advice}",
                member.node_name,
                member.region,
                member.replica_hex(),
                member.protocol_oldest,
                member.protocol_version,
                own.protocol_oldest,
                own.protocol_version
            )
        })
        .collect()
}

/// `converged: yes|no (...)`: the server's verdict, and the digests behind
/// it (the sets digests of the members that publish one).
fn convergence_line(status: &ClusterStatus) -> String {
    let verdict = if status.converged { "yes" } else { "no" };
    if !status.convergence.is_empty() {
        // Judged partition by partition (cluster version 10).
        return format!("converged: {verdict} ({})", status.convergence);
    }
    let live: Vec<_> = status.all_members().filter(|member| member.alive).collect();
    let digests: BTreeSet<String> = live.iter().map(|member| member.digest_hex()).collect();
    let sets: BTreeSet<String> = live
        .iter()
        .filter_map(|member| member.sets_digest.map(|sets| format!("{sets:016x}")))
        .collect();
    let first = |set: &BTreeSet<String>| set.first().cloned().unwrap_or_default();
    match (digests.len(), sets.len()) {
        (0, _) => format!("converged: {verdict} (no live members)"),
        (1, 0) => format!(
            "converged: {verdict} (all {} live members hold digest {})",
            live.len(),
            first(&digests)
        ),
        (1, 1) => format!(
            "converged: {verdict} (all {} live members hold digest {}, sets digest {})",
            live.len(),
            first(&digests),
            first(&sets)
        ),
        (1, different) => {
            format!("converged: {verdict} (live members hold {different} different sets digests)")
        }
        (different, _) => {
            format!("converged: {verdict} (live members hold {different} different digests)")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tally_client::{Member, RegionValue};

    use super::*;

    fn member(name: &str, alive: bool, digest: u64) -> Member {
        Member {
            region: "eu-west".to_owned(),
            node_name: name.to_owned(),
            replica: 0xab,
            grpc_addr: "10.0.0.1:7100".to_owned(),
            gossip_addr: "10.0.0.1:7200".to_owned(),
            alive,
            digest,
            sets_digest: None,
            durable_seq: 9,
            since_last_sync: Some(Duration::from_millis(1_250)),
            seq_lag: 2,
            protocol_version: 2,
            protocol_oldest: 1,
            refused: false,
            partitions: 256,
            born_at: 0,
        }
    }

    fn status(converged: bool, members: Vec<Member>) -> ClusterStatus {
        ClusterStatus {
            cluster_id: "test".to_owned(),
            node: member("n1", true, 7),
            members,
            converged,
            convergence: String::new(),
            hot_keys: Vec::new(),
            cluster_version: 1,
            retired: Vec::new(),
            retired_partitions: Vec::new(),
            folds_applied: 0,
            partitions: 256,
        }
    }

    #[test]
    fn a_member_with_another_partition_count_is_a_problem_that_names_both() {
        let mut other = member("n2", true, 7);
        other.partitions = 64;
        other.refused = true;
        let cluster = status(true, vec![other]);
        let problems = version_problems(&cluster);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("announces 64 partitions, this node 256")
                && problems[0].contains("--partitions 256"),
            "{problems:?}"
        );
        assert_eq!(cluster_line(&cluster), "cluster: test, 256 partitions");
    }

    #[test]
    fn a_refused_member_is_a_problem_that_names_both_windows() {
        let mut old = member("n2", true, 7);
        old.protocol_version = 1;
        old.protocol_oldest = 1;
        let mut cluster = status(true, vec![old, member("n3", true, 7)]);
        assert!(version_problems(&cluster).is_empty(), "shares version 1");
        cluster.members[0].refused = true;
        cluster.node.protocol_oldest = 2;
        let problems = version_problems(&cluster);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("problem: n2 (eu-west")
                && problems[0].contains("versions 1..=1, this node 2..=2")
                && problems[0]
                    .contains("upgrade it first to the release that speaks protocol version 2"),
            "{problems:?}"
        );
        // A newer release that finalized: this node is the one to upgrade.
        cluster.members[0].protocol_oldest = 3;
        cluster.members[0].protocol_version = 3;
        let problems = version_problems(&cluster);
        assert!(problems[0].contains("upgrade this node"), "{problems:?}");
    }

    #[test]
    fn a_name_used_by_two_live_replicas_is_a_problem() {
        let mut twin = member("n1", true, 7);
        twin.replica = 0xbeef;
        let mut twins = status(true, vec![twin, member("n3", true, 7)]);
        let problems = name_problems(&twins);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("problem: node name n1"),
            "{problems:?}"
        );
        twins.members[0].alive = false;
        assert!(name_problems(&twins).is_empty());
    }

    #[test]
    fn convergence_line_counts_only_live_members() {
        let converged = status(true, vec![member("n2", true, 7), member("n3", false, 8)]);
        assert_eq!(
            convergence_line(&converged),
            "converged: yes (all 2 live members hold digest 0000000000000007)"
        );
        let diverged = status(false, vec![member("n2", true, 8)]);
        assert_eq!(
            convergence_line(&diverged),
            "converged: no (live members hold 2 different digests)"
        );
        // Sets digests: shown when published, compared among those that do.
        let mut sets = status(true, vec![member("n2", true, 7), member("n3", true, 7)]);
        sets.node.sets_digest = Some(5);
        sets.members[0].sets_digest = Some(5);
        assert_eq!(
            convergence_line(&sets),
            "converged: yes (all 3 live members hold digest 0000000000000007, sets digest 0000000000000005)"
        );
        sets.members[1].sets_digest = Some(6);
        sets.converged = false;
        assert_eq!(
            convergence_line(&sets),
            "converged: no (live members hold 2 different sets digests)"
        );
    }

    #[test]
    fn members_table_puts_the_answering_node_first_as_self() {
        let table = members_table(&status(true, vec![member("n2", false, 7)]));
        let lines: Vec<&str> = table.lines().collect();
        let header: Vec<&str> = lines[0]
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            header,
            [
                "REGION",
                "NODE",
                "REPLICA",
                "GRPC ADDRESS",
                "ALIVE",
                "LAST SYNC",
                "SEQ LAG",
                "DIGEST"
            ]
        );
        let first: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            first,
            [
                "eu-west",
                "n1",
                "00000000000000ab",
                "10.0.0.1:7100",
                "yes",
                "self",
                "2",
                "0000000000000007"
            ]
        );
        let second: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(second[4..6], ["no", "1.2s"]);
    }

    #[test]
    fn breakdown_table_shows_local_never_and_ages() {
        let region = |name: &str, local, since_last_sync| RegionValue {
            region: name.to_owned(),
            value: 3,
            increments: 5,
            decrements: 2,
            local,
            since_last_sync,
        };
        let counter = Counter {
            key: "k".to_owned(),
            value: 9,
            regions: vec![
                region("eu", true, None),
                region("us", false, Some(Duration::from_millis(300))),
                region("ap", false, None),
            ],
        };
        let table = breakdown_table(&counter);
        let cells: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(cells[1], ["eu", "3", "5", "2", "local"]);
        assert_eq!(cells[2], ["us", "3", "5", "2", "300ms"]);
        assert_eq!(cells[3], ["ap", "3", "5", "2", "never"]);
    }
}
