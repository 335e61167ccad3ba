//! Job labels: one row per label of a job (`job_labels`), written once with the job (see
//! `deferred`), read by the label filter of job lists (`jobs::list_jobs`, `browse`) and deleted
//! with their job. The labels themselves are read back from the job's row (`jobs.labels`).

use starbridge_core::model::Job;

use super::RowWrite;
use crate::Result;
use crate::db::{Arg, Conn, Queries, args};

/// A label counts as rare below this many jobs: a filter reads its jobs from the label index;
/// a more common one is checked job by job instead.
pub(crate) const RARE_LABEL: i64 = 1000;

/// How many jobs of `namespace` carry the label, counted up to `RARE_LABEL` (an index range
/// that stops there).
pub(crate) fn capped_count(
    conn: &mut dyn Conn,
    namespace: &str,
    (key, value): &(String, String),
) -> Result<i64> {
    conn.query_value(
        "SELECT COUNT(*) FROM (SELECT 1 FROM job_labels WHERE namespace = ?1 AND key = ?2 \
         AND value = ?3 LIMIT ?4) AS capped",
        args![namespace, key, value, RARE_LABEL],
    )
}

/// A job's labels, one row each, written once when the job is created (see `deferred`).
pub const JOB_LABEL_WRITE: RowWrite = RowWrite {
    table: "job_labels",
    columns: &["job_id", "namespace", "key", "value"],
    upsert: None,
};

/// The rows of a job's labels, in the columns of `JOB_LABEL_WRITE` (none for a job without).
pub fn label_values(job: &Job, mut take: impl FnMut(&[Arg<'_>])) {
    for (key, value) in &job.labels {
        take(args![job.id.as_str(), job.namespace, key, value]);
    }
}
