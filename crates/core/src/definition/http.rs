//! `http` steps: an HTTP request the built-in worker's executor sends. The step's tasks carry
//! the command [`HTTP_COMMAND`] and, as their input, the request ([`HttpRequest`]'s wire form)
//! rendered by the server, all but its secret references.
//!
//! A secret is referenced as a whole `${{ secrets.NAME }}`, inside the strings of
//! `http.headers` and `http.body` only, in a string with no other expression
//! (`"Bearer ${{ secrets.CMDB_TOKEN }}"`). Such a string is kept as written, and its place
//! is listed in the request's `secret_fields` (JSON Pointers), so that the worker, which holds
//! the secrets, resolves exactly the references the definition wrote: a param that renders to
//! the text `${{ secrets.X }}` elsewhere stays text.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::Checker;
use crate::expr::Template;
use crate::time::Duration;

/// The command of an `http` step's tasks; no other step may use it.
pub const HTTP_COMMAND: &str = "http";
/// How long one request may take unless `http.timeout` says.
pub const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(30);
/// The interval between polls of a `202 Accepted` answer's `Location` unless `poll_interval`
/// (or the answer's `Retry-After`) says.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// How long a step without a `step_timeout` polls before it fails.
pub const MAX_POLLING: Duration = Duration::from_secs(24 * 3600);
/// The methods an `http` step may send.
pub const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an HTTP request: a mapping with `url` and, optionally, `method`, `headers`, `body`, `timeout` and `success`"
)]
pub(super) struct RawHttp {
    method: Option<String>,
    url: Option<Value>,
    headers: Option<Map<String, Value>>,
    body: Option<Value>,
    timeout: Option<Value>,
    success: Option<Vec<u16>>,
}

/// What an `http` handler's request depends on besides its mapping.
pub(super) struct HttpOptions<'a> {
    /// The handler's per-attempt `timeout`: a request must fit in it.
    pub attempt_timeout: Duration,
    /// The step's `poll_interval`, when given.
    pub poll_interval: Option<&'a Value>,
    /// A `step_timeout` bounds the step, so polling needs no bound of its own.
    pub bounded: bool,
}

impl Checker {
    /// The request template of an `http` handler at `field` (`steps[0] (x).http`), with every
    /// problem noted; `None` when it cannot be compiled.
    pub(super) fn http_request(
        &mut self,
        field: &str,
        value: Value,
        options: HttpOptions<'_>,
    ) -> Option<Template> {
        let raw: RawHttp = self.read(field, value)?;
        let method = raw.method.as_deref().unwrap_or("GET").to_ascii_uppercase();
        if !METHODS.contains(&method.as_str()) {
            self.problem(
                format!("{field}.method"),
                format!(
                    "unknown method '{method}': use one of {}",
                    METHODS.join(", ")
                ),
            );
        }
        let url = match raw.url {
            Some(url @ Value::String(_)) => url,
            Some(_) => {
                self.problem(
                    format!("{field}.url"),
                    "must be a string: an http:// or https:// URL (it may contain ${{ … }} expressions)",
                );
                return None;
            }
            None => {
                self.problem(
                    format!("{field}.url"),
                    "missing: an http step needs the URL it sends its request to",
                );
                return None;
            }
        };
        self.check_url(&format!("{field}.url"), &url);
        let mut request = Map::new();
        request.insert("method".to_owned(), Value::String(method));
        request.insert("url".to_owned(), url);
        let mut secret_fields = Vec::new();
        if let Some(headers) = raw.headers {
            for (name, value) in &headers {
                let at = format!("{field}.headers.{name}");
                if !is_header_name(name) {
                    self.problem(
                        &at,
                        format!("'{name}' is not a valid header name: use letters, digits and !#$%&'*+-.^_`|~"),
                    );
                }
                if !value.is_string() {
                    self.problem(
                        &at,
                        "must be a string (it may contain ${{ … }} expressions)",
                    );
                }
            }
            let headers = Value::Object(headers);
            self.find_secrets(
                &format!("{field}.headers"),
                &headers,
                "/headers",
                &mut secret_fields,
            );
            request.insert("headers".to_owned(), headers);
        }
        if let Some(body) = raw.body {
            self.find_secrets(&format!("{field}.body"), &body, "/body", &mut secret_fields);
            request.insert("body".to_owned(), body);
        }
        let timeout = self
            .duration(format!("{field}.timeout"), raw.timeout.as_ref())
            .unwrap_or(DEFAULT_HTTP_TIMEOUT);
        if timeout > options.attempt_timeout {
            self.problem(
                format!("{field}.timeout"),
                format!(
                    "{timeout} is longer than the attempt's timeout of {}: shorten it, or raise the step's `timeout`",
                    options.attempt_timeout
                ),
            );
        }
        request.insert("timeout_ms".to_owned(), json!(timeout.as_millis()));
        if let Some(success) = raw.success {
            if success.is_empty() {
                self.problem(
                    format!("{field}.success"),
                    "must list at least one status (leave it out to accept any 2xx)",
                );
            }
            if let Some(bad) = success.iter().find(|code| !(100..=599).contains(*code)) {
                self.problem(
                    format!("{field}.success"),
                    format!("{bad} is not an HTTP status: use 100 to 599"),
                );
            }
            request.insert("success".to_owned(), json!(success));
        }
        let poll_interval = options
            .poll_interval
            .and_then(|value| self.duration(poll_interval_field(field), Some(value)))
            .unwrap_or(DEFAULT_POLL_INTERVAL);
        request.insert(
            "poll_interval_ms".to_owned(),
            json!(poll_interval.as_millis()),
        );
        if !options.bounded {
            request.insert("max_polling_ms".to_owned(), json!(MAX_POLLING.as_millis()));
        }
        if !secret_fields.is_empty() {
            request.insert("secret_fields".to_owned(), json!(secret_fields));
        }
        let request = Value::Object(request);
        let kept = |text: &str| matches!(secret_string(text), Ok(true));
        match Template::compile_keeping(&request, &kept) {
            Ok(template) => Some(template),
            Err(error) => {
                self.problem(field, error.to_string());
                None
            }
        }
    }

    /// A literal URL must be an absolute http(s) URL; any URL must hold no secret.
    fn check_url(&mut self, field: &str, url: &Value) {
        let Value::String(text) = url else { return };
        if !matches!(secret_string(text), Ok(false)) {
            self.problem(field, SECRETS_PLACE);
            return;
        }
        if text.contains("${{") {
            return;
        }
        if let Err(message) = crate::destination::http_url(text) {
            self.problem(field, message);
        }
    }

    /// Notes the JSON Pointer (under `pointer`) of every string in `value` that holds a secret
    /// reference, and a problem for every reference that is not a whole `${{ secrets.NAME }}`
    /// alone among the string's expressions.
    fn find_secrets(&mut self, field: &str, value: &Value, pointer: &str, found: &mut Vec<String>) {
        match value {
            Value::String(text) => match secret_string(text) {
                Ok(true) => found.push(pointer.to_owned()),
                Ok(false) => {}
                Err(message) => self.problem(field, message),
            },
            Value::Array(items) => {
                for (index, item) in items.iter().enumerate() {
                    self.find_secrets(
                        &format!("{field}[{index}]"),
                        item,
                        &format!("{pointer}/{index}"),
                        found,
                    );
                }
            }
            Value::Object(map) => {
                for (key, item) in map {
                    let escaped = key.replace('~', "~0").replace('/', "~1");
                    self.find_secrets(
                        &format!("{field}.{key}"),
                        item,
                        &format!("{pointer}/{escaped}"),
                        found,
                    );
                }
            }
            _ => {}
        }
    }
}

/// Where a secret may stand, as a problem's message.
pub(super) const SECRETS_PLACE: &str = "secrets may be read only in an http step's `http.headers` and `http.body`, as a whole `${{ secrets.NAME }}` (the worker resolves them; the server never sees their values)";

/// The field of the step's `poll_interval`, given its `http` field.
fn poll_interval_field(http_field: &str) -> String {
    let step = http_field.strip_suffix(".http").unwrap_or(http_field);
    format!("{step}.poll_interval")
}

/// Whether `text` holds secret references: `Ok(false)` when none, `Ok(true)` when each of its
/// expressions is a whole `${{ secrets.NAME }}`, else what is wrong.
pub(super) fn secret_string(text: &str) -> Result<bool, String> {
    let Ok(template) = Template::compile(&Value::String(text.to_owned())) else {
        // Not a template at all: compiling the request reports why.
        return Ok(false);
    };
    let reads_secrets = template
        .references()
        .iter()
        .any(|path| path.first().is_some_and(|root| root == "secrets"));
    if !reads_secrets {
        return Ok(false);
    }
    if secret_parts(text).is_some() {
        Ok(true)
    } else {
        Err("a secret is read as a whole `${{ secrets.NAME }}` (NAME: letters, digits and '_'), and a string holding one takes no other expression".to_owned())
    }
}

/// A piece of a string that holds secret references.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretPart<'t> {
    /// Text sent as it is.
    Text(&'t str),
    /// `${{ secrets.NAME }}`: the secret's name.
    Secret(&'t str),
}

/// `text` split into its text and its secret references, in order, when each of its `${{ … }}`
/// is exactly `secrets.NAME`; `None` otherwise. The worker fills in the references this reads.
pub fn secret_parts(text: &str) -> Option<Vec<SecretPart<'_>>> {
    let mut parts = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("${{") {
        if open > 0 {
            parts.push(SecretPart::Text(&rest[..open]));
        }
        let after = &rest[open + 3..];
        let close = after.find("}}")?;
        let name = after[..close].trim().strip_prefix("secrets.")?;
        if !is_secret_name(name) {
            return None;
        }
        parts.push(SecretPart::Secret(name));
        rest = &after[close + 2..];
    }
    if !rest.is_empty() {
        parts.push(SecretPart::Text(rest));
    }
    Some(parts)
}

/// A secret's name: a letter or `_`, then letters, digits and `_`.
pub fn is_secret_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// An RFC 9110 field name (a token).
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::{StepKind, Workflow};

    fn request_of(yaml: &str) -> (String, Value) {
        let workflow = Workflow::from_document("demo", yaml).expect("valid definition");
        let StepKind::Task(handler) = &workflow.steps[0].kind else {
            panic!("an http step is a task step");
        };
        let context = json!({"params": {"host": "h1", "size_gb": 5}, "job": {}, "steps": {}});
        let rendered = handler.input.as_ref().unwrap().render(&context).unwrap();
        (handler.command.clone(), rendered)
    }

    #[track_caller]
    fn refused(yaml: &str, field: &str, part: &str) {
        let error = Workflow::from_document("demo", yaml).expect_err("refused");
        assert!(
            error
                .problems
                .iter()
                .any(|p| p.field == field && p.message.contains(part)),
            "expected a problem at {field} containing {part:?}, got: {error}"
        );
    }

    #[test]
    fn an_http_step_is_a_task_whose_input_is_the_request_rendered_but_its_secrets() {
        let (command, request) = request_of(
            r#"
steps:
- id: register_host
  queue: http
  http:
    method: post
    url: "https://cmdb.internal/api/hosts/${{ params.host }}"
    headers: { Content-Type: application/json, Authorization: "Bearer ${{ secrets.CMDB_TOKEN }}" }
    body: { host: "${{ params.host }}", size: "${{ params.size_gb }}", key: "${{ secrets.KEY }}" }
    timeout: 10s
    success: [200, 201]
  poll_interval: 2s
"#,
        );
        assert_eq!(command, HTTP_COMMAND);
        assert_eq!(
            request,
            json!({
                "method": "POST",
                "url": "https://cmdb.internal/api/hosts/h1",
                "headers": {
                    "Content-Type": "application/json",
                    "Authorization": "Bearer ${{ secrets.CMDB_TOKEN }}",
                },
                "body": {"host": "h1", "size": 5, "key": "${{ secrets.KEY }}"},
                "timeout_ms": 10_000,
                "success": [200, 201],
                "poll_interval_ms": 2000,
                "max_polling_ms": MAX_POLLING.as_millis(),
                "secret_fields": ["/headers/Authorization", "/body/key"],
            })
        );
    }

    #[test]
    fn a_step_timeout_bounds_polling_and_defaults_fill_the_rest() {
        let (_, request) = request_of(
            "steps:\n- {id: ping, queue: q, http: {url: 'http://svc/health'}, step_timeout: 1h}\n",
        );
        assert_eq!(
            request,
            json!({
                "method": "GET",
                "url": "http://svc/health",
                "timeout_ms": DEFAULT_HTTP_TIMEOUT.as_millis(),
                "poll_interval_ms": DEFAULT_POLL_INTERVAL.as_millis(),
            })
        );
    }

    #[test]
    fn secrets_outside_headers_and_body_are_refused_naming_the_field() {
        refused(
            "steps:\n- {id: a, queue: q, http: {url: 'https://x/${{ secrets.T }}'}}\n",
            "steps[0] (a).http.url",
            "only in an http step's `http.headers` and `http.body`",
        );
        refused(
            "steps:\n- {id: a, queue: q, command: c, input: {t: '${{ secrets.T }}'}}\n",
            "steps[0] (a).input",
            "only in an http step's",
        );
        refused(
            "steps:\n- {id: a, queue: q, http: {url: 'https://x/', headers: {A: '${{ secrets.T }}-${{ params.x }}'}}}\n",
            "steps[0] (a).http.headers.A",
            "whole `${{ secrets.NAME }}`",
        );
    }

    #[test]
    fn fields_an_http_step_does_not_take_are_refused() {
        refused(
            "steps:\n- {id: a, queue: q, command: c, http: {url: 'https://x/'}}\n",
            "steps[0] (a).command",
            "drop `command`",
        );
        refused(
            "steps:\n- {id: a, queue: q, input: {}, http: {url: 'https://x/'}}\n",
            "steps[0] (a).input",
            "http.body",
        );
        refused(
            "steps:\n- {id: a, queue: q, command: c, poll_interval: 5s}\n",
            "steps[0] (a).poll_interval",
            "only an http step polls",
        );
        refused(
            "steps:\n- {id: a, queue: q, command: http}\n",
            "steps[0] (a).command",
            "command of http steps",
        );
        refused(
            "steps:\n- {id: a, queue: q, http: {url: 'ftp://x/'}}\n",
            "steps[0] (a).http.url",
            "http:// or https://",
        );
        refused(
            "steps:\n- {id: a, queue: q, http: {url: 'https://x/', method: BREW}}\n",
            "steps[0] (a).http.method",
            "unknown method",
        );
        refused(
            "steps:\n- {id: a, queue: q, timeout: 5s, http: {url: 'https://x/', timeout: 10s}}\n",
            "steps[0] (a).http.timeout",
            "longer than the attempt's timeout",
        );
        refused(
            "steps:\n- {id: a, queue: q, http: {url: 'https://x/', success: [700]}}\n",
            "steps[0] (a).http.success",
            "not an HTTP status",
        );
        refused(
            "steps:\n- {id: a, queue: q, http: {url: 'https://x/', headers: {'a b': x}}}\n",
            "steps[0] (a).http.headers.a b",
            "not a valid header name",
        );
    }

    #[test]
    fn a_compensation_may_be_an_http_request() {
        let workflow = Workflow::from_document(
            "demo",
            "steps:\n- id: a\n  queue: q\n  command: c\n  compensate: {queue: q, http: {method: DELETE, url: 'https://x/${{ task.output.id }}'}}\n",
        )
        .unwrap();
        let compensate = workflow.steps[0].compensate.as_ref().unwrap();
        assert_eq!(compensate.command, HTTP_COMMAND);
    }

    #[test]
    fn a_string_of_whole_secret_references_is_recognised() {
        assert_eq!(secret_string("plain"), Ok(false));
        assert_eq!(secret_string("${{ params.x }}"), Ok(false));
        assert_eq!(secret_string("Bearer ${{ secrets.CMDB_TOKEN }}"), Ok(true));
        assert_eq!(
            secret_parts("${{secrets.A}}:${{ secrets.b_2 }}"),
            Some(vec![
                SecretPart::Secret("A"),
                SecretPart::Text(":"),
                SecretPart::Secret("b_2")
            ])
        );
        for refused in [
            "${{ secrets.A }} ${{ params.x }}",
            "${{ secrets['A'] }}",
            "${{ upper(secrets.A) }}",
            "${{ secrets }}",
        ] {
            assert!(secret_string(refused).is_err(), "{refused}");
        }
    }
}
