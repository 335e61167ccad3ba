//! The `${{ ... }}` expression language of workflow definitions.
//!
//! Strings in a workflow definition may embed expressions, for example
//! `"db-${{ params.cluster }}-${{ index }}"` or the condition
//! `"${{ params.env == 'prod' && len(steps.check.output.hosts) > 0 }}"`.
//! Expressions are compiled once, when a definition is applied, so syntax
//! errors are reported early with their column; they are then evaluated any
//! number of times against a JSON context object whose keys are the root
//! names (`params`, `steps`, `index`, ...).
//!
//! Compiling also folds constants: a part of an expression that reads no
//! root name (`2 * 3`, `len(['a', 'b'])`, `'a' + 1`) is evaluated then, and
//! replaced by its value, which is the value it would have at run time. A
//! constant part that cannot be evaluated is a compile error at its column,
//! even where `&&`, `||` or `default` would skip it at run time:
//! `params.n + 1 / 0` and `params.x || 1 / 0` are both refused.
//!
//! The language is small and every evaluation terminates: there are no loops,
//! no user-defined functions and no side effects.
//!
//! # Values
//!
//! Values are JSON values: `null`, booleans, numbers, strings, lists (JSON
//! arrays) and objects. Integers stay integers (`3`, not `3.0`).
//!
//! # Syntax
//!
//! - Literals: `null`, `true`, `false`, numbers (`3`, `-1`, `2.5`, `1e3`),
//!   strings in single or double quotes with the escapes `\\`, `\'`, `\"`,
//!   `\n`, `\t` and `\r`, and lists `[1, 'a', params.x]`.
//! - Paths: a root name followed by members and indexes, e.g.
//!   `steps.check.output.hosts[0]`, `items[-1]` (from the end),
//!   `params['my key']`, `params[params.which]`. Names match
//!   `[A-Za-z_][A-Za-z0-9_-]*`; a `-` between name characters belongs to the
//!   name, so `steps.make-db.output` reads the step `make-db` and subtraction
//!   needs spaces: `a - b`, not `a-b`.
//! - Reading a missing key, an out-of-range index, a member of something
//!   that is not an object, or a root name absent from the context yields
//!   `null`, never an error.
//! - Operators, from lowest to highest precedence:
//!
//!   | operators                    | meaning                                                 |
//!   |------------------------------|---------------------------------------------------------|
//!   | `\|\|`                       | first truthy operand, else the last one                 |
//!   | `&&`                         | first falsy operand, else the last one                  |
//!   | `==` `!=`                    | deep JSON equality (`1 == 1.0`)                         |
//!   | `<` `<=` `>` `>=` `in`       | numbers or strings; membership in a list, string, object|
//!   | `+` `-`                      | `+` also concatenates strings and lists                 |
//!   | `*` `/` `%`                  | arithmetic                                              |
//!   | `!` `-` (prefix)             | negation                                                |
//!   | `.name` `[index]` `f(...)`   | member, index, function call                            |
//!
//!   `||` and `&&` short-circuit and return the deciding operand, so
//!   `params.name || 'default'` works. A value is falsy when it is `null`,
//!   `false`, `0`, `""`, `[]` or `{}` (see [`truthy`]). Integer arithmetic
//!   stays integer unless it overflows; `/` gives an integer only when the
//!   division is exact.
//! - Functions: `len(x)`, `contains(haystack, needle)`, `startsWith(s, p)`,
//!   `endsWith(s, p)`, `lower(s)`, `upper(s)`, `trim(s)`, `join(list, sep)`,
//!   `split(s, sep)`, `toJSON(x)`, `fromJSON(s)`, `string(x)`, `number(x)`,
//!   `default(x, fallback)`, `keys(obj)`, `values(obj)`, `min(a, b)`,
//!   `max(a, b)`, `range(n)` and `format('{0}-{1}', a, b)`. An unknown
//!   function or a wrong number of arguments is a compile error. `null` counts
//!   as an empty collection for `len`, `contains`/`in`, `join`, `keys` and
//!   `values`; `string(x)` renders like interpolation (below).
//!
//! # Templates
//!
//! A [`Template`] is a JSON value whose strings may contain expressions. A
//! string that is exactly one `${{ ... }}` renders to the expression's value
//! with its JSON type kept; a string mixing text and expressions renders to a
//! string in which strings are inserted as-is, `null` as nothing and other
//! values as compact JSON. Object keys are never templated. A condition (see
//! [`compile_condition`]) is either one `${{ ... }}` or a bare expression.
//!
//! # Limits
//!
//! An expression is at most 4096 bytes long and nests at most 64 levels deep;
//! a string or list produced by an operation may hold at most 1,000,000 bytes
//! or items. Evaluation errors (wrong types, division by zero, results too
//! large) are reported as [`EvalError`]s, or as compile [`Error`]s when they
//! happen in a constant part.
//!
//! # Parts
//!
//! This file holds the limits above, the error types and [`Expr`]; the
//! language itself is split by stage, each part with its tests beside it:
//!
//! - `lexer.rs`: source characters to tokens, each with its character span,
//!   so that an error can name its column.
//! - `parser.rs`: tokens to the syntax tree, with the precedence levels, the
//!   length and nesting limits and the check of function names and argument
//!   counts; constant parts are folded while the tree is built. It also lists
//!   the paths an expression reads ([`Expr::references`]).
//! - `eval.rs`: evaluates a tree against a context: paths, operators,
//!   numbers, [`truthy`], the size limit of results, and the text of a value
//!   inserted into a string.
//! - `functions.rs`: the table of built-in functions (names and argument
//!   counts) and what each one computes.
//! - `templates.rs`: [`Template`], JSON values whose strings hold
//!   `${{ ... }}`, and [`compile_condition`].
//!
//! `tests.rs` holds the fixtures the parts' tests share and the properties of
//! the language as a whole: no text makes compiling or evaluating panic.

mod eval;
mod functions;
mod lexer;
mod parser;
mod templates;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

use serde_json::Value;

use parser::Node;

pub use eval::truthy;
pub use templates::{Template, compile_condition};

/// Longest accepted expression source, in bytes.
const MAX_SOURCE_BYTES: usize = 4096;
/// Deepest accepted nesting of parentheses, brackets, calls and prefix operators.
const MAX_DEPTH: usize = 64;
/// Largest string (in bytes) or list (in items) an operation may produce.
const MAX_RESULT: usize = 1_000_000;

/// A compile error: a syntax error, an unknown function, a wrong number of
/// arguments, an unclosed `${{`, or a constant part that cannot be evaluated
/// (`1 / 0`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message} at column {column}", location_prefix(path))]
pub struct Error {
    /// What is wrong, lowercase, without a trailing period.
    pub message: String,
    /// 1-based character column inside the string that was compiled (the
    /// whole template string, or the bare expression).
    pub column: usize,
    /// Location of the string inside a [`Template`], like `size_gb` or
    /// `items[2].name`; empty for a bare expression or a top-level string.
    pub path: String,
}

fn location_prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("in \"{path}\": ")
    }
}

/// An error raised while evaluating an expression.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    /// An operator was applied to values of unsuitable types, e.g.
    /// `cannot add string and number`.
    #[error("{0}")]
    Type(String),
    /// `/` or `%` with a zero divisor.
    #[error("division by zero")]
    DivisionByZero,
    /// A number result is not a finite JSON number.
    #[error("number out of range")]
    NumberOutOfRange,
    /// A string or list result is over the size limit.
    #[error("result too large (over {limit} bytes or items)", limit = MAX_RESULT)]
    TooLarge,
    /// A function got an argument it cannot handle.
    #[error("{function}: {message}")]
    InvalidArgument {
        /// The function's name, e.g. `fromJSON`.
        function: String,
        /// What is wrong, e.g. `expected a string, got number`.
        message: String,
    },
    /// An error inside a [`Template`], with the location of the string.
    #[error("in \"{path}\": {error}")]
    InTemplate {
        /// Location of the string inside the template, like `items[2]`.
        path: String,
        /// The underlying error.
        error: Box<EvalError>,
    },
}

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    root: Node,
}

impl Expr {
    /// Parses an expression body (the text between `${{` and `}}`, or a bare
    /// expression).
    pub fn parse(source: &str) -> Result<Expr, Error> {
        parser::parse_at(source, 0)
    }

    /// Evaluates against `context` (a JSON object whose keys are the root
    /// names).
    pub fn eval(&self, context: &Value) -> Result<Value, EvalError> {
        eval::eval_node(&self.root, context).map(Cow::into_owned)
    }

    /// Every path this expression reads, as the list of its static leading
    /// segments: `steps.check.output.hosts[0]` gives
    /// `["steps", "check", "output", "hosts"]`, `params[x]` gives `["params"]`
    /// plus the paths read by `x`. Duplicates are removed; order is the order
    /// of first appearance.
    pub fn references(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        parser::collect_references(&self.root, &mut out);
        parser::dedup(out)
    }
}
