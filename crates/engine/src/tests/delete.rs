//! Deleting finished jobs by hand, on both backends: what goes with the job, what frees its key,
//! and the jobs that are refused (unfinished ones, a child whose parent is kept). Deleting a
//! workflow: what refuses it, what a deleted workflow still shows, and its re-apply.

use serde_json::json;
use starbridge_core::model::{JobStatus, OperatorAction, OperatorCommand};

use super::{Fixture, Store, TWO_STEPS, claim_one, complete, definition, schedule_spec, submit};
use crate::{Error, Submit};
use starbridge_core::schedule::{CatchUp, Overlap};

fn keyed(key: &str) -> Submit {
    Submit {
        workflow: Some("wf".into()),
        key: Some(key.into()),
        ..Submit::default()
    }
}

async fn finish_the_ready_tasks(store: &Store, count: usize) {
    for _ in 0..count {
        let task = claim_one(store).await;
        complete(store, &task, json!({})).await.unwrap();
    }
}

async fn a_finished_job_is_deleted_with_its_history_and_its_key_is_free_again(f: Fixture) {
    f.store
        .apply_workflow("default", "wf", definition(TWO_STEPS))
        .await
        .unwrap();
    let first = f.store.submit("default", keyed("order-7")).await.unwrap();
    let id = first.state.job.id;

    let refused = f.store.delete_job("default", &id).await;
    assert!(
        matches!(&refused, Err(Error::Conflict(m))
            if m.contains(first.state.job.status.as_str()) && m.contains("cancel it first")),
        "{refused:?}"
    );
    finish_the_ready_tasks(&f.store, 2).await;
    let finished = f.store.job("default", &id).await.unwrap().unwrap();
    assert_eq!(finished.job.status, JobStatus::Succeeded);

    let elsewhere = f.store.delete_job("other-ns", &id).await;
    assert!(
        matches!(elsewhere, Err(Error::NotFound(_))),
        "{elsewhere:?}"
    );
    f.store.delete_job("default", &id).await.unwrap();
    assert!(f.store.job("default", &id).await.unwrap().is_none());
    assert!(
        f.store
            .events("default", &id, 0, 10)
            .await
            .unwrap()
            .is_none()
    );
    let again = f.store.delete_job("default", &id).await;
    assert!(matches!(again, Err(Error::NotFound(_))), "{again:?}");

    let second = f.store.submit("default", keyed("order-7")).await.unwrap();
    assert!(second.created, "the key is free again");
    assert_ne!(second.state.job.id, id);
    // The writer goes on serving the new job after the delete.
    finish_the_ready_tasks(&f.store, 2).await;
}

const CHILD: &str = "steps:\n- {id: work, queue: q, command: c}\n";
const PARENT: &str = "steps:\n- {id: run, workflow: child}\n";

async fn a_child_is_refused_while_its_parent_is_kept(f: Fixture) {
    for (name, yaml) in [("child", CHILD), ("parent", PARENT)] {
        f.store
            .apply_workflow("default", name, definition(yaml))
            .await
            .unwrap();
    }
    let parent = submit(&f.store, "parent", json!({})).await.state.job.id;
    let work = claim_one(&f.store).await;
    let child = work.task.job_id.clone();
    complete(&f.store, &work, json!({})).await.unwrap();
    f.store.tick().await.unwrap();
    let ended = f.store.job("default", &parent).await.unwrap().unwrap();
    assert_eq!(ended.job.status, JobStatus::Succeeded);

    let refused = f.store.delete_job("default", &child).await;
    assert!(
        matches!(&refused, Err(Error::Conflict(m))
            if m.contains(parent.as_str()) && m.contains("delete the parent first")),
        "{refused:?}"
    );
    f.store.delete_job("default", &parent).await.unwrap();
    f.store.delete_job("default", &child).await.unwrap();
    assert!(f.store.job("default", &child).await.unwrap().is_none());
}

async fn a_workflow_in_use_is_refused_naming_every_user(f: Fixture) {
    for (name, yaml) in [
        ("wf", TWO_STEPS),
        ("parent", "steps:\n- {id: run, workflow: wf}\n"),
    ] {
        f.store
            .apply_workflow("default", name, definition(yaml))
            .await
            .unwrap();
    }
    let spec = schedule_spec("0 0 3 * * *", Overlap::Skip, CatchUp::Skip);
    f.store
        .put_schedule("default", "nightly", spec)
        .await
        .unwrap();
    let running = submit(&f.store, "wf", json!({})).await.state.job.id;
    let cancelled = submit(&f.store, "wf", json!({})).await.state.job.id;
    let cancel = OperatorCommand {
        actor: "ops".into(),
        reason: None,
        action: OperatorAction::Cancel { compensate: false },
    };
    f.store
        .operate("default", &cancelled, cancel)
        .await
        .unwrap();

    let refused = f.store.delete_workflow("default", "wf").await;
    let Err(Error::Conflict(message)) = &refused else {
        panic!("{refused:?}");
    };
    for named in [
        running.as_str(),
        cancelled.as_str(),
        "2 job(s) not succeeded",
        "schedule(s) nightly",
        "step 'run' of workflow 'parent'",
    ] {
        assert!(message.contains(named), "{named} not in: {message}");
    }
    let elsewhere = f.store.delete_workflow("other-ns", "wf").await;
    assert!(
        matches!(elsewhere, Err(Error::NotFound(_))),
        "{elsewhere:?}"
    );

    // Each user taken away in turn: the last refusal names only the cancelled job.
    f.store.delete_workflow("default", "parent").await.unwrap();
    f.store.delete_schedule("default", "nightly").await.unwrap();
    finish_the_ready_tasks(&f.store, 2).await;
    let refused = f.store.delete_workflow("default", "wf").await;
    assert!(
        matches!(&refused, Err(Error::Conflict(m))
            if m.contains(cancelled.as_str()) && !m.contains(running.as_str())
                && !m.contains("schedule") && !m.contains("parent")),
        "{refused:?}"
    );
    f.store.delete_job("default", &cancelled).await.unwrap();
    f.store.delete_workflow("default", "wf").await.unwrap();
}

async fn a_deleted_workflow_runs_no_job_keeps_its_versions_and_continues_them(f: Fixture) {
    f.store
        .apply_workflow("default", "wf", definition(TWO_STEPS))
        .await
        .unwrap();
    let done = submit(&f.store, "wf", json!({})).await.state.job.id;
    finish_the_ready_tasks(&f.store, 2).await;
    f.store.delete_workflow("default", "wf").await.unwrap();

    let listed = f.store.workflows("default").await.unwrap();
    assert!(listed.iter().all(|w| w.name != "wf"), "{listed:?}");
    assert!(
        f.store
            .workflow("default", "wf", None)
            .await
            .unwrap()
            .is_none()
    );
    let kept = f.store.workflow("default", "wf", Some(1)).await.unwrap();
    assert_eq!(
        kept.map(|w| w.version),
        Some(1),
        "version 1 stays for its job"
    );
    let job = f.store.job("default", &done).await.unwrap().unwrap();
    assert_eq!(job.job.status, JobStatus::Succeeded);
    for version in [None, Some(1)] {
        let request = Submit {
            workflow: Some("wf".into()),
            version,
            ..Submit::default()
        };
        let refused = f.store.submit("default", request).await;
        assert!(matches!(refused, Err(Error::NotFound(_))), "{refused:?}");
    }
    let starter = f
        .store
        .apply_workflow(
            "default",
            "parent",
            definition("steps:\n- {id: run, workflow: wf}\n"),
        )
        .await;
    assert!(
        matches!(&starter, Err(Error::Invalid(problems))
            if problems[0].field == "steps[0] (run).workflow"),
        "{starter:?}"
    );
    let spec = schedule_spec("0 0 3 * * *", Overlap::Skip, CatchUp::Skip);
    let scheduled = f.store.put_schedule("default", "nightly", spec).await;
    assert!(scheduled.is_err(), "{scheduled:?}");
    let again = f.store.delete_workflow("default", "wf").await;
    assert!(matches!(again, Err(Error::NotFound(_))), "{again:?}");

    // The same definition applied again is the next version, and runs.
    let applied = f
        .store
        .apply_workflow("default", "wf", definition(TWO_STEPS))
        .await
        .unwrap();
    assert_eq!((applied.version, applied.created), (2, true));
    let listed = f.store.workflows("default").await.unwrap();
    assert_eq!(
        listed.iter().find(|w| w.name == "wf").map(|w| w.version),
        Some(2)
    );
    let job = submit(&f.store, "wf", json!({})).await;
    assert_eq!(job.state.job.version, 2);
}

on_both_backends!(
    a_finished_job_is_deleted_with_its_history_and_its_key_is_free_again,
    a_child_is_refused_while_its_parent_is_kept,
    a_workflow_in_use_is_refused_naming_every_user,
    a_deleted_workflow_runs_no_job_keeps_its_versions_and_continues_them,
);
