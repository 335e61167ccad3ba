//! Figures of a benchmark run: HDR latency histograms and their summaries, throughputs, and the
//! process's peak memory and database size.

use std::path::Path;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Serialize, Serializer};
use starbridge_store::{Store, WriterStats};

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

/// The process's CPU time and the store writer's counters at one moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    at: Instant,
    cpu: Option<Duration>,
    writer: WriterStats,
}

impl Usage {
    pub(crate) fn read(store: &Store) -> Usage {
        Usage {
            at: Instant::now(),
            cpu: process_cpu(),
            writer: store.writer_stats(),
        }
    }

    /// What happened from `self` to `end`, for a phase that got through `items` things.
    pub(crate) fn until(&self, end: &Usage, items: u64) -> Work {
        let wall = end.at.saturating_duration_since(self.at).as_secs_f64();
        let share = |part: Duration| {
            if wall > 0.0 {
                round3(part.as_secs_f64() / wall)
            } else {
                0.0
            }
        };
        let cpu = match (self.cpu, end.cpu) {
            (Some(start), Some(end)) => Some(end.saturating_sub(start)),
            _ => None,
        };
        let commits = end.writer.commits - self.writer.commits;
        let requests = end.writer.requests - self.writer.requests;
        Work {
            cpu_ms_per_item: cpu
                .filter(|_| items > 0)
                .map(|cpu| round3(cpu.as_secs_f64() * 1000.0 / items as f64)),
            cpus_busy: cpu.map(share),
            commits,
            write_requests: requests,
            requests_per_commit: if commits > 0 {
                round3(requests as f64 / commits as f64)
            } else {
                0.0
            },
            writer_busy: share(end.writer.busy.saturating_sub(self.writer.busy)),
            writer_committing: share(end.writer.committing.saturating_sub(self.writer.committing)),
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
    /// Group transactions committed.
    pub(crate) commits: u64,
    /// Write requests run (one per submitted job, claim, report…).
    pub(crate) write_requests: u64,
    pub(crate) requests_per_commit: f64,
    /// Share of the wall time the writer spent in transactions.
    pub(crate) writer_busy: f64,
    /// Share of the wall time the writer spent in `COMMIT` (the durable write).
    pub(crate) writer_committing: f64,
}

/// This process's CPU time so far (user + system, all threads), from `/proc/self/stat`.
fn process_cpu() -> Option<Duration> {
    parse_cpu(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// Clock ticks per second of `/proc` times (`USER_HZ`, fixed at 100 in Linux's ABI).
const USER_HZ: u64 = 100;

fn parse_cpu(stat: &str) -> Option<Duration> {
    // The command name (field 2) may hold spaces; the fields after it are plain. utime and
    // stime are fields 14 and 15, so the 12th and 13th after the name's closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((user + system) * 1000 / USER_HZ))
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

/// The peak resident set size of this process (`VmHWM` in /proc/self/status), where available.
pub(crate) fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_hwm(&status)
}

fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
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
    fn vm_hwm_is_read_in_bytes() {
        let status =
            "Name:\tstarbridge\nVmPeak:\t  2000 kB\nVmHWM:\t    1234 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(1234 * 1024));
        assert_eq!(parse_vm_hwm("Name: x\n"), None);
    }

    #[test]
    fn process_cpu_is_user_plus_system_ticks() {
        // pid (comm with a space and a parenthesis) state, then fields 4 to 13, utime, stime.
        let stat = "42 (tokio (rt) w) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9";
        assert_eq!(parse_cpu(stat), Some(Duration::from_millis(3250)));
        assert_eq!(parse_cpu("42 (x) S 1"), None);
        assert!(process_cpu().is_some(), "/proc/self/stat reads on Linux");
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
}
