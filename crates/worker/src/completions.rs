//! How successes are reported: carried by the worker's next poll (`complete` of `POST
//! /api/v1/tasks/poll`), so that a busy worker makes one request per cycle, or on their own.
//!
//! A success frees its task's slot, and the poll loop, which waits for a free slot, polls at
//! once and carries every success waiting. A success that finishes while a poll is in flight
//! waits for the next poll only while that poll is young ([`CARRY_WAIT`] since it was sent): a
//! poll still out after that is most likely waiting for work, and the success goes on its own.
//! A poll that fails hands its successes back to be sent on their own (sent again, a success
//! the poll did commit is answered as the first time, under the same lease token). A server
//! that refuses the `complete` field (one that predates it) is not asked again.
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
use tokio::sync::{OwnedSemaphorePermit, oneshot};
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loop {
    /// Waiting for a free slot: the success's slot starts a poll at once.
    WaitingForSlot,
    /// A poll sent at this instant is in flight.
    Polling(Instant),
    /// Backing off after a failed poll, or stopped: no poll is coming soon.
    Away,
}

struct Queue {
    /// Successes the next poll carries.
    for_poll: Vec<ForPoll>,
    numbered: u64,
    /// Batched successes not yet sent.
    waiting: Vec<Waiting>,
    /// A batch sender task is running: it takes whatever waits once its request is answered.
    sending: bool,
    polling: Loop,
    /// False once the server refused a poll's `complete`.
    carry: bool,
}

/// The successes a poll carries, each answered once the poll is.
pub(crate) struct Carrying {
    items: Vec<ForPoll>,
}

impl Carrying {
    /// The items for the poll request.
    pub(crate) fn tasks(&self) -> Vec<CompleteTask> {
        self.items.iter().map(|item| item.task.clone()).collect()
    }

    fn hand_back(self) {
        for item in self.items {
            let _ = item.answer.send(Carried::Back);
        }
    }
}

pub(crate) struct Completions {
    client: Client,
    /// Successes sent on their own go in batches.
    batch: bool,
    queue: Mutex<Queue>,
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
                polling: Loop::WaitingForSlot,
                carry: true,
            }),
        })
    }

    /// Reports one success, on the next poll when one is coming soon (then `slot`, the task's
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
            let until = match queue.polling {
                Loop::WaitingForSlot => Some(now + CARRY_WAIT),
                Loop::Polling(sent) => Some(sent + CARRY_WAIT).filter(|until| *until > now),
                Loop::Away => None,
            };
            until.filter(|_| queue.carry).map(|until| {
                let (answer, answered) = oneshot::channel();
                queue.numbered += 1;
                let number = queue.numbered;
                queue.for_poll.push(ForPoll {
                    number,
                    task: task.clone(),
                    answer,
                });
                (number, until, answered)
            })
        };
        if let Some((number, until, mut answered)) = carried {
            slot.take();
            let carried = match tokio::time::timeout_at(until, &mut answered).await {
                Ok(carried) => carried.ok(),
                // Not taken by a poll in time: take it back, unless a poll took it just now.
                Err(_) if self.take_back(number) => None,
                Err(_) => answered.await.ok(),
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

    /// The successes for the poll about to be sent (at most [`MAX_BATCH_ITEMS`]).
    pub(crate) fn poll_sent(&self) -> Carrying {
        let mut queue = self.lock();
        queue.polling = Loop::Polling(Instant::now());
        let take = queue.for_poll.len().min(MAX_BATCH_ITEMS);
        Carrying {
            items: queue.for_poll.drain(..take).collect(),
        }
    }

    /// Answers the successes a poll carried with its `reports`; the loop waits for a slot next.
    pub(crate) fn poll_answered(
        &self,
        carrying: Carrying,
        reports: Vec<BatchItem<ReportResponse>>,
    ) {
        self.lock().polling = Loop::WaitingForSlot;
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

    /// Hands the successes of a failed poll back to be sent on their own; no poll comes until
    /// `polling_again`. True when the server refused to take successes with a poll at all (it
    /// predates them): then none is carried again, and the poll may be sent again at once.
    pub(crate) fn poll_failed(&self, carrying: Carrying, error: &Error) -> bool {
        let refused = match error {
            Error::Rejected {
                status: 400 | 422,
                problem,
            } => refuses_complete(problem),
            _ => false,
        };
        let predates = refused && !carrying.items.is_empty();
        {
            let mut queue = self.lock();
            queue.polling = Loop::Away;
            if predates && mem::replace(&mut queue.carry, false) {
                info!(
                    "the server does not take completions with a poll; reporting them on their own"
                );
            }
        }
        carrying.hand_back();
        predates
    }

    /// The poll loop waits for a free slot again (after backing off).
    pub(crate) fn polling_again(&self) {
        self.lock().polling = Loop::WaitingForSlot;
    }

    /// The poll loop stopped: every success goes on its own from now on.
    pub(crate) fn polling_stopped(&self) {
        let carried = {
            let mut queue = self.lock();
            queue.polling = Loop::Away;
            mem::take(&mut queue.for_poll)
        };
        Carrying { items: carried }.hand_back();
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
