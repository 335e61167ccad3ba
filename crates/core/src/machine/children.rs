//! Sub-workflows: each attempt of a `workflow` step starts a child job and waits for it,
//! holding no worker and no lease (`WaitFor::Child`). The machine decides and the engine acts
//! in the same transaction: `Action::StartChild` creates the child, `Action::ToChild` pauses,
//! resumes, cancels or rolls back a child, and a child's end comes back as `Input::ChildEnded`.
//!
//! A child that succeeds gives the step its output. One that ends `failed` or `timed_out`
//! fails the attempt (retryable: after the backoff, `WaitFor::ChildRetry`, a new child starts);
//! one that ends `compensation_failed` or was cancelled fails the step for good. When the parent
//! winds down, its running children are cancelled with compensation and the parent waits for
//! them; when it compensates, a sub-workflow step that succeeded (and names no `compensate` of
//! its own) is undone by rolling its child back, the child running its own compensations.

use serde_json::{Value, json};

use super::Machine;
use super::waits::waiting_detail;
use crate::ids::JobId;
use crate::model::{
    Action, ChildCommand, ChildStart, ErrorKind, EventKind, JobLock, JobStatus, Outcome,
    ParentLink, Rejection, TaskError, TaskKind, TaskStatus, Wait, WaitFor, WindDown,
};

impl Machine<'_> {
    /// Starts the next attempt of a sub-workflow step's task: a new child job with the params
    /// the task holds. A child that would nest too deep, or a workflow with no version to run,
    /// fails the step for good.
    pub(super) fn start_child_attempt(&mut self, index: usize) {
        let workflow = self.workflow;
        let Some(step) = workflow
            .step_index(&self.state.tasks[index].step)
            .and_then(|position| workflow.steps[position].child())
        else {
            return;
        };
        let depth = self.state.job.depth.saturating_add(1);
        if depth > self.limits.workflow_depth {
            let message = format!(
                "starting workflow {} would nest jobs {depth} deep, more than the limit of {} (server setting --max-workflow-depth)",
                step.workflow, self.limits.workflow_depth
            );
            return self.fail_for_child(index, message);
        }
        let version = step
            .version
            .or_else(|| self.state.job.child_versions.get(&step.workflow).copied());
        let Some(version) = version else {
            let message = format!(
                "workflow {} had no version when this job was created: apply it, then retry the job",
                step.workflow
            );
            return self.fail_for_child(index, message);
        };
        let child = self.ids.job_id();
        let now = self.now;
        let slots = workflow
            .step_index(&self.state.tasks[index].step)
            .and_then(|position| workflow.steps[position].lock.as_ref())
            .map(|lock| lock.slots);
        let task = &mut self.state.tasks[index];
        // The child holds the step's lock for its run: the attempt's slot.
        let lock = task
            .limits
            .as_ref()
            .and_then(|limits| limits.lock.clone())
            .zip(slots)
            .map(|(key, slots)| JobLock { key, slots });
        task.attempt += 1;
        task.status = TaskStatus::Running;
        task.ready_at.get_or_insert(now);
        task.started_at.get_or_insert(now);
        task.wait = Some(Box::new(Wait {
            since: now,
            on: WaitFor::Child { job: child.clone() },
        }));
        task.child = Some(Box::new(child.clone()));
        let start = ChildStart {
            child,
            parent: ParentLink {
                job: self.state.job.id.clone(),
                task: task.id.clone(),
                attempt: task.attempt,
            },
            workflow: step.workflow.clone(),
            version,
            params: task.input.clone().unwrap_or(Value::Null),
            priority: self.state.job.priority,
            lock,
        };
        let detail = waiting_detail(task.wait.as_deref());
        self.save_task(index);
        self.record(EventKind::TaskWaiting, Some(index), detail);
        self.actions.push(Action::StartChild(start));
    }

    fn fail_for_child(&mut self, index: usize, message: String) {
        self.fail_terminally(
            index,
            TaskError {
                message,
                retryable: false,
                kind: ErrorKind::Child,
            },
        );
    }

    /// The running task that waits for `child` (to run, or to roll back).
    fn waiting_for_child(&self, child: &JobId) -> Result<usize, Rejection> {
        self.state
            .tasks
            .iter()
            .position(|task| {
                task.status == TaskStatus::Running
                    && matches!(task.wait.as_deref(), Some(Wait { on: WaitFor::Child { job }, .. }) if job == child)
            })
            .ok_or_else(|| {
                Rejection::NotApplicable(format!("no task of this job waits for child job {child}"))
            })
    }

    /// A child job ended: the task waiting for it succeeds or fails accordingly (while the job
    /// is paused, the outcome takes effect at resume).
    pub(super) fn child_ended(
        &mut self,
        child: &JobId,
        status: JobStatus,
        output: Option<Value>,
        error: Option<String>,
    ) -> Result<(), Rejection> {
        let index = self.waiting_for_child(child)?;
        self.record(
            EventKind::ChildEnded,
            Some(index),
            json!({"child": child, "status": status}),
        );
        let ended = format!(
            "child job {child} ended {status}{}",
            error.map(|error| format!(": {error}")).unwrap_or_default()
        );
        let failure = |retryable| TaskError {
            message: ended.clone(),
            retryable,
            kind: ErrorKind::Child,
        };
        let task = &self.state.tasks[index];
        let outcome = if task.kind == TaskKind::Compensation {
            match status {
                JobStatus::Cancelled => Outcome::Succeeded(json!({"rolled_back": child})),
                _ => Outcome::Failed(failure(false)),
            }
        } else {
            let timed_out = self.state.tasks[index]
                .error
                .clone()
                .filter(|error| error.kind == ErrorKind::StepTimeout);
            if let Some(error) = timed_out {
                // Its step timeout passed meanwhile (`time_out_child`): it fails now.
                self.state.tasks[index].wait = None;
                self.fail_terminally(index, error);
                return Ok(());
            }
            if status == JobStatus::Cancelled && self.winding_down_past(index) {
                // Cancelled (with its compensations) because this job winds down.
                self.state.tasks[index].wait = None;
                self.cancel(
                    index,
                    "the job is winding down; its child job was cancelled",
                );
                return Ok(());
            }
            match status {
                JobStatus::Succeeded => Outcome::Succeeded(output.unwrap_or(Value::Null)),
                JobStatus::Failed | JobStatus::TimedOut => Outcome::Failed(failure(true)),
                _ => Outcome::Failed(failure(false)),
            }
        };
        if !self.state.tasks[index].held {
            self.state.tasks[index].wait = None;
        }
        self.resolve(index, outcome);
        Ok(())
    }

    /// A sub-workflow step's `step_timeout` passed while its child runs: the child is cancelled
    /// with compensation and the job winds down now (unless the step continues on failure),
    /// but the step fails only once the child has ended, so the job compensates after the
    /// child has undone its work.
    pub(super) fn time_out_child(&mut self, index: usize, child: JobId, error: TaskError) {
        let message = error.message.clone();
        let task = &mut self.state.tasks[index];
        task.deadline_at = None;
        task.error = Some(error);
        let (id, step) = (task.id.clone(), task.step.clone());
        self.save_task(index);
        if self.continues_on_failure(&step) {
            self.actions.push(Action::ToChild {
                child,
                command: ChildCommand::Cancel { compensate: true },
            });
        } else {
            // Winding down cancels every running child with compensation, this one included.
            self.wind_down(WindDown::StepFailed {
                task: id,
                step,
                message,
            });
        }
    }

    /// The child of `StartChild` could not be made: the step fails for good.
    pub(super) fn child_not_started(
        &mut self,
        child: &JobId,
        message: String,
    ) -> Result<(), Rejection> {
        let index = self.waiting_for_child(child)?;
        self.state.tasks[index].wait = None;
        self.fail_for_child(index, message);
        Ok(())
    }

    /// Sends `command` to the child of every forward task that waits for one.
    pub(super) fn command_children(&mut self, command: ChildCommand) {
        for index in 0..self.state.tasks.len() {
            if let Some(child) = self.running_child(index) {
                self.actions.push(Action::ToChild { child, command });
            }
        }
    }

    /// The child job a forward task waits for, if it does.
    pub(super) fn running_child(&self, index: usize) -> Option<JobId> {
        let task = &self.state.tasks[index];
        match task.wait.as_deref() {
            Some(Wait {
                on: WaitFor::Child { job },
                ..
            }) if task.kind != TaskKind::Compensation && task.status == TaskStatus::Running => {
                Some(job.clone())
            }
            _ => None,
        }
    }

    /// Whether a compensation undoes a sub-workflow step by rolling its child back (the step
    /// names no `compensate` of its own).
    pub(super) fn rolls_back_a_child(&self, index: usize) -> bool {
        let task = &self.state.tasks[index];
        task.kind == TaskKind::Compensation && task.child.is_some() && self.handler(index).is_none()
    }

    /// Starts a rollback compensation: the child runs its compensations, then ends `cancelled`.
    pub(super) fn begin_rollback(&mut self, index: usize) {
        let now = self.now;
        let task = &mut self.state.tasks[index];
        let Some(child) = task.child.as_deref().cloned() else {
            return;
        };
        task.status = TaskStatus::Running;
        task.attempt += 1;
        task.input = Some(json!({"child": child}));
        task.ready_at = Some(now);
        task.started_at = Some(now);
        task.wait = Some(Box::new(Wait {
            since: now,
            on: WaitFor::Child { job: child.clone() },
        }));
        let detail = waiting_detail(task.wait.as_deref());
        self.save_task(index);
        self.record(EventKind::TaskWaiting, Some(index), detail);
        self.actions.push(Action::ToChild {
            child,
            command: ChildCommand::RollBack,
        });
    }

    /// This job succeeded as a child and its parent compensates: it runs its own
    /// compensations, then ends `cancelled`.
    pub(super) fn roll_back(&mut self, by: JobId) -> Result<(), Rejection> {
        let status = self.state.job.status;
        if status != JobStatus::Succeeded {
            return Err(Rejection::NotApplicable(format!(
                "job is {status}: only a succeeded job is rolled back"
            )));
        }
        let reason = WindDown::RolledBack { by };
        let job = &mut self.state.job;
        job.status = JobStatus::Compensating;
        job.ended_at = None;
        job.compensation_planned = false;
        job.wind_down = Some(reason.clone());
        self.save_job();
        self.record(
            EventKind::JobCompensating,
            None,
            serde_json::to_value(&reason).unwrap_or(Value::Null),
        );
        Ok(())
    }
}
