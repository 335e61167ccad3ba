//! The built-in functions: the table of their names and argument counts, which
//! the parser checks every call against, and what each one computes. All but
//! `default` get their arguments evaluated; `default` evaluates its fallback
//! only when the first argument is `null`. Errors name the function
//! (`len: expected a string, list or object, got number`).

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt::Write as _;

use serde_json::{Map, Number, Value};

use super::eval::{
    Limited, Num, check_size, compare, eval_node, membership, push_json, push_text, type_name,
};
use super::parser::Node;
use super::{EvalError, MAX_RESULT};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Func {
    Len,
    Contains,
    StartsWith,
    EndsWith,
    Lower,
    Upper,
    Trim,
    Join,
    Split,
    ToJson,
    FromJson,
    String,
    Number,
    Default,
    Keys,
    Values,
    Min,
    Max,
    Range,
    Format,
}

/// Name, function, minimum argument count, whether more are accepted.
const FUNCTIONS: &[(&str, Func, usize, bool)] = &[
    ("len", Func::Len, 1, false),
    ("contains", Func::Contains, 2, false),
    ("startsWith", Func::StartsWith, 2, false),
    ("endsWith", Func::EndsWith, 2, false),
    ("lower", Func::Lower, 1, false),
    ("upper", Func::Upper, 1, false),
    ("trim", Func::Trim, 1, false),
    ("join", Func::Join, 2, false),
    ("split", Func::Split, 2, false),
    ("toJSON", Func::ToJson, 1, false),
    ("fromJSON", Func::FromJson, 1, false),
    ("string", Func::String, 1, false),
    ("number", Func::Number, 1, false),
    ("default", Func::Default, 2, false),
    ("keys", Func::Keys, 1, false),
    ("values", Func::Values, 1, false),
    ("min", Func::Min, 2, false),
    ("max", Func::Max, 2, false),
    ("range", Func::Range, 1, false),
    ("format", Func::Format, 1, true),
];

impl Func {
    pub(super) fn lookup(name: &str) -> Option<(Func, usize, bool)> {
        FUNCTIONS
            .iter()
            .find(|(n, ..)| *n == name)
            .map(|&(_, f, min, variadic)| (f, min, variadic))
    }

    fn name(self) -> &'static str {
        FUNCTIONS
            .iter()
            .find(|(_, f, ..)| *f == self)
            .map_or("?", |(n, ..)| n)
    }
}

fn bad_arg(func: Func, message: impl Into<String>) -> EvalError {
    EvalError::InvalidArgument {
        function: func.name().to_string(),
        message: message.into(),
    }
}

fn want_str(func: Func, value: &Value) -> Result<&str, EvalError> {
    match value {
        Value::String(s) => Ok(s),
        other => Err(bad_arg(
            func,
            format!("expected a string, got {}", type_name(other)),
        )),
    }
}

/// A collection argument where `null` counts as empty.
fn want_object(func: Func, value: &Value) -> Result<Option<&Map<String, Value>>, EvalError> {
    match value {
        Value::Null => Ok(None),
        Value::Object(map) => Ok(Some(map)),
        other => Err(bad_arg(
            func,
            format!("expected an object, got {}", type_name(other)),
        )),
    }
}

fn to_number(func: Func, value: &Value) -> Result<Value, EvalError> {
    match value {
        Value::Number(_) => Ok(value.clone()),
        Value::Bool(b) => Ok(Value::from(u8::from(*b))),
        Value::String(s) => {
            let text = s.trim();
            let parsed = if let Ok(i) = text.parse::<i64>() {
                Some(Value::from(i))
            } else if let Ok(u) = text.parse::<u64>() {
                Some(Value::from(u))
            } else {
                text.parse::<f64>()
                    .ok()
                    .and_then(Number::from_f64)
                    .map(Value::Number)
            };
            parsed.ok_or_else(|| {
                let shown: String = text.chars().take(40).collect();
                bad_arg(func, format!("cannot convert '{shown}' to a number"))
            })
        }
        other => Err(bad_arg(
            func,
            format!("cannot convert {} to a number", type_name(other)),
        )),
    }
}

fn range(func: Func, value: &Value) -> Result<Value, EvalError> {
    let n = match value {
        Value::Number(n) => match Num::of(n) {
            Num::Int(i) => i,
            Num::Float(f) if f.fract() == 0.0 && f.abs() < 1e18 => f as i128,
            Num::Float(f) => {
                return Err(bad_arg(func, format!("expected a whole number, got {f}")));
            }
        },
        other => {
            return Err(bad_arg(
                func,
                format!("expected a number, got {}", type_name(other)),
            ));
        }
    };
    if n > MAX_RESULT as i128 {
        return Err(EvalError::TooLarge);
    }
    let n = u32::try_from(n.max(0)).map_err(|_| EvalError::TooLarge)?;
    Ok(Value::Array((0..n).map(Value::from).collect()))
}

fn format(func: Func, template: &str, args: &[&Value]) -> Result<Value, EvalError> {
    let mut out = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '{' => {
                let mut digits = String::new();
                while let Some(d) = chars.next_if(char::is_ascii_digit) {
                    digits.push(d);
                }
                if digits.is_empty() || chars.next() != Some('}') {
                    return Err(bad_arg(
                        func,
                        "invalid placeholder (expected '{0}', '{1}', ... or '{{')",
                    ));
                }
                let arg = digits
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| args.get(i))
                    .ok_or_else(|| bad_arg(func, format!("no argument for '{{{digits}}}'")))?;
                push_text(arg, &mut out)?;
            }
            '}' => {
                if chars.peek() == Some(&'}') {
                    chars.next();
                }
                out.push('}');
            }
            other => out.push(other),
        }
        if out.len() > MAX_RESULT {
            return Err(EvalError::TooLarge);
        }
    }
    Ok(Value::String(out))
}

pub(super) fn call<'a>(
    func: Func,
    args: &'a [Node],
    ctx: &'a Value,
) -> Result<Cow<'a, Value>, EvalError> {
    if func == Func::Default {
        let [value, fallback] = args else {
            return Err(bad_arg(func, "expected 2 arguments"));
        };
        let value = eval_node(value, ctx)?;
        return if value.is_null() {
            eval_node(fallback, ctx)
        } else {
            Ok(value)
        };
    }
    let evaluated = args
        .iter()
        .map(|arg| eval_node(arg, ctx))
        .collect::<Result<Vec<_>, _>>()?;
    let values: Vec<&Value> = evaluated.iter().map(|v| &**v).collect();
    apply(func, &values).map(Cow::Owned)
}

/// Applies a function to evaluated arguments. Kept apart from the recursive
/// `eval_node`/`call` pair so its large stack frame is not part of the
/// recursion.
#[inline(never)]
fn apply(func: Func, values: &[&Value]) -> Result<Value, EvalError> {
    let result = match (func, values) {
        (Func::Len, [x]) => {
            let len = match x {
                Value::Null => 0,
                Value::String(s) => s.chars().count(),
                Value::Array(a) => a.len(),
                Value::Object(o) => o.len(),
                other => {
                    return Err(bad_arg(
                        func,
                        format!(
                            "expected a string, list or object, got {}",
                            type_name(other)
                        ),
                    ));
                }
            };
            Value::from(len)
        }
        (Func::Contains, [haystack, needle]) => {
            Value::Bool(membership(needle, haystack).map_err(|e| bad_arg(func, e.to_string()))?)
        }
        (Func::StartsWith, [s, p]) => {
            Value::Bool(want_str(func, s)?.starts_with(want_str(func, p)?))
        }
        (Func::EndsWith, [s, p]) => Value::Bool(want_str(func, s)?.ends_with(want_str(func, p)?)),
        (Func::Lower, [s]) => Value::String(want_str(func, s)?.to_lowercase()),
        (Func::Upper, [s]) => Value::String(want_str(func, s)?.to_uppercase()),
        (Func::Trim, [s]) => Value::String(want_str(func, s)?.trim().to_string()),
        (Func::Join, [list, sep]) => {
            let items: &[Value] = match list {
                Value::Null => &[],
                Value::Array(items) => items,
                other => {
                    return Err(bad_arg(
                        func,
                        format!("expected a list, got {}", type_name(other)),
                    ));
                }
            };
            let sep = want_str(func, sep)?;
            let mut out = String::new();
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    Limited { out: &mut out }
                        .write_str(sep)
                        .map_err(|_| EvalError::TooLarge)?;
                }
                push_text(item, &mut out)?;
            }
            Value::String(out)
        }
        (Func::Split, [s, sep]) => {
            let s = want_str(func, s)?;
            let sep = want_str(func, sep)?;
            let mut parts = Vec::new();
            let pieces: Box<dyn Iterator<Item = String>> = if sep.is_empty() {
                Box::new(s.chars().map(String::from))
            } else {
                Box::new(s.split(sep).map(String::from))
            };
            for piece in pieces {
                if parts.len() >= MAX_RESULT {
                    return Err(EvalError::TooLarge);
                }
                parts.push(Value::String(piece));
            }
            Value::Array(parts)
        }
        (Func::ToJson, [x]) => {
            let mut out = String::new();
            push_json(x, &mut out)?;
            Value::String(out)
        }
        (Func::FromJson, [s]) => serde_json::from_str(want_str(func, s)?)
            .map_err(|e| bad_arg(func, format!("invalid JSON: {e}")))?,
        (Func::String, [x]) => {
            let mut out = String::new();
            push_text(x, &mut out)?;
            Value::String(out)
        }
        (Func::Number, [x]) => to_number(func, x)?,
        (Func::Keys, [x]) => Value::Array(
            want_object(func, x)?
                .into_iter()
                .flat_map(|map| map.keys().cloned().map(Value::String))
                .collect(),
        ),
        (Func::Values, [x]) => Value::Array(
            want_object(func, x)?
                .into_iter()
                .flat_map(|map| map.values().cloned())
                .collect(),
        ),
        (Func::Min | Func::Max, [a, b]) => {
            let order = compare(a, b).map_err(|e| bad_arg(func, e.to_string()))?;
            let take_b = match func {
                Func::Min => order == Ordering::Greater,
                _ => order == Ordering::Less,
            };
            if take_b { (*b).clone() } else { (*a).clone() }
        }
        (Func::Range, [n]) => range(func, n)?,
        (Func::Format, [template, rest @ ..]) => format(func, want_str(func, template)?, rest)?,
        _ => return Err(bad_arg(func, "wrong number of arguments")),
    };
    check_size(&result)?;
    Ok(result)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::expr::tests::{check, check_ctx, check_eval_error};

    #[test]
    fn functions_compute_values() {
        check("len('héllo')", json!({}), json!(5));
        check("len([1, 2, 3])", json!({}), json!(3));
        check_ctx("len(params.nested)", json!(1));
        check_ctx("len(params.missing)", json!(0));
        check("contains([1, 2], 2)", json!({}), json!(true));
        check("contains('hello', 'lo')", json!({}), json!(true));
        check("contains(null, 'lo')", json!({}), json!(false));
        check("startsWith('hello', 'he')", json!({}), json!(true));
        check("startsWith('hello', 'lo')", json!({}), json!(false));
        check("endsWith('hello', 'lo')", json!({}), json!(true));
        check("lower('HeLLo')", json!({}), json!("hello"));
        check("upper('straße')", json!({}), json!("STRASSE"));
        check("trim('  x y \n')", json!({}), json!("x y"));
        check(
            "join(['a', 1, null, true, [2]], '-')",
            json!({}),
            json!("a-1--true-[2]"),
        );
        check("join([], ',')", json!({}), json!(""));
        check(
            "split('a,b,,c', ',')",
            json!({}),
            json!(["a", "b", "", "c"]),
        );
        check("split('héj', '')", json!({}), json!(["h", "é", "j"]));
        check("split('', ',')", json!({}), json!([""]));
        check("toJSON(null)", json!({}), json!("null"));
        check(
            "toJSON(x)",
            json!({"x": {"a": [1, "b"]}}),
            json!(r#"{"a":[1,"b"]}"#),
        );
        check("toJSON('s')", json!({}), json!("\"s\""));
        check(
            "fromJSON('[1, {\"a\": null}]')",
            json!({}),
            json!([1, {"a": null}]),
        );
        check(
            "fromJSON(toJSON(x)) == x",
            json!({"x": {"a": [1.5]}}),
            json!(true),
        );
        check("string(12)", json!({}), json!("12"));
        check("string('s')", json!({}), json!("s"));
        check("string(null)", json!({}), json!(""));
        check("string([1, 'a'])", json!({}), json!(r#"[1,"a"]"#));
        check("number('42')", json!({}), json!(42));
        check("number(' -4.5 ')", json!({}), json!(-4.5));
        check("number(7)", json!({}), json!(7));
        check("number(true)", json!({}), json!(1));
        check_ctx("default(params.missing, 8)", json!(8));
        check_ctx("default(params.storage, 8)", json!(20));
        check_ctx("default(params.empty, 'x')", json!(""));
        check("keys(x)", json!({"x": {"a": 1, "b": 2}}), json!(["a", "b"]));
        check("values(x)", json!({"x": {"a": 1, "b": 2}}), json!([1, 2]));
        check("keys(null)", json!({}), json!([]));
        check("min(3, 1.5)", json!({}), json!(1.5));
        check("max(3, 1.5)", json!({}), json!(3));
        check("max('a', 'b')", json!({}), json!("b"));
        check("range(3)", json!({}), json!([0, 1, 2]));
        check("range(0)", json!({}), json!([]));
        check("range(-2)", json!({}), json!([]));
        check("range(2.0)", json!({}), json!([0, 1]));
        check_ctx(
            "format('{0}-{1}-{0}', params.cluster, index)",
            json!("east-2-east"),
        );
        check(
            "format('{{literal}} {0}', null)",
            json!({}),
            json!("{literal} "),
        );
        check(
            "format('no placeholders')",
            json!({}),
            json!("no placeholders"),
        );
        check("len ( 'ab' )", json!({}), json!(2));
    }

    #[test]
    fn function_names_are_free_as_root_names() {
        check("len", json!({"len": 4}), json!(4));
        check("len(len)", json!({"len": "abc"}), json!(3));
    }

    #[test]
    fn bad_function_arguments_are_reported_at_evaluation() {
        check_eval_error(
            "len(params.storage)",
            "len: expected a string, list or object, got number",
        );
        check_eval_error(
            "lower(params.storage)",
            "lower: expected a string, got number",
        );
        check_eval_error(
            "startsWith(params.missing, 'a')",
            "startsWith: expected a string, got null",
        );
        check_eval_error("join(params.env, ',')", "join: expected a list, got string");
        check_eval_error("keys(params.tags)", "keys: expected an object, got list");
        check_eval_error("fromJSON(params.env)", "fromJSON: invalid JSON");
        check_eval_error(
            "number(params.env)",
            "number: cannot convert 'prod' to a number",
        );
        check_eval_error(
            "number(params.missing)",
            "number: cannot convert null to a number",
        );
        check_eval_error(
            "min(params.storage, 'a')",
            "min: cannot compare number and string",
        );
        check_eval_error("range(params.env)", "range: expected a number, got string");
        check_eval_error("range(params.ratio)", "range: expected a whole number");
        check_eval_error(
            "format('{2}', params.storage)",
            "format: no argument for '{2}'",
        );
        check_eval_error(
            "format('{x}', params.storage)",
            "format: invalid placeholder",
        );
        check_eval_error(
            "contains(params.storage, 1)",
            "contains: cannot check membership in number",
        );
    }
}
