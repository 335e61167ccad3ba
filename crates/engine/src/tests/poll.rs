//! A worker's poll carrying its completions (`Engine::poll`): they commit with the claim, in
//! order, each answered as its own report, and a success sent again is answered as before.

use super::*;

const CHAIN: &str = "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: q, command: c}\n";

/// Applies `wf` in `default`: steps `a`, then `b`, on queue `q`.
pub(super) async fn apply_chain(store: &Store) {
    let applied = store.apply_workflow("default", "wf", definition(CHAIN));
    applied.await.unwrap();
}

fn poll_of(max: u32) -> Poll {
    Poll {
        namespace: "default".into(),
        queues: vec!["q".into()],
        worker: "w1".into(),
        max,
        wait: std::time::Duration::ZERO,
    }
}

/// The success of `claimed` under `lease_token`, as a poll or a batch carries it.
pub(super) fn completion(claimed: &Claimed, lease_token: &str, output: Value) -> (TaskId, Input) {
    let task = claimed.task.id.clone();
    let input = Input::Complete {
        task: task.clone(),
        lease_token: lease_token.to_owned(),
        output,
        logs: None,
    };
    (task, input)
}

/// The lease token `claimed` was handed.
pub(super) fn token(claimed: &Claimed) -> String {
    claimed.task.lease_token.clone().unwrap()
}

/// A poll for one task that carries the success of `claimed` under its own lease token.
async fn poll_completing(store: &Store, claimed: &Claimed, output: Value) -> Polled {
    let reports = vec![completion(claimed, &token(claimed), output)];
    let scope = TaskScope::default();
    store.poll(&poll_of(1), reports, &scope).await.unwrap()
}

async fn a_poll_commits_its_completions_in_order_with_its_claim_which_takes_what_they_made_ready(
    f: Fixture,
) {
    apply_chain(&f.store).await;
    let first = submit(&f.store, "wf", json!({})).await.state.job.id;
    let second = submit(&f.store, "wf", json!({})).await.state.job.id;
    let mut claimed = f
        .store
        .claim("default", vec!["q".into()], "w1", 2)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    claimed.sort_by_key(|claimed| claimed.task.job_id != first);
    let (of_first, of_second) = (&claimed[0], &claimed[1]);
    let unknown = TaskId::from_unique("nope");
    let reports = vec![
        completion(of_first, &token(of_first), json!({"n": 1})),
        completion(of_second, "stale", json!({})),
        (
            unknown.clone(),
            Input::Complete {
                task: unknown,
                lease_token: "t".into(),
                output: json!({}),
                logs: None,
            },
        ),
    ];
    let before = f.store.writer_stats();
    let polled = f
        .store
        .poll(&poll_of(4), reports, &TaskScope::default())
        .await
        .unwrap();
    let after = f.store.writer_stats();
    assert_eq!(
        (
            after.commits - before.commits,
            after.requests - before.requests
        ),
        (1, 4),
        "the three reports and the claim share one group transaction"
    );
    assert_eq!(polled.reports.len(), 3);
    let done = polled.reports[0].as_ref().unwrap();
    assert_eq!(done.task.status, TaskStatus::Succeeded);
    assert_eq!(done.job_status, JobStatus::Running);
    assert!(matches!(polled.reports[1], Err(Error::Conflict(_))));
    assert!(matches!(polled.reports[2], Err(Error::NotFound(_))));
    let steps: Vec<(&JobId, &str)> = polled
        .claimed
        .iter()
        .map(|claimed| (&claimed.task.job_id, claimed.task.step.as_str()))
        .collect();
    assert_eq!(
        steps,
        [(&first, "b")],
        "the claim sees the completion made before it"
    );
    let stored = f.store.job("default", &first).await.unwrap().unwrap();
    assert_eq!(stored.tasks[0].status, TaskStatus::Succeeded);
    assert_eq!(stored.tasks[0].output, Some(json!({"n": 1})));
    let untouched = f.store.job("default", &second).await.unwrap().unwrap();
    assert_eq!(untouched.tasks[0].status, TaskStatus::Running);
}

async fn a_success_sent_again_under_its_lease_is_answered_as_before_and_changes_nothing(
    f: Fixture,
) {
    apply_chain(&f.store).await;
    let job = submit(&f.store, "wf", json!({})).await.state.job.id;
    let a = claim_one(&f.store).await;
    let first = poll_completing(&f.store, &a, json!({"n": 1})).await;
    let b = &first.claimed[0];
    let events = |store: &Store| {
        let (store, job) = (store.clone(), job.clone());
        async move {
            let events = store.events("default", &job, 0, 1000).await.unwrap();
            events.unwrap().len()
        }
    };
    let recorded = events(&f.store).await;
    // The poll's answer was lost: the worker sends the same success again, with the poll and
    // on its own, and then under another token.
    let again = poll_completing(&f.store, &a, json!({"n": 2})).await;
    let repeated = again.reports[0].as_ref().unwrap();
    assert_eq!(
        (repeated.task.status, repeated.job_status),
        (TaskStatus::Succeeded, JobStatus::Running)
    );
    assert!(again.claimed.is_empty(), "b is still leased");
    let alone = complete(&f.store, &a, json!({"n": 3})).await.unwrap();
    assert_eq!(alone.task.status, TaskStatus::Succeeded);
    let batched = f
        .store
        .report_many(
            vec![completion(&a, "another", json!({}))],
            TaskScope::default(),
        )
        .await;
    assert!(matches!(batched[0], Err(Error::Conflict(_))), "{batched:?}");
    assert_eq!(events(&f.store).await, recorded, "nothing was written");
    let stored = f.store.job("default", &job).await.unwrap().unwrap();
    assert_eq!(
        stored.tasks[0].output,
        Some(json!({"n": 1})),
        "the first success stays"
    );
    // Once the job ended, the last success sent again is still answered as it was.
    complete(&f.store, b, json!({})).await.unwrap();
    let late = complete(&f.store, b, json!({})).await.unwrap();
    assert_eq!(
        (late.task.status, late.job_status),
        (TaskStatus::Succeeded, JobStatus::Succeeded)
    );
}

/// Starts a poll of worker `worker` for one task of `q` that waits up to a minute, once its
/// claim found nothing and is parked.
async fn waiting_poll(store: &Store, worker: &str) -> tokio::task::JoinHandle<Result<Polled>> {
    let waiting = Poll {
        wait: std::time::Duration::from_secs(60),
        worker: worker.into(),
        ..poll_of(1)
    };
    let poll = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .poll(&waiting, Vec::new(), &TaskScope::default())
                .await
        })
    };
    while store.inner.writer.parked_claims("default", "q") == 0 {
        tokio::task::yield_now().await;
    }
    poll
}

/// A poll that found nothing parks its next claim, and the group transaction that makes work
/// ready on its queue runs that claim: the worker gets the task without a group of its own.
async fn a_waiting_poll_is_handed_work_by_the_group_transaction_that_made_it_ready(f: Fixture) {
    apply_chain(&f.store).await;
    let poll = waiting_poll(&f.store, "w2").await;
    let before = f.store.writer_stats();
    let job = submit(&f.store, "wf", json!({})).await.state.job.id;
    let polled = poll.await.unwrap().unwrap();
    let after = f.store.writer_stats();
    let steps: Vec<(&JobId, &str)> = polled
        .claimed
        .iter()
        .map(|claimed| (&claimed.task.job_id, claimed.task.step.as_str()))
        .collect();
    assert_eq!(steps, [(&job, "a")]);
    assert_eq!(
        (
            after.commits - before.commits,
            after.requests - before.requests
        ),
        (1, 2),
        "the submit and the waiting poll's claim share one group transaction"
    );
    assert_eq!(f.store.inner.writer.parked_claims("default", "q"), 0);
}

/// A group transaction hands parked claims only the work its own claims may not take: a poll
/// carrying a success takes the next step it made ready, and the waiting poll stays parked
/// (not even woken: the group's claim took every ready task, though it asked for no more than
/// it found).
async fn a_group_whose_own_claims_take_the_work_it_made_ready_leaves_waiting_polls_parked(
    f: Fixture,
) {
    apply_chain(&f.store).await;
    submit(&f.store, "wf", json!({})).await;
    let a = claim_one(&f.store).await;
    let poll = waiting_poll(&f.store, "w2").await;
    let before = f.store.writer_stats();
    let polled = poll_completing(&f.store, &a, json!({})).await;
    let after = f.store.writer_stats();
    assert_eq!(polled.claimed[0].task.step, "b");
    assert_eq!(
        after.requests - before.requests,
        2,
        "the success and its poll's claim, not the waiting poll's"
    );
    assert_eq!(f.store.inner.writer.parked_claims("default", "q"), 1);
    poll.abort();
}

/// Whether a poll registered on `registered` was woken (its permit is stored).
async fn woken(registered: &tokio::sync::Notify) -> bool {
    tokio::time::timeout(std::time::Duration::ZERO, registered.notified())
        .await
        .is_ok()
}

/// A queue whose ready tasks the group's claims all took is not woken (a poll woken then would
/// find nothing); work left behind, or ready only later, wakes it.
async fn polls_are_woken_only_for_work_the_group_left_behind_or_made_ready_for_later(f: Fixture) {
    apply_chain(&f.store).await;
    submit(&f.store, "wf", json!({})).await;
    let a = claim_one(&f.store).await;
    let queues = ["q".to_owned()];
    let registered = f.store.notifier().register("default", &queues);
    let polled = poll_completing(&f.store, &a, json!({})).await;
    assert_eq!(polled.claimed.len(), 1);
    assert_eq!(polled.claimed[0].task.step, "b");
    assert!(
        !woken(&registered).await,
        "the poll's own claim for one took b, the only ready task"
    );

    submit(&f.store, "wf", json!({})).await;
    assert!(woken(&registered).await, "nobody claimed the new job's a");

    // Two ready tasks, a claim for one: the other is left behind.
    let second_a = claim_one(&f.store).await;
    submit(&f.store, "wf", json!({})).await;
    let registered = f.store.notifier().register("default", &queues);
    let polled = poll_completing(&f.store, &second_a, json!({})).await;
    assert_eq!(polled.claimed.len(), 1);
    assert!(
        woken(&registered).await,
        "the claim for one left the third job's a or the second job's b behind"
    );

    // Work ready only later: a retry due in 30 s.
    claim_one(&f.store).await;
    let applied = f
        .store
        .apply_workflow("default", "retrying", definition(TWO_STEPS));
    applied.await.unwrap();
    submit(&f.store, "retrying", json!({})).await;
    let retried = f
        .store
        .claim("default", vec!["q".into()], "w1", 1)
        .await
        .unwrap();
    let registered = f.store.notifier().register("default", &queues);
    let failed = Input::Fail {
        task: retried[0].task.id.clone(),
        lease_token: token(&retried[0]),
        error: ReportedError {
            message: "try again".into(),
            retryable: true,
            retry_after: Some(starbridge_core::time::Duration::from_secs(30)),
        },
        logs: None,
    };
    let reports = vec![(retried[0].task.id.clone(), failed)];
    let polled = f
        .store
        .poll(&poll_of(2), reports, &TaskScope::default())
        .await
        .unwrap();
    assert!(polled.claimed.is_empty(), "the retry is due in 30 s");
    assert!(
        woken(&registered).await,
        "a poll waits for the retry's time"
    );
}

on_both_backends!(
    polls_are_woken_only_for_work_the_group_left_behind_or_made_ready_for_later,
    a_waiting_poll_is_handed_work_by_the_group_transaction_that_made_it_ready,
    a_group_whose_own_claims_take_the_work_it_made_ready_leaves_waiting_polls_parked,
    a_poll_commits_its_completions_in_order_with_its_claim_which_takes_what_they_made_ready,
    a_success_sent_again_under_its_lease_is_answered_as_before_and_changes_nothing,
);
