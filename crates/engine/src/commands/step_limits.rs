//! Steps' locks and per-key rates (`lock`, `rate` on a step), kept by the engine around the
//! state machine: a claim takes a task's slot and token or parks the task (ready, out of the
//! claim order, so blocked tasks never stand in front of claimable ones); the end of an attempt
//! frees its slot (handed to the next waiter, see `locks`); a rate's refill time hands tokens
//! to the tasks parked on its bucket. Tasks of other steps cost nothing here: their jobs are
//! passed over on the step definitions alone.

use crate::Result;
use crate::ctx::WriteCtx;
use starbridge_core::Workflow;
use starbridge_core::dispatch::Bucket;
use starbridge_core::ids::TaskId;
use starbridge_core::model::{Action, JobState, Parked, Slot, TaskStatus};
use starbridge_store::db::Conn;
use starbridge_store::rows;
use starbridge_store::rows::RowLock;
use starbridge_store::rows::rates::BucketId;

use super::children::ancestors_locks;
use super::load_job;
use super::locks::{hand_out_slots, lock_key};

/// What a claim of a task takes once the state machine accepted it.
#[derive(Default)]
pub(super) struct Takes {
    /// A slot of this lock key.
    slot: Option<String>,
    /// A token of this bucket, which holds `available` tokens now.
    token: Option<(BucketId, f64)>,
}

/// Whether a ready task may be claimed now.
pub(super) enum Gate {
    Go(Takes),
    /// It waits parked for a slot or a token.
    Parked,
}

/// Decides whether the claim of `task_id` may go ahead under its step's lock and rate, and
/// parks the task when it may not. A slot is held along the job and its ancestors when one of
/// them holds the key as its workflow's lock (then no slot is taken); a check-later claim
/// continues its attempt, which holds its slot and paid its token.
pub(super) fn gate(
    ctx: &mut WriteCtx<'_>,
    workflow: &Workflow,
    state: &mut JobState,
    task_id: &TaskId,
) -> Result<Gate> {
    let Some(task) = state.task(task_id) else {
        return Ok(Gate::Go(Takes::default()));
    };
    let Some(limits) = task.limits.as_deref().cloned() else {
        return Ok(Gate::Go(Takes::default()));
    };
    let Some(step) = workflow
        .step_index(&task.step)
        .map(|index| &workflow.steps[index])
    else {
        return Ok(Gate::Go(Takes::default()));
    };
    let checking = task.checking;
    let namespace = state.job.namespace.clone();
    let mut takes = Takes::default();
    if let (Some(key), Some(lock)) = (&limits.lock, &step.lock)
        && limits.slot.is_none()
        && !ancestors_locks(ctx, state)?.contains(key)
    {
        lock_key(ctx, &namespace, key)?;
        let held = rows::lock_holders(ctx.conn, &namespace, key)?;
        if held >= lock.slots {
            let parked = Parked {
                line: Parked::lock_line(key),
                since: ctx.now,
                reason: format!("waiting for lock {key} ({held}/{} held)", lock.slots),
            };
            park(ctx, state, task_id, parked);
            return Ok(Gate::Parked);
        }
        takes.slot = Some(key.clone());
    }
    if let (Some(key), Some(rate)) = (&limits.rate, &step.rate)
        && !checking
    {
        let id = BucketId {
            namespace: namespace.clone(),
            key: key.clone(),
            limit: rate.limit,
        };
        let line = Parked::rate_line(key, rate.limit);
        ctx.conn.lock_key(&format!("{namespace}\t{line}"))?;
        let bucket = rows::rates::rate_bucket(ctx.conn, &id)?;
        let available = rate
            .limit
            .available(bucket.map(|(bucket, _)| bucket), ctx.now);
        if available < 1.0 {
            let wake_at = rate.limit.next_token_at(available, ctx.now);
            let earlier = bucket
                .and_then(|(_, wake)| wake)
                .filter(|at| *at <= wake_at);
            if earlier.is_none() {
                rows::rates::set_rate_wake(ctx.conn, &id, Some(wake_at))?;
            }
            let parked = Parked {
                line,
                since: ctx.now,
                reason: format!(
                    "rate limited on key {key} ({} per {})",
                    rate.limit.tokens, rate.limit.per
                ),
            };
            park(ctx, state, task_id, parked);
            return Ok(Gate::Parked);
        }
        takes.token = Some((id, available));
    }
    Ok(Gate::Go(takes))
}

/// Takes what `gate` allowed, once the claim of `task_id` went through.
pub(super) fn take(
    ctx: &mut WriteCtx<'_>,
    state: &mut JobState,
    task_id: &TaskId,
    takes: Takes,
) -> Result<()> {
    let namespace = state.job.namespace.clone();
    let job = state.job.id.clone();
    let Some(task) = state.tasks.iter_mut().find(|task| &task.id == task_id) else {
        return Ok(());
    };
    let Some(limits) = task.limits.as_deref_mut() else {
        return Ok(());
    };
    if let Some(key) = &takes.slot {
        rows::hold_task_lock(ctx.conn, &namespace, key, &job, task_id, ctx.now)?;
    }
    if takes.slot.is_some() || limits.slot == Some(Slot::Granted) {
        limits.slot = Some(Slot::Claimed);
        ctx.conn.defer_task(&namespace, task);
    }
    if let Some((id, available)) = takes.token {
        let bucket = Bucket {
            tokens: available - 1.0,
            at: ctx.now,
        };
        rows::rates::save_rate_bucket(ctx.conn, &id, bucket)?;
    }
    Ok(())
}

fn park(ctx: &mut WriteCtx<'_>, state: &mut JobState, task_id: &TaskId, parked: Parked) {
    let namespace = state.job.namespace.clone();
    if let Some(task) = state.tasks.iter_mut().find(|task| &task.id == task_id)
        && let Some(limits) = task.limits.as_deref_mut()
    {
        limits.parked = Some(parked);
        ctx.conn.defer_task(&namespace, task);
    }
}

/// Frees the slots of the tasks the state machine just saved whose attempt ended (a claimed
/// slot: the task no longer runs nor waits to check again; a granted one: the task left
/// `ready` unclaimed), before they are persisted; the freed keys are handed out at the end of
/// the command. Jobs of workflows without step locks are passed over at once.
pub(super) fn release_ended(
    ctx: &mut WriteCtx<'_>,
    workflow: &Workflow,
    state: &mut JobState,
    actions: &[Action],
) -> Result<()> {
    if workflow.steps.iter().all(|step| step.lock.is_none()) {
        return Ok(());
    }
    let namespace = state.job.namespace.clone();
    for action in actions {
        let Action::SaveTask(id) = action else {
            continue;
        };
        let Some(task) = state.tasks.iter_mut().find(|task| &task.id == id) else {
            continue;
        };
        // A granted slot becomes a claimed one as its claim goes through (`take`).
        let holds = match task.limits.as_ref().and_then(|limits| limits.slot) {
            None => continue,
            Some(Slot::Claimed) => {
                task.status == TaskStatus::Running
                    || (task.status == TaskStatus::Ready && task.checking)
            }
            Some(Slot::Granted) => matches!(task.status, TaskStatus::Ready | TaskStatus::Running),
        };
        if holds {
            continue;
        }
        let Some(limits) = task.limits.as_deref_mut() else {
            continue;
        };
        limits.slot = None;
        rows::release_task_lock(ctx.conn, id)?;
        if let Some(key) = &limits.lock {
            ctx.freed_locks.push((namespace.clone(), key.clone()));
        }
    }
    Ok(())
}

/// Hands the slots freed during a command to their waiters (parked tasks included), once every
/// job the command changed is back in the job cache.
pub(crate) fn hand_out_freed(ctx: &mut WriteCtx<'_>) -> Result<()> {
    while let Some((namespace, key)) = ctx.freed_locks.pop() {
        ctx.freed_locks
            .retain(|(other_namespace, other)| (other_namespace, other) != (&namespace, &key));
        hand_out_slots(ctx, &namespace, &key, true)?;
    }
    Ok(())
}

/// Hands the tokens of the buckets due at `ctx.now` to the tasks parked on them, oldest first:
/// as many as the bucket holds whole tokens (at least one) go back into their queues' claim
/// order; the bucket wakes again for the rest when its next token arrives. Returns how many
/// buckets it handled.
pub(super) fn wake_rates(ctx: &mut WriteCtx<'_>, limit: u32) -> Result<usize> {
    let due = rows::rates::due_rate_buckets(ctx.conn, ctx.now, limit)?;
    for id in &due {
        let line = Parked::rate_line(&id.key, id.limit);
        ctx.conn.lock_key(&format!("{}\t{line}", id.namespace))?;
        let Some((bucket, Some(wake_at))) = rows::rates::rate_bucket(ctx.conn, id)? else {
            continue;
        };
        if wake_at > ctx.now {
            // Another node handled it first.
            continue;
        }
        let available = id.limit.available(Some(bucket), ctx.now);
        let whole = (available.floor() as u32).max(1);
        let mut parked = rows::first_parked(ctx.conn, &id.namespace, &line, whole + 1)?;
        let more = parked.len() > whole as usize;
        parked.truncate(whole as usize);
        for (job, task, _) in parked {
            unpark(ctx, &id.namespace, &job, &task)?;
        }
        let next = more.then(|| {
            id.limit
                .next_token_at(available - f64::from(whole), ctx.now)
        });
        rows::rates::set_rate_wake(ctx.conn, id, next)?;
    }
    Ok(due.len())
}

/// Puts a parked task back into its queue's claim order.
fn unpark(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    job: &starbridge_core::ids::JobId,
    task_id: &TaskId,
) -> Result<()> {
    let Some(mut state) = load_job(ctx, job, RowLock::Wait)? else {
        return Ok(());
    };
    if let Some(task) = state.tasks.iter_mut().find(|task| &task.id == task_id)
        && let Some(limits) = task.limits.as_deref_mut()
    {
        limits.parked = None;
        ctx.conn.defer_task(namespace, task);
        ctx.wakes.push((namespace.to_owned(), task.queue.clone()));
    }
    ctx.jobs.keep(state);
    Ok(())
}
