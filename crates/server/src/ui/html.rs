//! HTML escaping and the small formatting helpers every page uses. Everything that comes from
//! the store or the request goes through `Esc` (text and attribute values alike).

use std::fmt::{self, Display, Write as _};

use starbridge_core::time::Timestamp;

/// Displays its text with `& < > " '` escaped, safe inside elements and quoted attributes.
pub(crate) struct Esc<'a>(pub(crate) &'a str);

impl Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..at])?;
            f.write_str(match rest.as_bytes()[at] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[at + 1..];
        }
        f.write_str(rest)
    }
}

/// Escapes into a new string.
pub(crate) fn esc(text: &str) -> String {
    Esc(text).to_string()
}

/// Percent-encodes a query value or path segment (everything but unreserved characters).
pub(crate) fn url(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// A time as `2026-11-23 01:14:13` (UTC).
pub(crate) fn time(ts: Timestamp) -> String {
    starbridge_api::timestamp_from_millis(ts.0)
        .strftime("%Y-%m-%d %H:%M:%S")
        .to_string()
}

/// A duration in milliseconds, short: `850ms`, `12.4s`, `3m 05s`, `2h 01m`, `3d 4h`.
pub(crate) fn duration(millis: i64) -> String {
    let millis = millis.max(0);
    let seconds = millis / 1000;
    match millis {
        0..1_000 => format!("{millis}ms"),
        1_000..60_000 => format!("{:.1}s", millis as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m {:02}s", seconds / 60, seconds % 60),
        3_600_000..86_400_000 => format!("{}h {:02}m", seconds / 3600, seconds % 3600 / 60),
        _ => format!("{}d {}h", seconds / 86_400, seconds % 86_400 / 3600),
    }
}

/// Pretty JSON for display.
pub(crate) fn json(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_covers_markup_and_both_quotes() {
        assert_eq!(
            esc(r#"<a href="x" title='y'>&</a>"#),
            "&lt;a href=&quot;x&quot; title=&#39;y&#39;&gt;&amp;&lt;/a&gt;"
        );
        assert_eq!(esc("plain ünïcode"), "plain ünïcode");
    }

    #[test]
    fn url_encoding_keeps_only_unreserved_characters() {
        assert_eq!(url("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(url("job_01-x.y~z"), "job_01-x.y~z");
    }

    #[test]
    fn durations_are_short_and_readable() {
        for (millis, text) in [
            (850, "850ms"),
            (12_400, "12.4s"),
            (185_000, "3m 05s"),
            (7_260_000, "2h 01m"),
            (273_600_000, "3d 4h"),
            (-5, "0ms"),
        ] {
            assert_eq!(duration(millis), text);
        }
    }

    #[test]
    fn times_are_shown_in_utc_to_the_second() {
        assert_eq!(time(Timestamp(1_700_000_000_123)), "2023-11-14 22:13:20");
    }
}
