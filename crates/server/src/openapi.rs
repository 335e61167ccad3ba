//! `GET /api/v1/openapi.json`: the OpenAPI 3.1 document of the whole API, written by hand in
//! `openapi.json` next to this file and embedded in the binary. `tests/openapi.rs` checks it
//! against the routes and validates real responses with its schemas.

use axum::http::header;
use axum::response::IntoResponse;

/// The document, as served.
pub(crate) const DOCUMENT: &str = include_str!("openapi.json");

pub(crate) async fn serve() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT)
}
