//! The lexer: splits the source of an expression, as characters, into tokens,
//! each with the character indexes where it starts and ends so that an error
//! can name its column. A name may hold a `-` between name characters
//! (`make-db`); a number becomes a JSON number (an integer stays an integer);
//! a string takes single or double quotes and the escapes `\\`, `\'`, `\"`,
//! `\n`, `\t` and `\r`. A character that starts no token is an error here, with
//! a hint for `=`, `&` and `|`.

use serde_json::Number;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
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
pub(super) struct Token {
    pub(super) tok: Tok,
    /// Index of the first character.
    pub(super) start: usize,
    /// Index one past the last character.
    pub(super) end: usize,
}

/// An error at a character index of the source being parsed.
pub(super) struct Fail {
    pub(super) at: usize,
    pub(super) message: String,
}

pub(super) fn fail<T>(at: usize, message: impl Into<String>) -> Result<T, Fail> {
    Err(Fail {
        at,
        message: message.into(),
    })
}

pub(super) fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_digit(c: &char) -> bool {
    c.is_ascii_digit()
}

pub(super) fn lex(chars: &[char]) -> Result<Vec<Token>, Fail> {
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::expr::tests::{check, check_parse_error, check_parse_error_at};

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
    fn hyphen_inside_a_name_is_part_of_the_name() {
        check("a-b", json!({"a-b": 1, "a": 5, "b": 2}), json!(1));
        check("a - b", json!({"a-b": 1, "a": 5, "b": 2}), json!(3));
        check("a -b", json!({"a": 5, "b": 2}), json!(3));
        check("a- b", json!({"a": 5, "b": 2}), json!(3));
        check("a-1", json!({"a-1": "x"}), json!("x"));
    }

    #[test]
    fn lexical_errors_name_the_column() {
        check_parse_error_at("'abc", "unterminated string", 1);
        check_parse_error_at(r"'a\qb'", r"unknown escape '\q'", 3);
        check_parse_error_at("a = b", "use '==' to compare", 3);
        check_parse_error_at("a & b", "use '&&'", 3);
        check_parse_error_at("a | b", "use '||'", 3);
        check_parse_error_at("a # b", "unexpected character '#'", 3);
        check_parse_error_at("1e999", "number out of range", 1);
        check_parse_error_at("é + )", "unexpected character 'é'", 1);
        check_parse_error("${{ a }}", "unexpected character '$'");
    }
}
