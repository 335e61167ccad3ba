//! Time passing: lapsed leases, passed deadlines, due schedule fires, rate buckets whose
//! parked tasks are due a token.

use crate::Result;
use crate::ctx::WriteCtx;
use starbridge_core::model::Input;
use starbridge_store::rows;
use starbridge_store::rows::RowLock;

use super::{apply, deliver_endings, workflow_of};

/// Handles every lapsed lease and passed deadline due at `ctx.now`, hands ended children to
/// their parents and refilled rate tokens to parked tasks; returns how many jobs and buckets
/// moved.
pub(crate) fn tick(ctx: &mut WriteCtx<'_>, limit: usize) -> Result<usize> {
    crate::commands::schedules::fire_due(ctx)?;
    let due = rows::due_jobs(ctx.conn, ctx.now, u32::try_from(limit).unwrap_or(u32::MAX))?;
    // The due jobs the cache does not hold are read together, in a few set-based statements
    // (many sleeps often end at once). A job another node holds is being handled there (or
    // will be at its next tick): it is skipped.
    let mut states = Vec::with_capacity(due.len());
    let mut missing = Vec::new();
    for job_id in &due {
        match ctx.jobs.take(job_id) {
            Some(state) => states.push(state),
            None => missing.push(job_id.clone()),
        }
    }
    missing.sort_unstable();
    states.extend(super::lock_jobs(ctx, &missing, RowLock::Skip)?);
    for mut state in states {
        let compiled = workflow_of(ctx, &state)?;
        let applied = apply(ctx, &compiled.workflow, &mut state, Input::Tick);
        ctx.jobs.keep(state);
        applied?;
    }
    let delivered = deliver_endings(ctx, u32::try_from(limit).unwrap_or(u32::MAX))?;
    let buckets = super::step_limits::wake_rates(ctx, u32::try_from(limit).unwrap_or(u32::MAX))?;
    Ok(due.len() + delivered + buckets)
}
