//! The secrets an HTTP executor may put into requests, and where each may be sent: read from a
//! YAML file (`starbridge worker --secrets FILE`) that maps each name to the environment
//! variable holding its value and the hosts it may go to:
//!
//! ```yaml
//! CMDB_TOKEN: { env: CMDB_TOKEN, hosts: [cmdb.internal] }
//! PAGER_KEY: { env: PAGER_KEY, hosts: ["*.pager.example.com"] }
//! ```
//!
//! Values stay in the worker's environment (read when a task needs them) and never reach the
//! server: the task reports its output and errors with every value it used replaced
//! ([`Redactor`]).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;
use starbridge_core::definition::is_secret_name;

/// Where one secret's value comes from and where it may be sent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretSource {
    /// The environment variable holding the value.
    env: String,
    /// Host names (`cmdb.internal`) or the names under a domain (`*.example.com`).
    hosts: Vec<String>,
}

/// The secrets a worker holds, by name.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    sources: BTreeMap<String, SecretSource>,
}

/// A secrets file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretsFileError {
    #[error("cannot read the secrets file {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("the secrets file is not a mapping of name to {{env, hosts}}: {0}")]
    Syntax(String),
    #[error("secret {name}: {problem}")]
    Entry { name: String, problem: String },
}

/// Why a task may not have a secret. Names the secret, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("secret {name} is not in this worker's secrets file (--secrets)")]
    Unknown { name: String },
    #[error("secret {name}: its environment variable {env} is not set on this worker")]
    Unset { name: String, env: String },
    #[error("secret {name} may not be sent to {host}: the secrets file binds it to {allowed}")]
    HostNotAllowed {
        name: String,
        host: String,
        allowed: String,
    },
}

impl Secrets {
    /// Reads a secrets file.
    pub fn load(path: &Path) -> Result<Secrets, SecretsFileError> {
        let text = std::fs::read_to_string(path).map_err(|error| SecretsFileError::Read {
            path: path.display().to_string(),
            error,
        })?;
        Secrets::from_yaml(&text)
    }

    /// Reads the text of a secrets file (YAML or JSON).
    pub fn from_yaml(text: &str) -> Result<Secrets, SecretsFileError> {
        let sources: BTreeMap<String, SecretSource> = if text.trim().is_empty() {
            BTreeMap::new()
        } else {
            serde_saphyr::from_str(text).map_err(|e| SecretsFileError::Syntax(e.to_string()))?
        };
        for (name, source) in &sources {
            let problem = if !is_secret_name(name) {
                Some("a name is a letter or '_', then letters, digits and '_'".to_owned())
            } else if source.env.trim().is_empty() {
                Some("`env` names the environment variable holding its value".to_owned())
            } else if source.hosts.is_empty() {
                Some("`hosts` lists the hosts it may be sent to (at least one)".to_owned())
            } else {
                source
                    .hosts
                    .iter()
                    .find(|host| !is_host_pattern(host))
                    .map(|host| {
                        format!(
                            "'{host}' is not a host name or `*.domain` (no scheme, port or path)"
                        )
                    })
            };
            if let Some(problem) = problem {
                return Err(SecretsFileError::Entry {
                    name: name.clone(),
                    problem,
                });
            }
        }
        Ok(Secrets { sources })
    }

    /// The value of secret `name` for a request to `host`.
    pub fn value_for(&self, name: &str, host: &str) -> Result<String, SecretError> {
        let source = self.sources.get(name).ok_or_else(|| SecretError::Unknown {
            name: name.to_owned(),
        })?;
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if !source
            .hosts
            .iter()
            .any(|pattern| host_matches(pattern, &host))
        {
            return Err(SecretError::HostNotAllowed {
                name: name.to_owned(),
                host,
                allowed: source.hosts.join(", "),
            });
        }
        std::env::var(&source.env).map_err(|_| SecretError::Unset {
            name: name.to_owned(),
            env: source.env.clone(),
        })
    }
}

/// `cmdb.internal` or `*.example.com`.
fn is_host_pattern(pattern: &str) -> bool {
    let name = pattern.strip_prefix("*.").unwrap_or(pattern);
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '[' | ']' | ':'))
        && !name.contains("://")
}

fn host_matches(pattern: &str, host: &str) -> bool {
    let pattern = pattern.to_ascii_lowercase();
    match pattern.strip_prefix("*.") {
        Some(domain) => host
            .strip_suffix(domain)
            .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        None => pattern == host,
    }
}

/// Replaces the values of the secrets a task used, wherever they appear in what it reports.
#[derive(Debug, Default)]
pub(crate) struct Redactor {
    /// (value, name), longest value first, so that a value containing another goes whole.
    used: Vec<(String, String)>,
}

impl Redactor {
    pub(crate) fn note(&mut self, name: &str, value: &str) {
        if value.is_empty() || self.used.iter().any(|(v, _)| v == value) {
            return;
        }
        self.used.push((value.to_owned(), name.to_owned()));
        self.used
            .sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
    }

    /// `text` with every used value replaced by `[secret NAME]`.
    pub(crate) fn text(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (value, name) in &self.used {
            if out.contains(value.as_str()) {
                out = out.replace(value.as_str(), &format!("[secret {name}]"));
            }
        }
        out
    }

    /// `value` with every used secret value replaced in its strings and keys.
    pub(crate) fn json(&self, value: Value) -> Value {
        if self.used.is_empty() {
            return value;
        }
        match value {
            Value::String(text) => Value::String(self.text(&text)),
            Value::Array(items) => Value::Array(items.into_iter().map(|v| self.json(v)).collect()),
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(key, v)| (self.text(&key), self.json(v)))
                    .collect(),
            ),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_goes_only_to_its_hosts_and_errors_name_it_not_its_value() {
        // STARBRIDGE_TEST_SECRET_HOSTS is set nowhere: the value is missing once the host fits.
        let secrets = Secrets::from_yaml(
            "TOKEN: {env: STARBRIDGE_TEST_SECRET_HOSTS, hosts: [cmdb.internal, '*.example.com']}\n",
        )
        .unwrap();
        assert_eq!(
            secrets.value_for("OTHER", "cmdb.internal"),
            Err(SecretError::Unknown {
                name: "OTHER".to_owned()
            })
        );
        let refused = secrets.value_for("TOKEN", "evil.test").unwrap_err();
        assert_eq!(
            refused.to_string(),
            "secret TOKEN may not be sent to evil.test: the secrets file binds it to cmdb.internal, *.example.com"
        );
        assert!(matches!(
            secrets.value_for("TOKEN", "example.com"),
            Err(SecretError::HostNotAllowed { .. })
        ));
        assert!(matches!(
            secrets.value_for("TOKEN", "CMDB.internal."),
            Err(SecretError::Unset { .. })
        ));
    }

    #[test]
    fn a_secrets_file_with_an_unusable_entry_is_refused_naming_it() {
        for (text, part) in [
            ("bad-name: {env: X, hosts: [h]}\n", "bad-name"),
            ("T: {env: X, hosts: []}\n", "hosts"),
            ("T: {env: X, hosts: ['https://h/']}\n", "not a host name"),
            ("T: {env: X}\n", "hosts"),
        ] {
            let error = Secrets::from_yaml(text).unwrap_err().to_string();
            assert!(error.contains(part), "{text}: {error}");
        }
    }

    #[test]
    fn used_values_are_replaced_in_text_and_json() {
        let mut redactor = Redactor::default();
        redactor.note("A", "s3cr3t");
        redactor.note("B", "s3cr3t-longer");
        assert_eq!(
            redactor.text("x s3cr3t-longer y s3cr3t"),
            "x [secret B] y [secret A]"
        );
        assert_eq!(
            redactor.json(serde_json::json!({"s3cr3t": ["s3cr3t", 1]})),
            serde_json::json!({"[secret A]": ["[secret A]", 1]})
        );
    }
}
