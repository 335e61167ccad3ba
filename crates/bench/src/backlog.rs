//! The `backlog` workload: does a big store slow dispatch down?
//!
//! 1. On the fresh store, a sample of one-step jobs is claimed and completed one task at a time
//!    by 1, then by 8 measuring workers: each polls for one task (`max_tasks: 1`), completes it,
//!    and records the two requests' latencies.
//! 2. The store is filled: `--jobs` jobs are submitted (in batches) and drained by the
//!    benchmark's workers, so they are finished, then `--jobs` more are submitted and left
//!    ready: the backlog.
//! 3. The same sample measurement runs against the full store, the measuring workers taking
//!    tasks from the head of the backlog.
//! 4. The benchmark's workers drain the backlog, and every job is checked.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use starbridge_api as api;
use starbridge_api::client::Client;
use starbridge_worker::TaskContext;
use tokio::sync::Mutex;
use tokio::task::JoinSet;

use super::BenchArgs;
use super::harness::{Bench, QUEUE, Sending, Submission, submit_jobs};
use super::stats::{Latencies, LatencySummary, Throughput};
use super::workloads::{Checked, Figures, check};

/// Most tasks claimed and completed per measurement (each worker count, each store state); a
/// smaller `--jobs` measures that many.
pub(super) const SAMPLE: usize = 2000;
/// Jobs per submit request while filling the store.
const FILL_BATCH: usize = 1000;
/// Measuring worker counts.
pub(super) const WORKER_COUNTS: [usize; 2] = [1, 8];

/// Claim, complete and both, over one measurement.
#[derive(Default)]
pub(super) struct Sample {
    claim: Latencies,
    complete: Latencies,
    both: Latencies,
}

/// Submits `count` one-step jobs, `FILL_BATCH` per request.
async fn fill(bench: &Bench, args: &BenchArgs, count: usize, label: &str) -> Result<Submission> {
    fill_with(bench, args, "bench_single", count, label).await
}

/// Submits `count` jobs of `workflow`, `FILL_BATCH` per request.
pub(super) async fn fill_with(
    bench: &Bench,
    args: &BenchArgs,
    workflow: &str,
    count: usize,
    label: &str,
) -> Result<Submission> {
    submit_jobs(
        &bench.api,
        workflow,
        count,
        args.submitters,
        Sending::Batch(FILL_BATCH),
        label,
    )
    .await
}

/// Submits `sample_size` jobs, then claims and completes them with `workers` measuring workers.
pub(super) async fn measure(
    bench: &Bench,
    args: &BenchArgs,
    workers: usize,
    sample_size: usize,
    submissions: &mut Vec<Submission>,
) -> Result<Sample> {
    submissions.push(fill(bench, args, sample_size, "sample").await?);
    let left = Arc::new(AtomicUsize::new(sample_size));
    let sample = Arc::new(Mutex::new(Sample::default()));
    let mut set = JoinSet::new();
    for index in 0..workers {
        let client = bench.client()?;
        let (left, sample) = (left.clone(), sample.clone());
        let recorder = bench.recorder.clone();
        let poll = api::PollRequest {
            worker_id: format!("bench-measure-{index}"),
            queues: vec![QUEUE.to_owned()],
            max_tasks: Some(1),
            wait_ms: Some(1000),
            namespace: Some(bench.namespace.clone()),
            complete: Vec::new(),
        };
        set.spawn(async move { measuring_worker(client, poll, left, sample, recorder).await });
    }
    while let Some(joined) = set.join_next().await {
        joined.context("a measuring worker failed")??;
    }
    let sample = Arc::try_unwrap(sample)
        .map_err(|_| anyhow::anyhow!("a measuring worker outlived the measurement"))?;
    Ok(sample.into_inner())
}

/// Polls one task at a time and completes it until `left` tasks were taken by all workers.
async fn measuring_worker(
    client: Client,
    poll: api::PollRequest,
    left: Arc<AtomicUsize>,
    sample: Arc<Mutex<Sample>>,
    recorder: Arc<super::harness::Recorder>,
) -> Result<()> {
    let mut mine = Sample::default();
    let mut empty_polls = 0;
    // Each poll first reserves one of the tasks left to measure, and gives it back when the
    // poll came back empty, so the workers together measure exactly `sample_size` tasks.
    while left
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
    {
        let sent = Instant::now();
        let polled = client.poll(&poll).await.context("poll failed")?;
        let claimed = Instant::now();
        let Some(task) = polled.tasks.into_iter().next() else {
            left.fetch_add(1, Ordering::Relaxed);
            empty_polls += 1;
            if empty_polls > 30 {
                bail!("no task was ready for 30 polls in a row");
            }
            continue;
        };
        let context = TaskContext::new(task.clone());
        recorder.record(&context, claimed, claimed);
        let request = api::CompleteRequest {
            lease_token: task.lease_token,
            output: serde_json::json!({}),
            logs: None,
        };
        client
            .complete(&task.id, &request)
            .await
            .context("complete failed")?;
        let done = Instant::now();
        mine.claim.record(claimed - sent);
        mine.complete.record(done - claimed);
        mine.both.record(done - sent);
    }
    let mut sample = sample.lock().await;
    sample.claim.add(&mine.claim);
    sample.complete.add(&mine.complete);
    sample.both.add(&mine.both);
    Ok(())
}

pub(super) fn summaries(sample: &Sample, store: &str, workers: usize) -> Vec<LatencySummary> {
    let key = |what: &str| format!("{what}_{store}_{workers}w");
    let label = |what: &str| format!("{what}, {store} store, {workers} worker(s)");
    vec![
        sample.claim.summary(key("claim"), label("claim (poll)")),
        sample.complete.summary(key("complete"), label("complete")),
        sample
            .both
            .summary(key("claim_complete"), label("claim + complete")),
    ]
}

pub(super) async fn backlog(
    bench: &Bench,
    args: &BenchArgs,
    jobs: usize,
) -> Result<(Figures, Checked)> {
    let sample_size = jobs.min(SAMPLE);
    let mut submissions = Vec::new();
    let mut latency = Vec::new();
    for workers in WORKER_COUNTS {
        eprintln!(
            "bench: empty store: {sample_size} tasks claimed and completed by {workers} worker(s)"
        );
        let sample = measure(bench, args, workers, sample_size, &mut submissions).await?;
        latency.extend(summaries(&sample, "empty", workers));
    }

    eprintln!("bench: filling the store: {jobs} jobs to run to the end");
    let finished = fill(bench, args, jobs, "fill (finished)").await?;
    let fill_start = Instant::now();
    bench.start_workers()?;
    let expected = |submissions: &[Submission]| -> u64 {
        submissions.iter().map(|s| s.jobs.len() as u64).sum()
    };
    submissions.push(finished);
    if !bench
        .wait_until_done(expected(&submissions), "fill (finished)")
        .await?
    {
        bail!("the jobs filling the store did not finish");
    }
    let drained = fill_start.elapsed().as_secs_f64();
    bench.stop_workers().await?;
    eprintln!("bench: filling the store: {jobs} jobs left ready");
    let ready = fill(bench, args, jobs, "fill (ready)").await?;
    let throughput = vec![
        Throughput::new(
            "fill_submit",
            format!("submit, {FILL_BATCH} jobs per request, to fill the store"),
            ready.jobs.len() as u64,
            "jobs",
            ready.seconds(),
        ),
        Throughput::new(
            "fill_drain",
            format!(
                "drain with batched completions ({} workers x {})",
                args.workers, args.concurrency
            ),
            jobs as u64,
            "jobs",
            drained,
        ),
    ];
    submissions.push(ready);

    for workers in WORKER_COUNTS {
        eprintln!(
            "bench: full store ({jobs} finished, {jobs} ready): {sample_size} tasks claimed \
             and completed by {workers} worker(s)"
        );
        let sample = measure(bench, args, workers, sample_size, &mut submissions).await?;
        latency.extend(summaries(&sample, "backlog", workers));
    }

    eprintln!("bench: draining the backlog");
    bench.start_workers()?;
    bench
        .wait_until_done(expected(&submissions), "drain backlog")
        .await?;
    let submitted: Vec<&Submission> = submissions.iter().collect();
    let checked = check(bench, args, &submitted, 1).await?;
    let figures = Figures {
        jobs,
        tasks_per_job: 1,
        rate: None,
        seconds: None,
        throughput,
        latency,
        notes: vec![format!(
            "the empty-store figures are measured on a store holding only the {sample_size} \
             sample tasks; the backlog figures with {jobs} finished and about {jobs} ready tasks"
        )],
    };
    Ok((figures, checked))
}
