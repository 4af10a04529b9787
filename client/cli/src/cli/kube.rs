//! The Kubernetes API, as much of it as `tally admin k8s-pre-stop` needs:
//! the pod's service account (token, CA certificate, namespace), one HTTPS
//! GET to the API server with them, and a StatefulSet's desired replica
//! count from its `scale` subresource.
//!
//! No Kubernetes client crate: the command makes one GET of a small JSON
//! object. The request is HTTP/1.1 with `Connection: close` and the
//! response is read to its end, so [`parse_response`] (pure) only has to
//! take a status line, the headers that frame the body (`Content-Length`,
//! chunked `Transfer-Encoding`) and the body. TLS is rustls with the ring
//! provider given to the config itself (never installed as the process
//! default), verifying the API server against the service account's
//! `ca.crt`.
//!
//! Every error names what failed and what to do (`GET` refused with 403:
//! the RBAC objects of `deploy/k8s/base/rbac.yaml`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where Kubernetes mounts a pod's service account credentials.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The longest response read: a Scale object or a Status is well under
/// a kilobyte.
const MAX_RESPONSE_BYTES: u64 = 1 << 20;

/// How long one request may take, connection and TLS handshake included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A service account's credentials, as mounted in the pod.
pub struct ServiceAccount {
    /// The directory they were read from (for messages).
    pub dir: PathBuf,
    /// The bearer token.
    pub token: String,
    /// The PEM CA certificate(s) that sign the API server's certificate.
    pub ca_pem: Vec<u8>,
    /// The pod's namespace, when the directory has the `namespace` file.
    pub namespace: Option<String>,
}

impl ServiceAccount {
    /// Reads `DIR/token`, `DIR/ca.crt` and, if present, `DIR/namespace`.
    pub fn load(dir: &Path) -> anyhow::Result<ServiceAccount> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|error| (path, error))
        };
        let missing = |(path, error): (PathBuf, std::io::Error)| {
            anyhow!(
                "cannot read the service account's {}: {error}; the pod needs its service \
                 account token mounted (serviceAccountName: tally and \
                 automountServiceAccountToken: true, see deploy/k8s/base/statefulset.yaml), \
                 or give --kube-credentials DIR",
                path.display()
            )
        };
        let token = String::from_utf8_lossy(&read("token").map_err(missing)?)
            .trim()
            .to_owned();
        if token.is_empty() {
            bail!(
                "the service account token {} is empty",
                dir.join("token").display()
            );
        }
        let ca_pem = read("ca.crt").map_err(missing)?;
        let namespace = read("namespace")
            .ok()
            .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_owned())
            .filter(|namespace| !namespace.is_empty());
        Ok(ServiceAccount {
            dir: dir.to_owned(),
            token,
            ca_pem,
            namespace,
        })
    }
}

/// The API server's URL inside a pod, from the variables Kubernetes sets
/// in every container (`KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT`).
pub fn in_cluster_url(host: Option<&str>, port: Option<&str>) -> Result<String, String> {
    let host = host.filter(|host| !host.is_empty()).ok_or(
        "KUBERNETES_SERVICE_HOST is not set, so this is not a Kubernetes pod: run the command \
         as a pod's preStop hook, or give --kube-api https://HOST:PORT",
    )?;
    let port = port.filter(|port| !port.is_empty()).unwrap_or("443");
    Ok(if host.contains(':') {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    })
}

/// An `https://host[:port]` URL, split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiUrl {
    /// The host: a name or an IP address (without brackets).
    pub host: String,
    /// The port (443 when the URL names none).
    pub port: u16,
}

impl ApiUrl {
    /// Parses `https://host[:port]`, with `[v6]` hosts; a trailing `/` is
    /// allowed, a path is not.
    pub fn parse(url: &str) -> Result<ApiUrl, String> {
        let rest = url
            .strip_prefix("https://")
            .ok_or_else(|| format!("{url:?} is not an https:// URL"))?;
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.is_empty() || authority.contains('/') {
            return Err(format!(
                "{url:?} must be https://HOST[:PORT], without a path"
            ));
        }
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6
                    .split_once(']')
                    .ok_or_else(|| format!("{url:?} has an unclosed [ in its host"))?;
                (host, after.strip_prefix(':'))
            }
            None => match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            },
        };
        let port = match port {
            None => 443,
            Some(port) => port
                .parse()
                .map_err(|_| format!("{url:?} has no valid port after the host"))?,
        };
        Ok(ApiUrl {
            host: host.to_owned(),
            port,
        })
    }

    /// `host:port`, with brackets around an IPv6 host (the `Host` header).
    fn authority(&self) -> String {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => format!("[{}]:{}", self.host, self.port),
            _ => format!("{}:{}", self.host, self.port),
        }
    }
}

/// An HTTP response: its status code and its body, unframed.
#[derive(Debug, PartialEq, Eq)]
pub struct HttpResponse {
    /// The status code (200, 403...).
    pub status: u16,
    /// The body, with any chunked framing removed.
    pub body: Vec<u8>,
}

/// Parses a whole HTTP/1.x response (read until the server closed the
/// connection). A body framed by `Content-Length` or chunked must be
/// complete; without either, the body is everything after the headers.
pub fn parse_response(raw: &[u8]) -> Result<HttpResponse, String> {
    let head_end = find(raw, b"\r\n\r\n").ok_or("the response ended inside its headers")?;
    let head = std::str::from_utf8(&raw[..head_end])
        .map_err(|_| "the response headers are not UTF-8".to_owned())?;
    let body = &raw[head_end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = match status_line.split(' ').collect::<Vec<_>>()[..] {
        [version, code, ..] if version.starts_with("HTTP/1.") => code.parse::<u16>().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("not an HTTP/1.x status line: {status_line:?}"))?;
    let mut content_length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            content_length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| format!("bad Content-Length {value:?}"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        }
    }
    let body = if chunked {
        decode_chunked(body)?
    } else if let Some(length) = content_length {
        body.get(..length)
            .ok_or_else(|| {
                format!(
                    "the response ended after {} of its {length} body bytes",
                    body.len()
                )
            })?
            .to_vec()
    } else {
        body.to_vec()
    };
    Ok(HttpResponse { status, body })
}

/// Removes chunked transfer framing (chunk extensions and trailers are
/// skipped); the last, empty chunk must be there.
fn decode_chunked(mut framed: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let line_end = find(framed, b"\r\n").ok_or("the chunked body ended inside a chunk size")?;
        let size_text = String::from_utf8_lossy(&framed[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        framed = &framed[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        let chunk = framed
            .get(..size)
            .ok_or("the chunked body ended inside a chunk")?;
        body.extend_from_slice(chunk);
        framed = framed
            .get(size..)
            .and_then(|rest| rest.strip_prefix(b"\r\n"))
            .ok_or("a chunk does not end with CRLF")?;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// `spec.replicas` of a `Scale` object (autoscaling/v1). The API leaves
/// the field out when it is 0 (`omitempty`), so a `spec` without it is 0.
pub fn scale_replicas(body: &[u8]) -> Result<u32, String> {
    let scale: serde_json::Value =
        serde_json::from_slice(body).map_err(|error| format!("not JSON ({error})"))?;
    let kind = scale.get("kind").and_then(|kind| kind.as_str());
    if kind.is_some_and(|kind| kind != "Scale") {
        return Err(format!("a {} object, not a Scale", kind.unwrap_or("?")));
    }
    let spec = scale
        .get("spec")
        .and_then(|spec| spec.as_object())
        .ok_or("no spec object")?;
    match spec.get("replicas") {
        None | Some(serde_json::Value::Null) => Ok(0),
        Some(replicas) => replicas
            .as_u64()
            .and_then(|replicas| u32::try_from(replicas).ok())
            .ok_or_else(|| format!("spec.replicas is {replicas}, not a replica count")),
    }
}

/// The `message` of a Kubernetes `Status` object (an error's body), if the
/// body is one.
pub fn status_message(body: &[u8]) -> Option<String> {
    let status: serde_json::Value = serde_json::from_slice(body).ok()?;
    status
        .get("message")?
        .as_str()
        .map(str::to_owned)
        .filter(|message| !message.is_empty())
}

/// The Kubernetes API server, reached with a service account.
pub struct KubeApi {
    url: String,
    api: ApiUrl,
    token: String,
    credentials_dir: PathBuf,
    tls: tokio_rustls::TlsConnector,
}

impl KubeApi {
    /// The API at `url` (`https://host:port`), trusting the account's CA.
    pub fn new(url: &str, account: &ServiceAccount) -> anyhow::Result<KubeApi> {
        let api = ApiUrl::parse(url).map_err(|problem| anyhow!("--kube-api: {problem}"))?;
        let ca_path = account.dir.join("ca.crt");
        let mut roots = rustls::RootCertStore::empty();
        for certificate in CertificateDer::pem_slice_iter(&account.ca_pem) {
            let certificate = certificate
                .map_err(|error| anyhow!("{}: not PEM certificates: {error}", ca_path.display()))?;
            roots.add(certificate).map_err(|error| {
                anyhow!("{}: unusable CA certificate: {error}", ca_path.display())
            })?;
        }
        if roots.is_empty() {
            bail!("{}: holds no PEM certificate", ca_path.display());
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS to the Kubernetes API")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(KubeApi {
            url: url.trim_end_matches('/').to_owned(),
            api,
            token: account.token.clone(),
            credentials_dir: account.dir.clone(),
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
        })
    }

    /// `GET path` (e.g. `/apis/apps/v1/...`): the response, whatever its
    /// status; an error only when no response came.
    pub async fn get(&self, path: &str) -> anyhow::Result<HttpResponse> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.get_unbounded(path))
            .await
            .map_err(|_| {
                anyhow!(
                    "the Kubernetes API at {} did not answer GET {path} within {}s",
                    self.url,
                    REQUEST_TIMEOUT.as_secs()
                )
            })?
            .with_context(|| {
                format!(
                    "cannot GET {path} from the Kubernetes API at {} (does a NetworkPolicy \
                     block the pod's egress to it?)",
                    self.url
                )
            })
    }

    async fn get_unbounded(&self, path: &str) -> anyhow::Result<HttpResponse> {
        let tcp = tokio::net::TcpStream::connect((self.api.host.as_str(), self.api.port))
            .await
            .context("cannot connect")?;
        let server_name = ServerName::try_from(self.api.host.clone())
            .map_err(|error| anyhow!("{:?} is not a host name: {error}", self.api.host))?;
        let mut stream = self
            .tls
            .connect(server_name, tcp)
            .await
            .context("TLS handshake failed (is ca.crt the cluster's CA?)")?;
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
             Accept: application/json\r\nUser-Agent: tally/{}\r\nConnection: close\r\n\r\n",
            self.api.authority(),
            self.token,
            env!("CARGO_PKG_VERSION"),
        );
        stream.write_all(request.as_bytes()).await?;
        stream.flush().await?;
        let mut raw = Vec::new();
        let read = (&mut stream)
            .take(MAX_RESPONSE_BYTES)
            .read_to_end(&mut raw)
            .await;
        // A server that closes without TLS close_notify ends the read with
        // UnexpectedEof: what came is still whole if its framing says so.
        if let Err(error) = read {
            if error.kind() != std::io::ErrorKind::UnexpectedEof || raw.is_empty() {
                return Err(error).context("reading the response");
            }
        }
        parse_response(&raw).map_err(|problem| anyhow!("a malformed HTTP response: {problem}"))
    }

    /// The desired replica count of StatefulSet `namespace/name` (its
    /// `scale` subresource's `spec.replicas`).
    pub async fn statefulset_replicas(&self, namespace: &str, name: &str) -> anyhow::Result<u32> {
        let path = format!("/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}/scale");
        let response = self.get(&path).await?;
        let said = status_message(&response.body)
            .map(|message| format!("; the API says: {message}"))
            .unwrap_or_default();
        match response.status {
            200 => scale_replicas(&response.body).map_err(|problem| {
                anyhow!("the Kubernetes API answered GET {path} with something other than a Scale object: {problem}")
            }),
            401 => bail!(
                "the Kubernetes API at {} refused the service account token of {} (401 \
                 Unauthorized{said}): mount the pod's own service account token \
                 (automountServiceAccountToken: true), or give --kube-credentials",
                self.url,
                self.credentials_dir.display()
            ),
            403 => bail!(
                "the Kubernetes API forbids this pod's service account to read the scale of \
                 StatefulSet {namespace}/{name} (403 Forbidden{said}): apply the ServiceAccount, \
                 Role and RoleBinding of deploy/k8s/base/rbac.yaml (RBAC: get on \
                 statefulsets/scale, resourceNames [{name}]) and run the pod with \
                 serviceAccountName: tally"
            ),
            404 => bail!(
                "the Kubernetes API has no StatefulSet {namespace}/{name} (404 Not Found{said}): \
                 it was deleted, or give --statefulset and --namespace"
            ),
            status => bail!("the Kubernetes API answered GET {path} with HTTP {status}{said}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn parsed(raw: &str) -> HttpResponse {
        parse_response(raw.as_bytes()).unwrap_or_else(|problem| panic!("{raw:?}: {problem}"))
    }

    #[test]
    fn responses_framed_by_length_by_chunks_or_by_the_close_parse() {
        let sized = parsed("HTTP/1.1 200 OK\r\nContent-Length: 4\r\nX: y\r\n\r\nbody");
        assert_eq!((sized.status, sized.body.as_slice()), (200, &b"body"[..]));
        let chunked = parsed(
            "HTTP/1.1 403 Forbidden\r\ntransfer-encoding: chunked\r\n\r\n\
             3;ext=1\r\nabc\r\nA\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\n",
        );
        assert_eq!(chunked.status, 403);
        assert_eq!(chunked.body, b"abc0123456789");
        let closed = parsed("HTTP/1.0 404 Not Found\r\n\r\n{}");
        assert_eq!((closed.status, closed.body.as_slice()), (404, &b"{}"[..]));
    }

    #[test]
    fn cut_or_malformed_responses_are_refused() {
        for (raw, problem) in [
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort",
                "ended after 5 of its 9",
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
                "inside a chunk",
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                "bad chunk size",
            ),
            ("HTTP/1.1 200 OK\r\nContent-Le", "inside its headers"),
            ("SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x status line"),
        ] {
            let error = parse_response(raw.as_bytes()).unwrap_err();
            assert!(error.contains(problem), "{raw:?}: {error}");
        }
    }

    #[test]
    fn the_replica_count_comes_from_the_scale_spec_and_zero_may_be_left_out() {
        let scale = br#"{"kind":"Scale","apiVersion":"autoscaling/v1",
            "metadata":{"name":"tally","namespace":"tally"},
            "spec":{"replicas":3},"status":{"replicas":4,"selector":"app=tally"}}"#;
        assert_eq!(scale_replicas(scale), Ok(3));
        assert_eq!(scale_replicas(br#"{"kind":"Scale","spec":{}}"#), Ok(0));
        for (body, problem) in [
            (&b"<html>"[..], "not JSON"),
            (br#"{"kind":"Status","message":"x"}"#, "a Status object"),
            (br#"{"kind":"Scale"}"#, "no spec"),
            (br#"{"spec":{"replicas":-1}}"#, "not a replica count"),
            (br#"{"spec":{"replicas":"3"}}"#, "not a replica count"),
        ] {
            let error = scale_replicas(body).unwrap_err();
            assert!(error.contains(problem), "{error}");
        }
    }

    #[test]
    fn a_status_body_gives_its_message() {
        let forbidden = br#"{"kind":"Status","status":"Failure","message":"statefulsets.apps \"tally\" is forbidden","reason":"Forbidden","code":403}"#;
        assert_eq!(
            status_message(forbidden).as_deref(),
            Some("statefulsets.apps \"tally\" is forbidden")
        );
        assert_eq!(status_message(b"forbidden"), None);
    }

    #[test]
    fn api_urls_come_from_the_pod_environment_or_a_flag() {
        assert_eq!(
            in_cluster_url(Some("10.96.0.1"), Some("443")).as_deref(),
            Ok("https://10.96.0.1:443")
        );
        assert_eq!(
            in_cluster_url(Some("fd00::1"), None).as_deref(),
            Ok("https://[fd00::1]:443")
        );
        assert!(in_cluster_url(None, Some("443"))
            .unwrap_err()
            .contains("--kube-api"));
        let url = |host: &str, port| ApiUrl {
            host: host.into(),
            port,
        };
        assert_eq!(
            ApiUrl::parse("https://10.96.0.1:6443/"),
            Ok(url("10.96.0.1", 6443))
        );
        assert_eq!(
            ApiUrl::parse("https://[fd00::1]:443"),
            Ok(url("fd00::1", 443))
        );
        assert_eq!(
            ApiUrl::parse("https://kubernetes.default.svc"),
            Ok(url("kubernetes.default.svc", 443))
        );
        assert_eq!(url("fd00::1", 443).authority(), "[fd00::1]:443");
        for bad in [
            "http://10.0.0.1",
            "https://h:port",
            "https://h/api",
            "https://",
        ] {
            assert!(ApiUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
