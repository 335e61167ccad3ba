//! Batched completion reports ([`crate::WorkerBuilder::batch_completions`]): successes that
//! finish while a report request is in flight wait for it to end and then go together in one
//! `POST /api/v1/tasks/complete`. Nothing is held back on purpose: a lone success is sent at
//! once, and a busy worker's reports batch themselves. Each report still gets its own answer
//! (its result or its problem), so the worker handles it exactly as a single report.

use std::mem;
use std::sync::{Arc, Mutex, PoisonError};

use starbridge_api::{
    BatchItem, CompleteRequest, CompleteTask, CompleteTasks, MAX_BATCH_ITEMS, ReportResponse,
};
use tokio::sync::oneshot;

use crate::{Client, Error};

type Answer = Result<ReportResponse, Error>;

struct Waiting {
    task: CompleteTask,
    answer: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiting>,
    /// A sender task is running: it takes whatever waits once its request is answered.
    sending: bool,
}

pub(crate) struct Completions {
    client: Client,
    queue: Mutex<Queue>,
}

impl Completions {
    pub(crate) fn new(client: Client) -> Arc<Completions> {
        Arc::new(Completions {
            client,
            queue: Mutex::new(Queue::default()),
        })
    }

    /// Reports one success with the next batch; resolves with its own answer.
    pub(crate) async fn complete(
        self: &Arc<Self>,
        task_id: &str,
        request: &CompleteRequest,
    ) -> Answer {
        let (answer, answered) = oneshot::channel();
        let task = CompleteTask {
            id: task_id.to_owned(),
            lease_token: request.lease_token.clone(),
            output: request.output.clone(),
            logs: request.logs.clone(),
        };
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
                    // did commit then gets a 409, which the worker drops).
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
