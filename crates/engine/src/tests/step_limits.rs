//! Steps' locks and per-key rates through the engine, on both backends: slots held from claim
//! to the end of the attempt and handed to parked tasks first come first served, parked tasks
//! out of the claim order, re-entrance along a job's own lock, and token buckets per key.

use serde_json::{Value, json};
use starbridge_core::dispatch::task_waiting_reason;
use starbridge_core::ids::JobId;
use starbridge_core::model::{Input, JobStatus, TaskStatus};

use crate::TaskScope;
use starbridge_core::time::Duration;

use super::{Fixture, Store, claim_n, complete, definition, fail, submit};

async fn apply(store: &Store, name: &str, yaml: &str) {
    store
        .apply_workflow("default", name, definition(yaml))
        .await
        .unwrap();
}

/// Why the job's only task waits, as an operator reads it.
async fn waiting_reason(store: &Store, job: &JobId) -> Option<String> {
    let state = store.job("default", job).await.unwrap().unwrap();
    let task = &state.tasks[0];
    task_waiting_reason(task, &[], None, store.now())
}

async fn task_status(store: &Store, job: &JobId) -> TaskStatus {
    store.job("default", job).await.unwrap().unwrap().tasks[0].status
}

const LOCKED_STEP: &str = "steps:\n- {id: a, queue: q, command: c, lock: {key: 'db-${{ params.db }}', slots: 2}, retry: {max_attempts: 2, initial: 1s}}\n";

async fn a_step_lock_runs_its_slots_parks_the_rest_and_hands_freed_slots_in_arrival_order(
    f: Fixture,
) {
    apply(&f.store, "locked", LOCKED_STEP).await;
    let mut jobs = Vec::new();
    for db in ["x", "x", "x", "x", "y"] {
        jobs.push(
            submit(&f.store, "locked", json!({"db": db}))
                .await
                .state
                .job
                .id,
        );
    }
    let claimed = claim_n(&f.store, &["q"], 10).await;
    let mut running: Vec<&JobId> = claimed.iter().map(|c| &c.task.job_id).collect();
    running.sort();
    assert_eq!(
        running,
        [&jobs[0], &jobs[1], &jobs[4]],
        "2 slots of db-x, 1 of db-y"
    );
    for parked in &jobs[2..4] {
        assert_eq!(task_status(&f.store, parked).await, TaskStatus::Ready);
        assert_eq!(
            waiting_reason(&f.store, parked).await.as_deref(),
            Some("waiting for lock db-x (2/2 held)")
        );
    }
    assert!(
        claim_n(&f.store, &["q"], 10).await.is_empty(),
        "parked tasks are not handed out"
    );

    // A failed attempt frees its slot between retries: the slot goes to the oldest waiter, and
    // the retry waits in line behind the other.
    let first = claimed.iter().find(|c| c.task.job_id == jobs[0]).unwrap();
    fail(&f.store, first, "broke").await;
    let granted = waiting_reason(&f.store, &jobs[2]).await.unwrap_or_default();
    assert!(!granted.starts_with("waiting for lock"), "{granted}");
    let next = claim_n(&f.store, &["q"], 10).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].task.job_id, jobs[2]);
    f.clock.advance(Duration::from_secs(2));
    assert!(
        claim_n(&f.store, &["q"], 10).await.is_empty(),
        "the retry parks behind the job that waited before it"
    );

    // A success frees the slot too.
    let second = claimed.iter().find(|c| c.task.job_id == jobs[1]).unwrap();
    complete(&f.store, second, Value::Null).await.unwrap();
    let after = claim_n(&f.store, &["q"], 10).await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].task.job_id, jobs[3]);
    assert_eq!(f.store.lock_usage("default", "db-x").await.unwrap(), 2);
}

async fn a_check_later_gap_keeps_the_attempts_slot_and_its_token(f: Fixture) {
    apply(
        &f.store,
        "locked",
        "steps:\n- {id: a, queue: q, command: c, lock: {key: one}, rate: {key: r, limit: 1/1h}}\n",
    )
    .await;
    let first = submit(&f.store, "locked", json!({})).await.state.job.id;
    let claimed = claim_n(&f.store, &["q"], 1).await.remove(0);
    f.store
        .report(
            claimed.task.id.clone(),
            Input::CheckLater {
                task: claimed.task.id.clone(),
                lease_token: claimed.task.lease_token.clone().unwrap(),
                after: Duration::from_secs(5),
                progress: None,
            },
            TaskScope::default(),
        )
        .await
        .unwrap();
    assert_eq!(f.store.lock_usage("default", "one").await.unwrap(), 1);
    let second = submit(&f.store, "locked", json!({})).await.state.job.id;
    assert!(claim_n(&f.store, &["q"], 1).await.is_empty());
    assert_eq!(
        waiting_reason(&f.store, &second).await.as_deref(),
        Some("waiting for lock one (1/1 held)")
    );
    f.clock.advance(Duration::from_secs(5));
    let checked = claim_n(&f.store, &["q"], 1).await;
    assert_eq!(
        checked.len(),
        1,
        "the same attempt goes on, with no new slot or token"
    );
    assert_eq!(checked[0].task.job_id, first);
    assert_eq!(checked[0].task.attempt, 1);
    assert_eq!(f.store.lock_usage("default", "one").await.unwrap(), 1);
}

async fn a_poll_claims_a_free_task_behind_any_number_of_parked_ones(f: Fixture) {
    apply(
        &f.store,
        "locked",
        "steps:\n- {id: a, queue: q, command: c, lock: {key: shared}}\n",
    )
    .await;
    apply(
        &f.store,
        "free",
        "steps:\n- {id: a, queue: q, command: c}\n",
    )
    .await;
    let holder = submit(&f.store, "locked", json!({})).await.state.job.id;
    assert_eq!(claim_n(&f.store, &["q"], 1).await[0].task.job_id, holder);
    for _ in 0..300 {
        submit(&f.store, "locked", json!({})).await;
    }
    let free = submit(&f.store, "free", json!({})).await.state.job.id;
    let claimed = claim_n(&f.store, &["q"], 1).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].task.job_id, free);
    assert!(claim_n(&f.store, &["q"], 1).await.is_empty());
}

async fn a_step_lock_held_by_the_jobs_own_workflow_lock_takes_no_slot(f: Fixture) {
    apply(
        &f.store,
        "nested",
        "lock: {key: 'db-${{ params.db }}'}\nsteps:\n- {id: a, queue: q, command: c, lock: {key: 'db-${{ params.db }}'}}\n",
    )
    .await;
    let job = submit(&f.store, "nested", json!({"db": "x"}))
        .await
        .state
        .job
        .id;
    let claimed = claim_n(&f.store, &["q"], 1).await;
    assert_eq!(claimed.len(), 1, "the job's own slot covers its step");
    assert_eq!(claimed[0].task.job_id, job);
    assert_eq!(f.store.lock_usage("default", "db-x").await.unwrap(), 1);
}

async fn a_step_rate_limits_each_key_on_its_own_and_parked_tasks_start_as_it_refills(f: Fixture) {
    apply(
        &f.store,
        "rated",
        "steps:\n- {id: a, queue: q, command: c, rate: {key: '${{ params.tenant }}', limit: 2/1m}}\n",
    )
    .await;
    let mut jobs = Vec::new();
    for tenant in ["a", "a", "a", "b", "b"] {
        jobs.push(
            submit(&f.store, "rated", json!({"tenant": tenant}))
                .await
                .state
                .job
                .id,
        );
    }
    let claimed = claim_n(&f.store, &["q"], 10).await;
    let mut started: Vec<&JobId> = claimed.iter().map(|c| &c.task.job_id).collect();
    started.sort();
    assert_eq!(started, [&jobs[0], &jobs[1], &jobs[3], &jobs[4]]);
    assert_eq!(
        waiting_reason(&f.store, &jobs[2]).await.as_deref(),
        Some("rate limited on key a (2 per 1m)")
    );
    f.clock.advance(Duration::from_secs(29));
    f.store.tick().await.unwrap();
    assert!(
        claim_n(&f.store, &["q"], 10).await.is_empty(),
        "no token yet"
    );
    f.clock.advance(Duration::from_secs(1));
    f.store.tick().await.unwrap();
    let refilled = claim_n(&f.store, &["q"], 10).await;
    assert_eq!(refilled.len(), 1, "one token in 30s at 2 per minute");
    assert_eq!(refilled[0].task.job_id, jobs[2]);
}

async fn a_step_rate_bucket_is_pruned_once_it_refilled(f: Fixture) {
    apply(
        &f.store,
        "rated",
        "steps:\n- {id: a, queue: q, command: c, rate: {key: k, limit: {tokens: 1, per: 10s}}}\n",
    )
    .await;
    submit(&f.store, "rated", json!({})).await;
    assert_eq!(claim_n(&f.store, &["q"], 10).await.len(), 1);
    assert_eq!(f.store.prune_rate_buckets().await.unwrap(), 0);
    f.clock.advance(Duration::from_secs(10));
    assert_eq!(f.store.prune_rate_buckets().await.unwrap(), 1);
}

async fn a_sub_workflow_steps_lock_is_held_by_its_child_for_the_childs_run(f: Fixture) {
    apply(
        &f.store,
        "child",
        "steps:\n- {id: work, queue: q, command: c}\n",
    )
    .await;
    apply(
        &f.store,
        "parent",
        "steps:\n- {id: run, workflow: child, lock: {key: 'db-${{ params.db }}'}}\n",
    )
    .await;
    let first = submit(&f.store, "parent", json!({"db": "x"}))
        .await
        .state
        .job
        .id;
    let second = submit(&f.store, "parent", json!({"db": "x"}))
        .await
        .state
        .job
        .id;
    let child_of = |state: &starbridge_core::model::JobState| {
        state.tasks[0].child.as_deref().cloned().unwrap()
    };
    let first_child = child_of(&f.store.job("default", &first).await.unwrap().unwrap());
    let second_child = child_of(&f.store.job("default", &second).await.unwrap().unwrap());
    let status = async |id: &JobId| {
        f.store
            .job("default", id)
            .await
            .unwrap()
            .unwrap()
            .job
            .status
    };
    assert_eq!(status(&first_child).await, JobStatus::Running);
    assert_eq!(
        status(&second_child).await,
        JobStatus::Queued,
        "the slot is held"
    );
    assert_eq!(f.store.lock_usage("default", "db-x").await.unwrap(), 1);

    // The child's run is the step's attempt: its end frees the slot for the next child.
    let work = claim_n(&f.store, &["q"], 10).await;
    assert_eq!(work.len(), 1);
    assert_eq!(work[0].task.job_id, first_child);
    complete(&f.store, &work[0], Value::Null).await.unwrap();
    assert_eq!(status(&second_child).await, JobStatus::Running);
    assert_eq!(f.store.lock_usage("default", "db-x").await.unwrap(), 1);
}

on_both_backends!(
    a_check_later_gap_keeps_the_attempts_slot_and_its_token,
    a_step_lock_runs_its_slots_parks_the_rest_and_hands_freed_slots_in_arrival_order,
    a_poll_claims_a_free_task_behind_any_number_of_parked_ones,
    a_step_lock_held_by_the_jobs_own_workflow_lock_takes_no_slot,
    a_step_rate_limits_each_key_on_its_own_and_parked_tasks_start_as_it_refills,
    a_step_rate_bucket_is_pruned_once_it_refilled,
    a_sub_workflow_steps_lock_is_held_by_its_child_for_the_childs_run,
);
