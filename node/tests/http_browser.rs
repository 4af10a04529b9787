//! The like button in a real browser (issue 16, then issue 43's "a like is
//! two facts"): headless Chromium (Debian's `chromium` and
//! `chromium-driver`, driven by Selenium from PyPI) opens the node's
//! `/demo/{key}` page on a two-region cluster twice, through
//! `node/tests/python/like_button.py`: person A on region eu's page, person
//! B on region us's. A likes, B likes, A unlikes and likes again, double
//! taps count once, and a page whose person changes shows that person's
//! heart; after each step both pages show the same exact count (compact:
//! `40.2K`) and each its own person's heart. The test then checks over the
//! API, on both regions, the count and who likes it. Last, after adds on
//! eu, `status_page.py` opens eu's `/status` and sees its charts (adds per
//! second, lag per peer, commit latency) drawn with points.
//!
//! The screenshot is kept when `TALLY_SCREENSHOT_OUT` names a file (that is
//! how `docs/like-button.png` in the README was made).
//!
//! Without the browser or Selenium it prints a loud SKIPPED line and passes,
//! unless `TALLY_REQUIRE_BROWSER=1` (set by `.ci/run`, which installs them),
//! when it fails instead.

mod common;

use std::time::Duration;

use common::http::Api;
use common::python::{browser_missing, can_run, python, run_script};
use common::{wait_cluster_version, wait_until, Cluster};
use tally_proto::v1::likes_client::LikesClient;
use tally_proto::v1::{like_result, LikeBatchRequest, LikeItem};

/// The likes that came before A and B: 40,199 people, so the page shows "40.2K".
const EARLIER_LIKES: usize = 40_199;

/// Likes `key` for `members` people (`fan-0`, `fan-1`, ...) through
/// gRPC `LikeBatch`, in batches of the most a call takes.
fn like_by_fans(endpoint: String, key: &str, members: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut likes = LikesClient::connect(endpoint)
            .await
            .expect("connecting to the node")
            .max_encoding_message_size(64 << 20);
        let fans: Vec<usize> = (0..members).collect();
        for chunk in fans.chunks(10_000) {
            let items = chunk
                .iter()
                .map(|fan| LikeItem {
                    key: key.as_bytes().to_vec().into(),
                    member: format!("fan-{fan}").into_bytes().into(),
                    idempotency_key: String::new(),
                    unlike: false,
                })
                .collect();
            let answer = likes
                .like_batch(LikeBatchRequest { items })
                .await
                .expect("a like batch")
                .into_inner();
            for result in answer.results {
                assert!(
                    matches!(result.outcome, Some(like_result::Outcome::Ok(_))),
                    "{result:?}"
                );
            }
        }
    });
}

/// Whether `member` likes the set, on the node behind `api`.
fn likes(api: &Api, path_key: &str, member: &str) -> bool {
    let reply = api.get(&format!("/v1/likes/{path_key}/members/{member}"));
    assert!(matches!(reply.status, 200 | 404), "{reply:?}");
    reply.status == 200
}

fn count(api: &Api, path_key: &str) -> u64 {
    let reply = api.get(&format!("/v1/likes/{path_key}"));
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.json()["count"].as_u64().expect("a count")
}

#[test]
fn two_people_in_two_regions_like_and_unlike_exactly() {
    let python = python("TALLY_HTTP_PYTHON");
    if !can_run(
        "two_people_in_two_regions_like_and_unlike_exactly",
        browser_missing(&python),
        "TALLY_REQUIRE_BROWSER",
    ) {
        return;
    }
    let cluster = Cluster::start(&[("eu", 1), ("us", 1)], "sync");
    let eu = Api::new(cluster.nodes[0].spec.http);
    let us = Api::new(cluster.nodes[1].spec.http);
    let key = "post/42";
    let path_key = "post%2F42";
    // Like sets need cluster version 3, which a new cluster reaches once its
    // nodes have met.
    wait_cluster_version(&cluster.endpoints(), 3, Duration::from_secs(30));
    like_by_fans(cluster.nodes[0].endpoint(), key, EARLIER_LIKES);
    let earlier = EARLIER_LIKES as u64;
    wait_until(
        Duration::from_secs(30),
        "us to hold the earlier likes",
        || (count(&us, path_key) == earlier).then_some(()),
    );
    let screenshot = cluster.root.path().join("like-button.png");
    let page = |node: usize, person: &str| {
        format!(
            "http://{}/demo/{path_key}#person={person}",
            cluster.nodes[node].spec.http
        )
    };
    run_script(
        &python,
        "like_button.py",
        &[
            page(0, "ana"),
            page(1, "bo"),
            earlier.to_string(),
            screenshot.display().to_string(),
        ],
    );
    // ana (A) and bo (B) like it, cy (B's page for a moment) does not: the
    // API agrees on both regions.
    for api in [&eu, &us] {
        wait_until(Duration::from_secs(20), "both regions agree", || {
            (count(api, path_key) == earlier + 2).then_some(())
        });
        assert!(likes(api, path_key, "ana") && likes(api, path_key, "bo"));
        assert!(!likes(api, path_key, "cy"));
    }
    // Adds on eu: its status page charts them (and the lag behind us, and
    // its commits' latency) within a few one-second samples.
    for _ in 0..50 {
        assert_eq!(eu.add("views", 1, None).status, 200);
    }
    run_script(
        &python,
        "status_page.py",
        &[format!("http://{}/status", cluster.nodes[0].spec.http)],
    );
    let png = std::fs::read(&screenshot).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    if let Ok(keep) = std::env::var("TALLY_SCREENSHOT_OUT") {
        std::fs::copy(&screenshot, &keep).expect("copying the screenshot");
    }
}
