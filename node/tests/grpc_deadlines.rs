//! A caller's gRPC deadline with a real node: an add whose `grpc-timeout`
//! passed before the node admitted it is refused with `DEADLINE_EXCEEDED`
//! (or `CANCELLED`, by tonic's timer, when it passed while the request was
//! still being read) and not applied; with time left it is applied. Sent over a raw HTTP/2
//! connection: tonic's own client would enforce a 1 ns deadline itself and
//! never let the node answer.

mod common;

use common::{NodeProcess, NodeSpec};
use prost::Message;
use tally_proto::v1 as pb;
use tonic::codegen::http;

/// Sends `add` to `Counters/Add` with `grpc-timeout: timeout`; returns the
/// answer's `grpc-status`.
async fn add_with_timeout(node: &NodeProcess, add: &pb::AddRequest, timeout: &str) -> String {
    let tcp = tokio::net::TcpStream::connect(node.spec.grpc)
        .await
        .unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{}/tally.v1.Counters/Add", node.spec.grpc))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", timeout)
        .body(())
        .unwrap();
    let (response, mut body) = client.send_request(request, false).unwrap();
    let message = add.encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    body.send_data(frame.into(), true).unwrap();
    let response = response.await.unwrap();
    if let Some(status) = response.headers().get("grpc-status") {
        return status.to_str().unwrap().to_string();
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.unwrap().unwrap();
    trailers
        .get("grpc-status")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_past_its_deadline_before_admission_is_refused_and_not_applied() {
    let root = tempfile::tempdir().unwrap();
    let node = NodeProcess::start_async(NodeSpec::new(root.path(), "eu", "eu-1")).await;
    let add = |delta| pb::AddRequest {
        key: b"late".to_vec().into(),
        delta,
        ..Default::default()
    };
    // DEADLINE_EXCEEDED (4) is the node's refusal; CANCELLED (1) is tonic's
    // own timer, which answers when the deadline passes while the request
    // is still being read (its body not arrived yet: seen on a loaded
    // machine). Neither applies the add.
    let late = add_with_timeout(&node, &add(5), "1n").await;
    assert!(["4", "1"].contains(&late.as_str()), "grpc-status {late}");
    assert_eq!(add_with_timeout(&node, &add(7), "10S").await, "0");
    let mut client = tally_proto::v1::counters_client::CountersClient::connect(format!(
        "http://{}",
        node.spec.grpc
    ))
    .await
    .unwrap();
    let value = client
        .get(pb::GetRequest {
            key: b"late".to_vec().into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .value;
    assert_eq!(value, 7, "the late add was applied");
}
