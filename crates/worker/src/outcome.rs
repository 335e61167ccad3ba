//! What a handler returns ([`Outcome`], [`HandlerResult`]) and the [`Handler`] trait that
//! closures and built-in executors implement.

use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::Value;

use crate::context::TaskContext;

/// A boxed, sendable future, as returned by [`Handler::call`].
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// How a task attempt ended, as reported to the server.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The task succeeded with this output (`POST /tasks/{id}/complete`).
    Complete(Value),
    /// The attempt failed (`POST /tasks/{id}/fail`). A retryable failure is tried again while
    /// the step has attempts left, after the step's backoff or `retry_after` when that is longer
    /// (a called service's `Retry-After`); a non-retryable one fails the step at once.
    Fail {
        message: String,
        retryable: bool,
        retry_after: Option<Duration>,
    },
    /// Not done yet: the server hands the task out again `after` this long, with `progress`
    /// available as [`TaskContext::progress`] (`POST /tasks/{id}/check-later`).
    CheckLater {
        after: Duration,
        progress: Option<Value>,
    },
    /// The work was handed to another system, which finishes the attempt through the task's
    /// callback token ([`TaskContext::callback_token`]): the worker lets go of the task, which
    /// waits holding no worker for at most `timeout` (`None`: the step's per-attempt timeout)
    /// after the last callback heartbeat (`POST /tasks/{id}/await-callback`).
    AwaitCallback { timeout: Option<Duration> },
}

impl Outcome {
    /// [`Outcome::Complete`] with `output`.
    pub fn complete(output: Value) -> Self {
        Outcome::Complete(output)
    }

    /// A retryable [`Outcome::Fail`].
    pub fn fail(message: impl Into<String>) -> Self {
        Outcome::Fail {
            message: message.into(),
            retryable: true,
            retry_after: None,
        }
    }

    /// A non-retryable [`Outcome::Fail`]: the step fails without further attempts.
    pub fn fail_permanently(message: impl Into<String>) -> Self {
        Outcome::Fail {
            message: message.into(),
            retryable: false,
            retry_after: None,
        }
    }

    /// [`Outcome::CheckLater`] without progress.
    pub fn check_later(after: Duration) -> Self {
        Outcome::CheckLater {
            after,
            progress: None,
        }
    }

    /// [`Outcome::AwaitCallback`]: another system finishes the attempt.
    pub fn await_callback(timeout: Option<Duration>) -> Self {
        Outcome::AwaitCallback { timeout }
    }

    /// This outcome with logs attached (sent with complete and fail reports).
    pub fn with_logs(self, logs: Value) -> HandlerResult {
        HandlerResult {
            outcome: self,
            logs: Some(logs),
        }
    }
}

/// An [`Outcome`] plus optional logs. The server stores the logs with the task for complete and
/// fail reports; a check-later report has no logs field, so logs given with
/// [`Outcome::CheckLater`] are not sent.
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerResult {
    pub outcome: Outcome,
    pub logs: Option<Value>,
}

impl From<Outcome> for HandlerResult {
    fn from(outcome: Outcome) -> Self {
        HandlerResult {
            outcome,
            logs: None,
        }
    }
}

/// `Ok(output)` completes the task; `Err(e)` is a retryable failure with the message `{e:#}`
/// (the alternate form, which shows an `anyhow` error's causes).
impl<E: Display> From<Result<Value, E>> for HandlerResult {
    fn from(result: Result<Value, E>) -> Self {
        match result {
            Ok(output) => Outcome::Complete(output).into(),
            Err(error) => Outcome::fail(format!("{error:#}")).into(),
        }
    }
}

/// Something that runs tasks. Implemented by async closures
/// `|task: TaskContext| async move { … }` returning anything convertible into a
/// [`HandlerResult`] ([`Outcome`], [`HandlerResult`], `Result<Value, E: Display>`), and by the
/// built-in [`crate::shell::ShellExecutor`].
///
/// Each call runs in a task of its own; a panic is reported as a retryable failure.
pub trait Handler: Send + Sync + 'static {
    /// Starts running one task.
    fn call(&self, task: TaskContext) -> BoxFuture<HandlerResult>;
}

impl<F, Fut, R> Handler for F
where
    F: Fn(TaskContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send + 'static,
    R: Into<HandlerResult>,
{
    fn call(&self, task: TaskContext) -> BoxFuture<HandlerResult> {
        let future = self(task);
        Box::pin(async move { future.await.into() })
    }
}
