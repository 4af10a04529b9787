//! Partitioned regions in the CLI: `tally admin drain NODE`, `tally admin
//! remove NODE`, and the partition summary that `tally status` prints
//! (partitions owned per node, the replication factor, nodes by state).

use std::collections::BTreeMap;

use tally_client::PartitionMap;

use super::output::{print_json, print_line, render_table, Align};
use super::Target;

/// `tally admin drain NODE`.
pub async fn drain(target: &Target, node: &str, json: bool) -> anyhow::Result<()> {
    let client = target.connect().await?;
    let newly = client.drain(node).await?;
    if json {
        return print_json(&serde_json::json!({ "node": node, "newly_draining": newly }));
    }
    if newly {
        print_line(format_args!(
            "node {node} is draining: it owns no partition from now on, and the other nodes \
             of its region take them over (see tally status)"
        ))?;
    } else {
        print_line(format_args!("node {node} was draining already"))?;
    }
    Ok(())
}

/// `tally admin remove NODE`.
pub async fn remove(target: &Target, node: &str, json: bool) -> anyhow::Result<()> {
    let client = target.connect().await?;
    let removed = client.remove(node).await?;
    let replicas: Vec<String> = removed.iter().map(|id| format!("{id:016x}")).collect();
    if json {
        return print_json(&serde_json::json!({ "node": node, "removed": replicas }));
    }
    if replicas.is_empty() {
        print_line(format_args!("node {node}: nothing newly removed"))?;
    } else {
        print_line(format_args!(
            "node {node} removed (replica {}): it has left the cluster, and the other nodes of \
             its region own its partitions from now on",
            replicas.join(", ")
        ))?;
    }
    Ok(())
}

/// The lines `tally status` prints about a region's partitions.
pub fn summary(map: &PartitionMap) -> String {
    let mut out = format!(
        "partitions in region {} (as {} computes them): {} partitions, replication factor {} \
         ({} in effect)\n",
        map.region,
        map.answered_by,
        map.partitions,
        map.replication_factor,
        map.effective_replication
    );
    let rows: Vec<Vec<String>> = map
        .nodes
        .iter()
        .map(|node| {
            vec![
                node.node_name.clone(),
                node.state.clone(),
                match (node.alive, node.gone) {
                    (true, _) => "yes",
                    (false, false) => "no",
                    (false, true) => "gone",
                }
                .to_owned(),
                node.partitions_owned.to_string(),
                node.partitions_held.to_string(),
                node.partitions_releasing.to_string(),
                node.counters_stored
                    .map_or_else(|| "?".to_owned(), |counters| counters.to_string()),
            ]
        })
        .collect();
    out.push_str(&render_table(
        &[
            ("NODE", Align::Left),
            ("STATE", Align::Left),
            ("ALIVE", Align::Left),
            ("OWNS", Align::Right),
            ("HOLDS", Align::Right),
            ("RELEASING", Align::Right),
            ("COUNTERS", Align::Right),
        ],
        &rows,
    ));
    let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
    for node in &map.nodes {
        *by_state.entry(node.state.as_str()).or_default() += 1;
    }
    let states: Vec<String> = by_state
        .iter()
        .map(|(state, count)| format!("{count} {state}"))
        .collect();
    out.push_str(&format!("nodes by state: {}\n", states.join(", ")));
    out.push_str(&format!(
        "under-replicated partitions: {} of {} (held by fewer than {} live owners)",
        map.under_replicated, map.partitions, map.effective_replication
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_client::PartitionNode;

    fn node(name: &str, state: &str, alive: bool, gone: bool, owned: u32) -> PartitionNode {
        PartitionNode {
            node_name: name.into(),
            region: "eu".into(),
            replica: 1,
            grpc_addr: "127.0.0.1:1".into(),
            state: state.into(),
            alive,
            gone,
            partitions_owned: owned,
            partitions_held: owned,
            partitions_releasing: 0,
            counters_stored: Some(u64::from(owned) * 10),
        }
    }

    #[test]
    fn the_summary_shows_owned_partitions_per_node_rf_and_nodes_by_state() {
        let map = PartitionMap {
            partitions: 4,
            replication_factor: 3,
            effective_replication: 2,
            region: "eu".into(),
            nodes: vec![
                node("a", "active", true, false, 4),
                PartitionNode {
                    partitions_held: 3,
                    partitions_releasing: 3,
                    ..node("b", "draining", true, false, 0)
                },
                PartitionNode {
                    counters_stored: None,
                    ..node("c", "active", false, true, 0)
                },
                node("d", "active", true, false, 4),
            ],
            owners: vec![vec![0, 3]; 4],
            answered_by: "a".into(),
            under_replicated: 1,
        };
        let text = summary(&map);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "partitions in region eu (as a computes them): 4 partitions, replication factor 3 (2 in effect)"
        );
        let row = |name: &str| -> Vec<&str> {
            lines
                .iter()
                .find(|line| line.starts_with(name))
                .unwrap()
                .split_whitespace()
                .collect()
        };
        assert_eq!(
            row("NODE "),
            [
                "NODE",
                "STATE",
                "ALIVE",
                "OWNS",
                "HOLDS",
                "RELEASING",
                "COUNTERS"
            ]
        );
        assert_eq!(row("b "), ["b", "draining", "yes", "0", "3", "3", "0"]);
        assert_eq!(row("c "), ["c", "active", "gone", "0", "0", "0", "?"]);
        assert_eq!(row("d "), ["d", "active", "yes", "4", "4", "0", "40"]);
        assert_eq!(
            lines[lines.len() - 2],
            "nodes by state: 3 active, 1 draining"
        );
        assert_eq!(
            *lines.last().unwrap(),
            "under-replicated partitions: 1 of 4 (held by fewer than 2 live owners)"
        );
        assert_eq!(map.owners_of(2), ["a", "d"]);
        assert!(map.owners_of(9).is_empty());
    }
}
