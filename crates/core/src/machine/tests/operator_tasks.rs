//! An operator's requeue and fail of one task, in the state machine.

use serde_json::json;

use super::Sim;
use crate::model::{
    CallbackCall, ErrorKind, EventKind, Input, JobStatus, OperatorAction, Rejection, ReportedError,
    TaskKind, TaskStatus,
};
use crate::time::Duration;

const TWO_ATTEMPTS: &str = "steps:\n- {id: a, queue: q, command: c, timeout: 10s, retry: {max_attempts: 2, initial: 1s}}\n";

#[test]
fn a_requeued_task_waits_for_the_revoked_lease_and_its_attempt_is_given_back() {
    let mut sim = Sim::new(TWO_ATTEMPTS, json!({}));
    let (task, revoked) = sim.claim("a");
    sim.advance(Duration::from_secs(4));
    sim.operate(OperatorAction::Requeue { task: task.clone() })
        .unwrap();
    assert_eq!(sim.status("a"), TaskStatus::Ready);
    assert!(sim.event_kinds().contains(&EventKind::TaskRequeued));
    assert!(
        sim.ready().is_empty(),
        "not claimable while the revoked lease could still be running"
    );
    let heartbeat = sim.apply(Input::Heartbeat {
        task: task.clone(),
        lease_token: revoked.clone(),
        progress: None,
    });
    match heartbeat {
        Err(Rejection::LeaseRevoked(message)) => {
            assert!(message.contains("requeued by ops: test"), "{message}");
        }
        other => panic!("the old worker is told to stop, not {other:?}"),
    }
    sim.advance(Duration::from_secs(5));
    assert!(sim.ready().is_empty(), "the revoked lease ends at 10s");
    sim.advance(Duration::from_secs(1));
    let (_, token) = sim.claim("a");
    assert_eq!(sim.find("a", TaskKind::Step).attempt, 2);
    let late = sim.apply(Input::Complete {
        task: task.clone(),
        lease_token: revoked,
        output: json!({}),
        logs: None,
    });
    assert!(
        matches!(late, Err(Rejection::StaleLease { .. })),
        "the new attempt owns the task: {late:?}"
    );
    // The requeued attempt did not count: one failure still leaves a retry of two attempts.
    sim.apply(Input::Fail {
        task,
        lease_token: token,
        error: ReportedError {
            message: "broke".into(),
            retryable: true,
            retry_after: None,
        },
        logs: None,
    })
    .unwrap();
    assert_eq!(sim.status("a"), TaskStatus::Ready);
    sim.advance(Duration::from_secs(5));
    sim.fail("a", true);
    assert_eq!(sim.status("a"), TaskStatus::Failed, "two attempts counted");
}

#[test]
fn the_late_report_of_a_requeued_worker_is_refused_with_the_reason() {
    let mut sim = Sim::new(TWO_ATTEMPTS, json!({}));
    let (task, revoked) = sim.claim("a");
    sim.operate(OperatorAction::Requeue { task: task.clone() })
        .unwrap();
    let late = sim.apply(Input::Complete {
        task: task.clone(),
        lease_token: revoked,
        output: json!({}),
        logs: None,
    });
    assert!(matches!(late, Err(Rejection::LeaseRevoked(_))), "{late:?}");
    assert_eq!(sim.status("a"), TaskStatus::Ready);
    let callback = sim.apply(Input::Callback {
        task,
        attempt: 1,
        token_hash: "hash-1".into(),
        call: CallbackCall::Heartbeat,
        digest: String::new(),
    });
    assert!(
        matches!(callback, Err(Rejection::CallbackGone(_))),
        "the revoked attempt's callback token is gone: {callback:?}"
    );
}

#[test]
fn requeue_applies_only_to_a_task_a_worker_runs() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c}\n- {id: ok, approval: {}, depends_on: []}\n",
        json!({}),
    );
    let ready = sim.find("a", TaskKind::Step).id.clone();
    let refused = sim.operate(OperatorAction::Requeue { task: ready });
    assert!(
        matches!(&refused, Err(Rejection::NotApplicable(why)) if why.contains("task is ready")),
        "{refused:?}"
    );
    let approval = sim.find("ok", TaskKind::Step).id.clone();
    let refused = sim.operate(OperatorAction::Requeue { task: approval });
    assert!(
        matches!(&refused, Err(Rejection::NotApplicable(why)) if why.contains("approval")),
        "{refused:?}"
    );
    let unknown = sim.operate(OperatorAction::Requeue {
        task: crate::ids::TaskId::from_unique("nope"),
    });
    assert!(matches!(unknown, Err(Rejection::UnknownTask(_))));
}

#[test]
fn a_task_failed_by_hand_fails_for_good_and_the_job_compensates() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, compensate: {queue: q, command: undo}}\n- {id: b, queue: q, command: c, retry: {max_attempts: 5}}\n",
        json!({}),
    );
    sim.complete("a", json!({}));
    let (task, token) = sim.claim("b");
    sim.operate(OperatorAction::FailTask {
        task: task.clone(),
        message: "the disk is gone".into(),
    })
    .unwrap();
    let failed = sim.find("b", TaskKind::Step);
    assert_eq!(
        failed.status,
        TaskStatus::Failed,
        "no retry though 4 attempts are left"
    );
    let error = failed.error.clone().unwrap();
    assert_eq!(error.kind, ErrorKind::Operator);
    assert_eq!(error.message, "the disk is gone");
    let event = sim
        .events
        .iter()
        .find(|e| e.kind == EventKind::TaskFailed)
        .unwrap();
    assert_eq!(event.detail["actor"], "ops");
    assert_eq!(event.detail["kind"], "operator");
    let heartbeat = sim.apply(Input::Heartbeat {
        task: task.clone(),
        lease_token: token,
        progress: None,
    });
    assert!(matches!(heartbeat, Err(Rejection::StaleLease { .. })));
    assert_eq!(sim.state.job.status, JobStatus::Compensating);
    sim.complete("a", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Failed);
    let again = sim.operate(OperatorAction::FailTask {
        task,
        message: "again".into(),
    });
    assert!(
        matches!(again, Err(Rejection::NotApplicable(_))),
        "{again:?}"
    );
}

#[test]
fn failing_a_waiting_approval_by_hand_ends_the_wait() {
    let mut sim = Sim::new("steps:\n- {id: ok, approval: {}}\n", json!({}));
    let task = sim.find("ok", TaskKind::Step).id.clone();
    sim.operate(OperatorAction::FailTask {
        task: task.clone(),
        message: "nobody will approve".into(),
    })
    .unwrap();
    assert_eq!(sim.status("ok"), TaskStatus::Failed);
    assert!(sim.find("ok", TaskKind::Step).wait.is_none());
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn a_task_awaiting_its_callback_is_requeued_claimable_at_once_and_its_token_is_gone() {
    let mut sim = Sim::new(TWO_ATTEMPTS, json!({}));
    let (task, token) = sim.claim("a");
    sim.apply(Input::AwaitCallback {
        task: task.clone(),
        lease_token: token,
        timeout: None,
    })
    .unwrap();
    let grant = sim.state.task(&task).unwrap().callback.clone().unwrap();
    sim.operate(OperatorAction::Requeue { task: task.clone() })
        .unwrap();
    let requeued = sim.find("a", TaskKind::Step);
    assert_eq!(requeued.status, TaskStatus::Ready);
    assert_eq!(requeued.wait, None);
    assert_eq!(
        sim.ready(),
        vec![task.clone()],
        "no worker holds it: claimable at once"
    );
    let callback = sim.apply(Input::Callback {
        task: task.clone(),
        attempt: grant.attempt,
        token_hash: grant.hash,
        call: CallbackCall::Complete { output: json!({}) },
        digest: "d".into(),
    });
    assert!(
        matches!(callback, Err(Rejection::CallbackGone(_))),
        "{callback:?}"
    );
    let (again, _) = sim.claim("a");
    assert_eq!(again, task);
    assert_eq!(
        sim.find("a", TaskKind::Step).attempt,
        2,
        "a new attempt, not counted"
    );
}
