//! Claims parked by long polls that found no work: the group transaction that makes work ready
//! on their queues runs them, after its other requests, so a waiting worker gets the work in the
//! group that made it ready instead of being woken after the commit to claim in the next one.
//!
//! A poll that found nothing parks its next claim here, one entry listed under each queue it
//! polls, and waits as before for a wake-up, its retry time or its deadline. Before a group runs
//! its claims, the writer takes parked claims from the queues its requests woke, oldest first,
//! until their tasks cover the work made ready that the group's own claims may not take. A claim
//! runs once: whichever takes it first, the writer or the poll taking it back when it wakes,
//! owns it. A poll whose claim the writer took waits for its answer, which comes with the
//! group's commit; a poll that took its claim back sends it to the writer as any claim.
//! Dropping a poll (its worker went away) drops the claim it parked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

type QueueKey = (String, String);

/// A claim parked by a waiting poll: taken once, by the writer or back by its poll.
pub(crate) struct Parked<W> {
    work: Mutex<Option<W>>,
    /// How many tasks the claim may take.
    max: u32,
}

impl<W> Parked<W> {
    /// Takes the claim back if no group took it yet (`None`: a group has it, and its answer is
    /// on the way).
    pub(crate) fn take_back(&self) -> Option<W> {
        self.work.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn is_waiting(&self) -> bool {
        self.work
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

/// The parked claims of this node, listed under each (namespace, queue) they poll, oldest first.
pub(crate) struct ParkingLot<W> {
    queues: Mutex<HashMap<QueueKey, Vec<Weak<Parked<W>>>>>,
}

impl<W> Default for ParkingLot<W> {
    fn default() -> Self {
        ParkingLot {
            queues: Mutex::new(HashMap::new()),
        }
    }
}

impl<W> ParkingLot<W> {
    /// Parks `work`, a claim of up to `max` tasks from `queues`; it stays parked while the
    /// returned handle lives and no group took it.
    pub(crate) fn park(
        &self,
        namespace: &str,
        queues: &[String],
        max: u32,
        work: W,
    ) -> Arc<Parked<W>> {
        let parked = Arc::new(Parked {
            work: Mutex::new(Some(work)),
            max,
        });
        let mut lot = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        for queue in queues {
            let list = lot
                .entry((namespace.to_owned(), queue.clone()))
                .or_default();
            // Claims that ran or whose poll ended leave their entries behind until then.
            list.retain(|weak| weak.upgrade().is_some_and(|parked| parked.is_waiting()));
            list.push(Arc::downgrade(&parked));
        }
        parked
    }

    /// How many claims wait parked on a queue.
    #[cfg(test)]
    pub(crate) fn waiting(&self, namespace: &str, queue: &str) -> usize {
        let lot = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        lot.get(&(namespace.to_owned(), queue.to_owned()))
            .map_or(0, |list| {
                list.iter()
                    .filter(|weak| weak.upgrade().is_some_and(|parked| parked.is_waiting()))
                    .count()
            })
    }

    /// Takes parked claims of a queue, oldest first, until the tasks they may take add up to
    /// `tasks` (every one when they do not).
    pub(crate) fn take(&self, namespace: &str, queue: &str, tasks: u64) -> Vec<W> {
        let mut taken = Vec::new();
        let mut covered = 0u64;
        let mut lot = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        let key = (namespace.to_owned(), queue.to_owned());
        let Some(list) = lot.get_mut(&key) else {
            return taken;
        };
        list.retain(|weak| {
            let Some(parked) = weak.upgrade() else {
                return false;
            };
            if covered >= tasks {
                return parked.is_waiting();
            }
            match parked.take_back() {
                Some(work) => {
                    covered += u64::from(parked.max);
                    taken.push(work);
                    false
                }
                None => false,
            }
        });
        if list.is_empty() {
            lot.remove(&key);
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn the_oldest_parked_claims_are_taken_until_they_cover_the_work() {
        let lot = ParkingLot::default();
        let first = lot.park("default", &queues(&["q"]), 2, "first");
        let second = lot.park("default", &queues(&["q"]), 2, "second");
        let third = lot.park("default", &queues(&["q"]), 2, "third");
        assert_eq!(lot.take("default", "q", 3), ["first", "second"]);
        assert_eq!(first.take_back(), None);
        assert_eq!(second.take_back(), None);
        // Not needed for the work made ready: still parked.
        assert_eq!(lot.take("default", "q", 1), ["third"]);
        drop(third);
        assert!(lot.take("default", "q", 1).is_empty());
    }

    #[test]
    fn a_claim_taken_back_by_its_poll_is_not_taken_again() {
        let lot = ParkingLot::default();
        let parked = lot.park("default", &queues(&["q"]), 1, "claim");
        assert_eq!(parked.take_back(), Some("claim"));
        assert!(lot.take("default", "q", 1).is_empty());
    }

    #[test]
    fn a_claim_of_several_queues_runs_once() {
        let lot = ParkingLot::default();
        let _parked = lot.park("default", &queues(&["a", "b"]), 1, "claim");
        assert_eq!(lot.take("default", "b", 1), ["claim"]);
        assert!(lot.take("default", "a", 1).is_empty());
    }

    #[test]
    fn a_dropped_poll_leaves_nothing_to_take() {
        let lot = ParkingLot::default();
        drop(lot.park("default", &queues(&["q"]), 1, "claim"));
        assert!(lot.take("default", "q", 1).is_empty());
    }

    #[test]
    fn claims_are_taken_only_from_the_woken_queue_of_their_namespace() {
        let lot = ParkingLot::default();
        let _parked = lot.park("default", &queues(&["q"]), 1, "claim");
        assert!(lot.take("default", "other", 1).is_empty());
        assert!(lot.take("elsewhere", "q", 1).is_empty());
        assert_eq!(lot.take("default", "q", 1), ["claim"]);
    }
}
