//! Deleting finished jobs by hand, on both backends: what goes with the job, what frees its key,
//! and the jobs that are refused (unfinished ones, a child whose parent is kept).

use serde_json::json;
use starbridge_core::model::JobStatus;

use super::{Fixture, Store, TWO_STEPS, claim_one, complete, definition, submit};
use crate::{Error, Submit};

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

on_both_backends!(
    a_finished_job_is_deleted_with_its_history_and_its_key_is_free_again,
    a_child_is_refused_while_its_parent_is_kept,
);
