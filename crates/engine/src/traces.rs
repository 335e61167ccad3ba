//! OpenTelemetry traces over OTLP (HTTP/protobuf), on when the server is given an endpoint
//! (`Engine::export_traces`). Spans are built from durable facts once they are final: a job's
//! span when the job ends, an attempt's span when the attempt ends (both under the trace stored
//! with the job at submit, `rows::jobs::set_trace`), an API request's span when it is answered.
//! The writer only notes what ended in a transaction (`ended`) and hands the notes over after
//! the commit without waiting (`SpanSink::send`, dropped when the queue is full); the export loop
//! (`run_export`) reads the stored trace ids and the attempt's claim time from the read pool,
//! and sends the spans in batches. When tracing is off, nothing of this runs or is stored.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};
use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{Event, EventKind, JobState};
use starbridge_core::time::Timestamp;
use starbridge_core::trace::{JobTrace, attempt_span_id, parse_traceparent};
use starbridge_store::reader::ReadPool;
use starbridge_store::rows;
use tokio::sync::mpsc;

use crate::Result;

/// Spans waiting for the export loop at most; more are dropped, never waited for.
const QUEUED_SPANS: usize = 16_384;
/// Spans sent in one OTLP request at most.
const EXPORT_BATCH: usize = 512;

/// A span whose work is over, as the engine or the server noted it.
#[derive(Debug, Clone)]
pub enum FinishedSpan {
    /// A job ended.
    Job {
        job: JobId,
        workflow: String,
        namespace: String,
        status: String,
        started: Timestamp,
        ended: Timestamp,
    },
    /// A task's attempt ended.
    Attempt {
        job: JobId,
        task: TaskId,
        step: String,
        queue: String,
        command: String,
        worker: Option<String>,
        attempt: u32,
        outcome: String,
        /// When the run this event ended was claimed (`claimed_at` in its detail).
        claimed: Option<Timestamp>,
        /// When the task first started: no attempt was claimed before it, and an attempt
        /// without a claim (a waiting step) starts there.
        fallback_start: Timestamp,
        ended: Timestamp,
    },
    /// An API request was answered.
    Request {
        method: String,
        /// The route's template (`/api/v1/jobs/{id}`), never the raw path.
        route: String,
        status: u16,
        /// The caller's `traceparent` header, if any.
        traceparent: Option<String>,
        started: SystemTime,
        ended: SystemTime,
    },
}

/// Where finished spans go: the export loop's queue. Sending never waits.
#[derive(Debug)]
pub struct SpanSink {
    sender: mpsc::Sender<FinishedSpan>,
    /// Set once a full queue dropped a span (said once in the log).
    dropped: AtomicBool,
}

impl SpanSink {
    pub fn send(&self, span: FinishedSpan) {
        if self.sender.try_send(span).is_err() && !self.dropped.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                queued = QUEUED_SPANS,
                "spans are dropped: the OTLP collector takes them slower than they end"
            );
        }
    }
}

/// A fresh trace for a job being submitted: the caller's trace (from its `traceparent`) or a
/// new one, and a new span id for the job.
pub(crate) fn fresh_trace(traceparent: Option<&str>) -> JobTrace {
    // A version 4 UUID holds 122 random bits; a span id takes its low 64 (62 of them random).
    let random = || uuid::Uuid::new_v4().as_u128();
    let parent = traceparent.and_then(parse_traceparent);
    JobTrace {
        trace_id: parent.map_or_else(|| random().max(1), |(id, _)| id),
        span_id: (random() as u64).max(1),
        parent_span_id: parent.map(|(_, span)| span),
    }
}

/// The span an event of a job's history ends, if any: a task's attempt (succeeded, failed,
/// cancelled, requeued) or the job itself.
pub(crate) fn ended(state: &JobState, event: &Event) -> Option<FinishedSpan> {
    let job = &state.job;
    match event.kind {
        EventKind::JobSucceeded
        | EventKind::JobFailed
        | EventKind::JobCompensationFailed
        | EventKind::JobCancelled => Some(FinishedSpan::Job {
            job: job.id.clone(),
            workflow: job.workflow.clone(),
            namespace: job.namespace.clone(),
            status: job.status.to_string(),
            started: job.created_at,
            ended: event.at,
        }),
        EventKind::TaskSucceeded
        | EventKind::TaskFailed
        | EventKind::TaskCancelled
        | EventKind::TaskRequeued => {
            let task = state.task(event.task.as_ref()?)?;
            Some(FinishedSpan::Attempt {
                job: job.id.clone(),
                task: task.id.clone(),
                step: task.step.clone(),
                queue: task.queue.clone(),
                command: task.command.clone(),
                worker: event.worker.clone(),
                attempt: event.attempt?,
                outcome: event.kind.as_str().trim_start_matches("task_").to_owned(),
                claimed: event.detail["claimed_at"].as_i64().map(Timestamp),
                fallback_start: task.started_at.unwrap_or(event.at),
                ended: event.at,
            })
        }
        _ => None,
    }
}

/// The OTLP HTTP client: the workspace's reqwest client behind opentelemetry's `HttpClient`.
#[derive(Debug)]
struct OtlpClient(reqwest::Client);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for OtlpClient {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<bytes::Bytes>,
    ) -> std::result::Result<
        opentelemetry_http::Response<bytes::Bytes>,
        opentelemetry_http::HttpError,
    > {
        let (parts, body) = request.into_parts();
        let mut sent = self
            .0
            .request(parts.method, parts.uri.to_string())
            .body(body);
        for (name, value) in &parts.headers {
            sent = sent.header(name, value);
        }
        let answer = sent.send().await?;
        let mut response = opentelemetry_http::Response::builder().status(answer.status().as_u16());
        for (name, value) in answer.headers() {
            response = response.header(name.as_str(), value.as_bytes());
        }
        Ok(response.body(answer.bytes().await?)?)
    }
}

/// The OTLP traces URL of an endpoint: `/v1/traces` under it, as `OTEL_EXPORTER_OTLP_ENDPOINT`
/// is read.
pub fn traces_url(endpoint: &str) -> String {
    format!("{}/v1/traces", endpoint.trim_end_matches('/'))
}

/// An OTLP endpoint the exporter cannot send to.
#[derive(Debug, thiserror::Error)]
#[error("--otlp-endpoint: {0}")]
pub struct ExporterError(String);

/// Starts exporting to `endpoint` (an OTLP/HTTP base URL): returns the sink spans go to. Must
/// run inside a Tokio runtime.
pub(crate) fn start(
    endpoint: &str,
    reader: Arc<ReadPool>,
) -> std::result::Result<Arc<SpanSink>, ExporterError> {
    match reqwest::Url::parse(endpoint) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.has_host() => {}
        _ => {
            return Err(ExporterError(format!(
                "'{endpoint}' is not an http:// or https:// URL with a host"
            )));
        }
    }
    // An error only means a provider is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // The endpoint is the operator's own collector: no destination policy, as for webhooks.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .user_agent(concat!("starbridge/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|error| ExporterError(error.to_string()))?;
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(OtlpClient(client))
        .with_endpoint(traces_url(endpoint))
        .build()
        .map_err(|error| ExporterError(error.to_string()))?;
    exporter.set_resource(&Resource::builder().with_service_name("starbridge").build());
    let (sender, receiver) = mpsc::channel(QUEUED_SPANS);
    tokio::spawn(run_export(receiver, reader, exporter));
    Ok(Arc::new(SpanSink {
        sender,
        dropped: AtomicBool::new(false),
    }))
}

/// The export loop: takes what is queued (up to a batch), builds the spans and sends them.
async fn run_export(
    mut receiver: mpsc::Receiver<FinishedSpan>,
    reader: Arc<ReadPool>,
    exporter: opentelemetry_otlp::SpanExporter,
) {
    let scope = InstrumentationScope::builder("starbridge")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    let mut finished = Vec::with_capacity(EXPORT_BATCH);
    while receiver.recv_many(&mut finished, EXPORT_BATCH).await > 0 {
        let mut batch = Vec::with_capacity(finished.len());
        for span in finished.drain(..) {
            match span_data(span, &reader, &scope).await {
                Ok(Some(data)) => batch.push(data),
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "reading a span's trace failed"),
            }
        }
        if !batch.is_empty()
            && let Err(error) = exporter.export(batch).await
        {
            tracing::warn!(%error, "exporting spans over OTLP failed");
        }
    }
}

fn time_of(at: Timestamp) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(at.0).unwrap_or(0))
}

fn text(key: &'static str, value: impl Into<String>) -> KeyValue {
    KeyValue::new(key, value.into())
}

/// A span's facts once its trace is known, before they become OTLP's `SpanData`.
struct Facts {
    trace_id: u128,
    span_id: u64,
    parent: Option<u64>,
    kind: SpanKind,
    name: String,
    start: SystemTime,
    end: SystemTime,
    attributes: Vec<KeyValue>,
    failed: bool,
}

impl Facts {
    fn into_span(self, scope: &InstrumentationScope) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(self.trace_id),
                SpanId::from(self.span_id),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: self.parent.map_or(SpanId::INVALID, SpanId::from),
            parent_span_is_remote: false,
            span_kind: self.kind,
            name: Cow::Owned(self.name),
            start_time: self.start,
            end_time: self.end.max(self.start),
            attributes: self.attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: if self.failed {
                Status::Error {
                    description: Cow::Borrowed(""),
                }
            } else {
                Status::Ok
            },
            instrumentation_scope: scope.clone(),
        }
    }
}

/// The OTLP span of a finished one; `None` for a job or attempt without a stored trace (a job
/// submitted while tracing was off).
async fn span_data(
    span: FinishedSpan,
    reader: &Arc<ReadPool>,
    scope: &InstrumentationScope,
) -> Result<Option<SpanData>> {
    let facts = match span {
        FinishedSpan::Job {
            job,
            workflow,
            namespace,
            status,
            started,
            ended,
        } => {
            let Some(trace) = job_trace(reader, &job).await? else {
                return Ok(None);
            };
            Facts {
                trace_id: trace.trace_id,
                span_id: trace.span_id,
                parent: trace.parent_span_id,
                kind: SpanKind::Internal,
                name: format!("job {workflow}"),
                start: time_of(started),
                end: time_of(ended),
                failed: status != "succeeded",
                attributes: vec![
                    text("starbridge.job.id", job.as_str()),
                    text("starbridge.workflow", workflow),
                    text("starbridge.namespace", namespace),
                    text("starbridge.job.status", status),
                ],
            }
        }
        FinishedSpan::Attempt {
            job,
            task,
            step,
            queue,
            command,
            worker,
            attempt,
            outcome,
            claimed,
            fallback_start,
            ended,
        } => {
            // The job's trace and the attempt's claim, in one read.
            let (read_job, read_task) = (job.clone(), task.clone());
            let (trace, first_claimed) = reader
                .read(move |conn| {
                    let Some(trace) = rows::trace_of(conn, &read_job)? else {
                        return Ok((None, None));
                    };
                    let within = (fallback_start, ended);
                    let first = rows::attempt_first_claimed_at(
                        conn, &read_job, &read_task, attempt, within,
                    )?;
                    Ok((Some(trace), first))
                })
                .await?;
            let Some(trace) = trace else {
                return Ok(None);
            };
            let mut attributes = vec![
                text("starbridge.job.id", job.as_str()),
                text("starbridge.task.id", task.as_str()),
                text("starbridge.step", step.clone()),
                text("starbridge.queue", queue),
                text("starbridge.command", command),
                KeyValue::new("starbridge.attempt", i64::from(attempt)),
                text("starbridge.outcome", outcome.clone()),
            ];
            if let Some(worker) = worker {
                attributes.push(text("starbridge.worker", worker));
            }
            Facts {
                trace_id: trace.trace_id,
                span_id: attempt_span_id(task.as_str(), attempt),
                parent: Some(trace.span_id),
                kind: SpanKind::Internal,
                name: format!("task {step} attempt {attempt}"),
                start: time_of(
                    [first_claimed, claimed]
                        .into_iter()
                        .flatten()
                        .min()
                        .unwrap_or(fallback_start),
                ),
                end: time_of(ended),
                failed: outcome != "succeeded",
                attributes,
            }
        }
        FinishedSpan::Request {
            method,
            route,
            status,
            traceparent,
            started,
            ended,
        } => {
            let caller = traceparent.as_deref().and_then(parse_traceparent);
            let fresh = fresh_trace(None);
            Facts {
                trace_id: caller.map_or(fresh.trace_id, |(trace, _)| trace),
                span_id: fresh.span_id,
                parent: caller.map(|(_, span)| span),
                kind: SpanKind::Server,
                name: format!("{method} {route}"),
                start: started,
                end: ended,
                failed: status >= 500,
                attributes: vec![
                    text("http.request.method", method),
                    text("http.route", route),
                    KeyValue::new("http.response.status_code", i64::from(status)),
                ],
            }
        }
    };
    Ok(Some(facts.into_span(scope)))
}

/// The trace stored with a job, read from the read pool.
async fn job_trace(reader: &Arc<ReadPool>, job: &JobId) -> Result<Option<JobTrace>> {
    let job = job.clone();
    reader.read(move |conn| rows::trace_of(conn, &job)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_continues_the_submitters_trace_under_a_span_of_its_own() {
        let trace = fresh_trace(Some(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ));
        assert_eq!(trace.trace_id, 0x0af7651916cd43dd8448eb211c80319c);
        assert_eq!(trace.parent_span_id, Some(0xb7ad6b7169203331));
        assert_ne!(trace.span_id, 0xb7ad6b7169203331);
    }

    #[test]
    fn a_job_without_a_usable_traceparent_starts_a_trace() {
        let first = fresh_trace(None);
        let second = fresh_trace(Some("not a traceparent"));
        assert_eq!((first.parent_span_id, second.parent_span_id), (None, None));
        assert_ne!(first.trace_id, second.trace_id);
        assert!(first.trace_id != 0 && first.span_id != 0);
    }

    #[tokio::test]
    async fn an_endpoint_that_is_not_an_http_url_is_refused() {
        let reader = Arc::new(ReadPool::new(
            Arc::new(|| Err(starbridge_store::Error::Closed)),
            1,
        ));
        for endpoint in ["collector:4318", "ftp://collector", "http://"] {
            let error = start(endpoint, reader.clone()).unwrap_err();
            assert!(
                error.to_string().starts_with("--otlp-endpoint: '"),
                "{error}"
            );
        }
        assert!(start("http://127.0.0.1:4318", reader).is_ok());
    }

    #[test]
    fn spans_go_to_v1_traces_under_the_endpoint() {
        assert_eq!(
            traces_url("http://collector:4318/"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/otlp"),
            "http://collector:4318/otlp/v1/traces"
        );
    }
}
