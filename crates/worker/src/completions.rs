//! How successes are reported: carried by the worker's next poll (`complete` of `POST
//! /api/v1/tasks/poll`), so that a busy worker makes one request per cycle, or on their own.
//!
//! A success frees its task's slot, and the poll loop, which waits for a free slot, polls at
//! once and carries every success waiting; while the queue has a backlog it first lets the
//! other tasks that are ending end (it yields to the runtime while that frees more slots), so
//! that their successes ride on that poll and it asks for their slots' tasks too. A success
//! that finishes while a poll is in flight rides on the next poll only when the poll in flight
//! is expected to answer soon: the answer before it came quickly with every task it asked for
//! (the queue had a backlog), and it is young ([`CARRY_WAIT`] since it was sent). Otherwise the poll in flight is most
//! likely waiting for work, and the success's slot starts another poll at once, one that does
//! not wait: it carries the success, so that its report and the claim of the work it makes ready
//! (the next step of its job) commit together, while the poll waiting for work keeps waiting
//! for the other slots. A poll that fails hands its successes, and those waiting for a poll,
//! back to be sent on their own (sent again, a success the poll did commit is answered as the
//! first time, under the same lease token). A server that refuses the `complete` field (one
//! that predates it) is not asked again.
//!
//! On their own, successes go one request each, or with
//! [`crate::WorkerBuilder::batch_completions`] in batches: those that finish while a report
//! request is in flight wait for it to end and then go together in one `POST
//! /api/v1/tasks/complete`. Either way each success gets its own answer (its result or its
//! problem), so the worker handles it exactly as a single report.

use std::mem;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use starbridge_api::{
    BatchItem, CompleteRequest, CompleteTask, CompleteTasks, MAX_BATCH_ITEMS, Problem,
    ReportResponse,
};
use tokio::sync::{Notify, OwnedSemaphorePermit, oneshot};
use tokio::time::Instant;
use tracing::info;

use crate::{Client, Error};

/// How long after a poll was sent a success that finished meanwhile still waits to ride on the
/// next poll: a poll that finds work answers well within it.
pub(crate) const CARRY_WAIT: Duration = Duration::from_millis(20);

type Answer = Result<ReportResponse, Error>;

/// What becomes of a success handed to a poll.
enum Carried {
    /// The poll answered for it.
    Answered(Answer),
    /// The poll failed, or gave no answer for it: it is to be sent on its own.
    Back,
}

struct ForPoll {
    /// Tells a waiting success apart from the others, to take it back.
    number: u64,
    task: CompleteTask,
    answer: oneshot::Sender<Carried>,
}

struct Waiting {
    task: CompleteTask,
    answer: oneshot::Sender<Answer>,
}

/// What the poll loop is doing, as far as successes care.
#[derive(Debug, Clone, Copy)]
struct Polling {
    /// Polls in flight.
    in_flight: usize,
    /// When the poll in flight that is expected to answer soon was sent: the loop's only poll,
    /// sent after an answer that found a backlog (see `found_enough`).
    promising: Option<Instant>,
    /// The last answer came quickly (within [`CARRY_WAIT`]) and showed a backlog: the queue held
    /// more, without waiting.
    found_enough: bool,
    /// Backing off after a failed poll, or stopped: no poll is coming soon.
    away: bool,
}

struct Queue {
    /// Successes the next poll carries.
    for_poll: Vec<ForPoll>,
    numbered: u64,
    /// Batched successes not yet sent.
    waiting: Vec<Waiting>,
    /// A batch sender task is running: it takes whatever waits once its request is answered.
    sending: bool,
    polling: Polling,
    /// False once the server refused a poll's `complete`.
    carry: bool,
}

/// How a success waits for a poll to carry it.
enum Ride {
    /// On the poll the loop sends next, which it starts at once (`nudge`: it is told to, as it
    /// already has a poll in flight).
    Next { nudge: bool },
    /// On the poll after the promising one in flight, if that one answers by this instant.
    After(Instant),
}

/// The successes a poll carries, each answered once the poll is.
pub(crate) struct Carrying {
    items: Vec<ForPoll>,
    /// The poll is the promising one (see [`Polling::promising`]).
    promising: bool,
    sent: Instant,
}

impl Carrying {
    /// The items for the poll request.
    pub(crate) fn tasks(&self) -> Vec<CompleteTask> {
        self.items.iter().map(|item| item.task.clone()).collect()
    }

    fn hand_back(self) {
        hand_back(self.items);
    }
}

fn hand_back(items: Vec<ForPoll>) {
    for item in items {
        let _ = item.answer.send(Carried::Back);
    }
}

pub(crate) struct Completions {
    client: Client,
    /// Successes sent on their own go in batches.
    batch: bool,
    queue: Mutex<Queue>,
    /// A success waits for a poll while the polls in flight are waiting for work: the loop
    /// starts one for its slot.
    poll_wanted: Notify,
}

impl Completions {
    pub(crate) fn new(client: Client, batch: bool) -> Arc<Completions> {
        Arc::new(Completions {
            client,
            batch,
            queue: Mutex::new(Queue {
                for_poll: Vec::new(),
                numbered: 0,
                waiting: Vec::new(),
                sending: false,
                polling: Polling {
                    in_flight: 0,
                    promising: None,
                    found_enough: false,
                    away: false,
                },
                carry: true,
            }),
            poll_wanted: Notify::new(),
        })
    }

    /// Reports one success, on a poll when one is coming soon (then `slot`, the task's
    /// concurrency slot, is given up so that the poll loop polls), else on its own; resolves
    /// with its own answer.
    pub(crate) async fn complete(
        self: &Arc<Self>,
        task_id: &str,
        request: &CompleteRequest,
        slot: &mut Option<OwnedSemaphorePermit>,
    ) -> Answer {
        let task = CompleteTask {
            id: task_id.to_owned(),
            lease_token: request.lease_token.clone(),
            output: request.output.clone(),
            logs: request.logs.clone(),
        };
        let now = Instant::now();
        let carried = {
            let mut queue = self.lock();
            let polling = queue.polling;
            let ride = match polling.promising {
                _ if !queue.carry || polling.away => None,
                _ if polling.in_flight == 0 => Some(Ride::Next { nudge: false }),
                Some(sent) if sent + CARRY_WAIT > now => Some(Ride::After(sent + CARRY_WAIT)),
                _ => Some(Ride::Next { nudge: true }),
            };
            ride.map(|ride| {
                let (answer, answered) = oneshot::channel();
                queue.numbered += 1;
                let number = queue.numbered;
                queue.for_poll.push(ForPoll {
                    number,
                    task: task.clone(),
                    answer,
                });
                (number, ride, answered)
            })
        };
        if let Some((number, ride, mut answered)) = carried {
            slot.take();
            let carried = match ride {
                Ride::Next { nudge } => {
                    if nudge {
                        self.poll_wanted.notify_one();
                    }
                    // The next poll takes it, or, failing or stopped, hands it back.
                    answered.await.ok()
                }
                Ride::After(until) => match tokio::time::timeout_at(until, &mut answered).await {
                    Ok(carried) => carried.ok(),
                    // Not taken by a poll in time: take it back, unless a poll took it just now.
                    Err(_) if self.take_back(number) => None,
                    Err(_) => answered.await.ok(),
                },
            };
            if let Some(Carried::Answered(answer)) = carried {
                return answer;
            }
        }
        self.send_alone(task).await
    }

    fn take_back(&self, number: u64) -> bool {
        let mut queue = self.lock();
        let before = queue.for_poll.len();
        queue.for_poll.retain(|item| item.number != number);
        queue.for_poll.len() < before
    }

    /// Resolves when a success waits for a poll while the polls in flight wait for work (it may
    /// resolve for one a poll has taken since: see [`Completions::waiting_for_poll`]).
    pub(crate) async fn poll_wanted(&self) {
        self.poll_wanted.notified().await;
    }

    /// Whether the last poll answered quickly with every task it asked for: the queue has a
    /// backlog, and the next poll is expected to find work at once.
    pub(crate) fn backlog_found(&self) -> bool {
        self.lock().polling.found_enough
    }

    /// Whether a success waits for a poll to carry it.
    pub(crate) fn waiting_for_poll(&self) -> bool {
        !self.lock().for_poll.is_empty()
    }

    /// The successes for the poll about to be sent (at most [`MAX_BATCH_ITEMS`]); `alone`: no
    /// other poll is in flight.
    pub(crate) fn poll_sent(&self, alone: bool) -> Carrying {
        let mut queue = self.lock();
        let now = Instant::now();
        let polling = &mut queue.polling;
        polling.in_flight += 1;
        let promising = alone && polling.found_enough;
        if promising {
            polling.promising = Some(now);
        }
        let take = queue.for_poll.len().min(MAX_BATCH_ITEMS);
        Carrying {
            items: queue.for_poll.drain(..take).collect(),
            promising,
            sent: now,
        }
    }

    /// A poll was answered (`backlog`: with every task it asked for): answers the
    /// successes it carried with its `reports`.
    pub(crate) fn poll_answered(
        &self,
        carrying: Carrying,
        reports: Vec<BatchItem<ReportResponse>>,
        backlog: bool,
    ) {
        {
            let mut queue = self.lock();
            let polling = &mut queue.polling;
            polling.in_flight -= 1;
            // A poll that waited for work until it was woken found the queue empty first.
            polling.found_enough = backlog && carrying.sent.elapsed() < CARRY_WAIT;
            if carrying.promising {
                polling.promising = None;
            }
        }
        if reports.len() != carrying.items.len() {
            // Not the answer of a server that took them: each is sent again on its own.
            carrying.hand_back();
            return;
        }
        for (item, report) in carrying.items.into_iter().zip(reports) {
            let answer = match report {
                BatchItem::Done(reported) => Ok(reported),
                BatchItem::Refused { error } => Err(Error::from_problem(error)),
            };
            let _ = item.answer.send(Carried::Answered(answer));
        }
    }

    /// Hands the successes of a failed poll, and those waiting for a poll, back to be sent on
    /// their own; no poll comes until `polling_again`. True when the server refused to take
    /// successes with a poll at all (it predates them): then none is carried again, and the
    /// poll may be sent again at once.
    pub(crate) fn poll_failed(&self, carrying: Carrying, error: &Error) -> bool {
        let refused = match error {
            Error::Rejected {
                status: 400 | 422,
                problem,
            } => refuses_complete(problem),
            _ => false,
        };
        let predates = refused && !carrying.items.is_empty();
        let waiting = {
            let mut queue = self.lock();
            let polling = &mut queue.polling;
            polling.in_flight -= 1;
            if carrying.promising {
                polling.promising = None;
            }
            if !predates {
                polling.away = true;
            }
            if predates && mem::replace(&mut queue.carry, false) {
                info!(
                    "the server does not take completions with a poll; reporting them on their own"
                );
            }
            mem::take(&mut queue.for_poll)
        };
        carrying.hand_back();
        hand_back(waiting);
        predates
    }

    /// A poll in flight ended without an answer (its task panicked): the successes it carried
    /// were dropped with it, and each is sent on its own.
    pub(crate) fn poll_lost(&self) {
        let mut queue = self.lock();
        queue.polling.in_flight = queue.polling.in_flight.saturating_sub(1);
    }

    /// The poll loop polls again (after backing off).
    pub(crate) fn polling_again(&self) {
        self.lock().polling.away = false;
    }

    /// The poll loop stopped: every success goes on its own from now on.
    pub(crate) fn polling_stopped(&self) {
        let carried = {
            let mut queue = self.lock();
            queue.polling.away = true;
            mem::take(&mut queue.for_poll)
        };
        hand_back(carried);
    }

    async fn send_alone(self: &Arc<Self>, task: CompleteTask) -> Answer {
        if !self.batch {
            let request = CompleteRequest {
                lease_token: task.lease_token,
                output: task.output,
                logs: task.logs,
            };
            return self.client.complete(&task.id, &request).await;
        }
        let (answer, answered) = oneshot::channel();
        let start_sender = {
            let mut queue = self.lock();
            queue.waiting.push(Waiting { task, answer });
            !mem::replace(&mut queue.sending, true)
        };
        if start_sender {
            // A task of its own, so that a caller cancelled at shutdown does not strand the
            // reports of others.
            let completions = self.clone();
            tokio::spawn(async move { completions.send_all().await });
        }
        answered.await.unwrap_or_else(|_| {
            Err(Error::Server {
                status: 500,
                message: "the batched report was lost".to_owned(),
            })
        })
    }

    /// Sends what waits, batch after batch, until nothing does.
    async fn send_all(&self) {
        loop {
            let batch: Vec<Waiting> = {
                let mut queue = self.lock();
                if queue.waiting.is_empty() {
                    queue.sending = false;
                    return;
                }
                let take = queue.waiting.len().min(MAX_BATCH_ITEMS);
                queue.waiting.drain(..take).collect()
            };
            let (tasks, answers): (Vec<CompleteTask>, Vec<oneshot::Sender<Answer>>) = batch
                .into_iter()
                .map(|waiting| (waiting.task, waiting.answer))
                .unzip();
            let count = tasks.len();
            match self.client.complete_many(&CompleteTasks { tasks }).await {
                Ok(response) if response.items.len() == count => {
                    for (item, answer) in response.items.into_iter().zip(answers) {
                        let _ = answer.send(match item {
                            BatchItem::Done(reported) => Ok(reported),
                            BatchItem::Refused { error } => Err(Error::from_problem(error)),
                        });
                    }
                }
                Ok(response) => {
                    for answer in answers {
                        let _ = answer.send(Err(Error::Server {
                            status: 500,
                            message: format!(
                                "the server answered {} items for {count} reports",
                                response.items.len()
                            ),
                        }));
                    }
                }
                Err(error) => {
                    // Every report of the batch shares the failure. A refused request stays
                    // refused; anything else may be retried, each report on its own (one that
                    // did commit is then answered as the first time).
                    for answer in answers {
                        let _ = answer.send(Err(match &error {
                            Error::Rejected { status, problem } => Error::Rejected {
                                status: *status,
                                problem: problem.clone(),
                            },
                            other => Error::Server {
                                status: other.status().unwrap_or(503),
                                message: other.to_string(),
                            },
                        }));
                    }
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether a refused poll was refused for its `complete` field as such: a server that predates
/// it names it as unknown (`body`: "unknown field `complete`"), or names `complete` itself.
/// (A problem naming one item, `complete[2].lease_token`, is that item's.)
fn refuses_complete(problem: &Problem) -> bool {
    problem.errors.iter().any(|fault| {
        fault.field == "complete"
            || (fault.field == "body" && fault.message.contains("unknown field `complete`"))
    })
}

#[cfg(test)]
mod tests {
    use starbridge_api::FieldProblem;

    use super::*;

    fn problem(field: &str, message: &str) -> Problem {
        Problem {
            kind: "/problems/invalid-request".into(),
            title: "Invalid request".into(),
            status: 400,
            detail: format!("{field}: {message}"),
            errors: vec![FieldProblem {
                field: field.into(),
                message: message.into(),
            }],
            limit: None,
        }
    }

    #[test]
    fn a_poll_refused_for_its_complete_field_says_the_server_predates_it_and_one_item_does_not() {
        let older = problem(
            "body",
            "unknown field `complete`, expected one of `worker_id`, `queues` (line 1 column 80)",
        );
        assert!(refuses_complete(&older));
        assert!(refuses_complete(&problem("complete", "give at most 1000")));
        assert!(!refuses_complete(&problem(
            "complete[1].lease_token",
            "a NUL"
        )));
        assert!(!refuses_complete(&problem("wait_ms", "at most 60000")));
    }
}
