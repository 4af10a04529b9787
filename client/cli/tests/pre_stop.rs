//! `tally admin k8s-pre-stop` against a fake Kubernetes API (HTTPS with a
//! CA made here by rcgen, answering the StatefulSet's `scale` subresource)
//! and the fake node of `client/tests/fake` serving a partitioned region:
//! a pod scaled away drains its node and waits until it has left, a pod
//! that restarts drains nothing, and the API's or the node's refusals fail
//! with one line that says what to do.

// The fake node is shared with the library's tests.
#[path = "../../tests/fake/mod.rs"]
mod fake;

use std::path::PathBuf;
use std::process::Output;
use std::sync::{Arc, Mutex};

use fake::{spawn_fake_server, unused_endpoint, FakeRegion, FakeServerHandle};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "service-account-token-0123";
const SCALE_PATH: &str = "/apis/apps/v1/namespaces/tally/statefulsets/tally/scale";

/// What the fake API answers, and the requests it saw.
#[derive(Default)]
struct ApiState {
    status: u16,
    body: String,
    /// Send the body with chunked transfer-encoding.
    chunked: bool,
    /// The head of each request.
    requests: Vec<String>,
}

/// A fake Kubernetes API on 127.0.0.1 over TLS, and the service account
/// directory (token, ca.crt, namespace) that trusts it.
struct FakeKubeApi {
    url: String,
    credentials: PathBuf,
    state: Arc<Mutex<ApiState>>,
    _dir: tempfile::TempDir,
}

impl FakeKubeApi {
    /// Answers every request with `status` and `body`.
    fn answer(&self, status: u16, body: &str, chunked: bool) {
        let mut state = self.state.lock().unwrap();
        state.status = status;
        state.body = body.to_owned();
        state.chunked = chunked;
    }

    fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }
}

fn scale(replicas: Option<u32>) -> String {
    let spec = replicas.map_or("{}".to_owned(), |n| format!("{{\"replicas\":{n}}}"));
    format!(
        "{{\"kind\":\"Scale\",\"apiVersion\":\"autoscaling/v1\",\"metadata\":{{\"name\":\"tally\",\
         \"namespace\":\"tally\"}},\"spec\":{spec},\"status\":{{\"replicas\":3}}}}"
    )
}

async fn spawn_fake_kube_api() -> FakeKubeApi {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("serviceaccount");
    std::fs::create_dir(&credentials).unwrap();
    std::fs::write(credentials.join("token"), format!("{TOKEN}\n")).unwrap();
    std::fs::write(credentials.join("ca.crt"), ca.pem()).unwrap();
    std::fs::write(credentials.join("namespace"), "tally").unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let state = Arc::new(Mutex::new(ApiState {
        status: 200,
        body: scale(Some(1)),
        ..ApiState::default()
    }));
    let served = Arc::clone(&state);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, state) = (acceptor.clone(), Arc::clone(&served));
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|window| window == b"\r\n\r\n") {
                    match tls.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(read) => head.extend_from_slice(&buffer[..read]),
                    }
                }
                let response = {
                    let mut state = state.lock().unwrap();
                    state
                        .requests
                        .push(String::from_utf8_lossy(&head).into_owned());
                    let (status, body) = (state.status, state.body.clone());
                    if state.chunked {
                        let (first, second) = body.split_at(body.len() / 2);
                        format!(
                            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n\
                             Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{first}\r\n{:x}\r\n\
                             {second}\r\n0\r\n\r\n",
                            first.len(),
                            second.len()
                        )
                    } else {
                        format!(
                            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n\
                             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    }
                };
                let _ = tls.write_all(response.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    FakeKubeApi {
        url,
        credentials,
        state,
        _dir: dir,
    }
}

/// Runs `tally --endpoint NODE admin k8s-pre-stop --pod POD --node
/// eu-west-POD` against `api`, with nothing from this process's
/// environment, and `extra` arguments.
async fn pre_stop(node: &str, api: &FakeKubeApi, pod: &str, extra: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_tally"));
    for variable in [
        "TALLY_ENDPOINT",
        "TALLY_TOKEN",
        "TALLY_TOKEN_FILE",
        "POD_NAME",
        "POD_NAMESPACE",
        "TALLY_NODE_NAME",
        "TALLY_STATEFULSET",
        "TALLY_KUBE_API",
        "TALLY_KUBE_CREDENTIALS",
        "TALLY_PRE_STOP_LOG",
        "KUBERNETES_SERVICE_HOST",
        "KUBERNETES_SERVICE_PORT",
    ] {
        command.env_remove(variable);
    }
    command
        .args(["--endpoint", node, "admin", "k8s-pre-stop", "--pod", pod])
        .arg("--node")
        .arg(format!("eu-west-{pod}"))
        .args(["--kube-api", &api.url, "--kube-credentials"])
        .arg(&api.credentials)
        .args(["--poll-interval", "20ms"])
        .args(extra)
        .output()
        .await
        .expect("the tally binary runs")
}

#[track_caller]
fn stdout_lines(output: &Output) -> Vec<String> {
    assert!(
        output.status.success(),
        "exit {:?}, stderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[track_caller]
fn error_line(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8(output.stderr.clone()).unwrap();
    assert_eq!(stderr.lines().count(), 1, "one line on stderr: {stderr:?}");
    stderr
}

/// A fake node serving region eu-west of `nodes` (name, partitions held).
async fn node_with_region(nodes: &[(&str, u32)]) -> FakeServerHandle {
    let server = spawn_fake_server().await;
    server.node.state().region = Some(FakeRegion::new("eu-west", nodes));
    server
}

fn drains(server: &FakeServerHandle) -> Vec<String> {
    server.node.state().region.as_ref().unwrap().drains.clone()
}

/// Runs the hook for `pod` with `--timeout TIMEOUT` and `--log-to` a new
/// file; returns what it did and the lines it logged.
async fn pre_stop_logged(
    server: &FakeServerHandle,
    api: &FakeKubeApi,
    pod: &str,
    timeout: &str,
) -> (Output, Vec<String>) {
    let log = api
        .credentials
        .with_file_name(format!("{pod}-{timeout}.log"));
    let args = ["--timeout", timeout, "--log-to", log.to_str().unwrap()];
    let output = pre_stop(&server.endpoint(), api, pod, &args).await;
    let logged = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    (output, logged)
}

#[tokio::test]
async fn a_pod_scaled_away_drains_its_node_and_returns_once_it_has_left() {
    let server = node_with_region(&[
        ("eu-west-tally-0", 8),
        ("eu-west-tally-1", 8),
        ("eu-west-tally-2", 10),
    ])
    .await;
    let api = spawn_fake_kube_api().await;
    api.answer(200, &scale(Some(2)), false);
    let (output, logged) = pre_stop_logged(&server, &api, "tally-2", "1m").await;
    let lines = stdout_lines(&output);

    assert_eq!(
        lines[0],
        "pod tally-2 is leaving: StatefulSet tally keeps ordinals 0 to 1 (2 replicas); \
         draining node eu-west-tally-2"
    );
    assert_eq!(
        lines[1],
        "node eu-west-tally-2 is draining: the other nodes of region eu-west take its \
         partitions over; waiting until it has left (at most 1m00s)"
    );
    // 10 partitions, 4 handed away per map read: 6, 2, then none.
    let progress: Vec<&str> = lines[2..lines.len() - 1]
        .iter()
        .map(|line| line.split(" (").next().unwrap())
        .collect();
    assert_eq!(
        progress,
        [
            "node eu-west-tally-2: draining, holds 6 partitions, 6 being handed away",
            "node eu-west-tally-2: draining, holds 2 partitions, 2 being handed away",
        ]
    );
    let last = lines.last().unwrap();
    assert!(
        last.starts_with(
            "node eu-west-tally-2 has left: the other nodes of region eu-west hold its partitions ("
        ) && last.ends_with("); the pod may stop"),
        "{last}"
    );
    assert_eq!(drains(&server), ["eu-west-tally-2"]);

    let requests = api.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    let request = requests[0].to_ascii_lowercase();
    assert!(
        request.starts_with(&format!(
            "get {} http/1.1\r\n",
            SCALE_PATH.to_ascii_lowercase()
        )),
        "{request}"
    );
    assert!(
        request.contains(&format!(
            "\r\nauthorization: bearer {}\r\n",
            TOKEN.to_ascii_lowercase()
        )),
        "{request}"
    );

    assert_eq!(logged.len(), lines.len());
    assert_eq!(logged[0], format!("tally admin k8s-pre-stop: {}", lines[0]));
    server.shutdown();
}

#[tokio::test]
async fn a_restarting_pod_does_not_drain_nor_a_region_scaled_to_zero() {
    let server = node_with_region(&[("eu-west-tally-0", 8), ("eu-west-tally-1", 8)]).await;
    let api = spawn_fake_kube_api().await;
    // Chunked, as the API server may send it.
    api.answer(200, &scale(Some(3)), true);
    let output = pre_stop(&server.endpoint(), &api, "tally-1", &["--json"]).await;
    let lines = stdout_lines(&output);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let decision: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(
        decision,
        serde_json::json!({"event": "decision", "pod": "tally-1", "statefulset": "tally",
            "ordinal": 1, "replicas": 3, "node": "eu-west-tally-1", "decision": "restarting"})
    );

    let output = pre_stop(&server.endpoint(), &api, "tally-1", &[]).await;
    assert_eq!(
        stdout_lines(&output),
        [
            "pod tally-1 is restarting, not leaving: StatefulSet tally keeps ordinals 0 to 2 \
          (3 replicas); node eu-west-tally-1 is not drained"
        ]
    );

    // Scaled to 0, the API leaves spec.replicas out.
    api.answer(200, &scale(None), false);
    let output = pre_stop(&server.endpoint(), &api, "tally-1", &[]).await;
    let lines = stdout_lines(&output);
    assert!(
        lines[0].starts_with("StatefulSet tally is scaled to 0: the whole region stops"),
        "{lines:?}"
    );

    let region = server.node.state().region.clone().unwrap();
    assert!(region.drains.is_empty(), "{:?}", region.drains);
    assert_eq!(region.map_calls, 0, "the node is not even asked");
    assert_eq!(api.requests().len(), 3);
    server.shutdown();
}

#[tokio::test]
async fn a_forbidden_or_unreachable_api_fails_without_draining() {
    let server = node_with_region(&[("eu-west-tally-0", 8), ("eu-west-tally-1", 8)]).await;
    let api = spawn_fake_kube_api().await;
    api.answer(
        403,
        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"statefulsets.apps \"tally\" is forbidden: User \"system:serviceaccount:tally:default\" cannot get resource \"statefulsets/scale\"","reason":"Forbidden","code":403}"#,
        false,
    );
    let output = pre_stop(&server.endpoint(), &api, "tally-1", &[]).await;
    let line = error_line(&output);
    assert!(output.stdout.is_empty());
    for needle in [
        "node eu-west-tally-1 is not drained",
        "forbids this pod's service account to read the scale of StatefulSet tally/tally \
         (403 Forbidden",
        "system:serviceaccount:tally:default",
        "deploy/k8s/base/rbac.yaml",
        "serviceAccountName: tally",
    ] {
        assert!(line.contains(needle), "{needle:?} not in {line}");
    }

    let gone = FakeKubeApi {
        url: unused_endpoint().await.replace("http://", "https://"),
        credentials: api.credentials.clone(),
        state: Arc::default(),
        _dir: tempfile::tempdir().unwrap(),
    };
    let output = pre_stop(&server.endpoint(), &gone, "tally-1", &[]).await;
    let line = error_line(&output);
    assert!(
        line.contains(&format!(
            "cannot GET {SCALE_PATH} from the Kubernetes API at {}",
            gone.url
        )),
        "{line}"
    );

    let output = pre_stop(&server.endpoint(), &api, "tally", &[]).await;
    assert!(error_line(&output).contains("does not end in -ORDINAL"));
    assert!(drains(&server).is_empty());
    server.shutdown();
}

#[tokio::test]
async fn a_drain_refused_or_too_slow_fails_saying_what_to_do() {
    // The region's last node may not drain (its pod scaled away all the same).
    let server = node_with_region(&[("eu-west-tally-1", 16)]).await;
    let api = spawn_fake_kube_api().await;
    api.answer(200, &scale(Some(1)), false);
    let output = pre_stop(&server.endpoint(), &api, "tally-1", &[]).await;
    let line = error_line(&output);
    assert!(
        line.contains(
            "node eu-west-tally-1 refused to drain, so pod tally-1 stops without a drain"
        ) && line.contains("is the last node of region \"eu-west\""),
        "{line}"
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).lines().next(),
        Some(
            "pod tally-1 is leaving: StatefulSet tally keeps ordinal 0 (1 replica); draining \
             node eu-west-tally-1"
        )
    );
    server.shutdown();

    // A drain that does not end within --timeout.
    let server = node_with_region(&[("eu-west-tally-0", 8), ("eu-west-tally-1", 8)]).await;
    server
        .node
        .state()
        .region
        .as_mut()
        .unwrap()
        .released_per_map = 0;
    let (output, logged) = pre_stop_logged(&server, &api, "tally-1", "300ms").await;
    let line = error_line(&output);
    // The log (the node's stdout, in a pod) gets the error too.
    assert_eq!(
        format!("{}\n", logged.last().unwrap()),
        format!("tally admin k8s-pre-stop: {line}")
    );
    assert!(
        line.contains(
            "node eu-west-tally-1 has not left within 300ms (draining, holds 8 partitions, 8 \
             being handed away): the pod stops now, still draining"
        ) && line.contains("scale the StatefulSet back up"),
        "{line}"
    );
    assert_eq!(drains(&server), ["eu-west-tally-1"]);
    server.shutdown();
}
