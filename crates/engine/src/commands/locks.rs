//! Lock slots: starting the jobs that wait for a key once a slot frees.

use crate::Result;
use crate::ctx::WriteCtx;
use starbridge_core::model::Input;
use starbridge_store::db::Conn;
use starbridge_store::rows;
use starbridge_store::rows::RowLock;

use super::{apply, load_job, workflow_of};

/// Gives free slots of a lock to the jobs waiting for it, first come first served, and starts
/// them. A job that starts and ends at once frees its slot again, which this loop sees.
pub(super) fn start_waiting_jobs(ctx: &mut WriteCtx<'_>, namespace: &str, key: &str) -> Result<()> {
    ctx.conn.lock_key(&format!("lock\t{namespace}\t{key}"))?;
    while let Some(job_id) = rows::first_queued(ctx.conn, namespace, key)? {
        let Some(mut state) = load_job(ctx, &job_id, RowLock::Wait)? else {
            break;
        };
        let slots = state.job.lock.as_ref().map_or(1, |lock| lock.slots);
        if rows::lock_holders(ctx.conn, namespace, key)? >= slots {
            ctx.jobs.keep(state);
            break;
        }
        rows::hold_lock(ctx.conn, namespace, key, &job_id, ctx.now)?;
        let compiled = workflow_of(ctx, &state)?;
        apply(ctx, &compiled.workflow, &mut state, Input::Start)?;
        ctx.jobs.keep(state);
    }
    Ok(())
}
