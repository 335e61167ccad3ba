//! The `starbridge` command: runs the server, the built-in worker, dev mode and the demo, and
//! talks to a server as a client; `bench` runs the benchmark crate (`starbridge-bench`).
//! `anyhow` lives here and in the benchmark, at the edge; the crates below use typed errors.

mod client;
mod local;
mod output;
mod top;
mod waits;

/// The process's allocator (see the workspace's `Cargo.toml` for why).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand, ValueEnum};

/// Durable DAG workflows: retries, timeouts, rollback, and a CLI to drive them.
#[derive(Parser)]
#[command(name = "starbridge", version, about)]
struct Cli {
    /// Server to talk to (client commands and `worker`).
    #[arg(
        long,
        global = true,
        env = "STARBRIDGE_SERVER",
        default_value = "http://127.0.0.1:7433"
    )]
    server: String,
    /// API token (`sbt_...`), when the server requires one.
    #[arg(long, global = true, env = "STARBRIDGE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Namespace of the workflows and jobs.
    #[arg(
        long,
        global = true,
        env = "STARBRIDGE_NAMESPACE",
        default_value = "default"
    )]
    namespace: String,
    /// Also trust this PEM CA certificate for an https --server (a private CA or a self-signed
    /// certificate), and, in `worker` and `dev`, for http steps' requests.
    #[arg(long, global = true, env = "STARBRIDGE_CA_CERT")]
    ca_cert: Option<std::path::PathBuf>,
    /// Output format of read commands (`-o json`). The long form is `--format`: `--output` is
    /// `skip`'s, the task output it records.
    #[arg(
        short = 'o',
        long = "format",
        global = true,
        value_enum,
        default_value = "table"
    )]
    format: Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server: HTTP API, dispatch and timers.
    Server(local::ServerArgs),
    /// Create, list or revoke API tokens.
    #[command(subcommand)]
    Token(client::TokenCommand),
    /// Show the audit log: who changed what, and why.
    Audit(client::AuditArgs),
    /// Database maintenance (migrations).
    #[command(subcommand)]
    Db(local::DbCommand),
    /// Run the built-in shell executor for the given queues.
    Worker(local::WorkerArgs),
    /// Server and built-in worker in one process, SQLite in the current folder.
    Dev(local::DevArgs),
    /// Run the example workflow end to end on a fresh local database and show what happened.
    Demo(local::DemoArgs),
    /// Apply a workflow definition (YAML or JSON file).
    Apply(client::ApplyArgs),
    /// List workflows.
    Workflows,
    /// Delete a workflow.
    #[command(subcommand)]
    Workflow(client::WorkflowCommand),
    /// Submit a job.
    Submit(client::SubmitArgs),
    /// List jobs.
    Jobs(client::JobsArgs),
    /// Show a job and its tasks (`job ID`), or delete a finished job (`job delete ID`).
    Job(client::JobArgs),
    /// Show a job's history.
    Events { id: String },
    /// Follow a job's tasks live until it ends (exit status 0 only if it succeeded).
    Watch { id: String },
    /// Benchmark: an embedded server on a fresh database with in-process workers over loopback
    /// HTTP; measures a workload and checks every job ran exactly once.
    Bench(starbridge_bench::BenchArgs),
    /// Pause a running job: nothing new is dispatched, running tasks finish.
    Pause(client::ActionArgs),
    /// Resume a paused job.
    Resume(client::ActionArgs),
    /// Cancel a job (optionally undoing its finished steps first).
    Cancel(client::CancelArgs),
    /// Continue a failed job from its failed tasks with fresh attempts.
    Retry(client::ActionArgs),
    /// Mark a failed or waiting task succeeded with a given output.
    Skip(client::SkipArgs),
    /// Run a step of a finished job again, with everything downstream of it.
    Rerun(client::RerunArgs),
    /// Act on one running or waiting task of a job: requeue it, or fail it for good.
    #[command(subcommand)]
    Task(client::TaskCommand),
    /// List the steps waiting for approval.
    Approvals,
    /// Approve a step waiting for approval: it succeeds.
    Approve(waits::DecisionArgs),
    /// Reject a step waiting for approval: it fails, and the job winds down.
    Reject(waits::DecisionArgs),
    /// Send a signal to a job: a step waiting for it takes it, or the job keeps it.
    Signal(waits::SignalArgs),
    /// List queues with their settings, depth and oldest wait, and the prefix settings.
    Queues(client::QueuesArgs),
    /// Change the settings of a queue or a pattern (`agent-*`), drop them, or pause or resume
    /// a queue.
    #[command(subcommand)]
    Queue(client::QueueCommand),
    /// List schedules with their next fire times.
    Schedules,
    /// Create, replace, show, pause, resume or delete a cron schedule.
    #[command(subcommand)]
    Schedule(client::ScheduleCommand),
    /// Pause, resume, cancel, retry, skip a step of, rerun or delete every job a filter selects.
    Bulk(client::BulkArgs),
    /// List webhook subscriptions.
    Webhooks,
    /// Subscribe a URL to job status changes, unsubscribe, or show deliveries.
    #[command(subcommand)]
    Webhook(client::WebhookCommand),
    /// Jobs and tasks started, succeeded and failed per workflow and queue, durations, queue
    /// depth and oldest wait, redrawn live (the UI's dashboard in the terminal).
    Top(top::TopArgs),
}

/// `starbridge bench` shows its report as JSON or in this command's tables.
fn bench_output(format: Format) -> starbridge_bench::Output {
    match format {
        Format::Json => starbridge_bench::Output::Json,
        Format::Table => starbridge_bench::Output::Table(output::table),
    }
}

/// Logs go to stderr; `STARBRIDGE_LOG` (e.g. `debug`, `starbridge_store=trace`) overrides the level.
fn init_tracing(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("STARBRIDGE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn run(cli: Cli) -> anyhow::Result<std::process::ExitCode> {
    let ca_cert = cli.ca_cert.as_deref();
    let context = || {
        client::Context::new(
            &cli.server,
            ca_cert,
            &cli.namespace,
            cli.token.clone(),
            cli.format,
        )
    };
    match cli.command {
        Command::Server(args) => local::server(args).await,
        Command::Db(ref command) => local::db(command),
        Command::Token(ref command) => client::token(context, command).await,
        Command::Audit(ref args) => client::audit(&context()?, args).await,
        Command::Worker(args) => local::worker(&context()?, args, ca_cert).await,
        Command::Dev(args) => local::dev(args, &cli.namespace, ca_cert).await,
        Command::Demo(args) => local::demo(args).await,
        Command::Apply(args) => client::apply(&context()?, args).await,
        Command::Workflows => client::workflows(&context()?).await,
        Command::Workflow(ref command) => client::workflow(&context()?, command).await,
        Command::Submit(args) => client::submit(&context()?, args).await,
        Command::Jobs(args) => client::jobs(&context()?, args).await,
        Command::Job(ref args) => client::job_command(&context()?, args).await,
        Command::Events { ref id } => client::events(&context()?, id).await,
        Command::Watch { ref id } => client::watch(&context()?, id).await,
        Command::Bench(args) => starbridge_bench::run(args, bench_output(cli.format)).await,
        Command::Pause(ref args) => client::pause(&context()?, args).await,
        Command::Resume(ref args) => client::resume(&context()?, args).await,
        Command::Retry(ref args) => client::retry(&context()?, args).await,
        Command::Cancel(ref args) => client::cancel(&context()?, args).await,
        Command::Skip(ref args) => client::skip(&context()?, args).await,
        Command::Rerun(ref args) => client::rerun(&context()?, args).await,
        Command::Task(ref command) => client::task(&context()?, command).await,
        Command::Approvals => waits::approvals(&context()?).await,
        Command::Approve(ref args) => waits::decide(&context()?, args, true).await,
        Command::Reject(ref args) => waits::decide(&context()?, args, false).await,
        Command::Signal(ref args) => waits::signal(&context()?, args).await,
        Command::Queues(ref args) => client::queues(&context()?, args).await,
        Command::Queue(ref command) => client::queue(&context()?, command).await,
        Command::Schedules => client::schedules(&context()?).await,
        Command::Schedule(ref command) => client::schedule(&context()?, command).await,
        Command::Bulk(ref args) => client::bulk(&context()?, args).await,
        Command::Webhooks => client::webhooks(&context()?).await,
        Command::Webhook(ref command) => client::webhook(&context()?, command).await,
        Command::Top(ref args) => top::top(&context()?, args).await,
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The demo and client commands show their own output; services log their progress.
    let quiet = !matches!(
        cli.command,
        Command::Server(_) | Command::Worker(_) | Command::Dev(_)
    );
    init_tracing(if quiet { "warn" } else { "info" });
    match run(cli).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};
    use starbridge_server::Limit;

    use super::Cli;

    #[test]
    fn every_limit_is_a_server_flag_with_its_environment_variable() {
        let command = Cli::command();
        let server = command.find_subcommand("server").expect("server command");
        for limit in Limit::ALL {
            let flag = limit.flag();
            let argument = server
                .get_arguments()
                .find(|argument| argument.get_long() == flag.strip_prefix("--"))
                .unwrap_or_else(|| panic!("no {flag} flag"));
            assert_eq!(
                argument.get_env().and_then(|env| env.to_str()),
                Some(limit.env().as_str()),
                "{flag}"
            );
        }
    }

    #[test]
    fn every_command_parses_without_clashing_arguments() {
        // clap checks the whole command tree: two arguments of one id (as `skip --output` and
        // the global output format once were) make every parse of that command panic.
        Cli::command().debug_assert();
        let parsed = Cli::try_parse_from(["starbridge", "skip", "JOB", "TASK", "--output", "{}"]);
        assert!(parsed.is_ok());
        let parsed = Cli::try_parse_from(["starbridge", "jobs", "-o", "json"]);
        assert!(parsed.is_ok());
        for args in [
            &["starbridge", "job", "job_1"][..],
            &["starbridge", "job", "delete", "job_1"],
        ] {
            assert!(Cli::try_parse_from(args).is_ok(), "{args:?}");
        }
        assert!(Cli::try_parse_from(["starbridge", "job"]).is_err());
    }
}
