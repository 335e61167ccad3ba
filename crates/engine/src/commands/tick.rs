//! Time passing: lapsed leases, passed deadlines, due schedule fires.

use crate::Result;
use crate::ctx::WriteCtx;
use starbridge_core::model::Input;
use starbridge_store::rows;
use starbridge_store::rows::RowLock;

use super::{apply, load_job, workflow_of};

/// Handles every lapsed lease and passed deadline due at `ctx.now`; returns how many jobs moved.
pub(crate) fn tick(ctx: &mut WriteCtx<'_>, limit: usize) -> Result<usize> {
    crate::commands::schedules::fire_due(ctx)?;
    let due = rows::due_jobs(ctx.conn, ctx.now, u32::try_from(limit).unwrap_or(u32::MAX))?;
    for job_id in &due {
        // A job another node holds is being handled there (or will be at its next tick).
        let Some(mut state) = load_job(ctx, job_id, RowLock::Skip)? else {
            continue;
        };
        let compiled = workflow_of(ctx, &state)?;
        apply(ctx, &compiled.workflow, &mut state, Input::Tick)?;
        ctx.jobs.keep(state);
    }
    Ok(due.len())
}
