//! Applying a workflow definition: a new version, or the one it equals.

use crate::cache::Compiled;
use crate::ctx::WriteCtx;
use crate::{Applied, Error, Result, StoredWorkflow};
use serde_json::Value;
use starbridge_core::Workflow;
use starbridge_store::rows;
use std::collections::HashSet;

use super::{check_labels, invalid};

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
pub(super) fn check_no_nul(field: &str, text: &str) -> Result<()> {
    if text.contains('\0') {
        return Err(invalid(
            field,
            "must not contain a NUL character (\\u0000): remove it",
        ));
    }
    Ok(())
}

pub(super) fn store_workflow(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    workflow: Workflow,
) -> Result<Applied> {
    if let Some(description) = &workflow.description {
        check_no_nul("description", description)?;
    }
    check_labels(ctx.limits, &workflow.labels)?;
    let name = workflow.name.clone();
    super::check_children(ctx, namespace, &workflow)?;
    let latest = rows::workflow(ctx.conn, namespace, &name, None)?;
    if let Some(latest) = &latest
        && latest.definition == workflow.source
    {
        return Ok(Applied {
            version: latest.version,
            created: false,
        });
    }
    // A deleted workflow's versions keep their numbers: a new one continues after them.
    let version = rows::highest_version(ctx.conn, namespace, &name)?.map_or(1, |v| v + 1);
    // Compile the params schema now so a bad schema is refused at apply time.
    let steps = u32::try_from(workflow.steps.len()).unwrap_or(u32::MAX);
    // A queue template's queues are made when its tasks render them (`Action::EnsureQueue`).
    let queues: Vec<String> = workflow
        .steps
        .iter()
        .flat_map(|step| step.handler().into_iter().chain(step.compensate.as_ref()))
        .filter_map(|handler| handler.queue.name().map(str::to_owned))
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
        ctx.reads.forget_queue(namespace, &queue);
    }
    Ok(Applied {
        version,
        created: true,
    })
}

/// Jobs named in a refusal to delete a workflow; the rest are counted.
const LISTED_JOBS: u32 = 5;

/// Deletes (hides) a workflow of `namespace`: refused while anything could still run it — an
/// unfinished job, a job that could still be retried, a schedule, or a sub-workflow step of
/// another workflow — naming them all.
pub(crate) fn delete_workflow(ctx: &mut WriteCtx<'_>, namespace: &str, name: &str) -> Result<()> {
    if ctx.latest_version(namespace, name)?.is_none() {
        return Err(Error::NotFound(format!(
            "workflow '{name}' not found in namespace '{namespace}'"
        )));
    }
    let mut users = Vec::new();
    let (jobs, listed) = rows::unsettled_jobs(ctx.conn, namespace, name, LISTED_JOBS)?;
    if jobs > 0 {
        let more = jobs.saturating_sub(listed.len() as u64);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        users.push(format!(
            "{jobs} job(s) not succeeded, which could still run or be retried ({}{more}): let \
             them finish, or delete them (`POST /api/v1/jobs/bulk/delete` with `workflow`)",
            listed.join(", ")
        ));
    }
    let schedules: Vec<String> = rows::schedules::list(ctx.conn, namespace)?
        .into_iter()
        .filter(|schedule| schedule.workflow == name)
        .map(|schedule| schedule.name)
        .collect();
    if !schedules.is_empty() {
        users.push(format!(
            "schedule(s) {}: delete them first",
            schedules.join(", ")
        ));
    }
    for other in rows::list_workflows(ctx.conn, namespace)? {
        if other.name == name {
            continue;
        }
        let compiled = ctx.workflow(namespace, &other.name, other.version)?;
        for step in &compiled.workflow.steps {
            if step.child().is_some_and(|child| child.workflow == name) {
                users.push(format!(
                    "step '{}' of workflow '{}' starts it as a sub-workflow: change or delete \
                     that workflow first",
                    step.id, other.name
                ));
            }
        }
    }
    if !users.is_empty() {
        return Err(Error::Conflict(format!(
            "workflow '{name}' is still in use: {}",
            users.join("; ")
        )));
    }
    rows::hide_workflow(ctx.conn, namespace, name, ctx.now)?;
    ctx.reads.forget_version(namespace, name);
    Ok(())
}
