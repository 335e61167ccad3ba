//! The correctness check run after each workload, through the HTTP API and the handlers' record:
//! every job submitted ended `succeeded`, every task ran exactly once.
//!
//! - The namespace's jobs (of one workflow, when the workload leaves others unfinished on
//!   purpose) are counted by status (paging `GET /api/v1/jobs` with `next_cursor`), and again
//!   filtered with `?status=succeeded`; every job listed must be one the benchmark submitted to
//!   be checked and vice versa.
//! - Every job is read with its tasks: the job and each task `succeeded`, each dispatched task on
//!   attempt 1, no compensation, as many dispatched tasks as the workflow has.
//! - The handlers' record: no task invoked more than once for an attempt, none with attempt > 1,
//!   none outside the submitted jobs, and every dispatched task of them invoked.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context as _, Result};
use serde::Serialize;
use starbridge_api::{self as api, JobStatus, TaskKind, TaskStatus};
use tokio::task::JoinSet;

use super::harness::{Api, Recorder};

/// Most anomalies listed in the report (all are counted).
const MAX_LISTED: usize = 100;

/// The outcome of the check, as reported.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Correctness {
    pub(crate) jobs_submitted: u64,
    pub(crate) submit_errors: u64,
    /// The namespace's jobs by status, as listed by the API.
    pub(crate) jobs_by_status: BTreeMap<String, u64>,
    pub(crate) jobs_succeeded: u64,
    /// Tasks dispatched to workers (steps, fan-out items), read job by job.
    pub(crate) tasks_checked: u64,
    pub(crate) tasks_not_attempt_1: u64,
    pub(crate) handler_invocations: u64,
    /// Tasks whose handler ran more than once for the same attempt.
    pub(crate) duplicate_invocations: u64,
    pub(crate) anomaly_count: u64,
    /// The first anomalies found (at most 100).
    pub(crate) anomalies: Vec<String>,
    pub(crate) ok: bool,
}

/// What the check read, for the workload's figures.
pub(crate) struct Verified {
    pub(crate) jobs: HashMap<String, api::JobView>,
    pub(crate) correctness: Correctness,
}

#[derive(Default)]
struct Anomalies {
    count: u64,
    listed: Vec<String>,
}

impl Anomalies {
    fn add(&mut self, anomaly: String) {
        self.count += 1;
        if self.listed.len() < MAX_LISTED {
            self.listed.push(anomaly);
        }
    }
}

/// Checks the jobs `submitted` (ids), each expected to have run `dispatched_per_job` tasks;
/// with `workflow`, only that workflow's jobs of the namespace are listed.
pub(crate) async fn verify(
    api: &Api,
    recorder: &Recorder,
    submitted: &[String],
    submit_errors: &[String],
    dispatched_per_job: usize,
    readers: usize,
    workflow: Option<&str>,
) -> Result<Verified> {
    let mut anomalies = Anomalies::default();
    for error in submit_errors {
        anomalies.add(error.clone());
    }
    let expected: HashSet<&str> = submitted.iter().map(String::as_str).collect();
    if expected.len() != submitted.len() {
        anomalies.add(format!(
            "{} job ids were returned more than once by submits",
            submitted.len() - expected.len()
        ));
    }

    // Counted by status, from the list.
    let listed = api.list_jobs_of(workflow, None).await?;
    let mut jobs_by_status: BTreeMap<String, u64> = BTreeMap::new();
    let mut listed_ids: HashSet<&str> = HashSet::new();
    for job in &listed {
        *jobs_by_status.entry(job.status.to_string()).or_default() += 1;
        if !listed_ids.insert(job.id.as_str()) {
            anomalies.add(format!("job {} is listed twice", job.id));
        }
        if !expected.contains(job.id.as_str()) {
            anomalies.add(format!(
                "job {} ({}) was not submitted by the benchmark (a submit that failed on the \
                 client but was accepted?)",
                job.id, job.status
            ));
        }
    }
    for id in &expected {
        if !listed_ids.contains(id) {
            anomalies.add(format!("job {id} was submitted but is not listed"));
        }
    }
    let succeeded_text = JobStatus::Succeeded.as_str();
    for (status, count) in &jobs_by_status {
        if status != succeeded_text {
            anomalies.add(format!("{count} jobs are {status}"));
        }
    }
    let succeeded = api
        .list_jobs_of(workflow, Some(JobStatus::Succeeded))
        .await?;
    let listed_succeeded = jobs_by_status.get(succeeded_text).copied().unwrap_or(0);
    if succeeded.len() as u64 != listed_succeeded {
        anomalies.add(format!(
            "?status=succeeded lists {} jobs, the unfiltered list {listed_succeeded}",
            succeeded.len()
        ));
    }

    // Every job, read with its tasks.
    let jobs = read_jobs(api, submitted, readers).await?;
    let mut tasks_checked = 0;
    let mut tasks_not_attempt_1 = 0;
    let mut dispatched: HashSet<&str> = HashSet::new();
    recorder.read(|runs| {
        for job in jobs.values() {
            let summary = &job.summary;
            if summary.status != JobStatus::Succeeded {
                anomalies.add(format!(
                    "job {} ended {}{}",
                    summary.id,
                    summary.status,
                    summary
                        .error
                        .as_ref()
                        .map(|error| format!(": {error}"))
                        .unwrap_or_default()
                ));
            }
            let mut count = 0;
            for task in &job.tasks {
                let label = match task.item {
                    Some(item) => format!("{}[{item}]", task.step),
                    None => task.step.clone(),
                };
                if task.status != TaskStatus::Succeeded {
                    anomalies.add(format!(
                        "task {} ({label}) of job {} is {}",
                        task.id, summary.id, task.status
                    ));
                }
                match task.kind.known() {
                    Some(TaskKind::Step | TaskKind::Item) => {}
                    Some(TaskKind::Compensation) => {
                        anomalies.add(format!(
                            "job {} has a compensation task {} ({label})",
                            summary.id, task.id
                        ));
                        continue;
                    }
                    _ => continue,
                }
                count += 1;
                tasks_checked += 1;
                dispatched.insert(task.id.as_str());
                if task.attempt != 1 {
                    tasks_not_attempt_1 += 1;
                    anomalies.add(format!(
                        "task {} ({label}) of job {} ended on attempt {}",
                        task.id, summary.id, task.attempt
                    ));
                }
                if task.status == TaskStatus::Succeeded && !runs.contains_key(&task.id) {
                    anomalies.add(format!(
                        "task {} ({label}) of job {} succeeded without the handler running",
                        task.id, summary.id
                    ));
                }
            }
            if count != dispatched_per_job {
                anomalies.add(format!(
                    "job {} has {count} dispatched tasks, expected {dispatched_per_job}",
                    summary.id
                ));
            }
        }
    });

    // The handlers' record.
    let mut duplicate_invocations = 0;
    recorder.read(|runs| {
        for (task, run) in runs {
            if !expected.contains(run.job_id.as_str()) {
                anomalies.add(format!(
                    "the handler ran task {task} of job {}, which the benchmark did not submit",
                    run.job_id
                ));
            } else if !dispatched.contains(task.as_str()) {
                anomalies.add(format!(
                    "the handler ran task {task} of job {}, which the job does not list",
                    run.job_id
                ));
            }
            for &(attempt, count) in &run.attempts {
                if count > 1 {
                    duplicate_invocations += 1;
                    anomalies.add(format!(
                        "the handler ran task {task} of job {} {count} times for attempt {attempt}",
                        run.job_id
                    ));
                }
                if attempt != 1 {
                    anomalies.add(format!(
                        "the handler was given task {task} of job {} on attempt {attempt}",
                        run.job_id
                    ));
                }
            }
        }
    });

    let correctness = Correctness {
        jobs_submitted: submitted.len() as u64,
        submit_errors: submit_errors.len() as u64,
        jobs_by_status,
        jobs_succeeded: jobs
            .values()
            .filter(|job| job.summary.status == JobStatus::Succeeded)
            .count() as u64,
        tasks_checked,
        tasks_not_attempt_1,
        handler_invocations: recorder.invocations(),
        duplicate_invocations,
        anomaly_count: anomalies.count,
        anomalies: anomalies.listed,
        ok: anomalies.count == 0,
    };
    Ok(Verified { jobs, correctness })
}

/// Reads every job with its tasks, `readers` requests at a time.
async fn read_jobs(
    api: &Api,
    ids: &[String],
    readers: usize,
) -> Result<HashMap<String, api::JobView>> {
    let ids: Arc<Vec<String>> = Arc::new(ids.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for _ in 0..readers.clamp(1, ids.len().max(1)) {
        let (api, ids, next) = (api.clone(), ids.clone(), next.clone());
        set.spawn(async move {
            let mut read = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(id) = ids.get(index) else {
                    return Ok::<_, anyhow::Error>(read);
                };
                read.push(api.job(id).await?);
            }
        });
    }
    let mut jobs = HashMap::with_capacity(ids.len());
    while let Some(joined) = set.join_next().await {
        for job in joined.context("a job reader failed")?? {
            jobs.insert(job.summary.id.clone(), job);
        }
    }
    Ok(jobs)
}
