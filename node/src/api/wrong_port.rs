//! An HTTP/1 client (curl, a browser) that reaches the plain gRPC port is
//! told which port is which: a `400` in plain text naming the node's HTTP
//! port, instead of the HTTP/2 bytes that curl reports as "Received HTTP/0.9
//! when not allowed". (The HTTP port does the same for a gRPC call:
//! `crate::http::wrong_port`.)
//!
//! Each accepted connection's first bytes are peeked, never read, so what
//! gRPC gets is untouched: the HTTP/2 preface (`PRI * HTTP/2.0`) and
//! anything else that is no HTTP/1 request line pass on at once. The
//! screening is bounded like the rest of the port: at most
//! [`MAX_SCREENING`] connections at a time (more pass on unscreened), each
//! for at most [`SCREEN_TIMEOUT`] (then it passes on too), and the answer
//! is one small write. An HTTP/1 request's head (at most [`HEAD_LIMIT`]
//! bytes) is read before the answer: answering while the client still
//! writes it would close the connection under its writes (a broken pipe)
//! or reset it over the unread bytes, and the client would never see the
//! answer.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

/// The most connections screened at once.
pub const MAX_SCREENING: usize = 256;
/// The longest a connection's first bytes are waited for.
pub const SCREEN_TIMEOUT: Duration = Duration::from_secs(2);
/// The most bytes of an HTTP/1 request's head read before the answer.
pub const HEAD_LIMIT: usize = 8 * 1024;

/// The methods an HTTP/1 request line starts with (`PRI` is HTTP/2's preface).
const METHODS: [&[u8]; 8] = [
    b"GET ",
    b"POST ",
    b"PUT ",
    b"HEAD ",
    b"DELETE ",
    b"OPTIONS ",
    b"PATCH ",
    b"CONNECT ",
];

/// What the first bytes of a connection are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstBytes {
    /// An HTTP/1 request line.
    Http1,
    /// Anything else (the HTTP/2 preface, TLS, garbage): gRPC's to handle.
    Other,
    /// Too few bytes yet to tell.
    Undecided,
}

/// Classifies the bytes a connection has sent so far.
pub fn classify(bytes: &[u8]) -> FirstBytes {
    if METHODS.iter().any(|method| bytes.starts_with(method)) {
        FirstBytes::Http1
    } else if METHODS.iter().any(|method| method.starts_with(bytes)) {
        FirstBytes::Undecided
    } else {
        FirstBytes::Other
    }
}

/// The answer an HTTP/1 client gets.
pub fn answer(http_port: u16) -> String {
    let body = format!(
        "This is Tally's gRPC port, for the tally command line and the client library \
         (tally --endpoint http://HOST:PORT). The HTTP API (/v1/...), /status, /metrics and \
         the demo page are on this node's HTTP port: {http_port} (--http-addr, 7102 by default).\n"
    );
    format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Waits for enough of a connection's first bytes to classify them.
async fn first_bytes(tcp: &TcpStream) -> FirstBytes {
    let mut buffer = [0u8; 8];
    let looked = tokio::time::timeout(SCREEN_TIMEOUT, async {
        loop {
            let seen = match tcp.peek(&mut buffer).await {
                Ok(0) | Err(_) => return FirstBytes::Other,
                Ok(seen) => seen,
            };
            match classify(&buffer[..seen]) {
                FirstBytes::Undecided if seen < buffer.len() => {
                    // Some bytes, not enough: peek again once more may have
                    // arrived (peek does not wait for new ones).
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                FirstBytes::Undecided => return FirstBytes::Other,
                decided => return decided,
            }
        }
    })
    .await;
    looked.unwrap_or(FirstBytes::Other)
}

/// Reads an HTTP/1 request's head (to its blank line, at most
/// [`HEAD_LIMIT`] bytes, or until the client stops writing), and drops it.
async fn read_head(tcp: &mut TcpStream) {
    let mut head = Vec::new();
    let mut buffer = [0u8; 1024];
    while head.len() < HEAD_LIMIT && !head.windows(4).any(|window| window == b"\r\n\r\n") {
        match tcp.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => head.extend_from_slice(&buffer[..read]),
        }
    }
}

/// Screens the accepted connections of `incoming`: HTTP/1 clients get
/// [`answer`] and are closed, the others go on to the gRPC server, in the
/// stream returned. The task ends when either side does.
pub fn screen_http1(
    mut incoming: ReceiverStream<std::io::Result<TcpStream>>,
    http_port: u16,
) -> (ReceiverStream<std::io::Result<TcpStream>>, JoinHandle<()>) {
    let (out_tx, out_rx) = tokio::sync::mpsc::channel(64);
    let answer: Arc<str> = answer(http_port).into();
    let permits = Arc::new(Semaphore::new(MAX_SCREENING));
    let task = tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = incoming.next() => accepted,
                _ = out_tx.closed() => return,
            };
            let Some(accepted) = accepted else { return };
            let tcp = match accepted {
                Ok(tcp) => tcp,
                Err(error) => {
                    if out_tx.send(Err(error)).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                if out_tx.send(Ok(tcp)).await.is_err() {
                    return;
                }
                continue;
            };
            let out_tx = out_tx.clone();
            let answer = Arc::clone(&answer);
            tokio::spawn(async move {
                let _permit = permit;
                if first_bytes(&tcp).await == FirstBytes::Http1 {
                    let mut tcp = tcp;
                    tracing::debug!(peer = ?tcp.peer_addr().ok(), "an HTTP/1 request on the gRPC port");
                    let _ = tokio::time::timeout(SCREEN_TIMEOUT, async {
                        read_head(&mut tcp).await;
                        let _ = tcp.write_all(answer.as_bytes()).await;
                        let _ = tcp.shutdown().await;
                    })
                    .await;
                    return;
                }
                let _ = out_tx.send(Ok(tcp)).await;
            });
        }
    });
    (ReceiverStream::new(out_rx), task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_are_told_from_the_http2_preface_and_the_rest() {
        assert_eq!(classify(b"GET / HT"), FirstBytes::Http1);
        assert_eq!(classify(b"POST /v1"), FirstBytes::Http1);
        assert_eq!(classify(b"PRI * HT"), FirstBytes::Other);
        assert_eq!(classify(b"\x16\x03\x01\x02"), FirstBytes::Other);
        assert_eq!(classify(b"P"), FirstBytes::Undecided);
        assert_eq!(classify(b"PR"), FirstBytes::Other);
        assert_eq!(classify(b"GE"), FirstBytes::Undecided);
        assert_eq!(classify(b""), FirstBytes::Undecided);
        assert_eq!(classify(b"xyz"), FirstBytes::Other);
    }

    #[test]
    fn the_answer_is_a_complete_http1_response_naming_the_http_port() {
        let text = answer(7102);
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 "));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(body.contains("gRPC port") && body.contains("7102"));
    }
}
