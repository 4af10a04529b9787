//! `LikeBatch` and the client's coalescing of likes, over a real node
//! process (real gRPC, real sled, `sync` durability):
//!
//! - many concurrent callers on one coalescing client like, unlike and
//!   double-tap their own members while the node is killed with -9 and
//!   restarted; each caller retries a failed call until it succeeds. The
//!   count and every member come out exact, the likes went out in batches
//!   of more than one, and a second kill -9 after the last answer loses
//!   nothing (an answer comes only after its batch's commit is durable);
//! - many concurrent `liked` callers of one post get the answers for their
//!   own members, and concurrent observers of one key share calls;
//! - a raw batch answers each item in order: a bad item gets its own
//!   INVALID_ARGUMENT and changes nothing, the rest are applied; a resent
//!   batch (the same idempotency keys) is all duplicates; an oversized batch
//!   is refused whole and changes nothing.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{http_get, NodeProcess, NodeSpec};
use tally_client::{Client, ClientConfig};
use tally_proto::v1::likes_client::LikesClient;
use tally_proto::v1::{like_result, LikeBatchRequest, LikeItem};

/// The `sum` and `count` of the `tally_like_batch_items` histogram.
fn batch_items(node: &NodeProcess) -> (f64, f64) {
    let (_, text) = http_get(node.spec.http, "/metrics").unwrap();
    let value = |name: &str| {
        text.lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.rsplit(' ').next())
            .map_or(0.0, |v| v.parse().unwrap())
    };
    (
        value("tally_like_batch_items_sum"),
        value("tally_like_batch_items_count"),
    )
}

/// What caller `caller` does to its member `i`, in order: like; every third
/// member is then unliked; every fifth is then liked twice more (a double
/// tap). Returns the ops, true for like.
fn script(i: usize) -> Vec<bool> {
    let mut ops = vec![true];
    if i.is_multiple_of(3) {
        ops.push(false);
    }
    if i.is_multiple_of(5) {
        ops.extend([true, true]);
    }
    ops
}

const CALLERS: usize = 48;
const MEMBERS_PER_CALLER: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_likes_from_many_callers_with_a_kill_9_come_out_exact() {
    let root = tempfile::tempdir().unwrap();
    let mut node = tokio::task::block_in_place(|| {
        NodeProcess::start(NodeSpec::new(root.path(), "eu", "eu-1"))
    });
    let client = ClientConfig::new()
        .with_deadline(Duration::from_secs(3))
        .connect(node.endpoint())
        .await
        .unwrap();
    let key = "post:batched";
    let callers: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let client: Client = client.clone();
            tokio::spawn(async move {
                let mut failures = 0u32;
                for i in 0..MEMBERS_PER_CALLER {
                    let member = format!("c{caller:02}-m{i:02}");
                    for like in script(i) {
                        // Retried until it succeeds: the node may be down.
                        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
                        loop {
                            let outcome = match like {
                                true => client.like(key, &member).await,
                                false => client.unlike(key, &member).await,
                            };
                            match outcome {
                                Ok(outcome) => {
                                    assert_eq!(outcome.liked, like, "{member}");
                                    break;
                                }
                                Err(error) => {
                                    failures += 1;
                                    assert!(
                                        tokio::time::Instant::now() < deadline,
                                        "{member}: {error}"
                                    );
                                    tokio::time::sleep(Duration::from_millis(50)).await;
                                }
                            }
                        }
                    }
                }
                failures
            })
        })
        .collect();
    // kill -9 once some likes are in, then start it again.
    let probe = client.clone();
    let mut seen = 0;
    for _ in 0..600 {
        seen = probe.like_count(key).await.unwrap_or(0);
        if seen >= 100 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(seen >= 100, "the callers made no progress");
    tokio::task::block_in_place(|| node.kill9());
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| node.restart());
    let mut failures = 0;
    for caller in callers {
        failures += caller.await.unwrap();
    }
    assert!(
        failures > 0,
        "the kill -9 failed no call: it tested nothing"
    );

    let mut expected = BTreeMap::new();
    for caller in 0..CALLERS {
        for i in 0..MEMBERS_PER_CALLER {
            let liked = *script(i).last().unwrap();
            expected.insert(format!("c{caller:02}-m{i:02}"), liked);
        }
    }
    let liked_count = expected.values().filter(|liked| **liked).count() as u64;
    let check = |client: Client| {
        let expected = expected.clone();
        async move {
            assert_eq!(client.like_count(key).await.unwrap(), liked_count);
            let members: Vec<&String> = expected.keys().collect();
            let liked = client.liked(key, &members).await.unwrap();
            for ((member, want), got) in expected.iter().zip(liked) {
                assert_eq!(got, *want, "{member}");
            }
            let recount = client.verify_likes(key).await.unwrap();
            assert!(recount.consistent, "{recount:?}");
            assert_eq!(recount.recounted, liked_count);
        }
    };
    check(client.clone()).await;
    // The callers shared batches: more items than calls.
    let (items, batches) = batch_items(&node);
    assert!(
        batches > 0.0 && items > batches,
        "{items} items in {batches} batches"
    );
    // Everything answered was durable: a kill -9 now loses nothing.
    tokio::task::block_in_place(|| {
        node.kill9();
        node.restart();
    });
    let client = ClientConfig::new()
        .with_deadline(Duration::from_secs(3))
        .connect(node.endpoint())
        .await
        .unwrap();
    check(client).await;
    node.stop();
}

/// The `tally_set_ops_total` series of `op`.
fn set_ops(node: &NodeProcess, op: &str) -> f64 {
    let (_, text) = http_get(node.spec.http, "/metrics").unwrap();
    let series = format!("tally_set_ops_total{{op=\"{op}\"}}");
    text.lines()
        .find(|line| line.starts_with(&series))
        .and_then(|line| line.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().unwrap())
}

/// Many concurrent `liked` callers of one post on one coalescing client each
/// get the answers for their own members (in their order), and concurrent
/// observers of one key share `Observe` calls, each answered with an
/// estimate, the last one within the sketch's error of every member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_liked_and_observe_callers_each_get_their_own_answers() {
    let root = tempfile::tempdir().unwrap();
    let mut node = tokio::task::block_in_place(|| {
        NodeProcess::start(NodeSpec::new(root.path(), "eu", "eu-1"))
    });
    let client = ClientConfig::new()
        .with_deadline(Duration::from_secs(10))
        .connect(node.endpoint())
        .await
        .unwrap();
    let key = "post:asked";
    // Every third of 300 members likes the post.
    let member = |i: usize| format!("user-{i:03}");
    for i in (0..300).step_by(3) {
        client.like(key, &member(i)).await.unwrap();
    }
    let askers: Vec<_> = (0..64)
        .map(|caller| {
            let client = client.clone();
            tokio::spawn(async move {
                for round in 0..20 {
                    // Two or three members each, some asked by several callers.
                    let asked: Vec<usize> = (0..2 + (caller + round) % 2)
                        .map(|k| (caller * 7 + round * 13 + k * 101) % 300)
                        .collect();
                    let names: Vec<String> = asked.iter().map(|i| member(*i)).collect();
                    let liked = client.liked(key, &names).await.unwrap();
                    let expected: Vec<bool> = asked.iter().map(|i| i % 3 == 0).collect();
                    assert_eq!(liked, expected, "caller {caller} asked {names:?}");
                }
            })
        })
        .collect();
    for asker in askers {
        asker.await.unwrap();
    }
    let observers: Vec<_> = (0..64)
        .map(|caller| {
            let client = client.clone();
            tokio::spawn(async move {
                for round in 0..20 {
                    let viewers = [format!("viewer-{caller}-{round}")];
                    assert!(client.observe("video:seen", &viewers).await.unwrap() >= 1);
                }
            })
        })
        .collect();
    for observer in observers {
        observer.await.unwrap();
    }
    let estimate = client.distinct(&["video:seen"]).await.unwrap() as f64;
    assert!(
        (estimate - 1280.0).abs() <= 1280.0 * 0.05,
        "estimate {estimate} of 1280"
    );
    let calls = set_ops(&node, "observe");
    assert!(
        calls > 0.0 && calls < 1280.0,
        "{calls} Observe calls for 1280 observes: none shared a call"
    );
    node.stop();
}

fn item(key: &str, member: &[u8], idempotency_key: &str, unlike: bool) -> LikeItem {
    LikeItem {
        key: key.as_bytes().to_vec().into(),
        member: member.to_vec().into(),
        idempotency_key: idempotency_key.to_owned(),
        unlike,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_item_gets_its_own_error_and_the_rest_are_applied() {
    let root = tempfile::tempdir().unwrap();
    let mut node = tokio::task::block_in_place(|| {
        NodeProcess::start(NodeSpec::new(root.path(), "eu", "eu-1"))
    });
    let mut raw = LikesClient::connect(node.endpoint())
        .await
        .unwrap()
        .max_encoding_message_size(64 << 20);

    let batch = LikeBatchRequest {
        items: vec![
            item("post", b"ann", "k-ann", false),
            item("post", b"", "k-empty", false),
            item("post", b"bob", "k-bob", false),
            item("post", &[b'x'; 129], "k-long", false),
            item("", b"cy", "k-nokey", false),
            item("post", b"ann", "k-ann-2", false),
            item("post", b"dan", "k-dan", true),
            item("post", b"bob", "k-bob-off", true),
        ],
    };
    let results = raw.like_batch(batch.clone()).await.unwrap().into_inner();
    let summary: Vec<String> = results
        .results
        .iter()
        .map(|result| match &result.outcome {
            Some(like_result::Outcome::Ok(ok)) => format!(
                "ok changed={} liked={} count={} duplicate={}",
                ok.changed, ok.liked, ok.count, ok.duplicate
            ),
            Some(like_result::Outcome::Error(error)) => {
                assert_eq!(error.code, tonic::Code::InvalidArgument as i32);
                format!("error {}", error.message)
            }
            None => "none".to_owned(),
        })
        .collect();
    assert_eq!(summary.len(), 8, "{summary:?}");
    assert_eq!(
        summary[0],
        "ok changed=true liked=true count=1 duplicate=false"
    );
    assert!(
        summary[1].starts_with("error the member is empty"),
        "{summary:?}"
    );
    assert_eq!(
        summary[2],
        "ok changed=true liked=true count=2 duplicate=false"
    );
    assert!(
        summary[3].contains("129 bytes long; the limit is 128"),
        "{summary:?}"
    );
    assert!(
        summary[4].starts_with("error") && summary[4].contains("key"),
        "{summary:?}"
    );
    assert_eq!(
        summary[5],
        "ok changed=false liked=true count=2 duplicate=false"
    );
    assert_eq!(
        summary[6],
        "ok changed=false liked=false count=2 duplicate=false"
    );
    assert_eq!(
        summary[7],
        "ok changed=true liked=false count=1 duplicate=false"
    );
    let client = ClientConfig::new().connect(node.endpoint()).await.unwrap();
    assert_eq!(client.like_count("post").await.unwrap(), 1);
    assert_eq!(
        client.liked("post", &["ann", "bob", "dan"]).await.unwrap(),
        [true, false, false]
    );
    let recount = client.verify_likes("post").await.unwrap();
    assert_eq!((recount.stored, recount.scanned), (1, 2));

    // The same batch again (an answer that was lost): the good items are
    // duplicates and nothing changes, not even bob's like before his unlike.
    let again = raw.like_batch(batch).await.unwrap().into_inner();
    for index in [0, 2, 5, 6, 7] {
        match &again.results[index].outcome {
            Some(like_result::Outcome::Ok(ok)) => assert!(ok.duplicate, "item {index}"),
            other => panic!("item {index}: {other:?}"),
        }
    }
    assert_eq!(client.like_count("post").await.unwrap(), 1);
    assert_eq!(
        client.liked("post", &["ann", "bob"]).await.unwrap(),
        [true, false]
    );

    // Too many items: refused whole, nothing changed.
    let status = raw
        .like_batch(LikeBatchRequest {
            items: (0..10_001)
                .map(|i| item("post", format!("m{i}").as_bytes(), "", false))
                .collect(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("10000"), "{}", status.message());
    assert_eq!(client.like_count("post").await.unwrap(), 1);
    node.stop();
}
