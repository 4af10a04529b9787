//! Who may talk to a node: TLS on the gRPC port with mutual TLS between nodes
//! ([`tls`]), bearer tokens and a per-token rate limit for clients ([`auth`]).
//!
//! What each service requires once configured:
//! - `Counters` and `Admin`: a known bearer token (when `--auth-tokens` is set),
//!   within its rate (when `--rate-limit` is set);
//! - `Replication`: a client certificate signed by the cluster CA (when TLS is
//!   on): a node refuses a peer without one, and the TLS handshake of a peer
//!   whose certificate comes from another CA fails, logged and counted.
//!
//! - gossip: sealed under the cluster's gossip keys (`--gossip-key-file`,
//!   `crate::gossip::seal`): a datagram that does not open is dropped.
//!
//! Health checks and reflection stay open. Tokens without TLS are refused at
//! start: Replication would be open to anyone (its credential is the node
//! certificate). With `--secure`, a node refuses to start unless TLS, tokens
//! and a gossip key are configured; without security, it logs a warning at
//! start.

pub mod accept;
pub mod auth;
pub mod identity;
pub mod roles;
pub mod tls;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::bail;

use crate::gossip::seal::GossipKeys;

pub use auth::{Auth, AuthInterceptor, ItemCharge, TokensError};
pub use identity::PeerIdentity;
pub use tls::TlsMaterial;

/// The security settings of a node, as given.
#[derive(Clone, Debug, Default)]
pub struct SecuritySettings {
    /// PEM certificate chain of this node (server and client certificate).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of this node.
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) that sign the cluster's nodes.
    pub tls_ca: Option<PathBuf>,
    /// File of client tokens, `NAME TOKEN ROLES` per line.
    pub auth_tokens: Option<PathBuf>,
    /// Requests per second per token; 0 is no limit.
    pub rate_limit: u32,
    /// Requests a token may send at once above its rate.
    pub rate_burst: u32,
    /// File of gossip keys (`--gossip-key-file`).
    pub gossip_key_file: Option<PathBuf>,
    /// Take plain gossip too (`--gossip-accept-plain`), while sealing is
    /// turned on node by node.
    pub gossip_accept_plain: bool,
    /// Refuse to start without TLS, tokens and a gossip key.
    pub secure: bool,
}

/// The loaded security material.
#[derive(Clone, Default)]
pub struct Security {
    /// TLS, when configured.
    pub tls: Option<TlsMaterial>,
    /// Client authentication, when configured.
    pub auth: Option<Arc<Auth>>,
    /// The gossip keys, when configured: gossip datagrams are sealed.
    pub gossip_keys: Option<Arc<std::sync::Mutex<GossipKeys>>>,
    /// Plain gossip is taken too (`--gossip-accept-plain`).
    pub gossip_accept_plain: bool,
}

impl Security {
    /// Loads and checks the material; every error names the setting.
    pub fn load(settings: &SecuritySettings) -> anyhow::Result<Security> {
        let tls = match (&settings.tls_cert, &settings.tls_key, &settings.tls_ca) {
            (None, None, None) => None,
            (Some(cert), Some(key), Some(ca)) => Some(TlsMaterial::load(cert, key, ca)?),
            _ => bail!(
                "TLS needs --tls-cert, --tls-key and --tls-ca together (the CA signs every node, \
                 so that nodes can authenticate each other)"
            ),
        };
        let auth = match &settings.auth_tokens {
            Some(path) => Some(Arc::new(Auth::load(
                path,
                settings.rate_limit,
                settings.rate_burst,
            )?)),
            None if settings.rate_limit > 0 => {
                bail!("--rate-limit applies per token: it needs --auth-tokens")
            }
            None => None,
        };
        if auth.is_some() && tls.is_none() {
            // Tokens guard Counters and Admin, but Replication answers peers,
            // and without TLS a peer has no credential to check: anyone who
            // reaches the port could pull every counter. Refuse rather than
            // look protected.
            bail!(
                "--auth-tokens is set but TLS is not: without TLS, Replication has no node \
                 certificate to check, so anyone who reaches the gRPC port could pull every \
                 counter (and tokens would cross the network in clear text). Set --tls-cert, \
                 --tls-key and --tls-ca as well (deploy/tls/make-certs.sh makes a test set), or \
                 remove --auth-tokens"
            );
        }
        let gossip_keys = match &settings.gossip_key_file {
            Some(path) => Some(Arc::new(std::sync::Mutex::new(GossipKeys::load(path)?))),
            None => None,
        };
        if settings.secure {
            let mut missing = Vec::new();
            if tls.is_none() {
                missing.push("--tls-cert, --tls-key, --tls-ca");
            }
            if auth.is_none() {
                missing.push("--auth-tokens");
            }
            if gossip_keys.is_none() {
                missing.push("--gossip-key-file");
            }
            if !missing.is_empty() {
                bail!(
                    "--secure is set but {} {} not",
                    missing.join(" and "),
                    if missing.len() == 1 { "is" } else { "are" }
                );
            }
        }
        if settings.gossip_accept_plain && gossip_keys.is_none() {
            bail!(
                "--gossip-accept-plain is set but --gossip-key-file is not: it lets a sealing \
                 node take plain gossip while sealing is turned on; without a key, gossip is \
                 plain anyway"
            );
        }
        if settings.gossip_accept_plain {
            tracing::warn!(
                "--gossip-accept-plain: plain gossip is taken too, so a node without the key can \
                 still join; restart without it once every node has --gossip-key-file"
            );
        }
        Ok(Security {
            tls,
            auth,
            gossip_keys,
            gossip_accept_plain: settings.gossip_accept_plain,
        })
    }

    /// Logs, at start, what is not protected.
    pub fn warn_if_insecure(&self) {
        if self.tls.is_none() {
            tracing::warn!(
                "security is off: the gRPC port speaks plain text and any node can pull this node's \
                 data; set --tls-cert, --tls-key and --tls-ca (or --secure to require them)"
            );
        }
        if self.auth.is_none() {
            tracing::warn!(
                "client authentication is off: anyone who reaches the gRPC port can add to counters; \
                 set --auth-tokens (or --secure to require it)"
            );
        }
        if self.gossip_keys.is_none() {
            tracing::warn!(
                "gossip is not sealed: anyone who reaches the gossip port with the cluster id can \
                 join membership and publish lifecycle changes; set --gossip-key-file (or --secure \
                 to require it)"
            );
        }
    }
}
