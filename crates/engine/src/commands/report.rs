//! A worker's report on a task (heartbeat, complete, fail, check later), and loading the jobs
//! of a group's reports at once.

use crate::ctx::WriteCtx;
use crate::{Error, Reported, Result, TaskScope};
use starbridge_core::ids::TaskId;
use starbridge_core::machine;
use starbridge_core::model::Input;
use starbridge_store::rows;
use starbridge_store::rows::RowLock;

use super::{apply, job_of_task, lease_of, load_job, lock_jobs, workflow_of};

/// What a report is answered: the task as it is now, or why the report was refused. A refusal
/// may still have changed something, which the write commits: a worker whose lease an operator
/// revoked is told so by its refusal, and its task is then claimable at once.
pub(crate) type Answer = std::result::Result<Reported, Error>;

/// A worker's report (heartbeat, complete, fail, check-later) on a task it holds, or a success
/// it sends again under the lease that succeeded.
pub(crate) fn report(
    ctx: &mut WriteCtx<'_>,
    task_id: &TaskId,
    input: Input,
    scope: &TaskScope,
) -> Result<Answer> {
    let not_found = || Error::NotFound(format!("task {task_id} not found"));
    let job_id = job_of_task(ctx, task_id)?.ok_or_else(not_found)?;
    let mut state = load_job(ctx, &job_id, RowLock::Wait)?
        .ok_or_else(|| Error::Corrupt(format!("job {job_id} of task {task_id} not found")))?;
    let queue = state.task(task_id).map(|task| task.queue.as_str());
    if !queue.is_some_and(|queue| scope.allows(&state.job.namespace, queue)) {
        return Err(not_found());
    }
    let compiled = workflow_of(ctx, &state)?;
    if let Some((task, lease_token)) = input
        .reported_lease()
        .filter(|_| machine::reports_revoked_lease(&state, &input))
    {
        let told = Input::RevocationTold {
            task: task.clone(),
            lease_token: lease_token.to_owned(),
        };
        apply(ctx, &compiled.workflow, &mut state, told)?;
        let refused = apply(ctx, &compiled.workflow, &mut state, input);
        ctx.jobs.keep(state);
        return Ok(Err(refused.err().unwrap_or_else(|| {
            Error::Corrupt(format!(
                "a report under a revoked lease of {task_id} was taken"
            ))
        })));
    }
    // A success sent again under the lease it succeeded with changes nothing and is answered
    // as the first one was.
    if !machine::repeats_success(&state, &input) {
        apply(ctx, &compiled.workflow, &mut state, input)?;
    }
    let task = state
        .task(task_id)
        .cloned()
        .ok_or_else(|| Error::Corrupt(format!("task {task_id} vanished")))?;
    let lease = lease_of(&compiled.workflow, &task);
    let job_status = state.job.status;
    ctx.jobs.keep(state);
    Ok(Ok(Reported {
        task,
        lease,
        job_status,
    }))
}

/// Loads the jobs of the tasks a group's reports name that are not cached, in a few set-based
/// statements, their rows locked (on PostgreSQL) until the transaction ends: each report then
/// finds its job in the cache. Jobs that ended are not cached; their reports read them alone.
pub(crate) fn prefetch(ctx: &mut WriteCtx<'_>, tasks: &[TaskId]) -> Result<()> {
    let mut jobs = Vec::new();
    let mut unknown = Vec::new();
    for task in tasks {
        if ctx.jobs.job_of(task).is_some() {
            continue;
        }
        match ctx.jobs.carried_job_of(task) {
            Some(job) => jobs.push(job),
            None => unknown.push(task.clone()),
        }
    }
    if jobs.is_empty() && unknown.is_empty() {
        return Ok(());
    }
    if !unknown.is_empty() {
        jobs.extend(
            rows::jobs_of_tasks(ctx.conn, &unknown)?
                .into_iter()
                .map(|(_, job)| job),
        );
    }
    jobs.sort_unstable();
    jobs.dedup();
    for state in lock_jobs(ctx, &jobs, RowLock::Wait)? {
        ctx.jobs.load(state);
    }
    Ok(())
}
