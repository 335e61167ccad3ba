//! Job labels: one row per label of a job (`job_labels`), written once with the job (see
//! `deferred`), read by the label filter of job lists (`jobs::list_jobs`, `browse`) and deleted
//! with their job. The labels themselves are read back from the job's row (`jobs.labels`).

use starbridge_core::model::Job;

use super::RowWrite;
use crate::db::{Value as SqlValue, args};

/// A job's labels, one row each, written once when the job is created (see `deferred`).
pub const JOB_LABEL_WRITE: RowWrite = RowWrite {
    table: "job_labels",
    columns: &["job_id", "namespace", "key", "value"],
    upsert: None,
};

/// The rows of a job's labels, in the columns of `JOB_LABEL_WRITE` (none for a job without).
pub fn label_values(job: &Job) -> Vec<Vec<SqlValue>> {
    job.labels
        .iter()
        .map(|(key, value)| {
            args![job.id.as_str(), job.namespace, key, value]
                .iter()
                .map(SqlValue::of)
                .collect()
        })
        .collect()
}
