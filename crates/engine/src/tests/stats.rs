//! The `/metrics` figures (`starbridge_store::stats`) of jobs the engine made.

use std::sync::Arc;

use serde_json::json;

use starbridge_core::model::JobStatus;
use starbridge_core::time::{Duration, Timestamp};
use starbridge_store::stats::*;

use crate::{Engine as Store, ManualClock, Submit};

const WORKFLOW: &str = "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: r, command: c}\n";

fn open() -> (Store, Arc<ManualClock>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)));
    let url = format!("sqlite://{}", dir.path().join("stats.db").display());
    let store = Store::open_with_clock(&url, clock.clone()).unwrap();
    (store, clock, dir)
}

fn key(namespace: &str, name: &str) -> (String, String) {
    (namespace.to_owned(), name.to_owned())
}

#[tokio::test]
async fn counts_jobs_per_status_and_tasks_per_queue() {
    let (store, clock, _dir) = open();
    let empty = store.stats().await.unwrap();
    assert!(empty.jobs.is_empty() && empty.queues.is_empty());

    let document = starbridge_core::definition::parse_document(WORKFLOW).unwrap();
    store
        .apply_workflow("default", "wf", document)
        .await
        .unwrap();
    let submit = Submit {
        workflow: Some("wf".into()),
        params: Some(json!({})),
        ..Submit::default()
    };
    store.submit("default", submit.clone()).await.unwrap();
    store.submit("default", submit).await.unwrap();
    clock.advance(Duration::from_millis(2_500));

    let stats = store.stats().await.unwrap();
    assert_eq!(stats.jobs[&key("default", "running")], 2);
    assert_eq!(
        stats.jobs[&key("default", "failed")],
        0,
        "zeros are filled in"
    );
    assert_eq!(stats.jobs.len(), JobStatus::ALL.len());
    let q = stats.queues[&key("default", "q")];
    assert_eq!((q.ready, q.running), (2, 0));
    assert_eq!(q.oldest_ready_age, Duration::from_millis(2_500));
    let r = stats.queues[&key("default", "r")];
    assert_eq!(
        r,
        QueueStats::default(),
        "a known queue without tasks is all zero"
    );

    store
        .claim("default", vec!["q".into()], "w", 1)
        .await
        .unwrap();
    let q = store.stats().await.unwrap().queues[&key("default", "q")];
    assert_eq!((q.ready, q.running), (1, 1));
}
