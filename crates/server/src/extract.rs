//! Reading a request: JSON bodies (parsed by hand, so that a malformed body gets a problem
//! document naming the field, or the line and column, at fault), namespaces, ids, times and
//! statuses from paths and queries.

use axum::body::Bytes;
use serde::de::DeserializeOwned;
use starbridge_api as api;
use starbridge_core::definition::check_name;
use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::labels;
use starbridge_core::model::JobStatus;
use starbridge_core::wire::{Open, WireEnum};

use crate::error::{ApiError, ApiResult};

pub(crate) fn body<T: DeserializeOwned>(bytes: &Bytes) -> ApiResult<T> {
    if bytes.is_empty() {
        return Err(ApiError::invalid(
            "body",
            "expected a JSON object, got an empty body",
        ));
    }
    let parsed = serde_json::from_slice(bytes).or_else(|error| {
        // JSON does not tell 2 from 2.0; some clients send whole numbers as floats.
        if let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(bytes)
            && integral_floats_to_integers(&mut value)
            && let Ok(parsed) = serde_json::from_value(value)
        {
            return Ok(parsed);
        }
        Err(ApiError::invalid(
            "body",
            format!("{error} (line {} column {})", error.line(), error.column()),
        ))
    })?;
    match crate::json_checks::first_fault(bytes) {
        None => Ok(parsed),
        Some(fault) => Err(ApiError::validation(&fault.field, fault.message)),
    }
}

/// A JSON body whose fields are all optional: an empty body is the default.
pub(crate) fn optional_body<T: DeserializeOwned + Default>(bytes: &Bytes) -> ApiResult<T> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        Ok(T::default())
    } else {
        body(bytes)
    }
}

/// Rewrites every float with no fractional part (in the 64-bit integer range) as an integer;
/// says whether it changed anything.
fn integral_floats_to_integers(value: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::Number(number) if number.is_f64() => {
            let float = number.as_f64().unwrap_or(f64::NAN);
            let whole = float.fract() == 0.0 && float.abs() < 9.0e15;
            if whole {
                // Exact: the float is whole and well inside the range where i64 is exact.
                *value = Value::from(float as i64);
            }
            whole
        }
        Value::Array(items) => items.iter_mut().fold(false, |changed, item| {
            integral_floats_to_integers(item) | changed
        }),
        Value::Object(fields) => fields.values_mut().fold(false, |changed, field| {
            integral_floats_to_integers(field) | changed
        }),
        _ => false,
    }
}

/// An RFC 3339 time from a request field.
pub(crate) fn parse_time(field: &str, text: &str) -> ApiResult<starbridge_core::time::Timestamp> {
    text.parse::<api::Timestamp>()
        .map(|ts| starbridge_core::time::Timestamp(ts.as_millisecond()))
        .map_err(|_| {
            ApiError::invalid(
                field,
                format!("'{text}' is not an RFC 3339 time such as 2026-11-22T10:00:00Z"),
            )
        })
}

/// A value the server knows, from a request field: an unknown one (`Open::Unknown`) is refused
/// with `refusal(text)`, naming the field.
pub(crate) fn known<T: WireEnum>(
    field: &str,
    value: &Open<T>,
    refusal: impl FnOnce(&str) -> String,
) -> ApiResult<T> {
    value
        .known()
        .ok_or_else(|| ApiError::invalid(field, refusal(value.as_str())))
}

/// A job status from a request field.
pub(crate) fn parse_status(field: &str, status: &Open<JobStatus>) -> ApiResult<JobStatus> {
    known(field, status, |text| {
        let valid: Vec<&str> = JobStatus::ALL.iter().map(|s| s.as_str()).collect();
        format!("unknown status '{text}': use one of {}", valid.join(", "))
    })
}

pub(crate) fn namespace(query: &api::NamespaceQuery) -> ApiResult<String> {
    namespace_name(query.namespace.as_deref())
}

pub(crate) fn namespace_name(value: Option<&str>) -> ApiResult<String> {
    let name = value.unwrap_or(api::DEFAULT_NAMESPACE);
    check_name(name).map_err(|message| ApiError::invalid("namespace", message))?;
    Ok(name.to_owned())
}

pub(crate) fn job_id(text: &str) -> ApiResult<JobId> {
    JobId::parse(text).ok_or_else(|| ApiError::not_found(format!("job {text} not found")))
}

pub(crate) fn task_id(text: &str) -> ApiResult<TaskId> {
    TaskId::parse(text).ok_or_else(|| ApiError::not_found(format!("task {text} not found")))
}

/// The label filter of a job list: its `label` parameters, each a `key=value` selector; a
/// malformed one is a 400 naming `label`. A repeated selector counts once.
pub(crate) fn label_filter<'a>(
    selectors: impl Iterator<Item = &'a str>,
) -> ApiResult<Vec<(String, String)>> {
    let mut labels = Vec::new();
    for selector in selectors {
        let label = labels::parse_selector(selector)
            .map_err(|message| ApiError::invalid("label", message))?;
        if !labels.contains(&label) {
            labels.push(label);
        }
    }
    Ok(labels)
}

/// The label filter of a bulk action, its `labels` object: a label that breaks the rules of
/// labels is a 400 naming it (`labels.<key>`).
pub(crate) fn label_pairs(labels: &api::Labels) -> ApiResult<Vec<(String, String)>> {
    if let Some(problem) = labels::check("labels", labels).into_iter().next() {
        return Err(ApiError::invalid(&problem.field, problem.message));
    }
    Ok(labels.clone().into_iter().collect())
}
