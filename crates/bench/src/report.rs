//! The benchmark's report: one JSON document with every figure (`-o json`), or tables for people.
//! Progress goes to stderr while the benchmark runs; the report alone goes to stdout.

use anyhow::Result;
use serde::Serialize;

use super::Table;
use super::stats::{LatencySummary, Throughput, as_map};
use super::verify::Correctness;

/// What the output says about durability on SQLite: the store's settings, as in production.
pub(crate) const SQLITE_DURABILITY: &str = "sqlite WAL, synced before each answer";

/// The same with `--durability relaxed`.
pub(crate) const SQLITE_RELAXED: &str = "sqlite WAL, not synced before answers (relaxed): the \
                                          last changes acknowledged may be lost on power loss";

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub(crate) workload: &'static str,
    pub(crate) config: Config,
    pub(crate) durability: String,
    pub(crate) database: DatabaseInfo,
    /// Jobs, steps or tasks per second, per phase.
    #[serde(serialize_with = "as_map")]
    pub(crate) throughput: Vec<Throughput>,
    /// Latency distributions in milliseconds.
    #[serde(serialize_with = "as_map")]
    pub(crate) latency_ms: Vec<LatencySummary>,
    pub(crate) resources: Resources,
    /// Things to know when reading the figures.
    pub(crate) notes: Vec<String>,
    pub(crate) verification_seconds: f64,
    pub(crate) wall_seconds: f64,
    pub(crate) correctness: Correctness,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Config {
    pub(crate) jobs: usize,
    /// Jobs per submit request and batched completion reports (`--batch`); absent: one job
    /// and one report per request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) batch: Option<usize>,
    pub(crate) submitters: usize,
    pub(crate) workers: usize,
    pub(crate) concurrency: usize,
    /// Dispatched tasks per job.
    pub(crate) tasks_per_job: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) seconds: Option<f64>,
    pub(crate) cpus: usize,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct DatabaseInfo {
    pub(crate) url: String,
    pub(crate) namespace: String,
    /// False when the temporary database was removed after the run.
    pub(crate) kept: bool,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Resources {
    /// Where the server ran: `in this process` (with the benchmark's workers and clients, so
    /// the peak memory is theirs together), or `external` (their own processes).
    pub(crate) server: &'static str,
    /// Peak resident memory (`VmHWM`) of the server's process: this one, or the external
    /// servers' added up.
    pub(crate) peak_rss_bytes: Option<u64>,
    /// Database file plus write-ahead log, before the workload's first submit.
    pub(crate) database_bytes_before: u64,
    /// The same once every job ended.
    pub(crate) database_bytes_after: u64,
    pub(crate) database_growth_bytes: i64,
    pub(crate) db_file_bytes_after: u64,
    pub(crate) wal_file_bytes_after: u64,
}

pub(crate) fn print_json(report: &Report) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(report)?);
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn ms(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

pub(crate) fn print_table(report: &Report, table: Table) {
    let config = &report.config;
    println!(
        "starbridge bench: workload {}, {} jobs ({} dispatched tasks per job), {} workers x {} \
         concurrency, {} submitters, {} CPUs",
        report.workload,
        config.jobs,
        config.tasks_per_job,
        config.workers,
        config.concurrency,
        config.submitters,
        config.cpus
    );
    if let Some(batch) = config.batch {
        println!(
            "batched: {batch} jobs per submit request (not in the paced end-to-end phase), \
             workers report successes in batches"
        );
    }
    println!("durability: {}", report.durability);
    println!(
        "database: {} (namespace {}{})",
        report.database.url,
        report.database.namespace,
        if report.database.kept {
            ""
        } else {
            ", removed"
        }
    );
    println!();
    let rows: Vec<Vec<String>> = report
        .throughput
        .iter()
        .map(|rate| {
            vec![
                rate.label.clone(),
                format!("{} {}", rate.count, rate.unit),
                format!("{:.3}", rate.seconds),
                format!("{} {}/s", rate.per_second, rate.unit),
                rate.target_per_second
                    .map(|target| format!("{target:.0}/s"))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    table(&["PHASE", "COUNT", "SECONDS", "RATE", "TARGET"], &rows);
    println!();
    // A PostgreSQL server on this machine: its CPU, which the process's does not include.
    let database_cpu = report.throughput.iter().any(|rate| {
        rate.work
            .as_ref()
            .is_some_and(|work| work.database_cpu_ms_per_item.is_some())
    });
    let rows: Vec<Vec<String>> = report
        .throughput
        .iter()
        .filter_map(|rate| {
            let work = rate.work.as_ref()?;
            let percent = |share: f64| format!("{:.0}%", share * 100.0);
            let per_item = |cpu: Option<f64>| {
                cpu.map_or_else(
                    || "?".to_owned(),
                    |cpu| format!("{cpu:.3} per {}", rate.unit.trim_end_matches('s')),
                )
            };
            let busy = |busy: Option<f64>| {
                busy.map_or_else(|| "?".to_owned(), |busy| format!("{busy:.2}"))
            };
            let mut row = vec![
                rate.label.clone(),
                per_item(work.cpu_ms_per_item),
                busy(work.cpus_busy),
            ];
            if database_cpu {
                row.push(per_item(work.database_cpu_ms_per_item));
                row.push(busy(work.database_cpus_busy));
            }
            row.extend([
                work.commits.to_string(),
                format!("{:.1}", work.requests_per_commit),
                percent(work.writer_busy),
                percent(work.writer_committing),
                work.log_sync_ms_mean
                    .map_or_else(|| "-".to_owned(), |mean| format!("{mean:.3}")),
            ]);
            Some(row)
        })
        .collect();
    if !rows.is_empty() {
        let mut headers = vec!["WORK", "CPU MS (ALL PROCESSES)", "CPUS BUSY"];
        if database_cpu {
            headers.extend(["POSTGRESQL CPU MS", "ITS CPUS BUSY"]);
        }
        headers.extend([
            "COMMITS",
            "REQUESTS/COMMIT",
            "WRITER BUSY",
            "IN COMMIT",
            "LOG SYNC MS",
        ]);
        table(&headers, &rows);
        println!();
    }
    let rows: Vec<Vec<String>> = report
        .latency_ms
        .iter()
        .map(|latency| {
            vec![
                latency.label.clone(),
                latency.count.to_string(),
                ms(latency.p50),
                ms(latency.p90),
                ms(latency.p99),
                ms(latency.p99_9),
                ms(latency.max),
            ]
        })
        .collect();
    table(
        &["LATENCY (ms)", "COUNT", "P50", "P90", "P99", "P99.9", "MAX"],
        &rows,
    );
    println!();
    let resources = &report.resources;
    println!(
        "peak RSS: {} ({})",
        resources
            .peak_rss_bytes
            .map_or_else(|| "unknown".to_owned(), mib),
        if resources.server == "external" {
            "the external servers"
        } else {
            "server, workers and clients: one process"
        }
    );
    println!(
        "database: {} -> {} (db {}, wal {}; {:+.1} MiB)",
        mib(resources.database_bytes_before),
        mib(resources.database_bytes_after),
        mib(resources.db_file_bytes_after),
        mib(resources.wal_file_bytes_after),
        resources.database_growth_bytes as f64 / (1024.0 * 1024.0)
    );
    println!(
        "wall time: {:.1}s (of which the correctness check {:.1}s)",
        report.wall_seconds, report.verification_seconds
    );
    for note in &report.notes {
        println!("note: {note}");
    }
    println!();
    let correctness = &report.correctness;
    let statuses: Vec<String> = correctness
        .jobs_by_status
        .iter()
        .map(|(status, count)| format!("{count} {status}"))
        .collect();
    println!(
        "correctness: {} jobs submitted ({} submit errors), listed: {}; {} tasks checked, {} not on \
         attempt 1; {} handler invocations, {} duplicated",
        correctness.jobs_submitted,
        correctness.submit_errors,
        if statuses.is_empty() {
            "none".to_owned()
        } else {
            statuses.join(", ")
        },
        correctness.tasks_checked,
        correctness.tasks_not_attempt_1,
        correctness.handler_invocations,
        correctness.duplicate_invocations
    );
    if correctness.ok {
        println!("anomalies: none");
    } else {
        println!("anomalies: {}", correctness.anomaly_count);
        for anomaly in &correctness.anomalies {
            println!("  - {anomaly}");
        }
        if correctness.anomaly_count > correctness.anomalies.len() as u64 {
            println!(
                "  … and {} more",
                correctness.anomaly_count - correctness.anomalies.len() as u64
            );
        }
    }
}
