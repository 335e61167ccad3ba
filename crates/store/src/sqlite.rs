//! The embedded SQLite backend: a file in WAL mode with `synchronous=FULL`, so every commit the
//! store acknowledges is on disk. One writer thread owns the only write connection (see
//! `writer`), which is what makes SQLite's lack of row locks harmless.
//!
//! The writer's commits do not checkpoint the write-ahead log themselves (copying its pages into
//! the database file and syncing that file), as SQLite's commits do by default: a checkpointer
//! thread with a connection of its own does it while the writer goes on. Only when the log has
//! grown far past the usual size (the checkpointer cannot catch up with a writer that never
//! pauses) does a commit finish the checkpoint itself, which lets the next transaction start the
//! log from its beginning again.

use std::os::raw::c_int;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};

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

/// Pages in the write-ahead log from which the checkpointer thread is asked to run (SQLite's
/// own auto-checkpoint threshold).
const CHECKPOINT_PAGES: c_int = 1000;

/// Pages in the write-ahead log from which a commit completes the checkpoint itself.
const CHECKPOINT_INLINE_PAGES: c_int = 16 * CHECKPOINT_PAGES;

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
        // `temp_store = MEMORY` keeps statement and savepoint journals in memory instead of a
        // temporary file: every page a statement or savepoint changes first is copied there,
        // which as file writes cost a system call each. They hold only what a rollback to the
        // savepoint needs; the write-ahead log stays the durable record.
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; \
             PRAGMA temp_store = MEMORY;",
        )?;
        Ok(SqliteConn { conn })
    }

    /// The writer's connection: its write-ahead log is checkpointed by a thread of its own (see
    /// the module's documentation), which ends when the connection is dropped.
    pub(crate) fn open_writer(path: &Path) -> Result<SqliteConn> {
        let mut writer = SqliteConn::open(path)?;
        let checkpointer = Checkpointer::start(SqliteConn::open(path)?)?;
        // Replacing the write-ahead log hook also turns SQLite's own auto-checkpoint off.
        writer
            .conn
            .wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages: c_int| {
                if pages >= CHECKPOINT_INLINE_PAGES {
                    wal.checkpoint_v2(rusqlite::wal::CheckpointMode::PASSIVE)?;
                } else if pages >= CHECKPOINT_PAGES {
                    checkpointer.request();
                }
                Ok(())
            }))?;
        Ok(writer)
    }

    /// Brings the schema up to date inside one immediate transaction (two processes opening the
    /// same file at once cannot both apply a migration); returns how many were applied.
    pub(crate) fn migrate(&mut self, now_millis: i64) -> Result<usize> {
        crate::db::migrate(self, "BEGIN IMMEDIATE", MIGRATIONS, now_millis)
    }
}

/// Runs passive checkpoints on a connection of its own when asked.
struct Checkpointer {
    due: SyncSender<()>,
}

impl Checkpointer {
    fn start(conn: SqliteConn) -> Result<Checkpointer> {
        // One request waits at most: asking while one waits adds nothing.
        let (due, requests) = sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("starbridge-checkpoint".to_owned())
            .spawn(move || {
                while requests.recv().is_ok() {
                    let checkpoint = conn
                        .conn
                        .wal_checkpoint_v2(None::<&str>, rusqlite::wal::CheckpointMode::PASSIVE);
                    if let Err(error) = checkpoint {
                        tracing::warn!(%error, "checkpoint of the write-ahead log failed");
                    }
                }
            })
            .map_err(|error| Error::Open(format!("cannot start the checkpointer: {error}")))?;
        Ok(Checkpointer { due })
    }

    fn request(&self) {
        match self.due.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) => {}
            Err(TrySendError::Disconnected(())) => {
                tracing::warn!("the checkpointer has stopped");
            }
        }
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::db::{Queries, args};

    /// Commits `rows` rows of about a page each, in transactions of 100.
    fn fill(writer: &mut SqliteConn, rows: usize) {
        let filler = "x".repeat(4000);
        for chunk in 0..rows / 100 {
            writer.batch("BEGIN IMMEDIATE").unwrap();
            for row in 0..100 {
                let id = i64::try_from(chunk * 100 + row).unwrap();
                writer
                    .execute(
                        "INSERT INTO filler (id, body) VALUES (?1, ?2)",
                        args![id, filler.as_str()],
                    )
                    .unwrap();
            }
            writer.batch("COMMIT").unwrap();
        }
    }

    #[test]
    fn the_writers_log_is_checkpointed_into_the_database_file_by_the_checkpointer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.db");
        let mut writer = SqliteConn::open_writer(&path).unwrap();
        writer
            .batch("CREATE TABLE filler (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
            .unwrap();
        let file_pages = || std::fs::metadata(&path).unwrap().len() / 4096;
        let before = file_pages();
        // Past the checkpoint threshold, short of the size at which a commit checkpoints itself.
        let rows = usize::try_from(2 * CHECKPOINT_PAGES).unwrap();
        fill(&mut writer, rows);
        // A liveness bound, not a measurement: the checkpointer runs on its own thread.
        let deadline = Instant::now() + Duration::from_secs(30);
        while file_pages() < before + u64::try_from(CHECKPOINT_PAGES).unwrap() {
            assert!(
                Instant::now() < deadline,
                "the log was not checkpointed: {} pages in the database file",
                file_pages()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let count: i64 = (&mut writer as &mut dyn Conn)
            .query_value("SELECT COUNT(*) FROM filler", args![])
            .unwrap();
        assert_eq!(count, i64::try_from(rows).unwrap());
    }
}
