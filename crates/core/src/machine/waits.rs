//! Waiting on the server: sleep, signal and approval steps, and tasks whose worker handed the
//! work to another system and awaits its callback.
//!
//! A waiting task is `running` with a [`Wait`] and no lease: no worker holds it and nothing
//! polls. It ends when its time comes (a sleep's end, a callback's timeout: the tick finds it),
//! when something arrives from outside (a signal, a decision, a call through the callback
//! token), or when the job winds down or is cancelled (the wait is cancelled). While the job is
//! paused the task is held: what arrives is kept as its pending outcome, and it and any time
//! that fell due take effect at resume (`settle_waits`).

use serde_json::{Value, json};

use super::{Machine, type_name};
use crate::definition::{SleepSpec, StepKind, WaitStep};
use crate::ids::TaskId;
use crate::limits::MAX_CALLBACK_TIMEOUT;
use crate::model::{
    Action, CallbackAnswer, CallbackCall, CallbackCallKind, ErrorKind, EventKind, JobStatus,
    Outcome, Rejection, Signal, TaskError, TaskKind, TaskStatus, Wait, WaitFor,
};
use crate::time::{Duration, Timestamp};

impl Machine<'_> {
    /// Starts the wait of a sleep, signal or approval task, rendering its time or prompt with
    /// `context`; a sleep whose time has passed ends at once.
    pub(super) fn begin_wait(&mut self, index: usize, step: &WaitStep, context: &Value) {
        let on = match step {
            WaitStep::Sleep(SleepSpec::For(duration)) => WaitFor::Sleep {
                until: self.now.saturating_add(*duration),
            },
            WaitStep::Sleep(SleepSpec::Until(template)) => {
                let until = match template.render(context) {
                    Ok(Value::String(text)) => Timestamp::parse_rfc3339(&text).ok_or_else(|| {
                        format!("'{text}' is not an RFC 3339 time such as 2026-12-01T02:00:00Z")
                    }),
                    Ok(other) => Err(format!(
                        "expected an RFC 3339 time, got {}",
                        type_name(&other)
                    )),
                    Err(error) => Err(error.to_string()),
                };
                match until {
                    Ok(until) => WaitFor::Sleep { until },
                    Err(message) => return self.expression_failure(index, "sleep_until", message),
                }
            }
            WaitStep::Signal(name) => WaitFor::Signal { name: name.clone() },
            WaitStep::Approval { prompt } => match prompt.render(context) {
                Ok(Value::String(text)) => WaitFor::Approval { prompt: text },
                Ok(other) => WaitFor::Approval {
                    prompt: other.to_string(),
                },
                Err(error) => return self.expression_failure(index, "approval.prompt", error),
            },
        };
        let now = self.now;
        let input = self.state.tasks[index].input.clone();
        let task = &mut self.state.tasks[index];
        task.status = TaskStatus::Running;
        task.input = input.or(Some(Value::Null));
        task.ready_at = Some(now);
        task.started_at = Some(now);
        task.wait = Some(Box::new(Wait { since: now, on }));
        let detail = waiting_detail(task.wait.as_deref());
        self.save_task(index);
        self.record(EventKind::TaskWaiting, Some(index), detail);
        if self.wait_is_due(index) {
            self.end_due_wait(index);
        }
        self.deliver_signals();
    }

    /// Starts a fan-out item: a worker's item becomes ready, the other kinds start with `item`
    /// and `index` readable by their expressions.
    pub(super) fn start_item(&mut self, index: usize) {
        let workflow = self.workflow;
        let step_index = workflow
            .step_index(&self.state.tasks[index].step)
            .expect("tasks are made from the workflow's steps");
        let kind = &workflow.steps[step_index].kind;
        // A worker's item and a child's hold their input already; the kinds the server renders
        // read `item` and `index`.
        let context = match kind {
            StepKind::Task(_) | StepKind::Workflow(_) => Value::Null,
            _ => {
                let mut context = self.context();
                context["item"] = self.state.tasks[index].input.clone().unwrap_or(Value::Null);
                context["index"] = json!(self.state.tasks[index].item);
                context
            }
        };
        self.start_by_kind(index, kind, &context);
    }

    /// A sleep, signal or approval being waited for (not a callback, whose work runs elsewhere).
    pub(super) fn waits_on_the_server(&self, index: usize) -> bool {
        let task = &self.state.tasks[index];
        task.status == TaskStatus::Running
            && task
                .wait
                .as_ref()
                .is_some_and(|wait| !matches!(wait.on, WaitFor::Callback { .. }))
    }

    /// The task's wait ended by itself (a sleep's time, a callback's timeout), and the task is
    /// not held by a pause.
    pub(super) fn wait_is_due(&self, index: usize) -> bool {
        let task = &self.state.tasks[index];
        task.status == TaskStatus::Running
            && !task.held
            && task.pending_outcome.is_none()
            && task
                .wait
                .as_ref()
                .and_then(|wait| wait.wake_at())
                .is_some_and(|at| at <= self.now)
    }

    /// Ends a wait whose time has come: a sleep succeeds, a callback's attempt fails
    /// (retryably).
    pub(super) fn end_due_wait(&mut self, index: usize) {
        let Some(wait) = self.state.tasks[index].wait.clone() else {
            return;
        };
        match wait.on {
            WaitFor::Sleep { until } => {
                self.succeed(index, json!({"slept_until": until.to_rfc3339()}));
            }
            WaitFor::Callback { timeout, .. } => {
                let message = format!("no callback came within {timeout}");
                self.attempt_failed(
                    index,
                    TaskError {
                        message,
                        retryable: true,
                        kind: ErrorKind::CallbackTimeout,
                    },
                );
            }
            WaitFor::ChildRetry { .. } => self.start_child_attempt(index),
            WaitFor::Signal { .. } | WaitFor::Approval { .. } | WaitFor::Child { .. } => {}
        }
    }

    /// At resume: outcomes that arrived while paused take effect, times that fell due end their
    /// waits, and kept signals reach the tasks waiting for them.
    pub(super) fn settle_waits(&mut self) {
        for index in 0..self.state.tasks.len() {
            if self.state.tasks[index].status != TaskStatus::Running {
                continue;
            }
            if let Some(outcome) = self.state.tasks[index].pending_outcome.take() {
                self.apply_outcome(index, *outcome);
            } else if self.wait_is_due(index) {
                self.end_due_wait(index);
            }
        }
        self.deliver_signals();
    }

    /// Ends a wait with what came from outside; while the job is paused, keeps it for resume.
    pub(super) fn resolve(&mut self, index: usize, outcome: Outcome) {
        let task = &mut self.state.tasks[index];
        if task.held {
            task.pending_outcome = Some(Box::new(outcome));
            self.save_task(index);
        } else {
            self.apply_outcome(index, outcome);
        }
    }

    fn apply_outcome(&mut self, index: usize, outcome: Outcome) {
        match outcome {
            Outcome::Succeeded(output) => self.succeed(index, output),
            Outcome::Failed(error) if error.retryable => self.attempt_failed(index, error),
            Outcome::Failed(error) => self.fail_terminally(index, error),
        }
    }

    /// Gives kept signals to the tasks waiting for them: the oldest signal of a name to the
    /// task that began waiting for it first (then the lowest item index). Only while the job
    /// runs: a paused job keeps them until resume.
    fn deliver_signals(&mut self) {
        if self.state.job.status != JobStatus::Running || self.state.signals.is_empty() {
            return;
        }
        let mut waiting: Vec<(Timestamp, u32, u32, usize)> = self
            .state
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, task)| task.status == TaskStatus::Running && !task.held)
            .filter_map(|(index, task)| match task.wait.as_deref() {
                Some(Wait {
                    since,
                    on: WaitFor::Signal { .. },
                }) => Some((*since, task.item.unwrap_or(0), task.seq, index)),
                _ => None,
            })
            .collect();
        waiting.sort_unstable();
        for (_, _, _, index) in waiting {
            let Some(WaitFor::Signal { name }) =
                self.state.tasks[index].wait.as_ref().map(|w| w.on.clone())
            else {
                continue;
            };
            let Some(position) = self.state.signals.iter().position(|s| s.name == name) else {
                continue;
            };
            let signal = self.state.signals.remove(position);
            let task = self.state.tasks[index].id.clone();
            self.actions.push(Action::ConsumeSignal {
                seq: signal.seq,
                task,
            });
            self.succeed(index, signal.payload);
        }
    }

    /// A signal sent to the job: kept, then given to a task waiting for it if one is.
    pub(super) fn signal(
        &mut self,
        name: String,
        payload: Value,
        id: Option<String>,
        sender: String,
    ) -> Result<(), Rejection> {
        let status = self.state.job.status;
        if status.is_terminal() {
            return Err(Rejection::NotApplicable(format!(
                "job is {status}: a finished job takes no signals"
            )));
        }
        if !self.workflow.takes_signal(&name) {
            return Err(Rejection::UnknownSignal {
                workflow: self.workflow.name.clone(),
                name,
            });
        }
        if self.state.signals.len() >= self.limits.pending_signals {
            return Err(Rejection::TooManySignals(self.state.signals.len()));
        }
        let seq = self.state.job.signals_received;
        self.state.job.signals_received += 1;
        self.save_job();
        let signal = Signal {
            seq,
            name,
            payload,
            id,
            sender,
            received_at: self.now,
        };
        self.record(
            EventKind::SignalReceived,
            None,
            json!({"name": signal.name, "id": signal.id, "sender": signal.sender, "seq": seq}),
        );
        self.actions.push(Action::InsertSignal(signal.clone()));
        self.state.signals.push(signal);
        self.deliver_signals();
        Ok(())
    }

    /// A person's decision on an approval step: approval succeeds it, rejection fails it for
    /// good (and the job winds down as after any failure).
    pub(super) fn decide(
        &mut self,
        id: &TaskId,
        approve: bool,
        by: String,
        comment: Option<String>,
    ) -> Result<(), Rejection> {
        let index = self
            .state
            .position(id)
            .ok_or_else(|| Rejection::UnknownTask(id.clone()))?;
        let task = &self.state.tasks[index];
        let waiting = task.status == TaskStatus::Running
            && matches!(
                task.wait.as_ref().map(|w| &w.on),
                Some(WaitFor::Approval { .. })
            );
        if !waiting {
            return Err(Rejection::NotApplicable(format!(
                "task {id} ({}) is {}: it is not waiting for an approval",
                task.step, task.status
            )));
        }
        if task.pending_outcome.is_some() {
            return Err(Rejection::NotApplicable(format!(
                "task {id} ({}) was already decided: the decision takes effect when the job resumes",
                task.step
            )));
        }
        let held = task.held;
        let detail = json!({"by": by, "comment": comment, "takes_effect_at_resume": held});
        let outcome = if approve {
            self.record(EventKind::TaskApproved, Some(index), detail);
            Outcome::Succeeded(json!({
                "approved": true,
                "by": by,
                "comment": comment,
                "at": self.now.to_rfc3339(),
            }))
        } else {
            self.record(EventKind::TaskRejected, Some(index), detail);
            let message = match &comment {
                Some(comment) => format!("rejected by {by}: {comment}"),
                None => format!("rejected by {by}"),
            };
            Outcome::Failed(TaskError {
                message,
                retryable: false,
                kind: ErrorKind::Rejected,
            })
        };
        self.resolve(index, outcome);
        Ok(())
    }

    /// The worker handed the attempt to another system: the lease is released and the task
    /// waits, keeping its place on its queue, until a call through its callback token or the
    /// timeout (never past the step's `step_timeout`).
    pub(super) fn await_callback(
        &mut self,
        id: &TaskId,
        lease_token: &str,
        timeout: Option<Duration>,
    ) -> Result<(), Rejection> {
        let index = self.leased(id, lease_token)?;
        if self.winding_down_past(index) {
            self.release(index);
            self.cancel(
                index,
                "the job is winding down; the task asked to await a callback",
            );
            return Ok(());
        }
        let timeout = timeout
            .unwrap_or_else(|| self.attempt_timeout(index))
            .min(MAX_CALLBACK_TIMEOUT);
        let now = self.now;
        let paused = self.state.job.status == JobStatus::Paused;
        let task = &mut self.state.tasks[index];
        let until = callback_end(now, timeout, task.deadline_at);
        // The queue slot stays taken: the work is still in progress, elsewhere.
        task.lease_token = None;
        task.lease_expires_at = None;
        task.held = paused && task.kind != TaskKind::Compensation;
        task.wait = Some(Box::new(Wait {
            since: now,
            on: WaitFor::Callback { until, timeout },
        }));
        self.save_task(index);
        self.record(
            EventKind::TaskAwaitingCallback,
            Some(index),
            json!({"until": until, "timeout_ms": timeout.as_millis()}),
        );
        Ok(())
    }

    /// A call through a callback token. `complete` and `fail` finish the attempt once; an
    /// identical repeat changes nothing (and is answered as the first was), anything else after
    /// that, or once the task has moved on, is `CallbackGone`.
    pub(super) fn callback(
        &mut self,
        id: &TaskId,
        attempt: u32,
        token_hash: &str,
        call: CallbackCall,
        digest: String,
    ) -> Result<(), Rejection> {
        let index = self.state.position(id).ok_or(Rejection::UnknownCallback)?;
        let task = &self.state.tasks[index];
        let Some(grant) = &task.callback else {
            return Err(Rejection::UnknownCallback);
        };
        if attempt > grant.attempt || (attempt == grant.attempt && !grant.matches(token_hash)) {
            return Err(Rejection::UnknownCallback);
        }
        if attempt < grant.attempt || grant.round != self.state.job.round {
            return Err(Rejection::CallbackGone(format!(
                "the attempt this token was issued for has ended: task {id} ({}) has moved on",
                task.step
            )));
        }
        let kind = match &call {
            CallbackCall::Complete { .. } => Some(CallbackCallKind::Complete),
            CallbackCall::Fail { .. } => Some(CallbackCallKind::Fail),
            CallbackCall::Heartbeat => None,
        };
        if let Some(answered) = &grant.answered {
            if Some(answered.call) == kind && answered.digest == digest {
                return Ok(());
            }
            return Err(Rejection::CallbackGone(format!(
                "the attempt was already finished through this token (by `{}`)",
                answered.call
            )));
        }
        if task.status != TaskStatus::Running {
            return Err(Rejection::CallbackGone(format!(
                "task {id} ({}) is {}: the attempt this token was issued for has ended",
                task.step, task.status
            )));
        }
        let Some(kind) = kind else {
            self.extend_callback(index);
            return Ok(());
        };
        if let Some(grant) = &mut self.state.tasks[index].callback {
            grant.answered = Some(CallbackAnswer { call: kind, digest });
        }
        self.save_task(index);
        self.record(
            EventKind::CallbackReceived,
            Some(index),
            json!({"call": kind, "takes_effect_at_resume": self.state.tasks[index].held}),
        );
        let outcome = match call {
            CallbackCall::Complete { output } => Outcome::Succeeded(output),
            CallbackCall::Fail { error } => Outcome::Failed(TaskError {
                message: error.message,
                retryable: error.retryable,
                kind: ErrorKind::Handler,
            }),
            CallbackCall::Heartbeat => return Ok(()),
        };
        self.resolve(index, outcome);
        Ok(())
    }

    /// A callback heartbeat: a task awaiting its callback gets `timeout` more from now (never
    /// past its step's deadline); one still leased to its worker gets its lease extended.
    fn extend_callback(&mut self, index: usize) {
        let now = self.now;
        let lease = self.attempt_timeout(index);
        let task = &mut self.state.tasks[index];
        match task.wait.as_deref_mut() {
            Some(Wait {
                on: WaitFor::Callback { until, timeout },
                ..
            }) => *until = callback_end(now, *timeout, task.deadline_at),
            _ if task.lease_token.is_some() => {
                task.lease_expires_at = Some(now.saturating_add(lease));
            }
            _ => return,
        }
        self.save_task(index);
    }
}

/// When a callback wait that starts (or is extended) at `now` ends: after `timeout`, but never
/// past the step's deadline.
fn callback_end(now: Timestamp, timeout: Duration, deadline: Option<Timestamp>) -> Timestamp {
    let until = now.saturating_add(timeout);
    deadline.map_or(until, |deadline| until.min(deadline))
}

/// The history detail of a task that starts waiting: what it waits for (times in Unix
/// milliseconds, as in every event's detail).
pub(super) fn waiting_detail(wait: Option<&Wait>) -> Value {
    match wait.map(|wait| &wait.on) {
        Some(WaitFor::Sleep { until }) => json!({"sleep_until": until}),
        Some(WaitFor::Signal { name }) => json!({"signal": name}),
        Some(WaitFor::Approval { prompt }) => json!({"approval": {"prompt": prompt}}),
        Some(WaitFor::Callback { until, .. }) => json!({"callback": {"until": until}}),
        Some(WaitFor::Child { job }) => json!({"child": job}),
        Some(WaitFor::ChildRetry { at }) => json!({"child_retry_at": at}),
        None => Value::Null,
    }
}
