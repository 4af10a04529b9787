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

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::anyhow;
use axum::serve::ListenerExt;
use axum::Router;
use futures::StreamExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use super::HttpSettings;
use crate::metrics::Metrics;
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

/// The accepted TLS connections of the HTTP port, as axum's listener.
struct TlsListener {
    streams: ReceiverStream<std::io::Result<TlsStream<TcpStream>>>,
    accept_task: JoinHandle<()>,
    local: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.streams.next().await {
                Some(Ok(stream)) => {
                    let peer = stream.get_ref().0.peer_addr().unwrap_or(self.local);
                    return (stream, peer);
                }
                Some(Err(error)) => tracing::warn!(%error, "accepting an HTTPS connection failed"),
                // The accept task only ends when this listener is dropped.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

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
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            tokio::spawn(async move {
                axum::serve(listener, router)
                    .with_graceful_shutdown(stop)
                    .await
            })
        }
        Some(acceptor) => tokio::spawn(async move {
            let local = listener.local_addr()?;
            let (streams, accept_task) = accept_tls(listener, acceptor, metrics);
            let listener = TlsListener {
                streams,
                accept_task,
                local,
            };
            axum::serve(listener, router)
                .with_graceful_shutdown(stop)
                .await
        }),
    }
}
