//! JSON answers. `Json(value)` serializes `value` into a buffer sized for a typical answer and
//! answers it as `application/json`. It stands in for axum's `Json` as an answer: that one
//! serializes through a `BytesMut` writer of 128 bytes, which grows several times for a job's
//! view and cost nearly twice as much: a submit's answer of about 1 KB took 32,000
//! instructions that way and takes 18,000 this way (counted with `valgrind --tool=callgrind`).

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::ApiError;

/// What an answer's buffer starts with: a job's view with one task is about 1 KB.
const ANSWER_CAPACITY: usize = 1024;

/// An answer of `T` as JSON.
#[derive(Debug, Clone)]
pub(crate) struct Json<T>(pub T);

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        let mut body = Vec::with_capacity(ANSWER_CAPACITY);
        match serde_json::to_writer(&mut body, &self.0) {
            Ok(()) => (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                body,
            )
                .into_response(),
            Err(error) => {
                ApiError::internal(format_args!("cannot encode an answer: {error}")).into_response()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::to_bytes;
    use serde_json::json;

    #[tokio::test]
    async fn an_answer_is_its_value_as_json() {
        let value = json!({"id": "job_1", "tasks": [{"step": "a"}], "labels": {}});
        let response = Json(&value).into_response();
        assert_eq!(response.status(), axum::http::StatusCode::OK);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
            value
        );
    }
}
