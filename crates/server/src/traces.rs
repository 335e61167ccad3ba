//! The server's part of OpenTelemetry traces (see `starbridge_engine::traces`): a span per API
//! request, named by its route template (`POST /api/v1/callbacks/{token}/complete`: paths may
//! hold credentials, so the raw path is never used), and the submitter's `traceparent` header
//! handed to the jobs it submits. While tracing is off, the router leaves the middleware out
//! (`routes::router`) and no header is read.

use std::time::SystemTime;

use axum::extract::{MatchedPath, Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use starbridge_engine::Engine;
use starbridge_engine::traces::FinishedSpan;

/// The W3C trace context header.
const TRACEPARENT: &str = "traceparent";

/// The route name of a request that matched no route.
const UNMATCHED: &str = "unmatched";

/// The caller's `traceparent` header, read only while tracing is on.
pub(crate) fn traceparent(engine: &Engine, headers: &HeaderMap) -> Option<String> {
    engine.spans()?;
    headers
        .get(TRACEPARENT)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

/// Middleware around every route while tracing is on: the request's span, once answered.
pub(crate) async fn record(State(engine): State<Engine>, request: Request, next: Next) -> Response {
    let Some(sink) = engine.spans().cloned() else {
        return next.run(request).await;
    };
    let started = SystemTime::now();
    let method = request.method().as_str().to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| UNMATCHED.to_owned(), |path| path.as_str().to_owned());
    let traceparent = traceparent(&engine, request.headers());
    let response = next.run(request).await;
    sink.send(FinishedSpan::Request {
        method,
        route,
        status: response.status().as_u16(),
        traceparent,
        started,
        ended: SystemTime::now(),
    });
    response
}
