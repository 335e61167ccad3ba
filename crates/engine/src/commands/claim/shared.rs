//! The claims of one group transaction share their read of the ready tasks.
//!
//! Busy workers of one kind poll together: a group transaction often holds a claim from each of
//! them, for the same queues. Run one after another, each claim would write out the rows held
//! back so far (its query must not offer the tasks the claim before it took), read the ready
//! tasks, and load their jobs: on PostgreSQL a handful of round trips per claim. Instead the
//! writer runs a group's claims last, after its other requests (none of them has been answered
//! yet, so any order is one they could have happened in; each worker's own reports still come
//! before its claim; claims of the same queues run one after another), and the first claim of a
//! set of queues reads enough ready tasks for every claim of the group on those queues (their
//! `ClaimDemand`s added up, at most `SHARED_READ_MOST` a queue), loading all their jobs at once.
//! What it does not take it leaves in the `Pool`, in dispatch order, with the queues' rows, for
//! the next claim of the same queues, which then reads nothing.
//!
//! The pool holds only tasks no request has touched since they were read: only claims run after
//! it is filled, each takes what it offers from the front and puts back the tasks it did not
//! come to, and the writer empties it before any other request, after any request that was not
//! kept, and when the next transaction begins. Even so the state machine checks every claim against
//! the job as it is now, so a pooled task that is no longer ready is passed over, never claimed
//! twice. Queues with a limit (serial, a concurrency, a rate) count their running tasks or
//! tokens per claim and do not share, nor does a claim that polls one of them.

use std::collections::{HashMap, HashSet, VecDeque};

use starbridge_core::dispatch::Candidate;
use starbridge_store::StoredQueue;

/// Which claims may share a read: the same namespace polling the same queues.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ClaimKey {
    pub(crate) namespace: String,
    pub(crate) queues: Vec<String>,
}

/// A claim as the writer sees it before the group runs: what it polls and how many tasks it
/// may take.
#[derive(Debug, Clone)]
pub(crate) struct ClaimDemand {
    pub(crate) key: ClaimKey,
    pub(crate) max: u32,
}

/// Ready tasks read by an earlier claim of the group and not taken.
#[derive(Debug)]
struct Pool {
    key: ClaimKey,
    /// In dispatch order.
    candidates: VecDeque<Candidate>,
    /// The read found every ready task of its queues: when the pool runs dry, so do they.
    complete: bool,
    /// The queues' rows as the claims read them (claims that share change none).
    queues: Vec<Option<StoredQueue>>,
}

/// The claims of the running group transaction: how many tasks those not yet run may take, and
/// the ready tasks read for them.
#[derive(Debug, Default)]
pub(crate) struct GroupClaims {
    demand: HashMap<ClaimKey, u32>,
    pool: Option<Pool>,
    /// Queues (with their namespace) whose every ready task a claim of the group read and
    /// none was left: nothing is ready there until a later transaction makes it so.
    took_all: HashSet<(String, String)>,
}

/// Candidates a claim got from the pool.
pub(crate) struct Pooled {
    pub(crate) candidates: VecDeque<Candidate>,
    /// No more ready tasks were left behind the pool when it was read.
    pub(crate) complete: bool,
    /// The rows of the key's queues, in their order.
    pub(crate) queues: Vec<Option<StoredQueue>>,
}

impl GroupClaims {
    /// A group transaction begins with these claims.
    pub(crate) fn begin<'a>(&mut self, claims: impl Iterator<Item = &'a ClaimDemand>) {
        self.demand.clear();
        self.pool = None;
        self.took_all.clear();
        for claim in claims {
            let total = self.demand.entry(claim.key.clone()).or_default();
            *total = total.saturating_add(claim.max);
        }
    }

    /// A claim of `key` for up to `max` tasks starts: how many tasks it and the group's claims
    /// of the same queues after it may take together.
    pub(crate) fn start(&mut self, key: &ClaimKey, max: u32) -> u32 {
        match self.demand.get_mut(key) {
            Some(left) => {
                let together = (*left).max(max);
                *left = left.saturating_sub(max);
                together
            }
            None => max,
        }
    }

    /// Takes every pooled candidate of `key` (none when the pool holds another key's).
    pub(crate) fn take(&mut self, key: &ClaimKey) -> Option<Pooled> {
        if self.pool.as_ref().is_some_and(|pool| pool.key != *key) {
            // Another set of queues is claimed from now on: its claims may take tasks of this
            // pool, which would then offer tasks already gone.
            self.pool = None;
        }
        let pool = self.pool.take()?;
        Some(Pooled {
            candidates: pool.candidates,
            complete: pool.complete,
            queues: pool.queues,
        })
    }

    /// Leaves the candidates a claim of `key` did not come to, in dispatch order, for the
    /// group's next claim of `key`, with the rows of its queues. `complete`: they are every
    /// ready task of its queues.
    pub(crate) fn put_back(
        &mut self,
        key: ClaimKey,
        candidates: VecDeque<Candidate>,
        complete: bool,
        queues: Vec<Option<StoredQueue>>,
    ) {
        if self.demand.get(&key).copied().unwrap_or(0) == 0 || candidates.is_empty() && !complete {
            self.pool = None;
            return;
        }
        self.pool = Some(Pool {
            key,
            candidates,
            complete,
            queues,
        });
    }

    /// A claim of `key` read every ready task of its queues and took or passed over each for
    /// good (none is left for a later claim).
    pub(crate) fn took_all_of(&mut self, key: &ClaimKey) {
        for queue in &key.queues {
            self.took_all.insert((key.namespace.clone(), queue.clone()));
        }
    }

    /// Whether the group's claims left no ready task on the queue (see `took_all_of`).
    pub(crate) fn took_all(&self, namespace: &str, queue: &str) -> bool {
        self.took_all
            .contains(&(namespace.to_owned(), queue.to_owned()))
    }

    /// Empties the pool: a request other than a claim runs, or one was not kept.
    pub(crate) fn forget(&mut self) {
        self.pool = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use starbridge_core::ids::{JobId, TaskId};
    use starbridge_core::time::Timestamp;

    fn key(queue: &str) -> ClaimKey {
        ClaimKey {
            namespace: "default".to_owned(),
            queues: vec![queue.to_owned()],
        }
    }

    fn candidate(n: u32) -> Candidate {
        Candidate {
            job: JobId::from_unique(&n.to_string()),
            task: TaskId::from_unique(&n.to_string()),
            queue: "q".to_owned(),
            queue_priority: 0,
            priority: 0,
            available_at: Timestamp(0),
            starving: false,
        }
    }

    fn demands(keys: &[(&str, u32)]) -> Vec<ClaimDemand> {
        keys.iter()
            .map(|(queue, max)| ClaimDemand {
                key: key(queue),
                max: *max,
            })
            .collect()
    }

    #[test]
    fn the_first_claim_of_a_set_of_queues_reads_for_every_claim_of_it_in_the_group() {
        let mut claims = GroupClaims::default();
        claims.begin(demands(&[("a", 10), ("b", 5), ("a", 20), ("a", 4)]).iter());
        assert_eq!(claims.start(&key("a"), 10), 34);
        assert_eq!(claims.start(&key("b"), 5), 5);
        assert_eq!(claims.start(&key("a"), 20), 24);
        assert_eq!(claims.start(&key("a"), 4), 4);
        // A claim the writer did not count reads for itself.
        assert_eq!(claims.start(&key("c"), 7), 7);
    }

    #[test]
    fn the_next_claim_of_the_same_queues_takes_what_the_last_one_put_back() {
        let mut claims = GroupClaims::default();
        claims.begin(demands(&[("a", 1), ("a", 1)]).iter());
        claims.start(&key("a"), 1);
        claims.put_back(
            key("a"),
            VecDeque::from([candidate(2), candidate(3)]),
            false,
            Vec::new(),
        );
        let pooled = claims.take(&key("a")).expect("pooled");
        assert_eq!(
            pooled.candidates,
            VecDeque::from([candidate(2), candidate(3)])
        );
        assert!(!pooled.complete);
        assert!(claims.take(&key("a")).is_none(), "taken once");
    }

    #[test]
    fn nothing_is_pooled_once_no_claim_of_the_queues_is_left_in_the_group() {
        let mut claims = GroupClaims::default();
        claims.begin(demands(&[("a", 1)]).iter());
        claims.start(&key("a"), 1);
        claims.put_back(key("a"), VecDeque::from([candidate(2)]), false, Vec::new());
        assert!(claims.take(&key("a")).is_none());
    }

    #[test]
    fn a_claim_of_other_queues_or_another_request_empties_the_pool() {
        let mut claims = GroupClaims::default();
        claims.begin(demands(&[("a", 1), ("b", 1), ("a", 1)]).iter());
        claims.start(&key("a"), 1);
        claims.put_back(key("a"), VecDeque::from([candidate(2)]), false, Vec::new());
        assert!(claims.take(&key("b")).is_none());
        assert!(
            claims.take(&key("a")).is_none(),
            "the other queues' claim emptied it"
        );

        claims.put_back(key("a"), VecDeque::from([candidate(3)]), false, Vec::new());
        claims.forget();
        assert!(claims.take(&key("a")).is_none());
    }

    #[test]
    fn an_empty_read_that_found_every_ready_task_is_pooled_as_such() {
        let mut claims = GroupClaims::default();
        claims.begin(demands(&[("a", 1), ("a", 1)]).iter());
        claims.start(&key("a"), 1);
        claims.put_back(key("a"), VecDeque::new(), true, Vec::new());
        let pooled = claims.take(&key("a")).expect("pooled");
        assert!(pooled.candidates.is_empty() && pooled.complete);
    }
}
