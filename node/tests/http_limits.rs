//! Nothing unauthenticated costs the HTTP port more than a bounded amount
//! (DESIGN.md, "Trust"), with a real node: a body is not read before its
//! token passed (64 connections of 15 MiB each leave the node's memory
//! where it was), and a client that sends its headers slowly is closed.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::certs::{secure_spec, Ca};
use common::NodeProcess;

const TOKEN: &str = "writer-token-0123456789";

fn secure_node(root: &std::path::Path) -> NodeProcess {
    let ca = Ca::new("cluster CA");
    let tokens = format!("writer {TOKEN} read,write\n");
    NodeProcess::start(secure_spec(root, "eu", "eu-1", &ca, &tokens, &[]))
}

/// The node's resident memory in bytes (`VmRSS`).
fn resident(node: &NodeProcess) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.pid())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap();
    kib * 1024
}

fn unauthenticated_head(length: usize) -> String {
    format!(
        "POST /v1/batch/add HTTP/1.1\r\nHost: tally\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n"
    )
}

/// Sends `head` and all but the last byte of its body, holds the
/// connection for `hold`, and says whether the node closed it by then.
fn send_and_hold(addr: SocketAddr, head: &str, body: usize, hold: Duration) -> bool {
    let mut socket = TcpStream::connect(addr).unwrap();
    socket
        .set_write_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    if socket.write_all(head.as_bytes()).is_err() {
        return true;
    }
    let chunk = vec![b'x'; 256 << 10];
    let mut sent = 0;
    while sent + 1 < body {
        let size = chunk.len().min(body - 1 - sent);
        if socket.write_all(&chunk[..size]).is_err() {
            return true;
        }
        sent += size;
    }
    std::thread::sleep(hold);
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut answer = Vec::new();
    socket.read_to_end(&mut answer).is_ok()
        || socket.write_all(b"x").is_err()
        || String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 401")
}

#[test]
fn unauthenticated_bodies_are_refused_before_they_are_read() {
    let root = tempfile::tempdir().unwrap();
    let node = secure_node(root.path());
    let http = node.spec.http;
    // The refusal comes before any of the body: none is sent here.
    let answer = common::http::raw_exchange(http, &unauthenticated_head(15 << 20), 0);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(answer.contains("UNAUTHENTICATED"), "{answer}");

    // 64 connections that each try to hold 15 MiB of body, at once.
    let before = resident(&node);
    let holders: Vec<_> = (0..64)
        .map(|_| {
            let head = unauthenticated_head(15 << 20);
            std::thread::spawn(move || send_and_hold(http, &head, 15 << 20, Duration::from_secs(3)))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let during = resident(&node);
    let closed = holders
        .into_iter()
        .map(|holder| holder.join().unwrap())
        .filter(|closed| *closed)
        .count();
    let grown = during.saturating_sub(before);
    println!(
        "resident {} MB before, {} MB while 64 unauthenticated 15 MiB bodies were sent",
        before >> 20,
        during >> 20
    );
    assert!(
        grown < 100 << 20,
        "the node grew by {} MB while unauthenticated bodies were sent",
        grown >> 20
    );
    assert_eq!(closed, 64, "connections the node did not close");
    // The node still serves a client with a token.
    let api = common::http::Api::new(http).with_token(TOKEN);
    assert_eq!(api.add("k", 2, None).status, 200);
    assert_eq!(api.value("k"), 2);
}

#[test]
fn a_client_that_sends_its_headers_slowly_is_closed() {
    let root = tempfile::tempdir().unwrap();
    let node = secure_node(root.path());
    let mut socket = TcpStream::connect(node.spec.http).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    socket
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: tally\r\n")
        .unwrap();
    // One header byte every half second, never the end of the headers:
    // the node must close the connection (its limit is 10 s); the test
    // gives up after 60 s.
    let started = Instant::now();
    let mut closed = false;
    while started.elapsed() < Duration::from_secs(60) {
        if socket.write_all(b"X").is_err() {
            closed = true;
            break;
        }
        let mut buffer = [0u8; 512];
        match socket.read(&mut buffer) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(_) => {
                // An answer (408) before the close is fine too.
                closed = true;
                break;
            }
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => {
                closed = true;
                break;
            }
        }
    }
    assert!(closed, "a slow-header connection was still open after 60 s");
    println!(
        "the slow-header connection was closed after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // Other clients were served meanwhile and after.
    let (code, _) = common::http_get(node.spec.http, "/healthz").unwrap();
    assert_eq!(code, 200);
}
