//! The status page (`/status`): one self-contained HTML page, rendered on the
//! server with no script and no build step, refreshing itself every two
//! seconds: charts of the node's last two minutes (adds per second,
//! replication lag per peer, commit latency; inline SVG drawn here by
//! [`super::charts`]), the members with their region, liveness, last sync
//! and sequence lag, whether their digests agree, the protocol versions each
//! speaks (and which are refused), the cluster version, problems to act on (a
//! node name held by two live replicas), and this node's hottest keys. The
//! same facts as JSON at `/status.json` (the charts' samples under `charts`).
//!
//! Keys are user input: everything shown is HTML-escaped.

use std::fmt::Write;

use tally_proto::v1 as pb;

use super::charts::{self, Sample};

/// Escapes text for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

fn age(ms: Option<u64>) -> String {
    match ms {
        None => "never".into(),
        Some(ms) if ms < 1000 => format!("{ms} ms"),
        Some(ms) if ms < 120_000 => format!("{:.1} s", ms as f64 / 1000.0),
        Some(ms) => format!("{} min", ms / 60_000),
    }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2rem;color:#1d2433;background:#f7f8fa}\
h1{font-size:1.4rem;margin:0 0 .2rem}h2{font-size:1.1rem;margin:1.6rem 0 .5rem}\
.sub{color:#5b6475;margin-bottom:1rem}table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0002}\
th,td{padding:.35rem .8rem;text-align:left;border-bottom:1px solid #e3e6ec;font-variant-numeric:tabular-nums}\
th{background:#eef1f5;font-weight:600}.ok{color:#127a3a;font-weight:600}.bad{color:#b3261e;font-weight:600}\
.badge{display:inline-block;padding:.2rem .6rem;border-radius:1rem;color:#fff}.badge.ok{background:#127a3a}\
.badge.bad{background:#b3261e}code{font-size:.9em}";

/// The problems an operator must act on: node names held by more than one
/// live replica (each is replicated, but `tally status` readers and the
/// partition owners tell nodes apart by name).
pub fn problems(status: &pb::StatusResponse) -> Vec<String> {
    let mut by_name: std::collections::BTreeMap<&str, Vec<u64>> = Default::default();
    for member in status.self_.iter().chain(&status.members) {
        if member.alive {
            by_name
                .entry(&member.node_name)
                .or_default()
                .push(member.replica);
        }
    }
    by_name
        .into_iter()
        .filter(|(_, replicas)| replicas.len() > 1)
        .map(|(name, replicas)| {
            let replicas: Vec<String> = replicas.iter().map(|r| format!("{r:016x}")).collect();
            format!(
                "node name {name} is used by {} live replicas ({}): node names must be unique; \
                 stop one of them or restart it with another --node-name",
                replicas.len(),
                replicas.join(", ")
            )
        })
        .collect()
}

/// Renders the page from a status and, when known, the partition map of
/// the node's region.
pub fn render(
    status: &pb::StatusResponse,
    map: Option<&pb::PartitionMapResponse>,
    samples: &[Sample],
) -> String {
    let own = status.self_.clone().unwrap_or_default();
    let mut html = String::with_capacity(8 * 1024);
    let _ = write!(
        html,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"2\">\
         <title>Tally · {node}</title><style>{STYLE}{chart_style}</style></head><body>\
         <h1>Tally · {node} <span class=\"sub\">({region})</span></h1>\
         <div class=\"sub\">cluster <code>{cluster}</code> · {partitions} partitions · cluster version {version} · replica <code>{replica:016x}</code> · durable sequence {seq} · digest <code>{digest:016x}</code></div>",
        node = escape(&own.node_name),
        region = escape(&own.region),
        cluster = escape(&status.cluster_id),
        version = status.cluster_version,
        partitions = status.partitions,
        replica = own.replica,
        seq = own.durable_seq,
        digest = own.digest,
        chart_style = charts::STYLE,
    );
    let live = status.members.iter().filter(|m| m.alive).count() + 1;
    let _ = write!(
        html,
        "<p>{}</p>",
        match (status.converged, status.convergence.is_empty()) {
            (true, true) => format!("<span class=\"badge ok\">converged</span> all {live} live members hold the same digest"),
            (false, true) => format!("<span class=\"badge bad\">not converged</span> the {live} live members hold different digests (normal while adds are flowing)"),
            (true, false) => format!("<span class=\"badge ok\">converged</span> {}", escape(&status.convergence)),
            (false, false) => format!("<span class=\"badge bad\">not converged</span> {} (normal while adds are flowing)", escape(&status.convergence)),
        }
    );
    for problem in problems(status) {
        let _ = write!(
            html,
            "<p><span class=\"badge bad\">problem</span> {}</p>",
            escape(&problem)
        );
    }
    charts::render(&mut html, samples);
    html.push_str(
        "<h2>Members</h2><table><tr><th>region</th><th>node</th><th>replica</th><th>gRPC address</th>\
         <th>alive</th><th>last sync</th><th>sequence lag</th><th>digest</th><th>protocol</th></tr>",
    );
    let row = |html: &mut String, member: &pb::Member, is_self: bool| {
        let same = crate::api::admin::same_state(member, &own);
        let sets = member.sets_digest.map_or(String::new(), |sets| {
            format!(" · sets <code>{sets:016x}</code>")
        });
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}{}</td><td><code>{:016x}</code></td><td>{}</td><td class=\"{}\">{}</td>\
             <td>{}</td><td>{}</td><td class=\"{}\"><code>{:016x}</code>{}</td><td class=\"{}\">{}..={}{}</td></tr>",
            escape(&member.region),
            escape(&member.node_name),
            if is_self { " (this node)" } else { "" },
            member.replica,
            escape(&member.grpc_addr),
            if member.alive { "ok" } else { "bad" },
            if member.alive { "alive" } else { "down" },
            if is_self { "—".to_string() } else { age(member.since_last_sync_ms) },
            member.seq_lag,
            if same { "ok" } else { "bad" },
            member.digest,
            sets,
            if member.refused { "bad" } else { "ok" },
            member.protocol_oldest,
            member.protocol_version,
            if member.refused { " refused" } else { "" },
        );
    };
    row(&mut html, &own, true);
    for member in &status.members {
        row(&mut html, member, false);
    }
    html.push_str("</table>");
    if let Some(map) = map {
        partition_section(&mut html, map);
    }
    html.push_str("<h2>Hottest keys on this node</h2>");
    if status.hot_keys.is_empty() {
        html.push_str("<p class=\"sub\">No traffic yet.</p>");
    } else {
        html.push_str("<table><tr><th>operation</th><th>key</th><th>per second</th><th>in the window</th></tr>");
        for hot in &status.hot_keys {
            let _ = write!(
                html,
                "<tr><td>{}</td><td><code>{}</code></td><td>{:.1}</td><td>{}</td></tr>",
                escape(&hot.op),
                escape(&String::from_utf8_lossy(&hot.key)),
                hot.rate_per_sec,
                hot.count
            );
        }
        html.push_str("</table>");
    }
    html.push_str("<p class=\"sub\">Refreshes every 2 s · <a href=\"/metrics\">/metrics</a> · <a href=\"/status.json\">/status.json</a></p></body></html>");
    html
}

/// The partition map of the region: RF, under-replicated partitions, and
/// each node's state and partitions owned.
fn partition_section(html: &mut String, map: &pb::PartitionMapResponse) {
    let _ = write!(
        html,
        "<h2>Partitions of region {region}</h2><p>{partitions} partitions · replication factor {rf} \
         (in effect {effective}) · {badge}</p><table><tr><th>node</th><th>state</th><th>alive</th>\
         <th>partitions owned</th><th>held</th><th>releasing</th><th>counters</th></tr>",
        region = escape(&map.region),
        partitions = map.partitions,
        rf = map.replication_factor,
        effective = map.effective_replication,
        badge = if map.under_replicated == 0 {
            "<span class=\"badge ok\">fully replicated</span>".to_string()
        } else {
            format!(
                "<span class=\"badge bad\">{} under-replicated</span> held by fewer live owners than the factor in effect",
                map.under_replicated
            )
        },
    );
    for node in &map.nodes {
        let (class, liveness) = match (node.alive, node.gone) {
            (true, _) => ("ok", "alive"),
            (false, false) => ("bad", "down"),
            (false, true) => ("bad", "gone (past --dead-after)"),
        };
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td class=\"{class}\">{liveness}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&node.node_name),
            escape(&node.state),
            node.partitions_owned,
            node.partitions_held,
            node.partitions_releasing,
            node.counters_stored
                .map_or_else(|| "?".to_string(), |counters| counters.to_string()),
        );
    }
    html.push_str("</table>");
}

/// The partition map's summary as JSON (the per-partition owners are left
/// out: `tally status --json` has them).
fn partition_json(map: &pb::PartitionMapResponse) -> serde_json::Value {
    serde_json::json!({
        "region": map.region,
        "partitions": map.partitions,
        "replication_factor": map.replication_factor,
        "effective_replication": map.effective_replication,
        "under_replicated": map.under_replicated,
        "nodes": map.nodes.iter().map(|node| serde_json::json!({
            "node_name": node.node_name, "state": node.state, "alive": node.alive,
            "gone": node.gone, "partitions_owned": node.partitions_owned,
            "partitions_held": node.partitions_held,
            "partitions_releasing": node.partitions_releasing,
            "counters_stored": node.counters_stored,
        })).collect::<Vec<_>>(),
    })
}

/// The same facts as JSON.
pub fn to_json(
    status: &pb::StatusResponse,
    map: Option<&pb::PartitionMapResponse>,
    samples: &[Sample],
) -> serde_json::Value {
    let member = |m: &pb::Member| {
        serde_json::json!({
            "region": m.region, "node_name": m.node_name, "replica": format!("{:016x}", m.replica),
            "grpc_addr": m.grpc_addr, "gossip_addr": m.gossip_addr, "alive": m.alive,
            "digest": format!("{:016x}", m.digest),
            "sets_digest": m.sets_digest.map(|sets| format!("{sets:016x}")),
            "durable_seq": m.durable_seq,
            "since_last_sync_ms": m.since_last_sync_ms, "seq_lag": m.seq_lag,
            "protocol_version": m.protocol_version, "protocol_oldest": m.protocol_oldest,
            "refused": m.refused, "partitions": m.partitions, "born_at": m.born_at,
        })
    };
    serde_json::json!({
        "cluster_id": status.cluster_id,
        "node": status.self_.as_ref().map(member),
        "members": status.members.iter().map(member).collect::<Vec<_>>(),
        "converged": status.converged,
        "convergence": status.convergence,
        "cluster_version": status.cluster_version,
        "partitions": status.partitions,
        "partition_map": map.map(partition_json),
        "problems": problems(status),
        "charts": charts::to_json(samples),
        "hot_keys": status.hot_keys.iter().map(|h| serde_json::json!({
            "key": String::from_utf8_lossy(&h.key), "op": h.op, "rate_per_sec": h.rate_per_sec, "count": h.count,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_escaped_and_members_shown() {
        let status = pb::StatusResponse {
            self_: Some(pb::Member {
                region: "eu".into(),
                node_name: "eu-1".into(),
                alive: true,
                ..Default::default()
            }),
            members: vec![pb::Member {
                region: "us".into(),
                node_name: "us-1".into(),
                alive: false,
                protocol_version: 1,
                protocol_oldest: 1,
                refused: true,
                ..Default::default()
            }],
            cluster_version: 2,
            partitions: 64,
            converged: false,
            cluster_id: "c".into(),
            retired: Vec::new(),
            retired_partitions: Vec::new(),
            folds_applied: 0,
            convergence: String::new(),
            hot_keys: vec![pb::HotKey {
                key: b"<script>x</script>".to_vec().into(),
                op: "add".into(),
                rate_per_sec: 5.0,
                count: 50,
            }],
        };
        let html = render(&status, None, &[]);
        assert!(html.contains("&lt;script&gt;x&lt;/script&gt;"));
        assert!(!html.contains("<script>"));
        assert!(html.contains("us-1") && html.contains("down") && html.contains("not converged"));
        assert!(html.contains("cluster version 2") && html.contains("1..=1 refused"));
        assert!(html.contains("64 partitions"));
        let json = to_json(&status, None, &[]);
        assert_eq!(json["partitions"], 64);
        assert_eq!(json["members"][0]["refused"], true);
        assert_eq!(json["hot_keys"][0]["key"], "<script>x</script>");
        assert!(json["partition_map"].is_null());
        assert!(problems(&status).is_empty());
    }

    #[test]
    fn a_name_held_by_two_live_replicas_is_a_problem() {
        let member = |name: &str, replica: u64, alive: bool| pb::Member {
            node_name: name.into(),
            replica,
            alive,
            ..Default::default()
        };
        let mut status = pb::StatusResponse {
            self_: Some(member("eu-1", 1, true)),
            members: vec![member("eu-1", 2, true), member("us-1", 3, true)],
            ..Default::default()
        };
        let found = problems(&status);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("eu-1") && found[0].contains("0000000000000002"));
        assert!(render(&status, None, &[]).contains("badge bad\">problem"));
        assert_eq!(to_json(&status, None, &[])["problems"][0], found[0]);
        status.members[0].alive = false;
        assert!(
            problems(&status).is_empty(),
            "a holder that left is no problem"
        );
    }

    #[test]
    fn the_region_s_partition_map_is_shown() {
        let node = |name: &str, alive: bool, gone: bool, owned: u32| pb::PartitionNode {
            node_name: name.into(),
            region: "eu".into(),
            state: "active".into(),
            alive,
            gone,
            partitions_owned: owned,
            ..Default::default()
        };
        let mut map = pb::PartitionMapResponse {
            partitions: 16,
            replication_factor: 3,
            effective_replication: 2,
            region: "eu".into(),
            nodes: vec![
                node("eu-1", true, false, 11),
                node("eu-<2>", false, false, 10),
            ],
            under_replicated: 10,
            ..Default::default()
        };
        let status = pb::StatusResponse::default();
        let html = render(&status, Some(&map), &[]);
        assert!(html.contains("Partitions of region eu"), "{html}");
        assert!(html.contains("replication factor 3 (in effect 2)"));
        assert!(html.contains("10 under-replicated"));
        assert!(html.contains("eu-&lt;2&gt;") && html.contains(">down<"));
        assert!(html.contains("<td>11</td>"));
        let json = to_json(&status, Some(&map), &[]);
        assert_eq!(json["partition_map"]["under_replicated"], 10);
        assert_eq!(json["partition_map"]["nodes"][1]["partitions_owned"], 10);
        map.under_replicated = 0;
        map.nodes[1].gone = true;
        let html = render(&status, Some(&map), &[]);
        assert!(html.contains("fully replicated") && html.contains("gone (past --dead-after)"));
    }
}
