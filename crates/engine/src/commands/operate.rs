//! An operator's action on a job.

use crate::ctx::WriteCtx;
use crate::{Error, Result};
use starbridge_core::ids::JobId;
use starbridge_core::model::{Input, JobState, OperatorAction, OperatorCommand};

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
        OperatorAction::Retry | OperatorAction::Rerun { .. } | OperatorAction::Skip { .. }
    ) && let Some(parent) = parent_of(ctx, job_id)?
    {
        return Err(Error::Conflict(format!(
            "job {job_id} is a child of job {parent}: act on the parent ({} it, and it starts a new child where its step runs again)",
            command.action.name()
        )));
    }
    apply_to_job(ctx, namespace, job_id, Input::Operator(command))
}
