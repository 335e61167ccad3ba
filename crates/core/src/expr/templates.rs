//! Templates: JSON values whose strings may hold `${{ ... }}` expressions
//! ([`Template`]), and conditions ([`compile_condition`]). Compiling scans
//! each string for `${{` and the `}}` that closes it (skipping quoted strings
//! inside), parses each expression with its columns counted in the whole
//! string, and keeps any part without an expression as a plain value.
//! Rendering evaluates the expressions and puts their values in place. Errors
//! name where the string stands inside the value (`input.size_gb`, `items[2]`).

use std::fmt::Write as _;

use serde_json::{Map, Value};

use super::eval::{Limited, eval_node, push_text};
use super::lexer::is_name_char;
use super::parser::{collect_references, dedup, parse_at};
use super::{Error, EvalError, Expr};

/// A JSON value in which strings may contain `${{ ... }}` expressions.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    root: TNode,
}

impl Template {
    /// Compiles every string in `value` (recursively through arrays and
    /// objects; object keys are literal, not templated).
    pub fn compile(value: &Value) -> Result<Template, Error> {
        Template::compile_keeping(value, &|_| false)
    }

    /// Compiles like [`Template::compile`], but keeps every string for which `literal` holds as
    /// plain text, its `${{ … }}` rendered as written (an HTTP step's secret references, which
    /// the worker resolves, not the server).
    pub fn compile_keeping(
        value: &Value,
        literal: &dyn Fn(&str) -> bool,
    ) -> Result<Template, Error> {
        let mut path = Vec::new();
        Ok(Template {
            root: compile_node(value, &mut path, literal)?,
        })
    }

    /// Renders to a JSON value.
    ///
    /// A string that is exactly one expression (`"${{ x }}"`) yields the
    /// expression's value with its JSON type kept. A string mixing text and
    /// expressions yields a string: each value is inserted as-is if it is a
    /// string, as nothing if null, else as its compact JSON text. A string
    /// with no expression is returned unchanged.
    pub fn render(&self, context: &Value) -> Result<Value, EvalError> {
        let mut path = Vec::new();
        render_node(&self.root, context, &mut path)
    }

    /// Every path read by the template's expressions (see
    /// [`Expr::references`]), without duplicates.
    pub fn references(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        template_references(&self.root, &mut out);
        dedup(out)
    }

    /// True when the template contains no expression at all.
    pub fn is_literal(&self) -> bool {
        matches!(self.root, TNode::Value(_))
    }

    /// The text around the expressions of a string template (the whole string when it holds
    /// none); nothing for a template that is not a string.
    pub fn text_parts(&self) -> Vec<&str> {
        match &self.root {
            TNode::Value(Value::String(text)) => vec![text],
            TNode::Interp(parts) => parts
                .iter()
                .filter_map(|part| match part {
                    Part::Text(text) => Some(text.as_str()),
                    Part::Expr(_) => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Compiles a condition: either a string holding exactly one `${{ ... }}`
/// (whitespace around it is ignored) or a bare expression string
/// (`params.env == 'prod'`).
pub fn compile_condition(source: &str) -> Result<Expr, Error> {
    if !source.trim_start().starts_with("${{") {
        return Expr::parse(source);
    }
    let mut found = None;
    for (column, part) in scan_template(source)? {
        match part {
            Part::Text(text) if text.trim().is_empty() => {}
            Part::Expr(expr) if found.is_none() => found = Some(expr),
            _ => {
                return Err(Error {
                    message: "a condition must be a single '${{ ... }}' or a bare expression"
                        .to_string(),
                    column,
                    path: String::new(),
                });
            }
        }
    }
    found.ok_or_else(|| Error {
        message: "empty expression".to_string(),
        column: 1,
        path: String::new(),
    })
}

#[derive(Debug, Clone, PartialEq)]
enum TNode {
    /// A value with no expression anywhere inside.
    Value(Value),
    /// A string that is exactly one expression: its value keeps its type.
    Expr(Expr),
    /// A string mixing text and expressions.
    Interp(Vec<Part>),
    Array(Vec<TNode>),
    Object(Vec<(String, TNode)>),
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Expr(Expr),
}

/// One step of the location of a string inside a template.
#[derive(Clone, Copy)]
enum PathSeg<'a> {
    Key(&'a str),
    Index(usize),
}

fn is_plain_name(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| is_name_char(c) || c == '-')
}

fn format_path(path: &[PathSeg<'_>]) -> String {
    let mut out = String::new();
    for (i, seg) in path.iter().enumerate() {
        match seg {
            PathSeg::Key(key) if is_plain_name(key) => {
                if i > 0 {
                    out.push('.');
                }
                out.push_str(key);
            }
            PathSeg::Key(key) => {
                out.push_str("['");
                for c in key.chars() {
                    if c == '\'' || c == '\\' {
                        out.push('\\');
                    }
                    out.push(c);
                }
                out.push_str("']");
            }
            PathSeg::Index(index) => {
                out.push('[');
                out.push_str(&index.to_string());
                out.push(']');
            }
        }
    }
    out
}

/// Splits a string into text and expressions; each part comes with the
/// 1-based column where it starts.
fn scan_template(s: &str) -> Result<Vec<(usize, Part)>, Error> {
    let chars: Vec<(usize, char)> = s.char_indices().collect();
    let mut parts = Vec::new();
    let mut text_start = (0, 0); // (char index, byte offset)
    let mut i = 0;
    while let Some(&(byte, _)) = chars.get(i) {
        if !s[byte..].starts_with("${{") {
            i += 1;
            continue;
        }
        if byte > text_start.1 {
            parts.push((
                text_start.0 + 1,
                Part::Text(s[text_start.1..byte].to_string()),
            ));
        }
        let body_start = i + 3;
        let close = find_close(&chars, i)?;
        let close_byte = chars.get(close).map_or(s.len(), |&(b, _)| b);
        let body = &s[byte + 3..close_byte];
        parts.push((i + 1, Part::Expr(parse_at(body, body_start)?)));
        i = close + 2;
        text_start = (i, close_byte + 2);
    }
    if text_start.1 < s.len() {
        parts.push((text_start.0 + 1, Part::Text(s[text_start.1..].to_string())));
    }
    Ok(parts)
}

/// Finds the `}}` closing the `${{` at char index `open`, skipping quoted
/// strings; returns the char index of its first `}`.
fn find_close(chars: &[(usize, char)], open: usize) -> Result<usize, Error> {
    let error = |at: usize, message: &str| Error {
        message: message.to_string(),
        column: at + 1,
        path: String::new(),
    };
    let mut quote: Option<(char, usize)> = None;
    let mut j = open + 3;
    while let Some(&(_, c)) = chars.get(j) {
        match quote {
            Some(_) if c == '\\' => j += 1,
            Some((q, _)) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some((c, j)),
            None if c == '}' && chars.get(j + 1).is_some_and(|&(_, d)| d == '}') => return Ok(j),
            None => {}
        }
        j += 1;
    }
    Err(match quote {
        Some((_, at)) => error(at, "unterminated string"),
        None => error(open, "unclosed '${{' (missing '}}')"),
    })
}

fn compile_node<'v>(
    value: &'v Value,
    path: &mut Vec<PathSeg<'v>>,
    literal: &dyn Fn(&str) -> bool,
) -> Result<TNode, Error> {
    let node = match value {
        Value::String(s) if literal(s) => TNode::Value(value.clone()),
        Value::String(s) => {
            let mut parts = scan_template(s).map_err(|mut e| {
                e.path = format_path(path);
                e
            })?;
            if !parts.iter().any(|(_, p)| matches!(p, Part::Expr(_))) {
                TNode::Value(value.clone())
            } else if let [(_, Part::Expr(_))] = parts.as_slice() {
                match parts.pop() {
                    Some((_, Part::Expr(expr))) => TNode::Expr(expr),
                    _ => TNode::Value(value.clone()),
                }
            } else {
                TNode::Interp(parts.into_iter().map(|(_, p)| p).collect())
            }
        }
        Value::Array(items) => {
            let mut nodes = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                path.push(PathSeg::Index(i));
                let node = compile_node(item, path, literal);
                path.pop();
                nodes.push(node?);
            }
            if nodes.iter().all(|n| matches!(n, TNode::Value(_))) {
                TNode::Value(value.clone())
            } else {
                TNode::Array(nodes)
            }
        }
        Value::Object(map) => {
            let mut entries = Vec::with_capacity(map.len());
            for (key, item) in map {
                path.push(PathSeg::Key(key));
                let node = compile_node(item, path, literal);
                path.pop();
                entries.push((key.clone(), node?));
            }
            if entries.iter().all(|(_, n)| matches!(n, TNode::Value(_))) {
                TNode::Value(value.clone())
            } else {
                TNode::Object(entries)
            }
        }
        _ => TNode::Value(value.clone()),
    };
    Ok(node)
}

fn in_template(error: EvalError, path: &[PathSeg<'_>]) -> EvalError {
    if path.is_empty() {
        error
    } else {
        EvalError::InTemplate {
            path: format_path(path),
            error: Box::new(error),
        }
    }
}

fn render_node<'t>(
    node: &'t TNode,
    ctx: &Value,
    path: &mut Vec<PathSeg<'t>>,
) -> Result<Value, EvalError> {
    match node {
        TNode::Value(value) => Ok(value.clone()),
        TNode::Expr(expr) => expr.eval(ctx).map_err(|e| in_template(e, path)),
        TNode::Interp(parts) => {
            let mut out = String::new();
            for part in parts {
                match part {
                    Part::Text(text) => Limited { out: &mut out }
                        .write_str(text)
                        .map_err(|_| EvalError::TooLarge),
                    Part::Expr(expr) => {
                        eval_node(&expr.root, ctx).and_then(|value| push_text(&value, &mut out))
                    }
                }
                .map_err(|e| in_template(e, path))?;
            }
            Ok(Value::String(out))
        }
        TNode::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                path.push(PathSeg::Index(i));
                let value = render_node(item, ctx, path);
                path.pop();
                out.push(value?);
            }
            Ok(Value::Array(out))
        }
        TNode::Object(entries) => {
            let mut out = Map::new();
            for (key, item) in entries {
                path.push(PathSeg::Key(key));
                let value = render_node(item, ctx, path);
                path.pop();
                out.insert(key.clone(), value?);
            }
            Ok(Value::Object(out))
        }
    }
}

fn template_references(node: &TNode, out: &mut Vec<Vec<String>>) {
    match node {
        TNode::Value(_) => {}
        TNode::Expr(expr) => collect_references(&expr.root, out),
        TNode::Interp(parts) => {
            for part in parts {
                if let Part::Expr(expr) = part {
                    collect_references(&expr.root, out);
                }
            }
        }
        TNode::Array(items) => {
            for item in items {
                template_references(item, out);
            }
        }
        TNode::Object(entries) => {
            for (_, item) in entries {
                template_references(item, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::expr::tests::{check_render, context};
    use crate::expr::{EvalError, Expr, Template, compile_condition};

    #[test]
    fn single_expression_templates_keep_the_json_type() {
        check_render(json!("${{ params.storage }}"), json!(20));
        check_render(json!("${{params.storage}}"), json!(20));
        check_render(json!("${{   params.tags  }}"), json!(["a", "b"]));
        check_render(
            json!("${{ params.nested }}"),
            json!({"x": {"y": [10, 20, 30]}}),
        );
        check_render(json!("${{ params.missing }}"), json!(null));
        check_render(json!("${{ params.ratio }}"), json!(0.5));
        check_render(json!("${{ index > 1 }}"), json!(true));
    }

    #[test]
    fn mixed_templates_interpolate_text() {
        check_render(
            json!("db-${{ params.cluster }}-${{ index }}"),
            json!("db-east-2"),
        );
        check_render(json!(" ${{ index }}"), json!(" 2"));
        check_render(json!("${{ index }}${{ index }}"), json!("22"));
        check_render(json!("[${{ params.missing }}]"), json!("[]"));
        check_render(json!("tags=${{ params.tags }}"), json!(r#"tags=["a","b"]"#));
        check_render(
            json!("r=${{ params.ratio }} ok=${{ true }}"),
            json!("r=0.5 ok=true"),
        );
        check_render(json!("${{ '}}' }}!"), json!("}}!"));
        check_render(json!("${{ \"a}}b\" + 'c\\'}}' }}"), json!("a}}bc'}}"));
        check_render(json!("héllo ${{ 'wörld' }} ✓"), json!("héllo wörld ✓"));
        check_render(json!("braces } and }} stay"), json!("braces } and }} stay"));
    }

    #[test]
    fn templates_render_nested_values() {
        check_render(
            json!({
                "input": {
                    "size_gb": "${{ params.storage }}",
                    "name": "db-${{ params.cluster }}-${{ index }}",
                    "fixed": 3,
                    "list": ["${{ index }}", "plain", ["${{ params.env }}"]],
                },
                "${{ not.a.key }}": "literal",
            }),
            json!({
                "input": {
                    "size_gb": 20,
                    "name": "db-east-2",
                    "fixed": 3,
                    "list": [2, "plain", ["prod"]],
                },
                "${{ not.a.key }}": "literal",
            }),
        );
    }

    #[test]
    fn literal_templates_are_unchanged() {
        for value in [
            json!("plain"),
            json!("costs $5 {not} an ${ expression }"),
            json!(null),
            json!(4.5),
            json!([1, "a", {"b": [true]}]),
            json!({"k": "v", "n": {"m": null}}),
        ] {
            let template = Template::compile(&value).unwrap();
            assert!(template.is_literal(), "{value}");
            assert_eq!(template.render(&json!({})).unwrap(), value);
            assert!(template.references().is_empty());
        }
        assert!(
            !Template::compile(&json!({"a": ["${{ x }}"]}))
                .unwrap()
                .is_literal()
        );
    }

    #[test]
    fn unclosed_template_expressions_are_errors() {
        let error = Template::compile(&json!({"name": "db-${{ params.cluster"})).unwrap_err();
        assert_eq!(error.message, "unclosed '${{' (missing '}}')");
        assert_eq!(error.column, 4);
        assert_eq!(error.path, "name");
        let error = Template::compile(&json!("${{ 'abc }}")).unwrap_err();
        assert_eq!(
            (error.message.as_str(), error.column),
            ("unterminated string", 5)
        );
        let error = Template::compile(&json!("${{ }}")).unwrap_err();
        assert_eq!(
            (error.message.as_str(), error.column),
            ("empty expression", 4)
        );
    }

    #[test]
    fn template_evaluation_errors_name_the_location() {
        let template = Template::compile(&json!({"a": [1, "${{ 1 / zero }}"]})).unwrap();
        let error = template.render(&json!({"zero": 0})).unwrap_err();
        assert_eq!(
            error,
            EvalError::InTemplate {
                path: "a[1]".to_string(),
                error: Box::new(EvalError::DivisionByZero)
            }
        );
        assert_eq!(error.to_string(), "in \"a[1]\": division by zero");
        let template = Template::compile(&json!("x${{ 'a' + one }}")).unwrap();
        assert_eq!(
            template.render(&json!({"one": 1})),
            Err(EvalError::Type("cannot add string and number".to_string()))
        );
    }

    #[test]
    fn template_references_cover_all_strings() {
        let template = Template::compile(&json!({
            "a": "${{ params.storage }}",
            "b": ["x-${{ steps.check.output.hosts[0] }}-${{ params.storage }}"],
        }))
        .unwrap();
        assert_eq!(
            template.references(),
            vec![
                vec!["params".to_string(), "storage".to_string()],
                vec![
                    "steps".to_string(),
                    "check".to_string(),
                    "output".to_string(),
                    "hosts".to_string()
                ],
            ]
        );
    }

    #[test]
    fn errors_display_with_location() {
        assert_eq!(
            Expr::parse("params.x + )").unwrap_err().to_string(),
            "unexpected ')' at column 12"
        );
        let error =
            Template::compile(&json!({"input": {"size_gb": "${{ lenn(x) }}"}})).unwrap_err();
        assert_eq!(
            error.to_string(),
            "in \"input.size_gb\": unknown function 'lenn' at column 5"
        );
        assert_eq!(error.path, "input.size_gb");
        let error = Template::compile(&json!({"items": [1, 2, "x ${{ ) }}"]})).unwrap_err();
        assert_eq!(
            error.to_string(),
            "in \"items[2]\": unexpected ')' at column 7"
        );
        let error = Template::compile(&json!({"my key": {"a'b": "${{ ( }}"}})).unwrap_err();
        assert_eq!(error.path, r"['my key']['a\'b']");
        let error = Template::compile(&json!("${{ ( }}")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "unexpected end of expression at column 7"
        );
    }

    #[test]
    fn conditions_accept_wrapped_or_bare_expressions() {
        let ctx = context();
        for src in [
            "${{ params.env == 'prod' }}",
            "  ${{ params.env == 'prod' }}\n",
            "params.env == 'prod'",
            "${{params.env=='prod'}}",
        ] {
            let expr = compile_condition(src).unwrap_or_else(|e| panic!("{src:?}: {e}"));
            assert_eq!(expr.eval(&ctx), Ok(json!(true)), "{src}");
        }
        let expr = compile_condition("x == '${{'").unwrap();
        assert_eq!(expr.eval(&json!({"x": "${{"})), Ok(json!(true)));
    }

    #[test]
    fn conditions_reject_mixed_text() {
        let error = compile_condition("${{ a }} && ${{ b }}").unwrap_err();
        assert!(error.message.contains("single"), "{error}");
        assert_eq!(error.column, 9);
        let error = compile_condition("${{ a ) }}").unwrap_err();
        assert_eq!(
            (error.message.as_str(), error.column),
            ("unexpected ')'", 7)
        );
        let error = compile_condition("${{ a").unwrap_err();
        assert!(error.message.contains("unclosed"), "{error}");
    }
}
