//! Cron schedules: checking and storing a schedule a client asks for, pausing and resuming, and
//! firing the due ones inside the writer's transaction (their rows are the store's
//! `rows::schedules`). Each fire submits a job keyed by schedule and fire time, so a fire never
//! creates two jobs, whichever node or retry runs it.

use serde_json::Value;
use starbridge_core::ids::JobId;
use starbridge_core::labels::Labels;
use starbridge_core::schedule::{self, CatchUp, CronSpec, FireDecision, Overlap};
use starbridge_core::time::Timestamp;
use starbridge_store::db::Conn;
use starbridge_store::rows::{self, RowLock, schedules::StoredSchedule};

use crate::commands::{self, invalid};
use crate::ctx::WriteCtx;
use crate::{Error, Result, Submit};

/// What a client asks for when it creates or replaces a schedule.
#[derive(Debug, Clone)]
pub struct ScheduleSpec {
    pub workflow: String,
    pub params: Value,
    pub cron: String,
    pub timezone: String,
    pub overlap: Overlap,
    pub catch_up: CatchUp,
    pub paused: bool,
    /// The labels of the jobs it starts, merged over their workflow's.
    pub labels: Labels,
}

/// Resolves a time zone name (reads the system's tz database).
pub fn time_zone(name: &str) -> Result<jiff::tz::TimeZone> {
    jiff::tz::TimeZone::get(name).map_err(|_| {
        invalid(
            "timezone",
            format!("unknown time zone '{name}': use an IANA name such as UTC or Europe/Paris"),
        )
    })
}

/// Creates or replaces a schedule; the next fire is computed from now.
pub(crate) fn put(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    name: &str,
    spec: ScheduleSpec,
) -> Result<StoredSchedule> {
    starbridge_core::definition::check_name(name).map_err(|message| invalid("name", message))?;
    let cron = CronSpec::parse(&spec.cron).map_err(|message| invalid("cron", message))?;
    let tz = time_zone(&spec.timezone)?;
    if rows::workflow(ctx.conn, namespace, &spec.workflow, None)?.is_none() {
        return Err(invalid(
            "workflow",
            format!(
                "workflow '{}' not found in namespace '{namespace}': apply it first",
                spec.workflow
            ),
        ));
    }
    if !spec.params.is_object() {
        return Err(invalid("params", "must be a JSON object"));
    }
    commands::check_labels(ctx.limits, &spec.labels)?;
    if let CatchUp::All { limit } = spec.catch_up
        && limit == 0
    {
        return Err(invalid("catch_up.limit", "must be at least 1"));
    }
    let existing = rows::schedules::get(ctx.conn, namespace, name, RowLock::Wait)?;
    let schedule = StoredSchedule {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        workflow: spec.workflow,
        params: spec.params,
        next_fire_at: cron.next_after(&tz, ctx.now),
        cron: spec.cron,
        timezone: spec.timezone,
        overlap: spec.overlap,
        catch_up: spec.catch_up,
        paused: spec.paused,
        labels: spec.labels,
        pending_fire_at: None,
        last_fire_at: existing.as_ref().and_then(|s| s.last_fire_at),
        last_job_id: existing.as_ref().and_then(|s| s.last_job_id.clone()),
        last_error: None,
        created_at: existing.as_ref().map_or(ctx.now, |s| s.created_at),
        updated_at: ctx.now,
    };
    rows::ensure_namespace(ctx.conn, namespace, ctx.now)?;
    rows::schedules::save(ctx.conn, &schedule)?;
    Ok(schedule)
}

/// Pauses or resumes a schedule. A resumed schedule fires next at its next occurrence from now
/// (fires while paused are not caught up).
pub(crate) fn set_paused(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    name: &str,
    paused: bool,
) -> Result<StoredSchedule> {
    let mut schedule = rows::schedules::get(ctx.conn, namespace, name, RowLock::Wait)?
        .ok_or_else(|| Error::NotFound(format!("schedule {name} not found")))?;
    if schedule.paused != paused && !paused {
        let cron = CronSpec::parse(&schedule.cron).map_err(Error::Corrupt)?;
        schedule.next_fire_at = cron.next_after(&time_zone(&schedule.timezone)?, ctx.now);
    }
    schedule.paused = paused;
    schedule.updated_at = ctx.now;
    rows::schedules::save(ctx.conn, &schedule)?;
    Ok(schedule)
}

pub(crate) fn delete(ctx: &mut WriteCtx<'_>, namespace: &str, name: &str) -> Result<()> {
    if !rows::schedules::delete(ctx.conn, namespace, name)? {
        return Err(Error::NotFound(format!("schedule {name} not found")));
    }
    Ok(())
}

/// Fires every due schedule; returns how many fires started a job.
pub(crate) fn fire_due(ctx: &mut WriteCtx<'_>) -> Result<usize> {
    // Another node firing a schedule right now holds its row: it is skipped here.
    let due = rows::schedules::due(ctx.conn, ctx.now)?;
    let mut started = 0;
    for mut schedule in due {
        let previous_unfinished = match &schedule.last_job_id {
            Some(job) => rows::load_job(ctx.conn, job)?.is_some_and(|j| !j.status.is_terminal()),
            None => false,
        };
        let mut fires = Vec::new();
        if let Some(pending) = schedule.pending_fire_at
            && !previous_unfinished
        {
            fires.push(pending);
            schedule.pending_fire_at = None;
        }
        if let Some(next) = schedule.next_fire_at
            && next <= ctx.now
        {
            // A schedule that can no longer be computed (say its time zone vanished from the
            // system's database) stops firing and says why; the others go on.
            let parsed = CronSpec::parse(&schedule.cron)
                .map_err(|message| invalid("cron", message))
                .and_then(|cron| Ok((cron, time_zone(&schedule.timezone)?)));
            match parsed {
                Ok((cron, tz)) => {
                    let due = schedule::due(&cron, &tz, next, ctx.now, schedule.catch_up);
                    schedule.next_fire_at = due.next;
                    fires.extend(due.fires);
                }
                Err(error) => {
                    tracing::warn!(schedule = %schedule.name, %error, "schedule cannot fire");
                    schedule.next_fire_at = None;
                    schedule.last_error = Some(format!("stopped: {error}"));
                }
            }
        }
        let mut unfinished = previous_unfinished;
        for fire in fires {
            match schedule::decide(schedule.overlap, unfinished) {
                FireDecision::Skip => {}
                FireDecision::Hold => schedule.pending_fire_at = Some(fire),
                FireDecision::Start => {
                    match start(ctx, &schedule, fire) {
                        Ok(job) => {
                            schedule.last_job_id = Some(job);
                            schedule.last_error = None;
                            started += 1;
                            unfinished = true;
                        }
                        Err(error) => {
                            tracing::warn!(schedule = %schedule.name, %error, "a schedule fire could not start its job");
                            schedule.last_error = Some(error.to_string());
                        }
                    }
                    schedule.last_fire_at = Some(fire);
                }
            }
        }
        rows::schedules::save(ctx.conn, &schedule)?;
    }
    Ok(started)
}

/// Starts the job of one fire under its own savepoint, so a refused submit writes nothing.
fn start(ctx: &mut WriteCtx<'_>, schedule: &StoredSchedule, fire: Timestamp) -> Result<JobId> {
    ctx.conn.batch("SAVEPOINT fire")?;
    let request = Submit {
        workflow: Some(schedule.workflow.clone()),
        params: Some(schedule.params.clone()),
        key: Some(format!("schedule:{}:{}", schedule.name, fire.0)),
        actor: Some(format!("schedule {}", schedule.name)),
        labels: schedule.labels.clone(),
        ..Submit::default()
    };
    let wakes = ctx.wakes.len();
    match commands::submit(ctx, &schedule.namespace, &request, None) {
        Ok(submitted) => {
            ctx.conn.batch("RELEASE fire")?;
            Ok(submitted.state.job.id)
        }
        Err(error) => {
            ctx.conn.batch("ROLLBACK TO fire; RELEASE fire")?;
            ctx.wakes.truncate(wakes);
            Err(error)
        }
    }
}
