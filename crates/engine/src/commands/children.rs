//! Sub-workflows in the engine: what the state machine asks of child jobs, done in the same
//! transaction (parent first, then child, so two nodes never lock the pair in opposite
//! orders), and a child's end carried to its parent.
//!
//! - `StartChild`: the child job is created from its workflow version, its params checked
//!   against that workflow's schema; one that cannot be made fails the parent's step for good
//!   (`Input::ChildNotStarted`). A lock an ancestor holds takes no slot.
//! - `ToChild`: the child is loaded (locked after its parent) and paused, resumed, cancelled
//!   or rolled back; a child that has already ended, or is not in a state the command applies
//!   to, is left as it is.
//! - A child that ends leaves a row in `child_endings` instead of locking its parent; the timer
//!   loop hands it to the parent (`deliver_endings`), taking the parent's lock first.

use starbridge_core::ids::JobId;
use starbridge_core::labels;
use starbridge_core::machine::NewJob;
use starbridge_core::model::{
    ChildCommand, ChildStart, Input, JobState, OperatorAction, OperatorCommand,
};
use starbridge_store::rows;
use starbridge_store::rows::RowLock;

use super::submit::create_job;
use super::{apply, check_labels, load_job, workflow_of};
use crate::ctx::WriteCtx;
use crate::{Error, Result};

/// Creates the child job `StartChild` asks for; a child that cannot be made fails the parent's
/// step for good instead.
pub(super) fn start_child(
    ctx: &mut WriteCtx<'_>,
    parent: &mut JobState,
    start: ChildStart,
) -> Result<()> {
    let child = start.child.clone();
    let message = match create_child(ctx, parent, start) {
        Ok(()) => return Ok(()),
        Err(Error::Invalid(problems)) => format!(
            "the child job cannot start: {}",
            problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ),
        Err(Error::NotFound(message)) => format!("the child job cannot start: {message}"),
        Err(other) => return Err(other),
    };
    let compiled = workflow_of(ctx, parent)?;
    apply(
        ctx,
        &compiled.workflow,
        parent,
        Input::ChildNotStarted { child, message },
    )
}

fn create_child(ctx: &mut WriteCtx<'_>, parent: &JobState, start: ChildStart) -> Result<()> {
    let namespace = parent.job.namespace.clone();
    let compiled = ctx.workflow(&namespace, &start.workflow, start.version)?;
    compiled.check_params(&start.params)?;
    // A child carries its parent's labels over its own workflow's.
    let labels = labels::merge(&compiled.workflow.labels, &parent.job.labels);
    check_labels(ctx.limits, &labels)?;
    let mut new = NewJob::new(start.child, namespace.clone(), start.version, start.params);
    new.priority = Some(start.priority);
    new.actor = Some(format!("job {}", parent.job.id));
    new.labels = labels;
    new.depth = parent.job.depth + 1;
    new.child_versions = child_versions(ctx, &namespace, &compiled.workflow)?;
    new.held_by_ancestors = ancestors_locks(ctx, parent)?;
    new.step_lock = start.lock;
    new.parent = Some(start.parent);
    create_job(ctx, &compiled.workflow, new).map(|_| ())
}

/// The version of each sub-workflow `workflow`'s steps start without naming one: the latest
/// now (one never applied is left out; its step fails when it runs).
pub(super) fn child_versions(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    workflow: &starbridge_core::Workflow,
) -> Result<std::collections::BTreeMap<String, u32>> {
    let mut versions = std::collections::BTreeMap::new();
    for step in &workflow.steps {
        if let Some(child) = step.child()
            && child.version.is_none()
            && !versions.contains_key(&child.workflow)
            && let Some(latest) = ctx.latest_version(namespace, &child.workflow)?
        {
            versions.insert(child.workflow.clone(), latest);
        }
    }
    Ok(versions)
}

/// The lock keys `parent` and its ancestors hold (as their workflows' locks).
pub(super) fn ancestors_locks(ctx: &mut WriteCtx<'_>, parent: &JobState) -> Result<Vec<String>> {
    let mut keys: Vec<String> = parent.job.lock.iter().map(|l| l.key.clone()).collect();
    let mut next = parent.job.parent.as_ref().map(|link| link.job.clone());
    while let Some(id) = next {
        let Some(job) = read_job(ctx, &id)? else {
            break;
        };
        keys.extend(job.job.lock.iter().map(|l| l.key.clone()));
        next = job.job.parent.map(|link| link.job);
    }
    Ok(keys)
}

/// A job as this transaction sees it, without changing it.
pub(super) fn read_job(ctx: &mut WriteCtx<'_>, id: &JobId) -> Result<Option<JobState>> {
    match ctx.jobs.take(id) {
        Some(state) => {
            ctx.jobs.keep(state.clone());
            Ok(Some(*state))
        }
        None => rows::lock_job_state(ctx.conn, id, RowLock::None),
    }
}

/// Pauses, resumes, cancels or rolls back a child job, after its parent (`by`) was locked.
pub(super) fn command_child(
    ctx: &mut WriteCtx<'_>,
    by: &JobId,
    child: &JobId,
    command: ChildCommand,
) -> Result<()> {
    let Some(mut state) = load_job(ctx, child, RowLock::Wait)? else {
        return Ok(());
    };
    let operator = |action| {
        Input::Operator(OperatorCommand {
            actor: format!("job {by}"),
            reason: Some("its parent job did so".to_owned()),
            action,
        })
    };
    let input = match command {
        ChildCommand::RollBack => Input::RollBack { by: by.clone() },
        ChildCommand::Pause => operator(OperatorAction::Pause),
        ChildCommand::Resume => operator(OperatorAction::Resume),
        ChildCommand::Cancel { compensate } => operator(OperatorAction::Cancel { compensate }),
    };
    let compiled = workflow_of(ctx, &state)?;
    let applied = apply(ctx, &compiled.workflow, &mut state, input);
    ctx.jobs.keep(state);
    match applied {
        // A child that ended meanwhile, or is in a state the command does not apply to.
        Err(Error::Conflict(_)) => Ok(()),
        other => other,
    }
}

/// Hands the children's noted endings to their parents, each parent locked first (one another
/// node holds is left for later); returns how many endings were handled.
pub(crate) fn deliver_endings(ctx: &mut WriteCtx<'_>, limit: u32) -> Result<usize> {
    let endings = rows::children::due_endings(ctx.conn, limit)?;
    for (child, parent) in &endings {
        let Some(mut state) = load_job(ctx, parent, RowLock::Skip)? else {
            if rows::load_job(ctx.conn, parent)?.is_none() {
                // The parent is gone (deleted by retention): nobody waits.
                rows::children::forget_ending(ctx.conn, child)?;
            }
            continue;
        };
        let ended = read_job(ctx, child)?;
        let applied = match ended {
            Some(ended) => {
                let input = Input::ChildEnded {
                    child: child.clone(),
                    status: ended.job.status,
                    output: ended.job.output.clone(),
                    error: ended.job.wind_down.as_ref().map(|reason| reason.describe()),
                };
                let compiled = workflow_of(ctx, &state)?;
                apply(ctx, &compiled.workflow, &mut state, input)
            }
            None => Ok(()),
        };
        ctx.jobs.keep(state);
        match applied {
            // The parent no longer waits for it (cancelled, or on a newer attempt).
            Ok(()) | Err(Error::Conflict(_)) => rows::children::forget_ending(ctx.conn, child)?,
            Err(other) => return Err(other),
        }
    }
    Ok(endings.len())
}

/// The parent job that keeps `job` as a child, if `job` is one and its parent still exists.
pub(super) fn parent_of(ctx: &mut WriteCtx<'_>, job: &JobId) -> Result<Option<JobId>> {
    let Some(state) = read_job(ctx, job)? else {
        return Ok(None);
    };
    let Some(parent) = state.job.parent else {
        return Ok(None);
    };
    Ok(read_job(ctx, &parent.job)?.map(|_| parent.job))
}

/// Checks, when a workflow is applied, that every sub-workflow its steps start is applied in
/// the namespace (in the version a step pins), and that it does not start itself through them
/// (as far as their latest versions show).
pub(super) fn check_children(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    workflow: &starbridge_core::Workflow,
) -> Result<()> {
    let mut problems = Vec::new();
    for (position, step) in workflow.steps.iter().enumerate() {
        let Some(child) = step.child() else { continue };
        let field = format!(
            "{}.workflow",
            starbridge_core::definition::step_label(position, Some(&step.id))
        );
        // A deleted workflow counts as not applied, whatever version a step pins.
        let known = ctx.latest_version(namespace, &child.workflow)?.is_some()
            && match child.version {
                Some(version) => {
                    rows::workflow(ctx.conn, namespace, &child.workflow, Some(version))?.is_some()
                }
                None => true,
            };
        if !known {
            let version = child
                .version
                .map(|v| format!(" version {v}"))
                .unwrap_or_default();
            problems.push(starbridge_core::definition::Problem {
                field,
                message: format!(
                    "workflow '{}'{version} is not applied in namespace '{namespace}': apply it first",
                    child.workflow
                ),
            });
            continue;
        }
        if let Some(path) = starts_again(ctx, namespace, &workflow.name, &child.workflow)? {
            problems.push(starbridge_core::definition::Problem {
                field,
                message: format!(
                    "this would start workflow '{}' again through {}: a job would nest without end",
                    workflow.name,
                    path.join(" -> ")
                ),
            });
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Invalid(problems))
    }
}

/// The chain of latest versions through which `child` starts `name` again, if one does.
fn starts_again(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    name: &str,
    child: &str,
) -> Result<Option<Vec<String>>> {
    let mut seen = std::collections::HashSet::new();
    let mut queue = std::collections::VecDeque::from([vec![child.to_owned()]]);
    while let Some(path) = queue.pop_front() {
        let last = path.last().cloned().unwrap_or_default();
        if last == name {
            return Ok(Some(path));
        }
        if !seen.insert(last.clone()) {
            continue;
        }
        let Some(version) = ctx.latest_version(namespace, &last)? else {
            continue;
        };
        let compiled = ctx.workflow(namespace, &last, version)?;
        for step in &compiled.workflow.steps {
            if let Some(next) = step.child() {
                let mut longer = path.clone();
                longer.push(next.workflow.clone());
                queue.push_back(longer);
            }
        }
    }
    Ok(None)
}
