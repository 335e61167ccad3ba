//! An operator's requeue and fail of one task through the engine, on both backends: the revoked
//! lease is fenced, the requeued task is claimed again only once its old worker has been told
//! (a refused report, committed) or that lease would have lapsed, and a task failed by hand
//! answers its callback token 410.

use serde_json::json;
use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{
    CallbackCall, ErrorKind, Input, JobStatus, OperatorAction, OperatorCommand, TaskStatus,
};
use starbridge_core::time::Duration;

use super::{Fixture, Store, claim_one, complete, definition, submit};
use crate::{Error, TaskScope};

const ONE_STEP: &str =
    "steps:\n- {id: a, queue: q, command: c, timeout: 10s, retry: {max_attempts: 1}}\n";

async fn act(store: &Store, job: &JobId, action: OperatorAction) -> crate::Result<JobStatus> {
    let command = OperatorCommand {
        actor: "ops".into(),
        reason: Some("worker host is draining".into()),
        action,
    };
    let state = store.operate("default", job, command).await?;
    Ok(state.job.status)
}

async fn a_requeued_task_runs_again_once_its_old_worker_was_told(f: Fixture) {
    f.store
        .apply_workflow("default", "wf", definition(ONE_STEP))
        .await
        .unwrap();
    let job = submit(&f.store, "wf", json!({})).await.state.job.id;
    let first = claim_one(&f.store).await;
    let task = first.task.id.clone();
    f.clock.advance(Duration::from_secs(3));
    act(
        &f.store,
        &job,
        OperatorAction::Requeue { task: task.clone() },
    )
    .await
    .unwrap();
    let none = f
        .store
        .claim("default", vec!["q".into()], "w2", 1)
        .await
        .unwrap();
    assert!(none.is_empty(), "the revoked lease could still be running");
    let heartbeat = f
        .store
        .report(
            task.clone(),
            Input::Heartbeat {
                task: task.clone(),
                lease_token: first.task.lease_token.clone().unwrap(),
                progress: None,
            },
            TaskScope::default(),
        )
        .await;
    match heartbeat {
        Err(Error::Conflict(why)) => assert!(why.contains("worker host is draining"), "{why}"),
        other => panic!("the old worker is told to stop, not {other:?}"),
    }
    // Told, the old worker stops: the task is claimable at once, 7 s before its old lease ends.
    let second = claim_one(&f.store).await;
    assert_eq!(second.task.attempt, 2);
    let late = complete(&f.store, &first, json!({"from": "old"})).await;
    assert!(matches!(late, Err(Error::Conflict(_))), "{late:?}");
    complete(&f.store, &second, json!({"from": "new"}))
        .await
        .unwrap();
    let state = f.store.job("default", &job).await.unwrap().unwrap();
    assert_eq!(state.job.status, JobStatus::Succeeded);
}

async fn a_requeued_task_runs_again_once_its_revoked_lease_would_have_lapsed(f: Fixture) {
    f.store
        .apply_workflow("default", "wf", definition(ONE_STEP))
        .await
        .unwrap();
    let job = submit(&f.store, "wf", json!({})).await.state.job.id;
    let first = claim_one(&f.store).await;
    let task = first.task.id.clone();
    f.clock.advance(Duration::from_secs(3));
    act(
        &f.store,
        &job,
        OperatorAction::Requeue { task: task.clone() },
    )
    .await
    .unwrap();
    let none = f
        .store
        .claim("default", vec!["q".into()], "w2", 1)
        .await
        .unwrap();
    assert!(none.is_empty(), "the revoked lease could still be running");
    // The old worker never reports again (gone, or partitioned away).
    f.clock.advance(Duration::from_secs(6));
    let none = f
        .store
        .claim("default", vec!["q".into()], "w2", 1)
        .await
        .unwrap();
    assert!(none.is_empty(), "the revoked lease still runs for a second");
    f.clock.advance(Duration::from_secs(1));
    let second = claim_one(&f.store).await;
    assert_eq!(second.task.attempt, 2);
    let late = complete(&f.store, &first, json!({"from": "old"})).await;
    assert!(matches!(late, Err(Error::Conflict(_))), "{late:?}");
    complete(&f.store, &second, json!({"from": "new"}))
        .await
        .unwrap();
    let state = f.store.job("default", &job).await.unwrap().unwrap();
    assert_eq!(
        state.job.status,
        JobStatus::Succeeded,
        "max_attempts 1 was enough"
    );
    assert_eq!(state.tasks[0].output, Some(json!({"from": "new"})));

    let unknown = act(
        &f.store,
        &job,
        OperatorAction::Requeue {
            task: TaskId::from_unique("nope"),
        },
    )
    .await;
    assert!(matches!(unknown, Err(Error::NotFound(_))), "{unknown:?}");
    let ended = act(&f.store, &job, OperatorAction::Requeue { task }).await;
    assert!(matches!(ended, Err(Error::Conflict(_))), "{ended:?}");
}

async fn a_task_failed_by_hand_answers_its_callback_token_410(f: Fixture) {
    f.store
        .apply_workflow(
            "default",
            "wf",
            definition("steps:\n- {id: ext, queue: q, command: c, retry: {max_attempts: 3}}\n"),
        )
        .await
        .unwrap();
    let job = submit(&f.store, "wf", json!({})).await.state.job.id;
    let claimed = claim_one(&f.store).await;
    let task = claimed.task.id.clone();
    f.store
        .report(
            task.clone(),
            Input::AwaitCallback {
                task: task.clone(),
                lease_token: claimed.task.lease_token.clone().unwrap(),
                timeout: Some(Duration::from_secs(60)),
            },
            TaskScope::default(),
        )
        .await
        .unwrap();
    let status = act(
        &f.store,
        &job,
        OperatorAction::FailTask {
            task: task.clone(),
            message: "the provider lost it".into(),
        },
    )
    .await
    .unwrap();
    assert_eq!(status, JobStatus::Failed);
    let state = f.store.job("default", &job).await.unwrap().unwrap();
    assert_eq!(state.tasks[0].status, TaskStatus::Failed);
    assert_eq!(
        state.tasks[0].error.as_ref().unwrap().kind,
        ErrorKind::Operator
    );
    let gone = f
        .store
        .callback(
            &claimed.callback_token,
            CallbackCall::Complete { output: json!({}) },
        )
        .await;
    assert!(matches!(gone, Err(Error::Gone(_))), "{gone:?}");
}

on_both_backends!(
    a_requeued_task_runs_again_once_its_old_worker_was_told,
    a_requeued_task_runs_again_once_its_revoked_lease_would_have_lapsed,
    a_task_failed_by_hand_answers_its_callback_token_410,
);
