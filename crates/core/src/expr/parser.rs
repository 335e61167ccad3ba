//! The parser: turns tokens into the syntax tree ([`Node`]) that the evaluator
//! walks. It enforces the source length and nesting limits, resolves function
//! names and checks their argument counts, and parses binary operators as a
//! flat sequence that it groups by precedence level without recursing per
//! level. While the tree is built, every part that reads no root name is
//! folded to its value (an evaluation error there is a compile error at its
//! column). It also lists the paths a tree reads ([`collect_references`]).

use std::collections::BTreeSet;

use serde_json::Value;

use super::eval::{NULL, eval_node};
use super::functions::Func;
use super::lexer::{Fail, Tok, Token, fail, lex};
use super::{Error, Expr, MAX_DEPTH, MAX_SOURCE_BYTES};

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Node {
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
pub(super) enum Seg {
    Member(String),
    Index(Node),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UnOp {
    Not,
    Neg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BinOp {
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

/// Parses `source`, reporting columns as `base + index + 1`.
pub(super) fn parse_at(source: &str, base: usize) -> Result<Expr, Error> {
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

// Constant folding

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

// References

pub(super) fn collect_references(node: &Node, out: &mut Vec<Vec<String>>) {
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

pub(super) fn dedup(paths: Vec<Vec<String>>) -> Vec<Vec<String>> {
    let mut seen = BTreeSet::new();
    paths
        .into_iter()
        .filter(|p| seen.insert(p.clone()))
        .collect()
}

#[cfg(test)]
mod tests;
