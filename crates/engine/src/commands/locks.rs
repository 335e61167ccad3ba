//! Lock slots: handing the free slots of a key to its waiters, first come first served across
//! jobs — queued jobs (the key is their workflow's lock) and parked tasks (their step's lock).
//! Jobs and tasks hold slots of one key space per namespace.

use crate::Result;
use crate::ctx::WriteCtx;
use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{Input, Parked, Slot};
use starbridge_store::db::Conn;
use starbridge_store::rows;
use starbridge_store::rows::RowLock;

use super::{apply, load_job, workflow_of};

/// Who is next in line for a key.
enum Waiter {
    Job(JobId),
    Task(JobId, TaskId),
}

/// Serializes the nodes that count a key's holders and then take or hand out a slot.
pub(super) fn lock_key(ctx: &mut WriteCtx<'_>, namespace: &str, key: &str) -> Result<()> {
    ctx.conn.lock_key(&format!("lock\t{namespace}\t{key}"))?;
    Ok(())
}

/// Gives free slots of a lock to its waiters, oldest first, and starts the jobs among them. A
/// job that starts and ends at once frees its slot again, which this loop sees. Parked tasks
/// are handed slots only with `tasks` (at the end of a command, once every job it changed is
/// back in the job cache); without it, a parked task first in line stops the loop and the key
/// is noted for then (`WriteCtx::freed_locks`).
pub(super) fn hand_out_slots(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    key: &str,
    tasks: bool,
) -> Result<()> {
    lock_key(ctx, namespace, key)?;
    let line = Parked::lock_line(key);
    loop {
        let job = rows::first_queued(ctx.conn, namespace, key)?;
        let task = rows::first_parked(ctx.conn, namespace, &line, 1)?.pop();
        let waiter = match (job, task) {
            (None, None) => break,
            (Some((job, _)), None) => Waiter::Job(job),
            (Some((job, since)), Some((_, _, parked_at))) if since <= parked_at => Waiter::Job(job),
            (_, Some((job, task, _))) => Waiter::Task(job, task),
        };
        let handed = match waiter {
            Waiter::Task(..) if !tasks => {
                ctx.freed_locks.push((namespace.to_owned(), key.to_owned()));
                false
            }
            Waiter::Task(job, task) => grant_task(ctx, namespace, key, &job, &task)?,
            Waiter::Job(job) => start_job(ctx, namespace, key, &job)?,
        };
        if !handed {
            break;
        }
    }
    Ok(())
}

/// Starts a queued job if a slot is free for it; false when none is.
fn start_job(ctx: &mut WriteCtx<'_>, namespace: &str, key: &str, job_id: &JobId) -> Result<bool> {
    let Some(mut state) = load_job(ctx, job_id, RowLock::Wait)? else {
        return Ok(false);
    };
    let slots = state.job.lock.as_ref().map_or(1, |lock| lock.slots);
    if rows::lock_holders(ctx.conn, namespace, key)? >= slots {
        ctx.jobs.keep(state);
        return Ok(false);
    }
    rows::hold_lock(ctx.conn, namespace, key, job_id, ctx.now)?;
    let compiled = workflow_of(ctx, &state)?;
    apply(ctx, &compiled.workflow, &mut state, Input::Start)?;
    ctx.jobs.keep(state);
    Ok(true)
}

/// Hands a parked task a slot if one is free for it (by its step's `slots`): it holds the slot
/// from now and goes back into its queue's claim order; false when none is free.
fn grant_task(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    key: &str,
    job_id: &JobId,
    task_id: &TaskId,
) -> Result<bool> {
    let Some(mut state) = load_job(ctx, job_id, RowLock::Wait)? else {
        return Ok(false);
    };
    let compiled = workflow_of(ctx, &state)?;
    let slots = state
        .task(task_id)
        .and_then(|task| compiled.workflow.step_index(&task.step))
        .and_then(|index| compiled.workflow.steps[index].lock.as_ref())
        .map_or(1, |lock| lock.slots);
    let granted = rows::lock_holders(ctx.conn, namespace, key)? < slots
        && state.task(task_id).is_some_and(|task| {
            task.limits
                .as_ref()
                .is_some_and(|limits| limits.parked.is_some())
        });
    if granted {
        rows::hold_task_lock(ctx.conn, namespace, key, job_id, task_id, ctx.now)?;
        if let Some(task) = state.tasks.iter_mut().find(|task| &task.id == task_id)
            && let Some(limits) = task.limits.as_deref_mut()
        {
            limits.parked = None;
            limits.slot = Some(Slot::Granted);
            ctx.conn.defer_task(namespace, task);
            ctx.wakes.push((namespace.to_owned(), task.queue.clone()));
        }
    }
    ctx.jobs.keep(state);
    Ok(granted)
}
