//! Cron schedules in the store: their rows, and firing the due ones inside the writer's
//! transaction. Each fire submits a job keyed by schedule and fire time, so a fire never creates
//! two jobs, whichever node or retry runs it.

use crate::db::{Conn, Queries, Row, args};
use serde_json::Value;
use starbridge_core::ids::JobId;
use starbridge_core::schedule::{self, CatchUp, CronSpec, FireDecision, Overlap};
use starbridge_core::time::Timestamp;

use crate::commands::{self, invalid};
use crate::writer::WriteCtx;
use crate::{Error, Result, Submit};

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSchedule {
    pub namespace: String,
    pub name: String,
    pub workflow: String,
    pub params: Value,
    pub cron: String,
    pub timezone: String,
    pub overlap: Overlap,
    pub catch_up: CatchUp,
    pub paused: bool,
    pub next_fire_at: Option<Timestamp>,
    pub pending_fire_at: Option<Timestamp>,
    pub last_fire_at: Option<Timestamp>,
    pub last_job_id: Option<JobId>,
    pub last_error: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

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

const COLUMNS: &str = "namespace, name, workflow, params, cron, timezone, overlap, catch_up, paused, \
     next_fire_at, pending_fire_at, last_fire_at, last_job_id, last_error, created_at, updated_at";

fn corrupt(what: &str) -> Error {
    Error::Corrupt(format!("stored schedule has a bad {what}"))
}

fn from_row(row: &mut Row) -> Result<StoredSchedule> {
    let params: String = row.get(3)?;
    let overlap: String = row.get(6)?;
    let catch_up: String = row.get(7)?;
    let last_job: Option<String> = row.get(12)?;
    Ok(StoredSchedule {
        namespace: row.get(0)?,
        name: row.get(1)?,
        workflow: row.get(2)?,
        params: serde_json::from_str(&params).map_err(|_| corrupt("params"))?,
        cron: row.get(4)?,
        timezone: row.get(5)?,
        overlap: Overlap::parse(&overlap).ok_or_else(|| corrupt("overlap"))?,
        catch_up: serde_json::from_str(&catch_up).map_err(|_| corrupt("catch_up"))?,
        paused: row.get(8)?,
        next_fire_at: row.get::<Option<i64>>(9)?.map(Timestamp),
        pending_fire_at: row.get::<Option<i64>>(10)?.map(Timestamp),
        last_fire_at: row.get::<Option<i64>>(11)?.map(Timestamp),
        last_job_id: last_job.and_then(|id| JobId::parse(&id)),
        last_error: row.get(13)?,
        created_at: Timestamp(row.get(14)?),
        updated_at: Timestamp(row.get(15)?),
    })
}

pub(crate) fn get(
    conn: &mut dyn Conn,
    namespace: &str,
    name: &str,
) -> Result<Option<StoredSchedule>> {
    conn.query_opt(
        &format!("SELECT {COLUMNS} FROM schedules WHERE namespace = ?1 AND name = ?2"),
        args![namespace, name],
        from_row,
    )
}

/// A schedule to change, locked against other server nodes until the transaction ends.
fn get_for_update(
    conn: &mut dyn Conn,
    namespace: &str,
    name: &str,
) -> Result<Option<StoredSchedule>> {
    conn.query_opt(
        &format!("SELECT {COLUMNS} FROM schedules WHERE namespace = ?1 AND name = ?2 FOR UPDATE"),
        args![namespace, name],
        from_row,
    )
}

pub(crate) fn list(conn: &mut dyn Conn, namespace: &str) -> Result<Vec<StoredSchedule>> {
    conn.query_map(
        &format!("SELECT {COLUMNS} FROM schedules WHERE namespace = ?1 ORDER BY name"),
        args![namespace],
        from_row,
    )
}

fn save(conn: &mut dyn Conn, schedule: &StoredSchedule) -> Result<()> {
    conn.execute(
        "INSERT INTO schedules (namespace, name, workflow, params, cron, timezone, overlap, catch_up, \
         paused, next_fire_at, pending_fire_at, last_fire_at, last_job_id, last_error, created_at, \
         updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16) \
         ON CONFLICT (namespace, name) DO UPDATE SET workflow = excluded.workflow, \
         params = excluded.params, cron = excluded.cron, timezone = excluded.timezone, \
         overlap = excluded.overlap, catch_up = excluded.catch_up, paused = excluded.paused, \
         next_fire_at = excluded.next_fire_at, pending_fire_at = excluded.pending_fire_at, \
         last_fire_at = excluded.last_fire_at, last_job_id = excluded.last_job_id, \
         last_error = excluded.last_error, updated_at = excluded.updated_at",
        args![
        schedule.namespace,
        schedule.name,
        schedule.workflow,
        schedule.params.to_string(),
        schedule.cron,
        schedule.timezone,
        schedule.overlap.as_str(),
        serde_json::to_string(&schedule.catch_up).unwrap_or_default(),
        schedule.paused,
        schedule.next_fire_at.map(|t| t.0),
        schedule.pending_fire_at.map(|t| t.0),
        schedule.last_fire_at.map(|t| t.0),
        schedule.last_job_id.as_ref().map(JobId::as_str),
        schedule.last_error,
        schedule.created_at.0,
        schedule.updated_at.0,
        ],
    )?;
    Ok(())
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
    if crate::rows::workflow(ctx.conn, namespace, &spec.workflow, None)?.is_none() {
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
    if let CatchUp::All { limit } = spec.catch_up
        && limit == 0
    {
        return Err(invalid("catch_up.limit", "must be at least 1"));
    }
    let existing = get_for_update(ctx.conn, namespace, name)?;
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
        pending_fire_at: None,
        last_fire_at: existing.as_ref().and_then(|s| s.last_fire_at),
        last_job_id: existing.as_ref().and_then(|s| s.last_job_id.clone()),
        last_error: None,
        created_at: existing.as_ref().map_or(ctx.now, |s| s.created_at),
        updated_at: ctx.now,
    };
    crate::rows::ensure_namespace(ctx.conn, namespace, ctx.now)?;
    save(ctx.conn, &schedule)?;
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
    let mut schedule = get_for_update(ctx.conn, namespace, name)?
        .ok_or_else(|| Error::NotFound(format!("schedule {name} not found")))?;
    if schedule.paused != paused && !paused {
        let cron = CronSpec::parse(&schedule.cron).map_err(Error::Corrupt)?;
        schedule.next_fire_at = cron.next_after(&time_zone(&schedule.timezone)?, ctx.now);
    }
    schedule.paused = paused;
    schedule.updated_at = ctx.now;
    save(ctx.conn, &schedule)?;
    Ok(schedule)
}

pub(crate) fn delete(ctx: &mut WriteCtx<'_>, namespace: &str, name: &str) -> Result<()> {
    let deleted = ctx.conn.execute(
        "DELETE FROM schedules WHERE namespace = ?1 AND name = ?2",
        args![namespace, name],
    )?;
    if deleted == 0 {
        return Err(Error::NotFound(format!("schedule {name} not found")));
    }
    Ok(())
}

/// The next time a schedule needs the timer: its next fire, or now when a held fire can start.
pub(crate) fn next_due(conn: &mut dyn Conn) -> Result<Option<Timestamp>> {
    let at: Option<i64> = conn.query_value(
        "SELECT MIN(t) FROM ( \
             SELECT MIN(next_fire_at) AS t FROM schedules WHERE paused = 0 \
             UNION ALL SELECT MIN(s.pending_fire_at) FROM schedules s JOIN jobs j ON j.id = s.last_job_id \
             WHERE s.paused = 0 AND s.pending_fire_at IS NOT NULL \
             AND j.status IN ('succeeded', 'failed', 'compensation_failed', 'cancelled', 'timed_out')) AS due",
        &[],
    )?;
    Ok(at.map(Timestamp))
}

/// Fires every due schedule; returns how many fires started a job.
pub(crate) fn fire_due(ctx: &mut WriteCtx<'_>) -> Result<usize> {
    // Another node firing a schedule right now holds its row: it is skipped here.
    let due = ctx.conn.query_map(
        &format!(
            "SELECT {COLUMNS} FROM schedules WHERE paused = 0 AND \
             (next_fire_at <= ?1 OR pending_fire_at IS NOT NULL) LIMIT 500 FOR UPDATE SKIP LOCKED"
        ),
        args![ctx.now.0],
        from_row,
    )?;
    let mut started = 0;
    for mut schedule in due {
        let previous_unfinished = match &schedule.last_job_id {
            Some(job) => {
                crate::rows::load_job(ctx.conn, job)?.is_some_and(|j| !j.status.is_terminal())
            }
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
        save(ctx.conn, &schedule)?;
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
        ..Submit::default()
    };
    let wakes = ctx.wakes.len();
    match commands::submit(ctx, &schedule.namespace, request) {
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
