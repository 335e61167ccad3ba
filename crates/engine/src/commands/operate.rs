//! An operator's action on a job.

use crate::ctx::WriteCtx;
use crate::{Error, Result};
use starbridge_core::ids::JobId;
use starbridge_core::model::{Input, JobState, OperatorCommand};
use starbridge_store::rows::RowLock;

use super::{apply, load_job, workflow_of};

/// An operator's action on a job of `namespace`; returns the job as it is afterwards.
pub(crate) fn operate(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    job_id: &JobId,
    command: OperatorCommand,
) -> Result<JobState> {
    let mut state = load_job(ctx, job_id, RowLock::Wait)?
        .filter(|state| state.job.namespace == namespace)
        .ok_or_else(|| Error::NotFound(format!("job {job_id} not found")))?;
    let compiled = workflow_of(ctx, &state)?;
    apply(
        ctx,
        &compiled.workflow,
        &mut state,
        Input::Operator(command),
    )?;
    ctx.jobs.keep(state.clone());
    Ok(state)
}
