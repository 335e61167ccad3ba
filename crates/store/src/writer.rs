//! Group commit: one thread owns the only write connection. Requests queue up while a commit is
//! in flight; the next transaction takes all of them (up to `MAX_BATCH`), runs each under its own
//! savepoint (a failing request rolls back only its own changes), commits once, and only then
//! answers every request and wakes the pollers of queues that got work. One fsync serves many
//! requests, and no request is answered before its change is durable.

use std::sync::Arc;
use std::thread;

use rusqlite::Connection;
use starbridge_core::limits::Limits;
use starbridge_core::time::Timestamp;
use tokio::sync::{mpsc, oneshot};

use crate::cache::WorkflowCache;
use crate::clock::Clock;
use crate::notify::Notifier;
use crate::{Error, Result};

const MAX_BATCH: usize = 512;

/// What a write request sees: the open transaction, the time, and where to note wake-ups.
pub(crate) struct WriteCtx<'a> {
    pub(crate) conn: &'a Connection,
    pub(crate) now: Timestamp,
    pub(crate) workflows: &'a WorkflowCache,
    pub(crate) wakes: Vec<(String, String)>,
    /// Set when webhook deliveries were written: the deliverer is woken after commit.
    pub(crate) deliveries: bool,
    pub(crate) limits: Limits,
}

type Reply = Box<dyn FnOnce(Result<()>) + Send>;
type Work = Box<dyn FnOnce(&mut WriteCtx<'_>) -> (bool, Reply) + Send>;

#[derive(Clone)]
pub(crate) struct Writer {
    sender: mpsc::UnboundedSender<Work>,
}

impl Writer {
    pub(crate) fn start(
        conn: Connection,
        clock: Arc<dyn Clock>,
        workflows: Arc<WorkflowCache>,
        notifier: Arc<Notifier>,
        limits: Limits,
    ) -> Writer {
        let (sender, receiver) = mpsc::unbounded_channel();
        thread::Builder::new()
            .name("starbridge-writer".to_owned())
            .spawn(move || run(conn, receiver, clock, workflows, notifier, limits))
            .expect("spawning the writer thread");
        Writer { sender }
    }

    /// Runs `work` in the next group transaction; resolves once it is committed.
    pub(crate) async fn write<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut WriteCtx<'_>) -> Result<T> + Send + 'static,
    {
        let (reply_to, reply) = oneshot::channel::<Result<T>>();
        let work: Work = Box::new(move |ctx: &mut WriteCtx<'_>| {
            let result = work(ctx);
            let ok = result.is_ok();
            let reply: Reply = Box::new(move |commit: Result<()>| {
                let _ = reply_to.send(commit.and(result));
            });
            (ok, reply)
        });
        self.sender.send(work).map_err(|_| Error::Closed)?;
        reply.await.map_err(|_| {
            Error::Unavailable(
                "the database could not start a transaction; nothing was written".to_owned(),
            )
        })?
    }
}

fn run(
    conn: Connection,
    mut receiver: mpsc::UnboundedReceiver<Work>,
    clock: Arc<dyn Clock>,
    workflows: Arc<WorkflowCache>,
    notifier: Arc<Notifier>,
    limits: Limits,
) {
    let mut batch: Vec<Work> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = receiver.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(work) => batch.push(work),
                Err(_) => break,
            }
        }
        let mut replies: Vec<Reply> = Vec::with_capacity(batch.len());
        let mut wakes = Vec::new();
        let mut deliveries = false;
        if let Err(error) = conn.execute_batch("BEGIN IMMEDIATE") {
            // Dropping the requests answers each with `Error::Unavailable`; nothing was written.
            tracing::error!(%error, "cannot begin a write transaction");
            batch.clear();
            continue;
        }
        for work in batch.drain(..) {
            let mut ctx = WriteCtx {
                conn: &conn,
                now: clock.now(),
                workflows: &workflows,
                wakes: Vec::new(),
                deliveries: false,
                limits,
            };
            let savepoint = conn.execute_batch("SAVEPOINT request");
            let (ok, reply) = work(&mut ctx);
            let closed = if ok && savepoint.is_ok() {
                wakes.append(&mut ctx.wakes);
                deliveries |= ctx.deliveries;
                conn.execute_batch("RELEASE request")
            } else {
                conn.execute_batch("ROLLBACK TO request; RELEASE request")
            };
            if let Err(error) = closed {
                tracing::error!(%error, "savepoint failed");
            }
            replies.push(reply);
        }
        let committed = conn.execute_batch("COMMIT").map_err(Error::from);
        if let Err(error) = &committed {
            tracing::error!(%error, "group commit failed; every request in it is refused");
            let _ = conn.execute_batch("ROLLBACK");
            workflows.clear();
            wakes.clear();
        }
        for reply in replies {
            reply(match &committed {
                Ok(()) => Ok(()),
                Err(error) => Err(Error::Unavailable(error.to_string())),
            });
        }
        if committed.is_ok() {
            notifier.timers_changed();
            if deliveries {
                notifier.deliveries_changed();
            }
        }
        for (namespace, queue) in wakes {
            notifier.wake(&namespace, &queue);
        }
    }
}
