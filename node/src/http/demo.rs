//! The like-button page, `/demo/{key}` (`demo.html`): a post as one person
//! sees it, the seed's "a like is two facts" made visible.
//!
//! - The heart is exact per person: the page's person (typed or chosen) is a
//!   member of the like set `{key}`; a tap likes or unlikes through
//!   `PUT`/`DELETE /v1/likes/{key}/members/{person}`, a double tap on the
//!   post only likes, and the heart fills from `GET .../members/{person}` on
//!   load and when the person changes.
//! - The count is the set's, compact ("40.2K"), live over
//!   `/v1/likes/{key}/events` ([`super::like_events`]) with every region's
//!   likes as they replicate here.
//! - "seen by N": each page view observes the person in the uniques key
//!   `{key}:seen`, and the page reads its estimate back.
//! - One line says where a like goes: committed in this node's region,
//!   carried to the other regions by replication.
//!
//! The page reads the key from its own path, so nothing of the request is
//! written into the HTML; the one line rendered here holds the node's and
//! the regions' names, escaped.

use axum::extract::State;
use axum::response::{Html, IntoResponse, Response};

use super::extract::CounterKey;
use super::status_page::escape;
use super::HttpState;

/// The page, with `{{where}}` for the line [`where_line`] renders.
const PAGE: &str = include_str!("demo.html");

/// Where a like made on `node` (of `region`) goes; `others` are the other
/// regions this node knows of.
pub fn where_line(node: &str, region: &str, others: &[String]) -> String {
    let here = format!(
        "A like made on this page is committed in {} (node {}) before the heart answers",
        escape(region),
        escape(node)
    );
    let elsewhere = match others {
        [] => "; no other region has joined yet.".to_string(),
        [one] => format!(" and reaches {} by replication.", escape(one)),
        [first @ .., last] => format!(
            " and reaches {} and {} by replication.",
            first
                .iter()
                .map(|r| escape(r))
                .collect::<Vec<_>>()
                .join(", "),
            escape(last)
        ),
    };
    format!("{here}{elsewhere} The count and \u{201c}seen by\u{201d} add up every region's.")
}

/// The page for this node.
pub fn render(node: &str, region: &str, others: &[String]) -> String {
    PAGE.replace("{{where}}", &where_line(node, region, others))
}

/// `GET /demo/{key}`: the key is only checked here (a bad one is a 400).
pub async fn page(State(state): State<HttpState>, CounterKey(_key): CounterKey) -> Response {
    let status = crate::api::admin::status(&state.engine, &state.info);
    let own = status.self_.unwrap_or_default();
    let mut others: Vec<String> = status
        .members
        .iter()
        .map(|member| member.region.clone())
        .filter(|region| *region != own.region && !region.is_empty())
        .collect();
    others.sort();
    others.dedup();
    Html(render(&own.node_name, &own.region, &others)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_says_where_a_like_goes_in_escaped_names() {
        let page = render("eu-<1>", "eu", &["ap".into(), "us".into()]);
        assert!(!page.contains("{{where}}"));
        assert!(
            page.contains("committed in eu (node eu-&lt;1&gt;)"),
            "{page}"
        );
        assert!(page.contains("reaches ap and us by replication"));
        assert!(where_line("a", "eu", &["us".into()]).contains("reaches us by replication"));
        assert!(where_line("a", "eu", &[]).contains("no other region has joined yet"));
        let three = where_line("a", "eu", &["ap".into(), "sa".into(), "us".into()]);
        assert!(three.contains("reaches ap, sa and us by"), "{three}");
    }
}
