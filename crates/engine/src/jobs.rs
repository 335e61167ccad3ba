//! Unfinished jobs kept in memory by the writer thread, so that a claim or a report does not
//! read the whole job (its row and every task row, with their JSON) back from the database it
//! just wrote. A fan-out of 100 children is then read once, not once per child claimed and once
//! per child completed. The tasks of cached jobs are indexed, so a report finds its job without
//! a query.
//!
//! The cache is used only where it is provably current:
//!
//! - on SQLite (`Lifetime::Store`), where this node's writer thread makes every change to jobs
//!   and tasks, so a job's rows can only change through a command that took the job out of the
//!   cache first;
//! - on PostgreSQL (`Lifetime::Transaction`), other nodes change jobs too, but never a job whose
//!   row this transaction locked (every change locks its job first) or inserted: the cache keeps
//!   such jobs until the transaction ends, and then forgets everything.
//!
//! A command takes the job out (`take`), changes it, persists it and puts it back (`keep`).
//! A request whose changes are rolled back drops what it put back (`request_rolled_back`); a
//! failed commit empties the cache. A job that only waits (for its lock, a sleep, a signal, a
//! person or a callback) is not kept: it may wait for days, and a store full of them would keep
//! evicting the jobs in work. A job that ended is not kept (it is rarely changed again,
//! and the retention pruner deletes finished jobs' rows).

use foldhash::HashMap;

use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{JobState, TaskStatus};

/// Most jobs kept; past it, an arbitrary entry goes (the database has every job anyway).
const CAPACITY: usize = 8192;

/// How long a cached job stays right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lifetime {
    /// As long as the store is open: this writer is the database's only one.
    Store,
    /// Until the transaction that locked it ends.
    Transaction,
}

pub(crate) struct JobCache {
    lifetime: Lifetime,
    /// Boxed: a job's state is over 500 bytes, and an entry written inline into a table of
    /// thousands lands on cache lines nothing else touches (each insert and take missed them).
    entries: HashMap<JobId, Box<JobState>>,
    /// The job of every task of a cached job.
    tasks: HashMap<TaskId, JobId>,
    /// Jobs put back by the request running now: dropped if its changes are rolled back.
    kept_by_request: Vec<JobId>,
}

impl JobCache {
    pub(crate) fn new(lifetime: Lifetime) -> JobCache {
        JobCache {
            lifetime,
            entries: HashMap::default(),
            tasks: HashMap::default(),
            kept_by_request: Vec::new(),
        }
    }

    /// Takes the job out of the cache; a command puts it back with `keep` once persisted.
    pub(crate) fn take(&mut self, id: &JobId) -> Option<Box<JobState>> {
        let state = self.entries.remove(id)?;
        self.forget_tasks(&state);
        Some(state)
    }

    /// The job of a task, if the task's job is cached.
    pub(crate) fn job_of(&self, task: &TaskId) -> Option<&JobId> {
        self.tasks.get(task)
    }

    /// Keeps a job as it was just persisted (or inserted) in the open transaction, which on
    /// PostgreSQL must hold the job's row lock.
    pub(crate) fn keep(&mut self, state: impl Into<Box<JobState>>) {
        let state = state.into();
        let id = state.job.id.clone();
        if self.insert(state) {
            self.kept_by_request.push(id);
        }
    }

    /// Caches a job read (on PostgreSQL: and locked) by the open transaction before its
    /// requests run; a request that is rolled back does not take it along.
    pub(crate) fn load(&mut self, state: JobState) {
        self.insert(Box::new(state));
    }

    /// Caches a job a worker is about to touch; true when it did. One that ended, or one that
    /// only waits (for its lock, a sleep, a signal, a person, a callback) is not kept: it may
    /// wait for days, and a store with many of them would keep evicting the jobs in work.
    fn insert(&mut self, state: Box<JobState>) -> bool {
        let in_work = state.tasks.iter().any(|task| {
            task.status == TaskStatus::Ready
                || (task.status == TaskStatus::Running && task.wait.is_none())
        });
        if state.job.status.is_terminal() || !in_work {
            return false;
        }
        if self.entries.len() >= CAPACITY
            && let Some(evicted) = self.entries.keys().next().cloned()
            && let Some(evicted) = self.entries.remove(&evicted)
        {
            self.forget_tasks(&evicted);
        }
        for task in &state.tasks {
            self.tasks.insert(task.id.clone(), state.job.id.clone());
        }
        self.entries.insert(state.job.id.clone(), state);
        true
    }

    fn forget_tasks(&mut self, state: &JobState) {
        for task in &state.tasks {
            self.tasks.remove(&task.id);
        }
    }

    /// The request's changes stay.
    pub(crate) fn request_kept(&mut self) {
        self.kept_by_request.clear();
    }

    /// The request's changes were rolled back: forget what it kept.
    pub(crate) fn request_rolled_back(&mut self) {
        for id in std::mem::take(&mut self.kept_by_request) {
            if let Some(state) = self.entries.remove(&id) {
                self.forget_tasks(&state);
            }
        }
    }

    /// The transaction ended (committed or not): on PostgreSQL its row locks are gone.
    pub(crate) fn transaction_ended(&mut self) {
        if self.lifetime == Lifetime::Transaction {
            self.clear();
        }
    }

    /// The transaction did not commit (or rows changed outside the commands): forget everything.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.tasks.clear();
        self.kept_by_request.clear();
    }
}

/// A job row of workflow `w` in namespace `default`, as a command would hold it.
#[cfg(test)]
pub(crate) fn test_job(
    id: &str,
    status: starbridge_core::model::JobStatus,
) -> starbridge_core::model::Job {
    starbridge_core::model::Job {
        id: JobId::from_unique(id),
        namespace: "default".into(),
        workflow: "w".into(),
        version: 1,
        status,
        params: serde_json::json!({}),
        key: None,
        priority: 0,
        created_at: starbridge_core::time::Timestamp(0),
        started_at: None,
        ended_at: None,
        deadline_at: None,
        wind_down: None,
        compensation_planned: false,
        completions: 0,
        round: 0,
        lock: None,
        signals_received: 0,
        output: None,
        failed_steps: Vec::new(),
        parent: None,
        depth: 0,
        child_versions: Default::default(),
        labels: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use starbridge_core::model::{JobStatus, Task};

    use super::*;

    /// A task of job `job` with `status`.
    fn task(job: &str, status: &str) -> Task {
        serde_json::from_value(json!({
            "id": format!("tsk_{job}"), "job_id": format!("job_{job}"), "seq": 0, "kind": "step",
            "step": "s", "item": null, "compensates": null, "queue": "q", "command": "c",
            "status": status, "priority": 0, "attempt": 0, "checking": false,
            "available_at": null, "deadline_at": null, "lease_token": null,
            "lease_expires_at": null, "worker_id": null, "input": null, "output": null,
            "error": null, "progress": null, "logs": null, "created_at": 0, "ready_at": null,
            "started_at": null, "ended_at": null, "completed_seq": null, "held": false,
            "round": 0, "attempt_base": 0
        }))
        .unwrap()
    }

    /// A job with one ready task: one a worker is about to touch.
    fn job(id: &str, status: JobStatus) -> JobState {
        JobState {
            job: test_job(id, status),
            tasks: vec![task(id, "ready")],
            signals: Vec::new(),
        }
    }

    #[test]
    fn a_rolled_back_request_leaves_nothing_it_kept() {
        let mut cache = JobCache::new(Lifetime::Store);
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
    fn ended_jobs_are_not_kept_and_a_transaction_cache_forgets_at_its_end() {
        let mut cache = JobCache::new(Lifetime::Store);
        cache.keep(job("done", JobStatus::Succeeded));
        assert!(cache.take(&JobId::from_unique("done")).is_none());
        cache.keep(job("a", JobStatus::Running));
        cache.transaction_ended();
        assert!(cache.take(&JobId::from_unique("a")).is_some());
        let mut locked = JobCache::new(Lifetime::Transaction);
        locked.keep(job("a", JobStatus::Running));
        locked.transaction_ended();
        assert!(locked.take(&JobId::from_unique("a")).is_none());
    }

    #[test]
    fn a_task_leads_to_its_cached_job_until_the_job_is_taken() {
        let mut cache = JobCache::new(Lifetime::Store);
        let state = job("a", JobStatus::Running);
        let task_id = state.tasks[0].id.clone();
        cache.keep(state);
        assert_eq!(cache.job_of(&task_id), Some(&JobId::from_unique("a")));
        cache.take(&JobId::from_unique("a"));
        assert_eq!(cache.job_of(&task_id), None);
    }

    #[test]
    fn a_job_that_only_waits_is_not_kept() {
        let mut cache = JobCache::new(Lifetime::Store);
        let mut waiting = job("w", JobStatus::Running);
        waiting.tasks[0] = task("w", "waiting");
        cache.keep(waiting);
        assert!(cache.take(&JobId::from_unique("w")).is_none());
        let mut sleeping = job("s", JobStatus::Running);
        sleeping.tasks[0] = task("s", "running");
        sleeping.tasks[0].wait = Some(Box::new(starbridge_core::model::Wait {
            since: starbridge_core::time::Timestamp(0),
            on: starbridge_core::model::WaitFor::Signal { name: "go".into() },
        }));
        cache.keep(sleeping);
        assert!(cache.take(&JobId::from_unique("s")).is_none());
        let mut leased = job("l", JobStatus::Running);
        leased.tasks[0] = task("l", "running");
        cache.keep(leased);
        assert!(cache.take(&JobId::from_unique("l")).is_some());
    }

    #[test]
    fn a_taken_job_is_gone_until_kept_again() {
        let mut cache = JobCache::new(Lifetime::Store);
        cache.keep(job("a", JobStatus::Running));
        cache.request_kept();
        assert!(cache.take(&JobId::from_unique("a")).is_some());
        assert!(cache.take(&JobId::from_unique("a")).is_none());
    }
}
