//! One small SQL interface over both backends, so the store's queries and commands are written
//! once and hold identical semantics on SQLite and PostgreSQL.
//!
//! SQL is written once, with `?N` placeholders. Each backend adapts it when it prepares a
//! statement (and caches the result): PostgreSQL turns `?N` into `$N` and drops SQLite's
//! `INDEXED BY` hints; SQLite drops PostgreSQL's row-lock clause (`FOR UPDATE [SKIP LOCKED]`,
//! always written at the end of a statement), which its single writer makes moot. Values cross the interface as a few plain types
//! ([`Arg`] in, [`Cell`] out), so schemas use only integers, reals and text on both sides.

use std::fmt;
use std::sync::Arc;

use crate::{Error, Result};

/// Which database a connection talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A statement parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a str),
}

/// Values that bind as statement parameters.
pub trait ToArg {
    fn to_arg(&self) -> Arg<'_>;
}

impl ToArg for str {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Text(self)
    }
}

impl ToArg for String {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Text(self)
    }
}

impl<T: ToArg + ?Sized> ToArg for &T {
    fn to_arg(&self) -> Arg<'_> {
        (**self).to_arg()
    }
}

impl<T: ToArg> ToArg for Option<T> {
    fn to_arg(&self) -> Arg<'_> {
        self.as_ref().map_or(Arg::Null, ToArg::to_arg)
    }
}

macro_rules! int_arg {
    ($($t:ty),*) => {$(
        impl ToArg for $t {
            fn to_arg(&self) -> Arg<'_> {
                Arg::Int(i64::from(*self))
            }
        }
    )*};
}
int_arg!(i64, i32, u32, u16, bool);

impl ToArg for u64 {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Int(i64::try_from(*self).unwrap_or(i64::MAX))
    }
}

impl ToArg for f64 {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Real(*self)
    }
}

/// An owned parameter, for statements assembled piece by piece (filters) or rows written
/// later (see `deferred`).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
}

impl ToArg for Value {
    fn to_arg(&self) -> Arg<'_> {
        match self {
            Value::Null => Arg::Null,
            Value::Int(value) => Arg::Int(*value),
            Value::Real(value) => Arg::Real(*value),
            Value::Text(value) => Arg::Text(value),
        }
    }
}

impl Value {
    /// The owned form of a parameter.
    pub fn of(arg: &Arg<'_>) -> Value {
        match *arg {
            Arg::Null => Value::Null,
            Arg::Int(value) => Value::Int(value),
            Arg::Real(value) => Value::Real(value),
            Arg::Text(value) => Value::Text(value.to_owned()),
        }
    }
}

impl From<i64> for Value {
    fn from(value: i64) -> Value {
        Value::Int(value)
    }
}

impl From<String> for Value {
    fn from(value: String) -> Value {
        Value::Text(value)
    }
}

/// Rows (or ids) per statement of a set-based statement, largest first: a set is handled in
/// chunks of these sizes, so that a handful of statement texts (each prepared once) serve every
/// size.
const CHUNKS: [usize; 7] = [64, 32, 16, 8, 4, 2, 1];

/// `items` in chunks of the sizes of `CHUNKS`, largest first.
pub fn chunks<T>(items: &[T]) -> impl Iterator<Item = &[T]> {
    let mut rest = items;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let size = CHUNKS
            .into_iter()
            .find(|size| *size <= rest.len())
            .unwrap_or(1);
        let (chunk, after) = rest.split_at(size);
        rest = after;
        Some(chunk)
    })
}

/// `?1, ?2, …, ?count`: the placeholders of an `IN` list.
pub fn placeholders(count: usize) -> String {
    (1..=count)
        .map(|n| format!("?{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The sets of `keys` to look up a column by, one statement each: the condition to put after
/// the column, and its parameters. On PostgreSQL one set of all the keys in one parameter (`=
/// ANY(string_to_array(?1, ','))`; keys are ids, which hold no comma), so that the statement's
/// text, and so its prepared plan, is the same whatever the number of keys; a list of `?`
/// would be planned anew for each run. On SQLite `IN (?1, ...)` over `chunks` of the keys.
pub fn key_sets(backend: Backend, keys: &[&str]) -> Vec<(String, Vec<Value>)> {
    match backend {
        Backend::Postgres => {
            debug_assert!(keys.iter().all(|key| !key.contains(',')));
            vec![(
                "= ANY(string_to_array(?1, ','))".to_owned(),
                vec![Value::Text(keys.join(","))],
            )]
        }
        Backend::Sqlite => chunks(keys)
            .map(|chunk| {
                (
                    format!("IN ({})", placeholders(chunk.len())),
                    chunk
                        .iter()
                        .map(|key| Value::Text((*key).to_owned()))
                        .collect(),
                )
            })
            .collect(),
    }
}

/// A PostgreSQL transaction id as rows carry it (`xmin`: the low 32 bits of
/// `pg_current_xact_id()`).
pub type TransactionId = u32;

/// Binds owned parameters.
pub fn bind(values: &[Value]) -> Vec<Arg<'_>> {
    values.iter().map(ToArg::to_arg).collect()
}

/// Statement parameters: `args![a, b, c]` is a `&[Arg]`.
#[macro_export]
macro_rules! args {
    ($($value:expr),* $(,)?) => {
        &[$($crate::db::ToArg::to_arg(&$value)),*][..]
    };
}

pub use args;

/// A column value as read.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Cell {
    #[default]
    Null,
    Int(i64),
    Real(f64),
    Text(String),
}

impl Cell {
    fn kind(&self) -> &'static str {
        match self {
            Cell::Null => "null",
            Cell::Int(value) if *value < 0 => "a negative integer",
            Cell::Int(_) => "an integer",
            Cell::Real(_) => "a real",
            Cell::Text(_) => "text",
        }
    }
}

/// One result row; `get` takes a column's value out, converted to the type asked for.
#[derive(Debug)]
pub struct Row {
    cells: Vec<Cell>,
}

impl Row {
    pub fn new(cells: Vec<Cell>) -> Row {
        Row { cells }
    }

    pub fn get<T: FromCell>(&mut self, index: usize) -> Result<T> {
        let cell = self
            .cells
            .get_mut(index)
            .map(std::mem::take)
            .unwrap_or_default();
        let held = cell.kind();
        T::from_cell(cell).ok_or_else(|| {
            Error::Corrupt(format!(
                "column {index} holds {held}, not {}",
                std::any::type_name::<T>()
            ))
        })
    }
}

/// Types a column converts to.
pub trait FromCell: Sized {
    fn from_cell(cell: Cell) -> Option<Self>;
}

impl FromCell for i64 {
    fn from_cell(cell: Cell) -> Option<i64> {
        match cell {
            Cell::Int(value) => Some(value),
            _ => None,
        }
    }
}

macro_rules! narrow_int_cell {
    ($($t:ty),*) => {$(
        impl FromCell for $t {
            fn from_cell(cell: Cell) -> Option<$t> {
                i64::from_cell(cell).and_then(|value| <$t>::try_from(value).ok())
            }
        }
    )*};
}
narrow_int_cell!(i32, u32, u16, u64);

impl FromCell for bool {
    fn from_cell(cell: Cell) -> Option<bool> {
        i64::from_cell(cell).map(|value| value != 0)
    }
}

impl FromCell for f64 {
    fn from_cell(cell: Cell) -> Option<f64> {
        match cell {
            Cell::Real(value) => Some(value),
            #[allow(clippy::cast_precision_loss)]
            Cell::Int(value) => Some(value as f64),
            _ => None,
        }
    }
}

impl FromCell for String {
    fn from_cell(cell: Cell) -> Option<String> {
        match cell {
            Cell::Text(value) => Some(value),
            _ => None,
        }
    }
}

impl<T: FromCell> FromCell for Option<T> {
    fn from_cell(cell: Cell) -> Option<Option<T>> {
        match cell {
            Cell::Null => Some(None),
            cell => T::from_cell(cell).map(Some),
        }
    }
}

/// Makes the commits a connection returned from durable (see `Conn::log_sync`). Each call covers
/// every commit that returned before it began; calls may run on any thread, while the
/// connection goes on.
pub trait LogSync: Send + Sync {
    fn sync(&self) -> Result<()>;
}

/// A database connection as the store uses it.
pub trait Conn: Send {
    fn backend(&self) -> Backend;

    /// Runs one statement; returns how many rows it changed.
    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64>;

    /// Runs one query and returns all its rows.
    fn query(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>>;

    /// Runs statements without parameters (transaction control, schema).
    fn batch(&mut self, sql: &str) -> Result<()>;

    /// Holds a lock on `key` until the transaction ends, so that transactions of other server
    /// nodes that count and then take a limited resource (a serial queue, a lock's slots) run
    /// one after the other. A no-op where one writer serializes every transaction anyway.
    fn lock_key(&mut self, key: &str) -> Result<()>;

    /// Begins a write transaction. SQLite's takes the write lock at once (`BEGIN IMMEDIATE`);
    /// on PostgreSQL the last `commit` began the next transaction in its own round trip, and
    /// this costs none then.
    fn begin_write(&mut self) -> Result<()>;

    /// Commits the open transaction, telling the other server nodes as it commits which queues
    /// got work and what else changed (each of `announcements` is one notification's lines;
    /// none are sent where there is only one node).
    fn commit(&mut self, announcements: &[String]) -> Result<()>;

    /// Commits as `commit` does, and tells the id of the transaction that committed as its
    /// rows carry it, where the backend stamps rows with one (PostgreSQL's `xmin`, read in the
    /// `COMMIT`'s round trip; see `rows::JobRowVersions`). `None` (the default): the backend's
    /// rows carry none.
    fn commit_identified(&mut self, announcements: &[String]) -> Result<Option<TransactionId>> {
        self.commit(announcements).map(|()| None)
    }

    /// False once the connection is known to be broken; it is then replaced, not reused.
    fn is_usable(&self) -> bool;

    /// Where this connection's commits return before they are durable: what makes them so
    /// afterwards, which a caller must run before it acknowledges a commit. `None` (the
    /// default): a commit that returned is durable, or is not meant to be
    /// (`Durability::Relaxed`).
    fn log_sync(&self) -> Option<Arc<dyn LogSync>> {
        None
    }

    /// Runs one statement as `execute` does, its parameters `args` in order (`?1`, `?2`, …):
    /// the writer's sets of held rows (see `deferred`), thousands of values a statement. SQLite
    /// binds them where they are, without a copy each; elsewhere they are collected for
    /// `execute`.
    fn execute_set<'a>(
        &mut self,
        sql: &str,
        args: &mut dyn Iterator<Item = Arg<'a>>,
    ) -> Result<u64> {
        let args: Vec<Arg<'a>> = args.collect();
        self.execute(sql, &args)
    }

    /// Runs one statement whose parameters are whole columns, each bound as one array of its
    /// values (`?1::bigint[]`): many rows in one statement whatever their number. PostgreSQL's
    /// only; SQLite has no arrays, and its set writes bind rows (see `deferred`).
    fn execute_columns(&mut self, sql: &str, columns: &[Vec<Arg<'_>>]) -> Result<u64> {
        let _ = (sql, columns);
        Err(Error::Database(DatabaseError {
            message: "columns bind as arrays only on PostgreSQL".to_owned(),
            code: None,
        }))
    }
}

/// Reading helpers over any connection (the writer's holds row writes back, see `deferred`).
pub trait Queries: Conn {
    fn query_map<T>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        mut map: impl FnMut(&mut Row) -> Result<T>,
    ) -> Result<Vec<T>> {
        self.query(sql, args)?.iter_mut().map(&mut map).collect()
    }

    fn query_opt<T>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        map: impl FnOnce(&mut Row) -> Result<T>,
    ) -> Result<Option<T>> {
        self.query(sql, args)?.first_mut().map(map).transpose()
    }

    /// The first column of the only row (an aggregate, a count).
    fn query_value<T: FromCell>(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<T> {
        let mut rows = self.query(sql, args)?;
        let row = rows
            .first_mut()
            .ok_or_else(|| Error::Corrupt(format!("no row from: {sql}")))?;
        row.get(0)
    }
}

impl<C: Conn + ?Sized> Queries for C {}

/// Applies, in one transaction opened with `begin`, the migrations not recorded yet, in the
/// order given; returns how many. Both backends' DDL is transactional, so a failed migration leaves
/// the schema as it was.
pub fn migrate(
    conn: &mut dyn Conn,
    begin: &str,
    migrations: &[(i64, &str)],
    now_millis: i64,
) -> Result<usize> {
    conn.batch(begin)?;
    let applied = (|| {
        conn.batch(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)",
        )?;
        // Every version not applied yet runs, in order, even one below the highest applied: a
        // migration numbered into a gap by a change merged later is not skipped.
        let done: std::collections::HashSet<i64> = conn
            .query_map("SELECT version FROM schema_migrations", &[], |row| {
                row.get(0)
            })?
            .into_iter()
            .collect();
        let mut applied = 0;
        for (version, sql) in migrations
            .iter()
            .filter(|(version, _)| !done.contains(version))
        {
            conn.batch(sql)?;
            conn.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
                args![version, now_millis],
            )?;
            applied += 1;
        }
        Ok(applied)
    })();
    match applied {
        Ok(applied) => {
            conn.batch("COMMIT")?;
            Ok(applied)
        }
        Err(error) => {
            let _ = conn.batch("ROLLBACK");
            Err(error)
        }
    }
}

/// A database failure, with the SQLSTATE code where the database gives one.
#[derive(Debug)]
pub struct DatabaseError {
    pub message: String,
    pub code: Option<String>,
}

impl fmt::Display for DatabaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.code {
            Some(code) => write!(f, "{} (SQLSTATE {code})", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for DatabaseError {}

/// SQL for PostgreSQL: `?N` placeholders become `$N`, `INDEXED BY name` hints go.
pub fn postgres_sql(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(at) = rest.find(['?', 'I']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(digits) = tail.strip_prefix('?') {
            out.push('$');
            rest = digits;
        } else if let Some(hint) = tail.strip_prefix("INDEXED BY ") {
            let name_end = hint
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(hint.len());
            rest = hint[name_end..].trim_start_matches(' ');
        } else {
            out.push('I');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// SQL for SQLite: PostgreSQL's row-lock clause, which ends a statement, goes. A slice of the
/// text, so the claims and job loads that carry one allocate nothing for it.
pub fn sqlite_sql(sql: &str) -> &str {
    sql.strip_suffix(" FOR UPDATE SKIP LOCKED")
        .or_else(|| sql.strip_suffix(" FOR UPDATE"))
        .unwrap_or(sql)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_sql_numbers_placeholders_and_drops_index_hints() {
        assert_eq!(
            postgres_sql(
                "SELECT id FROM tasks INDEXED BY tasks_age WHERE a = ?1 AND b IN (?2, ?10) LIMIT ?3"
            ),
            "SELECT id FROM tasks WHERE a = $1 AND b IN ($2, $10) LIMIT $3"
        );
        assert_eq!(
            postgres_sql("INSERT INTO t (ID, Item) VALUES (?1, ?2)"),
            "INSERT INTO t (ID, Item) VALUES ($1, $2)"
        );
    }

    #[test]
    fn sets_go_in_chunks_of_few_sizes_largest_first() {
        let items: Vec<u32> = (0..200).collect();
        let sizes: Vec<usize> = chunks(&items).map(<[u32]>::len).collect();
        assert_eq!(sizes, [64, 64, 64, 8]);
        assert_eq!(chunks::<u32>(&[]).count(), 0);
        assert_eq!(placeholders(3), "?1, ?2, ?3");
    }

    #[test]
    fn key_sets_are_one_array_parameter_on_postgres_and_chunks_of_placeholders_on_sqlite() {
        let keys: Vec<String> = (0..70).map(|n| format!("job_{n}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let postgres = key_sets(Backend::Postgres, &keys);
        assert_eq!(postgres.len(), 1);
        assert_eq!(postgres[0].0, "= ANY(string_to_array(?1, ','))");
        let Value::Text(joined) = &postgres[0].1[0] else {
            panic!("one text parameter: {:?}", postgres[0].1);
        };
        assert_eq!(joined.split(',').collect::<Vec<_>>(), keys);
        let sqlite = key_sets(Backend::Sqlite, &keys);
        let sizes: Vec<usize> = sqlite.iter().map(|(_, values)| values.len()).collect();
        assert_eq!(sizes, [64, 4, 2]);
        assert_eq!(sqlite[2].0, "IN (?1, ?2)");
        assert!(key_sets(Backend::Sqlite, &[]).is_empty());
    }

    #[test]
    fn sqlite_sql_drops_row_locks() {
        assert_eq!(
            sqlite_sql("SELECT id FROM jobs WHERE id = ?1 FOR UPDATE SKIP LOCKED"),
            "SELECT id FROM jobs WHERE id = ?1"
        );
        assert_eq!(
            sqlite_sql("SELECT id FROM jobs WHERE id = ?1 FOR UPDATE"),
            "SELECT id FROM jobs WHERE id = ?1"
        );
    }

    #[test]
    fn cells_convert_to_the_type_asked_for_or_say_what_they_hold() {
        let mut row = Row::new(vec![
            Cell::Int(7),
            Cell::Null,
            Cell::Text("x".into()),
            Cell::Int(-1),
        ]);
        assert_eq!(row.get::<u32>(0).unwrap(), 7);
        assert_eq!(row.get::<Option<String>>(1).unwrap(), None);
        assert_eq!(row.get::<String>(2).unwrap(), "x");
        let error = row.get::<u32>(3).unwrap_err().to_string();
        assert!(error.contains("a negative integer"), "{error}");
    }
}
