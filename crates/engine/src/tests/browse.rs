//! The browsing queries (`starbridge_store::browse`) on jobs the engine made.

use std::sync::Arc;

use serde_json::json;

use starbridge_core::time::Duration;
use starbridge_store::browse::*;

use starbridge_core::model::JobStatus;
use starbridge_core::time::Timestamp;

use crate::{Engine as Store, ManualClock, Submit};

const START: i64 = 1_700_000_000_000;

async fn store_with_jobs() -> (Store, Arc<ManualClock>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(Timestamp(START)));
    let url = format!("sqlite://{}", dir.path().join("browse.db").display());
    let store = Store::open_with_clock(&url, clock.clone()).unwrap();
    for (name, body) in [
        (
            "one",
            json!({"steps": [{"id": "a", "queue": "q", "command": "c"}]}),
        ),
        (
            "two",
            json!({"steps": [{"id": "b", "queue": "r", "command": "c"}]}),
        ),
    ] {
        store.apply_workflow("default", name, body).await.unwrap();
    }
    for (i, workflow) in ["one", "two", "one", "two", "one"].iter().enumerate() {
        if i > 0 {
            clock.advance(Duration::from_millis(1000));
        }
        store
            .submit(
                "default",
                Submit {
                    workflow: Some((*workflow).to_owned()),
                    key: Some(format!("order-{i}")),
                    ..Submit::default()
                },
            )
            .await
            .unwrap();
    }
    (store, clock, dir)
}

fn search() -> JobSearch {
    JobSearch {
        namespace: "default".to_owned(),
        limit: 10,
        ..JobSearch::default()
    }
}

fn keys(lines: &[JobLine]) -> Vec<&str> {
    lines.iter().filter_map(|l| l.key.as_deref()).collect()
}

#[tokio::test]
async fn jobs_are_listed_newest_first_and_pages_follow_the_cursor() {
    let (store, _clock, _dir) = store_with_jobs().await;
    let first = store
        .browse_jobs(JobSearch {
            limit: 2,
            ..search()
        })
        .await
        .unwrap();
    assert_eq!(keys(&first), ["order-4", "order-3"]);
    let last = first.last().unwrap();
    let cursor = JobCursor {
        created_at: last.created_at,
        id: last.id.clone(),
    };
    assert_eq!(JobCursor::decode(&cursor.encode()), Some(cursor.clone()));
    let second = store
        .browse_jobs(JobSearch {
            limit: 2,
            after: Some(cursor),
            ..search()
        })
        .await
        .unwrap();
    assert_eq!(keys(&second), ["order-2", "order-1"]);
}

#[tokio::test]
async fn filters_by_workflow_time_range_and_key_or_id_prefix() {
    let (store, _clock, _dir) = store_with_jobs().await;
    let two = store
        .browse_jobs(JobSearch {
            workflow: Some("two".to_owned()),
            ..search()
        })
        .await
        .unwrap();
    assert_eq!(keys(&two), ["order-3", "order-1"]);
    let window = store
        .browse_jobs(JobSearch {
            created_after: Some(Timestamp(START + 1000)),
            created_before: Some(Timestamp(START + 3000)),
            ..search()
        })
        .await
        .unwrap();
    assert_eq!(keys(&window), ["order-2", "order-1"]);
    let by_key = store
        .browse_jobs(JobSearch {
            text: Some("order-3".to_owned()),
            ..search()
        })
        .await
        .unwrap();
    assert_eq!(keys(&by_key), ["order-3"]);
    let id = by_key[0].id.to_string();
    let by_id = store
        .browse_jobs(JobSearch {
            text: Some(id[..id.len() - 2].to_owned()),
            ..search()
        })
        .await
        .unwrap();
    assert!(by_id.iter().any(|line| line.id == by_key[0].id));
    // A search pages like the list and obeys the other filters.
    let first = store
        .browse_jobs(JobSearch {
            text: Some("order-".to_owned()),
            workflow: Some("one".to_owned()),
            limit: 2,
            ..search()
        })
        .await
        .unwrap();
    assert_eq!(keys(&first), ["order-4", "order-2"]);
    let rest = store
        .browse_jobs(JobSearch {
            text: Some("order-".to_owned()),
            workflow: Some("one".to_owned()),
            after: Some(JobCursor {
                created_at: first[1].created_at,
                id: first[1].id.clone(),
            }),
            ..search()
        })
        .await
        .unwrap();
    assert_eq!(keys(&rest), ["order-0"]);
    let counts = store
        .job_counts(
            JobSearch {
                text: Some("order-".to_owned()),
                ..search()
            },
            100,
        )
        .await
        .unwrap();
    let running = counts.iter().find(|c| c.status == JobStatus::Running);
    assert_eq!(running.map(|c| (c.count, c.more)), Some((5, false)));
    let none = store
        .browse_jobs(JobSearch {
            text: Some("nothing".to_owned()),
            ..search()
        })
        .await
        .unwrap();
    assert!(none.is_empty());
}

#[tokio::test]
async fn counts_every_status_under_the_filter() {
    let (store, _clock, _dir) = store_with_jobs().await;
    let filter = JobSearch {
        workflow: Some("one".to_owned()),
        status: Some(JobStatus::Failed),
        ..search()
    };
    let counts = store.job_counts(filter.clone(), 10).await.unwrap();
    assert_eq!(counts.len(), JobStatus::ALL.len());
    for count in counts {
        let expected = if count.status == JobStatus::Running {
            3
        } else {
            0
        };
        assert_eq!(
            (count.count, count.more),
            (expected, false),
            "{}",
            count.status
        );
    }
    // Up to the cap the count is exact; past it, it says so.
    let running = |counts: Vec<StatusCount>| {
        counts
            .into_iter()
            .find(|c| c.status == JobStatus::Running)
            .map(|c| (c.count, c.more))
    };
    let at_cap = store.job_counts(filter.clone(), 3).await.unwrap();
    assert_eq!(running(at_cap), Some((3, false)));
    let past_cap = store.job_counts(filter, 2).await.unwrap();
    assert_eq!(running(past_cap), Some((2, true)));
}

#[tokio::test]
async fn worker_loads_name_the_workers_holding_running_tasks() {
    let (store, _clock, _dir) = store_with_jobs().await;
    store
        .claim("default", vec!["q".to_owned()], "w1", 2)
        .await
        .unwrap();
    let loads = store.worker_loads("default").await.unwrap();
    assert_eq!(
        loads,
        [WorkerLoad {
            worker: "w1".to_owned(),
            queue: "q".to_owned(),
            running: 2,
        }]
    );
}
