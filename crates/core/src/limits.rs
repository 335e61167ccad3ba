//! Run-time limits the engine enforces while a job runs (the server's settings choose them), and
//! a bounded measure of a JSON value's size that the server's request limits use too.

use serde_json::Value;

/// Longest name: of a workflow, queue, schedule, step or namespace (the server's
/// `--max-name-bytes` may only lower it).
pub const MAX_NAME_BYTES: usize = 128;
/// Longest job key (the server's `--max-key-bytes` may only lower it).
pub const MAX_KEY_BYTES: usize = 256;
/// Longest rendered lock key.
pub const MAX_LOCK_KEY_BYTES: usize = 256;
/// Most prefix settings (`PUT /api/v1/queues/agent-*`) one namespace may have: every claim
/// reads them all.
pub const MAX_QUEUE_PREFIXES: usize = 100;

/// Longest a task may await a callback at once (`timeout_ms` of `await-callback`).
pub const MAX_CALLBACK_TIMEOUT: crate::time::Duration =
    crate::time::Duration::from_secs(7 * 24 * 3600);

/// Default for [`Limits::fan_out`].
pub const DEFAULT_MAX_FAN_OUT: usize = 10_000;
/// Default for [`Limits::task_bytes`]: 256 KiB.
pub const DEFAULT_MAX_TASK_BYTES: usize = 256 * 1024;
/// Default for [`Limits::pending_signals`].
pub const DEFAULT_MAX_PENDING_SIGNALS: usize = 100;
/// Default for [`Limits::workflow_depth`].
pub const DEFAULT_MAX_WORKFLOW_DEPTH: u32 = 10;
/// Default for [`Limits::labels`].
pub const DEFAULT_MAX_LABELS: usize = 32;

/// Limits on what one job may make; [`Limits::default`] gives the documented defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most items one `for_each` may expand to (server setting `--max-fan-out`).
    pub fan_out: usize,
    /// Largest task input, as compact JSON (server setting `--max-task-bytes`; the server
    /// holds task outputs to the same limit).
    pub task_bytes: usize,
    /// Most signals one job keeps that no step has taken yet (server setting
    /// `--max-pending-signals`).
    pub pending_signals: usize,
    /// How deep sub-workflows may nest: a job started by no step is at depth 0, its children
    /// at 1 (server setting `--max-workflow-depth`).
    pub workflow_depth: u32,
    /// Most labels one job carries, its workflow's and its submission's merged (server setting
    /// `--max-labels`); a workflow or schedule may not give more either.
    pub labels: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fan_out: DEFAULT_MAX_FAN_OUT,
            task_bytes: DEFAULT_MAX_TASK_BYTES,
            pending_signals: DEFAULT_MAX_PENDING_SIGNALS,
            workflow_depth: DEFAULT_MAX_WORKFLOW_DEPTH,
            labels: DEFAULT_MAX_LABELS,
        }
    }
}

/// Counts the bytes written to it and stops with an error once past `limit`, so measuring a
/// huge value costs no more than `limit` bytes of work.
struct Counter {
    count: usize,
    limit: usize,
}

impl std::io::Write for Counter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.count = self.count.saturating_add(bytes.len());
        if self.count > self.limit {
            return Err(std::io::Error::other("over the limit"));
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// True when `value`, written as compact JSON, takes more than `limit` bytes.
pub fn json_exceeds(value: &Value, limit: usize) -> bool {
    let mut counter = Counter { count: 0, limit };
    serde_json::to_writer(&mut counter, value).is_err()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn json_exceeds_compares_the_compact_encoding_with_the_limit() {
        let value = json!({"a": [1, 2]});
        let size = serde_json::to_vec(&value).unwrap().len();
        assert_eq!(size, r#"{"a":[1,2]}"#.len());
        assert!(!json_exceeds(&value, size));
        assert!(json_exceeds(&value, size - 1));
        assert!(json_exceeds(&json!("x".repeat(100)), 10));
        assert!(!json_exceeds(&Value::Null, 4));
    }
}
