//! A small client of a node's JSON API for tests (ureq: a real HTTP/1.1
//! client with keep-alive), and a reader of server-sent events whose lines
//! arrive on a channel, so that a test waits for them with a bound.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

/// An answer: status, headers and body text.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: ureq::http::HeaderMap,
    pub body: String,
}

impl Reply {
    /// The body as JSON (panics with the body when it is not).
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// A header's value, or "".
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("")
    }

    /// Asserts a problem document with `status` and `code`; returns it.
    #[track_caller]
    pub fn problem(&self, status: u16, code: &str) -> serde_json::Value {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(
            self.header("content-type"),
            "application/problem+json",
            "{self:?}"
        );
        let problem = self.json();
        assert_eq!(problem["status"], status, "{problem}");
        assert_eq!(problem["code"], code, "{problem}");
        assert!(
            problem["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{problem}"
        );
        problem
    }
}

/// A client of one node's HTTP port.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    agent: ureq::Agent,
    token: Option<String>,
}

impl Api {
    /// Plain HTTP to `addr`.
    pub fn new(addr: SocketAddr) -> Api {
        Api::with_agent(format!("http://{addr}"), Api::config().build().new_agent())
    }

    /// The agent's configuration: statuses are answers, not errors; bounded waits.
    pub fn config() -> ureq::config::ConfigBuilder<ureq::typestate::AgentScope> {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(20)))
    }

    /// A client over `agent` (for HTTPS).
    pub fn with_agent(base: String, agent: ureq::Agent) -> Api {
        Api {
            base,
            agent,
            token: None,
        }
    }

    /// The same client, sending `Authorization: Bearer token`.
    pub fn with_token(&self, token: &str) -> Api {
        Api {
            token: Some(token.to_string()),
            ..self.clone()
        }
    }

    /// Sends a request; `body` is sent as JSON when given.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Reply {
        let mut request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(body.unwrap_or("").to_string())
            .expect("a valid request");
        let mut response = self
            .agent
            .run(request)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        Reply {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.body_mut().read_to_string().unwrap_or_default(),
        }
    }

    /// The status of a bodiless request, or `None` when none came (refused
    /// connection, failed handshake).
    pub fn try_call(&self, method: &str, path: &str) -> Option<u16> {
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .body(())
            .ok()?;
        self.agent.run(request).ok().map(|r| r.status().as_u16())
    }

    pub fn get(&self, path: &str) -> Reply {
        self.call("GET", path, &[], None)
    }

    pub fn post(&self, path: &str, body: &str) -> Reply {
        self.call("POST", path, &[], Some(body))
    }

    /// Adds `delta` to `key` (path-encoded by the caller) with an optional idempotency key.
    pub fn add(&self, key: &str, delta: i64, idempotency_key: Option<&str>) -> Reply {
        let headers: Vec<(&str, &str)> = idempotency_key
            .map(|k| vec![("idempotency-key", k)])
            .unwrap_or_default();
        self.call(
            "POST",
            &format!("/v1/counters/{key}"),
            &headers,
            Some(&format!("{{\"delta\": {delta}}}")),
        )
    }

    /// The value of `key` (path-encoded by the caller).
    #[track_caller]
    pub fn value(&self, key: &str) -> i64 {
        let reply = self.get(&format!("/v1/counters/{key}"));
        assert_eq!(reply.status, 200, "{reply:?}");
        reply.json()["value"].as_i64().expect("a value")
    }

    /// Opens an event stream; its lines arrive on the returned reader.
    pub fn events(&self, path: &str, headers: &[(&str, &str)]) -> Events {
        let mut request = ureq::http::Request::builder()
            .method("GET")
            .uri(format!("{}{path}", self.base))
            .header("accept", "text/event-stream");
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        // A stream has no overall deadline; the reader bounds each wait.
        let request = self
            .agent
            .configure_request(request.body(()).expect("a valid request"))
            .timeout_global(None)
            .build();
        let response = self.agent.run(request).expect("opening the event stream");
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let (lines_tx, lines_rx) = mpsc::channel();
        let reader = response.into_body().into_reader();
        std::thread::spawn(move || {
            for line in BufReader::new(reader).lines() {
                let Ok(line) = line else { return };
                if lines_tx.send(line).is_err() {
                    return;
                }
            }
        });
        Events {
            status,
            content_type,
            lines_rx,
        }
    }
}

/// An open event stream.
pub struct Events {
    pub status: u16,
    pub content_type: String,
    lines_rx: mpsc::Receiver<String>,
}

/// One server-sent event (or a comment, with `comment` set).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Event {
    pub event: String,
    pub id: String,
    pub data: String,
    pub retry: String,
    pub comment: String,
}

impl Event {
    /// The field `name` of the data of an event of kind `name`.
    #[track_caller]
    fn data_field(&self, name: &str) -> serde_json::Value {
        assert_eq!(self.event, name, "{self:?}");
        let data: serde_json::Value = serde_json::from_str(&self.data).expect("JSON data");
        data[name].clone()
    }

    /// The `value` of a counter's `value` event.
    #[track_caller]
    pub fn value(&self) -> i64 {
        self.data_field("value").as_i64().expect("a value")
    }

    /// The `count` of a like set's `count` event.
    #[track_caller]
    pub fn count(&self) -> u64 {
        self.data_field("count").as_u64().expect("a count")
    }
}

impl Events {
    /// The next event or comment, or `None` if none comes within `limit`.
    pub fn next(&self, limit: Duration) -> Option<Event> {
        let deadline = std::time::Instant::now() + limit;
        let mut event = Event::default();
        let mut any = false;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self.lines_rx.recv_timeout(left).ok()?;
            if line.is_empty() {
                if any {
                    return Some(event);
                }
                continue;
            }
            any = true;
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value).to_string();
            match field {
                "" => event.comment = value,
                "event" => event.event = value,
                "id" => event.id = value,
                "data" => event.data = value,
                "retry" => event.retry = value,
                _ => {}
            }
        }
    }

    /// The next `value` event, skipping comments.
    pub fn next_value(&self, limit: Duration) -> Option<Event> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let event = self.next(left)?;
            if event.comment.is_empty() {
                return Some(event);
            }
        }
    }
}

/// Sends `head` (a request line and headers, ending in a blank line) on a
/// fresh connection to `addr`, then up to `body_bytes` bytes of body (it
/// stops at the first write the node refuses: a node that answered early
/// and closed), and returns the whole answer as text, read until the node
/// closes (at most 20 s).
pub fn raw_exchange(addr: SocketAddr, head: &str, body_bytes: usize) -> String {
    use std::io::{Read, Write};
    let mut socket = std::net::TcpStream::connect(addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    socket
        .set_write_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    socket.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b'x'; 64 << 10];
    let mut sent = 0;
    while sent < body_bytes {
        let size = chunk.len().min(body_bytes - sent);
        if socket.write_all(&chunk[..size]).is_err() {
            break;
        }
        sent += size;
    }
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}
