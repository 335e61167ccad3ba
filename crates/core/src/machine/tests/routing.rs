//! Queue templates in the state machine: rendered when a task first becomes ready (a fan-out
//! item's with its input), kept for its retries and check-laters, rendered again by a rerun,
//! and a failure naming `queue` when the name cannot be rendered.

use serde_json::json;

use super::Sim;
use crate::model::{ErrorKind, Input, JobStatus, OperatorAction, TaskKind, TaskStatus};
use crate::time::Duration;

/// The queues of a step's item tasks, in item order.
fn item_queues(sim: &Sim, step: &str) -> Vec<String> {
    sim.state
        .tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Item && t.step == step)
        .map(|t| t.queue.clone())
        .collect()
}

#[test]
fn each_fan_out_item_goes_to_the_queue_its_item_names() {
    let mut sim = Sim::new(
        "steps:\n- {id: each, queue: 'agent-${{ item }}', command: c, for_each: '${{ params.hosts }}'}\n",
        json!({"hosts": ["a", "b", "c"]}),
    );
    assert_eq!(item_queues(&sim, "each"), ["agent-a", "agent-b", "agent-c"]);
    assert_eq!(sim.queues_made, ["agent-a", "agent-b", "agent-c"]);
    let inputs: Vec<_> = sim
        .state
        .tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Item)
        .map(|t| t.input.clone().unwrap())
        .collect();
    assert_eq!(inputs, [json!("a"), json!("b"), json!("c")], "the items");
    for _ in 0..3 {
        sim.complete("each", json!({}));
    }
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
}

#[test]
fn an_item_queue_may_read_index_beside_its_input_template() {
    let sim = Sim::new(
        "steps:\n- {id: each, queue: 'shard-${{ index }}', command: c, for_each: '${{ params.hosts }}', input: {h: '${{ item }}'}}\n",
        json!({"hosts": ["x", "y"]}),
    );
    assert_eq!(item_queues(&sim, "each"), ["shard-0", "shard-1"]);
    assert_eq!(
        sim.state.tasks.last().unwrap().input,
        Some(json!({"h": "y"}))
    );
}

#[test]
fn a_step_queue_is_rendered_when_it_becomes_ready_and_kept_for_retries_and_check_laters() {
    let mut sim = Sim::new(
        "steps:\n- {id: find, queue: q, command: c}\n- {id: run, queue: 'agent-${{ steps.find.output.host }}', command: c, retry: {max_attempts: 3, initial: 1s}}\n",
        json!({}),
    );
    assert_eq!(
        sim.find("run", TaskKind::Step).queue,
        "",
        "not rendered yet"
    );
    sim.complete("find", json!({"host": "b"}));
    assert_eq!(sim.find("run", TaskKind::Step).queue, "agent-b");
    assert_eq!(sim.queues_made, ["agent-b"]);
    sim.fail("run", true);
    sim.advance(Duration::from_secs(1));
    assert_eq!(sim.status("run"), TaskStatus::Ready);
    assert_eq!(sim.find("run", TaskKind::Step).queue, "agent-b");
    let (task, lease_token) = sim.claim("run");
    sim.apply(Input::CheckLater {
        task,
        lease_token,
        after: Duration::from_secs(5),
        progress: None,
    })
    .unwrap();
    sim.advance(Duration::from_secs(5));
    assert_eq!(sim.find("run", TaskKind::Step).queue, "agent-b");
    assert_eq!(sim.queues_made, ["agent-b"], "rendered once");
    sim.complete("run", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
}

#[test]
fn a_rerun_renders_the_queue_again() {
    let mut sim = Sim::new(
        "steps:\n- {id: find, queue: q, command: c}\n- {id: run, queue: 'agent-${{ steps.find.output.host }}', command: c}\n",
        json!({}),
    );
    sim.complete("find", json!({"host": "b"}));
    sim.complete("run", json!({}));
    sim.operate(OperatorAction::Rerun {
        step: "find".into(),
    })
    .unwrap();
    sim.complete("find", json!({"host": "c"}));
    assert_eq!(sim.find("run", TaskKind::Step).queue, "agent-c");
    assert_eq!(sim.queues_made, ["agent-b", "agent-c"]);
}

#[test]
fn a_queue_that_renders_empty_or_invalid_fails_the_step_for_good_naming_queue() {
    for (queue, params, expected) in [
        (
            "${{ params.host }}",
            json!({"host": ""}),
            "queue: renders to an empty name",
        ),
        (
            "agent-${{ params.host }}",
            json!({"host": "a b"}),
            "queue: 'agent-a b' is not a valid queue name",
        ),
        (
            "${{ params.host }}",
            json!({}),
            "queue: must render to a queue name, got null",
        ),
    ] {
        let sim = Sim::new(
            &format!("steps:\n- {{id: run, queue: '{queue}', command: c}}\n"),
            params,
        );
        let task = sim.find("run", TaskKind::Step);
        assert_eq!(task.status, TaskStatus::Failed, "{queue}");
        let error = task.error.as_ref().unwrap();
        assert!(error.message.starts_with(expected), "{}", error.message);
        assert_eq!(error.kind, ErrorKind::Expression);
        assert!(!error.retryable);
        assert_eq!(task.queue, "", "no queue was taken");
        assert!(sim.queues_made.is_empty());
        assert_eq!(sim.state.job.status, JobStatus::Failed);
    }
}

#[test]
fn an_item_whose_queue_cannot_be_rendered_fails_the_fan_out_naming_queue() {
    let sim = Sim::new(
        "steps:\n- {id: each, queue: 'agent-${{ item }}', command: c, for_each: '${{ params.hosts }}'}\n",
        json!({"hosts": ["a", "b c"]}),
    );
    let parent = sim.find("each", TaskKind::FanOut);
    assert_eq!(parent.status, TaskStatus::Failed);
    let message = &parent.error.as_ref().unwrap().message;
    assert!(
        message.starts_with("item 1 failed: queue: 'agent-b c' is not a valid queue name"),
        "{message}"
    );
}

#[test]
fn a_compensation_queue_reads_the_undone_task() {
    let mut sim = Sim::new(
        "steps:\n- {id: make, queue: q, command: c, compensate: {queue: 'undo-${{ task.output.host }}', command: u}}\n- {id: boom, queue: q, command: c}\n",
        json!({}),
    );
    sim.complete("make", json!({"host": "h7"}));
    sim.fail("boom", false);
    let undo = sim.find("make", TaskKind::Compensation);
    assert_eq!(undo.status, TaskStatus::Ready);
    assert_eq!(undo.queue, "undo-h7");
    assert_eq!(sim.queues_made, ["undo-h7"]);
    sim.complete("make", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn a_compensation_queue_that_cannot_be_rendered_fails_the_compensation() {
    let mut sim = Sim::new(
        "steps:\n- {id: make, queue: q, command: c, compensate: {queue: 'undo-${{ task.output.host }}', command: u}}\n- {id: boom, queue: q, command: c}\n",
        json!({}),
    );
    sim.complete("make", json!({"host": "a/b c"}));
    sim.fail("boom", false);
    let undo = sim.find("make", TaskKind::Compensation);
    assert_eq!(undo.status, TaskStatus::Failed);
    let message = &undo.error.as_ref().unwrap().message;
    assert!(
        message.starts_with("compensate.queue: 'undo-a/b c'"),
        "{message}"
    );
    assert_eq!(sim.state.job.status, JobStatus::CompensationFailed);
}
