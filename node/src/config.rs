//! The node's settings: command-line flags, `TALLY_*` environment variables
//! and a TOML file (`--config`), in that order of precedence, then defaults.
//!
//! Every setting is checked at start; a bad one stops the node with a message
//! that names it and where it came from. An unknown key in the file is an
//! error too. Failures are [`ConfigError`]s (typed, one variant per mistake).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The smallest page cache sled is given (it needs room for a few pages).
const MIN_STORE_CACHE_BYTES: u64 = 1 << 20;

/// The largest `--replication-factor`.
pub const MAX_REPLICATION_FACTOR: u64 = 7;

/// The default `--replication-factor` (a region with fewer nodes keeps one
/// copy per node: the effective factor is `min(3, eligible nodes)`).
pub const DEFAULT_REPLICATION_FACTOR: u32 = 3;

/// `--dead-after` must be at least this many gossip intervals, so that a
/// missed heartbeat (failure detection marks a node down after about eight
/// silent intervals) never moves a partition.
const DEAD_AFTER_MIN_GOSSIP_INTERVALS: u32 = 10;

/// Why the settings were refused. `setting` is where the value came from:
/// `--grpc-addr`, `TALLY_GRPC_ADDR` or `grpc_addr in FILE`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The `--config` file could not be read.
    #[error("cannot read the config file {}: {error}", path.display())]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Why (in the message, so not a `source`: printed once).
        error: std::io::Error,
    },
    /// The `--config` file is not valid TOML of known keys.
    #[error("config file {}: {problem}", path.display())]
    ParseFile {
        /// The file.
        path: PathBuf,
        /// What the TOML parser said.
        problem: String,
    },
    /// A bad region or node name.
    #[error(transparent)]
    Name(#[from] crate::replica::IdentityError),
    /// Not an `IP:PORT` or `HOST:PORT`.
    #[error("{setting} {text:?} is not an address: use IP:PORT or HOST:PORT, e.g. 127.0.0.1:7100")]
    NotAnAddress {
        /// Where the value came from.
        setting: String,
        /// The value.
        text: String,
    },
    /// A `HOST:PORT` whose host does not resolve.
    #[error("{setting} {text:?} does not resolve: {reason}")]
    DoesNotResolve {
        /// Where the value came from.
        setting: String,
        /// The value.
        text: String,
        /// The resolver's answer.
        reason: String,
    },
    /// Not an IP address (`--peer-source-ip`).
    #[error("{setting} {text:?} is not an IP address: use e.g. 10.0.1.5 or ::1")]
    NotAnIp {
        /// Where the value came from.
        setting: String,
        /// The value.
        text: String,
    },
    /// Not a number with a unit.
    #[error("{setting} {text:?} is not a duration: use e.g. 250ms, 10s, 5m or 24h")]
    NotADuration {
        /// Where the value came from.
        setting: String,
        /// The value.
        text: String,
    },
    /// A number with a unit other than ms, s, m or h.
    #[error("{setting} {text:?} has an unknown unit: use ms, s, m or h")]
    UnknownUnit {
        /// Where the value came from.
        setting: String,
        /// The value.
        text: String,
    },
    /// An empty cluster id.
    #[error("{setting} must not be empty: give the name every node of this cluster shares")]
    EmptyClusterId {
        /// Where the value came from.
        setting: String,
    },
    /// A sled page cache below `MIN_STORE_CACHE_BYTES`.
    #[error("{setting} {bytes} is too small: give at least {MIN_STORE_CACHE_BYTES} (1 MiB)")]
    CacheTooSmall {
        /// Where the value came from.
        setting: String,
        /// The value.
        bytes: u64,
    },
    /// A log format other than text or json.
    #[error("{setting} {text:?} is not valid: use text or json")]
    LogFormat {
        /// Where the value came from.
        setting: String,
        /// The value.
        text: String,
    },
    /// An event-stream heartbeat too short to be one.
    #[error("{setting} {text:?} is too short: give at least 100ms (a heartbeat only keeps idle streams open)")]
    HeartbeatTooShort {
        /// Where the value came from.
        setting: String,
        /// The value.
        text: String,
    },
    /// A CORS origin that is not one.
    #[error("{setting} {problem}")]
    CorsOrigin {
        /// Where the value came from.
        setting: String,
        /// What is wrong.
        problem: String,
    },
    /// A free-disk floor that is neither a size nor a percentage.
    #[error("{setting} {problem}")]
    DiskFloor {
        /// Where the value came from.
        setting: String,
        /// What is wrong with it, and what to give.
        problem: String,
    },
    /// A `--write-copies` outside 2 to [`crate::engine::MAX_WRITE_COPIES`].
    #[error("{setting} {copies} is not valid: replicated durability keeps an add on the node that takes it and on at least one more node of its region, so give 2 to {max} (nodes, this one included; at most the nodes of the region)", max = crate::engine::MAX_WRITE_COPIES)]
    WriteCopies {
        /// Where the value came from.
        setting: String,
        /// The value.
        copies: usize,
    },
    /// A zero sync or gossip interval.
    #[error("--sync-interval and --gossip-interval must be above zero")]
    ZeroInterval,
    /// A replication factor outside 1 to [`MAX_REPLICATION_FACTOR`].
    #[error("{setting} {factor} is not valid: give 1 to {MAX_REPLICATION_FACTOR} (copies of each partition in a region; a region with fewer nodes keeps one per node)")]
    ReplicationFactor {
        /// Where the value came from.
        setting: String,
        /// The value.
        factor: u64,
    },
    /// A `--dead-after` too short to be more than a missed heartbeat.
    #[error("{setting} {text:?} is too short: a node down this long loses its partitions, so give at least {min_ms} ms (ten gossip intervals, --gossip-interval), e.g. 5m")]
    DeadAfterTooShort {
        /// Where the value came from.
        setting: String,
        /// The value.
        text: String,
        /// The shortest allowed, in milliseconds.
        min_ms: u128,
    },
    /// A partition count out of range.
    #[error("{setting}: {problem}")]
    Partitions {
        /// Where the value came from.
        setting: String,
        /// What is wrong with it.
        problem: crate::partition::BadPartitionCount,
    },
}

use crate::engine::{Durability, FreeSpaceFloor};
use crate::security::SecuritySettings;
use crate::store::OnCorrupt;

/// Flags of `tally-node` (and of `tally-node run`).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct RunArgs {
    /// A TOML file with any of the settings below (snake_case names, e.g. `data_dir`).
    /// [default: none]
    #[arg(long, env = "TALLY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Where the node keeps its data; created if missing. A new or wiped directory is a new replica. [default: tally-data]
    #[arg(long, env = "TALLY_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// The region this node serves (fixed for the life of its data directory). [default: local]
    #[arg(long, env = "TALLY_REGION")]
    pub region: Option<String>,
    /// This node's name, unique in the cluster: a node whose name another live node holds
    /// refuses to start (it asks its seeds for about a second first); two that meet later are
    /// both replicated, and each logs an error every minute, shown in `tally status` and on
    /// the status page. [default: node-1]
    #[arg(long, env = "TALLY_NODE_NAME")]
    pub node_name: Option<String>,
    /// Address of the gRPC API (clients and peers). [default: 127.0.0.1:7100]
    #[arg(long, env = "TALLY_GRPC_ADDR")]
    pub grpc_addr: Option<String>,
    /// Address peers use to reach the gRPC API, when not --grpc-addr (e.g. behind NAT or
    /// when binding 0.0.0.0). [default: --grpc-addr]
    #[arg(long, env = "TALLY_ADVERTISE_GRPC_ADDR")]
    pub advertise_grpc_addr: Option<String>,
    /// Address of the HTTP port: the JSON API, /healthz, /readyz, /metrics and the status
    /// page. [default: 127.0.0.1:7102]
    #[arg(long, env = "TALLY_HTTP_ADDR", help_heading = "HTTP")]
    pub http_addr: Option<String>,
    /// UDP address for membership gossip (chitchat). [default: 127.0.0.1:7101]
    #[arg(long, env = "TALLY_GOSSIP_ADDR")]
    pub gossip_addr: Option<String>,
    /// Address peers use to reach the gossip port, when not --gossip-addr. [default: --gossip-addr]
    #[arg(long, env = "TALLY_ADVERTISE_GOSSIP_ADDR")]
    pub advertise_gossip_addr: Option<String>,
    /// The local IP that outgoing replication connections are bound to, for
    /// multi-homed hosts. [default: unset, the system chooses]
    #[arg(long, env = "TALLY_PEER_SOURCE_IP")]
    pub peer_source_ip: Option<String>,
    /// Gossip addresses (host:port, comma-separated) of nodes to join. [default: none]
    #[arg(long, env = "TALLY_SEEDS", value_delimiter = ',')]
    pub seeds: Option<Vec<String>>,
    /// The cluster's id; nodes of another cluster are refused. A data directory keeps the id
    /// it was first started with (in its CLUSTER file) and refuses another. [default: tally]
    #[arg(long, env = "TALLY_CLUSTER_ID")]
    pub cluster_id: Option<String>,
    /// The cluster's partition count P, fixed when the cluster is created: every node of
    /// every region must be given the same, and a data directory keeps the one it was
    /// created with (a different value is refused at start; a peer announcing another is
    /// refused). [default: the data directory's, or 1024 for a new one]
    #[arg(long, env = "TALLY_PARTITIONS")]
    pub partitions: Option<u64>,
    /// Copies of each partition per region (RF): a partition's owners in a region are the
    /// RF nodes of highest rendezvous weight among its joining and active nodes, or all of
    /// them when the region has fewer (1 to 7). [default: 3, so min(3, nodes in the region)]
    #[arg(long, env = "TALLY_REPLICATION_FACTOR")]
    pub replication_factor: Option<u64>,
    /// How long a node must have been down before the others take its partitions over,
    /// e.g. 5m; a shorter outage (or a missed heartbeat) moves nothing. At least ten
    /// gossip intervals. [default: 5m]
    #[arg(long, env = "TALLY_DEAD_AFTER")]
    pub dead_after: Option<String>,
    /// When an add is acknowledged: `sync` after it is flushed to disk (the default);
    /// `async` as soon as it is applied in memory, so a crash can lose the adds of the
    /// last commit interval (about a millisecond under load); `replicated` once it is
    /// flushed to disk here and on the other copies of the region (--write-copies),
    /// so a lost disk loses no acknowledged add. A request may ask for a stronger mode.
    /// [default: sync]
    #[arg(long, env = "TALLY_DURABILITY", value_enum)]
    pub durability: Option<Durability>,
    /// Nodes of the region that hold a `replicated` add before it is acknowledged,
    /// this one included (2 to 7); in a partitioned region these are nodes holding the key's
    /// partition, so keep --replication-factor at least as high. In a region with fewer nodes,
    /// or a partitioned one with a lower factor, replicated adds are refused
    /// (FAILED_PRECONDITION) before they are applied. [default: 2]
    #[arg(long, env = "TALLY_WRITE_COPIES")]
    pub write_copies: Option<usize>,
    /// Anti-entropy round interval, e.g. 200ms. [default: 200ms]
    #[arg(long, env = "TALLY_SYNC_INTERVAL")]
    pub sync_interval: Option<String>,
    /// Gossip round interval, e.g. 100ms (failure detection marks a node down after about
    /// eight silent rounds). [default: 100ms]
    #[arg(long, env = "TALLY_GOSSIP_INTERVAL")]
    pub gossip_interval: Option<String>,
    /// How long an old incarnation of a node (a wiped or replaced data
    /// directory) must have been down, while a newer one of the same node
    /// name is up, before it is retired and its slots are folded, e.g. 1h.
    /// [default: 1h]
    #[arg(long, env = "TALLY_RETIRE_AFTER")]
    pub retire_after: Option<String>,
    /// How long a node restarted on its old data directory holds adds at
    /// most (refusing them with UNAVAILABLE) while no peer has told it whether
    /// its replica id was retired while it was down, e.g. 15s; 0s turns the
    /// hold off. No hold on a fresh directory or one that never had a peer
    /// (a single-node cluster). [default: 15s]
    #[arg(long, env = "TALLY_RESTART_HOLD")]
    pub restart_hold: Option<String>,
    /// Counters kept in memory; colder ones stay on disk only. [default: 100000]
    #[arg(long, env = "TALLY_CACHE_CAPACITY")]
    pub cache_capacity: Option<usize>,
    /// Bytes of sled's page cache (cold counters, the change log and
    /// idempotency records read from disk). [default: 134217728, 128 MiB]
    #[arg(long, env = "TALLY_STORE_CACHE_BYTES")]
    pub store_cache_bytes: Option<u64>,
    /// How long an idempotency key is remembered, e.g. 24h. [default: 24h]
    #[arg(long, env = "TALLY_IDEMPOTENCY_TTL")]
    pub idempotency_ttl: Option<String>,
    /// How many idempotency keys are remembered at most (oldest forgotten first). [default: 1000000]
    #[arg(long, env = "TALLY_IDEMPOTENCY_CAPACITY")]
    pub idempotency_capacity: Option<usize>,
    /// What to do when the store cannot be opened: `refuse` to start, or `move-aside`
    /// the directory and start as a new replica that rebuilds from its peers. [default: refuse]
    #[arg(long, env = "TALLY_ON_CORRUPT", value_enum)]
    pub on_corrupt: Option<OnCorrupt>,
    /// Log format: `text` or `json` (one JSON object a line). [default: text]
    #[arg(long, env = "TALLY_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// PEM certificate of this node: TLS on the gRPC port, and the client certificate it
    /// presents to peers. Needs --tls-key and --tls-ca. [default: none]
    #[arg(long, env = "TALLY_TLS_CERT", help_heading = "Security")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert. [default: none]
    #[arg(long, env = "TALLY_TLS_KEY", help_heading = "Security")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate that signs every node of the cluster: peers must present a
    /// certificate it signed to pull from this node (mutual TLS). [default: none]
    #[arg(long, env = "TALLY_TLS_CA", help_heading = "Security")]
    pub tls_ca: Option<PathBuf>,
    /// File of client tokens, one `NAME TOKEN ROLES` per line (ROLES: read, write, admin, comma-separated); clients send `authorization: Bearer TOKEN`. Needs TLS. [default: none]
    #[arg(long, env = "TALLY_AUTH_TOKENS", help_heading = "Security")]
    pub auth_tokens: Option<PathBuf>,
    /// Requests per second allowed per token (0: no limit). [default: 0]
    #[arg(long, env = "TALLY_RATE_LIMIT", help_heading = "Security")]
    pub rate_limit: Option<u32>,
    /// Requests a token may send at once above its rate. [default: the rate]
    #[arg(long, env = "TALLY_RATE_BURST", help_heading = "Security")]
    pub rate_burst: Option<u32>,
    /// File of gossip keys, one per line (64 hex characters, `openssl rand -hex 32`): the
    /// first seals every gossip datagram, each one opens; a node without a key of the
    /// cluster cannot join membership nor publish anything. [default: gossip unsealed]
    #[arg(long, env = "TALLY_GOSSIP_KEY_FILE", help_heading = "Security")]
    pub gossip_key_file: Option<PathBuf>,
    /// With --gossip-key-file, also take plain gossip and answer it in plain: for turning
    /// sealing on in a running cluster, one node at a time; restart without it once every
    /// node seals. [default: off]
    #[arg(long, env = "TALLY_GOSSIP_ACCEPT_PLAIN", num_args = 0..=1, default_missing_value = "true", help_heading = "Security")]
    pub gossip_accept_plain: Option<bool>,
    /// Refuse to start unless TLS (--tls-cert, --tls-key, --tls-ca), --auth-tokens and
    /// --gossip-key-file are set. [default: off]
    #[arg(long, env = "TALLY_SECURE", num_args = 0..=1, default_missing_value = "true", help_heading = "Security")]
    pub secure: Option<bool>,
    /// Origins whose pages may call the JSON API from a browser (CORS), comma-separated:
    /// `https://example.com`, or `*` for any. [default: none, CORS off]
    #[arg(
        long,
        env = "TALLY_HTTP_CORS_ORIGIN",
        value_delimiter = ',',
        help_heading = "HTTP"
    )]
    pub http_cors_origin: Option<Vec<String>>,
    /// PEM certificate served on the HTTP port (HTTPS); needs --http-tls-key. May be the
    /// node's --tls-cert, or a certificate browsers trust. [default: plain HTTP]
    #[arg(long, env = "TALLY_HTTP_TLS_CERT", help_heading = "HTTP")]
    pub http_tls_cert: Option<PathBuf>,
    /// PEM private key of --http-tls-cert. [default: none]
    #[arg(long, env = "TALLY_HTTP_TLS_KEY", help_heading = "HTTP")]
    pub http_tls_key: Option<PathBuf>,
    /// The gap between heartbeat comments of an idle event stream, e.g. 15s. [default: 15s]
    #[arg(long, env = "TALLY_HTTP_EVENT_HEARTBEAT", help_heading = "HTTP")]
    pub http_event_heartbeat: Option<String>,
    /// Free space the data directory's filesystem must keep: below it adds are refused
    /// (RESOURCE_EXHAUSTED) while reads and replication go on. A size (1GiB, 512MiB) or a
    /// share of the filesystem (5%); 0 turns it off. [default: 5%, at most 1GiB]
    #[arg(long, env = "TALLY_MIN_FREE_DISK")]
    pub min_free_disk: Option<String>,
    /// How long a stop (SIGTERM, Ctrl-C) may take before the node exits anyway,
    /// logging what it could not commit, e.g. 10s. [default: 10s]
    #[arg(long, env = "TALLY_SHUTDOWN_GRACE")]
    pub shutdown_grace: Option<String>,
    /// Tests only: a file whose content (`fail`, `hang`) makes the store's flushes fail or hang.
    #[arg(long, hide = true)]
    pub test_store_fault_file: Option<PathBuf>,
    /// How the cluster version moves once every member speaks a newer one:
    /// `manual` waits for `tally admin finalize` (rollback stays possible until
    /// then), `auto` moves by itself. [default: manual]
    #[arg(long, env = "TALLY_CLUSTER_VERSION_UPGRADE", value_enum)]
    pub cluster_version_upgrade: Option<ClusterVersionUpgrade>,
}

/// How the cluster version moves (see `docs/src/operations/upgrades.md`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterVersionUpgrade {
    /// Only `tally admin finalize` (on any node) moves it; a node follows a
    /// member that was finalized (the default: keeps rollback possible).
    #[default]
    Manual,
    /// It moves as soon as every member speaks a newer version.
    Auto,
}

/// The same settings, as a TOML file holds them.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    data_dir: Option<PathBuf>,
    region: Option<String>,
    node_name: Option<String>,
    grpc_addr: Option<String>,
    advertise_grpc_addr: Option<String>,
    http_addr: Option<String>,
    gossip_addr: Option<String>,
    advertise_gossip_addr: Option<String>,
    peer_source_ip: Option<String>,
    seeds: Option<Vec<String>>,
    cluster_id: Option<String>,
    partitions: Option<u64>,
    replication_factor: Option<u64>,
    dead_after: Option<String>,
    durability: Option<Durability>,
    write_copies: Option<usize>,
    sync_interval: Option<String>,
    gossip_interval: Option<String>,
    retire_after: Option<String>,
    restart_hold: Option<String>,
    cache_capacity: Option<usize>,
    store_cache_bytes: Option<u64>,
    idempotency_ttl: Option<String>,
    idempotency_capacity: Option<usize>,
    on_corrupt: Option<OnCorrupt>,
    cluster_version_upgrade: Option<ClusterVersionUpgrade>,
    log_format: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    auth_tokens: Option<PathBuf>,
    rate_limit: Option<u32>,
    rate_burst: Option<u32>,
    gossip_key_file: Option<PathBuf>,
    gossip_accept_plain: Option<bool>,
    secure: Option<bool>,
    http_cors_origin: Option<Vec<String>>,
    http_tls_cert: Option<PathBuf>,
    http_tls_key: Option<PathBuf>,
    http_event_heartbeat: Option<String>,
    min_free_disk: Option<String>,
    shutdown_grace: Option<String>,
}

/// The keys a `--config` file accepts: `FileSettings`'s fields, as serde
/// itself lists them (so the configuration reference cannot name a key the
/// file refuses, nor miss one it takes).
pub fn file_keys() -> &'static [&'static str] {
    /// A deserializer that only records the field names a struct asks for.
    struct FieldNames(&'static [&'static str]);
    #[derive(Debug)]
    struct Recorded;
    impl std::fmt::Display for Recorded {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("field names recorded")
        }
    }
    impl std::error::Error for Recorded {}
    impl serde::de::Error for Recorded {
        fn custom<T: std::fmt::Display>(_: T) -> Self {
            Recorded
        }
    }
    impl<'de> serde::Deserializer<'de> for &mut FieldNames {
        type Error = Recorded;
        fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Recorded> {
            Err(Recorded)
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Recorded> {
            self.0 = fields;
            Err(Recorded)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    let mut names = FieldNames(&[]);
    let _ = FileSettings::deserialize(&mut names);
    names.0
}

/// Checked settings of one node.
#[derive(Clone, Debug)]
pub struct Settings {
    /// See [`RunArgs`].
    pub data_dir: PathBuf,
    /// See [`RunArgs`].
    pub region: String,
    /// See [`RunArgs`].
    pub node_name: String,
    /// See [`RunArgs`].
    pub grpc_addr: SocketAddr,
    /// See [`RunArgs`].
    pub advertise_grpc_addr: String,
    /// See [`RunArgs`].
    pub http_addr: SocketAddr,
    /// See [`RunArgs`].
    pub gossip_addr: SocketAddr,
    /// See [`RunArgs`].
    pub advertise_gossip_addr: SocketAddr,
    /// See [`RunArgs`].
    pub peer_source_ip: Option<IpAddr>,
    /// See [`RunArgs`].
    pub seeds: Vec<String>,
    /// See [`RunArgs`].
    pub cluster_id: String,
    /// See [`RunArgs`]; `None` when not given (the data directory's, or the default).
    pub partitions: Option<crate::partition::PartitionCount>,
    /// See [`RunArgs`].
    pub replication_factor: u32,
    /// See [`RunArgs`].
    pub dead_after: Duration,
    /// See [`RunArgs`].
    pub durability: Durability,
    /// See [`RunArgs`].
    pub write_copies: usize,
    /// See [`RunArgs`].
    pub sync_interval: Duration,
    /// See [`RunArgs`].
    pub gossip_interval: Duration,
    /// See [`RunArgs`].
    pub retire_after: Duration,
    /// See [`RunArgs`].
    pub restart_hold: Duration,
    /// See [`RunArgs`].
    pub cache_capacity: usize,
    /// See [`RunArgs`].
    pub store_cache_bytes: u64,
    /// Log a warning at start when TLS or client tokens are off (the dev
    /// cluster says it once for all its nodes instead).
    pub warn_if_insecure: bool,
    /// See [`RunArgs`].
    pub idempotency_ttl: Duration,
    /// See [`RunArgs`].
    pub idempotency_capacity: usize,
    /// See [`RunArgs`].
    pub on_corrupt: OnCorrupt,
    /// True for JSON logs.
    pub json_logs: bool,
    /// TLS, tokens and rate limits.
    pub security: SecuritySettings,
    /// The HTTP port's settings (`--http-*`).
    pub http: crate::http::HttpSettings,
    /// See [`RunArgs`].
    pub min_free_disk: FreeSpaceFloor,
    /// See [`RunArgs`].
    pub shutdown_grace: Duration,
    /// See [`RunArgs`] (tests only).
    pub test_store_fault_file: Option<PathBuf>,
    /// See [`RunArgs`].
    pub cluster_version_upgrade: ClusterVersionUpgrade,
}

impl Settings {
    /// Defaults for a node in `data_dir` (what `tally-node` uses with no flags).
    pub fn defaults(data_dir: PathBuf) -> Settings {
        Settings {
            data_dir,
            region: "local".into(),
            node_name: "node-1".into(),
            grpc_addr: "127.0.0.1:7100".parse().expect("valid"),
            advertise_grpc_addr: "127.0.0.1:7100".into(),
            http_addr: "127.0.0.1:7102".parse().expect("valid"),
            gossip_addr: "127.0.0.1:7101".parse().expect("valid"),
            advertise_gossip_addr: "127.0.0.1:7101".parse().expect("valid"),
            peer_source_ip: None,
            seeds: Vec::new(),
            cluster_id: "tally".into(),
            partitions: None,
            replication_factor: DEFAULT_REPLICATION_FACTOR,
            dead_after: Duration::from_secs(5 * 60),
            durability: Durability::Sync,
            write_copies: 2,
            sync_interval: Duration::from_millis(200),
            gossip_interval: Duration::from_millis(100),
            retire_after: Duration::from_secs(60 * 60),
            restart_hold: Duration::from_secs(15),
            cache_capacity: 100_000,
            store_cache_bytes: crate::store::DEFAULT_CACHE_BYTES,
            warn_if_insecure: true,
            idempotency_ttl: Duration::from_secs(24 * 3600),
            idempotency_capacity: 1_000_000,
            on_corrupt: OnCorrupt::Refuse,
            json_logs: false,
            security: SecuritySettings::default(),
            http: crate::http::HttpSettings::default(),
            min_free_disk: FreeSpaceFloor::Default,
            shutdown_grace: Duration::from_secs(10),
            test_store_fault_file: None,
            cluster_version_upgrade: ClusterVersionUpgrade::Manual,
        }
    }

    /// Resolves flags, environment and file into checked settings.
    pub fn resolve(args: RunArgs) -> Result<Settings, ConfigError> {
        let file = match &args.config {
            Some(path) => {
                let text =
                    std::fs::read_to_string(path).map_err(|error| ConfigError::ReadFile {
                        path: path.clone(),
                        error,
                    })?;
                toml::from_str::<FileSettings>(&text).map_err(|e| ConfigError::ParseFile {
                    path: path.clone(),
                    problem: e.to_string().trim_end().to_owned(),
                })?
            }
            None => FileSettings::default(),
        };
        let data_dir = args
            .data_dir
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from("tally-data"));
        let mut settings = Settings::defaults(data_dir);
        macro_rules! take {
            ($name:ident) => {
                args.$name.or(file.$name)
            };
        }
        // Where a setting's value comes from, for its error messages: read
        // before `take!` moves the value.
        let config = args.config.clone();
        macro_rules! source {
            ($name:ident) => {
                source_of(stringify!($name), args.$name.is_some(), config.as_deref())
            };
        }
        let region_source = source!(region);
        let node_name_source = source!(node_name);
        if let Some(region) = take!(region) {
            settings.region = region;
        }
        if let Some(name) = take!(node_name) {
            settings.node_name = name;
        }
        crate::replica::check_name(&region_source, &settings.region)?;
        crate::replica::check_name(&node_name_source, &settings.node_name)?;
        let grpc_source = source!(grpc_addr);
        if let Some(addr) = take!(grpc_addr) {
            settings.grpc_addr = parse_addr(&grpc_source, &addr)?;
        }
        settings.advertise_grpc_addr =
            take!(advertise_grpc_addr).unwrap_or_else(|| settings.grpc_addr.to_string());
        let http_source = source!(http_addr);
        if let Some(addr) = take!(http_addr) {
            settings.http_addr = parse_addr(&http_source, &addr)?;
        }
        let gossip_source = source!(gossip_addr);
        if let Some(addr) = take!(gossip_addr) {
            settings.gossip_addr = parse_addr(&gossip_source, &addr)?;
        }
        let advertise_source = source!(advertise_gossip_addr);
        settings.advertise_gossip_addr = match take!(advertise_gossip_addr) {
            Some(addr) => parse_addr(&advertise_source, &addr)?,
            None => settings.gossip_addr,
        };
        let peer_ip_source = source!(peer_source_ip);
        if let Some(text) = take!(peer_source_ip) {
            let ip = text
                .trim()
                .parse::<IpAddr>()
                .map_err(|_| ConfigError::NotAnIp {
                    setting: peer_ip_source,
                    text: text.clone(),
                })?;
            settings.peer_source_ip = Some(ip);
        }
        if let Some(seeds) = take!(seeds) {
            settings.seeds = seeds
                .into_iter()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
        }
        let cluster_id_source = source!(cluster_id);
        if let Some(cluster_id) = take!(cluster_id) {
            if cluster_id.is_empty() {
                return Err(ConfigError::EmptyClusterId {
                    setting: cluster_id_source,
                });
            }
            settings.cluster_id = cluster_id;
        }
        let partitions_source = source!(partitions);
        if let Some(count) = take!(partitions) {
            let count = crate::partition::PartitionCount::new(count).map_err(|problem| {
                ConfigError::Partitions {
                    setting: partitions_source,
                    problem,
                }
            })?;
            settings.partitions = Some(count);
        }
        let factor_source = source!(replication_factor);
        if let Some(factor) = take!(replication_factor) {
            if !(1..=MAX_REPLICATION_FACTOR).contains(&factor) {
                return Err(ConfigError::ReplicationFactor {
                    setting: factor_source,
                    factor,
                });
            }
            settings.replication_factor = factor as u32;
        }
        let dead_after_source = source!(dead_after);
        let dead_after_text = take!(dead_after);
        if let Some(text) = &dead_after_text {
            settings.dead_after = parse_duration(&dead_after_source, text)?;
        }
        if let Some(durability) = take!(durability) {
            settings.durability = durability;
        }
        let copies_source = source!(write_copies);
        if let Some(copies) = take!(write_copies) {
            if !(2..=crate::engine::MAX_WRITE_COPIES).contains(&copies) {
                return Err(ConfigError::WriteCopies {
                    setting: copies_source,
                    copies,
                });
            }
            settings.write_copies = copies;
        }
        let sync_source = source!(sync_interval);
        if let Some(text) = take!(sync_interval) {
            settings.sync_interval = parse_duration(&sync_source, &text)?;
        }
        let retire_after_source = source!(retire_after);
        if let Some(text) = take!(retire_after) {
            settings.retire_after = parse_duration(&retire_after_source, &text)?;
        }
        let restart_hold_source = source!(restart_hold);
        if let Some(text) = take!(restart_hold) {
            settings.restart_hold = parse_duration(&restart_hold_source, &text)?;
        }
        let gossip_interval_source = source!(gossip_interval);
        if let Some(text) = take!(gossip_interval) {
            settings.gossip_interval = parse_duration(&gossip_interval_source, &text)?;
        }
        if let Some(capacity) = take!(cache_capacity) {
            settings.cache_capacity = capacity.max(1);
        }
        let cache_source = source!(store_cache_bytes);
        if let Some(bytes) = take!(store_cache_bytes) {
            if bytes < MIN_STORE_CACHE_BYTES {
                return Err(ConfigError::CacheTooSmall {
                    setting: cache_source,
                    bytes,
                });
            }
            settings.store_cache_bytes = bytes;
        }
        let ttl_source = source!(idempotency_ttl);
        if let Some(text) = take!(idempotency_ttl) {
            settings.idempotency_ttl = parse_duration(&ttl_source, &text)?;
        }
        if let Some(capacity) = take!(idempotency_capacity) {
            settings.idempotency_capacity = capacity.max(1);
        }
        if let Some(on_corrupt) = take!(on_corrupt) {
            settings.on_corrupt = on_corrupt;
        }
        if let Some(mode) = take!(cluster_version_upgrade) {
            settings.cluster_version_upgrade = mode;
        }
        let log_format_source = source!(log_format);
        settings.json_logs = match take!(log_format).as_deref() {
            None | Some("text") => false,
            Some("json") => true,
            Some(other) => {
                return Err(ConfigError::LogFormat {
                    setting: log_format_source,
                    text: other.to_owned(),
                })
            }
        };
        let rate_limit = take!(rate_limit).unwrap_or(0);
        settings.security = SecuritySettings {
            tls_cert: take!(tls_cert),
            tls_key: take!(tls_key),
            tls_ca: take!(tls_ca),
            auth_tokens: take!(auth_tokens),
            rate_limit,
            rate_burst: take!(rate_burst).unwrap_or(rate_limit),
            gossip_key_file: take!(gossip_key_file),
            gossip_accept_plain: take!(gossip_accept_plain).unwrap_or(false),
            secure: take!(secure).unwrap_or(false),
        };
        let cors_source = source!(http_cors_origin);
        if let Some(origins) = take!(http_cors_origin) {
            let origins: Vec<String> = origins
                .into_iter()
                .map(|origin| origin.trim().to_string())
                .filter(|origin| !origin.is_empty())
                .collect();
            for origin in &origins {
                crate::http::access::check_cors_origin(origin).map_err(|problem| {
                    ConfigError::CorsOrigin {
                        setting: cors_source.clone(),
                        problem,
                    }
                })?;
            }
            settings.http.cors_origins = origins;
        }
        settings.http.tls_cert = take!(http_tls_cert);
        settings.http.tls_key = take!(http_tls_key);
        let heartbeat_source = source!(http_event_heartbeat);
        if let Some(text) = take!(http_event_heartbeat) {
            settings.http.event_heartbeat = parse_duration(&heartbeat_source, &text)?;
            if settings.http.event_heartbeat < Duration::from_millis(100) {
                return Err(ConfigError::HeartbeatTooShort {
                    setting: heartbeat_source,
                    text,
                });
            }
        }
        let floor_source = source!(min_free_disk);
        if let Some(text) = take!(min_free_disk) {
            settings.min_free_disk =
                FreeSpaceFloor::parse(&text).map_err(|problem| ConfigError::DiskFloor {
                    setting: floor_source,
                    problem,
                })?;
        }
        let grace_source = source!(shutdown_grace);
        if let Some(text) = take!(shutdown_grace) {
            settings.shutdown_grace = parse_duration(&grace_source, &text)?;
        }
        settings.test_store_fault_file = args.test_store_fault_file;
        if settings.sync_interval.is_zero() || settings.gossip_interval.is_zero() {
            return Err(ConfigError::ZeroInterval);
        }
        let min_dead_after = settings.gossip_interval * DEAD_AFTER_MIN_GOSSIP_INTERVALS;
        if settings.dead_after < min_dead_after {
            return Err(ConfigError::DeadAfterTooShort {
                setting: dead_after_source,
                text: dead_after_text
                    .unwrap_or_else(|| format!("{}ms", settings.dead_after.as_millis())),
                min_ms: min_dead_after.as_millis(),
            });
        }
        Ok(settings)
    }
}

/// Where the value of setting `name` came from, as its error messages name
/// it: `--grpc-addr` (the command line), `TALLY_GRPC_ADDR` (the
/// environment: clap fills the flag's field from it too) or `grpc_addr in
/// FILE` (the config file).
fn source_of(name: &str, from_args: bool, config: Option<&std::path::Path>) -> String {
    let flag = format!("--{}", name.replace('_', "-"));
    if from_args {
        let env = format!("TALLY_{}", name.to_uppercase());
        let on_command_line = std::env::args_os().any(|arg| {
            let arg = arg.to_string_lossy();
            arg == flag || arg.starts_with(&format!("{flag}="))
        });
        if !on_command_line && std::env::var_os(&env).is_some() {
            return env;
        }
        return flag;
    }
    match config {
        Some(path) => format!("{name} in {}", path.display()),
        None => flag,
    }
}

/// An `IP:PORT`, or a `HOST:PORT` resolved once, now (containers know their
/// own name, not their address).
fn parse_addr(setting: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let bad = || ConfigError::NotAnAddress {
        setting: setting.to_owned(),
        text: text.to_owned(),
    };
    if !text.contains(':') {
        return Err(bad());
    }
    use std::net::ToSocketAddrs;
    let mut resolved = text
        .to_socket_addrs()
        .map_err(|e| ConfigError::DoesNotResolve {
            setting: setting.to_owned(),
            text: text.to_owned(),
            reason: e.to_string(),
        })?;
    resolved.find(|addr| addr.is_ipv4()).ok_or_else(bad)
}

/// Parses `250ms`, `10s`, `5m`, `24h` (or a bare number of milliseconds).
pub fn parse_duration(setting: &str, text: &str) -> Result<Duration, ConfigError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| ConfigError::NotADuration {
        setting: setting.to_owned(),
        text: text.to_owned(),
    })?;
    let millis = match unit {
        "" | "ms" => number,
        "s" => number * 1000,
        "m" => number * 60_000,
        "h" => number * 3_600_000,
        _ => {
            return Err(ConfigError::UnknownUnit {
                setting: setting.to_owned(),
                text: text.to_owned(),
            })
        }
    };
    Ok(Duration::from_millis(millis))
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
