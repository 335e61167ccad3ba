//! The SQL layer of Starbridge: the connection seam (`db::Conn`) over two backends, an
//! embedded SQLite file (`sqlite`, the default, with its checkpointer) and PostgreSQL
//! (`postgres`, for several server nodes on one database), their migrations, the row mapping of
//! every table (`rows`), the queries that browse and count (`browse`, `stats`), the pool of read
//! connections (`reader`), a write connection that holds row writes back and sends them in sets
//! (`deferred`), and what a failed write says about the database (`fault`).
//!
//! The store knows tables, not rules: what a change means is the engine's (`starbridge-engine`),
//! which runs every change through one writer connection in group-committed transactions. This
//! crate never calls the engine.

pub mod browse;
pub mod db;
pub mod deferred;
pub mod fault;
pub mod minutes;
pub mod postgres;
pub mod reader;
pub mod rows;
// The store's own tests use scratch schemas too (`rows::tests`).
#[cfg(any(test, feature = "scratch"))]
pub mod scratch;
pub mod sqlite;
pub mod stats;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use serde_json::Value;
use starbridge_core::definition::Problem;
use starbridge_core::dispatch::{Bucket, QueueConfig};
use starbridge_core::ids::JobId;
use starbridge_core::limits::Limits;
use starbridge_core::model::{Event, JobStatus};
use starbridge_core::time::{Duration, Timestamp};

pub use browse::{JobCursor, JobLine, JobSearch, StatusCount, WorkerLoad};
pub use db::{Conn, DatabaseError};
pub use fault::WriteFault;
pub use sqlite::sqlite_path;
pub use stats::{QueueStats, Stats};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// What the request names existed, but is over for good (a callback token whose attempt
    /// has ended).
    #[error("{0}")]
    Gone(String),
    /// The caller may not do this (for example, make a workflow version without `operate`).
    #[error("{0}")]
    Forbidden(String),
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<Problem>),
    #[error("database error: {0}")]
    Database(DatabaseError),
    /// Another server node held the rows a request needed for too long, even after retries.
    #[error("contended: {0}")]
    Contended(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The disk holding the database is full: nothing was written.
    #[error("the database's disk is full: {0}")]
    Full(String),
    /// The database, or its filesystem, is read-only: nothing was written.
    #[error("the database is read-only: {0}")]
    ReadOnly(String),
    #[error("cannot open the database: {0}")]
    Open(String),
    #[error("the store is shut down")]
    Closed,
}

impl Error {
    /// What this error says about the database's ability to take writes, if anything.
    pub fn write_fault(&self) -> Option<WriteFault> {
        match self {
            Error::Full(_) => Some(WriteFault::Full),
            Error::ReadOnly(_) => Some(WriteFault::ReadOnly),
            Error::Unavailable(_) => Some(WriteFault::Unavailable),
            _ => None,
        }
    }

    /// How a request is answered when its group transaction failed with this error: a full
    /// disk or a read-only database is named, anything else is the database being unavailable.
    pub fn refusal(&self) -> Error {
        match self {
            Error::Full(detail) => Error::Full(detail.clone()),
            Error::ReadOnly(detail) => Error::ReadOnly(detail.clone()),
            other => Error::Unavailable(other.to_string()),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A stored workflow version.
#[derive(Debug, Clone)]
pub struct StoredWorkflow {
    pub namespace: String,
    pub name: String,
    pub version: u32,
    pub definition: Value,
    pub description: Option<String>,
    pub steps: u32,
    pub created_at: Timestamp,
}

/// A queue's settings as stored.
#[derive(Debug, Clone)]
pub struct StoredQueue {
    pub namespace: String,
    pub name: String,
    pub config: QueueConfig,
    /// The rate limit's token bucket as of the last claim (`None`: full).
    pub bucket: Option<Bucket>,
    pub created_at: Timestamp,
    pub updated_at: Option<Timestamp>,
    /// An operator gave the queue settings of its own (`PUT`): no prefix settings apply to it.
    /// Its `config` holds them; otherwise `config` holds the defaults and only its pause counts.
    pub configured: bool,
    /// Why the queue paused itself (`on_error: pause`): then compensation tasks still dispatch
    /// on it. `None` when it is not paused or an operator paused it.
    pub paused_reason: Option<String>,
}

/// Settings for every queue whose name starts with `prefix` and has none of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredQueuePrefix {
    pub namespace: String,
    /// The pattern without its `*` (empty for `*`).
    pub prefix: String,
    /// Its `paused` is not used: a queue's pause is its own.
    pub config: QueueConfig,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub seq: i64,
    pub step: Option<String>,
    pub event: Event,
}

#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub namespace: String,
    pub status: Option<JobStatus>,
    pub workflow: Option<String>,
    /// Only jobs created at or after this time.
    pub created_after: Option<Timestamp>,
    /// Only jobs created before this time.
    pub created_before: Option<Timestamp>,
    /// Only jobs after this one in the list's order (the last job of the previous page).
    pub before: Option<JobCursor>,
    /// Only the child jobs of this job (sub-workflows).
    pub parent: Option<JobId>,
    /// Only jobs with every one of these labels (`key`, `value`).
    pub labels: Vec<(String, String)>,
    /// Only these jobs (`Some` of none: no job).
    pub ids: Option<Vec<JobId>>,
    pub limit: u32,
}

/// How a store connects and how long it keeps finished jobs.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Most read connections open at once.
    pub read_pool: usize,
    /// PostgreSQL: how long to wait for a connection before a request fails as unavailable.
    pub connect_timeout: StdDuration,
    /// PostgreSQL: longest a statement may run before it is cancelled.
    pub statement_timeout: StdDuration,
    /// PostgreSQL: longest a write waits for rows another node holds before it runs again in
    /// the next transaction (this also breaks deadlocks between nodes quickly).
    pub lock_timeout: StdDuration,
    /// Finished jobs older than this are deleted with their tasks and history (`None`: kept).
    pub retain_finished: Option<Duration>,
    /// What the engine enforces on every job (fan-out width, task input size).
    pub limits: Limits,
    /// When a change counts as stored.
    pub durability: Durability,
}

/// When the store answers a change: once it is on disk, or once the database has it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Durability {
    /// Every change is on disk (fsynced) before it is answered: nothing acknowledged is lost,
    /// whatever fails. (SQLite's writer syncs its log after the commit, see `Conn::log_sync`.)
    #[default]
    Full,
    /// A change is answered once the database has it, before it reaches the disk (SQLite's
    /// writer does not sync its log first, PostgreSQL `synchronous_commit=off`): a crash of the
    /// server process loses nothing, but a power loss or a crash of the operating system (or of
    /// PostgreSQL) may lose the changes of the last moments, though acknowledged. The database
    /// stays consistent either way.
    Relaxed,
}

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            read_pool: 8,
            connect_timeout: StdDuration::from_secs(5),
            statement_timeout: StdDuration::from_secs(30),
            lock_timeout: StdDuration::from_millis(200),
            retain_finished: Some(Duration::from_secs(30 * 24 * 3600)),
            limits: Limits::default(),
            durability: Durability::Full,
        }
    }
}

/// A connection-opening function: the writer reopens its connection with one when it broke, the
/// read pool opens its connections with another.
pub type Connect = Arc<dyn Fn() -> Result<Box<dyn Conn>> + Send + Sync>;

/// Runs `open` on a thread of its own: the PostgreSQL client blocks, which the async runtime
/// that usually opens the engine does not allow on its threads.
pub fn off_runtime<T: Send + 'static>(
    open: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    std::thread::spawn(open)
        .join()
        .map_err(|_| Error::Open("opening the database panicked".to_owned()))?
}

/// What opening a backend gives: the migrated write connection and how to open more.
pub struct Opened {
    pub writer: Box<dyn Conn>,
    /// Opens a new write connection when the writer's broke.
    pub reconnect_writer: Connect,
    /// Opens a read connection.
    pub connect: Connect,
    pub sqlite_file: Option<PathBuf>,
    /// How many migrations were applied.
    pub applied: usize,
    /// PostgreSQL: how to open the connections of the listener and the vacuumer.
    pub postgres: Option<postgres::Connector>,
}

/// Opens the database at `url` (`sqlite://FILE`, a plain path, or `postgres://...`), creating
/// it if needed, and brings its schema up to date.
pub fn open(url: &str, options: &StoreOptions, now_millis: i64) -> Result<Opened> {
    if postgres::is_postgres_url(url) {
        let connector = postgres::Connector::new(url, options)?;
        let opener = connector.clone();
        let (applied, writer) = off_runtime(move || {
            let applied = opener.migrate(now_millis)?;
            Ok((applied, opener.connect()?))
        })?;
        let for_pool = connector.clone();
        let connect: Connect = Arc::new(move || {
            for_pool
                .connect()
                .map(|conn| Box::new(conn) as Box<dyn Conn>)
        });
        return Ok(Opened {
            writer: Box::new(writer),
            reconnect_writer: connect.clone(),
            connect,
            sqlite_file: None,
            applied,
            postgres: Some(connector),
        });
    }
    let path = sqlite_path(url)?;
    let durability = options.durability;
    let mut writer = sqlite::SqliteConn::open_writer(&path, durability)?;
    let applied = writer.migrate(now_millis)?;
    let file = path.clone();
    let connect: Connect = Arc::new(move || {
        sqlite::SqliteConn::open(&file).map(|conn| Box::new(conn) as Box<dyn Conn>)
    });
    let file = path.clone();
    let reconnect_writer: Connect = Arc::new(move || {
        sqlite::SqliteConn::open_writer(&file, durability)
            .map(|conn| Box::new(conn) as Box<dyn Conn>)
    });
    Ok(Opened {
        writer: Box::new(writer),
        reconnect_writer,
        connect,
        sqlite_file: Some(path),
        applied,
        postgres: None,
    })
}

/// Brings the schema of the database at `url` up to date; returns how many migrations were
/// applied. `now_millis` stamps the migrations.
pub fn migrate(url: &str, options: &StoreOptions, now_millis: i64) -> Result<usize> {
    if postgres::is_postgres_url(url) {
        let connector = postgres::Connector::new(url, options)?;
        return off_runtime(move || connector.migrate(now_millis));
    }
    sqlite::SqliteConn::open(&sqlite_path(url)?)?.migrate(now_millis)
}
