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

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{Event, Job, Task};

use crate::db::{Arg, Backend, Conn, Queries, Row, ToArg, Value, chunks};
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
    conn: Box<dyn Conn>,
    jobs: Vec<(JobId, Vec<Value>)>,
    tasks: Vec<(TaskId, Vec<Value>)>,
    labels: Vec<Vec<Value>>,
    events: Vec<Vec<Value>>,
    /// Statement texts by table, rows per statement (0: PostgreSQL's, for any number) and the
    /// columns an existing row keeps.
    texts: HashMap<StatementKey, String>,
    writes: u64,
    /// SQLite: the values of `JOB_INDEXED_UPDATES` of the job rows this connection wrote, as
    /// the database holds them now.
    jobs_indexed: HashMap<JobId, Vec<Value>>,
}

/// A set statement's table, rows and the upsert columns it leaves alone.
type StatementKey = (&'static str, usize, &'static [&'static str]);

/// Most job rows whose indexed values the connection remembers; past it, it forgets them all
/// (their next writes set every column).
const REMEMBERED_JOBS: usize = 65_536;

impl WriteConn {
    pub fn new(conn: Box<dyn Conn>) -> WriteConn {
        WriteConn {
            conn,
            jobs: Vec::new(),
            tasks: Vec::new(),
            labels: Vec::new(),
            events: Vec::new(),
            texts: HashMap::new(),
            writes: 0,
            jobs_indexed: HashMap::new(),
        }
    }

    /// Holds back a job's row as it is now.
    pub fn defer_job(&mut self, job: &Job) {
        self.jobs.push((job.id.clone(), rows::job_values(job)));
    }

    /// Holds back a task's row as it is now.
    pub fn defer_task(&mut self, namespace: &str, task: &Task) {
        self.tasks
            .push((task.id.clone(), rows::task_values(namespace, task)));
    }

    /// Holds back the label rows of a job just created (none when it has no labels).
    pub fn defer_labels(&mut self, job: &Job) {
        self.labels.extend(rows::label_values(job));
    }

    /// Holds back a history event of a job (`step`: the step of its task, if any).
    pub fn defer_event(&mut self, job: &JobId, step: Option<&str>, event: &Event) {
        self.events.push(rows::event_values(job, step, event));
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
        self.writes
    }

    /// Writes every row held back.
    pub fn flush(&mut self) -> Result<()> {
        self.write(Needs::Everything)
    }

    /// The database connection itself, for the writer's own transaction control.
    pub fn raw(&mut self) -> &mut dyn Conn {
        &mut *self.conn
    }

    fn write(&mut self, needs: Needs) -> Result<()> {
        if needs == Needs::Nothing {
            return Ok(());
        }
        let jobs = latest(std::mem::take(&mut self.jobs));
        let tasks = latest(std::mem::take(&mut self.tasks));
        self.write_jobs(jobs)?;
        let tasks: Vec<Vec<Value>> = tasks.into_iter().map(|(_, row)| row).collect();
        self.insert(&TASK_WRITE, &tasks, &[])?;
        let labels = std::mem::take(&mut self.labels);
        self.insert(&JOB_LABEL_WRITE, &labels, &[])?;
        if needs == Needs::Everything {
            let events = std::mem::take(&mut self.events);
            self.insert(&EVENT_WRITE, &events, &[])?;
        }
        Ok(())
    }

    /// Writes job rows; on SQLite, those whose indexed values stay as written last without
    /// setting them.
    fn write_jobs(&mut self, jobs: Vec<(JobId, Vec<Value>)>) -> Result<()> {
        if self.conn.backend() == Backend::Postgres {
            let rows: Vec<Vec<Value>> = jobs.into_iter().map(|(_, row)| row).collect();
            return self.insert(&JOB_WRITE, &rows, &[]);
        }
        let (mut steady, mut changed, mut remembered) = (Vec::new(), Vec::new(), Vec::new());
        for (id, row) in jobs {
            let indexed: Vec<Value> = INDEXED_COLUMNS.iter().map(|&at| row[at].clone()).collect();
            if self.jobs_indexed.get(&id) == Some(&indexed) {
                steady.push(row);
            } else {
                changed.push(row);
                remembered.push((id, indexed));
            }
        }
        if self.jobs_indexed.len() + remembered.len() > REMEMBERED_JOBS {
            self.jobs_indexed.clear();
        }
        let written = self
            .insert(&JOB_WRITE, &changed, &[])
            .and_then(|()| self.insert(&JOB_WRITE, &steady, JOB_INDEXED_UPDATES));
        if written.is_err() {
            // Some rows may have been written: what the database holds is not known.
            self.jobs_indexed.clear();
            return written;
        }
        self.jobs_indexed.extend(remembered);
        Ok(())
    }

    /// Inserts (or upserts) `rows`: on PostgreSQL in one statement, on SQLite in as few as the
    /// chunk sizes allow.
    fn insert(
        &mut self,
        table: &'static RowWrite,
        rows: &[Vec<Value>],
        unchanged: &'static [&'static str],
    ) -> Result<()> {
        if rows.is_empty() {
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
                .map(|column| rows.iter().map(|row| row[column].to_arg()).collect())
                .collect();
            self.conn.execute_columns(sql, &columns)?;
            self.writes += rows.len() as u64;
            return Ok(());
        }
        for chunk in chunks(rows) {
            let sql = self
                .texts
                .entry((table.table, chunk.len(), unchanged))
                .or_insert_with(|| table.sql(chunk.len(), unchanged));
            let args: Vec<Arg<'_>> = chunk.iter().flatten().map(ToArg::to_arg).collect();
            self.conn.execute(sql, &args)?;
            self.writes += chunk.len() as u64;
        }
        Ok(())
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

/// The last version of each row, in the order of their last versions.
fn latest<K: std::hash::Hash + Eq + Clone>(rows: Vec<(K, Vec<Value>)>) -> Vec<(K, Vec<Value>)> {
    let mut seen = HashSet::with_capacity(rows.len());
    let mut kept: Vec<(K, Vec<Value>)> = rows
        .into_iter()
        .rev()
        .filter(|(key, _)| seen.insert(key.clone()))
        .collect();
    kept.reverse();
    kept
}

impl Conn for WriteConn {
    fn backend(&self) -> Backend {
        self.conn.backend()
    }

    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        self.write(Needs::of(sql))?;
        let changed = self.conn.execute(sql, args)?;
        self.writes += changed;
        Ok(changed)
    }

    fn query(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        self.write(Needs::of(sql))?;
        self.conn.query(sql, args)
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
        self.writes += 1;
        self.conn.batch(sql)
    }

    fn lock_key(&mut self, key: &str) -> Result<()> {
        self.conn.lock_key(key)
    }

    fn begin_write(&mut self) -> Result<()> {
        self.write(Needs::Everything)?;
        self.conn.begin_write()
    }

    fn commit(&mut self, announcements: &[String]) -> Result<()> {
        self.write(Needs::Everything)?;
        self.conn.commit(announcements)
    }

    fn is_usable(&self) -> bool {
        self.conn.is_usable()
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
        let row = |text: &str| vec![Value::Text(text.to_owned())];
        let kept = latest(vec![
            ("a", row("a1")),
            ("b", row("b1")),
            ("a", row("a2")),
            ("c", row("c1")),
        ]);
        assert_eq!(kept, [("b", row("b1")), ("a", row("a2")), ("c", row("c1"))]);
    }

    #[test]
    fn set_statements_number_their_placeholders_row_after_row_or_take_each_column_as_an_array() {
        let sql = EVENT_WRITE.sql(2, &[]);
        assert!(
            sql.starts_with("INSERT INTO events (job_id, task_id"),
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
