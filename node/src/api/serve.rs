//! Assembles and runs the gRPC server: the three Tally services behind the
//! token interceptor (Counters, Admin) or the peer-certificate check
//! (Replication), plus the standard health service and server reflection
//! (open, so probes and `grpcurl` work), over plain TCP or TLS. Requests
//! tonic cannot read get the conventional codes ([`super::status_codes`]).

use std::sync::Arc;

use tally_proto::v1::admin_server::AdminServer;
use tally_proto::v1::counters_server::CountersServer;
use tally_proto::v1::replication_server::ReplicationServer;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;

use crate::engine::Engine;
use crate::security::{AuthInterceptor, Security};

use super::status_codes::ClientFaultCodes;
use super::{AdminService, CountersService, NodeInfo, ReplicationService};

/// The largest gRPC message a node accepts or sends.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// The most concurrent streams one connection may open.
pub const MAX_CONCURRENT_STREAMS: u32 = 1024;

/// Serves gRPC on `listener` until `stop` resolves.
pub async fn spawn_grpc(
    engine: Arc<Engine>,
    info: NodeInfo,
    security: &Security,
    listener: TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<JoinHandle<Result<(), tonic::transport::Error>>> {
    let interceptor = AuthInterceptor::new(security.auth.clone(), engine.metrics().clone());
    let counters = CountersServer::new(CountersService::new(engine.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let replication = ReplicationServer::new(ReplicationService::new(
        engine.clone(),
        security.tls.is_some(),
    ))
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let admin = AdminServer::new(AdminService::new(engine.clone(), info));
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<CountersServer<CountersService>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tally_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let router = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS))
        .add_service(ClientFaultCodes(InterceptedService::new(
            counters,
            interceptor.clone(),
        )))
        .add_service(ClientFaultCodes(replication))
        .add_service(ClientFaultCodes(InterceptedService::new(
            admin,
            interceptor,
        )))
        .add_service(health)
        .add_service(reflection);
    let task = match &security.tls {
        Some(tls) => {
            let (incoming, accept_task) = crate::security::tls::accept_tls(
                listener,
                tls.acceptor.clone(),
                engine.metrics().clone(),
            );
            tokio::spawn(async move {
                let served = router.serve_with_incoming_shutdown(incoming, stop).await;
                accept_task.abort();
                served
            })
        }
        // tonic ignores `tcp_nodelay` on a custom incoming stream: set it here, or
        // every answer waits for the client's delayed ACK (40 ms) when few
        // requests are in flight, as with coalesced batches.
        None => {
            let incoming =
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, stop))
        }
    };
    Ok(task)
}
