//! A small typed HTTP client for the Starbridge API.
//!
//! [`Client`] knows the worker endpoints (`poll`, `heartbeat`, `complete`, `fail`,
//! `check_later`) and offers generic JSON helpers ([`Client::get_json`], [`Client::post_json`],
//! [`Client::put_raw`], …) so other tools (the CLI) can reach the rest of the API with the same
//! base URL, bearer token and error handling. Every non-2xx answer becomes an [`Error`] that
//! tells a caller whether trying again can help ([`Error::is_retryable`]).

use std::fmt;
use std::time::Duration;

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use starbridge_api::{
    CheckLaterRequest, CompleteRequest, CompleteTasks, CompleteTasksResponse, FailRequest,
    HeartbeatRequest, HeartbeatResponse, PollRequest, PollResponse, Problem, ReportResponse,
};

/// How long a request may take unless the call says otherwise.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long connecting to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Kept-alive connections unused this long are closed by the client, well before the server's
/// idle timeout (75 s by default) closes them, so no request is sent on a connection the server
/// is closing at that moment.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Extra time given to a long poll beyond the `wait_ms` the server may hold it.
const POLL_TIMEOUT_MARGIN: Duration = Duration::from_secs(15);

/// The longest piece of a non-JSON error body quoted in an error message.
const MAX_QUOTED_BODY: usize = 512;

/// An error talking to the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The base URL given to [`Client::new`] is not an `http` or `https` URL.
    #[error("invalid server URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// The CA certificates given to [`Client::with_ca_pem`] are not PEM certificates.
    #[error("invalid CA certificate: {0}")]
    InvalidCaCertificate(String),
    /// `409 Conflict`, with the problem's detail. For task reports and heartbeats: the lease is
    /// stale (the task was taken away from this worker).
    #[error("conflict: {0}")]
    Conflict(String),
    /// `404 Not Found`, with the problem's detail.
    #[error("not found: {0}")]
    NotFound(String),
    /// Any other 4xx (or otherwise unexpected, non-retryable) status: the request itself is at
    /// fault and sending it again will not help.
    #[error("request rejected: {}", describe_problem(.problem))]
    Rejected { status: u16, problem: Problem },
    /// A 5xx status: the server failed or is restarting; the request may be retried.
    #[error("server error {status}: {message}")]
    Server { status: u16, message: String },
    /// The request did not get an answer (connection refused or reset, timeout, …); it may be
    /// retried.
    #[error("could not reach the server")]
    Transport(#[source] reqwest::Error),
    /// A 2xx answer whose body is not the JSON expected.
    #[error("unexpected response body (status {status})")]
    Decode {
        status: u16,
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// The error a problem document stands for: what the same answer would have been as a
    /// whole response (used for the items of batch answers).
    pub fn from_problem(problem: Problem) -> Error {
        match problem.status {
            409 => Error::Conflict(problem.detail),
            404 => Error::NotFound(problem.detail),
            code @ 500..=599 => Error::Server {
                status: code,
                message: problem.detail,
            },
            code => Error::Rejected {
                status: code,
                problem,
            },
        }
    }

    /// True for errors where sending the same request again later may succeed (5xx, transport).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Server { .. } | Error::Transport(_))
    }

    /// The HTTP status of the answer, when there was one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Conflict(_) => Some(409),
            Error::NotFound(_) => Some(404),
            Error::Rejected { status, .. }
            | Error::Server { status, .. }
            | Error::Decode { status, .. } => Some(*status),
            Error::InvalidUrl { .. } | Error::InvalidCaCertificate(_) | Error::Transport(_) => None,
        }
    }

    /// True when the request surely never reached the server (the connection could not be made),
    /// so it had no effect there.
    pub(crate) fn surely_not_delivered(&self) -> bool {
        matches!(self, Error::Transport(e) if e.is_connect())
    }
}

/// Formats a problem as `title (status): detail; field: message; …`.
fn describe_problem(problem: &Problem) -> String {
    let mut text = if problem.detail.is_empty() || problem.detail == problem.title {
        format!("{} ({})", problem.title, problem.status)
    } else {
        format!("{} ({}): {}", problem.title, problem.status, problem.detail)
    };
    // Field problems the detail does not already spell out.
    for field in &problem.errors {
        if !problem.detail.contains(&field.message) {
            text.push_str(&format!("; {}: {}", field.field, field.message));
        }
    }
    text
}

/// Formats an error with its chain of causes, for logs (`error: cause: cause`).
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A client of one Starbridge server.
///
/// Cheap to clone (the connection pool is shared). The token, when set, is sent as
/// `Authorization: Bearer <token>` on every request; callers decide where it comes from
/// (a flag, an environment variable, …).
#[derive(Clone)]
pub struct Client {
    /// The server's root URL, e.g. `http://127.0.0.1:7433` (without `/api/v1`).
    pub base_url: String,
    /// Bearer token sent with every request, if any.
    pub token: Option<String>,
    /// Who is acting, sent as the `Starbridge-Actor` header and recorded with operator actions.
    pub actor: Option<String>,
    http: reqwest::Client,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base_url", &self.base_url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of the server at `base_url` (`http://host:port` or `https://…`, optionally with
    /// a path prefix), without a token. An `https` server's certificate must chain to a root
    /// the system trusts.
    pub fn new(base_url: impl Into<String>) -> Result<Self, Error> {
        Client::build(base_url.into(), Vec::new())
    }

    /// Like [`Client::new`], also trusting the CA certificates in `pem` (PEM text, one or more
    /// certificates): for a server whose certificate a private CA signed, or a self-signed one.
    pub fn with_ca_pem(base_url: impl Into<String>, pem: &[u8]) -> Result<Self, Error> {
        let roots = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| Error::InvalidCaCertificate(e.to_string()))?;
        if roots.is_empty() {
            return Err(Error::InvalidCaCertificate(
                "no PEM certificate found".to_owned(),
            ));
        }
        Client::build(base_url.into(), roots)
    }

    fn build(base_url: String, roots: Vec<reqwest::Certificate>) -> Result<Self, Error> {
        let parsed = reqwest::Url::parse(&base_url).map_err(|e| Error::InvalidUrl {
            url: base_url.clone(),
            reason: e.to_string(),
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(Error::InvalidUrl {
                url: base_url,
                reason: "the scheme must be http or https".to_owned(),
            });
        }
        // HTTPS goes through rustls with `ring`; a provider the process installed already wins.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .tls_certs_merge(roots)
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .timeout(DEFAULT_REQUEST_TIMEOUT)
            .user_agent(concat!("starbridge-worker/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(Error::Transport)?;
        Ok(Client {
            base_url: base_url.trim_end_matches('/').to_owned(),
            token: None,
            actor: None,
            http,
        })
    }

    /// A client configured from the environment: `STARBRIDGE_SERVER` (default
    /// `http://127.0.0.1:7433`) and `STARBRIDGE_TOKEN` (the API token, when the server needs
    /// one).
    pub fn from_env() -> Result<Self, Error> {
        let server = std::env::var("STARBRIDGE_SERVER")
            .ok()
            .filter(|url| !url.is_empty())
            .unwrap_or_else(|| "http://127.0.0.1:7433".to_owned());
        let token = std::env::var("STARBRIDGE_TOKEN")
            .ok()
            .filter(|token| !token.is_empty());
        Ok(Client::new(server)?.with_token(token))
    }

    /// Sets (or clears) the bearer token.
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    /// Sets (or clears) who is acting, recorded by the server with operator actions.
    pub fn with_actor(mut self, actor: Option<String>) -> Self {
        self.actor = actor;
        self
    }

    /// The absolute URL of `path` (a path from the server root such as `/api/v1/jobs`).
    pub fn url(&self, path: &str) -> String {
        let base = self.base_url.trim_end_matches('/');
        if path.starts_with('/') {
            format!("{base}{path}")
        } else {
            format!("{base}/{path}")
        }
    }

    /// `POST /api/v1/tasks/poll`: leases up to `max_tasks` tasks, the server holding the request
    /// up to `wait_ms` while none is ready.
    pub async fn poll(&self, request: &PollRequest) -> Result<PollResponse, Error> {
        let wait = Duration::from_millis(request.wait_ms.unwrap_or(0));
        let builder = self
            .request(Method::POST, "/api/v1/tasks/poll")
            .timeout(wait.saturating_add(POLL_TIMEOUT_MARGIN))
            .json(request);
        self.send(builder).await.map(|(_, body)| body)
    }

    /// `POST /api/v1/tasks/{id}/heartbeat`: extends the lease. [`Error::Conflict`] means the lease
    /// is stale: stop working on the task.
    pub async fn heartbeat(
        &self,
        task_id: &str,
        request: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, Error> {
        self.heartbeat_within(task_id, request, DEFAULT_REQUEST_TIMEOUT)
            .await
    }

    /// [`Client::heartbeat`] with a request timeout of its own.
    pub(crate) async fn heartbeat_within(
        &self,
        task_id: &str,
        request: &HeartbeatRequest,
        timeout: Duration,
    ) -> Result<HeartbeatResponse, Error> {
        let path = task_path(task_id, "heartbeat");
        let builder = self
            .request(Method::POST, &path)
            .timeout(timeout)
            .json(request);
        self.send(builder).await.map(|(_, body)| body)
    }

    /// `POST /api/v1/tasks/{id}/complete`.
    pub async fn complete(
        &self,
        task_id: &str,
        request: &CompleteRequest,
    ) -> Result<ReportResponse, Error> {
        self.post_json(&task_path(task_id, "complete"), request)
            .await
    }

    /// `POST /api/v1/tasks/complete`: many successes in one request; the answer has one item
    /// per task, its result or its problem (see [`Error::from_problem`]).
    pub async fn complete_many(
        &self,
        request: &CompleteTasks,
    ) -> Result<CompleteTasksResponse, Error> {
        self.post_json("/api/v1/tasks/complete", request).await
    }

    /// `POST /api/v1/tasks/{id}/fail`.
    pub async fn fail(
        &self,
        task_id: &str,
        request: &FailRequest,
    ) -> Result<ReportResponse, Error> {
        self.post_json(&task_path(task_id, "fail"), request).await
    }

    /// `POST /api/v1/tasks/{id}/check-later`.
    pub async fn check_later(
        &self,
        task_id: &str,
        request: &CheckLaterRequest,
    ) -> Result<ReportResponse, Error> {
        self.post_json(&task_path(task_id, "check-later"), request)
            .await
    }

    /// `GET path`, decoding the JSON answer. `path` starts from the server root
    /// (`/api/v1/jobs/job_…`, `/healthz`).
    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        let builder = self.request(Method::GET, path);
        self.send(builder).await.map(|(_, body)| body)
    }

    /// `GET path`, the answer as text (e.g. `/metrics`).
    pub async fn get_text(&self, path: &str) -> Result<String, Error> {
        let response = self
            .request(Method::GET, path)
            .send()
            .await
            .map_err(Error::Transport)?;
        let status = response.status();
        let body = response.bytes().await.map_err(Error::Transport)?;
        if status.is_success() {
            Ok(String::from_utf8_lossy(&body).into_owned())
        } else {
            Err(error_from_response(status, &body))
        }
    }

    /// `GET path?query`, the query serialized from `query` (e.g. a
    /// [`starbridge_api::JobListQuery`]; `None` fields are left out).
    pub async fn get_json_query<Q, T>(&self, path: &str, query: &Q) -> Result<T, Error>
    where
        Q: Serialize + ?Sized,
        T: DeserializeOwned,
    {
        let builder = self.request(Method::GET, path).query(query);
        self.send(builder).await.map(|(_, body)| body)
    }

    /// `POST path` with a JSON body, decoding the JSON answer.
    pub async fn post_json<B, T>(&self, path: &str, body: &B) -> Result<T, Error>
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned,
    {
        self.post_json_with_status(path, body)
            .await
            .map(|(_, body)| body)
    }

    /// [`Client::post_json`], also returning the 2xx status (e.g. `201` for a new job, `200` for
    /// an existing one with the same key).
    pub async fn post_json_with_status<B, T>(&self, path: &str, body: &B) -> Result<(u16, T), Error>
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned,
    {
        let builder = self.request(Method::POST, path).json(body);
        self.send(builder).await
    }

    /// `DELETE path`; any 2xx answer (usually 204 with no body) is success.
    pub async fn delete(&self, path: &str) -> Result<(), Error> {
        let builder = self.request(Method::DELETE, path);
        self.send::<serde_json::Value>(builder).await.map(|_| ())
    }

    /// `PUT path` with a raw body of the given content type (e.g. a YAML workflow definition as
    /// `application/yaml`), decoding the JSON answer.
    pub async fn put_raw<T: DeserializeOwned>(
        &self,
        path: &str,
        content_type: &str,
        body: impl Into<Vec<u8>>,
    ) -> Result<T, Error> {
        let builder = self
            .request(Method::PUT, path)
            .header(CONTENT_TYPE, content_type)
            .body(body.into());
        self.send(builder).await.map(|(_, body)| body)
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let builder = self
            .http
            .request(method, self.url(path))
            .header(ACCEPT, "application/json, application/problem+json");
        let builder = match &self.actor {
            Some(actor) => builder.header("starbridge-actor", actor),
            None => builder,
        };
        match &self.token {
            Some(token) => builder.bearer_auth(token),
            None => builder,
        }
    }

    /// Sends a request and turns the answer into a decoded body or an [`Error`].
    async fn send<T: DeserializeOwned>(&self, builder: RequestBuilder) -> Result<(u16, T), Error> {
        let response = builder.send().await.map_err(Error::Transport)?;
        let status = response.status();
        let body = response.bytes().await.map_err(Error::Transport)?;
        if status.is_success() {
            // An empty body decodes as `null`, so `()` and `Option<_>` work for empty answers.
            let bytes: &[u8] = if body.is_empty() { b"null" } else { &body };
            let decoded = serde_json::from_slice(bytes).map_err(|source| Error::Decode {
                status: status.as_u16(),
                source,
            })?;
            Ok((status.as_u16(), decoded))
        } else {
            Err(error_from_response(status, &body))
        }
    }
}

/// The path of a task endpoint, the id percent-encoded.
fn task_path(task_id: &str, action: &str) -> String {
    format!("/api/v1/tasks/{}/{action}", encode_path_segment(task_id))
}

/// Percent-encodes everything but RFC 3986 unreserved characters, for use as one path segment.
pub fn encode_path_segment(segment: &str) -> String {
    let mut encoded = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// Builds the error for a non-2xx answer, reading an RFC 9457 problem body when there is one.
fn error_from_response(status: StatusCode, body: &[u8]) -> Error {
    let mut problem = parse_problem(status, body);
    // The answer's status decides, whatever the body claims.
    problem.status = status.as_u16();
    Error::from_problem(problem)
}

/// The problem document in `body`, or one made up from whatever the body holds.
fn parse_problem(status: StatusCode, body: &[u8]) -> Problem {
    let reason = status.canonical_reason().unwrap_or("error").to_owned();
    if let Ok(mut problem) = serde_json::from_slice::<Problem>(body) {
        if problem.detail.is_empty() {
            problem.detail.clone_from(&problem.title);
        }
        return problem;
    }
    // Not a full problem document: look for the usual message fields in any JSON object.
    let detail = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(map)) => ["detail", "message", "error", "title"]
            .iter()
            .find_map(|key| map.get(*key).and_then(|v| v.as_str()).map(str::to_owned)),
        _ => None,
    };
    let detail = detail.unwrap_or_else(|| {
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        if text.is_empty() {
            reason.clone()
        } else {
            crate::shell::shorten(text, MAX_QUOTED_BODY)
        }
    });
    Problem {
        kind: "about:blank".to_owned(),
        title: reason,
        status: status.as_u16(),
        detail,
        errors: Vec::new(),
        limit: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_json_gives_detail_and_kind_of_error() {
        let body =
            br#"{"type":"about:blank","title":"Conflict","status":409,"detail":"stale lease"}"#;
        match error_from_response(StatusCode::CONFLICT, body) {
            Error::Conflict(detail) => assert_eq!(detail, "stale lease"),
            other => panic!("unexpected {other:?}"),
        }
        let body = br#"{"type":"x","title":"Bad Request","status":400,"detail":"invalid body","errors":[{"field":"queues","message":"must not be empty"}]}"#;
        let error = error_from_response(StatusCode::BAD_REQUEST, body);
        assert!(!error.is_retryable());
        assert_eq!(
            error.to_string(),
            "request rejected: Bad Request (400): invalid body; queues: must not be empty"
        );
    }

    #[test]
    fn non_json_error_bodies_are_quoted_and_5xx_is_retryable() {
        let error = error_from_response(StatusCode::BAD_GATEWAY, b"upstream down");
        assert!(error.is_retryable());
        assert_eq!(error.to_string(), "server error 502: upstream down");
        let error = error_from_response(StatusCode::NOT_FOUND, b"");
        assert_eq!(error.to_string(), "not found: Not Found");
    }

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode_path_segment("tsk_01AB-c.d~"), "tsk_01AB-c.d~");
        assert_eq!(encode_path_segment("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn base_url_must_be_http_and_joins_paths() {
        assert!(matches!(
            Client::new("ftp://x"),
            Err(Error::InvalidUrl { .. })
        ));
        let client = Client::new("http://127.0.0.1:7433/").expect("valid url");
        assert_eq!(
            client.url("/api/v1/jobs"),
            "http://127.0.0.1:7433/api/v1/jobs"
        );
        assert_eq!(client.url("healthz"), "http://127.0.0.1:7433/healthz");
    }
}
