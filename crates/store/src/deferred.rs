//! Row writes that a write transaction holds back, so that a group of requests writes its jobs,
//! tasks and history in a few set-based statements (up to 64 rows each, see `db::chunks`)
//! instead of a statement
//! per row: the engine rewrites a job's row and a task's row several times in its life and
//! appends an event for every change, and each statement costs a round trip on PostgreSQL and a
//! pass through SQLite's virtual machine.
//!
//! The writer's connection (`WriteConn`) holds the rows back and writes them before anything
//! could notice they are missing:
//!
//! - before any statement that names a table they belong to or depend on (`jobs`, `tasks`,
//!   `job_labels`, `events`, and `lock_holders` and `signals`, which reference jobs), so that
//!   every query of the transaction reads its own writes, and foreign keys find their parents;
//! - before any transaction control a command runs itself (a savepoint and its rollback then
//!   cover exactly what they would cover without deferral);
//! - before the writer commits.
//!
//! Events are never read inside a transaction, so they wait for the commit (or a statement that
//! names them); jobs, tasks and the labels of new jobs go out together, jobs first (the others
//! reference them). A row rewritten several times before it is written goes out once, as last
//! written; label rows are written once, when their job is created.
//!
//! On SQLite, a job row rewritten with the same status and deadline as this connection last
//! wrote it (a job in the middle of its steps) does not set those columns: setting a column
//! that an index uses rewrites the row's entry in that index even when the value stays, which
//! is two index pages more in the log at every commit. The connection remembers what it wrote
//! until anything is rolled back (then it forgets everything); on SQLite it is the only one
//! that writes jobs. PostgreSQL compares the values itself.
//!
//! A request that is refused before anything of it was written leaves nothing behind: the
//! writer drops what it held back since the request began (`discard_since`). `writes` counts
//! rows that reached the database, which is how the writer knows when a refused request wrote
//! something that only a rollback can undo.

use foldhash::HashMap;
use std::sync::LazyLock;

use starbridge_core::ids::JobId;
use starbridge_core::model::{Event, Job, Task};

use crate::db::{Arg, Backend, Conn, Queries, Row, ToArg, TransactionId, Value, chunks};
use crate::rows::{
    self, EVENT_WRITE, JOB_INDEXED_UPDATES, JOB_LABEL_WRITE, JOB_WRITE, RowWrite, TASK_WRITE,
};
use crate::{Error, Result};

/// Where the rows held back stood when a request began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    jobs: usize,
    tasks: usize,
    labels: usize,
    events: usize,
}

/// What a statement needs written before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    Nothing,
    JobsAndTasks,
    Everything,
}

impl Needs {
    fn of(sql: &str) -> Needs {
        if names_table(sql, "events") {
            Needs::Everything
        } else if sql.contains("jobs")
            || sql.contains("tasks")
            || sql.contains("job_labels")
            || sql.contains("lock_holders")
            || sql.contains("signals")
        {
            Needs::JobsAndTasks
        } else {
            Needs::Nothing
        }
    }
}

/// Whether `sql` reads or writes the table `table` or one of its partitions (`table_…`): the
/// word after `FROM`, `JOIN`, `INTO`, `UPDATE` or `TABLE`, not merely a column of that name
/// (webhook subscriptions have `events`).
fn names_table(sql: &str, table: &str) -> bool {
    const BEFORE_TABLE: [&str; 5] = ["FROM", "JOIN", "INTO", "UPDATE", "TABLE"];
    // Most statements never spell the name: a substring search settles them before the
    // word-by-word walk (which every statement through the writer took).
    if !sql.contains(table) {
        return false;
    }
    let mut previous = "";
    for word in sql
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| !word.is_empty())
    {
        let names = word
            .strip_prefix(table)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('_'));
        if names
            && BEFORE_TABLE
                .iter()
                .any(|k| previous.eq_ignore_ascii_case(k))
        {
            return true;
        }
        previous = word;
    }
    false
}

/// The writer's connection: the database connection and the rows its transaction holds back.
pub struct WriteConn {
    out: RowWriter,
    jobs: HeldRows,
    tasks: HeldRows,
    labels: HeldRows,
    events: HeldRows,
    /// SQLite: the values of `JOB_INDEXED_UPDATES` of the job rows this connection wrote, as
    /// the database holds them now, by job id.
    jobs_indexed: HashMap<String, Vec<Value>>,
}

/// The database connection and what writing held rows to it needs.
struct RowWriter {
    conn: Box<dyn Conn>,
    /// Statement texts by table, rows per statement (0: PostgreSQL's, for any number) and the
    /// columns an existing row keeps.
    texts: HashMap<StatementKey, String>,
    writes: u64,
}

/// A set statement's table, rows and the upsert columns it leaves alone.
type StatementKey = (&'static str, usize, &'static [&'static str]);

/// Most job rows whose indexed values the connection remembers; past it, it forgets them all
/// (their next writes set every column).
const REMEMBERED_JOBS: usize = 65_536;

impl WriteConn {
    pub fn new(conn: Box<dyn Conn>) -> WriteConn {
        WriteConn {
            out: RowWriter {
                conn,
                texts: HashMap::default(),
                writes: 0,
            },
            jobs: HeldRows::new(&JOB_WRITE),
            tasks: HeldRows::new(&TASK_WRITE),
            labels: HeldRows::new(&JOB_LABEL_WRITE),
            events: HeldRows::new(&EVENT_WRITE),
            jobs_indexed: HashMap::default(),
        }
    }

    /// Holds back a job's row as it is now.
    pub fn defer_job(&mut self, job: &Job) {
        rows::job_values(job, |values| self.jobs.push(values));
    }

    /// Holds back a task's row as it is now.
    pub fn defer_task(&mut self, namespace: &str, task: &Task) {
        rows::task_values(namespace, task, |values| self.tasks.push(values));
    }

    /// Holds back the label rows of a job just created (none when it has no labels).
    pub fn defer_labels(&mut self, job: &Job) {
        rows::label_values(job, |values| self.labels.push(values));
    }

    /// Holds back a history event of a job (`step`: the step of its task, if any).
    pub fn defer_event(&mut self, job: &JobId, step: Option<&str>, event: &Event) {
        rows::event_values(job, step, event, |values| self.events.push(values));
    }

    pub fn mark(&self) -> Mark {
        Mark {
            jobs: self.jobs.len(),
            tasks: self.tasks.len(),
            labels: self.labels.len(),
            events: self.events.len(),
        }
    }

    /// Drops the rows held back since `mark` (none of them was written: nothing was written
    /// since, or `writes` would have moved).
    pub fn discard_since(&mut self, mark: Mark) {
        // Whatever it wrote is rolled back too.
        self.jobs_indexed.clear();
        self.jobs.truncate(mark.jobs);
        self.tasks.truncate(mark.tasks);
        self.labels.truncate(mark.labels);
        self.events.truncate(mark.events);
    }

    /// Drops every row held back (the transaction was rolled back).
    pub fn discard(&mut self) {
        self.discard_since(Mark {
            jobs: 0,
            tasks: 0,
            labels: 0,
            events: 0,
        });
    }

    /// Rows written to the database through this connection so far.
    pub fn writes(&self) -> u64 {
        self.out.writes
    }

    /// Writes every row held back.
    pub fn flush(&mut self) -> Result<()> {
        self.write(Needs::Everything)
    }

    /// The database connection itself, for the writer's own transaction control.
    pub fn raw(&mut self) -> &mut dyn Conn {
        &mut *self.out.conn
    }

    /// Writes what `needs` asks for of the rows held back; those it tried to write are no
    /// longer held back, written or not (a failed write fails the transaction).
    fn write(&mut self, needs: Needs) -> Result<()> {
        if needs == Needs::Nothing {
            return Ok(());
        }
        let written = self.write_jobs_and_tasks();
        self.jobs.clear();
        self.tasks.clear();
        self.labels.clear();
        written?;
        if needs == Needs::Everything {
            let written = self
                .out
                .insert(&EVENT_WRITE, &self.events, &self.events.all(), &[]);
            self.events.clear();
            written?;
        }
        Ok(())
    }

    fn write_jobs_and_tasks(&mut self) -> Result<()> {
        self.write_jobs()?;
        let tasks = self.tasks.latest();
        self.out.insert(&TASK_WRITE, &self.tasks, &tasks, &[])?;
        self.out
            .insert(&JOB_LABEL_WRITE, &self.labels, &self.labels.all(), &[])
    }

    /// Writes the job rows held back; on SQLite, those whose indexed values stay as written
    /// last without setting them.
    fn write_jobs(&mut self) -> Result<()> {
        let jobs = self.jobs.latest();
        if self.out.conn.backend() == Backend::Postgres {
            return self.out.insert(&JOB_WRITE, &self.jobs, &jobs, &[]);
        }
        let (mut steady, mut changed, mut remembered) = (Vec::new(), Vec::new(), Vec::new());
        for row in jobs {
            let id = self.jobs.key(row);
            let indexed = INDEXED_COLUMNS.iter().map(|&at| self.jobs.arg(row, at));
            let same = self.jobs_indexed.get(id).is_some_and(|values| {
                values.len() == INDEXED_COLUMNS.len()
                    && values
                        .iter()
                        .zip(indexed.clone())
                        .all(|(v, a)| v.to_arg() == a)
            });
            if same {
                steady.push(row);
            } else {
                changed.push(row);
                remembered.push((id.to_owned(), indexed.map(|a| Value::of(&a)).collect()));
            }
        }
        if self.jobs_indexed.len() + remembered.len() > REMEMBERED_JOBS {
            self.jobs_indexed.clear();
        }
        let written = self
            .out
            .insert(&JOB_WRITE, &self.jobs, &changed, &[])
            .and_then(|()| {
                self.out
                    .insert(&JOB_WRITE, &self.jobs, &steady, JOB_INDEXED_UPDATES)
            });
        if written.is_err() {
            // Some rows may have been written: what the database holds is not known.
            self.jobs_indexed.clear();
            return written;
        }
        self.jobs_indexed.extend(remembered);
        Ok(())
    }
}

impl RowWriter {
    /// Inserts (or upserts) the rows `picked` of `held`, in that order: on PostgreSQL in one
    /// statement, on SQLite in as few as the chunk sizes allow.
    fn insert(
        &mut self,
        table: &'static RowWrite,
        held: &HeldRows,
        picked: &[usize],
        unchanged: &'static [&'static str],
    ) -> Result<()> {
        if picked.is_empty() {
            return Ok(());
        }
        if self.conn.backend() == Backend::Postgres {
            let key = (table.table, 0, unchanged);
            if !self.texts.contains_key(&key) {
                let types = column_types(&mut *self.conn, table)?;
                self.texts.insert(key, table.postgres_set_sql(&types));
            }
            let sql = &self.texts[&key];
            let columns: Vec<Vec<Arg<'_>>> = (0..table.columns.len())
                .map(|column| picked.iter().map(|&row| held.arg(row, column)).collect())
                .collect();
            self.conn.execute_columns(sql, &columns)?;
            self.writes += picked.len() as u64;
            return Ok(());
        }
        for chunk in chunks(picked) {
            let sql = self
                .texts
                .entry((table.table, chunk.len(), unchanged))
                .or_insert_with(|| table.sql(chunk.len(), unchanged));
            self.conn.execute_set(sql, &mut held.rows(chunk))?;
            self.writes += chunk.len() as u64;
        }
        Ok(())
    }
}

/// The rows of one table held back: their values in one list and their text in one buffer,
/// both kept with their capacity from one transaction to the next, so that holding a row back
/// copies its text once and allocates nothing once the buffers have grown. A row's key (which
/// rows are versions of one row) is its first column.
struct HeldRows {
    width: usize,
    cells: Vec<HeldCell>,
    text: String,
    /// Where each row's text starts in `text`.
    text_starts: Vec<usize>,
}

/// The values of some held rows, row after row: a set of 64 task rows binds 2,688, and a
/// `flat_map` over each row's cells took a third more instructions per value.
struct HeldValues<'a> {
    held: &'a HeldRows,
    rows: std::slice::Iter<'a, usize>,
    /// What is left of the current row.
    cells: std::slice::Iter<'a, HeldCell>,
}

impl<'a> Iterator for HeldValues<'a> {
    type Item = Arg<'a>;

    fn next(&mut self) -> Option<Arg<'a>> {
        loop {
            if let Some(&cell) = self.cells.next() {
                return Some(self.held.value(cell));
            }
            let start = self.rows.next()? * self.held.width;
            self.cells = self.held.cells[start..start + self.held.width].iter();
        }
    }
}

/// Most text and values a table's held rows keep room for between transactions (a group of
/// one-step jobs holds a few hundred bytes a row; a group of batch submits can hold megabytes).
const RETAINED_TEXT: usize = 1 << 20;
const RETAINED_CELLS: usize = 1 << 16;

/// A value held back; text as its range in the rows' text.
#[derive(Debug, Clone, Copy)]
enum HeldCell {
    Null,
    Int(i64),
    Real(f64),
    Text(usize, usize),
}

impl HeldRows {
    fn new(table: &RowWrite) -> HeldRows {
        HeldRows {
            width: table.columns.len(),
            cells: Vec::new(),
            text: String::new(),
            text_starts: Vec::new(),
        }
    }

    fn len(&self) -> usize {
        self.text_starts.len()
    }

    /// Holds back a row of values, one per column.
    fn push(&mut self, values: &[Arg<'_>]) {
        assert_eq!(
            values.len(),
            self.width,
            "a held row has a value per column"
        );
        self.text_starts.push(self.text.len());
        for value in values {
            let cell = match *value {
                Arg::Null => HeldCell::Null,
                Arg::Int(value) => HeldCell::Int(value),
                Arg::Real(value) => HeldCell::Real(value),
                Arg::Text(value) => {
                    let start = self.text.len();
                    self.text.push_str(value);
                    HeldCell::Text(start, self.text.len())
                }
            };
            self.cells.push(cell);
        }
    }

    fn arg(&self, row: usize, column: usize) -> Arg<'_> {
        self.value(self.cells[row * self.width + column])
    }

    fn value(&self, cell: HeldCell) -> Arg<'_> {
        match cell {
            HeldCell::Null => Arg::Null,
            HeldCell::Int(value) => Arg::Int(value),
            HeldCell::Real(value) => Arg::Real(value),
            HeldCell::Text(start, end) => Arg::Text(&self.text[start..end]),
        }
    }

    /// The values of `rows`, row after row.
    fn rows<'a>(&'a self, rows: &'a [usize]) -> HeldValues<'a> {
        HeldValues {
            held: self,
            rows: rows.iter(),
            cells: [].iter(),
        }
    }

    /// The row's key: its first column's text.
    fn key(&self, row: usize) -> &str {
        match self.arg(row, 0) {
            Arg::Text(key) => key,
            _ => "",
        }
    }

    /// Keeps the first `rows` rows.
    fn truncate(&mut self, rows: usize) {
        if let Some(&end) = self.text_starts.get(rows) {
            self.text.truncate(end);
            self.text_starts.truncate(rows);
            self.cells.truncate(rows * self.width);
        }
    }

    /// Drops every row; buffers a large group made grow past what groups usually need are
    /// given back.
    fn clear(&mut self) {
        self.truncate(0);
        self.text.shrink_to(RETAINED_TEXT);
        self.cells.shrink_to(RETAINED_CELLS);
        self.text_starts
            .shrink_to(RETAINED_CELLS / self.width.max(1));
    }

    /// Every row, in the order held back.
    fn all(&self) -> Vec<usize> {
        (0..self.len()).collect()
    }

    /// The last version of each row, in the order of their last versions.
    fn latest(&self) -> Vec<usize> {
        let mut seen = foldhash::HashSet::with_capacity_and_hasher(self.len(), Default::default());
        let mut kept: Vec<usize> = (0..self.len())
            .rev()
            .filter(|&row| seen.insert(self.key(row)))
            .collect();
        kept.reverse();
        kept
    }
}

/// The type of each column of `table`, as PostgreSQL's catalog names it (`text`, `bigint`).
fn column_types(conn: &mut dyn Conn, table: &RowWrite) -> Result<Vec<String>> {
    let found: HashMap<String, String> = conn
        .query_map(
            "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = to_regclass(?1) AND attnum > 0 AND NOT attisdropped",
            crate::args![table.table],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?
        .into_iter()
        .collect();
    table
        .columns
        .iter()
        .map(|column| {
            found.get(*column).cloned().ok_or_else(|| {
                Error::Corrupt(format!("the table {} has no column {column}", table.table))
            })
        })
        .collect()
}

/// Where the columns of `JOB_INDEXED_UPDATES` are in a row of `JOB_WRITE`.
static INDEXED_COLUMNS: LazyLock<Vec<usize>> = LazyLock::new(|| {
    JOB_INDEXED_UPDATES
        .iter()
        .filter_map(|name| JOB_WRITE.columns.iter().position(|column| column == name))
        .collect()
});

impl Conn for WriteConn {
    fn backend(&self) -> Backend {
        self.out.conn.backend()
    }

    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        self.write(Needs::of(sql))?;
        let changed = self.out.conn.execute(sql, args)?;
        self.out.writes += changed;
        Ok(changed)
    }

    fn query(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        self.write(Needs::of(sql))?;
        self.out.conn.query(sql, args)
    }

    fn batch(&mut self, sql: &str) -> Result<()> {
        // Transaction control inside a command: a savepoint must cover exactly what it would
        // without deferral, so everything held back goes out first.
        self.write(Needs::Everything)?;
        if sql
            .as_bytes()
            .windows(b"ROLLBACK".len())
            .any(|word| word.eq_ignore_ascii_case(b"ROLLBACK"))
        {
            self.jobs_indexed.clear();
        }
        self.out.writes += 1;
        self.out.conn.batch(sql)
    }

    fn lock_key(&mut self, key: &str) -> Result<()> {
        self.out.conn.lock_key(key)
    }

    fn begin_write(&mut self) -> Result<()> {
        self.write(Needs::Everything)?;
        self.out.conn.begin_write()
    }

    fn commit(&mut self, announcements: &[String]) -> Result<()> {
        self.write(Needs::Everything)?;
        self.out.conn.commit(announcements)
    }

    fn commit_identified(&mut self, announcements: &[String]) -> Result<Option<TransactionId>> {
        self.write(Needs::Everything)?;
        self.out.conn.commit_identified(announcements)
    }

    fn is_usable(&self) -> bool {
        self.out.conn.is_usable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_say_what_they_need_written_first() {
        let cases = [
            (
                "SELECT job_id FROM tasks WHERE id = ?1",
                Needs::JobsAndTasks,
            ),
            (
                "INSERT INTO lock_holders (job_id) VALUES (?1)",
                Needs::JobsAndTasks,
            ),
            (
                "DELETE FROM job_labels WHERE job_id = ?1",
                Needs::JobsAndTasks,
            ),
            ("DELETE FROM events WHERE job_id = ?1", Needs::Everything),
            (
                "DELETE FROM events_default WHERE job_id = ?1",
                Needs::Everything,
            ),
            (
                "SELECT mode FROM queues WHERE namespace = ?1",
                Needs::Nothing,
            ),
            // A column named events is not the table.
            (
                "SELECT id, events, steps FROM webhooks WHERE namespace = $1",
                Needs::Nothing,
            ),
            (
                "SELECT kind FROM (SELECT kind FROM events e WHERE job_id = ?1)",
                Needs::Everything,
            ),
            (
                "INSERT INTO events (job_id) SELECT job_id FROM x",
                Needs::Everything,
            ),
        ];
        for (sql, needs) in cases {
            assert_eq!(Needs::of(sql), needs, "{sql}");
        }
    }

    #[test]
    fn only_the_last_version_of_a_row_is_written_in_the_order_of_last_versions() {
        let mut held = HeldRows::new(&JOB_LABEL_WRITE);
        for (key, value) in [("a", "1"), ("b", "1"), ("a", "2"), ("c", "1")] {
            held.push(&[Arg::Text(key), Arg::Null, Arg::Int(7), Arg::Text(value)]);
        }
        let kept: Vec<(&str, Arg<'_>)> = held
            .latest()
            .into_iter()
            .map(|row| (held.key(row), held.arg(row, 3)))
            .collect();
        assert_eq!(
            kept,
            [
                ("b", Arg::Text("1")),
                ("a", Arg::Text("2")),
                ("c", Arg::Text("1"))
            ]
        );
    }

    #[test]
    fn the_values_of_picked_rows_come_row_after_row_in_the_order_picked() {
        let mut held = HeldRows::new(&JOB_LABEL_WRITE);
        held.push(&[Arg::Text("a"), Arg::Null, Arg::Int(1), Arg::Text("x")]);
        held.push(&[Arg::Text("b"), Arg::Text("ns"), Arg::Real(0.5), Arg::Null]);
        held.push(&[Arg::Text("c"), Arg::Null, Arg::Null, Arg::Text("z")]);
        let values: Vec<Arg<'_>> = held.rows(&[2, 0]).collect();
        assert_eq!(
            values,
            [
                Arg::Text("c"),
                Arg::Null,
                Arg::Null,
                Arg::Text("z"),
                Arg::Text("a"),
                Arg::Null,
                Arg::Int(1),
                Arg::Text("x"),
            ]
        );
        assert_eq!(held.rows(&[]).count(), 0);
    }

    #[test]
    fn rows_dropped_since_a_mark_leave_the_rows_before_it_as_they_were() {
        let mut held = HeldRows::new(&JOB_LABEL_WRITE);
        held.push(&[
            Arg::Text("job"),
            Arg::Text("ns"),
            Arg::Int(1),
            Arg::Real(0.5),
        ]);
        held.push(&[
            Arg::Text("later"),
            Arg::Text("ns2"),
            Arg::Null,
            Arg::Text("x"),
        ]);
        held.truncate(1);
        assert_eq!(held.len(), 1);
        let row: Vec<Arg<'_>> = held.rows(&[0]).collect();
        assert_eq!(
            row,
            [
                Arg::Text("job"),
                Arg::Text("ns"),
                Arg::Int(1),
                Arg::Real(0.5)
            ]
        );
        held.push(&[Arg::Text("next"), Arg::Text("n"), Arg::Null, Arg::Null]);
        assert_eq!(held.key(1), "next");
        assert_eq!(held.text, "jobnsnextn");
        held.clear();
        assert_eq!((held.len(), held.text.as_str()), (0, ""));
    }

    #[test]
    fn set_statements_number_their_placeholders_row_after_row_or_take_each_column_as_an_array() {
        let sql = EVENT_WRITE.sql(2, &[]);
        assert!(
            sql.starts_with("INSERT OR FAIL INTO events (job_id, task_id"),
            "{sql}"
        );
        assert!(
            sql.ends_with("(?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"),
            "{sql}"
        );
        let two = RowWrite {
            table: "t",
            columns: &["name", "n"],
            upsert: Some(("name", &["n"])),
        };
        let set = two.postgres_set_sql(&["text".to_owned(), "bigint".to_owned()]);
        assert_eq!(
            set,
            "INSERT INTO t (name, n) SELECT name, n FROM UNNEST(?1::text[], ?2::bigint[]) \
             WITH ORDINALITY AS r (name, n, ordinality) ORDER BY r.ordinality \
             ON CONFLICT (name) DO UPDATE SET n = excluded.n"
        );
        let upsert = JOB_WRITE.sql(1, &[]);
        assert!(
            upsert.contains("ON CONFLICT (id) DO UPDATE SET status = excluded.status"),
            "{upsert}"
        );
        let steady = JOB_WRITE.sql(1, JOB_INDEXED_UPDATES);
        assert!(
            steady.contains("ON CONFLICT (id) DO UPDATE SET started_at = excluded.started_at")
                && !steady.contains("deadline_at = "),
            "{steady}"
        );
    }
}
