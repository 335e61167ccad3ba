//! Namespaces: a row for each namespace something was made in.

use starbridge_core::time::Timestamp;

use crate::Result;
use crate::db::{Conn, args};

pub fn ensure_namespace(conn: &mut dyn Conn, namespace: &str, now: Timestamp) -> Result<()> {
    conn.execute(
        "INSERT INTO namespaces (name, created_at) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        args![namespace, now.0],
    )?;
    Ok(())
}
