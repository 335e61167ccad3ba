//! Operator actions: pause, resume, cancel, retry, skip and rerun a job; requeue and fail one
//! task. Each checks that it applies to the job's current state (else `Rejection::NotApplicable`
//! with the reason) and is recorded in the history with who asked and why.
//!
//! Requeue revokes a running task's lease: the task is ready again at once, but claimable only
//! from the moment the revoked lease would have lapsed, so that two copies never run at once;
//! meanwhile its worker's reports under the revoked lease are refused with the reason
//! (`Rejection::LeaseRevoked`), which tells it to stop; once a report has been refused so, the
//! worker knows, and the task is claimable at once (`RevocationTold`). The attempt it ran is not counted
//! against `max_attempts`. A task awaiting a callback holds no lease: requeued, it is claimable
//! at once, and its callback token answers 410 from then on.
//!
//! Retry, skip-on-a-failed-job and rerun start a new *round*: the tasks they reset carry the new
//! round number, and so do the compensations planned afterwards, so the previous round's
//! compensations stay in the history without taking part again. A task whose compensation
//! succeeded was undone, so these actions run it again too.

use std::collections::{BTreeSet, HashSet};

use serde_json::{Value, json};

use super::Machine;
use crate::ids::TaskId;
use crate::model::{
    ChildCommand, ErrorKind, EventKind, JobStatus, OperatorAction, OperatorCommand, Rejection,
    TaskError, TaskKind, TaskStatus, WaitFor,
};

fn not_applicable(message: String) -> Rejection {
    Rejection::NotApplicable(message)
}

impl Machine<'_> {
    pub(super) fn operate(&mut self, command: OperatorCommand) -> Result<(), Rejection> {
        let status = self.state.job.status;
        let name = command.action.name();
        let who = json!({"actor": command.actor, "reason": command.reason});
        match command.action {
            OperatorAction::Pause => {
                if !status.can_pause() {
                    return Err(not_applicable(format!(
                        "job is {status}: only a running job can be paused"
                    )));
                }
                self.state.job.status = JobStatus::Paused;
                self.save_job();
                for index in self.forward_tasks_held_by_pause() {
                    self.state.tasks[index].held = true;
                    self.save_task(index);
                }
                self.record(EventKind::JobPaused, None, who);
                self.command_children(ChildCommand::Pause);
            }
            OperatorAction::Resume => {
                if !status.can_resume() {
                    return Err(not_applicable(format!(
                        "job is {status}: only a paused job can be resumed"
                    )));
                }
                self.state.job.status = JobStatus::Running;
                self.save_job();
                for index in self.forward_tasks_held_by_pause() {
                    self.state.tasks[index].held = false;
                    self.save_task(index);
                    if self.state.tasks[index].status == TaskStatus::Ready {
                        self.wake(index);
                    }
                }
                self.record(EventKind::JobResumed, None, who);
                self.command_children(ChildCommand::Resume);
                // What arrived or fell due while paused takes effect now.
                self.settle_waits();
            }
            OperatorAction::Cancel { compensate } => {
                if !status.can_cancel() {
                    return Err(not_applicable(format!(
                        "job is {status}: only a queued, running or paused job can be cancelled"
                    )));
                }
                let mut detail = who;
                detail["compensate"] = json!(compensate);
                self.record(EventKind::JobCancelled, None, detail);
                if compensate {
                    self.wind_down(crate::model::WindDown::Cancelled {
                        actor: command.actor,
                    });
                } else {
                    self.cancel_unstarted_and_waiting("the job was cancelled", false);
                    let job = &mut self.state.job;
                    job.status = JobStatus::Cancelled;
                    job.ended_at = Some(self.now);
                    self.save_job();
                }
            }
            OperatorAction::Retry => {
                self.require_finished_unsuccessfully(name)?;
                self.require_no_running_task()?;
                let undone = self.undone_tasks();
                let reset: Vec<usize> = (0..self.state.tasks.len())
                    .filter(|&i| {
                        let task = &self.state.tasks[i];
                        task.kind != TaskKind::Compensation
                            && (matches!(task.status, TaskStatus::Failed | TaskStatus::Cancelled)
                                || undone.contains(&task.id))
                    })
                    .collect();
                self.start_round(&reset);
                self.record(EventKind::JobRetried, None, who);
            }
            OperatorAction::Skip { task, output } => {
                let index = self
                    .state
                    .position(&task)
                    .ok_or_else(|| Rejection::UnknownTask(task.clone()))?;
                self.skip_task(index, output, who, name)?;
            }
            OperatorAction::SkipStep { step, output } => {
                let index = self.step_task(&step)?;
                self.skip_task(index, output, who, name)?;
            }
            OperatorAction::Rerun { step } => {
                if !status.can_rerun() {
                    return Err(not_applicable(format!(
                        "job is {status}: rerun applies to a finished job (pause or cancel it first)"
                    )));
                }
                let step_index = self.step_of_workflow(&step)?;
                self.require_no_running_task()?;
                let steps = self.downstream_of(step_index);
                let undone = self.undone_tasks();
                let reset: Vec<usize> = (0..self.state.tasks.len())
                    .filter(|&i| {
                        let task = &self.state.tasks[i];
                        task.kind != TaskKind::Compensation
                            && (steps.contains(&task.step)
                                || undone.contains(&task.id)
                                || matches!(
                                    task.status,
                                    TaskStatus::Failed | TaskStatus::Cancelled
                                ))
                    })
                    .collect();
                let mut detail = who;
                detail["step"] = json!(step);
                // A rerun step expands its fan-out again from scratch.
                self.start_round_from_scratch(&reset, &steps);
                self.record(EventKind::JobRerun, None, detail);
            }
            OperatorAction::Requeue { task } => {
                let index = self
                    .state
                    .position(&task)
                    .ok_or_else(|| Rejection::UnknownTask(task.clone()))?;
                self.requeue_task(index, &command.actor, command.reason.as_deref(), who)?;
            }
            OperatorAction::FailTask { task, message } => {
                let index = self
                    .state
                    .position(&task)
                    .ok_or_else(|| Rejection::UnknownTask(task.clone()))?;
                self.fail_task_by_hand(index, message, who)?;
            }
        }
        Ok(())
    }

    /// The index of step `step` in the workflow; refused when it has no such step.
    fn step_of_workflow(&self, step: &str) -> Result<usize, Rejection> {
        self.workflow.step_index(step).ok_or_else(|| {
            not_applicable(format!(
                "workflow {} has no step '{step}'",
                self.workflow.name
            ))
        })
    }

    /// The task of step `step`: the plain or fan-out task every job has for each step of its
    /// workflow (not an item or a compensation).
    fn step_task(&self, step: &str) -> Result<usize, Rejection> {
        self.step_of_workflow(step)?;
        self.state
            .tasks
            .iter()
            .position(|task| {
                task.step == step && matches!(task.kind, TaskKind::Step | TaskKind::FanOut)
            })
            .ok_or_else(|| not_applicable(format!("the job has no task of step '{step}'")))
    }

    /// Revokes the lease of a task a worker runs and makes it ready for a new attempt, claimable
    /// when the revoked lease would have lapsed (see the module's documentation).
    fn requeue_task(
        &mut self,
        index: usize,
        actor: &str,
        reason: Option<&str>,
        who: Value,
    ) -> Result<(), Rejection> {
        let task = &self.state.tasks[index];
        let status = task.status;
        // A task whose worker handed the attempt to another system holds no lease: its
        // callback token is refused (410) once the task has moved on, so the next attempt is
        // claimable at once.
        let awaits_callback = task
            .wait
            .as_ref()
            .is_some_and(|wait| matches!(wait.on, WaitFor::Callback { .. }));
        if let Some(wait) = task.wait.as_ref().filter(|_| !awaits_callback) {
            let on = serde_json::to_value(&wait.on).unwrap_or(Value::Null);
            let what = on["for"].as_str().unwrap_or("something").to_owned();
            return Err(not_applicable(format!(
                "task waits on the server for {what}, held by no worker: there is nothing to requeue (fail or skip it instead)"
            )));
        }
        if status != TaskStatus::Running {
            return Err(not_applicable(format!(
                "task is {status}: only a running task, held by a worker, can be requeued"
            )));
        }
        if self.winding_down_past(index) {
            return Err(not_applicable(format!(
                "job is {}: a forward task is not run again while the job winds down",
                self.state.job.status
            )));
        }
        let paused = self.state.job.status == JobStatus::Paused;
        let message = match reason {
            Some(reason) => format!("requeued by {actor}: {reason}"),
            None => format!("requeued by {actor}"),
        };
        let task = &mut self.state.tasks[index];
        let claimable_at = task.lease_expires_at.unwrap_or(self.now);
        // The attempt ran is given back: the next claim's attempt does not use one up.
        task.attempt_base += 1;
        task.status = TaskStatus::Ready;
        task.checking = false;
        task.held = paused && task.kind != TaskKind::Compensation;
        task.available_at = Some(claimable_at);
        task.lease_expires_at = None;
        task.wait = None;
        task.error = Some(TaskError {
            message: message.clone(),
            retryable: true,
            kind: ErrorKind::Operator,
        });
        // The lease token stays as the revoked lease until the next claim replaces it.
        let mut detail = who;
        detail["message"] = json!(message);
        detail["available_at"] = json!(claimable_at);
        self.save_task(index);
        self.record(EventKind::TaskRequeued, Some(index), detail);
        self.wake(index);
        Ok(())
    }

    /// The worker of a revoked lease was told to stop (its report is being refused): the task
    /// is claimable at once rather than when the revoked lease would have lapsed.
    pub(super) fn revocation_told(&mut self, id: &TaskId, lease_token: &str) {
        let Some(index) = self.state.position(id) else {
            return;
        };
        let now = self.now;
        let task = &mut self.state.tasks[index];
        if !super::is_revoked(task, lease_token) || task.available_at.is_none_or(|at| at <= now) {
            return;
        }
        task.available_at = Some(now);
        self.save_task(index);
        self.wake(index);
    }

    /// Fails a waiting, ready or running task for good with the operator's message; the job
    /// goes on as after any terminal failure (it compensates, or goes on past a
    /// `continue_on_failure` step). A running child is cancelled and undoes what it did.
    fn fail_task_by_hand(
        &mut self,
        index: usize,
        message: String,
        who: Value,
    ) -> Result<(), Rejection> {
        let job_status = self.state.job.status;
        if !matches!(
            job_status,
            JobStatus::Running | JobStatus::Paused | JobStatus::Compensating
        ) {
            return Err(not_applicable(format!(
                "job is {job_status}: only a task of a running, paused or compensating job can be failed"
            )));
        }
        let task = &self.state.tasks[index];
        if task.kind == TaskKind::FanOut {
            return Err(not_applicable(
                "a fan_out task cannot be failed: fail one of its items".to_owned(),
            ));
        }
        if task.status.is_terminal() {
            return Err(not_applicable(format!(
                "task is {}: only a waiting, ready or running task can be failed",
                task.status
            )));
        }
        let error = TaskError {
            message,
            retryable: false,
            kind: ErrorKind::Operator,
        };
        self.fail_terminally_noting(index, error, who);
        Ok(())
    }

    /// The forward tasks a pause holds: ready ones are not handed out, and waiting ones do
    /// not end (a due sleep, a callback timeout) until resume.
    fn forward_tasks_held_by_pause(&self) -> Vec<usize> {
        (0..self.state.tasks.len())
            .filter(|&i| {
                let task = &self.state.tasks[i];
                task.kind != TaskKind::Compensation
                    && (task.status == TaskStatus::Ready
                        || (task.status == TaskStatus::Running && task.wait.is_some()))
            })
            .collect()
    }

    fn require_finished_unsuccessfully(&self, action: &str) -> Result<(), Rejection> {
        let status = self.state.job.status;
        if status.can_retry() {
            Ok(())
        } else {
            Err(not_applicable(format!(
                "job is {status}: {action} applies to a failed, compensation_failed, timed_out or cancelled job"
            )))
        }
    }

    /// A new round may not start while a worker still holds a task of the job (possible after a
    /// cancel without compensation): its report would land in the new round.
    fn require_no_running_task(&self) -> Result<(), Rejection> {
        match self
            .state
            .tasks
            .iter()
            .find(|t| t.status == TaskStatus::Running)
        {
            Some(task) => Err(not_applicable(format!(
                "task {} ({}) is still running: wait until it reports or its lease lapses",
                task.id, task.step
            ))),
            None => Ok(()),
        }
    }

    /// Tasks whose compensation succeeded in the current round: their effect was undone.
    fn undone_tasks(&self) -> HashSet<TaskId> {
        self.state
            .tasks
            .iter()
            .filter(|t| {
                t.kind == TaskKind::Compensation
                    && t.status == TaskStatus::Succeeded
                    && t.round == self.state.job.round
            })
            .filter_map(|t| t.compensates.clone())
            .collect()
    }

    /// The step and every step that depends on it, directly or not.
    fn downstream_of(&self, step_index: usize) -> BTreeSet<String> {
        let steps = &self.workflow.steps;
        let mut found: BTreeSet<usize> = BTreeSet::from([step_index]);
        let mut changed = true;
        while changed {
            changed = false;
            for (index, step) in steps.iter().enumerate() {
                if !found.contains(&index) && step.depends_on.iter().any(|d| found.contains(d)) {
                    found.insert(index);
                    changed = true;
                }
            }
        }
        found.into_iter().map(|i| steps[i].id.clone()).collect()
    }

    /// Puts the job back to running in a new round with `reset` tasks waiting again.
    fn start_round(&mut self, reset: &[usize]) {
        self.start_round_from_scratch(reset, &BTreeSet::new());
    }

    /// Like `start_round`; fan-out steps named in `expand_again` drop their items and expand
    /// anew, other fan-outs keep their items and run the reset ones again.
    fn start_round_from_scratch(&mut self, reset: &[usize], expand_again: &BTreeSet<String>) {
        let job = &mut self.state.job;
        job.round += 1;
        job.status = JobStatus::Running;
        job.wind_down = None;
        job.compensation_planned = false;
        job.ended_at = None;
        job.output = None;
        job.failed_steps.clear();
        if let Some(timeout) = self.workflow.timeout {
            job.deadline_at = Some(self.now.saturating_add(timeout));
        }
        let round = job.round;
        self.save_job();
        // Fan-outs that keep their items: (step, the round of their current items).
        let resumed: Vec<(String, u32)> = reset
            .iter()
            .map(|&i| &self.state.tasks[i])
            .filter(|t| t.kind == TaskKind::FanOut && !expand_again.contains(&t.step))
            .map(|t| (t.step.clone(), t.round))
            .collect();
        for &index in reset {
            let task = &mut self.state.tasks[index];
            if task.kind == TaskKind::Item && expand_again.contains(&task.step) {
                continue;
            }
            task.status = TaskStatus::Waiting;
            task.lease_token = None;
            task.attempt_base = task.attempt;
            task.checking = false;
            task.output = None;
            task.error = None;
            task.progress = None;
            task.available_at = None;
            task.deadline_at = None;
            task.ended_at = None;
            task.completed_seq = None;
            task.held = false;
            task.wait = None;
            task.pending_outcome = None;
            task.round = round;
            if task.kind == TaskKind::Step {
                task.input = None;
            }
            self.save_task(index);
        }
        // A fan-out that keeps its items goes on running them: it and its current items join
        // the new round, so items that finished before count towards its output.
        for (step, items_round) in resumed {
            let expanded = self.state.tasks.iter().any(|t| {
                t.kind == TaskKind::Item
                    && t.step == step
                    && (t.round == items_round || t.round == round)
            });
            if !expanded {
                continue; // cancelled before it expanded: it expands when it becomes ready
            }
            for index in 0..self.state.tasks.len() {
                let task = &mut self.state.tasks[index];
                if task.step != step {
                    continue;
                }
                match task.kind {
                    TaskKind::FanOut => task.status = TaskStatus::Running,
                    TaskKind::Item if task.round == items_round || task.round == round => {
                        task.round = round;
                    }
                    _ => continue,
                }
                self.save_task(index);
            }
        }
    }

    fn skip_task(
        &mut self,
        index: usize,
        output: Value,
        who: Value,
        action: &str,
    ) -> Result<(), Rejection> {
        let task = &self.state.tasks[index];
        let (kind, status) = (task.kind, task.status);
        if matches!(kind, TaskKind::Compensation | TaskKind::FanOut) {
            return Err(not_applicable(format!(
                "a {kind} task cannot be skipped: skip a step or fan-out item"
            )));
        }
        let job_status = self.state.job.status;
        match job_status {
            JobStatus::Running | JobStatus::Paused => {
                if !matches!(status, TaskStatus::Waiting | TaskStatus::Ready)
                    && !self.waits_on_the_server(index)
                {
                    return Err(not_applicable(format!(
                        "task is {status}: in a {job_status} job only a waiting or ready task, or a sleep, signal or approval being waited for, can be skipped"
                    )));
                }
            }
            _ => {
                self.require_finished_unsuccessfully(action)?;
                self.require_no_running_task()?;
                if !matches!(status, TaskStatus::Failed | TaskStatus::Cancelled) {
                    return Err(not_applicable(format!(
                        "task is {status}: in a {job_status} job only a failed or cancelled task can be skipped"
                    )));
                }
                // Continue the job as a retry would, with this task resolved by hand.
                let undone = self.undone_tasks();
                let reset: Vec<usize> = (0..self.state.tasks.len())
                    .filter(|&i| {
                        let task = &self.state.tasks[i];
                        task.kind != TaskKind::Compensation
                            && (matches!(task.status, TaskStatus::Failed | TaskStatus::Cancelled)
                                || undone.contains(&task.id))
                    })
                    .collect();
                self.start_round(&reset);
            }
        }
        let mut detail = who;
        detail["output"] = output.clone();
        self.record(EventKind::TaskResolvedByOperator, Some(index), detail);
        self.succeed(index, output);
        Ok(())
    }
}
