//! State machine tests: scenarios as data, plus property tests over random DAGs.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::ids::{SequentialIds, TaskId};
use crate::model::{EventKind, OperatorAction, OperatorCommand, Parked, ReportedError};
use crate::time::Duration;

/// A job driven by hand: claims and reports by step id, with a controllable clock.
struct Sim {
    workflow: Workflow,
    state: JobState,
    ids: SequentialIds,
    now: Timestamp,
    events: Vec<Event>,
    /// Events announced but not kept in the history (claims).
    announced: Vec<Event>,
    leases: u32,
    limits: Limits,
    /// What the machine asked of child jobs (`StartChild`, `ToChild`), in order.
    to_children: Vec<Action>,
    /// The queues rendered queue templates named (`EnsureQueue`), in order.
    queues_made: Vec<String>,
    /// The queues told of a forward task failing for good (`TaskFailedOnQueue`), with why.
    failed_on_queues: Vec<(String, String)>,
}

impl Sim {
    fn new(yaml: &str, params: Value) -> Sim {
        Sim::with_limits(yaml, params, Limits::default())
    }

    fn with_limits(yaml: &str, params: Value, limits: Limits) -> Sim {
        Sim::created(
            yaml,
            NewJob::new(JobId::from_unique("1"), "default".into(), 1, params),
            limits,
        )
    }

    fn created(yaml: &str, new: NewJob, limits: Limits) -> Sim {
        let workflow = Workflow::from_document("test", yaml).expect("valid definition");
        let mut ids = SequentialIds::default();
        let now = Timestamp(1_000_000);
        let (state, actions) = create_job(
            &workflow,
            new,
            &mut Ctx {
                now,
                ids: &mut ids,
                limits,
            },
        )
        .expect("job created");
        let mut sim = Sim {
            workflow,
            state,
            ids,
            now,
            events: Vec::new(),
            announced: Vec::new(),
            leases: 0,
            limits,
            to_children: Vec::new(),
            queues_made: Vec::new(),
            failed_on_queues: Vec::new(),
        };
        sim.absorb(actions);
        sim
    }

    fn absorb(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Record(event) => self.events.push(event),
                Action::Announce(event) => self.announced.push(event),
                action @ (Action::StartChild(_) | Action::ToChild { .. }) => {
                    self.to_children.push(action);
                }
                Action::EnsureQueue { queue } => self.queues_made.push(queue),
                Action::TaskFailedOnQueue { queue, reason } => {
                    self.failed_on_queues.push((queue, reason));
                }
                _ => {}
            }
        }
    }

    fn apply(&mut self, input: Input) -> Result<(), Rejection> {
        let actions = apply(
            &self.workflow,
            &mut self.state,
            input,
            &mut Ctx {
                now: self.now,
                ids: &mut self.ids,
                limits: self.limits,
            },
        )?;
        self.absorb(actions);
        Ok(())
    }

    fn advance(&mut self, by: Duration) {
        self.now = self.now.saturating_add(by);
        self.apply(Input::Tick).unwrap();
    }

    fn ready(&self) -> Vec<TaskId> {
        let mut ready: Vec<&Task> = self
            .state
            .tasks
            .iter()
            .filter(|t| {
                t.status == TaskStatus::Ready
                    && !t.held
                    && t.available_at.is_none_or(|a| a <= self.now)
            })
            .collect();
        ready.sort_by_key(|t| (std::cmp::Reverse(t.priority), t.available_at, t.id.clone()));
        ready.into_iter().map(|t| t.id.clone()).collect()
    }

    fn find(&self, step: &str, kind: TaskKind) -> &Task {
        self.state
            .tasks
            .iter()
            .find(|t| t.step == step && t.kind == kind)
            .unwrap_or_else(|| panic!("no {kind} task for step {step}"))
    }

    fn status(&self, step: &str) -> TaskStatus {
        self.state
            .tasks
            .iter()
            .find(|t| t.step == step && matches!(t.kind, TaskKind::Step | TaskKind::FanOut))
            .unwrap()
            .status
    }

    /// Claims the ready task of `step` (of any kind but fan-out parents) and returns its token.
    fn claim_task(&mut self, id: &TaskId) -> String {
        self.leases += 1;
        let token = format!("lease-{}", self.leases);
        self.apply(Input::Claim {
            task: id.clone(),
            worker: "w1".into(),
            lease_token: token.clone(),
            callback_hash: format!("hash-{}", self.leases),
        })
        .unwrap();
        token
    }

    fn claim(&mut self, step: &str) -> (TaskId, String) {
        let id = self
            .ready()
            .into_iter()
            .find(|id| self.state.task(id).unwrap().step == step)
            .unwrap_or_else(|| panic!("step {step} is not ready: {:?}", self.summary()));
        let token = self.claim_task(&id);
        (id, token)
    }

    fn complete(&mut self, step: &str, output: Value) {
        let (task, lease_token) = self.claim(step);
        self.apply(Input::Complete {
            task,
            lease_token,
            output,
            logs: None,
        })
        .unwrap();
    }

    fn fail(&mut self, step: &str, retryable: bool) {
        let (task, lease_token) = self.claim(step);
        self.apply(Input::Fail {
            task,
            lease_token,
            error: ReportedError {
                message: format!("{step} broke"),
                retryable,
                retry_after: None,
            },
            logs: None,
        })
        .unwrap();
    }

    fn operate(&mut self, action: OperatorAction) -> Result<(), Rejection> {
        self.apply(Input::Operator(OperatorCommand {
            actor: "ops".into(),
            reason: Some("test".into()),
            action,
        }))
    }

    fn summary(&self) -> Vec<String> {
        self.state
            .tasks
            .iter()
            .map(|t| format!("{}/{}/{:?}={}", t.step, t.kind, t.item, t.status))
            .collect()
    }

    /// The children running tasks wait for.
    fn awaited_children(&self) -> Vec<JobId> {
        self.state
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Running)
            .filter_map(|t| match t.wait.as_deref().map(|w| &w.on) {
                Some(crate::model::WaitFor::Child { job }) => Some(job.clone()),
                _ => None,
            })
            .collect()
    }

    fn event_kinds(&self) -> Vec<EventKind> {
        self.events.iter().map(|e| e.kind).collect()
    }

    /// Steps of compensation tasks in the order they were claimed.
    fn compensation_order(&self) -> Vec<String> {
        self.announced
            .iter()
            .filter(|e| e.kind == EventKind::TaskClaimed)
            .filter_map(|e| e.task.as_ref().and_then(|id| self.state.task(id)))
            .filter(|t| t.kind == TaskKind::Compensation)
            .map(|t| t.step.clone())
            .collect()
    }
}

const SEQUENCE: &str = "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: q, command: c}\n- {id: c, queue: q, command: c}\n";

#[test]
fn first_steps_are_ready_with_job_created_and_later_ones_record_task_ready() {
    let mut sim = Sim::new(SEQUENCE, json!({}));
    assert_eq!(sim.status("a"), TaskStatus::Ready);
    assert_eq!(sim.event_kinds(), [EventKind::JobCreated]);
    sim.complete("a", json!({}));
    let b = sim.find("b", TaskKind::Step).id.clone();
    let ready: Vec<_> = sim
        .events
        .iter()
        .filter(|e| e.kind == EventKind::TaskReady)
        .map(|e| e.task.clone())
        .collect();
    assert_eq!(ready, [Some(b)]);
}

#[test]
fn sequence_runs_one_step_after_another() {
    let mut sim = Sim::new(SEQUENCE, json!({}));
    assert_eq!(sim.ready().len(), 1);
    sim.complete("a", json!({"n": 1}));
    assert_eq!(sim.status("b"), TaskStatus::Ready);
    assert_eq!(sim.status("c"), TaskStatus::Waiting);
    sim.complete("b", json!({}));
    sim.complete("c", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
    assert_eq!(sim.event_kinds().last(), Some(&EventKind::JobSucceeded));
}

#[test]
fn roots_and_dag_branches_are_ready_together() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: q, command: c, depends_on: [a]}\n- {id: c, queue: q, command: c, depends_on: [a]}\n- {id: d, queue: q, command: c, depends_on: [b, c]}\n- {id: e, queue: q, command: c, depends_on: []}\n",
        json!({}),
    );
    assert_eq!(sim.ready().len(), 2, "a and the root e");
    sim.complete("a", json!({}));
    assert_eq!(sim.status("b"), TaskStatus::Ready);
    assert_eq!(sim.status("c"), TaskStatus::Ready);
    sim.complete("b", json!({}));
    assert_eq!(sim.status("d"), TaskStatus::Waiting, "join waits for c");
    sim.complete("c", json!({}));
    assert_eq!(sim.status("d"), TaskStatus::Ready);
}

#[test]
fn input_template_reads_params_and_upstream_output_keeping_types() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, input: {size: '${{ params.size }}'}}\n- {id: b, queue: q, command: c, input: {path: '${{ steps.a.output.path }}', label: 'job-${{ params.size }}', all: '${{ steps.a.output }}'}}\n",
        json!({"size": 20}),
    );
    assert_eq!(
        sim.find("a", TaskKind::Step).input,
        Some(json!({"size": 20}))
    );
    sim.complete("a", json!({"path": "/data/x", "n": [1, 2]}));
    assert_eq!(
        sim.find("b", TaskKind::Step).input,
        Some(
            json!({"path": "/data/x", "label": "job-20", "all": {"path": "/data/x", "n": [1, 2]}})
        )
    );
}

#[test]
fn step_without_input_template_gets_the_job_params() {
    let sim = Sim::new(SEQUENCE, json!({"x": 1}));
    assert_eq!(sim.find("a", TaskKind::Step).input, Some(json!({"x": 1})));
}

#[test]
fn false_condition_skips_and_all_skipped_dependencies_propagate() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, when: '${{ params.go }}'}\n- {id: b, queue: q, command: c}\n- {id: c, queue: q, command: c, depends_on: []}\n- {id: d, queue: q, command: c, depends_on: [b, c]}\n",
        json!({"go": false}),
    );
    assert_eq!(sim.status("a"), TaskStatus::Skipped);
    assert_eq!(
        sim.status("b"),
        TaskStatus::Skipped,
        "its only dependency was skipped"
    );
    assert_eq!(sim.status("d"), TaskStatus::Waiting);
    sim.complete("c", json!({}));
    assert_eq!(
        sim.status("d"),
        TaskStatus::Ready,
        "one dependency ran, so the join runs"
    );
    sim.complete("d", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
}

#[test]
fn true_condition_runs_the_step() {
    let sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, when: \"params.env == 'prod'\"}\n",
        json!({"env": "prod"}),
    );
    assert_eq!(sim.status("a"), TaskStatus::Ready);
}

#[test]
fn fan_out_makes_one_task_per_item_within_concurrency_and_gathers_outputs() {
    let mut sim = Sim::new(
        "steps:\n- {id: list, queue: q, command: c}\n- {id: each, queue: q, command: c, for_each: '${{ steps.list.output.hosts }}', concurrency: 2, input: {host: '${{ item }}', n: '${{ index }}'}}\n- {id: after, queue: q, command: c, input: {all: '${{ steps.each.output }}'}}\n",
        json!({}),
    );
    sim.complete("list", json!({"hosts": ["h0", "h1", "h2"]}));
    let items: Vec<&Task> = sim
        .state
        .tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Item)
        .collect();
    assert_eq!(items.len(), 3);
    assert_eq!(items[2].input, Some(json!({"host": "h2", "n": 2})));
    assert_eq!(sim.ready().len(), 2, "concurrency 2");
    for _ in 0..3 {
        let id = sim.ready()[0].clone();
        let item = sim.state.task(&id).unwrap().item.unwrap();
        let token = sim.claim_task(&id);
        sim.apply(Input::Complete {
            task: id,
            lease_token: token,
            output: json!({"done": item}),
            logs: None,
        })
        .unwrap();
    }
    assert_eq!(sim.status("each"), TaskStatus::Succeeded);
    assert_eq!(
        sim.find("after", TaskKind::Step).input,
        Some(json!({"all": [{"done": 0}, {"done": 1}, {"done": 2}]}))
    );
}

#[test]
fn step_lock_and_rate_keys_are_rendered_per_task_when_it_is_made_ready() {
    let mut sim = Sim::new(
        "steps:\n- {id: list, queue: q, command: c}\n- {id: each, queue: q, command: c, for_each: '${{ steps.list.output.hosts }}', lock: {key: 'host-${{ item }}'}, rate: {key: '${{ params.tenant }}', limit: 1/1s}}\n",
        json!({"tenant": "t1"}),
    );
    assert_eq!(
        sim.find("list", TaskKind::Step).limits,
        None,
        "no lock, no rate"
    );
    sim.complete("list", json!({"hosts": ["h0", "h1"]}));
    let keys: Vec<(Option<String>, Option<String>)> = sim
        .state
        .tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Item)
        .map(|t| {
            let limits = t.limits.as_deref().unwrap();
            (limits.lock.clone(), limits.rate.clone())
        })
        .collect();
    assert_eq!(
        keys,
        [
            (Some("host-h0".into()), Some("t1".into())),
            (Some("host-h1".into()), Some("t1".into()))
        ]
    );
}

#[test]
fn a_step_lock_key_that_does_not_render_fails_the_step_naming_the_field() {
    let sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, lock: {key: '${{ params.db }}'}}\n",
        json!({"db": ["not", "text"]}),
    );
    assert_eq!(sim.status("a"), TaskStatus::Failed);
    let error = sim.find("a", TaskKind::Step).error.clone().unwrap();
    assert!(error.message.contains("lock.key"), "{}", error.message);
}

#[test]
fn a_parked_task_that_leaves_ready_is_parked_no_more() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, lock: {key: k}}\n",
        json!({}),
    );
    let index = sim.state.tasks.iter().position(|t| t.step == "a").unwrap();
    sim.state.tasks[index].limits.as_deref_mut().unwrap().parked = Some(Parked {
        line: Parked::lock_line("k"),
        since: sim.now,
        reason: "waiting for lock k (1/1 held)".into(),
    });
    sim.operate(OperatorAction::Cancel { compensate: false })
        .unwrap();
    let task = sim.find("a", TaskKind::Step);
    assert_eq!(task.status, TaskStatus::Cancelled);
    assert_eq!(task.limits.as_deref().unwrap().parked, None);
}

#[test]
fn fan_out_over_an_empty_list_succeeds_at_once() {
    let sim = Sim::new(
        "steps:\n- {id: each, queue: q, command: c, for_each: '${{ params.items }}'}\n",
        json!({"items": []}),
    );
    assert_eq!(sim.status("each"), TaskStatus::Succeeded);
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
}

#[test]
fn fan_out_wider_than_the_limit_fails_the_step_naming_the_limit_and_setting() {
    let limits = Limits {
        fan_out: 3,
        ..Limits::default()
    };
    let yaml = "steps:\n- {id: each, queue: q, command: c, for_each: '${{ params.items }}'}\n";
    let at_limit = Sim::with_limits(yaml, json!({"items": [1, 2, 3]}), limits);
    assert_eq!(at_limit.status("each"), TaskStatus::Running);
    let over = Sim::with_limits(yaml, json!({"items": [1, 2, 3, 4]}), limits);
    assert_eq!(over.status("each"), TaskStatus::Failed);
    let error = over.find("each", TaskKind::FanOut).error.clone().unwrap();
    assert_eq!(
        error.message,
        "for_each: 4 items is more than the fan-out limit of 3 (server setting --max-fan-out)"
    );
    assert!(!error.retryable);
    assert_eq!(over.state.job.status, JobStatus::Failed);
}

#[test]
fn task_input_larger_than_the_limit_fails_the_step_naming_the_limit_and_setting() {
    let limits = Limits {
        task_bytes: 64,
        ..Limits::default()
    };
    let yaml = "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: q, command: c, input: {x: '${{ steps.a.output.big }}'}}\n";
    let mut sim = Sim::with_limits(yaml, json!({}), limits);
    assert_eq!(sim.status("a"), TaskStatus::Ready);
    sim.complete("a", json!({"big": "x".repeat(100)}));
    assert_eq!(sim.status("b"), TaskStatus::Failed);
    let error = sim.find("b", TaskKind::Step).error.clone().unwrap();
    assert_eq!(
        error.message,
        "input: the rendered input is larger than the task size limit of 64 bytes (server setting --max-task-bytes)"
    );
    let fan_out = "steps:\n- {id: each, queue: q, command: c, for_each: '${{ params.items }}'}\n";
    let sim = Sim::with_limits(
        fan_out,
        json!({"items": ["short", "y".repeat(100)]}),
        limits,
    );
    let items: Vec<TaskStatus> = sim
        .state
        .tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Item)
        .map(|t| t.status)
        .collect();
    assert_eq!(items.last(), Some(&TaskStatus::Failed), "{items:?}");
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn fan_out_over_a_non_list_fails_the_step_with_a_reason() {
    let sim = Sim::new(
        "steps:\n- {id: each, queue: q, command: c, for_each: '${{ params.items }}'}\n",
        json!({"items": 3}),
    );
    assert_eq!(sim.status("each"), TaskStatus::Failed);
    let error = sim.find("each", TaskKind::FanOut).error.clone().unwrap();
    assert!(
        error.message.contains("expected a list"),
        "{}",
        error.message
    );
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn retries_follow_exponential_backoff_then_fail() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, retry: {max_attempts: 3, backoff: exponential, initial: 1s, max_interval: 10s}}\n",
        json!({}),
    );
    sim.fail("a", true);
    let task = sim.find("a", TaskKind::Step).clone();
    assert_eq!(task.status, TaskStatus::Ready);
    assert_eq!(
        task.available_at,
        Some(sim.now.saturating_add(Duration::from_secs(1)))
    );
    assert!(sim.ready().is_empty(), "not before the backoff");
    sim.advance(Duration::from_secs(1));
    sim.fail("a", true);
    assert_eq!(
        sim.find("a", TaskKind::Step).available_at,
        Some(sim.now.saturating_add(Duration::from_secs(2)))
    );
    sim.advance(Duration::from_secs(2));
    sim.fail("a", true);
    assert_eq!(sim.status("a"), TaskStatus::Failed);
    assert_eq!(sim.find("a", TaskKind::Step).attempt, 3);
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn non_retryable_error_fails_at_once() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, retry: {max_attempts: 5}}\n",
        json!({}),
    );
    sim.fail("a", false);
    assert_eq!(sim.status("a"), TaskStatus::Failed);
    assert_eq!(sim.find("a", TaskKind::Step).attempt, 1);
}

#[test]
fn lapsed_lease_counts_as_a_failed_attempt_and_fences_the_old_worker() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, timeout: 10s, retry: {max_attempts: 2, initial: 1s}}\n",
        json!({}),
    );
    let (task, stale) = sim.claim("a");
    sim.advance(Duration::from_secs(5));
    sim.apply(Input::Heartbeat {
        task: task.clone(),
        lease_token: stale.clone(),
        progress: None,
    })
    .unwrap();
    sim.advance(Duration::from_secs(9));
    assert_eq!(
        sim.status("a"),
        TaskStatus::Running,
        "heartbeat extended the lease"
    );
    sim.advance(Duration::from_secs(2));
    assert_eq!(sim.status("a"), TaskStatus::Ready);
    assert!(sim.event_kinds().contains(&EventKind::TaskLeaseExpired));
    let late = sim.apply(Input::Complete {
        task: task.clone(),
        lease_token: stale.clone(),
        output: json!({}),
        logs: None,
    });
    assert!(matches!(late, Err(Rejection::StaleLease { .. })));
    sim.advance(Duration::from_secs(1));
    let (_, fresh) = sim.claim("a");
    assert_ne!(fresh, stale);
    assert_eq!(sim.find("a", TaskKind::Step).attempt, 2);
    let late = sim.apply(Input::Complete {
        task,
        lease_token: stale,
        output: json!({}),
        logs: None,
    });
    assert!(
        matches!(late, Err(Rejection::StaleLease { .. })),
        "the new attempt owns the task"
    );
}

#[test]
fn a_success_sent_again_under_its_lease_token_is_a_repeat_and_under_another_is_stale() {
    let mut sim = Sim::new(SEQUENCE, json!({}));
    let (task, token) = sim.claim("a");
    let complete = |lease_token: &str| Input::Complete {
        task: task.clone(),
        lease_token: lease_token.to_owned(),
        output: json!({"n": 1}),
        logs: None,
    };
    assert!(!repeats_success(&sim.state, &complete(&token)), "not yet");
    sim.apply(complete(&token)).unwrap();
    assert!(repeats_success(&sim.state, &complete(&token)));
    assert!(!repeats_success(&sim.state, &complete("other")));
    assert!(matches!(
        sim.apply(complete("other")),
        Err(Rejection::StaleLease {
            status: TaskStatus::Succeeded
        })
    ));
    sim.complete("b", json!({}));
    sim.complete("c", json!({}));
    sim.operate(OperatorAction::Rerun { step: "a".into() })
        .unwrap();
    assert!(
        !repeats_success(&sim.state, &complete(&token)),
        "a rerun forgets the attempt that succeeded"
    );
    assert!(matches!(
        sim.apply(complete(&token)),
        Err(Rejection::StaleLease { .. })
    ));
}

#[test]
fn a_task_cannot_be_claimed_twice() {
    let mut sim = Sim::new(SEQUENCE, json!({}));
    let (task, _) = sim.claim("a");
    let again = sim.apply(Input::Claim {
        task,
        worker: "w2".into(),
        lease_token: "other".into(),
        callback_hash: "other".into(),
    });
    assert!(matches!(again, Err(Rejection::NotReady { .. })));
}

#[test]
fn check_later_returns_to_ready_without_using_an_attempt() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, retry: {max_attempts: 1}}\n",
        json!({}),
    );
    let (task, token) = sim.claim("a");
    let key = sim.state.task(&task).unwrap().idempotency_key();
    sim.apply(Input::CheckLater {
        task: task.clone(),
        lease_token: token,
        after: Duration::from_secs(30),
        progress: Some(json!({"pct": 40})),
    })
    .unwrap();
    assert_eq!(sim.status("a"), TaskStatus::Ready);
    assert!(sim.ready().is_empty());
    sim.advance(Duration::from_secs(30));
    let (_, token) = sim.claim("a");
    let again = sim.state.task(&task).unwrap();
    assert_eq!(again.attempt, 1);
    assert_eq!(
        again.idempotency_key(),
        key,
        "same attempt, same idempotency key"
    );
    assert_eq!(again.progress, Some(json!({"pct": 40})));
    sim.apply(Input::Complete {
        task,
        lease_token: token,
        output: json!({}),
        logs: None,
    })
    .unwrap();
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
}

#[test]
fn a_claim_writes_no_history_and_the_event_ending_each_run_carries_its_start() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, retry: {max_attempts: 2}, timeout: 10s}\n",
        json!({}),
    );
    let recorded = sim.events.len();
    let first_claim = sim.now;
    let (task, token) = sim.claim("a");
    assert_eq!(
        sim.events.len(),
        recorded,
        "the claim is not in the history"
    );
    assert_eq!(
        sim.announced.last().map(|e| e.kind),
        Some(EventKind::TaskClaimed)
    );
    assert_eq!(sim.state.task(&task).unwrap().claimed_at, Some(first_claim));
    // A check-later ends the run; the claim that continues the attempt starts another.
    sim.apply(Input::CheckLater {
        task: task.clone(),
        lease_token: token,
        after: Duration::from_secs(5),
        progress: None,
    })
    .unwrap();
    let checked = sim.events.last().unwrap();
    assert_eq!(checked.kind, EventKind::TaskCheckLater);
    assert_eq!(checked.detail["claimed_at"], json!(first_claim));
    assert_eq!(sim.state.task(&task).unwrap().claimed_at, None);
    sim.advance(Duration::from_secs(5));
    let second_claim = sim.now;
    sim.claim("a");
    // The lease lapses: the run ends with it, once (the failure after it carries no start).
    sim.advance(Duration::from_secs(11));
    let ends: Vec<(EventKind, Value)> = sim
        .events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::TaskLeaseExpired | EventKind::TaskFailed))
        .map(|e| (e.kind, e.detail["claimed_at"].clone()))
        .collect();
    assert_eq!(
        ends,
        [
            (EventKind::TaskLeaseExpired, json!(second_claim)),
            (EventKind::TaskFailed, Value::Null)
        ]
    );
    assert_eq!(sim.state.task(&task).unwrap().claimed_at, None);
    sim.advance(Duration::from_secs(60));
    let third_claim = sim.now;
    sim.complete("a", json!({}));
    let succeeded = sim
        .events
        .iter()
        .find(|e| e.kind == EventKind::TaskSucceeded);
    assert_eq!(succeeded.unwrap().detail["claimed_at"], json!(third_claim));
    assert!(!sim.event_kinds().contains(&EventKind::TaskClaimed));
}

#[test]
fn check_later_is_bounded_by_the_step_timeout() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, step_timeout: 1m}\n",
        json!({}),
    );
    for _ in 0..2 {
        let (task, token) = sim.claim("a");
        sim.apply(Input::CheckLater {
            task,
            lease_token: token,
            after: Duration::from_secs(25),
            progress: None,
        })
        .unwrap();
        sim.advance(Duration::from_secs(25));
    }
    sim.advance(Duration::from_secs(10));
    assert_eq!(sim.status("a"), TaskStatus::Failed);
    assert_eq!(
        sim.find("a", TaskKind::Step).error.as_ref().unwrap().kind,
        ErrorKind::StepTimeout
    );
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn step_timeout_fails_a_running_task_and_rejects_its_late_report() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, timeout: 1h, step_timeout: 30s}\n",
        json!({}),
    );
    let (task, token) = sim.claim("a");
    sim.advance(Duration::from_secs(31));
    assert_eq!(sim.status("a"), TaskStatus::Failed);
    let late = sim.apply(Input::Complete {
        task,
        lease_token: token,
        output: json!({}),
        logs: None,
    });
    assert!(late.is_err());
}

const ROLLBACK: &str = "steps:
- {id: a, queue: q, command: c, compensate: {queue: q, command: undo_a}}
- {id: b, queue: q, command: c, compensate: {queue: q, command: undo_b}}
- {id: mid, queue: q, command: c}
- {id: c, queue: q, command: c, compensate: {queue: q, command: undo_c, retry: {max_attempts: 2}}}
";

/// A job of `ROLLBACK` whose `a`, `b` and `mid` succeeded and whose `c` failed for good: it
/// compensates, `c` first.
fn rolling_back_from_c() -> Sim {
    let mut sim = Sim::new(ROLLBACK, json!({}));
    sim.complete("a", json!({}));
    sim.complete("b", json!({}));
    sim.complete("mid", json!({}));
    sim.fail("c", false);
    sim
}

#[test]
fn failure_compensates_the_failed_step_then_finished_steps_in_reverse() {
    let mut sim = Sim::new(ROLLBACK, json!({}));
    sim.complete("a", json!({"id": "A"}));
    sim.complete("b", json!({"id": "B"}));
    sim.complete("mid", json!({}));
    sim.fail("c", false);
    assert_eq!(sim.state.job.status, JobStatus::Compensating);
    for step in ["c", "b", "a"] {
        let ready = sim.ready();
        assert_eq!(ready.len(), 1, "one compensation at a time");
        let task = sim.state.task(&ready[0]).unwrap().clone();
        assert_eq!(task.kind, TaskKind::Compensation);
        assert_eq!(task.step, step);
        if step == "b" {
            assert_eq!(task.input.as_ref().unwrap()["output"], json!({"id": "B"}));
        }
        let token = sim.claim_task(&task.id);
        sim.apply(Input::Complete {
            task: task.id,
            lease_token: token,
            output: json!({}),
            logs: None,
        })
        .unwrap();
    }
    assert_eq!(sim.compensation_order(), vec!["c", "b", "a"]);
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn only_a_forward_task_failing_for_good_tells_its_queue() {
    let mut sim = rolling_back_from_c();
    assert_eq!(sim.failed_on_queues.len(), 1);
    let (queue, reason) = &sim.failed_on_queues[0];
    let failed = sim.find("c", TaskKind::Step);
    assert_eq!(queue, &failed.queue);
    assert!(
        reason.contains(failed.id.as_str()) && reason.ends_with("failed: c broke"),
        "{reason}"
    );
    // A compensation failing for good does not.
    let id = sim.ready()[0].clone();
    let token = sim.claim_task(&id);
    sim.apply(Input::Fail {
        task: id,
        lease_token: token,
        error: ReportedError {
            message: "undo broke".into(),
            retryable: false,
            retry_after: None,
        },
        logs: None,
    })
    .unwrap();
    assert_eq!(sim.state.job.status, JobStatus::CompensationFailed);
    assert_eq!(sim.failed_on_queues.len(), 1);

    // Nor does a retried attempt, a step that continues on failure, or an operator's fail.
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, retry: {max_attempts: 2}}\n\
         - {id: b, queue: q, command: c, continue_on_failure: true}\n\
         - {id: c, queue: q, command: c}\n",
        json!({}),
    );
    sim.fail("a", true);
    assert!(sim.failed_on_queues.is_empty());
    sim.advance(Duration::from_secs(60));
    sim.complete("a", json!({}));
    sim.fail("b", false);
    assert!(sim.failed_on_queues.is_empty());
    let c = sim.find("c", TaskKind::Step).id.clone();
    sim.operate(OperatorAction::FailTask {
        task: c,
        message: "stop".into(),
    })
    .unwrap();
    assert!(sim.failed_on_queues.is_empty());
}

#[test]
fn compensations_have_their_own_retries_and_a_failing_one_ends_compensation_failed() {
    let mut sim = rolling_back_from_c();
    for _ in 0..2 {
        let id = sim.ready()[0].clone();
        let token = sim.claim_task(&id);
        sim.apply(Input::Fail {
            task: id,
            lease_token: token,
            error: ReportedError {
                message: "undo broke".into(),
                retryable: true,
                retry_after: None,
            },
            logs: None,
        })
        .unwrap();
        sim.advance(Duration::from_secs(1));
    }
    assert_eq!(sim.state.job.status, JobStatus::CompensationFailed);
    assert!(
        sim.ready().is_empty(),
        "nothing more runs until an operator acts"
    );
}

#[test]
fn parallel_branch_finishes_before_compensation_starts_and_is_compensated() {
    let mut sim = Sim::new(
        "steps:
- {id: a, queue: q, command: c, depends_on: [], compensate: {queue: q, command: undo}}
- {id: b, queue: q, command: c, depends_on: [], compensate: {queue: q, command: undo}}
- {id: after, queue: q, command: c, depends_on: [a, b]}
",
        json!({}),
    );
    let (a, a_token) = sim.claim("a");
    sim.fail("b", false);
    assert_eq!(sim.state.job.status, JobStatus::Compensating);
    assert!(sim.ready().is_empty(), "waits for the running branch");
    assert_eq!(sim.status("after"), TaskStatus::Cancelled);
    sim.apply(Input::Complete {
        task: a,
        lease_token: a_token,
        output: json!({}),
        logs: None,
    })
    .unwrap();
    assert_eq!(
        sim.status("a"),
        TaskStatus::Succeeded,
        "a late success is recorded"
    );
    let order: Vec<String> = sim
        .state
        .tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Compensation)
        .map(|t| t.step.clone())
        .collect();
    assert_eq!(order, vec!["b", "a"]);
}

#[test]
fn job_timeout_stops_dispatch_compensates_and_ends_timed_out() {
    let mut sim = Sim::new(
        "timeout: 1m
steps:
- {id: a, queue: q, command: c, compensate: {queue: q, command: undo}}
- {id: b, queue: q, command: c}
",
        json!({}),
    );
    sim.complete("a", json!({}));
    let (b, token) = sim.claim("b");
    sim.advance(Duration::from_secs(61));
    assert_eq!(sim.state.job.status, JobStatus::Compensating);
    assert!(sim.ready().is_empty(), "running task may still finish");
    sim.apply(Input::Complete {
        task: b,
        lease_token: token,
        output: json!({}),
        logs: None,
    })
    .unwrap();
    let undo = sim.ready()[0].clone();
    let token = sim.claim_task(&undo);
    sim.apply(Input::Complete {
        task: undo,
        lease_token: token,
        output: json!({}),
        logs: None,
    })
    .unwrap();
    assert_eq!(sim.state.job.status, JobStatus::TimedOut);
}

#[test]
fn expression_error_at_run_time_fails_the_step_without_retry() {
    let sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, retry: {max_attempts: 3}, input: {x: '${{ params.a + params.b }}'}}\n",
        json!({"a": 1, "b": "x"}),
    );
    assert_eq!(sim.status("a"), TaskStatus::Failed);
    assert_eq!(
        sim.find("a", TaskKind::Step).error.as_ref().unwrap().kind,
        ErrorKind::Expression
    );
}

#[test]
fn dispatch_order_prefers_priority_then_age() {
    let sim = Sim::new(
        "steps:\n- {id: low, queue: q, command: c, depends_on: []}\n- {id: high, queue: q, command: c, depends_on: [], priority: 5}\n",
        json!({}),
    );
    let ready = sim.ready();
    assert_eq!(sim.state.task(&ready[0]).unwrap().step, "high");
}

#[test]
fn pause_holds_ready_tasks_and_resume_releases_them() {
    let mut sim = Sim::new(SEQUENCE, json!({}));
    let (a, token) = sim.claim("a");
    sim.operate(OperatorAction::Pause).unwrap();
    assert_eq!(sim.state.job.status, JobStatus::Paused);
    sim.apply(Input::Complete {
        task: a,
        lease_token: token,
        output: json!({}),
        logs: None,
    })
    .unwrap();
    assert_eq!(
        sim.status("a"),
        TaskStatus::Succeeded,
        "running work finishes and is recorded"
    );
    assert_eq!(
        sim.status("b"),
        TaskStatus::Waiting,
        "nothing new is dispatched"
    );
    sim.operate(OperatorAction::Resume).unwrap();
    assert_eq!(sim.status("b"), TaskStatus::Ready);
    assert!(sim.event_kinds().contains(&EventKind::JobPaused));
    assert!(sim.event_kinds().contains(&EventKind::JobResumed));
}

#[test]
fn a_paused_job_holds_its_ready_tasks_and_retries() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, retry: {max_attempts: 2, initial: 1s}}\n- {id: b, queue: q, command: c, depends_on: []}\n",
        json!({}),
    );
    let (a, token) = sim.claim("a");
    sim.operate(OperatorAction::Pause).unwrap();
    assert!(sim.find("b", TaskKind::Step).held);
    let claim = sim.apply(Input::Claim {
        task: sim.find("b", TaskKind::Step).id.clone(),
        worker: "w".into(),
        lease_token: "t".into(),
        callback_hash: "t".into(),
    });
    assert!(matches!(
        claim,
        Err(Rejection::JobNotDispatching(JobStatus::Paused))
    ));
    sim.apply(Input::Fail {
        task: a,
        lease_token: token,
        error: ReportedError {
            message: "x".into(),
            retryable: true,
            retry_after: None,
        },
        logs: None,
    })
    .unwrap();
    let retried = sim.find("a", TaskKind::Step);
    assert_eq!(
        retried.status,
        TaskStatus::Ready,
        "a retry is kept, not failed"
    );
    assert!(retried.held);
    sim.operate(OperatorAction::Resume).unwrap();
    assert!(!sim.find("a", TaskKind::Step).held);
}

#[test]
fn cancel_without_compensation_cancels_what_has_not_started() {
    let mut sim = Sim::new(ROLLBACK, json!({}));
    sim.complete("a", json!({}));
    sim.operate(OperatorAction::Cancel { compensate: false })
        .unwrap();
    assert_eq!(sim.state.job.status, JobStatus::Cancelled);
    assert_eq!(sim.status("b"), TaskStatus::Cancelled);
    assert!(
        sim.state
            .tasks
            .iter()
            .all(|t| t.kind != TaskKind::Compensation)
    );
}

#[test]
fn cancel_with_compensation_undoes_finished_steps_then_ends_cancelled() {
    let mut sim = Sim::new(ROLLBACK, json!({}));
    sim.complete("a", json!({}));
    sim.complete("b", json!({}));
    sim.operate(OperatorAction::Cancel { compensate: true })
        .unwrap();
    assert_eq!(sim.state.job.status, JobStatus::Compensating);
    for _ in 0..2 {
        let id = sim.ready()[0].clone();
        let token = sim.claim_task(&id);
        sim.apply(Input::Complete {
            task: id,
            lease_token: token,
            output: json!({}),
            logs: None,
        })
        .unwrap();
    }
    assert_eq!(sim.compensation_order(), vec!["b", "a"]);
    assert_eq!(sim.state.job.status, JobStatus::Cancelled);
}

#[test]
fn retry_continues_from_the_failed_task_with_fresh_attempts_keeping_finished_work() {
    let mut sim = Sim::new(SEQUENCE, json!({}));
    sim.complete("a", json!({"kept": true}));
    sim.fail("b", true);
    assert_eq!(sim.state.job.status, JobStatus::Failed);
    sim.operate(OperatorAction::Retry).unwrap();
    assert_eq!(sim.state.job.status, JobStatus::Running);
    assert_eq!(sim.status("a"), TaskStatus::Succeeded);
    assert_eq!(
        sim.find("a", TaskKind::Step).output,
        Some(json!({"kept": true}))
    );
    assert_eq!(sim.status("b"), TaskStatus::Ready);
    let (b, token) = sim.claim("b");
    let task = sim.state.task(&b).unwrap();
    assert_eq!(
        task.attempt, 2,
        "attempt numbers go on, so idempotency keys stay unique"
    );
    sim.apply(Input::Fail {
        task: b,
        lease_token: token,
        error: ReportedError {
            message: "again".into(),
            retryable: true,
            retry_after: None,
        },
        logs: None,
    })
    .unwrap();
    assert_eq!(
        sim.state.job.status,
        JobStatus::Failed,
        "the fresh budget is one attempt"
    );
    sim.operate(OperatorAction::Retry).unwrap();
    sim.complete("b", json!({}));
    sim.complete("c", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
}

#[test]
fn retry_after_a_rollback_runs_the_undone_steps_again() {
    let mut sim = rolling_back_from_c();
    while sim.state.job.status == JobStatus::Compensating {
        let id = sim.ready()[0].clone();
        let token = sim.claim_task(&id);
        sim.apply(Input::Complete {
            task: id,
            lease_token: token,
            output: json!({}),
            logs: None,
        })
        .unwrap();
    }
    assert_eq!(sim.state.job.status, JobStatus::Failed);
    sim.operate(OperatorAction::Retry).unwrap();
    assert_eq!(
        sim.status("a"),
        TaskStatus::Ready,
        "a was undone, so it runs again"
    );
    assert_eq!(
        sim.status("mid"),
        TaskStatus::Succeeded,
        "mid has no compensation: kept"
    );
    sim.complete("a", json!({}));
    sim.complete("b", json!({}));
    sim.complete("c", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
}

#[test]
fn retry_after_compensation_failed_keeps_what_was_not_undone() {
    let mut sim = rolling_back_from_c();
    // undo c succeeds, undo b fails twice (its budget): compensation_failed, a never undone.
    let id = sim.ready()[0].clone();
    let token = sim.claim_task(&id);
    sim.apply(Input::Complete {
        task: id,
        lease_token: token,
        output: json!({}),
        logs: None,
    })
    .unwrap();
    let undo_b = sim.ready()[0].clone();
    let token = sim.claim_task(&undo_b);
    sim.apply(Input::Fail {
        task: undo_b,
        lease_token: token,
        error: ReportedError {
            message: "x".into(),
            retryable: false,
            retry_after: None,
        },
        logs: None,
    })
    .unwrap();
    assert_eq!(sim.state.job.status, JobStatus::CompensationFailed);
    sim.operate(OperatorAction::Retry).unwrap();
    assert_eq!(sim.status("a"), TaskStatus::Succeeded);
    assert_eq!(
        sim.status("b"),
        TaskStatus::Succeeded,
        "its undo failed, so it is still in effect"
    );
    assert_eq!(sim.status("c"), TaskStatus::Ready);
    sim.complete("c", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
}

#[test]
fn skip_resolves_a_failed_task_by_hand_and_downstream_sees_its_output() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: q, command: c, input: {v: '${{ steps.a.output.v }}'}}\n",
        json!({}),
    );
    sim.fail("a", false);
    assert_eq!(sim.state.job.status, JobStatus::Failed);
    let a = sim.find("a", TaskKind::Step).id.clone();
    sim.operate(OperatorAction::Skip {
        task: a,
        output: json!({"v": 42}),
    })
    .unwrap();
    assert_eq!(sim.state.job.status, JobStatus::Running);
    assert_eq!(sim.status("a"), TaskStatus::Succeeded);
    assert_eq!(sim.find("b", TaskKind::Step).input, Some(json!({"v": 42})));
    assert!(
        sim.event_kinds()
            .contains(&EventKind::TaskResolvedByOperator)
    );
}

#[test]
fn skip_by_step_resolves_the_step_task_as_skip_by_id_does() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: q, command: c, input: {v: '${{ steps.a.output.v }}'}}\n",
        json!({}),
    );
    sim.fail("a", false);
    sim.operate(OperatorAction::SkipStep {
        step: "a".into(),
        output: json!({"v": 7}),
    })
    .unwrap();
    assert_eq!(sim.state.job.status, JobStatus::Running);
    assert_eq!(sim.status("a"), TaskStatus::Succeeded);
    assert_eq!(sim.find("b", TaskKind::Step).input, Some(json!({"v": 7})));
}

#[test]
fn skip_by_step_refuses_an_unknown_step_and_a_fan_out_step() {
    let mut sim = Sim::new(
        "steps:\n- {id: each, queue: q, command: c, for_each: '${{ params.items }}'}\n",
        json!({"items": [1, 2]}),
    );
    let unknown = sim.operate(OperatorAction::SkipStep {
        step: "nope".into(),
        output: json!({}),
    });
    assert!(
        matches!(&unknown, Err(Rejection::NotApplicable(m)) if m.ends_with("has no step 'nope'")),
        "{unknown:?}"
    );
    let fan_out = sim.operate(OperatorAction::SkipStep {
        step: "each".into(),
        output: json!({}),
    });
    assert!(
        matches!(&fan_out, Err(Rejection::NotApplicable(m)) if m.starts_with("a fan_out task cannot be skipped")),
        "{fan_out:?}"
    );
}

#[test]
fn skip_a_waiting_task_of_a_running_job() {
    let mut sim = Sim::new(SEQUENCE, json!({}));
    let b = sim.find("b", TaskKind::Step).id.clone();
    sim.operate(OperatorAction::Skip {
        task: b,
        output: json!({}),
    })
    .unwrap();
    sim.complete("a", json!({}));
    assert_eq!(sim.status("c"), TaskStatus::Ready);
}

#[test]
fn rerun_resets_a_step_and_everything_downstream() {
    let mut sim = Sim::new(SEQUENCE, json!({}));
    sim.complete("a", json!({"n": 1}));
    sim.complete("b", json!({}));
    sim.complete("c", json!({}));
    sim.operate(OperatorAction::Rerun { step: "b".into() })
        .unwrap();
    assert_eq!(sim.status("a"), TaskStatus::Succeeded);
    assert_eq!(sim.status("b"), TaskStatus::Ready);
    assert_eq!(sim.status("c"), TaskStatus::Waiting);
    sim.complete("b", json!({}));
    sim.complete("c", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
    assert!(sim.event_kinds().contains(&EventKind::JobRerun));
}

#[test]
fn retry_of_a_fan_out_reruns_only_its_failed_item() {
    let mut sim = Sim::new(
        "steps:\n- {id: each, queue: q, command: c, for_each: '${{ [1, 2, 3] }}'}\n",
        json!({}),
    );
    let items: Vec<TaskId> = sim.ready();
    let tokens: Vec<String> = items.iter().map(|id| sim.claim_task(id)).collect();
    for (n, (id, token)) in items.iter().zip(tokens).enumerate() {
        let input = if n == 1 {
            Input::Fail {
                task: id.clone(),
                lease_token: token,
                error: ReportedError {
                    message: "x".into(),
                    retryable: false,
                    retry_after: None,
                },
                logs: None,
            }
        } else {
            Input::Complete {
                task: id.clone(),
                lease_token: token,
                output: json!(n),
                logs: None,
            }
        };
        sim.apply(input).unwrap();
    }
    assert_eq!(sim.state.job.status, JobStatus::Failed);
    sim.operate(OperatorAction::Retry).unwrap();
    let ready = sim.ready();
    assert_eq!(ready.len(), 1);
    assert_eq!(sim.state.task(&ready[0]).unwrap().item, Some(1));
    let token = sim.claim_task(&ready[0]);
    sim.apply(Input::Complete {
        task: ready[0].clone(),
        lease_token: token,
        output: json!(1),
        logs: None,
    })
    .unwrap();
    assert_eq!(
        sim.find("each", TaskKind::FanOut).output,
        Some(json!([0, 1, 2]))
    );
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
}

#[test]
fn operator_actions_that_do_not_apply_are_refused_with_a_reason() {
    let mut sim = Sim::new(SEQUENCE, json!({}));
    let resume = sim.operate(OperatorAction::Resume).unwrap_err();
    assert!(resume.to_string().contains("only a paused job"), "{resume}");
    assert!(sim.operate(OperatorAction::Retry).is_err());
    assert!(
        sim.operate(OperatorAction::Rerun { step: "a".into() })
            .is_err()
    );
    let (a, _) = sim.claim("a");
    let skip = sim
        .operate(OperatorAction::Skip {
            task: a,
            output: json!({}),
        })
        .unwrap_err();
    assert!(skip.to_string().contains("task is running"), "{skip}");
    let before = sim.state.clone();
    sim.operate(OperatorAction::Cancel { compensate: false })
        .unwrap();
    assert!(sim.operate(OperatorAction::Pause).is_err());
    assert!(
        sim.operate(OperatorAction::Rerun {
            step: "nope".into()
        })
        .unwrap_err()
        .to_string()
        .contains("no step")
    );
    assert_ne!(before, sim.state);
}

#[test]
fn a_job_with_a_lock_waits_queued_until_started_and_releases_when_it_ends() {
    let mut sim = Sim::new(
        "lock: {key: 'db-${{ params.db }}'}\nsteps:\n- {id: a, queue: q, command: c}\n",
        json!({"db": "main"}),
    );
    assert_eq!(sim.state.job.status, JobStatus::Queued);
    assert_eq!(sim.state.job.lock.as_ref().unwrap().key, "db-main");
    assert!(sim.ready().is_empty(), "a queued job dispatches nothing");
    sim.apply(Input::Start).unwrap();
    assert_eq!(sim.state.job.status, JobStatus::Running);
    let (task, lease_token) = sim.claim("a");
    let actions = apply(
        &sim.workflow,
        &mut sim.state,
        Input::Complete {
            task,
            lease_token,
            output: json!({}),
            logs: None,
        },
        &mut Ctx {
            now: sim.now,
            ids: &mut sim.ids,
            limits: sim.limits,
        },
    )
    .unwrap();
    assert!(actions.contains(&Action::ReleaseLock {
        key: "db-main".into()
    }));
    assert!(sim.apply(Input::Start).is_err(), "only a queued job starts");
}

// Property tests: random DAGs, random outcomes, random interleavings.

#[derive(Debug, Clone)]
struct DagSpec {
    /// For each step, the earlier steps it depends on.
    dependencies: Vec<Vec<usize>>,
    compensated: Vec<bool>,
    max_attempts: Vec<u32>,
    /// What each step is: 0-6 a worker's task, 7 one that continues on failure, 8 `set`,
    /// 9 `fail`, 10 a sub-workflow.
    kinds: Vec<u8>,
}

fn dag_spec() -> impl Strategy<Value = DagSpec> {
    (1usize..8).prop_flat_map(|n| {
        let deps = (0..n)
            .map(|i| {
                proptest::collection::vec(0..i.max(1), 0..=i.min(3))
                    .prop_map(move |d| if i == 0 { vec![] } else { d })
            })
            .collect::<Vec<_>>();
        (
            deps,
            proptest::collection::vec(any::<bool>(), n),
            proptest::collection::vec(1u32..3, n),
            proptest::collection::vec(0u8..11, n),
        )
            .prop_map(|(dependencies, compensated, max_attempts, kinds)| DagSpec {
                dependencies,
                compensated,
                max_attempts,
                kinds,
            })
    })
}

fn yaml_of(spec: &DagSpec) -> String {
    let mut yaml = String::from("steps:\n");
    for (i, deps) in spec.dependencies.iter().enumerate() {
        let mut deps: Vec<String> = deps.iter().map(|d| format!("s{d}")).collect();
        deps.sort();
        deps.dedup();
        let deps = deps.join(", ");
        match spec.kinds[i] {
            8 => yaml.push_str(&format!(
                "- {{id: s{i}, depends_on: [{deps}], set: {{n: '${{{{ params.n }}}}'}}}}\n"
            )),
            9 => yaml.push_str(&format!(
                "- {{id: s{i}, depends_on: [{deps}], fail: {{message: stop}}}}\n"
            )),
            10 => yaml.push_str(&format!(
                "- {{id: s{i}, depends_on: [{deps}], workflow: child, retry: {{max_attempts: {}, initial: 1s}}}}\n",
                spec.max_attempts[i]
            )),
            kind => {
                yaml.push_str(&format!(
                    "- {{id: s{i}, queue: q, command: c, timeout: 10s, depends_on: [{deps}], retry: {{max_attempts: {}, initial: 1s}}",
                    spec.max_attempts[i]
                ));
                if spec.compensated[i] {
                    yaml.push_str(", compensate: {queue: q, command: undo}");
                }
                if kind == 7 {
                    yaml.push_str(", continue_on_failure: true");
                }
                yaml.push_str("}\n");
            }
        }
    }
    yaml
}

#[derive(Debug, Clone, Copy)]
enum Move {
    Claim(u8),
    Succeed(u8),
    Fail(u8, bool),
    CheckLater(u8),
    Heartbeat(u8),
    Advance(u16),
    Operate(u8, u8),
    /// A child job a task waits for ends (the status chosen by the second number).
    ChildEnds(u8, u8),
}

fn moves() -> impl Strategy<Value = Vec<Move>> {
    proptest::collection::vec(
        prop_oneof![
            4 => any::<u8>().prop_map(Move::Claim),
            4 => any::<u8>().prop_map(Move::Succeed),
            2 => (any::<u8>(), any::<bool>()).prop_map(|(i, r)| Move::Fail(i, r)),
            1 => any::<u8>().prop_map(Move::CheckLater),
            1 => any::<u8>().prop_map(Move::Heartbeat),
            2 => (0u16..15_000).prop_map(Move::Advance),
            1 => (0u8..6, any::<u8>()).prop_map(|(a, i)| Move::Operate(a, i)),
            2 => (any::<u8>(), 0u8..4).prop_map(|(i, s)| Move::ChildEnds(i, s)),
        ],
        0..120,
    )
}

struct Held {
    task: TaskId,
    token: String,
}

fn check_invariants(sim: &Sim) {
    for task in &sim.state.tasks {
        let leased = task.lease_token.is_some();
        let running_on_a_worker = task.status == TaskStatus::Running && task.wait.is_none();
        assert!(
            leased == running_on_a_worker || (leased && task.status == TaskStatus::Succeeded),
            "a lease iff running and not waiting on the server, or the token of the attempt \
             that succeeded: {task:?}"
        );
        if task.wait.is_some() {
            assert_eq!(
                task.status,
                TaskStatus::Running,
                "only a running task waits"
            );
        }
        if task.pending_outcome.is_some() {
            assert!(task.held, "an outcome is kept only while the job is paused");
        }
    }
    // A cancel without compensation ends the job at once; its running tasks report later.
    if sim.state.job.status.is_terminal() && sim.state.job.status != JobStatus::Cancelled {
        assert!(
            sim.state
                .tasks
                .iter()
                .all(|t| t.status != TaskStatus::Running),
            "no running task in a finished job"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Any interleaving of outcomes on an acyclic DAG ends in a terminal job state once workers
    /// keep answering, with at most one live lease per task throughout, and compensations in
    /// reverse order of completion.
    #[test]
    fn every_dag_reaches_a_terminal_state(spec in dag_spec(), moves in moves()) {
        let mut new = NewJob::new(JobId::from_unique("1"), "default".into(), 1, json!({"n": 1}));
        new.child_versions = BTreeMap::from([("child".to_owned(), 1)]);
        let mut sim = Sim::created(&yaml_of(&spec), new, Limits::default());
        let mut held: Vec<Held> = Vec::new();
        for step in moves {
            match step {
                Move::Claim(i) => {
                    let ready = sim.ready();
                    if !ready.is_empty() {
                        let id = ready[i as usize % ready.len()].clone();
                        let token = sim.claim_task(&id);
                        held.push(Held { task: id, token });
                    }
                }
                Move::Succeed(i) | Move::Fail(i, _) | Move::CheckLater(i) | Move::Heartbeat(i) if !held.is_empty() => {
                    let index = i as usize % held.len();
                    let Held { task, token } = if matches!(step, Move::Heartbeat(_)) {
                        Held { task: held[index].task.clone(), token: held[index].token.clone() }
                    } else {
                        held.swap_remove(index)
                    };
                    let input = match step {
                        Move::Succeed(_) => Input::Complete { task, lease_token: token, output: json!({}), logs: None },
                        Move::Fail(_, retryable) => Input::Fail { task, lease_token: token, error: ReportedError { message: "x".into(), retryable, retry_after: None }, logs: None },
                        Move::CheckLater(_) => Input::CheckLater { task, lease_token: token, after: Duration::from_secs(2), progress: None },
                        _ => Input::Heartbeat { task, lease_token: token, progress: None },
                    };
                    // Stale reports (the lease lapsed meanwhile) are refused and change nothing.
                    let before = sim.state.clone();
                    if sim.apply(input).is_err() {
                        prop_assert_eq!(&before, &sim.state);
                    }
                }
                Move::Advance(ms) => sim.advance(Duration::from_millis(u64::from(ms))),
                Move::ChildEnds(i, status) => {
                    let waited = sim.awaited_children();
                    if !waited.is_empty() {
                        let child = waited[i as usize % waited.len()].clone();
                        let status = [JobStatus::Succeeded, JobStatus::Failed, JobStatus::Cancelled, JobStatus::CompensationFailed][status as usize];
                        let before = sim.state.clone();
                        let ended = sim.apply(Input::ChildEnded { child, status, output: Some(json!({})), error: None });
                        if ended.is_err() {
                            prop_assert_eq!(&before, &sim.state);
                        }
                    }
                }
                Move::Operate(action, i) => {
                    let task = sim.state.tasks[i as usize % sim.state.tasks.len()].id.clone();
                    let action = match action {
                        0 => OperatorAction::Pause,
                        1 => OperatorAction::Resume,
                        2 => OperatorAction::Retry,
                        3 => OperatorAction::Skip { task, output: json!({"by": "hand"}) },
                        4 => OperatorAction::Rerun { step: format!("s{}", i as usize % spec.dependencies.len()) },
                        _ => OperatorAction::Cancel { compensate: i % 2 == 0 },
                    };
                    // A refused action changes nothing.
                    let before = sim.state.clone();
                    if sim.operate(action).is_err() {
                        prop_assert_eq!(&before, &sim.state);
                    }
                }
                _ => {}
            }
            check_invariants(&sim);
        }
        // Drain: answer everything with success until the job ends.
        for _ in 0..500 {
            if sim.state.job.status.is_terminal() {
                break;
            }
            if sim.state.job.status == JobStatus::Paused {
                sim.operate(OperatorAction::Resume).unwrap();
            }
            for Held { task, token } in held.drain(..) {
                let _ = sim.apply(Input::Complete { task, lease_token: token, output: json!({}), logs: None });
            }
            // Children end as asked: a rollback (or a cancel) ends cancelled, the others succeed.
            for child in sim.awaited_children() {
                let status = if sim.state.job.status == JobStatus::Running || sim.state.job.status == JobStatus::Paused {
                    JobStatus::Succeeded
                } else {
                    JobStatus::Cancelled
                };
                sim.apply(Input::ChildEnded { child, status, output: Some(json!({})), error: None }).unwrap();
            }
            let ready = sim.ready();
            if ready.is_empty() {
                sim.advance(Duration::from_secs(5));
                continue;
            }
            for id in ready {
                // A completion may end the job's going forward (a `fail` step it frees).
                if !sim.ready().contains(&id) {
                    continue;
                }
                let token = sim.claim_task(&id);
                sim.apply(Input::Complete { task: id, lease_token: token, output: json!({}), logs: None }).unwrap();
            }
            check_invariants(&sim);
        }
        prop_assert!(sim.state.job.status.is_terminal(), "job stuck: {:?}", sim.summary());
        prop_assert!(matches!(
            sim.state.job.status,
            JobStatus::Succeeded | JobStatus::Failed | JobStatus::CompensationFailed | JobStatus::Cancelled | JobStatus::TimedOut
        ));

        // Compensations of succeeded tasks ran in reverse order of completion.
        let completed: Vec<(u64, TaskId)> = sim.state.tasks.iter()
            .filter(|t| t.kind == TaskKind::Step && t.status == TaskStatus::Succeeded)
            .filter_map(|t| t.completed_seq.map(|s| (s, t.id.clone())))
            .collect();
        let undone: Vec<u64> = sim.state.tasks.iter()
            .filter(|t| t.kind == TaskKind::Compensation && t.round == sim.state.job.round)
            .filter_map(|t| t.compensates.as_ref())
            .filter_map(|id| completed.iter().find(|(_, c)| c == id).map(|(s, _)| *s))
            .collect();
        let mut expected = undone.clone();
        expected.sort_by(|a, b| b.cmp(a));
        prop_assert_eq!(undone, expected);
        if sim.state.job.status == JobStatus::Succeeded {
            prop_assert!(sim.state.tasks.iter().all(|t| t.kind != TaskKind::Compensation || t.round < sim.state.job.round));
            // Every step ended in a way the job goes on from, and the failed ones are named.
            let steps: Vec<&Task> = sim.state.tasks.iter().filter(|t| t.kind == TaskKind::Step).collect();
            prop_assert!(steps.iter().all(|t| sim.workflow.lets_dependants_go_on(&t.step, t.status)));
            let failed: Vec<String> = steps.iter().filter(|t| t.status == TaskStatus::Failed).map(|t| t.step.clone()).collect();
            prop_assert_eq!(&sim.state.job.failed_steps, &failed);
            prop_assert!(failed.iter().all(|step| sim.workflow.continues_on_failure(step)));
        } else {
            prop_assert!(sim.state.job.failed_steps.is_empty());
        }
    }
}

mod children;
mod control;
mod operator_tasks;
mod routing;
mod waits;
