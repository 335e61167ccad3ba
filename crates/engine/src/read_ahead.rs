//! Reading ahead, on a thread of its own, the jobs the writer's next claims will take (SQLite
//! only). A drain of a queue deeper than the job cache (`jobs`) claims jobs the cache no longer
//! holds, and reading them on the writer thread took a sixth of its time. When a claim of
//! queues without limits took jobs the cache did not hold, the transaction asks for the jobs of
//! the next ready tasks of those queues; this thread reads them on a read connection of its
//! own, and the writer's job cache takes a job from here when it does not hold it itself
//! (`JobCache::take`).
//!
//! A job held here is as the store has it, which holds because:
//!
//! - the writer counts its commits, and a read notes the count before it begins: its snapshot
//!   holds at least those commits;
//! - every job a command changes is taken first (`JobCache::take`, or `JobCache::changing` for
//!   one read from the database), and a take removes the job from here and, while a read is
//!   asked for or in flight, notes it with the number of the transaction taking it (the count
//!   plus one);
//! - a read hands in only the jobs no transaction numbered above its count took, and none at
//!   all when the writer forgot everything (a rollback, rows changed outside the commands)
//!   after the read began.
//!
//! A read begins only once a commit handed its ask over, so a transaction that began with
//! nothing held here, nothing asked and no read in flight needs to note nothing: its takes
//! skip this module altogether (a workload whose claims find their jobs in the cache pays
//! nothing for it).

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use foldhash::HashMap;

use starbridge_core::dispatch::QueueConfig;
use starbridge_core::ids::JobId;
use starbridge_core::model::JobState;
use starbridge_core::time::Timestamp;
use starbridge_store::Connect;
use starbridge_store::db::Conn;
use starbridge_store::rows::{self, Pass, RowLock};

/// Most jobs held (a one-step job's state takes about 1.5 KB).
const HOLD_MOST: usize = 4096;

/// A read is asked for only while fewer jobs than this are held.
const READ_BELOW: usize = HOLD_MOST / 2;

/// How long a job read ahead waits for its claim before it goes, to make room for the jobs of
/// queues claimed now (a queue paused meanwhile would keep its jobs here forever).
const HELD_FOR: Duration = Duration::from_secs(10);

/// What to read ahead: the jobs of the next ready tasks of a claim's queues.
#[derive(Debug, Clone)]
pub(crate) struct Ask {
    pub(crate) namespace: String,
    /// Each queue with how it dispatches, and which of its ready tasks a claim reads.
    pub(crate) queues: Vec<(String, QueueConfig, Pass)>,
    /// The claim's time: the tasks claimable then.
    pub(crate) now: Timestamp,
}

/// The jobs read ahead, shared by the writer and the reading thread.
pub(crate) struct ReadAhead {
    held: Mutex<Held>,
    /// Signalled when an ask is handed over or the writer is gone.
    asked: Condvar,
    /// Signalled when a read handed its jobs in.
    handed_in: Condvar,
}

impl ReadAhead {
    /// Starts the reading thread, which reads through connections `connect` opens (the first
    /// when the first ask comes) and ends once `close` is called.
    pub(crate) fn start(connect: Connect) -> Arc<ReadAhead> {
        let read_ahead = Arc::new(ReadAhead {
            held: Mutex::new(Held::default()),
            asked: Condvar::new(),
            handed_in: Condvar::new(),
        });
        let reading = read_ahead.clone();
        std::thread::Builder::new()
            .name("starbridge-read-ahead".to_owned())
            .spawn(move || reading.run(&connect))
            .expect("spawning the read-ahead thread");
        read_ahead
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Job `id`, which the open transaction takes to change, if it is held (see `Held::take`).
    pub(crate) fn take(&self, id: &JobId) -> Option<Box<JobState>> {
        self.held().take(id)
    }

    /// The writer committed a transaction that asked for `ask`; true when the next transaction
    /// must take its jobs through here (see `Held::committed`).
    pub(crate) fn committed(&self, ask: Option<Ask>) -> bool {
        let (active, handed_over) = self.held().committed(ask);
        if handed_over {
            self.asked.notify_one();
        }
        active
    }

    /// The writer forgot what it cached: every job held goes, and so does what a read begun
    /// before brings.
    pub(crate) fn forget_all(&self) {
        self.held().forget_all();
    }

    /// Jobs the writer took from here since the store opened.
    pub(crate) fn used(&self) -> u64 {
        self.held().used
    }

    /// The writer is gone: the reading thread ends.
    pub(crate) fn close(&self) {
        self.held().closed = true;
        self.asked.notify_one();
    }

    fn run(&self, connect: &Connect) {
        let mut conn: Option<Box<dyn Conn>> = None;
        loop {
            let (ask, floor) = {
                let mut held = self.held();
                loop {
                    if held.closed {
                        return;
                    }
                    if let Some(begun) = held.begin_read() {
                        break begun;
                    }
                    held = self
                        .asked
                        .wait(held)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            };
            // A read that panicked must still hand in (nothing): until a read does, every
            // take notes its job.
            let read = std::panic::catch_unwind(AssertUnwindSafe(|| {
                self.read(connect, &mut conn, &ask, floor)
            }));
            let states = match read {
                Ok(Ok(states)) => states,
                failed => {
                    // Reading ahead only saves the writer work: a failed read costs nothing
                    // but the jobs it would have brought.
                    if let Ok(Err(error)) = failed {
                        tracing::debug!(%error, "reading jobs ahead failed");
                    } else {
                        tracing::warn!("reading jobs ahead panicked");
                    }
                    conn = None;
                    Vec::new()
                }
            };
            self.held().hand_in(floor, states, Instant::now());
            self.handed_in.notify_all();
        }
    }

    /// Waits until no read is asked for or in flight.
    #[cfg(test)]
    pub(crate) fn settle(&self) {
        let mut held = self.held();
        while held.ask.is_some() || held.reading.is_some() {
            held = self
                .handed_in
                .wait(held)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The jobs of the ready tasks `ask` names that are neither held nor taken since `floor`,
    /// read in one read transaction.
    #[allow(clippy::vec_box)] // Boxed as the job cache holds them.
    fn read(
        &self,
        connect: &Connect,
        conn: &mut Option<Box<dyn Conn>>,
        ask: &Ask,
        floor: u64,
    ) -> starbridge_store::Result<Vec<Box<JobState>>> {
        let conn = match conn {
            Some(open) if open.is_usable() => open,
            _ => conn.insert(connect()?),
        };
        conn.batch("BEGIN")?;
        let read = self.read_in(conn.as_mut(), ask, floor);
        let ended = conn.batch("COMMIT");
        let states = read?;
        ended?;
        Ok(states)
    }

    #[allow(clippy::vec_box)]
    fn read_in(
        &self,
        conn: &mut dyn Conn,
        ask: &Ask,
        floor: u64,
    ) -> starbridge_store::Result<Vec<Box<JobState>>> {
        let mut jobs = Vec::new();
        for (queue, config, pass) in &ask.queues {
            let (candidates, _) = rows::claim_candidates(
                conn,
                &ask.namespace,
                queue,
                config,
                ask.now,
                HOLD_MOST as u32,
                *pass,
            )?;
            jobs.extend(candidates.into_iter().map(|candidate| candidate.job));
        }
        let wanted = self.held().wanted(jobs, floor);
        Ok(rows::lock_job_states(conn, &wanted, RowLock::None)?
            .into_iter()
            .map(|loaded| Box::new(loaded.state))
            .collect())
    }
}

/// What `ReadAhead` holds, and its rules (see the module's documentation).
#[derive(Default)]
struct Held {
    /// Transactions the writer committed.
    committed: u64,
    /// The jobs read ahead, each with when it was read.
    jobs: HashMap<JobId, (Box<JobState>, Instant)>,
    /// Jobs taken to change, by the number of the transaction that took them, kept while a
    /// read that began before that transaction committed may still hand jobs in.
    taken: HashMap<JobId, u64>,
    /// The number of the transaction that last forgot every job: a read that began before it
    /// hands in nothing.
    forgotten_in: u64,
    /// The commit count when the read in flight began.
    reading: Option<u64>,
    /// What the next read reads, handed over by a commit.
    ask: Option<Ask>,
    closed: bool,
    /// Jobs taken from here.
    used: u64,
}

impl Held {
    /// Removes job `id`, which the open transaction takes to change, and returns it if it was
    /// held. While a read is asked for or in flight, notes it as taken by the open transaction.
    fn take(&mut self, id: &JobId) -> Option<Box<JobState>> {
        if self.reading.is_some() || self.ask.is_some() {
            self.taken.insert(id.clone(), self.committed + 1);
        }
        let (state, _) = self.jobs.remove(id)?;
        self.used += 1;
        Some(state)
    }

    /// Counts a commit and forgets the jobs taken that no read in flight or asked for could
    /// have read before they changed; hands `ask` over when no read is asked for or in flight
    /// and few jobs are held. Returns whether the next transaction's takes must come here (a
    /// job is held, or a read is asked for or in flight), and whether `ask` was handed over.
    fn committed(&mut self, ask: Option<Ask>) -> (bool, bool) {
        self.committed += 1;
        self.forget_taken();
        let hand_over = ask.is_some()
            && self.reading.is_none()
            && self.ask.is_none()
            && self.jobs.len() < READ_BELOW;
        if hand_over {
            self.ask = ask;
        }
        let active = self.reading.is_some() || self.ask.is_some() || !self.jobs.is_empty();
        (active, hand_over)
    }

    /// A read can only have begun at the commit count of the one in flight, or (asked for or
    /// not) at today's count or later: a job taken by a transaction numbered at or below it
    /// changed before any such read began.
    fn forget_taken(&mut self) {
        let floor = self.reading.unwrap_or(self.committed);
        self.taken.retain(|_, by| *by > floor);
    }

    fn forget_all(&mut self) {
        self.jobs.clear();
        self.forgotten_in = self.committed + 1;
    }

    /// The ask to read now, with the commit count the read begins at.
    fn begin_read(&mut self) -> Option<(Ask, u64)> {
        let ask = self.ask.take()?;
        self.reading = Some(self.committed);
        Some((ask, self.committed))
    }

    /// Of `jobs` (in claim order, perhaps repeated), those worth reading for a read begun at
    /// `floor`: neither held nor taken since, as many as there is room for.
    fn wanted(&self, jobs: Vec<JobId>, floor: u64) -> Vec<JobId> {
        let room = HOLD_MOST.saturating_sub(self.jobs.len());
        let mut seen = HashSet::with_capacity(jobs.len());
        jobs.into_iter()
            .filter(|job| !self.jobs.contains_key(job) && !self.taken_since(job, floor))
            .filter(|job| seen.insert(job.clone()))
            .take(room)
            .collect()
    }

    fn taken_since(&self, job: &JobId, floor: u64) -> bool {
        self.taken.get(job).is_some_and(|by| *by > floor)
    }

    /// The read begun at `floor` is done: of `states`, those no transaction took since it began
    /// are held (none when the writer forgot everything since), in place of the jobs read
    /// longer than `HELD_FOR` before `now`.
    #[allow(clippy::vec_box)]
    fn hand_in(&mut self, floor: u64, states: Vec<Box<JobState>>, now: Instant) {
        self.reading = None;
        self.jobs
            .retain(|_, (_, read_at)| now.saturating_duration_since(*read_at) < HELD_FOR);
        if self.forgotten_in <= floor {
            for state in states {
                if self.jobs.len() >= HOLD_MOST {
                    break;
                }
                if !self.taken_since(&state.job.id, floor) {
                    self.jobs.insert(state.job.id.clone(), (state, now));
                }
            }
        }
        self.forget_taken();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::test_job;
    use starbridge_core::model::JobStatus;

    fn id(name: &str) -> JobId {
        JobId::from_unique(name)
    }

    fn state(name: &str) -> Box<JobState> {
        Box::new(JobState {
            job: test_job(name, JobStatus::Queued),
            tasks: Vec::new(),
            signals: Vec::new(),
        })
    }

    fn ask() -> Ask {
        Ask {
            namespace: "default".into(),
            queues: vec![("q".into(), QueueConfig::default(), Pass::Ready)],
            now: Timestamp(0),
        }
    }

    /// A read asked for by the first commit and begun: its ask and floor.
    fn reading(held: &mut Held) -> u64 {
        assert_eq!(held.committed(Some(ask())), (true, true));
        let (_, floor) = held.begin_read().unwrap();
        floor
    }

    #[test]
    fn a_job_read_ahead_is_taken_once() {
        let mut held = Held::default();
        let floor = reading(&mut held);
        held.hand_in(floor, vec![state("a")], Instant::now());
        assert_eq!(held.committed(None), (true, false));
        assert!(held.take(&id("a")).is_some());
        assert!(held.take(&id("a")).is_none());
        assert_eq!(held.used, 1);
        assert_eq!(
            held.committed(None),
            (false, false),
            "nothing held or read: the next transaction's takes skip the read-ahead"
        );
    }

    #[test]
    fn a_job_taken_while_it_was_read_is_not_held() {
        let mut held = Held::default();
        let floor = reading(&mut held);
        // The open transaction (numbered floor + 1) takes a job the read is reading.
        assert!(held.take(&id("a")).is_none());
        assert_eq!(held.wanted(vec![id("a"), id("b")], floor), [id("b")]);
        // It commits before the read hands its jobs in.
        held.committed(None);
        held.hand_in(floor, vec![state("a"), state("b")], Instant::now());
        assert!(held.take(&id("a")).is_none(), "read before it changed");
        assert!(held.take(&id("b")).is_some());
    }

    #[test]
    fn a_job_taken_before_the_commit_that_asked_is_read_again() {
        let mut held = Held::default();
        // Taken by a transaction that committed before the read began: the read sees it changed.
        held.take(&id("a"));
        let floor = reading(&mut held);
        held.hand_in(floor, vec![state("a")], Instant::now());
        assert!(held.take(&id("a")).is_some());
    }

    #[test]
    fn a_read_begun_before_everything_was_forgotten_brings_nothing() {
        let mut held = Held::default();
        let floor = reading(&mut held);
        held.forget_all();
        held.hand_in(floor, vec![state("a")], Instant::now());
        assert!(held.take(&id("a")).is_none());
        // A read begun after the forgetting transaction counts again.
        held.committed(None);
        let floor = reading(&mut held);
        held.hand_in(floor, vec![state("b")], Instant::now());
        assert!(held.take(&id("b")).is_some());
    }

    #[test]
    fn an_ask_waits_while_a_read_is_in_flight_or_many_jobs_are_held() {
        let mut held = Held::default();
        let floor = reading(&mut held);
        assert_eq!(held.committed(Some(ask())), (true, false));
        let many: Vec<Box<JobState>> = (0..READ_BELOW).map(|n| state(&n.to_string())).collect();
        held.hand_in(floor, many, Instant::now());
        assert_eq!(held.committed(Some(ask())), (true, false));
        held.take(&id("0"));
        assert_eq!(held.committed(Some(ask())), (true, true));
    }

    #[test]
    fn jobs_held_too_long_go_at_the_next_read() {
        let mut held = Held::default();
        let floor = reading(&mut held);
        let then = Instant::now();
        held.hand_in(floor, vec![state("old")], then);
        held.committed(None);
        let floor = reading(&mut held);
        held.hand_in(floor, vec![state("new")], then + HELD_FOR);
        assert!(held.take(&id("old")).is_none());
        assert!(held.take(&id("new")).is_some());
    }
}
