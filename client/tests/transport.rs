//! A client over the caller's own transport (a tonic channel it configured,
//! wrapped in its own interceptor and layers) still retries with the same
//! idempotency key, coalesces concurrent adds and sends the configured
//! token, all through the caller's stack, as the fake node sees it.

mod fake;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_client::{Client, ClientConfig, Code};
use tokio::task::JoinSet;
use tonic::body::Body;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tower::{Service, ServiceExt};

use fake::{spawn_fake_server, FakeServerHandle};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Fast retries, one batch in flight, and a token.
fn config() -> ClientConfig {
    ClientConfig::new()
        .with_max_retries(3)
        .with_backoff_base(Duration::from_millis(1))
        .with_backoff_max(Duration::from_millis(5))
        .with_max_batches_in_flight(1)
        .with_token("t0k3n")
}

async fn channel(server: &FakeServerHandle) -> Channel {
    Endpoint::from_shared(server.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// The caller's stack: a tonic interceptor that tags each call, under a
/// layer that counts the requests that go through it.
fn callers_stack(
    channel: Channel,
    requests: Arc<AtomicU32>,
) -> impl Service<
    http::Request<Body>,
    Response = http::Response<Body>,
    Error = tonic::transport::Error,
    Future = impl Send + 'static,
> + Clone
       + Send
       + Sync
       + 'static {
    let tagged = InterceptedService::new(channel, |mut request: tonic::Request<()>| {
        request
            .metadata_mut()
            .insert("x-caller", "likes-service".parse().unwrap());
        Ok(request)
    });
    tagged
        .map_request(move |request: http::Request<Body>| {
            requests.fetch_add(1, Ordering::SeqCst);
            request
        })
        .map_response(|response: http::Response<_>| response.map(Body::new))
}

#[tokio::test]
async fn retries_on_the_callers_stack_reuse_the_key_and_carry_its_headers_and_the_token() {
    let server = spawn_fake_server().await;
    let requests = Arc::new(AtomicU32::new(0));
    let stack = callers_stack(channel(&server).await, requests.clone());
    let client = config()
        .with_coalescing(false)
        .build_with_service(stack)
        .unwrap();
    assert_eq!(client.endpoint(), None);

    server.node.fail_next_adds(2, Code::Unavailable);
    let outcome = client.add("post:1:likes", 1).await.unwrap();
    assert_eq!((outcome.value, outcome.duplicate), (1, false));

    let keys = server.node.seen_keys();
    assert_eq!(keys.len(), 3, "two failures and the success");
    assert!(keys.iter().all(|key| key == &keys[0]), "{keys:?}");
    assert_eq!(
        requests.load(Ordering::SeqCst),
        3,
        "every retry went through the stack"
    );
    assert_eq!(
        server.node.add_header("x-caller"),
        vec![Some("likes-service".to_owned()); 3]
    );
    assert_eq!(
        server.node.add_header("authorization"),
        vec![Some("Bearer t0k3n".to_owned()); 3]
    );
}

#[tokio::test]
async fn concurrent_adds_on_the_callers_channel_are_coalesced() {
    let server = spawn_fake_server().await;
    let requests = Arc::new(AtomicU32::new(0));
    let stack = callers_stack(channel(&server).await, requests.clone());
    let client = config().build_with_service(stack).unwrap();

    // One add held by the node fills the only batch slot; the next ones
    // gather behind it.
    server.node.state().add_delay = Duration::from_millis(300);
    let mut adds = JoinSet::new();
    let first = client.clone();
    adds.spawn(async move { first.add("warm", 1).await });
    let started = Instant::now();
    while server.node.add_requests() < 1 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the first add never came"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    server.node.state().add_delay = Duration::ZERO;
    for _ in 0..20 {
        let client = client.clone();
        adds.spawn(async move { client.add("post:2:likes", 1).await });
    }
    let mut values = Vec::new();
    while let Some(result) = adds.join_next().await {
        values.push(result.unwrap().unwrap().value);
    }
    values.sort_unstable();
    assert_eq!(values.len(), 21);
    assert_eq!(
        *values.last().unwrap(),
        20,
        "the 20 adds to post:2:likes all counted"
    );

    let batches = server.node.batches();
    assert!(
        batches.iter().any(|batch| batch.len() > 1),
        "no add was coalesced: {batches:?}"
    );
    assert_eq!(
        requests.load(Ordering::SeqCst),
        server.node.add_requests(),
        "every batch went through the caller's stack"
    );
    assert!(server.node.add_requests() < 21);
}

#[tokio::test]
async fn a_failure_of_the_callers_service_is_retried_like_a_broken_connection() {
    let server = spawn_fake_server().await;
    let channel = channel(&server).await;
    let calls = Arc::new(AtomicU32::new(0));
    let flaky = tower::service_fn(move |request: http::Request<Body>| {
        let mut channel = channel.clone();
        let call = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            if call == 0 {
                let refused = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
                return Err(BoxError::from(refused));
            }
            let response = channel.ready().await?.call(request).await?;
            Ok::<_, BoxError>(response)
        }
    });
    let client = config()
        .with_coalescing(false)
        .build_with_service(flaky)
        .unwrap();
    assert_eq!(client.add("post:3:likes", 5).await.unwrap().value, 5);
    assert_eq!(server.node.add_requests(), 1, "the first try never left");
}

#[tokio::test]
async fn from_channel_gives_a_default_client_over_the_callers_channel() {
    let server = spawn_fake_server().await;
    let client = Client::from_channel(channel(&server).await);
    assert_eq!(client.add("post:4:likes", 2).await.unwrap().value, 2);
    assert_eq!(client.get("post:4:likes").await.unwrap(), 2);
    assert_eq!(server.node.add_header("authorization"), vec![None]);
}
