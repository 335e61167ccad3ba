//! Checks of a JSON request body's text that its parsed form cannot make:
//!
//! - an integer beyond 64 bits would be parsed as a float and silently lose digits: it is
//!   refused, naming its path (`params.n`, `jobs[2].params.n`);
//! - a NUL character in a text field (a name, key, reason, URL, …) cannot be stored by every
//!   database as it is: it is refused on every backend alike, naming the field. Members whose
//!   value is stored as JSON (`EXEMPT`: params, inputs, outputs, …) keep it, escaped.
//!
//! Both are rare, so a body is scanned only when its bytes hint at one: the escape `\u0000`
//! (JSON has no other way to write NUL) or a run of 19 digits or more.

/// Members whose values are stored as JSON text, where a NUL is kept escaped.
const EXEMPT: &[&str] = &[
    "params",
    "input",
    "output",
    "progress",
    "logs",
    "error",
    "definition",
];

/// What is wrong with a body, and where.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Fault {
    pub(crate) field: String,
    pub(crate) message: String,
}

/// The first fault of a body that is valid JSON, if it has one.
pub(crate) fn first_fault(body: &[u8]) -> Option<Fault> {
    if !may_hold_a_fault(body) {
        return None;
    }
    Scanner {
        text: body,
        at: 0,
        path: Vec::new(),
    }
    .value()
    .err()
}

fn may_hold_a_fault(body: &[u8]) -> bool {
    if body.windows(6).any(|window| window == b"\\u0000") {
        return true;
    }
    let mut run = 0;
    for byte in body {
        run = if byte.is_ascii_digit() { run + 1 } else { 0 };
        if run >= 19 {
            return true;
        }
    }
    false
}

/// One step of a path: a member name, or an item's index.
enum Step {
    Member(String),
    Item(usize),
}

struct Scanner<'a> {
    text: &'a [u8],
    at: usize,
    path: Vec<Step>,
}

impl Scanner<'_> {
    fn field(&self) -> String {
        let mut field = String::new();
        for step in &self.path {
            match step {
                Step::Member(name) if field.is_empty() => field.push_str(name),
                Step::Member(name) => {
                    field.push('.');
                    field.push_str(name);
                }
                Step::Item(index) => field.push_str(&format!("[{index}]")),
            }
        }
        if field.is_empty() {
            field.push_str("body");
        }
        field
    }

    fn fault(&self, message: String) -> Fault {
        Fault {
            field: self.field(),
            message,
        }
    }

    fn exempt(&self) -> bool {
        self.path
            .iter()
            .any(|step| matches!(step, Step::Member(name) if EXEMPT.contains(&name.as_str())))
    }

    fn skip_space(&mut self) {
        while self
            .text
            .get(self.at)
            .is_some_and(|byte| byte.is_ascii_whitespace())
        {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_space();
        self.text.get(self.at).copied()
    }

    fn value(&mut self) -> Result<(), Fault> {
        match self.peek() {
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => {
                let has_nul = self.string()?.1;
                if has_nul && !self.exempt() {
                    return Err(self.fault(
                        "must not contain a NUL character (\\u0000): remove it".to_owned(),
                    ));
                }
                Ok(())
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            // true, false, null.
            _ => {
                while self.text.get(self.at).is_some_and(u8::is_ascii_alphabetic) {
                    self.at += 1;
                }
                Ok(())
            }
        }
    }

    fn object(&mut self) -> Result<(), Fault> {
        self.at += 1;
        loop {
            match self.peek() {
                Some(b'}') | None => {
                    self.at += 1;
                    return Ok(());
                }
                Some(b',') => self.at += 1,
                Some(b'"') => {
                    let (name, _) = self.string()?;
                    if self.peek() == Some(b':') {
                        self.at += 1;
                    }
                    self.path.push(Step::Member(name));
                    self.value()?;
                    self.path.pop();
                }
                Some(_) => self.at += 1,
            }
        }
    }

    fn array(&mut self) -> Result<(), Fault> {
        self.at += 1;
        let mut index = 0;
        loop {
            match self.peek() {
                Some(b']') | None => {
                    self.at += 1;
                    return Ok(());
                }
                Some(b',') => {
                    self.at += 1;
                    index += 1;
                }
                Some(_) => {
                    self.path.push(Step::Item(index));
                    self.value()?;
                    self.path.pop();
                }
            }
        }
    }

    /// Reads a string; answers its text (escapes kept as written, but for the member names
    /// that matter, which have none) and whether it holds a NUL.
    fn string(&mut self) -> Result<(String, bool), Fault> {
        self.at += 1;
        let start = self.at;
        let mut has_nul = false;
        while let Some(&byte) = self.text.get(self.at) {
            match byte {
                b'"' => break,
                b'\\' => {
                    if self.text[self.at..].starts_with(b"\\u0000") {
                        has_nul = true;
                    }
                    self.at += 2;
                }
                _ => self.at += 1,
            }
        }
        let end = self.at.min(self.text.len());
        self.at += 1;
        let text = String::from_utf8_lossy(&self.text[start..end]).into_owned();
        Ok((text, has_nul))
    }

    fn number(&mut self) -> Result<(), Fault> {
        let start = self.at;
        while self
            .text
            .get(self.at)
            .is_some_and(|byte| matches!(byte, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))
        {
            self.at += 1;
        }
        let literal = std::str::from_utf8(&self.text[start..self.at]).unwrap_or_default();
        let integral = !literal.contains(['.', 'e', 'E']);
        if integral && literal.parse::<i64>().is_err() && literal.parse::<u64>().is_err() {
            return Err(self.fault(format!(
                "the integer {literal} does not fit in 64 bits (from {} to {}): send it as a \
                 string",
                i64::MIN,
                u64::MAX
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(body: &str) -> Option<Fault> {
        serde_json::from_str::<serde_json::Value>(body).expect("the tests send valid JSON");
        first_fault(body.as_bytes())
    }

    #[test]
    fn an_integer_beyond_64_bits_is_refused_with_its_path() {
        let found = fault(r#"{"workflow": "w", "params": {"n": 123456789012345678901234}}"#)
            .expect("refused");
        assert_eq!(found.field, "params.n");
        assert!(found.message.contains("123456789012345678901234"));
        let found = fault(
            r#"{"jobs": [{"params": {}}, {"params": {"list": [1, -99999999999999999999]}}]}"#,
        )
        .expect("refused");
        assert_eq!(found.field, "jobs[1].params.list[1]");
    }

    #[test]
    fn integers_within_64_bits_and_floats_pass() {
        assert_eq!(
            fault(r#"{"a": 18446744073709551615, "b": -9223372036854775808, "c": 1.5e300}"#),
            None
        );
        assert_eq!(
            fault(r#"{"id": "12345678901234567890123", "f": 12345678901234567890123.5}"#),
            None
        );
    }

    #[test]
    fn a_nul_in_a_text_field_is_refused_but_kept_in_json_values() {
        let found = fault(r#"{"workflow": "w", "key": "a\u0000b"}"#).expect("refused");
        assert_eq!(found.field, "key");
        let found = fault(r#"{"jobs": [{"workflow": "w"}, {"workflow": "w", "key": "\u0000"}]}"#)
            .expect("refused");
        assert_eq!(found.field, "jobs[1].key");
        assert_eq!(
            fault(r#"{"params": {"text": "a\u0000b"}, "output": ["\u0000"]}"#),
            None
        );
        assert_eq!(fault(r#"{"key": "a\\u0000b"}"#), None);
    }
}
