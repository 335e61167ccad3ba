//! Typed identifiers. Ids are made outside the core (the engine owns randomness) and passed in;
//! the newtypes make a mixed-up id a compile error.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! typed_id {
    ($(#[$meta:meta])* $name:ident, $prefix:literal) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            /// Builds an id from its unique part (for example a UUIDv7 in simple form).
            pub fn from_unique(unique: &str) -> Self {
                Self(format!("{}_{unique}", $prefix))
            }

            /// Accepts a full id (`prefix_…`) as given by a client; `None` when the prefix or
            /// characters are wrong.
            pub fn parse(text: &str) -> Option<Self> {
                let unique = text.strip_prefix(concat!($prefix, "_"))?;
                let well_formed = !unique.is_empty()
                    && unique.len() <= 64
                    && unique.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
                well_formed.then(|| Self(text.to_owned()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

typed_id!(
    /// A job: one run of a workflow.
    JobId,
    "job"
);
typed_id!(
    /// A task: one step's execution (or one fan-out item, or one compensation) inside a job.
    TaskId,
    "tsk"
);

/// Where the core gets fresh task ids from. The engine supplies UUIDv7-based ids; tests supply
/// counters, so every plan is reproducible.
pub trait IdSource {
    fn task_id(&mut self) -> TaskId;
    /// A child job's id (a sub-workflow step's attempt).
    fn job_id(&mut self) -> JobId;
}

/// A deterministic id source for tests and simulations.
#[derive(Debug, Default)]
pub struct SequentialIds {
    next: u64,
}

impl IdSource for SequentialIds {
    fn task_id(&mut self) -> TaskId {
        self.next += 1;
        TaskId::from_unique(&format!("{:08}", self.next))
    }

    fn job_id(&mut self) -> JobId {
        self.next += 1;
        JobId::from_unique(&format!("c{:08}", self.next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_only_the_right_prefix() {
        let id = JobId::from_unique("0190abc");
        assert_eq!(JobId::parse(id.as_str()), Some(id));
        assert_eq!(JobId::parse("tsk_0190abc"), None);
        assert_eq!(JobId::parse("job_"), None);
        assert_eq!(JobId::parse("job_a/b"), None);
    }
}
