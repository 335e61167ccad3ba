//! API errors as RFC 9457 problem documents (`application/problem+json`). Details of server
//! faults are logged, not sent. (Rejections the framework answers itself are rewritten into
//! problem documents by `rejections`.)

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use starbridge_api::{FieldProblem, Problem, ProblemLimit};
use starbridge_engine::{Error as StoreError, WriteFault};

#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
    detail: String,
    errors: Vec<FieldProblem>,
    limit: Option<Box<ProblemLimit>>,
}

impl ApiError {
    /// A fault of the server's own: `error` is logged, not sent.
    pub(crate) fn internal(error: impl std::fmt::Display) -> ApiError {
        tracing::error!(%error, "internal error");
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            slug: "internal",
            title: "Internal server error",
            detail: "an internal error occurred; it has been logged".to_owned(),
            errors: Vec::new(),
            limit: None,
        }
    }

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
            limit: None,
        }
    }

    /// A request field holds a value the server cannot take (422), naming the field.
    pub(crate) fn validation(field: &str, message: impl Into<String>) -> ApiError {
        ApiError::from(StoreError::Invalid(vec![
            starbridge_core::definition::Problem {
                field: field.to_owned(),
                message: message.into(),
            },
        ]))
    }

    /// A request goes over a server limit: names the field, the limit and its setting.
    pub(crate) fn limit(
        status: StatusCode,
        field: &str,
        message: String,
        limit: ProblemLimit,
    ) -> ApiError {
        ApiError {
            status,
            slug: "limit-exceeded",
            title: "Limit exceeded",
            detail: format!("{field}: {message}"),
            errors: vec![FieldProblem {
                field: field.to_owned(),
                message,
            }],
            limit: Some(Box::new(limit)),
        }
    }

    /// A request refused before it is read, for a reason its problem type names.
    pub(crate) fn refused(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: String,
    ) -> ApiError {
        ApiError {
            status,
            slug,
            title,
            detail,
            errors: Vec::new(),
            limit: None,
        }
    }

    /// The same problem answered with another status (a framework's refusal keeps its own).
    pub(crate) fn with_status(mut self, status: StatusCode) -> ApiError {
        self.status = status;
        self
    }

    /// Names the field (or header) at fault, with the detail as its message.
    pub(crate) fn with_field(mut self, field: &str) -> ApiError {
        self.errors = vec![FieldProblem {
            field: field.to_owned(),
            message: self.detail.clone(),
        }];
        self
    }

    /// The method is not served at this path (the `Allow` header lists the ones that are).
    pub(crate) fn method_not_allowed(method: &str) -> ApiError {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            slug: "method-not-allowed",
            title: "Method not allowed",
            detail: format!(
                "this endpoint does not answer {method}: the Allow header lists the methods it does"
            ),
            errors: Vec::new(),
            limit: None,
        }
    }

    pub(crate) fn not_found(detail: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            slug: "not-found",
            title: "Not found",
            detail: detail.into(),
            errors: Vec::new(),
            limit: None,
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
            limit: None,
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
            limit: None,
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
            limit: self.limit,
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
            StoreError::Forbidden(detail) => ApiError::forbidden(detail),
            StoreError::Conflict(detail) => ApiError {
                status: StatusCode::CONFLICT,
                slug: "conflict",
                title: "Conflict with the current state",
                detail,
                errors: Vec::new(),
                limit: None,
            },
            StoreError::Gone(detail) => ApiError {
                status: StatusCode::GONE,
                slug: "gone",
                title: "No longer available",
                detail,
                errors: Vec::new(),
                limit: None,
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
                limit: None,
            },
            StoreError::Closed => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                slug: "unavailable",
                title: "Server shutting down",
                detail: "the server is shutting down; nothing was changed, try again".to_owned(),
                errors: Vec::new(),
                limit: None,
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
                    limit: None,
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
                    limit: None,
                }
            }
            StoreError::Full(detail) => {
                tracing::warn!(%detail, "write refused: the database's disk is full");
                ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    slug: "disk-full",
                    title: "Disk full",
                    detail: format!(
                        "{}; nothing was changed: free space on it, then try again",
                        WriteFault::Full.explain()
                    ),
                    errors: Vec::new(),
                    limit: None,
                }
            }
            StoreError::ReadOnly(detail) => {
                tracing::warn!(%detail, "write refused: the database is read-only");
                ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    slug: "read-only",
                    title: "Database read-only",
                    detail: format!(
                        "{}; nothing was changed: make it writable, then try again",
                        WriteFault::ReadOnly.explain()
                    ),
                    errors: Vec::new(),
                    limit: None,
                }
            }
            other => ApiError::internal(other),
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
                HeaderValue::from_static(CHALLENGE),
            );
        }
        response
    }
}

/// The `WWW-Authenticate` header of every 401.
pub(crate) const CHALLENGE: &str = "Bearer realm=\"starbridge\"";

pub(crate) type ApiResult<T> = Result<T, ApiError>;
