//! The typed HTTP client of the Starbridge API, used by the CLI, the worker SDK and the bench.
//!
//! [`Client`] has one method per API operation, each taking and returning the wire types of this
//! crate and building its path from [`crate::paths`]. Every non-2xx answer becomes an [`Error`]
//! that keeps the server's problem document and tells a caller whether trying again can help
//! ([`Error::is_retryable`]). HTTPS goes through rustls with the `ring` provider.

pub use starbridge_core::text::shorten;
use std::fmt;
use std::time::Duration;

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::paths::{self, CallbackRoute, JobAction, TaskReport};
use crate::{
    ActionRequest, AppliedWorkflow, ApprovalList, AuditList, AwaitCallbackRequest, BulkAction,
    BulkRequest, BulkResult, CallbackAnswer, CancelRequest, CheckLaterRequest, CompleteRequest,
    CompleteTasks, CompleteTasksResponse, CreateTokenRequest, CreatedToken, DecisionRequest,
    DeliveryList, EventList, FailRequest, FailTaskRequest, Health, HeartbeatRequest,
    HeartbeatResponse, JobList, JobListQuery, JobView, MinuteStats, MinuteStatsQuery, Open,
    PollRequest, PollResponse, Problem, QueueList, QueueListQuery, QueuePrefixView, QueueSettings,
    QueueView, ReportResponse, RequeueRequest, RerunRequest, ScheduleList, ScheduleRequest,
    ScheduleView, SignalAccepted, SignalRequest, SkipRequest, SubmitJob, SubmitJobs,
    SubmitJobsResponse, TokenList, WebhookList, WebhookRequest, WebhookView, WorkflowDetail,
    WorkflowList,
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

/// Sent with every request; the name is the SDK's, which first sent it.
const USER_AGENT: &str = concat!("starbridge-worker/", env!("CARGO_PKG_VERSION"));

/// The content type of a workflow definition's text (YAML, of which JSON is a subset).
const YAML: &str = "application/yaml";

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
    pub fn surely_not_delivered(&self) -> bool {
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

/// A client of one Starbridge server.
///
/// Cheap to clone (the connection pool is shared). The token, when set, is sent as
/// `Authorization: Bearer <token>` on every request; callers decide where it comes from
/// (a flag, an environment variable, …). The namespace, when set, is sent as `?namespace=` with
/// every request about workflows, jobs, queues, schedules, webhooks, tokens and the audit log
/// (a worker's poll names its namespace in its body instead).
#[derive(Clone)]
pub struct Client {
    /// The server's root URL, parsed once: each request's URL is a copy with its path set,
    /// without parsing the scheme and host again.
    root: reqwest::Url,
    /// The root's path prefix without a trailing `/` (empty for a server at the host's root).
    prefix: String,
    /// Bearer token sent with every request, if any.
    pub token: Option<String>,
    /// Who is acting, sent as the `Starbridge-Actor` header and recorded with operator actions.
    pub actor: Option<String>,
    /// The namespace of the requests that have one; the server's `default` when absent.
    pub namespace: Option<String>,
    http: reqwest::Client,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base_url", &self.base_url())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("namespace", &self.namespace)
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
            .user_agent(USER_AGENT)
            .build()
            .map_err(Error::Transport)?;
        let prefix = parsed.path().trim_end_matches('/').to_owned();
        Ok(Client {
            root: parsed,
            prefix,
            token: None,
            actor: None,
            namespace: None,
            http,
        })
    }

    /// The server's root URL, e.g. `http://127.0.0.1:7433` (without `/api/v1`).
    pub fn base_url(&self) -> &str {
        self.root.as_str().trim_end_matches('/')
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

    /// Sets (or clears) the namespace of the requests that have one.
    pub fn with_namespace(mut self, namespace: Option<String>) -> Self {
        self.namespace = namespace;
        self
    }

    /// `GET` [`paths::HEALTH`]: whether the server reads and writes its database. An unhealthy
    /// server answers `503`: [`Error::Server`] with what the answer rests on.
    pub async fn health(&self) -> Result<Health, Error> {
        self.send(self.request(Method::GET, paths::HEALTH)).await
    }

    /// `GET` [`paths::METRICS`]: the Prometheus text.
    pub async fn metrics(&self) -> Result<String, Error> {
        let (_, body) = answer(self.request(Method::GET, paths::METRICS)).await?;
        Ok(String::from_utf8_lossy(body.as_ref()).into_owned())
    }

    /// `PUT` [`paths::WORKFLOW`]: applies a definition's text (YAML or JSON); a changed
    /// body makes a new version.
    pub async fn apply_workflow(
        &self,
        name: &str,
        definition: &str,
    ) -> Result<AppliedWorkflow, Error> {
        let builder = self
            .namespaced(Method::PUT, &paths::workflow(name))
            .header(CONTENT_TYPE, YAML)
            .body(definition.to_owned());
        self.send(builder).await
    }

    /// `GET` [`paths::WORKFLOW`]: the latest version with its definition.
    pub async fn workflow(&self, name: &str) -> Result<WorkflowDetail, Error> {
        self.get(&paths::workflow(name)).await
    }

    /// `DELETE` [`paths::WORKFLOW`]: hides the workflow (refused while anything could run it).
    pub async fn delete_workflow(&self, name: &str) -> Result<(), Error> {
        self.delete(&paths::workflow(name)).await
    }

    /// `GET` [`paths::WORKFLOWS`].
    pub async fn workflows(&self) -> Result<WorkflowList, Error> {
        self.get(paths::WORKFLOWS).await
    }

    /// `POST` [`paths::JOBS`]: a new job, or the existing one with the same `key`.
    pub async fn submit(&self, request: &SubmitJob) -> Result<JobView, Error> {
        self.post(paths::JOBS, request).await
    }

    /// `POST` [`paths::JOBS`], reading only the job's id from the answer: for a caller that needs
    /// nothing else, such as a load generator, which would otherwise spend its CPU decoding the
    /// job's tasks.
    pub async fn submit_for_id(&self, request: &SubmitJob) -> Result<String, Error> {
        #[derive(serde::Deserialize)]
        struct Created {
            id: String,
        }
        let created: Created = self.post(paths::JOBS, request).await?;
        Ok(created.id)
    }

    /// `POST` [`paths::JOBS_BATCH`]: one item per job, its result or its problem (see
    /// [`Error::from_problem`]).
    pub async fn submit_batch(&self, request: &SubmitJobs) -> Result<SubmitJobsResponse, Error> {
        self.post(paths::JOBS_BATCH, request).await
    }

    /// `GET` [`paths::JOB`]: the job with its tasks.
    pub async fn job(&self, id: &str) -> Result<JobView, Error> {
        self.get(&paths::job(id)).await
    }

    /// `GET` [`paths::JOBS`]: a page of jobs (the client's namespace unless `query` names one),
    /// with one `label` parameter per label selector.
    pub async fn jobs(&self, query: &JobListQuery) -> Result<JobList, Error> {
        let query = JobListQuery {
            namespace: query.namespace.clone().or_else(|| self.namespace.clone()),
            ..query.clone()
        };
        let labels: Vec<(&str, &str)> =
            query.labels.iter().map(|l| ("label", l.as_str())).collect();
        let builder = self
            .request(Method::GET, paths::JOBS)
            .query(&query)
            .query(&labels);
        self.send(builder).await
    }

    /// `GET` [`paths::JOB_EVENTS`]: the job's history.
    pub async fn events(&self, id: &str) -> Result<EventList, Error> {
        self.get(&paths::job_events(id)).await
    }

    /// `DELETE` [`paths::JOB`]: a finished job with its tasks and history.
    pub async fn delete_job(&self, id: &str) -> Result<(), Error> {
        self.delete(&paths::job(id)).await
    }

    /// `POST` [`paths::JOB_PAUSE`]: nothing new is dispatched; running tasks finish.
    pub async fn pause_job(&self, id: &str, request: &ActionRequest) -> Result<JobView, Error> {
        self.post(&paths::job_action(id, JobAction::Pause), request)
            .await
    }

    /// `POST` [`paths::JOB_RESUME`]: a paused job runs on.
    pub async fn resume_job(&self, id: &str, request: &ActionRequest) -> Result<JobView, Error> {
        self.post(&paths::job_action(id, JobAction::Resume), request)
            .await
    }

    /// `POST` [`paths::JOB_CANCEL`]: ends the job, optionally undoing its finished steps first.
    pub async fn cancel_job(&self, id: &str, request: &CancelRequest) -> Result<JobView, Error> {
        self.post(&paths::job_action(id, JobAction::Cancel), request)
            .await
    }

    /// `POST` [`paths::JOB_RETRY`]: continues a failed job from its failed tasks.
    pub async fn retry_job(&self, id: &str, request: &ActionRequest) -> Result<JobView, Error> {
        self.post(&paths::job_action(id, JobAction::Retry), request)
            .await
    }

    /// `POST` [`paths::JOB_RERUN`]: runs a step of a finished job again, with everything
    /// downstream of it.
    pub async fn rerun_job(&self, id: &str, request: &RerunRequest) -> Result<JobView, Error> {
        self.post(&paths::job_action(id, JobAction::Rerun), request)
            .await
    }

    /// `POST` [`paths::JOB_TASK_SKIP`]: marks a task succeeded with the given output.
    pub async fn skip_task(
        &self,
        job_id: &str,
        task_id: &str,
        request: &SkipRequest,
    ) -> Result<JobView, Error> {
        self.post(&paths::job_task_skip(job_id, task_id), request)
            .await
    }

    /// `POST` [`paths::JOB_TASK_REQUEUE`]: revokes a running task's lease and runs it again.
    pub async fn requeue_task(
        &self,
        job_id: &str,
        task_id: &str,
        request: &RequeueRequest,
    ) -> Result<JobView, Error> {
        self.post(&paths::job_task_requeue(job_id, task_id), request)
            .await
    }

    /// `POST` [`paths::JOB_TASK_FAIL`]: fails a task for good.
    pub async fn fail_task(
        &self,
        job_id: &str,
        task_id: &str,
        request: &FailTaskRequest,
    ) -> Result<JobView, Error> {
        self.post(&paths::job_task_fail(job_id, task_id), request)
            .await
    }

    /// `POST` [`paths::JOB_SIGNAL`]: sends signal `name` to the job.
    pub async fn signal(
        &self,
        job_id: &str,
        name: &str,
        request: &SignalRequest,
    ) -> Result<SignalAccepted, Error> {
        self.post(&paths::job_signal(job_id, name), request).await
    }

    /// `GET` [`paths::APPROVALS`]: tasks waiting for approval, oldest first.
    pub async fn approvals(&self) -> Result<ApprovalList, Error> {
        self.get(paths::APPROVALS).await
    }

    /// `POST` [`paths::JOB_TASK_APPROVE`] (`approve`) or [`paths::JOB_TASK_REJECT`]: decides
    /// an approval step.
    pub async fn decide(
        &self,
        job_id: &str,
        task_id: &str,
        approve: bool,
        request: &DecisionRequest,
    ) -> Result<JobView, Error> {
        self.post(&paths::job_task_decision(job_id, task_id, approve), request)
            .await
    }

    /// `POST` [`paths::CALLBACK_COMPLETE`], [`paths::CALLBACK_FAIL`] or
    /// [`paths::CALLBACK_HEARTBEAT`] through a callback token: needs no API token.
    pub async fn callback<B: Serialize + ?Sized>(
        &self,
        token: &str,
        call: CallbackRoute,
        request: &B,
    ) -> Result<CallbackAnswer, Error> {
        let builder = self
            .request(Method::POST, &paths::callback(token, call))
            .json(request);
        self.send(builder).await
    }

    /// `POST` [`paths::JOBS_BULK`]: `pause`, `resume`, `cancel` or `retry` every job the
    /// request selects.
    pub async fn bulk(
        &self,
        action: &Open<BulkAction>,
        request: &BulkRequest,
    ) -> Result<BulkResult, Error> {
        self.post(&paths::jobs_bulk(action), request).await
    }

    /// `GET` [`paths::QUEUES`]: a page of queues (the client's namespace unless `query` names
    /// one) and every prefix setting.
    pub async fn queues(&self, query: &QueueListQuery) -> Result<QueueList, Error> {
        let query = QueueListQuery {
            namespace: query.namespace.clone().or_else(|| self.namespace.clone()),
            ..query.clone()
        };
        let builder = self.request(Method::GET, paths::QUEUES).query(&query);
        self.send(builder).await
    }

    /// `PUT` [`paths::QUEUE`] of a queue's name: changes the settings given, which become the
    /// queue's own.
    pub async fn set_queue(
        &self,
        name: &str,
        settings: &QueueSettings,
    ) -> Result<QueueView, Error> {
        self.put(&paths::queue(name), settings).await
    }

    /// `PUT` [`paths::QUEUE`] of a pattern (`agent-*`): changes the settings given to the
    /// queues whose names start with its prefix.
    pub async fn set_queue_prefix(
        &self,
        pattern: &str,
        settings: &QueueSettings,
    ) -> Result<QueuePrefixView, Error> {
        self.put(&paths::queue(pattern), settings).await
    }

    /// `DELETE` [`paths::QUEUE`]: drops the settings of a pattern, or a queue's own settings.
    pub async fn drop_queue_settings(&self, name: &str) -> Result<(), Error> {
        self.delete(&paths::queue(name)).await
    }

    /// `POST` [`paths::QUEUE_PAUSE`]: the queue keeps its tasks but hands none out.
    pub async fn pause_queue(&self, name: &str) -> Result<QueueView, Error> {
        self.post(&paths::queue_pausing(name, true), &json!({}))
            .await
    }

    /// `POST` [`paths::QUEUE_RESUME`]: the queue hands out tasks again.
    pub async fn resume_queue(&self, name: &str) -> Result<QueueView, Error> {
        self.post(&paths::queue_pausing(name, false), &json!({}))
            .await
    }

    /// `GET` [`paths::SCHEDULES`].
    pub async fn schedules(&self) -> Result<ScheduleList, Error> {
        self.get(paths::SCHEDULES).await
    }

    /// `GET` [`paths::SCHEDULE`]: the schedule and its next fire times.
    pub async fn schedule(&self, name: &str) -> Result<ScheduleView, Error> {
        self.get(&paths::schedule(name)).await
    }

    /// `PUT` [`paths::SCHEDULE`]: creates or replaces a schedule.
    pub async fn set_schedule(
        &self,
        name: &str,
        request: &ScheduleRequest,
    ) -> Result<ScheduleView, Error> {
        self.put(&paths::schedule(name), request).await
    }

    /// `POST` [`paths::SCHEDULE_PAUSE`]: the schedule stops firing.
    pub async fn pause_schedule(&self, name: &str) -> Result<ScheduleView, Error> {
        self.post(&paths::schedule_pausing(name, true), &json!({}))
            .await
    }

    /// `POST` [`paths::SCHEDULE_RESUME`]: the schedule fires again.
    pub async fn resume_schedule(&self, name: &str) -> Result<ScheduleView, Error> {
        self.post(&paths::schedule_pausing(name, false), &json!({}))
            .await
    }

    /// `DELETE` [`paths::SCHEDULE`].
    pub async fn delete_schedule(&self, name: &str) -> Result<(), Error> {
        self.delete(&paths::schedule(name)).await
    }

    /// `GET` [`paths::WEBHOOKS`].
    pub async fn webhooks(&self) -> Result<WebhookList, Error> {
        self.get(paths::WEBHOOKS).await
    }

    /// `POST` [`paths::WEBHOOKS`]: the new subscription, with its signing secret (shown once).
    pub async fn add_webhook(&self, request: &WebhookRequest) -> Result<WebhookView, Error> {
        self.post(paths::WEBHOOKS, request).await
    }

    /// `DELETE` [`paths::WEBHOOK`].
    pub async fn delete_webhook(&self, id: &str) -> Result<(), Error> {
        self.delete(&paths::webhook(id)).await
    }

    /// `GET` [`paths::WEBHOOK_DELIVERIES`]: the latest `limit` deliveries, newest first.
    pub async fn webhook_deliveries(
        &self,
        id: &str,
        limit: Option<u32>,
    ) -> Result<DeliveryList, Error> {
        let builder = self
            .namespaced(Method::GET, &paths::webhook_deliveries(id))
            .query(&[("limit", limit)]);
        self.send(builder).await
    }

    /// `GET` [`paths::TOKENS`].
    pub async fn tokens(&self) -> Result<TokenList, Error> {
        self.get(paths::TOKENS).await
    }

    /// `POST` [`paths::TOKENS`]: the new token with its secret (shown once).
    pub async fn create_token(&self, request: &CreateTokenRequest) -> Result<CreatedToken, Error> {
        self.post(paths::TOKENS, request).await
    }

    /// `DELETE` [`paths::TOKEN`].
    pub async fn revoke_token(&self, id: &str) -> Result<(), Error> {
        self.delete(&paths::token(id)).await
    }

    /// `GET` [`paths::AUDIT`]: up to `limit` entries before the sequence number `before` (the
    /// `next_cursor` of the previous page), newest first.
    pub async fn audit(&self, before: Option<i64>, limit: Option<u32>) -> Result<AuditList, Error> {
        let builder = self
            .namespaced(Method::GET, paths::AUDIT)
            .query(&[("limit", limit)])
            .query(&[("before", before)]);
        self.send(builder).await
    }

    /// `GET` [`paths::STATS_MINUTES`]: the dashboard's per-minute figures over a window.
    pub async fn minute_stats(&self, query: &MinuteStatsQuery) -> Result<MinuteStats, Error> {
        let builder = self
            .namespaced(Method::GET, paths::STATS_MINUTES)
            .query(&[("window", &query.window)])
            .query(&[("workflow", &query.workflow)])
            .query(&[("queue", &query.queue)]);
        self.send(builder).await
    }

    /// `POST` [`paths::TASKS_POLL`]: leases up to `max_tasks` tasks, the server holding the
    /// request up to `wait_ms` while none is ready.
    pub async fn poll(&self, request: &PollRequest) -> Result<PollResponse, Error> {
        let wait = Duration::from_millis(request.wait_ms.unwrap_or(0));
        let builder = self
            .request(Method::POST, paths::TASKS_POLL)
            .timeout(wait.saturating_add(POLL_TIMEOUT_MARGIN))
            .json(request);
        self.send(builder).await
    }

    /// `POST` [`paths::TASK_HEARTBEAT`]: extends the lease. [`Error::Conflict`] means the lease
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
    pub async fn heartbeat_within(
        &self,
        task_id: &str,
        request: &HeartbeatRequest,
        timeout: Duration,
    ) -> Result<HeartbeatResponse, Error> {
        let path = paths::task_report(task_id, TaskReport::Heartbeat);
        let builder = self
            .request(Method::POST, &path)
            .timeout(timeout)
            .json(request);
        self.send(builder).await
    }

    /// `POST` [`paths::TASK_COMPLETE`]: the attempt succeeded with this output.
    pub async fn complete(
        &self,
        task_id: &str,
        request: &CompleteRequest,
    ) -> Result<ReportResponse, Error> {
        self.report(task_id, TaskReport::Complete, request).await
    }

    /// `POST` [`paths::TASKS_COMPLETE`]: many successes in one request; the answer has one item
    /// per task, its result or its problem (see [`Error::from_problem`]).
    pub async fn complete_many(
        &self,
        request: &CompleteTasks,
    ) -> Result<CompleteTasksResponse, Error> {
        let builder = self
            .request(Method::POST, paths::TASKS_COMPLETE)
            .json(request);
        self.send(builder).await
    }

    /// `POST` [`paths::TASK_FAIL`]: the attempt failed (retryable or not).
    pub async fn fail(
        &self,
        task_id: &str,
        request: &FailRequest,
    ) -> Result<ReportResponse, Error> {
        self.report(task_id, TaskReport::Fail, request).await
    }

    /// `POST` [`paths::TASK_CHECK_LATER`]: not done yet; the task is ready again after
    /// `after_ms`, without using an attempt.
    pub async fn check_later(
        &self,
        task_id: &str,
        request: &CheckLaterRequest,
    ) -> Result<ReportResponse, Error> {
        self.report(task_id, TaskReport::CheckLater, request).await
    }

    /// `POST` [`paths::TASK_AWAIT_CALLBACK`]: the attempt was handed to another system, which
    /// finishes it through the task's callback token; the lease is released.
    pub async fn await_callback(
        &self,
        task_id: &str,
        request: &AwaitCallbackRequest,
    ) -> Result<ReportResponse, Error> {
        self.report(task_id, TaskReport::AwaitCallback, request)
            .await
    }

    /// Sends a worker's report on a task (not namespaced: the task id says it all).
    async fn report<B: Serialize>(
        &self,
        task_id: &str,
        report: TaskReport,
        request: &B,
    ) -> Result<ReportResponse, Error> {
        let builder = self
            .request(Method::POST, &paths::task_report(task_id, report))
            .json(request);
        self.send(builder).await
    }

    /// `GET path` in the client's namespace.
    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        self.send(self.namespaced(Method::GET, path)).await
    }

    /// `POST path` with a JSON body, in the client's namespace.
    async fn post<B, T>(&self, path: &str, body: &B) -> Result<T, Error>
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned,
    {
        self.send(self.namespaced(Method::POST, path).json(body))
            .await
    }

    /// `PUT path` with a JSON body, in the client's namespace.
    async fn put<B, T>(&self, path: &str, body: &B) -> Result<T, Error>
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned,
    {
        self.send(self.namespaced(Method::PUT, path).json(body))
            .await
    }

    /// `DELETE path` in the client's namespace; any 2xx answer (usually 204 with no body) is
    /// success.
    async fn delete(&self, path: &str) -> Result<(), Error> {
        let builder = self.namespaced(Method::DELETE, path);
        self.send::<Value>(builder).await.map(|_| ())
    }

    /// A request to `path` (from the server root) with the client's namespace as `?namespace=`.
    fn namespaced(&self, method: Method, path: &str) -> RequestBuilder {
        let builder = self.request(method, path);
        match &self.namespace {
            Some(namespace) => builder.query(&[("namespace", namespace)]),
            None => builder,
        }
    }

    /// A request to `path` (from the server root) with the client's headers.
    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let mut url = self.root.clone();
        url.set_path(&format!("{}{path}", self.prefix));
        let builder = self
            .http
            .request(method, url)
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

    /// Sends a request and decodes its 2xx answer's JSON body.
    async fn send<T: DeserializeOwned>(&self, builder: RequestBuilder) -> Result<T, Error> {
        let (status, body) = answer(builder).await?;
        // An empty body decodes as `null`, so `()` and `Option<_>` work for empty answers.
        let bytes: &[u8] = if body.as_ref().is_empty() {
            b"null"
        } else {
            body.as_ref()
        };
        serde_json::from_slice(bytes).map_err(|source| Error::Decode {
            status: status.as_u16(),
            source,
        })
    }
}

/// Sends a request: a 2xx answer's status and body, or the [`Error`] any other answer (or none)
/// stands for.
async fn answer(builder: RequestBuilder) -> Result<(StatusCode, impl AsRef<[u8]>), Error> {
    let response = builder.send().await.map_err(Error::Transport)?;
    let status = response.status();
    let body = response.bytes().await.map_err(Error::Transport)?;
    if status.is_success() {
        Ok((status, body))
    } else {
        Err(error_from_response(status, &body))
    }
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
    let detail = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => ["detail", "message", "error", "title"]
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
            shorten(text, MAX_QUOTED_BODY)
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
        assert_eq!(error.status(), Some(400));
        assert_eq!(
            error.to_string(),
            "request rejected: Bad Request (400): invalid body; queues: must not be empty"
        );
    }

    #[test]
    fn the_answers_status_decides_over_the_bodys() {
        let body = br#"{"type":"x","title":"Oops","status":400,"detail":"db down"}"#;
        let error = error_from_response(StatusCode::SERVICE_UNAVAILABLE, body);
        assert!(error.is_retryable());
        assert_eq!(error.to_string(), "server error 503: db down");
    }

    #[test]
    fn non_json_error_bodies_are_quoted_and_5xx_is_retryable() {
        let error = error_from_response(StatusCode::BAD_GATEWAY, b"upstream down");
        assert!(error.is_retryable());
        assert_eq!(error.to_string(), "server error 502: upstream down");
        let error = error_from_response(StatusCode::NOT_FOUND, b"");
        assert_eq!(error.to_string(), "not found: Not Found");
        let error = error_from_response(StatusCode::FORBIDDEN, br#"{"message":"no"}"#);
        assert_eq!(error.to_string(), "request rejected: Forbidden (403): no");
        let long = "é".repeat(MAX_QUOTED_BODY);
        let Error::Server { message, .. } =
            error_from_response(StatusCode::BAD_GATEWAY, long.as_bytes())
        else {
            panic!("a 502 is a server error");
        };
        assert_eq!(message, format!("{}…", "é".repeat(MAX_QUOTED_BODY / 2)));
    }

    #[test]
    fn batch_items_problems_map_like_whole_answers() {
        let problem = |status| Problem {
            kind: "about:blank".to_owned(),
            title: "t".to_owned(),
            status,
            detail: "d".to_owned(),
            errors: Vec::new(),
            limit: None,
        };
        assert!(matches!(Error::from_problem(problem(409)), Error::Conflict(d) if d == "d"));
        assert!(matches!(
            Error::from_problem(problem(404)),
            Error::NotFound(_)
        ));
        assert!(Error::from_problem(problem(500)).is_retryable());
        assert!(matches!(
            Error::from_problem(problem(422)),
            Error::Rejected { status: 422, .. }
        ));
    }

    #[test]
    fn base_url_must_be_http() {
        assert!(matches!(
            Client::new("ftp://x"),
            Err(Error::InvalidUrl { .. })
        ));
        assert!(matches!(
            Client::new("not a url"),
            Err(Error::InvalidUrl { .. })
        ));
        assert!(matches!(
            Client::with_ca_pem("https://x", b"no certificate"),
            Err(Error::InvalidCaCertificate(_))
        ));
    }

    #[test]
    fn requests_carry_the_headers_and_the_namespace() {
        let client = Client::new("http://127.0.0.1:7433/prefix/")
            .expect("valid url")
            .with_token(Some("sbt_x".to_owned()))
            .with_actor(Some("alice".to_owned()))
            .with_namespace(Some("team a".to_owned()));
        let request = client
            .namespaced(Method::GET, &paths::job("job_1"))
            .build()
            .expect("a request");
        assert_eq!(
            request.url().as_str(),
            "http://127.0.0.1:7433/prefix/api/v1/jobs/job_1?namespace=team+a"
        );
        let headers = request.headers();
        assert_eq!(headers["authorization"], "Bearer sbt_x");
        assert_eq!(headers["starbridge-actor"], "alice");
        assert_eq!(
            headers["accept"],
            "application/json, application/problem+json"
        );
        // Worker endpoints and health are not namespaced.
        let request = client
            .request(Method::POST, paths::TASKS_POLL)
            .build()
            .expect("a request");
        assert_eq!(
            request.url().as_str(),
            "http://127.0.0.1:7433/prefix/api/v1/tasks/poll"
        );
    }

    #[test]
    fn absent_query_values_are_left_out() {
        let client = Client::new("http://h").expect("valid url");
        let request = client
            .namespaced(Method::GET, paths::AUDIT)
            .query(&[("limit", Some(5))])
            .query(&[("before", None::<i64>)])
            .build()
            .expect("a request");
        assert_eq!(request.url().as_str(), "http://h/api/v1/audit?limit=5");
    }
}
