//! The audit log: one row per accepted change made through the API, appended, never changed.

use starbridge_core::time::Timestamp;

use crate::Result;
use crate::db::{Arg, Conn, Queries, args};

/// One accepted change made through the API.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEntry {
    pub seq: i64,
    pub at: Timestamp,
    pub namespace: String,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub status: u16,
    pub reason: Option<String>,
}

/// Appends an entry made at `now` (its `seq` and `at` are not read: the log numbers its
/// entries, and `now` is when it was made).
pub fn insert(conn: &mut dyn Conn, entry: &AuditEntry, now: Timestamp) -> Result<()> {
    conn.execute(
        "INSERT INTO audit (at, namespace, actor, action, target, status, reason) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        args![
            now.0,
            entry.namespace,
            entry.actor,
            entry.action,
            entry.target,
            entry.status,
            entry.reason,
        ],
    )?;
    Ok(())
}

/// The newest entries of a namespace (of every namespace with `None`), before `before`.
pub fn list(
    conn: &mut dyn Conn,
    namespace: Option<&str>,
    before: Option<i64>,
    limit: u32,
) -> Result<Vec<AuditEntry>> {
    let filter = if namespace.is_some() {
        "namespace = ?3 AND"
    } else {
        ""
    };
    conn.query_map(
        &format!(
            "SELECT seq, at, namespace, actor, action, target, status, reason FROM audit \
             WHERE {filter} seq < ?1 ORDER BY seq DESC LIMIT ?2"
        ),
        &[
            Arg::Int(before.unwrap_or(i64::MAX)),
            Arg::Int(i64::from(limit)),
            Arg::Text(namespace.unwrap_or_default()),
        ][..usize::from(namespace.is_some()) + 2],
        |row| {
            Ok(AuditEntry {
                seq: row.get(0)?,
                at: Timestamp(row.get(1)?),
                namespace: row.get(2)?,
                actor: row.get(3)?,
                action: row.get(4)?,
                target: row.get(5)?,
                status: row.get(6)?,
                reason: row.get(7)?,
            })
        },
    )
}
