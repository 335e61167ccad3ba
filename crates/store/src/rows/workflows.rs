//! Workflow versions: stored once each, never changed; the latest of a name, the version of a
//! definition, and a namespace's workflows. A deleted workflow is hidden: its versions stay
//! readable by number (the jobs that ran them show them) but it has no latest version, is not
//! listed, and runs no new job until it is applied again.

use serde_json::Value;
use starbridge_core::time::Timestamp;

use super::{json_text, parse_json};
use crate::db::{Conn, Queries, Row, args};
use crate::{Result, StoredWorkflow};

const WORKFLOW_COLUMNS: &str =
    "namespace, name, version, definition, description, steps, created_at";

struct RawWorkflow {
    namespace: String,
    name: String,
    version: u32,
    definition: String,
    description: Option<String>,
    steps: u32,
    created_at: i64,
}

fn workflow_from_row(row: &mut Row) -> Result<RawWorkflow> {
    Ok(RawWorkflow {
        namespace: row.get(0)?,
        name: row.get(1)?,
        version: row.get(2)?,
        definition: row.get(3)?,
        description: row.get(4)?,
        steps: row.get(5)?,
        created_at: row.get(6)?,
    })
}

fn into_stored(raw: RawWorkflow) -> Result<StoredWorkflow> {
    Ok(StoredWorkflow {
        namespace: raw.namespace,
        name: raw.name,
        version: raw.version,
        definition: parse_json(Some(raw.definition))?.unwrap_or(Value::Null),
        description: raw.description,
        steps: raw.steps,
        created_at: Timestamp(raw.created_at),
    })
}

/// The latest version of a workflow, if it has one and is not deleted.
pub fn latest_version(conn: &mut dyn Conn, namespace: &str, name: &str) -> Result<Option<u32>> {
    conn.query_value(
        "SELECT MAX(version) FROM workflows WHERE namespace = ?1 AND name = ?2 \
         AND deleted_at IS NULL",
        args![namespace, name],
    )
}

/// The highest version number a workflow ever had, deleted or not: the next apply continues
/// after it.
pub fn highest_version(conn: &mut dyn Conn, namespace: &str, name: &str) -> Result<Option<u32>> {
    conn.query_value(
        "SELECT MAX(version) FROM workflows WHERE namespace = ?1 AND name = ?2",
        args![namespace, name],
    )
}

/// Hides every version of a workflow (see the module doc); false when it has none visible.
pub fn hide_workflow(
    conn: &mut dyn Conn,
    namespace: &str,
    name: &str,
    now: Timestamp,
) -> Result<bool> {
    let hidden = conn.execute(
        "UPDATE workflows SET deleted_at = ?3 WHERE namespace = ?1 AND name = ?2 \
         AND deleted_at IS NULL",
        args![namespace, name, now.0],
    )?;
    Ok(hidden > 0)
}

/// What still uses a workflow's jobs: how many of its jobs are unfinished or could still be
/// retried (every status but `succeeded`), and the ids of the oldest `listed` of them.
pub fn unsettled_jobs(
    conn: &mut dyn Conn,
    namespace: &str,
    name: &str,
    listed: u32,
) -> Result<(u64, Vec<String>)> {
    let count: i64 = conn.query_value(
        "SELECT COUNT(*) FROM jobs WHERE namespace = ?1 AND workflow = ?2 \
         AND status <> 'succeeded'",
        args![namespace, name],
    )?;
    let ids = conn.query_map(
        "SELECT id FROM jobs WHERE namespace = ?1 AND workflow = ?2 AND status <> 'succeeded' \
         ORDER BY created_at, id LIMIT ?3",
        args![namespace, name, listed],
        |row| row.get(0),
    )?;
    Ok((u64::try_from(count).unwrap_or(0), ids))
}
/// The newest version of a workflow whose normalized definition is `definition`, if any.
pub fn workflow_version_of(
    conn: &mut dyn Conn,
    namespace: &str,
    name: &str,
    definition: &Value,
) -> Result<Option<u32>> {
    conn.query_opt(
        "SELECT version FROM workflows WHERE namespace = ?1 AND name = ?2 AND definition = ?3 \
         AND deleted_at IS NULL ORDER BY version DESC LIMIT 1",
        args![namespace, name, json_text(definition)],
        |row| row.get(0),
    )
}

/// A workflow version (deleted or not), or the latest when `version` is `None` (none when the
/// workflow is deleted).
pub fn workflow(
    conn: &mut dyn Conn,
    namespace: &str,
    name: &str,
    version: Option<u32>,
) -> Result<Option<StoredWorkflow>> {
    let raw = match version {
        Some(version) => conn.query_opt(
            &format!(
                "SELECT {WORKFLOW_COLUMNS} FROM workflows WHERE namespace = ?1 AND name = ?2 AND version = ?3"
            ),
            args![namespace, name, version],
            workflow_from_row,
        )?,
        None => conn.query_opt(
            &format!(
                "SELECT {WORKFLOW_COLUMNS} FROM workflows WHERE namespace = ?1 AND name = ?2 \
                 AND deleted_at IS NULL ORDER BY version DESC LIMIT 1"
            ),
            args![namespace, name],
            workflow_from_row,
        )?,
    };
    raw.map(into_stored).transpose()
}

/// The latest version of every workflow of a namespace that is not deleted.
pub fn list_workflows(conn: &mut dyn Conn, namespace: &str) -> Result<Vec<StoredWorkflow>> {
    conn.query_map(
        &format!(
            "SELECT {WORKFLOW_COLUMNS} FROM workflows w WHERE namespace = ?1 \
             AND deleted_at IS NULL AND version = \
             (SELECT MAX(version) FROM workflows v WHERE v.namespace = w.namespace AND v.name = w.name) \
             ORDER BY name"
        ),
        args![namespace],
        workflow_from_row,
    )?
    .into_iter()
    .map(into_stored)
    .collect()
}

pub fn insert_workflow(conn: &mut dyn Conn, stored: &StoredWorkflow) -> Result<()> {
    conn.execute(
        "INSERT INTO workflows (namespace, name, version, definition, description, steps, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        args![
            stored.namespace,
            stored.name,
            stored.version,
            json_text(&stored.definition),
            stored.description,
            stored.steps,
            stored.created_at.0,
        ],
    )?;
    Ok(())
}
