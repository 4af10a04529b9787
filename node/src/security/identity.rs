//! Who a TLS peer is: a **node** or a **client**, read from the certificate
//! it presented (the TLS layer has already checked that it chains to the
//! cluster CA).
//!
//! A node certificate carries a URI subject alternative name
//! `tally://node/NAME` (`deploy/tls/make-certs.sh` issues one per node);
//! `NAME` may end in `*` to name every node whose name starts with what
//! comes before it (one certificate for the pods of a StatefulSet). Any
//! other certificate of the cluster CA is a client's: it gets no peer
//! rights, whatever its common name or key usages say.
//!
//! Invariant (DESIGN.md, "Trust"): only a node identity may call a peer RPC
//! or skip the token, and a node speaks only for itself: the node name it
//! claims in a request must be one its certificate names
//! ([`PeerIdentity::speaks_for`]).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use rustls::pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The URI prefix of a node identity in a certificate.
pub const NODE_URI_PREFIX: &str = "tally://node/";

/// What a peer's certificate says it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerIdentity {
    /// No certificate was presented (or TLS is off).
    Anonymous,
    /// A certificate of the cluster CA that names no node.
    Client,
    /// A node certificate, with the name patterns it carries.
    Node(Vec<String>),
}

impl PeerIdentity {
    /// Reads the identity from the peer's chain (leaf first), as tonic's
    /// `Request::peer_certs` gives it.
    pub fn from_chain(chain: Option<&[CertificateDer<'_>]>) -> PeerIdentity {
        let Some(leaf) = chain.and_then(|chain| chain.first()) else {
            return PeerIdentity::Anonymous;
        };
        let names = node_names(leaf);
        if names.is_empty() {
            PeerIdentity::Client
        } else {
            PeerIdentity::Node(names)
        }
    }

    /// The identity of a tonic request's peer.
    pub fn of_request<T>(request: &tonic::Request<T>) -> PeerIdentity {
        let certs = request.peer_certs();
        PeerIdentity::from_chain(certs.as_deref().map(|chain| chain.as_slice()))
    }

    /// Whether this is a node identity.
    pub fn is_node(&self) -> bool {
        matches!(self, PeerIdentity::Node(_))
    }

    /// Whether this identity may speak as the node named `node_name`.
    pub fn speaks_for(&self, node_name: &str) -> bool {
        match self {
            PeerIdentity::Node(patterns) => patterns.iter().any(|p| name_matches(p, node_name)),
            _ => false,
        }
    }

    /// A short description for logs and refusals.
    pub fn describe(&self) -> String {
        match self {
            PeerIdentity::Anonymous => "no certificate".to_string(),
            PeerIdentity::Client => "a client certificate (it names no node)".to_string(),
            PeerIdentity::Node(names) => format!("a node certificate for {}", names.join(", ")),
        }
    }
}

/// Whether `pattern` (a name, or a prefix ending in `*`) names `node_name`.
pub fn name_matches(pattern: &str, node_name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => node_name.starts_with(prefix) && node_name.len() > prefix.len(),
        None => pattern == node_name,
    }
}

/// The node names (patterns) a certificate's `tally://node/` URIs carry; an
/// unparsable certificate names none.
pub fn node_names(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, parsed)) = X509Certificate::from_der(cert.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = parsed.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) => uri.strip_prefix(NODE_URI_PREFIX),
            _ => None,
        })
        .filter(|name| !name.is_empty() && name.len() <= 256)
        .map(str::to_string)
        .collect()
}

/// Checks at start that this node's own certificate names it: a node whose
/// certificate is a client's could not pull from or push to any peer.
pub fn check_own_certificate(chain: &[CertificateDer<'_>], node_name: &str) -> Result<(), String> {
    let identity = PeerIdentity::from_chain(Some(chain));
    if identity.speaks_for(node_name) {
        return Ok(());
    }
    Err(format!(
        "--tls-cert is {}, not a certificate of node {node_name:?}: a node certificate carries the \
         subject alternative name URI {NODE_URI_PREFIX}{node_name} (or a pattern such as \
         {NODE_URI_PREFIX}PREFIX* that matches it); deploy/tls/make-certs.sh issues such \
         certificates, and a client certificate is refused by every peer",
        identity.describe()
    ))
}

/// Remembers when a refusal was last logged per (peer address, reason), so
/// that a peer refused for identity is logged once a minute, not once a
/// request. Bounded: past [`RefusalLog::MAX_PEERS`] entries it forgets the
/// old ones (an address churning attacker gets more log lines, never more
/// memory).
#[derive(Default)]
pub struct RefusalLog {
    last: std::sync::Mutex<std::collections::HashMap<(Option<IpAddr>, String), Instant>>,
}

impl RefusalLog {
    /// How long a peer's refusal stays quiet after it was logged.
    pub const PERIOD: Duration = Duration::from_secs(60);
    /// The most (peer, reason) pairs remembered.
    pub const MAX_PEERS: usize = 1024;

    /// Whether a refusal of `peer` for `reason` is to be logged now.
    pub fn should_log(&self, peer: Option<IpAddr>, reason: &str) -> bool {
        self.should_log_at(Instant::now(), peer, reason)
    }

    fn should_log_at(&self, now: Instant, peer: Option<IpAddr>, reason: &str) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let key = (peer, reason.to_string());
        if let Some(at) = last.get(&key) {
            if now.saturating_duration_since(*at) < Self::PERIOD {
                return false;
            }
        }
        if last.len() >= Self::MAX_PEERS {
            last.retain(|_, at| now.saturating_duration_since(*at) < Self::PERIOD);
            if last.len() >= Self::MAX_PEERS {
                last.clear();
            }
        }
        last.insert(key, now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(uris: &[&str]) -> CertificateDer<'static> {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        for uri in uris {
            params
                .subject_alt_names
                .push(rcgen::SanType::URI(uri.to_string().try_into().unwrap()));
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn a_node_uri_makes_a_node_and_anything_else_a_client() {
        let node = cert(&["tally://node/eu-1"]);
        let identity = PeerIdentity::from_chain(Some(std::slice::from_ref(&node)));
        assert_eq!(identity, PeerIdentity::Node(vec!["eu-1".to_string()]));
        assert!(identity.speaks_for("eu-1"));
        assert!(!identity.speaks_for("eu-2"));
        assert!(!identity.speaks_for("eu-10"));

        let client = cert(&["https://example.com/", "tally://client/web"]);
        let identity = PeerIdentity::from_chain(Some(std::slice::from_ref(&client)));
        assert_eq!(identity, PeerIdentity::Client);
        assert!(!identity.speaks_for("eu-1"));
        assert_eq!(PeerIdentity::from_chain(None), PeerIdentity::Anonymous);
        assert_eq!(PeerIdentity::from_chain(Some(&[])), PeerIdentity::Anonymous);
    }

    #[test]
    fn a_pattern_names_the_nodes_that_start_with_its_prefix() {
        let pods = cert(&["tally://node/eu-west-*"]);
        let identity = PeerIdentity::from_chain(Some(std::slice::from_ref(&pods)));
        assert!(identity.speaks_for("eu-west-0"));
        assert!(identity.speaks_for("eu-west-12"));
        assert!(!identity.speaks_for("eu-west-"));
        assert!(!identity.speaks_for("us-east-0"));
    }

    #[test]
    fn a_node_checks_its_own_certificate_at_start() {
        let own = cert(&["tally://node/eu-1"]);
        assert!(check_own_certificate(std::slice::from_ref(&own), "eu-1").is_ok());
        let error = check_own_certificate(std::slice::from_ref(&own), "eu-2").unwrap_err();
        assert!(
            error.contains("--tls-cert") && error.contains("tally://node/eu-2"),
            "{error}"
        );
        let client = cert(&[]);
        let error = check_own_certificate(std::slice::from_ref(&client), "eu-1").unwrap_err();
        assert!(error.contains("client certificate"), "{error}");
    }

    #[test]
    fn garbage_is_no_node() {
        let garbage = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x00]);
        assert_eq!(
            PeerIdentity::from_chain(Some(std::slice::from_ref(&garbage))),
            PeerIdentity::Client
        );
    }

    #[test]
    fn a_refused_peer_is_logged_once_a_minute() {
        let log = RefusalLog::default();
        let start = Instant::now();
        let peer = Some(IpAddr::from([127, 0, 0, 9]));
        assert!(log.should_log_at(start, peer, "not_a_node"));
        assert!(!log.should_log_at(start + Duration::from_secs(59), peer, "not_a_node"));
        assert!(log.should_log_at(start, peer, "impersonation"));
        assert!(log.should_log_at(start, Some(IpAddr::from([127, 0, 0, 8])), "not_a_node"));
        assert!(log.should_log_at(start + Duration::from_secs(61), peer, "not_a_node"));
        for octet in 0..=255u8 {
            for high in 0..5u8 {
                log.should_log_at(start, Some(IpAddr::from([10, 0, high, octet])), "x");
            }
        }
        assert!(log.last.lock().unwrap().len() <= RefusalLog::MAX_PEERS);
    }
}
