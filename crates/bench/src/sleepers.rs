//! The `sleepers` workload: does a store full of waiting jobs slow dispatch down, and how late
//! do many sleeps that end at once wake?
//!
//! 1. On the fresh store, a sample of one-step jobs is claimed and completed one task at a time
//!    by 1, then by 8 measuring workers (as `backlog` does).
//! 2. `--jobs` jobs that sleep for a month are submitted: they wait on the server, holding no
//!    worker.
//! 3. After the store settled (`SETTLE_PER_MILLION`), the same sample measurement runs with the sleepers
//!    in the store.
//! 4. `WAKES` jobs whose sleep ends at the same instant (`sleep_until` a time a few seconds
//!    ahead) are submitted; once all have woken, each one's wake lag is its end time minus that
//!    instant.
//! 5. The sample jobs are checked as every workload's are, and every waking job must have
//!    succeeded.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use starbridge_api as api;

use super::BenchArgs;
use super::backlog::{WORKER_COUNTS, fill_with, measure, summaries};
use super::harness::Bench;
use super::stats::{Latencies, Throughput};
use super::workloads::{Checked, Figures, check_workflow};

/// Sleeps that end at the same instant.
const WAKES: usize = 10_000;
/// Tasks claimed and completed per measurement: a p99 of 10,000 claims rests on its 100 slowest,
/// where one of 2,000 rests on 20 and moves by a third from run to run on this machine.
const SAMPLE: usize = 10_000;
/// How long the store is left alone after the fill, per million jobs filled, before the second
/// measurement: a million jobs submitted in half a minute leave the disk writing back and the
/// log being copied into the database file for a while, which a store whose jobs fell asleep
/// over days does not see.
const SETTLE_PER_MILLION: Duration = Duration::from_secs(15);
/// How far ahead of the wake-up submission the common wake instant lies: the submission must
/// end before it.
const WAKE_LEAD: Duration = Duration::from_secs(10);

const SLEEPER: &str = "bench_sleeper";
const WAKER: &str = "bench_waker";

pub(super) async fn sleepers(
    bench: &Bench,
    args: &BenchArgs,
    jobs: usize,
) -> Result<(Figures, Checked)> {
    bench
        .api
        .apply(SLEEPER, "steps:\n- {id: nap, sleep: 30d}\n")
        .await?;
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

    eprintln!("bench: filling the store with {jobs} sleeping jobs");
    let sleeping = fill_with(bench, args, SLEEPER, jobs, "fill (sleeping)").await?;
    if let Some(error) = sleeping.errors.first() {
        bail!("a sleeping job was refused: {error}");
    }
    let settle = SETTLE_PER_MILLION.mul_f64(jobs as f64 / 1_000_000.0);
    eprintln!(
        "bench: letting the store settle for {:.1}s",
        settle.as_secs_f64()
    );
    tokio::time::sleep(settle).await;
    let mut throughput = vec![Throughput::new(
        "fill_submit",
        "submit sleeping jobs, 1000 per request",
        sleeping.jobs.len() as u64,
        "jobs",
        sleeping.seconds(),
    )];

    for workers in WORKER_COUNTS {
        eprintln!(
            "bench: {jobs} jobs sleeping: {sample_size} tasks claimed and completed by {workers} worker(s)"
        );
        let sample = measure(bench, args, workers, sample_size, &mut submissions).await?;
        latency.extend(summaries(&sample, "sleepers", workers));
    }

    let wakes = jobs.min(WAKES);
    let wake_at = api::Timestamp::now() + WAKE_LEAD;
    bench
        .api
        .apply(
            WAKER,
            &format!("steps:\n- {{id: nap, sleep_until: '{wake_at}'}}\n"),
        )
        .await?;
    eprintln!("bench: {wakes} jobs sleeping until {wake_at}");
    let waking = fill_with(bench, args, WAKER, wakes, "submit (waking)").await?;
    let submitted_by = api::Timestamp::now();
    if submitted_by >= wake_at {
        bail!(
            "submitting {wakes} waking jobs took longer than the {}s lead: the wake lag would \
             be meaningless",
            WAKE_LEAD.as_secs()
        );
    }
    throughput.push(Throughput::new(
        "wake_submit",
        "submit jobs sleeping until one instant, 1000 per request",
        waking.jobs.len() as u64,
        "jobs",
        waking.seconds(),
    ));
    let woken = wait_for_wakes(bench, wakes).await?;
    let mut lag = Latencies::new();
    for job in &woken {
        let ended = job.ended_at.unwrap_or(wake_at);
        let late = ended.duration_since(wake_at);
        lag.record(Duration::try_from(late).unwrap_or(Duration::ZERO));
    }
    latency.push(lag.summary(
        "wake_lag",
        format!("wake lag: {wakes} sleeps ending at one instant, end minus that instant"),
    ));

    let sampled: Vec<_> = submissions.iter().collect();
    let checked = check_workflow(bench, args, &sampled, 1, Some("bench_single")).await?;
    let figures = Figures {
        jobs,
        tasks_per_job: 1,
        rate: None,
        seconds: None,
        throughput,
        latency,
        notes: vec![
            format!(
                "the empty-store figures are measured on a store holding only the {sample_size} \
                 sample tasks; the sleepers figures with {jobs} jobs sleeping (running, no lease)"
            ),
            format!(
                "all {} waking jobs succeeded; their sleeps ended at one instant, {}s after \
                 their submission began",
                woken.len(),
                WAKE_LEAD.as_secs()
            ),
        ],
    };
    Ok((figures, checked))
}

/// Waits until `count` jobs of the waking workflow have succeeded, and returns them; fails
/// when nothing woke for a minute.
async fn wait_for_wakes(bench: &Bench, count: usize) -> Result<Vec<api::JobSummary>> {
    let mut last_move = Instant::now();
    let mut seen = 0;
    loop {
        let woken = bench
            .api
            .list_jobs_of(Some(WAKER), Some(api::JobStatus::Succeeded))
            .await?;
        if woken.len() >= count {
            return Ok(woken);
        }
        if woken.len() != seen {
            seen = woken.len();
            last_move = Instant::now();
        }
        if last_move.elapsed() >= Duration::from_secs(60) {
            bail!("only {seen} of {count} sleeping jobs woke, and none for a minute");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
