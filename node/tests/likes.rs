//! Like sets and uniques over real node processes (issue 14, "Done means"):
//! three regions, one node each, real gRPC, real sled.
//!
//! - the same member likes in all three regions at once: the count is 1 everywhere;
//! - 1,000 members like and 300 unlike, with double taps, retries on another
//!   region and a kill -9 of one region in the middle: every region agrees on
//!   exactly 700, on each member, and its count matches a recount;
//! - a uniques key fed 100,000 distinct members across the regions estimates
//!   within 2% everywhere, with identical registers (digest);
//! - the sets digest `tally status` compares agrees across the regions
//!   once they hold the same like sets and uniques, and differs while one
//!   region is cut off from a like (its counter digest still agreeing);
//! - bad input (before cluster version 3, empty or long members, 10^6 members
//!   in one call, foreign or garbage page tokens, an unlike flood) is refused
//!   or changes nothing.

mod common;

use std::time::Duration;

use common::{cli, wait_until, NodeProcess, NodeSpec};
use tally_client::{Client, ClientConfig};
use tally_proto::v1::likes_client::LikesClient;

fn start_regions(root: &std::path::Path) -> Vec<NodeProcess> {
    let mut nodes: Vec<NodeProcess> = Vec::new();
    for region in ["eu", "us", "ap"] {
        let mut spec = NodeSpec::new(root, region, &format!("{region}-1"));
        if let Some(first) = nodes.first() {
            spec.seeds = vec![first.spec.gossip];
        }
        nodes.push(NodeProcess::start(spec));
    }
    nodes
}

/// Waits until every node takes likes.
fn wait_for_likes(nodes: &[NodeProcess]) {
    for node in nodes {
        wait_until(Duration::from_secs(30), "likes accepted", || {
            let (code, _, _) = cli(&node.endpoint(), &["like", "warm-up", "x"]);
            (code == 0).then_some(())
        });
    }
}

async fn client(node: &NodeProcess) -> Client {
    ClientConfig::new()
        .with_deadline(Duration::from_secs(3))
        .connect(node.endpoint())
        .await
        .unwrap()
}

async fn clients(nodes: &[NodeProcess]) -> Vec<Client> {
    let mut out = Vec::new();
    for node in nodes {
        out.push(client(node).await);
    }
    out
}

/// Waits (bounded) until every client answers `count` for `key`.
async fn wait_count(clients: &[Client], key: &str, count: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut counts = Vec::new();
        for client in clients {
            counts.push(client.like_count(key).await.ok());
        }
        if counts.iter().all(|c| *c == Some(count)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "regions did not agree on {count} for {key}: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_regions_agree_on_every_member_the_count_and_the_uniques() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = tokio::task::block_in_place(|| start_regions(root.path()));
    tokio::task::block_in_place(|| wait_for_likes(&nodes));
    let mut regions = clients(&nodes).await;

    // The same member likes in all three regions at once.
    let together = futures::future::join_all(regions.iter().map(|c| c.like("post:same", "sam")));
    for outcome in together.await {
        let outcome = outcome.unwrap();
        // Each region raised the member's causal length from 0 to 1 (or
        // had merged another region's 1 first: then nothing changed).
        assert!(outcome.liked && outcome.length == 1, "{outcome:?}");
    }
    wait_count(&regions, "post:same", 1).await;

    // 1,000 members like, round-robin over the regions, each liked twice
    // (a double tap, on another region): the second changes nothing or,
    // if the first had not arrived yet, is the first.
    let key = "post:hot";
    for i in 0..1000usize {
        let member = format!("user-{i:04}");
        if i == 500 {
            // kill -9 of us in the middle; its members go to the others.
            tokio::task::block_in_place(|| nodes[1].kill9());
        }
        let alive: Vec<usize> = if (500..800).contains(&i) {
            vec![0, 2]
        } else {
            vec![0, 1, 2]
        };
        let first = alive[i % alive.len()];
        let second = alive[(i + 1) % alive.len()];
        regions[first].like(key, &member).await.unwrap();
        regions[second].like(key, &member).await.unwrap();
        if i == 800 {
            tokio::task::block_in_place(|| nodes[1].restart());
            regions[1] = client(&nodes[1]).await;
        }
    }
    // 300 unlike, each sent twice (a retry on another region).
    for i in 0..300usize {
        let member = format!("user-{i:04}");
        regions[i % 3].unlike(key, &member).await.unwrap();
        regions[(i + 2) % 3].unlike(key, &member).await.unwrap();
    }
    wait_count(&regions, key, 700).await;
    let members: Vec<String> = (0..1000).map(|i| format!("user-{i:04}")).collect();
    for (region, client) in regions.iter().enumerate() {
        let liked = client.liked(key, &members).await.unwrap();
        for (i, liked) in liked.iter().enumerate() {
            assert_eq!(*liked, i >= 300, "region {region}, member {i}");
        }
        let recount = client.verify_likes(key).await.unwrap();
        assert!(recount.consistent, "region {region}: {recount:?}");
        assert_eq!(recount.recounted, 700);
        // The listing pages through exactly the liked members, in order.
        let mut listed = Vec::new();
        let mut token = None;
        loop {
            let page = client.list_likes(key, token.as_deref(), 256).await.unwrap();
            listed.extend(page.members);
            match page.next_token {
                Some(next) => token = Some(next),
                None => break,
            }
        }
        assert_eq!(listed, members[300..].to_vec(), "region {region}");
    }

    // 100,000 distinct members observed across the regions, in batches.
    let seen = "video:seen";
    for batch in 0..20usize {
        let members: Vec<String> = (batch * 5000..(batch + 1) * 5000)
            .map(|i| format!("viewer-{i}"))
            .collect();
        regions[batch % 3].observe(seen, &members).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut answers = Vec::new();
        for client in &regions {
            answers.push(client.distinct_with_digest(&[seen]).await.unwrap());
        }
        if answers.iter().all(|a| *a == answers[0]) {
            let estimate = answers[0].0 as f64;
            assert!(
                (estimate - 100_000.0).abs() <= 2_000.0,
                "estimate {estimate} of 100,000"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "registers differ: {answers:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The sets digest `tally status` compares: equal once the regions hold
    // the same members and registers, and every node says converged.
    let agreed = wait_sets_digests(&regions, None).await;
    // ap cut off (frozen): a like in eu reaches us only. The counter
    // digests still agree; the sets digests say that ap is behind.
    tokio::task::block_in_place(|| nodes[2].pause());
    regions[0].like("post:cut", "kim").await.unwrap();
    let moved = wait_sets_digests(&regions[..2], Some(agreed)).await;
    let cut_off = regions[0].status().await.unwrap();
    let ap = cut_off
        .members
        .iter()
        .find(|member| member.region == "ap")
        .expect("eu knows ap");
    assert_eq!(ap.digest, cut_off.node.digest, "the counters agree");
    assert_eq!(ap.sets_digest, Some(agreed), "ap's last publication");
    assert_ne!(ap.sets_digest, Some(moved));
    // ap back: it pulls the like, and all three agree again.
    tokio::task::block_in_place(|| nodes[2].resume());
    assert_eq!(wait_sets_digests(&regions, Some(agreed)).await, moved);
    for node in nodes.iter_mut() {
        node.stop();
    }
}

/// Waits (bounded) until every client's node publishes one sets digest
/// (other than `not`), every node's status lists the same for each live
/// member and says converged; returns that digest.
async fn wait_sets_digests(clients: &[Client], not: Option<u64>) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut statuses = Vec::new();
        for client in clients {
            statuses.push(client.status().await.ok());
        }
        let own: Vec<Option<u64>> = statuses
            .iter()
            .map(|status| status.as_ref().and_then(|s| s.node.sets_digest))
            .collect();
        let agreed = own[0].filter(|digest| Some(*digest) != not);
        let everywhere = agreed.is_some()
            && own.iter().all(|digest| *digest == agreed)
            && statuses.iter().flatten().all(|status| {
                let listed = status
                    .members
                    .iter()
                    .filter(|member| clients.len() == 3 && member.alive)
                    .all(|member| member.sets_digest == agreed);
                listed && (clients.len() < 3 || status.converged)
            });
        if let (true, Some(digest)) = (everywhere, agreed) {
            return digest;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the regions' sets digests did not agree: {own:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_changes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let mut node = tokio::task::block_in_place(|| {
        NodeProcess::start(NodeSpec::new(root.path(), "eu", "eu-1"))
    });
    let client = client(&node).await;

    let mut raw = LikesClient::connect(node.endpoint())
        .await
        .unwrap()
        .max_encoding_message_size(64 << 20);
    let like = |member: &[u8]| tally_proto::v1::LikeRequest {
        key: "post".as_bytes().to_vec().into(),
        member: member.to_vec().into(),
        idempotency_key: String::new(),
    };
    for (member, words) in [
        (&b""[..], "the member is empty"),
        (&[b'x'; 129][..], "129 bytes long; the limit is 128"),
        (&[0xff][..], "not valid UTF-8"),
    ] {
        let status = raw.like(like(member)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(words), "{}", status.message());
    }
    // 10^6 members in one call: a clear error, nothing observed.
    let many = tally_proto::v1::ObserveRequest {
        key: "seen".as_bytes().to_vec().into(),
        members: (0..1_000_000u32)
            .map(|i| i.to_be_bytes().to_vec().into())
            .collect(),
    };
    let status = raw.observe(many).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("1000000 members in one call; the limit is 10000"),
        "{}",
        status.message()
    );
    assert_eq!(client.distinct(&["seen"]).await.unwrap(), 0);

    // An unlike flood of members that never liked changes nothing, writes nothing.
    for i in 0..200 {
        let outcome = client
            .unlike("post", &format!("stranger-{i}"))
            .await
            .unwrap();
        assert!(!outcome.changed && !outcome.liked);
    }
    let recount = client.verify_likes("post").await.unwrap();
    assert_eq!((recount.stored, recount.scanned), (0, 0));

    // A page token of another key, or garbage, is refused.
    for i in 0..5 {
        client.like("post", &format!("m{i}")).await.unwrap();
    }
    let page = client.list_likes("post", None, 2).await.unwrap();
    assert_eq!(page.members, ["m0", "m1"]);
    let token = page.next_token.unwrap();
    let error = client
        .list_likes("other", Some(&token), 2)
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("belongs to another key"),
        "{error}"
    );
    let error = client
        .list_likes("post", Some(b"junk"), 2)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("malformed"), "{error}");
    let next = client.list_likes("post", Some(&token), 2).await.unwrap();
    assert_eq!(next.members, ["m2", "m3"]);

    // The CLI's JSON shapes.
    let (code, stdout, _) = cli(&node.endpoint(), &["--json", "liked", "post", "m1"]);
    assert_eq!(code, 0);
    let value: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        value,
        serde_json::json!({"key": "post", "member": "m1", "liked": true})
    );
    let (_, stdout, _) = cli(&node.endpoint(), &["--json", "likes", "post"]);
    let value: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(value, serde_json::json!({"key": "post", "count": 5}));
    let (_, stdout, _) = cli(&node.endpoint(), &["observe", "seen", "a", "b"]);
    assert_eq!(stdout.trim(), "2");
    let (_, stdout, _) = cli(&node.endpoint(), &["--json", "distinct", "seen", "none"]);
    let value: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        value,
        serde_json::json!({"keys": ["seen", "none"], "estimate": 2})
    );
    let (code, stdout, _) = cli(&node.endpoint(), &["admin", "verify", "post"]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("consistent"), "{stdout}");
    node.stop();
}
