//! What a command sees while it runs inside the writer's group transaction (`WriteCtx`): the
//! connection, the time, the caches, and where to note wake-ups and webhook deliveries.

use crate::cache::{Compiled, Key, WorkflowCache};
use crate::commands::shared_claims::GroupClaims;
use crate::jobs::{JobCache, Lifetime};
use crate::{Result, StoredQueue, StoredQueuePrefix, Webhook};
use foldhash::HashMap;
use starbridge_core::limits::Limits;
use starbridge_core::time::Timestamp;
use starbridge_store::deferred::WriteConn;
use std::sync::Arc;
/// What a write request sees: the open transaction, the time, and where to note wake-ups.
pub(crate) struct WriteCtx<'a> {
    /// The transaction's connection; it holds row writes back (see `deferred`).
    pub(crate) conn: &'a mut WriteConn,
    pub(crate) now: Timestamp,
    pub(crate) workflows: &'a WorkflowCache,
    /// Unfinished jobs as this transaction left them (see `jobs`).
    pub(crate) jobs: &'a mut JobCache,
    /// Settings read before (see `CachedReads`).
    pub(crate) reads: &'a mut CachedReads,
    /// The group's claims and the ready tasks read for them (see `commands::claim::shared`).
    pub(crate) claims: &'a mut GroupClaims,
    /// Queues (with their namespace) where the request made tasks ready to claim now: their
    /// polls are woken after commit, unless the group's claims took every ready task there.
    pub(crate) wakes: Vec<(String, String)>,
    /// Queues where it made tasks ready to claim later: their polls are woken after commit to
    /// wait for that time.
    pub(crate) wakes_later: Vec<(String, String)>,
    /// The spans this request ended, handed to the exporter after commit (see `traces`).
    pub(crate) spans: Vec<crate::traces::FinishedSpan>,
    /// Whether tracing is on: jobs get a trace at submit, and ended spans are noted.
    pub(crate) tracing: bool,
    /// Lock keys (with their namespace) whose slots freed for parked tasks: handed out when the
    /// request's command is done (`commands::hand_out_freed`).
    pub(crate) freed_locks: Vec<(String, String)>,
    /// Set when webhook deliveries were written: the deliverer is woken after commit.
    pub(crate) deliveries: bool,
    pub(crate) limits: Limits,
    /// Workflow versions this request compiled into the shared cache (see `workflow`).
    pub(crate) loaded_workflows: Vec<Key>,
}

/// Settings the writer's commands read often and change rarely: webhook subscriptions, the
/// latest version of each workflow, queue prefix settings. A command that changes one forgets
/// its entry. How long an entry stays right depends on who else writes (`Lifetime`, as for the
/// job cache):
///
/// - on SQLite, as long as the store is open: this writer makes every change, so an entry can
///   only go stale through a command that forgets it, or through a rollback, which forgets
///   everything (`clear`);
/// - on PostgreSQL, for the length of one group transaction: every request in it arrived before
///   it began, so a change another node commits meanwhile counts as coming after all of them.
pub(crate) struct CachedReads {
    lifetime: Lifetime,
    /// Webhook subscriptions by namespace.
    webhooks: HashMap<String, Arc<Vec<Webhook>>>,
    /// The latest version of each workflow by (namespace, name).
    versions: HashMap<(String, String), Option<u32>>,
    /// Queue prefix settings by namespace (every claim needs its namespace's).
    queue_prefixes: HashMap<String, Arc<Vec<StoredQueuePrefix>>>,
    /// Queue rows by namespace and name, `None` for a queue with no row (every claim reads its
    /// queues', every submit those its ready tasks wait in).
    queues: HashMap<String, HashMap<String, Option<StoredQueue>>>,
}

impl CachedReads {
    pub(crate) fn new(lifetime: Lifetime) -> CachedReads {
        CachedReads {
            lifetime,
            webhooks: HashMap::default(),
            versions: HashMap::default(),
            queue_prefixes: HashMap::default(),
            queues: HashMap::default(),
        }
    }

    /// Forgets everything (a rollback may have undone what an entry was read from).
    pub(crate) fn clear(&mut self) {
        self.webhooks.clear();
        self.versions.clear();
        self.queue_prefixes.clear();
        self.queues.clear();
    }

    /// The group transaction committed: on PostgreSQL, other nodes may change anything now.
    pub(crate) fn transaction_ended(&mut self) {
        if self.lifetime == Lifetime::Transaction {
            self.clear();
        }
    }

    pub(crate) fn forget_webhooks(&mut self, namespace: &str) {
        self.webhooks.remove(namespace);
    }

    pub(crate) fn forget_queue_prefixes(&mut self, namespace: &str) {
        self.queue_prefixes.remove(namespace);
    }

    /// A command wrote the row of queue `name` (its settings, pause, token bucket, or the row
    /// itself).
    pub(crate) fn forget_queue(&mut self, namespace: &str, name: &str) {
        if let Some(queues) = self.queues.get_mut(namespace) {
            queues.remove(name);
        }
    }

    pub(crate) fn forget_version(&mut self, namespace: &str, name: &str) {
        self.versions
            .remove(&(namespace.to_owned(), name.to_owned()));
    }
}

impl WriteCtx<'_> {
    /// The webhook subscriptions of a namespace.
    pub(crate) fn webhooks(&mut self, namespace: &str) -> Result<Arc<Vec<Webhook>>> {
        if let Some(found) = self.reads.webhooks.get(namespace) {
            return Ok(found.clone());
        }
        let found = Arc::new(starbridge_store::rows::webhooks::list(
            self.conn, namespace,
        )?);
        self.reads
            .webhooks
            .insert(namespace.to_owned(), found.clone());
        Ok(found)
    }

    /// The queue prefix settings of a namespace.
    pub(crate) fn queue_prefixes(
        &mut self,
        namespace: &str,
    ) -> Result<Arc<Vec<StoredQueuePrefix>>> {
        if let Some(found) = self.reads.queue_prefixes.get(namespace) {
            return Ok(found.clone());
        }
        let found = Arc::new(starbridge_store::rows::queue_prefixes::list(
            self.conn, namespace,
        )?);
        self.reads
            .queue_prefixes
            .insert(namespace.to_owned(), found.clone());
        Ok(found)
    }

    /// The rows of `queues` of a namespace, in their order (`None`: a queue with no row yet).
    pub(crate) fn stored_queues(
        &mut self,
        namespace: &str,
        queues: &[String],
    ) -> Result<Vec<Option<StoredQueue>>> {
        let mut stored = Vec::with_capacity(queues.len());
        for name in queues {
            let cached = self
                .reads
                .queues
                .get(namespace)
                .and_then(|queues| queues.get(name));
            let row = match cached {
                Some(row) => row.clone(),
                None => {
                    let row = starbridge_store::rows::queue(self.conn, namespace, name)?;
                    self.reads
                        .queues
                        .entry(namespace.to_owned())
                        .or_default()
                        .insert(name.clone(), row.clone());
                    row
                }
            };
            stored.push(row);
        }
        Ok(stored)
    }

    /// The latest version of a workflow, if it has one.
    pub(crate) fn latest_version(&mut self, namespace: &str, name: &str) -> Result<Option<u32>> {
        let key = (namespace.to_owned(), name.to_owned());
        let found = match self.reads.versions.get(&key) {
            Some(found) => *found,
            None => {
                let found = starbridge_store::rows::latest_version(self.conn, namespace, name)?;
                self.reads.versions.insert(key, found);
                found
            }
        };
        self.workflows.note_latest(namespace, name, found);
        Ok(found)
    }

    /// A compiled workflow version as this transaction sees it (perhaps stored by it).
    pub(crate) fn workflow(
        &mut self,
        namespace: &str,
        name: &str,
        version: u32,
    ) -> Result<Arc<Compiled>> {
        self.workflows.get_noting(
            self.conn,
            namespace,
            name,
            version,
            &mut self.loaded_workflows,
        )
    }
}
