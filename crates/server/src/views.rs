//! Conversions from the store's state to the API's wire types.

use starbridge_api::{self as api, timestamp_from_millis};
use starbridge_core::definition::Workflow;
use starbridge_core::model::{Job, JobState, Task, TaskKind, WindDown};
use starbridge_core::time::Timestamp;
use starbridge_store::{StoredEvent, StoredWorkflow};

fn time(ts: Timestamp) -> api::Timestamp {
    timestamp_from_millis(ts.0)
}

fn opt_time(ts: Option<Timestamp>) -> Option<api::Timestamp> {
    ts.map(time)
}

pub(crate) fn job_summary(job: &Job) -> api::JobSummary {
    api::JobSummary {
        id: job.id.to_string(),
        namespace: job.namespace.clone(),
        workflow: job.workflow.clone(),
        version: job.version,
        status: job.status.to_string(),
        key: job.key.clone(),
        priority: job.priority,
        created_at: time(job.created_at),
        started_at: opt_time(job.started_at),
        ended_at: opt_time(job.ended_at),
        deadline_at: opt_time(job.deadline_at),
        error: job.wind_down.as_ref().map(|reason| match reason {
            WindDown::StepFailed { step, message, .. } => format!("step {step} failed: {message}"),
            WindDown::TimedOut => "the job timeout passed".to_owned(),
        }),
    }
}

fn max_attempts(workflow: Option<&Workflow>, task: &Task) -> u32 {
    let Some(step) = workflow.and_then(|w| w.step_index(&task.step).map(|i| &w.steps[i])) else {
        return 1;
    };
    match task.kind {
        TaskKind::Compensation => step
            .compensate
            .as_ref()
            .map_or(1, |handler| handler.retry.max_attempts),
        _ => step.handler.retry.max_attempts,
    }
}

pub(crate) fn task(task: &Task, workflow: Option<&Workflow>) -> api::TaskView {
    api::TaskView {
        id: task.id.to_string(),
        step: task.step.clone(),
        kind: task.kind.to_string(),
        item: task.item,
        compensates: task.compensates.as_ref().map(ToString::to_string),
        queue: task.queue.clone(),
        command: task.command.clone(),
        status: task.status.to_string(),
        attempt: task.attempt,
        max_attempts: max_attempts(workflow, task),
        priority: task.priority,
        input: task.input.clone(),
        output: task.output.clone(),
        error: task.error.as_ref().map(|e| api::TaskError {
            message: e.message.clone(),
            retryable: e.retryable,
            kind: e.kind.to_string(),
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
    }
}

pub(crate) fn job(state: &JobState, workflow: Option<&Workflow>) -> api::JobView {
    api::JobView {
        summary: job_summary(&state.job),
        params: state.job.params.clone(),
        tasks: state.tasks.iter().map(|t| task(t, workflow)).collect(),
    }
}

pub(crate) fn leased(task: &Task, lease_ms: u64) -> api::LeasedTask {
    api::LeasedTask {
        id: task.id.to_string(),
        lease_token: task.lease_token.clone().unwrap_or_default(),
        job_id: task.job_id.to_string(),
        step: task.step.clone(),
        kind: task.kind.to_string(),
        item: task.item,
        queue: task.queue.clone(),
        command: task.command.clone(),
        input: task.input.clone().unwrap_or(serde_json::Value::Null),
        attempt: task.attempt,
        idempotency_key: task.idempotency_key(),
        lease_expires_at: time(task.lease_expires_at.unwrap_or(Timestamp(0))),
        lease_ms,
        progress: task.progress.clone(),
    }
}

pub(crate) fn event(stored: &StoredEvent) -> api::EventView {
    api::EventView {
        seq: stored.seq,
        at: time(stored.event.at),
        kind: stored.event.kind.to_string(),
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
