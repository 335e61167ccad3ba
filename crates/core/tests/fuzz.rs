//! Property-based fuzzing of what users control: the definition parser (YAML and JSON, arbitrary
//! text, token soups and generated definitions run through the state machine) and the
//! expression engine (parse and evaluate against arbitrary data). The properties: no panic, and
//! bounded work and memory — inputs built to explode (alias bombs, deep nesting, growing
//! results) are refused rather than followed.
//!
//! Each property runs a fixed, modest number of cases in CI; `PROPTEST_CASES=100000 cargo test
//! -p starbridge-core --test fuzz` runs a longer campaign.

use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Map, Value, json};
use starbridge_core::definition::{Workflow, parse_document};
use starbridge_core::expr::{Expr, Template, compile_condition};
use starbridge_core::ids::{JobId, SequentialIds};
use starbridge_core::limits::{Limits, json_exceeds};
use starbridge_core::machine::{self, Ctx, NewJob};
use starbridge_core::model::{Input, JobState, TaskStatus};
use starbridge_core::time::{Duration, Timestamp};

/// Cases per property unless `PROPTEST_CASES` says otherwise.
fn config(cases: u32) -> Config {
    Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(cases),
        failure_persistence: None,
        ..Config::default()
    }
}

/// Largest value an expression may produce: the engine's result limit is 1,000,000 bytes or
/// items; a JSON rendering of such a result stays within a small multiple of it.
const RESULT_BOUND: usize = 16 << 20;

/// Pieces of YAML and JSON syntax, definition keys and expression syntax, so that random
/// sequences reach deep into the parser and the validator.
const YAML_TOKENS: &[&str] = &[
    "steps:",
    "- ",
    "id: ",
    "queue: ",
    "command: ",
    "input: ",
    "depends_on: ",
    "when: ",
    "for_each: ",
    "concurrency: ",
    "retry: ",
    "max_attempts: ",
    "backoff: ",
    "exponential",
    "initial: ",
    "timeout: ",
    "step_timeout: ",
    "compensate: ",
    "lock: ",
    "key: ",
    "slots: ",
    "params: ",
    "name: ",
    "priority: ",
    "\n",
    "\n  ",
    "\n    ",
    "  ",
    "[",
    "]",
    "{",
    "}",
    ":",
    ", ",
    "'",
    "\"",
    "a",
    "b",
    "q",
    "c",
    "1",
    "0",
    "-1",
    "1e999",
    "30s",
    "5m",
    "null",
    "~",
    "true",
    "&x ",
    "*x",
    "<<: ",
    "!!str ",
    "!!binary ",
    "---\n",
    "...\n",
    "# c\n",
    "|\n  ",
    ">\n  ",
    "? ",
    "${{ ",
    " }}",
    "params.x",
    "steps.a.output",
    "item",
    "index",
    "\t",
    "é",
    "\u{0}",
    "\\",
    "%YAML 1.2\n",
];

fn yaml_soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(YAML_TOKENS), 0..80).prop_map(|t| t.concat())
}

/// Any JSON value, nested a few levels.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[a-z${}. ']{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,6}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

/// Expressions the way users write them in definitions, valid or nearly so.
fn expression() -> impl Strategy<Value = String> {
    let leaf = prop::sample::select(vec![
        "params.x",
        "params.items",
        "params.n",
        "steps.a.output",
        "steps.a.output.list",
        "steps.b.status",
        "job.id",
        "item",
        "index",
        "task.output",
        "1",
        "-3",
        "2.5",
        "'s'",
        "null",
        "true",
        "[1, 2, 3]",
        "range(3)",
        "nope.x",
    ])
    .prop_map(String::from);
    leaf.prop_recursive(4, 24, 3, |inner| {
        let op = prop::sample::select(vec![
            "==", "!=", "<", ">=", "&&", "||", "+", "-", "*", "/", "%", "in",
        ]);
        let function = prop::sample::select(vec![
            "len", "toJSON", "fromJSON", "keys", "values", "string", "number", "upper", "range",
        ]);
        prop_oneof![
            (inner.clone(), op, inner.clone()).prop_map(|(a, op, b)| format!("({a} {op} {b})")),
            (function, inner.clone()).prop_map(|(f, a)| format!("{f}({a})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("default({a}, {b})")),
            (inner.clone(), inner).prop_map(|(a, b)| format!("({a})[{b}]")),
        ]
    })
}

/// Expressions that try to grow their result: repetition, ranges, joins, string formatting and
/// JSON re-encoding nested as deep as the parser allows.
fn explosive_expression() -> impl Strategy<Value = String> {
    let seed = prop::sample::select(vec![
        "'ab\"\\\\'",
        "range(1000)",
        "range(999999)",
        "params.big",
        "[params.big, params.big]",
        "split(params.big, '')",
    ])
    .prop_map(String::from);
    seed.prop_recursive(12, 64, 2, |inner| {
        prop_oneof![
            inner.clone().prop_map(|a| format!("toJSON({a})")),
            inner.clone().prop_map(|a| format!("join({a}, '--------')")),
            inner
                .clone()
                .prop_map(|a| format!("format('{{0}}{{0}}{{0}}{{0}}', {a})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} + {b})")),
            inner.clone().prop_map(|a| format!("range(len({a}))")),
            inner.prop_map(|a| format!("split(toJSON({a}), '')")),
        ]
    })
}

fn context() -> Value {
    json!({
        "params": {"x": "prod", "items": [1, 2, 3], "n": 4, "big": "x".repeat(10_000)},
        "steps": {
            "a": {"status": "succeeded", "output": {"list": ["h0", "h1"], "n": 2}},
            "b": {"status": "skipped", "output": null},
        },
        "job": {"id": "job_1", "namespace": "default", "workflow": "wf", "version": 1},
        "item": "h0",
        "index": 0,
        "task": {"output": {"path": "/tmp"}},
    })
}

/// A step of a generated definition; ids come from a small pool so duplicates, unknown
/// dependencies and cycles all occur.
fn step() -> impl Strategy<Value = Value> {
    let id = prop::sample::select(vec!["a", "b", "c", "d", "e", "1bad"]);
    let dependencies = prop::option::of(prop::collection::vec(
        prop::sample::select(vec!["a", "b", "c", "d", "zz"]),
        0..3,
    ));
    let retry = prop::option::of(prop_oneof![
        any_json(),
        (
            0u32..5,
            prop::sample::select(vec!["fixed", "exponential", "odd"])
        )
            .prop_map(
                |(n, backoff)| json!({"max_attempts": n, "backoff": backoff, "initial": "1s"})
            ),
    ]);
    let timeout = prop::option::of(prop_oneof![
        prop::sample::select(vec!["30s", "5m", "0s", "-1", "1e999", "soon"]).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
    ]);
    (
        id,
        dependencies,
        prop::option::of(expression()),
        prop::option::of(expression()),
        prop::option::of(any_json()),
        retry,
        timeout,
        prop::option::of(0u32..4),
        any::<bool>(),
    )
        .prop_map(
            |(id, depends_on, when, for_each, input, retry, timeout, concurrency, compensate)| {
                let mut step = json!({"id": id, "queue": "q", "command": "c"});
                let object = step.as_object_mut().expect("an object");
                if let Some(depends_on) = depends_on {
                    object.insert("depends_on".into(), json!(depends_on));
                }
                if let Some(when) = when {
                    object.insert("when".into(), json!(format!("${{{{ {when} }}}}")));
                }
                if let Some(for_each) = for_each {
                    object.insert("for_each".into(), json!(format!("${{{{ {for_each} }}}}")));
                }
                if let Some(input) = input {
                    object.insert("input".into(), input);
                }
                if let Some(retry) = retry {
                    object.insert("retry".into(), retry);
                }
                if let Some(timeout) = timeout {
                    object.insert("timeout".into(), timeout);
                }
                if let Some(concurrency) = concurrency {
                    object.insert("concurrency".into(), json!(concurrency));
                }
                if compensate {
                    object.insert(
                        "compensate".into(),
                        json!({"queue": "q", "command": "undo", "input": {"o": "${{ task.output }}"}}),
                    );
                }
                step
            },
        )
}

fn definition() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(step(), 0..6),
        prop::option::of(any_json()),
        prop::option::of(prop::sample::select(vec![
            json!({"key": "k-${{ params.x }}", "slots": 2}),
            json!({"key": "${{ steps.a.output }}"}),
            json!({"key": 3}),
        ])),
    )
        .prop_map(|(steps, params, lock)| {
            let mut definition = json!({ "steps": steps });
            if let Some(params) = params {
                definition["params"] = params;
            }
            if let Some(lock) = lock {
                definition["lock"] = lock;
            }
            definition
        })
}

/// Equal JSON, except that floats may differ in their last bits: the YAML reader rounds some
/// extreme floats (such as 1.0601043119910533e-287) one unit off the JSON reader.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            x == y || (x - y).abs() <= 4.0 * f64::EPSILON * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// Runs a job of `workflow` to its end: every ready task is claimed and completed (with
/// `outputs` in turn) or failed, until nothing is ready or a step budget runs out.
fn run_job(workflow: &Workflow, params: Value, outputs: &[Value], fail_every: usize) {
    let mut ids = SequentialIds::default();
    let limits = Limits {
        fan_out: 50,
        task_bytes: 64 << 10,
        pending_signals: 4,
        workflow_depth: 2,
        labels: 4,
    };
    let mut now = Timestamp(1_000_000);
    let created = machine::create_job(
        workflow,
        NewJob::new(JobId::from_unique("1"), "default".into(), 1, params),
        &mut Ctx {
            now,
            ids: &mut ids,
            limits,
        },
    );
    let Ok((mut state, _)) = created else { return };
    let mut apply = |state: &mut JobState, input: Input, now: Timestamp| {
        let _ = machine::apply(
            workflow,
            state,
            input,
            &mut Ctx {
                now,
                ids: &mut ids,
                limits,
            },
        );
    };
    apply(&mut state, Input::Start, now);
    for round in 0..200 {
        let ready: Vec<_> = state
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Ready)
            .map(|t| t.id.clone())
            .collect();
        if ready.is_empty() {
            // Let backoffs and deadlines pass once; stop when that changes nothing.
            now = now.saturating_add(Duration::from_secs(7200));
            apply(&mut state, Input::Tick, now);
            if !state.tasks.iter().any(|t| t.status == TaskStatus::Ready) {
                break;
            }
            continue;
        }
        for (n, task) in ready.into_iter().enumerate() {
            let lease_token = format!("lease-{round}-{n}");
            apply(
                &mut state,
                Input::Claim {
                    task: task.clone(),
                    worker: "w".into(),
                    lease_token: lease_token.clone(),
                    callback_hash: lease_token.clone(),
                },
                now,
            );
            let input = if fail_every > 0 && (round + n) % fail_every == 0 {
                Input::Fail {
                    task,
                    lease_token,
                    error: starbridge_core::model::ReportedError {
                        message: "boom".into(),
                        retryable: true,
                        retry_after: None,
                    },
                    logs: None,
                }
            } else {
                Input::Complete {
                    task,
                    lease_token,
                    output: outputs
                        .get((round + n) % outputs.len().max(1))
                        .cloned()
                        .unwrap_or(Value::Null),
                    logs: None,
                }
            };
            apply(&mut state, input, now);
        }
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn the_definition_parser_never_panics_on_arbitrary_text(text in "(?s).{0,400}") {
        let _ = parse_document(&text);
        let _ = Workflow::from_document("fuzz", &text);
    }

    #[test]
    fn the_definition_parser_never_panics_on_yaml_token_soup(text in yaml_soup()) {
        if let Ok(value) = parse_document(&text) {
            let _ = Workflow::from_value("fuzz", value);
        }
    }

    #[test]
    fn the_definition_parser_never_panics_on_json_token_soup(
        tokens in prop::collection::vec(prop::sample::select(vec![
            "{", "}", "[", "]", ",", ":", "\"steps\"", "\"id\"", "\"a\"", "\"queue\"", "1", "-0",
            "1e400", "null", "true", "\"\\u0000\"", "\"\\ud800\"", " ", "\n",
        ]), 0..60)
    ) {
        let text = tokens.concat();
        if let Ok(value) = parse_document(&text) {
            let _ = Workflow::from_value("fuzz", value);
        }
    }

    #[test]
    fn expressions_evaluate_against_arbitrary_data_without_panicking(
        source in expression(),
        data in any_json(),
    ) {
        if let Ok(expr) = Expr::parse(&source) {
            let mut context = context();
            context["params"] = data.clone();
            let _ = expr.eval(&context);
            let _ = expr.eval(&data);
            let _ = expr.references();
        }
        let _ = compile_condition(&source);
        if let Ok(template) = Template::compile(&json!({"v": format!("${{{{ {source} }}}}"), "t": format!("x-${{{{ {source} }}}}")})) {
            let _ = template.render(&context());
        }
    }
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn expressions_built_to_explode_stay_within_the_result_limit(source in explosive_expression()) {
        if let Ok(expr) = Expr::parse(&source)
            && let Ok(value) = expr.eval(&context())
        {
            prop_assert!(!json_exceeds(&value, RESULT_BOUND), "{source} produced over {RESULT_BOUND} bytes");
        }
    }

    #[test]
    fn generated_definitions_validate_and_run_without_panicking(
        document in definition(),
        params in any_json(),
        outputs in prop::collection::vec(any_json(), 1..4),
        fail_every in 0usize..4,
    ) {
        // The same document as JSON text and as YAML text (JSON is YAML) must agree.
        let text = document.to_string();
        let from_json = Workflow::from_document("fuzz", &text);
        let from_yaml = Workflow::from_document("fuzz", &format!("---\n{text}"));
        match (&from_json, &from_yaml) {
            (Ok(json), Ok(yaml)) => prop_assert!(
                same(&json.source, &yaml.source),
                "{} != {}", json.source, yaml.source
            ),
            (Err(json), Err(yaml)) => prop_assert_eq!(json.problems.len(), yaml.problems.len()),
            (json, yaml) => prop_assert!(false, "{json:?} != {yaml:?}"),
        }
        if let Ok(workflow) = from_json {
            run_job(&workflow, params, &outputs, fail_every);
        }
    }
}

#[test]
fn an_alias_bomb_is_refused_by_the_node_budget() {
    let mut document = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..9 {
        let previous = format!("*a{}", level - 1);
        let items = [previous.as_str(); 10].join(", ");
        document.push_str(&format!("a{level}: &a{level} [{items}]\n"));
    }
    document.push_str("steps: [{id: a, queue: q, command: c}]\n");
    assert!(document.len() < 1000);
    let error = parse_document(&document).unwrap_err();
    assert!(error.to_string().contains("budget"), "{error}");
}

#[test]
fn deep_nesting_is_refused_in_json_and_yaml() {
    for text in [
        format!("{{\"steps\": {}", "[".repeat(100_000)),
        "[".repeat(100_000),
        "{a: ".repeat(100_000),
        "- ".repeat(10_000) + "x",
    ] {
        let error = parse_document(&text).unwrap_err();
        assert!(
            error.to_string().contains("recursion") || error.to_string().contains("budget"),
            "{error}"
        );
    }
}

#[test]
fn a_yaml_flow_mapping_document_is_read_as_yaml() {
    let workflow = Workflow::from_document("flow", "{steps: [{id: a, queue: q, command: c}]}")
        .expect("a YAML flow mapping is a definition");
    assert_eq!(workflow.steps.len(), 1);
    // Text that is neither keeps the JSON reading's precise error.
    let error = parse_document("{\"steps\": [}").unwrap_err();
    assert!(error.to_string().contains("malformed JSON"), "{error}");
}
