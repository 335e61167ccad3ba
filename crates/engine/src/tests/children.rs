//! Sub-workflows through the engine, on both backends: a child made in its parent's
//! transaction, its end carried back by the timer loop, pause and cancel passed down, nested
//! rollback, operator actions on a child refused while its parent is kept, and the checks when
//! a workflow that starts others is applied.

use serde_json::json;
use starbridge_core::ids::JobId;
use starbridge_core::model::{
    JobState, JobStatus, OperatorAction, OperatorCommand, TaskKind, TaskStatus,
};

use super::{Fixture, Store, claim_one, complete, definition, submit};
use crate::{Error, JobFilter};

async fn apply(store: &Store, name: &str, yaml: &str) -> Result<(), Error> {
    store
        .apply_workflow("default", name, definition(yaml))
        .await
        .map(|_| ())
}

async fn job(store: &Store, id: &JobId) -> JobState {
    store.job("default", id).await.unwrap().unwrap()
}

async fn children(store: &Store, parent: &JobId) -> Vec<JobId> {
    let mut filter = JobFilter {
        namespace: "default".into(),
        parent: Some(parent.clone()),
        limit: 100,
        ..JobFilter::default()
    };
    filter.limit = 100;
    let mut ids: Vec<JobId> = store
        .jobs(filter)
        .await
        .unwrap()
        .into_iter()
        .map(|job| job.id)
        .collect();
    ids.sort();
    ids
}

fn operator(action: OperatorAction) -> OperatorCommand {
    OperatorCommand {
        actor: "ops".into(),
        reason: None,
        action,
    }
}

const CHILD: &str = "output: '${{ steps.work.output }}'\nsteps:\n- {id: work, queue: q, command: c, compensate: {queue: q, command: undo}}\n";
const PARENT: &str = "output: '${{ steps.run.output }}'\nsteps:\n- {id: run, workflow: child, input: {n: '${{ params.n }}'}}\n- {id: last, queue: q, command: c}\n";

async fn a_child_starts_in_its_parents_transaction_and_its_end_reaches_the_parent(f: Fixture) {
    apply(&f.store, "child", CHILD).await.unwrap();
    apply(&f.store, "parent", PARENT).await.unwrap();
    let parent = submit(&f.store, "parent", json!({"n": 4}))
        .await
        .state
        .job
        .id;
    let kids = children(&f.store, &parent).await;
    assert_eq!(kids.len(), 1, "one child, made with its parent");
    let child = job(&f.store, &kids[0]).await;
    assert_eq!(child.job.params, json!({"n": 4}));
    assert_eq!(child.job.depth, 1);
    let link = child.job.parent.clone().unwrap();
    assert_eq!((link.job.clone(), link.attempt), (parent.clone(), 1));
    let run = job(&f.store, &parent).await;
    let run = run.tasks.iter().find(|t| t.step == "run").unwrap();
    assert_eq!(run.status, TaskStatus::Running);
    assert_eq!(run.child.as_deref(), Some(&kids[0]));

    let work = claim_one(&f.store).await;
    assert_eq!(work.task.job_id, kids[0]);
    complete(&f.store, &work, json!({"rows": 4})).await.unwrap();
    assert_eq!(
        job(&f.store, &kids[0]).await.job.status,
        JobStatus::Succeeded
    );
    assert!(
        f.store.next_timer().await.unwrap().is_some(),
        "the ending is due"
    );
    f.store.tick().await.unwrap();
    let state = job(&f.store, &parent).await;
    let run = state.tasks.iter().find(|t| t.step == "run").unwrap();
    assert_eq!(run.status, TaskStatus::Succeeded);
    assert_eq!(run.output, Some(json!({"rows": 4})));
    let last = claim_one(&f.store).await;
    complete(&f.store, &last, json!({})).await.unwrap();
    let state = job(&f.store, &parent).await;
    assert_eq!(state.job.status, JobStatus::Succeeded);
    assert_eq!(state.job.output, Some(json!({"rows": 4})));
    assert_eq!(
        f.store.next_timer().await.unwrap(),
        None,
        "nothing left due"
    );

    // While the parent is kept, the child is the parent's to act on.
    let refused = f
        .store
        .operate(
            "default",
            &kids[0],
            operator(OperatorAction::Rerun {
                step: "work".into(),
            }),
        )
        .await;
    assert!(
        matches!(&refused, Err(Error::Conflict(m)) if m.contains("act on the parent")),
        "{refused:?}"
    );
}

async fn a_child_carries_its_parents_labels_over_its_workflows(f: Fixture) {
    apply(
        &f.store,
        "child",
        "labels: {team: shards, tier: '2'}\nsteps:\n- {id: work, queue: q, command: c}\n",
    )
    .await
    .unwrap();
    apply(&f.store, "parent", PARENT).await.unwrap();
    let parent = f
        .store
        .submit(
            "default",
            crate::Submit {
                workflow: Some("parent".into()),
                params: Some(json!({"n": 1})),
                labels: [("team".to_owned(), "storage".to_owned())]
                    .into_iter()
                    .collect(),
                ..crate::Submit::default()
            },
        )
        .await
        .unwrap()
        .state
        .job
        .id;
    let child = job(&f.store, &children(&f.store, &parent).await[0]).await;
    assert_eq!(
        child.job.labels,
        [("team", "storage"), ("tier", "2")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    );
}

/// A job of `PARENT` and the child its first step started.
async fn parent_with_child(store: &Store) -> (JobId, JobId) {
    apply(store, "child", CHILD).await.unwrap();
    apply(store, "parent", PARENT).await.unwrap();
    let parent = submit(store, "parent", json!({"n": 1})).await.state.job.id;
    let child = children(store, &parent).await.remove(0);
    (parent, child)
}

async fn a_parent_rolls_its_succeeded_child_back_when_it_fails(f: Fixture) {
    let (parent, child) = parent_with_child(&f.store).await;
    let work = claim_one(&f.store).await;
    complete(&f.store, &work, json!({})).await.unwrap();
    f.store.tick().await.unwrap();
    // The parent's last step fails for good: the child is rolled back.
    let last = claim_one(&f.store).await;
    assert_eq!(last.task.job_id, parent);
    f.store
        .report(
            last.task.id.clone(),
            starbridge_core::model::Input::Fail {
                task: last.task.id.clone(),
                lease_token: last.task.lease_token.clone().unwrap(),
                error: starbridge_core::model::ReportedError {
                    message: "broke".into(),
                    retryable: false,
                    retry_after: None,
                },
                logs: None,
            },
            crate::TaskScope::default(),
        )
        .await
        .unwrap();
    let rolling = job(&f.store, &child).await;
    assert_eq!(rolling.job.status, JobStatus::Compensating);
    let undo = claim_one(&f.store).await;
    assert_eq!(
        (undo.task.job_id.clone(), undo.task.kind),
        (child.clone(), TaskKind::Compensation)
    );
    complete(&f.store, &undo, json!({})).await.unwrap();
    let rolled = job(&f.store, &child).await;
    assert_eq!(rolled.job.status, JobStatus::Cancelled);
    assert_eq!(
        rolled.job.wind_down.as_ref().unwrap().describe(),
        format!("rolled back by {parent}")
    );
    f.store.tick().await.unwrap();
    let state = job(&f.store, &parent).await;
    assert_eq!(state.job.status, JobStatus::Failed);
    let rollback = state
        .tasks
        .iter()
        .find(|t| t.kind == TaskKind::Compensation)
        .unwrap();
    assert_eq!(rollback.status, TaskStatus::Succeeded);
}

async fn cancelling_a_parent_cancels_its_running_child(f: Fixture) {
    let (parent, child) = parent_with_child(&f.store).await;
    f.store
        .operate("default", &parent, operator(OperatorAction::Pause))
        .await
        .unwrap();
    assert_eq!(job(&f.store, &child).await.job.status, JobStatus::Paused);
    f.store
        .operate("default", &parent, operator(OperatorAction::Resume))
        .await
        .unwrap();
    assert_eq!(job(&f.store, &child).await.job.status, JobStatus::Running);
    f.store
        .operate(
            "default",
            &parent,
            operator(OperatorAction::Cancel { compensate: true }),
        )
        .await
        .unwrap();
    assert_eq!(
        job(&f.store, &child).await.job.status,
        JobStatus::Cancelled,
        "nothing ran to undo"
    );
    assert_eq!(
        job(&f.store, &parent).await.job.status,
        JobStatus::Compensating
    );
    f.store.tick().await.unwrap();
    let state = job(&f.store, &parent).await;
    assert_eq!(state.job.status, JobStatus::Cancelled);
    assert_eq!(
        state.tasks.iter().find(|t| t.step == "run").unwrap().status,
        TaskStatus::Cancelled
    );
}

async fn a_workflow_starting_an_unknown_or_itself_is_refused_when_applied(f: Fixture) {
    let unknown = apply(&f.store, "parent", PARENT).await;
    assert!(
        matches!(&unknown, Err(Error::Invalid(p)) if p[0].field == "steps[0] (run).workflow" && p[0].message.contains("'child' is not applied")),
        "{unknown:?}"
    );
    apply(&f.store, "child", CHILD).await.unwrap();
    let pinned = apply(
        &f.store,
        "parent",
        "steps:\n- {id: run, workflow: child, version: 2}\n",
    )
    .await;
    assert!(
        matches!(&pinned, Err(Error::Invalid(p)) if p[0].message.contains("version 2")),
        "{pinned:?}"
    );
    apply(&f.store, "a", "steps:\n- {id: s, workflow: child}\n")
        .await
        .unwrap();
    // b starts a; a new version of a that starts b would start a again.
    apply(&f.store, "b", "steps:\n- {id: s, workflow: a}\n")
        .await
        .unwrap();
    let cycle = apply(&f.store, "a", "steps:\n- {id: s, workflow: b}\n").await;
    assert!(
        matches!(&cycle, Err(Error::Invalid(p)) if p[0].message.contains("b -> a")),
        "{cycle:?}"
    );
}

async fn a_child_whose_params_do_not_fit_fails_the_parent_step(f: Fixture) {
    apply(
        &f.store,
        "child",
        "params: {type: object, required: [n], properties: {n: {type: integer}}}\nsteps:\n- {id: work, queue: q, command: c}\n",
    )
    .await
    .unwrap();
    apply(
        &f.store,
        "parent",
        "steps:\n- {id: run, workflow: child, input: {n: nope}}\n",
    )
    .await
    .unwrap();
    let parent = submit(&f.store, "parent", json!({})).await.state.job.id;
    let state = job(&f.store, &parent).await;
    assert_eq!(state.job.status, JobStatus::Failed);
    let error = state.tasks[0].error.clone().unwrap();
    assert!(error.message.contains("params.n"), "{}", error.message);
    assert!(children(&f.store, &parent).await.is_empty());
}

on_both_backends!(
    a_child_carries_its_parents_labels_over_its_workflows,
    a_child_starts_in_its_parents_transaction_and_its_end_reaches_the_parent,
    a_parent_rolls_its_succeeded_child_back_when_it_fails,
    cancelling_a_parent_cancels_its_running_child,
    a_workflow_starting_an_unknown_or_itself_is_refused_when_applied,
    a_child_whose_params_do_not_fit_fails_the_parent_step,
);
