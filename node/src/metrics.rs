//! The node's Prometheus metrics, in one registry served at `/metrics`.
//!
//! Names follow Prometheus conventions: `tally_` prefix, `_total` on counters,
//! base units (`_seconds`, `_bytes`) in the name.
//!
//! Two encodings: OpenMetrics ([`Metrics::encode`], what Prometheus asks
//! for), and the classic text format ([`Metrics::encode_text`], for every
//! other scraper and for `promtool check metrics`), where a counter family is
//! named with its `_total` suffix so that its help and type apply to its
//! samples.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// A label naming a peer replica (hex id) and its region.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabels {
    /// The peer's replica id, 16 hex digits.
    pub peer: String,
    /// The peer's region.
    pub region: String,
}

/// Labels of a hot key's rate.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HotKeyLabels {
    /// `add` or `get`.
    pub op: String,
    /// The counter.
    pub key: String,
}

/// The reasons of `tally_add_errors_total`, created at zero at start
/// (`engine::adds::count_add_error` names them).
pub const ADD_ERROR_REASONS: &[&str] = &[
    "bad_key",
    "counter",
    "idempotency_key",
    "storage",
    "fenced",
    "held_after_restart",
    "not_served",
    "write_gated",
    "out_of_range",
    "shutting_down",
    "storage_failed",
    "disk_full",
    "set",
    "copies_unconfirmed",
    "region_too_small",
    "too_few_owners",
];

/// The reasons of `tally_refused_messages_total`, created at zero at start
/// (the replication service, the puller, the copies and the accept loops
/// name them).
pub const REFUSAL_REASONS: &[&str] = &[
    "accept_failed",
    "fold_epoch",
    "foreign_cluster",
    "gossip_forged",
    "gossip_not_sealed",
    "gossip_replayed",
    "gossip_stale",
    "gossip_undecodable",
    "gossip_unknown_key",
    "http_body_timeout",
    "http_body_too_large",
    "impersonation",
    "incompatible_protocol",
    "malformed",
    "no_peer_certificate",
    "not_a_node",
    "not_held",
    "oversized",
    "partition_count",
    "protocol_too_old",
    "region_conflict",
    "set_being_deleted",
    "storage",
    "unknown_replica",
    "unknown_source",
    "unmergeable",
    "wrong_cluster",
    "wrong_copy",
    "wrong_replica",
    "wrong_source",
];

/// The reasons of `tally_auth_refusals_total`, created at zero at start
/// (`security::auth::refusal_reason` names them).
pub const AUTH_REFUSAL_REASONS: &[&str] = &["unauthenticated", "role", "rate_limited"];

/// A label naming an outcome or a reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The reason, a short snake_case word.
    pub reason: String,
}

/// Labels of a count of forwarded requests: the `Counters` method and what
/// came of it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForwardLabels {
    /// `add`, `add_batch`, `get` or `get_batch`.
    pub method: String,
    /// `answered` (the first live owner answered), `failed_over` (a later
    /// owner did) or `served_here` (no owner answered: served locally).
    pub outcome: String,
}

/// Labels of a count of nodes: their region and lifecycle state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeStateLabels {
    /// The nodes' region.
    pub region: String,
    /// `joining`, `active`, `draining` or `left`.
    pub state: String,
}

/// Labels of a count of partitions held: their handoff state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HoldingLabels {
    /// `receiving`, `ready` or `releasing`.
    pub state: String,
}

/// A label naming a region.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RegionLabels {
    /// The region.
    pub region: String,
}

/// A label naming a like-set or uniques operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SetOpLabels {
    /// `like`, `unlike`, `unchanged` (a like or unlike that changed nothing) or `observe`.
    pub op: String,
}

/// Every metric the node exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Adds applied (duplicates excluded).
    pub adds: Counter,
    /// Adds recognised as retries of an applied add.
    pub duplicate_adds: Counter,
    /// Adds refused, by reason.
    pub add_errors: Family<ReasonLabels, Counter>,
    /// Time from receiving an add to answering it.
    pub add_duration: Histogram,
    /// Reads served.
    pub gets: Counter,
    /// Group commits completed.
    pub commits: Counter,
    /// Group commits that failed (and were retried).
    pub commit_errors: Counter,
    /// Counters written per group commit.
    pub commit_batch_counters: Histogram,
    /// Time to write and flush one group commit.
    pub commit_duration: Histogram,
    /// The same times summed, in microseconds: what the status page's chart
    /// of commit latency reads (a histogram's sum cannot be read back). Not
    /// exported: `tally_commit_duration_seconds_sum` is the same number.
    pub commit_micros_total: Counter,
    /// The last durable commit sequence.
    pub durable_seq: Gauge,
    /// Counters held in memory.
    pub cached_counters: Gauge,
    /// Bytes the store takes on disk.
    pub disk_bytes: Gauge,
    /// Counters stored (each listed once in the change log).
    pub counters_stored: Gauge,
    /// Pull rounds completed, per peer.
    pub sync_rounds: Family<PeerLabels, Counter>,
    /// Pulls that failed, per peer.
    pub sync_errors: Family<PeerLabels, Counter>,
    /// Bytes received by pulls, per peer.
    pub sync_received_bytes: Family<PeerLabels, Counter>,
    /// Counters received by pulls, per peer.
    pub sync_received_counters: Family<PeerLabels, Counter>,
    /// Bytes sent to pullers, per puller.
    pub sync_sent_bytes: Family<PeerLabels, Counter>,
    /// Counters sent to pullers, per puller.
    pub sync_sent_counters: Family<PeerLabels, Counter>,
    /// How many sequence numbers our watermark trails a peer's published durable sequence.
    pub sync_lag_seq: Family<PeerLabels, Gauge>,
    /// Seconds since the last completed pull from a peer.
    pub sync_age_seconds: Family<PeerLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Counters changed by merges.
    pub merge_changes: Counter,
    /// Messages refused (wrong cluster, malformed, unknown replica ...), by reason.
    pub refused_messages: Family<ReasonLabels, Counter>,
    /// Live members as membership sees them.
    pub live_members: Gauge,
    /// Client requests refused by authentication or the rate limit, by reason.
    pub auth_refusals: Family<ReasonLabels, Counter>,
    /// TLS handshakes refused (bad or foreign certificates) or timed out.
    pub tls_handshake_failures: Counter,
    /// Operations per second of the hottest keys (top 10 per operation).
    pub hot_key_rate: Family<HotKeyLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Bytes free on the data directory's filesystem (last sample).
    pub disk_free_bytes: Gauge,
    /// The `--min-free-disk` floor in bytes: adds are refused below it.
    pub disk_free_floor_bytes: Gauge,
    /// 1 once the node has given up on its store (fail-stop), else 0.
    pub storage_failed: Gauge,
    /// Idempotency records held.
    pub idempotency_records: Gauge,
    /// The most idempotency records held (`--idempotency-capacity`).
    pub idempotency_capacity: Gauge,
    /// Idempotency records of other nodes of the region that merges brought
    /// (a retry failing over to this node is recognised by them).
    pub idempotency_records_learned: Counter,
    /// HTTP event streams (`/v1/counters/{key}/events`) open now.
    pub http_event_streams: Gauge,
    /// Watches (gRPC or HTTP) this node relays from a key's owner now.
    pub watch_relays: Gauge,
    /// Like-set and uniques operations, by kind.
    pub set_ops: Family<SetOpLabels, Counter>,
    /// Items per `LikeBatch` call (how well clients coalesce their likes).
    pub like_batch_items: Histogram,
    /// Like-set members and uniques registers changed by merges.
    pub set_merge_changes: Counter,
    /// Like sets recounted (`tally admin verify` and the background check).
    pub like_recounts: Counter,
    /// Like sets whose count differed from a recount of their members: a bug.
    pub like_count_mismatches: Counter,
    /// Slots (live writers) per counter, observed for every counter committed.
    pub slots_per_key: Histogram,
    /// The fold epoch this node is done with (`Replica::folds_done`).
    pub folds_done: Gauge,
    /// Retired writers whose fold waits (for a member's report or agreement).
    pub folds_waiting: Gauge,
    /// Writers retired (fenced) as this node knows.
    pub retired_writers: Gauge,
    /// Pushes of this node's own slot to its copies (replicated
    /// durability), by outcome: `confirmed` or `failed`.
    pub copy_pushes: Family<ReasonLabels, Counter>,
    /// Pushes of other nodes of the region that this node took as a copy.
    pub copies_taken: Counter,
    /// Partitions this node owns in its region (from the partition map).
    pub partitions_owned: Gauge,
    /// Partitions this node holds, per handoff state (`receiving`, `ready`,
    /// `releasing`).
    pub partitions_held: Family<HoldingLabels, Gauge>,
    /// Stored counters of partitions no longer kept that the purge deleted
    /// or cut down to this node's own slot.
    pub purged_counters: Counter,
    /// Deletions of like sets and uniques of partitions no longer kept (a
    /// bounded part of a large like set each).
    pub purged_sets: Counter,
    /// Nodes of the cluster as this node sees them, by region and lifecycle state.
    pub nodes: Family<NodeStateLabels, Gauge>,
    /// Partitions per region held up to date by fewer live owners than the
    /// replication factor in effect there.
    pub partitions_under_replicated: Family<RegionLabels, Gauge>,
    /// Requests (a batch: each owner's share) this node forwarded to a
    /// key's owner, by method and outcome.
    pub forwarded_requests: Family<ForwardLabels, Counter>,
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tally");
        let latency = || Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        let metrics = Metrics {
            adds: Counter::default(),
            duplicate_adds: Counter::default(),
            add_errors: Family::default(),
            add_duration: latency(),
            gets: Counter::default(),
            commits: Counter::default(),
            commit_errors: Counter::default(),
            commit_batch_counters: Histogram::new(exponential_buckets(1.0, 2.0, 16)),
            commit_duration: latency(),
            commit_micros_total: Counter::default(),
            durable_seq: Gauge::default(),
            cached_counters: Gauge::default(),
            disk_bytes: Gauge::default(),
            counters_stored: Gauge::default(),
            sync_rounds: Family::default(),
            sync_errors: Family::default(),
            sync_received_bytes: Family::default(),
            sync_received_counters: Family::default(),
            sync_sent_bytes: Family::default(),
            sync_sent_counters: Family::default(),
            sync_lag_seq: Family::default(),
            sync_age_seconds: Family::default(),
            merge_changes: Counter::default(),
            refused_messages: Family::default(),
            live_members: Gauge::default(),
            auth_refusals: Family::default(),
            tls_handshake_failures: Counter::default(),
            hot_key_rate: Family::default(),
            disk_free_bytes: Gauge::default(),
            disk_free_floor_bytes: Gauge::default(),
            storage_failed: Gauge::default(),
            idempotency_records: Gauge::default(),
            idempotency_capacity: Gauge::default(),
            idempotency_records_learned: Counter::default(),
            http_event_streams: Gauge::default(),
            watch_relays: Gauge::default(),
            set_ops: Family::default(),
            like_batch_items: Histogram::new(exponential_buckets(1.0, 2.0, 15)),
            set_merge_changes: Counter::default(),
            like_recounts: Counter::default(),
            like_count_mismatches: Counter::default(),
            slots_per_key: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            folds_done: Gauge::default(),
            folds_waiting: Gauge::default(),
            retired_writers: Gauge::default(),
            copy_pushes: Family::default(),
            copies_taken: Counter::default(),
            partitions_owned: Gauge::default(),
            partitions_held: Family::default(),
            purged_counters: Counter::default(),
            purged_sets: Counter::default(),
            nodes: Family::default(),
            partitions_under_replicated: Family::default(),
            forwarded_requests: Family::default(),
            registry: Registry::default(),
        };
        registry.register("adds", "Adds applied", metrics.adds.clone());
        registry.register(
            "duplicate_adds",
            "Retried adds answered from the idempotency table",
            metrics.duplicate_adds.clone(),
        );
        registry.register(
            "add_errors",
            "Adds refused, by reason",
            metrics.add_errors.clone(),
        );
        registry.register_with_unit(
            "add_duration",
            "Time to answer an add",
            prometheus_client::registry::Unit::Seconds,
            metrics.add_duration.clone(),
        );
        registry.register("gets", "Reads served", metrics.gets.clone());
        registry.register(
            "commits",
            "Group commits completed",
            metrics.commits.clone(),
        );
        registry.register(
            "copy_pushes",
            "Pushes of this node's own slots to its copies (replicated durability), by outcome",
            metrics.copy_pushes.clone(),
        );
        registry.register(
            "copies_taken",
            "Pushes of other nodes of the region taken and made durable as their copy",
            metrics.copies_taken.clone(),
        );
        registry.register(
            "commit_errors",
            "Group commits that failed",
            metrics.commit_errors.clone(),
        );
        registry.register(
            "commit_batch_counters",
            "Counters per group commit",
            metrics.commit_batch_counters.clone(),
        );
        registry.register_with_unit(
            "commit_duration",
            "Time to write and flush a group commit",
            prometheus_client::registry::Unit::Seconds,
            metrics.commit_duration.clone(),
        );
        registry.register(
            "durable_seq",
            "Last durable commit sequence",
            metrics.durable_seq.clone(),
        );
        registry.register(
            "cached_counters",
            "Counters held in memory",
            metrics.cached_counters.clone(),
        );
        registry.register_with_unit(
            "disk",
            "Size of the store on disk",
            prometheus_client::registry::Unit::Bytes,
            metrics.disk_bytes.clone(),
        );
        registry.register(
            "counters_stored",
            "Counters stored here, of every partition held (and, of partitions handed off, those cut down to this node's own slot)",
            metrics.counters_stored.clone(),
        );
        registry.register(
            "sync_rounds",
            "Pulls completed, per peer",
            metrics.sync_rounds.clone(),
        );
        registry.register(
            "sync_errors",
            "Pulls failed, per peer",
            metrics.sync_errors.clone(),
        );
        registry.register_with_unit(
            "sync_received",
            "Bytes received by pulls, per peer",
            prometheus_client::registry::Unit::Bytes,
            metrics.sync_received_bytes.clone(),
        );
        registry.register(
            "sync_received_counters",
            "Counters received by pulls, per peer",
            metrics.sync_received_counters.clone(),
        );
        registry.register_with_unit(
            "sync_sent",
            "Bytes sent to pullers, per puller",
            prometheus_client::registry::Unit::Bytes,
            metrics.sync_sent_bytes.clone(),
        );
        registry.register(
            "sync_sent_counters",
            "Counters sent to pullers, per puller",
            metrics.sync_sent_counters.clone(),
        );
        registry.register(
            "sync_lag_seq",
            "Sequence numbers our watermark trails a peer's durable sequence",
            metrics.sync_lag_seq.clone(),
        );
        registry.register_with_unit(
            "sync_age",
            "Time since the last completed pull from a peer",
            prometheus_client::registry::Unit::Seconds,
            metrics.sync_age_seconds.clone(),
        );
        registry.register(
            "merge_changes",
            "Counters changed by merges",
            metrics.merge_changes.clone(),
        );
        registry.register(
            "idempotency_records_learned",
            "Idempotency records of other nodes of the region learned by merges (a retry that fails over here is recognised by them)",
            metrics.idempotency_records_learned.clone(),
        );
        registry.register(
            "set_ops",
            "Like-set and uniques operations, by kind (unchanged: a like or unlike that changed nothing)",
            metrics.set_ops.clone(),
        );
        registry.register(
            "like_batch_items",
            "Likes and unlikes per LikeBatch call",
            metrics.like_batch_items.clone(),
        );
        registry.register(
            "set_merge_changes",
            "Like-set members and uniques registers changed by merges",
            metrics.set_merge_changes.clone(),
        );
        registry.register(
            "like_recounts",
            "Like sets recounted from their members",
            metrics.like_recounts.clone(),
        );
        registry.register(
            "like_count_mismatches",
            "Like sets whose kept count differed from a recount of their members (a bug: see the error log)",
            metrics.like_count_mismatches.clone(),
        );
        registry.register(
            "refused_messages",
            "Replication messages refused, by reason",
            metrics.refused_messages.clone(),
        );
        registry.register(
            "live_members",
            "Other members that membership sees alive",
            metrics.live_members.clone(),
        );
        registry.register(
            "auth_refusals",
            "Client requests refused by authentication or the rate limit, by reason",
            metrics.auth_refusals.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes refused or timed out",
            metrics.tls_handshake_failures.clone(),
        );
        registry.register(
            "hot_key_rate",
            "Operations per second of the hottest keys (top 10 per operation)",
            metrics.hot_key_rate.clone(),
        );
        registry.register(
            "disk_free_bytes",
            "Bytes free on the data directory's filesystem",
            metrics.disk_free_bytes.clone(),
        );
        registry.register(
            "disk_free_floor_bytes",
            "The --min-free-disk floor in bytes; adds are refused while free bytes are below it",
            metrics.disk_free_floor_bytes.clone(),
        );
        registry.register(
            "storage_failed",
            "1 once the node gave up on its store after failed commits and is stopping",
            metrics.storage_failed.clone(),
        );
        registry.register(
            "idempotency_records",
            "Idempotency records held; at the capacity, the oldest are forgotten before their TTL",
            metrics.idempotency_records.clone(),
        );
        registry.register(
            "idempotency_capacity",
            "The most idempotency records held (--idempotency-capacity)",
            metrics.idempotency_capacity.clone(),
        );
        registry.register(
            "http_event_streams",
            "HTTP server-sent event streams of counters open now",
            metrics.http_event_streams.clone(),
        );
        registry.register(
            "watch_relays",
            "Watches (gRPC or HTTP events) of keys this node relays from their first live owner now",
            metrics.watch_relays.clone(),
        );
        registry.register(
            "slots_per_key",
            "Slots (live writers, folded ones excluded) per counter, observed per counter committed",
            metrics.slots_per_key.clone(),
        );
        registry.register(
            "folds_done",
            "The fold epoch this node is done with: every fold up to it applied to its counters, or no slot of its writers held here",
            metrics.folds_done.clone(),
        );
        registry.register(
            "folds_waiting",
            "Retired writers, and live writers' slots retired in a partition, whose fold waits for a member's report or agreement (see tally status)",
            metrics.folds_waiting.clone(),
        );
        registry.register(
            "retired_writers",
            "Writers (replica ids) retired and fenced, as this node knows",
            metrics.retired_writers.clone(),
        );
        registry.register(
            "partitions_owned",
            "Partitions this node owns in its region, per the partition map (RF owners per partition)",
            metrics.partitions_owned.clone(),
        );
        registry.register(
            "partitions_held",
            "Partitions this node holds, by handoff state: receiving (being copied in, not served), ready (owned and served), releasing (served until every new owner has caught up)",
            metrics.partitions_held.clone(),
        );
        registry.register(
            "purged_counters",
            "Stored counters of partitions handed off (no longer kept here) deleted, or cut down to this node's own slot, by the purge",
            metrics.purged_counters.clone(),
        );
        registry.register(
            "purged_sets",
            "Like sets and uniques of partitions handed off (no longer kept here) deleted by the purge, counted per deletion (a large like set takes several)",
            metrics.purged_sets.clone(),
        );
        registry.register(
            "partitions_under_replicated",
            "Partitions of a region held up to date by fewer live owners than the replication factor in effect there (an owner down, not yet gone, or catching up)",
            metrics.partitions_under_replicated.clone(),
        );
        registry.register(
            "nodes",
            "Nodes of the cluster as this node sees them, by region and lifecycle state",
            metrics.nodes.clone(),
        );
        registry.register(
            "forwarded_requests",
            "Counters and Likes requests (a batch: each owner's share) forwarded to the key's first live owner in the region, by method and outcome",
            metrics.forwarded_requests.clone(),
        );
        metrics.precreate_reasons();
        Metrics {
            registry,
            ..metrics
        }
    }

    /// Creates the reason-labelled series at zero, so that each family
    /// that the dashboard and the alerts read exists from the start (a
    /// family with no series is "no data" in a panel, and `absent()` fires).
    fn precreate_reasons(&self) {
        for (family, reasons) in [
            (&self.add_errors, ADD_ERROR_REASONS),
            (&self.refused_messages, REFUSAL_REASONS),
            (&self.auth_refusals, AUTH_REFUSAL_REASONS),
        ] {
            for reason in reasons {
                let _ = family.get_or_create(&ReasonLabels {
                    reason: (*reason).to_string(),
                });
            }
        }
    }

    /// Creates a peer's sync counters at zero (its rounds, errors and what
    /// it sent): `tally_sync_errors_total` exists for a peer before its
    /// first failure, so a rate over it starts at zero.
    pub fn touch_peer(&self, labels: &PeerLabels) {
        let _ = self.sync_rounds.get_or_create(labels);
        let _ = self.sync_errors.get_or_create(labels);
        let _ = self.sync_received_bytes.get_or_create(labels);
        let _ = self.sync_received_counters.get_or_create(labels);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// The classic Prometheus text format (`text/plain; version=0.0.4`):
    /// the OpenMetrics text with each counter family's `# HELP` and `# TYPE`
    /// named as its samples are (`tally_adds_total`), and without the
    /// OpenMetrics-only `# UNIT` and `# EOF` lines.
    pub fn encode_text(&self) -> String {
        openmetrics_to_text(&self.encode())
    }
    /// Drops every per-peer series of a folded writer (issue 13, pruning):
    /// under its region, and under `unknown` (its region was not known).
    pub fn forget_peer(&self, peer: &str, region: Option<&str>) {
        for region in region.into_iter().chain(["unknown"]) {
            let labels = PeerLabels {
                peer: peer.to_string(),
                region: region.to_string(),
            };
            self.sync_rounds.remove(&labels);
            self.sync_errors.remove(&labels);
            self.sync_received_bytes.remove(&labels);
            self.sync_received_counters.remove(&labels);
            self.sync_sent_bytes.remove(&labels);
            self.sync_sent_counters.remove(&labels);
            self.sync_lag_seq.remove(&labels);
            self.sync_age_seconds.remove(&labels);
        }
    }

    /// Counts a refused message.
    pub fn refused(&self, reason: &str) {
        debug_assert!(
            REFUSAL_REASONS.contains(&reason),
            "refusal reason {reason:?} is missing from REFUSAL_REASONS (created at zero at start)"
        );
        self.refused_messages
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }
}

/// `text` (either format) without the series that carry a counter's key in
/// a label (the hot keys), for an unauthenticated scraper.
pub fn without_key_names(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line.starts_with("tally_hot_key_rate{") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// See [`Metrics::encode_text`].
fn openmetrics_to_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let comment = ["# HELP ", "# TYPE "]
            .into_iter()
            .find(|prefix| line.starts_with(prefix));
        match comment {
            Some(prefix) => {
                let rest = &line[prefix.len()..];
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) && !name.ends_with("_total") {
                    out.push_str(&format!("{prefix}{name}_total {tail}"));
                } else {
                    out.push_str(line);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_names_counter_families_as_their_samples() {
        let metrics = Metrics::new();
        metrics.adds.inc();
        metrics.disk_free_bytes.set(5);
        let text = metrics.encode_text();
        assert!(
            text.contains("# HELP tally_adds_total Adds applied."),
            "{text}"
        );
        assert!(
            text.contains("# TYPE tally_adds_total counter\ntally_adds_total 1\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE tally_disk_free_bytes gauge\n"),
            "{text}"
        );
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
    }

    #[test]
    fn a_refused_peer_window_is_counted_under_a_listed_reason() {
        use crate::replica::version::{ProtocolWindow, NEWEST, OLDEST};
        let behind = ProtocolWindow {
            oldest: 1,
            newest: OLDEST - 1,
        };
        let newer = ProtocolWindow::at(NEWEST + 1, NEWEST + 1);
        let reasons = [behind, newer].map(|theirs| ProtocolWindow::refusal_reason(&theirs));
        assert_eq!(reasons, ["protocol_too_old", "incompatible_protocol"]);
        let metrics = Metrics::new();
        for reason in reasons {
            assert!(REFUSAL_REASONS.contains(&reason), "{reason}");
            metrics.refused(reason);
        }
        let text = metrics.encode_text();
        assert!(
            text.contains("tally_refused_messages_total{reason=\"protocol_too_old\"} 1"),
            "{text}"
        );
    }
}
