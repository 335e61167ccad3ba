//! The embedded SQLite backend: a file in WAL mode. One writer thread owns the only write
//! connection (see `writer`), which is what makes SQLite's lack of row locks harmless.
//!
//! The writer's commits write the log without syncing it (`synchronous=NORMAL`), and return;
//! the log is synced afterwards (`Conn::log_sync`: an `fdatasync` of the `-wal` file), and a
//! commit is acknowledged only once a sync that began after it ended. The engine runs the sync
//! on a thread of its own while the writer goes on with the next group, so a group's
//! statements no longer wait for the previous group's sync. A sync covers every frame written
//! before it, and the log's frames are checksummed in a chain, so what a power loss undoes is
//! always a tail of unacknowledged commits. (`Durability::Relaxed` acknowledges commits before
//! the log is synced, which a power loss may undo.) Other connections are `synchronous=FULL`.
//!
//! The writer's commits do not checkpoint the write-ahead log themselves (copying its pages into
//! the database file and syncing that file), as SQLite's commits do by default: a checkpointer
//! thread with a connection of its own does it while the writer goes on. A checkpoint that runs
//! while the writer appends cannot reach the log's end, and only a checkpoint that reached it
//! (with no reader left in the log) lets the next transaction start the log from its beginning
//! again; so once the log has grown to a few times the usual size, the writer waits after its
//! commit for a restarting checkpoint, which also waits a moment for readers to leave the log.
//! A reader that stays longer (a long export) makes it give up, and the writer then lets the log
//! grow by as much again before it waits next. The wait comes after the commit and
//! never fails it: the write-ahead log hook only ever reports success.

use std::os::raw::c_int;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, params_from_iter};

use crate::db::{Arg, Backend, Cell, Conn, DatabaseError, Row, sqlite_sql};
use crate::fault::{self, WriteFault};
use crate::{Durability, Error, Result};
use sets::SetStatements;

mod sets;

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../migrations/sqlite/0001_init.sql")),
    (2, include_str!("../migrations/sqlite/0002_jobs_ended.sql")),
    (3, include_str!("../migrations/sqlite/0003_tokens.sql")),
    (4, include_str!("../migrations/sqlite/0004_browse.sql")),
    (5, include_str!("../migrations/sqlite/0005_health.sql")),
    (6, include_str!("../migrations/sqlite/0006_waits.sql")),
    (7, include_str!("../migrations/sqlite/0007_labels.sql")),
    (8, include_str!("../migrations/sqlite/0008_composition.sql")),
    (
        9,
        include_str!("../migrations/sqlite/0009_queue_prefixes.sql"),
    ),
    (10, include_str!("../migrations/sqlite/0010_operators.sql")),
    (
        11,
        include_str!("../migrations/sqlite/0011_step_limits.sql"),
    ),
    (
        12,
        include_str!("../migrations/sqlite/0012_webhook_events.sql"),
    ),
    (13, include_str!("../migrations/sqlite/0013_job_traces.sql")),
    (
        14,
        include_str!("../migrations/sqlite/0014_stats_minutes.sql"),
    ),
    (
        15,
        include_str!("../migrations/sqlite/0015_one_job_order.sql"),
    ),
    (
        16,
        include_str!("../migrations/sqlite/0016_no_age_index.sql"),
    ),
    (
        17,
        include_str!("../migrations/sqlite/0017_claims_off_history.sql"),
    ),
    (
        18,
        include_str!("../migrations/sqlite/0018_lists_by_status.sql"),
    ),
    (
        19,
        include_str!("../migrations/sqlite/0019_lists_end_with_creation.sql"),
    ),
    (
        20,
        include_str!("../migrations/sqlite/0020_history_ids_reused.sql"),
    ),
    (
        21,
        include_str!("../migrations/sqlite/0021_history_without_job_reference.sql"),
    ),
    (
        22,
        include_str!("../migrations/sqlite/0022_tasks_without_job_reference.sql"),
    ),
];

impl From<rusqlite::Error> for Error {
    fn from(error: rusqlite::Error) -> Error {
        sqlite_error(error, || false)
    }
}

/// The store's error for a failed SQLite call: a full disk or a read-only database is named
/// (see `fault::sqlite_fault`; `read_only_filesystem` is asked only about I/O errors).
fn sqlite_error(error: rusqlite::Error, read_only_filesystem: impl FnOnce() -> bool) -> Error {
    let fault = match &error {
        rusqlite::Error::SqliteFailure(failure, _) => {
            fault::sqlite_fault(failure.code, read_only_filesystem)
        }
        _ => None,
    };
    match fault {
        Some(fault) => faulted(fault, error.to_string()),
        None => Error::Database(DatabaseError {
            message: error.to_string(),
            code: None,
        }),
    }
}

/// The store's error for a write that failed with `fault`.
fn faulted(fault: WriteFault, message: String) -> Error {
    match fault {
        WriteFault::Full => Error::Full(message),
        WriteFault::ReadOnly => Error::ReadOnly(message),
        WriteFault::Unavailable => Error::Unavailable(message),
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

/// Pages in the write-ahead log from which the writer waits after its commit for a checkpoint
/// that lets the log start over.
const CHECKPOINT_WAIT_PAGES: c_int = 4 * CHECKPOINT_PAGES;

/// How long a restarting checkpoint waits for readers to leave the log.
const RESTART_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// What the write-ahead log file is cut back to when the log starts over (it keeps the size it
/// grew to otherwise).
const WAL_SIZE_LIMIT: u64 = 32 << 20;

/// A connection to the store's SQLite file.
pub struct SqliteConn {
    conn: Connection,
    /// The writer's set statements (`Conn::execute_set`), finalized before `conn` closes.
    sets: SetStatements,
    /// The database file, whose filesystem is asked whether it is read-only when a call fails
    /// with an I/O error.
    path: PathBuf,
    /// The writer's (with `Durability::Full`): what makes its commits durable.
    log_sync: Option<Arc<WalSync>>,
}

impl Drop for SqliteConn {
    fn drop(&mut self) {
        // A connection with statements not finalized does not close.
        self.sets = SetStatements::default();
    }
}

/// Syncs the write-ahead log of a writer whose commits do not (see the module's documentation).
/// The file is opened at the first sync (the log exists once something was written); the
/// folder holding it is synced then too, so that the log's own entry is durable.
struct WalSync {
    wal: PathBuf,
    file: Mutex<Option<std::fs::File>>,
}

impl WalSync {
    fn new(database: &Path) -> WalSync {
        let mut wal = database.as_os_str().to_owned();
        wal.push("-wal");
        WalSync {
            wal: PathBuf::from(wal),
            file: Mutex::new(None),
        }
    }

    fn opened(&self) -> std::io::Result<std::fs::File> {
        let file = std::fs::File::open(&self.wal)?;
        if let Some(folder) = self
            .wal
            .parent()
            .filter(|folder| !folder.as_os_str().is_empty())
        {
            std::fs::File::open(folder)?.sync_all()?;
        }
        Ok(file)
    }
}

impl crate::db::LogSync for WalSync {
    fn sync(&self) -> Result<()> {
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let synced = match file.as_ref() {
            Some(open) => open.sync_data(),
            None => self.opened().and_then(|opened| {
                let synced = opened.sync_data();
                *file = Some(opened);
                synced
            }),
        };
        synced.map_err(|error| {
            let message = format!(
                "syncing the write-ahead log {}: {error}",
                self.wal.display()
            );
            faulted(fault::io_fault(&error), message)
        })
    }
}

impl SqliteConn {
    pub fn open(path: &Path) -> Result<SqliteConn> {
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
        Ok(SqliteConn {
            conn,
            sets: SetStatements::default(),
            path: path.to_owned(),
            log_sync: None,
        })
    }

    /// The store's error for a failed call on this connection.
    fn error(&self, error: rusqlite::Error) -> Error {
        sqlite_error(error, || fault::read_only_filesystem(&self.path))
    }

    /// The writer's connection: its write-ahead log is checkpointed by a thread of its own (see
    /// the module's documentation), which ends when the connection is dropped.
    pub fn open_writer(path: &Path, durability: Durability) -> Result<SqliteConn> {
        let mut writer = SqliteConn::open(path)?;
        // Commits write the log without syncing it; checkpoints still sync it first. With
        // `Durability::Full`, `log_sync` syncs it before a commit is acknowledged.
        writer.conn.execute_batch("PRAGMA synchronous = NORMAL")?;
        if durability == Durability::Full {
            writer.log_sync = Some(Arc::new(WalSync::new(path)));
        }
        let checkpointing = SqliteConn::open(path)?;
        checkpointing.conn.busy_timeout(RESTART_WAIT)?;
        let checkpointer = Checkpointer::start(checkpointing)?;
        // The log length at which the writer next waits for the log to start over.
        let mut wait_at = CHECKPOINT_WAIT_PAGES;
        writer
            .conn
            .execute_batch(&format!("PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}"))?;
        // Replacing the write-ahead log hook also turns SQLite's own auto-checkpoint off. The
        // hook runs once the commit is written, and must not fail it.
        writer
            .conn
            .wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: c_int| {
                if pages >= wait_at {
                    wait_at = if checkpointer.restart() {
                        CHECKPOINT_WAIT_PAGES
                    } else {
                        pages.saturating_add(CHECKPOINT_WAIT_PAGES)
                    };
                } else if checkpointer.behind(pages) >= CHECKPOINT_PAGES {
                    checkpointer.request();
                }
                Ok(())
            }))?;
        Ok(writer)
    }

    /// Brings the schema up to date inside one immediate transaction (two processes opening the
    /// same file at once cannot both apply a migration); returns how many were applied.
    pub fn migrate(&mut self, now_millis: i64) -> Result<usize> {
        crate::db::migrate(self, "BEGIN IMMEDIATE", MIGRATIONS, now_millis)
    }
}

/// A request to the checkpointer: a passive checkpoint, or one that lets the log start over
/// (and then says it is done).
enum CheckpointRequest {
    Passive,
    /// Answered with whether the log can start over.
    Restart(SyncSender<bool>),
}

/// Runs passive checkpoints on a connection of its own when asked.
struct Checkpointer {
    due: SyncSender<CheckpointRequest>,
    /// Frames in the log, and frames copied from it, as the last checkpoint left them.
    progress: Arc<Mutex<(c_int, c_int)>>,
}

impl Checkpointer {
    fn start(conn: SqliteConn) -> Result<Checkpointer> {
        // One request waits at most: asking while one waits adds nothing, unless to wait.
        let (due, requests) = sync_channel::<CheckpointRequest>(1);
        let progress = Arc::new(Mutex::new((0, 0)));
        let made = progress.clone();
        std::thread::Builder::new()
            .name("starbridge-checkpoint".to_owned())
            .spawn(move || {
                while let Ok(request) = requests.recv() {
                    let mode = match request {
                        CheckpointRequest::Passive => rusqlite::wal::CheckpointMode::PASSIVE,
                        CheckpointRequest::Restart(_) => rusqlite::wal::CheckpointMode::RESTART,
                    };
                    let checkpoint = conn.conn.wal_checkpoint_v2(None::<&str>, mode);
                    let busy = matches!(
                        &checkpoint,
                        Err(rusqlite::Error::SqliteFailure(error, _))
                            if error.code == rusqlite::ErrorCode::DatabaseBusy
                    );
                    match &checkpoint {
                        Ok(frames) => {
                            *made.lock().unwrap_or_else(PoisonError::into_inner) = *frames;
                        }
                        // Readers stayed in the log: everything else was copied.
                        Err(_) if busy => {}
                        Err(error) => {
                            tracing::warn!(%error, "checkpoint of the write-ahead log failed");
                        }
                    }
                    if let CheckpointRequest::Restart(done) = request {
                        let _ = done.send(checkpoint.is_ok());
                    }
                }
            })
            .map_err(|error| Error::Open(format!("cannot start the checkpointer: {error}")))?;
        Ok(Checkpointer { due, progress })
    }

    /// Pages of a log of `pages` pages that no checkpoint has copied yet, as far as known. A
    /// log shorter than the last checkpoint saw has started over since.
    fn behind(&self, pages: c_int) -> c_int {
        let (log, copied) = *self.progress.lock().unwrap_or_else(PoisonError::into_inner);
        if pages >= log { pages - copied } else { pages }
    }

    /// Asks for a passive checkpoint, without waiting for it.
    fn request(&self) {
        match self.due.try_send(CheckpointRequest::Passive) {
            Ok(()) | Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Disconnected(_)) => {
                tracing::warn!("the checkpointer has stopped");
            }
        }
    }

    /// Waits for a checkpoint that copies the whole log and waits for readers to leave it, so
    /// that the next transaction starts the log over; false when readers stayed.
    fn restart(&self) -> bool {
        let (done, finished) = sync_channel::<bool>(1);
        if self.due.send(CheckpointRequest::Restart(done)).is_err() {
            tracing::warn!("the checkpointer has stopped");
            return false;
        }
        finished.recv().unwrap_or(false)
    }
}

fn cell(value: ValueRef<'_>) -> Cell {
    match value {
        ValueRef::Null => Cell::Null,
        ValueRef::Integer(value) => Cell::Int(value),
        ValueRef::Real(value) => Cell::Real(value),
        // Text is UTF-8 (checked word by word); anything else reads with replacement characters.
        ValueRef::Text(text) | ValueRef::Blob(text) => {
            Cell::Text(match std::str::from_utf8(text) {
                Ok(text) => text.to_owned(),
                Err(_) => String::from_utf8_lossy(text).into_owned(),
            })
        }
    }
}

impl Conn for SqliteConn {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    fn log_sync(&self) -> Option<Arc<dyn crate::db::LogSync>> {
        self.log_sync
            .clone()
            .map(|sync| sync as Arc<dyn crate::db::LogSync>)
    }

    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        let sql = sqlite_sql(sql);
        let changed = self
            .conn
            .prepare_cached(sql)
            .and_then(|mut statement| statement.execute(params_from_iter(args)))
            .map_err(|error| self.error(error))?;
        Ok(u64::try_from(changed).unwrap_or(u64::MAX))
    }

    fn execute_set<'a>(
        &mut self,
        sql: &str,
        args: &mut dyn Iterator<Item = Arg<'a>>,
    ) -> Result<u64> {
        self.sets
            .execute(&self.conn, sqlite_sql(sql), args)
            .map_err(|error| self.error(error))
    }

    fn query(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        let sql = sqlite_sql(sql);
        let rows = (|| -> rusqlite::Result<Vec<Row>> {
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
        })();
        rows.map_err(|error| self.error(error))
    }

    fn batch(&mut self, sql: &str) -> Result<()> {
        self.conn
            .execute_batch(sql)
            .map_err(|error| self.error(error))
    }

    fn lock_key(&mut self, _key: &str) -> Result<()> {
        Ok(())
    }

    // The writer begins and commits every group: both statements run from the statement cache
    // (`execute`), as parsing them each time was a few percent of a small group's time.
    fn begin_write(&mut self) -> Result<()> {
        self.execute("BEGIN IMMEDIATE", &[]).map(|_| ())
    }

    fn commit(&mut self, _announcements: &[String]) -> Result<()> {
        self.execute("COMMIT", &[]).map(|_| ())
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
        fill_from(writer, 0, rows);
    }

    /// The same, with ids from `first` on.
    fn fill_from(writer: &mut SqliteConn, first: usize, rows: usize) {
        let filler = "x".repeat(4000);
        for chunk in 0..rows / 100 {
            writer.batch("BEGIN IMMEDIATE").unwrap();
            for row in 0..100 {
                let id = i64::try_from(first + chunk * 100 + row).unwrap();
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
    fn text_reads_as_stored_and_bytes_that_are_not_utf8_with_replacement_characters() {
        assert_eq!(
            cell(ValueRef::Text("tsk_é1".as_bytes())),
            Cell::Text("tsk_é1".into())
        );
        assert_eq!(
            cell(ValueRef::Blob(b"a\xffb")),
            Cell::Text("a\u{fffd}b".into())
        );
    }

    #[test]
    fn a_migration_numbered_into_a_gap_still_runs() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer =
            SqliteConn::open_writer(&dir.path().join("gap.db"), Durability::Full).unwrap();
        let first: &[(i64, &str)] = &[(1, "CREATE TABLE a (x)"), (3, "CREATE TABLE c (x)")];
        let later: &[(i64, &str)] = &[
            (1, "CREATE TABLE a (x)"),
            (2, "CREATE TABLE b (x)"),
            (3, "CREATE TABLE c (x)"),
        ];
        assert_eq!(
            crate::db::migrate(&mut writer, "BEGIN", first, 0).unwrap(),
            2
        );
        assert_eq!(
            crate::db::migrate(&mut writer, "BEGIN", later, 0).unwrap(),
            1
        );
        assert_eq!(
            crate::db::migrate(&mut writer, "BEGIN", later, 0).unwrap(),
            0
        );
        let tables: i64 = (&mut writer as &mut dyn Conn)
            .query_value(
                "SELECT COUNT(*) FROM sqlite_master WHERE name IN ('a', 'b', 'c')",
                args![],
            )
            .unwrap();
        assert_eq!(tables, 3);
    }

    /// A new database migrated up to (not including) `version`, its foreign keys off so that a
    /// test can write rows whose parents it leaves out.
    fn migrated_before(path: &Path, version: i64) -> SqliteConn {
        let mut writer = SqliteConn::open_writer(path, Durability::Full).unwrap();
        let before = MIGRATIONS.iter().position(|(v, _)| *v == version).unwrap();
        crate::db::migrate(&mut writer, "BEGIN", &MIGRATIONS[..before], 0).unwrap();
        writer.batch("PRAGMA foreign_keys = OFF").unwrap();
        writer
    }

    /// The remaining migrations; then foreign keys on again, as a server has them.
    fn migrate_the_rest(writer: &mut SqliteConn) {
        crate::db::migrate(writer, "BEGIN", MIGRATIONS, 0).unwrap();
        writer.batch("PRAGMA foreign_keys = ON").unwrap();
    }

    /// The history's ids, each with the value of `column`, oldest first.
    fn events_by_seq(conn: &mut dyn Conn, column: &str) -> Vec<(i64, String)> {
        conn.query_map(
            &format!("SELECT seq, {column} FROM events ORDER BY seq"),
            args![],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap()
    }

    /// The two numbers of a query's one row.
    fn two_numbers(conn: &mut dyn Conn, sql: &str) -> (i64, i64) {
        conn.query_opt(sql, args![], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn the_history_rebuilt_without_a_job_reference_keeps_its_events_and_its_index() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = migrated_before(&dir.path().join("refs.db"), 21);
        writer
            .batch(
                "INSERT INTO events (job_id, at, kind, detail) VALUES \
                     ('job_1', 1, 'job_created', '{}'), ('job_2', 2, 'job_created', '{}')",
            )
            .unwrap();
        // The rebuild runs with foreign keys on, as a server opens its database.
        writer.batch("PRAGMA foreign_keys = ON").unwrap();
        migrate_the_rest(&mut writer);
        let conn = &mut writer as &mut dyn Conn;
        let kept = events_by_seq(conn, "job_id");
        assert_eq!(kept, [(1, "job_1".to_owned()), (2, "job_2".to_owned())]);
        let (references, indexes) = two_numbers(
            conn,
            "SELECT (SELECT COUNT(*) FROM pragma_foreign_key_list('events')), \
                 (SELECT COUNT(*) FROM sqlite_master WHERE name = 'events_job')",
        );
        assert_eq!((references, indexes), (0, 1));
        conn.batch(
            "INSERT INTO events (job_id, at, kind, detail) VALUES ('job_3', 3, 'job_created', '{}')",
        )
        .expect("an event is written without looking its job up");
    }

    #[test]
    fn the_tasks_rebuilt_without_a_job_reference_keep_their_rows_columns_and_indexes() {
        // Each column as `pragma_table_xinfo` describes it, and each index by name with its
        // text (white space aside) and whether it is unique.
        fn shape(conn: &mut dyn Conn) -> (Vec<String>, Vec<String>) {
            let columns = conn
                .query_map(
                    "SELECT cid || ' ' || name || ' ' || type || ' ' || \"notnull\" || ' ' || \
                         COALESCE(dflt_value, '-') || ' ' || pk || ' ' || hidden \
                     FROM pragma_table_xinfo('tasks') ORDER BY cid",
                    args![],
                    |row| row.get(0),
                )
                .unwrap();
            let indexes = conn
                .query_map(
                    "SELECT l.name || ' ' || l.\"unique\" || ' ' || COALESCE(m.sql, '-') \
                     FROM pragma_index_list('tasks') AS l \
                     LEFT JOIN sqlite_master AS m ON m.name = l.name ORDER BY l.name",
                    args![],
                    |row| row.get::<String>(0),
                )
                .unwrap()
                .into_iter()
                .map(|index| index.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            (columns, indexes)
        }
        let dir = tempfile::tempdir().unwrap();
        let mut writer = migrated_before(&dir.path().join("tasks.db"), 22);
        writer
            .batch(
                "INSERT INTO tasks (id, job_id, namespace, seq, kind, step, queue, command, \
                     status, priority, attempt, checking, created_at, held, round, attempt_base, \
                     wait_kind, claimed_at) \
                 VALUES ('task_1', 'job_1', 'default', 0, 'step', 'build', 'ci', 'make', \
                     'running', 0, 1, 0, 1, 0, 0, 0, 'approval', 7)",
            )
            .unwrap();
        let before = shape(&mut writer);
        assert_eq!(
            before.1.len(),
            10,
            "nine indexes and the primary key's: {:?}",
            before.1
        );
        writer.batch("PRAGMA foreign_keys = ON").unwrap();
        migrate_the_rest(&mut writer);
        let conn = &mut writer as &mut dyn Conn;
        assert_eq!(shape(conn), before);
        let (references, kept) = two_numbers(
            conn,
            "SELECT (SELECT COUNT(*) FROM pragma_foreign_key_list('tasks')), \
                 (SELECT COUNT(*) FROM tasks WHERE id = 'task_1' AND job_id = 'job_1' \
                     AND wait_kind = 'approval' AND claimed_at = 7)",
        );
        assert_eq!((references, kept), (0, 1));
    }

    #[test]
    fn the_history_rebuilt_without_autoincrement_keeps_its_events_and_the_rollup_reads_new_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = migrated_before(&dir.path().join("ids.db"), 20);
        // Events of a job whose row this test leaves out; the newest is deleted after the
        // rollup read it, so AUTOINCREMENT's counter (3) is above the largest id left (2).
        writer
            .batch(
                "INSERT INTO events (job_id, at, kind, detail) VALUES \
                     ('job_1', 1, 'job_created', '{}'), ('job_1', 2, 'job_started', '{}'), \
                     ('job_1', 3, 'job_succeeded', '{}'); \
                 UPDATE stats_rollup SET seq = 3; \
                 DELETE FROM events WHERE seq = 3",
            )
            .unwrap();
        migrate_the_rest(&mut writer);
        let conn = &mut writer as &mut dyn Conn;
        let kept = events_by_seq(conn, "kind");
        assert_eq!(
            kept,
            [(1, "job_created".to_owned()), (2, "job_started".to_owned())]
        );
        let rollup: i64 = conn
            .query_value("SELECT seq FROM stats_rollup", args![])
            .unwrap();
        assert_eq!(rollup, 2, "lowered to the largest id left");
        conn.batch(
            "INSERT INTO events (job_id, at, kind, detail) VALUES ('job_1', 4, 'job_failed', '{}')",
        )
        .unwrap();
        let (newest, counters) = two_numbers(
            conn,
            "SELECT (SELECT MAX(seq) FROM events), \
                 (SELECT COUNT(*) FROM sqlite_sequence WHERE name = 'events')",
        );
        assert_eq!(newest, 3, "past the rollup's watermark");
        assert_eq!(counters, 0, "no counter row written");
    }

    #[test]
    fn the_writers_commits_leave_the_log_sync_to_their_caller_unless_durability_is_relaxed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("durability.db");
        let synchronous = |conn: &mut SqliteConn| -> i64 {
            (conn as &mut dyn Conn)
                .query_value("PRAGMA synchronous", args![])
                .unwrap()
        };
        let mut full = SqliteConn::open_writer(&path, Durability::Full).unwrap();
        // SQLite's numbers: 1 is NORMAL, 2 is FULL.
        assert_eq!(synchronous(&mut full), 1, "commits do not sync the log");
        full.batch("CREATE TABLE t (x); INSERT INTO t VALUES (1)")
            .unwrap();
        let log_sync = full
            .log_sync()
            .expect("a full-durability writer's log is synced after");
        log_sync.sync().unwrap();
        log_sync.sync().unwrap();
        drop(full);
        let mut relaxed = SqliteConn::open_writer(&path, Durability::Relaxed).unwrap();
        assert_eq!(synchronous(&mut relaxed), 1);
        assert!(
            relaxed.log_sync().is_none(),
            "relaxed commits are not synced"
        );
        let mut reader = SqliteConn::open(&path).unwrap();
        assert_eq!(synchronous(&mut reader), 2);
    }

    #[test]
    fn the_writers_log_is_checkpointed_into_the_database_file_by_the_checkpointer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.db");
        let mut writer = SqliteConn::open_writer(&path, Durability::Full).unwrap();
        writer
            .batch("CREATE TABLE filler (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
            .unwrap();
        let file_pages = || std::fs::metadata(&path).unwrap().len() / 4096;
        let before = file_pages();
        // Past the checkpoint threshold, short of the size at which a commit checkpoints itself.
        let rows = usize::try_from(2 * CHECKPOINT_PAGES).unwrap();
        const { assert!(2 * CHECKPOINT_PAGES < CHECKPOINT_WAIT_PAGES) };
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

    #[test]
    fn a_writer_that_never_pauses_keeps_its_log_bounded_and_every_commit_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bounded.db");
        let mut writer = SqliteConn::open_writer(&path, Durability::Full).unwrap();
        writer
            .batch("CREATE TABLE filler (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
            .unwrap();
        // Three times the size at which the writer waits for the checkpointer: `fill` unwraps
        // every commit, which a checkpoint must never fail.
        fill(
            &mut writer,
            usize::try_from(3 * CHECKPOINT_WAIT_PAGES).unwrap(),
        );
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let wal_pages = std::fs::metadata(&wal).unwrap().len() / 4096;
        assert!(
            wal_pages < u64::try_from(2 * CHECKPOINT_WAIT_PAGES).unwrap(),
            "the log grew to {wal_pages} pages"
        );
    }

    #[test]
    fn a_reader_that_stays_in_the_log_lets_it_grow_and_it_starts_over_once_the_reader_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reader.db");
        let mut writer = SqliteConn::open_writer(&path, Durability::Full).unwrap();
        writer
            .batch("CREATE TABLE filler (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
            .unwrap();
        let mut reader = SqliteConn::open(&path).unwrap();
        reader.batch("BEGIN").unwrap();
        let _: i64 = (&mut reader as &mut dyn Conn)
            .query_value("SELECT COUNT(*) FROM filler", args![])
            .unwrap();
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let wal_bytes = || std::fs::metadata(&wal).unwrap().len();
        let rows = usize::try_from(3 * CHECKPOINT_WAIT_PAGES).unwrap();
        fill(&mut writer, rows);
        assert!(
            wal_bytes() > 2 * u64::try_from(CHECKPOINT_WAIT_PAGES).unwrap() * 4096,
            "the reader's snapshot keeps the log: {} bytes",
            wal_bytes()
        );
        reader.batch("COMMIT").unwrap();
        // More commits reach the next wait, which now lets the log start over (and the file is
        // cut back to its limit).
        fill_from(
            &mut writer,
            rows,
            usize::try_from(2 * CHECKPOINT_WAIT_PAGES).unwrap(),
        );
        assert!(
            wal_bytes() <= WAL_SIZE_LIMIT + 4096 * u64::try_from(CHECKPOINT_WAIT_PAGES).unwrap(),
            "the log did not start over: {} bytes",
            wal_bytes()
        );
    }
}
