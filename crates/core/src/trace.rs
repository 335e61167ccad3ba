//! W3C trace context for the OpenTelemetry traces a server exports (`--otlp-endpoint`): a job's
//! stored trace (`JobTrace`), reading and writing `traceparent` values, and the span id of a
//! task attempt, derived from the task and the attempt so that every node computes the same one
//! (at claim, for the worker's `traceparent`, and when the attempt ends, for its span).

/// The trace a job's spans belong to, stored with the job at submit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobTrace {
    pub trace_id: u128,
    /// The job span's id: the parent of its attempts' spans.
    pub span_id: u64,
    /// The span the job continues (from the submitter's `traceparent`).
    pub parent_span_id: Option<u64>,
}

/// The trace id and parent span id of a W3C `traceparent` header
/// (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`); `None` for anything else, all-zero
/// ids included.
pub fn parse_traceparent(value: &str) -> Option<(u128, u64)> {
    let mut parts = value.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let lower_hex = |text: &str, len: usize| {
        text.len() == len
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !lower_hex(version, 2) || version == "ff" || !lower_hex(flags, 2) {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    if !lower_hex(trace, 32) || !lower_hex(span, 16) {
        return None;
    }
    let trace_id = u128::from_str_radix(trace, 16).ok()?;
    let span_id = u64::from_str_radix(span, 16).ok()?;
    (trace_id != 0 && span_id != 0).then_some((trace_id, span_id))
}

/// The `traceparent` value of a sampled span.
pub fn traceparent(trace_id: u128, span_id: u64) -> String {
    format!("00-{trace_id:032x}-{span_id:016x}-01")
}

/// The span id of a task's attempt: FNV-1a over the task id and the attempt number, never 0.
pub fn attempt_span_id(task: &str, attempt: u32) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in task.bytes().chain(attempt.to_le_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    hash.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_written_reads_back() {
        let value = traceparent(0x0af7651916cd43dd8448eb211c80319c, 0xb7ad6b7169203331);
        assert_eq!(
            value,
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        );
        assert_eq!(
            parse_traceparent(&value),
            Some((0x0af7651916cd43dd8448eb211c80319c, 0xb7ad6b7169203331))
        );
    }

    #[test]
    fn malformed_or_zero_traceparents_are_ignored() {
        for value in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
        ] {
            assert_eq!(parse_traceparent(value), None, "{value}");
        }
    }

    #[test]
    fn attempt_span_ids_differ_by_task_and_attempt() {
        let first = attempt_span_id("t1", 1);
        assert_eq!(first, attempt_span_id("t1", 1));
        assert_ne!(first, attempt_span_id("t1", 2));
        assert_ne!(first, attempt_span_id("t2", 1));
    }
}
