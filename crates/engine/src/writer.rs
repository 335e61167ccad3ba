//! Group commit: a writer thread owns a write connection (SQLite: the node's only one; PostgreSQL:
//! two threads with one each, taking turns, see `run`). Requests queue up while a
//! commit is in flight; the next transaction takes all of them (up to `MAX_BATCH`), runs each,
//! commits once, and only then answers every request and wakes the pollers of queues that got
//! work. One fsync serves many requests, and no request is answered before its change is
//! durable. On SQLite the commit returns before its log is synced (`Conn::log_sync`): a sync
//! thread syncs it and answers the group's requests, while the writer runs the next group (one
//! sync then covers every group committed while the last one ran); when nothing waits for the
//! writer and the sync thread is idle, the writer syncs and answers the commit itself. The
//! connection holds row writes back and writes them in sets (see `deferred`), and keeps the
//! settings its commands read often (`CachedReads`).
//!
//! A refused request must leave nothing behind while the others of its transaction commit.
//! Requests run bare: a savepoint per request costs a round trip on PostgreSQL and a copy of
//! every page it changes on SQLite, and almost every refusal (a stale lease, an invalid submit,
//! an action that does not apply) is decided before anything is written, so dropping the rows
//! the request held back is all it takes. A request that is refused after something of it
//! reached the database, or that the database failed (PostgreSQL then refuses every further
//! statement of the transaction), spoils the transaction: it is rolled back and run again
//! from the start with a savepoint around every request. Every run of a request gives the same
//! answer against the same rows, and only the answers of the last run are sent.
//!
//! Before a group's requests run, the jobs its reports name are loaded (and on PostgreSQL
//! locked) in a few set-based statements (`commands::prefetch`). Its claims run last, after
//! every other request, and share one read of the ready tasks (`commands::claim::shared`).
//!
//! On PostgreSQL other nodes write too. A request that waited too long for a row another node
//! holds (or lost a deadlock, or a unique key race) is rolled back to its savepoint and runs
//! again at the head of the next transaction, after this one has released its locks; so does
//! every request of a group whose rows or `COMMIT` met another transaction (a key taken first).
//! The transaction announces the queues that got work to the other nodes as it commits (in the
//! same round trip as its `COMMIT`). A broken connection is replaced before the next
//! transaction.
//!
//! Each transaction's outcome (committed, or the disk full, the database read-only or out of
//! reach) is stored in one atomic word for `/healthz` (see `health`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread;
use std::time::Instant;

use starbridge_core::ids::TaskId;
use starbridge_core::limits::Limits;
use tokio::sync::{mpsc, oneshot};

use crate::cache::WorkflowCache;
use crate::clock::Clock;
use crate::commands::shared_claims::{ClaimDemand, ClaimKey, GroupClaims};
use crate::ctx::{CachedReads, WriteCtx};
use crate::health::LastWrite;
use crate::jobs::{CarriedJobs, JobCache, Lifetime};
use crate::notify::Notifier;
use crate::parking::{Parked, ParkingLot};
use crate::read_ahead::ReadAhead;
use crate::{Error, Result};
use starbridge_store::Connect;
use starbridge_store::db::{Backend, Conn, LogSync};
use starbridge_store::deferred::WriteConn;
use starbridge_store::fault::WriteFault;

const MAX_BATCH: usize = 512;
/// Writer threads on PostgreSQL, each with a connection of its own, taking turns (see `run`).
const POSTGRES_WRITERS: usize = 2;
/// Fewer requests than this gathered while another writer's group runs wait for that group's
/// commit, and for the requests that come meanwhile (see `run`).
const OVERLAP_FROM: usize = 32;
/// How often a request contended by other nodes runs again before it is refused.
const MAX_TRIES: u32 = 8;

/// A queued write request as the writer thread holds it.
trait Request: Send {
    /// Runs the request in the open transaction. It may run again (its earlier run rolled back),
    /// and the result of its last run is what `answer` sends.
    fn run(&mut self, ctx: &mut WriteCtx<'_>) -> Ran;

    /// Answers the request once its transaction ended (`committed` says how).
    fn answer(self: Box<Self>, committed: &Result<()>);

    /// The task the request reports on, if it is a report: its job is loaded with the group's.
    fn task(&self) -> Option<&TaskId>;

    /// What the request claims, if it is a claim: the group's claims run last and share their
    /// read of the ready tasks (see `commands::claim::shared`).
    fn claim(&self) -> Option<&ClaimDemand>;

    /// Where the request runs among the group's claims: `None` (not a claim) before them all,
    /// then by the queues it claims, and among claims of the same queues those queued after
    /// reports of their own first.
    fn claim_turn(&self) -> Option<(&ClaimKey, bool)>;

    /// What the database's failure of its last run says about its ability to take writes.
    fn fault(&self) -> Option<WriteFault>;

    /// Counts a try: whether the request may run again, in the next transaction, after its
    /// transaction lost to another's.
    fn try_again(&mut self) -> bool;
}

/// How a run of a request went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ran {
    /// Its changes stay.
    Kept,
    /// It was refused: its changes (if any) must go.
    Refused,
    /// The database failed it: its changes must go, and without a savepoint the transaction
    /// may be unusable (PostgreSQL aborts a transaction on any failed statement).
    Failed,
    /// It met another node's transaction: undo it and run it in the next transaction.
    Again,
}

/// What the writer knows of a request before it runs it.
enum Kind {
    /// A report on a task: its job is loaded with the group's (`commands::prefetch`).
    Report(TaskId),
    /// A claim: it runs after the group's other requests (see `commands::claim::shared`);
    /// `after_reports`: queued after reports of its own (a poll carrying successes).
    Claim {
        demand: ClaimDemand,
        after_reports: bool,
    },
    Other,
}

/// A request for a `T`: the work, its last result, and where the answer goes.
struct Queued<T, F> {
    work: F,
    kind: Kind,
    result: Option<Result<T>>,
    reply_to: oneshot::Sender<Result<T>>,
    tries: u32,
}

impl<T, F> Request for Queued<T, F>
where
    T: Send,
    F: FnMut(&mut WriteCtx<'_>) -> Result<T> + Send,
{
    fn run(&mut self, ctx: &mut WriteCtx<'_>) -> Ran {
        // Lock slots the command freed for parked tasks are handed out once it is done, with
        // every job it changed back in the job cache.
        let result =
            (self.work)(ctx).and_then(|value| crate::commands::hand_out_freed(ctx).map(|()| value));
        if matches!(result, Err(Error::Contended(_))) && self.try_again() {
            return Ran::Again;
        }
        let ran = match &result {
            Ok(_) => Ran::Kept,
            Err(
                Error::Database(_)
                | Error::Contended(_)
                | Error::Unavailable(_)
                | Error::Full(_)
                | Error::ReadOnly(_),
            ) => Ran::Failed,
            Err(_) => Ran::Refused,
        };
        self.result = Some(result);
        ran
    }

    fn answer(self: Box<Self>, committed: &Result<()>) {
        let answer = match committed {
            Err(error) => Err(error.refusal()),
            Ok(()) => self.result.unwrap_or_else(|| {
                Err(Error::Unavailable(
                    "the request did not run; nothing was written".to_owned(),
                ))
            }),
        };
        let _ = self.reply_to.send(answer);
    }

    fn task(&self) -> Option<&TaskId> {
        match &self.kind {
            Kind::Report(task) => Some(task),
            _ => None,
        }
    }

    fn claim(&self) -> Option<&ClaimDemand> {
        match &self.kind {
            Kind::Claim { demand, .. } => Some(demand),
            _ => None,
        }
    }

    fn claim_turn(&self) -> Option<(&ClaimKey, bool)> {
        match &self.kind {
            Kind::Claim {
                demand,
                after_reports,
            } => Some((&demand.key, !after_reports)),
            _ => None,
        }
    }

    fn fault(&self) -> Option<WriteFault> {
        match &self.result {
            Some(Err(error)) => error.write_fault(),
            _ => None,
        }
    }

    fn try_again(&mut self) -> bool {
        if self.tries >= MAX_TRIES {
            return false;
        }
        self.tries += 1;
        self.result = None;
        true
    }
}

type Work = Box<dyn Request>;

#[derive(Clone)]
pub(crate) struct Writer {
    /// Requests sent together arrive together (see `Together`).
    sender: mpsc::UnboundedSender<Vec<Work>>,
    /// Claims of polls waiting for work, for the group that makes it ready (see `parking`).
    parked: Arc<ParkingLot<Together>>,
}

/// Requests to queue together: the writer takes them all into the same group transaction
/// (however many), in their order, each refusable on its own.
#[derive(Default)]
pub(crate) struct Together {
    works: Vec<Work>,
    /// A report was added: a claim added after it runs before the group's other claims of
    /// its queues (see `commit_batch`).
    reports: bool,
}

impl Together {
    /// Adds a report on `task` (see `Writer::enqueue_report`).
    pub(crate) fn report<T, F>(&mut self, task: TaskId, work: F) -> Pending<T>
    where
        T: Send + 'static,
        F: FnMut(&mut WriteCtx<'_>) -> Result<T> + Send + 'static,
    {
        self.reports = true;
        self.add(Kind::Report(task), work)
    }

    /// Adds a claim of `demand`: the group's claims run after its other requests, and share
    /// their read of the ready tasks (see `commands::claim::shared`).
    pub(crate) fn claim<T, F>(&mut self, demand: ClaimDemand, work: F) -> Pending<T>
    where
        T: Send + 'static,
        F: FnMut(&mut WriteCtx<'_>) -> Result<T> + Send + 'static,
    {
        let after_reports = self.reports;
        self.add(
            Kind::Claim {
                demand,
                after_reports,
            },
            work,
        )
    }

    /// Adds a request (see `Writer::enqueue`); its answer resolves once the group is sent and
    /// committed.
    fn add<T, F>(&mut self, kind: Kind, work: F) -> Pending<T>
    where
        T: Send + 'static,
        F: FnMut(&mut WriteCtx<'_>) -> Result<T> + Send + 'static,
    {
        let (reply_to, reply) = oneshot::channel::<Result<T>>();
        self.works.push(Box::new(Queued {
            work,
            kind,
            result: None,
            reply_to,
            tries: 1,
        }));
        Pending { reply: Some(reply) }
    }
}

/// What the writer has done since the store opened: counters for `/metrics` and the benchmark.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    transactions: AtomicU64,
    failed: AtomicU64,
    requests: AtomicU64,
    again: AtomicU64,
    restarts: AtomicU64,
    busy_nanos: AtomicU64,
    commit_nanos: AtomicU64,
    log_syncs: AtomicU64,
    log_sync_nanos: AtomicU64,
}

/// A reading of the writer's counters (see [`crate::Engine::writer_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Group transactions that committed.
    pub commits: u64,
    /// Group transactions that failed (every request in them was refused).
    pub failed_commits: u64,
    /// Write requests run, whatever their outcome.
    pub requests: u64,
    /// Requests rolled back to run again because another node held their rows.
    pub retried: u64,
    /// Group transactions rolled back and run again with a savepoint per request, because a
    /// request that ran without one was refused or failed after writing.
    pub restarts: u64,
    /// Time the writer spent in transactions, from `BEGIN` to the end of `COMMIT`.
    pub busy: std::time::Duration,
    /// Of that, time spent in `COMMIT` (on SQLite writing the log's frames: the log's sync
    /// comes after, see `log_syncing`).
    pub committing: std::time::Duration,
    /// SQLite with full durability: syncs of the write-ahead log (each covers every commit
    /// written before it began), on the sync thread, after the commits and beside the writer.
    pub log_syncs: u64,
    /// Time those syncs took: a commit's answer waits for one, so a sync's mean time is a
    /// floor under a lone request's latency.
    pub log_syncing: std::time::Duration,
    /// SQLite: jobs the writer's commands found read ahead, beside the writer, instead of
    /// reading them (claims of a queue deeper than the writer's job cache).
    pub jobs_read_ahead: u64,
}

impl Counters {
    pub(crate) fn read(&self) -> WriterStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        WriterStats {
            commits: load(&self.transactions),
            failed_commits: load(&self.failed),
            requests: load(&self.requests),
            retried: load(&self.again),
            restarts: load(&self.restarts),
            busy: std::time::Duration::from_nanos(load(&self.busy_nanos)),
            committing: std::time::Duration::from_nanos(load(&self.commit_nanos)),
            log_syncs: load(&self.log_syncs),
            log_syncing: std::time::Duration::from_nanos(load(&self.log_sync_nanos)),
            jobs_read_ahead: 0,
        }
    }
}

fn add_elapsed(counter: &AtomicU64, since: Instant) {
    let nanos = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
    counter.fetch_add(nanos, Ordering::Relaxed);
}

/// What the writer thread works with besides its connection.
pub(crate) struct Shared {
    pub(crate) connect: Connect,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) workflows: Arc<WorkflowCache>,
    pub(crate) notifier: Arc<Notifier>,
    /// This node's id in announcements to other nodes.
    pub(crate) node: String,
    /// What the engine enforces on every job (fan-out width, task input size).
    pub(crate) limits: Limits,
    pub(crate) counters: Arc<Counters>,
    /// Where each group transaction's outcome goes, for health.
    pub(crate) last_write: Arc<LastWrite>,
    /// Where the spans a committed transaction ended go, while tracing is on.
    pub(crate) spans: Arc<std::sync::OnceLock<Arc<crate::traces::SpanSink>>>,
    /// The claims of polls waiting for work (see `parking`).
    pub(crate) parked: Arc<ParkingLot<Together>>,
    /// On SQLite: the jobs read ahead for the writer's claims (see `read_ahead`).
    pub(crate) read_ahead: Option<Arc<ReadAhead>>,
}

impl Writer {
    pub(crate) fn start(conn: Box<dyn Conn>, shared: Shared) -> Writer {
        let (sender, receiver) = mpsc::unbounded_channel();
        let parked = shared.parked.clone();
        let writers = match conn.backend() {
            Backend::Sqlite => 1,
            Backend::Postgres => POSTGRES_WRITERS,
        };
        let turns = Arc::new(Turns {
            queue: Mutex::new(receiver),
            committing: Mutex::new(0),
            committed: Condvar::new(),
            carried: Arc::default(),
        });
        let shared = Arc::new(shared);
        let syncs = conn.log_sync().map(|_| {
            let (sender, receiver) = std_mpsc::channel();
            let unanswered = Arc::new(AtomicUsize::new(0));
            let (shared, answered) = (shared.clone(), unanswered.clone());
            thread::Builder::new()
                .name("starbridge-sync".to_owned())
                .spawn(move || sync_and_answer(&receiver, &answered, &shared))
                .expect("spawning the log sync thread");
            Syncs { sender, unanswered }
        });
        let mut conn = Some(conn);
        for _ in 0..writers {
            let (first, turns, shared) = (conn.take(), turns.clone(), shared.clone());
            let syncs = syncs.clone();
            thread::Builder::new()
                .name("starbridge-writer".to_owned())
                .spawn(move || {
                    // The other writers' connections open on their own threads (a blocking
                    // client must not open on the caller's async runtime).
                    let conn = match first.map_or_else(|| (shared.connect)(), Ok) {
                        Ok(conn) => conn,
                        Err(error) => {
                            tracing::warn!(%error, "one writer fewer: its connection did not open");
                            return;
                        }
                    };
                    run(conn, &turns, &shared, syncs.as_ref());
                })
                .expect("spawning a writer thread");
        }
        Writer { sender, parked }
    }

    /// Parks `claim` (a claim of up to `max` tasks from `queues`, alone in its `Together`) for
    /// the group transaction that makes work ready on one of the queues (see `parking`).
    pub(crate) fn park(
        &self,
        namespace: &str,
        queues: &[String],
        max: u32,
        claim: Together,
    ) -> Arc<Parked<Together>> {
        self.parked.park(namespace, queues, max, claim)
    }

    /// How many claims of waiting polls are parked on a queue.
    #[cfg(test)]
    pub(crate) fn parked_claims(&self, namespace: &str, queue: &str) -> usize {
        self.parked.waiting(namespace, queue)
    }

    /// Runs `work` in the next group transaction; resolves once it is committed. `work` may run
    /// more than once (its earlier runs rolled back) when other nodes contend for its rows.
    pub(crate) async fn write<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut WriteCtx<'_>) -> Result<T> + Send + 'static,
    {
        self.enqueue(work).answer().await
    }

    /// Queues `work` for the next group transaction at once (requests queued together commit
    /// together, each refusable on its own); the answer resolves once it is committed.
    pub(crate) fn enqueue<T, F>(&self, work: F) -> Pending<T>
    where
        T: Send + 'static,
        F: FnMut(&mut WriteCtx<'_>) -> Result<T> + Send + 'static,
    {
        self.enqueue_on(Kind::Other, work)
    }

    /// Queues a report on `task` (see `enqueue`); the group it joins loads the task's job with
    /// the jobs of its other reports.
    pub(crate) fn enqueue_report<T, F>(&self, task: TaskId, work: F) -> Pending<T>
    where
        T: Send + 'static,
        F: FnMut(&mut WriteCtx<'_>) -> Result<T> + Send + 'static,
    {
        self.enqueue_on(Kind::Report(task), work)
    }

    fn enqueue_on<T, F>(&self, kind: Kind, work: F) -> Pending<T>
    where
        T: Send + 'static,
        F: FnMut(&mut WriteCtx<'_>) -> Result<T> + Send + 'static,
    {
        let mut together = Together::default();
        let pending = together.add(kind, work);
        if self.send(together) {
            pending
        } else {
            Pending { reply: None }
        }
    }

    /// Queues requests for the same group transaction (see `Together`); false when the writer
    /// had stopped (then each answer is a refusal, and nothing was written).
    pub(crate) fn send(&self, together: Together) -> bool {
        self.sender.send(together.works).is_ok()
    }
}

/// The answer to a queued write request.
pub(crate) struct Pending<T> {
    /// `None` when the writer had stopped before the request was queued.
    reply: Option<oneshot::Receiver<Result<T>>>,
}

impl<T> Pending<T> {
    /// Waits until the request is committed (or refused).
    pub(crate) async fn answer(self) -> Result<T> {
        let reply = self.reply.ok_or(Error::Closed)?;
        reply.await.map_err(|_| {
            Error::Unavailable(
                "the database could not start a transaction; nothing was written".to_owned(),
            )
        })?
    }
}

/// Waits for the answers of requests queued together, in their order.
pub(crate) async fn answers<T>(pending: Vec<Pending<T>>) -> Vec<Result<T>> {
    let mut answers = Vec::with_capacity(pending.len());
    for request in pending {
        answers.push(request.answer().await);
    }
    answers
}

/// The connection to write with: the current one, or a new one when it broke.
fn usable(conn: &mut Option<WriteConn>, connect: &Connect) -> Result<()> {
    if conn.as_ref().is_some_and(|conn| conn.is_usable()) {
        return Ok(());
    }
    *conn = None;
    let fresh = connect()?;
    tracing::info!("write connection (re)opened");
    *conn = Some(WriteConn::new(fresh));
    Ok(())
}

/// What the writer thread keeps between requests besides its connection.
struct State {
    jobs: JobCache,
    reads: CachedReads,
    claims: GroupClaims,
}

/// The queue of write requests.
type Queue = mpsc::UnboundedReceiver<Vec<Work>>;

/// What the writer threads share to take turns (see `run`).
struct Turns {
    /// Held by the writer whose turn it is to gather a group and run its requests.
    queue: Mutex<Queue>,
    /// How many groups are past their requests: writing their rows and committing.
    committing: Mutex<usize>,
    /// Signalled as each of those ends.
    committed: Condvar,
    /// The jobs the writers' committed transactions carried over (PostgreSQL; see `jobs`).
    carried: Arc<Mutex<CarriedJobs>>,
}

impl Turns {
    /// No request waits in the queue (false while another writer holds it).
    fn nothing_queued(&self) -> bool {
        self.queue.try_lock().is_ok_and(|queue| queue.is_empty())
    }

    /// Waits until no other writer's group is writing its rows or committing.
    fn wait_for_commits(&self) {
        let committing = self
            .committing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        drop(
            self.committed
                .wait_while(committing, |committing| *committing > 0)
                .unwrap_or_else(PoisonError::into_inner),
        );
    }
}

/// A writer's turn: the queue, until its group's requests ran.
struct Turn<'a> {
    queue: Option<MutexGuard<'a, Queue>>,
    turns: &'a Turns,
}

impl<'a> Turn<'a> {
    /// Hands the queue on to the next writer as the group's rows are about to be written; the
    /// group counts as committing until what this returns is dropped.
    fn pass(&mut self) -> Committing<'a> {
        *self
            .turns
            .committing
            .lock()
            .unwrap_or_else(PoisonError::into_inner) += 1;
        self.queue = None;
        Committing(self.turns)
    }
}

/// A group writing its rows and committing (see `Turn::pass`).
struct Committing<'a>(&'a Turns);

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        *self
            .0
            .committing
            .lock()
            .unwrap_or_else(PoisonError::into_inner) -= 1;
        self.0.committed.notify_all();
    }
}

/// A writer thread. On PostgreSQL several take turns: the one holding the queue gathers a group
/// and runs its requests, and hands the queue on once they ran, so the next group runs while
/// this one's rows are written and committed (the database keeps them apart as it keeps other
/// nodes' transactions apart: row locks, `SKIP LOCKED`). A group that gathered few requests
/// meanwhile first waits for that commit, and takes the requests that came in the meantime, as
/// one writer would: groups too small to be worth their fixed statements would cost more than
/// the overlap gains when requests come one by one.
fn run(conn: Box<dyn Conn>, turns: &Turns, shared: &Shared, syncs: Option<&Syncs>) {
    // On SQLite this thread makes every change, so what it cached is what is stored; on
    // PostgreSQL a job or a setting stays cached only while the transaction that read it runs.
    let (lifetime, carried, read_ahead) = match conn.backend() {
        Backend::Sqlite => (Lifetime::Store, None, shared.read_ahead.clone()),
        Backend::Postgres => (Lifetime::Transaction, Some(turns.carried.clone()), None),
    };
    let mut state = State {
        jobs: JobCache::new(lifetime, carried, read_ahead),
        reads: CachedReads::new(lifetime),
        claims: GroupClaims::default(),
    };
    let mut conn = Some(WriteConn::new(conn));
    let mut batch: Vec<Work> = Vec::with_capacity(MAX_BATCH);
    let mut again: Vec<Work> = Vec::new();
    loop {
        let mut queue = if again.is_empty() {
            let mut queue = turns.queue.lock().unwrap_or_else(PoisonError::into_inner);
            match queue.blocking_recv() {
                Some(first) => batch.extend(first),
                None => return,
            }
            Some(queue)
        } else {
            batch.append(&mut again);
            // Requests to run again do not wait for the queue while another writer holds it
            // (it may be waiting for requests): they run as a group of their own, which the
            // database keeps apart from that writer's as it would another node's.
            match turns.queue.try_lock() {
                Ok(queue) => Some(queue),
                Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            }
        };
        if let Some(queue) = queue.as_mut() {
            gather(queue, &mut batch);
            if batch.len() < OVERLAP_FROM {
                turns.wait_for_commits();
                gather(queue, &mut batch);
            }
        }
        if let Err(error) = usable(&mut conn, &shared.connect) {
            // Dropping the requests answers each with `Error::Unavailable`; nothing was written.
            tracing::error!(%error, "no write connection");
            let fault = error.write_fault().unwrap_or(WriteFault::Unavailable);
            shared.last_write.record(shared.clock.now(), Some(fault));
            batch.clear();
            continue;
        }
        let Some(conn) = conn.as_mut() else {
            continue;
        };
        let turn = Turn { queue, turns };
        commit_batch(
            conn, &mut batch, &mut again, &mut state, shared, turn, syncs,
        );
        state.jobs.transaction_ended();
        state.reads.transaction_ended();
    }
}

/// Adds the requests queued now to `batch`, up to `MAX_BATCH` (requests sent together stay
/// together, even past it).
fn gather(queue: &mut Queue, batch: &mut Vec<Work>) {
    while batch.len() < MAX_BATCH {
        match queue.try_recv() {
            Ok(works) => batch.extend(works),
            Err(_) => break,
        }
    }
}

/// The way to the sync thread: the commits whose log is not synced yet, and how many of them
/// it has not answered.
#[derive(Clone)]
struct Syncs {
    sender: std_mpsc::Sender<Unsynced>,
    unanswered: Arc<AtomicUsize>,
}

impl Syncs {
    /// Hands `commit` to the sync thread; gives it back when the thread has ended.
    fn send(&self, commit: Unsynced) -> Option<Unsynced> {
        self.unanswered.fetch_add(1, Ordering::SeqCst);
        let unsent = self.sender.send(commit).err().map(|unsent| unsent.0);
        if unsent.is_some() {
            self.unanswered.fetch_sub(1, Ordering::SeqCst);
        }
        unsent
    }

    /// Every commit handed over was answered: the thread waits for the next.
    fn idle(&self) -> bool {
        self.unanswered.load(Ordering::SeqCst) == 0
    }
}

/// A commit's requests to answer once its log is synced.
struct Unsynced {
    log: Arc<dyn LogSync>,
    requests: Vec<Work>,
    /// It wrote webhook deliveries: the deliverer is woken once they are durable.
    deliveries: bool,
    /// What it tells health once synced (see `outcome`).
    outcome: Option<Option<WriteFault>>,
}

/// The sync thread: takes every commit waiting, syncs the log once for all of them, and
/// answers their requests (counting them off `unanswered`).
fn sync_and_answer(
    commits: &std_mpsc::Receiver<Unsynced>,
    unanswered: &AtomicUsize,
    shared: &Shared,
) {
    while let Ok(first) = commits.recv() {
        let mut waiting = vec![first];
        waiting.extend(commits.try_iter());
        let count = waiting.len();
        answer_synced(shared, waiting);
        unanswered.fetch_sub(count, Ordering::SeqCst);
    }
}

/// Syncs the log of `commits` (the last one's sync covers the others) and answers their
/// requests: each with its commit, once durable, or with the sync's failure. Health hears of
/// the last commit's outcome, or of the sync's fault. A failed sync leaves their changes in the
/// log unsynced: they are answered as failed (the caller may send them again).
fn answer_synced(shared: &Shared, commits: Vec<Unsynced>) {
    let Some(last) = commits.last() else {
        return;
    };
    let syncing = Instant::now();
    let synced = last.log.sync();
    add_elapsed(&shared.counters.log_sync_nanos, syncing);
    shared.counters.log_syncs.fetch_add(1, Ordering::Relaxed);
    let health = match &synced {
        Ok(()) => commits.iter().rev().find_map(|commit| commit.outcome),
        Err(error) => {
            tracing::error!(%error, "the write-ahead log could not be synced; its commits are refused");
            Some(Some(error.write_fault().unwrap_or(WriteFault::Unavailable)))
        }
    };
    if let Some(fault) = health {
        shared.last_write.record(shared.clock.now(), fault);
    }
    let deliveries = commits.iter().any(|commit| commit.deliveries);
    for commit in commits {
        for request in commit.requests {
            request.answer(&synced);
        }
    }
    if synced.is_ok() && deliveries {
        shared.notifier.deliveries_changed();
    }
}

/// Runs one group transaction over `batch` and answers its requests (through `syncs`, the
/// sync thread, when its log is synced afterwards); those to run again go to `again`. The
/// queue (`turn`) goes to the next writer once the requests ran.
fn commit_batch(
    conn: &mut WriteConn,
    batch: &mut Vec<Work>,
    again: &mut Vec<Work>,
    state: &mut State,
    shared: &Shared,
    mut turn: Turn<'_>,
    syncs: Option<&Syncs>,
) {
    let started = Instant::now();
    let counters = &shared.counters;
    // Claims run last, those of the same queues one after another, sharing their read of the
    // ready tasks (see `commands::claim::shared`); of those, a poll's claim that follows its own
    // reports goes first, so the work its reports made ready (its job's next step) is its own,
    // not a waiting poll's that happens to claim in the same group. The sort is stable: the
    // other requests keep their order, and claims of one turn the order they came in.
    batch.sort_by(|a, b| a.claim_turn().cmp(&b.claim_turn()));
    let mut transaction = match run_transaction(conn, batch, Guard::None, state, shared, &mut turn)
    {
        Attempt::Ended(transaction) => transaction,
        Attempt::Spoiled => {
            counters.restarts.fetch_add(1, Ordering::Relaxed);
            match run_transaction(conn, batch, Guard::Every, state, shared, &mut turn) {
                Attempt::Ended(transaction) => transaction,
                Attempt::Spoiled => unreachable!("every request ran under a savepoint"),
            }
        }
    };
    add_elapsed(&counters.busy_nanos, started);
    if transaction.committed.is_ok() {
        state.jobs.committed();
    }
    // With the parked claims the group took on (see `hand_over_parked`).
    counters
        .requests
        .fetch_add(batch.len() as u64, Ordering::Relaxed);
    let committed = &transaction.committed;
    // A commit whose log is synced afterwards is answered once it is (see `answer_synced`),
    // and tells health how it went once the sync did.
    let log = match committed {
        Ok(()) => conn.raw().log_sync(),
        Err(_) => None,
    };
    let outcome = outcome(committed, &transaction.ran, batch);
    if log.is_none()
        && let Some(fault) = outcome
    {
        shared.last_write.record(shared.clock.now(), fault);
    }
    match committed {
        Ok(()) => &counters.transactions,
        Err(_) => &counters.failed,
    }
    .fetch_add(1, Ordering::Relaxed);
    if let Err(error) = committed {
        if matches!(error, Error::Contended(_)) {
            tracing::debug!(%error, "group lost to another transaction; its requests run again");
        } else {
            tracing::error!(%error, "group commit failed; every request in it is refused");
        }
        let _ = conn.raw().batch("ROLLBACK");
        conn.discard();
        shared.workflows.clear();
        state.jobs.clear();
        state.reads.clear();
        transaction.wakes.clear();
        transaction.wakes_later.clear();
    }
    // Polls woken for work made ready for later wait for its time. The polls are woken before
    // the answers go out, so a request answered has woken whom it woke.
    let mut wakes = std::mem::take(&mut transaction.wakes);
    wakes.append(&mut transaction.wakes_later);
    // Many requests of a batch wake the same queue: wake each once.
    wakes.sort_unstable();
    wakes.dedup();
    for (namespace, queue) in wakes {
        shared.notifier.wake(&namespace, &queue);
    }
    let mut unsynced = Vec::new();
    for (mut request, ran) in batch.drain(..).zip(transaction.ran) {
        let run_again = match committed {
            Ok(()) => ran == Ran::Again,
            // Writing its rows or committing met another transaction (a key another node or
            // writer took first, a lock held too long): nothing of the group stays, and each
            // of its requests runs again from the start, as long as it has tries left.
            Err(Error::Contended(_)) => request.try_again(),
            // The database is in trouble: requests set to run again are refused too.
            Err(_) => false,
        };
        if run_again {
            counters.again.fetch_add(1, Ordering::Relaxed);
            again.push(request);
        } else if log.is_some() {
            unsynced.push(request);
        } else {
            request.answer(committed);
        }
    }
    if committed.is_ok() {
        shared.notifier.timers_changed();
    }
    let deliveries = committed.is_ok() && transaction.deliveries;
    match log {
        Some(log) => {
            let commit = Unsynced {
                log,
                requests: unsynced,
                deliveries,
                outcome,
            };
            // The writer syncs itself when nothing waits for it (no request queued or to run
            // again) and the sync thread has nothing to answer: handing the commit over would
            // only add the thread's wake-up to the requests' wait. Without the sync thread (it
            // ended: the process is going down) the writer syncs too.
            let unsent = match syncs {
                Some(syncs)
                    if !(syncs.idle() && again.is_empty() && turn.turns.nothing_queued()) =>
                {
                    syncs.send(commit)
                }
                _ => Some(commit),
            };
            if let Some(commit) = unsent {
                answer_synced(shared, vec![commit]);
            }
        }
        None if deliveries => shared.notifier.deliveries_changed(),
        None => {}
    }
    if committed.is_ok()
        && let Some(sink) = shared.spans.get()
    {
        for span in transaction.spans {
            sink.send(span);
        }
    }
}

/// What a group transaction says about the database's ability to take writes, for health:
/// `Some(None)` it takes them, `Some(Some(fault))` it does not, `None` nothing either way (the
/// commit lost to another node). A committed group still tells of a fault when one of its
/// requests failed for want of space or because the database is read-only.
fn outcome(committed: &Result<()>, ran: &[Ran], batch: &[Work]) -> Option<Option<WriteFault>> {
    match committed {
        Ok(()) => Some(
            ran.iter()
                .zip(batch)
                .filter(|(ran, _)| **ran == Ran::Failed)
                .find_map(|(_, request)| {
                    request
                        .fault()
                        .filter(|fault| *fault != WriteFault::Unavailable)
                }),
        ),
        Err(Error::Contended(_)) => None,
        Err(error) => Some(Some(error.write_fault().unwrap_or(WriteFault::Unavailable))),
    }
}

/// Which requests of a transaction run under a savepoint of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guard {
    /// None: a request that is refused after writing (or that the database failed) spoils the
    /// transaction.
    None,
    /// Every one (after a spoiled attempt).
    Every,
}

/// A group transaction that ran to its end: how each request ran, what to wake, and whether it
/// committed.
struct Transaction {
    ran: Vec<Ran>,
    /// Queues its kept requests made tasks ready on, to claim now (see `WriteCtx::wakes`).
    wakes: Vec<(String, String)>,
    /// Queues its kept requests made tasks ready on, to claim later.
    wakes_later: Vec<(String, String)>,
    /// The spans its kept requests ended (noted only while tracing is on).
    spans: Vec<crate::traces::FinishedSpan>,
    deliveries: bool,
    committed: Result<()>,
}

enum Attempt {
    Ended(Transaction),
    /// A request without a savepoint was refused after writing, or failed in the database:
    /// the transaction was rolled back, and nothing of it stays (in the database, the rows
    /// held back or the caches).
    Spoiled,
}

/// Rolls a spoiled transaction back and forgets everything it left in memory.
fn spoil(conn: &mut WriteConn, state: &mut State, shared: &Shared) -> Attempt {
    let _ = conn.raw().batch("ROLLBACK");
    conn.discard();
    shared.workflows.clear();
    state.jobs.clear();
    state.reads.clear();
    Attempt::Spoiled
}

fn context<'a>(conn: &'a mut WriteConn, state: &'a mut State, shared: &'a Shared) -> WriteCtx<'a> {
    WriteCtx {
        conn,
        now: shared.clock.now(),
        workflows: &shared.workflows,
        jobs: &mut state.jobs,
        reads: &mut state.reads,
        claims: &mut state.claims,
        wakes: Vec::new(),
        wakes_later: Vec::new(),
        spans: Vec::new(),
        tracing: shared.spans.get().is_some(),
        freed_locks: Vec::new(),
        deliveries: false,
        limits: shared.limits,
        loaded_workflows: Vec::new(),
    }
}

/// Adds to the group's claims (from `claims_from` on, in their turn) the parked claims of polls
/// waiting for work (see `parking`) that the work its kept requests made ready calls for: on each
/// woken queue, claims for as many tasks as jobs got work there, less what the group's own claims
/// of the queue may take.
fn hand_over_parked(
    batch: &mut Vec<Work>,
    claims_from: usize,
    wakes: &[(String, String)],
    parked: &ParkingLot<Together>,
) {
    if wakes.is_empty() {
        return;
    }
    let mut ready: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for (namespace, queue) in wakes {
        *ready.entry((namespace, queue)).or_default() += 1;
    }
    for demand in batch[claims_from..]
        .iter()
        .filter_map(|request| request.claim())
    {
        for ((namespace, queue), left) in &mut ready {
            if demand.key.namespace == *namespace && demand.key.queues.iter().any(|q| q == queue) {
                *left = left.saturating_sub(u64::from(demand.max));
            }
        }
    }
    let before = batch.len();
    for ((namespace, queue), tasks) in ready {
        if tasks > 0 {
            for claim in parked.take(namespace, queue, tasks) {
                batch.extend(claim.works);
            }
        }
    }
    if batch.len() > before {
        batch[claims_from..].sort_by(|a, b| a.claim_turn().cmp(&b.claim_turn()));
    }
}

/// Runs every request of `batch` in one transaction and commits it; hands the queue (`turn`)
/// on once the requests ran, before their rows are written.
fn run_transaction(
    conn: &mut WriteConn,
    batch: &mut Vec<Work>,
    guard: Guard,
    state: &mut State,
    shared: &Shared,
    turn: &mut Turn<'_>,
) -> Attempt {
    let mut transaction = Transaction {
        ran: Vec::with_capacity(batch.len()),
        wakes: Vec::new(),
        wakes_later: Vec::new(),
        spans: Vec::new(),
        deliveries: false,
        committed: Ok(()),
    };
    if let Err(error) = conn.begin_write() {
        tracing::error!(%error, "cannot begin a write transaction");
        transaction.ran = vec![Ran::Refused; batch.len()];
        transaction.committed = Err(error);
        return Attempt::Ended(transaction);
    }
    if guard == Guard::None {
        let reported: Vec<TaskId> = batch
            .iter()
            .filter_map(|request| request.task().cloned())
            .collect();
        if !reported.is_empty() {
            let mut ctx = context(conn, state, shared);
            if let Err(error) = crate::commands::prefetch(&mut ctx, &reported) {
                tracing::debug!(%error, "loading the group's jobs failed; running it again");
                return spoil(conn, state, shared);
            }
        }
    }
    // A failed savepoint command leaves the transaction unusable: then nothing may commit.
    let mut broken: Option<Error> = None;
    // A request's savepoint is closed in the same round trip that opens the next one's (one
    // round trip fewer per request on PostgreSQL); the last one is closed on its own.
    let mut close: Option<&str> = None;
    // The claims (sorted last) begin at this request, or at the end.
    let mut claims_begun = false;
    let mut next = 0;
    while next < batch.len() || !claims_begun {
        if !claims_begun
            && batch
                .get(next)
                .is_none_or(|request| request.claim().is_some())
        {
            claims_begun = true;
            if broken.is_none() {
                hand_over_parked(batch, next, &transaction.wakes, &shared.parked);
            }
            state
                .claims
                .begin(batch[next..].iter().filter_map(|request| request.claim()));
            continue;
        }
        let request = &mut batch[next];
        next += 1;
        if broken.is_some() {
            transaction.ran.push(Ran::Refused);
            continue;
        }
        if guard == Guard::Every {
            // What earlier requests held back goes out before this one's savepoint opens, so a
            // rollback to it cannot take their rows along.
            let open = match close.take() {
                Some(close) => format!("{close}; SAVEPOINT request"),
                None => "SAVEPOINT request".to_owned(),
            };
            if let Err(error) = conn.flush().and_then(|()| conn.raw().batch(&open)) {
                broken = Some(error);
                transaction.ran.push(Ran::Refused);
                continue;
            }
        }
        if request.claim().is_none() {
            state.claims.forget();
        }
        let (mark, writes_before) = (conn.mark(), conn.writes());
        let mut ctx = context(conn, state, shared);
        let ran = request.run(&mut ctx);
        let (mut wakes, mut wakes_later, mut spans, deliveries, loaded) = (
            ctx.wakes,
            ctx.wakes_later,
            ctx.spans,
            ctx.deliveries,
            ctx.loaded_workflows,
        );
        if ran == Ran::Kept {
            transaction.wakes.append(&mut wakes);
            transaction.wakes_later.append(&mut wakes_later);
            transaction.spans.append(&mut spans);
            transaction.deliveries |= deliveries;
            state.jobs.request_kept();
        } else {
            state.jobs.request_rolled_back();
            state.claims.forget();
            shared.workflows.forget(&loaded);
            // What it read after changing a setting goes with its changes.
            state.reads.clear();
            let wrote = conn.writes() != writes_before;
            if guard == Guard::None && (wrote || ran != Ran::Refused) {
                tracing::debug!(?ran, wrote, "a request spoiled its group; running it again");
                return spoil(conn, state, shared);
            }
            conn.discard_since(mark);
        }
        if guard == Guard::Every {
            close = Some(if ran == Ran::Kept {
                "RELEASE request"
            } else {
                "ROLLBACK TO request; RELEASE request"
            });
        }
        transaction.ran.push(ran);
    }
    let _committing = turn.pass();
    if broken.is_none()
        && let Err(error) = conn.flush()
    {
        broken = Some(error);
    }
    if broken.is_none()
        && let Some(close) = close
        && let Err(error) = conn.raw().batch(close)
    {
        broken = Some(error);
    }
    // A queue whose ready tasks the group's claims all took has nothing for a poll woken now,
    // here or on another node (only claims ran after the requests that made work ready, and
    // claims make none), if every request stayed (a claim rolled back took nothing).
    let all_kept = transaction.ran.iter().all(|ran| *ran == Ran::Kept);
    transaction
        .wakes
        .retain(|(namespace, queue)| !(all_kept && state.claims.took_all(namespace, queue)));
    let announcements = match (&broken, conn.backend()) {
        (None, Backend::Postgres) => crate::loops::listener::announcements(
            &shared.node,
            transaction.wakes.iter().chain(&transaction.wakes_later),
            transaction.deliveries,
        ),
        _ => Vec::new(),
    };
    let committing = Instant::now();
    transaction.committed = match broken {
        Some(error) => Err(error),
        // Only a transaction without savepoints: rows a savepoint wrote carry its own id.
        None if guard == Guard::None && state.jobs.would_carry() => {
            conn.commit_identified(&announcements).map(|id| {
                if let Some(id) = id {
                    state.jobs.carry_over(id);
                }
            })
        }
        None => conn.commit(&announcements),
    };
    add_elapsed(&shared.counters.commit_nanos, committing);
    Attempt::Ended(transaction)
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::clock::SystemClock;
    use starbridge_store::sqlite::SqliteConn;

    /// A writer on a fresh SQLite file, with its counters and the file's path.
    fn sqlite_writer(dir: &tempfile::TempDir) -> (Writer, Arc<Counters>, PathBuf) {
        let path = migrated(dir);
        let conn = SqliteConn::open(&path).unwrap();
        let (writer, counters) = start_writer(Box::new(conn), &path);
        (writer, counters, path)
    }

    /// A fresh SQLite file with the store's schema.
    fn migrated(dir: &tempfile::TempDir) -> PathBuf {
        let path = dir.path().join("writer.db");
        SqliteConn::open(&path).unwrap().migrate(0).unwrap();
        path
    }

    /// A writer on `conn`, a connection to the SQLite file at `path`, with its counters.
    fn start_writer(conn: Box<dyn Conn>, path: &Path) -> (Writer, Arc<Counters>) {
        let file = path.to_owned();
        let connect: Connect =
            Arc::new(move || SqliteConn::open(&file).map(|conn| Box::new(conn) as Box<dyn Conn>));
        let counters = Arc::new(Counters::default());
        let writer = Writer::start(
            conn,
            Shared {
                connect,
                clock: Arc::new(SystemClock),
                workflows: Arc::default(),
                notifier: Arc::default(),
                node: "test".to_owned(),
                limits: Limits::default(),
                counters: counters.clone(),
                last_write: Arc::default(),
                spans: Arc::default(),
                parked: Arc::default(),
                read_ahead: None,
            },
        );
        (writer, counters)
    }

    /// Holds the writer inside a transaction until the returned sender is dropped, so that
    /// requests queued meanwhile share the next group transaction.
    fn hold_writer(writer: &Writer) -> (std_mpsc::Sender<()>, Pending<()>) {
        let (release, held) = std_mpsc::channel::<()>();
        let (entered, inside) = std_mpsc::channel::<()>();
        let held = std::sync::Mutex::new(held);
        let pending = writer.enqueue(move |_ctx| {
            let _ = entered.send(());
            let _ = held.lock().unwrap().recv();
            Ok(())
        });
        inside.recv().unwrap();
        (release, pending)
    }

    /// A log sync that waits, the first time, until the test lets it go, and notes the thread
    /// each sync ran on.
    struct HeldSync {
        entered: Mutex<Option<std_mpsc::Sender<()>>>,
        release: Mutex<std_mpsc::Receiver<()>>,
        threads: Mutex<Vec<String>>,
    }

    impl HeldSync {
        /// A sync held until `release` sends or drops; `entered` hears when it began.
        fn new() -> (Arc<HeldSync>, std_mpsc::Receiver<()>, std_mpsc::Sender<()>) {
            let (entered, sync_entered) = std_mpsc::channel();
            let (release, released) = std_mpsc::channel();
            let log = Arc::new(HeldSync {
                entered: Mutex::new(Some(entered)),
                release: Mutex::new(released),
                threads: Mutex::default(),
            });
            (log, sync_entered, release)
        }
    }

    impl LogSync for HeldSync {
        fn sync(&self) -> starbridge_store::Result<()> {
            let thread = std::thread::current().name().unwrap_or_default().to_owned();
            self.threads.lock().unwrap().push(thread);
            if let Some(entered) = self.entered.lock().unwrap().take() {
                entered.send(()).unwrap();
                let _ = self.release.lock().unwrap().recv();
            }
            Ok(())
        }
    }

    /// A SQLite connection whose commits are made durable by `HeldSync`.
    struct HeldSyncConn {
        conn: SqliteConn,
        log: Arc<HeldSync>,
    }

    impl Conn for HeldSyncConn {
        fn backend(&self) -> Backend {
            Backend::Sqlite
        }
        fn execute(
            &mut self,
            sql: &str,
            args: &[starbridge_store::db::Arg<'_>],
        ) -> starbridge_store::Result<u64> {
            self.conn.execute(sql, args)
        }
        fn query(
            &mut self,
            sql: &str,
            args: &[starbridge_store::db::Arg<'_>],
        ) -> starbridge_store::Result<Vec<starbridge_store::db::Row>> {
            self.conn.query(sql, args)
        }
        fn batch(&mut self, sql: &str) -> starbridge_store::Result<()> {
            self.conn.batch(sql)
        }
        fn lock_key(&mut self, key: &str) -> starbridge_store::Result<()> {
            self.conn.lock_key(key)
        }
        fn begin_write(&mut self) -> starbridge_store::Result<()> {
            self.conn.begin_write()
        }
        fn commit(&mut self, announcements: &[String]) -> starbridge_store::Result<()> {
            self.conn.commit(announcements)
        }
        fn is_usable(&self) -> bool {
            self.conn.is_usable()
        }
        fn log_sync(&self) -> Option<Arc<dyn LogSync>> {
            Some(self.log.clone())
        }
    }

    /// A writer on a fresh SQLite file whose log syncs are `HeldSync`'s.
    struct HeldSyncWriter {
        writer: Writer,
        path: PathBuf,
        log: Arc<HeldSync>,
        /// Hears when the first sync began.
        sync_entered: std_mpsc::Receiver<()>,
        /// Lets the first sync end.
        release: std_mpsc::Sender<()>,
    }

    fn held_sync_writer(dir: &tempfile::TempDir) -> HeldSyncWriter {
        let path = migrated(dir);
        let (log, sync_entered, release) = HeldSync::new();
        let conn = HeldSyncConn {
            conn: SqliteConn::open(&path).unwrap(),
            log: log.clone(),
        };
        let (writer, _) = start_writer(Box::new(conn), &path);
        HeldSyncWriter {
            writer,
            path,
            log,
            sync_entered,
            release,
        }
    }

    impl HeldSyncWriter {
        /// Waits until the first sync began.
        fn wait_for_sync(&self) {
            self.sync_entered
                .recv_timeout(std::time::Duration::from_secs(60))
                .expect("a commit's log is synced");
        }

        /// The threads the syncs ran on, in order.
        fn sync_threads(&self) -> Vec<String> {
            self.log.threads.lock().unwrap().clone()
        }
    }

    fn assert_unanswered<T>(pending: &mut Pending<T>) {
        let reply = pending.reply.as_mut().unwrap();
        assert!(
            matches!(reply.try_recv(), Err(oneshot::error::TryRecvError::Empty)),
            "not answered while its log's sync runs"
        );
    }

    /// A commit whose log is synced afterwards is answered only once the sync ended; when
    /// requests wait, the sync thread syncs it and the writer commits the next group meanwhile.
    #[tokio::test]
    async fn a_commit_is_answered_once_its_log_is_synced_and_the_next_group_commits_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let held = held_sync_writer(&dir);
        let (release_writer, mut first) = hold_writer(&held.writer);
        let next = held.writer.enqueue(|ctx| insert_namespace(ctx, "next"));
        drop(release_writer);
        held.wait_for_sync();
        while !namespaces(&held.path).contains(&"next".to_owned()) {
            tokio::task::yield_now().await;
        }
        assert_unanswered(&mut first);
        held.release.send(()).unwrap();
        first.answer().await.unwrap();
        next.answer().await.unwrap();
        assert_eq!(
            held.sync_threads().first().map(String::as_str),
            Some("starbridge-sync"),
            "a request waited: the sync thread synced"
        );
    }

    /// A commit that nothing waits behind is synced by the writer itself, and answered once the
    /// sync ended.
    #[tokio::test]
    async fn the_writer_syncs_a_commit_itself_when_no_request_waits() {
        let dir = tempfile::tempdir().unwrap();
        let held = held_sync_writer(&dir);
        let mut alone = held.writer.enqueue(|ctx| insert_namespace(ctx, "alone"));
        held.wait_for_sync();
        assert!(
            namespaces(&held.path).contains(&"alone".to_owned()),
            "committed"
        );
        assert_unanswered(&mut alone);
        held.release.send(()).unwrap();
        alone.answer().await.unwrap();
        assert_eq!(
            held.sync_threads(),
            ["starbridge-writer"],
            "nothing waited: the writer synced"
        );
    }

    fn insert_namespace(ctx: &mut WriteCtx<'_>, name: &str) -> Result<()> {
        starbridge_store::rows::ensure_namespace(ctx.conn, name, ctx.now)
    }

    /// The first column of what `sql` selects from the database file, behind the writer's back.
    fn strings(path: &Path, sql: &str) -> Vec<String> {
        let conn = rusqlite::Connection::open(path).unwrap();
        let mut statement = conn.prepare(sql).unwrap();
        statement
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    fn namespaces(path: &Path) -> Vec<String> {
        strings(path, "SELECT name FROM namespaces ORDER BY name")
    }

    #[tokio::test]
    async fn a_request_refused_after_writing_leaves_nothing_and_the_others_of_its_group_commit() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, counters, path) = sqlite_writer(&dir);
        let (release, holder) = hold_writer(&writer);
        let first = writer.enqueue(|ctx| insert_namespace(ctx, "first"));
        let refused = writer.enqueue(|ctx| {
            insert_namespace(ctx, "refused")?;
            Err::<(), _>(Error::Conflict("refused after writing".to_owned()))
        });
        let last = writer.enqueue(|ctx| insert_namespace(ctx, "last"));
        drop(release);
        holder.answer().await.unwrap();
        first.answer().await.unwrap();
        assert!(matches!(refused.answer().await, Err(Error::Conflict(_))));
        last.answer().await.unwrap();
        assert_eq!(namespaces(&path), ["first", "last"]);
        let stats = counters.read();
        assert_eq!(stats.restarts, 1, "{stats:?}");
        assert_eq!(
            stats.commits, 2,
            "the held transaction, then the group: {stats:?}"
        );
    }

    #[tokio::test]
    async fn a_durable_commit_is_answered_after_a_log_sync_the_counters_time() {
        for (durability, syncs) in [
            (starbridge_store::Durability::Full, true),
            (starbridge_store::Durability::Relaxed, false),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let path = migrated(&dir);
            let conn = SqliteConn::open_writer(&path, durability).unwrap();
            let (writer, counters) = start_writer(Box::new(conn), &path);
            writer
                .enqueue(|ctx| insert_namespace(ctx, "synced"))
                .answer()
                .await
                .unwrap();
            assert_eq!(namespaces(&path), ["synced"]);
            let stats = counters.read();
            assert_eq!(stats.log_syncs > 0, syncs, "{durability:?}: {stats:?}");
            assert_eq!(
                stats.log_syncing > std::time::Duration::ZERO,
                syncs,
                "{durability:?}: {stats:?}"
            );
        }
    }

    /// A job row as a command would hold it back.
    fn job(id: &str) -> starbridge_core::model::Job {
        crate::jobs::test_job(id, starbridge_core::model::JobStatus::Running)
    }

    fn jobs(path: &Path) -> Vec<String> {
        strings(path, "SELECT id FROM jobs ORDER BY id")
    }

    #[tokio::test]
    async fn rows_held_back_by_a_refused_request_are_dropped_and_the_others_are_written_together() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, counters, path) = sqlite_writer(&dir);
        let (release, holder) = hold_writer(&writer);
        let kept = writer.enqueue(|ctx| {
            ctx.conn.defer_job(&job("kept"));
            Ok(())
        });
        let refused = writer.enqueue(|ctx| {
            ctx.conn.defer_job(&job("refused"));
            Err::<(), _>(Error::Conflict("refused".to_owned()))
        });
        let rewritten = writer.enqueue(|ctx| {
            let mut twice = job("twice");
            ctx.conn.defer_job(&twice);
            twice.completions = 2;
            ctx.conn.defer_job(&twice);
            Ok(())
        });
        drop(release);
        holder.answer().await.unwrap();
        kept.answer().await.unwrap();
        assert!(matches!(refused.answer().await, Err(Error::Conflict(_))));
        rewritten.answer().await.unwrap();
        assert_eq!(jobs(&path), ["job_kept", "job_twice"]);
        let conn = rusqlite::Connection::open(&path).unwrap();
        let completions: i64 = conn
            .query_row(
                "SELECT completions FROM jobs WHERE id = 'job_twice'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(
            completions, 2,
            "the last version of a row is the one written"
        );
        assert_eq!(counters.read().restarts, 0);
    }

    #[tokio::test]
    async fn requests_sent_together_share_one_group_transaction_even_past_its_usual_size() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, counters, path) = sqlite_writer(&dir);
        let mut together = Together::default();
        let count = MAX_BATCH + 10;
        let pending: Vec<Pending<()>> = (0..count)
            .map(|n| {
                together.add(Kind::Other, move |ctx| {
                    insert_namespace(ctx, &format!("ns{n:04}"))
                })
            })
            .collect();
        assert!(writer.send(together));
        for answer in answers(pending).await {
            answer.unwrap();
        }
        assert_eq!(namespaces(&path).len(), count);
        let stats = counters.read();
        assert_eq!((stats.commits, stats.requests), (1, count as u64));
    }

    #[tokio::test]
    async fn a_request_refused_before_writing_costs_its_group_no_second_run() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, counters, path) = sqlite_writer(&dir);
        let (release, holder) = hold_writer(&writer);
        let runs = Arc::new(AtomicU64::new(0));
        let counted = runs.clone();
        let first = writer.enqueue(move |ctx| {
            counted.fetch_add(1, Ordering::Relaxed);
            insert_namespace(ctx, "first")
        });
        let refused = writer.enqueue(|_ctx| Err::<(), _>(Error::Conflict("refused".to_owned())));
        drop(release);
        holder.answer().await.unwrap();
        first.answer().await.unwrap();
        assert!(matches!(refused.answer().await, Err(Error::Conflict(_))));
        assert_eq!(namespaces(&path), ["first"]);
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        assert_eq!(counters.read().restarts, 0);
    }
}
