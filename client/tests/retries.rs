//! The client's retries, seen from a fake node's side: transient failures are
//! retried, every retry of one logical add carries the same idempotency key,
//! and permanent failures are returned at once.

mod fake;

use std::time::Duration;

use tally_client::{Client, ClientConfig, Code, Error};

use fake::{spawn_fake_server, unused_endpoint, FakeServerHandle};

/// Fast retries, so the tests do not wait on real backoff.
fn quick_config() -> ClientConfig {
    ClientConfig::new()
        .with_max_retries(3)
        .with_backoff_base(Duration::from_millis(1))
        .with_backoff_max(Duration::from_millis(5))
}

async fn connect(server: &FakeServerHandle) -> Client {
    quick_config().connect(server.endpoint()).await.unwrap()
}

#[track_caller]
fn assert_all_equal_uuid_v7(keys: &[String]) {
    assert!(!keys.is_empty());
    assert!(
        keys.iter().all(|key| key == &keys[0]),
        "keys differ: {keys:?}"
    );
    let uuid = uuid::Uuid::parse_str(&keys[0]).expect("the idempotency key is a UUID");
    assert_eq!(uuid.get_version_num(), 7);
}

#[tokio::test]
async fn unavailable_is_retried_and_every_retry_reuses_the_idempotency_key() {
    let server = spawn_fake_server().await;
    let client = connect(&server).await;
    server.node.fail_next_adds(2, Code::Unavailable);

    let outcome = client.add("post:1:likes", 1).await.unwrap();

    assert_eq!(outcome.value, 1);
    assert!(!outcome.duplicate);
    assert_eq!(server.node.add_requests(), 3, "two failures, then success");
    assert_all_equal_uuid_v7(&server.node.seen_keys());
    server.shutdown();
}

#[tokio::test]
async fn every_transient_code_is_retried() {
    for code in [
        Code::Unavailable,
        Code::DeadlineExceeded,
        Code::Cancelled,
        Code::ResourceExhausted,
        Code::Aborted,
    ] {
        let server = spawn_fake_server().await;
        let client = connect(&server).await;
        server.node.fail_next_adds(1, code);
        let outcome = client.add("k", 5).await;
        assert_eq!(outcome.unwrap().value, 5, "{code:?}");
        assert_eq!(
            server.node.add_requests(),
            2,
            "{code:?} should be retried once"
        );
        server.shutdown();
    }
}

#[tokio::test]
async fn invalid_argument_and_other_permanent_codes_are_not_retried() {
    for code in [
        Code::InvalidArgument,
        Code::OutOfRange,
        Code::FailedPrecondition,
        Code::NotFound,
        Code::Unauthenticated,
        Code::PermissionDenied,
        Code::Internal,
    ] {
        let server = spawn_fake_server().await;
        let client = connect(&server).await;
        server.node.fail_next_adds(1, code);
        let error = client.add("k", 1).await.unwrap_err();
        assert_eq!(error.code(), Some(code));
        assert!(!error.is_transient(), "{code:?}");
        assert_eq!(
            server.node.add_requests(),
            1,
            "{code:?} must not be retried"
        );
        server.shutdown();
    }
}

#[tokio::test]
async fn invalid_argument_from_the_server_reads_as_invalid_argument() {
    let server = spawn_fake_server().await;
    let client = connect(&server).await;
    server.node.fail_next_adds(1, Code::InvalidArgument);
    let error = client.add("k", 1).await.unwrap_err();
    assert!(matches!(&error, Error::InvalidArgument(message) if message == "injected failure"));
    server.shutdown();
}

#[tokio::test]
async fn retries_stop_after_max_retries_with_one_key_throughout() {
    let server = spawn_fake_server().await;
    let client = connect(&server).await;
    server.node.fail_next_adds(100, Code::Unavailable);

    let error = client.add("k", 1).await.unwrap_err();

    assert!(
        matches!(error, Error::Unavailable { attempts: 4, .. }),
        "{error:?}"
    );
    assert!(error.is_transient());
    assert_eq!(server.node.add_requests(), 4, "one send and three retries");
    assert_all_equal_uuid_v7(&server.node.seen_keys());
    server.shutdown();
}

#[tokio::test]
async fn separate_adds_get_separate_keys_and_a_repeated_key_is_a_duplicate() {
    let server = spawn_fake_server().await;
    let client = connect(&server).await;

    client.add("k", 1).await.unwrap();
    client.add("k", 1).await.unwrap();
    let keys = server.node.seen_keys();
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[0], keys[1]);

    let first = client.add_with_key("k", 10, "order-77").await.unwrap();
    let repeat = client.add_with_key("k", 10, "order-77").await.unwrap();
    assert_eq!((first.value, first.duplicate), (12, false));
    assert_eq!((repeat.value, repeat.duplicate), (12, true));
    assert_eq!(client.get("k").await.unwrap(), 12);
    assert_eq!(server.node.seen_keys()[2..], ["order-77", "order-77"]);
    server.shutdown();
}

#[tokio::test]
async fn a_batch_retry_resends_each_item_with_its_own_key() {
    let server = spawn_fake_server().await;
    let client = connect(&server).await;
    server.node.fail_next_adds(1, Code::Unavailable);

    let results = client
        .add_batch([("a", 1), ("b", 2), ("", 3), ("a", i64::MAX)])
        .await
        .unwrap();

    assert_eq!(results[0].as_ref().unwrap().value, 1);
    assert_eq!(results[1].as_ref().unwrap().value, 2);
    assert!(
        matches!(results[2], Err(Error::InvalidArgument(_))),
        "validated locally"
    );
    assert!(
        matches!(results[3], Err(Error::OutOfRange(_))),
        "per-item server error"
    );
    let keys = server.node.seen_keys();
    assert_eq!(keys.len(), 6, "three items sent twice: {keys:?}");
    assert_eq!(keys[..3], keys[3..], "the retry reuses every item's key");
    assert!(keys[0] != keys[1] && keys[1] != keys[2] && keys[0] != keys[2]);

    let values = client
        .get_batch(["a", "b", "never-written", ""])
        .await
        .unwrap();
    assert_eq!(values[0].as_ref().unwrap(), &1);
    assert_eq!(values[1].as_ref().unwrap(), &2);
    assert_eq!(values[2].as_ref().unwrap(), &0);
    assert!(matches!(values[3], Err(Error::InvalidArgument(_))));
    server.shutdown();
}

#[tokio::test]
async fn bad_arguments_are_refused_before_anything_is_sent() {
    let server = spawn_fake_server().await;
    let client = connect(&server).await;
    for result in [
        client.add("", 1).await,
        client.add(&"k".repeat(257), 1).await,
        client.add("k", 0).await,
        client.add_with_key("k", 1, "").await,
    ] {
        assert!(
            matches!(result, Err(Error::InvalidArgument(_))),
            "{result:?}"
        );
    }
    assert_eq!(server.node.add_requests(), 0);
    server.shutdown();
}

#[tokio::test]
async fn a_slow_node_yields_a_timeout_within_the_deadline() {
    let server = spawn_fake_server().await;
    let client = quick_config()
        .with_deadline(Duration::from_millis(200))
        .connect(server.endpoint())
        .await
        .unwrap();
    server.node.state().add_delay = Duration::from_secs(5);

    let started = std::time::Instant::now();
    let error = client.add("k", 1).await.unwrap_err();

    assert!(matches!(error, Error::Timeout { .. }), "{error:?}");
    assert!(error.is_transient());
    assert!(
        // The fake node answers after 5 s or more: well under that means the deadline
        // ended the call (a loose bound, for a noisy shared machine).
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
    server.shutdown();
}

#[tokio::test]
async fn an_unreachable_node_is_unavailable_after_the_retries() {
    let endpoint = unused_endpoint().await;
    let client = quick_config().connect_lazy(endpoint).unwrap();
    let error = client.add("k", 1).await.unwrap_err();
    match &error {
        Error::Unavailable { attempts, message } => {
            assert_eq!(*attempts, 4);
            assert!(message.to_lowercase().contains("connect"), "{message}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn connecting_eagerly_to_an_unreachable_node_fails_with_connect() {
    let endpoint = unused_endpoint().await;
    let error = quick_config().connect(endpoint.clone()).await.unwrap_err();
    match &error {
        Error::Connect {
            endpoint: reported,
            message,
        } => {
            assert_eq!(reported, &endpoint);
            assert!(message.to_lowercase().contains("refused"), "{message}");
        }
        other => panic!("expected Connect, got {other:?}"),
    }
    assert!(!error.to_string().contains('\n'));
}

#[tokio::test]
async fn watch_yields_the_current_value_then_each_change() {
    use futures::StreamExt;

    let server = spawn_fake_server().await;
    let client = connect(&server).await;
    client.add("k", 40).await.unwrap();
    let values: Vec<i64> = client
        .watch("k")
        .await
        .unwrap()
        .map(|value| value.unwrap())
        .collect()
        .await;
    assert_eq!(values, [40, 41, 42]);
    server.shutdown();
}

#[tokio::test]
async fn status_maps_the_admin_answer() {
    let server = spawn_fake_server().await;
    let client = connect(&server).await;
    let status = client.status().await.unwrap();
    assert_eq!(status.cluster_id, "fake");
    assert_eq!(status.node.node_name, "n1");
    assert_eq!(status.members[0].replica_hex(), "ffffffffffffffff");
    assert_eq!(
        status.members[0].since_last_sync,
        Some(Duration::from_millis(250))
    );
    assert!(status.converged);
    server.shutdown();
}
