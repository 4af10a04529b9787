//! What peers and strangers can do to a node, with real processes: a caller
//! of `Replication` cannot grow the metrics with ids of its choosing.

mod common;

use std::time::Duration;

use common::{http_get, wait_until, Cluster};
use tally_proto::v1::replication_client::ReplicationClient;

/// `sync_sent_*` is labelled with the caller's replica id only when the
/// caller is a member; any other id a caller sends is counted as `unknown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_from_strangers_are_labelled_unknown_in_the_metrics() {
    let cluster = Cluster::spawn(&[("eu", 1), ("us", 1)], "sync").await;
    let endpoints = cluster.endpoints();
    common::load::quick_client(&endpoints[0])
        .await
        .add("k", 3)
        .await
        .unwrap();
    let (eu_http, us_http) = (cluster.nodes[0].spec.http, cluster.nodes[1].spec.http);
    let us_replica = wait_until(Duration::from_secs(20), "us's replica id", || {
        let (_, json) = http_get(us_http, "/status.json").ok()?;
        let json: serde_json::Value = serde_json::from_str(&json).ok()?;
        json["node"]["replica"].as_str().map(str::to_string)
    })
    .0;
    // The member us pulls from eu and is labelled with its replica id.
    let member_label =
        format!("tally_sync_sent_bytes_total{{peer=\"{us_replica}\",region=\"us\"}}");
    wait_until(Duration::from_secs(20), "eu's metrics name us", || {
        let (_, metrics) = http_get(eu_http, "/metrics").ok()?;
        metrics.contains(&member_label).then_some(())
    });

    let mut replication = ReplicationClient::connect(endpoints[0].clone())
        .await
        .unwrap();
    let strangers: Vec<u64> = (1..=50).map(|i| 0x5eed_0000_0000_0000 + i).collect();
    for caller in &strangers {
        let mut stream = replication
            .pull(tally_proto::v1::PullRequest {
                cluster_id: "test-cluster".into(),
                caller_replica: *caller,
                max_bytes: 1 << 20,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        while stream.message().await.unwrap().is_some() {}
    }
    let (_, metrics) = http_get(eu_http, "/metrics").unwrap();
    for caller in &strangers {
        assert!(
            !metrics.contains(&format!("{caller:016x}")),
            "a stranger's id {caller:016x} is a label: {metrics}"
        );
    }
    assert!(
        metrics.contains("tally_sync_sent_bytes_total{peer=\"unknown\",region=\"unknown\"}"),
        "{metrics}"
    );
    assert!(metrics.contains(&member_label), "{metrics}");
}
