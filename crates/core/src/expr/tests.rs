//! What the tests of every part of the expression language share: a context,
//! `check` helpers that name the failing source, and generators of
//! expressions; and the properties of the language as a whole: no text makes
//! parsing, compiling a template or a condition, evaluating or rendering
//! panic, and a generated valid expression parses and evaluates alike alone
//! or as a template.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::{Expr, Template, compile_condition};

pub(super) fn context() -> Value {
    json!({
        "params": {
            "env": "prod",
            "storage": 20,
            "cluster": "east",
            "ratio": 0.5,
            "tags": ["a", "b"],
            "empty": "",
            "my key": "spaced",
            "which": "env",
            "nested": {"x": {"y": [10, 20, 30]}},
        },
        "steps": {
            "check": {"output": {"hosts": ["h1", "h2", "h3"]}},
            "make-db": {"output": {"id": "db-1"}},
        },
        "index": 2,
    })
}

#[track_caller]
pub(super) fn check(src: &str, context: Value, expected: Value) {
    let expr = Expr::parse(src).unwrap_or_else(|e| panic!("{src:?} does not parse: {e}"));
    let got = expr
        .eval(&context)
        .unwrap_or_else(|e| panic!("{src:?} fails: {e}"));
    assert_eq!(got, expected, "{src}");
}

#[track_caller]
pub(super) fn check_ctx(src: &str, expected: Value) {
    check(src, context(), expected);
}

#[track_caller]
pub(super) fn check_eval_error(src: &str, expected: &str) {
    check_eval_error_in(src, context(), expected);
}

#[track_caller]
pub(super) fn check_eval_error_in(src: &str, context: Value, expected: &str) {
    let expr = Expr::parse(src).unwrap_or_else(|e| panic!("{src:?} does not parse: {e}"));
    match expr.eval(&context) {
        Ok(v) => panic!("{src:?} gave {v}, expected error containing {expected:?}"),
        Err(e) => assert!(
            e.to_string().contains(expected),
            "{src:?}: error {e:?} does not contain {expected:?}"
        ),
    }
}

#[track_caller]
pub(super) fn check_parse_error(src: &str, expected: &str) {
    match Expr::parse(src) {
        Ok(e) => panic!("{src:?} parsed as {e:?}, expected error containing {expected:?}"),
        Err(e) => assert!(
            e.message.contains(expected),
            "{src:?}: error {e:?} does not contain {expected:?}"
        ),
    }
}

#[track_caller]
pub(super) fn check_parse_error_at(src: &str, expected: &str, column: usize) {
    check_parse_error(src, expected);
    let error = Expr::parse(src).err().map(|e| e.column);
    assert_eq!(error, Some(column), "column for {src:?}");
}

#[track_caller]
pub(super) fn check_render(template: Value, expected: Value) {
    let compiled =
        Template::compile(&template).unwrap_or_else(|e| panic!("{template} does not compile: {e}"));
    let got = compiled
        .render(&context())
        .unwrap_or_else(|e| panic!("{template} fails: {e}"));
    assert_eq!(got, expected, "{template}");
}

#[track_caller]
pub(super) fn check_refs(src: &str, expected: &[&[&str]]) {
    let expr = Expr::parse(src).unwrap_or_else(|e| panic!("{src:?} does not parse: {e}"));
    let expected: Vec<Vec<String>> = expected
        .iter()
        .map(|p| p.iter().map(|s| s.to_string()).collect())
        .collect();
    assert_eq!(expr.references(), expected, "{src}");
}

const TOKENS: &[&str] = &[
    "a", "b", "params", "steps", "index", ".", "[", "]", "(", ")", ",", "'x'", "\"y\"", "'", "\"",
    "\\", "1", "0", "-1", "2.5", "1e3", "null", "true", "false", "in", "+", "-", "*", "/", "%",
    "!", "==", "!=", "<", "<=", ">", ">=", "&&", "||", "=", "&", "|", "len", "format", "range",
    "join", "split", "default", "'{0}'", "é", "${{", "}}", "}", "{", "$", "-a", "a-", " ",
];

fn token_soup() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(prop::sample::select(TOKENS), 0..40),
        any::<bool>(),
    )
        .prop_map(|(tokens, spaced)| tokens.join(if spaced { " " } else { "" }))
}

/// Literal leaves of generated expressions; `literal_context()` holds
/// their values in `v`, in the same order.
const LITERALS: &[&str] = &[
    "null", "true", "false", "0", "1", "-1", "2.5", "'a'", "\"b\"", "''", "[]", "[1, 'a']", "1e308",
];

/// `context()` with the values of [`LITERALS`] in `v`.
pub(super) fn literal_context() -> Value {
    let mut context = context();
    context["v"] = json!([
        null,
        true,
        false,
        0,
        1,
        -1,
        2.5,
        "a",
        "b",
        "",
        [],
        [1, "a"],
        1e308
    ]);
    context
}

/// One generated expression written three ways: with its literal leaves
/// written out, with each written out or read from `v` at random, and
/// with all of them read from `v` (so that nothing folds).
pub(super) fn valid_expression() -> impl Strategy<Value = [String; 3]> {
    let literal = (0..LITERALS.len(), any::<bool>()).prop_map(|(i, read_in_mixed)| {
        let written = LITERALS[i].to_string();
        let read = format!("v[{i}]");
        let mixed = if read_in_mixed { &read } else { &written }.clone();
        [written, mixed, read]
    });
    let path = prop::sample::select(vec![
        "params",
        "params.env",
        "params.storage",
        "params.tags",
        "params.nested",
        "steps.check.output.hosts",
        "index",
        "missing.path",
    ])
    .prop_map(|path| [path; 3].map(String::from));
    let map = |forms: &[String; 3], f: &dyn Fn(&str) -> String| forms.each_ref().map(|a| f(a));
    let zip = |a: &[String; 3], b: &[String; 3], f: &dyn Fn(&str, &str) -> String| {
        std::array::from_fn(|k| f(&a[k], &b[k]))
    };
    prop_oneof![literal, path].prop_recursive(6, 64, 3, move |inner| {
        let unary_fn = prop::sample::select(vec![
            "len", "lower", "upper", "trim", "toJSON", "fromJSON", "string", "number", "keys",
            "values", "range", "format",
        ]);
        let binary_fn = prop::sample::select(vec![
            "contains",
            "startsWith",
            "endsWith",
            "join",
            "split",
            "default",
            "min",
            "max",
        ]);
        let op = prop::sample::select(vec![
            "||", "&&", "==", "!=", "<", "<=", ">", ">=", "in", "+", "-", "*", "/", "%",
        ]);
        prop_oneof![
            (inner.clone(), op, inner.clone()).prop_map(move |(a, op, b)| zip(
                &a,
                &b,
                &|a, b| format!("({a} {op} {b})")
            )),
            inner
                .clone()
                .prop_map(move |a| map(&a, &|a| format!("!{a}"))),
            inner
                .clone()
                .prop_map(move |a| map(&a, &|a| format!("-({a})"))),
            (inner.clone(), inner.clone())
                .prop_map(move |(a, b)| zip(&a, &b, &|a, b| format!("({a})[{b}]"))),
            inner
                .clone()
                .prop_map(move |a| map(&a, &|a| format!("({a}).x"))),
            (unary_fn, inner.clone()).prop_map(move |(f, a)| map(&a, &|a| format!("{f}({a})"))),
            (binary_fn, inner.clone(), inner.clone()).prop_map(move |(f, a, b)| zip(
                &a,
                &b,
                &|a, b| format!("{f}({a}, {b})")
            )),
            prop::collection::vec(inner, 1..3).prop_map(|items| {
                std::array::from_fn(|k| {
                    let forms: Vec<&str> = items.iter().map(|item| item[k].as_str()).collect();
                    format!("[{}]", forms.join(", "))
                })
            }),
        ]
    })
}

proptest! {
    #[test]
    fn parsing_arbitrary_text_never_panics(source in ".*") {
        let _ = Expr::parse(&source);
        let _ = compile_condition(&source);
        if let Ok(template) = Template::compile(&json!({"k": [source.clone()]})) {
            let _ = template.render(&context());
            let _ = template.references();
        }
    }

    #[test]
    fn token_soup_never_panics(source in token_soup()) {
        if let Ok(expr) = Expr::parse(&source) {
            let _ = expr.eval(&context());
            let _ = expr.references();
        }
        let _ = compile_condition(&source);
        let text = format!("pre ${{{{ {source} }}}} post");
        if let Ok(template) = Template::compile(&json!([text, {"k": source}])) {
            let _ = template.render(&context());
            let _ = template.references();
        }
    }

    #[test]
    fn valid_expressions_parse_and_evaluate_without_panicking(
        [_, _, source] in valid_expression(),
    ) {
        let context = literal_context();
        let expr = Expr::parse(&source);
        prop_assert!(expr.is_ok(), "{source:?}: {expr:?}");
        if let Ok(expr) = expr {
            let _ = expr.eval(&context);
            let _ = expr.references();
            let wrapped = Template::compile(&json!(format!("${{{{ {source} }}}}")));
            prop_assert_eq!(wrapped.map(|t| t.render(&context)).ok(), Some(expr.eval(&context)));
        }
    }
}
