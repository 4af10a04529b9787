//! Observability with real processes: the status page and its JSON (with
//! its charts' samples of adds, commit latency and lag), hot keys
//! in metrics and in `Admin.Status`, gRPC server reflection (what `grpcurl`
//! uses, v1 and v1alpha) and the gRPC health service for every service, and
//! JSON logs.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::load::quick_client;
use common::{http_get, wait_until, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_members_convergence_and_hot_keys() {
    let cluster = Cluster::spawn(&[("eu", 1), ("us", 1)], "sync").await;
    let eu = quick_client(&cluster.endpoints()[0]).await;
    for _ in 0..200 {
        eu.add("post:<b>hot</b>:likes", 1).await.unwrap();
    }
    for i in 0..20 {
        eu.add(&format!("post:{i}:likes"), 1).await.unwrap();
        eu.get("post:7:views").await.unwrap();
    }
    let http = cluster.nodes[0].spec.http;
    let page = wait_until(Duration::from_secs(20), "a converged status page", || {
        let (code, page) = http_get(http, "/status").ok()?;
        // The convergence badge (the partition map has a badge of its own).
        (code == 200 && page.contains("badge ok\">converged")).then_some(page)
    })
    .0;
    assert!(
        page.contains("<!doctype html>") && page.contains("http-equiv=\"refresh\""),
        "{page}"
    );
    assert!(
        page.contains("eu-1") && page.contains("us-1") && page.contains("alive"),
        "{page}"
    );
    assert!(
        page.contains("post:&lt;b&gt;hot&lt;/b&gt;:likes"),
        "the hot key is listed, escaped: {page}"
    );
    assert!(!page.contains("<b>hot</b>"));

    let (code, json) = http_get(http, "/status.json").unwrap();
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["members"][0]["region"], "us");
    assert_eq!(json["hot_keys"][0]["key"], "post:<b>hot</b>:likes");
    assert_eq!(json["hot_keys"][0]["op"], "add");
    assert!(json["hot_keys"]
        .as_array()
        .unwrap()
        .iter()
        .any(|h| h["op"] == "get" && h["key"] == "post:7:views"));

    // The charts' samples: the adds above, a commit's latency, and the
    // peer's replication lag, each sampled from the node's own numbers.
    let charts = wait_until(Duration::from_secs(20), "charts with the adds", || {
        let (_, json) = http_get(http, "/status.json").ok()?;
        let json: serde_json::Value = serde_json::from_str(&json).ok()?;
        let samples = json["charts"]["samples"].as_array()?.clone();
        let adds = samples
            .iter()
            .any(|s| s["adds_per_sec"].as_f64() > Some(0.0));
        let commits = samples.iter().any(|s| s["commit_ms"].as_f64() > Some(0.0));
        let lag = samples.iter().any(|s| {
            s["lag"].as_array().is_some_and(|peers| {
                peers.iter().any(|peer| {
                    peer["node"] == "us-1"
                        && peer["region"] == "us"
                        && peer["since_last_sync_ms"].is_u64()
                        && peer["seq_lag"].is_u64()
                })
            })
        });
        (adds && commits && lag).then_some(json["charts"].clone())
    })
    .0;
    assert_eq!(charts["interval_ms"], 1000, "{charts}");
    let page = http_get(http, "/status").unwrap().1;
    for chart in ["chart-adds", "chart-lag", "chart-commit"] {
        assert!(
            page.contains(&format!("<svg id=\"{chart}\"")),
            "{chart} missing: {page}"
        );
    }
    assert!(
        page.contains("data-series=\"us-1 (us)\""),
        "a lag line for the peer: {page}"
    );

    let wanted = "tally_hot_key_rate{op=\"add\",key=\"post:<b>hot</b>:likes\"}";
    let metrics = wait_until(Duration::from_secs(5), "the hot key in /metrics", || {
        let (_, metrics) = http_get(http, "/metrics").ok()?;
        metrics.contains(wanted).then_some(metrics)
    })
    .0;
    for name in [
        "tally_adds_total 220",
        "tally_add_duration_seconds_bucket",
        "tally_commit_batch_counters",
        "tally_sync_rounds_total",
    ] {
        assert!(metrics.contains(name), "{name} missing from {metrics}");
    }

    let status = eu.status().await.unwrap();
    assert!(status.converged);
    let expected: BTreeMap<String, i64> = [("post:<b>hot</b>:likes".to_string(), 200)].into();
    let us = quick_client(&cluster.endpoints()[1]).await;
    assert_eq!(
        us.get("post:<b>hot</b>:likes").await.unwrap(),
        expected["post:<b>hot</b>:likes"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_and_health_answer_and_logs_can_be_json() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let root = tempfile::tempdir().unwrap();
    let mut spec = common::NodeSpec::new(root.path(), "eu", "eu-1");
    spec.extra = vec!["--log-format".into(), "json".into()];
    let node = tokio::task::spawn_blocking(move || common::NodeProcess::start(spec))
        .await
        .unwrap();
    // /readyz can answer a moment before the start line is written.
    let started = wait_until(Duration::from_secs(10), "a start line", || {
        node.log_text()
            .lines()
            .find(|line| line.contains("tally-node started"))
            .map(str::to_string)
    })
    .0;
    let line: serde_json::Value = serde_json::from_str(&started).expect("JSON log lines");
    assert_eq!(line["fields"]["region"], "eu", "{line}");

    let channel = tonic::transport::Channel::from_shared(node.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut reflection = ServerReflectionClient::new(channel.clone());
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(futures::stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection answer: {response:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for service in [
        "tally.v1.Counters",
        "tally.v1.Replication",
        "tally.v1.Admin",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == service),
            "{service} not in {names:?}"
        );
    }

    // The container healthcheck: `tally-node healthcheck` asks /readyz.
    let probe = |addr: String| {
        std::process::Command::new(common::node_binary())
            .args(["healthcheck", "--http-addr", &addr])
            .status()
            .unwrap()
            .success()
    };
    assert!(probe(node.spec.http.to_string()));
    assert!(!probe("127.0.0.1:1".to_string()));

    // The Python reflection client (grpcio-reflection) speaks only v1alpha.
    let names = list_services_v1alpha(channel.clone()).await;
    for service in [
        "tally.v1.Counters",
        "tally.v1.Replication",
        "tally.v1.Admin",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ] {
        assert!(
            names.iter().any(|n| n == service),
            "{service} not in the v1alpha list {names:?}"
        );
    }

    // Every service served answers SERVING, the overall status ("") too.
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in std::iter::once("").chain(names.iter().map(String::as_str)) {
        let request = tonic_health::pb::HealthCheckRequest {
            service: service.into(),
        };
        let status = match health.check(request).await {
            Ok(answer) => answer.into_inner().status,
            Err(status) => panic!("health of {service:?}: {status:?}"),
        };
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "health of {service:?}"
        );
    }
}

/// The services a v1alpha reflection client sees.
async fn list_services_v1alpha(channel: tonic::transport::Channel) -> Vec<String> {
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;

    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = ServerReflectionClient::new(channel)
        .server_reflection_info(futures::stream::iter([request]))
        .await
        .expect("v1alpha reflection answers")
        .into_inner();
    let response = responses.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected v1alpha reflection answer: {response:?}");
    };
    list.service.into_iter().map(|s| s.name).collect()
}
