//! The paths of the HTTP API, written once.
//!
//! Each route is a template in the router's syntax (`{id}` placeholders, as axum writes them),
//! so a route table can name the same constants; each template with placeholders has a function
//! that fills them with percent-encoded segments, for clients. The typed client (the `client`
//! module) builds every request path from here.

use crate::{BulkAction, Open};

/// `GET`: whether the server reads and writes its database ([`crate::Health`]).
pub const HEALTH: &str = "/healthz";
/// `GET`: Prometheus metrics, as text.
pub const METRICS: &str = "/metrics";
/// `GET`: the OpenAPI document of this API.
pub const OPENAPI: &str = "/api/v1/openapi.json";

/// `GET`: the latest version of each workflow.
pub const WORKFLOWS: &str = "/api/v1/workflows";
/// `PUT` (apply a definition) and `GET` one workflow.
pub const WORKFLOW: &str = "/api/v1/workflows/{name}";

/// `POST` (submit) and `GET` (list) jobs.
pub const JOBS: &str = "/api/v1/jobs";
/// `POST`: several jobs in one request.
pub const JOBS_BATCH: &str = "/api/v1/jobs/batch";
/// `POST`: an operator action on every job a filter selects (`pause`, `resume`, `cancel`,
/// `retry`, `delete`).
pub const JOBS_BULK: &str = "/api/v1/jobs/bulk/{action}";
/// `GET`: one job with its tasks; `DELETE`: a finished job.
pub const JOB: &str = "/api/v1/jobs/{id}";
/// `GET`: a job's history.
pub const JOB_EVENTS: &str = "/api/v1/jobs/{id}/events";
/// `POST`: operator actions on one job.
pub const JOB_PAUSE: &str = "/api/v1/jobs/{id}/pause";
pub const JOB_RESUME: &str = "/api/v1/jobs/{id}/resume";
pub const JOB_CANCEL: &str = "/api/v1/jobs/{id}/cancel";
pub const JOB_RETRY: &str = "/api/v1/jobs/{id}/retry";
pub const JOB_RERUN: &str = "/api/v1/jobs/{id}/rerun";
/// `POST`: mark a task of a job succeeded by hand.
pub const JOB_TASK_SKIP: &str = "/api/v1/jobs/{id}/tasks/{task}/skip";
/// `POST`: revoke a running task's lease and run it again (scope `operate`).
pub const JOB_TASK_REQUEUE: &str = "/api/v1/jobs/{id}/tasks/{task}/requeue";
/// `POST`: fail a task for good by hand (scope `operate`).
pub const JOB_TASK_FAIL: &str = "/api/v1/jobs/{id}/tasks/{task}/fail";
/// Approving an approval step (scope `operate`).
pub const JOB_TASK_APPROVE: &str = "/api/v1/jobs/{id}/tasks/{task}/approve";
/// Rejecting an approval step (scope `operate`).
pub const JOB_TASK_REJECT: &str = "/api/v1/jobs/{id}/tasks/{task}/reject";
/// Sending a signal to a job (scope `submit`).
pub const JOB_SIGNAL: &str = "/api/v1/jobs/{id}/signals/{name}";
/// Tasks waiting for approval (scope `read`).
pub const APPROVALS: &str = "/api/v1/approvals";

/// `POST`: lease ready tasks (long poll).
pub const TASKS_POLL: &str = "/api/v1/tasks/poll";
/// `POST`: several successful attempts in one request.
pub const TASKS_COMPLETE: &str = "/api/v1/tasks/complete";
/// `POST`: a worker's reports on one leased task.
pub const TASK_HEARTBEAT: &str = "/api/v1/tasks/{id}/heartbeat";
pub const TASK_COMPLETE: &str = "/api/v1/tasks/{id}/complete";
pub const TASK_FAIL: &str = "/api/v1/tasks/{id}/fail";
pub const TASK_CHECK_LATER: &str = "/api/v1/tasks/{id}/check-later";
pub const TASK_AWAIT_CALLBACK: &str = "/api/v1/tasks/{id}/await-callback";

// Calls through a callback token, which is their credential (no API token).
pub const CALLBACK_COMPLETE: &str = "/api/v1/callbacks/{token}/complete";
pub const CALLBACK_FAIL: &str = "/api/v1/callbacks/{token}/fail";
pub const CALLBACK_HEARTBEAT: &str = "/api/v1/callbacks/{token}/heartbeat";

/// `GET`: queues with their settings and depth.
pub const QUEUES: &str = "/api/v1/queues";
/// `GET` and `PUT` (change the settings of) one queue, or of a pattern (`agent-*`); `DELETE`
/// drops the pattern's settings, or the queue's own.
pub const QUEUE: &str = "/api/v1/queues/{name}";
/// `POST`: stop or start handing out a queue's tasks.
pub const QUEUE_PAUSE: &str = "/api/v1/queues/{name}/pause";
pub const QUEUE_RESUME: &str = "/api/v1/queues/{name}/resume";

/// `GET`: cron schedules.
pub const SCHEDULES: &str = "/api/v1/schedules";
/// `GET`, `PUT` (create or replace) and `DELETE` one schedule.
pub const SCHEDULE: &str = "/api/v1/schedules/{name}";
/// `POST`: stop or start firing a schedule.
pub const SCHEDULE_PAUSE: &str = "/api/v1/schedules/{name}/pause";
pub const SCHEDULE_RESUME: &str = "/api/v1/schedules/{name}/resume";

/// `GET` (list) and `POST` (create) webhook subscriptions.
pub const WEBHOOKS: &str = "/api/v1/webhooks";
/// `DELETE`: unsubscribe.
pub const WEBHOOK: &str = "/api/v1/webhooks/{id}";
/// `GET`: a subscription's recent deliveries.
pub const WEBHOOK_DELIVERIES: &str = "/api/v1/webhooks/{id}/deliveries";

/// `GET` (list) and `POST` (create) API tokens.
pub const TOKENS: &str = "/api/v1/tokens";
/// `DELETE`: revoke a token.
pub const TOKEN: &str = "/api/v1/tokens/{id}";
/// `GET`: the dashboard's per-minute figures.
pub const STATS_MINUTES: &str = "/api/v1/stats/minutes";
/// `GET`: the audit log.
pub const AUDIT: &str = "/api/v1/audit";

/// [`WORKFLOW`] of `name`.
pub fn workflow(name: &str) -> String {
    fill(WORKFLOW, &[name])
}

/// [`JOBS_BULK`] of `action`.
pub fn jobs_bulk(action: &Open<BulkAction>) -> String {
    fill(JOBS_BULK, &[action.as_str()])
}

/// [`JOB`] of `id`.
pub fn job(id: &str) -> String {
    fill(JOB, &[id])
}

/// [`JOB_EVENTS`] of `id`.
pub fn job_events(id: &str) -> String {
    fill(JOB_EVENTS, &[id])
}

/// An operator action on one job, by the route it is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobAction {
    Pause,
    Resume,
    Cancel,
    Retry,
    Rerun,
}

impl JobAction {
    /// The action's route template.
    pub const fn template(self) -> &'static str {
        match self {
            JobAction::Pause => JOB_PAUSE,
            JobAction::Resume => JOB_RESUME,
            JobAction::Cancel => JOB_CANCEL,
            JobAction::Retry => JOB_RETRY,
            JobAction::Rerun => JOB_RERUN,
        }
    }
}

/// The route of `action` on job `id`.
pub fn job_action(id: &str, action: JobAction) -> String {
    fill(action.template(), &[id])
}

/// [`JOB_TASK_SKIP`] of task `task` of job `id`.
pub fn job_task_skip(id: &str, task: &str) -> String {
    fill(JOB_TASK_SKIP, &[id, task])
}

/// [`JOB_TASK_REQUEUE`] of task `task` of job `id`.
pub fn job_task_requeue(id: &str, task: &str) -> String {
    fill(JOB_TASK_REQUEUE, &[id, task])
}

/// [`JOB_TASK_FAIL`] of task `task` of job `id`.
pub fn job_task_fail(id: &str, task: &str) -> String {
    fill(JOB_TASK_FAIL, &[id, task])
}

/// [`JOB_TASK_APPROVE`] (`approve`) or [`JOB_TASK_REJECT`] of task `task` of job `id`.
pub fn job_task_decision(id: &str, task: &str, approve: bool) -> String {
    let template = if approve {
        JOB_TASK_APPROVE
    } else {
        JOB_TASK_REJECT
    };
    fill(template, &[id, task])
}

/// [`JOB_SIGNAL`] of signal `name` to job `id`.
pub fn job_signal(id: &str, name: &str) -> String {
    fill(JOB_SIGNAL, &[id, name])
}

/// A worker's report on one leased task, by the route it is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskReport {
    Heartbeat,
    Complete,
    Fail,
    CheckLater,
    AwaitCallback,
}

impl TaskReport {
    /// The report's route template.
    pub const fn template(self) -> &'static str {
        match self {
            TaskReport::Heartbeat => TASK_HEARTBEAT,
            TaskReport::Complete => TASK_COMPLETE,
            TaskReport::Fail => TASK_FAIL,
            TaskReport::CheckLater => TASK_CHECK_LATER,
            TaskReport::AwaitCallback => TASK_AWAIT_CALLBACK,
        }
    }
}

/// The route of `report` on task `id`.
pub fn task_report(id: &str, report: TaskReport) -> String {
    fill(report.template(), &[id])
}

/// A call through a callback token, by the route it is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallbackRoute {
    Complete,
    Fail,
    Heartbeat,
}

impl CallbackRoute {
    /// The call's route template.
    pub const fn template(self) -> &'static str {
        match self {
            CallbackRoute::Complete => CALLBACK_COMPLETE,
            CallbackRoute::Fail => CALLBACK_FAIL,
            CallbackRoute::Heartbeat => CALLBACK_HEARTBEAT,
        }
    }
}

/// The route of `call` through callback token `token`.
pub fn callback(token: &str, call: CallbackRoute) -> String {
    fill(call.template(), &[token])
}

/// [`QUEUE`] of `name`.
pub fn queue(name: &str) -> String {
    fill(QUEUE, &[name])
}

/// [`QUEUE_PAUSE`] (`pause`) or [`QUEUE_RESUME`] of `name`.
pub fn queue_pausing(name: &str, pause: bool) -> String {
    fill(if pause { QUEUE_PAUSE } else { QUEUE_RESUME }, &[name])
}

/// [`SCHEDULE`] of `name`.
pub fn schedule(name: &str) -> String {
    fill(SCHEDULE, &[name])
}

/// [`SCHEDULE_PAUSE`] (`pause`) or [`SCHEDULE_RESUME`] of `name`.
pub fn schedule_pausing(name: &str, pause: bool) -> String {
    fill(
        if pause {
            SCHEDULE_PAUSE
        } else {
            SCHEDULE_RESUME
        },
        &[name],
    )
}

/// [`WEBHOOK`] of `id`.
pub fn webhook(id: &str) -> String {
    fill(WEBHOOK, &[id])
}

/// [`WEBHOOK_DELIVERIES`] of `id`.
pub fn webhook_deliveries(id: &str) -> String {
    fill(WEBHOOK_DELIVERIES, &[id])
}

/// [`TOKEN`] of `id`.
pub fn token(id: &str) -> String {
    fill(TOKEN, &[id])
}

/// `template` with its `{…}` placeholders replaced, in order, by `segments`, each
/// percent-encoded as one path segment.
fn fill(template: &str, segments: &[&str]) -> String {
    let mut path = String::with_capacity(template.len() + 32);
    let mut segments = segments.iter();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        path.push_str(&rest[..open]);
        let close = open + rest[open..].find('}').expect("a placeholder is closed");
        let segment = segments.next().expect("a segment for every placeholder");
        path.push_str(&encode_path_segment(segment));
        rest = &rest[close + 1..];
    }
    debug_assert!(segments.next().is_none(), "more segments than placeholders");
    path.push_str(rest);
    path
}

/// Percent-encodes everything but RFC 3986 unreserved characters, for use as one path segment.
pub fn encode_path_segment(segment: &str) -> String {
    let mut encoded = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_filled_with_encoded_segments_in_order() {
        assert_eq!(job("job_01AB"), "/api/v1/jobs/job_01AB");
        assert_eq!(job_events("job_1"), "/api/v1/jobs/job_1/events");
        assert_eq!(
            job_task_skip("job_1", "tsk_2"),
            "/api/v1/jobs/job_1/tasks/tsk_2/skip"
        );
        assert_eq!(
            job_task_requeue("job_1", "tsk_2"),
            "/api/v1/jobs/job_1/tasks/tsk_2/requeue"
        );
        assert_eq!(
            job_task_fail("job_1", "tsk_2"),
            "/api/v1/jobs/job_1/tasks/tsk_2/fail"
        );
        assert_eq!(workflow("a/b c"), "/api/v1/workflows/a%2Fb%20c");
        assert_eq!(
            jobs_bulk(&BulkAction::Retry.into()),
            "/api/v1/jobs/bulk/retry"
        );
        assert_eq!(queue("q"), "/api/v1/queues/q");
        assert_eq!(schedule("nightly"), "/api/v1/schedules/nightly");
        assert_eq!(webhook("whk_1"), "/api/v1/webhooks/whk_1");
        assert_eq!(
            webhook_deliveries("whk_1"),
            "/api/v1/webhooks/whk_1/deliveries"
        );
        assert_eq!(token("tok_1"), "/api/v1/tokens/tok_1");
        assert_eq!(
            job_task_decision("job_1", "tsk_2", false),
            "/api/v1/jobs/job_1/tasks/tsk_2/reject"
        );
        assert_eq!(
            job_signal("job_1", "paid"),
            "/api/v1/jobs/job_1/signals/paid"
        );
        assert_eq!(
            callback("sbc_x", CallbackRoute::Heartbeat),
            "/api/v1/callbacks/sbc_x/heartbeat"
        );
    }

    #[test]
    fn actions_and_reports_name_their_routes() {
        let actions = [
            (JobAction::Pause, "pause"),
            (JobAction::Resume, "resume"),
            (JobAction::Cancel, "cancel"),
            (JobAction::Retry, "retry"),
            (JobAction::Rerun, "rerun"),
        ];
        for (action, name) in actions {
            assert_eq!(job_action("j", action), format!("/api/v1/jobs/j/{name}"));
        }
        let reports = [
            (TaskReport::Heartbeat, "heartbeat"),
            (TaskReport::Complete, "complete"),
            (TaskReport::Fail, "fail"),
            (TaskReport::CheckLater, "check-later"),
            (TaskReport::AwaitCallback, "await-callback"),
        ];
        for (report, name) in reports {
            assert_eq!(task_report("t", report), format!("/api/v1/tasks/t/{name}"));
        }
        assert_eq!(queue_pausing("q", true), "/api/v1/queues/q/pause");
        assert_eq!(queue_pausing("q", false), "/api/v1/queues/q/resume");
        assert_eq!(schedule_pausing("s", true), "/api/v1/schedules/s/pause");
        assert_eq!(schedule_pausing("s", false), "/api/v1/schedules/s/resume");
    }

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode_path_segment("tsk_01AB-c.d~"), "tsk_01AB-c.d~");
        assert_eq!(encode_path_segment("a/b c"), "a%2Fb%20c");
        assert_eq!(encode_path_segment("{id}"), "%7Bid%7D");
    }
}
