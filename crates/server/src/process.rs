//! This process's CPU time and memory, read from Linux's `/proc` (`None` elsewhere): the
//! `process_*` series of `/metrics`, and what `starbridge bench` reports of itself and of a
//! database server running on the same machine (`cpu_of_processes_named`).

use std::time::Duration;

/// CPU and memory use of this process so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessStats {
    /// CPU time, user and system, all threads.
    pub cpu: Duration,
    /// Resident memory now (`VmRSS`).
    pub resident_bytes: u64,
    /// The most resident memory so far (`VmHWM`).
    pub peak_resident_bytes: u64,
}

/// This process's figures now.
pub fn read() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    Some(ProcessStats {
        cpu: parse_cpu(&stat)?,
        resident_bytes: parse_kib(&status, "VmRSS:")?,
        peak_resident_bytes: parse_kib(&status, "VmHWM:")?,
    })
}

/// CPU time, user and system, of every process on this machine whose command name is `name`
/// (`postgres`: a PostgreSQL server's backends and background processes), as far as this
/// user may read them. Processes that ended are not counted.
pub fn cpu_of_processes_named(name: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        // A process may end between the listing and the read.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if command_name(&stat) == Some(name) {
            total += parse_cpu(&stat).unwrap_or_default();
        }
    }
    Some(total)
}

/// The command name (field 2, in parentheses) of `/proc/<pid>/stat`.
fn command_name(stat: &str) -> Option<&str> {
    Some(&stat[stat.find('(')? + 1..stat.rfind(')')?])
}

/// Clock ticks per second of `/proc` times (`USER_HZ`, fixed at 100 in Linux's ABI).
const USER_HZ: u64 = 100;

/// User plus system time from `/proc/<pid>/stat`.
fn parse_cpu(stat: &str) -> Option<Duration> {
    // The command name (field 2) may hold spaces and parentheses; the fields after it are
    // plain. utime and stime are fields 14 and 15: the 12th and 13th after the name.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((user + system) * 1000 / USER_HZ))
}

/// A `kB` line of `/proc/<pid>/status`, in bytes.
fn parse_kib(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with(field))?;
    let kib: u64 = line[field.len()..]
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
    fn cpu_is_user_plus_system_ticks() {
        // pid (comm with a space and a parenthesis) state, then fields 4 to 13, utime, stime.
        let stat = "42 (tokio (rt) w) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9";
        assert_eq!(parse_cpu(stat), Some(Duration::from_millis(3250)));
        assert_eq!(parse_cpu("42 (x) S 1"), None);
    }

    #[test]
    fn the_command_name_may_hold_spaces_and_parentheses() {
        let stat = "42 (tokio (rt) w) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9";
        assert_eq!(command_name(stat), Some("tokio (rt) w"));
        assert_eq!(command_name("42 x S 1"), None);
    }

    #[test]
    fn processes_named_as_this_one_count_at_least_its_own_cpu() {
        let own = read().expect("/proc/self reads on Linux").cpu;
        let stat = std::fs::read_to_string("/proc/self/stat").expect("own stat");
        let name = command_name(&stat).expect("own command name");
        let named = cpu_of_processes_named(name).expect("/proc lists on Linux");
        assert!(named >= own, "{named:?} < {own:?}");
        assert_eq!(
            cpu_of_processes_named("no process has this name"),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn memory_lines_are_read_in_bytes() {
        let status =
            "Name:\tstarbridge\nVmPeak:\t  2000 kB\nVmHWM:\t    1234 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(parse_kib(status, "VmHWM:"), Some(1234 * 1024));
        assert_eq!(parse_kib(status, "VmRSS:"), Some(1000 * 1024));
        assert_eq!(parse_kib("Name: x\n", "VmHWM:"), None);
    }

    #[test]
    fn this_process_reads_on_linux() {
        let stats = read().expect("/proc/self reads on Linux");
        assert!(stats.peak_resident_bytes >= stats.resident_bytes);
        assert!(stats.resident_bytes > 0);
    }
}
