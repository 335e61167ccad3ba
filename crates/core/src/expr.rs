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

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fmt::{self, Write as _};

use serde_json::{Map, Number, Value};

/// Longest accepted expression source, in bytes.
const MAX_SOURCE_BYTES: usize = 4096;
/// Deepest accepted nesting of parentheses, brackets, calls and prefix operators.
const MAX_DEPTH: usize = 64;
/// Largest string (in bytes) or list (in items) an operation may produce.
const MAX_RESULT: usize = 1_000_000;

// ---------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------

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
        parse_at(source, 0)
    }

    /// Evaluates against `context` (a JSON object whose keys are the root
    /// names).
    pub fn eval(&self, context: &Value) -> Result<Value, EvalError> {
        eval_node(&self.root, context).map(Cow::into_owned)
    }

    /// Every path this expression reads, as the list of its static leading
    /// segments: `steps.check.output.hosts[0]` gives
    /// `["steps", "check", "output", "hosts"]`, `params[x]` gives `["params"]`
    /// plus the paths read by `x`. Duplicates are removed; order is the order
    /// of first appearance.
    pub fn references(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        collect_references(&self.root, &mut out);
        dedup(out)
    }
}

/// A JSON value in which strings may contain `${{ ... }}` expressions.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    root: TNode,
}

impl Template {
    /// Compiles every string in `value` (recursively through arrays and
    /// objects; object keys are literal, not templated).
    pub fn compile(value: &Value) -> Result<Template, Error> {
        let mut path = Vec::new();
        Ok(Template {
            root: compile_node(value, &mut path)?,
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

// ---------------------------------------------------------------------------
// Syntax tree
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Node {
    /// A literal value.
    Lit(Value),
    /// A list literal `[a, b]`.
    List(Vec<Node>),
    /// A root name read from the context.
    Root(String),
    /// Members and indexes applied to a target, left to right.
    Access { target: Box<Node>, segs: Vec<Seg> },
    /// A prefix operator.
    Unary { op: UnOp, operand: Box<Node> },
    /// Left-associative operators of one precedence level:
    /// `first op1 rest[0] op2 rest[1] ...`.
    Chain {
        first: Box<Node>,
        rest: Vec<(BinOp, Node)>,
    },
    /// A call of a built-in function (arity checked at parse time).
    Call { func: Func, args: Vec<Node> },
}

#[derive(Debug, Clone, PartialEq)]
enum Seg {
    Member(String),
    Index(Node),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UnOp {
    Not,
    Neg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BinOp {
    Or,
    And,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Func {
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
    fn lookup(name: &str) -> Option<(Func, usize, bool)> {
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

// ---------------------------------------------------------------------------
// Lexer
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Num(Number),
    Str(String),
    Null,
    True,
    False,
    In,
    Dot,
    Comma,
    LParen,
    RParen,
    LBracket,
    RBracket,
    Not,
    Plus,
    Minus,
    Star,
    Slash,
    Percent,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
    Eof,
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    /// Index of the first character.
    start: usize,
    /// Index one past the last character.
    end: usize,
}

/// An error at a character index of the source being parsed.
struct Fail {
    at: usize,
    message: String,
}

fn fail<T>(at: usize, message: impl Into<String>) -> Result<T, Fail> {
    Err(Fail {
        at,
        message: message.into(),
    })
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_digit(c: &char) -> bool {
    c.is_ascii_digit()
}

fn lex(chars: &[char]) -> Result<Vec<Token>, Fail> {
    let mut tokens = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let start = i;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let tok = if c.is_ascii_alphabetic() || c == '_' {
            i += 1;
            while let Some(&d) = chars.get(i) {
                if is_name_char(d) {
                    i += 1;
                } else if d == '-' && chars.get(i + 1).is_some_and(|&e| is_name_char(e)) {
                    i += 2;
                } else {
                    break;
                }
            }
            let word: String = chars[start..i].iter().collect();
            match word.as_str() {
                "null" => Tok::Null,
                "true" => Tok::True,
                "false" => Tok::False,
                "in" => Tok::In,
                _ => Tok::Ident(word),
            }
        } else if c.is_ascii_digit() {
            let (number, end) = lex_number(chars, start)?;
            i = end;
            Tok::Num(number)
        } else if c == '\'' || c == '"' {
            let (text, end) = lex_string(chars, start)?;
            i = end;
            Tok::Str(text)
        } else {
            let next = chars.get(i + 1).copied();
            let (tok, width) = match (c, next) {
                ('=', Some('=')) => (Tok::Eq, 2),
                ('!', Some('=')) => (Tok::Ne, 2),
                ('<', Some('=')) => (Tok::Le, 2),
                ('>', Some('=')) => (Tok::Ge, 2),
                ('&', Some('&')) => (Tok::And, 2),
                ('|', Some('|')) => (Tok::Or, 2),
                ('!', _) => (Tok::Not, 1),
                ('<', _) => (Tok::Lt, 1),
                ('>', _) => (Tok::Gt, 1),
                ('+', _) => (Tok::Plus, 1),
                ('-', _) => (Tok::Minus, 1),
                ('*', _) => (Tok::Star, 1),
                ('/', _) => (Tok::Slash, 1),
                ('%', _) => (Tok::Percent, 1),
                ('.', _) => (Tok::Dot, 1),
                (',', _) => (Tok::Comma, 1),
                ('(', _) => (Tok::LParen, 1),
                (')', _) => (Tok::RParen, 1),
                ('[', _) => (Tok::LBracket, 1),
                (']', _) => (Tok::RBracket, 1),
                ('=', _) => return fail(i, "unexpected '=' (use '==' to compare)"),
                ('&', _) => return fail(i, "unexpected '&' (use '&&')"),
                ('|', _) => return fail(i, "unexpected '|' (use '||')"),
                _ => return fail(i, format!("unexpected character '{}'", c.escape_debug())),
            };
            i += width;
            tok
        };
        tokens.push(Token { tok, start, end: i });
    }
    tokens.push(Token {
        tok: Tok::Eof,
        start: chars.len(),
        end: chars.len(),
    });
    Ok(tokens)
}

fn lex_number(chars: &[char], start: usize) -> Result<(Number, usize), Fail> {
    let mut i = start;
    while chars.get(i).is_some_and(is_digit) {
        i += 1;
    }
    let mut is_float = false;
    if chars.get(i) == Some(&'.') && chars.get(i + 1).is_some_and(is_digit) {
        is_float = true;
        i += 1;
        while chars.get(i).is_some_and(is_digit) {
            i += 1;
        }
    }
    if matches!(chars.get(i), Some('e' | 'E')) {
        let mut j = i + 1;
        if matches!(chars.get(j), Some('+' | '-')) {
            j += 1;
        }
        if chars.get(j).is_some_and(is_digit) {
            is_float = true;
            i = j;
            while chars.get(i).is_some_and(is_digit) {
                i += 1;
            }
        }
    }
    let text: String = chars[start..i].iter().collect();
    let number = if is_float {
        None
    } else if let Ok(v) = text.parse::<i64>() {
        Some(Number::from(v))
    } else if let Ok(v) = text.parse::<u64>() {
        Some(Number::from(v))
    } else {
        None
    };
    let number = match number {
        Some(n) => n,
        None => match text.parse::<f64>().ok().and_then(Number::from_f64) {
            Some(n) => n,
            None => return fail(start, "number out of range"),
        },
    };
    Ok((number, i))
}

fn lex_string(chars: &[char], start: usize) -> Result<(String, usize), Fail> {
    let quote = chars.get(start).copied().unwrap_or('\'');
    let mut i = start + 1;
    let mut text = String::new();
    loop {
        match chars.get(i) {
            None => return fail(start, "unterminated string"),
            Some(&c) if c == quote => return Ok((text, i + 1)),
            Some('\\') => {
                let unescaped = match chars.get(i + 1) {
                    Some('\\') => '\\',
                    Some('\'') => '\'',
                    Some('"') => '"',
                    Some('n') => '\n',
                    Some('t') => '\t',
                    Some('r') => '\r',
                    Some(other) => {
                        return fail(i, format!("unknown escape '\\{}'", other.escape_debug()));
                    }
                    None => return fail(start, "unterminated string"),
                };
                text.push(unescaped);
                i += 2;
            }
            Some(&c) => {
                text.push(c);
                i += 1;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Parser
// ---------------------------------------------------------------------------

/// Parses `source`, reporting columns as `base + index + 1`.
fn parse_at(source: &str, base: usize) -> Result<Expr, Error> {
    let to_error = |f: Fail| Error {
        message: f.message,
        column: base + f.at + 1,
        path: String::new(),
    };
    if source.len() > MAX_SOURCE_BYTES {
        return Err(to_error(Fail {
            at: 0,
            message: format!("expression is too long (over {MAX_SOURCE_BYTES} bytes)"),
        }));
    }
    let chars: Vec<char> = source.chars().collect();
    let tokens = lex(&chars).map_err(to_error)?;
    let mut parser = Parser {
        chars: &chars,
        tokens,
        pos: 0,
        depth: 0,
    };
    parser
        .parse_all()
        .map(|root| Expr { root })
        .map_err(to_error)
}

struct Parser<'s> {
    chars: &'s [char],
    /// Never empty: the last token is `Tok::Eof`.
    tokens: Vec<Token>,
    pos: usize,
    depth: usize,
}

/// Number of binary operator precedence levels; all are left-associative.
const LEVELS: usize = 6;

/// The binary operator for `tok` and its precedence level (0 binds loosest).
fn binop(tok: &Tok) -> Option<(BinOp, usize)> {
    let op = match tok {
        Tok::Or => (BinOp::Or, 0),
        Tok::And => (BinOp::And, 1),
        Tok::Eq => (BinOp::Eq, 2),
        Tok::Ne => (BinOp::Ne, 2),
        Tok::Lt => (BinOp::Lt, 3),
        Tok::Le => (BinOp::Le, 3),
        Tok::Gt => (BinOp::Gt, 3),
        Tok::Ge => (BinOp::Ge, 3),
        Tok::In => (BinOp::In, 3),
        Tok::Plus => (BinOp::Add, 4),
        Tok::Minus => (BinOp::Sub, 4),
        Tok::Star => (BinOp::Mul, 5),
        Tok::Slash => (BinOp::Div, 5),
        Tok::Percent => (BinOp::Rem, 5),
        _ => return None,
    };
    Some(op)
}

/// A binary operator and its right operand, as parsed.
struct Operation {
    op: BinOp,
    /// Precedence level (see [`binop`]).
    level: usize,
    /// Index of the operator's first character.
    at: usize,
    operand: Node,
}

/// Turns the flat sequence `first op1 x1 op2 x2 ...` into one `Chain` per
/// precedence level, starting at `level`, folding constant parts (see
/// [`fold_chain`]). Recurses at most `LEVELS` deep.
fn build_chains(first: Node, rest: Vec<Operation>, level: usize) -> Result<Node, Fail> {
    if rest.is_empty() || level >= LEVELS {
        return Ok(first);
    }
    let mut head = None;
    let mut chain = Vec::new();
    let mut joiner = None;
    let mut group = (first, Vec::new());
    for operation in rest {
        if operation.level == level {
            let (group_first, group_rest) =
                std::mem::replace(&mut group, (operation.operand, Vec::new()));
            let built = build_chains(group_first, group_rest, level + 1)?;
            match joiner.replace((operation.op, operation.at)) {
                None => head = Some(built),
                Some((previous, at)) => chain.push((previous, at, built)),
            }
        } else {
            group.1.push(operation);
        }
    }
    let last = build_chains(group.0, group.1, level + 1)?;
    match (head, joiner) {
        (Some(head), Some((op, at))) => {
            chain.push((op, at, last));
            fold_chain(head, chain)
        }
        _ => Ok(last),
    }
}

// ---------------------------------------------------------------------------
// Constant folding
// ---------------------------------------------------------------------------

/// The value of `node`, which reads no context, as a literal; an evaluation
/// error is a compile error at `at`.
fn evaluate(node: Node, at: usize) -> Result<Node, Fail> {
    match eval_node(&node, &NULL) {
        Ok(value) => Ok(Node::Lit(value.into_owned())),
        Err(error) => fail(at, error.to_string()),
    }
}

/// Replaces a list, access, prefix operation or call whose operands are all
/// literals by its value; an evaluation error is a compile error at `at`.
/// Chains fold in [`fold_chain`].
#[inline(never)]
fn fold(node: Node, at: usize) -> Result<Node, Fail> {
    let literal = |node: &Node| matches!(node, Node::Lit(_));
    let constant = match &node {
        Node::List(items) | Node::Call { args: items, .. } => items.iter().all(literal),
        Node::Access { target, segs } => {
            literal(target)
                && segs.iter().all(|seg| match seg {
                    Seg::Member(_) => true,
                    Seg::Index(index) => literal(index),
                })
        }
        Node::Unary { operand, .. } => literal(operand),
        Node::Lit(_) | Node::Root(_) | Node::Chain { .. } => false,
    };
    if constant {
        evaluate(node, at)
    } else {
        Ok(node)
    }
}

/// Builds the chain `first op1 x1 op2 x2 ...` (each operator with the index
/// where it stands), folding its leading operations while both operands are
/// literals: `1 + 2 + a` becomes `3 + a`, and `'a' + 1 + a` fails at the
/// first `+`.
#[inline(never)]
fn fold_chain(first: Node, rest: Vec<(BinOp, usize, Node)>) -> Result<Node, Fail> {
    let mut first = first;
    let mut rest = rest.into_iter().peekable();
    while matches!(first, Node::Lit(_))
        && let Some((op, at, operand)) = rest.next_if(|(_, _, node)| matches!(node, Node::Lit(_)))
    {
        let single = Node::Chain {
            first: Box::new(first),
            rest: vec![(op, operand)],
        };
        first = evaluate(single, at)?;
    }
    let rest: Vec<(BinOp, Node)> = rest.map(|(op, _, operand)| (op, operand)).collect();
    if rest.is_empty() {
        Ok(first)
    } else {
        Ok(Node::Chain {
            first: Box::new(first),
            rest,
        })
    }
}

impl Parser<'_> {
    fn current(&self) -> &Token {
        let last = self.tokens.len().saturating_sub(1);
        &self.tokens[self.pos.min(last)]
    }

    fn peek(&self) -> &Tok {
        &self.current().tok
    }

    fn advance(&mut self) -> Token {
        let token = self.current().clone();
        if self.pos + 1 < self.tokens.len() {
            self.pos += 1;
        }
        token
    }

    fn describe(&self, token: &Token) -> String {
        if token.tok == Tok::Eof {
            return "end of expression".to_string();
        }
        const SHOWN: usize = 24;
        let span = self.chars.get(token.start..token.end).unwrap_or_default();
        let mut text: String = span.iter().take(SHOWN).collect();
        if span.len() > SHOWN {
            text.push_str("...");
        }
        format!("'{text}'")
    }

    fn unexpected<T>(&self) -> Result<T, Fail> {
        let token = self.current();
        fail(token.start, format!("unexpected {}", self.describe(token)))
    }

    fn expect(&mut self, tok: &Tok, what: &str) -> Result<(), Fail> {
        if self.peek() == tok {
            self.advance();
            Ok(())
        } else {
            let token = self.current();
            fail(
                token.start,
                format!("expected {what}, found {}", self.describe(token)),
            )
        }
    }

    fn enter(&mut self) -> Result<(), Fail> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return fail(
                self.current().start,
                format!("expression is nested too deeply (over {MAX_DEPTH} levels)"),
            );
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }

    fn parse_all(&mut self) -> Result<Node, Fail> {
        if *self.peek() == Tok::Eof {
            return fail(0, "empty expression");
        }
        let node = self.parse_expr()?;
        if *self.peek() != Tok::Eof {
            return self.unexpected();
        }
        Ok(node)
    }

    fn parse_expr(&mut self) -> Result<Node, Fail> {
        self.enter()?;
        let node = self.parse_binary()?;
        self.leave();
        Ok(node)
    }

    /// Parses operands separated by binary operators, without recursing
    /// per precedence level.
    fn parse_binary(&mut self) -> Result<Node, Fail> {
        let first = self.parse_unary()?;
        let mut rest = Vec::new();
        while let Some((op, level)) = binop(self.peek()) {
            let at = self.advance().start;
            let operand = self.parse_unary()?;
            rest.push(Operation {
                op,
                level,
                at,
                operand,
            });
        }
        build_chains(first, rest, 0)
    }

    fn parse_unary(&mut self) -> Result<Node, Fail> {
        let op = match self.peek() {
            Tok::Not => UnOp::Not,
            Tok::Minus => UnOp::Neg,
            _ => return self.parse_postfix(),
        };
        let at = self.advance().start;
        self.enter()?;
        let operand = self.parse_unary()?;
        self.leave();
        fold(
            Node::Unary {
                op,
                operand: Box::new(operand),
            },
            at,
        )
    }

    fn parse_postfix(&mut self) -> Result<Node, Fail> {
        let at = self.current().start;
        let target = self.parse_primary()?;
        let mut segs = Vec::new();
        loop {
            match self.peek() {
                Tok::Dot => {
                    self.advance();
                    let token = self.advance();
                    let name = match token.tok {
                        Tok::Ident(name) => name,
                        Tok::Null => "null".to_string(),
                        Tok::True => "true".to_string(),
                        Tok::False => "false".to_string(),
                        Tok::In => "in".to_string(),
                        _ => {
                            return fail(
                                token.start,
                                format!(
                                    "expected a name after '.', found {}",
                                    self.describe(&token)
                                ),
                            );
                        }
                    };
                    segs.push(Seg::Member(name));
                }
                Tok::LBracket => {
                    self.advance();
                    let index = self.parse_expr()?;
                    self.expect(&Tok::RBracket, "']'")?;
                    segs.push(Seg::Index(index));
                }
                _ => break,
            }
        }
        if segs.is_empty() {
            Ok(target)
        } else {
            fold(
                Node::Access {
                    target: Box::new(target),
                    segs,
                },
                at,
            )
        }
    }

    fn parse_primary(&mut self) -> Result<Node, Fail> {
        let token = self.advance();
        match token.tok {
            Tok::Num(n) => Ok(Node::Lit(Value::Number(n))),
            Tok::Str(s) => Ok(Node::Lit(Value::String(s))),
            Tok::Null => Ok(Node::Lit(Value::Null)),
            Tok::True => Ok(Node::Lit(Value::Bool(true))),
            Tok::False => Ok(Node::Lit(Value::Bool(false))),
            Tok::LParen => {
                let node = self.parse_expr()?;
                self.expect(&Tok::RParen, "')'")?;
                Ok(node)
            }
            Tok::LBracket => {
                let items = self.parse_list(&Tok::RBracket, "']'")?;
                fold(Node::List(items), token.start)
            }
            Tok::Ident(name) => {
                if *self.peek() == Tok::LParen {
                    self.parse_call(&name, token.start)
                } else {
                    Ok(Node::Root(name))
                }
            }
            Tok::Eof => fail(token.start, "unexpected end of expression"),
            _ => fail(token.start, format!("unexpected {}", self.describe(&token))),
        }
    }

    /// Parses comma-separated expressions up to `close` (already past the
    /// opening bracket). A trailing comma is allowed.
    fn parse_list(&mut self, close: &Tok, close_text: &str) -> Result<Vec<Node>, Fail> {
        let mut items = Vec::new();
        loop {
            if self.peek() == close {
                self.advance();
                return Ok(items);
            }
            items.push(self.parse_expr()?);
            if *self.peek() == Tok::Comma {
                self.advance();
            } else {
                self.expect(close, &format!("',' or {close_text}"))?;
                return Ok(items);
            }
        }
    }

    fn parse_call(&mut self, name: &str, at: usize) -> Result<Node, Fail> {
        let Some((func, min, variadic)) = Func::lookup(name) else {
            return fail(at, format!("unknown function '{name}'"));
        };
        self.advance(); // '('
        let args = self.parse_list(&Tok::RParen, "')'")?;
        let count_ok = if variadic {
            args.len() >= min
        } else {
            args.len() == min
        };
        if !count_ok {
            let plural = if min == 1 { "" } else { "s" };
            let at_least = if variadic { "at least " } else { "" };
            return fail(
                at,
                format!(
                    "function '{name}' expects {at_least}{min} argument{plural}, got {}",
                    args.len()
                ),
            );
        }
        fold(Node::Call { func, args }, at)
    }
}

// ---------------------------------------------------------------------------
// References
// ---------------------------------------------------------------------------

fn collect_references(node: &Node, out: &mut Vec<Vec<String>>) {
    match node {
        Node::Lit(_) => {}
        Node::Root(name) => out.push(vec![name.clone()]),
        Node::List(items) | Node::Call { args: items, .. } => {
            for item in items {
                collect_references(item, out);
            }
        }
        Node::Unary { operand, .. } => collect_references(operand, out),
        Node::Chain { first, rest } => {
            collect_references(first, out);
            for (_, node) in rest {
                collect_references(node, out);
            }
        }
        Node::Access { target, segs } => {
            let mut path = match &**target {
                Node::Root(name) => Some(vec![name.clone()]),
                other => {
                    collect_references(other, out);
                    None
                }
            };
            let mut open = path.is_some();
            let mut nested = Vec::new();
            for seg in segs {
                match seg {
                    Seg::Member(name) if open => {
                        if let Some(p) = path.as_mut() {
                            p.push(name.clone());
                        }
                    }
                    Seg::Index(Node::Lit(Value::String(key))) if open => {
                        if let Some(p) = path.as_mut() {
                            p.push(key.clone());
                        }
                    }
                    Seg::Member(_) => {}
                    Seg::Index(index) => {
                        open = false;
                        nested.push(index);
                    }
                }
            }
            out.extend(path);
            for index in nested {
                collect_references(index, out);
            }
        }
    }
}

fn dedup(paths: Vec<Vec<String>>) -> Vec<Vec<String>> {
    let mut seen = BTreeSet::new();
    paths
        .into_iter()
        .filter(|p| seen.insert(p.clone()))
        .collect()
}

// ---------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------

static NULL: Value = Value::Null;

/// A number taken out of JSON for arithmetic: integers (from `i64` or `u64`)
/// are exact in `i128`.
#[derive(Debug, Clone, Copy)]
enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    fn of(n: &Number) -> Num {
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

fn type_name(value: &Value) -> &'static str {
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

fn compare(a: &Value, b: &Value) -> Result<Ordering, EvalError> {
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
fn membership(needle: &Value, haystack: &Value) -> Result<bool, EvalError> {
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

fn check_size(value: &Value) -> Result<(), EvalError> {
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

fn eval_node<'a>(node: &'a Node, ctx: &'a Value) -> Result<Cow<'a, Value>, EvalError> {
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

/// Appends text without letting `out` grow past the size limit.
struct Limited<'s> {
    out: &'s mut String,
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
fn push_json(value: &Value, out: &mut String) -> Result<(), EvalError> {
    write!(Limited { out }, "{value}").map_err(|_| EvalError::TooLarge)
}

/// Appends `value` as interpolated text: strings as-is, null as nothing,
/// anything else as compact JSON.
fn push_text(value: &Value, out: &mut String) -> Result<(), EvalError> {
    match value {
        Value::Null => Ok(()),
        Value::String(s) => Limited { out }
            .write_str(s)
            .map_err(|_| EvalError::TooLarge),
        other => push_json(other, out),
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

fn call<'a>(func: Func, args: &'a [Node], ctx: &'a Value) -> Result<Cow<'a, Value>, EvalError> {
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

// ---------------------------------------------------------------------------
// Templates
// ---------------------------------------------------------------------------

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

fn compile_node<'v>(value: &'v Value, path: &mut Vec<PathSeg<'v>>) -> Result<TNode, Error> {
    let node = match value {
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
                let node = compile_node(item, path);
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
                let node = compile_node(item, path);
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

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn context() -> Value {
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
    fn check(src: &str, context: Value, expected: Value) {
        let expr = Expr::parse(src).unwrap_or_else(|e| panic!("{src:?} does not parse: {e}"));
        let got = expr
            .eval(&context)
            .unwrap_or_else(|e| panic!("{src:?} fails: {e}"));
        assert_eq!(got, expected, "{src}");
    }

    #[track_caller]
    fn check_ctx(src: &str, expected: Value) {
        check(src, context(), expected);
    }

    #[track_caller]
    fn check_eval_error(src: &str, expected: &str) {
        check_eval_error_in(src, context(), expected);
    }

    #[track_caller]
    fn check_eval_error_in(src: &str, context: Value, expected: &str) {
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
    fn check_parse_error(src: &str, expected: &str) {
        match Expr::parse(src) {
            Ok(e) => panic!("{src:?} parsed as {e:?}, expected error containing {expected:?}"),
            Err(e) => assert!(
                e.message.contains(expected),
                "{src:?}: error {e:?} does not contain {expected:?}"
            ),
        }
    }

    #[track_caller]
    fn check_parse_error_at(src: &str, expected: &str, column: usize) {
        check_parse_error(src, expected);
        let error = Expr::parse(src).err().map(|e| e.column);
        assert_eq!(error, Some(column), "column for {src:?}");
    }

    #[track_caller]
    fn check_render(template: Value, expected: Value) {
        let compiled = Template::compile(&template)
            .unwrap_or_else(|e| panic!("{template} does not compile: {e}"));
        let got = compiled
            .render(&context())
            .unwrap_or_else(|e| panic!("{template} fails: {e}"));
        assert_eq!(got, expected, "{template}");
    }

    #[track_caller]
    fn check_refs(src: &str, expected: &[&[&str]]) {
        let expr = Expr::parse(src).unwrap_or_else(|e| panic!("{src:?} does not parse: {e}"));
        let expected: Vec<Vec<String>> = expected
            .iter()
            .map(|p| p.iter().map(|s| s.to_string()).collect())
            .collect();
        assert_eq!(expr.references(), expected, "{src}");
    }

    #[test]
    fn literals_evaluate_to_json_values() {
        check("null", json!({}), json!(null));
        check("true", json!({}), json!(true));
        check("false", json!({}), json!(false));
        check("3", json!({}), json!(3));
        check("-3", json!({}), json!(-3));
        check("2.5", json!({}), json!(2.5));
        check("1e3", json!({}), json!(1000.0));
        check("1.5E-1", json!({}), json!(0.15));
        check(
            "18446744073709551615",
            json!({}),
            json!(18446744073709551615u64),
        );
        check("-9223372036854775808", json!({}), json!(i64::MIN));
        check("'hello'", json!({}), json!("hello"));
        check("\"hello\"", json!({}), json!("hello"));
        check(r"'it\'s'", json!({}), json!("it's"));
        check(r#""say \"hi\"""#, json!({}), json!("say \"hi\""));
        check(r"'a\\b\nc\td'", json!({}), json!("a\\b\nc\td"));
        check("'héllo wörld ✓'", json!({}), json!("héllo wörld ✓"));
        check("[1, 'a', null]", json!({}), json!([1, "a", null]));
        check("[]", json!({}), json!([]));
        check("[1, 2,]", json!({}), json!([1, 2]));
    }

    #[test]
    fn integers_stay_integers() {
        let value = Expr::parse("1 + 2").unwrap().eval(&json!({})).unwrap();
        assert!(value.is_i64(), "{value:?}");
        assert_eq!(value.to_string(), "3");
    }

    #[test]
    fn paths_read_from_the_context() {
        check_ctx("params.storage", json!(20));
        check_ctx("params.env", json!("prod"));
        check_ctx("params", context()["params"].clone());
        check_ctx("steps.check.output.hosts[0]", json!("h1"));
        check_ctx("steps.check.output.hosts[-1]", json!("h3"));
        check_ctx("steps.check.output.hosts[-3]", json!("h1"));
        check_ctx("steps.check.output.hosts[index]", json!("h3"));
        check_ctx("steps.check.output.hosts[1.0]", json!("h2"));
        check_ctx("params['my key']", json!("spaced"));
        check_ctx("params[params.which]", json!("prod"));
        check_ctx("params.nested.x.y[1]", json!(20));
        check_ctx("params['nested']['x'].y[2]", json!(30));
        check_ctx("(params.nested).x.y[0]", json!(10));
        check_ctx("steps.make-db.output.id", json!("db-1"));
        check_ctx("fromJSON('{\"a\": [5, 6]}').a[1]", json!(6));
        check_ctx("[7, 8, 9][1]", json!(8));
    }

    #[test]
    fn missing_path_reads_as_null() {
        check_ctx("params.missing", json!(null));
        check_ctx("params.missing.deeper[3]", json!(null));
        check_ctx("nothing", json!(null));
        check_ctx("nothing.at.all", json!(null));
        check_ctx("steps.check.output.hosts[3]", json!(null));
        check_ctx("steps.check.output.hosts[-4]", json!(null));
        check_ctx("steps.check.output.hosts[0.5]", json!(null));
        check_ctx("steps.check.output.hosts['0']", json!(null));
        check_ctx("params.env.length", json!(null));
        check_ctx("params.storage[0]", json!(null));
        check_ctx("params[null]", json!(null));
        check_ctx("params[true]", json!(null));
        check_ctx("'abc'[0]", json!(null));
        check("anything", json!([1, 2]), json!(null));
        check("anything", json!(null), json!(null));
    }

    #[test]
    fn keywords_are_allowed_as_member_names() {
        check("a.null", json!({"a": {"null": 1}}), json!(1));
        check("a.in.true", json!({"a": {"in": {"true": 2}}}), json!(2));
    }

    #[test]
    fn arithmetic_follows_precedence() {
        check("1 + 2 * 3", json!({}), json!(7));
        check("(1 + 2) * 3", json!({}), json!(9));
        check("10 - 4 - 3", json!({}), json!(3));
        check("2 * 3 + 4 * 5", json!({}), json!(26));
        check("8 / 2 / 2", json!({}), json!(2));
        check("1 + 2 * 3 - 4 / 2 * 3 + 1", json!({}), json!(2));
        check("1 < 2 == 2 < 3", json!({}), json!(true));
        check("false && false || true", json!({}), json!(true));
        check(
            "1 + 1 == 2 && 'a' + 'b' == 'ab' || false",
            json!({}),
            json!(true),
        );
        check("2 * 3 % 4", json!({}), json!(2));
        check("-2 * -3", json!({}), json!(6));
        check("- (2 + 3)", json!({}), json!(-5));
        check("--4", json!({}), json!(4));
        check("6 / 3", json!({}), json!(2));
        check("7 / 2", json!({}), json!(3.5));
        check("7 % 3", json!({}), json!(1));
        check("-7 % 3", json!({}), json!(-1));
        check("7.5 % 2", json!({}), json!(1.5));
        check("1.5 + 1", json!({}), json!(2.5));
        check("0.5 + 0.5", json!({}), json!(1.0));
        check_ctx("params.storage * 2", json!(40));
        check_ctx("params.storage - index", json!(18));
        check_ctx("params.ratio * 4", json!(2.0));
    }

    #[test]
    fn integer_overflow_falls_back_to_float() {
        check(
            "9223372036854775807 + 1",
            json!({}),
            json!(9223372036854775808u64),
        );
        check(
            "18446744073709551615 + 1",
            json!({}),
            json!(18446744073709551616.0),
        );
        check(
            "-9223372036854775808 - 1",
            json!({}),
            json!(-9223372036854775809.0),
        );
        check(
            "9223372036854775807 * 9223372036854775807",
            json!({}),
            json!(8.507059173023462e37),
        );
        check(
            "-(-9223372036854775808)",
            json!({}),
            json!(9223372036854775808u64),
        );
    }

    #[test]
    fn hyphen_inside_a_name_is_part_of_the_name() {
        check("a-b", json!({"a-b": 1, "a": 5, "b": 2}), json!(1));
        check("a - b", json!({"a-b": 1, "a": 5, "b": 2}), json!(3));
        check("a -b", json!({"a": 5, "b": 2}), json!(3));
        check("a- b", json!({"a": 5, "b": 2}), json!(3));
        check("a-1", json!({"a-1": "x"}), json!("x"));
    }

    #[test]
    fn strings_and_lists_concatenate() {
        check("'a' + 'b'", json!({}), json!("ab"));
        check("[1] + [2, 3]", json!({}), json!([1, 2, 3]));
        check_ctx("params.tags + ['c']", json!(["a", "b", "c"]));
        check_ctx("'db-' + params.cluster", json!("db-east"));
    }

    #[test]
    fn comparisons_work_on_numbers_and_strings() {
        check("1 < 2", json!({}), json!(true));
        check("2 <= 2", json!({}), json!(true));
        check("2.5 > 2", json!({}), json!(true));
        check("2 >= 3", json!({}), json!(false));
        check("'a' < 'b'", json!({}), json!(true));
        check("'b' < 'a'", json!({}), json!(false));
        check("'B' < 'a'", json!({}), json!(true));
        check(
            "18446744073709551615 > 9223372036854775807",
            json!({}),
            json!(true),
        );
        check_ctx("len(steps.check.output.hosts) > 0", json!(true));
    }

    #[test]
    fn equality_is_deep_and_numeric() {
        check("1 == 1.0", json!({}), json!(true));
        check("1 != 1.0", json!({}), json!(false));
        check("1 == '1'", json!({}), json!(false));
        check("null == null", json!({}), json!(true));
        check("[1, [2]] == [1.0, [2.0]]", json!({}), json!(true));
        check("[1, 2] == [2, 1]", json!({}), json!(false));
        check(
            "a == b",
            json!({"a": {"x": 1, "y": [2]}, "b": {"y": [2.0], "x": 1}}),
            json!(true),
        );
        check(
            "a == b",
            json!({"a": {"x": 1}, "b": {"x": 1, "y": 2}}),
            json!(false),
        );
        check_ctx("params.env == 'prod'", json!(true));
        check_ctx("params.missing == null", json!(true));
        check("1 == 1 == true", json!({}), json!(true));
    }

    #[test]
    fn logical_operators_return_the_deciding_operand() {
        check_ctx("params.missing || 'default'", json!("default"));
        check_ctx("params.env || 'default'", json!("prod"));
        check_ctx("params.empty || 'default'", json!("default"));
        check("0 || null", json!({}), json!(null));
        check("'x' && 2", json!({}), json!(2));
        check("[] && 2", json!({}), json!([]));
        check("1 && 2 && 3", json!({}), json!(3));
        check("0 || '' || 'last'", json!({}), json!("last"));
        check("false || true && false", json!({}), json!(false));
        check("true || true && false", json!({}), json!(true));
        check_ctx(
            "params.env == 'prod' && len(steps.check.output.hosts) > 0",
            json!(true),
        );
    }

    #[test]
    fn logical_operators_short_circuit() {
        let context = json!({"zero": 0, "one": 1});
        check("true || 1 / zero", context.clone(), json!(true));
        check("false && 1 / zero", context.clone(), json!(false));
        check("null && ('a' + one)", context.clone(), json!(null));
        check("default(1, 1 / zero)", context, json!(1));
    }

    #[test]
    fn not_uses_truthiness() {
        check("!''", json!({}), json!(true));
        check("!'x'", json!({}), json!(false));
        check("!0", json!({}), json!(true));
        check("!0.0", json!({}), json!(true));
        check("![]", json!({}), json!(true));
        check("!!params", json!({"params": {}}), json!(false));
        check("!null", json!({}), json!(true));
        check("!!1", json!({}), json!(true));
        check("!1 == false", json!({}), json!(true));
    }

    #[test]
    fn truthiness_matches_the_documented_rules() {
        for falsy in [
            json!(null),
            json!(false),
            json!(0),
            json!(0.0),
            json!(-0.0),
            json!(""),
            json!([]),
            json!({}),
        ] {
            assert!(!truthy(&falsy), "{falsy}");
        }
        for value in [
            json!(true),
            json!(1),
            json!(-0.5),
            json!("0"),
            json!("false"),
            json!([0]),
            json!({"a": null}),
        ] {
            assert!(truthy(&value), "{value}");
        }
    }

    #[test]
    fn in_checks_membership() {
        check("2 in [1, 2]", json!({}), json!(true));
        check("2.0 in [1, 2]", json!({}), json!(true));
        check("3 in [1, 2]", json!({}), json!(false));
        check("'ell' in 'hello'", json!({}), json!(true));
        check("'xyz' in 'hello'", json!({}), json!(false));
        check_ctx("'env' in params", json!(true));
        check_ctx("'nope' in params", json!(false));
        check_ctx("params.env in ['prod', 'staging']", json!(true));
        check_ctx("'a' in params.missing", json!(false));
        check("1 + 1 in [2]", json!({}), json!(true));
    }

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
    fn type_errors_are_reported_at_evaluation() {
        check_eval_error("params.env + 1", "cannot add string and number");
        check_eval_error("params.missing + 1", "cannot add null and number");
        check_eval_error("params.env - 1", "cannot subtract number from string");
        check_eval_error("params.tags * 2", "cannot multiply list by number");
        check_eval_error("params.env < 1", "cannot compare string and number");
        check_eval_error("params.missing < 1", "cannot compare null and number");
        check_eval_error("-params.env", "cannot negate string");
        check_eval_error(
            "params.storage in params.env",
            "cannot check if number is in a string",
        );
        check_eval_error(
            "1 in params",
            "cannot check if number is a key of an object",
        );
        check_eval_error("params.storage in 2", "cannot check membership in number");
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

    #[test]
    fn division_by_zero_is_an_error() {
        let context = json!({"zero": 0, "float_zero": 0.0});
        assert_eq!(
            Expr::parse("1 / zero").unwrap().eval(&context),
            Err(EvalError::DivisionByZero)
        );
        check_eval_error_in("1 % zero", context.clone(), "division by zero");
        check_eval_error_in("1.5 / zero", context.clone(), "division by zero");
        check_eval_error_in("1 / float_zero", context, "division by zero");
    }

    #[test]
    fn non_finite_numbers_are_an_error() {
        check_eval_error_in("x * 10", json!({"x": 1e308}), "number out of range");
    }

    #[test]
    fn oversized_results_are_an_error() {
        check("len(range(1000000))", json!({}), json!(1_000_000));
        let context = json!({"most": 1_000_000, "over": 1_000_001});
        check_eval_error_in("range(over)", context.clone(), "result too large");
        check_eval_error_in("range(most) + [1]", context.clone(), "result too large");
        check_eval_error_in("toJSON(range(most))", context.clone(), "result too large");
        check_eval_error_in("join(range(most), ',')", context, "result too large");
        let big = "x".repeat(600_000);
        let ctx = json!({"s": big});
        let expr = Expr::parse("s + s").unwrap();
        assert_eq!(expr.eval(&ctx), Err(EvalError::TooLarge));
        assert_eq!(
            Expr::parse("split(s, '')")
                .unwrap()
                .eval(&json!({"s": "y".repeat(1_000_001)})),
            Err(EvalError::TooLarge)
        );
    }

    #[test]
    fn constant_parts_fold_to_their_value() {
        let same = |folded: &str, written: &str| {
            assert_eq!(
                Expr::parse(folded).unwrap(),
                Expr::parse(written).unwrap(),
                "{folded}"
            );
        };
        same("2 * 3", "6");
        same("params.n + 2 * 3", "params.n + 6");
        same("1 + 2 + params.n", "3 + params.n");
        same("'a' + 'b' + params.s", "'ab' + params.s");
        same("len(['a', 'b']) > params.n", "2 > params.n");
        same("[1, 2][-1] + params.n", "2 + params.n");
        same("params[lower('KEY')]", "params['key']");
        same("-(2 + 3)", "-5");
        same("!(1 == 1) || params.x", "false || params.x");
        same("default(null, 3)", "3");
        same("[1, params.n, 2 + 2]", "[1, params.n, 4]");
        check_refs("steps[lower('A')].output", &[&["steps", "a", "output"]]);
    }

    #[test]
    fn constant_parts_that_cannot_be_evaluated_are_compile_errors() {
        check_parse_error_at("1 / 0", "division by zero", 3);
        check_parse_error_at("params.n + 1 / 0", "division by zero", 14);
        check_parse_error_at("'a' + 1 + params.n", "cannot add string and number", 5);
        check_parse_error_at("params.x || 1 % 0", "division by zero", 15);
        check_parse_error_at("false && 1 / 0", "division by zero", 12);
        check_parse_error_at("default(params.x, -'a')", "cannot negate string", 19);
        check_parse_error_at(
            "[1, len(2)]",
            "len: expected a string, list or object, got number",
            5,
        );
        check_parse_error_at("params[range(1000001)]", "result too large", 8);
        check_parse_error_at("1e308 * 10", "number out of range", 7);
        assert_eq!(
            Expr::parse("params.n + 1 / 0").unwrap_err().to_string(),
            "division by zero at column 14"
        );
        let error =
            Template::compile(&json!({"size_gb": "${{ params.n * (1 / 0) }}"})).unwrap_err();
        assert_eq!(
            error.to_string(),
            "in \"size_gb\": division by zero at column 19"
        );
        let error = compile_condition("${{ 'a' < 1 }}").unwrap_err();
        assert_eq!(
            (error.message.as_str(), error.column),
            ("cannot compare string and number", 9)
        );
    }

    #[test]
    fn syntax_errors_name_the_column() {
        check_parse_error_at("a + )", "unexpected ')'", 5);
        check_parse_error_at("1 +", "unexpected end of expression", 4);
        check_parse_error_at("(1 + 2", "expected ')', found end of expression", 7);
        check_parse_error_at("a b", "unexpected 'b'", 3);
        check_parse_error_at("a[1", "expected ']'", 4);
        check_parse_error_at("[1 2]", "expected ',' or ']'", 4);
        check_parse_error_at("len(1 2)", "expected ',' or ')'", 7);
        check_parse_error_at("'abc", "unterminated string", 1);
        check_parse_error_at(r"'a\qb'", r"unknown escape '\q'", 3);
        check_parse_error_at("a = b", "use '==' to compare", 3);
        check_parse_error_at("a & b", "use '&&'", 3);
        check_parse_error_at("a | b", "use '||'", 3);
        check_parse_error_at("a # b", "unexpected character '#'", 3);
        check_parse_error_at("a.1", "expected a name after '.'", 3);
        check_parse_error_at(
            "a.",
            "expected a name after '.', found end of expression",
            3,
        );
        check_parse_error_at("", "empty expression", 1);
        check_parse_error_at("   ", "empty expression", 1);
        check_parse_error_at("1e999", "number out of range", 1);
        check_parse_error_at("é + )", "unexpected character 'é'", 1);
        check_parse_error_at("'é' + )", "unexpected ')'", 7);
        check_parse_error_at("a.b(1)", "unexpected '('", 4);
        check_parse_error_at("in", "unexpected 'in'", 1);
        check_parse_error("${{ a }}", "unexpected character '$'");
    }

    #[test]
    fn unknown_functions_and_wrong_argument_counts_are_parse_errors() {
        check_parse_error_at("lenn(x)", "unknown function 'lenn'", 1);
        check_parse_error_at(
            "1 + len(1, 2)",
            "function 'len' expects 1 argument, got 2",
            5,
        );
        check_parse_error_at(
            "contains('a')",
            "function 'contains' expects 2 arguments, got 1",
            1,
        );
        check_parse_error_at(
            "format()",
            "function 'format' expects at least 1 argument, got 0",
            1,
        );
        check_parse_error_at("range()", "expects 1 argument, got 0", 1);
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
    fn deep_nesting_is_rejected_without_overflowing_the_stack() {
        let ok = format!("{}1{}", "(".repeat(60), ")".repeat(60));
        check(&ok, json!({}), json!(1));
        for src in [
            format!("{}1{}", "(".repeat(65), ")".repeat(65)),
            "(".repeat(4000),
            "!".repeat(4000),
            "-".repeat(4000),
            "[".repeat(4000),
            "a[".repeat(2000),
            "len(".repeat(1000),
            "!(".repeat(2000),
        ] {
            check_parse_error(&src, "nested too deeply");
        }
    }

    #[test]
    fn deepest_accepted_expression_evaluates_without_overflowing_the_stack() {
        let levels = MAX_DEPTH - 1;
        let unit = "0 || 1 && 1 == 1 < 1 + 1 * -len([(";
        let src = format!("{}1{}", unit.repeat(levels / 4), ")])".repeat(levels / 4));
        let expr = Expr::parse(&src).unwrap_or_else(|e| panic!("{e}"));
        let _ = expr.eval(&json!({}));
        let _ = expr.references();
        assert_eq!(expr.clone(), expr);
        let too_deep = format!(
            "{}1{}",
            unit.repeat(levels / 4 + 1),
            ")])".repeat(levels / 4 + 1)
        );
        check_parse_error(&too_deep, "nested too deeply");
    }

    #[test]
    fn long_operator_chains_evaluate_iteratively() {
        let src = format!("1{}", " +1".repeat(1300));
        check(&src, json!({}), json!(1301));
        let src = format!("a{}", "||a".repeat(1300));
        check(&src, json!({"a": 0}), json!(0));
        let src = format!("a{}", ".b".repeat(2000));
        check(&src, json!({}), json!(null));
    }

    #[test]
    fn overlong_sources_are_rejected() {
        let src = format!("'{}'", "x".repeat(MAX_SOURCE_BYTES));
        check_parse_error_at(&src, "expression is too long", 1);
        let src = format!("'{}'", "x".repeat(MAX_SOURCE_BYTES - 2));
        check(&src, json!({}), json!("x".repeat(MAX_SOURCE_BYTES - 2)));
    }

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
    fn references_list_static_path_prefixes() {
        check_refs(
            "steps.check.output.hosts[0]",
            &[&["steps", "check", "output", "hosts"]],
        );
        check_refs("params[x]", &[&["params"], &["x"]]);
        check_refs("params['my key'].a", &[&["params", "my key", "a"]]);
        check_refs("params[x.y].z[w]", &[&["params"], &["x", "y"], &["w"]]);
        check_refs("a.b + a.b + c", &[&["a", "b"], &["c"]]);
        check_refs(
            "len(steps.make-db.output) > index",
            &[&["steps", "make-db", "output"], &["index"]],
        );
        check_refs("fromJSON(s).a", &[&["s"]]);
        check_refs("1 + 2", &[]);
        check_refs("default(a, [b, c[0]])", &[&["a"], &["b"], &["c"]]);
        check_refs("(p).q", &[&["p", "q"]]);
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

    const TOKENS: &[&str] = &[
        "a", "b", "params", "steps", "index", ".", "[", "]", "(", ")", ",", "'x'", "\"y\"", "'",
        "\"", "\\", "1", "0", "-1", "2.5", "1e3", "null", "true", "false", "in", "+", "-", "*",
        "/", "%", "!", "==", "!=", "<", "<=", ">", ">=", "&&", "||", "=", "&", "|", "len",
        "format", "range", "join", "split", "default", "'{0}'", "é", "${{", "}}", "}", "{", "$",
        "-a", "a-", " ",
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
        "null", "true", "false", "0", "1", "-1", "2.5", "'a'", "\"b\"", "''", "[]", "[1, 'a']",
        "1e308",
    ];

    /// `context()` with the values of [`LITERALS`] in `v`.
    fn literal_context() -> Value {
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
    fn valid_expression() -> impl Strategy<Value = [String; 3]> {
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
                (inner.clone(), inner.clone()).prop_map(move |(a, b)| zip(
                    &a,
                    &b,
                    &|a, b| format!("({a})[{b}]")
                )),
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

        #[test]
        fn folding_constants_keeps_every_result(
            [written, mixed, read] in valid_expression(),
        ) {
            let context = literal_context();
            let unfolded = Expr::parse(&read).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let at_run_time = unfolded.eval(&context);
            for source in [&written, &mixed] {
                if let Ok(folded) = Expr::parse(source) {
                    prop_assert_eq!(folded.eval(&context), at_run_time.clone(), "{}", source);
                }
            }
            // With every leaf a literal the whole expression is constant: it folds to its
            // value (so, by the check above, one that fails at run time does not compile).
            if unfolded.references().iter().all(|path| path[0] == "v")
                && let Ok(folded) = Expr::parse(&written)
            {
                prop_assert!(matches!(folded.root, Node::Lit(_)), "{}: {:?}", written, folded);
            }
        }
    }
}
