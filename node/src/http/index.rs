//! `GET /` on the HTTP port: a small HTML page linking what the port serves
//! (the status page, the OpenAPI document, the like-button demo, the
//! metrics, the probes) and naming the gRPC address, which is a different
//! port. A newcomer who opens the HTTP port in a browser lands here instead
//! of on a JSON 404.
//!
//! The page is open, as the OpenAPI document is: it holds links and the
//! node's name and gRPC address (both escaped), nothing else.

use crate::api::NodeInfo;

use super::status_page::escape;

/// The like set the demo link shows: the README's first like
/// (`tally like post:1 sam`) is on it, and its "seen by" is the uniques key
/// `post:1:seen`.
pub const DEMO_KEY: &str = "post:1";

/// The index page of a node.
pub fn render(info: &NodeInfo) -> String {
    let node = escape(&info.node_name);
    let grpc = escape(&info.grpc_addr);
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Tally node {node}</title>
<style>
  body {{ font-family: system-ui, sans-serif; max-width: 40rem; margin: 2rem auto; padding: 0 1rem; color: #222; }}
  li {{ margin: .4rem 0; }}
  code {{ background: #f2f2f2; padding: 0 .2rem; }}
</style>
</head>
<body>
<h1>Tally node {node}</h1>
<p>This is the node's HTTP port: the JSON API under <code>/v1/</code> and the pages below.</p>
<ul>
  <li><a href="/status">/status</a>: members, sync, convergence, partitions, hot keys (<a href="/status.json">/status.json</a>)</li>
  <li><a href="/v1/openapi.json">/v1/openapi.json</a>: the JSON API, as an OpenAPI document</li>
  <li><a href="/demo/{DEMO_KEY}">/demo/{DEMO_KEY}</a>: a live like button for the like set <code>{DEMO_KEY}</code></li>
  <li><a href="/metrics">/metrics</a>: Prometheus metrics</li>
  <li><a href="/healthz">/healthz</a> and <a href="/readyz">/readyz</a>: probes</li>
</ul>
<p>gRPC (the <code>tally</code> command line and the client library) is a different port:
<code>tally --endpoint http://{grpc} status</code>.</p>
</body>
</html>
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_links_every_page_and_escapes_what_it_shows() {
        let page = render(&NodeInfo {
            cluster_id: "c".into(),
            node_name: "eu-<1>".into(),
            grpc_addr: "127.0.0.1:7100".into(),
            gossip_addr: "127.0.0.1:7101".into(),
            protocol_newest: 12,
        });
        for link in [
            "href=\"/status\"",
            "href=\"/v1/openapi.json\"",
            "href=\"/demo/post:1\"",
            "href=\"/metrics\"",
        ] {
            assert!(page.contains(link), "{link} missing");
        }
        assert!(page.contains("eu-&lt;1&gt;") && !page.contains("eu-<1>"));
        assert!(page.contains("http://127.0.0.1:7100"));
    }
}
