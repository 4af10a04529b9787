//! Security with real processes: bearer tokens (`UNAUTHENTICATED`), the
//! per-token rate limit (`RESOURCE_EXHAUSTED` with a retry hint), TLS on the
//! gRPC port, mutual TLS between nodes (a peer with a certificate from another
//! CA is refused and logged, and nothing of its data crosses), `--secure`, and
//! the warning of a node started without security. Certificates are made here
//! with rcgen.

mod common;

use std::path::Path;
use std::time::Duration;

use common::certs::Ca;
use common::{http_get, wait_until, NodeProcess, NodeSpec};
use tally_proto::v1::counters_client::CountersClient;
use tally_proto::v1::{AddRequest, GetRequest};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const TOKEN: &str = "s3cret-token-0123456789";

fn secure_spec(root: &Path, region: &str, name: &str, ca: &Ca, extra: &[&str]) -> NodeSpec {
    common::certs::secure_spec(root, region, name, ca, &format!("web {TOKEN}\n"), extra)
}

fn ca_pem(node: &NodeProcess) -> Vec<u8> {
    let dir = node
        .spec
        .data_dir
        .with_file_name(format!("{}-tls", node.spec.node_name));
    std::fs::read(dir.join("ca.pem")).unwrap()
}

async fn tls_channel(node: &NodeProcess, identity: Option<Identity>) -> Channel {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem(node)));
    if let Some(identity) = identity {
        tls = tls.identity(identity);
    }
    Channel::from_shared(format!("https://{}", node.spec.grpc))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    request
}

fn add(key: &str, delta: i64) -> AddRequest {
    AddRequest {
        key: key.as_bytes().to_vec().into(),
        delta,
        idempotency_key: String::new(),
        ..Default::default()
    }
}

async fn get(client: &mut CountersClient<Channel>, key: &str) -> i64 {
    let request = GetRequest {
        key: key.as_bytes().to_vec().into(),
        ..Default::default()
    };
    client
        .get(with_token(request, Some(TOKEN)))
        .await
        .unwrap()
        .into_inner()
        .value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_the_rate_limit_guard_the_client_api() {
    let root = tempfile::tempdir().unwrap();
    let ca = Ca::new("tally test CA");
    let spec = secure_spec(
        root.path(),
        "eu",
        "eu-1",
        &ca,
        &["--rate-limit", "5", "--rate-burst", "5"],
    );
    let node = NodeProcess::start_async(spec).await;
    let mut client = CountersClient::new(tls_channel(&node, None).await);

    let missing = client.add(with_token(add("k", 1), None)).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::Unauthenticated, "{missing:?}");
    let wrong = client
        .add(with_token(add("k", 1), Some("not-the-token-at-all")))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated, "{wrong:?}");

    let mut accepted = 0;
    let mut limited = None;
    // Back-to-back adds exceed a rate of 5/s (burst 5) long before 100 of
    // them, unless each took over 200 ms, the time one token takes to refill.
    for _ in 0..100 {
        match client.add(with_token(add("k", 1), Some(TOKEN))).await {
            Ok(_) => accepted += 1,
            Err(status) => {
                limited = Some(status);
                break;
            }
        }
    }
    let limited = limited.expect("100 adds at once must pass a rate of 5/s with a burst of 5");
    assert_eq!(
        limited.code(),
        tonic::Code::ResourceExhausted,
        "{limited:?}"
    );
    assert!(
        limited.message().contains("retry after"),
        "{}",
        limited.message()
    );
    assert!(limited.metadata().get("retry-after-ms").is_some());
    assert!(accepted >= 5, "the burst is allowed: {accepted}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        get(&mut client, "k").await,
        accepted,
        "refused adds changed nothing"
    );

    // Health checks need no token.
    let mut health =
        tonic_health::pb::health_client::HealthClient::new(tls_channel(&node, None).await);
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(
        serving.into_inner().status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    // Plain text is not spoken on a TLS port.
    let plain = Channel::from_shared(format!("http://{}", node.spec.grpc))
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = plain {
        assert!(CountersClient::new(channel)
            .add(with_token(add("k", 1), Some(TOKEN)))
            .await
            .is_err());
    }
    let (_, metrics) = http_get(node.spec.http, "/metrics").unwrap();
    assert!(
        metrics.contains("tally_auth_refusals_total{reason=\"unauthenticated\"} 2"),
        "{metrics}"
    );
    // (The series exists at zero from the start: the count must have moved.)
    let rate_limited = metrics
        .lines()
        .find_map(|line| line.strip_prefix("tally_auth_refusals_total{reason=\"rate_limited\"} "))
        .and_then(|value| value.trim().parse::<f64>().ok());
    assert!(rate_limited.is_some_and(|count| count > 0.0), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_authenticate_each_other_and_a_foreign_ca_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let ca = Ca::new("cluster CA");
    let other = Ca::new("another CA");
    let first = secure_spec(root.path(), "eu", "eu-1", &ca, &[]);
    let mut second = secure_spec(root.path(), "us", "us-1", &ca, &[]);
    let mut intruder = secure_spec(root.path(), "ap", "ap-1", &other, &[]);
    second.seeds = vec![first.gossip];
    intruder.seeds = vec![first.gossip];
    let (eu, us, ap) = tokio::task::spawn_blocking(move || {
        (
            NodeProcess::start(first),
            NodeProcess::start(second),
            NodeProcess::start(intruder),
        )
    })
    .await
    .unwrap();

    let mut eu_client = CountersClient::new(tls_channel(&eu, None).await);
    let mut us_client = CountersClient::new(tls_channel(&us, None).await);
    let mut ap_client = CountersClient::new(tls_channel(&ap, None).await);
    eu_client
        .add(with_token(add("likes", 7), Some(TOKEN)))
        .await
        .unwrap();
    ap_client
        .add(with_token(add("likes", 1000), Some(TOKEN)))
        .await
        .unwrap();
    // The two nodes of the cluster CA converge over mutual TLS.
    let mut seen = 0;
    for _ in 0..200 {
        seen = get(&mut us_client, "likes").await;
        if seen == 7 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, 7, "us never got eu's adds over mutual TLS");
    // The intruder's handshakes are refused and logged; nothing crosses either way.
    let eu_ref = &eu;
    wait_until(
        Duration::from_secs(20),
        "a refused TLS handshake in eu's log",
        || {
            eu_ref
                .log_text()
                .contains("TLS handshake refused")
                .then_some(())
        },
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(get(&mut eu_client, "likes").await, 7);
    assert_eq!(get(&mut us_client, "likes").await, 7);
    assert_eq!(get(&mut ap_client, "likes").await, 1000);
    let (_, metrics) = http_get(eu.spec.http, "/metrics").unwrap();
    assert!(
        !metrics.contains("tally_tls_handshake_failures_total 0"),
        "{metrics}"
    );

    // Pulling without a node certificate is refused even with a valid TLS session.
    let mut replication =
        tally_proto::v1::replication_client::ReplicationClient::new(tls_channel(&eu, None).await);
    let refused = replication
        .pull(tally_proto::v1::PullRequest {
            cluster_id: "test-cluster".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    assert!(
        refused.message().contains("mutual TLS"),
        "{}",
        refused.message()
    );
}

#[test]
fn secure_refuses_to_start_without_its_material_and_plain_nodes_warn() {
    let root = tempfile::tempdir().unwrap();
    let mut spec = NodeSpec::new(root.path(), "eu", "eu-1");
    spec.extra = vec!["--secure".into()];
    let output = NodeProcess::spawn_raw(&spec);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--secure")
            && stderr.contains("--tls-cert")
            && stderr.contains("--auth-tokens")
            && stderr.contains("--gossip-key-file"),
        "{stderr}"
    );

    spec.extra = vec!["--tls-cert".into(), "/nonexistent.pem".into()];
    let output = NodeProcess::spawn_raw(&spec);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--tls-key") && stderr.contains("--tls-ca"),
        "{stderr}"
    );

    let ca = Ca::new("ca");
    let (cert, _, ca_path) = ca.issue(&root.path().join("tls"), "n");
    let garbage = root.path().join("garbage.pem");
    std::fs::write(&garbage, "not a key").unwrap();
    spec.extra = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        garbage.to_str().unwrap(),
        "--tls-ca",
        ca_path.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let output = NodeProcess::spawn_raw(&spec);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--tls-key"), "{stderr}");

    spec.extra = Vec::new();
    let mut plain = NodeProcess::start(spec);
    assert!(
        plain.log_text().contains("security is off")
            && plain.log_text().contains("gossip is not sealed"),
        "{}",
        plain.log_text()
    );
    assert_eq!(plain.stop(), Some(0));
}

/// The `tally` CLI talks to a secure node with `--tls-ca` and `--token`, and
/// says what is wrong without them.
#[test]
fn the_cli_speaks_tls_with_a_token() {
    let root = tempfile::tempdir().unwrap();
    let ca = Ca::new("cli CA");
    let spec = secure_spec(root.path(), "eu", "eu-1", &ca, &[]);
    let ca_path = root.path().join("eu-1-tls").join("ca.pem");
    let node = NodeProcess::start(spec);
    let endpoint = format!("https://{}", node.spec.grpc);
    let run = |args: &[&str]| {
        let output = std::process::Command::new(common::cli_binary())
            .args(["--endpoint", &endpoint])
            .args(args)
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let ca_arg = ca_path.to_str().unwrap();
    let (code, stdout, stderr) = run(&["--tls-ca", ca_arg, "--token", TOKEN, "add", "k", "4"]);
    assert_eq!((code, stdout.trim()), (Some(0), "4"), "{stderr}");
    let (code, stdout, _) = run(&["--tls-ca", ca_arg, "--token", TOKEN, "status"]);
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("hot keys on this node:") && stdout.contains(" k "),
        "{stdout}"
    );
    let (code, _, stderr) = run(&["--tls-ca", ca_arg, "get", "k"]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.starts_with("error:") && stderr.to_lowercase().contains("token"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["--token", TOKEN, "get", "k"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("--tls-ca"), "{stderr}");
}

/// Tokens without TLS would leave Replication open to anyone: the node
/// refuses to start and says why and what to set.
#[test]
fn tokens_without_tls_are_refused_at_start() {
    let root = tempfile::tempdir().unwrap();
    let tokens = root.path().join("tokens");
    std::fs::write(&tokens, format!("web {TOKEN}\n")).unwrap();
    let mut spec = NodeSpec::new(root.path(), "eu", "eu-1");
    spec.extra = vec!["--auth-tokens".into(), tokens.display().to_string()];
    let (code, stderr) = common::run_bounded(&spec, Duration::from_secs(30));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("--auth-tokens")
            && stderr.contains("Replication")
            && stderr.contains("--tls-cert"),
        "{stderr}"
    );
}

/// With tokens on, the status page and its JSON (members, addresses, hot
/// key names) need the same token as `Admin`; health and metrics stay open.
#[test]
fn the_status_page_needs_a_token_when_tokens_are_on() {
    let root = tempfile::tempdir().unwrap();
    let ca = Ca::new("status CA");
    let node = NodeProcess::start(secure_spec(root.path(), "eu", "eu-1", &ca, &[]));
    let http = node.spec.http;
    let get = |path: &str, authorization: Option<&str>| {
        common::http_get_with(http, path, authorization).unwrap()
    };
    for path in ["/status", "/status.json"] {
        let (code, body) = get(path, None);
        assert_eq!(code, 401, "{path} without a token: {body}");
        assert!(
            !body.contains("eu-1"),
            "{path} leaks without a token: {body}"
        );
        assert!(body.contains("token"), "{path}: {body}");
        let (code, body) = get(path, Some("Bearer not-the-token-at-all"));
        assert_eq!(code, 401, "{path} with a wrong token: {body}");
        let (code, body) = get(path, Some(&format!("Bearer {TOKEN}")));
        assert_eq!(code, 200, "{path} with the token: {body}");
        assert!(body.contains("eu-1"), "{path}: {body}");
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(get(path, None).0, 200, "{path} stays open");
    }
}

/// The JSON API with tokens on (issue 16): over HTTPS (`--http-tls-cert`),
/// every `/v1/` call needs the bearer token (401 problem with
/// `WWW-Authenticate` otherwise), the token's rate limit holds (429 with
/// `Retry-After`, a batch charged per item), the event stream takes the
/// token as `access_token`, the OpenAPI document declares the scheme, and
/// plain HTTP to the HTTPS port gets no answer.
#[test]
fn the_json_api_needs_a_token_keeps_its_rate_and_speaks_https() {
    let root = tempfile::tempdir().unwrap();
    let ca = Ca::new("test-ca");
    let (cert, key, ca_path) = ca.issue(&root.path().join("https"), "https");
    let spec = secure_spec(
        root.path(),
        "eu",
        "web",
        &ca,
        &[
            "--rate-limit",
            "1",
            "--rate-burst",
            "20",
            "--http-tls-cert",
            cert.to_str().unwrap(),
            "--http-tls-key",
            key.to_str().unwrap(),
        ],
    );
    // The harness's readiness probe speaks plain HTTP: probe over HTTPS.
    let probe_ca = ca_path.clone();
    let node = NodeProcess::start_with_probe(spec, move |addr| {
        https_api(addr, &probe_ca)
            .try_call("GET", "/readyz")
            .is_some_and(|status| status == 200)
    });
    let anonymous = https_api(node.spec.http, &ca_path);
    let api = anonymous.with_token(TOKEN);

    let refused = anonymous.add("k", 1, None);
    refused.problem(401, "UNAUTHENTICATED");
    assert!(
        refused.header("www-authenticate").starts_with("Bearer"),
        "{refused:?}"
    );
    anonymous
        .with_token("not-a-known-token-at-all")
        .get("/v1/counters/k")
        .problem(401, "UNAUTHENTICATED");
    assert_eq!(api.add("k", 1, None).status, 200);
    // The stream takes the token in the query (EventSource sends no headers).
    let events = anonymous.events(&format!("/v1/counters/k/events?access_token={TOKEN}"), &[]);
    assert_eq!(events.status, 200);
    assert_eq!(
        events
            .next_value(Duration::from_secs(10))
            .expect("the value")
            .value(),
        1
    );
    assert_eq!(anonymous.get("/v1/counters/k/events").status, 401);
    // The document is open and declares the bearer scheme.
    let document = anonymous.get("/v1/openapi.json").json();
    assert_eq!(
        document["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    assert!(document["security"].is_array(), "{document}");

    // A batch of 50 is charged 50: the burst of 20 is spent, the next call waits.
    let items: Vec<String> = (0..50)
        .map(|i| format!("{{\"key\": \"b{i}\", \"delta\": 1}}"))
        .collect();
    let batch = api.post(
        "/v1/batch/add",
        &format!("{{\"adds\": [{}]}}", items.join(",")),
    );
    assert_eq!(batch.status, 200, "{batch:?}");
    let limited = api.get("/v1/counters/k");
    let problem = limited.problem(429, "RESOURCE_EXHAUSTED");
    assert!(
        problem["retry_after_ms"].as_u64().unwrap() > 1_000,
        "{problem}"
    );
    assert!(
        limited.header("retry-after").parse::<u64>().unwrap() >= 1,
        "{limited:?}"
    );

    // Plain HTTP to the HTTPS port: no HTTP answer.
    assert!(
        !matches!(http_get(node.spec.http, "/healthz"), Ok((200, _))),
        "the HTTPS port answered plain HTTP"
    );
    drop(node);
}

fn https_api(addr: std::net::SocketAddr, ca_path: &Path) -> common::http::Api {
    let ca = ureq::tls::Certificate::from_pem(&std::fs::read(ca_path).unwrap())
        .unwrap()
        .to_owned();
    let tls = ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::Rustls)
        .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(vec![
            ca,
        ])))
        .unversioned_rustls_crypto_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .build();
    let agent = common::http::Api::config()
        .tls_config(tls)
        .build()
        .new_agent();
    common::http::Api::with_agent(format!("https://localhost:{}", addr.port()), agent)
}

/// Forwarding under TLS and tokens (issue 11, routing): a node that is not
/// a key's owner forwards the caller's add on its own node certificate,
/// and the owner lets it in without a token; the forwarded marker without
/// a node certificate grants nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_request_passes_on_the_node_certificate_and_the_marker_alone_on_nothing() {
    let root = tempfile::tempdir().unwrap();
    let ca = Ca::new("cluster CA");
    let partitioned = ["--partitions", "16", "--replication-factor", "1"];
    let first = secure_spec(root.path(), "eu", "eu-1", &ca, &partitioned);
    let mut second = secure_spec(root.path(), "eu", "eu-2", &ca, &partitioned);
    second.seeds = vec![first.gossip];
    let (eu1, eu2) = tokio::task::spawn_blocking(move || {
        (NodeProcess::start(first), NodeProcess::start(second))
    })
    .await
    .unwrap();
    let mut client = CountersClient::new(tls_channel(&eu1, None).await);
    // Once eu-1 routes, a key of eu-2's is forwarded and served there.
    let mut forwarded_key = None;
    for attempt in 0..400 {
        let key = format!("post:{}", attempt % 16);
        let answer = client
            .add(with_token(add(&key, 1), Some(TOKEN)))
            .await
            .unwrap();
        if answer
            .metadata()
            .get("tally-owner")
            .map(|v| v.to_str().unwrap())
            == Some("eu-2")
        {
            forwarded_key = Some(key);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let key = forwarded_key.expect("eu-1 never forwarded an add to eu-2");
    let (_, metrics) = http_get(eu1.spec.http, "/metrics").unwrap();
    assert!(
        metrics.contains("tally_forwarded_requests_total{method=\"add\",outcome=\"answered\"} 1"),
        "{metrics}"
    );
    // The marker without a token and without a node certificate: refused.
    let mut marked = tonic::Request::new(add(&key, 1));
    marked
        .metadata_mut()
        .insert("tally-forwarded", "eu-1".parse().unwrap());
    let refused = client.add(marked).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    // With a node certificate, no token is needed (as for eu-1's forwards).
    let dir = root.path().join("eu-1-tls");
    let identity = Identity::from_pem(
        std::fs::read(dir.join("eu-1.pem")).unwrap(),
        std::fs::read(dir.join("eu-1-key.pem")).unwrap(),
    );
    let mut as_node = CountersClient::new(tls_channel(&eu2, Some(identity)).await);
    let mut marked = tonic::Request::new(add(&key, 1));
    marked
        .metadata_mut()
        .insert("tally-forwarded", "eu-1".parse().unwrap());
    let served = as_node.add(marked).await.unwrap();
    assert_eq!(
        served.metadata().get("tally-served-by").unwrap(),
        "eu-2",
        "{served:?}"
    );
    drop((eu1, eu2));
}
