//! The HTML of each page, from data the handlers in `mod.rs` read. Pure: no I/O, the current
//! time is passed in. Sections marked `data-live` are replaced in place by the page's script when
//! the page changes (on a server-sent event or a periodic refresh), so they carry stable ids.

use std::fmt::Write as _;

use serde_json::Value;
use starbridge_api::{self as api, JobView, QueueView, ScheduleView, TaskView};
use starbridge_core::definition::Workflow;
use starbridge_core::model::{JobStatus, TaskKind, TaskStatus};
use starbridge_core::time::Timestamp;
use starbridge_engine::{JobLine, StatusCount, StoredWorkflow, WorkerLoad};

use super::diff::{Line, diff};
use super::graph::{self, Graph};
use super::html::{Esc, duration, esc, json, time, url};

/// The namespace a page shows; links keep it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ns(pub(crate) String);

impl Ns {
    fn is_default(&self) -> bool {
        self.0 == api::DEFAULT_NAMESPACE
    }

    /// A link to `path` with these query pairs (empty values left out) and the namespace.
    pub(crate) fn href(&self, path: &str, query: &[(&str, &str)]) -> String {
        let mut pairs: Vec<String> = query
            .iter()
            .filter(|(_, value)| !value.is_empty())
            .map(|(key, value)| format!("{key}={}", url(value)))
            .collect();
        if !self.is_default() {
            pairs.push(format!("namespace={}", url(&self.0)));
        }
        if pairs.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{}", pairs.join("&"))
        }
    }
}

/// Which part of the navigation is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Section {
    Dashboard,
    Jobs,
    Workflows,
    Queues,
    Schedules,
    Approvals,
}

/// What makes a page refresh itself: nothing, a periodic re-read, or a server-sent event stream.
pub(crate) enum Live {
    Static,
    Every(u32),
    Stream(String),
}

/// The page around `body`.
pub(crate) fn page(title: &str, section: Section, ns: &Ns, live: Live, body: &str) -> String {
    let mut nav = String::new();
    for (item, label, path) in [
        (Section::Dashboard, "Dashboard", "/ui/dashboard"),
        (Section::Jobs, "Jobs", "/"),
        (Section::Workflows, "Workflows", "/ui/workflows"),
        (Section::Queues, "Queues and workers", "/ui/queues"),
        (Section::Schedules, "Schedules", "/ui/schedules"),
        (Section::Approvals, "Approvals", "/ui/approvals"),
    ] {
        let current = if item == section {
            r#" aria-current="page""#
        } else {
            ""
        };
        let _ = write!(
            nav,
            r#"<a href="{}"{current}>{label}</a>"#,
            Esc(&ns.href(path, &[]))
        );
    }
    let live = match live {
        Live::Static => String::new(),
        Live::Every(millis) => format!(r#" data-refresh="{millis}""#),
        Live::Stream(path) => format!(r#" data-stream="{}""#, Esc(&path)),
    };
    let namespace = if ns.is_default() {
        String::new()
    } else {
        format!(r#"<span class="ns">namespace {}</span>"#, Esc(&ns.0))
    };
    format!(
        r##"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · Starbridge</title><link rel="stylesheet" href="/ui/assets/app.css"></head>
<body data-namespace="{ns_attr}"><a class="skip" href="#main">Skip to content</a>
<header><a class="brand" href="{home}">Starbridge</a><nav aria-label="Main">{nav}</nav>{namespace}</header>
<main id="main"{live}>{body}</main>
<div id="toast" role="status" aria-live="polite"></div>
{dialog}
<script src="/ui/assets/app.js"></script></body></html>"##,
        title = Esc(title),
        ns_attr = if ns.is_default() { "" } else { &ns.0 },
        home = Esc(&ns.href("/", &[])),
        dialog = DIALOG,
    )
}

/// The confirmation dialog of operator actions; the script shows the fields an action needs.
const DIALOG: &str = r#"<dialog id="act" aria-labelledby="act-title"><form method="dialog">
<h2 id="act-title">Confirm</h2><p id="act-text"></p>
<div class="field" data-field="step"><label for="act-step">Step to run again (with everything after it)</label><select id="act-step" name="step"></select></div>
<div class="field" data-field="step-name"><label for="act-step-name">Step (its id in the workflow)</label><input id="act-step-name" name="step-name" type="text" maxlength="128"></div>
<div class="field" data-field="error"><label for="act-message">Error message (the task's error)</label><input id="act-message" name="error" type="text" maxlength="4096"></div>
<div class="field" data-field="output"><label for="act-output">Output of the skipped task (JSON)</label><textarea id="act-output" name="output" rows="6" spellcheck="false">{}</textarea></div>
<div class="field" data-field="compensate"><label><input type="checkbox" id="act-compensate" name="compensate"> Undo finished steps first (compensate)</label></div>
<div class="field" data-field="comment"><label for="act-comment">Comment (recorded in the history)</label><input id="act-comment" name="comment" type="text" maxlength="4096"></div>
<div class="field" data-field="reason"><label for="act-reason">Reason (recorded in the history)</label><input id="act-reason" name="reason" type="text" maxlength="1024"></div>
<p id="act-error" class="error" role="alert"></p>
<div class="buttons"><button type="button" id="act-cancel">Back</button><button type="submit" id="act-ok" class="primary">Confirm</button></div>
</form></dialog>"#;

fn badge(status: &str) -> String {
    format!(
        r#"<span class="badge s-{}">{}</span>"#,
        Esc(status),
        Esc(&status.replace('_', " "))
    )
}

/// The jobs list filter as given in the query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct JobsQuery {
    pub(crate) status: String,
    pub(crate) workflow: String,
    pub(crate) range: String,
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) q: String,
    /// Label selectors, `key=value`, separated by commas.
    pub(crate) label: String,
    pub(crate) cursor: String,
}

impl JobsQuery {
    fn pairs(&self) -> Vec<(&str, &str)> {
        vec![
            ("status", self.status.as_str()),
            ("workflow", &self.workflow),
            ("range", &self.range),
            ("from", &self.from),
            ("to", &self.to),
            ("q", &self.q),
            ("label", &self.label),
        ]
    }
}

/// Choices of the time range filter: query value and label.
pub(crate) const RANGES: [(&str, &str); 5] = [
    ("", "any time"),
    ("1h", "last hour"),
    ("24h", "last 24 hours"),
    ("7d", "last 7 days"),
    ("30d", "last 30 days"),
];

pub(crate) struct JobsPage<'a> {
    pub(crate) query: &'a JobsQuery,
    pub(crate) problem: Option<String>,
    pub(crate) workflows: &'a [String],
    pub(crate) counts: &'a [StatusCount],
    pub(crate) jobs: &'a [JobLine],
    pub(crate) next_cursor: Option<String>,
    /// The bulk API's filter for the jobs this search shows (JSON), or `None` when the API
    /// cannot select them (see `bulk_bar`).
    pub(crate) bulk_filter: Option<String>,
    pub(crate) now: Timestamp,
}

/// The bulk actions of the job list: a choice of the jobs (the rows selected, or all the filter
/// matches up to what one action takes) and of the action. The script counts the jobs with a dry
/// run and asks to confirm in the dialog, then shows what the action did in `bulk-result`.
fn bulk_bar(filter: Option<&str>) -> String {
    let (disabled, filter) = match filter {
        Some(filter) => ("", filter),
        None => (" disabled", ""),
    };
    let mut actions = String::new();
    for (value, label) in [
        ("pause", "Pause"),
        ("resume", "Resume"),
        ("cancel", "Cancel"),
        ("retry", "Retry failed steps"),
        ("rerun", "Rerun from a step"),
        ("skip", "Skip a step with output"),
        ("delete", "Delete (finished jobs)"),
    ] {
        let _ = write!(actions, r#"<option value="{value}">{label}</option>"#);
    }
    let hint = if disabled.is_empty() {
        String::new()
    } else {
        r#"<span class="muted">A search by id or key (or two values of one label) cannot be acted on as a whole: select rows.</span>"#.to_owned()
    };
    format!(
        r#"<section id="bulk" class="actions bulk" aria-label="Act on several jobs" data-filter="{filter}" data-max="{max}">
<div class="field"><label for="bulk-scope">Jobs</label><select id="bulk-scope"><option value="selected">the selected rows</option><option value="filter"{disabled}>all matching the filter (at most {max_text})</option></select></div>
<div class="field"><label for="bulk-action">Action</label><select id="bulk-action">{actions}</select></div>
<button type="button" id="bulk-go">Act…</button> <span id="bulk-count" class="muted">0 selected</span>{hint}
<div id="bulk-result" role="status" aria-live="polite"></div></section>"#,
        filter = Esc(filter),
        max = crate::operate::MAX_BULK,
        max_text = grouped(u64::from(crate::operate::MAX_BULK)),
    )
}

fn select(id: &str, name: &str, options: &[(&str, &str)], current: &str) -> String {
    let mut out = format!(r#"<select id="{id}" name="{name}">"#);
    for (value, label) in options {
        let selected = if *value == current { " selected" } else { "" };
        let _ = write!(
            out,
            r#"<option value="{}"{selected}>{}</option>"#,
            Esc(value),
            Esc(label)
        );
    }
    out.push_str("</select>");
    out
}

/// A number with thousands separated: `1,234,567`.
fn grouped(number: u64) -> String {
    let digits = number.to_string();
    let groups: Vec<&str> = digits
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|group| std::str::from_utf8(group).unwrap_or_default())
        .collect();
    groups.join(",")
}

/// A count in bold; a capped one says it is a lower bound.
fn count_text(count: u64, more: bool) -> String {
    if more {
        format!(
            r#"<b title="more than {n}: narrow the filter for an exact count">{n}+</b>"#,
            n = grouped(count)
        )
    } else {
        format!("<b>{}</b>", grouped(count))
    }
}

pub(crate) fn jobs(ns: &Ns, data: &JobsPage<'_>) -> String {
    let query = data.query;
    let mut body = String::from(r#"<h1>Jobs</h1><form class="filters" method="get" action="/">"#);
    if !ns.is_default() {
        let _ = write!(
            body,
            r#"<input type="hidden" name="namespace" value="{}">"#,
            Esc(&ns.0)
        );
    }
    let mut statuses: Vec<(&str, &str)> = vec![("", "any status")];
    statuses.extend(JobStatus::ALL.iter().map(|s| (s.as_str(), s.as_str())));
    let mut workflows: Vec<(&str, &str)> = vec![("", "any workflow")];
    workflows.extend(data.workflows.iter().map(|w| (w.as_str(), w.as_str())));
    let _ = write!(
        body,
        r#"<div class="field"><label for="f-q">Search id or key (prefix)</label><input id="f-q" name="q" type="search" value="{q}" placeholder="job_… or key"></div>
<div class="field"><label for="f-label">Labels</label><input id="f-label" name="label" type="search" value="{label}" placeholder="team=storage, env=prod"></div>
<div class="field"><label for="f-status">Status</label>{status}</div>
<div class="field"><label for="f-workflow">Workflow</label>{workflow}</div>
<div class="field"><label for="f-range">Created</label>{range}</div>
<div class="field"><label for="f-from">From (UTC)</label><input id="f-from" name="from" type="datetime-local" value="{from}"></div>
<div class="field"><label for="f-to">Until (UTC)</label><input id="f-to" name="to" type="datetime-local" value="{to}"></div>
<div class="buttons"><button type="submit" class="primary">Filter</button><a href="{clear}">Clear</a></div></form>"#,
        q = Esc(&query.q),
        label = Esc(&query.label),
        status = select("f-status", "status", &statuses, &query.status),
        workflow = select("f-workflow", "workflow", &workflows, &query.workflow),
        range = select("f-range", "range", &RANGES, &query.range),
        from = Esc(&query.from),
        to = Esc(&query.to),
        clear = Esc(&ns.href("/", &[])),
    );
    if let Some(problem) = &data.problem {
        let _ = write!(
            body,
            r#"<p class="error" role="alert">{}</p>"#,
            Esc(problem)
        );
    }
    // Counts per status, each a link that sets the status filter.
    let total: u64 = data.counts.iter().map(|c| c.count).sum();
    let more = data.counts.iter().any(|c| c.more);
    body.push_str(r#"<nav id="counts" class="counts" aria-label="Jobs per status" data-live>"#);
    let mut pairs = query.pairs();
    pairs[0].1 = "";
    let current = if query.status.is_empty() {
        r#" aria-current="true""#
    } else {
        ""
    };
    let _ = write!(
        body,
        r#"<a href="{}"{current}>all {}</a>"#,
        Esc(&ns.href("/", &pairs)),
        count_text(total, more),
    );
    for count in data.counts {
        let status = &count.status;
        pairs[0].1 = status.as_str();
        let current = if query.status == status.as_str() {
            r#" aria-current="true""#
        } else {
            ""
        };
        let _ = write!(
            body,
            r#"<a class="s-{s}" href="{href}"{current} data-status="{s}">{label} {count}</a>"#,
            count = count_text(count.count, count.more),
            s = status.as_str(),
            label = status.as_str().replace('_', " "),
            href = Esc(&ns.href("/", &pairs)),
        );
    }
    body.push_str("</nav>");
    body.push_str(&bulk_bar(data.bulk_filter.as_deref()));
    body.push_str(
        r#"<table class="list"><caption class="sr">Jobs, newest first</caption><thead><tr><th scope="col"><input type="checkbox" id="select-page" aria-label="Select every job on this page"></th><th scope="col">Job</th><th scope="col">Workflow</th><th scope="col">Status</th><th scope="col">Key</th><th scope="col">Created (UTC)</th><th scope="col">Duration</th></tr></thead><tbody id="jobs" data-live>"#,
    );
    for job in data.jobs {
        let ran = match (job.started_at, job.ended_at) {
            (Some(start), Some(end)) => duration(end.0 - start.0),
            (Some(start), None) => format!("{} so far", duration(data.now.0 - start.0)),
            _ => "—".to_owned(),
        };
        let _ = write!(
            body,
            r#"<tr><td><input type="checkbox" class="pick" id="pick-{id}" value="{id}" aria-label="Select {id}"></td><td><a class="mono" href="{href}">{id}</a></td><td>{workflow} <span class="muted">v{version}</span></td><td>{status}</td><td class="mono">{key}</td><td>{created}</td><td>{ran}</td></tr>"#,
            href = Esc(&ns.href(&format!("/ui/jobs/{}", job.id), &[])),
            id = Esc(job.id.as_str()),
            workflow = Esc(&job.workflow),
            version = job.version,
            status = badge(job.status.as_str()),
            key = Esc(job.key.as_deref().unwrap_or("")),
            created = time(job.created_at),
        );
    }
    if data.jobs.is_empty() {
        body.push_str(r#"<tr><td colspan="7" class="empty">No job matches.</td></tr>"#);
    }
    body.push_str(r#"</tbody></table><nav class="pager" aria-label="Pages">"#);
    if !query.cursor.is_empty() {
        let _ = write!(
            body,
            r#"<a href="{}">« Newest</a>"#,
            Esc(&ns.href("/", &query.pairs()))
        );
    }
    if let Some(cursor) = &data.next_cursor {
        let mut pairs = query.pairs();
        pairs.push(("cursor", cursor));
        let _ = write!(
            body,
            r#"<a id="next-page" href="{}">Older »</a>"#,
            Esc(&ns.href("/", &pairs))
        );
    }
    body.push_str("</nav>");
    body
}

/// Everything the job page shows.
pub(crate) struct JobPage<'a> {
    pub(crate) view: &'a JobView,
    pub(crate) workflow: Option<&'a Workflow>,
    pub(crate) events: &'a [api::EventView],
    pub(crate) now: Timestamp,
}

fn millis(ts: &api::Timestamp) -> i64 {
    ts.as_millisecond()
}

fn opt(ts: &Option<api::Timestamp>) -> String {
    ts.as_ref()
        .map(|t| time(Timestamp(millis(t))))
        .unwrap_or_else(|| "—".to_owned())
}

pub(crate) fn job_graph(data: &JobPage<'_>) -> Graph {
    graph::job_graph(
        data.workflow,
        &data.view.tasks,
        &format!("{} {}", data.view.summary.workflow, data.view.summary.id),
    )
}

/// The operator actions that apply to a job in this status (the API has the last word).
fn actions(ns: &Ns, view: &JobView) -> String {
    let summary = &view.summary;
    let Some(status) = summary.status.known() else {
        return String::new();
    };
    let base = format!("/api/v1/jobs/{}", url(&summary.id));
    let mut out = String::from(r#"<div id="actions" class="actions" data-live>"#);
    let button = |out: &mut String, name: &str, label: &str, extra: &str| {
        let _ = write!(
            out,
            r#"<button type="button" id="act-{name}" data-url="{url}" data-done="{label}: done"{extra}>{label}</button>"#,
            url = Esc(&format!("{base}/{name}")),
        );
    };
    // Which action applies to which status is the core's rule (`JobStatus::can_…`).
    if status.can_pause() {
        button(&mut out, "pause", "Pause", "");
    }
    if status.can_resume() {
        button(&mut out, "resume", "Resume", "");
    }
    if status.can_retry() {
        button(&mut out, "retry", "Retry failed steps", "");
    }
    if status.can_rerun() {
        let steps: Vec<&str> = {
            let mut seen: Vec<&str> = Vec::new();
            for task in &view.tasks {
                if task.kind != TaskKind::Compensation && !seen.contains(&task.step.as_str()) {
                    seen.push(&task.step);
                }
            }
            seen
        };
        button(
            &mut out,
            "rerun",
            "Rerun from a step…",
            &format!(
                r#" data-confirm="Run the chosen step and every step after it again." data-fields="step reason" data-steps="{}""#,
                Esc(&steps.join(" "))
            ),
        );
    }
    if status.can_cancel() {
        button(
            &mut out,
            "cancel",
            "Cancel…",
            r#" class="danger" data-confirm="Cancel this job: waiting and ready tasks are cancelled, running tasks finish." data-fields="compensate reason""#,
        );
    }
    if status.is_terminal() {
        // The job's own URL, deleted; the page goes to the job list afterwards.
        let _ = write!(
            out,
            r#"<button type="button" id="act-delete" class="danger" data-url="{url}" data-method="DELETE" data-then="{list}" data-confirm="Delete this job with its tasks and history; this cannot be undone." data-fields="reason">Delete…</button>"#,
            url = Esc(&base),
            list = Esc(&ns.href("/", &[])),
        );
    }
    let _ = write!(
        out,
        r#"<span class="downloads">Graph: <a href="{dot}" download="{id}.dot">DOT</a> <a href="{svg}" download="{id}.svg">SVG</a></span></div>"#,
        dot = Esc(&ns.href(&format!("/ui/jobs/{}/graph.dot", summary.id), &[])),
        svg = Esc(&ns.href(&format!("/ui/jobs/{}/graph.svg", summary.id), &[])),
        id = Esc(&summary.id),
    );
    out
}

/// A Gantt chart of every attempt of every task, on one time axis.
pub(crate) fn timeline(tasks: &[TaskView], start: i64, now: i64) -> String {
    const LABEL: f64 = 200.0;
    const PLOT: f64 = 760.0;
    const ROW: f64 = 22.0;
    let rows: Vec<&TaskView> = tasks.iter().filter(|t| !t.attempts.is_empty()).collect();
    if rows.is_empty() {
        return r#"<p class="muted">No attempt has started yet.</p>"#.to_owned();
    }
    let end = rows
        .iter()
        .flat_map(|t| &t.attempts)
        .map(|a| a.ended_at.as_ref().map_or(now, millis))
        .max()
        .unwrap_or(now)
        .max(start + 1);
    let span = (end - start) as f64;
    let x = |at: i64| LABEL + (at - start).max(0) as f64 / span * PLOT;
    let height = ROW * rows.len() as f64 + 24.0;
    let mut out = format!(
        r#"<svg class="gantt" viewBox="0 0 {w} {height}" width="{w}" height="{height}" role="img" aria-label="Timeline of attempts over {total}">"#,
        w = LABEL + PLOT + 10.0,
        total = duration(end - start),
    );
    for (row, task) in rows.iter().enumerate() {
        let y = row as f64 * ROW;
        let name = match (task.kind.known(), task.item) {
            (Some(TaskKind::Compensation), _) => format!("undo {}", task.step),
            (_, Some(item)) => format!("{}[{item}]", task.step),
            _ => task.step.clone(),
        };
        let _ = write!(out, r#"<text x="4" y="{}">{}</text>"#, y + 15.0, Esc(&name));
        for attempt in &task.attempts {
            let from = millis(&attempt.started_at);
            let to = attempt.ended_at.as_ref().map_or(now, millis);
            let width = (x(to) - x(from)).max(2.0);
            let _ = write!(
                out,
                r#"<rect class="bar o-{outcome}" x="{bx}" y="{by}" width="{width}" height="{bh}" rx="3"><title>{title}</title></rect>"#,
                outcome = Esc(attempt.outcome.as_str()),
                bx = x(from),
                by = y + 4.0,
                bh = ROW - 8.0,
                title = Esc(&format!(
                    "{name} attempt {}: {} after {}{}",
                    attempt.attempt,
                    attempt.outcome.as_str().replace('_', " "),
                    duration(to - from),
                    attempt
                        .worker_id
                        .as_ref()
                        .map(|w| format!(" on {w}"))
                        .unwrap_or_default()
                )),
            );
        }
    }
    let axis = ROW * rows.len() as f64 + 16.0;
    let _ = write!(
        out,
        r#"<text class="axis" x="{LABEL}" y="{axis}">0s</text><text class="axis" x="{}" y="{axis}" text-anchor="end">{}</text></svg>"#,
        LABEL + PLOT,
        duration(end - start)
    );
    out
}

fn value_block(label: &str, value: &Option<Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(value) => format!(
            r#"<h4>{label}</h4><pre class="json">{}</pre>"#,
            esc(&json(value))
        ),
    }
}

/// Shell output arrives as `logs` (`{"stdout": …, "stderr": …}` or text): shown as text.
fn logs_block(logs: &Option<Value>) -> String {
    let mut out = String::new();
    match logs {
        None | Some(Value::Null) => {}
        Some(Value::Object(streams)) => {
            for (name, text) in streams {
                let text = text.as_str().map_or_else(|| json(text), str::to_owned);
                if !text.is_empty() {
                    let _ = write!(
                        out,
                        r#"<h4>{}</h4><pre class="logs">{}</pre>"#,
                        Esc(name),
                        Esc(&text)
                    );
                }
            }
        }
        Some(Value::String(text)) => {
            let _ = write!(
                out,
                r#"<h4>output</h4><pre class="logs">{}</pre>"#,
                Esc(text)
            );
        }
        Some(other) => out.push_str(&value_block("logs", &Some(other.clone()))),
    }
    out
}

/// The first line of a text, at most `chars` characters long.
fn first_line(text: &str, chars: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    if line.chars().count() > chars || text.lines().nth(1).is_some() {
        let cut: String = line.chars().take(chars).collect();
        format!("{cut}…")
    } else {
        line.to_owned()
    }
}

fn task_details(job: &str, task: &TaskView, open: bool) -> String {
    let name = match (task.kind.known(), task.item) {
        (Some(TaskKind::Compensation), _) => format!("undo {}", task.step),
        (_, Some(item)) => format!("{} item {item}", task.step),
        _ => task.step.clone(),
    };
    let mut out = format!(
        r#"<details id="task-{id}" class="task" data-task="{id}"{open}><summary>{status} <b>{name}</b> <span class="muted">{kind} · {attempts} · {queue} · {command}</span></summary><div class="task-body">"#,
        id = Esc(&task.id),
        open = if open { " open" } else { "" },
        status = badge(task.status.as_str()),
        name = Esc(&name),
        kind = Esc(&task.kind.as_str().replace('_', " ")),
        attempts = graph::attempts(task.attempt, task.max_attempts),
        queue = Esc(&task.queue),
        command = Esc(&first_line(&task.command, 70)),
    );
    if let Some(reason) = &task.waiting_reason {
        let _ = write!(
            out,
            r#"<p class="waiting"><b>Why it waits:</b> {}</p>"#,
            Esc(reason)
        );
    }
    if let Some(approval) = task.waiting_for.as_ref().and_then(|w| w.approval.as_ref()) {
        let _ = write!(
            out,
            r#"<p class="prompt"><b>Approval asked:</b> {}</p>"#,
            Esc(&approval.prompt)
        );
        out.push_str(&super::approvals::decision_buttons(job, &task.id, &name));
    }
    if let Some(error) = &task.error {
        let _ = write!(
            out,
            r#"<p class="error"><b>Error ({kind}{retry}):</b> {message}</p>"#,
            kind = Esc(&error.kind.as_str().replace('_', " ")),
            retry = if error.retryable { ", retryable" } else { "" },
            message = Esc(&error.message),
        );
    }
    let _ = write!(
        out,
        r#"<dl class="facts"><dt>Task</dt><dd class="mono">{id}</dd><dt>Worker</dt><dd>{worker}</dd><dt>Ready at</dt><dd>{ready}</dd><dt>Started</dt><dd>{started}</dd><dt>Ended</dt><dd>{ended}</dd><dt>Lease until</dt><dd>{lease}</dd></dl>"#,
        id = Esc(&task.id),
        worker = Esc(task.worker_id.as_deref().unwrap_or("—")),
        ready = opt(&task.ready_at),
        started = opt(&task.started_at),
        ended = opt(&task.ended_at),
        lease = opt(&task.lease_expires_at),
    );
    if !task.attempts.is_empty() {
        out.push_str(r#"<table class="attempts"><caption>Attempts</caption><thead><tr><th scope="col">#</th><th scope="col">Worker</th><th scope="col">Started (UTC)</th><th scope="col">Took</th><th scope="col">Outcome</th><th scope="col">Error</th></tr></thead><tbody>"#);
        for attempt in &task.attempts {
            let took = attempt.ended_at.as_ref().map_or_else(
                || "running".to_owned(),
                |end| duration(millis(end) - millis(&attempt.started_at)),
            );
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{took}</td><td>{}</td><td>{}</td></tr>",
                attempt.attempt,
                Esc(attempt.worker_id.as_deref().unwrap_or("—")),
                time(Timestamp(millis(&attempt.started_at))),
                Esc(&attempt.outcome.as_str().replace('_', " ")),
                Esc(attempt.error.as_deref().unwrap_or("")),
            );
        }
        out.push_str("</tbody></table>");
    }
    out.push_str(&value_block("Input", &task.input));
    out.push_str(&value_block("Output", &task.output));
    out.push_str(&value_block("Progress", &task.progress));
    out.push_str(&logs_block(&task.logs));
    if matches!(
        task.status.known(),
        Some(TaskStatus::Failed | TaskStatus::Waiting | TaskStatus::Ready)
    ) && task.kind != TaskKind::FanOut
    {
        let _ = write!(
            out,
            r#"<p><button type="button" id="skip-{id}" data-url="{url}" data-confirm="Mark task {name} succeeded by hand, with the output below." data-fields="output reason" data-done="Skipped">Skip with output…</button></p>"#,
            id = Esc(&task.id),
            url = Esc(&format!(
                "/api/v1/jobs/{}/tasks/{}/skip",
                url(job),
                url(&task.id)
            )),
            name = Esc(&name),
        );
    }
    out.push_str(&task_operator_buttons(job, task, &name));
    out.push_str("</div></details>");
    out
}

/// Requeue (a running task a worker holds, or one awaiting its callback) and fail by hand (a
/// waiting, ready or running task), neither for a fan-out's parent task; the API has the last
/// word.
fn task_operator_buttons(job: &str, task: &TaskView, name: &str) -> String {
    let Some(status) = task.status.known() else {
        return String::new();
    };
    let base = format!("/api/v1/jobs/{}/tasks/{}", url(job), url(&task.id));
    let mut out = String::new();
    let fan_out = task.kind == TaskKind::FanOut;
    // A task waiting on the server holds no worker, but one awaiting its callback can be run
    // again.
    let held_by_the_server = task
        .waiting_for
        .as_ref()
        .is_some_and(|wait| wait.callback.is_none());
    if status == TaskStatus::Running && !held_by_the_server && !fan_out {
        let _ = write!(
            out,
            r#"<button type="button" id="requeue-{id}" data-url="{url}" data-confirm="Revoke the worker's lease on task {name} and run it again in a new attempt that does not count against its attempts; the worker is told to stop." data-fields="reason" data-done="Requeued">Requeue…</button> "#,
            id = Esc(&task.id),
            url = Esc(&format!("{base}/requeue")),
            name = Esc(name),
        );
    }
    if matches!(
        status,
        TaskStatus::Waiting | TaskStatus::Ready | TaskStatus::Running
    ) && !fan_out
    {
        let _ = write!(
            out,
            r#"<button type="button" id="fail-{id}" class="danger" data-url="{url}" data-confirm="Fail task {name} for good, with no retry: the job goes on as after any failure of the step." data-fields="error reason" data-done="Failed by hand">Fail…</button>"#,
            id = Esc(&task.id),
            url = Esc(&format!("{base}/fail")),
            name = Esc(name),
        );
    }
    if out.is_empty() {
        return out;
    }
    format!("<p>{out}</p>")
}

/// A job's labels as facts, each a link to the jobs that carry it; nothing when it has none.
fn labels(ns: &Ns, labels: &api::Labels) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let mut out = String::from(r#"<dt>Labels</dt><dd id="labels" class="labels">"#);
    for (key, value) in labels {
        let selector = format!("{key}={value}");
        let _ = write!(
            out,
            r#"<a class="label mono" href="{}">{}</a> "#,
            Esc(&ns.href("/", &[("label", &selector)])),
            Esc(&selector)
        );
    }
    out.push_str("</dd>");
    out
}

pub(crate) fn job(ns: &Ns, data: &JobPage<'_>) -> String {
    let view = data.view;
    let summary = &view.summary;
    let start = millis(&summary.created_at);
    let ended = summary.ended_at.as_ref().map(millis);
    let ran = match (summary.started_at.as_ref().map(millis), ended) {
        (Some(a), Some(b)) => duration(b - a),
        (Some(a), None) => format!("{} so far", duration(data.now.0 - a)),
        _ => "not started".to_owned(),
    };
    let mut body = format!(
        r#"<section id="summary" data-live data-status="{status_attr}"><h1>Job <span class="mono">{id}</span> {status}</h1>
<dl class="facts"><dt>Workflow</dt><dd><a href="{wf_href}">{workflow}</a> v{version}</dd>{parent}<dt>Key</dt><dd class="mono">{key}</dd><dt>Priority</dt><dd>{priority}</dd><dt>Created</dt><dd>{created}</dd><dt>Started</dt><dd>{started}</dd><dt>Ended</dt><dd>{ended_text}</dd><dt>Duration</dt><dd>{ran}</dd><dt>Deadline</dt><dd>{deadline}</dd>{lock}{labels}</dl>"#,
        status_attr = Esc(summary.status.as_str()),
        id = Esc(&summary.id),
        status = badge(summary.status.as_str()),
        wf_href = Esc(&ns.href(
            &format!("/ui/workflows/{}", url(&summary.workflow)),
            &[("version", &summary.version.to_string())]
        )),
        workflow = Esc(&summary.workflow),
        version = summary.version,
        parent = summary
            .parent
            .as_ref()
            .map(|parent| format!(
                r#"<dt>Parent</dt><dd><a class="mono" id="parent-link" href="{}">{}</a></dd>"#,
                Esc(&ns.href(&format!("/ui/jobs/{}", parent.job), &[])),
                Esc(&parent.job)
            ))
            .unwrap_or_default(),
        key = Esc(summary.key.as_deref().unwrap_or("—")),
        priority = summary.priority,
        created = time(Timestamp(start)),
        started = opt(&summary.started_at),
        ended_text = opt(&summary.ended_at),
        deadline = opt(&summary.deadline_at),
        lock = summary
            .lock
            .as_ref()
            .map(|l| format!("<dt>Lock</dt><dd>{}</dd>", Esc(l)))
            .unwrap_or_default(),
        labels = labels(ns, &summary.labels),
    );
    if let Some(error) = &summary.error {
        let _ = write!(body, r#"<p class="error"><b>Why:</b> {}</p>"#, Esc(error));
    }
    if let Some(reason) = &summary.waiting_reason {
        let _ = write!(
            body,
            r#"<p class="waiting"><b>Waiting:</b> {}</p>"#,
            Esc(reason)
        );
    }
    if !summary.failed_steps.is_empty() {
        let _ = write!(
            body,
            r#"<p class="warning" id="failed-steps"><b>Went on past failed steps:</b> {}</p>"#,
            Esc(&summary.failed_steps.join(", "))
        );
    }
    body.push_str("</section>");
    body.push_str(&actions(ns, view));
    let graph = job_graph(data);
    let _ = write!(
        body,
        r#"<section aria-labelledby="graph-title"><h2 id="graph-title">Steps</h2>{legend}<div id="graph" class="graph" data-live>{svg}</div></section>"#,
        legend = graph::legend(),
        svg = graph::svg(&graph, Some(&graph::step_anchor)),
    );
    let _ = write!(
        body,
        r#"<section aria-labelledby="timeline-title"><h2 id="timeline-title">Timeline</h2><div id="timeline" class="timeline" data-live>{}</div></section>"#,
        timeline(&view.tasks, start, ended.unwrap_or(data.now.0))
    );
    body.push_str(r#"<section aria-labelledby="tasks-title"><h2 id="tasks-title">Tasks</h2><div id="tasks" data-live>"#);
    let mut steps: Vec<&str> = Vec::new();
    for task in &view.tasks {
        if !steps.contains(&task.step.as_str()) {
            steps.push(&task.step);
        }
    }
    for step in steps {
        let _ = write!(
            body,
            r#"<section class="step" id="step-{}"><h3>{}</h3>"#,
            Esc(&url(step)),
            Esc(step)
        );
        for task in view.tasks.iter().filter(|t| t.step == step) {
            let open = matches!(
                task.status.known(),
                Some(TaskStatus::Failed | TaskStatus::Running)
            );
            body.push_str(&task_details(&summary.id, task, open));
        }
        body.push_str("</section>");
    }
    body.push_str("</div></section>");
    let _ = write!(
        body,
        r#"<section aria-labelledby="params-title"><h2 id="params-title">Params</h2><pre class="json" id="params">{}</pre></section>"#,
        esc(&json(&view.params))
    );
    if !view.children.is_empty() {
        body.push_str(r#"<section aria-labelledby="children-title"><h2 id="children-title">Child jobs</h2><ul id="children">"#);
        for task in view
            .tasks
            .iter()
            .filter(|t| t.child.is_some() && t.kind.known() != Some(TaskKind::Compensation))
        {
            let child = task.child.as_deref().unwrap_or_default();
            let item = task.item.map(|i| format!(" [{i}]")).unwrap_or_default();
            let _ = write!(
                body,
                r#"<li><a class="mono" href="{}">{}</a> — {}{} · attempt {}</li>"#,
                Esc(&ns.href(&format!("/ui/jobs/{child}"), &[])),
                Esc(child),
                Esc(&task.step),
                Esc(&item),
                task.attempt
            );
        }
        body.push_str("</ul></section>");
    }
    if let Some(output) = &view.output {
        let _ = write!(
            body,
            r#"<section aria-labelledby="output-title"><h2 id="output-title">Output</h2><pre class="json" id="output">{}</pre></section>"#,
            esc(&json(output))
        );
    }
    body.push_str(r#"<section aria-labelledby="events-title"><h2 id="events-title">History</h2><table class="list events"><thead><tr><th scope="col">#</th><th scope="col">At (UTC)</th><th scope="col">Event</th><th scope="col">Step</th><th scope="col">Attempt</th><th scope="col">Worker</th><th scope="col">Detail</th></tr></thead><tbody id="events" data-live>"#);
    for event in data.events {
        let detail = match &event.detail {
            Value::Object(map) if map.is_empty() => String::new(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        let _ = write!(
            body,
            r#"<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class="mono detail">{}</td></tr>"#,
            event.seq,
            time(Timestamp(millis(&event.at))),
            Esc(&event.kind.as_str().replace('_', " ")),
            Esc(event.step.as_deref().unwrap_or("")),
            event.attempt.map(|a| a.to_string()).unwrap_or_default(),
            Esc(event.worker_id.as_deref().unwrap_or("")),
            Esc(&detail),
        );
    }
    body.push_str("</tbody></table></section>");
    body
}

pub(crate) fn workflows(ns: &Ns, items: &[StoredWorkflow]) -> String {
    let mut body = String::from(
        r#"<h1>Workflows</h1><table class="list"><thead><tr><th scope="col">Name</th><th scope="col">Latest version</th><th scope="col">Steps</th><th scope="col">Description</th><th scope="col">Applied (UTC)</th></tr></thead><tbody>"#,
    );
    for workflow in items {
        let _ = write!(
            body,
            r#"<tr><td><a href="{}">{}</a></td><td>v{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            Esc(&ns.href(&format!("/ui/workflows/{}", url(&workflow.name)), &[])),
            Esc(&workflow.name),
            workflow.version,
            workflow.steps,
            Esc(workflow.description.as_deref().unwrap_or("")),
            time(workflow.created_at),
        );
    }
    if items.is_empty() {
        body.push_str(r#"<tr><td colspan="5" class="empty">No workflow yet: apply one with <code>starbridge apply FILE</code>.</td></tr>"#);
    }
    body.push_str("</tbody></table>");
    body
}

pub(crate) struct WorkflowPage<'a> {
    pub(crate) stored: &'a StoredWorkflow,
    pub(crate) workflow: &'a Workflow,
    pub(crate) latest: u32,
    /// The version compared with, and its definition.
    pub(crate) compared: Option<(u32, &'a Value)>,
    /// The workflow is deleted: its versions are shown for the jobs that ran them, but it runs
    /// no new job.
    pub(crate) deleted: bool,
}

pub(crate) fn workflow(ns: &Ns, data: &WorkflowPage<'_>) -> String {
    let stored = data.stored;
    let name = &stored.name;
    let version = stored.version.to_string();
    let mut body = format!(
        r#"<h1>Workflow {} <span class="muted">v{}</span></h1>"#,
        Esc(name),
        stored.version
    );
    if data.deleted {
        body.push_str(
            r#"<p class="notice" id="workflow-deleted">This workflow is deleted: it runs no new job. Its versions stay for the jobs that ran them; applying it again stores the next version.</p>"#,
        );
    } else {
        let _ = write!(
            body,
            r#"<div id="actions" class="actions"><button type="button" id="act-delete" class="danger" data-url="{url}" data-method="DELETE" data-then="{list}" data-confirm="Delete this workflow: it runs no new job, and it is hidden from the list. Its versions stay for the jobs that ran them. Refused while a job of it could still run or be retried, a schedule runs it, or another workflow starts it." data-fields="reason">Delete…</button></div>"#,
            url = Esc(&ns.href(&format!("/api/v1/workflows/{}", url(name)), &[])),
            list = Esc(&ns.href("/ui/workflows", &[])),
        );
    }
    if let Some(description) = &stored.description {
        let _ = write!(body, "<p>{}</p>", Esc(description));
    }
    body.push_str(r#"<nav class="versions" aria-label="Versions">Versions: "#);
    for v in (1..=data.latest).rev() {
        let current = if v == stored.version {
            r#" aria-current="page""#
        } else {
            ""
        };
        let _ = write!(
            body,
            r#"<a href="{}"{current}>v{v}</a> "#,
            Esc(&ns.href(
                &format!("/ui/workflows/{}", url(name)),
                &[("version", &v.to_string())]
            ))
        );
    }
    body.push_str("</nav>");
    let graph = graph::workflow_graph(data.workflow);
    let base = format!("/ui/workflows/{}", url(name));
    let _ = write!(
        body,
        r#"<section aria-labelledby="graph-title"><h2 id="graph-title">Steps</h2><p class="downloads">Graph: <a href="{dot}" download="{file}.dot">DOT</a> <a href="{svg}" download="{file}.svg">SVG</a></p><div class="graph">{drawn}</div></section>"#,
        dot = Esc(&ns.href(&format!("{base}/graph.dot"), &[("version", &version)])),
        svg = Esc(&ns.href(&format!("{base}/graph.svg"), &[("version", &version)])),
        file = Esc(&format!("{name}-v{version}")),
        drawn = graph::svg(&graph, None),
    );
    if !data.deleted {
        let _ = write!(
            body,
            r#"<section aria-labelledby="submit-title"><h2 id="submit-title">Submit a job</h2><form id="submit-job" class="submit" data-workflow="{name}" data-version="{version}">{fields}<div class="field"><label for="submit-key">Key (optional: a repeated key returns the existing job)</label><input id="submit-key" name="key" type="text"></div><div class="buttons"><button type="submit" class="primary">Submit v{version}</button></div><p class="error" id="submit-error" role="alert"></p></form></section>"#,
            name = Esc(name),
            fields = super::form::fields(data.workflow.params_schema.as_ref()),
        );
    }
    // The diff against another version.
    if data.latest > 1 {
        let mut options: Vec<(String, String)> = Vec::new();
        for v in (1..=data.latest).rev().filter(|&v| v != stored.version) {
            options.push((v.to_string(), format!("v{v}")));
        }
        let current = data
            .compared
            .map(|(v, _)| v.to_string())
            .unwrap_or_default();
        let choices: Vec<(&str, &str)> = options
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let _ = write!(
            body,
            r#"<section aria-labelledby="diff-title"><h2 id="diff-title">Changes</h2><form method="get" class="filters" action="{action}"><input type="hidden" name="version" value="{version}">{ns_field}<div class="field"><label for="diff-with">Compare v{version} with</label>{select}</div><div class="buttons"><button type="submit">Compare</button></div></form>"#,
            action = Esc(&format!("/ui/workflows/{}", url(name))),
            ns_field = if ns.is_default() {
                String::new()
            } else {
                format!(
                    r#"<input type="hidden" name="namespace" value="{}">"#,
                    Esc(&ns.0)
                )
            },
            select = select("diff-with", "diff", &choices, &current),
        );
        if let Some((other, definition)) = data.compared {
            let (old, new) = if other < stored.version {
                (json(definition), json(&stored.definition))
            } else {
                (json(&stored.definition), json(definition))
            };
            let (from, to) = if other < stored.version {
                (other, stored.version)
            } else {
                (stored.version, other)
            };
            let _ = write!(
                body,
                r#"<pre class="diff" aria-label="Changes from v{from} to v{to}">"#
            );
            for line in diff(&old, &new) {
                let _ = match line {
                    Line::Same(text) => writeln!(body, "<span>  {}</span>", Esc(text)),
                    Line::Removed(text) => {
                        writeln!(body, r#"<del>- {}</del>"#, Esc(text))
                    }
                    Line::Added(text) => writeln!(body, r#"<ins>+ {}</ins>"#, Esc(text)),
                };
            }
            body.push_str("</pre>");
        }
        body.push_str("</section>");
    }
    let _ = write!(
        body,
        r#"<section aria-labelledby="def-title"><h2 id="def-title">Definition</h2><pre class="json">{}</pre></section>"#,
        esc(&json(&stored.definition))
    );
    body
}

/// A worker: seen polling this server, holding running tasks, or both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct WorkerRow {
    pub(crate) worker: String,
    /// The queues of its last poll on this server.
    pub(crate) polls: Vec<String>,
    /// Milliseconds since that poll.
    pub(crate) last_poll_ago: Option<u64>,
    /// Its running tasks per queue.
    pub(crate) running: Vec<(String, u64)>,
}

/// Joins the workers seen polling with the workers holding tasks.
pub(crate) fn worker_rows(
    seen: &[(String, Vec<String>, u64)],
    loads: &[WorkerLoad],
) -> Vec<WorkerRow> {
    let mut rows: Vec<WorkerRow> = seen
        .iter()
        .map(|(worker, queues, ago)| WorkerRow {
            worker: worker.clone(),
            polls: queues.clone(),
            last_poll_ago: Some(*ago),
            running: Vec::new(),
        })
        .collect();
    for load in loads {
        let index = match rows.iter().position(|r| r.worker == load.worker) {
            Some(index) => index,
            None => {
                rows.push(WorkerRow {
                    worker: load.worker.clone(),
                    ..WorkerRow::default()
                });
                rows.len() - 1
            }
        };
        rows[index].running.push((load.queue.clone(), load.running));
    }
    rows.sort_by(|a, b| a.worker.cmp(&b.worker));
    rows
}

/// What the queues page lists: the queues whose name starts with `prefix` (a group's) and
/// holds `q`, a page after `cursor`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct QueuesFilter {
    pub(crate) prefix: String,
    pub(crate) q: String,
    pub(crate) cursor: String,
}

impl QueuesFilter {
    fn pairs(&self) -> Vec<(&str, &str)> {
        vec![("prefix", &self.prefix), ("q", &self.q)]
    }
}

/// Queues that share the part of their name before its last `-` (`agent-` for `agent-17`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct QueueGroup {
    /// The shared part, `-` included: the group's queues are those its pattern `agent-*` names.
    pub(crate) prefix: String,
    pub(crate) queues: u64,
    pub(crate) ready: u64,
    pub(crate) running: u64,
    pub(crate) paused: u64,
}

/// The groups of queues (see [`QueueGroup`]) that hold at least two queues, by prefix; queues
/// alone in theirs, or without a `-`, are in none.
pub(crate) fn queue_groups(queues: &[QueueView]) -> Vec<QueueGroup> {
    let mut groups: std::collections::BTreeMap<&str, QueueGroup> = Default::default();
    for queue in queues {
        let Some(at) = queue.name.rfind('-') else {
            continue;
        };
        let prefix = &queue.name[..=at];
        let group = groups.entry(prefix).or_insert_with(|| QueueGroup {
            prefix: prefix.to_owned(),
            ..QueueGroup::default()
        });
        group.queues += 1;
        group.ready += queue.ready;
        group.running += queue.running;
        group.paused += u64::from(queue.paused);
    }
    groups.into_values().filter(|g| g.queues > 1).collect()
}

pub(crate) struct QueuesPage<'a> {
    pub(crate) filter: &'a QueuesFilter,
    pub(crate) groups: &'a [QueueGroup],
    pub(crate) prefixes: &'a [api::QueuePrefixView],
    /// The page of queues the filter selects.
    pub(crate) queues: &'a [QueueView],
    pub(crate) next_cursor: Option<String>,
    /// Why the filter selects nothing (a refused search).
    pub(crate) problem: Option<String>,
    /// Per queue: how long ago a worker last polled it on this server, and how many tasks this
    /// server handed out in the last minute.
    pub(crate) activity: &'a [(String, Option<u64>, u64)],
    pub(crate) workers: &'a [WorkerRow],
}

/// A queue's or a pattern's settings in a few words: mode, priority, limit, rate.
fn settings_text(
    mode: &str,
    priority: i32,
    concurrency: Option<u32>,
    rate: Option<&api::RateView>,
) -> [String; 4] {
    [
        mode.to_owned(),
        priority.to_string(),
        concurrency.map_or_else(|| "none".to_owned(), |c| c.to_string()),
        rate.map_or_else(
            || "none".to_owned(),
            |r| format!("{}/{}", r.tokens, duration(r.per_ms as i64)),
        ),
    ]
}

pub(crate) fn queues(ns: &Ns, data: &QueuesPage<'_>) -> String {
    let filter = data.filter;
    let mut body = String::from(
        r#"<h1>Queues and workers</h1><form class="filters" method="get" action="/ui/queues">"#,
    );
    if !ns.is_default() {
        let _ = write!(
            body,
            r#"<input type="hidden" name="namespace" value="{}">"#,
            Esc(&ns.0)
        );
    }
    if !filter.prefix.is_empty() {
        let _ = write!(
            body,
            r#"<input type="hidden" name="prefix" value="{}">"#,
            Esc(&filter.prefix)
        );
    }
    let _ = write!(
        body,
        r#"<div class="field"><label for="f-queue">Search queues (any part of the name)</label><input id="f-queue" name="q" type="search" value="{q}" placeholder="agent-eu"></div>
<div class="buttons"><button type="submit" class="primary">Search</button><a id="queues-clear" href="{clear}">All queues</a></div></form>"#,
        q = Esc(&filter.q),
        clear = Esc(&ns.href("/ui/queues", &[])),
    );
    if let Some(problem) = &data.problem {
        let _ = write!(
            body,
            r#"<p class="error" role="alert">{}</p>"#,
            Esc(problem)
        );
    }
    if !data.groups.is_empty() {
        body.push_str(
            r#"<table class="list"><caption>Groups: queues sharing the part of their name before its last “-”</caption><thead><tr><th scope="col">Group</th><th scope="col">Queues</th><th scope="col">Ready</th><th scope="col">Running</th><th scope="col">Paused</th></tr></thead><tbody id="queue-groups" data-live>"#,
        );
        for group in data.groups {
            let current = if group.prefix == filter.prefix {
                r#" aria-current="true""#
            } else {
                ""
            };
            let _ = write!(
                body,
                r#"<tr><th scope="row"><a href="{href}"{current} data-group="{prefix}">{prefix}*</a></th><td>{queues}</td><td>{ready}</td><td>{running}</td><td>{paused}</td></tr>"#,
                href = Esc(&ns.href("/ui/queues", &[("prefix", &group.prefix), ("q", &filter.q)])),
                prefix = Esc(&group.prefix),
                queues = group.queues,
                ready = group.ready,
                running = group.running,
                paused = group.paused,
            );
        }
        body.push_str("</tbody></table>");
    }
    if !data.prefixes.is_empty() {
        body.push_str(
            r#"<table class="list"><caption>Prefix settings: what queues without settings of their own follow (the longest prefix wins)</caption><thead><tr><th scope="col">Pattern</th><th scope="col">Mode</th><th scope="col">Priority</th><th scope="col">Limit</th><th scope="col">Rate</th></tr></thead><tbody id="queue-prefixes" data-live>"#,
        );
        for prefix in data.prefixes {
            let [mode, priority, limit, rate] = settings_text(
                prefix.mode.as_str(),
                prefix.priority,
                prefix.concurrency,
                prefix.rate.as_ref(),
            );
            let shown = prefix.pattern.trim_end_matches('*');
            let _ = write!(
                body,
                r#"<tr><th scope="row"><a class="mono" href="{href}">{pattern}</a></th><td>{mode}</td><td>{priority}</td><td>{limit}</td><td>{rate}</td></tr>"#,
                href = Esc(&ns.href("/ui/queues", &[("prefix", shown)])),
                pattern = Esc(&prefix.pattern),
                mode = Esc(&mode),
            );
        }
        body.push_str("</tbody></table>");
    }
    let mut caption = String::from("Queues");
    if !filter.prefix.is_empty() {
        let _ = write!(caption, " of {}*", Esc(&filter.prefix));
    }
    if !filter.q.is_empty() {
        let _ = write!(caption, " matching “{}”", Esc(&filter.q));
    }
    let _ = write!(
        body,
        r#"<table class="list"><caption id="queues-caption">{caption}</caption><thead><tr><th scope="col">Queue</th><th scope="col">State</th><th scope="col">Ready (depth)</th><th scope="col">Running</th><th scope="col">Oldest ready</th><th scope="col">Started last minute</th><th scope="col">Last poll</th><th scope="col">Mode</th><th scope="col">Priority</th><th scope="col">Limit</th><th scope="col">Rate</th><th scope="col">Settings</th><th scope="col"><span class="sr">Action</span></th></tr></thead><tbody id="queues" data-live>"#,
    );
    for queue in data.queues {
        let activity = data.activity.iter().find(|(name, ..)| *name == queue.name);
        let started = activity.map_or(0, |(.., started)| *started);
        let last_poll = activity.and_then(|(_, ago, _)| *ago).map_or_else(
            || "never".to_owned(),
            |ago| format!("{} ago", duration(ago as i64)),
        );
        let (state, action, label) = match (queue.paused, &queue.paused_reason) {
            (true, Some(reason)) => (
                format!(
                    r#"{} <span class="error">stopped on error: {}</span>"#,
                    badge("paused"),
                    Esc(reason)
                ),
                "resume",
                "Resume",
            ),
            (true, None) => (badge("paused"), "resume", "Resume"),
            (false, _) if queue.on_error.known() == Some(api::OnError::Pause) => (
                format!(
                    r#"{} <span class="muted">pauses on error</span>"#,
                    badge("active")
                ),
                "pause",
                "Pause",
            ),
            (false, _) => (badge("active"), "pause", "Pause"),
        };
        let [mode, priority, limit, rate] = settings_text(
            queue.mode.as_str(),
            queue.priority,
            queue.concurrency,
            queue.rate.as_ref(),
        );
        let settings = match (&queue.settings_from, queue.own_settings) {
            (Some(pattern), _) => format!(r#"<span class="mono">{}</span>"#, Esc(pattern)),
            (None, true) => "its own".to_owned(),
            (None, false) => "defaults".to_owned(),
        };
        let _ = write!(
            body,
            r#"<tr><th scope="row">{name}</th><td>{state}</td><td>{ready}</td><td>{running}</td><td>{oldest}</td><td>{started}</td><td>{last_poll}</td><td>{mode}</td><td>{priority}</td><td>{limit}</td><td>{rate}</td><td>{settings}</td><td><button type="button" id="queue-{action}-{name}" data-url="/api/v1/queues/{url_name}/{action}" data-done="{label}d {name}">{label}</button></td></tr>"#,
            name = Esc(&queue.name),
            url_name = Esc(&url(&queue.name)),
            ready = queue.ready,
            running = queue.running,
            oldest = if queue.ready == 0 {
                "—".to_owned()
            } else {
                duration(queue.oldest_ready_age_ms as i64)
            },
            mode = Esc(&mode),
        );
    }
    if data.queues.is_empty() {
        let empty = if filter == &QueuesFilter::default() {
            "No queue yet: queues appear when a workflow uses them."
        } else {
            "No queue matches."
        };
        let _ = write!(
            body,
            r#"<tr><td colspan="13" class="empty">{empty}</td></tr>"#
        );
    }
    body.push_str(r#"</tbody></table><nav class="pager" aria-label="Pages of queues">"#);
    if !filter.cursor.is_empty() {
        let _ = write!(
            body,
            r#"<a href="{}">« First</a>"#,
            Esc(&ns.href("/ui/queues", &filter.pairs()))
        );
    }
    if let Some(cursor) = &data.next_cursor {
        let mut pairs = filter.pairs();
        pairs.push(("cursor", cursor));
        let _ = write!(
            body,
            r#"<a id="queues-next" href="{}">Next »</a>"#,
            Esc(&ns.href("/ui/queues", &pairs))
        );
    }
    body.push_str(r#"</nav><table class="list"><caption>Workers (polling this server in the last hour, or holding tasks)</caption><thead><tr><th scope="col">Worker</th><th scope="col">Polls queues</th><th scope="col">Last poll</th><th scope="col">Running tasks</th></tr></thead><tbody id="workers" data-live>"#);
    for worker in data.workers {
        let running: Vec<String> = worker
            .running
            .iter()
            .map(|(queue, count)| format!("{count} on {}", esc(queue)))
            .collect();
        let _ = write!(
            body,
            "<tr><td class=\"mono\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            Esc(&worker.worker),
            Esc(&worker.polls.join(", ")),
            worker.last_poll_ago.map_or_else(
                || "not on this server".to_owned(),
                |ago| format!("{} ago", duration(ago as i64))
            ),
            if running.is_empty() {
                "none".to_owned()
            } else {
                running.join(", ")
            },
        );
    }
    if data.workers.is_empty() {
        body.push_str(r#"<tr><td colspan="4" class="empty">No worker has polled this server in the last hour.</td></tr>"#);
    }
    body.push_str("</tbody></table>");
    body
}

pub(crate) fn schedules(ns: &Ns, items: &[ScheduleView]) -> String {
    let mut body = String::from(
        r#"<h1>Schedules</h1><table class="list"><thead><tr><th scope="col">Schedule</th><th scope="col">State</th><th scope="col">Workflow</th><th scope="col">Cron</th><th scope="col">Next fires (UTC)</th><th scope="col">Last fire</th><th scope="col">Last job</th><th scope="col">Last error</th><th scope="col"><span class="sr">Action</span></th></tr></thead><tbody id="schedules" data-live>"#,
    );
    for schedule in items {
        let (state, action, label) = if schedule.paused {
            (badge("paused"), "resume", "Resume")
        } else {
            (badge("active"), "pause", "Pause")
        };
        let fires: Vec<String> = schedule
            .next_fires
            .iter()
            .map(|t| time(Timestamp(millis(t))))
            .collect();
        let last_job = schedule.last_job_id.as_ref().map_or_else(
            || "—".to_owned(),
            |id| {
                format!(
                    r#"<a class="mono" href="{}">{}</a>"#,
                    Esc(&ns.href(&format!("/ui/jobs/{id}"), &[])),
                    Esc(id)
                )
            },
        );
        let _ = write!(
            body,
            r#"<tr><th scope="row">{name}</th><td>{state}</td><td><a href="{wf_href}">{workflow}</a></td><td class="mono">{cron} <span class="muted">{tz}</span></td><td>{fires}</td><td>{last_fire}</td><td>{last_job}</td><td>{error}</td><td><button type="button" id="schedule-{action}-{name}" data-url="/api/v1/schedules/{url_name}/{action}" data-done="{label}d {name}">{label}</button></td></tr>"#,
            name = Esc(&schedule.name),
            url_name = Esc(&url(&schedule.name)),
            wf_href = Esc(&ns.href(&format!("/ui/workflows/{}", url(&schedule.workflow)), &[])),
            workflow = Esc(&schedule.workflow),
            cron = Esc(&schedule.cron),
            tz = Esc(&schedule.timezone),
            fires = if fires.is_empty() {
                "— (paused)".to_owned()
            } else {
                fires.join("<br>")
            },
            last_fire = opt(&schedule.last_fire_at),
            error = Esc(schedule.last_error.as_deref().unwrap_or("")),
        );
    }
    if items.is_empty() {
        body.push_str(r#"<tr><td colspan="9" class="empty">No schedule yet: add one with <code>starbridge schedule set</code>.</td></tr>"#);
    }
    body.push_str("</tbody></table>");
    body
}

/// A page saying what went wrong (not found, bad filter, store unavailable).
pub(crate) fn problem(title: &str, detail: &str) -> String {
    format!(
        r#"<h1>{}</h1><p class="error" role="alert">{}</p><p><a href="/">Back to the jobs</a></p>"#,
        Esc(title),
        Esc(detail)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_keep_the_namespace_and_drop_empty_filters() {
        let default = Ns("default".to_owned());
        assert_eq!(
            default.href("/", &[("status", ""), ("q", "a b")]),
            "/?q=a%20b"
        );
        let other = Ns("team-a".to_owned());
        assert_eq!(other.href("/ui/queues", &[]), "/ui/queues?namespace=team-a");
    }

    #[test]
    fn counts_group_thousands_and_mark_capped_ones() {
        assert_eq!(count_text(7, false), "<b>7</b>");
        assert_eq!(count_text(1_234_567, false), "<b>1,234,567</b>");
        assert_eq!(
            count_text(100_000, true),
            r#"<b title="more than 100,000: narrow the filter for an exact count">100,000+</b>"#
        );
    }

    #[test]
    fn workers_seen_polling_and_holding_tasks_are_joined() {
        let loads = [
            WorkerLoad {
                worker: "w1".to_owned(),
                queue: "q".to_owned(),
                running: 2,
            },
            WorkerLoad {
                worker: "w9".to_owned(),
                queue: "q".to_owned(),
                running: 1,
            },
        ];
        let seen = [("w1".to_owned(), vec!["q".to_owned(), "r".to_owned()], 1500)];
        let rows = worker_rows(&seen, &loads);
        assert_eq!(
            rows,
            [
                WorkerRow {
                    worker: "w1".to_owned(),
                    polls: vec!["q".to_owned(), "r".to_owned()],
                    last_poll_ago: Some(1500),
                    running: vec![("q".to_owned(), 2)],
                },
                WorkerRow {
                    worker: "w9".to_owned(),
                    polls: Vec::new(),
                    last_poll_ago: None,
                    running: vec![("q".to_owned(), 1)],
                },
            ]
        );
    }

    #[test]
    fn the_timeline_draws_one_bar_per_attempt_with_its_outcome() {
        let task: TaskView = serde_json::from_value(serde_json::json!({
            "id": "tsk_1", "step": "load", "kind": "step", "item": null, "compensates": null,
            "queue": "q", "command": "c", "status": "failed", "attempt": 2, "max_attempts": 2,
            "priority": 0, "input": null, "output": null, "error": null, "progress": null,
            "logs": null, "worker_id": "w1", "created_at": "2026-11-23T01:00:00Z",
            "ready_at": null, "available_at": null, "started_at": null, "ended_at": null,
            "lease_expires_at": null, "deadline_at": null, "waiting_reason": null,
            "attempts": [
                {"attempt": 1, "worker_id": "w1", "started_at": "2026-11-23T01:00:00Z",
                 "ended_at": "2026-11-23T01:00:02Z", "outcome": "failed", "error": "boom"},
                {"attempt": 2, "worker_id": "w<2>", "started_at": "2026-11-23T01:00:03Z",
                 "ended_at": null, "outcome": "running", "error": null}
            ]
        }))
        .unwrap();
        let start = millis(&"2026-11-23T01:00:00Z".parse().unwrap());
        let drawn = timeline(&[task], start, start + 4000);
        assert_eq!(drawn.matches("<rect").count(), 2);
        assert!(drawn.contains(r#"class="bar o-failed" x="200""#), "{drawn}");
        assert!(
            drawn.contains(r#"class="bar o-running" x="770""#),
            "{drawn}"
        );
        assert!(drawn.contains("load attempt 2: running after 1.0s on w&lt;2&gt;"));
    }

    #[test]
    fn the_page_escapes_its_title_and_marks_the_current_section() {
        let html = page(
            "<x>",
            Section::Queues,
            &Ns("default".to_owned()),
            Live::Every(3000),
            "",
        );
        assert!(html.contains("<title>&lt;x&gt; · Starbridge</title>"));
        assert!(html.contains(r#"<a href="/ui/queues" aria-current="page">"#));
        assert!(html.contains(r#"<main id="main" data-refresh="3000">"#));
    }
}
