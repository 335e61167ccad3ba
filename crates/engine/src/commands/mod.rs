//! The write operations, one file per kind of input. Each runs inside the writer's group
//! transaction (`crate::ctx::WriteCtx`): it loads the job, lets the pure state machine decide,
//! and persists the new state, its history events, the outbox's deliveries and the wake-ups in
//! the same transaction.

mod callbacks;
mod children;
mod claim;
mod locks;
mod operate;
pub(crate) mod outbox;
mod queues;
mod report;
pub(crate) mod schedules;
mod signals;
mod step_limits;
mod submit;
mod tick;
pub(crate) mod tokens;
mod workflows;

pub use callbacks::CallbackAccepted;
pub(crate) use callbacks::{callback, callback_token};
use children::{check_children, child_versions, deliver_endings, parent_of};
pub(crate) use claim::shared as shared_claims;
pub(crate) use claim::{claim, open_queues, stored_queues};
pub(crate) use operate::{delete_job, operate};
pub use queues::QueueStates;
pub(crate) use queues::{
    configure_prefix, configure_queue, drop_settings, read_queue_states, ready_queues, settings_of,
};
pub(crate) use report::{Answer, prefetch, report};
pub use signals::SignalAccepted;
pub(crate) use signals::{decide, signal};
pub(crate) use step_limits::hand_out_freed;
pub(crate) use submit::{Prepared, prepare, submit};
pub(crate) use tick::tick;
pub(crate) use workflows::{apply_workflow, delete_workflow};

use claim::lease_of;
use locks::hand_out_slots;
use workflows::{check_no_nul, store_workflow};

use crate::cache::Compiled;
use crate::ctx::WriteCtx;
use crate::{Error, Result};
use starbridge_core::Workflow;
use starbridge_core::definition::Problem;
use starbridge_core::ids::{IdSource, JobId, TaskId};
use starbridge_core::labels::{self, Labels};
use starbridge_core::limits::Limits;
use starbridge_core::machine::{self, Ctx};
use starbridge_core::model::{Action, Input, JobState, Rejection};
use starbridge_store::rows;
use starbridge_store::rows::RowLock;
use std::collections::HashSet;
/// Fresh ids from UUIDv7 (time-ordered, so indexes append).
pub(crate) struct UuidIds;
impl IdSource for UuidIds {
    fn task_id(&mut self) -> TaskId {
        TaskId::from_unique(&fresh_unique())
    }

    fn job_id(&mut self) -> JobId {
        new_job_id()
    }
}

pub(crate) fn new_job_id() -> JobId {
    JobId::from_unique(&fresh_unique())
}

/// The unique part of a fresh id: a version 7 UUID in its compact form (`ids::compact_unique`).
pub(crate) fn fresh_unique() -> String {
    starbridge_core::ids::compact_unique(uuid::Uuid::now_v7().as_u128())
}

pub(crate) fn invalid(field: &str, message: impl Into<String>) -> Error {
    Error::Invalid(vec![Problem {
        field: field.to_owned(),
        message: message.into(),
    }])
}

/// Refuses labels that break the rules of labels (each named `labels.<key>`), or more of them
/// than `--max-labels`.
pub(crate) fn check_labels(limits: Limits, labels: &Labels) -> Result<()> {
    let mut problems = labels::check("labels", labels);
    problems.extend(labels::check_count("labels", labels.len(), limits.labels).err());
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Invalid(problems))
    }
}

/// A job with its tasks for a command to change: from the writer's job cache when it holds the
/// job, else from the database, its row locked as `lock` says. The command hands it back with
/// `ctx.jobs.keep` once persisted.
fn load_job(ctx: &mut WriteCtx<'_>, id: &JobId, lock: RowLock) -> Result<Option<Box<JobState>>> {
    if let Some(state) = ctx.jobs.take(id) {
        return Ok(Some(state));
    }
    Ok(rows::lock_job_state(ctx.conn, id, lock)?.map(Box::new))
}

/// Jobs `ids` (none of them in the job cache) with their tasks, locked as `lock` says (those
/// that exist, and with `RowLock::Skip` that no other node holds; in id order), in a few
/// set-based statements. On PostgreSQL a job a committed transaction of this node carried over
/// comes from memory when its rows' versions show no one changed it since (see `jobs`): then
/// every job's row is locked and its rows' versions read first, and only the others are read
/// whole (the lock taken already). The versions of the rows read go to the job cache, so that
/// the transaction can carry the jobs over once committed.
// Boxed as the job cache and the claims hold them: unboxing would copy each state twice.
#[allow(clippy::vec_box)]
fn lock_jobs(ctx: &mut WriteCtx<'_>, ids: &[JobId], lock: RowLock) -> Result<Vec<Box<JobState>>> {
    ctx.jobs.changing(ids);
    let (mut states, to_read, lock) = if ctx.jobs.any_carried(ids) {
        let now = rows::job_row_versions(ctx.conn, ids, lock)?;
        let revived = ctx.jobs.carried_matching(ids, now);
        (revived.states, revived.to_read, RowLock::None)
    } else {
        (Vec::new(), ids.to_vec(), lock)
    };
    for loaded in rows::lock_job_states(ctx.conn, &to_read, lock)? {
        if let Some(versions) = loaded.versions {
            ctx.jobs.read_with(versions);
        }
        states.push(Box::new(loaded.state));
    }
    Ok(states)
}

/// Applies `input` to a job of `namespace` (a job of another namespace is not found) and
/// returns the job as it is afterwards.
fn apply_to_job(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    job_id: &JobId,
    input: Input,
) -> Result<JobState> {
    let mut state = load_job(ctx, job_id, RowLock::Wait)?
        .filter(|state| state.job.namespace == namespace)
        .ok_or_else(|| Error::NotFound(format!("job {job_id} not found")))?;
    let compiled = workflow_of(ctx, &state)?;
    let applied = apply(ctx, &compiled.workflow, &mut state, input);
    ctx.jobs.keep(state.clone());
    applied.map(|()| *state)
}

/// The job of a task: from the job cache when it holds the job, else from the database.
fn job_of_task(ctx: &mut WriteCtx<'_>, task: &TaskId) -> Result<Option<JobId>> {
    match ctx.jobs.job_of(task) {
        Some(job) => Ok(Some(job.clone())),
        None => Ok(rows::job_of_task(ctx.conn, task)?),
    }
}

fn workflow_of(ctx: &mut WriteCtx<'_>, state: &JobState) -> Result<std::sync::Arc<Compiled>> {
    ctx.workflow(&state.job.namespace, &state.job.workflow, state.job.version)
}

fn apply(
    ctx: &mut WriteCtx<'_>,
    workflow: &Workflow,
    state: &mut JobState,
    input: Input,
) -> Result<()> {
    let mut ids = UuidIds;
    let mut machine_ctx = Ctx {
        now: ctx.now,
        ids: &mut ids,
        limits: ctx.limits,
    };
    let before = state.job.status;
    let actions = machine::apply(workflow, state, input, &mut machine_ctx).map_err(refusal)?;
    step_limits::release_ended(ctx, workflow, state, &actions)?;
    let follow_ups = persist(ctx, state, actions)?;
    if state.job.status != before {
        crate::commands::outbox::enqueue(ctx, &state.job, Some(before))?;
        if state.job.status.is_terminal()
            && let Some(parent) = &state.job.parent
        {
            rows::children::note_ending(ctx.conn, &state.job.id, &parent.job, ctx.now)?;
        }
    }
    carry_out(ctx, state, follow_ups)
}

/// Does what the state machine asked of child jobs (see `children`), after the job's own rows.
fn carry_out(ctx: &mut WriteCtx<'_>, state: &mut JobState, follow_ups: Vec<Action>) -> Result<()> {
    for action in follow_ups {
        match action {
            Action::StartChild(start) => children::start_child(ctx, state, start)?,
            Action::ToChild { child, command } => {
                let by = state.job.id.clone();
                children::command_child(ctx, &by, &child, command)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// How a request the state machine refused is answered.
fn refusal(rejection: Rejection) -> Error {
    match rejection {
        Rejection::UnknownTask(task) => Error::NotFound(format!("task {task} not found")),
        Rejection::UnknownSignal { .. } => invalid("name", rejection.to_string()),
        Rejection::UnknownCallback => Error::NotFound(rejection.to_string()),
        Rejection::CallbackGone(reason) => Error::Gone(reason),
        other => Error::Conflict(other.to_string()),
    }
}

/// Writes what the state machine decided: job row, changed tasks, history, wake-ups; returns
/// what it asked of child jobs, for `carry_out`.
fn persist(ctx: &mut WriteCtx<'_>, state: &JobState, actions: Vec<Action>) -> Result<Vec<Action>> {
    let mut follow_ups = Vec::new();
    let mut saved_job = false;
    let mut saved_tasks: HashSet<TaskId> = HashSet::new();
    let mut released = Vec::new();
    let mut queues_made: HashSet<String> = HashSet::new();
    let namespace = state.job.namespace.as_str();
    for action in actions {
        match action {
            Action::SaveJob => {
                if !saved_job {
                    ctx.conn.defer_job(&state.job);
                    saved_job = true;
                }
            }
            Action::SaveTask(id) => {
                if saved_tasks.insert(id.clone()) {
                    let task = state
                        .task(&id)
                        .ok_or_else(|| Error::Corrupt(format!("task {id} to save is missing")))?;
                    ctx.conn.defer_task(namespace, task);
                }
            }
            Action::Record(event) => {
                let step = event
                    .task
                    .as_ref()
                    .and_then(|id| state.task(id))
                    .map(|task| task.step.as_str());
                ctx.conn.defer_event(&state.job.id, step, &event);
                if ctx.tracing
                    && let Some(span) = crate::traces::ended(state, &event)
                {
                    ctx.spans.push(span);
                }
                crate::commands::outbox::enqueue_task_event(ctx, state, &event)?;
            }
            Action::Announce(event) => {
                crate::commands::outbox::enqueue_task_event(ctx, state, &event)?;
            }
            Action::Wake {
                queue,
                claimable: true,
            } => ctx.wakes.push((namespace.to_owned(), queue)),
            Action::Wake {
                queue,
                claimable: false,
            } => ctx.wakes_later.push((namespace.to_owned(), queue)),
            Action::EnsureQueue { queue } => {
                if !queues_made.contains(&queue) {
                    rows::ensure_queue(ctx.conn, namespace, &queue, ctx.now)?;
                    ctx.reads.forget_queue(namespace, &queue);
                    queues_made.insert(queue);
                }
            }
            Action::TaskFailedOnQueue { queue, reason } => {
                queues::stop_on_error(ctx, namespace, &queue, &reason)?;
            }
            Action::ReleaseLock { key } => released.push(key),
            Action::InsertSignal(signal) => rows::insert_signal(ctx.conn, &state.job, &signal)?,
            Action::ConsumeSignal { seq, task } => {
                rows::consume_signal(ctx.conn, &state.job.id, seq, &task)?;
            }
            action @ (Action::StartChild(_) | Action::ToChild { .. }) => follow_ups.push(action),
        }
    }
    for key in released {
        rows::release_lock(ctx.conn, &state.job.id)?;
        hand_out_slots(ctx, namespace, &key, false)?;
    }
    Ok(follow_ups)
}
