//! [`TaskContext`]: what a handler gets for one leased task — the task's fields, a cancellation
//! signal and a way to attach progress to heartbeats.

use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use starbridge_api::LeasedTask;
use tokio::sync::watch;

/// A one-way flag that can be awaited: once set it stays set.
#[derive(Debug, Clone)]
pub(crate) struct Signal(Arc<watch::Sender<bool>>);

impl Signal {
    pub(crate) fn new() -> Self {
        Signal(Arc::new(watch::Sender::new(false)))
    }

    pub(crate) fn set(&self) {
        self.0.send_replace(true);
    }

    pub(crate) fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the flag is set.
    pub(crate) async fn wait(&self) {
        let mut receiver = self.0.subscribe();
        // Only fails when the sender is gone, and `self` holds it.
        let _ = receiver.wait_for(|set| *set).await;
    }
}

/// One leased task, as seen by the handler running it. Cheap to clone.
///
/// Besides the task's fields it carries:
/// - a **cancellation** signal ([`TaskContext::is_cancelled`], [`TaskContext::cancelled`]), set
///   when the lease was lost (a heartbeat got `409`: the server gave the task away, and whatever
///   the handler returns is not reported) or when the worker abandons the task at the end of its
///   shutdown grace period. A handler should stop soon after.
/// - a **shutdown** signal ([`TaskContext::is_shutting_down`], [`TaskContext::shutting_down`]),
///   set when the worker starts shutting down. The handler may keep going until the grace period
///   ends, or return early (e.g. [`crate::Outcome::CheckLater`] with progress).
#[derive(Debug, Clone)]
pub struct TaskContext {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    task: LeasedTask,
    /// Set for this task only: lease lost, or [`TaskContext::cancel`].
    cancelled: Signal,
    /// Shared by the worker's tasks: set when running tasks are abandoned.
    abandoned: Signal,
    /// Shared by the worker's tasks: set when shutdown starts.
    shutdown: Signal,
    /// Progress to send with the next heartbeats.
    progress: Mutex<Option<Value>>,
    /// The largest output the server takes, when its poll answer said.
    max_output_bytes: Option<u64>,
}

impl TaskContext {
    /// A context for `task`, not attached to any worker: for testing handlers.
    pub fn new(task: LeasedTask) -> Self {
        TaskContext::attached(task, Signal::new(), Signal::new(), None)
    }

    /// Like [`TaskContext::new`], with the server's output size limit: for testing handlers.
    pub fn with_max_output_bytes(task: LeasedTask, max_output_bytes: u64) -> Self {
        TaskContext::attached(task, Signal::new(), Signal::new(), Some(max_output_bytes))
    }

    pub(crate) fn attached(
        task: LeasedTask,
        abandoned: Signal,
        shutdown: Signal,
        max_output_bytes: Option<u64>,
    ) -> Self {
        TaskContext {
            inner: Arc::new(Inner {
                task,
                cancelled: Signal::new(),
                abandoned,
                shutdown,
                progress: Mutex::new(None),
                max_output_bytes,
            }),
        }
    }

    /// The largest output the server takes, as compact JSON bytes (from its poll answer): the
    /// worker fails a larger output for good rather than report it.
    pub fn max_output_bytes(&self) -> Option<u64> {
        self.inner.max_output_bytes
    }

    /// The leased task as the server sent it.
    pub fn task(&self) -> &LeasedTask {
        &self.inner.task
    }

    /// The task id (`tsk_…`).
    pub fn id(&self) -> &str {
        &self.inner.task.id
    }

    /// The job the task belongs to (`job_…`).
    pub fn job_id(&self) -> &str {
        &self.inner.task.job_id
    }

    /// The workflow step id.
    pub fn step(&self) -> &str {
        &self.inner.task.step
    }

    /// The queue the task was polled from.
    pub fn queue(&self) -> &str {
        &self.inner.task.queue
    }

    /// The step's command.
    pub fn command(&self) -> &str {
        &self.inner.task.command
    }

    /// The task's input.
    pub fn input(&self) -> &Value {
        &self.inner.task.input
    }

    /// The attempt number, from 1.
    pub fn attempt(&self) -> u32 {
        self.inner.task.attempt
    }

    /// A key stable across the attempts of this task: pass it to external systems so a retried
    /// attempt does not repeat a side effect.
    pub fn idempotency_key(&self) -> &str {
        &self.inner.task.idempotency_key
    }

    /// The attempt's callback token: hand it to another system that will finish the attempt
    /// (`POST /api/v1/callbacks/{token}/complete` or `/fail`, no API token needed), then return
    /// [`crate::Outcome::AwaitCallback`]. A secret: do not log it.
    pub fn callback_token(&self) -> &str {
        &self.inner.task.callback_token
    }

    /// The attempt's W3C `traceparent`, while the server exports traces: spans a handler makes
    /// belong under it (the HTTP executor sends it as the `traceparent` header, the shell
    /// executor as the `TRACEPARENT` variable).
    pub fn traceparent(&self) -> Option<&str> {
        self.inner.task.traceparent.as_deref()
    }

    /// Progress recorded by an earlier check-later of this attempt, if any.
    pub fn progress(&self) -> Option<&Value> {
        self.inner.task.progress.as_ref()
    }

    /// Sets the progress sent with the following heartbeats.
    pub fn set_progress(&self, progress: Value) {
        *self
            .inner
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(progress);
    }

    pub(crate) fn heartbeat_progress(&self) -> Option<Value> {
        self.inner
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// True once the task is cancelled (lease lost, or abandoned at shutdown).
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.is_set() || self.inner.abandoned.is_set()
    }

    /// Resolves once the task is cancelled (lease lost, or abandoned at shutdown).
    pub async fn cancelled(&self) {
        tokio::select! {
            () = self.inner.cancelled.wait() => {}
            () = self.inner.abandoned.wait() => {}
        }
    }

    /// Cancels the task, as the worker does when the lease is lost. Useful in handler tests.
    pub fn cancel(&self) {
        self.inner.cancelled.set();
    }

    /// True when the task itself was cancelled (lease lost), as opposed to abandoned at shutdown.
    pub(crate) fn lease_lost(&self) -> bool {
        self.inner.cancelled.is_set()
    }

    /// True once the worker is shutting down.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutdown.is_set()
    }

    /// Resolves once the worker starts shutting down.
    pub async fn shutting_down(&self) {
        self.inner.shutdown.wait().await;
    }
}
