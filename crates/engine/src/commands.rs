//! The write operations. Each runs inside the writer's group transaction: it loads the job,
//! lets the pure state machine decide, and persists the new state, its history events and the
//! wake-ups in the same transaction.

use std::collections::{HashMap, HashSet};

use serde_json::Value;
use starbridge_core::Workflow;
use starbridge_core::definition::{Problem, check_name, check_queue_name};
use starbridge_core::dispatch::{self, Bucket, QueueConfig};
use starbridge_core::ids::{IdSource, JobId, TaskId};
use starbridge_core::limits::MAX_KEY_BYTES;
use starbridge_core::machine::{self, Ctx, NewJob};
use starbridge_core::model::{Action, Input, JobState, OperatorCommand, Rejection, Task};
use starbridge_core::time::Duration;
use starbridge_core::time::Timestamp;

use crate::cache::Compiled;
use crate::writer::WriteCtx;
use crate::{
    Applied, Claimed, Error, QueueChange, Reported, Result, StoredQueue, StoredWorkflow, Submit,
    Submitted, TaskScope,
};
use starbridge_store::db::Conn;
use starbridge_store::rows;
use starbridge_store::rows::RowLock;

/// Fresh ids from UUIDv7 (time-ordered, so indexes append).
pub(crate) struct UuidIds;

impl IdSource for UuidIds {
    fn task_id(&mut self) -> TaskId {
        TaskId::from_unique(&uuid::Uuid::now_v7().simple().to_string())
    }
}

pub(crate) fn new_job_id() -> JobId {
    JobId::from_unique(&uuid::Uuid::now_v7().simple().to_string())
}

pub(crate) fn invalid(field: &str, message: impl Into<String>) -> Error {
    Error::Invalid(vec![Problem {
        field: field.to_owned(),
        message: message.into(),
    }])
}

pub(crate) fn apply_workflow(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    name: &str,
    document: Value,
) -> Result<Applied> {
    let workflow = Workflow::from_value(name, document).map_err(|e| Error::Invalid(e.problems))?;
    store_workflow(ctx, namespace, workflow)
}

/// Refuses a NUL character in text the database stores as it is (not every backend can).
fn check_no_nul(field: &str, text: &str) -> Result<()> {
    if text.contains('\0') {
        return Err(invalid(
            field,
            "must not contain a NUL character (\\u0000): remove it",
        ));
    }
    Ok(())
}

fn store_workflow(ctx: &mut WriteCtx<'_>, namespace: &str, workflow: Workflow) -> Result<Applied> {
    if let Some(description) = &workflow.description {
        check_no_nul("description", description)?;
    }
    let name = workflow.name.clone();
    let latest = rows::workflow(ctx.conn, namespace, &name, None)?;
    if let Some(latest) = &latest
        && latest.definition == workflow.source
    {
        return Ok(Applied {
            version: latest.version,
            created: false,
        });
    }
    let version = latest.map_or(1, |latest| latest.version + 1);
    // Compile the params schema now so a bad schema is refused at apply time.
    let steps = u32::try_from(workflow.steps.len()).unwrap_or(u32::MAX);
    let queues: Vec<String> = workflow
        .steps
        .iter()
        .flat_map(|step| {
            std::iter::once(step.handler().queue.clone())
                .chain(step.compensate.as_ref().map(|c| c.queue.clone()))
        })
        .collect();
    let stored = StoredWorkflow {
        namespace: namespace.to_owned(),
        name: name.clone(),
        version,
        definition: workflow.source.clone(),
        description: workflow.description.clone(),
        steps,
        created_at: ctx.now,
    };
    Compiled::new(workflow, version)?;
    rows::ensure_namespace(ctx.conn, namespace, ctx.now)?;
    rows::insert_workflow(ctx.conn, &stored)?;
    ctx.reads.forget_version(namespace, &name);
    for queue in queues.into_iter().collect::<HashSet<_>>() {
        rows::ensure_queue(ctx.conn, namespace, &queue, ctx.now)?;
    }
    Ok(Applied {
        version,
        created: true,
    })
}

pub(crate) fn submit(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    request: Submit,
) -> Result<Submitted> {
    if let Some(key) = &request.key {
        if key.is_empty() || key.len() > MAX_KEY_BYTES {
            return Err(invalid(
                "key",
                format!("must be 1 to {MAX_KEY_BYTES} characters"),
            ));
        }
        if let Some(existing) = rows::job_by_key(ctx.conn, namespace, key)? {
            // Read, not taken for change: it goes back to the cache as it was (on PostgreSQL it
            // is not locked, so it is not cached).
            let state =
                match ctx.jobs.take(&existing) {
                    Some(cached) => {
                        ctx.jobs.keep(cached.clone());
                        cached
                    }
                    None => rows::lock_job_state(ctx.conn, &existing, RowLock::None)?.ok_or_else(
                        || Error::Corrupt(format!("job {existing} of key {key} vanished")),
                    )?,
                };
            if let Some(workflow) = &request.workflow
                && *workflow != state.job.workflow
            {
                return Err(Error::Conflict(format!(
                    "key '{key}' already names job {} of workflow {}, not {workflow}",
                    state.job.id, state.job.workflow
                )));
            }
            return Ok(Submitted {
                state,
                created: false,
                added_version: None,
            });
        }
    }
    let mut added_version = None;
    let (name, version) = match (&request.definition, &request.workflow) {
        (Some(definition), workflow) => {
            let name = workflow
                .clone()
                .or_else(|| {
                    definition
                        .get("name")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .ok_or_else(|| invalid("definition.name", "an inline definition needs a name"))?;
            let workflow = Workflow::from_value(&name, definition.clone())
                .map_err(|e| Error::Invalid(e.problems))?;
            match rows::workflow_version_of(ctx.conn, namespace, &name, &workflow.source)? {
                Some(version) => (name, version),
                None if request.may_add_version => {
                    let applied = store_workflow(ctx, namespace, workflow)?;
                    added_version = Some(applied.version);
                    (name, applied.version)
                }
                None => {
                    return Err(Error::Forbidden(format!(
                        "this inline definition differs from every version of workflow \
                         '{name}', and making a new version needs the operate scope: submit \
                         with a token that holds operate, or have the workflow applied \
                         (PUT /api/v1/workflows/{name}) and submit it by name"
                    )));
                }
            }
        }
        (None, Some(name)) => {
            check_name(name).map_err(|message| invalid("workflow", message))?;
            let version = match request.version {
                Some(version) => version,
                None => ctx.latest_version(namespace, name)?.ok_or_else(|| {
                    Error::NotFound(format!(
                        "workflow '{name}' not found in namespace '{namespace}': apply it first"
                    ))
                })?,
            };
            (name.clone(), version)
        }
        (None, None) => {
            return Err(invalid(
                "workflow",
                "name the workflow to run, or give an inline `definition`",
            ));
        }
    };
    let compiled = ctx.workflow(namespace, &name, version)?;
    let params = request
        .params
        .unwrap_or_else(|| Value::Object(Default::default()));
    if !params.is_object() {
        return Err(invalid("params", "must be a JSON object"));
    }
    compiled.check_params(&params)?;
    let mut ids = UuidIds;
    let mut machine_ctx = Ctx {
        now: ctx.now,
        ids: &mut ids,
        limits: ctx.limits,
    };
    let (mut state, actions) = machine::create_job(
        &compiled.workflow,
        NewJob {
            id: new_job_id(),
            namespace: namespace.to_owned(),
            version,
            params,
            key: request.key,
            priority: request.priority,
            actor: request.actor,
        },
        &mut machine_ctx,
    )
    .map_err(|error| match error {
        machine::CreateError::LockKey(message) => invalid("lock.key", message),
    })?;
    if let Some(lock) = &state.job.lock {
        check_no_nul("lock.key", &lock.key)?;
    }
    persist(ctx, &state, actions)?;
    crate::webhooks::enqueue(ctx, &state.job, None)?;
    ctx.jobs.keep(state.clone());
    if let Some(lock) = state.job.lock.clone() {
        start_waiting_jobs(ctx, namespace, &lock.key)?;
        if let Some(started) = load_job(ctx, &state.job.id, RowLock::None)? {
            ctx.jobs.keep(started.clone());
            state = started;
        }
    }
    Ok(Submitted {
        state,
        created: true,
        added_version,
    })
}

/// A polled queue that may hand out work now.
pub(crate) struct OpenQueue {
    pub(crate) name: String,
    pub(crate) config: QueueConfig,
    /// How many tasks it may start now (`None`: no limit).
    pub(crate) free: Option<u32>,
    /// Tokens in its rate-limit bucket now, if it has a rate limit.
    pub(crate) tokens: Option<f64>,
}

/// Rate-limited queues out of tokens, with when their next token arrives.
pub(crate) type Reopening = Vec<(String, Timestamp)>;

/// The polled queues that may hand out work now, and the rate-limited ones that may again at a
/// known time (when their next token arrives).
///
/// A claim passes `serialize`: then each limited queue (serial, concurrency, rate) is locked
/// until the transaction ends before its running tasks are counted, so claims of several
/// server nodes cannot both take its last free slot or token.
pub(crate) fn open_queues(
    conn: &mut dyn Conn,
    namespace: &str,
    queues: &[String],
    now: Timestamp,
    serialize: bool,
) -> Result<(Vec<OpenQueue>, Reopening)> {
    let mut open = Vec::with_capacity(queues.len());
    let mut reopen = Vec::new();
    for name in queues {
        let stored = rows::queue(conn, namespace, name)?;
        let bucket = stored.as_ref().and_then(|queue| queue.bucket);
        let config = stored.map(|queue| queue.config).unwrap_or_default();
        if serialize && (config.is_limited() || config.rate.is_some()) {
            conn.lock_key(&format!("queue\t{namespace}\t{name}"))?;
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
            });
        }
    }
    Ok((open, reopen))
}

/// Claims up to `max` ready tasks of the given queues, in dispatch order, within each queue's
/// mode, concurrency and pause (see `starbridge_core::dispatch`).
pub(crate) fn claim(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    queues: &[String],
    worker: &str,
    max: u32,
) -> Result<Vec<Claimed>> {
    let mut candidates = Vec::new();
    let mut free_slots: HashMap<String, u32> = HashMap::new();
    let (open, _) = open_queues(ctx.conn, namespace, queues, ctx.now, true)?;
    for queue in &open {
        let limit = queue.free.map_or(max, |free| free.min(max));
        if let Some(free) = queue.free {
            free_slots.insert(queue.name.clone(), free);
        }
        for starving in [true, false] {
            candidates.extend(rows::claim_candidates(
                ctx.conn,
                namespace,
                &queue.name,
                &queue.config,
                ctx.now,
                limit,
                starving,
            )?);
        }
    }
    let mut claimed = Vec::new();
    // Each job is loaded once per claim, however many of its tasks are claimed, and those not
    // cached together (`None`: another node holds it).
    let mut jobs: HashMap<JobId, Option<JobState>> = HashMap::new();
    let mut missing = Vec::new();
    for candidate in &candidates {
        if jobs.contains_key(&candidate.job) {
            continue;
        }
        match ctx.jobs.take(&candidate.job) {
            Some(state) => {
                jobs.insert(candidate.job.clone(), Some(state));
            }
            None => {
                jobs.insert(candidate.job.clone(), None);
                missing.push(candidate.job.clone());
            }
        }
    }
    for state in rows::lock_job_states(ctx.conn, &missing, RowLock::Skip)? {
        jobs.insert(state.job.id.clone(), Some(state));
    }
    for candidate in dispatch::order(candidates, usize::MAX) {
        if claimed.len() >= max as usize {
            break;
        }
        if let Some(free) = free_slots.get_mut(&candidate.queue) {
            if *free == 0 {
                continue;
            }
            *free -= 1;
        }
        // A job another node is changing right now is left for a later claim.
        let Some(Some(state)) = jobs.get_mut(&candidate.job) else {
            continue;
        };
        let compiled = workflow_of(ctx, state)?;
        let lease_token = uuid::Uuid::new_v4().simple().to_string();
        let task_id = candidate.task;
        let input = Input::Claim {
            task: task_id.clone(),
            worker: worker.to_owned(),
            lease_token,
        };
        match apply(ctx, &compiled.workflow, state, input) {
            Ok(()) => {
                let task = state
                    .task(&task_id)
                    .cloned()
                    .ok_or_else(|| Error::Corrupt(format!("claimed task {task_id} vanished")))?;
                let lease = lease_of(&compiled.workflow, &task);
                claimed.push(Claimed { task, lease });
            }
            Err(Error::Conflict(reason)) => {
                tracing::debug!(%task_id, %reason, "ready task not claimable");
            }
            Err(error) => return Err(error),
        }
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
            }
        }
    }
    Ok(claimed)
}

fn lease_of(workflow: &Workflow, task: &Task) -> Duration {
    let step = workflow
        .step_index(&task.step)
        .map(|index| &workflow.steps[index]);
    match (task.kind, step) {
        (starbridge_core::model::TaskKind::Compensation, Some(step)) => step
            .compensate
            .as_ref()
            .map_or(step.handler().timeout, |c| c.timeout),
        (_, Some(step)) => step.handler().timeout,
        (_, None) => starbridge_core::definition::DEFAULT_ATTEMPT_TIMEOUT,
    }
}

/// A worker's report (heartbeat, complete, fail, check-later) on a task it holds.
pub(crate) fn report(
    ctx: &mut WriteCtx<'_>,
    task_id: &TaskId,
    input: Input,
    scope: &TaskScope,
) -> Result<Reported> {
    let not_found = || Error::NotFound(format!("task {task_id} not found"));
    let job_id = match ctx.jobs.job_of(task_id) {
        Some(job) => job.clone(),
        None => rows::job_of_task(ctx.conn, task_id)?.ok_or_else(not_found)?,
    };
    let mut state = load_job(ctx, &job_id, RowLock::Wait)?
        .ok_or_else(|| Error::Corrupt(format!("job {job_id} of task {task_id} not found")))?;
    let queue = state.task(task_id).map(|task| task.queue.as_str());
    if !queue.is_some_and(|queue| scope.allows(&state.job.namespace, queue)) {
        return Err(not_found());
    }
    let compiled = workflow_of(ctx, &state)?;
    apply(ctx, &compiled.workflow, &mut state, input)?;
    let task = state
        .task(task_id)
        .cloned()
        .ok_or_else(|| Error::Corrupt(format!("task {task_id} vanished")))?;
    let lease = lease_of(&compiled.workflow, &task);
    let job_status = state.job.status;
    ctx.jobs.keep(state);
    Ok(Reported {
        task,
        lease,
        job_status,
    })
}

/// Loads the jobs of the tasks a group's reports name that are not cached, in a few set-based
/// statements, their rows locked (on PostgreSQL) until the transaction ends: each report then
/// finds its job in the cache. Jobs that ended are not cached; their reports read them alone.
pub(crate) fn prefetch(ctx: &mut WriteCtx<'_>, tasks: &[TaskId]) -> Result<()> {
    let unknown: Vec<TaskId> = tasks
        .iter()
        .filter(|task| ctx.jobs.job_of(task).is_none())
        .cloned()
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    let mut jobs: Vec<JobId> = rows::jobs_of_tasks(ctx.conn, &unknown)?
        .into_iter()
        .map(|(_, job)| job)
        .collect();
    jobs.sort_unstable();
    jobs.dedup();
    for state in rows::lock_job_states(ctx.conn, &jobs, RowLock::Wait)? {
        ctx.jobs.load(state);
    }
    Ok(())
}

/// An operator's action on a job of `namespace`; returns the job as it is afterwards.
pub(crate) fn operate(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    job_id: &JobId,
    command: OperatorCommand,
) -> Result<JobState> {
    let mut state = load_job(ctx, job_id, RowLock::Wait)?
        .filter(|state| state.job.namespace == namespace)
        .ok_or_else(|| Error::NotFound(format!("job {job_id} not found")))?;
    let compiled = workflow_of(ctx, &state)?;
    apply(
        ctx,
        &compiled.workflow,
        &mut state,
        Input::Operator(command),
    )?;
    ctx.jobs.keep(state.clone());
    Ok(state)
}

pub(crate) fn configure_queue(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    name: &str,
    change: QueueChange,
) -> Result<StoredQueue> {
    check_queue_name(name).map_err(|message| invalid("name", message))?;
    ctx.conn.lock_key(&format!("queue\t{namespace}\t{name}"))?;
    let mut queue = rows::queue(ctx.conn, namespace, name)?.unwrap_or_else(|| StoredQueue {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        config: QueueConfig::default(),
        bucket: None,
        created_at: ctx.now,
        updated_at: None,
    });
    let config = &mut queue.config;
    if let Some(mode) = change.mode {
        config.mode = mode;
    }
    if let Some(priority) = change.priority {
        config.priority = priority;
    }
    if let Some(concurrency) = change.concurrency {
        if concurrency == Some(0) {
            return Err(invalid(
                "concurrency",
                "must be at least 1 (pause the queue to stop it)",
            ));
        }
        config.concurrency = concurrency;
    }
    if let Some(paused) = change.paused {
        config.paused = paused;
    }
    if let Some(rate) = change.rate {
        if let Some(limit) = rate
            && (limit.tokens == 0 || limit.per.as_millis() == 0)
        {
            return Err(invalid(
                "rate",
                "needs at least 1 token per a duration longer than zero",
            ));
        }
        config.rate = rate;
    }
    if let Some(max_wait) = change.max_wait {
        if max_wait.as_millis() == 0 {
            return Err(invalid("max_wait", "must be longer than zero"));
        }
        config.max_wait = max_wait;
    }
    rows::ensure_namespace(ctx.conn, namespace, ctx.now)?;
    rows::save_queue(ctx.conn, &queue, ctx.now)?;
    queue.updated_at = Some(ctx.now);
    ctx.wakes.push((namespace.to_owned(), name.to_owned()));
    Ok(queue)
}

/// Handles every lapsed lease and passed deadline due at `ctx.now`; returns how many jobs moved.
pub(crate) fn tick(ctx: &mut WriteCtx<'_>, limit: usize) -> Result<usize> {
    crate::schedules::fire_due(ctx)?;
    let due = rows::due_jobs(ctx.conn, ctx.now, u32::try_from(limit).unwrap_or(u32::MAX))?;
    for job_id in &due {
        // A job another node holds is being handled there (or will be at its next tick).
        let Some(mut state) = load_job(ctx, job_id, RowLock::Skip)? else {
            continue;
        };
        let compiled = workflow_of(ctx, &state)?;
        apply(ctx, &compiled.workflow, &mut state, Input::Tick)?;
        ctx.jobs.keep(state);
    }
    Ok(due.len())
}

/// A job with its tasks for a command to change: from the writer's job cache when it holds the
/// job, else from the database, its row locked as `lock` says. The command hands it back with
/// `ctx.jobs.keep` once persisted.
fn load_job(ctx: &mut WriteCtx<'_>, id: &JobId, lock: RowLock) -> Result<Option<JobState>> {
    if let Some(state) = ctx.jobs.take(id) {
        return Ok(Some(state));
    }
    rows::lock_job_state(ctx.conn, id, lock)
}

fn workflow_of(ctx: &mut WriteCtx<'_>, state: &JobState) -> Result<std::sync::Arc<Compiled>> {
    ctx.workflow(&state.job.namespace, &state.job.workflow, state.job.version)
}

fn apply(
    ctx: &mut WriteCtx<'_>,
    workflow: &Workflow,
    state: &mut JobState,
    input: Input,
) -> Result<()> {
    let mut ids = UuidIds;
    let mut machine_ctx = Ctx {
        now: ctx.now,
        ids: &mut ids,
        limits: ctx.limits,
    };
    let before = state.job.status;
    let actions =
        machine::apply(workflow, state, input, &mut machine_ctx).map_err(|rejection| {
            match rejection {
                Rejection::UnknownTask(task) => Error::NotFound(format!("task {task} not found")),
                other => Error::Conflict(other.to_string()),
            }
        })?;
    persist(ctx, state, actions)?;
    if state.job.status != before {
        crate::webhooks::enqueue(ctx, &state.job, Some(before))?;
    }
    Ok(())
}

/// Writes what the state machine decided: job row, changed tasks, history, wake-ups.
fn persist(ctx: &mut WriteCtx<'_>, state: &JobState, actions: Vec<Action>) -> Result<()> {
    let mut saved_job = false;
    let mut saved_tasks: HashSet<TaskId> = HashSet::new();
    let mut released = Vec::new();
    let namespace = state.job.namespace.as_str();
    for action in actions {
        match action {
            Action::SaveJob => {
                if !saved_job {
                    ctx.conn.defer_job(&state.job);
                    saved_job = true;
                }
            }
            Action::SaveTask(id) => {
                if saved_tasks.insert(id.clone()) {
                    let task = state
                        .task(&id)
                        .ok_or_else(|| Error::Corrupt(format!("task {id} to save is missing")))?;
                    ctx.conn.defer_task(namespace, task);
                }
            }
            Action::Record(event) => {
                let step = event
                    .task
                    .as_ref()
                    .and_then(|id| state.task(id))
                    .map(|task| task.step.as_str());
                ctx.conn.defer_event(&state.job.id, step, &event);
            }
            Action::Wake { queue } => ctx.wakes.push((namespace.to_owned(), queue)),
            Action::ReleaseLock { key } => released.push(key),
        }
    }
    for key in released {
        rows::release_lock(ctx.conn, &state.job.id)?;
        start_waiting_jobs(ctx, namespace, &key)?;
    }
    Ok(())
}

/// Gives free slots of a lock to the jobs waiting for it, first come first served, and starts
/// them. A job that starts and ends at once frees its slot again, which this loop sees.
fn start_waiting_jobs(ctx: &mut WriteCtx<'_>, namespace: &str, key: &str) -> Result<()> {
    ctx.conn.lock_key(&format!("lock\t{namespace}\t{key}"))?;
    while let Some(job_id) = rows::first_queued(ctx.conn, namespace, key)? {
        let Some(mut state) = load_job(ctx, &job_id, RowLock::Wait)? else {
            break;
        };
        let slots = state.job.lock.as_ref().map_or(1, |lock| lock.slots);
        if rows::lock_holders(ctx.conn, namespace, key)? >= slots {
            ctx.jobs.keep(state);
            break;
        }
        rows::hold_lock(ctx.conn, namespace, key, &job_id, ctx.now)?;
        let compiled = workflow_of(ctx, &state)?;
        apply(ctx, &compiled.workflow, &mut state, Input::Start)?;
        ctx.jobs.keep(state);
    }
    Ok(())
}
