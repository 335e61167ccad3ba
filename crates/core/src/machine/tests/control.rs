//! `set` and `fail` steps, `continue_on_failure` and the workflow's `output`, in the state
//! machine.

use serde_json::json;

use super::Sim;
use crate::limits::Limits;
use crate::model::{
    ErrorKind, EventKind, JobStatus, OperatorAction, TaskKind, TaskStatus, WindDown,
};

#[test]
fn a_set_step_succeeds_at_once_with_its_rendered_object() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c}\n- {id: summary, set: {count: '${{ len(steps.a.output) }}', cluster: '${{ params.cluster }}'}}\n- {id: b, queue: q, command: c, input: '${{ steps.summary.output }}'}\n",
        json!({"cluster": "eu-1"}),
    );
    sim.complete("a", json!([1, 2, 3]));
    let summary = sim.find("summary", TaskKind::Step);
    assert_eq!(summary.status, TaskStatus::Succeeded);
    assert_eq!(summary.output, Some(json!({"count": 3, "cluster": "eu-1"})));
    assert_eq!(summary.attempt, 0, "no worker ran it");
    assert_eq!(
        sim.find("b", TaskKind::Step).input,
        Some(json!({"count": 3, "cluster": "eu-1"}))
    );
}

#[test]
fn a_set_step_over_the_size_limit_fails_naming_the_setting() {
    let limits = Limits {
        task_bytes: 64,
        ..Limits::default()
    };
    let mut sim = Sim::with_limits(
        "steps:\n- {id: big, set: {text: '${{ params.text }}'}}\n",
        json!({"text": "x".repeat(100)}),
        limits,
    );
    let task = sim.find("big", TaskKind::Step);
    assert_eq!(task.status, TaskStatus::Failed);
    let error = task.error.clone().unwrap();
    assert_eq!(error.kind, ErrorKind::Expression);
    assert!(
        error.message.contains("rendered output"),
        "{}",
        error.message
    );
    assert!(
        error.message.contains("--max-task-bytes"),
        "{}",
        error.message
    );
    sim.apply(crate::model::Input::Tick).unwrap();
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn a_fan_out_set_renders_one_output_per_item() {
    let sim = Sim::new(
        "steps:\n- {id: each, for_each: '${{ params.hosts }}', set: {host: '${{ item }}', at: '${{ index }}'}}\n",
        json!({"hosts": ["a", "b"]}),
    );
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
    assert_eq!(
        sim.find("each", TaskKind::FanOut).output,
        Some(json!([{"host": "a", "at": 0}, {"host": "b", "at": 1}]))
    );
}

#[test]
fn a_fail_step_fails_the_job_with_its_message_and_compensation_runs() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, compensate: {queue: q, command: undo}}\n- {id: guard, when: '${{ steps.a.output.count == 0 }}', fail: {message: 'no shard migrated for ${{ params.cluster }}'}}\n- {id: b, queue: q, command: c}\n",
        json!({"cluster": "eu-1"}),
    );
    sim.complete("a", json!({"count": 0}));
    let guard = sim.find("guard", TaskKind::Step);
    assert_eq!(guard.status, TaskStatus::Failed);
    let error = guard.error.clone().unwrap();
    assert_eq!(error.message, "no shard migrated for eu-1");
    assert_eq!(error.kind, ErrorKind::FailStep);
    assert!(!error.retryable);
    assert_eq!(sim.status("b"), TaskStatus::Cancelled);
    assert_eq!(sim.state.job.status, JobStatus::Compensating);
    assert!(matches!(
        &sim.state.job.wind_down,
        Some(WindDown::StepFailed { step, message, .. }) if step == "guard" && message == "no shard migrated for eu-1"
    ));
    sim.complete("a", json!({}));
    assert_eq!(sim.compensation_order(), ["a"]);
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn a_fail_step_whose_condition_is_false_is_skipped() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c}\n- {id: guard, when: '${{ steps.a.output.count == 0 }}', fail: {}}\n- {id: b, queue: q, command: c, depends_on: [a, guard]}\n",
        json!({}),
    );
    sim.complete("a", json!({"count": 2}));
    assert_eq!(sim.status("guard"), TaskStatus::Skipped);
    sim.complete("b", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
}

#[test]
fn a_continued_failure_lets_dependants_read_it_and_the_job_succeeds_naming_it() {
    let mut sim = Sim::new(
        "steps:\n- {id: notify, queue: q, command: page, continue_on_failure: true, compensate: {queue: q, command: unpage}}\n- {id: fallback, when: \"${{ steps.notify.status == 'failed' }}\", queue: q, command: email, input: {why: '${{ steps.notify.error.message }}', kind: '${{ steps.notify.error.kind }}', out: '${{ steps.notify.output }}'}}\n- {id: audit, depends_on: [notify], queue: q, command: c}\n",
        json!({}),
    );
    sim.fail("notify", false);
    assert_eq!(sim.status("notify"), TaskStatus::Failed);
    assert_eq!(sim.state.job.status, JobStatus::Running);
    assert_eq!(
        sim.find("fallback", TaskKind::Step).input,
        Some(json!({"why": "notify broke", "kind": "handler", "out": null}))
    );
    assert_eq!(
        sim.status("audit"),
        TaskStatus::Ready,
        "a continued failure counts as done"
    );
    sim.complete("fallback", json!({}));
    sim.complete("audit", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
    assert_eq!(sim.state.job.failed_steps, ["notify"]);
    assert!(
        sim.compensation_order().is_empty(),
        "a succeeded job undoes nothing"
    );
    let succeeded = sim
        .events
        .iter()
        .find(|e| e.kind == EventKind::JobSucceeded)
        .unwrap();
    assert_eq!(succeeded.detail, json!({"failed_steps": ["notify"]}));
    let failed = sim
        .events
        .iter()
        .find(|e| e.kind == EventKind::TaskFailed)
        .unwrap();
    assert_eq!(failed.detail["continues"], json!(true));
}

#[test]
fn a_continued_failure_still_retries_first() {
    let mut sim = Sim::new(
        "steps:\n- {id: flaky, queue: q, command: c, continue_on_failure: true, retry: {max_attempts: 2}}\n- {id: next, queue: q, command: c}\n",
        json!({}),
    );
    sim.fail("flaky", true);
    assert_eq!(
        sim.status("flaky"),
        TaskStatus::Ready,
        "retried while attempts remain"
    );
    sim.advance(crate::time::Duration::from_secs(5));
    sim.fail("flaky", true);
    assert_eq!(sim.status("flaky"), TaskStatus::Failed);
    assert_eq!(sim.status("next"), TaskStatus::Ready);
}

#[test]
fn a_step_whose_only_dependency_failed_and_continued_runs_rather_than_skips() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, continue_on_failure: true}\n- {id: b, queue: q, command: c}\n",
        json!({}),
    );
    sim.fail("a", false);
    assert_eq!(sim.status("b"), TaskStatus::Ready);
}

#[test]
fn a_continued_fan_out_runs_every_item_and_lists_null_for_the_failed() {
    let mut sim = Sim::new(
        "steps:\n- {id: each, for_each: '${{ params.items }}', concurrency: 1, queue: q, command: c, continue_on_failure: true}\n- {id: after, queue: q, command: c, input: {outs: '${{ steps.each.output }}', status: '${{ steps.each.status }}'}}\n",
        json!({"items": [1, 2, 3]}),
    );
    sim.complete("each", json!("one"));
    sim.fail("each", false);
    assert_eq!(
        sim.status("each"),
        TaskStatus::Running,
        "the other items run on"
    );
    sim.complete("each", json!("three"));
    let fan_out = sim.find("each", TaskKind::FanOut);
    assert_eq!(fan_out.status, TaskStatus::Failed);
    assert_eq!(fan_out.output, Some(json!(["one", null, "three"])));
    assert!(
        fan_out
            .error
            .as_ref()
            .unwrap()
            .message
            .starts_with("item 1 failed")
    );
    assert_eq!(
        sim.find("after", TaskKind::Step).input,
        Some(json!({"outs": ["one", null, "three"], "status": "failed"}))
    );
    sim.complete("after", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
    assert_eq!(sim.state.job.failed_steps, ["each"]);
}

#[test]
fn a_continued_failure_is_undone_when_the_job_later_winds_down() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, compensate: {queue: q, command: undo_a}}\n- {id: opt, queue: q, command: c, continue_on_failure: true, compensate: {queue: q, command: undo_opt}}\n- {id: last, queue: q, command: c}\n",
        json!({}),
    );
    sim.complete("a", json!({}));
    sim.fail("opt", false);
    sim.fail("last", false);
    assert_eq!(sim.state.job.status, JobStatus::Compensating);
    sim.complete("opt", json!({}));
    sim.complete("a", json!({}));
    assert_eq!(sim.compensation_order(), ["opt", "a"]);
    assert_eq!(sim.state.job.status, JobStatus::Failed);
    assert!(sim.state.job.failed_steps.is_empty());
}

#[test]
fn the_workflow_output_is_rendered_when_the_job_succeeds() {
    let mut sim = Sim::new(
        "output: {hosts: '${{ steps.a.output.hosts }}', cluster: '${{ params.cluster }}'}\nsteps:\n- {id: a, queue: q, command: c}\n",
        json!({"cluster": "eu-1"}),
    );
    assert_eq!(sim.state.job.output, None);
    sim.complete("a", json!({"hosts": ["h1"]}));
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
    assert_eq!(
        sim.state.job.output,
        Some(json!({"hosts": ["h1"], "cluster": "eu-1"}))
    );
}

#[test]
fn an_output_that_cannot_be_rendered_winds_the_job_down_and_fails_it() {
    let mut sim = Sim::new(
        "output: '${{ steps.a.output.count + 1 }}'\nsteps:\n- {id: a, queue: q, command: c, compensate: {queue: q, command: undo}}\n",
        json!({}),
    );
    sim.complete("a", json!({"count": "many"}));
    assert_eq!(sim.state.job.status, JobStatus::Compensating);
    assert!(matches!(
        &sim.state.job.wind_down,
        Some(WindDown::Output { .. })
    ));
    sim.complete("a", json!({}));
    assert_eq!(sim.compensation_order(), ["a"]);
    assert_eq!(sim.state.job.status, JobStatus::Failed);
    assert_eq!(sim.state.job.output, None);
}

#[test]
fn an_output_over_the_size_limit_fails_the_job_naming_the_setting() {
    let limits = Limits {
        task_bytes: 64,
        ..Limits::default()
    };
    let mut sim = Sim::with_limits(
        "output: '${{ steps.a.output }}'\nsteps:\n- {id: a, queue: q, command: c}\n",
        json!({}),
        limits,
    );
    sim.complete("a", json!("y".repeat(100)));
    assert_eq!(sim.state.job.status, JobStatus::Failed);
    let Some(WindDown::Output { message }) = &sim.state.job.wind_down else {
        panic!("wound down for {:?}", sim.state.job.wind_down);
    };
    assert!(message.contains("--max-task-bytes"), "{message}");
}

#[test]
fn a_retried_job_forgets_what_its_earlier_success_named() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, continue_on_failure: true}\n- {id: b, queue: q, command: c}\n",
        json!({}),
    );
    sim.fail("a", false);
    sim.fail("b", false);
    assert_eq!(sim.state.job.status, JobStatus::Failed);
    sim.operate(OperatorAction::Retry).unwrap();
    sim.complete("a", json!({}));
    sim.complete("b", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
    assert!(
        sim.state.job.failed_steps.is_empty(),
        "a ran again and succeeded"
    );
}
