//! An operator's action on a job.

use crate::Result;
use crate::ctx::WriteCtx;
use starbridge_core::ids::JobId;
use starbridge_core::model::{Input, JobState, OperatorCommand};

use super::apply_to_job;

/// An operator's action on a job of `namespace`; returns the job as it is afterwards.
pub(crate) fn operate(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    job_id: &JobId,
    command: OperatorCommand,
) -> Result<JobState> {
    apply_to_job(ctx, namespace, job_id, Input::Operator(command))
}
