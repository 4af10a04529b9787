//! TLS for the gRPC port (rustls, ring). One certificate per node serves both
//! ways: as the server certificate for clients and peers, and as the client
//! certificate this node presents when it pulls from a peer. Client
//! certificates are optional at the TLS layer (service clients use tokens), but
//! one that is presented must chain to the cluster CA, or the handshake fails;
//! the `Replication` service then requires one.
//!
//! Handshakes run off the accept loop, bounded in time, and a refused one is
//! logged with the peer's address and counted, before tonic ever sees it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use crate::metrics::Metrics;

/// The longest a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Loaded TLS material of a node.
#[derive(Clone)]
pub struct TlsMaterial {
    /// Accepts clients and peers.
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// Dials peers, presenting this node's certificate.
    pub client: tonic::transport::ClientTlsConfig,
    /// This node's own certificate chain (leaf first), whose node identity
    /// is checked at start.
    pub chain: Vec<CertificateDer<'static>>,
}

fn read(setting: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path)
        .with_context(|| format!("{setting} {}: cannot read the file", path.display()))
}

/// A certificate chain and its private key, read from PEM files.
pub struct Identity {
    /// The PEM text of the chain.
    pub cert_pem: Vec<u8>,
    /// The PEM text of the key.
    pub key_pem: Vec<u8>,
    /// The chain.
    pub chain: Vec<CertificateDer<'static>>,
    /// The key.
    pub private_key: PrivateKeyDer<'static>,
}

impl Identity {
    /// Reads a chain and its key; errors name `cert_setting` or `key_setting`.
    pub fn load(
        cert_setting: &str,
        cert: &Path,
        key_setting: &str,
        key: &Path,
    ) -> anyhow::Result<Identity> {
        let cert_pem = read(cert_setting, cert)?;
        let key_pem = read(key_setting, key)?;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| {
                anyhow!(
                    "{cert_setting} {}: not PEM certificates: {e}",
                    cert.display()
                )
            })?;
        if chain.is_empty() {
            return Err(anyhow!(
                "{cert_setting} {}: holds no PEM certificate",
                cert.display()
            ));
        }
        let private_key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| anyhow!("{key_setting} {}: no PEM private key: {e}", key.display()))?;
        Ok(Identity {
            cert_pem,
            key_pem,
            chain,
            private_key,
        })
    }
}

impl TlsMaterial {
    /// Reads and checks the PEM files; every error names its setting.
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> anyhow::Result<TlsMaterial> {
        let Identity {
            cert_pem,
            key_pem,
            chain,
            private_key,
        } = Identity::load("--tls-cert", cert, "--tls-key", key)?;
        let ca_pem = read("--tls-ca", ca)?;
        let mut roots = rustls::RootCertStore::empty();
        for ca_cert in CertificateDer::pem_slice_iter(&ca_pem) {
            let ca_cert = ca_cert
                .map_err(|e| anyhow!("--tls-ca {}: not PEM certificates: {e}", ca.display()))?;
            roots
                .add(ca_cert)
                .map_err(|e| anyhow!("--tls-ca {}: unusable CA certificate: {e}", ca.display()))?;
        }
        if roots.is_empty() {
            return Err(anyhow!(
                "--tls-ca {}: holds no PEM certificate",
                ca.display()
            ));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .map_err(|e| anyhow!("--tls-ca {}: {e}", ca.display()))?;
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| anyhow!("TLS: {e}"))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), private_key)
            .map_err(|e| anyhow!("--tls-cert and --tls-key do not make a usable pair: {e}"))?;
        server.alpn_protocols = vec![b"h2".to_vec()];
        let client = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&ca_pem))
            .identity(tonic::transport::Identity::from_pem(&cert_pem, &key_pem));
        Ok(TlsMaterial {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            client,
            chain,
        })
    }
}

/// Accepts connections on `listener` and yields the ones whose TLS handshake
/// succeeded; the task stops when the stream is dropped.
pub fn accept_tls(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    metrics: Arc<Metrics>,
) -> (
    ReceiverStream<std::io::Result<TlsStream<TcpStream>>>,
    JoinHandle<()>,
) {
    let (streams_tx, streams_rx) = tokio::sync::mpsc::channel(64);
    let task = tokio::spawn(async move {
        let mut backoff = super::accept::Backoff::new("tls", metrics.clone());
        loop {
            let Some((tcp, peer)) = backoff.handle(listener.accept().await).await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            if streams_tx.is_closed() {
                return;
            }
            let acceptor = acceptor.clone();
            let streams_tx = streams_tx.clone();
            let metrics = metrics.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = streams_tx.send(Ok(stream)).await;
                    }
                    Ok(Err(error)) => {
                        metrics.tls_handshake_failures.inc();
                        tracing::warn!(%peer, %error, "TLS handshake refused (a peer certificate from another CA, or not TLS)");
                    }
                    Err(_) => {
                        metrics.tls_handshake_failures.inc();
                        tracing::warn!(%peer, "TLS handshake timed out");
                    }
                }
            });
        }
    });
    (ReceiverStream::new(streams_rx), task)
}
