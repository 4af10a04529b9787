//! Connecting to a secured cluster: TLS verified against the cluster's CA,
//! and a bearer token on every call; then the same through a tonic channel
//! the service configured itself (here, to check the node's certificate
//! against a name other than the one in the URL).
//!
//! ```sh
//! deploy/tls/make-certs.sh /tmp/certs     # a test CA, node certificates, tokens
//! # start a node with --tls-cert/--tls-key/--tls-ca/--auth-tokens (docs/src/security.md)
//! TALLY_TLS_CA=/tmp/certs/ca.crt TALLY_TOKEN=... \
//!   cargo run -p tally-client --example tls_token -- https://127.0.0.1:7100
//! ```

use std::error::Error as StdError;

use tally_client::ClientConfig;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

#[tokio::main]
async fn main() -> Result<(), Box<dyn StdError>> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "https://127.0.0.1:7100".to_owned());
    let ca_path = std::env::var("TALLY_TLS_CA")
        .map_err(|_| "set TALLY_TLS_CA to the cluster's CA certificate (PEM)")?;
    let ca = std::fs::read(&ca_path).map_err(|error| format!("reading {ca_path}: {error}"))?;
    let token = std::env::var("TALLY_TOKEN")
        .map_err(|_| "set TALLY_TOKEN to a token listed in the node's --auth-tokens file")?;

    // The simple way: the client opens the TLS connection itself.
    let client = ClientConfig::new()
        .with_tls_ca(ca.clone())
        .with_token(token.clone())
        .connect(endpoint.as_str())
        .await?;
    let outcome = client.add("example:secure:adds", 1).await?;
    println!(
        "over TLS with a token: example:secure:adds = {}",
        outcome.value
    );

    // Bring your own channel: the service's TLS settings, here verifying
    // the certificate against the name `localhost` whatever address the URL
    // has. The token, retries and coalescing still come from the config.
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca))
        .domain_name("localhost");
    let channel = Endpoint::from_shared(endpoint)?
        .tls_config(tls)?
        .connect()
        .await?;
    let client = ClientConfig::new()
        .with_token(token)
        .build_with_channel(channel)?;
    let outcome = client.add("example:secure:adds", 1).await?;
    println!(
        "over the service's own channel: example:secure:adds = {}",
        outcome.value
    );
    Ok(())
}
