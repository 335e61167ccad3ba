//! Submitting a job: by name and version, or with an inline definition.
//!
//! Most submits name a workflow without a version, with no lock and no child steps. Such a
//! submit is made ready on its request's own task (`prepare`): its ids, its params and labels
//! checked, the state machine's new job and the actions that persist it, against the version
//! the writer last read as the workflow's latest. On the writer it only checks that this
//! version is still the latest (else, or when it runs again, it takes the whole way) and persists
//! what was made: the writer's time goes to the database.

use crate::cache::{Compiled, WorkflowCache};
use crate::ctx::WriteCtx;
use crate::{Error, Result, Submit, Submitted};
use serde_json::Value;
use starbridge_core::Workflow;
use starbridge_core::definition::check_name;
use starbridge_core::labels;
use starbridge_core::limits::{Limits, MAX_KEY_BYTES};
use starbridge_core::machine::{self, Ctx, NewJob};
use starbridge_core::model::{Action, JobState};
use starbridge_core::time::Timestamp;
use starbridge_store::rows;
use starbridge_store::rows::RowLock;

use super::{
    UuidIds, carry_out, check_labels, check_no_nul, child_versions, hand_out_slots, invalid,
    load_job, new_job_id, persist, store_workflow,
};

/// A submit's new job, made before it reached the writer (see the module's documentation).
pub(crate) struct Prepared {
    /// The workflow's latest version it was made against.
    version: u32,
    state: JobState,
    /// A copy of `state` for the answer, made beside the writer too.
    answer: JobState,
    actions: Vec<Action>,
}

/// Makes `request`'s job ready outside the writer, when it names a workflow without a version
/// whose latest version (as last read) is compiled and has no lock and no child step, and its
/// params and labels pass. `None` otherwise: the writer then takes the whole way, and answers
/// any refusal exactly as always.
pub(crate) fn prepare(
    workflows: &WorkflowCache,
    limits: Limits,
    now: Timestamp,
    namespace: &str,
    request: &Submit,
) -> Option<Prepared> {
    if request.definition.is_some() || request.version.is_some() {
        return None;
    }
    let name = request.workflow.as_deref()?;
    let version = workflows.latest_hint(namespace, name)?;
    let compiled = workflows.cached(namespace, name, version)?;
    let workflow = &compiled.workflow;
    if workflow.lock.is_some() || workflow.steps.iter().any(|step| step.child().is_some()) {
        return None;
    }
    let new = new_job(&compiled, namespace, request, limits).ok()?;
    let (state, actions) = make_job(workflow, new, now, limits).ok()?;
    Some(Prepared {
        version,
        answer: state.clone(),
        state,
        actions,
    })
}

/// Submits `request`, persisting `prepared` (made from it by `prepare`) when its version is still
/// the workflow's latest.
pub(crate) fn submit(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    request: &Submit,
    prepared: Option<Prepared>,
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
                        *cached
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
    if let Some(prepared) = prepared
        && let Some(name) = &request.workflow
        && ctx.latest_version(namespace, name)? == Some(prepared.version)
    {
        let state = persist_created(ctx, prepared.state, prepared.actions, Some(prepared.answer))?;
        set_trace(ctx, &state, request.traceparent.as_deref())?;
        return Ok(Submitted {
            state,
            created: true,
            added_version: None,
        });
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
            // A deleted workflow runs no new job, not even in a version given by number.
            let latest = ctx.latest_version(namespace, name)?.ok_or_else(|| {
                Error::NotFound(format!(
                    "workflow '{name}' not found in namespace '{namespace}': apply it first"
                ))
            })?;
            let version = request.version.unwrap_or(latest);
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
    let mut new = new_job(&compiled, namespace, request, ctx.limits)?;
    new.child_versions = child_versions(ctx, namespace, &compiled.workflow)?;
    let state = create_job(ctx, &compiled.workflow, new)?;
    set_trace(ctx, &state, request.traceparent.as_deref())?;
    Ok(Submitted {
        state,
        created: true,
        added_version,
    })
}

/// Creates a job of `workflow` as `new` says (its labels already merged and checked) and
/// persists it with its label rows, then starts the children its first steps ask for; a job of
/// a workflow with a lock starts if a slot is free.
pub(crate) fn create_job(
    ctx: &mut WriteCtx<'_>,
    workflow: &Workflow,
    new: NewJob,
) -> Result<JobState> {
    let (state, actions) = make_job(workflow, new, ctx.now, ctx.limits)?;
    if let Some(lock) = &state.job.lock {
        check_no_nul("lock.key", &lock.key)?;
    }
    persist_created(ctx, state, actions, None)
}

/// The new job `request` asks for, of `compiled`: its params checked against the workflow's
/// schema, its labels merged over the workflow's and checked (the workflow's own were checked
/// when it was applied: this checks the submission's and, merged, their number). The versions
/// of its children are the caller's to add.
fn new_job(
    compiled: &Compiled,
    namespace: &str,
    request: &Submit,
    limits: Limits,
) -> Result<NewJob> {
    let params = request
        .params
        .clone()
        .unwrap_or_else(|| Value::Object(Default::default()));
    if !params.is_object() {
        return Err(invalid("params", "must be a JSON object"));
    }
    compiled.check_params(&params)?;
    let labels = labels::merge(&compiled.workflow.labels, &request.labels);
    check_labels(limits, &labels)?;
    let mut new = NewJob::new(new_job_id(), namespace.to_owned(), compiled.version, params);
    new.key = request.key.clone();
    new.priority = request.priority;
    new.actor = request.actor.clone();
    new.labels = labels;
    Ok(new)
}

/// The state machine's new job of `workflow` as `new` says, and the actions that persist it.
fn make_job(
    workflow: &Workflow,
    new: NewJob,
    now: Timestamp,
    limits: Limits,
) -> Result<(JobState, Vec<Action>)> {
    let mut ids = UuidIds;
    let mut machine_ctx = Ctx {
        now,
        ids: &mut ids,
        limits,
    };
    machine::create_job(workflow, new, &mut machine_ctx).map_err(|error| match error {
        machine::CreateError::LockKey(message) => invalid("lock.key", message),
    })
}

/// While tracing is on, stores the new job's trace (continuing the submitter's `traceparent`).
fn set_trace(ctx: &mut WriteCtx<'_>, state: &JobState, traceparent: Option<&str>) -> Result<()> {
    if ctx.tracing {
        let trace = crate::traces::fresh_trace(traceparent);
        rows::set_trace(ctx.conn, &state.job.id, &trace)?;
    }
    Ok(())
}

/// Persists a job the state machine just created, with its label rows, then starts the children
/// its first steps ask for; a job of a workflow with a lock starts if a slot is free. Returns the
/// job as it then is: `answer`, a copy of `state` made beforehand, when neither changed it.
fn persist_created(
    ctx: &mut WriteCtx<'_>,
    mut state: JobState,
    actions: Vec<Action>,
    answer: Option<JobState>,
) -> Result<JobState> {
    let namespace = state.job.namespace.clone();
    let follow_ups = persist(ctx, &state, actions)?;
    ctx.conn.defer_labels(&state.job);
    crate::commands::outbox::enqueue(ctx, &state.job, None)?;
    if let Some(answer) = answer
        && follow_ups.is_empty()
        && state.job.lock.is_none()
    {
        ctx.jobs.keep(state);
        return Ok(answer);
    }
    carry_out(ctx, &mut state, follow_ups)?;
    ctx.jobs.keep(state.clone());
    if let Some(lock) = state.job.lock.clone() {
        hand_out_slots(ctx, &namespace, &lock.key, false)?;
        if let Some(started) = load_job(ctx, &state.job.id, RowLock::None)? {
            ctx.jobs.keep(started.clone());
            state = *started;
        }
    }
    Ok(state)
}
