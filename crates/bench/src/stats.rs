//! Figures of a benchmark run: HDR latency histograms and their summaries, throughputs, and the
//! process's peak memory and database size.

use std::path::Path;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Serialize, Serializer};

/// Largest latency recorded exactly: an hour, in microseconds (larger ones saturate).
const MAX_MICROS: u64 = 3_600_000_000;

/// Latencies in microseconds, kept in an HDR histogram (3 significant digits).
pub(crate) struct Latencies(Histogram<u64>);

impl Default for Latencies {
    fn default() -> Latencies {
        Latencies::new()
    }
}

impl Latencies {
    pub(crate) fn new() -> Latencies {
        // The bounds are constants that `new_with_bounds` accepts (low ≥ 1, high ≥ 2·low).
        Latencies(Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("valid histogram bounds"))
    }

    pub(crate) fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.0.saturating_record(micros.max(1));
    }

    /// Records a latency given in (fractional) milliseconds; negative values count as zero.
    pub(crate) fn record_ms(&mut self, millis: f64) {
        self.record(Duration::from_secs_f64(millis.max(0.0) / 1000.0));
    }

    pub(crate) fn add(&mut self, other: &Latencies) {
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = self.0.add(&other.0);
    }

    /// p50, p90, p99, p99.9 and max in milliseconds.
    pub(crate) fn summary(
        &self,
        key: impl Into<String>,
        label: impl Into<String>,
    ) -> LatencySummary {
        let ms = |micros: u64| micros as f64 / 1000.0;
        let at = |quantile: f64| {
            if self.0.is_empty() {
                0.0
            } else {
                ms(self.0.value_at_quantile(quantile))
            }
        };
        LatencySummary {
            key: key.into(),
            label: label.into(),
            count: self.0.len(),
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            p99_9: at(0.999),
            max: if self.0.is_empty() {
                0.0
            } else {
                ms(self.0.max())
            },
        }
    }
}

/// One latency distribution of the report, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LatencySummary {
    #[serde(skip)]
    pub(crate) key: String,
    pub(crate) label: String,
    pub(crate) count: u64,
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
    pub(crate) p99_9: f64,
    pub(crate) max: f64,
}

/// How many things (jobs, steps, tasks) a phase got through, in how long.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Throughput {
    #[serde(skip)]
    pub(crate) key: &'static str,
    pub(crate) label: String,
    pub(crate) count: u64,
    pub(crate) unit: &'static str,
    pub(crate) seconds: f64,
    pub(crate) per_second: f64,
    /// The arrival rate asked for, for a phase run at a fixed rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) target_per_second: Option<f64>,
    /// What the process and the store's writer did during the phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) work: Option<Work>,
}

impl Throughput {
    pub(crate) fn new(
        key: &'static str,
        label: impl Into<String>,
        count: u64,
        unit: &'static str,
        seconds: f64,
    ) -> Throughput {
        Throughput {
            key,
            label: label.into(),
            count,
            unit,
            seconds: round3(seconds),
            per_second: if seconds > 0.0 {
                (count as f64 / seconds).round()
            } else {
                0.0
            },
            target_per_second: None,
            work: None,
        }
    }

    /// The same, with what the phase cost between `start` and `end`.
    pub(crate) fn with_work(mut self, start: &Usage, end: &Usage) -> Throughput {
        self.work = Some(start.until(end, self.count));
        self
    }
}

/// What one server's `/metrics` says of its store writer and its process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Scrape {
    commits: f64,
    requests: f64,
    busy_seconds: f64,
    commit_seconds: f64,
    log_syncs: f64,
    log_sync_seconds: f64,
    cpu_seconds: Option<f64>,
    peak_rss_bytes: Option<f64>,
}

impl Scrape {
    /// Reads the series the benchmark uses from a Prometheus text exposition.
    pub(crate) fn parse(text: &str) -> Scrape {
        let mut scrape = Scrape::default();
        for line in text.lines().filter(|line| !line.starts_with('#')) {
            let Some((name, value)) = line.split_once(' ') else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            match name {
                "starbridge_store_commits_total" => scrape.commits = value,
                "starbridge_store_write_requests_total" => scrape.requests = value,
                "starbridge_store_write_seconds_total" => scrape.busy_seconds = value,
                "starbridge_store_commit_seconds_total" => scrape.commit_seconds = value,
                "starbridge_store_log_syncs_total" => scrape.log_syncs = value,
                "starbridge_store_log_sync_seconds_total" => scrape.log_sync_seconds = value,
                "process_cpu_seconds_total" => scrape.cpu_seconds = Some(value),
                "starbridge_process_peak_resident_memory_bytes" => {
                    scrape.peak_rss_bytes = Some(value);
                }
                _ => {}
            }
        }
        scrape
    }
}

/// CPU time and the servers' store writer counters at one moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    at: Instant,
    /// This process's CPU time, and the external servers'.
    cpu: Option<Duration>,
    /// The PostgreSQL server's CPU time, when it runs on this machine.
    database_cpu: Option<Duration>,
    /// The servers' writers, added up.
    writer: Scrape,
    /// The servers' peak resident memory (added up, when there are several).
    pub(crate) server_peak_rss: Option<u64>,
}

impl Usage {
    /// From the servers' scrapes; `external`: they run in processes of their own (else in this
    /// one, whose CPU they already count). `postgres_here`: the database is a PostgreSQL server
    /// on this machine, whose processes' CPU time is read too.
    pub(crate) fn new(scrapes: &[Scrape], external: bool, postgres_here: bool) -> Usage {
        let own = starbridge_server::process::read();
        let mut writer = Scrape::default();
        for scrape in scrapes {
            writer.commits += scrape.commits;
            writer.requests += scrape.requests;
            writer.busy_seconds += scrape.busy_seconds;
            writer.commit_seconds += scrape.commit_seconds;
            writer.log_syncs += scrape.log_syncs;
            writer.log_sync_seconds += scrape.log_sync_seconds;
        }
        let servers_cpu: Option<f64> = scrapes.iter().map(|scrape| scrape.cpu_seconds).sum();
        let cpu = match (own, external) {
            (Some(own), false) => Some(own.cpu),
            (Some(own), true) => servers_cpu.map(|cpu| own.cpu + Duration::from_secs_f64(cpu)),
            (None, _) => None,
        };
        let server_peak_rss = if external {
            scrapes
                .iter()
                .map(|scrape| scrape.peak_rss_bytes.map(|bytes| bytes as u64))
                .sum()
        } else {
            own.map(|own| own.peak_resident_bytes)
        };
        Usage {
            at: Instant::now(),
            cpu,
            database_cpu: postgres_here
                .then(|| starbridge_server::process::cpu_of_processes_named("postgres"))
                .flatten(),
            writer,
            server_peak_rss,
        }
    }

    /// What happened from `self` to `end`, for a phase that got through `items` things.
    pub(crate) fn until(&self, end: &Usage, items: u64) -> Work {
        let wall = end.at.saturating_duration_since(self.at).as_secs_f64();
        let share = |seconds: f64| {
            if wall > 0.0 {
                round3(seconds.max(0.0) / wall)
            } else {
                0.0
            }
        };
        let spent = |start: Option<Duration>, end: Option<Duration>| match (start, end) {
            (Some(start), Some(end)) => Some(end.saturating_sub(start)),
            _ => None,
        };
        let per_item = |cpu: Duration| round3(cpu.as_secs_f64() * 1000.0 / items as f64);
        let cpu = spent(self.cpu, end.cpu);
        let database_cpu = spent(self.database_cpu, end.database_cpu);
        let commits = (end.writer.commits - self.writer.commits).max(0.0) as u64;
        let requests = (end.writer.requests - self.writer.requests).max(0.0) as u64;
        let log_syncs = (end.writer.log_syncs - self.writer.log_syncs).max(0.0) as u64;
        let log_sync_seconds = end.writer.log_sync_seconds - self.writer.log_sync_seconds;
        Work {
            cpu_ms_per_item: cpu.filter(|_| items > 0).map(per_item),
            cpus_busy: cpu.map(|cpu| share(cpu.as_secs_f64())),
            database_cpu_ms_per_item: database_cpu.filter(|_| items > 0).map(per_item),
            database_cpus_busy: database_cpu.map(|cpu| share(cpu.as_secs_f64())),
            commits,
            write_requests: requests,
            requests_per_commit: if commits > 0 {
                round3(requests as f64 / commits as f64)
            } else {
                0.0
            },
            writer_busy: share(end.writer.busy_seconds - self.writer.busy_seconds),
            writer_committing: share(end.writer.commit_seconds - self.writer.commit_seconds),
            log_syncs,
            log_sync_ms_mean: (log_syncs > 0)
                .then(|| round3(log_sync_seconds.max(0.0) * 1000.0 / log_syncs as f64)),
        }
    }
}

/// What a phase cost: CPU for the whole process (server, workers and clients share it) and
/// the store writer's group commits.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Work {
    /// Process CPU time (user + system) per item, in milliseconds.
    pub(crate) cpu_ms_per_item: Option<f64>,
    /// Process CPU time over wall time: 2.0 is two CPUs busy throughout.
    pub(crate) cpus_busy: Option<f64>,
    /// The PostgreSQL server's CPU time per item (every `postgres` process of this machine: its
    /// backends, the benchmark's and any other client's, and its background processes), when
    /// it runs here; the process CPU above does not include it.
    pub(crate) database_cpu_ms_per_item: Option<f64>,
    /// The same over wall time.
    pub(crate) database_cpus_busy: Option<f64>,
    /// Group transactions committed.
    pub(crate) commits: u64,
    /// Write requests run (one per submitted job, claim, report…).
    pub(crate) write_requests: u64,
    pub(crate) requests_per_commit: f64,
    /// Share of the wall time the writer spent in transactions.
    pub(crate) writer_busy: f64,
    /// Share of the wall time the writer spent in `COMMIT` (writing the commit; on SQLite the
    /// log's sync comes after it, on a thread of its own).
    pub(crate) writer_committing: f64,
    /// SQLite, fully durable: syncs of the write-ahead log (one covers every commit written
    /// before it began).
    pub(crate) log_syncs: u64,
    /// Their mean time in milliseconds (none without syncs): every answer waits for one, so it
    /// is a floor under a lone request's latency.
    pub(crate) log_sync_ms_mean: Option<f64>,
}

/// Something listed in the report under a key of its own.
pub(crate) trait Keyed {
    fn key(&self) -> &str;
}

impl Keyed for LatencySummary {
    fn key(&self) -> &str {
        &self.key
    }
}

impl Keyed for Throughput {
    fn key(&self) -> &str {
        self.key
    }
}

/// Serializes a list of keyed figures as a JSON object, in list order.
pub(crate) fn as_map<S, T>(items: &[T], serializer: S) -> Result<S::Ok, S::Error>
where
    S: Serializer,
    T: Keyed + Serialize,
{
    serializer.collect_map(items.iter().map(|item| (item.key(), item)))
}

pub(crate) fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Sizes of the database file and its write-ahead log.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct DatabaseSize {
    pub(crate) db_bytes: u64,
    pub(crate) wal_bytes: u64,
}

impl DatabaseSize {
    pub(crate) fn of(path: &Path) -> DatabaseSize {
        let len = |path: &Path| std::fs::metadata(path).map_or(0, |m| m.len());
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        DatabaseSize {
            db_bytes: len(path),
            wal_bytes: len(Path::new(&wal)),
        }
    }

    pub(crate) fn total(self) -> u64 {
        self.db_bytes + self.wal_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_reports_percentiles_in_milliseconds() {
        let mut latencies = Latencies::new();
        for ms in 1..=100 {
            latencies.record(Duration::from_millis(ms));
        }
        let summary = latencies.summary("k", "label");
        assert_eq!(summary.count, 100);
        assert!((summary.p50 - 50.0).abs() < 0.1, "{summary:?}");
        assert!((summary.p99 - 99.0).abs() < 0.1, "{summary:?}");
        assert!((summary.max - 100.0).abs() < 0.1, "{summary:?}");
        let empty = Latencies::new().summary("k", "label");
        assert_eq!((empty.count, empty.max), (0, 0.0));
    }

    #[test]
    fn a_scrape_reads_the_writer_and_process_series() {
        let text = "# HELP starbridge_store_commits_total x\n\
                    # TYPE starbridge_store_commits_total counter\n\
                    starbridge_store_commits_total 12\n\
                    starbridge_store_write_requests_total 300\n\
                    starbridge_store_write_seconds_total 1.5\n\
                    starbridge_store_commit_seconds_total 0.5\n\
                    starbridge_store_log_syncs_total 10\n\
                    starbridge_store_log_sync_seconds_total 0.004\n\
                    process_cpu_seconds_total 2.25\n\
                    starbridge_process_peak_resident_memory_bytes 1048576\n\
                    starbridge_http_requests_total{method=\"GET\",route=\"/x\",status=\"200\"} 3\n";
        let scrape = Scrape::parse(text);
        assert_eq!(
            scrape,
            Scrape {
                commits: 12.0,
                requests: 300.0,
                busy_seconds: 1.5,
                commit_seconds: 0.5,
                log_syncs: 10.0,
                log_sync_seconds: 0.004,
                cpu_seconds: Some(2.25),
                peak_rss_bytes: Some(1_048_576.0),
            }
        );
        let external = Usage::new(&[scrape, scrape], true, false);
        assert_eq!(external.server_peak_rss, Some(2 * 1_048_576));
        assert!(external.cpu.unwrap() >= Duration::from_millis(4500));
    }

    #[test]
    fn a_phase_gives_the_mean_time_of_its_log_syncs_when_it_had_any() {
        let start = Instant::now();
        let usage = |seconds: u64, log_syncs: f64, log_sync_seconds: f64| Usage {
            at: start + Duration::from_secs(seconds),
            cpu: None,
            database_cpu: None,
            writer: Scrape {
                log_syncs,
                log_sync_seconds,
                ..Scrape::default()
            },
            server_peak_rss: None,
        };
        let work = usage(0, 100.0, 0.05).until(&usage(1, 300.0, 0.11), 1_000);
        assert_eq!((work.log_syncs, work.log_sync_ms_mean), (200, Some(0.3)));
        let unsynced = usage(0, 0.0, 0.0).until(&usage(1, 0.0, 0.0), 1_000);
        assert_eq!((unsynced.log_syncs, unsynced.log_sync_ms_mean), (0, None));
    }

    #[test]
    fn keyed_lists_serialize_as_objects_in_order() {
        #[derive(Serialize)]
        struct Doc {
            #[serde(serialize_with = "as_map")]
            rates: Vec<Throughput>,
        }
        let doc = Doc {
            rates: vec![
                Throughput::new("zeta", "z", 10, "jobs", 2.0),
                Throughput::new("alpha", "a", 3, "jobs", 0.0),
            ],
        };
        let text = serde_json::to_string(&doc).unwrap();
        assert!(
            text.find("zeta").unwrap() < text.find("alpha").unwrap(),
            "{text}"
        );
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["rates"]["zeta"]["per_second"], 5.0);
        assert_eq!(value["rates"]["alpha"]["per_second"], 0.0);
    }

    #[test]
    fn a_phase_counts_the_database_servers_cpu_apart_from_the_process() {
        let start = Instant::now();
        let usage = |seconds: u64, cpu_ms: u64, database_ms: Option<u64>| Usage {
            at: start + Duration::from_secs(seconds),
            cpu: Some(Duration::from_millis(cpu_ms)),
            database_cpu: database_ms.map(Duration::from_millis),
            writer: Scrape::default(),
            server_peak_rss: None,
        };
        let work = usage(0, 1_000, Some(5_000)).until(&usage(2, 2_000, Some(6_500)), 1_000);
        assert_eq!(work.cpu_ms_per_item, Some(1.0));
        assert_eq!(work.cpus_busy, Some(0.5));
        assert_eq!(work.database_cpu_ms_per_item, Some(1.5));
        assert_eq!(work.database_cpus_busy, Some(0.75));
        let without = usage(0, 1_000, None).until(&usage(2, 2_000, None), 1_000);
        assert_eq!(without.database_cpu_ms_per_item, None);
        assert_eq!(without.database_cpus_busy, None);
    }
}
