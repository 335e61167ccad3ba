//! Claiming ready tasks for a worker: which queues may hand out work now, and the lease each
//! task gets.

use crate::ctx::WriteCtx;
use crate::read_ahead;
use crate::secrets::{AttemptSecret, AttemptSecrets};
use crate::{Claimed, Error, Result, StoredQueue, StoredQueuePrefix};
use starbridge_core::Workflow;
use starbridge_core::dispatch::{self, Bucket, Candidate, QueueConfig};
use starbridge_core::ids::JobId;
use starbridge_core::model::{Input, JobState, Task};
use starbridge_core::time::Duration;
use starbridge_core::time::Timestamp;
use starbridge_store::db::{Backend, Conn};
use starbridge_store::rows;
use starbridge_store::rows::{Pass, RowLock};
use std::collections::{HashMap, VecDeque};

use shared::ClaimKey;

use super::step_limits::{self, Gate};
use super::{apply, workflow_of};

pub(crate) mod shared;

/// Most ready tasks a claim reads per queue for the group's claims that share its read.
const SHARED_READ_MOST: u32 = 1024;

/// How many ready tasks a claim reads per queue in a round after one that parked tasks.
const PARKING_ROUND: u32 = 256;

/// A polled queue that may hand out work now.
pub(crate) struct OpenQueue {
    pub(crate) name: String,
    pub(crate) config: QueueConfig,
    /// How many tasks it may start now (`None`: no limit).
    pub(crate) free: Option<u32>,
    /// Tokens in its rate-limit bucket now, if it has a rate limit.
    pub(crate) tokens: Option<f64>,
    /// It stopped on error (`on_error: pause`): it hands out compensation tasks only.
    pub(crate) rollback_only: bool,
}

/// Rate-limited queues out of tokens, with when their next token arrives.
pub(crate) type Reopening = Vec<(String, Timestamp)>;
/// The polled queues that may hand out work now, and the rate-limited ones that may again at a
/// known time (when their next token arrives).
///
/// Each queue dispatches with its own settings, else those of its namespace's `prefixes` it
/// follows (`settings_of`). A claim passes `serialize`: then each limited queue (serial,
/// concurrency, rate) is locked until the transaction ends before its running tasks are
/// counted, so claims of several server nodes cannot both take its last free slot or token.
///
/// `stored` holds the queues' rows, in the order of `queues` (see `stored_queues`).
pub(crate) fn open_queues(
    conn: &mut dyn Conn,
    namespace: &str,
    queues: &[String],
    stored: &[Option<StoredQueue>],
    prefixes: &[StoredQueuePrefix],
    now: Timestamp,
    serialize: bool,
) -> Result<(Vec<OpenQueue>, Reopening)> {
    let mut open = Vec::with_capacity(queues.len());
    let mut reopen = Vec::new();
    for (name, stored) in queues.iter().zip(stored) {
        let mut row = stored.as_ref();
        let locked;
        if serialize && !unlimited(name, row, prefixes) {
            conn.lock_key(&format!("queue\t{namespace}\t{name}"))?;
            if conn.backend() == Backend::Postgres {
                // Another node may have taken tokens between the read and the lock.
                locked = rows::queue(conn, namespace, name)?;
                row = locked.as_ref();
            }
        }
        let bucket = row.and_then(|queue| queue.bucket);
        let (mut config, _) = super::settings_of(name, row, prefixes);
        let rollback_only = config.paused && row.is_some_and(|q| q.paused_reason.is_some());
        if rollback_only {
            config.paused = false;
        }
        let running = if config.is_limited() {
            rows::running_count(conn, namespace, name)?
        } else {
            0
        };
        let mut free = config.free_slots(running);
        let tokens = config.rate.map(|rate| rate.available(bucket, now));
        if let (Some(rate), Some(tokens)) = (config.rate, tokens) {
            let whole = tokens.floor() as u32;
            free = Some(free.map_or(whole, |free| free.min(whole)));
            if whole == 0 && !config.paused {
                reopen.push((name.clone(), rate.next_token_at(tokens, now)));
            }
        }
        if free != Some(0) {
            open.push(OpenQueue {
                name: name.clone(),
                config,
                free,
                tokens,
                rollback_only,
            });
        }
    }
    Ok((open, reopen))
}

/// Whether a queue dispatches without a limit (serial, a concurrency) or a rate: a claim then
/// counts nothing of it, and claims of it may share their read (see `shared`).
fn unlimited(name: &str, stored: Option<&StoredQueue>, prefixes: &[StoredQueuePrefix]) -> bool {
    let (config, _) = super::settings_of(name, stored, prefixes);
    !config.is_limited() && config.rate.is_none()
}

/// The stored rows of `queues`, in their order (`None`: a queue with no row yet), read through
/// `conn` (the writer reads them through its cache, `WriteCtx::stored_queues`).
pub(crate) fn stored_queues(
    conn: &mut dyn Conn,
    namespace: &str,
    queues: &[String],
) -> Result<Vec<Option<StoredQueue>>> {
    queues
        .iter()
        .map(|name| rows::queue(conn, namespace, name))
        .collect()
}

/// Claims up to `max` ready tasks of the given queues, in dispatch order, within each queue's
/// mode, concurrency and pause (see `starbridge_core::dispatch`), and each task's step lock and
/// rate (see `step_limits`). A task that cannot have its slot or token is parked out of the
/// claim order, and the claim reads on past it: a round that parked tasks is followed by
/// another, until `max` tasks are claimed or the queues have no more ready tasks.
///
/// `key` names the namespace and the polled queues; `secrets` holds the attempts' secrets,
/// drawn before the claim reached the writer.
pub(crate) fn claim(
    ctx: &mut WriteCtx<'_>,
    key: &ClaimKey,
    worker: &str,
    max: u32,
    secrets: &AttemptSecrets,
) -> Result<Vec<Claimed>> {
    let (namespace, queues) = (key.namespace.as_str(), key.queues.as_slice());
    // How many tasks this claim and the group's later claims of the same queues may take.
    let together = ctx.claims.start(key, max);
    let mut pooled = ctx.claims.take(key);
    let stored = match &mut pooled {
        Some(pooled) => std::mem::take(&mut pooled.queues),
        None => ctx.stored_queues(namespace, queues)?,
    };
    let mut free_slots: HashMap<String, u32> = HashMap::new();
    let prefixes = ctx.queue_prefixes(namespace)?;
    let (open, _) = open_queues(
        ctx.conn, namespace, queues, &stored, &prefixes, ctx.now, true,
    )?;
    for queue in &open {
        if let Some(free) = queue.free {
            free_slots.insert(queue.name.clone(), free);
        }
    }
    // Every polled queue, open or not: a closed rate-limited queue reopens as its tokens come.
    let shares = queues
        .iter()
        .zip(&stored)
        .all(|(name, row)| unlimited(name, row.as_ref(), &prefixes));
    if !shares {
        pooled = None;
    }
    let mut claimed = Vec::new();
    // Each job is loaded once per claim, however many of its tasks are claimed, and those not
    // cached together (`None`: another node holds it).
    let mut jobs: foldhash::HashMap<JobId, Option<Box<JobState>>> = Default::default();
    let mut round_limit = max;
    // Whether the claim took jobs the job cache did not hold (read ahead, or from the store).
    let taken_ahead = ctx.jobs.taken_ahead();
    let mut read_from_store = false;
    // A ready task whose job another node is changing was left for a later claim.
    let mut left_for_later = false;
    let (leftover, complete) = loop {
        let from_pool = pooled.is_some();
        let (mut candidates, complete) = match pooled.take() {
            Some(pooled) => (pooled.candidates, pooled.complete),
            None => {
                let wanted = if shares {
                    round_limit.max(together.min(SHARED_READ_MOST))
                } else {
                    round_limit
                };
                read_candidates(ctx, namespace, &open, &free_slots, wanted)?
            }
        };
        let fetched = candidates.len();
        let mut parked = 0;
        while claimed.len() < max as usize {
            // When the next candidate's job is not taken yet, the jobs of as many candidates as
            // tasks are still wanted are taken together: a shared read's pool holds the group's
            // later claims' candidates too, whose jobs this claim leaves in the cache. On
            // PostgreSQL, where each read is a round trip, those of the whole pool at once.
            if let Some(next) = candidates.front()
                && !jobs.contains_key(&next.job)
            {
                let wanted = match ctx.conn.backend() {
                    Backend::Postgres => candidates.len(),
                    Backend::Sqlite => max as usize - claimed.len(),
                };
                read_from_store |= take_jobs(ctx, candidates.iter().take(wanted), &mut jobs)?;
            }
            let Some(candidate) = candidates.pop_front() else {
                break;
            };
            if free_slots.get(&candidate.queue) == Some(&0) {
                continue;
            }
            // A job another node is changing right now is left for a later claim.
            let Some(Some(state)) = jobs.get_mut(&candidate.job) else {
                left_for_later = true;
                continue;
            };
            let compiled = workflow_of(ctx, state)?;
            let task_id = candidate.task;
            let takes = match step_limits::gate(ctx, &compiled.workflow, state, &task_id)? {
                Gate::Go(takes) => takes,
                Gate::Parked => {
                    parked += 1;
                    continue;
                }
            };
            if let Some(free) = free_slots.get_mut(&candidate.queue) {
                *free -= 1;
            }
            let AttemptSecret {
                lease_token,
                callback_secret,
            } = secrets.attempt(claimed.len());
            let input = Input::Claim {
                task: task_id.clone(),
                worker: worker.to_owned(),
                lease_token,
                callback_hash: crate::secrets::callback_hash(&callback_secret),
            };
            match apply(ctx, &compiled.workflow, state, input) {
                Ok(()) => {
                    step_limits::take(ctx, state, &task_id, takes)?;
                    let task = state.task(&task_id).cloned().ok_or_else(|| {
                        Error::Corrupt(format!("claimed task {task_id} vanished"))
                    })?;
                    let lease = lease_of(&compiled.workflow, &task);
                    let callback_token = super::callback_token(&task, &callback_secret);
                    claimed.push(Claimed {
                        task,
                        lease,
                        callback_token,
                        traceparent: None,
                    });
                }
                Err(Error::Conflict(reason)) => {
                    tracing::debug!(%task_id, %reason, "ready task not claimable");
                }
                Err(error) => return Err(error),
            }
        }
        // A pool that ran dry may have left ready tasks unread behind it.
        let unread_behind = from_pool && candidates.is_empty() && !complete;
        // Parked tasks left the claim order: read on past them while work is wanted, unless a
        // shared read found every ready task. Later rounds read more at once, as what parks
        // tends to come in crowds.
        let read_on = (parked > 0 || unread_behind) && claimed.len() < max as usize && fetched > 0;
        if !read_on || (shares && complete) {
            break (candidates, complete);
        }
        round_limit = round_limit.max(PARKING_ROUND);
    };
    // What this claim did not come to is left for the group's next claim of its queues.
    if shares {
        // The next claims of a queue deeper than the job cache find their jobs read ahead.
        if read_from_store || ctx.jobs.taken_ahead() != taken_ahead {
            ctx.jobs.ask_read_ahead(|| read_ahead::Ask {
                namespace: namespace.to_owned(),
                queues: open
                    .iter()
                    .map(|queue| (queue.name.clone(), queue.config.clone(), pass_of(queue)))
                    .collect(),
                now: ctx.now,
            });
        }
        if complete && leftover.is_empty() && !left_for_later {
            ctx.claims.took_all_of(key);
        }
        ctx.claims.put_back(key.clone(), leftover, complete, stored);
    }
    for state in jobs.into_values().flatten() {
        ctx.jobs.keep(state);
    }
    // Rate-limited queues pay one token per task started.
    for queue in &open {
        if let Some(tokens) = queue.tokens {
            let taken = claimed
                .iter()
                .filter(|c| c.task.queue == queue.name)
                .count();
            if taken > 0 {
                let bucket = Bucket {
                    tokens: (tokens - taken as f64).max(0.0),
                    at: ctx.now,
                };
                rows::save_bucket(ctx.conn, namespace, &queue.name, bucket)?;
                ctx.reads.forget_queue(namespace, &queue.name);
            }
        }
    }
    Ok(claimed)
}

/// The jobs of `candidates` not in `jobs` yet, put there: from the job cache, or read from the
/// store together (`None`: another node holds the job). True when some were read.
fn take_jobs<'c>(
    ctx: &mut WriteCtx<'_>,
    candidates: impl Iterator<Item = &'c Candidate>,
    jobs: &mut foldhash::HashMap<JobId, Option<Box<JobState>>>,
) -> Result<bool> {
    let mut missing = Vec::new();
    for candidate in candidates {
        if jobs.contains_key(&candidate.job) {
            continue;
        }
        let state = ctx.jobs.take(&candidate.job);
        if state.is_none() {
            missing.push(candidate.job.clone());
        }
        jobs.insert(candidate.job.clone(), state);
    }
    for state in super::lock_jobs(ctx, &missing, RowLock::Skip)? {
        jobs.insert(state.job.id.clone(), Some(state));
    }
    Ok(!missing.is_empty())
}

/// The ready tasks of the open queues in dispatch order, up to `limit` per queue (fewer where
/// a queue has fewer free slots), and whether that is every ready task they hold.
fn read_candidates(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    open: &[OpenQueue],
    free_slots: &HashMap<String, u32>,
    limit: u32,
) -> Result<(VecDeque<Candidate>, bool)> {
    let mut candidates = Vec::new();
    let mut complete = true;
    for queue in open {
        let free = free_slots.get(&queue.name).copied();
        let limit = free.map_or(limit, |free| free.min(limit));
        if limit == 0 {
            continue;
        }
        let (found, more) = rows::claim_candidates(
            ctx.conn,
            namespace,
            &queue.name,
            &queue.config,
            ctx.now,
            limit,
            pass_of(queue),
        )?;
        complete &= !more;
        candidates.extend(found);
    }
    Ok((
        VecDeque::from(dispatch::order(candidates, usize::MAX)),
        complete,
    ))
}

/// Which ready tasks of an open queue a claim reads.
fn pass_of(queue: &OpenQueue) -> Pass {
    if queue.rollback_only {
        Pass::Compensations
    } else {
        Pass::Ready
    }
}

pub(super) fn lease_of(workflow: &Workflow, task: &Task) -> Duration {
    let compensation = task.kind == starbridge_core::model::TaskKind::Compensation;
    workflow
        .task_handler(&task.step, compensation)
        .map_or(starbridge_core::definition::DEFAULT_ATTEMPT_TIMEOUT, |h| {
            h.timeout
        })
}
