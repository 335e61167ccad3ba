//! Where a task goes: the queue a step names, written as a name (`mysql`) or as a template
//! rendered for each task (`agent-${{ params.host }}`), and the queue patterns (`agent-*`) that
//! queue settings and `work` tokens may name instead of a single queue.
//!
//! A queue template is compiled when the definition is applied, where only its literal parts
//! can be checked; it is rendered once, when its task first becomes ready (a fan-out item's with
//! its input, when the items are made), and the rendered name is kept with the task for its
//! retries and check-laters. Every rendered name is a queue of its own.
//!
//! A pattern is a name followed by one `*`, the only place a `*` may stand: it names every queue
//! whose name starts with the text before it (`*` alone names every queue). Among the prefix
//! settings whose pattern a queue matches, the longest prefix wins; settings given to the queue
//! itself beat any prefix ([`effective_config`]).

use serde_json::Value;

use crate::definition::check_queue_name;
use crate::dispatch::QueueConfig;
use crate::expr::Template;
use crate::machine::type_name;

/// The queue a handler's tasks go to.
#[derive(Debug, Clone, PartialEq)]
pub enum QueueRoute {
    /// A queue name, the same for every task.
    Fixed(String),
    /// A template rendered for each task when it first becomes ready; `source` is the text as
    /// written.
    Rendered { source: String, template: Template },
}

impl Default for QueueRoute {
    fn default() -> Self {
        QueueRoute::Fixed(String::new())
    }
}

impl QueueRoute {
    /// Reads a handler's `queue`: a queue name, or a string holding `${{ … }}` expressions whose
    /// text around them uses only the characters of a queue name.
    pub fn parse(text: &str) -> Result<QueueRoute, String> {
        if !text.contains("${{") {
            check_queue_name(text)?;
            return Ok(QueueRoute::Fixed(text.to_owned()));
        }
        let template =
            Template::compile(&Value::String(text.to_owned())).map_err(|e| e.to_string())?;
        let literal = template.text_parts().concat();
        if !literal.is_empty() && check_queue_name(&literal).is_err() {
            return Err(format!(
                "the text around its expressions, '{literal}', must be at most 128 characters of \
                 letters, digits, '_', '.', '-', ':' and '/' (the rendered name is checked when \
                 its task becomes ready)"
            ));
        }
        Ok(QueueRoute::Rendered {
            source: text.to_owned(),
            template,
        })
    }

    /// The queue's name when it is the same for every task; `None` for a template.
    pub fn name(&self) -> Option<&str> {
        match self {
            QueueRoute::Fixed(name) => Some(name),
            QueueRoute::Rendered { .. } => None,
        }
    }

    /// Whether the queue is a template, rendered for each task.
    pub fn is_template(&self) -> bool {
        matches!(self, QueueRoute::Rendered { .. })
    }

    /// The queue as written in the definition.
    pub fn source(&self) -> &str {
        match self {
            QueueRoute::Fixed(name) => name,
            QueueRoute::Rendered { source, .. } => source,
        }
    }

    /// The paths the template reads (none for a fixed name).
    pub fn references(&self) -> Vec<Vec<String>> {
        match self {
            QueueRoute::Fixed(_) => Vec::new(),
            QueueRoute::Rendered { template, .. } => template.references(),
        }
    }

    /// The queue of one task, rendered against `context`: a string (a number or a boolean as
    /// its text) that is a valid queue name.
    pub fn render(&self, context: &Value) -> Result<String, String> {
        let template = match self {
            QueueRoute::Fixed(name) => return Ok(name.clone()),
            QueueRoute::Rendered { template, .. } => template,
        };
        let name = match template.render(context).map_err(|e| e.to_string())? {
            Value::String(text) => text,
            Value::Number(number) => number.to_string(),
            Value::Bool(flag) => flag.to_string(),
            other => {
                return Err(format!(
                    "must render to a queue name, got {}",
                    type_name(&other)
                ));
            }
        };
        if name.is_empty() {
            return Err(
                "renders to an empty name: the values it reads are missing or empty".to_owned(),
            );
        }
        check_queue_name(&name)?;
        Ok(name)
    }
}

/// What a queue setting or a token's queue names: one queue, or every queue whose name starts
/// with a prefix (written `prefix*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueTarget<'a> {
    Queue(&'a str),
    Prefix(&'a str),
}

impl<'a> QueueTarget<'a> {
    /// Reads a queue name or a pattern: a name followed by one `*` (`*` alone: every queue).
    pub fn parse(text: &'a str) -> Result<QueueTarget<'a>, String> {
        if !text.contains('*') {
            return check_queue_name(text)
                .map(|()| QueueTarget::Queue(text))
                .map_err(|message| format!("{message}, or a pattern such as 'agent-*'"));
        }
        if let Some(prefix) = text.strip_suffix('*')
            && (prefix.is_empty() || check_queue_name(prefix).is_ok())
        {
            return Ok(QueueTarget::Prefix(prefix));
        }
        Err(format!(
            "'{text}' is not a valid queue pattern: a pattern is a queue name followed by one '*' \
             (the only place a '*' may stand), such as 'agent-*'"
        ))
    }
}

/// Whether `pattern` (a queue name, or a name followed by `*`) names `queue`.
pub fn pattern_matches(pattern: &str, queue: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => queue.starts_with(prefix),
        None => pattern == queue,
    }
}

/// Whether any of `patterns` names `queue` (see [`pattern_matches`]).
pub fn any_matches(patterns: &[String], queue: &str) -> bool {
    patterns
        .iter()
        .any(|pattern| pattern_matches(pattern, queue))
}

/// The settings a queue dispatches with: its own once an operator gave it some (`own`); else
/// those of the longest of `prefixes` (each a prefix with the settings given to it, the pattern
/// `prefix*`) its name starts with, whose prefix the answer names; else the defaults. Its pause
/// (`paused`) is always its own.
pub fn effective_config<'a>(
    queue: &str,
    own: Option<&QueueConfig>,
    paused: bool,
    prefixes: impl IntoIterator<Item = (&'a str, &'a QueueConfig)>,
) -> (QueueConfig, Option<&'a str>) {
    let (config, from) = match own {
        Some(own) => (own.clone(), None),
        None => match prefixes
            .into_iter()
            .filter(|(prefix, _)| queue.starts_with(prefix))
            .max_by_key(|(prefix, _)| prefix.len())
        {
            Some((prefix, config)) => (config.clone(), Some(prefix)),
            None => (QueueConfig::default(), None),
        },
    };
    (QueueConfig { paused, ..config }, from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::QueueMode;
    use serde_json::json;

    #[track_caller]
    fn route(text: &str) -> QueueRoute {
        QueueRoute::parse(text).unwrap_or_else(|message| panic!("{text}: {message}"))
    }

    #[track_caller]
    fn refused(text: &str, expected: &str) {
        let message = QueueRoute::parse(text).unwrap_err();
        assert!(message.contains(expected), "{text}: {message}");
    }

    #[test]
    fn a_plain_queue_is_a_fixed_name_and_checked_whole() {
        assert_eq!(route("mysql").name(), Some("mysql"));
        assert_eq!(route("a.b:c/d-e_f").source(), "a.b:c/d-e_f");
        refused("my queue", "not a valid queue name");
        refused("", "not a valid queue name");
        refused(&"q".repeat(129), "not a valid queue name");
    }

    #[test]
    fn a_template_checks_only_its_literal_parts_at_apply() {
        let agent = route("agent-${{ params.host }}");
        assert_eq!(agent.name(), None);
        assert_eq!(agent.source(), "agent-${{ params.host }}");
        assert_eq!(agent.references(), vec![vec!["params", "host"]]);
        route("${{ item }}");
        route("${{ params.a }}.${{ params.b }}");
        refused(
            "agent ${{ params.host }}",
            "the text around its expressions, 'agent '",
        );
        refused("a*${{ params.host }}", "'a*'");
        refused(
            &format!("{}${{{{ item }}}}", "q".repeat(129)),
            "at most 128 characters",
        );
        refused("agent-${{ params.host", "unclosed");
    }

    /// The problems applying a definition reports, as `field: message`.
    fn apply(yaml: &str) -> Vec<String> {
        match crate::Workflow::from_document("wf", yaml) {
            Ok(_) => Vec::new(),
            Err(error) => error.problems.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn apply_checks_a_queue_template_where_it_stands() {
        let ok = [
            "steps:\n- {id: a, queue: 'agent-${{ params.host }}', command: c}\n",
            "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: 'agent-${{ steps.a.output.host }}-${{ job.id }}', command: c}\n",
            "steps:\n- {id: a, queue: 'agent-${{ item }}-${{ index }}', command: c, for_each: '${{ params.hosts }}'}\n",
            "steps:\n- {id: a, queue: q, command: c, compensate: {queue: 'undo-${{ task.output.host }}', command: u}}\n",
        ];
        for yaml in ok {
            assert_eq!(apply(yaml), Vec::<String>::new(), "{yaml}");
        }
        let refused = [
            (
                "steps:\n- {id: a, queue: 'agent ${{ params.host }}', command: c}\n",
                "steps[0] (a).queue: the text around its expressions, 'agent '",
            ),
            (
                "steps:\n- {id: a, queue: 'agent-${{ item }}', command: c}\n",
                "steps[0] (a).queue: unknown name 'item': expressions here may read params, steps, job",
            ),
            (
                "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: 'x-${{ steps.c.output }}', command: c}\n- {id: c, queue: q, command: c}\n",
                "steps[1] (b).queue: step 'c' is not upstream of 'b'",
            ),
            (
                "steps:\n- {id: a, queue: 'x-${{ task.id }}', command: c}\n",
                "steps[0] (a).queue: unknown name 'task'",
            ),
            (
                "steps:\n- {id: a, queue: q, command: c, compensate: {queue: 'undo-${{ item }}', command: u}}\n",
                "steps[0] (a).compensate.queue: unknown name 'item': expressions here may read params, steps, job, task",
            ),
            (
                "steps:\n- {id: a, queue: 'x-${{ params.n + }}', command: c}\n",
                "steps[0] (a).queue: ",
            ),
        ];
        for (yaml, expected) in refused {
            let problems = apply(yaml);
            assert!(
                problems.iter().any(|p| p.starts_with(expected)),
                "{yaml}: {problems:?}"
            );
        }
    }

    #[track_caller]
    fn renders(text: &str, context: Value) -> Result<String, String> {
        route(text).render(&context)
    }

    #[test]
    fn rendering_gives_a_checked_queue_name() {
        let context =
            json!({"params": {"host": "b", "n": 7, "on": true, "list": [1]}, "item": "x"});
        let ok = |text: &str| renders(text, context.clone()).unwrap();
        assert_eq!(ok("agent-${{ params.host }}"), "agent-b");
        assert_eq!(ok("${{ params.n }}"), "7");
        assert_eq!(ok("${{ params.on }}"), "true");
        assert_eq!(ok("q-${{ item }}"), "q-x");
        assert_eq!(ok("fixed"), "fixed");
        let err = |text: &str| renders(text, context.clone()).unwrap_err();
        assert!(err("${{ params.missing }}").contains("got null"));
        assert!(err("${{ params.list }}").contains("got a list"));
        assert!(err("${{ params.missing || '' }}").contains("empty name"));
        assert!(err("agent-${{ params.host + ' x' }}").contains("'agent-b x' is not a valid"));
        assert!(err("${{ params.n / 0 + params.n }}").contains("division by zero"));
    }

    #[test]
    fn a_pattern_is_a_name_with_one_trailing_star() {
        assert_eq!(QueueTarget::parse("db"), Ok(QueueTarget::Queue("db")));
        assert_eq!(
            QueueTarget::parse("agent-*"),
            Ok(QueueTarget::Prefix("agent-"))
        );
        assert_eq!(QueueTarget::parse("*"), Ok(QueueTarget::Prefix("")));
        for bad in ["a*b", "a**", "*a", "a b*", ""] {
            assert!(QueueTarget::parse(bad).is_err(), "{bad}");
        }
        assert!(
            QueueTarget::parse("a*b")
                .unwrap_err()
                .contains("the only place a '*' may stand")
        );
    }

    #[test]
    fn patterns_match_names_and_prefixes() {
        assert!(pattern_matches("agent-*", "agent-x"));
        assert!(pattern_matches("agent-*", "agent-"));
        assert!(!pattern_matches("agent-*", "agent"));
        assert!(!pattern_matches("agent-*", "db"));
        assert!(pattern_matches("*", "db"));
        assert!(pattern_matches("db", "db"));
        assert!(!pattern_matches("db", "db2"));
        let token = vec!["agent-*".to_owned(), "db".to_owned()];
        assert!(any_matches(&token, "agent-x"));
        assert!(any_matches(&token, "db"));
        assert!(!any_matches(&token, "cache"));
    }

    fn prefix(prefix: &str, priority: i32) -> (String, QueueConfig) {
        let config = QueueConfig {
            priority,
            paused: true,
            ..QueueConfig::default()
        };
        (prefix.to_owned(), config)
    }

    fn pairs(prefixes: &[(String, QueueConfig)]) -> impl Iterator<Item = (&str, &QueueConfig)> {
        prefixes
            .iter()
            .map(|(prefix, config)| (prefix.as_str(), config))
    }

    #[test]
    fn own_settings_beat_the_longest_prefix_which_beats_shorter_ones() {
        let prefixes = vec![prefix("agent-", 2), prefix("", 1), prefix("agent-eu-", 3)];
        let pick = |queue: &str, own: Option<&QueueConfig>| {
            let (config, from) = effective_config(queue, own, false, pairs(&prefixes));
            (config.priority, from)
        };
        assert_eq!(pick("agent-eu-1", None), (3, Some("agent-eu-")));
        assert_eq!(pick("agent-us-1", None), (2, Some("agent-")));
        assert_eq!(pick("db", None), (1, Some("")));
        let own = QueueConfig {
            mode: QueueMode::Serial,
            ..QueueConfig::default()
        };
        let (config, from) = effective_config("agent-eu-1", Some(&own), false, pairs(&prefixes));
        assert_eq!(
            (config.mode, config.priority, from),
            (QueueMode::Serial, 0, None)
        );
        assert_eq!(
            effective_config("x", None, false, []).0,
            QueueConfig::default()
        );
    }

    #[test]
    fn a_queue_keeps_its_own_pause_whatever_settings_it_follows() {
        let prefixes = vec![prefix("agent-", 2)];
        let paused = |own: Option<&QueueConfig>, paused: bool| {
            effective_config("agent-1", own, paused, pairs(&prefixes))
                .0
                .paused
        };
        assert!(!paused(None, false));
        assert!(
            paused(None, true),
            "a prefix's settings never pause a queue"
        );
        assert!(paused(Some(&QueueConfig::default()), true));
    }
}
