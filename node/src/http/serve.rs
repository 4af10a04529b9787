//! Serving the HTTP port: plain HTTP/1.1 and h2c by default, or HTTPS
//! (HTTP/1.1 and h2 by ALPN) with `--http-tls-cert` and `--http-tls-key`.
//! The HTTP port's certificate is its own: browsers and load balancers check
//! it against public CAs, where the gRPC port's is checked against the
//! cluster's (the two flags may name the node's own files).
//!
//! TLS handshakes run off the accept loop, bounded in time, refused ones
//! logged and counted, as on the gRPC port ([`accept_tls`]). Every accepted
//! socket has `TCP_NODELAY`: a keep-alive client waiting for an answer must
//! not wait for a delayed ACK too.
//!
//! Nothing unauthenticated costs the port more than a bounded amount: at
//! most [`MAX_CONNECTIONS`] connections, headers within
//! [`HEADER_READ_TIMEOUT`], [`MAX_STREAMS_PER_CONNECTION`] HTTP/2 streams,
//! bodies bounded per route and read only once the token passed
//! (`super::access::gate`), within `super::extract::BODY_READ_TIMEOUT`.

use std::path::Path;
use std::sync::Arc;

use std::time::Duration;

use anyhow::anyhow;
use axum::Router;
use futures::StreamExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

use super::HttpSettings;
use crate::metrics::Metrics;
use crate::security::accept::accept_plain;
use crate::security::tls::{accept_tls, Identity};

/// Loads the HTTP port's TLS material, when configured; errors name the flag.
pub fn load_tls(settings: &HttpSettings) -> anyhow::Result<Option<tokio_rustls::TlsAcceptor>> {
    let (cert, key) = match (&settings.tls_cert, &settings.tls_key) {
        (None, None) => return Ok(None),
        (Some(cert), Some(key)) => (cert, key),
        _ => {
            return Err(anyhow!(
                "HTTPS needs --http-tls-cert and --http-tls-key together (a certificate \
                 and its private key)"
            ))
        }
    };
    acceptor(cert, key).map(Some)
}

fn acceptor(cert: &Path, key: &Path) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    let identity = Identity::load("--http-tls-cert", cert, "--http-tls-key", key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow!("HTTPS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(identity.chain, identity.private_key)
        .map_err(|e| {
            anyhow!("--http-tls-cert and --http-tls-key do not make a usable pair: {e}")
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The longest a client may take to send a request's headers, from its
/// first byte; a slower one is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The most connections the HTTP port holds at once; more wait in the
/// kernel's backlog until one closes.
pub const MAX_CONNECTIONS: usize = 2048;
/// The most concurrent HTTP/2 streams of one connection.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// How long a stop waits for open connections (event streams) to finish.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Serves `router` on `listener` until `stop` resolves.
pub fn spawn_http(
    listener: TcpListener,
    router: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    metrics: Arc<Metrics>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> JoinHandle<std::io::Result<()>> {
    match tls {
        None => {
            let (streams, accept_task) = accept_plain(listener, "http", metrics);
            tokio::spawn(async move {
                serve_connections(streams, router, stop).await;
                accept_task.abort();
                Ok(())
            })
        }
        Some(acceptor) => {
            let (streams, accept_task) = accept_tls(listener, acceptor, metrics);
            tokio::spawn(async move {
                serve_connections(streams, router, stop).await;
                accept_task.abort();
                Ok(())
            })
        }
    }
}

/// Serves every connection of `incoming` with `router` (HTTP/1.1 and
/// HTTP/2), each bounded as the constants above say, until `stop`; then
/// lets open connections finish for at most [`SHUTDOWN_GRACE`].
async fn serve_connections<IO>(
    mut incoming: ReceiverStream<std::io::Result<IO>>,
    router: Router,
    stop: impl std::future::Future<Output = ()>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION);
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            _ = &mut stop => break,
        };
        let io = tokio::select! {
            io = incoming.next() => match io {
                Some(Ok(io)) => io,
                Some(Err(error)) => {
                    tracing::warn!(%error, "accepting an HTTP connection failed");
                    continue;
                }
                None => break,
            },
            _ = &mut stop => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(io), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // A connection's errors (a client gone, a timeout) are its own.
            let _ = connection.await;
            drop(permit);
        });
    }
    drop(incoming);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(SHUTDOWN_GRACE) => {}
    }
}
