//! Assembles and runs the gRPC server: the three Tally services behind the
//! token interceptor (Counters, Admin) or the peer-certificate check
//! (Replication), plus the standard health service (`SERVING` for every
//! service in [`SERVED_SERVICES`]) and server reflection in both versions,
//! v1 and v1alpha (open, so probes, `grpcurl` and Python's `grpcio-reflection`
//! work), over plain TCP or TLS. Requests tonic cannot read get the
//! conventional codes ([`super::status_codes`]).

use std::sync::Arc;

use tally_proto::v1::admin_server::AdminServer;
use tally_proto::v1::counters_server::CountersServer;
use tally_proto::v1::likes_server::LikesServer;
use tally_proto::v1::replication_server::ReplicationServer;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;

use crate::engine::Engine;
use crate::security::auth::Authorized;
use crate::security::{AuthInterceptor, Security};

use super::status_codes::ClientFaultCodes;
use super::{AdminService, CountersService, LikesService, NodeInfo, ReplicationService};

/// The largest gRPC message a node accepts or sends.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// The most concurrent streams one connection may open.
pub const MAX_CONCURRENT_STREAMS: u32 = 1024;

/// Every gRPC service a node serves, by its full name: each one answers
/// `SERVING` in the health service.
pub const SERVED_SERVICES: [&str; 7] = [
    "tally.v1.Counters",
    "tally.v1.Likes",
    "tally.v1.Admin",
    "tally.v1.Replication",
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// Reflection over Tally's and the health service's descriptors.
fn reflection_builder() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tally_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}

/// Serves gRPC on `listener` until `stop` resolves; an HTTP/1 request on a
/// plain port is answered with the HTTP port's number, `http_port`.
#[allow(clippy::too_many_arguments)]
pub async fn spawn_grpc(
    engine: Arc<Engine>,
    info: NodeInfo,
    partitioning: Arc<crate::gossip::lifecycle::Partitioning>,
    counters: Arc<CountersService>,
    likes: Arc<LikesService>,
    gossip_interval: std::time::Duration,
    security: &Security,
    listener: TcpListener,
    http_port: u16,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<JoinHandle<Result<(), tonic::transport::Error>>> {
    let interceptor = AuthInterceptor::new(security.auth.clone(), engine.metrics().clone());
    let counters = CountersServer::from_arc(counters)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let likes = LikesServer::from_arc(likes)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let replication = ReplicationServer::new(
        ReplicationService::new(engine.clone(), security.tls.is_some())
            .with_partitioning(partitioning.clone()),
    )
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let admin = AdminServer::new(AdminService::new(
        engine.clone(),
        info,
        partitioning,
        gossip_interval,
    ));
    let (health_reporter, health) = tonic_health::server::health_reporter();
    // Every served service answers SERVING (probes ask for a service by
    // name, and `NOT_FOUND` for one that is served misleads them).
    for service in SERVED_SERVICES {
        health_reporter
            .set_service_status(service, tonic_health::ServingStatus::Serving)
            .await;
    }
    // Both reflection versions: `grpcurl` speaks v1, the common Python
    // client (`grpcio-reflection`) only v1alpha.
    let reflection_v1 = reflection_builder()
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = reflection_builder()
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let router = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS))
        .add_service(ClientFaultCodes(Authorized(InterceptedService::new(
            counters,
            interceptor.clone(),
        ))))
        .add_service(ClientFaultCodes(Authorized(InterceptedService::new(
            likes,
            interceptor.clone(),
        ))))
        .add_service(ClientFaultCodes(replication))
        .add_service(ClientFaultCodes(Authorized(InterceptedService::new(
            admin,
            interceptor,
        ))))
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);
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
        // tonic ignores `tcp_nodelay` on a custom incoming stream: the accept
        // loop sets it, or every answer waits for the client's delayed ACK
        // (40 ms) when few requests are in flight, as with coalesced batches.
        // tonic's own loop retried a failed accept at once (a core spinning
        // while file descriptors ran out); this one backs off.
        // An HTTP/1 client (curl, a browser) is told where the HTTP port is
        // (`super::wrong_port`); gRPC connections pass on untouched.
        None => {
            let (incoming, accept_task) =
                crate::security::accept::accept_plain(listener, "grpc", engine.metrics().clone());
            let (incoming, screen_task) = super::wrong_port::screen_http1(incoming, http_port);
            tokio::spawn(async move {
                let served = router.serve_with_incoming_shutdown(incoming, stop).await;
                accept_task.abort();
                screen_task.abort();
                served
            })
        }
    };
    Ok(task)
}

#[cfg(test)]
mod tests {
    use tonic::server::NamedService;

    use super::*;

    #[test]
    fn the_health_list_names_every_served_service() {
        for name in [
            <CountersServer<CountersService> as NamedService>::NAME,
            <LikesServer<LikesService> as NamedService>::NAME,
            <AdminServer<AdminService> as NamedService>::NAME,
            <ReplicationServer<ReplicationService> as NamedService>::NAME,
        ] {
            assert!(SERVED_SERVICES.contains(&name), "{name}");
        }
    }
}
