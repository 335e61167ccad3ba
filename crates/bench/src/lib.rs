//! The benchmark behind `starbridge bench` (the CLI parses `BenchArgs` and calls `run`).
//!
//! It starts an embedded server in this process on a fresh SQLite database (durable as in
//! production: WAL, every change synced before it is answered) or a fresh schema of a
//! PostgreSQL database, bound to `127.0.0.1:0`, and runs worker-SDK workers with no-op handlers in the same process, talking real HTTP over loopback. Then it runs one workload,
//! measures it, and checks through the HTTP API that every job submitted ended `succeeded` with
//! every task run exactly once; anomalies are printed and make the command exit non-zero.
//!
//! - `harness`: the embedded server, the workers, the in-process handler record, submissions.
//! - `workloads`: `single`, `chain` and `fanout`, phase by phase.
//! - `backlog`: the `backlog` workload (claim and complete latency on an empty, then a full store).
//! - `verify`: the correctness check.
//! - `stats`: HDR latency histograms and the figures of the report.
//! - `report`: the human table and the JSON document.

mod backlog;
mod harness;
mod report;
mod sleepers;
mod stats;
mod verify;
mod workloads;

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, ValueEnum};
use starbridge_server::Durability;

/// Most tasks one poll may claim on the server; a worker polls for up to its concurrency.
const MAX_CONCURRENCY: usize = 256;

/// The options of `starbridge bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// What to run: `single` (one-step jobs: submit rate, drain rate, end to end at a fixed
    /// rate), `chain` (10 sequential steps per job) or `fanout` (a root, 100 parallel children,
    /// a join) or `backlog` (claim and complete latency with 1 and 8 workers on an empty store,
    /// then on one holding --jobs finished and --jobs ready tasks) or `sleepers` (the same
    /// claim and complete latency on an empty store and on one holding --jobs sleeping jobs,
    /// then the wake lag of 10000 sleeps ending at one instant).
    #[arg(long, value_enum, default_value = "single")]
    workload: Workload,
    /// Jobs to run (default: 100000 single, 500 chain, 50 fanout; backlog: 1000000 finished
    /// and as many ready; sleepers: 1000000 sleeping).
    #[arg(long)]
    jobs: Option<usize>,
    /// Concurrent HTTP clients submitting jobs, each sending its next request once the last was
    /// answered. The paced end-to-end phase of `single` is an open loop instead: each submit
    /// goes at its planned time whether or not earlier ones were answered.
    #[arg(long, default_value_t = 32)]
    submitters: usize,
    /// Worker instances (each with its own HTTP client) in this process.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Tasks each worker runs at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// `single`: arrival rate of the end-to-end phase in jobs/s (default: half the measured
    /// drain rate).
    #[arg(long)]
    rate: Option<f64>,
    /// `single`: length of the end-to-end phase in seconds.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Use the batch API: submit this many jobs per request (`POST /jobs/batch`, 1 to 1000) and
    /// let the workers report successes in batches (`POST /tasks/complete`). The paced
    /// end-to-end phase of `single` still submits one job per request, at its planned time.
    #[arg(long)]
    batch: Option<usize>,
    /// Database: sqlite://FILE (default: a new file in a temporary folder, removed afterwards;
    /// an existing file is refused unless --reuse), or postgres://… (the run makes a schema of
    /// its own there, dropped afterwards unless --keep).
    #[arg(long)]
    database: Option<String>,
    /// Allow --database to name an existing file (the run uses a namespace of its own).
    #[arg(long)]
    reuse: bool,
    /// Run against servers already running (`starbridge server` without `--auth`; several
    /// nodes of one PostgreSQL database, comma-separated) instead of one in this process:
    /// submitters and workers take them in turn, and their CPU, memory and store writers are
    /// read from their `/metrics`. `--database` may then name their SQLite file, for its size.
    #[arg(long = "servers", value_name = "URL", value_delimiter = ',')]
    servers: Vec<String>,
    /// When the embedded store answers a change: `full` (on disk, the default and what the
    /// targets are about) or `relaxed` (see `starbridge server --help`), reported as such.
    #[arg(long, default_value = "full", value_parser = durability_values())]
    durability: Durability,
    /// Keep the temporary database folder (or PostgreSQL schema) instead of removing it.
    #[arg(long)]
    keep: bool,
}

/// The values of `--durability`, as `starbridge server --durability` names them.
fn durability_values() -> impl TypedValueParser<Value = Durability> {
    PossibleValuesParser::new(["full", "relaxed"]).map(|name| match name.as_str() {
        "relaxed" => Durability::Relaxed,
        _ => Durability::Full,
    })
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Workload {
    Single,
    Chain,
    Fanout,
    Backlog,
    Sleepers,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Single => "single",
            Workload::Chain => "chain",
            Workload::Fanout => "fanout",
            Workload::Backlog => "backlog",
            Workload::Sleepers => "sleepers",
        }
    }

    fn default_jobs(self) -> usize {
        match self {
            Workload::Single => 100_000,
            Workload::Chain => 500,
            Workload::Fanout => 50,
            Workload::Backlog => 1_000_000,
            Workload::Sleepers => 1_000_000,
        }
    }
}

impl BenchArgs {
    /// How the submit phases send jobs.
    fn sending(&self) -> harness::Sending {
        match self.batch {
            Some(size) => harness::Sending::Batch(size),
            None => harness::Sending::Single,
        }
    }

    /// How many jobs a submit request carries, in words.
    fn per_request(&self) -> String {
        match self.batch {
            Some(size) => format!("{size} jobs per request"),
            None => "one job per request".to_owned(),
        }
    }

    fn check(&self) -> Result<()> {
        if self.jobs == Some(0) {
            bail!("--jobs must be at least 1");
        }
        if self.submitters == 0 || self.workers == 0 {
            bail!("--submitters and --workers must be at least 1");
        }
        if self.concurrency == 0 || self.concurrency > MAX_CONCURRENCY {
            bail!(
                "--concurrency must be between 1 and {MAX_CONCURRENCY} (a worker polls for as many \
                 tasks as it has free slots, and the server hands out at most {MAX_CONCURRENCY} \
                 per poll)"
            );
        }
        if let Some(batch) = self.batch
            && !(1..=starbridge_api::MAX_BATCH_ITEMS).contains(&batch)
        {
            bail!(
                "--batch must be between 1 and {} jobs per request",
                starbridge_api::MAX_BATCH_ITEMS
            );
        }
        if let Some(rate) = self.rate
            && !(rate.is_finite() && rate > 0.0)
        {
            bail!("--rate must be a positive number of jobs per second");
        }
        if !(self.seconds.is_finite() && self.seconds > 0.0) {
            bail!("--seconds must be positive");
        }
        Ok(())
    }
}

/// Draws a table: a header and rows of cells, each column as wide as its widest cell.
pub type Table = fn(&[&str], &[Vec<String>]);

/// How the report is shown.
pub enum Output {
    /// One JSON document with every figure (`-o json`).
    Json,
    /// Tables for people, drawn as the caller draws its own (the CLI's `table`).
    Table(Table),
}

/// Runs the benchmark `args` describe and prints its report to stdout (progress goes to
/// stderr). Fails when the run could not be made; exits with failure when the correctness
/// check found anomalies.
pub async fn run(args: BenchArgs, output: Output) -> Result<ExitCode> {
    args.check()?;
    let started = Instant::now();
    let jobs = args.jobs.unwrap_or_else(|| args.workload.default_jobs());
    let bench = harness::Bench::start(&args).await?;
    let outcome = workloads::run(&bench, &args, jobs).await;
    let stopped = bench.stop().await;
    let mut report = outcome?;
    stopped?;
    report.wall_seconds = started.elapsed().as_secs_f64();
    match output {
        Output::Json => report::print_json(&report)?,
        Output::Table(table) => report::print_table(&report, table),
    }
    Ok(if report.correctness.anomaly_count == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
