//! API errors as RFC 9457 problem documents (`application/problem+json`). Details of server
//! faults are logged, not sent.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use starbridge_api::{FieldProblem, Problem};
use starbridge_store::Error as StoreError;

#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
    detail: String,
    errors: Vec<FieldProblem>,
}

impl ApiError {
    /// A request field is wrong: names the field and says how to fix it.
    pub(crate) fn invalid(field: &str, message: impl Into<String>) -> ApiError {
        let message = message.into();
        ApiError {
            status: StatusCode::BAD_REQUEST,
            slug: "invalid-request",
            title: "Invalid request",
            detail: format!("{field}: {message}"),
            errors: vec![FieldProblem {
                field: field.to_owned(),
                message,
            }],
        }
    }

    pub(crate) fn not_found(detail: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            slug: "not-found",
            title: "Not found",
            detail: detail.into(),
            errors: Vec::new(),
        }
    }

    /// No token, or one that is unknown or revoked.
    pub(crate) fn unauthorized(detail: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            slug: "unauthorized",
            title: "Authentication required",
            detail: detail.into(),
            errors: Vec::new(),
        }
    }

    /// The token is good but its scopes do not allow the request.
    pub(crate) fn forbidden(detail: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::FORBIDDEN,
            slug: "forbidden",
            title: "Not allowed",
            detail: detail.into(),
            errors: Vec::new(),
        }
    }

    /// A request part is over its size limit.
    pub(crate) fn too_large(field: &str, message: impl Into<String>) -> ApiError {
        let message = message.into();
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            slug: "too-large",
            title: "Too large",
            detail: format!("{field}: {message}"),
            errors: vec![FieldProblem {
                field: field.to_owned(),
                message,
            }],
        }
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The problem document sent for this error (alone, or as one item of a batch answer).
    pub fn into_problem(self) -> Problem {
        Problem {
            kind: format!("/problems/{}", self.slug),
            title: self.title.to_owned(),
            status: self.status.as_u16(),
            detail: self.detail,
            errors: self.errors,
        }
    }

    /// What went wrong, as the problem document's `detail` says it.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> ApiError {
        match error {
            StoreError::NotFound(detail) => ApiError::not_found(detail),
            StoreError::Conflict(detail) => ApiError {
                status: StatusCode::CONFLICT,
                slug: "conflict",
                title: "Conflict with the current state",
                detail,
                errors: Vec::new(),
            },
            StoreError::Invalid(problems) => ApiError {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                slug: "validation",
                title: "Validation failed",
                detail: problems
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
                errors: problems
                    .into_iter()
                    .map(|p| FieldProblem {
                        field: p.field,
                        message: p.message,
                    })
                    .collect(),
            },
            StoreError::Closed => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                slug: "unavailable",
                title: "Server shutting down",
                detail: "the server is shutting down; nothing was changed, try again".to_owned(),
                errors: Vec::new(),
            },
            StoreError::Contended(detail) => {
                tracing::warn!(%detail, "request contended by other nodes");
                ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    slug: "contended",
                    title: "Busy",
                    detail: "other server nodes kept the rows this request needs busy; nothing was changed, try again"
                        .to_owned(),
                    errors: Vec::new(),
                }
            }
            StoreError::Unavailable(detail) => {
                tracing::warn!(%detail, "database unavailable");
                ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    slug: "unavailable",
                    title: "Database unavailable",
                    detail: "the database is unavailable; nothing was changed, try again"
                        .to_owned(),
                    errors: Vec::new(),
                }
            }
            other => {
                tracing::error!(error = %other, "internal error");
                ApiError {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    slug: "internal",
                    title: "Internal server error",
                    detail: "an internal error occurred; it has been logged".to_owned(),
                    errors: Vec::new(),
                }
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let problem = self.into_problem();
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut response = (status, body).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"starbridge\""),
            );
        }
        response
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;
