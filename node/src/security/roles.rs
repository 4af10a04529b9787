//! What a caller may do: the [`Role`] a call needs (by its gRPC method;
//! the HTTP side maps its routes in `crate::http::access`), the [`Roles`] a
//! token holds, and [`Authorized`], the wrapper that marks each gRPC request
//! with the role its method needs and the moment it arrived, before the
//! token interceptor sees it.
//!
//! Invariant: a method not listed in [`Role::for_grpc_path`] needs `admin`,
//! so a new method is closed until it is placed.

/// What a call may need of its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Reads: gets, watches, like lookups, status.
    Read,
    /// Writes: adds, likes, unlikes, observes.
    Write,
    /// Operations: backup, drain, remove, retire, finalize.
    Admin,
}

impl Role {
    fn bit(self) -> u8 {
        match self {
            Role::Read => 1,
            Role::Write => 2,
            Role::Admin => 4,
        }
    }

    /// The role's name in the tokens file.
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Admin => "admin",
        }
    }

    /// The role a gRPC method (its path, `/tally.v1.Counters/Add`) needs;
    /// anything not listed needs `admin`, so a new method is closed until
    /// it is placed.
    pub fn for_grpc_path(path: &str) -> Role {
        match path.rsplit_once('/') {
            Some(("/tally.v1.Counters", "Add" | "AddBatch")) => Role::Write,
            Some(("/tally.v1.Counters", "Get" | "GetBatch" | "Watch")) => Role::Read,
            Some(("/tally.v1.Likes", "Like" | "Unlike" | "LikeBatch" | "Observe")) => Role::Write,
            Some((
                "/tally.v1.Likes",
                "Liked" | "LikeCount" | "ListLikes" | "VerifyLikes" | "Distinct",
            )) => Role::Read,
            Some(("/tally.v1.Admin", "Status" | "PartitionMap")) => Role::Read,
            _ => Role::Admin,
        }
    }
}

/// The roles of a token: `write` and `admin` include `read`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Roles(u8);

impl Roles {
    /// Every role (a tokens line of an earlier release).
    pub const ALL: Roles = Roles(7);

    /// Whether these roles allow a call that needs `role`.
    pub fn allow(self, role: Role) -> bool {
        let granted = if self.0 & (Role::Write.bit() | Role::Admin.bit()) != 0 {
            self.0 | Role::Read.bit()
        } else {
            self.0
        };
        granted & role.bit() != 0
    }

    /// The roles as the tokens file writes them.
    pub fn names(self) -> String {
        [Role::Read, Role::Write, Role::Admin]
            .into_iter()
            .filter(|role| self.0 & role.bit() != 0)
            .map(Role::name)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Parses a comma list of role names; the unknown word on failure.
    pub fn parse(text: &str) -> Result<Roles, String> {
        let mut bits = 0;
        for word in text.split(',') {
            bits |= match word.trim() {
                "read" => Role::Read.bit(),
                "write" => Role::Write.bit(),
                "admin" => Role::Admin.bit(),
                other => return Err(other.to_string()),
            };
        }
        Ok(Roles(bits))
    }
}

/// When a request arrived (before its body was decoded), put in its
/// extensions by [`Authorized`]: a caller's `grpc-timeout` counts from here.
#[derive(Clone, Copy, Debug)]
pub struct Received(pub tokio::time::Instant);

/// The role a request needs, put in its extensions by [`Authorized`].
#[derive(Clone, Copy, Debug)]
pub struct NeedsRole(pub Role);

/// A gRPC service whose requests are marked with the role their method
/// needs ([`Role::for_grpc_path`]) before the token interceptor inside sees
/// them (a tonic interceptor is not given the path), and with the time they
/// arrived ([`Received`]).
#[derive(Clone, Debug)]
pub struct Authorized<S>(pub S);

impl<S: tonic::server::NamedService> tonic::server::NamedService for Authorized<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tonic::codegen::Service<tonic::codegen::http::Request<B>> for Authorized<S>
where
    S: tonic::codegen::Service<tonic::codegen::http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut request: tonic::codegen::http::Request<B>) -> Self::Future {
        let role = Role::for_grpc_path(request.uri().path());
        request.extensions_mut().insert(NeedsRole(role));
        request
            .extensions_mut()
            .insert(Received(tokio::time::Instant::now()));
        self.0.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_needs_the_role_of_what_it_does() {
        assert_eq!(Role::for_grpc_path("/tally.v1.Counters/Add"), Role::Write);
        assert_eq!(Role::for_grpc_path("/tally.v1.Counters/Get"), Role::Read);
        assert_eq!(Role::for_grpc_path("/tally.v1.Likes/Unlike"), Role::Write);
        assert_eq!(Role::for_grpc_path("/tally.v1.Likes/Distinct"), Role::Read);
        assert_eq!(
            Role::for_grpc_path("/tally.v1.Admin/PartitionMap"),
            Role::Read
        );
        for admin in ["Backup", "Finalize", "Retire", "Drain", "Remove"] {
            assert_eq!(
                Role::for_grpc_path(&format!("/tally.v1.Admin/{admin}")),
                Role::Admin
            );
        }
        assert_eq!(Role::for_grpc_path("/tally.v1.Counters/Reset"), Role::Admin);
        assert_eq!(Role::for_grpc_path("nonsense"), Role::Admin);
    }
}
