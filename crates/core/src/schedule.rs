//! Cron schedules: when a schedule fires next, which fires are due after a pause or downtime
//! (catch-up policy), and what to do when the previous job is still running (overlap policy).
//!
//! Pure: the time zone is resolved by the caller (looking it up reads the system's tz database)
//! and passed in, and `now` comes in as an argument.

use croner::Cron;
use jiff::tz::TimeZone;
use serde::{Deserialize, Serialize};

use crate::time::{Duration, Timestamp};
use crate::wire::string_enum;

/// Most occurrences examined when catching up, so a long downtime with a per-second cron stays
/// bounded.
pub const MAX_CATCH_UP_SCAN: usize = 10_000;
/// How late a fire may be and still count as on time under `CatchUp::Skip`.
pub const ON_TIME_GRACE: Duration = Duration::from_secs(60);

/// A parsed cron expression: 5 fields, or 6 with seconds first; `@hourly`-style nicknames,
/// `L`, `W` and `#` as croner supports them.
#[derive(Debug, Clone)]
pub struct CronSpec {
    cron: Cron,
}

impl CronSpec {
    pub fn parse(text: &str) -> Result<CronSpec, String> {
        let cron: Cron = text
            .parse()
            .map_err(|error| format!("'{text}' is not a cron expression: {error}"))?;
        Ok(CronSpec { cron })
    }

    /// The first occurrence strictly after `after`, in `tz`.
    pub fn next_after(&self, tz: &TimeZone, after: Timestamp) -> Option<Timestamp> {
        let start = jiff::Timestamp::from_millisecond(after.0)
            .ok()?
            .to_zoned(tz.clone());
        let next = self.cron.find_next_occurrence(&start, false).ok()?;
        Some(Timestamp(next.timestamp().as_millisecond()))
    }

    /// The next `count` occurrences after `after`.
    pub fn upcoming(&self, tz: &TimeZone, after: Timestamp, count: usize) -> Vec<Timestamp> {
        let mut out = Vec::with_capacity(count);
        let mut cursor = after;
        while out.len() < count {
            match self.next_after(tz, cursor) {
                Some(next) => {
                    out.push(next);
                    cursor = next;
                }
                None => break,
            }
        }
        out
    }
}

string_enum!(
    /// What a fire does while the previous job of the schedule is unfinished.
    #[derive(Default)]
    Overlap {
        /// Do not start a job while the previous one of the schedule is unfinished.
        #[default]
        Skip => "skip",
        /// Start a job at every fire.
        Allow => "allow",
        /// Keep one fire waiting and start it when the previous job ends.
        QueueOne => "queue_one",
    }
);

/// What to do with fires missed while the server was down or the schedule paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "policy")]
pub enum CatchUp {
    /// Drop missed fires; only one within `ON_TIME_GRACE` of now still runs.
    #[default]
    Skip,
    /// Run the most recent missed fire once.
    Once,
    /// Run every missed fire, oldest first, at most `limit` (the most recent ones).
    All { limit: u32 },
}

string_enum!(
    /// The name of a catch-up policy (the API's `policy`), without `All`'s limit.
    CatchUpKind {
        Skip => "skip",
        Once => "once",
        All => "all",
    }
);

impl CatchUp {
    /// The policy's name.
    pub fn kind(self) -> CatchUpKind {
        match self {
            CatchUp::Skip => CatchUpKind::Skip,
            CatchUp::Once => CatchUpKind::Once,
            CatchUp::All { .. } => CatchUpKind::All,
        }
    }

    /// How many missed fires `All` runs at most; `None` for the others.
    pub fn limit(self) -> Option<u32> {
        match self {
            CatchUp::All { limit } => Some(limit),
            CatchUp::Skip | CatchUp::Once => None,
        }
    }
}

/// The fires due at `now` and the next fire time after them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub fires: Vec<Timestamp>,
    pub next: Option<Timestamp>,
}

/// Which fires are due, given the stored next fire time (`next_fire <= now`).
pub fn due(
    spec: &CronSpec,
    tz: &TimeZone,
    next_fire: Timestamp,
    now: Timestamp,
    catch_up: CatchUp,
) -> Due {
    let mut missed = vec![next_fire];
    let mut cursor = next_fire;
    let mut next = None;
    for _ in 0..MAX_CATCH_UP_SCAN {
        match spec.next_after(tz, cursor) {
            Some(at) if at <= now => {
                missed.push(at);
                cursor = at;
            }
            other => {
                next = other;
                break;
            }
        }
    }
    if next.is_none() && cursor <= now {
        // The scan bound was reached: continue from now.
        next = spec.next_after(tz, now);
    }
    let fires = match catch_up {
        CatchUp::Skip => missed
            .iter()
            .rev()
            .find(|at| now.since(**at) <= ON_TIME_GRACE)
            .copied()
            .into_iter()
            .collect(),
        CatchUp::Once => missed.last().copied().into_iter().collect(),
        CatchUp::All { limit } => {
            let keep = (limit as usize).min(missed.len());
            missed[missed.len() - keep..].to_vec()
        }
    };
    Due { fires, next }
}

/// What a fire does, given whether the schedule's previous job is unfinished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FireDecision {
    Start,
    Skip,
    /// Keep this fire pending until the previous job ends (replacing an older pending fire).
    Hold,
}

pub fn decide(overlap: Overlap, previous_unfinished: bool) -> FireDecision {
    match (overlap, previous_unfinished) {
        (_, false) | (Overlap::Allow, true) => FireDecision::Start,
        (Overlap::Skip, true) => FireDecision::Skip,
        (Overlap::QueueOne, true) => FireDecision::Hold,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        Timestamp(text.parse::<jiff::Timestamp>().unwrap().as_millisecond())
    }

    fn utc() -> TimeZone {
        TimeZone::UTC
    }

    #[test]
    fn a_catch_up_policy_is_tagged_with_its_kind() {
        for catch_up in [CatchUp::Skip, CatchUp::Once, CatchUp::All { limit: 3 }] {
            let json = serde_json::to_value(catch_up).unwrap();
            assert_eq!(json["policy"], catch_up.kind().as_str());
            assert_eq!(
                json.get("limit").and_then(|l| l.as_u64()),
                catch_up.limit().map(u64::from)
            );
        }
    }

    #[test]
    fn five_and_six_field_expressions_give_the_next_fire() {
        let hourly = CronSpec::parse("0 * * * *").unwrap();
        assert_eq!(
            hourly.next_after(&utc(), at("2026-11-22T10:15:00Z")),
            Some(at("2026-11-22T11:00:00Z"))
        );
        let every_ten_seconds = CronSpec::parse("*/10 * * * * *").unwrap();
        assert_eq!(
            every_ten_seconds.next_after(&utc(), at("2026-11-22T10:15:01Z")),
            Some(at("2026-11-22T10:15:10Z"))
        );
    }

    #[test]
    fn a_bad_expression_is_refused_with_a_reason() {
        let error = CronSpec::parse("61 * * * *").unwrap_err();
        assert!(error.contains("not a cron expression"), "{error}");
    }

    #[test]
    fn time_zones_follow_daylight_saving() {
        // 02:30 local does not exist on 2026-03-29 in Paris (clocks jump 02:00 → 03:00).
        let paris = jiff::tz::TimeZone::get("Europe/Paris").unwrap();
        let daily = CronSpec::parse("0 9 * * *").unwrap();
        // 09:00 Paris is 08:00 UTC in winter and 07:00 UTC in summer.
        assert_eq!(
            daily.next_after(&paris, at("2026-03-28T12:00:00Z")),
            Some(at("2026-03-29T07:00:00Z"))
        );
        assert_eq!(
            daily.next_after(&paris, at("2026-03-27T12:00:00Z")),
            Some(at("2026-03-28T08:00:00Z"))
        );
    }

    #[test]
    fn catch_up_policies_choose_the_missed_fires() {
        let hourly = CronSpec::parse("0 * * * *").unwrap();
        let first_missed = at("2026-11-22T06:00:00Z");
        let now = at("2026-11-22T10:00:30Z");
        let skip = due(&hourly, &utc(), first_missed, now, CatchUp::Skip);
        assert_eq!(
            skip.fires,
            vec![at("2026-11-22T10:00:00Z")],
            "only the on-time fire"
        );
        assert_eq!(skip.next, Some(at("2026-11-22T11:00:00Z")));
        let once = due(
            &hourly,
            &utc(),
            first_missed,
            at("2026-11-22T10:30:00Z"),
            CatchUp::Once,
        );
        assert_eq!(once.fires, vec![at("2026-11-22T10:00:00Z")]);
        let late = due(
            &hourly,
            &utc(),
            first_missed,
            at("2026-11-22T10:30:00Z"),
            CatchUp::Skip,
        );
        assert!(
            late.fires.is_empty(),
            "missed by more than the grace: dropped"
        );
        let all = due(
            &hourly,
            &utc(),
            first_missed,
            now,
            CatchUp::All { limit: 3 },
        );
        assert_eq!(
            all.fires,
            vec![
                at("2026-11-22T08:00:00Z"),
                at("2026-11-22T09:00:00Z"),
                at("2026-11-22T10:00:00Z")
            ]
        );
    }

    #[test]
    fn overlap_policies_decide_each_fire() {
        assert_eq!(decide(Overlap::Skip, false), FireDecision::Start);
        assert_eq!(decide(Overlap::Skip, true), FireDecision::Skip);
        assert_eq!(decide(Overlap::Allow, true), FireDecision::Start);
        assert_eq!(decide(Overlap::QueueOne, true), FireDecision::Hold);
    }

    #[test]
    fn upcoming_lists_the_next_fires() {
        let daily = CronSpec::parse("@daily").unwrap();
        let next = daily.upcoming(&utc(), at("2026-11-22T10:00:00Z"), 3);
        assert_eq!(next.len(), 3);
        assert_eq!(next[0], at("2026-11-23T00:00:00Z"));
    }
}
