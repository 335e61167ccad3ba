//! The `starbridge` command: runs the server, the built-in worker, dev mode and the demo, and
//! talks to a server as a client. `anyhow` lives here, at the edge; the crates below use typed
//! errors.

mod client;
mod local;
mod output;

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
    /// Namespace of the workflows and jobs.
    #[arg(
        long,
        global = true,
        env = "STARBRIDGE_NAMESPACE",
        default_value = "default"
    )]
    namespace: String,
    /// Output format of read commands.
    #[arg(
        short = 'o',
        long = "output",
        global = true,
        value_enum,
        default_value = "table"
    )]
    output: Format,
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
    /// Submit a job.
    Submit(client::SubmitArgs),
    /// List jobs.
    Jobs(client::JobsArgs),
    /// Show a job and its tasks.
    Job { id: String },
    /// Show a job's history.
    Events { id: String },
    /// Follow a job's tasks live until it ends (exit status 0 only if it succeeded).
    Watch { id: String },
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
    let context = || client::Context::new(&cli.server, &cli.namespace, cli.output);
    match cli.command {
        Command::Server(args) => local::server(args).await,
        Command::Worker(args) => local::worker(&context()?, args).await,
        Command::Dev(args) => local::dev(args).await,
        Command::Demo(args) => local::demo(args).await,
        Command::Apply(args) => client::apply(&context()?, args).await,
        Command::Workflows => client::workflows(&context()?).await,
        Command::Submit(args) => client::submit(&context()?, args).await,
        Command::Jobs(args) => client::jobs(&context()?, args).await,
        Command::Job { ref id } => client::job(&context()?, id).await,
        Command::Events { ref id } => client::events(&context()?, id).await,
        Command::Watch { ref id } => client::watch(&context()?, id).await,
        Command::Pause(ref args) => client::act(&context()?, "pause", args).await,
        Command::Resume(ref args) => client::act(&context()?, "resume", args).await,
        Command::Retry(ref args) => client::act(&context()?, "retry", args).await,
        Command::Cancel(ref args) => client::cancel(&context()?, args).await,
        Command::Skip(ref args) => client::skip(&context()?, args).await,
        Command::Rerun(ref args) => client::rerun(&context()?, args).await,
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
