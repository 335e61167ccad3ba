//! Steps the server completes itself, and failures a job goes on past: `set` succeeds at once
//! with its rendered object, `fail` fails the job with its rendered message (no retry, the job
//! compensates), a step with `continue_on_failure` ends `failed` while its dependants and the
//! job go on, and the workflow's `output` is rendered when the job succeeds.
//!
//! A continued failure counts as done for readiness and as ran for the "every dependency was
//! skipped" rule; dependants read its `status` (`failed`), `error` and `output` (`null`, or for
//! a fan-out the items' outputs with `null` for the failed ones). If the job succeeds the
//! failure's compensation never runs and the job names it in `failed_steps`; if the job later
//! winds down, the step is undone like any failed task that started.

use serde_json::{Value, json};

use super::Machine;
use crate::definition::StepKind;
use crate::model::{ErrorKind, EventKind, JobStatus, TaskError, TaskKind, TaskStatus, WindDown};

impl Machine<'_> {
    /// Starts a task of a step whose kind decides how, its expressions reading `context`: a
    /// worker's task becomes ready with the input it holds, a sub-workflow step starts a child
    /// with it, a waiting step waits, `set` and `fail` end at once.
    pub(super) fn start_by_kind(&mut self, index: usize, kind: &StepKind, context: &Value) {
        match kind {
            StepKind::Task(_) => {
                let input = self.state.tasks[index].input.clone().unwrap_or(Value::Null);
                self.make_ready(index, input);
            }
            StepKind::Wait(wait) => self.begin_wait(index, wait, context),
            StepKind::Set(object) => {
                let output = object
                    .render(context)
                    .map_err(|error| error.to_string())
                    .and_then(|output| self.within_task_limit(output, "output"));
                match output {
                    Ok(output) => {
                        self.begin_on_server(index);
                        self.succeed(index, output);
                    }
                    Err(error) => self.expression_failure(index, "set", error),
                }
            }
            StepKind::Fail { message } => match message.render(context) {
                Ok(rendered) => {
                    let message = match rendered {
                        Value::String(text) => text,
                        other => other.to_string(),
                    };
                    self.begin_on_server(index);
                    self.fail_terminally(
                        index,
                        TaskError {
                            message,
                            retryable: false,
                            kind: ErrorKind::FailStep,
                        },
                    );
                }
                Err(error) => self.expression_failure(index, "fail.message", error),
            },
            StepKind::Workflow(_) => self.start_child_attempt(index),
        }
    }

    /// Marks a task the server runs itself as started now.
    fn begin_on_server(&mut self, index: usize) {
        let now = self.now;
        let task = &mut self.state.tasks[index];
        task.ready_at = Some(now);
        task.started_at = Some(now);
        task.input.get_or_insert(Value::Null);
    }

    /// Whether a terminal failure of `step` lets the job go on.
    pub(super) fn continues_on_failure(&self, step: &str) -> bool {
        self.workflow.continues_on_failure(step)
    }

    /// Whether the task of a step (or fan-out) has ended in a way its dependants go on from.
    pub(super) fn lets_dependants_go_on(&self, index: usize) -> bool {
        let task = &self.state.tasks[index];
        self.workflow.lets_dependants_go_on(&task.step, task.status)
    }

    /// Every step has ended and the job goes on: it succeeds with its rendered `output` and the
    /// steps it went on past, or winds down when the output cannot be rendered or is too large.
    pub(super) fn succeed_job(&mut self) {
        let failed_steps: Vec<String> = self
            .state
            .tasks
            .iter()
            .filter(|task| matches!(task.kind, TaskKind::Step | TaskKind::FanOut))
            .filter(|task| task.status == TaskStatus::Failed)
            .map(|task| task.step.clone())
            .collect();
        let output = match &self.workflow.output {
            None => None,
            Some(template) => {
                let rendered = template
                    .render(&self.context())
                    .map_err(|error| error.to_string())
                    .and_then(|output| self.within_task_limit(output, "output"));
                match rendered {
                    Ok(output) => Some(output),
                    Err(message) => {
                        self.wind_down(WindDown::Output { message });
                        return;
                    }
                }
            }
        };
        let detail = if failed_steps.is_empty() {
            json!({})
        } else {
            json!({"failed_steps": failed_steps})
        };
        let job = &mut self.state.job;
        job.output = output;
        job.failed_steps = failed_steps;
        self.finish_job(JobStatus::Succeeded, EventKind::JobSucceeded, detail);
    }
}
