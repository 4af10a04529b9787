//! `tally admin k8s-pre-stop`: the preStop hook of a Tally pod in a
//! Kubernetes StatefulSet (`deploy/k8s/base/statefulset.yaml`).
//!
//! Kubernetes stops a pod the same way whether it comes back (a rolling
//! update, an eviction, a deleted pod: the same ordinal, volume and node)
//! or goes for good (a scale-down removes the ordinals the StatefulSet no
//! longer keeps). Only the second may drain the node: a drain is for good
//! (a node that drained never owns a partition again). So the hook reads
//! the StatefulSet's desired replica count from the Kubernetes API
//! ([`super::kube`]) and compares the pod's ordinal with it ([`decide`]):
//!
//! - the ordinal stays: print so and exit 0 at once, without touching the
//!   node (it stops on SIGTERM and comes back with its volume);
//! - the ordinal is scaled away: drain the node (`Admin.Drain` on the
//!   local node, `--endpoint`) and wait, polling the local node's partition
//!   map, until it shows the node `left` and holding nothing (the new owners
//!   have copied its partitions and it deleted them); exit 0 then, non-zero
//!   after `--timeout`;
//! - the StatefulSet is scaled to 0: the whole region stops, there is no
//!   node to drain to; nothing is drained.
//!
//! Invariant: a node is drained only after the API said its ordinal is no
//! longer kept; any failure before that (the API unreachable, 403, a pod
//! name without an ordinal) exits non-zero without draining.

use std::fmt::Display;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use serde_json::json;
use tally_client::{PartitionMap, Routing};
use tokio::time::Instant;

use super::duration::{format_age, parse_positive_duration};
use super::kube::{in_cluster_url, KubeApi, ServiceAccount, SERVICE_ACCOUNT_DIR};
use super::output::{one_line, print_json, print_line};
use super::Target;

/// With no change in the handoff, a progress line this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(60);

/// `tally admin k8s-pre-stop`.
#[derive(Debug, Args)]
pub struct PreStopArgs {
    /// This pod's name (downward API `metadata.name`); its ordinal is the
    /// number after its last `-` (`tally-3`: 3).
    #[arg(long, env = "POD_NAME")]
    pub pod: String,

    /// The node this pod runs, as `tally status` names it.
    #[arg(long, env = "TALLY_NODE_NAME")]
    pub node: String,

    /// The StatefulSet of the pod. [default: the pod's name without its ordinal]
    #[arg(long, env = "TALLY_STATEFULSET")]
    pub statefulset: Option<String>,

    /// The StatefulSet's `spec.ordinals.start`, when it sets one (the
    /// `scale` subresource does not tell it).
    #[arg(long, default_value_t = 0)]
    pub first_ordinal: u32,

    /// The pod's namespace (downward API `metadata.namespace`). [default:
    /// the service account's `namespace` file]
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,

    /// The Kubernetes API. [default:
    /// https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT]
    #[arg(long, env = "TALLY_KUBE_API", value_name = "URL")]
    pub kube_api: Option<String>,

    /// The directory of the service account's `token`, `ca.crt` and
    /// `namespace`.
    #[arg(long, env = "TALLY_KUBE_CREDENTIALS", value_name = "DIR", default_value = SERVICE_ACCOUNT_DIR)]
    pub kube_credentials: PathBuf,

    /// How long to wait for the drain: a little less than the pod's
    /// terminationGracePeriodSeconds, which bounds the hook.
    #[arg(long, default_value = "58m", value_parser = parse_positive_duration)]
    pub timeout: Duration,

    /// How often to read the partition map while waiting.
    #[arg(long, default_value = "2s", value_parser = parse_positive_duration)]
    pub poll_interval: Duration,

    /// Also append each line printed to FILE (in the pod, `/proc/1/fd/1`:
    /// the node's stdout, so that `kubectl logs` shows the drain; a
    /// preStop hook's own output is only seen when it fails).
    #[arg(long, env = "TALLY_PRE_STOP_LOG", value_name = "FILE")]
    pub log_to: Option<PathBuf>,
}

/// What a stopping pod's node does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The StatefulSet keeps the pod's ordinal: it is restarting (rolling
    /// update, eviction, a deleted pod) and comes back with its volume and
    /// identity. No drain.
    Restarting,
    /// A scale-down removes the pod's ordinal: drain the node.
    Leaving,
    /// Scaled to 0: the whole region stops, and there is no node to hand
    /// partitions to. No drain.
    RegionStops,
}

impl Decision {
    fn name(self) -> &'static str {
        match self {
            Decision::Restarting => "restarting",
            Decision::Leaving => "leaving",
            Decision::RegionStops => "region_stops",
        }
    }
}

/// The StatefulSet and ordinal of pod `pod` (`tally-3`: `tally`, 3); when
/// `statefulset` is given, the pod must be one of its pods.
pub fn pod_ordinal(pod: &str, statefulset: Option<&str>) -> Result<(String, u32), String> {
    let parsed = pod.rsplit_once('-').and_then(|(set, ordinal)| {
        let digits = !ordinal.is_empty() && ordinal.bytes().all(|b| b.is_ascii_digit());
        Some((set, ordinal.parse::<u32>().ok().filter(|_| digits)?))
    });
    let Some((set, ordinal)) = parsed.filter(|(set, _)| !set.is_empty()) else {
        return Err(format!(
            "pod name {pod:?} does not end in -ORDINAL as a StatefulSet's pods do (tally-3): \
             run this as the preStop hook of a StatefulSet's pod, with POD_NAME from the \
             downward API (metadata.name), or give --pod"
        ));
    };
    match statefulset {
        Some(given) if given != set => Err(format!(
            "pod {pod:?} is not a pod of StatefulSet {given:?} (its pods are named {given}-N)"
        )),
        _ => Ok((set.to_owned(), ordinal)),
    }
}

/// Whether the pod with `ordinal` leaves, when the StatefulSet keeps
/// `replicas` pods from ordinal `first_ordinal` on.
pub fn decide(ordinal: u32, first_ordinal: u32, replicas: u32) -> Decision {
    if replicas == 0 {
        Decision::RegionStops
    } else if ordinal < first_ordinal || ordinal - first_ordinal >= replicas {
        Decision::Leaving
    } else {
        Decision::Restarting
    }
}

/// Where a draining node's handoff stands, from a partition map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handoff {
    /// It has left and holds nothing: it may stop for good.
    Left,
    /// Not yet.
    Pending {
        /// Its state (`draining`; `active` or `joining` before the drain
        /// took).
        state: String,
        /// Partitions it still holds.
        held: u32,
        /// Of those, the ones it is handing away.
        releasing: u32,
    },
}

/// `node`'s handoff in `map`; `None` when the map does not list it.
pub fn handoff(map: &PartitionMap, node: &str) -> Option<Handoff> {
    let entry = map.nodes.iter().find(|entry| entry.node_name == node)?;
    Some(if entry.state == "left" && entry.partitions_held == 0 {
        Handoff::Left
    } else {
        Handoff::Pending {
            state: entry.state.clone(),
            held: entry.partitions_held,
            releasing: entry.partitions_releasing,
        }
    })
}

/// "ordinals 0 to 2 (3 replicas)".
fn kept_ordinals(first_ordinal: u32, replicas: u32) -> String {
    match replicas {
        0 => "no ordinal (0 replicas)".to_owned(),
        1 => format!("ordinal {first_ordinal} (1 replica)"),
        _ => format!(
            "ordinals {first_ordinal} to {} ({replicas} replicas)",
            u64::from(first_ordinal) + u64::from(replicas) - 1
        ),
    }
}

/// `tally admin k8s-pre-stop`.
pub async fn run(target: &Target, args: &PreStopArgs, json: bool) -> anyhow::Result<()> {
    let mut report = Report::new(json, args.log_to.as_deref());
    let result = decide_and_drain(target, args, &mut report).await;
    if let Err(error) = &result {
        report.log_error(error);
    }
    result
}

/// Decides from the StatefulSet's scale, and drains when the pod leaves.
async fn decide_and_drain(
    target: &Target,
    args: &PreStopArgs,
    report: &mut Report,
) -> anyhow::Result<()> {
    let (statefulset, ordinal) =
        pod_ordinal(&args.pod, args.statefulset.as_deref()).map_err(anyhow::Error::msg)?;
    let account = ServiceAccount::load(&args.kube_credentials)?;
    let namespace = args
        .namespace
        .clone()
        .or_else(|| account.namespace.clone())
        .ok_or_else(|| {
            anyhow!(
                "the pod's namespace is unknown ({} has no namespace file): set POD_NAMESPACE \
                 from the downward API (metadata.namespace), or give --namespace",
                account.dir.display()
            )
        })?;
    let url = match &args.kube_api {
        Some(url) => url.clone(),
        None => in_cluster_url(
            std::env::var("KUBERNETES_SERVICE_HOST").ok().as_deref(),
            std::env::var("KUBERNETES_SERVICE_PORT").ok().as_deref(),
        )
        .map_err(anyhow::Error::msg)?,
    };
    let api = KubeApi::new(&url, &account)?;
    let replicas = api
        .statefulset_replicas(&namespace, &statefulset)
        .await
        .with_context(|| format!("node {} is not drained", args.node))?;
    let decision = decide(ordinal, args.first_ordinal, replicas);
    let (pod, node) = (&args.pod, &args.node);
    let kept = kept_ordinals(args.first_ordinal, replicas);
    let text = match decision {
        Decision::Restarting => format!(
            "pod {pod} is restarting, not leaving: StatefulSet {statefulset} keeps {kept}; \
             node {node} is not drained"
        ),
        Decision::Leaving => format!(
            "pod {pod} is leaving: StatefulSet {statefulset} keeps {kept}; draining node {node}"
        ),
        Decision::RegionStops => format!(
            "StatefulSet {statefulset} is scaled to 0: the whole region stops, and no node is \
             left to take partitions over; node {node} is not drained (its volume claim keeps \
             its data)"
        ),
    };
    report.emit(
        text,
        json!({"event": "decision", "pod": pod, "statefulset": statefulset,
               "ordinal": ordinal, "replicas": replicas, "node": node,
               "decision": decision.name()}),
    )?;
    if decision == Decision::Leaving {
        drain_and_wait(target, args, report).await?;
    }
    Ok(())
}

/// Drains `args.node` through `target` and waits until it has left.
async fn drain_and_wait(
    target: &Target,
    args: &PreStopArgs,
    report: &mut Report,
) -> anyhow::Result<()> {
    let (pod, node) = (&args.pod, &args.node);
    let started = Instant::now();
    let elapsed_ms = || started.elapsed().as_millis() as u64;
    // The local node itself answers: no partition map for routing, no
    // connection to other pods.
    let target = Target {
        endpoint: target.endpoint.clone(),
        base: target.base.clone().with_routing(Routing::Pinned),
    };
    let client = target
        .connect()
        .await
        .with_context(|| format!("cannot reach node {node} to drain it"))?;
    let map = client.partition_map(None).await.with_context(|| {
        format!("cannot read node {node}'s partition map, so it is not drained")
    })?;
    let region = map.region.clone();
    match handoff(&map, node) {
        None => bail!(
            "node {node} is not in the partition map of region {region} (as {} computes it), \
             so it is not drained: is --node (TALLY_NODE_NAME) this pod's node, and \
             --endpoint its address?",
            map.answered_by
        ),
        Some(Handoff::Left) => {
            return report.emit(
                format!("node {node} has left already; the pod may stop"),
                json!({"event": "left", "node": node, "region": region, "elapsed_ms": 0}),
            );
        }
        Some(Handoff::Pending { .. }) => {}
    }
    let newly = client.drain(node).await.with_context(|| {
        format!(
            "node {node} refused to drain, so pod {pod} stops without a drain (its volume claim \
             is kept: scale the StatefulSet back up, then see deploy/k8s/README.md)"
        )
    })?;
    let how = if newly {
        format!(
            "node {node} is draining: the other nodes of region {region} take its partitions over"
        )
    } else {
        format!("node {node} was draining already")
    };
    report.emit(
        format!(
            "{how}; waiting until it has left (at most {})",
            format_age(args.timeout)
        ),
        json!({"event": "draining", "node": node, "newly_draining": newly}),
    )?;
    let mut shown: Option<(Handoff, Instant)> = None;
    let mut last_error: Option<String> = None;
    loop {
        let progress = match client.partition_map(None).await {
            Ok(map) => handoff(&map, node),
            Err(error) => {
                let message = error.to_string();
                if last_error.as_ref() != Some(&message) {
                    report.emit(
                        format!("cannot read the partition map (retrying): {message}"),
                        json!({"event": "map_error", "node": node, "error": message,
                               "elapsed_ms": elapsed_ms()}),
                    )?;
                    last_error = Some(message);
                }
                shown.as_ref().map(|(progress, _)| progress.clone())
            }
        };
        match &progress {
            Some(Handoff::Left) => {
                return report.emit(
                    format!(
                        "node {node} has left: the other nodes of region {region} hold its \
                         partitions ({}); the pod may stop",
                        format_age(started.elapsed())
                    ),
                    json!({"event": "left", "node": node, "region": region,
                           "elapsed_ms": elapsed_ms()}),
                );
            }
            Some(
                pending @ Handoff::Pending {
                    state,
                    held,
                    releasing,
                },
            ) => {
                let stale = shown
                    .as_ref()
                    .is_none_or(|(last, at)| last != pending || at.elapsed() >= PROGRESS_EVERY);
                if stale {
                    report.emit(
                        format!(
                            "node {node}: {state}, holds {held} partitions, {releasing} being \
                             handed away ({})",
                            format_age(started.elapsed())
                        ),
                        json!({"event": "progress", "node": node, "state": state,
                               "held": held, "releasing": releasing,
                               "elapsed_ms": elapsed_ms()}),
                    )?;
                    shown = Some((pending.clone(), Instant::now()));
                }
            }
            None => {}
        }
        let remaining = args.timeout.saturating_sub(started.elapsed());
        if remaining.is_zero() {
            let now = match progress {
                Some(Handoff::Pending {
                    state,
                    held,
                    releasing,
                }) => format!("{state}, holds {held} partitions, {releasing} being handed away"),
                _ => "its state unknown".to_owned(),
            };
            bail!(
                "node {node} has not left within {} ({now}): the pod stops now, still draining. \
                 Its volume claim is kept: scale the StatefulSet back up so that the node \
                 finishes its drain (it resumes when it starts), then scale down again; see \
                 deploy/k8s/README.md",
                format_age(args.timeout)
            );
        }
        tokio::time::sleep(remaining.min(args.poll_interval)).await;
    }
}

/// Where the command's lines go: stdout (text or one JSON object per
/// line) and, with `--log-to`, that file too.
struct Report {
    json: bool,
    log: Option<File>,
}

impl Report {
    /// A report; a `--log-to` file that cannot be opened is said on stderr
    /// and left out (the hook must not fail for its log).
    fn new(json: bool, log_to: Option<&Path>) -> Report {
        let log = log_to.and_then(|path| {
            let opened = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path);
            opened
                .map_err(|error| {
                    eprintln!(
                        "warning: --log-to {}: {error}; not logging there",
                        path.display()
                    )
                })
                .ok()
        });
        Report { json, log }
    }

    /// Prints `text`, or `object` with `--json`.
    fn emit(&mut self, text: impl Display, object: serde_json::Value) -> anyhow::Result<()> {
        let line = if self.json {
            print_json(&object)?;
            object.to_string()
        } else {
            print_line(&text)?;
            text.to_string()
        };
        self.log(&line);
        Ok(())
    }

    /// Logs the error that ends the command (stderr has it from `main`).
    fn log_error(&mut self, error: &anyhow::Error) {
        let message = one_line(error);
        if self.json {
            self.log(&json!({"event": "error", "error": message}).to_string());
        } else {
            self.log(&format!("error: {message}"));
        }
    }

    /// Appends `line` to the `--log-to` file, if any. Among the node's own
    /// log lines, JSON objects stay whole and a text line says where it
    /// comes from.
    fn log(&mut self, line: &str) {
        let prefix = if self.json {
            ""
        } else {
            "tally admin k8s-pre-stop: "
        };
        if let Some(log) = &mut self.log {
            if writeln!(log, "{prefix}{line}").is_err() {
                self.log = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_client::PartitionNode;

    #[test]
    fn the_ordinal_is_the_number_after_the_last_dash() {
        assert_eq!(pod_ordinal("tally-3", None), Ok(("tally".into(), 3)));
        assert_eq!(
            pod_ordinal("tally-eu-12", Some("tally-eu")),
            Ok(("tally-eu".into(), 12))
        );
        for bad in [
            "tally",
            "tally-",
            "-3",
            "tally-x",
            "tally-+3",
            "tally-99999999999",
        ] {
            let error = pod_ordinal(bad, None).unwrap_err();
            assert!(error.contains("-ORDINAL"), "{bad}: {error}");
        }
        let error = pod_ordinal("other-1", Some("tally")).unwrap_err();
        assert!(
            error.contains("not a pod of StatefulSet \"tally\""),
            "{error}"
        );
    }

    #[test]
    fn only_ordinals_the_statefulset_no_longer_keeps_leave() {
        assert_eq!(decide(3, 0, 3), Decision::Leaving);
        assert_eq!(decide(4, 0, 3), Decision::Leaving);
        assert_eq!(decide(2, 0, 3), Decision::Restarting);
        assert_eq!(decide(0, 0, 1), Decision::Restarting);
        assert_eq!(decide(0, 0, 0), Decision::RegionStops);
        assert_eq!(decide(5, 0, 0), Decision::RegionStops);
        // spec.ordinals.start 2, 3 replicas: ordinals 2, 3, 4.
        assert_eq!(decide(1, 2, 3), Decision::Leaving);
        assert_eq!(decide(2, 2, 3), Decision::Restarting);
        assert_eq!(decide(4, 2, 3), Decision::Restarting);
        assert_eq!(decide(5, 2, 3), Decision::Leaving);
        assert_eq!(decide(u32::MAX, u32::MAX, 1), Decision::Restarting);
    }

    #[test]
    fn kept_ordinals_read_as_a_range() {
        assert_eq!(kept_ordinals(0, 3), "ordinals 0 to 2 (3 replicas)");
        assert_eq!(kept_ordinals(2, 1), "ordinal 2 (1 replica)");
        assert_eq!(
            kept_ordinals(u32::MAX, 2),
            "ordinals 4294967295 to 4294967296 (2 replicas)"
        );
    }

    fn map(nodes: &[(&str, &str, u32)]) -> PartitionMap {
        PartitionMap {
            partitions: 8,
            replication_factor: 2,
            effective_replication: 2,
            under_replicated: 0,
            region: "eu-west".into(),
            nodes: nodes
                .iter()
                .map(|(name, state, held)| PartitionNode {
                    node_name: (*name).into(),
                    region: "eu-west".into(),
                    replica: 1,
                    grpc_addr: String::new(),
                    state: (*state).into(),
                    alive: true,
                    gone: false,
                    partitions_owned: 0,
                    partitions_held: *held,
                    partitions_releasing: *held,
                    counters_stored: None,
                })
                .collect(),
            owners: Vec::new(),
            answered_by: "eu-west-tally-1".into(),
        }
    }

    #[test]
    fn a_node_has_left_only_in_state_left_holding_nothing() {
        let pending = |state: &str, held| Handoff::Pending {
            state: state.into(),
            held,
            releasing: held,
        };
        let leaving = "eu-west-tally-1";
        for (state, held, expected) in [
            ("left", 0, Handoff::Left),
            ("left", 2, pending("left", 2)),
            ("draining", 0, pending("draining", 0)),
            ("draining", 5, pending("draining", 5)),
            ("active", 8, pending("active", 8)),
        ] {
            let map = map(&[("eu-west-tally-0", "active", 8), (leaving, state, held)]);
            assert_eq!(handoff(&map, leaving), Some(expected), "{state} {held}");
        }
        assert_eq!(
            handoff(&map(&[("eu-west-tally-0", "active", 8)]), leaving),
            None
        );
    }
}
