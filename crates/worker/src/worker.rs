//! The worker loop: polls the server for tasks of its queues, runs each with the registered
//! handler (bounded concurrency), keeps its lease alive with heartbeats, reports the outcome
//! (retrying while the server is unreachable) and shuts down gracefully.
//!
//! The guarantees are documented on [`Worker`].

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::convert::Infallible;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use starbridge_api::{
    AwaitCallbackRequest, CheckLaterRequest, CompleteRequest, FailRequest, HeartbeatRequest,
    LeasedTask, PollRequest, PollResponse, ReportedError,
};
use starbridge_core::limits::json_exceeds;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinError, JoinHandle, JoinSet};
use tokio::time::Instant;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::completions::{Carrying, Completions};
use crate::context::{Signal, TaskContext};
use crate::outcome::{Handler, HandlerResult, Outcome};
use crate::{Client, Error};

/// The most tasks the server hands out per poll; a worker with more free slots asks for this
/// many and polls again.
pub(crate) const MAX_TASKS_PER_POLL: u32 = 256;

/// How long a poll may be held by the server when no task is ready.
pub const DEFAULT_POLL_WAIT: Duration = Duration::from_secs(20);
/// How long [`Worker::run`] waits for running handlers after shutdown is requested.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How many handlers run at once unless configured.
pub const DEFAULT_CONCURRENCY: usize = 4;
/// First delay before retrying a failed poll or report.
pub const DEFAULT_RETRY_INITIAL: Duration = Duration::from_millis(100);
/// Longest delay between retries of a failed poll or report.
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(5);

/// The shortest interval between heartbeats of a task.
const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(100);
/// The longest interval between heartbeats of a task, whatever its lease: an operator's stop (a
/// requeue, a fail by hand) reaches the handler within it.
const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);

/// A worker configuration that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("the worker polls no queue: name them with .queues(…) or register handlers")]
    NoQueues,
    #[error("concurrency must be at least 1")]
    ZeroConcurrency,
    #[error("the worker id must not be empty")]
    EmptyWorkerId,
    #[error("a handler is registered for queue {0:?}, which is not among the queues polled")]
    QueueNotPolled(String),
}

/// The handlers of one queue (or of every queue, for commands such as `http`).
#[derive(Default)]
struct QueueHandlers {
    commands: HashMap<String, Arc<dyn Handler>>,
    fallback: Option<Arc<dyn Handler>>,
}

/// Configures a [`Worker`]; start with [`Worker::builder`].
pub struct WorkerBuilder {
    client: Client,
    worker_id: Option<String>,
    queues: Option<Vec<String>>,
    namespace: Option<String>,
    concurrency: usize,
    poll_wait: Duration,
    shutdown_grace: Duration,
    retry_initial: Duration,
    retry_max: Duration,
    batch_completions: bool,
    handlers: HashMap<String, QueueHandlers>,
    /// Handlers by command, on every queue polled.
    everywhere: HashMap<String, Arc<dyn Handler>>,
}

impl WorkerBuilder {
    /// The id the worker polls as (shown on tasks). Default: `<hostname>-<pid>`.
    pub fn worker_id(mut self, worker_id: impl Into<String>) -> Self {
        self.worker_id = Some(worker_id.into());
        self
    }

    /// The queues to poll. Default: the queues handlers are registered for.
    pub fn queues<I, S>(mut self, queues: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.queues = Some(queues.into_iter().map(Into::into).collect());
        self
    }

    /// The namespace to poll in; the server's default namespace when not set.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// How many handlers may run at once (default 4).
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// How long the server may hold a poll when no task is ready (default 20 s).
    pub fn poll_wait(mut self, wait: Duration) -> Self {
        self.poll_wait = wait;
        self
    }

    /// Reports successes that do not ride on a poll in batches (`POST
    /// /api/v1/tasks/complete`, default off): those that finish while a report is in flight go
    /// together in the next request. Fewer requests for many short tasks; each report is still
    /// retried and answered on its own. Needs a server with the batch endpoint. (Successes go
    /// with the next poll whenever one is coming soon, batched or not.)
    pub fn batch_completions(mut self, batch: bool) -> Self {
        self.batch_completions = batch;
        self
    }

    /// How long shutdown waits for running handlers before abandoning them (default 30 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// The backoff between retries of failed polls and reports: from `initial`, doubling, capped
    /// at `max` (default 100 ms → 5 s).
    pub fn retry_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.retry_initial = initial;
        self.retry_max = max.max(initial);
        self
    }

    /// Runs tasks of `command` on `queue` with `handler` (an async closure
    /// `|task: TaskContext| async move { … }` or any [`Handler`]).
    pub fn handler(
        mut self,
        queue: impl Into<String>,
        command: impl Into<String>,
        handler: impl Handler,
    ) -> Self {
        self.handlers
            .entry(queue.into())
            .or_default()
            .commands
            .insert(command.into(), Arc::new(handler));
        self
    }

    /// Runs tasks of `command` on every queue polled with `handler`, unless the queue has a
    /// handler of its own for the command; before any queue's fallback. The built-in worker
    /// runs `http` steps' tasks this way ([`crate::http::HttpExecutor`]), picking the executor
    /// from the task rather than from the queue's name.
    pub fn command(mut self, command: impl Into<String>, handler: impl Handler) -> Self {
        self.everywhere.insert(command.into(), Arc::new(handler));
        self
    }

    /// Runs tasks of `queue` whose command has no handler of its own with `handler` (e.g. a
    /// [`crate::shell::ShellExecutor`]).
    pub fn fallback(mut self, queue: impl Into<String>, handler: impl Handler) -> Self {
        self.handlers.entry(queue.into()).or_default().fallback = Some(Arc::new(handler));
        self
    }

    /// Checks the configuration and makes the worker.
    pub fn build(self) -> Result<Worker, BuildError> {
        if self.concurrency == 0 {
            return Err(BuildError::ZeroConcurrency);
        }
        let worker_id = self.worker_id.unwrap_or_else(default_worker_id);
        if worker_id.trim().is_empty() {
            return Err(BuildError::EmptyWorkerId);
        }
        let queues = match self.queues {
            Some(queues) => {
                if let Some(queue) = self.handlers.keys().find(|q| !queues.contains(q)) {
                    return Err(BuildError::QueueNotPolled(queue.clone()));
                }
                queues
            }
            None => {
                let mut queues: Vec<String> = self.handlers.keys().cloned().collect();
                queues.sort();
                queues
            }
        };
        if queues.is_empty() {
            return Err(BuildError::NoQueues);
        }
        Ok(Worker {
            shared: Arc::new(Shared {
                completions: Completions::new(self.client.clone(), self.batch_completions),
                client: self.client,
                worker_id,
                handlers: self.handlers,
                everywhere: self.everywhere,
                retry_initial: self.retry_initial,
                retry_max: self.retry_max,
                abandoned: Signal::new(),
                shutdown: Signal::new(),
            }),
            queues,
            namespace: self.namespace,
            concurrency: self.concurrency,
            poll_wait: self.poll_wait,
            shutdown_grace: self.shutdown_grace,
        })
    }
}

/// `<hostname>-<pid>`, or `worker-<pid>` when the host name is unknown.
fn default_worker_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "worker".to_owned());
    format!("{host}-{}", std::process::id())
}

/// What the worker's tasks share.
struct Shared {
    client: Client,
    /// How successes are reported: with the next poll, or on their own.
    completions: Arc<Completions>,
    worker_id: String,
    handlers: HashMap<String, QueueHandlers>,
    everywhere: HashMap<String, Arc<dyn Handler>>,
    retry_initial: Duration,
    retry_max: Duration,
    /// Set when running tasks are abandoned at the end of the grace period.
    abandoned: Signal,
    /// Set when shutdown starts.
    shutdown: Signal,
}

impl Shared {
    fn handler_for(&self, queue: &str, command: &str) -> Option<Arc<dyn Handler>> {
        let handlers = self.handlers.get(queue);
        handlers
            .and_then(|handlers| handlers.commands.get(command))
            .or_else(|| self.everywhere.get(command))
            .or_else(|| handlers.and_then(|handlers| handlers.fallback.as_ref()))
            .cloned()
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(self.retry_initial, self.retry_max)
    }
}

/// Polls queues for tasks and runs them with the registered handlers.
///
/// # Delivery and shutdown semantics
///
/// - At most `concurrency` handlers run at once: the worker asks the server only for as many
///   tasks as it has free slots (`max_tasks`), long-polling up to `poll_wait` (default 20 s).
/// - Each running task is heartbeated every `lease_ms / 3` (at least 100 ms, at most 10 s, so that
///   an operator's requeue or fail stops the handler within 10 s). A heartbeat answered
///   `409` (or `404`) means the server took the task away: the task's [`TaskContext`] is
///   cancelled and whatever its handler returns is **not** reported.
/// - A success rides on the next poll (`complete` of the poll request), which the slot it frees
///   starts, so a busy worker makes one request per task: the poll commits it before claiming
///   more work and answers it. While the queue has a backlog, the loop lets the other handlers
///   that are ending end before it polls (it yields to the runtime while that frees slots), so
///   one poll carries a whole answer's quick successes. A success that finishes while a poll
///   is out (after the first 20 ms of it: the poll is then likely waiting for work), or that a
///   failed poll carried, is sent on its own (see [`WorkerBuilder::batch_completions`]); a server that refuses
///   `complete` in polls (it predates it) gets every success on its own.
/// - A report that fails with a transport error or a 5xx is retried with capped exponential
///   backoff until it is accepted, a 4xx comes back, or the lease has surely expired (then the
///   server retries the task). A `409` report is logged and dropped.
/// - A handler that panics is reported as a retryable failure naming the panic message. A task
///   whose (queue, command) has no handler (and no fallback for the queue) is reported as a
///   non-retryable failure.
/// - Poll errors are logged and retried with backoff; the loop never exits on its own.
/// - [`Worker::run`] stops when its shutdown future resolves: the worker stops polling (a poll in
///   flight is dropped; tasks the server leased to it in that instant are retried once their lease
///   expires), signals [`TaskContext::shutting_down`], waits up to the grace period (default 30 s)
///   for running handlers to finish and be reported, then **abandons** the rest: they are
///   cancelled and aborted without a report, their leases expire on the server, and the server
///   hands them out again (a new attempt). Handlers should therefore be idempotent (see
///   [`TaskContext::idempotency_key`]).
///
/// Heartbeats carry the progress last set with [`TaskContext::set_progress`].
pub struct Worker {
    shared: Arc<Shared>,
    queues: Vec<String>,
    namespace: Option<String>,
    concurrency: usize,
    poll_wait: Duration,
    shutdown_grace: Duration,
}

impl Worker {
    /// Starts configuring a worker that talks to the server through `client`.
    pub fn builder(client: Client) -> WorkerBuilder {
        WorkerBuilder {
            client,
            worker_id: None,
            queues: None,
            namespace: None,
            concurrency: DEFAULT_CONCURRENCY,
            poll_wait: DEFAULT_POLL_WAIT,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            retry_initial: DEFAULT_RETRY_INITIAL,
            retry_max: DEFAULT_RETRY_MAX,
            batch_completions: false,
            handlers: HashMap::new(),
            everywhere: HashMap::new(),
        }
    }

    /// The id this worker polls as.
    pub fn worker_id(&self) -> &str {
        &self.shared.worker_id
    }

    /// The queues this worker polls.
    pub fn queues(&self) -> &[String] {
        &self.queues
    }

    /// Runs until `shutdown` resolves, then shuts down gracefully: stops polling, waits up to the
    /// grace period for running handlers (and their reports), and abandons those still running —
    /// their leases expire on the server, which then retries them.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let shared = &self.shared;
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let mut running: JoinSet<()> = JoinSet::new();
        let mut poll_backoff = shared.backoff();
        let wait_ms = u64::try_from(self.poll_wait.as_millis()).unwrap_or(u64::MAX);
        info!(
            worker_id = %shared.worker_id,
            queues = ?self.queues,
            concurrency = self.concurrency,
            "worker started"
        );

        // Polls in flight: one at a time, and beside a poll waiting for work, one that does not
        // wait, for the successes that would otherwise wait behind it (see `completions`). Those
        // that finish while it is out go together on the next one.
        let mut polls: JoinSet<PollDone> = JoinSet::new();
        // After a failed poll, none is sent before this instant.
        let mut backing_off: Option<Instant> = None;
        loop {
            while let Some(joined) = running.try_join_next() {
                log_supervisor_end(joined);
            }
            let polling = !polls.is_empty();
            let resting = backing_off.is_some();
            // Wait for a free slot (or a success that wants a poll of its own), then take every
            // other free one: poll for that many tasks.
            let first = tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(done) = polls.join_next() => {
                    let Ok(done) = done else {
                        shared.completions.poll_lost();
                        continue;
                    };
                    match take_answer(shared, done, &mut running) {
                        PollEnd::Answered => poll_backoff.reset(),
                        PollEnd::Again => {}
                        PollEnd::Failed(error) => {
                            let delay = poll_backoff.next_delay();
                            if error.is_retryable() {
                                warn!(error = %error_chain(&error), retry_in = ?delay, "poll failed");
                            } else {
                                error!(error = %error_chain(&error), retry_in = ?delay, "poll failed; retrying (is the worker configured right?)");
                            }
                            backing_off = Some(Instant::now() + delay);
                        }
                    }
                    continue;
                }
                () = tokio::time::sleep_until(backing_off.unwrap_or_else(Instant::now)), if resting => {
                    backing_off = None;
                    shared.completions.polling_again();
                    continue;
                }
                permit = Arc::clone(&slots).acquire_owned(), if !polling && !resting => match permit {
                    Ok(permit) => permit,
                    Err(_closed) => break,
                },
                () = shared.completions.poll_wanted(), if polls.len() == 1 && !resting => {
                    if !shared.completions.waiting_for_poll() {
                        continue;
                    }
                    match Arc::clone(&slots).try_acquire_owned() {
                        Ok(permit) => permit,
                        Err(_) => continue,
                    }
                }
            };
            let settle = shared.completions.backlog_found();
            let permits = take_free_slots(&slots, first, self.concurrency, settle).await;
            let carrying = shared.completions.poll_sent(!polling);
            let request = PollRequest {
                worker_id: shared.worker_id.clone(),
                queues: self.queues.clone(),
                max_tasks: Some(
                    u32::try_from(permits.len())
                        .unwrap_or(u32::MAX)
                        .min(MAX_TASKS_PER_POLL),
                ),
                // Beside a poll waiting for work, this one carries successes and takes what is
                // ready: it does not wait too (each waiting poll claims again on every wake-up).
                wait_ms: Some(if polling { 0 } else { wait_ms }),
                namespace: self.namespace.clone(),
                complete: carrying.tasks(),
            };
            let shared = Arc::clone(shared);
            polls.spawn(async move {
                let polled = shared.client.poll(&request).await;
                PollDone {
                    permits,
                    carrying,
                    polled,
                }
            });
        }
        polls.abort_all();

        shared.completions.polling_stopped();
        shared.shutdown.set();
        if !running.is_empty() {
            info!(
                running = running.len(),
                grace = ?self.shutdown_grace,
                "shutting down: waiting for running tasks"
            );
        }
        let drained = tokio::time::timeout(self.shutdown_grace, async {
            while let Some(joined) = running.join_next().await {
                log_supervisor_end(joined);
            }
        })
        .await;
        if drained.is_err() {
            warn!(
                abandoned = running.len(),
                "shutdown grace period over: abandoning running tasks; their leases will \
                 expire and the server will retry them"
            );
            shared.abandoned.set();
            running.abort_all();
            while let Some(joined) = running.join_next().await {
                log_supervisor_end(joined);
            }
        }
        info!(worker_id = %shared.worker_id, "worker stopped");
    }
}

/// How many times in a row the poll loop yields to the runtime without a slot coming free
/// before it polls with the slots it holds (see [`take_free_slots`]).
const QUIET_YIELDS: usize = 3;

/// The slots a poll asks tasks for: `first` and every other free one; with `settle`, taken
/// once the tasks that are ending have ended.
///
/// While the queue has a backlog (`settle`), the handlers of one poll's answer often end
/// together (quick ones within microseconds of each other), and a poll sent at the first free
/// slot would carry the first few successes and ask for that many tasks while the rest wait a
/// whole poll for the next. So while yielding to the runtime (which runs every task ready to
/// run) frees more slots, the loop yields again; it stops when every slot (`all`) is free or
/// after [`QUIET_YIELDS`] yields that freed none. Costs no timer and no wait for a handler
/// still at work. Without a backlog the poll goes at once: it is likely to wait for work, and
/// the successes that end meanwhile go on a poll of their own that does not (see
/// `completions`).
async fn take_free_slots(
    slots: &Arc<Semaphore>,
    first: OwnedSemaphorePermit,
    all: usize,
    settle: bool,
) -> Vec<OwnedSemaphorePermit> {
    let mut permits = vec![first];
    let mut quiet = 0;
    loop {
        let before = permits.len();
        while let Ok(permit) = Arc::clone(slots).try_acquire_owned() {
            permits.push(permit);
        }
        if !settle || permits.len() >= all {
            return permits;
        }
        quiet = if permits.len() == before {
            quiet + 1
        } else {
            0
        };
        if quiet > QUIET_YIELDS {
            return permits;
        }
        tokio::task::yield_now().await;
    }
}

/// A poll that came back: the slots it asked tasks for, the successes it carried, its answer.
struct PollDone {
    permits: Vec<OwnedSemaphorePermit>,
    carrying: Carrying,
    polled: Result<PollResponse, Error>,
}

/// What the poll loop does after a poll came back.
enum PollEnd {
    /// Answered: its tasks run.
    Answered,
    /// Refused for the successes it carried (the server predates them): poll again at once.
    Again,
    /// Failed: back off before the next poll.
    Failed(Error),
}

/// Answers the successes a poll carried and starts the tasks it leased, each in a slot it asked
/// for (the slots left over are freed).
fn take_answer(shared: &Arc<Shared>, done: PollDone, running: &mut JoinSet<()>) -> PollEnd {
    let PollDone {
        mut permits,
        carrying,
        polled,
    } = done;
    let response = match polled {
        Ok(response) => response,
        Err(error) => {
            drop(permits);
            if shared.completions.poll_failed(carrying, &error) {
                return PollEnd::Again;
            }
            return PollEnd::Failed(error);
        }
    };
    let received = Instant::now();
    // Every task it asked for: the queue had a backlog.
    let asked = permits.len().min(MAX_TASKS_PER_POLL as usize);
    let backlog = response.tasks.len() >= asked;
    shared
        .completions
        .poll_answered(carrying, response.reports, backlog);
    if !response.tasks.is_empty() {
        debug!(tasks = response.tasks.len(), "polled");
    }
    let max_output_bytes = Some(response.max_output_bytes).filter(|bytes| *bytes > 0);
    for task in response.tasks {
        let Some(permit) = permits.pop() else {
            warn!(
                task_id = %task.id,
                "the server sent more tasks than asked for; leaving this one to expire and be retried"
            );
            continue;
        };
        let leased = Leased {
            task,
            received,
            max_output_bytes,
        };
        running.spawn(run_task(Arc::clone(shared), leased, permit));
    }
    PollEnd::Answered
}

/// Formats an error with its chain of causes, for logs (`error: cause: cause`).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Logs a task supervisor that panicked (a bug); aborted ones end quietly.
fn log_supervisor_end(joined: Result<(), JoinError>) {
    match joined {
        Err(error) if error.is_panic() => error!(error = %error, "a task supervisor panicked"),
        _ => {}
    }
}

/// Aborts a spawned task when dropped, so an abandoned supervisor takes its handler along.
pub(crate) struct AbortOnDrop<T>(pub(crate) JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A task as the poll answer handed it out.
struct Leased {
    task: LeasedTask,
    /// When the poll answer came (the lease lasts at most `lease_ms` from then).
    received: Instant,
    /// The server's output size limit, from the poll answer.
    max_output_bytes: Option<u64>,
}

/// Runs one leased task to its report; holds a concurrency slot (`slot`) until then, or until
/// its success is handed to the next poll.
async fn run_task(shared: Arc<Shared>, leased: Leased, slot: OwnedSemaphorePermit) {
    let task = &leased.task;
    let span = info_span!(
        "task",
        task_id = %task.id,
        job_id = %task.job_id,
        step = %task.step,
        command = %task.command,
        attempt = task.attempt,
    );
    supervise(&shared, leased, Some(slot))
        .instrument(span)
        .await;
}

async fn supervise(shared: &Shared, leased: Leased, mut slot: Option<OwnedSemaphorePermit>) {
    let lease = Duration::from_millis(leased.task.lease_ms);
    // The latest instant the lease may last to: the server set (or extended) it to at most
    // "when we got its answer + lease".
    let lease_end = Mutex::new(leased.received + lease);
    let context = TaskContext::attached(
        leased.task,
        shared.abandoned.clone(),
        shared.shutdown.clone(),
        leased.max_output_bytes,
    );
    let result = match shared.handler_for(context.queue(), context.command()) {
        None => {
            let message = format!(
                "no handler for command {} on queue {} in worker {}",
                context.command(),
                context.queue(),
                shared.worker_id
            );
            warn!("{message}");
            Outcome::fail_permanently(message).into()
        }
        Some(handler) => {
            debug!("running");
            let handler_context = context.clone();
            // Spawned (not awaited in place) so that a panic is caught as a JoinError.
            let mut handle =
                AbortOnDrop(tokio::spawn(
                    async move { handler.call(handler_context).await },
                ));
            tokio::select! {
                joined = &mut handle.0 => handler_result(joined),
                never = heartbeat(shared, &context, lease, &lease_end) => match never {},
            }
        }
    };
    if context.lease_lost() {
        info!("the lease was lost while running; the outcome is not reported");
        return;
    }
    let result = within_output_limit(result, context.max_output_bytes());
    report(shared, &context, result, &lease_end, &mut slot).await;
}

/// The result, or a non-retryable failure when its output is larger than the server takes
/// (reported, it would be refused, and the task would lapse and run again to no end).
fn within_output_limit(result: HandlerResult, limit: Option<u64>) -> HandlerResult {
    let Some(limit) = limit.and_then(|limit| usize::try_from(limit).ok()) else {
        return result;
    };
    match &result.outcome {
        Outcome::Complete(output) if json_exceeds(output, limit) => {
            let message = format!(
                "the output is larger than the server's task size limit of {limit} bytes (max_task_bytes): return less, or keep large results elsewhere and return a reference"
            );
            warn!("{message}");
            HandlerResult {
                outcome: Outcome::fail_permanently(message),
                logs: result.logs,
            }
        }
        _ => result,
    }
}

/// The handler's result, or a retryable failure when it panicked.
fn handler_result(joined: Result<HandlerResult, JoinError>) -> HandlerResult {
    match joined {
        Ok(result) => result,
        Err(error) if error.is_panic() => {
            let payload = error.into_panic();
            let message = payload
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic payload".to_owned());
            warn!(panic = %message, "the handler panicked");
            Outcome::fail(format!("handler panicked: {message}")).into()
        }
        Err(_) => Outcome::fail("the handler was cancelled").into(),
    }
}

/// Extends the lease every `lease / 3` (at most every 10 s) until dropped. On `409`/`404` cancels
/// the task and stops.
async fn heartbeat(
    shared: &Shared,
    context: &TaskContext,
    lease: Duration,
    lease_end: &Mutex<Instant>,
) -> Infallible {
    let interval = heartbeat_interval(lease);
    let timeout = interval.clamp(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        tokio::time::sleep(interval).await;
        let request = HeartbeatRequest {
            lease_token: context.task().lease_token.clone(),
            progress: context.heartbeat_progress(),
        };
        let sent = shared
            .client
            .heartbeat_within(context.id(), &request, timeout)
            .await;
        match sent {
            Ok(_) => {
                extend_lease_end(lease_end, Instant::now() + lease);
                debug!("heartbeat");
            }
            Err(Error::Conflict(detail) | Error::NotFound(detail)) => {
                warn!(%detail, "the lease was lost; cancelling the task");
                context.cancel();
                return std::future::pending().await;
            }
            Err(error) => {
                // The server may have extended the lease even though we got no good answer.
                if matches!(error, Error::Server { .. } | Error::Decode { .. })
                    || (error.is_retryable() && !error.surely_not_delivered())
                {
                    extend_lease_end(lease_end, Instant::now() + lease);
                }
                warn!(error = %error_chain(&error), "heartbeat failed");
            }
        }
    }
}

/// How often a task on `lease` is heartbeated: a third of the lease, within 100 ms and 10 s.
fn heartbeat_interval(lease: Duration) -> Duration {
    (lease / 3).clamp(MIN_HEARTBEAT_INTERVAL, MAX_HEARTBEAT_INTERVAL)
}

fn extend_lease_end(lease_end: &Mutex<Instant>, until: Instant) {
    let mut end = lease_end.lock().unwrap_or_else(PoisonError::into_inner);
    if until > *end {
        *end = until;
    }
}

/// A report ready to send.
enum Report {
    Complete(CompleteRequest),
    Fail(FailRequest),
    CheckLater(CheckLaterRequest),
    AwaitCallback(AwaitCallbackRequest),
}

impl Report {
    fn new(lease_token: String, result: HandlerResult) -> Self {
        let HandlerResult { outcome, logs } = result;
        match outcome {
            Outcome::Complete(output) => Report::Complete(CompleteRequest {
                lease_token,
                output,
                logs,
            }),
            Outcome::Fail {
                message,
                retryable,
                retry_after,
            } => Report::Fail(FailRequest {
                lease_token,
                error: ReportedError {
                    message,
                    retryable,
                    retry_after_ms: retry_after
                        .map(|after| u64::try_from(after.as_millis()).unwrap_or(u64::MAX)),
                },
                logs,
            }),
            Outcome::CheckLater { after, progress } => Report::CheckLater(CheckLaterRequest {
                lease_token,
                after_ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
                progress,
            }),
            Outcome::AwaitCallback { timeout } => Report::AwaitCallback(AwaitCallbackRequest {
                lease_token,
                timeout_ms: timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            }),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Report::Complete(_) => "complete",
            Report::Fail(_) => "fail",
            Report::CheckLater(_) => "check-later",
            Report::AwaitCallback(_) => "await-callback",
        }
    }
}

/// Sends the report, retrying transport errors and 5xx until the lease has surely expired. A
/// success handed to the next poll gives up `slot`.
async fn report(
    shared: &Shared,
    context: &TaskContext,
    result: HandlerResult,
    lease_end: &Mutex<Instant>,
    slot: &mut Option<OwnedSemaphorePermit>,
) {
    let report = Report::new(context.task().lease_token.clone(), result);
    let kind = report.kind();
    if let Report::Fail(request) = &report {
        info!(
            message = %request.error.message,
            retryable = request.error.retryable,
            "the task failed"
        );
    }
    let mut backoff = shared.backoff();
    loop {
        let client = &shared.client;
        let sent = match &report {
            Report::Complete(request) => {
                let completions = &shared.completions;
                completions.complete(context.id(), request, slot).await
            }
            Report::Fail(request) => client.fail(context.id(), request).await,
            Report::CheckLater(request) => client.check_later(context.id(), request).await,
            Report::AwaitCallback(request) => client.await_callback(context.id(), request).await,
        };
        let error = match sent {
            Ok(response) => {
                info!(
                    report = kind,
                    task_status = %response.task_status,
                    job_status = %response.job_status,
                    "reported"
                );
                return;
            }
            Err(error) => error,
        };
        match error {
            Error::Decode { .. } => {
                warn!(report = kind, error = %error_chain(&error), "reported, but the answer was unreadable");
                return;
            }
            Error::Conflict(detail) => {
                warn!(report = kind, %detail, "the lease is stale; the report is dropped");
                return;
            }
            Error::NotFound(detail) => {
                warn!(report = kind, %detail, "the server does not know the task; the report is dropped");
                return;
            }
            error if error.is_retryable() => {
                let now = Instant::now();
                let end = *lease_end.lock().unwrap_or_else(PoisonError::into_inner);
                if now >= end {
                    error!(
                        report = kind,
                        error = %error_chain(&error),
                        "giving up the report: the lease has expired, the server will retry the task"
                    );
                    return;
                }
                // Sleep at most until the lease ends, for one last try then.
                let delay = backoff.next_delay().min(end - now);
                warn!(report = kind, error = %error_chain(&error), retry_in = ?delay, "report failed");
                tokio::time::sleep(delay).await;
            }
            error => {
                error!(report = kind, error = %error_chain(&error), "the report was rejected");
                return;
            }
        }
    }
}

/// Capped exponential backoff with jitter (each delay is between half and all of the nominal one).
#[derive(Debug)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
    random: RandomState,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            current: initial,
            random: RandomState::new(),
        }
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let nominal = self.current;
        self.current = self.current.saturating_mul(2).min(self.max);
        let mut hasher = self.random.build_hasher();
        hasher.write_u128(nominal.as_nanos());
        let fraction = (hasher.finish() % 1000) as f64 / 1000.0;
        nominal.mul_f64(0.5 + fraction / 2.0)
    }

    pub(crate) fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One thread: the tasks run only when the poll loop yields.
    #[tokio::test(flavor = "current_thread")]
    async fn a_poll_takes_the_slots_of_tasks_ending_after_the_first() {
        let slots = Arc::new(Semaphore::new(8));
        let first = Arc::clone(&slots).acquire_owned().await.unwrap();
        let mut ending = Vec::new();
        for task in 0..7 {
            let permit = Arc::clone(&slots).acquire_owned().await.unwrap();
            ending.push(tokio::spawn(async move {
                // Each ends a little after the one before it.
                for _ in 0..task {
                    tokio::task::yield_now().await;
                }
                drop(permit);
            }));
        }
        let permits = take_free_slots(&slots, first, 8, true).await;
        assert_eq!(permits.len(), 8);
        for task in ending {
            task.await.unwrap();
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn without_a_backlog_a_poll_goes_with_the_slots_free_now() {
        let slots = Arc::new(Semaphore::new(3));
        let first = Arc::clone(&slots).acquire_owned().await.unwrap();
        let permit = Arc::clone(&slots).acquire_owned().await.unwrap();
        let ending = tokio::spawn(async move { drop(permit) });
        let permits = take_free_slots(&slots, first, 3, false).await;
        assert_eq!(permits.len(), 2);
        ending.await.unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_poll_does_not_wait_for_a_slot_whose_task_is_still_at_work() {
        let slots = Arc::new(Semaphore::new(4));
        let first = Arc::clone(&slots).acquire_owned().await.unwrap();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let held = Arc::clone(&slots).acquire_owned().await.unwrap();
        let at_work = tokio::spawn(async move {
            let _ = released.await;
            drop(held);
        });
        let permits = take_free_slots(&slots, first, 4, true).await;
        assert_eq!(permits.len(), 3);
        release.send(()).unwrap();
        at_work.await.unwrap();
    }

    #[test]
    fn heartbeats_come_every_third_of_the_lease_and_at_least_every_10_s() {
        assert_eq!(
            heartbeat_interval(Duration::from_secs(6)),
            Duration::from_secs(2)
        );
        assert_eq!(
            heartbeat_interval(Duration::from_secs(300)),
            Duration::from_secs(10)
        );
        assert_eq!(
            heartbeat_interval(Duration::from_millis(150)),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
        let delays: Vec<Duration> = (0..5).map(|_| backoff.next_delay()).collect();
        let nominal = [100, 200, 400, 400, 400];
        for (delay, nominal) in delays.iter().zip(nominal) {
            let nominal = Duration::from_millis(nominal);
            assert!(
                *delay >= nominal / 2 && *delay <= nominal,
                "{delay:?} vs {nominal:?}"
            );
        }
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn an_output_larger_than_the_server_takes_fails_for_good_keeping_the_logs() {
        let big = Outcome::complete(serde_json::json!({"data": "x".repeat(100)}))
            .with_logs(serde_json::json!({"stdout": "ran"}));
        let judged = within_output_limit(big.clone(), Some(50));
        assert!(
            matches!(&judged.outcome, Outcome::Fail { retryable: false, message, .. } if message.contains("max_task_bytes")),
            "{judged:?}"
        );
        assert_eq!(judged.logs, big.logs);
        assert_eq!(within_output_limit(big.clone(), Some(10_000)), big);
        assert_eq!(
            within_output_limit(big.clone(), None),
            big,
            "no limit known"
        );
    }

    #[test]
    fn a_command_handler_serves_every_queue_before_its_fallback_but_after_its_own() {
        let client = Client::new("http://127.0.0.1:1").expect("valid url");
        let noop = |_task: TaskContext| async { Outcome::complete(serde_json::json!({})) };
        let worker = Worker::builder(client)
            .queues(["a", "b"])
            .handler("a", "http", noop)
            .command("http", noop)
            .fallback("a", noop)
            .fallback("b", noop)
            .build()
            .expect("valid worker");
        let shared = &worker.shared;
        let own = shared.handlers["a"].commands["http"].clone();
        let everywhere = shared.everywhere["http"].clone();
        let fallback_b = shared.handlers["b"].fallback.clone().unwrap();
        let same = |a: &Arc<dyn Handler>, b: &Arc<dyn Handler>| Arc::ptr_eq(a, b);
        assert!(same(&shared.handler_for("a", "http").unwrap(), &own));
        assert!(same(&shared.handler_for("b", "http").unwrap(), &everywhere));
        assert!(same(
            &shared.handler_for("b", "other").unwrap(),
            &fallback_b
        ));
        assert!(shared.handler_for("c", "other").is_none());
        assert!(same(&shared.handler_for("c", "http").unwrap(), &everywhere));
    }

    #[test]
    fn build_rejects_unusable_configurations() {
        let client = Client::new("http://127.0.0.1:1").expect("valid url");
        let noop = |_task: TaskContext| async { Outcome::complete(serde_json::json!({})) };
        assert!(matches!(
            Worker::builder(client.clone()).build(),
            Err(BuildError::NoQueues)
        ));
        assert!(matches!(
            Worker::builder(client.clone())
                .handler("q", "c", noop)
                .concurrency(0)
                .build(),
            Err(BuildError::ZeroConcurrency)
        ));
        assert!(matches!(
            Worker::builder(client.clone())
                .queues(["other"])
                .handler("q", "c", noop)
                .build(),
            Err(BuildError::QueueNotPolled(queue)) if queue == "q"
        ));
        let worker = Worker::builder(client)
            .handler("b", "c", noop)
            .fallback("a", noop)
            .build()
            .expect("valid worker");
        assert_eq!(worker.queues(), ["a", "b"]);
        assert!(!worker.worker_id().is_empty());
    }
}
