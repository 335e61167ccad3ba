//! What the health check asks of the database: the probe write, and a query that only says
//! the database answers.

use starbridge_core::time::Timestamp;

use crate::Result;
use crate::db::{Conn, Queries, args};

/// The health check's probe write (see `health`): its one row, changed in place.
pub fn write_health_probe(conn: &mut dyn Conn, now: Timestamp) -> Result<()> {
    conn.execute(
        "INSERT INTO health_probe (id, probed_at) VALUES (1, ?1) \
         ON CONFLICT (id) DO UPDATE SET probed_at = excluded.probed_at",
        args![now.0],
    )?;
    Ok(())
}

/// Checks that the database answers.
pub fn ping(conn: &mut dyn Conn) -> Result<()> {
    conn.query_value::<i64>("SELECT 1", &[])?;
    Ok(())
}
