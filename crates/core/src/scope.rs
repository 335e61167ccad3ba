//! What an API token may do: its scopes, and which scope includes which. The store keeps tokens
//! with their scopes; the server checks a request's token against the scope its route needs.

use crate::wire::string_enum;

string_enum!(
    /// What a token may do. `admin` ⊃ `operate` ⊃ `submit` ⊃ `read`: each allows what the ones
    /// after it allow. `read`: read everything of the namespace; `submit`: also submit jobs;
    /// `operate`: also apply workflows, act on jobs, configure queues, schedules and webhooks,
    /// read the audit log; `admin`: also manage tokens and read `/metrics`. `work` stands alone:
    /// poll tasks and report on them, on the token's queues only.
    Scope {
        /// Tokens and namespaces, and everything `operate` may do.
        Admin => "admin",
        /// Jobs and their actions, workflows, queues, schedules, webhooks; and everything
        /// `submit` may.
        Operate => "operate",
        /// Create and read jobs; and everything `read` may.
        Submit => "submit",
        /// Poll and report tasks, on the token's queues only.
        Work => "work",
        /// Read everything of the namespace.
        Read => "read",
    }
);

impl Scope {
    /// True when holding `self` allows what `needed` allows.
    pub fn covers(self, needed: Scope) -> bool {
        let rank = |scope: Scope| match scope {
            Scope::Admin => 3,
            Scope::Operate => 2,
            Scope::Submit => 1,
            Scope::Read => 0,
            Scope::Work => -1,
        };
        self == needed || (needed != Scope::Work && rank(self) >= rank(needed) && rank(needed) >= 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_include_the_lesser_ones_but_work_stands_alone() {
        assert!(Scope::Admin.covers(Scope::Read));
        assert!(Scope::Operate.covers(Scope::Submit));
        assert!(Scope::Submit.covers(Scope::Read));
        assert!(!Scope::Submit.covers(Scope::Operate));
        assert!(!Scope::Read.covers(Scope::Submit));
        assert!(!Scope::Operate.covers(Scope::Work));
        assert!(!Scope::Work.covers(Scope::Read));
        assert!(Scope::Work.covers(Scope::Work));
    }
}
