//! A fake Tally node for tests: the generated `Counters` and `Admin` services
//! over an in-memory map, served by tonic on 127.0.0.1 with a free port.
//!
//! It applies adds like the real node (an idempotency key seen before returns
//! the first answer with `duplicate` set), records every idempotency key it
//! receives and, per `AddBatch` call, the keys the call carried, and can be
//! told to fail the next N adds with a given code or to answer slowly, so
//! tests can watch the client's retries and coalescing from the server's
//! side. Like the node, it turns Nagle's algorithm off on its connections.
//!
//! It has no partition map unless given a region ([`FakeRegion`]): then
//! `PartitionMap` answers the region's map and `Drain` drains a node of it,
//! which hands its partitions away a few per `PartitionMap` call and has
//! `left` once it holds none (as a real drain ends).

// Each test file uses a different part of this module.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tally_proto::v1::admin_server::{Admin, AdminServer};
use tally_proto::v1::counters_server::{Counters, CountersServer};
use tally_proto::v1::{
    add_result, get_result, AddBatchRequest, AddBatchResponse, AddRequest, AddResponse, AddResult,
    GetBatchRequest, GetBatchResponse, GetRequest, GetResponse, GetResult, Member, StatusRequest,
    StatusResponse, WatchEvent, WatchRequest,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::metadata::MetadataMap;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tonic::{Code, Request, Response, Status};

/// What the fake has been told and what it has seen.
#[derive(Debug, Default)]
pub struct FakeState {
    /// Counter values by key.
    pub values: HashMap<String, i64>,
    /// The answer given to each idempotency key applied so far.
    pub applied: HashMap<String, AddResponse>,
    /// Every idempotency key received by `Add` and `AddBatch`, in order
    /// (one entry per item per request, failed requests included).
    pub seen_keys: Vec<String>,
    /// How many `Add`/`AddBatch` requests arrived.
    pub add_requests: u32,
    /// The idempotency keys of each `AddBatch` call, in arrival order
    /// (failed calls included).
    pub batches: Vec<Vec<String>>,
    /// How many single `Add` calls arrived.
    pub single_adds: u32,
    /// Fail this many more `Add`/`AddBatch` requests with `fail_code`.
    pub fail_next_adds: u32,
    /// The code of injected failures.
    pub fail_code: Option<Code>,
    /// Wait this long before answering an add.
    pub add_delay: Duration,
    /// The keys of each `GetBatch` call, in arrival order.
    pub read_batches: Vec<Vec<String>>,
    /// How many single `Get` calls arrived.
    pub single_gets: u32,
    /// Fail this many more `Get`/`GetBatch` requests with `Unavailable`.
    pub fail_next_reads: u32,
    /// Wait this long after reading the values, before answering a read.
    pub read_delay: Duration,
    /// The request metadata (headers) of every `Add`/`AddBatch` call.
    pub add_metadata: Vec<MetadataMap>,
    /// The partitioned region served, if any.
    pub region: Option<FakeRegion>,
}

/// A partitioned region the fake serves (see the module documentation).
#[derive(Clone, Debug)]
pub struct FakeRegion {
    /// The map as `PartitionMap` answers it next.
    pub map: tally_proto::v1::PartitionMapResponse,
    /// How many partitions a draining node hands away per `PartitionMap` call.
    pub released_per_map: u32,
    /// The node of every `Drain` call, in order.
    pub drains: Vec<String>,
    /// How many `PartitionMap` calls arrived.
    pub map_calls: u32,
}

impl FakeRegion {
    /// Region `region` of active nodes `(name, partitions held)`.
    pub fn new(region: &str, nodes: &[(&str, u32)]) -> FakeRegion {
        let map_nodes = nodes
            .iter()
            .enumerate()
            .map(|(index, (name, held))| tally_proto::v1::PartitionNode {
                node_name: (*name).to_owned(),
                region: region.to_owned(),
                replica: index as u64 + 1,
                grpc_addr: format!("127.0.0.1:{}", 7100 + index),
                state: "active".to_owned(),
                alive: true,
                partitions_owned: *held,
                partitions_held: *held,
                ..Default::default()
            })
            .collect();
        FakeRegion {
            map: tally_proto::v1::PartitionMapResponse {
                partitions: 16,
                replication_factor: 2,
                effective_replication: 2,
                region: region.to_owned(),
                nodes: map_nodes,
                answered_by: nodes.first().map_or("fake", |(name, _)| *name).to_owned(),
                ..Default::default()
            },
            released_per_map: 4,
            drains: Vec::new(),
            map_calls: 0,
        }
    }

    /// A `PartitionMap` call: draining nodes hand some partitions away first.
    fn answer_map(&mut self) -> tally_proto::v1::PartitionMapResponse {
        self.map_calls += 1;
        for node in &mut self.map.nodes {
            if node.state == "draining" {
                node.partitions_held = node.partitions_held.saturating_sub(self.released_per_map);
                node.partitions_releasing = node.partitions_held;
                if node.partitions_held == 0 {
                    node.state = "left".to_owned();
                }
            }
        }
        self.map.clone()
    }

    /// A `Drain` call, refused as the node refuses it.
    fn drain(&mut self, name: &str) -> Result<bool, Status> {
        self.drains.push(name.to_owned());
        let region = self.map.region.clone();
        let owners = self
            .map
            .nodes
            .iter()
            .filter(|node| node.state == "active" || node.state == "joining")
            .count();
        let node = self
            .map
            .nodes
            .iter_mut()
            .find(|node| node.node_name == name)
            .ok_or_else(|| Status::not_found(format!("no node named {name:?} in this cluster")))?;
        match node.state.as_str() {
            "left" => Err(Status::failed_precondition(format!(
                "node {name:?} has already left the cluster"
            ))),
            "draining" => Ok(false),
            _ if owners <= 1 => Err(Status::failed_precondition(format!(
                "node {name:?} is the last node of region {region:?} that can own partitions; \
                 add a node to {region:?} first, then drain {name:?}"
            ))),
            _ => {
                node.state = "draining".to_owned();
                node.partitions_owned = 0;
                node.partitions_releasing = node.partitions_held;
                Ok(true)
            }
        }
    }
}

/// The services' shared state.
#[derive(Debug, Default)]
pub struct FakeNode {
    state: Mutex<FakeState>,
}

impl FakeNode {
    /// Locks the state, to set up failures or read what was seen.
    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap()
    }

    /// Makes the next `count` add requests fail with `code`.
    pub fn fail_next_adds(&self, count: u32, code: Code) {
        let mut state = self.state();
        state.fail_next_adds = count;
        state.fail_code = Some(code);
    }

    /// The idempotency keys received so far.
    pub fn seen_keys(&self) -> Vec<String> {
        self.state().seen_keys.clone()
    }

    /// How many add requests arrived.
    pub fn add_requests(&self) -> u32 {
        self.state().add_requests
    }

    /// The idempotency keys of each `AddBatch` call so far.
    pub fn batches(&self) -> Vec<Vec<String>> {
        self.state().batches.clone()
    }

    /// How many single `Add` calls arrived.
    pub fn single_adds(&self) -> u32 {
        self.state().single_adds
    }

    /// The value of header `name` on each add call so far (`None` where a
    /// call lacked it).
    pub fn add_header(&self, name: &str) -> Vec<Option<String>> {
        self.state()
            .add_metadata
            .iter()
            .map(|metadata| {
                metadata
                    .get(name)
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned)
            })
            .collect()
    }

    /// Records a request's keys, and fails it if told to.
    async fn admit_add(&self, keys: impl IntoIterator<Item = String>) -> Result<(), Status> {
        let delay = {
            let mut state = self.state();
            state.add_requests += 1;
            state.seen_keys.extend(keys);
            if state.fail_next_adds > 0 {
                state.fail_next_adds -= 1;
                let code = state.fail_code.unwrap_or(Code::Unavailable);
                return Err(Status::new(code, "injected failure"));
            }
            state.add_delay
        };
        tokio::time::sleep(delay).await;
        Ok(())
    }

    fn apply(&self, request: &AddRequest) -> Result<AddResponse, Status> {
        let key = key_text(&request.key)?;
        if request.delta == 0 {
            return Err(Status::invalid_argument("delta is 0"));
        }
        let mut state = self.state();
        if let Some(first) = state.applied.get(&request.idempotency_key) {
            return Ok(AddResponse {
                duplicate: true,
                ..*first
            });
        }
        let value = state.values.entry(key).or_default();
        *value = value
            .checked_add(request.delta)
            .ok_or_else(|| Status::out_of_range("the counter would leave the i64 range"))?;
        let response = AddResponse {
            value: *value,
            duplicate: false,
        };
        if !request.idempotency_key.is_empty() {
            state
                .applied
                .insert(request.idempotency_key.clone(), response);
        }
        Ok(response)
    }

    /// Fails the read if failures were asked for.
    fn admit_read(&self) -> Result<(), Status> {
        let mut state = self.state();
        if state.fail_next_reads > 0 {
            state.fail_next_reads -= 1;
            return Err(Status::unavailable("injected read failure"));
        }
        Ok(())
    }

    async fn delay_read(&self) {
        let delay = self.state().read_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }

    pub fn read_batches(&self) -> Vec<Vec<String>> {
        self.state().read_batches.clone()
    }

    fn read(&self, key: &[u8]) -> Result<GetResponse, Status> {
        let text = key_text(key)?;
        let value = self.state().values.get(&text).copied().unwrap_or(0);
        Ok(GetResponse {
            key: key.to_vec().into(),
            value,
            ..Default::default()
        })
    }
}

fn key_text(key: &[u8]) -> Result<String, Status> {
    String::from_utf8(key.to_vec())
        .map_err(|_| Status::invalid_argument("the key is not UTF-8"))
        .and_then(|key| {
            if key.is_empty() {
                Err(Status::invalid_argument("the key is empty"))
            } else {
                Ok(key)
            }
        })
}

fn item_error(status: Status) -> tally_proto::v1::Error {
    tally_proto::v1::Error {
        code: status.code() as i32,
        message: status.message().to_owned(),
    }
}

#[tonic::async_trait]
impl Counters for FakeNode {
    async fn add(&self, request: Request<AddRequest>) -> Result<Response<AddResponse>, Status> {
        self.state().add_metadata.push(request.metadata().clone());
        let request = request.into_inner();
        self.state().single_adds += 1;
        self.admit_add([request.idempotency_key.clone()]).await?;
        self.apply(&request).map(Response::new)
    }

    async fn add_batch(
        &self,
        request: Request<AddBatchRequest>,
    ) -> Result<Response<AddBatchResponse>, Status> {
        self.state().add_metadata.push(request.metadata().clone());
        let request = request.into_inner();
        let keys: Vec<String> = request
            .adds
            .iter()
            .map(|add| add.idempotency_key.clone())
            .collect();
        self.state().batches.push(keys.clone());
        self.admit_add(keys).await?;
        let results = request
            .adds
            .iter()
            .map(|add| AddResult {
                outcome: Some(match self.apply(add) {
                    Ok(response) => add_result::Outcome::Ok(response),
                    Err(status) => add_result::Outcome::Error(item_error(status)),
                }),
            })
            .collect();
        Ok(Response::new(AddBatchResponse { results }))
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        self.state().single_gets += 1;
        self.admit_read()?;
        let response = self.read(&request.into_inner().key)?;
        self.delay_read().await;
        Ok(Response::new(response))
    }

    async fn get_batch(
        &self,
        request: Request<GetBatchRequest>,
    ) -> Result<Response<GetBatchResponse>, Status> {
        let gets = request.into_inner().gets;
        self.state().read_batches.push(
            gets.iter()
                .map(|get| String::from_utf8_lossy(&get.key).into_owned())
                .collect(),
        );
        self.admit_read()?;
        let results: Vec<GetResult> = gets
            .iter()
            .map(|get| GetResult {
                outcome: Some(match self.read(&get.key) {
                    Ok(response) => get_result::Outcome::Ok(response),
                    Err(status) => get_result::Outcome::Error(item_error(status)),
                }),
            })
            .collect();
        self.delay_read().await;
        Ok(Response::new(GetBatchResponse { results }))
    }

    type WatchStream = tokio_stream::Iter<std::vec::IntoIter<Result<WatchEvent, Status>>>;

    /// Sends the current value, then the value plus one and plus two, then
    /// ends the stream.
    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let current = self.read(&request.into_inner().key)?;
        let events: Vec<_> = (0..3)
            .map(|step| {
                Ok(WatchEvent {
                    key: current.key.clone(),
                    value: current.value + step,
                })
            })
            .collect();
        Ok(Response::new(tokio_stream::iter(events)))
    }
}

/// A fixed two-member cluster; a backup stream that stops before its
/// trailer (as when the node dies mid-backup); a finalize refused as with a
/// member that lags; no partition map (a node from before them); drains
/// and removals refused.
#[tonic::async_trait]
impl Admin for FakeNode {
    type BackupStream =
        tokio_stream::Iter<std::vec::IntoIter<Result<tally_proto::v1::BackupChunk, Status>>>;

    async fn backup(
        &self,
        _request: Request<tally_proto::v1::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        use tally_proto::v1::backup_chunk::Part;
        let header = tally_proto::v1::BackupHeader {
            format_version: tally_proto::backup::FORMAT_VERSION,
            cluster_id: "fake".to_owned(),
            replica: 7,
            ..Default::default()
        };
        let chunks = vec![Ok(tally_proto::v1::BackupChunk {
            part: Some(Part::Header(header)),
        })];
        Ok(Response::new(tokio_stream::iter(chunks)))
    }

    async fn retire(
        &self,
        _request: Request<tally_proto::v1::RetireRequest>,
    ) -> Result<Response<tally_proto::v1::RetireResponse>, Status> {
        Err(Status::failed_precondition(
            "replica 0000000000000007 is alive",
        ))
    }

    /// Without a region, as a node from before partition maps: `tally
    /// status` prints no summary.
    async fn partition_map(
        &self,
        _request: Request<tally_proto::v1::PartitionMapRequest>,
    ) -> Result<Response<tally_proto::v1::PartitionMapResponse>, Status> {
        match &mut self.state().region {
            Some(region) => Ok(Response::new(region.answer_map())),
            None => Err(Status::unimplemented("Admin.PartitionMap")),
        }
    }

    async fn drain(
        &self,
        request: Request<tally_proto::v1::DrainRequest>,
    ) -> Result<Response<tally_proto::v1::DrainResponse>, Status> {
        match &mut self.state().region {
            Some(region) => region
                .drain(&request.into_inner().node)
                .map(|newly_draining| {
                    Response::new(tally_proto::v1::DrainResponse { newly_draining })
                }),
            None => Err(Status::failed_precondition(
                "node \"fake-1\" is the last node of region \"eu-west\" that can own partitions",
            )),
        }
    }

    async fn remove(
        &self,
        _request: Request<tally_proto::v1::RemoveRequest>,
    ) -> Result<Response<tally_proto::v1::RemoveResponse>, Status> {
        Err(Status::failed_precondition("node \"fake-2\" is alive"))
    }

    async fn finalize(
        &self,
        _request: Request<tally_proto::v1::FinalizeRequest>,
    ) -> Result<Response<tally_proto::v1::FinalizeResponse>, Status> {
        Err(Status::failed_precondition(
            "cannot finalize version 2: fake-2 (eu-west, speaks 1..=1) do not speak it yet",
        ))
    }

    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let member = |name: &str, replica: u64, since_last_sync_ms| Member {
            region: "eu-west".to_owned(),
            node_name: name.to_owned(),
            replica,
            grpc_addr: "127.0.0.1:7100".to_owned(),
            alive: true,
            digest: 0xfeed,
            durable_seq: 10,
            since_last_sync_ms,
            seq_lag: 0,
            gossip_addr: "127.0.0.1:7200".to_owned(),
            ..Default::default()
        };
        Ok(Response::new(StatusResponse {
            self_: Some(member("n1", 1, None)),
            members: vec![member("n2", u64::MAX, Some(250))],
            converged: true,
            cluster_id: "fake".to_owned(),
            ..Default::default()
        }))
    }
}

/// A running fake node.
pub struct FakeServerHandle {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its state.
    pub node: Arc<FakeNode>,
    shutdown_tx: oneshot::Sender<()>,
}

impl FakeServerHandle {
    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops serving.
    pub fn shutdown(self) {
        let _ = self.shutdown_tx.send(());
    }
}

/// Starts a fake node on 127.0.0.1 with a free port.
pub async fn spawn_fake_server() -> FakeServerHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Arc::new(FakeNode::default());
    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    let server = Server::builder()
        .add_service(CountersServer::from_arc(Arc::clone(&node)))
        .add_service(AdminServer::from_arc(Arc::clone(&node)))
        // `Server::tcp_nodelay` does not apply to an incoming stream of our own.
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            async {
                let _ = shutdown_rx.await;
            },
        );
    tokio::spawn(server);
    FakeServerHandle {
        addr,
        node,
        shutdown_tx,
    }
}

/// An address on which nothing listens (a port that was just free).
pub async fn unused_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}
