//! Answers the framework gives on its own (a query string that does not parse, a body over the
//! size limit, a method the path does not serve, a path that is not UTF-8, …) rewritten into
//! problem documents like every other error.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::limits::{Limit, Limits};

/// Longest framework rejection text read to quote in a problem.
const MAX_REJECTION_TEXT: usize = 4096;

/// Turns what the framework answers on its own (a query string that does not parse, a body over
/// the size limit, a method the path does not serve, …) into problem documents like every other
/// error. Answers that already are problem documents, or JSON a handler wrote on purpose (the
/// unhealthy answer of `/healthz`), pass through untouched: the framework's rejections are text.
pub(crate) async fn problems_for_rejections(
    State(limits): State<Arc<Limits>>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().clone();
    let response = next.run(request).await;
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| {
            let value = value.as_bytes();
            value.starts_with(b"application/problem+json") || value == b"application/json"
        });
    if is_problem || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    match status {
        // The router adds the `Allow` header around this answer.
        StatusCode::METHOD_NOT_ALLOWED => {
            ApiError::method_not_allowed(method.as_str()).into_response()
        }
        StatusCode::PAYLOAD_TOO_LARGE => limits.body_too_large(Limit::Body, "body").into_response(),
        _ => {
            let body = axum::body::to_bytes(response.into_body(), MAX_REJECTION_TEXT)
                .await
                .unwrap_or_default();
            let text = String::from_utf8_lossy(&body).trim().to_owned();
            let field = rejected_field(&text);
            let message = if text.is_empty() {
                status
                    .canonical_reason()
                    .unwrap_or("rejected")
                    .to_lowercase()
            } else {
                text
            };
            ApiError::invalid(&field, message)
                .with_status(status)
                .into_response()
        }
    }
}

/// The part of a request a framework rejection's text blames: the path parameter it names (a
/// path that is not UTF-8 or does not parse), the query string, or else the body.
fn rejected_field(text: &str) -> String {
    if text.starts_with("Failed to deserialize query string") {
        return "query".to_owned();
    }
    if text.starts_with("Invalid URL") {
        let named = text.split('`').nth(1).filter(|name| !name.is_empty());
        return named.unwrap_or("path").to_owned();
    }
    if text.contains("path") {
        return "path".to_owned();
    }
    "body".to_owned()
}

#[cfg(test)]
mod tests {
    use super::rejected_field;

    #[test]
    fn a_rejection_blames_the_part_of_the_request_it_names() {
        assert_eq!(rejected_field("Invalid URL: Invalid UTF-8 in `id`"), "id");
        assert_eq!(
            rejected_field("Failed to deserialize query string: limit: invalid digit"),
            "query"
        );
        assert_eq!(
            rejected_field("Wrong number of path arguments for `Path`. Expected 1 but got 2"),
            "path"
        );
        assert_eq!(rejected_field("Failed to buffer the request body"), "body");
    }
}
