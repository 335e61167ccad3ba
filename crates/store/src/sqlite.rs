//! The embedded SQLite backend: a file in WAL mode with `synchronous=FULL`, so every commit the
//! store acknowledges is on disk. One writer thread owns the only write connection (see
//! `writer`), which is what makes SQLite's lack of row locks harmless.

use std::path::{Path, PathBuf};

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, params_from_iter};

use crate::db::{Arg, Backend, Cell, Conn, DatabaseError, Row, sqlite_sql};
use crate::{Error, Result};

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../migrations/sqlite/0001_init.sql")),
    (2, include_str!("../migrations/sqlite/0002_jobs_ended.sql")),
    (3, include_str!("../migrations/sqlite/0003_tokens.sql")),
    (4, include_str!("../migrations/sqlite/0004_browse.sql")),
];

impl From<rusqlite::Error> for Error {
    fn from(error: rusqlite::Error) -> Error {
        Error::Database(DatabaseError {
            message: error.to_string(),
            code: None,
        })
    }
}

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match *self {
            Arg::Null => ToSqlOutput::Borrowed(ValueRef::Null),
            Arg::Int(value) => ToSqlOutput::Borrowed(ValueRef::Integer(value)),
            Arg::Real(value) => ToSqlOutput::Borrowed(ValueRef::Real(value)),
            Arg::Text(value) => ToSqlOutput::Borrowed(ValueRef::Text(value.as_bytes())),
        })
    }
}

/// Where the database lives: `sqlite://path`, `sqlite:path` or a plain path.
pub fn sqlite_path(url: &str) -> Result<PathBuf> {
    let path = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    if path.is_empty() || path == ":memory:" {
        return Err(Error::Open(format!(
            "'{url}' names no file: use sqlite://FILE (the store must be durable)"
        )));
    }
    Ok(PathBuf::from(path))
}

/// Prepared statements kept per connection.
const STATEMENT_CACHE: usize = 128;

/// A connection to the store's SQLite file.
pub(crate) struct SqliteConn {
    conn: Connection,
}

impl SqliteConn {
    pub(crate) fn open(path: &Path) -> Result<SqliteConn> {
        let conn = Connection::open(path)
            .map_err(|error| Error::Open(format!("{}: {error}", path.display())))?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        // With the query planner stability guarantee a cached statement keeps its plan when its
        // parameters are rebound, instead of being re-prepared on every use.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        )?;
        // Every statement the store runs stays prepared (the writer alone uses a few dozen).
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // `temp_store = MEMORY` keeps the savepoint journal (the writer opens one savepoint per
        // request) in memory instead of a temporary file: every page a request changes first is
        // copied there, which as file writes cost a system call each. It holds only what a
        // rollback to the savepoint needs; the write-ahead log stays the durable record.
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; \
             PRAGMA temp_store = MEMORY;",
        )?;
        Ok(SqliteConn { conn })
    }

    /// Brings the schema up to date inside one immediate transaction (two processes opening the
    /// same file at once cannot both apply a migration); returns how many were applied.
    pub(crate) fn migrate(&mut self, now_millis: i64) -> Result<usize> {
        crate::db::migrate(self, "BEGIN IMMEDIATE", MIGRATIONS, now_millis)
    }
}

fn cell(value: ValueRef<'_>) -> Cell {
    match value {
        ValueRef::Null => Cell::Null,
        ValueRef::Integer(value) => Cell::Int(value),
        ValueRef::Real(value) => Cell::Real(value),
        ValueRef::Text(text) | ValueRef::Blob(text) => {
            Cell::Text(String::from_utf8_lossy(text).into_owned())
        }
    }
}

impl Conn for SqliteConn {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        let sql = sqlite_sql(sql);
        let changed = self
            .conn
            .prepare_cached(sql)?
            .execute(params_from_iter(args))?;
        Ok(u64::try_from(changed).unwrap_or(u64::MAX))
    }

    fn query(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        let sql = sqlite_sql(sql);
        let mut statement = self.conn.prepare_cached(sql)?;
        let columns = statement.column_count();
        let mut rows = statement.query(params_from_iter(args))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let mut cells = Vec::with_capacity(columns);
            for index in 0..columns {
                cells.push(cell(row.get_ref(index)?));
            }
            out.push(Row::new(cells));
        }
        Ok(out)
    }

    fn batch(&mut self, sql: &str) -> Result<()> {
        Ok(self.conn.execute_batch(sql)?)
    }

    fn changes(&self) -> u64 {
        self.conn.total_changes()
    }

    fn lock_key(&mut self, _key: &str) -> Result<()> {
        Ok(())
    }

    fn announce(&mut self, _payload: &str) -> Result<()> {
        Ok(())
    }

    fn is_usable(&self) -> bool {
        true
    }
}
