//! The trust boundary with real processes (DESIGN.md, "Trust"): only a
//! node certificate is a node, and a node speaks only for itself; a client
//! certificate of the same CA is refused on every peer RPC and gets no pass
//! for `tally-forwarded`; a node whose own certificate does not name it
//! refuses to start; tokens carry roles.

mod common;

use std::path::Path;
use std::time::Duration;

use common::certs::{secure_spec, Ca};
use common::{NodeProcess, NodeSpec};
use tally_proto::v1 as pb;
use tally_proto::v1::admin_client::AdminClient;
use tally_proto::v1::counters_client::CountersClient;
use tally_proto::v1::replication_client::ReplicationClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::Code;

const READER: &str = "reader-token-0123456789";
const WRITER: &str = "writer-token-0123456789";
const OPS: &str = "ops-token-0123456789abc";

fn tokens() -> String {
    format!("reader {READER} read\nwriter {WRITER} read,write\nops {OPS} admin\n")
}

fn node(root: &Path, region: &str, name: &str, ca: &Ca, seeds: &[&NodeSpec]) -> NodeSpec {
    let mut spec = secure_spec(root, region, name, ca, &tokens(), &[]);
    spec.seeds = seeds.iter().map(|seed| seed.gossip).collect();
    spec
}

/// A TLS channel to `node`, presenting the certificate `NAME.pem` of
/// `dir` when `name` is given.
async fn channel(node: &NodeProcess, dir: &Path, name: Option<&str>) -> Channel {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(
        std::fs::read(dir.join("ca.pem")).unwrap(),
    ));
    if let Some(name) = name {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(dir.join(format!("{name}.pem"))).unwrap(),
            std::fs::read(dir.join(format!("{name}-key.pem"))).unwrap(),
        ));
    }
    Channel::from_shared(format!("https://{}", node.spec.grpc))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

fn add(key: &str, delta: i64) -> pb::AddRequest {
    pb::AddRequest {
        key: key.as_bytes().to_vec().into(),
        delta,
        ..Default::default()
    }
}

async fn value(client: &mut CountersClient<Channel>, key: &str) -> i64 {
    let request = pb::GetRequest {
        key: key.as_bytes().to_vec().into(),
        ..Default::default()
    };
    client
        .get(with_token(request, READER))
        .await
        .unwrap()
        .into_inner()
        .value
}

/// Each member's replica id, as `node`'s status lists them, once it sees
/// `count` members (itself included).
async fn replicas(node: &NodeProcess, dir: &Path, count: usize) -> Vec<(String, String, u64)> {
    let mut admin = AdminClient::new(channel(node, dir, None).await);
    for _ in 0..300 {
        let status = admin
            .status(with_token(pb::StatusRequest::default(), READER))
            .await
            .unwrap()
            .into_inner();
        let members: Vec<_> = status
            .self_
            .iter()
            .chain(status.members.iter())
            .map(|m| (m.node_name.clone(), m.region.clone(), m.replica))
            .collect();
        if members.len() >= count {
            return members;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{} never saw {count} members", node.spec.node_name);
}

fn replica_of(members: &[(String, String, u64)], name: &str) -> u64 {
    members.iter().find(|m| m.0 == name).unwrap().2
}

fn copy(source: u64, region: &str, key: &str, p: u64) -> pb::CopyRequest {
    pb::CopyRequest {
        cluster_id: "test-cluster".into(),
        source_replica: source,
        source_region: region.into(),
        upto_seq: 1,
        counters: vec![pb::CopiedSlot {
            key: key.as_bytes().to_vec().into(),
            p,
            n: 0,
            folded: None,
        }],
        protocol_version: 12,
        protocol_oldest: 1,
        ..Default::default()
    }
}

#[track_caller]
fn assert_refused<T: std::fmt::Debug>(result: Result<T, tonic::Status>, code: Code, text: &str) {
    let status = result.expect_err("the call was let through");
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().contains(text), "{}", status.message());
}

/// A client certificate of the cluster CA (the one make-certs.sh issues to
/// applications) is refused on Pull, Copy and ConfirmHolding, and the
/// `tally-forwarded` marker with it and no token is refused too; a forged
/// copy changes nothing. A node certificate may pull, but not as another
/// node, and may not push another node's slots or confirm as another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_node_is_a_node_and_a_node_speaks_only_for_itself() {
    let root = tempfile::tempdir().unwrap();
    let ca = Ca::new("cluster CA");
    let eu1 = node(root.path(), "eu", "eu-1", &ca, &[]);
    let eu2 = node(root.path(), "eu", "eu-2", &ca, &[]);
    let us1 = node(root.path(), "us", "us-1", &ca, &[]);
    let started = tokio::task::spawn_blocking(move || common::start_seeded(vec![eu1, eu2, us1]));
    let [eu1, eu2, us1]: [NodeProcess; 3] = started.await.unwrap().try_into().ok().unwrap();
    let certs = root.path().join("eu-1-tls");
    let (client_cert, _, _) = ca.issue_client(&certs, "client");
    assert!(client_cert.exists());
    let members = replicas(&eu2, &certs, 3).await;
    let (eu1_id, us1_id) = (replica_of(&members, "eu-1"), replica_of(&members, "us-1"));

    let mut counters = CountersClient::new(channel(&eu2, &certs, None).await);
    counters
        .add(with_token(add("victim", 3), WRITER))
        .await
        .unwrap();

    // A client certificate, no token: no peer RPC, no forwarding pass.
    let as_client = channel(&eu2, &certs, Some("client")).await;
    let mut replication = ReplicationClient::new(as_client.clone());
    let pull = pb::PullRequest {
        cluster_id: "test-cluster".into(),
        caller_replica: eu1_id,
        records_from: Some(0),
        protocol_version: 12,
        protocol_oldest: 1,
        ..Default::default()
    };
    assert_refused(
        replication.pull(pull.clone()).await,
        Code::PermissionDenied,
        "nodes only",
    );
    assert_refused(
        replication
            .copy(copy(eu1_id, "eu", "victim", 1_000_000))
            .await,
        Code::PermissionDenied,
        "nodes only",
    );
    assert_refused(
        replication
            .confirm_holding(pb::ConfirmHoldingRequest {
                cluster_id: "test-cluster".into(),
                asker: "eu-1".into(),
                partitions: None,
            })
            .await,
        Code::PermissionDenied,
        "nodes only",
    );
    let mut forwarded = tonic::Request::new(add("victim", 1_000));
    forwarded
        .metadata_mut()
        .insert("tally-forwarded", "eu-1".parse().unwrap());
    assert_refused(
        CountersClient::new(as_client).add(forwarded).await,
        Code::Unauthenticated,
        "token",
    );

    // eu-1's node certificate: it may pull as itself, not as us-1, and may
    // not push us-1's slots nor confirm a handoff as us-1.
    let mut as_eu1 = ReplicationClient::new(channel(&eu2, &certs, Some("eu-1")).await);
    let mut stream = as_eu1.pull(pull.clone()).await.unwrap().into_inner();
    assert!(stream.message().await.unwrap().is_some());
    let impostor = pb::PullRequest {
        caller_replica: us1_id,
        ..pull
    };
    assert_refused(
        as_eu1.pull(impostor).await,
        Code::PermissionDenied,
        "speaks only for itself",
    );
    assert_refused(
        as_eu1.copy(copy(us1_id, "us", "victim", 1_000_000)).await,
        Code::PermissionDenied,
        "speaks only for itself",
    );
    assert_refused(
        as_eu1.copy(copy(0x5eed, "eu", "victim", 1_000_000)).await,
        Code::Unavailable,
        "not a member",
    );
    assert_refused(
        as_eu1
            .confirm_holding(pb::ConfirmHoldingRequest {
                cluster_id: "test-cluster".into(),
                asker: "us-1".into(),
                partitions: None,
            })
            .await,
        Code::PermissionDenied,
        "speaks only for itself",
    );

    // Nothing of it counted, anywhere; the refusals are counted.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(value(&mut counters, "victim").await, 3);
    let mut at_us = CountersClient::new(channel(&us1, &certs, None).await);
    for _ in 0..100 {
        if value(&mut at_us, "victim").await == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(value(&mut at_us, "victim").await, 3);
    let (_, metrics) = common::http_get(eu2.spec.http, "/metrics").unwrap();
    for reason in ["not_a_node", "impersonation", "unknown_source"] {
        assert!(
            common::refused_count(&metrics, reason) > 0.0,
            "no refusal counted as {reason}"
        );
    }
    drop((eu1, eu2, us1));
}

/// A node whose own certificate names another node, or no node, refuses to
/// start and names the setting.
#[test]
fn a_node_refuses_a_certificate_that_does_not_name_it() {
    let root = tempfile::tempdir().unwrap();
    let ca = Ca::new("cluster CA");
    for (label, issue) in [("another node's", true), ("a client", false)] {
        let mut spec = secure_spec(root.path(), "eu", "eu-1", &ca, &tokens(), &[]);
        let dir = root.path().join(format!("wrong-{}", issue));
        let (cert, key, _) = if issue {
            ca.issue(&dir, "eu-9")
        } else {
            ca.issue_client(&dir, "client")
        };
        let at = spec.extra.iter().position(|a| a == "--tls-cert").unwrap();
        spec.extra[at + 1] = cert.display().to_string();
        spec.extra[at + 3] = key.display().to_string();
        let (code, stderr) = common::run_bounded(&spec, Duration::from_secs(30));
        assert_eq!(code, Some(1), "{label}: {stderr}");
        assert!(
            stderr.contains("--tls-cert") && stderr.contains("tally://node/eu-1"),
            "{label}: {stderr}"
        );
    }
}

/// A read token reads and may not write or administer; a write token
/// writes and may not administer; an admin token administers. Over gRPC
/// and HTTP alike, a refusal is PERMISSION_DENIED / 403 and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_do_what_their_roles_allow() {
    let root = tempfile::tempdir().unwrap();
    let ca = Ca::new("cluster CA");
    let spec = node(root.path(), "eu", "eu-1", &ca, &[]);
    let node = NodeProcess::start_async(spec).await;
    let certs = root.path().join("eu-1-tls");
    let channel = channel(&node, &certs, None).await;
    let mut counters = CountersClient::new(channel.clone());
    let mut admin = AdminClient::new(channel);

    assert_refused(
        counters.add(with_token(add("k", 5), READER)).await,
        Code::PermissionDenied,
        "needs write",
    );
    counters.add(with_token(add("k", 2), WRITER)).await.unwrap();
    assert_eq!(value(&mut counters, "k").await, 2);
    let drain = pb::DrainRequest {
        node: "eu-1".into(),
    };
    for token in [READER, WRITER] {
        assert_refused(
            admin.drain(with_token(drain.clone(), token)).await,
            Code::PermissionDenied,
            "needs admin",
        );
    }
    let status = admin
        .status(with_token(pb::StatusRequest::default(), READER))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.self_.unwrap().node_name, "eu-1");
    // The admin token gets past the check (the retire is refused for what
    // it asks, not for who asks).
    let retire = admin
        .retire(with_token(pb::RetireRequest::default(), OPS))
        .await
        .unwrap_err();
    assert!(
        !matches!(
            retire.code(),
            Code::PermissionDenied | Code::Unauthenticated
        ),
        "{retire:?}"
    );

    // HTTP: the same roles.
    let http = node.spec.http;
    let api = common::http::Api::new(http);
    let reply = api
        .with_token(READER)
        .post("/v1/counters/k", r#"{"delta": 7}"#);
    assert_eq!(reply.status, 403, "{}", reply.body);
    assert!(reply.body.contains("needs write"), "{}", reply.body);
    let reply = api
        .with_token(WRITER)
        .post("/v1/counters/k", r#"{"delta": 7}"#);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(value(&mut counters, "k").await, 9);
    // /metrics stays open and names no key; the status page (with a
    // token) lists the hot key.
    let (_, metrics) = common::http_get(http, "/metrics").unwrap();
    assert!(!metrics.contains("key=\"k\""), "{metrics}");
    let (code, status) =
        common::http_get_with(http, "/status.json", Some(&format!("Bearer {READER}"))).unwrap();
    assert_eq!(code, 200);
    assert!(status.contains("\"k\""), "{status}");
}
