//! A test certificate authority made with rcgen: node certificates (they
//! carry the node identity URI `tally://node/NAME`, as
//! `deploy/tls/make-certs.sh` issues them) and client certificates (the
//! same CA, no node URI: a node must refuse them as peers).

use std::path::{Path, PathBuf};

use super::NodeSpec;

/// A CA that signs test certificates.
pub struct Ca {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Ca {
    /// A fresh self-signed CA named `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().unwrap();
        Ca {
            cert: params.self_signed(&key).unwrap(),
            key,
        }
    }

    /// Writes `ca.pem`, `NAME.pem` and `NAME-key.pem` (a node certificate of
    /// node NAME for localhost and 127.0.0.1, for servers and clients) into
    /// `dir`; returns (certificate, key, CA) paths.
    pub fn issue(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
        self.issue_with(dir, name, Some(name))
    }

    /// Like [`Ca::issue`], but a client certificate (`clientAuth`, no node
    /// URI) with common name `name`.
    pub fn issue_client(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
        self.issue_with(dir, name, None)
    }

    fn issue_with(
        &self,
        dir: &Path,
        name: &str,
        node: Option<&str>,
    ) -> (PathBuf, PathBuf, PathBuf) {
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        if let Some(node) = node {
            params
                .extended_key_usages
                .push(rcgen::ExtendedKeyUsagePurpose::ServerAuth);
            params.subject_alt_names.push(rcgen::SanType::URI(
                format!("tally://node/{node}").try_into().unwrap(),
            ));
        }
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let paths = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}-key.pem")),
            dir.join("ca.pem"),
        );
        std::fs::write(&paths.0, cert.pem()).unwrap();
        std::fs::write(&paths.1, key.serialize_pem()).unwrap();
        std::fs::write(&paths.2, self.cert.pem()).unwrap();
        paths
    }
}

/// A node NAME with TLS (a node certificate of `ca` for NAME, under
/// `root/NAME-tls`), the tokens file `tokens` (written to `root/tokens`), a
/// gossip key (`root/gossip.key`), `--secure`, and `extra` flags.
pub fn secure_spec(
    root: &Path,
    region: &str,
    name: &str,
    ca: &Ca,
    tokens: &str,
    extra: &[&str],
) -> NodeSpec {
    let (cert, key, ca_path) = ca.issue(&root.join(format!("{name}-tls")), name);
    let tokens_path = root.join("tokens");
    std::fs::write(&tokens_path, format!("# test tokens\n{tokens}")).unwrap();
    let gossip_key = root.join("gossip.key");
    std::fs::write(&gossip_key, format!("{}\n", "5e".repeat(32))).unwrap();
    let mut spec = NodeSpec::new(root, region, name);
    spec.extra = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--tls-ca",
        ca_path.to_str().unwrap(),
        "--auth-tokens",
        tokens_path.to_str().unwrap(),
        "--gossip-key-file",
        gossip_key.to_str().unwrap(),
        "--secure",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(extra.iter().map(|s| s.to_string()))
    .collect();
    spec
}
