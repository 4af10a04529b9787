//! The JSON API over real HTTP against real `tally-node` processes (issue
//! 16): every endpoint, its errors as problem documents with the gRPC code's
//! meaning (and nothing changed by a refused request), idempotency through
//! the `Idempotency-Key` header, batches, the seed design's API as its text
//! says, the event stream (coalesced, resumable, with heartbeats, and fed by
//! another region's adds), the OpenAPI document, CORS, body limits and the
//! settings' start-up errors. Tokens, the rate limit and HTTPS are in
//! `security.rs` (tokens need TLS).

mod common;

use std::time::{Duration, Instant};

use common::http::{Api, Reply};
use common::{wait_until, Cluster, NodeProcess, NodeSpec};

fn start_node(extra: &[&str]) -> (tempfile::TempDir, NodeProcess, Api) {
    start_node_with(extra, NodeProcess::start)
}

fn start_node_with(
    extra: &[&str],
    start: impl FnOnce(NodeSpec) -> NodeProcess,
) -> (tempfile::TempDir, NodeProcess, Api) {
    let root = tempfile::tempdir().unwrap();
    let mut spec = NodeSpec::new(root.path(), "eu", "http-1");
    spec.extra = extra.iter().map(|s| s.to_string()).collect();
    let node = start(spec);
    let api = Api::new(node.spec.http);
    (root, node, api)
}

#[track_caller]
fn ok(reply: &Reply) -> serde_json::Value {
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        "application/json",
        "{reply:?}"
    );
    reply.json()
}

#[test]
fn adds_and_reads_with_the_same_rules_as_grpc() {
    let (_root, node, api) = start_node(&[]);
    // A key with a slash, percent-encoded in the path.
    let added = ok(&api.add("post%2F1", 5, Some("tap-1")));
    assert_eq!(added["key"], "post/1");
    assert_eq!(added["value"], 5);
    assert_eq!(added["duplicate"], false);
    // A retry with the same Idempotency-Key is applied once.
    let retried = ok(&api.add("post%2F1", 5, Some("tap-1")));
    assert_eq!(
        (retried["value"].as_i64(), retried["duplicate"].as_bool()),
        (Some(5), Some(true))
    );
    // The same key for another add: 422, and nothing changes.
    api.add("post%2F1", 6, Some("tap-1"))
        .problem(422, "FAILED_PRECONDITION");
    assert_eq!(api.value("post%2F1"), 5);
    // An empty Idempotency-Key is none, as an empty idempotency_key in gRPC.
    ok(&api.add("post%2F1", 1, Some("")));
    ok(&api.add("post%2F1", 1, Some("")));
    assert_eq!(api.value("post%2F1"), 7);

    // Bad input: a problem with gRPC's code and message, and nothing changes.
    let zero = api.add("k", 0, None).problem(400, "INVALID_ARGUMENT");
    assert!(
        zero["detail"].as_str().unwrap().contains("delta is 0"),
        "{zero}"
    );
    let long_idempotency_key = "i".repeat(129);
    api.add("k", 1, Some(&long_idempotency_key))
        .problem(400, "INVALID_ARGUMENT");
    let key_256 = "é".repeat(128); // 256 bytes
    let encoded_256: String = key_256.bytes().map(|b| format!("%{b:02X}")).collect();
    ok(&api.add(&encoded_256, 1, None));
    let too_long = api
        .add(&format!("{encoded_256}x"), 1, None)
        .problem(400, "INVALID_ARGUMENT");
    assert!(
        too_long["detail"].as_str().unwrap().contains("257 bytes"),
        "{too_long}"
    );
    api.add("%FF", 1, None).problem(400, "INVALID_ARGUMENT");
    ok(&api.add("big", i64::MAX, None));
    let overflow = api.add("big", 1, None).problem(409, "OUT_OF_RANGE");
    assert!(
        overflow["type"]
            .as_str()
            .unwrap()
            .starts_with("urn:tally:problem:"),
        "{overflow}"
    );
    assert_eq!(api.value("big"), i64::MAX);
    for (body, status) in [
        ("{\"delta\": 1.5}", 400),
        ("{\"delta\": \"1\"}", 400),
        ("{\"delta\": 9223372036854775808}", 400),
        ("{\"delta\": 1, \"extra\": 1}", 400),
        ("{}", 400),
        ("{", 400),
        // An array of the fields in order is not the object (serde's derived
        // structs would take it as {"delta": 1}).
        ("[1]", 400),
        ("[1, null]", 400),
    ] {
        api.call("POST", "/v1/counters/k", &[], Some(body))
            .problem(status, "INVALID_ARGUMENT");
    }
    // Any JSON spelling of an integer is read exactly.
    ok(&api.call(
        "POST",
        "/v1/counters/exact",
        &[],
        Some("{\"delta\": 9007199254740993.0}"),
    ));
    ok(&api.call("POST", "/v1/counters/exact", &[], Some("{\"delta\": -1e3}")));
    assert_eq!(api.value("exact"), 9_007_199_254_740_993 - 1000);
    // Not JSON: 415.
    let reply = api.call(
        "POST",
        "/v1/counters/k",
        &[("content-type", "text/plain")],
        None,
    );
    reply.problem(415, "INVALID_ARGUMENT");
    assert_eq!(api.value("k"), 0, "a refused add changed the counter");

    // Reads: the value, and the breakdown on request.
    let read = ok(&api.get("/v1/counters/post%2F1?breakdown=true"));
    assert_eq!(read["value"], 7);
    let regions = read["regions"].as_array().expect("a breakdown");
    assert_eq!(regions.len(), 1, "{read}");
    assert_eq!(regions[0]["region"], "eu");
    assert_eq!(regions[0]["increments"], 7);
    assert_eq!(regions[0]["local"], true);
    assert!(ok(&api.get("/v1/counters/post%2F1"))
        .get("regions")
        .is_none());
    api.get("/v1/counters/k?breakdown=maybe")
        .problem(400, "INVALID_ARGUMENT");
    assert_eq!(ok(&api.get("/v1/counters/never-written"))["value"], 0);
    a_refusal_before_the_body_arrives_keeps_the_connection(node.spec.http);
    drop(node);
}

/// A request refused before its body arrived (a bad key in the path) is
/// answered once the body is read, and the connection serves the next
/// request. Before, hyper closed it without a word whenever the body came
/// after the refusal, and a keep-alive client's next request failed ("Peer
/// disconnected"): `http_api.rs` failed that way once under load.
fn a_refusal_before_the_body_arrives_keeps_the_connection(addr: std::net::SocketAddr) {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut socket = std::net::TcpStream::connect(addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let post = |key: &str| {
        format!(
            "POST /v1/counters/{key} HTTP/1.1\r\nHost: tally\r\n\
             Content-Type: application/json\r\nContent-Length: 12\r\n\r\n"
        )
    };
    let mut reader = BufReader::new(socket.try_clone().unwrap());
    let read_answer = |reader: &mut BufReader<std::net::TcpStream>| {
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().unwrap();
            }
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        status
    };
    socket.write_all(post("%FF").as_bytes()).unwrap();
    // The refusal is made from the path alone; the body comes later.
    std::thread::sleep(Duration::from_millis(300));
    socket.write_all(b"{\"delta\": 1}").unwrap();
    assert!(read_answer(&mut reader).starts_with("HTTP/1.1 400"));
    socket.write_all(post("kept-alive").as_bytes()).unwrap();
    socket.write_all(b"{\"delta\": 1}").unwrap();
    let second = read_answer(&mut reader);
    assert!(second.starts_with("HTTP/1.1 200"), "{second:?}");
}

/// A browser pointed at the HTTP port lands on an index of what it serves
/// (it used to get a JSON 404), and every link there answers.
#[test]
fn the_root_is_an_index_page_whose_links_answer() {
    let (_root, node, api) = start_node(&[]);
    let index = api.get("/");
    assert_eq!(index.status, 200, "{index:?}");
    assert!(
        index.header("content-type").starts_with("text/html"),
        "{index:?}"
    );
    let links: Vec<&str> = index
        .body
        .split("href=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .collect();
    for wanted in ["/status", "/v1/openapi.json", "/demo/post:1", "/metrics"] {
        assert!(links.contains(&wanted), "{wanted} not linked: {links:?}");
    }
    for link in &links {
        let reply = api.get(link);
        assert_eq!(reply.status, 200, "{link}: {reply:?}");
    }
    assert!(
        index.body.contains(&format!("http://{}", node.spec.grpc)),
        "names the gRPC port: {}",
        index.body
    );
}

/// A gRPC client given the HTTP port's address is told which port is
/// which: the port answers a gRPC call with a gRPC `UNIMPLEMENTED` naming
/// the gRPC address (it used to answer a JSON 404, which the client read
/// as "invalid compression flag: 123"), and the CLI says so in one line.
#[test]
fn a_grpc_call_on_the_http_port_is_told_where_grpc_is() {
    let (_root, node, api) = start_node(&[]);
    let http_endpoint = format!("http://{}", node.spec.http);
    let status = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut client =
            tally_proto::v1::counters_client::CountersClient::connect(http_endpoint.clone())
                .await
                .unwrap();
        client
            .add(common::add_one("wrong:port", "w-1"))
            .await
            .expect_err("the HTTP port serves no gRPC")
    });
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
    assert!(
        status.message().contains(&node.spec.grpc.to_string())
            && status.message().contains("HTTP port"),
        "{status:?}"
    );
    let (code, stdout, stderr) = common::cli(&http_endpoint, &["add", "wrong:port"]);
    assert_ne!(code, 0, "{stdout}");
    assert!(
        stderr.contains("this looks like Tally's HTTP port, not its gRPC port (7100 by default)")
            && stderr.contains(&node.spec.grpc.to_string()),
        "{stderr}"
    );
    assert!(!stderr.contains("outcome is unknown"), "{stderr}");
    assert_eq!(api.value("wrong%3Aport"), 0, "nothing was applied");
}

/// An HTTP client (curl, a browser) at the gRPC port is told which port is
/// which (curl used to say "Received HTTP/0.9 when not allowed"), and gRPC
/// on that port is untouched.
#[test]
fn an_http_request_on_the_grpc_port_is_told_where_http_is() {
    let (_root, node, api) = start_node(&[]);
    let (code, body) = common::http_get(node.spec.grpc, "/status").unwrap();
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("Tally's gRPC port") && body.contains(&node.spec.http.port().to_string()),
        "{body}"
    );
    // A client that writes its request in pieces gets the answer too (it
    // used to be answered and closed after the first bytes: a broken pipe).
    {
        use std::io::{Read, Write};
        let mut tcp = std::net::TcpStream::connect(node.spec.grpc).unwrap();
        tcp.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        tcp.write_all(b"GET /status HTTP/1.1\r\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        tcp.write_all(b"Host: tally\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    }
    let (code, stdout, stderr) = common::cli(&node.endpoint(), &["add", "right:port"]);
    assert_eq!((code, stdout.trim()), (0, "1"), "{stderr}");
    assert_eq!(api.value("right%3Aport"), 1);
}

/// A wrong method on a path that exists is refused like everything else:
/// a problem document (it used to be an empty 405), keeping `Allow`.
#[test]
fn a_wrong_method_is_a_problem_document_naming_the_allowed_ones() {
    let (_root, _node, api) = start_node(&[]);
    for (method, path, allowed) in [
        ("DELETE", "/status", "GET"),
        ("POST", "/v1/openapi.json", "GET"),
        ("PATCH", "/v1/counters/k", "POST"),
    ] {
        let reply = api.call(method, path, &[], None);
        let problem = reply.problem(405, "UNIMPLEMENTED");
        assert!(reply.header("allow").contains(allowed), "{reply:?}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains(method) && detail.contains(path) && detail.contains(allowed),
            "{detail}"
        );
    }
}

#[test]
fn batches_answer_per_item_and_are_bounded() {
    let (_root, node, api) = start_node(&[]);
    let reply = api.post(
        "/v1/batch/add",
        r#"{"adds": [{"key": "a", "delta": 2, "idempotency_key": "b-1"},
                     {"key": "", "delta": 1},
                     {"key": "a", "delta": 0},
                     {"key": "a", "delta": 2, "idempotency_key": "b-1"}]}"#,
    );
    let results = ok(&reply)["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), 4);
    assert_eq!(results[0]["ok"]["value"], 2);
    assert_eq!(results[1]["error"]["code"], "INVALID_ARGUMENT");
    assert_eq!(results[1]["error"]["status"], 400);
    assert_eq!(results[2]["error"]["code"], "INVALID_ARGUMENT");
    assert_eq!(results[3]["ok"]["duplicate"], true);
    assert_eq!(api.value("a"), 2);

    let reply = api.post(
        "/v1/batch/get",
        r#"{"gets": [{"key": "a", "breakdown": true}, {"key": ""}, {"key": "none"}]}"#,
    );
    let results = ok(&reply)["results"].as_array().unwrap().clone();
    assert_eq!(results[0]["ok"]["value"], 2);
    assert_eq!(results[0]["ok"]["regions"][0]["region"], "eu");
    assert_eq!(results[1]["error"]["code"], "INVALID_ARGUMENT");
    assert_eq!(results[2]["ok"]["value"], 0);

    // More than 10,000 items: refused whole, with gRPC's message.
    let items: Vec<String> = (0..10_001)
        .map(|i| format!("{{\"key\": \"k{i}\", \"delta\": 1}}"))
        .collect();
    let problem = api
        .post(
            "/v1/batch/add",
            &format!("{{\"adds\": [{}]}}", items.join(",")),
        )
        .problem(400, "INVALID_ARGUMENT");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("at most 10000"),
        "{problem}"
    );
    assert_eq!(api.value("k0"), 0);
    // A body declared over 16 MiB: 413 before a byte of it is read, and
    // the connection closed. Over a small route's 64 KiB, likewise.
    for (path, length) in [
        ("/v1/batch/add", (16 << 20) + 1),
        ("/v1/counters/k0", 65 << 10),
    ] {
        let answer = common::http::raw_exchange(
            node.spec.http,
            &format!(
                "POST {path} HTTP/1.1\r\nHost: tally\r\nContent-Type: application/json\r\n\
                 Content-Length: {length}\r\n\r\n"
            ),
            0,
        );
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer}");
        assert!(
            answer.contains("RESOURCE_EXHAUSTED") && answer.contains("connection: close"),
            "{path}: {answer}"
        );
    }
    // A body without a length is bounded as it is read: one chunk of
    // 100 KiB to a route of 64 KiB.
    let answer = common::http::raw_exchange(
        node.spec.http,
        "POST /v1/counters/k0 HTTP/1.1\r\nHost: tally\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n19000\r\n",
        100 << 10,
    );
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(api.value("k0"), 0);
    let (_, metrics) = common::http_get(node.spec.http, "/metrics").unwrap();
    assert!(
        metrics.contains("tally_refused_messages_total{reason=\"http_body_too_large\"} 3"),
        "the three bodies over their limit are counted"
    );
    drop(node);
}

/// The seed's API design, as its text gives it: "POST /v1/counter/
/// parameters: object_id ... activity_type ... return: counter_id string";
/// "PUT /v1/counter/ parameters: counter_id ... return: none"; "GET
/// /v1/counter/ parameters: counter_id string return: value integer".
#[test]
fn the_seeds_api_as_written() {
    let (_root, node, api) = start_node(&[]);
    let created = ok(&api.post(
        "/v1/counter/",
        r#"{"object_id": "dQw4w9WgXcQ", "activity_type": "view"}"#,
    ));
    let counter_id = created["counter_id"].as_str().unwrap().to_string();
    assert_eq!(
        counter_id, "view:dQw4w9WgXcQ",
        "documented as ACTIVITY_TYPE:OBJECT_ID"
    );
    let read = |id: &str| api.get(&format!("/v1/counter/?counter_id={id}"));
    assert_eq!(ok(&read(&counter_id))["value"], 0);
    let body = format!("{{\"counter_id\": \"{counter_id}\"}}");
    for _ in 0..3 {
        let put = api.call("PUT", "/v1/counter/", &[], Some(&body));
        assert_eq!(put.status, 204, "{put:?}");
        assert!(put.body.is_empty(), "return: none; got {:?}", put.body);
    }
    // A retried increment with its Idempotency-Key counts once.
    for _ in 0..2 {
        let put = api.call(
            "PUT",
            "/v1/counter/",
            &[("idempotency-key", "v-1")],
            Some(&body),
        );
        assert_eq!(put.status, 204, "{put:?}");
    }
    assert_eq!(read(&counter_id).json(), serde_json::json!({"value": 4}));
    // The counter_id is the counter's key in the rest of the API.
    assert_eq!(api.value("view:dQw4w9WgXcQ"), 4);
    // Bad parameters: 400 with the rule.
    for body in [
        r#"{"object_id": "", "activity_type": "view"}"#,
        r#"{"object_id": "a b", "activity_type": "view"}"#,
        r#"{"object_id": "x", "activity_type": "View"}"#,
        r#"{"object_id": "x", "activity_type": "a:b"}"#,
        r#"{"object_id": "x"}"#,
    ] {
        api.post("/v1/counter/", body)
            .problem(400, "INVALID_ARGUMENT");
    }
    let bad = api
        .call(
            "PUT",
            "/v1/counter/",
            &[],
            Some(r#"{"counter_id": "no-colon"}"#),
        )
        .problem(400, "INVALID_ARGUMENT");
    assert!(
        bad["detail"]
            .as_str()
            .unwrap()
            .contains("ACTIVITY_TYPE:OBJECT_ID"),
        "{bad}"
    );
    read("nope").problem(400, "INVALID_ARGUMENT");
    api.get("/v1/counter/").problem(400, "INVALID_ARGUMENT");
    drop(node);
}

#[test]
fn the_event_stream_is_coalesced_resumable_and_kept_alive() {
    let (_root, node, api) = start_node(&["--http-event-heartbeat", "200ms"]);
    ok(&api.add("live", 3, None));
    let events = api.events("/v1/counters/live/events", &[]);
    assert_eq!(events.status, 200);
    assert!(
        events.content_type.starts_with("text/event-stream"),
        "{}",
        events.content_type
    );
    let limit = Duration::from_secs(10);
    let first = events.next_value(limit).expect("the current value first");
    assert_eq!(
        (first.value(), first.id.as_str(), first.retry.as_str()),
        (3, "3", "1000")
    );
    ok(&api.add("live", 2, None));
    assert_eq!(events.next_value(limit).expect("the change").value(), 5);
    // Idle: heartbeat comments keep the stream open.
    let heartbeat = events.next(limit).expect("a heartbeat");
    assert_eq!(heartbeat.comment, "heartbeat", "{heartbeat:?}");

    // A hot key: 300 adds as fast as they go; the stream carries at most one
    // event per 100 ms (counted against the time it took to receive them,
    // which only a slower machine stretches), and ends on the last value.
    let writer = {
        let api = api.clone();
        std::thread::spawn(move || {
            for _ in 0..300 {
                assert_eq!(api.add("live", 1, None).status, 200);
            }
        })
    };
    let started = Instant::now();
    let mut received = 0;
    let mut last = 0;
    while last != 305 {
        last = events
            .next_value(limit)
            .expect("events while the key is hot")
            .value();
        received += 1;
    }
    let span = started.elapsed();
    writer.join().unwrap();
    let bound = span.as_millis() / 100 + 2;
    assert!(
        received as u128 <= bound,
        "{received} events in {span:?}: more than one per 100 ms"
    );
    assert!(
        received < 300,
        "{received} events for 300 adds: not coalesced"
    );

    // Resumption: Last-Event-ID equal to the current value skips it.
    let resumed = api.events("/v1/counters/live/events", &[("last-event-id", "305")]);
    let heartbeat = resumed
        .next(limit)
        .expect("a heartbeat, not the value again");
    assert_eq!(heartbeat.comment, "heartbeat", "{heartbeat:?}");
    ok(&api.add("live", -5, None));
    assert_eq!(
        resumed.next_value(limit).expect("the next change").value(),
        300
    );
    // Another id: the current value at once.
    let stale = api.events("/v1/counters/live/events", &[("last-event-id", "1")]);
    assert_eq!(
        stale.next_value(limit).expect("the current value").value(),
        300
    );

    // A bad key is a problem, not a stream.
    let refused = api.get("/v1/counters/%FF/events");
    refused.problem(400, "INVALID_ARGUMENT");
    drop(node);
}

#[test]
fn another_regions_add_arrives_on_the_stream() {
    let cluster = Cluster::start(&[("eu", 1), ("us", 1)], "sync");
    let eu = Api::new(cluster.nodes[0].spec.http);
    let us = Api::new(cluster.nodes[1].spec.http);
    let events = eu.events("/v1/counters/shared/events", &[]);
    let limit = Duration::from_secs(20);
    assert_eq!(
        events.next_value(limit).expect("the current value").value(),
        0
    );
    ok(&us.add("shared", 7, Some("us-1")));
    wait_until(limit, "the us add on eu's stream", || {
        events
            .next_value(Duration::from_millis(500))
            .filter(|event| event.value() == 7)
    });
    drop(cluster);
}

/// `?slots=true`: the live writers' slots and the folded base, read from
/// the state the value is read from, the same as the gRPC Get's (and so as
/// `tally get --slots --json`).
#[test]
fn slots_on_request_sum_to_the_value_and_match_the_grpc_answer() {
    let cluster = Cluster::start(&[("eu", 1), ("us", 1)], "sync");
    let eu = Api::new(cluster.nodes[0].spec.http);
    let us = Api::new(cluster.nodes[1].spec.http);
    ok(&eu.add("post%2F9", 5, None));
    ok(&eu.add("post%2F9", -2, None));
    ok(&us.add("post%2F9", 7, None));
    let (read, _) = wait_until(Duration::from_secs(30), "us's add at eu", || {
        let read = ok(&eu.get("/v1/counters/post%2F9?slots=true"));
        (read["value"] == 10).then_some(read)
    });
    assert!(read.get("regions").is_none(), "{read}");
    let slots = read["slots"].as_array().expect("slots asked for");
    let by_region = |region: &str| {
        let found: Vec<&serde_json::Value> =
            slots.iter().filter(|s| s["region"] == region).collect();
        assert_eq!(found.len(), 1, "one {region} slot: {read}");
        (found[0]["p"].as_u64(), found[0]["n"].as_u64())
    };
    assert_eq!(slots.len(), 2, "{read}");
    assert_eq!(by_region("eu"), (Some(5), Some(2)));
    assert_eq!(by_region("us"), (Some(7), Some(0)));
    let folded = &read["folded"];
    let folded_parts =
        |f: &serde_json::Value| (f["epoch"].as_u64(), f["p"].as_u64(), f["n"].as_u64());
    assert_eq!(folded_parts(folded), (Some(0), Some(0), Some(0)), "{read}");
    // The base plus every slot's p - n is the value.
    let net = |v: &serde_json::Value| v["p"].as_i64().unwrap() - v["n"].as_i64().unwrap();
    let sum: i64 = net(folded) + slots.iter().map(net).sum::<i64>();
    assert_eq!(sum, read["value"].as_i64().unwrap(), "{read}");
    // The same slots as the gRPC answer, with the replica in the text form
    // `tally status` and `tally get --slots --json` print.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (grpc, eu_id, us_id) = runtime.block_on(async {
        let eu_grpc = common::load::quick_client(&cluster.nodes[0].endpoint()).await;
        let us_grpc = common::load::quick_client(&cluster.nodes[1].endpoint()).await;
        (
            eu_grpc.get_with_slots("post/9").await.unwrap(),
            eu_grpc.status().await.unwrap().node.replica,
            us_grpc.status().await.unwrap().node.replica,
        )
    });
    assert_eq!(grpc.value, 10);
    let grpc_slots: Vec<(String, String, u64, u64)> = grpc
        .slots
        .iter()
        .map(|s| (format!("{:016x}", s.replica), s.region.clone(), s.p, s.n))
        .collect();
    let http_slots: Vec<(String, String, u64, u64)> = slots
        .iter()
        .map(|s| {
            (
                s["replica"].as_str().unwrap().to_owned(),
                s["region"].as_str().unwrap().to_owned(),
                s["p"].as_u64().unwrap(),
                s["n"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(http_slots, grpc_slots);
    let replica_of = |region: &str| {
        http_slots
            .iter()
            .find(|s| s.1 == region)
            .map(|s| s.0.clone())
            .unwrap()
    };
    assert_eq!(replica_of("eu"), format!("{eu_id:016x}"));
    assert_eq!(replica_of("us"), format!("{us_id:016x}"));
    assert_eq!(
        folded_parts(folded),
        (
            Some(grpc.folded.epoch),
            u64::try_from(grpc.folded.p).ok(),
            u64::try_from(grpc.folded.n).ok()
        )
    );
    // With the breakdown too; without `slots`, neither field.
    let both = ok(&eu.get("/v1/counters/post%2F9?breakdown=true&slots=true"));
    assert_eq!(both["regions"].as_array().map(Vec::len), Some(2), "{both}");
    assert_eq!(both["slots"], read["slots"]);
    let plain = ok(&eu.get("/v1/counters/post%2F9?slots=false"));
    assert!(plain.get("slots").is_none() && plain.get("folded").is_none());
    // A bad value is a problem that names the parameter.
    let refused = eu
        .get("/v1/counters/post%2F9?slots=maybe")
        .problem(400, "INVALID_ARGUMENT");
    assert!(
        refused["detail"].as_str().unwrap().contains("slots"),
        "{refused}"
    );
    drop(cluster);
}

#[test]
fn the_openapi_document_describes_every_route() {
    let (_root, node, api) = start_node(&[]);
    let document = ok(&api.get("/v1/openapi.json"));
    assert!(
        document["openapi"].as_str().unwrap().starts_with("3.1"),
        "{document}"
    );
    let paths = document["paths"].as_object().unwrap();
    for (path, method) in [
        ("/v1/counters/{key}", "post"),
        ("/v1/counters/{key}", "get"),
        ("/v1/counters/{key}/events", "get"),
        ("/v1/batch/add", "post"),
        ("/v1/batch/get", "post"),
        ("/v1/counter/", "post"),
        ("/v1/counter/", "put"),
        ("/v1/counter/", "get"),
    ] {
        assert!(paths[path][method].is_object(), "{method} {path} missing");
    }
    // The read's `slots` parameter and the schemas of its answer.
    let parameters = paths["/v1/counters/{key}"]["get"]["parameters"]
        .as_array()
        .unwrap();
    assert!(
        parameters
            .iter()
            .any(|p| p["name"] == "slots" && p["in"] == "query"),
        "{parameters:?}"
    );
    let schemas = &document["components"]["schemas"];
    for field in ["replica", "region", "p", "n"] {
        assert!(schemas["WriterSlot"]["properties"][field].is_object());
    }
    for field in ["epoch", "p", "n"] {
        assert!(schemas["FoldedSums"]["properties"][field].is_object());
    }
    // Anything else is a problem document too.
    api.get("/v1/nothing-here").problem(404, "NOT_FOUND");
    // Without tokens, no security scheme is required.
    assert!(
        document.get("security").is_none(),
        "{}",
        document["security"]
    );
    // The demo page.
    let page = api.get("/demo/post%2F1");
    assert_eq!(page.status, 200);
    assert!(
        page.header("content-type").starts_with("text/html"),
        "{page:?}"
    );
    assert!(
        page.body.contains("EventSource"),
        "the page follows the event stream"
    );
    drop(node);
}

#[test]
fn cors_is_off_by_default_and_allows_the_named_origins() {
    let preflight = |api: &Api, origin: &str| {
        api.call(
            "OPTIONS",
            "/v1/counters/k",
            &[
                ("origin", origin),
                ("access-control-request-method", "POST"),
                (
                    "access-control-request-headers",
                    "content-type,idempotency-key",
                ),
            ],
            None,
        )
    };
    let (_root, node, api) = start_node(&[]);
    let reply = preflight(&api, "https://app.example");
    assert_eq!(reply.header("access-control-allow-origin"), "", "{reply:?}");
    let reply = api.call(
        "GET",
        "/v1/counters/k",
        &[("origin", "https://app.example")],
        None,
    );
    assert_eq!(reply.header("access-control-allow-origin"), "");
    drop(node);

    let (_root, node, api) = start_node(&["--http-cors-origin", "https://app.example"]);
    let reply = preflight(&api, "https://app.example");
    assert_eq!(
        reply.header("access-control-allow-origin"),
        "https://app.example",
        "{reply:?}"
    );
    assert!(
        reply
            .header("access-control-allow-headers")
            .contains("idempotency-key"),
        "{reply:?}"
    );
    let reply = preflight(&api, "https://evil.example");
    assert_eq!(reply.header("access-control-allow-origin"), "", "{reply:?}");
    drop(node);
}

#[test]
fn bad_http_settings_stop_the_start_naming_the_flag() {
    let root = tempfile::tempdir().unwrap();
    let mut spec = NodeSpec::new(root.path(), "eu", "bad");
    for (extra, expected) in [
        (
            vec!["--http-cors-origin", "example.com"],
            "--http-cors-origin",
        ),
        (
            vec!["--http-cors-origin", "https://a.example/path"],
            "--http-cors-origin",
        ),
        (
            vec!["--http-tls-cert", "/nonexistent.pem"],
            "--http-tls-key",
        ),
        (
            vec![
                "--http-tls-cert",
                "/nonexistent.pem",
                "--http-tls-key",
                "/nonexistent-key.pem",
            ],
            "--http-tls-cert /nonexistent.pem",
        ),
        (
            vec!["--http-event-heartbeat", "often"],
            "--http-event-heartbeat",
        ),
    ] {
        spec.extra = extra.iter().map(|s| s.to_string()).collect();
        let output = NodeProcess::spawn_raw(&spec);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{extra:?} started");
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
    }
}

/// Like sets and uniques over JSON (issue 14's types): the same rules as
/// the gRPC `Likes` service.
#[test]
fn like_sets_and_uniques_over_json() {
    let (_root, node, api) = start_node(&[]);
    let like = |member: &str, idempotency_key: Option<&str>| {
        let headers: Vec<(&str, &str)> = idempotency_key
            .map(|k| vec![("idempotency-key", k)])
            .unwrap_or_default();
        api.call(
            "PUT",
            &format!("/v1/likes/post%2F1/members/{member}"),
            &headers,
            None,
        )
    };
    let first = wait_until(Duration::from_secs(20), "cluster version 3", || {
        let reply = like("sam", Some("tap-1"));
        (reply.status == 200).then(|| reply.json())
    })
    .0;
    assert_eq!(
        first,
        serde_json::json!({"changed": true, "liked": true, "count": 1, "duplicate": false, "length": 1})
    );
    // The retry, and a double tap: nothing changes.
    let retry = ok(&like("sam", Some("tap-1")));
    assert_eq!(
        (&retry["duplicate"], &retry["length"]),
        (&true.into(), &0.into())
    );
    let tap = ok(&like("sam", None));
    assert_eq!(
        (&tap["changed"], &tap["length"]),
        (&false.into(), &1.into())
    );
    assert_eq!(ok(&like("ann", None))["count"], 2);
    assert_eq!(ok(&api.get("/v1/likes/post%2F1"))["count"], 2);
    assert_eq!(
        ok(&api.get("/v1/likes/post%2F1/members/sam"))["liked"],
        true
    );
    api.get("/v1/likes/post%2F1/members/bob")
        .problem(404, "NOT_FOUND");
    // Pages of members.
    let page = ok(&api.get("/v1/likes/post%2F1/members?limit=1"));
    assert_eq!(page["members"], serde_json::json!(["ann"]));
    let token = page["next_token"]
        .as_str()
        .expect("a next page")
        .to_string();
    let page = ok(&api.get(&format!(
        "/v1/likes/post%2F1/members?limit=1&page_token={token}"
    )));
    assert_eq!(page["members"], serde_json::json!(["sam"]));
    api.get("/v1/likes/post%2F1/members?page_token=zz")
        .problem(400, "INVALID_ARGUMENT");
    // Unlike.
    let unliked = ok(&api.call("DELETE", "/v1/likes/post%2F1/members/sam", &[], None));
    assert_eq!(
        (unliked["liked"].as_bool(), unliked["count"].as_u64()),
        (Some(false), Some(1))
    );
    api.get("/v1/likes/post%2F1/members/sam")
        .problem(404, "NOT_FOUND");
    let long_member = "m".repeat(129);
    api.call(
        "PUT",
        &format!("/v1/likes/k/members/{long_member}"),
        &[],
        None,
    )
    .problem(400, "INVALID_ARGUMENT");
    assert_eq!(ok(&api.get("/v1/likes/k"))["count"], 0);

    // Uniques.
    let seen = ok(&api.post("/v1/uniques/views", r#"{"members": ["a", "b", "c", "a"]}"#));
    assert_eq!(seen["estimate"], 3);
    assert_eq!(ok(&api.get("/v1/uniques/views"))["estimate"], 3);
    ok(&api.post("/v1/uniques/views-2", r#"{"members": ["c", "d"]}"#));
    let union = ok(&api.post("/v1/distinct", r#"{"keys": ["views", "views-2"]}"#));
    assert_eq!(union["estimate"], 4);
    api.post("/v1/uniques/views", r#"{"members": [""]}"#)
        .problem(400, "INVALID_ARGUMENT");
    api.post("/v1/distinct", r#"{"keys": []}"#)
        .problem(400, "INVALID_ARGUMENT");
    assert_eq!(ok(&api.get("/v1/uniques/views"))["estimate"], 3);
    drop(node);
}

#[test]
fn adds_and_batches_may_ask_for_replicated_durability() {
    // Two nodes of one region that sync once an hour (each pulls once, at
    // start, before anything is written): an add reaches the other node only
    // as a copy push, which only a `replicated` add makes.
    let root = tempfile::tempdir().unwrap();
    let mut taker = NodeSpec::new(root.path(), "eu", "eu-1");
    taker.sync_interval = "1h";
    let mut copy = NodeSpec::new(root.path(), "eu", "eu-2");
    copy.sync_interval = "1h";
    copy.seeds = vec![taker.gossip];
    let taker = NodeProcess::start(taker);
    let mut copy = NodeProcess::start(copy);
    let api = Api::new(taker.spec.http);
    let endpoints = [taker.endpoint(), copy.endpoint()];
    // Both nodes own every partition (RF 2 of 2); wait until both serve the
    // keys below (eu-2 copies them in first), so that each holds what it
    // was pushed and nothing else.
    let keys = ["votes", "likes", "b1", "b2", "b3"];
    wait_until(Duration::from_secs(60), "both nodes to serve", || {
        endpoints
            .iter()
            .all(|endpoint| keys.iter().all(|key| local_value(endpoint, key).is_ok()))
            .then_some(())
    });
    // And until each node's map shows both holding every partition they
    // own, so that routes no longer change: with syncs an hour apart, an
    // add served before eu-1's routes knew eu-2 (at eu-1) and a read
    // routed after (to eu-2) would disagree until the next sync.
    wait_until(
        Duration::from_secs(60),
        "both nodes' routes to settle",
        || {
            endpoints
                .iter()
                .all(|endpoint| both_hold_what_they_own(endpoint))
                .then_some(())
        },
    );
    std::thread::sleep(Duration::from_secs(1));
    let held = |key: &str| -> Vec<i64> {
        let mut values: Vec<i64> = endpoints
            .iter()
            .map(|endpoint| local_value(endpoint, key).unwrap())
            .collect();
        values.sort_unstable();
        values
    };
    let add = |key: &str, body: &str, idempotency_key: &str| {
        api.call(
            "POST",
            &format!("/v1/counters/{key}"),
            &[("idempotency-key", idempotency_key)],
            Some(body),
        )
    };

    // A sync add (the node's default) stays on the node that takes it (the
    // key's first owner, where eu-1 forwards it).
    ok(&add("likes", "{\"delta\": 4}", "l-1"));
    // A replicated one is acknowledged once the copy holds it: retried with
    // its idempotency key until eu-1 sees eu-2 (it counts once).
    wait_until(
        Duration::from_secs(60),
        "a replicated add over HTTP",
        || {
            let reply = add(
                "votes",
                "{\"delta\": 3, \"durability\": \"replicated\"}",
                "v-1",
            );
            (reply.status == 200).then_some(())
        },
    );
    assert_eq!(api.value("votes"), 3);
    assert_eq!(held("votes"), [3, 3], "the copy holds the replicated add");
    assert_eq!(held("likes"), [0, 4], "a sync add is not pushed");
    // "async" is accepted; a sync node applies the stronger mode, its own.
    ok(&add(
        "likes",
        "{\"delta\": 1, \"durability\": \"async\"}",
        "l-2",
    ));
    assert_eq!(api.value("likes"), 5);

    // A batch may ask for it for every add, or per item.
    let batch = ok(&api.post(
        "/v1/batch/add",
        "{\"durability\": \"replicated\", \"adds\": [{\"key\": \"b1\", \"delta\": 1}, \
         {\"key\": \"b2\", \"delta\": 2, \"idempotency_key\": \"b-2\"}]}",
    ));
    assert!(
        batch["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["ok"].is_object()),
        "{batch}"
    );
    ok(&api.post(
        "/v1/batch/add",
        "{\"adds\": [{\"key\": \"b3\", \"delta\": 7, \"durability\": \"replicated\"}]}",
    ));
    for (key, value) in [("b1", 1), ("b2", 2), ("b3", 7)] {
        assert_eq!(held(key), [value, value], "{key} on the taker and the copy");
    }

    // A mode that does not exist: 400, and nothing changes.
    add("votes", "{\"delta\": 1, \"durability\": \"fast\"}", "v-2")
        .problem(400, "INVALID_ARGUMENT");
    api.post(
        "/v1/batch/add",
        "{\"durability\": \"sometimes\", \"adds\": [{\"key\": \"votes\", \"delta\": 1}]}",
    )
    .problem(400, "INVALID_ARGUMENT");
    assert_eq!(api.value("votes"), 3);

    // The OpenAPI document names the field and its values.
    let document = ok(&api.get("/v1/openapi.json"));
    let schemas = &document["components"]["schemas"];
    assert!(
        schemas["AddBody"]["properties"]["durability"].is_object(),
        "{}",
        schemas["AddBody"]
    );
    assert!(
        schemas["BatchAddBody"]["properties"]["durability"].is_object()
            && schemas["BatchAddItem"]["properties"]["durability"].is_object(),
        "{schemas}"
    );
    let modes: Vec<&str> = schemas["AddDurability"]["enum"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", schemas["AddDurability"]))
        .iter()
        .filter_map(|mode| mode.as_str())
        .collect();
    assert_eq!(modes, ["sync", "replicated", "async"]);

    // Without its copy, a replicated add is never silently downgraded: 503
    // naming the copies, its outcome unknown (the add is on eu-1's disk).
    copy.kill9();
    let refused = add(
        "votes",
        "{\"delta\": 8, \"durability\": \"replicated\"}",
        "v-3",
    )
    .problem(503, "UNAVAILABLE");
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.contains("copies") && detail.contains("same idempotency key"),
        "{detail}"
    );
    drop(taker);
}

/// `key`'s value in the state of the node at `endpoint` itself: a request
/// marked forwarded is served where it lands, never sent on (an error
/// while that node does not serve the key's partition).
fn local_value(endpoint: &str, key: &str) -> Result<i64, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client =
            tally_proto::v1::counters_client::CountersClient::connect(endpoint.to_string())
                .await
                .map_err(|e| e.to_string())?;
        let mut request = tonic::Request::new(tally_proto::v1::GetRequest {
            key: key.as_bytes().to_vec().into(),
            ..Default::default()
        });
        request
            .metadata_mut()
            .insert("tally-forwarded", "test".parse().unwrap());
        client
            .get(request)
            .await
            .map(|answer| answer.into_inner().value)
            .map_err(|status| status.to_string())
    })
}

/// Whether the node at `endpoint` maps two nodes, each holding every
/// partition it owns (the routes follow within a keeper round).
fn both_hold_what_they_own(endpoint: &str) -> bool {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let Ok(client) = tally_client::Client::connect(endpoint.to_string()).await else {
            return false;
        };
        let Ok(map) = client.partition_map(None).await else {
            return false;
        };
        map.nodes.len() == 2
            && map.nodes.iter().all(|node| {
                node.alive
                    && node.partitions_owned > 0
                    && node.partitions_held == node.partitions_owned
                    && node.partitions_releasing == 0
            })
    })
}
