//! Waiting steps and callbacks through the engine, on both backends: timers find due sleeps,
//! signals and decisions are kept in the store, callback tokens finish attempts.

use serde_json::{Value, json};
use starbridge_core::model::{CallbackCall, EventKind, Input, JobStatus, TaskStatus, WaitFor};
use starbridge_core::time::Duration;

use super::{Fixture, Store, claim_one, definition, submit};
use crate::{Clock, Decision, Error, SendSignal, TaskScope};

async fn apply(store: &Store, yaml: &str) {
    store
        .apply_workflow("default", "wf", definition(yaml))
        .await
        .unwrap();
}

fn signal(name: &str, payload: Value, id: Option<&str>) -> SendSignal {
    SendSignal {
        name: name.into(),
        payload,
        id: id.map(str::to_owned),
        sender: "tester".into(),
    }
}

async fn task_status(store: &Store, job: &starbridge_core::ids::JobId, step: &str) -> TaskStatus {
    let state = store.job("default", job).await.unwrap().unwrap();
    state.tasks.iter().find(|t| t.step == step).unwrap().status
}

async fn a_sleep_is_a_timer_the_tick_wakes(f: Fixture) {
    apply(
        &f.store,
        "steps:\n- {id: nap, sleep: 10m}\n- {id: b, queue: q, command: c}\n",
    )
    .await;
    let job = submit(&f.store, "wf", json!({})).await.state.job.id;
    let due = f.clock.now().saturating_add(Duration::from_secs(600));
    assert_eq!(f.store.next_timer().await.unwrap(), Some(due));
    f.clock.advance(Duration::from_secs(599));
    f.store.tick().await.unwrap();
    assert_eq!(
        task_status(&f.store, &job, "nap").await,
        TaskStatus::Running
    );
    f.clock.advance(Duration::from_secs(1));
    assert_eq!(f.store.tick().await.unwrap(), 1);
    assert_eq!(
        task_status(&f.store, &job, "nap").await,
        TaskStatus::Succeeded
    );
    assert_eq!(task_status(&f.store, &job, "b").await, TaskStatus::Ready);
    assert_eq!(f.store.next_timer().await.unwrap(), None);
}

async fn a_paused_job_sets_no_timer_for_its_sleeps(f: Fixture) {
    apply(&f.store, "steps:\n- {id: nap, sleep: 1m}\n").await;
    let job = submit(&f.store, "wf", json!({})).await.state.job.id;
    let pause = starbridge_core::model::OperatorCommand {
        actor: "ops".into(),
        reason: None,
        action: starbridge_core::model::OperatorAction::Pause,
    };
    f.store
        .operate("default", &job, pause.clone())
        .await
        .unwrap();
    assert_eq!(
        f.store.next_timer().await.unwrap(),
        None,
        "held: no timer to spin on"
    );
    f.clock.advance(Duration::from_secs(120));
    let resume = starbridge_core::model::OperatorCommand {
        action: starbridge_core::model::OperatorAction::Resume,
        ..pause
    };
    let state = f.store.operate("default", &job, resume).await.unwrap();
    assert_eq!(
        state.job.status,
        JobStatus::Succeeded,
        "the due sleep ends at resume"
    );
}

async fn signals_are_kept_in_the_store_deduplicated_and_taken_in_order(f: Fixture) {
    apply(
        &f.store,
        "steps:\n- {id: a, queue: q, command: c}\n- {id: paid, signal: payment}\n",
    )
    .await;
    let job = submit(&f.store, "wf", json!({})).await.state.job.id;
    let first = f
        .store
        .signal(
            "default",
            &job,
            signal("payment", json!({"n": 1}), Some("p-1")),
        )
        .await
        .unwrap();
    assert!(!first.duplicate && !first.taken);
    let repeat = f
        .store
        .signal(
            "default",
            &job,
            signal("payment", json!({"n": 99}), Some("p-1")),
        )
        .await
        .unwrap();
    assert!(repeat.duplicate);
    let unknown = f
        .store
        .signal("default", &job, signal("refund", json!(1), None))
        .await;
    assert!(
        matches!(unknown, Err(Error::Invalid(ref p)) if p[0].field == "name"),
        "{unknown:?}"
    );
    let elsewhere = f
        .store
        .signal("other", &job, signal("payment", json!(1), None))
        .await;
    assert!(matches!(elsewhere, Err(Error::NotFound(_))));

    // Reopened, the job still holds its signal; the step takes it when it starts waiting.
    let store = Store::open_with_clock(&f.url, f.clock.clone()).unwrap();
    let claimed = claim_one(&store).await;
    super::complete(&store, &claimed, json!({})).await.unwrap();
    let state = store.job("default", &job).await.unwrap().unwrap();
    let paid = state.tasks.iter().find(|t| t.step == "paid").unwrap();
    assert_eq!(paid.output, Some(json!({"n": 1})));
    assert_eq!(state.job.status, JobStatus::Succeeded);
    let events = store
        .events("default", &job, 0, 100)
        .await
        .unwrap()
        .unwrap();
    let received: Vec<_> = events
        .iter()
        .filter(|e| e.event.kind == EventKind::SignalReceived)
        .map(|e| e.event.detail["sender"].clone())
        .collect();
    assert_eq!(received, [json!("tester")], "the repeat left no trace");
}

async fn an_approval_is_listed_until_decided(f: Fixture) {
    apply(
        &f.store,
        "steps:\n- id: ok\n  approval: {prompt: 'Ship ${{ params.v }}?'}\n",
    )
    .await;
    let job = submit(&f.store, "wf", json!({"v": "1.2"}))
        .await
        .state
        .job
        .id;
    let pending = f.store.pending_approvals("default", 10).await.unwrap();
    assert_eq!(pending.len(), 1);
    let (task, workflow) = &pending[0];
    assert_eq!(workflow, "wf");
    assert!(matches!(
        task.wait.as_ref().map(|w| &w.on),
        Some(WaitFor::Approval { prompt }) if prompt == "Ship 1.2?"
    ));
    assert!(
        f.store
            .pending_approvals("other", 10)
            .await
            .unwrap()
            .is_empty()
    );
    let decision = Decision {
        approve: true,
        by: "alice".into(),
        comment: None,
    };
    let state = f
        .store
        .decide("default", &job, &task.id, decision.clone())
        .await
        .unwrap();
    assert_eq!(state.job.status, JobStatus::Succeeded);
    assert!(
        f.store
            .pending_approvals("default", 10)
            .await
            .unwrap()
            .is_empty()
    );
    let again = f.store.decide("default", &job, &task.id, decision).await;
    assert!(matches!(again, Err(Error::Conflict(_))), "{again:?}");
}

async fn a_callback_token_finishes_the_attempt_once(f: Fixture) {
    apply(&f.store, "steps:\n- {id: ext, queue: q, command: c}\n").await;
    let job = submit(&f.store, "wf", json!({})).await.state.job.id;
    let claimed = claim_one(&f.store).await;
    let token = claimed.callback_token.clone();
    assert!(token.starts_with("sbc_"));
    let stored = f.store.job("default", &job).await.unwrap().unwrap();
    let grant = stored.tasks[0].callback.clone().unwrap();
    assert!(!token.contains(&grant.hash), "only the hash is kept");
    assert_eq!(grant.hash.len(), 32, "128 bits of the digest are kept");
    let awaited = f
        .store
        .report(
            claimed.task.id.clone(),
            Input::AwaitCallback {
                task: claimed.task.id.clone(),
                lease_token: claimed.task.lease_token.clone().unwrap(),
                timeout: Some(Duration::from_secs(60)),
            },
            TaskScope::default(),
        )
        .await
        .unwrap();
    assert_eq!(awaited.task.lease_token, None);
    assert_eq!(
        task_status(&f.store, &job, "ext").await,
        TaskStatus::Running
    );

    let never = format!("sbc_{}_1_{}", claimed.task.id, "0".repeat(64));
    let unknown = f.store.callback(&never, CallbackCall::Heartbeat).await;
    assert!(matches!(unknown, Err(Error::NotFound(_))), "{unknown:?}");
    let malformed = f
        .store
        .callback("sbc_nonsense", CallbackCall::Heartbeat)
        .await;
    assert!(matches!(malformed, Err(Error::NotFound(_))));

    let complete = || CallbackCall::Complete {
        output: json!({"done": true}),
    };
    let accepted = f.store.callback(&token, complete()).await.unwrap();
    assert_eq!(
        (accepted.job.clone(), accepted.task.clone()),
        (job.clone(), claimed.task.id.clone())
    );
    let state = f.store.job("default", &job).await.unwrap().unwrap();
    assert_eq!(state.job.status, JobStatus::Succeeded);
    assert_eq!(state.tasks[0].output, Some(json!({"done": true})));
    assert_eq!(
        f.store.callback(&token, complete()).await.unwrap(),
        accepted,
        "an identical repeat is answered as the first"
    );
    let different = f
        .store
        .callback(&token, CallbackCall::Complete { output: json!(2) })
        .await;
    assert!(matches!(different, Err(Error::Gone(_))), "{different:?}");
}

async fn a_callback_timeout_is_a_timer_that_retries_the_attempt(f: Fixture) {
    apply(
        &f.store,
        "steps:\n- {id: ext, queue: q, command: c, retry: {max_attempts: 2, initial: 1s}}\n",
    )
    .await;
    let job = submit(&f.store, "wf", json!({})).await.state.job.id;
    let claimed = claim_one(&f.store).await;
    f.store
        .report(
            claimed.task.id.clone(),
            Input::AwaitCallback {
                task: claimed.task.id.clone(),
                lease_token: claimed.task.lease_token.clone().unwrap(),
                timeout: Some(Duration::from_secs(30)),
            },
            TaskScope::default(),
        )
        .await
        .unwrap();
    let due = f.clock.now().saturating_add(Duration::from_secs(30));
    assert_eq!(f.store.next_timer().await.unwrap(), Some(due));
    f.clock.advance(Duration::from_secs(30));
    f.store.tick().await.unwrap();
    assert_eq!(task_status(&f.store, &job, "ext").await, TaskStatus::Ready);
    let gone = f
        .store
        .callback(&claimed.callback_token, CallbackCall::Heartbeat)
        .await;
    assert!(matches!(gone, Err(Error::Gone(_))), "{gone:?}");
    f.clock.advance(Duration::from_secs(1));
    let again = claim_one(&f.store).await;
    assert_ne!(again.callback_token, claimed.callback_token);
    assert_eq!(again.task.attempt, 2);
}

on_both_backends!(
    a_sleep_is_a_timer_the_tick_wakes,
    a_paused_job_sets_no_timer_for_its_sleeps,
    signals_are_kept_in_the_store_deduplicated_and_taken_in_order,
    an_approval_is_listed_until_decided,
    a_callback_token_finishes_the_attempt_once,
    a_callback_timeout_is_a_timer_that_retries_the_attempt,
);
