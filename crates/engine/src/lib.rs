//! The engine of Starbridge: what every change means and how it becomes durable.
//!
//! A request that changes state becomes a command (`commands`: submit, claim, report, operate,
//! tick, locks, schedules, the webhooks' outbox, tokens) run by the one writer thread of
//! this node (`writer`), which commits many requests in one transaction (group commit) and answers
//! each once its change is durable. The job cache (`jobs`) and the compiled-workflow cache
//! (`cache`) spare the writer reads; the notifier (`notify`) wakes long-polls when queues get
//! work, and a worker's long poll (`poll`) waits on it. The background loops that drive time (lease and deadline timers, schedule fires,
//! retention pruning, webhook delivery, and on PostgreSQL the listener that hears other nodes and
//! the vacuumer) are in `loops`, one file each.
//!
//! The rules themselves are the core's (`starbridge-core`, pure); the SQL is the store's
//! (`starbridge-store`, which never calls back here). The store is the single source of truth:
//! every state change and its history event are written in one transaction, and there is no
//! other queue.

mod cache;
mod clock;
mod commands;
mod ctx;
mod health;
mod jobs;
pub mod loops;
mod notify;
mod parking;
mod poll;
mod read_ahead;
mod secrets;
pub mod traces;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde_json::Value;
use starbridge_core::dispatch::{OnError, QueueMode, RateLimit};
use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::labels::Labels;
use starbridge_core::model::{
    CallbackCall, Input, Job, JobState, JobStatus, OperatorCommand, Task,
};
use starbridge_core::time::{Duration, Timestamp};
use starbridge_store::reader::ReadPool;
use starbridge_store::rows::{self, RowLock};
use starbridge_store::{browse, minutes, stats};

pub use cache::Compiled;
pub use clock::{Clock, ManualClock, SystemClock};
pub use commands::outbox::{
    Attempt, DELIVERY_LEASE, MAX_DELIVERY_ATTEMPTS, MAX_DELIVERY_BACKOFF, NewWebhook,
};
pub use commands::schedules::{ScheduleSpec, time_zone};
pub use commands::tokens::NewToken;
pub use commands::{CallbackAccepted, QueueStates, SignalAccepted};
pub use health::{HEALTHY_WRITE_AGE, Health};
pub use loops::deliveries::{run_deliveries, signature};
pub use loops::pruner::run_pruner;
pub use loops::rollup::run_rollup;
pub use loops::timers::run_timers;
pub use notify::{Notifier, WorkerSeen};
pub use starbridge_store::minutes::{MinuteFigures, MinuteRow, SeriesKind, minute_of};
pub use starbridge_store::rows::audit::AuditEntry;
pub use starbridge_store::rows::deliveries::{Delivery, DueDelivery};
pub use starbridge_store::rows::schedules::StoredSchedule;
pub use starbridge_store::rows::tokens::{Scope, Token};
pub use starbridge_store::rows::webhooks::Webhook;
pub use starbridge_store::rows::{ChangeMark, QueueSearch};
pub use starbridge_store::{
    DatabaseError, Durability, Error, JobCursor, JobFilter, JobLine, JobSearch, QueueStats, Result,
    Stats, StatusCount, StoreOptions, StoredEvent, StoredQueue, StoredQueuePrefix, StoredWorkflow,
    WorkerLoad, WriteFault, sqlite_path,
};
pub use writer::WriterStats;

/// What `Engine::retire_history` changed: the history partitions it made and dropped.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HistoryPartitions {
    pub made: Vec<String>,
    pub dropped: Vec<String>,
}

/// The end time before which finished jobs are past a retention of `retain`.
fn retention_cutoff(now: Timestamp, retain: Duration) -> Timestamp {
    Timestamp(
        now.0
            .saturating_sub(i64::try_from(retain.as_millis()).unwrap_or(i64::MAX)),
    )
}
use writer::{Shared, Writer};

#[derive(Debug, Clone, Copy)]
pub struct Applied {
    pub version: u32,
    pub created: bool,
}

/// Changes to a queue's settings; `None` leaves a setting as it is.
#[derive(Debug, Clone, Default)]
pub struct QueueChange {
    pub mode: Option<QueueMode>,
    pub priority: Option<i32>,
    /// `Some(None)` removes the limit.
    pub concurrency: Option<Option<u32>>,
    pub paused: Option<bool>,
    pub max_wait: Option<Duration>,
    /// `Some(None)` removes the rate limit.
    pub rate: Option<Option<RateLimit>>,
    pub on_error: Option<OnError>,
}

/// A queue as it dispatches now.
#[derive(Debug, Clone)]
pub struct QueueInfo {
    /// Its row, with `config` the settings it dispatches with: its own, its prefix's or the
    /// defaults, and its pause.
    pub queue: StoredQueue,
    /// The prefix whose settings it follows; `None` when it has its own or the defaults.
    pub settings_from: Option<String>,
    pub stats: QueueStats,
}

/// A page of a namespace's queues, and every prefix setting of the namespace.
#[derive(Debug, Clone)]
pub struct QueuePage {
    pub queues: Vec<QueueInfo>,
    pub prefixes: Vec<StoredQueuePrefix>,
}

/// Most jobs one `Engine::tick` moves.
pub const TICK_BATCH: usize = 500;

/// A job to create.
#[derive(Debug, Clone, Default)]
pub struct Submit {
    pub workflow: Option<String>,
    pub version: Option<u32>,
    pub definition: Option<Value>,
    pub params: Option<Value>,
    pub key: Option<String>,
    pub priority: Option<i32>,
    /// Who submits (a token's name, a schedule): recorded in the job's `job_created` event.
    pub actor: Option<String>,
    /// The job's labels, merged over its workflow's (a key in both takes this value).
    pub labels: Labels,
    /// Whether an inline `definition` equal to none of the workflow's versions may become its
    /// new latest version (the `operate` scope); without it only an existing version runs.
    pub may_add_version: bool,
    /// The submitter's W3C `traceparent`: a traced job continues its trace.
    pub traceparent: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Submitted {
    pub state: JobState,
    /// False when the key matched an existing job, which is returned instead.
    pub created: bool,
    /// The workflow version this submission's inline definition created, if it made one.
    pub added_version: Option<u32>,
}

/// A signal to send to a job.
#[derive(Debug, Clone)]
pub struct SendSignal {
    pub name: String,
    pub payload: Value,
    /// A dedupe id: a later signal with the same id changes nothing.
    pub id: Option<String>,
    /// Who sent it (a token's name, or the actor header), recorded in the history.
    pub sender: String,
}

/// A person's decision on an approval step.
#[derive(Debug, Clone)]
pub struct Decision {
    pub approve: bool,
    /// Who decided (a token's name, or the actor header).
    pub by: String,
    pub comment: Option<String>,
}

/// A task handed to a worker, with how long its lease lasts.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub task: Task,
    pub lease: Duration,
    /// The attempt's callback token, shown only here (the store keeps its hash).
    pub callback_token: String,
    /// The attempt's W3C `traceparent`, while tracing is on and the job has a trace.
    pub traceparent: Option<String>,
}

/// A worker's long poll: up to `max` tasks of `queues` in `namespace` for `worker`, waiting up
/// to `wait` when none is ready.
#[derive(Debug, Clone)]
pub struct Poll {
    pub namespace: String,
    pub queues: Vec<String>,
    pub worker: String,
    pub max: u32,
    pub wait: std::time::Duration,
}

/// What a poll did: the answer of each report it carried, in order, and the tasks it claimed.
#[derive(Debug)]
pub struct Polled {
    pub reports: Vec<Result<Reported>>,
    pub claimed: Vec<Claimed>,
}

/// Which tasks a worker's report may touch: any (the default), or only those of one namespace
/// and, optionally, some queues (an API token's bounds).
#[derive(Debug, Clone, Default)]
pub struct TaskScope {
    pub namespace: Option<String>,
    pub queues: Option<Vec<String>>,
}

impl TaskScope {
    pub(crate) fn allows(&self, namespace: &str, queue: &str) -> bool {
        self.namespace.as_deref().is_none_or(|own| own == namespace)
            && self
                .queues
                .as_ref()
                .is_none_or(|queues| starbridge_core::routing::any_matches(queues, queue))
    }
}

#[derive(Debug, Clone)]
pub struct Reported {
    pub task: Task,
    pub lease: Duration,
    pub job_status: JobStatus,
}

/// Most finished jobs one `Engine::prune` call deletes.
pub const PRUNE_BATCH: u32 = 500;

/// Most events one `Engine::roll_up` call reads.
pub const ROLLUP_BATCH: u32 = 10_000;

/// How old an event must be before the rollup counts it (see store `minutes`).
pub const ROLLUP_LAG: Duration = Duration::from_secs(5);

/// The engine of one node: cheap to clone (one shared pointer), shared by every request handler.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Parts>,
}

/// What an engine holds.
struct Parts {
    writer: Writer,
    reader: Arc<ReadPool>,
    workflows: Arc<cache::WorkflowCache>,
    notifier: Arc<Notifier>,
    clock: Arc<dyn Clock>,
    sqlite_file: Option<PathBuf>,
    options: StoreOptions,
    counters: Arc<writer::Counters>,
    /// The outcome of the writer's last group transaction, for `health`.
    last_write: Arc<health::LastWrite>,
    /// Held while a health probe write is in flight: there is at most one.
    probing: Arc<tokio::sync::Mutex<()>>,
    /// Claims counted for PostgreSQL's vacuumer (see `loops::vacuum`).
    upkeep: Arc<loops::vacuum::Upkeep>,
    /// Where finished spans go, once `Engine::export_traces` turned tracing on.
    spans: Arc<OnceLock<Arc<traces::SpanSink>>>,
    /// On SQLite: the jobs read ahead for the writer's claims.
    read_ahead: Option<Arc<read_ahead::ReadAhead>>,
}

impl Engine {
    /// Opens (creating if needed) the database at `url` and brings its schema up to date:
    /// `sqlite://FILE` (or a plain path) or `postgres://...`.
    pub fn open(url: &str) -> Result<Engine> {
        Engine::open_with(url, StoreOptions::default(), Arc::new(SystemClock))
    }

    pub fn open_with_clock(url: &str, clock: Arc<dyn Clock>) -> Result<Engine> {
        Engine::open_with(url, StoreOptions::default(), clock)
    }

    /// Brings the schema of the database at `url` up to date without starting an engine;
    /// returns how many migrations were applied.
    pub fn migrate(url: &str, options: &StoreOptions) -> Result<usize> {
        starbridge_store::migrate(url, options, SystemClock.now().0)
    }

    pub fn open_with(url: &str, options: StoreOptions, clock: Arc<dyn Clock>) -> Result<Engine> {
        let opened = starbridge_store::open(url, &options, clock.now().0)?;
        if opened.applied > 0 {
            tracing::info!(applied = opened.applied, "database schema migrated");
        }
        let workflows = Arc::new(cache::WorkflowCache::default());
        let notifier = Arc::new(Notifier::default());
        let node = uuid::Uuid::new_v4().simple().to_string();
        let upkeep = Arc::new(loops::vacuum::Upkeep::default());
        if let Some(connector) = opened.postgres {
            loops::vacuum::start(
                connector.clone(),
                &upkeep,
                loops::vacuum::VACUUM_AFTER_CLAIMS,
            );
            loops::listener::start(connector, node.clone(), &notifier);
        }
        let counters = Arc::new(writer::Counters::default());
        let last_write = Arc::new(health::LastWrite::default());
        let spans: Arc<OnceLock<Arc<traces::SpanSink>>> = Arc::default();
        // On SQLite this node's writer makes every change, so the jobs its claims will take
        // can be read beside it (see `read_ahead`).
        let read_ahead = opened
            .sqlite_file
            .is_some()
            .then(|| read_ahead::ReadAhead::start(opened.connect.clone()));
        let writer = Writer::start(
            opened.writer,
            Shared {
                connect: opened.reconnect_writer,
                clock: clock.clone(),
                workflows: workflows.clone(),
                notifier: notifier.clone(),
                node,
                limits: options.limits,
                counters: counters.clone(),
                last_write: last_write.clone(),
                spans: spans.clone(),
                parked: Arc::default(),
                read_ahead: read_ahead.clone(),
            },
        );
        let parts = Parts {
            writer,
            reader: Arc::new(ReadPool::new(opened.connect, options.read_pool)),
            workflows,
            notifier,
            clock,
            sqlite_file: opened.sqlite_file,
            options,
            counters,
            last_write,
            probing: Arc::default(),
            upkeep,
            spans,
            read_ahead,
        };
        Ok(Engine {
            inner: Arc::new(parts),
        })
    }

    /// The SQLite file, when the store is one.
    pub fn path(&self) -> Option<&Path> {
        self.inner.sqlite_file.as_deref()
    }

    /// False on SQLite (one node owns the file); true on PostgreSQL, where other server nodes
    /// may change the store at any time.
    pub fn is_shared(&self) -> bool {
        self.inner.sqlite_file.is_none()
    }

    pub fn options(&self) -> &StoreOptions {
        &self.inner.options
    }

    /// Turns OpenTelemetry traces on: from now on jobs submitted get a trace, and the spans of
    /// jobs, attempts and API requests go to the OTLP/HTTP `endpoint` (see `traces`). Must run
    /// inside a Tokio runtime; a second call changes nothing.
    pub fn export_traces(&self, endpoint: &str) -> std::result::Result<(), traces::ExporterError> {
        if self.inner.spans.get().is_none() {
            let sink = traces::start(endpoint, self.inner.reader.clone())?;
            let _ = self.inner.spans.set(sink);
        }
        Ok(())
    }

    /// Where finished spans go, while tracing is on.
    pub fn spans(&self) -> Option<&Arc<traces::SpanSink>> {
        self.inner.spans.get()
    }

    /// What the group-commit writer has done since the store opened.
    pub fn writer_stats(&self) -> WriterStats {
        let mut stats = self.inner.counters.read();
        if let Some(read_ahead) = &self.inner.read_ahead {
            stats.jobs_read_ahead = read_ahead.used();
        }
        stats
    }

    pub fn notifier(&self) -> &Arc<Notifier> {
        &self.inner.notifier
    }

    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    /// Applies a definition; a body equal to the latest version returns that version.
    pub async fn apply_workflow(
        &self,
        namespace: &str,
        name: &str,
        document: Value,
    ) -> Result<Applied> {
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        self.inner
            .writer
            .write(move |ctx| commands::apply_workflow(ctx, &namespace, &name, document.clone()))
            .await
    }

    /// Deletes (hides) a workflow: its versions stay for the jobs that ran them, and a later
    /// apply continues at the next version number. Refused (a conflict naming them) while an
    /// unfinished or retryable job, a schedule, or another workflow's sub-workflow step uses it.
    pub async fn delete_workflow(&self, namespace: &str, name: &str) -> Result<()> {
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        self.inner
            .writer
            .write(move |ctx| commands::delete_workflow(ctx, &namespace, &name))
            .await
    }

    pub async fn submit(&self, namespace: &str, request: Submit) -> Result<Submitted> {
        let mut prepared = self.prepare_submit(namespace, &request);
        let namespace = namespace.to_owned();
        self.inner
            .writer
            .write(move |ctx| commands::submit(ctx, &namespace, &request, prepared.take()))
            .await
    }

    /// Makes a submit's job ready before it reaches the writer, where it can (see
    /// `commands::submit::prepare`).
    fn prepare_submit(&self, namespace: &str, request: &Submit) -> Option<commands::Prepared> {
        commands::prepare(
            &self.inner.workflows,
            self.inner.options.limits,
            self.now(),
            namespace,
            request,
        )
    }

    /// Submits a job, and for a job it created also reads the states of the queues its ready
    /// tasks wait in (what its view explains them with). On SQLite the writer reads them in the
    /// submit's own transaction: a read of their own, after the commit, would cost a hand-off to
    /// a reading thread that weighs more than the read. On PostgreSQL the writer's round trips
    /// are what every write of the node waits on, so the read goes to the read pool after the
    /// commit.
    pub async fn submit_for_view(
        &self,
        namespace: &str,
        request: Submit,
    ) -> Result<(Submitted, QueueStates)> {
        if self.inner.sqlite_file.is_none() {
            let submitted = self.submit(namespace, request).await?;
            let queues = if submitted.created {
                let waiting = commands::ready_queues(&submitted.state);
                self.queue_states(namespace, waiting).await?
            } else {
                QueueStates::new()
            };
            return Ok((submitted, queues));
        }
        let mut prepared = self.prepare_submit(namespace, &request);
        let namespace = namespace.to_owned();
        let notifier = self.inner.notifier.clone();
        self.inner
            .writer
            .write(move |ctx| {
                let submitted = commands::submit(ctx, &namespace, &request, prepared.take())?;
                if !submitted.created {
                    return Ok((submitted, QueueStates::new()));
                }
                let prefixes = ctx.queue_prefixes(&namespace)?;
                let waiting = commands::ready_queues(&submitted.state);
                let stored = ctx.stored_queues(&namespace, &waiting)?;
                let queues = commands::read_queue_states(
                    ctx.conn, &namespace, waiting, stored, &prefixes, &notifier, ctx.now,
                )?;
                Ok((submitted, queues))
            })
            .await
    }

    /// Submits several jobs at once: each as its own request (one refused leaves the others
    /// alone), all queued for the same group commits. Answers in the order given.
    pub async fn submit_many(
        &self,
        namespace: &str,
        requests: Vec<Submit>,
    ) -> Vec<Result<Submitted>> {
        let pending: Vec<_> = requests
            .into_iter()
            .map(|request| {
                let mut prepared = self.prepare_submit(namespace, &request);
                let namespace = namespace.to_owned();
                self.inner.writer.enqueue(move |ctx| {
                    commands::submit(ctx, &namespace, &request, prepared.take())
                })
            })
            .collect();
        writer::answers(pending).await
    }

    pub async fn claim(
        &self,
        namespace: &str,
        queues: Vec<String>,
        worker: &str,
        max: u32,
    ) -> Result<Vec<Claimed>> {
        let mut together = writer::Together::default();
        let claim = Engine::claim_in(&mut together, namespace, queues, worker, max);
        self.inner.writer.send(together);
        self.claimed(claim).await
    }

    /// Adds a claim to requests queued together (see `claim`).
    fn claim_in(
        together: &mut writer::Together,
        namespace: &str,
        queues: Vec<String>,
        worker: &str,
        max: u32,
    ) -> writer::Pending<Vec<Claimed>> {
        let key = commands::shared_claims::ClaimKey {
            namespace: namespace.to_owned(),
            queues,
        };
        let demand = commands::shared_claims::ClaimDemand {
            key: key.clone(),
            max,
        };
        let worker = worker.to_owned();
        let secrets = secrets::AttemptSecrets::for_attempts(max);
        together.claim(demand, move |ctx| {
            commands::claim(ctx, &key, &worker, max, &secrets)
        })
    }

    /// The tasks a queued claim took, counted for the vacuumer.
    async fn claimed(&self, claim: writer::Pending<Vec<Claimed>>) -> Result<Vec<Claimed>> {
        let claimed = claim.answer().await?;
        self.inner
            .upkeep
            .claimed
            .fetch_add(claimed.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(claimed)
    }

    /// A worker's report on a task; a task outside `scope` is not found.
    pub async fn report(&self, task: TaskId, input: Input, scope: TaskScope) -> Result<Reported> {
        self.inner
            .writer
            .enqueue_report(task.clone(), move |ctx| {
                commands::report(ctx, &task, input.clone(), &scope)
            })
            .answer()
            .await?
    }

    /// Several reports at once: each as its own request, all queued for the same group
    /// transaction. Answers in the order given.
    pub async fn report_many(
        &self,
        reports: Vec<(TaskId, Input)>,
        scope: TaskScope,
    ) -> Vec<Result<Reported>> {
        let mut together = writer::Together::default();
        let pending = Engine::reports_in(&mut together, reports, &scope);
        self.inner.writer.send(together);
        Engine::report_answers(pending).await
    }

    /// Adds each report, as its own request, to requests queued together, in order.
    fn reports_in(
        together: &mut writer::Together,
        reports: Vec<(TaskId, Input)>,
        scope: &TaskScope,
    ) -> Vec<writer::Pending<commands::Answer>> {
        reports
            .into_iter()
            .map(|(task, input)| {
                let scope = scope.clone();
                together.report(task.clone(), move |ctx| {
                    commands::report(ctx, &task, input.clone(), &scope)
                })
            })
            .collect()
    }

    /// The answers of reports queued with `reports_in`, in order: a write that failed, or the
    /// report's own refusal (which may have been committed, see `commands::report`).
    async fn report_answers(
        pending: Vec<writer::Pending<commands::Answer>>,
    ) -> Vec<Result<Reported>> {
        writer::answers(pending)
            .await
            .into_iter()
            .map(|answer| answer.and_then(|refused_or_reported| refused_or_reported))
            .collect()
    }

    /// An operator's action (pause, resume, cancel, retry, skip, rerun, a task's requeue or fail)
    /// on a job of `namespace`.
    /// A job of another namespace is not found; an action that does not apply is a conflict.
    pub async fn operate(
        &self,
        namespace: &str,
        job: &JobId,
        command: OperatorCommand,
    ) -> Result<JobState> {
        let (namespace, job) = (namespace.to_owned(), job.clone());
        self.inner
            .writer
            .write(move |ctx| commands::operate(ctx, &namespace, &job, command.clone()))
            .await
    }

    /// Deletes a finished job of `namespace` with its tasks and history; its key is free again.
    /// A job of another namespace is not found; an unfinished job, or a child job whose parent
    /// is kept, is a conflict.
    pub async fn delete_job(&self, namespace: &str, job: &JobId) -> Result<()> {
        let (namespace, job) = (namespace.to_owned(), job.clone());
        self.inner
            .writer
            .write(move |ctx| commands::delete_job(ctx, &namespace, &job))
            .await
    }

    /// A signal sent to a job of `namespace` (see `commands::signals`).
    pub async fn signal(
        &self,
        namespace: &str,
        job: &JobId,
        signal: SendSignal,
    ) -> Result<SignalAccepted> {
        let (namespace, job) = (namespace.to_owned(), job.clone());
        self.inner
            .writer
            .write(move |ctx| {
                commands::signal(
                    ctx,
                    &namespace,
                    &job,
                    &signal.name,
                    signal.payload.clone(),
                    signal.id.as_deref(),
                    &signal.sender,
                )
            })
            .await
    }

    /// A person's decision on an approval step of a job of `namespace`; returns the job.
    pub async fn decide(
        &self,
        namespace: &str,
        job: &JobId,
        task: &TaskId,
        decision: Decision,
    ) -> Result<JobState> {
        let (namespace, job, task) = (namespace.to_owned(), job.clone(), task.clone());
        self.inner
            .writer
            .write(move |ctx| {
                commands::decide(
                    ctx,
                    &namespace,
                    &job,
                    &task,
                    decision.approve,
                    &decision.by,
                    decision.comment.as_deref(),
                )
            })
            .await
    }

    /// A call through a callback token (see `commands::callbacks`).
    pub async fn callback(&self, token: &str, call: CallbackCall) -> Result<CallbackAccepted> {
        let token = token.to_owned();
        self.inner
            .writer
            .write(move |ctx| commands::callback(ctx, &token, call.clone()))
            .await
    }

    /// Tasks of `namespace` waiting for approval, oldest first, with their job's workflow.
    pub async fn pending_approvals(
        &self,
        namespace: &str,
        limit: u32,
    ) -> Result<Vec<(Task, String)>> {
        let namespace = namespace.to_owned();
        self.inner
            .reader
            .read(move |conn| rows::pending_approvals(conn, &namespace, limit))
            .await
    }

    /// Changes a queue's settings (creating the queue if needed) and returns them. Pollers of
    /// the queue are woken, since a resumed or widened queue may hand out work at once.
    pub async fn configure_queue(
        &self,
        namespace: &str,
        name: &str,
        change: QueueChange,
    ) -> Result<StoredQueue> {
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        self.inner
            .writer
            .write(move |ctx| commands::configure_queue(ctx, &namespace, &name, change.clone()))
            .await
    }

    /// Gives every queue of the namespace whose name starts with the prefix of `pattern`
    /// (`agent-*`) and has no settings of its own these settings (creating or changing the
    /// prefix's settings), and returns them. Pollers of those queues are woken.
    pub async fn configure_queue_prefix(
        &self,
        namespace: &str,
        pattern: &str,
        change: QueueChange,
    ) -> Result<StoredQueuePrefix> {
        let (namespace, pattern) = (namespace.to_owned(), pattern.to_owned());
        self.inner
            .writer
            .write(move |ctx| commands::configure_prefix(ctx, &namespace, &pattern, change.clone()))
            .await
    }

    /// Drops the settings of a pattern (`agent-*`), or a queue's own settings (see
    /// `commands::drop_settings`).
    pub async fn drop_queue_settings(&self, namespace: &str, name: &str) -> Result<()> {
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        self.inner
            .writer
            .write(move |ctx| commands::drop_settings(ctx, &namespace, &name))
            .await
    }

    /// A page of a namespace's queues in name order, as they dispatch now, with every prefix
    /// setting of the namespace.
    pub async fn queue_page(&self, search: QueueSearch) -> Result<QueuePage> {
        let now = self.inner.clock.now();
        self.inner
            .reader
            .read(move |conn| {
                let prefixes = rows::queue_prefixes::list(conn, &search.namespace)?;
                let queues = rows::queue_page(conn, &search, now)?
                    .into_iter()
                    .map(|(queue, stats)| queue_info(queue, stats, &prefixes))
                    .collect();
                Ok(QueuePage { queues, prefixes })
            })
            .await
    }

    /// One queue as it dispatches now, if the namespace has it.
    pub async fn queue(&self, namespace: &str, name: &str) -> Result<Option<QueueInfo>> {
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        let now = self.inner.clock.now();
        self.inner
            .reader
            .read(move |conn| {
                let prefixes = rows::queue_prefixes::list(conn, &namespace)?;
                Ok(rows::queue_line(conn, &namespace, &name, now)?
                    .map(|(queue, stats)| queue_info(queue, stats, &prefixes)))
            })
            .await
    }

    /// The settings of a name prefix (`prefix` without the pattern's `*`), if it has some.
    pub async fn queue_prefix(
        &self,
        namespace: &str,
        prefix: &str,
    ) -> Result<Option<StoredQueuePrefix>> {
        let (namespace, prefix) = (namespace.to_owned(), prefix.to_owned());
        self.inner
            .reader
            .read(move |conn| rows::queue_prefixes::get(conn, &namespace, &prefix))
            .await
    }

    /// At most `TICK_BATCH` jobs per call: call again while it returns that many.
    pub async fn tick(&self) -> Result<usize> {
        self.inner
            .writer
            .write(|ctx| commands::tick(ctx, TICK_BATCH))
            .await
    }

    /// Deletes up to `PRUNE_BATCH` jobs that finished longer ago than the retention allows
    /// (with their tasks and history); returns how many went. Call again while it returns
    /// `PRUNE_BATCH`.
    pub async fn prune(&self) -> Result<usize> {
        let Some(retain) = self.inner.options.retain_finished else {
            return Ok(0);
        };
        self.inner
            .writer
            .write(move |ctx| {
                let before = retention_cutoff(ctx.now, retain);
                // Only finished jobs go, which the job cache never holds; forget it anyway,
                // since rows change outside the commands.
                ctx.jobs.clear();
                rows::prune_finished(ctx.conn, before, PRUNE_BATCH)
            })
            .await
    }

    /// On PostgreSQL, makes the coming days' history partitions and drops the days past the
    /// retention that hold no kept job's history (see `rows::partitions`); call it after
    /// `prune`. Nothing to do on SQLite.
    pub async fn retire_history(&self) -> Result<HistoryPartitions> {
        let retain = self.inner.options.retain_finished;
        self.inner
            .writer
            .write(move |ctx| {
                let made = rows::partitions::make_event_partitions(ctx.conn, ctx.now)?;
                let dropped = match retain {
                    Some(retain) => rows::partitions::drop_retired_event_partitions(
                        ctx.conn,
                        retention_cutoff(ctx.now, retain),
                    )?,
                    None => Vec::new(),
                };
                Ok(HistoryPartitions { made, dropped })
            })
            .await
    }

    /// Reads up to `ROLLUP_BATCH` events older than `ROLLUP_LAG` past the watermark, adds those
    /// of the kinds it counts to the dashboard's per-minute rows, and samples the queues once a
    /// minute; returns how many events it read (of any kind). Call again while it returns
    /// `ROLLUP_BATCH`. The events are read on a reading connection; the writer only adds the
    /// sums, and only if no other node rolled the same events up first.
    pub async fn roll_up(&self) -> Result<usize> {
        let now = self.inner.clock.now();
        let rollup = self
            .inner
            .reader
            .read(move |conn| minutes::read_rollup(conn, now, ROLLUP_LAG, ROLLUP_BATCH))
            .await?;
        if rollup.from == rollup.to {
            return Ok(0);
        }
        let events = rollup.events;
        let applied = self
            .inner
            .writer
            .write(move |ctx| minutes::apply_rollup(ctx.conn, &rollup, ctx.now))
            .await?;
        Ok(if applied { events } else { 0 })
    }

    /// A namespace's per-minute rows from `since` on (see store `minutes`).
    pub async fn minutes(
        &self,
        namespace: &str,
        since: Timestamp,
    ) -> Result<Vec<minutes::MinuteRow>> {
        let namespace = namespace.to_owned();
        self.inner
            .reader
            .read(move |conn| minutes::list(conn, &namespace, since))
            .await
    }

    /// Deletes the token buckets of steps' per-key rates that refilled with no task parked on
    /// them (the same as no bucket); returns how many went.
    pub async fn prune_rate_buckets(&self) -> Result<u64> {
        self.inner
            .writer
            .write(move |ctx| rows::rates::prune_rate_buckets(ctx.conn, ctx.now))
            .await
    }

    /// A job with its tasks, if it exists in this namespace.
    pub async fn job(&self, namespace: &str, id: &JobId) -> Result<Option<JobState>> {
        let (namespace, id) = (namespace.to_owned(), id.clone());
        self.inner
            .reader
            .read(move |conn| {
                Ok(rows::load_job_state(conn, &id)?
                    .filter(|state| state.job.namespace == namespace))
            })
            .await
    }

    pub async fn jobs(&self, filter: JobFilter) -> Result<Vec<Job>> {
        self.inner
            .reader
            .read(move |conn| rows::list_jobs(conn, &filter))
            .await
    }

    /// What a job's view needs besides the job, in one read: its history (at most `limit`
    /// events) and the states of the queues its ready tasks wait in. `job` was read from its
    /// namespace.
    pub async fn view_reads(
        &self,
        job: &JobState,
        limit: u32,
    ) -> Result<(Vec<StoredEvent>, QueueStates)> {
        let row = job.job.clone();
        let queues = commands::ready_queues(job);
        let notifier = self.inner.notifier.clone();
        let now = self.inner.clock.now();
        self.inner
            .reader
            .read(move |conn| {
                let events = rows::events(conn, &row, 0, limit)?;
                let prefixes = rows::queue_prefixes::list(conn, &row.namespace)?;
                let stored = commands::stored_queues(conn, &row.namespace, &queues)?;
                let states = commands::read_queue_states(
                    conn,
                    &row.namespace,
                    queues,
                    stored,
                    &prefixes,
                    &notifier,
                    now,
                )?;
                Ok((events, states))
            })
            .await
    }

    /// How far a job has changed (its last event, its runs under way), or `None` when the job
    /// is not in this namespace.
    pub async fn change_mark(&self, namespace: &str, id: &JobId) -> Result<Option<ChangeMark>> {
        let (namespace, id) = (namespace.to_owned(), id.clone());
        self.inner
            .reader
            .read(move |conn| rows::change_mark(conn, &namespace, &id))
            .await
    }

    /// A job's history after event `after`, or `None` when the job is not in this namespace.
    pub async fn events(
        &self,
        namespace: &str,
        id: &JobId,
        after: i64,
        limit: u32,
    ) -> Result<Option<Vec<StoredEvent>>> {
        let (namespace, id) = (namespace.to_owned(), id.clone());
        self.inner
            .reader
            .read(move |conn| match rows::load_job(conn, &id)? {
                Some(job) if job.namespace == namespace => {
                    rows::events(conn, &job, after, limit).map(Some)
                }
                _ => Ok(None),
            })
            .await
    }

    pub async fn workflow(
        &self,
        namespace: &str,
        name: &str,
        version: Option<u32>,
    ) -> Result<Option<StoredWorkflow>> {
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        self.inner
            .reader
            .read(move |conn| rows::workflow(conn, &namespace, &name, version))
            .await
    }

    pub async fn workflows(&self, namespace: &str) -> Result<Vec<StoredWorkflow>> {
        let namespace = namespace.to_owned();
        self.inner
            .reader
            .read(move |conn| rows::list_workflows(conn, &namespace))
            .await
    }

    /// The compiled form of a stored workflow version.
    pub async fn compiled(
        &self,
        namespace: &str,
        name: &str,
        version: u32,
    ) -> Result<Arc<Compiled>> {
        if let Some(compiled) = self.inner.workflows.cached(namespace, name, version) {
            return Ok(compiled);
        }
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        let workflows = self.inner.workflows.clone();
        self.inner
            .reader
            .read(move |conn| workflows.get(conn, &namespace, &name, version))
            .await
    }

    /// When the next ready task of these queues becomes claimable, counting only queues that
    /// may hand out work now (a paused or full queue wakes its pollers when that changes) and
    /// the time a rate-limited queue with ready tasks gets its next token.
    pub async fn next_available(
        &self,
        namespace: &str,
        queues: Vec<String>,
    ) -> Result<Option<Timestamp>> {
        let namespace = namespace.to_owned();
        let now = self.inner.clock.now();
        self.inner
            .reader
            .read(move |conn| {
                let prefixes = rows::queue_prefixes::list(conn, &namespace)?;
                let stored = commands::stored_queues(conn, &namespace, &queues)?;
                let (open, reopen) = commands::open_queues(
                    conn, &namespace, &queues, &stored, &prefixes, now, false,
                )?;
                let mut next: Option<Timestamp> = None;
                let mut earliest = |at: Timestamp| next = Some(next.map_or(at, |n| n.min(at)));
                for queue in &open {
                    let name = &queue.name;
                    if let Some(at) =
                        rows::next_available(conn, &namespace, name, queue.rollback_only)?
                    {
                        earliest(at);
                    }
                }
                for (queue, at) in reopen {
                    if rows::next_available(conn, &namespace, &queue, false)?.is_some() {
                        earliest(at);
                    }
                }
                Ok(next)
            })
            .await
    }

    /// When the next lease lapses, deadline passes or schedule fires.
    pub async fn next_timer(&self) -> Result<Option<Timestamp>> {
        self.inner
            .reader
            .read(|conn| {
                let timers = rows::next_timer(conn)?;
                let schedules = rows::schedules::next_due(conn)?;
                Ok(match (timers, schedules) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                })
            })
            .await
    }

    /// Subscribes `url` to job status changes (of `workflow`, with one of `states`; empty: all).
    pub async fn create_webhook(&self, namespace: &str, new: NewWebhook) -> Result<Webhook> {
        let namespace = namespace.to_owned();
        self.inner
            .writer
            .write(move |ctx| commands::outbox::create(ctx, &namespace, new.clone()))
            .await
    }

    pub async fn webhooks(&self, namespace: &str) -> Result<Vec<Webhook>> {
        let namespace = namespace.to_owned();
        self.inner
            .reader
            .read(move |conn| rows::webhooks::list(conn, &namespace))
            .await
    }

    /// Deletes a subscription and its undelivered messages (its history stays).
    pub async fn delete_webhook(&self, namespace: &str, id: &str) -> Result<()> {
        let (namespace, id) = (namespace.to_owned(), id.to_owned());
        self.inner
            .writer
            .write(move |ctx| commands::outbox::delete(ctx, &namespace, &id))
            .await
    }

    /// A subscription's deliveries, newest first; `None` when it is not in this namespace.
    pub async fn deliveries(
        &self,
        namespace: &str,
        id: &str,
        limit: u32,
    ) -> Result<Option<Vec<Delivery>>> {
        let (namespace, id) = (namespace.to_owned(), id.to_owned());
        self.inner
            .reader
            .read(move |conn| commands::outbox::deliveries(conn, &namespace, &id, limit))
            .await
    }

    /// Claims the deliveries due now for this node's deliverer (see `DELIVERY_LEASE`).
    pub async fn claim_deliveries(&self, limit: u32) -> Result<Vec<DueDelivery>> {
        self.inner
            .writer
            .write(move |ctx| commands::outbox::claim_due(ctx, limit))
            .await
    }

    /// When the next delivery attempt is due.
    pub async fn next_delivery(&self) -> Result<Option<Timestamp>> {
        self.inner.reader.read(rows::deliveries::next_attempt).await
    }

    pub async fn record_delivery(&self, id: i64, attempt: Attempt) -> Result<()> {
        self.inner
            .writer
            .write(move |ctx| commands::outbox::record(ctx, id, attempt.clone()))
            .await
    }

    /// Creates or replaces a schedule.
    pub async fn put_schedule(
        &self,
        namespace: &str,
        name: &str,
        spec: ScheduleSpec,
    ) -> Result<StoredSchedule> {
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        self.inner
            .writer
            .write(move |ctx| commands::schedules::put(ctx, &namespace, &name, spec.clone()))
            .await
    }

    pub async fn pause_schedule(
        &self,
        namespace: &str,
        name: &str,
        paused: bool,
    ) -> Result<StoredSchedule> {
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        self.inner
            .writer
            .write(move |ctx| commands::schedules::set_paused(ctx, &namespace, &name, paused))
            .await
    }

    pub async fn delete_schedule(&self, namespace: &str, name: &str) -> Result<()> {
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        self.inner
            .writer
            .write(move |ctx| commands::schedules::delete(ctx, &namespace, &name))
            .await
    }

    pub async fn schedules(&self, namespace: &str) -> Result<Vec<StoredSchedule>> {
        let namespace = namespace.to_owned();
        self.inner
            .reader
            .read(move |conn| rows::schedules::list(conn, &namespace))
            .await
    }

    pub async fn schedule(&self, namespace: &str, name: &str) -> Result<Option<StoredSchedule>> {
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        self.inner
            .reader
            .read(move |conn| rows::schedules::get(conn, &namespace, &name, RowLock::None))
            .await
    }

    /// Jobs per status and tasks per queue, for `/metrics`: one read query (see `stats.rs`).
    pub async fn stats(&self) -> Result<Stats> {
        let now = self.inner.clock.now();
        self.inner
            .reader
            .read(move |conn| stats::read(conn, now))
            .await
    }

    /// What the dispatcher knows about these queues, to explain why a task waits.
    pub async fn queue_states(&self, namespace: &str, queues: Vec<String>) -> Result<QueueStates> {
        let namespace = namespace.to_owned();
        let notifier = self.inner.notifier.clone();
        let now = self.inner.clock.now();
        self.inner
            .reader
            .read(move |conn| {
                let prefixes = rows::queue_prefixes::list(conn, &namespace)?;
                let stored = commands::stored_queues(conn, &namespace, &queues)?;
                commands::read_queue_states(
                    conn, &namespace, queues, stored, &prefixes, &notifier, now,
                )
            })
            .await
    }

    /// How many jobs and tasks hold a slot of this lock.
    pub async fn lock_usage(&self, namespace: &str, key: &str) -> Result<u32> {
        let (namespace, key) = (namespace.to_owned(), key.to_owned());
        self.inner
            .reader
            .read(move |conn| rows::lock_holders(conn, &namespace, &key))
            .await
    }

    /// Makes an API token; returns it with the token text, which is shown only this once.
    pub async fn create_token(&self, new: NewToken) -> Result<(Token, String)> {
        self.inner
            .writer
            .write(move |ctx| commands::tokens::create(ctx, &new))
            .await
    }

    pub async fn tokens(&self) -> Result<Vec<Token>> {
        self.inner.reader.read(rows::tokens::list).await
    }

    /// How many tokens are not revoked.
    pub async fn active_tokens(&self) -> Result<u64> {
        self.inner.reader.read(rows::tokens::active_count).await
    }

    pub async fn revoke_token(&self, id: &str) -> Result<Token> {
        let id = id.to_owned();
        self.inner
            .writer
            .write(move |ctx| commands::tokens::revoke(ctx, &id))
            .await
    }

    /// The live token a presented token text stands for, if any.
    pub async fn authenticate(&self, presented: &str) -> Result<Option<Token>> {
        let presented = presented.to_owned();
        self.inner
            .reader
            .read(move |conn| commands::tokens::authenticate(conn, &presented))
            .await
    }

    /// Records that a token was used now.
    pub async fn touch_token(&self, id: &str) -> Result<()> {
        let id = id.to_owned();
        self.inner
            .writer
            .write(move |ctx| rows::tokens::touch(ctx.conn, &id, ctx.now))
            .await
    }

    /// Appends to the audit log (`seq` and `at` are set by the store).
    pub async fn record_audit(&self, entry: AuditEntry) -> Result<()> {
        self.inner
            .writer
            .write(move |ctx| rows::audit::insert(ctx.conn, &entry, ctx.now))
            .await
    }

    /// The newest audit entries, of one namespace or of all, before sequence number `before`.
    pub async fn audit(
        &self,
        namespace: Option<String>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<AuditEntry>> {
        self.inner
            .reader
            .read(move |conn| rows::audit::list(conn, namespace.as_deref(), before, limit))
            .await
    }

    /// Checks that the database answers.
    pub async fn ping(&self) -> Result<()> {
        self.inner.reader.read(rows::ping).await
    }

    /// One page of jobs for browsing, newest first (see `browse.rs`).
    pub async fn browse_jobs(&self, search: JobSearch) -> Result<Vec<JobLine>> {
        self.inner
            .reader
            .read(move |conn| browse::jobs(conn, &search))
            .await
    }

    /// Jobs per status under a browsing filter (its status and cursor aside), each counted up
    /// to `cap`.
    pub async fn job_counts(&self, search: JobSearch, cap: u64) -> Result<Vec<StatusCount>> {
        self.inner
            .reader
            .read(move |conn| browse::status_counts(conn, &search, cap))
            .await
    }

    /// The workers holding running tasks in a namespace, per queue.
    pub async fn worker_loads(&self, namespace: &str) -> Result<Vec<WorkerLoad>> {
        let namespace = namespace.to_owned();
        self.inner
            .reader
            .read(move |conn| browse::worker_loads(conn, &namespace))
            .await
    }
}

/// A stored queue as it dispatches, given its namespace's prefix settings.
fn queue_info(
    mut queue: StoredQueue,
    stats: QueueStats,
    prefixes: &[StoredQueuePrefix],
) -> QueueInfo {
    let (config, from) = commands::settings_of(&queue.name, Some(&queue), prefixes);
    let settings_from = from.map(str::to_owned);
    queue.config = config;
    QueueInfo {
        queue,
        settings_from,
        stats,
    }
}

#[cfg(test)]
mod tests;
