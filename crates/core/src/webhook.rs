//! What a webhook subscription may ask to hear of (`WebhookEvent`), the rules for what it asks
//! (`check_events`, `check_steps`), and which entries of a job's history are task events
//! (`task_event`). Writing and sending the messages is the engine's.

use std::collections::HashSet;

use crate::definition::{Problem, check_step_id};
use crate::model::{Event, EventKind};
use crate::wire::string_enum;

string_enum!(
    /// What a webhook message reports (its `type` and `Starbridge-Event` header), and what a
    /// subscription asks for in `events`.
    WebhookEvent {
        /// A job's status changed (its creation included).
        #[serde(rename = "job.status_changed")]
        JobStatusChanged => "job.status_changed",
        /// A worker claimed a task: an attempt started.
        #[serde(rename = "task.started")]
        TaskStarted => "task.started",
        /// A task succeeded.
        #[serde(rename = "task.succeeded")]
        TaskSucceeded => "task.succeeded",
        /// A task failed for good.
        #[serde(rename = "task.failed")]
        TaskFailed => "task.failed",
        /// An attempt of a task failed and the task will be tried again.
        #[serde(rename = "task.retrying")]
        TaskRetrying => "task.retrying",
    }
);

/// What a subscription hears of when it does not say.
pub const DEFAULT_EVENTS: &[WebhookEvent] = &[WebhookEvent::JobStatusChanged];

/// Most step names a subscription may filter its task events by.
pub const MAX_WEBHOOK_STEPS: usize = 100;

impl WebhookEvent {
    /// Whether it reports a task rather than a job.
    pub fn is_task_event(self) -> bool {
        self != WebhookEvent::JobStatusChanged
    }
}

/// The task event a history entry is, if it is one: a claim that starts an attempt (not one
/// that continues a check), a success, a failed attempt that will be retried (its
/// `task_retry_scheduled`; the `task_failed` before it carries the retry time and is not
/// another event), or a failure for good.
pub fn task_event(event: &Event) -> Option<WebhookEvent> {
    match event.kind {
        EventKind::TaskClaimed if event.detail["continues_check"] != true => {
            Some(WebhookEvent::TaskStarted)
        }
        EventKind::TaskSucceeded => Some(WebhookEvent::TaskSucceeded),
        EventKind::TaskRetryScheduled => Some(WebhookEvent::TaskRetrying),
        EventKind::TaskFailed if event.detail.get("retry_at").is_none() => {
            Some(WebhookEvent::TaskFailed)
        }
        _ => None,
    }
}

/// Problems with a subscription's `events`: none at all, or one named twice (`events[i]`).
pub fn check_events(events: &[WebhookEvent]) -> Vec<Problem> {
    if events.is_empty() {
        return vec![Problem {
            field: "events".to_owned(),
            message: format!(
                "must name at least one event (or leave it out for {})",
                WebhookEvent::JobStatusChanged
            ),
        }];
    }
    duplicates(events.iter().map(|event| event.as_str()), "events")
}

/// Problems with a subscription's `steps`: more than `MAX_WEBHOOK_STEPS`, a name that is no
/// valid step id or is named twice (`steps[i]`), or any at all when `events` holds no task
/// event, since they filter only task events.
pub fn check_steps(steps: &[String], events: &[WebhookEvent]) -> Vec<Problem> {
    let mut problems = Vec::new();
    if steps.len() > MAX_WEBHOOK_STEPS {
        problems.push(Problem {
            field: "steps".to_owned(),
            message: format!(
                "names {} steps: at most {MAX_WEBHOOK_STEPS} (leave it out for every step)",
                steps.len()
            ),
        });
    }
    if !steps.is_empty() && !events.iter().any(|event| event.is_task_event()) {
        problems.push(Problem {
            field: "steps".to_owned(),
            message: "filters task events only: add a task event (task.started, task.succeeded, \
                      task.failed, task.retrying) to events, or leave steps out"
                .to_owned(),
        });
    }
    for (position, step) in steps.iter().enumerate() {
        if let Err(message) = check_step_id(step) {
            problems.push(Problem {
                field: format!("steps[{position}]"),
                message,
            });
        }
    }
    problems.extend(duplicates(steps.iter().map(String::as_str), "steps"));
    problems
}

/// A problem for each value seen before in the list (`field[i]`).
fn duplicates<'a>(values: impl Iterator<Item = &'a str>, field: &str) -> Vec<Problem> {
    let mut seen = HashSet::new();
    values
        .enumerate()
        .filter(|(_, value)| !seen.insert(*value))
        .map(|(position, value)| Problem {
            field: format!("{field}[{position}]"),
            message: format!("'{value}' is named twice: name it once"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Timestamp;
    use serde_json::{Value, json};

    fn event(kind: EventKind, detail: Value) -> Event {
        Event {
            at: Timestamp(0),
            kind,
            task: None,
            attempt: Some(1),
            worker: None,
            detail,
        }
    }

    #[test]
    fn a_claim_starts_an_attempt_unless_it_continues_a_check() {
        let claim = event(EventKind::TaskClaimed, json!({"continues_check": false}));
        assert_eq!(task_event(&claim), Some(WebhookEvent::TaskStarted));
        let check = event(EventKind::TaskClaimed, json!({"continues_check": true}));
        assert_eq!(task_event(&check), None);
    }

    #[test]
    fn a_failed_attempt_is_retrying_once_and_a_failure_for_good_is_failed() {
        let attempt = json!({"message": "m", "retry_at": 5, "attempts_left": 1});
        assert_eq!(task_event(&event(EventKind::TaskFailed, attempt)), None);
        let retry = json!({"retry_at": 5, "delay_ms": 5});
        assert_eq!(
            task_event(&event(EventKind::TaskRetryScheduled, retry)),
            Some(WebhookEvent::TaskRetrying)
        );
        let terminal = json!({"message": "m", "terminal": true});
        assert_eq!(
            task_event(&event(EventKind::TaskFailed, terminal)),
            Some(WebhookEvent::TaskFailed)
        );
        assert_eq!(
            task_event(&event(EventKind::TaskSucceeded, json!({}))),
            Some(WebhookEvent::TaskSucceeded)
        );
    }

    #[test]
    fn other_history_is_no_task_event() {
        for kind in [
            EventKind::TaskReady,
            EventKind::TaskSkipped,
            EventKind::TaskCancelled,
            EventKind::TaskCheckLater,
            EventKind::JobFailed,
        ] {
            assert_eq!(task_event(&event(kind, json!({}))), None, "{kind}");
        }
    }

    fn fields(problems: &[Problem]) -> Vec<&str> {
        problems.iter().map(|p| p.field.as_str()).collect()
    }

    #[test]
    fn events_must_be_named_once_each_and_not_be_empty() {
        assert_eq!(fields(&check_events(&[])), ["events"]);
        let twice = [
            WebhookEvent::TaskFailed,
            WebhookEvent::TaskStarted,
            WebhookEvent::TaskFailed,
        ];
        assert_eq!(fields(&check_events(&twice)), ["events[2]"]);
        assert!(check_events(DEFAULT_EVENTS).is_empty());
    }

    #[test]
    fn steps_are_step_ids_named_once_that_filter_task_events() {
        let task = [WebhookEvent::TaskFailed];
        let steps = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_steps(&steps(&["build", "deploy"]), &task).is_empty());
        assert_eq!(
            fields(&check_steps(&steps(&["build", "9x", "build"]), &task)),
            ["steps[1]", "steps[2]"]
        );
        assert_eq!(
            fields(&check_steps(&steps(&["a"]), DEFAULT_EVENTS)),
            ["steps"]
        );
        let many: Vec<String> = (0..=MAX_WEBHOOK_STEPS).map(|i| format!("s{i}")).collect();
        assert_eq!(fields(&check_steps(&many, &task)), ["steps"]);
    }
}
