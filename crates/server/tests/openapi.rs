//! The served OpenAPI document against the implementation: it is OpenAPI 3.1 with every `$ref`
//! resolving, it documents exactly the routes the server registers, real responses (and the
//! requests the server accepted) validate against the schemas it documents for them, and, as it
//! is generated from the code, it still says everything the last hand-written document said.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use starbridge_engine::{ManualClock, Scope};
use tokio::sync::Mutex;
use tower::ServiceExt;

use common::{Answer, Api};

/// Every operation the router serves. A route added to the server without being added here and
/// documented fails `operations_are_exactly_the_routes`.
const OPERATIONS: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/api/v1/openapi.json"),
    ("GET", "/api/v1/workflows"),
    ("GET", "/api/v1/workflows/{name}"),
    ("PUT", "/api/v1/workflows/{name}"),
    ("DELETE", "/api/v1/workflows/{name}"),
    ("POST", "/api/v1/jobs"),
    ("POST", "/api/v1/jobs/batch"),
    ("GET", "/api/v1/jobs"),
    ("GET", "/api/v1/jobs/{id}"),
    ("DELETE", "/api/v1/jobs/{id}"),
    ("GET", "/api/v1/jobs/{id}/events"),
    ("POST", "/api/v1/jobs/{id}/pause"),
    ("POST", "/api/v1/jobs/{id}/resume"),
    ("POST", "/api/v1/jobs/{id}/cancel"),
    ("POST", "/api/v1/jobs/{id}/retry"),
    ("POST", "/api/v1/jobs/{id}/rerun"),
    ("POST", "/api/v1/jobs/{id}/tasks/{task}/skip"),
    ("POST", "/api/v1/jobs/{id}/tasks/{task}/requeue"),
    ("POST", "/api/v1/jobs/{id}/tasks/{task}/fail"),
    ("POST", "/api/v1/jobs/bulk/{action}"),
    ("POST", "/api/v1/tasks/poll"),
    ("POST", "/api/v1/tasks/complete"),
    ("POST", "/api/v1/tasks/{id}/heartbeat"),
    ("POST", "/api/v1/tasks/{id}/complete"),
    ("POST", "/api/v1/tasks/{id}/fail"),
    ("POST", "/api/v1/tasks/{id}/check-later"),
    ("POST", "/api/v1/tasks/{id}/await-callback"),
    ("POST", "/api/v1/jobs/{id}/signals/{name}"),
    ("GET", "/api/v1/approvals"),
    ("POST", "/api/v1/jobs/{id}/tasks/{task}/approve"),
    ("POST", "/api/v1/jobs/{id}/tasks/{task}/reject"),
    ("POST", "/api/v1/callbacks/{token}/complete"),
    ("POST", "/api/v1/callbacks/{token}/fail"),
    ("POST", "/api/v1/callbacks/{token}/heartbeat"),
    ("GET", "/api/v1/queues"),
    ("GET", "/api/v1/queues/{name}"),
    ("PUT", "/api/v1/queues/{name}"),
    ("DELETE", "/api/v1/queues/{name}"),
    ("POST", "/api/v1/queues/{name}/pause"),
    ("POST", "/api/v1/queues/{name}/resume"),
    ("GET", "/api/v1/schedules"),
    ("GET", "/api/v1/schedules/{name}"),
    ("PUT", "/api/v1/schedules/{name}"),
    ("DELETE", "/api/v1/schedules/{name}"),
    ("POST", "/api/v1/schedules/{name}/pause"),
    ("POST", "/api/v1/schedules/{name}/resume"),
    ("GET", "/api/v1/webhooks"),
    ("POST", "/api/v1/webhooks"),
    ("DELETE", "/api/v1/webhooks/{id}"),
    ("GET", "/api/v1/webhooks/{id}/deliveries"),
    ("GET", "/api/v1/tokens"),
    ("POST", "/api/v1/tokens"),
    ("DELETE", "/api/v1/tokens/{id}"),
    ("GET", "/api/v1/audit"),
    ("GET", "/api/v1/stats/minutes"),
];

/// The operations anyone may call, even when the server requires a token.
const PUBLIC: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/api/v1/openapi.json"),
    ("POST", "/api/v1/callbacks/{token}/complete"),
    ("POST", "/api/v1/callbacks/{token}/fail"),
    ("POST", "/api/v1/callbacks/{token}/heartbeat"),
];

/// The scopes, each with those it includes (`work` stands alone).
const SCOPES: &[(Scope, &[Scope])] = &[
    (
        Scope::Admin,
        &[Scope::Admin, Scope::Operate, Scope::Submit, Scope::Read],
    ),
    (
        Scope::Operate,
        &[Scope::Operate, Scope::Submit, Scope::Read],
    ),
    (Scope::Submit, &[Scope::Submit, Scope::Read]),
    (Scope::Work, &[Scope::Work]),
    (Scope::Read, &[Scope::Read]),
];

const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

fn api() -> Api {
    Api::start()
}

/// The document the server serves.
async fn document(api: &Api) -> Value {
    let answer = api.send("GET", "/api/v1/openapi.json", &[], "").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.content_type, "application/json");
    serde_json::from_str(&answer.text).expect("the document is JSON")
}

fn token(text: &str) -> String {
    text.replace('~', "~0").replace('/', "~1")
}

/// A JSON pointer as a URI fragment (path templates hold `{` and `}`).
fn fragment(pointer: &str) -> String {
    pointer
        .replace('%', "%25")
        .replace('{', "%7B")
        .replace('}', "%7D")
}

fn collect_refs<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("$ref", Value::String(target)) => out.push(target),
                    _ => collect_refs(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_refs(item, out)),
        _ => {}
    }
}

fn operations(document: &Value) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for method in METHODS {
            if item.get(*method).is_some() {
                found.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    found
}

fn expected() -> BTreeSet<(String, String)> {
    OPERATIONS
        .iter()
        .map(|(method, path)| ((*method).to_owned(), (*path).to_owned()))
        .collect()
}

/// The (method, path) pairs registered with `.route(...)` in the server's sources: the files
/// of `src/` itself. The web UI's HTML routes live in `src/ui/`, outside the JSON API
/// (`ui_routes_stay_outside_the_json_api` holds it to that).
fn routes_in_source() -> BTreeSet<(String, String)> {
    routes_in(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// The API's path constants (`starbridge_api::paths`), by name, read from their source as the
/// routes are.
fn api_paths() -> HashMap<String, String> {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../api/src/paths.rs");
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("pub const ")?;
            let (name, value) = rest.split_once(": &str = \"")?;
            Some((name.to_owned(), value.strip_suffix("\";")?.to_owned()))
        })
        .collect()
}

fn routes_in(dir: &std::path::Path) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|ext| ext != "rs") {
            continue;
        }
        let source: String = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut rest = source.as_str();
        while let Some(at) = rest.find(".route(") {
            rest = &rest[at + ".route(".len()..];
            let mut depth = 1;
            let end = rest
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map(|(i, _)| i)
                .unwrap();
            let call = &rest[..end];
            // The path is a literal (the UI's pages) or one of the API's `paths` constants.
            let (route, handlers) = match call.trim_start().strip_prefix("paths::") {
                Some(constant) => {
                    let name_end = constant
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap();
                    let name = &constant[..name_end];
                    let route = api_paths()
                        .remove(name)
                        .unwrap_or_else(|| panic!("no constant paths::{name}"));
                    (route, &constant[name_end..])
                }
                None => {
                    let open = call.find('"').unwrap();
                    let close = open + 1 + call[open + 1..].find('"').unwrap();
                    (call[open + 1..close].to_owned(), &call[close + 1..])
                }
            };
            let bytes = handlers.as_bytes();
            for method in ["get", "put", "post", "delete", "patch"] {
                let needle = format!("{method}(");
                for (i, _) in handlers.match_indices(&needle) {
                    let before = if i == 0 { b' ' } else { bytes[i - 1] };
                    if !(before.is_ascii_alphanumeric() || before == b'_' || before == b':') {
                        found.insert((method.to_uppercase(), route.clone()));
                    }
                }
            }
            rest = &rest[end..];
        }
    }
    found
}

#[tokio::test]
async fn document_is_openapi_3_1_and_every_ref_resolves() {
    let api = api();
    let document = document(&api).await;
    assert!(
        document["openapi"].as_str().unwrap().starts_with("3.1."),
        "{}",
        document["openapi"]
    );
    assert_eq!(document["info"]["version"], env!("CARGO_PKG_VERSION"));
    let mut refs = Vec::new();
    collect_refs(&document, &mut refs);
    assert!(refs.len() > 50, "the document uses components");
    for target in refs {
        let pointer = target
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("{target} points outside the document"));
        assert!(
            document.pointer(pointer).is_some(),
            "{target} does not resolve"
        );
    }
}

#[test]
fn ui_routes_stay_outside_the_json_api() {
    let ui = routes_in(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/ui"));
    assert!(ui.iter().any(|(_, path)| path == "/"), "{ui:?}");
    for (method, path) in &ui {
        assert_eq!(
            method, "GET",
            "{path}: the UI acts through the JSON API only"
        );
        assert!(
            path == "/" || path.starts_with("/ui/"),
            "{path}: UI routes are / and /ui/…; JSON routes belong in openapi.json"
        );
    }
}

#[tokio::test]
async fn operations_are_exactly_the_routes() {
    let api = api();
    let document = document(&api).await;
    assert_eq!(
        routes_in_source(),
        expected(),
        "the routes registered in src/ and OPERATIONS differ: document the new route"
    );
    assert_eq!(operations(&document), expected());

    assert_eq!(
        document["security"],
        json!([{"bearerAuth": []}, {"cookieAuth": []}])
    );
    let schemes = &document["components"]["securitySchemes"];
    assert_eq!(
        (
            &schemes["bearerAuth"]["type"],
            &schemes["bearerAuth"]["scheme"]
        ),
        (&json!("http"), &json!("bearer"))
    );
    assert_eq!(
        (&schemes["cookieAuth"]["in"], &schemes["cookieAuth"]["name"]),
        (&json!("cookie"), &json!("starbridge_token"))
    );

    let declared: BTreeSet<&str> = document["tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tag| tag["name"].as_str().unwrap())
        .collect();
    let mut ids = BTreeSet::new();
    for (method, path) in OPERATIONS {
        let operation = &document["paths"][path][method.to_lowercase()];
        let id = operation["operationId"].as_str().unwrap();
        assert!(ids.insert(id), "operationId {id} is used twice");
        assert!(
            operation["summary"].is_string(),
            "{method} {path} has no summary"
        );
        for tag in operation["tags"].as_array().unwrap() {
            assert!(declared.contains(tag.as_str().unwrap()), "{tag} undeclared");
        }
        let responses = operation["responses"].as_object().unwrap();
        assert!(
            responses.keys().any(|code| code.starts_with('2')),
            "{method} {path} documents no success"
        );
        // Public operations say so; every other one names its scope and documents the refusals
        // of `--auth`.
        if PUBLIC.contains(&(*method, *path)) {
            assert_eq!(
                operation["security"],
                json!([]),
                "{method} {path} is public"
            );
            assert!(
                operation.get("x-required-scope").is_none(),
                "{method} {path}"
            );
        } else {
            assert!(operation.get("security").is_none(), "{method} {path}");
            let scope = operation["x-required-scope"].as_str();
            assert!(
                scope.is_some_and(|scope| Scope::parse(scope).is_some()),
                "{method} {path} names no scope"
            );
            for code in ["401", "403"] {
                assert!(
                    responses.contains_key(code),
                    "{method} {path} does not document {code}"
                );
            }
        }
        // Every `{param}` of the path is a documented path parameter.
        let item = &document["paths"][path];
        let mut params: Vec<Value> = Vec::new();
        for list in [&item["parameters"], &operation["parameters"]] {
            for param in list.as_array().into_iter().flatten() {
                let param = match param["$ref"].as_str() {
                    Some(target) => document.pointer(&target[1..]).unwrap().clone(),
                    None => param.clone(),
                };
                params.push(param);
            }
        }
        for segment in path.split('/') {
            if let Some(name) = segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                assert!(
                    params
                        .iter()
                        .any(|p| p["in"] == "path" && p["name"] == name && p["required"] == true),
                    "{method} {path}: path parameter {name} undocumented"
                );
            }
        }
    }
}

#[tokio::test]
async fn enums_match_the_core() {
    use starbridge_core::model::{ErrorKind, EventKind, JobStatus, TaskKind, TaskStatus};
    let document = document(&api()).await;
    let check = |name: &str, values: Vec<&str>| {
        let documented: Vec<&str> = document["components"]["schemas"][name]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(documented, values, "enum {name}");
    };
    check(
        "JobStatus",
        JobStatus::ALL.iter().map(|s| s.as_str()).collect(),
    );
    check(
        "TaskStatus",
        TaskStatus::ALL.iter().map(|s| s.as_str()).collect(),
    );
    check(
        "TaskKind",
        TaskKind::ALL.iter().map(|s| s.as_str()).collect(),
    );
    check(
        "ErrorKind",
        ErrorKind::ALL.iter().map(|s| s.as_str()).collect(),
    );
    check(
        "EventKind",
        EventKind::ALL.iter().map(|s| s.as_str()).collect(),
    );
    check("Scope", Scope::ALL.iter().map(|s| s.as_str()).collect());

    // Schedule policies: the core lists none, so they are listed here, through matches that stop
    // compiling when a variant is added.
    use starbridge_core::schedule::{CatchUp, Overlap};
    let overlaps: Vec<&str> = [Overlap::Skip, Overlap::Allow, Overlap::QueueOne]
        .into_iter()
        .map(|overlap| match overlap {
            Overlap::Skip | Overlap::Allow | Overlap::QueueOne => overlap.as_str(),
        })
        .collect();
    for name in &overlaps {
        assert_eq!(Overlap::parse(name).map(Overlap::as_str), Some(*name));
    }
    let policies: Vec<String> = [CatchUp::Skip, CatchUp::Once, CatchUp::All { limit: 1 }]
        .into_iter()
        .map(|catch_up| match catch_up {
            CatchUp::Skip | CatchUp::Once | CatchUp::All { .. } => {
                str_of(&serde_json::to_value(catch_up).unwrap()["policy"])
            }
        })
        .collect();
    // The values a schema allows, through `$ref`s and a `oneOf` with `null` (an `Option`).
    let documented = |pointer: &str| -> Vec<Value> {
        let mut values = Vec::new();
        let mut pending = vec![
            document
                .pointer(pointer)
                .unwrap_or_else(|| panic!("{pointer} is not documented")),
        ];
        while let Some(schema) = pending.pop() {
            if let Some(target) = schema["$ref"].as_str() {
                pending.push(document.pointer(&target[1..]).unwrap());
            }
            for branch in schema["oneOf"].as_array().into_iter().flatten().rev() {
                pending.push(branch);
            }
            values.extend(schema["enum"].as_array().into_iter().flatten().cloned());
            if schema["type"] == "null" {
                values.push(Value::Null);
            }
        }
        values.sort_by_key(Value::is_null);
        values
    };
    let mut nullable: Vec<Value> = overlaps.iter().map(|name| json!(name)).collect();
    assert_eq!(
        documented("/components/schemas/ScheduleView/properties/overlap"),
        nullable
    );
    nullable.push(Value::Null);
    assert_eq!(
        documented("/components/schemas/ScheduleRequest/properties/overlap"),
        nullable
    );
    assert_eq!(
        documented("/components/schemas/CatchUpPolicy/properties/policy"),
        policies.iter().map(|name| json!(name)).collect::<Vec<_>>()
    );
}

/// The last hand-written document, kept to prove that the generated one (since the document is
/// built from the code) still says everything it said.
const HANDWRITTEN: &str = include_str!("fixtures/openapi-handwritten.json");

/// Where the generated document knowingly says something else than the hand-written one: a
/// part of a difference's text, and why. Each must still be found.
const ALLOWED: &[(&str, &str)] = &[
    (
        ".seq: description Some(\"Increasing across all jobs; pass the last one",
        "SQLite's history ids lost AUTOINCREMENT (migration 20): a new event's `seq` is above \
         every stored one's, and may be one of deleted history",
    ),
    (
        ": parameter (\"traceparent\", \"header\") added",
        "a submit may carry the caller's W3C `traceparent`, which a traced job continues \
         (`--otlp-endpoint`); the hand-written document predates traces",
    ),
    (
        ".limit: description Some(\"Most jobs to select, newest first",
        "a bulk action may name its jobs by `ids`, whose number is then the default `limit`",
    ),
    (
        ".paused: description Some(\"A paused queue keeps its tasks but hands none out.\"), now",
        "a queue that stopped on error still hands out compensations: the description points to \
         `paused_reason`",
    ),
    (
        "GET /api/v1/workflows/{name}: description",
        "a workflow can be deleted now: the description says what reading a deleted one gives",
    ),
    (
        " 400: content text/plain",
        "a 400 is always a problem document (`rejections.rs` turns the framework's plain-text \
         refusals into problems); the hand-written document also listed a text/plain body that \
         is never sent",
    ),
    (
        "POST /api/v1/tasks/poll: description",
        "a poll carries the worker's completions (`complete`), reported before it claims; the \
         hand-written document predates them",
    ),
    (
        "POST /api/v1/tasks/poll 200: description",
        "the poll's answer also holds `reports`, one per completion it carried",
    ),
    (
        "POST /api/v1/tasks/poll 400: description",
        "a poll is refused whole for more than 1000 completions (the field is `complete`), which \
         the hand-written document predates; it has no query parameter or header to name",
    ),
    (
        "GET /metrics: description",
        "the hand-written description left out the writer's and the process's series",
    ),
    (
        "POST /api/v1/jobs/batch: parameter (\"Starbridge-Actor\", \"header\") added",
        "a batch submit reads the actor as a single submit does; the hand-written document did \
         not say so",
    ),
    (
        "GET /api/v1/jobs: parameter (\"parent\", \"query\") added",
        "the list filters a job's children (sub-workflows), which the hand-written document \
         predates",
    ),
    (
        "GET /api/v1/jobs 400: description",
        "a query string that does not parse is answered with a problem document naming `query` \
         (`rejections.rs`), not the plain-text message the hand-written description promised",
    ),
    (
        "POST /api/v1/tasks/{id}/fail 400: description",
        "a failure may carry `error.retry_after_ms` (a called service's `Retry-After`), refused \
         over 7 days like a check-later's `after_ms`",
    ),
    (
        ".ready: description",
        "a queue's ready count leaves out tasks parked by their step's `lock` or `rate` too (they \
         are out of the claim order, like those of a paused job), which the hand-written \
         document predates",
    ),
    (
        "waiting_reason: description",
        "a task waiting on the server (a sleep, signal, approval or callback) is running, and \
         says what it waits for: the old text said running tasks had no reason",
    ),
    (
        "description Some(\"A workflow definition (see docs/reference.md)",
        "the definition format grew step kinds and fields (`labels`, `output`, `set`, `fail`, \
         `continue_on_failure`, `workflow`): the description lists them",
    ),
    (
        "items[]|1: description Some(\"The report was refused",
        "both batch answers are one type (`BatchItem`), whose refused item is described once \
         for both: \"The job was refused: …\" (a batch completion's items are reports)",
    ),
    (
        "POST /api/v1/jobs 422: description",
        "a submission may be refused for its labels, which the description names",
    ),
    (
        "POST /api/v1/jobs/bulk/{action} 400: description",
        "a bulk action's labels may be refused, which the description names",
    ),
    (
        "POST /api/v1/jobs/bulk/{action}: summary",
        "a bulk action may delete finished jobs (`delete`), which the summary names",
    ),
    (
        "POST /api/v1/jobs/bulk/{action}: description",
        "a bulk action may delete finished jobs (`delete`), which the description explains",
    ),
    (
        "POST /api/v1/jobs/bulk/{action}: parameter (\"action\", \"path\") description",
        "`delete` is a bulk action, which the parameter's description lists",
    ),
    (
        "PUT /api/v1/schedules/{name} 422: description",
        "a schedule may be refused for its labels, which the description names",
    ),
    (
        "GET /api/v1/jobs: parameter (\"label\", \"query\") added",
        "jobs have labels now, and the list filters on them (`label=key=value`, repeatable)",
    ),
    (
        "GET /api/v1/queues: description",
        "the list is a page of queues, filtered on the server (a namespace may hold thousands of \
         per-host queues), with the prefix settings of the namespace",
    ),
    (
        "GET /api/v1/queues: parameter (",
        "the list takes `prefix`, `q`, `limit` and `cursor`, which the hand-written document \
         predates",
    ),
    (
        "GET /api/v1/queues 200",
        "the list answers a page of queues, its `next_cursor` and the prefix settings",
    ),
    (
        "schema QueueList: description",
        "the list answers a page of queues, its `next_cursor` and the prefix settings",
    ),
    (
        "GET /api/v1/queues 400: description",
        "the list names its own refusals: its filters, its cursor and its page size",
    ),
    (
        "GET /api/v1/queues/{name}",
        "the name may be a pattern (`agent-*`, a trailing `*`), whose prefix settings are \
         answered (a QueuePrefixView) instead of a queue (a QueueView)",
    ),
    (
        "PUT /api/v1/queues/{name}",
        "PUT may give settings to a pattern (`agent-*`), answered as a QueuePrefixView, and a \
         namespace holds at most 100 patterns (a 409); settings given to a queue become its own",
    ),
    (
        "POST /api/v1/tokens 422: description",
        "a token's queues may be patterns (`agent-*`), checked when it is made",
    ),
    (
        ".queues: description",
        "a token's queues may be patterns (`agent-*`), checked when it is made",
    ),
    (
        "POST /api/v1/queues/{name}/pause",
        "a queue's pause is its own: a pattern is refused",
    ),
    (
        "POST /api/v1/queues/{name}/resume",
        "a queue's pause is its own: a pattern is refused",
    ),
    (
        "POST /api/v1/webhooks: summary",
        "a subscription may hear of task events too (`events`, `steps`)",
    ),
    (
        "POST /api/v1/webhooks: description",
        "a subscription may hear of task events too: the description names them and says the \
         `Starbridge-Event` header is the body's `type`",
    ),
    (
        "POST /api/v1/webhooks 400: description",
        "an unknown event in `events` is refused too",
    ),
    (
        "POST /api/v1/webhooks 422: description",
        "`events` and `steps` are checked too",
    ),
    (
        ".states: description Some(\"Only changes to these job statuses",
        "`states` filters job status changes only, not task events",
    ),
    (
        ": description Some(\"The body of a message: a job's status changed.",
        "a message may report a task event too",
    ),
    (
        ".at: description Some(\"When the status changed, in Unix milliseconds.\")",
        "a task event's `at` is when the task changed",
    ),
    (
        "POST jobStatusChanged: summary",
        "the webhook carries task events too",
    ),
    (
        "POST jobStatusChanged: description",
        "the webhook carries task events too",
    ),
    (
        "required previous_status",
        "a task event's job has no `previous_status`",
    ),
    (
        ".previous_status: description Some(\"The status it changed from; null",
        "a task event's job has no `previous_status`",
    ),
];

/// Text with its white space folded: a description wrapped over lines says the same.
fn words(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The node itself, or what its `$ref` points at.
fn resolved<'a>(document: &'a Value, node: &'a Value) -> &'a Value {
    match node["$ref"].as_str() {
        Some(target) => document
            .pointer(&target[1..])
            .unwrap_or_else(|| panic!("{target} does not resolve")),
        None => node,
    }
}

/// The keywords of a schema compared as they are.
const KEYWORDS: &[&str] = &[
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "default",
    "additionalProperties",
];

/// What a schema means, whatever way it is written: `$ref`s followed, `allOf` merged, a `oneOf`
/// or `anyOf` of one schema and `null` read as that schema made nullable, `const` as an `enum`
/// of one, `null` in `type` or `enum` as nullable.
#[derive(Debug, Default, Clone)]
struct Meaning {
    types: BTreeSet<String>,
    nullable: bool,
    values: Option<Vec<Value>>,
    description: Option<String>,
    keywords: HashMap<&'static str, Value>,
    properties: std::collections::BTreeMap<String, Meaning>,
    required: BTreeSet<String>,
    items: Option<Box<Meaning>>,
    variants: Vec<Meaning>,
}

impl Meaning {
    fn of(document: &Value, schema: &Value) -> Meaning {
        if schema.get("$ref").is_some() {
            let mut target = Meaning::of(document, resolved(document, schema));
            if let Some(description) = schema["description"].as_str() {
                target.description = Some(words(description));
            }
            return target;
        }
        let mut meaning = Meaning {
            description: schema["description"].as_str().map(words),
            ..Meaning::default()
        };
        let types = match &schema["type"] {
            Value::Array(types) => types.clone(),
            Value::Null => Vec::new(),
            one => vec![one.clone()],
        };
        for kind in types {
            match kind.as_str().unwrap() {
                "null" => meaning.nullable = true,
                kind => {
                    meaning.types.insert(kind.to_owned());
                }
            }
        }
        let values = match (&schema["const"], &schema["enum"]) {
            (Value::Null, Value::Array(values)) => Some(values.clone()),
            (Value::Null, _) => None,
            (one, _) => Some(vec![one.clone()]),
        };
        if let Some(values) = values {
            meaning.nullable |= values.contains(&Value::Null);
            meaning.values = Some(values.into_iter().filter(|v| !v.is_null()).collect());
        }
        for keyword in KEYWORDS {
            if let Some(value) = schema.get(*keyword) {
                meaning.keywords.insert(keyword, value.clone());
            }
        }
        for (name, property) in schema["properties"].as_object().into_iter().flatten() {
            let property = Meaning::of(document, property);
            meaning.properties.insert(name.clone(), property);
        }
        for name in schema["required"].as_array().into_iter().flatten() {
            meaning.required.insert(str_of(name));
        }
        if let Some(items) = schema.get("items") {
            meaning.items = Some(Box::new(Meaning::of(document, items)));
        }
        for part in schema["allOf"].as_array().into_iter().flatten() {
            meaning.merge(Meaning::of(document, part));
        }
        for key in ["oneOf", "anyOf"] {
            let Some(branches) = schema[key].as_array() else {
                continue;
            };
            let mut others = Vec::new();
            for branch in branches {
                if *branch == json!({"type": "null"}) {
                    meaning.nullable = true;
                } else {
                    others.push(Meaning::of(document, branch));
                }
            }
            let bare = meaning.types.is_empty() && meaning.properties.is_empty();
            if let ([one], true) = (others.as_slice(), bare && meaning.variants.is_empty()) {
                let description = meaning.description.take().or(one.description.clone());
                meaning.merge(one.clone());
                meaning.description = description;
            } else {
                meaning.variants.extend(others);
            }
        }
        meaning
    }

    fn merge(&mut self, other: Meaning) {
        self.types.extend(other.types);
        self.nullable |= other.nullable;
        self.values = other.values.or(self.values.take());
        self.description = self.description.take().or(other.description);
        for (keyword, value) in other.keywords {
            self.keywords.entry(keyword).or_insert(value);
        }
        self.properties.extend(other.properties);
        self.required.extend(other.required);
        self.items = other.items.or(self.items.take());
        self.variants.extend(other.variants);
    }

    /// Lists in `out` what `self` (of the hand-written document) says that `new` does not.
    fn compare(&self, at: &str, new: &Meaning, out: &mut Vec<String>) {
        if self.description.is_some() && self.description != new.description {
            out.push(format!(
                "{at}: description {:?}, now {:?}",
                self.description, new.description
            ));
        }
        let pairs = [
            (
                "types",
                format!("{:?}", self.types),
                format!("{:?}", new.types),
            ),
            (
                "nullable",
                self.nullable.to_string(),
                new.nullable.to_string(),
            ),
        ];
        for (what, old, now) in pairs {
            if old != now {
                out.push(format!("{at}: {what} {old}, now {now}"));
            }
        }
        // Values and required fields are kept when each is still there: later versions add
        // more (new statuses and kinds, new fields a view always has).
        match (&self.values, &new.values) {
            (Some(old), Some(now)) => {
                for value in old.iter().filter(|value| !now.contains(value)) {
                    out.push(format!("{at}: enum value {value}"));
                }
            }
            (Some(old), None) => out.push(format!("{at}: enum {old:?}, now any value")),
            _ => {}
        }
        for name in self.required.difference(&new.required) {
            out.push(format!("{at}: required {name}"));
        }
        for (keyword, value) in &self.keywords {
            if new.keywords.get(keyword) != Some(value) {
                let now = new.keywords.get(keyword);
                out.push(format!("{at}: {keyword} {value}, now {now:?}"));
            }
        }
        for (name, property) in &self.properties {
            match new.properties.get(name) {
                Some(now) => property.compare(&format!("{at}.{name}"), now, out),
                None => out.push(format!("{at}: property {name}")),
            }
        }
        match (&self.items, &new.items) {
            (Some(items), Some(now)) => items.compare(&format!("{at}[]"), now, out),
            (Some(_), None) => out.push(format!("{at}: items")),
            _ => {}
        }
        if self.variants.len() != new.variants.len() {
            let (old, now) = (self.variants.len(), new.variants.len());
            out.push(format!("{at}: {old} alternatives, now {now}"));
        }
        for (i, (old, now)) in self.variants.iter().zip(&new.variants).enumerate() {
            old.compare(&format!("{at}|{i}"), now, out);
        }
    }
}

/// The two documents, compared part by part.
struct Comparison<'a> {
    old: &'a Value,
    new: &'a Value,
    differences: Vec<String>,
}

impl Comparison<'_> {
    fn schemas(&mut self, at: &str, old: &Value, new: &Value) {
        let old = Meaning::of(self.old, old);
        old.compare(at, &Meaning::of(self.new, new), &mut self.differences);
    }

    /// Two values that must say the same (a missing one is `default`).
    fn same(&mut self, at: &str, old: &Value, new: &Value, default: &Value) {
        let text = |value: &Value| match value {
            Value::Null => default.clone(),
            Value::String(text) => Value::String(words(text)),
            value => value.clone(),
        };
        if text(old) != text(new) {
            self.differences.push(format!("{at}: {old}, now {new}"));
        }
    }

    fn response(&mut self, at: &str, old: &Value, new: &Value) {
        let (old, new) = (resolved(self.old, old), resolved(self.new, new));
        let description = format!("{at}: description");
        self.same(
            &description,
            &old["description"],
            &new["description"],
            &Value::Null,
        );
        for (name, header) in old["headers"].as_object().into_iter().flatten() {
            let now = &new["headers"][name];
            if now.is_null() {
                self.differences.push(format!("{at}: header {name}"));
                continue;
            }
            for key in ["description", "required"] {
                let what = format!("{at}: header {name} {key}");
                self.same(&what, &header[key], &now[key], &json!(false));
            }
            self.schemas(
                &format!("{at} header {name}"),
                &header["schema"],
                &now["schema"],
            );
        }
        self.contents(at, &old["content"], &new["content"]);
    }

    /// The media types of a body or an answer, each with its schema.
    fn contents(&mut self, at: &str, old: &Value, new: &Value) {
        let (old, new) = (old.as_object(), new.as_object());
        for (media, content) in old.into_iter().flatten() {
            match new.and_then(|new| new.get(media)) {
                Some(now) => {
                    self.schemas(&format!("{at} {media}"), &content["schema"], &now["schema"])
                }
                None => self.differences.push(format!("{at}: content {media}")),
            }
        }
        for media in new.into_iter().flatten().map(|(media, _)| media) {
            if old.is_none_or(|old| !old.contains_key(media)) {
                self.differences
                    .push(format!("{at}: content {media} added"));
            }
        }
    }

    /// An operation's parameters (its path's and its own), by name and place.
    fn parameters(
        document: &Value,
        item: &Value,
        operation: &Value,
    ) -> std::collections::BTreeMap<(String, String), Value> {
        let lists = [&item["parameters"], &operation["parameters"]];
        lists
            .into_iter()
            .flat_map(|list| list.as_array().into_iter().flatten())
            .map(|parameter| {
                let parameter = resolved(document, parameter);
                let key = (str_of(&parameter["name"]), str_of(&parameter["in"]));
                (key, parameter.clone())
            })
            .collect()
    }

    fn operation(&mut self, at: &str, old: (&Value, &Value), new: (&Value, &Value)) {
        let ((old_item, old), (new_item, new)) = (old, new);
        let keys = [
            "summary",
            "description",
            "operationId",
            "tags",
            "x-required-scope",
        ];
        for key in keys.into_iter().chain(["security"]) {
            if old.get(key).is_some() {
                self.same(&format!("{at}: {key}"), &old[key], &new[key], &Value::Null);
            }
        }
        let old_parameters = Comparison::parameters(self.old, old_item, old);
        let new_parameters = Comparison::parameters(self.new, new_item, new);
        for (key, parameter) in &old_parameters {
            let Some(now) = new_parameters.get(key) else {
                self.differences.push(format!("{at}: parameter {key:?}"));
                continue;
            };
            for field in ["required", "description"] {
                let what = format!("{at}: parameter {key:?} {field}");
                self.same(&what, &parameter[field], &now[field], &json!(false));
            }
            let what = format!("{at}: parameter {key:?}");
            self.schemas(&what, &parameter["schema"], &now["schema"]);
        }
        for key in new_parameters.keys() {
            if !old_parameters.contains_key(key) {
                self.differences
                    .push(format!("{at}: parameter {key:?} added"));
            }
        }
        if old.get("requestBody").is_some() {
            let body = resolved(self.old, &old["requestBody"]);
            let now = resolved(self.new, &new["requestBody"]);
            for field in ["required", "description"] {
                let what = format!("{at}: body {field}");
                self.same(&what, &body[field], &now[field], &json!(false));
            }
            self.contents(&format!("{at}: body"), &body["content"], &now["content"]);
        }
        let responses = new["responses"].as_object();
        for (status, response) in old["responses"].as_object().unwrap() {
            match responses.and_then(|responses| responses.get(status)) {
                Some(now) => self.response(&format!("{at} {status}"), response, now),
                None => self.differences.push(format!("{at}: response {status}")),
            }
        }
        for status in responses.into_iter().flatten().map(|(status, _)| status) {
            if old["responses"].get(status).is_none() {
                self.differences
                    .push(format!("{at}: response {status} added"));
            }
        }
    }

    /// Every path item of `key` (`paths`, `webhooks`): each operation.
    fn items(&mut self, key: &str) {
        for (path, item) in self.old[key].as_object().unwrap() {
            for method in METHODS {
                let Some(operation) = item.get(*method) else {
                    continue;
                };
                let at = format!("{} {path}", method.to_uppercase());
                let new_item = &self.new[key][path];
                match new_item.get(*method) {
                    Some(now) => self.operation(&at, (item, operation), (new_item, now)),
                    None => self.differences.push(format!("{at}: operation")),
                }
            }
        }
    }

    fn components(&mut self) {
        let (old, new) = (&self.old["components"], &self.new["components"]);
        for (name, schema) in old["schemas"].as_object().unwrap() {
            match new["schemas"].get(name) {
                Some(now) => self.schemas(&format!("schema {name}"), schema, now),
                None => self.differences.push(format!("schema {name}")),
            }
        }
        for (name, response) in old["responses"].as_object().unwrap() {
            match new["responses"].get(name) {
                Some(now) => self.response(&format!("response {name}"), response, now),
                None => self.differences.push(format!("response {name}")),
            }
        }
        // `components/parameters` are not compared by themselves: utoipa writes each parameter
        // into the operations that take it, where `operation` compares it.
        for (name, scheme) in old["securitySchemes"].as_object().unwrap() {
            let at = format!("security scheme {name}");
            self.same(&at, scheme, &new["securitySchemes"][name], &Value::Null);
        }
    }
}

#[tokio::test]
async fn the_generated_document_keeps_everything_the_hand_written_one_said() {
    let new = document(&api()).await;
    let old: Value = serde_json::from_str(HANDWRITTEN).unwrap();
    let mut comparison = Comparison {
        old: &old,
        new: &new,
        differences: Vec::new(),
    };
    for key in ["title", "version", "summary", "description", "license"] {
        let at = format!("info {key}");
        comparison.same(&at, &old["info"][key], &new["info"][key], &Value::Null);
    }
    for key in ["tags", "security"] {
        comparison.same(key, &old[key], &new[key], &Value::Null);
    }
    comparison.items("paths");
    comparison.items("webhooks");
    comparison.components();

    let mut unexplained = Vec::new();
    let mut explained = BTreeSet::new();
    for difference in &comparison.differences {
        match ALLOWED
            .iter()
            .position(|(part, _)| difference.contains(part))
        {
            Some(index) => {
                explained.insert(index);
            }
            None => unexplained.push(difference.as_str()),
        }
    }
    assert!(
        unexplained.is_empty(),
        "the generated document does not say, or says otherwise, {} things the hand-written one \
         said:\n{}",
        unexplained.len(),
        unexplained.join("\n")
    );
    for (index, (part, reason)) in ALLOWED.iter().enumerate() {
        assert!(
            explained.contains(&index),
            "no longer different, drop it from ALLOWED: {part} ({reason})"
        );
    }
}

/// The document with `additionalProperties: false` added to every object schema that lists its
/// properties and says nothing about others, so a response field missing from the document fails.
fn strict(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.get("properties").is_some_and(Value::is_object)
                && !map.contains_key("additionalProperties")
            {
                map.insert("additionalProperties".to_owned(), Value::Bool(false));
            }
            map.values_mut().for_each(strict);
        }
        Value::Array(items) => items.iter_mut().for_each(strict),
        _ => {}
    }
}

/// Validates responses (and the requests that succeeded) against the document.
struct Checker {
    api: Api,
    document: Value,
    strict: Value,
    validators: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
    /// Documented (method, path, status) answered so far.
    seen: Mutex<BTreeSet<(String, String, u16)>>,
}

impl Checker {
    async fn new() -> Checker {
        Checker::with_api(api()).await
    }

    async fn with_api(api: Api) -> Checker {
        let document = document(&api).await;
        let mut strict_document = document.clone();
        strict(&mut strict_document);
        Checker {
            api,
            document,
            strict: strict_document,
            validators: Mutex::new(HashMap::new()),
            seen: Mutex::new(BTreeSet::new()),
        }
    }

    /// A validator for the schema at `pointer`, with the whole document as the root so that
    /// `#/components/...` references resolve.
    async fn validator(&self, pointer: &str) -> Arc<jsonschema::Validator> {
        let mut validators = self.validators.lock().await;
        if let Some(found) = validators.get(pointer) {
            return found.clone();
        }
        let mut root = self.strict.clone();
        root.as_object_mut().unwrap().insert(
            "$ref".to_owned(),
            Value::String(format!("#{}", fragment(pointer))),
        );
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&root)
            .unwrap_or_else(|e| panic!("schema at {pointer} does not compile: {e}"));
        let validator = Arc::new(validator);
        validators.insert(pointer.to_owned(), validator.clone());
        validator
    }

    async fn check(&self, pointer: &str, instance: &Value, what: &str) {
        let validator = self.validator(pointer).await;
        let errors: Vec<String> = validator
            .iter_errors(instance)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{what} does not match {pointer}:\n{}\n{instance:#}",
            errors.join("\n")
        );
    }

    /// The documented path template a concrete path matches, chosen as the router does: a literal
    /// segment wins over a parameter, from the left (`/jobs/bulk/pause` is `/jobs/bulk/{action}`,
    /// not `/jobs/{id}/pause`).
    fn template(&self, path: &str) -> String {
        let segments: Vec<&str> = path.split('/').collect();
        let mut best: Option<(Vec<bool>, &String)> = None;
        for template in self.document["paths"].as_object().unwrap().keys() {
            let parts: Vec<&str> = template.split('/').collect();
            if parts.len() != segments.len() {
                continue;
            }
            let literal: Vec<bool> = parts.iter().map(|part| !part.starts_with('{')).collect();
            let matches = parts
                .iter()
                .zip(&segments)
                .all(|(part, segment)| part.starts_with('{') || part == segment);
            if matches && best.as_ref().is_none_or(|(most, _)| literal > *most) {
                best = Some((literal, template));
            }
        }
        best.unwrap_or_else(|| panic!("{path} is not documented"))
            .1
            .clone()
    }

    /// Follows a `$ref` to components, returning the target and its pointer.
    fn resolve(&self, value: &Value, pointer: String) -> (Value, String) {
        match value["$ref"].as_str() {
            Some(target) => {
                let pointer = target[1..].to_owned();
                (self.document.pointer(&pointer).unwrap().clone(), pointer)
            }
            None => (value.clone(), pointer),
        }
    }

    async fn call(&self, method: &str, uri: &str, body: &str) -> Answer {
        self.call_as(method, uri, "application/json", body).await
    }

    /// Sends a request, then checks the answer against the documented response for its status
    /// and content type; when the answer is a success, checks the JSON request body too.
    async fn call_as(&self, method: &str, uri: &str, content_type: &str, body: &str) -> Answer {
        self.exchange(method, uri, content_type, body, &[]).await
    }

    /// `call` with more request headers (a token, an actor).
    async fn call_with(
        &self,
        headers: &[(&str, &str)],
        method: &str,
        uri: &str,
        body: &str,
    ) -> Answer {
        self.exchange(method, uri, "application/json", body, headers)
            .await
    }

    /// `call` with `Authorization: Bearer <token>`.
    async fn call_by(&self, token: &str, method: &str, uri: &str, body: &str) -> Answer {
        let authorization = format!("Bearer {token}");
        self.call_with(&[("authorization", &authorization)], method, uri, body)
            .await
    }

    async fn exchange(
        &self,
        method: &str,
        uri: &str,
        content_type: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut all = vec![("content-type", content_type)];
        all.extend_from_slice(headers);
        let answer = self.api.send(method, uri, &all, body).await;
        let path = uri.split('?').next().unwrap();
        let template = self.template(path);
        let lower = method.to_lowercase();
        let operation_pointer = format!("/paths/{}/{lower}", token(&template));
        let operation = self
            .document
            .pointer(&operation_pointer)
            .unwrap_or_else(|| panic!("{method} {template} is not documented"));
        let code = answer.status.as_str().to_owned();
        let what = format!("{method} {uri} → {code}");
        let Some(response) = operation["responses"].get(&code) else {
            panic!("{what} is not a documented status: {}", answer.text);
        };
        let (response, response_pointer) = self.resolve(
            response,
            format!("{operation_pointer}/responses/{}", token(&code)),
        );
        // Documented response headers: the required ones are sent, with the documented value.
        for (name, header) in response["headers"].as_object().into_iter().flatten() {
            let sent = answer.headers.get(name.as_str());
            if header["required"] == true {
                assert!(sent.is_some(), "{what}: header {name} missing");
            }
            if let (Some(sent), Some(value)) = (sent, header["schema"]["const"].as_str()) {
                assert_eq!(sent.to_str().unwrap(), value, "{what}: header {name}");
            }
        }
        if response.get("content").is_none() {
            // Documented without a body (a 204).
            assert!(
                answer.text.is_empty() && answer.content_type.is_empty(),
                "{what}: documented without a body, got {:?} ({})",
                answer.text,
                answer.content_type
            );
        } else {
            let media = answer.content_type.split(';').next().unwrap().trim();
            assert!(
                response["content"].get(media).is_some(),
                "{what}: content type {} is not documented",
                answer.content_type
            );
            let schema_pointer = format!("{response_pointer}/content/{}/schema", token(media));
            let instance = if media.ends_with("json") {
                serde_json::from_str(&answer.text)
                    .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", answer.text))
            } else {
                Value::String(answer.text.clone())
            };
            self.check(&schema_pointer, &instance, &what).await;
        }

        if answer.status.is_success() && !body.trim().is_empty() && content_type.ends_with("json") {
            let (request_body, pointer) = self.resolve(
                &operation["requestBody"],
                format!("{operation_pointer}/requestBody"),
            );
            assert!(
                request_body.is_object(),
                "{what}: request body undocumented"
            );
            let request: Value = serde_json::from_str(body).unwrap();
            let pointer = format!("{pointer}/content/application~1json/schema");
            self.check(&pointer, &request, &format!("request of {what}"))
                .await;
        }
        self.seen
            .lock()
            .await
            .insert((method.to_owned(), template, answer.status.as_u16()));
        answer
    }
}

const WORKFLOW: &str = "description: a test workflow
params: {type: object, properties: {n: {type: integer}}}
steps:
- {id: a, queue: q, command: c, compensate: {queue: q, command: undo}}
- {id: b, queue: q, command: c}
";

fn str_of(value: &Value) -> String {
    value.as_str().unwrap().to_owned()
}

#[tokio::test]
async fn responses_match_their_documented_schemas() {
    let c = Checker::new().await;
    let ok = StatusCode::OK;

    assert_eq!(c.call("GET", "/healthz", "").await.status, ok);
    assert_eq!(c.call("GET", "/metrics", "").await.status, ok);
    assert_eq!(c.call("GET", "/api/v1/openapi.json", "").await.status, ok);

    // Workflows: YAML and JSON bodies, unchanged, malformed name, invalid definition.
    let applied = c
        .call_as("PUT", "/api/v1/workflows/wf", "application/yaml", WORKFLOW)
        .await;
    assert_eq!(applied.status, StatusCode::CREATED);
    let again = c
        .call_as("PUT", "/api/v1/workflows/wf", "application/yaml", WORKFLOW)
        .await;
    assert_eq!(again.status, ok);
    let other = json!({"steps": [{"id": "x", "queue": "other", "command": "c"}]}).to_string();
    assert_eq!(
        c.call("PUT", "/api/v1/workflows/wf2", &other).await.status,
        StatusCode::CREATED
    );
    let bad_name = c.call("PUT", "/api/v1/workflows/Bad", &other).await;
    assert_eq!(bad_name.status, StatusCode::BAD_REQUEST);
    let invalid = c
        .call_as(
            "PUT",
            "/api/v1/workflows/wf3",
            "application/yaml",
            "steps:\n- {id: a, queue: q, command: c, timeout: soon}\n",
        )
        .await;
    assert_eq!(invalid.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(c.call("GET", "/api/v1/workflows", "").await.status, ok);
    let detail = c.call("GET", "/api/v1/workflows/wf?version=1", "").await;
    assert_eq!(detail.status, ok);
    let missing = c.call("GET", "/api/v1/workflows/nope", "").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    c.call("PUT", "/api/v1/workflows/doomed", &other).await;
    let deleted = c.call("DELETE", "/api/v1/workflows/doomed", "").await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let gone = c.call("DELETE", "/api/v1/workflows/doomed", "").await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    let bad_namespace = c.call("GET", "/api/v1/workflows?namespace=A!", "").await;
    assert_eq!(bad_namespace.status, StatusCode::BAD_REQUEST);

    // Jobs: created, the same key again, a key of another workflow, unknown workflow,
    // unknown field, params against the schema, nothing named.
    let submit = r#"{"workflow": "wf", "params": {"n": 1}, "key": "k-1", "priority": 2}"#;
    let created = c.call("POST", "/api/v1/jobs", submit).await;
    assert_eq!(created.status, StatusCode::CREATED);
    let job = created.json();
    let job_id = str_of(&job["id"]);
    assert_eq!(c.call("POST", "/api/v1/jobs", submit).await.status, ok);
    let conflict = c
        .call(
            "POST",
            "/api/v1/jobs",
            r#"{"workflow": "wf2", "key": "k-1"}"#,
        )
        .await;
    assert_eq!(conflict.status, StatusCode::CONFLICT);
    let unknown = c
        .call("POST", "/api/v1/jobs", r#"{"workflow": "nope"}"#)
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let field = c
        .call("POST", "/api/v1/jobs", r#"{"workflow": "wf", "parms": {}}"#)
        .await;
    assert_eq!(field.status, StatusCode::BAD_REQUEST);
    let params = c
        .call(
            "POST",
            "/api/v1/jobs",
            r#"{"workflow": "wf", "params": {"n": "x"}}"#,
        )
        .await;
    assert_eq!(params.status, StatusCode::UNPROCESSABLE_ENTITY);
    let nothing = c.call("POST", "/api/v1/jobs", "{}").await;
    assert_eq!(nothing.status, StatusCode::UNPROCESSABLE_ENTITY);
    let inline = json!({"definition": {"name": "inline", "steps": [{"id": "s", "queue": "other", "command": "c"}]}});
    let inline = c.call("POST", "/api/v1/jobs", &inline.to_string()).await;
    assert_eq!(inline.status, StatusCode::CREATED);

    // Two jobs run (wf's and the inline one): the first page of one has a next page.
    let page = c
        .call("GET", "/api/v1/jobs?status=running&limit=1", "")
        .await;
    assert_eq!(page.status, ok);
    let cursor = str_of(&page.json()["next_cursor"]);
    let next = c
        .call(
            "GET",
            &format!("/api/v1/jobs?status=running&limit=1&cursor={cursor}"),
            "",
        )
        .await;
    assert_eq!(next.status, ok);
    assert_eq!(next.json()["next_cursor"], Value::Null, "the last page");
    let filtered = c.call("GET", "/api/v1/jobs?workflow=wf&limit=5", "").await;
    assert_eq!(filtered.json()["items"].as_array().unwrap().len(), 1);
    let bad_status = c.call("GET", "/api/v1/jobs?status=done", "").await;
    assert_eq!(bad_status.status, StatusCode::BAD_REQUEST);
    let unparsable = c.call("GET", "/api/v1/jobs?limit=abc", "").await;
    assert_eq!(unparsable.status, StatusCode::BAD_REQUEST);
    assert_eq!(unparsable.content_type, "application/problem+json");
    let over_page = c.call("GET", "/api/v1/jobs?limit=1001", "").await;
    assert_eq!(over_page.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        c.call("GET", &format!("/api/v1/jobs/{job_id}"), "")
            .await
            .status,
        ok
    );
    let no_job = c.call("GET", "/api/v1/jobs/job_nope", "").await;
    assert_eq!(no_job.status, StatusCode::NOT_FOUND);

    // Creation time filters: `created_after` takes the time itself, `created_before` does not; a
    // `+` offset must be sent as `%2B` (a bare `+` is a space, so a malformed time).
    let created_at = str_of(&job["created_at"]);
    let since = c
        .call(
            "GET",
            &format!("/api/v1/jobs?workflow=wf&created_after={created_at}"),
            "",
        )
        .await;
    assert_eq!(since.status, ok);
    assert_eq!(since.json()["items"][0]["id"], job["id"]);
    let until = c
        .call(
            "GET",
            &format!("/api/v1/jobs?workflow=wf&created_before={created_at}"),
            "",
        )
        .await;
    assert_eq!(until.status, ok);
    assert_eq!(until.json()["items"], json!([]));
    let offset = c
        .call(
            "GET",
            "/api/v1/jobs?created_before=2000-01-01T01:00:00%2B01:00",
            "",
        )
        .await;
    assert_eq!(offset.status, ok, "{}", offset.text);
    assert_eq!(offset.json()["items"], json!([]));
    for (query, field) in [
        ("created_after=yesterday", "created_after"),
        ("created_after=2000-01-01T00:00:00+00:00", "created_after"),
        ("created_before=2026-13-01T00:00:00Z", "created_before"),
    ] {
        let answer = c.call("GET", &format!("/api/v1/jobs?{query}"), "").await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(answer.json()["errors"][0]["field"], field, "{query}");
    }

    // A lock with one slot: the second job waits queued, and says so; its task says why it is
    // not claimed (nobody polls `other`).
    let locked = "lock: {key: 'db-${{ params.db }}', slots: 1}\n\
        steps:\n- {id: a, queue: other, command: c}\n";
    let applied = c
        .call_as(
            "PUT",
            "/api/v1/workflows/locked",
            "application/yaml",
            locked,
        )
        .await;
    assert_eq!(applied.status, StatusCode::CREATED, "{}", applied.text);
    let submit = r#"{"workflow": "locked", "params": {"db": "main"}}"#;
    let holder = c.call("POST", "/api/v1/jobs", submit).await;
    assert_eq!(holder.status, StatusCode::CREATED);
    let holder = holder.json();
    assert_eq!(
        (
            &holder["status"],
            &holder["lock"],
            &holder["waiting_reason"]
        ),
        (&json!("running"), &json!("db-main"), &Value::Null)
    );
    assert!(holder["tasks"][0]["waiting_reason"].is_string(), "{holder}");
    let waiter = c.call("POST", "/api/v1/jobs", submit).await;
    assert_eq!(waiter.status, StatusCode::CREATED);
    let waiter = waiter.json();
    assert_eq!(waiter["status"], "queued");
    assert_eq!(
        waiter["waiting_reason"],
        "waiting for lock db-main (1/1 held)"
    );
    let listed = c
        .call("GET", "/api/v1/jobs?workflow=locked&status=queued", "")
        .await;
    assert_eq!(listed.status, ok);
    assert_eq!(
        listed.json()["items"][0]["waiting_reason"],
        "waiting for lock db-main"
    );

    // The worker protocol: poll, heartbeat, check later, complete, fail for good.
    let poll = r#"{"worker_id": "w", "queues": ["q"], "max_tasks": 1, "wait_ms": 0}"#;
    let claim = || async {
        let answer = c.call("POST", "/api/v1/tasks/poll", poll).await;
        assert_eq!(answer.status, ok);
        let task = answer.json()["tasks"][0].clone();
        assert!(task.is_object(), "a task was ready: {}", answer.text);
        (str_of(&task["id"]), task["lease_token"].clone())
    };
    let bad_poll = c
        .call(
            "POST",
            "/api/v1/tasks/poll",
            r#"{"worker_id": "w", "queues": []}"#,
        )
        .await;
    assert_eq!(bad_poll.status, StatusCode::BAD_REQUEST);
    let (a, token_a) = claim().await;
    let heartbeat = json!({"lease_token": token_a, "progress": {"done": 1}}).to_string();
    let beat = c
        .call("POST", &format!("/api/v1/tasks/{a}/heartbeat"), &heartbeat)
        .await;
    assert_eq!(beat.status, ok);
    let stale = json!({"lease_token": "stale"}).to_string();
    let stale = c
        .call("POST", &format!("/api/v1/tasks/{a}/heartbeat"), &stale)
        .await;
    assert_eq!(stale.status, StatusCode::CONFLICT);
    let no_task = json!({"lease_token": "t"}).to_string();
    let no_task = c
        .call("POST", "/api/v1/tasks/tsk_nope/heartbeat", &no_task)
        .await;
    assert_eq!(no_task.status, StatusCode::NOT_FOUND);
    let later = json!({"lease_token": token_a, "after_ms": 0, "progress": {"step": 2}});
    let later = c
        .call(
            "POST",
            &format!("/api/v1/tasks/{a}/check-later"),
            &later.to_string(),
        )
        .await;
    assert_eq!(later.status, ok);
    let (a_again, token_a) = claim().await;
    assert_eq!(a_again, a);
    let done = json!({"lease_token": token_a, "output": {"id": 7}, "logs": {"stdout": "ok"}});
    let done = c
        .call(
            "POST",
            &format!("/api/v1/tasks/{a}/complete"),
            &done.to_string(),
        )
        .await;
    assert_eq!(done.status, ok);
    let (b, token_b) = claim().await;
    let blank = json!({"lease_token": token_b, "error": {"message": " "}}).to_string();
    let blank = c
        .call("POST", &format!("/api/v1/tasks/{b}/fail"), &blank)
        .await;
    assert_eq!(blank.status, StatusCode::BAD_REQUEST);
    let failed =
        json!({"lease_token": token_b, "error": {"message": "disk full", "retryable": false}});
    let failed = c
        .call(
            "POST",
            &format!("/api/v1/tasks/{b}/fail"),
            &failed.to_string(),
        )
        .await;
    assert_eq!(failed.status, ok);
    assert_eq!(failed.json()["job_status"], "compensating");
    let (undo, token_undo) = claim().await;
    let undone = json!({"lease_token": token_undo}).to_string();
    let undone = c
        .call("POST", &format!("/api/v1/tasks/{undo}/complete"), &undone)
        .await;
    assert_eq!(undone.status, ok);
    assert_eq!(undone.json()["job_status"], "failed");
    let view = c.call("GET", &format!("/api/v1/jobs/{job_id}"), "").await;
    assert_eq!(view.json()["status"], "failed");
    let events = c
        .call(
            "GET",
            &format!("/api/v1/jobs/{job_id}/events?after=0&limit=500"),
            "",
        )
        .await;
    assert_eq!(events.status, ok);

    // Operator actions.
    let retried = c
        .call(
            "POST",
            &format!("/api/v1/jobs/{job_id}/retry"),
            r#"{"reason": "fixed"}"#,
        )
        .await;
    assert_eq!(retried.status, ok);
    let doomed = c
        .call("POST", "/api/v1/jobs", r#"{"workflow": "wf2"}"#)
        .await;
    let doomed = format!("/api/v1/jobs/{}", str_of(&doomed.json()["id"]));
    let unfinished = c.call("DELETE", &doomed, "").await;
    assert_eq!(
        unfinished.status,
        StatusCode::CONFLICT,
        "{}",
        unfinished.text
    );
    c.call("POST", &format!("{doomed}/cancel"), "").await;
    let deleted = c.call("DELETE", &doomed, "").await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.text);
    let gone = c.call("DELETE", &doomed, "").await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    let second = c
        .call("POST", "/api/v1/jobs", r#"{"workflow": "wf2"}"#)
        .await;
    let second_id = str_of(&second.json()["id"]);
    let act = |action: &'static str, body: &'static str| {
        let uri = format!("/api/v1/jobs/{second_id}/{action}");
        let c = &c;
        async move { c.call("POST", &uri, body).await }
    };
    let paused = act("pause", "").await;
    assert_eq!(paused.status, ok);
    assert_eq!(paused.json()["waiting_reason"], "paused by an operator");
    assert_eq!(act("pause", "").await.status, StatusCode::CONFLICT);
    assert_eq!(act("resume", r#"{"reason": "done"}"#).await.status, ok);
    assert_eq!(act("cancel", r#"{"compensate": false}"#).await.status, ok);
    let unknown_step = act("rerun", r#"{"step": "nope"}"#).await;
    assert_eq!(unknown_step.status, StatusCode::CONFLICT);
    let rerun = act("rerun", r#"{"step": "x", "reason": "again"}"#).await;
    assert_eq!(rerun.status, ok);
    let task = rerun.json()["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["step"] == "x" && t["status"] == "ready")
        .cloned()
        .expect("the rerun step is ready");
    let skip = format!(
        "/api/v1/jobs/{second_id}/tasks/{}/skip",
        str_of(&task["id"])
    );
    let skipped = c
        .call(
            "POST",
            &skip,
            r#"{"output": {"by": "hand"}, "reason": "manual"}"#,
        )
        .await;
    assert_eq!(skipped.status, ok);
    let no_such = format!("/api/v1/jobs/{second_id}/tasks/tsk_nope/skip");
    assert_eq!(
        c.call("POST", &no_such, "").await.status,
        StatusCode::NOT_FOUND
    );

    // Requeue and fail of one task, with their refusals.
    let skipped_task = format!("/api/v1/jobs/{second_id}/tasks/{}", str_of(&task["id"]));
    let requeue_ended = c
        .call(
            "POST",
            &format!("{skipped_task}/requeue"),
            r#"{"reason": "host drains"}"#,
        )
        .await;
    assert_eq!(requeue_ended.status, StatusCode::CONFLICT);
    let no_reason = c
        .call(
            "POST",
            &format!("{skipped_task}/requeue"),
            r#"{"reason": " "}"#,
        )
        .await;
    assert_eq!(no_reason.status, StatusCode::BAD_REQUEST);
    let third = c
        .call("POST", "/api/v1/jobs", r#"{"workflow": "wf2"}"#)
        .await;
    assert_eq!(third.status, StatusCode::CREATED);
    let poll_other = r#"{"worker_id": "w", "queues": ["other"], "max_tasks": 1, "wait_ms": 0}"#;
    let polled = c
        .call("POST", "/api/v1/tasks/poll", poll_other)
        .await
        .json();
    let ready = polled["tasks"][0].clone();
    let requeue = format!(
        "/api/v1/jobs/{}/tasks/{}/requeue",
        str_of(&ready["job_id"]),
        str_of(&ready["id"])
    );
    let requeued = c
        .call("POST", &requeue, r#"{"reason": "host drains"}"#)
        .await;
    assert_eq!(requeued.status, ok, "{}", requeued.text);
    let revoked = json!({"lease_token": ready["lease_token"]}).to_string();
    let told = c
        .call(
            "POST",
            &format!("/api/v1/tasks/{}/heartbeat", str_of(&ready["id"])),
            &revoked,
        )
        .await;
    assert_eq!(told.status, StatusCode::CONFLICT);
    assert!(told.text.contains("host drains"), "{}", told.text);
    let polled_job = str_of(&ready["job_id"]);
    let fail = format!(
        "/api/v1/jobs/{polled_job}/tasks/{}/fail",
        str_of(&ready["id"])
    );
    assert_eq!(
        c.call("POST", &fail, r#"{"error": ""}"#).await.status,
        StatusCode::BAD_REQUEST
    );
    let failed = c
        .call(
            "POST",
            &fail,
            r#"{"error": "the disk is gone", "reason": "by hand"}"#,
        )
        .await;
    assert_eq!(failed.status, ok);
    assert_eq!(
        c.call("POST", &fail, r#"{"error": "again"}"#).await.status,
        StatusCode::CONFLICT
    );
    let no_task = format!("/api/v1/jobs/{polled_job}/tasks/tsk_nope/fail");
    assert_eq!(
        c.call("POST", &no_task, r#"{"error": "x"}"#).await.status,
        StatusCode::NOT_FOUND
    );

    // Waiting: a signal taken by the step waiting for it, an approval, a task handed to another
    // system and finished through its callback token; with their refusals.
    let waits = json!({"steps": [
        {"id": "paid", "signal": "payment"},
        {"id": "ok", "approval": {"prompt": "Go?"}},
        {"id": "ext", "queue": "callbacks", "command": "c"}
    ]});
    let applied = c
        .call("PUT", "/api/v1/workflows/waits", &waits.to_string())
        .await;
    assert_eq!(applied.status, StatusCode::CREATED);
    let waiting_job = || async {
        let job = c
            .call("POST", "/api/v1/jobs", r#"{"workflow": "waits"}"#)
            .await;
        assert_eq!(job.status, StatusCode::CREATED);
        let id = str_of(&job.json()["id"]);
        let signal = format!("/api/v1/jobs/{id}/signals/payment");
        let sent = c
            .call("POST", &signal, r#"{"payload": {"n": 5}, "id": "p-1"}"#)
            .await;
        assert_eq!(sent.status, StatusCode::ACCEPTED, "{}", sent.text);
        assert_eq!(sent.json()["taken"], true);
        let job = c
            .call("GET", &format!("/api/v1/jobs/{id}"), "")
            .await
            .json();
        let task = job["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["step"] == "ok")
            .map(|t| str_of(&t["id"]))
            .unwrap();
        (id, signal, task)
    };
    let (waiting, signal, approval) = waiting_job().await;
    assert_eq!(c.call("POST", &signal, r#"{"id": "p-1"}"#).await.status, ok);
    let unknown = format!("/api/v1/jobs/{waiting}/signals/refund");
    assert_eq!(
        c.call("POST", &unknown, "").await.status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let pending = c.call("GET", "/api/v1/approvals", "").await;
    assert_eq!(pending.status, ok);
    assert_eq!(pending.json()["items"][0]["prompt"], "Go?");
    let decide =
        |job: &str, task: &str, verdict: &str| format!("/api/v1/jobs/{job}/tasks/{task}/{verdict}");
    let approved = c
        .call(
            "POST",
            &decide(&waiting, &approval, "approve"),
            r#"{"comment": "fine"}"#,
        )
        .await;
    assert_eq!(approved.status, ok, "{}", approved.text);
    let twice = c
        .call("POST", &decide(&waiting, &approval, "reject"), "")
        .await;
    assert_eq!(twice.status, StatusCode::CONFLICT);
    let callbacks_poll = r#"{"worker_id": "w", "queues": ["callbacks"], "wait_ms": 1000}"#;
    let polled = c
        .call("POST", "/api/v1/tasks/poll", callbacks_poll)
        .await
        .json();
    let handed = polled["tasks"][0].clone();
    let (handed_id, callback) = (str_of(&handed["id"]), str_of(&handed["callback_token"]));
    let awaited = json!({"lease_token": handed["lease_token"], "timeout_ms": 60000});
    let awaited = c
        .call(
            "POST",
            &format!("/api/v1/tasks/{handed_id}/await-callback"),
            &awaited.to_string(),
        )
        .await;
    assert_eq!(awaited.status, ok, "{}", awaited.text);
    let route = |token: &str, call: &str| format!("/api/v1/callbacks/{token}/{call}");
    assert_eq!(
        c.call("POST", &route(&callback, "heartbeat"), "")
            .await
            .status,
        ok
    );
    let output = r#"{"output": {"done": true}}"#;
    assert_eq!(
        c.call("POST", &route(&callback, "complete"), output)
            .await
            .status,
        ok
    );
    assert_eq!(
        c.call("POST", &route(&callback, "complete"), output)
            .await
            .status,
        ok
    );
    let other = c.call("POST", &route(&callback, "complete"), "{}").await;
    assert_eq!(other.status, StatusCode::GONE);
    let never = format!("sbc_{handed_id}_9_{}", "0".repeat(64));
    assert_eq!(
        c.call("POST", &route(&never, "complete"), output)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    // A second job: rejected. A third: its callback fails the attempt before the worker
    // awaits it.
    let (rejected, _, approval) = waiting_job().await;
    let refused = c
        .call("POST", &decide(&rejected, &approval, "reject"), "")
        .await;
    assert_eq!(refused.status, ok, "{}", refused.text);
    let (failing, _, approval) = waiting_job().await;
    let approved = c
        .call("POST", &decide(&failing, &approval, "approve"), "")
        .await;
    assert_eq!(approved.status, ok);
    let polled = c
        .call("POST", "/api/v1/tasks/poll", callbacks_poll)
        .await
        .json();
    let callback = str_of(&polled["tasks"][0]["callback_token"]);
    let failed = r#"{"error": {"message": "the other system gave up", "retryable": false}}"#;
    let failed = c.call("POST", &route(&callback, "fail"), failed).await;
    assert_eq!(failed.status, ok, "{}", failed.text);

    // Queues: those the workflows name, settings changed (`null` concurrency removes the limit),
    // a queue configured before any workflow names it, pause and resume, and refusals.
    let queues = c.call("GET", "/api/v1/queues", "").await;
    assert_eq!(queues.status, ok);
    let names: Vec<String> = queues.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|queue| str_of(&queue["name"]))
        .collect();
    assert_eq!(names, ["callbacks", "other", "q"]);
    let q = c.call("GET", "/api/v1/queues/q", "").await;
    assert_eq!(q.status, ok);
    assert_eq!(q.json()["updated_at"], Value::Null);
    let settings = r#"{"mode": "serial", "priority": 5, "concurrency": 2, "max_wait": "90s"}"#;
    let configured = c.call("PUT", "/api/v1/queues/q", settings).await;
    assert_eq!(configured.status, ok);
    let view = configured.json();
    assert_eq!(
        (&view["mode"], &view["priority"], &view["concurrency"]),
        (&json!("serial"), &json!(5), &json!(2))
    );
    assert_eq!(view["max_wait_ms"], 90_000);
    let unlimited = c
        .call(
            "PUT",
            "/api/v1/queues/q",
            r#"{"concurrency": null, "max_wait": 1.5, "priority": null}"#,
        )
        .await;
    assert_eq!(unlimited.status, ok);
    let view = unlimited.json();
    assert_eq!(view["concurrency"], Value::Null);
    assert_eq!(view["max_wait_ms"], 1_500);
    assert_eq!(
        (&view["mode"], &view["priority"]),
        (&json!("serial"), &json!(5))
    );
    let fresh = c
        .call("PUT", "/api/v1/queues/team%2Fbuild?namespace=ops", "{}")
        .await;
    assert_eq!(fresh.status, ok);
    assert_eq!(
        (&fresh.json()["namespace"], &fresh.json()["name"]),
        (&json!("ops"), &json!("team/build"))
    );
    let ops = c.call("GET", "/api/v1/queues?namespace=ops", "").await;
    assert_eq!(ops.json()["items"].as_array().unwrap().len(), 1);
    let paused = c.call("POST", "/api/v1/queues/q/pause", "").await;
    assert_eq!(paused.status, ok);
    assert_eq!(paused.json()["paused"], true);
    let resumed = c.call("POST", "/api/v1/queues/q/resume", "").await;
    assert_eq!(resumed.status, ok);
    assert_eq!(resumed.json()["paused"], false);
    let refused = |body: &'static str, status: StatusCode, field: &'static str| {
        let c = &c;
        async move {
            let answer = c.call("PUT", "/api/v1/queues/q", body).await;
            assert_eq!(answer.status, status, "{body}: {}", answer.text);
            assert_eq!(answer.json()["errors"][0]["field"], field, "{body}");
        }
    };
    refused(r#"{"mode": "fast"}"#, StatusCode::BAD_REQUEST, "mode").await;
    refused(
        r#"{"max_wait": "soon"}"#,
        StatusCode::BAD_REQUEST,
        "max_wait",
    )
    .await;
    refused(r#"{"max_wait": -1}"#, StatusCode::BAD_REQUEST, "max_wait").await;
    refused(r#"{"concurency": 1}"#, StatusCode::BAD_REQUEST, "body").await;
    refused(r#"{"concurrency": -1}"#, StatusCode::BAD_REQUEST, "body").await;
    refused("", StatusCode::BAD_REQUEST, "body").await;
    refused(
        r#"{"concurrency": 0}"#,
        StatusCode::UNPROCESSABLE_ENTITY,
        "concurrency",
    )
    .await;
    refused(
        r#"{"max_wait": "0s"}"#,
        StatusCode::UNPROCESSABLE_ENTITY,
        "max_wait",
    )
    .await;
    let bad_queue = c.call("PUT", "/api/v1/queues/bad!", "{}").await;
    assert_eq!(bad_queue.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(bad_queue.json()["errors"][0]["field"], "name");
    for action in ["pause", "resume"] {
        let uri = format!("/api/v1/queues/bad!/{action}");
        let answer = c.call("POST", &uri, "").await;
        assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);
    }
    let unchanged = c.call("GET", "/api/v1/queues/q", "").await.json();
    assert_eq!(
        (
            &unchanged["mode"],
            &unchanged["concurrency"],
            &unchanged["max_wait_ms"]
        ),
        (&json!("serial"), &Value::Null, &json!(1_500)),
        "a refused change changes nothing"
    );
    let no_queue = c.call("GET", "/api/v1/queues/nope", "").await;
    assert_eq!(no_queue.status, StatusCode::NOT_FOUND);
    let other_namespace = c.call("GET", "/api/v1/queues/q?namespace=ops", "").await;
    assert_eq!(other_namespace.status, StatusCode::NOT_FOUND);
    let bad_namespace = c.call("GET", "/api/v1/queues?namespace=A!", "").await;
    assert_eq!(bad_namespace.status, StatusCode::BAD_REQUEST);
    // Patterns: settings for every queue a prefix starts, the list's filters and pages, and
    // dropping settings (a pattern's, a queue's own).
    let pattern = c
        .call("PUT", "/api/v1/queues/call*", r#"{"priority": 3}"#)
        .await;
    assert_eq!(pattern.status, ok, "{}", pattern.text);
    assert_eq!(
        (&pattern.json()["pattern"], &pattern.json()["priority"]),
        (&json!("call*"), &json!(3))
    );
    let shown = c.call("GET", "/api/v1/queues/call*", "").await;
    assert_eq!(shown.status, ok);
    assert_eq!(shown.json()["pattern"], "call*");
    let follows = c.call("GET", "/api/v1/queues/callbacks", "").await.json();
    assert_eq!(
        (
            &follows["settings_from"],
            &follows["priority"],
            &follows["own_settings"]
        ),
        (&json!("call*"), &json!(3), &json!(false))
    );
    let first = c.call("GET", "/api/v1/queues?limit=1", "").await.json();
    assert_eq!(first["items"][0]["name"], "callbacks");
    assert_eq!(first["next_cursor"], "callbacks");
    assert_eq!(first["prefixes"][0]["pattern"], "call*");
    let second = c
        .call("GET", "/api/v1/queues?limit=1&cursor=callbacks", "")
        .await
        .json();
    assert_eq!(second["items"][0]["name"], "other");
    let found = c
        .call("GET", "/api/v1/queues?q=THE&prefix=o", "")
        .await
        .json();
    assert_eq!(found["items"][0]["name"], "other");
    assert_eq!(found["next_cursor"], Value::Null);
    for query in ["limit=0", "cursor=bad!", &format!("q={}", "x".repeat(129))] {
        let answer = c.call("GET", &format!("/api/v1/queues?{query}"), "").await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{query}");
    }
    let pause_pattern = c.call("POST", "/api/v1/queues/call*/pause", "").await;
    assert_eq!(pause_pattern.status, StatusCode::UNPROCESSABLE_ENTITY);
    let dropped = c.call("DELETE", "/api/v1/queues/call*", "").await;
    assert_eq!(dropped.status, StatusCode::NO_CONTENT, "{}", dropped.text);
    let gone = c.call("GET", "/api/v1/queues/call*", "").await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    let own = c.call("DELETE", "/api/v1/queues/q", "").await;
    assert_eq!(own.status, StatusCode::NO_CONTENT);
    let defaults = c.call("GET", "/api/v1/queues/q", "").await.json();
    assert_eq!(
        (&defaults["mode"], &defaults["own_settings"]),
        (&json!("parallel"), &json!(false))
    );
    for (path, status) in [
        ("/api/v1/queues/nope", StatusCode::NOT_FOUND),
        ("/api/v1/queues/call*", StatusCode::NOT_FOUND),
        ("/api/v1/queues/bad!", StatusCode::UNPROCESSABLE_ENTITY),
    ] {
        assert_eq!(c.call("DELETE", path, "").await.status, status, "{path}");
    }

    // Schedules: created with every field, replaced with the defaults (`null` taken as absent),
    // created paused, read, paused, resumed and deleted; refusals by the handler (400) and by the
    // store (422), which change nothing.
    let none = c.call("GET", "/api/v1/schedules", "").await;
    assert_eq!(none.status, ok);
    assert_eq!(none.json()["items"], json!([]));
    let nightly = r#"{"workflow": "wf", "params": {"n": 1}, "cron": "0 3 * * *",
        "timezone": "Europe/Paris", "overlap": "queue_one",
        "catch_up": {"policy": "all", "limit": 2}, "paused": false}"#;
    let created = c.call("PUT", "/api/v1/schedules/nightly", nightly).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    let view = created.json();
    assert_eq!(view["next_fires"].as_array().unwrap().len(), 5);
    assert_eq!(view["catch_up"], json!({"policy": "all", "limit": 2}));
    let defaults = r#"{"workflow": "wf", "cron": "@hourly", "params": null, "timezone": null,
        "overlap": null, "catch_up": null}"#;
    let replaced = c.call("PUT", "/api/v1/schedules/nightly", defaults).await;
    assert_eq!(replaced.status, ok, "replacing is 200: {}", replaced.text);
    let view = replaced.json();
    assert_eq!(
        (&view["params"], &view["timezone"], &view["overlap"]),
        (&json!({}), &json!("UTC"), &json!("skip"))
    );
    assert_eq!(view["catch_up"], json!({"policy": "skip", "limit": null}));
    assert_eq!(view["created_at"], created.json()["created_at"]);
    let weekly = r#"{"workflow": "wf2", "cron": "*/10 * * * * *", "catch_up": {"policy": "all"},
        "paused": true}"#;
    let weekly = c.call("PUT", "/api/v1/schedules/weekly", weekly).await;
    assert_eq!(weekly.status, StatusCode::CREATED, "{}", weekly.text);
    assert_eq!(
        weekly.json()["catch_up"],
        json!({"policy": "all", "limit": 10})
    );
    assert_eq!(weekly.json()["next_fires"], json!([]), "paused");
    let refused =
        |uri: &'static str, body: &'static str, status: StatusCode, field: &'static str| {
            let c = &c;
            async move {
                let answer = c.call("PUT", uri, body).await;
                assert_eq!(answer.status, status, "{body}: {}", answer.text);
                assert_eq!(answer.json()["errors"][0]["field"], field, "{body}");
            }
        };
    let nightly = "/api/v1/schedules/nightly";
    let bad_request = StatusCode::BAD_REQUEST;
    for (body, field) in [
        (
            r#"{"workflow": "wf", "cron": "@daily", "overlap": "never"}"#,
            "overlap",
        ),
        (
            r#"{"workflow": "wf", "cron": "@daily", "catch_up": {"policy": "sometimes"}}"#,
            "catch_up.policy",
        ),
        (
            r#"{"workflow": "wf", "cron": "@daily", "catch_up": {"policy": "once", "limit": 3}}"#,
            "catch_up.limit",
        ),
        (
            r#"{"workflow": "wf", "cron": "@daily", "catch_up": {"policy": "all", "limit": -1}}"#,
            "body",
        ),
        (
            r#"{"workflow": "wf", "cron": "@daily", "paused": null}"#,
            "body",
        ),
        (
            r#"{"workflow": "wf", "cron": "@daily", "timezon": "UTC"}"#,
            "body",
        ),
        (r#"{"workflow": "wf"}"#, "body"),
        ("", "body"),
    ] {
        refused(nightly, body, bad_request, field).await;
    }
    refused(
        "/api/v1/schedules/nightly?namespace=A!",
        r#"{"workflow": "wf", "cron": "@daily"}"#,
        bad_request,
        "namespace",
    )
    .await;
    let unprocessable = StatusCode::UNPROCESSABLE_ENTITY;
    for (body, field) in [
        (r#"{"workflow": "wf", "cron": "0 25 * * *"}"#, "cron"),
        (
            r#"{"workflow": "wf", "cron": "@daily", "timezone": "Mars/Olympus"}"#,
            "timezone",
        ),
        (r#"{"workflow": "nope", "cron": "@daily"}"#, "workflow"),
        (
            r#"{"workflow": "wf", "cron": "@daily", "params": [1]}"#,
            "params",
        ),
        (
            r#"{"workflow": "wf", "cron": "@daily", "catch_up": {"policy": "all", "limit": 0}}"#,
            "catch_up.limit",
        ),
    ] {
        refused(nightly, body, unprocessable, field).await;
    }
    let daily = r#"{"workflow": "wf", "cron": "@daily"}"#;
    refused("/api/v1/schedules/Bad", daily, unprocessable, "name").await;
    // wf is applied in `default`, not in `ops`.
    refused(
        "/api/v1/schedules/nightly?namespace=ops",
        daily,
        unprocessable,
        "workflow",
    )
    .await;
    let schedules = c.call("GET", "/api/v1/schedules", "").await;
    assert_eq!(schedules.status, ok);
    let items = schedules.json()["items"].clone();
    let names: Vec<String> = items
        .as_array()
        .unwrap()
        .iter()
        .map(|s| str_of(&s["name"]))
        .collect();
    assert_eq!(names, ["nightly", "weekly"]);
    assert_eq!(items[0]["cron"], "@hourly", "a refused put changes nothing");
    let shown = c.call("GET", "/api/v1/schedules/nightly", "").await;
    assert_eq!(shown.status, ok);
    for uri in [
        "/api/v1/schedules/nope",
        "/api/v1/schedules/Bad",
        "/api/v1/schedules/nightly?namespace=ops",
    ] {
        let answer = c.call("GET", uri, "").await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{uri}");
    }
    let bad_namespace = c.call("GET", "/api/v1/schedules?namespace=A!", "").await;
    assert_eq!(bad_namespace.status, bad_request);
    let paused = c.call("POST", "/api/v1/schedules/nightly/pause", "").await;
    assert_eq!(paused.status, ok);
    assert_eq!(
        (&paused.json()["paused"], &paused.json()["next_fires"]),
        (&json!(true), &json!([]))
    );
    let again = c.call("POST", "/api/v1/schedules/nightly/pause", "").await;
    assert_eq!(
        again.status, ok,
        "pausing a paused schedule is not an error"
    );
    let resumed = c.call("POST", "/api/v1/schedules/nightly/resume", "").await;
    assert_eq!(resumed.status, ok);
    assert_eq!(resumed.json()["paused"], false);
    assert_eq!(resumed.json()["next_fires"].as_array().unwrap().len(), 5);
    for action in ["pause", "resume"] {
        let answer = c
            .call("POST", &format!("/api/v1/schedules/nope/{action}"), "")
            .await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{action}");
    }
    let deleted = c.call("DELETE", "/api/v1/schedules/nightly", "").await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let gone = c.call("DELETE", "/api/v1/schedules/nightly", "").await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    let gone = c.call("GET", "/api/v1/schedules/nightly", "").await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    let left = c.call("GET", "/api/v1/schedules", "").await.json();
    assert_eq!(left["items"].as_array().unwrap().len(), 1);

    // Webhooks: subscriptions refused (400 by the handler, 422 by the store or the destination
    // policy, which by default refuses local addresses, also spelled as numbers), created with and
    // without a secret, listed without secrets; a job's status changes write pending deliveries
    // (no deliverer runs here), read newest first; deleted.
    let none = c.call("GET", "/api/v1/webhooks", "").await;
    assert_eq!(none.status, ok);
    assert_eq!(none.json()["items"], json!([]));
    let refused = |body: &'static str, status: StatusCode, field: &'static str| {
        let c = &c;
        async move {
            let answer = c.call("POST", "/api/v1/webhooks", body).await;
            assert_eq!(answer.status, status, "{body}: {}", answer.text);
            assert_eq!(answer.json()["errors"][0]["field"], field, "{body}");
        }
    };
    for (body, field) in [
        (
            r#"{"url": "https://h.example/x", "states": ["done"]}"#,
            "states",
        ),
        (r#"{"url": "https://h.example/x", "states": null}"#, "body"),
        (
            r#"{"url": "https://h.example/x", "events": ["task.failed", "task.exploded"]}"#,
            "events[1]",
        ),
        (r#"{"url": "https://h.example/x", "steps": "a"}"#, "body"),
        (r#"{"url": "https://h.example/x", "topics": []}"#, "body"),
        (r#"{"workflow": "wf2"}"#, "body"),
        ("", "body"),
    ] {
        refused(body, bad_request, field).await;
    }
    refused(r#"{"url": "ftp://h.example/x"}"#, unprocessable, "url").await;
    for url in [
        "http://localhost:9/all",
        "http://2130706433/",
        "http://[::ffff:169.254.169.254]/",
        "http://exa mple.com/",
    ] {
        let body = json!({ "url": url }).to_string();
        let answer = c.call("POST", "/api/v1/webhooks", &body).await;
        assert_eq!(answer.status, unprocessable, "{url}: {}", answer.text);
        assert_eq!(answer.json()["errors"][0]["field"], "url", "{url}");
    }
    refused(
        r#"{"url": "https://h.example/x", "secret": "short"}"#,
        unprocessable,
        "secret",
    )
    .await;
    for (body, field) in [
        (r#"{"url": "https://h.example/x", "events": []}"#, "events"),
        (
            r#"{"url": "https://h.example/x", "events": ["task.failed", "task.failed"]}"#,
            "events[1]",
        ),
        (
            r#"{"url": "https://h.example/x", "events": ["task.failed"], "steps": ["a b"]}"#,
            "steps[0]",
        ),
        (r#"{"url": "https://h.example/x", "steps": ["a"]}"#, "steps"),
    ] {
        refused(body, unprocessable, field).await;
    }
    let bad_namespace = c
        .call(
            "POST",
            "/api/v1/webhooks?namespace=A!",
            r#"{"url": "https://h.example/x"}"#,
        )
        .await;
    assert_eq!(bad_namespace.status, bad_request);
    let subscribe = r#"{"url": "HTTPS://h.example/hook", "workflow": "wf2",
        "states": ["running", "paused"], "secret": "0123456789abcdef"}"#;
    let subscribed = c.call("POST", "/api/v1/webhooks", subscribe).await;
    assert_eq!(
        subscribed.status,
        StatusCode::CREATED,
        "{}",
        subscribed.text
    );
    let hook = subscribed.json();
    assert_eq!(hook["secret"], "0123456789abcdef");
    assert_eq!(hook["states"], json!(["running", "paused"]));
    assert_eq!(hook["events"], json!(["job.status_changed"]));
    assert_eq!(hook["steps"], json!([]));
    let hook_id = str_of(&hook["id"]);
    let everything = r#"{"url": "http://192.0.2.1:9/all", "workflow": null, "secret": null}"#;
    let everything = c.call("POST", "/api/v1/webhooks", everything).await;
    assert_eq!(
        everything.status,
        StatusCode::CREATED,
        "{}",
        everything.text
    );
    assert_eq!(str_of(&everything.json()["secret"]).len(), 64);
    let everything_id = str_of(&everything.json()["id"]);
    let hooks = c.call("GET", "/api/v1/webhooks", "").await;
    assert_eq!(hooks.status, ok);
    let ids: Vec<String> = hooks.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|hook| str_of(&hook["id"]))
        .collect();
    assert_eq!(
        ids,
        [hook_id.clone(), everything_id.clone()],
        "oldest first"
    );
    let elsewhere = c.call("GET", "/api/v1/webhooks?namespace=ops", "").await;
    assert_eq!(elsewhere.json()["items"], json!([]));
    let bad_namespace = c.call("GET", "/api/v1/webhooks?namespace=A!", "").await;
    assert_eq!(bad_namespace.status, bad_request);

    let watched = c
        .call("POST", "/api/v1/jobs", r#"{"workflow": "wf2"}"#)
        .await;
    assert_eq!(watched.status, StatusCode::CREATED);
    let watched_id = str_of(&watched.json()["id"]);
    let paused = c
        .call("POST", &format!("/api/v1/jobs/{watched_id}/pause"), "")
        .await;
    assert_eq!(paused.status, ok);
    let deliveries = format!("/api/v1/webhooks/{hook_id}/deliveries");
    let sent = c.call("GET", &deliveries, "").await;
    assert_eq!(sent.status, ok);
    let items = sent.json()["items"].clone();
    assert_eq!(items.as_array().unwrap().len(), 2, "{items:#}");
    let newest = &items[0];
    assert_eq!(
        (&newest["job_id"], &newest["status"], &newest["state"]),
        (&json!(watched_id), &json!("paused"), &json!("pending"))
    );
    assert_eq!(newest["attempts"], 0);
    assert_eq!(newest["payload"]["job"]["previous_status"], "running");
    assert_eq!(items[1]["payload"]["job"]["previous_status"], Value::Null);
    let one = c.call("GET", &format!("{deliveries}?limit=1"), "").await;
    assert_eq!(one.status, ok);
    assert_eq!(one.json()["items"].as_array().unwrap().len(), 1);
    for query in ["limit=0", "namespace=A!"] {
        let answer = c.call("GET", &format!("{deliveries}?{query}"), "").await;
        assert_eq!(answer.status, bad_request, "{query}");
    }
    let over_page = c.call("GET", &format!("{deliveries}?limit=1001"), "").await;
    assert_eq!(over_page.status, StatusCode::UNPROCESSABLE_ENTITY);
    let unparsable = c.call("GET", &format!("{deliveries}?limit=-1"), "").await;
    assert_eq!(unparsable.status, bad_request);
    assert_eq!(unparsable.content_type, "application/problem+json");
    for uri in [
        "/api/v1/webhooks/whk_nope/deliveries".to_owned(),
        format!("{deliveries}?namespace=ops"),
    ] {
        let answer = c.call("GET", &uri, "").await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{uri}");
    }
    let hook_uri = format!("/api/v1/webhooks/{hook_id}");
    let elsewhere = c
        .call("DELETE", &format!("{hook_uri}?namespace=ops"), "")
        .await;
    assert_eq!(elsewhere.status, StatusCode::NOT_FOUND);
    let bad_namespace = c
        .call("DELETE", &format!("{hook_uri}?namespace=A!"), "")
        .await;
    assert_eq!(bad_namespace.status, bad_request);
    let deleted = c.call("DELETE", &hook_uri, "").await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let gone = c.call("DELETE", &hook_uri, "").await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    let gone = c.call("GET", &deliveries, "").await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    let hooks = c.call("GET", "/api/v1/webhooks", "").await.json();
    assert_eq!(hooks["items"].as_array().unwrap().len(), 1);

    // Bulk actions: jobs an action does not apply to are refused, not errors; refusals of the
    // action, the body and the filter change nothing.
    let bulk = |action: &'static str, body: &'static str| {
        let c = &c;
        async move {
            c.call("POST", &format!("/api/v1/jobs/bulk/{action}"), body)
                .await
        }
    };
    let answer = bulk(
        "pause",
        r#"{"workflow": "locked", "reason": "maintenance"}"#,
    )
    .await;
    assert_eq!(answer.status, ok, "{}", answer.text);
    let result = answer.json();
    assert_eq!(
        (&result["matched"], &result["affected"]),
        (&json!(2), &json!(1))
    );
    assert_eq!(
        result["refused"][0]["id"], waiter["id"],
        "a queued job is not paused"
    );
    assert!(result["refused"][0]["reason"].is_string());
    let answer = bulk(
        "resume",
        r#"{"status": "paused", "created_after": "2000-01-01T00:00:00Z", "limit": 10}"#,
    )
    .await;
    assert_eq!(answer.status, ok, "{}", answer.text);
    assert_eq!(
        (&answer.json()["matched"], &answer.json()["affected"]),
        (&json!(2), &json!(2)),
        "the locked job and the watched one"
    );
    let answer = bulk("retry", r#"{"created_before": "2000-01-01T00:00:00Z"}"#).await;
    assert_eq!(answer.status, ok);
    assert_eq!(
        answer.json(),
        json!({"matched": 0, "affected": 0, "refused": []})
    );
    let answer = bulk(
        "cancel",
        r#"{"workflow": "locked", "compensate": true, "status": null, "limit": null}"#,
    )
    .await;
    assert_eq!(answer.status, ok, "{}", answer.text);
    assert_eq!(answer.json()["affected"], 2);
    for (action, body, field) in [
        ("explode", "{}", "action"),
        ("skip", "{}", "step"),
        ("rerun", r#"{"step": "a", "ids": ["x"]}"#, "ids[0]"),
        ("pause", r#"{"ids": []}"#, "ids"),
        ("pause", r#"{"status": "done"}"#, "status"),
        ("pause", r#"{"limit": 0}"#, "limit"),
        ("pause", r#"{"limit": 10001}"#, "limit"),
        (
            "pause",
            r#"{"created_after": "yesterday"}"#,
            "created_after",
        ),
        (
            "pause",
            r#"{"created_before": "2026-11-22"}"#,
            "created_before",
        ),
        ("cancel", r#"{"compensate": null}"#, "body"),
        ("pause", r#"{"states": ["running"]}"#, "body"),
        ("pause", "", "body"),
    ] {
        let answer = bulk(action, body).await;
        assert_eq!(
            answer.status, bad_request,
            "{action} {body}: {}",
            answer.text
        );
        assert_eq!(
            answer.json()["errors"][0]["field"],
            field,
            "{action} {body}"
        );
    }
    let cancelled = c
        .call("GET", "/api/v1/jobs?workflow=locked&status=cancelled", "")
        .await;
    assert_eq!(cancelled.json()["items"].as_array().unwrap().len(), 2);
    // The subscription to every change saw each change since it was made (the watched job's
    // creation and pause, then the bulk pause, two resumes and two cancels), as documented.
    let all = format!("/api/v1/webhooks/{everything_id}/deliveries?limit=1000");
    let all = c.call("GET", &all, "").await;
    assert_eq!(all.status, ok);
    assert_eq!(
        all.json()["items"].as_array().unwrap().len(),
        7,
        "{}",
        all.text
    );

    // API tokens: made (the whole token shown once), refused (400 by the handler, 422 by the
    // store, 409 for a name taken, 400 for a malformed actor), listed, revoked once.
    let made = c
        .call_with(
            &[("starbridge-actor", "ops-lead")],
            "POST",
            "/api/v1/tokens",
            r#"{"name": "ci", "scopes": ["submit", "work"], "namespace": "ops",
                "queues": ["q"], "reason": "for CI"}"#,
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.text);
    let ci = made.json();
    assert!(str_of(&ci["secret"]).starts_with("sbt_"), "{ci}");
    assert_eq!(
        (&ci["token"]["created_by"], &ci["token"]["revoked_at"]),
        (&json!("ops-lead"), &Value::Null)
    );
    let root = c
        .call(
            "POST",
            "/api/v1/tokens",
            r#"{"name": "root", "scopes": ["admin"], "namespace": null, "queues": null}"#,
        )
        .await;
    assert_eq!(root.status, StatusCode::CREATED, "{}", root.text);
    let root_id = str_of(&root.json()["token"]["id"]);
    assert_eq!(root.json()["token"]["created_by"], "anonymous");
    for (body, status, field) in [
        (
            r#"{"name": "x", "scopes": ["root"]}"#,
            bad_request,
            "scopes",
        ),
        (
            r#"{"name": "x", "scopes": ["read"], "namespace": "A!"}"#,
            bad_request,
            "namespace",
        ),
        (r#"{"name": "x"}"#, bad_request, "body"),
        (
            r#"{"name": "x", "scopes": ["read"], "ttl": 1}"#,
            bad_request,
            "body",
        ),
        ("", bad_request, "body"),
        (
            r#"{"name": "X", "scopes": ["read"]}"#,
            unprocessable,
            "name",
        ),
        (r#"{"name": "x", "scopes": []}"#, unprocessable, "scopes"),
        (
            r#"{"name": "x", "scopes": ["read"], "queues": ["q"]}"#,
            unprocessable,
            "queues",
        ),
        (
            r#"{"name": "x", "scopes": ["admin"], "namespace": "ops"}"#,
            unprocessable,
            "namespace",
        ),
    ] {
        let answer = c.call("POST", "/api/v1/tokens", body).await;
        assert_eq!(answer.status, status, "{body}: {}", answer.text);
        assert_eq!(answer.json()["errors"][0]["field"], field, "{body}");
    }
    let taken = c
        .call(
            "POST",
            "/api/v1/tokens",
            r#"{"name": "ci", "scopes": ["read"]}"#,
        )
        .await;
    assert_eq!(taken.status, StatusCode::CONFLICT);
    let no_actor = c
        .call_with(
            &[("starbridge-actor", "")],
            "POST",
            "/api/v1/tokens",
            r#"{"name": "x", "scopes": ["read"]}"#,
        )
        .await;
    assert_eq!(no_actor.status, bad_request);
    assert_eq!(no_actor.json()["errors"][0]["field"], "Starbridge-Actor");
    let revoked = c
        .call("DELETE", &format!("/api/v1/tokens/{root_id}"), "")
        .await;
    assert_eq!(revoked.status, ok);
    assert!(revoked.json()["revoked_at"].is_string(), "{}", revoked.text);
    let again = c
        .call("DELETE", &format!("/api/v1/tokens/{root_id}"), "")
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    let unknown = c.call("DELETE", "/api/v1/tokens/nope", "").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let tokens = c.call("GET", "/api/v1/tokens", "").await;
    assert_eq!(tokens.status, ok);
    let listed = tokens.json()["items"].clone();
    assert_eq!(
        (&listed[0]["name"], &listed[1]["name"]),
        (&json!("ci"), &json!("root")),
        "oldest first, the revoked one too: {listed:#}"
    );

    // The audit log: every accepted change of this test, newest first, of every namespace
    // unless one is named; pages through `before`; refusals.
    let audit = c.call("GET", "/api/v1/audit", "").await;
    assert_eq!(audit.status, ok);
    let entries = audit.json()["items"].clone();
    let newest = &entries[0];
    assert_eq!(
        (&newest["action"], &newest["status"], &newest["actor"]),
        (
            &json!("DELETE /api/v1/tokens/{id}"),
            &json!(200),
            &json!("anonymous")
        )
    );
    assert_eq!(newest["target"], format!("/api/v1/tokens/{root_id}"));
    let made_entry = entries
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["action"] == "POST /api/v1/tokens" && entry["status"] == 201)
        .cloned()
        .expect("the token's creation is logged");
    assert_eq!(
        (&made_entry["actor"], &made_entry["reason"]),
        (&json!("anonymous"), &Value::Null),
        "the last creation (root) comes first"
    );
    assert!(
        entries
            .as_array()
            .unwrap()
            .iter()
            .any(|entry| entry["reason"] == "for CI" && entry["actor"] == "ops-lead"),
        "{entries:#}"
    );
    let page = c.call("GET", "/api/v1/audit?limit=2", "").await;
    assert_eq!(page.status, ok);
    let cursor = page.json()["next_cursor"].as_i64().expect("a full page");
    let next = c
        .call("GET", &format!("/api/v1/audit?limit=2&before={cursor}"), "")
        .await;
    assert_eq!(next.status, ok);
    assert!(next.json()["items"][0]["seq"].as_i64().unwrap() < cursor);
    let ops = c.call("GET", "/api/v1/audit?namespace=ops", "").await;
    assert_eq!(ops.status, ok);
    let ops = ops.json()["items"].clone();
    assert!(!ops.as_array().unwrap().is_empty(), "the queue of ops");
    assert!(
        ops.as_array()
            .unwrap()
            .iter()
            .all(|entry| entry["namespace"] == "ops"),
        "{ops:#}"
    );
    for query in ["limit=0", "limit=1001", "namespace=A!"] {
        let answer = c.call("GET", &format!("/api/v1/audit?{query}"), "").await;
        assert_eq!(answer.status, bad_request, "{query}");
    }
    let unparsable = c.call("GET", "/api/v1/audit?before=abc", "").await;
    assert_eq!(unparsable.status, bad_request);
    assert_eq!(unparsable.content_type, "application/problem+json");
    // Batch forms, in a namespace of their own: each item answers its own result or problem.
    let applied = c
        .call_as(
            "PUT",
            "/api/v1/workflows/bw?namespace=batch",
            "application/yaml",
            "steps:\n- {id: s, queue: bq, command: c}\n",
        )
        .await;
    assert_eq!(applied.status, StatusCode::CREATED);
    let jobs = json!({"jobs": [
        {"workflow": "bw", "key": "b-1"},
        {"workflow": "nope"},
        {"workflow": "bw", "key": "b-1"},
        {"workflow": "bw", "params": {"n": 2}},
    ]});
    let submitted = c
        .call(
            "POST",
            "/api/v1/jobs/batch?namespace=batch",
            &jobs.to_string(),
        )
        .await;
    assert_eq!(submitted.status, ok, "{}", submitted.text);
    let items = submitted.json()["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 4);
    assert_eq!(items[0]["created"], true);
    assert_eq!(items[1]["error"]["status"], 404);
    assert_eq!(items[2]["created"], false);
    assert_eq!(items[2]["id"], items[0]["id"]);
    assert_eq!(items[3]["status"], "running");
    for empty in [r#"{"jobs": []}"#, r#"{"jobs": [{}], "more": 1}"#] {
        let refused = c
            .call("POST", "/api/v1/jobs/batch?namespace=batch", empty)
            .await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{empty}");
    }
    // A subscription to task events: its deliveries validate against the documented payload.
    let task_hook = c
        .call(
            "POST",
            "/api/v1/webhooks?namespace=batch",
            r#"{"url": "http://192.0.2.1:9/tasks", "events": ["task.started", "task.succeeded"]}"#,
        )
        .await;
    assert_eq!(task_hook.status, StatusCode::CREATED, "{}", task_hook.text);
    let task_hook_id = str_of(&task_hook.json()["id"]);
    let poll = r#"{"worker_id": "w", "queues": ["bq"], "max_tasks": 10, "namespace": "batch"}"#;
    let polled = c.call("POST", "/api/v1/tasks/poll", poll).await.json();
    let tasks = polled["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2);
    let reports = json!({"tasks": [
        {"id": tasks[0]["id"], "lease_token": tasks[0]["lease_token"], "output": {"x": 1}},
        {"id": tasks[1]["id"], "lease_token": "stale"},
        {"id": "tsk_nope", "lease_token": "t"},
        {"id": "not-a-task", "lease_token": "t"},
    ]});
    let completed = c
        .call("POST", "/api/v1/tasks/complete", &reports.to_string())
        .await;
    assert_eq!(completed.status, ok, "{}", completed.text);
    let items = completed.json()["items"].as_array().unwrap().clone();
    assert_eq!(items[0]["task_status"], "succeeded");
    assert_eq!(items[0]["job_status"], "succeeded");
    let task_events = c
        .call(
            "GET",
            &format!("/api/v1/webhooks/{task_hook_id}/deliveries?namespace=batch"),
            "",
        )
        .await;
    assert_eq!(task_events.status, ok);
    let mut types: Vec<String> = task_events.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|delivery| str_of(&delivery["payload"]["type"]))
        .collect();
    types.sort();
    assert_eq!(types, ["task.started", "task.started", "task.succeeded"]);
    assert_eq!(items[1]["error"]["status"], 409);
    assert_eq!(items[2]["error"]["status"], 404);
    assert_eq!(items[3]["error"]["status"], 404);
    let refused = c
        .call("POST", "/api/v1/tasks/complete", r#"{"tasks": []}"#)
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    // A poll carrying completions: the success already reported, sent again under its lease,
    // is answered as before; the stale one is refused; more than 1000 are refused whole.
    let carrying = json!({"worker_id": "w", "queues": ["bq"], "namespace": "batch", "complete": [
        {"id": tasks[0]["id"], "lease_token": tasks[0]["lease_token"], "output": {"x": 1}},
        {"id": tasks[1]["id"], "lease_token": "stale"},
    ]});
    let carried = c
        .call("POST", "/api/v1/tasks/poll", &carrying.to_string())
        .await;
    assert_eq!(carried.status, ok, "{}", carried.text);
    let carried = carried.json();
    assert_eq!(carried["reports"][0]["task_status"], "succeeded");
    assert_eq!(carried["reports"][1]["error"]["status"], 409);
    assert_eq!(carried["tasks"], json!([]));
    let too_many: Vec<Value> = (0..1001)
        .map(|_| json!({"id": "tsk_x", "lease_token": "t"}))
        .collect();
    let overfull = json!({"worker_id": "w", "queues": ["bq"], "complete": too_many});
    let refused = c
        .call("POST", "/api/v1/tasks/poll", &overfull.to_string())
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(refused.json()["errors"][0]["field"], "complete");

    assert_eq!(c.call("GET", "/metrics", "").await.status, ok);
    // The dashboard's figures: the rollup's first run samples the queues of the namespace.
    c.api.engine.roll_up().await.unwrap();
    let minutes = c
        .call("GET", "/api/v1/stats/minutes?namespace=batch&window=1d", "")
        .await;
    assert_eq!(minutes.status, ok, "{}", minutes.text);
    let refused = c.call("GET", "/api/v1/stats/minutes?window=1w", "").await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);

    // Every documented operation answered a success at least once.
    let seen = c.seen.lock().await;
    for (method, path) in OPERATIONS {
        assert!(
            seen.iter()
                .any(|(m, p, s)| m == method && p == path && (200..300).contains(s)),
            "no successful {method} {path} was checked"
        );
    }
}

#[tokio::test]
async fn answers_given_before_the_handler_are_as_documented() {
    let c = Checker::new().await;
    // A body over the 4 MiB default limit.
    let big = format!("{{\"workflow\": \"{}\"}}", "x".repeat(5 << 20));
    let answer = c.call("POST", "/api/v1/jobs", &big).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    let big = format!(
        "{{\"workflow\": \"wf\", \"cron\": \"@daily\", \"params\": {{\"x\": \"{}\"}}}}",
        "x".repeat(5 << 20)
    );
    let answer = c.call("PUT", "/api/v1/schedules/big", &big).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    // A change over the body limit (4 MiB by default): refused before anything else, as a
    // problem naming the limit, even where the handler reads no body.
    let huge = format!("{{\"reason\": \"{}\"}}", "x".repeat(5 << 20));
    for (method, uri) in [
        ("POST", "/api/v1/jobs"),
        ("DELETE", "/api/v1/schedules/nightly"),
        ("POST", "/api/v1/tokens"),
    ] {
        let answer = c.call(method, uri, &huge).await;
        assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE, "{uri}");
        assert_eq!(answer.content_type, "application/problem+json", "{uri}");
        assert_eq!(answer.json()["type"], "/problems/limit-exceeded", "{uri}");
    }
    // A known path with another method: a 405 problem, as `info.description` says.
    let answer = c.api.send("DELETE", "/api/v1/jobs", &[], "").await;
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(answer.content_type, "application/problem+json");
    c.check("/components/schemas/Problem", &answer.json(), "a 405")
        .await;
    // An unknown path: a 404 problem.
    let answer = c.api.send("GET", "/api/v2/nothing", &[], "").await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.content_type, "application/problem+json");
    c.check(
        "/components/schemas/Problem",
        &answer.json(),
        "the fallback",
    )
    .await;
}

/// A request refused before routing, and how.
struct Refusal<'a> {
    method: &'a str,
    uri: &'a str,
    body: &'a str,
    headers: Vec<(&'a str, &'a str)>,
    status: u16,
    kind: &'a str,
}

#[tokio::test]
async fn refusals_before_routing_are_as_documented() {
    let c = Checker::new().await;
    let job = r#"{"workflow": "wf"}"#;
    let length = job.len().to_string();
    let json = ("content-type", "application/json");
    let many: Vec<(String, &str)> = (0..101).map(|n| (format!("x-probe-{n}"), "1")).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    let refusal = |method, uri, body, headers, status, kind| Refusal {
        method,
        uri,
        body,
        headers,
        status,
        kind,
    };
    let cases = [
        refusal(
            "POST",
            "/api/v1/jobs",
            job,
            vec![("content-type", "text/plain"), ("content-length", &length)],
            415,
            "unsupported-media-type",
        ),
        refusal(
            "PUT",
            "/api/v1/workflows/wf",
            "steps: []",
            vec![("content-length", "9")],
            415,
            "unsupported-media-type",
        ),
        refusal(
            "POST",
            "/api/v1/jobs",
            job,
            vec![
                json,
                ("host", "127.0.0.1:7433"),
                ("origin", "https://evil.example"),
            ],
            403,
            "cross-origin",
        ),
        refusal(
            "DELETE",
            "/api/v1/schedules/nightly",
            "",
            vec![("sec-fetch-site", "cross-site")],
            403,
            "cross-origin",
        ),
        refusal(
            "GET",
            "/api/v1/jobs",
            "",
            vec![("host", "rebound.evil.example")],
            403,
            "host-not-allowed",
        ),
        refusal(
            "GET",
            "/healthz",
            "",
            vec![("host", "rebound.evil.example")],
            403,
            "host-not-allowed",
        ),
        refusal(
            "GET",
            "/api/v1/jobs?workflow=a%00b",
            "",
            vec![],
            422,
            "validation",
        ),
        refusal(
            "POST",
            "/api/v1/jobs",
            r#"{"workflow": "wf", "params": {"n": 123456789012345678901234}}"#,
            vec![json],
            422,
            "validation",
        ),
        refusal(
            "POST",
            "/api/v1/webhooks",
            r#"{"url": "https://hooks.example/\u0000"}"#,
            vec![json],
            422,
            "validation",
        ),
        refusal("GET", "/api/v1/queues", "", many, 431, "headers-too-large"),
    ];
    for case in cases {
        let (method, uri, status) = (case.method, case.uri, case.status);
        let mut request = Request::builder().method(method).uri(uri);
        for (name, value) in &case.headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Body::from(case.body.to_owned())).unwrap();
        let response = c.api.app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{method} {uri}");
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let problem: Value = serde_json::from_slice(&bytes).unwrap();
        let kind = case.kind;
        assert_eq!(
            problem["type"],
            format!("/problems/{kind}"),
            "{method} {uri}"
        );
        c.check("/components/schemas/Problem", &problem, kind).await;
        let path = uri.split('?').next().unwrap();
        let operation = &c.document["paths"][c.template(path)][method.to_lowercase()];
        assert!(
            operation["responses"].get(status.to_string()).is_some(),
            "{method} {path} does not document {status}"
        );
    }
}

/// What fires leave in a schedule's view (its last fire, job and error, a held fire), on a clock
/// that moves only when told to.
#[tokio::test]
async fn fired_schedules_match_their_documented_schema() {
    use starbridge_core::time::{Duration, Timestamp};
    let start: starbridge_api::Timestamp = "2026-11-22T10:00:30Z".parse().unwrap();
    let clock = Arc::new(ManualClock::new(Timestamp(start.as_millisecond())));
    let c = Checker::with_api(Api::with_clock(clock.clone())).await;
    let applied = c
        .call_as("PUT", "/api/v1/workflows/wf", "application/yaml", WORKFLOW)
        .await;
    assert_eq!(applied.status, StatusCode::CREATED);
    let every =
        r#"{"workflow": "wf", "params": {"n": 1}, "cron": "* * * * *", "overlap": "queue_one"}"#;
    let every = c.call("PUT", "/api/v1/schedules/every", every).await;
    assert_eq!(every.status, StatusCode::CREATED, "{}", every.text);
    assert_eq!(every.json()["next_fires"][0], "2026-11-22T10:01:00Z");
    // Params are checked against the workflow's schema only when a fire submits the job.
    let broken = r#"{"workflow": "wf", "params": {"n": "x"}, "cron": "* * * * *"}"#;
    let broken = c.call("PUT", "/api/v1/schedules/broken", broken).await;
    assert_eq!(broken.status, StatusCode::CREATED, "{}", broken.text);

    let fire = |c: &Checker| {
        clock.advance(Duration::from_secs(60));
        let store = c.api.engine.clone();
        async move { store.tick().await.unwrap() }
    };
    fire(&c).await;
    let every = c.call("GET", "/api/v1/schedules/every", "").await.json();
    assert_eq!(every["last_fire_at"], "2026-11-22T10:01:00Z");
    assert!(str_of(&every["last_job_id"]).starts_with("job_"), "{every}");
    assert_eq!(every["last_error"], Value::Null);
    let broken = c.call("GET", "/api/v1/schedules/broken", "").await.json();
    assert_eq!(broken["last_fire_at"], "2026-11-22T10:01:00Z");
    assert_eq!(broken["last_job_id"], Value::Null);
    assert!(broken["last_error"].is_string(), "{broken}");

    // The job of the first fire still runs: `queue_one` holds the next fire.
    fire(&c).await;
    let every = c.call("GET", "/api/v1/schedules/every", "").await.json();
    assert_eq!(every["pending_fire_at"], "2026-11-22T10:02:00Z", "{every}");
    let list = c.call("GET", "/api/v1/schedules", "").await;
    assert_eq!(list.status, StatusCode::OK);
    assert_eq!(list.json()["items"].as_array().unwrap().len(), 2);
}

/// With `--auth`: every operation but the public ones refuses a request without a token, with an
/// unknown or revoked one (401) and with one of too small a scope (403), and answers one of the
/// scope it documents; a token bound to a namespace that names another gets 404. Each refusal
/// matches its documented schema and headers.
#[tokio::test]
async fn refusals_of_authentication_are_as_documented() {
    let c = Checker::with_api(Api::with_auth()).await;
    let mut tokens = HashMap::new();
    for (scope, _) in SCOPES {
        let secret = c.api.token(scope.as_str(), None, &[*scope], None).await;
        tokens.insert(*scope, secret);
    }
    let revoked = c.api.token("revoked", None, &[Scope::Admin], None).await;
    let revoked_id = revoked.split('_').nth(1).unwrap().to_owned();
    let admin = tokens[&Scope::Admin].clone();
    let answer = c
        .call_by(
            &admin,
            "DELETE",
            &format!("/api/v1/tokens/{revoked_id}"),
            "",
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);

    for (method, path) in OPERATIONS {
        let operation = &c.document["paths"][path][method.to_lowercase()];
        let uri = path
            .replace("{action}", "pause")
            .replace("{id}", "x")
            .replace("{name}", "x")
            .replace("{task}", "x");
        if PUBLIC.contains(&(*method, *path)) {
            // Reaches its handler with no token: a read answers, a callback with a made-up
            // token is not found.
            let (body, expected) = if method == &"GET" {
                ("", StatusCode::OK)
            } else if path.ends_with("/fail") {
                (r#"{"error": {"message": "x"}}"#, StatusCode::NOT_FOUND)
            } else {
                ("{}", StatusCode::NOT_FOUND)
            };
            let answer = c.call(method, &uri, body).await;
            assert_eq!(answer.status, expected, "{method} {path} is public");
            continue;
        }
        for presented in [None, Some("sbt_made_up"), Some(revoked.as_str())] {
            let answer = match presented {
                None => c.call(method, &uri, "").await,
                Some(token) => c.call_by(token, method, &uri, "").await,
            };
            assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{method} {path}");
            assert_eq!(answer.json()["type"], "/problems/unauthorized");
        }
        let needed = Scope::parse(operation["x-required-scope"].as_str().unwrap()).unwrap();
        for (scope, covers) in SCOPES {
            let answer = c.call_by(&tokens[scope], method, &uri, "").await;
            if covers.contains(&needed) {
                assert!(
                    ![StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN].contains(&answer.status),
                    "{method} {path} needs {needed:?}, which {scope:?} has: {}",
                    answer.text
                );
            } else {
                assert_eq!(
                    answer.status,
                    StatusCode::FORBIDDEN,
                    "{method} {path} needs {needed:?}, which {scope:?} lacks"
                );
                assert_eq!(answer.json()["type"], "/problems/forbidden");
            }
        }
        // A token bound to namespace `a`, of the scope the operation needs, naming `b`.
        let takes_namespace = operation["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["$ref"] == "#/components/parameters/Namespace" || p["name"] == "namespace");
        if takes_namespace {
            let name = format!(
                "bound-{}",
                operation["operationId"].as_str().unwrap().to_lowercase()
            );
            let bound = c.api.token(&name, Some("a"), &[needed], None).await;
            let answer = c
                .call_by(&bound, method, &format!("{uri}?namespace=b"), "")
                .await;
            assert_eq!(answer.status, StatusCode::NOT_FOUND, "{method} {path}");
        }
    }

    // The cookie a browser sends; a worker bound to namespace `a` polling in `b`, and a worker
    // of queue `q` polling another queue.
    let cookie = format!("starbridge_token={}", tokens[&Scope::Read]);
    let answer = c
        .call_with(&[("cookie", &cookie)], "GET", "/api/v1/jobs", "")
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    let worker = c
        .api
        .token("worker-a", Some("a"), &[Scope::Work], Some(&["q"]))
        .await;
    let poll = |queue: &str, namespace: &str| {
        json!({"worker_id": "w", "queues": [queue], "namespace": namespace}).to_string()
    };
    let answer = c
        .call_by(&worker, "POST", "/api/v1/tasks/poll", &poll("q", "b"))
        .await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    let answer = c
        .call_by(&worker, "POST", "/api/v1/tasks/poll", &poll("other", "a"))
        .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    let answer = c
        .call_by(&worker, "POST", "/api/v1/tasks/poll", &poll("q", "a"))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);

    // Every protected operation answered 401 and 403, as it documents.
    let seen = c.seen.lock().await;
    for (method, path) in OPERATIONS {
        if PUBLIC.contains(&(*method, *path)) {
            continue;
        }
        for status in [401, 403] {
            assert!(
                seen.iter()
                    .any(|(m, p, s)| m == method && p == path && *s == status),
                "no {status} of {method} {path} was checked"
            );
        }
    }
}
