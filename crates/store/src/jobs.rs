//! Unfinished jobs kept in memory by the writer thread, so that a claim or a report does not
//! read the whole job (its row and every task row, with their JSON) back from the database it
//! just wrote. A fan-out of 100 children is then read once, not once per child claimed and once
//! per child completed.
//!
//! The cache is used only where it is provably current: on SQLite, where this node's writer
//! thread makes every change to jobs and tasks, so a job's rows can only change through a
//! command that took the job out of the cache first. On PostgreSQL other nodes change jobs too,
//! and the cache stays empty.
//!
//! A command takes the job out (`take`), changes it, persists it and puts it back (`keep`).
//! A request whose changes are rolled back to its savepoint drops what it put back
//! (`rolled_back`); a failed commit empties the cache. A job that ended is not kept (it is
//! rarely changed again, and the retention pruner deletes finished jobs' rows).

use std::collections::HashMap;

use starbridge_core::ids::JobId;
use starbridge_core::model::JobState;

/// Most jobs kept; past it, an arbitrary entry goes (the database has every job anyway).
const CAPACITY: usize = 8192;

pub(crate) struct JobCache {
    enabled: bool,
    entries: HashMap<JobId, JobState>,
    /// Jobs put back by the request running now: dropped if its changes are rolled back.
    kept_by_request: Vec<JobId>,
}

impl JobCache {
    /// A cache that keeps jobs when `enabled` (the node's writer is the database's only one).
    pub(crate) fn new(enabled: bool) -> JobCache {
        JobCache {
            enabled,
            entries: HashMap::new(),
            kept_by_request: Vec::new(),
        }
    }

    /// Takes the job out of the cache; a command puts it back with `keep` once persisted.
    pub(crate) fn take(&mut self, id: &JobId) -> Option<JobState> {
        self.entries.remove(id)
    }

    /// Keeps a job as it was just persisted in the open transaction.
    pub(crate) fn keep(&mut self, state: JobState) {
        if !self.enabled || state.job.status.is_terminal() {
            return;
        }
        if self.entries.len() >= CAPACITY
            && let Some(evicted) = self.entries.keys().next().cloned()
        {
            self.entries.remove(&evicted);
        }
        self.kept_by_request.push(state.job.id.clone());
        self.entries.insert(state.job.id.clone(), state);
    }

    /// The request's changes stay (released savepoint).
    pub(crate) fn request_kept(&mut self) {
        self.kept_by_request.clear();
    }

    /// The request's changes were rolled back to its savepoint: forget what it kept.
    pub(crate) fn request_rolled_back(&mut self) {
        for id in self.kept_by_request.drain(..) {
            self.entries.remove(&id);
        }
    }

    /// The transaction did not commit (or rows changed outside the commands): forget everything.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.kept_by_request.clear();
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use starbridge_core::model::{Job, JobStatus};
    use starbridge_core::time::Timestamp;

    use super::*;

    fn job(id: &str, status: JobStatus) -> JobState {
        JobState {
            job: Job {
                id: JobId::from_unique(id),
                namespace: "default".into(),
                workflow: "w".into(),
                version: 1,
                status,
                params: json!({}),
                key: None,
                priority: 0,
                created_at: Timestamp(0),
                started_at: None,
                ended_at: None,
                deadline_at: None,
                wind_down: None,
                compensation_planned: false,
                completions: 0,
                round: 0,
                lock: None,
            },
            tasks: Vec::new(),
        }
    }

    #[test]
    fn a_rolled_back_request_leaves_nothing_it_kept() {
        let mut cache = JobCache::new(true);
        cache.keep(job("a", JobStatus::Running));
        cache.request_kept();
        let a = cache.take(&JobId::from_unique("a")).unwrap();
        cache.keep(a);
        cache.keep(job("b", JobStatus::Running));
        cache.request_rolled_back();
        assert!(cache.take(&JobId::from_unique("a")).is_none());
        assert!(cache.take(&JobId::from_unique("b")).is_none());
    }

    #[test]
    fn ended_jobs_and_a_disabled_cache_keep_nothing() {
        let mut cache = JobCache::new(true);
        cache.keep(job("done", JobStatus::Succeeded));
        assert!(cache.take(&JobId::from_unique("done")).is_none());
        let mut off = JobCache::new(false);
        off.keep(job("a", JobStatus::Running));
        assert!(off.take(&JobId::from_unique("a")).is_none());
    }

    #[test]
    fn a_taken_job_is_gone_until_kept_again() {
        let mut cache = JobCache::new(true);
        cache.keep(job("a", JobStatus::Running));
        cache.request_kept();
        assert!(cache.take(&JobId::from_unique("a")).is_some());
        assert!(cache.take(&JobId::from_unique("a")).is_none());
    }
}
