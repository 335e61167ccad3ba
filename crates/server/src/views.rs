//! Conversions from the store's state to the API's wire types.

use std::collections::HashMap;

use starbridge_api::{self as api, timestamp_from_millis};
use starbridge_core::definition::Workflow;
use starbridge_core::dispatch::{QueueState, task_waiting_reason};
use starbridge_core::model::{
    AttemptOutcome, EventKind, Job, JobState, JobStatus, Task, TaskKind, Wait, WaitFor, WindDown,
};
use starbridge_core::time::Timestamp;
use starbridge_engine::{Claimed, StoredEvent, StoredWorkflow};

fn time(ts: Timestamp) -> api::Timestamp {
    timestamp_from_millis(ts.0)
}

fn opt_time(ts: Option<Timestamp>) -> Option<api::Timestamp> {
    ts.map(time)
}

pub(crate) fn job_summary(job: &Job) -> api::JobSummary {
    job_summary_with(job, None)
}

/// The summary; `lock_held` (slots of the job's lock in use) makes a queued job's reason exact.
pub(crate) fn job_summary_with(job: &Job, lock_held: Option<u32>) -> api::JobSummary {
    let waiting_reason = match (job.status, &job.lock) {
        (JobStatus::Queued, Some(lock)) => Some(match lock_held {
            Some(held) => format!("waiting for lock {} ({held}/{} held)", lock.key, lock.slots),
            None => format!("waiting for lock {}", lock.key),
        }),
        (JobStatus::Paused, _) => Some("paused by an operator".to_owned()),
        _ => None,
    };
    api::JobSummary {
        id: job.id.to_string(),
        namespace: job.namespace.clone(),
        workflow: job.workflow.clone(),
        version: job.version,
        status: job.status.into(),
        key: job.key.clone(),
        priority: job.priority,
        created_at: time(job.created_at),
        started_at: opt_time(job.started_at),
        ended_at: opt_time(job.ended_at),
        deadline_at: opt_time(job.deadline_at),
        error: job.wind_down.as_ref().map(WindDown::describe),
        failed_steps: job.failed_steps.clone(),
        parent: job.parent.as_ref().map(|parent| api::JobParent {
            job: parent.job.to_string(),
            task: parent.task.to_string(),
            attempt: parent.attempt,
        }),
        lock: job.lock.as_ref().map(|lock| lock.key.clone()),
        waiting_reason,
        labels: job.labels.clone(),
    }
}

fn max_attempts(workflow: Option<&Workflow>, task: &Task) -> u32 {
    workflow
        .and_then(|w| w.task_handler(&task.step, task.kind == TaskKind::Compensation))
        .map_or(1, |handler| handler.retry.max_attempts)
}

/// Rebuilds each task's runs (a worker's claim, up to its outcome) from the job's history and
/// its tasks: the event that ends a run carries the run's start (`claimed_at`), and a run still
/// going is on its task's row. Histories written before claims left the history hold a
/// `task_claimed` event per claim, which opens a run the next ending event closes.
pub(crate) fn attempts(
    events: &[StoredEvent],
    tasks: &[Task],
) -> HashMap<String, Vec<api::AttemptView>> {
    let mut runs: HashMap<String, Vec<api::AttemptView>> = HashMap::new();
    for stored in events {
        let event = &stored.event;
        let Some(task) = &event.task else { continue };
        let list = runs.entry(task.to_string()).or_default();
        let outcome = match event.kind {
            EventKind::TaskClaimed => {
                list.push(running(event.attempt, &event.worker, event.at));
                continue;
            }
            EventKind::TaskSucceeded => AttemptOutcome::Succeeded,
            EventKind::TaskFailed => AttemptOutcome::Failed,
            EventKind::TaskCheckLater => AttemptOutcome::CheckLater,
            EventKind::TaskLeaseExpired => AttemptOutcome::LeaseExpired,
            EventKind::TaskTimedOut => AttemptOutcome::TimedOut,
            // An operator requeued the task: the run was stopped, and its message says by whom.
            EventKind::TaskCancelled | EventKind::TaskRequeued => AttemptOutcome::Cancelled,
            _ => continue,
        };
        if let Some(claimed_at) = event.detail["claimed_at"].as_i64() {
            list.push(running(event.attempt, &event.worker, Timestamp(claimed_at)));
        }
        if let Some(open) = list.last_mut().filter(|run| run.ended_at.is_none()) {
            open.ended_at = Some(time(event.at));
            open.outcome = outcome.into();
            open.error = event
                .detail
                .get("message")
                .and_then(|m| m.as_str())
                .map(str::to_owned);
        }
    }
    for task in tasks {
        if let Some(claimed_at) = task.claimed_at {
            runs.entry(task.id.to_string()).or_default().push(running(
                Some(task.attempt),
                &task.worker_id,
                claimed_at,
            ));
        }
    }
    runs
}

/// A run of `attempt` by `worker`, begun at `claimed_at`, still going (until the event that
/// ended it, if any, closes it).
fn running(
    attempt: Option<u32>,
    worker: &Option<String>,
    claimed_at: Timestamp,
) -> api::AttemptView {
    api::AttemptView {
        attempt: attempt.unwrap_or(0),
        worker_id: worker.clone(),
        started_at: time(claimed_at),
        ended_at: None,
        outcome: AttemptOutcome::Running.into(),
        error: None,
    }
}

pub(crate) fn task(
    task: &Task,
    workflow: Option<&Workflow>,
    attempts: Vec<api::AttemptView>,
    waiting_reason: Option<String>,
) -> api::TaskView {
    api::TaskView {
        id: task.id.to_string(),
        step: task.step.clone(),
        kind: task.kind.into(),
        item: task.item,
        compensates: task.compensates.as_ref().map(ToString::to_string),
        queue: task.queue.clone(),
        command: task.command.clone(),
        status: task.status.into(),
        attempt: task.attempt,
        max_attempts: max_attempts(workflow, task),
        priority: task.priority,
        input: task.input.clone(),
        output: task.output.clone(),
        error: task.error.as_ref().map(|e| api::TaskError {
            message: e.message.clone(),
            retryable: e.retryable,
            kind: e.kind.into(),
        }),
        progress: task.progress.clone(),
        logs: task.logs.clone(),
        worker_id: task.worker_id.clone(),
        created_at: time(task.created_at),
        ready_at: opt_time(task.ready_at),
        available_at: opt_time(task.available_at),
        started_at: opt_time(task.started_at),
        ended_at: opt_time(task.ended_at),
        lease_expires_at: opt_time(task.lease_expires_at),
        deadline_at: opt_time(task.deadline_at),
        attempts,
        waiting_reason,
        waiting_for: task.wait.as_deref().map(waiting_for),
        child: task.child.as_deref().map(ToString::to_string),
    }
}

/// What a waiting task waits for, as the API shows it.
fn waiting_for(wait: &Wait) -> api::WaitingFor {
    let mut view = api::WaitingFor::default();
    match &wait.on {
        WaitFor::Sleep { until } => view.sleep_until = Some(time(*until)),
        WaitFor::Signal { name } => view.signal = Some(name.clone()),
        WaitFor::Approval { prompt } => {
            view.approval = Some(api::ApprovalWait {
                prompt: prompt.clone(),
            });
        }
        WaitFor::Callback { until, .. } => {
            view.callback = Some(api::CallbackWait {
                until: time(*until),
            });
        }
        WaitFor::Child { job } => view.child = Some(job.to_string()),
        WaitFor::ChildRetry { at } => view.child_retry_at = Some(time(*at)),
    }
    view
}

/// What the job view needs besides the job: its workflow, history, the state of the queues its
/// tasks wait on, and how full its lock is.
pub(crate) struct JobContext<'a> {
    pub(crate) workflow: Option<&'a Workflow>,
    pub(crate) events: &'a [StoredEvent],
    pub(crate) queues: &'a HashMap<String, QueueState>,
    pub(crate) lock_held: Option<u32>,
    pub(crate) now: Timestamp,
}

/// The steps a waiting step still waits for.
fn pending_dependencies<'a>(
    state: &'a JobState,
    workflow: Option<&'a Workflow>,
    task: &Task,
) -> Vec<&'a str> {
    let Some(workflow) = workflow else {
        return Vec::new();
    };
    let Some(step) = workflow.step_index(&task.step).map(|i| &workflow.steps[i]) else {
        return Vec::new();
    };
    step.depends_on
        .iter()
        .map(|&d| workflow.steps[d].id.as_str())
        .filter(|id| {
            state.tasks.iter().any(|t| {
                t.step == *id
                    && matches!(t.kind, TaskKind::Step | TaskKind::FanOut)
                    && !workflow.lets_dependants_go_on(&t.step, t.status)
            })
        })
        .collect()
}

pub(crate) fn job(state: &JobState, context: &JobContext<'_>) -> api::JobView {
    let mut runs = attempts(context.events, &state.tasks);
    api::JobView {
        summary: job_summary_with(&state.job, context.lock_held),
        params: state.job.params.clone(),
        output: state.job.output.clone(),
        children: state
            .tasks
            .iter()
            .filter(|t| t.kind != TaskKind::Compensation)
            .filter_map(|t| t.child.as_deref().map(ToString::to_string))
            .collect(),
        tasks: state
            .tasks
            .iter()
            .map(|t| {
                let pending = if t.kind == TaskKind::Compensation {
                    Vec::new()
                } else {
                    pending_dependencies(state, context.workflow, t)
                };
                let reason =
                    task_waiting_reason(t, &pending, context.queues.get(&t.queue), context.now);
                task(
                    t,
                    context.workflow,
                    runs.remove(t.id.as_str()).unwrap_or_default(),
                    reason,
                )
            })
            .collect(),
    }
}

pub(crate) fn leased(claimed: &Claimed) -> api::LeasedTask {
    let task = &claimed.task;
    api::LeasedTask {
        id: task.id.to_string(),
        lease_token: task.lease_token.clone().unwrap_or_default(),
        job_id: task.job_id.to_string(),
        step: task.step.clone(),
        kind: task.kind.into(),
        item: task.item,
        queue: task.queue.clone(),
        command: task.command.clone(),
        input: task.input.clone().unwrap_or(serde_json::Value::Null),
        attempt: task.attempt,
        idempotency_key: task.idempotency_key(),
        lease_expires_at: time(task.lease_expires_at.unwrap_or(Timestamp(0))),
        lease_ms: claimed.lease.as_millis(),
        progress: task.progress.clone(),
        callback_token: claimed.callback_token.clone(),
        traceparent: claimed.traceparent.clone(),
    }
}

pub(crate) fn event(stored: &StoredEvent) -> api::EventView {
    api::EventView {
        seq: stored.seq,
        at: time(stored.event.at),
        kind: stored.event.kind.into(),
        task_id: stored.event.task.as_ref().map(ToString::to_string),
        step: stored.step.clone(),
        attempt: stored.event.attempt,
        worker_id: stored.event.worker.clone(),
        detail: stored.event.detail.clone(),
    }
}

pub(crate) fn workflow_summary(stored: &StoredWorkflow) -> api::WorkflowSummary {
    api::WorkflowSummary {
        namespace: stored.namespace.clone(),
        name: stored.name.clone(),
        version: stored.version,
        description: stored.description.clone(),
        steps: stored.steps as usize,
        created_at: time(stored.created_at),
    }
}
