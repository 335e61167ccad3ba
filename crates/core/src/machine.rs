//! The job state machine: `create_job` and `apply` take a job's state and an input and return the
//! actions to persist. No I/O and no clock: `now` and fresh ids come in through `Ctx`.
//!
//! Rules (the README and docs/reference.md describe them): a step becomes ready when all its dependencies are done (succeeded or
//! skipped); a step whose dependencies were all skipped is skipped too; a failed attempt is retried
//! after its backoff while attempts remain; a terminal failure or the job deadline winds the job
//! down (nothing new is dispatched, running tasks finish), then compensations run one at a time:
//! failed or interrupted tasks first, then succeeded ones in reverse order of completion.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::{Map, Value, json};

use crate::definition::{DEFAULT_ATTEMPT_TIMEOUT, Handler, RetryPolicy, Step, StepKind, Workflow};
use crate::expr::{self, EvalError};
use crate::ids::{IdSource, JobId};
use crate::labels::Labels;
use crate::limits::{Limits, json_exceeds};
use crate::model::{
    Action, CallbackGrant, ChildCommand, ErrorKind, Event, EventKind, Input, Job, JobLock,
    JobState, JobStatus, ParentLink, Rejection, Task, TaskError, TaskKind, TaskLimits, TaskStatus,
    Wait, WaitFor, WindDown,
};
use crate::routing::QueueRoute;
use crate::time::{Duration, Timestamp};

/// What the engine passes in with every input.
pub struct Ctx<'a> {
    pub now: Timestamp,
    pub ids: &'a mut dyn IdSource,
    pub limits: Limits,
}

/// A job to create.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub id: JobId,
    pub namespace: String,
    pub version: u32,
    pub params: Value,
    pub key: Option<String>,
    /// Overrides the workflow's default priority.
    pub priority: Option<i32>,
    /// Who submitted the job (a token's name, a schedule), recorded in its `job_created` event.
    pub actor: Option<String>,
    /// The job's labels, as merged by the caller (`labels::merge`) and checked.
    pub labels: Labels,
    /// The parent's task that starts the job as a sub-workflow's child.
    pub parent: Option<ParentLink>,
    /// How deep the job nests (its parent's depth + 1; 0 for a job nobody started).
    pub depth: u32,
    /// The version of each sub-workflow its steps start without naming one (the latest now).
    pub child_versions: BTreeMap<String, u32>,
    /// Lock keys the job's ancestors hold: a lock with one of them takes no slot (it is the
    /// ancestor's), so a parent holding the only slot does not wait for its own child.
    pub held_by_ancestors: Vec<String>,
    /// The rendered `lock` of the parent's sub-workflow step that starts the job: the job holds
    /// it as its lock, for its whole run (the step's attempt).
    pub step_lock: Option<JobLock>,
}

impl NewJob {
    /// A job nobody started as a child, with no key, actor or priority of its own yet.
    pub fn new(id: JobId, namespace: String, version: u32, params: Value) -> NewJob {
        NewJob {
            id,
            namespace,
            version,
            params,
            key: None,
            priority: None,
            actor: None,
            parent: None,
            depth: 0,
            child_versions: BTreeMap::new(),
            held_by_ancestors: Vec::new(),
            step_lock: None,
            labels: Labels::default(),
        }
    }
}

/// Why a job could not be created.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CreateError {
    #[error("lock.key: {0}")]
    LockKey(String),
}

/// What every expression of a job reads: its `params` and its `job` (id, namespace, workflow,
/// version, key, priority). The steps' expressions read `steps` too (`Machine::context`).
fn job_context(job: &Job) -> Value {
    json!({
        "params": job.params,
        "job": {
            "id": job.id,
            "namespace": job.namespace,
            "workflow": job.workflow,
            "version": job.version,
            "key": job.key,
            "priority": job.priority,
        },
    })
}

/// Renders the workflow's lock key for the job.
fn lock_of(workflow: &Workflow, job: &Job) -> Result<Option<JobLock>, CreateError> {
    let Some(lock) = &workflow.lock else {
        return Ok(None);
    };
    let key = render_key(&lock.key, &job_context(job)).map_err(CreateError::LockKey)?;
    Ok(Some(JobLock {
        key,
        slots: lock.slots,
    }))
}

/// Renders the key of a lock or a rate: a non-empty string of at most 256 bytes (a number or a
/// boolean is taken as its text).
fn render_key(template: &crate::expr::Template, context: &Value) -> Result<String, String> {
    let key = match template.render(context) {
        Ok(Value::String(key)) => key,
        Ok(Value::Number(n)) => n.to_string(),
        Ok(Value::Bool(b)) => b.to_string(),
        Ok(other) => {
            return Err(format!(
                "the key must render to a string, got {}",
                type_name(&other)
            ));
        }
        Err(error) => return Err(error.to_string()),
    };
    if key.is_empty() || key.len() > crate::limits::MAX_LOCK_KEY_BYTES {
        return Err(format!(
            "the key renders to {} bytes: it must be 1 to {}",
            key.len(),
            crate::limits::MAX_LOCK_KEY_BYTES
        ));
    }
    Ok(key)
}

/// Creates a job and its tasks and makes its first steps ready; a job with a lock starts
/// `queued`, and the engine sends `Input::Start` once it holds a slot.
pub fn create_job(
    workflow: &Workflow,
    new: NewJob,
    ctx: &mut Ctx<'_>,
) -> Result<(JobState, Vec<Action>), CreateError> {
    let now = ctx.now;
    let priority = new.priority.unwrap_or(workflow.priority);
    let mut job = Job {
        id: new.id.clone(),
        namespace: new.namespace,
        workflow: workflow.name.clone(),
        version: new.version,
        status: JobStatus::Running,
        params: new.params,
        key: new.key,
        priority,
        created_at: now,
        started_at: Some(now),
        ended_at: None,
        deadline_at: workflow.timeout.map(|timeout| now.saturating_add(timeout)),
        wind_down: None,
        compensation_planned: false,
        completions: 0,
        round: 0,
        lock: None,
        signals_received: 0,
        output: None,
        failed_steps: Vec::new(),
        parent: new.parent,
        depth: new.depth,
        child_versions: new.child_versions,
        labels: new.labels,
    };
    job.lock = match (lock_of(workflow, &job)?, new.step_lock) {
        (Some(own), Some(step)) if own.key != step.key => {
            return Err(CreateError::LockKey(format!(
                "the step's lock {} and the workflow's lock {} cannot both be held: a job holds one lock, drop one of them",
                step.key, own.key
            )));
        }
        (own, step) => step.or(own),
    };
    let held_by_ancestor = job
        .lock
        .take_if(|lock| new.held_by_ancestors.contains(&lock.key))
        .map(|lock| lock.key);
    if job.lock.is_some() {
        job.status = JobStatus::Queued;
        job.started_at = None;
        job.deadline_at = None;
    }
    let mut state = JobState {
        job,
        tasks: Vec::with_capacity(workflow.steps.len()),
        signals: Vec::new(),
    };
    for step in &workflow.steps {
        let kind = if step.for_each.is_some() {
            TaskKind::FanOut
        } else {
            TaskKind::Step
        };
        let task = new_task(
            &state.job,
            &mut state.tasks,
            ctx,
            kind,
            &step.id,
            step.handler(),
            priority + step.priority,
        );
        state.tasks.push(task);
    }
    let mut machine = Machine {
        workflow,
        state: &mut state,
        now,
        ids: ctx.ids,
        limits: ctx.limits,
        actions: Vec::new(),
        creating: true,
    };
    machine.actions.push(Action::SaveJob);
    for task in &machine.state.tasks {
        machine.actions.push(Action::SaveTask(task.id.clone()));
    }
    let mut created = json!({"workflow": workflow.name, "version": new.version});
    if let Some(actor) = new.actor {
        created["actor"] = Value::String(actor);
    }
    if let Some(parent) = &machine.state.job.parent {
        created["parent"] = json!({"job": parent.job, "task": parent.task});
    }
    if let Some(key) = held_by_ancestor {
        created["lock_held_by_ancestor"] = Value::String(key);
    }
    machine.record(EventKind::JobCreated, None, created);
    if let Some(lock) = &machine.state.job.lock {
        let detail = json!({"lock": lock.key, "slots": lock.slots});
        machine.record(EventKind::JobQueued, None, detail);
    }
    machine.advance();
    let actions = machine.actions;
    Ok((state, actions))
}

fn new_task(
    job: &Job,
    tasks: &mut [Task],
    ctx: &mut Ctx<'_>,
    kind: TaskKind,
    step: &str,
    handler: Option<&Handler>,
    priority: i32,
) -> Task {
    Task {
        id: ctx.ids.task_id(),
        job_id: job.id.clone(),
        seq: u32::try_from(tasks.len()).unwrap_or(u32::MAX),
        kind,
        step: step.to_owned(),
        item: None,
        compensates: None,
        // A queue template is rendered when the task first becomes ready (`render_queue`).
        queue: handler
            .and_then(|h| h.queue.name())
            .map(str::to_owned)
            .unwrap_or_default(),
        command: handler.map(|h| h.command.clone()).unwrap_or_default(),
        status: TaskStatus::Waiting,
        priority,
        attempt: 0,
        checking: false,
        available_at: None,
        deadline_at: None,
        lease_token: None,
        lease_expires_at: None,
        worker_id: None,
        input: None,
        output: None,
        error: None,
        progress: None,
        logs: None,
        created_at: ctx.now,
        ready_at: None,
        started_at: None,
        ended_at: None,
        completed_seq: None,
        held: false,
        round: job.round,
        attempt_base: 0,
        wait: None,
        pending_outcome: None,
        callback: None,
        child: None,
        limits: None,
        claimed_at: None,
    }
}

/// Whether `input` is a success the task already recorded under the same lease token: a worker
/// whose answer was lost sends it again, and it is answered as the first one was, changing
/// nothing (see `Task::lease_token`). Another token is refused by `apply` as stale.
pub fn repeats_success(state: &JobState, input: &Input) -> bool {
    let Input::Complete {
        task, lease_token, ..
    } = input
    else {
        return false;
    };
    state.task(task).is_some_and(|task| {
        task.status == TaskStatus::Succeeded && task.lease_token.as_deref() == Some(lease_token)
    })
}

/// Applies one input to a job. On `Err` nothing changed.
pub fn apply(
    workflow: &Workflow,
    state: &mut JobState,
    input: Input,
    ctx: &mut Ctx<'_>,
) -> Result<Vec<Action>, Rejection> {
    let mut machine = Machine {
        workflow,
        state,
        now: ctx.now,
        ids: ctx.ids,
        limits: ctx.limits,
        actions: Vec::new(),
        creating: false,
    };
    let was_finished = machine.state.job.status.is_terminal();
    machine.apply(input)?;
    machine.advance();
    if !was_finished
        && machine.state.job.status.is_terminal()
        && let Some(lock) = &machine.state.job.lock
    {
        let key = lock.key.clone();
        machine.actions.push(Action::ReleaseLock { key });
    }
    Ok(machine.actions)
}

struct Machine<'a> {
    workflow: &'a Workflow,
    state: &'a mut JobState,
    now: Timestamp,
    ids: &'a mut dyn IdSource,
    limits: Limits,
    actions: Vec<Action>,
    /// The job is being created: the tasks it makes ready now get no `task_ready` event of
    /// their own, as `job_created` says the job's first steps are ready (one history row less
    /// per job on the hot path).
    creating: bool,
}

impl Machine<'_> {
    /// Appends a history event; one that ends a worker's run of the task (see
    /// `EventKind::ends_a_run`) carries the run's start (`claimed_at`), which the task then
    /// forgets.
    fn record(&mut self, kind: EventKind, task: Option<usize>, mut detail: Value) {
        if let Some(index) = task
            && kind.ends_a_run()
            && let Some(claimed_at) = self.state.tasks[index].claimed_at.take()
        {
            detail["claimed_at"] = json!(claimed_at);
            self.save_task(index);
        }
        let event = self.event(kind, task, detail);
        self.actions.push(Action::Record(event));
    }

    /// Tells the listeners of task events of one that the history does not keep.
    fn announce(&mut self, kind: EventKind, index: usize, detail: Value) {
        let event = self.event(kind, Some(index), detail);
        self.actions.push(Action::Announce(event));
    }

    fn event(&self, kind: EventKind, task: Option<usize>, detail: Value) -> Event {
        let (task_id, attempt, worker) = match task {
            Some(index) => {
                let task = &self.state.tasks[index];
                (
                    Some(task.id.clone()),
                    (task.attempt > 0).then_some(task.attempt),
                    task.worker_id.clone(),
                )
            }
            None => (None, None, None),
        };
        Event {
            at: self.now,
            kind,
            task: task_id,
            attempt,
            worker,
            detail,
        }
    }

    fn save_task(&mut self, index: usize) {
        let task = &mut self.state.tasks[index];
        // Only a ready task waits parked for a step's lock or rate.
        if task.status != TaskStatus::Ready
            && let Some(limits) = task.limits.as_deref_mut()
        {
            limits.parked = None;
        }
        self.actions.push(Action::SaveTask(task.id.clone()));
    }

    fn save_job(&mut self) {
        self.actions.push(Action::SaveJob);
    }

    /// What runs the task: its step's handler, or its compensation; `None` for a step that
    /// waits on the server.
    fn handler(&self, index: usize) -> Option<&Handler> {
        let task = &self.state.tasks[index];
        self.workflow
            .task_handler(&task.step, task.kind == TaskKind::Compensation)
    }

    /// The per-attempt timeout: the lease a worker holds and extends by heartbeats.
    fn attempt_timeout(&self, index: usize) -> crate::time::Duration {
        self.handler(index)
            .map_or(DEFAULT_ATTEMPT_TIMEOUT, |handler| handler.timeout)
    }

    fn retry_policy(&self, index: usize) -> RetryPolicy {
        let task = &self.state.tasks[index];
        let policy = if task.kind == TaskKind::Compensation {
            self.handler(index).map(|handler| handler.retry)
        } else {
            self.workflow
                .step_index(&task.step)
                .and_then(|step| self.workflow.steps[step].retry())
        };
        policy.unwrap_or_default()
    }

    /// Finds a running task and checks its lease token.
    fn leased(&self, id: &crate::ids::TaskId, lease_token: &str) -> Result<usize, Rejection> {
        let index = self
            .state
            .position(id)
            .ok_or_else(|| Rejection::UnknownTask(id.clone()))?;
        let task = &self.state.tasks[index];
        if is_revoked(task, lease_token) {
            // An operator requeued the task (`requeue_task`): its old worker must stop.
            let why = task
                .error
                .as_ref()
                .map_or("", |error| error.message.as_str());
            return Err(Rejection::LeaseRevoked(format!(
                "the lease was revoked: {why}"
            )));
        }
        if task.status != TaskStatus::Running || task.lease_token.as_deref() != Some(lease_token) {
            return Err(Rejection::StaleLease {
                status: task.status,
            });
        }
        Ok(index)
    }

    fn apply(&mut self, input: Input) -> Result<(), Rejection> {
        match input {
            Input::Claim {
                task,
                worker,
                lease_token,
                callback_hash,
            } => {
                let index = self
                    .state
                    .position(&task)
                    .ok_or_else(|| Rejection::UnknownTask(task.clone()))?;
                let status = self.state.tasks[index].status;
                let available = self.state.tasks[index]
                    .available_at
                    .is_none_or(|at| at <= self.now);
                if status != TaskStatus::Ready || !available {
                    return Err(Rejection::NotReady { task, status });
                }
                let dispatching = match self.state.tasks[index].kind {
                    TaskKind::Compensation => self.state.job.status == JobStatus::Compensating,
                    _ => self.state.job.status == JobStatus::Running,
                };
                if !dispatching {
                    return Err(Rejection::JobNotDispatching(self.state.job.status));
                }
                let lease = self.attempt_timeout(index);
                let now = self.now;
                let round = self.state.job.round;
                let task = &mut self.state.tasks[index];
                if !task.checking {
                    task.attempt += 1;
                }
                task.callback = Some(Box::new(CallbackGrant {
                    attempt: task.attempt,
                    round,
                    hash: callback_hash,
                    answered: None,
                }));
                task.status = TaskStatus::Running;
                task.lease_token = Some(lease_token);
                task.lease_expires_at = Some(now.saturating_add(lease));
                task.worker_id = Some(worker);
                task.started_at.get_or_insert(now);
                task.claimed_at = Some(now);
                let continuing = task.checking;
                self.save_task(index);
                self.announce(
                    EventKind::TaskClaimed,
                    index,
                    json!({"continues_check": continuing}),
                );
            }
            Input::Heartbeat {
                task,
                lease_token,
                progress,
            } => {
                let index = self.leased(&task, &lease_token)?;
                let lease = self.attempt_timeout(index);
                let task = &mut self.state.tasks[index];
                task.lease_expires_at = Some(self.now.saturating_add(lease));
                if progress.is_some() {
                    task.progress = progress;
                }
                self.save_task(index);
            }
            Input::Complete {
                task,
                lease_token,
                output,
                logs,
            } => {
                let index = self.leased(&task, &lease_token)?;
                self.state.tasks[index].logs = logs;
                self.succeed(index, output);
            }
            Input::Fail {
                task,
                lease_token,
                error,
                logs,
            } => {
                let index = self.leased(&task, &lease_token)?;
                self.state.tasks[index].logs = logs;
                self.attempt_failed_after(
                    index,
                    TaskError {
                        message: error.message,
                        retryable: error.retryable,
                        kind: ErrorKind::Handler,
                    },
                    error.retry_after,
                );
            }
            Input::CheckLater {
                task,
                lease_token,
                after,
                progress,
            } => {
                let index = self.leased(&task, &lease_token)?;
                if progress.is_some() {
                    self.state.tasks[index].progress = progress;
                }
                let paused = self.state.job.status == JobStatus::Paused;
                if self.winding_down_past(index) {
                    self.release(index);
                    self.cancel(
                        index,
                        "the job is winding down; the task asked to be checked later",
                    );
                    return Ok(());
                }
                let now = self.now;
                let task = &mut self.state.tasks[index];
                task.status = TaskStatus::Ready;
                task.checking = true;
                task.held = paused && task.kind != TaskKind::Compensation;
                task.available_at = Some(now.saturating_add(after));
                task.lease_token = None;
                task.lease_expires_at = None;
                let detail =
                    json!({"after_ms": after.as_millis(), "available_at": task.available_at});
                self.save_task(index);
                self.record(EventKind::TaskCheckLater, Some(index), detail);
                self.wake(index);
            }
            Input::AwaitCallback {
                task,
                lease_token,
                timeout,
            } => self.await_callback(&task, &lease_token, timeout)?,
            Input::Callback {
                task,
                attempt,
                token_hash,
                call,
                digest,
            } => self.callback(&task, attempt, &token_hash, call, digest)?,
            Input::Signal {
                name,
                payload,
                id,
                sender,
            } => self.signal(name, payload, id, sender)?,
            Input::Decide {
                task,
                approve,
                by,
                comment,
            } => self.decide(&task, approve, by, comment)?,
            Input::Tick => self.tick(),
            Input::Operator(command) => self.operate(command)?,
            Input::ChildEnded {
                child,
                status,
                output,
                error,
            } => self.child_ended(&child, status, output, error)?,
            Input::ChildNotStarted { child, message } => self.child_not_started(&child, message)?,
            Input::RollBack { by } => self.roll_back(by)?,
            Input::RevocationTold { task, lease_token } => {
                self.revocation_told(&task, &lease_token);
            }
            Input::Start => {
                if self.state.job.status != JobStatus::Queued {
                    return Err(Rejection::NotApplicable(format!(
                        "job is {}: only a queued job starts",
                        self.state.job.status
                    )));
                }
                let now = self.now;
                let job = &mut self.state.job;
                job.status = JobStatus::Running;
                job.started_at = Some(now);
                job.deadline_at = self.workflow.timeout.map(|t| now.saturating_add(t));
                self.save_job();
                self.record(EventKind::JobStarted, None, json!({}));
            }
        }
        Ok(())
    }

    fn tick(&mut self) {
        let now = self.now;
        if let Some(deadline) = self.state.job.deadline_at
            && deadline <= now
            && matches!(
                self.state.job.status,
                JobStatus::Running | JobStatus::Paused
            )
        {
            self.record(
                EventKind::JobTimedOut,
                None,
                json!({"deadline_at": deadline}),
            );
            self.wind_down(WindDown::TimedOut);
        }
        for index in 0..self.state.tasks.len() {
            let task = &self.state.tasks[index];
            let active = matches!(task.status, TaskStatus::Ready | TaskStatus::Running);
            if active
                && task.kind != TaskKind::Compensation
                && task.deadline_at.is_some_and(|deadline| deadline <= now)
            {
                let message = format!(
                    "step timeout of {} passed",
                    self.workflow.steps[self.workflow.step_index(&task.step).unwrap_or(0)]
                        .step_timeout
                        .unwrap_or_default()
                );
                self.record(
                    EventKind::TaskTimedOut,
                    Some(index),
                    json!({"message": message}),
                );
                let error = TaskError {
                    message,
                    retryable: false,
                    kind: ErrorKind::StepTimeout,
                };
                match self.running_child(index) {
                    Some(child) => self.time_out_child(index, child, error),
                    None => self.fail_terminally(index, error),
                }
                continue;
            }
            if self.wait_is_due(index) {
                self.end_due_wait(index);
                continue;
            }
            let task = &self.state.tasks[index];
            if task.status == TaskStatus::Running
                && task.lease_expires_at.is_some_and(|expiry| expiry <= now)
            {
                let message = format!(
                    "lease expired: worker {} sent no heartbeat or result in time",
                    task.worker_id.as_deref().unwrap_or("?")
                );
                self.record(
                    EventKind::TaskLeaseExpired,
                    Some(index),
                    json!({"message": message}),
                );
                self.attempt_failed(
                    index,
                    TaskError {
                        message,
                        retryable: true,
                        kind: ErrorKind::LeaseExpired,
                    },
                );
            }
        }
    }

    fn wake(&mut self, index: usize) {
        let task = &self.state.tasks[index];
        let claimable = task.available_at.is_none_or(|at| at <= self.now);
        let queue = task.queue.clone();
        if !self.actions.iter().any(|action| {
            matches!(action, Action::Wake { queue: q, claimable: c } if *q == queue && *c == claimable)
        }) {
            self.actions.push(Action::Wake { queue, claimable });
        }
    }

    /// Ends the task's hold on a worker or a wait: its lease, its wait, an outcome kept for
    /// resume.
    fn release(&mut self, index: usize) {
        let task = &mut self.state.tasks[index];
        let was_leased = task.lease_token.take().is_some();
        task.lease_expires_at = None;
        task.pending_outcome = None;
        let wait = task.wait.take().map(|wait| wait.on);
        let awaited_callback = matches!(wait, Some(WaitFor::Callback { .. }));
        if let Some(WaitFor::Child { job }) = wait
            && task.kind != TaskKind::Compensation
        {
            // The step ends before its child did (its step timeout, a skip): the child is
            // cancelled and undoes what it did.
            self.actions.push(Action::ToChild {
                child: job,
                command: ChildCommand::Cancel { compensate: true },
            });
        }
        if was_leased || awaited_callback {
            // A task on a queue stopped: a serial or limited queue has a free slot again.
            self.wake(index);
        }
    }

    /// A forward task whose job no longer goes forward (it is winding down).
    fn winding_down_past(&self, index: usize) -> bool {
        self.state.tasks[index].kind != TaskKind::Compensation
            && !matches!(
                self.state.job.status,
                JobStatus::Running | JobStatus::Paused
            )
    }

    fn succeed(&mut self, index: usize, output: Value) {
        let lease_token = self.state.tasks[index].lease_token.clone();
        self.release(index);
        let now = self.now;
        let seq = self.state.job.completions;
        self.state.job.completions += 1;
        let task = &mut self.state.tasks[index];
        // The attempt that succeeded keeps its token, so that its success sent again is known.
        task.lease_token = lease_token;
        task.status = TaskStatus::Succeeded;
        task.output = Some(output);
        task.error = None;
        task.checking = false;
        task.ended_at = Some(now);
        task.completed_seq = Some(seq);
        self.save_task(index);
        self.save_job();
        self.record(EventKind::TaskSucceeded, Some(index), json!({}));
    }

    /// An attempt failed: retry after backoff if allowed, else fail the task for good.
    fn attempt_failed(&mut self, index: usize, error: TaskError) {
        self.attempt_failed_after(index, error, None);
    }

    /// An attempt failed: retry after the backoff, or after `at_least` when that is longer (a
    /// service's `Retry-After`), if allowed; else fail the task for good.
    fn attempt_failed_after(&mut self, index: usize, error: TaskError, at_least: Option<Duration>) {
        self.release(index);
        let policy = self.retry_policy(index);
        let task = &self.state.tasks[index];
        let paused = self.state.job.status == JobStatus::Paused;
        let moving_on = match task.kind {
            TaskKind::Compensation => true,
            _ => self.state.job.status == JobStatus::Running || paused,
        };
        let used = task.attempt.saturating_sub(task.attempt_base);
        if error.retryable && used < policy.max_attempts && moving_on {
            let mut hasher = DefaultHasher::new();
            (task.id.as_str(), task.attempt).hash(&mut hasher);
            let delay = policy
                .delay(task.attempt, hasher.finish())
                .max(at_least.unwrap_or_default());
            let retry_at = self.now.saturating_add(delay);
            let detail = json!({
                "message": error.message,
                "kind": error.kind,
                "retry_at": retry_at,
                "attempts_left": policy.max_attempts - used,
            });
            self.record(EventKind::TaskFailed, Some(index), detail);
            let task = &self.state.tasks[index];
            let starts_a_child = task.kind != TaskKind::Compensation
                && self
                    .workflow
                    .step_index(&task.step)
                    .is_some_and(|step| self.workflow.steps[step].child().is_some());
            let now = self.now;
            let task = &mut self.state.tasks[index];
            if starts_a_child {
                // A sub-workflow step: the next child starts when the backoff has passed.
                task.wait = Some(Box::new(Wait {
                    since: now,
                    on: WaitFor::ChildRetry { at: retry_at },
                }));
            } else {
                task.status = TaskStatus::Ready;
                task.available_at = Some(retry_at);
            }
            task.checking = false;
            task.held = paused && task.kind != TaskKind::Compensation;
            task.error = Some(error);
            self.save_task(index);
            self.record(
                EventKind::TaskRetryScheduled,
                Some(index),
                json!({"retry_at": retry_at, "delay_ms": delay.as_millis()}),
            );
            if !starts_a_child {
                self.wake(index);
            }
        } else {
            self.fail_terminally(index, error);
        }
    }

    fn fail_terminally(&mut self, index: usize, error: TaskError) {
        self.fail_terminally_noting(index, error, json!({}));
    }

    /// Like `fail_terminally`, with `note`'s fields (who asked, why) added to the failure event.
    fn fail_terminally_noting(&mut self, index: usize, error: TaskError, note: Value) {
        self.release(index);
        let now = self.now;
        let mut detail = note;
        detail["message"] = json!(error.message);
        detail["kind"] = json!(error.kind);
        detail["terminal"] = Value::Bool(true);
        let continues = self.state.tasks[index].kind != TaskKind::Compensation
            && self.continues_on_failure(&self.state.tasks[index].step);
        if continues {
            detail["continues"] = Value::Bool(true);
        }
        if !continues
            && self.state.tasks[index].kind != TaskKind::Compensation
            && error.kind != ErrorKind::Operator
            && !self.state.tasks[index].queue.is_empty()
        {
            let task = &self.state.tasks[index];
            self.actions.push(Action::TaskFailedOnQueue {
                queue: task.queue.clone(),
                reason: format!(
                    "task {} (step {}) of job {} failed: {}",
                    task.id,
                    task.step,
                    self.state.job.id,
                    crate::text::shorten(&error.message, 200)
                ),
            });
        }
        let task = &mut self.state.tasks[index];
        task.status = TaskStatus::Failed;
        task.checking = false;
        task.ended_at = Some(now);
        let message = error.message.clone();
        task.error = Some(error);
        let kind = task.kind;
        let step = task.step.clone();
        let id = task.id.clone();
        self.save_task(index);
        self.record(EventKind::TaskFailed, Some(index), detail);
        if continues {
            // The step goes on past its failure: a fan-out's other items run on, and the
            // fan-out ends when they have all ended (`progress_fan_outs`).
            return;
        }
        match kind {
            TaskKind::Compensation => {
                self.finish_job(
                    JobStatus::CompensationFailed,
                    EventKind::JobCompensationFailed,
                    json!({"task": id, "step": step, "message": message}),
                );
            }
            _ => {
                if kind == TaskKind::Item
                    && let Some(parent) = self.fan_out_parent(&step)
                    && !self.state.tasks[parent].status.is_terminal()
                {
                    let parent_error = self.state.tasks[index].error.clone();
                    let item = self.state.tasks[index].item;
                    let task = &mut self.state.tasks[parent];
                    task.status = TaskStatus::Failed;
                    task.ended_at = Some(now);
                    task.error = parent_error.map(|mut e| {
                        e.message = format!("item {} failed: {}", item.unwrap_or(0), e.message);
                        e
                    });
                    self.save_task(parent);
                }
                self.wind_down(WindDown::StepFailed {
                    task: id,
                    step,
                    message,
                });
            }
        }
    }

    fn fan_out_parent(&self, step: &str) -> Option<usize> {
        self.state
            .tasks
            .iter()
            .position(|task| task.kind == TaskKind::FanOut && task.step == step)
    }

    /// Stops the job going forward: cancels what has not started; running tasks finish.
    fn wind_down(&mut self, reason: WindDown) {
        if self.state.job.wind_down.is_some() || self.state.job.status.is_terminal() {
            return;
        }
        self.state.job.wind_down = Some(reason.clone());
        self.state.job.status = JobStatus::Compensating;
        self.save_job();
        self.record(
            EventKind::JobCompensating,
            None,
            serde_json::to_value(&reason).unwrap_or(Value::Null),
        );
        self.cancel_unstarted_and_waiting("the job is winding down", true);
    }

    /// Cancels the forward tasks that have not started (waiting, ready) and those waiting on
    /// the server (a sleep, a signal, an approval, a callback); tasks a worker holds go on.
    /// Running children are cancelled too: with `compensate`, their tasks wait until they have
    /// undone what they did; without, the tasks end now.
    fn cancel_unstarted_and_waiting(&mut self, reason: &str, compensate: bool) {
        for index in 0..self.state.tasks.len() {
            if let Some(child) = self.running_child(index) {
                self.actions.push(Action::ToChild {
                    child,
                    command: ChildCommand::Cancel { compensate },
                });
                if !compensate {
                    self.state.tasks[index].wait = None;
                    self.cancel(index, reason);
                }
                continue;
            }
            let task = &self.state.tasks[index];
            if task.kind != TaskKind::Compensation
                && (matches!(task.status, TaskStatus::Waiting | TaskStatus::Ready)
                    || (task.status == TaskStatus::Running && task.wait.is_some()))
            {
                self.cancel(index, reason);
            }
        }
    }

    fn cancel(&mut self, index: usize, reason: &str) {
        self.release(index);
        let now = self.now;
        let task = &mut self.state.tasks[index];
        task.status = TaskStatus::Cancelled;
        task.ended_at = Some(now);
        task.checking = false;
        task.held = false;
        self.save_task(index);
        self.record(
            EventKind::TaskCancelled,
            Some(index),
            json!({"reason": reason}),
        );
    }

    fn finish_job(&mut self, status: JobStatus, kind: EventKind, detail: Value) {
        let job = &mut self.state.job;
        job.status = status;
        job.ended_at = Some(self.now);
        self.save_job();
        self.record(kind, None, detail);
    }

    /// Moves the job forward until nothing more changes.
    fn advance(&mut self) {
        loop {
            let changed = match self.state.job.status {
                JobStatus::Running => self.plan_steps(),
                JobStatus::Compensating => self.plan_compensation(),
                _ => false,
            };
            if !changed {
                break;
            }
        }
    }

    fn context(&self) -> Value {
        let job = &self.state.job;
        let mut steps = Map::new();
        for (index, task) in self.state.tasks.iter().enumerate() {
            if matches!(task.kind, TaskKind::Step | TaskKind::FanOut)
                && self.lets_dependants_go_on(index)
            {
                let error = match (&task.error, task.status) {
                    (Some(error), TaskStatus::Failed) => {
                        json!({"message": error.message, "kind": error.kind})
                    }
                    _ => Value::Null,
                };
                steps.insert(
                    task.step.clone(),
                    json!({"status": task.status, "output": task.output.clone().unwrap_or(Value::Null), "error": error}),
                );
            }
        }
        let mut context = job_context(job);
        context["steps"] = Value::Object(steps);
        context
    }

    /// The job's context (see `context`), built into `built` the first time it is asked for.
    fn context_of<'c>(&self, built: &'c mut Option<Value>) -> &'c Value {
        built.get_or_insert_with(|| self.context())
    }

    /// Renders the queue template and the `lock` and `rate` keys of the step at `step_index`
    /// for the task at `index` (see `render_queue`, `render_limits`), reading the job's context
    /// (built into `context` if it was not yet) only when the step has one of them; `Err` names
    /// the field that does not render.
    fn render_keys(
        &mut self,
        index: usize,
        step_index: usize,
        context: &mut Option<Value>,
    ) -> Result<(), (&'static str, String)> {
        let step = &self.workflow.steps[step_index];
        let route = templated_route(step);
        if route.is_none() && !has_limits(step) {
            return Ok(());
        }
        let context = self.context_of(context);
        if let Some(route) = route {
            self.render_queue(index, route, context)
                .map_err(|error| ("queue", error))?;
        }
        self.render_limits(index, step_index, context)
    }

    fn expression_failure(&mut self, index: usize, field: &str, error: impl std::fmt::Display) {
        let message = format!("{field}: {error}");
        self.fail_terminally(
            index,
            TaskError {
                message,
                retryable: false,
                kind: ErrorKind::Expression,
            },
        );
    }

    /// Refuses a task input larger than the task size limit.
    fn within_task_limit(&self, value: Value, what: &str) -> Result<Value, String> {
        if json_exceeds(&value, self.limits.task_bytes) {
            return Err(format!(
                "the rendered {what} is larger than the task size limit of {} bytes (server setting --max-task-bytes)",
                self.limits.task_bytes
            ));
        }
        Ok(value)
    }

    /// Renders the queue of a task whose handler names a template (a fixed queue was set when
    /// the task was made) and keeps it with the task, for all its attempts and check-laters;
    /// the engine creates the queue if it is new (`Action::EnsureQueue`).
    fn render_queue(
        &mut self,
        index: usize,
        route: &QueueRoute,
        context: &Value,
    ) -> Result<(), String> {
        if !route.is_template() {
            return Ok(());
        }
        let queue = route.render(context)?;
        self.actions.push(Action::EnsureQueue {
            queue: queue.clone(),
        });
        self.state.tasks[index].queue = queue;
        Ok(())
    }

    /// Renders the keys of the step's `lock` and `rate` and keeps them with the task, for all
    /// its attempts; `Err` names the field whose key does not render.
    fn render_limits(
        &mut self,
        index: usize,
        step_index: usize,
        context: &Value,
    ) -> Result<(), (&'static str, String)> {
        let step = &self.workflow.steps[step_index];
        if !has_limits(step) {
            return Ok(());
        }
        let lock = step
            .lock
            .as_ref()
            .map(|lock| render_key(&lock.key, context))
            .transpose()
            .map_err(|error| ("lock.key", error))?;
        let rate = step
            .rate
            .as_ref()
            .map(|rate| render_key(&rate.key, context))
            .transpose()
            .map_err(|error| ("rate.key", error))?;
        // A task made ready again while it still holds a slot (an operator's reset in the same
        // change that ended its attempt) keeps the slot, under the key it was taken with, for
        // the engine to free.
        let held = self.state.tasks[index]
            .limits
            .as_deref()
            .filter(|limits| limits.slot.is_some())
            .map(|limits| (limits.lock.clone(), limits.slot));
        let (lock, slot) = held.unwrap_or((lock, None));
        self.state.tasks[index].limits = Some(Box::new(TaskLimits {
            lock,
            rate,
            slot,
            parked: None,
        }));
        Ok(())
    }

    fn make_ready(&mut self, index: usize, input: Value) {
        let now = self.now;
        let task = &mut self.state.tasks[index];
        task.status = TaskStatus::Ready;
        task.input = Some(input);
        task.available_at = Some(now);
        task.ready_at = Some(now);
        self.save_task(index);
        if !self.creating {
            self.record(EventKind::TaskReady, Some(index), json!({}));
        }
        self.wake(index);
    }

    fn skip(&mut self, index: usize, reason: &str) {
        let now = self.now;
        let task = &mut self.state.tasks[index];
        task.status = TaskStatus::Skipped;
        task.ended_at = Some(now);
        self.save_task(index);
        self.record(
            EventKind::TaskSkipped,
            Some(index),
            json!({"reason": reason}),
        );
    }

    /// Readies steps whose dependencies are done, expands fan-outs, finishes the job.
    /// Returns whether anything changed.
    fn plan_steps(&mut self) -> bool {
        let mut changed = false;
        let by_step: BTreeMap<&str, usize> = self
            .state
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, task)| matches!(task.kind, TaskKind::Step | TaskKind::FanOut))
            .map(|(index, task)| (task.step.as_str(), index))
            .collect();
        let mut waiting = Vec::new();
        for (step_index, step) in self.workflow.steps.iter().enumerate() {
            let Some(&task_index) = by_step.get(step.id.as_str()) else {
                continue;
            };
            if self.state.tasks[task_index].status != TaskStatus::Waiting {
                continue;
            }
            let dependencies: Vec<usize> = step
                .depends_on
                .iter()
                .filter_map(|&d| by_step.get(self.workflow.steps[d].id.as_str()).copied())
                .collect();
            if dependencies.iter().all(|&d| self.lets_dependants_go_on(d)) {
                let statuses: Vec<TaskStatus> = dependencies
                    .iter()
                    .map(|&d| self.state.tasks[d].status)
                    .collect();
                let all_skipped =
                    !statuses.is_empty() && statuses.iter().all(|s| *s == TaskStatus::Skipped);
                waiting.push((step_index, task_index, all_skipped));
            }
        }
        for (step_index, task_index, all_skipped) in waiting {
            if self.state.job.status != JobStatus::Running {
                return true;
            }
            changed = true;
            if all_skipped {
                self.skip(task_index, "every dependency was skipped");
                continue;
            }
            let step = &self.workflow.steps[step_index];
            // Built the first time one of the step's expressions reads it: most steps have none,
            // and it copies every finished step's output.
            let mut context = None;
            if let Some(when) = &step.when {
                match when.eval(self.context_of(&mut context)) {
                    Ok(value) if !expr::truthy(&value) => {
                        self.skip(task_index, "condition `when` is false");
                        continue;
                    }
                    Ok(_) => {}
                    Err(error) => {
                        self.expression_failure(task_index, "when", error);
                        continue;
                    }
                }
            }
            let deadline = step
                .step_timeout
                .map(|timeout| self.now.saturating_add(timeout));
            self.state.tasks[task_index].deadline_at = deadline;
            if let Some(for_each) = &step.for_each {
                let items = match for_each.eval(self.context_of(&mut context)) {
                    Ok(Value::Array(items)) if items.len() <= self.limits.fan_out => items,
                    Ok(Value::Array(items)) => {
                        self.expression_failure(
                            task_index,
                            "for_each",
                            format!(
                                "{} items is more than the fan-out limit of {} (server setting --max-fan-out)",
                                items.len(),
                                self.limits.fan_out
                            ),
                        );
                        continue;
                    }
                    Ok(other) => {
                        self.expression_failure(
                            task_index,
                            "for_each",
                            format!("expected a list, got {}", type_name(&other)),
                        );
                        continue;
                    }
                    Err(error) => {
                        self.expression_failure(task_index, "for_each", error);
                        continue;
                    }
                };
                let context = context.unwrap_or_else(|| self.context());
                self.expand(step_index, task_index, items, context);
            } else {
                match &step.kind {
                    StepKind::Task(_) | StepKind::Workflow(_) => {
                        let input = match step.input() {
                            Some(template) => template
                                .render(self.context_of(&mut context))
                                .map_err(|e| e.to_string()),
                            None => Ok(self.state.job.params.clone()),
                        };
                        match input.and_then(|input| self.within_task_limit(input, "input")) {
                            Ok(input) if step.child().is_some() => {
                                self.state.tasks[task_index].input = Some(input);
                                match self.render_keys(task_index, step_index, &mut context) {
                                    Ok(()) => self.start_child_attempt(task_index),
                                    Err((field, error)) => {
                                        self.expression_failure(task_index, field, error);
                                    }
                                }
                            }
                            Ok(input) => {
                                match self.render_keys(task_index, step_index, &mut context) {
                                    Ok(()) => self.make_ready(task_index, input),
                                    Err((field, error)) => {
                                        self.expression_failure(task_index, field, error);
                                    }
                                }
                            }
                            Err(error) => self.expression_failure(task_index, "input", error),
                        }
                    }
                    other => {
                        let context = context.unwrap_or_else(|| self.context());
                        self.start_by_kind(task_index, other, &context);
                    }
                }
            }
        }
        changed |= self.progress_fan_outs();
        if self.state.job.status == JobStatus::Running
            && (0..self.state.tasks.len()).all(|index| {
                !matches!(
                    self.state.tasks[index].kind,
                    TaskKind::Step | TaskKind::FanOut
                ) || self.lets_dependants_go_on(index)
            })
        {
            self.succeed_job();
            changed = true;
        }
        changed
    }

    /// Creates one item task per element; they start waiting and `progress_fan_outs` readies
    /// them within the step's concurrency.
    fn expand(&mut self, step_index: usize, parent: usize, items: Vec<Value>, context: Value) {
        let step = &self.workflow.steps[step_index];
        let now = self.now;
        let count = items.len();
        {
            let task = &mut self.state.tasks[parent];
            task.status = TaskStatus::Running;
            task.ready_at = Some(now);
            task.started_at = Some(now);
        }
        self.save_task(parent);
        self.record(
            EventKind::FanOutExpanded,
            Some(parent),
            json!({"items": count}),
        );
        let mut context = context;
        let priority = self.state.tasks[parent].priority;
        let deadline = self.state.tasks[parent].deadline_at;
        // An item's queue template, lock and rate keys are rendered with its input: all may
        // read `item` and `index`.
        let route = templated_route(step);
        let renders_with_item = route.is_some() || has_limits(step);
        for (position, item) in items.into_iter().enumerate() {
            let position_u32 = u32::try_from(position).unwrap_or(u32::MAX);
            let input = match step.input() {
                Some(template) => {
                    context["item"] = item;
                    context["index"] = Value::from(position);
                    template.render(&context).map_err(|e| e.to_string())
                }
                None => {
                    if renders_with_item {
                        context["item"] = item.clone();
                        context["index"] = Value::from(position);
                    }
                    Ok(item)
                }
            }
            .and_then(|input| self.within_task_limit(input, "input"));
            let mut ctx = Ctx {
                now,
                ids: &mut *self.ids,
                limits: self.limits,
            };
            let mut task = new_task(
                &self.state.job,
                &mut self.state.tasks,
                &mut ctx,
                TaskKind::Item,
                &step.id,
                step.handler(),
                priority,
            );
            task.item = Some(position_u32);
            task.deadline_at = deadline;
            self.state.tasks.push(task);
            let index = self.state.tasks.len() - 1;
            self.save_task(index);
            match input {
                Ok(input) => self.state.tasks[index].input = Some(input),
                Err(error) => {
                    self.expression_failure(index, "input", error);
                    return;
                }
            }
            if let Some(route) = route
                && let Err(error) = self.render_queue(index, route, &context)
            {
                self.expression_failure(index, "queue", error);
                return;
            }
            if let Err((field, error)) = self.render_limits(index, step_index, &context) {
                self.expression_failure(index, field, error);
                return;
            }
        }
    }

    /// Readies fan-out items within concurrency and finishes fan-outs whose items are all done.
    fn progress_fan_outs(&mut self) -> bool {
        let mut changed = false;
        let parents: Vec<usize> = self
            .state
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, task)| task.kind == TaskKind::FanOut && task.status == TaskStatus::Running)
            .map(|(index, _)| index)
            .collect();
        for parent in parents {
            let step = self.state.tasks[parent].step.clone();
            let round = self.state.tasks[parent].round;
            let limit = self.workflow.steps[self.workflow.step_index(&step).unwrap_or(0)]
                .concurrency
                .map_or(usize::MAX, |c| c as usize);
            let items: Vec<usize> = self
                .state
                .tasks
                .iter()
                .enumerate()
                .filter(|(_, task)| {
                    task.kind == TaskKind::Item && task.step == step && task.round == round
                })
                .map(|(index, _)| index)
                .collect();
            let mut active = items
                .iter()
                .filter(|&&i| {
                    matches!(
                        self.state.tasks[i].status,
                        TaskStatus::Ready | TaskStatus::Running
                    )
                })
                .count();
            if self.state.job.status == JobStatus::Running {
                for &item in &items {
                    if active >= limit {
                        break;
                    }
                    if self.state.tasks[item].status == TaskStatus::Waiting {
                        self.start_item(item);
                        active += 1;
                        changed = true;
                    }
                }
            }
            let statuses: Vec<TaskStatus> =
                items.iter().map(|&i| self.state.tasks[i].status).collect();
            if statuses.iter().all(|s| s.is_terminal()) {
                let now = self.now;
                let all_succeeded = statuses.iter().all(|s| *s == TaskStatus::Succeeded);
                let outputs: Vec<Value> = items
                    .iter()
                    .map(|&i| self.state.tasks[i].output.clone().unwrap_or(Value::Null))
                    .collect();
                let task = &mut self.state.tasks[parent];
                task.ended_at = Some(now);
                if all_succeeded {
                    task.status = TaskStatus::Succeeded;
                    task.output = Some(Value::Array(outputs));
                    self.save_task(parent);
                    self.record(
                        EventKind::TaskSucceeded,
                        Some(parent),
                        json!({"items": items.len()}),
                    );
                } else {
                    let failed_item = items
                        .iter()
                        .copied()
                        .find(|&i| self.state.tasks[i].status == TaskStatus::Failed);
                    let task = &mut self.state.tasks[parent];
                    task.status = if failed_item.is_some() {
                        TaskStatus::Failed
                    } else {
                        TaskStatus::Cancelled
                    };
                    self.save_task(parent);
                    if let Some(item) = failed_item
                        && self.continues_on_failure(&step)
                    {
                        // Items fail a continuing fan-out only now that all have ended: its
                        // output lists every item's, `null` for the failed ones.
                        let item_error = self.state.tasks[item].error.clone();
                        let position = self.state.tasks[item].item.unwrap_or(0);
                        let task = &mut self.state.tasks[parent];
                        task.output = Some(Value::Array(outputs));
                        task.error = item_error.map(|mut error| {
                            error.message = format!("item {position} failed: {}", error.message);
                            error
                        });
                        let detail = json!({"items": items.len(), "continues": true});
                        self.record(EventKind::TaskFailed, Some(parent), detail);
                    }
                }
                changed = true;
            }
        }
        changed
    }

    /// While compensating: waits for running tasks, plans compensations once, runs them one at a
    /// time, and ends the job. Returns whether anything changed.
    fn plan_compensation(&mut self) -> bool {
        let mut changed = self.progress_fan_outs();
        let forward_running = self.state.tasks.iter().any(|task| {
            task.kind != TaskKind::Compensation
                && matches!(task.status, TaskStatus::Running | TaskStatus::Ready)
        });
        if forward_running {
            return changed;
        }
        if !self.state.job.compensation_planned {
            self.plan_compensation_tasks();
            changed = true;
        }
        let compensations: Vec<usize> = self
            .state
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, task)| {
                task.kind == TaskKind::Compensation && task.round == self.state.job.round
            })
            .map(|(index, _)| index)
            .collect();
        if compensations.iter().any(|&i| {
            matches!(
                self.state.tasks[i].status,
                TaskStatus::Ready | TaskStatus::Running | TaskStatus::Failed
            )
        }) {
            return changed;
        }
        match compensations
            .iter()
            .copied()
            .find(|&i| self.state.tasks[i].status == TaskStatus::Waiting)
        {
            Some(next) if self.rolls_back_a_child(next) => {
                self.begin_rollback(next);
                true
            }
            Some(next) => {
                match self
                    .compensation_input(next)
                    .map_err(|e| e.to_string())
                    .and_then(|input| self.within_task_limit(input, "input"))
                {
                    Ok(input) => match self.route_compensation(next) {
                        Ok(()) => self.make_ready(next, input),
                        Err(error) => self.expression_failure(next, "compensate.queue", error),
                    },
                    Err(error) => self.expression_failure(next, "compensate.input", error),
                }
                true
            }
            None => {
                let (status, kind) = match self.state.job.wind_down {
                    Some(WindDown::TimedOut) => (JobStatus::TimedOut, EventKind::JobFailed),
                    Some(WindDown::Cancelled { .. } | WindDown::RolledBack { .. }) => {
                        (JobStatus::Cancelled, EventKind::JobCancelled)
                    }
                    _ => (JobStatus::Failed, EventKind::JobFailed),
                };
                let detail = serde_json::to_value(&self.state.job.wind_down).unwrap_or(Value::Null);
                self.finish_job(status, kind, json!({"status": status, "cause": detail}));
                true
            }
        }
    }

    /// Creates the compensation tasks in the order they will run: tasks that failed or were
    /// interrupted after starting (the trigger first), then succeeded tasks in reverse order of
    /// completion. Steps without `compensate` are passed over.
    fn plan_compensation_tasks(&mut self) {
        self.state.job.compensation_planned = true;
        self.save_job();
        let trigger = match &self.state.job.wind_down {
            Some(WindDown::StepFailed { task, .. }) => Some(task.clone()),
            _ => None,
        };
        // A sub-workflow step that succeeded is undone by rolling its child back, unless it
        // names its own `compensate`.
        let has_compensation = |task: &Task| {
            self.workflow.step_index(&task.step).is_some_and(|i| {
                let step = &self.workflow.steps[i];
                step.compensate.is_some()
                    || (step.child().is_some()
                        && task.status == TaskStatus::Succeeded
                        && task.child.is_some())
            })
        };
        let mut interrupted: Vec<&Task> = self
            .state
            .tasks
            .iter()
            .filter(|task| matches!(task.kind, TaskKind::Step | TaskKind::Item))
            .filter(|task| matches!(task.status, TaskStatus::Failed | TaskStatus::Cancelled))
            .filter(|task| task.attempt > 0 && has_compensation(task))
            .collect();
        interrupted.sort_by_key(|task| {
            (
                Some(&task.id) != trigger.as_ref(),
                std::cmp::Reverse(task.ended_at),
                std::cmp::Reverse(task.seq),
            )
        });
        let mut succeeded: Vec<&Task> = self
            .state
            .tasks
            .iter()
            .filter(|task| matches!(task.kind, TaskKind::Step | TaskKind::Item))
            .filter(|task| task.status == TaskStatus::Succeeded && has_compensation(task))
            .collect();
        succeeded.sort_by_key(|task| std::cmp::Reverse(task.completed_seq));
        let sources: Vec<(String, crate::ids::TaskId, i32)> = interrupted
            .into_iter()
            .chain(succeeded)
            .map(|task| (task.step.clone(), task.id.clone(), task.priority))
            .collect();
        let planned: Vec<Value> = sources.iter().map(|(_, id, _)| json!(id)).collect();
        for (step, source, priority) in sources {
            let step_index = self.workflow.step_index(&step).unwrap_or(0);
            let handler = self.workflow.steps[step_index].compensate.as_ref();
            let rolled_back_child = match handler {
                Some(_) => None,
                None => self.state.task(&source).and_then(|t| t.child.clone()),
            };
            if handler.is_none() && rolled_back_child.is_none() {
                continue;
            }
            let mut ctx = Ctx {
                now: self.now,
                ids: &mut *self.ids,
                limits: self.limits,
            };
            let mut task = new_task(
                &self.state.job,
                &mut self.state.tasks,
                &mut ctx,
                TaskKind::Compensation,
                &step,
                handler,
                priority,
            );
            let source_item = self.state.task(&source).and_then(|t| t.item);
            task.item = source_item;
            task.compensates = Some(source);
            task.child = rolled_back_child;
            self.state.tasks.push(task);
            self.save_task(self.state.tasks.len() - 1);
        }
        self.record(
            EventKind::CompensationPlanned,
            None,
            json!({"undo": planned}),
        );
    }

    /// The task a compensation undoes, as its templates read it (`task`).
    fn undone_task(&self, index: usize) -> Value {
        let task = &self.state.tasks[index];
        let source = task.compensates.as_ref().and_then(|id| self.state.task(id));
        json!({
            "id": source.map(|s| s.id.clone()),
            "step": task.step,
            "item": source.and_then(|s| s.item),
            "status": source.map(|s| s.status),
            "input": source.and_then(|s| s.input.clone()),
            "output": source.and_then(|s| s.output.clone()),
            "error": source.and_then(|s| s.error.clone()),
        })
    }

    /// What a compensation's templates read: the job's context and the undone `task`.
    fn compensation_context(&self, index: usize) -> Value {
        let mut context = self.context();
        context["task"] = self.undone_task(index);
        context
    }

    fn compensation_input(&self, index: usize) -> Result<Value, EvalError> {
        match self
            .handler(index)
            .and_then(|handler| handler.input.as_ref())
        {
            Some(template) => template.render(&self.compensation_context(index)),
            None => Ok(self.undone_task(index)),
        }
    }

    /// Renders a compensation's queue when its `compensate.queue` is a template.
    fn route_compensation(&mut self, index: usize) -> Result<(), String> {
        let workflow = self.workflow;
        let task = &self.state.tasks[index];
        let Some(route) = workflow
            .task_handler(&task.step, true)
            .map(|handler| &handler.queue)
            .filter(|route| route.is_template())
        else {
            return Ok(());
        };
        let context = self.compensation_context(index);
        self.render_queue(index, route, &context)
    }
}

/// The step's queue, when it is a template rendered per task.
fn templated_route(step: &Step) -> Option<&QueueRoute> {
    step.handler()
        .map(|handler| &handler.queue)
        .filter(|route| route.is_template())
}

/// The step takes a `lock` or `rate` slot, whose keys are rendered per task.
fn has_limits(step: &Step) -> bool {
    step.lock.is_some() || step.rate.is_some()
}

pub(crate) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

mod children;
mod control;
mod operator;
mod waits;

#[cfg(test)]
mod tests;

/// Whether `lease_token` is the lease an operator revoked from `task` (`Requeue`), which its
/// worker still reports under: the task is ready again, keeping that token until a claim.
fn is_revoked(task: &Task, lease_token: &str) -> bool {
    task.status == TaskStatus::Ready
        && task.lease_token.as_deref() == Some(lease_token)
        && task
            .error
            .as_ref()
            .is_some_and(|error| error.kind == ErrorKind::Operator)
}

/// Whether a worker's report (`input`) is made under a lease an operator revoked: the engine
/// then tells the machine so (`Input::RevocationTold`) before the report is refused.
pub fn reports_revoked_lease(state: &JobState, input: &Input) -> bool {
    input
        .reported_lease()
        .and_then(|(task, lease_token)| Some((state.task(task)?, lease_token)))
        .is_some_and(|(task, lease_token)| is_revoked(task, lease_token))
}
