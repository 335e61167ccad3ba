//! Webhook subscriptions and their outbox. When a job's status changes, a delivery row is written
//! for every matching subscription in the same transaction as the change, so a committed change
//! is always reported (at least once) and a rolled-back one never is. The server's deliverer sends
//! the rows and records each attempt here.

use serde_json::{Value, json};
use starbridge_core::model::{Job, JobStatus};
use starbridge_core::time::{Duration, Timestamp};

use crate::commands::invalid;
use crate::db::{Conn, Queries, Row, args};
use crate::writer::WriteCtx;
use crate::{Error, Result};

/// Attempts before a delivery is given up.
pub const MAX_DELIVERY_ATTEMPTS: u32 = 20;
/// Longest pause between two attempts of a delivery.
pub const MAX_DELIVERY_BACKOFF: Duration = Duration::from_secs(3600);

/// A subscription.
#[derive(Debug, Clone, PartialEq)]
pub struct Webhook {
    pub id: String,
    pub namespace: String,
    pub url: String,
    pub secret: String,
    pub workflow: Option<String>,
    /// Job statuses reported; empty means every status.
    pub states: Vec<JobStatus>,
    pub created_at: Timestamp,
}

impl Webhook {
    fn matches(&self, job: &Job) -> bool {
        self.workflow.as_ref().is_none_or(|w| *w == job.workflow)
            && (self.states.is_empty() || self.states.contains(&job.status))
    }
}

/// One message of the outbox, with its delivery history so far.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub id: i64,
    pub webhook_id: String,
    pub job_id: String,
    pub status: String,
    pub payload: Value,
    pub created_at: Timestamp,
    pub attempts: u32,
    pub next_attempt_at: Option<Timestamp>,
    pub delivered_at: Option<Timestamp>,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
}

/// A delivery due now, with where and how to send it.
#[derive(Debug, Clone)]
pub struct DueDelivery {
    pub delivery: Delivery,
    pub url: String,
    pub secret: String,
}

fn webhook_from_row(row: &mut Row) -> Result<Webhook> {
    let states: String = row.get(5)?;
    let states: Vec<String> = serde_json::from_str(&states).unwrap_or_default();
    Ok(Webhook {
        id: row.get(0)?,
        namespace: row.get(1)?,
        url: row.get(2)?,
        secret: row.get(3)?,
        workflow: row.get(4)?,
        states: states.iter().filter_map(|s| JobStatus::parse(s)).collect(),
        created_at: Timestamp(row.get(6)?),
    })
}

const WEBHOOK_COLUMNS: &str = "id, namespace, url, secret, workflow, states, created_at";

pub(crate) fn list(conn: &mut dyn Conn, namespace: &str) -> Result<Vec<Webhook>> {
    conn.query_map(
        &format!(
            "SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE namespace = ?1 ORDER BY created_at, id"
        ),
        args![namespace],
        webhook_from_row,
    )
}

fn get(conn: &mut dyn Conn, namespace: &str, id: &str) -> Result<Option<Webhook>> {
    conn.query_opt(
        &format!("SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE namespace = ?1 AND id = ?2"),
        args![namespace, id],
        webhook_from_row,
    )
}

pub(crate) fn create(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    url: &str,
    workflow: Option<String>,
    states: Vec<JobStatus>,
    secret: Option<String>,
) -> Result<Webhook> {
    let lower = url.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) || url.len() > 2048 {
        return Err(invalid(
            "url",
            "must be an http:// or https:// URL of at most 2048 bytes",
        ));
    }
    if let Some(secret) = &secret
        && (secret.len() < 16 || secret.len() > 256)
    {
        return Err(invalid(
            "secret",
            "must be 16 to 256 bytes (or leave it out to get one)",
        ));
    }
    let webhook = Webhook {
        id: format!("whk_{}", uuid::Uuid::now_v7().simple()),
        namespace: namespace.to_owned(),
        url: url.to_owned(),
        secret: secret.unwrap_or_else(|| {
            format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            )
        }),
        workflow,
        states,
        created_at: ctx.now,
    };
    let states: Vec<&str> = webhook.states.iter().map(|s| s.as_str()).collect();
    crate::rows::ensure_namespace(ctx.conn, namespace, ctx.now)?;
    ctx.reads.forget_webhooks(namespace);
    ctx.conn.execute(
        "INSERT INTO webhooks (id, namespace, url, secret, workflow, states, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        args![
            webhook.id,
            webhook.namespace,
            webhook.url,
            webhook.secret,
            webhook.workflow,
            serde_json::to_string(&states).unwrap_or_default(),
            webhook.created_at.0,
        ],
    )?;
    Ok(webhook)
}

pub(crate) fn delete(ctx: &mut WriteCtx<'_>, namespace: &str, id: &str) -> Result<()> {
    if get(ctx.conn, namespace, id)?.is_none() {
        return Err(Error::NotFound(format!("webhook {id} not found")));
    }
    ctx.conn.execute(
        "DELETE FROM webhook_deliveries WHERE webhook_id = ?1 AND next_attempt_at IS NOT NULL",
        args![id],
    )?;
    ctx.conn
        .execute("DELETE FROM webhooks WHERE id = ?1", args![id])?;
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
    for webhook in subscriptions.iter().filter(|w| w.matches(job)) {
        let payload = json!({
            "type": "job.status_changed",
            "namespace": job.namespace,
            "job": {
                "id": job.id,
                "workflow": job.workflow,
                "version": job.version,
                "key": job.key,
                "status": job.status,
                "previous_status": previous,
                "created_at": job.created_at.0,
                "ended_at": job.ended_at.map(|t| t.0),
            },
            "at": ctx.now.0,
        });
        ctx.conn.execute(
            "INSERT INTO webhook_deliveries (webhook_id, namespace, job_id, status, payload, \
             created_at, attempts, next_attempt_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?6)",
            args![
                webhook.id,
                job.namespace,
                job.id.as_str(),
                job.status.as_str(),
                payload.to_string(),
                ctx.now.0,
            ],
        )?;
        ctx.deliveries = true;
    }
    Ok(())
}

fn delivery_from_row(row: &mut Row) -> Result<Delivery> {
    let payload: String = row.get(4)?;
    Ok(Delivery {
        id: row.get(0)?,
        webhook_id: row.get(1)?,
        job_id: row.get(2)?,
        status: row.get(3)?,
        payload: serde_json::from_str(&payload).unwrap_or(Value::Null),
        created_at: Timestamp(row.get(5)?),
        attempts: row.get(6)?,
        next_attempt_at: row.get::<Option<i64>>(7)?.map(Timestamp),
        delivered_at: row.get::<Option<i64>>(8)?.map(Timestamp),
        last_status: row.get(9)?,
        last_error: row.get(10)?,
    })
}

const DELIVERY_COLUMNS: &str = "d.id, d.webhook_id, d.job_id, d.status, d.payload, d.created_at, \
     d.attempts, d.next_attempt_at, d.delivered_at, d.last_status, d.last_error";

/// A subscription's deliveries, newest first.
pub(crate) fn deliveries(
    conn: &mut dyn Conn,
    namespace: &str,
    webhook: &str,
    limit: u32,
) -> Result<Option<Vec<Delivery>>> {
    if get(conn, namespace, webhook)?.is_none() {
        return Ok(None);
    }
    conn.query_map(
        &format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries d WHERE d.webhook_id = ?1 \
             ORDER BY d.id DESC LIMIT ?2"
        ),
        args![webhook, limit],
        delivery_from_row,
    )
    .map(Some)
}

/// How long a claimed delivery belongs to the node that claimed it: if that node dies before
/// recording the attempt, another node sends it once this has passed.
pub const DELIVERY_LEASE: Duration = Duration::from_secs(60);

/// Claims the deliveries whose next attempt is due, oldest first: each is pushed
/// `DELIVERY_LEASE` into the future, so no other server node sends it meanwhile.
pub(crate) fn claim_due(ctx: &mut WriteCtx<'_>, limit: u32) -> Result<Vec<DueDelivery>> {
    let due = ctx.conn.query_map(
        &format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries d \
             WHERE d.next_attempt_at IS NOT NULL AND d.next_attempt_at <= ?1 \
             ORDER BY d.next_attempt_at, d.id LIMIT ?2 FOR UPDATE SKIP LOCKED"
        ),
        args![ctx.now.0, limit],
        delivery_from_row,
    )?;
    let lease_end = ctx.now.saturating_add(DELIVERY_LEASE).0;
    let mut out = Vec::with_capacity(due.len());
    for delivery in due {
        ctx.conn.execute(
            "UPDATE webhook_deliveries SET next_attempt_at = ?2 WHERE id = ?1",
            args![delivery.id, lease_end],
        )?;
        let target = ctx.conn.query_opt(
            "SELECT url, secret FROM webhooks WHERE id = ?1",
            args![delivery.webhook_id],
            |row| Ok((row.get::<String>(0)?, row.get::<String>(1)?)),
        )?;
        if let Some((url, secret)) = target {
            out.push(DueDelivery {
                delivery,
                url,
                secret,
            });
        }
    }
    Ok(out)
}

/// When the next attempt of any delivery is due.
pub(crate) fn next_due(conn: &mut dyn Conn) -> Result<Option<Timestamp>> {
    let at: Option<i64> = conn.query_value(
        "SELECT MIN(next_attempt_at) FROM webhook_deliveries WHERE next_attempt_at IS NOT NULL",
        &[],
    )?;
    Ok(at.map(Timestamp))
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
    let attempts: Option<u32> = ctx.conn.query_opt(
        "SELECT attempts FROM webhook_deliveries WHERE id = ?1",
        args![id],
        |row| row.get(0),
    )?;
    let Some(attempts) = attempts else {
        return Ok(()); // its subscription was deleted meanwhile
    };
    let attempts = attempts + 1;
    match attempt {
        Attempt::Delivered { status } => {
            ctx.conn.execute(
                "UPDATE webhook_deliveries SET attempts = ?2, next_attempt_at = NULL, \
                 delivered_at = ?3, last_status = ?4, last_error = NULL WHERE id = ?1",
                args![id, attempts, ctx.now.0, status],
            )?;
        }
        Attempt::Refused { error } => {
            ctx.conn.execute(
                "UPDATE webhook_deliveries SET attempts = ?2, next_attempt_at = NULL, \
                 last_status = NULL, last_error = ?3 WHERE id = ?1",
                args![id, attempts, error],
            )?;
        }
        Attempt::Failed { status, error } => {
            let next = (attempts < MAX_DELIVERY_ATTEMPTS).then(|| {
                let backoff =
                    Duration::from_secs(1u64 << attempts.min(12)).min(MAX_DELIVERY_BACKOFF);
                ctx.now.saturating_add(backoff).0
            });
            ctx.conn.execute(
                "UPDATE webhook_deliveries SET attempts = ?2, next_attempt_at = ?3, \
                 last_status = ?4, last_error = ?5 WHERE id = ?1",
                args![id, attempts, next, status, error],
            )?;
        }
    }
    Ok(())
}
