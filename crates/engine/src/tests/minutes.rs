//! The dashboard's per-minute rows (`starbridge_store::minutes`) of a known load, rolled up by
//! the engine's rollup step.

use serde_json::json;
use starbridge_core::time::{Duration, Timestamp};
use starbridge_store::minutes::{MinuteRow, SeriesKind, minute_of};

use super::{Fixture, complete, definition, report_failure, submit};
use crate::ROLLUP_LAG;

const ONE_STEP: &str = "steps:\n- {id: a, queue: q, command: c}\n";

fn row<'a>(rows: &'a [MinuteRow], kind: SeriesKind, name: &str) -> &'a MinuteRow {
    let found: Vec<&MinuteRow> = rows
        .iter()
        .filter(|row| row.kind == kind && row.name == name)
        .collect();
    assert_eq!(found.len(), 1, "one minute of {name}: {rows:?}");
    found[0]
}

async fn a_known_load_rolls_up_into_counts_durations_and_queue_samples(f: Fixture) {
    f.store
        .apply_workflow("default", "one", definition(ONE_STEP))
        .await
        .unwrap();
    let start = f.store.now();
    for _ in 0..5 {
        submit(&f.store, "one", json!({})).await;
    }
    let claimed = f
        .store
        .claim("default", vec!["q".into()], "w1", 4)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 4);
    f.clock.advance(Duration::from_millis(40));
    complete(&f.store, &claimed[0], json!({})).await.unwrap();
    complete(&f.store, &claimed[1], json!({})).await.unwrap();
    f.clock.advance(Duration::from_millis(60));
    report_failure(&f.store, &claimed[2], "broken", false).await;
    f.clock.advance(Duration::from_millis(2_400));
    complete(&f.store, &claimed[3], json!({})).await.unwrap();

    assert_eq!(
        f.store.roll_up().await.unwrap(),
        0,
        "events younger than the lag wait"
    );
    let sampled = f.store.minutes("default", Timestamp(0)).await.unwrap();
    let queue = row(&sampled, SeriesKind::Queue, "q");
    assert_eq!(
        queue.figures.depth,
        Some(1),
        "the fifth job's task is ready"
    );
    assert_eq!(
        queue.figures.oldest_wait,
        Some(Duration::from_millis(2_500))
    );
    assert_eq!(queue.figures.started, 0);

    f.clock
        .advance(Duration::from_millis(ROLLUP_LAG.as_millis() + 1));
    // Every event of the history is read past the watermark; 13 of the 15 count (5 jobs
    // started, 3 + 3 successes and 1 + 1 failures, the 4 tasks' starts carried by the events
    // that ended their runs), the failed job's 2 other events do not.
    assert_eq!(f.store.roll_up().await.unwrap(), 15);
    assert_eq!(
        f.store.roll_up().await.unwrap(),
        0,
        "nothing is counted twice"
    );

    let rows = f.store.minutes("default", Timestamp(0)).await.unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    let workflow = row(&rows, SeriesKind::Workflow, "one");
    assert_eq!(workflow.minute, minute_of(start));
    let figures = &workflow.figures;
    assert_eq!(
        (figures.started, figures.succeeded, figures.failed),
        (5, 3, 1)
    );
    assert_eq!(figures.durations.count(), 4);
    assert_eq!(figures.durations.percentile(0.5), Some(50), "40 ms twice");
    assert_eq!(figures.durations.percentile(0.95), Some(3_000), "2.5 s");
    let queue = &row(&rows, SeriesKind::Queue, "q").figures;
    assert_eq!((queue.started, queue.succeeded, queue.failed), (4, 3, 1));
    assert_eq!(
        queue.durations.percentile(0.75),
        Some(130),
        "the failure at 100 ms"
    );
    assert_eq!(queue.depth, Some(1), "the sample is kept");

    assert!(
        f.store
            .minutes(
                "default",
                minute_of(start).saturating_add(Duration::from_secs(60))
            )
            .await
            .unwrap()
            .is_empty(),
        "rows before `since` are left out"
    );
    assert!(
        f.store
            .minutes("other", Timestamp(0))
            .await
            .unwrap()
            .is_empty()
    );
}

on_both_backends!(a_known_load_rolls_up_into_counts_durations_and_queue_samples);
