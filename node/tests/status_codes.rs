//! What a real client sees when it sends bytes the server cannot read: a raw
//! gRPC client (tonic's generic client with a codec that sends the bytes it
//! is given) against a real node.
//!
//! Issue 10, item 13: a malformed message is `INVALID_ARGUMENT`, an
//! oversized one `RESOURCE_EXHAUSTED`.

mod common;

use common::{NodeProcess, NodeSpec};
use prost::bytes::{Buf, BufMut};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Code, Status};

/// Sends raw bytes as the message; reads any answer as raw bytes.
#[derive(Clone, Copy, Default)]
struct RawCodec;

struct RawEncoder;
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        Ok(Some(bytes.to_vec()))
    }
}

/// Sends `body` to `method` and returns the status of the answer.
async fn send(node: &NodeProcess, method: &'static str, body: Vec<u8>) -> Status {
    let channel = tonic::transport::Endpoint::from_shared(node.endpoint())
        .unwrap()
        .connect()
        .await
        .expect("connecting to the node");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("the channel is ready");
    match grpc
        .unary::<Vec<u8>, Vec<u8>, _>(
            tonic::Request::new(body),
            PathAndQuery::from_static(method),
            RawCodec,
        )
        .await
    {
        Ok(answer) => Status::ok(format!("answered {:?}", answer.into_inner())),
        Err(status) => status,
    }
}

#[track_caller]
fn assert_code(status: &Status, code: Code, what: &str) {
    assert_eq!(
        status.code(),
        code,
        "{what}: got {:?} ({})",
        status.code(),
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_requests_get_the_conventional_codes() {
    let root = tempfile::tempdir().unwrap();
    let mut node = NodeProcess::start(NodeSpec::new(root.path(), "eu", "raw"));

    // AddRequest field 3 (idempotency_key, a string) holding bytes that are
    // not UTF-8.
    let status = send(&node, "/tally.v1.Counters/Add", vec![0x1a, 2, 0xff, 0xfe]).await;
    assert_code(&status, Code::InvalidArgument, "invalid UTF-8 in a string");
    // A length-delimited field that claims 16 bytes and has 1.
    let status = send(&node, "/tally.v1.Counters/Get", vec![0x0a, 16, b'k']).await;
    assert_code(&status, Code::InvalidArgument, "a truncated message");
    // A server-streaming method, and a replication one, read the same way.
    let status = send(&node, "/tally.v1.Counters/Watch", vec![0xff; 7]).await;
    assert_code(&status, Code::InvalidArgument, "garbage to Watch");
    let status = send(&node, "/tally.v1.Replication/Pull", vec![0x0a, 9]).await;
    assert_code(&status, Code::InvalidArgument, "a truncated pull");

    // Over the 16 MiB limit.
    let status = send(&node, "/tally.v1.Counters/Add", vec![0; 17 << 20]).await;
    assert_code(&status, Code::ResourceExhausted, "an oversized message");

    // A well-formed request still works, and a real overflow keeps its code.
    let add = |key: &str, delta: i64| {
        let mut body = vec![0x0a, key.len() as u8];
        body.extend_from_slice(key.as_bytes());
        body.push(0x10);
        // sint64: zigzag.
        prost::encoding::encode_varint(((delta << 1) ^ (delta >> 63)) as u64, &mut body);
        body
    };
    let status = send(&node, "/tally.v1.Counters/Add", add("k", i64::MAX)).await;
    assert_code(&status, Code::Ok, "a valid add");
    let status = send(&node, "/tally.v1.Counters/Add", add("k", 1)).await;
    assert_code(&status, Code::OutOfRange, "an add past i64::MAX");

    assert_eq!(node.stop(), Some(0));
}
