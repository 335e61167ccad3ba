//! Webhook subscriptions: their rows. Which job changes a subscription wants, its id and its
//! secret are the engine's (`webhooks`); its messages are in `deliveries`.

use starbridge_core::model::JobStatus;
use starbridge_core::time::Timestamp;
use starbridge_core::webhook::WebhookEvent;

use crate::Result;
use crate::db::{Conn, Queries, Row, args};

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
    /// What it hears of (never empty).
    pub events: Vec<WebhookEvent>,
    /// The steps its task events are limited to; empty means every step.
    pub steps: Vec<String>,
    pub created_at: Timestamp,
}

const COLUMNS: &str = "id, namespace, url, secret, workflow, states, created_at, events, steps";

/// A JSON list of texts, as the `states`, `events` and `steps` columns hold them.
fn texts(column: String) -> Vec<String> {
    serde_json::from_str(&column).unwrap_or_default()
}

fn from_row(row: &mut Row) -> Result<Webhook> {
    let states = texts(row.get(5)?);
    let events = texts(row.get(7)?);
    Ok(Webhook {
        id: row.get(0)?,
        namespace: row.get(1)?,
        url: row.get(2)?,
        secret: row.get(3)?,
        workflow: row.get(4)?,
        states: states.iter().filter_map(|s| JobStatus::parse(s)).collect(),
        created_at: Timestamp(row.get(6)?),
        events: events
            .iter()
            .filter_map(|e| WebhookEvent::parse(e))
            .collect(),
        steps: texts(row.get(8)?),
    })
}

/// The subscriptions of a namespace, oldest first.
pub fn list(conn: &mut dyn Conn, namespace: &str) -> Result<Vec<Webhook>> {
    conn.query_map(
        &format!("SELECT {COLUMNS} FROM webhooks WHERE namespace = ?1 ORDER BY created_at, id"),
        args![namespace],
        from_row,
    )
}

/// A subscription, if it exists in this namespace.
pub fn get(conn: &mut dyn Conn, namespace: &str, id: &str) -> Result<Option<Webhook>> {
    conn.query_opt(
        &format!("SELECT {COLUMNS} FROM webhooks WHERE namespace = ?1 AND id = ?2"),
        args![namespace, id],
        from_row,
    )
}

/// Stores a new subscription.
pub fn insert(conn: &mut dyn Conn, webhook: &Webhook) -> Result<()> {
    let states: Vec<&str> = webhook.states.iter().map(|s| s.as_str()).collect();
    let events: Vec<&str> = webhook.events.iter().map(|e| e.as_str()).collect();
    conn.execute(
        "INSERT INTO webhooks (id, namespace, url, secret, workflow, states, created_at, \
         events, steps) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        args![
            webhook.id,
            webhook.namespace,
            webhook.url,
            webhook.secret,
            webhook.workflow,
            serde_json::to_string(&states).unwrap_or_default(),
            webhook.created_at.0,
            serde_json::to_string(&events).unwrap_or_default(),
            serde_json::to_string(&webhook.steps).unwrap_or_default(),
        ],
    )?;
    Ok(())
}

/// Deletes a subscription's row (its deliveries are `deliveries`').
pub fn delete(conn: &mut dyn Conn, id: &str) -> Result<()> {
    conn.execute("DELETE FROM webhooks WHERE id = ?1", args![id])?;
    Ok(())
}
