//! Job labels: `key=value` tags a job carries for filtering and bulk actions. A workflow's
//! `labels` are the defaults of its jobs; a submission's (or a schedule's) are merged over them.
//! The rules of keys and values, the merge, and the `key=value` selectors of a label filter are
//! here; the most labels a job may carry is a run limit ([`crate::limits::Limits::labels`]).

use std::collections::BTreeMap;

use crate::definition::Problem;

/// A job's labels, by key.
pub type Labels = BTreeMap<String, String>;

/// Longest label key, in characters (all ASCII).
pub const MAX_KEY_CHARS: usize = 63;
/// Longest label value, in bytes.
pub const MAX_VALUE_BYTES: usize = 255;

/// Checks a label key: 1 to 63 characters of `a-z`, `0-9`, `_`, `.`, `/` and `-`.
pub fn check_key(key: &str) -> Result<(), String> {
    let allowed = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_./-".contains(&b);
    if !key.is_empty() && key.len() <= MAX_KEY_CHARS && key.bytes().all(allowed) {
        return Ok(());
    }
    let lower = key.to_ascii_lowercase();
    let hint = if lower != key && check_key(&lower).is_ok() {
        format!(" (such as '{lower}')")
    } else {
        String::new()
    };
    Err(format!(
        "'{key}' is not a valid label key: use 1 to {MAX_KEY_CHARS} characters of a-z, 0-9, \
         '_', '.', '/' and '-'{hint}"
    ))
}

/// Checks a label value: at most 255 bytes, no NUL.
pub fn check_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_VALUE_BYTES {
        Err(format!(
            "the value is {} bytes, longer than the limit of {MAX_VALUE_BYTES}: shorten it",
            value.len()
        ))
    } else if value.contains('\0') {
        Err("the value must not contain a NUL character (\\u0000): remove it".to_owned())
    } else {
        Ok(())
    }
}

/// Every key and value of `labels` that breaks the rules, each named `{field}.{key}`.
pub fn check(field: &str, labels: &Labels) -> Vec<Problem> {
    labels
        .iter()
        .filter_map(|(key, value)| {
            let message = check_key(key).and_then(|()| check_value(value)).err()?;
            Some(Problem {
                field: format!("{field}.{key}"),
                message,
            })
        })
        .collect()
}

/// Refuses more than `max` labels (the server's `--max-labels`), naming `field`.
pub fn check_count(field: &str, count: usize, max: usize) -> Result<(), Problem> {
    if count <= max {
        return Ok(());
    }
    Err(Problem {
        field: field.to_owned(),
        message: format!(
            "{count} labels is more than the limit of {max}: drop some, or raise the server's \
             --max-labels"
        ),
    })
}

/// The labels of a job: `defaults` (its workflow's) with `given` (the submission's) merged over
/// them; a key in both takes the given value.
pub fn merge(defaults: &Labels, given: &Labels) -> Labels {
    let mut merged = defaults.clone();
    merged.extend(given.iter().map(|(k, v)| (k.clone(), v.clone())));
    merged
}

/// Reads one selector of a label filter, `key=value` (split at the first `=`, so a value may
/// hold `=`), with the key and value held to the rules of labels.
pub fn parse_selector(text: &str) -> Result<(String, String), String> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!(
            "'{text}' is not a label selector: write key=value, such as team=storage"
        ));
    };
    check_key(key)?;
    check_value(value)?;
    Ok((key.to_owned(), value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[track_caller]
    fn refused(pairs: &[(&str, &str)], field: &str, message_part: &str) {
        let problems = check("labels", &labels(pairs));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].field, field);
        assert!(
            problems[0].message.contains(message_part),
            "{}",
            problems[0].message
        );
    }

    #[test]
    fn keys_and_values_within_the_rules_are_accepted() {
        let long_key = "k".repeat(MAX_KEY_CHARS);
        let long_value = "é".repeat(MAX_VALUE_BYTES / 2);
        let ok = labels(&[
            ("team", "storage"),
            ("example.com/tier-1_a", ""),
            (&long_key, &long_value),
        ]);
        assert_eq!(check("labels", &ok), []);
    }

    #[test]
    fn each_refusal_names_the_label_and_the_fix() {
        refused(&[("Team", "x")], "labels.Team", "(such as 'team')");
        refused(&[("", "x")], "labels.", "1 to 63 characters");
        refused(
            &[(&"k".repeat(64), "x")],
            &format!("labels.{}", "k".repeat(64)),
            "1 to 63",
        );
        refused(&[("a b", "x")], "labels.a b", "not a valid label key");
        refused(
            &[("team", &"v".repeat(256))],
            "labels.team",
            "256 bytes, longer than the limit of 255",
        );
        refused(&[("team", "a\0b")], "labels.team", "NUL");
    }

    #[test]
    fn the_count_is_held_to_the_limit() {
        assert_eq!(check_count("labels", 32, 32), Ok(()));
        let problem = check_count("labels", 33, 32).unwrap_err();
        assert_eq!(problem.field, "labels");
        assert!(
            problem
                .message
                .contains("33 labels is more than the limit of 32")
        );
        assert!(problem.message.contains("--max-labels"));
    }

    #[test]
    fn given_labels_win_over_the_defaults() {
        let merged = merge(
            &labels(&[("team", "storage"), ("tier", "1")]),
            &labels(&[("tier", "2"), ("env", "prod")]),
        );
        assert_eq!(
            merged,
            labels(&[("env", "prod"), ("team", "storage"), ("tier", "2")])
        );
    }

    #[test]
    fn selectors_split_at_the_first_equals_sign() {
        assert_eq!(
            parse_selector("team=storage"),
            Ok(("team".to_owned(), "storage".to_owned()))
        );
        assert_eq!(
            parse_selector("q=a=b"),
            Ok(("q".to_owned(), "a=b".to_owned()))
        );
        assert_eq!(
            parse_selector("empty="),
            Ok(("empty".to_owned(), String::new()))
        );
        assert!(parse_selector("team").unwrap_err().contains("key=value"));
        assert!(
            parse_selector("Team=x")
                .unwrap_err()
                .contains("not a valid label key")
        );
    }
}
