//! The evaluator: walks a syntax tree against a context (a JSON object whose
//! keys are the root names). Paths read `null` where nothing is; operators
//! follow JSON types, with integer arithmetic in `i128` that falls back to
//! floating point on overflow; `&&`, `||` and `default` short-circuit; and no
//! string or list result may exceed the size limit. It also renders a value as
//! the text inserted into a string (`push_text`), which `string`, `join`,
//! `format` and mixed templates share.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt::{self, Write as _};

use serde_json::{Number, Value};

use super::functions::call;
use super::parser::{BinOp, Node, Seg, UnOp};
use super::{EvalError, MAX_RESULT};

pub(super) static NULL: Value = Value::Null;

/// A number taken out of JSON for arithmetic: integers (from `i64` or `u64`)
/// are exact in `i128`.
#[derive(Debug, Clone, Copy)]
pub(super) enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    pub(super) fn of(n: &Number) -> Num {
        if let Some(i) = n.as_i64() {
            Num::Int(i.into())
        } else if let Some(u) = n.as_u64() {
            Num::Int(u.into())
        } else {
            Num::Float(n.as_f64().unwrap_or(f64::NAN))
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }

    fn neg(self) -> Num {
        match self {
            Num::Int(i) => i.checked_neg().map_or(Num::Float(-(i as f64)), Num::Int),
            Num::Float(f) => Num::Float(-f),
        }
    }

    fn into_value(self) -> Result<Value, EvalError> {
        match self {
            Num::Int(i) => {
                if let Ok(v) = i64::try_from(i) {
                    Ok(Value::from(v))
                } else if let Ok(v) = u64::try_from(i) {
                    Ok(Value::from(v))
                } else {
                    Num::Float(i as f64).into_value()
                }
            }
            Num::Float(f) => Number::from_f64(f)
                .map(Value::Number)
                .ok_or(EvalError::NumberOutOfRange),
        }
    }
}

fn compare_nums(a: Num, b: Num) -> Ordering {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => x.cmp(&y),
        _ => a
            .as_f64()
            .partial_cmp(&b.as_f64())
            .unwrap_or(Ordering::Equal),
    }
}

fn arith(op: BinOp, a: Num, b: Num) -> Result<Num, EvalError> {
    if let (Num::Int(x), Num::Int(y)) = (a, b) {
        let exact = match op {
            BinOp::Add => x.checked_add(y),
            BinOp::Sub => x.checked_sub(y),
            BinOp::Mul => x.checked_mul(y),
            BinOp::Div | BinOp::Rem if y == 0 => return Err(EvalError::DivisionByZero),
            BinOp::Div if x.checked_rem(y) == Some(0) => x.checked_div(y),
            BinOp::Rem => x.checked_rem(y),
            _ => None,
        };
        if let Some(v) = exact {
            return Ok(Num::Int(v));
        }
    }
    let (x, y) = (a.as_f64(), b.as_f64());
    let result = match op {
        BinOp::Add => x + y,
        BinOp::Sub => x - y,
        BinOp::Mul => x * y,
        BinOp::Div | BinOp::Rem if y == 0.0 => return Err(EvalError::DivisionByZero),
        BinOp::Div => x / y,
        _ => x % y,
    };
    Ok(Num::Float(result))
}

pub(super) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

/// Deep JSON equality in which numbers compare by value (`1 == 1.0`).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            compare_nums(Num::of(x), Num::of(y)) == Ordering::Equal
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

pub(super) fn compare(a: &Value, b: &Value) -> Result<Ordering, EvalError> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => Ok(compare_nums(Num::of(x), Num::of(y))),
        (Value::String(x), Value::String(y)) => Ok(x.cmp(y)),
        _ => Err(EvalError::Type(format!(
            "cannot compare {} and {}",
            type_name(a),
            type_name(b)
        ))),
    }
}

/// `needle in haystack`.
pub(super) fn membership(needle: &Value, haystack: &Value) -> Result<bool, EvalError> {
    match (haystack, needle) {
        (Value::Null, _) => Ok(false),
        (Value::Array(items), _) => Ok(items.iter().any(|item| json_eq(item, needle))),
        (Value::String(s), Value::String(n)) => Ok(s.contains(n.as_str())),
        (Value::Object(map), Value::String(key)) => Ok(map.contains_key(key)),
        (Value::String(_), _) => Err(EvalError::Type(format!(
            "cannot check if {} is in a string",
            type_name(needle)
        ))),
        (Value::Object(_), _) => Err(EvalError::Type(format!(
            "cannot check if {} is a key of an object",
            type_name(needle)
        ))),
        _ => Err(EvalError::Type(format!(
            "cannot check membership in {}",
            type_name(haystack)
        ))),
    }
}

pub(super) fn check_size(value: &Value) -> Result<(), EvalError> {
    let size = match value {
        Value::String(s) => s.len(),
        Value::Array(a) => a.len(),
        _ => 0,
    };
    if size > MAX_RESULT {
        Err(EvalError::TooLarge)
    } else {
        Ok(())
    }
}

#[inline(never)]
fn binary(op: BinOp, a: &Value, b: &Value) -> Result<Value, EvalError> {
    let result = match op {
        BinOp::Eq => Value::Bool(json_eq(a, b)),
        BinOp::Ne => Value::Bool(!json_eq(a, b)),
        BinOp::Lt => Value::Bool(compare(a, b)? == Ordering::Less),
        BinOp::Le => Value::Bool(compare(a, b)? != Ordering::Greater),
        BinOp::Gt => Value::Bool(compare(a, b)? == Ordering::Greater),
        BinOp::Ge => Value::Bool(compare(a, b)? != Ordering::Less),
        BinOp::In => Value::Bool(membership(a, b)?),
        BinOp::Add => match (a, b) {
            (Value::Number(x), Value::Number(y)) => {
                arith(op, Num::of(x), Num::of(y))?.into_value()?
            }
            (Value::String(x), Value::String(y)) => {
                if x.len() + y.len() > MAX_RESULT {
                    return Err(EvalError::TooLarge);
                }
                Value::String(format!("{x}{y}"))
            }
            (Value::Array(x), Value::Array(y)) => {
                if x.len() + y.len() > MAX_RESULT {
                    return Err(EvalError::TooLarge);
                }
                Value::Array(x.iter().chain(y).cloned().collect())
            }
            _ => {
                return Err(EvalError::Type(format!(
                    "cannot add {} and {}",
                    type_name(a),
                    type_name(b)
                )));
            }
        },
        BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Rem => match (a, b) {
            (Value::Number(x), Value::Number(y)) => {
                arith(op, Num::of(x), Num::of(y))?.into_value()?
            }
            _ => {
                let (ta, tb) = (type_name(a), type_name(b));
                let message = match op {
                    BinOp::Sub => format!("cannot subtract {tb} from {ta}"),
                    BinOp::Mul => format!("cannot multiply {ta} by {tb}"),
                    BinOp::Div => format!("cannot divide {ta} by {tb}"),
                    _ => format!("cannot take the remainder of {ta} divided by {tb}"),
                };
                return Err(EvalError::Type(message));
            }
        },
        // Short-circuit operators are handled by `eval_node`.
        BinOp::Or | BinOp::And => b.clone(),
    };
    Ok(result)
}

/// A member or index key.
#[derive(Clone, Copy)]
enum Key<'k> {
    Name(&'k str),
    Index(i64),
    Invalid,
}

fn key_of(value: &Value) -> Key<'_> {
    match value {
        Value::String(s) => Key::Name(s),
        Value::Number(n) => match Num::of(n) {
            Num::Int(i) => i64::try_from(i).map_or(Key::Invalid, Key::Index),
            Num::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => Key::Index(f as i64),
            Num::Float(_) => Key::Invalid,
        },
        _ => Key::Invalid,
    }
}

/// Position of index `i` (negative counts from the end) in a list of `len`.
fn resolve_index(len: usize, i: i64) -> Option<usize> {
    let position = if i >= 0 {
        usize::try_from(i).ok()?
    } else {
        len.checked_sub(usize::try_from(i.unsigned_abs()).ok()?)?
    };
    (position < len).then_some(position)
}

fn child<'a>(base: Cow<'a, Value>, key: Key<'_>) -> Cow<'a, Value> {
    match base {
        Cow::Borrowed(value) => Cow::Borrowed(match (value, key) {
            (Value::Object(map), Key::Name(name)) => map.get(name).unwrap_or(&NULL),
            (Value::Array(items), Key::Index(i)) => resolve_index(items.len(), i)
                .and_then(|i| items.get(i))
                .unwrap_or(&NULL),
            _ => &NULL,
        }),
        Cow::Owned(value) => Cow::Owned(match (value, key) {
            (Value::Object(mut map), Key::Name(name)) => map.remove(name).unwrap_or(Value::Null),
            (Value::Array(mut items), Key::Index(i)) => {
                resolve_index(items.len(), i).map_or(Value::Null, |i| items.swap_remove(i))
            }
            _ => Value::Null,
        }),
    }
}

pub(super) fn eval_node<'a>(node: &'a Node, ctx: &'a Value) -> Result<Cow<'a, Value>, EvalError> {
    match node {
        Node::Lit(value) => Ok(Cow::Borrowed(value)),
        Node::Root(name) => Ok(Cow::Borrowed(ctx.get(name.as_str()).unwrap_or(&NULL))),
        Node::List(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                out.push(eval_node(item, ctx)?.into_owned());
            }
            Ok(Cow::Owned(Value::Array(out)))
        }
        Node::Access { target, segs } => {
            let mut current = eval_node(target, ctx)?;
            for seg in segs {
                current = match seg {
                    Seg::Member(name) => child(current, Key::Name(name)),
                    Seg::Index(index) => {
                        let index = eval_node(index, ctx)?;
                        child(current, key_of(&index))
                    }
                };
            }
            Ok(current)
        }
        Node::Unary { op, operand } => {
            let value = eval_node(operand, ctx)?;
            match (op, &*value) {
                (UnOp::Not, v) => Ok(Cow::Owned(Value::Bool(!truthy(v)))),
                (UnOp::Neg, Value::Number(n)) => Num::of(n).neg().into_value().map(Cow::Owned),
                (UnOp::Neg, v) => Err(EvalError::Type(format!("cannot negate {}", type_name(v)))),
            }
        }
        Node::Chain { first, rest } => {
            let mut acc = eval_node(first, ctx)?;
            for (op, rhs) in rest {
                acc = match op {
                    BinOp::Or if truthy(&acc) => acc,
                    BinOp::And if !truthy(&acc) => acc,
                    BinOp::Or | BinOp::And => eval_node(rhs, ctx)?,
                    _ => {
                        let right = eval_node(rhs, ctx)?;
                        Cow::Owned(binary(*op, &acc, &right)?)
                    }
                };
            }
            Ok(acc)
        }
        Node::Call { func, args } => call(*func, args, ctx),
    }
}

/// Truthiness used by conditions and `!`, `&&`, `||`: false for null, false,
/// 0, `""`, `[]` and `{}`; true otherwise.
pub fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => match Num::of(n) {
            Num::Int(i) => i != 0,
            Num::Float(f) => f != 0.0,
        },
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Appends text without letting `out` grow past the size limit.
pub(super) struct Limited<'s> {
    pub(super) out: &'s mut String,
}

impl fmt::Write for Limited<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.out.len() + s.len() > MAX_RESULT {
            return Err(fmt::Error);
        }
        self.out.push_str(s);
        Ok(())
    }
}

/// Appends the compact JSON text of `value`.
pub(super) fn push_json(value: &Value, out: &mut String) -> Result<(), EvalError> {
    write!(Limited { out }, "{value}").map_err(|_| EvalError::TooLarge)
}

/// Appends `value` as interpolated text: strings as-is, null as nothing,
/// anything else as compact JSON.
pub(super) fn push_text(value: &Value, out: &mut String) -> Result<(), EvalError> {
    match value {
        Value::Null => Ok(()),
        Value::String(s) => Limited { out }
            .write_str(s)
            .map_err(|_| EvalError::TooLarge),
        other => push_json(other, out),
    }
}

#[cfg(test)]
mod tests;
