//! Task events in the webhook outbox, on both backends: which subscriptions get a delivery for
//! a task's start, retry, failure and success, and what the create refuses.

use serde_json::{Value, json};
use starbridge_core::time::Duration;
use starbridge_core::webhook::WebhookEvent;

use super::{Fixture, Store, apply_one_step, claim_one, complete, definition, fail, submit};
use crate::{Error, NewWebhook};

const RETRIED: &str = "steps:\n- {id: a, queue: q, command: c, retry: {max_attempts: 2, initial: 1s}}\n- {id: b, queue: q, command: c, depends_on: [a], retry: {max_attempts: 2, initial: 1s}}\n";

fn subscription(events: Option<Vec<WebhookEvent>>, steps: &[&str]) -> NewWebhook {
    NewWebhook {
        url: "https://example.com/hook".to_owned(),
        workflow: None,
        states: Vec::new(),
        events,
        steps: steps.iter().map(|s| s.to_string()).collect(),
        secret: None,
    }
}

/// The payloads written for a subscription, oldest first.
async fn payloads(store: &Store, webhook: &str) -> Vec<Value> {
    let mut deliveries = store
        .deliveries("default", webhook, 100)
        .await
        .unwrap()
        .unwrap();
    deliveries.reverse();
    deliveries.into_iter().map(|d| d.payload).collect()
}

fn types(payloads: &[Value]) -> Vec<(&str, &str, u64)> {
    payloads
        .iter()
        .map(|p| {
            (
                p["type"].as_str().unwrap(),
                p["task"]["step"].as_str().unwrap_or("-"),
                p["task"]["attempt"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

async fn task_events_reach_only_the_subscriptions_that_ask_for_them(f: Fixture) {
    f.store
        .apply_workflow("default", "wf", definition(RETRIED))
        .await
        .unwrap();
    let every = f
        .store
        .create_webhook(
            "default",
            subscription(
                Some(vec![
                    WebhookEvent::TaskStarted,
                    WebhookEvent::TaskRetrying,
                    WebhookEvent::TaskFailed,
                    WebhookEvent::TaskSucceeded,
                ]),
                &[],
            ),
        )
        .await
        .unwrap();
    let failures_of_b = f
        .store
        .create_webhook(
            "default",
            subscription(Some(vec![WebhookEvent::TaskFailed]), &["b"]),
        )
        .await
        .unwrap();
    let jobs_only = f
        .store
        .create_webhook("default", subscription(None, &[]))
        .await
        .unwrap();
    assert_eq!(jobs_only.events, [WebhookEvent::JobStatusChanged]);

    let job = submit(&f.store, "wf", json!({})).await;
    let first = claim_one(&f.store).await;
    fail(&f.store, &first, "boom").await;
    f.clock.advance(Duration::from_secs(2));
    let second = claim_one(&f.store).await;
    complete(&f.store, &second, json!({})).await.unwrap();
    let b = claim_one(&f.store).await;
    fail(&f.store, &b, "boom").await;
    f.clock.advance(Duration::from_secs(2));
    let b_again = claim_one(&f.store).await;
    fail(&f.store, &b_again, "boom").await;

    let all = payloads(&f.store, &every.id).await;
    assert_eq!(
        types(&all),
        [
            ("task.started", "a", 1),
            ("task.retrying", "a", 1),
            ("task.started", "a", 2),
            ("task.succeeded", "a", 2),
            ("task.started", "b", 1),
            ("task.retrying", "b", 1),
            ("task.started", "b", 2),
            ("task.failed", "b", 2),
        ]
    );
    let retrying = &all[1];
    assert_eq!(retrying["job"]["id"], job.state.job.id.as_str());
    assert_eq!(retrying["task"]["id"], first.task.id.as_str());
    assert_eq!(retrying["task"]["error"]["message"], "boom");
    assert!(retrying["task"]["retry_at"].is_i64(), "{retrying}");
    assert_eq!(all[0]["task"]["error"], Value::Null, "a start has no error");

    let failed = payloads(&f.store, &failures_of_b.id).await;
    assert_eq!(types(&failed), [("task.failed", "b", 2)]);
    assert_eq!(failed[0]["task"]["error"]["message"], "boom");

    let statuses = payloads(&f.store, &jobs_only.id).await;
    let changes: Vec<&Value> = statuses
        .iter()
        .map(|p| {
            assert_eq!(p["type"], "job.status_changed");
            &p["job"]["status"]
        })
        .collect();
    assert_eq!(changes, [&json!("running"), &json!("failed")]);
}

async fn a_subscription_refuses_empty_or_repeated_events_and_bad_steps(f: Fixture) {
    let refused = |new: NewWebhook| {
        let store = &f.store;
        async move {
            match store.create_webhook("default", new).await {
                Err(Error::Invalid(problems)) => problems
                    .into_iter()
                    .map(|p| p.field)
                    .collect::<Vec<String>>(),
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
    };
    assert_eq!(refused(subscription(Some(vec![]), &[])).await, ["events"]);
    let twice = vec![WebhookEvent::TaskFailed, WebhookEvent::TaskFailed];
    assert_eq!(refused(subscription(Some(twice), &[])).await, ["events[1]"]);
    let task = || Some(vec![WebhookEvent::TaskFailed]);
    assert_eq!(
        refused(subscription(task(), &["ok", "not ok", "ok"])).await,
        ["steps[1]", "steps[2]"]
    );
    assert_eq!(refused(subscription(None, &["a"])).await, ["steps"]);
    assert!(f.store.webhooks("default").await.unwrap().is_empty());
}

/// The writer keeps a namespace's subscriptions between transactions (on SQLite): making one
/// must reach the next job, and deleting it must stop its deliveries.
async fn a_subscription_made_or_deleted_after_jobs_ran_applies_to_the_next_job(f: Fixture) {
    apply_one_step(&f.store).await;
    let run_one = || async {
        submit(&f.store, "wf", json!({})).await;
        let claimed = claim_one(&f.store).await;
        complete(&f.store, &claimed, json!({})).await.unwrap();
    };
    let subscribe_to_successes = || {
        f.store.create_webhook(
            "default",
            subscription(Some(vec![WebhookEvent::TaskSucceeded]), &[]),
        )
    };
    run_one().await;
    let hook = subscribe_to_successes().await.unwrap();
    run_one().await;
    assert_eq!(
        types(&payloads(&f.store, &hook.id).await),
        [("task.succeeded", "a", 1)]
    );
    let second = subscribe_to_successes().await.unwrap();
    f.store.delete_webhook("default", &hook.id).await.unwrap();
    run_one().await;
    assert_eq!(
        payloads(&f.store, &second.id).await.len(),
        1,
        "the subscription left receives the job's success"
    );
}

on_both_backends!(
    task_events_reach_only_the_subscriptions_that_ask_for_them,
    a_subscription_made_or_deleted_after_jobs_ran_applies_to_the_next_job,
    a_subscription_refuses_empty_or_repeated_events_and_bad_steps,
);
