//! Waiting steps (sleep, signal, approval) and tasks awaiting a callback, in the state machine.

use serde_json::{Value, json};

use super::Sim;
use crate::ids::TaskId;
use crate::model::{
    Action, CallbackCall, CallbackGrant, ErrorKind, EventKind, Input, JobStatus, OperatorAction,
    Rejection, ReportedError, TaskKind, TaskStatus, WaitFor,
};
use crate::time::{Duration, Timestamp};

impl Sim {
    fn signal(&mut self, name: &str, payload: Value) -> Result<(), Rejection> {
        self.apply(Input::Signal {
            name: name.into(),
            payload,
            id: None,
            sender: "tester".into(),
        })
    }

    fn decide(&mut self, step: &str, approve: bool) -> Result<(), Rejection> {
        let task = self.find(step, TaskKind::Step).id.clone();
        self.apply(Input::Decide {
            task,
            approve,
            by: "alice".into(),
            comment: Some("looks fine".into()),
        })
    }

    fn wait_of(&self, step: &str, kind: TaskKind) -> Option<WaitFor> {
        self.find(step, kind)
            .wait
            .as_ref()
            .map(|wait| wait.on.clone())
    }

    fn output(&self, step: &str) -> Value {
        self.find(step, TaskKind::Step).output.clone().unwrap()
    }

    /// Claims `step`, hands it to "another system" and returns the task, its attempt and the
    /// callback hash the claim recorded.
    fn await_callback(&mut self, step: &str, timeout: Option<Duration>) -> (TaskId, u32, String) {
        let (task, lease_token) = self.claim(step);
        self.apply(Input::AwaitCallback {
            task: task.clone(),
            lease_token,
            timeout,
        })
        .unwrap();
        let grant = self.state.task(&task).unwrap().callback.clone().unwrap();
        (task, grant.attempt, grant.hash)
    }

    fn call_back(
        &mut self,
        task: &TaskId,
        attempt: u32,
        hash: &str,
        call: CallbackCall,
        digest: &str,
    ) -> Result<(), Rejection> {
        self.apply(Input::Callback {
            task: task.clone(),
            attempt,
            token_hash: hash.into(),
            call,
            digest: digest.into(),
        })
    }
}

fn complete_call(output: Value) -> CallbackCall {
    CallbackCall::Complete { output }
}

#[test]
fn a_sleep_waits_holding_no_worker_and_succeeds_at_its_time() {
    let mut sim = Sim::new(
        "steps:\n- {id: nap, sleep: 10m}\n- {id: b, queue: q, command: c}\n",
        json!({}),
    );
    let start = sim.now;
    let nap = sim.find("nap", TaskKind::Step);
    assert_eq!(nap.status, TaskStatus::Running);
    assert_eq!(nap.lease_token, None);
    assert_eq!(nap.queue, "");
    let until = start.saturating_add(Duration::from_secs(600));
    assert_eq!(
        sim.wait_of("nap", TaskKind::Step),
        Some(WaitFor::Sleep { until })
    );
    assert!(sim.ready().is_empty(), "nothing is handed to a worker");
    sim.advance(Duration::from_secs(599));
    assert_eq!(sim.status("nap"), TaskStatus::Running);
    sim.advance(Duration::from_secs(1));
    assert_eq!(sim.status("nap"), TaskStatus::Succeeded);
    assert_eq!(
        sim.output("nap"),
        json!({"slept_until": until.to_rfc3339()})
    );
    assert_eq!(sim.find("nap", TaskKind::Step).wait, None);
    assert_eq!(sim.status("b"), TaskStatus::Ready);
}

#[test]
fn sleep_until_reads_params_and_a_past_time_wakes_at_once() {
    let yaml = "steps:\n- {id: at, sleep_until: '${{ params.when }}'}\n";
    let past = Sim::new(yaml, json!({"when": "1970-01-01T00:00:00Z"}));
    assert_eq!(
        past.status("at"),
        TaskStatus::Succeeded,
        "{:?}",
        past.state.tasks[0]
    );
    assert_eq!(past.state.job.status, JobStatus::Succeeded);
    assert_eq!(
        past.output("at"),
        json!({"slept_until": "1970-01-01T00:00:00Z"})
    );

    let later = Timestamp(1_000_000 + 3_600_000).to_rfc3339();
    let mut future = Sim::new(yaml, json!({"when": later}));
    assert_eq!(future.status("at"), TaskStatus::Running);
    future.advance(Duration::from_secs(3600));
    assert_eq!(future.status("at"), TaskStatus::Succeeded);

    let bad = Sim::new(yaml, json!({"when": "tomorrow"}));
    let task = bad.find("at", TaskKind::Step);
    assert_eq!(task.status, TaskStatus::Failed);
    let error = task.error.as_ref().unwrap();
    assert_eq!(error.kind, ErrorKind::Expression);
    assert!(error.message.contains("sleep_until"), "{}", error.message);
    assert!(error.message.contains("RFC 3339"), "{}", error.message);
}

#[test]
fn a_signal_sent_before_its_step_waits_is_kept_and_taken_later() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c}\n- {id: paid, signal: payment_received}\n",
        json!({}),
    );
    sim.signal("payment_received", json!({"amount": 5}))
        .unwrap();
    assert_eq!(sim.state.signals.len(), 1, "kept until a step takes it");
    assert!(sim.event_kinds().contains(&EventKind::SignalReceived));
    sim.complete("a", json!({}));
    assert_eq!(sim.status("paid"), TaskStatus::Succeeded);
    assert_eq!(sim.output("paid"), json!({"amount": 5}));
    assert!(sim.state.signals.is_empty());
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
}

#[test]
fn each_signal_resolves_one_task_oldest_signal_to_the_first_waiter() {
    let mut sim = Sim::new(
        "steps:\n- {id: each, signal: go, for_each: '${{ params.items }}'}\n",
        json!({"items": [1, 2, 3]}),
    );
    let items = |sim: &Sim| -> Vec<TaskStatus> {
        let mut items: Vec<_> = sim
            .state
            .tasks
            .iter()
            .filter(|t| t.kind == TaskKind::Item)
            .map(|t| (t.item, t.status))
            .collect();
        items.sort();
        items.into_iter().map(|(_, s)| s).collect()
    };
    assert_eq!(items(&sim), vec![TaskStatus::Running; 3]);
    sim.signal("go", json!("first")).unwrap();
    sim.signal("go", json!("second")).unwrap();
    assert_eq!(
        items(&sim),
        vec![
            TaskStatus::Succeeded,
            TaskStatus::Succeeded,
            TaskStatus::Running
        ]
    );
    let outputs: Vec<Value> = sim
        .state
        .tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Item && t.status == TaskStatus::Succeeded)
        .map(|t| json!([t.item, t.output]))
        .collect();
    assert!(outputs.contains(&json!([0, "first"])), "{outputs:?}");
    assert!(outputs.contains(&json!([1, "second"])), "{outputs:?}");
    sim.signal("go", json!("third")).unwrap();
    assert_eq!(sim.status("each"), TaskStatus::Succeeded);
    let each = sim.find("each", TaskKind::FanOut);
    assert_eq!(each.output, Some(json!(["first", "second", "third"])));
}

#[test]
fn signals_a_job_cannot_take_are_refused() {
    let mut sim = Sim::with_limits(
        "steps:\n- {id: a, queue: q, command: c}\n- {id: s, signal: go}\n",
        json!({}),
        crate::limits::Limits {
            pending_signals: 2,
            ..crate::limits::Limits::default()
        },
    );
    assert!(matches!(
        sim.signal("stop", json!(null)),
        Err(Rejection::UnknownSignal { .. })
    ));
    sim.signal("go", json!(1)).unwrap();
    sim.signal("go", json!(2)).unwrap();
    assert!(matches!(
        sim.signal("go", json!(3)),
        Err(Rejection::TooManySignals(2))
    ));
    sim.operate(OperatorAction::Cancel { compensate: false })
        .unwrap();
    assert!(matches!(
        sim.signal("go", json!(4)),
        Err(Rejection::NotApplicable(_))
    ));
}

#[test]
fn approval_succeeds_with_who_and_when_and_a_second_decision_is_refused() {
    let mut sim = Sim::new(
        "steps:\n- id: ok\n  approval: {prompt: 'Migrate ${{ params.cluster }}?'}\n",
        json!({"cluster": "eu-1"}),
    );
    assert_eq!(
        sim.wait_of("ok", TaskKind::Step),
        Some(WaitFor::Approval {
            prompt: "Migrate eu-1?".into()
        })
    );
    sim.decide("ok", true).unwrap();
    assert_eq!(
        sim.output("ok"),
        json!({"approved": true, "by": "alice", "comment": "looks fine", "at": sim.now.to_rfc3339()})
    );
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
    assert!(matches!(
        sim.decide("ok", false),
        Err(Rejection::NotApplicable(_))
    ));
}

#[test]
fn rejection_fails_the_step_for_good_and_the_job_compensates() {
    let mut sim = Sim::new(
        "steps:\n- {id: a, queue: q, command: c, compensate: {queue: q, command: undo}}\n- {id: ok, approval: {}}\n",
        json!({}),
    );
    sim.complete("a", json!({}));
    sim.decide("ok", false).unwrap();
    let task = sim.find("ok", TaskKind::Step);
    assert_eq!(task.status, TaskStatus::Failed);
    let error = task.error.clone().unwrap();
    assert_eq!(error.kind, ErrorKind::Rejected);
    assert_eq!(error.message, "rejected by alice: looks fine");
    assert_eq!(sim.state.job.status, JobStatus::Compensating);
    sim.complete("a", json!({}));
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn deciding_a_task_that_waits_for_no_approval_is_refused() {
    let mut sim = Sim::new("steps:\n- {id: s, signal: go}\n", json!({}));
    assert!(matches!(
        sim.decide("s", true),
        Err(Rejection::NotApplicable(_))
    ));
    assert_eq!(sim.status("s"), TaskStatus::Running);
}

#[test]
fn while_paused_decisions_and_due_sleeps_wait_for_resume() {
    let mut sim = Sim::new(
        "steps:\n- {id: ok, approval: {}}\n- {id: nap, sleep: 1m, depends_on: []}\n- {id: s, signal: go, depends_on: []}\n",
        json!({}),
    );
    sim.operate(OperatorAction::Pause).unwrap();
    sim.decide("ok", true).unwrap();
    assert_eq!(sim.status("ok"), TaskStatus::Running, "kept for resume");
    assert!(matches!(
        sim.decide("ok", false),
        Err(Rejection::NotApplicable(_))
    ));
    sim.signal("go", json!("x")).unwrap();
    assert_eq!(sim.status("s"), TaskStatus::Running);
    sim.advance(Duration::from_secs(120));
    assert_eq!(
        sim.status("nap"),
        TaskStatus::Running,
        "a paused job sleeps on"
    );
    sim.operate(OperatorAction::Resume).unwrap();
    assert_eq!(sim.status("ok"), TaskStatus::Succeeded);
    assert_eq!(sim.status("nap"), TaskStatus::Succeeded);
    assert_eq!(sim.status("s"), TaskStatus::Succeeded);
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
}

#[test]
fn step_timeout_fails_a_wait_for_good() {
    let mut sim = Sim::new(
        "steps:\n- {id: s, signal: go, step_timeout: 1h}\n",
        json!({}),
    );
    sim.advance(Duration::from_secs(3600));
    let task = sim.find("s", TaskKind::Step);
    assert_eq!(task.status, TaskStatus::Failed);
    assert_eq!(task.error.as_ref().unwrap().kind, ErrorKind::StepTimeout);
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn winding_down_cancels_waits_at_once_and_compensates_an_awaited_callback() {
    let mut sim = Sim::new(
        "steps:\n- {id: ext, queue: q, command: c, compensate: {queue: q, command: undo}}\n- {id: nap, sleep: 1h, depends_on: []}\n- {id: ok, approval: {}, depends_on: [], compensate: {queue: q, command: undo}}\n- {id: boom, queue: q, command: c, depends_on: []}\n",
        json!({}),
    );
    let (ext, attempt, hash) = sim.await_callback("ext", None);
    sim.fail("boom", false);
    assert_eq!(sim.status("nap"), TaskStatus::Cancelled);
    assert_eq!(sim.status("ok"), TaskStatus::Cancelled);
    assert_eq!(sim.status("ext"), TaskStatus::Cancelled);
    // The interrupted callback task is undone; the approval that never started is not.
    assert_eq!(
        sim.call_back(&ext, attempt, &hash, complete_call(json!(1)), "d"),
        Err(Rejection::CallbackGone(format!(
            "task {ext} (ext) is cancelled: the attempt this token was issued for has ended"
        )))
    );
    sim.complete("ext", json!({}));
    assert_eq!(sim.compensation_order(), vec!["ext".to_owned()]);
    assert_eq!(sim.state.job.status, JobStatus::Failed);
}

#[test]
fn a_callback_finishes_an_awaiting_task_once_and_a_repeat_changes_nothing() {
    let mut sim = Sim::new(
        "steps:\n- {id: ext, queue: q, command: c}\n- {id: b, queue: q, command: c}\n",
        json!({}),
    );
    let (ext, attempt, hash) = sim.await_callback("ext", None);
    let task = sim.state.task(&ext).unwrap();
    assert_eq!(task.status, TaskStatus::Running);
    assert_eq!(task.lease_token, None);
    assert_eq!(task.queue, "q", "it keeps its place on its queue");
    assert_eq!(
        sim.call_back(&ext, attempt, "wrong", complete_call(json!(1)), "d1"),
        Err(Rejection::UnknownCallback)
    );
    assert_eq!(
        sim.call_back(&ext, attempt + 1, &hash, complete_call(json!(1)), "d1"),
        Err(Rejection::UnknownCallback)
    );
    sim.call_back(&ext, attempt, &hash, CallbackCall::Heartbeat, "")
        .unwrap();
    sim.call_back(
        &ext,
        attempt,
        &hash,
        complete_call(json!({"done": 1})),
        "d1",
    )
    .unwrap();
    assert_eq!(sim.status("ext"), TaskStatus::Succeeded);
    assert_eq!(sim.output("ext"), json!({"done": 1}));
    assert_eq!(sim.status("b"), TaskStatus::Ready);
    let events = sim.events.len();
    sim.call_back(
        &ext,
        attempt,
        &hash,
        complete_call(json!({"done": 1})),
        "d1",
    )
    .unwrap();
    assert_eq!(
        sim.events.len(),
        events,
        "an identical repeat changes nothing"
    );
    for call in [
        complete_call(json!(2)),
        CallbackCall::Fail {
            error: ReportedError {
                message: "x".into(),
                retryable: false,
                retry_after: None,
            },
        },
        CallbackCall::Heartbeat,
    ] {
        let digest = if matches!(call, CallbackCall::Complete { .. }) {
            "d2"
        } else {
            "d1"
        };
        assert!(matches!(
            sim.call_back(&ext, attempt, &hash, call, digest),
            Err(Rejection::CallbackGone(_))
        ));
    }
}

#[test]
fn a_callback_before_await_callback_completes_at_once_and_the_worker_is_fenced() {
    let mut sim = Sim::new("steps:\n- {id: ext, queue: q, command: c}\n", json!({}));
    let (ext, lease_token) = sim.claim("ext");
    let grant = sim.state.task(&ext).unwrap().callback.clone().unwrap();
    sim.call_back(
        &ext,
        grant.attempt,
        &grant.hash,
        complete_call(json!(7)),
        "d",
    )
    .unwrap();
    assert_eq!(sim.status("ext"), TaskStatus::Succeeded);
    let late = sim.apply(Input::AwaitCallback {
        task: ext,
        lease_token,
        timeout: None,
    });
    assert!(matches!(late, Err(Rejection::StaleLease { .. })));
}

#[test]
fn a_callback_timeout_fails_the_attempt_retryably_and_a_new_claim_gets_a_new_token() {
    let mut sim = Sim::new(
        "steps:\n- {id: ext, queue: q, command: c, retry: {max_attempts: 2, initial: 1s}}\n",
        json!({}),
    );
    let (ext, attempt, hash) = sim.await_callback("ext", Some(Duration::from_secs(60)));
    sim.advance(Duration::from_secs(30));
    sim.call_back(&ext, attempt, &hash, CallbackCall::Heartbeat, "")
        .unwrap();
    sim.advance(Duration::from_secs(59));
    assert_eq!(
        sim.status("ext"),
        TaskStatus::Running,
        "the heartbeat moved the end"
    );
    sim.advance(Duration::from_secs(1));
    let task = sim.state.task(&ext).unwrap();
    assert_eq!(task.status, TaskStatus::Ready);
    assert_eq!(
        task.error.as_ref().unwrap().kind,
        ErrorKind::CallbackTimeout
    );
    assert!(matches!(
        sim.call_back(&ext, attempt, &hash, complete_call(json!(1)), "d"),
        Err(Rejection::CallbackGone(_))
    ));
    sim.advance(Duration::from_secs(1));
    let (_, second, new_hash) = sim.await_callback("ext", None);
    assert_eq!(second, attempt + 1);
    assert!(matches!(
        sim.call_back(&ext, attempt, &hash, complete_call(json!(1)), "d"),
        Err(Rejection::CallbackGone(_))
    ));
    sim.call_back(&ext, second, &new_hash, complete_call(json!(1)), "d")
        .unwrap();
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
}

#[test]
fn a_callback_wait_never_outlasts_the_step_timeout() {
    let mut sim = Sim::new(
        "steps:\n- {id: ext, queue: q, command: c, step_timeout: 10m}\n",
        json!({}),
    );
    let (ext, _, _) = sim.await_callback("ext", Some(Duration::from_secs(3600)));
    let Some(WaitFor::Callback { until, .. }) = sim.wait_of("ext", TaskKind::Step) else {
        panic!("awaiting a callback");
    };
    assert_eq!(until, sim.state.task(&ext).unwrap().deadline_at.unwrap());
    sim.advance(Duration::from_secs(600));
    let task = sim.state.task(&ext).unwrap();
    assert_eq!(task.status, TaskStatus::Failed);
    assert_eq!(task.error.as_ref().unwrap().kind, ErrorKind::StepTimeout);
}

#[test]
fn a_rerun_keeps_consumed_signals_consumed_and_waits_for_a_new_one() {
    let mut sim = Sim::new("steps:\n- {id: s, signal: go}\n", json!({}));
    sim.signal("go", json!("one")).unwrap();
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
    sim.operate(OperatorAction::Rerun { step: "s".into() })
        .unwrap();
    assert_eq!(sim.status("s"), TaskStatus::Running);
    assert_eq!(sim.state.job.status, JobStatus::Running);
    sim.signal("go", json!("two")).unwrap();
    assert_eq!(sim.output("s"), json!("two"));
}

#[test]
fn an_operator_may_skip_a_sleep_being_waited_for() {
    let mut sim = Sim::new("steps:\n- {id: nap, sleep: 1d}\n", json!({}));
    let nap = sim.find("nap", TaskKind::Step).id.clone();
    sim.operate(OperatorAction::Skip {
        task: nap,
        output: json!({"skipped": true}),
    })
    .unwrap();
    assert_eq!(sim.status("nap"), TaskStatus::Succeeded);
    assert_eq!(sim.state.job.status, JobStatus::Succeeded);
}

#[test]
fn cancel_ends_every_wait() {
    let mut sim = Sim::new(
        "steps:\n- {id: nap, sleep: 1h}\n- {id: s, signal: go, depends_on: []}\n- {id: ext, queue: q, command: c, depends_on: []}\n",
        json!({}),
    );
    let (ext, attempt, hash) = sim.await_callback("ext", None);
    sim.operate(OperatorAction::Cancel { compensate: false })
        .unwrap();
    assert_eq!(sim.state.job.status, JobStatus::Cancelled);
    for step in ["nap", "s", "ext"] {
        assert_eq!(sim.status(step), TaskStatus::Cancelled, "{step}");
    }
    assert!(matches!(
        sim.call_back(&ext, attempt, &hash, complete_call(json!(1)), "d"),
        Err(Rejection::CallbackGone(_))
    ));
}

#[test]
fn consuming_a_signal_is_an_action_the_engine_persists() {
    let mut sim = Sim::new("steps:\n- {id: s, signal: go}\n", json!({}));
    let actions = crate::machine::apply(
        &sim.workflow,
        &mut sim.state,
        Input::Signal {
            name: "go".into(),
            payload: json!(1),
            id: Some("once".into()),
            sender: "tester".into(),
        },
        &mut crate::machine::Ctx {
            now: sim.now,
            ids: &mut sim.ids,
            limits: sim.limits,
        },
    )
    .unwrap();
    let task = sim.find("s", TaskKind::Step).id.clone();
    assert!(actions.iter().any(
        |a| matches!(a, Action::InsertSignal(s) if s.seq == 0 && s.id.as_deref() == Some("once"))
    ));
    assert!(actions.contains(&Action::ConsumeSignal { seq: 0, task }));
}

/// A step of a random workflow: a worker's task, or a step that waits on the server.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Task,
    Sleep,
    Signal,
    Approval,
}

fn yaml_with_kinds(spec: &super::DagSpec, kinds: &[Kind]) -> String {
    let mut yaml = String::from("steps:\n");
    for (i, deps) in spec.dependencies.iter().enumerate() {
        let mut deps: Vec<String> = deps.iter().map(|d| format!("s{d}")).collect();
        deps.sort();
        deps.dedup();
        let what = match kinds[i] {
            Kind::Task => format!(
                "queue: q, command: c, timeout: 10s, retry: {{max_attempts: {}, initial: 1s}}",
                spec.max_attempts[i]
            ),
            Kind::Sleep => "sleep: 3s".to_owned(),
            Kind::Signal => "signal: go".to_owned(),
            Kind::Approval => "approval: {}".to_owned(),
        };
        yaml.push_str(&format!(
            "- {{id: s{i}, {what}, depends_on: [{}]",
            deps.join(", ")
        ));
        if spec.compensated[i] && !matches!(kinds[i], Kind::Sleep) {
            yaml.push_str(", compensate: {queue: q, command: undo}");
        }
        yaml.push_str("}\n");
    }
    yaml
}

#[derive(Debug, Clone, Copy)]
enum WaitMove {
    Claim(u8),
    Succeed(u8),
    Fail(u8, bool),
    AwaitCallback(u8),
    CallBack(u8, bool),
    Signal,
    Decide(u8, bool),
    Advance(u16),
    Operate(u8, u8),
}

fn wait_moves() -> impl proptest::strategy::Strategy<Value = Vec<WaitMove>> {
    use proptest::prelude::*;
    proptest::collection::vec(
        prop_oneof![
            3 => any::<u8>().prop_map(WaitMove::Claim),
            3 => any::<u8>().prop_map(WaitMove::Succeed),
            1 => (any::<u8>(), any::<bool>()).prop_map(|(i, r)| WaitMove::Fail(i, r)),
            2 => any::<u8>().prop_map(WaitMove::AwaitCallback),
            2 => (any::<u8>(), any::<bool>()).prop_map(|(i, ok)| WaitMove::CallBack(i, ok)),
            2 => Just(WaitMove::Signal),
            2 => (any::<u8>(), any::<bool>()).prop_map(|(i, ok)| WaitMove::Decide(i, ok)),
            2 => (0u16..15_000).prop_map(WaitMove::Advance),
            1 => (0u8..6, any::<u8>()).prop_map(|(a, i)| WaitMove::Operate(a, i)),
        ],
        0..120,
    )
}

impl Sim {
    /// The running tasks waiting for `what` (by the kind of wait).
    fn waiting_on(&self, what: fn(&WaitFor) -> bool) -> Vec<TaskId> {
        self.state
            .tasks
            .iter()
            .filter(|t| {
                t.status == TaskStatus::Running && t.wait.as_ref().is_some_and(|w| what(&w.on))
            })
            .map(|t| t.id.clone())
            .collect()
    }

    /// A call back on an awaited task through its current grant (as its token would).
    fn call_back_task(&mut self, task: &TaskId, complete: bool) -> Result<(), Rejection> {
        let grant = self.state.task(task).unwrap().callback.clone().unwrap();
        let call = if complete {
            complete_call(json!({"via": "callback"}))
        } else {
            CallbackCall::Fail {
                error: ReportedError {
                    message: "the other system failed".into(),
                    retryable: true,
                    retry_after: None,
                },
            }
        };
        let digest = if complete { "ok" } else { "failed" };
        self.call_back(task, grant.attempt, &grant.hash, call, digest)
    }
}

fn is_callback(on: &WaitFor) -> bool {
    matches!(on, WaitFor::Callback { .. })
}

fn is_approval(on: &WaitFor) -> bool {
    matches!(on, WaitFor::Approval { .. })
}

fn is_signal(on: &WaitFor) -> bool {
    matches!(on, WaitFor::Signal { .. })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

    /// Workflows mixing tasks with sleeps, signals and approvals, under any interleaving of
    /// worker reports, callbacks, signals, decisions, time and operator actions: a refused
    /// input changes nothing, the wait invariants hold throughout, and once everything is
    /// answered the job ends.
    #[test]
    fn every_dag_with_waits_reaches_a_terminal_state(
        spec in super::dag_spec(),
        kinds in proptest::collection::vec(0u8..4, 8),
        moves in wait_moves(),
    ) {
        let kinds: Vec<Kind> = kinds
            .iter()
            .map(|k| [Kind::Task, Kind::Sleep, Kind::Signal, Kind::Approval][*k as usize])
            .collect();
        let mut sim = Sim::new(&yaml_with_kinds(&spec, &kinds), json!({}));
        let mut held: Vec<(TaskId, String)> = Vec::new();
        for step in moves {
            let before = sim.state.clone();
            let outcome = match step {
                WaitMove::Claim(i) => {
                    let ready = sim.ready();
                    if !ready.is_empty() {
                        let id = ready[i as usize % ready.len()].clone();
                        let token = sim.claim_task(&id);
                        held.push((id, token));
                    }
                    Ok(())
                }
                WaitMove::Succeed(i) | WaitMove::Fail(i, _) | WaitMove::AwaitCallback(i) if !held.is_empty() => {
                    let (task, lease_token) = held.swap_remove(i as usize % held.len());
                    sim.apply(match step {
                        WaitMove::Succeed(_) => Input::Complete { task, lease_token, output: json!({}), logs: None },
                        WaitMove::Fail(_, retryable) => Input::Fail { task, lease_token, error: ReportedError { message: "x".into(), retryable, retry_after: None }, logs: None },
                        _ => Input::AwaitCallback { task, lease_token, timeout: Some(Duration::from_secs(20)) },
                    })
                }
                WaitMove::CallBack(i, complete) => {
                    let awaiting = sim.waiting_on(is_callback);
                    match awaiting.get(i as usize % awaiting.len().max(1)) {
                        Some(task) => sim.call_back_task(&task.clone(), complete),
                        None => Ok(()),
                    }
                }
                WaitMove::Signal => {
                    let takes = kinds.iter().take(spec.dependencies.len()).any(|k| matches!(k, Kind::Signal));
                    let finished = sim.state.job.status.is_terminal();
                    let sent = sim.signal("go", json!({"n": 1}));
                    if !takes && !finished {
                        let refused = matches!(sent, Err(Rejection::UnknownSignal { .. }));
                        proptest::prop_assert!(refused, "a signal no step waits for is refused");
                    }
                    sent
                }
                WaitMove::Decide(i, approve) => {
                    let waiting = sim.waiting_on(is_approval);
                    match waiting.get(i as usize % waiting.len().max(1)) {
                        Some(task) => sim.apply(Input::Decide { task: task.clone(), approve, by: "p".into(), comment: None }),
                        None => Ok(()),
                    }
                }
                WaitMove::Advance(ms) => {
                    sim.advance(Duration::from_millis(u64::from(ms)));
                    Ok(())
                }
                WaitMove::Operate(action, i) => {
                    let task = sim.state.tasks[i as usize % sim.state.tasks.len()].id.clone();
                    sim.operate(match action {
                        0 => OperatorAction::Pause,
                        1 => OperatorAction::Resume,
                        2 => OperatorAction::Retry,
                        3 => OperatorAction::Skip { task, output: json!({"by": "hand"}) },
                        4 => OperatorAction::Rerun { step: format!("s{}", i as usize % spec.dependencies.len()) },
                        _ => OperatorAction::Cancel { compensate: i % 2 == 0 },
                    })
                }
                _ => Ok(()),
            };
            if outcome.is_err() {
                proptest::prop_assert_eq!(&before, &sim.state, "a refused input changed the job");
            }
            super::check_invariants(&sim);
        }
        // Answer everything until the job ends.
        for _ in 0..500 {
            if sim.state.job.status.is_terminal() {
                break;
            }
            if sim.state.job.status == JobStatus::Paused {
                sim.operate(OperatorAction::Resume).unwrap();
            }
            for (task, lease_token) in held.drain(..) {
                let _ = sim.apply(Input::Complete { task, lease_token, output: json!({}), logs: None });
            }
            for task in sim.waiting_on(is_callback) {
                sim.call_back_task(&task, true).unwrap();
            }
            for task in sim.waiting_on(is_approval) {
                sim.apply(Input::Decide { task, approve: true, by: "p".into(), comment: None }).unwrap();
            }
            for _ in sim.waiting_on(is_signal) {
                sim.signal("go", json!(null)).unwrap();
            }
            for id in sim.ready() {
                let token = sim.claim_task(&id);
                sim.apply(Input::Complete { task: id, lease_token: token, output: json!({}), logs: None }).unwrap();
            }
            sim.advance(Duration::from_secs(5));
            super::check_invariants(&sim);
        }
        proptest::prop_assert!(sim.state.job.status.is_terminal(), "job stuck: {:?}", sim.summary());
    }
}

#[test]
fn a_callback_grant_matches_a_digest_it_begins_or_equals_and_nothing_else() {
    let grant = |hash: &str| CallbackGrant {
        attempt: 1,
        round: 0,
        hash: hash.to_owned(),
        answered: None,
    };
    let digest = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    assert!(grant(&digest[..32]).matches(digest), "the first 128 bits");
    assert!(
        grant(digest).matches(digest),
        "a whole digest, stored before"
    );
    assert!(!grant(&digest[..32]).matches(&digest[1..]));
    assert!(!grant("ba7816bf8f01cfea414140de5dae2224").matches(digest));
    assert!(
        !grant("").matches(digest),
        "an empty digest matches nothing"
    );
}
