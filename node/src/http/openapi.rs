//! The OpenAPI 3.1 document of the JSON API, served at `/v1/openapi.json`.
//! It is generated from the handlers themselves (`utoipa`: each handler's
//! `#[utoipa::path]` and each body's `ToSchema`), and the routes are
//! registered from the same attributes (`utoipa_axum::routes!`), so the
//! document cannot drift from what the node serves. With `--auth-tokens`
//! it declares the bearer scheme and requires it on every operation.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{OpenApi as Document, SecurityRequirement};
use utoipa::OpenApi;

use super::events::ValueEvent;
use super::like_events::CountEvent;
use super::problem::Problem;

/// The document's fixed parts; the paths come from the router.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tally HTTP API",
        description = "Geo-replicated counters over JSON: the same operations, validation and \
                       guarantees as the gRPC `tally.v1.Counters` service, the seed design's \
                       REST API (`/v1/counter/`), and live counts as server-sent events. \
                       Errors are `application/problem+json` (RFC 9457) whose `code` is the \
                       gRPC status the same request gets.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    tags(
        (name = "counters", description = "Add to counters and read them."),
        (name = "likes", description = "Like sets (who liked, exactly) and uniques (distinct members, estimated)."),
        (name = "seed", description = "The seed design's API: POST forms a counter_id, PUT increments it, GET reads it."),
    ),
    components(schemas(Problem, ValueEvent, CountEvent)),
)]
pub struct ApiDoc;

/// Completes the document for this node: the bearer scheme when tokens are on.
pub fn finish(mut document: Document, tokens_on: bool) -> Document {
    if tokens_on {
        let components = document.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("A token from the node's --auth-tokens file."))
                    .build(),
            ),
        );
        document.security = Some(vec![SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
    }
    document
}
