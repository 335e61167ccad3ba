//! History partitions on PostgreSQL. `events` is partitioned by the UTC day of `at` (migration
//! 0014): a partition `events_YYYYMMDD` per day, and `events_default` for events of days that
//! have none. The pruner makes the coming days' partitions ahead of time, and drops a day's
//! partition once the day is past the retention and no job with history in it is left — jobs
//! go one by one after their retention (`prune_finished`, which leaves their history in day
//! partitions to this), so a job still running keeps the day it started in. Retiring a day of
//! history is then a `DROP TABLE`, not a delete of each of its rows.
//!
//! Nodes sharing the database take turns under one advisory lock. SQLite keeps one `events`
//! table: there these do nothing.

use starbridge_core::model::JobStatus;
use starbridge_core::time::Timestamp;

use super::{NAMESPACES_WITH_JOBS, status_list};
use crate::db::{Backend, Conn, Queries, args};
use crate::{Error, Result};

const DAY_MILLIS: i64 = 86_400_000;

/// Days made ahead of today: history keeps landing in day partitions while no node makes new
/// ones for up to this long.
pub const DAYS_AHEAD: i64 = 7;

/// The advisory lock key nodes take turns under.
const LOCK_KEY: &str = "event-partitions";

/// The partition holding the events of `day` (days since 1970-01-01 UTC).
fn partition_name(day: i64) -> Result<String> {
    let start = jiff::Timestamp::from_millisecond(day * DAY_MILLIS)
        .map_err(|error| Error::Corrupt(format!("no partition for day {day}: {error}")))?;
    Ok(format!("events_{}", start.strftime("%Y%m%d")))
}

/// The day a partition named by `partition_name` holds; `None` for any other table.
fn partition_day(name: &str) -> Option<i64> {
    let digits = name.strip_prefix("events_")?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let date: jiff::civil::Date = format!("{}-{}-{}", &digits[..4], &digits[4..6], &digits[6..])
        .parse()
        .ok()?;
    let start = date.to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp();
    Some(start.as_millisecond().div_euclid(DAY_MILLIS))
}

/// Makes the partitions of today and the `DAYS_AHEAD` following days that do not exist yet
/// (moving in any of their events the default partition caught); returns their names.
pub fn make_event_partitions(conn: &mut dyn Conn, now: Timestamp) -> Result<Vec<String>> {
    if conn.backend() != Backend::Postgres {
        return Ok(Vec::new());
    }
    conn.lock_key(LOCK_KEY)?;
    let today = now.0.div_euclid(DAY_MILLIS);
    let mut made = Vec::new();
    for day in today..=today + DAYS_AHEAD {
        let name = partition_name(day)?;
        let exists: bool = conn.query_value("SELECT to_regclass(?1) IS NOT NULL", args![name])?;
        if exists {
            continue;
        }
        let (from, to) = (day * DAY_MILLIS, (day + 1) * DAY_MILLIS);
        // Made apart and attached, rather than `CREATE TABLE … PARTITION OF`: attaching does
        // not block reads and writes of the other partitions, and the default partition may
        // hold events of this day, which must move first.
        conn.batch(&format!(
            "CREATE TABLE {name} (LIKE events INCLUDING DEFAULTS INCLUDING CONSTRAINTS); \
             WITH moved AS (DELETE FROM events_default WHERE at >= {from} AND at < {to} RETURNING *) \
             INSERT INTO {name} SELECT * FROM moved; \
             ALTER TABLE events ATTACH PARTITION {name} FOR VALUES FROM ({from}) TO ({to})"
        ))?;
        made.push(name);
    }
    Ok(made)
}

/// Drops the day partitions that ended before `ended_before` (now less the retention) and hold
/// history of no job still kept; returns their names.
pub fn drop_retired_event_partitions(
    conn: &mut dyn Conn,
    ended_before: Timestamp,
) -> Result<Vec<String>> {
    if conn.backend() != Backend::Postgres {
        return Ok(Vec::new());
    }
    conn.lock_key(LOCK_KEY)?;
    let mut partitions: Vec<(i64, String)> = conn
        .query_map(
            "SELECT c.relname::TEXT FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = to_regclass('events')",
            &[],
            |row| row.get::<String>(0),
        )?
        .into_iter()
        .filter_map(|name| partition_day(&name).map(|day| (day, name)))
        .filter(|(day, _)| (day + 1) * DAY_MILLIS <= ended_before.0)
        .collect();
    partitions.sort();
    let statuses = status_list(JobStatus::ALL.iter().copied());
    let mut dropped = Vec::new();
    for (day, name) in partitions {
        // A job's events come after its creation: only jobs made before the day ended can
        // have history in it, and after pruning those are few (the ones still kept). They are
        // read per namespace and status through the list index `jobs_status_created`
        // (namespace, status, created_at), the namespaces found by skipping through that
        // index (`NAMESPACES_WITH_JOBS`), so `jobs` needs no index of its own on `created_at`.
        let held = conn
            .query_opt(
                &format!(
                    "{NAMESPACES_WITH_JOBS} \
                     SELECT 1 FROM spaces WHERE spaces.name IS NOT NULL AND EXISTS ( \
                         SELECT 1 FROM jobs WHERE jobs.namespace = spaces.name \
                         AND jobs.status IN ({statuses}) AND jobs.created_at < ?1 \
                         AND EXISTS (SELECT 1 FROM {name} e WHERE e.job_id = jobs.id)) \
                     LIMIT 1"
                ),
                args![(day + 1) * DAY_MILLIS],
                |_| Ok(()),
            )?
            .is_some();
        if !held {
            conn.batch(&format!("DROP TABLE {name}"))?;
            dropped.push(name);
        }
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_is_named_after_its_utc_day_and_read_back() {
        let day = 1_700_000_000_000_i64.div_euclid(DAY_MILLIS);
        assert_eq!(partition_name(day).unwrap(), "events_20231114");
        assert_eq!(partition_day("events_20231114"), Some(day));
        assert_eq!(partition_day("events_default"), None);
        assert_eq!(partition_day("events_2023111"), None);
    }
}
