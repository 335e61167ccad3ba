//! Steps routed to a host through the engine, on both backends: queue templates rendered per
//! task and kept in its row, the queues they make, prefix settings (`agent-*`) beside a
//! queue's own, and tokens that serve a pattern.

use serde_json::json;
use starbridge_core::dispatch::QueueMode;
use starbridge_core::model::{
    ErrorKind, Input, JobStatus, OperatorAction, OperatorCommand, ReportedError, TaskStatus,
};
use starbridge_core::time::Duration;

use super::{Fixture, Store, claim_n, complete, definition, fail, submit};
use crate::{Error, NewToken, QueueChange, QueueSearch, Scope, TaskScope};

async fn apply(store: &Store, yaml: &str) {
    store
        .apply_workflow("default", "wf", definition(yaml))
        .await
        .unwrap();
}

/// Every queue of the namespace, by name.
async fn queue_names(store: &Store) -> Vec<String> {
    let search = QueueSearch {
        namespace: "default".into(),
        limit: 100,
        ..QueueSearch::default()
    };
    let page = store.queue_page(search).await.unwrap();
    page.queues.into_iter().map(|q| q.queue.name).collect()
}

async fn a_fan_out_puts_each_item_on_its_own_queue(f: Fixture) {
    apply(
        &f.store,
        "steps:\n- {id: each, queue: 'agent-${{ item }}', command: c, for_each: '${{ params.hosts }}'}\n",
    )
    .await;
    assert!(
        queue_names(&f.store).await.is_empty(),
        "a template's queues are made when rendered, not at apply"
    );
    submit(&f.store, "wf", json!({"hosts": ["a", "b", "c"]})).await;
    assert_eq!(
        queue_names(&f.store).await,
        ["agent-a", "agent-b", "agent-c"]
    );
    let served = claim_n(&f.store, &["agent-b"], 10).await;
    assert_eq!(
        served.len(),
        1,
        "a worker serving agent-b gets only b's task"
    );
    assert_eq!(served[0].task.queue, "agent-b");
    assert_eq!(served[0].task.input, Some(json!("b")));
    assert_eq!(served[0].task.item, Some(1));
    assert!(claim_n(&f.store, &["agent-b"], 10).await.is_empty());
    assert_eq!(
        claim_n(&f.store, &["agent-a", "agent-c"], 10).await.len(),
        2
    );
}

const FIND_THEN_RUN: &str = "steps:\n- {id: find, queue: q, command: c}\n- {id: run, queue: 'agent-${{ steps.find.output.host }}', command: c, retry: {max_attempts: 3, initial: 1s}}\n";

/// The rendered queue is stored with the task (a row made at submit and rendered later), kept
/// across a retry and a check-later, and rendered again by a rerun.
async fn a_rendered_queue_is_kept_across_retries_and_rendered_again_by_a_rerun(f: Fixture) {
    apply(&f.store, FIND_THEN_RUN).await;
    let job = submit(&f.store, "wf", json!({})).await.state.job.id;
    let find = claim_n(&f.store, &["q"], 1).await.remove(0);
    complete(&f.store, &find, json!({"host": "b"}))
        .await
        .unwrap();
    let first = claim_n(&f.store, &["agent-b"], 1).await.remove(0);
    assert_eq!((first.task.step.as_str(), first.task.attempt), ("run", 1));
    fail(&f.store, &first).await;
    f.clock.advance(Duration::from_secs(1));
    let retry = claim_n(&f.store, &["agent-b"], 1).await.remove(0);
    assert_eq!(retry.task.attempt, 2, "the retry is on the same queue");
    f.store
        .report(
            retry.task.id.clone(),
            Input::CheckLater {
                task: retry.task.id.clone(),
                lease_token: retry.task.lease_token.clone().unwrap(),
                after: Duration::from_secs(5),
                progress: None,
            },
            TaskScope::default(),
        )
        .await
        .unwrap();
    f.clock.advance(Duration::from_secs(5));
    let checked = claim_n(&f.store, &["agent-b"], 1).await.remove(0);
    assert_eq!(checked.task.attempt, 2, "the check-later continues on it");
    complete(&f.store, &checked, json!({})).await.unwrap();
    let rerun = OperatorCommand {
        actor: "ops".into(),
        reason: None,
        action: OperatorAction::Rerun {
            step: "find".into(),
        },
    };
    f.store.operate("default", &job, rerun).await.unwrap();
    let find = claim_n(&f.store, &["q"], 1).await.remove(0);
    complete(&f.store, &find, json!({"host": "c"}))
        .await
        .unwrap();
    assert!(claim_n(&f.store, &["agent-b"], 1).await.is_empty());
    let again = claim_n(&f.store, &["agent-c"], 1).await.remove(0);
    assert_eq!(again.task.step, "run", "the rerun rendered the queue again");
    complete(&f.store, &again, json!({})).await.unwrap();
    let state = f.store.job("default", &job).await.unwrap().unwrap();
    assert_eq!(state.job.status, JobStatus::Succeeded);
    assert_eq!(queue_names(&f.store).await, ["agent-b", "agent-c", "q"]);
}

async fn a_queue_that_renders_empty_fails_the_step_naming_queue(f: Fixture) {
    apply(
        &f.store,
        "steps:\n- {id: run, queue: '${{ params.host }}', command: c}\n",
    )
    .await;
    let submitted = submit(&f.store, "wf", json!({"host": ""})).await;
    let state = f
        .store
        .job("default", &submitted.state.job.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.job.status, JobStatus::Failed);
    let task = &state.tasks[0];
    assert_eq!(task.status, TaskStatus::Failed);
    let error = task.error.as_ref().unwrap();
    assert_eq!(error.kind, ErrorKind::Expression);
    assert!(error.message.starts_with("queue: "), "{}", error.message);
}

async fn apply_refuses_a_queue_whose_literal_part_is_invalid(f: Fixture) {
    let error = f
        .store
        .apply_workflow(
            "default",
            "wf",
            definition("steps:\n- {id: run, queue: 'agent ${{ params.host }}', command: c}\n"),
        )
        .await
        .unwrap_err();
    let Error::Invalid(problems) = error else {
        panic!("expected Invalid, got {error}")
    };
    assert_eq!(problems[0].field, "steps[0] (run).queue");
    assert!(
        problems[0].message.contains("'agent '"),
        "{}",
        problems[0].message
    );
}

async fn a_compensation_queue_is_rendered_from_the_undone_task(f: Fixture) {
    apply(
        &f.store,
        "steps:\n- {id: make, queue: q, command: c, compensate: {queue: 'undo-${{ task.output.host }}', command: u}}\n- {id: boom, queue: q, command: c}\n",
    )
    .await;
    submit(&f.store, "wf", json!({})).await;
    let make = claim_n(&f.store, &["q"], 1).await.remove(0);
    complete(&f.store, &make, json!({"host": "h7"}))
        .await
        .unwrap();
    let boom = claim_n(&f.store, &["q"], 1).await.remove(0);
    f.store
        .report(
            boom.task.id.clone(),
            Input::Fail {
                task: boom.task.id.clone(),
                lease_token: boom.task.lease_token.clone().unwrap(),
                error: ReportedError {
                    message: "down".into(),
                    retryable: false,
                    retry_after: None,
                },
                logs: None,
            },
            TaskScope::default(),
        )
        .await
        .unwrap();
    let undo = claim_n(&f.store, &["undo-h7"], 1).await.remove(0);
    assert_eq!(undo.task.command, "u");
    assert!(queue_names(&f.store).await.contains(&"undo-h7".to_owned()));
}

fn priority(priority: i32) -> QueueChange {
    QueueChange {
        priority: Some(priority),
        ..QueueChange::default()
    }
}

/// The priority a queue dispatches with, and the prefix it comes from.
async fn settings(store: &Store, queue: &str) -> (i32, Option<String>) {
    let info = store.queue("default", queue).await.unwrap().unwrap();
    (info.queue.config.priority, info.settings_from)
}

async fn prefix_settings_reach_existing_and_future_queues_unless_a_queue_has_its_own(f: Fixture) {
    apply(
        &f.store,
        "steps:\n- {id: each, queue: 'agent-${{ item }}', command: c, for_each: '${{ params.hosts }}'}\n",
    )
    .await;
    submit(&f.store, "wf", json!({"hosts": ["a", "b"]})).await;
    f.store
        .configure_queue_prefix("default", "agent-*", priority(5))
        .await
        .unwrap();
    assert_eq!(
        settings(&f.store, "agent-a").await,
        (5, Some("agent-".into()))
    );
    f.store
        .configure_queue("default", "agent-b", priority(9))
        .await
        .unwrap();
    assert_eq!(
        settings(&f.store, "agent-b").await,
        (9, None),
        "its own beat the prefix"
    );
    f.store
        .configure_queue_prefix("default", "agent-eu-*", priority(7))
        .await
        .unwrap();
    submit(&f.store, "wf", json!({"hosts": ["eu-1", "c"]})).await;
    assert_eq!(
        settings(&f.store, "agent-eu-1").await,
        (7, Some("agent-eu-".into())),
        "a future queue, and the longest prefix wins"
    );
    assert_eq!(
        settings(&f.store, "agent-c").await,
        (5, Some("agent-".into()))
    );

    // Settings a prefix gives bound each of its queues on its own (here: one running task).
    let serial = QueueChange {
        mode: Some(QueueMode::Serial),
        ..QueueChange::default()
    };
    f.store
        .configure_queue_prefix("default", "agent-*", serial)
        .await
        .unwrap();
    submit(&f.store, "wf", json!({"hosts": ["a"]})).await;
    assert_eq!(claim_n(&f.store, &["agent-a"], 10).await.len(), 1);
    assert!(
        claim_n(&f.store, &["agent-a"], 10).await.is_empty(),
        "serial"
    );
    assert_eq!(
        claim_n(&f.store, &["agent-c"], 10).await.len(),
        1,
        "its own lane"
    );
    assert_eq!(
        claim_n(&f.store, &["agent-b"], 10).await.len(),
        1,
        "agent-b has its own settings: parallel"
    );
    let page = f
        .store
        .queue_page(QueueSearch {
            namespace: "default".into(),
            limit: 10,
            ..QueueSearch::default()
        })
        .await
        .unwrap();
    let prefixes: Vec<&str> = page.prefixes.iter().map(|p| p.prefix.as_str()).collect();
    assert_eq!(prefixes, ["agent-", "agent-eu-"]);

    // Dropping settings: a prefix's queues fall back to the next prefix or the defaults, and a
    // queue that drops its own follows its prefix again (keeping its pause).
    f.store
        .drop_queue_settings("default", "agent-eu-*")
        .await
        .unwrap();
    assert_eq!(
        settings(&f.store, "agent-eu-1").await,
        (5, Some("agent-".into()))
    );
    let paused = QueueChange {
        paused: Some(true),
        ..QueueChange::default()
    };
    f.store
        .configure_queue("default", "agent-b", paused)
        .await
        .unwrap();
    f.store
        .drop_queue_settings("default", "agent-b")
        .await
        .unwrap();
    let info = f.store.queue("default", "agent-b").await.unwrap().unwrap();
    assert_eq!(
        (info.queue.config.priority, info.queue.config.paused),
        (5, true)
    );
    f.store
        .drop_queue_settings("default", "agent-*")
        .await
        .unwrap();
    assert_eq!(settings(&f.store, "agent-a").await, (0, None));
    f.store
        .configure_queue_prefix("default", "*", priority(1))
        .await
        .unwrap();
    assert_eq!(
        settings(&f.store, "agent-a").await,
        (1, Some(String::new())),
        "`*` names every queue"
    );
    let gone = f.store.drop_queue_settings("default", "agent-*").await;
    assert!(matches!(gone, Err(Error::NotFound(_))), "{gone:?}");
    let unknown = f.store.drop_queue_settings("default", "nope").await;
    assert!(matches!(unknown, Err(Error::NotFound(_))), "{unknown:?}");
}

async fn queue_patterns_are_checked_and_pause_names_one_queue(f: Fixture) {
    for (name, expected) in [
        ("a*b", "the only place a '*' may stand"),
        ("a b*", "not a valid queue pattern"),
    ] {
        let error = f
            .store
            .configure_queue_prefix("default", name, priority(1))
            .await
            .unwrap_err();
        let Error::Invalid(problems) = error else {
            panic!("expected Invalid, got {error}")
        };
        assert_eq!(problems[0].field, "name");
        assert!(
            problems[0].message.contains(expected),
            "{}",
            problems[0].message
        );
    }
    let paused = QueueChange {
        paused: Some(true),
        ..QueueChange::default()
    };
    let error = f
        .store
        .configure_queue("default", "agent-*", paused)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("is a pattern"), "{error}");
    let zero = QueueChange {
        concurrency: Some(Some(0)),
        ..QueueChange::default()
    };
    let error = f
        .store
        .configure_queue_prefix("default", "agent-*", zero)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("concurrency"), "{error}");
}

async fn a_namespace_holds_a_bounded_number_of_prefix_settings(f: Fixture) {
    let limit = starbridge_core::limits::MAX_QUEUE_PREFIXES;
    for n in 0..limit {
        f.store
            .configure_queue_prefix("default", &format!("p{n}-*"), priority(1))
            .await
            .unwrap();
    }
    f.store
        .configure_queue_prefix("default", "p0-*", priority(2))
        .await
        .expect("changing one that exists is not a new one");
    let error = f
        .store
        .configure_queue_prefix("default", "more-*", priority(1))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Conflict(_)), "{error}");
    f.store
        .configure_queue_prefix("other", "more-*", priority(1))
        .await
        .expect("each namespace has its own");
}

async fn a_token_may_serve_the_queues_a_pattern_names(f: Fixture) {
    let token = |queues: Vec<&str>| NewToken {
        name: format!("w{}", queues.len()),
        namespace: None,
        scopes: vec![Scope::Work],
        queues: Some(queues.into_iter().map(str::to_owned).collect()),
        created_by: "admin".into(),
    };
    let (agents, _) = f.store.create_token(token(vec!["agent-*"])).await.unwrap();
    assert!(agents.may_serve("agent-x") && !agents.may_serve("db"));
    let error = f
        .store
        .create_token(token(vec!["db", "a*b"]))
        .await
        .unwrap_err();
    let Error::Invalid(problems) = error else {
        panic!("expected Invalid, got {error}")
    };
    assert_eq!(problems[0].field, "queues");

    // A report on a task of a queue the pattern does not name is refused as not found.
    apply(&f.store, "steps:\n- {id: run, queue: db, command: c}\n").await;
    submit(&f.store, "wf", json!({})).await;
    let claimed = claim_n(&f.store, &["db"], 1).await.remove(0);
    let scope = TaskScope {
        namespace: None,
        queues: Some(vec!["agent-*".into()]),
    };
    let refused = f
        .store
        .report(
            claimed.task.id.clone(),
            Input::Complete {
                task: claimed.task.id.clone(),
                lease_token: claimed.task.lease_token.clone().unwrap(),
                output: json!({}),
                logs: None,
            },
            scope,
        )
        .await;
    assert!(matches!(refused, Err(Error::NotFound(_))), "{refused:?}");
}

on_both_backends!(
    a_fan_out_puts_each_item_on_its_own_queue,
    a_rendered_queue_is_kept_across_retries_and_rendered_again_by_a_rerun,
    a_queue_that_renders_empty_fails_the_step_naming_queue,
    apply_refuses_a_queue_whose_literal_part_is_invalid,
    a_compensation_queue_is_rendered_from_the_undone_task,
    prefix_settings_reach_existing_and_future_queues_unless_a_queue_has_its_own,
    queue_patterns_are_checked_and_pause_names_one_queue,
    a_namespace_holds_a_bounded_number_of_prefix_settings,
    a_token_may_serve_the_queues_a_pattern_names,
);
