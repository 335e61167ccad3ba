//! Embedded schema migrations, applied in order at start-up inside one immediate transaction (two
//! processes opening the same file at once cannot both apply a migration).

use rusqlite::{Connection, params};

use crate::Result;

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../migrations/sqlite/0001_init.sql")),
    (2, include_str!("../migrations/sqlite/0002_browse.sql")),
];

/// Brings the schema up to date; returns how many migrations were applied.
pub(crate) fn migrate(conn: &mut Connection, now_millis: i64) -> Result<usize> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
    )?;
    let current: i64 = tx.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |row| row.get(0),
    )?;
    let mut applied = 0;
    for (version, sql) in MIGRATIONS {
        if *version <= current {
            continue;
        }
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
            params![version, now_millis],
        )?;
        applied += 1;
    }
    tx.commit()?;
    Ok(applied)
}
