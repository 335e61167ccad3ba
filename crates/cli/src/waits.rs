//! Commands for what waits on people and other systems: `approvals`, `approve`, `reject` and
//! `signal`.

use std::process::ExitCode;

use anyhow::{Context as _, Result, bail};
use clap::Args;
use serde_json::Value;
use starbridge_api as api;

use crate::client::{Context, operated, show};
use crate::output::table;

#[derive(Args)]
pub(crate) struct DecisionArgs {
    /// The job.
    job: String,
    /// The approval step (its id in the workflow), or a task id (`tsk_…`).
    step: String,
    /// Which item of a `for_each` approval step.
    #[arg(long)]
    item: Option<u32>,
    /// Why (recorded in the job's history, and in the step's output on approval).
    #[arg(long)]
    comment: Option<String>,
}

#[derive(Args)]
pub(crate) struct SignalArgs {
    /// The job.
    job: String,
    /// The signal's name (a `signal:` step of the job's workflow waits for it).
    name: String,
    /// What the signal carries, as JSON (the output of the step that takes it).
    #[arg(long, default_value = "null")]
    payload: String,
    /// A dedupe id: sending again with the same id changes nothing.
    #[arg(long)]
    id: Option<String>,
}

pub(crate) async fn approvals(context: &Context) -> Result<ExitCode> {
    let list = context.client.approvals().await?;
    show(context, &list, |list| {
        let rows: Vec<Vec<String>> = list
            .items
            .iter()
            .map(|a| {
                vec![
                    a.job_id.clone(),
                    a.workflow.clone(),
                    match a.item {
                        Some(item) => format!("{}[{item}]", a.step),
                        None => a.step.clone(),
                    },
                    a.since.to_string(),
                    if a.decided {
                        format!("{} (decided; takes effect at resume)", a.prompt)
                    } else {
                        a.prompt.clone()
                    },
                ]
            })
            .collect();
        table(&["JOB", "WORKFLOW", "STEP", "SINCE", "PROMPT"], &rows);
    })
}

pub(crate) async fn decide(
    context: &Context,
    args: &DecisionArgs,
    approve: bool,
) -> Result<ExitCode> {
    let task = approval_task(context, args).await?;
    let request = api::DecisionRequest {
        comment: args.comment.clone(),
    };
    let job = context
        .client
        .decide(&args.job, &task, approve, &request)
        .await?;
    operated(context, &job)
}

/// The task of `args.step` (with `--item`) that waits for approval: a step with several such
/// tasks (a `for_each`) needs `--item`, and the refusal names the choices.
async fn approval_task(context: &Context, args: &DecisionArgs) -> Result<String> {
    if args.step.starts_with("tsk_") {
        return Ok(args.step.clone());
    }
    let job = context.client.job(&args.job).await?;
    let of_step: Vec<&api::TaskView> = job
        .tasks
        .iter()
        .filter(|task| task.step == args.step && task.kind != api::TaskKind::Compensation)
        .filter(|task| args.item.is_none() || task.item == args.item)
        .collect();
    if of_step.is_empty() {
        bail!(
            "job {} has no step '{}'{}",
            args.job,
            args.step,
            args.item.map(|i| format!(" item {i}")).unwrap_or_default()
        );
    }
    let waiting: Vec<&&api::TaskView> = of_step
        .iter()
        .filter(|task| {
            task.waiting_for
                .as_ref()
                .is_some_and(|w| w.approval.is_some())
        })
        .collect();
    match waiting.as_slice() {
        [task] => Ok(task.id.clone()),
        [] => bail!(
            "step '{}' of job {} is not waiting for approval (it is {})",
            args.step,
            args.job,
            of_step[0].status
        ),
        several => {
            let items: Vec<String> = several
                .iter()
                .map(|task| task.item.map_or_else(|| task.id.clone(), |i| i.to_string()))
                .collect();
            bail!(
                "step '{}' of job {} waits for approval on several items: {}; choose one with --item",
                args.step,
                args.job,
                items.join(", ")
            )
        }
    }
}

pub(crate) async fn signal(context: &Context, args: &SignalArgs) -> Result<ExitCode> {
    let payload: Value =
        serde_json::from_str(&args.payload).context("--payload is not valid JSON")?;
    let request = api::SignalRequest {
        payload,
        id: args.id.clone(),
    };
    let accepted = context
        .client
        .signal(&args.job, &args.name, &request)
        .await?;
    show(context, &accepted, |accepted| {
        let what = if accepted.duplicate {
            "was already received (same --id): nothing changed"
        } else if accepted.taken {
            "was taken by a waiting step"
        } else {
            "is kept until a step waits for it"
        };
        println!("signal {} to job {} {what}", accepted.name, accepted.job_id);
    })
}
