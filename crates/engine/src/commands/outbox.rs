//! Webhook subscriptions and their outbox: the rules (what a subscription may be, its id and
//! secret, which status changes it wants, when a message is sent again or given up, the lease
//! of a claimed message); the rows are the store's (`rows::webhooks`, `rows::deliveries`).
//! When a job's status changes, or a task starts, succeeds, fails or is to be retried (which
//! history entries those are is core's `webhook::task_event`), a delivery row is written for
//! every matching subscription in the same transaction as the change, so a committed change is
//! always reported (at least once) and a rolled-back one never is. The deliverer (`loops::deliveries`) sends the rows and records each
//! attempt here.

use serde_json::{Value, json};
use starbridge_core::model::{Event, Job, JobState, JobStatus};
use starbridge_core::time::Duration;
use starbridge_core::webhook::{self, WebhookEvent};
use starbridge_store::db::Conn;
use starbridge_store::rows;

use crate::commands::invalid;
use crate::ctx::WriteCtx;
use crate::{Delivery, DueDelivery, Error, Result, Webhook};

/// Attempts before a delivery is given up.
pub const MAX_DELIVERY_ATTEMPTS: u32 = 20;
/// Longest pause between two attempts of a delivery.
pub const MAX_DELIVERY_BACKOFF: Duration = Duration::from_secs(3600);

/// Whether a subscription wants to hear of this job's (new) status.
fn matches(webhook: &Webhook, job: &Job) -> bool {
    webhook.events.contains(&WebhookEvent::JobStatusChanged)
        && webhook.workflow.as_ref().is_none_or(|w| *w == job.workflow)
        && (webhook.states.is_empty() || webhook.states.contains(&job.status))
}

/// Whether a subscription wants to hear of this event of a task of `step` in `job`.
fn wants_task_event(webhook: &Webhook, job: &Job, step: &str, event: WebhookEvent) -> bool {
    webhook.events.contains(&event)
        && webhook.workflow.as_ref().is_none_or(|w| *w == job.workflow)
        && (webhook.steps.is_empty() || webhook.steps.iter().any(|s| s == step))
}

/// The job as a message shows it.
fn job_fields(job: &Job) -> Value {
    json!({
        "id": job.id,
        "workflow": job.workflow,
        "version": job.version,
        "key": job.key,
        "status": job.status,
        "created_at": job.created_at.0,
        "ended_at": job.ended_at.map(|t| t.0),
        "output": job.output,
        "failed_steps": job.failed_steps,
    })
}

/// What a new subscription asks for, as checked here.
#[derive(Debug, Clone)]
pub struct NewWebhook {
    pub url: String,
    pub workflow: Option<String>,
    pub states: Vec<JobStatus>,
    /// `None`: `webhook::DEFAULT_EVENTS`.
    pub events: Option<Vec<WebhookEvent>>,
    pub steps: Vec<String>,
    pub secret: Option<String>,
}

pub(crate) fn create(ctx: &mut WriteCtx<'_>, namespace: &str, new: NewWebhook) -> Result<Webhook> {
    let lower = new.url.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) || new.url.len() > 2048 {
        return Err(invalid(
            "url",
            "must be an http:// or https:// URL of at most 2048 bytes",
        ));
    }
    if let Some(secret) = &new.secret
        && (secret.len() < 16 || secret.len() > 256)
    {
        return Err(invalid(
            "secret",
            "must be 16 to 256 bytes (or leave it out to get one)",
        ));
    }
    let events = new
        .events
        .unwrap_or_else(|| webhook::DEFAULT_EVENTS.to_vec());
    let mut problems = webhook::check_events(&events);
    problems.extend(webhook::check_steps(&new.steps, &events));
    if !problems.is_empty() {
        return Err(Error::Invalid(problems));
    }
    let webhook = Webhook {
        id: format!("whk_{}", super::fresh_unique()),
        namespace: namespace.to_owned(),
        url: new.url,
        secret: new.secret.unwrap_or_else(crate::secrets::random_hex),
        workflow: new.workflow,
        states: new.states,
        events,
        steps: new.steps,
        created_at: ctx.now,
    };
    rows::ensure_namespace(ctx.conn, namespace, ctx.now)?;
    ctx.reads.forget_webhooks(namespace);
    rows::webhooks::insert(ctx.conn, &webhook)?;
    Ok(webhook)
}

pub(crate) fn delete(ctx: &mut WriteCtx<'_>, namespace: &str, id: &str) -> Result<()> {
    if rows::webhooks::get(ctx.conn, namespace, id)?.is_none() {
        return Err(Error::NotFound(format!("webhook {id} not found")));
    }
    rows::deliveries::delete_pending(ctx.conn, id)?;
    rows::webhooks::delete(ctx.conn, id)?;
    ctx.reads.forget_webhooks(namespace);
    Ok(())
}

/// Writes a delivery for every subscription that wants this status change.
pub(crate) fn enqueue(
    ctx: &mut WriteCtx<'_>,
    job: &Job,
    previous: Option<JobStatus>,
) -> Result<()> {
    let subscriptions = ctx.webhooks(&job.namespace)?;
    for webhook in subscriptions.iter().filter(|w| matches(w, job)) {
        let mut fields = job_fields(job);
        fields["previous_status"] = json!(previous);
        let payload = json!({
            "type": WebhookEvent::JobStatusChanged,
            "namespace": job.namespace,
            "job": fields,
            "at": ctx.now.0,
        });
        rows::deliveries::insert(ctx.conn, &webhook.id, job, &payload, ctx.now)?;
        ctx.deliveries = true;
    }
    Ok(())
}

/// Writes a delivery for every subscription that wants the task event `entry` is, if it is one
/// (an entry of the job's history, or a claim the history does not keep; see
/// `webhook::task_event`), the task as `state` leaves it. The payload is made only for a
/// subscription that wants it.
pub(crate) fn enqueue_task_event(
    ctx: &mut WriteCtx<'_>,
    state: &JobState,
    entry: &Event,
) -> Result<()> {
    let Some(kind) = webhook::task_event(entry) else {
        return Ok(());
    };
    let job = &state.job;
    let subscriptions = ctx.webhooks(&job.namespace)?;
    if !subscriptions.iter().any(|w| w.events.contains(&kind)) {
        return Ok(());
    }
    let Some(task) = entry.task.as_ref().and_then(|id| state.task(id)) else {
        return Ok(());
    };
    let failed = matches!(kind, WebhookEvent::TaskFailed | WebhookEvent::TaskRetrying);
    let mut payload = None;
    for webhook in subscriptions
        .iter()
        .filter(|w| wants_task_event(w, job, &task.step, kind))
    {
        let payload = payload.get_or_insert_with(|| {
            json!({
                "type": kind,
                "namespace": job.namespace,
                "job": job_fields(job),
                "task": {
                    "id": task.id,
                    "step": task.step,
                    "kind": task.kind,
                    "item": task.item,
                    "attempt": entry.attempt,
                    "error": if failed { json!(task.error) } else { Value::Null },
                    "retry_at": entry.detail.get("retry_at"),
                },
                "at": entry.at.0,
            })
        });
        rows::deliveries::insert(ctx.conn, &webhook.id, job, payload, ctx.now)?;
        ctx.deliveries = true;
    }
    Ok(())
}

/// A subscription's deliveries, newest first; `None` when it is not in this namespace.
pub(crate) fn deliveries(
    conn: &mut dyn Conn,
    namespace: &str,
    webhook: &str,
    limit: u32,
) -> Result<Option<Vec<Delivery>>> {
    if rows::webhooks::get(conn, namespace, webhook)?.is_none() {
        return Ok(None);
    }
    rows::deliveries::of_webhook(conn, webhook, limit).map(Some)
}

/// How long a claimed delivery belongs to the node that claimed it: if that node dies before
/// recording the attempt, another node sends it once this has passed.
pub const DELIVERY_LEASE: Duration = Duration::from_secs(60);

/// Claims the deliveries whose next attempt is due, oldest first: each is pushed
/// `DELIVERY_LEASE` into the future, so no other server node sends it meanwhile.
pub(crate) fn claim_due(ctx: &mut WriteCtx<'_>, limit: u32) -> Result<Vec<DueDelivery>> {
    let due = rows::deliveries::due(ctx.conn, ctx.now, limit)?;
    let lease_end = ctx.now.saturating_add(DELIVERY_LEASE);
    let mut out = Vec::with_capacity(due.len());
    for delivery in due {
        rows::deliveries::postpone(ctx.conn, delivery.id, lease_end)?;
        out.extend(rows::deliveries::addressed(ctx.conn, delivery)?);
    }
    Ok(out)
}

/// The outcome of one attempt to send a delivery.
#[derive(Debug, Clone)]
pub enum Attempt {
    /// The receiver answered 2xx.
    Delivered { status: u16 },
    /// Any other answer, or none.
    Failed { status: Option<u16>, error: String },
    /// Not sent: the destination policy forbids it. Given up at once, since retrying cannot
    /// change that (only the server's settings can).
    Refused { error: String },
}

/// Records an attempt: delivered, retried after `min(2^attempts s, 1 h)`, or given up (after
/// the last attempt, or at once when refused).
pub(crate) fn record(ctx: &mut WriteCtx<'_>, id: i64, attempt: Attempt) -> Result<()> {
    let Some(attempts) = rows::deliveries::attempts(ctx.conn, id)? else {
        return Ok(()); // its subscription was deleted meanwhile
    };
    let attempts = attempts + 1;
    match attempt {
        Attempt::Delivered { status } => {
            rows::deliveries::record_delivered(ctx.conn, id, attempts, ctx.now, status)?;
        }
        Attempt::Refused { error } => {
            rows::deliveries::record_refused(ctx.conn, id, attempts, &error)?;
        }
        Attempt::Failed { status, error } => {
            let next = (attempts < MAX_DELIVERY_ATTEMPTS).then(|| {
                let backoff =
                    Duration::from_secs(1u64 << attempts.min(12)).min(MAX_DELIVERY_BACKOFF);
                ctx.now.saturating_add(backoff)
            });
            rows::deliveries::record_failed(ctx.conn, id, attempts, next, status, &error)?;
        }
    }
    Ok(())
}
