//! The built-in HTTP executor: runs the tasks of `http` steps (command
//! [`HTTP_COMMAND`](starbridge_core::definition::HTTP_COMMAND)), whose input is the request the
//! server rendered.
//!
//! # What it does
//!
//! - Sends the request (`method`, `url`, `headers`, `body`: JSON, with `Content-Type:
//!   application/json` unless a header says otherwise, or a string sent as it is) within its
//!   `timeout_ms`.
//! - A status in `success` (default: any 2xx) completes the task with `{status, headers, body}`:
//!   the body parsed when the answer is JSON, else a string. A body larger than the server's task
//!   size limit fails the task for good.
//! - Connection errors, timeouts, 429 and 5xx are retryable failures (the step's `retry`
//!   applies, and a `Retry-After` longer than its backoff sets the next delay); other statuses
//!   fail the step for good, with the status and the start of the body in the error.
//! - A `202 Accepted` with a `Location` (unless `success` lists 202) is a long-running
//!   operation: the task checks back later (at `Retry-After`, else `poll_interval_ms`), holding no
//!   worker, with the absolute `Location` in its progress; each later claim GETs it, until an
//!   answer other than 202, judged as above. Errors while polling (connection, 429, 5xx) poll
//!   again rather than repeat the request. Polling gives up after `max_polling_ms` (set when the
//!   step has no `step_timeout`).
//!
//! # Trust
//!
//! - Destinations: the private-network policy (`DestinationPolicy::private_network`): loopback,
//!   unspecified, link-local, metadata and other host-local addresses are refused, checked on
//!   the URL's host, after DNS on every connection, and on a polled `Location`; `--http-allow`
//!   opens more. No redirect is followed (a 3xx is a final answer), no proxy is used.
//! - TLS is verified against the system's roots plus the worker's `--ca-cert`.
//! - Secrets ([`Secrets`]): the request's `secret_fields` point at the strings holding
//!   `${{ secrets.NAME }}` references; each is resolved from the worker's secrets file only for a
//!   host the file binds it to, else the task fails for good naming the secret. Headers holding a
//!   secret are sent to a polled `Location` only on the request's own origin. Every value used is
//!   replaced by `[secret NAME]` in the output, errors and progress reported.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use starbridge_api::client::shorten;
use starbridge_core::definition::{SecretPart, secret_parts};
use starbridge_core::destination::{DestinationPolicy, Verdict, http_url};
use starbridge_core::limits::DEFAULT_MAX_TASK_BYTES;
use starbridge_egress::{Refused, failure, guarded_client, refused_in};

use crate::context::TaskContext;
use crate::outcome::{BoxFuture, Handler, HandlerResult, Outcome};
use crate::secrets::{Redactor, SecretError, Secrets};

/// The worker flag that opens destinations the policy refuses by default.
pub const ALLOW_FLAG: &str = "--http-allow";
/// How much of an error answer's body is quoted in the failure.
const ERROR_BODY_BYTES: usize = 512;
/// The longest check-later the server takes (7 days).
const MAX_CHECK_LATER: Duration = Duration::from_secs(7 * 24 * 3600);

/// An `http` task's input: the request as the server rendered it.
#[derive(Debug, Deserialize)]
struct Request {
    method: String,
    url: String,
    #[serde(default)]
    headers: Map<String, Value>,
    #[serde(default)]
    body: Option<Value>,
    timeout_ms: u64,
    #[serde(default)]
    success: Option<Vec<u16>>,
    poll_interval_ms: u64,
    #[serde(default)]
    max_polling_ms: Option<u64>,
    #[serde(default)]
    secret_fields: Vec<String>,
}

/// A long-running operation being polled: the task's progress between claims.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Polling {
    /// The absolute URL the `202 Accepted` answer pointed at.
    location: String,
    /// When polling began (Unix milliseconds, the worker's clock).
    polling_since_ms: u64,
    /// Why the last poll got no answer, if it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_error: Option<String>,
}

/// Why an [`HttpExecutor`] cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum HttpExecutorError {
    #[error("the CA certificate holds no usable PEM certificate: {0}")]
    CaCertificate(String),
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// Runs `http` tasks; see the [module docs](self). Register it for the command `http` on every
/// queue: `builder.command(HTTP_COMMAND, HttpExecutor::new(…)?)`.
#[derive(Clone)]
pub struct HttpExecutor {
    client: reqwest::Client,
    policy: Arc<DestinationPolicy>,
    secrets: Arc<Secrets>,
}

impl HttpExecutor {
    /// An executor sending where `policy` allows (usually
    /// `DestinationPolicy::allowing(--http-allow)?.private_network()`), with `secrets`, trusting
    /// the system's roots and the certificates in `ca_pem`.
    pub fn new(
        policy: DestinationPolicy,
        secrets: Secrets,
        ca_pem: Option<&[u8]>,
    ) -> Result<HttpExecutor, HttpExecutorError> {
        let policy = Arc::new(policy);
        let mut builder = guarded_client(policy.clone());
        if let Some(pem) = ca_pem {
            let roots = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| HttpExecutorError::CaCertificate(e.to_string()))?;
            if roots.is_empty() {
                return Err(HttpExecutorError::CaCertificate(
                    "no PEM certificate found".to_owned(),
                ));
            }
            builder = builder.tls_certs_merge(roots);
        }
        Ok(HttpExecutor {
            client: builder.build()?,
            policy,
            secrets: Arc::new(secrets),
        })
    }

    /// Runs one `http` task to its outcome (or until the task is cancelled).
    pub async fn run(&self, task: TaskContext) -> HandlerResult {
        let request: Request = match serde_json::from_value(task.input().clone()) {
            Ok(request) => request,
            Err(error) => {
                return Outcome::fail_permanently(format!(
                    "the task's input is not an http step's request ({error}): is the `http` command used by hand?"
                ))
                .into();
            }
        };
        let mut redactor = Redactor::default();
        let outcome = tokio::select! {
            outcome = self.execute(&task, &request, &mut redactor) => outcome,
            () = task.cancelled() => Outcome::fail("cancelled before the answer came"),
        };
        redacted(outcome, &redactor).into()
    }

    async fn execute(
        &self,
        task: &TaskContext,
        request: &Request,
        redactor: &mut Redactor,
    ) -> Outcome {
        let origin = match http_url(&request.url) {
            Ok(url) => url,
            Err(message) => return Outcome::fail_permanently(format!("http.url: {message}")),
        };
        let Ok(method) = Method::from_bytes(request.method.as_bytes()) else {
            return Outcome::fail_permanently(format!(
                "http.method: '{}' is not a method",
                request.method
            ));
        };
        let host = origin.host_str().unwrap_or_default().to_owned();
        let filled = self
            .fill_secrets(request, &host, redactor)
            .and_then(|filled| Ok((header_map(&filled.headers)?, filled)));
        let (mut headers, filled) = match filled {
            Ok(filled) => filled,
            Err(message) => return Outcome::fail_permanently(message),
        };
        // The attempt's trace goes on to the service, unless the step sets the header itself.
        let traceparent = HeaderName::from_static("traceparent");
        if let Some(value) = task.traceparent()
            && !headers.contains_key(&traceparent)
            && let Ok(value) = HeaderValue::from_str(value)
        {
            headers.insert(traceparent, value);
        }
        let limit = task
            .max_output_bytes()
            .and_then(|bytes| usize::try_from(bytes).ok())
            .unwrap_or(DEFAULT_MAX_TASK_BYTES);
        let exchange = Exchange {
            request,
            timeout: Duration::from_millis(request.timeout_ms),
            interval: Duration::from_millis(request.poll_interval_ms),
            limit,
        };
        let polling = task
            .progress()
            .and_then(|progress| serde_json::from_value::<Polling>(progress.clone()).ok());
        match polling {
            None => {
                self.send(&exchange, method, origin, headers, filled.body)
                    .await
            }
            Some(polling) => {
                let headers = OriginHeaders {
                    origin: &origin,
                    headers,
                    secret_headers: &filled.secret_headers,
                };
                self.poll(&exchange, polling, headers).await
            }
        }
    }

    /// Sends the step's request and judges the answer.
    async fn send(
        &self,
        exchange: &Exchange<'_>,
        method: Method,
        url: Url,
        headers: HeaderMap,
        body: Option<Value>,
    ) -> Outcome {
        if let Err(refused) = self.check(&url) {
            return Outcome::fail_permanently(refused);
        }
        let what = format!("{method} {url}");
        let mut sending = self
            .client
            .request(method, url)
            .headers(headers)
            .timeout(exchange.timeout);
        sending = match body {
            None => sending,
            Some(Value::String(text)) => sending.body(text),
            Some(json) => {
                let typed = exchange
                    .request
                    .headers
                    .keys()
                    .any(|name| name.eq_ignore_ascii_case(CONTENT_TYPE.as_str()));
                let sending = sending.body(serde_json::to_vec(&json).unwrap_or_default());
                if typed {
                    sending
                } else {
                    sending.header(CONTENT_TYPE, "application/json")
                }
            }
        };
        match sending.send().await {
            Ok(answer) => self.judge(exchange, &what, answer, None).await,
            Err(error) => unanswered(&what, error),
        }
    }

    /// GETs a long-running operation's `Location`. A transient failure polls again rather than
    /// fail the attempt, which would send the request anew.
    async fn poll(
        &self,
        exchange: &Exchange<'_>,
        polling: Polling,
        headers: OriginHeaders<'_>,
    ) -> Outcome {
        if let Some(max) = exchange.request.max_polling_ms
            && unix_millis().saturating_sub(polling.polling_since_ms) >= max
        {
            return Outcome::fail_permanently(format!(
                "gave up polling {} after {}: still 202 Accepted (a step_timeout on the step bounds polling instead)",
                polling.location,
                starbridge_core::time::Duration::from_millis(max)
            ));
        }
        let location = match http_url(&polling.location) {
            Ok(url) => url,
            Err(message) => {
                return Outcome::fail_permanently(format!(
                    "the polled Location {}: {message}",
                    polling.location
                ));
            }
        };
        if let Err(refused) = self.check(&location) {
            return Outcome::fail_permanently(refused);
        }
        let headers = headers.for_url(&location);
        let what = format!("GET {location}");
        let answer = self
            .client
            .get(location)
            .headers(headers)
            .timeout(exchange.timeout)
            .send()
            .await;
        match answer {
            Ok(answer) if is_transient(answer.status()) => {
                let wait = retry_after(answer.headers()).unwrap_or(exchange.interval);
                let status = answer.status();
                let start = error_body(answer).await;
                let error = format!("{what} answered {status}{start}");
                poll_again(polling, wait, Some(error))
            }
            Ok(answer) => self.judge(exchange, &what, answer, Some(polling)).await,
            Err(error) if refused_in(&error).is_some() => unanswered(&what, error),
            Err(error) => {
                let error = format!("{what}: {}", failure(error));
                poll_again(polling, exchange.interval, Some(error))
            }
        }
    }

    /// The outcome an answer makes: poll a `202` with a `Location`, complete on a success
    /// status, retry a transient one, fail for good on the rest.
    async fn judge(
        &self,
        exchange: &Exchange<'_>,
        what: &str,
        answer: reqwest::Response,
        polling: Option<Polling>,
    ) -> Outcome {
        let status = answer.status();
        let listed = exchange.request.success.as_deref();
        if status == StatusCode::ACCEPTED && !listed.is_some_and(|codes| codes.contains(&202)) {
            let wait = retry_after(answer.headers()).unwrap_or(exchange.interval);
            let location = answer.headers().get(LOCATION).map(|location| {
                location
                    .to_str()
                    .ok()
                    .and_then(|text| answer.url().join(text).ok())
                    .filter(|url| matches!(url.scheme(), "http" | "https"))
            });
            match (location, polling) {
                (Some(Some(location)), polling) => {
                    let polling = Polling {
                        location: location.to_string(),
                        polling_since_ms: polling.map_or_else(unix_millis, |p| p.polling_since_ms),
                        last_error: None,
                    };
                    return poll_again(polling, wait, None);
                }
                (Some(None), _) => {
                    return Outcome::fail_permanently(format!(
                        "{what} answered 202 Accepted with a Location that is no http(s) URL"
                    ));
                }
                // Still running, at the Location polled so far.
                (None, Some(polling)) => return poll_again(polling, wait, None),
                (None, None) => {}
            }
        }
        let succeeded = match listed {
            Some(codes) => codes.contains(&status.as_u16()),
            None => status.is_success(),
        };
        if succeeded {
            return complete(what, answer, exchange.limit).await;
        }
        let wait = retry_after(answer.headers());
        let transient = is_transient(status);
        let redirect = if status.is_redirection() {
            " (redirects are not followed)"
        } else {
            ""
        };
        let start = error_body(answer).await;
        let message = format!("{what} answered {status}{redirect}{start}");
        if transient {
            Outcome::Fail {
                message,
                retryable: true,
                retry_after: wait,
            }
        } else {
            Outcome::fail_permanently(message)
        }
    }

    /// Refuses a URL whose host the policy refuses.
    fn check(&self, url: &Url) -> Result<(), String> {
        match self.policy.check_url(url) {
            Verdict::Refused(refusal) => Err(refused_message(&Refused {
                name: None,
                refusal,
            })),
            Verdict::Allowed | Verdict::Resolve => Ok(()),
        }
    }

    /// The request's headers and body with each secret reference filled in, for `host`.
    fn fill_secrets(
        &self,
        request: &Request,
        host: &str,
        redactor: &mut Redactor,
    ) -> Result<Filled, String> {
        let mut parts = json!({
            "headers": Value::Object(request.headers.clone()),
            "body": request.body.clone().unwrap_or(Value::Null),
        });
        let mut secret_headers = BTreeSet::new();
        for pointer in &request.secret_fields {
            let Some(Value::String(text)) = parts.pointer_mut(pointer) else {
                return Err(format!(
                    "the request's secret_fields names {pointer}, where it holds no text"
                ));
            };
            *text = fill(text, |name| {
                let value = self.secrets.value_for(name, host)?;
                redactor.note(name, &value);
                Ok(value)
            })?;
            if let Some(name) = pointer.strip_prefix("/headers/") {
                let name = name.replace("~1", "/").replace("~0", "~");
                secret_headers.insert(name.to_ascii_lowercase());
            }
        }
        let Value::Object(mut parts) = parts else {
            unreachable!("made as an object above")
        };
        let headers = match parts.remove("headers") {
            Some(Value::Object(headers)) => headers,
            _ => Map::new(),
        };
        let body = request.body.as_ref().and(parts.remove("body"));
        Ok(Filled {
            headers,
            body,
            secret_headers,
        })
    }
}

impl Handler for HttpExecutor {
    fn call(&self, task: TaskContext) -> BoxFuture<HandlerResult> {
        let executor = self.clone();
        Box::pin(async move { executor.run(task).await })
    }
}

/// What one run of a task sends with and how it judges the answers.
struct Exchange<'r> {
    request: &'r Request,
    timeout: Duration,
    interval: Duration,
    /// The largest output the server takes.
    limit: usize,
}

/// The request's headers, and which of them hold a secret, for requests beyond the first.
struct OriginHeaders<'r> {
    /// The request's own URL.
    origin: &'r Url,
    headers: HeaderMap,
    /// The (lowercase) names of the headers that hold a secret.
    secret_headers: &'r BTreeSet<String>,
}

impl OriginHeaders<'_> {
    /// The headers to send to `url`: those holding a secret only on the request's own origin.
    fn for_url(mut self, url: &Url) -> HeaderMap {
        if url.origin() != self.origin.origin() {
            for name in self.secret_headers {
                self.headers.remove(name.as_str());
            }
        }
        self.headers
    }
}

/// The request's parts with the secrets filled in.
struct Filled {
    headers: Map<String, Value>,
    body: Option<Value>,
    /// The (lowercase) names of the headers that hold a secret.
    secret_headers: BTreeSet<String>,
}

/// `text` with each `${{ secrets.NAME }}` replaced by `value_of(NAME)`.
fn fill(
    text: &str,
    mut value_of: impl FnMut(&str) -> Result<String, SecretError>,
) -> Result<String, String> {
    let parts = secret_parts(text).ok_or_else(|| {
        "a string named in secret_fields holds an expression that is no `${{ secrets.NAME }}`"
            .to_owned()
    })?;
    let mut out = String::with_capacity(text.len());
    for part in parts {
        match part {
            SecretPart::Text(text) => out.push_str(text),
            SecretPart::Secret(name) => {
                out.push_str(&value_of(name).map_err(|error| error.to_string())?);
            }
        }
    }
    Ok(out)
}

/// The headers to send; a value that is not text (or not valid in a header) fails the task.
/// Errors name the header, never its value, which may hold a secret.
fn header_map(headers: &Map<String, Value>) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let text = match value {
            Value::String(text) => text.clone(),
            Value::Null => continue,
            Value::Bool(_) | Value::Number(_) => value.to_string(),
            Value::Array(_) | Value::Object(_) => {
                return Err(format!(
                    "http.headers.{name} rendered to a list or mapping: a header's value is text"
                ));
            }
        };
        let name_ok = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("http.headers.{name}: not a valid header name"))?;
        let value = HeaderValue::from_str(&text).map_err(|_| {
            format!(
                "http.headers.{name}: the value holds characters a header may not (a line break?)"
            )
        })?;
        map.append(name_ok, value);
    }
    Ok(map)
}

/// Completes with `{status, headers, body}`, the body read up to the server's size limit.
async fn complete(what: &str, answer: reqwest::Response, limit: usize) -> Outcome {
    let status = answer.status().as_u16();
    let headers = response_headers(answer.headers());
    let json_answer = is_json(answer.headers());
    let bytes = match read_bounded(answer, limit).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            return Outcome::fail_permanently(format!(
                "{what} answered {status} with a body of more than {limit} bytes, the server's task size limit (max_task_bytes)"
            ));
        }
        Err(error) => {
            return Outcome::fail(format!(
                "{what} answered {status}, but its body could not be read: {}",
                failure(error)
            ));
        }
    };
    let body = if json_answer {
        if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        }
    } else {
        Value::String(String::from_utf8_lossy(&bytes).into_owned())
    };
    Outcome::Complete(json!({"status": status, "headers": headers, "body": body}))
}

/// The body, or `None` when it is longer than `limit` bytes (read no further).
async fn read_bounded(
    mut answer: reqwest::Response,
    limit: usize,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    let mut bytes = Vec::new();
    while let Some(chunk) = answer.chunk().await? {
        if bytes.len() + chunk.len() > limit {
            return Ok(None);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Some(bytes))
}

/// `": <the start of the body>"`, or nothing for an empty (or unreadable) body.
async fn error_body(answer: reqwest::Response) -> String {
    let mut bytes = Vec::new();
    let mut answer = answer;
    while let Ok(Some(chunk)) = answer.chunk().await {
        bytes.extend_from_slice(&chunk);
        if bytes.len() > ERROR_BODY_BYTES {
            break;
        }
    }
    let text = String::from_utf8_lossy(&bytes);
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!(": {}", shorten(text, ERROR_BODY_BYTES))
    }
}

/// The answer's headers as a mapping, repeated ones joined with ", ".
fn response_headers(headers: &HeaderMap) -> Map<String, Value> {
    let mut out = Map::new();
    for name in headers.keys() {
        let joined = headers
            .get_all(name)
            .iter()
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
            .collect::<Vec<_>>()
            .join(", ");
        out.insert(name.as_str().to_owned(), Value::String(joined));
    }
    out
}

/// Whether the answer is JSON (`application/json` or `…+json`).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(|value| {
            let essence = value
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            essence == "application/json" || essence.ends_with("+json")
        })
        .unwrap_or(false)
}

/// A status worth trying again: 429 and 5xx.
fn is_transient(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

/// The answer's `Retry-After` (seconds, or an HTTP date), as a delay from now.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let delay = match text.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => httpdate::parse_http_date(text)
            .ok()?
            .duration_since(SystemTime::now())
            .unwrap_or_default(),
    };
    Some(delay.min(MAX_CHECK_LATER))
}

/// The task checks back after `wait`, keeping what it polls in its progress.
fn poll_again(mut polling: Polling, wait: Duration, last_error: Option<String>) -> Outcome {
    polling.last_error = last_error;
    Outcome::CheckLater {
        after: wait.min(MAX_CHECK_LATER),
        progress: serde_json::to_value(&polling).ok(),
    }
}

/// The outcome of a request that got no answer: refused by the policy (for good), or a
/// retryable failure naming the cause.
fn unanswered(what: &str, error: reqwest::Error) -> Outcome {
    if let Some(refused) = refused_in(&error) {
        return Outcome::fail_permanently(refused_message(refused));
    }
    if error.is_timeout() {
        return Outcome::fail(format!("{what}: no answer within the request's timeout"));
    }
    Outcome::fail(format!("{what}: {}", failure(error)))
}

fn refused_message(refused: &Refused) -> String {
    format!("{refused} (not sent; the worker's {ALLOW_FLAG} opens it)")
}

/// `outcome` with every secret value the task used replaced.
fn redacted(outcome: Outcome, redactor: &Redactor) -> Outcome {
    match outcome {
        Outcome::Complete(output) => Outcome::Complete(redactor.json(output)),
        Outcome::Fail {
            message,
            retryable,
            retry_after,
        } => Outcome::Fail {
            message: redactor.text(&message),
            retryable,
            retry_after,
        },
        Outcome::CheckLater { after, progress } => Outcome::CheckLater {
            after,
            progress: progress.map(|progress| redactor.json(progress)),
        },
        other => other,
    }
}

fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_references_are_filled_in_place() {
        let filled = fill("Bearer ${{ secrets.A }}/${{secrets.B}}", |name| {
            Ok(format!("<{name}>"))
        });
        assert_eq!(filled.unwrap(), "Bearer <A>/<B>");
        let refused = fill("${{ secrets.A }}", |name| {
            Err(SecretError::Unknown {
                name: name.to_owned(),
            })
        });
        assert_eq!(
            refused.unwrap_err(),
            "secret A is not in this worker's secrets file (--secrets)"
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_static("7"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        assert_eq!(
            retry_after(&headers),
            Some(Duration::ZERO),
            "a past date is now"
        );
        headers.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn a_header_that_cannot_be_sent_is_named_without_its_value() {
        let headers = json!({"X-Token": "a\nb"});
        let Value::Object(headers) = headers else {
            unreachable!()
        };
        let error = header_map(&headers).unwrap_err();
        assert!(error.contains("http.headers.X-Token"), "{error}");
        assert!(!error.contains("a\nb"), "{error}");
    }
}
