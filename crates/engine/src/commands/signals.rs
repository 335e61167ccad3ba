//! What people and other systems send a running job: signals (kept with the job until a step
//! takes them) and decisions on approval steps.

use crate::ctx::WriteCtx;
use crate::{Error, Result};
use serde_json::Value;
use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{Input, JobState};
use starbridge_store::rows;

use super::apply_to_job;

/// What became of a signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalAccepted {
    /// The signal repeats an earlier one's dedupe id: nothing changed.
    pub duplicate: bool,
    /// A step took it at once (otherwise the job keeps it until one waits for it).
    pub taken: bool,
}

/// A signal sent to a job of `namespace` by `sender`; one with the dedupe `id` of an earlier
/// signal of the job changes nothing.
pub(crate) fn signal(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    job_id: &JobId,
    name: &str,
    payload: Value,
    id: Option<&str>,
    sender: &str,
) -> Result<SignalAccepted> {
    if let Some(id) = id
        && rows::signal_seen(ctx.conn, job_id, id)?
    {
        // Only a job of this namespace answers; another's is not found.
        let visible =
            rows::load_job(ctx.conn, job_id)?.is_some_and(|job| job.namespace == namespace);
        if !visible {
            return Err(Error::NotFound(format!("job {job_id} not found")));
        }
        return Ok(SignalAccepted {
            duplicate: true,
            taken: false,
        });
    }
    let input = Input::Signal {
        name: name.to_owned(),
        payload,
        id: id.map(str::to_owned),
        sender: sender.to_owned(),
    };
    let state = apply_to_job(ctx, namespace, job_id, input)?;
    let seq = state.job.signals_received - 1;
    Ok(SignalAccepted {
        duplicate: false,
        taken: !state.signals.iter().any(|signal| signal.seq == seq),
    })
}

/// A person's decision on an approval step of a job of `namespace`; returns the job as it is
/// afterwards.
pub(crate) fn decide(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    job_id: &JobId,
    task: &TaskId,
    approve: bool,
    by: &str,
    comment: Option<&str>,
) -> Result<JobState> {
    let input = Input::Decide {
        task: task.clone(),
        approve,
        by: by.to_owned(),
        comment: comment.map(str::to_owned),
    };
    apply_to_job(ctx, namespace, job_id, input)
}
