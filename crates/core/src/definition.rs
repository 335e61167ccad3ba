//! Workflow definitions: parsing (YAML or JSON), validation with the step and field named, and the
//! compiled form the state machine runs on. Every expression is compiled here, at apply time.

use std::collections::{BTreeSet, HashMap};

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::dispatch::RateLimit;
use crate::expr::{self, Expr, Template};
use crate::labels::{self, Labels};
use crate::limits::MAX_NAME_BYTES;
use crate::model::TaskStatus;
use crate::routing::QueueRoute;
use crate::time::Duration;

mod http;

pub use http::{
    DEFAULT_HTTP_TIMEOUT, DEFAULT_POLL_INTERVAL, HTTP_COMMAND, MAX_POLLING, METHODS, SecretPart,
    is_secret_name, secret_parts,
};

/// Per-attempt timeout (and lease) of a handler that names none.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(300);
/// First retry delay of a policy that names none.
pub const DEFAULT_RETRY_INITIAL: Duration = Duration::from_secs(1);
/// Longest exponential retry delay of a policy that names none.
pub const DEFAULT_RETRY_MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// Largest number of steps in one workflow.
pub const MAX_STEPS: usize = 1000;

/// The definition document as the API takes it (`PUT /api/v1/workflows/{name}`, an inline
/// `definition`) and shows it: its OpenAPI schema (feature `openapi`). The schema names the
/// top-level fields and requires `steps`; the rules are checked when it is applied, with each step
/// and field at fault named, so they are described rather than written out as JSON Schema.
#[cfg(feature = "openapi")]
pub struct WorkflowDefinition;

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for WorkflowDefinition {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AdditionalProperties, ArrayBuilder, ObjectBuilder, Type};
        let steps = ArrayBuilder::new()
            .items(ObjectBuilder::new().schema_type(Type::Object))
            .min_items(Some(1))
            .description(Some(
                "The steps: at least one, at most the server's `--max-steps`.",
            ));
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "A workflow definition (see docs/reference.md): `name`, `description`, `params` \
                 (a JSON Schema for job params), `timeout`, `priority`, `lock` (`key`, a template \
                 over `params` and `job`, and `slots`: at most that many jobs with the same \
                 rendered key run at once, the others wait `queued`), `labels` (the default labels \
                 of its jobs: keys of 1 to 63 characters of `a-z0-9_./-`, values of at most 255 \
                 bytes), `output` (a template rendered as the job's output when it succeeds) and \
                 `steps`, each step with `id`, either `queue` and `command`, `queue` and `http` \
                 (a request the built-in HTTP executor sends: `method`, `url`, `headers`, `body`, \
                 `timeout`, `success`) or one of `workflow` (a sub-workflow, with an optional \
                 `version`), `sleep`, `sleep_until`, `signal`, `approval`, `set` and `fail`, and \
                 `depends_on`, `input`, `when`, `for_each`, `concurrency`, `timeout`, \
                 `step_timeout`, `retry`, `priority`, `compensate`, `poll_interval`, \
                 `continue_on_failure`, `lock` (`key`, `slots`: each attempt holds a slot of the \
                 rendered key from claim to end; a sub-workflow step's child holds it for its \
                 run) and `rate` (`key`, `limit` such as `10/1m`: \
                 task starts per rendered key) as its kind allows. Validated when applied; a `name` must \
                 equal the name it is applied as.",
            ))
            .additional_properties(Some(AdditionalProperties::FreeForm(true)))
            .required("steps")
            .property("steps", steps)
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for WorkflowDefinition {}

/// A validated, compiled workflow definition.
#[derive(Debug, Clone)]
pub struct Workflow {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema the job params must satisfy (checked by the engine at submit).
    pub params_schema: Option<Value>,
    pub timeout: Option<Duration>,
    pub priority: i32,
    /// At most `slots` jobs holding the same rendered key run at once.
    pub lock: Option<LockDefinition>,
    /// The default labels of the workflow's jobs (a submission's are merged over them).
    pub labels: Labels,
    pub steps: Vec<Step>,
    /// The job's output, rendered when it succeeds (over `params`, `job` and `steps`).
    pub output: Option<Template>,
    /// The normalized JSON form, stored and compared to decide whether an apply is a new version.
    pub source: Value,
}

/// A named concurrency limit: the key is a template (over `params` and `job` for a workflow's
/// lock; a step's may read `steps` and, in a fan-out, `item` and `index` too).
#[derive(Debug, Clone)]
pub struct LockDefinition {
    pub key: Template,
    pub slots: u32,
}

/// A step's rate limit per rendered key: at most `limit` task starts of the tasks with the same
/// key (across jobs and workflows of the namespace).
#[derive(Debug, Clone)]
pub struct KeyedRate {
    pub key: Template,
    pub limit: RateLimit,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a rate: a mapping with `key` and `limit` (such as `10/1m`)"
)]
struct RawRate {
    key: Value,
    limit: Value,
}

/// Largest number of slots a lock may have.
pub const MAX_LOCK_SLOTS: u32 = 1_000_000;

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a lock: a mapping with `key` and, optionally, `slots`"
)]
struct RawLock {
    key: Value,
    slots: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct Step {
    pub id: String,
    /// What the step does.
    pub kind: StepKind,
    /// Indices (into `Workflow::steps`) of the steps this one waits for.
    pub depends_on: Vec<usize>,
    pub when: Option<Expr>,
    pub for_each: Option<Expr>,
    /// At most this many fan-out items ready or running at once.
    pub concurrency: Option<u32>,
    pub priority: i32,
    /// Bound on the whole step: every attempt, backoff and check-later together.
    pub step_timeout: Option<Duration>,
    pub compensate: Option<Handler>,
    /// A terminal failure of this step is recorded and the job goes on.
    pub continue_on_failure: bool,
    /// A slot each attempt holds, from its claim to its end.
    pub lock: Option<LockDefinition>,
    /// A token each attempt takes when it is claimed.
    pub rate: Option<KeyedRate>,
}

/// What a step does. Parsing decides it in one place (`Checker::step_kind`), so a new kind is a
/// parse branch there and an arm in each `match` on it.
#[derive(Debug, Clone)]
pub enum StepKind {
    /// A task a worker runs: it is handed out on the handler's queue with its command.
    Task(Handler),
    /// A step that waits on the server, holding no worker.
    Wait(WaitStep),
    /// `set`: succeeds at once on the server, its output the rendered object.
    Set(Template),
    /// `fail`: fails the job with the rendered message (no retry); compensations run.
    Fail { message: Template },
    /// `workflow`: each attempt starts a child job of another workflow and waits for it.
    Workflow(ChildStep),
}

/// A sub-workflow step: which workflow its child jobs run, and how.
#[derive(Debug, Clone)]
pub struct ChildStep {
    pub workflow: String,
    /// A pinned version; `None` runs the latest when the parent job was created.
    pub version: Option<u32>,
    /// The child's params (default: the parent's params; in a fan-out, the item).
    pub input: Option<Template>,
    /// A child that ends `failed` or `timed_out` fails the attempt; a retry starts a new child.
    pub retry: RetryPolicy,
}

/// What a waiting step waits for.
#[derive(Debug, Clone)]
pub enum WaitStep {
    /// Until a time (`sleep`, `sleep_until`).
    Sleep(SleepSpec),
    /// For a signal of this name sent to the job (`signal`).
    Signal(String),
    /// For a person to approve or reject (`approval`); the prompt is shown to them.
    Approval { prompt: Template },
}

/// How long a sleep step sleeps.
#[derive(Debug, Clone)]
pub enum SleepSpec {
    /// `sleep`: this long from when the step starts.
    For(Duration),
    /// `sleep_until`: until the time this renders to (RFC 3339); a past time wakes at once.
    Until(Template),
}

impl Step {
    /// The handler of a task step: what a worker runs. `None` for the kinds that wait on the
    /// server (sleep, signal, approval).
    pub fn handler(&self) -> Option<&Handler> {
        match &self.kind {
            StepKind::Task(handler) => Some(handler),
            StepKind::Wait(_)
            | StepKind::Set(_)
            | StepKind::Fail { .. }
            | StepKind::Workflow(_) => None,
        }
    }

    /// The template of the input a task of this step gets: a worker's input or a child's params.
    pub fn input(&self) -> Option<&Template> {
        match &self.kind {
            StepKind::Task(handler) => handler.input.as_ref(),
            StepKind::Workflow(child) => child.input.as_ref(),
            _ => None,
        }
    }

    /// The retry policy of the step's attempts (a worker's or a child's).
    pub fn retry(&self) -> Option<RetryPolicy> {
        match &self.kind {
            StepKind::Task(handler) => Some(handler.retry),
            StepKind::Workflow(child) => Some(child.retry),
            _ => None,
        }
    }

    /// The sub-workflow this step starts, if it is a `workflow` step.
    pub fn child(&self) -> Option<&ChildStep> {
        match &self.kind {
            StepKind::Workflow(child) => Some(child),
            _ => None,
        }
    }

    /// The signal this step waits for, if it is a signal step.
    pub fn signal(&self) -> Option<&str> {
        match &self.kind {
            StepKind::Wait(WaitStep::Signal(name)) => Some(name),
            _ => None,
        }
    }
}

/// What executes a task: a queue, a command, and how to run it. An `http` handler's command is
/// [`HTTP_COMMAND`] and its input the request.
#[derive(Debug, Clone)]
pub struct Handler {
    /// A queue name, or a template rendered when the task becomes ready.
    pub queue: QueueRoute,
    pub command: String,
    pub input: Option<Template>,
    /// Per attempt: the lease a worker holds and extends by heartbeats.
    pub timeout: Duration,
    pub retry: RetryPolicy,
}

impl Handler {
    /// Where its input is written in the definition: `http` for an http request, else `input`.
    pub fn input_field(&self) -> &'static str {
        if self.command == HTTP_COMMAND {
            "http"
        } else {
            "input"
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backoff {
    Fixed,
    Exponential,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total tries, at least 1.
    pub max_attempts: u32,
    pub backoff: Backoff,
    pub initial: Duration,
    pub max_interval: Duration,
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 1,
            backoff: Backoff::Fixed,
            initial: DEFAULT_RETRY_INITIAL,
            max_interval: DEFAULT_RETRY_MAX_INTERVAL,
            jitter: false,
        }
    }
}

impl RetryPolicy {
    /// The delay before the retry that follows failed attempt number `failed_attempt` (1-based).
    /// Exponential backoff is `min(initial * 2^(n-1), max_interval)`. With jitter the delay is
    /// drawn from `[d/2, d]` using `jitter_seed`, which the caller derives from the task and
    /// attempt so the core stays deterministic.
    pub fn delay(&self, failed_attempt: u32, jitter_seed: u64) -> Duration {
        let base = match self.backoff {
            Backoff::Fixed => self.initial.as_millis(),
            Backoff::Exponential => {
                let shift = failed_attempt.saturating_sub(1).min(63);
                let factor = 1u64 << shift;
                self.initial
                    .as_millis()
                    .saturating_mul(factor)
                    .min(self.max_interval.as_millis())
            }
        };
        if !self.jitter || base < 2 {
            return Duration::from_millis(base);
        }
        let half = base / 2;
        Duration::from_millis(half + jitter_seed % (base - half + 1))
    }
}

/// One problem in a definition: where it is and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// Location such as `steps[1] (init_instance).retry.initial`, or `line 3 column 5` for syntax.
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every problem found in a definition (validation does not stop at the first).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct Error {
    pub problems: Vec<Problem>,
}

impl Error {
    fn single(field: impl Into<String>, message: impl Into<String>) -> Error {
        Error {
            problems: vec![Problem {
                field: field.into(),
                message: message.into(),
            }],
        }
    }
}

/// Most YAML nodes (scalars and collections, with aliases expanded) in one definition: far more
/// than the largest workflow needs, and a bound on the work an alias bomb can cause.
const MAX_YAML_NODES: usize = 100_000;
/// Most alias uses (`*name`) in one definition.
const MAX_YAML_ALIASES: usize = 1_000;

fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::budget::Budget::default();
    budget.max_nodes = MAX_YAML_NODES;
    budget.max_aliases = MAX_YAML_ALIASES;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    // YAML 1.2's core schema: only `true` and `false` (also `True`, `TRUE`, `False`, `FALSE`)
    // are booleans, so `command: no` or `command: y` is a string, not YAML 1.1's `false`/`true`.
    options.strict_booleans = true;
    options
}

/// Parses a definition given as YAML or JSON. A document that starts with `{` is tried as JSON
/// first, for its precise errors; if it is not JSON but is YAML (a flow mapping such as
/// `{steps: [...]}`), the YAML reading is used; if it is neither, the error is the JSON one when
/// the first key is quoted, else the YAML one. YAML plain scalars are typed by YAML 1.2's core
/// schema: `yes`, `no`, `on`, `off`, `y` and `n` are strings, not booleans. Parsing is bounded:
/// nesting depth (128 for JSON, 64 for YAML), YAML nodes after alias expansion and alias uses.
pub fn parse_document(text: &str) -> Result<Value, Error> {
    let Some(rest) = text.trim_start().strip_prefix('{') else {
        return parse_yaml(text);
    };
    serde_json::from_str(text).or_else(|error| {
        parse_yaml(text).map_err(|yaml_error| {
            // Report the reading the text was meant for: JSON when its first key is quoted.
            if !rest.trim_start().starts_with(['"', '}']) {
                return yaml_error;
            }
            Error::single(
                format!("line {} column {}", error.line(), error.column()),
                format!("malformed JSON: {error}"),
            )
        })
    })
}

fn parse_yaml(text: &str) -> Result<Value, Error> {
    serde_saphyr::from_str_with_options::<Value>(text, yaml_options()).map_err(|error| {
        let field = error
            .location()
            .map(|at| format!("line {} column {}", at.line(), at.column()))
            .unwrap_or_else(|| "document".to_owned());
        let message = error.to_string();
        let message = message.lines().next().unwrap_or("malformed YAML");
        // The location is already in `field`; keep only the reason.
        let message = message.strip_prefix("error: ").unwrap_or(message);
        let message = match message.split_once(": ") {
            Some((location, reason)) if location.starts_with("line ") => reason,
            _ => message,
        };
        Error::single(field, format!("malformed YAML: {message}"))
    })
}

/// Reads a part of a definition at `field` (empty for the whole document) as `T`. A problem
/// names the field that does not fit, such as `steps[0] (a).command` for "invalid type: boolean
/// `false`, expected a string".
fn read<T: DeserializeOwned>(field: &str, value: Value) -> Result<T, Problem> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        let field = match (field, path.as_str()) {
            ("", ".") => "document".to_owned(),
            (field, ".") => field.to_owned(),
            ("", path) => path.to_owned(),
            (field, path) => format!("{field}.{path}"),
        };
        Problem {
            field,
            message: error.into_inner().to_string(),
        }
    })
}

/// Validates a workflow name: `[a-z0-9_.-]`, 1 to 128 characters.
pub fn check_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
        });
    if valid {
        Ok(())
    } else {
        Err(format!(
            "'{name}' is not a valid name: use 1 to 128 characters of a-z, 0-9, '_', '.' and '-'"
        ))
    }
}

/// Longest `command` (a shell executor runs whole scripts).
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;

/// Validates a queue name: 1 to 128 characters of letters, digits and `_.-:/`.
pub fn check_queue_name(text: &str) -> Result<(), String> {
    let valid = !text.is_empty()
        && text.len() <= MAX_NAME_BYTES
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | ':' | '/'));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "'{text}' is not a valid queue name: use 1 to 128 characters of letters, digits, '_', '.', '-', ':' and '/'"
        ))
    }
}

/// Validates a command: any text a worker understands (a handler name, or a shell script), not
/// blank, at most `MAX_COMMAND_BYTES`, no NUL.
fn check_command(text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        Err("must not be blank".to_owned())
    } else if text.len() > MAX_COMMAND_BYTES {
        Err(format!(
            "{} bytes is more than the limit of {MAX_COMMAND_BYTES}",
            text.len()
        ))
    } else if text.contains('\0') {
        Err("must not contain a NUL character".to_owned())
    } else {
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkflow {
    /// Checked against the applied name before deserializing.
    #[allow(dead_code)]
    name: Option<String>,
    description: Option<String>,
    params: Option<Value>,
    timeout: Option<Value>,
    priority: Option<i32>,
    lock: Option<Value>,
    labels: Option<Labels>,
    steps: Vec<Value>,
    output: Option<Value>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a step: a mapping with `id` and either `queue` and `command`, `queue` and `http`, `workflow`, `sleep`, `sleep_until`, `signal`, `approval`, `set` or `fail`"
)]
struct RawStep {
    id: String,
    http: Option<Value>,
    poll_interval: Option<Value>,
    sleep: Option<Value>,
    sleep_until: Option<Value>,
    signal: Option<String>,
    approval: Option<Value>,
    set: Option<Value>,
    fail: Option<Value>,
    workflow: Option<String>,
    version: Option<u32>,
    queue: Option<String>,
    command: Option<String>,
    input: Option<Value>,
    depends_on: Option<Vec<String>>,
    when: Option<String>,
    for_each: Option<String>,
    concurrency: Option<u32>,
    priority: Option<i32>,
    timeout: Option<Value>,
    step_timeout: Option<Value>,
    retry: Option<Value>,
    compensate: Option<Value>,
    continue_on_failure: Option<bool>,
    lock: Option<Value>,
    rate: Option<Value>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a handler: a mapping with `queue` and `command` (or `http`)"
)]
struct RawHandler {
    queue: Option<String>,
    command: Option<String>,
    http: Option<Value>,
    poll_interval: Option<Value>,
    input: Option<Value>,
    timeout: Option<Value>,
    retry: Option<Value>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an approval: a mapping such as `{ prompt: \"Go on?\" }`"
)]
struct RawApproval {
    prompt: Option<Value>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a failure: a mapping such as `{ message: \"no shard migrated\" }`"
)]
struct RawFail {
    message: Option<Value>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a retry policy: a mapping such as `{ max_attempts: 3 }`"
)]
struct RawRetry {
    max_attempts: Option<u32>,
    backoff: Option<String>,
    initial: Option<Value>,
    max_interval: Option<Value>,
    jitter: Option<bool>,
}

/// Root names an expression may read, by where it stands.
#[derive(Clone, Copy)]
enum Scope {
    /// A step's `when` and `for_each`.
    Step,
    /// A fan-out step's `input` and `queue`: `item` and `index` too.
    FanOutInput,
    /// A compensation's `input` and `queue`: `task` (the undone task) too.
    Compensation,
}

impl Scope {
    fn roots(self) -> &'static [&'static str] {
        match self {
            Scope::Step => &["params", "steps", "job"],
            Scope::FanOutInput => &["params", "steps", "job", "item", "index"],
            Scope::Compensation => &["params", "steps", "job", "task"],
        }
    }
}

struct Checker {
    problems: Vec<Problem>,
}

impl Checker {
    fn problem(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            field: field.into(),
            message: message.into(),
        });
    }

    /// Reads the part at `field` as `T` (see [`read`]), noting the problem if it does not fit.
    fn read<T: DeserializeOwned>(&mut self, field: &str, value: Value) -> Option<T> {
        read(field, value)
            .map_err(|problem| self.problems.push(problem))
            .ok()
    }

    fn duration(&mut self, field: String, value: Option<&Value>) -> Option<Duration> {
        let value = value?;
        match Duration::from_json(value) {
            Ok(duration) if duration.as_millis() > 0 => Some(duration),
            Ok(_) => {
                self.problem(field, "must be longer than zero");
                None
            }
            Err(error) => {
                self.problem(field, error.to_string());
                None
            }
        }
    }

    fn retry(&mut self, field: &str, value: Option<&Value>) -> RetryPolicy {
        let Some(value) = value else {
            return RetryPolicy::default();
        };
        let Some(raw) = self.read::<RawRetry>(field, value.clone()) else {
            return RetryPolicy::default();
        };
        let mut policy = RetryPolicy::default();
        if let Some(max_attempts) = raw.max_attempts {
            if max_attempts == 0 {
                self.problem(
                    format!("{field}.max_attempts"),
                    "must be at least 1 (it counts the first try)",
                );
            } else {
                policy.max_attempts = max_attempts;
            }
        }
        match raw.backoff.as_deref() {
            None | Some("fixed") => {}
            Some("exponential") => policy.backoff = Backoff::Exponential,
            Some(other) => self.problem(
                format!("{field}.backoff"),
                format!("unknown backoff '{other}': use fixed or exponential"),
            ),
        }
        if let Some(initial) = self.duration(format!("{field}.initial"), raw.initial.as_ref()) {
            policy.initial = initial;
        }
        if let Some(max) = self.duration(format!("{field}.max_interval"), raw.max_interval.as_ref())
        {
            policy.max_interval = max;
        }
        if policy.max_interval < policy.initial {
            self.problem(
                format!("{field}.max_interval"),
                format!(
                    "{} is shorter than initial {}",
                    policy.max_interval, policy.initial
                ),
            );
        }
        policy.jitter = raw.jitter.unwrap_or(false);
        policy
    }

    /// The lock at `field` (`lock`, or a step's `steps[0] (a).lock`); the names its key reads
    /// are checked where it stands.
    fn lock(&mut self, field: &str, value: &Value) -> Option<LockDefinition> {
        let raw: RawLock = self.read(field, value.clone())?;
        let key = self.key(&format!("{field}.key"), &raw.key)?;
        let slots = raw.slots.unwrap_or(1);
        if slots == 0 || slots > MAX_LOCK_SLOTS {
            self.problem(
                format!("{field}.slots"),
                format!("must be between 1 and {MAX_LOCK_SLOTS}"),
            );
            return None;
        }
        Some(LockDefinition { key, slots })
    }

    /// A step's `rate` at `field`: a key and a limit written `10/1m` or `{tokens: 10, per: 1m}`.
    fn rate(&mut self, field: &str, value: &Value) -> Option<KeyedRate> {
        let raw: RawRate = self.read(field, value.clone())?;
        let key = self.key(&format!("{field}.key"), &raw.key);
        let limit = RateLimit::from_json(&raw.limit)
            .map_err(|message| self.problem(format!("{field}.limit"), message))
            .ok();
        Some(KeyedRate {
            key: key?,
            limit: limit?,
        })
    }

    /// The key of a lock or rate: a string template.
    fn key(&mut self, field: &str, value: &Value) -> Option<Template> {
        if !value.is_string() {
            self.problem(
                field,
                "must be a string (it may contain ${{ … }} expressions)",
            );
            return None;
        }
        self.template(field, Some(value))
    }

    fn template(&mut self, field: &str, value: Option<&Value>) -> Option<Template> {
        let value = value?;
        match Template::compile(value) {
            Ok(template) => Some(template),
            Err(error) => {
                self.problem(field, error.to_string());
                None
            }
        }
    }

    /// What the step does, from the fields that choose its kind: the one place a step's kind
    /// is decided. A step is a task run by a worker (`queue` and `command`), one of the kinds
    /// that wait on the server holding no worker (`sleep`, `sleep_until`, `signal`,
    /// `approval`), or one the server completes at once (`set`, `fail`); which other fields
    /// each kind takes is [`refusal`]'s table.
    fn step_kind(&mut self, label: &str, raw: &mut RawStep) -> StepKind {
        let chosen: Vec<&str> = [
            ("sleep", raw.sleep.is_some()),
            ("sleep_until", raw.sleep_until.is_some()),
            ("signal", raw.signal.is_some()),
            ("approval", raw.approval.is_some()),
            ("set", raw.set.is_some()),
            ("fail", raw.fail.is_some()),
            ("workflow", raw.workflow.is_some()),
            ("http", raw.http.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        let kind = chosen.first().copied().unwrap_or("task");
        if let Some(other) = chosen.get(1) {
            self.problem(
                format!("{label}.{other}"),
                format!("a step is one kind: `{kind}` and `{other}` cannot be combined"),
            );
        }
        let fields = [
            ("queue", raw.queue.is_some()),
            ("command", raw.command.is_some()),
            ("input", raw.input.is_some()),
            ("timeout", raw.timeout.is_some()),
            ("retry", raw.retry.is_some()),
            ("step_timeout", raw.step_timeout.is_some()),
            ("compensate", raw.compensate.is_some()),
            ("for_each", raw.for_each.is_some()),
            ("continue_on_failure", raw.continue_on_failure.is_some()),
            ("version", raw.version.is_some()),
            ("poll_interval", raw.poll_interval.is_some()),
            ("lock", raw.lock.is_some()),
            ("rate", raw.rate.is_some()),
        ];
        for (field, set) in fields {
            if let Some(message) = set.then(|| refusal(kind, field)).flatten() {
                self.problem(format!("{label}.{field}"), message);
            }
        }
        if matches!(kind, "task" | "http") {
            let bounded = raw.step_timeout.is_some();
            return StepKind::Task(self.handler(
                label,
                RawHandler {
                    queue: raw.queue.take(),
                    command: raw.command.take(),
                    http: raw.http.take(),
                    poll_interval: raw.poll_interval.take(),
                    input: raw.input.take(),
                    timeout: raw.timeout.take(),
                    retry: raw.retry.take(),
                },
                bounded,
            ));
        }
        let placeholder = || StepKind::Wait(WaitStep::Signal(String::new()));
        match kind {
            "workflow" => {
                let workflow = raw.workflow.take().unwrap_or_default();
                if let Err(message) = check_name(&workflow) {
                    self.problem(format!("{label}.workflow"), message);
                }
                if raw.version == Some(0) {
                    self.problem(format!("{label}.version"), "versions start at 1");
                }
                StepKind::Workflow(ChildStep {
                    workflow,
                    version: raw.version,
                    input: self.template(&format!("{label}.input"), raw.input.as_ref()),
                    retry: self.retry(&format!("{label}.retry"), raw.retry.as_ref()),
                })
            }
            "sleep" => {
                let field = format!("{label}.sleep");
                let value = raw.sleep.take();
                self.duration(field, value.as_ref())
                    .map_or_else(placeholder, |d| {
                        StepKind::Wait(WaitStep::Sleep(SleepSpec::For(d)))
                    })
            }
            "sleep_until" => {
                let field = format!("{label}.sleep_until");
                match raw.sleep_until.take() {
                    Some(value @ Value::String(_)) => self
                        .template(&field, Some(&value))
                        .map_or_else(placeholder, |t| {
                            StepKind::Wait(WaitStep::Sleep(SleepSpec::Until(t)))
                        }),
                    _ => {
                        self.problem(
                            field,
                            "must be a string: an RFC 3339 time such as \"2026-12-01T02:00:00Z\", or an expression `${{ … }}` that renders to one",
                        );
                        placeholder()
                    }
                }
            }
            "set" => {
                let field = format!("{label}.set");
                match raw.set.take() {
                    Some(value @ Value::Object(_)) => self
                        .template(&field, Some(&value))
                        .map_or_else(placeholder, StepKind::Set),
                    _ => {
                        self.problem(
                            field,
                            "must be a mapping: the step's output, whose strings may contain ${{ … }} expressions",
                        );
                        placeholder()
                    }
                }
            }
            "fail" => {
                let default = format!("step {} failed the job", raw.id);
                self.text_in_mapping::<RawFail>(
                    &format!("{label}.fail"),
                    raw.fail.take(),
                    ("message", |raw| raw.message),
                    default,
                )
                .map_or_else(placeholder, |message| StepKind::Fail { message })
            }
            "signal" => {
                let name = raw.signal.take().unwrap_or_default();
                if let Err(message) = check_name(&name) {
                    self.problem(format!("{label}.signal"), message);
                }
                StepKind::Wait(WaitStep::Signal(name))
            }
            _ => {
                let default = format!("Approve step {}?", raw.id);
                self.text_in_mapping::<RawApproval>(
                    &format!("{label}.approval"),
                    raw.approval.take(),
                    ("prompt", |raw| raw.prompt),
                    default,
                )
                .map_or_else(placeholder, |prompt| {
                    StepKind::Wait(WaitStep::Approval { prompt })
                })
            }
        }
    }

    /// The string template `inner` of a step field that is a mapping around it, such as
    /// `approval: {prompt}` or `fail: {message}`: `default` when the mapping (or `inner`) is
    /// left out or empty; `None`, with the problem noted, when it does not fit.
    fn text_in_mapping<T: DeserializeOwned>(
        &mut self,
        field: &str,
        value: Option<Value>,
        (inner, text_of): (&str, fn(T) -> Option<Value>),
        default: String,
    ) -> Option<Template> {
        let text = match value {
            None | Some(Value::Null) => None,
            Some(value) => text_of(self.read::<T>(field, value)?),
        };
        let field = format!("{field}.{inner}");
        let text = match text {
            None => Value::String(default),
            Some(text @ Value::String(_)) => text,
            Some(_) => {
                self.problem(
                    field,
                    "must be a string (it may contain ${{ … }} expressions)",
                );
                return None;
            }
        };
        self.template(&field, Some(&text))
    }

    /// The handler at `field`: a `queue` and a `command` with its `input`, or a `queue` and an
    /// `http` request (`bounded`: the step has a `step_timeout`, which bounds its polling).
    fn handler(&mut self, field: &str, raw: RawHandler, bounded: bool) -> Handler {
        let queue = self.required(&format!("{field}.queue"), raw.queue, "queue", |text| {
            QueueRoute::parse(text).map(drop)
        });
        let queue = QueueRoute::parse(&queue).unwrap_or_default();
        let timeout = self
            .duration(format!("{field}.timeout"), raw.timeout.as_ref())
            .unwrap_or(DEFAULT_ATTEMPT_TIMEOUT);
        let retry = self.retry(&format!("{field}.retry"), raw.retry.as_ref());
        let Some(request) = raw.http else {
            if raw.poll_interval.is_some() {
                self.problem(format!("{field}.poll_interval"), POLL_INTERVAL_ONLY_HTTP);
            }
            let command = self.required(
                &format!("{field}.command"),
                raw.command,
                "command",
                check_command,
            );
            if command == HTTP_COMMAND {
                self.problem(
                    format!("{field}.command"),
                    "`http` is the command of http steps' tasks: write the request under `http:` (with `url`, `method`, …), or name the command otherwise",
                );
            }
            return Handler {
                queue,
                command,
                input: self.template(&format!("{field}.input"), raw.input.as_ref()),
                timeout,
                retry,
            };
        };
        for (name, set) in [
            ("command", raw.command.is_some()),
            ("input", raw.input.is_some()),
        ] {
            if set {
                self.problem(format!("{field}.{name}"), http_refusal(name));
            }
        }
        let options = http::HttpOptions {
            attempt_timeout: timeout,
            poll_interval: raw.poll_interval.as_ref(),
            bounded,
        };
        Handler {
            queue,
            command: HTTP_COMMAND.to_owned(),
            input: self.http_request(&format!("{field}.http"), request, options),
            timeout,
            retry,
        }
    }

    fn required(
        &mut self,
        field: &str,
        value: Option<String>,
        what: &str,
        check: fn(&str) -> Result<(), String>,
    ) -> String {
        match value {
            None => {
                self.problem(field, format!("missing: every step needs a {what}"));
                String::new()
            }
            Some(text) => {
                if let Err(message) = check(&text) {
                    self.problem(field, message);
                }
                text
            }
        }
    }
}

impl Workflow {
    /// Parses and validates a definition document. `name` is the name the definition is applied
    /// under (the URL's); a `name` inside the document must agree with it.
    pub fn from_document(name: &str, text: &str) -> Result<Workflow, Error> {
        let value = parse_document(text)?;
        Workflow::from_value(name, value)
    }

    /// Validates a definition already parsed to JSON.
    pub fn from_value(name: &str, mut value: Value) -> Result<Workflow, Error> {
        if let Err(message) = check_name(name) {
            return Err(Error::single("name", message));
        }
        let Value::Object(map) = &mut value else {
            return Err(Error::single(
                "document",
                "a workflow definition must be an object with `steps`",
            ));
        };
        match map.get("name") {
            None => {
                map.insert("name".to_owned(), Value::String(name.to_owned()));
            }
            Some(Value::String(inner)) if inner == name => {}
            Some(other) => {
                return Err(Error::single(
                    "name",
                    format!(
                        "the document names {other} but is applied as '{name}': make them agree or drop `name`"
                    ),
                ));
            }
        }
        let raw: RawWorkflow = read("", value.clone()).map_err(|problem| Error {
            problems: vec![problem],
        })?;
        let mut checker = Checker {
            problems: Vec::new(),
        };
        let lock = raw.lock.as_ref().and_then(|value| {
            let lock = checker.lock("lock", value)?;
            for path in lock.key.references() {
                if let Some(root) = path.first()
                    && !["params", "job"].contains(&root.as_str())
                {
                    checker.problem(
                        "lock.key",
                        format!("unknown name '{root}': a lock key may read params and job"),
                    );
                    return None;
                }
            }
            Some(lock)
        });
        match &raw.params {
            None | Some(Value::Object(_) | Value::Bool(true)) => {}
            Some(Value::Bool(false)) => checker.problem(
                "params",
                "the schema `false` accepts no params, so every job of this workflow would be refused: give a schema the params can meet, or drop `params` to accept any",
            ),
            Some(_) => checker.problem("params", "must be a JSON Schema (an object)"),
        }
        let timeout = checker.duration("timeout".to_owned(), raw.timeout.as_ref());
        let output = checker.template("output", raw.output.as_ref());
        let labels = raw.labels.unwrap_or_default();
        checker.problems.extend(labels::check("labels", &labels));
        if raw.steps.is_empty() {
            checker.problem("steps", "a workflow needs at least one step");
        }
        if raw.steps.len() > MAX_STEPS {
            checker.problem(
                "steps",
                format!(
                    "{} steps is more than the limit of {MAX_STEPS}",
                    raw.steps.len()
                ),
            );
        }

        // First pass: ids, so dependencies can be resolved in any order.
        let mut parsed: Vec<(String, Option<RawStep>)> = Vec::with_capacity(raw.steps.len());
        let mut index_of: HashMap<String, usize> = HashMap::new();
        for (position, step_value) in raw.steps.into_iter().enumerate() {
            let label = step_label(position, step_value.get("id").and_then(Value::as_str));
            let step = checker.read::<RawStep>(&label, step_value);
            if let Some(step) = &step {
                if let Err(message) = check_step_id(&step.id) {
                    checker.problem(format!("{label}.id"), message);
                } else if index_of.insert(step.id.clone(), position).is_some() {
                    checker.problem(
                        format!("{label}.id"),
                        format!("duplicate step id '{}': step ids must be unique", step.id),
                    );
                }
            }
            parsed.push((label, step));
        }

        let mut steps = Vec::with_capacity(parsed.len());
        for (position, (label, raw_step)) in parsed.into_iter().enumerate() {
            let Some(mut raw_step) = raw_step else {
                continue;
            };
            let depends_on = match &raw_step.depends_on {
                None if position == 0 => Vec::new(),
                None => vec![position - 1],
                Some(ids) => {
                    let mut resolved = Vec::with_capacity(ids.len());
                    for id in ids {
                        match index_of.get(id) {
                            Some(&index) if index == position => checker.problem(
                                format!("{label}.depends_on"),
                                format!("step '{id}' depends on itself"),
                            ),
                            Some(&index) => {
                                if !resolved.contains(&index) {
                                    resolved.push(index);
                                }
                            }
                            None => checker.problem(
                                format!("{label}.depends_on"),
                                format!("unknown step id '{id}'"),
                            ),
                        }
                    }
                    resolved
                }
            };
            let kind = checker.step_kind(&label, &mut raw_step);
            let when = raw_step.when.as_deref().and_then(|source| {
                expr::compile_condition(source)
                    .map_err(|error| checker.problem(format!("{label}.when"), error.to_string()))
                    .ok()
            });
            let for_each = raw_step.for_each.as_deref().and_then(|source| {
                expr::compile_condition(source)
                    .map_err(|error| {
                        checker.problem(format!("{label}.for_each"), error.to_string())
                    })
                    .ok()
            });
            if raw_step.concurrency == Some(0) {
                checker.problem(format!("{label}.concurrency"), "must be at least 1");
            }
            if raw_step.concurrency.is_some() && for_each.is_none() {
                checker.problem(
                    format!("{label}.concurrency"),
                    "only a fan-out step (with `for_each`) takes a concurrency",
                );
            }
            let step_timeout = checker.duration(
                format!("{label}.step_timeout"),
                raw_step.step_timeout.as_ref(),
            );
            let compensate = raw_step.compensate.and_then(|value| {
                let field = format!("{label}.compensate");
                let raw = checker.read::<RawHandler>(&field, value)?;
                Some(checker.handler(&field, raw, false))
            });
            let lock = raw_step
                .lock
                .as_ref()
                .and_then(|value| checker.lock(&format!("{label}.lock"), value));
            let rate = raw_step
                .rate
                .as_ref()
                .and_then(|value| checker.rate(&format!("{label}.rate"), value));
            steps.push((
                label,
                Step {
                    id: raw_step.id,
                    kind,
                    depends_on,
                    when,
                    for_each,
                    concurrency: raw_step.concurrency,
                    priority: raw_step.priority.unwrap_or(0),
                    step_timeout,
                    compensate,
                    continue_on_failure: raw_step.continue_on_failure.unwrap_or(false),
                    lock,
                    rate,
                },
            ));
        }

        if checker.problems.is_empty() {
            let dependencies: Vec<Vec<usize>> = steps
                .iter()
                .map(|(_, step)| step.depends_on.clone())
                .collect();
            if let Some(cycle) = find_cycle(&dependencies) {
                let names: Vec<&str> = cycle.iter().map(|&i| steps[i].1.id.as_str()).collect();
                checker.problem(
                    format!("{}.depends_on", steps[cycle[0]].0),
                    format!("dependency cycle: {}", names.join(" -> ")),
                );
            } else {
                let upstream = transitive_upstream(&dependencies);
                for (index, (label, step)) in steps.iter().enumerate() {
                    check_references(&mut checker, label, step, &upstream[index], &index_of);
                }
                for (label, step) in &steps {
                    if step.child().is_some_and(|child| child.workflow == name) {
                        checker.problem(
                            format!("{label}.workflow"),
                            format!("workflow '{name}' cannot start itself: a job would nest without end"),
                        );
                    }
                }
                if let Some(output) = &output {
                    // The output is rendered once every step has ended: all of them are upstream.
                    let every_step: BTreeSet<usize> = (0..steps.len()).collect();
                    let sites = vec![("output".to_owned(), output.references(), Scope::Step)];
                    check_sites(
                        &mut checker,
                        "the workflow's output",
                        sites,
                        &every_step,
                        &index_of,
                    );
                }
            }
        }

        if !checker.problems.is_empty() {
            return Err(Error {
                problems: checker.problems,
            });
        }
        Ok(Workflow {
            name: name.to_owned(),
            description: raw.description,
            params_schema: raw.params,
            timeout,
            priority: raw.priority.unwrap_or(0),
            lock,
            labels,
            steps: steps.into_iter().map(|(_, step)| step).collect(),
            output,
            source: normalize(&value),
        })
    }

    pub fn step_index(&self, id: &str) -> Option<usize> {
        self.steps.iter().position(|step| step.id == id)
    }

    /// Whether some step of this workflow waits for a signal of this name.
    pub fn takes_signal(&self, name: &str) -> bool {
        self.steps.iter().any(|step| step.signal() == Some(name))
    }

    /// Whether a terminal failure of step `step` lets the job go on (`continue_on_failure`).
    pub fn continues_on_failure(&self, step: &str) -> bool {
        self.step_index(step)
            .is_some_and(|index| self.steps[index].continue_on_failure)
    }

    /// Whether a step's task in `status` has ended in a way its dependants go on from: it
    /// succeeded or was skipped, or it failed for good in a step that continues on failure.
    pub fn lets_dependants_go_on(&self, step: &str, status: TaskStatus) -> bool {
        status.is_done() || (status == TaskStatus::Failed && self.continues_on_failure(step))
    }

    /// What runs a task of step `step`: its handler, or with `compensation` the step's
    /// `compensate`; `None` for a step that waits on the server (or no such step).
    pub fn task_handler(&self, step: &str, compensation: bool) -> Option<&Handler> {
        let step = &self.steps[self.step_index(step)?];
        if compensation {
            step.compensate.as_ref()
        } else {
            step.handler()
        }
    }
}

/// Why a step of `kind` (`task` for `queue` + `command`, else the field that chose it) does not
/// take `field`; `None` when it does. This is the table of docs/reference.md: `depends_on`,
/// `when` and `priority` are every kind's, `concurrency` goes with `for_each`.
fn refusal(kind: &str, field: &str) -> Option<String> {
    let waits = matches!(kind, "sleep" | "sleep_until" | "signal" | "approval");
    let refused = match field {
        "queue" | "timeout" => !matches!(kind, "task" | "http"),
        "command" => kind != "task",
        "input" => !matches!(kind, "task" | "workflow"),
        "retry" => !matches!(kind, "task" | "workflow" | "http"),
        "version" => kind != "workflow",
        "poll_interval" => kind != "http",
        "step_timeout" => matches!(kind, "set" | "fail"),
        "compensate" => !matches!(kind, "task" | "http" | "workflow" | "signal" | "approval"),
        "for_each" | "continue_on_failure" => kind == "fail",
        "lock" => !matches!(kind, "task" | "http" | "workflow"),
        "rate" => !matches!(kind, "task" | "http"),
        _ => false,
    };
    if !refused {
        return None;
    }
    Some(match (kind, field) {
        ("workflow", "rate") => {
            "a sub-workflow step starts child jobs, not tasks a worker claims, so it takes no `rate`: put the `rate` on the child workflow's steps"
                .to_owned()
        }
        (_, "lock" | "rate") => format!(
            "only a step a worker runs (`queue` with `command` or `http`) or a sub-workflow step (`lock` only) takes a `{field}`: a `{kind}` step holds nothing while it waits; drop it"
        ),
        (_, "version") => {
            "only a sub-workflow step (`workflow`) takes a `version`: drop it".to_owned()
        }
        (_, "poll_interval") => POLL_INTERVAL_ONLY_HTTP.to_owned(),
        ("http", _) => http_refusal(field).to_owned(),
        ("workflow", "timeout") => {
            "a sub-workflow step holds no worker, so it has no per-attempt `timeout`: the child's own workflow `timeout` applies, and `step_timeout` bounds the step"
                .to_owned()
        }
        ("workflow", _) => format!(
            "a sub-workflow step starts a child job and runs no worker, so it takes no `{field}`: drop it"
        ),
        (_, "compensate") if waits => "a sleep has nothing to undo: drop `compensate`".to_owned(),
        (_, _) if waits => format!(
            "a `{kind}` step waits on the server and runs no worker, so it takes no `{field}`: drop it (bound the wait with `step_timeout`)"
        ),
        ("set", "compensate") => {
            "a `set` step changes nothing outside the job, so it has nothing to undo: drop `compensate`"
                .to_owned()
        }
        ("set", _) => format!(
            "a `set` step is rendered on the server at once and runs no worker, so it takes no `{field}`: drop it"
        ),
        ("fail", "continue_on_failure") => {
            "a `fail` step is there to fail the job, so it cannot continue on failure: drop `continue_on_failure` (make it conditional with `when`)"
                .to_owned()
        }
        ("fail", "for_each") => {
            "a `fail` step fails the job once: drop `for_each` (make it conditional with `when`)"
                .to_owned()
        }
        (_, _) => format!(
            "a `fail` step ends the job at once and runs no worker, so it takes no `{field}`: drop it"
        ),
    })
}

/// Why a `poll_interval` is refused where there is no `http` request.
const POLL_INTERVAL_ONLY_HTTP: &str =
    "only an http step polls (the `Location` of a `202 Accepted` answer): drop `poll_interval`";

/// Why an `http` handler refuses `field`.
fn http_refusal(field: &str) -> &'static str {
    match field {
        "command" => {
            "an http step's tasks run the built-in HTTP executor (command `http`): drop `command`"
        }
        _ => {
            "an http step's input is its request: put the data in `http.body` or `http.url`, and drop `input`"
        }
    }
}

/// How a step is named in a problem's field: `steps[2] (load)`.
pub fn step_label(position: usize, id: Option<&str>) -> String {
    match id {
        Some(id) => format!("steps[{position}] ({id})"),
        None => format!("steps[{position}]"),
    }
}

/// Validates a step id: a letter or `_`, then letters, digits, `_` or `-`, at most 128 bytes.
pub fn check_step_id(id: &str) -> Result<(), String> {
    let mut chars = id.chars();
    let valid = id.len() <= MAX_NAME_BYTES
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "'{id}' is not a valid step id: start with a letter or '_', then letters, digits, '_' or '-' (at most 128)"
        ))
    }
}

/// Finds one dependency cycle, returned as the steps along it (first repeated at the end).
fn find_cycle(dependencies: &[Vec<usize>]) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    let mut marks = vec![Mark::New; dependencies.len()];
    for start in 0..dependencies.len() {
        if marks[start] != Mark::New {
            continue;
        }
        // Iterative depth-first search: (node, next dependency to visit).
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        marks[start] = Mark::Open;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if let Some(&dependency) = dependencies[node].get(*next) {
                *next += 1;
                match marks[dependency] {
                    Mark::New => {
                        marks[dependency] = Mark::Open;
                        stack.push((dependency, 0));
                    }
                    Mark::Open => {
                        let from = stack.iter().position(|&(n, _)| n == dependency)?;
                        let mut cycle: Vec<usize> = stack[from..].iter().map(|&(n, _)| n).collect();
                        cycle.reverse();
                        cycle.insert(0, dependency);
                        cycle.pop();
                        cycle.push(dependency);
                        return Some(cycle);
                    }
                    Mark::Done => {}
                }
            } else {
                marks[node] = Mark::Done;
                stack.pop();
            }
        }
    }
    None
}

/// For each step, the set of steps that finish before it starts (on an acyclic graph).
fn transitive_upstream(dependencies: &[Vec<usize>]) -> Vec<BTreeSet<usize>> {
    let mut memo: Vec<Option<BTreeSet<usize>>> = vec![None; dependencies.len()];
    fn visit(
        node: usize,
        dependencies: &[Vec<usize>],
        memo: &mut [Option<BTreeSet<usize>>],
    ) -> BTreeSet<usize> {
        // Explicit stack to stay safe on long chains.
        let mut stack = vec![node];
        while let Some(&top) = stack.last() {
            if memo[top].is_some() {
                stack.pop();
                continue;
            }
            let pending: Vec<usize> = dependencies[top]
                .iter()
                .copied()
                .filter(|&d| memo[d].is_none())
                .collect();
            if pending.is_empty() {
                let mut set = BTreeSet::new();
                for &dependency in &dependencies[top] {
                    set.insert(dependency);
                    set.extend(memo[dependency].iter().flatten().copied());
                }
                memo[top] = Some(set);
                stack.pop();
            } else {
                stack.extend(pending);
            }
        }
        memo[node].clone().unwrap_or_default()
    }
    (0..dependencies.len())
        .map(|node| visit(node, dependencies, &mut memo))
        .collect()
}

fn check_references(
    checker: &mut Checker,
    label: &str,
    step: &Step,
    upstream: &BTreeSet<usize>,
    index_of: &HashMap<String, usize>,
) {
    let fan_out = step.for_each.is_some();
    let mut sites: Vec<(String, Vec<Vec<String>>, Scope)> = Vec::new();
    if let Some(when) = &step.when {
        sites.push((format!("{label}.when"), when.references(), Scope::Step));
    }
    if let Some(for_each) = &step.for_each {
        sites.push((
            format!("{label}.for_each"),
            for_each.references(),
            Scope::Step,
        ));
    }
    let scope = if fan_out {
        Scope::FanOutInput
    } else {
        Scope::Step
    };
    match &step.kind {
        StepKind::Task(handler) => {
            if let Some(input) = &handler.input {
                let field = handler.input_field();
                sites.push((format!("{label}.{field}"), input.references(), scope));
            }
            sites.push((format!("{label}.queue"), handler.queue.references(), scope));
        }
        StepKind::Wait(WaitStep::Sleep(SleepSpec::Until(until))) => {
            sites.push((format!("{label}.sleep_until"), until.references(), scope));
        }
        StepKind::Wait(WaitStep::Approval { prompt }) => {
            sites.push((
                format!("{label}.approval.prompt"),
                prompt.references(),
                scope,
            ));
        }
        StepKind::Set(set) => sites.push((format!("{label}.set"), set.references(), scope)),
        StepKind::Workflow(child) => {
            if let Some(input) = &child.input {
                sites.push((format!("{label}.input"), input.references(), scope));
            }
        }
        StepKind::Fail { message } => {
            sites.push((format!("{label}.fail.message"), message.references(), scope));
        }
        StepKind::Wait(WaitStep::Sleep(SleepSpec::For(_)) | WaitStep::Signal(_)) => {}
    }
    if let Some(compensate) = &step.compensate {
        if let Some(input) = &compensate.input {
            sites.push((
                format!("{label}.compensate.{}", compensate.input_field()),
                input.references(),
                Scope::Compensation,
            ));
        }
        sites.push((
            format!("{label}.compensate.queue"),
            compensate.queue.references(),
            Scope::Compensation,
        ));
    }
    if let Some(lock) = &step.lock {
        sites.push((format!("{label}.lock.key"), lock.key.references(), scope));
    }
    if let Some(rate) = &step.rate {
        sites.push((format!("{label}.rate.key"), rate.key.references(), scope));
    }
    let reader = format!("'{}'", step.id);
    check_sites(checker, &reader, sites, upstream, index_of);
}

/// Checks the names the expressions at `sites` read: roots their scope allows, and steps that
/// exist, are in `upstream` (they have ended when `reader` is rendered) and offer the field.
fn check_sites(
    checker: &mut Checker,
    reader: &str,
    sites: Vec<(String, Vec<Vec<String>>, Scope)>,
    upstream: &BTreeSet<usize>,
    index_of: &HashMap<String, usize>,
) {
    for (field, references, scope) in sites {
        for path in references {
            let Some(root) = path.first() else { continue };
            if root == "secrets" {
                checker.problem(&field, http::SECRETS_PLACE);
                continue;
            }
            if !scope.roots().contains(&root.as_str()) {
                checker.problem(
                    &field,
                    format!(
                        "unknown name '{root}': expressions here may read {}",
                        scope.roots().join(", ")
                    ),
                );
                continue;
            }
            if root != "steps" {
                continue;
            }
            let Some(target) = path.get(1) else {
                continue;
            };
            match index_of.get(target) {
                None => checker.problem(&field, format!("unknown step '{target}' in steps.{target}")),
                Some(index) if !upstream.contains(index) => checker.problem(
                    &field,
                    format!(
                        "step '{target}' is not upstream of {reader}, so its output may not exist yet: add it to depends_on"
                    ),
                ),
                Some(_) => {
                    if let Some(field_name) = path.get(2)
                        && !["output", "status", "error"].contains(&field_name.as_str())
                    {
                        checker.problem(
                            &field,
                            format!(
                                "steps.{target}.{field_name} does not exist: a step offers `output`, `status` and `error`"
                            ),
                        );
                    }
                }
            }
        }
    }
}

/// Removes keys whose value is null, so equivalent documents compare equal.
pub fn normalize(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), normalize(v)))
                .collect::<Map<_, _>>(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<Workflow, Error> {
        Workflow::from_document("demo", yaml)
    }

    #[track_caller]
    fn check_error(yaml: &str, field: &str, message_part: &str) {
        let error = parse(yaml).expect_err("definition should be rejected");
        assert!(
            error
                .problems
                .iter()
                .any(|p| p.field == field && p.message.contains(message_part)),
            "expected a problem at {field} containing {message_part:?}, got: {error}"
        );
    }

    #[test]
    fn waiting_steps_parse_to_their_kinds() {
        let workflow = parse(
            "steps:\n- {id: window, sleep: 10m}\n- {id: at_night, sleep_until: '${{ params.start }}'}\n- id: approve\n  approval: {prompt: 'Migrate ${{ params.cluster }} now?'}\n  step_timeout: 24h\n  compensate: {queue: q, command: notify}\n- {id: paid, signal: payment_received, step_timeout: 1h}\n- {id: ask, approval: {}}\n",
        )
        .unwrap();
        assert!(matches!(
            workflow.steps[0].kind,
            StepKind::Wait(WaitStep::Sleep(SleepSpec::For(d))) if d == Duration::from_secs(600)
        ));
        assert!(matches!(
            workflow.steps[1].kind,
            StepKind::Wait(WaitStep::Sleep(SleepSpec::Until(_)))
        ));
        assert!(matches!(
            workflow.steps[2].kind,
            StepKind::Wait(WaitStep::Approval { .. })
        ));
        assert!(workflow.steps[2].compensate.is_some());
        assert_eq!(workflow.steps[3].signal(), Some("payment_received"));
        assert!(workflow.steps.iter().all(|step| step.handler().is_none()));
        assert!(workflow.takes_signal("payment_received"));
        assert!(!workflow.takes_signal("other"));
        let StepKind::Wait(WaitStep::Approval { prompt }) = &workflow.steps[4].kind else {
            panic!("an approval step");
        };
        assert_eq!(
            prompt.render(&serde_json::json!({})).unwrap(),
            "Approve step ask?"
        );
    }

    #[test]
    fn waiting_steps_refuse_the_fields_of_a_task() {
        for field in [
            "queue: q",
            "command: c",
            "input: {a: 1}",
            "timeout: 1m",
            "retry: {max_attempts: 2}",
        ] {
            let name = field.split(':').next().unwrap();
            check_error(
                &format!("steps:\n- {{id: s, signal: go, {field}}}\n"),
                &format!("steps[0] (s).{name}"),
                "runs no worker",
            );
        }
        check_error(
            "steps:\n- {id: s, sleep: 1m, compensate: {queue: q, command: c}}\n",
            "steps[0] (s).compensate",
            "nothing to undo",
        );
        check_error(
            "steps:\n- {id: s, sleep: 1m, signal: go}\n",
            "steps[0] (s).signal",
            "cannot be combined",
        );
        check_error("steps:\n- {id: s, sleep: soon}\n", "steps[0] (s).sleep", "");
        check_error(
            "steps:\n- {id: s, sleep_until: 5}\n",
            "steps[0] (s).sleep_until",
            "RFC 3339",
        );
        check_error(
            "steps:\n- {id: s, signal: Go!}\n",
            "steps[0] (s).signal",
            "not a valid name",
        );
        check_error(
            "steps:\n- {id: s, approval: {prompt: 5}}\n",
            "steps[0] (s).approval.prompt",
            "must be a string",
        );
        check_error(
            "steps:\n- {id: s, approval: {prompt: '${{ steps.later.output }}'}}\n- {id: later, sleep: 1s}\n",
            "steps[0] (s).approval.prompt",
            "not upstream",
        );
    }

    #[test]
    fn set_and_fail_steps_parse_to_their_kinds() {
        let workflow = parse(
            "output: {n: '${{ steps.summary.output.count }}'}\nsteps:\n- {id: summary, set: {count: '${{ params.n }}'}}\n- {id: guard, when: '${{ steps.summary.output.count == 0 }}', fail: {message: 'none for ${{ params.cluster }}'}}\n- {id: stop, fail: {}}\n- {id: notify, queue: q, command: page, continue_on_failure: true}\n",
        )
        .unwrap();
        assert!(matches!(workflow.steps[0].kind, StepKind::Set(_)));
        assert!(matches!(workflow.steps[1].kind, StepKind::Fail { .. }));
        let StepKind::Fail { message } = &workflow.steps[2].kind else {
            panic!("not a fail step");
        };
        assert_eq!(
            message.render(&serde_json::json!({})).unwrap(),
            "step stop failed the job"
        );
        assert!(workflow.steps[3].continue_on_failure);
        assert!(!workflow.steps[0].continue_on_failure);
        assert!(workflow.output.is_some());
        assert!(workflow.continues_on_failure("notify"));
    }

    #[test]
    fn each_kind_refuses_the_fields_the_table_says_it_does_not_take() {
        for (yaml, field, message_part) in [
            (
                "{id: s, set: {a: 1}, input: {}}",
                "input",
                "rendered on the server",
            ),
            (
                "{id: s, set: {a: 1}, retry: {max_attempts: 2}}",
                "retry",
                "takes no `retry`",
            ),
            (
                "{id: s, set: {a: 1}, timeout: 1m}",
                "timeout",
                "takes no `timeout`",
            ),
            (
                "{id: s, set: {a: 1}, step_timeout: 1m}",
                "step_timeout",
                "takes no",
            ),
            (
                "{id: s, set: {a: 1}, compensate: {queue: q, command: c}}",
                "compensate",
                "nothing to undo",
            ),
            (
                "{id: s, set: {a: 1}, queue: q}",
                "queue",
                "takes no `queue`",
            ),
            (
                "{id: s, fail: {}, continue_on_failure: true}",
                "continue_on_failure",
                "cannot continue on failure",
            ),
            (
                "{id: s, fail: {}, for_each: '${{ params.x }}'}",
                "for_each",
                "fails the job once",
            ),
            (
                "{id: s, fail: {}, step_timeout: 1m}",
                "step_timeout",
                "ends the job at once",
            ),
            (
                "{id: s, fail: {}, compensate: {queue: q, command: c}}",
                "compensate",
                "ends the job at once",
            ),
            (
                "{id: s, fail: {}, command: c}",
                "command",
                "takes no `command`",
            ),
            (
                "{id: s, sleep: 1m, retry: {max_attempts: 2}}",
                "retry",
                "waits on the server",
            ),
            (
                "{id: s, set: {a: 1}, fail: {}}",
                "fail",
                "cannot be combined",
            ),
        ] {
            check_error(
                &format!("steps:\n- {yaml}\n"),
                &format!("steps[0] (s).{field}"),
                message_part,
            );
        }
        // What the table allows.
        for yaml in [
            "{id: s, set: {a: '${{ item }}'}, for_each: '${{ params.x }}', continue_on_failure: true}",
            "{id: s, signal: go, continue_on_failure: true, step_timeout: 1m, compensate: {queue: q, command: c}}",
            "{id: s, queue: q, command: c, continue_on_failure: true, for_each: '${{ params.x }}'}",
        ] {
            parse(&format!("steps:\n- {yaml}\n")).unwrap_or_else(|e| panic!("{yaml}: {e}"));
        }
    }

    #[test]
    fn a_workflow_step_takes_a_child_workflow_and_refuses_what_a_child_cannot_use() {
        let workflow = parse(
            "steps:\n- {id: per_shard, workflow: migrate_shard, version: 3, for_each: '${{ params.shards }}', concurrency: 4, input: {shard: '${{ item }}'}, retry: {max_attempts: 2}, step_timeout: 1h, compensate: {queue: q, command: undo}, continue_on_failure: true}\n",
        )
        .unwrap();
        let child = workflow.steps[0].child().unwrap();
        assert_eq!(child.workflow, "migrate_shard");
        assert_eq!(child.version, Some(3));
        assert_eq!(child.retry.max_attempts, 2);
        assert!(workflow.steps[0].input().is_some());
        for (yaml, field, message_part) in [
            (
                "{id: s, workflow: w, timeout: 1m}",
                "timeout",
                "the child's own workflow `timeout` applies",
            ),
            (
                "{id: s, workflow: w, queue: q}",
                "queue",
                "starts a child job",
            ),
            (
                "{id: s, workflow: w, version: 0}",
                "version",
                "versions start at 1",
            ),
            (
                "{id: s, queue: q, command: c, version: 2}",
                "version",
                "only a sub-workflow step",
            ),
            ("{id: s, workflow: 'Bad Name'}", "workflow", ""),
            ("{id: s, workflow: demo}", "workflow", "cannot start itself"),
        ] {
            check_error(
                &format!("steps:\n- {yaml}\n"),
                &format!("steps[0] (s).{field}"),
                message_part,
            );
        }
    }

    #[test]
    fn set_and_fail_bodies_are_checked() {
        check_error(
            "steps:\n- {id: s, set: 3}\n",
            "steps[0] (s).set",
            "must be a mapping",
        );
        check_error(
            "steps:\n- {id: s, fail: {message: [1]}}\n",
            "steps[0] (s).fail.message",
            "must be a string",
        );
        check_error(
            "steps:\n- {id: s, fail: {reason: x}}\n",
            "steps[0] (s).fail.reason",
            "unknown field",
        );
        check_error(
            "steps:\n- {id: s, set: {a: '${{ steps.t.output }}'}}\n- {id: t, queue: q, command: c}\n",
            "steps[0] (s).set",
            "not upstream",
        );
    }

    #[test]
    fn a_step_offers_output_status_and_error_to_its_dependants() {
        parse("steps:\n- {id: a, queue: q, command: c, continue_on_failure: true}\n- {id: b, queue: q, command: c, input: {m: '${{ steps.a.error.message }}', s: '${{ steps.a.status }}'}}\n").unwrap();
        check_error(
            "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: q, command: c, input: '${{ steps.a.result }}'}\n",
            "steps[1] (b).input",
            "a step offers `output`, `status` and `error`",
        );
    }

    #[test]
    fn the_output_may_read_every_step_and_nothing_unknown() {
        parse("output: '${{ steps.b.output }}'\nsteps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: q, command: c, depends_on: []}\n").unwrap();
        check_error(
            "output: '${{ steps.nope.output }}'\nsteps:\n- {id: a, queue: q, command: c}\n",
            "output",
            "unknown step 'nope'",
        );
        check_error(
            "output: '${{ item }}'\nsteps:\n- {id: a, queue: q, command: c}\n",
            "output",
            "unknown name 'item'",
        );
        check_error(
            "output: '${{ steps.a.output + }}'\nsteps:\n- {id: a, queue: q, command: c}\n",
            "output",
            "",
        );
    }

    #[test]
    fn plain_list_is_a_sequence_and_empty_depends_on_is_a_root() {
        let workflow = parse(
            "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: q, command: c}\n- {id: c, queue: q, command: c, depends_on: []}\n",
        )
        .unwrap();
        assert_eq!(workflow.steps[0].depends_on, Vec::<usize>::new());
        assert_eq!(workflow.steps[1].depends_on, vec![0]);
        assert_eq!(workflow.steps[2].depends_on, Vec::<usize>::new());
    }

    #[test]
    fn api_example_definition_is_accepted() {
        let workflow = Workflow::from_document(
            "create_mysql_instance",
            r#"
name: create_mysql_instance
description: Create a MySQL instance and reserve its resources
params:
  type: object
  required: [cpu, memory, storage]
timeout: 2h
priority: 0
steps:
  - id: check_resource
    queue: resource
    command: check_resource
    timeout: 300s
    retry: { max_attempts: 1 }
    compensate: { queue: monitor, command: report_event, timeout: 300s, retry: { max_attempts: 4 } }
  - id: init_instance
    queue: mysql
    command: init_instance
    input: { size_gb: "${{ params.storage }}" }
    timeout: 30m
    retry: { max_attempts: 4, backoff: exponential, initial: 1s, max_interval: 10s }
    compensate: { queue: mysql, command: clean_instance, timeout: 15m, retry: { max_attempts: 4 } }
  - id: deduct_resource
    queue: resource
    command: deduct_resource
    depends_on: [init_instance]
    retry: { max_attempts: 3, backoff: fixed, initial: 2s }
    compensate: { queue: resource, command: restore_resource }
"#,
        )
        .unwrap();
        assert_eq!(workflow.timeout, Some(Duration::from_secs(7200)));
        let init = &workflow.steps[1];
        assert_eq!(init.handler().unwrap().retry.max_attempts, 4);
        assert_eq!(init.handler().unwrap().retry.backoff, Backoff::Exponential);
        assert_eq!(init.handler().unwrap().timeout, Duration::from_secs(1800));
        assert_eq!(
            workflow.steps[2].compensate.as_ref().unwrap().timeout,
            DEFAULT_ATTEMPT_TIMEOUT
        );
    }

    #[test]
    fn duplicate_step_id_is_named() {
        check_error(
            "steps:\n- {id: a, queue: q, command: c}\n- {id: a, queue: q, command: c}\n",
            "steps[1] (a).id",
            "duplicate step id 'a'",
        );
    }

    #[test]
    fn unknown_dependency_is_named() {
        check_error(
            "steps:\n- {id: a, queue: q, command: c, depends_on: [nope]}\n",
            "steps[0] (a).depends_on",
            "unknown step id 'nope'",
        );
    }

    #[test]
    fn cycle_is_reported_with_its_path() {
        check_error(
            "steps:\n- {id: a, queue: q, command: c, depends_on: [b]}\n- {id: b, queue: q, command: c, depends_on: [a]}\n",
            "steps[0] (a).depends_on",
            "dependency cycle: a -> b -> a",
        );
    }

    #[test]
    fn bad_duration_names_step_and_field() {
        check_error(
            "steps:\n- {id: a, queue: q, command: c, retry: {max_attempts: 2, initial: 5x}}\n",
            "steps[0] (a).retry.initial",
            "'5x' is not a duration",
        );
    }

    #[test]
    fn missing_queue_and_command_are_named() {
        check_error(
            "steps:\n- {id: a, command: c}\n",
            "steps[0] (a).queue",
            "missing",
        );
        check_error(
            "steps:\n- {id: a, queue: q}\n",
            "steps[0] (a).command",
            "missing",
        );
        check_error(
            "steps:\n- {id: a, queue: q, command: c, compensate: {queue: q}}\n",
            "steps[0] (a).compensate.command",
            "missing",
        );
    }

    #[test]
    fn bad_expression_is_named_with_column() {
        check_error(
            "steps:\n- {id: a, queue: q, command: c, when: \"${{ params.x == }}\"}\n",
            "steps[0] (a).when",
            "column",
        );
    }

    #[test]
    fn expression_reading_a_step_that_is_not_upstream_is_rejected() {
        check_error(
            "steps:\n- {id: a, queue: q, command: c, depends_on: []}\n- {id: b, queue: q, command: c, depends_on: [], input: {x: '${{ steps.a.output.x }}'}}\n",
            "steps[1] (b).input",
            "not upstream",
        );
        check_error(
            "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: q, command: c, input: {x: '${{ stepz.a }}'}}\n",
            "steps[1] (b).input",
            "unknown name 'stepz'",
        );
        check_error(
            "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: q, command: c, input: {x: '${{ item }}'}}\n",
            "steps[1] (b).input",
            "unknown name 'item'",
        );
    }

    #[test]
    fn malformed_yaml_reports_line_and_column() {
        let error = parse("steps:\n  - id: a\n   queue: [\n").unwrap_err();
        assert!(error.problems[0].field.starts_with("line "), "got {error}");
        assert!(error.problems[0].message.contains("malformed YAML"));
    }

    #[test]
    fn unknown_field_is_rejected() {
        check_error(
            "steps:\n- {id: a, queue: q, command: c, qeue: x}\n",
            "steps[0] (a).qeue",
            "unknown field `qeue`",
        );
    }

    #[test]
    fn type_errors_name_the_field_in_yaml_and_json() {
        let cases = [
            (
                "steps:\n- {id: a, queue: q, command: 5}\n",
                "steps[0] (a).command",
                "invalid type: integer `5`, expected a string",
            ),
            (
                r#"{"steps": [{"id": "a", "queue": "q", "command": false}]}"#,
                "steps[0] (a).command",
                "invalid type: boolean `false`, expected a string",
            ),
            (
                "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: q, command: c, depends_on: [1]}\n",
                "steps[1] (b).depends_on[0]",
                "expected a string",
            ),
            (
                "steps:\n- {id: a, queue: q, command: c, retry: {max_attempts: -1}}\n",
                "steps[0] (a).retry.max_attempts",
                "expected u32",
            ),
            (
                "steps:\n- {id: a, queue: q, command: c, retry: {jitter: yes}}\n",
                "steps[0] (a).retry.jitter",
                "expected a boolean",
            ),
            (
                "steps:\n- {id: a, queue: q, command: c, compensate: {queue: q, command: [x]}}\n",
                "steps[0] (a).compensate.command",
                "expected a string",
            ),
            (
                r#"{"steps": [{"id": "a", "queue": "q", "command": "c", "compensate": "undo"}]}"#,
                "steps[0] (a).compensate",
                "expected a handler",
            ),
            ("steps:\n- 3\n", "steps[0]", "expected a step"),
            (
                "priority: high\nsteps:\n- {id: a, queue: q, command: c}\n",
                "priority",
                "expected i32",
            ),
            (
                "lock: {key: k, slots: many}\nsteps:\n- {id: a, queue: q, command: c}\n",
                "lock.slots",
                "expected u32",
            ),
            ("steps: {id: a}\n", "steps", "expected a sequence"),
            ("description: x\n", "document", "missing field `steps`"),
        ];
        for (document, field, message) in cases {
            check_error(document, field, message);
        }
    }

    #[test]
    fn yaml_reads_yes_no_on_off_y_n_as_strings() {
        let workflow = parse(
            "steps:\n- {id: a, queue: q, command: no}\n- {id: b, queue: q, command: y, input: {a: yes, b: off, c: N, d: true, e: FALSE, f: True}}\n",
        )
        .unwrap();
        assert_eq!(workflow.steps[0].handler().unwrap().command, "no");
        assert_eq!(workflow.steps[1].handler().unwrap().command, "y");
        let input = workflow.steps[1].handler().unwrap().input.as_ref().unwrap();
        assert_eq!(
            input.render(&Value::Null).unwrap(),
            serde_json::json!({"a": "yes", "b": "off", "c": "N", "d": true, "e": false, "f": true})
        );
    }

    #[test]
    fn a_params_schema_of_false_is_refused() {
        check_error(
            "params: false\nsteps:\n- {id: a, queue: q, command: c}\n",
            "params",
            "accepts no params",
        );
        let workflow = parse("params: true\nsteps:\n- {id: a, queue: q, command: c}\n").unwrap();
        assert_eq!(workflow.params_schema, Some(Value::Bool(true)));
    }

    #[test]
    fn a_constant_part_that_cannot_be_evaluated_is_refused() {
        check_error(
            "steps:\n- {id: a, queue: q, command: c, when: '${{ 1 / 0 }}'}\n",
            "steps[0] (a).when",
            "division by zero at column 7",
        );
        check_error(
            "steps:\n- {id: a, queue: q, command: c, input: {x: '${{ params.n + 1 / 0 }}'}}\n",
            "steps[0] (a).input",
            "in \"x\": division by zero at column 18",
        );
        check_error(
            "steps:\n- {id: a, queue: q, command: c, for_each: \"${{ range('3') }}\"}\n",
            "steps[0] (a).for_each",
            "range: expected a number, got string",
        );
        check_error(
            "lock: {key: \"k-${{ params.n + (2 - 'x') }}\"}\nsteps:\n- {id: a, queue: q, command: c}\n",
            "lock.key",
            "cannot subtract string from number",
        );
    }

    #[test]
    fn name_in_document_must_match() {
        check_error(
            "name: other\nsteps:\n- {id: a, queue: q, command: c}\n",
            "name",
            "make them agree",
        );
    }

    #[test]
    fn labels_are_the_defaults_of_jobs_and_each_bad_one_is_named() {
        let workflow =
            parse("labels: {team: storage, tier: '1'}\nsteps:\n- {id: a, queue: q, command: c}\n")
                .unwrap();
        assert_eq!(workflow.labels.len(), 2);
        assert_eq!(workflow.labels["team"], "storage");
        assert!(
            parse("steps:\n- {id: a, queue: q, command: c}\n")
                .unwrap()
                .labels
                .is_empty()
        );
        let steps = "steps:\n- {id: a, queue: q, command: c}\n";
        check_error(
            &format!("labels: {{Team: x}}\n{steps}"),
            "labels.Team",
            "such as 'team'",
        );
        check_error(
            &format!("labels: {{team: '{}'}}\n{steps}", "v".repeat(256)),
            "labels.team",
            "longer than the limit of 255",
        );
        check_error(
            &format!("labels: {{team: \"a\\0b\"}}\n{steps}"),
            "labels.team",
            "NUL",
        );
        check_error(
            &format!("labels: {{tier: 1}}\n{steps}"),
            "labels.tier",
            "expected a string",
        );
        check_error(
            &format!("labels: [team]\n{steps}"),
            "labels",
            "expected a map",
        );
    }

    #[test]
    fn lock_key_may_read_params_and_slots_must_be_positive() {
        let workflow = parse(
            "lock: {key: 'cluster-${{ params.cluster }}', slots: 5}\nsteps:\n- {id: a, queue: q, command: c}\n",
        )
        .unwrap();
        assert_eq!(workflow.lock.unwrap().slots, 5);
        check_error(
            "lock: {key: 'k', slots: 0}\nsteps:\n- {id: a, queue: q, command: c}\n",
            "lock.slots",
            "between 1",
        );
        check_error(
            "lock: {key: '${{ steps.a.output }}'}\nsteps:\n- {id: a, queue: q, command: c}\n",
            "lock.key",
            "may read params and job",
        );
    }

    #[test]
    fn a_step_lock_and_rate_read_params_steps_and_a_fan_outs_item() {
        let workflow = parse(
            "steps:\n- {id: pick, queue: q, command: c}\n- id: call\n  queue: q\n  command: c\n  for_each: '${{ params.hosts }}'\n  lock: {key: 'host-${{ item }}-${{ steps.pick.output.zone }}', slots: 3}\n  rate: {key: '${{ params.tenant }}', limit: 10/1m}\n- {id: http, queue: q, http: {url: 'https://example.com'}, lock: {key: k}, rate: {key: k, limit: {tokens: 5, per: 30}}}\n",
        )
        .unwrap();
        let call = &workflow.steps[1];
        assert_eq!(call.lock.as_ref().unwrap().slots, 3);
        let rate = call.rate.as_ref().unwrap().limit;
        assert_eq!((rate.tokens, rate.per), (10, Duration::from_secs(60)));
        let http = workflow.steps[2].rate.as_ref().unwrap().limit;
        assert_eq!((http.tokens, http.per), (5, Duration::from_secs(30)));
        assert_eq!(workflow.steps[2].lock.as_ref().unwrap().slots, 1);
        check_error(
            "steps:\n- {id: a, queue: q, command: c, lock: {key: '${{ item }}'}}\n",
            "steps[0] (a).lock.key",
            "item",
        );
        check_error(
            "steps:\n- {id: a, queue: q, command: c, rate: {key: '${{ steps.b.output }}', limit: 1/1s}}\n- {id: b, queue: q, command: c}\n",
            "steps[0] (a).rate.key",
            "'b'",
        );
        check_error(
            "steps:\n- {id: a, queue: q, command: c, lock: {key: k, slots: 0}}\n",
            "steps[0] (a).lock.slots",
            "between 1",
        );
        check_error(
            "steps:\n- {id: a, queue: q, command: c, lock: {key: [k]}}\n",
            "steps[0] (a).lock.key",
            "must be a string",
        );
    }

    #[test]
    fn a_step_rate_limit_is_refused_unless_it_is_starts_per_duration() {
        for (limit, message) in [
            ("ten/1m", "not a number of starts"),
            ("10", "not a rate"),
            ("0/1m", "at least 1 start"),
            ("10/soon", "duration"),
            ("{tokens: 10}", "`per` is missing"),
        ] {
            check_error(
                &format!(
                    "steps:\n- {{id: a, queue: q, command: c, rate: {{key: k, limit: {limit}}}}}\n"
                ),
                "steps[0] (a).rate.limit",
                message,
            );
        }
        check_error(
            "steps:\n- {id: a, queue: q, command: c, rate: {key: k}}\n",
            "steps[0] (a).rate",
            "limit",
        );
    }

    #[test]
    fn only_steps_a_worker_runs_take_a_lock_or_a_rate_and_sub_workflow_steps_a_lock() {
        for step in [
            "{id: a, sleep: 1m, lock: {key: k}}",
            "{id: a, signal: go, rate: {key: k, limit: 1/1s}}",
            "{id: a, set: {x: 1}, lock: {key: k}}",
        ] {
            let field = if step.contains("lock") {
                "lock"
            } else {
                "rate"
            };
            check_error(
                &format!("steps:\n- {step}\n"),
                &format!("steps[0] (a).{field}"),
                "only a step a worker runs",
            );
        }
        // A sub-workflow step's child holds its lock; it claims no task to pay a rate with.
        let workflow =
            parse("steps:\n- {id: a, workflow: other, lock: {key: k, slots: 2}}\n").unwrap();
        assert_eq!(workflow.steps[0].lock.as_ref().unwrap().slots, 2);
        check_error(
            "steps:\n- {id: a, workflow: other, rate: {key: k, limit: 1/1s}}\n",
            "steps[0] (a).rate",
            "takes no `rate`",
        );
    }

    #[test]
    fn exponential_backoff_doubles_and_caps() {
        let policy = RetryPolicy {
            max_attempts: 10,
            backoff: Backoff::Exponential,
            initial: Duration::from_secs(1),
            max_interval: Duration::from_secs(10),
            jitter: false,
        };
        let delays: Vec<u64> = (1..=6).map(|n| policy.delay(n, 0).as_millis()).collect();
        assert_eq!(delays, vec![1000, 2000, 4000, 8000, 10000, 10000]);
        assert_eq!(policy.delay(500, 0).as_millis(), 10000);
    }

    #[test]
    fn jitter_stays_within_half_and_full_delay() {
        let policy = RetryPolicy {
            jitter: true,
            initial: Duration::from_secs(4),
            ..RetryPolicy::default()
        };
        for seed in [0, 1, 999, u64::MAX] {
            let delay = policy.delay(1, seed).as_millis();
            assert!((2000..=4000).contains(&delay), "{delay}");
        }
    }
}
