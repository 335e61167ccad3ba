//! The workloads, phase by phase, and the figures drawn from them.
//!
//! - `single`: one-step jobs. (1) submit rate with no worker running, (2) drain rate once the
//!   workers start, (3) end to end at full speed: as many jobs submitted with the workers
//!   running, from the first submit to the last job's end, (4) end to end at a fixed arrival
//!   rate, each submit sent at its planned time whether or not earlier ones were answered (an
//!   open loop, as independent callers arrive): latency from each submit's *planned* send time
//!   (so a slow server cannot hide behind a late send: no coordinated omission) to the handler
//!   being invoked, and to the job's `ended_at`.
//! - `chain`: 10 sequential steps per job: steps/s and per-step overhead.
//! - `fanout`: a root, 100 parallel children (`for_each: range(100)`), a join: fan-out and
//!   fan-in latency.
//!
//! Chain and fanout jobs are all submitted at once with the workers running.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use starbridge_api as api;

use super::harness::{
    Bench, COMMAND, PACED_IN_FLIGHT, Pace, QUEUE, Submission, SubmittedJob, submit_jobs,
    submit_paced,
};
use super::report::{Config, DatabaseInfo, Report, Resources};
use super::stats::{DatabaseSize, Latencies, LatencySummary, Throughput, Usage};
use super::verify::{Verified, verify};
use super::{BenchArgs, Workload};

/// Steps of a `chain` job.
const CHAIN_STEPS: usize = 10;
/// Children of a `fanout` job.
const FAN_OUT_WIDTH: usize = 100;
/// A submitter falling further behind its schedule than this is worth a note.
const LAG_NOTE: Duration = Duration::from_millis(10);

fn single_definition() -> String {
    format!(
        "name: bench_single\ndescription: one no-op step (starbridge bench)\nsteps:\n  \
         - {{ id: noop, queue: {QUEUE}, command: {COMMAND} }}\n"
    )
}

fn chain_definition() -> String {
    let mut text = format!(
        "name: bench_chain\ndescription: {CHAIN_STEPS} sequential no-op steps (starbridge \
         bench)\nsteps:\n"
    );
    for step in 1..=CHAIN_STEPS {
        text.push_str(&format!(
            "  - {{ id: s{step:02}, queue: {QUEUE}, command: {COMMAND} }}\n"
        ));
    }
    text
}

fn fanout_definition() -> String {
    let step = |id: &str, extra: &str| {
        format!("  - {{ id: {id}, queue: {QUEUE}, command: {COMMAND}{extra} }}\n")
    };
    let for_each = format!(", for_each: \"${{{{ range({FAN_OUT_WIDTH}) }}}}\"");
    format!(
        "name: bench_fanout\ndescription: a root, {FAN_OUT_WIDTH} parallel children, a join \
         (starbridge bench)\nsteps:\n{}{}{}",
        step("root", ""),
        step("children", &for_each),
        step("join", "")
    )
}

/// The figures one workload measured, before they are put in the report.
pub(super) struct Figures {
    pub(super) jobs: usize,
    pub(super) tasks_per_job: usize,
    pub(super) rate: Option<f64>,
    pub(super) seconds: Option<f64>,
    pub(super) throughput: Vec<Throughput>,
    pub(super) latency: Vec<LatencySummary>,
    pub(super) notes: Vec<String>,
}

/// The correctness check and what was measured around it.
pub(super) struct Checked {
    verified: Verified,
    after: DatabaseSize,
    peak_rss: Option<u64>,
    seconds: f64,
}

/// Runs the workload `args` names with `jobs` jobs, then checks it.
pub(crate) async fn run(bench: &Bench, args: &BenchArgs, jobs: usize) -> Result<Report> {
    let (name, definition) = match args.workload {
        Workload::Single => ("bench_single", single_definition()),
        Workload::Chain => ("bench_chain", chain_definition()),
        Workload::Fanout => ("bench_fanout", fanout_definition()),
        Workload::Backlog | Workload::Sleepers => ("bench_single", single_definition()),
    };
    bench.api.apply(name, &definition).await?;
    let before = bench.database.size();
    let (figures, checked) = match args.workload {
        Workload::Single => single(bench, args, jobs).await?,
        Workload::Chain => chain(bench, args, jobs).await?,
        Workload::Fanout => fanout(bench, args, jobs).await?,
        Workload::Backlog => super::backlog::backlog(bench, args, jobs).await?,
        Workload::Sleepers => super::sleepers::sleepers(bench, args, jobs).await?,
    };
    Ok(report(bench, args, before, figures, checked))
}

/// Reads the sizes and memory, then checks every job of the namespace.
pub(super) async fn check(
    bench: &Bench,
    args: &BenchArgs,
    submitted: &[&Submission],
    tasks_per_job: usize,
) -> Result<Checked> {
    check_workflow(bench, args, submitted, tasks_per_job, None).await
}

/// Reads the sizes and memory, then checks every job of the namespace, or with `workflow`
/// every job of that workflow.
pub(super) async fn check_workflow(
    bench: &Bench,
    args: &BenchArgs,
    submitted: &[&Submission],
    tasks_per_job: usize,
    workflow: Option<&str>,
) -> Result<Checked> {
    let after = bench.database.size();
    let peak_rss = bench.usage().await?.server_peak_rss;
    let ids: Vec<String> = submitted
        .iter()
        .flat_map(|submission| submission.jobs.iter().map(|job| job.id.clone()))
        .collect();
    let errors: Vec<String> = submitted
        .iter()
        .flat_map(|submission| submission.errors.iter().cloned())
        .collect();
    eprintln!("bench: checking {} jobs through the API", ids.len());
    let started = Instant::now();
    let verified = verify(
        &bench.api,
        &bench.recorder,
        &ids,
        &errors,
        tasks_per_job,
        args.submitters,
        workflow,
    )
    .await?;
    Ok(Checked {
        verified,
        after,
        peak_rss,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn report(
    bench: &Bench,
    args: &BenchArgs,
    before: DatabaseSize,
    figures: Figures,
    checked: Checked,
) -> Report {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let mut notes = figures.notes;
    notes.push(if bench.external() {
        format!(
            "external servers: CPU per job counts this process (the {} workers and the \
             submitters) and theirs, on the CPUs of this machine ({cpus}) if they run here",
            args.workers
        )
    } else {
        format!(
            "one process on {cpus} CPUs: the server, the {} workers and the submitters share \
             them",
            args.workers
        )
    });
    notes.push("server timestamps (created_at, started_at, ended_at) have 1 ms resolution".into());
    Report {
        workload: args.workload.name(),
        config: Config {
            jobs: figures.jobs,
            batch: args.batch,
            submitters: args.submitters,
            workers: args.workers,
            concurrency: args.concurrency,
            tasks_per_job: figures.tasks_per_job,
            rate: figures.rate.map(|rate| rate.round()),
            seconds: figures.seconds,
            cpus,
        },
        durability: bench.database.durability(),
        database: DatabaseInfo {
            url: bench.database.url.clone(),
            namespace: bench.namespace.clone(),
            kept: bench.database.kept(),
        },
        throughput: figures.throughput,
        latency_ms: figures.latency,
        resources: Resources {
            server: if bench.external() {
                "external"
            } else {
                "in this process"
            },
            peak_rss_bytes: checked.peak_rss,
            database_bytes_before: before.total(),
            database_bytes_after: checked.after.total(),
            database_growth_bytes: i64::try_from(checked.after.total()).unwrap_or(i64::MAX)
                - i64::try_from(before.total()).unwrap_or(i64::MAX),
            db_file_bytes_after: checked.after.db_bytes,
            wal_file_bytes_after: checked.after.wal_bytes,
        },
        notes,
        verification_seconds: checked.seconds,
        wall_seconds: 0.0,
        correctness: checked.verified.correctness,
    }
}

fn millis(timestamp: Option<api::Timestamp>) -> Option<i64> {
    timestamp.map(|ts| ts.as_millisecond())
}

/// The latest `ended_at` of the given jobs, in epoch milliseconds.
fn last_end<'a>(jobs: impl IntoIterator<Item = &'a api::JobSummary>) -> Option<i64> {
    jobs.into_iter()
        .filter_map(|job| millis(job.ended_at))
        .max()
}

/// Seconds from `start` to the epoch millisecond `end` (or to now, when unknown).
fn seconds_until(bench: &Bench, start: Instant, end: Option<i64>) -> f64 {
    match end {
        Some(end) => ((end as f64 - bench.clock.epoch_ms(start)) / 1000.0).max(0.0),
        None => start.elapsed().as_secs_f64(),
    }
}

async fn single(bench: &Bench, args: &BenchArgs, jobs: usize) -> Result<(Figures, Checked)> {
    eprintln!(
        "bench: phase 1/4: submitting {jobs} jobs from {} clients, no worker running",
        args.submitters
    );
    let usage = bench.usage().await?;
    let queued = submit_jobs(
        &bench.api,
        "bench_single",
        jobs,
        args.submitters,
        args.sending(),
        "submit",
    )
    .await?;
    let mut throughput = vec![
        Throughput::new(
            "submit",
            format!("submit, {} (no workers)", args.per_request()),
            queued.jobs.len() as u64,
            "jobs",
            queued.seconds(),
        )
        .with_work(&usage, &bench.usage().await?),
    ];
    let mut latency = vec![
        queued
            .request_latency
            .summary("submit_request", "submit request (no workers)"),
    ];
    let mut notes = Vec::new();

    eprintln!(
        "bench: phase 2/4: draining with {} workers x {}",
        args.workers, args.concurrency
    );
    let drain_start = Instant::now();
    let usage = bench.usage().await?;
    bench.start_workers()?;
    let drained = bench
        .wait_until_done(queued.jobs.len() as u64, "drain")
        .await?;
    let drained_usage = bench.usage().await?;
    let mut rate = None;
    let mut paced = None;
    let mut full_speed = None;
    if drained {
        let listed = bench.api.list_jobs(Some(api::JobStatus::Succeeded)).await?;
        let seconds = seconds_until(bench, drain_start, last_end(&listed));
        let drain = Throughput::new(
            "drain",
            format!("drain ({} workers x {})", args.workers, args.concurrency),
            queued.jobs.len() as u64,
            "jobs",
            seconds,
        )
        .with_work(&usage, &drained_usage);
        let target = args.rate.unwrap_or(drain.per_second / 2.0).max(1.0);
        throughput.push(drain);

        eprintln!(
            "bench: phase 3/4: submitting {jobs} jobs from {} clients, workers running",
            args.submitters
        );
        let usage = bench.usage().await?;
        let submitted = submit_jobs(
            &bench.api,
            "bench_single",
            jobs,
            args.submitters,
            args.sending(),
            "end to end",
        )
        .await?;
        bench
            .wait_until_done(
                (queued.jobs.len() + submitted.jobs.len()) as u64,
                "end to end",
            )
            .await?;
        let end_usage = bench.usage().await?;
        let listed = bench.api.list_jobs(Some(api::JobStatus::Succeeded)).await?;
        throughput.push(
            Throughput::new(
                "end_to_end_full",
                format!(
                    "end to end, {} with the workers running",
                    args.per_request()
                ),
                submitted.jobs.len() as u64,
                "jobs",
                seconds_until(bench, submitted.first_send, last_end(&listed)),
            )
            .with_work(&usage, &end_usage),
        );
        full_speed = Some(submitted);

        rate = Some(target);
        let count = ((target * args.seconds).round() as usize).max(1);
        eprintln!(
            "bench: phase 4/4: {count} jobs at {target:.0} jobs/s for {}s, workers running",
            args.seconds
        );
        let pace = Pace {
            start: Instant::now() + Duration::from_millis(20),
            rate: target,
        };
        let usage = bench.usage().await?;
        let submitted = submit_paced(&bench.api, "bench_single", count, pace, "end to end").await?;
        let earlier = queued.jobs.len() + full_speed.as_ref().map_or(0, |s| s.jobs.len());
        bench
            .wait_until_done((earlier + submitted.jobs.len()) as u64, "end to end")
            .await?;
        let end_usage = bench.usage().await?;
        let mut sent = Throughput::new(
            "end_to_end",
            format!("end to end, submitted at {target:.0}/s"),
            submitted.jobs.len() as u64,
            "jobs",
            submitted
                .last_answer
                .saturating_duration_since(pace.start)
                .as_secs_f64(),
        )
        .with_work(&usage, &end_usage);
        sent.target_per_second = Some(target.round());
        if sent.per_second < 0.95 * target {
            notes.push(format!(
                "the end-to-end phase reached {:.0} of the {target:.0} jobs/s asked for: the \
                 server could not keep up, so its latencies include a backlog that grew during \
                 the phase; try a lower --rate",
                sent.per_second
            ));
        }
        throughput.push(sent);
        if submitted.max_lag > LAG_NOTE {
            notes.push(format!(
                "submits were sent up to {:.1} ms after their planned time (the machine was \
                 busy, or {PACED_IN_FLIGHT} submits were waiting for answers); latencies count \
                 from the planned time",
                submitted.max_lag.as_secs_f64() * 1000.0
            ));
        }
        paced = Some((submitted, pace));
    } else {
        notes.push("the drain did not finish: the end-to-end phase was not run".into());
    }

    let mut submissions = vec![&queued];
    if let Some(submitted) = &full_speed {
        submissions.push(submitted);
    }
    if let Some((submitted, _)) = &paced {
        submissions.push(submitted);
    }
    let checked = check(bench, args, &submissions, 1).await?;

    if let Some((submitted, pace)) = &paced {
        latency.push(
            submitted
                .request_latency
                .summary("submit_request_loaded", "submit request (workers running)"),
        );
        let starts: HashMap<String, Instant> = bench.recorder.read(|runs| {
            let mut starts: HashMap<String, Instant> = HashMap::new();
            for run in runs.values() {
                let start = starts.entry(run.job_id.clone()).or_insert(run.first_start);
                *start = (*start).min(run.first_start);
            }
            starts
        });
        let mut to_start = Latencies::new();
        let mut to_complete = Latencies::new();
        let mut completed = Vec::new();
        for job in &submitted.jobs {
            if let Some(start) = starts.get(&job.id) {
                to_start.record(start.saturating_duration_since(job.planned));
            }
            if let Some(view) = checked.verified.jobs.get(&job.id)
                && let Some(end) = millis(view.summary.ended_at)
            {
                to_complete.record_ms(end as f64 - bench.clock.epoch_ms(job.planned));
                completed.push(&view.summary);
            }
        }
        latency.push(to_start.summary("submit_to_start", "submit -> handler start"));
        latency.push(to_complete.summary("submit_to_complete", "submit -> job ended_at"));
        throughput.push(Throughput::new(
            "end_to_end_completed",
            "end to end, completed",
            completed.len() as u64,
            "jobs",
            seconds_until(bench, pace.start, last_end(completed)),
        ));
    }
    let figures = Figures {
        jobs,
        tasks_per_job: 1,
        rate,
        seconds: Some(args.seconds),
        throughput,
        latency,
        notes,
    };
    Ok((figures, checked))
}

/// Submits every job at once with the workers running and waits for them all.
async fn submit_and_run(
    bench: &Bench,
    args: &BenchArgs,
    workflow: &str,
    jobs: usize,
    tasks_per_job: usize,
) -> Result<(Submission, Usage, Usage)> {
    eprintln!(
        "bench: submitting {jobs} {workflow} jobs from {} clients to {} workers x {}",
        args.submitters, args.workers, args.concurrency
    );
    let usage = bench.usage().await?;
    bench.start_workers()?;
    let submission = submit_jobs(
        &bench.api,
        workflow,
        jobs,
        args.submitters,
        args.sending(),
        "submit",
    )
    .await?;
    bench
        .wait_until_done((submission.jobs.len() * tasks_per_job) as u64, "run")
        .await?;
    Ok((submission, usage, bench.usage().await?))
}

/// Submits `count` jobs of `workflow` one after the other, each once the previous one ended,
/// with the workers running: the engine's own latency, with no other job's tasks to wait
/// behind. `tasks_before` is how many tasks the handler ran before.
async fn one_at_a_time(
    bench: &Bench,
    workflow: &str,
    count: usize,
    tasks_per_job: usize,
    tasks_before: u64,
) -> Result<Submission> {
    eprintln!("bench: running {count} {workflow} jobs one at a time");
    let mut submission = Submission::starting(count);
    for index in 0..count {
        let sent = Instant::now();
        match bench.api.submit(workflow).await {
            Ok(id) => submission.jobs.push(SubmittedJob { id, planned: sent }),
            Err(error) => submission
                .errors
                .push(format!("submit {index} (one at a time) failed: {error}")),
        }
        submission.last_answer = Instant::now();
        submission
            .request_latency
            .record(submission.last_answer - sent);
        let expected = tasks_before + (submission.jobs.len() * tasks_per_job) as u64;
        if !bench.wait_until_done(expected, "one at a time").await? {
            break;
        }
    }
    Ok(submission)
}

/// Jobs run one at a time after the loaded phase of `chain` (enough handoffs between steps for
/// a p99) and of `fanout`.
const CHAIN_ALONE_JOBS: usize = 100;
const FANOUT_ALONE_JOBS: usize = 20;

/// When each task's handler first started and last returned, by task id.
fn handler_spans(bench: &Bench) -> HashMap<String, (Instant, Instant)> {
    bench.recorder.read(|runs| {
        runs.iter()
            .map(|(task, run)| (task.clone(), (run.first_start, run.last_end)))
            .collect()
    })
}

/// The handler time of each job, all its tasks together.
fn handler_time_per_job(bench: &Bench) -> HashMap<String, Duration> {
    bench.recorder.read(|runs| {
        let mut per_job: HashMap<String, Duration> = HashMap::new();
        for run in runs.values() {
            *per_job.entry(run.job_id.clone()).or_default() += run.handler_time;
        }
        per_job
    })
}

/// A job's run time (created → ended), in milliseconds.
fn job_millis(job: &api::JobView) -> Option<i64> {
    Some(millis(job.summary.ended_at)? - job.summary.created_at.as_millisecond())
}

/// The checked views of the jobs of one submission.
fn views_of<'a>(
    checked: &'a Checked,
    submission: &'a Submission,
) -> impl Iterator<Item = &'a api::JobView> {
    submission
        .jobs
        .iter()
        .filter_map(|job| checked.verified.jobs.get(&job.id))
}

const QUEUEING_NOTE: &str = "the \"all at once\" lines submit every job at once with the workers \
                             running: their latencies include waiting behind other jobs' tasks; \
                             the \"one at a time\" lines run jobs one after the other";

/// Per-step overhead, step handoff and job time of chain jobs. The gap between one step's
/// handler returning and the next one's starting is read on the workers' clock, to the
/// microsecond: the success's way to the server, its group commit, and the next task's way back.
fn chain_latencies<'a>(
    views: impl Iterator<Item = &'a api::JobView>,
    handler_time: &HashMap<String, Duration>,
    handler_spans: &HashMap<String, (Instant, Instant)>,
    how: &str,
) -> Vec<LatencySummary> {
    let mut overhead = Latencies::new();
    let mut handoff = Latencies::new();
    let mut gap = Latencies::new();
    let mut whole = Latencies::new();
    for job in views {
        if let Some(total) = job_millis(job) {
            let handlers = handler_time
                .get(&job.summary.id)
                .map_or(0.0, |time| time.as_secs_f64() * 1000.0);
            overhead.record_ms((total as f64 - handlers) / CHAIN_STEPS as f64);
            whole.record_ms(total as f64);
        }
        let mut steps: Vec<&api::TaskView> = job
            .tasks
            .iter()
            .filter(|task| task.kind == api::TaskKind::Step)
            .collect();
        steps.sort_by(|a, b| a.step.cmp(&b.step));
        for pair in steps.windows(2) {
            if let (Some(ended), Some(started)) =
                (millis(pair[0].ended_at), millis(pair[1].started_at))
            {
                handoff.record_ms((started - ended) as f64);
            }
            if let (Some((_, returned)), Some((next_started, _))) = (
                handler_spans.get(&pair[0].id),
                handler_spans.get(&pair[1].id),
            ) {
                gap.record(next_started.saturating_duration_since(*returned));
            }
        }
    }
    let key = |name: &str| format!("{name}_{}", how.replace(' ', "_"));
    vec![
        overhead.summary(
            key("step_overhead"),
            format!("per-step overhead ((job time - handler time) / 10), {how}"),
        ),
        handoff.summary(
            key("step_handoff"),
            format!("step ended -> next step claimed, {how}"),
        ),
        gap.summary(
            key("step_gap"),
            format!("handler returned -> next step's handler started (workers' clock), {how}"),
        ),
        whole.summary(key("job"), format!("job created -> ended, {how}")),
    ]
}

async fn chain(bench: &Bench, args: &BenchArgs, jobs: usize) -> Result<(Figures, Checked)> {
    let shape = Shape {
        workflow: "bench_chain",
        tasks_per_job: CHAIN_STEPS,
        key: "steps",
        alone_key: "steps_one_at_a_time",
        each: format!("steps ({CHAIN_STEPS} per job)"),
        unit: "steps",
        alone: CHAIN_ALONE_JOBS,
    };
    all_at_once_then_alone(bench, args, jobs, shape, |views| {
        let handler_time = handler_time_per_job(bench);
        let spans = handler_spans(bench);
        let mut latency = chain_latencies(views.all_at_once, &handler_time, &spans, "all at once");
        latency.extend(chain_latencies(
            views.alone,
            &handler_time,
            &spans,
            "one at a time",
        ));
        latency
    })
    .await
}

/// What `chain` and `fanout` differ in, besides their latencies.
struct Shape {
    workflow: &'static str,
    tasks_per_job: usize,
    /// Keys of the throughput lines of the jobs run all at once and one at a time, what their
    /// labels count (the tasks of a job), and the unit.
    key: &'static str,
    alone_key: &'static str,
    each: String,
    unit: &'static str,
    /// Jobs run one at a time after them.
    alone: usize,
}

/// The checked jobs of each phase of `all_at_once_then_alone`.
struct PhaseViews<'a> {
    all_at_once: Box<dyn Iterator<Item = &'a api::JobView> + 'a>,
    alone: Box<dyn Iterator<Item = &'a api::JobView> + 'a>,
}

/// `chain` and `fanout`: every job submitted at once with the workers running, then a few run
/// one at a time, then the check; `latencies` makes the latency lines of both phases.
async fn all_at_once_then_alone(
    bench: &Bench,
    args: &BenchArgs,
    jobs: usize,
    shape: Shape,
    latencies: impl FnOnce(PhaseViews<'_>) -> Vec<LatencySummary>,
) -> Result<(Figures, Checked)> {
    let Shape {
        workflow,
        tasks_per_job,
        key,
        alone_key,
        each,
        unit,
        alone,
    } = shape;
    let (submission, start, end) =
        submit_and_run(bench, args, workflow, jobs, tasks_per_job).await?;
    let count = submission.jobs.len() as u64;
    let seconds = seconds_until(
        bench,
        submission.first_send,
        bench
            .api
            .list_jobs(Some(api::JobStatus::Succeeded))
            .await?
            .iter()
            .filter_map(|job| millis(job.ended_at))
            .max(),
    );
    let before_alone = bench.usage().await?;
    let alone_started = Instant::now();
    let alone = one_at_a_time(
        bench,
        workflow,
        alone.min(jobs),
        tasks_per_job,
        count * tasks_per_job as u64,
    )
    .await?;
    let alone_seconds = alone_started.elapsed().as_secs_f64();
    let after_alone = bench.usage().await?;
    let checked = check(bench, args, &[&submission, &alone], tasks_per_job).await?;
    let mut latency = vec![
        submission
            .request_latency
            .summary("submit_request", "submit request"),
    ];
    latency.extend(latencies(PhaseViews {
        all_at_once: Box::new(views_of(&checked, &submission)),
        alone: Box::new(views_of(&checked, &alone)),
    }));
    let figures = Figures {
        jobs,
        tasks_per_job,
        rate: None,
        seconds: None,
        throughput: vec![
            Throughput::new(
                "submit",
                format!("submit, {} (workers running)", args.per_request()),
                count,
                "jobs",
                submission.seconds(),
            ),
            Throughput::new(
                key,
                format!("{each}, all at once"),
                count * tasks_per_job as u64,
                unit,
                seconds,
            )
            .with_work(&start, &end),
            // Its rate includes the waits for each job's end: its work row is what counts, the
            // commits and writer requests a step costs when nothing else runs.
            Throughput::new(
                alone_key,
                format!("{each}, one at a time"),
                (alone.jobs.len() * tasks_per_job) as u64,
                unit,
                alone_seconds,
            )
            .with_work(&before_alone, &after_alone),
            Throughput::new(
                "jobs",
                "jobs, first submit to last end",
                count,
                "jobs",
                seconds,
            ),
        ],
        latency,
        notes: vec![QUEUEING_NOTE.to_owned()],
    };
    Ok((figures, checked))
}

/// Fan-out and fan-in latencies of fanout jobs: to the last child (the join) being ready, that
/// is claimable, and to it being claimed by a worker.
fn fanout_latencies<'a>(
    views: impl Iterator<Item = &'a api::JobView>,
    how: &str,
) -> Vec<LatencySummary> {
    let mut to_ready = Latencies::new();
    let mut to_claimed = Latencies::new();
    let mut join_ready = Latencies::new();
    let mut join_claimed = Latencies::new();
    let mut whole = Latencies::new();
    for job in views {
        let step = |id: &str| {
            job.tasks
                .iter()
                .find(|task| task.kind == api::TaskKind::Step && task.step == id)
        };
        let children: Vec<&api::TaskView> = job
            .tasks
            .iter()
            .filter(|task| task.kind == api::TaskKind::Item)
            .collect();
        let last = |at: fn(&api::TaskView) -> Option<api::Timestamp>| {
            children.iter().filter_map(|task| millis(at(task))).max()
        };
        if let Some(root_end) = step("root").and_then(|root| millis(root.ended_at)) {
            if let Some(ready) = last(|task| task.ready_at) {
                to_ready.record_ms((ready - root_end) as f64);
            }
            if let Some(claimed) = last(|task| task.started_at) {
                to_claimed.record_ms((claimed - root_end) as f64);
            }
        }
        if let (Some(last_ended), Some(join)) = (last(|task| task.ended_at), step("join")) {
            if let Some(ready) = millis(join.ready_at) {
                join_ready.record_ms((ready - last_ended) as f64);
            }
            if let Some(claimed) = millis(join.started_at) {
                join_claimed.record_ms((claimed - last_ended) as f64);
            }
        }
        if let Some(total) = job_millis(job) {
            whole.record_ms(total as f64);
        }
    }
    let key = |name: &str| format!("{name}_{}", how.replace(' ', "_"));
    vec![
        to_ready.summary(
            key("fan_out_ready"),
            format!("root ended -> last child claimable, {how}"),
        ),
        to_claimed.summary(
            key("fan_out"),
            format!("root ended -> last child claimed, {how}"),
        ),
        join_ready.summary(
            key("fan_in_ready"),
            format!("last child ended -> join claimable, {how}"),
        ),
        join_claimed.summary(
            key("fan_in"),
            format!("last child ended -> join claimed, {how}"),
        ),
        whole.summary(key("job"), format!("job created -> ended, {how}")),
    ]
}

async fn fanout(bench: &Bench, args: &BenchArgs, jobs: usize) -> Result<(Figures, Checked)> {
    let shape = Shape {
        workflow: "bench_fanout",
        tasks_per_job: FAN_OUT_WIDTH + 2,
        key: "tasks",
        alone_key: "tasks_one_at_a_time",
        each: format!("tasks (root, {FAN_OUT_WIDTH} children, join per job)"),
        unit: "tasks",
        alone: FANOUT_ALONE_JOBS,
    };
    all_at_once_then_alone(bench, args, jobs, shape, |views| {
        let mut latency = fanout_latencies(views.all_at_once, "all at once");
        latency.extend(fanout_latencies(views.alone, "one at a time"));
        latency
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_are_valid_workflows_of_the_expected_shape() {
        for (name, text, steps) in [
            ("bench_single", single_definition(), 1),
            ("bench_chain", chain_definition(), CHAIN_STEPS),
            ("bench_fanout", fanout_definition(), 3),
        ] {
            let document = starbridge_core::definition::parse_document(&text).unwrap();
            let workflow = starbridge_core::Workflow::from_value(name, document)
                .unwrap_or_else(|error| panic!("{name}: {error}\n{text}"));
            assert_eq!(workflow.steps.len(), steps, "{name}");
            assert!(workflow.steps.iter().all(|step| {
                step.handler()
                    .is_some_and(|handler| handler.queue.name() == Some(QUEUE))
            }));
        }
    }
}
