//! Like sets and uniques in a partitioned region, over real node processes
//! (issue 14 item 5, protocol version 9): a like set or uniques key belongs
//! to its key's partition. P = 16, RF = 2, one region: eu-1 alone takes
//! likes and observes of many keys, then eu-2 and eu-3 join (a like
//! through a joiner while it copies lands on a holder), and once the map
//! settles:
//! - through every node, every like set answers its exact members and
//!   count, and `Distinct` over keys of several owners estimates their
//!   union with the same registers a sketch of the observed members has;
//! - each node answers from its own state only the keys it owns, exact,
//!   and refuses the others as not served (the set was copied to its
//!   owners, and a node that is not one neither takes nor answers it); the
//!   last joiner's delta log holds exactly the sets it owns;
//! - a `LikeBatch` over keys of every owner answers each item;
//! - eu-1 drains: its sets reach eu-2 and eu-3, which own everything then
//!   and each answer every key exactly from their own state; eu-1 deletes
//!   every set it held (its sets digest goes to that of nothing) and,
//!   gone from the map, still answers through forwarding.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{NodeProcess, NodeSpec};
use tally_client::Client;
use tally_node::crdt::{Crdt, HyperLogLog};
use tally_proto::partition::PartitionCount;
use tally_proto::v1::likes_client::LikesClient;
use tally_proto::v1::replication_client::ReplicationClient;
use tally_proto::v1::{
    like_result, DistinctRequest, LikeBatchRequest, LikeCountRequest, LikeItem, LikedRequest,
    PullRequest,
};
use tonic::{Code, Request};

const P: u64 = 16;
const RF: u32 = 2;
/// Like sets; set i has members m0 .. m(i % 5 + 1).
const SETS: usize = 40;
/// Uniques keys; key i is fed 50 members of its own and 50 shared.
const UNIQUES: usize = 8;
const LIMIT: Duration = Duration::from_secs(60);

fn spec(root: &std::path::Path, name: &str) -> NodeSpec {
    common::partitioned_spec(root, "eu", name, P as u32, RF)
}

fn set_key(i: usize) -> String {
    format!("post:{i}:likers")
}

fn uniques_key(i: usize) -> String {
    format!("post:{i}:seen")
}

fn partition_of(key: &str) -> u32 {
    PartitionCount::new(P).unwrap().of_key(key.as_bytes()).0
}

fn members_of(i: usize) -> Vec<String> {
    (0..=i % 5).map(|m| format!("m{m}")).collect()
}

fn observed_of(i: usize) -> Vec<String> {
    (0..50)
        .map(|m| format!("own-{i}-{m}"))
        .chain((0..50).map(|m| format!("shared-{m}")))
        .collect()
}

/// A request the node answers from its own state: marked as forwarded
/// already, so it never forwards it.
fn own_state<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("tally-forwarded", "the-test".parse().unwrap());
    request.set_timeout(Duration::from_secs(5));
    request
}

/// The count of set `i` as the node at `endpoint` holds it itself, or the
/// code it refuses with.
async fn own_count(endpoint: &str, i: usize) -> Result<u64, Code> {
    let mut client = LikesClient::connect(endpoint.to_string()).await.unwrap();
    let request = own_state(LikeCountRequest {
        key: set_key(i).into_bytes().into(),
    });
    client
        .like_count(request)
        .await
        .map(|answer| answer.into_inner().count)
        .map_err(|status| {
            assert!(
                status.code() != Code::Unavailable
                    || status.message().contains("does not serve partition"),
                "{status:?}"
            );
            status.code()
        })
}

/// Waits until the node at `endpoint` holds every set it owns exactly, and
/// refuses every other; `owns(key)` says which it owns.
async fn wait_for_own_sets(endpoint: &str, owns: impl Fn(&str) -> bool) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let mut wrong = Vec::new();
        for i in 0..SETS {
            let want = match owns(&set_key(i)) {
                true => Ok(members_of(i).len() as u64),
                false => Err(Code::Unavailable),
            };
            let got = own_count(endpoint, i).await;
            if got != want {
                wrong.push(format!("{}: {got:?}, want {want:?}", set_key(i)));
            }
        }
        if wrong.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{endpoint} holds its own sets wrong: {wrong:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The keys of the like sets and uniques the node at `endpoint` ever
/// committed a change of: its whole delta log, read by a raw pull from the
/// start (a caller of the newest version, with no scope).
async fn delta_log_keys(endpoint: &str) -> BTreeSet<String> {
    let mut replication = ReplicationClient::connect(endpoint.to_string())
        .await
        .unwrap()
        .max_decoding_message_size(16 << 20);
    let mut request = PullRequest {
        cluster_id: "test-cluster".into(),
        caller_replica: 77,
        max_bytes: 16 << 20,
        protocol_version: tally_node::replica::version::NEWEST,
        protocol_oldest: tally_node::replica::version::OLDEST,
        deltas_after: Some(Default::default()),
        ..Default::default()
    };
    let mut keys = BTreeSet::new();
    for _ in 0..100 {
        let mut stream = replication
            .pull(request.clone())
            .await
            .unwrap()
            .into_inner();
        let mut complete = false;
        while let Some(chunk) = stream.message().await.unwrap() {
            keys.extend(
                chunk
                    .set_deltas
                    .iter()
                    .map(|delta| String::from_utf8(delta.key.to_vec()).unwrap()),
            );
            request.after = chunk.next.or(request.after);
            request.deltas_after = chunk.deltas_next.or(request.deltas_after);
            complete = chunk.deltas_complete && chunk.complete;
        }
        if complete {
            return keys;
        }
    }
    panic!("{endpoint} never finished answering its delta log");
}

/// Checks every set and the uniques union through `endpoint`.
async fn check_through(endpoint: &str, union_digest: u64) {
    let client = common::load::quick_client(endpoint).await;
    for i in 0..SETS {
        let key = set_key(i);
        assert_eq!(
            client.like_count(&key).await.unwrap(),
            members_of(i).len() as u64,
            "{key} through {endpoint}"
        );
        let asked = ["m0", "m5", "nobody"];
        let liked = client.liked(&key, &asked).await.unwrap();
        assert_eq!(liked, [true, false, false], "{key} through {endpoint}");
        let listed = client.list_likes(&key, None, 100).await.unwrap();
        assert_eq!(listed.members, members_of(i), "{key} through {endpoint}");
    }
    let keys: Vec<String> = (0..UNIQUES).map(uniques_key).collect();
    let (estimate, digest) = client.distinct_with_digest(&keys).await.unwrap();
    assert_eq!(
        digest, union_digest,
        "the union through {endpoint} (estimate {estimate})"
    );
    // The raw call, as another node asks an owner for its registers.
    let mut raw = LikesClient::connect(endpoint.to_string()).await.unwrap();
    let answer = raw
        .distinct(DistinctRequest {
            keys: keys
                .iter()
                .map(|key| key.clone().into_bytes().into())
                .collect(),
            with_registers: true,
        })
        .await
        .unwrap()
        .into_inner();
    let registers = HyperLogLog::from_bytes(&answer.registers).unwrap();
    assert_eq!(registers.digest(), union_digest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn like_sets_and_uniques_live_with_their_partitions_and_move_with_them() {
    let root = tempfile::tempdir().unwrap();
    let first = spec(root.path(), "eu-1");
    let seed = first.gossip;
    let mut nodes = vec![NodeProcess::start_async(first).await];
    let endpoints = |nodes: &[NodeProcess]| -> Vec<String> {
        nodes.iter().map(NodeProcess::endpoint).collect()
    };
    let eu_1 = common::load::quick_client(&nodes[0].endpoint()).await;
    // A new cluster raises its cluster version by itself, in a round or two.
    let deadline = tokio::time::Instant::now() + LIMIT;
    while eu_1.like("warm-up", "x").await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "likes never taken");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..SETS {
        // All but the last member now, on eu-1 alone; m5 liked and unliked.
        let members = members_of(i);
        for member in &members[..members.len() - 1] {
            eu_1.like(&set_key(i), member).await.unwrap();
        }
        eu_1.like(&set_key(i), "m5").await.unwrap();
        eu_1.unlike(&set_key(i), "m5").await.unwrap();
    }
    let mut union = HyperLogLog::new();
    for i in 0..UNIQUES {
        let observed = observed_of(i);
        eu_1.observe(&uniques_key(i), &observed).await.unwrap();
        let mut sketch = HyperLogLog::new();
        for member in &observed {
            sketch.observe(member.as_bytes());
        }
        union.merge(&sketch);
    }

    for name in ["eu-2", "eu-3"] {
        let mut joiner = spec(root.path(), name);
        joiner.seeds = vec![seed];
        let node = NodeProcess::start_async(joiner).await;
        nodes.push(node);
    }
    // The last member of each set, through the last joiner, maybe while it
    // copies: each lands on a node that holds the set.
    let eu_3 = common::load::quick_client(&nodes[2].endpoint()).await;
    for i in 0..SETS {
        let last = members_of(i).pop().unwrap();
        let outcome = eu_3.like(&set_key(i), &last).await.unwrap();
        assert!(outcome.changed, "{}", set_key(i));
    }
    let map = common::settled_region_map(&endpoints(&nodes), 3).await;
    for endpoint in endpoints(&nodes) {
        check_through(&endpoint, union.digest()).await;
    }
    for (node, name) in nodes.iter().zip(["eu-1", "eu-2", "eu-3"]) {
        let owns = |key: &str| map.owners_of(partition_of(key)).contains(&name);
        let owned = (0..SETS).filter(|i| owns(&set_key(*i))).count();
        assert!(owned > 0 && owned < SETS, "{name} owns {owned} sets");
        wait_for_own_sets(&node.endpoint(), owns).await;
        // Nor does it estimate a uniques key it does not own.
        let mut raw = LikesClient::connect(node.endpoint()).await.unwrap();
        for i in 0..UNIQUES {
            let key = uniques_key(i);
            let answer = raw
                .distinct(own_state(DistinctRequest {
                    keys: vec![key.clone().into_bytes().into()],
                    with_registers: false,
                }))
                .await;
            assert_eq!(answer.is_ok(), owns(&key), "{name}, {key}: {answer:?}");
        }
        let refused = raw
            .liked(own_state(LikedRequest {
                key: set_key(0).into_bytes().into(),
                members: vec!["m0".into()],
            }))
            .await;
        assert_eq!(refused.is_ok(), owns(&set_key(0)), "{name}: {refused:?}");
    }

    // eu-3, which joined, copied and took only the sets of its partitions.
    let eu_3_owns = |key: &str| map.owners_of(partition_of(key)).contains(&"eu-3");
    let stored = delta_log_keys(&nodes[2].endpoint()).await;
    let strays: Vec<&String> = stored.iter().filter(|key| !eu_3_owns(key)).collect();
    assert!(
        strays.is_empty(),
        "eu-3 stores sets it does not own: {strays:?}"
    );
    assert!(
        (0..SETS).all(|i| stored.contains(&set_key(i)) == eu_3_owns(&set_key(i))),
        "eu-3 stores {stored:?}"
    );

    // One batch over every owner's sets, through eu-2: each item answered.
    let mut raw = LikesClient::connect(nodes[1].endpoint()).await.unwrap();
    let items = |unlike: bool| LikeBatchRequest {
        items: (0..SETS)
            .map(|i| LikeItem {
                key: set_key(i).into_bytes().into(),
                member: "batch".into(),
                unlike,
                idempotency_key: String::new(),
            })
            .collect(),
    };
    let results = raw
        .like_batch(items(false))
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(results.len(), SETS);
    for (i, result) in results.into_iter().enumerate() {
        let Some(like_result::Outcome::Ok(outcome)) = result.outcome else {
            panic!("{}: {result:?}", set_key(i));
        };
        assert!(outcome.changed && outcome.liked, "{}", set_key(i));
        assert_eq!(
            outcome.count,
            members_of(i).len() as u64 + 1,
            "{}",
            set_key(i)
        );
    }
    raw.like_batch(items(true)).await.unwrap();
    let eu_2 = common::load::quick_client(&nodes[1].endpoint()).await;

    // eu-1 drains: its sets reach eu-2 and eu-3, which then own and hold
    // every set, exactly; eu-1 forwards.
    eu_2.drain("eu-1").await.unwrap();
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let client = Client::connect(nodes[1].endpoint()).await.unwrap();
        let drained = client.partition_map(Some("eu")).await.is_ok_and(|map| {
            map.nodes.iter().all(|node| match node.node_name.as_str() {
                "eu-1" => node.state == "left" && node.partitions_held == 0,
                _ => node.partitions_held == P as u32 && node.partitions_releasing == 0,
            })
        });
        if drained {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "eu-1 never left");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for node in &nodes[1..] {
        wait_for_own_sets(&node.endpoint(), |_| true).await;
    }
    // eu-1 keeps nothing now: the purge deleted every set it held (its
    // sets digest, of what it stores, is that of nothing).
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let status = Client::connect(nodes[0].endpoint())
            .await
            .unwrap()
            .status()
            .await
            .unwrap();
        if status.node.sets_digest == Some(0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "eu-1 still stores sets: digest {:?}",
            status.node.sets_digest
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, metrics) = common::http_get(nodes[0].spec.http, "/metrics").unwrap();
    let purged: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("tally_purged_sets_total "))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no set purge metric:\n{metrics}"));
    assert!(
        purged >= (SETS + UNIQUES) as u64,
        "eu-1 purged {purged} sets"
    );
    for endpoint in endpoints(&nodes) {
        check_through(&endpoint, union.digest()).await;
    }
}
