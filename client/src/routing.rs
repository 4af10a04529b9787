//! Client-side routing in a partitioned region ([`Routing::Direct`], the
//! default): the client fetches its region's partition map
//! (`Admin.PartitionMap`) and sends each key straight to the key's first
//! live owner, so no node has to forward it.
//!
//! How it stays correct and cheap:
//! - The key hash is the node's own (`tally_proto::partition`), so the
//!   client and the nodes agree on a key's partition bit for bit.
//! - Each owner is served by a plain [`Client`] of its own (its own
//!   connection, coalescing and read cache), so coalesced batches are split
//!   by owner for free. A node is routed to only once its connection is
//!   open: an address the client cannot reach (a container's inside
//!   address, say) is never waited on, the configured endpoint serves
//!   instead (and forwards).
//! - A map that shows at most one node in the region routes nothing: the
//!   call path costs one atomic load, as without routing.
//! - The map is fetched on connect, every [`REFRESH_PERIOD`], and at once
//!   (at most once per [`HINT_MIN_GAP`]) when a node answers with the
//!   `tally-owner` header: it forwarded the request, so the client's map is
//!   stale. A node that does not answer gets the call again through the
//!   configured endpoint, and the map is refreshed.
//! - The map is unavailable (an older node without `Admin.PartitionMap`,
//!   a token the node refuses for `Admin`): everything goes to the
//!   configured endpoint, as with [`Routing::ThroughEndpoint`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use tally_proto::partition::PartitionCount;
use tally_proto::v1::admin_client::AdminClient;
use tally_proto::v1::PartitionMapRequest;

use crate::transport::Transport;
use crate::{Client, ClientConfig, Routing};

/// How often the map is fetched again without a hint.
pub const REFRESH_PERIOD: Duration = Duration::from_secs(10);
/// The shortest gap between two fetches on hints.
pub const HINT_MIN_GAP: Duration = Duration::from_millis(500);
/// The response header of a node that forwarded the request.
pub(crate) const OWNER_HEADER: &str = "tally-owner";

/// The routes in force: per partition, the client of its first live,
/// reachable owner (`None`: the configured endpoint).
#[derive(Debug)]
struct Routes {
    partitions: PartitionCount,
    owners: Vec<Option<usize>>,
    nodes: Vec<Client>,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Router {
    routes: RwLock<Option<Arc<Routes>>>,
    /// Whether `routes` sends anything elsewhere than the endpoint.
    active: AtomicBool,
    /// Set by a `tally-owner` answer or a node that did not answer.
    stale: Arc<AtomicBool>,
    /// Clients of the region's nodes by gRPC address, kept across maps.
    clients: tokio::sync::Mutex<HashMap<String, Client>>,
    config: ClientConfig,
    scheme: &'static str,
}

impl Router {
    /// A router for a client of `endpoint` (normalised) with `config`.
    pub(crate) fn new(config: &ClientConfig, endpoint: &str, stale: Arc<AtomicBool>) -> Router {
        Router {
            routes: RwLock::new(None),
            active: AtomicBool::new(false),
            stale,
            clients: tokio::sync::Mutex::new(HashMap::new()),
            // One attempt per node: a call a node does not answer goes to
            // the endpoint at once, whose client retries.
            config: config
                .clone()
                .with_routing(Routing::ThroughEndpoint)
                .with_max_retries(0),
            scheme: if endpoint.starts_with("https://") {
                "https"
            } else {
                "http"
            },
        }
    }

    /// The client that serves `key`, `None` for the configured endpoint.
    pub(crate) fn client_for(&self, key: &[u8]) -> Option<Client> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        let routes = routes.as_ref()?;
        let owner = routes.owners[routes.partitions.of_key(key).0 as usize]?;
        Some(routes.nodes[owner].clone())
    }

    /// Whether any key is routed elsewhere than the endpoint.
    pub(crate) fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Asks for a new map soon (a node did not answer).
    pub(crate) fn mark_stale(&self) {
        self.stale.store(true, Ordering::Release);
    }

    /// Fetches the map through `admin` and installs its routes; on any
    /// failure keeps the endpoint for everything.
    async fn refresh(&self, admin: &mut AdminClient<Transport>) {
        let mut request = tonic::Request::new(PartitionMapRequest::default());
        request.set_timeout(self.config.connect_timeout());
        let map = match admin.partition_map(request).await {
            Ok(map) => map.into_inner(),
            Err(status) => {
                tracing::debug!(%status, "no partition map: every key goes to the endpoint");
                self.install(None);
                return;
            }
        };
        let Ok(partitions) = PartitionCount::new(u64::from(map.partitions)) else {
            self.install(None);
            return;
        };
        let serving = |node: &tally_proto::v1::PartitionNode| {
            node.alive && !node.gone && matches!(node.state.as_str(), "active" | "draining")
        };
        if map.nodes.iter().filter(|node| serving(node)).count() <= 1
            || map.owners.len() != partitions.get() as usize
        {
            self.install(None);
            return;
        }
        let mut clients = self.clients.lock().await;
        let mut nodes: Vec<Client> = Vec::new();
        let mut index_of: HashMap<usize, usize> = HashMap::new();
        for (position, node) in map.nodes.iter().enumerate() {
            if !serving(node) || node.grpc_addr.is_empty() {
                continue;
            }
            let client = match clients.get(&node.grpc_addr) {
                Some(client) => client.clone(),
                None => {
                    let endpoint = format!("{}://{}", self.scheme, node.grpc_addr);
                    match tokio::time::timeout(
                        self.config.connect_timeout(),
                        self.config.connect_node(endpoint, Some(self.stale.clone())),
                    )
                    .await
                    {
                        Ok(Ok(client)) => {
                            clients.insert(node.grpc_addr.clone(), client.clone());
                            client
                        }
                        _ => {
                            tracing::debug!(node = %node.node_name, addr = %node.grpc_addr, "cannot reach a node of the map; its keys go to the endpoint");
                            continue;
                        }
                    }
                }
            };
            index_of.insert(position, nodes.len());
            nodes.push(client);
        }
        let owners = map
            .owners
            .iter()
            .map(|owners| {
                // The first live owner; one that is down or unreachable
                // leaves the key to the endpoint, which fails over.
                let first = owners
                    .nodes
                    .iter()
                    .find(|index| map.nodes.get(**index as usize).is_some_and(serving))?;
                index_of.get(&(*first as usize)).copied()
            })
            .collect();
        self.install(Some(Routes {
            partitions,
            owners,
            nodes,
        }));
    }

    fn install(&self, routes: Option<Routes>) {
        let active = routes
            .as_ref()
            .is_some_and(|routes| routes.owners.iter().any(Option::is_some));
        *self.routes.write().unwrap_or_else(|p| p.into_inner()) = routes.map(Arc::new);
        self.active.store(active, Ordering::Release);
    }
}

/// Fetches the first map (bounded by the connect timeout), then keeps it
/// fresh in the background until the last clone of the client is dropped.
pub(crate) async fn start(router: &Arc<Router>, mut admin: AdminClient<Transport>) {
    router.refresh(&mut admin).await;
    let weak: Weak<Router> = Arc::downgrade(router);
    let stale = router.stale.clone();
    stale.store(false, Ordering::Release);
    tokio::spawn(async move {
        let mut since_refresh = Duration::ZERO;
        let tick = HINT_MIN_GAP;
        loop {
            tokio::time::sleep(tick).await;
            since_refresh += tick;
            let hinted = stale.swap(false, Ordering::AcqRel);
            if !hinted && since_refresh < REFRESH_PERIOD {
                continue;
            }
            let Some(router) = weak.upgrade() else {
                return;
            };
            router.refresh(&mut admin).await;
            since_refresh = Duration::ZERO;
        }
    });
}
