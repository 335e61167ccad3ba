//! Points in time and durations as plain numbers, so the core never reads a clock: the engine
//! passes `now` in with every input.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub fn as_millis(self) -> i64 {
        self.0
    }

    pub fn saturating_add(self, duration: Duration) -> Timestamp {
        Timestamp(
            self.0
                .saturating_add(i64::try_from(duration.0).unwrap_or(i64::MAX)),
        )
    }

    /// The time from `earlier` to `self`, zero when `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }

    /// Reads an RFC 3339 time with an offset, such as `2026-12-01T02:00:00Z`.
    pub fn parse_rfc3339(text: &str) -> Option<Timestamp> {
        text.parse::<jiff::Timestamp>()
            .ok()
            .map(|ts| Timestamp(ts.as_millisecond()))
    }

    /// The time in RFC 3339, in UTC (`2026-12-01T02:00:00Z`; milliseconds when not zero).
    pub fn to_rfc3339(self) -> String {
        jiff::Timestamp::from_millisecond(self.0)
            .map_or_else(|_| self.0.to_string(), |ts| ts.to_string())
    }
}

/// A length of time in milliseconds.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Duration(pub u64);

impl Duration {
    pub const fn from_millis(millis: u64) -> Duration {
        Duration(millis)
    }

    pub const fn from_secs(secs: u64) -> Duration {
        Duration(secs.saturating_mul(1000))
    }

    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// Parses a definition duration: `500ms`, `30s`, `5m`, `2h`, `1d`, or a plain number of seconds
    /// (`90`, `1.5`). Compound forms such as `1h30m` are accepted too.
    pub fn parse(text: &str) -> Result<Duration, DurationError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(DurationError::Empty);
        }
        if let Ok(seconds) = text.parse::<f64>() {
            return Duration::from_seconds_f64(seconds).ok_or(DurationError::OutOfRange);
        }
        let mut total: u64 = 0;
        let mut rest = text;
        while !rest.is_empty() {
            let digits_end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(|| DurationError::MissingUnit(text.to_owned()))?;
            if digits_end == 0 {
                return Err(DurationError::Malformed(text.to_owned()));
            }
            let number: f64 = rest[..digits_end]
                .parse()
                .map_err(|_| DurationError::Malformed(text.to_owned()))?;
            rest = &rest[digits_end..];
            let unit_end = rest
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(rest.len());
            let unit_millis: f64 = match &rest[..unit_end] {
                "ms" => 1.0,
                "s" => 1_000.0,
                "m" => 60_000.0,
                "h" => 3_600_000.0,
                "d" => 86_400_000.0,
                _ => return Err(DurationError::Malformed(text.to_owned())),
            };
            rest = &rest[unit_end..];
            let millis = number * unit_millis;
            if !millis.is_finite() || millis < 0.0 || millis > u64::MAX as f64 {
                return Err(DurationError::OutOfRange);
            }
            total = total
                .checked_add(millis.round() as u64)
                .ok_or(DurationError::OutOfRange)?;
        }
        Ok(Duration(total))
    }

    fn from_seconds_f64(seconds: f64) -> Option<Duration> {
        let millis = seconds * 1000.0;
        (millis.is_finite() && millis >= 0.0 && millis <= u64::MAX as f64)
            .then(|| Duration(millis.round() as u64))
    }

    /// Accepts a JSON number of seconds or a duration string.
    pub fn from_json(value: &serde_json::Value) -> Result<Duration, DurationError> {
        match value {
            serde_json::Value::String(text) => Duration::parse(text),
            serde_json::Value::Number(number) => number
                .as_f64()
                .and_then(Duration::from_seconds_f64)
                .ok_or(DurationError::OutOfRange),
            _ => Err(DurationError::NotADuration),
        }
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0;
        for (unit, size) in [
            ("d", 86_400_000),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1_000),
        ] {
            if millis >= size && millis.is_multiple_of(size) {
                return write!(f, "{}{unit}", millis / size);
            }
        }
        write!(f, "{millis}ms")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration")]
    Empty,
    #[error("'{0}' has no unit: write 500ms, 30s, 5m, 2h, 1d or a plain number of seconds")]
    MissingUnit(String),
    #[error("'{0}' is not a duration: write 500ms, 30s, 5m, 2h, 1d or a plain number of seconds")]
    Malformed(String),
    #[error("duration out of range")]
    OutOfRange,
    #[error("expected a duration such as \"30s\" or a number of seconds")]
    NotADuration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(text: &str, millis: u64) {
        assert_eq!(Duration::parse(text), Ok(Duration(millis)), "{text}");
    }

    #[test]
    fn parses_every_unit_and_plain_seconds() {
        check("500ms", 500);
        check("30s", 30_000);
        check("5m", 300_000);
        check("2h", 7_200_000);
        check("1d", 86_400_000);
        check("90", 90_000);
        check("1.5", 1_500);
        check("1h30m", 5_400_000);
        check(" 2s ", 2_000);
    }

    #[test]
    fn rejects_malformed_durations_with_a_hint() {
        for bad in ["", "5x", "m5", "-1", "1.2.3s", "s"] {
            let error = Duration::parse(bad).unwrap_err();
            assert!(!error.to_string().is_empty(), "{bad}");
        }
        assert!(
            Duration::parse("5x")
                .unwrap_err()
                .to_string()
                .contains("500ms, 30s")
        );
    }

    #[test]
    fn displays_in_the_largest_whole_unit() {
        assert_eq!(Duration(300_000).to_string(), "5m");
        assert_eq!(Duration(1_500).to_string(), "1500ms");
        assert_eq!(Duration(0).to_string(), "0ms");
    }

    #[test]
    fn timestamp_arithmetic_saturates() {
        assert_eq!(
            Timestamp(i64::MAX - 1).saturating_add(Duration(10)),
            Timestamp(i64::MAX)
        );
        assert_eq!(Timestamp(5).since(Timestamp(10)), Duration(0));
    }
}
