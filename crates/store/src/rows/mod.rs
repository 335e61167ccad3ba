//! Mapping between core types and table rows, one file per table or concern, written once for
//! both backends (see `db`): jobs (`jobs`), their labels (`labels`), tasks with the claim's candidates (`tasks`), history
//! (`events`), queues with their rate buckets (`queues`), the settings of queue name prefixes
//! (`queue_prefixes`), workflow versions (`workflows`), lock
//! slots of jobs and tasks (`locks`), the token buckets of steps' per-key rates (`rates`), lease, deadline and wait timers (`timers`), signals sent to jobs
//! (`signals`), the endings of child jobs for their parents (`children`), namespaces (`namespaces`), the health
//! probe (`health`), schedules (`schedules`), webhook subscriptions (`webhooks`) and their
//! outbox (`deliveries`), API tokens (`tokens`) and the audit log (`audit`). The rest of the
//! store's SQL is in `stats`, `browse`, the backends and the migrations.
//!
//! This module keeps what the tables share: JSON and timestamp columns, how a write locks the
//! rows it reads (`RowLock`) and how rows are written in sets (`RowWrite`). The functions most
//! of the engine calls are re-exported here (`rows::load_job`); those of schedules, webhooks,
//! deliveries, tokens, queue prefixes and the audit log are called by their module
//! (`rows::tokens::list`).

use serde_json::Value;
use starbridge_core::time::Timestamp;

use crate::{Error, Result};

pub mod audit;
pub mod children;
pub mod deliveries;
mod events;
mod health;
mod jobs;
pub(crate) mod labels;
mod locks;
mod namespaces;
pub mod partitions;
pub mod queue_prefixes;
mod queues;
pub mod rates;
pub mod schedules;
mod signals;
mod tasks;
mod timers;
pub mod tokens;
pub mod webhooks;
mod workflows;

#[cfg(test)]
mod tests;

pub use events::{
    ChangeMark, EVENT_WRITE, attempt_first_claimed_at, change_mark, event_values, events,
};
pub(crate) use events::{kind_from_column, kinds_in};
pub use health::{ping, write_health_probe};
pub use jobs::{
    JOB_INDEXED_UPDATES, JOB_WRITE, JobRowVersions, LoadedJob, delete_job, job_by_key,
    job_row_versions, job_values, list_jobs, load_job, load_job_state, lock_job_state,
    lock_job_states, prune_finished, set_trace, trace_of,
};
pub(crate) use jobs::{
    JOBS_BY_ID, NAMESPACES_WITH_JOBS, any_status_newest_first, before_cursor, status_list,
};
pub use labels::{JOB_LABEL_WRITE, label_values};
pub use locks::{
    first_parked, first_queued, hold_lock, hold_task_lock, lock_holders, release_lock,
    release_task_lock,
};
pub use namespaces::ensure_namespace;
pub use queues::{
    QueueSearch, ensure_queue, queue, queue_line, queue_page, save_bucket, save_queue,
    stop_on_error,
};
pub use signals::{consume_signal, insert_signal, pending_signals, signal_seen};
pub use tasks::{
    Pass, TASK_WRITE, claim_candidates, job_of_task, jobs_of_tasks, next_available,
    pending_approvals, running_count, task_values,
};
pub use timers::{due_jobs, next_timer};
pub use workflows::{
    hide_workflow, highest_version, insert_workflow, latest_version, list_workflows,
    unsettled_jobs, workflow, workflow_version_of,
};

/// How many columns a comma-separated column list names.
const fn column_count(columns: &str) -> usize {
    let bytes = columns.as_bytes();
    let (mut count, mut at) = (1, 0);
    while at < bytes.len() {
        if bytes[at] == b',' {
            count += 1;
        }
        at += 1;
    }
    count
}

fn json_text(value: &Value) -> String {
    value.to_string()
}

/// A JSON column's text: a value, or one of the structured fields the core keeps as JSON.
fn opt_json_text<T: serde::Serialize>(value: Option<&T>) -> Option<String> {
    value.map(|value| serde_json::to_string(value).unwrap_or_default())
}

/// A labels column's text: `NULL` for no labels.
fn labels_text(labels: &starbridge_core::labels::Labels) -> Option<String> {
    opt_json_text(Some(labels).filter(|labels| !labels.is_empty()))
}

/// A JSON column read back as `T`.
fn parse_json<T: serde::de::DeserializeOwned>(text: Option<String>) -> Result<Option<T>> {
    text.map(|text| serde_json::from_str(&text).map_err(|e| Error::Corrupt(e.to_string())))
        .transpose()
}

fn ts(value: Option<i64>) -> Option<Timestamp> {
    value.map(Timestamp)
}

fn enum_column<T>(text: String, parse: fn(&str) -> Option<T>) -> Result<T> {
    parse(&text).ok_or_else(|| Error::Corrupt(format!("unknown value '{text}'")))
}

/// How a write holds the rows it loads against other server nodes (on SQLite, with its single
/// writer, every variant reads the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowLock {
    /// A read: no lock.
    None,
    /// Lock the row, waiting for a node that holds it.
    Wait,
    /// Lock the row, or skip it when another node holds it (it is being handled).
    Skip,
}

impl RowLock {
    fn clause(self) -> &'static str {
        match self {
            RowLock::None => "",
            RowLock::Wait => " FOR UPDATE",
            RowLock::Skip => " FOR UPDATE SKIP LOCKED",
        }
    }
}

/// How the rows of a table are written in sets (see `deferred`): its columns, and for rows
/// that may exist already, the key and the columns an existing row takes from the new one.
pub struct RowWrite {
    pub table: &'static str,
    pub columns: &'static [&'static str],
    pub upsert: Option<(&'static str, &'static [&'static str])>,
}

impl RowWrite {
    /// The `INSERT` of any number of rows on PostgreSQL: one parameter per column, an array of
    /// its values in binary form (`Conn::execute_columns`; `types` names each column's type as
    /// the catalog does, `text` or `bigint`), unnested into rows in their order. The statement's
    /// text, and so its prepared plan, is the same whatever the number of rows. The rows went
    /// as one JSON text before, and PostgreSQL's JSON parser took a fifth of its CPU in a drain.
    pub fn postgres_set_sql(&self, types: &[String]) -> String {
        let columns = self.columns.join(", ");
        let arrays: Vec<String> = types
            .iter()
            .enumerate()
            .map(|(index, ty)| format!("?{}::{ty}[]", index + 1))
            .collect();
        let mut sql = format!(
            "INSERT INTO {table} ({columns}) SELECT {columns} \
             FROM UNNEST({arrays}) WITH ORDINALITY AS r ({columns}, ordinality) \
             ORDER BY r.ordinality",
            table = self.table,
            arrays = arrays.join(", "),
        );
        self.push_upsert(&mut sql, &[]);
        sql
    }

    /// The conflict clause: an existing row takes the upsert's columns but `unchanged`.
    fn push_upsert(&self, sql: &mut String, unchanged: &[&str]) {
        if let Some((key, updated)) = self.upsert {
            let set: Vec<String> = updated
                .iter()
                .filter(|column| !unchanged.contains(column))
                .map(|column| format!("{column} = excluded.{column}"))
                .collect();
            sql.push_str(&format!(
                " ON CONFLICT ({key}) DO UPDATE SET {}",
                set.join(", ")
            ));
        }
    }

    /// The `INSERT` of `rows` rows, their values bound as `?1, ?2, …` row after row; an existing
    /// row takes the upsert's columns but `unchanged` (on SQLite, setting a column an index
    /// uses rewrites the row's entry in that index even when the value stays).
    ///
    /// A plain insert is `INSERT OR FAIL`: a statement of several rows that may stop with an
    /// error part of the way makes SQLite copy every page it changes first into a statement
    /// journal, to undo its own rows; with `FAIL` it keeps them, and a failed set write fails
    /// its request or the whole transaction anyway, which a rollback undoes (see
    /// `deferred`). An upsert's update stops with `ABORT` whatever the statement says, so it
    /// keeps its journal, and so does a row with a foreign key.
    pub fn sql(&self, rows: usize, unchanged: &[&str]) -> String {
        let width = self.columns.len();
        let mut sql = format!(
            "INSERT {}INTO {} ({}) VALUES ",
            if self.upsert.is_none() {
                "OR FAIL "
            } else {
                ""
            },
            self.table,
            self.columns.join(", ")
        );
        for row in 0..rows {
            if row > 0 {
                sql.push_str(", ");
            }
            sql.push('(');
            for column in 0..width {
                if column > 0 {
                    sql.push_str(", ");
                }
                sql.push_str(&format!("?{}", row * width + column + 1));
            }
            sql.push(')');
        }
        self.push_upsert(&mut sql, unchanged);
        sql
    }
}
