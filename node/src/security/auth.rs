//! Bearer tokens, their roles, and the per-token rate limit (a token bucket
//! per token).
//!
//! The tokens file holds one `NAME TOKEN ROLES` per line, ROLES a comma list
//! of `read` (gets, watches, like lookups, status, the partition map),
//! `write` (adds, likes, observes; reads too) and `admin` (backup, drain,
//! remove, retire, finalize; reads too); blank lines and lines starting with
//! `#` are ignored. A line without roles (`NAME TOKEN`, the file of earlier
//! releases) keeps every role, with a warning at start. A request to
//! `Counters`, `Likes` or `Admin` must carry `authorization: Bearer TOKEN`; a
//! missing or unknown token gets `UNAUTHENTICATED`, a token without the
//! role the call needs `PERMISSION_DENIED`, a token over its rate
//! `RESOURCE_EXHAUSTED` with a `retry-after-ms` header and the wait in the
//! message.
//!
//! A request another node forwarded to this one (it carries
//! `tally-forwarded`, see `api::forward`) is let in on the sending node's
//! certificate instead: tokens require TLS, a certificate presented on the
//! gRPC port chains to the cluster CA or the handshake fails, and only a
//! node certificate (`super::identity`) counts; a client certificate gets
//! no such pass. The forwarding node checked the caller's
//! token and charged its rate; the owner does neither again. Without a
//! certificate, a forwarded request needs a token like any other (the
//! marker alone grants nothing: it only makes the node serve locally).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tonic::{Request, Status};

pub use super::roles::{Authorized, NeedsRole, Received, Role, Roles};

use crate::metrics::{Metrics, ReasonLabels};

/// An authenticated caller: its token's name and roles.
#[derive(Clone, Debug)]
pub struct Token {
    /// The token's name in the file.
    pub name: String,
    /// What it may do.
    pub roles: Roles,
}

/// The known tokens and their buckets.
pub struct Auth {
    /// Token -> its name and roles.
    tokens: HashMap<String, Token>,
    /// Lines without roles (an earlier release's file): each has every role.
    lines_without_roles: usize,
    rate_per_sec: u32,
    burst: u32,
    buckets: Mutex<HashMap<String, Bucket>>,
}

struct Bucket {
    available: f64,
    updated: Instant,
}

/// The name of the authenticated caller, put in the request's extensions.
#[derive(Clone, Debug)]
pub struct Caller(pub String);

/// The rate limit of the caller's token, put in the request's extensions
/// when tokens are on: a batch charges its items beyond the first (the
/// interceptor took one for the request).
#[derive(Clone)]
pub struct ItemCharge {
    auth: Arc<Auth>,
    name: String,
}

impl ItemCharge {
    /// The charge of `name`'s token (for the HTTP API, which checks tokens
    /// itself rather than through the tonic interceptor).
    pub fn new(auth: Arc<Auth>, name: String) -> ItemCharge {
        ItemCharge { auth, name }
    }

    /// Charges `items` more requests to the token. The bucket may go below
    /// zero: the batch is served, and the token's next requests wait until
    /// it has paid back, so its rate counts items, whatever the batch size
    /// (a batch larger than the burst would otherwise never pass).
    pub fn charge(&self, items: usize) {
        self.auth.charge(&self.name, items);
    }
}

/// Why a tokens file (`--auth-tokens`) was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    /// The file could not be read.
    #[error("--auth-tokens {path}: cannot read the file: {error}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The failure (not a `source`: its text is in the message).
        error: std::io::Error,
    },
    /// A problem inside the file, with the file named.
    #[error("--auth-tokens {path}: {problem}")]
    InFile {
        /// The file.
        path: PathBuf,
        /// The problem (not a `source`: its text is in the message).
        problem: Box<TokensError>,
    },
    /// A line that is not two or three words.
    #[error(
        "line {line}: expected `NAME TOKEN ROLES` (ROLES: read, write, admin, comma-separated)"
    )]
    NotNameAndToken {
        /// The line number, from 1.
        line: usize,
    },
    /// A role that is not `read`, `write` or `admin`.
    #[error("line {line}: unknown role {role:?}; the roles are read, write and admin, comma-separated (e.g. `web TOKEN read,write`)")]
    UnknownRole {
        /// The line number, from 1.
        line: usize,
        /// The word given.
        role: String,
    },
    /// A token too short to be a secret.
    #[error("line {line}: the token of {name:?} is shorter than {MIN_TOKEN_CHARS} characters")]
    ShortToken {
        /// The line number, from 1.
        line: usize,
        /// The token's name.
        name: String,
    },
    /// A token given twice.
    #[error("line {line}: the same token appears twice")]
    RepeatedToken {
        /// The line number, from 1.
        line: usize,
    },
    /// No token at all.
    #[error("the file holds no token")]
    Empty,
}

/// The shortest token accepted.
pub const MIN_TOKEN_CHARS: usize = 16;

impl Auth {
    /// Reads the tokens file.
    pub fn load(path: &Path, rate_per_sec: u32, burst: u32) -> Result<Auth, TokensError> {
        let text = std::fs::read_to_string(path).map_err(|error| TokensError::Unreadable {
            path: path.to_path_buf(),
            error,
        })?;
        let auth =
            Auth::parse(&text, rate_per_sec, burst).map_err(|problem| TokensError::InFile {
                path: path.to_path_buf(),
                problem: Box::new(problem),
            })?;
        if auth.lines_without_roles > 0 {
            tracing::warn!(
                file = %path.display(),
                lines = auth.lines_without_roles,
                "tokens without roles keep every role (read, write, admin), as in earlier \
                 releases; give each line its roles (`NAME TOKEN read,write`) so that an \
                 application's token cannot drain or back up the node"
            );
        }
        Ok(auth)
    }

    /// Parses the tokens file's text.
    pub fn parse(text: &str, rate_per_sec: u32, burst: u32) -> Result<Auth, TokensError> {
        let mut tokens = HashMap::new();
        let mut lines_without_roles = 0;
        for (number, line) in text.lines().enumerate() {
            let line_number = number + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(name), Some(token), roles, None) =
                (words.next(), words.next(), words.next(), words.next())
            else {
                return Err(TokensError::NotNameAndToken { line: line_number });
            };
            let roles = match roles {
                None => {
                    lines_without_roles += 1;
                    Roles::ALL
                }
                Some(roles) => Roles::parse(roles).map_err(|role| TokensError::UnknownRole {
                    line: line_number,
                    role,
                })?,
            };
            if token.len() < MIN_TOKEN_CHARS {
                return Err(TokensError::ShortToken {
                    line: line_number,
                    name: name.to_string(),
                });
            }
            let entry = Token {
                name: name.to_string(),
                roles,
            };
            if tokens.insert(token.to_string(), entry).is_some() {
                return Err(TokensError::RepeatedToken { line: line_number });
            }
        }
        if tokens.is_empty() {
            return Err(TokensError::Empty);
        }
        Ok(Auth {
            tokens,
            lines_without_roles,
            rate_per_sec,
            burst: burst.max(1),
            buckets: Mutex::new(HashMap::new()),
        })
    }

    /// The caller's name, or why it is refused; the token must allow `role`.
    pub fn check(&self, authorization: Option<&str>, role: Role) -> Result<String, Status> {
        let Some(header) = authorization else {
            return Err(Status::unauthenticated(
                "missing `authorization: Bearer TOKEN`: this node requires a client token",
            ));
        };
        let token = header.strip_prefix("Bearer ").unwrap_or("");
        let Some(Token { name, roles }) = self.tokens.get(token.trim()) else {
            return Err(Status::unauthenticated(
                "the bearer token is not one this node knows",
            ));
        };
        if !roles.allow(role) {
            return Err(Status::permission_denied(format!(
                "token {name:?} has the roles {}; this call needs {}: use a token with that \
                 role (roles are set per line of the node's --auth-tokens file)",
                roles.names(),
                role.name()
            )));
        }
        if let Some(retry_after_ms) = self.take(name) {
            let mut status = Status::resource_exhausted(format!(
                "token {name:?} is over its rate of {} requests/s; retry after {retry_after_ms} ms",
                self.rate_per_sec
            ));
            if let Ok(value) = retry_after_ms.to_string().parse() {
                status.metadata_mut().insert("retry-after-ms", value);
            }
            return Err(status);
        }
        Ok(name.clone())
    }

    /// Takes `items` from `name`'s bucket, into debt if need be.
    fn charge(&self, name: &str, items: usize) {
        if self.rate_per_sec == 0 || items == 0 {
            return;
        }
        self.with_refilled_bucket(name, |bucket| bucket.available -= items as f64);
    }

    /// Runs `use_bucket` on `name`'s bucket, refilled at the rate up to the
    /// burst for the time since it was last used.
    fn with_refilled_bucket<T>(&self, name: &str, use_bucket: impl FnOnce(&mut Bucket) -> T) -> T {
        let now = Instant::now();
        let rate = f64::from(self.rate_per_sec);
        let burst = f64::from(self.burst);
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry(name.to_string()).or_insert(Bucket {
            available: burst,
            updated: now,
        });
        bucket.available =
            (bucket.available + now.duration_since(bucket.updated).as_secs_f64() * rate).min(burst);
        bucket.updated = now;
        use_bucket(bucket)
    }

    /// Takes one request from `name`'s bucket; `Some(wait in ms)` when empty.
    fn take(&self, name: &str) -> Option<u64> {
        if self.rate_per_sec == 0 {
            return None;
        }
        let rate = f64::from(self.rate_per_sec);
        self.with_refilled_bucket(name, |bucket| {
            if bucket.available >= 1.0 {
                bucket.available -= 1.0;
                None
            } else {
                Some((((1.0 - bucket.available) / rate) * 1000.0).ceil() as u64)
            }
        })
    }
}

/// The tonic interceptor of the client-facing services.
#[derive(Clone)]
pub struct AuthInterceptor {
    auth: Option<Arc<Auth>>,
    metrics: Arc<Metrics>,
}

impl AuthInterceptor {
    /// Checks tokens with `auth`, or lets everyone in when it is `None`.
    pub fn new(auth: Option<Arc<Auth>>, metrics: Arc<Metrics>) -> Self {
        AuthInterceptor { auth, metrics }
    }
}

impl tonic::service::Interceptor for AuthInterceptor {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let Some(auth) = &self.auth else {
            return Ok(request);
        };
        if crate::api::forward::is_forwarded(request.metadata())
            && super::PeerIdentity::of_request(&request).is_node()
        {
            request
                .extensions_mut()
                .insert(Caller("forwarding node".to_string()));
            return Ok(request);
        }
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        // Set by `Authorized` from the method's path; a request without it
        // needs the most.
        let role = request
            .extensions()
            .get::<NeedsRole>()
            .map_or(Role::Admin, |needs| needs.0);
        match auth.check(header, role) {
            Ok(name) => {
                request.extensions_mut().insert(ItemCharge {
                    auth: auth.clone(),
                    name: name.clone(),
                });
                request.extensions_mut().insert(Caller(name));
                Ok(request)
            }
            Err(status) => {
                let reason = refusal_reason(&status);
                self.metrics
                    .auth_refusals
                    .get_or_create(&ReasonLabels {
                        reason: reason.into(),
                    })
                    .inc();
                Err(status)
            }
        }
    }
}

/// The `reason` label of a refused token check.
pub fn refusal_reason(status: &Status) -> &'static str {
    match status.code() {
        tonic::Code::ResourceExhausted => "rate_limited",
        tonic::Code::PermissionDenied => "role",
        _ => "unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# tokens\nweb  0123456789abcdef0123\n\nbatch fedcba9876543210fedc\n";

    #[test]
    fn known_tokens_pass_and_others_are_unauthenticated() {
        let auth = Auth::parse(FILE, 0, 0).unwrap();
        assert_eq!(
            auth.check(Some("Bearer 0123456789abcdef0123"), Role::Read)
                .unwrap(),
            "web"
        );
        for header in [
            None,
            Some("Bearer nope"),
            Some("0123456789abcdef0123"),
            Some("Basic x"),
        ] {
            assert_eq!(
                auth.check(header, Role::Read).unwrap_err().code(),
                tonic::Code::Unauthenticated,
                "{header:?}"
            );
        }
    }

    #[test]
    fn a_token_over_its_rate_is_told_when_to_retry() {
        let auth = Auth::parse(FILE, 2, 3).unwrap();
        for _ in 0..3 {
            auth.check(Some("Bearer 0123456789abcdef0123"), Role::Read)
                .unwrap();
        }
        let refused = auth
            .check(Some("Bearer 0123456789abcdef0123"), Role::Read)
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("retry after"),
            "{}",
            refused.message()
        );
        assert!(refused.metadata().get("retry-after-ms").is_some());
        // Another token has its own bucket.
        auth.check(Some("Bearer fedcba9876543210fedc"), Role::Read)
            .unwrap();
    }

    /// A batch pays per item: the interceptor lets it in with one token
    /// and hands the handler the charge for the rest, and the token's next
    /// request waits until the batch is paid for.
    #[test]
    fn a_batch_counts_as_one_request_per_item() {
        use tonic::service::Interceptor;
        let auth = Arc::new(Auth::parse(FILE, 1, 5).unwrap());
        let mut interceptor = AuthInterceptor::new(Some(auth.clone()), Arc::new(Metrics::new()));
        let mut request = Request::new(());
        request.metadata_mut().insert(
            "authorization",
            "Bearer 0123456789abcdef0123".parse().unwrap(),
        );
        let request = interceptor.call(request).unwrap();
        let charge = request
            .extensions()
            .get::<ItemCharge>()
            .expect("the request carries its token's charge");
        charge.charge(49);
        let refused = auth
            .check(Some("Bearer 0123456789abcdef0123"), Role::Read)
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        // About 45 s of debt at 1 request/s (50 items, 5 of burst).
        let wait: u64 = refused
            .metadata()
            .get("retry-after-ms")
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(wait > 40_000, "{wait} ms");
        auth.check(Some("Bearer fedcba9876543210fedc"), Role::Read)
            .unwrap();
    }

    #[test]
    fn bad_files_are_typed_errors_that_name_the_file_and_line() {
        assert!(matches!(
            Auth::parse("web short\n", 0, 0),
            Err(TokensError::ShortToken { line: 1, .. })
        ));
        assert!(matches!(
            Auth::parse(
                "# a\nweb 0123456789abcdef0123\nweb 0123456789abcdef0123\n",
                0,
                0
            ),
            Err(TokensError::RepeatedToken { line: 3 })
        ));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "one two read four\n").unwrap();
        let error = Auth::load(&path, 0, 0).err().unwrap();
        assert!(matches!(&error, TokensError::InFile { problem, .. }
            if matches!(**problem, TokensError::NotNameAndToken { line: 1 })));
        let text = error.to_string();
        assert!(
            text.contains(&*path.to_string_lossy()) && text.contains("line 1"),
            "{text}"
        );
        let missing = Auth::load(&dir.path().join("nope"), 0, 0).err().unwrap();
        assert!(
            matches!(missing, TokensError::Unreadable { .. }),
            "{missing}"
        );
    }

    /// Roles per line: a read token reads only, a write token writes and
    /// reads, an admin token administers and reads; a line without roles
    /// (an earlier release's file) keeps every role.
    #[test]
    fn a_token_may_do_what_its_roles_allow() {
        let auth = Auth::parse(
            "reader 0123456789abcdef0001 read\n\
             writer 0123456789abcdef0002 write\n\
             ops 0123456789abcdef0003 admin\n\
             old 0123456789abcdef0004\n",
            0,
            0,
        )
        .unwrap();
        assert_eq!(auth.lines_without_roles, 1);
        let allowed = |token: &str, role| auth.check(Some(&format!("Bearer {token}")), role);
        assert!(allowed("0123456789abcdef0001", Role::Read).is_ok());
        for role in [Role::Write, Role::Admin] {
            let refused = allowed("0123456789abcdef0001", role).unwrap_err();
            assert_eq!(refused.code(), tonic::Code::PermissionDenied);
            assert!(
                refused.message().contains(role.name()),
                "{}",
                refused.message()
            );
        }
        assert!(allowed("0123456789abcdef0002", Role::Write).is_ok());
        assert!(allowed("0123456789abcdef0002", Role::Read).is_ok());
        assert!(allowed("0123456789abcdef0002", Role::Admin).is_err());
        assert!(allowed("0123456789abcdef0003", Role::Admin).is_ok());
        assert!(allowed("0123456789abcdef0003", Role::Read).is_ok());
        assert!(allowed("0123456789abcdef0003", Role::Write).is_err());
        for role in [Role::Read, Role::Write, Role::Admin] {
            assert!(allowed("0123456789abcdef0004", role).is_ok());
        }
        assert!(matches!(
            Auth::parse("web 0123456789abcdef0001 read,root\n", 0, 0),
            Err(TokensError::UnknownRole { line: 1, ref role }) if role == "root"
        ));
    }

    #[test]
    fn bad_files_are_refused_with_the_line() {
        let short = Auth::parse("web short\n", 0, 0).err().unwrap();
        assert!(short.to_string().contains("line 1"), "{short}");
        assert!(Auth::parse("just-one-word\n", 0, 0).is_err());
        assert!(Auth::parse("# nothing\n", 0, 0).is_err());
    }
}
