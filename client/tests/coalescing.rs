//! Coalesced adds seen from a fake node's side: concurrent adds on one client
//! share an `AddBatch` call, each with its own idempotency key and its own
//! answer; a lone add is sent at once; a transient failure of a batch is
//! retried with the same keys; a caller past its deadline gets `Timeout`;
//! and the read cache shows a client its own adds.

mod fake;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use tally_client::{Client, ClientConfig, Code, Error};
use tokio::task::JoinSet;

use fake::{spawn_fake_server, FakeServerHandle};

/// Fast retries and one batch in flight, so what gathers is predictable.
fn one_in_flight() -> ClientConfig {
    ClientConfig::new()
        .with_max_retries(3)
        .with_backoff_base(Duration::from_millis(1))
        .with_backoff_max(Duration::from_millis(5))
        .with_max_batches_in_flight(1)
}

/// A client that sends every add and get as its own call.
async fn uncoalesced(server: &FakeServerHandle) -> Client {
    ClientConfig::new()
        .with_coalescing(false)
        .connect(server.endpoint())
        .await
        .unwrap()
}

/// Waits until the fake has received `count` add requests.
async fn wait_for_requests(server: &FakeServerHandle, count: u32) {
    let started = Instant::now();
    while server.node.add_requests() < count {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the fake saw {} add requests, expected {count}",
            server.node.add_requests()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Starts one add that the fake holds for `hold`, so that the adds made
/// next gather behind it; returns when the fake has it.
async fn occupy_the_only_slot(
    server: &FakeServerHandle,
    client: &Client,
    hold: Duration,
    adds: &mut JoinSet<(usize, Result<tally_client::AddOutcome, Error>)>,
) {
    server.node.state().add_delay = hold;
    let first = client.clone();
    adds.spawn(async move { (usize::MAX, first.add("warm", 1).await) });
    wait_for_requests(server, 1).await;
}

#[tokio::test]
async fn concurrent_adds_share_one_batch_and_each_gets_its_own_answer() {
    let server = spawn_fake_server().await;
    let client = one_in_flight().connect(server.endpoint()).await.unwrap();
    server
        .node
        .state()
        .values
        .insert("full".to_owned(), i64::MAX);
    let mut adds = JoinSet::new();
    occupy_the_only_slot(&server, &client, Duration::from_millis(300), &mut adds).await;

    for caller in 0..50 {
        let client = client.clone();
        adds.spawn(async move {
            let result = match caller {
                // One add that the node refuses, inside the batch.
                7 => client.add("full", 1).await,
                // One with its own idempotency key.
                8 => client.add_with_key("k", 1, "caller-8").await,
                _ => client.add("k", 1).await,
            };
            (caller, result)
        });
    }
    let mut values = HashSet::new();
    while let Some(joined) = adds.join_next().await {
        let (caller, result) = joined.unwrap();
        match caller {
            usize::MAX => assert_eq!(result.unwrap().value, 1),
            7 => assert!(matches!(result, Err(Error::OutOfRange(_))), "{result:?}"),
            _ => {
                let outcome = result.unwrap();
                assert!(!outcome.duplicate);
                assert!(values.insert(outcome.value), "each add has its own value");
            }
        }
    }
    assert_eq!(values.len(), 49);
    assert_eq!(values.iter().max(), Some(&49));

    let batches = server.node.batches();
    assert_eq!(batches.len(), 2, "the first add alone, then all the others");
    assert_eq!(batches[0].len(), 1);
    assert_eq!(batches[1].len(), 50);
    let distinct: HashSet<&String> = batches[1].iter().collect();
    assert_eq!(
        distinct.len(),
        50,
        "every add keeps its own idempotency key"
    );
    assert!(batches[1].contains(&"caller-8".to_owned()));
    assert_eq!(server.node.single_adds(), 0);
    server.shutdown();
}

#[tokio::test]
async fn a_lone_add_does_not_wait_for_the_window() {
    let server = spawn_fake_server().await;
    let client = ClientConfig::new()
        .with_coalesce_window(Duration::from_secs(30))
        .connect(server.endpoint())
        .await
        .unwrap();
    let started = Instant::now();
    for expected in 1..=5 {
        assert_eq!(client.add("k", 1).await.unwrap().value, expected);
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "five lone adds took {:?}",
        started.elapsed()
    );
    assert_eq!(
        server.node.batches().len(),
        5,
        "each went out at once, alone"
    );
    server.shutdown();
}

#[tokio::test]
async fn a_transient_batch_failure_is_retried_with_the_same_keys() {
    let server = spawn_fake_server().await;
    let client = one_in_flight().connect(server.endpoint()).await.unwrap();
    let mut adds = JoinSet::new();
    occupy_the_only_slot(&server, &client, Duration::from_millis(200), &mut adds).await;
    // The first add is already past the failure injection; the next batch
    // fails once.
    server.node.fail_next_adds(1, Code::Unavailable);
    for caller in 0..10 {
        let client = client.clone();
        adds.spawn(async move { (caller, client.add("k", 1).await) });
    }
    while let Some(joined) = adds.join_next().await {
        let (caller, result) = joined.unwrap();
        assert!(result.is_ok(), "caller {caller}: {result:?}");
    }
    let batches = server.node.batches();
    assert_eq!(batches.len(), 3, "{batches:?}");
    assert_eq!(batches[1].len(), 10);
    assert_eq!(batches[1], batches[2], "the retry resends every key");
    assert_eq!(client.get("k").await.unwrap(), 10, "applied once each");
    server.shutdown();
}

#[tokio::test]
async fn a_permanent_batch_failure_is_every_callers_error_and_not_retried() {
    let server = spawn_fake_server().await;
    let client = one_in_flight().connect(server.endpoint()).await.unwrap();
    server.node.fail_next_adds(1, Code::PermissionDenied);
    let error = client.add("k", 1).await.unwrap_err();
    assert_eq!(error.code(), Some(Code::PermissionDenied));
    assert_eq!(server.node.batches().len(), 1);
    server.shutdown();
}

#[tokio::test]
async fn callers_past_their_deadline_get_timeout_in_time() {
    let server = spawn_fake_server().await;
    let client = one_in_flight()
        .with_deadline(Duration::from_millis(300))
        .connect(server.endpoint())
        .await
        .unwrap();
    server.node.state().add_delay = Duration::from_secs(10);
    let started = Instant::now();
    let mut adds = JoinSet::new();
    for _ in 0..5 {
        let client = client.clone();
        adds.spawn(async move { client.add("k", 1).await });
    }
    while let Some(joined) = adds.join_next().await {
        let error = joined.unwrap().unwrap_err();
        assert!(matches!(error, Error::Timeout { .. }), "{error:?}");
        assert!(error.is_transient());
    }
    assert!(
        // The fake node answers after 5 s or more: well under that means the deadline
        // ended the call (a loose bound, for a noisy shared machine).
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
    // The slot frees when the abandoned call times out; later adds go through.
    server.node.state().add_delay = Duration::ZERO;
    assert!(client.add("k", 1).await.is_ok());
    server.shutdown();
}

#[tokio::test]
async fn transient_failures_until_the_deadline_end_in_an_error_within_it() {
    let server = spawn_fake_server().await;
    let client = ClientConfig::new()
        .with_deadline(Duration::from_millis(300))
        .with_max_retries(1_000)
        .with_backoff_base(Duration::from_millis(20))
        .with_backoff_max(Duration::from_millis(40))
        .connect(server.endpoint())
        .await
        .unwrap();
    server.node.fail_next_adds(u32::MAX, Code::Unavailable);
    let started = Instant::now();
    let error = client.add("k", 1).await.unwrap_err();
    // The deadline ends it either between attempts (the last failure is
    // reported) or during one (a timeout): both after several attempts.
    assert!(
        matches!(
            error,
            Error::Unavailable { attempts, .. } | Error::Timeout { attempts, .. } if attempts > 1
        ),
        "{error:?}"
    );
    // 1,000 retries with 20-40 ms back-off would take 20 s or more: the
    // 300 ms deadline cut them short (a loose bound for a noisy machine).
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    let batches = server.node.batches();
    assert!(
        batches.iter().all(|batch| batch == &batches[0]),
        "one key throughout"
    );
    server.shutdown();
}

#[tokio::test]
async fn without_coalescing_each_add_is_its_own_call() {
    let server = spawn_fake_server().await;
    let client = uncoalesced(&server).await;
    let mut adds = JoinSet::new();
    for _ in 0..20 {
        let client = client.clone();
        adds.spawn(async move { client.add("k", 1).await.unwrap() });
    }
    while adds.join_next().await.is_some() {}
    assert_eq!(server.node.single_adds(), 20);
    assert!(server.node.batches().is_empty());
    server.shutdown();
}

#[tokio::test]
async fn the_read_cache_answers_locally_and_shows_a_client_its_own_adds() {
    let server = spawn_fake_server().await;
    let client = ClientConfig::new()
        .with_read_cache(10, Duration::from_secs(60))
        .connect(server.endpoint())
        .await
        .unwrap();
    let other = Client::connect(server.endpoint()).await.unwrap();
    assert_eq!(client.get("k").await.unwrap(), 0);
    other.add("k", 5).await.unwrap();
    assert_eq!(client.get("k").await.unwrap(), 0, "cached for the TTL");
    let mine = client.add("k", 1).await.unwrap();
    assert_eq!(mine.value, 6);
    assert_eq!(client.get("k").await.unwrap(), 6, "read your own add");
    assert_eq!(
        client.get_with_breakdown("k").await.unwrap().value,
        6,
        "a breakdown always asks the node"
    );
    server.shutdown();
}

/// Waits until the fake has received `count` `GetBatch` calls.
async fn wait_for_read_batches(server: &FakeServerHandle, count: usize) {
    let started = Instant::now();
    while server.node.read_batches().len() < count {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the fake saw {} read batches, expected {count}",
            server.node.read_batches().len()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test]
async fn concurrent_gets_share_one_batch_with_each_key_once() {
    let server = spawn_fake_server().await;
    let client = one_in_flight().connect(server.endpoint()).await.unwrap();
    {
        let mut state = server.node.state();
        state.values.insert("hot".to_owned(), 40_000);
        state.values.insert("cold".to_owned(), 3);
        state.read_delay = Duration::from_millis(300);
    }
    let mut gets = JoinSet::new();
    let first = client.clone();
    gets.spawn(async move { ("warm", first.get("warm").await) });
    wait_for_read_batches(&server, 1).await;
    for caller in 0..60 {
        let client = client.clone();
        let key = if caller % 20 == 0 { "cold" } else { "hot" };
        gets.spawn(async move { (key, client.get(key).await) });
    }
    while let Some(joined) = gets.join_next().await {
        let (key, value) = joined.unwrap();
        let want = match key {
            "hot" => 40_000,
            "cold" => 3,
            _ => 0,
        };
        assert_eq!(value.unwrap(), want, "{key}");
    }
    let mut batches = server.node.read_batches();
    batches[1].sort();
    assert_eq!(
        batches,
        vec![
            vec!["warm".to_owned()],
            vec!["cold".to_owned(), "hot".to_owned()]
        ],
        "the first read alone, then one batch with each key once"
    );
    assert_eq!(server.node.state().single_gets, 0);
    server.shutdown();
}

#[tokio::test]
async fn a_get_never_joins_a_read_already_in_flight() {
    // The fake reads the value when the batch arrives and answers 300 ms
    // later. An add acknowledged meanwhile must show in a get made after it:
    // that get waits for the next batch instead of sharing the old answer.
    let server = spawn_fake_server().await;
    let client = one_in_flight().connect(server.endpoint()).await.unwrap();
    server.node.state().read_delay = Duration::from_millis(300);
    let early = client.clone();
    let early = tokio::spawn(async move { early.get("k").await });
    wait_for_read_batches(&server, 1).await;
    server.node.state().read_delay = Duration::ZERO;
    let outcome = client.add("k", 5).await.unwrap();
    assert_eq!(outcome.value, 5);
    assert_eq!(client.get("k").await.unwrap(), 5, "read after the add");
    assert_eq!(early.await.unwrap().unwrap(), 0, "read before the add");
    assert_eq!(server.node.read_batches().len(), 2);
    server.shutdown();
}

#[tokio::test]
async fn a_transient_read_batch_failure_is_retried() {
    let server = spawn_fake_server().await;
    let client = one_in_flight().connect(server.endpoint()).await.unwrap();
    server.node.state().values.insert("k".to_owned(), 9);
    server.node.state().fail_next_reads = 2;
    assert_eq!(client.get("k").await.unwrap(), 9);
    assert_eq!(
        server.node.read_batches().len(),
        3,
        "two failures, then the answer"
    );
    server.shutdown();
}

#[tokio::test]
async fn without_coalescing_each_get_is_its_own_call() {
    let server = spawn_fake_server().await;
    let client = uncoalesced(&server).await;
    let mut gets = JoinSet::new();
    for _ in 0..10 {
        let client = client.clone();
        gets.spawn(async move { client.get("k").await });
    }
    while let Some(joined) = gets.join_next().await {
        assert_eq!(joined.unwrap().unwrap(), 0);
    }
    assert_eq!(server.node.state().single_gets, 10);
    assert!(server.node.read_batches().is_empty());
    server.shutdown();
}
