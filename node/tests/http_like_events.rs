//! A like set's live count over HTTP, and the like-button page that reads
//! it, on a two-region cluster of real `tally-node` processes:
//! `/v1/likes/{key}/events` sends the current count, then each change made
//! in either region, never a repeat for a double tap, and resumes from
//! `Last-Event-ID`; `/demo/{key}` is the seed's like button (a person's
//! membership of the like set, "seen by" from the key's uniques) and says
//! in which region a like is committed and where it is replicated.

mod common;

use std::time::Duration;

use common::http::{Api, Events};
use common::{wait_cluster_version, wait_until, Cluster};

const LIMIT: Duration = Duration::from_secs(20);

/// Waits for a `count` event carrying `count`, skipping older ones.
#[track_caller]
fn wait_for_count(events: &Events, count: u64, what: &str) {
    wait_until(LIMIT, what, || {
        events
            .next_value(Duration::from_millis(500))
            .filter(|event| event.count() == count)
    });
}

#[track_caller]
fn like(api: &Api, member: &str, method: &str) -> serde_json::Value {
    let reply = api.call(
        method,
        &format!("/v1/likes/post%2F7/members/{member}"),
        &[],
        None,
    );
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.json()
}

#[test]
fn a_like_sets_count_streams_every_regions_likes_once() {
    let cluster = Cluster::start(&[("eu", 1), ("us", 1)], "sync");
    let eu = Api::new(cluster.nodes[0].spec.http);
    let us = Api::new(cluster.nodes[1].spec.http);
    // Like sets need cluster version 3, which a new cluster reaches once its
    // nodes have met.
    wait_cluster_version(&cluster.endpoints(), 3, LIMIT);
    let events = eu.events("/v1/likes/post%2F7/events", &[]);
    assert_eq!(events.status, 200);
    assert!(events.content_type.starts_with("text/event-stream"));
    let first = events.next_value(LIMIT).expect("the current count");
    assert_eq!((first.count(), first.id.as_str()), (0, "0"), "{first:?}");
    assert!(first.data.contains("\"key\":\"post/7\""), "{first:?}");

    like(&eu, "ana", "PUT");
    wait_for_count(&events, 1, "eu's own like on its stream");
    like(&us, "bo", "PUT");
    wait_for_count(&events, 2, "us's like on eu's stream");
    // A double tap in us and a repeat in eu change nothing: no event.
    assert_eq!(like(&us, "bo", "PUT")["changed"], false);
    assert_eq!(like(&eu, "bo", "PUT")["changed"], false);
    like(&eu, "ana", "DELETE");
    let next = events.next_value(LIMIT).expect("the unlike");
    assert_eq!(next.count(), 1, "a double tap was streamed: {next:?}");

    // Resuming at the current count starts at the next change; a stale id
    // gets the current count at once.
    let resumed = eu.events("/v1/likes/post%2F7/events", &[("last-event-id", "1")]);
    like(&us, "cy", "PUT");
    wait_for_count(&resumed, 2, "the next change after a resume");
    let stale = eu.events("/v1/likes/post%2F7/events", &[("last-event-id", "0")]);
    assert_eq!(stale.next_value(LIMIT).expect("the count").count(), 2);

    // A bad key is refused before any stream opens.
    let bad = eu.get(&format!("/v1/likes/{}/events", "k".repeat(257)));
    bad.problem(400, "INVALID_ARGUMENT");
    drop(cluster);
}

#[test]
fn the_demo_page_is_a_persons_like_button_and_says_where_likes_go() {
    let cluster = Cluster::start(&[("eu", 1), ("us", 1)], "sync");
    let eu = Api::new(cluster.nodes[0].spec.http);
    // Once eu has heard of us, the page names both regions.
    let (page, _) = wait_until(LIMIT, "eu's demo page to name us", || {
        let page = eu.get("/demo/post%2F7");
        assert_eq!(page.status, 200, "{page:?}");
        page.body
            .contains("reaches us by replication")
            .then_some(page)
    });
    assert!(page.header("content-type").starts_with("text/html"));
    assert!(page.body.contains("committed in eu (node"), "{}", page.body);
    for wanted in [
        // The heart is the person's membership of the like set...
        "\"/v1/likes/\"",
        "/members/",
        "\"PUT\"",
        "\"DELETE\"",
        // ...the count is the set's, live...
        "/events",
        "\"count\"",
        // ...and each view is observed in the key's uniques.
        "\"/v1/uniques/\"",
        "\":seen\"",
    ] {
        assert!(page.body.contains(wanted), "the page lacks {wanted}");
    }
    assert!(!page.body.contains("{{where}}"));
    drop(cluster);
}
