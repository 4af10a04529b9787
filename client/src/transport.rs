//! The connection a [`crate::Client`] talks over: a tonic channel, plain or
//! TLS, that adds the client's bearer token to every request.

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::Channel;
use tonic::{Request, Status};

/// A channel that carries the bearer token.
pub(crate) type Transport = InterceptedService<Channel, BearerToken>;

/// Adds `authorization: Bearer TOKEN` when a token is set.
#[derive(Clone, Debug, Default)]
pub(crate) struct BearerToken(pub(crate) Option<MetadataValue<Ascii>>);

impl Interceptor for BearerToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}
