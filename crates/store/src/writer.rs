//! Group commit: one thread owns the node's only write connection. Requests queue up while a
//! commit is in flight; the next transaction takes all of them (up to `MAX_BATCH`), runs each
//! under its own savepoint (a failing request rolls back only its own changes), commits once,
//! and only then answers every request and wakes the pollers of queues that got work. One fsync
//! serves many requests, and no request is answered before its change is durable.
//!
//! On PostgreSQL other nodes write too. A request that waited too long for a row another node
//! holds (or lost a deadlock, or a unique key race) is rolled back to its savepoint and runs
//! again at the head of the next transaction, after this one has released its locks. Before
//! committing, the transaction announces the queues that got work to the other nodes. A broken
//! connection is replaced before the next transaction.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Instant;

use starbridge_core::limits::Limits;
use starbridge_core::time::Timestamp;
use tokio::sync::{mpsc, oneshot};

use crate::cache::WorkflowCache;
use crate::clock::Clock;
use crate::db::{Backend, Conn};
use crate::jobs::JobCache;
use crate::notify::Notifier;
use crate::{Error, Result};

const MAX_BATCH: usize = 512;
/// How often a request contended by other nodes runs again before it is refused.
const MAX_TRIES: u32 = 8;

/// What a write request sees: the open transaction, the time, and where to note wake-ups.
pub(crate) struct WriteCtx<'a> {
    pub(crate) conn: &'a mut dyn Conn,
    pub(crate) now: Timestamp,
    pub(crate) workflows: &'a WorkflowCache,
    /// Unfinished jobs as this transaction left them (SQLite only, see `jobs`).
    pub(crate) jobs: &'a mut JobCache,
    pub(crate) wakes: Vec<(String, String)>,
    /// Set when webhook deliveries were written: the deliverer is woken after commit.
    pub(crate) deliveries: bool,
    pub(crate) limits: Limits,
}

type Reply = Box<dyn FnOnce(Result<()>) + Send>;

enum Outcome {
    /// The request ran (`ok` says whether its changes stay); `reply` answers it after commit.
    Done { ok: bool, reply: Reply },
    /// The request met another node's transaction: run it again in the next one.
    Again,
}

type Work = Box<dyn FnMut(&mut WriteCtx<'_>) -> Outcome + Send>;

/// Opens a new write connection (after the old one broke).
pub(crate) type Connect = Arc<dyn Fn() -> Result<Box<dyn Conn>> + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Writer {
    sender: mpsc::UnboundedSender<Work>,
}

/// What the writer has done since the store opened: counters for `/metrics` and the benchmark.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    transactions: AtomicU64,
    failed: AtomicU64,
    requests: AtomicU64,
    again: AtomicU64,
    busy_nanos: AtomicU64,
    commit_nanos: AtomicU64,
}

/// A reading of the writer's counters (see [`crate::Store::writer_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Group transactions that committed.
    pub commits: u64,
    /// Group transactions that failed (every request in them was refused).
    pub failed_commits: u64,
    /// Write requests run (each under its own savepoint), whatever their outcome.
    pub requests: u64,
    /// Requests rolled back to run again because another node held their rows.
    pub retried: u64,
    /// Time the writer spent in transactions, from `BEGIN` to the end of `COMMIT`.
    pub busy: std::time::Duration,
    /// Of that, time spent in `COMMIT`: on SQLite mostly the write-ahead log's fsync.
    pub committing: std::time::Duration,
}

impl Counters {
    pub(crate) fn read(&self) -> WriterStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        WriterStats {
            commits: load(&self.transactions),
            failed_commits: load(&self.failed),
            requests: load(&self.requests),
            retried: load(&self.again),
            busy: std::time::Duration::from_nanos(load(&self.busy_nanos)),
            committing: std::time::Duration::from_nanos(load(&self.commit_nanos)),
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
}

impl Writer {
    pub(crate) fn start(conn: Box<dyn Conn>, shared: Shared) -> Writer {
        let (sender, receiver) = mpsc::unbounded_channel();
        thread::Builder::new()
            .name("starbridge-writer".to_owned())
            .spawn(move || run(conn, receiver, &shared))
            .expect("spawning the writer thread");
        Writer { sender }
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
    /// together, each under its own savepoint); the answer resolves once it is committed.
    pub(crate) fn enqueue<T, F>(&self, mut work: F) -> Pending<T>
    where
        T: Send + 'static,
        F: FnMut(&mut WriteCtx<'_>) -> Result<T> + Send + 'static,
    {
        let (reply_to, reply) = oneshot::channel::<Result<T>>();
        let mut reply_to = Some(reply_to);
        let mut tries = 1;
        let work: Work = Box::new(move |ctx: &mut WriteCtx<'_>| {
            let result = work(ctx);
            if matches!(result, Err(Error::Contended(_))) && tries < MAX_TRIES {
                tries += 1;
                return Outcome::Again;
            }
            let ok = result.is_ok();
            let reply_to = reply_to.take();
            let reply: Reply = Box::new(move |commit: Result<()>| {
                if let Some(reply_to) = reply_to {
                    let _ = reply_to.send(commit.and(result));
                }
            });
            Outcome::Done { ok, reply }
        });
        Pending {
            reply: self.sender.send(work).ok().map(|()| reply),
        }
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
fn usable(conn: &mut Option<Box<dyn Conn>>, connect: &Connect) -> Result<()> {
    if conn.as_ref().is_some_and(|conn| conn.is_usable()) {
        return Ok(());
    }
    *conn = None;
    let fresh = connect()?;
    tracing::info!("write connection (re)opened");
    *conn = Some(fresh);
    Ok(())
}

fn run(conn: Box<dyn Conn>, mut receiver: mpsc::UnboundedReceiver<Work>, shared: &Shared) {
    // On SQLite this thread makes every change to jobs, so what it cached is what is stored.
    let mut jobs = JobCache::new(conn.backend() == Backend::Sqlite);
    let mut conn = Some(conn);
    let mut batch: Vec<Work> = Vec::with_capacity(MAX_BATCH);
    let mut again: Vec<Work> = Vec::new();
    loop {
        if again.is_empty() {
            match receiver.blocking_recv() {
                Some(first) => batch.push(first),
                None => return,
            }
        } else {
            batch.append(&mut again);
        }
        while batch.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(work) => batch.push(work),
                Err(_) => break,
            }
        }
        if let Err(error) = usable(&mut conn, &shared.connect) {
            // Dropping the requests answers each with `Error::Unavailable`; nothing was written.
            tracing::error!(%error, "no write connection");
            batch.clear();
            continue;
        }
        let Some(conn) = conn.as_deref_mut() else {
            continue;
        };
        commit_batch(conn, &mut batch, &mut again, &mut jobs, shared);
    }
}

/// Runs one group transaction over `batch`; requests to run again go to `again`.
fn commit_batch(
    conn: &mut dyn Conn,
    batch: &mut Vec<Work>,
    again: &mut Vec<Work>,
    jobs: &mut JobCache,
    shared: &Shared,
) {
    let started = Instant::now();
    let counters = &shared.counters;
    counters
        .requests
        .fetch_add(batch.len() as u64, Ordering::Relaxed);
    let begin = match conn.backend() {
        Backend::Sqlite => "BEGIN IMMEDIATE",
        Backend::Postgres => "BEGIN",
    };
    if let Err(error) = conn.batch(begin) {
        tracing::error!(%error, "cannot begin a write transaction");
        batch.clear();
        return;
    }
    let mut replies: Vec<Reply> = Vec::with_capacity(batch.len());
    let mut wakes = Vec::new();
    let mut deliveries = false;
    // A failed savepoint command leaves the transaction unusable: then nothing may commit.
    let mut broken: Option<Error> = None;
    // A request's savepoint is closed in the same round trip that opens the next one's (one
    // round trip fewer per request on PostgreSQL); the last one is closed on its own.
    let mut close: Option<&str> = None;
    for mut work in batch.drain(..) {
        if broken.is_some() {
            drop(work);
            continue;
        }
        let open = match close.take() {
            Some(close) => format!("{close}; SAVEPOINT request"),
            None => "SAVEPOINT request".to_owned(),
        };
        if let Err(error) = conn.batch(&open) {
            broken = Some(error);
            drop(work);
            continue;
        }
        let mut ctx = WriteCtx {
            conn: &mut *conn,
            now: shared.clock.now(),
            workflows: &shared.workflows,
            jobs: &mut *jobs,
            wakes: Vec::new(),
            deliveries: false,
            limits: shared.limits,
        };
        let keep = match work(&mut ctx) {
            Outcome::Done { ok, reply } => {
                replies.push(reply);
                ok
            }
            Outcome::Again => {
                again.push(work);
                counters.again.fetch_add(1, Ordering::Relaxed);
                false
            }
        };
        close = Some(if keep {
            wakes.append(&mut ctx.wakes);
            deliveries |= ctx.deliveries;
            jobs.request_kept();
            "RELEASE request"
        } else {
            jobs.request_rolled_back();
            "ROLLBACK TO request; RELEASE request"
        });
    }
    if broken.is_none()
        && let Some(close) = close
        && let Err(error) = conn.batch(close)
    {
        broken = Some(error);
    }
    if broken.is_none() && conn.backend() == Backend::Postgres {
        for payload in crate::postgres::announcements(&shared.node, &wakes, deliveries) {
            if let Err(error) = conn.announce(&payload) {
                broken = Some(error);
                break;
            }
        }
    }
    let committing = Instant::now();
    let committed = match broken {
        Some(error) => Err(error),
        None => conn.batch("COMMIT"),
    };
    add_elapsed(&counters.commit_nanos, committing);
    add_elapsed(&counters.busy_nanos, started);
    match committed {
        Ok(()) => &counters.transactions,
        Err(_) => &counters.failed,
    }
    .fetch_add(1, Ordering::Relaxed);
    if let Err(error) = &committed {
        tracing::error!(%error, "group commit failed; every request in it is refused");
        let _ = conn.batch("ROLLBACK");
        shared.workflows.clear();
        jobs.clear();
        wakes.clear();
        // Requests set to run again are refused too: the database is in trouble.
        again.clear();
    }
    for reply in replies {
        reply(match &committed {
            Ok(()) => Ok(()),
            Err(error) => Err(Error::Unavailable(error.to_string())),
        });
    }
    if committed.is_ok() {
        shared.notifier.timers_changed();
        if deliveries {
            shared.notifier.deliveries_changed();
        }
    }
    // Many requests of a batch wake the same queue: wake each once.
    wakes.sort_unstable();
    wakes.dedup();
    for (namespace, queue) in wakes {
        shared.notifier.wake(&namespace, &queue);
    }
}
