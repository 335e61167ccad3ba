//! Sub-workflow steps in the state machine: starting children, their ends, retries, pause and
//! cancel passed down, nested rollback, and the child's side of a rollback.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::Sim;
use crate::definition::Workflow;
use crate::ids::{JobId, SequentialIds};
use crate::limits::Limits;
use crate::machine::{CreateError, Ctx, NewJob, create_job};
use crate::model::{
    Action, ChildCommand, ChildStart, ErrorKind, EventKind, Input, JobLock, JobStatus,
    OperatorAction, Rejection, TaskKind, TaskStatus, WaitFor, WindDown,
};
use crate::time::{Duration, Timestamp};

/// A parent job whose `migrate` workflow is at version 3.
fn parent(yaml: &str, params: Value) -> Sim {
    let mut new = NewJob::new(JobId::from_unique("1"), "default".into(), 1, params);
    new.child_versions = BTreeMap::from([("migrate".to_owned(), 3)]);
    Sim::created(yaml, new, Limits::default())
}

impl Sim {
    /// The children started so far, oldest first.
    fn started(&self) -> Vec<ChildStart> {
        self.to_children
            .iter()
            .filter_map(|action| match action {
                Action::StartChild(start) => Some(start.clone()),
                _ => None,
            })
            .collect()
    }

    fn commands(&self) -> Vec<(JobId, ChildCommand)> {
        self.to_children
            .iter()
            .filter_map(|action| match action {
                Action::ToChild { child, command } => Some((child.clone(), *command)),
                _ => None,
            })
            .collect()
    }

    fn child_ends(
        &mut self,
        child: &JobId,
        status: JobStatus,
        output: Value,
    ) -> Result<(), Rejection> {
        self.apply(Input::ChildEnded {
            child: child.clone(),
            status,
            output: Some(output),
            error: (status != JobStatus::Succeeded).then(|| "it broke".to_owned()),
        })
    }
}

const ONE_CHILD: &str = "steps:\n- {id: per_shard, workflow: migrate, input: {shard: '${{ params.shard }}'}, retry: {max_attempts: 2, initial: 1s}}\n- {id: after, queue: q, command: c, input: '${{ steps.per_shard.output }}'}\n";

#[test]
fn a_workflow_step_starts_a_child_and_takes_its_output() {
    let mut sim = parent(ONE_CHILD, json!({"shard": 7}));
    let started = sim.started();
    assert_eq!(started.len(), 1);
    let start = &started[0];
    assert_eq!(start.workflow, "migrate");
    assert_eq!(start.version, 3, "the latest when the parent was created");
    assert_eq!(start.params, json!({"shard": 7}));
    assert_eq!(start.parent.attempt, 1);
    let task = sim.find("per_shard", TaskKind::Step);
    assert_eq!(task.status, TaskStatus::Running);
    assert!(task.lease_token.is_none() && task.queue.is_empty());
    assert_eq!(
        task.wait.as_ref().unwrap().on,
        WaitFor::Child {
            job: start.child.clone()
        }
    );
    sim.child_ends(&start.child, JobStatus::Succeeded, json!({"rows": 10}))
        .unwrap();
    assert_eq!(
        sim.find("after", TaskKind::Step).input,
        Some(json!({"rows": 10}))
    );
    assert!(
        sim.child_ends(&start.child, JobStatus::Succeeded, json!({}))
            .is_err(),
        "a second end of the same child changes nothing"
    );
    sim.complete("after", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
}

#[test]
fn a_failed_child_is_retried_with_a_new_child_after_the_backoff_then_fails_the_step() {
    let mut sim = parent(ONE_CHILD, json!({"shard": 1}));
    let first = sim.started()[0].child.clone();
    sim.child_ends(&first, JobStatus::Failed, Value::Null)
        .unwrap();
    let task = sim.find("per_shard", TaskKind::Step);
    assert_eq!(task.status, TaskStatus::Running, "between children");
    assert!(matches!(
        task.wait.as_ref().unwrap().on,
        WaitFor::ChildRetry { .. }
    ));
    assert_eq!(sim.started().len(), 1, "not before the backoff");
    sim.advance(Duration::from_secs(2));
    let started = sim.started();
    assert_eq!(started.len(), 2);
    assert_ne!(started[1].child, first);
    assert_eq!(started[1].parent.attempt, 2);
    sim.child_ends(&started[1].child, JobStatus::TimedOut, Value::Null)
        .unwrap();
    let task = sim.find("per_shard", TaskKind::Step);
    assert_eq!(task.status, TaskStatus::Failed);
    let error = task.error.clone().unwrap();
    assert_eq!(error.kind, ErrorKind::Child);
    assert!(
        error.message.contains("ended timed_out: it broke"),
        "{}",
        error.message
    );
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn a_child_cancelled_by_an_operator_or_failing_its_compensation_fails_the_step_for_good() {
    for status in [JobStatus::Cancelled, JobStatus::CompensationFailed] {
        let mut sim = parent(ONE_CHILD, json!({}));
        let child = sim.started()[0].child.clone();
        sim.child_ends(&child, status, Value::Null).unwrap();
        assert_eq!(sim.status("per_shard"), TaskStatus::Failed, "{status}");
        assert_eq!(sim.started().len(), 1, "no retry after {status}");
    }
}

#[test]
fn pause_and_resume_reach_the_children_and_an_end_while_paused_counts_at_resume() {
    let mut sim = parent(ONE_CHILD, json!({}));
    let child = sim.started()[0].child.clone();
    sim.operate(OperatorAction::Pause).unwrap();
    assert_eq!(sim.commands(), [(child.clone(), ChildCommand::Pause)]);
    sim.child_ends(&child, JobStatus::Succeeded, json!({"ok": true}))
        .unwrap();
    assert_eq!(
        sim.status("per_shard"),
        TaskStatus::Running,
        "held while paused"
    );
    sim.operate(OperatorAction::Resume).unwrap();
    assert_eq!(sim.commands()[1], (child.clone(), ChildCommand::Resume));
    assert_eq!(sim.status("per_shard"), TaskStatus::Succeeded);
    assert_eq!(sim.status("after"), TaskStatus::Ready);
}

#[test]
fn a_parent_winding_down_cancels_its_children_with_compensation_and_waits_for_them() {
    let mut sim = parent(
        "steps:\n- {id: per_shard, workflow: migrate}\n- {id: other, queue: q, command: c, depends_on: []}\n",
        json!({}),
    );
    let child = sim.started()[0].child.clone();
    sim.fail("other", false);
    assert_eq!(sim.state.job.status, JobStatus::Compensating);
    assert_eq!(
        sim.commands(),
        [(child.clone(), ChildCommand::Cancel { compensate: true })]
    );
    assert_eq!(
        sim.status("per_shard"),
        TaskStatus::Running,
        "waits for the child's rollback"
    );
    sim.child_ends(&child, JobStatus::Cancelled, Value::Null)
        .unwrap();
    assert_eq!(sim.status("per_shard"), TaskStatus::Cancelled);
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn a_cancel_without_compensation_cancels_children_at_once() {
    let mut sim = parent(ONE_CHILD, json!({}));
    let child = sim.started()[0].child.clone();
    sim.operate(OperatorAction::Cancel { compensate: false })
        .unwrap();
    assert_eq!(
        sim.commands(),
        [(child.clone(), ChildCommand::Cancel { compensate: false })]
    );
    assert_eq!(sim.status("per_shard"), TaskStatus::Cancelled);
    assert_eq!(sim.state.job.status, JobStatus::Cancelled);
    assert!(
        sim.child_ends(&child, JobStatus::Cancelled, Value::Null)
            .is_err()
    );
}

#[test]
fn a_step_timeout_cancels_the_child_and_the_parent_compensates_once_the_child_has() {
    let mut sim = parent(
        "steps:\n- {id: prepare, queue: q, command: c, compensate: {queue: q, command: undo}}\n- {id: per_shard, workflow: migrate, step_timeout: 1m}\n",
        json!({}),
    );
    sim.complete("prepare", json!({}));
    let child = sim.started()[0].child.clone();
    sim.advance(Duration::from_secs(61));
    assert_eq!(
        sim.commands(),
        [(child.clone(), ChildCommand::Cancel { compensate: true })]
    );
    assert_eq!(sim.state.job.status, JobStatus::Compensating);
    assert_eq!(
        sim.status("per_shard"),
        TaskStatus::Running,
        "the step waits for its child to undo its work"
    );
    assert!(sim.ready().is_empty(), "no compensation before the child's");
    sim.advance(Duration::from_secs(60));
    assert_eq!(sim.commands().len(), 1, "the timeout fires once");
    sim.child_ends(&child, JobStatus::Cancelled, Value::Null)
        .unwrap();
    let task = sim.find("per_shard", TaskKind::Step);
    assert_eq!(task.status, TaskStatus::Failed);
    assert_eq!(task.error.as_ref().unwrap().kind, ErrorKind::StepTimeout);
    sim.complete("prepare", json!({}));
    assert_eq!(sim.compensation_order(), ["prepare"]);
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn a_continued_sub_workflow_step_that_times_out_lets_the_job_go_on_once_its_child_ended() {
    let mut sim = parent(
        "steps:\n- {id: per_shard, workflow: migrate, step_timeout: 1m, continue_on_failure: true}\n- {id: after, queue: q, command: c}\n",
        json!({}),
    );
    let child = sim.started()[0].child.clone();
    sim.advance(Duration::from_secs(61));
    assert_eq!(sim.state.job.status, JobStatus::Running);
    sim.child_ends(&child, JobStatus::Cancelled, Value::Null)
        .unwrap();
    assert_eq!(sim.status("per_shard"), TaskStatus::Failed);
    sim.complete("after", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
    assert_eq!(sim.state.job.failed_steps, ["per_shard"]);
}

#[test]
fn a_parent_rolls_back_succeeded_children_in_reverse_order_among_its_own_compensations() {
    let mut sim = parent(
        "steps:\n- {id: prepare, queue: q, command: c, compensate: {queue: q, command: unprepare}}\n- {id: per_shard, workflow: migrate, for_each: '${{ params.shards }}', concurrency: 1}\n- {id: finish, queue: q, command: c}\n",
        json!({"shards": [1, 2]}),
    );
    sim.complete("prepare", json!({}));
    let first = sim.started()[0].child.clone();
    sim.child_ends(&first, JobStatus::Succeeded, json!("one"))
        .unwrap();
    let second = sim.started()[1].child.clone();
    sim.child_ends(&second, JobStatus::Succeeded, json!("two"))
        .unwrap();
    assert_eq!(
        sim.find("per_shard", TaskKind::FanOut).output,
        Some(json!(["one", "two"]))
    );
    sim.fail("finish", false);
    // The last child to succeed is rolled back first, and the parent waits for it.
    assert_eq!(sim.commands(), [(second.clone(), ChildCommand::RollBack)]);
    let rollback = sim
        .state
        .tasks
        .iter()
        .find(|t| t.kind == TaskKind::Compensation && t.status == TaskStatus::Running)
        .unwrap();
    assert_eq!(rollback.child.as_deref(), Some(&second));
    sim.child_ends(&second, JobStatus::Cancelled, Value::Null)
        .unwrap();
    assert_eq!(sim.commands()[1], (first.clone(), ChildCommand::RollBack));
    sim.child_ends(&first, JobStatus::Cancelled, Value::Null)
        .unwrap();
    // Then the parent's own compensation.
    sim.complete("prepare", json!({}));
    assert_eq!(sim.compensation_order(), ["prepare"]);
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn a_child_whose_rollback_fails_ends_the_parent_compensation_failed() {
    let mut sim = parent(
        "steps:\n- {id: per_shard, workflow: migrate}\n- {id: finish, queue: q, command: c}\n",
        json!({}),
    );
    let child = sim.started()[0].child.clone();
    sim.child_ends(&child, JobStatus::Succeeded, Value::Null)
        .unwrap();
    sim.fail("finish", false);
    sim.child_ends(&child, JobStatus::CompensationFailed, Value::Null)
        .unwrap();
    assert_eq!(sim.state.job.status, JobStatus::CompensationFailed);
}

#[test]
fn a_workflow_step_with_its_own_compensate_runs_it_instead_of_rolling_back() {
    let mut sim = parent(
        "steps:\n- {id: per_shard, workflow: migrate, compensate: {queue: q, command: undo}}\n- {id: finish, queue: q, command: c}\n",
        json!({}),
    );
    let child = sim.started()[0].child.clone();
    sim.child_ends(&child, JobStatus::Succeeded, Value::Null)
        .unwrap();
    sim.fail("finish", false);
    assert!(sim.commands().is_empty(), "no rollback of the child");
    sim.complete("per_shard", json!({}));
    assert_eq!(sim.compensation_order(), ["per_shard"]);
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn a_succeeded_child_rolled_back_runs_its_compensations_then_ends_cancelled() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, compensate: {queue: q, command: undo_a}}\n- {id: b, queue: q, command: c, compensate: {queue: q, command: undo_b}}\n",
        json!({}),
    );
    sim.complete("a", json!({}));
    assert!(
        sim.apply(Input::RollBack {
            by: JobId::from_unique("p")
        })
        .is_err(),
        "not succeeded yet"
    );
    sim.complete("b", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
    sim.apply(Input::RollBack {
        by: JobId::from_unique("p"),
    })
    .unwrap();
    assert_eq!(sim.state.job.status, JobStatus::Compensating);
    sim.complete("b", json!({}));
    sim.complete("a", json!({}));
    assert_eq!(sim.compensation_order(), ["b", "a"]);
    assert_eq!(sim.state.job.status, JobStatus::Cancelled);
    assert_eq!(
        sim.state.job.wind_down,
        Some(WindDown::RolledBack {
            by: JobId::from_unique("p")
        })
    );
}

#[test]
fn a_child_beyond_the_depth_limit_fails_the_step_naming_the_setting() {
    let mut new = NewJob::new(JobId::from_unique("1"), "default".into(), 1, json!({}));
    new.child_versions = BTreeMap::from([("migrate".to_owned(), 1)]);
    new.depth = 10;
    let sim = Sim::created(
        "steps:\n- {id: s, workflow: migrate}\n",
        new,
        Limits::default(),
    );
    assert!(sim.started().is_empty());
    let error = sim.find("s", TaskKind::Step).error.clone().unwrap();
    assert!(
        error.message.contains("--max-workflow-depth"),
        "{}",
        error.message
    );
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn a_child_that_could_not_start_fails_the_step_for_good() {
    let mut sim = parent(ONE_CHILD, json!({}));
    let child = sim.started()[0].child.clone();
    sim.apply(Input::ChildNotStarted {
        child,
        message: "workflow migrate version 3 is gone".into(),
    })
    .unwrap();
    assert_eq!(sim.status("per_shard"), TaskStatus::Failed);
    assert_eq!(sim.started().len(), 1, "not retried");
}

#[test]
fn a_pinned_version_wins_and_a_lock_an_ancestor_holds_takes_no_slot() {
    let sim = parent(
        "steps:\n- {id: s, workflow: migrate, version: 1}\n",
        json!({}),
    );
    assert_eq!(sim.started()[0].version, 1);

    let mut new = NewJob::new(
        JobId::from_unique("2"),
        "default".into(),
        1,
        json!({"db": "x"}),
    );
    new.held_by_ancestors = vec!["db-x".to_owned()];
    let child = Sim::created(
        "lock: {key: 'db-${{ params.db }}'}\nsteps:\n- {id: s, queue: q, command: c}\n",
        new,
        Limits::default(),
    );
    assert_eq!(child.state.job.status, JobStatus::Running);
    assert_eq!(child.state.job.lock, None);
    let created = child
        .events
        .iter()
        .find(|e| e.kind == EventKind::JobCreated)
        .unwrap();
    assert_eq!(created.detail["lock_held_by_ancestor"], "db-x");
}

#[test]
fn failing_a_sub_workflow_step_by_hand_cancels_its_child_with_compensation() {
    let mut sim = parent(
        "steps:\n- {id: prepare, queue: q, command: c, compensate: {queue: q, command: undo}}\n- {id: per_shard, workflow: migrate, retry: {max_attempts: 3}}\n",
        json!({}),
    );
    sim.complete("prepare", json!({}));
    let child = sim.started()[0].child.clone();
    let task = sim.find("per_shard", TaskKind::Step).id.clone();
    sim.operate(OperatorAction::FailTask {
        task,
        message: "shard is gone".into(),
    })
    .unwrap();
    assert_eq!(
        sim.commands(),
        [(child, ChildCommand::Cancel { compensate: true })]
    );
    let failed = sim.find("per_shard", TaskKind::Step);
    assert_eq!(failed.status, TaskStatus::Failed);
    assert_eq!(failed.error.as_ref().unwrap().kind, ErrorKind::Operator);
    assert_eq!(sim.state.job.status, JobStatus::Compensating);
    assert_eq!(
        sim.find("prepare", TaskKind::Compensation).status,
        TaskStatus::Ready
    );
}

#[test]
fn a_sub_workflow_steps_lock_goes_with_its_child_and_a_child_holds_one_lock() {
    let parent = parent(
        "steps:\n- {id: run, workflow: migrate, lock: {key: 'db-${{ params.db }}', slots: 3}}\n",
        json!({"db": "main"}),
    );
    let lock = parent.started()[0].lock.clone().unwrap();
    assert_eq!((lock.key.as_str(), lock.slots), ("db-main", 3));

    let started = |workflow_lock: &str, step_lock: &JobLock| {
        let mut new = NewJob::new(JobId::from_unique("c"), "default".into(), 1, json!({}));
        new.step_lock = Some(step_lock.clone());
        let yaml = format!("{workflow_lock}steps:\n- {{id: a, queue: q, command: c}}\n");
        let workflow = Workflow::from_document("child", &yaml).unwrap();
        let mut ids = SequentialIds::default();
        let mut ctx = Ctx {
            now: Timestamp(0),
            ids: &mut ids,
            limits: Limits::default(),
        };
        create_job(&workflow, new, &mut ctx).map(|(state, _)| state.job)
    };
    let child = started("", &lock).unwrap();
    assert_eq!(
        child.status,
        JobStatus::Queued,
        "it waits for the step's slot"
    );
    assert_eq!(child.lock, Some(lock.clone()));
    let same_key = started("lock: {key: db-main}\n", &lock).unwrap();
    assert_eq!(same_key.lock, Some(lock.clone()));
    let CreateError::LockKey(message) = started("lock: {key: other}\n", &lock).unwrap_err();
    assert!(message.contains("a job holds one lock"), "{message}");
}
