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
//!   such jobs until the transaction ends. A committed transaction then hands them to the
//!   node's writers' `CarriedJobs`, each with the versions of its rows (PostgreSQL's `xmin`,
//!   the id of the transaction that wrote a row's version): a later transaction locks such a
//!   job and reads only its rows' versions, and takes the job from memory when every row is
//!   still the version the state was read from or the one the carrying transaction wrote (and
//!   the job has the same tasks). Any other write, by this node or another, gives a row a
//!   version of its own, and the job is read again.
//!
//! A command takes the job out (`take`), changes it, persists it and puts it back (`keep`).
//! A request whose changes are rolled back drops what it put back (`request_rolled_back`); a
//! failed commit empties the cache. A job that only waits (for its lock, a sleep, a signal, a
//! person or a callback) is not kept: it may wait for days, and a store full of them would keep
//! evicting the jobs in work. A job that ended is not kept (it is rarely changed again,
//! and the retention pruner deletes finished jobs' rows).
//!
//! On SQLite a job the cache does not hold may have been read ahead (see `read_ahead`): `take`
//! takes it from there. Every command that changes a job takes it first, through `take` (or,
//! for jobs read from the database together, `changing`): that is what keeps the jobs read
//! ahead as the store has them.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use foldhash::HashMap;

use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{JobState, TaskStatus};
use starbridge_store::db::TransactionId;
use starbridge_store::rows::JobRowVersions;

use crate::read_ahead::{Ask, ReadAhead};

/// Most jobs kept; past it, an arbitrary entry goes (the database has every job anyway).
const CAPACITY: usize = 8192;

/// How long a carried job may wait for its next use. Row versions are 32-bit transaction ids,
/// which PostgreSQL reuses after about four billion transactions: far more than any database
/// runs in this time, so an equal version never means a newer write.
const CARRIED_FOR: Duration = Duration::from_secs(600);

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
    entries: IndexedJobs<Box<JobState>>,
    /// Jobs put back by the request running now: dropped if its changes are rolled back.
    kept_by_request: Vec<JobId>,
    /// On PostgreSQL: the versions of the rows of the jobs this transaction read, as read.
    read_versions: HashMap<JobId, Seen>,
    /// On PostgreSQL: the jobs the node's writers' committed transactions carried over.
    carried: Option<Arc<Mutex<CarriedJobs>>>,
    /// On SQLite: the jobs read ahead for the claims (see `read_ahead`).
    read_ahead: Option<Arc<ReadAhead>>,
    /// Whether this transaction's takes go through the read-ahead: it held jobs, or a read was
    /// asked for or in flight, when the last transaction committed.
    read_ahead_active: bool,
    /// What this transaction's claims asked to read ahead.
    read_ahead_ask: Option<Ask>,
    /// Jobs taken from the read-ahead, since the cache was made.
    taken_ahead: u64,
}

/// Row versions a job's state is known to match: its job row's and its tasks' (none of a job
/// the transaction inserted: all its rows are the transaction's own).
#[derive(Debug, Default)]
struct Seen {
    row: Option<TransactionId>,
    tasks: HashMap<TaskId, TransactionId>,
}

impl Seen {
    fn read(versions: JobRowVersions) -> Seen {
        Seen {
            row: Some(versions.row),
            tasks: versions.tasks.into_iter().collect(),
        }
    }
}

/// Jobs by id, each as `T` (which holds the job's state), with the job of each of their tasks.
/// Past `CAPACITY` jobs an arbitrary one goes (the database has every job anyway).
pub(crate) struct IndexedJobs<T> {
    jobs: HashMap<JobId, T>,
    tasks: HashMap<TaskId, JobId>,
}

/// What an entry of `IndexedJobs` holds of its job.
pub(crate) trait HoldsState {
    fn state(&self) -> &JobState;
}

impl HoldsState for Box<JobState> {
    fn state(&self) -> &JobState {
        self
    }
}

impl<T> Default for IndexedJobs<T> {
    fn default() -> IndexedJobs<T> {
        IndexedJobs {
            jobs: HashMap::default(),
            tasks: HashMap::default(),
        }
    }
}

impl<T: HoldsState> IndexedJobs<T> {
    fn take(&mut self, id: &JobId) -> Option<T> {
        let entry = self.jobs.remove(id)?;
        for task in &entry.state().tasks {
            self.tasks.remove(&task.id);
        }
        Some(entry)
    }

    /// Holds `entry` in place of what it held of the same job.
    fn insert(&mut self, entry: T) {
        let id = entry.state().job.id.clone();
        self.take(&id);
        if self.jobs.len() >= CAPACITY
            && let Some(evicted) = self.jobs.keys().next().cloned()
        {
            self.take(&evicted);
        }
        for task in &entry.state().tasks {
            self.tasks.insert(task.id.clone(), id.clone());
        }
        self.jobs.insert(id, entry);
    }

    fn job_of(&self, task: &TaskId) -> Option<&JobId> {
        self.tasks.get(task)
    }

    fn contains(&self, id: &JobId) -> bool {
        self.jobs.contains_key(id)
    }

    fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Every entry, taken out.
    fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.tasks.clear();
        self.jobs.drain().map(|(_, entry)| entry)
    }

    fn clear(&mut self) {
        self.jobs.clear();
        self.tasks.clear();
    }
}

/// A job a committed transaction carried over (see the module's documentation).
pub(crate) struct CarriedJob {
    state: Box<JobState>,
    seen: Seen,
    /// The transaction that carried it: the version of the rows it wrote.
    by: TransactionId,
    at: Instant,
}

impl CarriedJob {
    /// True when the rows are still as this state has them: each row the version the state
    /// was read from or the one the carrying transaction wrote, and the same tasks.
    fn matches(&self, now: &JobRowVersions) -> bool {
        let current = |version: TransactionId, seen: Option<&TransactionId>| {
            version == self.by || seen == Some(&version)
        };
        current(now.row, self.seen.row.as_ref())
            && now.tasks.len() == self.state.tasks.len()
            && now.tasks.iter().all(|(task, version)| {
                self.state.task(task).is_some() && current(*version, self.seen.tasks.get(task))
            })
    }
}

impl HoldsState for CarriedJob {
    fn state(&self) -> &JobState {
        &self.state
    }
}

/// The jobs the committed transactions of a node's PostgreSQL writers carried over, shared by
/// those writers, with the job of each of their tasks.
pub(crate) type CarriedJobs = IndexedJobs<CarriedJob>;

/// What `JobCache::carried_matching` found of the jobs asked for.
pub(crate) struct Revived {
    /// Jobs carried over whose rows matched: from memory, boxed as the cache holds them.
    #[allow(clippy::vec_box)]
    pub(crate) states: Vec<Box<JobState>>,
    /// The rest of the jobs found, to read.
    pub(crate) to_read: Vec<JobId>,
}

impl JobCache {
    /// A cache of `lifetime`; on PostgreSQL, carrying jobs over to the next transactions of
    /// the node's writers through `carried`; on SQLite, taking the jobs it does not hold from
    /// `read_ahead`, whose reading thread ends with the cache.
    pub(crate) fn new(
        lifetime: Lifetime,
        carried: Option<Arc<Mutex<CarriedJobs>>>,
        read_ahead: Option<Arc<ReadAhead>>,
    ) -> JobCache {
        JobCache {
            lifetime,
            entries: IndexedJobs::default(),
            kept_by_request: Vec::new(),
            read_versions: HashMap::default(),
            carried,
            read_ahead,
            read_ahead_active: false,
            read_ahead_ask: None,
            taken_ahead: 0,
        }
    }

    /// Whether the transaction would carry jobs over once committed: on PostgreSQL, when it
    /// kept any. (Asking a transaction that wrote nothing for its id would make it take one.)
    pub(crate) fn would_carry(&self) -> bool {
        self.carried.is_some() && !self.entries.is_empty()
    }

    /// Notes the versions of the rows of a job the transaction read with them, so that it can
    /// carry the job over once committed.
    pub(crate) fn read_with(&mut self, versions: JobRowVersions) {
        if self.carried.is_some() {
            self.read_versions
                .insert(versions.job.clone(), Seen::read(versions));
        }
    }

    /// The job of a task of a job carried over, if there is one.
    pub(crate) fn carried_job_of(&self, task: &TaskId) -> Option<JobId> {
        let carried = self.carried.as_ref()?;
        let carried = carried.lock().unwrap_or_else(PoisonError::into_inner);
        carried.job_of(task).cloned()
    }

    /// True when any of `jobs` was carried over.
    pub(crate) fn any_carried(&self, jobs: &[JobId]) -> bool {
        self.carried.as_ref().is_some_and(|carried| {
            let carried = carried.lock().unwrap_or_else(PoisonError::into_inner);
            jobs.iter().any(|job| carried.contains(job))
        })
    }

    /// Of the jobs whose rows are now as `now` says (read and locked by this transaction), those
    /// carried over that still match them, taken out of the carried jobs; the others (and every
    /// job `now` does not hold: gone, or held by another node) are dropped from them.
    pub(crate) fn carried_matching(
        &mut self,
        asked: &[JobId],
        now: Vec<JobRowVersions>,
    ) -> Revived {
        let mut revived = Revived {
            states: Vec::new(),
            to_read: Vec::new(),
        };
        let Some(carried) = self.carried.clone() else {
            revived.to_read = now.into_iter().map(|versions| versions.job).collect();
            return revived;
        };
        let mut carried = carried.lock().unwrap_or_else(PoisonError::into_inner);
        let mut found: HashMap<JobId, JobRowVersions> = now
            .into_iter()
            .map(|versions| (versions.job.clone(), versions))
            .collect();
        for id in asked {
            let job = carried.take(id);
            let Some(versions) = found.remove(id) else {
                continue;
            };
            match job {
                Some(job) if job.at.elapsed() < CARRIED_FOR && job.matches(&versions) => {
                    self.read_versions.insert(id.clone(), Seen::read(versions));
                    revived.states.push(job.state);
                }
                _ => revived.to_read.push(id.clone()),
            }
        }
        revived
    }

    /// Takes the job out of the cache (or, when the cache does not hold it, out of the jobs
    /// read ahead) to change it; a command puts it back with `keep` once persisted.
    pub(crate) fn take(&mut self, id: &JobId) -> Option<Box<JobState>> {
        let cached = self.entries.take(id);
        let Some(read_ahead) = self.read_ahead.as_ref().filter(|_| self.read_ahead_active) else {
            return cached;
        };
        // Taken from the read-ahead even when cached: the job is about to change.
        let ahead = read_ahead.take(id);
        if cached.is_some() {
            return cached;
        }
        if ahead.is_some() {
            self.taken_ahead += 1;
        }
        ahead
    }

    /// Jobs the open transaction read from the database to change (none of them in the
    /// cache): the read-ahead drops them.
    pub(crate) fn changing(&mut self, ids: &[JobId]) {
        if let Some(read_ahead) = self.read_ahead.as_ref().filter(|_| self.read_ahead_active) {
            for id in ids {
                read_ahead.take(id);
            }
        }
    }

    /// How many jobs `take` found read ahead since the cache was made.
    pub(crate) fn taken_ahead(&self) -> u64 {
        self.taken_ahead
    }

    /// Asks for `ask` to be read ahead once the transaction commits (the first ask of a
    /// transaction counts; `ask` is called only when there is a read-ahead to ask).
    pub(crate) fn ask_read_ahead(&mut self, ask: impl FnOnce() -> Ask) {
        if self.read_ahead.is_some() && self.read_ahead_ask.is_none() {
            self.read_ahead_ask = Some(ask());
        }
    }

    /// The transaction committed: its ask goes to the read-ahead.
    pub(crate) fn committed(&mut self) {
        if let Some(read_ahead) = &self.read_ahead {
            self.read_ahead_active = read_ahead.committed(self.read_ahead_ask.take());
        }
    }

    /// The job of a task, if the task's job is cached.
    pub(crate) fn job_of(&self, task: &TaskId) -> Option<&JobId> {
        self.entries.job_of(task)
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
    pub(crate) fn load(&mut self, state: Box<JobState>) {
        self.insert(state);
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
        self.entries.insert(state);
        true
    }

    /// The request's changes stay.
    pub(crate) fn request_kept(&mut self) {
        self.kept_by_request.clear();
    }

    /// The request's changes were rolled back: forget what it kept.
    pub(crate) fn request_rolled_back(&mut self) {
        for id in std::mem::take(&mut self.kept_by_request) {
            self.entries.take(&id);
        }
    }

    /// The transaction committed as `id` (its rows' version): on PostgreSQL the jobs it kept
    /// go to the carried jobs, each with the versions of its rows it read; the writers' next
    /// transactions check those before they use a job (see the module's documentation). Jobs
    /// with signals waiting are not carried (their signals' rows carry versions of their own).
    pub(crate) fn carry_over(&mut self, id: TransactionId) {
        let Some(carried) = self.carried.clone() else {
            return;
        };
        let mut carried = carried.lock().unwrap_or_else(PoisonError::into_inner);
        let at = Instant::now();
        for state in self.entries.drain() {
            if !state.signals.is_empty() {
                continue;
            }
            let seen = self.read_versions.remove(&state.job.id).unwrap_or_default();
            carried.insert(CarriedJob {
                state,
                seen,
                by: id,
                at,
            });
        }
    }

    /// The transaction ended (committed or not): on PostgreSQL its row locks are gone.
    pub(crate) fn transaction_ended(&mut self) {
        if self.lifetime == Lifetime::Transaction {
            self.clear();
        }
    }

    /// The transaction did not commit (or rows changed outside the commands): forget everything
    /// it cached (jobs carried over from earlier transactions are checked before use anyway).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.kept_by_request.clear();
        self.read_versions.clear();
        self.read_ahead_ask = None;
        if let Some(read_ahead) = &self.read_ahead {
            read_ahead.forget_all();
        }
    }
}

impl Drop for JobCache {
    /// The writer is gone: so is the read-ahead's reading thread.
    fn drop(&mut self) {
        if let Some(read_ahead) = &self.read_ahead {
            read_ahead.close();
        }
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
        let mut cache = JobCache::new(Lifetime::Store, None, None);
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
        let mut cache = JobCache::new(Lifetime::Store, None, None);
        cache.keep(job("done", JobStatus::Succeeded));
        assert!(cache.take(&JobId::from_unique("done")).is_none());
        cache.keep(job("a", JobStatus::Running));
        cache.transaction_ended();
        assert!(cache.take(&JobId::from_unique("a")).is_some());
        let mut locked = JobCache::new(Lifetime::Transaction, None, None);
        locked.keep(job("a", JobStatus::Running));
        locked.transaction_ended();
        assert!(locked.take(&JobId::from_unique("a")).is_none());
    }

    #[test]
    fn a_task_leads_to_its_cached_job_until_the_job_is_taken() {
        let mut cache = JobCache::new(Lifetime::Store, None, None);
        let state = job("a", JobStatus::Running);
        let task_id = state.tasks[0].id.clone();
        cache.keep(state);
        assert_eq!(cache.job_of(&task_id), Some(&JobId::from_unique("a")));
        cache.take(&JobId::from_unique("a"));
        assert_eq!(cache.job_of(&task_id), None);
    }

    #[test]
    fn a_job_that_only_waits_is_not_kept() {
        let mut cache = JobCache::new(Lifetime::Store, None, None);
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

    /// The versions of job `id`'s rows: its row's, and each task's as listed.
    fn versions(id: &str, row: TransactionId, tasks: &[(&str, TransactionId)]) -> JobRowVersions {
        JobRowVersions {
            job: JobId::from_unique(id),
            row,
            tasks: tasks
                .iter()
                .map(|(task, version)| (TaskId::from_unique(task), *version))
                .collect(),
        }
    }

    /// A cache of a PostgreSQL writer, carrying over through `carried`.
    fn carrying(carried: &Arc<Mutex<CarriedJobs>>) -> JobCache {
        JobCache::new(Lifetime::Transaction, Some(carried.clone()), None)
    }

    /// Job `id` (task `id`) read with versions 7 by one transaction, which commits as 9.
    fn carried_over(carried: &Arc<Mutex<CarriedJobs>>, id: &str) {
        let mut cache = carrying(carried);
        assert!(!cache.would_carry(), "nothing kept: no id to ask for");
        cache.read_with(versions(id, 7, &[(id, 7)]));
        cache.load(Box::new(job(id, JobStatus::Running)));
        assert!(cache.would_carry());
        cache.carry_over(9);
        cache.transaction_ended();
    }

    #[test]
    fn a_carried_job_whose_rows_are_as_read_or_as_its_transaction_wrote_them_is_revived() {
        let carried = Arc::default();
        carried_over(&carried, "a");
        carried_over(&carried, "b");
        let mut next = carrying(&carried);
        assert!(
            next.take(&JobId::from_unique("a")).is_none(),
            "not before a check"
        );
        assert_eq!(
            next.carried_job_of(&TaskId::from_unique("b")),
            Some(JobId::from_unique("b"))
        );
        let asked = [JobId::from_unique("a"), JobId::from_unique("b")];
        assert!(next.any_carried(&asked));
        let now = vec![versions("a", 7, &[("a", 7)]), versions("b", 9, &[("b", 7)])];
        let revived = next.carried_matching(&asked, now);
        let ids: Vec<&str> = revived
            .states
            .iter()
            .map(|state| state.job.id.as_str())
            .collect();
        assert_eq!(ids, ["job_a", "job_b"]);
        assert!(revived.to_read.is_empty());
        assert!(!next.any_carried(&asked), "taken out of the carried jobs");
    }

    #[test]
    fn a_carried_job_another_transaction_wrote_or_that_is_gone_is_read_again_or_dropped() {
        let carried = Arc::default();
        for id in ["row", "task", "added", "gone", "held"] {
            carried_over(&carried, id);
        }
        let mut next = carrying(&carried);
        let asked: Vec<JobId> = ["row", "task", "added", "gone", "held"]
            .iter()
            .map(|id| JobId::from_unique(id))
            .collect();
        let now = vec![
            versions("row", 11, &[("row", 7)]),
            versions("task", 7, &[("task", 11)]),
            versions("added", 9, &[("added", 9), ("added2", 9)]),
        ];
        let revived = next.carried_matching(&asked, now);
        assert!(revived.states.is_empty());
        let to_read: Vec<&str> = revived.to_read.iter().map(JobId::as_str).collect();
        assert_eq!(to_read, ["job_row", "job_task", "job_added"]);
        assert!(
            !next.any_carried(&asked),
            "every one asked leaves the carried jobs"
        );
    }

    #[test]
    fn a_job_with_signals_waiting_or_a_rolled_back_one_is_not_carried() {
        let carried = Arc::default();
        let mut cache = carrying(&carried);
        let mut signalled = job("s", JobStatus::Running);
        signalled.signals.push(starbridge_core::model::Signal {
            seq: 0,
            name: "go".into(),
            payload: json!({}),
            id: None,
            sender: "ana".into(),
            received_at: starbridge_core::time::Timestamp(0),
        });
        cache.keep(signalled);
        cache.request_kept();
        cache.keep(job("r", JobStatus::Running));
        cache.request_rolled_back();
        cache.carry_over(9);
        let asked = [JobId::from_unique("s"), JobId::from_unique("r")];
        assert!(!cache.any_carried(&asked));
    }

    #[test]
    fn a_taken_job_is_gone_until_kept_again() {
        let mut cache = JobCache::new(Lifetime::Store, None, None);
        cache.keep(job("a", JobStatus::Running));
        cache.request_kept();
        assert!(cache.take(&JobId::from_unique("a")).is_some());
        assert!(cache.take(&JobId::from_unique("a")).is_none());
    }
}
