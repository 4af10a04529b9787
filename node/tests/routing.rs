//! Routing in a partitioned region over real node processes (issue 11,
//! items 3 and 7): a region of three nodes (and a second region of one),
//! P = 16, RF = 2. Adds and reads sent to any node are served by the key's
//! first live owner: a key written through a non-owner has a slot of its
//! owner only (and is stored only by its owners), a read through any node
//! answers the owner's value, a batch
//! spanning owners is answered per item in order, a non-owner's answer
//! names the owner, the routing client sends every key straight to its
//! owner (no node forwards), and a killed owner fails over to the next one
//! with nothing lost or counted twice.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{start_seeded, NodeProcess, NodeSpec};
use tally_client::{Client, PartitionMap};
use tally_proto::partition::PartitionCount;
use tally_proto::v1 as pb;
use tally_proto::v1::counters_client::CountersClient;

const LIMIT: Duration = Duration::from_secs(60);
const KEYS: usize = 48;

fn spec(root: &std::path::Path, region: &str, name: &str) -> NodeSpec {
    let mut spec = common::partitioned_spec(root, region, name, 16, 2);
    // Sync rarely, so that a read through a non-owner that is not forwarded
    // would miss the owner's adds (and a non-owner's slot would show).
    spec.sync_interval = "3s";
    spec
}

fn key(i: usize) -> String {
    format!("post:{i}")
}

/// The map of `eu` once every eu node serves it with three live, active nodes.
async fn settled_map(nodes: &[&NodeProcess]) -> PartitionMap {
    let endpoints: Vec<String> = nodes.iter().map(|node| node.endpoint()).collect();
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let mut maps = Vec::new();
        for endpoint in &endpoints {
            if let Ok(client) = Client::connect(endpoint.clone()).await {
                if let Ok(map) = client.partition_map(Some("eu")).await {
                    maps.push(map);
                }
            }
        }
        let ready = maps.len() == endpoints.len()
            && maps.iter().all(|map| {
                map.owners == maps[0].owners
                    && map.nodes.len() == 3
                    && map
                        .nodes
                        .iter()
                        .all(|node| node.state == "active" && node.alive)
            });
        if ready {
            // The routes follow the map in the same keeper round; give
            // every node one more round.
            tokio::time::sleep(Duration::from_millis(500)).await;
            return maps.swap_remove(0);
        }
        assert!(tokio::time::Instant::now() < deadline, "no settled map");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each key's owners in `eu`, first owner first.
fn owners_of(map: &PartitionMap, key: &str) -> Vec<String> {
    let count = PartitionCount::new(u64::from(map.partitions)).unwrap();
    map.owners_of(count.of_key(key.as_bytes()).0)
        .into_iter()
        .map(String::from)
        .collect()
}

fn replica_of(map: &PartitionMap, name: &str) -> u64 {
    map.nodes
        .iter()
        .find(|node| node.node_name == name)
        .unwrap()
        .replica
}

async fn counters(endpoint: &str) -> CountersClient<tonic::transport::Channel> {
    CountersClient::connect(endpoint.to_string()).await.unwrap()
}

/// Per counter, its slots (replica -> p).
type Slots = BTreeMap<String, BTreeMap<u64, u64>>;

/// Waits until the slots the node at `endpoint` holds pass `check`.
async fn wait_slots(endpoint: &str, what: &str, check: impl Fn(&Slots) -> bool) -> Slots {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let held = slots(endpoint).await;
        if check(&held) {
            return held;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{endpoint}: {what}: not reached; slots {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every counter's slots as the node at `endpoint` holds them.
async fn slots(endpoint: &str) -> Slots {
    let mut slots = BTreeMap::new();
    for counter in common::stored_counters(endpoint).await {
        let entry: &mut BTreeMap<u64, u64> = slots
            .entry(String::from_utf8(counter.key.to_vec()).unwrap())
            .or_default();
        for slot in counter.slots {
            entry.insert(slot.replica, slot.p);
        }
    }
    slots
}

fn forwarded_count(node: &NodeProcess, outcome: &str) -> u64 {
    let metrics = common::http_get(node.spec.http, "/metrics").unwrap().1;
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("tally_forwarded_requests_total{")
                && line.contains(&format!("outcome=\"{outcome}\""))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Posts a batch of one item per key (`item` writes it) to `path`, whose
/// list is `field`; returns each item's value, in order.
fn http_batch(
    api: &common::http::Api,
    path: &str,
    field: &str,
    item: impl Fn(&str) -> String,
) -> Vec<serde_json::Value> {
    let items: Vec<String> = (0..KEYS).map(|i| item(&key(i))).collect();
    let reply = api.post(path, &format!("{{\"{field}\": [{}]}}", items.join(",")));
    assert_eq!(reply.status, 200, "{reply:?}");
    let results = reply.json()["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), KEYS, "{results:?}");
    results
        .iter()
        .map(|result| result["ok"]["value"].clone())
        .collect()
}

/// The next value of a watch stream.
async fn next_watched(watch: &mut tonic::Streaming<pb::WatchEvent>) -> i64 {
    tokio::time::timeout(LIMIT, watch.message())
        .await
        .expect("a watched value in time")
        .expect("the watch stream")
        .expect("an open watch stream")
        .value
}

async fn add(
    client: &mut CountersClient<tonic::transport::Channel>,
    key: &str,
    idempotency_key: &str,
) -> Result<tonic::Response<pb::AddResponse>, tonic::Status> {
    client.add(common::add_one(key, idempotency_key)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_node_serves_any_key_through_its_first_live_owner() {
    let root = tempfile::tempdir().unwrap();
    let specs = vec![
        spec(root.path(), "eu", "eu-1"),
        spec(root.path(), "eu", "eu-2"),
        spec(root.path(), "eu", "eu-3"),
        spec(root.path(), "us", "us-1"),
    ];
    let mut nodes = tokio::task::spawn_blocking(move || start_seeded(specs))
        .await
        .unwrap();
    let eu: Vec<&NodeProcess> = nodes[..3].iter().collect();
    let map = settled_map(&eu).await;
    let names = ["eu-1", "eu-2", "eu-3"];
    let endpoints: Vec<String> = eu.iter().map(|node| node.endpoint()).collect();

    // 1. Every key is added once through every eu node. A non-owner's
    // answer names the owner; the owner's names no one.
    for (node, endpoint) in names.iter().zip(&endpoints) {
        let mut client = counters(endpoint).await;
        for i in 0..KEYS {
            let key = key(i);
            let answer = add(&mut client, &key, &format!("{key}-{node}"))
                .await
                .unwrap();
            let owner = &owners_of(&map, &key)[0];
            let hint = answer
                .metadata()
                .get("tally-owner")
                .map(|value| value.to_str().unwrap().to_string());
            if owner == node {
                assert_eq!(hint, None, "{key} through its owner {node}");
            } else {
                assert_eq!(
                    hint.as_deref(),
                    Some(owner.as_str()),
                    "{key} through {node}"
                );
            }
        }
    }

    // 2. Read-your-writes through any node: each read answers the owner's
    // value, 3, at once (the nodes sync only every 3 s).
    for endpoint in &endpoints {
        let mut client = counters(endpoint).await;
        for i in 0..KEYS {
            let value = client
                .get(pb::GetRequest {
                    key: key(i).into_bytes().into(),
                    breakdown: true,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .value;
            assert_eq!(value, 3, "{} through {endpoint}", key(i));
        }
    }

    // 3. A batch spanning every owner, with a bad item in the middle, is
    // answered per item in order; so is a batch read.
    let mut adds: Vec<pb::AddRequest> = (0..KEYS)
        .map(|i| pb::AddRequest {
            key: key(i).into_bytes().into(),
            delta: 1,
            idempotency_key: format!("batch-{i}"),
            ..Default::default()
        })
        .collect();
    adds.insert(KEYS / 2, pb::AddRequest::default());
    let mut client = counters(&endpoints[0]).await;
    let answer = client
        .add_batch(pb::AddBatchRequest {
            adds,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(answer.metadata().get("tally-owner").is_some());
    let results = answer.into_inner().results;
    assert_eq!(results.len(), KEYS + 1);
    for (index, result) in results.into_iter().enumerate() {
        match (index.cmp(&(KEYS / 2)), result.outcome.unwrap()) {
            (std::cmp::Ordering::Equal, pb::add_result::Outcome::Error(error)) => {
                assert_eq!(error.code, tonic::Code::InvalidArgument as i32, "{error:?}")
            }
            (std::cmp::Ordering::Equal, other) => panic!("the empty key was taken: {other:?}"),
            (_, pb::add_result::Outcome::Ok(added)) => assert_eq!(added.value, 4, "item {index}"),
            (_, other) => panic!("item {index}: {other:?}"),
        }
    }
    let gets: Vec<pb::GetRequest> = (0..KEYS)
        .rev()
        .map(|i| pb::GetRequest {
            key: key(i).into_bytes().into(),
            ..Default::default()
        })
        .collect();
    let results = counters(&endpoints[1])
        .await
        .get_batch(pb::GetBatchRequest { gets })
        .await
        .unwrap()
        .into_inner()
        .results;
    for (index, result) in results.into_iter().enumerate() {
        let Some(pb::get_result::Outcome::Ok(read)) = result.outcome else {
            panic!("item {index}: {result:?}")
        };
        assert_eq!(read.key, key(KEYS - 1 - index).into_bytes(), "in order");
        assert_eq!(read.value, 4, "{index}");
    }

    // 4. Once synced, each key eu-1 owns has one eu slot there: its first
    // owner's, holding every add; a key written through a non-owner made
    // no slot there. eu-1 stores no key it does not own.
    let expected_slots = |key: &str, p: u64| -> BTreeMap<u64, u64> {
        [(replica_of(&map, &owners_of(&map, key)[0]), p)].into()
    };
    let map = &map;
    let owner_only = |node: &'static str, p: u64| {
        move |held: &Slots| {
            (0..KEYS).map(key).all(|k| {
                let owned = owners_of(map, &k).iter().any(|owner| owner == node);
                held.get(&k) == owned.then(|| expected_slots(&k, p)).as_ref()
            })
        }
    };
    wait_slots(
        &endpoints[0],
        "each key's slot on its first owner only",
        owner_only("eu-1", 4),
    )
    .await;

    // 5. The routing client (the default) sends each key straight to its
    // first owner, single adds (coalesced), batches, reads, likes and
    // observes alike: no node forwards anything.
    let forwarded_before: Vec<u64> = eu
        .iter()
        .map(|node| forwarded_count(node, "answered"))
        .collect();
    let client = Client::connect(endpoints[0].clone()).await.unwrap();
    for i in 0..KEYS {
        let added = client
            .add_with_key(&key(i), 1, &format!("routed-{i}"))
            .await
            .unwrap();
        assert_eq!(added.value, 5, "{}", key(i));
    }
    let batch = client
        .add_batch((0..KEYS).map(|i| (key(i), 1)))
        .await
        .unwrap();
    assert!(
        batch.iter().all(|added| added.as_ref().unwrap().value == 6),
        "{batch:?}"
    );
    let values = client.get_batch((0..KEYS).map(key)).await.unwrap();
    assert!(
        values.iter().all(|value| *value.as_ref().unwrap() == 6),
        "{values:?}"
    );
    assert_eq!(client.get(&key(0)).await.unwrap(), 6);
    // Like sets and uniques too (protocol version 9): likes (coalesced),
    // reads and observes of one key go to its owner. A new cluster takes
    // likes once its version rose, by itself, in its first rounds.
    let deadline = tokio::time::Instant::now() + LIMIT;
    while client.like("warm-up", "x").await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "likes never taken");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let keys: Vec<String> = (0..KEYS).map(key).collect();
    let likes = keys.iter().map(|key| client.like(key, "routed"));
    for (i, outcome) in futures::future::join_all(likes)
        .await
        .into_iter()
        .enumerate()
    {
        let outcome = outcome.unwrap();
        assert!(
            outcome.changed && outcome.count == 1,
            "{}: {outcome:?}",
            key(i)
        );
    }
    for i in 0..KEYS {
        assert_eq!(client.like_count(&key(i)).await.unwrap(), 1);
        assert_eq!(client.liked(&key(i), &["routed"]).await.unwrap(), [true]);
        assert_eq!(client.observe(&key(i), &["ann", "bob"]).await.unwrap(), 2);
        assert_eq!(client.distinct(&[key(i)]).await.unwrap(), 2);
    }
    let forwarded_after: Vec<u64> = eu
        .iter()
        .map(|node| forwarded_count(node, "answered"))
        .collect();
    assert_eq!(
        forwarded_after, forwarded_before,
        "the routing client's calls were forwarded"
    );
    drop(client);
    // Synced (before the kill below): still one slot per key, its owner's.
    wait_slots(
        &endpoints[0],
        "the routed adds in the owners' slots",
        owner_only("eu-1", 6),
    )
    .await;

    // 6. The HTTP API routes as gRPC does, and a watch through a node that
    // is not the key's first owner relays the owner's values. The watched
    // key is one eu-3 owns first (eu-3 is killed below): the event stream
    // is opened through the node that does not own it at all, the gRPC
    // watch through its second owner.
    let watched = (0..KEYS)
        .map(key)
        .find(|k| owners_of(map, k)[0] == "eu-3")
        .expect("eu-3 owns some of the keys");
    let watched_owners = owners_of(map, &watched);
    let outsider = names
        .iter()
        .position(|name| !watched_owners.iter().any(|owner| owner == name))
        .unwrap();
    let second = names
        .iter()
        .position(|name| *name == watched_owners[1])
        .unwrap();
    let apis: Vec<common::http::Api> = eu
        .iter()
        .map(|node| common::http::Api::new(node.spec.http))
        .collect();
    let events_path = format!("/v1/counters/{watched}/events");
    let events = apis[outsider].events(&events_path, &[]);
    assert_eq!(events.status, 200, "the event stream through a non-owner");
    let first = events.next_value(LIMIT).expect("a first value");
    assert_eq!(
        first.value(),
        6,
        "the owner's value, through {}",
        names[outsider]
    );
    let mut watch = counters(&endpoints[second])
        .await
        .watch(pb::WatchRequest {
            key: watched.clone().into_bytes().into(),
        })
        .await
        .expect("a watch through the second owner")
        .into_inner();
    assert_eq!(next_watched(&mut watch).await, 6);
    for index in [outsider, second] {
        let metrics = common::http_get(eu[index].spec.http, "/metrics").unwrap().1;
        assert!(
            metrics.lines().any(|line| line == "tally_watch_relays 1"),
            "{} relays one watch:\n{metrics}",
            names[index]
        );
    }
    let http_apis = apis.clone();
    let http_names = names;
    let first_owners: Vec<String> = (0..KEYS)
        .map(|i| owners_of(map, &key(i))[0].clone())
        .collect();
    tokio::task::spawn_blocking(move || {
        // Single adds through every node: each answer is the owner's value,
        // and a forwarded one names the owner.
        for (index, (api, node)) in http_apis.iter().zip(http_names).enumerate() {
            for (i, owner) in first_owners.iter().enumerate() {
                let reply = api.add(&key(i), 1, Some(&format!("http-{i}-{node}")));
                assert_eq!(reply.status, 200, "{reply:?}");
                let hint = if owner == node { "" } else { owner.as_str() };
                assert_eq!(reply.header("tally-owner"), hint, "{} via {node}", key(i));
                assert_eq!(
                    reply.json()["value"],
                    7 + index as i64,
                    "{} via {node}",
                    key(i)
                );
            }
        }
        // A batch spanning every owner, through eu-2; a read of each key
        // through every node; a batch read through eu-3.
        let added = http_batch(&http_apis[1], "/v1/batch/add", "adds", |key| {
            format!("{{\"key\": \"{key}\", \"delta\": 1}}")
        });
        assert!(added.iter().all(|value| *value == 10), "{added:?}");
        for (api, node) in http_apis.iter().zip(http_names) {
            for i in 0..KEYS {
                assert_eq!(api.value(&key(i)), 10, "{} via {node}", key(i));
            }
        }
        let read = http_batch(&http_apis[2], "/v1/batch/get", "gets", |key| {
            format!("{{\"key\": \"{key}\"}}")
        });
        assert!(read.iter().all(|value| *value == 10), "{read:?}");
        // The seed API: one increment through each node, read through each.
        for api in &http_apis {
            let reply = api.call(
                "PUT",
                "/v1/counter/",
                &[],
                Some("{\"counter_id\": \"like:routed\"}"),
            );
            assert_eq!(reply.status, 204, "{reply:?}");
        }
        for (api, node) in http_apis.iter().zip(http_names) {
            let reply = api.get("/v1/counter/?counter_id=like:routed");
            assert_eq!(
                reply.json()["value"],
                3,
                "the seed counter via {node}: {reply:?}"
            );
        }
    })
    .await
    .unwrap();
    // The watchers see the owner's value reach 10 (values are coalesced:
    // some in between may be skipped, none goes past it).
    let mut seen = first.value();
    while seen != 10 {
        seen = events
            .next_value(LIMIT)
            .expect("the owner's changes")
            .value();
        assert!(seen <= 10, "{seen}");
    }
    let mut seen = 6;
    while seen != 10 {
        seen = next_watched(&mut watch).await;
        assert!(seen <= 10, "{seen}");
    }
    // Every add above is in its owners' slots before eu-3 goes.
    for (index, node) in [(0, "eu-1"), (1, "eu-2")] {
        wait_slots(
            &endpoints[index],
            "the HTTP adds in the owners' slots",
            owner_only(node, 10),
        )
        .await;
    }

    // 7. The owner of some keys is killed. Adds through another node fail
    // over to each key's next owner at once (failure detection has not
    // seen it go yet), with idempotent retries: nothing is lost or doubled.
    let stopped = "eu-3";
    let through = 0; // eu-1
    let moved: Vec<String> = (0..KEYS)
        .map(key)
        .filter(|k| owners_of(map, k)[0] == stopped)
        .collect();
    assert!(!moved.is_empty(), "eu-3 owns some of the keys");
    let failed_over_before =
        forwarded_count(eu[through], "failed_over") + forwarded_count(eu[through], "served_here");
    // kill -9: a stop would announce the leave, and the routes would
    // move before the first add.
    nodes[2].kill9();
    let mut client = counters(&endpoints[through]).await;
    for k in &moved {
        let idempotency_key = format!("failover-{k}");
        let mut attempts = 0;
        loop {
            attempts += 1;
            match add(&mut client, k, &idempotency_key).await {
                Ok(_) => break,
                Err(status) if attempts < 20 => {
                    eprintln!("retrying {k}: {status}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(status) => panic!("{k}: {status}"),
            }
        }
        // A retry of an answered add is a duplicate: counted once.
        let again = add(&mut client, k, &idempotency_key).await.unwrap();
        assert!(again.into_inner().duplicate, "{k}");
    }
    // Failed over to eu-2, or served here when eu-1 is the next owner.
    let failed_over = forwarded_count(&nodes[0], "failed_over")
        + forwarded_count(&nodes[0], "served_here")
        - failed_over_before;
    eprintln!("measured: {failed_over} forwarded adds failed over from the stopped eu-3");
    assert!(failed_over > 0, "no add failed over from the stopped owner");
    // Every region reads the exact total (10 for each key, 11 for each key
    // of eu-3) once synced; the failed-over adds are in the second owners'
    // slots.
    // eu nodes hold the keys they own; us-1, alone in its region, all.
    let expected = |k: &str| if moved.iter().any(|m| m == k) { 11 } else { 10 };
    let holds = |node: &str, k: &str| node == "us-1" || owners_of(map, k).iter().any(|o| o == node);
    let us_1 = nodes[3].endpoint();
    for (node, endpoint) in [
        ("eu-1", &endpoints[0]),
        ("eu-2", &endpoints[1]),
        ("us-1", &us_1),
    ] {
        let held = wait_slots(endpoint, "the exact total", |held| {
            (0..KEYS).map(key).filter(|k| holds(node, k)).all(|k| {
                held.get(&k)
                    .is_some_and(|slots| slots.values().sum::<u64>() == expected(&k))
            })
        })
        .await;
        for k in moved.iter().filter(|k| holds(node, k)) {
            let second = replica_of(map, &owners_of(map, k)[1]);
            assert_eq!(held[k].get(&second), Some(&1), "{k} on its second owner");
        }
    }

    // The watches of the killed owner's key moved to its next owner: they
    // see the failed-over add.
    let mut seen = 10;
    while seen != 11 {
        seen = events
            .next_value(LIMIT)
            .expect("the next owner's value")
            .value();
        assert!(seen <= 11, "{seen}");
    }
    let mut seen = 10;
    while seen != 11 {
        seen = next_watched(&mut watch).await;
        assert!(seen <= 11, "{seen}");
    }
}
