//! The PostgreSQL backend, for several server nodes sharing one database.
//!
//! Each node keeps the SQLite design (one writer thread committing many requests per
//! transaction, a pool of read connections) and adds what sharing needs:
//! - row locks: a write locks the job it changes (`FOR UPDATE`), a claim skips tasks and jobs
//!   another node holds (`FOR UPDATE SKIP LOCKED`), and counting limits (serial queues, lock slots,
//!   rate buckets) run under a transaction-scoped advisory lock on the queue or lock key;
//! - a short `lock_timeout`: a request that waits too long on another node's transaction (or is
//!   caught in a deadlock) is rolled back to its savepoint and run again in the next transaction;
//! - LISTEN/NOTIFY: a commit announces which queues got work, and every other node's listener
//!   wakes its long-polls at once;
//! - migrations under an advisory lock, so nodes starting together do not race;
//! - a vacuumer thread that keeps the dispatch index free of claimed tasks (see `vacuum`).

use std::collections::HashMap;
use std::error::Error as StdError;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::BytesMut;
use postgres::fallible_iterator::FallibleIterator;
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use postgres::{Client, NoTls, Statement};

use crate::db::{Arg, Backend, Cell, Conn, DatabaseError, Row, args, postgres_sql};
use crate::fault::{self, WriteFault};
use crate::notify::Notifier;
use crate::{Error, Result, StoreOptions};

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../migrations/postgres/0001_init.sql")),
    (2, include_str!("../migrations/postgres/0002_tokens.sql")),
    (3, include_str!("../migrations/postgres/0003_browse.sql")),
    (4, include_str!("../migrations/postgres/0004_health.sql")),
];

/// Any fixed number: the advisory lock that serializes migrations across nodes.
const MIGRATION_LOCK: i64 = 0x5354_4152_4252_4944;

pub(crate) fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

fn sqlstate_error(error: &postgres::Error) -> Error {
    let message = error.to_string();
    let detail = error.as_db_error().map_or_else(
        || message.clone(),
        |db| format!("{}: {}", db.severity(), db.message()),
    );
    let code = error.code().map(postgres::error::SqlState::code);
    let described = || match code {
        Some(code) => format!("{detail} (SQLSTATE {code})"),
        None => message.clone(),
    };
    // Serialization failure, deadlock, lock wait timeout, a unique key another node just took:
    // the request runs again in a new transaction, where it sees the winner's rows.
    if let Some("40001" | "40P01" | "55P03" | "23505") = code {
        return Error::Contended(described());
    }
    match fault::postgres_fault(code) {
        Some(WriteFault::Full) => Error::Full(described()),
        Some(WriteFault::ReadOnly) => Error::ReadOnly(described()),
        Some(WriteFault::Unavailable) => Error::Unavailable(described()),
        None => Error::Database(DatabaseError {
            message: detail.clone(),
            code: code.map(str::to_owned),
        }),
    }
}

impl From<postgres::Error> for Error {
    fn from(error: postgres::Error) -> Error {
        sqlstate_error(&error)
    }
}

type BoxError = Box<dyn StdError + Sync + Send>;

impl ToSql for Arg<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> std::result::Result<IsNull, BoxError> {
        match *self {
            Arg::Null => Ok(IsNull::Yes),
            Arg::Int(value) => match *ty {
                Type::INT8 => value.to_sql(ty, out),
                Type::INT4 => i32::try_from(value)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(value)?.to_sql(ty, out),
                Type::BOOL => (value != 0).to_sql(ty, out),
                #[allow(clippy::cast_precision_loss)]
                Type::FLOAT8 => (value as f64).to_sql(ty, out),
                _ => value.to_string().as_str().to_sql(ty, out),
            },
            Arg::Real(value) => match *ty {
                #[allow(clippy::cast_possible_truncation)]
                Type::FLOAT4 => (value as f32).to_sql(ty, out),
                _ => value.to_sql(ty, out),
            },
            Arg::Text(value) => value.to_sql(ty, out),
        }
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

impl<'a> postgres::types::FromSql<'a> for Cell {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> std::result::Result<Cell, BoxError> {
        Ok(match *ty {
            Type::INT8 => Cell::Int(i64::from_sql(ty, raw)?),
            Type::INT4 => Cell::Int(i64::from(i32::from_sql(ty, raw)?)),
            Type::INT2 => Cell::Int(i64::from(i16::from_sql(ty, raw)?)),
            Type::BOOL => Cell::Int(i64::from(bool::from_sql(ty, raw)?)),
            Type::FLOAT8 => Cell::Real(f64::from_sql(ty, raw)?),
            Type::FLOAT4 => Cell::Real(f64::from(f32::from_sql(ty, raw)?)),
            _ => Cell::Text(String::from_sql(ty, raw).map_err(|_| {
                format!("a column of type {ty} cannot be read: cast it to BIGINT or TEXT")
            })?),
        })
    }

    fn from_sql_null(_ty: &Type) -> std::result::Result<Cell, BoxError> {
        Ok(Cell::Null)
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }
}

/// How to reach the database, shared by every connection a node opens.
#[derive(Clone)]
pub(crate) struct Connector {
    config: postgres::Config,
    options: StoreOptions,
}

impl Connector {
    pub(crate) fn new(url: &str, options: &StoreOptions) -> Result<Connector> {
        let mut config = postgres::Config::from_str(url)
            .map_err(|error| Error::Open(format!("bad PostgreSQL URL: {error}")))?;
        config.connect_timeout(options.connect_timeout);
        if config.get_application_name().is_none() {
            config.application_name("starbridge");
        }
        Ok(Connector {
            config,
            options: options.clone(),
        })
    }

    /// A new connection. Call it off the async runtime's worker threads: the client blocks.
    pub(crate) fn connect(&self) -> Result<PgConn> {
        let mut client = self.config.connect(NoTls).map_err(|error| {
            Error::Unavailable(format!("cannot connect to PostgreSQL: {error}"))
        })?;
        client.batch_execute(&format!(
            "SET statement_timeout = {}; SET lock_timeout = {}",
            self.options.statement_timeout.as_millis(),
            self.options.lock_timeout.as_millis()
        ))?;
        if self.options.durability == crate::Durability::Relaxed {
            // Commits are answered before PostgreSQL flushed them to its log.
            client.batch_execute("SET synchronous_commit = off")?;
        }
        let schema: Option<String> = client.query_one("SELECT current_schema()", &[])?.get(0);
        let schema = schema.ok_or_else(|| {
            Error::Open(
                "the connection has no schema to work in: check search_path and that a schema exists"
                    .to_owned(),
            )
        })?;
        Ok(PgConn {
            client,
            statement_timeout: self.options.statement_timeout,
            statements: HashMap::new(),
            channel: channel_name(&schema),
            schema,
        })
    }

    /// Applies the migrations not yet applied; returns how many. Nodes starting at once take
    /// turns under an advisory lock, so each migration runs exactly once.
    pub(crate) fn migrate(&self, now_millis: i64) -> Result<usize> {
        let mut conn = self.connect()?;
        conn.batch("SET lock_timeout = 0")?;
        conn.execute("SELECT pg_advisory_lock(?1)", args![MIGRATION_LOCK])?;
        let result = crate::db::migrate(&mut conn, "BEGIN", MIGRATIONS, now_millis);
        let unlocked = conn.execute("SELECT pg_advisory_unlock(?1)", args![MIGRATION_LOCK]);
        let applied = result?;
        unlocked?;
        Ok(applied)
    }
}

/// The LISTEN/NOTIFY channel of one schema: nodes on other schemas of the database (other
/// deployments, or parallel tests) do not wake each other.
fn channel_name(schema: &str) -> String {
    let cleaned: String = schema
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(40)
        .collect();
    format!("starbridge_{cleaned}")
}

/// A connection with its prepared statements.
pub(crate) struct PgConn {
    client: Client,
    statement_timeout: Duration,
    statements: HashMap<String, Statement>,
    schema: String,
    channel: String,
}

impl PgConn {
    fn statement(&mut self, sql: &str) -> Result<Statement> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(&postgres_sql(sql))?;
        self.statements.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    fn params<'a>(args: &'a [Arg<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
        args.iter().map(|arg| arg as &(dyn ToSql + Sync)).collect()
    }
}

impl Conn for PgConn {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        let statement = self.statement(sql)?;
        Ok(self.client.execute(&statement, &PgConn::params(args))?)
    }

    fn query(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        let statement = self.statement(sql)?;
        let rows = self.client.query(&statement, &PgConn::params(args))?;
        rows.iter()
            .map(|row| {
                (0..row.len())
                    .map(|index| {
                        row.try_get::<_, Cell>(index)
                            .map_err(|error| Error::Corrupt(error.to_string()))
                    })
                    .collect::<Result<Vec<_>>>()
                    .map(Row::new)
            })
            .collect()
    }

    fn batch(&mut self, sql: &str) -> Result<()> {
        Ok(self.client.batch_execute(sql)?)
    }

    fn lock_key(&mut self, key: &str) -> Result<()> {
        let key = format!("{}/{key}", self.schema);
        self.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(?1, 0))",
            args![key],
        )?;
        Ok(())
    }

    fn announce(&mut self, payload: &str) -> Result<()> {
        // Committing a transaction that notifies takes a database-wide lock for the length of
        // the commit; waiting for other nodes' commits there is expected, not a conflict.
        self.batch(&format!(
            "SET LOCAL lock_timeout = {}",
            self.statement_timeout.as_millis()
        ))?;
        let channel = self.channel.clone();
        self.execute("SELECT pg_notify(?1, ?2)", args![channel, payload])?;
        Ok(())
    }

    fn is_usable(&self) -> bool {
        !self.client.is_closed()
    }
}

/// What one commit tells the other nodes. Lines: `n <node>` (who sent it, so a node skips its
/// own), `q <namespace> <queue>` (a queue got work), `d` (webhook deliveries were written).
/// Fields are tab-separated; a payload stays under PostgreSQL's 8000-byte limit.
pub(crate) fn announcements(
    node: &str,
    wakes: &[(String, String)],
    deliveries: bool,
) -> Vec<String> {
    const LIMIT: usize = 7900;
    let header = format!("n\t{node}");
    let mut payloads = Vec::new();
    let mut current = header.clone();
    let mut lines: Vec<String> = wakes
        .iter()
        .map(|(namespace, queue)| format!("q\t{namespace}\t{queue}"))
        .collect();
    lines.sort();
    lines.dedup();
    if deliveries {
        lines.push("d".to_owned());
    }
    if lines.is_empty() {
        return payloads;
    }
    for line in lines {
        if current.len() + 1 + line.len() > LIMIT {
            payloads.push(std::mem::replace(&mut current, header.clone()));
        }
        current.push('\n');
        current.push_str(&line);
    }
    payloads.push(current);
    payloads
}

/// Applies another node's announcement to this node's notifier.
fn receive(notifier: &Notifier, node: &str, payload: &str) {
    let mut lines = payload.lines();
    if lines.next().and_then(|line| line.strip_prefix("n\t")) == Some(node) {
        return;
    }
    for line in lines {
        let mut fields = line.split('\t');
        match (fields.next(), fields.next(), fields.next()) {
            (Some("q"), Some(namespace), Some(queue)) => notifier.wake(namespace, queue),
            (Some("d"), None, None) => notifier.deliveries_changed(),
            _ => tracing::debug!(line, "unknown announcement line"),
        }
    }
}

/// Listens for other nodes' announcements until the notifier is dropped. When the connection
/// breaks it reconnects with backoff and then wakes every poll and timer of this node, since
/// announcements sent meanwhile are lost.
pub(crate) fn listen(connector: Connector, node: String, notifier: Weak<Notifier>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        if notifier.strong_count() == 0 {
            return;
        }
        let mut conn = match connector.connect() {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(%error, "listener cannot reach PostgreSQL; retrying");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        if let Err(error) = conn.batch(&format!("LISTEN {}", conn.channel)) {
            tracing::warn!(%error, "LISTEN failed; retrying");
            std::thread::sleep(backoff);
            continue;
        }
        backoff = Duration::from_millis(100);
        match notifier.upgrade() {
            Some(notifier) => {
                notifier.wake_all();
                notifier.timers_changed();
                notifier.deliveries_changed();
            }
            None => return,
        }
        loop {
            // Wake up now and then to notice that the store is gone.
            let next = conn
                .client
                .notifications()
                .timeout_iter(Duration::from_secs(1))
                .next();
            let Some(notifier) = notifier.upgrade() else {
                return;
            };
            match next {
                Ok(Some(message)) => receive(&notifier, &node, message.payload()),
                Ok(None) if conn.is_usable() => {}
                Ok(None) => break,
                Err(error) => {
                    tracing::warn!(%error, "listener connection lost; reconnecting");
                    break;
                }
            }
        }
    }
}

/// Starts the listener thread of a node.
pub(crate) fn start_listener(connector: Connector, node: String, notifier: &Arc<Notifier>) {
    let notifier = Arc::downgrade(notifier);
    std::thread::Builder::new()
        .name("starbridge-listen".to_owned())
        .spawn(move || listen(connector, node, notifier))
        .expect("spawning the listener thread");
}

/// Tasks this node claimed since its store opened, and the vacuums it ran: the store counts
/// claims, the vacuumer reads them.
#[derive(Default)]
pub(crate) struct Upkeep {
    pub(crate) claimed: AtomicU64,
    vacuums: AtomicU64,
}

/// Tasks a node claims before it vacuums `tasks` again.
pub(crate) const VACUUM_AFTER_CLAIMS: u64 = 5_000;
/// Every this many vacuums (the first included), the vacuumer also analyzes `tasks` and `jobs`.
const ANALYZE_EVERY_VACUUMS: u64 = 10;
/// How often the vacuumer looks at the claim count.
const VACUUM_CHECK: Duration = Duration::from_millis(200);
/// Any fixed number: with the schema's hash, the advisory lock one node vacuums under.
const VACUUM_LOCK: i32 = 0x5342_5643;

/// Vacuums `tasks` after every `every` tasks this node claimed, until the store is dropped.
///
/// A claimed task leaves the ready set, but its entry stays in the dispatch index
/// (`tasks_dispatch`) until the table is vacuumed. A claim reads that index from its head,
/// which is exactly where claimed tasks were (the oldest first), so every claim steps over all
/// the tasks claimed since the last vacuum: at 2,000 claims a second, autovacuum's pass a minute
/// lets a claim grow from 1 ms to several. Vacuuming after a few thousand claims keeps it flat.
/// `INDEX_CLEANUP ON` because the point is the index, which PostgreSQL would otherwise skip
/// when few heap pages have dead rows. One node vacuums at a time (an advisory lock per schema);
/// a node that finds the lock taken, or the table busy with autovacuum, counts its claims as
/// covered.
///
/// The first vacuum and every tenth also analyze `tasks` and `jobs`. Loading the tasks of many
/// jobs at once (`job_id IN (...)`) needs statistics: without them PostgreSQL guesses a
/// thousand tasks a job and scans the whole table, and autovacuum, which would gather them,
/// may be off or a minute away while a fresh database fills up.
pub(crate) fn vacuum(connector: Connector, upkeep: Weak<Upkeep>, every: u64) {
    let mut conn: Option<PgConn> = None;
    let mut covered = 0;
    loop {
        std::thread::sleep(VACUUM_CHECK);
        let Some(upkeep) = upkeep.upgrade() else {
            return;
        };
        let claimed = upkeep.claimed.load(Ordering::Relaxed);
        if claimed.saturating_sub(covered) < every {
            continue;
        }
        covered = claimed;
        if !conn.as_ref().is_some_and(PgConn::is_usable) {
            conn = match connector.connect() {
                Ok(conn) => Some(conn),
                Err(error) => {
                    tracing::warn!(%error, "the vacuumer cannot reach PostgreSQL; trying later");
                    continue;
                }
            };
        }
        let Some(conn) = conn.as_mut() else { continue };
        let analyze = upkeep.vacuums.load(Ordering::Relaxed) % ANALYZE_EVERY_VACUUMS == 0;
        match vacuum_tasks(conn, analyze) {
            Ok(true) => {
                upkeep.vacuums.fetch_add(1, Ordering::Relaxed);
            }
            Ok(false) => {}
            Err(Error::Contended(reason)) => {
                tracing::debug!(%reason, "tasks is being vacuumed already");
            }
            Err(error) => tracing::warn!(%error, "vacuuming tasks failed; trying again later"),
        }
    }
}

/// Runs one vacuum of `tasks` (with `analyze`, also refreshes the planner's statistics of
/// `tasks` and `jobs`) unless another node is running one; says whether it ran.
fn vacuum_tasks(conn: &mut PgConn, analyze: bool) -> Result<bool> {
    let locked: bool = conn
        .client
        .query_one(
            "SELECT pg_try_advisory_lock($1, hashtext(current_schema()))",
            &[&VACUUM_LOCK],
        )?
        .get(0);
    if !locked {
        return Ok(false);
    }
    // A large table takes longer than a request may; the lock timeout still applies, so a
    // running autovacuum makes this one give up rather than wait.
    // (Two queries: several statements in one run as a transaction, where VACUUM cannot.)
    let vacuumed = conn
        .client
        .batch_execute("SET statement_timeout = 0")
        .and_then(|()| conn.client.batch_execute("VACUUM (INDEX_CLEANUP ON) tasks"))
        .and_then(|()| {
            if analyze {
                conn.client.batch_execute("ANALYZE tasks, jobs")
            } else {
                Ok(())
            }
        });
    let unlocked = conn.client.execute(
        "SELECT pg_advisory_unlock($1, hashtext(current_schema()))",
        &[&VACUUM_LOCK],
    );
    vacuumed?;
    unlocked?;
    Ok(true)
}

/// Starts the vacuumer thread of a node.
pub(crate) fn start_vacuumer(connector: Connector, upkeep: &Arc<Upkeep>, every: u64) {
    let upkeep = Arc::downgrade(upkeep);
    std::thread::Builder::new()
        .name("starbridge-vacuum".to_owned())
        .spawn(move || vacuum(connector, upkeep, every))
        .expect("spawning the vacuumer thread");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_skip_duplicates_and_stay_under_the_payload_limit() {
        let wakes: Vec<(String, String)> = (0..400)
            .map(|i| {
                (
                    "default".to_owned(),
                    format!("a-queue-with-a-rather-long-name-{}", i % 200),
                )
            })
            .collect();
        let payloads = announcements("node-a", &wakes, true);
        assert!(payloads.len() > 1);
        assert!(
            payloads
                .iter()
                .all(|p| p.len() < 8000 && p.starts_with("n\tnode-a"))
        );
        let lines: usize = payloads.iter().map(|p| p.lines().count() - 1).sum();
        assert_eq!(lines, 201, "200 distinct queues and the deliveries line");
        assert!(announcements("node-a", &[], false).is_empty());
    }

    #[tokio::test]
    async fn another_nodes_announcement_wakes_its_queue_and_our_own_is_skipped() {
        let notifier = Notifier::default();
        let poll = notifier.register("default", &["q".to_owned()]);
        let payload = &announcements("node-b", &[("default".into(), "q".into())], false)[0];
        receive(&notifier, "node-a", payload);
        poll.notified().await;

        let poll = notifier.register("default", &["q".to_owned()]);
        receive(&notifier, "node-b", payload);
        let woken = tokio::time::timeout(Duration::from_millis(20), poll.notified()).await;
        assert!(
            woken.is_err(),
            "a node's own announcement is not applied twice"
        );
    }

    #[test]
    fn the_vacuumer_vacuums_and_analyzes_tasks_once_the_node_claimed_enough() {
        let Some(schema) = crate::scratch::ScratchSchema::create("vacuumer") else {
            return;
        };
        let options = StoreOptions::default();
        let connector = Connector::new(&schema.url, &options).unwrap();
        connector.migrate(0).unwrap();
        let upkeep = Arc::new(Upkeep::default());
        start_vacuumer(connector.clone(), &upkeep, 10);
        upkeep.claimed.fetch_add(10, Ordering::Relaxed);
        // A liveness bound, not a measurement: the vacuumer runs on its own thread, and
        // PostgreSQL publishes its statistics a moment after the vacuum.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut conn = connector.connect().unwrap();
        loop {
            let row = conn
                .client
                .query_one(
                    "SELECT vacuum_count, analyze_count FROM pg_stat_user_tables \
                     WHERE relid = 'tasks'::regclass",
                    &[],
                )
                .unwrap();
            let (vacuums, analyzes): (i64, i64) = (row.get(0), row.get(1));
            if upkeep.vacuums.load(Ordering::Relaxed) == 1 && vacuums >= 1 && analyzes >= 1 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no vacuum and analyze of this schema's tasks: {} by the vacuumer, {vacuums} \
                 vacuums and {analyzes} analyzes in PostgreSQL",
                upkeep.vacuums.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
