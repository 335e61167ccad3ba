//! Claims of one group transaction (`commands::claim::shared`): they run after the group's other
//! requests, those of the same queues one after another, and share one read of the ready tasks
//! without handing out a task twice or out of dispatch order.

use super::poll::{apply_chain, completion, token};
use super::*;

/// Queues `claims` (queues, max) together after `reports`, as several workers' polls arriving
/// while a commit is in flight land in one group, and returns what each claim took.
async fn claims_in_one_group(
    store: &Store,
    claims: &[(&[&str], u32)],
    reports: Vec<(TaskId, Input)>,
) -> Vec<Vec<Claimed>> {
    let mut together = writer::Together::default();
    // The claims are queued first: the writer runs them last all the same.
    let pending: Vec<_> = claims
        .iter()
        .enumerate()
        .map(|(n, (queues, max))| {
            let queues = queues.iter().map(|q| (*q).to_owned()).collect();
            Engine::claim_in(&mut together, "default", queues, &format!("w{n}"), *max)
        })
        .collect();
    let reported = Engine::reports_in(&mut together, reports, &TaskScope::default());
    assert!(store.inner.writer.send(together));
    for answer in Engine::report_answers(reported).await {
        answer.unwrap();
    }
    let mut taken = Vec::new();
    for claim in pending {
        taken.push(claim.answer().await.unwrap());
    }
    taken
}

fn jobs_of(claimed: &[Claimed]) -> Vec<JobId> {
    claimed.iter().map(|c| c.task.job_id.clone()).collect()
}

async fn claims_of_one_group_take_what_its_reports_made_ready_in_dispatch_order_and_none_twice(
    f: Fixture,
) {
    let applied = f
        .store
        .apply_workflow("default", "wf", definition(TWO_STEPS));
    applied.await.unwrap();
    let urgent = f.store.submit(
        "default",
        Submit {
            workflow: Some("wf".into()),
            priority: Some(10),
            ..Submit::default()
        },
    );
    let urgent = urgent.await.unwrap().state.job.id;
    let first = claim_one(&f.store).await;
    assert_eq!(first.task.job_id, urgent);
    let mut others = Vec::new();
    for _ in 0..5 {
        f.clock.advance(Duration::from_millis(1));
        others.push(submit(&f.store, "wf", json!({})).await.state.job.id);
    }
    let taken = claims_in_one_group(
        &f.store,
        &[(&["q"], 2), (&["q"], 2), (&["q"], 2), (&["q"], 2)],
        vec![completion(&first, &token(&first), json!({}))],
    )
    .await;
    // The success ran first, though queued after the claims: the first claim takes the urgent
    // job's second step, then the others' first steps oldest first, each once.
    let mut expected = vec![urgent];
    expected.extend(others);
    assert_eq!(jobs_of(&taken[0]), expected[..2]);
    assert_eq!(jobs_of(&taken[1]), expected[2..4]);
    assert_eq!(jobs_of(&taken[2]), expected[4..6]);
    assert!(taken[3].is_empty(), "six ready tasks for eight claimed");
    assert_eq!(taken[0][0].task.step, "b");
}

async fn claims_of_other_queues_in_one_group_never_hand_out_a_task_twice(f: Fixture) {
    for (workflow, queue) in [("wq", "q"), ("wr", "r")] {
        let yaml = format!("steps:\n- {{id: a, queue: {queue}, command: c}}\n");
        let applied = f
            .store
            .apply_workflow("default", workflow, definition(&yaml));
        applied.await.unwrap();
    }
    // Oldest first: q1, r1, q2, r2, ...
    for _ in 0..6 {
        for workflow in ["wq", "wr"] {
            f.clock.advance(Duration::from_millis(1));
            submit(&f.store, workflow, json!({})).await;
        }
    }
    let taken = claims_in_one_group(
        &f.store,
        &[
            (&["q"], 3),
            (&["q", "r"], 4),
            (&["q"], 3),
            (&["r"], 2),
            (&["q", "r"], 10),
        ],
        Vec::new(),
    )
    .await;
    let counts: Vec<usize> = taken.iter().map(Vec::len).collect();
    assert_eq!(
        counts.iter().sum::<usize>(),
        12,
        "every ready task: {counts:?}"
    );
    let mut seen = HashSet::new();
    for claimed in taken.iter().flatten() {
        assert!(
            seen.insert(claimed.task.id.clone()),
            "a task was claimed twice"
        );
    }
    // Claims of the same queues run one after another, `[q]` first: q1-q3, q4-q6; then those of
    // `[q, r]`, oldest first: r1-r4, r5 and r6; `[r]` finds nothing left.
    assert_eq!(counts, [3, 4, 3, 0, 2]);
    let queues: Vec<&str> = taken[1].iter().map(|c| c.task.queue.as_str()).collect();
    assert_eq!(queues, ["r", "r", "r", "r"]);
}

async fn a_polls_claim_after_its_own_reports_takes_what_they_made_ready_before_a_waiting_poll(
    f: Fixture,
) {
    apply_chain(&f.store).await;
    let job = submit(&f.store, "wf", json!({})).await.state.job.id;
    let first = claim_one(&f.store).await;
    // A waiting poll's claim arrives first; then a poll carrying the success, and its claim,
    // in the same group.
    let mut together = writer::Together::default();
    let waiting = Engine::claim_in(&mut together, "default", vec!["q".into()], "w0", 1);
    let reported = Engine::reports_in(
        &mut together,
        vec![completion(&first, &token(&first), json!({}))],
        &TaskScope::default(),
    );
    let reporting = Engine::claim_in(&mut together, "default", vec!["q".into()], "w1", 1);
    assert!(f.store.inner.writer.send(together));
    for answer in Engine::report_answers(reported).await {
        answer.unwrap();
    }
    assert_eq!(jobs_of(&reporting.answer().await.unwrap()), [job]);
    assert!(waiting.answer().await.unwrap().is_empty());
}

on_both_backends!(
    claims_of_one_group_take_what_its_reports_made_ready_in_dispatch_order_and_none_twice,
    claims_of_other_queues_in_one_group_never_hand_out_a_task_twice,
    a_polls_claim_after_its_own_reports_takes_what_they_made_ready_before_a_waiting_poll,
);
