//! An operator's action on a job, and deleting a finished job.

use crate::ctx::WriteCtx;
use crate::{Error, Result};
use starbridge_core::ids::JobId;
use starbridge_core::model::{Input, JobState, OperatorAction, OperatorCommand};
use starbridge_store::rows::{self, RowLock};

use super::{apply_to_job, parent_of};

/// An operator's action on a job of `namespace`; returns the job as it is afterwards. Retry,
/// rerun and skip of a child job are refused while its parent is kept: the parent decides
/// when a child runs again (it starts a new child for a retried step).
pub(crate) fn operate(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    job_id: &JobId,
    command: OperatorCommand,
) -> Result<JobState> {
    if matches!(
        command.action,
        OperatorAction::Retry
            | OperatorAction::Rerun { .. }
            | OperatorAction::Skip { .. }
            | OperatorAction::SkipStep { .. }
    ) && let Some(parent) = parent_of(ctx, job_id)?
    {
        return Err(Error::Conflict(format!(
            "job {job_id} is a child of job {parent}: act on the parent ({} it, and it starts a new child where its step runs again)",
            command.action.name()
        )));
    }
    apply_to_job(ctx, namespace, job_id, Input::Operator(command))
}

/// Deletes a finished job of `namespace` with its tasks, history and every row of its own
/// (`rows::delete_job`, the pruner's path); its key is free again. An unfinished job is refused
/// (it has to end first), and so is a child job while its parent is kept: the parent's history
/// and any roll back of it still need the child.
pub(crate) fn delete_job(ctx: &mut WriteCtx<'_>, namespace: &str, job_id: &JobId) -> Result<()> {
    let state = rows::lock_job_state(ctx.conn, job_id, RowLock::Wait)?
        .filter(|state| state.job.namespace == namespace)
        .ok_or_else(|| Error::NotFound(format!("job {job_id} not found")))?;
    let status = state.job.status;
    if !status.is_terminal() {
        return Err(Error::Conflict(format!(
            "job {job_id} is {}: only a finished job can be deleted; cancel it first",
            status.as_str()
        )));
    }
    if let Some(parent) = parent_of(ctx, job_id)? {
        return Err(Error::Conflict(format!(
            "job {job_id} is a child of job {parent}: delete the parent first, then the child"
        )));
    }
    // A finished job is never in the job cache; make sure anyway.
    ctx.jobs.take(job_id);
    rows::delete_job(ctx.conn, job_id.as_str())?;
    Ok(())
}
