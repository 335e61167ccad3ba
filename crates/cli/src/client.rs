//! Client commands: apply, submit, list, show, follow, operate. They speak the public HTTP API
//! only, through the typed client of `starbridge_api::client`, so they work against any server.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::Args;
use serde_json::Value;
use starbridge_api::client::Client;
use starbridge_api::{self as api, JobStatus, Open, TaskKind, TaskStatus, WebhookEvent, WireEnum};

use crate::Format;
use crate::output::{clip, elapsed, table, time};

pub(crate) struct Context {
    /// A client of the server in the command's namespace, acting as `$USER`.
    pub(crate) client: Client,
    pub(crate) namespace: String,
    pub(crate) format: Format,
}

/// A client of `server`, trusting the CA certificate in the file `ca_cert` too when given.
pub(crate) fn connect(server: &str, ca_cert: Option<&Path>) -> Result<Client> {
    let Some(path) = ca_cert else {
        return Client::new(server).with_context(|| format!("--server {server}"));
    };
    let pem = std::fs::read(path)
        .with_context(|| format!("--ca-cert {}: cannot read it", path.display()))?;
    Client::with_ca_pem(server, &pem)
        .with_context(|| format!("--server {server} with --ca-cert {}", path.display()))
}

impl Context {
    pub(crate) fn new(
        server: &str,
        ca_cert: Option<&Path>,
        namespace: &str,
        token: Option<String>,
        format: Format,
    ) -> Result<Context> {
        Ok(Context {
            client: connect(server, ca_cert)?
                .with_actor(Some(actor()))
                .with_token(token)
                .with_namespace(Some(namespace.to_owned())),
            namespace: namespace.to_owned(),
            format,
        })
    }

    fn json(&self) -> bool {
        self.format == Format::Json
    }
}

fn print_json<T: serde::Serialize>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Prints `value` as JSON with `-o json`, else as `human` renders it.
pub(crate) fn show<T: serde::Serialize>(
    context: &Context,
    value: &T,
    human: impl FnOnce(&T),
) -> Result<ExitCode> {
    if context.json() {
        print_json(value)?;
    } else {
        human(value);
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub(crate) struct ApplyArgs {
    /// The definition file (YAML or JSON).
    file: PathBuf,
    /// Name to apply it under (default: the `name` in the file, else the file's stem).
    #[arg(long)]
    name: Option<String>,
}

/// The name a definition file is applied under.
fn definition_name(file: &std::path::Path, text: &str, explicit: Option<String>) -> Result<String> {
    if let Some(name) = explicit {
        return Ok(name);
    }
    if let Ok(document) = starbridge_core::definition::parse_document(text)
        && let Some(name) = document.get("name").and_then(Value::as_str)
    {
        return Ok(name.to_owned());
    }
    file.file_stem()
        .and_then(|stem| stem.to_str())
        .map(str::to_owned)
        .context("cannot tell the workflow's name: pass --name")
}

pub(crate) async fn apply(context: &Context, args: ApplyArgs) -> Result<ExitCode> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let name = definition_name(&args.file, &text, args.name)?;
    let applied = apply_document(context, &name, &text).await?;
    if context.json() {
        print_json(&applied)?;
    } else {
        let what = if applied.created {
            "applied"
        } else {
            "unchanged"
        };
        println!("{} version {} {what}", applied.name, applied.version);
    }
    Ok(ExitCode::SUCCESS)
}

/// Applies a definition text under `name`.
pub(crate) async fn apply_document(
    context: &Context,
    name: &str,
    text: &str,
) -> Result<api::AppliedWorkflow> {
    Ok(context.client.apply_workflow(name, text).await?)
}

pub(crate) async fn workflows(context: &Context) -> Result<ExitCode> {
    let list = context.client.workflows().await?;
    show(context, &list, |list| {
        let rows: Vec<Vec<String>> = list
            .items
            .iter()
            .map(|w| {
                vec![
                    w.name.clone(),
                    w.version.to_string(),
                    w.steps.to_string(),
                    time(Some(w.created_at)),
                    clip(w.description.as_deref().unwrap_or(""), 60),
                ]
            })
            .collect();
        table(
            &["NAME", "VERSION", "STEPS", "APPLIED", "DESCRIPTION"],
            &rows,
        );
    })
}

#[derive(clap::Subcommand)]
pub(crate) enum WorkflowCommand {
    /// Delete a workflow: it is hidden and runs no new job (its versions stay for the jobs
    /// that ran them; applying it again continues at the next version). Refused while a job
    /// of it could still run or be retried, a schedule runs it, or another workflow starts it.
    Delete {
        /// The workflow.
        name: String,
    },
}

/// Acts on one workflow.
pub(crate) async fn workflow(context: &Context, command: &WorkflowCommand) -> Result<ExitCode> {
    match command {
        WorkflowCommand::Delete { name } => {
            context.client.delete_workflow(name).await?;
            eprintln!("workflow {name} deleted");
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[derive(Args)]
pub(crate) struct SubmitArgs {
    /// Workflow to run.
    workflow: String,
    /// A parameter `key=value`; the value is read as JSON when it parses (numbers, true, lists),
    /// else as a string. Repeatable.
    #[arg(long = "param", short = 'p', value_name = "KEY=VALUE")]
    params: Vec<String>,
    /// All params as one JSON object (merged under --param).
    #[arg(long = "params", value_name = "JSON")]
    params_json: Option<String>,
    /// Idempotency key: submitting the same key again returns the first job.
    #[arg(long)]
    key: Option<String>,
    #[arg(long)]
    priority: Option<i32>,
    /// A specific version of the workflow (default: the latest).
    #[arg(long)]
    version: Option<u32>,
    /// A label `key=value` of the job, merged over its workflow's. Repeatable.
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// Follow the job until it ends.
    #[arg(long)]
    watch: bool,
}

/// Builds a labels object from `--label` pairs (split at the first `=`; the server checks keys
/// and values).
fn labels(pairs: &[String]) -> Result<api::Labels> {
    pairs
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) => Ok((key.to_owned(), value.to_owned())),
            None => bail!("--label {pair}: expected KEY=VALUE"),
        })
        .collect()
}

/// Builds the params object from `--params` and `--param` pairs.
fn params(pairs: &[String], json: Option<&str>) -> Result<Value> {
    let mut params = match json {
        Some(text) => serde_json::from_str::<Value>(text).context("--params is not valid JSON")?,
        None => Value::Object(Default::default()),
    };
    let Some(object) = params.as_object_mut() else {
        bail!("--params must be a JSON object");
    };
    for pair in pairs {
        let Some((key, raw)) = pair.split_once('=') else {
            bail!("--param {pair}: expected KEY=VALUE");
        };
        if key.is_empty() {
            bail!("--param {pair}: the key is empty");
        }
        let value = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()));
        object.insert(key.to_owned(), value);
    }
    Ok(params)
}

pub(crate) async fn submit(context: &Context, args: SubmitArgs) -> Result<ExitCode> {
    let request = api::SubmitJob {
        workflow: Some(args.workflow),
        version: args.version,
        definition: None,
        params: Some(params(&args.params, args.params_json.as_deref())?),
        key: args.key,
        priority: args.priority,
        labels: labels(&args.labels)?,
    };
    let job = context.client.submit(&request).await?;
    if context.json() && !args.watch {
        print_json(&job)?;
    } else {
        println!("{}", job.summary.id);
        eprintln!(
            "submitted job {} ({} v{}): {}",
            job.summary.id, job.summary.workflow, job.summary.version, job.summary.status
        );
    }
    if args.watch {
        return watch(context, &job.summary.id).await;
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub(crate) struct JobsArgs {
    #[arg(long)]
    status: Option<Open<JobStatus>>,
    #[arg(long)]
    workflow: Option<String>,
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// `next_cursor` of the previous page.
    #[arg(long)]
    cursor: Option<String>,
    /// Only jobs with this label, `key=value`; repeat it for jobs with every one of several.
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
    labels: Vec<String>,
}

pub(crate) async fn jobs(context: &Context, args: JobsArgs) -> Result<ExitCode> {
    let query = api::JobListQuery {
        status: args.status,
        workflow: args.workflow,
        limit: Some(args.limit),
        cursor: args.cursor,
        labels: args.labels,
        ..api::JobListQuery::default()
    };
    let list = context.client.jobs(&query).await?;
    show(context, &list, |list| {
        let rows: Vec<Vec<String>> = list
            .items
            .iter()
            .map(|job| {
                vec![
                    job.id.clone(),
                    format!("{} v{}", job.workflow, job.version),
                    job.status.to_string(),
                    time(Some(job.created_at)),
                    elapsed(job.started_at, job.ended_at),
                    clip(job.error.as_deref().unwrap_or(""), 60),
                ]
            })
            .collect();
        table(
            &["ID", "WORKFLOW", "STATUS", "CREATED", "TOOK", "ERROR"],
            &rows,
        );
        if let Some(cursor) = &list.next_cursor {
            eprintln!("more: --cursor {cursor}");
        }
    })
}

/// `create_db`, `configure[1]`, or `undo create_db`.
fn task_label(task: &api::TaskView) -> String {
    let base = match task.item {
        Some(item) => format!("{}[{item}]", task.step),
        None => task.step.clone(),
    };
    if task.kind == TaskKind::Compensation {
        format!("undo {base}")
    } else {
        base
    }
}

fn task_note(task: &api::TaskView) -> String {
    if let Some(reason) = &task.waiting_reason {
        return clip(reason, 70);
    }
    if let Some(error) = &task.error {
        return clip(&error.message, 70);
    }
    match &task.output {
        Some(output) if !output.is_null() => clip(&output.to_string(), 70),
        _ => String::new(),
    }
}

/// `starbridge job ID` shows a job; `starbridge job delete ID` deletes a finished one.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct JobArgs {
    /// The job to show.
    #[arg(required = true)]
    id: Option<String>,
    #[command(subcommand)]
    command: Option<JobCommand>,
}

#[derive(clap::Subcommand)]
pub(crate) enum JobCommand {
    /// Delete a finished job with its tasks and history; its idempotency key is free again.
    Delete {
        /// The job.
        id: String,
    },
}

/// Shows a job, or deletes a finished one.
pub(crate) async fn job_command(context: &Context, args: &JobArgs) -> Result<ExitCode> {
    match (&args.command, &args.id) {
        (Some(JobCommand::Delete { id }), _) => {
            context.client.delete_job(id).await?;
            eprintln!("job {id} deleted");
            Ok(ExitCode::SUCCESS)
        }
        (None, Some(id)) => job(context, id).await,
        (None, None) => bail!("name the job to show"),
    }
}

pub(crate) async fn job(context: &Context, id: &str) -> Result<ExitCode> {
    let job = context.client.job(id).await?;
    show(context, &job, |job| {
        let summary = &job.summary;
        println!("job       {}", summary.id);
        println!("workflow  {} v{}", summary.workflow, summary.version);
        if let Some(parent) = &summary.parent {
            println!(
                "parent    {} (task {}, attempt {})",
                parent.job, parent.task, parent.attempt
            );
        }
        println!("status    {}", summary.status);
        if let Some(error) = &summary.error {
            println!("error     {error}");
        }
        if let Some(reason) = &summary.waiting_reason {
            println!("waiting   {reason}");
        }
        if !summary.failed_steps.is_empty() {
            println!(
                "went on past failed steps: {}",
                summary.failed_steps.join(", ")
            );
        }
        println!("params    {}", job.params);
        if let Some(output) = &job.output {
            println!("output    {output}");
        }
        if !job.children.is_empty() {
            println!("children  {}", job.children.join(", "));
        }
        if !summary.labels.is_empty() {
            let labels: Vec<String> = summary
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            println!("labels    {}", labels.join(" "));
        }
        println!(
            "created   {}   took {}",
            time(Some(summary.created_at)),
            elapsed(summary.started_at, summary.ended_at)
        );
        println!();
        let rows: Vec<Vec<String>> = job
            .tasks
            .iter()
            .map(|task| {
                vec![
                    task_label(task),
                    task.status.to_string(),
                    if task.kind == TaskKind::FanOut {
                        "-".to_owned()
                    } else {
                        format!("{}/{}", task.attempt, task.max_attempts)
                    },
                    task.worker_id.clone().unwrap_or_else(|| "-".to_owned()),
                    elapsed(task.started_at, task.ended_at),
                    task_note(task),
                ]
            })
            .collect();
        table(
            &[
                "TASK",
                "STATUS",
                "ATTEMPT",
                "WORKER",
                "TOOK",
                "OUTPUT / ERROR",
            ],
            &rows,
        );
    })
}

pub(crate) async fn events(context: &Context, id: &str) -> Result<ExitCode> {
    let events = context.client.events(id).await?;
    show(context, &events, |events| {
        let rows: Vec<Vec<String>> = events
            .items
            .iter()
            .map(|event| {
                vec![
                    event.seq.to_string(),
                    event.at.strftime("%H:%M:%S%.3f").to_string(),
                    event.kind.to_string(),
                    event.step.clone().unwrap_or_default(),
                    event.attempt.map(|a| a.to_string()).unwrap_or_default(),
                    clip(&event.detail.to_string(), 80),
                ]
            })
            .collect();
        table(&["SEQ", "AT", "EVENT", "STEP", "ATTEMPT", "DETAIL"], &rows);
    })
}

#[derive(Args)]
pub(crate) struct ActionArgs {
    /// The job.
    id: String,
    /// Why (recorded in the job's history).
    #[arg(long)]
    reason: Option<String>,
}

impl ActionArgs {
    fn request(&self) -> api::ActionRequest {
        api::ActionRequest {
            reason: self.reason.clone(),
        }
    }
}

#[derive(Args)]
pub(crate) struct CancelArgs {
    #[command(flatten)]
    action: ActionArgs,
    /// Undo the finished steps (run their compensations) before ending.
    #[arg(long)]
    compensate: bool,
}

#[derive(Args)]
pub(crate) struct SkipArgs {
    #[command(flatten)]
    action: ActionArgs,
    /// The task to mark succeeded (its id, from `starbridge job ID`).
    task: String,
    /// The output downstream steps will see, as JSON.
    #[arg(long, default_value = "{}")]
    output: String,
}

#[derive(clap::Subcommand)]
pub(crate) enum TaskCommand {
    /// Revoke a running task's lease and run it again: its worker is told to stop (its next
    /// heartbeat is refused with the reason), and the next attempt, not counted against
    /// `max_attempts`, may start once it was told or the old lease would have lapsed.
    Requeue {
        /// The job.
        job: String,
        /// The task (its id, from `starbridge job ID`).
        task: String,
        /// Why (recorded in the job's history and told to the worker).
        #[arg(long)]
        reason: String,
    },
    /// Fail a waiting, ready or running task for good (no retry); the job compensates.
    Fail {
        /// The job.
        job: String,
        /// The task (its id, from `starbridge job ID`).
        task: String,
        /// The task's error message.
        #[arg(long)]
        message: String,
        /// Why (recorded in the job's history).
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Args)]
pub(crate) struct RerunArgs {
    #[command(flatten)]
    action: ActionArgs,
    /// The step to run again (with everything downstream of it).
    #[arg(long)]
    step: String,
}

/// Who is acting, for the job's history: `$USER` when set.
fn actor() -> String {
    std::env::var("USER")
        .ok()
        .filter(|user| !user.is_empty())
        .unwrap_or_else(|| "cli".to_owned())
}

/// Prints the state a job is in after an operator action.
pub(crate) fn operated(context: &Context, job: &api::JobView) -> Result<ExitCode> {
    show(context, job, |job| {
        println!("job {} is {}", job.summary.id, job.summary.status);
    })
}

pub(crate) async fn pause(context: &Context, args: &ActionArgs) -> Result<ExitCode> {
    let job = context.client.pause_job(&args.id, &args.request()).await?;
    operated(context, &job)
}

pub(crate) async fn resume(context: &Context, args: &ActionArgs) -> Result<ExitCode> {
    let job = context.client.resume_job(&args.id, &args.request()).await?;
    operated(context, &job)
}

pub(crate) async fn retry(context: &Context, args: &ActionArgs) -> Result<ExitCode> {
    let job = context.client.retry_job(&args.id, &args.request()).await?;
    operated(context, &job)
}

pub(crate) async fn cancel(context: &Context, args: &CancelArgs) -> Result<ExitCode> {
    let body = api::CancelRequest {
        reason: args.action.reason.clone(),
        compensate: args.compensate,
    };
    let job = context.client.cancel_job(&args.action.id, &body).await?;
    operated(context, &job)
}

pub(crate) async fn skip(context: &Context, args: &SkipArgs) -> Result<ExitCode> {
    let output: Value = serde_json::from_str(&args.output).context("--output is not valid JSON")?;
    let body = api::SkipRequest {
        output,
        reason: args.action.reason.clone(),
    };
    let job = context
        .client
        .skip_task(&args.action.id, &args.task, &body)
        .await?;
    operated(context, &job)
}

pub(crate) async fn task(context: &Context, command: &TaskCommand) -> Result<ExitCode> {
    let job = match command {
        TaskCommand::Requeue { job, task, reason } => {
            let body = api::RequeueRequest {
                reason: reason.clone(),
            };
            context.client.requeue_task(job, task, &body).await?
        }
        TaskCommand::Fail {
            job,
            task,
            message,
            reason,
        } => {
            let body = api::FailTaskRequest {
                error: message.clone(),
                reason: reason.clone(),
            };
            context.client.fail_task(job, task, &body).await?
        }
    };
    operated(context, &job)
}

pub(crate) async fn rerun(context: &Context, args: &RerunArgs) -> Result<ExitCode> {
    let body = api::RerunRequest {
        step: args.step.clone(),
        reason: args.action.reason.clone(),
    };
    let job = context.client.rerun_job(&args.action.id, &body).await?;
    operated(context, &job)
}

#[derive(clap::Subcommand)]
pub(crate) enum QueueCommand {
    /// Change settings; those not given stay as they are. A queue's settings become its own; a
    /// pattern's (`agent-*`) apply to every queue starting with its prefix that has none.
    Set {
        /// A queue, or a pattern: a name followed by `*`.
        name: String,
        /// `parallel` or `serial` (one running task at a time).
        #[arg(long)]
        mode: Option<Open<api::QueueMode>>,
        /// Higher is served first among the queues a worker polls.
        #[arg(long, allow_negative_numbers = true)]
        priority: Option<i32>,
        /// Most running tasks at once.
        #[arg(long, conflicts_with = "unlimited")]
        concurrency: Option<u32>,
        /// Remove the concurrency limit.
        #[arg(long)]
        unlimited: bool,
        /// A ready task older than this goes ahead of priority order (e.g. `5m`).
        #[arg(long)]
        max_wait: Option<String>,
        /// At most N task starts per duration, e.g. `10/1m`; tasks over it wait ready.
        #[arg(long, value_name = "N/DURATION", conflicts_with = "no_rate")]
        rate: Option<String>,
        /// Remove the rate limit.
        #[arg(long)]
        no_rate: bool,
        /// `pause`: stop the queue when a task on it fails for good (compensations still run);
        /// `continue`: go on.
        #[arg(long, value_name = "pause|continue")]
        on_error: Option<Open<api::OnError>>,
    },
    /// Drop a pattern's settings, or a queue's own (it follows its pattern again).
    Unset {
        /// A queue, or a pattern: a name followed by `*`.
        name: String,
    },
    /// Stop handing out the queue's tasks (they stay queued).
    Pause { name: String },
    /// Hand out the queue's tasks again.
    Resume { name: String },
}

#[derive(Args)]
pub(crate) struct QueuesArgs {
    /// Only queues whose name starts with this text.
    #[arg(long)]
    prefix: Option<String>,
    /// Only queues whose name holds this text, in any case.
    #[arg(long)]
    search: Option<String>,
    /// One page of at most this many queues (default: every queue, page after page).
    #[arg(long)]
    limit: Option<u32>,
    /// The page after this one (`next_cursor` of the previous page; with `--limit`).
    #[arg(long, requires = "limit")]
    cursor: Option<String>,
}

/// A rate as `tokens/duration`, or `-`.
fn rate_text(rate: Option<&api::RateView>) -> String {
    rate.map_or("-".to_owned(), |rate| {
        format!(
            "{}/{}",
            rate.tokens,
            starbridge_core::time::Duration::from_millis(rate.per_ms)
        )
    })
}

fn print_prefixes(prefixes: &[api::QueuePrefixView]) {
    let rows: Vec<Vec<String>> = prefixes
        .iter()
        .map(|p| {
            vec![
                p.pattern.clone(),
                p.mode.to_string(),
                p.priority.to_string(),
                p.concurrency.map_or("-".to_owned(), |c| c.to_string()),
                rate_text(p.rate.as_ref()),
                p.on_error.to_string(),
            ]
        })
        .collect();
    table(
        &["PATTERN", "MODE", "PRIORITY", "LIMIT", "RATE", "ON ERROR"],
        &rows,
    );
}

fn print_queues(queues: &[api::QueueView]) {
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            vec![
                q.name.clone(),
                q.mode.to_string(),
                q.priority.to_string(),
                q.concurrency.map_or("-".to_owned(), |c| c.to_string()),
                rate_text(q.rate.as_ref()),
                match (&q.settings_from, q.own_settings) {
                    (Some(pattern), _) => pattern.clone(),
                    (None, true) => "own".to_owned(),
                    (None, false) => "defaults".to_owned(),
                },
                match (q.paused, &q.paused_reason) {
                    (true, Some(reason)) => format!("stopped on error: {reason}"),
                    (true, None) => "paused".to_owned(),
                    (false, _) => "active".to_owned(),
                },
                q.on_error.to_string(),
                q.ready.to_string(),
                q.running.to_string(),
                format!("{:.1}s", q.oldest_ready_age_ms as f64 / 1000.0),
            ]
        })
        .collect();
    table(
        &[
            "QUEUE", "MODE", "PRIORITY", "LIMIT", "RATE", "SETTINGS", "STATE", "ON ERROR", "READY",
            "RUNNING", "OLDEST",
        ],
        &rows,
    );
}

/// Lists queues: one page with `--limit`, else every page, one after the other.
pub(crate) async fn queues(context: &Context, args: &QueuesArgs) -> Result<ExitCode> {
    let mut query = api::QueueListQuery {
        prefix: args.prefix.clone(),
        q: args.search.clone(),
        limit: args.limit,
        cursor: args.cursor.clone(),
        ..api::QueueListQuery::default()
    };
    let mut list = context.client.queues(&query).await?;
    while args.limit.is_none()
        && let Some(cursor) = list.next_cursor.take()
    {
        query.cursor = Some(cursor);
        let next = context.client.queues(&query).await?;
        list.items.extend(next.items);
        list.next_cursor = next.next_cursor;
    }
    show(context, &list, |list| {
        print_queues(&list.items);
        if !list.prefixes.is_empty() {
            println!();
            print_prefixes(&list.prefixes);
        }
        if let Some(cursor) = &list.next_cursor {
            eprintln!("more: --cursor {cursor}");
        }
    })
}

pub(crate) async fn queue(context: &Context, command: &QueueCommand) -> Result<ExitCode> {
    let queue = match command {
        QueueCommand::Set {
            name,
            mode,
            priority,
            concurrency,
            unlimited,
            max_wait,
            rate,
            no_rate,
            on_error,
        } => {
            let rate = match (rate, no_rate) {
                (_, true) => Some(None),
                (Some(text), false) => {
                    let (tokens, per) = text
                        .split_once('/')
                        .context("--rate: write N/DURATION, e.g. 10/1m")?;
                    let tokens: u32 = tokens
                        .trim()
                        .parse()
                        .context("--rate: N must be a whole number")?;
                    Some(Some(api::RateSettings {
                        tokens,
                        per: Value::String(per.trim().to_owned()),
                    }))
                }
                (None, false) => None,
            };
            let settings = api::QueueSettings {
                mode: mode.clone(),
                priority: *priority,
                concurrency: if *unlimited {
                    Some(None)
                } else {
                    concurrency.map(Some)
                },
                max_wait: max_wait.clone().map(Value::String),
                rate,
                on_error: on_error.clone(),
            };
            if name.ends_with('*') {
                let prefix = context.client.set_queue_prefix(name, &settings).await?;
                return show(context, &prefix, |prefix| {
                    print_prefixes(std::slice::from_ref(prefix));
                });
            }
            context.client.set_queue(name, &settings).await?
        }
        QueueCommand::Unset { name } => {
            context.client.drop_queue_settings(name).await?;
            eprintln!("settings of {name} dropped");
            return Ok(ExitCode::SUCCESS);
        }
        QueueCommand::Pause { name } => context.client.pause_queue(name).await?,
        QueueCommand::Resume { name } => context.client.resume_queue(name).await?,
    };
    show(context, &queue, |queue| {
        print_queues(std::slice::from_ref(queue))
    })
}

#[derive(clap::Subcommand)]
pub(crate) enum ScheduleCommand {
    /// Create or replace a schedule.
    Set {
        name: String,
        /// The workflow each fire runs.
        #[arg(long)]
        workflow: String,
        /// 5 fields (`0 3 * * *`), 6 with seconds first, 7 with a year last, or a nickname such as
        /// `@hourly`.
        #[arg(long)]
        cron: String,
        /// IANA time zone of the cron expression.
        #[arg(long = "tz", default_value = "UTC")]
        timezone: String,
        /// A job parameter `key=value` (repeatable; values read as JSON when they parse).
        #[arg(long = "param", short = 'p', value_name = "KEY=VALUE")]
        params: Vec<String>,
        /// While the previous job runs: `skip`, `allow` or `queue_one`.
        #[arg(long, default_value = "skip")]
        overlap: Open<api::Overlap>,
        /// Fires missed during downtime: `skip`, `once` or `all`.
        #[arg(long, default_value = "skip")]
        catch_up: Open<api::CatchUpKind>,
        /// With `--catch-up all`: most missed fires run.
        #[arg(long)]
        catch_up_limit: Option<u32>,
        /// Create it paused.
        #[arg(long)]
        paused: bool,
        /// A label `key=value` of each fire's job (repeatable; merged over the workflow's).
        #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
        labels: Vec<String>,
    },
    /// Show a schedule and its next fire times.
    Show {
        name: String,
    },
    Pause {
        name: String,
    },
    Resume {
        name: String,
    },
    Delete {
        name: String,
    },
}

fn print_schedules(schedules: &[api::ScheduleView]) {
    let rows: Vec<Vec<String>> = schedules
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.workflow.clone(),
                s.cron.clone(),
                s.timezone.clone(),
                if s.paused { "paused" } else { "active" }.to_owned(),
                time(s.next_fires.first().copied()),
                s.last_job_id.clone().unwrap_or_else(|| "-".to_owned()),
                clip(s.last_error.as_deref().unwrap_or(""), 50),
            ]
        })
        .collect();
    table(
        &[
            "SCHEDULE",
            "WORKFLOW",
            "CRON",
            "TZ",
            "STATE",
            "NEXT FIRE",
            "LAST JOB",
            "ERROR",
        ],
        &rows,
    );
}

pub(crate) async fn schedules(context: &Context) -> Result<ExitCode> {
    let list = context.client.schedules().await?;
    show(context, &list, |list| print_schedules(&list.items))
}

pub(crate) async fn schedule(context: &Context, command: &ScheduleCommand) -> Result<ExitCode> {
    let schedule = match command {
        ScheduleCommand::Set {
            name,
            workflow,
            cron,
            timezone,
            params: pairs,
            overlap,
            catch_up,
            catch_up_limit,
            paused,
            labels: label_pairs,
        } => {
            let request = api::ScheduleRequest {
                workflow: workflow.clone(),
                params: Some(params(pairs, None)?),
                cron: cron.clone(),
                timezone: Some(timezone.clone()),
                overlap: Some(overlap.clone()),
                catch_up: Some(api::CatchUpPolicy {
                    policy: catch_up.clone(),
                    limit: *catch_up_limit,
                }),
                paused: *paused,
                labels: labels(label_pairs)?,
            };
            context.client.set_schedule(name, &request).await?
        }
        ScheduleCommand::Show { name } => context.client.schedule(name).await?,
        ScheduleCommand::Pause { name } => context.client.pause_schedule(name).await?,
        ScheduleCommand::Resume { name } => context.client.resume_schedule(name).await?,
        ScheduleCommand::Delete { name } => {
            context.client.delete_schedule(name).await?;
            eprintln!("schedule {name} deleted");
            return Ok(ExitCode::SUCCESS);
        }
    };
    show(context, &schedule, |schedule| {
        print_schedules(std::slice::from_ref(schedule));
        for fire in &schedule.next_fires {
            println!("next  {}", time(Some(*fire)));
        }
    })
}

#[derive(Args)]
pub(crate) struct BulkArgs {
    /// `pause`, `resume`, `cancel`, `retry`, `skip`, `rerun` or `delete` (finished jobs).
    action: Open<api::BulkAction>,
    #[arg(long)]
    workflow: Option<String>,
    #[arg(long)]
    status: Option<Open<JobStatus>>,
    /// Only jobs created at or after this RFC 3339 time.
    #[arg(long)]
    since: Option<String>,
    /// Only jobs created before this RFC 3339 time.
    #[arg(long)]
    until: Option<String>,
    #[arg(long)]
    reason: Option<String>,
    /// With `cancel`: undo finished steps first.
    #[arg(long)]
    compensate: bool,
    /// With `skip`: the step whose task is skipped; with `rerun`: the step run again.
    #[arg(long)]
    step: Option<String>,
    /// With `skip`: the output downstream steps see (JSON).
    #[arg(long)]
    output: Option<String>,
    /// Most jobs to act on.
    #[arg(long)]
    limit: Option<u32>,
    /// Only jobs with this label, `key=value`; repeat it for jobs with every one of several.
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// Only this job; repeat it for several.
    #[arg(long = "id", value_name = "JOB_ID")]
    ids: Vec<String>,
    /// Only count the jobs the action would apply to; change nothing.
    #[arg(long)]
    dry_run: bool,
}

pub(crate) async fn bulk(context: &Context, args: &BulkArgs) -> Result<ExitCode> {
    let request = api::BulkRequest {
        workflow: args.workflow.clone(),
        status: args.status.clone(),
        created_after: args.since.clone(),
        created_before: args.until.clone(),
        reason: args.reason.clone(),
        compensate: args.compensate,
        step: args.step.clone(),
        output: args
            .output
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .context("--output is not valid JSON")?
            .unwrap_or(Value::Null),
        dry_run: args.dry_run,
        limit: args.limit,
        labels: labels(&args.labels)?,
        ids: Some(args.ids.clone()).filter(|ids| !ids.is_empty()),
    };
    let result = context.client.bulk(&args.action, &request).await?;
    show(context, &result, |result| {
        if args.dry_run {
            println!(
                "{} matching jobs (dry run: nothing changed)",
                result.matched
            );
            return;
        }
        println!(
            "{} of {} matching jobs: {}",
            result.affected, result.matched, args.action
        );
        for refusal in &result.refused {
            println!("refused {}  {}", refusal.id, refusal.reason);
        }
    })
}

#[derive(clap::Subcommand)]
pub(crate) enum WebhookCommand {
    /// Subscribe a URL; prints the signing secret once.
    Add {
        url: String,
        /// Only jobs of this workflow.
        #[arg(long)]
        workflow: Option<String>,
        /// Only these job statuses (repeatable; all when absent; job.status_changed only).
        #[arg(long = "state")]
        states: Vec<Open<JobStatus>>,
        /// What to hear of (repeatable): job.status_changed (the default when absent),
        /// task.started, task.succeeded, task.failed, task.retrying.
        #[arg(long = "event")]
        events: Vec<Open<WebhookEvent>>,
        /// Only task events of this step (repeatable; every step when absent).
        #[arg(long = "step")]
        steps: Vec<String>,
        /// Signing secret (16 to 256 bytes; generated when absent).
        #[arg(long)]
        secret: Option<String>,
    },
    /// Unsubscribe.
    Delete { id: String },
    /// Recent deliveries of a subscription, newest first.
    Deliveries {
        id: String,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

fn print_webhooks(webhooks: &[api::WebhookView]) {
    let rows: Vec<Vec<String>> = webhooks
        .iter()
        .map(|w| {
            vec![
                w.id.clone(),
                w.url.clone(),
                w.workflow.clone().unwrap_or_else(|| "*".to_owned()),
                if w.states.is_empty() {
                    "*".to_owned()
                } else {
                    joined(&w.states)
                },
                joined(&w.events),
                if w.steps.is_empty() {
                    "*".to_owned()
                } else {
                    w.steps.join(",")
                },
                time(Some(w.created_at)),
            ]
        })
        .collect();
    table(
        &[
            "WEBHOOK", "URL", "WORKFLOW", "STATES", "EVENTS", "STEPS", "CREATED",
        ],
        &rows,
    );
}

pub(crate) async fn webhooks(context: &Context) -> Result<ExitCode> {
    let list = context.client.webhooks().await?;
    show(context, &list, |list| print_webhooks(&list.items))
}

pub(crate) async fn webhook(context: &Context, command: &WebhookCommand) -> Result<ExitCode> {
    match command {
        WebhookCommand::Add {
            url,
            workflow,
            states,
            events,
            steps,
            secret,
        } => {
            let request = api::WebhookRequest {
                url: url.clone(),
                workflow: workflow.clone(),
                states: states.clone(),
                events: (!events.is_empty()).then(|| events.clone()),
                steps: steps.clone(),
                secret: secret.clone(),
            };
            let created = context.client.add_webhook(&request).await?;
            show(context, &created, |created| {
                print_webhooks(std::slice::from_ref(created));
                if let Some(secret) = &created.secret {
                    eprintln!("signing secret (shown once): {secret}");
                }
            })
        }
        WebhookCommand::Delete { id } => {
            context.client.delete_webhook(id).await?;
            eprintln!("webhook {id} deleted");
            Ok(ExitCode::SUCCESS)
        }
        WebhookCommand::Deliveries { id, limit } => {
            let list = context.client.webhook_deliveries(id, Some(*limit)).await?;
            show(context, &list, |list| {
                let rows: Vec<Vec<String>> = list
                    .items
                    .iter()
                    .map(|d| {
                        vec![
                            d.id.to_string(),
                            d.payload["type"].as_str().unwrap_or("-").to_owned(),
                            d.job_id.clone(),
                            d.status.to_string(),
                            d.state.to_string(),
                            d.attempts.to_string(),
                            d.last_status.map_or("-".to_owned(), |s| s.to_string()),
                            clip(d.last_error.as_deref().unwrap_or(""), 50),
                        ]
                    })
                    .collect();
                table(
                    &[
                        "DELIVERY",
                        "EVENT",
                        "JOB",
                        "JOB STATUS",
                        "STATE",
                        "ATTEMPTS",
                        "HTTP",
                        "ERROR",
                    ],
                    &rows,
                );
            })
        }
    }
}

/// `a,b,c`.
fn joined<T: WireEnum>(values: &[Open<T>]) -> String {
    let texts: Vec<&str> = values.iter().map(Open::as_str).collect();
    texts.join(",")
}

/// Follows a job, printing each task's changes, until it ends. With `-o json` prints the final
/// job. Exit status: 0 if the job succeeded, 2 if it ended otherwise.
pub(crate) async fn watch(context: &Context, id: &str) -> Result<ExitCode> {
    let mut seen: HashMap<String, (Open<TaskStatus>, u32)> = HashMap::new();
    let mut job_status: Option<Open<JobStatus>> = None;
    loop {
        let job = context.client.job(id).await?;
        if !context.json() {
            if job_status.as_ref() != Some(&job.summary.status) {
                eprintln!("job {} is {}", job.summary.id, job.summary.status);
                job_status = Some(job.summary.status.clone());
            }
            for task in &job.tasks {
                let state = (task.status.clone(), task.attempt);
                if seen.get(&task.id) == Some(&state)
                    || task.kind == TaskKind::FanOut && task.status == TaskStatus::Waiting
                {
                    continue;
                }
                seen.insert(task.id.clone(), state);
                let attempt = if task.attempt > 0 {
                    format!("attempt {}/{}", task.attempt, task.max_attempts)
                } else {
                    String::new()
                };
                println!(
                    "{:<24} {:<10} {:<14} {}",
                    task_label(task),
                    task.status,
                    attempt,
                    task_note(task)
                );
            }
        }
        // A status this build does not know (from a newer server) has ended when the job has.
        let ended = job
            .summary
            .status
            .known()
            .map_or(job.summary.ended_at.is_some(), JobStatus::is_terminal);
        if ended {
            if context.json() {
                print_json(&job)?;
            } else if let Some(error) = &job.summary.error {
                eprintln!(
                    "job {} ended {}: {error}",
                    job.summary.id, job.summary.status
                );
            } else {
                eprintln!(
                    "job {} ended {} in {}",
                    job.summary.id,
                    job.summary.status,
                    elapsed(job.summary.started_at, job.summary.ended_at)
                );
            }
            return Ok(if job.summary.status == JobStatus::Succeeded {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn params_read_json_values_and_fall_back_to_strings() {
        let built = params(
            &[
                "size=20".into(),
                "name=db1".into(),
                "tags=[1,2]".into(),
                "on=true".into(),
            ],
            Some(r#"{"size": 1, "zone": "a"}"#),
        )
        .unwrap();
        assert_eq!(
            built,
            json!({"size": 20, "name": "db1", "tags": [1, 2], "on": true, "zone": "a"})
        );
    }

    #[test]
    fn params_reject_a_pair_without_equals_sign() {
        let error = params(&["size".into()], None).unwrap_err();
        assert!(error.to_string().contains("KEY=VALUE"));
    }

    #[test]
    fn definition_name_prefers_flag_then_document_then_file_stem() {
        let file = std::path::Path::new("dir/deploy.yaml");
        assert_eq!(
            definition_name(file, "name: x\nsteps: []", Some("y".into())).unwrap(),
            "y"
        );
        assert_eq!(
            definition_name(file, "name: x\nsteps: []", None).unwrap(),
            "x"
        );
        assert_eq!(definition_name(file, "steps: []", None).unwrap(), "deploy");
    }
}

#[derive(clap::Subcommand)]
pub(crate) enum TokenCommand {
    /// Make an API token (needs an admin token); its secret is printed once.
    Create {
        /// A unique name: history and the audit log show it as who acted.
        name: String,
        /// What it may do (repeatable): admin, operate, submit, work, read.
        #[arg(long = "scope", required = true)]
        scopes: Vec<Open<api::Scope>>,
        /// The only namespace it may act in (default: every namespace; admins span all).
        #[arg(long = "for-namespace")]
        for_namespace: Option<String>,
        /// For work tokens: a queue it may serve, or a pattern such as 'agent-*' (repeatable;
        /// default: every queue).
        #[arg(long = "queue")]
        queues: Vec<String>,
        /// Why, for the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
    /// List tokens with their scopes and last use.
    List,
    /// Revoke a token: it is refused from now on.
    Revoke { id: String },
    /// Make the first admin token directly in the database (run it where the server runs,
    /// before any token exists).
    Bootstrap {
        #[arg(long, default_value = "admin")]
        name: String,
        #[command(flatten)]
        database: crate::local::DatabaseArgs,
    },
}

fn print_tokens(tokens: &[api::TokenView]) {
    let rows: Vec<Vec<String>> = tokens
        .iter()
        .map(|t| {
            vec![
                t.id.clone(),
                t.name.clone(),
                t.namespace.clone().unwrap_or_else(|| "*".to_owned()),
                joined(&t.scopes),
                t.queues
                    .as_ref()
                    .map_or_else(|| "*".to_owned(), |queues| queues.join(",")),
                time(t.last_used_at),
                t.revoked_at.map_or_else(
                    || "active".to_owned(),
                    |at| format!("revoked {}", time(Some(at))),
                ),
            ]
        })
        .collect();
    table(
        &[
            "TOKEN",
            "NAME",
            "NAMESPACE",
            "SCOPES",
            "QUEUES",
            "LAST USED",
            "STATE",
        ],
        &rows,
    );
}

pub(crate) async fn token(
    context: impl Fn() -> Result<Context>,
    command: &TokenCommand,
) -> Result<ExitCode> {
    match command {
        TokenCommand::Create {
            name,
            scopes,
            for_namespace,
            queues,
            reason,
        } => {
            let context = context()?;
            let request = api::CreateTokenRequest {
                name: name.clone(),
                scopes: scopes.clone(),
                namespace: for_namespace.clone(),
                queues: (!queues.is_empty()).then(|| queues.clone()),
                reason: reason.clone(),
            };
            let created = context.client.create_token(&request).await?;
            show(&context, &created, |created| {
                print_tokens(std::slice::from_ref(&created.token));
                eprintln!("token (shown once, keep it secret): {}", created.secret);
            })
        }
        TokenCommand::List => {
            let context = context()?;
            let list = context.client.tokens().await?;
            show(&context, &list, |list| print_tokens(&list.items))
        }
        TokenCommand::Revoke { id } => {
            let context = context()?;
            context.client.revoke_token(id).await?;
            eprintln!("token {id} revoked");
            Ok(ExitCode::SUCCESS)
        }
        TokenCommand::Bootstrap { name, database } => {
            crate::local::bootstrap_token(name, database).await
        }
    }
}

#[derive(clap::Args)]
pub(crate) struct AuditArgs {
    /// Entries before this sequence number (the cursor of the previous page).
    #[arg(long)]
    before: Option<i64>,
    #[arg(long, default_value_t = 50)]
    limit: u32,
}

pub(crate) async fn audit(context: &Context, args: &AuditArgs) -> Result<ExitCode> {
    let list = context.client.audit(args.before, Some(args.limit)).await?;
    show(context, &list, |list| {
        let rows: Vec<Vec<String>> = list
            .items
            .iter()
            .map(|e| {
                vec![
                    e.seq.to_string(),
                    time(Some(e.at)),
                    e.actor.clone(),
                    e.action.clone(),
                    e.target.clone(),
                    e.reason.clone().unwrap_or_default(),
                ]
            })
            .collect();
        table(&["SEQ", "AT", "ACTOR", "ACTION", "TARGET", "REASON"], &rows);
    })
}
