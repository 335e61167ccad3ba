//! Hard limits on what a request may carry and a job may make. Each is a server setting with a
//! default; a request over one is refused with a problem document that names the limit, its
//! value and the setting that changes it: `413` when the whole body is too large, `422` when a
//! part of it is.

use axum::http::StatusCode;
use serde_json::Value;
use starbridge_api::ProblemLimit;
use starbridge_core::limits::json_exceeds;

use crate::error::{ApiError, ApiResult};

/// Default for [`Limits::body_bytes`]: 4 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;
/// Default for [`Limits::definition_bytes`]: 1 MiB.
pub const DEFAULT_MAX_DEFINITION_BYTES: usize = 1 << 20;
/// Default for [`Limits::params_bytes`]: 64 KiB.
pub const DEFAULT_MAX_PARAMS_BYTES: usize = 64 << 10;
/// Longest job key the engine accepts, and the default of [`Limits::key_bytes`]; longest name
/// the core accepts, and the default of [`Limits::name_bytes`].
pub use starbridge_core::limits::{MAX_KEY_BYTES, MAX_NAME_BYTES};
/// Default for [`Limits::page_size`].
pub const DEFAULT_MAX_PAGE_SIZE: u32 = 1000;

/// One limit: how problems, logs and the documentation name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Body,
    Definition,
    Steps,
    FanOut,
    Task,
    Params,
    Key,
    Name,
    Page,
    PendingSignals,
    WorkflowDepth,
    Labels,
}

impl Limit {
    pub const ALL: [Limit; 12] = [
        Limit::Body,
        Limit::Definition,
        Limit::Steps,
        Limit::FanOut,
        Limit::Task,
        Limit::Params,
        Limit::Key,
        Limit::Name,
        Limit::Page,
        Limit::PendingSignals,
        Limit::WorkflowDepth,
        Limit::Labels,
    ];

    /// The setting's name without dashes, as in problem documents: `max_body_bytes`.
    pub fn name(self) -> &'static str {
        match self {
            Limit::Body => "max_body_bytes",
            Limit::Definition => "max_definition_bytes",
            Limit::Steps => "max_steps",
            Limit::FanOut => "max_fan_out",
            Limit::Task => "max_task_bytes",
            Limit::Params => "max_params_bytes",
            Limit::Key => "max_key_bytes",
            Limit::Name => "max_name_bytes",
            Limit::Page => "max_page_size",
            Limit::PendingSignals => "max_pending_signals",
            Limit::WorkflowDepth => "max_workflow_depth",
            Limit::Labels => "max_labels",
        }
    }

    /// The `starbridge server` flag: `--max-body-bytes`.
    pub fn flag(self) -> String {
        format!("--{}", self.name().replace('_', "-"))
    }

    /// The environment variable: `STARBRIDGE_MAX_BODY_BYTES`.
    pub fn env(self) -> String {
        format!("STARBRIDGE_{}", self.name().to_uppercase())
    }
}

/// The limits in force. [`Limits::default`] gives the documented defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest request body.
    pub body_bytes: usize,
    /// Largest workflow definition, as sent and once parsed (YAML aliases can expand).
    pub definition_bytes: usize,
    /// Most steps in one workflow (at most the core's `MAX_STEPS`).
    pub steps: usize,
    /// Largest job params, as compact JSON.
    pub params_bytes: usize,
    /// Longest job key (at most [`MAX_KEY_BYTES`]).
    pub key_bytes: usize,
    /// Longest workflow, queue, schedule or worker name (at most [`MAX_NAME_BYTES`]).
    pub name_bytes: usize,
    /// Largest `limit` of a list request.
    pub page_size: u32,
    /// What the engine enforces while jobs run: fan-out width, task size (inputs are checked by
    /// the engine; outputs, progress and error messages by the server), signals kept per job and
    /// labels per job (a request's own labels are checked by the server, merged ones by the
    /// engine).
    pub run: starbridge_core::limits::Limits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body_bytes: DEFAULT_MAX_BODY_BYTES,
            definition_bytes: DEFAULT_MAX_DEFINITION_BYTES,
            steps: starbridge_core::definition::MAX_STEPS,
            params_bytes: DEFAULT_MAX_PARAMS_BYTES,
            key_bytes: MAX_KEY_BYTES,
            name_bytes: MAX_NAME_BYTES,
            page_size: DEFAULT_MAX_PAGE_SIZE,
            run: starbridge_core::limits::Limits::default(),
        }
    }
}

/// A limit setting outside what the server can honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting} must be between 1 and {max}, got {value}")]
pub struct InvalidLimit {
    pub setting: String,
    pub value: u64,
    pub max: u64,
}

impl Limits {
    /// Checks each setting against the range the server can honour.
    pub fn validate(&self) -> Result<(), InvalidLimit> {
        for limit in Limit::ALL {
            let max = match limit {
                Limit::Steps => starbridge_core::definition::MAX_STEPS as u64,
                Limit::Key => MAX_KEY_BYTES as u64,
                Limit::Name => MAX_NAME_BYTES as u64,
                _ => u64::from(u32::MAX),
            };
            let value = self.value(limit);
            if value == 0 || value > max {
                return Err(InvalidLimit {
                    setting: limit.flag(),
                    value,
                    max,
                });
            }
        }
        Ok(())
    }

    /// The value of `limit` in force.
    pub fn value(&self, limit: Limit) -> u64 {
        let value = match limit {
            Limit::Body => self.body_bytes,
            Limit::Definition => self.definition_bytes,
            Limit::Steps => self.steps,
            Limit::FanOut => self.run.fan_out,
            Limit::Task => self.run.task_bytes,
            Limit::Params => self.params_bytes,
            Limit::Key => self.key_bytes,
            Limit::Name => self.name_bytes,
            Limit::Page => self.page_size as usize,
            Limit::PendingSignals => self.run.pending_signals,
            Limit::WorkflowDepth => self.run.workflow_depth as usize,
            Limit::Labels => self.run.labels,
        };
        value as u64
    }

    /// Refuses `value` when its compact JSON is larger than `limit` (a byte limit).
    pub(crate) fn json(&self, limit: Limit, field: &str, value: &Value) -> ApiResult<()> {
        let max = self.value(limit);
        if json_exceeds(value, usize::try_from(max).unwrap_or(usize::MAX)) {
            return Err(exceeded(
                StatusCode::UNPROCESSABLE_ENTITY,
                limit,
                max,
                field,
                format!("larger than the limit of {max} bytes"),
            ));
        }
        Ok(())
    }

    /// Refuses text longer than `limit` (a byte limit).
    pub(crate) fn text(&self, limit: Limit, field: &str, text: &str) -> ApiResult<()> {
        let max = self.value(limit);
        if text.len() as u64 > max {
            return Err(exceeded(
                StatusCode::UNPROCESSABLE_ENTITY,
                limit,
                max,
                field,
                format!(
                    "{} bytes is longer than the limit of {max} bytes",
                    text.len()
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a count above `limit`.
    pub(crate) fn count(&self, limit: Limit, field: &str, count: u64, what: &str) -> ApiResult<()> {
        let max = self.value(limit);
        if count > max {
            return Err(exceeded(
                StatusCode::UNPROCESSABLE_ENTITY,
                limit,
                max,
                field,
                format!("{count} {what} is more than the limit of {max}"),
            ));
        }
        Ok(())
    }

    /// Checks a parsed definition: its size (aliases may have expanded it), step count and label
    /// count.
    pub(crate) fn definition(&self, field: &str, document: &Value) -> ApiResult<()> {
        self.json(Limit::Definition, field, document)?;
        if let Some(steps) = document.get("steps").and_then(Value::as_array) {
            self.count(
                Limit::Steps,
                &format!("{field}.steps"),
                steps.len() as u64,
                "steps",
            )?;
        }
        if let Some(labels) = document.get("labels").and_then(Value::as_object) {
            self.labels(&format!("{field}.labels"), labels.len())?;
        }
        Ok(())
    }

    /// Refuses more labels than `--max-labels` (a submission's or a schedule's own; the engine
    /// holds the merged labels to the same limit).
    pub(crate) fn labels(&self, field: &str, count: usize) -> ApiResult<()> {
        self.count(Limit::Labels, field, count as u64, "labels")
    }

    /// A whole request body is too large: `413`.
    pub(crate) fn body_too_large(&self, limit: Limit, field: &str) -> ApiError {
        let max = self.value(limit);
        exceeded(
            StatusCode::PAYLOAD_TOO_LARGE,
            limit,
            max,
            field,
            format!("larger than the limit of {max} bytes"),
        )
    }
}

fn exceeded(status: StatusCode, limit: Limit, max: u64, field: &str, message: String) -> ApiError {
    let message = format!(
        "{message} ({}: set {} or {})",
        limit.name(),
        limit.flag(),
        limit.env()
    );
    ApiError::limit(
        status,
        field,
        message,
        ProblemLimit {
            name: limit.name().to_owned(),
            value: max,
            flag: limit.flag(),
            env: limit.env(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_named_consistently() {
        assert_eq!(Limit::Task.name(), "max_task_bytes");
        assert_eq!(Limit::Task.flag(), "--max-task-bytes");
        assert_eq!(Limit::Task.env(), "STARBRIDGE_MAX_TASK_BYTES");
    }

    #[test]
    fn defaults_are_valid_and_out_of_range_settings_are_refused() {
        assert_eq!(Limits::default().validate(), Ok(()));
        let zero = Limits {
            page_size: 0,
            ..Limits::default()
        };
        assert_eq!(
            zero.validate().unwrap_err().to_string(),
            "--max-page-size must be between 1 and 4294967295, got 0"
        );
        let long_names = Limits {
            name_bytes: MAX_NAME_BYTES + 1,
            ..Limits::default()
        };
        assert_eq!(
            long_names.validate().unwrap_err().setting,
            "--max-name-bytes"
        );
    }
}
